//! A high-level, idempotent `Open_vSwitch` database API (what `ovs-vsctl` does for Kube-OVN) on top of
//! [`Client`] or [`Session`] and a [`Cache`].
//!
//! Specs describe the wanted state: [`BridgeSpec`] (datapath type, fail mode, external_ids), [`PortSpec`]
//! (a port with one interface of the same name: type, `iface-id` and other external_ids, `mtu_request`,
//! ingress policing), [`QosSpec`] (a QoS with queues on a port) and [`GlobalSpec`] (the `Open_vSwitch` row's
//! external_ids: `system-id`, `ovn-remote`, `ovn-encap-type`, ...). Each is an *ensure* (create, update what
//! differs, or nothing); deletes are no-ops when the object is gone. An [`OvsBatch`] is one transaction.
//!
//! Like `ovs-vsctl`, every transaction that changes something increments `Open_vSwitch.next_cfg`; a commit
//! returns once the replica shows that value (so later lookups see the change) and, with
//! [`OvsdbOpenVSwitch::wait_vswitchd`], once ovs-vswitchd has applied it (`cur_cfg`).
//!
//! The [`OpenVSwitch`] trait is the I/O seam (mockable with the `mock` feature, as `MockOpenVSwitch`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), kubeovn_ovn::Error> {
//! use std::time::Duration;
//! use kubeovn_ovn::vswitch::{
//!     BridgeFailMode, BridgeSpec, GlobalSpec, OpenVSwitch, OvsdbOpenVSwitch, OvsBatch, PortSpec,
//! };
//! let ovs = OvsdbOpenVSwitch::connect("unix:/var/run/openvswitch/db.sock").await?;
//! let mut b = OvsBatch::new();
//! b.add(GlobalSpec::new().external_id("system-id", "node1").external_id("ovn-encap-type", "geneve"));
//! b.add(BridgeSpec::new("br-int").datapath_type("netdev").fail_mode(BridgeFailMode::Secure));
//! b.add(PortSpec::new("br-int", "h1").iface_id("pod1.ns").mtu_request(1400));
//! ovs.commit(b).await?;
//! let ofport = ovs.wait_ofport("h1", Duration::from_secs(5)).await?;
//! ovs.wait_ovn_installed("h1", Duration::from_secs(10)).await?;
//! # let _ = ofport; Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::cache::{Cache, CacheBuilder, CacheView, CachedRow, IndexKey};
use crate::client::Client;
use crate::datum::{Atom, Datum};
use crate::error::Error;
use crate::models::ovs;
pub use crate::models::ovs::BridgeFailMode;
use crate::ops::{Condition, Operation, OperationResult, Transaction};
use crate::rowdiff::{int_of, map_datum, map_of, merged_opt, Map};
use crate::session::{write_client, Session};
use crate::uuid::Uuid;

/// The database's name.
pub const OVS_DB: &str = "Open_vSwitch";

const OVS: &str = "Open_vSwitch";
const BR: &str = "Bridge";
const PORT: &str = "Port";
const IFACE: &str = "Interface";
const QOS: &str = "QoS";
const QUEUE: &str = "Queue";

/// The tables [`OvsdbOpenVSwitch`] replicates.
pub const TABLES: &[&str] = &[OVS, BR, PORT, IFACE, QOS, QUEUE];

/// Why an Open_vSwitch request was refused or did not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OvsError {
    /// A row the request needs does not exist.
    #[error("{table} {name:?} not found")]
    NotFound {
        /// Table.
        table: &'static str,
        /// Name.
        name: String,
    },
    /// The port exists on another bridge.
    #[error("port {port:?} is on bridge {actual:?}, not {wanted:?}")]
    WrongBridge {
        /// Port.
        port: String,
        /// Its bridge.
        actual: String,
        /// The bridge asked for.
        wanted: String,
    },
    /// The wait timed out.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, String),
    /// ovs-vswitchd could not add the interface (`ofport` -1): the interface's `error` column.
    #[error("interface {iface:?} failed: {error}")]
    InterfaceError {
        /// Interface.
        iface: String,
        /// Its error column.
        error: String,
    },
}

fn set_map(want: &BTreeMap<String, Option<String>>) -> Map {
    want.iter()
        .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
        .collect()
}

macro_rules! map_setters {
    ($field:ident, $set:ident, $remove:ident, $what:literal) => {
        #[doc = concat!("Sets one `", $what, "` key (merged with the row's other keys).")]
        pub fn $set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
            self.$field.insert(key.into(), Some(value.into()));
            self
        }
        #[doc = concat!("Removes one `", $what, "` key.")]
        pub fn $remove(mut self, key: impl Into<String>) -> Self {
            self.$field.insert(key.into(), None);
            self
        }
    };
}

