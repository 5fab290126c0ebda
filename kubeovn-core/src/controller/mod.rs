//! The Kube-OVN controller as a library: watches Kubernetes and Kube-OVN's CRDs, allocates addresses with
//! kubeovn-ipam and writes the logical network through [`Northbound`].
//!
//! [`Controller::run`] does what kube-ovn-controller does at start: leader election (a Lease, if configured);
//! then, at the same time, the informers' first lists and the IP record list on one side, and on the other
//! the northbound replica (with [`Controller::connecting`], still filling), NB_Global options, the default VPC
//! router and the `join` and default subnets (Subnet objects created if missing); then the IPAM rebuild from
//! every source at once (Subnets, IPPools, IP records, pod and node annotations and the northbound ports),
//! which also finds what pods and nodes deleted while the controller was down left behind; the kinds' and
//! tasks' start hooks remove it before the controller reports started. Then every kind's and task's workers
//! run on the framework ([`framework`]): the kinds (pods, nodes, namespaces, VPCs, subnets, IPPools, users'
//! IP reservations, Services, NetworkPolicies and admin policies) and the tasks (garbage collection, Subnet
//! status, gateway checks, the policy sets' writer, queue depths). Each step's time since the start is logged
//! at info level. The map of the kinds, their state and relations is ARCHITECTURE.md.
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

// The framework and what every kind shares (see ARCHITECTURE.md for the map).
pub mod error;
pub mod framework;
pub mod leader;
pub mod metrics;
pub mod queue;
pub mod writer;
// Below the kinds: pure translations, views, seams.
mod api;
mod gateway;
pub mod plan;
pub mod podinfo;
mod podstore;
mod reservations;
pub mod sb;
mod subnet_spec;
mod views;
// The start sequence.
mod rebuild;
// The kinds: one module each; none imports another.
mod ip;
mod ippool;
mod namespace;
pub mod netpol;
mod node;
mod pod;
pub mod service;
mod subnet;
mod vpc;
// Tasks on the framework.
pub mod gateway_check;
mod gc;
mod status;
#[cfg(test)]
mod testing;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::Resource;
use kubeovn_ipam::SharedIpam;
use kubeovn_ovn::northbound::{NbGlobal, Northbound};
pub use podinfo::PodInfo;

use crate::events::EventSink;
use crate::naming;

pub use error::{ControllerError, Result};
use framework::{Context, Key, Kinds, Workers};
pub use gateway_check::{GatewayProbe, IcmpProbe, ProbeResult};
pub use leader::{LeaderElector, LeaseConfig};
pub use metrics::Metrics;
pub use plan::SubnetInfo;
pub use queue::WorkQueue;
pub use sb::{SbRemote, Southbound};
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
    probe: Arc<dyn GatewayProbe>,
    events: Option<Arc<dyn EventSink>>,
    sb: Option<Arc<dyn Southbound>>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What every kind shares: the northbound and its writer, the API client, the allocator, the event sink,
/// the kinds' stores and queues, and the read-only views. What one kind keeps for itself lives in that
/// kind's reconciler, not here.
pub(crate) struct Ctx {
    pub client: kube::Client,
    pub nb: Arc<dyn Northbound>,
    pub writer: NbWriter,
    pub ipam: Arc<SharedIpam>,
    pub config: Config,
    pub metrics: Metrics,
    pub events: Arc<dyn EventSink>,
    /// The southbound, where a deleted node's chassis goes (None: left to whoever runs OVN).
    pub sb: Option<Arc<dyn Southbound>>,
    /// The kinds: stores, queues, tombstones.
    pub kinds: Arc<Kinds>,
    /// What several kinds read.
    pub views: Arc<views::Views>,
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
    /// The admitted subnet `name`.
    pub fn subnet(&self, name: &str) -> Option<Arc<SubnetInfo>> {
        self.views.subnet(name)
    }

    /// Every admitted subnet, by name.
    pub fn subnet_list(&self) -> Vec<Arc<SubnetInfo>> {
        self.views.subnet_list()
    }

    /// The join subnet, once loaded.
    pub fn join_subnet(&self) -> Option<Arc<SubnetInfo>> {
        self.views.join_subnet()
    }

