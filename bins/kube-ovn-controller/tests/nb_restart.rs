//! The controller binary's northbound connection survives the northbound going away: the NB ovsdb-server is
//! killed with SIGKILL and started again on the same database and socket; pods created while it was down and
//! after it is back are served within 5 s of its return, each with exactly one logical switch port. With a
//! three-member raft northbound, the leader is killed: pods and a node created during the failover are served
//! through the new leader, with no row written twice.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{pod, wait_for, Env};
use serde_json::Value;

fn ann<'a>(o: &'a Value, k: &str) -> Option<&'a str> {
    o.pointer("/metadata/annotations")?.get(k)?.as_str()
}

/// Runs the controller as the binary does (`kube_ovn_controller::run` with parsed flags) until the returned
/// sender is dropped; its metrics on `127.0.0.1:metrics_port`.
fn run_binary_controller(
    env: &Env,
    nb_addr: &str,
    metrics_port: u16,
) -> tokio::sync::oneshot::Sender<()> {
    let metrics = format!("127.0.0.1:{metrics_port}");
    let args = kube_ovn_controller::Args::parse([
        "--kubeconfig",
        env.kubeconfig.to_str().unwrap(),
        "--ovn-nb-addr",
        nb_addr,
        "--gc-interval",
        "1",
        "--metrics-addr",
        &metrics,
    ])
    .unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let r = kube_ovn_controller::run(args, async {
            let _ = rx.await;
        })
        .await;
        if let Err(e) = r {
            eprintln!("controller stopped: {e}");
        }
    });
    tx
}

/// A free TCP port on 127.0.0.1 (for the metrics endpoint).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The pod handler's failures so far, from the controller's metrics endpoint (None while it is not up).
async fn pod_handler_errors(port: u16) -> Option<u64> {
    let text = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    })
    .await
    .unwrap()?;
    let n = text.lines().find_map(|l| {
        l.strip_prefix("kube_ovn_controller_handler_errors_total{kind=\"pod\"} ")
            .map(|n| n.trim().parse().unwrap())
    });
    Some(n.unwrap_or(0))
}

/// Waits until pod `ns/name` is annotated and its port is in NB with the annotated addresses; returns
/// when that was seen.
async fn served(env: &Env, ns: &str, name: &str, secs: u64) -> Instant {
    let p = wait_for(&format!("pod {ns}/{name} served"), secs, || async {
        let p = env.get_json(&["pod", "-n", ns, name]).await?;
        (ann(&p, "ovn.kubernetes.io/allocated") == Some("true")
            && ann(&p, "ovn.kubernetes.io/routed") == Some("true"))
        .then_some(p)
    })
    .await;
    let (ip, mac) = (
        ann(&p, "ovn.kubernetes.io/ip_address").unwrap(),
        ann(&p, "ovn.kubernetes.io/mac_address").unwrap(),
    );
    let port = format!("{name}.{ns}");
    assert_eq!(
        env.nbctl(&["lsp-get-addresses", &port]).await,
        format!("{mac} {ip}")
    );
    Instant::now()
}

