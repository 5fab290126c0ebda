//! A high-level, idempotent OVN northbound API on top of [`Client`] and [`Cache`].
//!
//! Objects are described by small specs that read like `ovn-nbctl` ([`SwitchPort`], [`LogicalSwitch`],
//! [`RouterPort`], [`Patch`], ...). A spec is either executed alone (one transaction) or added to a [`Batch`]
//! that is committed as one transaction. Every write is an *ensure* (create, or update what differs, or do
//! nothing) or a *delete* (nothing if already gone); lookups are served from the cache.
//!
//! The [`Northbound`] trait is the I/O seam: [`OvsdbNorthbound`] is the real implementation; with the `mock`
//! feature, `MockNorthbound` (mockall) lets users' tests set expectations.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kubeovn_ovn::Error> {
//! use kubeovn_ovn::northbound::{Batch, LogicalSwitch, Northbound, OvsdbNorthbound, SwitchPort};
//! let nb = OvsdbNorthbound::connect("unix:/var/run/ovn/ovnnb_db.sock").await?;
//! LogicalSwitch::new("ls0").subnet("10.16.0.0/16").exclude_ips(["10.16.0.1"]).execute(&nb).await?;
//! SwitchPort::new("ls0", "pod1.ns")
//!     .addresses(["0a:58:0a:10:00:05 10.16.0.5"])
//!     .external_id("pod", "ns/pod1")
//!     .may_exist()
//!     .execute(&nb)
//!     .await?;
//! let mut batch = Batch::new();
//! for i in 0..10 {
//!     batch.add(SwitchPort::new("ls0", format!("pod{i}.ns")).addresses([format!("0a:58:0a:10:00:{i:02x}")]));
//! }
//! nb.commit(batch).await?;
//! assert!(nb.switch_port("pod1.ns").is_some());
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::cache::{Cache, CacheBuilder, CacheView, CachedRow, IndexKey};
use crate::client::Client;
use crate::datum::{Atom, Datum};
use crate::error::Error;
use crate::models::nb;
use crate::ops::{Condition, Operation, OperationResult, Transaction};
use crate::rowdiff::{map_datum, merged, Map};
use crate::session::{write_client, Session};
use crate::uuid::Uuid;

#[path = "northbound_ext.rs"]
mod ext;
pub use ext::{Acl, AclParent, DhcpOptions, LbTarget, LoadBalancer, Meter, Nat, NbGlobal};

/// The northbound database's name.
pub const NB_DB: &str = "OVN_Northbound";

/// Why a northbound request was refused or could not be confirmed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NbError {
    /// A row the request needs does not exist.
    #[error("{table} {name:?} not found")]
    NotFound {
        /// Table.
        table: &'static str,
        /// Name (or description) of the missing row.
        name: String,
    },
    /// A row exists where the request said it must not (`may_exist(false)`).
    #[error("{table} {name:?} already exists")]
    Exists {
        /// Table.
        table: &'static str,
        /// Name.
        name: String,
    },
    /// The transaction committed but the cache did not show it in time.
    #[error("the cache did not catch up with the transaction within {0:?}")]
    CacheTimeout(Duration),
}

fn strings_datum(v: &[String]) -> Datum {
    Datum::set(v.iter().map(String::as_str))
}

fn same_strings(d: Option<&Datum>, want: &[String]) -> bool {
    let Some(d) = d else { return want.is_empty() };
    let mut have: Vec<&str> = d.atoms().iter().filter_map(Atom::as_str).collect();
    let mut want: Vec<&str> = want.iter().map(String::as_str).collect();
    have.sort_unstable();
    want.sort_unstable();
    have == want
}

macro_rules! ext_ids {
    () => {
        /// Sets one `external_ids` key (merged with the row's other keys).
        pub fn external_id(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
            self.external_ids.insert(key.into(), value.into());
            self
        }
    };
}

macro_rules! execute {
    () => {
        /// Runs this request alone, as one transaction.
        pub async fn execute<N: Northbound + ?Sized>(self, nb: &N) -> Result<(), Error> {
            let mut b = Batch::new();
            b.add(self);
            nb.commit(b).await
        }
    };
}

/// `ls-add`: a logical switch, with Kube-OVN's `other_config:subnet` and `exclude_ips`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogicalSwitch {
    /// Name.
    pub name: String,
    /// `other_config` keys to set (subnet, exclude_ips, ...).
    pub other_config: Map,
    /// `external_ids` keys to set.
    pub external_ids: Map,
}

impl LogicalSwitch {
    /// A switch named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        LogicalSwitch {
            name: name.into(),
            ..Default::default()
        }
    }
    /// `other_config:subnet`.
    pub fn subnet(self, cidr: impl Into<String>) -> Self {
        self.other_config("subnet", cidr)
    }
    /// `other_config:exclude_ips`, space separated.
    pub fn exclude_ips<I: IntoIterator<Item = S>, S: Into<String>>(self, ips: I) -> Self {
        let v: Vec<String> = ips.into_iter().map(Into::into).collect();
        self.other_config("exclude_ips", v.join(" "))
    }
    /// One `other_config` key.
    pub fn other_config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.other_config.insert(key.into(), value.into());
        self
    }
    ext_ids!();
    execute!();
}

/// `lsp-add`: a logical switch port; unset fields are left as they are on an existing port.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SwitchPort {
    /// The switch.
    pub switch: String,
    /// The port's name.
    pub name: String,
    /// `addresses` ("MAC IP..." entries, "router", "dynamic", "unknown").
    pub addresses: Option<Vec<String>>,
    /// `port_security`.
    pub port_security: Option<Vec<String>>,
    /// `type` ("" for a VIF, "router", "localnet", ...).
    pub port_type: Option<String>,
    /// `options` keys to set.
    pub options: Map,
    /// `external_ids` keys to set.
    pub external_ids: Map,
    /// If false, an existing port is an error (default true: update it).
    pub may_exist: bool,
}

impl SwitchPort {
    /// Port `name` on switch `switch`.
    pub fn new(switch: impl Into<String>, name: impl Into<String>) -> Self {
        SwitchPort {
            switch: switch.into(),
            name: name.into(),
            may_exist: true,
            ..Default::default()
        }
    }
    /// `lsp-set-addresses`.
    pub fn addresses<I: IntoIterator<Item = S>, S: Into<String>>(mut self, a: I) -> Self {
        self.addresses = Some(a.into_iter().map(Into::into).collect());
        self
    }
    /// `lsp-set-port-security`.
    pub fn port_security<I: IntoIterator<Item = S>, S: Into<String>>(mut self, a: I) -> Self {
        self.port_security = Some(a.into_iter().map(Into::into).collect());
        self
    }
    /// `lsp-set-type`.
    pub fn port_type(mut self, t: impl Into<String>) -> Self {
        self.port_type = Some(t.into());
        self
    }
    /// One `options` key.
    pub fn option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.insert(key.into(), value.into());
        self
    }
    /// `--may-exist`: an existing port is updated (the default).
    pub fn may_exist(mut self) -> Self {
        self.may_exist = true;
        self
    }
    /// Without `--may-exist`: an existing port is an error.
    pub fn must_not_exist(mut self) -> Self {
        self.may_exist = false;
        self
    }
    ext_ids!();
    execute!();
}

