//! Root tests: real network namespaces, veth pairs and routes, checked against `ip -j` and `ping`.
//!
//! Every test creates its own namespaces with a per-run suffix and removes them in a Drop guard, also on panic.
//! Only test namespaces get addresses (10.x); the root namespace only sees one short-lived veth end in
//! `host_handle_creates_peer_in_place`. When not root, each test says why it skips and returns (fails under CI).

use std::net::IpAddr;
use std::process::Command;

use kubeovn_netdev::{
    Error, Mac, NamedNetns, Namespaces, NetOp, Netdev, NetlinkNetdev, OperState, RouteSpec,
    VethSpec,
};
use serde_json::Value;

fn skip_reason() -> Option<&'static str> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2));
    if euid != Some("0") {
        return Some(
            "not root: network namespaces and veth pairs need CAP_SYS_ADMIN and CAP_NET_ADMIN",
        );
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("the `ip` command (the independent checker) is not installed");
    }
    None
}

mod common;

use kubeovn_test_support::skip;

use common::{suffix, TestNs};

/// Returns from the test when it cannot run here ([`skip::skip`]: a failure under CI).
macro_rules! require_root {
    () => {
        if let Some(why) = skip_reason() {
            skip::skip(why);
            return;
        }
    };
}

/// A link in the root namespace deleted on drop (with `ip`, which is fine in a test guard).
struct RootLink(String);

impl Drop for RootLink {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.0]).output();
    }
}

fn ip_json(ns: Option<&str>, args: &[&str]) -> Value {
    let mut cmd = Command::new("ip");
    if let Some(ns) = ns {
        cmd.args(["-n", ns]);
    }
    let out = cmd.arg("-j").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("ip -j output is JSON")
}

fn ping(ns: &str, dst: &str) -> bool {
    (0..3).any(|_| {
        Command::new("ip")
            .args(["netns", "exec", ns, "ping", "-c1", "-W1", dst])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    })
}

/// Whether a link of `ip -j link show` carries `flag`.
fn has_flag(link: &Value, flag: &str) -> bool {
    link["flags"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == flag))
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

/// Wires `pod` to `node` the way the daemon wires a pod to the host: veth created from the node side with the peer
/// made inside the pod namespace, both ends configured, a default route in the pod.
async fn wire_pod(
    node: &NetlinkNetdev,
    host_if: &str,
    pod_ns: &TestNs,
    subnet: u8,
    mac: Mac,
) -> NetlinkNetdev {
    node.create_veth(
        &VethSpec::new(host_if, "eth0", &pod_ns.path)
            .mtu(1400)
            .peer_mac(mac),
    )
    .await
    .expect("veth");
    node.add_address(
        host_if,
        format!("10.77.{subnet}.1/24").parse().expect("cidr"),
    )
    .await
    .expect("host addr");
    node.set_link_up(host_if, true).await.expect("host up");

    let pod = NetlinkNetdev::open(&pod_ns.path).expect("open pod netns");
    pod.set_link_up("lo", true).await.expect("lo up");
    pod.add_address(
        "eth0",
        format!("10.77.{subnet}.2/24").parse().expect("cidr"),
    )
    .await
    .expect("pod addr");
    pod.set_link_up("eth0", true).await.expect("pod up");
    pod.add_route(&RouteSpec::default_via(ip(&format!("10.77.{subnet}.1"))))
        .await
        .expect("default route");
    pod
}

