//! Kube-OVN node daemon: serves the CNI shim over a unix socket and plugs pods into OVN.
//!
//! The shim (`/opt/cni/bin/kube-ovn`) forwards each CNI request to this daemon ([`kubeovn_cni::daemon`]
//! protocol). [`server::Server`] answers them on the unix socket (mode 0600) with
//! [`kubeovn_cni::node::CniHandler`], many at once, and exposes Prometheus metrics ([`metrics::Metrics`]) on a
//! loopback TCP address. [`node::init_node`] writes the chassis settings, creates the integration bridge and
//! the node's join port; [`node_sync::NodeSync`] waits for the node's join address (a watch on the Node)
//! before plugging that port, and keeps a route to each subnet of the default VPC through it. Pods' network data comes from a [`kubeovn_cni::node::PodNetworkSource`]: the
//! Kubernetes API ([`kube_source::KubePodNetworks`], a watch-based cache of this node's pods) or an in-memory
//! table ([`kubeovn_cni::node::StaticPodNetworks`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), kube_ovn_daemon::DaemonError> {
//! use std::sync::Arc;
//! use kubeovn_cni::node::{CniHandler, HandlerConfig, IcmpGatewayProbe, StaticPodNetworks};
//! use kubeovn_netdev::{NamedNetns, NetlinkNetdev};
//! use kubeovn_ovn::vswitch::OvsdbOpenVSwitch;
//!
//! let ovs = OvsdbOpenVSwitch::connect("unix:/run/openvswitch/db.sock").await?;
//! let handler = CniHandler::new(
//!     HandlerConfig::default(),
//!     Arc::new(StaticPodNetworks::new()),
//!     Arc::new(ovs),
//!     Arc::new(NetlinkNetdev::current()?),
//!     Arc::new(NamedNetns::default()),
//!     Arc::new(IcmpGatewayProbe::default()),
//! );
//! let metrics = Arc::new(kube_ovn_daemon::metrics::Metrics::new());
//! let server = kube_ovn_daemon::server::Server::start(
//!     std::path::Path::new(kubeovn_cni::daemon::DEFAULT_SOCKET),
//!     Some("127.0.0.1:10665".parse().expect("addr")),
//!     Arc::new(handler),
//!     metrics,
//! )
//! .await?;
//! # server.shutdown().await; Ok(()) }
//! ```

pub mod kube_source;
pub mod metrics;
pub mod node;
pub mod node_sync;
pub mod server;

use std::path::PathBuf;

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
    /// A command-line argument is wrong.
    #[error("invalid argument: {0}")]
    Args(String),
    /// The Kubernetes API could not be used.
    #[error("kubernetes: {0}")]
    Kube(String),
}
