//! Subnets as the controller reads them, pure: a Subnet's spec parsed and checked on its own (blocks,
//! gateways, `excludeIps`, `acls`), its conflicts with what is taken, and the conditions recorded on it.
//! Kinds and the start read it; it reads nothing but its arguments.

use std::net::IpAddr;
use std::sync::Arc;

use ipnetwork::IpNetwork;
use kube::ResourceExt;
use kubeovn_ipam::IpRangeList;

use super::error::{ControllerError, Result};
use super::{plan, Config, SubnetConfig, SubnetInfo};
use crate::annotations::DEFAULT_PROVIDER;
use crate::crd::{
    condition_types, Conditions, Decoded, GatewayType, Subnet, SubnetSpec, SubnetStatus,
};

/// A Subnet object: refused if its spec did not decode, else [`info_from_spec`].
pub(crate) fn info_from_crd(config: &Config, s: &Decoded<Subnet>) -> Result<SubnetInfo> {
    let name = s.name_any();
    if let Some(e) = &s.spec_error {
        return Err(ControllerError::invalid(
            format!("subnet {name}"),
            e.clone(),
        ));
    }
    info_from_spec(&name, &s.object.spec, config)
}

fn parse_cidrs(what: &str, s: &str) -> Result<Vec<IpNetwork>> {
    let mut out: Vec<IpNetwork> = Vec::new();
    for item in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        let n: IpNetwork = item
            .parse()
            .map_err(|e| ControllerError::invalid(what, format!("cidrBlock {item:?}: {e}")))?;
        if n.network() != n.ip() {
            return Err(ControllerError::invalid(
                what,
                format!("cidrBlock {item:?} is not a network address"),
            ));
        }
        if out.iter().any(|o| o.is_ipv4() == n.is_ipv4()) {
            return Err(ControllerError::invalid(
                what,
                "cidrBlock has two blocks of one family",
            ));
        }
        out.push(n);
    }
    if out.is_empty() {
        return Err(ControllerError::invalid(what, "cidrBlock is empty"));
    }
    Ok(out)
}

fn first_host(n: &IpNetwork) -> Option<IpAddr> {
    match n {
        IpNetwork::V4(v) => v.nth(1).map(IpAddr::V4),
        IpNetwork::V6(v) => {
            let base = u128::from(v.network());
            Some(IpAddr::V6((base + 1).into()))
        }
    }
}

fn parse_gateways(what: &str, cidrs: &[IpNetwork], gw: &str) -> Result<Vec<IpAddr>> {
    let given: Vec<IpAddr> = gw
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| {
            x.parse()
                .map_err(|_| ControllerError::invalid(what, format!("gateway {x:?} is not an IP")))
        })
        .collect::<Result<_>>()?;
    cidrs
        .iter()
        .map(
            |c| match given.iter().find(|g| g.is_ipv4() == c.is_ipv4()) {
                Some(g) if c.contains(*g) => Ok(*g),
                Some(g) => Err(ControllerError::invalid(
                    what,
                    format!("gateway {g} is outside {c}"),
                )),
                None => first_host(c)
                    .ok_or_else(|| ControllerError::invalid(what, format!("{c} has no gateway"))),
            },
        )
        .collect()
}

/// A subnet from the controller's configuration (join or default).
pub(crate) fn info_from_config(c: &SubnetConfig, vpc: &str, join: bool) -> Result<SubnetInfo> {
    let what = format!("subnet {}", c.name);
    let cidrs = parse_cidrs(&what, &c.cidr)?;
    let gateways = parse_gateways(&what, &cidrs, &c.gateway)?;
    Ok(SubnetInfo {
        name: c.name.clone(),
        cidrs,
        gateways,
        exclude_ips: c.exclude_ips.clone(),
        vpc: vpc.to_owned(),
        provider: DEFAULT_PROVIDER.to_owned(),
        gateway_type: "distributed".to_owned(),
        default: !join,
        join,
        enable_lb: true,
        ..SubnetInfo::default()
    })
}

