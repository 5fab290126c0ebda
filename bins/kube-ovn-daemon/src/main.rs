//! `kube-ovn-daemon`: the node daemon binary. Connects to the Open_vSwitch database, runs node start, and
//! serves the CNI shim on its unix socket until SIGTERM/SIGINT.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kubeovn_cni::node::{
    Daemon, DaemonConfig, DaemonError, HandlerConfig, KubePodNetworks, NodeConfig,
    PodNetworkSource, StaticPodNetworks,
};
use kubeovn_netdev::NetlinkNetdev;
use kubeovn_ovn::vswitch::OvsdbOpenVSwitch;

const USAGE: &str = "usage: kube-ovn-daemon --node-name NAME [options]
  --socket PATH                  CNI socket (default /run/openvswitch/kube-ovn-daemon.sock)
  --metrics-addr ADDR|none       Prometheus endpoint (default 127.0.0.1:10665)
  --ovs-remote REMOTE            Open_vSwitch database (default unix:/run/openvswitch/db.sock)
  --ovn-remote REMOTE            southbound database for ovn-controller (external_ids:ovn-remote)
  --bridge NAME                  integration bridge (default br-int)
  --datapath-type TYPE           system or netdev (default system)
  --encap-type TYPE              geneve, vxlan or stt (default geneve)
  --encap-ip IP                  tunnel endpoint (default 127.0.0.1)
  --mtu N                        pod and join interface MTU (default 1400)
  --node-nic NAME                join interface (default ovn0)
  --netns PATH                   the node's network namespace, where ovs-vswitchd runs and the join
                                 interface, routes and pods' host ends live (default: this process's)
  --pod-cidrs CIDR[,CIDR]        routed through the join gateway besides the default VPC's subnets
  --service-cluster-ip-range CIDR[,CIDR]
                                 Services' ClusterIPs, routed through the join gateway too: the node reaches
                                 them through the join switch's load balancers
  --pod-source kube|static:FILE  pods' network data (default kube: this node's pods' annotations)
  --kubeconfig PATH              kubeconfig (default: KUBECONFIG, ~/.kube/config or in-cluster)
  --pod-network-timeout SECS     wait for allocated/routed (default 30)
  --ovn-installed-timeout SECS   wait for ovn-installed, 0 = no wait (default 20)
  --gateway-check-timeout SECS   wait for the gateway to answer, 0 = no check (default 10)
  --no-node-init                 leave chassis settings, bridge and join port alone
  --ipv6-on-ipv4-pods            keep IPv6 (link-local) on the interfaces of IPv4-only pods
  --keep-pod-tx-checksum         leave TX checksum offload on on pod interfaces (TCP and UDP then fail on
                                 the userspace datapath, which forwards a veth's partial checksums)";

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

struct Opts {
    node: String,
    socket: PathBuf,
    metrics: Option<SocketAddr>,
    ovs_remote: String,
    ovn_remote: Option<String>,
    bridge: String,
    datapath_type: String,
    encap_type: String,
    encap_ip: String,
    mtu: u32,
    nic: String,
    netns: Option<PathBuf>,
    pod_cidrs: Vec<ipnetwork::IpNetwork>,
    pod_source: String,
    kubeconfig: Option<PathBuf>,
    pod_network_timeout: Duration,
    ovn_installed_timeout: Option<Duration>,
    gateway_timeout: Option<Duration>,
    node_init: bool,
    ipv4_only_no_ipv6: bool,
    pod_tx_checksum_off: bool,
}

fn parse_args(args: impl Iterator<Item = String>) -> Result<Opts, Error> {
    let bad = |m: String| Error::Args(m);
    let mut o = Opts {
        node: std::env::var("KUBE_NODE_NAME")
            .or_else(|_| std::env::var("NODE_NAME"))
            .unwrap_or_default(),
        socket: kubeovn_cni::daemon::DEFAULT_SOCKET.into(),
        metrics: Some(SocketAddr::from(([127, 0, 0, 1], 10665))),
        ovs_remote: "unix:/run/openvswitch/db.sock".into(),
        ovn_remote: None,
        bridge: "br-int".into(),
        datapath_type: "system".into(),
        encap_type: "geneve".into(),
        encap_ip: "127.0.0.1".into(),
        mtu: 1400,
        nic: kubeovn_core::naming::NODE_NIC.into(),
        netns: None,
        pod_cidrs: Vec::new(),
        pod_source: "kube".into(),
        kubeconfig: None,
        pod_network_timeout: Duration::from_secs(30),
        ovn_installed_timeout: Some(Duration::from_secs(20)),
        gateway_timeout: Some(Duration::from_secs(10)),
        node_init: true,
        ipv4_only_no_ipv6: true,
        pod_tx_checksum_off: true,
    };
    let mut it = args;
    while let Some(flag) = it.next() {
        if flag == "--no-node-init" {
            o.node_init = false;
            continue;
        }
        if flag == "--ipv6-on-ipv4-pods" {
            o.ipv4_only_no_ipv6 = false;
            continue;
        }
        if flag == "--keep-pod-tx-checksum" {
            o.pod_tx_checksum_off = false;
            continue;
        }
        if flag == "-h" || flag == "--help" {
            return Err(bad(USAGE.into()));
        }
        let v = it
            .next()
            .ok_or_else(|| bad(format!("{flag} needs a value")))?;
        let secs = |v: &str| -> Result<Option<Duration>, Error> {
            let s: f64 = v
                .parse()
                .map_err(|_| bad(format!("{flag}: not a number of seconds: {v}")))?;
            if !(0.0..=3600.0).contains(&s) {
                return Err(bad(format!("{flag}: {v} out of [0, 3600]")));
            }
            Ok((s > 0.0).then(|| Duration::from_secs_f64(s)))
        };
        match flag.as_str() {
            "--node-name" => o.node = v,
            "--socket" => o.socket = v.into(),
            "--metrics-addr" => {
                o.metrics = if v == "none" {
                    None
                } else {
                    Some(v.parse().map_err(|_| bad(format!("bad address {v}")))?)
                }
            }
            "--ovs-remote" => o.ovs_remote = v,
            "--ovn-remote" => o.ovn_remote = Some(v),
            "--bridge" => o.bridge = v,
            "--datapath-type" => o.datapath_type = v,
            "--encap-type" => o.encap_type = v,
            "--encap-ip" => o.encap_ip = v,
            "--mtu" => {
                o.mtu = v
                    .parse()
                    .ok()
                    .filter(|m| (68..=65535).contains(m))
                    .ok_or_else(|| bad(format!("bad MTU {v}")))?
            }
            "--node-nic" => o.nic = v,
            "--netns" => o.netns = Some(v.into()),
            "--pod-cidrs" | "--service-cluster-ip-range" => {
                for s in v.split(',').filter(|s| !s.is_empty()) {
                    let c = s
                        .parse()
                        .map_err(|_| bad(format!("{flag}: bad CIDR {s}")))?;
                    if !o.pod_cidrs.contains(&c) {
                        o.pod_cidrs.push(c);
                    }
                }
            }
            "--pod-source" => o.pod_source = v,
            "--kubeconfig" => o.kubeconfig = Some(v.into()),
            "--pod-network-timeout" => {
                o.pod_network_timeout = secs(&v)?.unwrap_or(Duration::from_millis(1))
            }
            "--ovn-installed-timeout" => o.ovn_installed_timeout = secs(&v)?,
            "--gateway-check-timeout" => o.gateway_timeout = secs(&v)?,
            _ => return Err(bad(format!("unknown flag {flag}\n{USAGE}"))),
        }
    }
    if o.node.is_empty() {
        return Err(bad(format!(
            "--node-name (or KUBE_NODE_NAME) is required\n{USAGE}"
        )));
    }
    if o.pod_source != "kube" && !o.pod_source.starts_with("static:") {
        return Err(bad(format!(
            "--pod-source must be kube or static:FILE, not {}",
            o.pod_source
        )));
    }
    if o.node_init && o.ovn_remote.is_none() {
        return Err(bad(
            "--ovn-remote is required for node start (or --no-node-init)".into(),
        ));
    }
    Ok(o)
}

/// Loads the static pod table at `path` ([`StaticPodNetworks::from_json`]).
fn load_static(path: &str) -> Result<StaticPodNetworks, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| DaemonError::Io {
        what: "read pod table",
        path: path.into(),
        source: e,
    })?;
    StaticPodNetworks::from_json(&text).map_err(|e| Error::Args(format!("{path}: {e}")))
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

