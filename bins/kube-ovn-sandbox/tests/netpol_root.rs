//! NetworkPolicy, AdminNetworkPolicy and BaselineAdminNetworkPolicy in the sandbox, proven by a connectivity
//! truth table (needs root, the OVN/OVS packages and kubectl): the shape of the upstream Kubernetes e2e
//! netpol suite. Namespaces x, y and z hold pods a, b and c, each serving TCP and UDP on ports 80 and 81; for
//! each scenario every pod (and the node) probes every pod on each port and protocol, and the whole matrix is
//! compared with the one a small oracle, written from the specifications, expects. The oracle itself is
//! checked against hand-written matrices for the simple scenarios (`oracle_*`, no root needed).
//!
//! Run it in a network namespace of its own when another ovs-vswitchd runs on the machine:
//! `unshare --net --mount -- sh -c 'mount -t sysfs sysfs /sys && ip link set lo up && cargo test -p
//! kube-ovn-sandbox --test netpol_root'`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::*;

type Labels = BTreeMap<String, String>;

const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const PODS: [&str; 3] = ["a", "b", "c"];
const PORTS: [u16; 2] = [80, 81];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    fn k8s(self) -> &'static str {
        match self {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
        }
    }
}

const PROTOS: [Proto; 2] = [Proto::Tcp, Proto::Udp];

/// A pod as the oracle sees it.
#[derive(Clone, Debug)]
struct PodInfo {
    ns: String,
    name: String,
    labels: Labels,
    ip: IpAddr,
    /// Container ports: name, protocol, number.
    ports: Vec<(String, Proto, u16)>,
    netns: PathBuf,
}

impl PodInfo {
    fn id(&self) -> String {
        format!("{}/{}", self.ns, self.name)
    }
}

/// The cluster as the oracle sees it: namespaces' labels, pods, and the policies in force.
#[derive(Clone, Debug, Default)]
struct World {
    namespaces: BTreeMap<String, Labels>,
    pods: Vec<PodInfo>,
    /// NetworkPolicies by (namespace, name).
    nps: BTreeMap<(String, String), Value>,
    /// AdminNetworkPolicies by name.
    anps: BTreeMap<String, Value>,
    banp: Option<Value>,
    /// Private subnets: their block and `allowSubnets`.
    private: Vec<(String, Vec<String>)>,
}

/// The named ports every pod declares; `web` is 80 on pods a and b, 81 on c (resolved per pod).
fn container_ports(pod: &str) -> Vec<(String, Proto, u16)> {
    let mut v = Vec::new();
    for p in PORTS {
        for proto in PROTOS {
            v.push((
                format!("serve-{p}-{}", proto.k8s().to_lowercase()),
                proto,
                p,
            ));
        }
    }
    v.push(("web".into(), Proto::Tcp, if pod == "c" { 81 } else { 80 }));
    v
}

// ------------------------------------------------------------------------------------------------
// The oracle, from the specifications.

