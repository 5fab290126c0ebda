//! Services: one OVN load balancer per Service and protocol, in its VPC's load balancer group.
//!
//! Kube-OVN up to v1.15 folds every Service of a VPC into six shared load balancers attached to every switch
//! (one affinity timeout for all, flows growing with Services x switches). Here, as in ovn-kubernetes, each
//! Service owns `svc.<ns>.<name>.<proto>` ([`naming::service_lb`]) and the VPC's group
//! (`lbg.<vpc>`, [`naming::lb_group`]) holds them; the subnet kind attaches the group to each switch with
//! `enableLb` once, so a Service's change touches only its own row.
//!
//! - VIPs: every ClusterIP (both families), `externalIPs` and `status.loadBalancer.ingress` IP, times each
//!   port. Backends: the Service's EndpointSlices (label `kubernetes.io/service-name`), the slice port of the
//!   same name and protocol, per family; ready endpoints, else serving-and-terminating ones.
//! - A VIP without backends stays with an empty backend list and `options:reject=true`: clients are refused
//!   at once (TCP reset, ICMP unreachable) instead of timing out.
//! - `sessionAffinity: ClientIP`: by default `selection_fields=ip_src` (one backend per client address while
//!   the backends stay; the timeout is not applied, and an event says so), because OVN 23.03's
//!   `affinity_timeout` learn flow drops the packet that creates the affinity (a new client's first SYN or
//!   datagram is lost); with [`SessionAffinity::Timeout`] `options:affinity_timeout` with the Service's own
//!   timeout (OVN's limit is 65535 s; a longer one is clamped, with a Warning event).
//! - VPC: the VPC of the endpoints' subnets (Kube-OVN's rule for custom VPCs), else the Service's
//!   `ovn.kubernetes.io/vpc` annotation, else the VPC the load balancer is already in, else the default one.
//! - Headless and ExternalName Services get nothing.
//!
//! Every run writes the whole desired row ([`LoadBalancer::exact`]); the planner sends only what differs, so
//! an endpoint change is one `update` of one row's `vips`, and a restart with nothing changed sends nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::events::EventType;
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use kube::ResourceExt;
use kubeovn_ovn::northbound::{Batch, ChassisTemplateVars, LoadBalancerGroup};

use super::error::{ControllerError, Result};
use super::framework::{Action, Key, Kinds, ObjectStore, Reconciler, Relations, StoreWriter};
use super::plan;
use super::views::chassis_of;
use super::{Ctx, SessionAffinity};
use crate::crd::{Decoded, Subnet};
use crate::naming::{self, external_ids as ext};
pub use crate::services::{desired, endpoint, is_balanced, Desired, DesiredLb, SERVICE_NAME_LABEL};

/// The EndpointSlice store: kube-runtime's, plus an index from `(namespace, service)` to slice names, so a
/// Service finds its slices without scanning every slice of the cluster.
#[derive(Clone)]
pub(crate) struct SliceStore {
    store: reflector::Store<EndpointSlice>,
    index: Arc<RwLock<SliceIndex>>,
}

type SliceIndex = HashMap<(String, String), BTreeSet<String>>;

/// Applies watch events to a [`SliceStore`].
pub(crate) struct SliceWriter {
    writer: reflector::store::Writer<EndpointSlice>,
    store: reflector::Store<EndpointSlice>,
    index: Arc<RwLock<SliceIndex>>,
    /// The index being rebuilt by a (re-)list.
    buffer: Option<SliceIndex>,
}

/// `(namespace, service)` of a slice, if it names one.
fn owner(s: &EndpointSlice) -> Option<(String, String)> {
    let svc = s.labels().get(SERVICE_NAME_LABEL)?;
    Some((s.namespace().unwrap_or_default(), svc.clone()))
}

fn index_add(index: &mut SliceIndex, s: &EndpointSlice) {
    if let Some(o) = owner(s) {
        index.entry(o).or_default().insert(s.name_any());
    }
}

