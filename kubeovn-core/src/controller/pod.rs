//! Pods: addresses, the logical switch port, the IP record and one annotation patch; release on delete.
//!
//! A pod whose subnet is full waits in [`Waiting`] and is queued again as soon as an address is released in
//! that subnet (the queue's backoff retries it too, should a release go unnoticed).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::ResourceExt;
use kubeovn_ipam::{Addresses, AllocRequest, IpamError};

use super::error::{ControllerError, Result};
use super::framework::{Action, Key, Reconciler, Watch};
use super::ip::{self, IpRecord};
use super::plan::{self, PodPort};
use super::{split_key, subnet, Ctx, PodInfo as Pod};
use crate::annotations::{
    self, merge_patch, IpPoolRequest, PodNetworkAnnotations, DEFAULT_PROVIDER,
};
use crate::naming;

/// Pods waiting for an address, by subnet.
#[derive(Debug, Default)]
pub(crate) struct Waiting(Mutex<HashMap<String, HashSet<String>>>);

impl Waiting {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashSet<String>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds pod `key` to the waiters of `subnet`; true if it was not waiting there yet.
    fn add(&self, subnet: &str, key: &str) -> bool {
        self.lock()
            .entry(subnet.to_owned())
            .or_default()
            .insert(key.to_owned())
    }

    /// Removes pod `key` from the waiters of `subnet` (or of every subnet).
    fn remove(&self, subnet: Option<&str>, key: &str) {
        self.lock().retain(|s, keys| {
            if subnet.is_none_or(|x| x == s) {
                keys.remove(key);
            }
            !keys.is_empty()
        });
    }

