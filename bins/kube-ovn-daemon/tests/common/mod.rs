//! End-to-end harness: a real single-node OVN (kube-ovn-sandbox), the daemon in-process on a unix socket in a
//! temporary directory, and our shim binary `kube-ovn` exec'd as kubelet does. Needs root.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use kubeovn_cni::node::{
    init_node, CniHandler, HandlerConfig, IcmpGatewayProbe, Metrics, NodeConfig, PodNetwork,
    PodNetworkSource, Server, StaticPodNetworks,
};
use kubeovn_netdev::{NamedNetns, Namespaces, NetlinkNetdev};
use kubeovn_ovn::northbound::{
    Batch, LogicalSwitch, Northbound, OvsdbNorthbound, Patch, Router, SwitchPort,
};
use kubeovn_ovn::vswitch::OvsdbOpenVSwitch;
use kubeovn_ovn_stack::ovn::{missing_programs, OvnOptions, OvnStack};
use serde_json::{json, Value};

use kubeovn_test_support::{cargo_build, skip};

static SERIAL: Mutex<()> = Mutex::new(());
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Serialises the tests of one binary that run a stack (ovs-vswitchd's userspace datapath shares its
/// `ovs-netdev` device between instances).
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether the test can run (root, OVN installed); if not, it is skipped ([`skip::skip`]: a failure under
/// CI).
pub fn runnable() -> bool {
    if !skip::is_root() {
        skip::skip("needs root (netns, veth, OVS userspace datapath)");
        return false;
    }
    if let Some(p) = missing_programs() {
        skip::skip(&format!("{p} is not installed"));
        return false;
    }
    true
}

/// The shim binary, built by cargo in the same target directory (built on demand when absent).
pub fn shim_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        // target/<profile>/deps/<test> -> target/<profile>/kube-ovn
        let dir = exe.parent().unwrap().parent().unwrap().to_owned();
        let shim = dir.join("kube-ovn");
        if !shim.exists() {
            cargo_build::cargo_build(&dir, &["-p", "kube-ovn-cni", "--bin", "kube-ovn"]);
        }
        shim
    })
    .clone()
}

/// One pod sandbox: a named netns and a container id.
#[derive(Debug, Clone)]
pub struct Pod {
    pub name: String,
    pub namespace: String,
    pub netns_name: String,
    pub netns: PathBuf,
    pub container_id: String,
    pub ifname: String,
}

impl Pod {
    /// The host end of its veth.
    pub fn host_if(&self) -> String {
        format!("{}_h", &self.container_id[..12])
    }
}

pub struct Harness {
    pub rt: tokio::runtime::Runtime,
    pub dir: tempfile::TempDir,
    pub stack: OvnStack,
    pub ovs: Arc<OvsdbOpenVSwitch>,
    pub nb: OvsdbNorthbound,
    pub source: Arc<StaticPodNetworks>,
    pub metrics: Arc<Metrics>,
    pub server: Option<Server>,
    pub sock: PathBuf,
    pub bridge: String,
    pub tag: String,
    pods: Vec<Pod>,
    _serial: MutexGuard<'static, ()>,
}

impl Harness {
    /// A stack with its own bridge, node start through the daemon's `init_node`, and the daemon serving
    /// `cfg` with the static pod-network source.
    pub fn start(tweak: impl FnOnce(&mut HandlerConfig)) -> Harness {
        let source = Arc::new(StaticPodNetworks::new());
        Self::start_with(tweak, runtime(), source.clone(), source)
    }

