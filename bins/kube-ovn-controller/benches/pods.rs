//! Controller benchmark (`cargo bench -p kube-ovn-controller --bench pods`), no criterion: the controller
//! binary as a child process against the in-memory test API server and a real NB ovsdb-server preloaded
//! with foreign ports.
//!
//! 1. throughput: `CTRL_BENCH_PODS` pods (default 5,000) created at once; pods/s until every pod is
//!    annotated (the annotation is written after the port is committed and seen in NB); controller CPU
//!    time and RSS growth per pod.
//! 2. latency: `CTRL_BENCH_RATE_PODS` pods (default 1,000) at `CTRL_BENCH_RATE` pods/s (default 100):
//!    p50/p99/max from create to annotated.
//! 3. restart: pods topped up to `CTRL_BENCH_RESTART_PODS` (default 50,000), the controller killed
//!    (SIGKILL) and started again: time from spawn until a pod created after the restart is annotated
//!    (its key is queued behind every existing pod's).
//!
//! NB is preloaded with `CTRL_BENCH_PRELOAD` ports (default 50,000). `CTRL_BENCH_PERF=FILE` records the
//! restart system-wide with `perf record` (every process: controller, ovsdb-server, the test API server).
//! `CTRL_BENCH_BIN=PATH` benchmarks that controller binary instead of this build's (before/after comparisons).
//! `cargo test --benches` runs a small smoke version.

#![allow(clippy::unwrap_used)]

#[path = "../tests/common/mod.rs"]
mod common;
mod support;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::ResourceExt;
use kubeovn_ovn::northbound::{Batch, LogicalSwitch, Northbound, OvsdbNorthbound, SwitchPort};
use serde_json::json;
use support::{env, pct, spawn_controller, start_api, usage};

type Seen = Arc<Mutex<HashMap<String, Instant>>>;

/// Records when each pod is first seen annotated.
fn watch_annotated(client: kube::Client) -> Seen {
    let seen: Seen = Arc::new(Mutex::new(HashMap::new()));
    let s = seen.clone();
    tokio::spawn(async move {
        let api: kube::Api<Pod> = kube::Api::namespaced(client, "bench");
        let stream = watcher::watcher(api, watcher::Config::default());
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            let (watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = (match ev {
                Ok(e) => e,
                Err(_) => continue,
            }) else {
                continue;
            };
            if p.annotations()
                .get("ovn.kubernetes.io/allocated")
                .map(String::as_str)
                == Some("true")
            {
                s.lock()
                    .unwrap()
                    .entry(p.name_any())
                    .or_insert_with(Instant::now);
            }
        }
    });
    seen
}

fn pod(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "bench"},
        "spec": {"nodeName": "bench-node", "containers": [{"name": "c", "image": "pause"}]}
    })
}

