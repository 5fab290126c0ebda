//! Pods: addresses, the logical switch port, the IP record and one annotation patch; release on delete.
//!
//! A pod whose subnet is full, missing or refused waits in the kind's own [`Waiting`] and is queued again by
//! its relations as soon as an address is released in that subnet ([`AddressesFreed`]) or the subnet is
//! loaded or changed ([`SubnetChanged`]); the queue's backoff retries it too, should a signal go unnoticed.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::ResourceExt;
use kubeovn_ipam::{Addresses, AllocRequest, IpamError};

use super::api::{self, IpRecord};
use super::error::{ControllerError, Result};
use super::framework::{Action, Key, Kinds, Reconciler, Relations, Watch};
use super::plan::{self, PodPort};
use super::views::{AddressesFreed, SubnetChanged};
use super::{Ctx, PodInfo as Pod};
use crate::annotations::{
    self, merge_patch, IpPoolRequest, PodNetworkAnnotations, DEFAULT_PROVIDER,
};
use crate::naming;

/// Pods waiting for an address, by subnet: the pod kind's own state, read by its relations.
#[derive(Debug, Default)]
pub(crate) struct Waiting(Mutex<HashMap<String, HashSet<Key<Pod>>>>);

impl Waiting {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashSet<Key<Pod>>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds pod `key` to the waiters of `subnet`; true if it was not waiting there yet.
    fn add(&self, subnet: &str, key: &Key<Pod>) -> bool {
        self.lock()
            .entry(subnet.to_owned())
            .or_default()
            .insert(key.clone())
    }

    /// Removes pod `key` from the waiters of `subnet` (or of every subnet).
    fn remove(&self, subnet: Option<&str>, key: &Key<Pod>) {
        self.lock().retain(|s, keys| {
            if subnet.is_none_or(|x| x == s) {
                keys.remove(key);
            }
            !keys.is_empty()
        });
    }

    /// The waiters of `subnet` (`namespace/name`, tests). They stay registered until served or deleted, so
    /// a waiter that fails again is not warned about again.
    #[cfg(test)]
    pub(crate) fn of(&self, subnet: &str) -> Vec<String> {
        self.keys(subnet)
            .iter()
            .map(|k| k.as_str().to_owned())
            .collect()
    }

    /// The keys of the pods waiting in `subnet`.
    fn keys(&self, subnet: &str) -> Vec<Key<Pod>> {
        let keys: Vec<Key<Pod>> = self
            .lock()
            .get(subnet)
            .map(|k| k.iter().cloned().collect())
            .unwrap_or_default();
        if !keys.is_empty() {
            tracing::debug!(subnet, pods = keys.len(), "waiting pods queued");
        }
        keys
    }
}

/// The pod kind: addresses, port and annotation for each pod; release when it is gone. Its state: the pods
/// waiting for an address.
#[derive(Debug)]
pub(crate) struct Pods {
    workers: usize,
    /// Pods waiting for an address (a full subnet, one not loaded, a static address held by another).
    pub(crate) waiting: Arc<Waiting>,
}

impl Pods {
    /// The kind, with `workers` handlers at once.
    pub fn new(workers: usize) -> Self {
        Pods {
            workers,
            waiting: Arc::default(),
        }
    }
}

#[async_trait::async_trait]
impl Reconciler<Ctx> for Pods {
    type Object = Pod;
    type Error = ControllerError;
    const NAME: &'static str = "pod";

    fn workers(&self, _: &Ctx) -> usize {
        self.workers
    }

    fn watch(&self) -> Watch<Pod> {
        Watch {
            labels: None,
            trim: super::podinfo::trim,
        }
    }

    async fn reconcile(&self, ctx: &Arc<Ctx>, pod: Arc<Pod>) -> Result<Action> {
        if pod.metadata.deletion_timestamp.is_some() {
            // Kept until the pod object is gone: the sandbox may still use the address.
            return Ok(Action::Done);
        }
        add(ctx, &self.waiting, &pod).await.map(|()| Action::Done)
    }

    async fn cleanup(
        &self,
        ctx: &Arc<Ctx>,
        key: &Key<Pod>,
        last: Option<Arc<Pod>>,
    ) -> Result<Action> {
        let ns = key.namespace().unwrap_or_default();
        delete(ctx, &self.waiting, ns, key.name(), last.as_deref())
            .await
            .map(|()| Action::Done)
    }

