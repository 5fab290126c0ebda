//! TCP and UDP between two network namespaces: an echo exchange from a socket made inside the source's namespace
//! to one listening inside the destination's, for the demo's report and `kubectl ko diagnose`.
//!
//! Ping alone proves too little here: veths hand the userspace datapath TCP and UDP packets with partial
//! checksums, which it forwards unfinished, so ICMP passes where TCP and UDP do not (unless TX checksumming is
//! off on the pod's interface). Each socket is made on a short-lived thread that entered the namespace
//! (`setns`) and exits afterwards; a socket stays in the namespace it was made in.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sched::{setns, CloneFlags};

/// What one source-destination pair carried: TCP and UDP round trips, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transport {
    /// 16 KiB echoed over one connection (several full-size segments each way).
    pub tcp: Result<Duration, String>,
    /// One datagram echoed (up to three tries).
    pub udp: Result<Duration, String>,
}

impl Transport {
    /// Whether both carried.
    pub fn ok(&self) -> bool {
        self.tcp.is_ok() && self.udp.is_ok()
    }
}

/// Runs `f` on a new thread inside the network namespace at `netns`.
pub fn in_netns<T: Send>(netns: &Path, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            let ns = File::open(netns)?;
            setns(&ns, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("thread panicked")))
    })
}

fn unspecified(v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
    }
}

/// Echoes one accepted connection until the peer shuts its side, waiting at most `timeout` for it.
fn serve_tcp(listener: &TcpListener, timeout: Duration) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let t0 = Instant::now();
    let (mut c, _) = loop {
        match listener.accept() {
            Ok(c) => break c,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && t0.elapsed() < timeout => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    };
    c.set_nonblocking(false)?;
    c.set_read_timeout(Some(timeout))?;
    let mut data = Vec::new();
    c.read_to_end(&mut data)?;
    c.write_all(&data)
}