#[tokio::test]
async fn root_two_pods_through_a_node_ping_each_other() {
    require_root!();
    let node_ns = TestNs::new("node");
    let a_ns = TestNs::new("a");
    let b_ns = TestNs::new("b");
    let sfx = suffix();
    let (ha, hb) = (format!("ha{sfx}"), format!("hb{sfx}"));
    let mac_a: Mac = "0a:58:0a:4d:01:02".parse().expect("mac");

    let node = NetlinkNetdev::open(&node_ns.path).expect("open node netns");
    node.set_sysctl("net.ipv4.ip_forward", "1")
        .await
        .expect("forwarding");
    let pod_a = wire_pod(&node, &ha, &a_ns, 1, mac_a).await;
    let pod_b = wire_pod(
        &node,
        &hb,
        &b_ns,
        2,
        "0a:58:0a:4d:02:02".parse().expect("mac"),
    )
    .await;

    // The pod end was created in place, under its CNI name, with the asked MTU and MAC.
    let eth0 = pod_a
        .link("eth0")
        .await
        .expect("query")
        .expect("eth0 exists");
    assert_eq!(eth0.mtu, 1400);
    assert_eq!(eth0.mac, Some(mac_a));
    assert_eq!(eth0.kind.as_deref(), Some("veth"));
    assert!(eth0.admin_up);
    assert!(
        node.link("eth0").await.expect("query").is_none(),
        "the peer never appeared in the node namespace"
    );

    assert!(ping(&a_ns.name, "10.77.1.1"), "pod a reaches its gateway");
    assert!(
        ping(&a_ns.name, "10.77.2.2"),
        "pod a reaches pod b through the node"
    );
    assert!(
        ping(&b_ns.name, "10.77.1.2"),
        "pod b reaches pod a through the node"
    );

    // Query results agree with `ip -j`.
    let j = &ip_json(Some(&a_ns.name), &["link", "show", "eth0"])[0];
    assert_eq!(j["ifindex"].as_u64(), Some(u64::from(eth0.index)));
    assert_eq!(j["mtu"].as_u64(), Some(1400));
    assert_eq!(j["address"].as_str(), Some(mac_a.to_string().as_str()));
    let eth0_now = pod_a.link("eth0").await.expect("query").expect("eth0");
    let j = &ip_json(Some(&a_ns.name), &["link", "show", "eth0"])[0];
    assert_eq!(j["operstate"].as_str(), Some(eth0_now.oper_state.as_str()));
    assert_eq!(eth0_now.oper_state, OperState::Up);

    let addrs = pod_a.addresses("eth0").await.expect("addresses");
    let j = &ip_json(Some(&a_ns.name), &["-4", "addr", "show", "dev", "eth0"])[0]["addr_info"];
    let ip_addrs: Vec<String> = j
        .as_array()
        .expect("addr_info")
        .iter()
        .map(|a| format!("{}/{}", a["local"].as_str().expect("local"), a["prefixlen"]))
        .collect();
    let ours: Vec<String> = addrs
        .iter()
        .filter(|a| a.addr.is_ipv4())
        .map(|a| a.addr.to_string())
        .collect();
    assert_eq!(ours, ip_addrs);
    assert!(addrs.iter().all(|a| a.link_index == eth0.index));

    let routes = pod_a.routes().await.expect("routes");
    let j = ip_json(Some(&a_ns.name), &["-4", "route", "show", "table", "main"]);
    let mut ip_routes: Vec<(String, Option<String>)> = j
        .as_array()
        .expect("routes")
        .iter()
        .map(|r| {
            let dst = match r["dst"].as_str().expect("dst") {
                "default" => "0.0.0.0/0".to_string(),
                d if d.contains('/') => d.to_string(),
                d => format!("{d}/32"),
            };
            (dst, r["gateway"].as_str().map(str::to_string))
        })
        .collect();
    let mut ours: Vec<(String, Option<String>)> = routes
        .iter()
        .filter(|r| r.dst.is_ipv4())
        .map(|r| (r.dst.to_string(), r.gateway.map(|g| g.to_string())))
        .collect();
    ip_routes.sort();
    ours.sort();
    assert_eq!(ours, ip_routes);
    assert!(ours.contains(&("0.0.0.0/0".to_string(), Some("10.77.1.1".to_string()))));

    drop(pod_b);
}

