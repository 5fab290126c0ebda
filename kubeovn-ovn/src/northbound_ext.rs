//! More northbound objects: ACLs (on port groups or switches, with meters and tiers), meters, load balancers
//! and their VIPs, NAT rules, DHCP options and `NB_Global` options. A child module of [`super`], so that the
//! planner's internals stay private.

use std::collections::BTreeMap;

use super::{NbError, Op, Planner};
use crate::cache::CachedRow;
use crate::datum::{Atom, Datum};
use crate::error::Error;
use crate::ops::Operation;
use crate::rowdiff::{int_of, map_datum, map_of, merged, merged_opt, Map};
use crate::uuid::Uuid;

pub(super) const ACL: &str = "ACL";
pub(super) const METER: &str = "Meter";
pub(super) const BAND: &str = "Meter_Band";
pub(super) const LB: &str = "Load_Balancer";
pub(super) const NAT: &str = "NAT";
pub(super) const DHCP: &str = "DHCP_Options";
pub(super) const NBG: &str = "NB_Global";

/// What an ACL is attached to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AclParent {
    /// A port group, by name.
    PortGroup(String),
    /// A logical switch, by name.
    Switch(String),
}

impl AclParent {
    fn table(&self) -> &'static str {
        match self {
            AclParent::PortGroup(_) => super::PG,
            AclParent::Switch(_) => super::LS,
        }
    }
    fn name(&self) -> &str {
        match self {
            AclParent::PortGroup(n) | AclParent::Switch(n) => n,
        }
    }
}

/// An ACL, identified on its parent by direction, priority and match (as `ovn-nbctl acl-add`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    /// Port group or switch.
    pub parent: AclParent,
    /// `from-lport` or `to-lport`.
    pub direction: String,
    /// 0..=32767.
    pub priority: i64,
    /// The match expression.
    pub match_: String,
    /// `allow`, `allow-related`, `allow-stateless`, `drop`, `reject`, `pass`.
    pub action: String,
    /// `name` (for logs).
    pub name: Option<String>,
    /// Whether matches are logged.
    pub log: bool,
    /// Log severity.
    pub severity: Option<String>,
    /// Meter (by name) limiting the logs.
    pub meter: Option<String>,
    /// `tier` (OVN 23.06 and later; the transaction is refused by an older schema).
    pub tier: Option<i64>,
    /// `options` (merged).
    pub options: Map,
    /// `external_ids` (merged).
    pub external_ids: Map,
}

impl Acl {
    /// An ACL on `parent`.
    pub fn new(
        parent: AclParent,
        direction: impl Into<String>,
        priority: i64,
        match_: impl Into<String>,
        action: impl Into<String>,
    ) -> Self {
        Acl {
            parent,
            direction: direction.into(),
            priority,
            match_: match_.into(),
            action: action.into(),
            name: None,
            log: false,
            severity: None,
            meter: None,
            tier: None,
            options: Map::new(),
            external_ids: Map::new(),
        }
    }
    /// Logs matches with `severity`, optionally rate-limited by `meter`, under `name`.
    pub fn log(
        mut self,
        name: impl Into<String>,
        severity: impl Into<String>,
        meter: Option<&str>,
    ) -> Self {
        self.log = true;
        self.name = Some(name.into());
        self.severity = Some(severity.into());
        self.meter = meter.map(str::to_owned);
        self
    }
    /// Sets the tier.
    pub fn tier(mut self, tier: i64) -> Self {
        self.tier = Some(tier);
        self
    }
    /// Sets one `options` key.
    pub fn option(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.options.insert(k.into(), v.into());
        self
    }
    /// Sets one `external_ids` key.
    pub fn external_id(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.external_ids.insert(k.into(), v.into());
        self
    }
}

/// A meter with one drop band (as `ovn-nbctl meter-add`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meter {
    /// Name.
    pub name: String,
    /// `kbps` or `pktps`.
    pub unit: String,
    /// Band rate.
    pub rate: i64,
    /// Band burst size (0: none).
    pub burst: i64,
    /// `fair`.
    pub fair: Option<bool>,
}

impl Meter {
    /// A meter dropping above `rate` `unit`.
    pub fn new(name: impl Into<String>, unit: impl Into<String>, rate: i64, burst: i64) -> Self {
        Meter {
            name: name.into(),
            unit: unit.into(),
            rate,
            burst,
            fair: None,
        }
    }
}

