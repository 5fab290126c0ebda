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
//! One file per area holds its specs and how the planner turns them into operations: switches and their
//! ports (`switch`), routers, their ports, patches, routes and policies (`router`), port groups and address
//! sets (`group`), ACLs and meters (`acl`), load balancers (`lb`), NAT (`nat`), DHCP options and `NB_Global`
//! (`global`), and raw operations for the tables the specs do not cover ([`RawOp`]). Enumerated columns are
//! the generated enums of [`crate::models::nb`], re-exported here.
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
use crate::model::Model;
use crate::models::nb;
use crate::ops::{Condition, Operation, OperationResult, Transaction};
use crate::rowdiff::{map_datum, merged, Map};
use crate::session::{write_client, Session};
use crate::uuid::Uuid;

/// The `name` column, by which the planner and the lookups find rows of every table that has one.
const NAME: &str = nb::LogicalSwitch::NAME;

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
    /// A raw operation's result was read as something it is not (or before its batch was committed).
    #[error("raw operation result: expected {expected}, found {found}")]
    RawResult {
        /// What the caller read.
        expected: &'static str,
        /// What the result is.
        found: String,
    },
    /// A raw insert's uuid-name is one the planner uses for the batch's own rows.
    #[error("raw operation uuid-name {0:?} is reserved for the planner (r followed by digits)")]
    ReservedName(String),
    /// An op of a batch uses a row an earlier op of the same batch deletes, or deletes a row an earlier op
    /// ensures or uses: one transaction cannot apply both in order (split the batch).
    #[error("{table} {name:?} is both deleted and used by one batch")]
    DeletedAndUsed {
        /// Table.
        table: &'static str,
        /// Name.
        name: String,
    },
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

fn opt_str(d: Option<&Datum>) -> Option<&str> {
    d?.atoms().first()?.as_str()
}

