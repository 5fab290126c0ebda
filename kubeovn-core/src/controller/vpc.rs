//! VPCs: one logical router per Vpc (`ovn-cluster` is the default one, created at start), and the Vpc status
//! (router, default, subnets).

use std::sync::Arc;

use kube::api::{Api, Patch, PatchParams, PostParams};

use kube::ResourceExt;
use kubeovn_ovn::northbound::{Batch, Router};

use super::error::{ControllerError, Result};
use super::framework::{Action, Key, Reconciler, Relations};
use super::views::{SubnetChanged, VpcLbsChanged};
use super::Ctx;
use crate::crd::{StatusPatch, Vpc, VpcSpec, VpcStatus};
use crate::naming::{self, external_ids as ext};

/// Creates the default Vpc object if it is missing.
pub(crate) async fn ensure_default(client: &kube::Client, name: &str) -> Result<()> {
    let api: Api<Vpc> = Api::all(client.clone());
    let vpc = Vpc::new(name, VpcSpec::default());
    match api.create(&PostParams::default(), &vpc).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(ControllerError::kube(format!("create vpc {name}"), e)),
    }
}

/// Delay before a Vpc's status follows its Services' load balancers: a burst of Service changes (a
/// restart) becomes one status write per VPC.
const LB_STATUS_DELAY: std::time::Duration = std::time::Duration::from_secs(1);

/// The VPC kind: each Vpc's router and status.
#[derive(Debug, Default)]
pub(crate) struct Vpcs;

#[async_trait::async_trait]
impl Reconciler<Ctx> for Vpcs {
    type Object = Vpc;
    type Error = ControllerError;
    const NAME: &'static str = "vpc";

    async fn reconcile(&self, ctx: &Arc<Ctx>, vpc: Arc<Vpc>) -> Result<Action> {
        reconcile(ctx, &vpc).await.map(|()| Action::Done)
    }

    fn relations(_this: &Arc<Self>, r: &mut Relations<'_, Ctx, Vpc>) {
        // Its subnets (status.subnets) and its Services' load balancers (status.loadBalancers).
        r.on_signal::<SubnetChanged>(|_, c| {
            let mut v: Vec<&str> = c.states().map(|s| s.vpc.as_str()).collect();
            v.dedup();
            v.into_iter().map(Key::cluster).collect()
        });
        r.on_signal_after::<VpcLbsChanged>(LB_STATUS_DELAY, |_, v| vec![Key::cluster(&v.0)]);
    }

    async fn cleanup(&self, ctx: &Arc<Ctx>, key: &Key<Vpc>, _: Option<Arc<Vpc>>) -> Result<Action> {
        if key.name() == ctx.config.default_vpc {
            return Ok(Action::Done);
        }
        let mut b = Batch::new();
        b.delete_router(key.name());
        b.delete_lb_group(naming::lb_group(key.name()));
        ctx.writer.commit(b).await.map(|()| Action::Done)
    }
}

async fn reconcile(ctx: &Ctx, vpc: &Vpc) -> Result<()> {
    let name = vpc.name_any();
    let name = name.as_str();
    let default = name == ctx.config.default_vpc;
    ctx.writer
        .commit({
            let mut b = Batch::new();
            b.add(
                Router::new(name)
                    .external_id(ext::VENDOR, naming::VENDOR)
                    .external_id("vpc", name),
            );
            b
        })
        .await?;
    let subnets: Vec<String> = ctx
        .subnet_list()
        .iter()
        .filter(|s| s.vpc == name)
        .map(|s| s.name.clone())
        .collect();
    let current = vpc.status.clone().unwrap_or_default();
    let status = VpcStatus {
        standby: true,
        default,
        default_logical_switch: if default {
            ctx.config.default_subnet.name.clone()
        } else {
            String::new()
        },
        router: name.to_owned(),
        subnets,
        load_balancer_group: naming::lb_group(name),
        load_balancers: ctx.views.lbs_of(name),
        ..current.clone()
    };
    if status == current {
        return Ok(());
    }
    let api: Api<Vpc> = Api::all(ctx.client.clone());
    match api
        .patch_status(
            &vpc.name_any(),
            &PatchParams::default(),
            &Patch::Merge(StatusPatch { status }),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(ControllerError::kube(format!("patch vpc {name} status"), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::testing::Harness;

    impl Harness {
        /// Runs the VPC kind for `key` (other kinds' tests use it without naming this kind).
        pub(crate) async fn run_vpc(&self, key: Key<Vpc>) -> Result<Action> {
            self.run::<Vpcs>(key).await
        }
    }
    use crate::crd::VpcSpec;
    use kube::api::DeleteParams;
    use kubeovn_ovn::northbound::Northbound;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_vpc_gets_its_router_and_status_and_loses_the_router_with_it() {
        let h = Harness::start().await;
        // The default VPC's router is written at start.
        assert!(h.nb.router("ovn-cluster").is_some());
        let v = h
            .create_cluster(&Vpc::new("blue", VpcSpec::default()))
            .await;
        let key = Key::<Vpc>::cluster("blue");
        assert_eq!(h.run::<Vpcs>(key.clone()).await.expect("run"), Action::Done);
        let r = h.nb.router("blue").expect("router");
        assert_eq!(r.external_ids.get("vpc").map(String::as_str), Some("blue"));
        let got: Vpc = h.get("blue").await.expect("vpc");
        let st = got.status.expect("status");
        assert_eq!(st.router, "blue");
        assert!(st.standby && !st.default);

        let api: Api<Vpc> = Api::all(h.client.clone());
        api.delete("blue", &DeleteParams::default())
            .await
            .expect("delete");
        h.gone(&key).await;
        assert_eq!(
            h.ctx.kinds.tombstone(&key).map(|t| t.metadata.uid.clone()),
            Some(v.metadata.uid.clone()),
            "the cleanup gets the last state"
        );
        h.run::<Vpcs>(key.clone()).await.expect("cleanup");
        assert!(h.nb.router("blue").is_none());
        assert!(h.ctx.kinds.tombstone(&key).is_none());
        // The default VPC's router stays even if its object goes.
        h.run::<Vpcs>(Key::cluster("ovn-cluster"))
            .await
            .expect("run");
        assert!(h.nb.router("ovn-cluster").is_some());
    }
}
