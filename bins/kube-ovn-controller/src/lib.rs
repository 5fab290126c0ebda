//! Kube-OVN controller: translates Kubernetes objects into OVN northbound state.
//!
//! A thin binary around [`kubeovn_core::controller`]: command-line flags ([`Cli`], Kube-OVN's names where
//! they exist, `--flag value` or `--flag=value`), the northbound as a reconnecting session over every
//! `--ovn-nb-addr` remote ([`connect_nb`]), logs through `kube_ovn_cmd::log` (`--log-level`,
//! `--log-format json|text`, `RUST_LOG`), and a `/metrics` endpoint.
//!
//! ```
//! let args = kube_ovn_controller::Args::parse(["--ovn-nb-addr", "unix:/tmp/nb.sock", "--default-cidr=10.17.0.0/16"])
//!     .expect("valid flags");
//! assert_eq!(args.config.default_subnet.cidr, "10.17.0.0/16");
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use kube_ovn_cmd::log::LogArgs;
use kube_ovn_cmd::metrics::MetricsEndpoint;
use kubeovn_core::controller::{Config, LeaseConfig, SessionAffinity, SubnetConfig};
use kubeovn_core::naming;
use kubeovn_ovn::northbound::{OvsdbNorthbound, NB_DB};
use kubeovn_ovn::session::{Backoff, Session};

/// The command line: a subcommand, or the controller's flags.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "kube-ovn-controller",
    version,
    about = "Kube-OVN's controller: translates Kubernetes objects into OVN northbound state",
    after_help = "REMOTE: unix:PATH, tcp:IP:PORT or ssl:IP:PORT; several (a raft cluster) comma-separated, \
                  writes go to the leader.\nRUST_LOG, when set, sets the log filter per module \
                  (e.g. RUST_LOG=info,kubeovn_ovn::session=debug)."
)]
pub struct Cli {
    /// What to do instead of running the controller.
    #[command(subcommand)]
    pub command: Option<Sub>,
    /// The controller's flags.
    #[command(flatten)]
    pub run: RunFlags,
}

/// The subcommands.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Sub {
    /// Print the CRDs' YAML (`kube-ovn-controller crd | kubectl apply -f -`)
    Crd,
}

/// How a Service's `sessionAffinity: ClientIP` is programmed (`--service-session-affinity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Affinity {
    /// selection_fields=ip_src: a client always hashes to the same backend; timeoutSeconds not applied
    Hash,
    /// options:affinity_timeout with the Service's timeoutSeconds
    Timeout,
}

/// The controller's flags.
#[derive(Debug, Clone, clap::Args)]
pub struct RunFlags {
    /// Kubeconfig (default: in-cluster, or KUBECONFIG / ~/.kube/config)
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Northbound database: REMOTE[,REMOTE...]
    #[arg(
        long = "ovn-nb-addr",
        value_name = "REMOTES",
        default_value = "tcp:127.0.0.1:6641"
    )]
    pub ovn_nb_addr: String,
    /// Southbound database: REMOTE[,REMOTE...]; a deleted node's chassis is removed from it
    #[arg(long = "ovn-sb-addr", value_name = "REMOTES")]
    pub ovn_sb_addr: Option<String>,
    /// The default subnet's name
    #[arg(long = "default-ls", value_name = "NAME", default_value = naming::DEFAULT_SUBNET)]
    pub default_ls: String,
    /// The default subnet's CIDR(s): V4, V6 or V4,V6
    #[arg(long = "default-cidr", value_name = "CIDR", default_value = naming::DEFAULT_SUBNET_CIDR)]
    pub default_cidr: String,
    /// The default subnet's gateway(s) (default: each block's first address)
    #[arg(long = "default-gateway", value_name = "IP")]
    pub default_gateway: Option<String>,
    /// Addresses the default subnet never hands out: IP or FIRST..LAST, comma-separated
    #[arg(long = "default-exclude-ips", value_name = "IPS")]
    pub default_exclude_ips: Option<String>,
    /// The join subnet's name
    #[arg(long = "node-switch", value_name = "NAME", default_value = naming::JOIN_SUBNET)]
    pub node_switch: String,
    /// The join subnet's CIDR(s)
    #[arg(long = "node-switch-cidr", value_name = "CIDR", default_value = naming::JOIN_SUBNET_CIDR)]
    pub node_switch_cidr: String,
    /// The join subnet's gateway(s) (default: each block's first address)
    #[arg(long = "node-switch-gateway", value_name = "IP")]
    pub node_switch_gateway: Option<String>,
    /// The default VPC's router
    #[arg(long = "cluster-router", value_name = "NAME", default_value = naming::DEFAULT_VPC)]
    pub cluster_router: String,
    /// Services' ClusterIP range(s): default-VPC subnets must not overlap them
    #[arg(
        long = "service-cluster-ip-range",
        value_name = "CIDR[,CIDR]",
        default_value = "10.96.0.0/12"
    )]
    pub service_cluster_ip_range: String,
    /// How sessionAffinity: ClientIP is programmed
    #[arg(
        long = "service-session-affinity",
        value_name = "MODE",
        value_enum,
        default_value = "hash"
    )]
    pub service_session_affinity: Affinity,
    /// Prometheus endpoint (default: none)
    #[arg(long = "metrics-addr", value_name = "IP:PORT")]
    pub metrics_addr: Option<SocketAddr>,
    /// Run only while holding the lease (a Lease named kube-ovn-controller)
    #[arg(
        long = "leader-elect",
        value_name = "BOOL",
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_value = "false",
        default_missing_value = "true"
    )]
    pub leader_elect: bool,
    /// The namespace of the lease
    #[arg(
        long = "lease-namespace",
        value_name = "NS",
        env = "KUBE_NAMESPACE",
        default_value = "kube-system"
    )]
    pub lease_namespace: String,
    /// This instance's identity in the lease
    #[arg(
        long = "pod-name",
        value_name = "NAME",
        env = "POD_NAME",
        default_value = "kube-ovn-controller"
    )]
    pub pod_name: String,
    /// Seconds between garbage collection passes (at least 1)
    #[arg(long = "gc-interval", value_name = "SECONDS", default_value_t = 60)]
    pub gc_interval: u64,
    /// Pod handlers running at once
    #[arg(long = "pod-workers", value_name = "N", default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    pub pod_workers: u32,
    /// Logs.
    #[command(flatten)]
    pub log: LogArgs,
}

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
    /// Logs.
    pub log: LogArgs,
}