fn index_remove(index: &mut SliceIndex, s: &EndpointSlice) {
    if let Some(o) = owner(s) {
        if let Some(set) = index.get_mut(&o) {
            set.remove(&s.name_any());
            if set.is_empty() {
                index.remove(&o);
            }
        }
    }
}

impl SliceStore {
    /// An empty store and its writer.
    pub(crate) fn new() -> (SliceStore, SliceWriter) {
        let (store, writer) = reflector::store::<EndpointSlice>();
        let index = Arc::new(RwLock::new(SliceIndex::new()));
        (
            SliceStore {
                store: store.clone(),
                index: index.clone(),
            },
            SliceWriter {
                writer,
                store,
                index,
                buffer: None,
            },
        )
    }

    /// The slices of Service `namespace/name`.
    pub(crate) fn of(&self, namespace: &str, name: &str) -> Vec<Arc<EndpointSlice>> {
        let names: Vec<String> = self
            .index
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(namespace.to_owned(), name.to_owned()))
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        names
            .iter()
            .filter_map(|n| {
                self.store
                    .get(&reflector::ObjectRef::new(n).within(namespace))
            })
            .collect()
    }
}

impl ObjectStore<EndpointSlice> for SliceStore {
    fn get(&self, key: &Key<EndpointSlice>) -> Option<Arc<EndpointSlice>> {
        ObjectStore::get(&self.store, key)
    }
    fn list(&self) -> Vec<Arc<EndpointSlice>> {
        self.store.state()
    }
    fn len(&self) -> usize {
        self.store.len()
    }
    fn ready(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> {
        ObjectStore::ready(&self.store)
    }
}

impl StoreWriter<EndpointSlice> for SliceWriter {
    fn apply(&mut self, ev: &Event<EndpointSlice>) {
        match ev {
            Event::Init => self.buffer = Some(SliceIndex::new()),
            Event::InitApply(s) => {
                if let Some(b) = self.buffer.as_mut() {
                    index_add(b, s);
                }
            }
            Event::InitDone => {
                if let Some(b) = self.buffer.take() {
                    *self.index.write().unwrap_or_else(|e| e.into_inner()) = b;
                }
            }
            Event::Apply(s) => {
                let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
                // The label may have changed: the slice leaves its old Service first.
                let r = reflector::ObjectRef::from_obj(s);
                if let Some(old) = self.store.get(&r) {
                    index_remove(&mut index, &old);
                }
                index_add(&mut index, s);
            }
            Event::Delete(s) => {
                index_remove(
                    &mut self.index.write().unwrap_or_else(|e| e.into_inner()),
                    s,
                );
            }
        }
        self.writer.apply_watcher_event(ev);
    }
}

/// What the controller last programmed for a Service (for the Vpc status, metrics and events).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Programmed {
    /// The VPC whose group holds its load balancers.
    pub vpc: String,
    /// Its load balancers.
    pub lbs: Vec<String>,
    /// Backends over all VIPs.
    pub backends: usize,
    /// The warnings last reported as events (reported again only when they change).
    pub warnings: Vec<(String, String)>,
    /// The chassis template variables of its `internalTrafficPolicy: Local` load balancers.
    pub vars: BTreeSet<String>,
}

/// The Services programmed, by key, with running totals (the metrics read them on every run: summing the map
/// each time made a cold start of 10,000 Services quadratic).
#[derive(Default)]
pub(crate) struct ServiceState(RwLock<ServiceMap>);

#[derive(Default)]
struct ServiceMap {
    by_key: HashMap<Key<Service>, Programmed>,
    backends: usize,
}

impl ServiceState {
    fn get(&self, k: &Key<Service>) -> Option<Programmed> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_key
            .get(k)
            .cloned()
    }

    fn set(&self, k: &Key<Service>, p: Option<Programmed>) {
        let mut m = self.0.write().unwrap_or_else(|e| e.into_inner());
        let added = p.as_ref().map_or(0, |p| p.backends);
        let old = match p {
            Some(p) => m.by_key.insert(k.clone(), p),
            None => m.by_key.remove(k),
        };
        m.backends = m.backends + added - old.map_or(0, |o| o.backends);
    }

    /// (Services with load balancers, backends).
    fn totals(&self) -> (usize, usize) {
        let m = self.0.read().unwrap_or_else(|e| e.into_inner());
        (m.by_key.len(), m.backends)
    }
}

