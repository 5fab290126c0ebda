//! Centralized gateways: a subnet with `gatewayType: centralized` sends its pods' traffic for outside the
//! cluster to one of its gateway nodes (`gatewayNode`, names or `name:ip` pairs, then the nodes its
//! `gatewayNodeSelectors` choose, by name), which masquerades it. The VPC router's priority-29000 policy
//! `ip4.src == <cidr>` reroutes it to the active node's join address; with `enableEcmp` to every healthy
//! gateway node at once. `status.activateGateway` names the active ones.
//!
//! A gateway node is healthy while its Node is Ready and its join address answers the controller's checks
//! (the gateway check task, `gateway_check.rs`, every [`super::Config::gateway_check_interval`]): the
//! echo crosses the node's ovn-controller and ovs-vswitchd, so a node whose datapath stopped fails it within
//! a few intervals even while the Node still reads Ready. The subnets it serves are then reconciled to the
//! next node.
//!
//! This module is pure: the choice of gateways and their policies from what is known.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kubeovn_ovn::models::nb::LogicalRouterPolicyAction;
use kubeovn_ovn::northbound::RouterPolicy;

use super::plan::SubnetInfo;
use crate::naming::{self, external_ids as ext, priority};

/// Consecutive failed checks after which a gateway node counts as down.
pub const FAILURES_DOWN: u32 = 2;

/// What the checks found of each gateway node; a node not checked yet counts as up.
#[derive(Debug, Default)]
pub struct GatewayHealth {
    failures: Mutex<HashMap<String, u32>>,
}

impl GatewayHealth {
    /// Whether node `name` answers (or was never checked).
    pub fn is_up(&self, name: &str) -> bool {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .is_none_or(|f| *f < FAILURES_DOWN)
    }

    /// Records a check of node `name`; true if that turned it up or down.
    pub fn record(&self, name: &str, answered: bool) -> bool {
        let mut m = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let f = m.entry(name.to_owned()).or_insert(0);
        let was = *f < FAILURES_DOWN;
        *f = if answered { 0 } else { f.saturating_add(1) };
        was != (*f < FAILURES_DOWN)
    }

    /// Forgets nodes no longer checked.
    pub fn retain(&self, names: &[String]) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|n, _| names.contains(n));
    }
}

/// Whether a Node reports `Ready`.
pub fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The gateway nodes of a centralized subnet in order of preference: those `gatewayNode` names, then the
/// nodes its selectors choose (by name); each once.
pub fn candidates(info: &SubnetInfo, nodes: &[Arc<Node>]) -> Vec<String> {
    let mut out: Vec<String> = info.gateway_nodes.clone();
    let mut chosen: Vec<String> = nodes
        .iter()
        .filter(|n| {
            let labels = n.labels();
            info.gateway_selectors.iter().any(|s| s.matches(labels))
        })
        .map(|n| n.name_any())
        .collect();
    chosen.sort();
    out.extend(chosen);
    let mut seen = std::collections::HashSet::new();
    out.retain(|n| seen.insert(n.clone()));
    out
}

/// Whether `info` is a centralized subnet of the default VPC (its egress goes through gateway nodes).
pub fn centralized(info: &SubnetInfo, default_vpc: &str) -> bool {
    !info.join && info.vpc == default_vpc && info.gateway_type == "centralized"
}

/// The active gateways of a centralized subnet with their join addresses: the first healthy candidate, or
/// every healthy one with ECMP. `join_ips` gives each node's join addresses.
pub fn active(
    info: &SubnetInfo,
    nodes: &[Arc<Node>],
    join_ips: &[(String, Vec<IpAddr>)],
    health: &GatewayHealth,
) -> Vec<(String, Vec<IpAddr>)> {
    let healthy = candidates(info, nodes).into_iter().filter_map(|name| {
        let node = nodes.iter().find(|n| n.name_any() == name)?;
        let ips = join_ips.iter().find(|(n, _)| *n == name)?.1.clone();
        (node_ready(node) && health.is_up(&name)).then_some((name, ips))
    });
    if info.enable_ecmp {
        healthy.collect()
    } else {
        healthy.take(1).collect()
    }
}