fn selector_matches(sel: &Value, labels: &Labels) -> bool {
    if let Some(ml) = sel.get("matchLabels").and_then(Value::as_object) {
        if ml
            .iter()
            .any(|(k, v)| labels.get(k).map(String::as_str) != v.as_str())
        {
            return false;
        }
    }
    for e in sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = e["key"].as_str().unwrap();
        let vals: Vec<&str> = e["values"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let have = labels.get(key).map(String::as_str);
        let ok = match e["operator"].as_str().unwrap() {
            "In" => have.is_some_and(|h| vals.contains(&h)),
            "NotIn" => have.is_none_or(|h| !vals.contains(&h)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            o => panic!("operator {o}"),
        };
        if !ok {
            return false;
        }
    }
    true
}

fn in_cidr(ip: IpAddr, cidr: &str) -> bool {
    let (net, len) = cidr.split_once('/').unwrap();
    let len: u32 = len.parse().unwrap();
    match (ip, net.parse::<IpAddr>().unwrap()) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// One probe: from a pod (None: the node) to a pod's port.
#[derive(Clone, Copy)]
struct Conn<'a> {
    src: Option<&'a PodInfo>,
    dst: &'a PodInfo,
    port: u16,
    proto: Proto,
}

impl World {
    fn ns_labels(&self, ns: &str) -> &Labels {
        &self.namespaces[ns]
    }

    /// Whether the oracle lets `c` through.
    fn allowed(&self, c: Conn<'_>) -> bool {
        // The node reaches its pods whatever the policies; a pod reaches itself without the network.
        let Some(src) = c.src else { return true };
        if src.id() == c.dst.id() {
            return true;
        }
        self.direction_allowed(true, src, c)
            && self.direction_allowed(false, c.dst, c)
            && self.leaves_private(src, c.dst)
    }

    /// The private subnet `ip` is in: its block and `allowSubnets`.
    fn private_of(&self, ip: IpAddr) -> Option<&(String, Vec<String>)> {
        self.private.iter().find(|(c, _)| in_cidr(ip, c))
    }

    /// Whether a private subnet lets `peer` in (or out to `peer`): its own block or `allowSubnets`.
    fn private_allows(p: &(String, Vec<String>), peer: IpAddr) -> bool {
        in_cidr(peer, &p.0) || p.1.iter().any(|a| in_cidr(peer, a))
    }

    /// A private subnet's switch judges what leaves it for another subnet too (to-lport on its router port),
    /// where no policy of the destination's ACLs applies.
    fn leaves_private(&self, src: &PodInfo, dst: &PodInfo) -> bool {
        match self.private_of(src.ip) {
            Some(p) if !in_cidr(dst.ip, &p.0) => Self::private_allows(p, dst.ip),
            _ => true,
        }
    }

    /// Egress of `subject` (the source) or ingress of `subject` (the destination).
    fn direction_allowed(&self, egress: bool, subject: &PodInfo, c: Conn<'_>) -> bool {
        let peer = if egress { c.dst } else { c.src.unwrap() };
        if let Some(v) = self.admin_verdict(egress, subject, peer, c) {
            return v;
        }
        let dir = if egress { "Egress" } else { "Ingress" };
        let isolating: Vec<&Value> = self
            .nps
            .iter()
            .filter(|((ns, _), np)| {
                *ns == subject.ns
                    && selector_matches(&np["spec"]["podSelector"], &subject.labels)
                    && policy_types(np).contains(&dir)
            })
            .map(|(_, np)| np)
            .collect();
        if !isolating.is_empty() {
            let (rules, peers) = if egress {
                ("egress", "to")
            } else {
                ("ingress", "from")
            };
            return isolating.iter().any(|np| {
                np["spec"][rules].as_array().into_iter().flatten().any(|r| {
                    let ns = np["metadata"]["namespace"].as_str().unwrap();
                    let peer_ok = match r.get(peers).and_then(Value::as_array) {
                        None => true,
                        Some(ps) if ps.is_empty() => true,
                        Some(ps) => ps.iter().any(|p| self.np_peer(ns, p, peer)),
                    };
                    let port_ok = match r.get("ports").and_then(Value::as_array) {
                        None => true,
                        Some(ps) if ps.is_empty() => true,
                        Some(ps) => ps.iter().any(|p| np_port(p, c)),
                    };
                    peer_ok && port_ok
                })
            });
        }
        // A private subnet's drop and allows lie between NetworkPolicy and the baseline (Kube-OVN's tiers).
        if !egress {
            if let Some(p) = self.private_of(subject.ip) {
                return Self::private_allows(p, peer.ip);
            }
        }
        self.baseline_verdict(egress, subject, peer, c)
            .unwrap_or(true)
    }

    fn np_peer(&self, policy_ns: &str, p: &Value, peer: &PodInfo) -> bool {
        if let Some(b) = p.get("ipBlock") {
            return in_cidr(peer.ip, b["cidr"].as_str().unwrap())
                && !b["except"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|e| in_cidr(peer.ip, e.as_str().unwrap()));
        }
        let ns_ok = match p.get("namespaceSelector") {
            Some(s) => selector_matches(s, self.ns_labels(&peer.ns)),
            None => peer.ns == policy_ns,
        };
        let pod_ok = p
            .get("podSelector")
            .is_none_or(|s| selector_matches(s, &peer.labels));
        ns_ok && pod_ok
    }

    fn admin_pods(&self, sel: &Value, pod: &PodInfo) -> bool {
        if let Some(n) = sel.get("namespaces") {
            return selector_matches(n, self.ns_labels(&pod.ns));
        }
        if let Some(p) = sel.get("pods") {
            return selector_matches(&p["namespaceSelector"], self.ns_labels(&pod.ns))
                && selector_matches(&p["podSelector"], &pod.labels);
        }
        if let Some(nets) = sel.get("networks").and_then(Value::as_array) {
            return nets.iter().any(|n| in_cidr(pod.ip, n.as_str().unwrap()));
        }
        // nodes: a pod is no node.
        false
    }

    /// The action of the first admin rule `c` matches, in one policy's rules of a direction.
    fn admin_rule<'v>(
        &self,
        policy: &'v Value,
        egress: bool,
        subject: &PodInfo,
        peer: &PodInfo,
        c: Conn<'_>,
    ) -> Option<&'v str> {
        if !self.admin_pods(&policy["spec"]["subject"], subject) {
            return None;
        }
        let (rules, peers) = if egress {
            ("egress", "to")
        } else {
            ("ingress", "from")
        };
        policy["spec"][rules]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| {
                r[peers]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| self.admin_pods(p, peer))
                    && r.get("ports")
                        .and_then(Value::as_array)
                        .is_none_or(|ps| ps.iter().any(|p| admin_port(p, c)))
            })
            .map(|r| r["action"].as_str().unwrap())
    }

    /// Allow or Deny of the admin policies by priority; None when none matches or one passes.
    fn admin_verdict(
        &self,
        egress: bool,
        subject: &PodInfo,
        peer: &PodInfo,
        c: Conn<'_>,
    ) -> Option<bool> {
        let mut anps: Vec<&Value> = self.anps.values().collect();
        anps.sort_by_key(|a| a["spec"]["priority"].as_i64().unwrap());
        for a in anps {
            match self.admin_rule(a, egress, subject, peer, c) {
                Some("Allow") => return Some(true),
                Some("Deny") => return Some(false),
                Some("Pass") => return None,
                _ => {}
            }
        }
        None
    }

    fn baseline_verdict(
        &self,
        egress: bool,
        subject: &PodInfo,
        peer: &PodInfo,
        c: Conn<'_>,
    ) -> Option<bool> {
        let b = self.banp.as_ref()?;
        self.admin_rule(b, egress, subject, peer, c)
            .map(|a| a == "Allow")
    }

    /// The expected matrix.
    fn expected(&self) -> Matrix {
        self.matrix(|c| self.allowed(c))
    }

    fn matrix(&self, mut f: impl FnMut(Conn<'_>) -> bool) -> Matrix {
        let mut m = Matrix::default();
        let sources: Vec<Option<&PodInfo>> = std::iter::once(None)
            .chain(self.pods.iter().map(Some))
            .collect();
        for src in &sources {
            for dst in &self.pods {
                for port in PORTS {
                    for proto in PROTOS {
                        let c = Conn {
                            src: *src,
                            dst,
                            port,
                            proto,
                        };
                        m.0.insert(
                            (
                                src.map_or("node".into(), PodInfo::id),
                                dst.id(),
                                port,
                                proto,
                            ),
                            f(c),
                        );
                    }
                }
            }
        }
        m
    }
}

fn policy_types(np: &Value) -> Vec<&str> {
    if let Some(t) = np["spec"]["policyTypes"].as_array() {
        return t.iter().filter_map(Value::as_str).collect();
    }
    let mut v = vec!["Ingress"];
    if np["spec"].get("egress").is_some() {
        v.push("Egress");
    }
    v
}

fn np_port(p: &Value, c: Conn<'_>) -> bool {
    if p.get("protocol").and_then(Value::as_str).unwrap_or("TCP") != c.proto.k8s() {
        return false;
    }
    match p.get("port") {
        None => true,
        Some(Value::String(name)) => c
            .dst
            .ports
            .iter()
            .any(|(n, pr, num)| n == name && *pr == c.proto && *num == c.port),
        Some(n) => {
            let start = n.as_u64().unwrap();
            let end = p.get("endPort").and_then(Value::as_u64).unwrap_or(start);
            (start..=end).contains(&u64::from(c.port))
        }
    }
}

