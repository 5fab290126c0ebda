//! Subnets and IPPools: the allocator's subnets, the logical switch with its patch to the VPC router and
//! policies, Subnet status; IPPools as allocator pools.
//!
//! A Subnet is validated before anything is written: its spec on its own (blocks, gateway and `excludeIps`
//! inside them), then against what is taken ([`check_conflicts`]: the accepted subnets of its VPC, and in the
//! default VPC the service CIDR and the nodes' InternalIPs). The subnet accepted first keeps its addresses; a
//! refused one gets `Validated` = False (`ValidateLogicalSwitchFailed`) and a Warning event, and no northbound
//! row or allocator subnet. It is handled again when its spec changes, a subnet is deleted or moves, or a
//! node is deleted.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnetwork::IpNetwork;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use kubeovn_ipam::IpRangeList;
use serde::Serialize;

use super::error::{ControllerError, Result};
use super::framework::{Action, Key, Reconciler, Relations};
use super::{gateway, node, plan, Config, Ctx, SubnetConfig, SubnetInfo};
use crate::annotations::DEFAULT_PROVIDER;
use crate::crd::{
    condition_types, reasons, Conditions, Decoded, GatewayType, IpCount, Protocol, StatusPatch,
    Subnet, SubnetSpec, SubnetStatus, SubnetUsage, Vpc,
};
use crate::naming;
use k8s_openapi::api::core::v1::{Namespace, Node};
use std::collections::HashSet;

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

/// A Subnet object: refused if its spec did not decode, else [`info_from_spec`].
pub(crate) fn info_from_crd(ctx: &Ctx, s: &Decoded<Subnet>) -> Result<SubnetInfo> {
    let name = s.name_any();
    if let Some(e) = &s.spec_error {
        return Err(ControllerError::invalid(
            format!("subnet {name}"),
            e.clone(),
        ));
    }
    info_from_spec(&name, &s.object.spec, &ctx.config)
}

/// A Subnet's spec, parsed and checked on its own: CIDR blocks, gateways inside them, `excludeIps` that parse
/// (kubeovn-ipam's syntax) and lie inside them.
fn info_from_spec(name: &str, spec: &SubnetSpec, config: &Config) -> Result<SubnetInfo> {
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

/// Every node's InternalIP addresses.
fn node_ips(ctx: &Ctx) -> Vec<(String, IpAddr)> {
    let mut out = Vec::new();
    for n in ctx.nodes() {
        let name = n.name_any();
        out.extend(
            node::internal_ips(&n)
                .into_iter()
                .map(|ip| (name.clone(), ip)),
        );
    }
    out
}

/// Loads a subnet into the allocator and the controller's table.
pub(crate) fn install(ctx: &Ctx, info: SubnetInfo) -> Result<()> {
    install_checked(ctx, info, false)
}

/// Loads a subnet unless it conflicts with one already loaded ([`check_conflicts`]): a refused subnet never
/// reaches the allocator. The check and the load happen under the table's lock, so of two overlapping
/// subnets handled at once only one gets in.
pub(crate) fn admit(ctx: &Ctx, info: SubnetInfo) -> Result<()> {
    install_checked(ctx, info, true)
}

fn install_checked(ctx: &Ctx, info: SubnetInfo, check: bool) -> Result<()> {
    let mut subnets = ctx.subnets.write().unwrap_or_else(|e| e.into_inner());
    if check {
        let accepted: Vec<Arc<SubnetInfo>> = subnets.values().cloned().collect();
        check_conflicts(
            &info,
            &Occupied {
                default_vpc: &ctx.config.default_vpc,
                subnets: &accepted,
                service_cidrs: &service_cidrs(&ctx.config)?,
                node_ips: &node_ips(ctx),
            },
        )?;
    }
    let dropped = ctx.ipam.add_or_update_subnet(&info.ipam_spec())?;
    for d in dropped {
        tracing::warn!(subnet = %info.name, pod = %d.pod, "allocation outside the updated subnet dropped");
    }
    if !subnets.contains_key(&info.name) {
        // Its pools: those handled while it was missing were not loaded (or went with its delete).
        super::ippool::install_pools_of(ctx, &info);
    }
    let name = info.name.clone();
    // Its reservations first: pods find the subnet only once it is in the table.
    ctx.reservations().subnet_loaded(&ctx.ipam, &name);
    subnets.insert(name.clone(), Arc::new(info));
    drop(subnets);
    // A new, fixed or wider subnet may serve pods that were waiting for it.
    super::pod::wake(ctx, &name);
    Ok(())
}

/// Subnet objects in the order their claims on addresses count at a rebuild: the built-in subnets, then those
/// with a logical switch already, then those validated before, then the oldest.
pub(crate) fn by_precedence(
    ctx: &Ctx,
    mut objs: Vec<Arc<Decoded<Subnet>>>,
) -> Vec<Arc<Decoded<Subnet>>> {
    let c = &ctx.config;
    objs.sort_by_cached_key(|o| {
        let name = o.name_any();
        (
            name != c.join_subnet.name && name != c.default_subnet.name,
            ctx.nb.switch(&name).is_none(),
            !conditions_of(o).is_validated(),
            o.creation_timestamp().map(|t| t.0),
            name,
        )
    });
    objs
}

/// Creates the Subnet object of a built-in subnet if it is missing.
pub(crate) async fn ensure_subnet_object(
    client: &kube::Client,
    info: &SubnetInfo,
    default: bool,
) -> Result<()> {
    let api: Api<Subnet> = Api::all(client.clone());
    let protocol = match (
        info.cidrs.iter().any(IpNetwork::is_ipv4),
        info.cidrs.iter().any(IpNetwork::is_ipv6),
    ) {
        (true, true) => Protocol::Dual,
        (false, true) => Protocol::IPv6,
        _ => Protocol::IPv4,
    };
    let mut exclude: Vec<String> = info.gateways.iter().map(ToString::to_string).collect();
    exclude.extend(info.exclude_ips.iter().cloned());
    let o = Subnet::new(
        &info.name,
        SubnetSpec {
            cidr_block: info.cidr_block(),
            gateway: info.gateway(),
            exclude_ips: exclude,
            protocol: Some(protocol),
            provider: DEFAULT_PROVIDER.to_owned(),
            vpc: info.vpc.clone(),
            default,
            gateway_type: Some(GatewayType::Distributed),
            nat_outgoing: default,
            private: false,
            ..SubnetSpec::default()
        },
    );
    match api.create(&PostParams::default(), &o).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(ControllerError::kube(
            format!("create subnet {}", info.name),
            e,
        )),
    }
}