#[tokio::test]
async fn root_direct_veth_between_two_netns_ipv4_and_ipv6() {
    require_root!();
    let a_ns = TestNs::new("da");
    let b_ns = TestNs::new("db");
    let a = NetlinkNetdev::open(&a_ns.path).expect("open a");
    let b = NetlinkNetdev::open(&b_ns.path).expect("open b");

    // Handle in A, peer created directly in B.
    a.create_veth(&VethSpec::new("p0", "p1", &b_ns.path))
        .await
        .expect("veth a<->b");
    for (dev, side, n) in [(&a, "p0", 1u8), (&b, "p1", 2u8)] {
        dev.set_sysctl(&format!("net.ipv6.conf.{side}.accept_dad"), "0")
            .await
            .expect("no dad");
        dev.add_address(side, format!("10.78.0.{n}/30").parse().expect("cidr"))
            .await
            .expect("v4");
        dev.add_address(side, format!("fd00:78::{n}/64").parse().expect("cidr"))
            .await
            .expect("v6");
        dev.set_link_up(side, true).await.expect("up");
    }
    // Extra routes with a gateway, v4 and v6.
    a.add_route(&RouteSpec::via(
        "10.90.0.0/16".parse().expect("cidr"),
        ip("10.78.0.2"),
    ))
    .await
    .expect("route");
    a.add_route(&RouteSpec::default_via(ip("fd00:78::2")))
        .await
        .expect("v6 default");

    assert!(ping(&a_ns.name, "10.78.0.2"));
    assert!(ping(&b_ns.name, "fd00:78::1"));

    let routes = a.routes().await.expect("routes");
    assert!(routes
        .iter()
        .any(|r| r.dst.to_string() == "10.90.0.0/16" && r.gateway == Some(ip("10.78.0.2"))));
    assert!(routes
        .iter()
        .any(|r| r.dst.to_string() == "::/0" && r.gateway == Some(ip("fd00:78::2"))));
    let j = ip_json(Some(&a_ns.name), &["-6", "route", "show", "default"]);
    assert_eq!(j[0]["gateway"].as_str(), Some("fd00:78::2"));
    let v6: Vec<String> = a
        .addresses("p0")
        .await
        .expect("addrs")
        .iter()
        .filter(|x| x.addr.is_ipv6() && !x.addr.ip().to_string().starts_with("fe80"))
        .map(|x| x.addr.to_string())
        .collect();
    assert_eq!(v6, vec!["fd00:78::1/64".to_string()]);
}

#[tokio::test]
async fn root_operations_are_idempotent_and_typed() {
    require_root!();
    let node_ns = TestNs::new("in");
    let pod_ns = TestNs::new("ip");
    let node = NetlinkNetdev::open(&node_ns.path).expect("open");
    let spec = VethSpec::new("h0", "eth0", &pod_ns.path).mtu(1450);

    assert!(node.create_veth(&spec).await.expect("first create").created);
    let again = node
        .create_veth(&spec)
        .await
        .expect("same create again is success");
    assert!(!again.created);
    assert_eq!((again.host.name.as_str(), again.host.mtu), ("h0", 1450));
    let err = node
        .create_veth(&spec.clone().mtu(1300))
        .await
        .expect_err("other mtu conflicts");
    assert!(matches!(err, Error::Conflict { .. }), "{err}");

    let cidr = "10.79.0.1/24".parse().expect("cidr");
    node.add_address("h0", cidr).await.expect("addr");
    node.add_address("h0", cidr).await.expect("addr again");
    node.set_link_up("h0", true).await.expect("up");
    node.set_link_up("h0", true).await.expect("up again");
    let route = RouteSpec::via("10.91.0.0/16".parse().expect("cidr"), ip("10.79.0.2"));
    node.add_route(&route).await.expect("route");
    node.add_route(&route).await.expect("route again");
    let other = RouteSpec::via("10.91.0.0/16".parse().expect("cidr"), ip("10.79.0.3"));
    assert!(matches!(
        node.add_route(&other).await,
        Err(Error::Conflict { .. })
    ));
    node.add_route(&RouteSpec::on_link(
        "10.92.0.0/16".parse().expect("cidr"),
        "h0",
    ))
    .await
    .expect("dev route");
    node.add_route(&RouteSpec::on_link(
        "10.92.0.0/16".parse().expect("cidr"),
        "h0",
    ))
    .await
    .expect("dev route again");

    node.set_link_mtu("h0", 1400).await.expect("mtu");
    let mac: Mac = "0a:58:0a:4f:00:01".parse().expect("mac");
    node.set_link_mac("h0", mac).await.expect("mac");
    let l = node.link("h0").await.expect("query").expect("h0");
    assert_eq!((l.mtu, l.mac), (1400, Some(mac)));

    node.del_route(&route).await.expect("del route");
    node.del_route(&route).await.expect("del absent route");
    node.del_address("h0", cidr).await.expect("del addr");
    node.del_address("h0", cidr).await.expect("del absent addr");
    assert!(node
        .addresses("h0")
        .await
        .expect("addrs")
        .iter()
        .all(|a| a.addr != cidr));

    // Typed errors for bad input and missing links, no panics.
    assert!(matches!(
        node.set_link_up("nope0", true).await,
        Err(Error::LinkNotFound { .. })
    ));
    assert!(matches!(
        node.add_address("nope0", cidr).await,
        Err(Error::LinkNotFound { .. })
    ));
    assert!(matches!(
        node.link("a-name-longer-than-15").await,
        Err(Error::InvalidName { .. })
    ));
    assert!(node.link("nope0").await.expect("query").is_none());
    assert!("zz:00:00:00:00:00".parse::<Mac>().is_err());

    // Delete: the host end takes the pod end with it; deleting again is success.
    node.delete_link("h0").await.expect("delete");
    node.delete_link("h0").await.expect("delete absent");
    assert!(node.link("h0").await.expect("query").is_none());
    let pod = NetlinkNetdev::open(&pod_ns.path).expect("open pod");
    assert!(
        pod.link("eth0").await.expect("query").is_none(),
        "peer went with the host end"
    );

    // Namespaces: create and delete twice.
    let names = NamedNetns::default();
    let name = format!("kotest-idem-{}", suffix());
    let p1 = names.create(&name).expect("create");
    let p2 = names.create(&name).expect("create again");
    assert_eq!(p1, p2);
    assert!(ip_json(None, &["netns", "list"])
        .as_array()
        .expect("list")
        .iter()
        .any(|n| n["name"] == name.as_str()));
    names.delete(&name).expect("delete");
    names.delete(&name).expect("delete again");
    assert!(!p1.exists());
    assert!(matches!(
        names.create("a/b"),
        Err(Error::InvalidNetnsName { .. })
    ));
}

