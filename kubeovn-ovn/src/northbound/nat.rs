//! NAT rules of routers (`lr-nat-add`).

use std::sync::Arc;

use super::{opt_datum, opt_str, Batch, Northbound, Planner};
use crate::cache::CachedRow;
use crate::datum::Datum;
use crate::error::Error;
use crate::model::Model;
use crate::models::nb;
use crate::ops::Operation;
use crate::rowdiff::{map_datum, merged, Map};
use crate::uuid::Uuid;

pub use crate::models::nb::NatType;

type NatRow = nb::Nat;
type Lr = nb::LogicalRouter;

/// A NAT rule of a router, identified by type and logical IP (snat) or external IP (dnat, dnat_and_snat), as
/// `ovn-nbctl lr-nat-add` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nat {
    /// Router.
    pub router: String,
    /// Type.
    pub nat_type: NatType,
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
        nat_type: NatType,
        external_ip: impl Into<String>,
        logical_ip: impl Into<String>,
    ) -> Self {
        Nat {
            router: router.into(),
            nat_type,
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
    ext_ids!();
    execute!();
    /// The identifying IP: the logical IP for snat, the external IP otherwise.
    pub fn key_ip(&self) -> &str {
        if self.nat_type == NatType::Snat {
            &self.logical_ip
        } else {
            &self.external_ip
        }
    }
}

impl Planner<'_, '_> {
    /// The NAT rules of `router` of this type whose identifying IP is `ip`.
    fn find_nats(&self, router: &CachedRow, nat_type: &NatType, ip: &str) -> Vec<Arc<CachedRow>> {
        let key = if *nat_type == NatType::Snat {
            NatRow::LOGICAL_IP
        } else {
            NatRow::EXTERNAL_IP
        };
        router
            .uuids(Lr::NAT)
            .filter_map(|u| self.view.get(NatRow::TABLE, u))
            .filter(|r| r.get_str(NatRow::TYPE) == nat_type.as_str() && r.get_str(key) == ip)
            .cloned()
            .collect()
    }

    pub(super) fn nat(&mut self, n: &Nat) -> Result<(), Error> {
        let router = self.named_row(Lr::TABLE, &n.router)?;
        let existing = router.as_ref().and_then(|r| {
            self.find_nats(r, &n.nat_type, n.key_ip())
                .into_iter()
                .next()
        });
        let Some(row) = existing else {
            let u = self.named();
            let ins = Operation::insert(NatRow::TABLE)
                .uuid_name(&u)
                .value(NatRow::TYPE, &n.nat_type)
                .value(NatRow::EXTERNAL_IP, n.external_ip.as_str())
                .value(NatRow::LOGICAL_IP, n.logical_ip.as_str())
                .value(NatRow::LOGICAL_PORT, opt_datum(n.logical_port.as_deref()))
                .value(NatRow::EXTERNAL_MAC, opt_datum(n.external_mac.as_deref()))
                .value(NatRow::OPTIONS, map_datum(&n.options))
                .value(NatRow::EXTERNAL_IDS, map_datum(&n.external_ids));
            self.push_insert(NatRow::TABLE, ins.into());
            self.txn.push(
                Self::mutate_row(Lr::TABLE, router.as_deref(), &n.router)
                    .insert(Lr::NAT, Datum::named_uuid(&u)),
            );
            return Ok(());
        };
        let mut cols: Vec<(&str, Datum)> = Vec::new();
        if row.get_str(NatRow::EXTERNAL_IP) != n.external_ip {
            cols.push((NatRow::EXTERNAL_IP, Datum::from(n.external_ip.as_str())));
        }
        if row.get_str(NatRow::LOGICAL_IP) != n.logical_ip {
            cols.push((NatRow::LOGICAL_IP, Datum::from(n.logical_ip.as_str())));
        }
        if opt_str(row.get(NatRow::LOGICAL_PORT)) != n.logical_port.as_deref() {
            cols.push((NatRow::LOGICAL_PORT, opt_datum(n.logical_port.as_deref())));
        }
        if opt_str(row.get(NatRow::EXTERNAL_MAC)) != n.external_mac.as_deref() {
            cols.push((NatRow::EXTERNAL_MAC, opt_datum(n.external_mac.as_deref())));
        }
        if let Some(m) = merged(row.get(NatRow::OPTIONS), &n.options) {
            cols.push((NatRow::OPTIONS, map_datum(&m)));
        }
        Self::ext_ids(&mut cols, &row, &n.external_ids);
        self.update(NatRow::TABLE, row.uuid(), cols);
        Ok(())
    }

    pub(super) fn delete_nat(
        &mut self,
        router: &str,
        nat_type: &NatType,
        ip: &str,
    ) -> Result<(), Error> {
        if let Some(r) = self.find(Lr::TABLE, router).cloned() {
            let gone: Vec<Uuid> = self
                .find_nats(&r, nat_type, ip)
                .iter()
                .map(|x| x.uuid())
                .collect();
            self.unlink(Lr::TABLE, r.uuid(), Lr::NAT, NatRow::TABLE, gone);
        }
        Ok(())
    }
}
