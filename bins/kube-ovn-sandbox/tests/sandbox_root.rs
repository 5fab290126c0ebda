//! The whole sandbox as a user runs it (needs root, the OVN/OVS packages and kubectl): `up` brings up every
//! process, the demo pods and an all-answering ping matrix; kubectl sees the pods; a pod created with
//! kubectl gets a sandbox and is reachable from another pod through `exec`; deleting it removes its network
//! namespace; `up` again is harmless; `down` leaves no process, network namespace or link behind.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use kube_ovn_sandbox::ovn::missing_programs;
use kube_ovn_sandbox::procs::ProcRecord;
use serde_json::Value;

#[path = "../../../test-support/cargo_build.rs"]
mod cargo_build;

#[path = "../../../test-support/skip.rs"]
mod skip;

/// Whether the test can run (root, OVN, kubectl, ping); if not, it is skipped ([`skip::skip`]: a failure
/// under CI).
fn runnable() -> bool {
    if !skip::is_root() {
        skip::skip("needs root (network namespaces, OVS bridge)");
        return false;
    }
    if let Some(p) = missing_programs() {
        skip::skip(&format!("{p} is not installed"));
        return false;
    }
    for p in ["kubectl", "ping"] {
        if Command::new(p).arg("--help").output().is_err() {
            skip::skip(&format!("{p} is not installed"));
            return false;
        }
    }
    true
}

/// The directory of our binaries: this profile's target directory. `cargo test --workspace` builds them;
/// the ones missing (`cargo test -p kube-ovn-sandbox` builds only this package's binary) are built here.
fn bin_dir() -> PathBuf {
    let sandbox = PathBuf::from(env!("CARGO_BIN_EXE_kube-ovn-sandbox"));
    let dir = sandbox.parent().unwrap().to_owned();
    let wanted = [
        ("kube-ovn-testapi", "kube-ovn-testapi"),
        ("kube-ovn-controller", "kube-ovn-controller"),
        ("kube-ovn-daemon", "kube-ovn-daemon"),
        ("kube-ovn-cni", "kube-ovn"),
        ("kubectl-ko", "kubectl-ko"),
        ("kube-ovn-monitor", "kube-ovn-monitor"),
        ("kube-ovn-pinger", "kube-ovn-pinger"),
    ];
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|(_, bin)| !dir.join(bin).exists())
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return dir;
    }
    let mut args: Vec<&str> = Vec::new();
    for p in &missing {
        args.extend(["-p", p]);
    }
    cargo_build::cargo_build(&dir, &args);
    dir
}

struct Sandbox {
    dir: tempfile::TempDir,
    bins: PathBuf,
    prefix: String,
    bridge: String,
    nic: String,
}

