//! Kube-OVN's annotations on pods, namespaces and nodes: keys, typed parsing and rendering.
//!
//! Pod annotations exist once per provider: `ovn.kubernetes.io/ip_address` for the default network,
//! `<provider>.kubernetes.io/ip_address` for an attachment network (provider `<nad>.<namespace>` or
//! `<nad>.<namespace>.ovn`). The constants below are the default provider's full keys; [`key`] builds the
//! provider-prefixed form from a suffix in [`suffix`].
//!
//! Values come from users and are untrusted: parsing never panics and a bad value is an
//! [`AnnotationError`] naming the key.
//!
//! This file depends on no other module of the crate (only std, serde, serde_json, ipnetwork, thiserror and
//! kubeovn-ipam), so the fuzz target compiles it alone without the controller's Kubernetes client stack.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnetwork::IpNetwork;
use kubeovn_ipam::Mac;
use serde::{Deserialize, Serialize};

/// The longest annotation value an error quotes; annotations are untrusted and may be huge.
const MAX_QUOTED: usize = 200;

/// What is wrong with an annotation value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// An item is not an IP address (nor `ip/prefix` where that is allowed).
    #[error("{0:?} is not an IP address")]
    Ip(String),
    /// The value is not a MAC address.
    #[error("not a MAC address")]
    Mac,
    /// An item is not a CIDR (`addr/prefix`).
    #[error("{0:?} is not a CIDR")]
    Cidr(String),
    /// A dual-stack list has two entries of one family (or more than two entries).
    #[error("at most one IPv4 and one IPv6 entry are allowed")]
    Family,
    /// The value is not a boolean.
    #[error("not a boolean (true or false)")]
    Bool,
    /// The value is not a non-negative integer in range.
    #[error("not a non-negative integer in range")]
    Integer,
    /// The value is not the JSON the key requires.
    #[error("invalid JSON: {0}")]
    Json(String),
    /// An item is not a valid Kubernetes object name.
    #[error("{0:?} is not a valid name")]
    Name(String),
    /// A Multus network selection is malformed.
    #[error("invalid network selection {item:?}: {why}")]
    Network {
        /// The offending list item.
        item: String,
        /// Why it was rejected.
        why: &'static str,
    },
    /// Lists that must have one entry per logical switch do not.
    #[error("{0} entries where {1} were expected (one per logical switch)")]
    Count(usize, usize),
}

/// A bad annotation: which key, the value (shortened), and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotationError {
    /// The annotation key, e.g. `ovn.kubernetes.io/ip_address`.
    pub key: String,
    /// The value, cut to a few hundred characters.
    pub value: String,
    /// What is wrong with it.
    pub problem: Problem,
}

impl AnnotationError {
    /// An error for `key` with value `value`.
    pub fn new(key: impl Into<String>, value: &str, problem: Problem) -> Self {
        let value = if value.len() > MAX_QUOTED {
            let mut end = MAX_QUOTED;
            while !value.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}...", &value[..end])
        } else {
            value.to_owned()
        };
        AnnotationError {
            key: key.into(),
            value,
            problem,
        }
    }
}

impl fmt::Display for AnnotationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "annotation {}={:?}: {}",
            self.key, self.value, self.problem
        )
    }
}

impl std::error::Error for AnnotationError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.problem)
    }
}

/// The default provider: the pod's primary network managed by Kube-OVN. The one definition: the node daemon
/// (kubeovn-cni's `node` module) uses it too, and the CNI shim sends an empty provider for it.
pub const DEFAULT_PROVIDER: &str = "ovn";

/// `provider`, or [`DEFAULT_PROVIDER`] when it is empty: an empty provider names the default network.
pub fn provider_or_default(provider: &str) -> &str {
    if provider.is_empty() {
        DEFAULT_PROVIDER
    } else {
        provider
    }
}
/// The domain every provider prefix is followed by: `<provider>.kubernetes.io/<suffix>`.
pub const DOMAIN: &str = "kubernetes.io";

/// Suffixes of the provider-prefixed keys (`<provider>.kubernetes.io/<suffix>`).
pub mod suffix {
    /// Addresses of the pod (`v4`, `v6` or `v4,v6`).
    pub const IP_ADDRESS: &str = "ip_address";
    /// MAC address of the pod's interface.
    pub const MAC_ADDRESS: &str = "mac_address";
    /// CIDR block of the pod's subnet (`v4,v6` in dual stack).
    pub const CIDR: &str = "cidr";
    /// Gateway(s) of the pod's subnet.
    pub const GATEWAY: &str = "gateway";
    /// The logical switch (subnet) of the pod, or the subnets bound to a namespace.
    pub const LOGICAL_SWITCH: &str = "logical_switch";
    /// The logical router (VPC) of the pod's subnet.
    pub const LOGICAL_ROUTER: &str = "logical_router";
    /// `true` once the controller has allocated the addresses.
    pub const ALLOCATED: &str = "allocated";
    /// `true` once the port is bound and routed.
    pub const ROUTED: &str = "routed";
    /// Static address pool of a workload, or an IPPool name.
    pub const IP_POOL: &str = "ip_pool";
    /// Requested address family of a pod (`ipv4` or `ipv6`).
    pub const IP_FAMILY: &str = "ip_family";
    /// Ingress rate limit in Mbit/s.
    pub const INGRESS_RATE: &str = "ingress_rate";
    /// Egress rate limit in Mbit/s.
    pub const EGRESS_RATE: &str = "egress_rate";
    /// Ingress burst in Mbit.
    pub const INGRESS_BURST: &str = "ingress_burst";
    /// Egress burst in Mbit.
    pub const EGRESS_BURST: &str = "egress_burst";
    /// Extra routes, JSON `[{"dst":"..","gw":".."}]`.
    pub const ROUTES: &str = "routes";
    /// Interface type in the pod (`veth-pair`, `internal-port`).
    pub const POD_NIC_TYPE: &str = "pod_nic_type";
    /// `true` to restrict the port to its addresses (OVN port_security).
    pub const PORT_SECURITY: &str = "port_security";
    /// VLAN id of an underlay subnet.
    pub const VLAN_ID: &str = "vlan_id";
    /// Provider network of an underlay subnet.
    pub const PROVIDER_NETWORK: &str = "provider_network";
    /// Security groups of the port (comma list).
    pub const SECURITY_GROUPS: &str = "security_groups";
    /// Virtual IPs of the port (comma list).
    pub const PORT_VIPS: &str = "port_vips";
    /// `true` when this attachment carries the default route.
    pub const DEFAULT_ROUTE: &str = "default_route";
    /// Owning virtual machine of a pod.
    pub const VIRTUAL_MACHINE: &str = "virtualmachine";
    /// DHCPv4 options of the port.
    pub const DHCP_V4_OPTIONS: &str = "dhcp-v4-options";
    /// DHCPv6 options of the port.
    pub const DHCP_V6_OPTIONS: &str = "dhcp-v6-options";
}