/// The join addresses of every node that has one.
pub(crate) fn node_join_ips(ctx: &Ctx) -> Vec<(String, Vec<IpAddr>)> {
    let join = ctx.config.join_subnet.name.clone();
    let mut out: Vec<(String, Vec<IpAddr>)> = ctx
        .nodes()
        .iter()
        .filter_map(|n| {
            let name = n.name_any();
            let port = naming::node_port(&name);
            let a = ctx.ipam.get(&join, &port, &port).ok().flatten()?;
            Some((name, a.ips().collect()))
        })
        .collect();
    out.sort();
    out
}

/// Writes a subnet's northbound state; returns the active gateway nodes of a centralized subnet.
pub(crate) async fn reconcile_info(ctx: &Ctx, info: &SubnetInfo) -> Result<Vec<String>> {
    let lrp = naming::router_port(&info.vpc, &info.name);
    let mac = ctx
        .nb
        .router_port(&lrp)
        .map(|p| p.mac)
        .unwrap_or_else(|| plan::router_port_mac(&lrp));
    let mut b = plan::subnet_batch(info, &mac);
    let mut active = Vec::new();
    if info.distributed(&ctx.config.default_vpc) {
        b.ops
            .extend(plan::gateway_batch(info, &node_join_ips(ctx)).ops);
    } else if gateway::centralized(info, &ctx.config.default_vpc) {
        active = gateway::active(info, &ctx.nodes(), &node_join_ips(ctx), &ctx.gateways);
        for p in gateway::policies(info, &active) {
            b.add(p);
        }
    }
    // The subnet's policies of a block (or node) it no longer has: a changed cidrBlock left the old
    // block's allow policy behind.
    let wanted: HashSet<&str> = b
        .ops
        .iter()
        .filter_map(|op| match op {
            kubeovn_ovn::northbound::Op::Policy(p) => Some(p.match_.as_str()),
            _ => None,
        })
        .collect();
    let ours = [
        i64::from(naming::priority::SUBNET_ROUTER),
        i64::from(naming::priority::GATEWAY_ROUTER),
    ];
    let stale: Vec<_> = ctx
        .nb
        .policies(&info.vpc)
        .into_iter()
        .filter(|p| ours.contains(&p.priority) && !wanted.contains(p.match_.as_str()))
        .filter(|p| {
            p.external_ids
                .get(naming::external_ids::SUBNET)
                .is_some_and(|s| *s == info.name)
        })
        .map(|p| kubeovn_ovn::northbound::Op::DeletePolicy {
            router: info.vpc.clone(),
            priority: p.priority,
            match_: p.match_,
        })
        .collect();
    b.ops.extend(stale);
    b.add(acl_set(ctx, info));
    ctx.writer.commit(b).await?;
    Ok(active.into_iter().map(|(n, _)| n).collect())
}

/// The switch's own ACLs (owner `Subnet/<name>`): `private` with `allowSubnets`, `allowEWTraffic`, and the
/// Subnet's `acls` as given (checked when parsed).
fn acl_set(ctx: &Ctx, info: &SubnetInfo) -> kubeovn_ovn::northbound::AclSet {
    use kubeovn_ovn::northbound::{Acl, AclParent, AclSet};
    let owner = format!("Subnet/{}", info.name);
    let cidrs: Vec<String> = info.cidrs.iter().map(ToString::to_string).collect();
    // The CIDRs were checked when parsed; a problem here would be a fault of ours, not the user's.
    let mut problems = Vec::new();
    let mut acls: Vec<Acl> = crate::netpol::subnet_acls(
        &cidrs,
        info.private,
        &info.allow_subnets,
        info.allow_ew_traffic,
        &ctx.netpol.node_cidrs,
        &mut problems,
    )
    .iter()
    .map(|a| super::netpol::ovn_acl(a, &info.name, &owner, None))
    .collect();
    for p in problems {
        tracing::warn!(subnet = %info.name, problem = %p, "subnet ACL left out");
    }
    for a in &info.acls {
        acls.push(
            Acl::new(
                AclParent::Switch(info.name.clone()),
                a.direction.clone(),
                a.priority,
                a.match_.as_str(),
                a.action.clone(),
            )
            .external_id("vendor", "kube-ovn"),
        );
    }
    AclSet::new(
        AclParent::Switch(info.name.clone()),
        crate::netpol::OWNER_KEY,
        owner,
        acls,
    )
}

/// The conditions recorded on a Subnet object (the rest of its status left out).
fn conditions_of(o: &Decoded<Subnet>) -> SubnetStatus {
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
fn refusal(o: &Decoded<Subnet>) -> Option<String> {
    let st = conditions_of(o);
    let c = st.condition(condition_types::VALIDATED)?;
    (c.status == "False").then(|| c.message.clone())
}

/// Merge-patches the fields of `status` (a [`StatusPatch`] body) into the Subnet's status.
async fn patch_status<T: Serialize + std::fmt::Debug>(
    ctx: &Ctx,
    name: &str,
    status: &StatusPatch<T>,
) -> Result<()> {
    // The reply is read as a Decoded: a Subnet whose spec does not decode gets its refusal written too.
    let api: Api<Decoded<Subnet>> = Api::all(ctx.client.clone());
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(ControllerError::kube(
            format!("patch subnet {name} status"),
            e,
        )),
    }
}

/// Writes the conditions of `st` when `changed`.
async fn patch_conditions(ctx: &Ctx, name: &str, st: &SubnetStatus, changed: bool) -> Result<()> {
    if !changed {
        return Ok(());
    }
    patch_status(ctx, name, &StatusPatch::conditions(&st.conditions)).await
}

/// Reports a refused spec: `Validated`, `Ready` False and `Error` with the reason, a Warning event when the
/// refusal is new or its reason changed. The subnet's northbound state and allocations are left alone.
async fn refuse(ctx: &Ctx, obj: &Decoded<Subnet>, e: ControllerError) -> Result<()> {
    let msg = e.to_string();
    let now = Time(Timestamp::now());
    let mut st = conditions_of(obj);
    let why = reasons::VALIDATE_FAILED;
    let mut changed = st.not_validated(why, &msg, &now);
    changed |= st.not_ready(why, &msg, &now);
    changed |= st.set_error(why, &msg, &now);
    if changed {
        ctx.event_on(&obj.object_ref(&()), EventType::Warning, why, msg.clone())
            .await;
    }
    patch_conditions(ctx, &obj.name_any(), &st, changed).await?;
    Err(e)
}