/// The reroute policies of a centralized subnet to its `active` gateways (none when none is active).
pub fn policies(info: &SubnetInfo, active: &[(String, Vec<IpAddr>)]) -> Vec<RouterPolicy> {
    let mut out = Vec::new();
    for c in &info.cidrs {
        let hops: Vec<String> = active
            .iter()
            .filter_map(|(_, ips)| ips.iter().find(|ip| ip.is_ipv4() == c.is_ipv4()))
            .map(ToString::to_string)
            .collect();
        if hops.is_empty() {
            continue;
        }
        let fam = if c.is_ipv4() { "ip4" } else { "ip6" };
        out.push(
            RouterPolicy::new(
                &info.vpc,
                i64::from(priority::GATEWAY_ROUTER),
                format!("{fam}.src == {c}"),
                LogicalRouterPolicyAction::Reroute,
            )
            .nexthops(hops)
            .external_id(ext::VENDOR, naming::VENDOR)
            .external_id(ext::SUBNET, &info.name),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, ready: bool, labels: serde_json::Value) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
                "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}}))
            .expect("node"),
        )
    }

    fn info(ecmp: bool) -> SubnetInfo {
        let mut i = SubnetInfo {
            name: "s".into(),
            cidrs: vec!["10.9.0.0/24".parse().expect("cidr")],
            gateways: vec!["10.9.0.1".parse().expect("ip")],
            exclude_ips: vec![],
            vpc: "ovn-cluster".into(),
            provider: "ovn".into(),
            gateway_type: "centralized".into(),
            gateway_nodes: vec!["n3".into(), "n1".into()],
            gateway_selectors: vec![crate::selector::Selector::new(vec![
                crate::selector::Requirement::Equals("gw".into(), "yes".into()),
            ])],
            enable_ecmp: ecmp,
            ..SubnetInfo::default()
        };
        i.enable_lb = true;
        i
    }

    #[test]
    fn the_first_healthy_gateway_is_active_and_ecmp_takes_them_all() {
        let nodes = [
            node("n1", true, json!({})),
            node("n2", true, json!({"gw": "yes"})),
            node("n3", true, json!({})),
            node("n4", false, json!({"gw": "yes"})),
        ];
        let ips = |k: u8| vec![IpAddr::from([100, 64, 0, k])];
        let join: Vec<(String, Vec<IpAddr>)> = (1..=4).map(|k| (format!("n{k}"), ips(k))).collect();
        let h = GatewayHealth::default();
        let i = info(false);
        assert_eq!(candidates(&i, &nodes), ["n3", "n1", "n2", "n4"]);
        let names = |a: Vec<(String, Vec<IpAddr>)>| a.into_iter().map(|x| x.0).collect::<Vec<_>>();
        assert_eq!(names(active(&i, &nodes, &join, &h)), ["n3"]);
        // n3 misses one check: still up; two: down, n1 takes over; it answers again: back to n3.
        assert!(!h.record("n3", false));
        assert_eq!(names(active(&i, &nodes, &join, &h)), ["n3"]);
        assert!(h.record("n3", false));
        assert_eq!(names(active(&i, &nodes, &join, &h)), ["n1"]);
        let p = policies(&i, &active(&i, &nodes, &join, &h));
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].match_, "ip4.src == 10.9.0.0/24");
        assert_eq!(p[0].nexthops, ["100.64.0.1"]);
        assert!(h.record("n3", true));
        // ECMP: every healthy Ready one (n4 is not Ready).
        assert_eq!(
            names(active(&info(true), &nodes, &join, &h)),
            ["n3", "n1", "n2"]
        );
        // None healthy: no policy.
        let down = [node("n1", false, json!({})), node("n3", false, json!({}))];
        assert!(policies(&i, &active(&i, &down, &join, &h)).is_empty());
    }
}
