//! The plain data types of the public API.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use crate::Mac;

/// An address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// The family of an address.
    pub fn of(ip: IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// A subnet as Kube-OVN's Subnet CRD describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubnetSpec {
    /// The subnet's name.
    pub name: String,
    /// `"10.16.0.0/16"`, `"fd00::/64"`, `"10.16.0.0/16,fd00:10:16::/64"`, or `""` for a MAC-only subnet.
    pub cidr: String,
    /// `"10.16.0.1"`, `"10.16.0.1,fd00:10:16::1"` or `""`; never handed out.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gateway: String,
    /// Addresses next-free never hands out: `ip`, `a..b` or CIDR items, clipped to the subnet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_ips: Vec<String>,
    /// The MAC of the gateway's router port, never handed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_mac: Option<Mac>,
}

impl SubnetSpec {
    /// A subnet with a CIDR and gateway and no excluded addresses.
    pub fn new(
        name: impl Into<String>,
        cidr: impl Into<String>,
        gateway: impl Into<String>,
    ) -> Self {
        SubnetSpec {
            name: name.into(),
            cidr: cidr.into(),
            gateway: gateway.into(),
            ..Default::default()
        }
    }

    /// Sets the excluded addresses.
    pub fn exclude<S: Into<String>>(mut self, items: impl IntoIterator<Item = S>) -> Self {
        self.exclude_ips = items.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the gateway's router-port MAC.
    pub fn gateway_mac(mut self, mac: Mac) -> Self {
        self.gateway_mac = Some(mac);
        self
    }
}

/// A named IP pool inside a subnet (Kube-OVN's IPPool): `ip`, `a..b` or CIDR items.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSpec {
    /// The pool's name (not empty).
    pub name: String,
    /// The pool's addresses.
    pub ips: Vec<String>,
}

impl PoolSpec {
    /// A pool from its name and items.
    pub fn new<S: Into<String>>(name: impl Into<String>, ips: impl IntoIterator<Item = S>) -> Self {
        PoolSpec {
            name: name.into(),
            ips: ips.into_iter().map(Into::into).collect(),
        }
    }
}

/// What a (pod, nic) asks for. Build with [`AllocRequest::new`] and the setters.
#[derive(Clone, Copy, Debug)]
pub struct AllocRequest<'a> {
    /// The pod (any unique owner name, e.g. `namespace/name` or a container id).
    pub pod: &'a str,
    /// The nic (interface or provider name); a pod may have several.
    pub nic: &'a str,
    /// Only this family; `None` means every family of the subnet.
    pub family: Option<Family>,
    /// Next-free addresses come from this pool; `None` means the subnet's default pool. An address the nic
    /// already holds is kept even if it is outside the pool (as in Kube-OVN).
    pub pool: Option<&'a str>,
    /// A static MAC.
    pub mac: Option<Mac>,
    /// Static addresses, at most one per family; the other families get next-free addresses.
    pub static_ips: &'a [IpAddr],
    /// Addresses next-free must not return (an existing address in this list is replaced).
    pub skip: &'a [IpAddr],
    /// When false, a static IP owned by another pod is shared rather than refused (live migration).
    pub check_conflict: bool,
}

impl<'a> AllocRequest<'a> {
    /// A next-free request for every family, conflict checking on.
    pub fn new(pod: &'a str, nic: &'a str) -> Self {
        AllocRequest {
            pod,
            nic,
            family: None,
            pool: None,
            mac: None,
            static_ips: &[],
            skip: &[],
            check_conflict: true,
        }
    }

    /// Restricts the request to one family.
    pub fn family(mut self, family: Family) -> Self {
        self.family = Some(family);
        self
    }

    /// Allocates from a named pool.
    pub fn pool(mut self, pool: &'a str) -> Self {
        self.pool = Some(pool);
        self
    }

    /// Requests a static MAC.
    pub fn mac(mut self, mac: Mac) -> Self {
        self.mac = Some(mac);
        self
    }

    /// Requests static IPs (one per family).
    pub fn static_ips(mut self, ips: &'a [IpAddr]) -> Self {
        self.static_ips = ips;
        self
    }

    /// Addresses next-free must not return.
    pub fn skip(mut self, ips: &'a [IpAddr]) -> Self {
        self.skip = ips;
        self
    }

    /// Turns conflict checking for static IPs and MACs on or off.
    pub fn check_conflict(mut self, on: bool) -> Self {
        self.check_conflict = on;
        self
    }
}