/// Queues the Subnet objects that are refused or not loaded yet: a subnet's change or delete, or a node's
/// delete, may have freed their addresses.
pub(crate) fn requeue_refused(ctx: &Ctx) {
    for o in ctx.kinds.list::<Decoded<Subnet>>() {
        let n = o.name_any();
        if ctx.subnet(&n).is_none() || refusal(&o).is_some() {
            ctx.enqueue(Key::<Decoded<Subnet>>::cluster(&n));
        }
    }
}

/// The subnet kind: each Subnet's validation, address range, logical switch, routes and conditions.
pub(crate) struct Subnets;

#[async_trait::async_trait]
impl Reconciler<Ctx> for Subnets {
    type Object = Decoded<Subnet>;
    type Error = ControllerError;
    const NAME: &'static str = "subnet";

    async fn reconcile(ctx: &Arc<Ctx>, obj: Arc<Decoded<Subnet>>) -> Result<Action> {
        reconcile(ctx, &obj).await.map(|()| Action::Done)
    }

    async fn cleanup(
        ctx: &Arc<Ctx>,
        key: &Key<Decoded<Subnet>>,
        _: Option<Arc<Decoded<Subnet>>>,
    ) -> Result<Action> {
        delete(ctx, key.name()).await.map(|()| Action::Done)
    }

    fn relations(r: &mut Relations<'_, Ctx, Decoded<Subnet>>) {
        // A node's addresses may be what a refused subnet overlapped.
        r.on::<Node>(|kinds, old, new| {
            let subnets = kinds.list::<Decoded<Subnet>>();
            let mut out: Vec<Key<Decoded<Subnet>>> = Vec::new();
            if old.map(node::internal_ips) != new.map(node::internal_ips) {
                out.extend(
                    subnets
                        .iter()
                        .filter(|o| refusal(o).is_some())
                        .map(|o| Key::cluster(&o.name_any())),
                );
            }
            // A node that comes, goes or changes readiness may be a centralized subnet's gateway.
            let ready = |n: Option<&Node>| n.map(gateway::node_ready);
            let join = |n: Option<&Node>| {
                n.and_then(|n| n.annotations().get(crate::annotations::IP_ADDRESS).cloned())
            };
            if ready(old) != ready(new) || join(old) != join(new) {
                out.extend(
                    subnets
                        .iter()
                        .filter(|o| o.object.spec.gateway_type == Some(GatewayType::Centralized))
                        .map(|o| Key::cluster(&o.name_any())),
                );
            }
            out
        });
    }
}

async fn reconcile(ctx: &Ctx, obj: &Decoded<Subnet>) -> Result<()> {
    let name = obj.name_any();
    let name = name.as_str();
    let info = match info_from_crd(ctx, obj) {
        Ok(i) => i,
        Err(e) => return refuse(ctx, obj, e).await,
    };
    let before = ctx.subnet(name);
    if let Err(e) = admit(ctx, info.clone()) {
        return refuse(ctx, obj, e).await;
    }
    if before
        .as_ref()
        .is_some_and(|b| b.cidrs != info.cidrs || b.vpc != info.vpc)
    {
        requeue_refused(ctx);
    }
    if let Some(old) = before.as_ref().filter(|b| b.vpc != info.vpc) {
        // Moved to another VPC: its patch, policies and gateway port groups on the old router go (the
        // switch stays).
        let nodes: Vec<String> = ctx.nodes().iter().map(|n| n.name_any()).collect();
        let mut b = plan::subnet_delete_batch(old, &nodes);
        b.ops
            .retain(|op| !matches!(op, kubeovn_ovn::northbound::Op::DeleteSwitch(_)));
        // The old VPC's Services no longer apply to the switch.
        b.lb_group_detach(
            &crate::naming::lb_group(&old.vpc),
            kubeovn_ovn::northbound::LbTarget::Switch(name.to_owned()),
        );
        ctx.writer.commit(b).await?;
        ctx.enqueue(Key::<Vpc>::cluster(&old.vpc));
    }
    if ctx.nb.router(&info.vpc).is_none() {
        // The Vpc's handler creates its router; retried until then.
        return Err(ControllerError::NotReady(format!("vpc {}", info.vpc)));
    }
    let active = reconcile_info(ctx, &info).await?;
    ctx.enqueue(Key::<Vpc>::cluster(&info.vpc));
    if gateway::centralized(&info, &ctx.config.default_vpc) {
        let now = active.join(",");
        let was = obj
            .object
            .status
            .as_ref()
            .map(|s| s.activate_gateway.as_str())
            .unwrap_or_default();
        if now != was {
            if now.is_empty() {
                ctx.event(
                    obj,
                    EventType::Warning,
                    "NoGatewayNode",
                    format!(
                        "no gateway node of {name} is Ready and answering: its pods have no egress"
                    ),
                )
                .await;
            } else {
                tracing::info!(subnet = name, gateway = %now, "active gateway");
            }
            patch_status(
                ctx,
                name,
                &StatusPatch {
                    status: serde_json::json!({"activateGateway": now}),
                },
            )
            .await?;
        }
    }
    let now = Time(Timestamp::now());
    let mut st = conditions_of(obj);
    let mut changed = st.validated(reasons::VALIDATE_SUCCESS, "", &now);
    changed |= st.ready(reasons::SET_PRIVATE_SWITCH_SUCCESS, "", &now);
    if st.condition(condition_types::ERROR).is_some() {
        changed |= st.clear_error(&now);
    }
    patch_conditions(ctx, name, &st, changed).await?;
    rebind_namespaces(ctx, before.as_deref(), Some(&info));
    Ok(())
}

