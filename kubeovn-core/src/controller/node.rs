//! Nodes: the join address and port `node-<node>`, its port group and policies, node annotations.

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::ResourceExt;
use kubeovn_ipam::AllocRequest;
use kubeovn_ovn::northbound::Op;

use super::api::{self, IpRecord};
use super::error::{ControllerError, Result};
use super::framework::{Action, Key, Reconciler};
use super::views::{chassis_of, internal_ips};
use super::{plan, Ctx};
use crate::annotations::{merge_patch, NodeAnnotations};
use crate::naming;

/// The node kind: join address, port, port group and policies of each node; removed when it is gone. The
/// subnets' gateway policies for a new node come from the subnet kind's relation on Nodes (the join
/// address annotation this kind writes).
#[derive(Debug, Default)]
pub(crate) struct Nodes;

#[async_trait::async_trait]
impl Reconciler<Ctx> for Nodes {
    type Object = Node;
    type Error = ControllerError;
    const NAME: &'static str = "node";

    async fn reconcile(&self, ctx: &Arc<Ctx>, n: Arc<Node>) -> Result<Action> {
        add(ctx, &n).await.map(|()| Action::Done)
    }

    async fn cleanup(
        &self,
        ctx: &Arc<Ctx>,
        key: &Key<Node>,
        last: Option<Arc<Node>>,
    ) -> Result<Action> {
        delete(ctx, key.name(), last.as_deref())
            .await
            .map(|()| Action::Done)
    }
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
    let node_ips = internal_ips(n);
    let mut b = plan::node_batch(&name, &join, &addrs, &node_ips, &ctx.config.default_vpc);
    // The policies of addresses the node no longer has (its InternalIP changed).
    let keep: Vec<String> = node_ips
        .iter()
        .map(|ip| plan::node_policy_match(*ip))
        .collect();
    b.ops.extend(node_policy_deletes(ctx, &name, &keep));
    ctx.writer.commit(b).await?;
    api::ensure(
        &ctx.client,
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
    Ok(())
}

/// Deletes the node routing policies (30000) of node `name` in the default VPC, but those matching `keep`.
fn node_policy_deletes(ctx: &Ctx, name: &str, keep: &[String]) -> Vec<Op> {
    let vpc = &ctx.config.default_vpc;
    let priority = i64::from(naming::priority::NODE_ROUTER);
    ctx.nb
        .policies(vpc)
        .into_iter()
        .filter(|p| p.priority == priority && !keep.contains(&p.match_))
        .filter(|p| {
            p.external_ids
                .get(naming::external_ids::NODE)
                .map(String::as_str)
                == Some(name)
        })
        .map(|p| Op::DeletePolicy {
            router: vpc.clone(),
            priority,
            match_: p.match_,
        })
        .collect()
}

async fn delete(ctx: &Ctx, name: &str, last: Option<&Node>) -> Result<()> {
    let port = naming::node_port(name);
    let node_ips = last.map(internal_ips).unwrap_or_default();
    let mut b = plan::node_delete_batch(name, &node_ips, &ctx.config.default_vpc);
    // Also those of addresses its last state no longer showed.
    b.ops.extend(node_policy_deletes(ctx, name, &[]));
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
    // The node's Service template variables (internalTrafficPolicy Local) go with its chassis.
    let chassis = last.map_or_else(|| name.to_owned(), chassis_of);
    if ctx.nb.chassis_template_var(&chassis).is_some() {
        b.delete_chassis_template_vars(chassis);
    }
    ctx.writer.commit(b).await?;
    if let Some(sb) = &ctx.sb {
        let chassis = last.map_or_else(|| name.to_owned(), chassis_of);
        sb.delete_chassis(&chassis).await?;
        tracing::info!(node = name, %chassis, "chassis removed from the southbound");
    }
    api::delete(&ctx.client, &port).await?;
    ctx.views
        .release(&ctx.config.join_subnet.name, &port, &port)
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotations::{ALLOCATED, IP_ADDRESS, LOGICAL_SWITCH, MAC_ADDRESS};
    use crate::controller::testing::Harness;

    impl Harness {
        /// Runs the node kind for `key` (other kinds' tests use it without naming this kind).
        pub(crate) async fn run_node(&self, key: Key<Node>) -> Result<Action> {
            self.run::<Nodes>(key).await
        }
    }
    use crate::crd::IP;
    use crate::crd::{Decoded, Subnet};
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};
    use kube::api::DeleteParams;
    use kubeovn_ovn::models::nb::LogicalRouterPolicyAction;
    use kubeovn_ovn::northbound::Northbound;
    use serde_json::json;

