//! Node start: chassis settings, the integration bridge, and the node's `ovn0` port on the join network.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipnetwork::IpNetwork;
use kubeovn_core::naming;
use kubeovn_netdev::{Mac, Netdev, RouteSpec};
use kubeovn_ovn::vswitch::{BridgeSpec, GlobalSpec, OpenVSwitch, OvsBatch, PortSpec};

use super::DaemonError;

/// The node's address on the join network (the node annotations `ovn.kubernetes.io/ip_address`,
/// `mac_address`, `cidr`, `gateway`) and the pod CIDRs routed through it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinNetwork {
    /// The node's join addresses with the join subnet's prefix.
    pub ips: Vec<IpNetwork>,
    /// The MAC of the node's port (the logical switch port `node-<node>` expects it).
    pub mac: Mac,
    /// The join subnet's gateways (the cluster router's port).
    pub gateways: Vec<IpAddr>,
    /// Pod subnets reached through the join gateway.
    pub pod_cidrs: Vec<IpNetwork>,
}

/// What node start writes.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The node's name (`system-id`, and `iface-id=node-<name>` of its join port).
    pub node_name: String,
    /// The integration bridge.
    pub bridge: String,
    /// Its datapath type (`system`, or `netdev` for the userspace datapath).
    pub datapath_type: String,
    /// The southbound database (`ovn-remote`).
    pub ovn_remote: String,
    /// `ovn-encap-type` (`geneve`, `vxlan`, `stt`).
    pub encap_type: String,
    /// `ovn-encap-ip`: the node's tunnel endpoint.
    pub encap_ip: String,
    /// MTU of the node's join interface.
    pub mtu: u32,
    /// The join interface's name.
    pub nic: String,
    /// The join network; `None` skips the join port (the controller has not allocated it yet).
    pub join: Option<JoinNetwork>,
    /// How long to wait for ovs-vswitchd to create the join interface.
    pub timeout: Duration,
}

impl NodeConfig {
    /// Defaults: `br-int` on the `system` datapath, geneve, MTU 1400, `ovn0`, no join network.
    pub fn new(node_name: impl Into<String>, ovn_remote: impl Into<String>) -> Self {
        NodeConfig {
            node_name: node_name.into(),
            bridge: "br-int".into(),
            datapath_type: "system".into(),
            ovn_remote: ovn_remote.into(),
            encap_type: "geneve".into(),
            encap_ip: "127.0.0.1".into(),
            mtu: 1400,
            nic: naming::NODE_NIC.into(),
            join: None,
            timeout: Duration::from_secs(10),
        }
    }
}

/// The batch node start commits: the Open_vSwitch row's chassis keys, the bridge (fail mode secure, so
/// nothing flows before ovn-controller's flows), and the join port (internal, `iface-id=node-<node>`).
pub fn node_batch(cfg: &NodeConfig) -> OvsBatch {
    let mut b = OvsBatch::new();
    b.add(
        GlobalSpec::new()
            .external_id("system-id", &cfg.node_name)
            .external_id("ovn-remote", &cfg.ovn_remote)
            .external_id("ovn-encap-type", &cfg.encap_type)
            .external_id("ovn-encap-ip", &cfg.encap_ip)
            .external_id("ovn-bridge", &cfg.bridge)
            .external_id("ovn-bridge-datapath-type", &cfg.datapath_type),
    );
    b.add(
        BridgeSpec::new(&cfg.bridge)
            .datapath_type(&cfg.datapath_type)
            .fail_mode(kubeovn_ovn::vswitch::BridgeFailMode::Secure),
    );
    if let Some(join) = &cfg.join {
        let ips = join
            .ips
            .iter()
            .map(|i| i.ip().to_string())
            .collect::<Vec<_>>()
            .join(",");
        b.add(
            PortSpec::new(&cfg.bridge, &cfg.nic)
                .iface_type("internal")
                .iface_id(naming::node_port(&cfg.node_name))
                .external_id("ip", ips)
                .mtu_request(i64::from(cfg.mtu)),
        );
    }
    b
}

