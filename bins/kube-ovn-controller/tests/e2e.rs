//! The controller against the test API server and a real NB ovsdb-server, checked with kubectl and
//! ovn-nbctl: start sequence, subnets, nodes, pods (dynamic, static IP and MAC, IPPool, address list),
//! conflicts as events, a kill and restart with pods deleted meanwhile, and a clean NB after deleting all.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, HashSet};

use common::{pod, wait_for, warning_for, Env};
use serde_json::Value;

fn ann<'a>(o: &'a Value, k: &str) -> Option<&'a str> {
    o.pointer("/metadata/annotations")?.get(k)?.as_str()
}

async fn annotated(env: &Env, ns: &str, name: &str) -> Value {
    wait_for(&format!("pod {ns}/{name} annotated"), 20, || async {
        let p = env.get_json(&["pod", "-n", ns, name]).await?;
        (ann(&p, "ovn.kubernetes.io/allocated") == Some("true")
            && ann(&p, "ovn.kubernetes.io/routed") == Some("true"))
        .then_some(p)
    })
    .await
}

async fn lsp_addresses(env: &Env, port: &str) -> String {
    env.nbctl(&["lsp-get-addresses", port]).await
}

/// Every pod's (ip, mac), checking that no address is used twice.
async fn pod_addresses(env: &Env) -> BTreeMap<String, (String, String)> {
    let pods = env.get_json(&["pods", "-A"]).await.unwrap();
    let mut out = BTreeMap::new();
    let mut seen = HashSet::new();
    for p in pods["items"].as_array().unwrap() {
        let (Some(ip), Some(mac)) = (
            ann(p, "ovn.kubernetes.io/ip_address"),
            ann(p, "ovn.kubernetes.io/mac_address"),
        ) else {
            continue;
        };
        assert!(seen.insert(ip.to_owned()), "address {ip} used twice");
        assert!(seen.insert(mac.to_owned()), "mac {mac} used twice");
        let key = format!(
            "{}/{}",
            p["metadata"]["namespace"].as_str().unwrap(),
            p["metadata"]["name"].as_str().unwrap()
        );
        out.insert(key, (ip.to_owned(), mac.to_owned()));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subnets_nodes_pods_restart_and_cleanup() {
    let Some(mut env) = Env::start().await else {
        return;
    };
    env.start_controller(common::test_config()).await;

    // Start: router, join and default switches with their patch ports, policies, default route, Subnet CRs.
    for s in ["ovn-default", "join"] {
        wait_for(&format!("subnet {s} ready"), 20, || async {
            let o = env.get_json(&["subnets.kubeovn.io", s]).await?;
            let conds = o.pointer("/status/conditions")?.as_array()?.clone();
            conds
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                .then_some(())
        })
        .await;
    }
    let sub = env
        .get_json(&["subnets.kubeovn.io", "ovn-default"])
        .await
        .unwrap();
    assert_eq!(sub["spec"]["cidrBlock"], "10.16.0.0/16");
    assert_eq!(sub["spec"]["gateway"], "10.16.0.1");
    assert_eq!(sub["spec"]["default"], true);
    assert_eq!(
        env.nbctl(&["get", "logical_router", "ovn-cluster", "name"])
            .await,
        "ovn-cluster"
    );
    assert_eq!(
        env.nbctl(&[
            "get",
            "logical_switch",
            "ovn-default",
            "other_config:subnet"
        ])
        .await,
        "\"10.16.0.0/16\""
    );
    assert_eq!(
        env.nbctl(&[
            "get",
            "logical_router_port",
            "ovn-cluster-ovn-default",
            "networks"
        ])
        .await,
        "[\"10.16.0.1/16\"]"
    );
    assert_eq!(
        env.nbctl(&["get", "logical_switch_port", "join-ovn-cluster", "type"])
            .await,
        "router"
    );
    let policies = env.nbctl(&["lr-policy-list", "ovn-cluster"]).await;
    assert!(
        policies.contains("31000") && policies.contains("ip4.dst == 10.16.0.0/16"),
        "{policies}"
    );
    assert!(policies.contains("ip4.dst == 100.64.0.0/16"), "{policies}");
    let routes = env.nbctl(&["lr-route-list", "ovn-cluster"]).await;
    assert!(
        routes.contains("0.0.0.0/0") && routes.contains("100.64.0.1"),
        "{routes}"
    );
    let nb_global = env
        .nbctl(&["get", "nb_global", ".", "options:use_logical_dp_groups"])
        .await;
    assert_eq!(nb_global, "\"true\"");

    // A node: join address, port node-n1, its port group and the 30000 policy.
    env.apply(
        r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"},
        "status":{"addresses":[{"type":"InternalIP","address":"172.18.0.2"}]}}"#,
    )
    .await;
    let node = wait_for("node annotated", 20, || async {
        let n = env.get_json(&["node", "n1"]).await?;
        (ann(&n, "ovn.kubernetes.io/allocated") == Some("true")).then_some(n)
    })
    .await;
    let join_ip = ann(&node, "ovn.kubernetes.io/ip_address")
        .unwrap()
        .to_owned();
    assert!(join_ip.starts_with("100.64."), "{join_ip}");
    assert_eq!(ann(&node, "ovn.kubernetes.io/logical_switch"), Some("join"));
    assert_eq!(ann(&node, "ovn.kubernetes.io/port_name"), Some("node-n1"));
    let mac = ann(&node, "ovn.kubernetes.io/mac_address").unwrap();
    assert_eq!(
        lsp_addresses(&env, "node-n1").await,
        format!("{mac} {join_ip}")
    );
    wait_for("node policy", 20, || async {
        let p = env.nbctl(&["lr-policy-list", "ovn-cluster"]).await;
        (p.contains("ip4.dst == 172.18.0.2") && p.contains(&join_ip)).then_some(())
    })
    .await;
    wait_for("distributed gateway policy", 20, || async {
        let p = env.nbctl(&["lr-policy-list", "ovn-cluster"]).await;
        p.contains("ip4.src == $ovn.default.n1_ip4").then_some(())
    })
    .await;

    // A subnet bound to ns1, an IPPool in it.
    env.apply(r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"ns1"}}"#)
        .await;
    env.apply(
        r#"{"apiVersion":"kubeovn.io/v1","kind":"Subnet","metadata":{"name":"s1"},
        "spec":{"cidrBlock":"10.66.0.0/24","excludeIps":["10.66.0.2..10.66.0.9"],"namespaces":["ns1"],"protocol":"IPv4","provider":"ovn","vpc":"ovn-cluster"}}"#,
    )
    .await;
    env.apply(
        r#"{"apiVersion":"kubeovn.io/v1","kind":"IPPool","metadata":{"name":"pool1"},
        "spec":{"subnet":"s1","ips":["10.66.0.200..10.66.0.210"]}}"#,
    )
    .await;
    wait_for("s1 switch", 20, || async {
        let o = env
            .nbctl(&[
                "--if-exists",
                "get",
                "logical_switch",
                "s1",
                "other_config:exclude_ips",
            ])
            .await;
        (o == "\"10.66.0.1 10.66.0.2..10.66.0.9\"").then_some(())
    })
    .await;
    wait_for("ns1 bound to s1", 20, || async {
        let n = env.get_json(&["namespace", "ns1"]).await?;
        (ann(&n, "ovn.kubernetes.io/logical_switch") == Some("s1")
            && ann(&n, "ovn.kubernetes.io/cidr") == Some("10.66.0.0/24"))
        .then_some(())
    })
    .await;

    // Pods: namespace subnet, default subnet, static IP + MAC, IPPool, address list, explicit switch.
    env.apply(&pod("ns1", "a", "n1", &[])).await;
    env.apply(&pod("default", "b", "n1", &[])).await;
    env.apply(&pod(
        "default",
        "static",
        "n1",
        &[
            ("ovn.kubernetes.io/ip_address", "10.16.0.100"),
            ("ovn.kubernetes.io/mac_address", "00:00:00:53:6b:01"),
            ("ovn.kubernetes.io/port_security", "true"),
        ],
    ))
    .await;
    env.apply(&pod(
        "default",
        "pooled",
        "n1",
        &[("ovn.kubernetes.io/ip_pool", "pool1")],
    ))
    .await;
    env.apply(&pod(
        "default",
        "listed",
        "n1",
        &[
            ("ovn.kubernetes.io/logical_switch", "s1"),
            ("ovn.kubernetes.io/ip_pool", "10.66.0.50,10.66.0.51"),
        ],
    ))
    .await;

    let a = annotated(&env, "ns1", "a").await;
    assert_eq!(ann(&a, "ovn.kubernetes.io/logical_switch"), Some("s1"));
    assert_eq!(ann(&a, "ovn.kubernetes.io/cidr"), Some("10.66.0.0/24"));
    assert_eq!(ann(&a, "ovn.kubernetes.io/gateway"), Some("10.66.0.1"));
    assert_eq!(ann(&a, "ovn.kubernetes.io/ip_address"), Some("10.66.0.10"));
    let b = annotated(&env, "default", "b").await;
    assert_eq!(
        ann(&b, "ovn.kubernetes.io/logical_switch"),
        Some("ovn-default")
    );
    assert_eq!(
        ann(&b, "ovn.kubernetes.io/logical_router"),
        Some("ovn-cluster")
    );
    let st = annotated(&env, "default", "static").await;
    assert_eq!(
        ann(&st, "ovn.kubernetes.io/ip_address"),
        Some("10.16.0.100")
    );
    assert_eq!(
        ann(&st, "ovn.kubernetes.io/mac_address"),
        Some("00:00:00:53:6b:01")
    );
    let pooled = annotated(&env, "default", "pooled").await;
    assert_eq!(ann(&pooled, "ovn.kubernetes.io/logical_switch"), Some("s1"));
    assert_eq!(
        ann(&pooled, "ovn.kubernetes.io/ip_address"),
        Some("10.66.0.200")
    );
    let listed = annotated(&env, "default", "listed").await;
    assert_eq!(
        ann(&listed, "ovn.kubernetes.io/ip_address"),
        Some("10.66.0.50")
    );

    // NB rows as Kube-OVN writes them.
    let b_ip = ann(&b, "ovn.kubernetes.io/ip_address").unwrap().to_owned();
    let b_mac = ann(&b, "ovn.kubernetes.io/mac_address").unwrap().to_owned();
    assert_eq!(
        lsp_addresses(&env, "b.default").await,
        format!("{b_mac} {b_ip}")
    );
    assert_eq!(env.nbctl(&["lsp-get-port-security", "b.default"]).await, "");
    assert_eq!(
        env.nbctl(&["lsp-get-port-security", "static.default"])
            .await,
        "00:00:00:53:6b:01 10.16.0.100"
    );
    assert!(env.nbctl(&["lsp-get-ls", "a.ns1"]).await.ends_with("(s1)"));
    let ext = env
        .nbctl(&["get", "logical_switch_port", "b.default", "external_ids"])
        .await;
    assert!(
        ext.contains("ls=ovn-default")
            && ext.contains("pod=\"default/b\"")
            && ext.contains("vendor=kube-ovn"),
        "{ext}"
    );
    let pg = env
        .nbctl(&[
            "--bare",
            "--columns=ports",
            "find",
            "port_group",
            "name=node.n1",
        ])
        .await;
    let pg_b = env
        .nbctl(&[
            "--bare",
            "--columns=_uuid",
            "find",
            "logical_switch_port",
            "name=b.default",
        ])
        .await;
    assert!(pg.contains(&pg_b), "b.default not in node.n1: {pg}");
    let pg = env
        .nbctl(&[
            "--bare",
            "--columns=ports",
            "find",
            "port_group",
            "name=ovn.default.n1",
        ])
        .await;
    assert!(pg.contains(&pg_b), "b.default not in ovn.default.n1: {pg}");

    // IP records.
    let ipr = env
        .get_json(&["ips.kubeovn.io", "b.default"])
        .await
        .unwrap();
    assert_eq!(ipr["spec"]["podName"], "b");
    assert_eq!(ipr["spec"]["namespace"], "default");
    assert_eq!(ipr["spec"]["subnet"], "ovn-default");
    assert_eq!(ipr["spec"]["nodeName"], "n1");
    assert_eq!(ipr["spec"]["ipAddress"], b_ip.as_str());
    assert_eq!(ipr["spec"]["v4IpAddress"], b_ip.as_str());
    assert_eq!(ipr["spec"]["macAddress"], b_mac.as_str());
    assert_eq!(
        ipr["metadata"]["labels"]["ovn.kubernetes.io/subnet"],
        "ovn-default"
    );

    // Subnet status counters.
    wait_for("s1 status", 20, || async {
        let o = env.get_json(&["subnets.kubeovn.io", "s1"]).await?;
        (o.pointer("/status/v4usingIPs")?.as_f64()? == 3.0
            && o.pointer("/status/v4usingIPrange")?.as_str()?
                == "10.66.0.10,10.66.0.50,10.66.0.200")
            .then_some(())
    })
    .await;

    // Subnet update: a new excluded address reaches the switch, nothing allocated moves.
    env.kubectl(&[
        "patch",
        "subnets.kubeovn.io",
        "s1",
        "--type=merge",
        "-p",
        r#"{"spec":{"excludeIps":["10.66.0.2..10.66.0.9","10.66.0.100"]}}"#,
    ])
    .await;
    wait_for("s1 exclude_ips updated", 20, || async {
        let o = env
            .nbctl(&["get", "logical_switch", "s1", "other_config:exclude_ips"])
            .await;
        (o == "\"10.66.0.1 10.66.0.100 10.66.0.2..10.66.0.9\"").then_some(())
    })
    .await;
    let a2 = env.get_json(&["pod", "-n", "ns1", "a"]).await.unwrap();
    assert_eq!(ann(&a2, "ovn.kubernetes.io/ip_address"), Some("10.66.0.10"));

    // A custom VPC with its own router and subnet.
    env.apply(
        r#"{"apiVersion":"kubeovn.io/v1","kind":"Vpc","metadata":{"name":"vpc1"},"spec":{}}"#,
    )
    .await;
    env.apply(
        r#"{"apiVersion":"kubeovn.io/v1","kind":"Subnet","metadata":{"name":"s2"},
        "spec":{"cidrBlock":"10.77.0.0/24","vpc":"vpc1","protocol":"IPv4"}}"#,
    )
    .await;
    env.apply(&pod(
        "default",
        "in-vpc",
        "n1",
        &[("ovn.kubernetes.io/logical_switch", "s2")],
    ))
    .await;
    let v = annotated(&env, "default", "in-vpc").await;
    assert_eq!(ann(&v, "ovn.kubernetes.io/logical_router"), Some("vpc1"));
    assert_eq!(ann(&v, "ovn.kubernetes.io/gateway"), Some("10.77.0.1"));
    assert_eq!(
        env.nbctl(&["get", "logical_router_port", "vpc1-s2", "networks"])
            .await,
        "[\"10.77.0.1/24\"]"
    );
    wait_for("vpc statuses", 20, || async {
        let d = env.get_json(&["vpcs.kubeovn.io", "ovn-cluster"]).await?;
        let v = env.get_json(&["vpcs.kubeovn.io", "vpc1"]).await?;
        let subs = |o: &Value| {
            o.pointer("/status/subnets")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        (d.pointer("/status/default") == Some(&Value::Bool(true))
            && subs(&d).contains(&Value::from("ovn-default"))
            && subs(&v) == vec![Value::from("s2")])
        .then_some(())
    })
    .await;

    // Conflicts and bad annotations: Warning events, no crash, no address taken.
    env.apply(&pod(
        "default",
        "clash",
        "n1",
        &[("ovn.kubernetes.io/ip_address", "10.16.0.100")],
    ))
    .await;
    let note = warning_for(&env, "default", "clash", "AcquireAddressFailed").await;
    assert!(note.contains("10.16.0.100"), "{note}");
    env.apply(&pod(
        "default",
        "bad",
        "n1",
        &[("ovn.kubernetes.io/ip_address", "not-an-ip")],
    ))
    .await;
    let note = warning_for(&env, "default", "bad", "InvalidAnnotation").await;
    assert!(note.contains("ovn.kubernetes.io/ip_address"), "{note}");
    env.kubectl(&["delete", "pod", "-n", "default", "clash", "bad"])
        .await;

    // Kill the controller; delete a pod and add one while it is down.
    let before = pod_addresses(&env).await;
    env.kill_controller().await;
    env.kubectl(&["delete", "pod", "-n", "default", "b"]).await;
    env.apply(&pod("default", "late", "n1", &[])).await;
    env.start_controller(common::test_config()).await;
    let late = annotated(&env, "default", "late").await;
    let late_ip = ann(&late, "ovn.kubernetes.io/ip_address").unwrap();
    // The port and record of the pod deleted while down were removed at start, so its address may serve
    // the new pod: it is never in two places.
    let b_port = env
        .nbctl(&[
            "--bare",
            "--columns=name",
            "find",
            "logical_switch_port",
            "name=b.default",
        ])
        .await;
    assert!(b_port.is_empty(), "b.default left; late has {late_ip}");
    assert!(env
        .get_json(&["ips.kubeovn.io", "b.default"])
        .await
        .is_none());
    let after = pod_addresses(&env).await;
    for (k, v) in &before {
        if k != "default/b" {
            assert_eq!(
                after.get(k),
                Some(v),
                "{k} changed address across the restart"
            );
        }
    }

    // Delete everything: no kube-ovn port, group or policy of s1/n1 is left.
    env.kubectl(&["delete", "pods", "--all", "-n", "default"])
        .await;
    env.kubectl(&["delete", "pods", "--all", "-n", "ns1"]).await;
    env.kubectl(&["delete", "ippools.kubeovn.io", "pool1"])
        .await;
    env.kubectl(&["delete", "subnets.kubeovn.io", "s1", "s2"])
        .await;
    wait_for("s2 gone", 20, || async {
        let s = env
            .nbctl(&["--bare", "--columns=name", "list", "logical_switch"])
            .await;
        (!s.contains("s2")).then_some(())
    })
    .await;
    env.kubectl(&["delete", "vpcs.kubeovn.io", "vpc1"]).await;
    env.kubectl(&["delete", "node", "n1"]).await;
    wait_for("NB clean", 20, || async {
        let ports = env
            .nbctl(&[
                "--bare",
                "--columns=name",
                "find",
                "logical_switch_port",
                "external_ids:vendor=kube-ovn",
            ])
            .await;
        let mut names: Vec<&str> = ports.split_whitespace().collect();
        names.sort();
        let pgs = env
            .nbctl(&["--bare", "--columns=name", "list", "port_group"])
            .await;
        let pols = env.nbctl(&["lr-policy-list", "ovn-cluster"]).await;
        let switches = env
            .nbctl(&["--bare", "--columns=name", "list", "logical_switch"])
            .await;
        (names == ["join-ovn-cluster", "ovn-default-ovn-cluster"]
            && pgs.is_empty()
            && !pols.contains("10.66.0.0/24")
            && !pols.contains("172.18.0.2")
            && !pols.contains("n1")
            && !switches.contains("s1")
            && !switches.contains("s2"))
        .then_some(())
    })
    .await;
    wait_for("vpc1 router gone", 20, || async {
        let r = env
            .nbctl(&["--bare", "--columns=name", "list", "logical_router"])
            .await;
        (r == "ovn-cluster").then_some(())
    })
    .await;
    wait_for("IP records gone", 20, || async {
        let l = env.get_json(&["ips.kubeovn.io"]).await?;
        l["items"].as_array()?.is_empty().then_some(())
    })
    .await;
    env.kill_controller().await;
}

