//! `internalTrafficPolicy: Local` on the real datapath (needs root and the OVN/OVS packages): a template load
//! balancer whose VIP `10.96.0.10:80` balances to the variable `^VAR`, which each chassis' `Chassis_Template_Var`
//! row sets to that chassis' local endpoints. On this one chassis, TCP through the VIP from a pod reaches only the
//! backend the chassis' row lists (A, then B after a change), never the one another chassis' row lists; with
//! the variable empty the VIP no longer connects. An ordinary load balancer in the same `Load_Balancer_Group`
//! keeps working beside it.

#![allow(clippy::unwrap_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube_ovn_sandbox::ovn::{missing_programs, OvnOptions, OvnStack};
use kubeovn_ovn::northbound::{
    template_var_name, Batch, ChassisTemplateVars, LoadBalancer, LoadBalancerProtocol,
    LogicalSwitch, Northbound, OvsdbNorthbound, Patch, Router, SwitchPort,
};
use kubeovn_ovn::ops::{Condition, Operation};
use kubeovn_ovn::vswitch::{OpenVSwitch, OvsBatch, OvsdbOpenVSwitch, PortSpec};
use kubeovn_ovn::{Atom, Datum};

#[path = "../../../test-support/skip.rs"]
mod skip;

/// Whether the test can run (root, OVN); if not, it is skipped ([`skip::skip`]: a failure under CI).
fn runnable() -> bool {
    if !skip::is_root() {
        skip::skip("needs root (netns, veth, OVS userspace datapath)");
        return false;
    }
    if let Some(p) = missing_programs() {
        skip::skip(&format!("{p} is not installed"));
        return false;
    }
    for p in ["ip", "python3"] {
        if !skip::installed(p) {
            skip::skip(&format!("{p} is not installed"));
            return false;
        }
    }
    true
}

/// Answers each TCP connection on argv[2] with argv[1] and closes it.
const NAME_SERVER: &str = r#"
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[2])))
s.listen(16)
while True:
    c, _ = s.accept()
    c.sendall(sys.argv[1].encode())
    c.close()
"#;

/// argv[3] TCP connections to argv[1]:argv[2] (1 s timeout each), one line per connection: what the server
/// said, or `ERR <error>`.
const CLIENT: &str = r#"
import socket, sys
for _ in range(int(sys.argv[3])):
    try:
        s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1)
        print(s.recv(64).decode() or "EMPTY", flush=True)
        s.close()
    except Exception as e:
        print("ERR", type(e).__name__, flush=True)
"#;

/// The pods (netns with a veth whose host end is on the bridge) and servers this test made: deleted and
/// killed (by pid) on drop, before the stack stops.
struct Pods {
    tag: String,
    names: Vec<String>,
    servers: Vec<Child>,
}

impl Pods {
    fn netns(&self, pod: &str) -> String {
        format!("tlb{}{pod}", self.tag)
    }

    fn host_if(&self, pod: &str) -> String {
        format!("tlb{}{pod}_h", self.tag)
    }

    /// Netns `pod` with `eth0` (`mac`, `ip`/24, default route via `gw`, TX checksum offload off) and the
    /// host end plugged into `bridge` as logical port `pod`.
    async fn add(
        &mut self,
        ovs: &OvsdbOpenVSwitch,
        bridge: &str,
        pod: &str,
        mac: &str,
        ip: &str,
        gw: &str,
    ) {
        let ns = self.netns(pod);
        let host = self.host_if(pod);
        self.names.push(pod.to_owned());
        run("ip", &["netns", "add", &ns]);
        run(
            "ip",
            &[
                "link", "add", &host, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ],
        );
        let cidr = format!("{ip}/24");
        for args in [
            vec!["link", "set", "eth0", "address", mac],
            vec!["addr", "add", &cidr, "dev", "eth0"],
            vec!["link", "set", "eth0", "up"],
            vec!["link", "set", "lo", "up"],
            vec!["route", "add", "default", "via", gw],
        ] {
            let mut a = vec!["-n", &ns];
            a.extend(args);
            run("ip", &a);
        }
        // The userspace datapath forwards veths' partial checksums: TCP needs TX checksumming off.
        run(
            "ip",
            &["netns", "exec", &ns, "ethtool", "-K", "eth0", "tx", "off"],
        );
        run("ip", &["link", "set", &host, "up"]);
        let mut b = OvsBatch::new();
        b.add(PortSpec::new(bridge, &host).iface_id(pod));
        ovs.commit(b).await.unwrap();
    }

