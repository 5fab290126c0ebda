//! Tasks on the framework that publish what the controller sees: each Subnet's address counters and ranges
//! ([`SubnetStatus`], once per interval at most instead of once per pod as Kube-OVN does), the queue depths
//! ([`QueueDepths`]) and the log line that says when the pods queued at start are all handled
//! ([`InitialPods`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::api::patch_subnet_status;
use super::error::ControllerError;
use super::framework::{Action, Task};
use super::{Ctx, PodInfo};
use crate::crd::{IpCount, StatusPatch, SubnetUsage};

fn usage_of(stats: &kubeovn_ipam::SubnetStats) -> SubnetUsage {
    SubnetUsage {
        v4_available_ips: IpCount(stats.v4.available),
        v4_using_ips: IpCount(stats.v4.using),
        v4_available_ip_range: stats.v4.available_range.clone(),
        v4_using_ip_range: stats.v4.using_range.clone(),
        v6_available_ips: IpCount(stats.v6.available),
        v6_using_ips: IpCount(stats.v6.using),
        v6_available_ip_range: stats.v6.available_range.clone(),
        v6_using_ip_range: stats.v6.using_range.clone(),
    }
}

/// Publishes each subnet's counters and ranges when they changed, every `status_interval`.
#[derive(Debug, Default)]
pub(crate) struct SubnetStatus {
    /// What was last written, by subnet.
    last: Mutex<HashMap<String, SubnetUsage>>,
}

#[async_trait::async_trait]
impl Task<Ctx> for SubnetStatus {
    type Error = ControllerError;
    const NAME: &'static str = "subnet-status";

    async fn run(&self, ctx: &Arc<Ctx>) -> Result<Action, ControllerError> {
        let every = Action::Requeue(ctx.config.status_interval);
        for s in ctx.subnet_list() {
            let Ok(stats) = ctx.ipam.stats(&s.name) else {
                continue;
            };
            ctx.metrics
                .ipam_usage(&s.name, "ipv4", stats.v4.using, stats.v4.available);
            ctx.metrics
                .ipam_usage(&s.name, "ipv6", stats.v6.using, stats.v6.available);
            let v = usage_of(&stats);
            let same = self
                .last
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&s.name)
                == Some(&v);
            if same {
                continue;
            }
            let patch = StatusPatch { status: v };
            match patch_subnet_status(&ctx.client, &s.name, &patch).await {
                Ok(()) => {
                    self.last
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(s.name.clone(), patch.status);
                }
                Err(e) => tracing::debug!(subnet = %s.name, error = %e, "subnet status"),
            }
        }
        Ok(every)
    }
}

/// Publishes each queue's depth every second.
#[derive(Debug, Default)]
pub(crate) struct QueueDepths;

#[async_trait::async_trait]
impl Task<Ctx> for QueueDepths {
    type Error = ControllerError;
    const NAME: &'static str = "queue-depths";

    async fn run(&self, ctx: &Arc<Ctx>) -> Result<Action, ControllerError> {
        ctx.kinds.publish_depths(&ctx.metrics);
        Ok(Action::Requeue(Duration::from_secs(1)))
    }
}

/// Logs when the pods queued at start have all been handled (the first time the pod queue is idle).
#[derive(Debug)]
pub(crate) struct InitialPods {
    started: std::time::Instant,
}

impl InitialPods {
    /// Counting from `started`.
    pub fn new(started: std::time::Instant) -> Self {
        InitialPods { started }
    }
}

#[async_trait::async_trait]
impl Task<Ctx> for InitialPods {
    type Error = ControllerError;
    const NAME: &'static str = "initial-pods";

    async fn run(&self, ctx: &Arc<Ctx>) -> Result<Action, ControllerError> {
        if !ctx.kinds.is_idle::<PodInfo>() {
            return Ok(Action::Requeue(Duration::from_millis(10)));
        }
        tracing::info!(
            pods = ctx.pods().len(),
            elapsed_ms = self.started.elapsed().as_millis() as u64,
            "initial pods handled"
        );
        Ok(Action::Done)
    }
}
