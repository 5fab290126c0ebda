//! Root tests: Debian's reference `bridge` plugin (cniVersion 1.0.0) delegates IPAM to our binary for real
//! network namespaces. The bridge and every address live in namespaces these tests create (a "node"
//! namespace per test and one per pod); a guard deletes them all, also when a test fails.
//!
//! Skipped, with the reason shown, when not root or when `/usr/lib/cni/bridge` is missing (a failure under CI).

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use common::{exec, Out, PLUGIN};
use serde_json::{json, Value};

const BRIDGE: &str = "/usr/lib/cni/bridge";

static SEQ: AtomicU32 = AtomicU32::new(0);

use kubeovn_test_support::skip;

fn skip_reason() -> Option<String> {
    if !skip::is_root() {
        return Some("not root: network namespaces need root".into());
    }
    if !Path::new(BRIDGE).exists() {
        return Some(format!(
            "{BRIDGE} missing: apt-get install containernetworking-plugins"
        ));
    }
    None
}

macro_rules! lab_or_skip {
    ($octet:expr) => {
        match skip_reason() {
            Some(why) => {
                skip::skip(&why);
                return;
            }
            None => Lab::new($octet),
        }
    };
}

fn ip(args: &[&str]) -> std::process::Output {
    Command::new("ip").args(args).output().expect("run ip")
}

/// A node namespace with a bridge network, pod namespaces, and the plugin's state; all removed on drop.
struct Lab {
    tag: String,
    node: String,
    pods: Vec<String>,
    conf: Value,
    octet: u8,
    _dir: tempfile::TempDir,
}

