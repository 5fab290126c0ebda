//! Plain values: names, link/address/route descriptions and requests. MAC addresses are [`Mac`], the one
//! MAC type of the workspace, from kubeovn-ipam (pure, below netdev: IPAM allocates them, netlink sets them).

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;

use ipnetwork::IpNetwork;
pub use kubeovn_ipam::Mac;

use crate::error::{Error, Result};

/// Longest interface name the kernel accepts (`IFNAMSIZ` is 16 with the NUL).
pub const MAX_IFNAME_LEN: usize = 15;

/// Checks an interface name the way the kernel's `dev_valid_name` does: 1 to 15 bytes, not `.` or `..`, no `/`,
/// `:` or whitespace.
pub fn validate_ifname(name: &str) -> Result<()> {
    let bad = |reason| {
        Err(Error::InvalidName {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > MAX_IFNAME_LEN {
        return bad("longer than 15 bytes");
    }
    if name == "." || name == ".." {
        return bad("`.` and `..` are reserved");
    }
    if name
        .bytes()
        .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b == 0)
    {
        return bad("holds `/`, `:`, NUL or whitespace");
    }
    Ok(())
}

/// Kube-OVN's names for a pod's veth pair: `(host end, container end before rename)`.
///
/// For `eth0` they are the first 12 characters of the container id with `_h` / `_c`; for other interfaces the id is
/// shortened so that `<id>_<ifname>_h` stays within 15 bytes (Kube-OVN's `generateNicName`, including the KubeVirt
/// `podXXXXXXXXXXX` form). The pod end is created under the CNI `CNI_IFNAME` instead of the `_c` name here, as the
/// peer is made directly inside the pod's namespace. An id shorter than 12 characters is used whole.
pub fn host_nic_name(container_id: &str, ifname: &str) -> Result<(String, String)> {
    validate_ifname(ifname)?;
    let bad = |reason| {
        Err(Error::InvalidContainerId {
            id: container_id.to_string(),
            reason,
        })
    };
    if !container_id.is_ascii() {
        return bad("not ASCII");
    }
    if container_id.is_empty() {
        return bad("empty");
    }
    // Runtimes' ids are 64 hex digits; a shorter id (test runtimes, benchmarks) is used whole.
    let checked = |h: String, c: String| match validate_ifname(&h) {
        Ok(()) => Ok((h, c)),
        Err(_) => bad("holds characters an interface name cannot"),
    };
    if ifname == "eth0" {
        let id = &container_id[..12.min(container_id.len())];
        return checked(format!("{id}_h"), format!("{id}_c"));
    }
    let mut short = ifname;
    if ifname.starts_with("pod") && ifname.len() == 14 {
        short = &ifname[3..ifname.len() - 4];
    }
    if short.len() >= 12 {
        return Err(Error::InvalidName {
            name: ifname.to_string(),
            reason: "too long to derive a host interface name from",
        });
    }
    let id = &container_id[..(12 - short.len()).min(container_id.len())];
    checked(format!("{id}_{short}_h"), format!("{id}_{short}_c"))
}

/// Reads a link's 6-byte hardware address attribute.
pub(crate) fn mac_from_slice(b: &[u8]) -> Option<Mac> {
    <[u8; 6]>::try_from(b).ok().map(Mac)
}

/// RFC 2863 operational state, as `ip link` prints it (`operstate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperState {
    /// `UNKNOWN` (also loopback and devices without carrier reporting).
    Unknown,
    /// `NOTPRESENT`.
    NotPresent,
    /// `DOWN`.
    Down,
    /// `LOWERLAYERDOWN` (a veth whose peer is down).
    LowerLayerDown,
    /// `TESTING`.
    Testing,
    /// `DORMANT`.
    Dormant,
    /// `UP`.
    Up,
}

impl OperState {
    /// The name `ip -j link` uses.
    pub fn as_str(&self) -> &'static str {
        match self {
            OperState::Unknown => "UNKNOWN",
            OperState::NotPresent => "NOTPRESENT",
            OperState::Down => "DOWN",
            OperState::LowerLayerDown => "LOWERLAYERDOWN",
            OperState::Testing => "TESTING",
            OperState::Dormant => "DORMANT",
            OperState::Up => "UP",
        }
    }
}

