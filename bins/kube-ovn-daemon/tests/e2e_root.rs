//! End to end, as root, on a real single-node OVN: logical switches and ports created with kubeovn-ovn, our
//! shim `kube-ovn` exec'd as kubelet does, the daemon (in-process) plugging pods into the bridge through the
//! Open_vSwitch database; checked with ping, TCP and UDP echo (python3), `ovs-vsctl` and `ip`.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{net, Harness};
use serde_json::Value;

#[test]
fn pods_ping_through_switch_and_router_and_del_cleans_up() {
    if !common::runnable() {
        return;
    }
    let mut h = Harness::start(|_| {});
    h.subnet("ls-a", "lr", "00:00:00:ee:00:01", "10.231.1.1/24");
    h.subnet("ls-b", "lr", "00:00:00:ee:00:02", "10.231.2.1/24");
    let p1 = h.pod("p1");
    let p2 = h.pod("p2");
    let p3 = h.pod("p3");
    for (p, sw, mac, ip, gw) in [
        (
            &p1,
            "ls-a",
            "00:00:00:aa:01:01",
            "10.231.1.10",
            "10.231.1.1",
        ),
        (
            &p2,
            "ls-a",
            "00:00:00:aa:01:02",
            "10.231.1.11",
            "10.231.1.1",
        ),
        (
            &p3,
            "ls-b",
            "00:00:00:aa:02:01",
            "10.231.2.10",
            "10.231.2.1",
        ),
    ] {
        h.lsp(sw, p, mac, ip);
        let cidr = format!("{ip}/24");
        h.publish(p, net(&cidr, gw, mac, sw));
    }
    let conf = h.netconf("1.0.0");
    let (code, r1) = h.shim("ADD", &p1, &conf);
    assert_eq!(code, 0, "{r1}");
    assert_eq!(r1["cniVersion"], "1.0.0");
    assert_eq!(r1["ips"][0]["address"], "10.231.1.10/24");
    assert_eq!(r1["ips"][0]["gateway"], "10.231.1.1");
    assert_eq!(r1["ips"][0]["interface"], 1);
    assert_eq!(r1["interfaces"][0]["name"], Value::from(p1.host_if()));
    assert_eq!(r1["interfaces"][1]["name"], "eth0");
    assert_eq!(r1["interfaces"][1]["mac"], "00:00:00:aa:01:01");
    assert_eq!(
        r1["interfaces"][1]["sandbox"],
        Value::from(p1.netns.display().to_string())
    );
    assert_eq!(r1["routes"][0]["dst"], "0.0.0.0/0");
    assert_eq!(r1["routes"][0]["gw"], "10.231.1.1");
    // An older runtime gets its own version.
    let (code, r2) = h.shim("ADD", &p2, &h.netconf("0.3.1"));
    assert_eq!(code, 0, "{r2}");
    assert_eq!(r2["ips"][0]["version"], "4");
    let (code, r3) = h.shim("ADD", &p3, &conf);
    assert_eq!(code, 0, "{r3}");

    // The Open_vSwitch database as ovs-vsctl sees it.
    let (ok, ids) = h.vsctl(&["get", "interface", &p1.host_if(), "external_ids"]);
    assert!(ok);
    for want in [
        "iface-id=p1.e2e",
        "pod_name=p1",
        "pod_namespace=e2e",
        "ip_address=\"10.231.1.10\"",
        "ovn-installed=\"true\"",
    ] {
        assert!(ids.contains(want), "{want} not in {ids}");
    }
    assert!(
        ids.contains(&format!("pod_netns=\"{}\"", p1.netns.display())),
        "{ids}"
    );

    // The host end is a bridge port: no IPv6 address generated, so no link-local address ever reaches
    // ovs-vswitchd; neither has the IPv4 pod's eth0 one (its carrier is long up by now).
    let detail = std::process::Command::new("ip")
        .args(["-d", "link", "show", "dev", &p1.host_if()])
        .output()
        .expect("ip");
    let detail = String::from_utf8_lossy(&detail.stdout).into_owned();
    assert!(detail.contains("addrgenmode none"), "{detail}");
    let addrs = std::process::Command::new("ip")
        .args(["-6", "-o", "addr", "show", "dev", &p1.host_if()])
        .output()
        .expect("ip");
    assert!(addrs.stdout.is_empty(), "{addrs:?}");
    let pod_v6 = std::process::Command::new("ip")
        .args([
            "-n",
            &p1.netns_name,
            "-6",
            "-o",
            "addr",
            "show",
            "dev",
            "eth0",
        ])
        .output()
        .expect("ip");
    assert!(pod_v6.status.success(), "{pod_v6:?}");
    assert!(pod_v6.stdout.is_empty(), "{pod_v6:?}");

    assert!(h.ping(&p1, "10.231.1.11"), "p1 -> p2 on one switch");
    assert!(h.ping(&p2, "10.231.1.10"), "p2 -> p1");
    assert!(h.ping(&p3, "10.231.1.10"), "p3 -> p1 through the router");
    assert!(h.ping(&p1, "10.231.2.10"), "p1 -> p3 through the router");
    // TCP and UDP too: veths hand the userspace datapath partial checksums, which only ICMP survives
    // unless the ADD turned TX checksumming off on the pod's interface.
    let _s1 = h.echo_server(&p1, "10.231.1.10", 8080);
    let _s3 = h.echo_server(&p3, "10.231.2.10", 8080);
    assert!(
        h.tcp(&p2, "10.231.1.10", 8080),
        "TCP p2 -> p1 on one switch"
    );
    assert!(
        h.udp(&p2, "10.231.1.10", 8080),
        "UDP p2 -> p1 on one switch"
    );
    assert!(
        h.tcp(&p3, "10.231.1.10", 8080),
        "TCP p3 -> p1 through the router"
    );
    assert!(
        h.udp(&p3, "10.231.1.10", 8080),
        "UDP p3 -> p1 through the router"
    );
    assert!(
        h.tcp(&p1, "10.231.2.10", 8080),
        "TCP p1 -> p3 through the router"
    );
    assert!(
        h.udp(&p1, "10.231.2.10", 8080),
        "UDP p1 -> p3 through the router"
    );

    // ADD again: same answer, nothing duplicated.
    let (code, again) = h.shim("ADD", &p1, &conf);
    assert_eq!(code, 0, "{again}");
    assert_eq!(again, r1);
    assert_eq!(h.ports().len(), 3, "{:?}", h.ports());
    assert!(h.ping(&p1, "10.231.1.11"));

    // CHECK (1.0.0 has it) with the ADD's result as prevResult.
    let mut check_conf = conf.clone();
    check_conf["prevResult"] = r1.clone();
    let (code, out) = h.shim("CHECK", &p1, &check_conf);
    assert_eq!(code, 0, "{out}");

    // DEL: no OVS port, no veth on either side; twice is fine.
    for p in [&p1, &p2, &p3] {
        let (code, out) = h.shim("DEL", p, &conf);
        assert_eq!(code, 0, "{out}");
        assert!(Harness::veth_gone(p));
        let (code, out) = h.shim("DEL", p, &conf);
        assert_eq!(code, 0, "second DEL: {out}");
    }
    assert!(h.ports().is_empty(), "{:?}", h.ports());
    let (_, ifaces) = h.vsctl(&["--columns=name", "list", "interface"]);
    assert!(!ifaces.contains("_h"), "{ifaces}");

    // CHECK after DEL fails with a code.
    let (code, out) = h.shim("CHECK", &p1, &check_conf);
    assert_ne!(code, 0);
    assert_eq!(out["code"], 122, "{out}");

    let m = h.scrape();
    assert!(
        m.contains("kube_ovn_cni_request_duration_seconds_count{command=\"ADD\"} 4"),
        "{m}"
    );
    assert!(
        m.contains("kube_ovn_cni_errors_total{command=\"CHECK\",code=\"122\"} 1"),
        "{m}"
    );
}

