//! The `ProviderNetwork` CRD: a physical network reached through a node interface bridged into OVS.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{is_false, label_selector_schema, null_default, Condition};

/// Spec of a `ProviderNetwork`, with Kube-OVN's field names.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kubeovn.io",
    version = "v1",
    kind = "ProviderNetwork",
    plural = "provider-networks",
    singular = "provider-network",
    shortname = "pn",
    status = "ProviderNetworkStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A Kube-OVN provider network: a physical network bridged into OVS on the nodes",
    printcolumn = r#"{"name":"DefaultInterface","type":"string","jsonPath":".spec.defaultInterface"}"#,
    printcolumn = r#"{"name":"Ready","type":"boolean","jsonPath":".status.ready"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ProviderNetworkSpec {
    /// Interface bridged on nodes without a custom one.
    #[schemars(length(max = 15), regex(pattern = r"^[^/\s]+$"))]
    pub default_interface: String,
    /// Per-node interfaces.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub custom_interfaces: Vec<CustomInterface>,
    /// Nodes the network exists on.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "label_selector_schema")]
    pub node_selector: Option<LabelSelector>,
    /// Nodes left out.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub exclude_nodes: Vec<String>,
    /// Swap the names of the interface and the bridge.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub exchange_link_name: bool,
    /// Create VLAN sub-interfaces for the network's VLANs.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub auto_create_vlan_subinterfaces: bool,
    /// Keep existing VLAN interfaces.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub preserve_vlan_interfaces: bool,
    /// VLAN interfaces (`eth0.100`).
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub vlan_interfaces: Vec<String>,
}

/// An interface used on some nodes instead of the default one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CustomInterface {
    /// The interface.
    #[schemars(length(max = 15), regex(pattern = r"^[^/\s]+$"))]
    pub interface: String,
    /// The nodes.
    #[serde(default, deserialize_with = "null_default")]
    pub nodes: Vec<String>,
}

/// A condition of one node of a provider network.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProviderNetworkCondition {
    /// The node.
    #[serde(default, deserialize_with = "null_default")]
    pub node: String,
    /// The condition.
    #[serde(flatten)]
    pub condition: Condition,
}

/// Status of a `ProviderNetwork`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderNetworkStatus {
    /// Ready on every selected node.
    #[serde(default, deserialize_with = "null_default")]
    pub ready: bool,
    /// Nodes where it is ready.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ready_nodes: Vec<String>,
    /// Nodes where it is not.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub not_ready_nodes: Vec<String>,
    /// VLANs on it.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub vlans: Vec<String>,
    /// Per-node conditions.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions: Vec<ProviderNetworkCondition>,
}
