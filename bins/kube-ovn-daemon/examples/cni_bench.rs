//! CNI benchmark (as root): our shim `kube-ovn` exec'd as kubelet does against the daemon on a real single-node
//! OVN, pods one at a time and in a burst, and optionally Debian's bridge + host-local in the same run.
//!
//! ```text
//! cargo build --release -p kube-ovn-cni -p kube-ovn-daemon --example cni_bench
//! target/release/examples/cni_bench [-n 200] [--burst 100] [--grow 500] [--peers] [--shim PATH] [--cgroups]
//! ```
//!
//! `--shim` picks the shim binary (default: `kube-ovn` beside the bench's own target directory);
//! `scripts/bench-cni.sh` builds the statically linked one the image ships and runs the bench with it.
//!
//! `--cgroups` places the processes as on a node, each part in a CPU cgroup of its own (Kube-OVN's pods):
//! `ovn-central` (NB, SB, ovn-northd), `ovs-ovn` (Open_vSwitch database, ovs-vswitchd, ovn-controller) and
//! `kube-ovn-cni` (this process: the daemons, and the shims it execs as the container runtime would).
//! By default they share one group, where every OVS/OVN thread weighs as much as the daemon's. (Measured
//! here: with the groups the ADD p50 drops by about a third but its p99 triples, as the busy `ovs-ovn` group
//! holds a CPU for whole slices; the figures we quote are from one group.)
//!
//! Two daemons share one Open_vSwitch connection: `fast` answers without waiting for ovn-controller or the
//! gateway (the logical switch ports are created and the pods' networks published beforehand, so nothing
//! waits for the controller either): shim + daemon cost; `full` waits for `ovn-installed` and an ICMP answer
//! from the gateway (a logical router port): the pod is ready when ADD returns.
//! Phases: fast ADD/DEL of N pods one at a time; the bridge growing to `--grow` ports (fast ADD latency per
//! 100 ports, each ADD followed by a STATUS: the floor under the load the ports make); full ADD/DEL of N
//! pods one at a time; a burst of `--burst` ADDs then DELs at once on the fast daemon (other pods); a burst of `--burst` full ADDs at once (wall time until all returned). `--peers`
//! then runs ../shared/peer-bench/cni-peers.sh (bridge + host-local, and our shim on the fast daemon as
//! section `ko`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kubeovn_cni::node::{
    init_node, CniHandler, HandlerConfig, IcmpGatewayProbe, Metrics, NodeConfig, PodNetwork,
    Server, StaticPodNetworks,
};
use kubeovn_netdev::{NamedNetns, Namespaces, NetlinkNetdev};
use kubeovn_ovn::northbound::{
    Batch, LogicalSwitch, Northbound, OvsdbNorthbound, Patch, Router, SwitchPort,
};
use kubeovn_ovn::vswitch::OvsdbOpenVSwitch;
use kubeovn_ovn_stack::cgroup::CpuGroup;
use kubeovn_ovn_stack::ovn::{OvnOptions, OvnStack};

struct Args {
    n: usize,
    burst: usize,
    grow: usize,
    peers: bool,
    shim: Option<PathBuf>,
    cgroups: bool,
}

fn args() -> Args {
    let mut a = Args {
        n: 200,
        burst: 100,
        grow: 500,
        peers: false,
        shim: None,
        cgroups: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut num = || {
            it.next()
                .and_then(|v| v.parse().ok())
                .expect("a number after the flag")
        };
        match k.as_str() {
            "-n" => a.n = num(),
            "--burst" => a.burst = num(),
            "--grow" => a.grow = num(),
            "--peers" => a.peers = true,
            "--cgroups" => a.cgroups = true,
            "--shim" => a.shim = Some(it.next().expect("a path after --shim").into()),
            _ => panic!("usage: cni_bench [-n N] [--burst B] [--grow G] [--peers] [--shim PATH] [--cgroups]"),
        }
    }
    a
}