/// A bridge (created with its internal port and interface of the same name, as `ovs-vsctl add-br` does).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BridgeSpec {
    /// Name.
    pub name: String,
    /// `datapath_type` (`system`, `netdev`); None leaves it.
    pub datapath_type: Option<String>,
    /// `fail_mode`; None leaves it.
    pub fail_mode: Option<BridgeFailMode>,
    /// `external_ids` keys to set (Some) or remove (None).
    pub external_ids: BTreeMap<String, Option<String>>,
    /// `other_config` keys to set or remove.
    pub other_config: BTreeMap<String, Option<String>>,
}

impl BridgeSpec {
    /// A bridge named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        BridgeSpec {
            name: name.into(),
            ..Default::default()
        }
    }
    /// Sets `datapath_type`.
    pub fn datapath_type(mut self, t: impl Into<String>) -> Self {
        self.datapath_type = Some(t.into());
        self
    }
    /// Sets `fail_mode`.
    pub fn fail_mode(mut self, m: BridgeFailMode) -> Self {
        self.fail_mode = Some(m);
        self
    }
    map_setters!(
        external_ids,
        external_id,
        remove_external_id,
        "external_ids"
    );
    map_setters!(
        other_config,
        other_config,
        remove_other_config,
        "other_config"
    );
}

/// A port of a bridge with one interface of the same name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortSpec {
    /// Bridge.
    pub bridge: String,
    /// Port and interface name.
    pub name: String,
    /// Interface `type` (`""` system, `internal`, `patch`, `geneve`, ...); None leaves it.
    pub iface_type: Option<String>,
    /// Interface `external_ids` keys to set or remove (`iface-id`, `pod_name`, `ip`, ...).
    pub external_ids: BTreeMap<String, Option<String>>,
    /// Interface `options` keys to set or remove.
    pub options: BTreeMap<String, Option<String>>,
    /// Port `external_ids` keys to set or remove.
    pub port_external_ids: BTreeMap<String, Option<String>>,
    /// Interface `mtu_request`: Some(Some(n)) sets, Some(None) clears, None leaves.
    pub mtu_request: Option<Option<i64>>,
    /// Interface `ingress_policing_rate` (kbps, 0 disables).
    pub ingress_policing_rate: Option<i64>,
    /// Interface `ingress_policing_burst` (kb).
    pub ingress_policing_burst: Option<i64>,
    /// Port `tag` (VLAN): Some(Some(n)) sets, Some(None) clears.
    pub tag: Option<Option<i64>>,
}

impl PortSpec {
    /// Port (and interface) `name` on `bridge`.
    pub fn new(bridge: impl Into<String>, name: impl Into<String>) -> Self {
        PortSpec {
            bridge: bridge.into(),
            name: name.into(),
            ..Default::default()
        }
    }
    /// Interface type.
    pub fn iface_type(mut self, t: impl Into<String>) -> Self {
        self.iface_type = Some(t.into());
        self
    }
    /// `external_ids:iface-id` (the logical switch port OVN binds).
    pub fn iface_id(self, id: impl Into<String>) -> Self {
        self.external_id("iface-id", id)
    }
    /// `mtu_request`.
    pub fn mtu_request(mut self, mtu: i64) -> Self {
        self.mtu_request = Some(Some(mtu));
        self
    }
    /// `ingress_policing_rate` and `ingress_policing_burst` (kbps, kb).
    pub fn ingress_policing(mut self, rate_kbps: i64, burst_kb: i64) -> Self {
        self.ingress_policing_rate = Some(rate_kbps);
        self.ingress_policing_burst = Some(burst_kb);
        self
    }
    /// VLAN tag of the port.
    pub fn tag(mut self, tag: i64) -> Self {
        self.tag = Some(Some(tag));
        self
    }
    map_setters!(
        external_ids,
        external_id,
        remove_external_id,
        "external_ids"
    );
    map_setters!(options, option, remove_option, "options");
    map_setters!(
        port_external_ids,
        port_external_id,
        remove_port_external_id,
        "Port external_ids"
    );
}

/// A queue of a [`QosSpec`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueSpec {
    /// `other_config` (`min-rate`, `max-rate`, `burst`, `priority`).
    pub other_config: Map,
    /// `dscp`.
    pub dscp: Option<i64>,
}

impl QueueSpec {
    /// A queue with `other_config:max-rate` (bit/s).
    pub fn max_rate(rate_bps: u64) -> Self {
        let mut q = QueueSpec::default();
        q.other_config
            .insert("max-rate".into(), rate_bps.to_string());
        q
    }
    /// Sets one `other_config` key.
    pub fn other_config(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.other_config.insert(k.into(), v.into());
        self
    }
}

