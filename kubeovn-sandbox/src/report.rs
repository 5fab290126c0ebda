//! What `up` and `status` print: the pods with their subnets, addresses and MACs, a ping matrix measured
//! from inside each pod's network namespace (ICMP echo through the OVN logical switches and the
//! `ovn-cluster` router), plus the node through its join interface, and the same pairs over TCP and UDP
//! (kubeovn-sandbox-state's `transport`): ICMP alone passes where a datapath mangles TCP and UDP.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use kubeovn_cni::node::{GatewayProbe, IcmpGatewayProbe};

use kubeovn_sandbox_state::matrix::{self, off_diagonal_failures, render_grid};
pub use kubeovn_sandbox_state::matrix::{table, Endpoint, PingMatrix, PodView};
use kubeovn_sandbox_state::state::{Settings, StateDir};
use kubeovn_sandbox_state::transport::{self, Transport};
use kubeovn_sandbox_state::SandboxError;

/// The sandbox's pods (those with a sandbox from the kubelet), in namespace/name order.
pub async fn endpoints(
    client: &kube::Client,
    dir: &StateDir,
    settings: &Settings,
) -> Result<Vec<Endpoint>, SandboxError> {
    let pods: Api<Pod> = Api::all(client.clone());
    let list = pods
        .list(&ListParams::default())
        .await
        .map_err(|e| SandboxError::Failed {
            what: "list pods",
            detail: e.to_string(),
        })?;
    let views = list.items.iter().map(|p| PodView {
        uid: p.metadata.uid.as_deref().unwrap_or_default(),
        pod_ip: p.status.as_ref().and_then(|s| s.pod_ip.as_deref()),
        annotations: p.annotations(),
    });
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(&settings.node_name).await.ok();
    Ok(matrix::endpoints(
        dir,
        settings,
        views,
        node.as_ref().map(|n| n.annotations()),
    ))
}

/// [`matrix::ping_matrix`] with the ICMP probe of the node daemon.
pub async fn ping_matrix(eps: &[Endpoint], timeout: Duration) -> PingMatrix {
    let probe = IcmpGatewayProbe::default();
    matrix::ping_matrix(eps, timeout, |netns, ifname, ip, timeout| async move {
        probe.probe(&netns, &ifname, ip, timeout).await
    })
    .await
}

/// TCP and UDP between every pair: `cells[i][j]` from endpoint i to endpoint j (`None` on the diagonal and
/// to an endpoint without an address).
#[derive(Debug, Clone)]
pub struct TransportMatrix {
    /// The endpoints' labels.
    pub labels: Vec<String>,
    /// What each pair carried.
    pub cells: Vec<Vec<Option<Transport>>>,
}

impl TransportMatrix {
    /// Whether every pair carried TCP and UDP.
    pub fn all_ok(&self) -> bool {
        self.failures() == 0
    }

    /// How many pairs did not carry both.
    pub fn failures(&self) -> usize {
        off_diagonal_failures(self.cells.len(), |i, j| {
            self.cells[i][j].as_ref().is_some_and(Transport::ok)
        })
    }

    /// The matrix as text: `ok`, or which of TCP and UDP failed.
    pub fn render(&self) -> String {
        render_grid(&self.labels, |i, j| {
            match self.cells[i][j]
                .as_ref()
                .map(|t| (t.tcp.is_ok(), t.udp.is_ok()))
            {
                Some((true, true)) => "ok",
                Some((false, true)) => "tcp FAIL",
                Some((true, false)) => "udp FAIL",
                _ => "FAIL",
            }
            .to_owned()
        })
    }

    /// The failed pairs with the reasons, one a line.
    pub fn details(&self) -> String {
        let mut s = String::new();
        for (i, row) in self.cells.iter().enumerate() {
            for (j, c) in row.iter().enumerate() {
                let Some(t) = c else { continue };
                for e in [&t.tcp, &t.udp]
                    .into_iter()
                    .filter_map(|r| r.as_ref().err())
                {
                    s.push_str(&format!(
                        "  {} -> {}: {e}\n",
                        self.labels[i], self.labels[j]
                    ));
                }
            }
        }
        s
    }
}

/// TCP (16 KiB echoed) and UDP (a datagram echoed) from every endpoint's namespace to every other one's
/// address, `timeout` per exchange; on blocking threads.
pub async fn transport_matrix(eps: &[Endpoint], timeout: Duration) -> TransportMatrix {
    let eps = eps.to_vec();
    let labels = eps.iter().map(|e| e.label.clone()).collect();
    let cells = tokio::task::spawn_blocking(move || {
        eps.iter()
            .enumerate()
            .map(|(i, src)| {
                eps.iter()
                    .enumerate()
                    .map(|(j, dst)| {
                        let ip = dst.ip.filter(|_| i != j)?;
                        Some(transport::check(&src.netns, &dst.netns, ip, timeout))
                    })
                    .collect()
            })
            .collect()
    })
    .await
    .unwrap_or_default();
    TransportMatrix { labels, cells }
}

/// One endpoint's requests to a Service: its label, then the TCP and the UDP answers (a backend's name, or
/// why not), in order.
pub type ServiceRow = (
    String,
    Vec<Result<String, String>>,
    Vec<Result<String, String>>,
);