/// A link as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// Interface index in its namespace.
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// Hardware address, when the link has a 6-byte one.
    pub mac: Option<Mac>,
    /// MTU.
    pub mtu: u32,
    /// Administratively up (`IFF_UP`).
    pub admin_up: bool,
    /// Operational state.
    pub oper_state: OperState,
    /// `IFLA_INFO_KIND` (`veth`, `bridge`, ...), absent for physical and loopback devices.
    pub kind: Option<String>,
}

/// An address assigned to a link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Address {
    /// Index of the link it is on.
    pub link_index: u32,
    /// Address and prefix length (`10.16.0.5/16`).
    pub addr: IpNetwork,
}

/// A route of the main table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// Destination (`0.0.0.0/0` for the default route).
    pub dst: IpNetwork,
    /// Next hop, if any.
    pub gateway: Option<IpAddr>,
    /// Output interface index, if any.
    pub oif: Option<u32>,
    /// Routing table id (254 is main).
    pub table: u32,
}

/// A route to add or delete in the main table: destination, and a gateway and/or a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSpec {
    /// Destination; host bits are cleared (`10.0.0.7/8` means `10.0.0.0/8`).
    pub dst: IpNetwork,
    /// Next hop.
    pub gateway: Option<IpAddr>,
    /// Output device by name.
    pub dev: Option<String>,
}

impl RouteSpec {
    /// The default route of `gateway`'s family via `gateway` (`ip route add default via GW`).
    pub fn default_via(gateway: IpAddr) -> Self {
        let dst = match gateway {
            IpAddr::V4(_) => IpNetwork::V4(ipnetwork::Ipv4Network::from(
                std::net::Ipv4Addr::UNSPECIFIED,
            )),
            IpAddr::V6(_) => IpNetwork::V6(ipnetwork::Ipv6Network::from(
                std::net::Ipv6Addr::UNSPECIFIED,
            )),
        };
        // Host-width networks from `From<addr>`; make them /0.
        let dst = IpNetwork::new(dst.ip(), 0).unwrap_or(dst);
        RouteSpec {
            dst,
            gateway: Some(gateway),
            dev: None,
        }
    }

    /// `dst` via `gateway` (`ip route add DST via GW`).
    pub fn via(dst: IpNetwork, gateway: IpAddr) -> Self {
        RouteSpec {
            dst,
            gateway: Some(gateway),
            dev: None,
        }
    }

    /// `dst` directly on `dev` (`ip route add DST dev DEV`).
    pub fn on_link(dst: IpNetwork, dev: impl Into<String>) -> Self {
        RouteSpec {
            dst,
            gateway: None,
            dev: Some(dev.into()),
        }
    }

    /// Checks the spec and returns the destination with host bits cleared.
    pub(crate) fn normalized_dst(&self) -> Result<IpNetwork> {
        let bad = |reason| {
            Err(Error::InvalidRoute {
                route: self.to_string(),
                reason,
            })
        };
        if self.gateway.is_none() && self.dev.is_none() {
            return bad("needs a gateway or a device");
        }
        if let Some(gw) = self.gateway {
            if gw.is_ipv4() != self.dst.is_ipv4() {
                return bad("gateway and destination are of different families");
            }
        }
        if let Some(dev) = &self.dev {
            validate_ifname(dev)?;
        }
        Ok(IpNetwork::new(self.dst.network(), self.dst.prefix()).unwrap_or(self.dst))
    }
}

impl fmt::Display for RouteSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.dst)?;
        if let Some(gw) = self.gateway {
            write!(f, " via {gw}")?;
        }
        if let Some(dev) = &self.dev {
            write!(f, " dev {dev}")?;
        }
        Ok(())
    }
}

