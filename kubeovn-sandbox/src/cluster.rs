//! A cluster on one machine: the first node is the machine's own network namespace (as a single-node
//! sandbox is), every node beyond it has a network namespace of its own, with its own Open_vSwitch database,
//! ovs-vswitchd on the userspace datapath, ovn-controller, kube-ovn-daemon and kubelet.
//!
//! The nodes share an underlay segment ([`Settings::underlay_cidr`], 198.18.0.0/24 by default, the range
//! RFC 2544 sets aside for such tests): each node's ovs-vswitchd holds a bridge named after the integration
//! bridge with `-ul` ([`underlay_bridge`]) whose own interface carries the node's underlay address, and
//! Geneve runs between those addresses through it, which is how the userspace datapath tunnels (Open
//! vSwitch's "userspace tunneling"). The first node's underlay bridge is also the segment's switch: each other
//! node joins it by a veth, one end a port of that bridge, the other (`ul0`) a port of the node's own.
//!
//! ```
//! use kubeovn_sandbox::cluster;
//! use kubeovn_sandbox::state::Settings;
//! let s = Settings::default();
//! assert_eq!(cluster::node_name(&s, 1), "sandbox");
//! assert_eq!(cluster::node_name(&s, 3), "sandbox3");
//! assert_eq!(cluster::node_ip(&s, 3).unwrap(), "198.18.0.3");
//! assert_eq!(cluster::underlay_bridge(&s), "br-sbx-ul");
//! ```

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kubeovn_netdev::ipnetwork::IpNetwork;
use kubeovn_netdev::{NetOp, Netdev, NetlinkNetdev, RouteSpec, VethSpec};
use kubeovn_ovn::vswitch::{BridgeSpec, OpenVSwitch, OvsBatch, OvsdbOpenVSwitch, PortSpec};

use crate::block_on_thread;
use crate::state::Settings;
use crate::SandboxError;

/// The underlay end of a node's veth inside its namespace.
pub const NODE_UNDERLAY_NIC: &str = "ul0";

fn failed(what: &'static str, detail: impl Into<String>) -> SandboxError {
    SandboxError::Failed {
        what,
        detail: detail.into(),
    }
}

/// The name of node `k` (1-based): the first keeps [`Settings::node_name`], the others add their number.
pub fn node_name(s: &Settings, k: usize) -> String {
    if k <= 1 {
        s.node_name.clone()
    } else {
        format!("{}{k}", s.node_name)
    }
}

/// Node `k`'s underlay address: the `k`-th address of [`Settings::underlay_cidr`].
pub fn node_ip(s: &Settings, k: usize) -> Result<String, SandboxError> {
    let net: IpNetwork = s
        .underlay_cidr
        .parse()
        .map_err(|e| failed("underlay CIDR", format!("{}: {e}", s.underlay_cidr)))?;
    let IpNetwork::V4(v4) = net else {
        return Err(failed("underlay CIDR", "an IPv4 CIDR is needed"));
    };
    let k = u32::try_from(k).map_err(|_| failed("underlay CIDR", "too many nodes"))?;
    if k == 0 || u64::from(k) + 1 >= u64::from(v4.size()) {
        return Err(failed(
            "underlay CIDR",
            format!("{} has no address for node {k}", s.underlay_cidr),
        ));
    }
    Ok(Ipv4Addr::from(u32::from(v4.network()) + k).to_string())
}

/// Node `k`'s underlay address with the segment's prefix length (`198.18.0.3/24`).
pub fn node_ip_cidr(s: &Settings, k: usize) -> Result<IpNetwork, SandboxError> {
    let prefix = s
        .underlay_cidr
        .rsplit_once('/')
        .map(|(_, p)| p)
        .unwrap_or("24");
    format!("{}/{prefix}", node_ip(s, k)?)
        .parse()
        .map_err(|e| failed("underlay address", format!("{e}")))
}

/// The network namespace of node `k` (beyond the first).
pub fn node_netns(s: &Settings, k: usize) -> String {
    format!("{}-node{k}", s.netns_prefix)
}