/// Queues the namespaces whose binding a subnet's change from `old` to `new` may change: those either names,
/// and every namespace when it is the default subnet (the binding of namespaces no subnet names).
fn rebind_namespaces(ctx: &Ctx, old: Option<&SubnetInfo>, new: Option<&SubnetInfo>) {
    let default = &ctx.config.default_subnet.name;
    if [old, new].iter().flatten().any(|s| &s.name == default) {
        for ns in ctx.namespaces() {
            ctx.enqueue(Key::<Namespace>::cluster(&ns.name_any()));
        }
        return;
    }
    let names: HashSet<&String> = [old, new]
        .into_iter()
        .flatten()
        .flat_map(|s| s.namespaces.iter())
        .collect();
    for n in names {
        ctx.enqueue(Key::<Namespace>::cluster(n));
    }
}

/// The subnet a namespace is bound to: an accepted subnet naming it, else a Subnet object naming it that is
/// refused or not loaded yet (its pods wait rather than take an address elsewhere).
pub(crate) fn namespace_subnet(ctx: &Ctx, ns: &str) -> Option<String> {
    let binds = |s: &[String]| s.iter().any(|n| n == ns);
    // Called for every pod: the loaded subnets first, without copying or sorting them (first by name).
    let objs = ctx.kinds.list::<Decoded<Subnet>>();
    let subnets = ctx.subnets.read().unwrap_or_else(|e| e.into_inner());
    let loaded = subnets
        .values()
        .filter(|s| binds(&s.namespaces))
        .map(|s| s.name.as_str())
        .min();
    if let Some(name) = loaded {
        return Some(name.to_owned());
    }
    // Then the objects not loaded (refused, or not handled yet): only their specs need reading.
    objs.iter()
        .filter_map(|o| o.meta().name.as_deref().map(|n| (n, o)))
        .filter(|(n, _)| !subnets.contains_key(*n))
        .filter(|(_, o)| binds(&o.object.spec.namespaces))
        .map(|(n, _)| n)
        .min()
        .map(str::to_owned)
}

/// Why the subnet `name` cannot give addresses (it is not loaded): the event reason and the error.
pub(crate) fn unusable(ctx: &Ctx, name: &str) -> (&'static str, ControllerError) {
    let obj = ctx.kinds.get(&Key::<Decoded<Subnet>>::cluster(name));
    match obj.as_deref().and_then(refusal) {
        Some(msg) => (
            "SubnetNotValidated",
            ControllerError::NotReady(format!("subnet {name} (refused: {msg})")),
        ),
        None => (
            "SubnetNotFound",
            ControllerError::NotReady(format!("subnet {name}")),
        ),
    }
}