/// Every logical switch port name, checking that none appears twice.
async fn port_names(env: &Env) -> BTreeSet<String> {
    let out = env
        .nbctl(&["--bare", "--columns=name", "list", "logical_switch_port"])
        .await;
    let mut names = BTreeSet::new();
    for n in out.split_whitespace() {
        assert!(names.insert(n.to_owned()), "port {n} exists twice");
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_served_after_a_northbound_kill_and_restart() {
    let Some(mut env) = Env::start().await else {
        return;
    };
    let port = free_port();
    let _stop = run_binary_controller(&env, &env.nb.unix_remote(), port);
    env.apply(&pod("default", "before", "n1", &[])).await;
    served(&env, "default", "before", 30).await;
    let failed_before = pod_handler_errors(port).await.expect("metrics endpoint");

    let pid = env.nb.pid();
    env.nb.kill9();
    eprintln!("killed NB ovsdb-server pid {pid}");
    for i in 0..3 {
        env.apply(&pod("default", &format!("down{i}"), "n1", &[]))
            .await;
    }
    // A commit waits for the replica up to 10 s: the handlers of the three pods fail (the controller's own
    // count of pod handler failures says so) and are retried, and the session backs off meanwhile.
    let failed = wait_for("the pods' handlers failing without NB", 60, || async {
        let n = pod_handler_errors(port).await?;
        (n >= failed_before + 3).then_some(n)
    })
    .await;
    eprintln!(
        "pod handler failures without NB: {}",
        failed - failed_before
    );
    let p = env
        .get_json(&["pod", "-n", "default", "down0"])
        .await
        .unwrap();
    assert_eq!(
        ann(&p, "ovn.kubernetes.io/routed"),
        None,
        "served without NB"
    );

    env.nb.restart();
    let back = Instant::now();
    for i in 0..3 {
        let t = served(&env, "default", &format!("down{i}"), 5).await;
        eprintln!("down{i} served {:?} after NB came back", t - back);
        assert!(t - back < Duration::from_secs(5), "{:?}", t - back);
    }
    env.apply(&pod("default", "after", "n1", &[])).await;
    let t = served(&env, "default", "after", 5).await;
    eprintln!("after served {:?} after NB came back", t - back);

    let names = port_names(&env).await;
    for p in ["before", "down0", "down1", "down2", "after"] {
        assert!(names.contains(&format!("{p}.default")), "{p}: {names:?}");
    }
}

/// Every line of `out` once (a row written twice shows up as a repeated line).
fn assert_unique_lines(what: &str, out: &str) {
    let mut seen = BTreeSet::new();
    for l in out.lines().map(str::trim).filter(|l| !l.is_empty()) {
        assert!(seen.insert(l), "{what}: {l:?} twice in\n{out}");
    }
}

/// Waits until pod `ns/name` is annotated and the cluster has its port with the annotated addresses.
async fn served_by_cluster(env: &Env, cl: &common::ovn::Cluster, ns: &str, name: &str, secs: u64) {
    let p = wait_for(&format!("pod {ns}/{name} served"), secs, || async {
        let p = env.get_json(&["pod", "-n", ns, name]).await?;
        (ann(&p, "ovn.kubernetes.io/routed") == Some("true")).then_some(p)
    })
    .await;
    let want = format!(
        "{} {}",
        ann(&p, "ovn.kubernetes.io/mac_address").unwrap(),
        ann(&p, "ovn.kubernetes.io/ip_address").unwrap()
    );
    let got = cl.ctl("ovn-nbctl", &["lsp-get-addresses", &format!("{name}.{ns}")]);
    assert_eq!(got.trim(), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_served_across_a_raft_leader_kill() {
    let schema = common::nb_schema();
    let Some(mut cl) = common::ovn::Cluster::start(schema.to_str().unwrap(), 3) else {
        return;
    };
    let Some(env) = Env::start().await else {
        return;
    };
    let _stop = run_binary_controller(&env, &cl.remotes(), free_port());
    env.apply(&pod("default", "before", "n1", &[])).await;
    served_by_cluster(&env, &cl, "default", "before", 30).await;

    let leader = cl.leader();
    let pid = cl.pid(leader);
    cl.kill9(leader);
    let killed = Instant::now();
    eprintln!("killed raft leader s{leader} (pid {pid})");
    // Written during the failover: pods (ports, port group members) and a node (its port and a router
    // policy, a table without a unique index where a retried insert would show twice).
    for i in 0..3 {
        env.apply(&pod("default", &format!("fo{i}"), "n1", &[]))
            .await;
    }
    env.apply(
        r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n2"},
        "status":{"addresses":[{"type":"InternalIP","address":"172.18.0.3"}]}}"#,
    )
    .await;
    for i in 0..3 {
        served_by_cluster(&env, &cl, "default", &format!("fo{i}"), 30).await;
    }
    eprintln!(
        "pods served {:?} after the leader was killed",
        killed.elapsed()
    );
    wait_for("node n2 policy", 30, || async {
        let p = cl.ctl("ovn-nbctl", &["lr-policy-list", "ovn-cluster"]);
        p.contains("ip4.dst == 172.18.0.3").then_some(())
    })
    .await;
    let new_leader = cl.leader();
    assert_ne!(new_leader, leader);

    // The old leader rejoins as a follower; writes still reach the leader.
    cl.restart(leader);
    env.apply(&pod("default", "after", "n1", &[])).await;
    served_by_cluster(&env, &cl, "default", "after", 10).await;

    let names = cl.ctl(
        "ovn-nbctl",
        &["--bare", "--columns=name", "list", "logical_switch_port"],
    );
    assert_unique_lines(
        "ports",
        &names.split_whitespace().collect::<Vec<_>>().join("\n"),
    );
    for p in ["before", "fo0", "fo1", "fo2", "after"] {
        assert!(names.contains(&format!("{p}.default")), "{p}: {names}");
    }
    assert_unique_lines(
        "router policies",
        &cl.ctl("ovn-nbctl", &["lr-policy-list", "ovn-cluster"]),
    );
    assert_unique_lines(
        "static routes",
        &cl.ctl("ovn-nbctl", &["lr-route-list", "ovn-cluster"]),
    );
}
