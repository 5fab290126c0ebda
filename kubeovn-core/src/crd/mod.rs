//! Kube-OVN's custom resources, `kubeovn.io/v1`, all cluster-scoped: [`Subnet`], [`Vpc`], [`IP`], [`IPPool`],
//! [`Vlan`] and [`ProviderNetwork`], with Kube-OVN's field names so existing manifests deserialize; unknown
//! fields are ignored. CIDRs and addresses stay strings in Kube-OVN's format (`"10.16.0.0/16,fd00::/64"`):
//! parse them at the edge.
//!
//! [`AdminNetworkPolicy`] and [`BaselineAdminNetworkPolicy`] are the network-policy-api project's,
//! `policy.networking.k8s.io/v1alpha1`: their one-of fields stay options, checked by their `validate`.
//!
//! [`crds`] returns the CustomResourceDefinitions, [`crds_yaml`] their YAML documents.

mod anp;
mod common;
mod conditions;
mod decoded;
mod ip;
mod ippool;
mod provider_network;
mod subnet;
mod vlan;
mod vpc;
pub mod yaml;

pub use crate::error::{AnpError, OneOfError};
pub use anp::{
    AdminNetworkPolicy, AdminNetworkPolicyEgressPeer, AdminNetworkPolicyEgressRule,
    AdminNetworkPolicyIngressPeer, AdminNetworkPolicyIngressRule, AdminNetworkPolicyPort,
    AdminNetworkPolicyRuleAction, AdminNetworkPolicySpec, AdminNetworkPolicyStatus,
    AdminNetworkPolicySubject, BaselineAdminNetworkPolicy, BaselineAdminNetworkPolicyEgressPeer,
    BaselineAdminNetworkPolicyEgressRule, BaselineAdminNetworkPolicyIngressRule,
    BaselineAdminNetworkPolicyRuleAction, BaselineAdminNetworkPolicySpec,
    BaselineAdminNetworkPolicyStatus, EgressSelection, NamespacedPod, PodSelection, PortNumber,
    PortProtocol, PortRange, PortSelection, BASELINE_NAME, MAX_API_PRIORITY, MAX_NETWORKS,
    MAX_PEERS, MAX_PORTS, MAX_PRIORITY, MAX_RULES, MAX_RULE_NAME, POLICY_GROUP, POLICY_VERSION,
};
pub use common::{Condition, ConditionStatus, IpCount};
pub use conditions::{condition_types, reasons, Conditions, ConditionsOnly, StatusPatch};
pub use decoded::Decoded;
pub use ip::{IPSpec, IP};
pub use ippool::{IPPool, IPPoolSpec, IPPoolStatus};
pub use provider_network::{
    CustomInterface, ProviderNetwork, ProviderNetworkCondition, ProviderNetworkSpec,
    ProviderNetworkStatus,
};
pub use subnet::{
    Acl, GatewayType, NatOutgoingPolicyMatch, NatOutgoingPolicyRule, NatOutgoingPolicyRuleStatus,
    Protocol, Subnet, SubnetSpec, SubnetStatus, SubnetUsage, U2oFeatures,
};
pub use vlan::{Vlan, VlanSpec, VlanStatus};
pub use vpc::{
    BfdPort, BfdPortStatus, PolicyRoute, StaticRoute, Vpc, VpcPeering, VpcSpec, VpcStatus,
};

pub use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use kube::CustomResourceExt;

/// The API group of every Kube-OVN resource.
pub const GROUP: &str = "kubeovn.io";
/// The API version of every Kube-OVN resource here.
pub const VERSION: &str = "v1";

/// The CustomResourceDefinitions of every resource in this module.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        Subnet::crd(),
        Vpc::crd(),
        IP::crd(),
        IPPool::crd(),
        Vlan::crd(),
        ProviderNetwork::crd(),
        AdminNetworkPolicy::crd(),
        BaselineAdminNetworkPolicy::crd(),
    ]
}

/// The CRDs as YAML documents separated by `---`, ready for `kubectl apply -f -`.
pub fn crds_yaml() -> String {
    let mut out = String::new();
    for (i, crd) in crds().iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        // A CRD is plain data: serialising it into a JSON value cannot fail.
        let v = serde_json::to_value(crd).unwrap_or_default();
        out.push_str(&yaml::to_string(&v));
    }
    out
}

#[cfg(test)]
mod tests;
