//! Annotation parsing and rendering per pod, as the controller does on every pod event and allocation.
//! Run: cargo bench -p kubeovn-core --bench annotations

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use kubeovn_core::annotations::{self as a, PodNetworkAnnotations};

fn allocated_pod() -> BTreeMap<String, String> {
    [
        (a::IP_ADDRESS, "10.16.0.12,fd00:10:16::c"),
        (a::MAC_ADDRESS, "00:00:00:53:6b:b6"),
        (a::CIDR, "10.16.0.0/16,fd00:10:16::/64"),
        (a::GATEWAY, "10.16.0.1,fd00:10:16::1"),
        (a::LOGICAL_SWITCH, "ovn-default"),
        (a::LOGICAL_ROUTER, "ovn-cluster"),
        (a::ALLOCATED, "true"),
        (a::ROUTED, "true"),
        (a::POD_NIC_TYPE, "veth-pair"),
        ("kubectl.kubernetes.io/restartedAt", "2024-05-01T10:00:00Z"),
        ("prometheus.io/scrape", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

fn bench(c: &mut Criterion) {
    let anns = allocated_pod();
    let empty = BTreeMap::new();
    c.bench_function("parse allocated pod (ovn)", |b| {
        b.iter(|| PodNetworkAnnotations::parse(black_box(&anns), "ovn"))
    });
    c.bench_function("parse unannotated pod (ovn)", |b| {
        b.iter(|| PodNetworkAnnotations::parse(black_box(&empty), "ovn"))
    });
    let p = PodNetworkAnnotations::parse(&anns, "ovn").unwrap_or_default();
    c.bench_function("allocation patch + merge patch JSON", |b| {
        b.iter(|| a::merge_patch(&black_box(&p).allocation_patch("ovn")).to_string())
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
