//! The node's masquerade of pods' egress, Kube-OVN's `natOutgoing`: a pod's packet to outside the cluster
//! leaves the VPC router for its node's join address (the distributed gateway) or a gateway node's
//! (centralized), and that node rewrites its source to its own address, unless the subnet's
//! `natOutgoingPolicyRules` say `forward`. The rules live in the node's own nftables table [`NAT_TABLE`],
//! replaced whole as Subnets change ([`kubeovn_netdev::Netdev::set_nat`]).

use std::sync::Arc;

use ipnetwork::IpNetwork;
use kubeovn_core::crd::{GatewayType, Subnet};
use kubeovn_netdev::{NatAction, NatPolicyRule, NatRules, NatSource};

use super::routed::subnet_is_routed;

/// The node's nftables table (families `ip` and `ip6`).
pub const NAT_TABLE: &str = "kube-ovn";

/// Whether pods' egress of subnet `s` leaves the cluster through node `node`: every node for a distributed
/// subnet; for a centralized one its gateway nodes, named or chosen by selector (the controller's
/// `status.activateGateway`).
pub fn egress_through(s: &Subnet, node: &str) -> bool {
    match s.spec.gateway_type {
        Some(GatewayType::Centralized) => {
            let active = s
                .status
                .as_ref()
                .map(|st| st.activate_gateway.as_str())
                .unwrap_or_default();
            s.spec.gateway_node_names().iter().any(|n| n == node)
                || active.split(',').any(|n| n.trim() == node)
        }
        _ => true,
    }
}

/// Addresses or CIDRs, comma separated; what does not parse is left out (the controller reports it).
fn cidr_list(v: &str) -> Vec<IpNetwork> {
    v.split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .filter_map(|c| c.parse().ok())
        .collect()
}

