//! The reconcilers' unit-test harness: the test API server in-process (no socket, no HTTP: the client calls
//! its handler), the northbound in memory
//! (`kubeovn_ovn::memdb`: the real planner and replica, no ovsdb-server), and the controller's own start
//! (watches, default network, IPAM rebuild, release of what went away) without its workers, so a test puts
//! objects in, runs one key of one kind, and reads the northbound rows and Kubernetes objects that came out.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{Api, PostParams};
use kube::Resource;
use kubeovn_ovn::memdb::MemDb;
use kubeovn_ovn::northbound::{Northbound, OvsdbNorthbound};
use kubeovn_testapi::{Config as ApiConfig, TestApiServer};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::framework::{self, Action, Key, Reconciler};
use super::{AbortOnDrop, Config, Controller, ControllerError, Ctx, Workers};

/// A controller started on an in-memory northbound and an in-process API server, its workers not running.
#[allow(dead_code)] // Not every test reads every part.
pub(crate) struct Harness {
    pub api: TestApiServer,
    pub client: kube::Client,
    pub db: MemDb,
    pub nb: Arc<OvsdbNorthbound>,
    pub ctx: Arc<Ctx>,
    pub workers: Option<Workers<Ctx>>,
    _tasks: AbortOnDrop,
}

/// The test API server in process (no socket: the client calls its handler) with Kube-OVN's CRDs installed.
pub(crate) async fn api_with_crds() -> (TestApiServer, kube::Client) {
    // Dual stack, so that Services of both families can be tested.
    let (api, client) = TestApiServer::in_process(ApiConfig {
        service_cluster_ip_range: "10.96.0.0/12,fd00:10:96::/108".into(),
        ..ApiConfig::default()
    })
    .await
    .expect("test api server");
    api.apply_crds(crate::crd::crds()).expect("the CRDs");
    (api, client)
}

/// The configuration tests use: few workers, no periodic passes in the way.
pub(crate) fn config() -> Config {
    Config {
        gc_interval: Duration::from_secs(3600),
        status_interval: Duration::from_secs(3600),
        pod_workers: 4,
        ..Config::default()
    }
}

#[allow(dead_code)] // Helpers for every reconciler's tests; not each uses all.
impl Harness {
    /// Starts with the default configuration and nothing in the API server.
    pub async fn start() -> Harness {
        Self::start_with(config(), MemDb::new_nb(), |_| async {}).await
    }

    /// Starts with `config` on `db` after `setup` wrote what the API server holds (the view of a controller
    /// starting, or restarting, on an existing cluster).
    pub async fn start_with<F, Fut>(config: Config, db: MemDb, setup: F) -> Harness
    where
        F: FnOnce(kube::Client) -> Fut,
        Fut: Future<Output = ()>,
    {
        let (api, client) = api_with_crds().await;
        setup(client.clone()).await;
        let nb = Arc::new(db.northbound().await.expect("memdb northbound"));
        let dyn_nb: Arc<dyn Northbound> = nb.clone();
        let controller = Controller::new(client.clone(), dyn_nb, config);
        let tasks = Arc::new(Mutex::new(Vec::new()));
        let guard = AbortOnDrop(tasks.clone());
        let (ctx, mut workers) = controller
            .prepare(&tasks, Instant::now())
            .await
            .expect("controller start");
        workers
            .at_start(ctx.clone())
            .await
            .expect("the start hooks");
        Harness {
            api,
            client,
            db,
            nb,
            ctx,
            workers: Some(workers),
            _tasks: guard,
        }
    }

    /// Creates `obj` and waits until the controller's store holds it.
    pub async fn create<K>(&self, obj: &K) -> K
    where
        K: framework::Object + Resource<Scope = k8s_openapi::NamespaceResourceScope> + Serialize,
    {
        let ns = obj
            .meta()
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let api: Api<K> = Api::namespaced(self.client.clone(), &ns);
        let created = api
            .create(&PostParams::default(), obj)
            .await
            .expect("create");
        self.stored(&created).await;
        created
    }

    /// Creates the cluster-scoped `obj` and waits until the controller's store holds it.
    pub async fn create_cluster<K>(&self, obj: &K) -> K
    where
        K: framework::Object + Resource<Scope = k8s_openapi::ClusterResourceScope> + Serialize,
    {
        let api: Api<K> = Api::all(self.client.clone());
        let created = api
            .create(&PostParams::default(), obj)
            .await
            .expect("create");
        self.stored(&created).await;
        created
    }

