//! Chassis template variables (`Chassis_Template_Var`): one row per chassis, whose `variables` give each
//! `^NAME` token its value on that chassis. Load balancers with `options:template=true` use them to balance a
//! VIP to different backends on each chassis, which is how Kubernetes' `internalTrafficPolicy: Local` is
//! enforced on a switch that spans every node.
//!
//! What OVN 23.03 (NB schema 7.0.0) does, found by experiment with ovn-northd, ovn-controller and the
//! userspace datapath (`bins/kube-ovn-sandbox/tests/template_lb_root.rs` shows the datapath part on one and on
//! two chassis):
//! - A template load balancer may keep a literal IPv4 VIP (`"10.96.0.10:80"`) with template backends
//!   (`"^VAR"`); its port is written after the VIP as usual. ovn-northd puts the literal VIP in the match and
//!   `ct_lb_mark(backends=^VAR)` in the action; ovn-controller expands the action per chassis.
//! - Backends: one variable holding the whole list (`VAR = "10.16.0.5:8080,10.16.0.6:8080"`) works, and so
//!   does `^A:8080,^B:8080`; but if any variable a VIP refers to is undefined on a chassis, the whole VIP is
//!   dropped there, so one variable per VIP holding the chassis' local backends is the form to use.
//! - A literal IPv6 VIP (`"[fd00::10]:80"`) is refused by ovn-northd ("should be a template of the form
//!   `^vip_variable[:^port_variable|:port]`"), with or without `options:address-family=ipv6`. The VIP must
//!   then be a variable too (`"^VIP6:80"`, with `VIP6 = "fd00::10"` on every chassis) and the load balancer
//!   needs `options:address-family=ipv6`; backends are written `[ip]:port`. `address-family` is one per load
//!   balancer, so a dual-stack Service needs one template load balancer per family; set it on IPv4 ones too.
//! - Variable names are OVN identifiers: letters, digits (not first), `_` and `.`; a `-` or `/` makes
//!   ovn-controller read the token as an address and fail ([`template_var_name`] escapes any string into one).
//! - An empty variable turns the VIP's flow on that chassis into a conntrack pass without translation; an
//!   undefined one makes ovn-controller fail to parse the action ("bad IP address") and leave the flow out.
//!   Either way the packet is not translated and goes on to the VIP address itself: dropped where nothing
//!   routes the service CIDR, as kube-proxy drops for a Local Service without local endpoints (a `discard`
//!   static route for the service CIDR on the router would make that explicit; not tried here).
//!   `options:reject=true` cannot refuse it: ovn-northd only rejects VIPs whose backends are empty in NB.
//! - `options:affinity_timeout` (sessionAffinity ClientIP) does not work on template load balancers: ovn-northd
//!   writes its affinity flows for the variable as if it were one IPv6 backend, ovn-controller cannot parse
//!   them, and connections are spread over the backends.
//! - Template and ordinary load balancers can share one `Load_Balancer_Group` attached to a switch; both work.
//!   Hairpin (a backend reaching itself through the VIP) works.
//! - Clearing a variable, or every variable of a chassis, is safe. Deleting the row of a chassis whose
//!   ovn-controller runs is not: ovn-controller 23.03.1 keeps the old flows (the VIP still reaches the old
//!   backends), and when a row for that chassis is created again it aborts ("assertion
//!   smap_count(local_templates) == 0 failed in template_vars_update()"). Delete a chassis' row only once the
//!   chassis is gone ([`Op::DeleteChassisTemplateVars`]); otherwise remove its variables.

use super::{Batch, Northbound, Op, Planner};
use crate::datum::Datum;
use crate::error::Error;
use crate::model::Model;
use crate::models::nb;
use crate::ops::{Condition, Operation};
use crate::rowdiff::{map_datum, Map};

type Ctv = nb::ChassisTemplateVar;

