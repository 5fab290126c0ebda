//! The `Subnet` CRD: a logical switch with its CIDR block, gateway and policies.

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    empty_none, is_false, is_zero_u32, label_selectors_schema, null_default, Condition, IpCount,
};

/// Address family of a subnet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Protocol {
    /// IPv4 only.
    #[serde(rename = "IPv4")]
    IPv4,
    /// IPv6 only.
    #[serde(rename = "IPv6")]
    IPv6,
    /// IPv4 and IPv6.
    Dual,
    /// MAC only: an underlay subnet whose addresses come from an external DHCP server.
    Mac,
}

/// How traffic from a subnet leaves the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum GatewayType {
    /// Each node is the gateway of its own pods.
    Distributed,
    /// Selected gateway nodes carry all of the subnet's traffic.
    Centralized,
}

/// Spec of a `Subnet`, with Kube-OVN's field names.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kubeovn.io",
    version = "v1",
    kind = "Subnet",
    plural = "subnets",
    shortname = "subnet",
    status = "SubnetStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A Kube-OVN subnet: a logical switch with its CIDR block, gateway and policies",
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.provider"}"#,
    printcolumn = r#"{"name":"Vpc","type":"string","jsonPath":".spec.vpc"}"#,
    printcolumn = r#"{"name":"Vlan","type":"string","jsonPath":".spec.vlan"}"#,
    printcolumn = r#"{"name":"Protocol","type":"string","jsonPath":".spec.protocol"}"#,
    printcolumn = r#"{"name":"CIDR","type":"string","jsonPath":".spec.cidrBlock"}"#,
    printcolumn = r#"{"name":"Private","type":"boolean","jsonPath":".spec.private"}"#,
    printcolumn = r#"{"name":"NAT","type":"boolean","jsonPath":".spec.natOutgoing"}"#,
    printcolumn = r#"{"name":"Default","type":"boolean","jsonPath":".spec.default"}"#,
    printcolumn = r#"{"name":"GatewayType","type":"string","jsonPath":".spec.gatewayType"}"#,
    printcolumn = r#"{"name":"V4Used","type":"number","jsonPath":".status.v4usingIPs"}"#,
    printcolumn = r#"{"name":"V4Available","type":"number","jsonPath":".status.v4availableIPs"}"#,
    printcolumn = r#"{"name":"V6Used","type":"number","jsonPath":".status.v6usingIPs"}"#,
    printcolumn = r#"{"name":"V6Available","type":"number","jsonPath":".status.v6availableIPs"}"#,
    printcolumn = r#"{"name":"ExcludeIPs","type":"string","jsonPath":".spec.excludeIps"}"#,
    printcolumn = r#"{"name":"U2OInterconnectionIP","type":"string","jsonPath":".status.u2oInterconnectionIP"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SubnetSpec {
    /// Whether this is the default subnet of the cluster.
    #[serde(default, deserialize_with = "null_default")]
    pub default: bool,
    /// VPC of the subnet (empty: the default VPC).
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub vpc: String,
    /// Address family; derived from `cidrBlock` when absent.
    #[serde(
        default,
        deserialize_with = "empty_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub protocol: Option<Protocol>,
    /// Namespaces bound to the subnet.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub namespaces: Vec<String>,
    /// CIDR block, `v4`, `v6` or `v4,v6`.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub cidr_block: String,
    /// Gateway address(es), `v4`, `v6` or `v4,v6`.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub gateway: String,
    /// Addresses or `a..b` ranges never allocated.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub exclude_ips: Vec<String>,
    /// Provider: `ovn`, or `<nad>.<namespace>[.ovn]` for an attachment network.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub provider: String,
    /// Distributed or centralized gateway.
    #[serde(
        default,
        deserialize_with = "empty_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub gateway_type: Option<GatewayType>,
    /// Gateway node(s) of a centralized subnet (`node1,node2` or `node1:ip,...`).
    #[serde(default, deserialize_with = "null_default")]
    pub gateway_node: String,
    /// Label selectors choosing gateway nodes.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(schema_with = "label_selectors_schema")]
    pub gateway_node_selectors: Vec<LabelSelector>,
    /// Masquerade traffic leaving the cluster.
    #[serde(default, deserialize_with = "null_default")]
    pub nat_outgoing: bool,
    /// External egress gateway address(es).
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub external_egress_gateway: String,
    /// Priority of the external egress gateway policy route.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_zero_u32"
    )]
    pub policy_routing_priority: u32,
    /// Routing table of the external egress gateway.
    #[serde(
        default,
        rename = "policyRoutingTableID",
        skip_serializing_if = "is_zero_u32"
    )]
    pub policy_routing_table_id: u32,
    /// MTU of the pods' interfaces.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_zero_u32"
    )]
    pub mtu: u32,
    /// Only `allowSubnets` may reach the subnet.
    #[serde(default, deserialize_with = "null_default")]
    pub private: bool,
    /// CIDRs allowed to reach a private subnet.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub allow_subnets: Vec<String>,
    /// Vlan object of an underlay subnet.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub vlan: String,
    /// Virtual IPs of the subnet.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub vips: Vec<String>,
    /// Underlay subnet with an OVN logical gateway.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub logical_gateway: bool,
    /// Skip the gateway reachability check of an underlay subnet.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub disable_gateway_check: bool,
    /// Keep the subnet out of OVN interconnection.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub disable_inter_connection: bool,
    /// Serve DHCP on the switch.
    #[serde(
        default,
        deserialize_with = "null_default",
        rename = "enableDHCP",
        skip_serializing_if = "is_false"
    )]
    pub enable_dhcp: bool,
    /// DHCPv4 options.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub dhcp_v4_options: String,
    /// DHCPv6 options.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub dhcp_v6_options: String,
    /// Send IPv6 router advertisements.
    #[serde(
        default,
        deserialize_with = "null_default",
        rename = "enableIPv6RA",
        skip_serializing_if = "is_false"
    )]
    pub enable_ipv6_ra: bool,
    /// IPv6 RA options (`address_mode=...,max_interval=...`).
    #[serde(
        default,
        deserialize_with = "null_default",
        rename = "ipv6RAConfigs",
        skip_serializing_if = "String::is_empty"
    )]
    pub ipv6_ra_configs: String,
    /// ACLs of the switch.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub acls: Vec<Acl>,
    /// Allow east-west traffic with other subnets of the VPC.
    #[serde(
        default,
        deserialize_with = "null_default",
        rename = "allowEWTraffic",
        skip_serializing_if = "is_false"
    )]
    pub allow_ew_traffic: bool,
    /// Rules choosing which traffic is masqueraded.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub nat_outgoing_policy_rules: Vec<NatOutgoingPolicyRule>,
    /// Address of the underlay-to-overlay interconnection port.
    #[serde(
        default,
        deserialize_with = "null_default",
        rename = "u2oInterconnectionIP",
        skip_serializing_if = "String::is_empty"
    )]
    pub u2o_interconnection_ip: String,
    /// Connect this underlay subnet to the overlay.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub u2o_interconnection: bool,
    /// Options of the underlay-to-overlay interconnection.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Option::is_none"
    )]
    pub u2o_features: Option<U2oFeatures>,
    /// Load balancers on the switch (absent: the controller's default).
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Option::is_none"
    )]
    pub enable_lb: Option<bool>,
    /// ECMP over the gateways of a centralized subnet.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub enable_ecmp: bool,
    /// Multicast snooping on the switch.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub enable_multicast_snoop: bool,
    /// Hand out LoadBalancer service addresses from this subnet.
    #[serde(
        default,
        rename = "enableExternalLBAddress",
        skip_serializing_if = "is_false"
    )]
    pub enable_external_lb_address: bool,
    /// Route table of the subnet's routes.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub route_table: String,
    /// Label selectors binding namespaces.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(schema_with = "label_selectors_schema")]
    pub namespace_selectors: Vec<LabelSelector>,
    /// Node network of an underlay subnet.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub node_network: String,
}

