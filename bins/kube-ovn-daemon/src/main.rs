//! `kube-ovn-daemon`: the node daemon binary. Connects to the Open_vSwitch database, runs node start, and
//! serves the CNI shim on its unix socket until SIGTERM/SIGINT. The daemon itself is kubeovn-cni's `node`
//! module; this binary parses the flags (`--help`) and composes it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{CommandFactory, Parser};
use ipnetwork::IpNetwork;
use kube_ovn_cmd::log::LogArgs;
use kubeovn_cni::node::{
    Daemon, DaemonConfig, DaemonError, HandlerConfig, KubePodNetworks, NodeConfig,
    PodNetworkSource, StaticPodNetworks,
};
use kubeovn_netdev::NetlinkNetdev;
use kubeovn_ovn::vswitch::OvsdbOpenVSwitch;

/// Why the binary stopped: a bad flag, or the daemon.
#[derive(Debug, thiserror::Error)]
enum Error {
    /// A command-line argument is wrong.
    #[error("invalid argument: {0}")]
    Args(String),
    /// The daemon failed.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
}

/// The metrics address, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Listen(Option<SocketAddr>);

fn listen(v: &str) -> Result<Listen, String> {
    if v == "none" {
        return Ok(Listen(None));
    }
    v.parse()
        .map(|a| Listen(Some(a)))
        .map_err(|e| format!("{e} (IP:PORT or none)"))
}

/// Where pods' network data comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PodSource {
    /// This node's pods' annotations, from the API.
    Kube,
    /// A JSON table ([`StaticPodNetworks::from_json`]).
    Static(PathBuf),
}

fn pod_source(v: &str) -> Result<PodSource, String> {
    match v.strip_prefix("static:") {
        _ if v == "kube" => Ok(PodSource::Kube),
        Some(f) if !f.is_empty() => Ok(PodSource::Static(f.into())),
        _ => Err("kube or static:FILE".into()),
    }
}

/// Comma-separated CIDRs (empty items ignored).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cidrs(Vec<IpNetwork>);

fn cidrs(v: &str) -> Result<Cidrs, String> {
    v.split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(|c| c.parse().map_err(|e| format!("{c}: {e}")))
        .collect::<Result<_, _>>()
        .map(Cidrs)
}

/// Seconds in [0, 3600], fractions allowed.
fn secs(v: &str) -> Result<Duration, String> {
    let s: f64 = v
        .parse()
        .map_err(|_| "not a number of seconds".to_owned())?;
    if !(0.0..=3600.0).contains(&s) {
        return Err("out of [0, 3600]".into());
    }
    Ok(Duration::from_secs_f64(s))
}

/// The node daemon's flags.
#[derive(Debug, Parser)]
#[command(
    name = "kube-ovn-daemon",
    version,
    about = "Kube-OVN's node daemon: serves the CNI shim on a unix socket and plugs pods into OVN",
    after_help = "RUST_LOG, when set, sets the log filter per module (e.g. RUST_LOG=info,kubeovn_cni=debug)."
)]
struct Opts {
    /// This node's name [required]
    #[arg(long = "node-name", value_name = "NAME", env = "KUBE_NODE_NAME")]
    node_name: Option<String>,
    /// The CNI socket the shim talks to
    #[arg(
        long = "socket",
        alias = "bind-socket",
        value_name = "PATH",
        default_value = kubeovn_cni::daemon::DEFAULT_SOCKET
    )]
    socket: PathBuf,
    /// Prometheus endpoint, or none
    #[arg(long = "metrics-addr", value_name = "IP:PORT|none", default_value = "127.0.0.1:10665", value_parser = listen)]
    metrics_addr: Listen,
    /// The Open_vSwitch database
    #[arg(
        long = "ovs-remote",
        value_name = "REMOTE",
        default_value = "unix:/run/openvswitch/db.sock"
    )]
    ovs_remote: String,
    /// The southbound database for ovn-controller (external_ids:ovn-remote); required for node start
    #[arg(
        long = "ovn-remote",
        value_name = "REMOTE",
        required_unless_present = "no_node_init"
    )]
    ovn_remote: Option<String>,
    /// The integration bridge
    #[arg(long, value_name = "NAME", default_value = "br-int")]
    bridge: String,
    /// The bridge's datapath: system or netdev (userspace)
    #[arg(long = "datapath-type", value_name = "TYPE", default_value = "system")]
    datapath_type: String,
    /// Tunnel type: geneve, vxlan or stt
    #[arg(long = "encap-type", value_name = "TYPE", default_value = "geneve")]
    encap_type: String,
    /// Tunnel endpoint (Kube-OVN's daemon takes the pod's POD_IP)
    #[arg(
        long = "encap-ip",
        value_name = "IP",
        env = "POD_IP",
        default_value = "127.0.0.1"
    )]
    encap_ip: String,
    /// Pod and join interface MTU
    #[arg(long, value_name = "N", default_value_t = 1400, value_parser = clap::value_parser!(u32).range(68..=65535))]
    mtu: u32,
    /// The join interface
    #[arg(long = "node-nic", value_name = "NAME", default_value = kubeovn_core::naming::NODE_NIC)]
    node_nic: String,
    /// The node's network namespace, where ovs-vswitchd runs and the join interface, routes and pods' host
    /// ends live (default: this process's)
    #[arg(long, value_name = "PATH")]
    netns: Option<PathBuf>,
    /// CIDRs routed through the join gateway besides the default VPC's subnets
    #[arg(long = "pod-cidrs", value_name = "CIDR[,CIDR]", value_parser = cidrs)]
    pod_cidrs: Vec<Cidrs>,
    /// Services' ClusterIPs, routed through the join gateway too: the node reaches them through the join
    /// switch's load balancers
    #[arg(long = "service-cluster-ip-range", value_name = "CIDR[,CIDR]", value_parser = cidrs)]
    service_cidrs: Vec<Cidrs>,
    /// Pods' network data: kube (this node's pods' annotations) or static:FILE (a JSON table)
    #[arg(long = "pod-source", value_name = "kube|static:FILE", default_value = "kube", value_parser = pod_source)]
    pod_source: PodSource,
    /// Kubeconfig (default: KUBECONFIG, ~/.kube/config or in-cluster)
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// Seconds an ADD waits for the pod's address and routes
    #[arg(long = "pod-network-timeout", value_name = "SECS", default_value = "30", value_parser = secs)]
    pod_network_timeout: Duration,
    /// Seconds an ADD waits for ovn-installed, 0: no wait
    #[arg(long = "ovn-installed-timeout", value_name = "SECS", default_value = "20", value_parser = secs)]
    ovn_installed_timeout: Duration,
    /// Seconds an ADD waits for the gateway to answer, 0: no check
    #[arg(long = "gateway-check-timeout", value_name = "SECS", default_value = "10", value_parser = secs)]
    gateway_check_timeout: Duration,
    /// Leave chassis settings, bridge and join port alone
    #[arg(long = "no-node-init")]
    no_node_init: bool,
    /// Keep IPv6 (link-local) on the interfaces of IPv4-only pods
    #[arg(long = "ipv6-on-ipv4-pods")]
    ipv6_on_ipv4_pods: bool,
    /// Leave TX checksum offload on on pod interfaces (TCP and UDP then fail on the userspace datapath,
    /// which forwards a veth's partial checksums)
    #[arg(long = "keep-pod-tx-checksum")]
    keep_pod_tx_checksum: bool,
    /// Logs.
    #[command(flatten)]
    log: LogArgs,
}

