//! Feeds arbitrary Services and EndpointSlices (what any API user can write; addresses from a small pool or
//! any text) to the translation into load balancer VIPs: never a panic, and what comes out is well formed:
//! every VIP is `ip:port`, every backend `ip:port` of the VIP's family, and a node's backends
//! (internalTrafficPolicy Local) are among the VIP's.
#![no_main]

use std::net::SocketAddr;
use std::sync::Arc;

use arbitrary::Arbitrary;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

const POOL: &[&str] = &[
    "10.96.0.10",
    "fd00:10:96::10",
    "10.16.0.5",
    "10.16.0.6",
    "fd00::5",
    "None",
    "",
    "::",
    "0.0.0.0",
    "10.16.0.5:80",
    "[fd00::5]",
];

#[derive(Arbitrary, Debug)]
enum Addr {
    Pool(u8),
    Raw(String),
}

impl Addr {
    fn text(&self) -> String {
        match self {
            Addr::Pool(i) => POOL[usize::from(*i) % POOL.len()].to_owned(),
            Addr::Raw(s) => s.clone(),
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Port {
    name: Option<u8>,
    port: i32,
    proto: u8,
}

#[derive(Arbitrary, Debug)]
struct Ep {
    addrs: Vec<Addr>,
    ready: Option<bool>,
    serving: Option<bool>,
    terminating: Option<bool>,
    node: Option<u8>,
}

#[derive(Arbitrary, Debug)]
struct Slice {
    family: u8,
    ports: Vec<(Option<u8>, Option<i32>, u8)>,
    eps: Vec<Ep>,
}

#[derive(Arbitrary, Debug)]
struct In {
    kind: u8,
    cluster_ips: Vec<Addr>,
    external_ips: Vec<Addr>,
    ingress: Vec<Addr>,
    affinity: Option<Option<i32>>,
    local: bool,
    ports: Vec<Port>,
    slices: Vec<Slice>,
}

fn name(n: Option<u8>) -> Value {
    n.map_or(Value::Null, |n| {
        json!(["", "http", "dns"][usize::from(n) % 3])
    })
}

fn proto(p: u8) -> &'static str {
    ["TCP", "UDP", "SCTP", "ICMP"][usize::from(p) % 4]
}

fuzz_target!(|input: In| {
    let texts = |v: &[Addr]| v.iter().map(Addr::text).collect::<Vec<_>>();
    let svc = json!({
        "metadata": {"name": "s", "namespace": "n"},
        "spec": {
            "type": (["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"][usize::from(input.kind) % 4]),
            "clusterIPs": texts(&input.cluster_ips),
            "externalIPs": texts(&input.external_ips),
            "sessionAffinity": if input.affinity.is_some() { "ClientIP" } else { "None" },
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": input.affinity.flatten()}},
            "internalTrafficPolicy": if input.local { "Local" } else { "Cluster" },
            "ports": input.ports.iter().map(|p| json!({"name": name(p.name), "port": p.port,
                "protocol": proto(p.proto)})).collect::<Vec<_>>(),
        },
        "status": {"loadBalancer": {"ingress": texts(&input.ingress).iter()
            .map(|i| json!({"ip": i})).collect::<Vec<_>>()}},
    });
    let Ok(svc) = serde_json::from_value::<Service>(svc) else {
        return;
    };
    let slices: Vec<Arc<EndpointSlice>> = input
        .slices
        .iter()
        .filter_map(|s| {
            serde_json::from_value(json!({
                "metadata": {"name": "s-1", "namespace": "n"},
                "addressType": (["IPv4", "IPv6", "FQDN"][usize::from(s.family) % 3]),
                "ports": s.ports.iter().map(|(n, p, pr)| json!({"name": name(*n), "port": p,
                    "protocol": proto(*pr)})).collect::<Vec<_>>(),
                "endpoints": s.eps.iter().map(|e| json!({
                    "addresses": texts(&e.addrs),
                    "conditions": {"ready": e.ready, "serving": e.serving, "terminating": e.terminating},
                    "nodeName": e.node.map(|n| format!("node{}", n % 3)),
                })).collect::<Vec<_>>(),
            }))
            .ok()
            .map(Arc::new)
        })
        .collect();
    let d = kubeovn_core::services::desired(&svc, &slices);
    if !kubeovn_core::services::is_balanced(&svc) {
        assert!(d.lbs.is_empty());
        return;
    }
    for (proto, lb) in &d.lbs {
        assert!(["tcp", "udp", "sctp"].contains(proto));
        for (vip, backends) in &lb.vips {
            let v: SocketAddr = vip
                .parse()
                .unwrap_or_else(|e| panic!("VIP {vip:?} is not ip:port: {e}"));
            let mut all = Vec::new();
            for b in backends.split(',').filter(|b| !b.is_empty()) {
                let b: SocketAddr = b.parse().expect("a backend is ip:port");
                assert_eq!(b.is_ipv4(), v.is_ipv4(), "{vip} -> {b}");
                all.push(b);
            }
            for node_backends in lb.by_node.get(vip).into_iter().flat_map(|m| m.values()) {
                for b in node_backends.split(',').filter(|b| !b.is_empty()) {
                    let b: SocketAddr = b.parse().expect("ip:port");
                    assert!(all.contains(&b), "{b} not among {backends}");
                }
            }
        }
    }
});
