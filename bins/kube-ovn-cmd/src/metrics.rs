//! A minimal Prometheus endpoint for the binaries (controller, monitor, pinger): `GET /metrics` gets the
//! text rendered at that moment, any other path 404. One request per connection, no HTTP library: it costs
//! the binaries nothing they do not already use (tokio's TCP).
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use std::sync::Arc;
//! let endpoint = kube_ovn_cmd::metrics::MetricsEndpoint::bind(
//!     "127.0.0.1:0".parse().expect("address"),
//!     Arc::new(|| "# EOF\n".to_owned()),
//! )
//! .await?;
//! println!("http://{}/metrics", endpoint.local_addr());
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Renders the metrics text (prometheus-client's OpenMetrics encoding, say).
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// The content type of prometheus-client's text encoding.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The longest request head read; longer ones get 431.
const MAX_HEAD: usize = 8 << 10;
/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A `/metrics` endpoint serving in the background; dropping it (or [`MetricsEndpoint::stop`]) stops
/// accepting.
#[derive(Debug)]
pub struct MetricsEndpoint {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MetricsEndpoint {
    /// Binds `addr` (port 0 picks one) and serves `render()` on `/metrics` in a task of the current runtime.
    pub async fn bind(addr: SocketAddr, render: Render) -> std::io::Result<MetricsEndpoint> {
        let l = TcpListener::bind(addr).await?;
        let addr = l.local_addr()?;
        let task = tokio::spawn(async move {
            loop {
                // Accept errors (out of descriptors, a connection reset before accept) are transient.
                let Ok((s, _)) = l.accept().await else {
                    continue;
                };
                let render = render.clone();
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(READ_TIMEOUT, answer(s, render)).await;
                });
            }
        });
        Ok(MetricsEndpoint { addr, task })
    }

    /// The bound address (the real port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting; connections being answered finish.
    pub fn stop(self) {
        drop(self);
    }
}

/// Reads the request head and writes the answer.
async fn answer(mut s: TcpStream, render: Render) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_HEAD {
            return reply(&mut s, "431 Request Header Fields Too Large", "").await;
        }
        let n = s.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, path) = (parts.next(), parts.next());
    let path = path.map(|p| p.split(|&b| b == b'?').next().unwrap_or(p));
    match (method, path) {
        (Some(b"GET"), Some(b"/metrics")) => reply(&mut s, "200 OK", &render()).await,
        (Some(b"GET"), _) => reply(&mut s, "404 Not Found", "").await,
        _ => reply(&mut s, "405 Method Not Allowed", "").await,
    }
}

async fn reply(s: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(body.as_bytes()).await?;
    s.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(request).await.expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    }

    #[tokio::test]
    async fn serves_the_text_rendered_per_request() {
        let n = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let m = n.clone();
        let e = MetricsEndpoint::bind(
            "127.0.0.1:0".parse().expect("addr"),
            Arc::new(move || {
                let i = m.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                format!("up {i}\n")
            }),
        )
        .await
        .expect("bind");
        let addr = e.local_addr();
        // The request head split over two writes is still one request.
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /metrics?x=1 HTTP/1.1\r\nHost: x")
            .await
            .expect("write");
        s.write_all(b"\r\n\r\n").await.expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.contains(CONTENT_TYPE), "{out}");
        assert!(
            out.ends_with("Content-Length: 5\r\nConnection: close\r\n\r\nup 0\n"),
            "{out}"
        );
        let out = get(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
        assert!(out.ends_with("\r\n\r\nup 1\n"), "{out}");
        let out = get(addr, b"GET / HTTP/1.1\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 404 "), "{out}");
        let out = get(addr, b"POST /metrics HTTP/1.1\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 405 "), "{out}");
        // Exactly one byte too many, all of it read: no reset from unread data.
        let out = get(addr, &[b'x'; MAX_HEAD + 1]).await;
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
        drop(e);
        // Stopped: the listener is closed once the aborted task is gone.
        let mut refused = false;
        for _ in 0..100 {
            if TcpStream::connect(addr).await.is_err() {
                refused = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(refused, "still accepting on {addr}");
    }
}
