//! Is the pod's gateway reachable from inside the pod?
//!
//! Kube-OVN's daemon arpings the gateway until it answers: before that, the pod's first packets may be dropped
//! because ovn-controller has not installed the port's flows yet. [`IcmpGatewayProbe`] sends ICMP echo requests
//! from the pod's namespace every few milliseconds until one is answered: the kernel resolves the gateway's
//! MAC first (ARP or neighbour discovery), so a reply proves both the ARP answer and the logical router's
//! forwarding, for one raw socket and no packet crafting below the IP layer.

use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nix::sched::{setns, CloneFlags};
use socket2::{Domain, Protocol, Socket, Type};

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

static NEXT_ID: AtomicU16 = AtomicU16::new(1);

fn checksum(data: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in data.chunks(2) {
        let w = if c.len() == 2 {
            u16::from_be_bytes([c[0], c[1]])
        } else {
            u16::from_be_bytes([c[0], 0])
        };
        sum += u32::from(w);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An echo request: type, code, checksum (v4 only; the kernel fills ICMPv6's), identifier, sequence, payload.
fn echo_request(v6: bool, id: u16, seq: u16) -> Vec<u8> {
    let mut p = vec![if v6 { 128 } else { 8 }, 0, 0, 0];
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(b"kube-ovn-gw-check");
    if !v6 {
        let c = checksum(&p);
        p[2..4].copy_from_slice(&c.to_be_bytes());
    }
    p
}

/// Whether `pkt` (as a raw socket returns it: with the IPv4 header, without the IPv6 one) is an echo reply
/// with identifier `id`.
fn is_reply(v6: bool, pkt: &[u8], id: u16) -> bool {
    let icmp = if v6 {
        pkt
    } else {
        let Some(&b) = pkt.first() else { return false };
        let ihl = usize::from(b & 0x0f) * 4;
        if b >> 4 != 4 || ihl < 20 || pkt.len() < ihl {
            return false;
        }
        &pkt[ihl..]
    };
    icmp.len() >= 8
        && icmp[0] == if v6 { 129 } else { 0 }
        && icmp[1] == 0
        && u16::from_be_bytes([icmp[4], icmp[5]]) == id
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
    let (domain, proto) = if v6 {
        (Domain::IPV6, Protocol::ICMPV6)
    } else {
        (Domain::IPV4, Protocol::ICMPV4)
    };
    let sock =
        Socket::new(domain, Type::RAW, Some(proto)).map_err(|e| format!("raw socket: {e}"))?;
    // connect() filters what the raw socket receives down to the gateway's packets.
    sock.connect(&SocketAddr::new(gateway, 0).into())
        .map_err(|e| format!("connect {gateway}: {e}"))?;
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let mut seq = 0u16;
    let mut buf = [0u8; 2048];
    let mut sock_r = &sock;
    let mut next_send = Instant::now();
    let deadline = t0 + timeout;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(format!("no echo reply from {gateway} in {timeout:?}"));
        }
        if now >= next_send {
            seq = seq.wrapping_add(1);
            // A send can fail while the neighbour is unresolved (EHOSTUNREACH after failed ARP): retry.
            let _ = sock.send(&echo_request(v6, id, seq));
            next_send = now + interval;
        }
        let wait = next_send
            .min(deadline)
            .saturating_duration_since(Instant::now());
        sock.set_read_timeout(Some(wait.max(Duration::from_millis(1))))
            .map_err(|e| format!("socket timeout: {e}"))?;
        match sock_r.read(&mut buf) {
            Ok(n) if is_reply(v6, &buf[..n], id) => return Ok(t0.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            // ICMP errors (host unreachable) surface on connected raw sockets: keep trying until the deadline.
            Err(_) => {
                std::thread::sleep(interval.min(deadline.saturating_duration_since(Instant::now())))
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_packets() {
        let p = echo_request(false, 0x1234, 7);
        assert_eq!(checksum(&p), 0, "a valid checksum sums to zero");
        let mut reply = vec![0x45u8];
        reply.resize(20, 0);
        let mut icmp = p.clone();
        icmp[0] = 0;
        reply.extend_from_slice(&icmp);
        assert!(is_reply(false, &reply, 0x1234));
        assert!(!is_reply(false, &reply, 0x1235));
        assert!(!is_reply(false, &reply[..10], 0x1234));
        assert!(!is_reply(false, &[], 0x1234));
        let mut v6 = echo_request(true, 9, 1);
        assert_eq!(v6[0], 128);
        v6[0] = 129;
        assert!(is_reply(true, &v6, 9));
        assert!(!is_reply(true, &p, 9));
    }
}
