//! The Kube-OVN translation as plain functions: (object, what is known) -> northbound operations.
//! No I/O here; handlers feed the results to the writer.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnetwork::IpNetwork;
use kubeovn_ipam::{Addresses, Mac};
use kubeovn_ovn::northbound::{
    Batch, LbTarget, LoadBalancer, LoadBalancerGroup, LoadBalancerProtocol,
    LogicalRouterPolicyAction, LogicalSwitch, Op, Patch, PortGroup, RouterPolicy, StaticRoute,
    SwitchPort,
};

use crate::naming::{self, external_ids as ext, priority};

/// A Subnet as the controller uses it: the CRD's strings parsed at the edge.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubnetInfo {
    /// Name (= logical switch).
    pub name: String,
    /// CIDR blocks (one per family).
    pub cidrs: Vec<IpNetwork>,
    /// Gateways (one per family, same order as `cidrs`).
    pub gateways: Vec<IpAddr>,
    /// Excluded addresses and `a..b` ranges.
    pub exclude_ips: Vec<String>,
    /// The VPC (logical router).
    pub vpc: String,
    /// The provider (`ovn` for the default network).
    pub provider: String,
    /// `distributed` or `centralized`.
    pub gateway_type: String,
    /// A centralized subnet's `gatewayNode` names, in order (a `name:ip` pair's name).
    pub gateway_nodes: Vec<String>,
    /// A centralized subnet's `gatewayNodeSelectors`.
    pub gateway_selectors: Vec<crate::selector::Selector>,
    /// `enableEcmp`: egress through every healthy gateway node at once.
    pub enable_ecmp: bool,
    /// Namespaces bound to the subnet.
    pub namespaces: Vec<String>,
    /// Whether this is the default subnet.
    pub default: bool,
    /// Whether this is the join subnet (node ports live there).
    pub join: bool,
    /// Whether the VPC's Service load balancers apply to the switch (`enableLb`, default true).
    pub enable_lb: bool,
    /// `private`: only its own block, `allowSubnets` and the nodes reach it, and it reaches only those.
    pub private: bool,
    /// `allowSubnets` (CIDRs, checked).
    pub allow_subnets: Vec<String>,
    /// `allowEWTraffic`: its own block passes its `acls`.
    pub allow_ew_traffic: bool,
    /// `acls`, parsed: written on the switch as given.
    pub acls: Vec<SwitchAcl>,
}

/// A Subnet's own ACL, parsed into OVN's values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchAcl {
    /// `from-lport` or `to-lport`.
    pub direction: kubeovn_ovn::northbound::AclDirection,
    /// 0..=32767.
    pub priority: i64,
    /// The OVN match (not empty).
    pub match_: String,
    /// The action.
    pub action: kubeovn_ovn::northbound::AclAction,
}

impl SubnetInfo {
    /// `cidrBlock` as Kube-OVN writes it (`v4,v6`).
    pub fn cidr_block(&self) -> String {
        join(&self.cidrs)
    }
    /// `gateway` as Kube-OVN writes it.
    pub fn gateway(&self) -> String {
        join(&self.gateways)
    }
    /// The allocator's view of the subnet.
    pub fn ipam_spec(&self) -> kubeovn_ipam::SubnetSpec {
        kubeovn_ipam::SubnetSpec::new(&self.name, self.cidr_block(), self.gateway())
            .exclude(self.exclude_ips.iter().cloned())
    }
    /// The router port's networks: each gateway with its block's prefix (`10.16.0.1/16`).
    pub fn router_networks(&self) -> Vec<String> {
        self.cidrs
            .iter()
            .zip(&self.gateways)
            .map(|(c, g)| format!("{g}/{}", c.prefix()))
            .collect()
    }
    /// The IPv4 block, if any.
    pub fn v4(&self) -> Option<IpNetwork> {
        self.cidrs.iter().copied().find(IpNetwork::is_ipv4)
    }
    /// Whether pods on this subnet get the per-node gateway policies (overlay subnets of the default VPC).
    pub fn distributed(&self, default_vpc: &str) -> bool {
        !self.join && self.vpc == default_vpc && self.gateway_type != "centralized"
    }
}

fn join<T: std::fmt::Display>(v: &[T]) -> String {
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn family_prefix(c: &IpNetwork) -> &'static str {
    if c.is_ipv4() {
        "ip4"
    } else {
        "ip6"
    }
}