/// The binary itself: flags, kubeconfig, metrics endpoint; when another instance takes its lease it exits
/// with status 1, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_serves_pods_and_metrics() {
    let Some(env) = Env::start().await else {
        return;
    };
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_kube-ovn-controller"))
            .arg("--kubeconfig")
            .arg(&env.kubeconfig)
            .arg("--ovn-nb-addr")
            .arg(env.nb.unix_remote())
            .args([
                "--default-cidr",
                "10.17.0.0/16",
                "--node-switch-cidr",
                "100.65.0.0/16",
            ])
            .args([
                "--metrics-addr",
                &format!("127.0.0.1:{port}"),
                "--leader-elect",
            ])
            .args(["--lease-namespace", "default", "--pod-name", "ctl-0"])
            .stdin(std::process::Stdio::null())
            .stderr(std::fs::File::create(env.dir.path().join("ctl.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    env.apply(&pod("default", "p", "n9", &[])).await;
    let p = annotated(&env, "default", "p").await;
    assert_eq!(ann(&p, "ovn.kubernetes.io/cidr"), Some("10.17.0.0/16"));
    assert_eq!(ann(&p, "ovn.kubernetes.io/ip_address"), Some("10.17.0.2"));
    let lease = env
        .get_json(&["lease", "-n", "default", "kube-ovn-controller"])
        .await
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "ctl-0");
    let text = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.contains("kube_ovn_controller_pod_add_seconds_count 1"),
        "{text}"
    );
    assert!(
        text.contains("kube_ovn_controller_nb_transaction_seconds"),
        "{text}"
    );

    // Another instance takes the lease (as after a partition): this one stops, with a status that restarts
    // it and a message that says why.
    env.kubectl(&[
        "patch",
        "lease",
        "-n",
        "default",
        "kube-ovn-controller",
        "--type=merge",
        "-p",
        r#"{"spec":{"holderIdentity":"ctl-1"}}"#,
    ])
    .await;
    let status = wait_for("the controller to exit", 20, || {
        let s = child.0.try_wait().unwrap();
        async move { s }
    })
    .await;
    assert_eq!(status.code(), Some(1));
    let log = std::fs::read_to_string(env.dir.path().join("ctl.log")).unwrap();
    let last = log.lines().last().unwrap_or_default();
    assert_eq!(
        last,
        "kube-ovn-controller: leadership lost: lease default/kube-ovn-controller is no longer held by ctl-0"
    );
}

