//! The plugin exec'd as a runtime (or a main plugin delegating IPAM) runs it: every command, static IPs by
//! every convention, error codes, idempotency, dual stack, version conversion, concurrency.

mod common;

use std::collections::HashSet;

use common::{exec, Net, Out, PLUGIN};
use serde_json::json;

fn v4net(name: &str) -> Net {
    Net::new(
        name,
        json!({"subnet": "10.88.0.0/24", "excludeIps": ["10.88.0.2..10.88.0.10"], "routes": [{"dst": "0.0.0.0/0"}]}),
    )
}

#[test]
fn version_lists_every_version() {
    let out = exec(
        &[PLUGIN],
        &[("CNI_COMMAND", "VERSION")],
        br#"{"cniVersion":"1.0.0"}"#,
    )
    .ok();
    assert_eq!(out["cniVersion"], "1.0.0");
    let versions: Vec<&str> = out["supportedVersions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        versions,
        ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
    );
    let out = exec(&[PLUGIN], &[("CNI_COMMAND", "VERSION")], b"").ok();
    assert_eq!(out["cniVersion"], "1.1.0");
}

#[test]
fn add_result_gateway_excludes_routes() {
    let net = v4net("n-add");
    let r = net.run("ADD", "c1").ok();
    assert_eq!(
        r,
        json!({"cniVersion": "1.1.0", "ips": [{"address": "10.88.0.11/24", "gateway": "10.88.0.1"}],
               "routes": [{"dst": "0.0.0.0/0"}]})
    );
    assert!(
        r.get("interfaces").is_none(),
        "an IPAM plugin returns no interfaces"
    );
}

#[test]
fn add_is_idempotent_del_is_idempotent() {
    let net = v4net("n-idem");
    let a = net.run("ADD", "c1").ok();
    assert_eq!(
        net.run("ADD", "c1").ok(),
        a,
        "same container and interface: same address"
    );
    let other_if = net
        .run_with("ADD", "c1", &net.conf, &[("CNI_IFNAME", "net1")])
        .ok();
    assert_ne!(
        Out::addresses(&other_if),
        Out::addresses(&a),
        "another interface is another attachment"
    );
    let b = net.run("ADD", "c2").ok();
    assert_ne!(Out::addresses(&a), Out::addresses(&b));
    assert_eq!(net.run("DEL", "c1").ok(), serde_json::Value::Null);
    net.run("DEL", "c1").ok();
    net.run("DEL", "never-added").ok();
    // DEL needs no CNI_NETNS.
    let env = [
        ("CNI_COMMAND", "DEL"),
        ("CNI_CONTAINERID", "c2"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/x"),
    ];
    assert_eq!(
        exec(&[PLUGIN], &env, net.conf.to_string().as_bytes()).code,
        0
    );
    // Released addresses are reused last (Kube-OVN's delayed reuse): c3 gets a fresh one.
    let c = net.run("ADD", "c3").ok();
    assert_eq!(Out::addresses(&c), ["10.88.0.14/24"]);
    net.run("CHECK", "c3").ok();
    net.run("CHECK", "c1").err(102);
}

#[test]
fn gateway_default_and_explicit() {
    let net = Net::new("n-gw", json!({"subnet": "10.89.0.0/30"}));
    let r = net.run("ADD", "c1").ok();
    assert_eq!(
        r["ips"][0],
        json!({"address": "10.89.0.2/30", "gateway": "10.89.0.1"})
    );
    net.run("ADD", "c2").err(100);
    let net = Net::new(
        "n-gw2",
        json!({"subnet": "10.89.0.0/29", "gateway": "10.89.0.6"}),
    );
    let r = net.run("ADD", "c1").ok();
    assert_eq!(
        r["ips"][0],
        json!({"address": "10.89.0.1/29", "gateway": "10.89.0.6"})
    );
}

#[test]
fn static_ips_by_every_convention() {
    let net = v4net("n-static");
    let rc = net.with("runtimeConfig", json!({"ips": ["10.88.0.50/24"]}));
    assert_eq!(
        Out::addresses(&net.run_with("ADD", "rc", &rc, &[]).ok()),
        ["10.88.0.50/24"]
    );
    let args = net.with("args", json!({"cni": {"ips": ["10.88.0.51"]}}));
    assert_eq!(
        Out::addresses(&net.run_with("ADD", "args", &args, &[]).ok()),
        ["10.88.0.51/24"]
    );
    let env = [("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=p;IP=10.88.0.52")];
    assert_eq!(
        Out::addresses(&net.run_with("ADD", "env", &net.conf, &env).ok()),
        ["10.88.0.52/24"]
    );
    // An excluded address can still be asked for explicitly (excludeIps only steers next-free).
    let env = [("CNI_ARGS", "IP=10.88.0.5")];
    assert_eq!(
        Out::addresses(&net.run_with("ADD", "excl", &net.conf, &env).ok()),
        ["10.88.0.5/24"]
    );
    // Taken, the gateway, outside the subnet: code 101, and nothing changes.
    let before = net.snapshot_files();
    for ip in ["10.88.0.50", "10.88.0.1", "10.99.0.1", "10.88.0.255"] {
        let env = [("CNI_ARGS", format!("IP={ip}"))];
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        net.run_with("ADD", "thief", &net.conf, &env).err(101);
    }
    assert_eq!(
        net.snapshot_files(),
        before,
        "failed ADDs leave the state unchanged"
    );
    // Two addresses of one family: invalid configuration.
    let two = net.with(
        "runtimeConfig",
        json!({"ips": ["10.88.0.60", "10.88.0.61"]}),
    );
    net.run_with("ADD", "two", &two, &[]).err(7);
    // Next-free skips every static address.
    let r = net.run("ADD", "free").ok();
    assert_eq!(Out::addresses(&r), ["10.88.0.11/24"]);
}

#[test]
fn errors_have_codes_and_change_nothing() {
    let net = v4net("n-err");
    net.run("ADD", "c1").ok();
    let before = net.snapshot_files();
    let bad = |stdin: &[u8]| {
        let env = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "x"),
            ("CNI_NETNS", "/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/x"),
        ];
        exec(&[PLUGIN], &env, stdin)
    };
    bad(b"{not json").err(6);
    bad(b"").err(6);
    let e = bad(br#"{"cniVersion":"9.9.9","name":"n-err","type":"bridge"}"#).err(1);
    assert_eq!(e["cniVersion"], "1.1.0");
    net.run_with(
        "ADD",
        "x",
        &net.with("ipam", json!({"type": "kube-ovn-ipam"})),
        &[],
    )
    .err(7);
    net.run_with(
        "ADD",
        "x",
        &net.with(
            "ipam",
            json!({"type": "kube-ovn-ipam", "subnet": "10.0.0.0/40"}),
        ),
        &[],
    )
    .err(7);
    net.run_with("ADD", "x", &net.with("ipam", serde_json::Value::Null), &[])
        .err(7);
    net.run_with("ADD", "x", &net.with("name", json!("")), &[])
        .err(7);
    let e = net
        .run_with(
            "ADD",
            "x",
            &net.with("cniVersion", json!("0.4.0")),
            &[("CNI_NETNS", "")],
        )
        .err(4);
    assert_eq!(
        e["cniVersion"], "0.4.0",
        "errors speak the request's version"
    );
    net.run_with("ADD", "bad/id", &net.conf, &[]).err(4);
    net.run_with("BOGUS", "x", &net.conf, &[]).err(4);
    assert_eq!(net.snapshot_files(), before);
}