/// A stable locally administered MAC for a router port, derived from its name (so re-planning never changes
/// it).
pub fn router_port_mac(name: &str) -> String {
    // FNV-1a: stable across runs and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let b = h.to_be_bytes();
    format!(
        "0a:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        b[1], b[2], b[3], b[4], b[5]
    )
}

fn vendor_ids() -> BTreeMap<String, String> {
    BTreeMap::from([(ext::VENDOR.to_owned(), naming::VENDOR.to_owned())])
}

/// The 31000 policy matches of a subnet (`ip4.dst == 10.16.0.0/16`).
pub fn subnet_policy_matches(s: &SubnetInfo) -> Vec<String> {
    s.cidrs
        .iter()
        .map(|c| format!("{}.dst == {c}", family_prefix(c)))
        .collect()
}

/// The 29000 policy match of a subnet on a node (`ip4.src == $ovn.default.node1_ip4`).
pub fn gateway_policy_match(s: &SubnetInfo, node: &str, v4: bool) -> String {
    let pg = naming::subnet_node_port_group(&s.name, node);
    if v4 {
        format!("ip4.src == ${pg}_ip4")
    } else {
        format!("ip6.src == ${pg}_ip6")
    }
}

/// The 30000 policy match of a node (`ip4.dst == <node address>`).
pub fn node_policy_match(node_ip: IpAddr) -> String {
    match node_ip {
        IpAddr::V4(_) => format!("ip4.dst == {node_ip}"),
        IpAddr::V6(_) => format!("ip6.dst == {node_ip}"),
    }
}

/// A subnet's switch, its patch to the VPC router (with `mac`) and its 31000 allow policies.
pub fn subnet_batch(s: &SubnetInfo, mac: &str) -> Batch {
    let mut b = Batch::new();
    let mut ls = LogicalSwitch::new(&s.name)
        .external_id(ext::VENDOR, naming::VENDOR)
        .external_id(ext::LR, &s.vpc);
    if let Some(v4) = s.v4() {
        ls = ls.subnet(v4.to_string());
    }
    if let Some(v6) = s.cidrs.iter().find(|c| c.is_ipv6()) {
        ls = ls.other_config("ipv6_prefix", v6.network().to_string());
    }
    let mut excl: Vec<String> = s.gateways.iter().map(ToString::to_string).collect();
    excl.extend(s.exclude_ips.iter().cloned());
    // other_config:exclude_ips is read by OVN's own IPv4 IPAM only.
    excl.retain(|e| !e.contains(':'));
    excl.sort();
    excl.dedup();
    ls = ls.exclude_ips(excl);
    b.add(ls);
    // Services reach the switch's pods through the VPC's group: attached once, whatever the Services.
    let group = naming::lb_group(&s.vpc);
    if s.enable_lb {
        b.add(LoadBalancerGroup::new(&group));
        b.lb_group_attach(&group, LbTarget::Switch(s.name.clone()));
    } else {
        b.lb_group_detach(&group, LbTarget::Switch(s.name.clone()));
    }
    let mut patch = Patch::new(&s.name, &s.vpc, mac, s.router_networks());
    patch.external_ids = vendor_ids();
    b.patch(patch);
    for m in subnet_policy_matches(s) {
        b.add(
            RouterPolicy::new(
                &s.vpc,
                i64::from(priority::SUBNET_ROUTER),
                m,
                LogicalRouterPolicyAction::Allow,
            )
            .external_id(ext::VENDOR, naming::VENDOR)
            .external_id(ext::SUBNET, &s.name),
        );
    }
    b
}

/// The per-node distributed gateway port groups and 29000 reroute policies of a subnet; `nodes` gives each
/// node's join addresses.
pub fn gateway_batch(s: &SubnetInfo, nodes: &[(String, Vec<IpAddr>)]) -> Batch {
    let mut b = Batch::new();
    for (node, join_ips) in nodes {
        let pg = naming::subnet_node_port_group(&s.name, node);
        b.add(
            PortGroup::new(&pg)
                .external_id(ext::VENDOR, naming::VENDOR)
                .external_id(ext::SUBNET, &s.name)
                .external_id(ext::NODE, node),
        );
        for c in &s.cidrs {
            let Some(nh) = join_ips.iter().find(|ip| ip.is_ipv4() == c.is_ipv4()) else {
                continue;
            };
            b.add(
                RouterPolicy::new(
                    &s.vpc,
                    i64::from(priority::GATEWAY_ROUTER),
                    gateway_policy_match(s, node, c.is_ipv4()),
                    LogicalRouterPolicyAction::Reroute,
                )
                .nexthops([nh.to_string()])
                .external_id(ext::VENDOR, naming::VENDOR)
                .external_id(ext::SUBNET, &s.name)
                .external_id(ext::NODE, node),
            );
        }
    }
    b
}

