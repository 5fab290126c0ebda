//! The IPAM rebuild at start: every source at once, so no address still in use anywhere is handed out again.
//! What pods and nodes deleted while the controller was down left behind (ports, the controller's IP
//! records) is found in the same pass, from the same lists, and not restored: [`super::gc::at_start`]
//! removes it before any handler runs.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kubeovn_ipam::{Allocation, Mac, RestoreReport};
use std::sync::Arc;

use super::api::Listed;
use super::error::Result;
use super::gc::{self, Orphans};
use super::podstore::PodStore;
use super::subnet_spec::{conditions_of, info_from_crd};
use super::{plan, Ctx, SubnetInfo};
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

/// Subnet objects in the order their claims on addresses count at a rebuild: the built-in subnets, then those
/// with a logical switch already, then those validated before, then the oldest.
fn by_precedence(ctx: &Ctx, mut objs: Vec<Arc<Decoded<Subnet>>>) -> Vec<Arc<Decoded<Subnet>>> {
    let c = &ctx.config;
    objs.sort_by_cached_key(|o| {
        let name = o.name_any();
        (
            name != c.join_subnet.name && name != c.default_subnet.name,
            ctx.nb.switch(&name).is_none(),
            !conditions_of(o).is_validated(),
            o.creation_timestamp().map(|t| t.0),
            name,
        )
    });
    objs
}

