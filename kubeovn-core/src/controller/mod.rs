//! The Kube-OVN controller as a library: watches Kubernetes and Kube-OVN's CRDs, allocates addresses with
//! kubeovn-ipam and writes the logical network through [`Northbound`].
//!
//! [`Controller::run`] does what kube-ovn-controller does at start: leader election (a Lease, if configured);
//! then, at the same time, the informers' first lists and the IP record list on one side, and on the other
//! the northbound replica (with [`Controller::connecting`], still filling), NB_Global options, the default VPC
//! router and the `join` and default subnets (Subnet objects created if missing); then the IPAM rebuild from
//! every source at once (Subnets, IPPools, IP records, pod and node annotations and the northbound ports),
//! which also finds what pods and nodes deleted while the controller was down left behind: their ports and
//! IP records are removed and their addresses freed before the controller reports started. Then one work
//! queue per kind with bounded concurrency, a watch of users' IP reservations, periodic garbage collection
//! and Subnet status updates. Each step's time since the start is logged at info level.
//!
//! Pod handlers hand their northbound writes to one [`writer::NbWriter`], which commits what concurrent
//! handlers produced within a short window as one transaction.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use kubeovn_core::controller::{Config, Controller};
//! use kubeovn_ovn::northbound::OvsdbNorthbound;
//!
//! let client = kube::Client::try_default().await?;
//! let nb = OvsdbNorthbound::connect("unix:/var/run/ovn/ovnnb_db.sock").await?;
//! let controller = Controller::new(client, Arc::new(nb), Config::default());
//! controller.run(std::future::pending()).await?;
//! # Ok(()) }
//! ```

pub mod error;
pub mod leader;
pub mod metrics;
pub mod plan;
pub mod queue;
pub mod writer;

mod gc;
mod ip;
mod namespace;
mod node;
mod pod;
pub mod podinfo;
mod podstore;
mod rebuild;
mod subnet;
mod vpc;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource};
use kubeovn_ipam::SharedIpam;
use kubeovn_ovn::northbound::{NbGlobal, Northbound};
pub use podinfo::PodInfo;
use serde::de::DeserializeOwned;

use crate::crd::{Decoded, IPPool, Subnet};
use crate::naming;

pub use error::{ControllerError, Result};
pub use leader::{LeaderElector, LeaseConfig};
pub use metrics::Metrics;
pub use plan::SubnetInfo;
pub use queue::WorkQueue;
pub use writer::{NbWriter, WriterConfig};

/// One of the subnets the controller creates at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetConfig {
    /// Name.
    pub name: String,
    /// `cidrBlock` (`v4`, `v6` or `v4,v6`).
    pub cidr: String,
    /// `gateway` (empty: the first address of each block).
    pub gateway: String,
    /// `excludeIps`.
    pub exclude_ips: Vec<String>,
}

impl SubnetConfig {
    /// A subnet `name` of `cidr` with the default gateway.
    pub fn new(name: impl Into<String>, cidr: impl Into<String>) -> Self {
        SubnetConfig {
            name: name.into(),
            cidr: cidr.into(),
            gateway: String::new(),
            exclude_ips: Vec::new(),
        }
    }
}

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The default VPC's router (`ovn-cluster`).
    pub default_vpc: String,
    /// The default subnet (`ovn-default`, 10.16.0.0/16).
    pub default_subnet: SubnetConfig,
    /// The join subnet (`join`, 100.64.0.0/16).
    pub join_subnet: SubnetConfig,
    /// The service CIDR(s), `--service-cluster-ip-range` (default-VPC subnets must not overlap it; empty: no
    /// check).
    pub service_cidr: String,
    /// NB_Global options set at start.
    pub nb_global_options: BTreeMap<String, String>,
    /// Pod handlers running at once.
    pub pod_workers: usize,
    /// Handlers of the other kinds running at once (each).
    pub workers: usize,
    /// Northbound write grouping.
    pub writer: WriterConfig,
    /// Interval between garbage collection passes (an orphan found in one pass is removed in the next).
    pub gc_interval: Duration,
    /// Interval between Subnet status updates.
    pub status_interval: Duration,
    /// Leader election; None runs without it.
    pub lease: Option<LeaseConfig>,
    /// `reportingController` of Events.
    pub reporter: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            default_vpc: naming::DEFAULT_VPC.to_owned(),
            default_subnet: SubnetConfig::new(naming::DEFAULT_SUBNET, naming::DEFAULT_SUBNET_CIDR),
            join_subnet: SubnetConfig::new(naming::JOIN_SUBNET, naming::JOIN_SUBNET_CIDR),
            service_cidr: "10.96.0.0/12".to_owned(),
            nb_global_options: BTreeMap::from([
                ("use_logical_dp_groups".to_owned(), "true".to_owned()),
                ("mac_prefix".to_owned(), "0a:00:00".to_owned()),
            ]),
            pod_workers: 128,
            workers: 4,
            writer: WriterConfig::default(),
            gc_interval: Duration::from_secs(60),
            status_interval: Duration::from_secs(1),
            lease: None,
            reporter: "kube-ovn-controller".to_owned(),
        }
    }
}

