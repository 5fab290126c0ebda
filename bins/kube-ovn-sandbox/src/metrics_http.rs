//! A minimal `/metrics` endpoint for the sandbox's tools (kube-ovn-monitor, kube-ovn-pinger): each request
//! gets the Prometheus text rendered at that moment.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Renders the metrics text.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Binds `addr` and serves `render()` on every path until the task is dropped; returns the bound address.
pub async fn serve(addr: SocketAddr, render: Render) -> std::io::Result<SocketAddr> {
    let l = TcpListener::bind(addr).await?;
    let bound = l.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                continue;
            };
            let render = render.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                // One request per connection; the request line is all that matters.
                let _ = s.read(&mut buf).await;
                let body = render();
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(body.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn serves_the_rendered_text() {
        let addr = serve(
            "127.0.0.1:0".parse().expect("addr"),
            Arc::new(|| "up 1\n".to_owned()),
        )
        .await
        .expect("bind");
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        assert!(out.ends_with("\r\n\r\nup 1\n"), "{out}");
    }
}