/// Options of the underlay-to-overlay interconnection.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct U2oFeatures {
    /// Only overlay CIDRs use the interconnection routes.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub overlay_only_routing: bool,
}

/// An ACL of a subnet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Acl {
    /// `from-lport` or `to-lport`.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub direction: String,
    /// Priority (0..32767).
    #[serde(default, deserialize_with = "null_default")]
    pub priority: i32,
    /// OVN match expression.
    #[serde(
        rename = "match",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub match_: String,
    /// `allow-related`, `allow`, `drop`, `reject`...
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub action: String,
}

/// A rule choosing which traffic of a subnet is masqueraded.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NatOutgoingPolicyRule {
    /// What the rule matches.
    #[serde(rename = "match", default, deserialize_with = "null_default")]
    pub match_: NatOutgoingPolicyMatch,
    /// `nat` or `forward`.
    #[serde(default, deserialize_with = "null_default")]
    pub action: String,
}

/// Sources and destinations of a `NatOutgoingPolicyRule`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NatOutgoingPolicyMatch {
    /// Source addresses or CIDRs, comma separated.
    #[serde(
        default,
        deserialize_with = "null_default",
        rename = "srcIPs",
        skip_serializing_if = "String::is_empty"
    )]
    pub src_ips: String,
    /// Destination addresses or CIDRs, comma separated.
    #[serde(
        default,
        deserialize_with = "null_default",
        rename = "dstIPs",
        skip_serializing_if = "String::is_empty"
    )]
    pub dst_ips: String,
}