/// Pod: addresses (`ovn.kubernetes.io/ip_address`).
pub const IP_ADDRESS: &str = "ovn.kubernetes.io/ip_address";
/// Pod and node: MAC address.
pub const MAC_ADDRESS: &str = "ovn.kubernetes.io/mac_address";
/// Pod and node: subnet CIDR block; namespace: the bound subnets' blocks separated by `;`.
pub const CIDR: &str = "ovn.kubernetes.io/cidr";
/// Pod and node: subnet gateway(s).
pub const GATEWAY: &str = "ovn.kubernetes.io/gateway";
/// Pod and node: the subnet; namespace: the bound subnets, comma separated.
pub const LOGICAL_SWITCH: &str = "ovn.kubernetes.io/logical_switch";
/// Pod: the logical router (VPC) of its subnet.
pub const LOGICAL_ROUTER: &str = "ovn.kubernetes.io/logical_router";
/// Pod and node: `true` once addresses are allocated.
pub const ALLOCATED: &str = "ovn.kubernetes.io/allocated";
/// Pod: `true` once the port is bound and routed.
pub const ROUTED: &str = "ovn.kubernetes.io/routed";
/// Pod: static pool; namespace: bound IPPools, comma separated.
pub const IP_POOL: &str = "ovn.kubernetes.io/ip_pool";
/// Pod: requested address family.
pub const IP_FAMILY: &str = "ovn.kubernetes.io/ip_family";
/// Pod: ingress rate in Mbit/s.
pub const INGRESS_RATE: &str = "ovn.kubernetes.io/ingress_rate";
/// Pod: egress rate in Mbit/s.
pub const EGRESS_RATE: &str = "ovn.kubernetes.io/egress_rate";
/// Pod: ingress burst in Mbit.
pub const INGRESS_BURST: &str = "ovn.kubernetes.io/ingress_burst";
/// Pod: egress burst in Mbit.
pub const EGRESS_BURST: &str = "ovn.kubernetes.io/egress_burst";
/// Pod: extra routes as JSON.
pub const ROUTES: &str = "ovn.kubernetes.io/routes";
/// Pod: interface type in the pod.
pub const POD_NIC_TYPE: &str = "ovn.kubernetes.io/pod_nic_type";
/// Pod: port security on/off.
pub const PORT_SECURITY: &str = "ovn.kubernetes.io/port_security";
/// Pod: VLAN id of an underlay subnet.
pub const VLAN_ID: &str = "ovn.kubernetes.io/vlan_id";
/// Pod: provider network of an underlay subnet.
pub const PROVIDER_NETWORK: &str = "ovn.kubernetes.io/provider_network";
/// Pod: security groups.
pub const SECURITY_GROUPS: &str = "ovn.kubernetes.io/security_groups";
/// Pod: VPC the pod belongs to.
pub const VPC: &str = "ovn.kubernetes.io/vpc";
/// Namespace: exclude IPs of the bound subnets, separated by `;`.
pub const EXCLUDE_IPS: &str = "ovn.kubernetes.io/exclude_ips";
/// Node: name of the node's port on the join switch (`node-<node>`).
pub const PORT_NAME: &str = "ovn.kubernetes.io/port_name";
/// Node: OVN chassis name (system-id).
pub const CHASSIS: &str = "ovn.kubernetes.io/chassis";
/// Node: tunnel interface.
pub const TUNNEL_INTERFACE: &str = "ovn.kubernetes.io/tunnel_interface";
/// Node: per-network addresses of the node.
pub const NODE_NETWORKS: &str = "ovn.kubernetes.io/node_networks";
/// Service: hash of the service CIDRs.
pub const SERVICE_CIDR_HASH: &str = "ovn.kubernetes.io/service-cidr-hash";
/// Multus: the pod's attachment networks.
pub const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
/// Multus: network status written by Multus.
pub const NETWORK_STATUS: &str = "k8s.v1.cni.cncf.io/network-status";
/// Multus: the default network of a pod.
pub const DEFAULT_NETWORK: &str = "v1.multus-cni.io/default-network";

/// The key `<provider>.kubernetes.io/<suffix>`; borrowed constants are not needed, so this allocates.
pub fn key(provider: &str, suffix: &str) -> String {
    let mut k = String::with_capacity(provider.len() + DOMAIN.len() + suffix.len() + 2);
    k.push_str(provider);
    k.push('.');
    k.push_str(DOMAIN);
    k.push('/');
    k.push_str(suffix);
    k
}

/// The provider and suffix of a `<provider>.kubernetes.io/<suffix>` key, if it has that form.
pub fn split_key(key: &str) -> Option<(&str, &str)> {
    let (prefix, suffix) = key.split_once('/')?;
    let provider = prefix.strip_suffix(DOMAIN)?.strip_suffix('.')?;
    if provider.is_empty() || suffix.is_empty() {
        return None;
    }
    Some((provider, suffix))
}

/// Annotations to patch: `Some(value)` sets a key, `None` removes it (JSON merge patch `null`).
pub type AnnotationPatch = BTreeMap<String, Option<String>>;

/// The JSON merge patch `{"metadata":{"annotations":{..}}}` that applies `patch` to an object.
pub fn merge_patch(patch: &AnnotationPatch) -> serde_json::Value {
    serde_json::json!({ "metadata": { "annotations": patch } })
}

/// A route requested for a pod (`routes` annotation): `dst` absent means the default route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// Destination network; absent for the default route.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_net")]
    pub dst: Option<IpNetwork>,
    /// Next hop; absent for an on-link route.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_ip")]
    pub gw: Option<IpAddr>,
}

/// A pod's `ip_pool` annotation: an IPPool's name, or static addresses handed out one entry per pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpPoolRequest {
    /// The name of an IPPool object.
    Pool(String),
    /// One entry per pod of a workload; an entry is `v4`, `v6` or `v4,v6`.
    Addresses(Vec<Vec<IpAddr>>),
}

impl IpPoolRequest {
    /// Parses the value as Kube-OVN does: `;` separates entries when present; otherwise `,` does, except that
    /// exactly one IPv4 and one IPv6 address form a single dual-stack entry; a single non-address is a pool name.
    pub fn parse(key: &str, value: &str) -> Result<Self, AnnotationError> {
        let value = value.trim();
        let err = |p| AnnotationError::new(key, value, p);
        if !value.contains([',', ';']) && IpAddr::from_str(value).is_err() {
            if !is_dns_subdomain(value) {
                return Err(err(Problem::Name(value.to_owned())));
            }
            return Ok(IpPoolRequest::Pool(value.to_owned()));
        }
        let mut entries = Vec::new();
        if value.contains(';') {
            for entry in value.split(';') {
                entries.push(parse_dual(key, value, entry, false)?);
            }
        } else {
            let items: Vec<&str> = value.split(',').collect();
            let mut ips = Vec::with_capacity(items.len());
            for item in &items {
                ips.push(parse_ip(key, value, item, false)?);
            }
            if ips.len() == 2 && ips[0].is_ipv4() != ips[1].is_ipv4() {
                entries.push(ips);
            } else {
                entries.extend(ips.into_iter().map(|ip| vec![ip]));
            }
        }
        Ok(IpPoolRequest::Addresses(entries))
    }

    /// The annotation value; [`IpPoolRequest::parse`] reads it back to an equal value.
    pub fn render(&self) -> String {
        match self {
            IpPoolRequest::Pool(name) => name.clone(),
            IpPoolRequest::Addresses(entries) => {
                // `,` alone would merge two single entries of different families into one dual-stack entry.
                let semi = entries.iter().any(|e| e.len() > 1)
                    || (entries.len() == 2 && entries[0][0].is_ipv4() != entries[1][0].is_ipv4());
                let sep = if semi { ";" } else { "," };
                entries
                    .iter()
                    .map(|e| join(e))
                    .collect::<Vec<_>>()
                    .join(sep)
            }
        }
    }
}

/// Kube-OVN's annotations of one pod network (one provider) in typed form.
///
/// The controller writes the allocation fields (`ip_address`, `mac_address`, `cidr`, `gateway`, `logical_switch`,
/// `allocated`, ...); users write the requests (`ip_address`/`mac_address` for static addresses, `ip_pool`,
/// rates, `routes`, `port_security`). Absent keys are empty values; `false` booleans are absent.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodNetworkAnnotations {
    /// `ip_address`: one address, or IPv4 and IPv6 in dual stack (`ip/prefix` is accepted and the prefix dropped).
    pub ip_addresses: Vec<IpAddr>,
    /// `mac_address`.
    pub mac_address: Option<Mac>,
    /// `cidr`: the subnet's CIDR block(s).
    pub cidrs: Vec<IpNetwork>,
    /// `gateway`: the subnet's gateway(s).
    pub gateways: Vec<IpAddr>,
    /// `logical_switch`: the subnet.
    pub logical_switch: Option<String>,
    /// `logical_router`: the VPC of the subnet.
    pub logical_router: Option<String>,
    /// `allocated`.
    pub allocated: bool,
    /// `routed`.
    pub routed: bool,
    /// `ip_pool`.
    pub ip_pool: Option<IpPoolRequest>,
    /// `ingress_rate` in Mbit/s.
    pub ingress_rate: Option<u64>,
    /// `egress_rate` in Mbit/s.
    pub egress_rate: Option<u64>,
    /// `ingress_burst` in Mbit.
    pub ingress_burst: Option<u64>,
    /// `egress_burst` in Mbit.
    pub egress_burst: Option<u64>,
    /// `routes`.
    pub routes: Vec<Route>,
    /// `pod_nic_type`.
    pub pod_nic_type: Option<String>,
    /// `port_security`.
    pub port_security: bool,
    /// `vlan_id` of an underlay subnet.
    pub vlan_id: Option<u16>,
    /// `provider_network` of an underlay subnet.
    pub provider_network: Option<String>,
}

