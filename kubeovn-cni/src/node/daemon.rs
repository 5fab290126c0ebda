//! [`Daemon`]: the node daemon composed from its parts, as `kube-ovn-daemon` runs it.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ipnetwork::IpNetwork;
use kubeovn_netdev::{NamedNetns, Namespaces, Netdev};
use kubeovn_ovn::vswitch::OpenVSwitch;

use super::join::{AfterJoin, NodeSync};
use super::metrics::Metrics;
use super::server::Server;
use super::start::{init_node, NodeConfig};
use super::{
    CniHandler, GatewayProbe, HandlerConfig, IcmpGatewayProbe, NoGatewayProbe, PodNetworkSource,
};

/// Everything that can stop the daemon.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    /// A file or socket operation failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// The step.
        what: &'static str,
        /// The path or address.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The Open_vSwitch database could not be reached.
    #[error("OVSDB: {0}")]
    Ovsdb(#[from] kubeovn_ovn::Error),
    /// Netlink could not be opened.
    #[error("netlink: {0}")]
    Netdev(#[from] kubeovn_netdev::Error),
    /// Node start failed.
    #[error("node start: {0}")]
    Node(String),
    /// The Kubernetes API could not be used.
    #[error("kubernetes: {0}")]
    Kube(String),
}

/// What the daemon serves and where.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// The CNI socket the shim connects to (mode 0600).
    pub socket: PathBuf,
    /// The Prometheus endpoint (`http://ADDR/metrics`); `None` serves none.
    pub metrics_addr: Option<SocketAddr>,
    /// How the handlers plug pods.
    pub handler: HandlerConfig,
    /// Node start (chassis settings, integration bridge, join port); `None` leaves them alone.
    pub node_start: Option<NodeConfig>,
    /// CIDRs routed through the join gateway besides the default VPC's subnets.
    pub pod_cidrs: Vec<IpNetwork>,
}

impl DaemonConfig {
    /// Serves on `socket`, no metrics, default handler settings, no node start.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        DaemonConfig {
            socket: socket.into(),
            metrics_addr: None,
            handler: HandlerConfig::default(),
            node_start: None,
            pod_cidrs: Vec::new(),
        }
    }
}

/// The node daemon: node start, the join port and its routes (with the Kubernetes API), and the CNI server.
///
/// Its I/O seams are injected: the host's links ([`Netdev`]), the Open_vSwitch database ([`OpenVSwitch`]),
/// the pods' network data ([`PodNetworkSource`], e.g. [`super::KubePodNetworks`]), and optionally the pod
/// namespaces ([`Namespaces`], default [`NamedNetns`]), the gateway check ([`GatewayProbe`], default ICMP
/// when [`HandlerConfig::gateway_timeout`] is set) and a Kubernetes client (the join port waits for the
/// node's join address and routes follow the Subnets; without one node start plugs no join port).
pub struct Daemon {
    cfg: DaemonConfig,
    host: Arc<dyn Netdev>,
    ovs: Arc<dyn OpenVSwitch>,
    source: Arc<dyn PodNetworkSource>,
    netns: Arc<dyn Namespaces>,
    probe: Option<Arc<dyn GatewayProbe>>,
    client: Option<kube::Client>,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("cfg", &self.cfg)
            .field("kube", &self.client.is_some())
            .finish()
    }
}

impl Daemon {
    /// A daemon over `host`'s links, the Open_vSwitch database `ovs` and the pod source `source`.
    pub fn new(
        cfg: DaemonConfig,
        host: Arc<dyn Netdev>,
        ovs: Arc<dyn OpenVSwitch>,
        source: Arc<dyn PodNetworkSource>,
    ) -> Self {
        Daemon {
            cfg,
            host,
            ovs,
            source,
            netns: Arc::new(NamedNetns::default()),
            probe: None,
            client: None,
        }
    }

    /// Follows the Kubernetes API for the node's join port and the subnets' routes.
    pub fn kube(mut self, client: kube::Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Opens pod network namespaces with `netns` instead of [`NamedNetns`].
    pub fn namespaces(mut self, netns: Arc<dyn Namespaces>) -> Self {
        self.netns = netns;
        self
    }

    /// Checks pods' gateways with `probe` instead of the default.
    pub fn gateway_probe(mut self, probe: Arc<dyn GatewayProbe>) -> Self {
        self.probe = Some(probe);
        self
    }

    /// Runs node start and starts serving; the returned handle keeps the daemon running until
    /// [`RunningDaemon::shutdown`] (or its drop, which stops the background watches but leaves the socket).
    pub async fn start(self) -> Result<RunningDaemon, DaemonError> {
        let Daemon {
            cfg,
            host,
            ovs,
            mut source,
            netns,
            probe,
            client,
        } = self;
        let mut node_sync = None;
        if let Some(node) = &cfg.node_start {
            // Chassis settings and the bridge now; the join port once the controller has allocated it.
            init_node(ovs.as_ref(), host.as_ref(), node).await?;
            match &client {
                Some(c) => {
                    let sync = NodeSync::start(
                        c.clone(),
                        ovs.clone(),
                        host.clone(),
                        node.clone(),
                        cfg.pod_cidrs.clone(),
                    );
                    source = Arc::new(AfterJoin::new(
                        source,
                        sync.joined(),
                        &node.node_name,
                        &node.nic,
                    ));
                    node_sync = Some(sync);
                }
                None => tracing::warn!(
                    nic = %node.nic,
                    "no join network without the Kubernetes API: no join port"
                ),
            }
        }
        let probe = probe.unwrap_or_else(|| -> Arc<dyn GatewayProbe> {
            if cfg.handler.gateway_timeout.is_some() {
                Arc::new(IcmpGatewayProbe::default())
            } else {
                Arc::new(NoGatewayProbe)
            }
        });
        let handler = CniHandler::new(cfg.handler.clone(), source, ovs, host, netns, probe);
        let server = Server::start(
            &cfg.socket,
            cfg.metrics_addr,
            Arc::new(handler),
            Arc::new(Metrics::new()),
        )
        .await?;
        Ok(RunningDaemon {
            server,
            _node_sync: node_sync,
        })
    }

    /// [`Daemon::start`], then serves until `shutdown` completes, then stops accepting and removes the
    /// socket.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), DaemonError> {
        let running = self.start().await?;
        shutdown.await;
        running.shutdown().await;
        Ok(())
    }
}

/// A started [`Daemon`].
#[derive(Debug)]
pub struct RunningDaemon {
    server: Server,
    // Kept for the daemon's life: dropping it stops the node and subnet watches.
    _node_sync: Option<NodeSync>,
}

impl RunningDaemon {
    /// The CNI socket.
    pub fn socket(&self) -> &Path {
        self.server.socket()
    }

    /// The metrics endpoint's bound address (the real port when asked for port 0).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.server.metrics_addr()
    }

    /// Stops accepting (requests in flight finish), removes the socket and stops the watches.
    pub async fn shutdown(self) {
        self.server.shutdown().await;
    }
}