/// Removes a subnet: the gateway policies and port groups of `nodes`, its allow policies, the patch pair
/// and the switch (ports go with it).
pub fn subnet_delete_batch(s: &SubnetInfo, nodes: &[String]) -> Batch {
    let mut b = Batch::new();
    for node in nodes {
        for v4 in [true, false] {
            b.add(Op::DeletePolicy {
                router: s.vpc.clone(),
                priority: i64::from(priority::GATEWAY_ROUTER),
                match_: gateway_policy_match(s, node, v4),
            });
        }
        b.add(Op::DeletePortGroup(naming::subnet_node_port_group(
            &s.name, node,
        )));
    }
    for m in subnet_policy_matches(s) {
        b.add(Op::DeletePolicy {
            router: s.vpc.clone(),
            priority: i64::from(priority::SUBNET_ROUTER),
            match_: m,
        });
    }
    b.unpatch(&s.name, &s.vpc);
    b.delete_switch(&s.name);
    b
}

/// The VPC router with its default routes via the join gateways.
pub fn vpc_batch(router: &str, join: &SubnetInfo) -> Batch {
    let mut b = Batch::new();
    b.add(kubeovn_ovn::northbound::Router::new(router).external_id(ext::VENDOR, naming::VENDOR));
    for gw in &join.gateways {
        let prefix = if gw.is_ipv4() { "0.0.0.0/0" } else { "::/0" };
        b.add(
            StaticRoute::new(router, prefix, gw.to_string())
                .external_id(ext::VENDOR, naming::VENDOR),
        );
    }
    b
}

/// The `addresses` entry of a port: `"<mac> <ip> [<ip6>]"`.
pub fn port_address(a: &Addresses) -> String {
    let mut s = a.mac.to_string();
    for ip in a.ips() {
        s.push(' ');
        s.push_str(&ip.to_string());
    }
    s
}

/// Parses a port's `addresses` entry back (MAC first, then addresses; "router"/"dynamic" give None).
pub fn parse_port_address(s: &str) -> Option<(Mac, Vec<IpAddr>)> {
    let mut it = s.split_whitespace();
    let mac: Mac = it.next()?.parse().ok()?;
    let ips = it.filter_map(|w| w.parse().ok()).collect();
    Some((mac, ips))
}

/// A pod's port request: what [`pod_batch`] needs.
#[derive(Debug, Clone)]
pub struct PodPort<'a> {
    /// Namespace.
    pub namespace: &'a str,
    /// Pod name.
    pub name: &'a str,
    /// Subnet (switch).
    pub subnet: &'a str,
    /// Allocated addresses.
    pub addrs: &'a Addresses,
    /// Whether `port_security` was asked for.
    pub port_security: bool,
    /// The node, once scheduled, and whether the subnet has per-node gateway port groups.
    pub node: Option<(&'a str, bool)>,
}

/// The port of a pod (`<pod>.<namespace>`) and its port group memberships (`node.<node>`, and
/// `<subnet>.<node>` on distributed subnets).
pub fn pod_batch(p: &PodPort<'_>, port: &str) -> Batch {
    let mut b = Batch::new();
    let addr = port_address(p.addrs);
    let mut sp = SwitchPort::new(p.subnet, port).addresses([addr.clone()]);
    sp = if p.port_security {
        sp.port_security([addr])
    } else {
        sp.port_security(Vec::<String>::new())
    };
    for (k, v) in naming::pod_port_external_ids(p.subnet, p.namespace, p.name) {
        sp = sp.external_id(k, v);
    }
    b.add(sp);
    if let Some((node, distributed)) = p.node {
        let pg = naming::node_port_group(node);
        b.add(
            PortGroup::new(&pg)
                .external_id(ext::VENDOR, naming::VENDOR)
                .external_id(ext::NODE, node),
        );
        b.port_group_add_ports(&pg, [port]);
        if distributed {
            let pg = naming::subnet_node_port_group(p.subnet, node);
            b.add(
                PortGroup::new(&pg)
                    .external_id(ext::VENDOR, naming::VENDOR)
                    .external_id(ext::SUBNET, p.subnet)
                    .external_id(ext::NODE, node),
            );
            b.port_group_add_ports(&pg, [port]);
        }
    }
    b
}