fn admin_port(p: &Value, c: Conn<'_>) -> bool {
    if let Some(n) = p.get("portNumber") {
        return n["protocol"] == c.proto.k8s() && n["port"].as_u64() == Some(u64::from(c.port));
    }
    if let Some(r) = p.get("portRange") {
        return r["protocol"] == c.proto.k8s()
            && (r["start"].as_u64().unwrap()..=r["end"].as_u64().unwrap())
                .contains(&u64::from(c.port));
    }
    if let Some(name) = p.get("namedPort").and_then(Value::as_str) {
        return c
            .dst
            .ports
            .iter()
            .any(|(n, pr, num)| n == name && *pr == c.proto && *num == c.port);
    }
    false
}

/// Whether each (source, destination, port, protocol) connects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Matrix(BTreeMap<(String, String, u16, Proto), bool>);

impl Matrix {
    /// One grid per port and protocol: rows are sources, columns destinations; `.` connects, `X` not.
    fn grid(&self, port: u16, proto: Proto) -> String {
        let mut dsts: Vec<&String> = self
            .0
            .keys()
            .filter(|k| k.2 == port && k.3 == proto)
            .map(|k| &k.1)
            .collect();
        dsts.sort();
        dsts.dedup();
        let mut srcs: Vec<&String> = self.0.keys().map(|k| &k.0).collect();
        srcs.sort_by_key(|s| (*s != "node", (*s).clone()));
        srcs.dedup();
        let mut out = String::new();
        for s in srcs {
            let row: String = dsts
                .iter()
                .map(
                    |d| match self.0.get(&(s.clone(), (*d).clone(), port, proto)) {
                        Some(true) => '.',
                        Some(false) => 'X',
                        None => '?',
                    },
                )
                .collect();
            let _ = writeln!(out, "{s:>4} {row}");
        }
        out
    }

    /// The differences from `want`, readable.
    fn diff(&self, want: &Matrix) -> String {
        let mut out = String::new();
        for (k, w) in &want.0 {
            let got = self.0.get(k).copied();
            if got != Some(*w) {
                let _ = writeln!(
                    out,
                    "  {} -> {} {}/{:?}: expected {}, got {}",
                    k.0,
                    k.1,
                    k.2,
                    k.3,
                    if *w { "connected" } else { "blocked" },
                    match got {
                        Some(true) => "connected",
                        Some(false) => "blocked",
                        None => "no probe",
                    }
                );
            }
        }
        out
    }
}

// ------------------------------------------------------------------------------------------------
// The oracle checked against hand-written matrices (no root, no OVN).

fn toy_world() -> World {
    let mut w = World::default();
    for ns in NAMESPACES {
        w.namespaces.insert(
            ns.into(),
            Labels::from([
                ("ns".into(), ns.into()),
                ("kubernetes.io/metadata.name".into(), ns.into()),
            ]),
        );
    }
    for (i, ns) in NAMESPACES.iter().enumerate() {
        for (j, p) in PODS.iter().enumerate() {
            w.pods.push(PodInfo {
                ns: (*ns).into(),
                name: (*p).into(),
                labels: Labels::from([("pod".into(), (*p).into())]),
                ip: format!("10.0.{i}.{j}").parse().unwrap(),
                ports: container_ports(p),
                netns: PathBuf::new(),
            });
        }
    }
    w
}

/// A grid as written by hand: a row per source (node first), `.`/`X` per destination x/a .. z/c.
fn hand(rows: &[&str]) -> String {
    let srcs = [
        "node", "x/a", "x/b", "x/c", "y/a", "y/b", "y/c", "z/a", "z/b", "z/c",
    ];
    srcs.iter()
        .zip(rows)
        .map(|(s, r)| format!("{s:>4} {}\n", r.replace(' ', "")))
        .collect()
}

#[test]
fn oracle_no_policy_connects_everything() {
    let w = toy_world();
    let all = [
        ".........",
        ".........",
        ".........",
        ".........",
        ".........",
    ];
    let rows: Vec<&str> = all.iter().cycle().take(10).copied().collect();
    for port in PORTS {
        for proto in PROTOS {
            assert_eq!(w.expected().grid(port, proto), hand(&rows));
        }
    }
}

#[test]
fn oracle_default_deny_ingress_and_allow_from_a_pod() {
    let mut w = toy_world();
    w.nps.insert(
        ("x".into(), "deny".into()),
        json!({"metadata": {"namespace": "x", "name": "deny"}, "spec": {"podSelector": {}}}),
    );
    // x's pods take nothing but from the node and themselves.
    let deny = hand(&[
        "... ... ...",
        ".XX ... ...",
        "X.X ... ...",
        "XX. ... ...",
        "XXX ... ...",
        "XXX ... ...",
        "XXX ... ...",
        "XXX ... ...",
        "XXX ... ...",
        "XXX ... ...",
    ]);
    assert_eq!(w.expected().grid(80, Proto::Tcp), deny);
    assert_eq!(w.expected().grid(81, Proto::Udp), deny);
    // x/a also takes TCP 80 from y's pod b.
    w.nps.insert(
        ("x".into(), "allow".into()),
        json!({"metadata": {"namespace": "x", "name": "allow"}, "spec": {
            "podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}},
                                   "podSelector": {"matchLabels": {"pod": "b"}}}],
                         "ports": [{"port": 80}]}]}}),
    );
    let allow = hand(&[
        "... ... ...",
        ".XX ... ...",
        "X.X ... ...",
        "XX. ... ...",
        "XXX ... ...",
        ".XX ... ...",
        "XXX ... ...",
        "XXX ... ...",
        "XXX ... ...",
        "XXX ... ...",
    ]);
    assert_eq!(w.expected().grid(80, Proto::Tcp), allow);
    assert_eq!(w.expected().grid(80, Proto::Udp), deny);
    assert_eq!(w.expected().grid(81, Proto::Tcp), deny);
}

