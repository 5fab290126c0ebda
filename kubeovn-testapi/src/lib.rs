//! An in-memory Kubernetes API server for end-to-end tests.
//!
//! No kube-apiserver can be installed where kubeovn-rs is tested, yet the controller, the daemon and
//! the sandbox must be driven through the real Kubernetes HTTP protocol: kube-runtime watchers and
//! kubectl both talk to this server over plain HTTP on loopback. Objects are schema-free JSON, so
//! any kind a CustomResourceDefinition declares is served as soon as the CRD is created.
//!
//! It speaks discovery (`/version`, `/api`, `/apis`, ...), get, list (label and field selectors,
//! limit/continue), watch (from a resourceVersion, bookmarks, 410 when too old), create
//! (generateName, namespace checks), update (409 on a stale resourceVersion), merge, JSON and
//! strategic merge patches, delete with finalizers and deletecollection, all answering errors with
//! `Status` objects. `kubectl get` receives `Table`s.
//!
//! Services are treated as kube-apiserver treats them ([`service`]): ClusterIPs allocated from
//! [`Config::service_cluster_ip_range`] (both families when `ipFamilyPolicy` asks) and node ports
//! from [`Config::service_node_port_range`], a taken or foreign one refused, `clusterIPs`
//! immutable, both freed on deletion, and its defaults and port validation applied. Namespaces carry their `kubernetes.io/metadata.name` label.
//!
//! kubectl 1.27 to 1.33 work as against a cluster: the protobuf bodies of typed commands
//! (`create namespace`, `create deployment`, `run`, `expose`, ...) are decoded ([`proto`]),
//! `/openapi/v2` (protobuf for kubectl) and `/openapi/v3` describe the built-in kinds and every
//! CRD ([`openapi`]) for `apply`'s validation and `explain`, and `fieldValidation=Strict` fails
//! unknown fields as the real server does ([`validate`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), kubeovn_testapi::Error> {
//! let server = kubeovn_testapi::TestApiServer::start(kubeovn_testapi::Config::default()).await?;
//! println!("serving on {}", server.url());
//! server.write_kubeconfig(std::path::Path::new("/tmp/kubeconfig"))?;
//! // kube::Config::new(server.url().parse()?) builds a client for it.
//! server.shutdown().await;
//! # Ok(()) }
//! ```

pub mod error;
pub mod http;
pub mod openapi;
pub mod patch;
pub mod proto;
pub mod resources;
pub mod select;
pub mod service;
pub mod store;
pub mod validate;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use error::{Error, Result};
pub use resources::ResourceInfo;
pub use store::Store;

/// How the server is set up.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to listen on (loopback, port 0 picks a free port).
    pub listen: SocketAddr,
    /// Events kept for watches that resume from a resourceVersion; older ones get 410 Gone.
    pub history_limit: usize,
    /// Largest request body accepted (413 above it).
    pub max_body_bytes: usize,
    /// Interval between BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
    /// Where Services' ClusterIPs come from, as kube-apiserver's `--service-cluster-ip-range`:
    /// a CIDR, or an IPv4 and an IPv6 CIDR separated by a comma for dual stack.
    pub service_cluster_ip_range: String,
    /// Where NodePort and LoadBalancer Services' node ports come from, as kube-apiserver's
    /// `--service-node-port-range` (`FIRST-LAST`).
    pub service_node_port_range: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            history_limit: 100_000,
            max_body_bytes: 3 * 1024 * 1024,
            bookmark_interval: Duration::from_secs(1),
            service_cluster_ip_range: service::DEFAULT_RANGE.to_owned(),
            service_node_port_range: service::DEFAULT_NODE_PORT_RANGE.to_owned(),
        }
    }
}

/// A running server; dropping it stops accepting connections.
pub struct TestApiServer {
    addr: SocketAddr,
    shared: Arc<http::Shared>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl TestApiServer {
    /// Binds `config.listen` and serves in the background of the current tokio runtime.
    pub async fn start(config: Config) -> Result<Self> {
        let services = service::Allocator {
            cluster_ips: service::ClusterIps::parse(&config.service_cluster_ip_range)?,
            node_ports: service::NodePorts::parse(&config.service_node_port_range)?,
        };
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| Error::Io {
                context: format!("binding {}", config.listen),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Io {
            context: "reading the bound address".into(),
            source,
        })?;
        let shared = Arc::new(http::Shared {
            store: Store::with_services(config.history_limit, services),
            max_body: config.max_body_bytes,
            bookmark_interval: config.bookmark_interval,
        });
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, shared.clone(), stop_rx));
        Ok(TestApiServer {
            addr,
            shared,
            stop,
            task: Some(task),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The store, for direct inspection in tests.
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// A kubeconfig (YAML) pointing at this server.
    pub fn kubeconfig_yaml(&self) -> String {
        kubeconfig_yaml(&self.url())
    }

    /// Writes [`Self::kubeconfig_yaml`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.kubeconfig_yaml()).map_err(|source| Error::Io {
            context: format!("writing {}", path.display()),
            source,
        })
    }

    /// Stops accepting, closes connections and watches, and waits for the accept loop.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// A kubeconfig (YAML) for a server at `url`, context `testapi`, namespace `default`.
pub fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: testapi\n  cluster:\n    server: {url}\n\
         users:\n- name: testapi\n  user: {{}}\ncontexts:\n- name: testapi\n  context:\n    cluster: testapi\n\
         \x20   user: testapi\n    namespace: default\ncurrent-context: testapi\npreferences: {{}}\n"
    )
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<http::Shared>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let conn = tokio::select! {
            c = listener.accept() => c,
            _ = stop.changed() => return,
        };
        let Ok((stream, _)) = conn else { continue };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, std::convert::Infallible>(http::handle(shared, req).await) }
            });
            let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = stop.changed() => {}
            }
        });
    }
}