async fn run(o: Opts) -> Result<(), Error> {
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
    let source: Arc<dyn PodNetworkSource> = if o.pod_source == "kube" {
        let c = kube_client(&o).await?;
        let s = KubePodNetworks::start(c.clone(), &o.node);
        if !s.wait_ready(Duration::from_secs(30)).await {
            eprintln!("kube-ovn-daemon: pod cache not synced yet; STATUS answers 50 until it is");
        }
        client = Some(c);
        Arc::new(s)
    } else {
        Arc::new(load_static(o.pod_source.trim_start_matches("static:"))?)
    };
    let node_start = o.node_init.then(|| {
        let mut cfg = NodeConfig::new(&o.node, o.ovn_remote.clone().unwrap_or_default());
        cfg.bridge = o.bridge.clone();
        cfg.datapath_type = o.datapath_type.clone();
        cfg.encap_type = o.encap_type.clone();
        cfg.encap_ip = o.encap_ip.clone();
        cfg.mtu = o.mtu;
        cfg.nic = o.nic.clone();
        cfg
    });
    let cfg = DaemonConfig {
        socket: o.socket.clone(),
        metrics_addr: o.metrics,
        handler: HandlerConfig {
            bridge: o.bridge.clone(),
            mtu: o.mtu,
            pod_network_timeout: o.pod_network_timeout,
            ovn_installed_timeout: o.ovn_installed_timeout,
            gateway_timeout: o.gateway_timeout,
            ipv4_only_no_ipv6: o.ipv4_only_no_ipv6,
            pod_tx_checksum_off: o.pod_tx_checksum_off,
        },
        node_start,
        pod_cidrs: o.pod_cidrs.clone(),
    };
    let mut daemon = Daemon::new(cfg, host, ovs, source);
    if let Some(c) = client {
        daemon = daemon.kube(c);
    }
    let running = daemon.start().await?;
    eprintln!(
        "kube-ovn-daemon: node {} serving {} (metrics {:?})",
        o.node,
        o.socket.display(),
        running.metrics_addr()
    );
    let sig = |k| {
        tokio::signal::unix::signal(k).map_err(|e| DaemonError::Io {
            what: "install signal handler",
            path: PathBuf::new(),
            source: e,
        })
    };
    let mut term = sig(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = sig(tokio::signal::unix::SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    running.shutdown().await;
    Ok(())
}

fn main() {
    let opts = match parse_args(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("kube-ovn-daemon: {e}");
            std::process::exit(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kube-ovn-daemon: tokio runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(run(opts)) {
        eprintln!("kube-ovn-daemon: {e}");
        std::process::exit(1);
    }
}