impl Args {
    /// Parses the flags (without the program name); the error names the flag and prints as clap does
    /// (`e.exit()`: usage on stderr, status 2; `--help` and `--version` on stdout, status 0).
    pub fn parse<I, S>(flags: I) -> Result<Args, clap::Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<std::ffi::OsString> + Clone,
    {
        let argv = std::iter::once(std::ffi::OsString::from("kube-ovn-controller"))
            .chain(flags.into_iter().map(Into::into));
        Cli::try_parse_from(argv).map(Args::from)
    }
}

fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(str::to_owned)
        .collect()
}

impl From<Cli> for Args {
    fn from(cli: Cli) -> Args {
        let f = cli.run;
        let subnet = |name: String, cidr: String, gateway: Option<String>| {
            let mut s = SubnetConfig::new(name, cidr);
            s.gateway = gateway.unwrap_or_default();
            s
        };
        let mut default_subnet = subnet(f.default_ls, f.default_cidr, f.default_gateway);
        default_subnet.exclude_ips = f
            .default_exclude_ips
            .as_deref()
            .map(split_list)
            .unwrap_or_default();
        let config = Config {
            sb_remote: f.ovn_sb_addr,
            default_subnet,
            join_subnet: subnet(f.node_switch, f.node_switch_cidr, f.node_switch_gateway),
            default_vpc: f.cluster_router,
            service_cidr: f.service_cluster_ip_range,
            session_affinity: match f.service_session_affinity {
                Affinity::Hash => SessionAffinity::SourceHash,
                Affinity::Timeout => SessionAffinity::Timeout,
            },
            gc_interval: Duration::from_secs(f.gc_interval.max(1)),
            pod_workers: f.pod_workers as usize,
            lease: f
                .leader_elect
                .then(|| LeaseConfig::new(f.lease_namespace, f.pod_name)),
            ..Config::default()
        };
        Args {
            command: match cli.command {
                Some(Sub::Crd) => Command::Crd,
                None => Command::Run,
            },
            kubeconfig: f.kubeconfig,
            nb_addr: f.ovn_nb_addr,
            metrics_addr: f.metrics_addr,
            config,
            log: f.log,
        }
    }
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
        match MetricsEndpoint::bind(addr, std::sync::Arc::new(move || m.encode())).await {
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
            "--log-level=debug",
        ])
        .expect("parse");
        assert_eq!(a.command, Command::Run);
        assert_eq!(a.kubeconfig, Some(PathBuf::from("/k")));
        assert_eq!(a.nb_addr, "unix:/nb.sock");
        assert_eq!(a.config.join_subnet.cidr, "100.65.0.0/16");
        assert_eq!(a.config.join_subnet.name, "join");
        assert_eq!(a.config.default_subnet.cidr, "10.16.0.0/16");
        assert_eq!(a.config.service_cidr, "10.96.0.0/16,fd00:10:96::/112");
        assert_eq!(
            a.config.default_subnet.exclude_ips,
            ["10.16.0.2", "10.16.0.3..10.16.0.9"]
        );
        assert_eq!(a.config.lease.expect("lease").identity, "c-1");
        assert_eq!(a.log.level(), tracing::Level::DEBUG);
        assert_eq!(Args::parse(["crd"]).expect("crd").command, Command::Crd);
        // Without flags: Config's defaults, no lease.
        let d = Args::parse(Vec::<String>::new()).expect("defaults");
        let c = Config::default();
        assert_eq!(d.config.default_subnet.name, c.default_subnet.name);
        assert_eq!(d.config.default_subnet.cidr, c.default_subnet.cidr);
        assert_eq!(d.config.join_subnet.cidr, c.join_subnet.cidr);
        assert_eq!(d.config.default_vpc, c.default_vpc);
        assert_eq!(d.config.service_cidr, c.service_cidr);
        assert_eq!(d.config.pod_workers, c.pod_workers);
        assert_eq!(d.config.gc_interval, c.gc_interval);
        assert!(d.config.lease.is_none());
        assert!(Args::parse(["--leader-elect=false"])
            .expect("bool")
            .config
            .lease
            .is_none());
        // Errors name the flag.
        for (bad, flag) in [
            (vec!["--bogus"], "--bogus"),
            (vec!["--metrics-addr", "x"], "--metrics-addr"),
            (vec!["--gc-interval=soon"], "--gc-interval"),
            (
                vec!["--service-session-affinity", "sticky"],
                "--service-session-affinity",
            ),
        ] {
            let e = Args::parse(bad.clone()).expect_err("refused");
            assert!(e.to_string().contains(flag), "{bad:?}: {e}");
        }
    }

    #[test]
    fn help_per_subcommand() {
        let e = Args::parse(["crd", "--help"]).expect_err("help");
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
        assert!(e.to_string().contains("kube-ovn-controller crd"), "{e}");
        <Cli as clap::CommandFactory>::command().debug_assert();
    }
}