/// A child process killed (SIGKILL) when dropped, also when a test fails.
struct Killed(std::process::Child);

impl Killed {
    fn kill(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The controller binary on `env`, its stderr lines sent to the returned channel.
fn spawn_binary(env: &Env) -> (Killed, std::sync::mpsc::Receiver<String>) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kube-ovn-controller"))
        .arg("--kubeconfig")
        .arg(&env.kubeconfig)
        .arg("--ovn-nb-addr")
        .arg(env.nb.unix_remote())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    // Drained to the end, so the child never blocks on a full pipe.
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            eprintln!("controller: {line}");
            let _ = tx.send(line);
        }
    });
    (Killed(child), rx)
}

/// Waits for the binary's "controller started" log line.
async fn reported_started(rx: std::sync::mpsc::Receiver<String>) {
    tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = rx
                .recv_timeout(left)
                .expect("the controller did not report started");
            if line.contains("controller started") {
                return;
            }
        }
    })
    .await
    .unwrap();
}

/// `kubectl apply` of many pods at once (a v1 List).
async fn apply_pods(env: &Env, names: impl Iterator<Item = String>, anns: &[(&str, &str)]) {
    let items: Vec<Value> = names
        .map(|n| serde_json::from_str(&pod("default", &n, "n1", anns)).unwrap())
        .collect();
    env.apply(&serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string())
        .await;
}