    /// The Node `name`, as stored.
    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.kinds.get(&Key::cluster(name))
    }

    /// Every Node stored.
    pub fn nodes(&self) -> Vec<Arc<Node>> {
        self.kinds.list::<Node>()
    }

    /// The compact pod store (the pod kind's store, read by other kinds and tasks).
    pub fn pods(&self) -> &podstore::PodStore {
        static EMPTY: std::sync::OnceLock<podstore::PodStore> = std::sync::OnceLock::new();
        self.kinds
            .store_as::<PodInfo, podstore::PodStore>()
            .unwrap_or_else(|| EMPTY.get_or_init(|| podstore::PodStore::new().0))
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
        if let Err(e) = self.events.publish(&ev, r).await {
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
            probe: Arc::new(IcmpProbe),
            events: None,
            sb: None,
        }
    }

    /// Checks gateway nodes with `probe` instead of ICMP echo.
    pub fn with_gateway_probe(mut self, probe: Arc<dyn GatewayProbe>) -> Self {
        self.probe = probe;
        self
    }

    /// Publishes events through `events` instead of the API server's events API.
    pub fn with_events(mut self, events: Arc<dyn EventSink>) -> Self {
        self.events = Some(events);
        self
    }

    /// Removes deleted nodes' chassis through `sb` (instead of a connection to `Config::sb_remote`).
    pub fn with_southbound(mut self, sb: Arc<dyn Southbound>) -> Self {
        self.sb = Some(sb);
        self
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
        // The start hooks (what went away while the controller was down is released), then every kind's and
        // task's workers.
        let workers = workers
            .start(ctx.clone())
            .await
            .map_err(|e| ControllerError::NotReady(e.to_string()))?;
        for w in workers {
            spawn(w);
        }
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
        let default = subnet_spec::info_from_config(&c.default_subnet, &c.default_vpc, false)?;
        let join = subnet_spec::info_from_config(&c.join_subnet, &c.default_vpc, true)?;
        subnet_spec::service_cidrs(c)?;
        let client = &self.client;

        // Informers and the IP record list first: they run while the northbound replica fills and the
        // default network is written. Stores fill now, keys are queued; workers start after the rebuild.
        // Each kind and task: one line (its module holds the reconciler and its state).
        let views = views::Views::new(self.ipam.clone(), c.clone());
        let mut kinds = Kinds::builder::<Ctx>(client.clone());
        let (pods, pods_w) = podstore::PodStore::new();
        kinds.reconcile_in(
            pod::Pods::new(c.pod_workers),
            Arc::new(pods.clone()),
            pods_w,
        );
        kinds.reconcile(node::Nodes);
        kinds.reconcile(namespace::Namespaces::new(c));
        kinds.reconcile(vpc::Vpcs);
        kinds.reconcile(subnet::Subnets::new(views.clone()));
        kinds.reconcile(ippool::Pools);
        kinds.reconcile(ip::IpReservations);
        let (slices, slices_w) = service::SliceStore::new();
        kinds.watch_in(Arc::new(slices), slices_w);
        kinds.reconcile(service::Services::default());
        let np = Arc::new(netpol::NetpolState::new(
            netpol::families(&c.default_subnet.cidr),
            c.join_subnet.cidr.split(',').map(str::to_owned).collect(),
        ));
        kinds.watch_with::<netpol::PolicyPod>(netpol::pod_watch());
        kinds.reconcile(netpol::NetworkPolicies::new(np.clone()));
        kinds.reconcile(netpol::AdminPolicies::<crate::crd::AdminNetworkPolicy>::new(np.clone()));
        kinds.reconcile(netpol::AdminPolicies::<
            crate::crd::BaselineAdminNetworkPolicy,
        >::new(np.clone()));
        kinds.task(netpol::Flusher::new(np));
        kinds.task(gc::Gc::default());
        kinds.task(status::SubnetStatus::default());
        kinds.task(gateway_check::GatewayCheck::new(self.probe.clone()));
        kinds.task(status::QueueDepths);
        kinds.task(status::InitialPods::new(started));
        let (kinds, kinds_start) = kinds.build();
        views.attach(kinds.clone());
        for i in kinds_start.informers {
            spawn(i);
        }
        // A task of its own (decoding beside the replica's fill), stopped with the others if the start fails.
        let (ip_tx, ip_records) = tokio::sync::oneshot::channel();
        spawn(Box::pin({
            let client = client.clone();
            async move {
                let _ = ip_tx.send(api::list_records(&client).await);
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
        let events = self.events.clone().unwrap_or_else(|| {
            let reporter = Reporter {
                controller: c.reporter.clone(),
                instance: c.lease.as_ref().map(|l| l.identity.clone()),
            };
            Arc::new(Recorder::new(self.client.clone(), reporter))
        });
        let sb = self.sb.clone().or_else(|| {
            c.sb_remote
                .clone()
                .map(|r| Arc::new(SbRemote(r)) as Arc<dyn Southbound>)
        });
        let ctx = Arc::new(Ctx {
            client: self.client.clone(),
            nb,
            writer,
            ipam: self.ipam.clone(),
            config: c.clone(),
            metrics: self.metrics.clone(),
            events,
            sb,
            kinds: kinds.clone(),
            views,
        });
        let (report, orphans) =
            rebuild::rebuild(&ctx, &[join.clone(), default.clone()], records, ips)?;
        for c in &report.conflicts {
            tracing::warn!(subnet = %c.record.subnet, pod = %c.record.pod, error = %c.error, "ipam conflict at rebuild");
        }
        // The join and default subnets exist in NB before any pod or node is handled.
        subnet::reconcile_info(&ctx, &join).await?;
        subnet::reconcile_info(&ctx, &default).await?;
        // What went away while the controller was down is released by the GC's start hook, before the
        // controller reports started.
        if let Some(gc) = kinds.reconciler::<gc::Gc>() {
            gc.at_start_remove(orphans);
        }
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

/// `namespace/name` split.
pub(crate) fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}
