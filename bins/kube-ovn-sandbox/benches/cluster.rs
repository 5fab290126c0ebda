//! Cluster benchmark (`cargo bench -p kube-ovn-sandbox --bench cluster`, root, OVN, iperf3), no criterion:
//! real sandboxes with real traffic, in one run.
//!
//! 1. A 3-node sandbox (`up --nodes 3`):
//!    - pod ADD latency: `N` pods (30; 5 in the smoke run) created through the API one at a time, left to the
//!      sandbox's scheduler (no `nodeName`): p50/p99 from create to the pod's status reading `Running` with
//!      its IP, seen by a watch;
//!    - pod-to-pod traffic: an `iperf3 -s` pod on node 1, a client pod beside it on node 1 (same node) and one
//!      on node 2 (cross node: Geneve between the two nodes' userspace datapaths). From each client's network
//!      namespace (`nsenter --net`): `iperf3 -c` (TCP, 10 s; 1 s in the smoke run) and `ping -i 0.01`
//!      (200 echoes; 50 in the smoke run; RTT p50/p99 from the per-echo times). The machine's own ceiling
//!      beside them: the same over loopback inside the server pod's namespace.
//! 2. The sandbox down, a 1-node sandbox up: pod ADD latency the same way.
//!
//! Each node's first pod is created first, pinned to it, and its time printed apart: a node's cold start
//! (hundreds of ms) would otherwise be the p99 of every run.
//!
//! The full run first runs `cargo build --release` of our other binaries (the sandbox starts them from this
//! profile's target directory; `cargo bench` builds only this package's, and a stale controller or daemon
//! would be measured, or would not start); the smoke run builds only the missing ones, as the tests do.
//!
//! Without `--bench` (as `cargo test --all-targets` runs benches) a smoke version runs: the same steps, short,
//! still asserting the figures are real (throughput above zero, every echo answered, every pod Running with
//! an IP). Not root or a program missing: `SKIPPED` (a failure under CI, as the tests).

#![allow(clippy::unwrap_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::ResourceExt;
use serde_json::{json, Value};

/// The size of one run.
struct Plan {
    /// iperf3's duration.
    secs: u32,
    /// ICMP echoes per ping.
    pings: usize,
    /// Pods created per sandbox for the ADD latency.
    pods: usize,
}

const DEFAULT_CIDR: &str = "10.241.0.0/16";
const JOIN_CIDR: &str = "100.93.0.0/16";

