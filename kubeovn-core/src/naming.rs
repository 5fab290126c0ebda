//! Kube-OVN's naming conventions for OVN rows and Kubernetes objects, and its default names.
//!
//! These names are the contract with an existing Kube-OVN deployment (and with `kubectl ko`): a port created
//! under another name would be garbage-collected or duplicated, so they follow Kube-OVN exactly.

use crate::annotations::{provider_or_default, DEFAULT_PROVIDER};

/// The default VPC and its logical router.
pub const DEFAULT_VPC: &str = "ovn-cluster";
/// The default subnet (logical switch) of pods.
pub const DEFAULT_SUBNET: &str = "ovn-default";
/// The join subnet that connects nodes to the default VPC.
pub const JOIN_SUBNET: &str = "join";
/// CIDR of the default subnet.
pub const DEFAULT_SUBNET_CIDR: &str = "10.16.0.0/16";
/// Gateway of the default subnet.
pub const DEFAULT_SUBNET_GATEWAY: &str = "10.16.0.1";
/// CIDR of the join subnet.
pub const JOIN_SUBNET_CIDR: &str = "100.64.0.0/16";
/// Gateway of the join subnet.
pub const JOIN_SUBNET_GATEWAY: &str = "100.64.0.1";
/// The CNI type name, also the `vendor` value in external_ids.
pub const VENDOR: &str = "kube-ovn";
/// The finalizer Kube-OVN's controller puts on its objects.
pub const FINALIZER: &str = "kubeovn.io/kube-ovn-controller";
/// Prefix of a node's port on the join switch.
pub const NODE_PORT_PREFIX: &str = "node-";
/// The node's interface on the join switch.
pub const NODE_NIC: &str = "ovn0";

/// The load balancer of a Service for one protocol (`tcp`, `udp`, `sctp`): `svc.<namespace>.<name>.<proto>`
/// (namespaces and Service names are DNS labels, without dots, so the name is unambiguous).
pub fn service_lb(namespace: &str, name: &str, protocol: &str) -> String {
    format!("svc.{namespace}.{name}.{protocol}")
}

/// The load balancer group holding a VPC's Service load balancers, attached to its switches.
pub fn lb_group(vpc: &str) -> String {
    format!("lbg.{vpc}")
}

/// Keys of the external_ids Kube-OVN puts on northbound rows.
pub mod external_ids {
    /// Marks rows Kube-OVN owns; value [`VENDOR`](super::VENDOR). GC only ever touches such rows.
    pub const VENDOR: &str = "vendor";
    /// Logical switch of a port.
    pub const LS: &str = "ls";
    /// Logical router of a row.
    pub const LR: &str = "lr";
    /// `<namespace>/<pod>` of a pod's port.
    pub const POD: &str = "pod";
    /// Subnet of a port group or router policy.
    pub const SUBNET: &str = "subnet";
    /// Node of a port group or router policy.
    pub const NODE: &str = "node";
    /// Owner key of a port group (`np`): `<subnet>/<node>`, `node/<node>`, `<ns>/<policy>`.
    pub const NETWORK_POLICY: &str = "np";
    /// Port group of an ACL.
    pub const PG: &str = "pg";
    /// VIPs of a port.
    pub const VIPS: &str = "vips";
    /// `true` when the port's VIPs are attached.
    pub const ATTACH_VIPS: &str = "attach-vips";
    /// Security groups of a port (`/` separated).
    pub const SECURITY_GROUPS: &str = "security_groups";
    /// IPv4 network of a port.
    pub const IPV4_NETWORK: &str = "ipv4_network";
    /// IPv6 network of a port.
    pub const IPV6_NETWORK: &str = "ipv6_network";
    /// `<namespace>/<name>` of a Service's load balancer.
    pub const SERVICE: &str = "service";
    /// VPC of a Service's load balancer (whose group holds it).
    pub const VPC: &str = "vpc";
}

/// Router policy priorities Kube-OVN uses on a VPC's router.
pub mod priority {
    /// Allow traffic to a subnet.
    pub const SUBNET_ROUTER: u16 = 31000;
    /// Reroute node traffic to the node's join address.
    pub const NODE_ROUTER: u16 = 30000;
    /// Distributed / centralized gateway reroute.
    pub const GATEWAY_ROUTER: u16 = 29000;
}

/// The logical switch port of a pod network: `<pod>.<namespace>` for the default provider (also named by an
/// empty one), or `<pod>.<namespace>.<provider>` for an attachment network. The one rule: the controller
/// names the port with it and the node daemon sets it as the interface's `external_ids:iface-id`.
pub fn pod_port(pod: &str, namespace: &str, provider: &str) -> String {
    let provider = provider_or_default(provider);
    if provider == DEFAULT_PROVIDER {
        format!("{pod}.{namespace}")
    } else {
        format!("{pod}.{namespace}.{provider}")
    }
}