#[tokio::test]
async fn root_sysctls_are_per_namespace() {
    require_root!();
    let pod_ns = TestNs::new("sy");
    let other_ns = TestNs::new("sz");
    let host = NetlinkNetdev::open(&other_ns.path).expect("open");
    host.create_veth(&VethSpec::new("s0", "eth0", &pod_ns.path))
        .await
        .expect("veth");
    let pod = NetlinkNetdev::open(&pod_ns.path).expect("open");

    for (key, value) in [
        ("net.ipv6.conf.eth0.accept_dad", "0"),
        ("net.ipv4.conf.eth0.arp_notify", "1"),
        ("net/ipv6/conf/eth0/disable_ipv6", "1"),
        ("net.ipv4.conf.lo.arp_notify", "1"),
    ] {
        pod.set_sysctl(key, value).await.expect("set");
        pod.set_sysctl(key, value).await.expect("set again");
        assert_eq!(pod.sysctl(key).await.expect("read"), value, "{key}");
        let path = kubeovn_netdev::sysctl_path(key).expect("path");
        let out = Command::new("ip")
            .args(["netns", "exec", &pod_ns.name, "cat"])
            .arg(&path)
            .output()
            .expect("cat");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            value,
            "ip netns exec cat {key}"
        );
    }
    // The other namespace kept its own values.
    assert_eq!(
        host.sysctl("net.ipv4.conf.lo.arp_notify")
            .await
            .expect("read"),
        "0"
    );
    assert!(matches!(
        pod.sysctl("net.ipv4.conf.nope0.arp_notify").await,
        Err(Error::Io { .. })
    ));
    assert!(matches!(
        pod.set_sysctl("../etc/x", "1").await,
        Err(Error::InvalidSysctl { .. })
    ));
}

#[tokio::test]
async fn root_host_handle_creates_peer_in_place() {
    require_root!();
    let pod_ns = TestNs::new("rh");
    let name = format!("kt{}_h", suffix());
    let _guard = RootLink(name.clone());
    let host = NetlinkNetdev::current().expect("root handle");
    host.create_veth(&VethSpec::new(&name, "eth0", &pod_ns.path))
        .await
        .expect("veth from root");
    let l = host
        .link(&name)
        .await
        .expect("query")
        .expect("host end in root");
    let j = &ip_json(None, &["link", "show", &name])[0];
    assert_eq!(j["ifindex"].as_u64(), Some(u64::from(l.index)));
    assert_eq!(j["mtu"].as_u64(), Some(u64::from(l.mtu)));
    assert_eq!(
        j["address"].as_str(),
        l.mac.map(|m| m.to_string()).as_deref()
    );
    assert!(ip_json(Some(&pod_ns.name), &["link", "show", "eth0"])
        .as_array()
        .is_some_and(|a| a.len() == 1));
    // /proc/PID/ns/net paths work as well as named ones.
    let by_pid =
        NetlinkNetdev::open(format!("/proc/{}/ns/net", std::process::id())).expect("open by pid");
    assert!(by_pid.link(&name).await.expect("query").is_some());
    host.delete_link(&name).await.expect("delete");
    assert!(host.link(&name).await.expect("query").is_none());
}

