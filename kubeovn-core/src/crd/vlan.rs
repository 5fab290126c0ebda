//! The `Vlan` CRD: a VLAN on a provider network, used by underlay subnets.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{is_false, null_default, Condition};

/// Spec of a `Vlan`, with Kube-OVN's field names.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kubeovn.io",
    version = "v1",
    kind = "Vlan",
    plural = "vlans",
    shortname = "vlan",
    status = "VlanStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A Kube-OVN VLAN on a provider network",
    printcolumn = r#"{"name":"ID","type":"string","jsonPath":".spec.id"}"#,
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.provider"}"#,
    printcolumn = r#"{"name":"conflict","type":"boolean","jsonPath":".status.conflict"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VlanSpec {
    /// VLAN id, 0 to 4095 (0: untagged).
    #[serde(default, deserialize_with = "null_default")]
    #[schemars(range(min = 0, max = 4095))]
    pub id: u16,
    /// The provider network.
    #[serde(default, deserialize_with = "null_default")]
    pub provider: String,
    /// Deprecated alias of `id`.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 4095))]
    pub vlan_id: Option<u16>,
    /// Deprecated: the provider interface.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub provider_interface_name: String,
}

/// Status of a `Vlan`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VlanStatus {
    /// Subnets using the VLAN.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub subnets: Vec<String>,
    /// Another VLAN uses the same id on the provider.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub conflict: bool,
    /// Conditions.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions: Vec<Condition>,
}