/// The QoS of a port: its type, `other_config` and queues (replaced as a whole).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QosSpec {
    /// The port.
    pub port: String,
    /// `type` (`linux-htb`, `linux-hfsc`, `egress-policer`, ...).
    pub qos_type: String,
    /// `other_config` (`max-rate`, `cir`, `cbs`, ...), replaced as a whole.
    pub other_config: Map,
    /// `external_ids`, replaced as a whole.
    pub external_ids: Map,
    /// Queues by number, replaced as a whole.
    pub queues: BTreeMap<i64, QueueSpec>,
}

impl QosSpec {
    /// A QoS of `qos_type` on `port`.
    pub fn new(port: impl Into<String>, qos_type: impl Into<String>) -> Self {
        QosSpec {
            port: port.into(),
            qos_type: qos_type.into(),
            ..Default::default()
        }
    }
    /// Sets one `other_config` key.
    pub fn other_config(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.other_config.insert(k.into(), v.into());
        self
    }
    /// Sets one `external_ids` key.
    pub fn external_id(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.external_ids.insert(k.into(), v.into());
        self
    }
    /// Adds queue `id`.
    pub fn queue(mut self, id: i64, q: QueueSpec) -> Self {
        self.queues.insert(id, q);
        self
    }
}

/// The `Open_vSwitch` row's `external_ids` (and `other_config`) keys to set or remove.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GlobalSpec {
    /// `external_ids` (`system-id`, `hostname`, `ovn-remote`, `ovn-encap-type`, `ovn-encap-ip`,
    /// `ovn-bridge-datapath-type`, ...).
    pub external_ids: BTreeMap<String, Option<String>>,
    /// `other_config`.
    pub other_config: BTreeMap<String, Option<String>>,
}

impl GlobalSpec {
    /// No change yet.
    pub fn new() -> Self {
        GlobalSpec::default()
    }
    map_setters!(
        external_ids,
        external_id,
        remove_external_id,
        "external_ids"
    );
    map_setters!(
        other_config,
        other_config,
        remove_other_config,
        "other_config"
    );
}

/// One planned change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OvsOp {
    /// Ensure a bridge.
    Bridge(BridgeSpec),
    /// Delete a bridge (its ports and interfaces go with it).
    DeleteBridge(String),
    /// Ensure a port with its interface.
    Port(PortSpec),
    /// Delete a port by name (from whichever bridge has it), with its QoS and queues.
    DeletePort(String),
    /// Ensure a port's QoS and queues.
    Qos(QosSpec),
    /// Remove a port's QoS (the QoS and its queues are deleted).
    DeleteQos(String),
    /// Set or remove keys of the Open_vSwitch row.
    Global(GlobalSpec),
}

impl From<BridgeSpec> for OvsOp {
    fn from(s: BridgeSpec) -> Self {
        OvsOp::Bridge(s)
    }
}
impl From<PortSpec> for OvsOp {
    fn from(s: PortSpec) -> Self {
        OvsOp::Port(s)
    }
}
impl From<QosSpec> for OvsOp {
    fn from(s: QosSpec) -> Self {
        OvsOp::Qos(s)
    }
}
impl From<GlobalSpec> for OvsOp {
    fn from(s: GlobalSpec) -> Self {
        OvsOp::Global(s)
    }
}

/// Changes committed together as one transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OvsBatch {
    /// The changes, in order.
    pub ops: Vec<OvsOp>,
}

