//! The HTTP/1 server on the daemon's unix socket (the shim's requests) and the Prometheus endpoint
//! (`GET /metrics` on a TCP address), both on hyper.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::metrics::Metrics;
use super::{CniHandler, DaemonError};
use crate::daemon::{command_of_path, Request, Response};
use crate::spec::{CniError, ErrorCode};

/// The largest request body accepted (a netconf with a prevResult is a few KiB).
pub const MAX_REQUEST: usize = 4 << 20;

fn reply(status: u16, body: String) -> hyper::Response<Full<Bytes>> {
    let mut r = hyper::Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn failure(
    status: u16,
    code: ErrorCode,
    msg: &str,
    details: String,
) -> hyper::Response<Full<Bytes>> {
    let resp = Response::failure(CniError::new(code, msg, details));
    reply(status, resp.to_json())
}

async fn route(
    req: hyper::Request<Incoming>,
    handler: Arc<CniHandler>,
    metrics: Arc<Metrics>,
) -> hyper::Response<Full<Bytes>> {
    let Some(command) = command_of_path(req.uri().path()) else {
        return failure(
            404,
            ErrorCode::INVALID_ENVIRONMENT,
            "unknown path",
            req.uri().path().to_owned(),
        );
    };
    if req.method() != Method::POST {
        return failure(
            405,
            ErrorCode::INVALID_ENVIRONMENT,
            "use POST",
            String::new(),
        );
    }
    let body = match Limited::new(req.into_body(), MAX_REQUEST).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return failure(
                400,
                ErrorCode::IO_FAILURE,
                "cannot read the request body",
                e.to_string(),
            )
        }
    };
    let t0 = Instant::now();
    let request: Request = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            metrics.observe(command.as_str(), t0.elapsed(), Some(6));
            return failure(
                400,
                ErrorCode::DECODING_FAILURE,
                "cannot decode the daemon request",
                e.to_string(),
            );
        }
    };
    if request.command != command {
        return failure(
            400,
            ErrorCode::INVALID_ENVIRONMENT,
            "request path and command differ",
            format!("{} on {}", request.command.as_str(), command.as_str()),
        );
    }
    let resp = handler.handle(&request).await;
    metrics.observe(
        command.as_str(),
        t0.elapsed(),
        resp.error.as_ref().map(|e| e.code.0),
    );
    reply(resp.http_status(), resp.to_json())
}

/// The content type of prometheus-client's text encoding.
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `GET /metrics`: the metrics rendered now; another path 404, another method 405.
fn metrics_route<B>(req: &hyper::Request<B>, metrics: &Metrics) -> hyper::Response<Full<Bytes>> {
    let (status, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => (StatusCode::OK, metrics.encode()),
        (&Method::GET, _) => (StatusCode::NOT_FOUND, String::new()),
        _ => (StatusCode::METHOD_NOT_ALLOWED, String::new()),
    };
    let mut r = hyper::Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(METRICS_CONTENT_TYPE),
    );
    r
}

/// Binds the daemon's socket: removes a stale socket file, creates the parent directory, and restricts the
/// socket to its owner (mode 0600: only root may ask the daemon to plumb pods).
pub fn bind_socket(path: &Path) -> Result<UnixListener, DaemonError> {
    let io = |what, e| DaemonError::Io {
        what,
        path: path.to_owned(),
        source: e,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io("create socket directory", e))?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io("remove stale socket", e))
        }
        _ => {}
    }
    let l = UnixListener::bind(path).map_err(|e| io("bind socket", e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| io("chmod socket", e))?;
    Ok(l)
}

