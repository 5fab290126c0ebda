//! `internalTrafficPolicy: Local` on the real datapath (needs root and the OVN/OVS packages): a template load
//! balancer whose VIP `10.96.0.10:80` balances to the variable `^VAR`, which each chassis' `Chassis_Template_Var`
//! row sets to that chassis' local endpoints.
//! - One chassis: TCP through the VIP from a pod reaches only the backend the chassis' row lists (A, then B after
//!   a change), never the one another chassis' row lists; with the variable empty the VIP no longer connects.
//!   The IPv6 VIP (a variable too, in a load balancer of its own) and hairpin (a backend through its own VIP)
//!   work the same way. An ordinary load balancer in the same `Load_Balancer_Group` keeps working beside it.
//! - Two chassis (each in a network namespace of its own, Geneve between them, one switch across both): the
//!   same VIP reaches backend A from the pod on the first chassis and backend B from the pod on the second.

#![allow(clippy::unwrap_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kubeovn_ovn::northbound::{
    template_var_name, Batch, ChassisTemplateVars, LbTarget, LoadBalancer, LoadBalancerGroup,
    LoadBalancerProtocol, LogicalSwitch, Northbound, OvsdbNorthbound, Patch, Router, SwitchPort,
};
use kubeovn_ovn::vswitch::{OpenVSwitch, OvsBatch, OvsdbOpenVSwitch, PortSpec};
use kubeovn_sandbox::ovn::{missing_programs, OvnOptions, OvnStack};

use kubeovn_test_support::skip;

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