impl Sandbox {
    fn run(&self, args: &[&str]) -> Output {
        let out = Command::new(env!("CARGO_BIN_EXE_kube-ovn-sandbox"))
            .arg("--state-dir")
            .arg(self.dir.path())
            .args(args)
            .env("KUBE_OVN_SANDBOX_BIN_DIR", &self.bins)
            .output()
            .unwrap();
        eprintln!(
            "$ kube-ovn-sandbox {}\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn ko(&self, args: &[&str]) -> Output {
        let out = Command::new(self.bins.join("kubectl-ko"))
            .arg("--sandbox")
            .arg(self.dir.path())
            .args(args)
            .output()
            .unwrap();
        eprintln!(
            "$ kubectl-ko {}\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn tool(&self, bin: &str, args: &[&str]) -> Output {
        let out = Command::new(self.bins.join(bin))
            .args(args)
            .output()
            .unwrap();
        eprintln!(
            "$ {bin} {}\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.dir.path().join("kubeconfig"))
            .args(args)
            .output()
            .unwrap()
    }

    fn pods(&self) -> Vec<Value> {
        let out = self.kubectl(&["get", "pods", "-A", "-o", "json"]);
        assert!(out.status.success(), "{out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["items"].as_array().cloned().unwrap_or_default()
    }

    fn netns(&self) -> Vec<String> {
        std::fs::read_dir("/var/run/netns")
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&format!("{}-", self.prefix)))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // A failed assertion still takes everything down.
        let _ = Command::new(env!("CARGO_BIN_EXE_kube-ovn-sandbox"))
            .arg("down")
            .arg("--state-dir")
            .arg(self.dir.path())
            .output();
    }
}

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn up_ping_kubectl_exec_down() {
    if !runnable() {
        return;
    }
    // One ovs-vswitchd on the userspace datapath per network namespace: wait for another test's to stop.
    let t0 = Instant::now();
    while let Some((pid, cmd)) = kube_ovn_sandbox::sandbox::other_vswitchd() {
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "another ovs-vswitchd (pid {pid}: {cmd}) kept running for 3 minutes"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let tag = std::process::id() % 10000;
    let sb = Sandbox {
        dir: tempfile::Builder::new()
            .prefix("kube-ovn-sandbox-test")
            .tempdir()
            .unwrap(),
        bins: bin_dir(),
        prefix: format!("sbt{tag}"),
        bridge: format!("br-sbt{tag}"),
        nic: format!("sbt{tag}j"),
    };
    let out = sb.run(&[
        "up",
        "--no-install",
        "--api-port",
        "0",
        "--node-name",
        &format!("sbt{tag}"),
        "--bridge",
        &sb.bridge,
        "--node-nic",
        &sb.nic,
        "--netns-prefix",
        &sb.prefix,
        "--default-cidr",
        "10.247.0.0/16",
        "--join-cidr",
        "100.97.0.0/16",
        "--demo-cidr",
        "10.248.0.0/24",
        "--demo-pods",
        "2",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "up failed");
    // 2 + 2 pods and the node: 5 endpoints, 20 pairs.
    assert!(stdout.contains("all 20 pairs answered"), "{stdout}");
    // The same pairs over TCP and UDP, pod to pod on one switch, across the router, and to and from the node.
    assert!(
        stdout.contains("all 20 pairs carried TCP and UDP"),
        "{stdout}"
    );
    assert!(
        stdout.contains("10.248.0."),
        "demo subnet address: {stdout}"
    );

    // kubectl sees the pods, scheduled, running, with addresses in their subnets.
    let pods = sb.pods();
    assert_eq!(pods.len(), 4, "{pods:?}");
    for p in &pods {
        assert_eq!(p["status"]["phase"], "Running", "{p}");
        let ip = p["status"]["podIP"].as_str().unwrap();
        let want = if p["metadata"]["namespace"] == "demo" {
            "10.248.0."
        } else {
            "10.247."
        };
        assert!(ip.starts_with(want), "{ip} of {}", p["metadata"]["name"]);
    }
    assert_eq!(sb.netns().len(), 4, "{:?}", sb.netns());
    assert!(link_exists(&sb.nic), "join interface");

    // kubectl-ko against the sandbox: passthrough, diagnose, trace across the router.
    let out = sb.ko(&["nbctl", "ls-list"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && text.contains("(demo)") && text.contains("(ovn-default)"),
        "{text}"
    );
    let out = sb.ko(&["diagnose"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("PASS  pod demo/app-2: interface on the bridge with ovn-installed"),
        "{text}"
    );
    for pair in [
        "default/web-2 -> default/web-1",
        "default/web-1 -> demo/app-2",
    ] {
        assert!(
            text.contains(&format!("PASS  TCP and UDP {pair} (")),
            "{pair}: {text}"
        );
    }
    let web1 = pods
        .iter()
        .find(|p| p["metadata"]["name"] == "web-1")
        .and_then(|p| p["status"]["podIP"].as_str())
        .unwrap()
        .to_owned();
    let out = sb.ko(&["trace", "demo/app-1", &web1]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(text.contains("output to \"web-1.default\""), "{text}");

    // Monitoring: the pinger's one-shot report and the monitor's database probes.
    let dir = sb.dir.path().to_str().unwrap();
    let out = sb.tool("kube-ovn-pinger", &["--sandbox", dir, "--once"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("all pairs answered"));
    let out = sb.tool("kube-ovn-monitor", &["--sandbox", dir, "--once"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("kube_ovn_monitor_db_connected{db=\"sb\"} 1"),
        "{text}"
    );

    // A pod created by someone else gets a sandbox; another pod reaches it through the router.
    let out = sb.kubectl(&["run", "extra", "--image=registry.k8s.io/pause:3.10"]);
    assert!(out.status.success(), "{out:?}");
    let mut extra_ip = String::new();
    wait_until("pod extra to run", Duration::from_secs(30), || {
        let out = sb.kubectl(&[
            "get",
            "pod",
            "extra",
            "-o",
            "jsonpath={.status.phase} {.status.podIP}",
        ]);
        let s = String::from_utf8_lossy(&out.stdout).into_owned();
        match s.split_once(' ') {
            Some(("Running", ip)) if !ip.is_empty() => {
                extra_ip = ip.to_owned();
                true
            }
            _ => false,
        }
    });
    let out = sb.run(&[
        "exec",
        "demo/app-1",
        "--",
        "ping",
        "-c",
        "2",
        "-W",
        "2",
        &extra_ip,
    ]);
    assert!(out.status.success(), "ping from demo/app-1 to {extra_ip}");
    assert_eq!(sb.netns().len(), 5);

    // Deleting it removes its namespace.
    let out = sb.kubectl(&["delete", "pod", "extra"]);
    assert!(out.status.success(), "{out:?}");
    wait_until("pod extra's netns to go", Duration::from_secs(20), || {
        sb.netns().len() == 4
    });

    // status is healthy; up again reports the running sandbox.
    assert!(sb.run(&["status"]).status.success());
    let out = sb.run(&["up", "--no-install"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("already up"));

    // down: no process, namespace or link left.
    let pids: Vec<ProcRecord> =
        serde_json::from_slice(&std::fs::read(sb.dir.path().join("pids.json")).unwrap()).unwrap();
    assert_eq!(pids.len(), 10, "{pids:?}");
    let host_veths: Vec<String> = std::fs::read_dir(sb.dir.path().join("pods"))
        .unwrap()
        .flatten()
        .map(|e| {
            let v: Value = serde_json::from_slice(&std::fs::read(e.path()).unwrap()).unwrap();
            kubeovn_netdev::host_nic_name(v["container_id"].as_str().unwrap(), "eth0")
                .unwrap()
                .0
        })
        .collect();
    assert_eq!(host_veths.len(), 4);
    assert!(host_veths.iter().all(|v| link_exists(v)), "{host_veths:?}");
    assert!(sb.run(&["down"]).status.success());
    for p in &pids {
        assert!(!p.alive(), "{} (pid {}) still running", p.name, p.pid);
    }
    assert!(sb.netns().is_empty(), "{:?}", sb.netns());
    for l in host_veths.iter().chain([&sb.bridge, &sb.nic]) {
        assert!(!link_exists(l), "link {l} left behind");
    }
    assert!(!sb.run(&["status"]).status.success());
}