/// One step of [`Netdev::apply`](crate::Netdev::apply): a list of them configures an interface in one round
/// trip to the namespace's thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetOp {
    /// Writes a sysctl (as [`Netdev::set_sysctl`](crate::Netdev::set_sysctl)); with `missing_ok`, a key the
    /// kernel does not have (no IPv6, say) is skipped.
    Sysctl {
        /// The key, dotted or slash form.
        key: String,
        /// The value written.
        value: String,
        /// Whether an absent key is success.
        missing_ok: bool,
    },
    /// Sets a link administratively up or down.
    SetUp {
        /// The link.
        link: String,
        /// Up (true) or down.
        up: bool,
    },
    /// Sets a link's MTU.
    SetMtu {
        /// The link.
        link: String,
        /// The MTU.
        mtu: u32,
    },
    /// Sets a link's hardware address.
    SetMac {
        /// The link.
        link: String,
        /// The MAC.
        mac: Mac,
    },
    /// Adds an address to a link (present is success).
    AddAddress {
        /// The link.
        link: String,
        /// Address and prefix.
        addr: IpNetwork,
        /// An IPv6 address usable at once, without duplicate address detection (`IFA_F_NODAD`): for
        /// addresses an IPAM made unique. No effect on IPv4.
        no_dad: bool,
    },
    /// Stops the kernel generating IPv6 addresses for a link (`ip link set X addrgenmode none`, over
    /// netlink): no link-local address, so none of the duplicate address detection, router solicitations
    /// and MLD reports a new interface sends. Before the link has carrier, or its link-local address is
    /// already made. A kernel without IPv6 has nothing to stop: success.
    Ipv6AddrGenNone {
        /// The link.
        link: String,
    },
    /// Adds a route to the main table (as [`Netdev::add_route`](crate::Netdev::add_route)).
    AddRoute(RouteSpec),
    /// Turns TX checksum offload off on a link (`ethtool -K LINK tx off`, over ethtool's generic netlink
    /// family): its kernel computes TCP and UDP checksums itself. A veth otherwise hands on packets with
    /// partial checksums, which the userspace datapath forwards unfinished and the receiver drops.
    TxChecksumOff {
        /// The link.
        link: String,
    },
}

impl NetOp {
    /// Writes `key` = `value`.
    pub fn sysctl(key: impl Into<String>, value: impl Into<String>) -> Self {
        NetOp::Sysctl {
            key: key.into(),
            value: value.into(),
            missing_ok: false,
        }
    }

    /// Writes `key` = `value` if the kernel has the key.
    pub fn sysctl_if_present(key: impl Into<String>, value: impl Into<String>) -> Self {
        NetOp::Sysctl {
            key: key.into(),
            value: value.into(),
            missing_ok: true,
        }
    }

    /// Sets `link` up.
    pub fn up(link: impl Into<String>) -> Self {
        NetOp::SetUp {
            link: link.into(),
            up: true,
        }
    }

    /// Adds `addr` to `link`.
    pub fn address(link: impl Into<String>, addr: IpNetwork) -> Self {
        NetOp::AddAddress {
            link: link.into(),
            addr,
            no_dad: false,
        }
    }

    /// Adds `addr` to `link`, an IPv6 one without duplicate address detection.
    pub fn address_no_dad(link: impl Into<String>, addr: IpNetwork) -> Self {
        NetOp::AddAddress {
            link: link.into(),
            addr,
            no_dad: true,
        }
    }

    /// No IPv6 addresses generated for `link` (see [`NetOp::Ipv6AddrGenNone`]).
    pub fn ipv6_addr_gen_none(link: impl Into<String>) -> Self {
        NetOp::Ipv6AddrGenNone { link: link.into() }
    }

    /// TX checksum offload off on `link` (see [`NetOp::TxChecksumOff`]).
    pub fn tx_checksum_off(link: impl Into<String>) -> Self {
        NetOp::TxChecksumOff { link: link.into() }
    }

    /// Whether the step acts on the calling thread's namespace (a `/proc/sys` file, a generic netlink socket
    /// opened for it) rather than through the namespace's rtnetlink socket.
    pub(crate) fn runs_in_thread_netns(&self) -> bool {
        matches!(self, NetOp::Sysctl { .. } | NetOp::TxChecksumOff { .. })
    }

    /// Checks the step's names, key and route, as the single-step methods do.
    pub(crate) fn validate(&self) -> Result<()> {
        match self {
            NetOp::Sysctl { key, .. } => sysctl_path(key).map(|_| ()),
            NetOp::SetUp { link, .. }
            | NetOp::SetMtu { link, .. }
            | NetOp::SetMac { link, .. }
            | NetOp::AddAddress { link, .. }
            | NetOp::Ipv6AddrGenNone { link }
            | NetOp::TxChecksumOff { link } => validate_ifname(link),
            NetOp::AddRoute(r) => r.normalized_dst().map(|_| ()),
        }
    }
}

