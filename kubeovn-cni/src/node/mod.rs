//! The node daemon (feature `node`): what `kube-ovn-daemon` does, as a library a third party embeds.
//!
//! [`Daemon`] composes the parts: node start ([`init_node`]: chassis settings, the integration bridge, the
//! node's join port), the join port and its routes following the API ([`NodeSync`]: a watch on the Node waits
//! for the controller's join address, a watch on the Subnets keeps a route to each subnet of the default VPC
//! through the join gateway and, for subnets with `natOutgoing`, the node's masquerade of pods' egress
//! ([`nat_rules`] in nftables table [`NAT_TABLE`]); [`AfterJoin`] holds pods until then), and the server half of the shim protocol
//! ([`Server`]: HTTP/1 on the unix socket, many requests at once, and Prometheus [`Metrics`] on a TCP
//! address). Pods' network data comes from a [`PodNetworkSource`]: the Kubernetes API ([`KubePodNetworks`], a
//! watch-based cache of this node's pods read with kubeovn-core's annotation parser) or an in-memory table
//! ([`StaticPodNetworks`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), kubeovn_cni::node::DaemonError> {
//! use std::sync::Arc;
//! use kubeovn_cni::node::{Daemon, DaemonConfig, KubePodNetworks, NodeConfig};
//! use kubeovn_netdev::NetlinkNetdev;
//! use kubeovn_ovn::vswitch::OvsdbOpenVSwitch;
//!
//! let client = kube::Client::try_default().await.map_err(|e| kubeovn_cni::node::DaemonError::Kube(e.to_string()))?;
//! let mut cfg = DaemonConfig::new(kubeovn_cni::daemon::DEFAULT_SOCKET);
//! cfg.metrics_addr = Some("127.0.0.1:10665".parse().expect("address"));
//! cfg.node_start = Some(NodeConfig::new("node1", "tcp:192.0.2.10:6642"));
//! let ovs = OvsdbOpenVSwitch::connect("unix:/run/openvswitch/db.sock").await?;
//! let pods = KubePodNetworks::start(client.clone(), "node1");
//! // Serves until `stop` is sent or dropped (the binary waits for SIGTERM).
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! # drop(stop);
//! Daemon::new(cfg, Arc::new(NetlinkNetdev::current()?), Arc::new(ovs), Arc::new(pods))
//!     .kube(client)
//!     .run(async { let _ = stopped.await; })
//!     .await
//! # }
//! ```
//!
//! The handlers answer each request the shim forwards.
//! [`CniHandler`] composes four I/O seams, each a trait so tests can swap them:
//! - [`PodNetworkSource`]: the pod's network data ([`PodNetwork`]: addresses, MAC, gateways, routes, QoS),
//!   which the controller publishes as pod annotations; [`StaticPodNetworks`] is an in-memory source;
//! - [`kubeovn_ovn::vswitch::OpenVSwitch`]: the Open_vSwitch database (ports on the integration bridge);
//! - [`kubeovn_netdev::Netdev`] and [`kubeovn_netdev::Namespaces`]: links in the host and pod namespaces;
//! - [`GatewayProbe`]: the reachability check of the pod's gateway ([`IcmpGatewayProbe`]).
//!
//! `ADD` gets the pod's network (waiting, bounded, for the controller), creates the veth with the pod end
//! directly in the pod's namespace, plugs the host end into the bridge with `external_ids:iface-id`, configures
//! the pod end, waits (bounded) for ovn-controller's `ovn-installed`, checks the gateway answers and returns the
//! CNI result. Everything an `ADD` created is removed again if it fails. `DEL` is idempotent and removes the
//! port and the veth even when one of them is already gone.

mod daemon;
mod handler;
mod join;
mod kube;
mod metrics;
mod nat;
mod probe;
mod routed;
mod server;
mod source;
mod start;

pub use daemon::{Daemon, DaemonConfig, DaemonError, RunningDaemon};
pub use handler::{CniHandler, HandlerConfig, EXT_CONTAINER_ID, EXT_IFNAME, EXT_NETWORK};
pub use join::{AfterJoin, NodeSync, RESYNC};
pub use kube::{
    join_from_node_annotations, node_join_network, pod_network_from_annotations, KubePodNetworks,
};
pub use metrics::Metrics;
pub use nat::{egress_through, nat_rules, NAT_TABLE};
pub use probe::{GatewayProbe, IcmpGatewayProbe, NoGatewayProbe};
pub use routed::{routed_cidrs, subnet_is_routed};
pub use server::{bind_socket, Server, MAX_REQUEST};
pub use source::{
    PodNetwork, PodNetworkSource, PodRoute, PodTableError, SourceError, StaticPodNetworks,
};
pub use start::{
    init_node, join_routes, node_batch, sync_join_routes, JoinNetwork, NodeConfig, RouteChanges,
};

use crate::spec::ErrorCode;

/// Kube-OVN code: `CHECK` found the attachment not as `ADD` left it.
pub const CODE_CHECK_FAILED: ErrorCode = ErrorCode(122);
/// Kube-OVN code: the Open_vSwitch database refused or did not answer.
pub const CODE_OVS: ErrorCode = ErrorCode(123);
/// Kube-OVN code: a netlink operation failed.
pub const CODE_NETDEV: ErrorCode = ErrorCode(124);
/// Kube-OVN code: the pod's gateway did not answer in time.
pub const CODE_GATEWAY_UNREACHABLE: ErrorCode = ErrorCode(125);
/// Kube-OVN code: the pod's network data is invalid (bad annotations).
pub const CODE_BAD_POD_NETWORK: ErrorCode = ErrorCode(126);
