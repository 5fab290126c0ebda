//! A cluster of three nodes on one machine (`up --nodes 3`, root): pods on every node reach each other over
//! TCP, UDP and ICMP through the Geneve tunnels, within a subnet and across two; every node reaches every
//! pod; pods of a subnet with `natOutgoing` reach the external network as their node's address, the others
//! not at all; a centralized subnet's egress leaves through its gateway node and, within 5 s of that node
//! stopping, through the next; the scheduler honours `nodeName`, `nodeSelector` and load; a stopped and
//! deleted node takes its join port and chassis with it and leaves the others talking; `down` leaves no
//! namespace or link behind. Services across nodes: one EndpointSlice controller for the cluster keeps one
//! slice per family holding each backend (one per node) once; every node and every pod reach every backend
//! through the ClusterIP over TCP and UDP; a deleted backend leaves the slice and the traffic.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

fn ping(from: &Path, ip: IpAddr) -> bool {
    Command::new("nsenter")
        .arg(format!("--net={}", from.display()))
        .args(["ping", "-c1", "-W2", &ip.to_string()])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// TCP, UDP and ICMP from `from` to the name server of `name` at `ip`: what failed.
fn reach(from: &Path, name: &str, ip: IpAddr) -> Vec<String> {
    let mut bad = Vec::new();
    for udp in [false, true] {
        let got = kubeovn_sandbox::transport::ask_name(
            from,
            SocketAddr::new(ip, 80),
            udp,
            Duration::from_secs(2),
        );
        // A pod's name answers: the right pod, not just any listener.
        if got.as_deref() != Ok(name) {
            bad.push(format!("{} {got:?}", if udp { "udp" } else { "tcp" }));
        }
    }
    if !ping(from, ip) {
        bad.push("icmp".into());
    }
    bad
}

/// The Service `default/spread` of this test's backends (one per node).
const SPREAD: &str = "spread";

/// One endpoint of a slice: its pod, node and whether it is ready.
type SliceEndpoint = (String, String, bool);

/// The EndpointSlices of Service `default/name`: per address type, each slice's endpoints.
fn slices_of(sb: &common::Sandbox, name: &str) -> BTreeMap<String, Vec<Vec<SliceEndpoint>>> {
    let label = format!("kubernetes.io/service-name={name}");
    let out = sb.kubectl(&[
        "get",
        "endpointslices",
        "-n",
        "default",
        "-l",
        &label,
        "-o",
        "json",
    ]);
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut by_family: BTreeMap<String, Vec<Vec<SliceEndpoint>>> = BTreeMap::new();
    for slice in v["items"].as_array().unwrap() {
        let eps = slice["endpoints"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|e| {
                (
                    e["targetRef"]["name"].as_str().unwrap_or("?").to_owned(),
                    e["nodeName"].as_str().unwrap_or("?").to_owned(),
                    e["conditions"]["ready"].as_bool().unwrap_or(false),
                )
            })
            .collect();
        by_family
            .entry(slice["addressType"].as_str().unwrap().to_owned())
            .or_default()
            .push(eps);
    }
    by_family
}

/// The processes named `name` in the state directory of every node.
fn processes_named(sb: &common::Sandbox, name: &str) -> usize {
    let dir = kubeovn_sandbox::state::StateDir::new(sb.dir.path());
    std::iter::once(dir.clone())
        .chain(dir.node_dirs())
        .flat_map(|d| {
            kubeovn_sandbox::state::read_json::<Vec<kubeovn_sandbox::procs::ProcRecord>>(
                &d.pids_file(),
            )
            .unwrap_or_default()
        })
        .filter(|p| p.name == name)
        .count()
}

/// Services across nodes: a Service whose backends run on all three nodes has exactly one EndpointSlice per
/// family (the cluster's one controller; three would race) holding each backend once; every node and a pod on
/// every node reach every backend through the ClusterIP over TCP and UDP; a deleted backend leaves the slice
/// and gets no more traffic.
fn services_across_nodes(
    sb: &common::Sandbox,
    node: &dyn Fn(usize) -> String,
    pod: &dyn Fn(&str, &str, Value) -> Value,
    sources: &[(String, PathBuf)],
) {
    assert_eq!(
        processes_named(sb, kubeovn_sandbox::sandbox::ENDPOINTS_PROCESS),
        1,
        "one EndpointSlice controller for the cluster"
    );
    let backend = |k: usize| {
        let mut p = pod("default", &format!("s{k}"), json!({"nodeName": node(k)}));
        p["metadata"]["labels"] = json!({"app": SPREAD});
        p
    };
    sb.apply(&json!({"apiVersion": "v1", "kind": "List", "items": [
        backend(1), backend(2), backend(3),
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SPREAD, "namespace": "default"},
         "spec": {"selector": {"app": SPREAD}, "ports": [
             {"name": "tcp", "protocol": "TCP", "port": 80, "targetPort": 80},
             {"name": "udp", "protocol": "UDP", "port": 80, "targetPort": 80}]}},
    ]}));
    let expect = |ks: &[usize]| -> Vec<SliceEndpoint> {
        ks.iter()
            .map(|&k| (format!("s{k}"), node(k), true))
            .collect()
    };
    let settled = |ks: &[usize]| {
        let slices = slices_of(sb, SPREAD);
        let one = slices.len() == 1 && slices.get("IPv4").is_some_and(|v| v.len() == 1);
        let mut eps = slices
            .get("IPv4")
            .and_then(|v| v.first())
            .cloned()
            .unwrap_or_default();
        eps.sort();
        (one && eps == expect(ks), slices)
    };
    common::wait_until(
        "one slice with the three backends ready",
        Duration::from_secs(60),
        || settled(&[1, 2, 3]).0,
    );
    let out = sb.kubectl(&["get", "service", SPREAD, "-o", "jsonpath={.spec.clusterIP}"]);
    let vip: IpAddr = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let vip = SocketAddr::new(vip, 80);

    // From every source, over TCP and UDP: asks (each from a port of its own, a new 5-tuple) until every
    // backend in `want` answered; any other answer, or a failure once the first answer came, is an error.
    let spread = |want: &[usize], base_port: u16| -> Vec<String> {
        let want: BTreeSet<String> = want.iter().map(|k| format!("s{k}")).collect();
        std::thread::scope(|s| {
            let jobs: Vec<_> = sources
                .iter()
                .flat_map(|src| [false, true].map(|udp| (src, udp)))
                .map(|((who, netns), udp)| {
                    let want = want.clone();
                    s.spawn(move || {
                        let proto = if udp { "udp" } else { "tcp" };
                        let mut seen = BTreeSet::new();
                        let mut bad = Vec::new();
                        for i in 0..60u16 {
                            let port = base_port + i + if udp { 100 } else { 0 };
                            match kubeovn_sandbox::transport::ask_name_from(
                                netns,
                                vip,
                                udp,
                                Duration::from_secs(2),
                                port,
                            ) {
                                Ok(name) if want.contains(&name) => {
                                    seen.insert(name);
                                }
                                other => bad.push(format!("{who} {proto} to {vip}: {other:?}")),
                            }
                            if seen == want {
                                break;
                            }
                        }
                        if seen != want {
                            bad.push(format!("{who} {proto}: saw {seen:?} of {want:?}"));
                        }
                        bad
                    })
                })
                .collect();
            jobs.into_iter().flat_map(|j| j.join().unwrap()).collect()
        })
    };
    // The load balancer is written once the slice is: the first answers may still be refused.
    common::wait_until(
        "the ClusterIP answering node 1",
        Duration::from_secs(20),
        || {
            kubeovn_sandbox::transport::ask_name(&sources[0].1, vip, false, Duration::from_secs(1))
                .is_ok()
        },
    );
    let bad = spread(&[1, 2, 3], 41000);
    assert!(
        bad.is_empty(),
        "{} failures:\n{}",
        bad.len(),
        bad.join("\n")
    );

    // s3 deleted: it leaves the slice (the same one slice), and nothing reaches it any more.
    let out = sb.kubectl(&["delete", "pod", "s3", "--wait=false"]);
    assert!(out.status.success(), "{out:?}");
    common::wait_until("s3 out of the slice", Duration::from_secs(30), || {
        settled(&[1, 2]).0
    });
    // The load balancer follows the slice: wait until node 1 no longer meets s3, then check everyone.
    common::wait_until(
        "s3 out of the load balancer",
        Duration::from_secs(10),
        || {
            (0..10u16).all(|i| {
                kubeovn_sandbox::transport::ask_name_from(
                    &sources[0].1,
                    vip,
                    false,
                    Duration::from_secs(1),
                    42000 + i,
                )
                .is_ok_and(|n| n != "s3")
            })
        },
    );
    let bad = spread(&[1, 2], 43000);
    assert!(
        bad.is_empty(),
        "after s3 was deleted, {} failures:\n{}",
        bad.len(),
        bad.join("\n")
    );
    let (_, slices) = settled(&[1, 2]);
    eprintln!(
        "Services across nodes: {vip} reached from {} sources; slices {slices:?}",
        sources.len()
    );
    let out = sb.kubectl(&["delete", "service", SPREAD]);
    assert!(out.status.success(), "{out:?}");
    common::wait_until("the Service's slices gone", Duration::from_secs(30), || {
        slices_of(sb, SPREAD).is_empty()
    });
}