/// A veth pair to create: the host end in the handle's namespace, the peer created directly in `peer_netns`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VethSpec {
    /// Host end name (see [`host_nic_name`]).
    pub host_name: String,
    /// Pod end name, usually `CNI_IFNAME`.
    pub peer_name: String,
    /// Namespace of the peer: `/var/run/netns/NAME`, `/proc/PID/ns/net`, or the CNI `CNI_NETNS` path.
    pub peer_netns: PathBuf,
    /// MTU of both ends; the kernel default (1500) when `None`.
    pub mtu: Option<u32>,
    /// MAC of the host end; random when `None`.
    pub host_mac: Option<Mac>,
    /// MAC of the pod end; random when `None`.
    pub peer_mac: Option<Mac>,
    /// Create the host end up (in the request that creates the pair; a found one is set up). It has no
    /// carrier until the pod end is up too, so steps that must come before the carrier still do.
    pub host_up: bool,
    /// Steps run in the host end's namespace once the pair exists (created or found), in the same round trip
    /// to the namespace's thread; see [`VethSpec::then`].
    pub then: Vec<NetOp>,
    /// Steps for the pod end, in its namespace, in the same round trip; see [`VethSpec::peer_then`].
    pub peer_then: Vec<NetOp>,
}

impl VethSpec {
    /// A pair named `host_name` / `peer_name` with the peer in `peer_netns`, default MTU and random MACs.
    pub fn new(
        host_name: impl Into<String>,
        peer_name: impl Into<String>,
        peer_netns: impl Into<PathBuf>,
    ) -> Self {
        VethSpec {
            host_name: host_name.into(),
            peer_name: peer_name.into(),
            peer_netns: peer_netns.into(),
            mtu: None,
            host_mac: None,
            peer_mac: None,
            host_up: false,
            then: Vec::new(),
            peer_then: Vec::new(),
        }
    }

    /// Sets the MTU of both ends.
    pub fn mtu(mut self, mtu: u32) -> Self {
        self.mtu = Some(mtu);
        self
    }

    /// Sets the pod end's MAC.
    pub fn peer_mac(mut self, mac: Mac) -> Self {
        self.peer_mac = Some(mac);
        self
    }

    /// Sets the host end's MAC.
    pub fn host_mac(mut self, mac: Mac) -> Self {
        self.host_mac = Some(mac);
        self
    }

    /// Creates the host end up (see [`VethSpec::host_up`]): one request and one link notification fewer.
    pub fn host_up(mut self) -> Self {
        self.host_up = true;
        self
    }

    /// Steps for the host end (a sysctl, link up, ...) run right after the pair exists, with no second round
    /// trip; if one fails, a pair this call created is deleted again. Steps the create request already did
    /// on a new pair (its MTU, MACs, up) are skipped; they run on a found one.
    pub fn then(mut self, ops: impl IntoIterator<Item = NetOp>) -> Self {
        self.then.extend(ops);
        self
    }

    /// Steps for the pod end (addresses, routes, link up, sysctls, TX checksum) run in `peer_netns` in the
    /// same round trip, over a netlink socket opened there for the call: no thread of the pod's namespace.
    /// Sysctls and [`NetOp::TxChecksumOff`] run first, in order (they need the thread inside the namespace for
    /// a moment), then the other steps in order. If one fails, a pair this call created is deleted again.
    pub fn peer_then(mut self, ops: impl IntoIterator<Item = NetOp>) -> Self {
        self.peer_then.extend(ops);
        self
    }
}

/// What [`Netdev::create_veth`](crate::Netdev::create_veth) found or made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VethPair {
    /// The pair was created by this call (false: a matching host end existed already).
    pub created: bool,
    /// The host end after [`VethSpec::then`] ran.
    pub host: Link,
    /// The pod end after [`VethSpec::peer_then`] ran; `None` when there were no pod-end steps.
    pub peer: Option<Link>,
}