/// A Subnet's spec, parsed and checked on its own: CIDR blocks, gateways inside them, `excludeIps` that parse
/// (kubeovn-ipam's syntax) and lie inside them.
pub(crate) fn info_from_spec(name: &str, spec: &SubnetSpec, config: &Config) -> Result<SubnetInfo> {
    let what = format!("subnet {name}");
    let cidrs = parse_cidrs(&what, &spec.cidr_block)?;
    let gateways = parse_gateways(&what, &cidrs, &spec.gateway)?;
    let or = |v: &str, d: &str| {
        if v.is_empty() {
            d.to_owned()
        } else {
            v.to_owned()
        }
    };
    let block = cidrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let vpc = or(&spec.vpc, &config.default_vpc);
    if vpc == name {
        // The patch's switch port `<switch>-<router>` and router port `<router>-<switch>` would share one name,
        // and OVN binds one port per name: the subnet's gateway would never answer.
        return Err(ControllerError::invalid(
            what,
            format!("the subnet has the name of its VPC {vpc:?}; rename the subnet"),
        ));
    }
    let mut exclude_ips = spec.exclude_ips.clone();
    check_inside(&what, "excludeIps", &exclude_ips, &block)?;
    exclude_ips.retain(|e| !gateways.iter().any(|g| g.to_string() == *e));
    let allow_subnets = spec
        .allow_subnets
        .iter()
        .map(|c| {
            c.trim()
                .parse::<IpNetwork>()
                .map(|n| n.to_string())
                .map_err(|_| {
                    ControllerError::invalid(&what, format!("allowSubnets: {c:?} is not a CIDR"))
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let acls = spec
        .acls
        .iter()
        .enumerate()
        .map(|(i, a)| parse_acl(&what, i, a))
        .collect::<Result<Vec<_>>>()?;
    let gateway_selectors = spec
        .gateway_node_selectors
        .iter()
        .map(|s| {
            crate::selector::Selector::from_label_selector(s).map_err(|e| {
                ControllerError::invalid(&what, format!("gatewayNodeSelectors: {}", e.0))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(SubnetInfo {
        cidrs,
        gateways,
        exclude_ips,
        vpc,
        provider: or(&spec.provider, DEFAULT_PROVIDER),
        gateway_type: gateway_type_name(spec.gateway_type.unwrap_or(GatewayType::Distributed))
            .to_owned(),
        namespaces: spec.namespaces.clone(),
        default: spec.default,
        join: name == config.join_subnet.name,
        enable_lb: spec.enable_lb.unwrap_or(true),
        private: spec.private,
        allow_subnets,
        allow_ew_traffic: spec.allow_ew_traffic,
        acls,
        gateway_nodes: spec.gateway_node_names(),
        gateway_selectors,
        enable_ecmp: spec.enable_ecmp,
        name: name.to_owned(),
    })
}

/// A Subnet ACL in OVN's values; refused (naming the entry) where OVN would not take it: a direction,
/// priority, action or match out of its range.
fn parse_acl(what: &str, i: usize, a: &crate::crd::Acl) -> Result<plan::SwitchAcl> {
    let bad = |why: String| ControllerError::invalid(what, format!("acls[{i}]: {why}"));
    let direction = a
        .direction
        .parse()
        .map_err(|e| bad(format!("direction {:?}: {e}", a.direction)))?;
    let action = a
        .action
        .parse()
        .map_err(|e| bad(format!("action {:?}: {e}", a.action)))?;
    if !(0..=32767).contains(&a.priority) {
        return Err(bad(format!("priority {} is outside 0..32767", a.priority)));
    }
    if a.match_.trim().is_empty() {
        return Err(bad("the match is empty".into()));
    }
    Ok(plan::SwitchAcl {
        direction,
        priority: i64::from(a.priority),
        match_: a.match_.clone(),
        action,
    })
}

/// Refuses an entry of `entries` (the list `field` of `what`) that does not parse (kubeovn-ipam's syntax:
/// an address, a CIDR or an `a..b` range) or does not lie inside `block` (`10.16.0.0/16,fd00::/64`).
pub(crate) fn check_inside(what: &str, field: &str, entries: &[String], block: &str) -> Result<()> {
    for e in entries {
        let bad = || {
            ControllerError::invalid(
                what,
                format!("{field} entry {e:?} is not an address or a..b range"),
            )
        };
        let list = IpRangeList::parse(std::slice::from_ref(e)).map_err(|_| bad())?;
        if list.is_empty() {
            return Err(bad());
        }
        if list.clip_to_cidr(block)? != list {
            return Err(ControllerError::invalid(
                what,
                format!("{field} entry {e:?} is outside cidrBlock {block}"),
            ));
        }
    }
    Ok(())
}

/// Kube-OVN's name of a gateway type (`distributed`, `centralized`).
fn gateway_type_name(t: GatewayType) -> &'static str {
    match t {
        GatewayType::Distributed => "distributed",
        GatewayType::Centralized => "centralized",
    }
}

/// The service CIDRs of `--service-cluster-ip-range` (none when empty).
pub(crate) fn service_cidrs(config: &Config) -> Result<Vec<IpNetwork>> {
    if config.service_cidr.trim().is_empty() {
        return Ok(Vec::new());
    }
    parse_cidrs("--service-cluster-ip-range", &config.service_cidr)
}

/// What a new subnet's blocks must stay clear of: Kube-OVN's conflict checks.
pub(crate) struct Occupied<'a> {
    /// The default VPC: its subnets also stay clear of the service CIDRs and the nodes' addresses.
    pub default_vpc: &'a str,
    /// The subnets already accepted (the join subnet among them).
    pub subnets: &'a [Arc<SubnetInfo>],
    /// The service CIDRs.
    pub service_cidrs: &'a [IpNetwork],
    /// Each node's InternalIP addresses.
    pub node_ips: &'a [(String, IpAddr)],
}

fn overlap(a: &IpNetwork, b: &IpNetwork) -> bool {
    a.is_ipv4() == b.is_ipv4() && (a.contains(b.network()) || b.contains(a.network()))
}

/// Refuses `info` when a block overlaps an accepted subnet of its VPC (the join subnet included) or, in the
/// default VPC, the service CIDR or contains a node's InternalIP. The accepted subnet keeps working: the first
/// one accepted wins.
pub(crate) fn check_conflicts(info: &SubnetInfo, o: &Occupied<'_>) -> Result<()> {
    let what = format!("subnet {}", info.name);
    for other in o
        .subnets
        .iter()
        .filter(|s| s.name != info.name && s.vpc == info.vpc)
    {
        for c in &info.cidrs {
            if let Some(oc) = other.cidrs.iter().find(|oc| overlap(c, oc)) {
                let kind = if other.join {
                    "the join subnet"
                } else {
                    "subnet"
                };
                return Err(ControllerError::invalid(
                    &what,
                    format!(
                        "cidr {c} overlaps {kind} {} cidr {oc} in vpc {}",
                        other.name, info.vpc
                    ),
                ));
            }
        }
    }
    if info.vpc != o.default_vpc {
        return Ok(());
    }
    for c in &info.cidrs {
        if let Some(sc) = o.service_cidrs.iter().find(|sc| overlap(c, sc)) {
            return Err(ControllerError::invalid(
                &what,
                format!("cidr {c} overlaps the service cidr {sc}"),
            ));
        }
        if let Some((node, ip)) = o.node_ips.iter().find(|(_, ip)| c.contains(*ip)) {
            return Err(ControllerError::invalid(
                &what,
                format!("cidr {c} contains the address {ip} of node {node}"),
            ));
        }
    }
    Ok(())
}

/// The conditions recorded on a Subnet object (the rest of its status left out).
pub(crate) fn conditions_of(o: &Decoded<Subnet>) -> SubnetStatus {
    SubnetStatus {
        conditions: o
            .object
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default(),
        ..SubnetStatus::default()
    }
}

/// The message of a refused Subnet object (`Validated` = False), if it is refused.
pub(crate) fn refusal(o: &Decoded<Subnet>) -> Option<String> {
    let st = conditions_of(o);
    let c = st.condition(condition_types::VALIDATED)?;
    (c.status == "False").then(|| c.message.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VPC: &str = "ovn-cluster";

    fn accepted(name: &str, cidr: &str, vpc: &str) -> Arc<SubnetInfo> {
        let join = name == "join";
        Arc::new(info_from_config(&SubnetConfig::new(name, cidr), vpc, join).expect("subnet"))
    }

    use serde_json::{json, Value};

    fn spec(name: &str, spec: Value) -> Result<SubnetInfo> {
        let spec: SubnetSpec = serde_json::from_value(spec).expect("a SubnetSpec");
        info_from_spec(name, &spec, &Config::default())
    }

    fn new(name: &str, cidr: &str, vpc: &str) -> SubnetInfo {
        spec(name, json!({ "cidrBlock": cidr, "vpc": vpc })).expect("spec")
    }

    /// `check_conflicts` of a new subnet against the sandbox's view: join, ovn-default, demo (dual stack),
    /// another VPC's subnet, the default service CIDR and one node; the refusal's text.
    fn check(s: &SubnetInfo) -> std::result::Result<(), String> {
        let subnets = [
            accepted("join", "100.64.0.0/16", VPC),
            accepted("ovn-default", "10.16.0.0/16", VPC),
            accepted("demo", "10.66.0.0/24,fd00:66::/64", VPC),
            accepted("other", "10.70.0.0/24", "vpc1"),
        ];
        let services = service_cidrs(&Config::default()).expect("service cidr");
        let nodes = [("n1".to_owned(), "172.18.0.2".parse().expect("ip"))];
        check_conflicts(
            s,
            &Occupied {
                default_vpc: VPC,
                subnets: &subnets,
                service_cidrs: &services,
                node_ips: &nodes,
            },
        )
        .map_err(|e| {
            // Refusals wait for the spec (or another object) to change: never retried as they are.
            assert!(e.is_permanent(), "{e:?}");
            e.to_string()
        })
    }

    fn refused(s: &SubnetInfo, words: &[&str]) {
        let e = check(s).expect_err("refused");
        for w in words {
            assert!(e.contains(w), "{e:?} lacks {w:?}");
        }
    }

    #[test]
    fn overlapping_subnets_of_one_vpc_are_refused() {
        // Same block, a block inside, a block around, IPv6 only, the IPv6 half of a dual-stack subnet.
        refused(
            &new("clash", "10.66.0.0/24", VPC),
            &["subnet clash", "demo", "10.66.0.0/24"],
        );
        refused(
            &new("inner", "10.66.0.128/25", VPC),
            &["demo", "10.66.0.128/25"],
        );
        refused(&new("outer", "10.66.0.0/16", VPC), &["demo"]);
        refused(&new("v6", "fd00:66::/80", VPC), &["demo", "fd00:66::/64"]);
        refused(
            &new("dual", "10.67.0.0/24,fd00:66::/48", VPC),
            &["demo", "fd00:66::/48"],
        );
        // The join subnet is named as such.
        refused(
            &new("j", "100.64.1.0/24", VPC),
            &["the join subnet join", "100.64.0.0/16"],
        );
    }

    #[test]
    fn service_cidr_and_node_addresses_are_refused_in_the_default_vpc() {
        refused(
            &new("svc", "10.100.0.0/16", VPC),
            &["service cidr 10.96.0.0/12"],
        );
        refused(&new("svc2", "10.96.0.0/11", VPC), &["10.96.0.0/12"]);
        refused(
            &new("node", "172.18.0.0/24", VPC),
            &["172.18.0.2", "node n1"],
        );
        // In another VPC those addresses are free (as in Kube-OVN), overlaps within it are not.
        assert_eq!(check(&new("svc", "10.100.0.0/16", "vpc1")), Ok(()));
        let same = spec(
            "vpc1",
            json!({ "cidrBlock": "10.101.0.0/24", "vpc": "vpc1" }),
        );
        assert!(
            same.is_err_and(|e| e.to_string().contains("name of its VPC")),
            "a subnet named like its VPC"
        );
        assert_eq!(check(&new("node", "172.18.0.0/24", "vpc1")), Ok(()));
        assert_eq!(check(&new("demo2", "10.66.0.0/24", "vpc1")), Ok(()));
        assert!(check(&new("o2", "10.70.0.0/25", "vpc1")).is_err());
        // No service CIDR configured: no service check.
        let c = Config {
            service_cidr: String::new(),
            ..Config::default()
        };
        assert_eq!(service_cidrs(&c).expect("empty"), Vec::new());
        assert!(service_cidrs(&Config {
            service_cidr: "10.96.0.1/12".into(),
            ..Config::default()
        })
        .is_err());
    }

    #[test]
    fn disjoint_subnets_and_updates_of_themselves_are_accepted() {
        assert_eq!(check(&new("s1", "10.67.0.0/24", VPC)), Ok(()));
        assert_eq!(check(&new("s2", "10.66.1.0/24,fd00:67::/64", VPC)), Ok(()));
        assert_eq!(check(&new("s3", "fd00:66:1::/64", VPC)), Ok(()));
        // Adjacent blocks do not overlap.
        assert_eq!(check(&new("s4", "10.65.255.0/24", VPC)), Ok(()));
        // A subnet never conflicts with its own accepted version (an update of demo).
        assert_eq!(check(&new("demo", "10.66.0.0/23", VPC)), Ok(()));
    }

    /// The refusal of a spec on its own (always a permanent, invalid-input error).
    fn spec_error(v: Value) -> String {
        let e = spec("x", v).expect_err("refused");
        assert!(matches!(e, ControllerError::Invalid { .. }), "{e}");
        e.to_string()
    }

    #[test]
    fn bad_acls_and_allow_subnets_are_refused() {
        let e = spec_error(
            json!({ "cidrBlock": "10.66.0.0/24", "allowSubnets": ["10.1.0.0/16", "nope"] }),
        );
        assert!(e.contains("allowSubnets: \"nope\" is not a CIDR"), "{e}");
        let acl = |a: Value| spec_error(json!({ "cidrBlock": "10.66.0.0/24", "acls": [a] }));
        let ok =
            json!({"direction": "to-lport", "priority": 1000, "match": "ip", "action": "drop"});
        let with = |k: &str, v: Value| {
            let mut a = ok.clone();
            a[k] = v;
            a
        };
        assert!(acl(with("direction", json!("sideways"))).contains("acls[0]: direction"));
        assert!(acl(with("priority", json!(40000))).contains("priority 40000 is outside"));
        assert!(acl(with("action", json!("maybe"))).contains("action \"maybe\""));
        assert!(acl(with("match", json!(" "))).contains("the match is empty"));
        let good =
            spec("ok", json!({ "cidrBlock": "10.66.0.0/24", "acls": [ok] })).expect("accepted");
        assert_eq!(good.acls.len(), 1);
    }

    #[test]
    fn gateway_and_exclude_ips_outside_the_block_are_refused() {
        let e = spec_error(json!({ "cidrBlock": "10.66.0.0/24", "gateway": "10.67.0.1" }));
        assert!(
            e.contains("gateway 10.67.0.1 is outside 10.66.0.0/24"),
            "{e}"
        );
        for bad in ["10.67.0.5", "10.66.0.250..10.66.1.3", "fd00::1"] {
            let e = spec_error(json!({ "cidrBlock": "10.66.0.0/24", "excludeIps": [bad] }));
            let want = format!("excludeIps entry {bad:?} is outside cidrBlock 10.66.0.0/24");
            assert!(e.contains(&want), "{e}");
        }
        for bad in ["x", "10.66.0.9..y", ""] {
            let e = spec_error(json!({ "cidrBlock": "10.66.0.0/24", "excludeIps": [bad] }));
            assert!(e.contains("is not an address or a..b range"), "{e}");
        }
        // Inside: accepted, the gateway dropped from the list as before.
        let ok = spec(
            "ok",
            json!({ "cidrBlock": "10.66.0.0/24,fd00:66::/64", "gateway": "10.66.0.254",
                    "excludeIps": ["10.66.0.254", "10.66.0.2..10.66.0.9", "fd00:66::5"] }),
        )
        .expect("inside");
        assert_eq!(ok.exclude_ips, ["10.66.0.2..10.66.0.9", "fd00:66::5"]);
        assert_eq!(ok.gateway(), "10.66.0.254,fd00:66::1");
        assert_eq!(ok.vpc, VPC);
    }
}