#[tokio::test]
async fn root_apply_runs_steps_in_order_and_stops_at_the_first_failure() {
    require_root!();
    let pod_ns = TestNs::new("ap");
    let node_ns = TestNs::new("aq");
    let node = NetlinkNetdev::open(&node_ns.path).expect("open node");
    node.create_veth(&VethSpec::new("a0", "eth0", &pod_ns.path).mtu(1400))
        .await
        .expect("veth");
    // The far end up: eth0 has carrier the moment it comes up, so it would get a link-local address
    // if IPv6 were still on then.
    node.set_link_up("a0", true).await.expect("a0 up");
    let pod = NetlinkNetdev::open(&pod_ns.path).expect("open pod");
    let mac: Mac = "0a:00:00:00:aa:01".parse().expect("mac");
    let steps = [
        NetOp::SetMac {
            link: "eth0".into(),
            mac,
        },
        NetOp::SetMtu {
            link: "eth0".into(),
            mtu: 1300,
        },
        NetOp::sysctl_if_present("net/ipv6/conf/eth0/disable_ipv6", "1"),
        // A key no kernel has: skipped, not an error.
        NetOp::sysctl_if_present("net/ipv4/conf/eth0/no_such_key", "1"),
        NetOp::address("eth0", "10.78.0.2/24".parse().expect("cidr")),
        NetOp::up("lo"),
        NetOp::up("eth0"),
        NetOp::AddRoute(RouteSpec::default_via(ip("10.78.0.1"))),
        NetOp::AddRoute(RouteSpec::on_link(
            "10.79.0.0/16".parse().expect("cidr"),
            "eth0",
        )),
    ];
    pod.apply(&steps).await.expect("apply");
    // Twice: every step is idempotent.
    pod.apply(&steps).await.expect("apply again");

    let links = ip_json(Some(&pod_ns.name), &["link", "show", "eth0"]);
    assert_eq!(links[0]["address"], "0a:00:00:00:aa:01");
    assert_eq!(links[0]["mtu"], 1300);
    assert!(has_flag(&links[0], "UP"), "{links}");
    let addrs = ip_json(Some(&pod_ns.name), &["addr", "show", "eth0"]);
    let infos = addrs[0]["addr_info"].as_array().expect("addr_info");
    assert!(infos
        .iter()
        .any(|a| a["local"] == "10.78.0.2" && a["prefixlen"] == 24));
    // IPv6 went off before the link came up: no link-local address ever.
    assert!(!infos.iter().any(|a| a["family"] == "inet6"), "{infos:?}");
    let routes = ip_json(Some(&pod_ns.name), &["route", "show"]);
    let routes = routes.as_array().expect("routes");
    assert!(routes
        .iter()
        .any(|r| r["dst"] == "default" && r["gateway"] == "10.78.0.1"));
    assert!(routes
        .iter()
        .any(|r| r["dst"] == "10.79.0.0/16" && r["dev"] == "eth0"));

    // A failing step stops the list: the ones before it are done, the ones after are not.
    let e = pod
        .apply(&[
            NetOp::address("eth0", "10.78.0.3/24".parse().expect("cidr")),
            NetOp::up("nope0"),
            NetOp::address("eth0", "10.78.0.4/24".parse().expect("cidr")),
        ])
        .await
        .expect_err("no such link");
    assert!(
        matches!(e, Error::LinkNotFound { ref link, .. } if link == "nope0"),
        "{e}"
    );
    let addrs = ip_json(Some(&pod_ns.name), &["addr", "show", "eth0"]);
    let have: Vec<&str> = addrs[0]["addr_info"]
        .as_array()
        .expect("addr_info")
        .iter()
        .filter_map(|a| a["local"].as_str())
        .collect();
    assert!(
        have.contains(&"10.78.0.3") && !have.contains(&"10.78.0.4"),
        "{have:?}"
    );
    // A missing key without `missing_ok` is an error; bad input is refused before anything runs.
    assert!(matches!(
        pod.apply(&[NetOp::sysctl("net/ipv4/conf/eth0/no_such_key", "1")])
            .await,
        Err(Error::Io { .. })
    ));
    assert!(matches!(
        pod.apply(&[
            NetOp::address("eth0", "10.78.0.5/24".parse().expect("cidr")),
            NetOp::up("bad/name"),
        ])
        .await,
        Err(Error::InvalidName { .. })
    ));
    assert!(!ip_json(Some(&pod_ns.name), &["addr", "show", "eth0"])
        .to_string()
        .contains("10.78.0.5"));
}

