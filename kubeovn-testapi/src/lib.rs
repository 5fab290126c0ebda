//! An in-memory Kubernetes API server for tests: kube-rs clients, kube-runtime controllers and kubectl
//! talk to it as to a cluster, without a kube-apiserver, etcd or a container.
//!
//! An operator's tests start one per test, apply their CRDs, and run the code under test against it,
//! either over loopback HTTP ([`TestApiServer::start`], which kubectl and other processes can reach through
//! [`TestApiServer::write_kubeconfig`]) or in-process with no socket ([`TestApiServer::in_process`]: a
//! `kube::Client` whose requests are served by direct calls, watches included). Objects are schema-free
//! JSON, so any kind a CustomResourceDefinition declares is served as soon as the CRD exists.
//!
//! ```
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::{Api, PostParams};
//! use kubeovn_testapi::{Config, TestApiServer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (server, client) = TestApiServer::in_process(Config::default()).await?;
//! let cms: Api<ConfigMap> = Api::default_namespaced(client);
//! let mut cm = ConfigMap::default();
//! cm.metadata.name = Some("settings".into());
//! cms.create(&PostParams::default(), &cm).await?;
//! assert!(cms.get("settings").await?.metadata.resource_version.is_some());
//! server.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! `examples/operator_test.rs` is an operator's whole test: a CRD applied with
//! [`TestApiServer::apply_crds`], a kube-runtime controller reconciling it in-process, its result checked.
//!
//! # What it serves
//!
//! Discovery (`/version`, `/api`, `/apis`, ...), get, list (label and field selectors, limit/continue),
//! watch (from a resourceVersion, bookmarks, 410 when too old), create (generateName, namespace checks),
//! update (409 on a stale resourceVersion), merge, JSON and strategic merge patches, delete with
//! finalizers and deletecollection, all answering errors with `Status` objects. `kubectl get` receives
//! `Table`s.
//!
//! Services are treated as kube-apiserver treats them ([`service`]): ClusterIPs allocated from
//! [`Config::service_cluster_ip_range`] (both families when `ipFamilyPolicy` asks) and node ports
//! from [`Config::service_node_port_range`], a taken or foreign one refused, `clusterIPs`
//! immutable, both freed on deletion, and its defaults and port validation applied. Namespaces carry
//! their `kubernetes.io/metadata.name` label.
//!
//! kubectl 1.27 to 1.33 work as against a cluster: the protobuf bodies of typed commands
//! (`create namespace`, `create deployment`, `run`, `expose`, ...) are decoded ([`proto`]),
//! `/openapi/v2` (protobuf for kubectl) and `/openapi/v3` describe the built-in kinds and every
//! CRD ([`openapi`]) for `apply`'s validation and `explain`, and `fieldValidation=Strict` fails
//! unknown fields as the real server does ([`validate`]).
//!
//! # Features
//!
//! `client` (on by default): [`TestApiServer::client`], [`TestApiServer::in_process`] and
//! [`TestApiServer::in_process_client`], which build `kube::Client`s (kube with its `client` feature, no
//! TLS). Without it the crate is the server alone (the `kube-ovn-testapi` binary, the fuzz target).
//! kube leaves the Kubernetes version to the final build, as k8s-openapi asks: a test crate chooses it
//! with k8s-openapi's `v1_*` feature.

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
use std::path::{Path, PathBuf};
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

/// A running server; dropping it stops it (as [`Self::shutdown`] does, without waiting).
pub struct TestApiServer {
    /// The bound address; None in-process (no socket).
    addr: Option<SocketAddr>,
    shared: Arc<http::Shared>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

/// What a server started [`TestApiServer::in_process`] reports as its address: it has none.
const NO_ADDR: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::UNSPECIFIED,
    0,
));

impl TestApiServer {
    /// Binds `config.listen` and serves in the background of the current tokio runtime.
    pub async fn start(config: Config) -> Result<Self> {
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
        let mut server = Self::without_socket(&config)?;
        let task = tokio::spawn(accept_loop(
            listener,
            server.shared.clone(),
            server.stop.subscribe(),
        ));
        server.addr = Some(addr);
        server.task = Some(task);
        Ok(server)
    }