#[test]
fn oracle_default_deny_egress_and_admin_tiers() {
    let mut w = toy_world();
    w.nps.insert(
        ("y".into(), "deny".into()),
        json!({"metadata": {"namespace": "y", "name": "deny"},
               "spec": {"podSelector": {}, "policyTypes": ["Egress"]}}),
    );
    let egress = hand(&[
        "... ... ...",
        "... ... ...",
        "... ... ...",
        "... ... ...",
        "XXX .XX XXX",
        "XXX X.X XXX",
        "XXX XX. XXX",
        "... ... ...",
        "... ... ...",
        "... ... ...",
    ]);
    assert_eq!(w.expected().grid(81, Proto::Udp), egress);
    // An admin Allow of y's egress to z beats the NetworkPolicy; a baseline Deny from x into z applies where
    // no NetworkPolicy isolates (all of z).
    w.anps.insert(
        "allow".into(),
        json!({"spec": {"priority": 5, "subject": {"namespaces": {"matchLabels": {"ns": "y"}}},
            "egress": [{"name": "z", "action": "Allow", "to": [{"namespaces": {"matchLabels": {"ns": "z"}}}]}]}}),
    );
    w.banp = Some(
        json!({"spec": {"subject": {"namespaces": {"matchLabels": {"ns": "z"}}},
        "ingress": [{"name": "x", "action": "Deny", "from": [{"namespaces": {"matchLabels": {"ns": "x"}}}]}]}}),
    );
    let tiers = hand(&[
        "... ... ...",
        "... ... XXX",
        "... ... XXX",
        "... ... XXX",
        "XXX .XX ...",
        "XXX X.X ...",
        "XXX XX. ...",
        "... ... ...",
        "... ... ...",
        "... ... ...",
    ]);
    assert_eq!(w.expected().grid(80, Proto::Tcp), tiers);
}

// ------------------------------------------------------------------------------------------------
// The sandbox.

const DEFAULT_CIDR: &str = "10.249.0.0/16";
const PRIVATE_CIDR: &str = "10.250.0.0/24";

struct Cluster {
    sb: Sandbox,
    world: World,
    /// The next source port of each prober: no probe repeats another's 5-tuple (a connection tracker may
    /// still hold the old connection, and the kernel's choice of port repeats often for TCP).
    ports: std::sync::Mutex<BTreeMap<String, u16>>,
}

fn pod_json(ns: &str, name: &str, labels: &Labels) -> Value {
    let bin = env!("CARGO_BIN_EXE_kube-ovn-sandbox");
    let ports = |p: u16| {
        let mut v: Vec<Value> = container_ports(name)
            .into_iter()
            .filter(|(n, _, _)| n.starts_with(&format!("serve-{p}")))
            .map(|(n, pr, num)| json!({"name": n, "containerPort": num, "protocol": pr.k8s()}))
            .collect();
        if p == 80 {
            let web = container_ports(name)
                .into_iter()
                .find(|x| x.0 == "web")
                .unwrap();
            v.push(json!({"name": "web", "containerPort": web.2, "protocol": "TCP"}));
        }
        v
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"containers": [
            {"name": "serve-80", "image": "any", "command": [bin, "serve-name", "80"], "ports": ports(80),
             "readinessProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 1}},
            {"name": "serve-81", "image": "any", "command": [bin, "serve-name", "81"], "ports": ports(81)}]}
    })
}

impl Cluster {
    fn kubectl_ok(&self, args: &[&str]) {
        let out = self.sb.kubectl(args);
        assert!(out.status.success(), "kubectl {args:?}: {out:?}");
    }

    /// Creates pod `ns/name` (labelled `pod: name`), waits until it is Ready and records it.
    fn create_pods(&mut self, which: &[(&str, &str)]) {
        let items: Vec<Value> = which
            .iter()
            .map(|(ns, p)| pod_json(ns, p, &Labels::from([("pod".into(), (*p).into())])))
            .collect();
        self.sb
            .apply(&json!({"apiVersion": "v1", "kind": "List", "items": items}));
        for (ns, p) in which {
            let mut info = None;
            wait_until(
                &format!("pod {ns}/{p} ready"),
                Duration::from_secs(90),
                || {
                    let out = self.sb.kubectl(&["-n", ns, "get", "pod", p, "-o", "json"]);
                    if !out.status.success() {
                        return false;
                    }
                    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
                    if !ready(&v) {
                        return false;
                    }
                    info = Some(v);
                    true
                },
            );
            let v = info.unwrap();
            let dir = kubeovn_sandbox::state::StateDir::new(self.sb.dir.path());
            let rec = kubeovn_sandbox::kubelet::find_record(&dir, ns, p).unwrap();
            let labels: Labels =
                serde_json::from_value(v["metadata"]["labels"].clone()).unwrap_or_default();
            let pod = PodInfo {
                ns: (*ns).into(),
                name: (*p).into(),
                labels,
                ip: v["status"]["podIP"].as_str().unwrap().parse().unwrap(),
                ports: container_ports(p),
                netns: rec.netns,
            };
            self.world.pods.retain(|x| x.id() != pod.id());
            self.world.pods.push(pod);
        }
        self.world.pods.sort_by_key(PodInfo::id);
    }