#[test]
fn bad_inputs_give_codes_and_leave_nothing() {
    if !common::runnable() {
        return;
    }
    let mut h = Harness::start(|c| {
        c.pod_network_timeout = Duration::from_millis(300);
        c.ovn_installed_timeout = Some(Duration::from_millis(1500));
    });
    h.subnet("ls-a", "lr", "00:00:00:ee:00:01", "10.231.1.1/24");
    let p = h.pod("bad");
    let conf = h.netconf("1.1.0");
    let nothing_left = |h: &Harness| {
        assert!(h.ports().is_empty(), "{:?}", h.ports());
        assert!(!Harness::host_link_exists(&p.host_if()));
        assert!(!Harness::pod_link_exists(&p, "eth0"));
    };

    // The pod's network is never published: try again later (11), after the bounded wait.
    let t = std::time::Instant::now();
    let (code, out) = h.shim("ADD", &p, &conf);
    assert_ne!(code, 0);
    assert_eq!(out["code"], 11, "{out}");
    assert!(t.elapsed() < Duration::from_secs(3));
    nothing_left(&h);

    // A netns that does not exist: invalid environment (4).
    h.publish(
        &p,
        net("10.231.1.20/24", "10.231.1.1", "00:00:00:aa:01:20", "ls-a"),
    );
    let (code, out) = h.shim_env(
        "ADD",
        &p,
        &conf,
        &[("CNI_NETNS", "/var/run/netns/kovn-none")],
    );
    assert_eq!((code != 0, &out["code"]), (true, &Value::from(4)), "{out}");
    nothing_left(&h);

    // A container id unusable in an interface name, a missing CNI_IFNAME: 4.
    let (_, out) = h.shim_env("ADD", &p, &conf, &[("CNI_CONTAINERID", "bad id")]);
    assert_eq!(out["code"], 4, "{out}");
    let (_, out) = h.shim_env("ADD", &p, &conf, &[("CNI_IFNAME", "")]);
    assert_eq!(out["code"], 4, "{out}");
    // Malformed configuration: 6.
    let (code, out) = common::run_shim(
        &[
            ("CNI_COMMAND".into(), "ADD".into()),
            ("CNI_CONTAINERID".into(), p.container_id.clone()),
            ("CNI_NETNS".into(), p.netns.display().to_string()),
            ("CNI_IFNAME".into(), "eth0".into()),
            ("CNI_PATH".into(), "/opt/cni/bin".into()),
        ],
        &Value::String("{not json".into()),
    );
    assert_ne!(code, 0);
    assert_eq!(out["code"], 6, "{out}");
    nothing_left(&h);

    // Invalid pod network data (no address): 126.
    let mut bad = net("10.231.1.20/24", "10.231.1.1", "00:00:00:aa:01:20", "ls-a");
    bad.ips.clear();
    h.publish(&p, bad);
    let (_, out) = h.shim("ADD", &p, &conf);
    assert_eq!(out["code"], 126, "{out}");
    nothing_left(&h);

    // No logical switch port: ovn-controller never installs the port; the ADD fails (11) and rolls back
    // the port and the veth it created.
    h.publish(
        &p,
        net("10.231.1.20/24", "10.231.1.1", "00:00:00:aa:01:20", "ls-a"),
    );
    let (code, out) = h.shim("ADD", &p, &conf);
    assert_ne!(code, 0);
    assert_eq!(out["code"], 11, "{out}");
    nothing_left(&h);

    // With the port it works, and the pod reaches its gateway.
    h.lsp("ls-a", &p, "00:00:00:aa:01:20", "10.231.1.20");
    let (code, out) = h.shim("ADD", &p, &conf);
    assert_eq!(code, 0, "{out}");
    assert!(h.ping(&p, "10.231.1.1"));
    let (code, _) = h.shim("DEL", &p, &conf);
    assert_eq!(code, 0);
    assert!(Harness::veth_gone(&p));
    nothing_left(&h);
}