/// `lr-add`: a logical router.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Router {
    /// Name.
    pub name: String,
    /// `options` keys to set.
    pub options: Map,
    /// `external_ids` keys to set.
    pub external_ids: Map,
}

impl Router {
    /// A router named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Router {
            name: name.into(),
            ..Default::default()
        }
    }
    /// One `options` key.
    pub fn option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.insert(key.into(), value.into());
        self
    }
    ext_ids!();
    execute!();
}

/// `lrp-add`: a logical router port.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouterPort {
    /// The router.
    pub router: String,
    /// The port's name.
    pub name: String,
    /// MAC address.
    pub mac: String,
    /// Networks ("10.16.0.1/16", ...).
    pub networks: Vec<String>,
    /// `external_ids` keys to set.
    pub external_ids: Map,
}

impl RouterPort {
    /// Port `name` on `router` with `mac` and `networks`.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(
        router: impl Into<String>,
        name: impl Into<String>,
        mac: impl Into<String>,
        networks: I,
    ) -> Self {
        RouterPort {
            router: router.into(),
            name: name.into(),
            mac: mac.into(),
            networks: networks.into_iter().map(Into::into).collect(),
            external_ids: Map::new(),
        }
    }
    ext_ids!();
    execute!();
}

/// The switch <-> router patch pair: router port `<router>-<switch>` and switch port `<switch>-<router>` of
/// type router (Kube-OVN's naming), created or updated in one transaction.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Patch {
    /// The switch.
    pub switch: String,
    /// The router.
    pub router: String,
    /// The router port's MAC.
    pub mac: String,
    /// The router port's networks (the gateway addresses).
    pub networks: Vec<String>,
    /// `external_ids` keys on both ports.
    pub external_ids: Map,
}

impl Patch {
    /// Connects `switch` to `router` with a router port of `mac` and `networks`.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(
        switch: impl Into<String>,
        router: impl Into<String>,
        mac: impl Into<String>,
        networks: I,
    ) -> Self {
        Patch {
            switch: switch.into(),
            router: router.into(),
            mac: mac.into(),
            networks: networks.into_iter().map(Into::into).collect(),
            external_ids: Map::new(),
        }
    }
    /// The switch port's name.
    pub fn switch_port_name(&self) -> String {
        format!("{}-{}", self.switch, self.router)
    }
    /// The router port's name.
    pub fn router_port_name(&self) -> String {
        format!("{}-{}", self.router, self.switch)
    }
    ext_ids!();
}

/// `lr-route-add`: a static route, identified by router, prefix, nexthop, policy and route table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StaticRoute {
    /// The router.
    pub router: String,
    /// `ip_prefix`.
    pub prefix: String,
    /// `nexthop`.
    pub nexthop: String,
    /// `policy`: "dst-ip" (default) or "src-ip".
    pub policy: Option<String>,
    /// `route_table` ("" is the main table).
    pub route_table: String,
    /// `external_ids` keys to set.
    pub external_ids: Map,
}

impl StaticRoute {
    /// A route to `prefix` via `nexthop` on `router`.
    pub fn new(
        router: impl Into<String>,
        prefix: impl Into<String>,
        nexthop: impl Into<String>,
    ) -> Self {
        StaticRoute {
            router: router.into(),
            prefix: prefix.into(),
            nexthop: nexthop.into(),
            ..Default::default()
        }
    }
    /// `--policy=src-ip` and the like.
    pub fn policy(mut self, p: impl Into<String>) -> Self {
        self.policy = Some(p.into());
        self
    }
    /// `--route-table`.
    pub fn route_table(mut self, t: impl Into<String>) -> Self {
        self.route_table = t.into();
        self
    }
    ext_ids!();
    execute!();
}

/// `lr-policy-add`: a router policy, identified by router, priority and match.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouterPolicy {
    /// The router.
    pub router: String,
    /// Priority.
    pub priority: i64,
    /// Match expression.
    pub match_: String,
    /// "allow", "drop" or "reroute".
    pub action: String,
    /// Nexthops (reroute).
    pub nexthops: Vec<String>,
    /// `external_ids` keys to set.
    pub external_ids: Map,
}

impl RouterPolicy {
    /// A policy on `router`.
    pub fn new(
        router: impl Into<String>,
        priority: i64,
        match_: impl Into<String>,
        action: impl Into<String>,
    ) -> Self {
        RouterPolicy {
            router: router.into(),
            priority,
            match_: match_.into(),
            action: action.into(),
            ..Default::default()
        }
    }
    /// Reroute nexthops.
    pub fn nexthops<I: IntoIterator<Item = S>, S: Into<String>>(mut self, n: I) -> Self {
        self.nexthops = n.into_iter().map(Into::into).collect();
        self
    }
    ext_ids!();
    execute!();
}

/// `pg-add`: a port group (membership: [`Batch::port_group_add_ports`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PortGroup {
    /// Name.
    pub name: String,
    /// `external_ids` keys to set.
    pub external_ids: Map,
}

impl PortGroup {
    /// A port group named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        PortGroup {
            name: name.into(),
            external_ids: Map::new(),
        }
    }
    ext_ids!();
    execute!();
}

/// An address set with exactly these addresses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AddressSet {
    /// Name.
    pub name: String,
    /// Addresses.
    pub addresses: Vec<String>,
    /// `external_ids` keys to set.
    pub external_ids: Map,
}

impl AddressSet {
    /// Address set `name` holding `addresses`.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(
        name: impl Into<String>,
        addresses: I,
    ) -> Self {
        AddressSet {
            name: name.into(),
            addresses: addresses.into_iter().map(Into::into).collect(),
            external_ids: Map::new(),
        }
    }
    ext_ids!();
    execute!();
}