#[test]
fn exhausted_subnet_is_code_100_and_status_50() {
    let net = Net::new("n-full", json!({"subnet": "10.90.0.0/29"}));
    net.run("STATUS", "").ok();
    for i in 0..5 {
        net.run("ADD", &format!("c{i}")).ok();
    }
    let before = net.snapshot_files();
    let e = net.run("ADD", "one-too-many").err(100);
    assert!(e["msg"].as_str().unwrap().contains("one-too-many"), "{e}");
    assert_eq!(net.snapshot_files(), before);
    net.run("STATUS", "").err(50);
    net.run("DEL", "c3").ok();
    net.run("STATUS", "").ok();
    assert_eq!(
        Out::addresses(&net.run("ADD", "again").ok()),
        ["10.90.0.5/29"],
        "the only free address"
    );
    // STATUS and GC are 1.1.0 commands.
    net.run_with("STATUS", "", &net.with("cniVersion", json!("1.0.0")), &[])
        .err(1);
}

#[test]
fn dual_stack() {
    let net = Net::new(
        "n-dual",
        json!({"subnet": "10.91.0.0/24,fd00:91::/120", "gateway": "10.91.0.254", "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]}),
    );
    let r = net.run("ADD", "c1").ok();
    assert_eq!(
        r["ips"],
        json!([{"address": "10.91.0.1/24", "gateway": "10.91.0.254"}, {"address": "fd00:91::2/120", "gateway": "fd00:91::1"}])
    );
    assert_eq!(r["routes"].as_array().unwrap().len(), 2);
    let env = [("CNI_ARGS", "IP=fd00:91::80,10.91.0.80")];
    let r = net.run_with("ADD", "c2", &net.conf, &env).ok();
    assert_eq!(Out::addresses(&r), ["10.91.0.80/24", "fd00:91::80/120"]);
    // Only an IPv6 address asked for: IPv4 comes from next-free.
    let rc = net.with("runtimeConfig", json!({"ips": ["fd00:91::81/120"]}));
    let r = net.run_with("ADD", "c3", &rc, &[]).ok();
    assert_eq!(Out::addresses(&r), ["10.91.0.2/24", "fd00:91::81/120"]);
}

#[test]
fn results_in_the_requested_version() {
    let net = Net::new(
        "n-ver",
        json!({"subnet": "10.92.0.0/24,fd00:92::/120", "routes": [{"dst": "0.0.0.0/0"}]}),
    );
    let r = net
        .run_with("ADD", "c1", &net.with("cniVersion", json!("0.3.1")), &[])
        .ok();
    assert_eq!(r["cniVersion"], "0.3.1");
    assert_eq!(
        r["ips"][0],
        json!({"version": "4", "address": "10.92.0.2/24", "gateway": "10.92.0.1"})
    );
    assert_eq!(r["ips"][1]["version"], "6");
    let r = net
        .run_with("ADD", "c1", &net.with("cniVersion", json!("0.2.0")), &[])
        .ok();
    assert_eq!(
        r,
        json!({"cniVersion": "0.2.0", "ip4": {"ip": "10.92.0.2/24", "gateway": "10.92.0.1", "routes": [{"dst": "0.0.0.0/0"}]},
               "ip6": {"ip": "fd00:92::2/120", "gateway": "fd00:92::1"}})
    );
    let r = net
        .run_with("ADD", "c1", &net.with("cniVersion", json!("1.0.0")), &[])
        .ok();
    assert_eq!(r["cniVersion"], "1.0.0");
    assert!(r["ips"][0].get("version").is_none());
}

#[test]
fn check_compares_with_prev_result() {
    let net = v4net("n-check");
    let r = net.run("ADD", "c1").ok();
    net.run_with("CHECK", "c1", &net.with("prevResult", r.clone()), &[])
        .ok();
    let mut wrong = r.clone();
    wrong["ips"][0]["address"] = json!("10.88.0.99/24");
    net.run_with("CHECK", "c1", &net.with("prevResult", wrong), &[])
        .err(102);
    // Addresses of other IPAMs (outside our subnet) in prevResult are not ours to judge.
    let mut foreign = r;
    foreign["ips"]
        .as_array_mut()
        .unwrap()
        .push(json!({"address": "192.168.1.5/24"}));
    net.run_with("CHECK", "c1", &net.with("prevResult", foreign), &[])
        .ok();
    net.run("CHECK", "nobody").err(102);
    net.run_with("CHECK", "c1", &net.with("cniVersion", json!("0.3.1")), &[])
        .err(1);
}

#[test]
fn gc_releases_what_is_not_valid() {
    let net = v4net("n-gc");
    for c in ["c1", "c2", "c3"] {
        net.run("ADD", c).ok();
    }
    net.run_with("ADD", "c1", &net.conf, &[("CNI_IFNAME", "net1")])
        .ok();
    let gc = net.with(
        "cni.dev/valid-attachments",
        json!([{"containerID": "c1", "ifname": "eth0"}, {"containerID": "c3", "ifname": "eth0"}]),
    );
    let env = [("CNI_COMMAND", "GC"), ("CNI_PATH", "/usr/lib/cni")];
    assert_eq!(exec(&[PLUGIN], &env, gc.to_string().as_bytes()).code, 0);
    net.run("CHECK", "c1").ok();
    net.run("CHECK", "c3").ok();
    net.run("CHECK", "c2").err(102);
    net.run_with("CHECK", "c1", &net.conf, &[("CNI_IFNAME", "net1")])
        .err(102);
    // GC is a 1.1.0 command.
    let old = net.with("cniVersion", json!("1.0.0"));
    net.run_with("GC", "", &old, &[]).err(1);
}

#[test]
fn many_changes_survive_compaction_and_reload() {
    let net = Net::new("n-many", json!({"subnet": "10.93.0.0/16"}));
    let mut live = std::collections::BTreeMap::new();
    for i in 0..150 {
        let r = net.run("ADD", &format!("c{i}")).ok();
        live.insert(i, Out::addresses(&r));
        if i % 3 == 0 {
            net.run("DEL", &format!("c{}", i / 2)).ok();
            live.remove(&(i / 2));
        }
    }
    for (i, addrs) in &live {
        // ADD is idempotent, so it reports what the state holds.
        assert_eq!(
            &Out::addresses(&net.run("ADD", &format!("c{i}")).ok()),
            addrs,
            "c{i}"
        );
    }
    let all: HashSet<_> = live.values().collect();
    assert_eq!(all.len(), live.len());
    // A corrupt state is an I/O error (code 5), never a panic or a silent reset.
    std::fs::write(net.state_dir().join("state"), b"garbage").unwrap();
    net.run("ADD", "c-new").err(5);
}

#[test]
fn concurrent_adds_never_share_an_address() {
    let net = Net::new("n-conc", json!({"subnet": "10.94.0.0/24"}));
    let results: Vec<Out> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..50)
            .map(|i| {
                let net = &net;
                s.spawn(move || net.run("ADD", &format!("c{i}")))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut seen = HashSet::new();
    for r in results {
        let a = Out::addresses(&r.ok());
        assert_eq!(a.len(), 1);
        assert!(seen.insert(a[0].clone()), "{} handed out twice", a[0]);
    }
    assert_eq!(seen.len(), 50);
    let _ = net.data_dir();
}