impl OvsBatch {
    /// An empty batch.
    pub fn new() -> Self {
        OvsBatch::default()
    }
    /// Adds a spec or any [`OvsOp`].
    pub fn add(&mut self, op: impl Into<OvsOp>) -> &mut Self {
        self.ops.push(op.into());
        self
    }
    /// Deletes a bridge.
    pub fn delete_bridge(&mut self, name: impl Into<String>) -> &mut Self {
        self.add(OvsOp::DeleteBridge(name.into()))
    }
    /// Deletes a port.
    pub fn delete_port(&mut self, name: impl Into<String>) -> &mut Self {
        self.add(OvsOp::DeletePort(name.into()))
    }
    /// Removes a port's QoS.
    pub fn delete_qos(&mut self, port: impl Into<String>) -> &mut Self {
        self.add(OvsOp::DeleteQos(port.into()))
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

macro_rules! execute {
    ($t:ty) => {
        impl $t {
            /// Runs this request alone, as one transaction.
            pub async fn execute<O: OpenVSwitch + ?Sized>(self, ovs: &O) -> Result<(), Error> {
                let mut b = OvsBatch::new();
                b.add(self);
                ovs.commit(b).await
            }
        }
    };
}
execute!(BridgeSpec);
execute!(PortSpec);
execute!(QosSpec);
execute!(GlobalSpec);

/// The Open_vSwitch database as a node agent uses it. The I/O seam: [`OvsdbOpenVSwitch`] is the real one.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait OpenVSwitch: Send + Sync {
    /// Plans `batch` against the replica and commits it as one transaction (nothing is sent if everything is
    /// in place); returns once the replica shows the result.
    async fn commit(&self, batch: OvsBatch) -> Result<(), Error>;
    /// A bridge by name.
    fn bridge(&self, name: &str) -> Option<ovs::Bridge>;
    /// The names of a bridge's ports.
    fn bridge_ports(&self, bridge: &str) -> Vec<String>;
    /// A port by name.
    fn port(&self, name: &str) -> Option<ovs::Port>;
    /// An interface by name.
    fn interface(&self, name: &str) -> Option<ovs::Interface>;
    /// Interfaces whose `external_ids:iface-id` is `iface_id`.
    fn interfaces_by_iface_id(&self, iface_id: &str) -> Vec<ovs::Interface>;
    /// A port's QoS and its queues by number.
    fn qos(&self, port: &str) -> Option<(ovs::QoS, BTreeMap<i64, ovs::Queue>)>;
    /// The Open_vSwitch row's `external_ids`.
    fn external_ids(&self) -> BTreeMap<String, String>;
    /// Waits until ovs-vswitchd has given the interface an OpenFlow port number; an error if it failed
    /// (`ofport` -1) or on timeout.
    async fn wait_ofport(&self, iface: &str, timeout: Duration) -> Result<i64, Error>;
    /// Waits until ovn-controller has marked the interface `external_ids:ovn-installed="true"`.
    async fn wait_ovn_installed(&self, iface: &str, timeout: Duration) -> Result<(), Error>;
}

/// [`OpenVSwitch`] over an OVSDB connection (or reconnecting session) and a replica.
#[derive(Debug, Clone)]
pub struct OvsdbOpenVSwitch {
    client: Client,
    session: Option<Session>,
    cache: Cache,
    wait: Duration,
    wait_vswitchd: bool,
}

impl OvsdbOpenVSwitch {
    /// Connects to `remote` (a reconnecting [`Session`]) and loads the replica.
    pub async fn connect(remote: &str) -> Result<Self, Error> {
        Self::with_session(Session::connect(remote).await?).await
    }

    /// Uses one connection (the replica freezes if it drops).
    pub async fn with_client(client: Client) -> Result<Self, Error> {
        let cache = Self::cache_builder().start(&client).await?;
        Ok(OvsdbOpenVSwitch {
            client,
            session: None,
            cache,
            wait: Duration::from_secs(10),
            wait_vswitchd: false,
        })
    }

    /// Uses a reconnecting session: the replica resumes after reconnects.
    pub async fn with_session(session: Session) -> Result<Self, Error> {
        let client = session.client().await?;
        let cache = Self::cache_builder().start_session(&session).await?;
        Ok(OvsdbOpenVSwitch {
            client,
            session: Some(session),
            cache,
            wait: Duration::from_secs(10),
            wait_vswitchd: false,
        })
    }

    /// The replica this API keeps.
    pub fn cache_builder() -> CacheBuilder {
        CacheBuilder::new(OVS_DB)
            .table_columns(
                OVS,
                [
                    "bridges",
                    "external_ids",
                    "other_config",
                    "next_cfg",
                    "cur_cfg",
                ],
            )
            .table(BR)
            .table(PORT)
            .table_columns(
                IFACE,
                [
                    "name",
                    "type",
                    "external_ids",
                    "options",
                    "ofport",
                    "ofport_request",
                    "mtu_request",
                    "mtu",
                    "ingress_policing_rate",
                    "ingress_policing_burst",
                    "error",
                    "mac_in_use",
                    "link_state",
                ],
            )
            .table(QOS)
            .table(QUEUE)
            .map_key_index(IFACE, "external_ids", "iface-id")
    }

    /// How long a commit waits for the replica (and ovs-vswitchd, see [`Self::wait_vswitchd`]); default 10 s.
    pub fn cache_wait(mut self, d: Duration) -> Self {
        self.wait = d;
        self
    }

    /// Whether commits also wait for ovs-vswitchd to apply them (`cur_cfg` reaching `next_cfg`), like
    /// `ovs-vsctl` without `--no-wait`. Off by default.
    pub fn wait_vswitchd(mut self, on: bool) -> Self {
        self.wait_vswitchd = on;
        self
    }