#[tokio::test]
async fn root_create_veth_then_runs_host_steps_and_undoes_a_new_pair_on_failure() {
    require_root!();
    let pod_ns = TestNs::new("vp");
    let node_ns = TestNs::new("vq");
    let node = NetlinkNetdev::open(&node_ns.path).expect("open node");
    let host_mac: Mac = "0a:00:00:00:bb:01".parse().expect("mac");
    let spec = VethSpec::new("t0", "eth0", &pod_ns.path)
        .mtu(1400)
        .host_mac(host_mac)
        .then([
            NetOp::sysctl_if_present("net/ipv6/conf/t0/disable_ipv6", "1"),
            NetOp::up("t0"),
        ]);
    let pair = node.create_veth(&spec).await.expect("create");
    assert!(pair.created);
    // The returned link is read after the steps ran.
    assert!(pair.host.admin_up, "{:?}", pair.host);
    assert_eq!(pair.host.mac, Some(host_mac));
    let links = ip_json(Some(&node_ns.name), &["link", "show", "t0"]);
    assert!(has_flag(&links[0], "UP"), "{links}");
    let again = node.create_veth(&spec).await.expect("create again");
    assert!(!again.created && again.host.admin_up);
    assert_eq!(again.peer, None);

    // The pod end configured in the same call, from the node's thread (a socket opened in the pod's
    // namespace); sysctls first, so IPv6 is off before eth0 comes up.
    let pod_mac: Mac = "0a:00:00:00:bb:02".parse().expect("mac");
    let spec3 = VethSpec::new("t3", "eth3", &pod_ns.path)
        .mtu(1400)
        .peer_mac(pod_mac)
        .then([NetOp::up("t3")])
        .peer_then([
            NetOp::address("eth3", "10.76.0.2/24".parse().expect("cidr")),
            NetOp::up("lo"),
            NetOp::up("eth3"),
            NetOp::AddRoute(RouteSpec::default_via(ip("10.76.0.1"))),
            NetOp::sysctl_if_present("net/ipv6/conf/eth3/disable_ipv6", "1"),
        ]);
    let pair = node
        .create_veth(&spec3)
        .await
        .expect("create with pod steps");
    let peer = pair.peer.expect("pod end");
    assert!(peer.admin_up && peer.mac == Some(pod_mac), "{peer:?}");
    let addrs = ip_json(Some(&pod_ns.name), &["addr", "show", "eth3"]);
    let infos = addrs[0]["addr_info"].as_array().expect("addr_info");
    assert!(infos.iter().any(|a| a["local"] == "10.76.0.2"), "{infos:?}");
    assert!(!infos.iter().any(|a| a["family"] == "inet6"), "{infos:?}");
    let routes = ip_json(Some(&pod_ns.name), &["route", "show"]);
    assert!(routes
        .as_array()
        .expect("routes")
        .iter()
        .any(|r| r["dst"] == "default" && r["gateway"] == "10.76.0.1"));
    // The node's thread is back in the node's namespace: its sysctls still see t3 (absent in the pod's).
    assert_eq!(
        node.sysctl("net/ipv6/conf/t3/disable_ipv6")
            .await
            .expect("node sysctl"),
        "0"
    );
    node.create_veth(&spec3).await.expect("idempotent");
    // A failing pod-end step undoes a new pair too.
    let failing = VethSpec::new("t4", "eth4", &pod_ns.path).peer_then([NetOp::up("nope0")]);
    let e = node.create_veth(&failing).await.expect_err("no such link");
    assert!(matches!(e, Error::LinkNotFound { .. }), "{e}");
    assert!(node.link("t4").await.expect("query").is_none());

    // A failing step after creating a pair removes that pair; after finding one, it stays.
    let failing = VethSpec::new("t1", "eth1", &pod_ns.path).then([NetOp::up("nope0")]);
    let e = node.create_veth(&failing).await.expect_err("no such link");
    assert!(
        matches!(e, Error::LinkNotFound { ref link, .. } if link == "nope0"),
        "{e}"
    );
    assert!(node.link("t1").await.expect("query").is_none());
    let pod = NetlinkNetdev::open(&pod_ns.path).expect("open pod");
    assert!(pod.link("eth1").await.expect("query").is_none());
    let e = node
        .create_veth(&spec.clone().then([NetOp::up("nope0")]))
        .await
        .expect_err("no such link");
    assert!(matches!(e, Error::LinkNotFound { .. }), "{e}");
    assert!(node.link("t0").await.expect("query").is_some());
    // Bad steps are refused before anything is created.
    let bad = VethSpec::new("t2", "eth2", &pod_ns.path).then([NetOp::up("bad/name")]);
    assert!(matches!(
        node.create_veth(&bad).await,
        Err(Error::InvalidName { .. })
    ));
    assert!(node.link("t2").await.expect("query").is_none());
}

