//! Subnets and IPPools: the allocator's subnets, the logical switch with its patch to the VPC router and
//! policies, Subnet status; IPPools as allocator pools.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnetwork::IpNetwork;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use kubeovn_ipam::PoolSpec;
use serde_json::{json, Value};

use super::error::{ControllerError, Result};
use super::{plan, take_tomb, Ctx, SubnetConfig, SubnetInfo};
use crate::annotations::DEFAULT_PROVIDER;
use crate::crd::IpCount;
use crate::naming;

/// The IPPool resource.
pub(crate) fn pool_resource() -> ApiResource {
    ApiResource {
        group: "kubeovn.io".to_owned(),
        version: "v1".to_owned(),
        api_version: "kubeovn.io/v1".to_owned(),
        kind: "IPPool".to_owned(),
        plural: "ippools".to_owned(),
    }
}

/// The Subnet resource.
pub(crate) fn resource() -> ApiResource {
    ApiResource {
        group: "kubeovn.io".to_owned(),
        version: "v1".to_owned(),
        api_version: "kubeovn.io/v1".to_owned(),
        kind: "Subnet".to_owned(),
        plural: "subnets".to_owned(),
    }
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
        namespaces: Vec::new(),
        default: !join,
        join,
    })
}

fn str_of<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or_default()
}

fn strings_of(v: &Value, k: &str) -> Vec<String> {
    v.get(k)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// A Subnet object, read by Kube-OVN's field names.
pub(crate) fn info_from_crd(ctx: &Ctx, s: &DynamicObject) -> Result<SubnetInfo> {
    let name = s.name_any();
    let what = format!("subnet {name}");
    let spec = s.data.get("spec").cloned().unwrap_or(Value::Null);
    let cidrs = parse_cidrs(&what, str_of(&spec, "cidrBlock"))?;
    let gateways = parse_gateways(&what, &cidrs, str_of(&spec, "gateway"))?;
    let or = |v: &str, d: &str| {
        if v.is_empty() {
            d.to_owned()
        } else {
            v.to_owned()
        }
    };
    let mut exclude_ips = strings_of(&spec, "excludeIps");
    for e in &exclude_ips {
        for part in e.split("..") {
            if part.trim().parse::<IpAddr>().is_err() {
                return Err(ControllerError::invalid(
                    &what,
                    format!("excludeIps entry {e:?} is not an address or a..b range"),
                ));
            }
        }
    }
    exclude_ips.retain(|e| !gateways.iter().any(|g| g.to_string() == *e));
    Ok(SubnetInfo {
        cidrs,
        gateways,
        exclude_ips,
        vpc: or(str_of(&spec, "vpc"), &ctx.config.default_vpc),
        provider: or(str_of(&spec, "provider"), DEFAULT_PROVIDER),
        gateway_type: or(str_of(&spec, "gatewayType"), "distributed"),
        namespaces: strings_of(&spec, "namespaces"),
        default: spec
            .get("default")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        join: name == ctx.config.join_subnet.name,
        name,
    })
}

/// Loads a subnet into the allocator and the controller's table.
pub(crate) fn install(ctx: &Ctx, info: SubnetInfo) -> Result<()> {
    let dropped = ctx.ipam.add_or_update_subnet(&info.ipam_spec())?;
    for d in dropped {
        tracing::warn!(subnet = %info.name, pod = %d.pod, "allocation outside the updated subnet dropped");
    }
    ctx.subnets
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(info.name.clone(), Arc::new(info));
    Ok(())
}

/// Creates the Subnet object of a built-in subnet if it is missing.
pub(crate) async fn ensure_subnet_object(
    client: &kube::Client,
    info: &SubnetInfo,
    default: bool,
) -> Result<()> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource());
    let protocol = match (
        info.cidrs.iter().any(IpNetwork::is_ipv4),
        info.cidrs.iter().any(IpNetwork::is_ipv6),
    ) {
        (true, true) => "Dual",
        (false, true) => "IPv6",
        _ => "IPv4",
    };
    let mut exclude: Vec<String> = info.gateways.iter().map(ToString::to_string).collect();
    exclude.extend(info.exclude_ips.iter().cloned());
    let mut o = DynamicObject::new(&info.name, &resource());
    o.data = json!({ "spec": {
        "cidrBlock": info.cidr_block(),
        "gateway": info.gateway(),
        "excludeIps": exclude,
        "protocol": protocol,
        "provider": DEFAULT_PROVIDER,
        "vpc": info.vpc,
        "default": default,
        "gatewayType": "distributed",
        "natOutgoing": default,
        "private": false,
    }});
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
        .nodes
        .state()
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

/// Writes a subnet's northbound state.
pub(crate) async fn reconcile_info(ctx: &Ctx, info: &SubnetInfo) -> Result<()> {
    let lrp = naming::router_port(&info.vpc, &info.name);
    let mac = ctx
        .nb
        .router_port(&lrp)
        .map(|p| p.mac)
        .unwrap_or_else(|| plan::router_port_mac(&lrp));
    let mut b = plan::subnet_batch(info, &mac);
    if info.distributed(&ctx.config.default_vpc) {
        b.ops
            .extend(plan::gateway_batch(info, &node_join_ips(ctx)).ops);
    }
    ctx.writer.commit(b).await
}

fn condition(type_: &str, ok: bool, reason: &str, message: &str) -> Value {
    let now = Timestamp::now().to_string();
    json!({
        "type": type_,
        "status": if ok { "True" } else { "False" },
        "reason": reason,
        "message": message,
        "lastUpdateTime": now,
        "lastTransitionTime": now,
    })
}