/// The addresses of the default namespace's pods named `prefix<i>`, once all `n` of them are annotated.
async fn all_annotated(env: &Env, prefix: &str, n: usize) -> BTreeMap<String, String> {
    wait_for(&format!("{n} pods {prefix}* annotated"), 30, || async {
        let pods = env.get_json(&["pods", "-n", "default"]).await?;
        let got: BTreeMap<String, String> = pods["items"]
            .as_array()?
            .iter()
            .filter(|p| {
                p["metadata"]["name"].as_str().unwrap().starts_with(prefix)
                    && ann(p, "ovn.kubernetes.io/routed") == Some("true")
            })
            .filter_map(|p| {
                Some((
                    p["metadata"]["name"].as_str()?.to_owned(),
                    ann(p, "ovn.kubernetes.io/ip_address")?.to_owned(),
                ))
            })
            .collect();
        (got.len() == n).then_some(got)
    })
    .await
}

/// Issue #16, 4: the binary killed with SIGKILL; 15 pods deleted and 15 created while it is down; started
/// again with the same command line, it has removed the deleted pods' ports and IP records and freed their
/// addresses before it reports started. The subnet holds 20 addresses: the new pods fit only if the old
/// addresses are free (the periodic GC, 60 s by default, has not run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_releases_what_pods_deleted_while_down_left() {
    let Some(env) = Env::start().await else {
        return;
    };
    // .1 the gateway, .2 .. .21 free: 20 addresses.
    env.apply(
        r#"{"apiVersion":"kubeovn.io/v1","kind":"Subnet","metadata":{"name":"tight"},
        "spec":{"cidrBlock":"10.70.0.0/27","excludeIps":["10.70.0.22..10.70.0.30"],"protocol":"IPv4","provider":"ovn","vpc":"ovn-cluster"}}"#,
    )
    .await;
    let sw = [("ovn.kubernetes.io/logical_switch", "tight")];
    let (child, rx) = spawn_binary(&env);
    reported_started(rx).await;
    apply_pods(&env, (0..20).map(|i| format!("p{i}")), &sw).await;
    let before = all_annotated(&env, "p", 20).await;

    child.kill();
    let gone: Vec<String> = (0..15).map(|i| format!("p{i}")).collect();
    let mut args = vec!["delete", "pod", "-n", "default"];
    args.extend(gone.iter().map(String::as_str));
    env.kubectl(&args).await;
    apply_pods(&env, (0..15).map(|i| format!("q{i}")), &sw).await;

    let (child, rx) = spawn_binary(&env);
    reported_started(rx).await;
    // Checked once, right after the report: nothing of the deleted pods is left by then.
    let ports = env
        .nbctl(&[
            "--bare",
            "--columns=name",
            "find",
            "logical_switch_port",
            "external_ids:ls=tight",
        ])
        .await;
    let ports: HashSet<&str> = ports.split_whitespace().collect();
    let ips = env.get_json(&["ips.kubeovn.io"]).await.unwrap();
    let ips: HashSet<&str> = ips["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    for p in &gone {
        let port = format!("{p}.default");
        assert!(!ports.contains(port.as_str()), "port {port} left at start");
        assert!(
            !ips.contains(port.as_str()),
            "IP record {port} left at start"
        );
    }
    for i in 15..20 {
        let port = format!("p{i}.default");
        assert!(
            ports.contains(port.as_str()) && ips.contains(port.as_str()),
            "{port} removed"
        );
    }

    let new = all_annotated(&env, "q", 15).await;
    let after = all_annotated(&env, "p", 5).await;
    for (k, v) in &after {
        assert_eq!(
            before.get(k),
            Some(v),
            "{k} changed address across the restart"
        );
    }
    let mut all: Vec<&String> = new.values().chain(after.values()).collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 20, "an address used twice: {new:?} {after:?}");
    child.kill();
}