    fn relations(this: &Arc<Self>, r: &mut Relations<'_, Ctx, Pod>) {
        // Waiters are served when an address is released in their subnet, or the subnet is loaded or
        // changed (validated, fixed, widened).
        let w = this.waiting.clone();
        r.on_signal::<AddressesFreed>(move |_: &Kinds, f| w.keys(&f.0));
        let w = this.waiting.clone();
        r.on_signal::<SubnetChanged>(move |_: &Kinds, c| match &c.new {
            Some(_) => w.keys(c.name()),
            None => Vec::new(),
        });
    }
}

fn host_network(pod: &Pod) -> bool {
    pod.spec.host_network.unwrap_or(false)
}

/// The subnet a pod belongs to: its `logical_switch` annotation, the subnet of its `ip_pool`, its
/// namespace's subnets, the default subnet.
pub(crate) fn choose_subnet(ctx: &Ctx, ns: &str, a: &PodNetworkAnnotations) -> Result<String> {
    if let Some(ls) = &a.logical_switch {
        return Ok(ls.clone());
    }
    match &a.ip_pool {
        Some(IpPoolRequest::Pool(p)) => {
            return ctx
                .views
                .pool_subnet(p)
                .ok_or_else(|| ControllerError::NotReady(format!("ippool {p}")));
        }
        Some(IpPoolRequest::Addresses(entries)) => {
            if let Some(ip) = entries.first().and_then(|e| e.first()) {
                if let Some(s) = ctx
                    .subnet_list()
                    .into_iter()
                    .find(|s| s.cidrs.iter().any(|c| c.contains(*ip)))
                {
                    return Ok(s.name.clone());
                }
            }
        }
        None => {}
    }
    if let Some(s) = ctx.views.namespace_subnet(ns) {
        return Ok(s);
    }
    Ok(ctx.config.default_subnet.name.clone())
}

fn same_port(ctx: &Ctx, port: &str, a: &PodNetworkAnnotations) -> bool {
    let Some(lsp) = ctx.nb.switch_port(port) else {
        return false;
    };
    let Some(mac) = a.mac_address else {
        return false;
    };
    let want = plan::port_address(&addresses(&a.ip_addresses, mac));
    lsp.addresses.len() == 1 && lsp.addresses[0] == want
}

fn addresses(ips: &[IpAddr], mac: kubeovn_ipam::Mac) -> Addresses {
    let mut a = Addresses {
        v4: None,
        v6: None,
        mac,
    };
    for ip in ips {
        match ip {
            IpAddr::V4(v) => a.v4 = Some(*v),
            IpAddr::V6(v) => a.v6 = Some(*v),
        }
    }
    a
}

async fn warn(ctx: &Ctx, pod: &Pod, reason: &str, e: &ControllerError) {
    ctx.event(pod, EventType::Warning, reason, e.to_string())
        .await;
}