/// Which backends of a Service answered each endpoint's requests to its ClusterIP.
#[derive(Debug, Clone)]
pub struct ServiceReport {
    /// `namespace/name` of the Service.
    pub service: String,
    /// The VIP asked.
    pub vip: std::net::SocketAddr,
    /// Per endpoint: its label, the TCP and the UDP answers (backend name, or why not), in order.
    pub rows: Vec<ServiceRow>,
}

/// How many TCP connections and UDP requests each endpoint sends to the demo Service.
pub const SERVICE_TRIES: usize = 6;

impl ServiceReport {
    /// Whether every request was answered.
    pub fn all_ok(&self) -> bool {
        self.rows
            .iter()
            .all(|(_, t, u)| t.iter().chain(u).all(Result::is_ok))
    }

    /// The backends that answered anyone.
    pub fn backends(&self) -> std::collections::BTreeSet<String> {
        self.rows
            .iter()
            .flat_map(|(_, t, u)| t.iter().chain(u))
            .filter_map(|r| r.as_ref().ok().cloned())
            .collect()
    }

    /// One line per endpoint: `tcp: web-1 x3, web-2 x3  udp: ...`.
    pub fn render(&self) -> String {
        fn tally(v: &[Result<String, String>]) -> String {
            let mut count: std::collections::BTreeMap<&str, usize> = Default::default();
            let mut failed = None;
            for r in v {
                match r {
                    Ok(n) => *count.entry(n.as_str()).or_default() += 1,
                    Err(e) => failed = Some(e.as_str()),
                }
            }
            let mut s: Vec<String> = count.iter().map(|(n, c)| format!("{n} x{c}")).collect();
            if let Some(e) = failed {
                s.push(format!("FAIL ({e})"));
            }
            s.join(", ")
        }
        let w = self.rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (label, t, u) in &self.rows {
            out.push_str(&format!(
                "  {label:<w$}  tcp: {:<30}  udp: {}\n",
                tally(t),
                tally(u)
            ));
        }
        out
    }
}

/// Asks the Service's name servers at `vip` from every endpoint's namespace, [`SERVICE_TRIES`] times over TCP
/// and over UDP.
pub async fn service_report(
    service: &str,
    vip: std::net::SocketAddr,
    eps: &[Endpoint],
    timeout: Duration,
) -> ServiceReport {
    let eps = eps.to_vec();
    let rows = tokio::task::spawn_blocking(move || {
        eps.iter()
            .map(|e| {
                let ask = |udp| {
                    (0..SERVICE_TRIES)
                        .map(|_| transport::ask_name(&e.netns, vip, udp, timeout))
                        .collect::<Vec<_>>()
                };
                (e.label.clone(), ask(false), ask(true))
            })
            .collect()
    })
    .await
    .unwrap_or_default();
    ServiceReport {
        service: service.to_owned(),
        vip,
        rows,
    }
}

/// What `up` and `status` measured between the endpoints.
#[derive(Debug, Clone)]
pub struct Reachability {
    /// ICMP echo.
    pub ping: PingMatrix,
    /// TCP and UDP.
    pub transport: TransportMatrix,
    /// The demo Service, if there is one.
    pub service: Option<ServiceReport>,
}

impl Reachability {
    /// Whether every pair answered ping and carried TCP and UDP, and the demo Service answered everyone.
    pub fn all_ok(&self) -> bool {
        self.ping.all_ok()
            && self.transport.all_ok()
            && self.service.as_ref().is_none_or(ServiceReport::all_ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrix_counts_failures_off_the_diagonal() {
        let m = PingMatrix {
            labels: vec!["default/a".into(), "demo/b".into()],
            rtt: vec![
                vec![None, Some(Duration::from_micros(300))],
                vec![None, None],
            ],
        };
        assert!(!m.all_ok());
        assert_eq!(m.failures(), 1);
        let text = m.render();
        assert!(text.contains("0.30ms"), "{text}");
        assert!(text.contains("FAIL"), "{text}");
    }

    #[test]
    fn transport_matrix_names_what_failed() {
        let ok = || Transport {
            tcp: Ok(Duration::from_micros(500)),
            udp: Ok(Duration::from_micros(200)),
        };
        let no_tcp = Transport {
            tcp: Err("tcp 10.16.0.2:4000: timed out".into()),
            ..ok()
        };
        let m = TransportMatrix {
            labels: vec!["default/a".into(), "default/b".into(), "node/n".into()],
            cells: vec![
                vec![None, Some(ok()), Some(ok())],
                vec![Some(no_tcp), None, Some(ok())],
                // No address: a failure, not a pass.
                vec![Some(ok()), None, None],
            ],
        };
        assert_eq!(m.failures(), 2);
        assert!(!m.all_ok());
        let text = m.render();
        assert!(text.contains("tcp FAIL"), "{text}");
        assert!(text.contains(" ok"), "{text}");
        assert_eq!(
            m.details(),
            "  default/b -> default/a: tcp 10.16.0.2:4000: timed out\n"
        );
    }

    #[test]
    fn table_aligns() {
        let t = table(&[Endpoint {
            label: "default/web-1".into(),
            subnet: "ovn-default".into(),
            ip: Some("10.16.0.2".parse().expect("ip")),
            mac: "0a:00:00:10:00:03".into(),
            netns: std::path::PathBuf::new(),
            ifname: "eth0".into(),
        }]);
        assert!(t.starts_with("POD"));
        assert!(t.contains("default/web-1  ovn-default  10.16.0.2  0a:00:00:10:00:03"));
    }
}