fn shim_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().to_owned();
    let shim = dir.join("kube-ovn");
    assert!(
        shim.exists(),
        "{} missing: cargo build --release -p kube-ovn-cni",
        shim.display()
    );
    shim
}

fn pod_ip(i: usize) -> String {
    format!("10.240.{}.{}", i / 250, i % 250 + 2)
}

fn pod_mac(i: usize) -> String {
    format!("0a:00:00:00:{:02x}:{:02x}", i / 256, i % 256)
}

/// Runs the shim once; returns its wall time (exec to exit) and whether it succeeded.
fn shim(
    shim: &Path,
    cmd: &str,
    sock: &Path,
    id: &str,
    netns: &Path,
    pod: usize,
) -> (Duration, bool) {
    // STATUS is a 1.1.0 command.
    let version = if cmd == "STATUS" { "1.1.0" } else { "1.0.0" };
    let conf = format!(
        r#"{{"cniVersion":"{version}","name":"kube-ovn","type":"kube-ovn","server_socket":"{}"}}"#,
        sock.display()
    );
    let t0 = Instant::now();
    let mut child = Command::new(shim)
        .env_clear()
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/opt/cni/bin")
        .env(
            "CNI_ARGS",
            format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-{pod}"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let took = t0.elapsed();
    if !out.status.success() {
        eprintln!(
            "{cmd} pod-{pod} failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    (took, out.status.success())
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    if v.is_empty() {
        return 0.0;
    }
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    v[i].as_secs_f64() * 1000.0
}

fn report(what: &str, v: &mut [Duration], fails: usize) {
    println!(
        "  {what:<44} n={:<4} p50={:>7.2} ms  p90={:>7.2} ms  p99={:>7.2} ms  max={:>7.2} ms  fails={fails}",
        v.len(),
        pct(v, 0.5),
        pct(v, 0.9),
        pct(v, 0.99),
        pct(v, 1.0),
    );
}

struct Bench {
    shim: PathBuf,
    netns: Vec<PathBuf>,
}

impl Bench {
    fn id(&self, phase: &str, i: usize) -> String {
        format!("{phase}{i:05}{:06}", std::process::id() % 1_000_000)
    }

    /// One shim run of `cmd` for pod `i` through `sock`.
    fn run(&self, cmd: &str, phase: &str, sock: &Path, i: usize) -> (Duration, bool) {
        shim(&self.shim, cmd, sock, &self.id(phase, i), &self.netns[i], i)
    }

    /// ADD (or DEL) pods `range` one at a time through `sock`.
    fn seq(
        &self,
        cmd: &str,
        phase: &str,
        sock: &Path,
        range: std::ops::Range<usize>,
    ) -> (Vec<Duration>, usize) {
        let mut lat = Vec::new();
        let mut fails = 0;
        for i in range {
            let (t, ok) = self.run(cmd, phase, sock, i);
            lat.push(t);
            fails += usize::from(!ok);
        }
        (lat, fails)
    }

    /// ADD (or DEL) pods `range` all at once through `sock`, one thread each; also the wall time until the
    /// last returned.
    fn burst(
        &self,
        cmd: &'static str,
        phase: &str,
        sock: &Path,
        range: std::ops::Range<usize>,
    ) -> (Vec<Duration>, usize, Duration) {
        let t0 = Instant::now();
        let threads: Vec<_> = range
            .map(|i| {
                let (s, sock, id, ns) = (
                    self.shim.clone(),
                    sock.to_owned(),
                    self.id(phase, i),
                    self.netns[i].clone(),
                );
                std::thread::spawn(move || shim(&s, cmd, &sock, &id, &ns, i))
            })
            .collect();
        let mut lat = Vec::new();
        let mut fails = 0;
        for t in threads {
            let (d, ok) = t.join().unwrap();
            lat.push(d);
            fails += usize::from(!ok);
        }
        (lat, fails, t0.elapsed())
    }

    /// Waits until the veths of this run's DELs are gone (the daemon deletes them in the background), so
    /// the next phase starts on an idle node: the phases reuse the pods' namespaces, and an ADD waits
    /// for a deletion pending in its namespace.
    fn settle(&self) {
        let tag = format!("{:06}_h", std::process::id() % 1_000_000);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let left = std::fs::read_dir("/sys/class/net")
                .map(|d| {
                    d.filter_map(|e| e.ok())
                        .filter(|e| e.file_name().to_string_lossy().ends_with(&tag))
                        .count()
                })
                .unwrap_or(0);
            if left == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Removes the pod namespaces (and with them their veths) of an earlier run that was killed (`kb<pid>-<i>` of
/// a pid no longer running): hundreds of stale namespaces slow ovs-vswitchd's link queries and skew every figure.
fn remove_stale(names: &NamedNetns) {
    let Ok(dir) = std::fs::read_dir(kubeovn_netdev::NETNS_RUN_DIR) else {
        return;
    };
    let mut removed = 0;
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(Ok(pid)) = name
            .strip_prefix("kb")
            .and_then(|r| r.split_once('-'))
            .map(|(tag, _)| tag.parse::<u32>())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            removed += usize::from(names.delete(&name).is_ok());
        }
    }
    if removed > 0 {
        println!("removed {removed} namespaces left by killed runs");
    }
}

fn main() {
    let a = args();
    // The no-wait burst uses pods of its own, after every other phase's: ovn-controller (23.03) may never
    // mark an interface ovn-installed when the same logical port's previous interface went away
    // milliseconds before.
    let quiet_base = a.n.max(a.grow).max(a.burst);
    let max = quiet_base + a.burst;
    let shim_bin = a.shim.clone().unwrap_or_else(shim_path);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::Builder::new()
        .prefix("kovn-bench")
        .tempdir()
        .unwrap();
    let bridge = format!("br-kb{}", std::process::id() % 10000);
    let source = Arc::new(StaticPodNetworks::new());
    let prefix = format!("kovn-bench-{}", std::process::id());
    // This process (daemons and shims) first: if the cgroups cannot be made, everything stays flat.
    let cni_group = if !a.cgroups {
        None
    } else {
        match CpuGroup::create(&format!("{prefix}-kube-ovn-cni"))
            .and_then(|g| g.add(std::process::id()).map(|_| g))
        {
            Ok(g) => Some(g),
            Err(e) => {
                println!("no CPU cgroups ({e}): all processes in one group");
                None
            }
        }
    };
    let mut opts = OvnOptions::new(&bridge).without_chassis_config();
    if cni_group.is_some() {
        opts = opts.in_cgroups(&prefix);
    }
    let (stack, fast, full) = rt.block_on(async {
        let stack = OvnStack::start(dir.path(), opts).await.unwrap();
        let ovs = Arc::new(
            OvsdbOpenVSwitch::connect(&stack.ovs_remote())
                .await
                .unwrap(),
        );
        let host = Arc::new(NetlinkNetdev::current().unwrap());
        let mut node = NodeConfig::new(stack.options().system_id.clone(), stack.sb_remote());
        node.bridge = bridge.clone();
        node.datapath_type = "netdev".into();
        init_node(ovs.as_ref(), host.as_ref(), &node).await.unwrap();
        stack.wait_chassis().await.unwrap();
        let nb = OvsdbNorthbound::connect(&stack.nb_remote()).await.unwrap();
        let mut b = Batch::new();
        b.add(LogicalSwitch::new("ls-bench"));
        b.add(Router::new("lr-bench"));
        b.patch(Patch::new(
            "ls-bench",
            "lr-bench",
            "0a:00:00:ff:00:01",
            ["10.240.0.1/16"],
        ));
        for i in 0..max {
            let addr = format!("{} {}", pod_mac(i), pod_ip(i));
            b.add(SwitchPort::new("ls-bench", format!("pod-{i}.bench")).addresses([addr]));
            source.insert(
                "bench",
                &format!("pod-{i}"),
                PodNetwork {
                    ips: vec![format!("{}/16", pod_ip(i)).parse().unwrap()],
                    mac: Some(pod_mac(i).parse().unwrap()),
                    gateways: vec!["10.240.0.1".parse().unwrap()],
                    logical_switch: "ls-bench".into(),
                    provider: "ovn".into(),
                    ..Default::default()
                },
            );
        }
        nb.commit(b).await.unwrap();
        let metrics = Arc::new(Metrics::new());
        let mut servers = Vec::new();
        for (name, waits) in [("fast", false), ("full", true)] {
            let cfg = HandlerConfig {
                bridge: bridge.clone(),
                ovn_installed_timeout: waits.then_some(Duration::from_secs(20)),
                gateway_timeout: waits.then_some(Duration::from_secs(10)),
                ..Default::default()
            };
            let h = CniHandler::new(
                cfg,
                source.clone(),
                ovs.clone(),
                host.clone(),
                Arc::new(NamedNetns::default()),
                Arc::new(IcmpGatewayProbe::default()),
            );
            let sock = dir.path().join(format!("{name}.sock"));
            servers.push(
                Server::start(&sock, None, Arc::new(h), metrics.clone())
                    .await
                    .unwrap(),
            );
        }
        let full = servers.pop().unwrap();
        let fast = servers.pop().unwrap();
        (stack, fast, full)
    });
    let (fast_sock, full_sock) = (fast.socket().to_owned(), full.socket().to_owned());
    let names = NamedNetns::default();
    remove_stale(&names);
    let tag = std::process::id();
    let netns: Vec<PathBuf> = (0..max)
        .map(|i| names.create(&format!("kb{tag}-{i}")).unwrap())
        .collect();
    let bench = Bench {
        shim: shim_bin.clone(),
        netns,
    };
    println!(
        "== kube-ovn shim + daemon, single-node OVN (userspace datapath), {}, {} ==",
        bridge,
        if cni_group.is_some() {
            "CPU cgroups per part as on a node (ovn-central, ovs-ovn, kube-ovn-cni)"
        } else {
            "all processes in one CPU group"
        }
    );

    // Warm-up (page cache, first connections).
    let warm = 0..max.min(5);
    let _ = bench.seq("ADD", "w", &fast_sock, warm.clone());
    let _ = bench.seq("DEL", "w", &fast_sock, warm);
    bench.settle();

    // The floor under every ADD: exec the shim, one HTTP round trip to the daemon, a handler that only
    // looks at its caches.
    let (mut st, f0) = bench.seq("STATUS", "s", &fast_sock, 0..a.n);
    report("STATUS shim+daemon round trip (floor)", &mut st, f0);
    let (mut add, f1) = bench.seq("ADD", "a", &fast_sock, 0..a.n);
    report("ADD shim+daemon, no waits (one at a time)", &mut add, f1);
    let (mut del, f2) = bench.seq("DEL", "a", &fast_sock, 0..a.n);
    report("DEL (one at a time)", &mut del, f2);
    bench.settle();

    println!(
        "  bridge growing to {} ports (ADD shim+daemon, no waits):",
        a.grow
    );
    let mut grow_fails = 0;
    for start in (0..a.grow).step_by(100) {
        let end = (start + 100).min(a.grow);
        // After each ADD a STATUS, which does no work: the floor at the moment the next ADD would start,
        // while ovs-vswitchd and ovn-controller take up the port just added.
        let (mut add, mut status, mut f, mut fs) = (Vec::new(), Vec::new(), 0, 0);
        for i in start..end {
            let (t, ok) = bench.run("ADD", "g", &fast_sock, i);
            add.push(t);
            f += usize::from(!ok);
            let (t, ok) = bench.run("STATUS", "gs", &fast_sock, i);
            status.push(t);
            fs += usize::from(!ok);
        }
        grow_fails += f;
        report(&format!("  ports {start}..{end}"), &mut add, f);
        report("    STATUS right after each (floor)", &mut status, fs);
    }
    let t0 = Instant::now();
    let ok = rt.block_on(async {
        let ovs = OvsdbOpenVSwitch::connect(&stack.ovs_remote())
            .await
            .unwrap();
        let mut n = 0;
        for i in 0..a.grow {
            let host_if = format!("{}_h", &bench.id("g", i)[..12]);
            if kubeovn_ovn::vswitch::OpenVSwitch::wait_ovn_installed(
                &ovs,
                &host_if,
                Duration::from_secs(30),
            )
            .await
            .is_ok()
            {
                n += 1;
            }
        }
        n
    });
    println!(
        "  {} of {} ports ovn-installed {:.0} ms after the last ADD returned (fails {grow_fails})",
        ok,
        a.grow,
        t0.elapsed().as_secs_f64() * 1000.0
    );
    let (mut del, f) = bench.seq("DEL", "g", &fast_sock, 0..a.grow);
    report(
        &format!("DEL from {} ports (one at a time)", a.grow),
        &mut del,
        f,
    );
    bench.settle();

    let (mut add, f) = bench.seq("ADD", "f", &full_sock, 0..a.n);
    report("full ADD: + ovn-installed + gateway ICMP", &mut add, f);
    let (mut del, f) = bench.seq("DEL", "f", &full_sock, 0..a.n);
    report("DEL (one at a time)", &mut del, f);
    bench.settle();

    // The same burst on the daemon that does not wait: what the daemon itself costs under concurrency.
    for op in ["ADD", "DEL"] {
        let (mut lat, fails, wall) =
            bench.burst(op, "b", &fast_sock, quiet_base..quiet_base + a.burst);
        report(
            &format!("burst of {} {op}s, no waits", a.burst),
            &mut lat,
            fails,
        );
        println!("  (wall {:.0} ms)", wall.as_secs_f64() * 1000.0);
    }

    let (mut lat, fails, wall) = bench.burst("ADD", "b", &full_sock, 0..a.burst);
    report(
        &format!("burst of {} full ADDs at once", a.burst),
        &mut lat,
        fails,
    );
    println!(
        "  burst: all {} pods ready (ovn-installed, gateway answers) {:.0} ms after the first exec",
        a.burst,
        wall.as_secs_f64() * 1000.0
    );
    let (mut lat, fails, wall) = bench.burst("DEL", "b", &full_sock, 0..a.burst);
    report(
        &format!("burst of {} DELs at once", a.burst),
        &mut lat,
        fails,
    );
    println!("  (burst DEL wall {:.0} ms)", wall.as_secs_f64() * 1000.0);

    if a.peers {
        let conf = dir.path().join("ko.json");
        std::fs::write(
            &conf,
            format!(
                r#"{{"cniVersion":"1.0.0","name":"kube-ovn","type":"kube-ovn","server_socket":"{}"}}"#,
                fast_sock.display()
            ),
        )
        .unwrap();
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/peer-bench/cni-peers.sh");
        println!("== peers, same run: {} ==", script.display());
        let st = Command::new("bash")
            .arg(&script)
            .args(["-n", &a.n.to_string(), "-s", "bridge,ptp"])
            .arg("--cni")
            .arg(format!("ko={}", conf.display()))
            .arg("--cni-path")
            .arg(shim_bin.parent().unwrap())
            .status();
        println!("cni-peers.sh: {st:?}");
    }

    for (i, _) in bench.netns.iter().enumerate() {
        let _ = names.delete(&format!("kb{tag}-{i}"));
    }
    rt.block_on(async {
        fast.shutdown().await;
        full.shutdown().await;
    });
    stack.stop();
    // Back to the root group, then the group is removed.
    drop(cni_group);
}