/// A NAT outgoing rule with the id the controller gave it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NatOutgoingPolicyRuleStatus {
    /// Rule id.
    #[serde(rename = "ruleID", default, deserialize_with = "null_default")]
    pub rule_id: String,
    /// The rule.
    #[serde(flatten)]
    pub rule: NatOutgoingPolicyRule,
}

/// Status of a `Subnet`, with Kube-OVN's field names (note `v4availableIPs`, lower-case `a`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SubnetStatus {
    /// Ready / Validated / Error conditions.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions: Vec<Condition>,
    /// Free IPv4 addresses.
    #[serde(rename = "v4availableIPs", default, deserialize_with = "null_default")]
    pub v4_available_ips: IpCount,
    /// Free IPv4 addresses as ranges (`10.16.0.2-10.16.255.254`).
    #[serde(
        rename = "v4availableIPrange",
        default,
        deserialize_with = "null_default"
    )]
    pub v4_available_ip_range: String,
    /// Used IPv4 addresses.
    #[serde(rename = "v4usingIPs", default, deserialize_with = "null_default")]
    pub v4_using_ips: IpCount,
    /// Used IPv4 addresses as ranges.
    #[serde(rename = "v4usingIPrange", default, deserialize_with = "null_default")]
    pub v4_using_ip_range: String,
    /// Free IPv6 addresses.
    #[serde(rename = "v6availableIPs", default, deserialize_with = "null_default")]
    pub v6_available_ips: IpCount,
    /// Free IPv6 addresses as ranges.
    #[serde(
        rename = "v6availableIPrange",
        default,
        deserialize_with = "null_default"
    )]
    pub v6_available_ip_range: String,
    /// Used IPv6 addresses.
    #[serde(rename = "v6usingIPs", default, deserialize_with = "null_default")]
    pub v6_using_ips: IpCount,
    /// Used IPv6 addresses as ranges.
    #[serde(rename = "v6usingIPrange", default, deserialize_with = "null_default")]
    pub v6_using_ip_range: String,
    /// Active gateway node(s) of a centralized subnet.
    #[serde(rename = "activateGateway", default, deserialize_with = "null_default")]
    pub activate_gateway: String,
    /// UUID of the DHCPv4 options row.
    #[serde(
        rename = "dhcpV4OptionsUUID",
        default,
        deserialize_with = "null_default"
    )]
    pub dhcp_v4_options_uuid: String,
    /// UUID of the DHCPv6 options row.
    #[serde(
        rename = "dhcpV6OptionsUUID",
        default,
        deserialize_with = "null_default"
    )]
    pub dhcp_v6_options_uuid: String,
    /// Address of the underlay-to-overlay interconnection port.
    #[serde(
        rename = "u2oInterconnectionIP",
        default,
        deserialize_with = "null_default"
    )]
    pub u2o_interconnection_ip: String,
    /// MAC of the underlay-to-overlay interconnection port.
    #[serde(
        rename = "u2oInterconnectionMAC",
        default,
        deserialize_with = "null_default"
    )]
    pub u2o_interconnection_mac: String,
    /// VPC of the underlay-to-overlay interconnection.
    #[serde(
        rename = "u2oInterconnectionVPC",
        default,
        deserialize_with = "null_default"
    )]
    pub u2o_interconnection_vpc: String,
    /// NAT outgoing rules with their ids.
    #[serde(
        rename = "natOutgoingPolicyRules",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub nat_outgoing_policy_rules: Vec<NatOutgoingPolicyRuleStatus>,
    /// Multicast querier address.
    #[serde(rename = "mcastQuerierIP", default, deserialize_with = "null_default")]
    pub mcast_querier_ip: String,
    /// Multicast querier MAC.
    #[serde(rename = "mcastQuerierMAC", default, deserialize_with = "null_default")]
    pub mcast_querier_mac: String,
}