/// Variables of one chassis (`chassis` = the chassis name, the node's `external_ids:system-id`), merged into
/// its `Chassis_Template_Var` row, which is created if absent; other variables of the row are kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChassisTemplateVars {
    /// Chassis name.
    pub chassis: String,
    /// Variables to set (name to value; an empty value is kept as empty, see the module doc).
    pub variables: Map,
    /// `external_ids` (merged).
    pub external_ids: Map,
}

impl ChassisTemplateVars {
    /// The variables of chassis `chassis`.
    pub fn new(chassis: impl Into<String>) -> Self {
        ChassisTemplateVars {
            chassis: chassis.into(),
            ..Default::default()
        }
    }
    /// Sets one variable.
    pub fn var(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.variables.insert(name.into(), value.into());
        self
    }
    ext_ids!();
    execute!();
}

impl From<ChassisTemplateVars> for Op {
    fn from(v: ChassisTemplateVars) -> Op {
        Op::ChassisTemplateVars(v)
    }
}

impl Batch {
    /// Removes variables (by name) from a chassis' row; names it does not have are ignored.
    pub fn remove_template_vars<I: IntoIterator<Item = S>, S: Into<String>>(
        &mut self,
        chassis: &str,
        names: I,
    ) -> &mut Self {
        self.add(Op::RemoveTemplateVars {
            chassis: chassis.to_owned(),
            names: names.into_iter().map(Into::into).collect(),
        })
    }
    /// Deletes a chassis' row: only for a chassis that is gone (see the module doc).
    pub fn delete_chassis_template_vars(&mut self, chassis: impl Into<String>) -> &mut Self {
        self.add(Op::DeleteChassisTemplateVars(chassis.into()))
    }
}

/// `name` as a template variable name OVN accepts, one to one: ASCII letters, digits (not first) and `.` are
/// kept, `_` becomes `__`, and any other byte `_` and two lowercase hex digits (`svc.kube-system.dns` ->
/// `svc.kube_2dsystem.dns`). Refer to it as `^` followed by the name.
pub fn template_var_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 8);
    for (i, b) in name.bytes().enumerate() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'.' => out.push(char::from(b)),
            b'0'..=b'9' if i > 0 => out.push(char::from(b)),
            b'_' => out.push_str("__"),
            _ => out.push_str(&format!("_{b:02x}")),
        }
    }
    out
}

impl Planner<'_, '_> {
    /// The chassis' row: from the replica (Some(uuid)), this batch's insert (Ok(None)), or absent (Err).
    fn template_row(&self, chassis: &str) -> Result<Option<crate::uuid::Uuid>, ()> {
        if let Some(r) = self.view.lookup(Ctv::TABLE, Ctv::CHASSIS, chassis) {
            return Ok(Some(r.uuid()));
        }
        if self
            .new_names
            .contains_key(&(Ctv::TABLE, chassis.to_owned()))
        {
            return Ok(None);
        }
        Err(())
    }

    /// A mutation of the chassis' row, by UUID or (inserted by this batch) by its chassis.
    fn template_mutate(uuid: Option<crate::uuid::Uuid>, chassis: &str) -> crate::ops::Mutate {
        match uuid {
            Some(u) => Operation::mutate(Ctv::TABLE).uuid(u),
            None => Operation::mutate(Ctv::TABLE).filter(Condition::eq(Ctv::CHASSIS, chassis)),
        }
    }

