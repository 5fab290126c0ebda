//! Namespaces: the bound-subnet annotations (`logical_switch`, `cidr`, `exclude_ips`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;

use super::error::{ControllerError, Result};
use super::framework::{Action, Key, Reconciler};
use super::Ctx;
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
pub(crate) struct Namespaces;

#[async_trait::async_trait]
impl Reconciler<Ctx> for Namespaces {
    type Object = Namespace;
    type Error = ControllerError;
    const NAME: &'static str = "namespace";

    fn workers(ctx: &Ctx) -> usize {
        ctx.config.workers
    }

    async fn reconcile(ctx: &Arc<Ctx>, ns: Arc<Namespace>) -> Result<Action> {
        reconcile(ctx, &ns).await.map(|()| Action::Done)
    }

    async fn cleanup(
        _: &Arc<Ctx>,
        _: &Key<Namespace>,
        _: Option<Arc<Namespace>>,
    ) -> Result<Action> {
        // Nothing of a namespace lives outside it.
        Ok(Action::Done)
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
