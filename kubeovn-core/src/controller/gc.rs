//! Garbage collection, two-phase: an orphan found in one pass (a kube-ovn port or IP record whose pod or
//! node is gone) is removed in the next pass if it is still an orphan, so objects created between a list and
//! a check are never removed. Only rows with `external_ids:vendor=kube-ovn` are considered.

use std::collections::HashSet;
use std::sync::Arc;

use kubeovn_ovn::northbound::Batch;

use super::error::Result;
use super::{ip, split_key, Ctx};
use crate::naming::{self, external_ids as ext};

/// What one pass found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Orphans {
    /// Switch ports (name, owner key, subnet).
    pub ports: HashSet<(String, String, String)>,
    /// IP records (name, owner key, subnet).
    pub ips: HashSet<(String, String, String)>,
}

fn owner_alive(ctx: &Ctx, owner: &str, node: Option<&str>) -> bool {
    if let Some(n) = node {
        return ctx.node(n).is_some();
    }
    let (ns, name) = split_key(owner);
    ctx.pods.contains(ns, name)
}

/// Finds the orphans now.
pub(crate) async fn scan(ctx: &Ctx) -> Result<Orphans> {
    let mut o = Orphans::default();
    for lsp in ctx
        .nb
        .switch_ports_by_external_id(ext::VENDOR, naming::VENDOR)
    {
        let ls = lsp.external_ids.get(ext::LS).cloned().unwrap_or_default();
        let node = lsp.external_ids.get(ext::NODE).map(String::as_str);
        let owner = match (lsp.external_ids.get(ext::POD), node) {
            (Some(p), _) => p.clone(),
            (None, Some(_)) => lsp.name.clone(),
            // Router patch ports and others carry no owner.
            (None, None) => continue,
        };
        let node = if lsp.external_ids.contains_key(ext::POD) {
            None
        } else {
            node
        };
        if !owner_alive(ctx, &owner, node) {
            o.ports.insert((lsp.name.clone(), owner, ls));
        }
    }
    for r in ip::list_records(&ctx.client).await? {
        let alive = if r.namespace.is_empty() {
            ctx.node(&r.pod).is_some()
        } else {
            ctx.pods.contains(&r.namespace, &r.pod)
        };
        if !alive {
            o.ips.insert((r.name.clone(), r.owner(), r.subnet.clone()));
        }
    }
    Ok(o)
}

/// Removes what was an orphan in `marked` and still is in `now`; returns what to mark for the next pass.
pub(crate) async fn sweep(ctx: &Ctx, marked: &Orphans, now: Orphans) -> Result<Orphans> {
    let ports: Vec<_> = now.ports.intersection(&marked.ports).cloned().collect();
    let ips: Vec<_> = now.ips.intersection(&marked.ips).cloned().collect();
    if !ports.is_empty() {
        let mut b = Batch::new();
        for (name, _, _) in &ports {
            b.delete_switch_port(name);
        }
        ctx.writer.commit(b).await?;
        tracing::info!(ports = ports.len(), "garbage collected orphaned ports");
    }
    for (name, _, _) in &ips {
        ip::delete(ctx, name).await?;
    }
    if !ips.is_empty() {
        tracing::info!(ips = ips.len(), "garbage collected orphaned IP records");
    }
    for (name, owner, subnet) in ports.iter().chain(&ips) {
        // Released only after the port is gone, so the address is never in two places.
        if let Err(e) = ctx.ipam.release(subnet, owner, name) {
            tracing::debug!(subnet, owner, error = %e, "release at gc");
        }
    }
    let mut next = now;
    for p in &ports {
        next.ports.remove(p);
    }
    for i in &ips {
        next.ips.remove(i);
    }
    Ok(next)
}

/// Runs a pass every `gc_interval`, the first one interval after start (not competing with the start's
/// work queue).
pub(crate) async fn run(ctx: Arc<Ctx>) {
    let mut marked = Orphans::default();
    loop {
        tokio::time::sleep(ctx.config.gc_interval).await;
        match scan(&ctx).await {
            Ok(now) => match sweep(&ctx, &marked, now).await {
                Ok(next) => marked = next,
                Err(e) => tracing::warn!(error = %e, "gc sweep"),
            },
            Err(e) => tracing::warn!(error = %e, "gc scan"),
        }
    }
}