/// Node start: commits [`node_batch`], then configures the join interface in `host` (the namespace where
/// ovs-vswitchd creates it): MAC, MTU, addresses, up, and routes to the pod CIDRs via the join gateway.
/// Idempotent.
pub async fn init_node(
    ovs: &dyn OpenVSwitch,
    host: &dyn Netdev,
    cfg: &NodeConfig,
) -> Result<(), DaemonError> {
    ovs.commit(node_batch(cfg))
        .await
        .map_err(|e| DaemonError::Node(format!("Open_vSwitch: {e}")))?;
    let Some(join) = &cfg.join else {
        return Ok(());
    };
    let net = |what: &str, e: kubeovn_netdev::Error| DaemonError::Node(format!("{what}: {e}"));
    let t0 = Instant::now();
    // ovs-vswitchd creates the internal interface once it sees the port.
    while host
        .link(&cfg.nic)
        .await
        .map_err(|e| net("look up join interface", e))?
        .is_none()
    {
        if t0.elapsed() > cfg.timeout {
            return Err(DaemonError::Node(format!(
                "ovs-vswitchd did not create {} in {:?}",
                cfg.nic, cfg.timeout
            )));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    host.set_link_mac(&cfg.nic, join.mac)
        .await
        .map_err(|e| net("set join MAC", e))?;
    host.set_link_mtu(&cfg.nic, cfg.mtu)
        .await
        .map_err(|e| net("set join MTU", e))?;
    for ip in &join.ips {
        host.add_address(&cfg.nic, *ip)
            .await
            .map_err(|e| net("add join address", e))?;
    }
    host.set_link_up(&cfg.nic, true)
        .await
        .map_err(|e| net("set join interface up", e))?;
    for cidr in &join.pod_cidrs {
        let Some(gw) = join.gateways.iter().find(|g| g.is_ipv4() == cidr.is_ipv4()) else {
            continue;
        };
        host.add_route(&RouteSpec::via(*cidr, *gw))
            .await
            .map_err(|e| net("add pod CIDR route", e))?;
    }
    Ok(())
}

/// The routes the node keeps on its join interface `nic`: each of `cidrs` (host bits cleared) via the join
/// gateway of its family, except the join subnet itself (a connected route on `nic` already) and CIDRs of a
/// family the join network has no gateway for.
pub fn join_routes(join: &JoinNetwork, nic: &str, cidrs: &[IpNetwork]) -> Vec<RouteSpec> {
    let mut out: Vec<RouteSpec> = Vec::new();
    for cidr in cidrs {
        let dst = IpNetwork::new(cidr.network(), cidr.prefix()).unwrap_or(*cidr);
        let on_join = join
            .ips
            .iter()
            .any(|j| j.prefix() == dst.prefix() && j.network() == dst.network());
        let Some(gw) = join.gateways.iter().find(|g| g.is_ipv4() == dst.is_ipv4()) else {
            continue;
        };
        if on_join || out.iter().any(|r| r.dst == dst) {
            continue;
        }
        out.push(RouteSpec {
            dst,
            gateway: Some(*gw),
            dev: Some(nic.to_owned()),
        });
    }
    out
}

/// What [`sync_join_routes`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteChanges {
    /// Routes added.
    pub added: Vec<RouteSpec>,
    /// Routes deleted (no longer wanted, or through another gateway).
    pub deleted: Vec<RouteSpec>,
    /// Routes that could not be added or deleted, with why (the others are still synced).
    pub failed: Vec<String>,
}

/// Makes the gateway routes on `nic` exactly `want` (from [`join_routes`]): deletes every other route of
/// the main table that leaves through `nic` via a gateway (a deleted subnet's, one left by an earlier run),
/// then adds the missing ones. Idempotent; a missing `nic` is an error, one route that fails (another route
/// to its destination, say) is reported in [`RouteChanges::failed`] and does not stop the others.
pub async fn sync_join_routes(
    host: &dyn Netdev,
    nic: &str,
    want: &[RouteSpec],
) -> Result<RouteChanges, DaemonError> {
    let net = |what: &str, e: kubeovn_netdev::Error| DaemonError::Node(format!("{what}: {e}"));
    let link = host
        .link(nic)
        .await
        .map_err(|e| net("look up join interface", e))?
        .ok_or_else(|| DaemonError::Node(format!("join interface {nic} missing")))?;
    let have: Vec<RouteSpec> = host
        .routes()
        .await
        .map_err(|e| net("list routes", e))?
        .into_iter()
        .filter(|r| r.oif == Some(link.index) && r.gateway.is_some())
        .map(|r| RouteSpec {
            dst: r.dst,
            gateway: r.gateway,
            dev: Some(nic.to_owned()),
        })
        .collect();
    let mut changes = RouteChanges::default();
    for r in have.iter().filter(|r| !want.contains(r)) {
        match host.del_route(r).await {
            Ok(()) => changes.deleted.push(r.clone()),
            Err(e) => changes.failed.push(format!("delete route {r}: {e}")),
        }
    }
    for r in want.iter().filter(|r| !have.contains(r)) {
        match host.add_route(r).await {
            Ok(()) => changes.added.push(r.clone()),
            Err(e) => changes.failed.push(format!("add route {r}: {e}")),
        }
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeovn_ovn::vswitch::OvsOp;

    #[test]
    fn batch() {
        let mut cfg = NodeConfig::new("n1", "tcp:10.0.0.1:6642");
        assert_eq!(node_batch(&cfg).len(), 2);
        cfg.join = Some(JoinNetwork {
            ips: vec!["100.64.0.2/16".parse().unwrap()],
            mac: "00:00:00:11:22:33".parse().unwrap(),
            gateways: vec!["100.64.0.1".parse().unwrap()],
            pod_cidrs: vec!["10.16.0.0/16".parse().unwrap()],
        });
        let b = node_batch(&cfg);
        let OvsOp::Port(p) = &b.ops[2] else {
            panic!("{b:?}")
        };
        assert_eq!(p.iface_type.as_deref(), Some("internal"));
        assert_eq!(
            p.external_ids.get("iface-id"),
            Some(&Some("node-n1".to_owned()))
        );
        let OvsOp::Global(g) = &b.ops[0] else {
            panic!()
        };
        assert_eq!(
            g.external_ids.get("ovn-remote"),
            Some(&Some("tcp:10.0.0.1:6642".to_owned()))
        );
    }
}