/// A northbound connection to be made.
type PendingNb = std::pin::Pin<Box<dyn Future<Output = Result<Arc<dyn Northbound>>> + Send>>;

/// The controller. Build with [`Controller::new`] (or [`Controller::connecting`]), start with
/// [`Controller::run`].
pub struct Controller {
    client: kube::Client,
    nb: Mutex<Option<PendingNb>>,
    config: Config,
    metrics: Metrics,
    ipam: Arc<SharedIpam>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What every handler shares.
pub(crate) struct Ctx {
    pub client: kube::Client,
    pub nb: Arc<dyn Northbound>,
    pub writer: NbWriter,
    pub ipam: Arc<SharedIpam>,
    pub config: Config,
    pub metrics: Metrics,
    pub recorder: Recorder,
    /// Parsed subnets by name.
    pub subnets: RwLock<HashMap<String, Arc<SubnetInfo>>>,
    /// IPPools by name: (subnet, addresses).
    pub pools: RwLock<HashMap<String, (String, Vec<String>)>>,
    pub pods: podstore::PodStore,
    pub nodes: Store<Node>,
    pub namespaces: Store<Namespace>,
    pub subnet_store: Store<Decoded<Subnet>>,
    pub pool_store: Store<Decoded<IPPool>>,
    pub vpcs: Store<crate::crd::Vpc>,
    /// Last state of deleted objects, until their delete is handled.
    pub pod_tombstones: Arc<Tombstones<PodInfo>>,
    pub node_tombstones: Arc<Tombstones<Node>>,
    pub subnet_tombstones: Arc<Tombstones<Decoded<Subnet>>>,
    pub pool_tombstones: Arc<Tombstones<Decoded<IPPool>>>,
    pub queues: Queues,
    /// Pods waiting for an address in a full subnet.
    pub waiting: pod::Waiting,
    /// Users' reservations (IP records) the allocator holds or that wait for their subnet.
    pub reservations: Mutex<ip::Reservations>,
}

/// The work queues, one per kind.
pub(crate) struct Queues {
    pub pod: Arc<WorkQueue<String>>,
    pub subnet: Arc<WorkQueue<String>>,
    pub node: Arc<WorkQueue<String>>,
    pub namespace: Arc<WorkQueue<String>>,
    pub pool: Arc<WorkQueue<String>>,
    pub vpc: Arc<WorkQueue<String>>,
}

impl Ctx {
    pub fn subnet(&self, name: &str) -> Option<Arc<SubnetInfo>> {
        self.subnets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// The reservations, locked.
    pub fn reservations(&self) -> std::sync::MutexGuard<'_, ip::Reservations> {
        self.reservations.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn subnet_list(&self) -> Vec<Arc<SubnetInfo>> {
        let mut v: Vec<_> = self
            .subnets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn join_subnet(&self) -> Option<Arc<SubnetInfo>> {
        self.subnet(&self.config.join_subnet.name)
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<Arc<PodInfo>> {
        self.pods.get(namespace, name)
    }

    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(&ObjectRef::new(name))
    }

    /// Publishes an Event on `obj`; failures are only logged (events are best effort).
    pub async fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        self.event_on(&obj.object_ref(&()), type_, reason, note)
            .await
    }

    /// Publishes an Event on the object `r`.
    pub async fn event_on(
        &self,
        r: &k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        if type_ == EventType::Warning {
            tracing::warn!(reason, %note, "event");
        }
        let ev = KubeEvent {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: reason.to_owned(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, r).await {
            tracing::debug!(error = %e, "publishing an event");
        }
    }
}

impl Controller {
    /// A controller using `client` and `nb`.
    pub fn new(client: kube::Client, nb: Arc<dyn Northbound>, config: Config) -> Self {
        Self::connecting(client, async move { Ok(nb) }, config)
    }

    /// A controller whose northbound connection is still being made by `nb`: the Kubernetes lists run
    /// while it connects and fills its replica, which takes seconds on a large database.
    pub fn connecting(
        client: kube::Client,
        nb: impl Future<Output = Result<Arc<dyn Northbound>>> + Send + 'static,
        config: Config,
    ) -> Self {
        Controller {
            client,
            nb: Mutex::new(Some(Box::pin(nb))),
            config,
            metrics: Metrics::new(),
            ipam: Arc::new(SharedIpam::new()),
        }
    }

    /// The metrics (serve [`Metrics::encode`] on `/metrics`).
    pub fn metrics(&self) -> Metrics {
        self.metrics.clone()
    }

    /// The allocator (for inspection).
    pub fn ipam(&self) -> Arc<SharedIpam> {
        self.ipam.clone()
    }

    /// Runs until `shutdown` completes (Ok) or leadership is lost (Err).
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<()> {
        let mut leading = match &self.config.lease {
            Some(l) => Some(
                LeaderElector::new(self.client.clone(), l.clone())
                    .acquire()
                    .await,
            ),
            None => None,
        };
        let lost = async {
            match leading.as_mut() {
                Some(rx) => {
                    while *rx.borrow() {
                        if rx.changed().await.is_err() {
                            break;
                        }
                    }
                }
                None => std::future::pending::<()>().await,
            }
        };
        let lost_error = || match &self.config.lease {
            Some(l) => ControllerError::LeadershipLost {
                lease: format!("{}/{}", l.namespace, l.name),
                identity: l.identity.clone(),
            },
            None => ControllerError::Stopped,
        };
        let tasks = Arc::new(Mutex::new(Vec::new()));
        // Dropping `run` (a crash-like stop) also stops every task it started.
        let _guard = AbortOnDrop(tasks.clone());
        let started = self.start(tasks.clone());
        tokio::pin!(shutdown);
        tokio::pin!(lost);
        let result = tokio::select! {
            r = started => match r {
                // The context lives as long as the workers run.
                Ok(_ctx) => tokio::select! {
                    _ = &mut shutdown => Ok(()),
                    _ = &mut lost => Err(lost_error()),
                },
                Err(e) => Err(e),
            },
            _ = &mut shutdown => Ok(()),
            _ = &mut lost => Err(lost_error()),
        };
        result
    }

    async fn start(&self, tasks: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>) -> Result<Arc<Ctx>> {
        let spawn = |f: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>| {
            tasks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(tokio::spawn(f));
        };
        let started = std::time::Instant::now();
        let c = &self.config;
        let default = subnet::info_from_config(&c.default_subnet, &c.default_vpc, false)?;
        let join = subnet::info_from_config(&c.join_subnet, &c.default_vpc, true)?;
        subnet::service_cidrs(c)?;
        let client = &self.client;

        // Informers and the IP record list first: they run while the northbound replica fills and the
        // default network is written. Stores fill now, keys are queued; workers start after the rebuild.
        let queues = Queues {
            pod: WorkQueue::new("pod"),
            subnet: WorkQueue::new("subnet"),
            node: WorkQueue::new("node"),
            namespace: WorkQueue::new("namespace"),
            pool: WorkQueue::new("ippool"),
            vpc: WorkQueue::new("vpc"),
        };
        let pod_tombstones = Arc::new(Tombstones::default());
        let node_tombstones = Arc::new(Tombstones::default());
        let subnet_tombstones = Arc::new(Tombstones::default());
        let pool_tombstones = Arc::new(Tombstones::default());
        let (pods, pods_w) = podstore::PodStore::new();
        let (nodes, nodes_w) = reflector::store::<Node>();
        let (namespaces, ns_w) = reflector::store::<Namespace>();
        let (subnet_store, subnet_w) = reflector::store::<Decoded<Subnet>>();
        let (pool_store, pool_w) = reflector::store::<Decoded<IPPool>>();
        let (vpcs, vpc_w) = reflector::store::<crate::crd::Vpc>();
        spawn(informer(
            Api::<PodInfo>::all(client.clone()),
            pods_w,
            queues.pod.clone(),
            Some(pod_tombstones.clone()),
            podinfo::trim,
        ));
        spawn(informer(
            Api::<Node>::all(client.clone()),
            nodes_w,
            queues.node.clone(),
            Some(node_tombstones.clone()),
            |_| {},
        ));
        spawn(informer(
            Api::<Namespace>::all(client.clone()),
            ns_w,
            queues.namespace.clone(),
            None,
            |_| {},
        ));
        spawn(informer(
            Api::<Decoded<Subnet>>::all(client.clone()),
            subnet_w,
            queues.subnet.clone(),
            Some(subnet_tombstones.clone()),
            |_| {},
        ));
        spawn(informer(
            Api::<Decoded<IPPool>>::all(client.clone()),
            pool_w,
            queues.pool.clone(),
            Some(pool_tombstones.clone()),
            |_| {},
        ));
        spawn(informer(
            Api::<crate::crd::Vpc>::all(client.clone()),
            vpc_w,
            queues.vpc.clone(),
            None,
            |_| {},
        ));
        // A task of its own (decoding beside the replica's fill), stopped with the others if the start fails.
        let (ip_tx, ip_records) = tokio::sync::oneshot::channel();
        spawn(Box::pin({
            let client = client.clone();
            async move {
                let _ = ip_tx.send(ip::list_records(&client).await);
            }
        }));

        let pending = self
            .nb
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| ControllerError::NotReady("the controller ran already".into()))?;
        // Two things at once: the northbound replica fills (then the default network is written), and the
        // informers list (then the allocations their objects record are gathered).
        let connected = async {
            let nb = pending.await?;
            tracing::info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "northbound replica ready"
            );
            // NB_Global, the default VPC, join and the default subnet, before any object is handled.
            let mut g = NbGlobal::new();
            for (k, v) in &c.nb_global_options {
                g = g.option(k, v);
            }
            g.execute(nb.as_ref()).await?;
            nb.commit(plan::vpc_batch(&c.default_vpc, &join)).await?;
            vpc::ensure_default(&self.client, &c.default_vpc).await?;
            subnet::ensure_subnet_object(&self.client, &join, false).await?;
            subnet::ensure_subnet_object(&self.client, &default, true).await?;
            Ok::<_, ControllerError>(nb)
        };
        let listed = async {
            let ready = |e: reflector::store::WriterDropped| {
                ControllerError::NotReady(format!("informer stopped: {e}"))
            };
            pods.wait_until_ready()
                .await
                .map_err(|e| ControllerError::NotReady(e.to_string()))?;
            nodes.wait_until_ready().await.map_err(ready)?;
            namespaces.wait_until_ready().await.map_err(ready)?;
            subnet_store.wait_until_ready().await.map_err(ready)?;
            pool_store.wait_until_ready().await.map_err(ready)?;
            vpcs.wait_until_ready().await.map_err(ready)?;
            let ips = ip_records
                .await
                .map_err(|_| ControllerError::NotReady("the ip record list stopped".into()))??;
            tracing::info!(
                pods = pods.len(),
                ip_records = ips.len(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "informers listed"
            );
            Ok::<_, ControllerError>((rebuild::object_records(&pods, &nodes), ips))
        };
        let (nb, (records, ips)) = tokio::try_join!(connected, listed)?;

        let writer = NbWriter::spawn(nb.clone(), c.writer.clone(), Some(self.metrics.clone()));
        let reporter = Reporter {
            controller: c.reporter.clone(),
            instance: c.lease.as_ref().map(|l| l.identity.clone()),
        };
        let ctx = Arc::new(Ctx {
            client: self.client.clone(),
            nb,
            writer,
            ipam: self.ipam.clone(),
            config: c.clone(),
            metrics: self.metrics.clone(),
            recorder: Recorder::new(self.client.clone(), reporter),
            subnets: RwLock::new(HashMap::new()),
            pools: RwLock::new(HashMap::new()),
            pods,
            nodes,
            namespaces,
            subnet_store,
            pool_store,
            vpcs,
            pod_tombstones,
            node_tombstones,
            subnet_tombstones,
            pool_tombstones,
            queues,
            waiting: pod::Waiting::default(),
            reservations: Mutex::default(),
        });
        let (report, orphans) =
            rebuild::rebuild(&ctx, &[join.clone(), default.clone()], records, ips)?;
        for c in &report.conflicts {
            tracing::warn!(subnet = %c.record.subnet, pod = %c.record.pod, error = %c.error, "ipam conflict at rebuild");
        }
        // The join and default subnets exist in NB before any pod or node is handled.
        subnet::reconcile_info(&ctx, &join).await?;
        subnet::reconcile_info(&ctx, &default).await?;
        // What went away while the controller was down is released before it reports started.
        gc::at_start(&ctx, orphans).await?;

        let w = c.workers;
        let q = &ctx.queues;
        spawn(Box::pin(run_queue(
            ctx.clone(),
            q.subnet.clone(),
            w,
            "subnet",
            |ctx, k| Box::pin(async move { subnet::reconcile(&ctx, &k).await }),
        )));
        spawn(Box::pin(run_queue(
            ctx.clone(),
            q.vpc.clone(),
            w,
            "vpc",
            |ctx, k| Box::pin(async move { vpc::reconcile(&ctx, &k).await }),
        )));
        spawn(Box::pin(run_queue(
            ctx.clone(),
            q.pool.clone(),
            w,
            "ippool",
            |ctx, k| Box::pin(async move { subnet::reconcile_pool(&ctx, &k).await }),
        )));
        spawn(Box::pin(run_queue(
            ctx.clone(),
            q.node.clone(),
            w,
            "node",
            |ctx, k| Box::pin(async move { node::reconcile(&ctx, &k).await }),
        )));
        spawn(Box::pin(run_queue(
            ctx.clone(),
            q.namespace.clone(),
            w,
            "namespace",
            |ctx, k| Box::pin(async move { namespace::reconcile(&ctx, &k).await }),
        )));
        spawn(Box::pin(run_queue(
            ctx.clone(),
            q.pod.clone(),
            c.pod_workers,
            "pod",
            |ctx, k| Box::pin(async move { pod::reconcile(&ctx, &k).await }),
        )));
        spawn(Box::pin(ip::watch_reservations(ctx.clone())));
        spawn(Box::pin(gc::run(ctx.clone())));
        spawn(Box::pin(subnet::status_loop(ctx.clone())));
        spawn(Box::pin(queue_metrics(ctx.clone())));
        spawn(Box::pin(log_initial_pods(ctx.clone(), started)));
        tracing::info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "controller started"
        );
        Ok(ctx)
    }
}

type Tasks = Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>;

struct AbortOnDrop(Tasks);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for t in self.0.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            t.abort();
        }
    }
}

