//! Which Subnets the node routes through the join gateway: read by the join port's route sync
//! ([`super::NodeSync`]) and the masquerade of pods' egress ([`super::nat_rules`]).

use std::sync::Arc;

use ipnetwork::IpNetwork;
use kubeovn_core::crd::{condition_types, Conditions, Subnet};

/// Whether a subnet's CIDRs are routed from the node through the join gateway, as Kube-OVN's daemon decides
/// (`reconcileRouters`): subnets of the default VPC (`spec.vpc` empty or `default_vpc`), not underlay ones
/// (a VLAN without a logical gateway, unless U2O interconnection without load balancers), and only once the
/// controller validated it (`Validated` = True): a subnet still pending or refused may hold a node's address
/// or overlap the join or service range, and a route to it could cut the node off.
pub fn subnet_is_routed(s: &Subnet, default_vpc: &str) -> bool {
    let spec = &s.spec;
    if !(spec.vpc.is_empty() || spec.vpc == default_vpc) {
        return false;
    }
    let underlay = !spec.vlan.is_empty()
        && !spec.logical_gateway
        && (!spec.u2o_interconnection || spec.enable_lb == Some(true));
    if underlay {
        return false;
    }
    s.status.as_ref().is_some_and(|st| {
        st.condition(condition_types::VALIDATED)
            .is_some_and(|c| c.status == "True")
    })
}

/// The CIDRs of the routed subnets ([`subnet_is_routed`]), in name order; a subnet whose `spec.cidrBlock`
/// does not parse is left out (the controller reports it on the subnet).
pub fn routed_cidrs(subnets: &[Arc<Subnet>], default_vpc: &str) -> Vec<IpNetwork> {
    let mut routed: Vec<&Arc<Subnet>> = subnets
        .iter()
        .filter(|s| subnet_is_routed(s, default_vpc))
        .collect();
    routed.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    routed
        .into_iter()
        .filter_map(|s| s.cidrs().ok())
        .flatten()
        .collect()
}
