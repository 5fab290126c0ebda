//! The `kube-ovn-daemon` binary: flag errors, node start on a real OVN with a static pod table, a pod
//! plugged through the shim, socket mode 0600, clean exit on SIGTERM; with the test API server, the join
//! interface waiting for the node's join address and the routes to the default VPC's subnets. As root.

#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kubeovn_netdev::{NamedNetns, Namespaces};
use kubeovn_ovn::northbound::{Northbound, OvsdbNorthbound, SwitchPort};
use kubeovn_ovn_stack::ovn::{OvnOptions, OvnStack};
use serde_json::json;

const DAEMON: &str = env!("CARGO_BIN_EXE_kube-ovn-daemon");

#[test]
fn flag_errors_exit_2() {
    for args in [
        vec!["--bogus", "x"],
        vec!["--node-name", "n1", "--mtu", "9"],
        vec!["--node-name", "n1", "--pod-source", "etcd"],
        vec!["--node-name", "n1"], // node start needs --ovn-remote
    ] {
        let out = Command::new(DAEMON)
            .args(&args)
            .env_remove("KUBE_NODE_NAME")
            .env_remove("NODE_NAME")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!out.stderr.is_empty());
    }
}

#[test]
fn daemon_binary_serves_the_shim() {
    if !common::runnable() {
        return;
    }
    let _serial = common::serial();
    let dir = tempfile::Builder::new()
        .prefix("kovn-bin")
        .tempdir()
        .unwrap();
    let tag = format!("{:05}", std::process::id() % 100_000);
    let bridge = format!("br-b{tag}");
    let rt = common::runtime();
    let stack = rt
        .block_on(OvnStack::start(
            dir.path(),
            OvnOptions::new(&bridge).without_chassis_config(),
        ))
        .unwrap();
    rt.block_on(async {
        let nb = OvsdbNorthbound::connect(&stack.nb_remote()).await.unwrap();
        let mut b = kubeovn_ovn::northbound::Batch::new();
        b.add(kubeovn_ovn::northbound::LogicalSwitch::new("ls"));
        b.add(SwitchPort::new("ls", "pb.e2e").addresses(["00:00:00:bb:00:05 10.231.5.5"]));
        nb.commit(b).await.unwrap();
    });
    let table = dir.path().join("pods.json");
    std::fs::write(
        &table,
        json!([{"namespace": "e2e", "name": "pb", "ips": ["10.231.5.5/24"],
                "mac": "00:00:00:bb:00:05", "gateways": ["10.231.5.1"], "logical_switch": "ls"}])
        .to_string(),
    )
    .unwrap();
    let sock = dir.path().join("d.sock");
    let mut child = Command::new(DAEMON)
        .args([
            "--node-name",
            &stack.options().system_id,
            "--bridge",
            &bridge,
        ])
        .args(["--datapath-type", "netdev", "--metrics-addr", "127.0.0.1:0"])
        .arg("--socket")
        .arg(&sock)
        .args([
            "--ovs-remote",
            &stack.ovs_remote(),
            "--ovn-remote",
            &stack.sb_remote(),
        ])
        .arg("--pod-source")
        .arg(format!("static:{}", table.display()))
        .args(["--gateway-check-timeout", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "daemon did not start"
        );
        assert!(child.try_wait().unwrap().is_none(), "daemon exited");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    rt.block_on(stack.wait_chassis()).unwrap();

    let netns_name = format!("kovn-{tag}-bin");
    let netns = NamedNetns::default().create(&netns_name).unwrap();
    let conf = json!({"cniVersion": "1.1.0", "name": "kube-ovn", "type": "kube-ovn",
                      "server_socket": sock});
    let env = |cmd: &str| -> Vec<(String, String)> {
        vec![
            ("CNI_COMMAND".into(), cmd.into()),
            ("CNI_CONTAINERID".into(), format!("b{tag}0123456789")),
            ("CNI_NETNS".into(), netns.display().to_string()),
            ("CNI_IFNAME".into(), "eth0".into()),
            ("CNI_PATH".into(), "/opt/cni/bin".into()),
            (
                "CNI_ARGS".into(),
                "K8S_POD_NAMESPACE=e2e;K8S_POD_NAME=pb".into(),
            ),
        ]
    };
    let (code, status) = common::run_shim(&env("STATUS"), &conf);
    let (add_code, add) = common::run_shim(&env("ADD"), &conf);
    let (del_code, _) = common::run_shim(&env("DEL"), &conf);
    let _ = NamedNetns::default().delete(&netns_name);

    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let st = child.wait().unwrap();
    stack.stop();
    assert_eq!(code, 0, "{status}");
    assert_eq!(add_code, 0, "{add}");
    assert_eq!(add["ips"][0]["address"], "10.231.5.5/24");
    assert_eq!(del_code, 0);
    assert!(st.success(), "{st}");
    assert!(!sock.exists(), "socket removed on exit");
}

/// Moves the calling thread into a network namespace and back on drop: what it starts (threads, children)
/// is in that namespace.
struct InNetns {
    back: std::fs::File,
}

impl InNetns {
    fn enter(path: &std::path::Path) -> InNetns {
        use nix::sched::{setns, CloneFlags};
        let back = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
        let ns = std::fs::File::open(path).unwrap();
        setns(&ns, CloneFlags::CLONE_NEWNET).unwrap();
        InNetns { back }
    }
}

impl Drop for InNetns {
    fn drop(&mut self) {
        let _ = nix::sched::setns(&self.back, nix::sched::CloneFlags::CLONE_NEWNET);
    }
}

/// `ip -j ARGS` in the current namespace, parsed.
fn ip_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new("ip").arg("-j").args(args).output().unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

/// The gateway routes on `dev` by `ip -j route`: `(dst, gateway)`.
fn routes_via(dev: &str) -> Vec<(String, String)> {
    ip_json(&["route", "show", "dev", dev])
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|r| {
            Some((
                r["dst"].as_str()?.to_owned(),
                r["gateway"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

/// Polls `cond` every 50 ms for up to `secs`; panics with `what` and the daemon's log when it stays false.
fn wait_for(what: &str, secs: u64, log: &std::path::Path, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "{what} not within {secs} s; daemon log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The daemon as a child with its stderr in `log`, stopped by pid with SIGTERM.
struct Daemon(std::process::Child);

impl Daemon {
    fn spawn(args: &[String], log: &std::path::Path) -> Daemon {
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        Daemon(
            Command::new(DAEMON)
                .args(args)
                .stdout(Stdio::null())
                .stderr(err)
                .spawn()
                .unwrap(),
        )
    }

    fn stop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(self.0.id()).unwrap());
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let _ = self.0.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The join interface and its routes follow the API: the node's join annotation written only after the
/// daemon started brings `ovn0` up with that address (a pod's ADD before it gets a retryable error); each subnet of the default VPC gets a route via the
/// join gateway on `ovn0` (one that existed at start, one created later), a custom-VPC subnet and the join
/// subnet none; a deleted subnet's route goes, so does the route of a subnet that moves VPC, a changed CIDR
/// moves its route, and a stale route on `ovn0` left from before a restart is removed. The whole test runs in a network namespace of its own (OVS, the API
/// server, the daemon and `ip`, the independent checker), so `ovn0` and its addresses never touch the host.
#[test]
fn join_port_waits_for_the_node_and_routes_follow_subnets() {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
    use kubeovn_core::crd::Subnet;

    if !common::runnable() {
        return;
    }
    let _serial = common::serial();
    let dir = tempfile::Builder::new()
        .prefix("kovn-join")
        .tempdir()
        .unwrap();
    let tag = format!("{:05}", std::process::id() % 100_000);
    let ns_name = format!("kovn-{tag}-join");
    let ns_path = NamedNetns::default().create(&ns_name).unwrap();
    struct DelNetns(String);
    impl Drop for DelNetns {
        fn drop(&mut self) {
            let _ = NamedNetns::default().delete(&self.0);
        }
    }
    let _del_ns = DelNetns(ns_name);
    // Declared after the namespace's guard: the thread leaves the namespace before it is deleted.
    let _inside = InNetns::enter(&ns_path);
    assert!(Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status()
        .unwrap()
        .success());

    let rt = common::runtime();
    let node = "join-node";
    let bridge = format!("br-j{tag}");
    let (api, client) = rt.block_on(async {
        let api = kubeovn_testapi::TestApiServer::start(kubeovn_testapi::Config::default())
            .await
            .unwrap();
        let client = api.client().unwrap();
        api.apply_crds(kubeovn_core::crd::crds()).unwrap();
        let n: Node = serde_json::from_value(json!({"metadata": {"name": node}})).unwrap();
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &n)
            .await
            .unwrap();
        (api, client)
    });
    let kubeconfig = api.write_kubeconfig_in(dir.path()).unwrap();
    let subnets: Api<Subnet> = Api::all(client.clone());
    let create_subnet = |name: &str, vpc: &str, cidr: &str| {
        let s: Subnet = serde_json::from_value(json!({
            "apiVersion": "kubeovn.io/v1", "kind": "Subnet", "metadata": {"name": name},
            "spec": {"vpc": vpc, "cidrBlock": cidr, "protocol": "IPv4"}
        }))
        .unwrap();
        rt.block_on(subnets.create(&PostParams::default(), &s))
            .unwrap();
    };
    // What the controller writes once it accepted a subnet: the daemon routes only validated subnets.
    let validate = |name: &str| {
        let st = json!({"status": {"conditions": [{"type": "Validated", "status": "True",
            "reason": "ValidateLogicalSwitchSuccess", "lastUpdateTime": "2026-01-01T00:00:00Z"}]}});
        rt.block_on(subnets.patch_status(name, &PatchParams::default(), &Patch::Merge(&st)))
            .unwrap();
    };
    let create_subnet = |name: &str, vpc: &str, cidr: &str| {
        create_subnet(name, vpc, cidr);
        validate(name);
    };
    // Subnets known before the daemon starts: the default one and the join subnet.
    create_subnet("ovn-default", "", "10.76.0.0/24");
    create_subnet("join", "ovn-cluster", "100.64.0.0/16");

    let stack = rt
        .block_on(OvnStack::start(
            dir.path(),
            OvnOptions::new(&bridge).without_chassis_config(),
        ))
        .unwrap();
    let sock = dir.path().join("d.sock");
    let log = dir.path().join("daemon.log");
    let args: Vec<String> = [
        "--node-name",
        node,
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--socket",
        sock.to_str().unwrap(),
        "--metrics-addr",
        "none",
        "--ovs-remote",
        &stack.ovs_remote(),
        "--ovn-remote",
        &stack.sb_remote(),
        "--bridge",
        &bridge,
        "--datapath-type",
        "netdev",
        "--gateway-check-timeout",
        "0",
        "--pod-network-timeout",
        "1",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let mut daemon = Daemon::spawn(&args, &log);
    let status = || {
        let env: Vec<(String, String)> = vec![
            ("CNI_COMMAND".into(), "STATUS".into()),
            ("CNI_PATH".into(), "/opt/cni/bin".into()),
        ];
        let conf = json!({"cniVersion": "1.1.0", "name": "kube-ovn", "type": "kube-ovn",
                          "server_socket": sock});
        common::run_shim(&env, &conf)
    };

    // The CNI socket is up before the join address exists; STATUS says not ready, no ovn0.
    wait_for("the daemon's socket", 15, &log, || sock.exists());
    let (code, out) = status();
    assert_ne!(code, 0, "STATUS before the join interface: {out}");
    assert!(ip_json(&["link", "show", "ovn0"]).is_null());
    // A pod's ADD meanwhile waits its pod-network timeout, then gets a retryable error naming ovn0.
    let add_env: Vec<(String, String)> = vec![
        ("CNI_COMMAND".into(), "ADD".into()),
        ("CNI_CONTAINERID".into(), format!("j{tag}0123456789")),
        ("CNI_NETNS".into(), ns_path.display().to_string()),
        ("CNI_IFNAME".into(), "eth0".into()),
        ("CNI_PATH".into(), "/opt/cni/bin".into()),
        (
            "CNI_ARGS".into(),
            "K8S_POD_NAMESPACE=e2e;K8S_POD_NAME=early".into(),
        ),
    ];
    let conf = json!({"cniVersion": "1.1.0", "name": "kube-ovn", "type": "kube-ovn",
                      "server_socket": sock});
    let (code, out) = common::run_shim(&add_env, &conf);
    assert_eq!(code, 1, "{out}");
    assert_eq!(out["code"], 11, "{out}");
    assert!(out.to_string().contains("ovn0"), "{out}");

    // The controller allocates the node's join address now.
    let ann = json!({"metadata": {"annotations": {
        "ovn.kubernetes.io/ip_address": "100.64.0.2",
        "ovn.kubernetes.io/mac_address": "00:00:00:64:00:02",
        "ovn.kubernetes.io/cidr": "100.64.0.0/16",
        "ovn.kubernetes.io/gateway": "100.64.0.1",
        "ovn.kubernetes.io/logical_switch": "join",
        "ovn.kubernetes.io/allocated": "true",
    }}});
    rt.block_on(Api::<Node>::all(client.clone()).patch(
        node,
        &PatchParams::default(),
        &Patch::Merge(&ann),
    ))
    .unwrap();
    wait_for("ovn0 with the join address", 15, &log, || {
        let l = ip_json(&["addr", "show", "dev", "ovn0"]);
        l[0]["address"] == "00:00:00:64:00:02"
            && l[0]["addr_info"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|x| x["local"] == "100.64.0.2" && x["prefixlen"] == 16)
            })
    });
    wait_for("STATUS ready", 5, &log, || status().0 == 0);
    let via = |dst: &str| (dst.to_owned(), "100.64.0.1".to_owned());
    wait_for("the route to ovn-default", 10, &log, || {
        routes_via("ovn0").contains(&via("10.76.0.0/24"))
    });

    // A custom-VPC subnet, a default-VPC one the controller has not validated, then a validated one: only
    // the last is routed until the pending one is validated too.
    create_subnet("custom", "vpc1", "10.78.0.0/24");
    rt.block_on(
        subnets.create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "kubeovn.io/v1", "kind": "Subnet", "metadata": {"name": "pending"},
                "spec": {"vpc": "", "cidrBlock": "10.74.0.0/24", "protocol": "IPv4"}
            }))
            .unwrap(),
        ),
    )
    .unwrap();
    create_subnet("s1", "ovn-cluster", "10.77.0.0/24");
    wait_for("the route to s1", 10, &log, || {
        routes_via("ovn0").contains(&via("10.77.0.0/24"))
    });
    let routes = routes_via("ovn0");
    assert!(
        !routes
            .iter()
            .any(|(d, _)| d == "10.78.0.0/24" || d == "100.64.0.0/16" || d == "10.74.0.0/24"),
        "{routes:?}"
    );
    validate("pending");
    wait_for("the route to the validated subnet", 10, &log, || {
        routes_via("ovn0").contains(&via("10.74.0.0/24"))
    });

    // Deleted subnet: its route goes. Changed CIDR: the route moves.
    rt.block_on(subnets.delete("s1", &DeleteParams::default()))
        .unwrap();
    wait_for("the route to s1 removed", 10, &log, || {
        !routes_via("ovn0").contains(&via("10.77.0.0/24"))
    });
    // A subnet that moves into the default VPC gets a route, and loses it when it moves out again.
    let move_to = |vpc: &str| {
        let p = json!({"spec": {"vpc": vpc}});
        rt.block_on(subnets.patch("custom", &PatchParams::default(), &Patch::Merge(&p)))
            .unwrap();
    };
    move_to("ovn-cluster");
    wait_for("the route to custom in the default VPC", 10, &log, || {
        routes_via("ovn0").contains(&via("10.78.0.0/24"))
    });
    move_to("vpc1");
    wait_for("the route to custom removed", 10, &log, || {
        !routes_via("ovn0").contains(&via("10.78.0.0/24"))
    });
    let cidr = json!({"spec": {"cidrBlock": "10.75.0.0/24"}});
    rt.block_on(subnets.patch("ovn-default", &PatchParams::default(), &Patch::Merge(&cidr)))
        .unwrap();
    wait_for("the route to ovn-default moved", 10, &log, || {
        let r = routes_via("ovn0");
        r.contains(&via("10.75.0.0/24")) && !r.contains(&via("10.76.0.0/24"))
    });

    // A route through ovn0 left from before a restart (a subnet deleted meanwhile) is removed at start.
    daemon.stop();
    assert!(Command::new("ip")
        .args([
            "route",
            "add",
            "10.79.0.0/24",
            "via",
            "100.64.0.1",
            "dev",
            "ovn0"
        ])
        .status()
        .unwrap()
        .success());
    std::fs::remove_file(&sock).ok();
    let mut daemon = Daemon::spawn(&args, &log);
    wait_for("the stale route removed after a restart", 15, &log, || {
        let r = routes_via("ovn0");
        !r.contains(&via("10.79.0.0/24")) && r.contains(&via("10.75.0.0/24"))
    });
    let mut left = routes_via("ovn0");
    left.sort();
    assert_eq!(left, vec![via("10.74.0.0/24"), via("10.75.0.0/24")]);

    daemon.stop();
    stack.stop();
    rt.block_on(api.shutdown());
}