    /// The replica.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The first connection.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Plans `batch` against the replica; None if nothing changes.
    pub fn plan(&self, batch: &OvsBatch) -> Result<Option<Transaction>, Error> {
        let view = self.cache.view();
        let root = view
            .rows(OVS)
            .next()
            .map(|r| r.uuid())
            .ok_or(OvsError::NotFound {
                table: OVS,
                name: "(the row; run ovs-vsctl init)".into(),
            })?;
        let mut p = Planner {
            view: &view,
            root,
            txn: Transaction::new(OVS_DB),
            new_bridges: BTreeMap::new(),
            new_ports: BTreeMap::new(),
            next: 0,
        };
        for op in &batch.ops {
            p.op(op)?;
        }
        if p.txn.ops.is_empty() {
            return Ok(None);
        }
        // As ovs-vsctl: tell ovs-vswitchd there is a new configuration, and read its number back.
        let mut txn = p.txn;
        txn.push(Operation::mutate(OVS).uuid(root).add("next_cfg", 1i64));
        txn.push(Operation::select(OVS).uuid(root).columns(["next_cfg"]));
        Ok(Some(txn))
    }
}

struct Planner<'v, 'c> {
    view: &'v CacheView<'c>,
    root: Uuid,
    txn: Transaction,
    /// bridge name -> uuid-name of its insert
    new_bridges: BTreeMap<String, String>,
    /// port name -> bridge name
    new_ports: BTreeMap<String, String>,
    next: usize,
}

impl Planner<'_, '_> {
    fn named(&mut self) -> String {
        self.next += 1;
        format!("r{}", self.next)
    }

    fn find(&self, table: &str, name: &str) -> Option<Arc<CachedRow>> {
        self.view.lookup(table, "name", name).cloned()
    }

    fn update(&mut self, table: &str, uuid: Uuid, cols: Vec<(&str, Datum)>) {
        if cols.is_empty() {
            return;
        }
        let mut u = Operation::update(table).uuid(uuid);
        for (c, d) in cols {
            u = u.value(c, d);
        }
        self.txn.push(u);
    }

    fn bridge_of_port(&self, port: Uuid) -> Option<Arc<CachedRow>> {
        self.view
            .rows(BR)
            .find(|b| b.uuids("ports").any(|u| u == port))
            .cloned()
    }

    fn op(&mut self, op: &OvsOp) -> Result<(), Error> {
        match op {
            OvsOp::Global(g) => {
                let Some(row) = self.view.get(OVS, self.root).cloned() else {
                    return Ok(());
                };
                let mut cols = Vec::new();
                if let Some(m) = merged_opt(row.get("external_ids"), &g.external_ids) {
                    cols.push(("external_ids", map_datum(&m)));
                }
                if let Some(m) = merged_opt(row.get("other_config"), &g.other_config) {
                    cols.push(("other_config", map_datum(&m)));
                }
                self.update(OVS, self.root, cols);
            }
            OvsOp::Bridge(b) => self.bridge(b),
            OvsOp::DeleteBridge(name) => {
                if let Some(row) = self.find(BR, name) {
                    self.txn.push(
                        Operation::mutate(OVS)
                            .uuid(self.root)
                            .delete("bridges", Datum::set([row.uuid()])),
                    );
                }
            }
            OvsOp::Port(p) => self.port(p)?,
            OvsOp::DeletePort(name) => {
                if let Some(row) = self.find(PORT, name) {
                    self.delete_qos_of(&row);
                    if let Some(br) = self.bridge_of_port(row.uuid()) {
                        self.txn.push(
                            Operation::mutate(BR)
                                .uuid(br.uuid())
                                .delete("ports", Datum::set([row.uuid()])),
                        );
                    }
                }
            }
            OvsOp::Qos(q) => self.qos(q)?,
            OvsOp::DeleteQos(port) => {
                if let Some(row) = self.find(PORT, port) {
                    self.delete_qos_of(&row);
                }
            }
        }
        Ok(())
    }

    fn delete_qos_of(&mut self, port: &CachedRow) {
        for q in port.uuids("qos").collect::<Vec<_>>() {
            let queues: Vec<Uuid> = self
                .view
                .get(QOS, q)
                .and_then(|r| r.get("queues"))
                .and_then(Datum::as_map)
                .unwrap_or(&[])
                .iter()
                .filter_map(|(_, v)| v.as_uuid())
                .collect();
            // The QoS row is a root: delete it explicitly (after the port stops referring to it, which the
            // caller arranges in the same transaction), then its queues.
            self.txn.push(
                Operation::update(PORT)
                    .uuid(port.uuid())
                    .value("qos", Datum::Set(vec![])),
            );
            self.txn.push(Operation::delete(QOS).uuid(q));
            for u in queues {
                self.txn.push(Operation::delete(QUEUE).uuid(u));
            }
        }
    }

