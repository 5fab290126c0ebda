//! Memory and heap-allocation accounting of the IPAM, with a counting global allocator.
//!
//! `cargo bench -p kubeovn-benches --bench ipam_mem` prints bytes per pod after filling a /16 with 60,000 pods,
//! the size of empty /8 and /64 subnets, and heap allocations per hot-path operation; it fails if a target is
//! missed (<= 100 bytes per address, < 4 KiB per empty subnet, no allocation per churn operation).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use kubeovn_benches::*;
use kubeovn_ipam::{AllocRequest, Subnet, SubnetSpec};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static COUNT: AtomicUsize = AtomicUsize::new(0);

// A global allocator is `unsafe` by contract; this one only forwards to `System` and counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Relaxed);
        COUNT.fetch_add(1, Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Relaxed);
        LIVE.fetch_sub(layout.size(), Relaxed);
        COUNT.fetch_add(1, Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> usize {
    LIVE.load(Relaxed)
}

fn count() -> usize {
    COUNT.load(Relaxed)
}

/// Bytes a subnet holds on the heap, measured as the allocator sees it.
fn measure(f: impl FnOnce() -> Subnet) -> (usize, Subnet) {
    let before = live();
    let s = f();
    (live() - before, s)
}

fn main() {
    let n = 60_000;
    let names = pod_names(n + 300_000);
    let mut failed = false;
    let mut check = |ok: bool, what: &str| {
        if !ok {
            eprintln!("TARGET MISSED: {what}");
            failed = true;
        }
    };

    // Memory after filling.
    for (label, spec, addrs_per_pod) in [("v4 /16", spec16(), 1), ("dual /16+/112", spec_dual(), 2)]
    {
        let (bytes, s) = measure(|| filled(&spec, &names, n));
        let per_pod = bytes as f64 / n as f64;
        let per_addr = per_pod / addrs_per_pod as f64;
        println!(
            "{label}: {n} pods, {bytes} bytes: {per_pod:.1} bytes/pod, {per_addr:.1} bytes/address"
        );
        check(per_addr <= 100.0, "<= 100 bytes per allocated address");
        drop(s);
    }
    for (label, spec) in [
        ("/8", spec8()),
        ("/64", SubnetSpec::new("v6", "fd00::/64", "fd00::1")),
        (
            "/16+/64 dual",
            SubnetSpec::new("d", "10.1.0.0/16,fd00::/64", "10.1.0.1,fd00::1"),
        ),
    ] {
        let (bytes, _s) = measure(|| Subnet::new(&spec, 1).expect("spec"));
        println!("empty {label}: {bytes} bytes");
        check(bytes < 4096, "empty subnet under 4 KiB");
    }

    // Heap allocations per operation.
    let mut s = filled(&spec16(), &names, 0);
    let c0 = count();
    for name in &names[..n] {
        black_box(s.allocate(&AllocRequest::new(name, "eth0")).expect("room"));
    }
    println!(
        "fill /16 next-free: {:.4} allocations/op (amortized table growth)",
        (count() - c0) as f64 / n as f64
    );

    // Churn at 50%: after a warm-up, releases and allocations reuse slots, names and table space.
    let live_pods = 32_768;
    let mut s = filled(&spec16(), &names, live_pods);
    let mut slots: Vec<usize> = (0..live_pods).collect();
    let mut r = XorShift(5);
    let mut next = live_pods;
    let mut step = |s: &mut Subnet, r: &mut XorShift, slots: &mut [usize]| {
        let v = r.below(live_pods);
        black_box(s.release(&names[slots[v]], "eth0"));
        black_box(
            s.allocate(&AllocRequest::new(&names[next], "eth0"))
                .expect("room"),
        );
        slots[v] = next;
        next += 1;
    };
    for _ in 0..100_000 {
        step(&mut s, &mut r, &mut slots);
    }
    let c0 = count();
    let ops = 100_000;
    for _ in 0..ops {
        step(&mut s, &mut r, &mut slots);
    }
    let per = (count() - c0) as f64 / (2 * ops) as f64;
    println!("churn 50% /16 (steady state): {per:.4} allocations/op");
    check(per < 0.01, "no heap allocation per churn operation");

    // Idempotent re-allocation and queries allocate nothing.
    let c0 = count();
    for &i in &slots[..1000] {
        black_box(
            s.allocate(&AllocRequest::new(&names[i], "eth0"))
                .expect("live"),
        );
        black_box(s.get(&names[i], "eth0"));
    }
    let per = (count() - c0) as f64 / 2000.0;
    println!("repeat allocate + get: {per:.4} allocations/op");
    check(per == 0.0, "no allocation on repeat allocate / get");

    // Static requests in random order, then release in random order.
    let mut ips = static_ips(&spec16(), n);
    shuffle(&mut ips, 3);
    let mut s = Subnet::new(&spec16(), 1).expect("spec");
    let c0 = count();
    for (name, ip) in names.iter().zip(&ips) {
        black_box(
            s.allocate(&AllocRequest::new(name, "eth0").static_ips(ip))
                .expect("free"),
        );
    }
    println!(
        "static 60k random order: {:.4} allocations/op (tables and range tree growth)",
        (count() - c0) as f64 / n as f64
    );
    let mut order: Vec<&String> = names[..n].iter().collect();
    shuffle(&mut order, 4);
    let c0 = count();
    for name in order {
        black_box(s.release(name, "eth0"));
    }
    println!(
        "release 60k random order: {:.4} allocations/op (range tree growth)",
        (count() - c0) as f64 / n as f64
    );

    if failed {
        std::process::exit(1);
    }
}
