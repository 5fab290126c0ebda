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
pub mod framework;
pub mod leader;
pub mod metrics;
pub mod plan;
pub mod queue;
pub mod writer;

mod gateway;
mod gc;
mod ip;
mod ippool;
mod namespace;
pub mod netpol;
mod node;
mod pod;
pub mod podinfo;
mod podstore;
mod rebuild;
mod sb;
pub mod service;
mod subnet;
#[cfg(test)]
mod testing;
mod vpc;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::Resource;
use kubeovn_ipam::SharedIpam;
use kubeovn_ovn::northbound::{NbGlobal, Northbound};
pub use podinfo::PodInfo;

use crate::naming;

pub use error::{ControllerError, Result};
use framework::{Context, Key, Kinds, Workers};
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
    /// Pod handlers running at once, and Service handlers (each kind its own pool).
    pub pod_workers: usize,
    /// Handlers of the other kinds running at once (each).
    pub workers: usize,
    /// Northbound write grouping.
    pub writer: WriterConfig,
    /// Interval between garbage collection passes (an orphan found in one pass is removed in the next).
    pub gc_interval: Duration,
    /// Interval between Subnet status updates.
    pub status_interval: Duration,
    /// The southbound database (comma-separated remotes): a deleted node's chassis is removed from it.
    /// `None`: chassis are left to whoever runs OVN.
    pub sb_remote: Option<String>,
    /// Interval between checks of centralized subnets' gateway nodes (ICMP echo to their join addresses;
    /// two missed in a row take a node out).
    pub gateway_check_interval: Duration,
    /// Leader election; None runs without it.
    pub lease: Option<LeaseConfig>,
    /// `reportingController` of Events.
    pub reporter: String,
    /// How `sessionAffinity: ClientIP` is programmed.
    pub session_affinity: SessionAffinity,
}

/// How a Service's `sessionAffinity: ClientIP` becomes OVN load balancer settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionAffinity {
    /// `selection_fields=ip_src`: a client address always hashes to the same backend while the backends stay;
    /// `timeoutSeconds` is not applied. The default: OVN 23.03's `affinity_timeout` learn flow drops the
    /// packet that creates the affinity (each new client's first SYN or datagram is lost).
    #[default]
    SourceHash,
    /// `options:affinity_timeout` with the Service's `timeoutSeconds` (OVN releases whose learn flow passes
    /// the packet on).
    Timeout,
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
            gateway_check_interval: Duration::from_secs(1),
            sb_remote: None,
            lease: None,
            reporter: "kube-ovn-controller".to_owned(),
            session_affinity: SessionAffinity::default(),
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
    /// The kinds: stores, queues, tombstones.
    pub kinds: Arc<Kinds>,
    /// The compact pod store (also the pod kind's store in `kinds`).
    pub pods: podstore::PodStore,
    /// Pods waiting for an address in a full subnet.
    pub waiting: pod::Waiting,
    /// Users' reservations (IP records) the allocator holds or that wait for their subnet.
    pub reservations: Mutex<ip::Reservations>,
    /// EndpointSlices, indexed by Service.
    pub slices: service::SliceStore,
    /// What each Service has in OVN.
    pub services: service::ServiceState,
    /// The sets network policies name, and their members.
    pub netpol: Arc<netpol::NetpolState>,
    /// What the checks of gateway nodes found.
    pub gateways: gateway::GatewayHealth,
}