#[test]
fn three_nodes_carry_pod_traffic_over_geneve() {
    if !common::runnable() {
        return;
    }
    let (sb, out) = common::up(
        "cl",
        &[
            "--nodes",
            "3",
            "--no-demo",
            "--default-cidr",
            "10.245.0.0/16",
            "--join-cidr",
            "100.94.0.0/16",
        ],
    );
    assert!(
        out.status.success(),
        "up --nodes 3: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let node = |k: usize| {
        if k == 1 {
            sb.prefix.clone()
        } else {
            format!("{}{k}", sb.prefix)
        }
    };

    // Three Ready nodes, each with its underlay address, and three chassis tunnelling between them.
    let nodes = sb.kubectl(&["get", "nodes", "-o", "json"]);
    let nodes: Value = serde_json::from_slice(&nodes.stdout).unwrap();
    let mut seen: Vec<(String, String)> = nodes["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let ip = n["status"]["addresses"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["type"] == "InternalIP")
                .map(|a| a["address"].as_str().unwrap().to_owned())
                .unwrap();
            (n["metadata"]["name"].as_str().unwrap().to_owned(), ip)
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        (1..=3)
            .map(|k| (node(k), format!("198.18.0.{k}")))
            .collect::<Vec<_>>()
    );
    let sbctl = Command::new("ovn-sbctl")
        .arg(format!("--db=unix:{}/ovn/sb.sock", sb.dir.path().display()))
        .args(["--bare", "--columns=ip", "list", "Encap"])
        .output()
        .unwrap();
    let mut encaps: Vec<String> = String::from_utf8_lossy(&sbctl.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    encaps.sort();
    assert_eq!(encaps, ["198.18.0.1", "198.18.0.2", "198.18.0.3"]);

    // A second subnet; pods pinned by nodeName, by nodeSelector, and left to the scheduler.
    let bin = env!("CARGO_BIN_EXE_kube-ovn-sandbox");
    let pod = |ns: &str, name: &str, placement: Value| {
        let mut spec = json!({"containers": [{"name": "serve", "image": "any",
            "command": [bin, "serve-name", "80"],
            "readinessProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 1}}]});
        spec.as_object_mut()
            .unwrap()
            .extend(placement.as_object().unwrap().clone());
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": spec})
    };
    sb.apply(&json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "blue"}},
        {"apiVersion": "kubeovn.io/v1", "kind": "Subnet", "metadata": {"name": "blue"},
         "spec": {"cidrBlock": "10.246.0.0/24", "namespaces": ["blue"]}},
    ]}));
    sb.apply(&json!({"apiVersion": "v1", "kind": "List", "items": [
        pod("default", "a1", json!({"nodeName": node(1)})),
        pod("default", "a2", json!({"nodeName": node(2)})),
        pod("default", "a3", json!({"nodeSelector": {"kubernetes.io/hostname": node(3)}})),
        pod("blue", "b1", json!({"nodeName": node(2)})),
        pod("blue", "b2", json!({"nodeName": node(3)})),
    ]}));
    common::wait_until("the pinned pods ready", Duration::from_secs(90), || {
        let p = sb.pods();
        p.len() == 5 && p.iter().all(common::ready)
    });
    // Node 1 runs one pod, the others two each: the scheduler puts the next one on node 1.
    sb.apply(&pod("blue", "b3", json!({})));
    common::wait_until("every pod ready", Duration::from_secs(90), || {
        let p = sb.pods();
        p.len() == 6 && p.iter().all(common::ready)
    });
    let pods = sb.pods();
    let placed: Vec<(String, String)> = pods
        .iter()
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap().to_owned(),
                p["spec"]["nodeName"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for (name, k) in [
        ("a1", 1),
        ("a2", 2),
        ("a3", 3),
        ("b1", 2),
        ("b2", 3),
        ("b3", 1),
    ] {
        assert!(
            placed.contains(&(name.to_owned(), node(k))),
            "{name} not on {}: {placed:?}",
            node(k)
        );
    }

    // Every pod and every node reaches every pod: TCP, UDP and ICMP, across nodes and subnets.
    let targets: Vec<(String, String, IpAddr)> = pods
        .iter()
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap().to_owned(),
                p["spec"]["nodeName"].as_str().unwrap().to_owned(),
                p["status"]["podIP"].as_str().unwrap().parse().unwrap(),
            )
        })
        .collect();
    let node_netns = |k: usize| {
        if k == 1 {
            PathBuf::from("/proc/self/ns/net")
        } else {
            PathBuf::from(format!("/var/run/netns/{}-node{k}", sb.prefix))
        }
    };
    let mut sources: Vec<(String, PathBuf)> = (1..=3).map(|k| (node(k), node_netns(k))).collect();
    sources.extend(sb.netns_of_pods());
    assert_eq!(sources.len(), 9, "{sources:?}");
    let failures = |sources: &[(String, PathBuf)], targets: &[(String, String, IpAddr)]| {
        std::thread::scope(|s| {
            let jobs: Vec<_> = sources
                .iter()
                .flat_map(|(src, netns)| targets.iter().map(move |t| (src, netns, t)))
                .map(|(src, netns, (name, _, ip))| {
                    s.spawn(move || {
                        reach(netns, name, *ip)
                            .into_iter()
                            .map(|b| format!("{src} -> {name} ({ip}): {b}"))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            jobs.into_iter()
                .flat_map(|j| j.join().unwrap())
                .collect::<Vec<_>>()
        })
    };
    let bad = failures(&sources, &targets);
    assert!(
        bad.is_empty(),
        "{} failures:\n{}",
        bad.len(),
        bad.join("\n")
    );

    services_across_nodes(&sb, &node, &pod, &sources);

    // Egress to the external network: the default subnet masquerades (natOutgoing, as Kube-OVN's default
    // subnet does), so the world sees each pod as its own node's underlay address, over TCP and UDP; the blue
    // subnet does not, and the world has no route back to its pods' addresses.
    let world = SocketAddr::new("198.51.100.1".parse().unwrap(), 80);
    let netns = |who: &str| {
        sources
            .iter()
            .find(|(s, _)| s == who)
            .map(|(_, p)| p.clone())
            .unwrap_or_else(|| panic!("no namespace for {who}"))
    };
    for (pod, k) in [("default/a1", 1), ("default/a2", 2), ("default/a3", 3)] {
        // The first connection may wait for the underlay's neighbours to resolve.
        common::wait_until(
            &format!("{pod} to the world"),
            Duration::from_secs(10),
            || {
                kubeovn_sandbox::transport::ask_name(
                    &netns(pod),
                    world,
                    false,
                    Duration::from_secs(1),
                )
                .is_ok()
            },
        );
        for udp in [false, true] {
            let seen = kubeovn_sandbox::transport::ask_name(
                &netns(pod),
                world,
                udp,
                Duration::from_secs(3),
            );
            assert_eq!(
                seen,
                Ok(format!("198.18.0.{k}")),
                "{pod} to the world (udp: {udp})"
            );
        }
    }
    for pod in ["blue/b1", "blue/b3"] {
        let seen =
            kubeovn_sandbox::transport::ask_name(&netns(pod), world, false, Duration::from_secs(2));
        assert!(
            seen.is_err(),
            "{pod} without natOutgoing reached the world: {seen:?}"
        );
    }

    // A centralized subnet: its egress leaves through its first gateway node (node 2) whatever node its pod
    // is on, masqueraded there.
    sb.apply(&json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "green"}},
        {"apiVersion": "kubeovn.io/v1", "kind": "Subnet", "metadata": {"name": "green"},
         "spec": {"cidrBlock": "10.243.0.0/24", "namespaces": ["green"], "natOutgoing": true,
                  "gatewayType": "centralized", "gatewayNode": format!("{},{}", node(2), node(3))}},
    ]}));
    sb.apply(&pod("green", "g1", json!({"nodeName": node(1)})));
    common::wait_until("green/g1 ready", Duration::from_secs(60), || {
        sb.pods()
            .iter()
            .any(|p| p["metadata"]["name"] == "g1" && common::ready(p))
    });
    let active = || {
        let out = sb.kubectl(&[
            "get",
            "subnet",
            "green",
            "-o",
            "jsonpath={.status.activateGateway}",
        ]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    common::wait_until("green's active gateway", Duration::from_secs(20), || {
        active() == node(2)
    });
    let g1 = sb
        .netns_of_pods()
        .into_iter()
        .find(|(n, _)| n == "green/g1")
        .map(|(_, p)| p)
        .unwrap();
    let seen_by_world = |udp: bool| {
        kubeovn_sandbox::transport::ask_name(&g1, world, udp, Duration::from_millis(700))
    };
    common::wait_until("green/g1 through node 2", Duration::from_secs(20), || {
        seen_by_world(false).as_deref() == Ok("198.18.0.2")
    });
    assert_eq!(seen_by_world(true).as_deref(), Ok("198.18.0.2"));

    // Node 2 stops (its kubelet, daemon, ovn-controller and ovs-vswitchd; its Node still reads Ready): the
    // gateway moves to node 3 within 5 s, and pods on nodes 1 and 3 keep talking to each other.
    let node2 = sb.dir.path().join("nodes").join(node(2));
    let pids: Vec<Value> =
        serde_json::from_slice(&std::fs::read(node2.join("pids.json")).unwrap()).unwrap();
    let stopped = std::time::Instant::now();
    kubeovn_sandbox::ovn::stop_monitored_vswitchd(&node2.join("ovn"), Duration::from_secs(3));
    for p in pids.iter().rev() {
        let pid = p["pid"].as_u64().unwrap().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
    }
    common::wait_until("green/g1 through node 3", Duration::from_secs(15), || {
        seen_by_world(false).as_deref() == Ok("198.18.0.3")
    });
    let failover = stopped.elapsed();
    eprintln!("gateway failover: egress restored through node 3 {failover:?} after node 2 stopped");
    assert!(
        failover < Duration::from_secs(5),
        "failover took {failover:?}"
    );
    assert_eq!(active(), node(3));
    assert_eq!(seen_by_world(true).as_deref(), Ok("198.18.0.3"));
    // Node 2 deleted: its join port and its chassis go (the southbound's too), the rest stays.
    let out = sb.kubectl(&["delete", "node", &node(2)]);
    assert!(out.status.success(), "kubectl delete node: {out:?}");
    let sb_chassis = || {
        let out = Command::new("ovn-sbctl")
            .arg(format!("--db=unix:{}/ovn/sb.sock", sb.dir.path().display()))
            .args(["--bare", "--columns=name", "list", "Chassis"])
            .output()
            .unwrap();
        let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        v.sort();
        v
    };
    common::wait_until("node 2's chassis gone", Duration::from_secs(15), || {
        sb_chassis() == [node(1), node(3)]
    });
    let lsp = Command::new("ovn-nbctl")
        .arg(format!("--db=unix:{}/ovn/nb.sock", sb.dir.path().display()))
        .args(["--bare", "--columns=name", "list", "Logical_Switch_Port"])
        .output()
        .unwrap();
    let ports = String::from_utf8_lossy(&lsp.stdout).into_owned();
    assert!(!ports.contains(&format!("node-{}", node(2))), "{ports}");
    assert!(ports.contains(&format!("node-{}", node(3))), "{ports}");
    assert_eq!(active(), node(3));
    let on_2 = |who: &str| {
        placed
            .iter()
            .any(|(n, k)| who.ends_with(&format!("/{n}")) && *k == node(2))
            || who == node(2)
    };
    let left: Vec<(String, PathBuf)> = sources.iter().filter(|(s, _)| !on_2(s)).cloned().collect();
    let left_targets: Vec<(String, String, IpAddr)> = targets
        .iter()
        .filter(|(_, k, _)| *k != node(2))
        .cloned()
        .collect();
    assert_eq!((left.len(), left_targets.len()), (6, 4));
    let bad = failures(&left, &left_targets);
    assert!(
        bad.is_empty(),
        "after node 2 stopped, {} failures:\n{}",
        bad.len(),
        bad.join("\n")
    );

    // down: no namespace of this sandbox and no underlay link left.
    let out = sb.run(&["down"]);
    assert!(out.status.success(), "down: {out:?}");
    assert_eq!(sb.netns(), Vec::<String>::new());
    let pods_left: Vec<String> = std::fs::read_dir("/var/run/netns")
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("{}n", sb.prefix)))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(pods_left, Vec::<String>::new());
    for k in 2..=3 {
        assert!(!common::link_exists(&format!("{}-ul{k}", sb.prefix)));
    }
    assert!(!common::link_exists(&format!("{}-ul", sb.bridge)));
}