    /// Like [`Harness::start`] on runtime `rt` (where `source` runs) with another pod-network source.
    pub fn start_with(
        tweak: impl FnOnce(&mut HandlerConfig),
        rt: tokio::runtime::Runtime,
        static_source: Arc<StaticPodNetworks>,
        source: Arc<dyn PodNetworkSource>,
    ) -> Harness {
        let serial = serial();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{:05}{n:x}", std::process::id() % 100_000);
        let bridge = format!("br-e{tag}");
        let dir = tempfile::Builder::new()
            .prefix("kovn-e2e")
            .tempdir()
            .unwrap();
        let (stack, ovs, nb) = rt.block_on(async {
            let stack = OvnStack::start(
                dir.path(),
                OvnOptions::new(&bridge).without_chassis_config(),
            )
            .await
            .unwrap();
            let ovs = Arc::new(
                OvsdbOpenVSwitch::connect(&stack.ovs_remote())
                    .await
                    .unwrap(),
            );
            let host = NetlinkNetdev::current().unwrap();
            let mut node = NodeConfig::new(stack.options().system_id.clone(), stack.sb_remote());
            node.bridge = bridge.clone();
            node.datapath_type = "netdev".into();
            init_node(ovs.as_ref(), &host, &node).await.unwrap();
            stack.wait_chassis().await.unwrap();
            let nb = OvsdbNorthbound::connect(&stack.nb_remote()).await.unwrap();
            (stack, ovs, nb)
        });
        let mut cfg = HandlerConfig {
            bridge: bridge.clone(),
            pod_network_timeout: Duration::from_secs(3),
            ovn_installed_timeout: Some(Duration::from_secs(10)),
            gateway_timeout: Some(Duration::from_secs(5)),
            ..Default::default()
        };
        tweak(&mut cfg);
        let metrics = Arc::new(Metrics::new());
        let sock = dir.path().join("daemon.sock");
        let server = rt.block_on(async {
            let handler = CniHandler::new(
                cfg,
                source,
                ovs.clone(),
                Arc::new(NetlinkNetdev::current().unwrap()),
                Arc::new(NamedNetns::default()),
                Arc::new(IcmpGatewayProbe::default()),
            );
            Server::start(
                &sock,
                Some("127.0.0.1:0".parse().unwrap()),
                Arc::new(handler),
                metrics.clone(),
            )
            .await
            .unwrap()
        });
        Harness {
            rt,
            dir,
            stack,
            ovs,
            nb,
            source: static_source,
            metrics,
            server: Some(server),
            sock,
            bridge,
            tag,
            pods: Vec::new(),
            _serial: serial,
        }
    }

    /// Logical switch `name` with its gateway `gw_cidr` on router `router` (patch pair).
    pub fn subnet(&self, name: &str, router: &str, gw_mac: &str, gw_cidr: &str) {
        self.subnet_with(name, router, gw_mac, &[gw_cidr]);
    }

    /// [`Harness::subnet`] with several gateway networks on the router port (dual stack).
    pub fn subnet_with(&self, name: &str, router: &str, gw_mac: &str, gw_cidrs: &[&str]) {
        self.rt.block_on(async {
            let mut b = Batch::new();
            b.add(LogicalSwitch::new(name));
            b.add(Router::new(router));
            b.patch(Patch::new(name, router, gw_mac, gw_cidrs.iter().copied()));
            self.nb.commit(b).await.unwrap();
        });
    }

    /// The logical switch port `<pod>.<ns>` with `"<mac> <ip>"`.
    pub fn lsp(&self, switch: &str, pod: &Pod, mac: &str, ip: &str) {
        self.rt.block_on(async {
            let addr = format!("{mac} {ip}");
            SwitchPort::new(switch, format!("{}.{}", pod.name, pod.namespace))
                .addresses([addr.clone()])
                .port_security([addr])
                .execute(&self.nb)
                .await
                .unwrap();
        });
    }

    /// A pod sandbox (netns created now, deleted when the harness drops).
    pub fn pod(&mut self, name: &str) -> Pod {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let netns_name = format!("kovn-{}-{name}", self.tag);
        let netns = NamedNetns::default().create(&netns_name).unwrap();
        // The first 12 characters name the host interface: unique per test run.
        let container_id = format!(
            "{}{:04x}{:03x}feedc0ffee0123456789",
            &self.tag[..5],
            n & 0xffff,
            0
        );
        let pod = Pod {
            name: name.to_owned(),
            namespace: "e2e".into(),
            netns_name,
            netns,
            container_id,
            ifname: "eth0".into(),
        };
        self.pods.push(pod.clone());
        pod
    }