/// A load balancer; `vips` are merged into the existing ones (see [`Op::LbRemoveVip`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadBalancer {
    /// Name.
    pub name: String,
    /// `tcp`, `udp` or `sctp` (None: tcp).
    pub protocol: Option<String>,
    /// VIP (`IP:PORT` or `IP`) to backends (`IP:PORT,IP:PORT`).
    pub vips: Map,
    /// `options` (merged).
    pub options: Map,
    /// `external_ids` (merged).
    pub external_ids: Map,
}

impl LoadBalancer {
    /// A load balancer named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        LoadBalancer {
            name: name.into(),
            ..Default::default()
        }
    }
    /// Sets the protocol.
    pub fn protocol(mut self, p: impl Into<String>) -> Self {
        self.protocol = Some(p.into());
        self
    }
    /// Sets one VIP's backends.
    pub fn vip<I: IntoIterator<Item = S>, S: AsRef<str>>(
        mut self,
        vip: impl Into<String>,
        backends: I,
    ) -> Self {
        let b: Vec<String> = backends
            .into_iter()
            .map(|s| s.as_ref().to_owned())
            .collect();
        self.vips.insert(vip.into(), b.join(","));
        self
    }
    /// Sets one `options` key.
    pub fn option(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.options.insert(k.into(), v.into());
        self
    }
    /// Sets one `external_ids` key.
    pub fn external_id(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.external_ids.insert(k.into(), v.into());
        self
    }
}

/// Where a load balancer is attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LbTarget {
    /// A logical switch, by name.
    Switch(String),
    /// A logical router, by name.
    Router(String),
}

/// A NAT rule of a router, identified by type and logical IP (snat) or external IP (dnat, dnat_and_snat), as
/// `ovn-nbctl lr-nat-add` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nat {
    /// Router.
    pub router: String,
    /// `snat`, `dnat` or `dnat_and_snat`.
    pub nat_type: String,
    /// External IP.
    pub external_ip: String,
    /// Logical IP or CIDR.
    pub logical_ip: String,
    /// Logical port (distributed dnat_and_snat).
    pub logical_port: Option<String>,
    /// External MAC (distributed dnat_and_snat).
    pub external_mac: Option<String>,
    /// `options` (merged).
    pub options: Map,
    /// `external_ids` (merged).
    pub external_ids: Map,
}

impl Nat {
    /// A rule of `nat_type` on `router`.
    pub fn new(
        router: impl Into<String>,
        nat_type: impl Into<String>,
        external_ip: impl Into<String>,
        logical_ip: impl Into<String>,
    ) -> Self {
        Nat {
            router: router.into(),
            nat_type: nat_type.into(),
            external_ip: external_ip.into(),
            logical_ip: logical_ip.into(),
            logical_port: None,
            external_mac: None,
            options: Map::new(),
            external_ids: Map::new(),
        }
    }
    /// Distributed: the logical port and external MAC.
    pub fn distributed(
        mut self,
        logical_port: impl Into<String>,
        external_mac: impl Into<String>,
    ) -> Self {
        self.logical_port = Some(logical_port.into());
        self.external_mac = Some(external_mac.into());
        self
    }
    /// Sets one `external_ids` key.
    pub fn external_id(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.external_ids.insert(k.into(), v.into());
        self
    }
    /// The identifying IP: the logical IP for snat, the external IP otherwise.
    pub fn key_ip(&self) -> &str {
        if self.nat_type == "snat" {
            &self.logical_ip
        } else {
            &self.external_ip
        }
    }
}

/// DHCP options, identified by `cidr` and the given `external_ids` (e.g. `ls`, `protocol`); `options` are
/// replaced as a whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DhcpOptions {
    /// CIDR.
    pub cidr: String,
    /// Options (`lease_time`, `router`, `server_id`, `server_mac`, `dns_server`, ...).
    pub options: Map,
    /// Identifying `external_ids`.
    pub external_ids: Map,
}

impl DhcpOptions {
    /// Options for `cidr`.
    pub fn new(cidr: impl Into<String>) -> Self {
        DhcpOptions {
            cidr: cidr.into(),
            ..Default::default()
        }
    }
    /// Sets one option.
    pub fn option(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.options.insert(k.into(), v.into());
        self
    }
    /// Sets one identifying `external_ids` key.
    pub fn external_id(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.external_ids.insert(k.into(), v.into());
        self
    }
}