fn opt_datum(v: Option<&str>) -> Datum {
    Datum::set(v)
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

mod acl;
mod global;
mod group;
mod lb;
mod nat;
mod raw;
mod router;
mod switch;
mod template;

pub use acl::{Acl, AclAction, AclDirection, AclParent, AclSet, AclSeverity, Meter, MeterUnit};
pub use global::{DhcpOptions, NbGlobal};
pub use group::{AddressSet, PortGroup};
pub use lb::{
    LbTarget, LoadBalancer, LoadBalancerGroup, LoadBalancerProtocol, LoadBalancerSelectionFields,
};
pub use nat::{Nat, NatType};
pub use raw::{RawOp, RawResult};
pub use router::{
    LogicalRouterPolicyAction, LogicalRouterStaticRoutePolicy, Patch, Router, RouterPolicy,
    RouterPort, StaticRoute,
};
pub use switch::{LogicalSwitch, PortType, SwitchPort};
pub use template::{template_var_name, ChassisTemplateVars};

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
    /// Set the exact ACLs of one owner on a parent.
    AclSet(AclSet),
    /// Delete the ACL of `parent` with this direction, priority and match.
    DeleteAcl {
        /// Port group or switch.
        parent: AclParent,
        /// Direction.
        direction: AclDirection,
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
    /// Ensure a load balancer group.
    LoadBalancerGroup(LoadBalancerGroup),
    /// Delete a load balancer group by name (switches and routers drop it first).
    DeleteLoadBalancerGroup(String),
    /// Add (or remove) load balancers, by name, to (from) a group.
    LbGroupMembers {
        /// Group.
        group: String,
        /// Load balancers.
        lbs: Vec<String>,
        /// true: add; false: remove.
        add: bool,
    },
    /// Attach (or detach) a load balancer group to a switch or router.
    LbGroupAttach {
        /// Group.
        group: String,
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
        nat_type: NatType,
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
    /// Ensure template variables of a chassis (merged).
    ChassisTemplateVars(ChassisTemplateVars),
    /// Remove template variables (by name) of a chassis.
    RemoveTemplateVars {
        /// Chassis name.
        chassis: String,
        /// Variable names.
        names: Vec<String>,
    },
    /// Delete a chassis' template variable row: only for a chassis that is gone (ovn-controller 23.03 keeps
    /// stale flows, then aborts when the row comes back; clear a live chassis' variables instead).
    DeleteChassisTemplateVars(String),
    /// A raw operation, sent after the planned ones (see [`RawOp`]).
    Raw(RawOp),
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
    AclSet,
    Meter,
    LoadBalancer,
    LoadBalancerGroup,
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

impl From<RawOp> for Op {
    fn from(r: RawOp) -> Op {
        Op::Raw(r)
    }
}

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
///
/// Every op is planned against the replica as it was before the batch, so a batch must not both delete a
/// named row (switch, port, router, group, ...) and ensure or use it: an op that uses a row an earlier op
/// deletes, or deletes a row an earlier op ensures or uses, makes the whole batch fail with
/// [`NbError::DeletedAndUsed`] before anything is sent (commit the delete and the rest as two batches).
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
            .port_type(PortType::Router)
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
        direction: AclDirection,
        priority: i64,
        match_: &str,
    ) -> &mut Self {
        self.add(Op::DeleteAcl {
            parent,
            direction,
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
    /// Deletes a load balancer group (detaching it from switches and routers first).
    pub fn delete_lb_group(&mut self, name: impl Into<String>) -> &mut Self {
        self.add(Op::DeleteLoadBalancerGroup(name.into()))
    }
    /// Adds load balancers to a group.
    pub fn lb_group_add<I: IntoIterator<Item = S>, S: Into<String>>(
        &mut self,
        group: &str,
        lbs: I,
    ) -> &mut Self {
        self.add(Op::LbGroupMembers {
            group: group.to_owned(),
            lbs: lbs.into_iter().map(Into::into).collect(),
            add: true,
        })
    }
    /// Removes load balancers from a group.
    pub fn lb_group_remove<I: IntoIterator<Item = S>, S: Into<String>>(
        &mut self,
        group: &str,
        lbs: I,
    ) -> &mut Self {
        self.add(Op::LbGroupMembers {
            group: group.to_owned(),
            lbs: lbs.into_iter().map(Into::into).collect(),
            add: false,
        })
    }
    /// Attaches a load balancer group to a switch or router.
    pub fn lb_group_attach(&mut self, group: &str, target: LbTarget) -> &mut Self {
        self.add(Op::LbGroupAttach {
            group: group.to_owned(),
            target,
            attach: true,
        })
    }
    /// Detaches a load balancer group from a switch or router.
    pub fn lb_group_detach(&mut self, group: &str, target: LbTarget) -> &mut Self {
        self.add(Op::LbGroupAttach {
            group: group.to_owned(),
            target,
            attach: false,
        })
    }
    /// Deletes NAT rules (see [`Op::DeleteNat`]).
    pub fn delete_nat(&mut self, router: &str, nat_type: NatType, ip: &str) -> &mut Self {
        self.add(Op::DeleteNat {
            router: router.to_owned(),
            nat_type,
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
    /// Adds a raw operation, for a table the specs do not cover; its result is read from the returned handle
    /// once the batch is committed (see [`RawOp`]).
    pub fn raw(&mut self, op: impl Into<Operation>) -> RawResult {
        let (op, result) = RawOp::new(op);
        self.add(op);
        result
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
    /// The port groups with `external_ids:key` set (any value).
    fn port_groups_with_external_id(&self, key: &str) -> Vec<nb::PortGroup>;
    /// The address sets with `external_ids:key` set (any value).
    fn address_sets_with_external_id(&self, key: &str) -> Vec<nb::AddressSet>;
    /// The ACLs of a port group or switch.
    fn acls(&self, parent: &AclParent) -> Vec<nb::Acl>;
    /// A meter by name.
    fn meter(&self, name: &str) -> Option<nb::Meter>;
    /// A load balancer by name.
    fn load_balancer(&self, name: &str) -> Option<nb::LoadBalancer>;
    /// The load balancers whose `external_ids:key` is `value`.
    fn load_balancers_by_external_id(&self, key: &str, value: &str) -> Vec<nb::LoadBalancer>;
    /// A load balancer group by name.
    fn load_balancer_group(&self, name: &str) -> Option<nb::LoadBalancerGroup>;
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
    /// The template variables of a chassis (by chassis name).
    fn chassis_template_var(&self, chassis: &str) -> Option<nb::ChassisTemplateVar>;
}

/// The tables [`OvsdbNorthbound`] replicates.
pub const TABLES: &[&str] = &[
    nb::LogicalSwitch::TABLE,
    nb::LogicalSwitchPort::TABLE,
    nb::LogicalRouter::TABLE,
    nb::LogicalRouterPort::TABLE,
    nb::LogicalRouterStaticRoute::TABLE,
    nb::LogicalRouterPolicy::TABLE,
    nb::PortGroup::TABLE,
    nb::AddressSet::TABLE,
    nb::Acl::TABLE,
    nb::Meter::TABLE,
    nb::MeterBand::TABLE,
    nb::LoadBalancer::TABLE,
    nb::LoadBalancerGroup::TABLE,
    nb::Nat::TABLE,
    nb::DhcpOptions::TABLE,
    nb::NbGlobal::TABLE,
    nb::ChassisTemplateVar::TABLE,
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
            .index(nb::LogicalSwitch::TABLE, NAME)
            .index(nb::LogicalRouter::TABLE, NAME)
            .index(nb::LoadBalancer::TABLE, NAME)
            .index(nb::LoadBalancerGroup::TABLE, NAME)
            .index(
                nb::ChassisTemplateVar::TABLE,
                nb::ChassisTemplateVar::CHASSIS,
            );
        for k in ["pod", "ls"].iter().chain(extra_keys) {
            b = b.map_key_index(
                nb::LogicalSwitchPort::TABLE,
                nb::LogicalSwitchPort::EXTERNAL_IDS,
                k,
            );
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
            used: HashSet::new(),
            gone: HashSet::new(),
            next: 0,
        };
        for op in &batch.ops {
            p.op(op)?;
        }
        let raws: Vec<&RawOp> = batch
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Raw(r) => Some(r),
                _ => None,
            })
            .collect();
        if p.txn.ops.is_empty() && raws.is_empty() {
            return Ok(None);
        }
        // One `ports insert` per new port would cost the server O(N^2) on a big batch.
        let moved = p.txn.coalesce_set_mutations();
        let inserts = p
            .inserts
            .into_iter()
            .filter_map(|(t, i)| moved.get(i).copied().flatten().map(|i| (t, i)))
            .collect();
        // Raw operations go last, outside the coalescing, so each keeps its own result.
        let mut txn = p.txn;
        let raws = raws
            .into_iter()
            .map(|r| {
                txn.push(r.op.clone());
                (txn.ops.len() - 1, r.clone())
            })
            .collect();
        Ok(Some(Plan {
            txn,
            inserts,
            deletes: p.deletes,
            raws,
        }))
    }

    /// The row of `M`'s table named `name`.
    fn typed<M: Model>(&self, name: &str) -> Option<M> {
        self.cache
            .lookup(M::TABLE, NAME, name)
            .and_then(|r| r.to_model().ok())
    }

    /// The rows of `M`'s table with `external_ids:key` set.
    fn with_external_id<M: Model>(&self, key: &str) -> Vec<M> {
        self.cache
            .view()
            .rows(M::TABLE)
            .filter(|r| r.map_get(nb::PortGroup::EXTERNAL_IDS, key).is_some())
            .filter_map(|r| r.to_model().ok())
            .collect()
    }

    /// The rows of `M`'s table a router's `column` refers to.
    fn router_children<M: Model>(&self, router: &str, column: &str) -> Vec<M> {
        let v = self.cache.view();
        let Some(r) = v.lookup(nb::LogicalRouter::TABLE, NAME, router) else {
            return Vec::new();
        };
        r.uuids(column)
            .filter_map(|u| v.get(M::TABLE, u))
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
    /// (index of the operation, the raw operation) of each raw operation, to hand its result to.
    pub raws: Vec<(usize, RawOp)>,
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
    /// (table, name) of the rows earlier ops of the batch ensure or use.
    used: HashSet<(&'static str, String)>,
    /// (table, name) of the rows earlier ops of the batch delete.
    gone: HashSet<(&'static str, String)>,
    next: usize,
}

type Named<'a> = Vec<(&'static str, &'a str)>;

/// The named rows `op` ensures or uses, and those it deletes.
fn touches(op: &Op) -> (Named<'_>, Named<'_>) {
    use nb::{
        AddressSet as As, LoadBalancer as Lb, LoadBalancerGroup as Lbg, LogicalRouter as Lr,
        LogicalRouterPort as Lrp, LogicalSwitch as Ls, LogicalSwitchPort as Lsp, Meter as M,
        PortGroup as Pg,
    };
    fn lb_target(t: &LbTarget) -> (&'static str, &str) {
        match t {
            LbTarget::Switch(n) => (nb::LogicalSwitch::TABLE, n),
            LbTarget::Router(n) => (nb::LogicalRouter::TABLE, n),
        }
    }
    fn parent(p: &AclParent) -> (&'static str, &str) {
        (p.table(), p.name())
    }
    let mut uses = Vec::new();
    let mut dels = Vec::new();
    match op {
        Op::Switch(s) => uses.push((Ls::TABLE, s.name.as_str())),
        Op::DeleteSwitch(n) => dels.push((Ls::TABLE, n.as_str())),
        Op::SwitchPort(p) => uses.extend([(Ls::TABLE, p.switch.as_str()), (Lsp::TABLE, &p.name)]),
        Op::DeleteSwitchPort(n) => dels.push((Lsp::TABLE, n.as_str())),
        Op::Router(r) => uses.push((Lr::TABLE, r.name.as_str())),
        Op::DeleteRouter(n) => dels.push((Lr::TABLE, n.as_str())),
        Op::RouterPort(p) => uses.extend([(Lr::TABLE, p.router.as_str()), (Lrp::TABLE, &p.name)]),
        Op::DeleteRouterPort(n) => dels.push((Lrp::TABLE, n.as_str())),
        Op::StaticRoute(StaticRoute { router, .. })
        | Op::DeleteStaticRoute { router, .. }
        | Op::Policy(RouterPolicy { router, .. })
        | Op::DeletePolicy { router, .. }
        | Op::Nat(Nat { router, .. })
        | Op::DeleteNat { router, .. } => uses.push((Lr::TABLE, router.as_str())),
        Op::PortGroup(g) => uses.push((Pg::TABLE, g.name.as_str())),
        Op::DeletePortGroup(n) => dels.push((Pg::TABLE, n.as_str())),
        Op::PortGroupAdd { group, ports } | Op::PortGroupRemove { group, ports } => {
            uses.push((Pg::TABLE, group.as_str()));
            uses.extend(ports.iter().map(|p| (Lsp::TABLE, p.as_str())));
        }
        Op::AddressSet(a) => uses.push((As::TABLE, a.name.as_str())),
        Op::DeleteAddressSet(n) => dels.push((As::TABLE, n.as_str())),
        Op::Acl(a) => uses.push(parent(&a.parent)),
        Op::AclSet(a) => uses.push(parent(&a.parent)),
        Op::DeleteAcl { parent: p, .. } | Op::DeleteAclsByExternalId { parent: p, .. } => {
            uses.push(parent(p))
        }
        Op::Meter(m) => uses.push((M::TABLE, m.name.as_str())),
        Op::DeleteMeter(n) => dels.push((M::TABLE, n.as_str())),
        Op::LoadBalancer(lb) => uses.push((Lb::TABLE, lb.name.as_str())),
        Op::DeleteLoadBalancer(n) => dels.push((Lb::TABLE, n.as_str())),
        Op::LbRemoveVip { lb, .. } => uses.push((Lb::TABLE, lb.as_str())),
        Op::LbAttach { lb, target, .. } => {
            uses.extend([(Lb::TABLE, lb.as_str()), lb_target(target)])
        }
        Op::LoadBalancerGroup(g) => uses.push((Lbg::TABLE, g.name.as_str())),
        Op::DeleteLoadBalancerGroup(n) => dels.push((Lbg::TABLE, n.as_str())),
        Op::LbGroupMembers { group, lbs, .. } => {
            uses.push((Lbg::TABLE, group.as_str()));
            uses.extend(lbs.iter().map(|l| (Lb::TABLE, l.as_str())));
        }
        Op::LbGroupAttach { group, target, .. } => {
            uses.extend([(Lbg::TABLE, group.as_str()), lb_target(target)])
        }
        Op::ChassisTemplateVars(ChassisTemplateVars { chassis, .. })
        | Op::RemoveTemplateVars { chassis, .. } => {
            uses.push((nb::ChassisTemplateVar::TABLE, chassis.as_str()))
        }
        Op::DeleteChassisTemplateVars(c) => dels.push((nb::ChassisTemplateVar::TABLE, c.as_str())),
        Op::DhcpOptions(_) | Op::DeleteDhcpOptions { .. } | Op::NbGlobal(_) | Op::Raw(_) => {}
    }
    (uses, dels)
}

impl Planner<'_, '_> {
    fn named(&mut self) -> String {
        self.next += 1;
        format!("r{}", self.next)
    }

    /// The row of `table` named `name`.
    fn find(&self, table: &'static str, name: &str) -> Option<&Arc<CachedRow>> {
        self.view.lookup(table, NAME, name)
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

    /// `external_ids` merged with `want`, if that changes them (every spec'd table names it so).
    fn ext_ids(cols: &mut Vec<(&str, Datum)>, row: &CachedRow, want: &Map) {
        const EXTERNAL_IDS: &str = nb::LogicalSwitch::EXTERNAL_IDS;
        if let Some(m) = merged(row.get(EXTERNAL_IDS), want) {
            cols.push((EXTERNAL_IDS, map_datum(&m)));
        }
    }

    /// Deletes the root row of `table` named `name`, if there is one.
    fn delete_named(&mut self, table: &'static str, name: &str) {
        if let Some(row) = self.find(table, name).cloned() {
            self.txn.push(Operation::delete(table).uuid(row.uuid()));
            self.deletes.push((table, row.uuid()));
        }
    }

    fn router_row(&self, name: &str) -> Result<Option<Arc<CachedRow>>, Error> {
        self.named_row(nb::LogicalRouter::TABLE, name)
    }

    /// The row named `name` (None if this batch creates it), or NotFound.
    fn named_row(&self, table: &'static str, name: &str) -> Result<Option<Arc<CachedRow>>, Error> {
        if let Some(r) = self.find(table, name) {
            return Ok(Some(r.clone()));
        }
        let new = if table == nb::LogicalSwitch::TABLE {
            self.new_switches.contains(name)
        } else if table == nb::LogicalRouter::TABLE {
            self.new_routers.contains(name)
        } else {
            self.new_names.contains_key(&(table, name.to_owned()))
        };
        if new {
            Ok(None)
        } else {
            Err(NbError::NotFound {
                table,
                name: name.to_owned(),
            }
            .into())
        }
    }

    /// A mutation of the row (by UUID), or of the row this batch creates (by name: operations see the
    /// effects of the earlier ones of their transaction).
    fn mutate_row(table: &'static str, row: Option<&CachedRow>, name: &str) -> crate::ops::Mutate {
        match row {
            Some(r) => Operation::mutate(table).uuid(r.uuid()),
            None => Operation::mutate(table).filter(Condition::eq(NAME, name)),
        }
    }

    /// Unlinks the children `gone` from `column` of the parent row `pu` (the server deletes them: they are
    /// not root rows).
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

    /// Plans one change (after checking it against the batch's earlier ones, see [`Batch`]): each kind's
    /// function lives in its area's file.
    fn op(&mut self, op: &Op) -> Result<(), Error> {
        let (uses, dels) = touches(op);
        let clash = uses
            .iter()
            .find(|(t, n)| self.gone.contains(&(*t, (*n).to_owned())))
            .or_else(|| {
                dels.iter()
                    .find(|(t, n)| self.used.contains(&(*t, (*n).to_owned())))
            });
        if let Some((table, name)) = clash {
            return Err(NbError::DeletedAndUsed {
                table,
                name: (*name).to_owned(),
            }
            .into());
        }
        self.used
            .extend(uses.into_iter().map(|(t, n)| (t, n.to_owned())));
        self.gone
            .extend(dels.into_iter().map(|(t, n)| (t, n.to_owned())));
        match op {
            Op::Switch(s) => self.switch(s),
            Op::DeleteSwitch(name) => self.delete_switch(name),
            Op::SwitchPort(p) => self.switch_port(p),
            Op::DeleteSwitchPort(name) => self.delete_switch_port(name),
            Op::Router(r) => self.router(r),
            Op::DeleteRouter(name) => self.delete_router(name),
            Op::RouterPort(p) => self.router_port(p),
            Op::DeleteRouterPort(name) => self.delete_router_port(name),
            Op::StaticRoute(r) => self.static_route(r),
            Op::DeleteStaticRoute {
                router,
                prefix,
                nexthop,
            } => self.delete_static_route(router, prefix, nexthop.as_deref()),
            Op::Policy(p) => self.policy(p),
            Op::DeletePolicy {
                router,
                priority,
                match_,
            } => self.delete_policy(router, *priority, match_),
            Op::PortGroup(g) => self.port_group(g),
            Op::DeletePortGroup(name) => self.delete_port_group(name),
            Op::PortGroupAdd { group, ports } => self.port_group_members(group, ports, true),
            Op::PortGroupRemove { group, ports } => self.port_group_members(group, ports, false),
            Op::AddressSet(a) => self.address_set(a),
            Op::DeleteAddressSet(name) => self.delete_address_set(name),
            Op::Acl(a) => self.acl(a),
            Op::AclSet(a) => self.acl_set(a),
            Op::DeleteAcl {
                parent,
                direction,
                priority,
                match_,
            } => self.delete_acl(parent, direction, *priority, match_),
            Op::DeleteAclsByExternalId { parent, key, value } => {
                self.delete_acls_by_external_id(parent, key, value)
            }
            Op::Meter(m) => self.meter(m),
            Op::DeleteMeter(name) => self.delete_meter(name),
            Op::LoadBalancer(lb) => self.load_balancer(lb),
            Op::DeleteLoadBalancer(name) => self.delete_load_balancer(name),
            Op::LbRemoveVip { lb, vip } => self.lb_remove_vip(lb, vip),
            Op::LbAttach { lb, target, attach } => self.lb_attach(lb, target, *attach),
            Op::LoadBalancerGroup(g) => self.load_balancer_group(g),
            Op::DeleteLoadBalancerGroup(name) => self.delete_load_balancer_group(name),
            Op::LbGroupMembers { group, lbs, add } => self.lb_group_members(group, lbs, *add),
            Op::LbGroupAttach {
                group,
                target,
                attach,
            } => self.lb_group_attach(group, target, *attach),
            Op::Nat(n) => self.nat(n),
            Op::DeleteNat {
                router,
                nat_type,
                ip,
            } => self.delete_nat(router, nat_type, ip),
            Op::DhcpOptions(d) => self.dhcp_options(d),
            Op::DeleteDhcpOptions { cidr, external_ids } => {
                self.delete_dhcp_options(cidr, external_ids)
            }
            Op::NbGlobal(g) => self.nb_global(g),
            Op::ChassisTemplateVars(v) => self.chassis_template_vars(v),
            Op::RemoveTemplateVars { chassis, names } => self.remove_template_vars(chassis, names),
            Op::DeleteChassisTemplateVars(c) => self.delete_chassis_template_vars(c),
            Op::Raw(r) => self.raw(r),
        }
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
        for (i, r) in &plan.raws {
            if let Some(res) = results.get(*i) {
                r.set_result(res.clone());
            }
        }
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
        self.typed(name)
    }

    fn switch_port(&self, name: &str) -> Option<nb::LogicalSwitchPort> {
        self.typed(name)
    }

    fn switch_port_names(&self, switch: &str) -> Vec<String> {
        let v = self.cache.view();
        let Some(ls) = v.lookup(nb::LogicalSwitch::TABLE, NAME, switch) else {
            return Vec::new();
        };
        ls.uuids(nb::LogicalSwitch::PORTS)
            .filter_map(|u| v.get(nb::LogicalSwitchPort::TABLE, u))
            .map(|r| r.get_str(NAME).to_owned())
            .collect()
    }

    fn switch_ports_by_external_id(&self, key: &str, value: &str) -> Vec<nb::LogicalSwitchPort> {
        let k = IndexKey::MapKey {
            column: nb::LogicalSwitchPort::EXTERNAL_IDS.to_owned(),
            key: key.to_owned(),
        };
        let v = self.cache.view();
        let hits = v.lookup_all(nb::LogicalSwitchPort::TABLE, &k, value);
        if !hits.is_empty() {
            return hits.into_iter().filter_map(|r| r.to_model().ok()).collect();
        }
        v.rows(nb::LogicalSwitchPort::TABLE)
            .filter(|r| r.map_get(nb::LogicalSwitchPort::EXTERNAL_IDS, key) == Some(value))
            .filter_map(|r| r.to_model().ok())
            .collect()
    }

    fn router(&self, name: &str) -> Option<nb::LogicalRouter> {
        self.typed(name)
    }

    fn router_port(&self, name: &str) -> Option<nb::LogicalRouterPort> {
        self.typed(name)
    }

    fn static_routes(&self, router: &str) -> Vec<nb::LogicalRouterStaticRoute> {
        self.router_children(router, nb::LogicalRouter::STATIC_ROUTES)
    }

    fn policies(&self, router: &str) -> Vec<nb::LogicalRouterPolicy> {
        self.router_children(router, nb::LogicalRouter::POLICIES)
    }

    fn port_group(&self, name: &str) -> Option<nb::PortGroup> {
        self.typed(name)
    }

    fn address_set(&self, name: &str) -> Option<nb::AddressSet> {
        self.typed(name)
    }

    fn port_groups_with_external_id(&self, key: &str) -> Vec<nb::PortGroup> {
        self.with_external_id(key)
    }

    fn address_sets_with_external_id(&self, key: &str) -> Vec<nb::AddressSet> {
        self.with_external_id(key)
    }

    fn acls(&self, parent: &AclParent) -> Vec<nb::Acl> {
        let v = self.cache.view();
        let Some(p) = v.lookup(parent.table(), NAME, parent.name()) else {
            return Vec::new();
        };
        p.uuids(nb::PortGroup::ACLS)
            .filter_map(|u| v.get(nb::Acl::TABLE, u))
            .filter_map(|r| r.to_model().ok())
            .collect()
    }

    fn meter(&self, name: &str) -> Option<nb::Meter> {
        self.typed(name)
    }

    fn load_balancer(&self, name: &str) -> Option<nb::LoadBalancer> {
        self.typed(name)
    }

    fn load_balancers_by_external_id(&self, key: &str, value: &str) -> Vec<nb::LoadBalancer> {
        self.cache
            .view()
            .rows(nb::LoadBalancer::TABLE)
            .filter(|r| r.map_get(nb::LoadBalancer::EXTERNAL_IDS, key) == Some(value))
            .filter_map(|r| r.to_model().ok())
            .collect()
    }

    fn load_balancer_group(&self, name: &str) -> Option<nb::LoadBalancerGroup> {
        self.typed(name)
    }

    fn nats(&self, router: &str) -> Vec<nb::Nat> {
        self.router_children(router, nb::LogicalRouter::NAT)
    }

    fn dhcp_options(
        &self,
        cidr: &str,
        external_ids: &BTreeMap<String, String>,
    ) -> Option<nb::DhcpOptions> {
        self.cache
            .view()
            .rows(nb::DhcpOptions::TABLE)
            .find(|r| {
                r.get_str(nb::DhcpOptions::CIDR) == cidr
                    && external_ids.iter().all(|(k, v)| {
                        r.map_get(nb::DhcpOptions::EXTERNAL_IDS, k) == Some(v.as_str())
                    })
            })
            .and_then(|r| r.to_model().ok())
    }

    fn nb_global(&self) -> Option<nb::NbGlobal> {
        self.cache
            .view()
            .rows(nb::NbGlobal::TABLE)
            .next()
            .and_then(|r| r.to_model().ok())
    }

    fn chassis_template_var(&self, chassis: &str) -> Option<nb::ChassisTemplateVar> {
        self.cache
            .lookup(
                nb::ChassisTemplateVar::TABLE,
                nb::ChassisTemplateVar::CHASSIS,
                chassis,
            )
            .and_then(|r| r.to_model().ok())
    }
}