async fn add(ctx: &Ctx, waiting: &Waiting, pod: &Pod) -> Result<()> {
    if host_network(pod) {
        return Ok(());
    }
    let t = Instant::now();
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let what = format!("pod {ns}/{name}");
    let a = match PodNetworkAnnotations::parse(&pod.annotation_map(), DEFAULT_PROVIDER) {
        Ok(a) => a,
        Err(e) => {
            let e = ControllerError::invalid(&what, e.to_string());
            warn(ctx, pod, "InvalidAnnotation", &e).await;
            return Err(e);
        }
    };
    let node = pod.spec.node_name.clone();
    let port = naming::pod_port(&name, &ns, DEFAULT_PROVIDER);
    // Done before (restart, resync): nothing to write.
    if a.allocated && (a.routed || node.is_none()) && same_port(ctx, &port, &a) {
        return Ok(());
    }
    let subnet_name = choose_subnet(ctx, &ns, &a)?;
    let owner = naming::pod_key(&ns, &name);
    let waiter = Key::<Pod>::namespaced(&ns, &name);
    let subnet = match ctx.subnet(&subnet_name) {
        Some(s) => s,
        None => {
            // Served as soon as the subnet is loaded (validated, or its spec fixed): registered first,
            // then looked up again, so a load in between is not missed.
            let first = waiting.add(&subnet_name, &waiter);
            match ctx.subnet(&subnet_name) {
                Some(s) => {
                    waiting.remove(Some(&subnet_name), &waiter);
                    s
                }
                None => {
                    let (reason, e) = ctx.views.unusable(&subnet_name);
                    if first {
                        warn(ctx, pod, reason, &e).await;
                    }
                    return Err(e);
                }
            }
        }
    };

    // Static addresses: the ip_address annotation, or a free entry of an address-list ip_pool.
    let held = ctx.ipam.get(&subnet.name, &owner, &port).ok().flatten();
    let held = held.map(|h| h.ips().collect::<Vec<_>>());
    let holder = |ip: IpAddr| ctx.ipam.owner(ip).map(|o| o.pod);
    let choose = || plan::pod_addresses(&a, held.as_deref(), &holder, &owner);
    let (statics, pool) = match choose() {
        plan::AddressChoice::Given { statics, pool } => (statics, pool),
        plan::AddressChoice::PoolInUse => {
            // Waits for an entry's release (a rolling update: the old pods hold them yet), warned once;
            // registered first, then looked again, so a release in between is not missed.
            let first = waiting.add(&subnet.name, &waiter);
            match choose() {
                plan::AddressChoice::Given { statics, pool } => (statics, pool),
                plan::AddressChoice::PoolInUse => {
                    let e =
                        ControllerError::invalid(&what, "every address of its ip_pool is in use");
                    if first {
                        warn(ctx, pod, "AcquireAddressFailed", &e).await;
                    }
                    return Err(e);
                }
            }
        }
    };
    let mut req = AllocRequest::new(&owner, &port).static_ips(&statics);
    if let Some(m) = a.mac_address {
        req = req.mac(m);
    }
    if let Some(p) = &pool {
        req = req.pool(p);
    }
    let mut allocated = ctx.ipam.allocate(&subnet.name, &req);
    if let Err(IpamError::NoAvailable { .. } | IpamError::Conflict { .. }) = allocated {
        // Wait for a release in this subnet: a full subnet, or the address (or MAC) asked for held by
        // another pod or a reservation (a fixed address moving to a replacement pod). One that came between
        // the failure and the registration woke nobody, hence the second try.
        let first = waiting.add(&subnet.name, &waiter);
        allocated = ctx.ipam.allocate(&subnet.name, &req);
        match &allocated {
            Ok(_) => {}
            Err(e) => {
                let e = ControllerError::Ipam(e.clone());
                if first {
                    warn(ctx, pod, "AcquireAddressFailed", &e).await;
                }
                // Exhaustion is transient (the queue retries it with backoff as well); a conflict is not
                // retried blindly, the release of the address wakes it.
                return Err(e);
            }
        }
    }
    let addrs = match allocated {
        Ok(x) => {
            // Served: no longer waiting (a woken waiter stays registered until now).
            waiting.remove(Some(&subnet.name), &waiter);
            x
        }
        Err(e) => {
            let permanent = !matches!(e, IpamError::NoSuchSubnet { .. });
            let e = ControllerError::Ipam(e);
            warn(ctx, pod, "AcquireAddressFailed", &e).await;
            return if permanent {
                Err(ControllerError::invalid(&what, e.to_string()))
            } else {
                Err(e)
            };
        }
    };

    let distributed = subnet.distributed(&ctx.config.default_vpc);
    let batch = plan::pod_batch(
        &PodPort {
            namespace: &ns,
            name: &name,
            subnet: &subnet.name,
            addrs: &addrs,
            port_security: a.port_security,
            node: node.as_deref().map(|n| (n, distributed)),
        },
        &port,
    );
    ctx.writer.commit(batch).await?;

    let record = IpRecord {
        name: port.clone(),
        subnet: subnet.name.clone(),
        namespace: ns.clone(),
        pod: name.clone(),
        node: node.clone().unwrap_or_default(),
        addrs,
        pod_type: String::new(),
    };
    let done = PodNetworkAnnotations {
        ip_addresses: addrs.ips().collect(),
        mac_address: Some(addrs.mac),
        cidrs: subnet.cidrs.clone(),
        gateways: subnet.gateways.clone(),
        logical_switch: Some(subnet.name.clone()),
        logical_router: Some(subnet.vpc.clone()),
        ..Default::default()
    };
    let mut patch = done.allocation_patch(DEFAULT_PROVIDER);
    if node.is_some() {
        patch.extend(annotations::routed_patch(DEFAULT_PROVIDER));
    }
    // Nothing to write if the pod already says all of it.
    let anns = pod.annotation_map();
    let unchanged = patch
        .iter()
        .all(|(k, v)| anns.get(k).map(String::as_str) == v.as_deref());
    let annotate = async {
        if unchanged {
            return Ok(());
        }
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
        match api
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(merge_patch(&patch)),
            )
            .await
        {
            Ok(_) => Ok(()),
            // Deleted meanwhile: its delete event releases what was taken.
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(ControllerError::kube(format!("patch {what}"), e)),
        }
    };
    // The port is in NB: the record and the annotations are independent writes, both idempotent (a
    // failure of either retries both).
    let (r, a) = tokio::join!(api::ensure(&ctx.client, &record), annotate);
    r?;
    a?;
    ctx.metrics.pod_added(t.elapsed());
    Ok(())
}

