//! Load balancers, their VIPs, and their attachment to switches and routers (`lb-add`, `ls-lb-add`,
//! `lr-lb-add`), directly or through load balancer groups (`Load_Balancer_Group`): a switch or router holds a
//! group once, and northd works per group instead of per load balancer and datapath.

use std::collections::BTreeMap;

use super::{same_strings, strings_datum, Batch, NbError, Northbound, Planner};
use crate::datum::{Atom, Datum};
use crate::error::Error;
use crate::model::Model;
use crate::models::nb;
use crate::ops::Condition;
use crate::ops::Operation;
use crate::rowdiff::{map_datum, map_of, merged, merged_opt, Map};
use crate::uuid::Uuid;

pub use crate::models::nb::{LoadBalancerProtocol, LoadBalancerSelectionFields};

type Lb = nb::LoadBalancer;
type Lbg = nb::LoadBalancerGroup;
type Ls = nb::LogicalSwitch;
type Lr = nb::LogicalRouter;

/// A load balancer; `vips` and `options` are merged into the existing ones (see [`super::Op::LbRemoveVip`]),
/// or replace them with [`LoadBalancer::exact`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadBalancer {
    /// Name.
    pub name: String,
    /// Protocol (None: the server's default, tcp).
    pub protocol: Option<LoadBalancerProtocol>,
    /// VIP (`IP:PORT` or `IP`) to backends (`IP:PORT,IP:PORT`).
    pub vips: Map,
    /// `options` (merged).
    pub options: Map,
    /// `external_ids` (merged).
    pub external_ids: Map,
    /// `selection_fields`: what the backend choice hashes (None: left as it is; empty: the server's default,
    /// the 5-tuple).
    pub selection_fields: Option<Vec<LoadBalancerSelectionFields>>,
    /// `vips` and `options` become exactly these (keys not listed are removed).
    pub exact: bool,
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
    pub fn protocol(mut self, p: LoadBalancerProtocol) -> Self {
        self.protocol = Some(p);
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
    /// Sets `selection_fields` (e.g. `[IpSrc]`: one backend per client address while the backends stay).
    pub fn selection_fields(mut self, f: Vec<LoadBalancerSelectionFields>) -> Self {
        self.selection_fields = Some(f);
        self
    }
    /// Makes `vips` and `options` exactly these: what the row has beyond them is removed (in the same
    /// update, so a changed backend list is one small write).
    pub fn exact(mut self) -> Self {
        self.exact = true;
        self
    }
    ext_ids!();
    execute!();
}

/// A load balancer group (`Load_Balancer_Group`); members are added with [`super::Batch::lb_group_add`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadBalancerGroup {
    /// Name.
    pub name: String,
}

impl LoadBalancerGroup {
    /// A group named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        LoadBalancerGroup { name: name.into() }
    }
    execute!();
}

/// Where a load balancer is attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LbTarget {
    /// A logical switch, by name.
    Switch(String),
    /// A logical router, by name.
    Router(String),
}

