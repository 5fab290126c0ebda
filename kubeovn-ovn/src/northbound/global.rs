//! DHCP options and the `NB_Global` row.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Batch, Northbound, Planner};
use crate::cache::CachedRow;
use crate::error::Error;
use crate::model::Model;
use crate::models::nb;
use crate::ops::Operation;
use crate::rowdiff::{map_datum, map_of, merged_opt, Map};

type Dhcp = nb::DhcpOptions;
type Nbg = nb::NbGlobal;

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
    execute!();
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
    execute!();
}

impl Planner<'_, '_> {
    fn dhcp_row(&self, cidr: &str, ids: &Map) -> Option<Arc<CachedRow>> {
        self.view
            .rows(Dhcp::TABLE)
            .find(|r| {
                r.get_str(Dhcp::CIDR) == cidr
                    && ids
                        .iter()
                        .all(|(k, v)| r.map_get(Dhcp::EXTERNAL_IDS, k) == Some(v.as_str()))
            })
            .cloned()
    }

    pub(super) fn dhcp_options(&mut self, d: &DhcpOptions) -> Result<(), Error> {
        match self.dhcp_row(&d.cidr, &d.external_ids) {
            Some(row) => {
                if map_of(row.get(Dhcp::OPTIONS)) != d.options {
                    self.update(
                        Dhcp::TABLE,
                        row.uuid(),
                        vec![(Dhcp::OPTIONS, map_datum(&d.options))],
                    );
                }
            }
            None => {
                let ins = Operation::insert(Dhcp::TABLE)
                    .value(Dhcp::CIDR, d.cidr.as_str())
                    .value(Dhcp::OPTIONS, map_datum(&d.options))
                    .value(Dhcp::EXTERNAL_IDS, map_datum(&d.external_ids));
                self.push_insert(Dhcp::TABLE, ins.into());
            }
        }
        Ok(())
    }

    pub(super) fn delete_dhcp_options(
        &mut self,
        cidr: &str,
        external_ids: &Map,
    ) -> Result<(), Error> {
        if let Some(row) = self.dhcp_row(cidr, external_ids) {
            self.txn
                .push(Operation::delete(Dhcp::TABLE).uuid(row.uuid()));
            self.deletes.push((Dhcp::TABLE, row.uuid()));
        }
        Ok(())
    }

    pub(super) fn nb_global(&mut self, g: &NbGlobal) -> Result<(), Error> {
        match self.view.rows(Nbg::TABLE).next().cloned() {
            Some(row) => {
                let mut cols = Vec::new();
                if let Some(m) = merged_opt(row.get(Nbg::OPTIONS), &g.options) {
                    cols.push((Nbg::OPTIONS, map_datum(&m)));
                }
                if let Some(m) = merged_opt(row.get(Nbg::EXTERNAL_IDS), &g.external_ids) {
                    cols.push((Nbg::EXTERNAL_IDS, map_datum(&m)));
                }
                self.update(Nbg::TABLE, row.uuid(), cols);
            }
            None => {
                let set = |m: &BTreeMap<String, Option<String>>| -> Map {
                    m.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
                        .collect()
                };
                let ins = Operation::insert(Nbg::TABLE)
                    .value(Nbg::OPTIONS, map_datum(&set(&g.options)))
                    .value(Nbg::EXTERNAL_IDS, map_datum(&set(&g.external_ids)));
                self.push_insert(Nbg::TABLE, ins.into());
            }
        }
        Ok(())
    }
}
