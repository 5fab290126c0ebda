//! The pod table and the ping matrix a sandbox prints (`kube-ovn-sandbox up|status`, `kube-ovn-pinger`):
//! endpoints built from the kubelet's records and the pods' annotations, rendered as text. The caller
//! lists the pods and the node (through its own client) and brings the ICMP probe.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::records::{all_records, PodRecord};
use crate::state::{Settings, StateDir};

/// One endpoint of the matrix: a pod (or the node).
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `namespace/name`, or `node/<name>`.
    pub label: String,
    /// Logical switch.
    pub subnet: String,
    /// First address.
    pub ip: Option<IpAddr>,
    /// MAC address.
    pub mac: String,
    /// The network namespace to ping from.
    pub netns: PathBuf,
    /// The interface to ping through.
    pub ifname: String,
}

/// A pod's or node's Kube-OVN annotation (`ovn.kubernetes.io/<key>`).
fn annotation<'a>(ann: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    ann.get(&format!("ovn.kubernetes.io/{key}"))
        .map(String::as_str)
}

/// What the matrix needs of one pod from the API: its uid, `status.podIP` and annotations.
#[derive(Debug, Clone, Copy)]
pub struct PodView<'a> {
    /// `metadata.uid`.
    pub uid: &'a str,
    /// `status.podIP`.
    pub pod_ip: Option<&'a str>,
    /// `metadata.annotations`.
    pub annotations: &'a BTreeMap<String, String>,
}

/// The matrix's endpoints: every pod of `pods` with a sandbox on any node of `dir`, in namespace/name order,
/// then the node of `settings` (given its Node's annotations).
pub fn endpoints<'a>(
    dir: &StateDir,
    settings: &Settings,
    pods: impl IntoIterator<Item = PodView<'a>>,
    node: Option<&BTreeMap<String, String>>,
) -> Vec<Endpoint> {
    let recs = all_records(dir);
    let mut out: Vec<Endpoint> = pods
        .into_iter()
        .filter_map(|p| {
            let rec = recs.iter().find(|r| r.uid == p.uid)?;
            Some(Endpoint::pod(rec, p.pod_ip, p.annotations))
        })
        .collect();
    out.sort_by(|a, b| a.label.cmp(&b.label));
    out.extend(node.map(|ann| Endpoint::node(settings, ann)));
    out
}

impl Endpoint {
    /// A pod with a sandbox `rec`, its `status.podIP` and its annotations (subnet and MAC).
    pub fn pod(rec: &PodRecord, pod_ip: Option<&str>, ann: &BTreeMap<String, String>) -> Endpoint {
        Endpoint {
            label: format!("{}/{}", rec.namespace, rec.name),
            subnet: annotation(ann, "logical_switch").unwrap_or("-").to_owned(),
            ip: pod_ip.and_then(|s| s.parse().ok()),
            mac: annotation(ann, "mac_address").unwrap_or("-").to_owned(),
            netns: rec.netns.clone(),
            ifname: rec.ifname.clone(),
        }
    }

    /// The node of `settings` through its join interface, from the Node's annotations.
    pub fn node(settings: &Settings, ann: &BTreeMap<String, String>) -> Endpoint {
        Endpoint {
            label: format!("node/{}", settings.node_name),
            subnet: format!("join ({})", settings.node_nic),
            ip: annotation(ann, "ip_address")
                .and_then(|s| s.split(',').next())
                .and_then(|s| s.parse().ok()),
            mac: annotation(ann, "mac_address").unwrap_or("-").to_owned(),
            netns: PathBuf::from("/proc/self/ns/net"),
            ifname: settings.node_nic.clone(),
        }
    }
}