#[test]
fn qos_gc_and_half_gone_del() {
    if !common::runnable() {
        return;
    }
    let mut h = Harness::start(|c| {
        c.ovn_installed_timeout = None;
        c.gateway_timeout = None;
    });
    let a = h.pod("qa");
    let b = h.pod("qb");
    let mut na = net("10.231.1.30/24", "10.231.1.1", "00:00:00:aa:01:30", "ls-a");
    na.ingress_rate_mbps = Some(10);
    na.egress_rate_mbps = Some(5);
    na.routes.push(kubeovn_cni::node::PodRoute {
        dst: "192.168.50.0/24".parse().unwrap(),
        gw: Some("10.231.1.254".parse().unwrap()),
    });
    h.publish(&a, na);
    h.publish(
        &b,
        net("10.231.1.31/24", "10.231.1.1", "00:00:00:aa:01:31", "ls-a"),
    );
    let conf = h.netconf("1.1.0");
    let (code, out) = h.shim("ADD", &a, &conf);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["routes"][1]["dst"], "192.168.50.0/24", "{out}");
    let (code, out) = h.shim("ADD", &b, &conf);
    assert_eq!(code, 0, "{out}");

    let (_, rate) = h.vsctl(&["get", "interface", &a.host_if(), "ingress_policing_rate"]);
    assert_eq!(rate, "5000");
    let (_, burst) = h.vsctl(&["get", "interface", &a.host_if(), "ingress_policing_burst"]);
    assert_eq!(burst, "4000");
    let (_, qos) = h.vsctl(&["--columns=type,other_config", "list", "qos"]);
    assert!(
        qos.contains("linux-htb") && qos.contains("max-rate=\"10000000\""),
        "{qos}"
    );
    let (_, route) = std::process::Command::new("ip")
        .args(["-n", &a.netns_name, "route", "show", "192.168.50.0/24"])
        .output()
        .map(|o| {
            (
                o.status.success(),
                String::from_utf8_lossy(&o.stdout).into_owned(),
            )
        })
        .unwrap();
    assert!(route.contains("via 10.231.1.254"), "{route}");

    // GC keeps the valid attachment, removes the other.
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] =
        serde_json::json!([{"containerID": a.container_id, "ifname": "eth0"}]);
    let (code, out) = h.shim("GC", &a, &gc);
    assert_eq!(code, 0, "{out}");
    assert_eq!(h.ports(), vec![a.host_if()]);
    assert!(!Harness::host_link_exists(&b.host_if()));

    // Half gone: the veth deleted behind the daemon's back; DEL still removes the port and the QoS.
    assert!(std::process::Command::new("ip")
        .args(["link", "del", &a.host_if()])
        .status()
        .unwrap()
        .success());
    let (code, out) = h.shim("DEL", &a, &conf);
    assert_eq!(code, 0, "{out}");
    assert!(h.ports().is_empty());
    let (_, qos) = h.vsctl(&["list", "qos"]);
    assert!(qos.is_empty(), "{qos}");

    // STATUS answers ready.
    let (code, out) = h.shim("STATUS", &a, &conf);
    assert_eq!(code, 0, "{out}");
}

