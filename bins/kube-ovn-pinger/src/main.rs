//! `kube-ovn-pinger`: pod-to-pod and pod-to-node reachability and latency inside a kube-ovn-sandbox. Every
//! interval it pings every pod (and the node, through its join interface) from every other one, with ICMP
//! echo from inside each pod's network namespace, and exports:
//!
//! - `kube_ovn_pinger_reachable{src,dst}`: 1 if the last echo was answered, else 0;
//! - `kube_ovn_pinger_latency_seconds{src,dst}`: the last round trip;
//! - `kube_ovn_pinger_failures_total{src,dst}`: unanswered rounds;
//! - `kube_ovn_pinger_endpoints`: pods and node pinged.
//!
//! `--once` prints the table and the matrix and exits (status 1 if a pair did not answer).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use kubeovn_ovn::metrics_http::MetricsEndpoint;
use kubeovn_sandbox_state::matrix::{self, PingMatrix, PodView};
use kubeovn_sandbox_state::state::{StateDir, DEFAULT_STATE_DIR};
use kubeovn_sandbox_state::transport::in_netns;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

const USAGE: &str =
    "usage: kube-ovn-pinger [--sandbox DIR ($KUBE_OVN_SANDBOX_DIR or /var/lib/kube-ovn-sandbox)]
  [--once] [--listen IP:PORT (127.0.0.1:8080)] [--interval SECS (10)] [--timeout MS (1000)]";

type Labels = Vec<(&'static str, String)>;

struct Metrics {
    registry: Registry,
    reachable: Family<Labels, Gauge>,
    latency: Family<Labels, Gauge<f64, AtomicU64>>,
    failures: Family<Labels, Counter>,
    endpoints: Gauge,
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("kube_ovn_pinger");
        let reachable = Family::<Labels, Gauge>::default();
        let latency = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        let failures = Family::<Labels, Counter>::default();
        let endpoints = Gauge::default();
        registry.register(
            "reachable",
            "1 if the last echo was answered",
            reachable.clone(),
        );
        registry.register("latency_seconds", "Last echo round trip", latency.clone());
        registry.register("failures", "Unanswered rounds", failures.clone());
        registry.register("endpoints", "Pods and node pinged", endpoints.clone());
        Metrics {
            registry,
            reachable,
            latency,
            failures,
            endpoints,
        }
    }

    fn record(&self, m: &PingMatrix) {
        self.endpoints.set(m.labels.len() as i64);
        for (i, row) in m.rtt.iter().enumerate() {
            for (j, cell) in row.iter().enumerate() {
                if i == j {
                    continue;
                }
                let labels: Labels =
                    vec![("src", m.labels[i].clone()), ("dst", m.labels[j].clone())];
                match cell {
                    Some(d) => {
                        self.reachable.get_or_create(&labels).set(1);
                        self.latency.get_or_create(&labels).set(d.as_secs_f64());
                    }
                    None => {
                        self.reachable.get_or_create(&labels).set(0);
                        self.failures.get_or_create(&labels).inc();
                    }
                }
            }
        }
    }

    fn render(&self) -> String {
        let mut s = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }
}

struct Args {
    dir: StateDir,
    once: bool,
    listen: SocketAddr,
    interval: Duration,
    timeout: Duration,
}

fn parse(args: Vec<String>) -> Result<Args, String> {
    let mut a = Args {
        dir: StateDir::new(
            std::env::var_os("KUBE_OVN_SANDBOX_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR)),
        ),
        once: false,
        listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
        interval: Duration::from_secs(10),
        timeout: Duration::from_millis(1000),
    };
    let mut it = args.into_iter();
    while let Some(f) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{f} needs a value"));
        match f.as_str() {
            "--sandbox" => a.dir = StateDir::new(value()?),
            "--once" => a.once = true,
            "--listen" => a.listen = value()?.parse().map_err(|e| format!("--listen: {e}"))?,
            "--interval" => {
                let s: u64 = value()?.parse().map_err(|e| format!("--interval: {e}"))?;
                a.interval = Duration::from_secs(s.max(1));
            }
            "--timeout" => {
                let ms: u64 = value()?.parse().map_err(|e| format!("--timeout: {e}"))?;
                a.timeout = Duration::from_millis(ms.max(10));
            }
            _ => return Err(USAGE.to_owned()),
        }
    }
    Ok(a)
}

/// A client of the sandbox's API server (its kubeconfig).
async fn client(kubeconfig: &std::path::Path) -> Result<kube::Client, String> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    kube::Client::try_from(cfg).map_err(|e| e.to_string())
}