fn tcp(src: &Path, dst: &Path, ip: IpAddr, timeout: Duration) -> Result<Duration, String> {
    let listener =
        in_netns(dst, || TcpListener::bind((ip, 0))).map_err(|e| format!("listen on {ip}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let payload: Vec<u8> = (0..16 * 1024).map(|i| (i % 251) as u8).collect();
    std::thread::scope(|s| {
        let server = s.spawn(|| serve_tcp(&listener, timeout));
        let client = in_netns(src, || {
            let t0 = Instant::now();
            let mut c = TcpStream::connect_timeout(&addr, timeout)?;
            c.set_read_timeout(Some(timeout))?;
            c.write_all(&payload)?;
            c.shutdown(Shutdown::Write)?;
            let mut back = Vec::new();
            c.read_to_end(&mut back)?;
            if back != payload {
                return Err(io::Error::other(format!(
                    "{} of {} bytes came back",
                    back.len(),
                    payload.len()
                )));
            }
            Ok(t0.elapsed())
        });
        // The client's view decides; the server's thread ends by its own timeout at worst.
        let _ = server.join();
        client.map_err(|e| format!("tcp {addr}: {e}"))
    })
}

fn udp(src: &Path, dst: &Path, ip: IpAddr, timeout: Duration) -> Result<Duration, String> {
    let server =
        in_netns(dst, || UdpSocket::bind((ip, 0))).map_err(|e| format!("bind {ip}: {e}"))?;
    let addr = server.local_addr().map_err(|e| e.to_string())?;
    let client = in_netns(src, || UdpSocket::bind((unspecified(ip.is_ipv6()), 0)))
        .map_err(|e| format!("bind in the source: {e}"))?;
    let each = timeout / 3;
    server
        .set_read_timeout(Some(each))
        .and_then(|_| client.set_read_timeout(Some(each)))
        .map_err(|e| e.to_string())?;
    let msg = b"kube-ovn-sandbox udp check";
    let mut buf = [0u8; 64];
    let mut last = String::new();
    for _ in 0..3 {
        let t0 = Instant::now();
        let echoed = (|| -> io::Result<bool> {
            client.send_to(msg, addr)?;
            let (n, from) = server.recv_from(&mut buf)?;
            server.send_to(&buf[..n], from)?;
            let (n, _) = client.recv_from(&mut buf)?;
            Ok(&buf[..n] == msg)
        })();
        match echoed {
            Ok(true) => return Ok(t0.elapsed()),
            Ok(false) => last = "a different datagram came back".into(),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                last = format!("no echo within {each:?}");
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(format!("udp {addr}: {last}"))
}

/// TCP and UDP from the namespace at `src` to `ip` in the namespace at `dst` (the address must be one of
/// `dst`'s), each given at most `timeout`.
pub fn check(src: &Path, dst: &Path, ip: IpAddr, timeout: Duration) -> Transport {
    Transport {
        tcp: tcp(src, dst, ip, timeout),
        udp: udp(src, dst, ip, timeout),
    }
}

/// The hidden command the demo's backend pods run: `kube-ovn-sandbox serve-name PORT` answers every TCP
/// connection and every UDP datagram on PORT (both families) with `$HOSTNAME` (the pod's name), so a client
/// of a Service sees which backend it reached.
pub const SERVE_NAME_COMMAND: &str = "serve-name";

/// Serves `name` on TCP and UDP `port` until the process ends.
pub fn serve_name(port: u16, name: &str) -> io::Result<()> {
    let any = std::net::Ipv6Addr::UNSPECIFIED;
    // A dual-stack socket on [::] takes IPv4 too; a node without IPv6 gets an IPv4 one.
    let tcp = TcpListener::bind((any, port)).or_else(|_| TcpListener::bind(("0.0.0.0", port)))?;
    let udp = UdpSocket::bind((any, port)).or_else(|_| UdpSocket::bind(("0.0.0.0", port)))?;
    let reply = name.as_bytes().to_vec();
    let udp_reply = reply.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while let Ok((_, from)) = udp.recv_from(&mut buf) {
            let _ = udp.send_to(&udp_reply, from);
        }
    });
    for c in tcp.incoming() {
        match c {
            Ok(mut c) => {
                let _ = c.write_all(&reply);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The hidden command the external network's server runs: `kube-ovn-sandbox serve-peer PORT` answers every
/// TCP connection and UDP datagram on PORT with the address it came from, so a pod sees what the world
/// beyond the cluster sees of it (its node's address when its subnet has `natOutgoing`).
pub const SERVE_PEER_COMMAND: &str = "serve-peer";

/// Answers each peer on TCP and UDP `addr` with its own address until the process ends. The UDP socket is
/// bound to `addr` itself so that replies come from the address asked (a NAT on the way matches them).
pub fn serve_peer(addr: std::net::SocketAddr) -> io::Result<()> {
    let tcp = TcpListener::bind(addr)?;
    let udp = UdpSocket::bind(addr)?;
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while let Ok((_, from)) = udp.recv_from(&mut buf) {
            let _ = udp.send_to(from.ip().to_string().as_bytes(), from);
        }
    });
    for c in tcp.incoming() {
        match c {
            Ok(mut c) => {
                if let Ok(peer) = c.peer_addr() {
                    let _ = c.write_all(peer.ip().to_string().as_bytes());
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Asks the name server at `addr` from the namespace at `src`, over TCP or UDP: the name that answered.
pub fn ask_name(
    src: &Path,
    addr: std::net::SocketAddr,
    udp: bool,
    timeout: Duration,
) -> Result<String, String> {
    ask_name_from(src, addr, udp, timeout, 0)
}

/// [`ask_name`] from local port `port` (0: any). A caller that must not repeat a 5-tuple gives each ask a
/// port of its own: a connection tracker may still hold the last connection of the same tuple, which the
/// kernel's choice of port repeats often for TCP.
pub fn ask_name_from(
    src: &Path,
    addr: std::net::SocketAddr,
    udp: bool,
    timeout: Duration,
    port: u16,
) -> Result<String, String> {
    let local = std::net::SocketAddr::new(unspecified(addr.is_ipv6()), port);
    let got = in_netns(src, || {
        let mut buf = [0u8; 256];
        if udp {
            let s = UdpSocket::bind(local)?;
            s.set_read_timeout(Some(timeout))?;
            s.send_to(b"?", addr)?;
            let n = s.recv(&mut buf)?;
            Ok(buf[..n].to_vec())
        } else {
            let mut c = if port == 0 {
                // The kernel's connect-time choice, which shares ports across destinations.
                TcpStream::connect_timeout(&addr, timeout)?
            } else {
                let sock = socket2::Socket::new(
                    socket2::Domain::for_address(addr),
                    socket2::Type::STREAM,
                    Some(socket2::Protocol::TCP),
                )?;
                sock.set_reuse_address(true)?;
                sock.bind(&local.into())?;
                sock.connect_timeout(&addr.into(), timeout)?;
                sock.into()
            };
            c.set_read_timeout(Some(timeout))?;
            let mut out = Vec::new();
            c.read_to_end(&mut out)?;
            Ok(out)
        }
    });
    match got {
        Ok(b) if !b.is_empty() => Ok(String::from_utf8_lossy(&b).into_owned()),
        Ok(_) => Err("an empty answer".into()),
        Err(e) => Err(format!("{} {addr}: {e}", if udp { "udp" } else { "tcp" })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_in_our_own_namespace_carries_both() {
        // Our own namespace on both sides; setns needs CAP_SYS_ADMIN even into it.
        if !nix::unistd::geteuid().is_root() {
            kubeovn_test_support::skip::skip("setns needs CAP_SYS_ADMIN");
            return;
        }
        let me = Path::new("/proc/self/ns/net");
        let t = check(me, me, "127.0.0.1".parse().unwrap(), Duration::from_secs(2));
        assert!(t.ok(), "{t:?}");
        // An address no interface has: no listener, an error and no hang.
        let t0 = Instant::now();
        let bad = check(
            me,
            me,
            "192.0.2.1".parse().unwrap(),
            Duration::from_millis(300),
        );
        assert!(bad.tcp.is_err() && bad.udp.is_err(), "{bad:?}");
        assert!(t0.elapsed() < Duration::from_secs(3));
    }
}
