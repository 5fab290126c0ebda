//! NB and SB as 3-member raft clusters (`up --raft`, root): while pods are created one after another, the NB
//! leader and then the SB leader are killed (`kill-leader`, SIGKILL); every pod is served, no address is
//! given twice, each pod has exactly one switch port, and the next pod after each kill is served within 5 s.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

#[test]
fn pods_are_served_while_raft_leaders_are_killed() {
    if !common::runnable() {
        return;
    }
    let (sb, out) = common::up(
        "rf",
        &[
            "--raft",
            "--no-demo",
            "--default-cidr",
            "10.240.0.0/16",
            "--join-cidr",
            "100.92.0.0/16",
        ],
    );
    assert!(
        out.status.success(),
        "up --raft: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let nb = format!(
        "--db={}",
        (0..3)
            .map(|i| {
                let stem = if i == 0 {
                    "nb".to_owned()
                } else {
                    format!("nb{i}")
                };
                format!("unix:{}/ovn/{stem}.sock", sb.dir.path().display())
            })
            .collect::<Vec<_>>()
            .join(",")
    );
    let bin = env!("CARGO_BIN_EXE_kube-ovn-sandbox");
    let pod = |i: usize| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("p{i}"), "namespace": "default"},
               "spec": {"containers": [{"name": "c", "image": "any", "command": [bin, "serve-name", "80"]}]}})
    };
    let running = |name: &str| {
        sb.pods().iter().any(|p| {
            p["metadata"]["name"] == name
                && p["status"]["phase"] == "Running"
                && p["status"]["podIP"].is_string()
        })
    };
    // Pods one after another; after pod 3 the NB leader is killed, after pod 6 the SB leader: the pod created
    // right after each kill must run within 5 s of the kill.
    let total = 9;
    let mut after_kill = Vec::new();
    for i in 0..total {
        let killed = match i {
            3 | 6 => {
                let db = if i == 3 { "nb" } else { "sb" };
                let t = Instant::now();
                let out = sb.run(&["kill-leader", db]);
                assert!(out.status.success(), "kill-leader {db}: {out:?}");
                Some((db, t))
            }
            _ => None,
        };
        sb.apply(&pod(i));
        let name = format!("p{i}");
        common::wait_until(&format!("{name} running"), Duration::from_secs(30), || {
            running(&name)
        });
        if let Some((db, t)) = killed {
            let took = t.elapsed();
            eprintln!("{db} leader killed: the next pod ran {took:?} later");
            after_kill.push((db, took));
        }
    }
    for (db, took) in &after_kill {
        assert!(
            *took < Duration::from_secs(5),
            "after the {db} leader's kill the next pod took {took:?}"
        );
    }
    // No address twice; each pod one switch port, holding its own address.
    let pods = sb.pods();
    let mut ips: BTreeMap<String, String> = BTreeMap::new();
    for p in &pods {
        let ip = p["status"]["podIP"].as_str().unwrap().to_owned();
        let name = p["metadata"]["name"].as_str().unwrap().to_owned();
        assert!(
            ips.insert(ip.clone(), name.clone()).is_none(),
            "{ip} given twice: {name} and {}",
            ips[&ip]
        );
    }
    assert_eq!(ips.len(), total);
    let ports = Command::new("ovn-nbctl")
        .arg(&nb)
        .args([
            "--bare",
            "--columns=name,addresses",
            "find",
            "Logical_Switch_Port",
        ])
        .arg("external_ids:pod!=\"\"")
        .output()
        .unwrap();
    assert!(ports.status.success(), "ovn-nbctl: {ports:?}");
    let text = String::from_utf8_lossy(&ports.stdout).into_owned();
    for i in 0..total {
        let port = format!("p{i}.default");
        let n = text.lines().filter(|l| l.trim() == port).count();
        assert_eq!(n, 1, "{port} appears {n} times in NB:\n{text}");
    }
    for ip in ips.keys() {
        assert_eq!(
            text.matches(&format!(" {ip}")).count(),
            1,
            "{ip} on more than one port:\n{text}"
        );
    }
    // Both clusters whole again: three members each, one leader.
    for db in ["nb", "sb"] {
        let name = if db == "nb" {
            "OVN_Northbound"
        } else {
            "OVN_Southbound"
        };
        let status = Command::new("ovs-appctl")
            .arg("-t")
            .arg(sb.dir.path().join(format!("ovn/{db}.ctl")))
            .args(["cluster/status", name])
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&status.stdout);
        assert!(s.contains("Status: cluster member"), "{db}: {s}");
    }
}