    fn bridge(&mut self, b: &BridgeSpec) {
        if let Some(row) = self.find(BR, &b.name) {
            let mut cols = Vec::new();
            if let Some(t) = &b.datapath_type {
                if row.get_str("datapath_type") != t {
                    cols.push(("datapath_type", Datum::from(t.as_str())));
                }
            }
            if let Some(m) = &b.fail_mode {
                if row.get_str("fail_mode") != m.as_str() {
                    cols.push(("fail_mode", Datum::set([m.as_str()])));
                }
            }
            if let Some(m) = merged_opt(row.get("external_ids"), &b.external_ids) {
                cols.push(("external_ids", map_datum(&m)));
            }
            if let Some(m) = merged_opt(row.get("other_config"), &b.other_config) {
                cols.push(("other_config", map_datum(&m)));
            }
            self.update(BR, row.uuid(), cols);
            return;
        }
        if self.new_bridges.contains_key(&b.name) {
            return;
        }
        let (i, p, br) = (self.named(), self.named(), self.named());
        self.txn.push(
            Operation::insert(IFACE)
                .uuid_name(&i)
                .value("name", b.name.as_str())
                .value("type", "internal"),
        );
        self.txn.push(
            Operation::insert(PORT)
                .uuid_name(&p)
                .value("name", b.name.as_str())
                .value("interfaces", Datum::named_uuid(&i)),
        );
        let mut ins = Operation::insert(BR)
            .uuid_name(&br)
            .value("name", b.name.as_str())
            .value("ports", Datum::named_uuid(&p))
            .value("external_ids", map_datum(&set_map(&b.external_ids)))
            .value("other_config", map_datum(&set_map(&b.other_config)));
        if let Some(t) = &b.datapath_type {
            ins = ins.value("datapath_type", t.as_str());
        }
        if let Some(m) = &b.fail_mode {
            ins = ins.value("fail_mode", Datum::set([m.as_str()]));
        }
        self.txn.push(ins);
        self.txn.push(
            Operation::mutate(OVS)
                .uuid(self.root)
                .insert("bridges", Datum::named_uuid(&br)),
        );
        self.new_bridges.insert(b.name.clone(), br);
    }

    fn iface_cols(p: &PortSpec, row: Option<&CachedRow>) -> Vec<(&'static str, Datum)> {
        let mut cols = Vec::new();
        let cur = |c: &str| row.and_then(|r| r.get(c));
        if let Some(t) = &p.iface_type {
            if row.is_none_or(|r| r.get_str("type") != t) {
                cols.push(("type", Datum::from(t.as_str())));
            }
        }
        if let Some(m) = merged_opt(cur("external_ids"), &p.external_ids) {
            cols.push(("external_ids", map_datum(&m)));
        }
        if let Some(m) = merged_opt(cur("options"), &p.options) {
            cols.push(("options", map_datum(&m)));
        }
        if let Some(mtu) = p.mtu_request {
            if int_of(cur("mtu_request")) != mtu {
                cols.push(("mtu_request", Datum::set(mtu)));
            }
        }
        if let Some(r) = p.ingress_policing_rate {
            if int_of(cur("ingress_policing_rate")).unwrap_or(0) != r {
                cols.push(("ingress_policing_rate", Datum::from(r)));
            }
        }
        if let Some(b) = p.ingress_policing_burst {
            if int_of(cur("ingress_policing_burst")).unwrap_or(0) != b {
                cols.push(("ingress_policing_burst", Datum::from(b)));
            }
        }
        cols
    }

    fn port_cols(p: &PortSpec, row: Option<&CachedRow>) -> Vec<(&'static str, Datum)> {
        let mut cols = Vec::new();
        if let Some(m) = merged_opt(
            row.and_then(|r| r.get("external_ids")),
            &p.port_external_ids,
        ) {
            cols.push(("external_ids", map_datum(&m)));
        }
        if let Some(tag) = p.tag {
            if int_of(row.and_then(|r| r.get("tag"))) != tag {
                cols.push(("tag", Datum::set(tag)));
            }
        }
        cols
    }