/// The name of a pod network's IP object: the same as its port name.
pub fn pod_ip_name(pod: &str, namespace: &str, provider: &str) -> String {
    pod_port(pod, namespace, provider)
}

/// The `pod` external_id value: `<namespace>/<pod>`.
pub fn pod_key(namespace: &str, pod: &str) -> String {
    format!("{namespace}/{pod}")
}

/// A node's port on the join switch: `node-<node>`.
pub fn node_port(node: &str) -> String {
    format!("{NODE_PORT_PREFIX}{node}")
}

/// The name of a node's IP object: the same as its port name.
pub fn node_ip_name(node: &str) -> String {
    node_port(node)
}

/// The router's port towards a switch: `<router>-<switch>`.
pub fn router_port(router: &str, switch: &str) -> String {
    format!("{router}-{switch}")
}

/// The switch's port towards a router (type router, peer of [`router_port`]): `<switch>-<router>`.
pub fn switch_router_port(router: &str, switch: &str) -> String {
    format!("{switch}-{router}")
}

/// The localnet port of an underlay subnet: `localnet.<subnet>`.
pub fn localnet_port(subnet: &str) -> String {
    format!("localnet.{subnet}")
}

/// A port group or address set name as Kube-OVN makes it: `-` replaced by `.`, because OVN ACL matches reject
/// `-` in port group and address set names.
pub fn port_group(name: &str) -> String {
    name.replace('-', ".")
}

/// A node's port group: the node port name sanitized, i.e. `node.<node>` with every `-` turned into `.`.
pub fn node_port_group(node: &str) -> String {
    port_group(&node_port(node))
}

/// The port group of a distributed subnet's ports on one node: `<subnet>.<node>`, sanitized.
pub fn subnet_node_port_group(subnet: &str, node: &str) -> String {
    port_group(&format!("{subnet}.{node}"))
}

/// The `np` external_id of a node's port group: `node/<node>`.
pub fn node_port_group_owner(node: &str) -> String {
    format!("node/{node}")
}

/// The `np` external_id of a subnet/node port group: `<subnet>/<node>`.
pub fn subnet_node_port_group_owner(subnet: &str, node: &str) -> String {
    format!("{subnet}/{node}")
}

/// The provider of a Multus attachment network: `<nad>.<namespace>`.
pub fn attachment_provider(nad: &str, namespace: &str) -> String {
    format!("{nad}.{namespace}")
}

/// The provider of an attachment network that Kube-OVN itself serves (an OVN subnet): `<nad>.<namespace>.ovn`.
pub fn ovn_attachment_provider(nad: &str, namespace: &str) -> String {
    format!("{nad}.{namespace}.{DEFAULT_PROVIDER}")
}

/// External_ids of a pod's logical switch port, as Kube-OVN writes them.
pub fn pod_port_external_ids(
    switch: &str,
    namespace: &str,
    pod: &str,
) -> [(&'static str, String); 3] {
    [
        (external_ids::VENDOR, VENDOR.to_owned()),
        (external_ids::LS, switch.to_owned()),
        (external_ids::POD, pod_key(namespace, pod)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_ovn_names() {
        assert_eq!(pod_port("web-0", "default", "ovn"), "web-0.default");
        // An empty provider is the default network (the CNI shim sends one when the netconf names none).
        assert_eq!(pod_port("web-0", "default", ""), "web-0.default");
        assert_eq!(
            pod_port("web-0", "default", "net1.default.ovn"),
            "web-0.default.net1.default.ovn"
        );
        assert_eq!(pod_ip_name("a", "b", "ovn"), "a.b");
        assert_eq!(node_port("kind-worker"), "node-kind-worker");
        assert_eq!(node_ip_name("n1"), "node-n1");
        assert_eq!(
            router_port("ovn-cluster", "ovn-default"),
            "ovn-cluster-ovn-default"
        );
        assert_eq!(
            switch_router_port("ovn-cluster", "join"),
            "join-ovn-cluster"
        );
        assert_eq!(node_port_group("kind-worker"), "node.kind.worker");
        assert_eq!(
            subnet_node_port_group("ovn-default", "kind-worker"),
            "ovn.default.kind.worker"
        );
        assert_eq!(localnet_port("vlan1"), "localnet.vlan1");
        assert_eq!(attachment_provider("macvlan", "default"), "macvlan.default");
        assert_eq!(
            ovn_attachment_provider("attachnet", "ns1"),
            "attachnet.ns1.ovn"
        );
        let ids = pod_port_external_ids("ovn-default", "ns1", "p");
        assert_eq!(ids[2], ("pod", "ns1/p".to_owned()));
    }
}