    /// Waits until the store of `K` holds `obj` at its resource version (or a later one).
    pub async fn stored<K: framework::Object>(&self, obj: &K) {
        let key = Key::of(obj);
        let want: u64 = obj
            .meta()
            .resource_version
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        self.until(&format!("{key} stored"), || {
            self.ctx.kinds.get(&key).is_some_and(|o| {
                o.meta()
                    .resource_version
                    .as_deref()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
                    >= want
            })
        })
        .await;
    }

    /// Waits until the store of `K` no longer holds `key`.
    pub async fn gone<K: framework::Object>(&self, key: &Key<K>) {
        self.until(&format!("{key} gone"), || self.ctx.kinds.get(key).is_none())
            .await;
    }

    /// Polls `f` until it holds (5 s at most).
    pub async fn until(&self, what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Runs `key` of kind `R` once, as a worker would.
    pub async fn run<R: Reconciler<Ctx, Error = ControllerError>>(
        &self,
        key: Key<R::Object>,
    ) -> Result<Action, ControllerError> {
        framework::run_once::<Ctx, R>(&self.ctx, &key).await
    }

    /// Runs task `T` once, as its worker would.
    pub async fn run_task<T: framework::Task<Ctx, Error = ControllerError>>(
        &self,
    ) -> Result<Action, ControllerError> {
        framework::run_task_once::<Ctx, T>(&self.ctx).await
    }

    /// Starts the workers of kind (or task) `R` alone: it runs by itself, the others by hand.
    pub fn serve_kind<R: 'static>(&mut self) {
        if let Some(w) = self.workers.as_mut() {
            let tasks = self._tasks.0.clone();
            for f in w.take::<R>().run(self.ctx.clone()) {
                tasks
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(tokio::spawn(f));
            }
        }
    }

    /// Starts the workers: from now on the controller runs by itself.
    pub fn serve(&mut self) {
        if let Some(w) = self.workers.take() {
            let tasks = self._tasks.0.clone();
            for f in w.run(self.ctx.clone()) {
                tasks
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(tokio::spawn(f));
            }
        }
    }

    /// The cluster-scoped object `name` as the API server holds it now.
    pub async fn get<K>(&self, name: &str) -> Option<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        Api::<K>::all(self.client.clone())
            .get_opt(name)
            .await
            .expect("get")
    }

    /// The object `namespace/name` as the API server holds it now.
    pub async fn get_in<K>(&self, namespace: &str, name: &str) -> Option<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        Api::<K>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .expect("get")
    }
}

/// Every row of every northbound table, by table (a snapshot to compare: equal means nothing was written).
pub(crate) type NbRows =
    std::collections::BTreeMap<String, Vec<(kubeovn_ovn::Uuid, kubeovn_ovn::ops::Row)>>;

// Helpers of the subnet, ippool and node tests.
#[allow(dead_code)]
impl Harness {
    /// Every row of every northbound table now.
    pub fn nb_rows(&self) -> NbRows {
        self.db
            .schema()
            .tables
            .keys()
            .map(|t| {
                let mut rows = self.db.rows(t);
                rows.sort_by_key(|(u, _)| *u);
                (t.clone(), rows)
            })
            .collect()
    }

    /// The events with `reason`, as the API server holds them now.
    pub async fn events(&self, reason: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
        let api: Api<k8s_openapi::api::events::v1::Event> = Api::all(self.client.clone());
        api.list(&Default::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .collect()
    }

    /// Creates the cluster-scoped custom resource `K` from `v` as sent (a spec its type refuses gets in too,
    /// as through a server that does not validate) and waits until the controller's store holds it.
    pub async fn create_raw<K>(&self, v: serde_json::Value) -> crate::crd::Decoded<K>
    where
        K: Resource<DynamicType = ()>
            + DeserializeOwned
            + Serialize
            + Default
            + Clone
            + Send
            + Sync
            + 'static,
        crate::crd::Decoded<K>: framework::Object,
    {
        let ar = kube::discovery::ApiResource::erase::<K>(&());
        let mut v = v;
        v["apiVersion"] = ar.api_version.clone().into();
        v["kind"] = ar.kind.clone().into();
        let o: kube::api::DynamicObject = serde_json::from_value(v).expect("object");
        let api: Api<kube::api::DynamicObject> = Api::all_with(self.client.clone(), &ar);
        let o = api
            .create(&PostParams::default(), &o)
            .await
            .expect("create");
        let d = crate::crd::Decoded::<K>::from_value(serde_json::to_value(&o).expect("json"))
            .expect("decoded");
        self.stored(&d).await;
        d
    }

    /// Takes the keys of kind `K` queued so far (their queue is left empty).
    pub async fn queued<K: 'static>(&self) -> Vec<Key<K>> {
        self.ctx.kinds.take_queued::<K>().await
    }
}

