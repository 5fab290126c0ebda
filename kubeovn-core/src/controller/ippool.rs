//! IPPools: a pool's addresses reserved in its subnet for the pods and namespaces that name it.

use std::sync::Arc;

use kube::runtime::events::EventType;
use kube::ResourceExt;
use kubeovn_ipam::PoolSpec;

use super::error::{ControllerError, Result};
use super::framework::{Action, Key, Reconciler};
use super::Ctx;
use crate::crd::{Decoded, IPPool};

/// Loads an IPPool into the allocator.
pub(crate) fn install_pool(ctx: &Ctx, p: &Decoded<IPPool>) -> Result<()> {
    let name = p.name_any();
    if let Some(e) = &p.spec_error {
        return Err(ControllerError::invalid(
            format!("ippool {name}"),
            e.clone(),
        ));
    }
    let subnet = p.object.spec.subnet.clone();
    let ips = p.object.spec.ips.clone();
    ctx.ipam
        .add_or_update_pool(&subnet, &PoolSpec::new(&name, ips.iter().cloned()))?;
    ctx.pools
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(name, (subnet, ips));
    Ok(())
}

/// The IPPool kind: each pool's addresses reserved in its subnet for the pods and namespaces naming it.
pub(crate) struct Pools;

#[async_trait::async_trait]
impl Reconciler<Ctx> for Pools {
    type Object = Decoded<IPPool>;
    type Error = ControllerError;
    const NAME: &'static str = "ippool";

    fn workers(ctx: &Ctx) -> usize {
        ctx.config.workers
    }

    async fn reconcile(ctx: &Arc<Ctx>, p: Arc<Decoded<IPPool>>) -> Result<Action> {
        if let Err(e) = install_pool(ctx, &p) {
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
        ctx: &Arc<Ctx>,
        key: &Key<Decoded<IPPool>>,
        _: Option<Arc<Decoded<IPPool>>>,
    ) -> Result<Action> {
        let name = key.name();
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
        Ok(Action::Done)
    }
}