/// The endpoints as a table.
pub fn table(eps: &[Endpoint]) -> String {
    let mut rows = vec![[
        "POD".to_owned(),
        "SUBNET".to_owned(),
        "IP".to_owned(),
        "MAC".to_owned(),
    ]];
    for e in eps {
        rows.push([
            e.label.clone(),
            e.subnet.clone(),
            e.ip.map(|i| i.to_string()).unwrap_or_else(|| "-".into()),
            e.mac.clone(),
        ]);
    }
    let widths: Vec<usize> = (0..4)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut s = String::new();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            s.push_str(&format!("{c:<w$}  ", w = widths[i]));
        }
        s.truncate(s.trim_end().len());
        s.push('\n');
    }
    s
}

/// How many cells off the diagonal of an `n` by `n` matrix are not `ok`.
pub fn off_diagonal_failures(n: usize, ok: impl Fn(usize, usize) -> bool) -> usize {
    (0..n)
        .flat_map(|i| (0..n).map(move |j| (i, j)))
        .filter(|&(i, j)| i != j && !ok(i, j))
        .count()
}

/// A matrix as text: short labels, `-` on the diagonal, `cell(i, j)` elsewhere.
pub fn render_grid(labels: &[String], cell: impl Fn(usize, usize) -> String) -> String {
    let short: Vec<String> = labels
        .iter()
        .map(|l| l.rsplit('/').next().unwrap_or(l).to_owned())
        .collect();
    let w = short.iter().map(String::len).max().unwrap_or(4).max(8);
    let mut s = format!("{:<w$}", "from\\to");
    for l in &short {
        s.push_str(&format!(" {l:>w$}"));
    }
    s.push('\n');
    for (i, label) in short.iter().enumerate() {
        s.push_str(&format!("{label:<w$}"));
        for j in 0..short.len() {
            let c = if i == j { "-".to_owned() } else { cell(i, j) };
            s.push_str(&format!(" {c:>w$}"));
        }
        s.push('\n');
    }
    s
}

/// The result of the matrix: `rtt[i][j]` from endpoint i to endpoint j (`None`: no reply).
#[derive(Debug, Clone)]
pub struct PingMatrix {
    /// The endpoints' labels.
    pub labels: Vec<String>,
    /// Round trips (the second echo of each pair, after ARP warmed up).
    pub rtt: Vec<Vec<Option<Duration>>>,
}

impl PingMatrix {
    /// Whether every pair answered.
    pub fn all_ok(&self) -> bool {
        self.failures() == 0
    }

    /// How many pairs failed.
    pub fn failures(&self) -> usize {
        off_diagonal_failures(self.rtt.len(), |i, j| self.rtt[i][j].is_some())
    }

    /// The matrix as text (milliseconds, `FAIL` for no reply).
    pub fn render(&self) -> String {
        render_grid(&self.labels, |i, j| match self.rtt[i][j] {
            Some(d) => format!("{:.2}ms", d.as_secs_f64() * 1e3),
            None => "FAIL".to_owned(),
        })
    }
}

/// Pings every endpoint from every other one: `probe(netns, ifname, ip, timeout)` sends one ICMP echo from
/// inside the source's namespace (kubeovn-cni's `IcmpGatewayProbe`) and returns its round trip.
pub async fn ping_matrix<F, Fut, E>(eps: &[Endpoint], timeout: Duration, probe: F) -> PingMatrix
where
    F: Fn(PathBuf, String, IpAddr, Duration) -> Fut,
    Fut: Future<Output = Result<Duration, E>>,
{
    let mut rtt = Vec::new();
    for (i, src) in eps.iter().enumerate() {
        let mut row = Vec::new();
        for (j, dst) in eps.iter().enumerate() {
            let (true, Some(ip)) = (i != j, dst.ip) else {
                row.push(None);
                continue;
            };
            let once = || probe(src.netns.clone(), src.ifname.clone(), ip, timeout);
            // The first echo also resolves the neighbour; the second one is the round trip.
            let r = match once().await {
                Ok(_) => once().await.ok(),
                Err(_) => None,
            };
            row.push(r);
        }
        rtt.push(row);
    }
    PingMatrix {
        labels: eps.iter().map(|e| e.label.clone()).collect(),
        rtt,
    }
}
