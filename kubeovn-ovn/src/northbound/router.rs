//! Logical routers, their ports, the switch <-> router patch pair, static routes and policies
//! (`lr-add`, `lrp-add`, `lr-route-add`, `lr-policy-add`).

use std::sync::Arc;

use super::{same_strings, strings_datum, Batch, Northbound, Planner};
use crate::cache::CachedRow;
use crate::datum::Datum;
use crate::error::Error;
use crate::model::Model;
use crate::models::nb;
use crate::ops::{Condition, Operation};
use crate::rowdiff::{int_of, map_datum, merged, Map};
use crate::uuid::Uuid;

pub use crate::models::nb::{LogicalRouterPolicyAction, LogicalRouterStaticRoutePolicy};

type Lr = nb::LogicalRouter;
type Lrp = nb::LogicalRouterPort;
type Route = nb::LogicalRouterStaticRoute;
type Policy = nb::LogicalRouterPolicy;

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

    /// Runs the patch pair alone, as one transaction.
    pub async fn execute<N: Northbound + ?Sized>(self, nb: &N) -> Result<(), Error> {
        let mut b = Batch::new();
        b.patch(self);
        nb.commit(b).await
    }
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
    /// `policy` (None: the server's default, dst-ip).
    pub policy: Option<LogicalRouterStaticRoutePolicy>,
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
    pub fn policy(mut self, p: LogicalRouterStaticRoutePolicy) -> Self {
        self.policy = Some(p);
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
    /// What a matching packet gets.
    pub action: LogicalRouterPolicyAction,
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
        action: LogicalRouterPolicyAction,
    ) -> Self {
        RouterPolicy {
            router: router.into(),
            priority,
            match_: match_.into(),
            action,
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

impl Planner<'_, '_> {
    pub(super) fn router(&mut self, r: &Router) -> Result<(), Error> {
        match self.find(Lr::TABLE, &r.name).cloned() {
            Some(row) => {
                let mut cols = Vec::new();
                if let Some(m) = merged(row.get(Lr::OPTIONS), &r.options) {
                    cols.push((Lr::OPTIONS, map_datum(&m)));
                }
                Self::ext_ids(&mut cols, &row, &r.external_ids);
                self.update(Lr::TABLE, row.uuid(), cols);
            }
            None if self.new_routers.contains(&r.name) => {}
            None => {
                let ins = Operation::insert(Lr::TABLE)
                    .value(Lr::NAME, r.name.as_str())
                    .value(Lr::OPTIONS, map_datum(&r.options))
                    .value(Lr::EXTERNAL_IDS, map_datum(&r.external_ids));
                self.push_insert(Lr::TABLE, ins.into());
                self.new_routers.insert(r.name.clone());
            }
        }
        Ok(())
    }

    pub(super) fn delete_router(&mut self, name: &str) -> Result<(), Error> {
        self.delete_named(Lr::TABLE, name);
        Ok(())
    }

    pub(super) fn router_port(&mut self, p: &RouterPort) -> Result<(), Error> {
        match self.find(Lrp::TABLE, &p.name).cloned() {
            Some(row) => {
                let mut cols = Vec::new();
                if row.get_str(Lrp::MAC) != p.mac {
                    cols.push((Lrp::MAC, Datum::from(p.mac.as_str())));
                }
                if !same_strings(row.get(Lrp::NETWORKS), &p.networks) {
                    cols.push((Lrp::NETWORKS, strings_datum(&p.networks)));
                }
                Self::ext_ids(&mut cols, &row, &p.external_ids);
                self.update(Lrp::TABLE, row.uuid(), cols);
            }
            None if self.new_names.contains_key(&(Lrp::TABLE, p.name.clone())) => {}
            None => {
                let new_routers = std::mem::take(&mut self.new_routers);
                let r = self.need(Lr::TABLE, &p.router, &new_routers);
                self.new_routers = new_routers;
                r?;
                let n = self.named();
                let ins = Operation::insert(Lrp::TABLE)
                    .uuid_name(&n)
                    .value(Lrp::NAME, p.name.as_str())
                    .value(Lrp::MAC, p.mac.as_str())
                    .value(Lrp::NETWORKS, strings_datum(&p.networks))
                    .value(Lrp::EXTERNAL_IDS, map_datum(&p.external_ids));
                self.push_insert(Lrp::TABLE, ins.into());
                self.txn.push(
                    Operation::mutate(Lr::TABLE)
                        .filter(Condition::eq(Lr::NAME, p.router.as_str()))
                        .insert(Lr::PORTS, Datum::named_uuid(&n)),
                );
                self.new_names.insert((Lrp::TABLE, p.name.clone()), n);
            }
        }
        Ok(())
    }

    pub(super) fn delete_router_port(&mut self, name: &str) -> Result<(), Error> {
        if let Some(row) = self.find(Lrp::TABLE, name).cloned() {
            let u = row.uuid();
            self.txn.push(
                Operation::mutate(Lr::TABLE)
                    .filter(Condition::includes(Lr::PORTS, Datum::uuid(u)))
                    .delete(Lr::PORTS, Datum::uuid(u)),
            );
            self.deletes.push((Lrp::TABLE, u));
        }
        Ok(())
    }

    /// The rows of `table` a router's `column` refers to, matching `keep`.
    fn router_rows(
        &self,
        lr: &CachedRow,
        column: &str,
        table: &str,
        keep: impl Fn(&CachedRow) -> bool,
    ) -> Vec<Arc<CachedRow>> {
        lr.uuids(column)
            .filter_map(|u| self.view.get(table, u))
            .filter(|r| keep(r))
            .cloned()
            .collect()
    }

    pub(super) fn static_route(&mut self, r: &StaticRoute) -> Result<(), Error> {
        let router = self.router_row(&r.router)?;
        let policy = r
            .policy
            .clone()
            .unwrap_or(LogicalRouterStaticRoutePolicy::DstIp);
        let found = router.as_ref().and_then(|lr| {
            self.router_rows(lr, Lr::STATIC_ROUTES, Route::TABLE, |s| {
                let have = s
                    .get(Route::POLICY)
                    .and_then(|d| d.atoms().first()?.as_str());
                s.get_str(Route::IP_PREFIX) == r.prefix
                    && s.get_str(Route::NEXTHOP) == r.nexthop
                    && s.get_str(Route::ROUTE_TABLE) == r.route_table
                    && have.unwrap_or(LogicalRouterStaticRoutePolicy::DstIp.as_str())
                        == policy.as_str()
            })
            .into_iter()
            .next()
        });
        match found {
            Some(row) => {
                let mut cols = Vec::new();
                Self::ext_ids(&mut cols, &row, &r.external_ids);
                self.update(Route::TABLE, row.uuid(), cols);
            }
            None => {
                let n = self.named();
                let mut ins = Operation::insert(Route::TABLE)
                    .uuid_name(&n)
                    .value(Route::IP_PREFIX, r.prefix.as_str())
                    .value(Route::NEXTHOP, r.nexthop.as_str())
                    .value(Route::ROUTE_TABLE, r.route_table.as_str())
                    .value(Route::EXTERNAL_IDS, map_datum(&r.external_ids));
                if let Some(p) = &r.policy {
                    ins = ins.value(Route::POLICY, Datum::set([p]));
                }
                self.push_insert(Route::TABLE, ins.into());
                self.txn.push(
                    Operation::mutate(Lr::TABLE)
                        .filter(Condition::eq(Lr::NAME, r.router.as_str()))
                        .insert(Lr::STATIC_ROUTES, Datum::named_uuid(&n)),
                );
            }
        }
        Ok(())
    }

    pub(super) fn delete_static_route(
        &mut self,
        router: &str,
        prefix: &str,
        nexthop: Option<&str>,
    ) -> Result<(), Error> {
        if let Some(lr) = self.find(Lr::TABLE, router).cloned() {
            let gone: Vec<Uuid> = self
                .router_rows(&lr, Lr::STATIC_ROUTES, Route::TABLE, |s| {
                    s.get_str(Route::IP_PREFIX) == prefix
                        && nexthop.is_none_or(|n| s.get_str(Route::NEXTHOP) == n)
                })
                .iter()
                .map(|s| s.uuid())
                .collect();
            self.unlink(Lr::TABLE, lr.uuid(), Lr::STATIC_ROUTES, Route::TABLE, gone);
        }
        Ok(())
    }

    fn find_policies(&self, lr: &CachedRow, priority: i64, m: &str) -> Vec<Arc<CachedRow>> {
        self.router_rows(lr, Lr::POLICIES, Policy::TABLE, |s| {
            int_of(s.get(Policy::PRIORITY)) == Some(priority) && s.get_str(Policy::MATCH) == m
        })
    }

    pub(super) fn policy(&mut self, p: &RouterPolicy) -> Result<(), Error> {
        let router = self.router_row(&p.router)?;
        let found = router.as_ref().and_then(|lr| {
            self.find_policies(lr, p.priority, &p.match_)
                .into_iter()
                .next()
        });
        match found {
            Some(row) => {
                let mut cols = Vec::new();
                if row.get_str(Policy::ACTION) != p.action.as_str() {
                    cols.push((Policy::ACTION, Datum::from(&p.action)));
                }
                if !same_strings(row.get(Policy::NEXTHOPS), &p.nexthops) {
                    cols.push((Policy::NEXTHOPS, strings_datum(&p.nexthops)));
                }
                Self::ext_ids(&mut cols, &row, &p.external_ids);
                self.update(Policy::TABLE, row.uuid(), cols);
            }
            None => {
                let n = self.named();
                let ins = Operation::insert(Policy::TABLE)
                    .uuid_name(&n)
                    .value(Policy::PRIORITY, p.priority)
                    .value(Policy::MATCH, p.match_.as_str())
                    .value(Policy::ACTION, &p.action)
                    .value(Policy::NEXTHOPS, strings_datum(&p.nexthops))
                    .value(Policy::EXTERNAL_IDS, map_datum(&p.external_ids));
                self.push_insert(Policy::TABLE, ins.into());
                self.txn.push(
                    Operation::mutate(Lr::TABLE)
                        .filter(Condition::eq(Lr::NAME, p.router.as_str()))
                        .insert(Lr::POLICIES, Datum::named_uuid(&n)),
                );
            }
        }
        Ok(())
    }

    pub(super) fn delete_policy(
        &mut self,
        router: &str,
        priority: i64,
        match_: &str,
    ) -> Result<(), Error> {
        if let Some(lr) = self.find(Lr::TABLE, router).cloned() {
            let gone: Vec<Uuid> = self
                .find_policies(&lr, priority, match_)
                .iter()
                .map(|s| s.uuid())
                .collect();
            self.unlink(Lr::TABLE, lr.uuid(), Lr::POLICIES, Policy::TABLE, gone);
        }
        Ok(())
    }
}