    pub(super) fn chassis_template_vars(&mut self, v: &ChassisTemplateVars) -> Result<(), Error> {
        let Ok(uuid) = self.template_row(&v.chassis) else {
            let n = self.named();
            let ins = Operation::insert(Ctv::TABLE)
                .uuid_name(&n)
                .value(Ctv::CHASSIS, v.chassis.as_str())
                .value(Ctv::VARIABLES, map_datum(&v.variables))
                .value(Ctv::EXTERNAL_IDS, map_datum(&v.external_ids));
            self.push_insert(Ctv::TABLE, ins.into());
            self.new_names.insert((Ctv::TABLE, v.chassis.clone()), n);
            return Ok(());
        };
        let row = uuid.and_then(|u| self.view.get(Ctv::TABLE, u).cloned());
        // Only the variables that differ, as mutations: a chassis may hold thousands, and an endpoint change
        // touches one.
        let changed: Map = v
            .variables
            .iter()
            .filter(|(k, val)| {
                row.as_ref()
                    .is_none_or(|r| r.map_get(Ctv::VARIABLES, k) != Some(val.as_str()))
            })
            .map(|(k, val)| (k.clone(), val.clone()))
            .collect();
        if !changed.is_empty() {
            // Map "insert" keeps a present key's value: delete the keys first (in the same operation).
            let keys: Vec<&str> = changed
                .keys()
                .filter(|k| {
                    row.as_ref()
                        .is_none_or(|r| r.map_get(Ctv::VARIABLES, k).is_some())
                })
                .map(String::as_str)
                .collect();
            let mut m = Self::template_mutate(uuid, &v.chassis);
            if !keys.is_empty() {
                m = m.delete(Ctv::VARIABLES, Datum::set(keys));
            }
            self.txn.push(m.insert(Ctv::VARIABLES, map_datum(&changed)));
        }
        if !v.external_ids.is_empty() {
            match &row {
                Some(r) => {
                    let mut cols = Vec::new();
                    Self::ext_ids(&mut cols, r, &v.external_ids);
                    self.update(Ctv::TABLE, r.uuid(), cols);
                }
                None => {
                    let keys: Vec<&str> = v.external_ids.keys().map(String::as_str).collect();
                    self.txn.push(
                        Self::template_mutate(None, &v.chassis)
                            .delete(Ctv::EXTERNAL_IDS, Datum::set(keys))
                            .insert(Ctv::EXTERNAL_IDS, map_datum(&v.external_ids)),
                    );
                }
            }
        }
        Ok(())
    }

    pub(super) fn remove_template_vars(
        &mut self,
        chassis: &str,
        names: &[String],
    ) -> Result<(), Error> {
        let Ok(uuid) = self.template_row(chassis) else {
            return Ok(());
        };
        let row = uuid.and_then(|u| self.view.get(Ctv::TABLE, u).cloned());
        let gone: Vec<&str> = names
            .iter()
            .filter(|n| {
                row.as_ref()
                    .is_none_or(|r| r.map_get(Ctv::VARIABLES, n).is_some())
            })
            .map(String::as_str)
            .collect();
        if !gone.is_empty() {
            self.txn.push(
                Self::template_mutate(uuid, chassis).delete(Ctv::VARIABLES, Datum::set(gone)),
            );
        }
        Ok(())
    }

    pub(super) fn delete_chassis_template_vars(&mut self, chassis: &str) -> Result<(), Error> {
        if let Some(row) = self.view.lookup(Ctv::TABLE, Ctv::CHASSIS, chassis).cloned() {
            self.txn
                .push(Operation::delete(Ctv::TABLE).uuid(row.uuid()));
            self.deletes.push((Ctv::TABLE, row.uuid()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::template_var_name;

    #[test]
    fn var_names_are_identifiers_and_one_to_one() {
        let names = [
            "svc.kube-system.kube-dns.udp.53",
            "svc.kube_system.kube.dns.udp.53",
            "svc.kube_2dsystem.kube-dns.udp.53",
            "9lives",
            "_9lives",
            "a/b:c",
            "é",
            "",
        ];
        let out: Vec<String> = names.iter().map(|n| template_var_name(n)).collect();
        assert_eq!(out[0], "svc.kube_2dsystem.kube_2ddns.udp.53");
        assert_eq!(out[3], "_39lives");
        for o in &out {
            let mut cs = o.chars();
            if let Some(c) = cs.next() {
                assert!(c.is_ascii_alphabetic() || c == '_' || c == '.', "{o}");
            }
            assert!(
                cs.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.'),
                "{o}"
            );
        }
        let mut uniq = out.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), out.len(), "{out:?}");
    }
}