    /// Probes every pair, port and protocol at once.
    fn probe(&self) -> Matrix {
        let node = PathBuf::from("/proc/self/ns/net");
        let mut jobs = Vec::new();
        let _ = self.world.matrix(|c| {
            let src = c.src.map_or("node".into(), PodInfo::id);
            let from = self.source_port(&src);
            jobs.push((
                c.src.map_or(node.clone(), |s| s.netns.clone()),
                src,
                c.dst.id(),
                SocketAddr::new(c.dst.ip, c.port),
                c.port,
                c.proto,
                from,
            ));
            false
        });
        let got: Vec<((String, String, u16, Proto), bool)> = std::thread::scope(|s| {
            let handles: Vec<_> = jobs
                .iter()
                .map(|(netns, src, dst, addr, port, proto, from)| {
                    s.spawn(move || {
                        let r = kubeovn_sandbox::transport::ask_name_from(
                            netns,
                            *addr,
                            *proto == Proto::Udp,
                            Duration::from_millis(800),
                            *from,
                        );
                        ((src.clone(), dst.clone(), *port, *proto), r.is_ok())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        Matrix(got.into_iter().collect())
    }

    /// `; ovs-vswitchd aborted N times so far` when its log shows aborts (restarted by its monitor).
    fn vswitchd_aborts(&self) -> String {
        let log = std::fs::read_to_string(self.sb.dir.path().join("ovn/vswitchd.log"))
            .unwrap_or_default();
        match log.lines().filter(|l| l.contains("|EMER|")).count() {
            0 => String::new(),
            n => format!("; ovs-vswitchd aborted {n} times so far"),
        }
    }

    /// The next source port of prober `src` (20000..=60000, then again from 20000).
    fn source_port(&self, src: &str) -> u16 {
        let mut ports = self.ports.lock().unwrap();
        let next = ports.entry(src.to_owned()).or_insert(20000);
        *next = if *next >= 60000 { 20000 } else { *next + 1 };
        *next
    }

    /// Runs `round` until it matches twice in a row (at most 20 s), flushing the datapath's flow cache after
    /// each round that does not: the seconds it took, or the last round's result.
    fn settle<T>(&self, mut round: impl FnMut() -> (bool, T)) -> Result<f64, T> {
        let t0 = Instant::now();
        let mut matched = 0;
        loop {
            let (ok, last) = round();
            if ok {
                matched += 1;
                if matched == 2 {
                    return Ok(t0.elapsed().as_secs_f64());
                }
            } else {
                matched = 0;
                self.flush_datapath();
            }
            if t0.elapsed() >= Duration::from_secs(20) {
                return Err(last);
            }
        }
    }

    /// Waits until TCP to `vip` from each pod of `want` connects or not as it says (twice in a row, at most
    /// 20 s).
    fn check_service(&self, what: &str, vip: SocketAddr, want: &[(&str, bool)]) {
        let round = || {
            let jobs: Vec<(&PodInfo, bool, u16)> = want
                .iter()
                .map(|(id, w)| {
                    let p = self.world.pods.iter().find(|p| p.id() == *id).unwrap();
                    (p, *w, self.source_port(&p.id()))
                })
                .collect();
            let got: Vec<(String, bool, bool)> = std::thread::scope(|s| {
                let hs: Vec<_> = jobs
                    .iter()
                    .map(|(p, w, from)| {
                        s.spawn(move || {
                            let r = kubeovn_sandbox::transport::ask_name_from(
                                &p.netns,
                                vip,
                                false,
                                Duration::from_millis(800),
                                *from,
                            );
                            (p.id(), *w, r.is_ok())
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            (got.iter().all(|(_, w, ok)| w == ok), got)
        };
        match self.settle(round) {
            Ok(secs) => eprintln!("scenario {what:?}: as expected after {secs:.2} s"),
            Err(last) => {
                panic!("scenario {what:?}: TCP to {vip} (pod, expected, connected): {last:?}")
            }
        }
    }

    /// Drops the datapath's cached flows, so that the next packets are translated with the OpenFlow rules of
    /// now. OVS 3.1's userspace datapath can keep serving a megaflow cached after a recirculation with the
    /// actions of rules that are gone (seen here: a peer's new connections still allowed or dropped as
    /// before an ACL change while the OpenFlow rules were already right, for as long as traffic kept the
    /// megaflow in use); the probes would then measure that cache, not the policies.
    fn flush_datapath(&self) {
        let out = std::process::Command::new("ovs-appctl")
            .arg("-t")
            .arg(self.sb.dir.path().join("ovn/vswitchd.ctl"))
            .arg("dpctl/del-flows")
            .output()
            .unwrap();
        if !out.status.success() {
            eprintln!("dpctl/del-flows: {}", String::from_utf8_lossy(&out.stderr));
        }
    }

    /// Waits until the probed matrix is the oracle's twice in a row (at most 20 s), and says how long it took;
    /// else reports the difference with what OVN holds and fails.
    fn check(&self, scenario: &str) {
        let want = self.world.expected();
        let last = match self.settle(|| {
            let got = self.probe();
            (got == want, got)
        }) {
            Ok(secs) => {
                let blocked = want.0.values().filter(|v| !**v).count();
                eprintln!(
                    "scenario {scenario:?}: as expected ({blocked} of {} blocked) after {secs:.2} s{}",
                    want.0.len(),
                    self.vswitchd_aborts()
                );
                return;
            }
            Err(last) => last,
        };
        let mut grids = String::new();
        for port in PORTS {
            for proto in PROTOS {
                let _ = writeln!(
                    grids,
                    "{port}/{proto:?} expected:\n{}got:\n{}",
                    want.grid(port, proto),
                    last.grid(port, proto)
                );
            }
        }
        // What a reader of the failure needs: the processes, and the ACLs as OVN has them.
        self.sb.run(&["status"]);
        self.sb.ko(&[
            "nbctl",
            "--format=table",
            "--columns=priority,direction,match,action,external_ids",
            "list",
            "ACL",
        ]);
        // The logical and OpenFlow flows, kept beside the temporary directory (it goes with the sandbox).
        let keep = std::env::temp_dir().join(format!("netpol-failure-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&keep);
        let mgmt = self
            .sb
            .dir
            .path()
            .join(format!("ovn/{}.mgmt", self.sb.bridge));
        let ctl = self.sb.dir.path().join("ovn/vswitchd.ctl");
        let ctl = ctl.to_str().unwrap();
        let ko = self.sb.bins.join("kubectl-ko");
        let sandbox = self.sb.dir.path().to_str().unwrap();
        let runs: [(&str, &str, Vec<String>); 4] = [
            (
                "lflows.txt",
                ko.to_str().unwrap(),
                vec![
                    "--sandbox".into(),
                    sandbox.into(),
                    "sbctl".into(),
                    "lflow-list".into(),
                ],
            ),
            (
                "openflow.txt",
                "ovs-ofctl",
                vec!["dump-flows".into(), format!("unix:{}", mgmt.display())],
            ),
            (
                "conntrack.txt",
                "ovs-appctl",
                vec![
                    "-t".into(),
                    ctl.into(),
                    "dpctl/dump-conntrack".into(),
                    "-m".into(),
                ],
            ),
            (
                "datapath.txt",
                "ovs-appctl",
                vec![
                    "-t".into(),
                    ctl.into(),
                    "dpctl/dump-flows".into(),
                    "-m".into(),
                ],
            ),
        ];
        for (file, prog, args) in runs {
            // Best effort: a tool that fails must not hide the failure being reported.
            let text = match std::process::Command::new(prog).args(&args).output() {
                Ok(out) => out.stdout,
                Err(e) => format!("{prog}: {e}\n").into_bytes(),
            };
            let _ = std::fs::write(keep.join(file), text);
        }
        eprintln!("--- logical and OpenFlow flows kept in {}", keep.display());
        for log in ["ovn/vswitchd.log", "ovn/controller.log"] {
            let text = std::fs::read_to_string(self.sb.dir.path().join(log)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!("--- {log} (last lines)");
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
        panic!(
            "scenario {scenario:?}: the matrix differs after 20 s:\n{}\n{grids}",
            last.diff(&want)
        );
    }

    /// Puts exactly these policies in force (deleting the others) and checks the matrix.
    fn scenario(&mut self, name: &str, nps: &[Value], anps: &[Value], banp: Option<Value>) {
        let key = |v: &Value| {
            (
                v["metadata"]["namespace"].as_str().unwrap_or("").to_owned(),
                v["metadata"]["name"].as_str().unwrap().to_owned(),
            )
        };
        let new_nps: BTreeMap<(String, String), Value> =
            nps.iter().map(|v| (key(v), v.clone())).collect();
        let new_anps: BTreeMap<String, Value> =
            anps.iter().map(|v| (key(v).1, v.clone())).collect();
        for (ns, n) in self.world.nps.keys() {
            if !new_nps.contains_key(&(ns.clone(), n.clone())) {
                self.kubectl_ok(&["-n", ns, "delete", "networkpolicy", n]);
            }
        }
        for n in self.world.anps.keys() {
            if !new_anps.contains_key(n) {
                self.kubectl_ok(&["delete", "adminnetworkpolicy", n]);
            }
        }
        if self.world.banp.is_some() && banp.is_none() {
            self.kubectl_ok(&["delete", "baselineadminnetworkpolicy", "default"]);
        }
        let mut items: Vec<Value> = nps.to_vec();
        items.extend(anps.iter().cloned());
        items.extend(banp.clone());
        if !items.is_empty() {
            self.sb
                .apply(&json!({"apiVersion": "v1", "kind": "List", "items": items}));
        }
        self.world.nps = new_nps;
        self.world.anps = new_anps;
        self.world.banp = banp;
        self.check(name);
    }

    /// Sets (or with None removes) label `key` of namespace `ns`, or of its pod `pod`, in the cluster and in
    /// the oracle's world.
    fn label(&mut self, ns: &str, pod: Option<&str>, key: &str, value: Option<&str>) {
        let arg = match value {
            Some(v) => format!("{key}={v}"),
            None => format!("{key}-"),
        };
        let labels = match pod {
            None => {
                self.kubectl_ok(&["label", "--overwrite", "namespace", ns, &arg]);
                self.world.namespaces.get_mut(ns).unwrap()
            }
            Some(pod) => {
                self.kubectl_ok(&["-n", ns, "label", "--overwrite", "pod", pod, &arg]);
                let p = self.world.pods.iter_mut();
                &mut p
                    .into_iter()
                    .find(|p| p.ns == ns && p.name == pod)
                    .unwrap()
                    .labels
            }
        };
        match value {
            Some(v) => labels.insert(key.into(), v.into()),
            None => labels.remove(key),
        };
    }
}

fn np(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

fn anp(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "policy.networking.k8s.io/v1alpha1", "kind": "AdminNetworkPolicy",
           "metadata": {"name": name}, "spec": spec})
}

fn banp(spec: Value) -> Value {
    json!({"apiVersion": "policy.networking.k8s.io/v1alpha1", "kind": "BaselineAdminNetworkPolicy",
           "metadata": {"name": "default"}, "spec": spec})
}

fn ns_sel(ns: &str) -> Value {
    json!({"matchLabels": {"ns": ns}})
}

fn pod_sel(pod: &str) -> Value {
    json!({"matchLabels": {"pod": pod}})
}

#[test]
fn network_policies_truth_table_in_the_sandbox() {
    if !runnable() {
        return;
    }
    let (sb, out) = up(
        "snp",
        &[
            "--no-demo",
            "--default-cidr",
            DEFAULT_CIDR,
            "--join-cidr",
            "100.96.0.0/16",
        ],
    );
    assert!(out.status.success(), "up failed");
    let mut c = Cluster {
        sb,
        world: World::default(),
        ports: Default::default(),
    };
    let namespaces: Vec<Value> = NAMESPACES
        .iter()
        .map(|ns| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {"ns": ns}}}))
        .collect();
    c.sb.apply(&json!({"apiVersion": "v1", "kind": "List", "items": namespaces}));
    for ns in NAMESPACES {
        // The API server labels each namespace with its name, as kube-apiserver does.
        let out = c.sb.kubectl(&["get", "namespace", ns, "-o", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let labels: Labels = serde_json::from_value(v["metadata"]["labels"].clone()).unwrap();
        assert_eq!(
            labels
                .get("kubernetes.io/metadata.name")
                .map(String::as_str),
            Some(ns)
        );
        c.world.namespaces.insert(ns.into(), labels);
    }
    let all: Vec<(&str, &str)> = NAMESPACES
        .iter()
        .flat_map(|ns| PODS.iter().map(move |p| (*ns, *p)))
        .collect();
    c.create_pods(&all);
    let ip = |c: &Cluster, id: &str| {
        c.world
            .pods
            .iter()
            .find(|p| p.id() == id)
            .unwrap()
            .ip
            .to_string()
    };

    c.scenario("no policy", &[], &[], None);
    c.scenario(
        "default deny ingress",
        &[np("x", "deny", json!({"podSelector": {}}))],
        &[],
        None,
    );
    c.scenario(
        "default deny egress",
        &[np(
            "x",
            "deny",
            json!({"podSelector": {}, "policyTypes": ["Egress"]}),
        )],
        &[],
        None,
    );
    c.scenario(
        "default deny both",
        &[np(
            "x",
            "deny",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        )],
        &[],
        None,
    );
    c.scenario(
        "allow from a pod selector",
        &[np(
            "x",
            "from-b",
            json!({"podSelector": pod_sel("a"), "ingress": [{"from": [{"podSelector": pod_sel("b")}]}]}),
        )],
        &[],
        None,
    );
    c.scenario(
        "allow from a namespace selector",
        &[np(
            "x",
            "from-y",
            json!({"podSelector": pod_sel("a"), "ingress": [{"from": [{"namespaceSelector": ns_sel("y")}]}]}),
        )],
        &[],
        None,
    );
    c.scenario(
        "allow from a pod and namespace selector in one peer",
        &[np(
            "x",
            "from-y-c",
            json!({"podSelector": pod_sel("a"), "ingress": [{"from": [
                {"namespaceSelector": ns_sel("y"), "podSelector": pod_sel("c")}]}]}),
        )],
        &[],
        None,
    );
    c.scenario(
        "allow from either of two peers",
        &[np(
            "x",
            "from-two",
            json!({"podSelector": pod_sel("a"), "ingress": [{"from": [
                {"namespaceSelector": ns_sel("y"), "podSelector": pod_sel("c")},
                {"podSelector": pod_sel("b")}]}]}),
        )],
        &[],
        None,
    );
    c.scenario(
        "allow from kubernetes.io/metadata.name",
        &[np(
            "x",
            "from-z",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector":
                {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["z"]}]}}]}]}),
        )],
        &[],
        None,
    );
    let yb = ip(&c, "y/b");
    c.scenario(
        "allow from an ipBlock with an except",
        &[np(
            "x",
            "cidr",
            json!({"podSelector": pod_sel("a"), "ingress": [{"from": [{"ipBlock":
                {"cidr": DEFAULT_CIDR, "except": [format!("{yb}/32")]}}]}]}),
        )],
        &[],
        None,
    );
    c.scenario(
        "allow on a port",
        &[np(
            "x",
            "port",
            json!({"podSelector": {}, "ingress": [{"ports": [{"port": 81, "protocol": "UDP"}]}]}),
        )],
        &[],
        None,
    );
    c.scenario(
        "allow on a named port, resolved per pod",
        &[np(
            "x",
            "named",
            json!({"podSelector": {}, "ingress": [{"ports": [{"port": "web"}]}]}),
        )],
        &[],
        None,
    );
    c.scenario(
        "allow on an endPort range",
        &[np(
            "x",
            "range",
            json!({"podSelector": {}, "ingress": [{"ports": [{"port": 79, "endPort": 80, "protocol": "TCP"},
                                                            {"port": 81, "endPort": 90, "protocol": "UDP"}]}]}),
        )],
        &[],
        None,
    );
    c.scenario(
        "egress to one namespace",
        &[np(
            "x",
            "to-y",
            json!({"podSelector": pod_sel("a"), "policyTypes": ["Egress"],
                   "egress": [{"to": [{"namespaceSelector": ns_sel("y")}]}]}),
        )],
        &[],
        None,
    );
    let two = [
        np(
            "y",
            "from-x",
            json!({"podSelector": pod_sel("b"), "ingress": [{"from": [{"namespaceSelector": ns_sel("x")}], "ports": [{"port": 80}]}]}),
        ),
        np(
            "y",
            "from-z",
            json!({"podSelector": pod_sel("b"), "ingress": [{"from": [{"namespaceSelector": ns_sel("z")}], "ports": [{"port": 81, "protocol": "UDP"}]}]}),
        ),
    ];
    c.scenario("two policies on one pod: their union", &two, &[], None);
    c.scenario(
        "ingress and egress together",
        &[np(
            "z",
            "both",
            json!({"podSelector": pod_sel("c"), "policyTypes": ["Ingress", "Egress"],
                   "ingress": [{"from": [{"namespaceSelector": ns_sel("x")}]}],
                   "egress": [{"to": [{"podSelector": pod_sel("a")}], "ports": [{"port": 80}]}]}),
        )],
        &[],
        None,
    );
    // Updated in place: the same policy, another peer.
    c.scenario(
        "a policy before its update",
        &[np(
            "y",
            "moving",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": ns_sel("x")}]}]}),
        )],
        &[],
        None,
    );
    let moved = np(
        "y",
        "moving",
        json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": ns_sel("z")}]}]}),
    );
    c.scenario(
        "a policy updated in place",
        std::slice::from_ref(&moved),
        &[],
        None,
    );
    // Pods relabelled into and out of a policy's selectors (subject and peer), a namespace relabelled.
    let sel = [np(
        "x",
        "blue",
        json!({"podSelector": {"matchLabels": {"color": "blue"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "t"}}, "podSelector": pod_sel("a")}]}]}),
    )];
    c.scenario("a selector matching no pod yet", &sel, &[], None);
    c.label("x", Some("b"), "color", Some("blue"));
    c.check("a pod relabelled into the subject");
    c.label("z", None, "team", Some("t"));
    c.check("a namespace relabelled into the peer");
    c.label("z", Some("a"), "pod", Some("d"));
    c.check("a pod relabelled out of the peer");
    c.label("z", Some("a"), "pod", Some("a"));
    c.label("z", None, "team", None);
    c.label("x", Some("b"), "color", None);
    c.check("relabelled back");
    // A pod created after the policy that names it: y/b again, with a new address.
    let peer = [np(
        "x",
        "from-y-b",
        json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": ns_sel("y"), "podSelector": pod_sel("b")}]}]}),
    )];
    c.scenario("before the pod is re-created", &peer, &[], None);
    c.kubectl_ok(&["-n", "y", "delete", "pod", "b", "--wait=true"]);
    c.world.pods.retain(|p| p.id() != "y/b");
    c.check("the peer pod deleted");
    c.create_pods(&[("y", "b")]);
    c.check("a pod created after the policy");
    c.scenario("policies deleted", &[], &[], None);

    // Admin policies: priorities, Pass falling through to NetworkPolicy, the baseline under NetworkPolicy.
    c.scenario(
        "an admin Deny beats a NetworkPolicy allow",
        &[np(
            "x",
            "all",
            json!({"podSelector": {}, "ingress": [{}]}),
        )],
        &[anp(
            "deny-y",
            json!({"priority": 10, "subject": {"namespaces": ns_sel("x")},
                   "ingress": [{"name": "y", "action": "Deny", "from": [{"namespaces": ns_sel("y")}]}]}),
        )],
        None,
    );
    c.scenario(
        "admin priorities: the lower number wins",
        &[],
        &[
            anp(
                "deny-y",
                json!({"priority": 10, "subject": {"namespaces": ns_sel("x")},
                       "ingress": [{"name": "y", "action": "Deny", "from": [{"namespaces": ns_sel("y")}]}]}),
            ),
            anp(
                "allow-y-a",
                json!({"priority": 5, "subject": {"namespaces": ns_sel("x")},
                       "ingress": [{"name": "y-a", "action": "Allow", "from": [{"pods": {"namespaceSelector": ns_sel("y"), "podSelector": pod_sel("a")}}],
                                    "ports": [{"portNumber": {"protocol": "TCP", "port": 80}}, {"namedPort": "serve-81-udp"}]}]}),
            ),
        ],
        None,
    );
    let pass = [
        anp(
            "pass-z",
            json!({"priority": 1, "subject": {"namespaces": ns_sel("x")},
                   "ingress": [{"name": "z", "action": "Pass", "from": [{"namespaces": ns_sel("z")}]}]}),
        ),
        anp(
            "deny-z",
            json!({"priority": 20, "subject": {"namespaces": ns_sel("x")},
                   "ingress": [{"name": "z", "action": "Deny", "from": [{"namespaces": ns_sel("z")}]},
                               {"name": "y", "action": "Deny", "from": [{"namespaces": ns_sel("y")}]}]}),
        ),
    ];
    c.scenario(
        "a Pass falls through to NetworkPolicy",
        &[np(
            "x",
            "from-z-c",
            json!({"podSelector": pod_sel("a"), "ingress": [{"from": [{"namespaceSelector": ns_sel("z"), "podSelector": pod_sel("c")}]}]}),
        )],
        &pass,
        None,
    );
    c.scenario(
        "a Pass falls through to the baseline",
        &[],
        &pass,
        Some(banp(
            json!({"subject": {"namespaces": {}},
                   "ingress": [{"name": "z-b", "action": "Deny", "from": [{"pods": {"namespaceSelector": ns_sel("z"), "podSelector": pod_sel("b")}}]}]}),
        )),
    );
    c.scenario(
        "the baseline under NetworkPolicy, and admin egress",
        &[np(
            "y",
            "from-x",
            json!({"podSelector": pod_sel("a"), "ingress": [{"from": [{"namespaceSelector": ns_sel("x")}]}]}),
        )],
        &[anp(
            "egress",
            json!({"priority": 30, "subject": {"pods": {"namespaceSelector": ns_sel("z"), "podSelector": pod_sel("c")}},
                   "egress": [{"name": "x", "action": "Deny", "to": [{"namespaces": ns_sel("x")}],
                               "ports": [{"portRange": {"protocol": "TCP", "start": 80, "end": 81}}]},
                              {"name": "net", "action": "Allow", "to": [{"networks": [format!("{}/32", ip(&c, "y/c"))]}]}]}),
        )],
        Some(banp(
            json!({"subject": {"namespaces": ns_sel("y")},
                   "ingress": [{"name": "x", "action": "Deny", "from": [{"namespaces": ns_sel("x")}]},
                               {"name": "z", "action": "Deny", "from": [{"namespaces": ns_sel("z")}]}]}),
        )),
    );
    c.scenario("everything deleted", &[], &[], None);

    // A Service is judged by the backend it is balanced to: x/a behind a ClusterIP, its ingress from y only,
    // and y/c's egress only to x. Through the ClusterIP y/b and y/c connect (y/c's egress allows x/a after
    // load balancing, not the ClusterIP), z/b and x/b do not (x/a's ingress).
    c.sb.apply(&json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "xa", "namespace": "x"},
        "spec": {"selector": {"pod": "a"}, "ports": [{"port": 8080, "targetPort": 80, "protocol": "TCP"}]}}));
    let out = c.sb.kubectl(&[
        "-n",
        "x",
        "get",
        "service",
        "xa",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ]);
    let vip = SocketAddr::new(
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap(),
        8080,
    );
    c.check_service(
        "a ClusterIP without policies",
        vip,
        &[("y/b", true), ("y/c", true), ("z/b", true), ("x/b", true)],
    );
    c.scenario(
        "policies of a Service's backend and of its clients",
        &[
            np("x", "from-y", json!({"podSelector": pod_sel("a"), "ingress": [{"from": [{"namespaceSelector": ns_sel("y")}]}]})),
            np("y", "c-to-x", json!({"podSelector": pod_sel("c"), "policyTypes": ["Egress"],
                                     "egress": [{"to": [{"namespaceSelector": ns_sel("x")}]}]})),
        ],
        &[],
        None,
    );
    c.check_service(
        "a ClusterIP judged by its backend",
        vip,
        &[("y/b", true), ("y/c", true), ("z/b", false), ("x/b", false)],
    );
    c.kubectl_ok(&["-n", "x", "delete", "service", "xa"]);
    c.scenario("policies deleted again", &[], &[], None);

    // A private Subnet: only its own block, allowSubnets (x/a) and the node reach its pods, and its pods reach
    // only those; a NetworkPolicy above it still decides for the pods it isolates.
    let xa = ip(&c, "x/a");
    c.sb.apply(&json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "p", "labels": {"ns": "p"}}},
        {"apiVersion": "kubeovn.io/v1", "kind": "Subnet", "metadata": {"name": "priv"},
         "spec": {"cidrBlock": PRIVATE_CIDR, "namespaces": ["p"], "private": true,
                  "allowSubnets": [format!("{xa}/32")]}}]}));
    let out = c.sb.kubectl(&["get", "namespace", "p", "-o", "json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    c.world.namespaces.insert(
        "p".into(),
        serde_json::from_value(v["metadata"]["labels"].clone()).unwrap(),
    );
    c.world
        .private
        .push((PRIVATE_CIDR.into(), vec![format!("{xa}/32")]));
    wait_until("subnet priv", Duration::from_secs(30), || {
        c.sb.kubectl(&["get", "subnet", "priv"]).status.success()
    });
    c.create_pods(&[("p", "a"), ("p", "b")]);
    assert!(in_cidr(ip(&c, "p/a").parse().unwrap(), PRIVATE_CIDR));
    c.check("a private subnet with allowSubnets");
    c.scenario(
        "a NetworkPolicy above a private subnet",
        &[np(
            "p",
            "from-y",
            json!({"podSelector": pod_sel("a"), "ingress": [{"from": [{"namespaceSelector": ns_sel("y")}]}]}),
        )],
        &[],
        None,
    );
    // Thousands of connections through stateful ACLs, and the datapath never aborted (the sandbox commits
    // them without OVS 3.1's all-zero SNAT).
    assert_eq!(
        c.vswitchd_aborts(),
        "",
        "ovs-vswitchd aborted during the run"
    );
}