/// Polls `ip -j` until `f` holds (up to 3 s): carrier and link-local addresses come from kernel work queues.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < std::time::Duration::from_secs(3) {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}

/// A request that takes the kernel's RTNL lock (setting `link`'s MTU to the `mtu` it has): when it
/// returns, whatever held the lock before it (linkwatch and the notifiers it runs) has finished.
fn rtnl_barrier(ns: &str, link: &str, mtu: u32) {
    let out = Command::new("ip")
        .args([
            "-n",
            ns,
            "link",
            "set",
            "dev",
            link,
            "mtu",
            &mtu.to_string(),
        ])
        .output()
        .expect("run ip");
    assert!(
        out.status.success(),
        "ip link set mtu: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn inet6_addrs(ns: &str, link: &str) -> Vec<Value> {
    ip_json(Some(ns), &["addr", "show", link])[0]["addr_info"]
        .as_array()
        .expect("addr_info")
        .iter()
        .filter(|a| a["family"] == "inet6")
        .cloned()
        .collect()
}

#[tokio::test]
async fn root_create_veth_as_the_daemon_does_host_up_no_ipv6_addresses_no_dad() {
    require_root!();
    let pod_ns = TestNs::new("va");
    let node_ns = TestNs::new("vn");
    let node = NetlinkNetdev::open(&node_ns.path).expect("open node");
    let mac: Mac = "0a:00:00:00:cc:01".parse().expect("mac");
    // IPv4 pod: no IPv6 address generated on either end, host end up from its create request.
    let spec = VethSpec::new("a0", "eth0", &pod_ns.path)
        .mtu(1400)
        .peer_mac(mac)
        .host_up()
        .then([NetOp::ipv6_addr_gen_none("a0")])
        .peer_then([
            NetOp::SetMac {
                link: "eth0".into(),
                mac,
            },
            NetOp::SetMtu {
                link: "eth0".into(),
                mtu: 1400,
            },
            NetOp::ipv6_addr_gen_none("eth0"),
            NetOp::address_no_dad("eth0", "10.75.0.2/24".parse().expect("cidr")),
            NetOp::up("eth0"),
        ]);
    let pair = node.create_veth(&spec).await.expect("create");
    assert!(pair.created && pair.host.admin_up, "{:?}", pair.host);
    assert_eq!(pair.host.mtu, 1400);
    let peer = pair.peer.expect("pod end");
    assert!(
        peer.admin_up && peer.mac == Some(mac) && peer.mtu == 1400,
        "{peer:?}"
    );
    // Both ends have carrier, and still no IPv6 address (a link-local one would come with the carrier).
    // The kernel's linkwatch sets a link's operstate to UP and then, in the same hold of the RTNL lock, runs
    // the NETDEV_CHANGE notifiers, where addrconf makes the link-local address of a link that became ready
    // (the pod end's came up with carrier: addrconf ran in our request). So once both ends show UP, a
    // request that takes the RTNL lock returns only after those notifiers ran: an address they make would
    // be there.
    for (ns, link) in [(&node_ns.name, "a0"), (&pod_ns.name, "eth0")] {
        assert!(
            eventually(|| {
                let l = &ip_json(Some(ns), &["link", "show", link])[0];
                has_flag(l, "LOWER_UP") && l["operstate"] == "UP"
            }),
            "{link} not up: {}",
            ip_json(Some(ns), &["link", "show", link])
        );
    }
    rtnl_barrier(&node_ns.name, "a0", 1400);
    assert_eq!(inet6_addrs(&node_ns.name, "a0"), Vec::<Value>::new());
    assert_eq!(inet6_addrs(&pod_ns.name, "eth0"), Vec::<Value>::new());
    let again = node.create_veth(&spec).await.expect("idempotent");
    assert!(!again.created && again.host.admin_up);

    // Control: without the step, the kernel makes a link-local address once there is carrier.
    let ctl = VethSpec::new("a1", "eth1", &pod_ns.path)
        .host_up()
        .peer_then([
            NetOp::up("eth1"),
            // IPv6 with and without duplicate address detection: only the first is usable at once.
            NetOp::address_no_dad("eth1", "fd00:75::2/64".parse().expect("cidr")),
            NetOp::address("eth1", "fd00:75::3/64".parse().expect("cidr")),
        ]);
    node.create_veth(&ctl).await.expect("create control");
    assert!(eventually(|| inet6_addrs(&node_ns.name, "a1")
        .iter()
        .any(|a| a["scope"] == "link")));
    let v6 = inet6_addrs(&pod_ns.name, "eth1");
    let find = |addr: &str| {
        v6.iter()
            .find(|a| a["local"] == addr)
            .cloned()
            .unwrap_or_else(|| panic!("{addr} missing: {v6:?}"))
    };
    let no_dad = find("fd00:75::2");
    assert_eq!(no_dad["nodad"], true, "{no_dad}");
    assert_ne!(no_dad["tentative"], true, "{no_dad}");
    assert_eq!(find("fd00:75::3")["tentative"], true, "{v6:?}");
}

#[tokio::test]
async fn root_a_file_that_is_no_namespace_fails_on_first_use() {
    require_root!();
    // Opening does not wait for the thread to enter the namespace; the failure to enter it is every
    // request's error, and nothing hangs.
    let file = tempfile::NamedTempFile::new().expect("temp file");
    let dev = NetlinkNetdev::open(file.path()).expect("open returns at once");
    for _ in 0..2 {
        let e = dev.link("lo").await.expect_err("not a netns");
        assert!(matches!(e, Error::Io { op: "setns", .. }), "{e}");
    }
    assert!(matches!(
        NetlinkNetdev::open("/nonexistent/netns"),
        Err(Error::Io {
            op: "open netns",
            ..
        })
    ));
}

/// `ethtool -k LINK` in namespace `ns` (the independent checker): feature name -> on.
fn ethtool_features(ns: &str, link: &str) -> std::collections::HashMap<String, bool> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "ethtool", "-k", link])
        .output()
        .expect("run ethtool");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (k, v) = l.trim().split_once(": ")?;
            Some((k.to_owned(), v.starts_with("on")))
        })
        .collect()
}