/// `cargo build` arguments for the binaries the sandbox starts (as [`common::bin_dir`] lists them).
const OUR_BINARIES: [&str; 14] = [
    "-p",
    "kube-ovn-testapi",
    "-p",
    "kube-ovn-controller",
    "-p",
    "kube-ovn-daemon",
    "-p",
    "kube-ovn-cni",
    "-p",
    "kubectl-ko",
    "-p",
    "kube-ovn-monitor",
    "-p",
    "kube-ovn-pinger",
];

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    if !common::runnable() {
        return;
    }
    for p in ["iperf3", "nsenter"] {
        if !common::skip::installed(p) {
            common::skip::skip(&format!("{p} is not installed"));
            return;
        }
    }
    let plan = if full {
        Plan {
            secs: 10,
            pings: 200,
            pods: 30,
        }
    } else {
        Plan {
            secs: 1,
            pings: 50,
            pods: 5,
        }
    };
    if full {
        let sandbox = PathBuf::from(env!("CARGO_BIN_EXE_kube-ovn-sandbox"));
        let dir = sandbox.parent().unwrap();
        common::cargo_build::cargo_build(dir, &OUR_BINARIES);
    }
    let t0 = Instant::now();

    // The 3-node sandbox: pod ADD first (a fresh cluster, as the 1-node one will be), then traffic.
    let (sb, up3) = up(3);
    let add3 = pod_add(&sb, plan.pods, 3);
    let traffic = traffic(&sb, &plan);
    drop(sb);

    let (sb, up1) = up(1);
    let add1 = pod_add(&sb, plan.pods, 1);
    drop(sb);

    println!();
    println!("sandbox up (its own account): 3 nodes {up3:.1} s, 1 node {up1:.1} s");
    let (lo, same, cross) = (
        traffic.loopback.gbits,
        traffic.same.gbits,
        traffic.cross.gbits,
    );
    println!(
        "iperf3 TCP {} s: same node {same:.2} Gbit/s ({:.2} of loopback), cross node {cross:.2} Gbit/s \
         ({:.2} of same-node, {:.2} of loopback); loopback in one namespace {lo:.2} Gbit/s",
        plan.secs,
        same / lo,
        cross / same,
        cross / lo,
    );
    println!(
        "iperf3 TCP retransmits: same node {}, cross node {}, loopback {}",
        traffic.same.retransmits, traffic.cross.retransmits, traffic.loopback.retransmits
    );
    let (lp, sp, cp) = (&traffic.ping_lo, &traffic.ping_same, &traffic.ping_cross);
    println!(
        "ping RTT p50/p99 ({} echoes at 10 ms): same node {:.3}/{:.3} ms ({:.1}x loopback p50), cross node \
         {:.3}/{:.3} ms ({:.1}x same-node p50); loopback in one namespace {:.3}/{:.3} ms",
        plan.pings,
        sp.p50,
        sp.p99,
        sp.p50 / lp.p50,
        cp.p50,
        cp.p99,
        cp.p50 / sp.p50,
        lp.p50,
        lp.p99,
    );
    println!(
        "pod ADD (create to Running with its IP, {} pods one at a time): 1 node p50 {:.0} ms p99 {:.0} ms; \
         3 nodes p50 {:.0} ms p99 {:.0} ms ({:.2}x 1-node p50; spread {})",
        plan.pods,
        add1.p50,
        add1.p99,
        add3.p50,
        add3.p99,
        add3.p50 / add1.p50,
        add3.spread,
    );
    println!(
        "pod ADD p50 by node of the 3-node sandbox: {}; each node's first pod (pinned, before, not counted \
         above): 1-node sandbox {}; 3-node sandbox {}",
        add3.by_node, add1.first, add3.first
    );
    println!(
        "cluster bench ({}) done in {:.1} s",
        if full { "full" } else { "smoke" },
        t0.elapsed().as_secs_f64()
    );
}