    /// Publishes the pod's network in the static source.
    pub fn publish(&self, pod: &Pod, net: PodNetwork) {
        self.source.insert(&pod.namespace, &pod.name, net);
    }

    /// The netconf the shim gets on stdin.
    pub fn netconf(&self, version: &str) -> Value {
        json!({
            "cniVersion": version,
            "name": "kube-ovn",
            "type": "kube-ovn",
            "server_socket": self.sock,
        })
    }

    /// Runs the shim as kubelet does; returns (exit code, stdout as JSON or Null).
    pub fn shim(&self, command: &str, pod: &Pod, conf: &Value) -> (i32, Value) {
        self.shim_env(command, pod, conf, &[])
    }

    /// [`Harness::shim`] with environment overrides (`("CNI_NETNS", "/nope")`; an empty value unsets).
    pub fn shim_env(
        &self,
        command: &str,
        pod: &Pod,
        conf: &Value,
        over: &[(&str, &str)],
    ) -> (i32, Value) {
        let mut env: Vec<(String, String)> = vec![
            ("CNI_COMMAND".into(), command.into()),
            ("CNI_CONTAINERID".into(), pod.container_id.clone()),
            ("CNI_NETNS".into(), pod.netns.display().to_string()),
            ("CNI_IFNAME".into(), pod.ifname.clone()),
            ("CNI_PATH".into(), "/opt/cni/bin".into()),
            (
                "CNI_ARGS".into(),
                format!(
                    "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={}",
                    pod.namespace, pod.name, pod.container_id
                ),
            ),
        ];
        for (k, v) in over {
            env.retain(|(ek, _)| ek != k);
            if !v.is_empty() {
                env.push(((*k).into(), (*v).into()));
            }
        }
        run_shim(&env, conf)
    }

    /// `ovs-vsctl` against this stack's database (an independent client to check what the daemon did).
    pub fn vsctl(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new("ovs-vsctl")
            .arg(format!("--db={}", self.stack.ovs_remote()))
            .arg("--timeout=10")
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        )
    }

    /// The bridge's ports, by `ovs-vsctl list-ports`.
    pub fn ports(&self) -> Vec<String> {
        let (ok, out) = self.vsctl(&["list-ports", &self.bridge]);
        assert!(ok);
        out.lines()
            .map(str::to_owned)
            .filter(|s| !s.is_empty())
            .collect()
    }

    /// Pings `ip` from the pod's netns (`ip netns exec ... ping`).
    pub fn ping(&self, from: &Pod, ip: &str) -> bool {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &from.netns_name,
                "ping",
                "-c",
                "1",
                "-W",
                "2",
                ip,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// Starts a TCP and UDP echo server (python3, the independent checker) on `ip:port` inside the pod's
    /// namespace; it stops when the guard drops.
    pub fn echo_server(&self, pod: &Pod, ip: &str, port: u16) -> EchoServer {
        use std::io::BufRead;
        let mut child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &pod.netns_name,
                "python3",
                "-c",
                ECHO_SERVER,
                ip,
            ])
            .arg(port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "echo server in {}", pod.name);
        EchoServer(child)
    }

    /// Whether a TCP connection from the pod to `ip:port` carries 64 KiB there and back (full-size
    /// segments, not only a handshake), within a few seconds.
    pub fn tcp(&self, from: &Pod, ip: &str, port: u16) -> bool {
        self.echo_client(from, "tcp", ip, port)
    }

    /// Whether a UDP datagram from the pod to `ip:port` comes back (three tries, 1 s each).
    pub fn udp(&self, from: &Pod, ip: &str, port: u16) -> bool {
        self.echo_client(from, "udp", ip, port)
    }

    fn echo_client(&self, from: &Pod, proto: &str, ip: &str, port: u16) -> bool {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &from.netns_name,
                "python3",
                "-c",
                ECHO_CLIENT,
                proto,
                ip,
            ])
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// Whether link `name` exists in the root namespace (`ip link show`).
    pub fn host_link_exists(name: &str) -> bool {
        Path::new("/sys/class/net").join(name).exists()
    }

    /// Waits (up to 3 s) until the pod's veth is gone from both namespaces: DEL deletes it just after it
    /// answers.
    pub fn veth_gone(pod: &Pod) -> bool {
        let t0 = std::time::Instant::now();
        while Self::host_link_exists(&pod.host_if()) || Self::pod_link_exists(pod, &pod.ifname) {
            if t0.elapsed() > Duration::from_secs(3) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// Whether link `name` exists in the pod's netns (`ip -n NS link show NAME`).
    pub fn pod_link_exists(pod: &Pod, name: &str) -> bool {
        Command::new("ip")
            .args(["-n", &pod.netns_name, "link", "show", name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// The metrics exposition, fetched over HTTP from the daemon's metrics endpoint.
    pub fn scrape(&self) -> String {
        let addr = self.server.as_ref().unwrap().metrics_addr().unwrap();
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }
}

/// A runtime for a harness: the daemon and the OVSDB clients run on its two workers while the test
/// thread execs the shim.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs the shim with exactly `env` (plus PATH) and `conf` on stdin.
pub fn run_shim(env: &[(String, String)], conf: &Value) -> (i32, Value) {
    use std::io::Write;
    let mut child = Command::new(shim_path())
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), v)
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            self.rt.block_on(s.shutdown());
        }
        for p in &self.pods {
            let _ = Command::new("ip")
                .args(["link", "del", &p.host_if()])
                .stderr(Stdio::null())
                .status();
            let _ = NamedNetns::default().delete(&p.netns_name);
        }
        self.stack.stop();
    }
}

