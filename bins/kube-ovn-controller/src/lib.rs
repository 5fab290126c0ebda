//! Kube-OVN controller: translates Kubernetes objects into OVN northbound state.
//!
//! A thin binary around [`kubeovn_core::controller`]: command-line flags (Kube-OVN's names where they
//! exist), the northbound as a reconnecting session over every `--ovn-nb-addr` remote ([`connect_nb`]), a
//! stderr log subscriber for `tracing`, and a `/metrics` endpoint.
//!
//! ```
//! let args = kube_ovn_controller::Args::parse(["--ovn-nb-addr", "unix:/tmp/nb.sock", "--default-cidr", "10.17.0.0/16"])
//!     .expect("valid flags");
//! assert_eq!(args.config.default_subnet.cidr, "10.17.0.0/16");
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use kubeovn_core::controller::{Config, LeaseConfig, SessionAffinity};
use kubeovn_ovn::northbound::{OvsdbNorthbound, NB_DB};
use kubeovn_ovn::session::{Backoff, Session};

/// Usage text.
pub const USAGE: &str = "usage: kube-ovn-controller [crd] [--kubeconfig FILE] [--ovn-nb-addr REMOTE[,REMOTE...]]
  [--ovn-sb-addr REMOTE[,REMOTE...]] (a deleted node's chassis is removed from it)
  [--default-ls NAME] [--default-cidr CIDR] [--default-gateway IP] [--default-exclude-ips IPS]
  [--node-switch NAME] [--node-switch-cidr CIDR] [--node-switch-gateway IP] [--cluster-router NAME]
  [--service-cluster-ip-range CIDR[,CIDR]] [--service-session-affinity hash|timeout]
  [--metrics-addr IP:PORT] [--leader-elect] [--lease-namespace NS] [--pod-name NAME]
  [--gc-interval SECONDS] [--pod-workers N] [--log-level error|warn|info|debug]
REMOTE: unix:PATH, tcp:IP:PORT or ssl:IP:PORT; several (a raft cluster) comma-separated, writes go to the leader";

/// What the binary is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Run the controller.
    Run,
    /// Print the CRD YAML (`kube-ovn-controller crd | kubectl apply -f -`).
    Crd,
}

/// Parsed flags.
#[derive(Debug, Clone)]
pub struct Args {
    /// Subcommand.
    pub command: Command,
    /// Kubeconfig (None: in-cluster or the default kubeconfig).
    pub kubeconfig: Option<PathBuf>,
    /// Northbound remotes, comma-separated.
    pub nb_addr: String,
    /// Metrics listen address (None: no metrics server).
    pub metrics_addr: Option<SocketAddr>,
    /// The controller's settings.
    pub config: Config,
    /// Log level.
    pub log_level: tracing::Level,
}

impl Args {
    /// Parses the flags (without the program name).
    pub fn parse<I, S>(args: I) -> Result<Args, String>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut a = Args {
            command: Command::Run,
            kubeconfig: None,
            nb_addr: "tcp:127.0.0.1:6641".to_owned(),
            metrics_addr: None,
            config: Config::default(),
            log_level: tracing::Level::INFO,
        };
        let mut leader = false;
        let mut lease_ns = std::env::var("KUBE_NAMESPACE").unwrap_or_else(|_| "kube-system".into());
        let mut pod_name =
            std::env::var("POD_NAME").unwrap_or_else(|_| "kube-ovn-controller".into());
        let mut it = args.into_iter().map(Into::into).peekable();
        if it.peek().map(String::as_str) == Some("crd") {
            it.next();
            a.command = Command::Crd;
        }
        while let Some(arg) = it.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) => (f.to_owned(), Some(v.to_owned())),
                None => (arg.clone(), None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| it.next())
                    .ok_or_else(|| format!("{flag} needs a value"))
            };
            let c = &mut a.config;
            match flag.as_str() {
                "--kubeconfig" => a.kubeconfig = Some(PathBuf::from(value()?)),
                "--ovn-nb-addr" => a.nb_addr = value()?,
                "--ovn-sb-addr" => c.sb_remote = Some(value()?),
                "--default-ls" => c.default_subnet.name = value()?,
                "--default-cidr" => c.default_subnet.cidr = value()?,
                "--default-gateway" => c.default_subnet.gateway = value()?,
                "--default-exclude-ips" => {
                    c.default_subnet.exclude_ips = split_list(&value()?);
                }
                "--node-switch" => c.join_subnet.name = value()?,
                "--node-switch-cidr" => c.join_subnet.cidr = value()?,
                "--node-switch-gateway" => c.join_subnet.gateway = value()?,
                "--cluster-router" => c.default_vpc = value()?,
                "--service-cluster-ip-range" => c.service_cidr = value()?,
                "--service-session-affinity" => {
                    c.session_affinity = match value()?.as_str() {
                        "hash" => SessionAffinity::SourceHash,
                        "timeout" => SessionAffinity::Timeout,
                        v => {
                            return Err(format!(
                                "--service-session-affinity: {v:?} is not hash or timeout"
                            ))
                        }
                    }
                }
                "--metrics-addr" => {
                    a.metrics_addr = Some(
                        value()?
                            .parse()
                            .map_err(|e| format!("--metrics-addr: {e}"))?,
                    )
                }
                "--leader-elect" => leader = inline.as_deref().is_none_or(|v| v == "true"),
                "--lease-namespace" => lease_ns = value()?,
                "--pod-name" => pod_name = value()?,
                "--gc-interval" => {
                    let s: u64 = value()?
                        .parse()
                        .map_err(|e| format!("--gc-interval: {e}"))?;
                    c.gc_interval = Duration::from_secs(s.max(1));
                }
                "--pod-workers" => {
                    c.pod_workers = value()?
                        .parse()
                        .map_err(|e| format!("--pod-workers: {e}"))?;
                }
                "--log-level" => {
                    a.log_level = value()?.parse().map_err(|e| format!("--log-level: {e}"))?;
                }
                "-h" | "--help" => return Err(USAGE.to_owned()),
                other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
            }
        }
        if leader {
            a.config.lease = Some(LeaseConfig::new(lease_ns, pod_name));
        }
        Ok(a)
    }
}

fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A `tracing` subscriber printing events on stderr (spans are ignored); other crates' events only from
/// WARN up.
#[derive(Debug)]
pub struct StderrLog {
    level: tracing::Level,
}

impl StderrLog {
    /// Installs the subscriber globally.
    pub fn install(level: tracing::Level) {
        let _ = tracing::subscriber::set_global_default(StderrLog { level });
    }
}

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        if field.name() == "message" {
            let _ = write!(self.0, " {value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        use std::fmt::Write;
        if field.name() == "message" {
            let _ = write!(self.0, " {value}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

impl tracing::Subscriber for StderrLog {
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        let ours = m.target().starts_with("kubeovn") || m.target().starts_with("kube_ovn");
        let max = if ours {
            self.level
        } else {
            tracing::Level::WARN.min(self.level)
        };
        m.is_event() && *m.level() <= max
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        let mut f = Fields(String::new());
        e.record(&mut f);
        let now = k8s_openapi::jiff::Timestamp::now();
        eprintln!(
            "{now} {} {}:{}",
            e.metadata().level(),
            e.metadata().target(),
            f.0
        );
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Why the binary stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Kubernetes client configuration.
    #[error("kubernetes client: {0}")]
    Kube(String),
    /// The controller stopped with an error.
    #[error(transparent)]
    Controller(#[from] kubeovn_core::controller::ControllerError),
}

/// A client from `--kubeconfig`, or in-cluster / the default kubeconfig.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, Error> {
    let config = match kubeconfig {
        Some(p) => {
            let kc =
                kube::config::Kubeconfig::read_from(p).map_err(|e| Error::Kube(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| Error::Kube(e.to_string()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| Error::Kube(e.to_string()))?,
    };
    kube::Client::try_from(config).map_err(|e| Error::Kube(e.to_string()))
}

/// The reconnect backoff towards the northbound: short enough that work waiting on a restarted northbound
/// resumes within seconds of its return.
pub const NB_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(2),
    factor: 2,
};

/// The northbound over a reconnecting session on every remote of `addr` (comma-separated: the members of a
/// raft cluster), writing to the leader only; the replica resumes after each reconnect.
pub async fn connect_nb(addr: &str) -> Result<OvsdbNorthbound, kubeovn_ovn::Error> {
    let session = Session::builder(addr)?
        .backoff(NB_BACKOFF)
        .leader_only(NB_DB)
        .connect()
        .await?;
    OvsdbNorthbound::with_session(session, &[]).await
}

/// Runs the controller as the binary does, until `shutdown`.
pub async fn run(
    args: Args,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), Error> {
    let client = client(args.kubeconfig.as_deref()).await?;
    // The northbound replica fills while the controller lists from Kubernetes.
    let nb_addr = args.nb_addr.clone();
    let nb = async move {
        let nb = connect_nb(&nb_addr).await.map_err(|source| {
            tracing::error!(addr = %nb_addr, error = %source, "northbound connection");
            source
        })?;
        Ok(std::sync::Arc::new(nb) as std::sync::Arc<dyn kubeovn_ovn::northbound::Northbound>)
    };
    let controller = kubeovn_core::controller::Controller::connecting(client, nb, args.config);
    // Kept until the controller stops: dropping it stops the endpoint.
    let mut _metrics = None;
    if let Some(addr) = args.metrics_addr {
        let m = controller.metrics();
        match kubeovn_ovn::metrics_http::MetricsEndpoint::bind(
            addr,
            std::sync::Arc::new(move || m.encode()),
        )
        .await
        {
            Ok(e) => _metrics = Some(e),
            Err(e) => tracing::error!(%addr, error = %e, "metrics server"),
        }
    }
    let r = controller.run(shutdown).await;
    Ok(r?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        let a = Args::parse([
            "--kubeconfig=/k",
            "--ovn-nb-addr",
            "unix:/nb.sock",
            "--node-switch-cidr",
            "100.65.0.0/16",
            "--service-cluster-ip-range=10.96.0.0/16,fd00:10:96::/112",
            "--default-exclude-ips",
            "10.16.0.2,10.16.0.3..10.16.0.9",
            "--leader-elect",
            "--pod-name",
            "c-1",
            "--metrics-addr",
            "127.0.0.1:10660",
        ])
        .expect("parse");
        assert_eq!(a.command, Command::Run);
        assert_eq!(a.kubeconfig, Some(PathBuf::from("/k")));
        assert_eq!(a.nb_addr, "unix:/nb.sock");
        assert_eq!(a.config.join_subnet.cidr, "100.65.0.0/16");
        assert_eq!(a.config.service_cidr, "10.96.0.0/16,fd00:10:96::/112");
        assert_eq!(
            a.config.default_subnet.exclude_ips,
            ["10.16.0.2", "10.16.0.3..10.16.0.9"]
        );
        assert_eq!(a.config.lease.expect("lease").identity, "c-1");
        assert_eq!(Args::parse(["crd"]).expect("crd").command, Command::Crd);
        assert!(Args::parse(["--bogus"]).is_err());
        assert!(Args::parse(["--metrics-addr", "x"]).is_err());
    }
}