impl PodNetworkAnnotations {
    /// Reads the annotations of `provider` (`ovn` for the default network) from a pod's annotations.
    pub fn parse(
        annotations: &BTreeMap<String, String>,
        provider: &str,
    ) -> Result<Self, AnnotationError> {
        let r = Reader::new(annotations, provider);
        Ok(PodNetworkAnnotations {
            ip_addresses: r.dual(suffix::IP_ADDRESS, true)?,
            mac_address: r.mac(suffix::MAC_ADDRESS)?,
            cidrs: r.cidrs(suffix::CIDR)?,
            gateways: r.dual(suffix::GATEWAY, false)?,
            logical_switch: r.string(suffix::LOGICAL_SWITCH),
            logical_router: r.string(suffix::LOGICAL_ROUTER),
            allocated: r.flag(suffix::ALLOCATED)?,
            routed: r.flag(suffix::ROUTED)?,
            ip_pool: match r.get(suffix::IP_POOL) {
                Some((k, v)) => Some(IpPoolRequest::parse(&k, v)?),
                None => None,
            },
            ingress_rate: r.int(suffix::INGRESS_RATE)?,
            egress_rate: r.int(suffix::EGRESS_RATE)?,
            ingress_burst: r.int(suffix::INGRESS_BURST)?,
            egress_burst: r.int(suffix::EGRESS_BURST)?,
            routes: r.routes(suffix::ROUTES)?,
            pod_nic_type: r.string(suffix::POD_NIC_TYPE),
            port_security: r.flag(suffix::PORT_SECURITY)?,
            vlan_id: r.int(suffix::VLAN_ID)?,
            provider_network: r.string(suffix::PROVIDER_NETWORK),
        })
    }

    /// The annotations of `provider` for these values: every non-empty field, as one map.
    pub fn render(&self, provider: &str) -> BTreeMap<String, String> {
        let mut w = Writer::new(provider);
        w.list(suffix::IP_ADDRESS, &self.ip_addresses);
        w.opt(suffix::MAC_ADDRESS, self.mac_address.as_ref());
        w.list(suffix::CIDR, &self.cidrs);
        w.list(suffix::GATEWAY, &self.gateways);
        w.opt(suffix::LOGICAL_SWITCH, self.logical_switch.as_ref());
        w.opt(suffix::LOGICAL_ROUTER, self.logical_router.as_ref());
        w.flag(suffix::ALLOCATED, self.allocated);
        w.flag(suffix::ROUTED, self.routed);
        w.opt(
            suffix::IP_POOL,
            self.ip_pool.as_ref().map(IpPoolRequest::render).as_ref(),
        );
        w.opt(suffix::INGRESS_RATE, self.ingress_rate.as_ref());
        w.opt(suffix::EGRESS_RATE, self.egress_rate.as_ref());
        w.opt(suffix::INGRESS_BURST, self.ingress_burst.as_ref());
        w.opt(suffix::EGRESS_BURST, self.egress_burst.as_ref());
        if !self.routes.is_empty() {
            // Serialising plain strings into a Vec cannot fail.
            let json = serde_json::to_string(&self.routes).unwrap_or_default();
            w.set(suffix::ROUTES, json);
        }
        w.opt(suffix::POD_NIC_TYPE, self.pod_nic_type.as_ref());
        w.flag(suffix::PORT_SECURITY, self.port_security);
        w.opt(suffix::VLAN_ID, self.vlan_id.as_ref());
        w.opt(suffix::PROVIDER_NETWORK, self.provider_network.as_ref());
        w.out
    }

    /// The patch the controller writes once it has allocated addresses, as Kube-OVN does: `ip_address`,
    /// `mac_address`, `cidr`, `gateway`, `logical_switch`, `allocated=true`, and `pod_nic_type` / `logical_router`
    /// / `vlan_id` / `provider_network` when set; empty fields are removed (`null`).
    pub fn allocation_patch(&self, provider: &str) -> AnnotationPatch {
        let mut p = AnnotationPatch::new();
        let mut put = |sfx: &str, v: Option<String>| {
            p.insert(key(provider, sfx), v);
        };
        let nonempty = |s: String| (!s.is_empty()).then_some(s);
        put(suffix::IP_ADDRESS, nonempty(join(&self.ip_addresses)));
        put(suffix::MAC_ADDRESS, self.mac_address.map(|m| m.to_string()));
        put(suffix::CIDR, nonempty(join(&self.cidrs)));
        put(suffix::GATEWAY, nonempty(join(&self.gateways)));
        put(suffix::LOGICAL_SWITCH, self.logical_switch.clone());
        put(suffix::ALLOCATED, Some("true".to_owned()));
        if self.pod_nic_type.is_some() {
            put(suffix::POD_NIC_TYPE, self.pod_nic_type.clone());
        }
        if self.logical_router.is_some() {
            put(suffix::LOGICAL_ROUTER, self.logical_router.clone());
        }
        if let Some(id) = self.vlan_id {
            put(suffix::VLAN_ID, Some(id.to_string()));
        }
        if self.provider_network.is_some() {
            put(suffix::PROVIDER_NETWORK, self.provider_network.clone());
        }
        p
    }

    /// The IPv4 address, if any.
    pub fn ipv4(&self) -> Option<IpAddr> {
        self.ip_addresses.iter().copied().find(IpAddr::is_ipv4)
    }

    /// The IPv6 address, if any.
    pub fn ipv6(&self) -> Option<IpAddr> {
        self.ip_addresses.iter().copied().find(IpAddr::is_ipv6)
    }
}

/// The patch that marks a pod network routed (`<provider>.kubernetes.io/routed=true`).
pub fn routed_patch(provider: &str) -> AnnotationPatch {
    AnnotationPatch::from([(key(provider, suffix::ROUTED), Some("true".to_owned()))])
}

/// The annotations Kube-OVN's controller keeps on a namespace: its bound subnets and IPPools.
///
/// `cidrs` and `exclude_ips` hold one entry per logical switch, in the same order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NamespaceAnnotations {
    /// `logical_switch`: the bound subnets (comma separated).
    pub logical_switches: Vec<String>,
    /// `cidr`: each subnet's CIDR block (`;` between subnets, `,` within a dual-stack block).
    pub cidrs: Vec<Vec<IpNetwork>>,
    /// `exclude_ips`: each subnet's excluded addresses or `a..b` ranges (`;` between subnets).
    pub exclude_ips: Vec<Vec<String>>,
    /// `ip_pool`: the bound IPPools (comma separated).
    pub ip_pools: Vec<String>,
}

