//! Garbage collection of what pods and nodes left behind: kube-ovn ports (`external_ids:vendor=kube-ovn`)
//! and the controller's IP records whose pod or node is gone. A user's reservation (an IP record the
//! controller did not write) is never collected.
//!
//! A task on the framework ([`Gc`]). At start (its start hook), before any handler runs, the orphans the rebuild found (from the pod list, the
//! node list, the IP record list and the northbound replica, nothing else read) are removed at once: the
//! controller was down when their pods went away, so no delete event will come, and nothing can be created
//! for them meanwhile. Afterwards a pass runs every `gc_interval` for leaks from other sources, two-phase:
//! an orphan found in one pass is removed in the next if it still is one, so objects created between a
//! list and a check are never removed.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use futures::{StreamExt, TryStreamExt};
use kubeovn_ovn::models::nb::LogicalSwitchPort;
use kubeovn_ovn::northbound::Batch;

use super::api::{self, Listed};
use super::error::{ControllerError, Result};
use super::framework::{Action, Task};
use super::{split_key, Ctx};
use crate::naming::{self, external_ids as ext};

/// IP record deletions in flight at once.
const DELETES_IN_FLIGHT: usize = 16;

/// What one pass found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Orphans {
    /// Switch ports (name, owner key, subnet).
    pub ports: HashSet<(String, String, String)>,
    /// IP records (name, owner key, subnet).
    pub ips: HashSet<(String, String, String)>,
}

impl Orphans {
    fn is_empty(&self) -> bool {
        self.ports.is_empty() && self.ips.is_empty()
    }
}

/// The owner key (in the allocator) of a kube-ovn port and whether that owner still exists; None for
/// ports no pod or node owns (router patch ports and others).
pub(crate) fn port_owner(ctx: &Ctx, lsp: &LogicalSwitchPort) -> Option<(String, bool)> {
    match (
        lsp.external_ids.get(ext::POD),
        lsp.external_ids.get(ext::NODE),
    ) {
        (Some(p), _) => {
            let (ns, name) = split_key(p);
            Some((p.clone(), ctx.pods().contains(ns, name)))
        }
        (None, Some(n)) => Some((lsp.name.clone(), ctx.node(n).is_some())),
        (None, None) => None,
    }
}

/// Whether the pod or node a record of the controller was written for still exists.
pub(crate) fn record_alive(ctx: &Ctx, r: &Listed) -> bool {
    if r.namespace.is_empty() {
        ctx.node(&r.pod).is_some()
    } else {
        ctx.pods().contains(&r.namespace, &r.pod)
    }
}

/// Finds the orphans now.
pub(crate) async fn scan(ctx: &Ctx) -> Result<Orphans> {
    let mut o = Orphans::default();
    for lsp in ctx
        .nb
        .switch_ports_by_external_id(ext::VENDOR, naming::VENDOR)
    {
        if let Some((owner, false)) = port_owner(ctx, &lsp) {
            let ls = lsp.external_ids.get(ext::LS).cloned().unwrap_or_default();
            o.ports.insert((lsp.name.clone(), owner, ls));
        }
    }
    for r in api::list_records(&ctx.client).await? {
        if r.ours && !record_alive(ctx, &r) {
            o.ips.insert((r.name.clone(), r.owner(), r.subnet.clone()));
        }
    }
    Ok(o)
}