async fn wait_all(seen: &Seen, names: &[String], limit: Duration) -> Instant {
    let deadline = Instant::now() + limit;
    loop {
        {
            let s = seen.lock().unwrap();
            if names.iter().all(|n| s.contains_key(n)) {
                return names.iter().map(|n| s[n]).max().unwrap();
            }
            if Instant::now() > deadline {
                let missing = names.iter().filter(|n| !s.contains_key(*n)).count();
                panic!("{missing} pods not annotated after {limit:?}");
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let n_pods = env("CTRL_BENCH_PODS", if full { 5_000 } else { 200 });
    let n_rate = env("CTRL_BENCH_RATE_PODS", if full { 1_000 } else { 50 });
    let rate = env("CTRL_BENCH_RATE", 100).max(1);
    let n_restart = env("CTRL_BENCH_RESTART_PODS", if full { 50_000 } else { 400 });
    let preload = env("CTRL_BENCH_PRELOAD", if full { 50_000 } else { 1_000 });
    if !common::have("ovsdb-server") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("ctrl-bench")
        .tempdir()
        .unwrap();
    let nbs = common::start_nb().expect("ovsdb-server");
    let nb_addr = nbs.unix_remote();

    // NB preload: foreign ports (no vendor=kube-ovn), so the controller only replicates them.
    let t = Instant::now();
    let nb = OvsdbNorthbound::connect(&nb_addr).await.unwrap();
    nb.commit({
        let mut b = Batch::new();
        b.add(LogicalSwitch::new("preload"));
        b
    })
    .await
    .unwrap();
    for chunk in (0..preload).collect::<Vec<_>>().chunks(10_000) {
        let mut b = Batch::new();
        for i in chunk {
            b.add(
                SwitchPort::new("preload", format!("pre-{i}"))
                    .addresses([format!(
                        "0a:00:00:{:02x}:{:02x}:{:02x} 10.200.{}.{}",
                        i >> 16 & 255,
                        i >> 8 & 255,
                        i & 255,
                        i >> 8 & 255,
                        i & 255
                    )])
                    .external_id("owner", "someone-else"),
            );
        }
        nb.commit(b).await.unwrap();
    }
    println!(
        "preloaded {preload} NB ports in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let (api, kubeconfig) = start_api(&dir.path().join("kubeconfig")).await;
    let store = api.store();
    let pod_info = store.resource("", "v1", "pods").unwrap();
    let client = api.client().unwrap();
    let seen = watch_annotated(client.clone());

    let mut child = spawn_controller(dir.path(), &kubeconfig, &nb_addr, 0);
    let pid = child.id();
    // Ready: a warm-up pod is annotated.
    store
        .create(&pod_info, Some("bench"), pod("warm-up"))
        .unwrap();
    wait_all(&seen, &["warm-up".to_owned()], Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // 1. Throughput.
    let names: Vec<String> = (0..n_pods).map(|i| format!("p-{i}")).collect();
    let (cpu0, rss0) = usage(pid);
    let t0 = Instant::now();
    for n in &names {
        store.create(&pod_info, Some("bench"), pod(n)).unwrap();
    }
    let created = t0.elapsed();
    let last = wait_all(&seen, &names, Duration::from_secs(600)).await;
    let took = last.duration_since(t0).as_secs_f64();
    let (cpu1, rss1) = usage(pid);
    println!(
        "throughput: {n_pods} pods created in {:.2} s, all annotated with their port in NB after {took:.2} s: {:.0} pods/s",
        created.as_secs_f64(),
        n_pods as f64 / took
    );
    println!(
        "controller: {:.3} ms CPU/pod, RSS {:.1} -> {:.1} MiB ({:.2} KiB/pod)",
        (cpu1 - cpu0) * 1000.0 / n_pods as f64,
        rss0 / 1048576.0,
        rss1 / 1048576.0,
        (rss1 - rss0) / 1024.0 / n_pods as f64
    );

    // 2. Latency at a steady rate.
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let mut created_at = Vec::with_capacity(n_rate);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let rnames: Vec<String> = (0..n_rate).map(|i| format!("r-{i}")).collect();
    for n in &rnames {
        tick.tick().await;
        created_at.push(Instant::now());
        store.create(&pod_info, Some("bench"), pod(n)).unwrap();
    }
    wait_all(&seen, &rnames, Duration::from_secs(120)).await;
    let mut lat: Vec<f64> = {
        let s = seen.lock().unwrap();
        rnames
            .iter()
            .zip(&created_at)
            .map(|(n, c)| s[n].duration_since(*c).as_secs_f64() * 1000.0)
            .collect()
    };
    let p50 = pct(&mut lat, 0.5);
    let p99 = pct(&mut lat, 0.99);
    let max = pct(&mut lat, 1.0);
    println!("latency at {rate} pods/s ({n_rate} pods): p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms");

    // Every annotated pod has its port, with distinct addresses.
    let total = 1 + n_pods + n_rate;
    let nb_ports = nb.switch_ports_by_external_id("ls", "ovn-default");
    assert_eq!(nb_ports.len(), total, "ports in NB");
    let mut addrs: Vec<&String> = nb_ports.iter().flat_map(|p| &p.addresses).collect();
    addrs.sort();
    addrs.dedup();
    assert_eq!(addrs.len(), total, "distinct addresses");

    // 3. Restart with many pods.
    let more: Vec<String> = (total..n_restart.max(total))
        .map(|i| format!("s-{i}"))
        .collect();
    let rss_before = usage(pid).1;
    let t = Instant::now();
    for n in &more {
        store.create(&pod_info, Some("bench"), pod(n)).unwrap();
    }
    wait_all(&seen, &more, Duration::from_secs(900)).await;
    let pods_now = total + more.len();
    let rss_after = usage(pid).1;
    // The slope over many pods: the allocator's slack from start-up no longer hides the growth.
    println!(
        "topped up to {pods_now} pods in {:.1} s; controller RSS {:.1} -> {:.1} MiB: {:.2} KiB/pod from {total} to {pods_now} pods",
        t.elapsed().as_secs_f64(),
        rss_before / 1048576.0,
        rss_after / 1048576.0,
        (rss_after - rss_before) / 1024.0 / more.len().max(1) as f64
    );
    child.kill().unwrap();
    child.wait().unwrap();
    // CTRL_BENCH_PERF=FILE: a system-wide `perf record` of the restart's first 4 s.
    let perf = std::env::var("CTRL_BENCH_PERF").ok().map(|out| {
        let p = Command::new("perf")
            .args(["record", "-a", "-q", "-o", &out, "--", "sleep", "4"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        p
    });
    let t = Instant::now();
    let mut child = spawn_controller(dir.path(), &kubeconfig, &nb_addr, 1);
    store
        .create(&pod_info, Some("bench"), pod("zz-after-restart"))
        .unwrap();
    wait_all(
        &seen,
        &["zz-after-restart".to_owned()],
        Duration::from_secs(300),
    )
    .await;
    let restart = t.elapsed().as_secs_f64();
    let (cpu, rss) = usage(child.id());
    // The pods queued at start may still be in hand: wait for the controller to say they are done.
    let deadline = Instant::now() + Duration::from_secs(120);
    let log = loop {
        let log = std::fs::read_to_string(dir.path().join("controller-1.log")).unwrap_or_default();
        if log.contains("initial pods handled") || Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The controller's own start timeline.
    for l in log.lines().filter(|l| {
        [
            "northbound replica ready",
            "informers listed",
            "ipam rebuilt",
            "controller started",
            "initial pods handled",
        ]
        .iter()
        .any(|m| l.contains(m))
    }) {
        println!("  controller: {l}");
    }
    let rebuilt = log
        .lines()
        .find(|l| l.contains("ipam rebuilt"))
        .unwrap_or("")
        .to_owned();
    println!(
        "restart with {pods_now} pods and {} NB ports: steady (a new pod annotated behind all) after {restart:.2} s; {cpu:.2} s CPU, RSS {:.1} MiB; {rebuilt}",
        pods_now + preload,
        rss / 1048576.0
    );
    if let Some(mut p) = perf {
        p.wait().unwrap();
    }
    child.kill().unwrap();
    child.wait().unwrap();
    drop(nbs);
    drop(dir);
    // Background watches and connections would keep the runtime's shutdown waiting.
    std::process::exit(0);
}
