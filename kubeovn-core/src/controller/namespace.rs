//! Namespaces: the bound-subnet annotations (`logical_switch`, `cidr`, `exclude_ips`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;

use super::error::{ControllerError, Result};
use super::framework::{Action, Key, Kinds, Reconciler, Relations};
use super::views::SubnetChanged;
use super::{Config, Ctx};
use crate::annotations::{merge_patch, NamespaceAnnotations};

/// The annotations a namespace should carry: the subnets naming it, else the default subnet.
pub(crate) fn binding(ctx: &Ctx, ns: &str) -> NamespaceAnnotations {
    let mut bound: Vec<_> = ctx
        .subnet_list()
        .into_iter()
        .filter(|s| s.namespaces.iter().any(|n| n == ns))
        .collect();
    if bound.is_empty() {
        if let Some(d) = ctx.subnet(&ctx.config.default_subnet.name) {
            bound.push(d);
        }
    }
    NamespaceAnnotations {
        logical_switches: bound.iter().map(|s| s.name.clone()).collect(),
        cidrs: bound.iter().map(|s| s.cidrs.clone()).collect(),
        exclude_ips: bound.iter().map(|s| s.exclude_ips.clone()).collect(),
        ip_pools: Vec::new(),
    }
}

/// The namespace kind: each namespace's subnet binding annotations.
#[derive(Debug)]
pub(crate) struct Namespaces {
    /// The default subnet: the binding of namespaces no subnet names.
    default_subnet: String,
}

impl Namespaces {
    /// The kind for the controller's configuration.
    pub fn new(config: &Config) -> Self {
        Namespaces {
            default_subnet: config.default_subnet.name.clone(),
        }
    }
}

#[async_trait::async_trait]
impl Reconciler<Ctx> for Namespaces {
    type Object = Namespace;
    type Error = ControllerError;
    const NAME: &'static str = "namespace";

    async fn reconcile(&self, ctx: &Arc<Ctx>, ns: Arc<Namespace>) -> Result<Action> {
        reconcile(ctx, &ns).await.map(|()| Action::Done)
    }

    async fn cleanup(
        &self,
        _: &Arc<Ctx>,
        _: &Key<Namespace>,
        _: Option<Arc<Namespace>>,
    ) -> Result<Action> {
        // Nothing of a namespace lives outside it.
        Ok(Action::Done)
    }

    fn relations(this: &Arc<Self>, r: &mut Relations<'_, Ctx, Namespace>) {
        // A subnet's change may change the binding of the namespaces its old or new state names, and of
        // every namespace when it is the default subnet (the binding of namespaces no subnet names).
        let default = this.default_subnet.clone();
        r.on_signal::<SubnetChanged>(move |kinds: &Kinds, c| {
            if c.states().any(|s| s.name == default) {
                return kinds
                    .list::<Namespace>()
                    .iter()
                    .map(|n| Key::cluster(&n.name_any()))
                    .collect();
            }
            let mut names: Vec<&String> = c.states().flat_map(|s| s.namespaces.iter()).collect();
            names.sort();
            names.dedup();
            names.into_iter().map(|n| Key::cluster(n)).collect()
        });
    }
}

async fn reconcile(ctx: &Ctx, ns: &Namespace) -> Result<()> {
    let name = ns.name_any();
    let name = name.as_str();
    if ns.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let mut patch = binding(ctx, name).patch();
    let anns = ns.annotations();
    // An IPPool binding written by someone else is kept.
    patch.remove(crate::annotations::IP_POOL);
    if patch
        .iter()
        .all(|(k, v)| anns.get(k).map(String::as_str) == v.as_deref())
    {
        return Ok(());
    }
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(merge_patch(&patch)),
    )
    .await
    .map_err(|e| ControllerError::kube(format!("patch namespace {name}"), e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotations::{CIDR, LOGICAL_SWITCH};
    use crate::controller::testing::Harness;
    use crate::crd::{Decoded, Subnet, SubnetSpec};

    fn ns(name: &str) -> Namespace {
        let mut n = Namespace::default();
        n.metadata.name = Some(name.to_owned());
        n
    }

    async fn annotation(h: &Harness, name: &str, key: &str) -> Option<String> {
        let n: Namespace = h.get(name).await.expect("namespace");
        n.metadata.annotations.and_then(|a| a.get(key).cloned())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn binds_the_default_subnet_then_the_subnet_naming_it() {
        let h = Harness::start().await;
        h.create_cluster(&ns("team")).await;
        let key = Key::<Namespace>::cluster("team");
        assert_eq!(
            h.run::<Namespaces>(key.clone()).await.expect("run"),
            Action::Done
        );
        assert_eq!(
            annotation(&h, "team", LOGICAL_SWITCH).await.as_deref(),
            Some("ovn-default")
        );
        assert_eq!(
            annotation(&h, "team", CIDR).await.as_deref(),
            Some("10.16.0.0/16")
        );

        // A Subnet naming the namespace takes over its binding once the subnet is accepted.
        let s = Subnet::new(
            "team-net",
            SubnetSpec {
                cidr_block: "10.70.0.0/24".into(),
                namespaces: vec!["team".into()],
                ..SubnetSpec::default()
            },
        );
        let api: Api<Subnet> = Api::all(h.client.clone());
        let s = api.create(&Default::default(), &s).await.expect("subnet");
        h.stored(&Decoded::new(s)).await;
        h.run_subnet(Key::cluster("team-net"))
            .await
            .expect("subnet run");
        h.stored(&h.ctx.kinds.get(&key).map(|n| (*n).clone()).expect("ns"))
            .await;
        h.run::<Namespaces>(key.clone()).await.expect("run");
        assert_eq!(
            annotation(&h, "team", LOGICAL_SWITCH).await.as_deref(),
            Some("team-net")
        );
        assert_eq!(
            annotation(&h, "team", CIDR).await.as_deref(),
            Some("10.70.0.0/24")
        );

        // Running again with nothing changed writes nothing (the resource version stays).
        let before: Namespace = h.get("team").await.expect("ns");
        h.until("the store has the patched namespace", || {
            h.ctx
                .kinds
                .get(&key)
                .is_some_and(|n| n.metadata.resource_version == before.metadata.resource_version)
        })
        .await;
        h.run::<Namespaces>(key).await.expect("run");
        let after: Namespace = h.get("team").await.expect("ns");
        assert_eq!(
            before.metadata.resource_version,
            after.metadata.resource_version
        );
    }
}