impl NamespaceAnnotations {
    /// Reads a namespace's annotations.
    pub fn parse(annotations: &BTreeMap<String, String>) -> Result<Self, AnnotationError> {
        let r = Reader::new(annotations, DEFAULT_PROVIDER);
        let logical_switches = r.names(suffix::LOGICAL_SWITCH)?;
        let mut cidrs = Vec::new();
        if let Some((k, v)) = r.get(suffix::CIDR) {
            for block in v.split(';') {
                cidrs.push(parse_cidr_block(&k, v, block)?);
            }
        }
        let mut exclude_ips = Vec::new();
        if let Some((k, v)) = r.get_raw("exclude_ips") {
            // One subnet without excludes is written as "": that is one empty list per switch.
            let lists = if v.trim().is_empty() {
                vec![""; logical_switches.len()]
            } else {
                v.split(';').collect()
            };
            for list in lists {
                let mut items = Vec::new();
                for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    check_exclude_item(&k, v, item)?;
                    items.push(item.to_owned());
                }
                exclude_ips.push(items);
            }
        }
        for (n, k) in [(cidrs.len(), CIDR), (exclude_ips.len(), EXCLUDE_IPS)] {
            if n != 0 && n != logical_switches.len() {
                let v = annotations.get(k).map_or("", String::as_str);
                return Err(AnnotationError::new(
                    k,
                    v,
                    Problem::Count(n, logical_switches.len()),
                ));
            }
        }
        Ok(NamespaceAnnotations {
            logical_switches,
            cidrs,
            exclude_ips,
            ip_pools: r.names(suffix::IP_POOL)?,
        })
    }

    /// The namespace's annotations as a patch, as Kube-OVN writes them: `ip_pool` removed when empty.
    pub fn patch(&self) -> AnnotationPatch {
        let mut p = AnnotationPatch::new();
        p.insert(
            LOGICAL_SWITCH.to_owned(),
            Some(self.logical_switches.join(",")),
        );
        let cidrs: Vec<String> = self.cidrs.iter().map(|c| join(c)).collect();
        p.insert(CIDR.to_owned(), Some(cidrs.join(";")));
        let excl: Vec<String> = self.exclude_ips.iter().map(|e| e.join(",")).collect();
        p.insert(EXCLUDE_IPS.to_owned(), Some(excl.join(";")));
        let pools = (!self.ip_pools.is_empty()).then(|| self.ip_pools.join(","));
        p.insert(IP_POOL.to_owned(), pools);
        p
    }

    /// The namespace's annotations as a map (nothing without bound subnets; `ip_pool` only when set).
    pub fn render(&self) -> BTreeMap<String, String> {
        let bound = !self.logical_switches.is_empty();
        self.patch()
            .into_iter()
            .filter_map(|(k, v)| {
                let v = v?;
                (bound && k != IP_POOL || !v.is_empty()).then_some((k, v))
            })
            .collect()
    }
}

/// The annotations Kube-OVN's controller writes on a node: its port on the join switch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeAnnotations {
    /// `ip_address`: the node's join addresses.
    pub ip_addresses: Vec<IpAddr>,
    /// `mac_address` of the node port.
    pub mac_address: Option<Mac>,
    /// `cidr` of the join subnet.
    pub cidrs: Vec<IpNetwork>,
    /// `gateway` of the join subnet.
    pub gateways: Vec<IpAddr>,
    /// `logical_switch`: the join subnet.
    pub logical_switch: Option<String>,
    /// `allocated`.
    pub allocated: bool,
    /// `port_name`: `node-<node>`.
    pub port_name: Option<String>,
    /// `chassis`: the node's OVN chassis (written by the daemon).
    pub chassis: Option<String>,
    /// `tunnel_interface` (written by the daemon).
    pub tunnel_interface: Option<String>,
}

impl NodeAnnotations {
    /// Reads a node's annotations.
    pub fn parse(annotations: &BTreeMap<String, String>) -> Result<Self, AnnotationError> {
        let r = Reader::new(annotations, DEFAULT_PROVIDER);
        Ok(NodeAnnotations {
            ip_addresses: r.dual(suffix::IP_ADDRESS, true)?,
            mac_address: r.mac(suffix::MAC_ADDRESS)?,
            cidrs: r.cidrs(suffix::CIDR)?,
            gateways: r.dual(suffix::GATEWAY, false)?,
            logical_switch: r.string(suffix::LOGICAL_SWITCH),
            allocated: r.flag(suffix::ALLOCATED)?,
            port_name: r.string("port_name"),
            chassis: r.string("chassis"),
            tunnel_interface: r.string("tunnel_interface"),
        })
    }

    /// The node's annotations as a map (empty fields left out).
    pub fn render(&self) -> BTreeMap<String, String> {
        let mut w = Writer::new(DEFAULT_PROVIDER);
        w.list(suffix::IP_ADDRESS, &self.ip_addresses);
        w.opt(suffix::MAC_ADDRESS, self.mac_address.as_ref());
        w.list(suffix::CIDR, &self.cidrs);
        w.list(suffix::GATEWAY, &self.gateways);
        w.opt(suffix::LOGICAL_SWITCH, self.logical_switch.as_ref());
        w.flag(suffix::ALLOCATED, self.allocated);
        w.opt("port_name", self.port_name.as_ref());
        w.opt("chassis", self.chassis.as_ref());
        w.opt("tunnel_interface", self.tunnel_interface.as_ref());
        w.out
    }

    /// The patch the controller writes after allocating the node's join port, as Kube-OVN does (leaves
    /// `chassis` and `tunnel_interface`, which belong to the daemon, alone).
    pub fn allocation_patch(&self) -> AnnotationPatch {
        let mut out: AnnotationPatch = [
            IP_ADDRESS,
            MAC_ADDRESS,
            CIDR,
            GATEWAY,
            LOGICAL_SWITCH,
            PORT_NAME,
        ]
        .into_iter()
        .map(|k| (k.to_owned(), None))
        .collect();
        let rendered = NodeAnnotations {
            chassis: None,
            tunnel_interface: None,
            allocated: true,
            ..self.clone()
        }
        .render();
        out.extend(rendered.into_iter().map(|(k, v)| (k, Some(v))));
        out
    }
}

/// One entry of the Multus `k8s.v1.cni.cncf.io/networks` annotation (a NetworkSelectionElement).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct NetworkSelection {
    /// The NetworkAttachmentDefinition's name.
    pub name: String,
    /// Its namespace; the pod's namespace when the annotation omits it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Requested interface name in the pod.
    #[serde(default, rename = "interface", skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// Requested static addresses (`ip` or `ip/prefix`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    /// Requested MAC address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Gateways for which this network carries the default route.
    #[serde(
        default,
        rename = "default-route",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub default_route: Vec<IpAddr>,
    /// Other fields (portMappings, bandwidth, cni-args, ...) kept as they are.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl NetworkSelection {
    /// The provider of this attachment for a Kube-OVN NAD: `<name>.<namespace>`.
    pub fn provider(&self) -> String {
        format!("{}.{}", self.name, self.namespace)
    }
}

/// Parses a Multus networks annotation: a JSON list of selections, or the comma list `[ns/]name[@ifname]`.
/// Selections without a namespace get `default_namespace`. An empty value is an empty list.
pub fn parse_networks(
    value: &str,
    default_namespace: &str,
) -> Result<Vec<NetworkSelection>, AnnotationError> {
    parse_network_annotation(NETWORKS, value, default_namespace)
}

/// [`parse_networks`] for another key with the same format (e.g. [`DEFAULT_NETWORK`]); errors name `key`.
pub fn parse_network_annotation(
    key: &str,
    value: &str,
    default_namespace: &str,
) -> Result<Vec<NetworkSelection>, AnnotationError> {
    let err = |p| AnnotationError::new(key, value, p);
    let mut nets: Vec<NetworkSelection> = if value.contains(['[', '{', '"']) {
        serde_json::from_str(value).map_err(|e| err(Problem::Json(e.to_string())))?
    } else {
        let mut nets = Vec::new();
        for item in value.split(',').map(str::trim) {
            if item.is_empty() {
                continue;
            }
            nets.push(parse_network_item(item).map_err(|why| {
                err(Problem::Network {
                    item: item.to_owned(),
                    why,
                })
            })?);
        }
        nets
    };
    for n in &mut nets {
        for (what, name) in [("name", &n.name), ("namespace", &n.namespace)] {
            if (what == "name" || !name.is_empty()) && !is_dns_label(name) {
                return Err(err(Problem::Name(name.clone())));
            }
        }
        if let Some(ifname) = &n.interface {
            if !valid_ifname(ifname) {
                return Err(err(Problem::Network {
                    item: ifname.clone(),
                    why: "invalid interface name",
                }));
            }
        }
        if n.namespace.is_empty() {
            n.namespace = default_namespace.to_owned();
        }
    }
    Ok(nets)
}