/// A sandbox of `nodes` nodes, up, and how long `up` took by its own account (`sandbox up in X s`: without
/// the wait for another sandbox's ovs-vswitchd to end).
fn up(nodes: usize) -> (common::Sandbox, f64) {
    let n = nodes.to_string();
    let (sb, out) = common::up(
        "bc",
        &[
            "--nodes",
            &n,
            "--no-demo",
            "--default-cidr",
            DEFAULT_CIDR,
            "--join-cidr",
            JOIN_CIDR,
        ],
    );
    assert!(
        out.status.success(),
        "up --nodes {nodes}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let took = text
        .lines()
        .find_map(|l| l.strip_prefix("sandbox up in "))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no `sandbox up in` line from up:\n{text}"));
    (sb, took)
}

/// The name of the sandbox's node `k` (1-based).
fn node(sb: &common::Sandbox, k: usize) -> String {
    if k == 1 {
        sb.prefix.clone()
    } else {
        format!("{}{k}", sb.prefix)
    }
}

/// Nearest-rank percentile `p` (0..=100) of sorted `v`.
fn pct(v: &[f64], p: f64) -> f64 {
    assert!(!v.is_empty());
    // p is at most 100 and v short: the rank fits.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

struct AddLatency {
    p50: f64,
    p99: f64,
    /// The first pod of each node (pinned to it, before the measured ones, not among them): a node's first
    /// pod pays for its cold start (`node 1 383 ms, node 2 48 ms, ...`).
    first: String,
    /// Pods per node, in node order (`10/10/10`).
    spread: String,
    /// The p50 of each node's pods, in node order (`node 1 84 ms, node 2 107 ms, ...`).
    by_node: String,
}

/// Creates a first pod on each node (pinned by `nodeName`), then `n` pods (no `nodeName`), through the API
/// one at a time and measures, from a watch, the time from each create to its status reading `Running` with
/// a pod IP; asserts every one got there, and the `n` on every node of `nodes` when there are pods enough.
/// The first pods' times are kept apart: a node's first pod pays for its cold start, and would be the p99 of
/// every run.
fn pod_add(sb: &common::Sandbox, n: usize, nodes: usize) -> AddLatency {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let kubeconfig = sb.dir.path().join("kubeconfig");
    let names: Vec<String> = (1..=nodes)
        .map(|k| format!("first-{k}"))
        .chain((0..n).map(|i| format!("add-{i}")))
        .collect();
    let (first, measured) = rt.block_on(async {
        let client = kubeovn_sandbox::kubelet::client(&kubeconfig).await.unwrap();
        let api: kube::Api<Pod> = kube::Api::namespaced(client, "default");
        // The watch: (pod, when first seen Running with an IP), after its initial list.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant, String)>();
        let (synced_tx, synced_rx) = tokio::sync::oneshot::channel::<()>();
        let wapi = api.clone();
        let watch = tokio::spawn(async move {
            let stream = watcher::watcher(wapi, watcher::Config::default());
            futures::pin_mut!(stream);
            let mut synced = Some(synced_tx);
            while let Some(ev) = stream.next().await {
                let p = match ev {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
                    Ok(watcher::Event::InitDone) => {
                        if let Some(s) = synced.take() {
                            let _ = s.send(());
                        }
                        continue;
                    }
                    _ => continue,
                };
                let status = p.status.as_ref();
                let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
                let ip = status.and_then(|s| s.pod_ip.as_deref()).unwrap_or("");
                if running && !ip.is_empty() {
                    let node = p
                        .spec
                        .as_ref()
                        .and_then(|s| s.node_name.clone())
                        .unwrap_or_default();
                    if tx.send((p.name_any(), Instant::now(), node)).is_err() {
                        return;
                    }
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(30), synced_rx)
            .await
            .expect("the pod watch's initial list")
            .unwrap();

        let mut ms = Vec::with_capacity(nodes + n);
        for name in &names {
            let mut spec = json!({"containers": [
                {"name": "c", "image": "any", "command": ["sleep", "infinity"]}]});
            if let Some(k) = name.strip_prefix("first-") {
                spec["nodeName"] = json!(node(sb, k.parse().unwrap()));
            }
            let pod: Pod = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"}, "spec": spec
            }))
            .unwrap();
            let t = Instant::now();
            api.create(&kube::api::PostParams::default(), &pod)
                .await
                .unwrap();
            let deadline = t + Duration::from_secs(60);
            let (at, node) = loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left, rx.recv()).await {
                    Ok(Some((p, at, node))) if p == *name => break (at, node),
                    Ok(Some(_)) => {}
                    Ok(None) => panic!("the pod watch ended"),
                    Err(_) => panic!("pod {name} not Running with an IP within 60 s"),
                }
            };
            ms.push((at.duration_since(t).as_secs_f64() * 1000.0, node));
        }
        watch.abort();
        let measured = ms.split_off(nodes);
        (ms, measured)
    });

    // Every pod Running with an IP from the default subnet, as the API reads now.
    let pods = sb.pods();
    let prefix = DEFAULT_CIDR
        .split('.')
        .take(2)
        .collect::<Vec<_>>()
        .join(".")
        + ".";
    for name in &names {
        let p = pods
            .iter()
            .find(|p| p["metadata"]["name"] == **name)
            .unwrap_or_else(|| panic!("pod {name} gone"));
        assert_eq!(p["status"]["phase"], "Running", "{name}: {p}");
        let ip = p["status"]["podIP"].as_str().unwrap_or("");
        assert!(
            ip.starts_with(&prefix),
            "{name} has IP {ip:?}, not in {DEFAULT_CIDR}"
        );
    }
    let mut placed: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (ms, node) in &measured {
        placed.entry(node.clone()).or_default().push(*ms);
    }
    let spread: Vec<usize> = (1..=nodes)
        .map(|k| placed.get(&node(sb, k)).map_or(0, Vec::len))
        .collect();
    assert_eq!(
        spread.iter().sum::<usize>(),
        n,
        "pods on nodes other than the sandbox's: {placed:?}"
    );
    if n >= nodes {
        assert!(
            spread.iter().all(|&c| c > 0),
            "the scheduler left a node empty: {placed:?}"
        );
    }
    let by_node = (1..=nodes)
        .filter_map(|k| {
            let mut v = placed.get(&node(sb, k))?.clone();
            v.sort_by(f64::total_cmp);
            Some(format!("node {k} {:.0} ms", pct(&v, 50.0)))
        })
        .collect::<Vec<_>>()
        .join(", ");
    let mut ms: Vec<f64> = measured.iter().map(|(ms, _)| *ms).collect();
    ms.sort_by(f64::total_cmp);
    let first = first
        .iter()
        .enumerate()
        .map(|(i, (ms, _))| format!("node {} {ms:.0} ms", i + 1))
        .collect::<Vec<_>>()
        .join(", ");
    eprintln!("pod ADD on {nodes} node(s): first pods {first}; then, sorted: {ms:.0?}");
    AddLatency {
        p50: pct(&ms, 50.0),
        p99: pct(&ms, 99.0),
        first,
        by_node,
        spread: spread
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("/"),
    }
}

