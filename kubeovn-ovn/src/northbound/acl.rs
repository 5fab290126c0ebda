//! ACLs on port groups or switches (with log meters and tiers) and meters (`acl-add`, `meter-add`).

use std::sync::Arc;

use super::{opt_datum, opt_str, Batch, Northbound, Planner};
use crate::cache::CachedRow;
use crate::datum::{Atom, Datum};
use crate::error::Error;
use crate::model::Model;
use crate::models::nb;
use crate::ops::Operation;
use crate::rowdiff::{int_of, map_datum, merged, Map};
use crate::uuid::Uuid;

pub use crate::models::nb::{AclAction, AclDirection, AclSeverity, MeterUnit};

type AclRow = nb::Acl;
/// `ACL.tier`: OVN 23.06 added it, after the shipped schema (so no generated constant).
const TIER: &str = "tier";
type MeterRow = nb::Meter;
type Band = nb::MeterBand;
type Pg = nb::PortGroup;
type Ls = nb::LogicalSwitch;

/// What an ACL is attached to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AclParent {
    /// A port group, by name.
    PortGroup(String),
    /// A logical switch, by name.
    Switch(String),
}

impl AclParent {
    /// The parent's table.
    pub(super) fn table(&self) -> &'static str {
        match self {
            AclParent::PortGroup(_) => Pg::TABLE,
            AclParent::Switch(_) => Ls::TABLE,
        }
    }
    /// The parent's name.
    pub(super) fn name(&self) -> &str {
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
    /// Direction.
    pub direction: AclDirection,
    /// 0..=32767.
    pub priority: i64,
    /// The match expression.
    pub match_: String,
    /// Action (`AclAction::Unknown("pass")` for an action newer than the shipped schema, e.g. `pass`).
    pub action: AclAction,
    /// `name` (for logs).
    pub name: Option<String>,
    /// Whether matches are logged.
    pub log: bool,
    /// Log severity.
    pub severity: Option<AclSeverity>,
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
        direction: AclDirection,
        priority: i64,
        match_: impl Into<String>,
        action: AclAction,
    ) -> Self {
        Acl {
            parent,
            direction,
            priority,
            match_: match_.into(),
            action,
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
        severity: AclSeverity,
        meter: Option<&str>,
    ) -> Self {
        self.log = true;
        self.name = Some(name.into());
        self.severity = Some(severity);
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
    ext_ids!();
    execute!();
}

/// The ACLs of one owner on one parent, exactly: the ACLs of `parent` whose `external_ids:key` is `value`
/// become `acls` (each identified by direction, priority and match); the owner's others are removed and
/// unchanged ones cost nothing, so a restart with everything in place writes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclSet {
    /// Port group or switch.
    pub parent: AclParent,
    /// The owner's `external_ids` key.
    pub key: String,
    /// The owner's `external_ids` value.
    pub value: String,
    /// The owner's ACLs (their parent and owner key are set from the set's).
    pub acls: Vec<Acl>,
}

impl AclSet {
    /// The ACLs of owner `key=value` on `parent`.
    pub fn new(
        parent: AclParent,
        key: impl Into<String>,
        value: impl Into<String>,
        acls: Vec<Acl>,
    ) -> Self {
        let (key, value) = (key.into(), value.into());
        let acls = acls
            .into_iter()
            .map(|mut a| {
                a.parent = parent.clone();
                a.external_ids.insert(key.clone(), value.clone());
                a
            })
            .collect();
        AclSet {
            parent,
            key,
            value,
            acls,
        }
    }
    execute!();
}

/// A meter with one drop band (as `ovn-nbctl meter-add`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meter {
    /// Name.
    pub name: String,
    /// The unit of the rate.
    pub unit: MeterUnit,
    /// Band rate.
    pub rate: i64,
    /// Band burst size (0: none).
    pub burst: i64,
    /// `fair`.
    pub fair: Option<bool>,
}

impl Meter {
    /// A meter dropping above `rate` `unit`.
    pub fn new(name: impl Into<String>, unit: MeterUnit, rate: i64, burst: i64) -> Self {
        Meter {
            name: name.into(),
            unit,
            rate,
            burst,
            fair: None,
        }
    }
    execute!();
}

