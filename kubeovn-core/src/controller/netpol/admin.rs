//! The AdminNetworkPolicy and BaselineAdminNetworkPolicy kinds, translated together.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::events::EventType;
use kubeovn_ovn::northbound::{AclParent, AclSet, Batch};

use crate::controller::error::ControllerError;
use crate::controller::framework::{Action, Key, Kinds, Reconciler, Relations};
use crate::controller::Ctx;
use crate::netpol::{self, Pods, SetKey, OWNER_KEY};

/// How long a policy's run waits for its sets to be written before it is retried.
use super::state::*;

/// Translates every admin policy and writes each one's ACLs on its subject's port group (Passes make
/// them depend on each other: they are translated together, one run at a time).
async fn sync_admin(ctx: &Arc<Ctx>, st: &NetpolState) -> Result<Action, ControllerError> {
    use crate::crd::{AdminNetworkPolicy, BaselineAdminNetworkPolicy, BASELINE_NAME};
    let _one = st.admin.lock().await;
    let anps = ctx.kinds.list::<AdminNetworkPolicy>();
    let banp = ctx
        .kinds
        .get(&Key::<BaselineAdminNetworkPolicy>::cluster(BASELINE_NAME));
    let refs: Vec<&AdminNetworkPolicy> = anps.iter().map(|a| a.as_ref()).collect();
    let names = |p: &Pods, pr, n: &str| st.numbers(p, pr, n);
    let ts = netpol::admin_policies(&refs, banp.as_deref(), st.families, &names, &st.node_cidrs);
    let known: HashSet<&str> = ts.iter().map(|t| t.owner.as_str()).collect();
    let gone: Vec<String> = st
        .admin_owners()
        .into_iter()
        .filter(|o| !known.contains(o.as_str()))
        .collect();
    let before: HashMap<String, Option<String>> = ts
        .iter()
        .map(|t| t.owner.clone())
        .chain(gone.iter().cloned())
        .map(|o| {
            let p = st.parent_of(&o);
            (o, p)
        })
        .collect();
    let mut generation = 0;
    for t in &ts {
        generation = generation.max(st.hold(&t.owner, None, t, false));
    }
    st.flushed(generation).await?;
    let mut b = Batch::new();
    let clear = |b: &mut Batch, owner: &str, parent: &str| {
        if ctx.nb.port_group(parent).is_some() {
            b.add(AclSet::new(
                AclParent::PortGroup(parent.to_owned()),
                OWNER_KEY,
                owner,
                Vec::new(),
            ));
        }
    };
    for t in &ts {
        let now = t.parent.as_ref().map(SetKey::name);
        if let Some(Some(old)) = before.get(&t.owner) {
            if Some(old) != now.as_ref() {
                clear(&mut b, &t.owner, old);
            }
        }
        if let Some(parent) = now {
            let acls = t
                .acls
                .iter()
                .map(|a| crate::controller::plan::ovn_acl(a, &parent, &t.owner, None))
                .collect();
            b.add(AclSet::new(
                AclParent::PortGroup(parent),
                OWNER_KEY,
                t.owner.as_str(),
                acls,
            ));
        }
    }
    for o in &gone {
        if let Some(Some(old)) = before.get(o) {
            clear(&mut b, o, old);
        }
    }
    ctx.writer.commit(b).await?;
    for t in &ts {
        st.settle(&t.owner);
        let reported = st.swap_problems(&t.owner, t.problems.clone());
        let new: Vec<&String> = t
            .problems
            .iter()
            .filter(|p| !reported.contains(p))
            .collect();
        if new.is_empty() {
            continue;
        }
        let name = t.owner.split_once('/').map(|x| x.1).unwrap_or_default();
        for p in new {
            if t.owner.starts_with("Admin") {
                if let Some(a) = ctx.kinds.get(&Key::<AdminNetworkPolicy>::cluster(name)) {
                    ctx.event(
                        a.as_ref(),
                        EventType::Warning,
                        "AdminNetworkPolicyPartlyApplied",
                        p.clone(),
                    )
                    .await;
                }
            } else if let Some(a) = &banp {
                ctx.event(
                    a.as_ref(),
                    EventType::Warning,
                    "BaselineAdminNetworkPolicyPartlyApplied",
                    p.clone(),
                )
                .await;
            }
        }
    }
    for o in &gone {
        st.forget(o);
    }
    Ok(Action::Done)
}

/// An admin policy kind: both are translated together, so either one's change runs [`sync_admin`].
pub(crate) trait AdminKind: crate::controller::framework::Object {
    /// The kind's name in logs and metrics.
    const NAME: &'static str;
    /// The prefix of its owners (`AdminNetworkPolicy/`).
    const OWNER_PREFIX: &'static str;
}

impl AdminKind for crate::crd::AdminNetworkPolicy {
    const NAME: &'static str = "adminnetworkpolicy";
    const OWNER_PREFIX: &'static str = "AdminNetworkPolicy/";
}

impl AdminKind for crate::crd::BaselineAdminNetworkPolicy {
    const NAME: &'static str = "baselineadminnetworkpolicy";
    const OWNER_PREFIX: &'static str = "BaselineAdminNetworkPolicy/";
}

/// The AdminNetworkPolicy and BaselineAdminNetworkPolicy kinds (every run translates all admin policies, see
/// [`sync_admin`]).
pub(crate) struct AdminPolicies<K> {
    st: Arc<NetpolState>,
    kind: std::marker::PhantomData<fn() -> K>,
}

impl<K> AdminPolicies<K> {
    /// The kind over `st`.
    pub fn new(st: Arc<NetpolState>) -> Self {
        AdminPolicies {
            st,
            kind: std::marker::PhantomData,
        }
    }
}

#[async_trait::async_trait]
impl<K: AdminKind> Reconciler<Ctx> for AdminPolicies<K> {
    type Object = K;
    type Error = ControllerError;
    const NAME: &'static str = K::NAME;

    fn workers(&self, _: &Ctx) -> usize {
        1
    }

    async fn reconcile(&self, ctx: &Arc<Ctx>, _: Arc<K>) -> Result<Action, ControllerError> {
        sync_admin(ctx, &self.st).await
    }

    async fn cleanup(
        &self,
        ctx: &Arc<Ctx>,
        _: &Key<K>,
        _: Option<Arc<K>>,
    ) -> Result<Action, ControllerError> {
        sync_admin(ctx, &self.st).await
    }

    fn relations(this: &Arc<Self>, r: &mut Relations<'_, Ctx, K>) {
        // The admin policies the NetworkPolicy kind's relations found concerned (see there).
        fn keys<K>(st: &NetpolState, prefix: &str) -> Vec<Key<K>> {
            st.take_admin(prefix)
                .iter()
                .filter_map(|o| o.strip_prefix(prefix))
                .map(Key::cluster)
                .collect()
        }
        let st = this.st.clone();
        r.on::<PolicyPod>(move |_: &Kinds, _, _| keys(&st, K::OWNER_PREFIX));
        let st = this.st.clone();
        r.on::<Namespace>(move |_: &Kinds, _, _| keys(&st, K::OWNER_PREFIX));
    }
}