impl Context for Ctx {
    fn kinds(&self) -> &Kinds {
        &self.kinds
    }
    fn workers(&self) -> usize {
        self.config.workers
    }
    fn metrics(&self) -> Option<&Metrics> {
        Some(&self.metrics)
    }
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

    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.kinds.get(&Key::cluster(name))
    }

    pub fn nodes(&self) -> Vec<Arc<Node>> {
        self.kinds.list::<Node>()
    }

    pub fn namespaces(&self) -> Vec<Arc<Namespace>> {
        self.kinds.list::<Namespace>()
    }

    /// Queues `key` for its kind's reconciler.
    pub fn enqueue<K: 'static>(&self, key: Key<K>) {
        self.kinds.enqueue(key);
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

    async fn start(&self, tasks: Tasks) -> Result<Arc<Ctx>> {
        let started = std::time::Instant::now();
        let (ctx, workers) = self.prepare(&tasks, started).await?;
        let spawn = |f: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>| {
            tasks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(tokio::spawn(f));
        };
        for w in workers.run(ctx.clone()) {
            spawn(w);
        }
        spawn(Box::pin(ip::watch_reservations(ctx.clone())));
        spawn(Box::pin(gc::run(ctx.clone())));
        spawn(Box::pin(subnet::status_loop(ctx.clone())));
        spawn(Box::pin(gateway::check_loop(ctx.clone())));
        spawn(Box::pin(queue_metrics(ctx.clone())));
        spawn(Box::pin(log_initial_pods(ctx.clone(), started)));
        tracing::info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "controller started"
        );
        Ok(ctx)
    }

    /// Everything the start does before the workers run: the watches (spawned into `tasks`), the northbound
    /// replica, the default network, the IPAM rebuild and the release of what went away meanwhile. Unit tests
    /// stop here and drive the reconcilers themselves.
    pub(crate) async fn prepare(
        &self,
        tasks: &Tasks,
        started: std::time::Instant,
    ) -> Result<(Arc<Ctx>, Workers<Ctx>)> {
        let spawn = |f: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>| {
            tasks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(tokio::spawn(f));
        };
        let c = &self.config;
        let default = subnet::info_from_config(&c.default_subnet, &c.default_vpc, false)?;
        let join = subnet::info_from_config(&c.join_subnet, &c.default_vpc, true)?;
        subnet::service_cidrs(c)?;
        let client = &self.client;

        // Informers and the IP record list first: they run while the northbound replica fills and the
        // default network is written. Stores fill now, keys are queued; workers start after the rebuild.
        // Each kind: one line (its module holds the reconciler).
        let mut kinds = Kinds::builder::<Ctx>(client.clone());
        let (pods, pods_w) = podstore::PodStore::new();
        kinds.reconcile_in::<pod::Pods>(Arc::new(pods.clone()), pods_w);
        kinds.reconcile::<node::Nodes>();
        kinds.reconcile::<namespace::Namespaces>();
        kinds.reconcile::<vpc::Vpcs>();
        kinds.reconcile::<subnet::Subnets>();
        kinds.reconcile::<ippool::Pools>();
        let (slices, slices_w) = service::SliceStore::new();
        kinds.watch_in(Arc::new(slices.clone()), slices_w);
        kinds.reconcile::<service::Services>();
        let np_state = Arc::new(netpol::NetpolState::new(
            netpol::families(&c.default_subnet.cidr),
            c.join_subnet.cidr.split(',').map(str::to_owned).collect(),
        ));
        kinds.watch_with::<netpol::PolicyPod>(netpol::pod_watch());
        kinds.provide(np_state.clone());
        kinds.reconcile::<netpol::NetworkPolicies>();
        kinds.reconcile::<netpol::AdminPolicies<crate::crd::AdminNetworkPolicy>>();
        kinds.reconcile::<netpol::AdminPolicies<crate::crd::BaselineAdminNetworkPolicy>>();
        let (kinds, kinds_start) = kinds.build();
        for i in kinds_start.informers {
            spawn(i);
        }
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
            kinds
                .ready()
                .await
                .map_err(|e| ControllerError::NotReady(format!("informer stopped: {e}")))?;
            let ips = ip_records
                .await
                .map_err(|_| ControllerError::NotReady("the ip record list stopped".into()))??;
            tracing::info!(
                pods = pods.len(),
                ip_records = ips.len(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "informers listed"
            );
            Ok::<_, ControllerError>((rebuild::object_records(&pods, &kinds.list::<Node>()), ips))
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
            kinds: kinds.clone(),
            pods,
            waiting: pod::Waiting::default(),
            reservations: Mutex::default(),
            slices,
            services: service::ServiceState::default(),
            netpol: np_state,
            gateways: gateway::GatewayHealth::default(),
        });
        spawn(Box::pin(netpol::run_flusher(ctx.clone())));
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
        service::remove_stale(&ctx).await?;
        Ok((ctx, kinds_start.workers))
    }
}

pub(crate) type Tasks = Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>;

pub(crate) struct AbortOnDrop(pub(crate) Tasks);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for t in self.0.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            t.abort();
        }
    }
}

/// Logs when the pods queued at start have all been handled (the first time the pod queue is idle).
async fn log_initial_pods(ctx: Arc<Ctx>, started: std::time::Instant) {
    while !ctx.kinds.is_idle::<PodInfo>() {
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
        ctx.kinds.publish_depths(&ctx.metrics);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `namespace/name` split.
pub(crate) fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}