/// The VPC of the subnet holding each address; the one most backends are in (the default VPC wins a tie).
fn vpc_of_backends(ctx: &Ctx, ips: &BTreeSet<IpAddr>) -> (Option<String>, BTreeSet<String>, bool) {
    let subnets: Vec<(IpNetwork, String)> = ctx
        .subnet_list()
        .iter()
        .flat_map(|s| s.cidrs.iter().map(|c| (*c, s.vpc.clone())))
        .collect();
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    let mut unknown = false;
    for ip in ips {
        match subnets.iter().find(|(c, _)| c.contains(*ip)) {
            Some((_, vpc)) => *count.entry(vpc.clone()).or_default() += 1,
            None => unknown = true,
        }
    }
    let all: BTreeSet<String> = count.keys().cloned().collect();
    let best = count
        .iter()
        .max_by_key(|(v, n)| (**n, **v == ctx.config.default_vpc))
        .map(|(v, _)| v.clone());
    (best, all, unknown)
}

/// The Service kind: its load balancers. Its state: what it programmed for each Service.
#[derive(Default)]
pub(crate) struct Services {
    state: ServiceState,
}

#[async_trait::async_trait]
impl Reconciler<Ctx> for Services {
    type Object = Service;
    type Error = ControllerError;
    const NAME: &'static str = "service";

    fn workers(&self, ctx: &Ctx) -> usize {
        // Like pods: many, each run mostly waiting for the writer's next round, so as many at once as pods
        // (with 4, a cold start of 10,000 Services took 2,500 rounds of about 4 Services each).
        ctx.config.pod_workers
    }

    async fn reconcile(&self, ctx: &Arc<Ctx>, svc: Arc<Service>) -> Result<Action> {
        reconcile(ctx, &self.state, &svc).await
    }

    async fn cleanup(
        &self,
        ctx: &Arc<Ctx>,
        key: &Key<Service>,
        _: Option<Arc<Service>>,
    ) -> Result<Action> {
        remove(ctx, &self.state, key).await.map(|()| Action::Done)
    }

    /// Removes the load balancers of Services deleted while the controller was down.
    async fn at_start(&self, ctx: &Arc<Ctx>) -> Result<()> {
        remove_stale(ctx).await.map(|_| ())
    }

    fn relations(_this: &Arc<Self>, r: &mut Relations<'_, Ctx, Service>) {
        // A node coming, going or changing chassis: the Local Services write their variables for it.
        r.on::<k8s_openapi::api::core::v1::Node>(|kinds: &Kinds, old, new| {
            if old.is_some() && old.map(chassis_of) == new.map(chassis_of) {
                return Vec::new();
            }
            kinds
                .list::<Service>()
                .iter()
                .filter(|s| {
                    s.spec
                        .as_ref()
                        .and_then(|s| s.internal_traffic_policy.as_deref())
                        == Some("Local")
                })
                .map(|s| Key::of(&**s))
                .collect()
        });
        // A slice's change runs its Service (the old one too, if the label moved).
        r.on::<EndpointSlice>(|_: &Kinds, old, new| {
            let mut keys: Vec<Key<Service>> = old
                .into_iter()
                .chain(new)
                .filter_map(owner)
                .map(|(ns, name)| Key::namespaced(&ns, &name))
                .collect();
            keys.dedup();
            keys
        });
    }
}