/// Loads subnets and pools into the allocator and restores every allocation found: `recs` (from
/// [`object_records`]), the IP records `ips` (both gathered while the northbound replica filled) and the
/// northbound ports; returns what pods and nodes that no longer exist left behind, not restored.
pub(crate) fn rebuild(
    ctx: &Ctx,
    builtin: &[SubnetInfo],
    mut recs: Vec<Allocation>,
    ips: Vec<Listed>,
) -> Result<(RestoreReport, Orphans)> {
    for s in builtin {
        ctx.views.install(s.clone())?;
    }
    for obj in by_precedence(ctx, ctx.kinds.list::<Decoded<Subnet>>()) {
        match info_from_crd(&ctx.config, &obj) {
            Ok(info) => {
                if let Err(e) = ctx.views.admit(info) {
                    tracing::warn!(subnet = %obj.name_any(), error = %e, "subnet not loaded at rebuild");
                }
            }
            Err(e) => {
                tracing::warn!(subnet = %obj.name_any(), error = %e, "subnet not loaded at rebuild")
            }
        }
    }
    for p in ctx.kinds.list::<Decoded<IPPool>>() {
        if let Err(e) = ctx.views.install_pool(&p) {
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
                ctx.views.reservations().restored(&r.name, a.clone());
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

#[cfg(test)]
mod tests {
    use crate::annotations::{ALLOCATED, IP_ADDRESS};
    use crate::controller::framework::Key;
    use crate::controller::testing::{pod, Harness};
    use crate::controller::PodInfo;
    use crate::crd::{IPSpec, IP};
    use kube::api::{Api, PostParams};
    use kubeovn_ovn::northbound::Northbound;

    /// Pods `default/<name>` handled by `h`: their annotations and IP records, as the API server holds them.
    async fn handled(h: &Harness, names: &[&str]) -> Vec<(PodInfo, IP)> {
        let mut out = Vec::new();
        for n in names {
            h.create_pod(&pod("default", n, &[], Some("n1"))).await;
            h.run_pod(Key::namespaced("default", n)).await.expect("run");
            let p: PodInfo = h.get_in("default", n).await.expect("pod");
            let r: IP = h.get(&format!("{n}.default")).await.expect("record");
            out.push((p, r));
        }
        out
    }

    /// The object as a new API server takes it: no server-set metadata.
    fn fresh<K: kube::Resource>(mut o: K) -> K {
        let m = o.meta_mut();
        m.resource_version = None;
        m.uid = None;
        m.creation_timestamp = None;
        m.managed_fields = None;
        o
    }

    fn ip_of(p: &PodInfo) -> String {
        p.annotation_map().get(IP_ADDRESS).cloned().expect("ip")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restart_keeps_every_address_in_use_and_frees_what_went_away() {
        let h = Harness::start().await;
        let objs = handled(&h, &["a", "b", "c"]).await;
        let [(a, ra), (b, _), (c, rc)] = <[_; 3]>::try_from(objs).expect("three");
        let (ip_a, ip_b, ip_c) = (ip_of(&a), ip_of(&b), ip_of(&c));
        let using = h.ctx.ipam.stats("ovn-default").expect("stats").v4.using;

        // Down meanwhile: `c` was deleted (port and record left behind); `b`'s annotations were lost (only
        // its port says its address, Kube-OVN #4304); a user reserved `a`'s address.
        let clashing = ip_a.clone();
        let mut h = h
            .restart_with(|client| async move {
                let pods: Api<PodInfo> = Api::namespaced(client.clone(), "default");
                let ips: Api<IP> = Api::all(client);
                let pp = PostParams::default();
                pods.create(&pp, &fresh(a)).await.expect("a");
                pods.create(&pp, &pod("default", "b", &[], Some("n1")))
                    .await
                    .expect("b");
                ips.create(&pp, &fresh(ra)).await.expect("record a");
                ips.create(&pp, &fresh(rc)).await.expect("record c");
                let clash = IP::new(
                    "clash",
                    IPSpec {
                        subnet: "ovn-default".into(),
                        ip_address: clashing,
                        ..IPSpec::default()
                    },
                );
                ips.create(&pp, &clash).await.expect("clash");
            })
            .await;

        // Kept: `a` (annotations, record) and `b` (its port), each once; the conflicting reservation was
        // not applied on top.
        assert_eq!(h.holder(&ip_a).as_deref(), Some("a.default"));
        assert_eq!(h.holder(&ip_b).as_deref(), Some("b.default"));
        // Freed at start: `c`'s port, record and address.
        assert!(h.nb.switch_port("c.default").is_none());
        assert!(h.get::<IP>("c.default").await.is_none());
        assert_eq!(h.holder(&ip_c), None);
        assert_eq!(
            h.ctx.ipam.stats("ovn-default").expect("stats").v4.using,
            using - 1
        );
        // The reservation stays a user's record; deleting it frees nothing of `a`'s (a later record, seen
        // by the same watch, shows the delete was handled).
        assert!(h.get::<IP>("clash").await.is_some());
        h.serve_kind::<crate::controller::ip::IpReservations>();
        let ips: Api<IP> = Api::all(h.client.clone());
        ips.delete("clash", &Default::default())
            .await
            .expect("delete clash");
        let probe = IP::new(
            "probe",
            IPSpec {
                subnet: "ovn-default".into(),
                ip_address: "10.16.0.200".into(),
                ..IPSpec::default()
            },
        );
        ips.create(&PostParams::default(), &probe)
            .await
            .expect("probe");
        h.until("probe reserved", || {
            h.holder("10.16.0.200").as_deref() == Some("probe")
        })
        .await;
        assert_eq!(h.holder(&ip_a).as_deref(), Some("a.default"));

        // `a` has nothing to redo; `b` is given its own address back; a new pod takes neither.
        let before = h.api_pod("default", "a").await;
        h.run_pod(Key::namespaced("default", "a")).await.expect("a");
        assert_eq!(
            h.api_pod("default", "a").await.metadata.resource_version,
            before.metadata.resource_version
        );
        h.run_pod(Key::namespaced("default", "b")).await.expect("b");
        assert_eq!(ip_of(&h.api_pod("default", "b").await), ip_b);
        h.create_pod(&pod("default", "d", &[], None)).await;
        h.run_pod(Key::namespaced("default", "d")).await.expect("d");
        let d = h.api_pod("default", "d").await;
        assert_eq!(
            d.annotation_map().get(ALLOCATED).map(String::as_str),
            Some("true")
        );
        assert!(![ip_a, ip_b].contains(&ip_of(&d)), "{}", ip_of(&d));
    }

    /// Addresses only annotations record (no port, no record yet: a cluster handed over from Kube-OVN, or
    /// ports lost) are restored too: a new pod is not given the first address a pod's annotation names.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_start_restores_what_pod_and_node_annotations_record() {
        use crate::annotations::{LOGICAL_SWITCH, MAC_ADDRESS};
        use k8s_openapi::api::core::v1::Node;

        let h = Harness::start_with(
            crate::controller::testing::config(),
            kubeovn_ovn::memdb::MemDb::new_nb(),
            |client| async move {
                let pp = PostParams::default();
                let mut n = Node::default();
                n.metadata.name = Some("n1".into());
                n.metadata.annotations = Some(
                    [
                        (IP_ADDRESS, "100.64.0.7"),
                        (MAC_ADDRESS, "0a:00:00:00:00:07"),
                        (LOGICAL_SWITCH, "join"),
                        (ALLOCATED, "true"),
                    ]
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .into(),
                );
                Api::<Node>::all(client.clone())
                    .create(&pp, &n)
                    .await
                    .expect("node");
                let x = pod(
                    "default",
                    "x",
                    &[
                        (IP_ADDRESS, "10.16.0.2"),
                        (MAC_ADDRESS, "0a:00:00:00:00:02"),
                        (LOGICAL_SWITCH, "ovn-default"),
                        (ALLOCATED, "true"),
                    ],
                    None,
                );
                Api::<PodInfo>::namespaced(client, "default")
                    .create(&pp, &x)
                    .await
                    .expect("pod");
            },
        )
        .await;
        assert_eq!(h.holder("100.64.0.7").as_deref(), Some("node-n1"));
        assert_eq!(h.holder("10.16.0.2").as_deref(), Some("x.default"));
        h.create_pod(&pod("default", "y", &[], None)).await;
        h.run_pod(Key::namespaced("default", "y")).await.expect("y");
        let y = h.api_pod("default", "y").await;
        assert_ne!(ip_of(&y), "10.16.0.2");
        // `x` gets its port with its own address and MAC.
        h.run_pod(Key::namespaced("default", "x")).await.expect("x");
        let lsp = h.nb.switch_port("x.default").expect("port");
        assert_eq!(
            lsp.addresses,
            vec!["0a:00:00:00:00:02 10.16.0.2".to_owned()]
        );
    }
}
