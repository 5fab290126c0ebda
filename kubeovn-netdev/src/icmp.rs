//! ICMP echo, for the checks that a gateway answers: the packets (pure), and with the `icmp` feature a
//! blocking `ping` over a raw socket (root or CAP_NET_RAW) in the calling thread's network namespace (run
//! it on a thread that entered, with `setns`, the namespace to probe from). Kube-OVN's daemon asks a pod's
//! gateway from inside the pod; the controller asks a gateway node's join address.
//!
//! ```
//! use kubeovn_netdev::icmp::{checksum, echo_request};
//! let p = echo_request(false, 0x1234, 1);
//! assert_eq!(checksum(&p), 0, "a valid checksum sums to zero");
//! ```

/// The Internet checksum (RFC 1071) of `data`.
pub fn checksum(data: &[u8]) -> u16 {
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
    // The fold above leaves at most 16 bits.
    !u16::try_from(sum).unwrap_or(u16::MAX)
}

/// An echo request: type, code, checksum (v4 only; the kernel fills ICMPv6's), identifier, sequence, payload.
pub fn echo_request(v6: bool, id: u16, seq: u16) -> Vec<u8> {
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
pub fn is_reply(v6: bool, pkt: &[u8], id: u16) -> bool {
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

/// Why [`ping`] got no answer.
#[cfg(feature = "icmp")]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PingError {
    /// The echo could not be sent at all: no raw socket (not root, no CAP_NET_RAW) or no route.
    #[error("{0}")]
    Socket(String),
    /// Sent, and no reply came in time.
    #[error("{0}")]
    NoReply(String),
}

#[cfg(feature = "icmp")]
static NEXT_ID: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(1);

/// Sends echo requests to `target` every `interval` until one is answered (returns how long it took) or
/// `timeout` passes. Blocking; the socket is opened in the calling thread's network namespace.
#[cfg(feature = "icmp")]
pub fn ping(
    target: std::net::IpAddr,
    timeout: std::time::Duration,
    interval: std::time::Duration,
) -> Result<std::time::Duration, PingError> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::io::Read;
    use std::time::{Duration, Instant};
    let t0 = Instant::now();
    let v6 = target.is_ipv6();
    let (domain, proto) = if v6 {
        (Domain::IPV6, Protocol::ICMPV6)
    } else {
        (Domain::IPV4, Protocol::ICMPV4)
    };
    let sock = Socket::new(domain, Type::RAW, Some(proto))
        .map_err(|e| PingError::Socket(format!("raw socket: {e}")))?;
    // connect() filters what the raw socket receives down to the target's packets.
    sock.connect(&std::net::SocketAddr::new(target, 0).into())
        .map_err(|e| PingError::Socket(format!("connect {target}: {e}")))?;
    let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut seq = 0u16;
    let mut buf = [0u8; 2048];
    let mut sock_r = &sock;
    let mut next_send = Instant::now();
    let deadline = t0 + timeout;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(PingError::NoReply(format!(
                "no echo reply from {target} in {timeout:?}"
            )));
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
            .map_err(|e| PingError::Socket(format!("socket timeout: {e}")))?;
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