/// What node `node` masquerades: the validated subnets of `default_vpc` with `natOutgoing` whose egress
/// leaves through it (in name order, with their policy rules), toward anything but `cluster` (the routed
/// subnets, the join subnet and the service ranges).
pub fn nat_rules(
    subnets: &[Arc<Subnet>],
    node: &str,
    default_vpc: &str,
    cluster: &[IpNetwork],
) -> NatRules {
    let mut nat: Vec<&Arc<Subnet>> = subnets
        .iter()
        .filter(|s| subnet_is_routed(s, default_vpc))
        .filter(|s| s.spec.nat_outgoing && egress_through(s, node))
        .collect();
    nat.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut sources = Vec::new();
    for s in nat {
        let rules: Vec<NatPolicyRule> = s
            .spec
            .nat_outgoing_policy_rules
            .iter()
            .map(|r| NatPolicyRule {
                src: cidr_list(&r.match_.src_ips),
                dst: cidr_list(&r.match_.dst_ips),
                action: if r.action == "forward" {
                    NatAction::Forward
                } else {
                    NatAction::Masquerade
                },
            })
            .collect();
        for cidr in s.cidrs().unwrap_or_default() {
            sources.push(NatSource {
                cidr,
                rules: rules.clone(),
            });
        }
    }
    let mut cluster = cluster.to_vec();
    cluster.sort();
    cluster.dedup();
    if sources.is_empty() {
        // Nothing to masquerade: no table at all.
        cluster.clear();
    }
    NatRules { cluster, sources }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    proptest! {
        /// Whatever a Subnet's policy rules and gateway nodes say: no panic, only its own CIDR is masqueraded,
        /// and only addresses that parse reach the rules.
        #[test]
        fn any_policy_text_gives_well_formed_rules(
            src in "[0-9a-f.:/, x]{0,40}",
            dst in "[0-9a-f.:/, x]{0,40}",
            action in "(nat|forward|[a-z]{0,6})",
            gateways in "[a-z0-9:.,]{0,20}",
            centralized in any::<bool>(),
        ) {
            let s = subnet(json!({"metadata": {"name": "s"}, "spec": {"cidrBlock": "10.9.0.0/16",
                "natOutgoing": true, "gatewayType": if centralized { "centralized" } else { "distributed" },
                "gatewayNode": gateways,
                "natOutgoingPolicyRules": [{"match": {"srcIPs": src, "dstIPs": dst}, "action": action}]}}));
            let r = nat_rules(&[s], "n1", "ovn-cluster", &[]);
            for source in &r.sources {
                prop_assert_eq!(source.cidr.to_string(), "10.9.0.0/16");
                prop_assert_eq!(source.rules.len(), 1);
                let rule = &source.rules[0];
                prop_assert_eq!(rule.src.len(), cidr_list(&src).len());
                prop_assert_eq!(rule.dst.len(), cidr_list(&dst).len());
                prop_assert_eq!(rule.action == NatAction::Forward, action == "forward");
            }
            // A centralized subnet is masqueraded here only if this node is one of its gateways.
            prop_assert_eq!(!r.sources.is_empty(), !centralized || gateways.split(',').any(|g| g.split(':').next() == Some("n1")));
        }
    }

    fn subnet(v: serde_json::Value) -> Arc<Subnet> {
        let mut s: Subnet = serde_json::from_value(v).expect("subnet");
        s.status = Some(
            serde_json::from_value(
                json!({"conditions": [{"type": "Validated", "status": "True"}]}),
            )
            .expect("status"),
        );
        Arc::new(s)
    }

    #[test]
    fn distributed_subnets_everywhere_centralized_on_their_gateways_only() {
        let subnets = [
            subnet(
                json!({"metadata": {"name": "b"}, "spec": {"cidrBlock": "10.2.0.0/16",
                "natOutgoing": true, "natOutgoingPolicyRules": [
                    {"match": {"dstIPs": "198.51.100.0/24, bad"}, "action": "forward"}]}}),
            ),
            subnet(
                json!({"metadata": {"name": "a"}, "spec": {"cidrBlock": "10.1.0.0/16,fd00:1::/64",
                "natOutgoing": true}}),
            ),
            subnet(
                json!({"metadata": {"name": "c"}, "spec": {"cidrBlock": "10.3.0.0/16",
                "natOutgoing": true, "gatewayType": "centralized", "gatewayNode": "n2:198.18.0.2,n3"}}),
            ),
            subnet(json!({"metadata": {"name": "d"}, "spec": {"cidrBlock": "10.4.0.0/16"}})),
            subnet(
                json!({"metadata": {"name": "e"}, "spec": {"cidrBlock": "10.5.0.0/16",
                "natOutgoing": true, "vpc": "other"}}),
            ),
        ];
        let cluster: Vec<IpNetwork> = ["100.64.0.0/16", "10.96.0.0/12", "100.64.0.0/16"]
            .iter()
            .map(|c| c.parse().expect("cidr"))
            .collect();
        let on = |node: &str| nat_rules(&subnets, node, "ovn-cluster", &cluster);
        let n1 = on("n1");
        let cidrs: Vec<String> = n1.sources.iter().map(|s| s.cidr.to_string()).collect();
        // a (both families) before b; the centralized c only on its gateways; d without NAT; e elsewhere.
        assert_eq!(cidrs, ["10.1.0.0/16", "fd00:1::/64", "10.2.0.0/16"]);
        assert_eq!(n1.cluster.len(), 2, "deduplicated: {:?}", n1.cluster);
        assert_eq!(
            n1.sources[2].rules,
            [NatPolicyRule {
                src: vec![],
                dst: vec!["198.51.100.0/24".parse().expect("cidr")],
                action: NatAction::Forward,
            }]
        );
        let n3 = on("n3");
        assert!(n3
            .sources
            .iter()
            .any(|s| s.cidr.to_string() == "10.3.0.0/16"));
        assert_eq!(subnets[2].spec.gateway_node_names(), ["n2", "n3"]);
        // No subnet to masquerade: no table.
        assert_eq!(
            nat_rules(&subnets[3..4], "n1", "ovn-cluster", &cluster),
            NatRules::default()
        );
    }
}
