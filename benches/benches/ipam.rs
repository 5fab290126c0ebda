//! IPAM timings (criterion). Per-operation time = reported time / elements (see throughput).
//!
//! `cargo bench -p kubeovn-benches --bench ipam -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kubeovn_benches::*;
use kubeovn_ipam::{AllocRequest, Ipam, SharedIpam, Subnet};

const N: usize = 60_000;
const CHURN: usize = 100_000;

fn fill(c: &mut Criterion) {
    let names = pod_names(N);
    let mut g = c.benchmark_group("fill_60k");
    g.sample_size(10).throughput(Throughput::Elements(N as u64));
    for (label, spec) in [
        ("v4_16", spec16()),
        ("dual_16_112", spec_dual()),
        ("v4_8", spec8()),
    ] {
        g.bench_function(label, |b| {
            b.iter_batched(
                || Subnet::new(&spec, 1).expect("spec"),
                |mut s| {
                    for n in &names {
                        black_box(s.allocate(&AllocRequest::new(n, "eth0")).expect("room"));
                    }
                    s
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

fn release(c: &mut Criterion) {
    let names = pod_names(N);
    let mut shuffled = names.clone();
    shuffle(&mut shuffled, 7);
    let mut g = c.benchmark_group("release_60k");
    g.sample_size(10).throughput(Throughput::Elements(N as u64));
    for (label, spec) in [
        ("v4_16", spec16()),
        ("dual_16_112", spec_dual()),
        ("v4_8", spec8()),
    ] {
        for (order, list) in [("in_order", &names), ("random", &shuffled)] {
            g.bench_function(format!("{label}/{order}"), |b| {
                b.iter_batched(
                    || filled(&spec, &names, N),
                    |mut s| {
                        for n in list.iter() {
                            black_box(s.release(n, "eth0"));
                        }
                        s
                    },
                    BatchSize::PerIteration,
                )
            });
        }
    }
    g.finish();
}

fn churn(c: &mut Criterion) {
    // 50% use: 32,768 live pods in a /16; each step releases a random live pod and allocates a new one.
    let live = 32_768;
    let names = pod_names(live + CHURN);
    let mut r = XorShift(99);
    let victims: Vec<usize> = (0..CHURN).map(|_| r.below(live)).collect();
    let mut g = c.benchmark_group("churn_50pct_100k_pairs");
    g.sample_size(10)
        .throughput(Throughput::Elements(CHURN as u64));
    for (label, spec) in [
        ("v4_16", spec16()),
        ("dual_16_112", spec_dual()),
        ("v4_8", spec8()),
    ] {
        g.bench_function(label, |b| {
            b.iter_batched(
                || {
                    let s = filled(&spec, &names, live);
                    let slots: Vec<usize> = (0..live).collect();
                    (s, slots)
                },
                |(mut s, mut slots)| {
                    for (i, &v) in victims.iter().enumerate() {
                        black_box(s.release(&names[slots[v]], "eth0"));
                        let new = live + i;
                        black_box(
                            s.allocate(&AllocRequest::new(&names[new], "eth0"))
                                .expect("room"),
                        );
                        slots[v] = new;
                    }
                    s
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

fn statics(c: &mut Criterion) {
    let names = pod_names(N);
    let mut g = c.benchmark_group("static_60k_random");
    g.sample_size(10).throughput(Throughput::Elements(N as u64));
    for (label, spec) in [
        ("v4_16", spec16()),
        ("dual_16_112", spec_dual()),
        ("v4_8", spec8()),
    ] {
        let mut ips = static_ips(&spec, N);
        shuffle(&mut ips, 3);
        // One contiguous array in request order: a caller has the request's addresses at hand, while the
        // shuffled per-request vectors would add a cache miss per request that is the harness's, not the
        // allocator's.
        let per = ips[0].len();
        let flat: Vec<IpAddr> = ips.iter().flatten().copied().collect();
        let ips: Vec<&[IpAddr]> = flat.chunks(per).collect();
        g.bench_function(label, |b| {
            b.iter_batched(
                || Subnet::new(&spec, 1).expect("spec"),
                |mut s| {
                    for (n, ip) in names.iter().zip(&ips) {
                        let r = AllocRequest::new(n, "eth0").static_ips(ip);
                        black_box(s.allocate(&r).expect("free"));
                    }
                    s
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

fn restore(c: &mut Criterion) {
    let mut g = c.benchmark_group("restore");
    g.sample_size(10);
    for (label, spec, n) in [
        ("60k_v4_16", spec16(), N),
        ("60k_dual_16_112", spec_dual(), N),
        ("60k_v4_8", spec8(), N),
        ("100k_v4_8", spec8(), 100_000),
    ] {
        let names = pod_names(n);
        let recs = records(&spec, &names, n);
        let mut shuffled = recs.clone();
        shuffle(&mut shuffled, 11);
        g.throughput(Throughput::Elements(n as u64));
        for (order, list) in [("in_order", &recs), ("shuffled", &shuffled)] {
            g.bench_function(format!("{label}/{order}"), |b| {
                b.iter_batched(
                    || {
                        let mut ipam = Ipam::with_seed(1);
                        ipam.add_or_update_subnet(&spec).expect("spec");
                        (ipam, list.clone())
                    },
                    |(mut ipam, list)| {
                        let rep = ipam.restore(list);
                        assert!(rep.conflicts.is_empty());
                        ipam
                    },
                    BatchSize::PerIteration,
                )
            });
        }
    }
    g.finish();
}

/// Allocates `n` pods per subnet, one thread per subnet, through the shared handle; with `handles`, each thread
/// takes its subnet's own handle once instead of going through the registry on every call.
fn run_threads(subnets: &[&str], names: &Arc<Vec<String>>, n: usize, handles: bool) -> Duration {
    let shared = Arc::new(SharedIpam::with_seed(1));
    for (i, s) in subnets.iter().enumerate() {
        let spec = kubeovn_ipam::SubnetSpec::new(*s, format!("10.{}.0.0/16", 20 + i), "");
        shared.add_or_update_subnet(&spec).expect("spec");
    }
    let start = Instant::now();
    std::thread::scope(|scope| {
        for s in subnets {
            let shared = shared.clone();
            let names = names.clone();
            scope.spawn(move || {
                if handles {
                    let sub = shared.subnet(s).expect("subnet");
                    for name in &names[..n] {
                        let mut g = sub.lock().expect("not poisoned");
                        black_box(g.allocate(&AllocRequest::new(name, "eth0")).expect("room"));
                    }
                } else {
                    for name in &names[..n] {
                        let r = shared.allocate(s, &AllocRequest::new(name, "eth0"));
                        black_box(r.expect("room"));
                    }
                }
            });
        }
    });
    start.elapsed()
}

fn threads(c: &mut Criterion) {
    let n = 30_000;
    let names = Arc::new(pod_names(n));
    let mut g = c.benchmark_group("shared_handle_30k_per_thread");
    g.sample_size(10);
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("1_thread", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| run_threads(&["a"], &names, n, false))
                .sum()
        })
    });
    g.throughput(Throughput::Elements(2 * n as u64));
    g.bench_function("2_threads_2_subnets", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| run_threads(&["a", "b"], &names, n, false))
                .sum()
        })
    });
    g.bench_function("2_threads_2_subnets_handles", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| run_threads(&["a", "b"], &names, n, true))
                .sum()
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = fill, release, churn, statics, restore, threads
}
criterion_main!(benches);