    /// Starts the name server in `pod` on `port`.
    fn serve(&mut self, pod: &str, port: u16) {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.netns(pod), "python3", "-c"])
            .arg(NAME_SERVER)
            .args([pod, &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.servers.push(child);
    }

    /// `n` connections from `pod` to `ip`:`port`: what each got.
    fn connect(&self, pod: &str, ip: &str, port: u16, n: usize) -> Vec<String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.netns(pod), "python3", "-c"])
            .arg(CLIENT)
            .args([ip, &port.to_string(), &n.to_string()])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Connects once every 50 ms until the answer is `want` (within 15 s), then `n` more times: the answers.
    fn settle_then(&self, pod: &str, ip: &str, port: u16, want: &str, n: usize) -> Vec<String> {
        let t0 = Instant::now();
        loop {
            let got = self.connect(pod, ip, port, 1);
            if got.first().map(String::as_str) == Some(want) {
                return self.connect(pod, ip, port, n);
            }
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "{pod} -> {ip}:{port}: {got:?}, waiting for {want}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Pods {
    fn drop(&mut self) {
        for c in &mut self.servers {
            let _ = c.kill();
            let _ = c.wait();
        }
        for p in &self.names {
            let _ = Command::new("ip")
                .args(["link", "del", &self.host_if(p)])
                .stderr(Stdio::null())
                .status();
            let _ = Command::new("ip")
                .args(["netns", "del", &self.netns(p)])
                .status();
        }
    }
}

fn run(prog: &str, args: &[&str]) {
    let out = Command::new(prog).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{prog} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_lb_reaches_only_this_chassis_backends() {
    if !runnable() {
        return;
    }
    let tag = format!("{}", std::process::id() % 100_000);
    let dir = tempfile::tempdir().unwrap();
    let bridge = format!("br-tlb{tag}");
    let stack = OvnStack::start(dir.path(), OvnOptions::new(&bridge))
        .await
        .unwrap();
    let chassis = stack.options().system_id.clone();
    let ovs = OvsdbOpenVSwitch::connect(&stack.ovs_remote())
        .await
        .unwrap();
    let nb = OvsdbNorthbound::connect(&stack.nb_remote()).await.unwrap();

    // One switch with a router (the client sends to the gateway MAC; the switch's load balancer translates
    // first), a client pod c and two backend pods a and b.
    let mut b = Batch::new();
    b.add(LogicalSwitch::new("ls-tlb"))
        .add(Router::new("lr-tlb"))
        .patch(Patch::new(
            "ls-tlb",
            "lr-tlb",
            "00:00:00:7b:00:01",
            ["10.250.7.1/24"],
        ));
    let pods = [
        ("c", "00:00:00:7b:00:11", "10.250.7.11"),
        ("a", "00:00:00:7b:00:12", "10.250.7.12"),
        ("b", "00:00:00:7b:00:13", "10.250.7.13"),
    ];
    for (p, mac, ip) in pods {
        b.add(SwitchPort::new("ls-tlb", p).addresses([format!("{mac} {ip}")]));
    }
    nb.commit(b).await.unwrap();
    let mut netns = Pods {
        tag,
        names: Vec::new(),
        servers: Vec::new(),
    };
    for (p, mac, ip) in pods {
        netns.add(&ovs, &bridge, p, mac, ip, "10.250.7.1").await;
    }
    netns.serve("a", 8080);
    netns.serve("b", 8080);
    assert_eq!(netns.settle_then("c", "10.250.7.12", 8080, "a", 1), ["a"]);
    assert_eq!(netns.settle_then("c", "10.250.7.13", 8080, "b", 1), ["b"]);

    // The template load balancer (a Kubernetes name escaped into a variable name) and an ordinary one, in one
    // Load_Balancer_Group on the switch.
    let var = template_var_name("svc.itp-test.web.tcp.80");
    let mut b = Batch::new();
    b.add(
        LoadBalancer::new("svc.itp-test.web.tcp")
            .protocol(LoadBalancerProtocol::Tcp)
            .vip("10.96.0.10:80", [format!("^{var}")])
            .option("template", "true")
            .option("address-family", "ipv4"),
    )
    .add(
        LoadBalancer::new("svc.itp-test.plain.tcp")
            .protocol(LoadBalancerProtocol::Tcp)
            .vip("10.96.0.20:80", ["10.250.7.13:8080"]),
    )
    // This chassis lists a, another chassis lists b.
    .add(ChassisTemplateVars::new(&chassis).var(&var, "10.250.7.12:8080"))
    .add(ChassisTemplateVars::new("another-node").var(&var, "10.250.7.13:8080"));
    nb.commit(b).await.unwrap();
    let lbs: Vec<Atom> = ["svc.itp-test.web.tcp", "svc.itp-test.plain.tcp"]
        .iter()
        .map(|n| Atom::Uuid(nb.load_balancer(n).unwrap().uuid))
        .collect();
    let mut b = Batch::new();
    b.raw(
        Operation::insert("Load_Balancer_Group")
            .uuid_name("lbg")
            .value("name", "lbg.tlb")
            .value("load_balancer", Datum::Set(lbs)),
    );
    b.raw(
        Operation::mutate("Logical_Switch")
            .filter(Condition::eq("name", "ls-tlb"))
            .insert("load_balancer_group", Datum::named_uuid("lbg")),
    );
    nb.commit(b).await.unwrap();

    let got = netns.settle_then("c", "10.96.0.10", 80, "a", 6);
    assert!(
        got.iter().all(|g| g == "a"),
        "only this chassis' a: {got:?}"
    );
    let got = netns.settle_then("c", "10.96.0.20", 80, "b", 2);
    assert!(got.iter().all(|g| g == "b"), "the ordinary VIP: {got:?}");

    // The endpoint moves: one variable changed, the VIP follows.
    ChassisTemplateVars::new(&chassis)
        .var(&var, "10.250.7.13:8080")
        .execute(&nb)
        .await
        .unwrap();
    let got = netns.settle_then("c", "10.96.0.10", 80, "b", 6);
    assert!(got.iter().all(|g| g == "b"), "{got:?}");

    // No local endpoint (another chassis still has one): the VIP does not connect on this chassis.
    let mut b = Batch::new();
    b.add(ChassisTemplateVars::new(&chassis).var(&var, ""))
        .add(ChassisTemplateVars::new("another-node").var(&var, "10.250.7.12:8080"));
    nb.commit(b).await.unwrap();
    let t0 = Instant::now();
    loop {
        let got = netns.connect("c", "10.96.0.10", 80, 1);
        if got.first().is_some_and(|g| g.starts_with("ERR")) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "still {got:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let got = netns.connect("c", "10.96.0.10", 80, 2);
    assert!(got.iter().all(|g| g.starts_with("ERR")), "{got:?}");
    // The ordinary load balancer of the group is unaffected; ovn-controller is still running.
    assert_eq!(netns.connect("c", "10.96.0.20", 80, 1), ["b"]);
    stack.check_alive().unwrap();
    drop(netns);
    stack.stop();
}
