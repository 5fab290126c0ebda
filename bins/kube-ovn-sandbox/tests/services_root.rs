//! Services in the sandbox, with the traffic users send (needs root, the OVN/OVS packages and kubectl): a pod
//! made with `kubectl run` and `kubectl expose`d answers HTTP on its ClusterIP; the demo's Service answers every pod and the node over TCP and UDP from every backend (`up` checks it); a
//! Service without a selector reaches the endpoint of a hand-written EndpointSlice, also from that backend
//! itself (hairpin); `sessionAffinity: ClientIP` keeps one backend; a Service without endpoints refuses at
//! once; `internalTrafficPolicy: Local` reaches only the endpoints of the client's node; a deleted backend
//! gets no new connection once it has left the Service's load balancer; a dual-stack Service answers on
//! both families; a custom VPC's Service answers its own pods and not the default VPC's.
//!
//! Run it in a network namespace of its own when another ovs-vswitchd runs on the machine:
//! `unshare --net --mount -- sh -c 'mount -t sysfs sysfs /sys && ip link set lo up && cargo test -p
//! kube-ovn-sandbox --test services_root'`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kubeovn_sandbox::state::StateDir;
use kubeovn_sandbox::transport::{ask_name, SERVE_NAME_COMMAND};
use serde_json::{json, Value};

mod common;
use common::*;

impl Sandbox {
    fn apply_all(&self, docs: &[Value]) {
        self.apply(&json!({"apiVersion": "v1", "kind": "List", "items": docs}));
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = vec!["get"];
        a.extend(args);
        a.extend(["-o", "json"]);
        let out = self.kubectl(&a);
        assert!(out.status.success(), "kubectl {a:?}: {out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The network namespace of pod `ns/name`.
    fn netns_of(&self, ns: &str, name: &str) -> std::path::PathBuf {
        let dir = StateDir::new(self.dir.path());
        kubeovn_sandbox::kubelet::find_record(&dir, ns, name)
            .unwrap_or_else(|| panic!("no sandbox for {ns}/{name}"))
            .netns
    }

    /// `n` answers of the name servers behind `vip` from pod `ns/name` (TCP, or UDP).
    fn ask(
        &self,
        from: (&str, &str),
        vip: SocketAddr,
        udp: bool,
        n: usize,
    ) -> Vec<Result<String, String>> {
        let netns = self.netns_of(from.0, from.1);
        (0..n)
            .map(|_| ask_name(&netns, vip, udp, Duration::from_secs(1)))
            .collect()
    }

    /// The ClusterIPs of Service `ns/name`.
    fn cluster_ips(&self, ns: &str, name: &str) -> Vec<String> {
        let v = self.json(&["-n", ns, "service", name]);
        v["spec"]["clusterIPs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_owned())
            .collect()
    }

    /// The backends' addresses of `vip` in the northbound load balancer `lb` (None: no such balancer, or
    /// `vip` not in it).
    fn lb_backends(&self, lb: &str, vip: SocketAddr) -> Option<BTreeSet<String>> {
        let out = std::process::Command::new(self.bins.join("kubectl-ko"))
            .arg("--sandbox")
            .arg(self.dir.path())
            .args([
                "nbctl",
                "--format=json",
                "--columns=vips",
                "find",
                "Load_Balancer",
            ])
            .arg(format!("name={lb}"))
            .output()
            .unwrap();
        assert!(out.status.success(), "kubectl-ko nbctl find: {out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        // {"data": [[["map", [[VIP, "IP:PORT,IP:PORT"], ...]]]], ...}: one row, its one column.
        let vips = v["data"][0][0][1].as_array()?;
        let backends = vips
            .iter()
            .find(|kv| kv[0].as_str() == Some(vip.to_string().as_str()))?[1]
            .as_str()?;
        Some(
            backends
                .split(',')
                .filter(|b| !b.is_empty())
                .map(|b| b.parse::<SocketAddr>().unwrap().ip().to_string())
                .collect(),
        )
    }

    /// Waits until pods `names` of `ns` are Ready.
    fn wait_ready(&self, ns: &str, names: &[&str]) {
        wait_until(
            &format!("{ns} pods {names:?} ready"),
            Duration::from_secs(60),
            || {
                let v = self.json(&["-n", ns, "pods"]);
                names.iter().all(|n| {
                    v["items"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|p| p["metadata"]["name"] == *n && ready(p))
                })
            },
        );
    }
}

fn vip(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), port)
}

fn names(v: &[Result<String, String>]) -> BTreeSet<String> {
    v.iter().filter_map(|r| r.as_ref().ok().cloned()).collect()
}

/// A pod of `ns` with labels `labels` serving its name on TCP and UDP 8080.
fn server(ns: &str, name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"containers": [{
            "name": "main", "image": "any",
            "command": [env!("CARGO_BIN_EXE_kube-ovn-sandbox"), SERVE_NAME_COMMAND, "8080"],
            "ports": [{"name": "tcp", "containerPort": 8080}],
            "readinessProbe": {"tcpSocket": {"port": "tcp"}, "periodSeconds": 1}}]}
    })
}

