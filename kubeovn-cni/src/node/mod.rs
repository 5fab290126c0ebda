//! The node daemon's CNI handlers (feature `node`): what `kube-ovn-daemon` does for each request the shim
//! forwards.
//!
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

mod handler;
mod probe;
mod source;

pub use handler::{iface_id, CniHandler, HandlerConfig, EXT_CONTAINER_ID, EXT_IFNAME, EXT_NETWORK};
pub use probe::{GatewayProbe, IcmpGatewayProbe, NoGatewayProbe};
pub use source::{PodNetwork, PodNetworkSource, PodRoute, SourceError, StaticPodNetworks};

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