impl Planner<'_, '_> {
    pub(super) fn load_balancer(&mut self, lb: &LoadBalancer) -> Result<(), Error> {
        match self.find(Lb::TABLE, &lb.name).cloned() {
            Some(row) => {
                let mut cols: Vec<(&str, Datum)> = Vec::new();
                let vips: BTreeMap<String, Option<String>> = lb
                    .vips
                    .iter()
                    .map(|(k, v)| (k.clone(), Some(v.clone())))
                    .collect();
                if lb.exact {
                    if map_of(row.get(Lb::VIPS)) != lb.vips {
                        cols.push((Lb::VIPS, map_datum(&lb.vips)));
                    }
                } else if let Some(m) = merged_opt(row.get(Lb::VIPS), &vips) {
                    cols.push((Lb::VIPS, map_datum(&m)));
                }
                if let Some(p) = &lb.protocol {
                    let have = row.get_str(Lb::PROTOCOL);
                    let have = if have.is_empty() {
                        LoadBalancerProtocol::Tcp.as_str()
                    } else {
                        have
                    };
                    if have != p.as_str() {
                        cols.push((Lb::PROTOCOL, Datum::set([p])));
                    }
                }
                if lb.exact {
                    if map_of(row.get(Lb::OPTIONS)) != lb.options {
                        cols.push((Lb::OPTIONS, map_datum(&lb.options)));
                    }
                } else if let Some(m) = merged(row.get(Lb::OPTIONS), &lb.options) {
                    cols.push((Lb::OPTIONS, map_datum(&m)));
                }
                if let Some(f) = &lb.selection_fields {
                    let want: Vec<String> = f.iter().map(|x| x.as_str().to_owned()).collect();
                    if !same_strings(row.get(Lb::SELECTION_FIELDS), &want) {
                        cols.push((Lb::SELECTION_FIELDS, strings_datum(&want)));
                    }
                }
                Self::ext_ids(&mut cols, &row, &lb.external_ids);
                self.update(Lb::TABLE, row.uuid(), cols);
            }
            None if self.new_names.contains_key(&(Lb::TABLE, lb.name.clone())) => {}
            None => {
                let n = self.named();
                let ins = Operation::insert(Lb::TABLE)
                    .uuid_name(&n)
                    .value(Lb::NAME, lb.name.as_str())
                    .value(Lb::VIPS, map_datum(&lb.vips))
                    .value(Lb::PROTOCOL, Datum::set(lb.protocol.as_ref()))
                    .value(Lb::OPTIONS, map_datum(&lb.options))
                    .value(
                        Lb::SELECTION_FIELDS,
                        Datum::set(lb.selection_fields.iter().flatten()),
                    )
                    .value(Lb::EXTERNAL_IDS, map_datum(&lb.external_ids));
                self.push_insert(Lb::TABLE, ins.into());
                self.new_names.insert((Lb::TABLE, lb.name.clone()), n);
            }
        }
        Ok(())
    }

    pub(super) fn delete_load_balancer(&mut self, name: &str) -> Result<(), Error> {
        self.delete_named(Lb::TABLE, name);
        Ok(())
    }

    pub(super) fn lb_remove_vip(&mut self, lb: &str, vip: &str) -> Result<(), Error> {
        if let Some(row) = self.find(Lb::TABLE, lb).cloned() {
            if row.map_get(Lb::VIPS, vip).is_some() {
                self.txn.push(
                    Operation::mutate(Lb::TABLE)
                        .uuid(row.uuid())
                        .delete(Lb::VIPS, Datum::set([vip])),
                );
            }
        }
        Ok(())
    }

    /// A named row as a reference: its UUID, or the uuid-name this batch inserts it under.
    fn row_ref(&self, table: &'static str, name: &str) -> Option<Atom> {
        match (
            self.find(table, name),
            self.new_names.get(&(table, name.to_owned())),
        ) {
            (Some(r), _) => Some(Atom::Uuid(r.uuid())),
            (None, Some(n)) if !n.is_empty() => Some(Atom::NamedUuid(n.clone())),
            _ => None,
        }
    }

    /// The load balancer as a reference (see [`Self::row_ref`]).
    pub(super) fn lb_ref(&self, lb: &str) -> Option<Atom> {
        self.row_ref(Lb::TABLE, lb)
    }

    /// Adds (or removes) the row `name` of `table` to (from) `column` of a switch or router: a load
    /// balancer to `load_balancer`, a group to `load_balancer_group` (switches and routers name both alike).
    fn attach_to(
        &mut self,
        table: &'static str,
        name: &str,
        column: &str,
        target: &LbTarget,
        attach: bool,
    ) -> Result<(), Error> {
        let (t_table, t_name) = match target {
            LbTarget::Switch(n) => (Ls::TABLE, n),
            LbTarget::Router(n) => (Lr::TABLE, n),
        };
        let r = match self.row_ref(table, name) {
            Some(r) => r,
            None if !attach => return Ok(()),
            None => {
                return Err(NbError::NotFound {
                    table,
                    name: name.to_owned(),
                }
                .into())
            }
        };
        let t = match self.named_row(t_table, t_name) {
            Ok(t) => t,
            Err(_) if !attach => return Ok(()),
            Err(e) => return Err(e),
        };
        let has = match (&r, &t) {
            (Atom::Uuid(u), Some(t)) => t.uuids(column).any(|x| x == *u),
            _ => false,
        };
        if attach != has {
            let m = Self::mutate_row(t_table, t.as_deref(), t_name);
            self.txn.push(if attach {
                m.insert(column, Datum::Set(vec![r]))
            } else {
                m.delete(column, Datum::Set(vec![r]))
            });
        }
        Ok(())
    }

