//! The `IP` CRD: the record of one allocated pod or node address.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::null_default;

/// Spec of an `IP` record, with Kube-OVN's field names; named `<pod>.<namespace>[.<provider>]` or
/// `node-<node>`.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kubeovn.io",
    version = "v1",
    kind = "IP",
    plural = "ips",
    shortname = "ip",
    derive = "PartialEq",
    derive = "Default",
    doc = "A Kube-OVN IP record: an address allocated to a pod or node",
    printcolumn = r#"{"name":"V4IP","type":"string","jsonPath":".spec.v4IpAddress"}"#,
    printcolumn = r#"{"name":"V6IP","type":"string","jsonPath":".spec.v6IpAddress"}"#,
    printcolumn = r#"{"name":"Mac","type":"string","jsonPath":".spec.macAddress"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.nodeName"}"#,
    printcolumn = r#"{"name":"Subnet","type":"string","jsonPath":".spec.subnet"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IPSpec {
    /// Pod name (empty for a node).
    #[serde(default, deserialize_with = "null_default")]
    pub pod_name: String,
    /// Pod namespace (empty for a node).
    #[serde(default, deserialize_with = "null_default")]
    pub namespace: String,
    /// Subnet of the address.
    #[serde(default, deserialize_with = "null_default")]
    pub subnet: String,
    /// Subnets of the attachment networks.
    #[serde(default, deserialize_with = "null_default")]
    pub attach_subnets: Vec<String>,
    /// Node of the pod.
    #[serde(default, deserialize_with = "null_default")]
    pub node_name: String,
    /// Addresses, `v4`, `v6` or `v4,v6`.
    #[serde(default, deserialize_with = "null_default")]
    pub ip_address: String,
    /// IPv4 address.
    #[serde(default, deserialize_with = "null_default", rename = "v4IpAddress")]
    pub v4_ip_address: String,
    /// IPv6 address.
    #[serde(default, deserialize_with = "null_default", rename = "v6IpAddress")]
    pub v6_ip_address: String,
    /// Addresses on attachment networks.
    #[serde(default, deserialize_with = "null_default")]
    pub attach_ips: Vec<String>,
    /// MAC address.
    #[serde(default, deserialize_with = "null_default")]
    pub mac_address: String,
    /// MACs on attachment networks.
    #[serde(default, deserialize_with = "null_default")]
    pub attach_macs: Vec<String>,
    /// Container id.
    #[serde(default, deserialize_with = "null_default", rename = "containerID")]
    pub container_id: String,
    /// Owner kind (`StatefulSet`, `VirtualMachine`, ...) when the address outlives the pod.
    #[serde(default, deserialize_with = "null_default")]
    pub pod_type: String,
}