/// Turns `net.ipv6.conf.eth0.accept_dad` or `net/ipv6/conf/eth0/accept_dad` into a path under `/proc/sys`.
///
/// The dotted form cannot name interfaces with dots in them (`eth0.100`); use the slash form for those.
pub fn sysctl_path(key: &str) -> Result<PathBuf> {
    let bad = || Error::InvalidSysctl {
        key: key.to_string(),
    };
    let rel = if key.contains('/') {
        key.to_string()
    } else {
        key.replace('.', "/")
    };
    if rel.is_empty()
        || rel.starts_with('/')
        || rel
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(bad());
    }
    if rel.bytes().any(|b| b == 0 || b.is_ascii_whitespace()) {
        return Err(bad());
    }
    Ok(PathBuf::from("/proc/sys").join(rel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifname_validation() {
        assert!(validate_ifname("eth0").is_ok());
        assert!(validate_ifname("123456789012345").is_ok());
        assert!(matches!(
            validate_ifname("1234567890123456"),
            Err(Error::InvalidName { .. })
        ));
        assert!(validate_ifname("").is_err());
        assert!(validate_ifname("a/b").is_err());
        assert!(validate_ifname("a b").is_err());
        assert!(validate_ifname("..").is_err());
    }

    #[test]
    fn kube_ovn_nic_names() {
        let id = "0123456789abcdef0123";
        assert_eq!(
            host_nic_name(id, "eth0").unwrap(),
            ("0123456789ab_h".into(), "0123456789ab_c".into())
        );
        assert_eq!(
            host_nic_name(id, "net1").unwrap(),
            ("01234567_net1_h".into(), "01234567_net1_c".into())
        );
        assert_eq!(
            host_nic_name(id, "pod1234567890a").unwrap().0,
            "01234_1234567_h"
        );
        assert_eq!(host_nic_name("short", "eth0").unwrap().0, "short_h");
        assert_eq!(host_nic_name("ab", "net1").unwrap().0, "ab_net1_h");
        for bad in ["", "a/b", "a b"] {
            assert!(
                matches!(
                    host_nic_name(bad, "eth0"),
                    Err(Error::InvalidContainerId { .. })
                ),
                "{bad:?}"
            );
        }
        for ifname in ["eth0", "net1", "eth12"] {
            assert!(host_nic_name(id, ifname).unwrap().0.len() <= MAX_IFNAME_LEN);
        }
    }

    #[test]
    fn sysctl_keys() {
        assert_eq!(
            sysctl_path("net.ipv6.conf.eth0.accept_dad").unwrap(),
            PathBuf::from("/proc/sys/net/ipv6/conf/eth0/accept_dad")
        );
        assert_eq!(
            sysctl_path("net/ipv4/conf/eth0.100/arp_notify").unwrap(),
            PathBuf::from("/proc/sys/net/ipv4/conf/eth0.100/arp_notify")
        );
        for bad in ["", "/etc/passwd", "net/../../etc", "net//x", "net.ipv4..x"] {
            assert!(
                matches!(sysctl_path(bad), Err(Error::InvalidSysctl { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn route_spec_checks() {
        let r = RouteSpec::default_via("10.0.0.1".parse().unwrap());
        assert_eq!(r.dst.to_string(), "0.0.0.0/0");
        assert_eq!(r.normalized_dst().unwrap().to_string(), "0.0.0.0/0");
        let r6 = RouteSpec::default_via("fd00::1".parse().unwrap());
        assert_eq!(r6.dst.to_string(), "::/0");
        let host_bits = RouteSpec::via("10.1.2.3/8".parse().unwrap(), "10.0.0.1".parse().unwrap());
        assert_eq!(
            host_bits.normalized_dst().unwrap().to_string(),
            "10.0.0.0/8"
        );
        let mixed = RouteSpec::via("10.0.0.0/8".parse().unwrap(), "fd00::1".parse().unwrap());
        assert!(matches!(
            mixed.normalized_dst(),
            Err(Error::InvalidRoute { .. })
        ));
        let nothing = RouteSpec {
            dst: "10.0.0.0/8".parse().unwrap(),
            gateway: None,
            dev: None,
        };
        assert!(nothing.normalized_dst().is_err());
    }
}
