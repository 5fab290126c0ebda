//! Netlink plumbing for pod networking, the node side of Kube-OVN: named network namespaces, veth pairs created
//! with the pod end directly inside the pod's namespace, MAC, MTU, addresses, routes, link state and sysctls,
//! spoken over rtnetlink behind the [`Netdev`] trait. No `ip` command, no fork.
//!
//! Each [`NetlinkNetdev`] owns a dedicated thread that entered its namespace with `setns` and opened its netlink
//! socket there (the socket stays bound to that namespace); requests travel to it over a channel, so no tokio
//! worker ever changes namespace. [`NetlinkNetdev::current`] is the same thing for the process's own namespace.
//! [`Netdev::apply`] runs a list of steps ([`NetOp`]) in one round trip to that thread; [`VethSpec::then`] and
//! [`VethSpec::peer_then`] configure both ends of a pair in the round trip that creates it (the pod end over a socket
//! opened in the pod's namespace, with no thread there); [`VethSpec::host_up`] creates the host end up, and
//! [`NetOp::ipv6_addr_gen_none`] keeps a link free of IPv6 addresses over netlink, with no `/proc/sys` lookup (the
//! first one in a new namespace costs more with every namespace on the node); [`NetOp::tx_checksum_off`] turns
//! TX checksum offload off over ethtool's generic netlink family (the userspace datapath forwards a veth's
//! partial checksums unfinished: without it ICMP passes and TCP and UDP do not).
//! [`Netdev::set_nat`] masquerades pods' traffic leaving the cluster (a Subnet's `natOutgoing`, [`NatRules`]) with an
//! nftables table it replaces atomically, in one batch spoken over netlink (`NETLINK_NETFILTER`), with no `nft`.
//! Operations are idempotent: creating what exists with the same parameters and deleting what is absent succeed.
//!
//! [`icmp`] builds ICMP echo packets, and with the `icmp` feature sends them (`icmp::ping`, a blocking echo over
//! a raw socket in the calling thread's namespace: the gateway checks of the daemon and the controller).
//!
//! Enable the `mock` feature for `MockNetdev` and `MockNamespaces` (mockall) in downstream tests.
//!
//! ```no_run
//! use kubeovn_netdev::{
//!     host_nic_name, NamedNetns, Namespaces, NetOp, Netdev, NetlinkNetdev, RouteSpec, VethSpec,
//! };
//!
//! # async fn wire() -> kubeovn_netdev::Result<()> {
//! let netns = NamedNetns::default();
//! let pod_ns = netns.create("pod-a")?; // like `ip netns add pod-a`
//! let host = NetlinkNetdev::current()?;
//! let (host_if, _) = host_nic_name("0123456789abcdef", "eth0")?; // "0123456789ab_h"
//! // The pair with its host end up and without IPv6 addresses, in one round trip to this namespace's thread.
//! let spec = VethSpec::new(&host_if, "eth0", &pod_ns)
//!     .mtu(1400)
//!     .host_up()
//!     .then([NetOp::ipv6_addr_gen_none(&host_if)]);
//! let pair = host.create_veth(&spec).await?;
//! println!("host end {} mac {:?} (new: {})", pair.host.name, pair.host.mac, pair.created);
//!
//! // The pod end in one round trip to the pod namespace's thread, in this order.
//! let pod = NetlinkNetdev::open(&pod_ns)?;
//! pod.apply(&[
//!     NetOp::sysctl("net.ipv4.conf.eth0.arp_notify", "1"),
//!     NetOp::address("eth0", "10.16.0.5/16".parse().expect("cidr")),
//!     NetOp::up("lo"),
//!     NetOp::up("eth0"),
//!     NetOp::AddRoute(RouteSpec::default_via("10.16.0.1".parse().expect("ip"))),
//! ])
//! .await?;
//! # Ok(())
//! # }
//! ```

mod error;
mod ethtool;
pub mod icmp;
mod nat;
mod netdev;
mod netns;
mod nft;
#[cfg(test)]
use kubeovn_test_support::skip;
mod types;

pub use error::{Error, Result};
pub use nat::{NatAction, NatPolicyRule, NatRules, NatSource};
#[cfg(feature = "mock")]
pub use netdev::{MockNamespaces, MockNetdev};
pub use netdev::{NamedNetns, Namespaces, Netdev, NetlinkNetdev};
pub use netns::{create_named_netns, delete_named_netns, validate_netns_name, NETNS_RUN_DIR};
pub use types::{
    host_nic_name, sysctl_path, validate_ifname, Address, Link, Mac, NetOp, OperState, Route,
    RouteSpec, VethPair, VethSpec, MAX_IFNAME_LEN,
};

/// The wire crates this crate speaks, re-exported so users never mismatch versions.
pub use ipnetwork;
pub use netlink_sys;
pub use rtnetlink;