type BoxFut = std::pin::Pin<Box<dyn Future<Output = Result<()>> + Send>>;

/// The retry delay of a key whose handler lost the northbound connection. Not the queue's growing backoff:
/// each attempt already waits for the northbound (the session reconnects with its own backoff, a commit
/// waits for the replica), so a long outage must not leave keys minutes away once it ends.
const NB_RETRY: Duration = Duration::from_millis(500);

async fn run_queue(
    ctx: Arc<Ctx>,
    q: Arc<WorkQueue<String>>,
    workers: usize,
    kind: &'static str,
    handle: fn(Arc<Ctx>, String) -> BoxFut,
) {
    let c = ctx.clone();
    let queue = q.clone();
    q.run(workers, Some(ctx.metrics.clone()), move |k: String| {
        let ctx = c.clone();
        let queue = queue.clone();
        async move {
            match handle(ctx.clone(), k.clone()).await {
                Ok(()) => Ok(()),
                Err(e) if e.is_nb_connection_error() => {
                    ctx.metrics.handler_error(kind);
                    tracing::warn!(kind, key = %k, error = %e, retry_ms = NB_RETRY.as_millis() as u64, "handler failed");
                    queue.add_after(k, NB_RETRY);
                    Err(false)
                }
                Err(e) => {
                    ctx.metrics.handler_error(kind);
                    let retry = !e.is_permanent();
                    tracing::warn!(kind, key = %k, error = %e, retry, "handler failed");
                    Err(retry)
                }
            }
        }
    })
    .await;
}