/// One planned northbound change.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Ensure a switch.
    Switch(LogicalSwitch),
    /// Delete a switch by name.
    DeleteSwitch(String),
    /// Ensure a switch port.
    SwitchPort(SwitchPort),
    /// Delete a switch port by name.
    DeleteSwitchPort(String),
    /// Ensure a router.
    Router(Router),
    /// Delete a router by name.
    DeleteRouter(String),
    /// Ensure a router port.
    RouterPort(RouterPort),
    /// Delete a router port by name.
    DeleteRouterPort(String),
    /// Ensure a static route.
    StaticRoute(StaticRoute),
    /// Delete static routes of `router` to `prefix` (any nexthop if None).
    DeleteStaticRoute {
        /// Router.
        router: String,
        /// Prefix.
        prefix: String,
        /// Nexthop.
        nexthop: Option<String>,
    },
    /// Ensure a router policy.
    Policy(RouterPolicy),
    /// Delete the router policy of `router` with this priority and match.
    DeletePolicy {
        /// Router.
        router: String,
        /// Priority.
        priority: i64,
        /// Match.
        match_: String,
    },
    /// Ensure a port group.
    PortGroup(PortGroup),
    /// Delete a port group by name.
    DeletePortGroup(String),
    /// Add switch ports (by name) to a port group.
    PortGroupAdd {
        /// Port group.
        group: String,
        /// Switch port names.
        ports: Vec<String>,
    },
    /// Remove switch ports (by name) from a port group.
    PortGroupRemove {
        /// Port group.
        group: String,
        /// Switch port names.
        ports: Vec<String>,
    },
    /// Ensure an address set.
    AddressSet(AddressSet),
    /// Delete an address set by name.
    DeleteAddressSet(String),
    /// Ensure an ACL.
    Acl(Acl),
    /// Delete the ACL of `parent` with this direction, priority and match.
    DeleteAcl {
        /// Port group or switch.
        parent: AclParent,
        /// Direction.
        direction: String,
        /// Priority.
        priority: i64,
        /// Match.
        match_: String,
    },
    /// Delete every ACL of `parent` whose `external_ids:key` is `value`.
    DeleteAclsByExternalId {
        /// Port group or switch.
        parent: AclParent,
        /// Key.
        key: String,
        /// Value.
        value: String,
    },
    /// Ensure a meter.
    Meter(Meter),
    /// Delete a meter by name.
    DeleteMeter(String),
    /// Ensure a load balancer (VIPs merged).
    LoadBalancer(LoadBalancer),
    /// Delete a load balancer by name (switches and routers drop it).
    DeleteLoadBalancer(String),
    /// Remove one VIP of a load balancer.
    LbRemoveVip {
        /// Load balancer.
        lb: String,
        /// VIP.
        vip: String,
    },
    /// Attach (or detach) a load balancer to a switch or router.
    LbAttach {
        /// Load balancer.
        lb: String,
        /// Switch or router.
        target: LbTarget,
        /// true: attach; false: detach.
        attach: bool,
    },
    /// Ensure a NAT rule.
    Nat(Nat),
    /// Delete the NAT rules of `router` of this type whose identifying IP (logical for snat, external
    /// otherwise) is `ip`.
    DeleteNat {
        /// Router.
        router: String,
        /// Type.
        nat_type: String,
        /// IP.
        ip: String,
    },
    /// Ensure DHCP options.
    DhcpOptions(DhcpOptions),
    /// Delete the DHCP options of `cidr` with these `external_ids`.
    DeleteDhcpOptions {
        /// CIDR.
        cidr: String,
        /// Identifying external_ids.
        external_ids: Map,
    },
    /// Set or remove NB_Global options and external_ids.
    NbGlobal(NbGlobal),
}

macro_rules! into_op {
    ($($t:ident),*) => {$(
        impl From<$t> for Op {
            fn from(s: $t) -> Op {
                Op::$t(s)
            }
        }
    )*};
}
into_op!(
    Acl,
    Meter,
    LoadBalancer,
    Nat,
    DhcpOptions,
    NbGlobal,
    SwitchPort,
    RouterPort,
    Router,
    StaticRoute,
    PortGroup,
    AddressSet
);

impl From<LogicalSwitch> for Op {
    fn from(s: LogicalSwitch) -> Op {
        Op::Switch(s)
    }
}

impl From<RouterPolicy> for Op {
    fn from(s: RouterPolicy) -> Op {
        Op::Policy(s)
    }
}

/// Changes committed together as one transaction by [`Northbound::commit`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// The changes, in order.
    pub ops: Vec<Op>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Batch::default()
    }
    /// Adds an ensure (any spec) or any [`Op`].
    pub fn add(&mut self, op: impl Into<Op>) -> &mut Self {
        self.ops.push(op.into());
        self
    }
    /// Adds the patch pair (router port and switch port of type router).
    pub fn patch(&mut self, p: Patch) -> &mut Self {
        let lrp = p.router_port_name();
        let lsp = p.switch_port_name();
        let mut rp = RouterPort::new(&p.router, &lrp, &p.mac, p.networks.iter().cloned());
        rp.external_ids = p.external_ids.clone();
        let mut sp = SwitchPort::new(&p.switch, lsp)
            .port_type("router")
            .addresses(["router"])
            .option("router-port", lrp);
        sp.external_ids = p.external_ids;
        self.add(rp).add(sp)
    }
    /// Removes the patch pair between `switch` and `router`.
    pub fn unpatch(&mut self, switch: &str, router: &str) -> &mut Self {
        self.add(Op::DeleteSwitchPort(format!("{switch}-{router}")))
            .add(Op::DeleteRouterPort(format!("{router}-{switch}")))
    }
    /// `lsp-del`.
    pub fn delete_switch_port(&mut self, name: impl Into<String>) -> &mut Self {
        self.add(Op::DeleteSwitchPort(name.into()))
    }
    /// `ls-del`.
    pub fn delete_switch(&mut self, name: impl Into<String>) -> &mut Self {
        self.add(Op::DeleteSwitch(name.into()))
    }
    /// `lr-del`.
    pub fn delete_router(&mut self, name: impl Into<String>) -> &mut Self {
        self.add(Op::DeleteRouter(name.into()))
    }
    /// `lrp-del`.
    pub fn delete_router_port(&mut self, name: impl Into<String>) -> &mut Self {
        self.add(Op::DeleteRouterPort(name.into()))
    }
    /// `pg-set-ports` style addition of switch ports to a port group.
    pub fn port_group_add_ports<I: IntoIterator<Item = S>, S: Into<String>>(
        &mut self,
        group: &str,
        ports: I,
    ) -> &mut Self {
        self.add(Op::PortGroupAdd {
            group: group.to_owned(),
            ports: ports.into_iter().map(Into::into).collect(),
        })
    }
    /// Removes switch ports from a port group.
    pub fn port_group_remove_ports<I: IntoIterator<Item = S>, S: Into<String>>(
        &mut self,
        group: &str,
        ports: I,
    ) -> &mut Self {
        self.add(Op::PortGroupRemove {
            group: group.to_owned(),
            ports: ports.into_iter().map(Into::into).collect(),
        })
    }
    /// Deletes the ACL of `parent` with this direction, priority and match.
    pub fn delete_acl(
        &mut self,
        parent: AclParent,
        direction: &str,
        priority: i64,
        match_: &str,
    ) -> &mut Self {
        self.add(Op::DeleteAcl {
            parent,
            direction: direction.to_owned(),
            priority,
            match_: match_.to_owned(),
        })
    }
    /// Deletes every ACL of `parent` whose `external_ids:key` is `value`.
    pub fn delete_acls_by_external_id(
        &mut self,
        parent: AclParent,
        key: &str,
        value: &str,
    ) -> &mut Self {
        self.add(Op::DeleteAclsByExternalId {
            parent,
            key: key.to_owned(),
            value: value.to_owned(),
        })
    }
    /// Deletes a meter.
    pub fn delete_meter(&mut self, name: impl Into<String>) -> &mut Self {
        self.add(Op::DeleteMeter(name.into()))
    }
    /// Deletes a load balancer.
    pub fn delete_load_balancer(&mut self, name: impl Into<String>) -> &mut Self {
        self.add(Op::DeleteLoadBalancer(name.into()))
    }
    /// Removes one VIP of a load balancer.
    pub fn lb_remove_vip(&mut self, lb: &str, vip: &str) -> &mut Self {
        self.add(Op::LbRemoveVip {
            lb: lb.to_owned(),
            vip: vip.to_owned(),
        })
    }
    /// Attaches a load balancer to a switch or router.
    pub fn lb_attach(&mut self, lb: &str, target: LbTarget) -> &mut Self {
        self.add(Op::LbAttach {
            lb: lb.to_owned(),
            target,
            attach: true,
        })
    }
    /// Detaches a load balancer from a switch or router.
    pub fn lb_detach(&mut self, lb: &str, target: LbTarget) -> &mut Self {
        self.add(Op::LbAttach {
            lb: lb.to_owned(),
            target,
            attach: false,
        })
    }
    /// Deletes NAT rules (see [`Op::DeleteNat`]).
    pub fn delete_nat(&mut self, router: &str, nat_type: &str, ip: &str) -> &mut Self {
        self.add(Op::DeleteNat {
            router: router.to_owned(),
            nat_type: nat_type.to_owned(),
            ip: ip.to_owned(),
        })
    }
    /// Deletes DHCP options.
    pub fn delete_dhcp_options(&mut self, d: &DhcpOptions) -> &mut Self {
        self.add(Op::DeleteDhcpOptions {
            cidr: d.cidr.clone(),
            external_ids: d.external_ids.clone(),
        })
    }
    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
    /// The number of changes.
    pub fn len(&self) -> usize {
        self.ops.len()
    }
}