/// The addresses of one (pod, nic).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Addresses {
    /// The IPv4 address, if the subnet has IPv4 and it was asked for.
    pub v4: Option<Ipv4Addr>,
    /// The IPv6 address, if the subnet has IPv6 and it was asked for.
    pub v6: Option<Ipv6Addr>,
    /// The MAC.
    pub mac: Mac,
}

impl Addresses {
    /// The IP addresses, IPv4 first.
    pub fn ips(&self) -> impl Iterator<Item = IpAddr> {
        self.v4
            .map(IpAddr::V4)
            .into_iter()
            .chain(self.v6.map(IpAddr::V6))
    }
}

/// A borrowed view of one (pod, nic) of a subnet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NicRef<'a> {
    /// The pod.
    pub pod: &'a str,
    /// The nic.
    pub nic: &'a str,
    /// Its addresses.
    pub addrs: Addresses,
}

/// An allocation record: what [`Ipam::restore`](crate::Ipam::restore) takes and queries return.
///
/// The sources a controller finds at start (IP records, pod annotations, northbound ports) each give one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// The subnet.
    pub subnet: String,
    /// The pod.
    pub pod: String,
    /// The nic.
    pub nic: String,
    /// The IPv4 address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v4: Option<Ipv4Addr>,
    /// The IPv6 address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v6: Option<Ipv6Addr>,
    /// The MAC (a record without one gets a random MAC on restore).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<Mac>,
    /// The pool the record names, if any (checked to exist on restore).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
}

impl Allocation {
    /// A record from its parts.
    pub fn new(subnet: &str, pod: &str, nic: &str, addrs: Addresses) -> Self {
        Allocation {
            subnet: subnet.to_owned(),
            pod: pod.to_owned(),
            nic: nic.to_owned(),
            v4: addrs.v4,
            v6: addrs.v6,
            mac: Some(addrs.mac),
            pool: None,
        }
    }
}

/// Counts and ranges of one family (of a subnet or a pool), as Kube-OVN's Subnet and IPPool status shows them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FamilyStats {
    /// Addresses next-free can still hand out.
    pub available: u128,
    /// Addresses in use.
    pub using: u128,
    /// The available addresses, `10.0.0.1,10.0.0.3-10.0.0.99`.
    pub available_range: String,
    /// The addresses in use, same format.
    pub using_range: String,
}

/// Statistics of one named pool.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PoolStats {
    /// The pool.
    pub name: String,
    /// IPv4.
    pub v4: FamilyStats,
    /// IPv6.
    pub v6: FamilyStats,
}

/// Statistics of a subnet and its pools.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SubnetStats {
    /// IPv4, whole subnet.
    pub v4: FamilyStats,
    /// IPv6, whole subnet.
    pub v6: FamilyStats,
    /// Each named pool.
    pub pools: Vec<PoolStats>,
}

/// One conflicting record found by [`Ipam::restore`](crate::Ipam::restore).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreConflict {
    /// The record that was not restored.
    pub record: Allocation,
    /// Why.
    pub error: crate::IpamError,
}

/// What [`Ipam::restore`](crate::Ipam::restore) did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Records applied (a record that repeats a known (pod, nic, ip) counts too).
    pub restored: usize,
    /// Records refused, with the reason; none of their addresses was assigned.
    pub conflicts: Vec<RestoreConflict>,
}

/// One (pod, nic) in a [`SubnetSnapshot`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SnapshotEntry {
    /// The pod.
    pub pod: String,
    /// The nic.
    pub nic: String,
    /// The IPv4 address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v4: Option<Ipv4Addr>,
    /// The IPv6 address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v6: Option<Ipv6Addr>,
    /// The MAC.
    pub mac: Mac,
    /// Another entry holds the same IP or MAC on purpose (taken with conflict checking off, e.g. live migration).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
}

/// The persistent state of one subnet: free space is derived on load.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubnetSnapshot {
    /// The spec.
    pub spec: SubnetSpec,
    /// The named pools.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolSpec>,
    /// The allocations, sorted by (pod, nic).
    #[serde(default)]
    pub allocations: Vec<SnapshotEntry>,
    /// Released addresses waiting for reuse (Kube-OVN range format), so reuse order survives a reload.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub released: String,
    /// The MAC generator's state.
    #[serde(default)]
    pub rng: u64,
}

/// The persistent state of an [`Ipam`](crate::Ipam).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The subnets, sorted by name.
    pub subnets: Vec<SubnetSnapshot>,
    /// The seed generator for new subnets.
    #[serde(default)]
    pub rng: u64,
}