async fn delete(
    ctx: &Ctx,
    waiting: &Waiting,
    ns: &str,
    name: &str,
    last: Option<&Pod>,
) -> Result<()> {
    if last.is_some_and(host_network) {
        return Ok(());
    }
    let port = naming::pod_port(name, ns, DEFAULT_PROVIDER);
    let mut b = kubeovn_ovn::northbound::Batch::new();
    b.delete_switch_port(&port);
    ctx.writer.commit(b).await?;
    api::delete(&ctx.client, &port).await?;
    let key = naming::pod_key(ns, name);
    waiting.remove(None, &Key::namespaced(ns, name));
    // Only the port's own addresses: a reservation naming the pod (a record of another name, owner
    // `ns/pod` too) stays reserved until its record goes.
    for a in ctx.ipam.pod_allocations(&key) {
        if a.nic != port {
            continue;
        }
        if let Err(e) = ctx.views.release(&a.subnet, &a.pod, &a.nic) {
            tracing::debug!(subnet = %a.subnet, pod = %a.pod, error = %e, "release");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotations::{
        ALLOCATED, CIDR, GATEWAY, IP_ADDRESS, IP_POOL, LOGICAL_SWITCH, MAC_ADDRESS, PORT_SECURITY,
        ROUTED,
    };
    use crate::controller::testing::{pod, Harness};

    impl Harness {
        /// Runs the pod kind for `key` (other kinds' tests use it without naming this kind).
        pub(crate) async fn run_pod(&self, key: Key<Pod>) -> Result<Action> {
            self.run::<Pods>(key).await
        }

        /// The pods waiting for an address in `subnet` (the pod kind's state).
        pub(crate) fn waiting(&self, subnet: &str) -> Vec<String> {
            self.ctx
                .kinds
                .reconciler::<Pods>()
                .map(|p| p.waiting.of(subnet))
                .unwrap_or_default()
        }
    }
    use crate::crd::{Decoded, Subnet, SubnetSpec, IP};
    use futures::{StreamExt, TryStreamExt};
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{DeleteParams, PostParams, WatchEvent, WatchParams};
    use kubeovn_ovn::northbound::Northbound;

    fn key(ns: &str, name: &str) -> Key<Pod> {
        Key::namespaced(ns, name)
    }

    fn ann(p: &Pod, k: &str) -> Option<String> {
        p.annotation_map().get(k).cloned()
    }

    /// Creates the Subnet `name` and runs it, so pods can use it.
    async fn subnet(h: &Harness, name: &str, cidr: &str, exclude: &[&str], namespaces: &[&str]) {
        let s = Subnet::new(
            name,
            SubnetSpec {
                cidr_block: cidr.into(),
                exclude_ips: exclude.iter().map(|s| s.to_string()).collect(),
                namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
                ..SubnetSpec::default()
            },
        );
        let api: Api<Subnet> = Api::all(h.client.clone());
        let s = api
            .create(&PostParams::default(), &s)
            .await
            .expect("subnet");
        h.stored(&Decoded::new(s)).await;
        h.run_subnet(Key::cluster(name)).await.expect("subnet run");
        assert!(h.ctx.subnet(name).is_some(), "subnet {name} loaded");
    }

    async fn delete_pod(h: &Harness, ns: &str, name: &str) {
        let api: Api<Pod> = Api::namespaced(h.client.clone(), ns);
        api.delete(name, &DeleteParams::default())
            .await
            .expect("delete pod");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pod_gets_addresses_its_port_its_record_and_one_patch() {
        let h = Harness::start().await;
        let created = h.create_pod(&pod("default", "a", &[], Some("n1"))).await;
        let api: Api<Pod> = Api::namespaced(h.client.clone(), "default");
        let rv = created.metadata.resource_version.clone().expect("rv");
        let mut changes = api
            .watch(&WatchParams::default().fields("metadata.name=a"), &rv)
            .await
            .expect("watch")
            .boxed();

        assert_eq!(
            h.run::<Pods>(key("default", "a")).await.expect("run"),
            Action::Done
        );

        let p = h.api_pod("default", "a").await;
        assert_eq!(ann(&p, ALLOCATED).as_deref(), Some("true"));
        assert_eq!(
            ann(&p, ROUTED).as_deref(),
            Some("true"),
            "scheduled: routed"
        );
        assert_eq!(ann(&p, LOGICAL_SWITCH).as_deref(), Some("ovn-default"));
        assert_eq!(ann(&p, CIDR).as_deref(), Some("10.16.0.0/16"));
        assert_eq!(ann(&p, GATEWAY).as_deref(), Some("10.16.0.1"));
        let ip = ann(&p, IP_ADDRESS).expect("ip");
        let mac = ann(&p, MAC_ADDRESS).expect("mac");
        let ipn: IpAddr = ip.parse().expect("an address");
        assert!(ipn.to_string().starts_with("10.16.") && ip != "10.16.0.1");

        // The port: the pod's address, no port security unless asked (as Kube-OVN), owned by the pod, on
        // its switch.
        let lsp = h.nb.switch_port("a.default").expect("port");
        assert_eq!(lsp.addresses, vec![format!("{mac} {ip}")]);
        assert!(lsp.port_security.is_empty());
        let ext = |k: &str| lsp.external_ids.get(k).map(String::as_str);
        assert_eq!(ext("vendor"), Some("kube-ovn"));
        assert_eq!(ext("ls"), Some("ovn-default"));
        assert_eq!(ext("pod"), Some("default/a"));
        let ls = h.nb.switch("ovn-default").expect("switch");
        assert!(ls.ports.contains(&lsp.uuid));
        // Scheduled on n1: in n1's port group and (a distributed subnet) in the subnet's group of n1.
        for pg in [
            naming::node_port_group("n1"),
            naming::subnet_node_port_group("ovn-default", "n1"),
        ] {
            let g = h.nb.port_group(&pg).expect("port group");
            assert_eq!(g.ports, vec![lsp.uuid], "{pg}");
        }

        // The record: the controller's (not a reservation), saying what the annotations say.
        let rec: IP = h.get("a.default").await.expect("ip record");
        assert_eq!(rec.spec.ip_address, ip);
        assert_eq!(rec.spec.mac_address, mac);
        assert_eq!(rec.spec.subnet, "ovn-default");
        assert_eq!(
            (rec.spec.namespace.as_str(), rec.spec.pod_name.as_str()),
            ("default", "a")
        );
        assert_eq!(rec.spec.node_name, "n1");
        let labels = rec.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get(api::RESERVED_LABEL).map(String::as_str),
            Some("false")
        );
        assert_eq!(h.holder(&ip).as_deref(), Some("a.default"));

        // One patch: a marker written after the run is the second change the watch sees.
        api.patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"marker": "1"}}})),
        )
        .await
        .expect("marker");
        let mut modified = 0;
        while let Some(ev) = changes.try_next().await.expect("watch event") {
            if let WatchEvent::Modified(p) = ev {
                modified += 1;
                if p.metadata.labels.is_some_and(|l| l.contains_key("marker")) {
                    break;
                }
            }
        }
        assert_eq!(modified, 2, "one annotation patch, then the marker");

        // Run again on what it wrote: nothing written (pod and record keep their versions).
        let p = h.api_pod("default", "a").await;
        h.pod_stored(&p).await;
        h.run::<Pods>(key("default", "a")).await.expect("run again");
        let again = h.api_pod("default", "a").await;
        assert_eq!(again.metadata.resource_version, p.metadata.resource_version);
        let rec2: IP = h.get("a.default").await.expect("ip record");
        assert_eq!(
            rec2.metadata.resource_version,
            rec.metadata.resource_version
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_static_address_is_honoured_and_refused_to_a_second_pod() {
        let h = Harness::start().await;
        let asks = [(IP_ADDRESS, "10.16.0.77"), (PORT_SECURITY, "true")];
        h.create_pod(&pod("default", "a", &asks, None)).await;
        h.run::<Pods>(key("default", "a")).await.expect("run");
        let p = h.api_pod("default", "a").await;
        assert_eq!(ann(&p, IP_ADDRESS).as_deref(), Some("10.16.0.77"));
        assert_eq!(ann(&p, ROUTED), None, "not scheduled: not routed");
        let lsp = h.nb.switch_port("a.default").expect("port");
        assert!(
            lsp.addresses[0].ends_with(" 10.16.0.77"),
            "{:?}",
            lsp.addresses
        );
        assert_eq!(lsp.port_security, lsp.addresses, "port security asked");

        // The same address asked by another pod: refused, said, not retried; the first keeps it.
        h.create_pod(&pod("default", "b", &[(IP_ADDRESS, "10.16.0.77")], None))
            .await;
        let e = h
            .run::<Pods>(key("default", "b"))
            .await
            .expect_err("conflict");
        assert!(e.is_permanent(), "{e}");
        assert_eq!(
            h.warnings("default", "b").await,
            vec!["AcquireAddressFailed"]
        );
        assert!(h.nb.switch_port("b.default").is_none());
        assert_eq!(h.holder("10.16.0.77").as_deref(), Some("a.default"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pod_of_a_namespace_bound_to_a_subnet_goes_there() {
        let h = Harness::start().await;
        let mut ns = Namespace::default();
        ns.metadata.name = Some("team".into());
        h.create_cluster(&ns).await;
        subnet(&h, "team-net", "10.70.0.0/24", &[], &["team"]).await;
        h.create_pod(&pod("team", "a", &[], None)).await;
        h.run::<Pods>(key("team", "a")).await.expect("run");
        let p = h.api_pod("team", "a").await;
        assert_eq!(ann(&p, LOGICAL_SWITCH).as_deref(), Some("team-net"));
        assert_eq!(ann(&p, CIDR).as_deref(), Some("10.70.0.0/24"));
        let ip = ann(&p, IP_ADDRESS).expect("ip");
        assert!(ip.starts_with("10.70.0."), "{ip}");
        let lsp = h.nb.switch_port("a.team").expect("port");
        assert_eq!(
            lsp.external_ids.get("ls").map(String::as_str),
            Some("team-net")
        );
        assert!(h
            .nb
            .switch("team-net")
            .expect("switch")
            .ports
            .contains(&lsp.uuid));
        let rec: IP = h.get("a.team").await.expect("record");
        assert_eq!(rec.spec.subnet, "team-net");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_host_network_pod_gets_nothing() {
        let h = Harness::start().await;
        let mut p = pod("default", "h", &[], Some("n1"));
        p.spec.host_network = Some(true);
        let created = h.create_pod(&p).await;
        h.run::<Pods>(key("default", "h")).await.expect("run");
        let now = h.api_pod("default", "h").await;
        assert_eq!(
            now.metadata.resource_version,
            created.metadata.resource_version
        );
        assert!(h.nb.switch_port("h.default").is_none());
        assert!(h.get::<IP>("h.default").await.is_none());
        // Its delete releases nothing (it held nothing) and fails on nothing.
        delete_pod(&h, "default", "h").await;
        h.gone(&key("default", "h")).await;
        h.run::<Pods>(key("default", "h")).await.expect("cleanup");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_terminating_pod_is_left_alone_and_its_delete_releases_everything() {
        let h = Harness::start().await;
        let mut p = pod("default", "a", &[], None);
        p.metadata.finalizers = Some(vec!["test/keep".into()]);
        h.create_pod(&p).await;
        h.run::<Pods>(key("default", "a")).await.expect("run");
        let ip = ann(&h.api_pod("default", "a").await, IP_ADDRESS).expect("ip");

        // Terminating: the sandbox may still use the address, so everything stays.
        delete_pod(&h, "default", "a").await;
        let terminating = h.api_pod("default", "a").await;
        assert!(terminating.metadata.deletion_timestamp.is_some());
        h.pod_stored(&terminating).await;
        h.run::<Pods>(key("default", "a")).await.expect("run");
        assert!(h.nb.switch_port("a.default").is_some());
        assert!(h.get::<IP>("a.default").await.is_some());
        assert_eq!(h.holder(&ip).as_deref(), Some("a.default"));

        // A pod terminating before it was handled gets nothing.
        let mut q = pod("default", "b", &[], None);
        q.metadata.finalizers = Some(vec!["test/keep".into()]);
        h.create_pod(&q).await;
        delete_pod(&h, "default", "b").await;
        h.pod_stored(&h.api_pod("default", "b").await).await;
        h.run::<Pods>(key("default", "b")).await.expect("run");
        assert!(h.nb.switch_port("b.default").is_none());
        assert_eq!(ann(&h.api_pod("default", "b").await, ALLOCATED), None);

        // Gone: the cleanup (with the tombstone) removes the port and the record and frees the address.
        api_unfinalize(&h, "a").await;
        h.gone(&key("default", "a")).await;
        assert!(h.ctx.kinds.tombstone(&key("default", "a")).is_some());
        h.run::<Pods>(key("default", "a")).await.expect("cleanup");
        assert!(h.nb.switch_port("a.default").is_none());
        assert!(h.get::<IP>("a.default").await.is_none());
        assert_eq!(h.holder(&ip), None);
        assert!(h.ctx.kinds.tombstone(&key("default", "a")).is_none());
    }

    /// Removes the finalizers of `default/name` (the object then goes).
    async fn api_unfinalize(h: &Harness, name: &str) {
        let api: Api<Pod> = Api::namespaced(h.client.clone(), "default");
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("unfinalize");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pod_waits_for_an_address_of_a_full_subnet_warned_once_then_is_served() {
        let h = Harness::start().await;
        // One free address: 10.71.0.2.
        subnet(&h, "small", "10.71.0.0/29", &["10.71.0.3..10.71.0.6"], &[]).await;
        let on_small = [(LOGICAL_SWITCH, "small")];
        h.create_pod(&pod("default", "a", &on_small, None)).await;
        h.run::<Pods>(key("default", "a")).await.expect("run a");
        assert_eq!(h.holder("10.71.0.2").as_deref(), Some("a.default"));

        h.create_pod(&pod("default", "b", &on_small, None)).await;
        for _ in 0..2 {
            let e = h.run::<Pods>(key("default", "b")).await.expect_err("full");
            assert!(!e.is_permanent(), "retried: {e}");
        }
        assert_eq!(
            h.warnings("default", "b").await,
            vec!["AcquireAddressFailed"]
        );
        assert_eq!(h.waiting("small"), vec!["default/b".to_owned()]);
        assert!(h.nb.switch_port("b.default").is_none());

        // A waiter deleted is no longer served.
        h.create_pod(&pod("default", "c", &on_small, None)).await;
        h.run::<Pods>(key("default", "c")).await.expect_err("full");
        delete_pod(&h, "default", "c").await;
        h.gone(&key("default", "c")).await;
        h.run::<Pods>(key("default", "c")).await.expect("cleanup c");

        delete_pod(&h, "default", "a").await;
        h.gone(&key("default", "a")).await;
        h.run::<Pods>(key("default", "a")).await.expect("cleanup a");
        assert_eq!(h.holder("10.71.0.2"), None);
        // Woken (queued again), still registered until served.
        assert_eq!(h.waiting("small"), vec!["default/b".to_owned()]);
        h.run::<Pods>(key("default", "b")).await.expect("served");
        assert_eq!(h.holder("10.71.0.2").as_deref(), Some("b.default"));
        assert!(h.waiting("small").is_empty());
        let p = h.api_pod("default", "b").await;
        assert_eq!(ann(&p, IP_ADDRESS).as_deref(), Some("10.71.0.2"));
    }

    /// A pod asking for an address another pod holds (a fixed address moving from a terminating pod to its
    /// replacement) is served once the holder goes, with the workers running.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pod_asking_for_a_used_address_gets_it_when_released() {
        let mut h = Harness::start().await;
        let asks = [(IP_ADDRESS, "10.16.0.88")];
        h.create_pod(&pod("default", "old", &asks, None)).await;
        h.run::<Pods>(key("default", "old")).await.expect("run old");
        h.serve();
        h.create_pod(&pod("default", "new", &asks, None)).await;
        // Registered as waiting (so it ran), and its run over (its event sent).
        h.until("new handled", || {
            h.waiting("ovn-default") == vec!["default/new".to_owned()]
                && h.ctx.kinds.is_idle::<Pod>()
        })
        .await;
        assert_eq!(
            h.warnings("default", "new").await,
            vec!["AcquireAddressFailed"]
        );
        assert_eq!(h.holder("10.16.0.88").as_deref(), Some("old.default"));

        delete_pod(&h, "default", "old").await;
        h.until("new served", || {
            h.ctx
                .pods()
                .get("default", "new")
                .is_some_and(|p| ann(&p, ALLOCATED).as_deref() == Some("true"))
        })
        .await;
        assert_eq!(h.holder("10.16.0.88").as_deref(), Some("new.default"));
        assert!(h.nb.switch_port("new.default").is_some());
        assert_eq!(h.warnings("default", "new").await.len(), 1, "warned once");
    }

    /// Pods sharing an address-list `ip_pool` (a workload's pods) each take a free entry; one more waits
    /// until an entry is released (a rolling update), with the workers running.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pod_of_a_used_up_address_list_gets_an_entry_when_one_is_released() {
        let mut h = Harness::start().await;
        let pool = [(IP_POOL, "10.16.0.90,10.16.0.91")];
        for n in ["a", "b"] {
            h.create_pod(&pod("default", n, &pool, None)).await;
            h.run::<Pods>(key("default", n)).await.expect("run");
        }
        let mut got: Vec<String> = Vec::new();
        for n in ["a", "b"] {
            got.push(ann(&h.api_pod("default", n).await, IP_ADDRESS).expect("ip"));
        }
        got.sort();
        assert_eq!(got, ["10.16.0.90", "10.16.0.91"]);

        h.serve();
        h.create_pod(&pod("default", "c", &pool, None)).await;
        // Registered as waiting (so it ran), and its run over (its event sent).
        h.until("c handled", || {
            h.waiting("ovn-default") == vec!["default/c".to_owned()] && h.ctx.kinds.is_idle::<Pod>()
        })
        .await;
        assert_eq!(
            h.warnings("default", "c").await,
            vec!["AcquireAddressFailed"]
        );
        assert!(h.nb.switch_port("c.default").is_none());

        let freed = ann(&h.api_pod("default", "a").await, IP_ADDRESS).expect("ip");
        delete_pod(&h, "default", "a").await;
        h.until("c served", || {
            h.ctx
                .pods()
                .get("default", "c")
                .is_some_and(|p| ann(&p, ALLOCATED).as_deref() == Some("true"))
        })
        .await;
        assert_eq!(h.holder(&freed).as_deref(), Some("c.default"));
        assert_eq!(h.warnings("default", "c").await.len(), 1, "warned once");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pod_naming_a_missing_subnet_waits_for_it() {
        let h = Harness::start().await;
        h.create_pod(&pod("default", "a", &[(LOGICAL_SWITCH, "later")], None))
            .await;
        for _ in 0..2 {
            let e = h
                .run::<Pods>(key("default", "a"))
                .await
                .expect_err("no subnet");
            assert!(!e.is_permanent(), "retried: {e}");
        }
        assert_eq!(h.warnings("default", "a").await, vec!["SubnetNotFound"]);
        assert!(h.nb.switch_port("a.default").is_none());
        assert_eq!(h.waiting("later"), vec!["default/a".to_owned()]);

        subnet(&h, "later", "10.73.0.0/24", &[], &[]).await;
        h.run::<Pods>(key("default", "a")).await.expect("served");
        let p = h.api_pod("default", "a").await;
        assert_eq!(ann(&p, LOGICAL_SWITCH).as_deref(), Some("later"));
        assert!(ann(&p, IP_ADDRESS).is_some_and(|ip| ip.starts_with("10.73.0.")));
        assert!(h.waiting("later").is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_bad_annotation_is_warned_of_and_not_retried() {
        let h = Harness::start().await;
        let created = h
            .create_pod(&pod("default", "a", &[(IP_ADDRESS, "not-an-ip")], None))
            .await;
        let e = h
            .run::<Pods>(key("default", "a"))
            .await
            .expect_err("invalid");
        assert!(e.is_permanent(), "{e}");
        assert_eq!(h.warnings("default", "a").await, vec!["InvalidAnnotation"]);
        assert!(h.nb.switch_port("a.default").is_none());
        assert!(h.get::<IP>("a.default").await.is_none());
        let now = h.api_pod("default", "a").await;
        assert_eq!(
            now.metadata.resource_version,
            created.metadata.resource_version
        );
    }
}