struct Throughput {
    gbits: f64,
    retransmits: u64,
}

struct Rtt {
    p50: f64,
    p99: f64,
}

struct Traffic {
    loopback: Throughput,
    same: Throughput,
    cross: Throughput,
    ping_lo: Rtt,
    ping_same: Rtt,
    ping_cross: Rtt,
}

/// An iperf3 server pod on node 1, a client pod on node 1 and one on node 2: TCP throughput and ICMP RTT from
/// each client to the server, and over loopback in the server's namespace.
fn traffic(sb: &common::Sandbox, plan: &Plan) -> Traffic {
    let pod = |name: &str, k: usize, command: Value| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
               "spec": {"nodeName": node(sb, k),
                        "containers": [{"name": "c", "image": "any", "command": command}]}})
    };
    sb.apply(&json!({"apiVersion": "v1", "kind": "List", "items": [
        pod("iperf-server", 1, json!(["iperf3", "-s"])),
        pod("client-same", 1, json!(["sleep", "infinity"])),
        pod("client-cross", 2, json!(["sleep", "infinity"])),
    ]}));
    let names = ["iperf-server", "client-same", "client-cross"];
    let running = |p: &Value| {
        p["status"]["phase"] == "Running"
            && p["status"]["podIP"].as_str().is_some_and(|s| !s.is_empty())
    };
    common::wait_until("the iperf3 pods Running", Duration::from_secs(60), || {
        let pods = sb.pods();
        names.iter().all(|n| {
            pods.iter()
                .any(|p| p["metadata"]["name"] == *n && running(p))
        })
    });
    let pods = sb.pods();
    let server = pods
        .iter()
        .find(|p| p["metadata"]["name"] == "iperf-server")
        .unwrap();
    let server_ip = server["status"]["podIP"].as_str().unwrap().to_owned();
    let netns: HashMap<String, PathBuf> = sb.netns_of_pods().into_iter().collect();
    let ns = |n: &str| {
        netns
            .get(&format!("default/{n}"))
            .cloned()
            .unwrap_or_else(|| panic!("no pod record of {n}: {netns:?}"))
    };
    let (srv, same, cross) = (ns("iperf-server"), ns("client-same"), ns("client-cross"));

    // A first echo each way warms the path (ARP, the datapath's flow caches), then the measured pings, then
    // iperf3: one at a time, nothing else running.
    for from in [&same, &cross] {
        let ok = (0..20).any(|_| {
            let o = nsenter(from, &["ping", "-c", "1", "-W", "1", &server_ip]);
            o.status.success()
        });
        assert!(ok, "{} does not reach {server_ip}", from.display());
    }
    let ping_lo = ping(&srv, "127.0.0.1", plan.pings);
    let ping_same = ping(&same, &server_ip, plan.pings);
    let ping_cross = ping(&cross, &server_ip, plan.pings);
    let loopback = iperf(&srv, "127.0.0.1", plan.secs);
    let same_t = iperf(&same, &server_ip, plan.secs);
    let cross_t = iperf(&cross, &server_ip, plan.secs);
    Traffic {
        loopback,
        same: same_t,
        cross: cross_t,
        ping_lo,
        ping_same,
        ping_cross,
    }
}