impl Opts {
    /// This node's name: `--node-name`, `KUBE_NODE_NAME` or `NODE_NAME`.
    fn node(&self) -> Result<String, clap::Error> {
        self.node_name
            .clone()
            .or_else(|| std::env::var("NODE_NAME").ok())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                Opts::command().error(
                    clap::error::ErrorKind::MissingRequiredArgument,
                    "--node-name <NAME> (or KUBE_NODE_NAME) is required",
                )
            })
    }

    /// The CIDRs of `--pod-cidrs` and `--service-cluster-ip-range`, each once.
    fn routed_cidrs(&self) -> Vec<IpNetwork> {
        let mut out: Vec<IpNetwork> = Vec::new();
        for c in self
            .pod_cidrs
            .iter()
            .chain(&self.service_cidrs)
            .flat_map(|c| &c.0)
        {
            if !out.contains(c) {
                out.push(*c);
            }
        }
        out
    }
}

/// A timeout where 0 means none.
fn optional(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

/// Loads the static pod table at `path` ([`StaticPodNetworks::from_json`]).
fn load_static(path: &std::path::Path) -> Result<StaticPodNetworks, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| DaemonError::Io {
        what: "read pod table",
        path: path.into(),
        source: e,
    })?;
    StaticPodNetworks::from_json(&text)
        .map_err(|e| Error::Args(format!("--pod-source {}: {e}", path.display())))
}

async fn kube_client(o: &Opts) -> Result<kube::Client, DaemonError> {
    let kerr = |e: String| DaemonError::Kube(e);
    let cfg = match &o.kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p).map_err(|e| kerr(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| kerr(e.to_string()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| kerr(e.to_string()))?,
    };
    kube::Client::try_from(cfg).map_err(|e| kerr(e.to_string()))
}