impl Lab {
    fn new(octet: u8) -> Lab {
        // Short and unique per process and test: link names have at most 15 characters.
        let tag = format!(
            "k{:x}{:x}",
            std::process::id() % 0xfffff,
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let node = format!("{tag}-node");
        let dir = tempfile::tempdir().expect("tempdir");
        let lab = Lab {
            conf: json!({
                "cniVersion": "1.0.0", "name": format!("{tag}-net"), "type": "bridge", "bridge": format!("{tag}br"),
                "isGateway": true, "ipMasq": false, "hairpinMode": false,
                "ipam": {"type": "kube-ovn-ipam", "subnet": format!("10.{octet}.0.0/16"),
                         "routes": [{"dst": "0.0.0.0/0"}], "dataDir": dir.path()}
            }),
            tag,
            node,
            pods: Vec::new(),
            octet,
            _dir: dir,
        };
        let o = ip(&["netns", "add", &lab.node]);
        assert!(o.status.success(), "ip netns add {}: {o:?}", lab.node);
        ip(&["-n", &lab.node, "link", "set", "lo", "up"]);
        lab
    }

    fn pod(&mut self) -> String {
        let name = format!("{}-p{}", self.tag, self.pods.len());
        let o = ip(&["netns", "add", &name]);
        assert!(o.status.success(), "ip netns add {name}: {o:?}");
        self.pods.push(name.clone());
        name
    }

    /// Runs the bridge plugin in the node namespace, as a runtime would, for `pod`.
    fn cni(&self, command: &str, pod: &str, conf: &Value) -> Out {
        let dir = Path::new(PLUGIN)
            .parent()
            .expect("plugin dir")
            .display()
            .to_string();
        let cni_path = format!("{dir}:/usr/lib/cni");
        let netns = format!("/var/run/netns/{pod}");
        let nsenter = format!("--net=/var/run/netns/{}", self.node);
        let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=test;K8S_POD_NAME={pod}");
        let env = [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", pod),
            ("CNI_NETNS", netns.as_str()),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", cni_path.as_str()),
            ("CNI_ARGS", args.as_str()),
        ];
        exec(
            &["nsenter", &nsenter, "--", BRIDGE],
            &env,
            conf.to_string().as_bytes(),
        )
    }

    fn add(&self, pod: &str) -> Value {
        let r = self.cni("ADD", pod, &self.conf).ok();
        assert_eq!(r["cniVersion"], "1.0.0");
        r
    }

    fn del(&self, pod: &str, prev: &Value) {
        let mut conf = self.conf.clone();
        conf["prevResult"] = prev.clone();
        self.cni("DEL", pod, &conf).ok();
    }

    fn ping(&self, from: &str, to: &str) -> bool {
        Command::new("ip")
            .args([
                "netns", "exec", from, "ping", "-c", "2", "-i", "0.2", "-W", "2", to,
            ])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    fn eth0_v4(&self, pod: &str) -> String {
        let o = ip(&["-n", pod, "-4", "-o", "addr", "show", "dev", "eth0"]);
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .nth(3)
            .unwrap_or("")
            .to_owned()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Deleting a pod namespace removes its veth pair; deleting the node namespace removes the bridge.
        for p in &self.pods {
            ip(&["netns", "del", p]);
        }
        ip(&["netns", "del", &self.node]);
    }
}

fn first_ip(r: &Value) -> String {
    Out::addresses(r)[0]
        .split('/')
        .next()
        .unwrap_or("")
        .to_owned()
}

#[test]
fn root_two_pods_ping_across_the_bridge() {
    let mut lab = lab_or_skip!(201);
    let (a, b) = (lab.pod(), lab.pod());
    let ra = lab.add(&a);
    // The second pod asks for a static address; the bridge passes runtimeConfig through to the IPAM.
    let mut conf = lab.conf.clone();
    conf["runtimeConfig"] = json!({"ips": [format!("10.{}.0.77/16", lab.octet)]});
    let rb = lab.cni("ADD", &b, &conf).ok();
    assert_eq!(Out::addresses(&ra), [format!("10.{}.0.2/16", lab.octet)]);
    assert_eq!(Out::addresses(&rb), [format!("10.{}.0.77/16", lab.octet)]);
    assert_eq!(ra["ips"][0]["gateway"], format!("10.{}.0.1", lab.octet));
    assert!(
        ra["interfaces"].as_array().is_some_and(|i| i.len() == 3),
        "bridge, veth, eth0: {ra}"
    );
    assert_eq!(lab.eth0_v4(&b), format!("10.{}.0.77/16", lab.octet));
    assert!(lab.ping(&a, &first_ip(&rb)), "pod a cannot ping pod b");
    assert!(lab.ping(&b, &first_ip(&ra)), "pod b cannot ping pod a");
    assert!(
        lab.ping(&a, &format!("10.{}.0.1", lab.octet)),
        "pod a cannot ping the gateway"
    );
    lab.del(&a, &ra);
    lab.del(&b, &rb);
}

#[test]
fn root_fifty_concurrent_adds_get_fifty_addresses() {
    let mut lab = lab_or_skip!(202);
    let pods: Vec<String> = (0..50).map(|_| lab.pod()).collect();
    let results: Vec<Value> = std::thread::scope(|s| {
        let hs: Vec<_> = pods.iter().map(|p| s.spawn(|| lab.add(p))).collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    let addrs: HashSet<String> = results.iter().map(first_ip).collect();
    assert_eq!(
        addrs.len(),
        50,
        "50 pods, {} distinct addresses",
        addrs.len()
    );
    for (p, r) in pods.iter().zip(&results).step_by(10) {
        assert_eq!(lab.eth0_v4(p), Out::addresses(r)[0], "{p}");
    }
    assert!(lab.ping(&pods[0], &first_ip(&results[49])));
    std::thread::scope(|s| {
        for (p, r) in pods.iter().zip(&results) {
            let lab = &lab;
            s.spawn(move || lab.del(p, r));
        }
    });
    // Everything was released: the plugin's own CHECK finds nothing for any pod.
    let env_path = Path::new(PLUGIN)
        .parent()
        .expect("dir")
        .display()
        .to_string();
    for p in pods.iter().take(5) {
        let env = [
            ("CNI_COMMAND", "CHECK"),
            ("CNI_CONTAINERID", p.as_str()),
            ("CNI_NETNS", "/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", env_path.as_str()),
        ];
        exec(&[PLUGIN], &env, lab.conf.to_string().as_bytes()).err(102);
    }
}

#[test]
fn root_del_then_add_again() {
    let mut lab = lab_or_skip!(203);
    let p = lab.pod();
    let r1 = lab.add(&p);
    lab.del(&p, &r1);
    assert_eq!(lab.eth0_v4(&p), "", "DEL removed eth0");
    lab.cni("DEL", &p, &lab.conf).ok();
    let r2 = lab.add(&p);
    assert_ne!(
        first_ip(&r1),
        first_ip(&r2),
        "a released address is reused last"
    );
    assert_eq!(lab.eth0_v4(&p), Out::addresses(&r2)[0]);
    assert!(
        lab.ping(&p, &format!("10.{}.0.1", lab.octet)),
        "the pod reaches its gateway"
    );
    lab.del(&p, &r2);
}