/// Renders selections as the annotation's JSON list form.
pub fn render_networks(nets: &[NetworkSelection]) -> String {
    // A Vec of plain structs and JSON values always serialises.
    serde_json::to_string(nets).unwrap_or_default()
}

fn parse_network_item(item: &str) -> Result<NetworkSelection, &'static str> {
    let (namespace, rest) = match item.split_once('/') {
        Some((ns, rest)) if !rest.contains('/') => (ns.trim(), rest),
        Some(_) => return Err("more than one '/'"),
        None => ("", item),
    };
    let (name, interface) = match rest.split_once('@') {
        Some((name, ifname)) if !ifname.contains('@') => (name.trim(), Some(ifname.trim())),
        Some(_) => return Err("more than one '@'"),
        None => (rest.trim(), None),
    };
    Ok(NetworkSelection {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        interface: interface.filter(|i| !i.is_empty()).map(str::to_owned),
        ..NetworkSelection::default()
    })
}

/// Linux interface names: 1 to 15 bytes, no whitespace nor '/'.
fn valid_ifname(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && !s
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b == b'/' || b == 0)
}

/// An RFC 1123 label as Multus requires of names: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63.
pub(crate) fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// An RFC 1123 subdomain (the names of most Kubernetes objects): dot-separated labels, at most 253.
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Reads one provider's keys from an annotation map.
struct Reader<'a> {
    map: &'a BTreeMap<String, String>,
    provider: &'a str,
}

impl<'a> Reader<'a> {
    fn new(map: &'a BTreeMap<String, String>, provider: &'a str) -> Self {
        Reader { map, provider }
    }

    /// The key and its value, when present (empty values count as present).
    fn get_raw(&self, sfx: &str) -> Option<(String, &'a str)> {
        let k = key(self.provider, sfx);
        let v = self.map.get(&k)?;
        Some((k, v.as_str()))
    }

    /// The key and its trimmed value, when present and not blank (Kube-OVN treats "" as absent).
    fn get(&self, sfx: &str) -> Option<(String, &'a str)> {
        self.get_raw(sfx)
            .map(|(k, v)| (k, v.trim()))
            .filter(|(_, v)| !v.is_empty())
    }

    fn string(&self, sfx: &str) -> Option<String> {
        self.get(sfx).map(|(_, v)| v.to_owned())
    }

    fn names(&self, sfx: &str) -> Result<Vec<String>, AnnotationError> {
        let Some((k, v)) = self.get(sfx) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for name in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if !is_dns_subdomain(name) {
                return Err(AnnotationError::new(k, v, Problem::Name(name.to_owned())));
            }
            out.push(name.to_owned());
        }
        Ok(out)
    }

    fn flag(&self, sfx: &str) -> Result<bool, AnnotationError> {
        match self.get(sfx) {
            None => Ok(false),
            Some((k, v)) => parse_bool(v).ok_or_else(|| AnnotationError::new(k, v, Problem::Bool)),
        }
    }

    fn int<T: FromStr>(&self, sfx: &str) -> Result<Option<T>, AnnotationError> {
        match self.get(sfx) {
            None => Ok(None),
            Some((k, v)) => {
                // Only plain digits: FromStr for integers also takes a leading '+'.
                if !v.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(AnnotationError::new(k, v, Problem::Integer));
                }
                v.parse()
                    .map(Some)
                    .map_err(|_| AnnotationError::new(k, v, Problem::Integer))
            }
        }
    }

    fn mac(&self, sfx: &str) -> Result<Option<Mac>, AnnotationError> {
        match self.get(sfx) {
            None => Ok(None),
            Some((k, v)) => v
                .parse()
                .map(Some)
                .map_err(|_| AnnotationError::new(k, v, Problem::Mac)),
        }
    }

    fn dual(&self, sfx: &str, allow_prefix: bool) -> Result<Vec<IpAddr>, AnnotationError> {
        match self.get(sfx) {
            None => Ok(Vec::new()),
            Some((k, v)) => parse_dual(&k, v, v, allow_prefix),
        }
    }

    fn cidrs(&self, sfx: &str) -> Result<Vec<IpNetwork>, AnnotationError> {
        match self.get(sfx) {
            None => Ok(Vec::new()),
            Some((k, v)) => parse_cidr_block(&k, v, v),
        }
    }

    fn routes(&self, sfx: &str) -> Result<Vec<Route>, AnnotationError> {
        match self.get(sfx) {
            None => Ok(Vec::new()),
            Some((k, v)) => serde_json::from_str(v)
                .map_err(|e| AnnotationError::new(k, v, Problem::Json(e.to_string()))),
        }
    }
}

/// Writes one provider's keys into an annotation map.
struct Writer<'a> {
    provider: &'a str,
    out: BTreeMap<String, String>,
}

impl<'a> Writer<'a> {
    fn new(provider: &'a str) -> Self {
        Writer {
            provider,
            out: BTreeMap::new(),
        }
    }

    fn set(&mut self, sfx: &str, v: String) {
        self.out.insert(key(self.provider, sfx), v);
    }

    fn opt<T: ToString>(&mut self, sfx: &str, v: Option<&T>) {
        if let Some(v) = v {
            let s = v.to_string();
            if !s.is_empty() {
                self.set(sfx, s);
            }
        }
    }

    fn list<T: ToString>(&mut self, sfx: &str, v: &[T]) {
        if !v.is_empty() {
            self.set(sfx, join(v));
        }
    }

    fn flag(&mut self, sfx: &str, v: bool) {
        if v {
            self.set(sfx, "true".to_owned());
        }
    }
}

fn join<T: ToString>(items: &[T]) -> String {
    let mut s = String::new();
    for (i, it) in items.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&it.to_string());
    }
    s
}

/// Go's strconv.ParseBool set, which Kube-OVN's users may have written.
fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "true" | "True" | "TRUE" | "t" | "T" | "1" => Some(true),
        "false" | "False" | "FALSE" | "f" | "F" | "0" => Some(false),
        _ => None,
    }
}

fn parse_ip(
    key: &str,
    whole: &str,
    item: &str,
    allow_prefix: bool,
) -> Result<IpAddr, AnnotationError> {
    let item = item.trim();
    let bad = || AnnotationError::new(key, whole, Problem::Ip(shorten(item)));
    if allow_prefix {
        if let Some((addr, _)) = item.split_once('/') {
            IpNetwork::from_str(item).map_err(|_| bad())?;
            return IpAddr::from_str(addr).map_err(|_| bad());
        }
    }
    IpAddr::from_str(item).map_err(|_| bad())
}

/// `v4`, `v6` or `v4,v6` (either order): at most one address per family.
pub(crate) fn parse_dual(
    key: &str,
    whole: &str,
    list: &str,
    allow_prefix: bool,
) -> Result<Vec<IpAddr>, AnnotationError> {
    let mut out: Vec<IpAddr> = Vec::with_capacity(2);
    for item in list.split(',') {
        let ip = parse_ip(key, whole, item, allow_prefix)?;
        if out.len() == 2 || out.iter().any(|o| o.is_ipv4() == ip.is_ipv4()) {
            return Err(AnnotationError::new(key, whole, Problem::Family));
        }
        out.push(ip);
    }
    Ok(out)
}