/// A pod `namespace/name` with `annotations`, scheduled to `node` if given (no containers: the controller
/// reads none, and the test API server asks for none).
pub(crate) fn pod(
    namespace: &str,
    name: &str,
    annotations: &[(&str, &str)],
    node: Option<&str>,
) -> super::PodInfo {
    let mut p = super::PodInfo::default();
    p.metadata.namespace = Some(namespace.to_owned());
    p.metadata.name = Some(name.to_owned());
    p.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    p.spec.node_name = node.map(str::to_owned);
    p
}

// Helpers of the pod, IP record, gc and rebuild tests.
#[allow(dead_code)] // Not each test module uses all.
impl Harness {
    /// Creates the pod `p` and waits until the pod store holds it (the store trims the resource version, so
    /// [`Harness::create`] cannot wait for it).
    pub async fn create_pod(&self, p: &super::PodInfo) -> super::PodInfo {
        let ns = p.metadata.namespace.as_deref().unwrap_or("default");
        let api: Api<super::PodInfo> = Api::namespaced(self.client.clone(), ns);
        let created = api
            .create(&PostParams::default(), p)
            .await
            .expect("create pod");
        self.pod_stored(&created).await;
        created
    }

    /// Waits until the pod store holds `p` as given: same uid, annotations and deletion timestamp.
    pub async fn pod_stored(&self, p: &super::PodInfo) {
        let (ns, name) = (
            p.metadata.namespace.clone().unwrap_or_default(),
            p.metadata.name.clone().unwrap_or_default(),
        );
        let mut want = p.clone();
        super::podinfo::trim(&mut want);
        self.until(&format!("pod {ns}/{name} stored"), || {
            self.ctx.pods().get(&ns, &name).is_some_and(|s| {
                s.metadata.uid == want.metadata.uid
                    && s.metadata.deletion_timestamp == want.metadata.deletion_timestamp
                    && s.annotation_map() == want.annotation_map()
            })
        })
        .await;
    }

    /// The pod `namespace/name` as the API server holds it now.
    pub async fn api_pod(&self, namespace: &str, name: &str) -> super::PodInfo {
        self.get_in(namespace, name).await.expect("pod")
    }

    /// The reasons of the Warning events on the object `namespace/name`, oldest first, one per occurrence.
    pub async fn warnings(&self, namespace: &str, name: &str) -> Vec<String> {
        use k8s_openapi::api::events::v1::Event;
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let mut evs = api.list(&Default::default()).await.expect("events").items;
        evs.retain(|e| {
            e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        });
        evs.sort_by_key(|e| {
            e.metadata
                .resource_version
                .as_deref()
                .and_then(|v| v.parse::<u64>().ok())
        });
        // The recorder patches a repeated event's series instead of creating another: one per occurrence.
        evs.into_iter()
            .flat_map(|e| {
                let n = e.series.as_ref().map_or(1, |s| s.count.max(1)) as usize;
                std::iter::repeat_n(e.reason.unwrap_or_default(), n)
            })
            .collect()
    }

    /// Runs `f` beside the controller (stopped with the harness), as its start spawns its side tasks.
    pub fn spawn(&self, f: impl Future<Output = ()> + Send + 'static) {
        self._tasks
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tokio::spawn(f));
    }

    /// Stops this controller and starts a new one on the same northbound (a restart), with a new API server
    /// that `setup` fills.
    pub async fn restart_with<F, Fut>(self, setup: F) -> Harness
    where
        F: FnOnce(kube::Client) -> Fut,
        Fut: Future<Output = ()>,
    {
        let db = self.db.clone();
        let config = self.ctx.config.clone();
        drop(self);
        Self::start_with(config, db, setup).await
    }

    /// Who holds `ip` in the allocator: its record (port) name.
    pub fn holder(&self, ip: &str) -> Option<String> {
        self.ctx.ipam.owner(ip.parse().expect("ip")).map(|a| a.nic)
    }
}