/// The address counters and ranges of a `SubnetStatus` alone (same field names): what a controller patches
/// as addresses come and go, leaving the conditions beside them as they are.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SubnetUsage {
    /// Free IPv4 addresses.
    #[serde(rename = "v4availableIPs")]
    pub v4_available_ips: IpCount,
    /// Free IPv4 addresses as ranges.
    #[serde(rename = "v4availableIPrange")]
    pub v4_available_ip_range: String,
    /// Used IPv4 addresses.
    #[serde(rename = "v4usingIPs")]
    pub v4_using_ips: IpCount,
    /// Used IPv4 addresses as ranges.
    #[serde(rename = "v4usingIPrange")]
    pub v4_using_ip_range: String,
    /// Free IPv6 addresses.
    #[serde(rename = "v6availableIPs")]
    pub v6_available_ips: IpCount,
    /// Free IPv6 addresses as ranges.
    #[serde(rename = "v6availableIPrange")]
    pub v6_available_ip_range: String,
    /// Used IPv6 addresses.
    #[serde(rename = "v6usingIPs")]
    pub v6_using_ips: IpCount,
    /// Used IPv6 addresses as ranges.
    #[serde(rename = "v6usingIPrange")]
    pub v6_using_ip_range: String,
}

impl SubnetSpec {
    /// The node names of `gatewayNode` in order (`node1,node2`, or `node1:ip` pairs: the name).
    pub fn gateway_node_names(&self) -> Vec<String> {
        self.gateway_node
            .split(',')
            .map(|n| n.split(':').next().unwrap_or_default().trim())
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

impl Subnet {
    fn field_error(&self, field: &'static str, e: crate::error::AnnotationError) -> crate::Error {
        crate::Error::InvalidField {
            kind: "Subnet",
            name: self.metadata.name.clone().unwrap_or_default(),
            field,
            value: e.value,
            problem: e.problem,
        }
    }

    /// `spec.cidrBlock` parsed: one CIDR, or an IPv4 and an IPv6 one.
    pub fn cidrs(&self) -> crate::Result<Vec<IpNetwork>> {
        let v = self.spec.cidr_block.trim();
        crate::annotations::parse_cidr_block("spec.cidrBlock", v, v)
            .map_err(|e| self.field_error("spec.cidrBlock", e))
    }

    /// The address family `spec.cidrBlock` implies (Kube-OVN derives `spec.protocol` from it).
    pub fn derived_protocol(&self) -> crate::Result<Protocol> {
        let cidrs = self.cidrs()?;
        Ok(
            match (
                cidrs.iter().any(IpNetwork::is_ipv4),
                cidrs.iter().any(IpNetwork::is_ipv6),
            ) {
                (true, true) => Protocol::Dual,
                (false, true) => Protocol::IPv6,
                _ => Protocol::IPv4,
            },
        )
    }

    /// `spec.gateway` parsed, or, when empty, Kube-OVN's default: the first address after each network address.
    pub fn gateways(&self) -> crate::Result<Vec<IpAddr>> {
        let v = self.spec.gateway.trim();
        if !v.is_empty() {
            return crate::annotations::parse_dual("spec.gateway", v, v, false)
                .map_err(|e| self.field_error("spec.gateway", e));
        }
        Ok(self
            .cidrs()?
            .iter()
            .map(|n| match n.network() {
                IpAddr::V4(a) => IpAddr::from((u32::from(a).wrapping_add(1)).to_be_bytes()),
                IpAddr::V6(a) => IpAddr::from((u128::from(a).wrapping_add(1)).to_be_bytes()),
            })
            .collect())
    }
}