/// A subnet CIDR block `v4cidr`, `v6cidr` or `v4cidr,v6cidr`.
pub(crate) fn parse_cidr_block(
    key: &str,
    whole: &str,
    list: &str,
) -> Result<Vec<IpNetwork>, AnnotationError> {
    let mut out: Vec<IpNetwork> = Vec::with_capacity(2);
    for item in list.split(',').map(str::trim) {
        let net = parse_cidr(item)
            .ok_or_else(|| AnnotationError::new(key, whole, Problem::Cidr(shorten(item))))?;
        if out.len() == 2 || out.iter().any(|o| o.is_ipv4() == net.is_ipv4()) {
            return Err(AnnotationError::new(key, whole, Problem::Family));
        }
        out.push(net);
    }
    Ok(out)
}

/// A CIDR with an explicit prefix (ipnetwork alone also takes a bare address as /32).
pub(crate) fn parse_cidr(s: &str) -> Option<IpNetwork> {
    let (addr, prefix) = s.split_once('/')?;
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) || addr.is_empty() {
        return None;
    }
    IpNetwork::from_str(s).ok()
}

/// An exclude_ips item: an address or an `a..b` range of one family.
fn check_exclude_item(key: &str, whole: &str, item: &str) -> Result<(), AnnotationError> {
    match item.split_once("..") {
        Some((a, b)) => {
            let a = parse_ip(key, whole, a, false)?;
            let b = parse_ip(key, whole, b, false)?;
            if a.is_ipv4() != b.is_ipv4() {
                return Err(AnnotationError::new(key, whole, Problem::Family));
            }
            Ok(())
        }
        None => parse_ip(key, whole, item, false).map(|_| ()),
    }
}