/// The garbage collector's runs that succeeded and failed so far (the controller's
/// `reconcile_seconds{kind="gc"}` counts; its first run, at start, only marks).
fn gc_passes(env: &Env) -> (u64, u64) {
    let text = env.controller.as_ref().unwrap().metrics.encode();
    let count = |outcome: &str| {
        let line = format!(
            "kube_ovn_controller_reconcile_seconds_count{{kind=\"gc\",outcome=\"{outcome}\"}} "
        );
        text.lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .map_or(0, |n| n.trim().parse().unwrap())
    };
    (count("ok"), count("error"))
}

/// Issue #16, 5: a user's IP record (no pod), made before the controller starts or while it runs, survives
/// garbage collection and its address is never given to a pod; a pod that finds its subnet full waits (with
/// an event) and is served as soon as an address is released, well before its backoff would retry it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_are_kept_and_a_full_subnet_serves_waiting_pods() {
    let Some(mut env) = Env::start().await else {
        return;
    };
    // .2 .. .5 free, .3 and .5 reserved by a user (no labels, as Kube-OVN's docs write one; .3 naming the
    // pod w1, which has an address of its own; .5 without a MAC, made while the controller runs).
    env.apply(
        r#"{"apiVersion":"kubeovn.io/v1","kind":"Subnet","metadata":{"name":"small"},
        "spec":{"cidrBlock":"10.71.0.0/29","excludeIps":["10.71.0.6"],"protocol":"IPv4","provider":"ovn","vpc":"ovn-cluster"}}"#,
    )
    .await;
    env.apply(
        r#"{"apiVersion":"kubeovn.io/v1","kind":"IP","metadata":{"name":"reserve-1"},
        "spec":{"subnet":"small","namespace":"default","podName":"w1","ipAddress":"10.71.0.3","v4IpAddress":"10.71.0.3","macAddress":"00:00:00:71:00:03"}}"#,
    )
    .await;
    // A reservation of a subnet made only after the controller started: taken when the subnet loads.
    env.apply(
        r#"{"apiVersion":"kubeovn.io/v1","kind":"IP","metadata":{"name":"reserve-later"},
        "spec":{"subnet":"later","ipAddress":"10.72.0.2"}}"#,
    )
    .await;
    env.start_controller(common::test_config()).await;
    // One reservation made while the controller runs: reserved as soon as it is seen.
    env.apply(
        r#"{"apiVersion":"kubeovn.io/v1","kind":"IP","metadata":{"name":"reserve-2"},
        "spec":{"subnet":"small","ipAddress":"10.71.0.5"}}"#,
    )
    .await;
    wait_for(
        "both reservations counted in the subnet's status",
        20,
        || async {
            let o = env.get_json(&["subnets.kubeovn.io", "small"]).await?;
            (o.pointer("/status/v4usingIPs")?.as_f64()? == 2.0).then_some(())
        },
    )
    .await;
    // The subnet and a pod waiting for it: the first free address is reserved, the pod gets the next.
    env.apply(&pod(
        "default",
        "l1",
        "n1",
        &[("ovn.kubernetes.io/logical_switch", "later")],
    ))
    .await;
    env.apply(
        r#"{"apiVersion":"kubeovn.io/v1","kind":"Subnet","metadata":{"name":"later"},
        "spec":{"cidrBlock":"10.72.0.0/29","protocol":"IPv4","provider":"ovn","vpc":"ovn-cluster"}}"#,
    )
    .await;
    let l1 = annotated(&env, "default", "l1").await;
    assert_eq!(
        ann(&l1, "ovn.kubernetes.io/ip_address"),
        Some("10.72.0.3"),
        "a pod got the address reserved before its subnet existed"
    );
    let sw = [("ovn.kubernetes.io/logical_switch", "small")];
    env.apply(&pod("default", "w1", "n1", &sw)).await;
    env.apply(&pod("default", "w2", "n1", &sw)).await;
    let w1 = annotated(&env, "default", "w1").await;
    let w2 = annotated(&env, "default", "w2").await;
    let w1_ip = ann(&w1, "ovn.kubernetes.io/ip_address").unwrap().to_owned();
    let w2_ip = ann(&w2, "ovn.kubernetes.io/ip_address").unwrap().to_owned();
    assert_eq!([w1_ip.as_str(), w2_ip.as_str()], ["10.71.0.2", "10.71.0.4"]);

    // Full: w3 waits, with an event.
    env.apply(&pod("default", "w3", "n1", &sw)).await;
    let note = warning_for(&env, "default", "w3", "AcquireAddressFailed").await;
    assert!(note.contains("small"), "{note}");
    // Three garbage collection passes that succeeded after both reservations and w3's failure were seen
    // (an orphan goes in two), counted by the controller's own metric of GC runs; w3's retry backoff grows
    // meanwhile.
    let passes = gc_passes(&env);
    let (ok, failed) = wait_for("three more garbage collection passes", 20, || async {
        let now = gc_passes(&env);
        (now.0 >= passes.0 + 3).then_some(now)
    })
    .await;
    assert_eq!(failed, passes.1, "a garbage collection pass failed");
    assert!(ok >= 4, "the first run only marks: {ok}");
    for r in ["reserve-1", "reserve-2"] {
        assert!(
            env.get_json(&["ips.kubeovn.io", r]).await.is_some(),
            "the reservation {r} was garbage collected"
        );
    }
    let w3 = env.get_json(&["pod", "-n", "default", "w3"]).await.unwrap();
    assert_eq!(
        ann(&w3, "ovn.kubernetes.io/ip_address"),
        None,
        "w3 got a reserved address"
    );

    let t = std::time::Instant::now();
    env.kubectl(&["delete", "pod", "-n", "default", "w1"]).await;
    let w3 = annotated(&env, "default", "w3").await;
    let waited = t.elapsed();
    assert_eq!(
        ann(&w3, "ovn.kubernetes.io/ip_address"),
        Some(w1_ip.as_str())
    );
    // Its backoff (5 ms doubling) would retry it about as long after its last try as it has waited.
    assert!(
        waited < std::time::Duration::from_millis(1500),
        "w3 served {waited:?} after the release"
    );
    for r in ["reserve-1", "reserve-2"] {
        assert!(env.get_json(&["ips.kubeovn.io", r]).await.is_some());
    }
    // w1 gone, its reservation (.3) stays reserved: w4 waits. A reservation deleted frees its address for
    // the pod waiting.
    env.apply(&pod("default", "w4", "n1", &sw)).await;
    warning_for(&env, "default", "w4", "AcquireAddressFailed").await;
    let w4 = env.get_json(&["pod", "-n", "default", "w4"]).await.unwrap();
    assert_eq!(
        ann(&w4, "ovn.kubernetes.io/ip_address"),
        None,
        "w4 got the address reserved for the deleted pod w1"
    );
    env.kubectl(&["delete", "ips.kubeovn.io", "reserve-2"])
        .await;
    let w4 = annotated(&env, "default", "w4").await;
    assert_eq!(ann(&w4, "ovn.kubernetes.io/ip_address"), Some("10.71.0.5"));
    env.kill_controller().await;
}
