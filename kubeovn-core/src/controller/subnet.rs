//! The subnet kind: the allocator's subnet (through the views' subnet table), the logical switch with its
//! patch to the VPC router and policies, the switch's ACLs and the Subnet's conditions. (Its address
//! counters are published by the status task, `status.rs`; parsing and validation are pure, in
//! `subnet_spec.rs`.)
//!
//! A Subnet is validated before anything is written: its spec on its own (blocks, gateway and `excludeIps`
//! inside them), then against what is taken (`subnet_spec::check_conflicts`: the accepted subnets of its VPC,
//! and in the default VPC the service CIDR and the nodes' InternalIPs). The subnet accepted first keeps its
//! addresses; a refused one gets `Validated` = False (`ValidateLogicalSwitchFailed`) and a Warning event,
//! and no northbound row or allocator subnet. It is handled again when its spec changes, a subnet is deleted
//! or moves, or a node's addresses change (its relations).

use std::collections::HashSet;
use std::sync::Arc;

use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::api::patch_subnet_status;
use super::error::{ControllerError, Result};
use super::framework::{Action, Key, Kinds, Reconciler, Relations};
use super::gateway;
use super::subnet_spec::{conditions_of, info_from_crd, refusal};
use super::views::{internal_ips, GatewayHealthChanged, SubnetChanged, Views};
use super::{plan, Ctx, SubnetInfo};
use crate::annotations::DEFAULT_PROVIDER;
use crate::crd::{
    condition_types, reasons, Conditions, Decoded, GatewayType, Protocol, StatusPatch, Subnet,
    SubnetSpec, SubnetStatus,
};
use crate::naming;

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
            .extend(plan::gateway_batch(info, &ctx.views.node_join_ips()).ops);
    } else if gateway::centralized(info, &ctx.config.default_vpc) {
        active = gateway::active(
            info,
            &ctx.nodes(),
            &ctx.views.node_join_ips(),
            &ctx.views.gateways,
        );
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
    // The nodes reach pods through the join subnet.
    let node_cidrs: Vec<String> = ctx
        .config
        .join_subnet
        .cidr
        .split(',')
        .map(str::to_owned)
        .collect();
    let mut acls: Vec<Acl> = crate::netpol::subnet_acls(
        &cidrs,
        info.private,
        &info.allow_subnets,
        info.allow_ew_traffic,
        &node_cidrs,
        &mut problems,
    )
    .iter()
    .map(|a| plan::ovn_acl(a, &info.name, &owner, None))
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

/// Writes the conditions of `st` when `changed`.
async fn patch_conditions(ctx: &Ctx, name: &str, st: &SubnetStatus, changed: bool) -> Result<()> {
    if !changed {
        return Ok(());
    }
    patch_subnet_status(&ctx.client, name, &StatusPatch::conditions(&st.conditions)).await
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

/// The Subnet objects that are refused or not loaded yet: a subnet's change or delete, or a node's, may
/// have freed their addresses.
fn refused(kinds: &Kinds, views: &Views) -> Vec<Key<Decoded<Subnet>>> {
    kinds
        .list::<Decoded<Subnet>>()
        .iter()
        .filter(|o| views.subnet(&o.name_any()).is_none() || refusal(o).is_some())
        .map(|o| Key::cluster(&o.name_any()))
        .collect()
}

/// The centralized Subnet objects.
fn centralized(kinds: &Kinds) -> Vec<Key<Decoded<Subnet>>> {
    kinds
        .list::<Decoded<Subnet>>()
        .iter()
        .filter(|o| o.object.spec.gateway_type == Some(GatewayType::Centralized))
        .map(|o| Key::cluster(&o.name_any()))
        .collect()
}

/// The subnet kind: each Subnet's validation, address range, logical switch, routes and conditions.
pub(crate) struct Subnets {
    /// The subnet table its relations read.
    views: Arc<Views>,
}

impl Subnets {
    /// The kind over `views`.
    pub fn new(views: Arc<Views>) -> Self {
        Subnets { views }
    }
}

#[async_trait::async_trait]
impl Reconciler<Ctx> for Subnets {
    type Object = Decoded<Subnet>;
    type Error = ControllerError;
    const NAME: &'static str = "subnet";

    async fn reconcile(&self, ctx: &Arc<Ctx>, obj: Arc<Decoded<Subnet>>) -> Result<Action> {
        reconcile(ctx, &obj).await.map(|()| Action::Done)
    }

    async fn cleanup(
        &self,
        ctx: &Arc<Ctx>,
        key: &Key<Decoded<Subnet>>,
        _: Option<Arc<Decoded<Subnet>>>,
    ) -> Result<Action> {
        delete(ctx, key.name()).await.map(|()| Action::Done)
    }

    fn relations(this: &Arc<Self>, r: &mut Relations<'_, Ctx, Decoded<Subnet>>) {
        let views = this.views.clone();
        r.on::<Node>(move |kinds, old, new| {
            let mut out: Vec<Key<Decoded<Subnet>>> = Vec::new();
            // A node's addresses may be what a refused subnet overlapped.
            if old.map(internal_ips) != new.map(internal_ips) {
                out.extend(refused(kinds, &views));
            }
            let ready = |n: Option<&Node>| n.map(gateway::node_ready);
            let join = |n: Option<&Node>| {
                n.and_then(|n| n.annotations().get(crate::annotations::IP_ADDRESS).cloned())
            };
            if join(old) != join(new) {
                // A node's join address, new or changed: every distributed subnet's gateway policy for it.
                out.extend(views.subnet_list().iter().map(|s| Key::cluster(&s.name)));
            } else if ready(old) != ready(new) {
                // A node that comes, goes or changes readiness may be a centralized subnet's gateway.
                out.extend(centralized(kinds));
            }
            out
        });
        // A gateway node down or back: the centralized subnets choose again.
        r.on_signal::<GatewayHealthChanged>(|kinds, g| {
            tracing::debug!(node = %g.0, "gateway node health changed: centralized subnets run again");
            centralized(kinds)
        });
        // A subnet that moved, shrank or went may have freed what a refused one asked for.
        let views = this.views.clone();
        r.on_signal::<SubnetChanged>(move |kinds, c| match (&c.old, &c.new) {
            (Some(o), Some(n)) if o.cidrs == n.cidrs && o.vpc == n.vpc => Vec::new(),
            (Some(_), _) => refused(kinds, &views),
            (None, _) => Vec::new(),
        });
    }
}

async fn reconcile(ctx: &Ctx, obj: &Decoded<Subnet>) -> Result<()> {
    let name = obj.name_any();
    let name = name.as_str();
    let info = match info_from_crd(&ctx.config, obj) {
        Ok(i) => i,
        Err(e) => return refuse(ctx, obj, e).await,
    };
    let before = ctx.subnet(name);
    if let Err(e) = ctx.views.admit(info.clone()) {
        return refuse(ctx, obj, e).await;
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
    }
    if ctx.nb.router(&info.vpc).is_none() {
        // The Vpc's handler creates its router; retried until then.
        return Err(ControllerError::NotReady(format!("vpc {}", info.vpc)));
    }
    let active = reconcile_info(ctx, &info).await?;
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
            patch_subnet_status(
                &ctx.client,
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
    patch_conditions(ctx, name, &st, changed).await
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
    // The table's signal runs the VPC, the namespaces and the refused subnets again.
    ctx.views.remove_subnet(name)?;
    Ok(())
}

/// Behaviour of the subnet reconciler on the test API server and an in-memory northbound.
#[cfg(test)]
mod behaviour {
    /// A test of another kind drives this one through the harness, without naming it: each kind's own tests
    /// extend the harness, so the harness names no kind.
    impl Harness {
        /// Runs the subnet kind for `key`.
        pub(crate) async fn run_subnet(&self, key: Key<Decoded<Subnet>>) -> Result<Action> {
            self.run::<Subnets>(key).await
        }
    }

    use super::*;
    use crate::controller::framework::{Failure, ReconcileError};
    use crate::controller::testing::{config, Harness};
    use crate::controller::Config;
    use crate::crd::VpcSpec;
    use crate::crd::{IpCount, Vpc};
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};
    use kube::api::DeleteParams;
    use kube::api::{Patch, PatchParams};
    use kubeovn_ipam::AllocRequest;
    use kubeovn_ovn::memdb::MemDb;
    use kubeovn_ovn::models::nb::LogicalRouterPolicyAction;
    use kubeovn_ovn::northbound::Northbound;
    use serde_json::json;
    use std::net::IpAddr;

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
        h.run_node(Key::cluster(name)).await.expect("node");
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
        h.run_vpc(Key::cluster("blue")).await.expect("vpc");
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
        h.run_vpc(Key::cluster("blue")).await.expect("vpc");
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
        h.run_node(Key::cluster("n1")).await.expect("node");
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
        let mut h = Harness::start_with(c, MemDb::new_nb(), |_| async {}).await;
        subnet(
            &h,
            "s1",
            json!({ "cidrBlock": "10.70.0.0/24", "excludeIps": ["10.70.0.2..10.70.0.11"] }),
        )
        .await;
        run(&h, "s1").await.expect("s1");
        h.serve_kind::<crate::controller::status::SubnetStatus>();
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
    }
}