/// One ICMP echo from inside `netns` (on a thread that entered it) to `ip`.
async fn ping(netns: PathBuf, ip: std::net::IpAddr, timeout: Duration) -> Result<Duration, String> {
    tokio::task::spawn_blocking(move || {
        let t0 = std::time::Instant::now();
        in_netns(&netns, || {
            kubeovn_netdev::icmp::ping(ip, timeout, Duration::from_millis(10))
                .map_err(std::io::Error::other)
        })
        .map(|_| t0.elapsed())
        .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())?
}

async fn measure(a: &Args) -> Result<(String, PingMatrix), String> {
    let settings = a.dir.load_settings().map_err(|e| e.to_string())?;
    let client = client(&a.dir.kubeconfig()).await?;
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("list pods: {e}"))?;
    let node = Api::<Node>::all(client).get(&settings.node_name).await.ok();
    let views = pods.items.iter().map(|p| PodView {
        uid: p.metadata.uid.as_deref().unwrap_or_default(),
        pod_ip: p.status.as_ref().and_then(|s| s.pod_ip.as_deref()),
        annotations: p.annotations(),
    });
    let node_annotations = node.as_ref().map(|n| n.annotations());
    let eps = matrix::endpoints(&a.dir, &settings, views, node_annotations);
    let table = matrix::table(&eps);
    let m = matrix::ping_matrix(&eps, a.timeout, |netns, _ifname, ip, timeout| {
        ping(netns, ip, timeout)
    })
    .await;
    Ok((table, m))
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1).collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kube-ovn-pinger: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        let m = Arc::new(Metrics::new());
        if args.once {
            return match measure(&args).await {
                Ok((table, matrix)) => {
                    m.record(&matrix);
                    println!("{table}\n{}", matrix.render());
                    if matrix.all_ok() {
                        println!("all pairs answered");
                        ExitCode::SUCCESS
                    } else {
                        println!("{} pairs did not answer", matrix.failures());
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("kube-ovn-pinger: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        let mr = m.clone();
        // Kept for the process's life: dropping it stops the endpoint.
        let _endpoint =
            match MetricsEndpoint::bind(args.listen, Arc::new(move || mr.render())).await {
                Ok(e) => {
                    eprintln!(
                        "kube-ovn-pinger: metrics on http://{}/metrics",
                        e.local_addr()
                    );
                    e
                }
                Err(e) => {
                    eprintln!("kube-ovn-pinger: listen {}: {e}", args.listen);
                    return ExitCode::FAILURE;
                }
            };
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("kube-ovn-pinger: {e}");
                    return ExitCode::FAILURE;
                }
            };
        loop {
            match measure(&args).await {
                Ok((_, matrix)) => m.record(&matrix),
                Err(e) => eprintln!("kube-ovn-pinger: {e}"),
            }
            tokio::select! {
                _ = tokio::time::sleep(args.interval) => {}
                _ = term.recv() => return ExitCode::SUCCESS,
                _ = tokio::signal::ctrl_c() => return ExitCode::SUCCESS,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrix_to_metrics() {
        let m = Metrics::new();
        m.record(&PingMatrix {
            labels: vec!["default/a".into(), "demo/b".into()],
            rtt: vec![
                vec![None, Some(Duration::from_micros(250))],
                vec![None, None],
            ],
        });
        let t = m.render();
        assert!(
            t.contains("kube_ovn_pinger_reachable{src=\"default/a\",dst=\"demo/b\"} 1"),
            "{t}"
        );
        assert!(
            t.contains("kube_ovn_pinger_reachable{src=\"demo/b\",dst=\"default/a\"} 0"),
            "{t}"
        );
        assert!(
            t.contains("kube_ovn_pinger_latency_seconds{src=\"default/a\",dst=\"demo/b\"} 0.00025"),
            "{t}"
        );
        assert!(
            t.contains("kube_ovn_pinger_failures_total{src=\"demo/b\",dst=\"default/a\"} 1"),
            "{t}"
        );
        assert!(t.contains("kube_ovn_pinger_endpoints 2"), "{t}");
    }

    #[test]
    fn args() {
        let a = parse(vec![
            "--sandbox".into(),
            "/tmp/s".into(),
            "--once".into(),
            "--timeout".into(),
            "5".into(),
        ])
        .expect("args");
        assert!(a.once);
        assert_eq!(a.timeout, Duration::from_millis(10));
        assert!(parse(vec!["--nope".into()]).is_err());
    }
}