/// Logs when the pods queued at start have all been handled (the first time the pod queue is idle).
async fn log_initial_pods(ctx: Arc<Ctx>, started: std::time::Instant) {
    while !ctx.queues.pod.is_idle() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tracing::info!(
        pods = ctx.pods.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "initial pods handled"
    );
}

async fn queue_metrics(ctx: Arc<Ctx>) {
    loop {
        let q = &ctx.queues;
        for w in [&q.pod, &q.subnet, &q.node, &q.namespace, &q.pool, &q.vpc] {
            ctx.metrics.queue_depth(w.name(), w.len());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The key of an object in its queue: `namespace/name` or `name`.
pub(crate) fn key_of<K: Resource>(o: &K) -> String {
    match o.meta().namespace.as_deref() {
        Some(ns) => format!("{ns}/{}", o.meta().name.as_deref().unwrap_or_default()),
        None => o.meta().name.clone().unwrap_or_default(),
    }
}

/// Deleted objects by key.
pub(crate) type Tombstones<K> = Mutex<HashMap<String, Arc<K>>>;

/// Where an informer applies its events: kube-runtime's store, or the compact [`podstore::PodStore`].
trait StoreWriter<K>: Send + 'static {
    fn apply(&mut self, ev: &watcher::Event<K>);
}

impl<K> StoreWriter<K> for reflector::store::Writer<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    fn apply(&mut self, ev: &watcher::Event<K>) {
        self.apply_watcher_event(ev);
    }
}

impl StoreWriter<PodInfo> for podstore::PodStoreWriter {
    fn apply(&mut self, ev: &watcher::Event<PodInfo>) {
        podstore::PodStoreWriter::apply(self, ev);
    }
}

fn informer<K>(
    api: Api<K>,
    mut writer: impl StoreWriter<K>,
    queue: Arc<WorkQueue<String>>,
    tomb: Option<Arc<Tombstones<K>>>,
    trim: fn(&mut K),
) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    Box::pin(async move {
        let stream = watcher::watcher(api, watcher::Config::default().any_semantic())
            .default_backoff()
            .modify(move |o: &mut K| {
                // managedFields are never read; dropping them keeps the store small.
                o.meta_mut().managed_fields = None;
                trim(o);
            });
        let stream = stream.inspect_ok(move |ev| writer.apply(ev));
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(WatchEvent::Apply(o)) | Ok(WatchEvent::InitApply(o)) => {
                    let k = key_of(&o);
                    if let Some(t) = &tomb {
                        t.lock().unwrap_or_else(|e| e.into_inner()).remove(&k);
                    }
                    queue.add(k);
                }
                Ok(WatchEvent::Delete(o)) => {
                    let k = key_of(&o);
                    if let Some(t) = &tomb {
                        t.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(k.clone(), Arc::new(o));
                    }
                    queue.add(k);
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(queue = queue.name(), error = %e, "watch"),
            }
        }
    })
}

/// Takes the tombstone of `key`, if any.
pub(crate) fn take_tomb<K>(m: &Mutex<HashMap<String, Arc<K>>>, key: &str) -> Option<Arc<K>> {
    m.lock().unwrap_or_else(|e| e.into_inner()).remove(key)
}

/// `namespace/name` split.
pub(crate) fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}