    /// The server with no socket: its store and its handler, which [`Self::in_process_client`] calls.
    fn without_socket(config: &Config) -> Result<Self> {
        let services = service::Allocator {
            cluster_ips: service::ClusterIps::parse(&config.service_cluster_ip_range)?,
            node_ports: service::NodePorts::parse(&config.service_node_port_range)?,
        };
        let (stop, stop_rx) = watch::channel(false);
        let shared = Arc::new(http::Shared {
            store: Store::with_services(config.history_limit, services),
            max_body: config.max_body_bytes,
            bookmark_interval: config.bookmark_interval,
            stop: stop_rx,
        });
        Ok(TestApiServer {
            addr: None,
            shared,
            stop,
            task: None,
        })
    }

    /// A server with no socket and a `kube::Client` for it whose requests are calls into the server's
    /// handler (watches stream as over HTTP): tests of controllers need no port, and nothing outside the
    /// process can reach the server. More clients: [`Self::in_process_client`]. `config.listen` is not
    /// used; [`Self::addr`] is `0.0.0.0:0`. Call it inside a tokio runtime (the client spawns a task).
    #[cfg(feature = "client")]
    pub async fn in_process(config: Config) -> Result<(Self, kube::Client)> {
        let server = Self::without_socket(&config)?;
        let client = server.in_process_client();
        Ok((server, client))
    }

    /// A `kube::Client` that calls this server's handler directly, with no socket, default namespace
    /// `default`; it answers 503 once the server is shut down. Inside a tokio runtime only.
    #[cfg(feature = "client")]
    pub fn in_process_client(&self) -> kube::Client {
        let shared = self.shared.clone();
        let service = tower::service_fn(move |req: hyper::Request<kube::client::Body>| {
            let shared = shared.clone();
            async move { Ok::<_, std::convert::Infallible>(http::handle(shared, req).await) }
        });
        kube::Client::new(service, "default")
    }

    /// A `kube::Client` for this server: over loopback HTTP for a server that listens ([`Self::start`]),
    /// in-process for one that does not ([`Self::in_process`]). Default namespace `default`. Inside a
    /// tokio runtime only.
    #[cfg(feature = "client")]
    pub fn client(&self) -> Result<kube::Client> {
        let Some(addr) = self.addr else {
            return Ok(self.in_process_client());
        };
        let uri = format!("http://{addr}")
            .parse::<hyper::Uri>()
            .map_err(|e| Error::Config(format!("the server's URL: {e}")))?;
        kube::Client::try_from(kube::Config::new(uri)).map_err(|e| Error::Client(Box::new(e)))
    }

    /// Creates each CustomResourceDefinition (any value that serializes to one: k8s-openapi's, from
    /// `kube::CustomResourceExt::crd()`, or JSON), or replaces its spec when it exists; its kinds are
    /// served at once. Directly in the store: no client, no runtime needed.
    pub fn apply_crds<I>(&self, crds: I) -> Result<()>
    where
        I: IntoIterator,
        I::Item: serde::Serialize,
    {
        let store = &self.shared.store;
        let info = store
            .resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            .ok_or_else(|| Error::internal("no customresourcedefinitions resource"))?;
        for crd in crds {
            let mut obj = serde_json::to_value(&crd)
                .map_err(|e| Error::bad_request(format!("the CRD does not serialize: {e}")))?;
            if let Some(meta) = obj.get_mut("metadata").and_then(|m| m.as_object_mut()) {
                meta.remove("resourceVersion");
            }
            match store.create(&info, None, obj.clone()) {
                Ok(_) => {}
                Err(Error::Status { code: 409, .. }) => {
                    let name = obj
                        .pointer("/metadata/name")
                        .and_then(|n| n.as_str())
                        .unwrap_or_default()
                        .to_owned();
                    store.update(&info, None, &name, obj, false)?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The bound address (`0.0.0.0:0` for a server [`Self::in_process`], which has no socket).
    pub fn addr(&self) -> SocketAddr {
        self.addr.unwrap_or(NO_ADDR)
    }

    /// Base URL (`http://127.0.0.1:PORT`; nothing answers the one of a server [`Self::in_process`]).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
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

    /// Writes [`Self::kubeconfig_yaml`] to `DIR/kubeconfig` and returns that path (for kubectl's
    /// `--kubeconfig` or a binary's `KUBECONFIG`).
    pub fn write_kubeconfig_in(&self, dir: &Path) -> Result<PathBuf> {
        let path = dir.join("kubeconfig");
        self.write_kubeconfig(&path)?;
        Ok(path)
    }

    /// Stops accepting, closes connections and watches (in-process clients get 503 from now on), and
    /// waits for the accept loop.
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
