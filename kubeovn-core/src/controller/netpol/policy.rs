//! The NetworkPolicy kind: each policy's ACLs on its namespace's isolation groups.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::events::EventType;
use kubeovn_ovn::northbound::{AclDirection, AclParent, AclSet, Batch, Meter, MeterUnit};

use crate::controller::error::ControllerError;
use crate::controller::framework::{Action, Key, Kinds, Reconciler, Relations};
use crate::controller::Ctx;
use crate::netpol::{self, namespace_group, Direction, Pods, Translation, OWNER_KEY};

/// How long a policy's run waits for its sets to be written before it is retried.
use super::state::*;

/// The NetworkPolicy kind. Its state, the sets policies name and their members, is shared with the admin
/// kinds and the flusher (one feature, one state).
pub(crate) struct NetworkPolicies {
    st: Arc<NetpolState>,
}

impl NetworkPolicies {
    /// The kind over `st`.
    pub fn new(st: Arc<NetpolState>) -> Self {
        NetworkPolicies { st }
    }
}

/// Writes `owner`'s ACLs on its namespace's groups (`acls` empty: removes them).
async fn write_acls(
    ctx: &Ctx,
    owner: &str,
    ns: &str,
    t: Option<&Translation>,
) -> Result<(), ControllerError> {
    let mut b = Batch::new();
    let meter = t.and_then(|t| t.logging.rate).map(|r| {
        let m = meter_name(owner);
        b.add(Meter::new(&m, MeterUnit::Pktps, r, 0));
        m
    });
    for dir in [Direction::Ingress, Direction::Egress] {
        let group = namespace_group(ns, dir);
        let isolates = t.is_some_and(|t| t.isolates.iter().any(|(d, _)| *d == dir));
        if !isolates && ctx.nb.port_group(&group).is_none() {
            continue;
        }
        let acls = t
            .filter(|_| isolates)
            .map(|t| {
                t.acls
                    .iter()
                    .filter(|a| a.direction == dir)
                    .map(|a| crate::controller::plan::ovn_acl(a, &group, owner, meter.as_deref()))
                    .collect()
            })
            .unwrap_or_default();
        b.add(AclSet::new(
            AclParent::PortGroup(group),
            OWNER_KEY,
            owner,
            acls,
        ));
    }
    if meter.is_none() && ctx.nb.meter(&meter_name(owner)).is_some() {
        b.delete_meter(meter_name(owner));
    }
    ctx.writer.commit(b).await
}

/// Whether `owner`'s ACLs in NB are those of `t` (the same direction, priority and match each).
fn acls_written(ctx: &Ctx, owner: &str, ns: &str, t: &Translation) -> bool {
    [Direction::Ingress, Direction::Egress]
        .into_iter()
        .all(|dir| {
            let group = namespace_group(ns, dir);
            let key = |d: &AclDirection, p: i64, m: &str| (d.as_str().to_owned(), p, m.to_owned());
            let mut want: Vec<_> = t
                .acls
                .iter()
                .filter(|a| a.direction == dir)
                .map(|a| crate::controller::plan::ovn_acl(a, &group, owner, None))
                .map(|a| key(&a.direction, a.priority, &a.match_))
                .collect();
            let mut have: Vec<_> = ctx
                .nb
                .acls(&AclParent::PortGroup(group))
                .iter()
                .filter(|a| a.external_ids.get(OWNER_KEY).map(String::as_str) == Some(owner))
                .map(|a| key(&a.direction, a.priority, &a.match_))
                .collect();
            want.sort();
            have.sort();
            want == have
        })
}

/// Removes `owner`'s ACLs: its isolation first, so that its pods are never left dropped without its allows.
/// `refused`: the policy stays, refused (else it was deleted).
async fn remove(
    ctx: &Ctx,
    st: &NetpolState,
    owner: &str,
    ns: &str,
    refused: bool,
) -> Result<(), ControllerError> {
    st.flushed(st.withdraw(owner)).await?;
    write_acls(ctx, owner, ns, None).await?;
    st.forget(owner);
    let mut g = st.lock();
    if refused {
        g.refused.insert(owner.to_owned());
    } else {
        g.refused.remove(owner);
    }
    let before = g.generation;
    g.undefer(ns);
    let after = g.generation;
    drop(g);
    st.wake_if(before, after);
    Ok(())
}

#[async_trait::async_trait]
impl Reconciler<Ctx> for NetworkPolicies {
    type Object = NetworkPolicy;
    type Error = ControllerError;
    const NAME: &'static str = "networkpolicy";

    fn workers(&self, ctx: &Ctx) -> usize {
        ctx.config.pod_workers
    }

    async fn reconcile(
        &self,
        ctx: &Arc<Ctx>,
        np: Arc<NetworkPolicy>,
    ) -> Result<Action, ControllerError> {
        let key = Key::of(np.as_ref());
        let owner = owner_of(&key);
        let ns = key.namespace().unwrap_or_default().to_owned();
        let st = &*self.st;
        let t = match netpol::network_policy(&np, st.families, &|p: &Pods, pr, n: &str| {
            st.numbers(p, pr, n)
        }) {
            Ok(t) => t,
            Err(e) => {
                ctx.event(
                    np.as_ref(),
                    EventType::Warning,
                    "InvalidNetworkPolicy",
                    e.to_string(),
                )
                .await;
                // Not enforced at all is what Kubernetes would do with a policy it refused.
                remove(ctx, st, &owner, &ns, true).await?;
                return Ok(Action::Done);
            }
        };
        let generation = st.hold(&owner, Some(&ns), &t, acls_written(ctx, &owner, &ns, &t));
        st.flushed(generation).await?;
        write_acls(ctx, &owner, &ns, Some(&t)).await?;
        // Its isolation joins with the next flush; nothing waits for it.
        st.settle(&owner);
        let before = st.swap_problems(&owner, t.problems.clone());
        for p in &t.problems {
            if !before.contains(p) {
                ctx.event(
                    np.as_ref(),
                    EventType::Warning,
                    "NetworkPolicyPartlyApplied",
                    p.clone(),
                )
                .await;
            }
        }
        Ok(Action::Done)
    }

    async fn cleanup(
        &self,
        ctx: &Arc<Ctx>,
        key: &Key<NetworkPolicy>,
        _last: Option<Arc<NetworkPolicy>>,
    ) -> Result<Action, ControllerError> {
        remove(
            ctx,
            &self.st,
            &owner_of(key),
            key.namespace().unwrap_or_default(),
            false,
        )
        .await?;
        Ok(Action::Done)
    }

    fn relations(this: &Arc<Self>, r: &mut Relations<'_, Ctx, NetworkPolicy>) {
        // These relations feed the membership (the sets' members follow pods, namespaces and nodes) and
        // run the policies a change concerns; the admin policies among them are left for the admin kinds'
        // relations, which run after these (registered later).
        let st = this.st.clone();
        r.on::<PolicyPod>(move |_: &Kinds, old, new| st.split_owners(st.pod_event(old, new)));
        let st = this.st.clone();
        r.on::<Namespace>(move |_: &Kinds, old, new| st.split_owners(st.namespace_event(old, new)));
        let st = this.st.clone();
        r.on::<Node>(move |_: &Kinds, old, new| {
            st.node_event(old, new);
            Vec::new()
        });
    }
}