async fn patch_status(ctx: &Ctx, name: &str, status: Value) -> Result<()> {
    let api: Api<DynamicObject> = Api::all_with(ctx.client.clone(), &resource());
    match api
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
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

pub(crate) async fn reconcile(ctx: &Arc<Ctx>, name: &str) -> Result<()> {
    let Some(obj) = ctx
        .subnet_store
        .get(&kube::runtime::reflector::ObjectRef::new_with(
            name,
            resource(),
        ))
    else {
        let last = take_tomb(&ctx.subnet_tombstones, name);
        return delete(ctx, name, last.as_deref()).await;
    };
    let info = match info_from_crd(ctx, &obj) {
        Ok(i) => i,
        Err(e) => {
            ctx.event_on(
                &obj.object_ref(&resource()),
                EventType::Warning,
                "ValidateSubnetFailed",
                e.to_string(),
            )
            .await;
            let msg = e.to_string();
            patch_status(
                ctx,
                name,
                json!({ "conditions": [
                    condition("Validated", false, "ValidateSubnetFailed", &msg),
                    condition("Ready", false, "ValidateSubnetFailed", &msg),
                ]}),
            )
            .await?;
            return Err(e);
        }
    };
    if let Err(e) = install(ctx, info.clone()) {
        ctx.event_on(
            &obj.object_ref(&resource()),
            EventType::Warning,
            "ValidateSubnetFailed",
            e.to_string(),
        )
        .await;
        return Err(e);
    }
    if ctx.nb.router(&info.vpc).is_none() {
        // The Vpc's handler creates its router; retried until then.
        return Err(ControllerError::NotReady(format!("vpc {}", info.vpc)));
    }
    reconcile_info(ctx, &info).await?;
    ctx.queues.vpc.add(info.vpc.clone());
    let ready = json!({ "conditions": [
        condition("Validated", true, "ValidatedSubnet", ""),
        condition("Ready", true, "SetPrivateLogicalSwitchSuccess", ""),
    ]});
    let already = obj
        .data
        .get("status")
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .is_some_and(|c| {
            c.iter()
                .filter(|x| x.get("status").and_then(Value::as_str) == Some("True"))
                .count()
                == 2
        });
    if !already {
        patch_status(ctx, name, ready).await?;
    }
    for ns in ctx.namespaces.state() {
        ctx.queues.namespace.add(ns.name_any());
    }
    Ok(())
}

async fn delete(ctx: &Ctx, name: &str, _last: Option<&DynamicObject>) -> Result<()> {
    let Some(info) = ctx.subnet(name) else {
        return Ok(());
    };
    if name == ctx.config.join_subnet.name || name == ctx.config.default_subnet.name {
        // Built-in subnets stay (Kube-OVN recreates them).
        return Ok(());
    }
    let nodes: Vec<String> = ctx.nodes.state().iter().map(|n| n.name_any()).collect();
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
    ctx.queues.vpc.add(info.vpc.clone());
    for ns in ctx.namespaces.state() {
        ctx.queues.namespace.add(ns.name_any());
    }
    Ok(())
}

/// Loads an IPPool into the allocator.
pub(crate) fn install_pool(ctx: &Ctx, p: &DynamicObject) -> Result<()> {
    let name = p.name_any();
    let spec = p.data.get("spec").cloned().unwrap_or(Value::Null);
    let subnet = str_of(&spec, "subnet").to_owned();
    let ips = strings_of(&spec, "ips");
    ctx.ipam
        .add_or_update_pool(&subnet, &PoolSpec::new(&name, ips.iter().cloned()))?;
    ctx.pools
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(name, (subnet, ips));
    Ok(())
}

pub(crate) async fn reconcile_pool(ctx: &Arc<Ctx>, name: &str) -> Result<()> {
    match ctx
        .pool_store
        .get(&kube::runtime::reflector::ObjectRef::new_with(
            name,
            pool_resource(),
        )) {
        Some(p) => {
            if let Err(e) = install_pool(ctx, &p) {
                ctx.event_on(
                    &p.object_ref(&pool_resource()),
                    EventType::Warning,
                    "InvalidIPPool",
                    e.to_string(),
                )
                .await;
                return Err(e);
            }
            Ok(())
        }
        None => {
            take_tomb(&ctx.pool_tombstones, name);
            let gone = ctx
                .pools
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .remove(name);
            if let Some((subnet, _)) = gone {
                match ctx.ipam.delete_pool(&subnet, name) {
                    Ok(())
                    | Err(kubeovn_ipam::IpamError::NoSuchSubnet { .. })
                    | Err(kubeovn_ipam::IpamError::NoSuchPool { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(())
        }
    }
}

fn status_of(stats: &kubeovn_ipam::SubnetStats) -> Value {
    let n = |v: u128| serde_json::to_value(IpCount(v)).unwrap_or(Value::Null);
    json!({
        "v4availableIPs": n(stats.v4.available),
        "v4usingIPs": n(stats.v4.using),
        "v4availableIPrange": stats.v4.available_range,
        "v4usingIPrange": stats.v4.using_range,
        "v6availableIPs": n(stats.v6.available),
        "v6usingIPs": n(stats.v6.using),
        "v6availableIPrange": stats.v6.available_range,
        "v6usingIPrange": stats.v6.using_range,
    })
}

/// Publishes each subnet's counters and ranges when they change (once per interval at most, instead of
/// once per pod as Kube-OVN does).
pub(crate) async fn status_loop(ctx: Arc<Ctx>) {
    let mut last: HashMap<String, Value> = HashMap::new();
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
            match patch_status(&ctx, &s.name, v.clone()).await {
                Ok(()) => {
                    last.insert(s.name.clone(), v);
                }
                Err(e) => tracing::debug!(subnet = %s.name, error = %e, "subnet status"),
            }
        }
    }
}