impl Planner<'_, '_> {
    fn find_acl(
        &self,
        parent: &CachedRow,
        direction: &AclDirection,
        priority: i64,
        m: &str,
    ) -> Option<Arc<CachedRow>> {
        parent
            .uuids(Pg::ACLS)
            .filter_map(|u| self.view.get(AclRow::TABLE, u))
            .find(|r| {
                r.get_str(AclRow::DIRECTION) == direction.as_str()
                    && int_of(r.get(AclRow::PRIORITY)) == Some(priority)
                    && r.get_str(AclRow::MATCH) == m
            })
            .cloned()
    }

    pub(super) fn acl(&mut self, a: &Acl) -> Result<(), Error> {
        let parent = self.named_row(a.parent.table(), a.parent.name())?;
        let existing = parent
            .as_ref()
            .and_then(|p| self.find_acl(p, &a.direction, a.priority, &a.match_));
        match existing {
            Some(row) => self.update_acl(&row, a),
            None => self.insert_acl(parent.as_deref(), a),
        }
        Ok(())
    }

    pub(super) fn acl_set(&mut self, s: &AclSet) -> Result<(), Error> {
        let parent = self.named_row(s.parent.table(), s.parent.name())?;
        let owned: Vec<Arc<CachedRow>> = parent
            .as_ref()
            .map(|p| {
                p.uuids(Pg::ACLS)
                    .filter_map(|u| self.view.get(AclRow::TABLE, u))
                    .filter(|r| r.map_get(AclRow::EXTERNAL_IDS, &s.key) == Some(s.value.as_str()))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let mut kept: Vec<Uuid> = Vec::new();
        for a in &s.acls {
            let same = owned.iter().find(|r| {
                !kept.contains(&r.uuid())
                    && r.get_str(AclRow::DIRECTION) == a.direction.as_str()
                    && int_of(r.get(AclRow::PRIORITY)) == Some(a.priority)
                    && r.get_str(AclRow::MATCH) == a.match_
            });
            match same {
                Some(row) => {
                    kept.push(row.uuid());
                    self.update_acl(row, a);
                }
                None => self.insert_acl(parent.as_deref(), a),
            }
        }
        if let Some(p) = parent {
            let gone = owned
                .iter()
                .map(|r| r.uuid())
                .filter(|u| !kept.contains(u))
                .collect();
            self.unlink_acls(&s.parent, p.uuid(), gone);
        }
        Ok(())
    }

    /// Inserts `a` and links it to its parent (`parent`: None if this batch creates it).
    fn insert_acl(&mut self, parent: Option<&CachedRow>, a: &Acl) {
        let n = self.named();
        let mut ins = Operation::insert(AclRow::TABLE)
            .uuid_name(&n)
            .value(AclRow::DIRECTION, &a.direction)
            .value(AclRow::PRIORITY, a.priority)
            .value(AclRow::MATCH, a.match_.as_str())
            .value(AclRow::ACTION, &a.action)
            .value(AclRow::LOG, a.log)
            .value(AclRow::NAME, opt_datum(a.name.as_deref()))
            .value(AclRow::SEVERITY, Datum::set(a.severity.as_ref()))
            .value(AclRow::METER, opt_datum(a.meter.as_deref()))
            .value(AclRow::OPTIONS, map_datum(&a.options))
            .value(AclRow::EXTERNAL_IDS, map_datum(&a.external_ids));
        if let Some(t) = a.tier {
            ins = ins.value(TIER, t);
        }
        self.push_insert(AclRow::TABLE, ins.into());
        self.txn.push(
            Self::mutate_row(a.parent.table(), parent, a.parent.name())
                .insert(Pg::ACLS, Datum::named_uuid(&n)),
        );
    }

    /// Updates the columns of ACL `row` that differ from `a`.
    fn update_acl(&mut self, row: &CachedRow, a: &Acl) {
        let mut cols: Vec<(&str, Datum)> = Vec::new();
        if row.get_str(AclRow::ACTION) != a.action.as_str() {
            cols.push((AclRow::ACTION, Datum::from(&a.action)));
        }
        if opt_str(row.get(AclRow::NAME)) != a.name.as_deref() {
            cols.push((AclRow::NAME, opt_datum(a.name.as_deref())));
        }
        let log = matches!(row.get(AclRow::LOG), Some(Datum::Atom(Atom::Boolean(true))));
        if log != a.log {
            cols.push((AclRow::LOG, Datum::from(a.log)));
        }
        if opt_str(row.get(AclRow::SEVERITY)) != a.severity.as_ref().map(AclSeverity::as_str) {
            cols.push((AclRow::SEVERITY, Datum::set(a.severity.as_ref())));
        }
        if opt_str(row.get(AclRow::METER)) != a.meter.as_deref() {
            cols.push((AclRow::METER, opt_datum(a.meter.as_deref())));
        }
        if let Some(t) = a.tier {
            if int_of(row.get(TIER)) != Some(t) {
                cols.push((TIER, Datum::from(t)));
            }
        }
        if let Some(m) = merged(row.get(AclRow::OPTIONS), &a.options) {
            cols.push((AclRow::OPTIONS, map_datum(&m)));
        }
        Self::ext_ids(&mut cols, row, &a.external_ids);
        self.update(AclRow::TABLE, row.uuid(), cols);
    }

    /// Unlinks `gone` (ACLs of `parent`) from it.
    fn unlink_acls(&mut self, parent: &AclParent, pu: Uuid, gone: Vec<Uuid>) {
        self.unlink(parent.table(), pu, Pg::ACLS, AclRow::TABLE, gone);
    }

    pub(super) fn delete_acl(
        &mut self,
        parent: &AclParent,
        direction: &AclDirection,
        priority: i64,
        match_: &str,
    ) -> Result<(), Error> {
        if let Some(p) = self.find(parent.table(), parent.name()).cloned() {
            if let Some(row) = self.find_acl(&p, direction, priority, match_) {
                self.unlink_acls(parent, p.uuid(), vec![row.uuid()]);
            }
        }
        Ok(())
    }

    pub(super) fn delete_acls_by_external_id(
        &mut self,
        parent: &AclParent,
        key: &str,
        value: &str,
    ) -> Result<(), Error> {
        if let Some(p) = self.find(parent.table(), parent.name()).cloned() {
            let gone: Vec<Uuid> = p
                .uuids(Pg::ACLS)
                .filter(|u| {
                    self.view
                        .get(AclRow::TABLE, *u)
                        .is_some_and(|r| r.map_get(AclRow::EXTERNAL_IDS, key) == Some(value))
                })
                .collect();
            self.unlink_acls(parent, p.uuid(), gone);
        }
        Ok(())
    }

    pub(super) fn meter(&mut self, m: &Meter) -> Result<(), Error> {
        match self.find(MeterRow::TABLE, &m.name).cloned() {
            Some(row) => {
                let mut cols: Vec<(&str, Datum)> = Vec::new();
                if row.get_str(MeterRow::UNIT) != m.unit.as_str() {
                    cols.push((MeterRow::UNIT, Datum::from(&m.unit)));
                }
                if let Some(f) = m.fair {
                    if !matches!(row.get(MeterRow::FAIR).map(Datum::atoms), Some([Atom::Boolean(b)]) if *b == f)
                    {
                        cols.push((MeterRow::FAIR, Datum::set([f])));
                    }
                }
                self.update(MeterRow::TABLE, row.uuid(), cols);
                let band = row
                    .uuids(MeterRow::BANDS)
                    .next()
                    .and_then(|u| self.view.get(Band::TABLE, u))
                    .cloned();
                if let Some(b) = band {
                    let mut cols: Vec<(&str, Datum)> = Vec::new();
                    if int_of(b.get(Band::RATE)) != Some(m.rate) {
                        cols.push((Band::RATE, Datum::from(m.rate)));
                    }
                    if int_of(b.get(Band::BURST_SIZE)) != Some(m.burst) {
                        cols.push((Band::BURST_SIZE, Datum::from(m.burst)));
                    }
                    self.update(Band::TABLE, b.uuid(), cols);
                }
            }
            None if self
                .new_names
                .contains_key(&(MeterRow::TABLE, m.name.clone())) => {}
            None => {
                let b = self.named();
                self.txn.push(
                    Operation::insert(Band::TABLE)
                        .uuid_name(&b)
                        .value(Band::ACTION, nb::MeterBandAction::Drop)
                        .value(Band::RATE, m.rate)
                        .value(Band::BURST_SIZE, m.burst),
                );
                let ins = Operation::insert(MeterRow::TABLE)
                    .value(MeterRow::NAME, m.name.as_str())
                    .value(MeterRow::UNIT, &m.unit)
                    .value(MeterRow::BANDS, Datum::named_uuid(&b))
                    .value(MeterRow::FAIR, Datum::set(m.fair));
                self.push_insert(MeterRow::TABLE, ins.into());
                self.new_names
                    .insert((MeterRow::TABLE, m.name.clone()), String::new());
            }
        }
        Ok(())
    }

    pub(super) fn delete_meter(&mut self, name: &str) -> Result<(), Error> {
        self.delete_named(MeterRow::TABLE, name);
        Ok(())
    }
}