    fn port(&mut self, p: &PortSpec) -> Result<(), Error> {
        if let Some(row) = self.find(PORT, &p.name) {
            if let Some(br) = self.bridge_of_port(row.uuid()) {
                if br.get_str("name") != p.bridge {
                    return Err(OvsError::WrongBridge {
                        port: p.name.clone(),
                        actual: br.get_str("name").to_owned(),
                        wanted: p.bridge.clone(),
                    }
                    .into());
                }
            }
            let cols = Self::port_cols(p, Some(&row));
            self.update(PORT, row.uuid(), cols);
            let iface = row
                .uuids("interfaces")
                .filter_map(|u| self.view.get(IFACE, u))
                .find(|i| i.get_str("name") == p.name)
                .cloned();
            if let Some(iface) = iface {
                let cols = Self::iface_cols(p, Some(&iface));
                self.update(IFACE, iface.uuid(), cols);
            }
            return Ok(());
        }
        if self.new_ports.contains_key(&p.name) {
            return Ok(());
        }
        let bridge = match (self.find(BR, &p.bridge), self.new_bridges.get(&p.bridge)) {
            (Some(b), _) => Operation::mutate(BR).uuid(b.uuid()),
            (None, Some(_)) => {
                Operation::mutate(BR).filter(Condition::eq("name", p.bridge.as_str()))
            }
            (None, None) => {
                return Err(OvsError::NotFound {
                    table: BR,
                    name: p.bridge.clone(),
                }
                .into())
            }
        };
        let (i, pn) = (self.named(), self.named());
        let mut ins = Operation::insert(IFACE)
            .uuid_name(&i)
            .value("name", p.name.as_str());
        for (c, d) in Self::iface_cols(p, None) {
            ins = ins.value(c, d);
        }
        self.txn.push(ins);
        let mut ins = Operation::insert(PORT)
            .uuid_name(&pn)
            .value("name", p.name.as_str())
            .value("interfaces", Datum::named_uuid(&i));
        for (c, d) in Self::port_cols(p, None) {
            ins = ins.value(c, d);
        }
        self.txn.push(ins);
        self.txn
            .push(bridge.insert("ports", Datum::named_uuid(&pn)));
        self.new_ports.insert(p.name.clone(), p.bridge.clone());
        Ok(())
    }

    fn qos(&mut self, q: &QosSpec) -> Result<(), Error> {
        let port = self.find(PORT, &q.port);
        if port.is_none() && !self.new_ports.contains_key(&q.port) {
            return Err(OvsError::NotFound {
                table: PORT,
                name: q.port.clone(),
            }
            .into());
        }
        let existing = port
            .as_ref()
            .and_then(|p| p.uuids("qos").next())
            .and_then(|u| self.view.get(QOS, u).cloned());
        // Queues: reuse the rows of numbers kept, insert the others, delete the rest.
        let mut cur_queues: BTreeMap<i64, Uuid> = BTreeMap::new();
        if let Some(row) = &existing {
            for (k, v) in row.get("queues").and_then(Datum::as_map).unwrap_or(&[]) {
                if let (Atom::Integer(k), Some(v)) = (k, v.as_uuid()) {
                    cur_queues.insert(*k, v);
                }
            }
        }
        let mut queue_refs: Vec<(Atom, Atom)> = Vec::new();
        let mut queues_changed = false;
        for (id, spec) in &q.queues {
            match cur_queues.remove(id) {
                Some(u) => {
                    let mut cols = Vec::new();
                    if let Some(row) = self.view.get(QUEUE, u).cloned() {
                        if map_of(row.get("other_config")) != spec.other_config {
                            cols.push(("other_config", map_datum(&spec.other_config)));
                        }
                        if int_of(row.get("dscp")) != spec.dscp {
                            cols.push(("dscp", Datum::set(spec.dscp)));
                        }
                    }
                    self.update(QUEUE, u, cols);
                    queue_refs.push((Atom::Integer(*id), Atom::Uuid(u)));
                }
                None => {
                    let n = self.named();
                    self.txn.push(
                        Operation::insert(QUEUE)
                            .uuid_name(&n)
                            .value("other_config", map_datum(&spec.other_config))
                            .value("dscp", Datum::set(spec.dscp)),
                    );
                    queue_refs.push((Atom::Integer(*id), Atom::NamedUuid(n)));
                    queues_changed = true;
                }
            }
        }
        let removed: Vec<Uuid> = cur_queues.into_values().collect();
        queues_changed |= !removed.is_empty();
        let queues = Datum::Map(queue_refs);
        match existing {
            Some(row) => {
                let mut cols = Vec::new();
                if row.get_str("type") != q.qos_type {
                    cols.push(("type", Datum::from(q.qos_type.as_str())));
                }
                if map_of(row.get("other_config")) != q.other_config {
                    cols.push(("other_config", map_datum(&q.other_config)));
                }
                if map_of(row.get("external_ids")) != q.external_ids {
                    cols.push(("external_ids", map_datum(&q.external_ids)));
                }
                if queues_changed {
                    cols.push(("queues", queues));
                }
                self.update(QOS, row.uuid(), cols);
                for u in removed {
                    self.txn.push(Operation::delete(QUEUE).uuid(u));
                }
            }
            None => {
                let n = self.named();
                self.txn.push(
                    Operation::insert(QOS)
                        .uuid_name(&n)
                        .value("type", q.qos_type.as_str())
                        .value("other_config", map_datum(&q.other_config))
                        .value("external_ids", map_datum(&q.external_ids))
                        .value("queues", queues),
                );
                self.txn.push(
                    Operation::update(PORT)
                        .filter(Condition::eq("name", q.port.as_str()))
                        .value("qos", Datum::named_uuid(&n)),
                );
            }
        }
        Ok(())
    }
}

impl OvsdbOpenVSwitch {
    fn typed<M: crate::Model>(&self, table: &str, name: &str) -> Option<M> {
        self.cache
            .lookup(table, "name", name)
            .and_then(|r| r.to_model().ok())
    }

