//! The `Vpc` CRD: a logical router with its subnets, routes and policies.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{is_false, label_selector_schema, null_default, Condition};

/// Spec of a `Vpc`, with Kube-OVN's field names.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kubeovn.io",
    version = "v1",
    kind = "Vpc",
    plural = "vpcs",
    shortname = "vpc",
    status = "VpcStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A Kube-OVN VPC: a logical router with its subnets, static routes and policy routes",
    printcolumn = r#"{"name":"EnableExternal","type":"boolean","jsonPath":".status.enableExternal"}"#,
    printcolumn = r#"{"name":"EnableBfd","type":"boolean","jsonPath":".status.enableBfd"}"#,
    printcolumn = r#"{"name":"Standby","type":"boolean","jsonPath":".status.standby"}"#,
    printcolumn = r#"{"name":"Subnets","type":"string","jsonPath":".status.subnets"}"#,
    printcolumn = r#"{"name":"ExtraExternalSubnets","type":"string","jsonPath":".status.extraExternalSubnets"}"#,
    printcolumn = r#"{"name":"Namespaces","type":"string","jsonPath":".spec.namespaces"}"#,
    printcolumn = r#"{"name":"DefaultSubnet","type":"string","jsonPath":".status.defaultLogicalSwitch"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VpcSpec {
    /// Subnet given to the VPC's namespaces by default.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub default_subnet: String,
    /// Namespaces of the VPC.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub namespaces: Vec<String>,
    /// Static routes of the router.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub static_routes: Vec<StaticRoute>,
    /// Policy routes of the router.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub policy_routes: Vec<PolicyRoute>,
    /// Peerings with other VPCs.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub vpc_peerings: Vec<VpcPeering>,
    /// Connect the VPC to the external network.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub enable_external: bool,
    /// Further external subnets.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub extra_external_subnets: Vec<String>,
    /// BFD on the external gateway.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub enable_bfd: bool,
    /// BFD port of the VPC.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Option::is_none"
    )]
    pub bfd_port: Option<BfdPort>,
}

/// A static route of a VPC.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StaticRoute {
    /// `policyDst` or `policySrc`.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub policy: String,
    /// Destination (or source) CIDR.
    #[serde(default, deserialize_with = "null_default")]
    pub cidr: String,
    /// Next hop.
    #[serde(default, deserialize_with = "null_default", rename = "nextHopIP")]
    pub next_hop_ip: String,
    /// `ecmp` or `ecmp_symmetric_reply`.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub ecmp_mode: String,
    /// BFD session id.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub bfd_id: String,
    /// Route table.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub route_table: String,
}

/// A policy route of a VPC.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRoute {
    /// Priority (0..32767).
    #[serde(default, deserialize_with = "null_default")]
    pub priority: i32,
    /// OVN match expression.
    #[serde(rename = "match", default, deserialize_with = "null_default")]
    pub match_: String,
    /// `allow`, `drop` or `reroute`.
    #[serde(default, deserialize_with = "null_default")]
    pub action: String,
    /// Next hop of a reroute.
    #[serde(
        default,
        deserialize_with = "null_default",
        rename = "nextHopIP",
        skip_serializing_if = "String::is_empty"
    )]
    pub next_hop_ip: String,
}

/// A peering with another VPC.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VpcPeering {
    /// The other VPC.
    #[serde(default, deserialize_with = "null_default")]
    pub remote_vpc: String,
    /// Local address of the peering link.
    #[serde(default, deserialize_with = "null_default", rename = "localConnectIP")]
    pub local_connect_ip: String,
}

/// BFD port of a VPC.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BfdPort {
    /// Whether the port exists.
    #[serde(default, deserialize_with = "null_default")]
    pub enabled: bool,
    /// Its address.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub ip: String,
    /// Nodes that host it.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "label_selector_schema")]
    pub node_selector: Option<LabelSelector>,
}

/// Status of a BFD port.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BfdPortStatus {
    /// Port name.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub name: String,
    /// Port address.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub ip: String,
    /// Nodes hosting it.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub nodes: Vec<String>,
}

/// Status of a `Vpc`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VpcStatus {
    /// Conditions.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions: Vec<Condition>,
    /// The router exists and is ready.
    #[serde(default, deserialize_with = "null_default")]
    pub standby: bool,
    /// Whether this is the default VPC.
    #[serde(default, deserialize_with = "null_default")]
    pub default: bool,
    /// The VPC's default subnet.
    #[serde(default, deserialize_with = "null_default")]
    pub default_logical_switch: String,
    /// The logical router's name.
    #[serde(default, deserialize_with = "null_default")]
    pub router: String,
    /// TCP load balancer.
    #[serde(default, deserialize_with = "null_default")]
    pub tcp_load_balancer: String,
    /// UDP load balancer.
    #[serde(default, deserialize_with = "null_default")]
    pub udp_load_balancer: String,
    /// SCTP load balancer.
    #[serde(default, deserialize_with = "null_default")]
    pub sctp_load_balancer: String,
    /// TCP session-affinity load balancer.
    #[serde(default, deserialize_with = "null_default")]
    pub tcp_session_load_balancer: String,
    /// UDP session-affinity load balancer.
    #[serde(default, deserialize_with = "null_default")]
    pub udp_session_load_balancer: String,
    /// SCTP session-affinity load balancer.
    #[serde(default, deserialize_with = "null_default")]
    pub sctp_session_load_balancer: String,
    /// Subnets of the VPC.
    #[serde(default, deserialize_with = "null_default")]
    pub subnets: Vec<String>,
    /// The load balancer group holding the VPC's Service load balancers (attached to its switches).
    #[serde(default, deserialize_with = "null_default")]
    pub load_balancer_group: String,
    /// The Service load balancers of the VPC (`svc.<namespace>.<name>.<protocol>`).
    #[serde(default, deserialize_with = "null_default")]
    pub load_balancers: Vec<String>,
    /// Peered VPCs.
    #[serde(default, deserialize_with = "null_default")]
    pub vpc_peerings: Vec<String>,
    /// Connected to the external network.
    #[serde(default, deserialize_with = "null_default")]
    pub enable_external: bool,
    /// Further external subnets.
    #[serde(default, deserialize_with = "null_default")]
    pub extra_external_subnets: Vec<String>,
    /// BFD enabled.
    #[serde(default, deserialize_with = "null_default")]
    pub enable_bfd: bool,
    /// BFD port.
    #[serde(default, deserialize_with = "null_default")]
    pub bfd_port: BfdPortStatus,
}