/// Answers each TCP connection on argv[2] (IPv4 and IPv6) with argv[1] and closes it.
const NAME_SERVER: &str = r#"
import socket, sys
s = socket.create_server(("", int(sys.argv[2])), family=socket.AF_INET6, dualstack_ipv6=True)
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
    /// Each pod and the node namespace holding its host end (None: this one).
    names: Vec<(String, Option<String>)>,
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
        self.add_on(None, pod, mac, ip, gw);
        let mut b = OvsBatch::new();
        b.add(PortSpec::new(bridge, self.host_if(pod)).iface_id(pod));
        ovs.commit(b).await.unwrap();
    }

    /// The netns and veth of [`Pods::add`], the host end in node namespace `node` (None: this one), not
    /// plugged.
    fn add_on(&mut self, node: Option<&str>, pod: &str, mac: &str, ip: &str, gw: &str) {
        let ns = self.netns(pod);
        let host = self.host_if(pod);
        self.names.push((pod.to_owned(), node.map(str::to_owned)));
        run("ip", &["netns", "add", &ns]);
        let mut link = vec![];
        if let Some(n) = node {
            link.extend(["-n", n]);
        }
        link.extend([
            "link", "add", &host, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ]);
        run("ip", &link);
        let cidr = format!("{ip}/24");
        for args in [
            vec!["link", "set", "eth0", "address", mac],
            // Room for Geneve between chassis.
            vec!["link", "set", "eth0", "mtu", "1400"],
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
        let mut up = vec![];
        if let Some(n) = node {
            up.extend(["-n", n]);
        }
        up.extend(["link", "set", &host, "up"]);
        run("ip", &up);
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
        for (p, node) in &self.names {
            let mut del = Command::new("ip");
            if let Some(n) = node {
                del.args(["-n", n]);
            }
            let _ = del
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
    // Each test's names are its own: the two tests of this file run side by side.
    let tag = format!("s{}", std::process::id() % 100_000);
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
            ["10.250.7.1/24", "fd00:250:7::1/64"],
        ));
    let pods = [
        ("c", "00:00:00:7b:00:11", "10.250.7.11", "fd00:250:7::11"),
        ("a", "00:00:00:7b:00:12", "10.250.7.12", "fd00:250:7::12"),
        ("b", "00:00:00:7b:00:13", "10.250.7.13", "fd00:250:7::13"),
    ];
    for (p, mac, ip, ip6) in pods {
        b.add(SwitchPort::new("ls-tlb", p).addresses([format!("{mac} {ip} {ip6}")]));
    }
    nb.commit(b).await.unwrap();
    let mut netns = Pods {
        tag,
        names: Vec::new(),
        servers: Vec::new(),
    };
    for (p, mac, ip, ip6) in pods {
        netns.add(&ovs, &bridge, p, mac, ip, "10.250.7.1").await;
        let ns = netns.netns(p);
        let cidr = format!("{ip6}/64");
        run(
            "ip",
            &["-n", &ns, "addr", "add", &cidr, "dev", "eth0", "nodad"],
        );
        run(
            "ip",
            &[
                "-n",
                &ns,
                "-6",
                "route",
                "add",
                "default",
                "via",
                "fd00:250:7::1",
            ],
        );
    }
    netns.serve("a", 8080);
    netns.serve("b", 8080);
    assert_eq!(netns.settle_then("c", "10.250.7.12", 8080, "a", 1), ["a"]);
    assert_eq!(netns.settle_then("c", "10.250.7.13", 8080, "b", 1), ["b"]);

    // The template load balancer (a Kubernetes name escaped into a variable name) and an ordinary one, in one
    // Load_Balancer_Group on the switch. IPv6 needs a load balancer of its own whose VIP is a variable too
    // (23.03's ovn-northd refuses a literal IPv6 VIP in a template load balancer).
    let var = template_var_name("svc.itp-test.web.tcp.80");
    let vip6 = template_var_name("svc.itp-test.web.vip6");
    let var6 = template_var_name("svc.itp-test.web.tcp.80.v6");
    let mut b = Batch::new();
    b.add(
        LoadBalancer::new("svc.itp-test.web.tcp")
            .protocol(LoadBalancerProtocol::Tcp)
            .vip("10.96.0.10:80", [format!("^{var}")])
            .option("template", "true")
            .option("address-family", "ipv4"),
    )
    .add(
        LoadBalancer::new("svc.itp-test.web.tcp.v6")
            .protocol(LoadBalancerProtocol::Tcp)
            .vip(format!("^{vip6}:80"), [format!("^{var6}")])
            .option("template", "true")
            .option("address-family", "ipv6"),
    )
    .add(
        LoadBalancer::new("svc.itp-test.plain.tcp")
            .protocol(LoadBalancerProtocol::Tcp)
            .vip("10.96.0.20:80", ["10.250.7.13:8080"]),
    )
    // This chassis lists a, another chassis lists b.
    .add(
        ChassisTemplateVars::new(&chassis)
            .var(&var, "10.250.7.12:8080")
            .var(&vip6, "fd00:96::10")
            .var(&var6, "[fd00:250:7::12]:8080"),
    )
    .add(ChassisTemplateVars::new("another-node").var(&var, "10.250.7.13:8080"));
    nb.commit(b).await.unwrap();
    let mut b = Batch::new();
    b.add(LoadBalancerGroup::new("lbg.tlb"))
        .lb_group_add(
            "lbg.tlb",
            [
                "svc.itp-test.web.tcp",
                "svc.itp-test.web.tcp.v6",
                "svc.itp-test.plain.tcp",
            ],
        )
        .lb_group_attach("lbg.tlb", LbTarget::Switch("ls-tlb".into()));
    nb.commit(b).await.unwrap();

    let got = netns.settle_then("c", "10.96.0.10", 80, "a", 6);
    assert!(
        got.iter().all(|g| g == "a"),
        "only this chassis' a: {got:?}"
    );
    let got = netns.settle_then("c", "fd00:96::10", 80, "a", 3);
    assert!(got.iter().all(|g| g == "a"), "IPv6: {got:?}");
    // Hairpin: the backend reaches itself through the VIP.
    let got = netns.settle_then("a", "10.96.0.10", 80, "a", 2);
    assert!(got.iter().all(|g| g == "a"), "hairpin: {got:?}");
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

/// A chassis in a network namespace of its own: its own Open_vSwitch
/// database, ovs-vswitchd and ovn-controller, tunnelling through `br-phy` (which holds the underlay address) over
/// the underlay veth `underlay`. Processes are stopped by pid, then the namespace is deleted, on drop.
struct Node {
    ns: String,
    dir: std::path::PathBuf,
    children: Vec<Child>,
}

impl Node {
    /// Starts chassis `system_id` in namespace `ns` (created, holding `underlay` already) with underlay
    /// address `ip`/24, its southbound remote `sb`.
    fn start(
        ns: &str,
        dir: &std::path::Path,
        system_id: &str,
        underlay: &str,
        ip: &str,
        sb: &str,
    ) -> Node {
        std::fs::create_dir_all(dir).unwrap();
        let mut node = Node {
            ns: ns.to_owned(),
            dir: dir.to_owned(),
            children: Vec::new(),
        };
        let db = dir.join("conf.db");
        run(
            "ovsdb-tool",
            &[
                "create",
                db.to_str().unwrap(),
                kubeovn_sandbox::ovn::VSWITCH_SCHEMA,
            ],
        );
        let sock = dir.join("db.sock");
        let remote = format!("unix:{}", sock.display());
        node.spawn(&[
            "ovsdb-server",
            &format!("--remote=punix:{}", sock.display()),
            &format!("--unixctl={}", dir.join("db.ctl").display()),
            db.to_str().unwrap(),
        ]);
        let t0 = Instant::now();
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(10), "{ns}: ovsdb-server");
            std::thread::sleep(Duration::from_millis(10));
        }
        node.vsctl(&["--no-wait", "init"]);
        node.spawn(&["ovs-vswitchd", &remote]);
        let encap = format!("external_ids:ovn-encap-ip={ip}");
        let id = format!("external_ids:system-id={system_id}");
        let sb = format!("external_ids:ovn-remote={sb}");
        node.vsctl(&[
            "add-br",
            "br-phy",
            "--",
            "set",
            "bridge",
            "br-phy",
            "datapath_type=netdev",
            "--",
            "add-port",
            "br-phy",
            underlay,
            "--",
            "set",
            "open",
            ".",
            &id,
            &sb,
            &encap,
            "external_ids:ovn-encap-type=geneve",
            "external_ids:ovn-bridge-datapath-type=netdev",
            "--",
            "add-br",
            "br-int",
            "--",
            "set",
            "bridge",
            "br-int",
            "datapath_type=netdev",
            "fail-mode=secure",
        ]);
        let cidr = format!("{ip}/24");
        run("ip", &["-n", ns, "addr", "add", &cidr, "dev", "br-phy"]);
        run("ip", &["-n", ns, "link", "set", "br-phy", "up"]);
        run("ip", &["-n", ns, "link", "set", underlay, "up"]);
        // The underlay carries TCP between the chassis: no partial checksums there either.
        run(
            "ip",
            &["netns", "exec", ns, "ethtool", "-K", underlay, "tx", "off"],
        );
        node.spawn(&["ovn-controller", &remote]);
        node
    }

    /// Runs `argv` in the node's namespace with the node's run directory, as a child of the test.
    fn spawn(&mut self, argv: &[&str]) {
        let log = format!(
            "--log-file={}",
            self.dir.join(format!("{}.log", argv[0])).display()
        );
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .args(argv)
            .arg(log)
            .arg("-vconsole:off")
            .env("OVS_RUNDIR", &self.dir)
            .env("OVS_LOGDIR", &self.dir)
            .env("OVN_RUNDIR", &self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.children.push(child);
    }

    fn vsctl(&self, args: &[&str]) {
        let db = format!("--db=unix:{}", self.dir.join("db.sock").display());
        let mut a = vec![db.as_str()];
        a.extend(args);
        run("ovs-vsctl", &a);
    }

    /// Plugs the pod's host end (in this node's namespace) into `br-int` as logical port `pod`.
    fn plug(&self, host_if: &str, pod: &str) {
        let id = format!("external_ids:iface-id={pod}");
        self.vsctl(&[
            "add-port",
            "br-int",
            host_if,
            "--",
            "set",
            "interface",
            host_if,
            &id,
        ]);
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Newest first: ovn-controller, ovs-vswitchd, then the database; each our own child, by pid.
        while let Some(mut c) = self.children.pop() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_lb_is_local_on_each_of_two_chassis() {
    if !runnable() {
        return;
    }
    let tag = format!("m{}", std::process::id() % 100_000);
    let dir = tempfile::tempdir().unwrap();
    let stack = OvnStack::start(
        &dir.path().join("central"),
        OvnOptions::new(format!("br-tlc{tag}")).central_only(),
    )
    .await
    .unwrap();
    // Two node namespaces joined by an underlay veth pair.
    let (ns1, ns2) = (format!("tlbn1{tag}"), format!("tlbn2{tag}"));
    run("ip", &["netns", "add", &ns1]);
    run("ip", &["netns", "add", &ns2]);
    let guard = NsGuard(vec![ns1.clone(), ns2.clone()]);
    run(
        "ip",
        &[
            "-n", &ns1, "link", "add", "ul", "type", "veth", "peer", "name", "ul", "netns", &ns2,
        ],
    );
    let sb = stack.sb_remote();
    let n1 = Node::start(
        &ns1,
        &dir.path().join("n1"),
        "tlb-n1",
        "ul",
        "198.18.0.1",
        &sb,
    );
    let n2 = Node::start(
        &ns2,
        &dir.path().join("n2"),
        "tlb-n2",
        "ul",
        "198.18.0.2",
        &sb,
    );
    let nb = OvsdbNorthbound::connect(&stack.nb_remote()).await.unwrap();

    // One switch across both chassis: client c1 and backend a on n1, client c2 and backend b on n2.
    let var = template_var_name("svc.itp-test.web.tcp.80");
    let mut b = Batch::new();
    b.add(LogicalSwitch::new("ls-tlb"))
        .add(Router::new("lr-tlb"))
        .patch(Patch::new(
            "ls-tlb",
            "lr-tlb",
            "00:00:00:7c:00:01",
            ["10.250.8.1/24"],
        ));
    let pods = [
        (&n1, "c1", "00:00:00:7c:00:11", "10.250.8.11"),
        (&n1, "a", "00:00:00:7c:00:12", "10.250.8.12"),
        (&n2, "c2", "00:00:00:7c:00:21", "10.250.8.21"),
        (&n2, "b", "00:00:00:7c:00:22", "10.250.8.22"),
    ];
    for (_, p, mac, ip) in pods {
        b.add(SwitchPort::new("ls-tlb", p).addresses([format!("{mac} {ip}")]));
    }
    b.add(
        LoadBalancer::new("svc.itp-test.web.tcp")
            .protocol(LoadBalancerProtocol::Tcp)
            .vip("10.96.0.10:80", [format!("^{var}")])
            .option("template", "true")
            .option("address-family", "ipv4"),
    )
    .lb_attach("svc.itp-test.web.tcp", LbTarget::Switch("ls-tlb".into()))
    .add(ChassisTemplateVars::new("tlb-n1").var(&var, "10.250.8.12:8080"))
    .add(ChassisTemplateVars::new("tlb-n2").var(&var, "10.250.8.22:8080"));
    nb.commit(b).await.unwrap();
    let mut netns = Pods {
        tag,
        names: Vec::new(),
        servers: Vec::new(),
    };
    for (node, p, mac, ip) in pods {
        netns.add_on(Some(&node.ns), p, mac, ip, "10.250.8.1");
        node.plug(&netns.host_if(p), p);
    }
    netns.serve("a", 8080);
    netns.serve("b", 8080);
    // Across the tunnel, both ways.
    assert_eq!(netns.settle_then("c1", "10.250.8.22", 8080, "b", 1), ["b"]);
    assert_eq!(netns.settle_then("c2", "10.250.8.12", 8080, "a", 1), ["a"]);

    // The same VIP: each client only reaches its own chassis' backend.
    let got = netns.settle_then("c1", "10.96.0.10", 80, "a", 6);
    assert!(got.iter().all(|g| g == "a"), "c1 on n1: {got:?}");
    let got = netns.settle_then("c2", "10.96.0.10", 80, "b", 6);
    assert!(got.iter().all(|g| g == "b"), "c2 on n2: {got:?}");
    drop(netns);
    drop(n1);
    drop(n2);
    drop(guard);
    stack.stop();
}

/// Deletes the namespaces it names on drop (a node's own drop deletes it too: deleting twice is harmless).
struct NsGuard(Vec<String>);

impl Drop for NsGuard {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}
