//! Is the pod's gateway reachable from inside the pod?
//!
//! Kube-OVN's daemon arpings the gateway until it answers: before that, the pod's first packets may be dropped
//! because ovn-controller has not installed the port's flows yet. [`IcmpGatewayProbe`] sends ICMP echo requests
//! from the pod's namespace every few milliseconds until one is answered: the kernel resolves the gateway's
//! MAC first (ARP or neighbour discovery), so a reply proves both the ARP answer and the logical router's
//! forwarding, for one raw socket and no packet crafting below the IP layer.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nix::sched::{setns, CloneFlags};

/// The gateway check's seam.
#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub trait GatewayProbe: Send + Sync {
    /// Waits, at most `timeout`, until `gateway` answers from inside the namespace at `netns` (through the
    /// pod's interface `ifname`); returns how long it took, or why not.
    async fn probe(
        &self,
        netns: &Path,
        ifname: &str,
        gateway: IpAddr,
        timeout: Duration,
    ) -> Result<Duration, String>;
}

/// No check: every gateway "answers" at once.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoGatewayProbe;

#[async_trait]
impl GatewayProbe for NoGatewayProbe {
    async fn probe(&self, _: &Path, _: &str, _: IpAddr, _: Duration) -> Result<Duration, String> {
        Ok(Duration::ZERO)
    }
}

/// ICMP echo from inside the pod's namespace, on a short-lived thread that enters it (`setns`): the thread
/// exits afterwards, so no pooled thread is ever left in a pod's namespace.
#[derive(Debug, Clone, Copy)]
pub struct IcmpGatewayProbe {
    /// Interval between echo requests.
    pub interval: Duration,
}

impl Default for IcmpGatewayProbe {
    fn default() -> Self {
        IcmpGatewayProbe {
            interval: Duration::from_millis(10),
        }
    }
}

/// Sets the interface's neighbour retransmit time for the probe's duration and restores it on drop: the kernel
/// queues our echo requests behind an unanswered ARP/NS and solicits again only after `retrans_time_ms`
/// (1 s by default), so a first solicitation lost while flows settle would cost a whole second.
struct RetransTime {
    path: Option<PathBuf>,
    old: String,
}

impl RetransTime {
    fn lower(v6: bool, ifname: &str, ms: u128) -> RetransTime {
        let fam = if v6 { "ipv6" } else { "ipv4" };
        let path = PathBuf::from(format!(
            "/proc/sys/net/{fam}/neigh/{ifname}/retrans_time_ms"
        ));
        match std::fs::read_to_string(&path) {
            Ok(old) if std::fs::write(&path, ms.to_string()).is_ok() => RetransTime {
                path: Some(path),
                old: old.trim().to_owned(),
            },
            _ => RetransTime {
                path: None,
                old: String::new(),
            },
        }
    }
}

impl Drop for RetransTime {
    fn drop(&mut self) {
        if let Some(p) = &self.path {
            let _ = std::fs::write(p, &self.old);
        }
    }
}

fn probe_blocking(
    netns: &Path,
    ifname: &str,
    gateway: IpAddr,
    timeout: Duration,
    interval: Duration,
) -> Result<Duration, String> {
    let t0 = Instant::now();
    let f = std::fs::File::open(netns).map_err(|e| format!("open {}: {e}", netns.display()))?;
    setns(&f, CloneFlags::CLONE_NEWNET).map_err(|e| format!("setns {}: {e}", netns.display()))?;
    let v6 = gateway.is_ipv6();
    // /proc/sys/net follows the calling thread's namespace, which is now the pod's.
    let _retrans = (!ifname.contains('/') && !ifname.starts_with('.'))
        .then(|| RetransTime::lower(v6, ifname, (interval.as_millis() * 5).max(20)));
    kubeovn_netdev::icmp::ping(gateway, timeout.saturating_sub(t0.elapsed()), interval)
        .map(|_| t0.elapsed())
        .map_err(|e| e.to_string())
}

#[async_trait]
impl GatewayProbe for IcmpGatewayProbe {
    async fn probe(
        &self,
        netns: &Path,
        ifname: &str,
        gateway: IpAddr,
        timeout: Duration,
    ) -> Result<Duration, String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let path: PathBuf = netns.to_owned();
        let ifname = ifname.to_owned();
        let interval = self.interval;
        std::thread::Builder::new()
            .name("gw-probe".into())
            .spawn(move || {
                let _ = tx.send(probe_blocking(&path, &ifname, gateway, timeout, interval));
            })
            .map_err(|e| format!("spawn probe thread: {e}"))?;
        rx.await
            .unwrap_or_else(|_| Err("probe thread ended without an answer".into()))
    }
}
