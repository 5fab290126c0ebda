//! `kube-ovn-pinger`: pod-to-pod and pod-to-node reachability and latency inside a kube-ovn-sandbox. Every
//! interval it pings every pod (and the node, through its join interface) from every other one, with ICMP
//! echo from inside each pod's network namespace, and exports:
//!
//! - `kube_ovn_pinger_reachable{src,dst}`: 1 if the last echo was answered, else 0;
//! - `kube_ovn_pinger_latency_seconds{src,dst}`: the last round trip;
//! - `kube_ovn_pinger_failures_total{src,dst}`: unanswered rounds;
//! - `kube_ovn_pinger_endpoints`: pods and node pinged.
//!
//! `--once` prints the table and the matrix and exits (status 1 if a pair did not answer). `--help` lists
//! the flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use kube_ovn_cmd::log::LogArgs;
use kube_ovn_cmd::metrics::MetricsEndpoint;
use kubeovn_sandbox_state::matrix::{self, PingMatrix, PodView};
use kubeovn_sandbox_state::state::{StateDir, DEFAULT_STATE_DIR};
use kubeovn_sandbox_state::transport::in_netns;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

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

/// The pinger's flags.
#[derive(Debug, Parser)]
#[command(
    name = "kube-ovn-pinger",
    version,
    about = "Pod-to-pod and pod-to-node reachability and latency in a kube-ovn-sandbox"
)]
struct Cli {
    /// The sandbox's state directory
    #[arg(long, value_name = "DIR", env = "KUBE_OVN_SANDBOX_DIR", default_value = DEFAULT_STATE_DIR)]
    sandbox: PathBuf,
    /// Print the table and the matrix once and exit: status 1 if a pair did not answer
    #[arg(long)]
    once: bool,
    /// Prometheus endpoint
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Seconds between rounds (at least 1)
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    interval: u64,
    /// Milliseconds an echo waits for its reply (at least 10)
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    timeout: u64,
    /// Logs.
    #[command(flatten)]
    log: LogArgs,
}

struct Args {
    dir: StateDir,
    once: bool,
    listen: SocketAddr,
    interval: Duration,
    timeout: Duration,
    log: LogArgs,
}

impl From<Cli> for Args {
    fn from(c: Cli) -> Args {
        Args {
            dir: StateDir::new(c.sandbox),
            once: c.once,
            listen: c.listen,
            interval: Duration::from_secs(c.interval.max(1)),
            timeout: Duration::from_millis(c.timeout.max(10)),
            log: c.log,
        }
    }
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
    let args = Args::from(Cli::parse());
    args.log.init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kube-ovn-pinger: tokio runtime: {e}");
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
                    tracing::info!("metrics on http://{}/metrics", e.local_addr());
                    e
                }
                Err(e) => {
                    eprintln!("kube-ovn-pinger: --listen {}: {e}", args.listen);
                    return ExitCode::FAILURE;
                }
            };
        let stop = kube_ovn_cmd::shutdown_signal();
        tokio::pin!(stop);
        loop {
            match measure(&args).await {
                Ok((_, matrix)) => m.record(&matrix),
                Err(e) => tracing::warn!(error = %e, "round failed"),
            }
            tokio::select! {
                _ = tokio::time::sleep(args.interval) => {}
                _ = &mut stop => return ExitCode::SUCCESS,
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
        <Cli as clap::CommandFactory>::command().debug_assert();
        let parse = |flags: &[&str]| {
            Cli::try_parse_from(std::iter::once("kube-ovn-pinger").chain(flags.iter().copied()))
                .map(Args::from)
        };
        let a = parse(&["--sandbox", "/tmp/s", "--once", "--timeout=5"]).expect("args");
        assert!(a.once);
        assert_eq!(a.dir.root(), std::path::Path::new("/tmp/s"));
        assert_eq!(a.timeout, Duration::from_millis(10));
        let e = parse(&["--nope"]).err().expect("refused");
        assert!(e.to_string().contains("--nope"), "{e}");
        let e = parse(&["--interval", "often"]).err().expect("refused");
        assert!(e.to_string().contains("--interval"), "{e}");
    }
}