impl Acl {
    execute!();
}
impl Meter {
    execute!();
}
impl LoadBalancer {
    execute!();
}
impl Nat {
    execute!();
}
impl DhcpOptions {
    execute!();
}
impl NbGlobal {
    execute!();
}

impl Patch {
    /// Runs the patch pair alone, as one transaction.
    pub async fn execute<N: Northbound + ?Sized>(self, nb: &N) -> Result<(), Error> {
        let mut b = Batch::new();
        b.patch(self);
        nb.commit(b).await
    }
}

/// The northbound database as Kube-OVN uses it: ensures and deletes committed in batches, lookups from a
/// replica. The I/O seam: [`OvsdbNorthbound`] is the real one.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait Northbound: Send + Sync {
    /// Plans `batch` against the current state and commits it as one transaction (nothing is sent if every
    /// change is already in place); returns once the replica shows the result.
    async fn commit(&self, batch: Batch) -> Result<(), Error>;
    /// A logical switch by name.
    fn switch(&self, name: &str) -> Option<nb::LogicalSwitch>;
    /// A logical switch port by name.
    fn switch_port(&self, name: &str) -> Option<nb::LogicalSwitchPort>;
    /// The names of a switch's ports.
    fn switch_port_names(&self, switch: &str) -> Vec<String>;
    /// Switch ports whose `external_ids:key` is `value` (keys indexed: `pod`, `ls`, and those configured).
    fn switch_ports_by_external_id(&self, key: &str, value: &str) -> Vec<nb::LogicalSwitchPort>;
    /// A logical router by name.
    fn router(&self, name: &str) -> Option<nb::LogicalRouter>;
    /// A logical router port by name.
    fn router_port(&self, name: &str) -> Option<nb::LogicalRouterPort>;
    /// A router's static routes.
    fn static_routes(&self, router: &str) -> Vec<nb::LogicalRouterStaticRoute>;
    /// A router's policies.
    fn policies(&self, router: &str) -> Vec<nb::LogicalRouterPolicy>;
    /// A port group by name.
    fn port_group(&self, name: &str) -> Option<nb::PortGroup>;
    /// An address set by name.
    fn address_set(&self, name: &str) -> Option<nb::AddressSet>;
    /// The ACLs of a port group or switch.
    fn acls(&self, parent: &AclParent) -> Vec<nb::Acl>;
    /// A meter by name.
    fn meter(&self, name: &str) -> Option<nb::Meter>;
    /// A load balancer by name.
    fn load_balancer(&self, name: &str) -> Option<nb::LoadBalancer>;
    /// A router's NAT rules.
    fn nats(&self, router: &str) -> Vec<nb::Nat>;
    /// The DHCP options of `cidr` whose external_ids include `external_ids`.
    fn dhcp_options(
        &self,
        cidr: &str,
        external_ids: &BTreeMap<String, String>,
    ) -> Option<nb::DhcpOptions>;
    /// The NB_Global row.
    fn nb_global(&self) -> Option<nb::NbGlobal>;
}

/// The tables [`OvsdbNorthbound`] replicates.
pub const TABLES: &[&str] = &[
    "Logical_Switch",
    "Logical_Switch_Port",
    "Logical_Router",
    "Logical_Router_Port",
    "Logical_Router_Static_Route",
    "Logical_Router_Policy",
    "Port_Group",
    "Address_Set",
    "ACL",
    "Meter",
    "Meter_Band",
    "Load_Balancer",
    "NAT",
    "DHCP_Options",
    "NB_Global",
];

/// [`Northbound`] over one OVSDB connection and a replica of the tables it manages.
#[derive(Debug, Clone)]
pub struct OvsdbNorthbound {
    client: Client,
    session: Option<Session>,
    cache: Cache,
    wait: Duration,
}

impl OvsdbNorthbound {
    /// Connects to `remote` ("unix:PATH", "tcp:IP:PORT") and loads the replica.
    pub async fn connect(remote: &str) -> Result<Self, Error> {
        Self::with_client(Client::connect(remote).await?, &[]).await
    }

