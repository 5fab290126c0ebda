//! IPPools: a pool's addresses reserved in its subnet for the pods and namespaces that name it.

use std::sync::Arc;

use kube::runtime::events::EventType;
use kube::ResourceExt;

use super::error::{ControllerError, Result};
use super::framework::{Action, Key, Reconciler, Relations};
use super::views::SubnetChanged;
use super::Ctx;
use crate::crd::{Decoded, IPPool};

/// The IPPool kind: each pool's addresses reserved in its subnet for the pods and namespaces naming it.
#[derive(Debug, Default)]
pub(crate) struct Pools;

#[async_trait::async_trait]
impl Reconciler<Ctx> for Pools {
    type Object = Decoded<IPPool>;
    type Error = ControllerError;
    const NAME: &'static str = "ippool";

    fn relations(_this: &Arc<Self>, r: &mut Relations<'_, Ctx, Decoded<IPPool>>) {
        // A subnet loaded (new, or back after a delete): its pools were loaded with it, or refused; each is
        // run again to say which.
        r.on_signal::<SubnetChanged>(|kinds, c| {
            if c.old.is_some() || c.new.is_none() {
                return Vec::new();
            }
            kinds
                .list::<Decoded<IPPool>>()
                .iter()
                .filter(|p| p.object.spec.subnet == c.name())
                .map(|p| Key::cluster(&p.name_any()))
                .collect()
        });
    }

    async fn reconcile(&self, ctx: &Arc<Ctx>, p: Arc<Decoded<IPPool>>) -> Result<Action> {
        if let Err(e) = ctx.views.install_pool(&p) {
            ctx.event(
                p.as_ref(),
                EventType::Warning,
                "InvalidIPPool",
                e.to_string(),
            )
            .await;
            return Err(e);
        }
        Ok(Action::Done)
    }