/// A node's port `node-<node>` on the join switch, its port group and its 30000 policies (traffic to the
/// node's addresses rerouted to its join address).
pub fn node_batch(
    node: &str,
    join: &SubnetInfo,
    addrs: &Addresses,
    node_ips: &[IpAddr],
    vpc: &str,
) -> Batch {
    let mut b = Batch::new();
    let port = naming::node_port(node);
    b.add(
        SwitchPort::new(&join.name, &port)
            .addresses([port_address(addrs)])
            .external_id(ext::VENDOR, naming::VENDOR)
            .external_id(ext::LS, &join.name)
            .external_id(ext::NODE, node),
    );
    let pg = naming::node_port_group(node);
    b.add(
        PortGroup::new(&pg)
            .external_id(ext::VENDOR, naming::VENDOR)
            .external_id(ext::NODE, node),
    );
    b.port_group_add_ports(&pg, [port.as_str()]);
    for ip in node_ips {
        let Some(nh) = addrs.ips().find(|j| j.is_ipv4() == ip.is_ipv4()) else {
            continue;
        };
        b.add(
            RouterPolicy::new(
                vpc,
                i64::from(priority::NODE_ROUTER),
                node_policy_match(*ip),
                LogicalRouterPolicyAction::Reroute,
            )
            .nexthops([nh.to_string()])
            .external_id(ext::VENDOR, naming::VENDOR)
            .external_id(ext::NODE, node),
        );
    }
    b
}

/// Removes a node's port, port group and 30000 policies.
pub fn node_delete_batch(node: &str, node_ips: &[IpAddr], vpc: &str) -> Batch {
    let mut b = Batch::new();
    for ip in node_ips {
        b.add(Op::DeletePolicy {
            router: vpc.to_owned(),
            priority: i64::from(priority::NODE_ROUTER),
            match_: node_policy_match(*ip),
        });
    }
    b.add(Op::DeletePortGroup(naming::node_port_group(node)));
    b.delete_switch_port(naming::node_port(node));
    b
}

/// An ACL of the translation as OVN's, on the port group `parent`, owned by `owner`.
pub(crate) fn ovn_acl(
    a: &crate::netpol::AclSpec,
    parent: &str,
    owner: &str,
    meter: Option<&str>,
) -> kubeovn_ovn::northbound::Acl {
    let (direction, after_lb) = match a.direction {
        crate::netpol::Direction::Ingress => {
            (kubeovn_ovn::northbound::AclDirection::ToLport, false)
        }
        crate::netpol::Direction::Egress => {
            (kubeovn_ovn::northbound::AclDirection::FromLport, true)
        }
    };
    let action = match a.verdict {
        crate::netpol::Verdict::Allow => kubeovn_ovn::northbound::AclAction::AllowRelated,
        crate::netpol::Verdict::Deny => kubeovn_ovn::northbound::AclAction::Drop,
    };
    let mut acl = kubeovn_ovn::northbound::Acl::new(
        kubeovn_ovn::northbound::AclParent::PortGroup(parent.to_owned()),
        direction,
        a.priority,
        a.match_.as_str(),
        action,
    )
    .external_id("vendor", "kube-ovn")
    .external_id(crate::netpol::OWNER_KEY, owner);
    if after_lb {
        // Egress is judged on the Service backend a connection is balanced to.
        acl = acl.option("apply-after-lb", "true");
    }
    if a.log {
        // OVN's ACL name holds at most 63 characters.
        let name: String = owner.chars().take(63).collect();
        let severity = match a.verdict {
            crate::netpol::Verdict::Allow => kubeovn_ovn::northbound::AclSeverity::Info,
            crate::netpol::Verdict::Deny => kubeovn_ovn::northbound::AclSeverity::Warning,
        };
        acl = acl.log(name, severity, meter);
    }
    acl
}