/// A running server; [`Server::shutdown`] stops accepting and waits for the accept loops.
#[derive(Debug)]
pub struct Server {
    socket: PathBuf,
    metrics_addr: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Server {
    /// Serves `handler` on the unix socket `socket` (see [`bind_socket`]) and, if `metrics_addr` is set, the
    /// metrics on `http://<metrics_addr>/metrics`. Each connection is its own task, so requests run
    /// concurrently.
    pub async fn start(
        socket: &Path,
        metrics_addr: Option<SocketAddr>,
        handler: Arc<CniHandler>,
        metrics: Arc<Metrics>,
    ) -> Result<Server, DaemonError> {
        // The metrics address first: when it is taken, no socket task is left behind.
        let metrics_listener = match metrics_addr {
            Some(addr) => Some(TcpListener::bind(addr).await.map_err(|e| DaemonError::Io {
                what: "bind metrics address",
                path: PathBuf::from(addr.to_string()),
                source: e,
            })?),
            None => None,
        };
        let metrics_addr = match &metrics_listener {
            Some(l) => Some(l.local_addr().map_err(|e| DaemonError::Io {
                what: "read metrics address",
                path: PathBuf::new(),
                source: e,
            })?),
            None => None,
        };
        let listener = bind_socket(socket)?;
        let (stop, rx) = watch::channel(false);
        let mut tasks = Vec::new();
        if let Some(l) = metrics_listener {
            let (m, mut stop_rx) = (metrics.clone(), rx.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let stream = tokio::select! {
                        r = l.accept() => match r {
                            Ok((s, _)) => s,
                            // Transient (out of descriptors, a connection reset before accept).
                            Err(_) => continue,
                        },
                        _ = stop_rx.changed() => break,
                    };
                    let m = m.clone();
                    tokio::spawn(async move {
                        let svc = service_fn(move |req| {
                            let r = metrics_route(&req, &m);
                            async move { Ok::<_, Infallible>(r) }
                        });
                        let _ = http1::Builder::new()
                            .keep_alive(false)
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
            }));
        }
        let (h, m) = (handler.clone(), metrics.clone());
        let mut stop_rx = rx.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    r = listener.accept() => match r {
                        Ok((s, _)) => s,
                        Err(_) => continue,
                    },
                    _ = stop_rx.changed() => break,
                };
                let (h, m) = (h.clone(), m.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let (h, m) = (h.clone(), m.clone());
                        async move { Ok::<_, Infallible>(route(req, h, m).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        }));
        Ok(Server {
            socket: socket.to_owned(),
            metrics_addr,
            stop,
            tasks,
        })
    }

    /// The unix socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The metrics endpoint's bound address (the real port when asked for port 0).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Stops accepting (connections in flight finish on their own) and removes the socket file.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{HandlerConfig, NoGatewayProbe, StaticPodNetworks};
    use kubeovn_netdev::{MockNamespaces, MockNetdev};
    use kubeovn_ovn::vswitch::MockOpenVSwitch;

    fn handler() -> Arc<CniHandler> {
        Arc::new(CniHandler::new(
            HandlerConfig::default(),
            Arc::new(StaticPodNetworks::new()),
            Arc::new(MockOpenVSwitch::new()),
            Arc::new(MockNetdev::new()),
            Arc::new(MockNamespaces::new()),
            Arc::new(NoGatewayProbe),
        ))
    }

    async fn get(addr: SocketAddr, request: &[u8]) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(request).await.expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    }

    #[tokio::test]
    async fn serves_metrics_until_shutdown() {
        let dir = std::env::temp_dir().join(format!("kubeovn-cni-metrics-{}", std::process::id()));
        let metrics = Arc::new(Metrics::new());
        metrics.observe("ADD", std::time::Duration::from_millis(3), None);
        let server = Server::start(
            &dir.join("daemon.sock"),
            Some("127.0.0.1:0".parse().expect("addr")),
            handler(),
            metrics,
        )
        .await
        .expect("start");
        let addr = server.metrics_addr().expect("metrics address");
        assert_ne!(addr.port(), 0);
        let out = get(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.contains(METRICS_CONTENT_TYPE), "{out}");
        assert!(out.contains("command=\"ADD\""), "{out}");
        let out = get(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 404 "), "{out}");
        let out = get(
            addr,
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 405 "), "{out}");
        server.shutdown().await;
        // Stopped: the accept loop has ended and dropped the listener.
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "still accepting on {addr}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_taken_metrics_address_leaves_no_socket_behind() {
        let handler = Arc::new(CniHandler::new(
            HandlerConfig::default(),
            Arc::new(StaticPodNetworks::new()),
            Arc::new(MockOpenVSwitch::new()),
            Arc::new(MockNetdev::new()),
            Arc::new(MockNamespaces::new()),
            Arc::new(NoGatewayProbe),
        ));
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let dir = std::env::temp_dir().join(format!("kubeovn-cni-server-{}", std::process::id()));
        let socket = dir.join("daemon.sock");
        let e = Server::start(
            &socket,
            Some(taken.local_addr().expect("addr")),
            handler,
            Arc::new(Metrics::new()),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&e, DaemonError::Io { what, .. } if *what == "bind metrics address"),
            "{e}"
        );
        // Nothing serves the CNI socket of a daemon that did not start.
        assert!(!socket.exists(), "{} left behind", socket.display());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