    /// Uses `client`, also indexing switch ports by the `external_ids` keys `extra_keys` (besides pod, ls).
    pub async fn with_client(client: Client, extra_keys: &[&str]) -> Result<Self, Error> {
        let cache = Self::cache_builder(extra_keys).start(&client).await?;
        Ok(OvsdbNorthbound {
            client,
            session: None,
            cache,
            wait: Duration::from_secs(10),
        })
    }

    /// Uses a reconnecting `session` (see [`Session`]): the replica resumes after reconnects and each commit
    /// goes to the session's current connection (the leader, with a leader-only session). A commit whose
    /// connection dies before the reply fails with [`Error::OutcomeUnknown`]; it is never retried here. Each
    /// commit is planned once the replica follows the connection it is sent on, so committing the same batch
    /// again after an unknown outcome re-checks it against a replica that shows whether it went through:
    /// what is already in place is not sent twice.
    pub async fn with_session(session: Session, extra_keys: &[&str]) -> Result<Self, Error> {
        let client = session.client().await?;
        let cache = Self::cache_builder(extra_keys)
            .start_session(&session)
            .await?;
        Ok(OvsdbNorthbound {
            client,
            session: Some(session),
            cache,
            wait: Duration::from_secs(10),
        })
    }

    /// The replica this API keeps (tables and indexes).
    pub fn cache_builder(extra_keys: &[&str]) -> CacheBuilder {
        let mut b = CacheBuilder::new(NB_DB);
        for t in TABLES {
            b = b.table(t);
        }
        b = b
            .index("Logical_Switch", "name")
            .index("Logical_Router", "name")
            .index("Load_Balancer", "name");
        for k in ["pod", "ls"].iter().chain(extra_keys) {
            b = b.map_key_index("Logical_Switch_Port", "external_ids", k);
        }
        b
    }

    /// How long [`Northbound::commit`] waits for the replica to show a committed change (default 10 s).
    pub fn cache_wait(mut self, d: Duration) -> Self {
        self.wait = d;
        self
    }

    /// The replica.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The first connection (see [`OvsdbNorthbound::session`] for the current one).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The reconnecting session, if built with one.
    pub fn session(&self) -> Option<&Session> {
        self.session.as_ref()
    }

    /// Plans `batch` against the replica: the transaction to send (None if nothing to do) and the rows it
    /// deletes.
    pub fn plan(&self, batch: &Batch) -> Result<Option<Plan>, Error> {
        let view = self.cache.view();
        let mut p = Planner {
            view: &view,
            txn: Transaction::new(NB_DB),
            inserts: Vec::new(),
            deletes: Vec::new(),
            new_names: HashMap::new(),
            new_switches: HashSet::new(),
            new_routers: HashSet::new(),
            next: 0,
        };
        for op in &batch.ops {
            p.op(op)?;
        }
        if p.txn.ops.is_empty() {
            return Ok(None);
        }
        // One `ports insert` per new port would cost the server O(N^2) on a big batch.
        let moved = p.txn.coalesce_set_mutations();
        let inserts = p
            .inserts
            .into_iter()
            .filter_map(|(t, i)| moved.get(i).copied().flatten().map(|i| (t, i)))
            .collect();
        Ok(Some(Plan {
            txn: p.txn,
            inserts,
            deletes: p.deletes,
        }))
    }

    fn typed<M: crate::Model>(&self, table: &str, column: &str, name: &str) -> Option<M> {
        self.cache
            .lookup(table, column, name)
            .and_then(|r| r.to_model().ok())
    }

    fn router_children<M: crate::Model>(&self, router: &str, column: &str, table: &str) -> Vec<M> {
        let v = self.cache.view();
        let Some(r) = v.lookup("Logical_Router", "name", router) else {
            return Vec::new();
        };
        r.uuids(column)
            .filter_map(|u| v.get(table, u))
            .filter_map(|r| r.to_model().ok())
            .collect()
    }
}