/// The protocols a Service port can have, each a load balancer of its own.
pub(crate) const PROTOCOLS: [LoadBalancerProtocol; 3] = [
    LoadBalancerProtocol::Tcp,
    LoadBalancerProtocol::Udp,
    LoadBalancerProtocol::Sctp,
];

/// A Service's load balancers for one protocol: the one of every VIP (the IPv4 ones' template load balancer
/// under internalTrafficPolicy Local), and the Local IPv6 VIPs' (a template load balancer has one family).
pub(crate) fn lb_names(ns: &str, name: &str, proto: &LoadBalancerProtocol) -> [String; 2] {
    let base = naming::service_lb(ns, name, proto.as_str());
    let v6 = format!("{base}.v6");
    [base, v6]
}

/// A template variable's value: the same on every chassis, or each node's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TemplateValue {
    /// One value on every chassis.
    All(String),
    /// Each node's own value, by node name (none: empty).
    PerNode(BTreeMap<String, String>),
}

/// The load balancer rows a Service wants: per protocol, the rows by name; the template variables of its
/// `internalTrafficPolicy: Local` balancers (name -> value); its backends over all VIPs.
#[derive(Debug, Default)]
pub(crate) struct ServiceLbRows {
    /// Per protocol, the rows wanted (a protocol with none: its balancers go).
    pub by_protocol: Vec<(LoadBalancerProtocol, Vec<(String, LoadBalancer)>)>,
    /// The template variables.
    pub vars: BTreeMap<String, TemplateValue>,
    /// Backends over all VIPs.
    pub backends: usize,
}

/// The load balancer rows of Service `key` (`namespace/name`) programmed in VPC `vpc`, from what its
/// EndpointSlices make of it (`d`) and how session affinity is programmed.
pub(crate) fn service_lb_rows(
    key: &str,
    vpc: &str,
    d: &crate::services::Desired,
    affinity: super::SessionAffinity,
) -> ServiceLbRows {
    use super::SessionAffinity;
    use kubeovn_ovn::northbound::{template_var_name, LoadBalancerSelectionFields};
    let (ns, name) = key.split_once('/').unwrap_or(("", key));
    let mut rows = ServiceLbRows::default();
    for proto in PROTOCOLS {
        let base = naming::service_lb(ns, name, proto.as_str());
        let mut wanted: Vec<(String, LoadBalancer)> = Vec::new();
        if let Some(want) = d.lbs.get(proto.as_str()) {
            rows.backends += want
                .vips
                .values()
                .map(|v| v.split(',').filter(|s| !s.is_empty()).count())
                .sum::<usize>();
            let lb = |n: &str| {
                LoadBalancer::new(n)
                    .protocol(proto.clone())
                    .external_id(ext::VENDOR, naming::VENDOR)
                    .external_id(ext::SERVICE, key)
                    .external_id(ext::VPC, vpc)
                    .exact()
            };
            if d.local {
                // One template load balancer per family: backends per chassis through a variable per VIP.
                for (v6, n) in [false, true].into_iter().zip(lb_names(ns, name, &proto)) {
                    let mut t = lb(&n)
                        .option("template", "true")
                        .option("address-family", if v6 { "ipv6" } else { "ipv4" })
                        .selection_fields(Vec::new());
                    for (vip, by_node) in &want.by_node {
                        if vip.starts_with('[') != v6 {
                            continue;
                        }
                        let var = template_var_name(&format!("{n}.{vip}"));
                        let key = if v6 {
                            // OVN 23.03 takes an IPv6 VIP of a template load balancer only as a variable.
                            let (ip, port) = vip.rsplit_once(':').unwrap_or((vip, ""));
                            let ip = ip.trim_start_matches('[').trim_end_matches(']');
                            let ip_var = template_var_name(&format!("{n}.{ip}"));
                            rows.vars
                                .insert(ip_var.clone(), TemplateValue::All(ip.to_owned()));
                            format!("^{ip_var}:{port}")
                        } else {
                            vip.clone()
                        };
                        t.vips.insert(key, format!("^{var}"));
                        rows.vars
                            .insert(var, TemplateValue::PerNode(by_node.clone()));
                    }
                    if !t.vips.is_empty() {
                        wanted.push((n, t));
                    }
                }
            } else {
                let mut l = lb(&base).option("reject", "true");
                l = match (d.affinity_timeout, affinity) {
                    (Some(t), SessionAffinity::Timeout) => l
                        .option("affinity_timeout", t.to_string())
                        .selection_fields(Vec::new()),
                    (Some(_), SessionAffinity::SourceHash) => {
                        l.selection_fields(vec![LoadBalancerSelectionFields::IpSrc])
                    }
                    (None, _) => l.selection_fields(Vec::new()),
                };
                l.vips = want.vips.clone();
                wanted.push((base.clone(), l));
            }
        }
        rows.by_protocol.push((proto, wanted));
    }
    rows
}