/// `NB_Global` keys to set (Some) or remove (None); the row is created if missing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NbGlobal {
    /// `options` (`mac_prefix`, `use_logical_dp_groups`, `northd_probe_interval`, ...).
    pub options: BTreeMap<String, Option<String>>,
    /// `external_ids`.
    pub external_ids: BTreeMap<String, Option<String>>,
}

impl NbGlobal {
    /// No change yet.
    pub fn new() -> Self {
        NbGlobal::default()
    }
    /// Sets one option.
    pub fn option(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.options.insert(k.into(), Some(v.into()));
        self
    }
    /// Removes one option.
    pub fn remove_option(mut self, k: impl Into<String>) -> Self {
        self.options.insert(k.into(), None);
        self
    }
    /// Sets one `external_ids` key.
    pub fn external_id(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.external_ids.insert(k.into(), Some(v.into()));
        self
    }
}

fn opt_str(d: Option<&Datum>) -> Option<&str> {
    d?.atoms().first()?.as_str()
}

fn opt_datum(v: Option<&str>) -> Datum {
    Datum::set(v)
}

impl Planner<'_, '_> {
    /// The row named `name` (None if this batch creates it), or NotFound.
    fn named_row(
        &self,
        table: &'static str,
        name: &str,
    ) -> Result<Option<std::sync::Arc<CachedRow>>, Error> {
        if let Some(r) = self.find(table, name) {
            return Ok(Some(r.clone()));
        }
        let new = match table {
            super::LS => self.new_switches.contains(name),
            super::LR => self.new_routers.contains(name),
            t => self.new_names.contains_key(&(t, name.to_owned())),
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
            None => Operation::mutate(table).filter(crate::ops::Condition::eq("name", name)),
        }
    }

    fn find_acl(
        &self,
        parent: &CachedRow,
        direction: &str,
        priority: i64,
        m: &str,
    ) -> Option<std::sync::Arc<CachedRow>> {
        parent
            .uuids("acls")
            .filter_map(|u| self.view.get(ACL, u))
            .find(|r| {
                r.get_str("direction") == direction
                    && int_of(r.get("priority")) == Some(priority)
                    && r.get_str("match") == m
            })
            .cloned()
    }

    fn nat_rows(&self, router: &CachedRow) -> Vec<std::sync::Arc<CachedRow>> {
        router
            .uuids("nat")
            .filter_map(|u| self.view.get(NAT, u))
            .cloned()
            .collect()
    }

    fn dhcp_row(&self, cidr: &str, ids: &Map) -> Option<std::sync::Arc<CachedRow>> {
        self.view
            .rows(DHCP)
            .find(|r| {
                r.get_str("cidr") == cidr
                    && ids
                        .iter()
                        .all(|(k, v)| r.map_get("external_ids", k) == Some(v.as_str()))
            })
            .cloned()
    }

