//! Kube-OVN's IP and MAC allocator, rebuilt as a plain library: pure, synchronous, no I/O, no Kubernetes types.
//!
//! It reproduces Kube-OVN's `pkg/ipam` behaviour (next-free allocation with delayed reuse, static IPs and MACs,
//! excluded IPs, named IP pools, dual stack, MAC-only subnets) and fixes its weak points: free space is kept as
//! ranges (an empty /8 costs what an empty /24 costs), each subnet has its own lock ([`SharedIpam`]), the
//! rebuild at start takes every source at once and reports conflicts ([`Ipam::restore`]), and bad input never
//! panics nor changes state.
//!
//! # Example
//!
//! ```
//! use kubeovn_ipam::{AllocRequest, Ipam, SubnetSpec};
//!
//! let mut ipam = Ipam::with_seed(7);
//! let spec = SubnetSpec::new("ovn-default", "10.16.0.0/16,fd00:10:16::/64", "10.16.0.1,fd00:10:16::1")
//!     .exclude(["10.16.0.2..10.16.0.10"]);
//! ipam.add_or_update_subnet(&spec)?;
//!
//! let a = ipam.allocate("ovn-default", &AllocRequest::new("default/web-0", "eth0"))?;
//! assert_eq!(a.v4, Some("10.16.0.11".parse().unwrap()));
//! assert_eq!(a.v6, Some("fd00:10:16::2".parse().unwrap()));
//! // Asking again is idempotent: same addresses, same MAC.
//! assert_eq!(ipam.allocate("ovn-default", &AllocRequest::new("default/web-0", "eth0"))?, a);
//!
//! let json = serde_json::to_string(&ipam.snapshot()).unwrap();
//! let back = Ipam::from_snapshot(&serde_json::from_str(&json).unwrap())?;
//! assert_eq!(back.get("ovn-default", "default/web-0", "eth0")?, Some(a));
//! # Ok::<(), kubeovn_ipam::IpamError>(())
//! ```
//!
//! # API
//!
//! - Configuration: [`SubnetSpec`] (`cidr` `"v4,v6"` or `""` for MAC-only, `gateway`, `exclude_ips`,
//!   `gateway_mac`), [`Ipam::add_or_update_subnet`] (returns dropped allocations), [`Ipam::delete_subnet`],
//!   [`PoolSpec`], [`Ipam::add_or_update_pool`], [`Ipam::delete_pool`].
//! - Allocation: [`Ipam::allocate`] with an [`AllocRequest`] (family, pool, MAC, static IPs, skip list,
//!   conflict check) returning [`Addresses`]; [`Ipam::release`], [`Ipam::release_pod`].
//! - Queries: [`Ipam::get`], [`Ipam::pod_allocations`], [`Subnet::iter`], [`Ipam::owner`],
//!   [`Ipam::contains`], [`Ipam::stats`].
//! - Persistence: [`Ipam::snapshot`] / [`Ipam::from_snapshot`] ([`Snapshot`] is serde), and
//!   [`Ipam::restore`] from [`Allocation`] records with a [`RestoreReport`].
//! - Concurrency: [`SharedIpam`], the same operations behind `&self`, one lock per subnet.
//! - Ranges: [`IpRangeList`] parses and formats Kube-OVN's range strings.
//!
//! Every error is an [`IpamError`].

mod error;
mod ipam;
mod mac;
pub mod range;
mod slots;
mod subnet;
mod types;

pub use error::{IpamError, Result};
pub use ipam::{Ipam, SharedIpam};
pub use mac::Mac;
pub use range::IpRangeList;
pub use subnet::Subnet;
pub use types::{
    Addresses, AllocRequest, Allocation, Family, FamilyStats, NicRef, PoolSpec, PoolStats,
    RestoreConflict, RestoreReport, Snapshot, SnapshotEntry, SubnetSnapshot, SubnetSpec,
    SubnetStats,
};
