//! The IPAM rebuild at start: every source at once, so no address still in use anywhere is handed out again.
//! What pods and nodes deleted while the controller was down left behind (ports, the controller's IP
//! records) is found in the same pass, from the same lists, and not restored: [`super::gc::at_start`]
//! removes it before any handler runs.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kubeovn_ipam::{Allocation, Mac, RestoreReport};
use std::sync::Arc;

use super::error::Result;
use super::gc::{self, Orphans};
use super::podstore::PodStore;
use super::{ip, plan, subnet, Ctx, SubnetInfo};
use crate::annotations::{NodeAnnotations, PodNetworkAnnotations, DEFAULT_PROVIDER};
use crate::crd::{Decoded, IPPool, Subnet};
use crate::naming::{self, external_ids as ext};

fn record(subnet: &str, pod: &str, nic: &str, ips: &[IpAddr], mac: Option<Mac>) -> Allocation {
    Allocation {
        subnet: subnet.to_owned(),
        pod: pod.to_owned(),
        nic: nic.to_owned(),
        v4: ips.iter().find_map(|ip| match ip {
            IpAddr::V4(a) => Some(*a),
            IpAddr::V6(_) => None,
        }),
        v6: ips.iter().find_map(|ip| match ip {
            IpAddr::V6(a) => Some(*a),
            IpAddr::V4(_) => None,
        }),
        mac,
        pool: None,
    }
}

/// The allocations Kubernetes objects record: pod annotations (what running pods use) and node annotations.
pub(crate) fn object_records(pods: &PodStore, nodes: &[Arc<Node>]) -> Vec<Allocation> {
    let mut recs = Vec::new();
    pods.for_each_annotations(|ns, name, annotations| {
        let Ok(a) = PodNetworkAnnotations::parse(annotations, DEFAULT_PROVIDER) else {
            return;
        };
        let (Some(ls), true) = (a.logical_switch.as_deref(), a.allocated) else {
            return;
        };
        recs.push(record(
            ls,
            &naming::pod_key(ns, name),
            &naming::pod_port(name, ns, DEFAULT_PROVIDER),
            &a.ip_addresses,
            a.mac_address,
        ));
    });
    for node in nodes {
        let Ok(a) = NodeAnnotations::parse(node.annotations()) else {
            continue;
        };
        let (Some(ls), true) = (a.logical_switch.as_deref(), a.allocated) else {
            continue;
        };
        let port = naming::node_port(&node.name_any());
        recs.push(record(ls, &port, &port, &a.ip_addresses, a.mac_address));
    }
    recs
}

/// Loads subnets and pools into the allocator and restores every allocation found: `recs` (from
/// [`object_records`]), the IP records `ips` (both gathered while the northbound replica filled) and the
/// northbound ports; returns what pods and nodes that no longer exist left behind, not restored.
pub(crate) fn rebuild(
    ctx: &Ctx,
    builtin: &[SubnetInfo],
    mut recs: Vec<Allocation>,
    ips: Vec<ip::Listed>,
) -> Result<(RestoreReport, Orphans)> {
    for s in builtin {
        subnet::install(ctx, s.clone())?;
    }
    for obj in subnet::by_precedence(ctx, ctx.kinds.list::<Decoded<Subnet>>()) {
        match subnet::info_from_crd(ctx, &obj) {
            Ok(info) => {
                if let Err(e) = subnet::admit(ctx, info) {
                    tracing::warn!(subnet = %obj.name_any(), error = %e, "subnet not loaded at rebuild");
                }
            }
            Err(e) => {
                tracing::warn!(subnet = %obj.name_any(), error = %e, "subnet not loaded at rebuild")
            }
        }
    }
    for p in ctx.kinds.list::<Decoded<IPPool>>() {
        if let Err(e) = super::ippool::install_pool(ctx, &p) {
            tracing::warn!(pool = %p.name_any(), error = %e, "ippool not loaded at rebuild");
        }
    }
    let t = std::time::Instant::now();
    let mut orphans = Orphans::default();
    for r in ips {
        // A user's reservation stays reserved whether or not a pod of its name exists.
        if r.ours && !gc::record_alive(ctx, &r) {
            orphans
                .ips
                .insert((r.name.clone(), r.owner(), r.subnet.clone()));
        } else if let Some(a) = r.allocation() {
            if !r.ours {
                ctx.reservations().restored(&r.name, a.clone());
            }
            recs.push(a);
        }
    }
    // Northbound ports: they hold addresses their pods' annotations may not show yet (Kube-OVN #4304).
    for lsp in ctx
        .nb
        .switch_ports_by_external_id(ext::VENDOR, naming::VENDOR)
    {
        let Some(ls) = lsp.external_ids.get(ext::LS) else {
            continue;
        };
        let Some((owner, alive)) = gc::port_owner(ctx, &lsp) else {
            continue;
        };
        if !alive {
            orphans.ports.insert((lsp.name.clone(), owner, ls.clone()));
            continue;
        }
        for a in &lsp.addresses {
            if let Some((mac, ips)) = plan::parse_port_address(a) {
                recs.push(record(ls, &owner, &lsp.name, &ips, Some(mac)));
            }
        }
    }
    let from_nb = t.elapsed();
    let n = recs.len();
    let report = ctx.ipam.restore(recs);
    tracing::info!(
        records = n,
        restored = report.restored,
        conflicts = report.conflicts.len(),
        orphaned_ports = orphans.ports.len(),
        orphaned_ips = orphans.ips.len(),
        nb_ports_ms = from_nb.as_millis() as u64,
        restore_ms = (t.elapsed() - from_nb).as_millis() as u64,
        "ipam rebuilt"
    );
    Ok((report, orphans))
}