/// The first node's end of node `k`'s underlay veth.
pub fn host_veth(s: &Settings, k: usize) -> String {
    format!("{}-ul{k}", s.netns_prefix)
}

/// The underlay bridge of every node.
pub fn underlay_bridge(s: &Settings) -> String {
    format!("{}-ul", s.bridge)
}

/// The settings of node `k` beyond the first, from the cluster's (`sb_remote`: the cluster's southbound).
pub fn node_settings(s: &Settings, k: usize, sb_remote: &str) -> Result<Settings, SandboxError> {
    let mut n = s.clone();
    n.node_name = node_name(s, k);
    n.node_ip = node_ip(s, k)?;
    n.node_netns = Some(node_netns(s, k));
    n.sb_remote = Some(sb_remote.to_owned());
    n.schedules = false;
    // Pod namespaces of their own prefix, so `down` of the node removes just its own.
    n.netns_prefix = format!("{}n{k}", s.netns_prefix);
    Ok(n)
}

/// The path of a node's namespace.
pub fn netns_path(s: &Settings) -> Option<PathBuf> {
    s.node_netns.as_ref().map(|n| s.netns_dir.join(n))
}

/// The netlink handle of a node's own namespace (the machine's for the first node).
pub fn netdev(s: &Settings) -> Result<NetlinkNetdev, SandboxError> {
    match netns_path(s) {
        Some(p) => NetlinkNetdev::open(p),
        None => NetlinkNetdev::current(),
    }
    .map_err(|e| failed("netlink", e.to_string()))
}