async fn run(o: Opts, node: String) -> Result<(), Error> {
    let ovs = Arc::new(
        OvsdbOpenVSwitch::connect(&o.ovs_remote)
            .await
            .map_err(DaemonError::from)?,
    );
    // The node's links and routes: in its own namespace when it has one (a sandbox node on a shared
    // machine), this process's otherwise.
    let host = Arc::new(
        match &o.netns {
            Some(p) => NetlinkNetdev::open(p),
            None => NetlinkNetdev::current(),
        }
        .map_err(DaemonError::from)?,
    );
    let mut client = None;
    let source: Arc<dyn PodNetworkSource> = match &o.pod_source {
        PodSource::Kube => {
            let c = kube_client(&o).await?;
            let s = KubePodNetworks::start(c.clone(), &node);
            if !s.wait_ready(Duration::from_secs(30)).await {
                tracing::warn!("pod cache not synced yet; STATUS answers 50 until it is");
            }
            client = Some(c);
            Arc::new(s)
        }
        PodSource::Static(path) => Arc::new(load_static(path)?),
    };
    let node_start = (!o.no_node_init).then(|| {
        let mut cfg = NodeConfig::new(&node, o.ovn_remote.clone().unwrap_or_default());
        cfg.bridge = o.bridge.clone();
        cfg.datapath_type = o.datapath_type.clone();
        cfg.encap_type = o.encap_type.clone();
        cfg.encap_ip = o.encap_ip.clone();
        cfg.mtu = o.mtu;
        cfg.nic = o.node_nic.clone();
        cfg
    });
    let cfg = DaemonConfig {
        socket: o.socket.clone(),
        metrics_addr: o.metrics_addr.0,
        handler: HandlerConfig {
            bridge: o.bridge.clone(),
            mtu: o.mtu,
            // 0 answers at once (1 ms) when the pod's network is not there yet.
            pod_network_timeout: optional(o.pod_network_timeout)
                .unwrap_or(Duration::from_millis(1)),
            ovn_installed_timeout: optional(o.ovn_installed_timeout),
            gateway_timeout: optional(o.gateway_check_timeout),
            ipv4_only_no_ipv6: !o.ipv6_on_ipv4_pods,
            pod_tx_checksum_off: !o.keep_pod_tx_checksum,
        },
        node_start,
        pod_cidrs: o.routed_cidrs(),
    };
    let mut daemon = Daemon::new(cfg, host, ovs, source);
    if let Some(c) = client {
        daemon = daemon.kube(c);
    }
    let running = daemon.start().await?;
    tracing::info!(
        %node,
        socket = %o.socket.display(),
        metrics = ?running.metrics_addr(),
        "serving"
    );
    kube_ovn_cmd::shutdown_signal().await;
    running.shutdown().await;
    Ok(())
}

fn main() -> ExitCode {
    let opts = Opts::parse();
    let node = match opts.node() {
        Ok(n) => n,
        Err(e) => e.exit(),
    };
    opts.log.init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kube-ovn-daemon: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(opts, node)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kube-ovn-daemon: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(flags: &[&str]) -> Result<Opts, clap::Error> {
        Opts::try_parse_from(std::iter::once("kube-ovn-daemon").chain(flags.iter().copied()))
    }

    #[test]
    fn flags() {
        Opts::command().debug_assert();
        let o = parse(&[
            "--node-name=n1",
            "--ovn-remote",
            "tcp:192.0.2.1:6642",
            "--mtu=1450",
            "--metrics-addr",
            "none",
            "--pod-cidrs=10.16.0.0/16,,10.17.0.0/16",
            "--service-cluster-ip-range",
            "10.96.0.0/12,10.16.0.0/16",
            "--pod-source=static:/tmp/pods.json",
            "--gateway-check-timeout",
            "0",
            "--pod-network-timeout=2.5",
            "--keep-pod-tx-checksum",
        ])
        .expect("flags");
        assert_eq!(o.node().expect("node"), "n1");
        assert_eq!(o.mtu, 1450);
        assert_eq!(o.metrics_addr, Listen(None));
        let cidrs: Vec<String> = o.routed_cidrs().iter().map(ToString::to_string).collect();
        assert_eq!(cidrs, ["10.16.0.0/16", "10.17.0.0/16", "10.96.0.0/12"]);
        assert_eq!(o.pod_source, PodSource::Static("/tmp/pods.json".into()));
        assert_eq!(optional(o.gateway_check_timeout), None);
        assert_eq!(o.pod_network_timeout, Duration::from_millis(2500));
        assert!(o.keep_pod_tx_checksum && !o.no_node_init);
        let d = parse(&["--no-node-init"]).expect("defaults");
        assert_eq!(
            d.metrics_addr,
            Listen(Some(SocketAddr::from(([127, 0, 0, 1], 10665))))
        );
        assert_eq!(d.socket, PathBuf::from(kubeovn_cni::daemon::DEFAULT_SOCKET));
        assert_eq!(d.pod_source, PodSource::Kube);
        assert_eq!(
            optional(d.ovn_installed_timeout),
            Some(Duration::from_secs(20))
        );
        // Errors name the flag.
        for (bad, flag) in [
            (vec!["--node-name", "n1", "--mtu", "9"], "--mtu"),
            (
                vec!["--node-name", "n1", "--pod-source", "etcd"],
                "--pod-source",
            ),
            (vec!["--node-name", "n1"], "--ovn-remote"),
            (
                vec!["--no-node-init", "--pod-cidrs", "10.0.0.0/33"],
                "--pod-cidrs",
            ),
            (
                vec!["--no-node-init", "--ovn-installed-timeout=-1"],
                "--ovn-installed-timeout",
            ),
            (
                vec!["--no-node-init", "--metrics-addr", "here"],
                "--metrics-addr",
            ),
        ] {
            let e = parse(&bad).expect_err("refused");
            assert_eq!(e.exit_code(), 2);
            assert!(e.to_string().contains(flag), "{bad:?}: {e}");
        }
    }
}