fn service(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

/// Polls `f` (every 100 ms, at most `secs`) until it holds.
fn eventually(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    wait_until(what, Duration::from_secs(secs), &mut f);
}

#[test]
fn services_balance_tcp_and_udp_in_the_sandbox() {
    if !runnable() {
        return;
    }
    let (sb, out) = up(
        "sbs",
        &[
            "--default-cidr",
            "10.245.0.0/16",
            "--join-cidr",
            "100.98.0.0/16",
            "--demo-cidr",
            "10.246.0.0/24",
            "--service-cidr",
            "10.97.0.0/16,fd00:97::/108",
            "--demo-pods",
            "2",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "up failed");
    // The demo Service: every pod and the node, 6 TCP connections and 6 UDP requests each, all answered, by
    // both backends (web-1 also reached itself: hairpin through its own Service).
    assert!(
        stdout.contains("every request answered; backends seen: web-1, web-2"),
        "{stdout}"
    );
    let web = sb.cluster_ips("default", "web");
    let web_vip = vip(&web[0], 80);

    // What a user types: `kubectl run` a server, `kubectl expose` it, and fetch through the ClusterIP.
    for args in [
        &[
            "run",
            "http",
            "--image=any",
            "--",
            "python3",
            "-m",
            "http.server",
            "8080",
        ][..],
        &[
            "expose",
            "pod",
            "http",
            "--port",
            "80",
            "--target-port",
            "8080",
        ][..],
    ] {
        let out = sb.kubectl(args);
        assert!(out.status.success(), "kubectl {args:?}: {out:?}");
    }
    let http = sb.cluster_ips("default", "http")[0].clone();
    eventually(
        "an HTTP GET through the exposed pod's ClusterIP",
        30,
        || sb.http_get_listing("demo/app-1", &format!("http://{http}/"), 2),
    );

    // A Service without a selector: a hand-written EndpointSlice to web-1; hairpin from web-1 itself.
    let web1_ip = sb.json(&["-n", "default", "pod", "web-1"])["status"]["podIP"]
        .as_str()
        .unwrap()
        .to_owned();
    sb.apply_all(&[
        service("default", "manual", json!({"ports": [{"port": 81, "targetPort": 8080}]})),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": "manual-1", "namespace": "default",
                            "labels": {"kubernetes.io/service-name": "manual"}},
               "addressType": "IPv4", "ports": [{"port": 8080, "protocol": "TCP"}],
               "endpoints": [{"addresses": [web1_ip], "conditions": {"ready": true}}]}),
        service("default", "sticky", json!({"selector": {"role": "web"},
            "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}},
            "ports": [{"port": 82, "targetPort": 8080}]})),
        service("default", "nobody", json!({"selector": {"role": "none"}, "ports": [{"port": 83}]})),
    ]);
    let manual = vip(&sb.cluster_ips("default", "manual")[0], 81);
    eventually("the hand-written slice's backend answers", 10, || {
        names(&sb.ask(("demo", "app-1"), manual, false, 1)) == BTreeSet::from(["web-1".to_owned()])
    });
    let hairpin = sb.ask(("default", "web-1"), manual, false, 5);
    assert!(
        hairpin.iter().all(|r| r.as_deref() == Ok("web-1")),
        "web-1 through its own Service: {hairpin:?}"
    );

    // internalTrafficPolicy Local: only the endpoints on the client's node (web-2's address is given to
    // another node here).
    let web2_ip = sb.json(&["-n", "default", "pod", "web-2"])["status"]["podIP"]
        .as_str()
        .unwrap()
        .to_owned();
    let node = sb.prefix.clone();
    sb.apply_all(&[
        service(
            "default",
            "local",
            json!({"internalTrafficPolicy": "Local",
            "ports": [{"port": 84, "targetPort": 8080}]}),
        ),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": "local-1", "namespace": "default",
                            "labels": {"kubernetes.io/service-name": "local"}},
               "addressType": "IPv4", "ports": [{"port": 8080, "protocol": "TCP"}],
               "endpoints": [{"addresses": [web1_ip], "nodeName": node},
                             {"addresses": [web2_ip], "nodeName": "another-node"}]}),
    ]);
    let local = vip(&sb.cluster_ips("default", "local")[0], 84);
    eventually("the Local Service answers", 10, || {
        sb.ask(("demo", "app-1"), local, false, 1)[0].is_ok()
    });
    let got = sb.ask(("demo", "app-1"), local, false, 10);
    assert!(
        got.iter().all(|r| r.as_deref() == Ok("web-1")),
        "a Local Service reached a backend of another node: {got:?}"
    );

    // ClientIP affinity: one backend for every connection of a client.
    let sticky = vip(&sb.cluster_ips("default", "sticky")[0], 82);
    eventually("the sticky Service answers", 10, || {
        sb.ask(("demo", "app-1"), sticky, false, 1)[0].is_ok()
    });
    for from in [("demo", "app-1"), ("demo", "app-2")] {
        let got = sb.ask(from, sticky, false, 12);
        assert!(got.iter().all(Result::is_ok), "{from:?}: {got:?}");
        assert_eq!(
            names(&got).len(),
            1,
            "{from:?} moved between backends: {got:?}"
        );
    }

    // No endpoints: refused at once, not a timeout.
    let nobody = vip(&sb.cluster_ips("default", "nobody")[0], 83);
    eventually("the Service without endpoints refuses", 10, || {
        let t = Instant::now();
        let r = sb.ask(("demo", "app-1"), nobody, false, 1).remove(0);
        matches!(&r, Err(e) if e.contains("refused")) && t.elapsed() < Duration::from_millis(500)
    });

    // A dual-stack subnet and Service: answers on both families.
    sb.apply_all(&[
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ds"}}),
        json!({"apiVersion": "kubeovn.io/v1", "kind": "Subnet", "metadata": {"name": "ds"},
               "spec": {"protocol": "Dual", "cidrBlock": "10.249.0.0/24,fd00:249::/64",
                        "gateway": "10.249.0.1,fd00:249::1", "namespaces": ["ds"]}}),
    ]);
    eventually("namespace ds bound to subnet ds", 20, || {
        sb.json(&["namespace", "ds"])["metadata"]["annotations"]["ovn.kubernetes.io/logical_switch"]
            == "ds"
    });
    sb.apply_all(&[
        server("ds", "ds-1", json!({"app": "ds"})),
        server("ds", "ds-client", json!({"app": "client"})),
        service(
            "ds",
            "ds",
            json!({"selector": {"app": "ds"}, "ipFamilyPolicy": "RequireDualStack",
            "ports": [{"port": 80, "targetPort": 8080}]}),
        ),
    ]);
    sb.wait_ready("ds", &["ds-1", "ds-client"]);
    let ds = sb.cluster_ips("ds", "ds");
    assert_eq!(ds.len(), 2, "{ds:?}");
    for ip in &ds {
        eventually(&format!("the dual-stack Service on {ip}"), 15, || {
            sb.ask(("ds", "ds-client"), vip(ip, 80), false, 1)[0].as_deref() == Ok("ds-1")
        });
    }

    // A custom VPC: its Service answers its own pods, not the default VPC's.
    sb.apply_all(&[
        json!({"apiVersion": "kubeovn.io/v1", "kind": "Vpc", "metadata": {"name": "blue"}, "spec": {}}),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "blue"}}),
        json!({"apiVersion": "kubeovn.io/v1", "kind": "Subnet", "metadata": {"name": "blue-net"},
               "spec": {"cidrBlock": "10.250.0.0/24", "gateway": "10.250.0.1", "vpc": "blue",
                        "namespaces": ["blue"]}}),
    ]);
    eventually("namespace blue bound to subnet blue-net", 20, || {
        sb.json(&["namespace", "blue"])["metadata"]["annotations"]
            ["ovn.kubernetes.io/logical_switch"]
            == "blue-net"
    });
    sb.apply_all(&[
        server("blue", "blue-1", json!({"app": "blue"})),
        server("blue", "blue-client", json!({"app": "client"})),
        service(
            "blue",
            "blue",
            json!({"selector": {"app": "blue"}, "ports": [{"port": 80, "targetPort": 8080}]}),
        ),
    ]);
    sb.wait_ready("blue", &["blue-1", "blue-client"]);
    let blue = vip(&sb.cluster_ips("blue", "blue")[0], 80);
    eventually("the blue Service answers blue's pods", 15, || {
        sb.ask(("blue", "blue-client"), blue, false, 1)[0].as_deref() == Ok("blue-1")
    });
    let from_default = sb.ask(("demo", "app-1"), blue, false, 2);
    assert!(
        from_default.iter().all(Result::is_err),
        "the blue VPC's Service answered the default VPC: {from_default:?}"
    );
    // The Vpc's status follows its Services (written by the Vpc's own run, after the Service's).
    eventually("the blue Vpc's status lists its load balancer", 10, || {
        sb.json(&["vpc", "blue"])["status"]["loadBalancers"] == json!(["svc.blue.blue.tcp"])
    });
    let vpc = sb.json(&["vpc", "blue"]);
    assert_eq!(vpc["status"]["loadBalancerGroup"], "lbg.blue", "{vpc}");

    // A backend deleted: once its address has left the Service's load balancer in NB, and the chassis has
    // installed that NB (`--wait=hv`), no new connection reaches it. Both backends are in it before.
    let web_lb = "svc.default.web.tcp";
    let both = BTreeSet::from([web1_ip.clone(), web2_ip.clone()]);
    assert_eq!(
        sb.lb_backends(web_lb, web_vip),
        Some(both),
        "{web_lb} before"
    );
    let out = sb.kubectl(&["-n", "default", "delete", "pod", "web-2", "--wait=false"]);
    assert!(out.status.success(), "{out:?}");
    let only_web1 = BTreeSet::from([web1_ip.clone()]);
    eventually("web-2's address to leave web's load balancer", 20, || {
        sb.lb_backends(web_lb, web_vip).as_ref() == Some(&only_web1)
    });
    let out = sb.ko(&["nbctl", "--timeout=30", "--wait=hv", "sync"]);
    assert!(out.status.success(), "ovn-nbctl --wait=hv sync: {out:?}");
    // The OpenFlow rules are now without web-2; OVS 3.1's userspace datapath may still serve a megaflow
    // cached with the old ones for a moment (seen here: one SYN of twenty sent to the deleted backend), so
    // its cache is dropped, as the netpol truth table does, and the next packets follow the rules of now.
    let flushed = std::process::Command::new("ovs-appctl")
        .arg("-t")
        .arg(sb.dir.path().join("ovn/vswitchd.ctl"))
        .arg("dpctl/del-flows")
        .output()
        .unwrap();
    assert!(flushed.status.success(), "dpctl/del-flows: {flushed:?}");
    let after = sb.ask(("demo", "app-1"), web_vip, false, 20);
    assert!(
        after.iter().all(|r| r.as_deref() == Ok("web-1")),
        "connections once web-2 left the load balancer: {after:?}"
    );
}