    /// Plans one of the operations of this module; false if `op` is not one of them.
    pub(super) fn ext_op(&mut self, op: &Op) -> Result<bool, Error> {
        match op {
            Op::Acl(a) => {
                let parent = self.named_row(a.parent.table(), a.parent.name())?;
                let mut cols: Vec<(&str, Datum)> = Vec::new();
                let existing = parent
                    .as_ref()
                    .and_then(|p| self.find_acl(p, &a.direction, a.priority, &a.match_));
                match existing {
                    Some(row) => {
                        if row.get_str("action") != a.action {
                            cols.push(("action", Datum::from(a.action.as_str())));
                        }
                        if opt_str(row.get("name")) != a.name.as_deref() {
                            cols.push(("name", opt_datum(a.name.as_deref())));
                        }
                        let log = matches!(row.get("log"), Some(Datum::Atom(Atom::Boolean(true))));
                        if log != a.log {
                            cols.push(("log", Datum::Atom(Atom::Boolean(a.log))));
                        }
                        if opt_str(row.get("severity")) != a.severity.as_deref() {
                            cols.push(("severity", opt_datum(a.severity.as_deref())));
                        }
                        if opt_str(row.get("meter")) != a.meter.as_deref() {
                            cols.push(("meter", opt_datum(a.meter.as_deref())));
                        }
                        if let Some(t) = a.tier {
                            if int_of(row.get("tier")) != Some(t) {
                                cols.push(("tier", Datum::from(t)));
                            }
                        }
                        if let Some(m) = merged(row.get("options"), &a.options) {
                            cols.push(("options", map_datum(&m)));
                        }
                        Self::ext_ids(&mut cols, &row, &a.external_ids);
                        self.update(ACL, row.uuid(), cols);
                    }
                    None => {
                        let n = self.named();
                        let mut ins = Operation::insert(ACL)
                            .uuid_name(&n)
                            .value("direction", a.direction.as_str())
                            .value("priority", a.priority)
                            .value("match", a.match_.as_str())
                            .value("action", a.action.as_str())
                            .value("log", Datum::Atom(Atom::Boolean(a.log)))
                            .value("name", opt_datum(a.name.as_deref()))
                            .value("severity", opt_datum(a.severity.as_deref()))
                            .value("meter", opt_datum(a.meter.as_deref()))
                            .value("options", map_datum(&a.options))
                            .value("external_ids", map_datum(&a.external_ids));
                        if let Some(t) = a.tier {
                            ins = ins.value("tier", t);
                        }
                        self.push_insert(ACL, ins.into());
                        self.txn.push(
                            Self::mutate_row(a.parent.table(), parent.as_deref(), a.parent.name())
                                .insert("acls", Datum::named_uuid(&n)),
                        );
                    }
                }
            }
            Op::DeleteAcl {
                parent,
                direction,
                priority,
                match_,
            } => {
                if let Some(p) = self.find(parent.table(), parent.name()).cloned() {
                    if let Some(row) = self.find_acl(&p, direction, *priority, match_) {
                        self.txn.push(
                            Operation::mutate(parent.table())
                                .uuid(p.uuid())
                                .delete("acls", Datum::set([row.uuid()])),
                        );
                        self.deletes.push((ACL, row.uuid()));
                    }
                }
            }
            Op::DeleteAclsByExternalId { parent, key, value } => {
                if let Some(p) = self.find(parent.table(), parent.name()).cloned() {
                    let gone: Vec<Uuid> = p
                        .uuids("acls")
                        .filter(|u| {
                            self.view.get(ACL, *u).is_some_and(|r| {
                                r.map_get("external_ids", key) == Some(value.as_str())
                            })
                        })
                        .collect();
                    if !gone.is_empty() {
                        self.txn.push(
                            Operation::mutate(parent.table())
                                .uuid(p.uuid())
                                .delete("acls", Datum::set(gone.iter().copied())),
                        );
                        for u in gone {
                            self.deletes.push((ACL, u));
                        }
                    }
                }
            }
            Op::Meter(m) => match self.find(METER, &m.name).cloned() {
                Some(row) => {
                    let mut cols: Vec<(&str, Datum)> = Vec::new();
                    if row.get_str("unit") != m.unit {
                        cols.push(("unit", Datum::from(m.unit.as_str())));
                    }
                    if let Some(f) = m.fair {
                        if !matches!(row.get("fair").map(Datum::atoms), Some([Atom::Boolean(b)]) if *b == f)
                        {
                            cols.push(("fair", Datum::set([f])));
                        }
                    }
                    self.update(METER, row.uuid(), cols);
                    let band = row
                        .uuids("bands")
                        .next()
                        .and_then(|u| self.view.get(BAND, u))
                        .cloned();
                    if let Some(b) = band {
                        let mut cols: Vec<(&str, Datum)> = Vec::new();
                        if int_of(b.get("rate")) != Some(m.rate) {
                            cols.push(("rate", Datum::from(m.rate)));
                        }
                        if int_of(b.get("burst_size")) != Some(m.burst) {
                            cols.push(("burst_size", Datum::from(m.burst)));
                        }
                        self.update(BAND, b.uuid(), cols);
                    }
                }
                None if self.new_names.contains_key(&(METER, m.name.clone())) => {}
                None => {
                    let b = self.named();
                    self.txn.push(
                        Operation::insert(BAND)
                            .uuid_name(&b)
                            .value("action", "drop")
                            .value("rate", m.rate)
                            .value("burst_size", m.burst),
                    );
                    let ins = Operation::insert(METER)
                        .value("name", m.name.as_str())
                        .value("unit", m.unit.as_str())
                        .value("bands", Datum::named_uuid(&b))
                        .value("fair", Datum::set(m.fair));
                    self.push_insert(METER, ins.into());
                    self.new_names
                        .insert((METER, m.name.clone()), String::new());
                }
            },
            Op::DeleteMeter(name) => {
                if let Some(row) = self.find(METER, name).cloned() {
                    self.txn.push(Operation::delete(METER).uuid(row.uuid()));
                    self.deletes.push((METER, row.uuid()));
                }
            }
            Op::LoadBalancer(lb) => match self.find(LB, &lb.name).cloned() {
                Some(row) => {
                    let mut cols: Vec<(&str, Datum)> = Vec::new();
                    let vips: BTreeMap<String, Option<String>> = lb
                        .vips
                        .iter()
                        .map(|(k, v)| (k.clone(), Some(v.clone())))
                        .collect();
                    if let Some(m) = merged_opt(row.get("vips"), &vips) {
                        cols.push(("vips", map_datum(&m)));
                    }
                    if let Some(p) = &lb.protocol {
                        if opt_str(row.get("protocol")).unwrap_or("tcp") != p {
                            cols.push(("protocol", Datum::set([p.as_str()])));
                        }
                    }
                    if let Some(m) = merged(row.get("options"), &lb.options) {
                        cols.push(("options", map_datum(&m)));
                    }
                    Self::ext_ids(&mut cols, &row, &lb.external_ids);
                    self.update(LB, row.uuid(), cols);
                }
                None if self.new_names.contains_key(&(LB, lb.name.clone())) => {}
                None => {
                    let n = self.named();
                    let ins = Operation::insert(LB)
                        .uuid_name(&n)
                        .value("name", lb.name.as_str())
                        .value("vips", map_datum(&lb.vips))
                        .value("protocol", opt_datum(lb.protocol.as_deref()))
                        .value("options", map_datum(&lb.options))
                        .value("external_ids", map_datum(&lb.external_ids));
                    self.push_insert(LB, ins.into());
                    self.new_names.insert((LB, lb.name.clone()), n);
                }
            },
            Op::DeleteLoadBalancer(name) => {
                if let Some(row) = self.find(LB, name).cloned() {
                    self.txn.push(Operation::delete(LB).uuid(row.uuid()));
                    self.deletes.push((LB, row.uuid()));
                }
            }
            Op::LbRemoveVip { lb, vip } => {
                if let Some(row) = self.find(LB, lb).cloned() {
                    if row.map_get("vips", vip).is_some() {
                        self.txn.push(
                            Operation::mutate(LB)
                                .uuid(row.uuid())
                                .delete("vips", Datum::set([vip.as_str()])),
                        );
                    }
                }
            }
            Op::LbAttach { lb, target, attach } => {
                let (table, name) = match target {
                    LbTarget::Switch(n) => (super::LS, n),
                    LbTarget::Router(n) => (super::LR, n),
                };
                let lb_ref = match (
                    self.find(LB, lb).cloned(),
                    self.new_names.get(&(LB, lb.clone())),
                ) {
                    (Some(r), _) => Atom::Uuid(r.uuid()),
                    (None, Some(n)) if !n.is_empty() => Atom::NamedUuid(n.clone()),
                    _ if !*attach => return Ok(true),
                    _ => {
                        return Err(NbError::NotFound {
                            table: LB,
                            name: lb.clone(),
                        }
                        .into())
                    }
                };
                let t = match self.named_row(table, name) {
                    Ok(t) => t,
                    Err(_) if !*attach => return Ok(true),
                    Err(e) => return Err(e),
                };
                let has = match (&lb_ref, &t) {
                    (Atom::Uuid(u), Some(t)) => t.uuids("load_balancer").any(|x| x == *u),
                    _ => false,
                };
                if *attach && !has {
                    self.txn.push(
                        Self::mutate_row(table, t.as_deref(), name)
                            .insert("load_balancer", Datum::Set(vec![lb_ref])),
                    );
                } else if !*attach && has {
                    self.txn.push(
                        Self::mutate_row(table, t.as_deref(), name)
                            .delete("load_balancer", Datum::Set(vec![lb_ref])),
                    );
                }
            }
            Op::Nat(n) => {
                let router = self.named_row(super::LR, &n.router)?;
                let rows = router
                    .as_ref()
                    .map(|r| self.nat_rows(r))
                    .unwrap_or_default();
                let existing = rows.into_iter().find(|r| {
                    r.get_str("type") == n.nat_type
                        && if n.nat_type == "snat" {
                            r.get_str("logical_ip") == n.logical_ip
                        } else {
                            r.get_str("external_ip") == n.external_ip
                        }
                });
                match existing {
                    Some(row) => {
                        let mut cols: Vec<(&str, Datum)> = Vec::new();
                        if row.get_str("external_ip") != n.external_ip {
                            cols.push(("external_ip", Datum::from(n.external_ip.as_str())));
                        }
                        if row.get_str("logical_ip") != n.logical_ip {
                            cols.push(("logical_ip", Datum::from(n.logical_ip.as_str())));
                        }
                        if opt_str(row.get("logical_port")) != n.logical_port.as_deref() {
                            cols.push(("logical_port", opt_datum(n.logical_port.as_deref())));
                        }
                        if opt_str(row.get("external_mac")) != n.external_mac.as_deref() {
                            cols.push(("external_mac", opt_datum(n.external_mac.as_deref())));
                        }
                        if let Some(m) = merged(row.get("options"), &n.options) {
                            cols.push(("options", map_datum(&m)));
                        }
                        Self::ext_ids(&mut cols, &row, &n.external_ids);
                        self.update(NAT, row.uuid(), cols);
                    }
                    None => {
                        let u = self.named();
                        let ins = Operation::insert(NAT)
                            .uuid_name(&u)
                            .value("type", n.nat_type.as_str())
                            .value("external_ip", n.external_ip.as_str())
                            .value("logical_ip", n.logical_ip.as_str())
                            .value("logical_port", opt_datum(n.logical_port.as_deref()))
                            .value("external_mac", opt_datum(n.external_mac.as_deref()))
                            .value("options", map_datum(&n.options))
                            .value("external_ids", map_datum(&n.external_ids));
                        self.push_insert(NAT, ins.into());
                        self.txn.push(
                            Self::mutate_row(super::LR, router.as_deref(), &n.router)
                                .insert("nat", Datum::named_uuid(&u)),
                        );
                    }
                }
            }
            Op::DeleteNat {
                router,
                nat_type,
                ip,
            } => {
                if let Some(r) = self.find(super::LR, router).cloned() {
                    let gone: Vec<Uuid> = self
                        .nat_rows(&r)
                        .iter()
                        .filter(|x| {
                            x.get_str("type") == nat_type
                                && if nat_type == "snat" {
                                    x.get_str("logical_ip") == ip
                                } else {
                                    x.get_str("external_ip") == ip
                                }
                        })
                        .map(|x| x.uuid())
                        .collect();
                    if !gone.is_empty() {
                        self.txn.push(
                            Operation::mutate(super::LR)
                                .uuid(r.uuid())
                                .delete("nat", Datum::set(gone.iter().copied())),
                        );
                        for u in gone {
                            self.deletes.push((NAT, u));
                        }
                    }
                }
            }
            Op::DhcpOptions(d) => match self.dhcp_row(&d.cidr, &d.external_ids) {
                Some(row) => {
                    if map_of(row.get("options")) != d.options {
                        self.update(DHCP, row.uuid(), vec![("options", map_datum(&d.options))]);
                    }
                }
                None => {
                    let ins = Operation::insert(DHCP)
                        .value("cidr", d.cidr.as_str())
                        .value("options", map_datum(&d.options))
                        .value("external_ids", map_datum(&d.external_ids));
                    self.push_insert(DHCP, ins.into());
                }
            },
            Op::DeleteDhcpOptions { cidr, external_ids } => {
                if let Some(row) = self.dhcp_row(cidr, external_ids) {
                    self.txn.push(Operation::delete(DHCP).uuid(row.uuid()));
                    self.deletes.push((DHCP, row.uuid()));
                }
            }
            Op::NbGlobal(g) => match self.view.rows(NBG).next().cloned() {
                Some(row) => {
                    let mut cols: Vec<(&str, Datum)> = Vec::new();
                    if let Some(m) = merged_opt(row.get("options"), &g.options) {
                        cols.push(("options", map_datum(&m)));
                    }
                    if let Some(m) = merged_opt(row.get("external_ids"), &g.external_ids) {
                        cols.push(("external_ids", map_datum(&m)));
                    }
                    self.update(NBG, row.uuid(), cols);
                }
                None => {
                    let set = |m: &BTreeMap<String, Option<String>>| -> Map {
                        m.iter()
                            .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
                            .collect()
                    };
                    let ins = Operation::insert(NBG)
                        .value("options", map_datum(&set(&g.options)))
                        .value("external_ids", map_datum(&set(&g.external_ids)));
                    self.push_insert(NBG, ins.into());
                }
            },
            _ => return Ok(false),
        }
        Ok(true)
    }
}