async fn delete(ctx: &Ctx, name: &str) -> Result<()> {
    let Some(info) = ctx.subnet(name) else {
        return Ok(());
    };
    if name == ctx.config.join_subnet.name || name == ctx.config.default_subnet.name {
        // Built-in subnets stay (Kube-OVN recreates them).
        return Ok(());
    }
    let nodes: Vec<String> = ctx.nodes().iter().map(|n| n.name_any()).collect();
    ctx.writer
        .commit(plan::subnet_delete_batch(&info, &nodes))
        .await?;
    match ctx.ipam.delete_subnet(name) {
        Ok(()) | Err(kubeovn_ipam::IpamError::NoSuchSubnet { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    ctx.subnets
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .remove(name);
    requeue_refused(ctx);
    ctx.enqueue(Key::<Vpc>::cluster(&info.vpc));
    rebind_namespaces(ctx, Some(&info), None);
    Ok(())
}

fn status_of(stats: &kubeovn_ipam::SubnetStats) -> SubnetUsage {
    SubnetUsage {
        v4_available_ips: IpCount(stats.v4.available),
        v4_using_ips: IpCount(stats.v4.using),
        v4_available_ip_range: stats.v4.available_range.clone(),
        v4_using_ip_range: stats.v4.using_range.clone(),
        v6_available_ips: IpCount(stats.v6.available),
        v6_using_ips: IpCount(stats.v6.using),
        v6_available_ip_range: stats.v6.available_range.clone(),
        v6_using_ip_range: stats.v6.using_range.clone(),
    }
}

/// Publishes each subnet's counters and ranges when they change (once per interval at most, instead of
/// once per pod as Kube-OVN does).
pub(crate) async fn status_loop(ctx: Arc<Ctx>) {
    let mut last: HashMap<String, SubnetUsage> = HashMap::new();
    loop {
        tokio::time::sleep(ctx.config.status_interval).await;
        for s in ctx.subnet_list() {
            let Ok(stats) = ctx.ipam.stats(&s.name) else {
                continue;
            };
            ctx.metrics
                .ipam_usage(&s.name, "ipv4", stats.v4.using, stats.v4.available);
            ctx.metrics
                .ipam_usage(&s.name, "ipv6", stats.v6.using, stats.v6.available);
            let v = status_of(&stats);
            if last.get(&s.name) == Some(&v) {
                continue;
            }
            let patch = StatusPatch { status: v };
            match patch_status(&ctx, &s.name, &patch).await {
                Ok(()) => {
                    last.insert(s.name.clone(), patch.status);
                }
                Err(e) => tracing::debug!(subnet = %s.name, error = %e, "subnet status"),
            }
        }
    }
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

/// Behaviour of the subnet reconciler on the test API server and an in-memory northbound.
#[cfg(test)]
mod behaviour {
    use super::*;
    use crate::controller::framework::{Failure, ReconcileError};
    use crate::controller::node::Nodes;
    use crate::controller::testing::{config, Harness};
    use crate::controller::vpc::Vpcs;
    use crate::crd::VpcSpec;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};
    use kube::api::DeleteParams;
    use kubeovn_ipam::AllocRequest;
    use kubeovn_ovn::memdb::MemDb;
    use kubeovn_ovn::models::nb::LogicalRouterPolicyAction;
    use kubeovn_ovn::northbound::Northbound;
    use serde_json::json;

    const VPC: &str = "ovn-cluster";

    fn node(name: &str, ip: &str) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.to_owned());
        n.status = Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: ip.into(),
            }]),
            ..NodeStatus::default()
        });
        n
    }

    fn ns(name: &str) -> Namespace {
        let mut n = Namespace::default();
        n.metadata.name = Some(name.to_owned());
        n
    }

    /// Creates the Subnet `name` with `spec` (JSON, so that a spec the types refuse gets in too) and waits
    /// until the controller's store holds it.
    async fn subnet(h: &Harness, name: &str, spec: serde_json::Value) {
        h.create_raw::<Subnet>(json!({ "metadata": { "name": name }, "spec": spec }))
            .await;
    }

    async fn run(h: &Harness, name: &str) -> Result<Action> {
        h.run::<Subnets>(Key::cluster(name)).await
    }

    async fn delete_subnet(h: &Harness, name: &str) {
        let api: Api<Subnet> = Api::all(h.client.clone());
        api.delete(name, &DeleteParams::default())
            .await
            .expect("delete");
        h.gone(&Key::<Decoded<Subnet>>::cluster(name)).await;
    }

    /// A condition of the Subnet `name` as the API server holds it: (status, reason).
    async fn condition(h: &Harness, name: &str, type_: &str) -> Option<(String, String)> {
        let s: Decoded<Subnet> = h.get(name).await?;
        let st = s.object.status?;
        st.conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| (c.status.clone(), c.reason.clone()))
    }

    fn is(status: &str, reason: &str) -> Option<(String, String)> {
        Some((status.to_owned(), reason.to_owned()))
    }

    /// The policies of `router` at `priority`: (match, action, nexthops).
    fn policies(
        h: &Harness,
        router: &str,
        priority: u16,
    ) -> Vec<(String, LogicalRouterPolicyAction, Vec<String>)> {
        let mut v: Vec<_> =
            h.nb.policies(router)
                .into_iter()
                .filter(|p| p.priority == i64::from(priority))
                .map(|p| (p.match_, p.action, p.nexthops))
                .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    async fn with_node(h: &Harness, name: &str, ip: &str) -> IpAddr {
        h.create_cluster(&node(name, ip)).await;
        h.run::<Nodes>(Key::cluster(name)).await.expect("node");
        let port = naming::node_port(name);
        let a = h
            .ctx
            .ipam
            .get("join", &port, &port)
            .expect("join")
            .expect("join address");
        a.ips().next().expect("ip")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_subnet_gets_its_switch_patch_and_gateway_policies_and_loses_them_with_it() {
        let h = Harness::start().await;
        let join_ip = with_node(&h, "n1", "172.18.0.2").await;
        subnet(
            &h,
            "s1",
            json!({ "cidrBlock": "10.70.0.0/24", "excludeIps": ["10.70.0.5", "10.70.0.10..10.70.0.12"] }),
        )
        .await;
        assert_eq!(run(&h, "s1").await.expect("run"), Action::Done);

        let ls = h.nb.switch("s1").expect("switch");
        assert_eq!(
            ls.other_config.get("subnet").map(String::as_str),
            Some("10.70.0.0/24")
        );
        let excl = ls.other_config.get("exclude_ips").expect("exclude_ips");
        for e in ["10.70.0.1", "10.70.0.5", "10.70.0.10..10.70.0.12"] {
            assert!(
                excl.split_whitespace().any(|x| x == e),
                "{excl:?} lacks {e}"
            );
        }
        assert_eq!(
            ls.external_ids
                .get("logical_router")
                .or(ls.external_ids.get("lr"))
                .map(String::as_str),
            Some(VPC)
        );
        let lrp = h.nb.router_port("ovn-cluster-s1").expect("router port");
        assert_eq!(lrp.networks, ["10.70.0.1/24"]);
        let lsp = h.nb.switch_port("s1-ovn-cluster").expect("switch port");
        assert_eq!(lsp.type_, "router");
        assert_eq!(
            lsp.options.get("router-port").map(String::as_str),
            Some("ovn-cluster-s1")
        );
        assert!(h
            .nb
            .switch_port_names("s1")
            .contains(&"s1-ovn-cluster".to_owned()));
        assert_eq!(
            policies(&h, VPC, naming::priority::SUBNET_ROUTER)
                .into_iter()
                .filter(|p| p.0.contains("10.70.0.0/24"))
                .collect::<Vec<_>>(),
            [(
                "ip4.dst == 10.70.0.0/24".to_owned(),
                LogicalRouterPolicyAction::Allow,
                vec![]
            )]
        );
        // The default VPC's subnets are distributed: a port group and a reroute to the join address per node.
        assert!(h.nb.port_group("s1.n1").is_some());
        assert!(
            policies(&h, VPC, naming::priority::GATEWAY_ROUTER).contains(&(
                "ip4.src == $s1.n1_ip4".to_owned(),
                LogicalRouterPolicyAction::Reroute,
                vec![join_ip.to_string()]
            ))
        );
        assert_eq!(
            condition(&h, "s1", condition_types::VALIDATED).await,
            is("True", reasons::VALIDATE_SUCCESS)
        );
        assert_eq!(
            condition(&h, "s1", condition_types::READY).await,
            is("True", reasons::SET_PRIVATE_SWITCH_SUCCESS)
        );
        // The allocator has it, with the gateway and excluded addresses held back.
        let given: Vec<String> = (0..12)
            .map(|i| {
                let p = format!("p{i}.ns");
                let a = h
                    .ctx
                    .ipam
                    .allocate("s1", &AllocRequest::new(&p, &p))
                    .expect("allocate");
                a.ips().next().expect("ip").to_string()
            })
            .collect();
        for x in [
            "10.70.0.1",
            "10.70.0.5",
            "10.70.0.10",
            "10.70.0.11",
            "10.70.0.12",
        ] {
            assert!(!given.iter().any(|g| g == x), "{x} given: {given:?}");
        }

        delete_subnet(&h, "s1").await;
        assert_eq!(run(&h, "s1").await.expect("cleanup"), Action::Done);
        assert!(h.nb.switch("s1").is_none());
        assert!(h.nb.switch_port("s1-ovn-cluster").is_none());
        assert!(h.nb.router_port("ovn-cluster-s1").is_none());
        assert!(h.nb.port_group("s1.n1").is_none());
        assert!(h
            .nb
            .policies(VPC)
            .iter()
            .all(|p| !p.match_.contains("10.70.0.0/24") && !p.match_.contains("s1.n1")));
        assert!(h.ctx.subnet("s1").is_none());
        assert!(
            h.ctx.ipam.stats("s1").is_err(),
            "the allocator's subnet is freed"
        );
        // The built-in subnets are untouched.
        assert!(h.nb.switch("ovn-default").is_some() && h.nb.switch("join").is_some());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wider_block_updates_the_switch_router_port_and_policies() {
        let h = Harness::start().await;
        let join_ip = with_node(&h, "n1", "172.18.0.2").await;
        subnet(&h, "s1", json!({ "cidrBlock": "10.70.0.0/24" })).await;
        run(&h, "s1").await.expect("run");
        let api: Api<Subnet> = Api::all(h.client.clone());
        let s = api
            .patch(
                "s1",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"cidrBlock": "10.70.0.0/23,fd00:70::/64"}})),
            )
            .await
            .expect("patch");
        h.stored(&Decoded::new(s)).await;
        run(&h, "s1").await.expect("run");
        let ls = h.nb.switch("s1").expect("switch");
        assert_eq!(
            ls.other_config.get("subnet").map(String::as_str),
            Some("10.70.0.0/23")
        );
        assert_eq!(
            ls.other_config.get("ipv6_prefix").map(String::as_str),
            Some("fd00:70::")
        );
        let lrp = h.nb.router_port("ovn-cluster-s1").expect("router port");
        assert_eq!(lrp.networks, ["10.70.0.1/23", "fd00:70::1/64"]);
        let mine: Vec<String> =
            h.nb.policies(VPC)
                .into_iter()
                .filter(|p| p.external_ids.get("subnet").map(String::as_str) == Some("s1"))
                .map(|p| p.match_)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
        assert_eq!(
            mine,
            [
                "ip4.dst == 10.70.0.0/23",
                "ip4.src == $s1.n1_ip4",
                "ip6.dst == fd00:70::/64"
            ]
        );
        // The allocator serves the wider block.
        let far = ["10.70.1.200".parse().expect("ip")];
        h.ctx
            .ipam
            .allocate("s1", &AllocRequest::new("p.ns", "p.ns").static_ips(&far))
            .expect("inside the wider block");
        assert!(
            policies(&h, VPC, naming::priority::GATEWAY_ROUTER).contains(&(
                "ip4.src == $s1.n1_ip4".to_owned(),
                LogicalRouterPolicyAction::Reroute,
                vec![join_ip.to_string()]
            ))
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_subnet_moved_to_another_vpc_leaves_the_old_router() {
        let h = Harness::start().await;
        with_node(&h, "n1", "172.18.0.2").await;
        h.create_cluster(&Vpc::new("blue", VpcSpec::default()))
            .await;
        h.run::<Vpcs>(Key::cluster("blue")).await.expect("vpc");
        subnet(&h, "s1", json!({ "cidrBlock": "10.70.0.0/24" })).await;
        run(&h, "s1").await.expect("run");
        assert!(h.nb.router_port("ovn-cluster-s1").is_some());
        let api: Api<Subnet> = Api::all(h.client.clone());
        let s = api
            .patch(
                "s1",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"vpc": "blue"}})),
            )
            .await
            .expect("patch");
        h.stored(&Decoded::new(s)).await;
        run(&h, "s1").await.expect("run");
        assert!(h.nb.router_port("blue-s1").is_some());
        assert!(h.nb.switch_port("s1-blue").is_some());
        // The switch holds the new VPC's Service group only.
        let groups = h.nb.switch("s1").expect("switch").load_balancer_group;
        let blue = h.nb.load_balancer_group("lbg.blue").expect("blue group");
        assert_eq!(groups.into_iter().collect::<Vec<_>>(), [blue.uuid]);
        assert!(h.nb.router_port("ovn-cluster-s1").is_none());
        assert!(h.nb.switch_port("s1-ovn-cluster").is_none());
        assert!(h.nb.port_group("s1.n1").is_none());
        assert!(h.nb.policies(VPC).iter().all(|p| p
            .external_ids
            .get("subnet")
            .map(String::as_str)
            != Some("s1")));
        assert_eq!(
            policies(&h, "blue", naming::priority::SUBNET_ROUTER),
            [(
                "ip4.dst == 10.70.0.0/24".to_owned(),
                LogicalRouterPolicyAction::Allow,
                vec![]
            )]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_subnet_of_a_custom_vpc_waits_for_its_router_then_patches_to_it() {
        let h = Harness::start().await;
        with_node(&h, "n1", "172.18.0.2").await;
        subnet(
            &h,
            "s2",
            json!({ "cidrBlock": "10.96.0.0/24", "vpc": "blue" }),
        )
        .await;
        let e = run(&h, "s2").await.expect_err("no router yet");
        assert!(matches!(e, ControllerError::NotReady(_)), "{e}");
        assert!(!e.is_permanent(), "retried until the router exists");
        assert!(h.nb.switch("s2").is_none());

        h.create_cluster(&Vpc::new("blue", VpcSpec::default()))
            .await;
        h.run::<Vpcs>(Key::cluster("blue")).await.expect("vpc");
        assert_eq!(run(&h, "s2").await.expect("run"), Action::Done);
        assert!(h.nb.switch("s2").is_some());
        let lrp = h.nb.router_port("blue-s2").expect("router port on blue");
        assert_eq!(lrp.networks, ["10.96.0.1/24"]);
        assert!(h.nb.router_port("ovn-cluster-s2").is_none());
        assert_eq!(
            policies(&h, "blue", naming::priority::SUBNET_ROUTER),
            [(
                "ip4.dst == 10.96.0.0/24".to_owned(),
                LogicalRouterPolicyAction::Allow,
                vec![]
            )]
        );
        // No distributed gateway outside the default VPC.
        assert!(h.nb.port_group("s2.n1").is_none());
        assert!(policies(&h, "blue", naming::priority::GATEWAY_ROUTER).is_empty());
        assert_eq!(
            condition(&h, "s2", condition_types::READY).await,
            is("True", reasons::SET_PRIVATE_SWITCH_SUCCESS)
        );
    }

    /// Asserts `name` was refused: a permanent error naming `words`, Validated False, Error True, no switch,
    /// no allocator subnet.
    async fn refused(h: &Harness, name: &str, words: &[&str]) {
        let e = run(h, name).await.expect_err("refused");
        assert!(e.is_permanent(), "{e}");
        assert_eq!(e.failure(), Failure::Permanent);
        let msg = e.to_string();
        for w in words {
            assert!(msg.contains(w), "{msg:?} lacks {w:?}");
        }
        assert_eq!(
            condition(h, name, condition_types::VALIDATED).await,
            is("False", reasons::VALIDATE_FAILED)
        );
        assert_eq!(
            condition(h, name, condition_types::ERROR).await,
            is("True", reasons::VALIDATE_FAILED)
        );
        assert!(h.nb.switch(name).is_none());
        assert!(h.ctx.subnet(name).is_none());
        assert!(h.ctx.ipam.stats(name).is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conflicting_and_bad_subnets_are_refused_until_what_they_overlap_goes() {
        let h = Harness::start().await;
        with_node(&h, "n1", "172.18.0.2").await;
        subnet(&h, "old", json!({ "cidrBlock": "10.70.0.0/24" })).await;
        run(&h, "old").await.expect("old");
        subnet(&h, "clash", json!({ "cidrBlock": "10.70.0.128/25" })).await;
        subnet(&h, "svc", json!({ "cidrBlock": "10.96.0.0/16" })).await;
        subnet(&h, "onnode", json!({ "cidrBlock": "172.18.0.0/24" })).await;
        subnet(&h, "bad", json!({ "cidrBlock": 5 })).await;
        subnet(
            &h,
            "badgw",
            json!({ "cidrBlock": "10.71.0.0/24", "gateway": "10.72.0.1" }),
        )
        .await;
        refused(&h, "clash", &["overlaps subnet old"]).await;
        refused(&h, "svc", &["service cidr"]).await;
        refused(&h, "onnode", &["172.18.0.2", "node n1"]).await;
        refused(&h, "bad", &["spec.cidrBlock"]).await;
        refused(&h, "badgw", &["gateway 10.72.0.1 is outside"]).await;
        let warned: Vec<String> = h
            .events(reasons::VALIDATE_FAILED)
            .await
            .into_iter()
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .filter_map(|e| e.regarding.and_then(|r| r.name))
            .collect();
        for n in ["clash", "svc", "onnode", "bad", "badgw"] {
            assert!(
                warned.iter().any(|w| w == n),
                "no Warning event on {n}: {warned:?}"
            );
        }
        // Refused again as it is: no second event.
        refused(&h, "clash", &["old"]).await;
        assert_eq!(
            h.events(reasons::VALIDATE_FAILED)
                .await
                .iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("clash"))
                .map(|e| e.series.as_ref().map_or(1, |s| s.count))
                .sum::<i32>(),
            1
        );

        // The old subnet's delete queues the refused ones; the overlapping one is accepted now.
        h.queued::<Decoded<Subnet>>().await;
        delete_subnet(&h, "old").await;
        h.queued::<Decoded<Subnet>>().await;
        run(&h, "old").await.expect("cleanup");
        let mut queued: Vec<String> = h
            .queued::<Decoded<Subnet>>()
            .await
            .iter()
            .map(|k| k.name().to_owned())
            .collect();
        queued.sort();
        assert_eq!(queued, ["bad", "badgw", "clash", "onnode", "svc"]);
        assert_eq!(run(&h, "clash").await.expect("accepted"), Action::Done);
        assert!(h.nb.switch("clash").is_some());
        assert_eq!(
            condition(&h, "clash", condition_types::VALIDATED).await,
            is("True", reasons::VALIDATE_SUCCESS)
        );
        assert_eq!(
            condition(&h, "clash", condition_types::ERROR)
                .await
                .map(|c| c.0),
            Some("False".to_owned())
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_address_change_requeues_only_refused_subnets() {
        let h = Harness::start().await;
        with_node(&h, "n1", "172.18.0.2").await;
        subnet(&h, "onnode", json!({ "cidrBlock": "172.18.0.0/24" })).await;
        subnet(&h, "fine", json!({ "cidrBlock": "10.70.0.0/24" })).await;
        refused(&h, "onnode", &["node n1"]).await;
        run(&h, "fine").await.expect("fine");
        // The refusal's status reaches the store before the relation reads it.
        let st: Subnet = h.get("onnode").await.expect("subnet");
        h.stored(&Decoded::new(st)).await;
        h.queued::<Decoded<Subnet>>().await;

        // A change that leaves the addresses alone queues nothing.
        let before: Node = h.get("n1").await.expect("node");
        let mut labelled = before.clone();
        labelled.labels_mut().insert("x".into(), "y".into());
        h.ctx.kinds.related(Some(&before), Some(&labelled));
        assert!(h.ctx.kinds.is_idle::<Decoded<Subnet>>());

        // A new InternalIP (through the watch) queues the refused subnet, not the accepted one.
        let api: Api<Node> = Api::all(h.client.clone());
        let moved = api
            .patch_status(
                "n1",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"addresses": [{"type": "InternalIP", "address": "172.19.0.2"}]}})),
            )
            .await
            .expect("move");
        h.stored(&moved).await;
        h.until("a subnet queued", || {
            !h.ctx.kinds.is_idle::<Decoded<Subnet>>()
        })
        .await;
        let queued: Vec<String> = h
            .queued::<Decoded<Subnet>>()
            .await
            .iter()
            .map(|k| k.name().to_owned())
            .collect();
        assert_eq!(queued, ["onnode"]);
        assert_eq!(run(&h, "onnode").await.expect("accepted"), Action::Done);
        assert!(h.nb.switch("onnode").is_some());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_subnet_queues_the_namespaces_it_names_and_the_default_subnet_all() {
        let h = Harness::start().await;
        for n in ["a", "b", "c"] {
            h.create_cluster(&ns(n)).await;
        }
        h.queued::<Namespace>().await;
        subnet(
            &h,
            "team",
            json!({ "cidrBlock": "10.70.0.0/24", "namespaces": ["a"] }),
        )
        .await;
        run(&h, "team").await.expect("run");
        let names = |v: Vec<Key<Namespace>>| {
            let mut v: Vec<String> = v.iter().map(|k| k.name().to_owned()).collect();
            v.sort();
            v
        };
        assert_eq!(names(h.queued::<Namespace>().await), ["a"]);

        // Moving to another namespace queues the old and the new one.
        let api: Api<Subnet> = Api::all(h.client.clone());
        let s = api
            .patch(
                "team",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"namespaces": ["b"]}})),
            )
            .await
            .expect("patch");
        h.stored(&Decoded::new(s)).await;
        h.queued::<Namespace>().await;
        run(&h, "team").await.expect("run");
        assert_eq!(names(h.queued::<Namespace>().await), ["a", "b"]);
        delete_subnet(&h, "team").await;
        run(&h, "team").await.expect("cleanup");
        assert_eq!(names(h.queued::<Namespace>().await), ["b"]);

        run(&h, "ovn-default").await.expect("default");
        let all = names(h.queued::<Namespace>().await);
        for n in ["a", "b", "c"] {
            assert!(all.iter().any(|x| x == n), "{all:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_private_subnet_gets_its_acls_and_loses_them_when_made_public() {
        use kubeovn_ovn::northbound::AclParent;
        let h = Harness::start().await;
        subnet(
            &h,
            "priv",
            json!({ "cidrBlock": "10.70.0.0/24", "private": true, "allowSubnets": ["10.16.0.5/32"],
                    "acls": [{"direction": "from-lport", "priority": 1200, "match": "udp.dst == 53", "action": "reject"}] }),
        )
        .await;
        run(&h, "priv").await.expect("run");
        let mut acls: Vec<(i64, String, String)> =
            h.nb.acls(&AclParent::Switch("priv".into()))
                .into_iter()
                .map(|a| (a.priority, a.match_, a.action.as_str().to_owned()))
                .collect();
        acls.sort();
        let drop = crate::netpol::SUBNET_DROP_PRIORITY;
        let allow = crate::netpol::SUBNET_ALLOW_PRIORITY;
        assert_eq!(
            acls.iter()
                .map(|(p, m, a)| (*p, m.as_str(), a.as_str()))
                .collect::<Vec<_>>(),
            [
                (1200, "udp.dst == 53", "reject"),
                (drop, "ip", "drop"),
                (
                    allow,
                    "(ip4.src == 10.70.0.0/24 && ip4.dst == 10.16.0.5/32) || (ip4.src == 10.16.0.5/32 && ip4.dst == 10.70.0.0/24)",
                    "allow-related"
                ),
                (allow, "ip4.src == 10.70.0.0/24 && ip4.dst == 10.70.0.0/24", "allow-related"),
                (crate::netpol::NODE_ALLOW_PRIORITY, "ip4.src == 100.64.0.0/16", "allow-related"),
            ]
        );
        // Running again writes nothing; made public, its ACLs go.
        let before = h.nb_rows();
        run(&h, "priv").await.expect("run");
        assert_eq!(h.nb_rows(), before);
        let api: Api<Subnet> = Api::all(h.client.clone());
        api.patch(
            "priv",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"private": false, "acls": []}})),
        )
        .await
        .expect("patch");
        h.until("the subnet made public in the store", || {
            h.ctx
                .kinds
                .get(&Key::<Decoded<Subnet>>::cluster("priv"))
                .is_some_and(|s| !s.object.spec.private)
        })
        .await;
        run(&h, "priv").await.expect("run");
        assert!(h.nb.acls(&AclParent::Switch("priv".into())).is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restart_with_unchanged_subnets_writes_nothing() {
        let h = Harness::start().await;
        with_node(&h, "n1", "172.18.0.2").await;
        subnet(
            &h,
            "s1",
            json!({ "cidrBlock": "10.70.0.0/24,fd00:70::/64" }),
        )
        .await;
        run(&h, "s1").await.expect("s1");
        for s in ["ovn-default", "join"] {
            run(&h, s).await.expect("builtin");
        }
        let before = h.nb_rows();
        let subnets: Vec<Subnet> = Api::<Subnet>::all(h.client.clone())
            .list(&Default::default())
            .await
            .expect("subnets")
            .items;
        let n1: Node = h.get("n1").await.expect("node");

        let db: MemDb = h.db.clone();
        drop(h);
        let h = Harness::start_with(config(), db, |client| async move {
            let api: Api<Subnet> = Api::all(client.clone());
            for mut s in subnets {
                s.metadata.resource_version = None;
                let status = s.status.take();
                let c = api
                    .create(&PostParams::default(), &s)
                    .await
                    .expect("subnet");
                if let Some(status) = status {
                    let _ = api
                        .patch_status(
                            &c.name_any(),
                            &PatchParams::default(),
                            &Patch::Merge(StatusPatch { status }),
                        )
                        .await;
                }
            }
            let mut n = n1;
            n.metadata.resource_version = None;
            let status = n.status.take();
            let nodes: Api<Node> = Api::all(client);
            nodes
                .create(&PostParams::default(), &n)
                .await
                .expect("node");
            nodes
                .patch_status(
                    "n1",
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await
                .expect("node status");
        })
        .await;
        assert_eq!(h.nb_rows(), before, "the start rewrote the northbound");
        let s1: Subnet = h.get("s1").await.expect("s1");
        for s in ["s1", "ovn-default", "join"] {
            run(&h, s).await.expect("run");
        }
        h.run::<Nodes>(Key::cluster("n1")).await.expect("node");
        assert_eq!(h.nb_rows(), before, "a reconcile rewrote the northbound");
        let again: Subnet = h.get("s1").await.expect("s1");
        assert_eq!(
            s1.metadata.resource_version, again.metadata.resource_version,
            "unchanged conditions are not patched again"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_status_loop_publishes_the_counters_when_they_change() {
        let c = Config {
            status_interval: std::time::Duration::from_millis(5),
            ..config()
        };
        let h = Harness::start_with(c, MemDb::new_nb(), |_| async {}).await;
        subnet(
            &h,
            "s1",
            json!({ "cidrBlock": "10.70.0.0/24", "excludeIps": ["10.70.0.2..10.70.0.11"] }),
        )
        .await;
        run(&h, "s1").await.expect("s1");
        let task = tokio::spawn(status_loop(h.ctx.clone()));
        let usage = |want_using: u128| {
            let h = &h;
            async move {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
                loop {
                    let s: Subnet = h.get("s1").await.expect("s1");
                    let u = s.status.unwrap_or_default();
                    if u.v4_using_ips == IpCount(want_using) && u.v4_available_ips != IpCount(0) {
                        return u;
                    }
                    assert!(std::time::Instant::now() < deadline, "status: {u:?}");
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            }
        };
        let u = usage(0).await;
        // 254 hosts less the gateway and 10 excluded.
        assert_eq!(u.v4_available_ips, IpCount(243));
        let a = h
            .ctx
            .ipam
            .allocate("s1", &AllocRequest::new("p.ns", "p.ns"))
            .expect("allocate");
        let u = usage(1).await;
        assert_eq!(u.v4_available_ips, IpCount(242));
        assert_eq!(u.v4_using_ip_range, a.ips().next().expect("ip").to_string());
        task.abort();
    }
}
