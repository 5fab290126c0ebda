//! The `IPPool` CRD: a set of a subnet's addresses reserved for namespaces or workloads.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{is_false, null_default, Condition, IpCount};

/// Spec of an `IPPool`, with Kube-OVN's field names.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kubeovn.io",
    version = "v1",
    kind = "IPPool",
    plural = "ippools",
    shortname = "ippool",
    status = "IPPoolStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A Kube-OVN IP pool: addresses of a subnet reserved for namespaces or workloads",
    printcolumn = r#"{"name":"Subnet","type":"string","jsonPath":".spec.subnet"}"#,
    printcolumn = r#"{"name":"enableAddressSet","type":"boolean","jsonPath":".spec.enableAddressSet"}"#,
    printcolumn = r#"{"name":"IPs","type":"string","jsonPath":".spec.ips"}"#,
    printcolumn = r#"{"name":"V4Used","type":"number","jsonPath":".status.v4UsingIPs"}"#,
    printcolumn = r#"{"name":"V4Available","type":"number","jsonPath":".status.v4AvailableIPs"}"#,
    printcolumn = r#"{"name":"V6Used","type":"number","jsonPath":".status.v6UsingIPs"}"#,
    printcolumn = r#"{"name":"V6Available","type":"number","jsonPath":".status.v6AvailableIPs"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IPPoolSpec {
    /// The subnet the addresses belong to.
    pub subnet: String,
    /// Namespaces whose pods allocate from the pool.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub namespaces: Vec<String>,
    /// Addresses, CIDRs or `a..b` ranges.
    #[serde(rename = "ips")]
    pub ips: Vec<String>,
    /// Mirror the pool in an OVN address set.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub enable_address_set: bool,
}

/// Status of an `IPPool` (note `v4AvailableIPs`, upper-case `A`, unlike Subnet).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct IPPoolStatus {
    /// Free IPv4 addresses.
    #[serde(rename = "v4AvailableIPs", default, deserialize_with = "null_default")]
    pub v4_available_ips: IpCount,
    /// Free IPv4 addresses as ranges.
    #[serde(
        rename = "v4AvailableIPRange",
        default,
        deserialize_with = "null_default"
    )]
    pub v4_available_ip_range: String,
    /// Used IPv4 addresses.
    #[serde(rename = "v4UsingIPs", default, deserialize_with = "null_default")]
    pub v4_using_ips: IpCount,
    /// Used IPv4 addresses as ranges.
    #[serde(rename = "v4UsingIPRange", default, deserialize_with = "null_default")]
    pub v4_using_ip_range: String,
    /// Free IPv6 addresses.
    #[serde(rename = "v6AvailableIPs", default, deserialize_with = "null_default")]
    pub v6_available_ips: IpCount,
    /// Free IPv6 addresses as ranges.
    #[serde(
        rename = "v6AvailableIPRange",
        default,
        deserialize_with = "null_default"
    )]
    pub v6_available_ip_range: String,
    /// Used IPv6 addresses.
    #[serde(rename = "v6UsingIPs", default, deserialize_with = "null_default")]
    pub v6_using_ips: IpCount,
    /// Used IPv6 addresses as ranges.
    #[serde(rename = "v6UsingIPRange", default, deserialize_with = "null_default")]
    pub v6_using_ip_range: String,
    /// Conditions.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions: Vec<Condition>,
}