    /// The waiters of `subnet`. They stay registered until served or deleted, so a waiter that fails again
    /// is not warned about again.
    fn of(&self, subnet: &str) -> Vec<String> {
        self.lock()
            .get(subnet)
            .map(|k| k.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// An address was released in `subnet`, or the subnet was loaded or changed: the pods waiting for one there
/// are queued again.
pub(crate) fn wake(ctx: &Ctx, subnet: &str) {
    let keys = ctx.waiting.of(subnet);
    if !keys.is_empty() {
        tracing::debug!(subnet, pods = keys.len(), "waiting pods queued");
    }
    for k in keys {
        let (ns, name) = split_key(&k);
        ctx.enqueue(Key::<Pod>::namespaced(ns, name));
    }
}

/// The pod kind: addresses, port and annotation for each pod; release when it is gone.
pub(crate) struct Pods;

#[async_trait::async_trait]
impl Reconciler<Ctx> for Pods {
    type Object = Pod;
    type Error = ControllerError;
    const NAME: &'static str = "pod";

    fn workers(ctx: &Ctx) -> usize {
        ctx.config.pod_workers
    }

    fn watch() -> Watch<Pod> {
        Watch {
            labels: None,
            trim: super::podinfo::trim,
        }
    }

    async fn reconcile(ctx: &Arc<Ctx>, pod: Arc<Pod>) -> Result<Action> {
        if pod.metadata.deletion_timestamp.is_some() {
            // Kept until the pod object is gone: the sandbox may still use the address.
            return Ok(Action::Done);
        }
        add(ctx, &pod).await.map(|()| Action::Done)
    }

    async fn cleanup(ctx: &Arc<Ctx>, key: &Key<Pod>, last: Option<Arc<Pod>>) -> Result<Action> {
        let ns = key.namespace().unwrap_or_default();
        delete(ctx, ns, key.name(), last.as_deref())
            .await
            .map(|()| Action::Done)
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
            let pools = ctx.pools.read().unwrap_or_else(|e| e.into_inner());
            return match pools.get(p) {
                Some((subnet, _)) => Ok(subnet.clone()),
                None => Err(ControllerError::NotReady(format!("ippool {p}"))),
            };
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
    if let Some(s) = subnet::namespace_subnet(ctx, ns) {
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

async fn add(ctx: &Ctx, pod: &Pod) -> Result<()> {
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
    let subnet = match ctx.subnet(&subnet_name) {
        Some(s) => s,
        None => {
            // Served as soon as the subnet is loaded (validated, or its spec fixed): registered first,
            // then looked up again, so a load in between is not missed.
            let first = ctx.waiting.add(&subnet_name, &owner);
            match ctx.subnet(&subnet_name) {
                Some(s) => {
                    ctx.waiting.remove(Some(&subnet_name), &owner);
                    s
                }
                None => {
                    let (reason, e) = subnet::unusable(ctx, &subnet_name);
                    if first {
                        warn(ctx, pod, reason, &e).await;
                    }
                    return Err(e);
                }
            }
        }
    };

    // Static addresses: the ip_address annotation, or a free entry of an address-list ip_pool.
    let mut statics: Vec<IpAddr> = a.ip_addresses.clone();
    let mut pool: Option<&str> = None;
    match &a.ip_pool {
        Some(IpPoolRequest::Pool(p)) if statics.is_empty() => pool = Some(p),
        Some(IpPoolRequest::Addresses(entries)) if statics.is_empty() => {
            let held = ctx.ipam.get(&subnet.name, &owner, &port).ok().flatten();
            let free = entries.iter().find(|e| {
                e.iter().all(|ip| match ctx.ipam.owner(*ip) {
                    None => true,
                    Some(o) => o.pod == owner,
                })
            });
            match (held, free) {
                (Some(h), _) => statics = h.ips().collect(),
                (None, Some(e)) => statics = e.clone(),
                (None, None) => {
                    let e =
                        ControllerError::invalid(&what, "every address of its ip_pool is in use");
                    warn(ctx, pod, "AcquireAddressFailed", &e).await;
                    return Err(e);
                }
            }
        }
        _ => {}
    }
    let mut req = AllocRequest::new(&owner, &port).static_ips(&statics);
    if let Some(m) = a.mac_address {
        req = req.mac(m);
    }
    if let Some(p) = pool {
        req = req.pool(p);
    }
    let mut allocated = ctx.ipam.allocate(&subnet.name, &req);
    if let Err(IpamError::NoAvailable { .. }) = allocated {
        // Wait for a release in this subnet; one that came between the failure and the registration
        // woke nobody, hence the second try.
        let first = ctx.waiting.add(&subnet.name, &owner);
        allocated = ctx.ipam.allocate(&subnet.name, &req);
        match &allocated {
            Ok(_) => {}
            Err(e) => {
                let e = ControllerError::Ipam(e.clone());
                if first {
                    warn(ctx, pod, "AcquireAddressFailed", &e).await;
                }
                // Transient: the queue retries it with backoff as well.
                return Err(e);
            }
        }
    }
    let addrs = match allocated {
        Ok(x) => {
            // Served: no longer waiting (a woken waiter stays registered until now).
            ctx.waiting.remove(Some(&subnet.name), &owner);
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
    let (r, a) = tokio::join!(ip::ensure(ctx, &record), annotate);
    r?;
    a?;
    ctx.metrics.pod_added(t.elapsed());
    Ok(())
}

async fn delete(ctx: &Ctx, ns: &str, name: &str, last: Option<&Pod>) -> Result<()> {
    if last.is_some_and(host_network) {
        return Ok(());
    }
    let port = naming::pod_port(name, ns, DEFAULT_PROVIDER);
    let mut b = kubeovn_ovn::northbound::Batch::new();
    b.delete_switch_port(&port);
    ctx.writer.commit(b).await?;
    ip::delete(ctx, &port).await?;
    let key = naming::pod_key(ns, name);
    ctx.waiting.remove(None, &key);
    // Only the port's own addresses: a reservation naming the pod (a record of another name, owner
    // `ns/pod` too) stays reserved until its record goes.
    for a in ctx.ipam.pod_allocations(&key) {
        if a.nic != port {
            continue;
        }
        if let Ok(Some(_)) = ctx.ipam.release(&a.subnet, &a.pod, &a.nic) {
            wake(ctx, &a.subnet);
        }
    }
    Ok(())
}