async fn reconcile(ctx: &Ctx, st: &ServiceState, svc: &Service) -> Result<Action> {
    let key = Key::of(svc);
    let (ns, name) = (key.namespace().unwrap_or_default(), key.name());
    if svc.metadata.deletion_timestamp.is_some() || !is_balanced(svc) {
        remove(ctx, st, &key).await?;
        return Ok(Action::Done);
    }
    let started = Instant::now();
    let slices = ctx
        .kinds
        .store_as::<EndpointSlice, SliceStore>()
        .map(|s| s.of(ns, name))
        .unwrap_or_default();
    let mut d = desired(svc, &slices);
    if d.affinity_timeout.is_some() && ctx.config.session_affinity == SessionAffinity::SourceHash {
        d.warnings.push((
            "AffinityTimeoutNotApplied".into(),
            "sessionAffinity ClientIP is kept by hashing the client address (one backend per client while \
             the backends stay); timeoutSeconds is not applied (--service-session-affinity=timeout applies \
             it on OVN releases whose affinity learning passes the first packet on)"
                .into(),
        ));
    }
    let prev = st.get(&key);

    // The VPC: the endpoints' subnets, else the annotation, else where the load balancers are, else default.
    let (from_backends, vpcs, unknown) = vpc_of_backends(ctx, &d.backend_ips);
    if from_backends.is_none() && unknown && !ctx.kinds.is_idle::<Decoded<Subnet>>() {
        // Endpoints in no known subnet while subnets are still being loaded: decide once they are.
        return Ok(Action::Requeue(Duration::from_millis(200)));
    }
    if vpcs.len() > 1 {
        d.warnings.push((
            "EndpointsInSeveralVpcs".into(),
            format!(
                "endpoints are in the VPCs {}; the Service is programmed in {}",
                vpcs.iter().cloned().collect::<Vec<_>>().join(", "),
                from_backends.as_deref().unwrap_or_default()
            ),
        ));
    }
    let existing_vpc = |proto: &str| {
        ctx.nb
            .load_balancer(&naming::service_lb(ns, name, proto))
            .and_then(|lb| lb.external_ids.get(ext::VPC).cloned())
    };
    let vpc = from_backends
        .or_else(|| svc.annotations().get(crate::annotations::VPC).cloned())
        .or_else(|| prev.as_ref().map(|p| p.vpc.clone()))
        .or_else(|| {
            plan::PROTOCOLS
                .iter()
                .find_map(|p| existing_vpc(p.as_str()))
        })
        .unwrap_or_else(|| ctx.config.default_vpc.clone());
    let group = naming::lb_group(&vpc);

    let mut b = Batch::new();
    let mut lbs = Vec::new();
    // Whether NB changes: a new or deleted row, or other VIPs (for the programming-time metric).
    let mut changed = false;
    let rows = plan::service_lb_rows(key.as_str(), &vpc, &d, ctx.config.session_affinity);
    let (backends, vars) = (rows.backends, rows.vars);
    for (proto, wanted) in rows.by_protocol {
        for n in plan::lb_names(ns, name, &proto) {
            let existing = ctx.nb.load_balancer(&n);
            match wanted.iter().find(|(w, _)| *w == n) {
                Some((_, lb)) => {
                    changed |= existing.as_ref().is_none_or(|e| e.vips != lb.vips);
                    b.add(LoadBalancerGroup::new(&group));
                    b.add(lb.clone());
                    b.lb_group_add(&group, [n.as_str()]);
                    let old = existing.and_then(|e| e.external_ids.get(ext::VPC).cloned());
                    if let Some(old) = old.filter(|o| *o != vpc) {
                        b.lb_group_remove(&naming::lb_group(&old), [n.as_str()]);
                    }
                    lbs.push(n);
                }
                None if existing.is_some() => {
                    b.delete_load_balancer(&n);
                    changed = true;
                }
                None => {}
            }
        }
    }
    // Each node's chassis gets the variables (its own backends; empty: no local backend), and loses the
    // variables this Service no longer uses.
    let gone: Vec<String> = prev
        .as_ref()
        .map(|p| {
            p.vars
                .difference(&vars.keys().cloned().collect())
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    if !vars.is_empty() || !gone.is_empty() {
        for node in ctx.nodes() {
            let node_name = node.name_any();
            let chassis = chassis_of(&node);
            if !vars.is_empty() {
                let mut t = ChassisTemplateVars::new(&chassis);
                for (var, value) in &vars {
                    let v = match value {
                        plan::TemplateValue::All(v) => v.clone(),
                        plan::TemplateValue::PerNode(m) => {
                            m.get(&node_name).cloned().unwrap_or_default()
                        }
                    };
                    t = t.var(var, v);
                }
                b.add(t);
            }
            if !gone.is_empty() && ctx.nb.chassis_template_var(&chassis).is_some() {
                b.remove_template_vars(&chassis, gone.iter().cloned());
            }
        }
    }
    ctx.writer.commit(b).await?;
    if changed {
        ctx.metrics.service_programmed(started.elapsed());
    }
    let new = Programmed {
        vpc: vpc.clone(),
        lbs,
        backends,
        warnings: d.warnings.clone(),
        vars: vars.into_keys().collect(),
    };
    let prev_warnings = prev
        .as_ref()
        .map(|p| p.warnings.clone())
        .unwrap_or_default();
    for (reason, msg) in &d.warnings {
        if !prev_warnings.iter().any(|(r, m)| r == reason && m == msg) {
            ctx.event(svc, EventType::Warning, reason, msg.clone())
                .await;
        }
    }
    let empty = new.lbs.is_empty();
    // The Vpc status lists them (the views say so to the Vpc kind when they change).
    ctx.views.set_service_lbs(
        key.as_str(),
        (!empty).then(|| (new.vpc.clone(), new.lbs.clone())),
    );
    st.set(&key, (!empty).then_some(new));
    publish(ctx, st);
    Ok(Action::Done)
}

/// Deletes a Service's load balancers (the groups drop them: their references are weak).
async fn remove(ctx: &Ctx, st: &ServiceState, key: &Key<Service>) -> Result<()> {
    let (ns, name) = (key.namespace().unwrap_or_default(), key.name());
    let mut b = Batch::new();
    for proto in plan::PROTOCOLS {
        for lb in plan::lb_names(ns, name, &proto) {
            if ctx.nb.load_balancer(&lb).is_some() {
                b.delete_load_balancer(lb);
            }
        }
    }
    if let Some(p) = st.get(key).filter(|p| !p.vars.is_empty()) {
        for node in ctx.nodes() {
            let chassis = chassis_of(&node);
            if ctx.nb.chassis_template_var(&chassis).is_some() {
                b.remove_template_vars(&chassis, p.vars.iter().cloned());
            }
        }
    }
    if !b.is_empty() {
        ctx.writer.commit(b).await?;
    }
    ctx.views.set_service_lbs(key.as_str(), None);
    st.set(key, None);
    publish(ctx, st);
    Ok(())
}

fn publish(ctx: &Ctx, st: &ServiceState) {
    let (services, backends) = st.totals();
    ctx.metrics.services(services, backends);
}

/// Removes the load balancers of Services deleted while the controller was down (the informers have
/// listed; the rest is the reconcilers' work).
async fn remove_stale(ctx: &Ctx) -> Result<usize> {
    let mut b = Batch::new();
    let mut n = 0;
    for lb in ctx
        .nb
        .load_balancers_by_external_id(ext::VENDOR, naming::VENDOR)
    {
        let Some(owner) = lb.external_ids.get(ext::SERVICE) else {
            continue;
        };
        let key = match owner.split_once('/') {
            Some((ns, name)) => Key::<Service>::namespaced(ns, name),
            None => continue,
        };
        if ctx.kinds.get(&key).is_none() {
            b.delete_load_balancer(&lb.name);
            n += 1;
        }
    }
    if n > 0 {
        tracing::info!(
            load_balancers = n,
            "removing load balancers of deleted Services"
        );
        ctx.writer.commit(b).await?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::testing::Harness;
    use crate::services::fixtures::{slice, web};
    use kubeovn_ovn::northbound::Northbound;
    use serde_json::json;

    #[tokio::test]
    async fn the_slice_index_follows_label_moves_deletes_and_relists() {
        let (store, mut w) = SliceStore::new();
        let mk = |name: &str, svc: &str| slice(name, svc, "IPv4", json!([]), json!([]));
        let names = |ns: &str, svc: &str| -> Vec<String> {
            store.of(ns, svc).iter().map(|s| s.name_any()).collect()
        };
        w.apply(&Event::Init);
        w.apply(&Event::InitApply(mk("a-1", "a")));
        w.apply(&Event::InitApply(mk("a-2", "a")));
        w.apply(&Event::InitDone);
        ObjectStore::ready(&store).await.expect("ready");
        assert_eq!(names("default", "a"), ["a-1", "a-2"]);
        // a-2's label moves to Service b: it leaves a.
        w.apply(&Event::Apply(mk("a-2", "b")));
        assert_eq!(names("default", "a"), ["a-1"]);
        assert_eq!(names("default", "b"), ["a-2"]);
        assert!(names("other", "a").is_empty(), "namespaced");
        w.apply(&Event::Delete(mk("a-1", "a")));
        assert!(names("default", "a").is_empty());
        // A relist that no longer has a-2 drops it from the index.
        w.apply(&Event::Init);
        w.apply(&Event::InitApply(mk("c-1", "c")));
        w.apply(&Event::InitDone);
        assert!(names("default", "b").is_empty());
        assert_eq!(names("default", "c"), ["c-1"]);
    }

    async fn lb(h: &Harness, name: &str) -> Option<kubeovn_ovn::models::nb::LoadBalancer> {
        h.nb.load_balancer(name)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_service_gets_its_load_balancers_in_the_vpc_group_and_follows_its_slices() {
        let h = Harness::start().await;
        // The start attached the default VPC's group to the default and join switches.
        let group = h.nb.load_balancer_group("lbg.ovn-cluster").expect("group");
        for sw in ["ovn-default", "join"] {
            let ls = h.nb.switch(sw).expect("switch");
            assert!(ls.load_balancer_group.contains(&group.uuid), "{sw}");
        }
        let svc = h.create(&web(&["10.96.0.10"])).await;
        let key = Key::of(&svc);
        h.run::<Services>(key.clone()).await.expect("run");
        // No slices yet: the VIPs refuse.
        let tcp = lb(&h, "svc.default.web.tcp").await.expect("tcp lb");
        assert_eq!(tcp.vips["10.96.0.10:80"], "");
        assert_eq!(tcp.options["reject"], "true");
        assert_eq!(tcp.external_ids["service"], "default/web");
        assert_eq!(tcp.external_ids["vpc"], "ovn-cluster");
        let udp = lb(&h, "svc.default.web.udp").await.expect("udp lb");
        let group = h.nb.load_balancer_group("lbg.ovn-cluster").expect("group");
        assert!(group.load_balancer.contains(&tcp.uuid) && group.load_balancer.contains(&udp.uuid));
        assert!(lb(&h, "svc.default.web.sctp").await.is_none());

        // A slice appears: the relation queues the Service, and its run fills the backends.
        h.create(&slice(
            "web-a",
            "web",
            "IPv4",
            json!([{"name": "http", "port": 8080}]),
            json!([{"addresses": ["10.16.0.5"]}, {"addresses": ["10.16.0.6"]}]),
        ))
        .await;
        assert!(h.queued::<Service>().await.contains(&key));
        h.run::<Services>(key.clone()).await.expect("run");
        let tcp = lb(&h, "svc.default.web.tcp").await.expect("tcp lb");
        assert_eq!(tcp.vips["10.96.0.10:80"], "10.16.0.5:8080,10.16.0.6:8080");
        assert_eq!(
            h.ctx.views.lbs_of("ovn-cluster"),
            ["svc.default.web.tcp", "svc.default.web.udp"]
        );

        // Running again writes nothing.
        let before = h.nb_rows();
        h.run::<Services>(key.clone()).await.expect("run");
        assert_eq!(h.nb_rows(), before);

        // The UDP port goes: its load balancer goes with it.
        let api: kube::Api<Service> = kube::Api::namespaced(h.client.clone(), "default");
        let mut s = api.get("web").await.expect("get");
        s.spec
            .as_mut()
            .expect("spec")
            .ports
            .as_mut()
            .expect("ports")
            .truncate(1);
        let s = api
            .replace("web", &Default::default(), &s)
            .await
            .expect("replace");
        h.stored(&s).await;
        h.run::<Services>(key.clone()).await.expect("run");
        assert!(lb(&h, "svc.default.web.udp").await.is_none());

        // Deleted: its load balancers go.
        api.delete("web", &Default::default())
            .await
            .expect("delete");
        h.gone(&key).await;
        h.run::<Services>(key.clone()).await.expect("run");
        assert!(lb(&h, "svc.default.web.tcp").await.is_none());
        assert!(h.ctx.views.lbs_of("ovn-cluster").is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restart_writes_nothing_and_removes_load_balancers_of_services_deleted_meanwhile() {
        let h = Harness::start().await;
        for name in ["web", "old"] {
            let mut s = web(&[if name == "web" {
                "10.96.0.10"
            } else {
                "10.96.0.11"
            }]);
            s.metadata.name = Some(name.into());
            let s = h.create(&s).await;
            h.run::<Services>(Key::of(&s)).await.expect("run");
        }
        assert!(lb(&h, "svc.default.old.tcp").await.is_some());
        // Restart with only `web` in the API server.
        let h = h
            .restart_with(|client| async move {
                let api: kube::Api<Service> = kube::Api::namespaced(client, "default");
                api.create(&Default::default(), &web(&["10.96.0.10"]))
                    .await
                    .expect("create");
            })
            .await;
        assert!(
            lb(&h, "svc.default.old.tcp").await.is_none(),
            "stale load balancer removed at start"
        );
        assert!(lb(&h, "svc.default.old.udp").await.is_none());
        let before = h.nb_rows();
        h.run::<Services>(Key::namespaced("default", "web"))
            .await
            .expect("run");
        assert_eq!(
            h.nb_rows(),
            before,
            "an unchanged Service writes nothing after a restart"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_service_of_custom_vpc_endpoints_lives_in_that_vpc_and_its_status() {
        use crate::crd::{Subnet, Vpc, VpcSpec};
        let h = Harness::start().await;
        h.create_cluster(&Vpc::new("blue", VpcSpec::default()))
            .await;
        h.run_vpc(Key::cluster("blue")).await.expect("vpc");
        h.create_raw::<Subnet>(json!({"metadata": {"name": "blue-net"},
            "spec": {"cidrBlock": "10.70.0.0/24", "vpc": "blue"}}))
            .await;
        h.run_subnet(Key::cluster("blue-net"))
            .await
            .expect("subnet");
        let blue = h.nb.load_balancer_group("lbg.blue").expect("blue group");
        assert!(h
            .nb
            .switch("blue-net")
            .expect("switch")
            .load_balancer_group
            .contains(&blue.uuid));

        let svc = h.create(&web(&["10.96.0.10"])).await;
        h.create(&slice(
            "web-a",
            "web",
            "IPv4",
            json!([{"name": "http", "port": 8080}]),
            json!([{"addresses": ["10.70.0.5"]}]),
        ))
        .await;
        h.run::<Services>(Key::of(&svc)).await.expect("run");
        let tcp = h.nb.load_balancer("svc.default.web.tcp").expect("lb");
        assert_eq!(tcp.external_ids["vpc"], "blue");
        let blue = h.nb.load_balancer_group("lbg.blue").expect("blue group");
        assert!(blue.load_balancer.contains(&tcp.uuid));
        let default =
            h.nb.load_balancer_group("lbg.ovn-cluster")
                .expect("default group");
        assert!(
            !default.load_balancer.contains(&tcp.uuid),
            "not reachable from the default VPC"
        );

        // The Vpc status lists it.
        h.run_vpc(Key::cluster("blue")).await.expect("vpc");
        let vpc: Vpc = h.get("blue").await.expect("vpc");
        let st = vpc.status.expect("status");
        assert_eq!(st.load_balancer_group, "lbg.blue");
        assert_eq!(
            st.load_balancers,
            ["svc.default.web.tcp", "svc.default.web.udp"]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn internal_traffic_policy_local_balances_to_each_nodes_own_backends() {
        let h = Harness::start().await;
        for n in ["n1", "n2"] {
            let node: k8s_openapi::api::core::v1::Node =
                serde_json::from_value(json!({"metadata": {"name": n}})).expect("node");
            h.create_cluster(&node).await;
        }
        let mut svc = web(&["10.96.0.10", "fd00:10:96::10"]);
        let spec = svc.spec.as_mut().expect("spec");
        spec.internal_traffic_policy = Some("Local".into());
        spec.ip_family_policy = Some("RequireDualStack".into());
        spec.ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
        let svc = h.create(&svc).await;
        h.create(&slice(
            "web-a",
            "web",
            "IPv4",
            json!([{"name": "http", "port": 8080}]),
            json!([{"addresses": ["10.16.0.5"], "nodeName": "n1"},
                   {"addresses": ["10.16.0.6"], "nodeName": "n2"},
                   {"addresses": ["10.16.0.7"], "nodeName": "n2"}]),
        ))
        .await;
        h.create(&slice(
            "web-b",
            "web",
            "IPv6",
            json!([{"name": "http", "port": 8080}]),
            json!([{"addresses": ["fd00::5"], "nodeName": "n1"}]),
        ))
        .await;
        let key = Key::of(&svc);
        h.run::<Services>(key.clone()).await.expect("run");

        let v4 =
            h.nb.load_balancer("svc.default.web.tcp")
                .expect("v4 template lb");
        assert_eq!(v4.options["template"], "true");
        assert_eq!(v4.options["address-family"], "ipv4");
        let var4 = v4.vips["10.96.0.10:80"].trim_start_matches('^').to_owned();
        let v6 =
            h.nb.load_balancer("svc.default.web.tcp.v6")
                .expect("v6 template lb");
        assert_eq!(v6.options["address-family"], "ipv6");
        let (vip6, var6) = v6.vips.iter().next().expect("v6 vip");
        let ip_var = vip6
            .trim_start_matches('^')
            .trim_end_matches(":80")
            .to_owned();
        let var6 = var6.trim_start_matches('^').to_owned();
        let vars = |c: &str| h.nb.chassis_template_var(c).expect("chassis row").variables;
        assert_eq!(vars("n1")[&var4], "10.16.0.5:8080");
        assert_eq!(vars("n2")[&var4], "10.16.0.6:8080,10.16.0.7:8080");
        assert_eq!(vars("n1")[&var6], "[fd00::5]:8080");
        assert_eq!(vars("n2")[&var6], "", "no local backend on n2");
        assert_eq!(vars("n2")[&ip_var], "fd00:10:96::10");
        // Running again writes nothing.
        let before = h.nb_rows();
        h.run::<Services>(key.clone()).await.expect("run");
        assert_eq!(h.nb_rows(), before);

        // A node deleted: its chassis' variables go with it.
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(h.client.clone());
        nodes
            .delete("n2", &Default::default())
            .await
            .expect("delete node");
        h.gone(&Key::<k8s_openapi::api::core::v1::Node>::cluster("n2"))
            .await;
        h.run_node(Key::cluster("n2")).await.expect("node cleanup");
        assert!(h.nb.chassis_template_var("n2").is_none());

        // Back to Cluster: one ordinary load balancer with every backend, the variables gone.
        let api: kube::Api<Service> = kube::Api::namespaced(h.client.clone(), "default");
        let mut s = api.get("web").await.expect("get");
        s.spec.as_mut().expect("spec").internal_traffic_policy = Some("Cluster".into());
        let s = api
            .replace("web", &Default::default(), &s)
            .await
            .expect("replace");
        h.stored(&s).await;
        h.run::<Services>(key.clone()).await.expect("run");
        let lb = h.nb.load_balancer("svc.default.web.tcp").expect("lb");
        assert!(!lb.options.contains_key("template"), "{:?}", lb.options);
        assert_eq!(
            lb.vips["10.96.0.10:80"],
            "10.16.0.5:8080,10.16.0.6:8080,10.16.0.7:8080"
        );
        assert!(h.nb.load_balancer("svc.default.web.tcp.v6").is_none());
        assert!(!vars("n1").contains_key(&var4) && !vars("n1").contains_key(&ip_var));
    }
}