    const VPC: &str = "ovn-cluster";

    fn node(name: &str, ip: &str, annotations: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.to_owned());
        n.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        n.status = Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: ip.into(),
            }]),
            ..NodeStatus::default()
        });
        n
    }

    /// Creates `n` (with its status) and runs it.
    async fn add(h: &Harness, n: &Node) -> NodeAnnotations {
        let api: Api<Node> = Api::all(h.client.clone());
        let name = n.name_any();
        api.create(&Default::default(), n).await.expect("create");
        let n = api
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": n.status })),
            )
            .await
            .expect("status");
        h.stored(&n).await;
        assert_eq!(
            h.run::<Nodes>(Key::cluster(&name)).await.expect("run"),
            Action::Done
        );
        annotations(h, &name).await
    }

    async fn annotations(h: &Harness, name: &str) -> NodeAnnotations {
        let n: Node = h.get(name).await.expect("node");
        NodeAnnotations::parse(n.annotations()).expect("annotations")
    }

    /// The 30000 policies of the default VPC: (match, action, nexthops).
    fn node_policies(h: &Harness) -> Vec<(String, LogicalRouterPolicyAction, Vec<String>)> {
        let mut v: Vec<_> =
            h.nb.policies(VPC)
                .into_iter()
                .filter(|p| p.priority == i64::from(naming::priority::NODE_ROUTER))
                .map(|p| (p.match_, p.action, p.nexthops))
                .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_gets_its_join_port_group_and_policies_and_loses_them_with_it() {
        let h = Harness::start().await;
        h.queued::<Decoded<Subnet>>().await;
        let a = add(&h, &node("n1", "172.18.0.2", &[])).await;
        let join: ipnetwork::IpNetwork = "100.64.0.0/16".parse().expect("cidr");
        let [ip] = a.ip_addresses[..] else {
            panic!("one join address: {a:?}")
        };
        assert!(join.contains(ip) && ip.to_string() != "100.64.0.1", "{ip}");
        let mac = a.mac_address.expect("mac");
        assert_eq!(a.cidrs, [join]);
        assert_eq!(a.gateways, ["100.64.0.1".parse::<IpAddr>().expect("gw")]);
        assert_eq!(a.logical_switch.as_deref(), Some("join"));
        assert!(a.allocated);
        assert_eq!(a.port_name.as_deref(), Some("node-n1"));

        let lsp = h.nb.switch_port("node-n1").expect("port");
        assert_eq!(lsp.addresses, [format!("{mac} {ip}")]);
        assert!(h
            .nb
            .switch_port_names("join")
            .contains(&"node-n1".to_owned()));
        let pg = h.nb.port_group("node.n1").expect("port group");
        assert_eq!(pg.ports, [lsp.uuid]);
        assert_eq!(
            node_policies(&h),
            [(
                "ip4.dst == 172.18.0.2".to_owned(),
                LogicalRouterPolicyAction::Reroute,
                vec![ip.to_string()]
            )]
        );
        let rec: IP = h.get("node-n1").await.expect("ip record");
        assert_eq!(rec.spec.ip_address, ip.to_string());
        assert_eq!(rec.spec.subnet, "join");
        assert_eq!(rec.spec.node_name, "n1");
        // A new node's join address queues the subnets (their gateway policies for it), through the
        // subnet kind's relation on Nodes once the watch shows the annotation.
        let n: Node = h.get("n1").await.expect("node");
        h.stored(&n).await;
        let queued = h.queued::<Decoded<Subnet>>().await;
        assert!(
            queued.iter().any(|k| k.name() == "ovn-default"),
            "{queued:?}"
        );
        h.run_subnet(Key::cluster("ovn-default"))
            .await
            .expect("default subnet");
        assert!(h.nb.port_group("ovn.default.n1").is_some());

        // Run again unchanged: nothing written.
        let n: Node = h.get("n1").await.expect("node");
        h.stored(&n).await;
        let rows = h.nb_rows();
        h.run::<Nodes>(Key::cluster("n1")).await.expect("again");
        assert_eq!(h.nb_rows(), rows);
        let again: Node = h.get("n1").await.expect("node");
        assert_eq!(n.metadata.resource_version, again.metadata.resource_version);

        // A new InternalIP: its policy replaces the old one; the join address stays.
        let api: Api<Node> = Api::all(h.client.clone());
        let moved = api
            .patch_status(
                "n1",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"addresses": [{"type": "InternalIP", "address": "172.18.0.3"}]}})),
            )
            .await
            .expect("move");
        h.stored(&moved).await;
        h.run::<Nodes>(Key::cluster("n1")).await.expect("moved");
        assert_eq!(
            node_policies(&h),
            [(
                "ip4.dst == 172.18.0.3".to_owned(),
                LogicalRouterPolicyAction::Reroute,
                vec![ip.to_string()]
            )]
        );
        assert_eq!(annotations(&h, "n1").await.ip_addresses, [ip]);

        api.delete("n1", &DeleteParams::default())
            .await
            .expect("delete");
        let key = Key::<Node>::cluster("n1");
        h.gone(&key).await;
        assert_eq!(h.run::<Nodes>(key).await.expect("cleanup"), Action::Done);
        assert!(h.nb.switch_port("node-n1").is_none());
        assert!(h.nb.port_group("node.n1").is_none());
        assert!(h.nb.port_group("ovn.default.n1").is_none());
        assert!(node_policies(&h).is_empty());
        assert!(h
            .nb
            .policies(VPC)
            .iter()
            .all(|p| !p.match_.contains("ovn.default.n1")));
        assert!(h.get::<IP>("node-n1").await.is_none());
        assert_eq!(
            h.ctx.ipam.get("join", "node-n1", "node-n1").expect("join"),
            None
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_recorded_join_address_is_kept_unless_taken() {
        let h = Harness::start().await;
        let recorded = [
            (IP_ADDRESS, "100.64.0.77"),
            (MAC_ADDRESS, "00:00:00:aa:bb:cc"),
            (LOGICAL_SWITCH, "join"),
            (ALLOCATED, "true"),
        ];
        let a = add(&h, &node("n2", "172.18.0.4", &recorded)).await;
        assert_eq!(
            a.ip_addresses,
            ["100.64.0.77".parse::<IpAddr>().expect("ip")]
        );
        assert_eq!(
            a.mac_address.map(|m| m.to_string()).as_deref(),
            Some("00:00:00:aa:bb:cc")
        );
        assert_eq!(
            h.nb.switch_port("node-n2").expect("port").addresses,
            ["00:00:00:aa:bb:cc 100.64.0.77"]
        );
        // Another node recording the same address gets a new one.
        let b = add(&h, &node("n3", "172.18.0.5", &recorded)).await;
        assert_eq!(b.ip_addresses.len(), 1);
        assert_ne!(b.ip_addresses, a.ip_addresses);
        assert_eq!(annotations(&h, "n2").await.ip_addresses, a.ip_addresses);

        // Deleted in a state that no longer shows its address: its policy goes all the same.
        let api: Api<Node> = Api::all(h.client.clone());
        let bare = api
            .patch_status(
                "n2",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"addresses": []}})),
            )
            .await
            .expect("status");
        h.stored(&bare).await;
        api.delete("n2", &DeleteParams::default())
            .await
            .expect("delete");
        let key = Key::<Node>::cluster("n2");
        h.gone(&key).await;
        h.run::<Nodes>(key).await.expect("cleanup");
        assert_eq!(
            node_policies(&h)
                .into_iter()
                .map(|p| p.0)
                .collect::<Vec<_>>(),
            ["ip4.dst == 172.18.0.5"]
        );
    }
}
