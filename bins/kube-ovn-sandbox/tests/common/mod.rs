//! What the sandbox's root tests share: whether they can run, our binaries, a sandbox in a temporary state
//! directory (taken down on drop) and its tools.

#![allow(dead_code)] // Each test file uses its part.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use kubeovn_sandbox::ovn::missing_programs;
use serde_json::Value;

pub use kubeovn_test_support::cargo_build;

pub use kubeovn_test_support::skip;

/// Whether the test can run (root, OVN, kubectl, ping); if not, it is skipped ([`skip::skip`]: a failure
/// under CI).
pub fn runnable() -> bool {
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
pub fn bin_dir() -> PathBuf {
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

pub struct Sandbox {
    pub dir: tempfile::TempDir,
    pub bins: PathBuf,
    pub prefix: String,
    pub bridge: String,
    pub nic: String,
}

impl Sandbox {
    pub fn run(&self, args: &[&str]) -> Output {
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

    pub fn ko(&self, args: &[&str]) -> Output {
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

    pub fn tool(&self, bin: &str, args: &[&str]) -> Output {
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

    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.dir.path().join("kubeconfig"))
            .args(args)
            .output()
            .unwrap()
    }

    pub fn pods(&self) -> Vec<Value> {
        let out = self.kubectl(&["get", "pods", "-A", "-o", "json"]);
        assert!(out.status.success(), "{out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["items"].as_array().cloned().unwrap_or_default()
    }

    pub fn pod(&self, name: &str) -> Value {
        let out = self.kubectl(&["get", "pod", name, "-o", "json"]);
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Whether an HTTP GET of `url` from pod `pod` (`NS/NAME`) within `secs` returns a directory listing (what
    /// `python3 -m http.server` serves).
    pub fn http_get_listing(&self, pod: &str, url: &str, secs: u32) -> bool {
        let secs = secs.to_string();
        let out = self.run(&["exec", pod, "--", "curl", "-sS", "--max-time", &secs, url]);
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("Directory listing")
    }

    pub fn apply(&self, objects: &Value) {
        use std::io::Write;
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.dir.path().join("kubeconfig"))
            .args(["apply", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(objects.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "kubectl apply: {out:?}");
    }

    /// The kubelet's pod records.
    pub fn records(&self) -> Vec<Value> {
        std::fs::read_dir(self.dir.path().join("pods"))
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .map(|e| serde_json::from_slice(&std::fs::read(e.path()).unwrap()).unwrap())
            .collect()
    }

    /// The process group of pod `name`'s first container (its monitor's pid).
    pub fn container_group(&self, name: &str) -> u32 {
        let rec = self
            .records()
            .into_iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("no record of pod {name}"));
        let pid = rec["containers"][0]["proc"]["pid"].as_u64();
        u32::try_from(pid.unwrap_or_else(|| panic!("pod {name} runs no process: {rec}"))).unwrap()
    }

    /// Every pod of every node with its network namespace (`namespace/name`, path), from the kubelets'
    /// records.
    pub fn netns_of_pods(&self) -> Vec<(String, PathBuf)> {
        let dir = kubeovn_sandbox::state::StateDir::new(self.dir.path());
        kubeovn_sandbox::kubelet::all_records(&dir)
            .into_iter()
            .map(|r| (format!("{}/{}", r.namespace, r.name), r.netns))
            .collect()
    }

    pub fn netns(&self) -> Vec<String> {
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

/// Whether a pod's `Ready` condition is true.
pub fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A sandbox of this test's own: waits until no other ovs-vswitchd runs in this network namespace (one
/// userspace datapath per namespace), then runs `up` with names derived from `letters` and the pid (node,
/// bridge, join interface, netns prefix) and `args` (CIDRs, demo size). Returns the sandbox and `up`'s output.
pub fn up(letters: &str, args: &[&str]) -> (Sandbox, Output) {
    let t0 = Instant::now();
    while let Some((pid, cmd)) = kubeovn_sandbox::sandbox::other_vswitchd() {
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "another ovs-vswitchd (pid {pid}: {cmd}) kept running for 3 minutes"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let tag = format!("{letters}{}", std::process::id() % 10000);
    let sb = Sandbox {
        dir: tempfile::Builder::new()
            .prefix(&format!("kube-ovn-sandbox-{letters}"))
            .tempdir()
            .unwrap(),
        bins: bin_dir(),
        prefix: tag.clone(),
        bridge: format!("br-{tag}"),
        nic: format!("{tag}j"),
    };
    let mut a = vec![
        "up",
        "--no-install",
        "--api-port",
        "0",
        "--node-name",
        &tag,
        "--bridge",
        &sb.bridge,
        "--node-nic",
        &sb.nic,
        "--netns-prefix",
        &sb.prefix,
    ];
    a.extend(args);
    let out = sb.run(&a);
    (sb, out)
}