/// What a pod's annotations ask of its addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AddressChoice {
    /// These addresses (none: any), from this pool if named.
    Given {
        /// Static addresses: the `ip_address` annotation, the addresses the pod holds already, or a free
        /// entry of an address-list `ip_pool`.
        statics: Vec<IpAddr>,
        /// A named IPPool to allocate from.
        pool: Option<String>,
    },
    /// Every entry of its address-list `ip_pool` is held by another owner: it waits for a release.
    PoolInUse,
}

/// The address choice of pod `owner` (`namespace/name`): its `ip_address` annotation, else its `ip_pool` (a
/// named pool, or the first entry of an address list none of whose addresses another owner holds; the
/// addresses it `held` already win). `holder` says who holds an address.
pub(crate) fn pod_addresses(
    a: &crate::annotations::PodNetworkAnnotations,
    held: Option<&[IpAddr]>,
    holder: &dyn Fn(IpAddr) -> Option<String>,
    owner: &str,
) -> AddressChoice {
    use crate::annotations::IpPoolRequest;
    if !a.ip_addresses.is_empty() {
        return AddressChoice::Given {
            statics: a.ip_addresses.clone(),
            pool: None,
        };
    }
    match &a.ip_pool {
        Some(IpPoolRequest::Pool(p)) => AddressChoice::Given {
            statics: Vec::new(),
            pool: Some(p.clone()),
        },
        Some(IpPoolRequest::Addresses(entries)) => {
            if let Some(h) = held {
                return AddressChoice::Given {
                    statics: h.to_vec(),
                    pool: None,
                };
            }
            let free = entries
                .iter()
                .find(|e| e.iter().all(|ip| holder(*ip).is_none_or(|o| o == owner)));
            match free {
                Some(e) => AddressChoice::Given {
                    statics: e.clone(),
                    pool: None,
                },
                None => AddressChoice::PoolInUse,
            }
        }
        None => AddressChoice::Given {
            statics: Vec::new(),
            pool: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subnet() -> SubnetInfo {
        SubnetInfo {
            name: "ovn-default".into(),
            cidrs: vec![
                "10.16.0.0/16".parse().expect("cidr"),
                "fd00:10:16::/64".parse().expect("cidr"),
            ],
            gateways: vec![
                "10.16.0.1".parse().expect("ip"),
                "fd00:10:16::1".parse().expect("ip"),
            ],
            exclude_ips: vec!["10.16.0.2..10.16.0.10".into()],
            vpc: "ovn-cluster".into(),
            provider: "ovn".into(),
            gateway_type: "distributed".into(),
            default: true,
            enable_lb: true,
            ..SubnetInfo::default()
        }
    }

    #[test]
    fn subnet_plan_is_kube_ovn_shaped() {
        let s = subnet();
        assert_eq!(s.cidr_block(), "10.16.0.0/16,fd00:10:16::/64");
        assert_eq!(
            s.router_networks(),
            vec!["10.16.0.1/16", "fd00:10:16::1/64"]
        );
        let b = subnet_batch(&s, &router_port_mac("ovn-cluster-ovn-default"));
        let Op::Switch(ls) = &b.ops[0] else {
            panic!("switch first")
        };
        assert_eq!(ls.other_config["subnet"], "10.16.0.0/16");
        assert_eq!(
            ls.other_config["exclude_ips"],
            "10.16.0.1 10.16.0.2..10.16.0.10"
        );
        let names: Vec<String> = b
            .ops
            .iter()
            .filter_map(|o| match o {
                Op::RouterPort(p) => Some(p.name.clone()),
                Op::SwitchPort(p) => Some(p.name.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(
            names,
            ["ovn-cluster-ovn-default", "ovn-default-ovn-cluster"]
        );
        let pols: Vec<&str> = b
            .ops
            .iter()
            .filter_map(|o| match o {
                Op::Policy(p) if p.priority == 31000 => Some(p.match_.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(
            pols,
            ["ip4.dst == 10.16.0.0/16", "ip6.dst == fd00:10:16::/64"]
        );
    }

    #[test]
    fn router_mac_is_stable_and_local() {
        let a = router_port_mac("ovn-cluster-join");
        assert_eq!(a, router_port_mac("ovn-cluster-join"));
        assert_ne!(a, router_port_mac("ovn-cluster-ovn-default"));
        assert!(a.starts_with("0a:"));
        assert!(a.parse::<Mac>().is_ok());
    }

    #[test]
    fn pod_port_and_groups() {
        let addrs = Addresses {
            v4: Some("10.16.0.11".parse().expect("ip")),
            v6: None,
            mac: "00:00:00:aa:bb:cc".parse().expect("mac"),
        };
        let p = PodPort {
            namespace: "ns1",
            name: "web-0",
            subnet: "ovn-default",
            addrs: &addrs,
            port_security: true,
            node: Some(("kind-worker", true)),
        };
        let b = pod_batch(&p, "web-0.ns1");
        let Op::SwitchPort(sp) = &b.ops[0] else {
            panic!("port first")
        };
        assert_eq!(
            sp.addresses.as_deref(),
            Some(&["00:00:00:aa:bb:cc 10.16.0.11".to_owned()][..])
        );
        assert_eq!(sp.port_security, sp.addresses);
        assert_eq!(sp.external_ids["vendor"], "kube-ovn");
        assert_eq!(sp.external_ids["pod"], "ns1/web-0");
        assert_eq!(sp.external_ids["ls"], "ovn-default");
        let groups: Vec<&str> = b
            .ops
            .iter()
            .filter_map(|o| match o {
                Op::PortGroupAdd { group, .. } => Some(group.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(groups, ["node.kind.worker", "ovn.default.kind.worker"]);
        assert_eq!(
            parse_port_address("00:00:00:aa:bb:cc 10.16.0.11"),
            Some((addrs.mac, vec!["10.16.0.11".parse().expect("ip")]))
        );
        assert_eq!(parse_port_address("router"), None);
    }

    #[test]
    fn gateway_and_node_policies() {
        let s = subnet();
        let join_ips: Vec<IpAddr> = vec!["100.64.0.2".parse().expect("ip")];
        let b = gateway_batch(&s, &[("n1".into(), join_ips.clone())]);
        let pol = b
            .ops
            .iter()
            .find_map(|o| match o {
                Op::Policy(p) => Some(p.clone()),
                _ => None,
            })
            .expect("policy");
        assert_eq!(pol.priority, 29000);
        assert_eq!(pol.match_, "ip4.src == $ovn.default.n1_ip4");
        assert_eq!(pol.nexthops, ["100.64.0.2"]);
        let del = subnet_delete_batch(&s, &["n1".into()]);
        assert!(del.ops.contains(&Op::DeleteSwitch("ovn-default".into())));
        assert!(del
            .ops
            .contains(&Op::DeletePortGroup("ovn.default.n1".into())));
        assert_eq!(
            node_policy_match("172.18.0.2".parse().expect("ip")),
            "ip4.dst == 172.18.0.2"
        );
    }

    #[test]
    fn a_services_rows_follow_its_slices_and_session_affinity() {
        use crate::services::fixtures::{slice, web};
        use std::sync::Arc;
        let mut svc = web(&["10.96.0.10"]);
        let s = slice(
            "web-a",
            "web",
            "IPv4",
            serde_json::json!([{"name": "http", "port": 8080}]),
            serde_json::json!([{"addresses": ["10.16.0.5"]}, {"addresses": ["10.16.0.6"]}]),
        );
        let d = crate::services::desired(&svc, &[Arc::new(s.clone())]);
        let rows = service_lb_rows(
            "default/web",
            "ovn-cluster",
            &d,
            super::super::SessionAffinity::SourceHash,
        );
        assert_eq!(rows.backends, 2);
        assert!(rows.vars.is_empty());
        let tcp = rows
            .by_protocol
            .iter()
            .find(|(p, _)| *p == LoadBalancerProtocol::Tcp)
            .map(|(_, w)| w)
            .expect("tcp");
        assert_eq!(tcp.len(), 1);
        let (name, lb) = &tcp[0];
        assert_eq!(name, "svc.default.web.tcp");
        assert_eq!(lb.vips["10.96.0.10:80"], "10.16.0.5:8080,10.16.0.6:8080");
        assert_eq!(
            lb.external_ids.get(ext::VPC).map(String::as_str),
            Some("ovn-cluster")
        );
        assert_eq!(
            lb.external_ids.get(ext::SERVICE).map(String::as_str),
            Some("default/web")
        );
        assert_eq!(lb.options.get("reject").map(String::as_str), Some("true"));
        // Session affinity with a timeout: kept by source hash, or by OVN's affinity_timeout.
        if let Some(spec) = svc.spec.as_mut() {
            spec.session_affinity = Some("ClientIP".into());
            spec.session_affinity_config =
                serde_json::from_value(serde_json::json!({"clientIP": {"timeoutSeconds": 60}}))
                    .ok();
        }
        let d = crate::services::desired(&svc, &[Arc::new(s)]);
        let tcp = |rows: &ServiceLbRows| {
            rows.by_protocol
                .iter()
                .find(|(p, _)| *p == LoadBalancerProtocol::Tcp)
                .and_then(|(_, w)| w.first().cloned())
                .expect("tcp")
                .1
        };
        let hashed = tcp(&service_lb_rows(
            "default/web",
            "ovn-cluster",
            &d,
            super::super::SessionAffinity::SourceHash,
        ));
        assert_eq!(
            hashed.selection_fields,
            Some(vec![
                kubeovn_ovn::northbound::LoadBalancerSelectionFields::IpSrc
            ])
        );
        assert!(!hashed.options.contains_key("affinity_timeout"));
        let timed = tcp(&service_lb_rows(
            "default/web",
            "ovn-cluster",
            &d,
            super::super::SessionAffinity::Timeout,
        ));
        assert_eq!(
            timed.options.get("affinity_timeout").map(String::as_str),
            Some("60")
        );
        assert_eq!(timed.selection_fields, Some(Vec::new()));
    }

    #[test]
    fn a_pods_addresses_come_from_its_annotation_its_pool_or_a_free_pool_entry() {
        use crate::annotations::{PodNetworkAnnotations, DEFAULT_PROVIDER};
        let parse = |kv: &[(&str, &str)]| {
            let m: BTreeMap<String, String> = kv
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            PodNetworkAnnotations::parse(&m, DEFAULT_PROVIDER).expect("annotations")
        };
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        let nobody = |_: IpAddr| None;
        let given = |statics: Vec<IpAddr>, pool: Option<&str>| AddressChoice::Given {
            statics,
            pool: pool.map(str::to_owned),
        };
        let a = parse(&[("ovn.kubernetes.io/ip_address", "10.16.0.9")]);
        assert_eq!(
            pod_addresses(&a, None, &nobody, "ns/p"),
            given(vec![ip("10.16.0.9")], None)
        );
        let a = parse(&[("ovn.kubernetes.io/ip_pool", "pool-a")]);
        assert_eq!(
            pod_addresses(&a, None, &nobody, "ns/p"),
            given(vec![], Some("pool-a"))
        );
        let a = parse(&[("ovn.kubernetes.io/ip_pool", "10.16.0.20,10.16.0.21")]);
        // The first entry held by another pod: the second; both held: it waits; what it holds wins.
        let first_taken = |x: IpAddr| (x == ip("10.16.0.20")).then(|| "ns/other".to_owned());
        assert_eq!(
            pod_addresses(&a, None, &first_taken, "ns/p"),
            given(vec![ip("10.16.0.21")], None)
        );
        let all_taken = |_: IpAddr| Some("ns/other".to_owned());
        assert_eq!(
            pod_addresses(&a, None, &all_taken, "ns/p"),
            AddressChoice::PoolInUse
        );
        let mine = |_: IpAddr| Some("ns/p".to_owned());
        assert_eq!(
            pod_addresses(&a, None, &mine, "ns/p"),
            given(vec![ip("10.16.0.20")], None)
        );
        assert_eq!(
            pod_addresses(&a, Some(&[ip("10.16.0.21")]), &all_taken, "ns/p"),
            given(vec![ip("10.16.0.21")], None)
        );
        assert_eq!(
            pod_addresses(&parse(&[]), None, &nobody, "ns/p"),
            given(vec![], None)
        );
    }
}