/// TCP and UDP echo on argv[1]:argv[2]; prints `ready` once both listen.
const ECHO_SERVER: &str = r#"
import socket, sys, threading
ip, port = sys.argv[1], int(sys.argv[2])
fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
t = socket.socket(fam, socket.SOCK_STREAM)
t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind((ip, port))
t.listen(8)
u = socket.socket(fam, socket.SOCK_DGRAM)
u.bind((ip, port))
def udp():
    while True:
        d, a = u.recvfrom(65536)
        u.sendto(d, a)
def tcp(c):
    with c:
        while True:
            d = c.recv(65536)
            if not d:
                return
            c.sendall(d)
threading.Thread(target=udp, daemon=True).start()
print("ready", flush=True)
while True:
    c, _ = t.accept()
    threading.Thread(target=tcp, args=(c,), daemon=True).start()
"#;

/// argv[1] (`tcp` or `udp`) to the echo server on argv[2]:argv[3]; exit 0 when the payload comes back.
const ECHO_CLIENT: &str = r#"
import socket, sys
proto, ip, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
if proto == "tcp":
    data = bytes(range(256)) * 256
    s = socket.create_connection((ip, port), timeout=3)
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    got = b""
    while len(got) < len(data):
        d = s.recv(65536)
        if not d:
            break
        got += d
    sys.exit(0 if got == data else 1)
s = socket.socket(fam, socket.SOCK_DGRAM)
s.settimeout(1)
for _ in range(3):
    s.sendto(b"kube-ovn-udp", (ip, port))
    try:
        if s.recvfrom(64)[0] == b"kube-ovn-udp":
            sys.exit(0)
    except socket.timeout:
        pass
sys.exit(1)
"#;

/// A running echo server, killed (by its pid) and reaped on drop.
pub struct EchoServer(std::process::Child);

impl Drop for EchoServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A pod network: one IPv4 address with `prefix`, its gateway, a MAC.
pub fn net(ip: &str, gw: &str, mac: &str, switch: &str) -> PodNetwork {
    PodNetwork {
        ips: vec![ip.parse().unwrap()],
        mac: Some(mac.parse().unwrap()),
        gateways: vec![gw.parse().unwrap()],
        logical_switch: switch.into(),
        provider: "ovn".into(),
        ..Default::default()
    }
}