#[tokio::test]
async fn root_tx_checksum_off_on_the_pod_end_in_the_create_round_trip() {
    require_root!();
    if !skip::installed("ethtool") {
        skip::skip("ethtool (the independent checker) is not installed");
        return;
    }
    let pod_ns = TestNs::new("ta");
    let node_ns = TestNs::new("tn");
    let node = NetlinkNetdev::open(&node_ns.path).expect("open node");
    // A veth offers TX checksumming (and TSO on top of it) by default.
    let spec = VethSpec::new("c0", "eth0", &pod_ns.path)
        .host_up()
        .peer_then([NetOp::tx_checksum_off("eth0"), NetOp::up("eth0")]);
    let pair = node.create_veth(&spec).await.expect("create");
    assert!(pair.peer.expect("pod end").admin_up);
    let pod = ethtool_features(&pod_ns.name, "eth0");
    assert_eq!(pod.get("tx-checksum-ip-generic"), Some(&false), "{pod:?}");
    assert_eq!(pod.get("tx-checksum-sctp"), Some(&false), "{pod:?}");
    assert_eq!(pod.get("tx-checksumming"), Some(&false), "{pod:?}");
    // TSO needs a TX checksum: the kernel drops it too.
    assert_eq!(pod.get("tx-tcp-segmentation"), Some(&false), "{pod:?}");
    // The host end was not asked: it keeps its offloads.
    let host = ethtool_features(&node_ns.name, "c0");
    assert_eq!(host.get("tx-checksum-ip-generic"), Some(&true), "{host:?}");
    // Idempotent on a found pair.
    node.create_veth(&spec).await.expect("again");
    // The single step through a namespace's own thread.
    node.set_tx_checksum_off("c0").await.expect("host end off");
    let host = ethtool_features(&node_ns.name, "c0");
    assert_eq!(host.get("tx-checksum-ip-generic"), Some(&false), "{host:?}");
    let e = node.set_tx_checksum_off("nope0").await.expect_err("absent");
    assert!(matches!(e, Error::LinkNotFound { .. }), "{e}");
    assert!(matches!(
        node.set_tx_checksum_off("bad/name").await,
        Err(Error::InvalidName { .. })
    ));
    // A failing pod-end step undoes the new pair.
    let bad = VethSpec::new("c1", "eth1", &pod_ns.path).peer_then([NetOp::tx_checksum_off("eth9")]);
    assert!(matches!(
        node.create_veth(&bad).await,
        Err(Error::LinkNotFound { .. })
    ));
    assert!(node.link("c1").await.expect("query").is_none());
}
