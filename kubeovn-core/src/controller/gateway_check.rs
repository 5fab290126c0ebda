//! The gateway check, a task on the framework: every [`super::Config::gateway_check_interval`] it probes the
//! join address of every gateway node of every centralized subnet ([`GatewayProbe`]; the real one is an
//! ICMP echo), records what it found in the views' [`super::gateway::GatewayHealth`], and signals a node
//! that went down or came back ([`GatewayHealthChanged`]) so the subnets it serves move their egress.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use super::error::ControllerError;
use super::framework::{Action, Task};
use super::gateway::{candidates, centralized};
use super::plan::SubnetInfo;
use super::views::GatewayHealthChanged;
use super::Ctx;

/// What a probe of a gateway node found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeResult {
    /// It answered.
    Answered,
    /// It did not answer in time.
    NoReply,
    /// This controller cannot check (no raw socket): the node is judged by its Ready condition alone.
    CannotCheck(String),
}

/// Checks whether a gateway node's join address answers within `wait`.
#[async_trait::async_trait]
pub trait GatewayProbe: Send + Sync + 'static {
    /// One check.
    async fn probe(&self, ip: IpAddr, wait: Duration) -> ProbeResult;
}

/// The real probe: an ICMP echo over a raw socket.
#[derive(Debug, Default, Clone, Copy)]
pub struct IcmpProbe;

#[async_trait::async_trait]
impl GatewayProbe for IcmpProbe {
    async fn probe(&self, ip: IpAddr, wait: Duration) -> ProbeResult {
        let r = tokio::task::spawn_blocking(move || {
            kubeovn_netdev::icmp::ping(ip, wait, Duration::from_millis(100))
        })
        .await;
        match r {
            Ok(Ok(_)) => ProbeResult::Answered,
            Ok(Err(kubeovn_netdev::icmp::PingError::NoReply(_))) => ProbeResult::NoReply,
            Ok(Err(e @ kubeovn_netdev::icmp::PingError::Socket(_))) => {
                ProbeResult::CannotCheck(e.to_string())
            }
            Err(e) => ProbeResult::CannotCheck(e.to_string()),
        }
    }
}

/// The gateway check task.
pub(crate) struct GatewayCheck {
    probe: Arc<dyn GatewayProbe>,
}

impl GatewayCheck {
    /// A check through `probe`.
    pub fn new(probe: Arc<dyn GatewayProbe>) -> Self {
        GatewayCheck { probe }
    }
}

#[async_trait::async_trait]
impl Task<Ctx> for GatewayCheck {
    type Error = ControllerError;
    const NAME: &'static str = "gateway-check";

    async fn run(&self, ctx: &Arc<Ctx>) -> Result<Action, ControllerError> {
        let interval = ctx.config.gateway_check_interval;
        let started = tokio::time::Instant::now();
        // One round per interval, however long the round's probes waited.
        let next = move || {
            Action::Requeue(
                interval
                    .saturating_sub(started.elapsed())
                    .max(Duration::from_millis(10)),
            )
        };
        let nodes = ctx.nodes();
        let subnets: Vec<Arc<SubnetInfo>> = ctx
            .views
            .subnet_list()
            .into_iter()
            .filter(|s| centralized(s, &ctx.config.default_vpc))
            .collect();
        let mut names: Vec<String> = subnets.iter().flat_map(|s| candidates(s, &nodes)).collect();
        names.sort();
        names.dedup();
        ctx.views.gateways.retain(&names);
        if names.is_empty() {
            return Ok(next());
        }
        let join_ips = ctx.views.node_join_ips();
        // Answered within most of the interval, or it counts as a miss.
        let wait = interval.mul_f32(0.8).max(Duration::from_millis(100));
        let checks = names.iter().filter_map(|n| {
            let ip = join_ips.iter().find(|(m, _)| m == n)?.1.first().copied()?;
            let probe = self.probe.clone();
            let n = n.clone();
            Some(async move { (n, probe.probe(ip, wait).await) })
        });
        for (name, r) in futures::future::join_all(checks).await {
            let ok = match r {
                ProbeResult::Answered => true,
                ProbeResult::NoReply => false,
                ProbeResult::CannotCheck(e) => {
                    tracing::debug!(node = %name, error = %e, "gateway node not checked");
                    continue;
                }
            };
            if ctx.views.gateways.record(&name, ok) {
                if ok {
                    tracing::info!(node = %name, "gateway node answers again");
                } else {
                    tracing::warn!(node = %name, "gateway node stopped answering");
                }
                ctx.kinds.emit(&GatewayHealthChanged(name));
            }
        }
        Ok(next())
    }
}