fn shorten(s: &str) -> String {
    let mut end = s.len().min(64);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// Serde for `Option<IpNetwork>` as a CIDR string; an empty string reads as absent.
mod opt_net {
    use super::*;

    pub(super) fn serialize<S: serde::Serializer>(
        v: &Option<IpNetwork>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match v {
            Some(n) => s.collect_str(n),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<IpNetwork>, D::Error> {
        let s: Option<Cow<'de, str>> = Option::deserialize(d)?;
        match s.as_deref().map(str::trim) {
            None | Some("") => Ok(None),
            Some(t) => parse_cidr(t)
                .map(Some)
                .ok_or_else(|| serde::de::Error::custom(format!("{:?} is not a CIDR", shorten(t)))),
        }
    }
}

/// Serde for `Option<IpAddr>` as a string; an empty string reads as absent.
mod opt_ip {
    use super::*;

    pub(super) fn serialize<S: serde::Serializer>(
        v: &Option<IpAddr>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match v {
            Some(ip) => s.collect_str(ip),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<IpAddr>, D::Error> {
        let s: Option<Cow<'de, str>> = Option::deserialize(d)?;
        match s.as_deref().map(str::trim) {
            None | Some("") => Ok(None),
            Some(t) => IpAddr::from_str(t).map(Some).map_err(|_| {
                serde::de::Error::custom(format!("{:?} is not an IP address", shorten(t)))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn keys() {
        assert_eq!(key(DEFAULT_PROVIDER, suffix::IP_ADDRESS), IP_ADDRESS);
        assert_eq!(
            key("net1.ns1.ovn", suffix::LOGICAL_SWITCH),
            "net1.ns1.ovn.kubernetes.io/logical_switch"
        );
        assert_eq!(split_key(ROUTES), Some(("ovn", "routes")));
        assert_eq!(
            split_key("a.b.kubernetes.io/ip_address"),
            Some(("a.b", "ip_address"))
        );
        assert_eq!(split_key("kubernetes.io/x"), None);
        assert_eq!(split_key("example.com/x"), None);
    }

    #[test]
    fn pod_as_kube_ovn_writes_it() {
        let anns = map(&[
            (IP_ADDRESS, "10.16.0.12,fd00:10:16::c"),
            (MAC_ADDRESS, "00:00:00:53:6B:B6"),
            (CIDR, "10.16.0.0/16,fd00:10:16::/64"),
            (GATEWAY, "10.16.0.1,fd00:10:16::1"),
            (LOGICAL_SWITCH, "ovn-default"),
            (LOGICAL_ROUTER, "ovn-cluster"),
            (ALLOCATED, "true"),
            (ROUTED, "true"),
            (POD_NIC_TYPE, "veth-pair"),
            (INGRESS_RATE, "3"),
            (
                ROUTES,
                r#"[{"dst":"192.168.0.101/24","gw":"10.16.0.254"},{"gw":"10.16.0.1"}]"#,
            ),
            ("unrelated.io/x", "whatever"),
        ]);
        let p = PodNetworkAnnotations::parse(&anns, "ovn").expect("valid");
        assert_eq!(p.ip_addresses.len(), 2);
        assert_eq!(p.ipv6(), Some("fd00:10:16::c".parse().expect("ip")));
        assert_eq!(
            p.mac_address.map(|m| m.to_string()).as_deref(),
            Some("00:00:00:53:6b:b6")
        );
        assert_eq!(p.cidrs.len(), 2);
        assert_eq!(p.logical_switch.as_deref(), Some("ovn-default"));
        assert!(p.allocated && p.routed && !p.port_security);
        assert_eq!(p.ingress_rate, Some(3));
        assert_eq!(p.routes.len(), 2);
        assert_eq!(p.routes[1].dst, None);
        // Another provider's keys are not this one's.
        let other = PodNetworkAnnotations::parse(&anns, "net1.default").expect("empty");
        assert_eq!(other, PodNetworkAnnotations::default());
    }

    #[test]
    fn provider_prefixed() {
        let anns = map(&[
            (
                "attachnet.default.ovn.kubernetes.io/ip_address",
                "172.17.0.5",
            ),
            (
                "attachnet.default.ovn.kubernetes.io/logical_switch",
                "attachnet",
            ),
            ("attachnet.default.ovn.kubernetes.io/allocated", "true"),
        ]);
        let p = PodNetworkAnnotations::parse(&anns, "attachnet.default.ovn").expect("valid");
        assert_eq!(p.ipv4(), Some("172.17.0.5".parse().expect("ip")));
        assert!(p.allocated);
        assert_eq!(p.render("attachnet.default.ovn"), anns);
    }

    #[test]
    fn static_address_with_prefix() {
        let anns = map(&[(IP_ADDRESS, "10.16.0.15/16")]);
        let p = PodNetworkAnnotations::parse(&anns, "ovn").expect("valid");
        assert_eq!(
            p.ip_addresses,
            vec!["10.16.0.15".parse::<IpAddr>().expect("ip")]
        );
    }

    #[test]
    fn bad_values_name_the_key() {
        let cases: &[(&str, &str)] = &[
            (IP_ADDRESS, "10.16.0.300"),
            (IP_ADDRESS, "10.16.0.1,10.16.0.2"),
            (IP_ADDRESS, "10.16.0.1,fd00::1,10.0.0.1"),
            (IP_ADDRESS, "10.16.0.1/33"),
            (MAC_ADDRESS, "00:00:00:53:6b"),
            (CIDR, "10.16.0.0"),
            (CIDR, "10.16.0.0/16,10.17.0.0/16"),
            (GATEWAY, "gw"),
            (ALLOCATED, "yes"),
            (INGRESS_RATE, "-1"),
            (INGRESS_RATE, "+1"),
            (EGRESS_RATE, "1.5"),
            (EGRESS_RATE, "99999999999999999999999"),
            (VLAN_ID, "70000"),
            (ROUTES, "[{\"dst\":\"x\"}]"),
            (ROUTES, "{"),
            (ROUTES, "[{\"gw\":\"10.0.0.1.1\"}]"),
            (IP_POOL, "10.0.0.1,bad"),
            (IP_POOL, "Pool_Name"),
            (IP_POOL, "10.0.0.1;"),
        ];
        for (k, v) in cases {
            let err = PodNetworkAnnotations::parse(&map(&[(k, v)]), "ovn")
                .expect_err(&format!("{k}={v} must be rejected"));
            assert_eq!(err.key, *k, "{v}");
            assert!(err.to_string().contains(k), "{err}");
        }
    }

    #[test]
    fn blank_values_are_absent() {
        let anns = map(&[(IP_ADDRESS, ""), (ALLOCATED, " "), (ROUTES, "")]);
        let p = PodNetworkAnnotations::parse(&anns, "ovn").expect("valid");
        assert_eq!(p, PodNetworkAnnotations::default());
    }

    #[test]
    fn long_values_are_cut_in_errors() {
        let v = "x".repeat(100_000);
        let err = PodNetworkAnnotations::parse(&map(&[(GATEWAY, &v)]), "ovn").expect_err("bad");
        assert!(err.to_string().len() < 1000);
    }

    #[test]
    fn ip_pool_forms() {
        let parse = |v| IpPoolRequest::parse(IP_POOL, v).expect("valid");
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert_eq!(parse("pool-a"), IpPoolRequest::Pool("pool-a".into()));
        assert_eq!(
            parse("10.16.0.15, 10.16.0.16,10.16.0.17"),
            IpPoolRequest::Addresses(vec![
                vec![ip("10.16.0.15")],
                vec![ip("10.16.0.16")],
                vec![ip("10.16.0.17")]
            ])
        );
        // One v4 and one v6 without ';': a single dual-stack entry.
        assert_eq!(
            parse("10.16.0.15,fd00:10:16::f"),
            IpPoolRequest::Addresses(vec![vec![ip("10.16.0.15"), ip("fd00:10:16::f")]])
        );
        assert_eq!(
            parse("10.16.0.15,fd00:10:16::f;10.16.0.16,fd00:10:16::10"),
            IpPoolRequest::Addresses(vec![
                vec![ip("10.16.0.15"), ip("fd00:10:16::f")],
                vec![ip("10.16.0.16"), ip("fd00:10:16::10")]
            ])
        );
        let split = IpPoolRequest::Addresses(vec![vec![ip("10.0.0.1")], vec![ip("fd00::1")]]);
        assert_eq!(parse(&split.render()), split);
    }

    #[test]
    fn allocation_patch_as_kube_ovn() {
        let p = PodNetworkAnnotations {
            ip_addresses: vec!["10.16.0.2".parse().expect("ip")],
            cidrs: vec![parse_cidr("10.16.0.0/16").expect("cidr")],
            gateways: vec!["10.16.0.1".parse().expect("ip")],
            logical_switch: Some("ovn-default".into()),
            pod_nic_type: Some("veth-pair".into()),
            ..Default::default()
        };
        let patch = p.allocation_patch("ovn");
        assert_eq!(patch[IP_ADDRESS].as_deref(), Some("10.16.0.2"));
        assert_eq!(patch[MAC_ADDRESS], None);
        assert_eq!(patch[ALLOCATED].as_deref(), Some("true"));
        assert!(!patch.contains_key(ROUTED));
        let json = merge_patch(&patch);
        assert_eq!(
            json["metadata"]["annotations"][MAC_ADDRESS],
            serde_json::Value::Null
        );
        assert_eq!(json["metadata"]["annotations"][CIDR], "10.16.0.0/16");
        assert_eq!(routed_patch("ovn")[ROUTED].as_deref(), Some("true"));
    }

    #[test]
    fn namespace_as_kube_ovn_writes_it() {
        let anns = map(&[
            (LOGICAL_SWITCH, "ovn-default,ns-subnet"),
            (CIDR, "10.16.0.0/16;10.66.0.0/16,fd00:66::/64"),
            (
                EXCLUDE_IPS,
                "10.16.0.1;10.66.0.1,10.66.0.10..10.66.0.20,fd00:66::1",
            ),
            (IP_POOL, "pool1,pool2"),
        ]);
        let ns = NamespaceAnnotations::parse(&anns).expect("valid");
        assert_eq!(ns.logical_switches, ["ovn-default", "ns-subnet"]);
        assert_eq!(ns.cidrs[1].len(), 2);
        assert_eq!(ns.exclude_ips[1].len(), 3);
        assert_eq!(ns.render(), anns);
        assert_eq!(NamespaceAnnotations::parse(&ns.render()).expect("rt"), ns);
        // No pools: Kube-OVN removes the key.
        let empty = NamespaceAnnotations::default();
        assert_eq!(empty.patch()[IP_POOL], None);
        for (k, v) in [
            (CIDR, "10.16.0.0/16"),
            (EXCLUDE_IPS, "10.16.0.1..fd00::1;"),
            (LOGICAL_SWITCH, "Bad_Name"),
        ] {
            let mut bad = anns.clone();
            bad.insert(k.to_owned(), v.to_owned());
            let err = NamespaceAnnotations::parse(&bad).expect_err(v);
            assert_eq!(err.key, k);
        }
    }

    #[test]
    fn node_as_kube_ovn_writes_it() {
        let anns = map(&[
            (IP_ADDRESS, "100.64.0.2"),
            (MAC_ADDRESS, "00:00:00:a1:b2:c3"),
            (CIDR, "100.64.0.0/16"),
            (GATEWAY, "100.64.0.1"),
            (LOGICAL_SWITCH, "join"),
            (ALLOCATED, "true"),
            (PORT_NAME, "node-kind-worker"),
            (CHASSIS, "3a5c1c6e-8f1e-4d8a-9c6b-0a1b2c3d4e5f"),
        ]);
        let n = NodeAnnotations::parse(&anns).expect("valid");
        assert_eq!(n.port_name.as_deref(), Some("node-kind-worker"));
        assert_eq!(n.render(), anns);
        let patch = n.allocation_patch();
        assert!(!patch.contains_key(CHASSIS));
        assert_eq!(patch[PORT_NAME].as_deref(), Some("node-kind-worker"));
        let err = NodeAnnotations::parse(&map(&[(MAC_ADDRESS, "zz")])).expect_err("bad mac");
        assert_eq!(err.key, MAC_ADDRESS);
    }

    #[test]
    fn multus_list_forms() {
        let dflt = parse_network_annotation(DEFAULT_NETWORK, "kube-system/calico", "default")
            .expect("valid");
        assert_eq!(
            (dflt[0].namespace.as_str(), dflt[0].name.as_str()),
            ("kube-system", "calico")
        );
        let err = parse_network_annotation(DEFAULT_NETWORK, "a/b/c", "d").expect_err("bad");
        assert_eq!(err.key, DEFAULT_NETWORK);
        let nets = parse_networks("macvlan, kube-system/attachnet@eth1 ,other@net2", "default")
            .expect("valid");
        assert_eq!(nets.len(), 3);
        assert_eq!(
            (nets[0].name.as_str(), nets[0].namespace.as_str()),
            ("macvlan", "default")
        );
        assert_eq!(nets[1].namespace, "kube-system");
        assert_eq!(nets[1].interface.as_deref(), Some("eth1"));
        assert_eq!(nets[1].provider(), "attachnet.kube-system");
        assert_eq!(nets[2].interface.as_deref(), Some("net2"));

        let json = r#"[{"name":"attachnet","namespace":"ns1","interface":"eth1",
            "ips":["172.17.0.5/24"],"mac":"c2:b0:57:49:47:f1","default-route":["172.17.0.1"],
            "cni-args":{"foo":"bar"}}, {"name":"macvlan"}]"#;
        let nets = parse_networks(json, "default").expect("valid");
        assert_eq!(nets[0].ips, ["172.17.0.5/24"]);
        assert_eq!(nets[0].extra["cni-args"]["foo"], "bar");
        assert_eq!(nets[1].namespace, "default");
        assert_eq!(
            parse_networks(&render_networks(&nets), "x").expect("rt"),
            nets
        );
        assert!(parse_networks("", "default").expect("empty").is_empty());
        // Multus takes an empty interface after '@' as none.
        assert_eq!(
            parse_networks("net@", "d").expect("valid")[0].interface,
            None
        );

        for bad in [
            "a/b/c",
            "a@b@c",
            "Upper",
            "ns/-bad",
            "net@this-name-is-too-long",
            "[{\"name\":\"a\"}",
            "[{\"namespace\":\"a\"}]",
            "{\"name\":\"a\"}",
        ] {
            let err = parse_networks(bad, "default").expect_err(bad);
            assert_eq!(err.key, NETWORKS);
        }
    }

    fn arb_v4() -> impl Strategy<Value = IpAddr> {
        any::<[u8; 4]>().prop_map(IpAddr::from)
    }

    fn arb_v6() -> impl Strategy<Value = IpAddr> {
        any::<[u8; 16]>().prop_map(IpAddr::from)
    }

    fn arb_dual() -> impl Strategy<Value = Vec<IpAddr>> {
        prop_oneof![
            Just(vec![]),
            arb_v4().prop_map(|a| vec![a]),
            arb_v6().prop_map(|a| vec![a]),
            (arb_v4(), arb_v6(), any::<bool>()).prop_map(|(a, b, swap)| if swap {
                vec![b, a]
            } else {
                vec![a, b]
            }),
        ]
    }

    fn arb_net(ip: IpAddr, len: u8) -> IpNetwork {
        let max = if ip.is_ipv4() { 32 } else { 128 };
        IpNetwork::new(ip, len % (max + 1)).expect("prefix in range")
    }

    fn arb_cidrs() -> impl Strategy<Value = Vec<IpNetwork>> {
        (arb_dual(), any::<u8>(), any::<u8>()).prop_map(|(ips, a, b)| {
            ips.into_iter()
                .zip([a, b])
                .map(|(ip, l)| arb_net(ip, l))
                .collect()
        })
    }

    fn arb_name() -> impl Strategy<Value = String> {
        "[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?(\\.[a-z0-9]{1,5})?"
    }

    fn arb_route() -> impl Strategy<Value = Route> {
        (
            proptest::option::of((prop_oneof![arb_v4(), arb_v6()], any::<u8>())),
            proptest::option::of(prop_oneof![arb_v4(), arb_v6()]),
        )
            .prop_map(|(dst, gw)| Route {
                dst: dst.map(|(ip, l)| arb_net(ip, l)),
                gw,
            })
    }

    fn arb_pool() -> impl Strategy<Value = IpPoolRequest> {
        prop_oneof![
            arb_name().prop_map(IpPoolRequest::Pool),
            proptest::collection::vec(arb_dual().prop_filter("non-empty", |d| !d.is_empty()), 1..5)
                .prop_map(IpPoolRequest::Addresses),
        ]
    }

    prop_compose! {
        fn arb_pod()(
            ip_addresses in arb_dual(),
            mac in proptest::option::of(any::<[u8; 6]>()),
            cidrs in arb_cidrs(),
            gateways in arb_dual(),
            logical_switch in proptest::option::of(arb_name()),
            logical_router in proptest::option::of(arb_name()),
            flags in any::<[bool; 3]>(),
            ip_pool in proptest::option::of(arb_pool()),
            rates in any::<[Option<u64>; 4]>(),
            routes in proptest::collection::vec(arb_route(), 0..4),
            pod_nic_type in proptest::option::of("[a-z-]{1,12}"),
            vlan_id in any::<Option<u16>>(),
            provider_network in proptest::option::of(arb_name()),
        ) -> PodNetworkAnnotations {
            PodNetworkAnnotations {
                ip_addresses,
                mac_address: mac.map(Mac),
                cidrs,
                gateways,
                logical_switch,
                logical_router,
                allocated: flags[0],
                routed: flags[1],
                ip_pool,
                ingress_rate: rates[0],
                egress_rate: rates[1],
                ingress_burst: rates[2],
                egress_burst: rates[3],
                routes,
                pod_nic_type,
                port_security: flags[2],
                vlan_id,
                provider_network,
            }
        }
    }

    proptest! {
        #[test]
        fn pod_round_trip(p in arb_pod(), provider in prop_oneof![Just("ovn".to_owned()), "[a-z]{1,6}\\.[a-z]{1,6}(\\.ovn)?"]) {
            let rendered = p.render(&provider);
            prop_assert_eq!(PodNetworkAnnotations::parse(&rendered, &provider).expect("rendered parses"), p.clone());
            // The allocation patch, applied to nothing, reads back as the allocation fields.
            let applied: BTreeMap<String, String> = p.allocation_patch(&provider).into_iter()
                .filter_map(|(k, v)| v.map(|v| (k, v))).collect();
            let back = PodNetworkAnnotations::parse(&applied, &provider).expect("patch parses");
            prop_assert_eq!(back.ip_addresses, p.ip_addresses);
            prop_assert_eq!(back.mac_address, p.mac_address);
            prop_assert!(back.allocated);
        }

        #[test]
        fn namespace_round_trip(
            subnets in proptest::collection::vec((arb_name(), arb_cidrs().prop_filter("block", |c| !c.is_empty()),
                proptest::collection::vec(prop_oneof![arb_v4(), arb_v6()], 0..3)), 0..4),
            ip_pools in proptest::collection::vec(arb_name(), 0..3),
        ) {
            let ns = NamespaceAnnotations {
                logical_switches: subnets.iter().map(|s| s.0.clone()).collect(),
                cidrs: subnets.iter().map(|s| s.1.clone()).collect(),
                exclude_ips: subnets.iter().map(|s| s.2.iter().map(|ip| ip.to_string()).collect()).collect(),
                ip_pools,
            };
            prop_assert_eq!(NamespaceAnnotations::parse(&ns.render()).expect("parses"), ns);
        }

        #[test]
        fn node_round_trip(
            ip_addresses in arb_dual(), mac in proptest::option::of(any::<[u8; 6]>()), cidrs in arb_cidrs(),
            gateways in arb_dual(), names in proptest::collection::vec(proptest::option::of(arb_name()), 4),
            allocated in any::<bool>(),
        ) {
            let n = NodeAnnotations {
                ip_addresses, mac_address: mac.map(Mac), cidrs, gateways,
                logical_switch: names[0].clone(), allocated, port_name: names[1].clone(),
                chassis: names[2].clone(), tunnel_interface: names[3].clone(),
            };
            prop_assert_eq!(NodeAnnotations::parse(&n.render()).expect("parses"), n);
        }

        #[test]
        fn networks_round_trip(items in proptest::collection::vec(
            (arb_name().prop_filter("label", |n| !n.contains('.')), proptest::option::of("[a-z]{1,8}"),
             proptest::option::of("[a-z][a-z0-9]{0,14}")), 0..4)
        ) {
            let text: Vec<String> = items.iter().map(|(name, ns, ifname)| {
                let mut s = String::new();
                if let Some(ns) = ns { s.push_str(ns); s.push('/'); }
                s.push_str(name);
                if let Some(i) = ifname { s.push('@'); s.push_str(i); }
                s
            }).collect();
            let nets = parse_networks(&text.join(","), "dflt").expect("valid list");
            prop_assert_eq!(nets.len(), items.len());
            for (n, (name, ns, ifname)) in nets.iter().zip(&items) {
                prop_assert_eq!(&n.name, name);
                prop_assert_eq!(n.namespace.as_str(), ns.as_deref().unwrap_or("dflt"));
                prop_assert_eq!(&n.interface, ifname);
            }
            prop_assert_eq!(parse_networks(&render_networks(&nets), "other").expect("json"), nets);
        }

        #[test]
        fn arbitrary_values_never_panic(k in prop_oneof![Just(IP_ADDRESS), Just(CIDR), Just(ROUTES), Just(IP_POOL),
            Just(MAC_ADDRESS), Just(INGRESS_RATE), Just(LOGICAL_SWITCH), Just(EXCLUDE_IPS)], v in ".{0,40}") {
            let m = map(&[(k, &v)]);
            let _ = PodNetworkAnnotations::parse(&m, "ovn");
            let _ = NamespaceAnnotations::parse(&m);
            let _ = NodeAnnotations::parse(&m);
            let _ = parse_networks(&v, "default");
        }
    }
}