/// Deletes the ports (one transaction) and the IP records, then releases their addresses and serves the
/// pods waiting for one.
async fn remove(ctx: &Ctx, o: &Orphans) -> Result<()> {
    if !o.ports.is_empty() {
        let mut b = Batch::new();
        for (name, _, _) in &o.ports {
            b.delete_switch_port(name);
        }
        ctx.writer.commit(b).await?;
        tracing::info!(ports = o.ports.len(), "garbage collected orphaned ports");
    }
    // Owned names: a stream of borrowed ones is not `Send` for every lifetime the spawned task needs.
    let names: Vec<String> = o.ips.iter().map(|(name, _, _)| name.clone()).collect();
    futures::stream::iter(names)
        .map(|name| async move { api::delete(&ctx.client, &name).await })
        .buffer_unordered(DELETES_IN_FLIGHT)
        .try_collect::<()>()
        .await?;
    if !o.ips.is_empty() {
        tracing::info!(ips = o.ips.len(), "garbage collected orphaned IP records");
    }
    let mut released = HashSet::new();
    for (name, owner, subnet) in o.ports.iter().chain(&o.ips) {
        // Released only after the port is gone, so the address is never in two places.
        match ctx.ipam.release(subnet, owner, name) {
            Ok(Some(_)) => {
                released.insert(subnet.as_str());
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(subnet, owner, error = %e, "release at gc"),
        }
    }
    for s in released {
        ctx.views.freed(s);
    }
    Ok(())
}

/// Removes what was an orphan in `marked` and still is in `now`; returns what to mark for the next pass.
pub(crate) async fn sweep(ctx: &Ctx, marked: &Orphans, now: Orphans) -> Result<Orphans> {
    let gone = Orphans {
        ports: now.ports.intersection(&marked.ports).cloned().collect(),
        ips: now.ips.intersection(&marked.ips).cloned().collect(),
    };
    remove(ctx, &gone).await?;
    let mut next = now;
    next.ports.retain(|p| !gone.ports.contains(p));
    next.ips.retain(|i| !gone.ips.contains(i));
    Ok(next)
}

/// Removes the orphans the start found (see the module docs); their addresses were never restored.
async fn remove_at_start(ctx: &Ctx, o: Orphans) -> Result<()> {
    if o.is_empty() {
        return Ok(());
    }
    let t = std::time::Instant::now();
    remove(ctx, &o).await?;
    tracing::info!(
        ports = o.ports.len(),
        ips = o.ips.len(),
        elapsed_ms = t.elapsed().as_millis() as u64,
        "removed what pods and nodes deleted while the controller was down left behind"
    );
    Ok(())
}

/// The garbage collection task: the orphans the start found removed by its start hook, then a pass every
/// `gc_interval`, the first one interval after start (not competing with the start's work queue).
#[derive(Debug, Default)]
pub(crate) struct Gc {
    /// The orphans the rebuild found, removed at start.
    at_start: Mutex<Option<Orphans>>,
    /// What the last pass found: removed by the next if still orphaned. None before the first pass.
    marked: Mutex<Option<Orphans>>,
}

impl Gc {
    /// Hands the start hook the orphans the rebuild found.
    pub fn at_start_remove(&self, o: Orphans) {
        *self.at_start.lock().unwrap_or_else(|e| e.into_inner()) = Some(o);
    }
}

#[async_trait::async_trait]
impl Task<Ctx> for Gc {
    type Error = ControllerError;
    const NAME: &'static str = "gc";

    async fn at_start(&self, ctx: &Arc<Ctx>) -> Result<()> {
        let o = self
            .at_start
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match o {
            Some(o) => remove_at_start(ctx, o).await,
            None => Ok(()),
        }
    }

    async fn run(&self, ctx: &Arc<Ctx>) -> Result<Action> {
        let every = Action::Requeue(ctx.config.gc_interval);
        let marked = self.marked.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(marked) = marked else {
            // The first run, at start: the first pass comes one interval later.
            *self.marked.lock().unwrap_or_else(|e| e.into_inner()) = Some(Orphans::default());
            return Ok(every);
        };
        let next = match scan(ctx).await {
            Ok(now) => sweep(ctx, &marked, now).await,
            Err(e) => Err(e),
        };
        let (keep, result) = match next {
            Ok(n) => (n, Ok(every)),
            Err(e) => (marked, Err(e)),
        };
        *self.marked.lock().unwrap_or_else(|e| e.into_inner()) = Some(keep);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::api::{self as ipapi, IpRecord};
    use crate::controller::plan::{self, PodPort};
    use crate::controller::testing::{pod, Harness};
    use crate::crd::{IPSpec, IP};
    use kube::api::{Api, PostParams};
    use kubeovn_ipam::AllocRequest;
    use kubeovn_ovn::northbound::Northbound;

    /// What a pod `default/name` handled by a controller leaves: its address taken, its port and its record.
    async fn leftovers(h: &Harness, name: &str, ip: &str) {
        let owner = naming::pod_key("default", name);
        let port = naming::pod_port(name, "default", crate::annotations::DEFAULT_PROVIDER);
        let addrs = h
            .ctx
            .ipam
            .allocate(
                "ovn-default",
                &AllocRequest::new(&owner, &port).static_ips(&[ip.parse().expect("ip")]),
            )
            .expect("allocate");
        let b = plan::pod_batch(
            &PodPort {
                namespace: "default",
                name,
                subnet: "ovn-default",
                addrs: &addrs,
                port_security: false,
                node: None,
            },
            &port,
        );
        h.nb.commit(b).await.expect("port");
        let rec = IpRecord {
            name: port,
            subnet: "ovn-default".into(),
            namespace: "default".into(),
            pod: name.into(),
            node: String::new(),
            addrs,
            pod_type: String::new(),
        };
        ipapi::ensure(&h.ctx.client, &rec).await.expect("record");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_orphan_is_removed_on_the_second_pass_only_and_a_reservation_never() {
        let h = Harness::start().await;
        leftovers(&h, "ghost", "10.16.0.60").await;
        leftovers(&h, "late", "10.16.0.61").await;
        // A user's reservation naming a pod that does not exist.
        let mut r = IP::new(
            "user",
            IPSpec {
                subnet: "ovn-default".into(),
                namespace: "default".into(),
                pod_name: "nobody".into(),
                ip_address: "10.16.0.62".into(),
                ..IPSpec::default()
            },
        );
        r.metadata.labels = Some([(ipapi::RESERVED_LABEL.to_owned(), "true".to_owned())].into());
        Api::<IP>::all(h.client.clone())
            .create(&PostParams::default(), &r)
            .await
            .expect("reservation");

        // The port of a node that is gone (on the join switch, its address taken there).
        let node_port = naming::node_port("gone");
        h.ctx
            .ipam
            .allocate(
                "join",
                &AllocRequest::new(&node_port, &node_port)
                    .static_ips(&["100.64.0.9".parse().expect("ip")]),
            )
            .expect("allocate");
        let mut b = Batch::new();
        b.add(
            kubeovn_ovn::northbound::SwitchPort::new("join", &node_port)
                .external_id(ext::VENDOR, naming::VENDOR)
                .external_id(ext::LS, "join")
                .external_id(ext::NODE, "gone"),
        );
        h.nb.commit(b).await.expect("node port");

        // First pass: found, only marked.
        let first = scan(&h.ctx).await.expect("scan");
        let ports: HashSet<&str> = first.ports.iter().map(|(n, _, _)| n.as_str()).collect();
        let ips: HashSet<&str> = first.ips.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(
            ports,
            HashSet::from(["ghost.default", "late.default", "node-gone"])
        );
        assert_eq!(ips, HashSet::from(["ghost.default", "late.default"]));
        let marked = sweep(&h.ctx, &Orphans::default(), first.clone())
            .await
            .expect("sweep");
        assert_eq!(marked, first);
        assert!(h.nb.switch_port("ghost.default").is_some());
        assert!(h.nb.switch_port("node-gone").is_some());
        assert!(h.get::<IP>("ghost.default").await.is_some());
        assert_eq!(h.holder("10.16.0.60").as_deref(), Some("ghost.default"));

        // The pod of `late` shows up between the passes: it is no orphan any more.
        h.create_pod(&pod("default", "late", &[], None)).await;

        // Second pass: what still is an orphan goes, with its record and address.
        let second = scan(&h.ctx).await.expect("scan");
        let next = sweep(&h.ctx, &marked, second).await.expect("sweep");
        assert!(next.is_empty(), "{next:?}");
        assert!(h.nb.switch_port("ghost.default").is_none());
        assert!(h.get::<IP>("ghost.default").await.is_none());
        assert_eq!(h.holder("10.16.0.60"), None);
        assert!(h.nb.switch_port("node-gone").is_none());
        assert_eq!(h.holder("100.64.0.9"), None);
        assert!(h.nb.switch_port("late.default").is_some());
        assert!(h.get::<IP>("late.default").await.is_some());
        assert_eq!(h.holder("10.16.0.61").as_deref(), Some("late.default"));
        assert!(h.get::<IP>("user").await.is_some());
        // Nothing left to find.
        assert!(scan(&h.ctx).await.expect("scan").is_empty());
    }
}