fn nsenter(netns: &Path, argv: &[&str]) -> std::process::Output {
    Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(argv)
        .output()
        .unwrap()
}

/// `count` echoes at 10 ms from `netns` to `ip`: RTT p50/p99 in ms; asserts every echo was answered.
fn ping(netns: &Path, ip: &str, count: usize) -> Rtt {
    let c = count.to_string();
    let out = nsenter(
        netns,
        &["ping", "-n", "-i", "0.01", "-W", "1", "-c", &c, ip],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut seqs = std::collections::HashSet::new();
    let mut rtts: Vec<f64> = Vec::new();
    for l in text.lines().filter(|l| !l.contains("DUP!")) {
        let field = |key: &str| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .map(str::to_owned)
        };
        if let (Some(seq), Some(t)) = (field("icmp_seq="), field("time=")) {
            if seqs.insert(seq) {
                rtts.push(t.parse().unwrap());
            }
        }
    }
    assert!(
        out.status.success() && rtts.len() == count,
        "ping {ip} from {}: {} of {count} echoes answered\n{text}{}",
        netns.display(),
        rtts.len(),
        String::from_utf8_lossy(&out.stderr)
    );
    rtts.sort_by(f64::total_cmp);
    Rtt {
        p50: pct(&rtts, 50.0),
        p99: pct(&rtts, 99.0),
    }
}

/// `iperf3 -c ip -t secs` (TCP) from `netns`: the receiver's rate. Retries while the server is not
/// listening yet or busy; asserts the rate is above zero.
fn iperf(netns: &Path, ip: &str, secs: u32) -> Throughput {
    let t = secs.to_string();
    let t0 = Instant::now();
    loop {
        let out = nsenter(netns, &["iperf3", "-c", ip, "-t", &t, "-J"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let err = v["error"].as_str().map(str::to_owned);
        match err {
            None if out.status.success() => {
                let gbits = v["end"]["sum_received"]["bits_per_second"]
                    .as_f64()
                    .unwrap_or(0.0)
                    / 1e9;
                let bytes = v["end"]["sum_received"]["bytes"].as_f64().unwrap_or(0.0);
                assert!(
                    gbits > 0.0 && bytes > 0.0,
                    "iperf3 to {ip} from {} carried nothing: {v}",
                    netns.display()
                );
                return Throughput {
                    gbits,
                    retransmits: v["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0),
                };
            }
            _ if t0.elapsed() < Duration::from_secs(15) => {
                eprintln!("iperf3 to {ip}: {err:?}, again");
                std::thread::sleep(Duration::from_millis(300));
            }
            _ => panic!("iperf3 to {ip} from {}: {out:?}\n{v}", netns.display()),
        }
    }
}