/// A dual-stack pod: its IPv6 address usable as soon as ADD returns (no duplicate address detection), its
/// link-local address kept, and IPv4 and IPv6 pings through the logical switch and to the router.
#[test]
fn dual_stack_pods_ping_over_ipv4_and_ipv6() {
    if !common::runnable() {
        return;
    }
    let mut h = Harness::start(|_| {});
    h.subnet_with(
        "ls-6",
        "lr6",
        "00:00:00:ee:00:06",
        &["10.231.6.1/24", "fd00:231:6::1/64"],
    );
    let q1 = h.pod("q1");
    let q2 = h.pod("q2");
    for (p, mac, v4, v6) in [
        (&q1, "00:00:00:aa:06:01", "10.231.6.10", "fd00:231:6::10"),
        (&q2, "00:00:00:aa:06:02", "10.231.6.11", "fd00:231:6::11"),
    ] {
        h.lsp("ls-6", p, mac, &format!("{v4} {v6}"));
        let mut n = net(&format!("{v4}/24"), "10.231.6.1", mac, "ls-6");
        n.ips.push(format!("{v6}/64").parse().unwrap());
        n.gateways.push("fd00:231:6::1".parse().unwrap());
        h.publish(p, n);
    }
    let conf = h.netconf("1.0.0");
    for p in [&q1, &q2] {
        let (code, r) = h.shim("ADD", p, &conf);
        assert_eq!(code, 0, "{r}");
        assert_eq!(r["ips"].as_array().map(Vec::len), Some(2), "{r}");
    }
    assert_eq!(h.shim("ADD", &q1, &conf).0, 0, "ADD twice is idempotent");
    let out = std::process::Command::new("ip")
        .args([
            "-n",
            &q1.netns_name,
            "-j",
            "-6",
            "addr",
            "show",
            "dev",
            "eth0",
        ])
        .output()
        .expect("ip");
    let addrs: Value = serde_json::from_slice(&out.stdout).expect("ip -j");
    let infos = addrs[0]["addr_info"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let global = infos
        .iter()
        .find(|a| a["local"] == "fd00:231:6::10")
        .unwrap_or_else(|| panic!("no IPv6 address: {infos:?}"));
    assert_eq!(global["nodad"], true, "{global}");
    assert_ne!(global["tentative"], true, "{global}");
    assert!(
        infos.iter().any(|a| a["scope"] == "link"),
        "an IPv6 pod keeps its link-local address: {infos:?}"
    );
    assert!(h.ping(&q1, "10.231.6.11"), "q1 -> q2 over IPv4");
    assert!(h.ping(&q1, "fd00:231:6::11"), "q1 -> q2 over IPv6");
    assert!(h.ping(&q2, "fd00:231:6::1"), "q2 -> its IPv6 gateway");
    for p in [&q1, &q2] {
        assert_eq!(h.shim("DEL", p, &conf).0, 0);
    }
}