    pub(super) fn lb_attach(
        &mut self,
        lb: &str,
        target: &LbTarget,
        attach: bool,
    ) -> Result<(), Error> {
        self.attach_to(Lb::TABLE, lb, Ls::LOAD_BALANCER, target, attach)
    }

    pub(super) fn load_balancer_group(&mut self, g: &LoadBalancerGroup) -> Result<(), Error> {
        if self.find(Lbg::TABLE, &g.name).is_some()
            || self.new_names.contains_key(&(Lbg::TABLE, g.name.clone()))
        {
            return Ok(());
        }
        let n = self.named();
        let ins = Operation::insert(Lbg::TABLE)
            .uuid_name(&n)
            .value(Lbg::NAME, g.name.as_str());
        self.push_insert(Lbg::TABLE, ins.into());
        self.new_names.insert((Lbg::TABLE, g.name.clone()), n);
        Ok(())
    }

    /// Deletes a group after removing it from every switch and router that holds it (their references are
    /// strong: the server refuses to delete a referenced group).
    pub(super) fn delete_load_balancer_group(&mut self, name: &str) -> Result<(), Error> {
        let Some(row) = self.find(Lbg::TABLE, name).cloned() else {
            return Ok(());
        };
        let u = row.uuid();
        for table in [Ls::TABLE, Lr::TABLE] {
            let holders: Vec<Uuid> = self
                .view
                .rows(table)
                .filter(|r| r.uuids(Ls::LOAD_BALANCER_GROUP).any(|x| x == u))
                .map(|r| r.uuid())
                .collect();
            for h in holders {
                self.txn.push(
                    Operation::mutate(table)
                        .uuid(h)
                        .delete(Ls::LOAD_BALANCER_GROUP, Datum::set([u])),
                );
            }
        }
        self.delete_named(Lbg::TABLE, name);
        Ok(())
    }

    /// Adds (or removes) load balancers, by name, to (from) a group.
    pub(super) fn lb_group_members(
        &mut self,
        group: &str,
        lbs: &[String],
        add: bool,
    ) -> Result<(), Error> {
        let row = match self.named_row(Lbg::TABLE, group) {
            Ok(r) => r,
            Err(_) if !add => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut atoms = Vec::new();
        for name in lbs {
            match self.lb_ref(name) {
                Some(Atom::Uuid(u)) => {
                    let has = row
                        .as_ref()
                        .is_some_and(|r| r.uuids(Lbg::LOAD_BALANCER).any(|x| x == u));
                    if has != add {
                        atoms.push(Atom::Uuid(u));
                    }
                }
                Some(a) if add => atoms.push(a),
                Some(_) => {}
                None if add => {
                    return Err(NbError::NotFound {
                        table: Lb::TABLE,
                        name: name.clone(),
                    }
                    .into())
                }
                None => {}
            }
        }
        if atoms.is_empty() {
            return Ok(());
        }
        let m = match &row {
            Some(r) => Operation::mutate(Lbg::TABLE).uuid(r.uuid()),
            None => Operation::mutate(Lbg::TABLE).filter(Condition::eq(Lbg::NAME, group)),
        };
        self.txn.push(if add {
            m.insert(Lbg::LOAD_BALANCER, Datum::Set(atoms))
        } else {
            m.delete(Lbg::LOAD_BALANCER, Datum::Set(atoms))
        });
        Ok(())
    }

    /// Attaches (or detaches) a group to a switch or router.
    pub(super) fn lb_group_attach(
        &mut self,
        group: &str,
        target: &LbTarget,
        attach: bool,
    ) -> Result<(), Error> {
        self.attach_to(Lbg::TABLE, group, Ls::LOAD_BALANCER_GROUP, target, attach)
    }
}