/// Adds the underlay bridge to a node's ovs-vswitchd (with `ports`), gives its interface `addr` in the
/// node's namespace and brings it up once ovs-vswitchd has made it.
pub async fn underlay(
    ovs_remote: &str,
    s: &Settings,
    addr: IpNetwork,
    ports: &[String],
) -> Result<(), SandboxError> {
    let ovs = OvsdbOpenVSwitch::connect(ovs_remote)
        .await
        .map_err(SandboxError::ovsdb)?;
    let br = underlay_bridge(s);
    let mut b = OvsBatch::new();
    b.add(BridgeSpec::new(&br).datapath_type("netdev"));
    for p in ports {
        b.add(PortSpec::new(&br, p));
    }
    ovs.commit(b).await.map_err(SandboxError::ovsdb)?;
    let nd = netdev(s)?;
    let t0 = Instant::now();
    while nd
        .link(&br)
        .await
        .map_err(|e| failed("underlay bridge", e.to_string()))?
        .is_none()
    {
        if t0.elapsed() > Duration::from_secs(15) {
            return Err(SandboxError::Timeout {
                what: format!("ovs-vswitchd to make {br}"),
                log: String::new(),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    nd.add_address(&br, addr)
        .await
        .map_err(|e| failed("underlay address", e.to_string()))?;
    nd.set_link_up(&br, true)
        .await
        .map_err(|e| failed("underlay bridge up", e.to_string()))?;
    Ok(())
}

/// Creates node `k`'s namespace and its underlay veth (both ends up), and plugs the first node's end into
/// the first node's underlay bridge (`first_ovs`: its Open_vSwitch database). Returns the namespace's path.
pub async fn wire_node(
    cluster: &Settings,
    node: &Settings,
    k: usize,
    first_ovs: &str,
) -> Result<PathBuf, SandboxError> {
    let name = node_netns(cluster, k);
    let path = kubeovn_netdev::create_named_netns(&cluster.netns_dir, &name)
        .map_err(|e| failed("node namespace", e.to_string()))?;
    let inside = netdev(node)?;
    inside
        .set_link_up("lo", true)
        .await
        .map_err(|e| failed("node loopback", e.to_string()))?;
    let host = NetlinkNetdev::current().map_err(|e| failed("netlink", e.to_string()))?;
    let mut spec = VethSpec::new(host_veth(cluster, k), NODE_UNDERLAY_NIC, &path);
    spec.host_up = true;
    host.create_veth(&spec)
        .await
        .map_err(|e| failed("underlay veth", e.to_string()))?;
    // The userspace datapath forwards a veth's partial checksums as they are: TCP and UDP would fail.
    host.apply(&[NetOp::tx_checksum_off(host_veth(cluster, k))])
        .await
        .map_err(|e| failed("underlay veth", e.to_string()))?;
    inside
        .apply(&[
            NetOp::tx_checksum_off(NODE_UNDERLAY_NIC),
            NetOp::up(NODE_UNDERLAY_NIC),
        ])
        .await
        .map_err(|e| failed("underlay veth up", e.to_string()))?;
    let ovs = OvsdbOpenVSwitch::connect(first_ovs)
        .await
        .map_err(SandboxError::ovsdb)?;
    let mut b = OvsBatch::new();
    b.add(PortSpec::new(
        underlay_bridge(cluster),
        host_veth(cluster, k),
    ));
    ovs.commit(b).await.map_err(SandboxError::ovsdb)?;
    Ok(path)
}

/// The namespace standing for the world beyond the cluster.
pub fn external_netns(s: &Settings) -> String {
    format!("{}-ext", s.netns_prefix)
}

/// The first node's end of the external namespace's veth.
pub fn external_veth(s: &Settings) -> String {
    format!("{}-ulx", s.netns_prefix)
}

/// The external namespace's address on the underlay: the segment's last usable one.
pub fn external_underlay_ip(s: &Settings) -> Result<IpAddr, SandboxError> {
    let net: IpNetwork = s
        .underlay_cidr
        .parse()
        .map_err(|e| failed("underlay CIDR", format!("{}: {e}", s.underlay_cidr)))?;
    match net {
        IpNetwork::V4(v4) if v4.prefix() <= 29 => {
            Ok(IpAddr::V4(Ipv4Addr::from(u32::from(v4.broadcast()) - 1)))
        }
        _ => Err(failed(
            "underlay CIDR",
            format!(
                "{} leaves no address for the external network",
                s.underlay_cidr
            ),
        )),
    }
}

/// The address a server in the external namespace listens on: the first of [`Settings::external_cidr`].
pub fn external_ip(s: &Settings) -> Result<IpAddr, SandboxError> {
    match s.external_cidr.parse::<IpNetwork>() {
        Ok(IpNetwork::V4(v4)) if v4.prefix() < 32 => {
            Ok(IpAddr::V4(Ipv4Addr::from(u32::from(v4.network()) + 1)))
        }
        _ => Err(failed(
            "external CIDR",
            format!("{}: an IPv4 CIDR with room for an address", s.external_cidr),
        )),
    }
}

/// Creates the external namespace on the underlay (its veth's other end a port of the first node's
/// underlay bridge), with [`external_ip`] on its loopback. Returns the namespace's path.
pub async fn wire_external(cluster: &Settings, first_ovs: &str) -> Result<PathBuf, SandboxError> {
    let name = external_netns(cluster);
    let path = kubeovn_netdev::create_named_netns(&cluster.netns_dir, &name)
        .map_err(|e| failed("external namespace", e.to_string()))?;
    let ext = NetlinkNetdev::open(&path).map_err(|e| failed("netlink", e.to_string()))?;
    let host = NetlinkNetdev::current().map_err(|e| failed("netlink", e.to_string()))?;
    let mut spec = VethSpec::new(external_veth(cluster), NODE_UNDERLAY_NIC, &path);
    spec.host_up = true;
    host.create_veth(&spec)
        .await
        .map_err(|e| failed("external veth", e.to_string()))?;
    let prefix = cluster
        .underlay_cidr
        .rsplit_once('/')
        .map(|(_, p)| p)
        .unwrap_or("24");
    let on_underlay: IpNetwork = format!("{}/{prefix}", external_underlay_ip(cluster)?)
        .parse()
        .map_err(|e| failed("external address", format!("{e}")))?;
    let world = IpNetwork::from(external_ip(cluster)?);
    host.apply(&[NetOp::tx_checksum_off(external_veth(cluster))])
        .await
        .map_err(|e| failed("external veth", e.to_string()))?;
    ext.apply(&[
        NetOp::up("lo"),
        NetOp::address("lo", world),
        // The userspace datapath forwards a veth's partial checksums as they are: TCP and UDP would fail.
        NetOp::tx_checksum_off(NODE_UNDERLAY_NIC),
        NetOp::address(NODE_UNDERLAY_NIC, on_underlay),
        NetOp::up(NODE_UNDERLAY_NIC),
    ])
    .await
    .map_err(|e| failed("external namespace", e.to_string()))?;
    let ovs = OvsdbOpenVSwitch::connect(first_ovs)
        .await
        .map_err(SandboxError::ovsdb)?;
    let mut b = OvsBatch::new();
    b.add(PortSpec::new(
        underlay_bridge(cluster),
        external_veth(cluster),
    ));
    ovs.commit(b).await.map_err(SandboxError::ovsdb)?;
    Ok(path)
}

/// Routes the external range from a node (in its namespace) through the external namespace's underlay
/// address.
pub async fn route_external(cluster: &Settings, node: &Settings) -> Result<(), SandboxError> {
    let dst: IpNetwork = cluster
        .external_cidr
        .parse()
        .map_err(|e| failed("external CIDR", format!("{}: {e}", cluster.external_cidr)))?;
    netdev(node)?
        .add_route(&RouteSpec::via(dst, external_underlay_ip(cluster)?))
        .await
        .map_err(|e| failed("route to the external network", e.to_string()))
}

/// Removes the daemon's NAT table from a node's namespace (the first node's is this machine's).
pub fn remove_nat(s: &Settings) {
    let s = s.clone();
    block_on_thread(async move {
        if let Ok(nd) = netdev(&s) {
            let _ = nd
                .set_nat(
                    kubeovn_cni::node::NAT_TABLE,
                    &kubeovn_netdev::NatRules::default(),
                )
                .await;
        }
    });
}

/// Deletes link `name` from this machine's namespace if it is there.
pub fn delete_host_link(name: &str) {
    let name = name.to_owned();
    block_on_thread(async move {
        if let Ok(h) = NetlinkNetdev::current() {
            if let Ok(Some(_)) = h.link(&name).await {
                let _ = h.delete_link(&name).await;
            }
        }
    });
}

/// Removes node `k`'s namespace (its links and pods' host ends go with it) and the first node's end of its
/// veth. Idempotent.
pub fn unwire_node(cluster: &Settings, node_netns_name: &str, host_end: &str) {
    let _ = kubeovn_netdev::delete_named_netns(&cluster.netns_dir, node_netns_name);
    delete_host_link(host_end);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_named_and_addressed_in_order() {
        let s = Settings::default();
        assert_eq!(node_name(&s, 2), "sandbox2");
        assert_eq!(node_ip(&s, 1).expect("ip"), "198.18.0.1");
        assert_eq!(
            node_ip_cidr(&s, 2).expect("cidr").to_string(),
            "198.18.0.2/24"
        );
        assert_eq!(node_netns(&s, 2), "sbx-node2");
        assert_eq!(host_veth(&s, 2), "sbx-ul2");
        let n = node_settings(&s, 2, "unix:/x/sb.sock").expect("settings");
        assert_eq!(n.node_name, "sandbox2");
        assert_eq!(n.node_ip, "198.18.0.2");
        assert!(!n.schedules);
        assert_eq!(n.netns_prefix, "sbxn2");
        assert_eq!(n.sb_remote.as_deref(), Some("unix:/x/sb.sock"));
        // A segment too small, an IPv6 one, node 0: refused.
        let small = Settings {
            underlay_cidr: "198.18.0.0/30".into(),
            ..Settings::default()
        };
        assert!(node_ip(&small, 2).is_ok());
        assert!(node_ip(&small, 3).is_err());
        assert!(node_ip(&s, 0).is_err());
        let v6 = Settings {
            underlay_cidr: "fd00::/64".into(),
            ..Settings::default()
        };
        assert!(node_ip(&v6, 1).is_err());
        assert_eq!(
            external_underlay_ip(&s).expect("ip").to_string(),
            "198.18.0.254"
        );
        assert_eq!(external_ip(&s).expect("ip").to_string(), "198.51.100.1");
        assert_eq!(external_netns(&s), "sbx-ext");
        assert!(external_underlay_ip(&small).is_err());
    }
}