    async fn cleanup(
        &self,
        ctx: &Arc<Ctx>,
        key: &Key<Decoded<IPPool>>,
        _: Option<Arc<Decoded<IPPool>>>,
    ) -> Result<Action> {
        ctx.views.remove_pool(key.name())?;
        Ok(Action::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::framework::{Failure, ReconcileError};
    use crate::controller::testing::Harness;
    use crate::crd::Subnet;
    use kube::api::{Api, DeleteParams, Patch, PatchParams};
    use kubeovn_ipam::AllocRequest;
    use serde_json::json;
    use std::net::IpAddr;

    /// A harness with the subnet `s1` (10.70.0.0/24) accepted.
    async fn with_subnet() -> Harness {
        let h = Harness::start().await;
        h.create_raw::<Subnet>(
            json!({ "metadata": { "name": "s1" }, "spec": { "cidrBlock": "10.70.0.0/24" } }),
        )
        .await;
        h.run_subnet(Key::cluster("s1")).await.expect("subnet");
        h
    }

    async fn pool(h: &Harness, name: &str, spec: serde_json::Value) -> Result<Action> {
        h.create_raw::<IPPool>(json!({ "metadata": { "name": name }, "spec": spec }))
            .await;
        h.run::<Pools>(Key::cluster(name)).await
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn in_pool(a: IpAddr) -> bool {
        (ip("10.70.0.10")..=ip("10.70.0.19")).contains(&a)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pool_reserves_its_addresses_for_its_pods_until_deleted() {
        let h = with_subnet().await;
        let r = pool(
            &h,
            "p1",
            json!({ "subnet": "s1", "ips": ["10.70.0.10..10.70.0.19"] }),
        )
        .await;
        assert_eq!(r.expect("pool"), Action::Done);

        // A pod of the pool gets one of its addresses.
        let a = h
            .ctx
            .ipam
            .allocate("s1", &AllocRequest::new("a.ns", "a.ns").pool("p1"))
            .expect("pool pod");
        assert!(in_pool(a.ips().next().expect("ip")), "{a:?}");
        // A pod of no pool does not get one.
        let mut others = Vec::new();
        for i in 0..40 {
            let p = format!("o{i}.ns");
            let a = h
                .ctx
                .ipam
                .allocate("s1", &AllocRequest::new(&p, &p))
                .expect("other");
            others.push(a.ips().next().expect("ip"));
        }
        assert!(!others.iter().copied().any(in_pool), "{others:?}");
        // Nor a pod of another pool, even when that pool is used up.
        pool(
            &h,
            "p2",
            json!({ "subnet": "s1", "ips": ["10.70.0.100..10.70.0.101"] }),
        )
        .await
        .expect("p2");
        for i in 0..2 {
            let p = format!("q{i}.ns");
            h.ctx
                .ipam
                .allocate("s1", &AllocRequest::new(&p, &p).pool("p2"))
                .expect("p2 pod");
        }
        let full = h
            .ctx
            .ipam
            .allocate("s1", &AllocRequest::new("q2.ns", "q2.ns").pool("p2"));
        assert!(full.is_err(), "{full:?}");
        let asked = [ip("10.70.0.12")];

        // Deleted: its addresses are free for anyone.
        Api::<IPPool>::all(h.client.clone())
            .delete("p1", &DeleteParams::default())
            .await
            .expect("delete");
        let key = Key::<Decoded<IPPool>>::cluster("p1");
        h.gone(&key).await;
        assert_eq!(h.run::<Pools>(key).await.expect("cleanup"), Action::Done);
        assert!(!h.ctx.views.has_pool("p1"));
        let b = h
            .ctx
            .ipam
            .allocate("s1", &AllocRequest::new("b.ns", "b.ns").static_ips(&asked))
            .expect("free now");
        assert_eq!(b.ips().collect::<Vec<_>>(), asked);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pool_comes_back_with_its_subnet() {
        let h = with_subnet().await;
        pool(
            &h,
            "p1",
            json!({ "subnet": "s1", "ips": ["10.70.0.10..10.70.0.19"] }),
        )
        .await
        .expect("pool");
        let api: Api<Subnet> = Api::all(h.client.clone());
        api.delete("s1", &DeleteParams::default())
            .await
            .expect("delete");
        let key = Key::<Decoded<Subnet>>::cluster("s1");
        h.gone(&key).await;
        h.run_subnet(key.clone()).await.expect("cleanup");
        h.create_raw::<Subnet>(
            json!({ "metadata": { "name": "s1" }, "spec": { "cidrBlock": "10.70.0.0/24" } }),
        )
        .await;
        h.run_subnet(key).await.expect("subnet again");
        // The pool's addresses are reserved again as soon as the subnet is back, without the pool changing.
        let a = h
            .ctx
            .ipam
            .allocate("s1", &AllocRequest::new("a.ns", "a.ns").pool("p1"))
            .expect("pool pod");
        assert!(in_pool(a.ips().next().expect("ip")), "{a:?}");
        let b = h
            .ctx
            .ipam
            .allocate("s1", &AllocRequest::new("b.ns", "b.ns"))
            .expect("other pod");
        assert!(!in_pool(b.ips().next().expect("ip")), "{b:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_bad_pool_is_refused_with_an_event_until_it_changes() {
        let h = with_subnet().await;
        for (name, spec, words) in [
            (
                "outside",
                json!({ "subnet": "s1", "ips": ["10.80.0.1"] }),
                "10.80.0.1",
            ),
            (
                "bad",
                json!({ "subnet": "s1", "ips": "10.70.0.1" }),
                "spec.ips",
            ),
        ] {
            let e = pool(&h, name, spec).await.expect_err("refused");
            assert!(e.to_string().contains(words), "{name}: {e}");
            assert_eq!(e.failure(), Failure::Permanent, "{name}: {e}");
            assert!(!h.ctx.views.has_pool(name));
            let events = h.events("InvalidIPPool").await;
            assert!(
                events
                    .iter()
                    .any(|ev| ev.type_.as_deref() == Some("Warning")
                        && ev.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)),
                "no event on {name}: {events:?}"
            );
        }
        // Nothing of the refused pools was reserved.
        assert!(h.ctx.ipam.stats("s1").expect("stats").pools.is_empty());

        // Fixed, it is accepted.
        let fixed = Api::<IPPool>::all(h.client.clone())
            .patch(
                "outside",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "ips": ["10.70.0.50"] } })),
            )
            .await
            .expect("patch");
        h.stored(&Decoded::new(fixed)).await;
        let key = Key::<Decoded<IPPool>>::cluster("outside");
        assert_eq!(h.run::<Pools>(key).await.expect("fixed"), Action::Done);
        let st = h.ctx.ipam.stats("s1").expect("stats");
        assert_eq!(st.pools.len(), 1);

        // A pool whose subnet is not there yet is retried (not refused), and loaded once the subnet is.
        let e = pool(
            &h,
            "early",
            json!({ "subnet": "later", "ips": ["10.71.0.5"] }),
        )
        .await
        .expect_err("no subnet yet");
        assert_eq!(e.failure(), Failure::Transient, "{e}");
        h.create_raw::<Subnet>(
            json!({ "metadata": { "name": "later" }, "spec": { "cidrBlock": "10.71.0.0/24" } }),
        )
        .await;
        h.run_subnet(Key::cluster("later")).await.expect("later");
        let key = Key::<Decoded<IPPool>>::cluster("early");
        assert_eq!(h.run::<Pools>(key).await.expect("early"), Action::Done);
        let a = h
            .ctx
            .ipam
            .allocate("later", &AllocRequest::new("e.ns", "e.ns").pool("early"))
            .expect("pool pod");
        assert_eq!(a.ips().collect::<Vec<_>>(), [ip("10.71.0.5")]);
    }
}