/// A planned transaction.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The transaction.
    pub txn: Transaction,
    /// (table, index of the insert operation) of each insert, to wait for.
    pub inserts: Vec<(&'static str, usize)>,
    /// (table, uuid) of each row removed, to wait for.
    pub deletes: Vec<(&'static str, Uuid)>,
}

struct Planner<'v, 'c> {
    view: &'v CacheView<'c>,
    txn: Transaction,
    inserts: Vec<(&'static str, usize)>,
    deletes: Vec<(&'static str, Uuid)>,
    /// (table, name) -> uuid-name of rows inserted by this batch.
    new_names: HashMap<(&'static str, String), String>,
    new_switches: HashSet<String>,
    new_routers: HashSet<String>,
    next: usize,
}

const LS: &str = "Logical_Switch";
const LSP: &str = "Logical_Switch_Port";
const LR: &str = "Logical_Router";
const LRP: &str = "Logical_Router_Port";
const ROUTE: &str = "Logical_Router_Static_Route";
const POLICY: &str = "Logical_Router_Policy";
const PG: &str = "Port_Group";
const AS: &str = "Address_Set";

impl Planner<'_, '_> {
    fn named(&mut self) -> String {
        self.next += 1;
        format!("r{}", self.next)
    }

    fn find(&self, table: &'static str, name: &str) -> Option<&Arc<CachedRow>> {
        self.view.lookup(table, "name", name)
    }

    fn push_insert(&mut self, table: &'static str, op: Operation) {
        self.inserts.push((table, self.txn.ops.len()));
        self.txn.push(op);
    }

    fn update(&mut self, table: &'static str, uuid: Uuid, cols: Vec<(&str, Datum)>) {
        if cols.is_empty() {
            return;
        }
        let mut u = Operation::update(table).uuid(uuid);
        for (c, d) in cols {
            u = u.value(c, d);
        }
        self.txn.push(u);
    }

    fn need(&self, table: &'static str, name: &str, new: &HashSet<String>) -> Result<(), Error> {
        if new.contains(name) || self.find(table, name).is_some() {
            Ok(())
        } else {
            Err(NbError::NotFound {
                table,
                name: name.to_owned(),
            }
            .into())
        }
    }

    fn ext_ids(cols: &mut Vec<(&str, Datum)>, row: &CachedRow, want: &Map) {
        if let Some(m) = merged(row.get("external_ids"), want) {
            cols.push(("external_ids", map_datum(&m)));
        }
    }

    fn op(&mut self, op: &Op) -> Result<(), Error> {
        match op {
            Op::Switch(s) => match self.find(LS, &s.name).cloned() {
                Some(row) => {
                    let mut cols = Vec::new();
                    if let Some(m) = merged(row.get("other_config"), &s.other_config) {
                        cols.push(("other_config", map_datum(&m)));
                    }
                    Self::ext_ids(&mut cols, &row, &s.external_ids);
                    self.update(LS, row.uuid(), cols);
                }
                None if self.new_switches.contains(&s.name) => {}
                None => {
                    let ins = Operation::insert(LS)
                        .value("name", s.name.as_str())
                        .value("other_config", map_datum(&s.other_config))
                        .value("external_ids", map_datum(&s.external_ids));
                    self.push_insert(LS, ins.into());
                    self.new_switches.insert(s.name.clone());
                }
            },
            Op::DeleteSwitch(name) => {
                if let Some(row) = self.find(LS, name).cloned() {
                    self.txn.push(Operation::delete(LS).uuid(row.uuid()));
                    self.deletes.push((LS, row.uuid()));
                }
            }
            Op::SwitchPort(p) => self.switch_port(p)?,
            Op::DeleteSwitchPort(name) => {
                if let Some(row) = self.find(LSP, name).cloned() {
                    let u = row.uuid();
                    // Name the parent by UUID when the replica knows it (cheaper for the server than a scan).
                    let parent = self
                        .view
                        .rows(LS)
                        .find(|ls| {
                            ls.get("ports")
                                .is_some_and(|d| d.atoms().contains(&Atom::Uuid(u)))
                        })
                        .map(|ls| ls.uuid());
                    let m = Operation::mutate(LS);
                    let m = match parent {
                        Some(p) => m.uuid(p),
                        None => m.filter(Condition::includes("ports", Datum::uuid(u))),
                    };
                    self.txn.push(m.delete("ports", Datum::uuid(u)));
                    self.deletes.push((LSP, u));
                }
            }
            Op::Router(r) => match self.find(LR, &r.name).cloned() {
                Some(row) => {
                    let mut cols = Vec::new();
                    if let Some(m) = merged(row.get("options"), &r.options) {
                        cols.push(("options", map_datum(&m)));
                    }
                    Self::ext_ids(&mut cols, &row, &r.external_ids);
                    self.update(LR, row.uuid(), cols);
                }
                None if self.new_routers.contains(&r.name) => {}
                None => {
                    let ins = Operation::insert(LR)
                        .value("name", r.name.as_str())
                        .value("options", map_datum(&r.options))
                        .value("external_ids", map_datum(&r.external_ids));
                    self.push_insert(LR, ins.into());
                    self.new_routers.insert(r.name.clone());
                }
            },
            Op::DeleteRouter(name) => {
                if let Some(row) = self.find(LR, name).cloned() {
                    self.txn.push(Operation::delete(LR).uuid(row.uuid()));
                    self.deletes.push((LR, row.uuid()));
                }
            }
            Op::RouterPort(p) => match self.find(LRP, &p.name).cloned() {
                Some(row) => {
                    let mut cols = Vec::new();
                    if row.get_str("mac") != p.mac {
                        cols.push(("mac", Datum::from(p.mac.as_str())));
                    }
                    if !same_strings(row.get("networks"), &p.networks) {
                        cols.push(("networks", strings_datum(&p.networks)));
                    }
                    Self::ext_ids(&mut cols, &row, &p.external_ids);
                    self.update(LRP, row.uuid(), cols);
                }
                None if self.new_names.contains_key(&(LRP, p.name.clone())) => {}
                None => {
                    let new_routers = std::mem::take(&mut self.new_routers);
                    let r = self.need(LR, &p.router, &new_routers);
                    self.new_routers = new_routers;
                    r?;
                    let n = self.named();
                    let ins = Operation::insert(LRP)
                        .uuid_name(&n)
                        .value("name", p.name.as_str())
                        .value("mac", p.mac.as_str())
                        .value("networks", strings_datum(&p.networks))
                        .value("external_ids", map_datum(&p.external_ids));
                    self.push_insert(LRP, ins.into());
                    self.txn.push(
                        Operation::mutate(LR)
                            .filter(Condition::eq("name", p.router.as_str()))
                            .insert("ports", Datum::named_uuid(&n)),
                    );
                    self.new_names.insert((LRP, p.name.clone()), n);
                }
            },
            Op::DeleteRouterPort(name) => {
                if let Some(row) = self.find(LRP, name).cloned() {
                    let u = row.uuid();
                    self.txn.push(
                        Operation::mutate(LR)
                            .filter(Condition::includes("ports", Datum::uuid(u)))
                            .delete("ports", Datum::uuid(u)),
                    );
                    self.deletes.push((LRP, u));
                }
            }
            Op::StaticRoute(r) => {
                let router = self.router_row(&r.router)?;
                let policy = r.policy.clone().unwrap_or_else(|| "dst-ip".to_owned());
                let found = router.as_ref().and_then(|lr| {
                    lr.uuids("static_routes")
                        .filter_map(|u| self.view.get(ROUTE, u))
                        .find(|s| {
                            s.get_str("ip_prefix") == r.prefix
                                && s.get_str("nexthop") == r.nexthop
                                && s.get_str("route_table") == r.route_table
                                && (s.get_str("policy") == policy
                                    || s.get_str("policy").is_empty() && policy == "dst-ip")
                        })
                        .cloned()
                });
                match found {
                    Some(row) => {
                        let mut cols = Vec::new();
                        Self::ext_ids(&mut cols, &row, &r.external_ids);
                        self.update(ROUTE, row.uuid(), cols);
                    }
                    None => {
                        let n = self.named();
                        let mut ins = Operation::insert(ROUTE)
                            .uuid_name(&n)
                            .value("ip_prefix", r.prefix.as_str())
                            .value("nexthop", r.nexthop.as_str())
                            .value("route_table", r.route_table.as_str())
                            .value("external_ids", map_datum(&r.external_ids));
                        if let Some(p) = &r.policy {
                            ins = ins.value("policy", Datum::set([p.as_str()]));
                        }
                        self.push_insert(ROUTE, ins.into());
                        self.txn.push(
                            Operation::mutate(LR)
                                .filter(Condition::eq("name", r.router.as_str()))
                                .insert("static_routes", Datum::named_uuid(&n)),
                        );
                    }
                }
            }
            Op::DeleteStaticRoute {
                router,
                prefix,
                nexthop,
            } => {
                if let Some(lr) = self.find(LR, router).cloned() {
                    let gone: Vec<Uuid> = lr
                        .uuids("static_routes")
                        .filter_map(|u| self.view.get(ROUTE, u))
                        .filter(|s| {
                            s.get_str("ip_prefix") == prefix
                                && nexthop.as_deref().is_none_or(|n| s.get_str("nexthop") == n)
                        })
                        .map(|s| s.uuid())
                        .collect();
                    self.unlink(LR, lr.uuid(), "static_routes", ROUTE, gone);
                }
            }
            Op::Policy(p) => {
                let router = self.router_row(&p.router)?;
                let found = router.as_ref().and_then(|lr| {
                    lr.uuids("policies")
                        .filter_map(|u| self.view.get(POLICY, u))
                        .find(|s| {
                            s.get("priority")
                                .and_then(Datum::as_atom)
                                .and_then(Atom::as_i64)
                                == Some(p.priority)
                                && s.get_str("match") == p.match_
                        })
                        .cloned()
                });
                match found {
                    Some(row) => {
                        let mut cols = Vec::new();
                        if row.get_str("action") != p.action {
                            cols.push(("action", Datum::from(p.action.as_str())));
                        }
                        if !same_strings(row.get("nexthops"), &p.nexthops) {
                            cols.push(("nexthops", strings_datum(&p.nexthops)));
                        }
                        Self::ext_ids(&mut cols, &row, &p.external_ids);
                        self.update(POLICY, row.uuid(), cols);
                    }
                    None => {
                        let n = self.named();
                        let ins = Operation::insert(POLICY)
                            .uuid_name(&n)
                            .value("priority", p.priority)
                            .value("match", p.match_.as_str())
                            .value("action", p.action.as_str())
                            .value("nexthops", strings_datum(&p.nexthops))
                            .value("external_ids", map_datum(&p.external_ids));
                        self.push_insert(POLICY, ins.into());
                        self.txn.push(
                            Operation::mutate(LR)
                                .filter(Condition::eq("name", p.router.as_str()))
                                .insert("policies", Datum::named_uuid(&n)),
                        );
                    }
                }
            }
            Op::DeletePolicy {
                router,
                priority,
                match_,
            } => {
                if let Some(lr) = self.find(LR, router).cloned() {
                    let gone: Vec<Uuid> = lr
                        .uuids("policies")
                        .filter_map(|u| self.view.get(POLICY, u))
                        .filter(|s| {
                            s.get("priority")
                                .and_then(Datum::as_atom)
                                .and_then(Atom::as_i64)
                                == Some(*priority)
                                && s.get_str("match") == match_
                        })
                        .map(|s| s.uuid())
                        .collect();
                    self.unlink(LR, lr.uuid(), "policies", POLICY, gone);
                }
            }
            Op::PortGroup(g) => match self.find(PG, &g.name).cloned() {
                Some(row) => {
                    let mut cols = Vec::new();
                    Self::ext_ids(&mut cols, &row, &g.external_ids);
                    self.update(PG, row.uuid(), cols);
                }
                None if self.new_names.contains_key(&(PG, g.name.clone())) => {}
                None => {
                    let n = self.named();
                    let ins = Operation::insert(PG)
                        .uuid_name(&n)
                        .value("name", g.name.as_str())
                        .value("external_ids", map_datum(&g.external_ids));
                    self.push_insert(PG, ins.into());
                    self.new_names.insert((PG, g.name.clone()), n);
                }
            },
            Op::DeletePortGroup(name) => {
                if let Some(row) = self.find(PG, name).cloned() {
                    self.txn.push(Operation::delete(PG).uuid(row.uuid()));
                    self.deletes.push((PG, row.uuid()));
                }
            }
            Op::PortGroupAdd { group, ports } | Op::PortGroupRemove { group, ports } => {
                let add = matches!(op, Op::PortGroupAdd { .. });
                let pg = self.find(PG, group).cloned();
                if pg.is_none() && !self.new_names.contains_key(&(PG, group.clone())) {
                    return Err(NbError::NotFound {
                        table: PG,
                        name: group.clone(),
                    }
                    .into());
                }
                let members: HashSet<Uuid> = pg
                    .as_ref()
                    .map(|r| r.uuids("ports").collect())
                    .unwrap_or_default();
                let mut atoms = Vec::new();
                for name in ports {
                    if let Some(n) = self.new_names.get(&(LSP, name.clone())) {
                        if add {
                            atoms.push(Atom::NamedUuid(n.clone()));
                        }
                    } else if let Some(r) = self.find(LSP, name) {
                        if members.contains(&r.uuid()) != add {
                            atoms.push(Atom::Uuid(r.uuid()));
                        }
                    } else if add {
                        return Err(NbError::NotFound {
                            table: LSP,
                            name: name.clone(),
                        }
                        .into());
                    }
                }
                if !atoms.is_empty() {
                    let m = Operation::mutate(PG).filter(Condition::eq("name", group.as_str()));
                    let m = if add {
                        m.insert("ports", Datum::Set(atoms))
                    } else {
                        m.delete("ports", Datum::Set(atoms))
                    };
                    self.txn.push(m);
                }
            }
            Op::AddressSet(a) => match self.find(AS, &a.name).cloned() {
                Some(row) => {
                    let mut cols = Vec::new();
                    if !same_strings(row.get("addresses"), &a.addresses) {
                        cols.push(("addresses", strings_datum(&a.addresses)));
                    }
                    Self::ext_ids(&mut cols, &row, &a.external_ids);
                    self.update(AS, row.uuid(), cols);
                }
                None if self.new_names.contains_key(&(AS, a.name.clone())) => {}
                None => {
                    let ins = Operation::insert(AS)
                        .value("name", a.name.as_str())
                        .value("addresses", strings_datum(&a.addresses))
                        .value("external_ids", map_datum(&a.external_ids));
                    self.push_insert(AS, ins.into());
                    self.new_names.insert((AS, a.name.clone()), String::new());
                }
            },
            Op::DeleteAddressSet(name) => {
                if let Some(row) = self.find(AS, name).cloned() {
                    self.txn.push(Operation::delete(AS).uuid(row.uuid()));
                    self.deletes.push((AS, row.uuid()));
                }
            }
            other => {
                self.ext_op(other)?;
            }
        }
        Ok(())
    }

    fn router_row(&self, name: &str) -> Result<Option<Arc<CachedRow>>, Error> {
        match self.find(LR, name) {
            Some(r) => Ok(Some(r.clone())),
            None if self.new_routers.contains(name) => Ok(None),
            None => Err(NbError::NotFound {
                table: LR,
                name: name.to_owned(),
            }
            .into()),
        }
    }

    fn unlink(
        &mut self,
        parent: &'static str,
        pu: Uuid,
        column: &str,
        child: &'static str,
        gone: Vec<Uuid>,
    ) {
        if gone.is_empty() {
            return;
        }
        self.txn.push(
            Operation::mutate(parent)
                .uuid(pu)
                .delete(column, Datum::set(gone.iter().copied())),
        );
        self.deletes.extend(gone.into_iter().map(|u| (child, u)));
    }

    fn switch_port(&mut self, p: &SwitchPort) -> Result<(), Error> {
        if let Some(row) = self.find(LSP, &p.name).cloned() {
            if !p.may_exist {
                return Err(NbError::Exists {
                    table: LSP,
                    name: p.name.clone(),
                }
                .into());
            }
            let mut cols = Vec::new();
            if let Some(a) = &p.addresses {
                if !same_strings(row.get("addresses"), a) {
                    cols.push(("addresses", strings_datum(a)));
                }
            }
            if let Some(a) = &p.port_security {
                if !same_strings(row.get("port_security"), a) {
                    cols.push(("port_security", strings_datum(a)));
                }
            }
            if let Some(t) = &p.port_type {
                if row.get_str("type") != t {
                    cols.push(("type", Datum::from(t.as_str())));
                }
            }
            if let Some(m) = merged(row.get("options"), &p.options) {
                cols.push(("options", map_datum(&m)));
            }
            Self::ext_ids(&mut cols, &row, &p.external_ids);
            self.update(LSP, row.uuid(), cols);
            return Ok(());
        }
        if self.new_names.contains_key(&(LSP, p.name.clone())) {
            return Ok(());
        }
        let new_switches = std::mem::take(&mut self.new_switches);
        let r = self.need(LS, &p.switch, &new_switches);
        self.new_switches = new_switches;
        r?;
        let n = self.named();
        let mut ins = Operation::insert(LSP)
            .uuid_name(&n)
            .value("name", p.name.as_str());
        if let Some(a) = &p.addresses {
            ins = ins.value("addresses", strings_datum(a));
        }
        if let Some(a) = &p.port_security {
            ins = ins.value("port_security", strings_datum(a));
        }
        if let Some(t) = &p.port_type {
            ins = ins.value("type", t.as_str());
        }
        if !p.options.is_empty() {
            ins = ins.value("options", map_datum(&p.options));
        }
        if !p.external_ids.is_empty() {
            ins = ins.value("external_ids", map_datum(&p.external_ids));
        }
        self.push_insert(LSP, ins.into());
        self.txn.push(
            Operation::mutate(LS)
                .filter(Condition::eq("name", p.switch.as_str()))
                .insert("ports", Datum::named_uuid(&n)),
        );
        self.new_names.insert((LSP, p.name.clone()), n);
        Ok(())
    }
}

#[async_trait]
impl Northbound for OvsdbNorthbound {
    async fn commit(&self, batch: Batch) -> Result<(), Error> {
        let client =
            write_client(self.session.as_ref(), &self.client, &self.cache, self.wait).await?;
        let Some(plan) = self.plan(&batch)? else {
            return Ok(());
        };
        let results = client.transact(&plan.txn).await?;
        let inserted: Vec<(&'static str, Uuid)> = plan
            .inserts
            .iter()
            .filter_map(|(t, i)| match results.get(*i) {
                Some(OperationResult::Insert(uuid)) => Some((*t, *uuid)),
                _ => None,
            })
            .collect();
        let deletes = plan.deletes;
        let ok = self
            .cache
            .wait_for(self.wait, |v| {
                inserted.iter().all(|(t, u)| v.get(t, *u).is_some())
                    && deletes.iter().all(|(t, u)| v.get(t, *u).is_none())
            })
            .await;
        if ok {
            Ok(())
        } else {
            Err(NbError::CacheTimeout(self.wait).into())
        }
    }

    fn switch(&self, name: &str) -> Option<nb::LogicalSwitch> {
        self.typed(LS, "name", name)
    }

    fn switch_port(&self, name: &str) -> Option<nb::LogicalSwitchPort> {
        self.typed(LSP, "name", name)
    }

    fn switch_port_names(&self, switch: &str) -> Vec<String> {
        let v = self.cache.view();
        let Some(ls) = v.lookup(LS, "name", switch) else {
            return Vec::new();
        };
        ls.uuids("ports")
            .filter_map(|u| v.get(LSP, u))
            .map(|r| r.get_str("name").to_owned())
            .collect()
    }

    fn switch_ports_by_external_id(&self, key: &str, value: &str) -> Vec<nb::LogicalSwitchPort> {
        let k = IndexKey::MapKey {
            column: "external_ids".to_owned(),
            key: key.to_owned(),
        };
        let v = self.cache.view();
        let hits = v.lookup_all(LSP, &k, value);
        if !hits.is_empty() {
            return hits.into_iter().filter_map(|r| r.to_model().ok()).collect();
        }
        v.rows(LSP)
            .filter(|r| r.map_get("external_ids", key) == Some(value))
            .filter_map(|r| r.to_model().ok())
            .collect()
    }

    fn router(&self, name: &str) -> Option<nb::LogicalRouter> {
        self.typed(LR, "name", name)
    }

    fn router_port(&self, name: &str) -> Option<nb::LogicalRouterPort> {
        self.typed(LRP, "name", name)
    }

    fn static_routes(&self, router: &str) -> Vec<nb::LogicalRouterStaticRoute> {
        self.router_children(router, "static_routes", ROUTE)
    }

    fn policies(&self, router: &str) -> Vec<nb::LogicalRouterPolicy> {
        self.router_children(router, "policies", POLICY)
    }

    fn port_group(&self, name: &str) -> Option<nb::PortGroup> {
        self.typed(PG, "name", name)
    }

    fn address_set(&self, name: &str) -> Option<nb::AddressSet> {
        self.typed(AS, "name", name)
    }

    fn acls(&self, parent: &AclParent) -> Vec<nb::Acl> {
        let (table, name) = match parent {
            AclParent::PortGroup(n) => (PG, n),
            AclParent::Switch(n) => (LS, n),
        };
        let v = self.cache.view();
        let Some(p) = v.lookup(table, "name", name) else {
            return Vec::new();
        };
        p.uuids("acls")
            .filter_map(|u| v.get(ext::ACL, u))
            .filter_map(|r| r.to_model().ok())
            .collect()
    }

    fn meter(&self, name: &str) -> Option<nb::Meter> {
        self.typed(ext::METER, "name", name)
    }

    fn load_balancer(&self, name: &str) -> Option<nb::LoadBalancer> {
        self.typed(ext::LB, "name", name)
    }

    fn nats(&self, router: &str) -> Vec<nb::Nat> {
        self.router_children(router, "nat", ext::NAT)
    }

    fn dhcp_options(
        &self,
        cidr: &str,
        external_ids: &BTreeMap<String, String>,
    ) -> Option<nb::DhcpOptions> {
        self.cache
            .view()
            .rows(ext::DHCP)
            .find(|r| {
                r.get_str("cidr") == cidr
                    && external_ids
                        .iter()
                        .all(|(k, v)| r.map_get("external_ids", k) == Some(v.as_str()))
            })
            .and_then(|r| r.to_model().ok())
    }

    fn nb_global(&self) -> Option<nb::NbGlobal> {
        self.cache
            .view()
            .rows(ext::NBG)
            .next()
            .and_then(|r| r.to_model().ok())
    }
}