    async fn wait_iface<T>(
        &self,
        iface: &str,
        timeout: Duration,
        what: &str,
        mut f: impl FnMut(&CachedRow) -> Option<Result<T, Error>>,
    ) -> Result<T, Error> {
        let mut out = None;
        self.cache
            .wait_for(timeout, |v| match v.lookup(IFACE, "name", iface) {
                Some(r) => {
                    out = f(r);
                    out.is_some()
                }
                None => false,
            })
            .await;
        out.unwrap_or_else(|| {
            Err(OvsError::Timeout(timeout, format!("{what} of interface {iface}")).into())
        })
    }
}

#[async_trait]
impl OpenVSwitch for OvsdbOpenVSwitch {
    async fn commit(&self, batch: OvsBatch) -> Result<(), Error> {
        let client =
            write_client(self.session.as_ref(), &self.client, &self.cache, self.wait).await?;
        let Some(txn) = self.plan(&batch)? else {
            return Ok(());
        };
        let results = client.transact(&txn).await?;
        let next_cfg = match results.last() {
            Some(OperationResult::Select(rows)) => rows
                .first()
                .and_then(|r| int_of(r.get("next_cfg")))
                .unwrap_or(0),
            _ => 0,
        };
        let vswitchd = self.wait_vswitchd;
        let ok = self
            .cache
            .wait_for(self.wait, |v| {
                v.rows(OVS).any(|r| {
                    int_of(r.get("next_cfg")).unwrap_or(0) >= next_cfg
                        && (!vswitchd || int_of(r.get("cur_cfg")).unwrap_or(0) >= next_cfg)
                })
            })
            .await;
        if ok {
            Ok(())
        } else {
            Err(OvsError::Timeout(self.wait, format!("next_cfg {next_cfg}")).into())
        }
    }

    fn bridge(&self, name: &str) -> Option<ovs::Bridge> {
        self.typed(BR, name)
    }

    fn bridge_ports(&self, bridge: &str) -> Vec<String> {
        let v = self.cache.view();
        let Some(b) = v.lookup(BR, "name", bridge) else {
            return Vec::new();
        };
        b.uuids("ports")
            .filter_map(|u| v.get(PORT, u))
            .map(|r| r.get_str("name").to_owned())
            .collect()
    }

    fn port(&self, name: &str) -> Option<ovs::Port> {
        self.typed(PORT, name)
    }

    fn interface(&self, name: &str) -> Option<ovs::Interface> {
        self.typed(IFACE, name)
    }

    fn interfaces_by_iface_id(&self, iface_id: &str) -> Vec<ovs::Interface> {
        let k = IndexKey::MapKey {
            column: "external_ids".into(),
            key: "iface-id".into(),
        };
        self.cache
            .lookup_all(IFACE, &k, iface_id)
            .iter()
            .filter_map(|r| r.to_model().ok())
            .collect()
    }

    fn qos(&self, port: &str) -> Option<(ovs::QoS, BTreeMap<i64, ovs::Queue>)> {
        let v = self.cache.view();
        let p = v.lookup(PORT, "name", port)?;
        let q = v.get(QOS, p.uuids("qos").next()?)?;
        let mut queues = BTreeMap::new();
        for (k, u) in q.get("queues").and_then(Datum::as_map).unwrap_or(&[]) {
            if let (Atom::Integer(k), Some(u)) = (k, u.as_uuid()) {
                if let Some(r) = v.get(QUEUE, u) {
                    if let Ok(m) = r.to_model() {
                        queues.insert(*k, m);
                    }
                }
            }
        }
        Some((q.to_model().ok()?, queues))
    }

    fn external_ids(&self) -> BTreeMap<String, String> {
        self.cache
            .rows(OVS)
            .first()
            .map(|r| map_of(r.get("external_ids")))
            .unwrap_or_default()
    }

    async fn wait_ofport(&self, iface: &str, timeout: Duration) -> Result<i64, Error> {
        self.wait_iface(iface, timeout, "ofport", |r| {
            match int_of(r.get("ofport")) {
                Some(-1) => Some(Err(OvsError::InterfaceError {
                    iface: r.get_str("name").to_owned(),
                    error: r.get_str("error").to_owned(),
                }
                .into())),
                Some(n) if n > 0 => Some(Ok(n)),
                _ => None,
            }
        })
        .await
    }

    async fn wait_ovn_installed(&self, iface: &str, timeout: Duration) -> Result<(), Error> {
        self.wait_iface(iface, timeout, "ovn-installed", |r| {
            (r.map_get("external_ids", "ovn-installed") == Some("true")).then_some(Ok(()))
        })
        .await
    }
}
