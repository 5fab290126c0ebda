//! Nodes: the join address and port `node-<node>`, its port group and policies, node annotations.

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::ResourceExt;
use kubeovn_ipam::AllocRequest;
use kubeovn_ovn::northbound::Op;

use super::error::{ControllerError, Result};
use super::framework::{Action, Key, Reconciler};
use super::ip::{self, IpRecord};
use super::{plan, Ctx};
use crate::annotations::{merge_patch, NodeAnnotations};
use crate::crd::{Decoded, Subnet};
use crate::naming;

/// The node kind: join address, port, port group and policies of each node; removed when it is gone.
pub(crate) struct Nodes;

#[async_trait::async_trait]
impl Reconciler<Ctx> for Nodes {
    type Object = Node;
    type Error = ControllerError;
    const NAME: &'static str = "node";

    fn workers(ctx: &Ctx) -> usize {
        ctx.config.workers
    }

    async fn reconcile(ctx: &Arc<Ctx>, n: Arc<Node>) -> Result<Action> {
        add(ctx, &n).await.map(|()| Action::Done)
    }

    async fn cleanup(ctx: &Arc<Ctx>, key: &Key<Node>, last: Option<Arc<Node>>) -> Result<Action> {
        delete(ctx, key.name(), last.as_deref())
            .await
            .map(|()| Action::Done)
    }
}

/// A node's InternalIP addresses.
pub(crate) fn internal_ips(n: &Node) -> Vec<IpAddr> {
    n.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| {
            a.iter()
                .filter(|x| x.type_ == "InternalIP")
                .filter_map(|x| x.address.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

async fn add(ctx: &Ctx, n: &Node) -> Result<()> {
    let name = n.name_any();
    let Some(join) = ctx.join_subnet() else {
        return Err(ControllerError::NotReady("the join subnet".into()));
    };
    let port = naming::node_port(&name);
    let a = match NodeAnnotations::parse(n.annotations()) {
        Ok(a) => a,
        Err(e) => {
            ctx.event(n, EventType::Warning, "InvalidAnnotation", e.to_string())
                .await;
            NodeAnnotations::default()
        }
    };
    let statics: Vec<IpAddr> =
        if a.allocated && a.logical_switch.as_deref() == Some(join.name.as_str()) {
            a.ip_addresses.clone()
        } else {
            Vec::new()
        };
    let mut req = AllocRequest::new(&port, &port).static_ips(&statics);
    if let (Some(m), false) = (a.mac_address, statics.is_empty()) {
        req = req.mac(m);
    }
    let addrs = match ctx.ipam.allocate(&join.name, &req) {
        Ok(x) => x,
        // The recorded address is taken (or outside a changed join subnet): take a new one.
        Err(_) if !statics.is_empty() => ctx
            .ipam
            .allocate(&join.name, &AllocRequest::new(&port, &port))?,
        Err(e) => return Err(e.into()),
    };
    let had = ctx.nb.switch_port(&port).is_some();
    let node_ips = internal_ips(n);
    ctx.writer
        .commit(plan::node_batch(
            &name,
            &join,
            &addrs,
            &node_ips,
            &ctx.config.default_vpc,
        ))
        .await?;
    ip::ensure(
        ctx,
        &IpRecord {
            name: port.clone(),
            subnet: join.name.clone(),
            namespace: String::new(),
            pod: name.clone(),
            node: name.clone(),
            addrs,
            pod_type: String::new(),
        },
    )
    .await?;
    let want = NodeAnnotations {
        ip_addresses: addrs.ips().collect(),
        mac_address: Some(addrs.mac),
        cidrs: join.cidrs.clone(),
        gateways: join.gateways.clone(),
        logical_switch: Some(join.name.clone()),
        allocated: true,
        port_name: Some(port.clone()),
        chassis: None,
        tunnel_interface: None,
    };
    let patch = want.allocation_patch();
    let anns = n.annotations();
    if !patch
        .iter()
        .all(|(k, v)| anns.get(k).map(String::as_str) == v.as_deref())
    {
        let api: Api<Node> = Api::all(ctx.client.clone());
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(merge_patch(&patch)),
        )
        .await
        .map_err(|e| ControllerError::kube(format!("patch node {name}"), e))?;
    }
    if !had {
        // Distributed subnets get this node's gateway policy.
        for s in ctx.subnet_list() {
            ctx.enqueue(Key::<Decoded<Subnet>>::cluster(&s.name));
        }
    }
    Ok(())
}

async fn delete(ctx: &Ctx, name: &str, last: Option<&Node>) -> Result<()> {
    let port = naming::node_port(name);
    let node_ips = last.map(internal_ips).unwrap_or_default();
    let mut b = plan::node_delete_batch(name, &node_ips, &ctx.config.default_vpc);
    for s in ctx.subnet_list() {
        if !s.distributed(&ctx.config.default_vpc) {
            continue;
        }
        for v4 in [true, false] {
            b.add(Op::DeletePolicy {
                router: s.vpc.clone(),
                priority: i64::from(naming::priority::GATEWAY_ROUTER),
                match_: plan::gateway_policy_match(&s, name, v4),
            });
        }
        b.add(Op::DeletePortGroup(naming::subnet_node_port_group(
            &s.name, name,
        )));
    }
    ctx.writer.commit(b).await?;
    ip::delete(ctx, &port).await?;
    let join = ctx.config.join_subnet.name.clone();
    match ctx.ipam.release(&join, &port, &port) {
        Ok(Some(_)) => {
            super::pod::wake(ctx, &join);
            Ok(())
        }
        Ok(None) | Err(kubeovn_ipam::IpamError::NoSuchSubnet { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
