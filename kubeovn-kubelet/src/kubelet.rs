//! The sandbox kubelet: the one node's agent. It registers the Node, schedules every pod without a
//! `spec.nodeName` onto it, and for each of its pods makes a network namespace (the pod sandbox), runs CNI
//! `ADD` through the installed conflist exactly as a runtime would, and reports `Running` with the pod's
//! addresses. A deleted pod (or one marked for deletion) gets CNI `DEL` and its namespace removed.
//!
//! Each sandbox is recorded in `DIR/pods/<uid>.json` before anything is made, so that a restarted kubelet
//! (or `down`) finds and removes what a pod left behind.
//!
//! Once a pod's sandbox is up, a supervisor task runs its containers ([`crate::containers`]: `command` and
//! `args` as host processes in the pod's namespace), restarts them per `restartPolicy`, runs their readiness
//! probes and patches the pod's status when it changes. The containers' monitor processes are kept in the
//! pod's record: a restarted kubelet takes them over, and a deleted pod (or `down`) stops their process
//! groups before its namespace goes. Pods on the host network get no sandbox and run no process.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, PodStatus};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::json;

use crate::cni::{Attachment, CniRuntime};
use crate::containers::{
    backoff, pod_dir, pod_status, read_exit, restarts, shim_command, status_patch, time_of,
    ContainerPlan, ContainerRecord, ContainerView, Exit, Probe, ProbeAction, ProbeState,
};
use kubeovn_sandbox_state::procs::{spawn_detached, ProcRecord};
pub use kubeovn_sandbox_state::records::{all_records, find_record, records, PodRecord};
use kubeovn_sandbox_state::records::{now_ms, parse_pod};
use kubeovn_sandbox_state::state::{read_json, Settings, StateDir};
use kubeovn_sandbox_state::transport::in_netns;
use kubeovn_sandbox_state::SandboxError;

/// The grace period of a container's processes between SIGTERM and SIGKILL when its pod goes.
pub const STOP_GRACE: Duration = Duration::from_secs(3);

/// Removes a sandbox: stops its containers' process groups, then CNI `DEL` (tried a few times while the
/// daemon answers "try again"), the network namespace, the record and the containers' logs. The namespace
/// goes even if `DEL` failed: the veth pair dies with it.
pub fn teardown(dir: &StateDir, cni: Option<&CniRuntime>, rec: &PodRecord, attempts: u32) {
    for c in &rec.containers {
        if let Some(p) = &c.proc {
            p.stop_group(STOP_GRACE);
            p.reap();
        }
    }
    if let Some(cni) = cni {
        for i in 0..attempts.max(1) {
            match cni.del(&Attachment::of(rec)) {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(
                        "DEL {}/{} (attempt {}): {e}",
                        rec.namespace,
                        rec.name,
                        i + 1
                    );
                    std::thread::sleep(Duration::from_millis(300));
                }
            }
        }
    }
    let ns_dir = rec.netns.parent().unwrap_or(Path::new("/"));
    if let Err(e) = kubeovn_netdev::delete_named_netns(ns_dir, &rec.netns_name) {
        tracing::warn!("delete netns {}: {e}", rec.netns_name);
    }
    PodRecord::remove(dir, &rec.uid);
    let _ = std::fs::remove_dir_all(pod_dir(&dir.pods_dir(), &rec.uid));
}

/// The log file of a container of pod `NAMESPACE/POD` (its only container when `container` is `None`).
pub fn log_file(
    dir: &StateDir,
    target: &str,
    container: Option<&str>,
) -> Result<PathBuf, SandboxError> {
    let err = |detail: String| SandboxError::Failed {
        what: "logs",
        detail,
    };
    let (ns, name) = parse_pod(target)?;
    let rec = find_record(dir, &ns, &name).ok_or_else(|| {
        err(format!(
            "no sandbox for pod {ns}/{name} in {} (kube-ovn-sandbox status lists them)",
            dir.root().display()
        ))
    })?;
    let names: Vec<&str> = rec.containers.iter().map(|c| c.name.as_str()).collect();
    let chosen = match (container, names.as_slice()) {
        (Some(c), _) if names.contains(&c) => c,
        (Some(c), _) => {
            return Err(err(format!(
                "container {c} is not valid for pod {ns}/{name}: choose one of [{}]",
                names.join(" ")
            )))
        }
        (None, [one]) => one,
        (None, []) => return Err(err(format!("pod {ns}/{name} has no container yet"))),
        (None, _) => {
            return Err(err(format!(
                "pod {ns}/{name} has several containers: choose one of [{}] with -c",
                names.join(" ")
            )))
        }
    };
    Ok(rec.log_path(dir, chosen))
}

/// A kube client from a kubeconfig file.
pub async fn client(kubeconfig: &Path) -> Result<kube::Client, SandboxError> {
    let kube_err = |e: String| SandboxError::Failed {
        what: "kubernetes client",
        detail: e,
    };
    let kc =
        kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| kube_err(e.to_string()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| kube_err(e.to_string()))?;
    kube::Client::try_from(cfg).map_err(|e| kube_err(e.to_string()))
}

fn kube_err(what: &'static str) -> impl Fn(kube::Error) -> SandboxError {
    move |e| SandboxError::Failed {
        what,
        detail: e.to_string(),
    }
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Creates the Node object (or refreshes it) and reports it Ready.
pub async fn register_node(
    client: &kube::Client,
    name: &str,
    ip: &str,
) -> Result<(), SandboxError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kube-ovn/role": "master",
        }},
    }))
    .map_err(|e| SandboxError::Failed {
        what: "node object",
        detail: e.to_string(),
    })?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(kube_err("register node")(e)),
    }
    let t = now();
    let status = json!({"status": {
        "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "kube-ovn-sandbox kubelet is posting ready status",
                        "lastHeartbeatTime": t, "lastTransitionTime": t}],
        "nodeInfo": {"kubeletVersion": "kube-ovn-sandbox", "operatingSystem": "linux",
                     "architecture": std::env::consts::ARCH},
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(kube_err("node status"))?;
    Ok(())
}

/// The node a pod goes to: among the Ready, schedulable nodes whose labels hold every pair of the pod's
/// `nodeSelector`, the one running the fewest pods (by name on a tie); `None` if none fits.
pub fn pick_node(pod: &Pod, nodes: &[Node], pods: &[Pod]) -> Option<String> {
    let selector = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.clone())
        .unwrap_or_default();
    let ready = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            && n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true)
    };
    let load = |name: &str| {
        pods.iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name))
            .filter(|p| {
                !matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
            })
            .count()
    };
    nodes
        .iter()
        .filter(|n| ready(n))
        .filter(|n| {
            let labels = n.metadata.labels.clone().unwrap_or_default();
            selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        })
        .filter_map(|n| n.metadata.name.clone())
        .min_by(|a, b| load(a).cmp(&load(b)).then_with(|| a.cmp(b)))
}

/// Per-pod state: serialises setup and teardown of one pod.
#[derive(Default)]
struct PodSlot {
    lock: tokio::sync::Mutex<()>,
    deleted: AtomicBool,
    in_flight: AtomicBool,
    supervised: AtomicBool,
}

/// How often a pod's supervisor looks at its processes and probes.
const TICK: Duration = Duration::from_millis(200);

/// A container's readiness probe between runs.
struct ProbeRun {
    /// The run of the container it probes (its start time).
    started_ms: u64,
    state: ProbeState,
    /// When the next probe is due (Unix ms).
    next_ms: u64,
}

/// The running kubelet.
pub struct Kubelet {
    dir: StateDir,
    settings: Settings,
    client: kube::Client,
    cni: Arc<CniRuntime>,
    /// The program whose `container-run` monitors containers: this one.
    shim: PathBuf,
    slots: Mutex<HashMap<String, Arc<PodSlot>>>,
}

impl std::fmt::Debug for Kubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet")
            .field("dir", &self.dir)
            .field("node", &self.settings.node_name)
            .finish_non_exhaustive()
    }
}

impl Kubelet {
    /// A kubelet for the sandbox in `dir` (reads its settings, kubeconfig and conflist).
    pub async fn new(dir: StateDir) -> Result<Arc<Kubelet>, SandboxError> {
        let settings = dir.load_settings()?;
        let client = client(&dir.kubeconfig()).await?;
        let cni = CniRuntime::load(&dir.cni_bin_dir(), &dir.conflist())?;
        // This very program, even after a rebuild replaced its file (`/proc/self/exe` of the forked child
        // is the kubelet's own image).
        let shim = PathBuf::from("/proc/self/exe");
        Ok(Arc::new(Kubelet {
            dir,
            settings,
            client,
            cni: Arc::new(cni),
            shim,
            slots: Mutex::new(HashMap::new()),
        }))
    }

    fn slot(&self, uid: &str) -> Arc<PodSlot> {
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(uid.to_owned())
            .or_default()
            .clone()
    }

    /// Registers the node, then serves its pods until `shutdown` completes. Sandboxes stay on shutdown (as
    /// with a kubelet restart); `down` removes them.
    pub async fn run(
        self: Arc<Self>,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), SandboxError> {
        register_node(
            &self.client,
            &self.settings.node_name,
            &self.settings.node_ip,
        )
        .await?;
        let heartbeat = {
            let k = self.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    let _ =
                        register_node(&k.client, &k.settings.node_name, &k.settings.node_ip).await;
                }
            })
        };
        let pods: Api<Pod> = Api::all(self.client.clone());
        let mut events = watcher(pods, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut seen: HashSet<String> = HashSet::new();
        tokio::pin!(shutdown);
        loop {
            let ev = tokio::select! {
                _ = &mut shutdown => break,
                ev = events.next() => ev,
            };
            match ev {
                None => break,
                Some(Err(e)) => tracing::warn!("pod watch: {e}"),
                Some(Ok(watcher::Event::Init)) => seen.clear(),
                Some(Ok(watcher::Event::InitApply(p))) => {
                    seen.insert(p.uid().unwrap_or_default());
                    self.clone().on_pod(p).await;
                }
                Some(Ok(watcher::Event::InitDone)) => self.clone().orphans(&seen),
                Some(Ok(watcher::Event::Apply(p))) => self.clone().on_pod(p).await,
                Some(Ok(watcher::Event::Delete(p))) => {
                    if let Some(uid) = p.uid() {
                        self.clone().remove(uid);
                    }
                }
            }
        }
        heartbeat.abort();
        Ok(())
    }

    /// Sandboxes whose pod no longer exists (deleted while the kubelet was down).
    fn orphans(self: Arc<Self>, seen: &HashSet<String>) {
        for r in records(&self.dir) {
            if !seen.contains(&r.uid) {
                self.clone().remove(r.uid);
            }
        }
    }

    async fn on_pod(self: Arc<Self>, pod: Pod) {
        let (Some(ns), Some(uid)) = (pod.namespace(), pod.uid()) else {
            return;
        };
        let name = pod.name_any();
        let spec = pod.spec.clone().unwrap_or_default();
        let node = self.settings.node_name.clone();
        match spec.node_name.as_deref() {
            None | Some("") => {
                // The scheduler's part, done by one node's kubelet.
                if self.settings.schedules {
                    self.schedule(&ns, &name).await;
                }
                return;
            }
            Some(n) if n != node => return,
            _ => {}
        }
        if pod.metadata.deletion_timestamp.is_some() {
            self.remove(uid);
            return;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        let have = PodRecord::path(&self.dir, &uid).exists();
        let slot = self.slot(&uid);
        if have && matches!(phase.as_deref(), Some("Running" | "Succeeded" | "Failed")) {
            // Up already (a restarted kubelet takes over its containers).
            self.supervise_once(&slot, pod);
            return;
        }
        if slot
            .in_flight
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            // A setup is under way.
            return;
        }
        let host_network = spec.host_network == Some(true);
        tokio::spawn(async move {
            let _g = slot.lock.lock().await;
            if !slot.deleted.load(Ordering::SeqCst) {
                if host_network {
                    let _ = self
                        .report_running(&ns, &name, std::slice::from_ref(&self.settings.node_ip))
                        .await;
                } else if self.setup(&slot, &ns, &name, &uid).await {
                    self.supervise_once(&slot, pod);
                }
            }
            slot.in_flight.store(false, Ordering::SeqCst);
        });
    }

    /// Binds pod `ns/name` to a node ([`pick_node`]); while none fits, tries again every 2 s until the pod
    /// has a node or is gone.
    async fn schedule(&self, ns: &str, name: &str) {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let nodes: Api<Node> = Api::all(self.client.clone());
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        loop {
            let pod = match api.get_opt(name).await {
                Ok(Some(p)) => p,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!("schedule {ns}/{name}: {e}");
                    return;
                }
            };
            if pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| !n.is_empty())
            {
                return;
            }
            let (all_nodes, all_pods) = match (
                nodes.list(&Default::default()).await,
                pods.list(&Default::default()).await,
            ) {
                (Ok(n), Ok(p)) => (n.items, p.items),
                (Err(e), _) | (_, Err(e)) => {
                    tracing::warn!("schedule {ns}/{name}: {e}");
                    return;
                }
            };
            if let Some(node) = pick_node(&pod, &all_nodes, &all_pods) {
                let patch = json!({"spec": {"nodeName": node}});
                if let Err(e) = api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    tracing::warn!("schedule {ns}/{name}: {e}");
                }
                return;
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    /// Makes the pod's sandbox; false if the pod went meanwhile.
    async fn setup(&self, slot: &PodSlot, ns: &str, name: &str, uid: &str) -> bool {
        let mut rec = records(&self.dir)
            .into_iter()
            .find(|r| r.uid == uid)
            .unwrap_or_else(|| PodRecord::new(&self.settings, ns, name, uid));
        let mut delay = Duration::from_millis(200);
        loop {
            if slot.deleted.load(Ordering::SeqCst) {
                return false;
            }
            match self.try_setup(&mut rec).await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!("sandbox of {ns}/{name}: {e} (retrying in {delay:?})");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
        true
    }

    async fn try_setup(&self, rec: &mut PodRecord) -> Result<(), SandboxError> {
        rec.save(&self.dir)?;
        let ns_dir = self.settings.netns_dir.clone();
        let netns_name = rec.netns_name.clone();
        let cni = self.cni.clone();
        let attachment = Attachment::of(rec);
        let result = tokio::task::spawn_blocking(move || {
            kubeovn_netdev::create_named_netns(&ns_dir, &netns_name).map_err(|e| {
                SandboxError::Failed {
                    what: "create netns",
                    detail: e.to_string(),
                }
            })?;
            cni.add(&attachment)
        })
        .await
        .map_err(|e| SandboxError::Failed {
            what: "CNI ADD",
            detail: e.to_string(),
        })??;
        rec.ips = crate::cni::result_ips(&result);
        rec.save(&self.dir)?;
        tracing::info!(
            "{}/{} up in {} with {:?}",
            rec.namespace,
            rec.name,
            rec.netns_name,
            rec.ips
        );
        Ok(())
    }

    async fn report_running(
        &self,
        ns: &str,
        name: &str,
        ips: &[String],
    ) -> Result<(), SandboxError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let t = now();
        let conds: Vec<_> = ["PodScheduled", "Initialized", "ContainersReady", "Ready"]
            .iter()
            .map(|c| json!({"type": c, "status": "True", "lastTransitionTime": t}))
            .collect();
        let pod = api.get(name).await.map_err(kube_err("get pod"))?;
        let containers: Vec<_> = pod
            .spec
            .as_ref()
            .map(|s| {
                s.containers
                    .iter()
                    .map(|c| (c.name.clone(), c.image.clone()))
                    .collect()
            })
            .unwrap_or_else(Vec::new);
        let statuses: Vec<_> = containers
            .iter()
            .map(|(n, image)| {
                json!({"name": n, "image": image.clone().unwrap_or_default(), "imageID": "",
                       "ready": true, "started": true, "restartCount": 0,
                       "state": {"running": {"startedAt": t}}})
            })
            .collect();
        let status = json!({"status": {
            "phase": "Running",
            "hostIP": self.settings.node_ip,
            "hostIPs": [{"ip": self.settings.node_ip}],
            "podIP": ips.first(),
            "podIPs": ips.iter().map(|i| json!({"ip": i})).collect::<Vec<_>>(),
            "startTime": t,
            "conditions": conds,
            "containerStatuses": statuses,
        }});
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(kube_err("pod status"))?;
        Ok(())
    }

    /// Starts the pod's supervisor unless it runs already.
    fn supervise_once(self: &Arc<Self>, slot: &Arc<PodSlot>, pod: Pod) {
        if slot.supervised.swap(true, Ordering::SeqCst) {
            return;
        }
        let (k, slot) = (self.clone(), slot.clone());
        tokio::spawn(async move {
            k.supervise(&slot, pod).await;
            slot.supervised.store(false, Ordering::SeqCst);
        });
    }

    /// Runs the pod's containers and reports its status until the pod is deleted: each tick starts what should
    /// run (under the pod's lock, so a teardown never misses a process), then probes and patches the status
    /// if it changed.
    async fn supervise(&self, slot: &PodSlot, pod: Pod) {
        let (Some(ns), Some(uid)) = (pod.namespace(), pod.uid()) else {
            return;
        };
        let name = pod.name_any();
        let spec = pod.spec.clone().unwrap_or_default();
        let policy = spec
            .restart_policy
            .clone()
            .unwrap_or_else(|| "Always".into());
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let mut current: Option<PodStatus> = pod.status.clone();
        let mut probes: HashMap<String, ProbeRun> = HashMap::new();
        loop {
            let (rec, plans) = {
                let _g = slot.lock.lock().await;
                if slot.deleted.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(mut rec) = read_json::<PodRecord>(&PodRecord::path(&self.dir, &uid)) else {
                    return;
                };
                let ips = rec.addresses();
                let plans: Vec<ContainerPlan> = spec
                    .containers
                    .iter()
                    .map(|c| ContainerPlan::new(&pod, c, &ips))
                    .collect();
                if self.reconcile(&mut rec, &plans, &policy) {
                    if let Err(e) = rec.save(&self.dir) {
                        tracing::warn!("record of {ns}/{name}: {e}");
                    }
                }
                (rec, plans)
            };
            let mut views = Vec::with_capacity(plans.len());
            for plan in &plans {
                let Some(r) = rec.containers.iter().find(|c| c.name == plan.name) else {
                    continue;
                };
                let running = match &r.proc {
                    Some(p) => p.alive(),
                    None => plan.argv.is_empty() && r.started_ms.is_some(),
                };
                let ready = running
                    && match &plan.readiness {
                        None => true,
                        Some(Err(_)) => false,
                        Some(Ok(p)) => {
                            let seeded = seeded_ready(current.as_ref(), r);
                            self.readiness(&rec, plan, r, p, &mut probes, seeded).await
                        }
                    };
                let done = !running
                    && r.terminated
                        .as_ref()
                        .is_some_and(|t| !restarts(&policy, t.exit_code));
                views.push(ContainerView {
                    name: plan.name.clone(),
                    image: plan.image.clone(),
                    record: r.clone(),
                    running,
                    ready,
                    done,
                });
            }
            let desired = pod_status(
                current.as_ref(),
                &self.settings.node_ip,
                &rec.addresses(),
                &views,
                time_of(now_ms()),
            );
            if let Some(patch) = status_patch(current.as_ref(), &desired) {
                match api
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => current = Some(desired),
                    Err(kube::Error::Api(e)) if e.code == 404 => return,
                    Err(e) => tracing::warn!("status of {ns}/{name}: {e}"),
                }
            }
            tokio::time::sleep(TICK).await;
        }
    }

    /// Brings the processes in line with the plans: collects the exits of those that ended, starts those
    /// that should run (first start, or a restart due under `policy`). Returns whether the record changed.
    fn reconcile(&self, rec: &mut PodRecord, plans: &[ContainerPlan], policy: &str) -> bool {
        let mut dirty = false;
        for plan in plans {
            let now = now_ms();
            let exit_file = rec.exit_path(&self.dir, &plan.name);
            let log = rec.log_path(&self.dir, &plan.name);
            let netns = rec.netns.clone();
            let idx = match rec.containers.iter().position(|c| c.name == plan.name) {
                Some(i) => i,
                None => {
                    rec.containers.push(ContainerRecord {
                        name: plan.name.clone(),
                        ..ContainerRecord::default()
                    });
                    dirty = true;
                    rec.containers.len() - 1
                }
            };
            let c = &mut rec.containers[idx];
            if plan.argv.is_empty() {
                // Nothing to run: counts as running from now on.
                if c.started_ms.is_none() {
                    c.started_ms = Some(now);
                    dirty = true;
                }
                continue;
            }
            if let Some(p) = c.proc.clone() {
                if p.alive() {
                    continue;
                }
                p.reap();
                // What the command left running in its group ends with it, as in a container.
                p.stop_group(Duration::from_secs(1));
                let exit = read_exit(&exit_file, c.started_ms.unwrap_or(0));
                tracing::info!(
                    "{}/{} container {} exited: {} ({})",
                    rec.namespace,
                    rec.name,
                    plan.name,
                    exit.exit_code,
                    exit.reason
                );
                c.proc = None;
                c.terminated = Some(exit);
                dirty = true;
            }
            if let Some(t) = &c.terminated {
                let due = t.finished_ms.saturating_add(
                    u64::try_from(backoff(c.restart_count).as_millis()).unwrap_or(0),
                );
                if !restarts(policy, t.exit_code) || now < due {
                    continue;
                }
                c.last = c.terminated.take();
                c.restart_count = c.restart_count.saturating_add(1);
            }
            let _ = std::fs::remove_file(&exit_file);
            let mut cmd = shim_command(&self.shim, &netns, Some(&exit_file), &plan.argv);
            cmd.env_clear()
                .envs(plan.env.iter().map(|(k, v)| (k, v)))
                .current_dir(&plan.working_dir);
            match spawn_detached(&plan.name, cmd, &log) {
                Ok(p) => {
                    c.proc = Some(p);
                    c.started_ms = Some(now);
                }
                Err(e) => {
                    // The log is where a user looks first.
                    append_line(
                        &log,
                        &format!("kube-ovn-sandbox kubelet: cannot start: {e}"),
                    );
                    c.terminated = Some(Exit::start_error(e.to_string()));
                }
            }
            dirty = true;
        }
        dirty
    }

    /// The readiness of a running container with probe `p`: probes when due, counts the result.
    async fn readiness(
        &self,
        rec: &PodRecord,
        plan: &ContainerPlan,
        r: &ContainerRecord,
        p: &Probe,
        probes: &mut HashMap<String, ProbeRun>,
        seeded: bool,
    ) -> bool {
        let started = r.started_ms.unwrap_or(0);
        let run = probes.entry(plan.name.clone()).or_insert_with(|| ProbeRun {
            started_ms: started,
            state: ProbeState::seeded(seeded),
            next_ms: 0,
        });
        if run.started_ms != started || run.next_ms == 0 {
            // A new run of the container: unready until its probe passes.
            if run.started_ms != started {
                run.state = ProbeState::default();
            }
            run.started_ms = started;
            run.next_ms = started.saturating_add(ms(p.initial_delay));
        }
        let now = now_ms();
        if now >= run.next_ms {
            let result = self.probe(rec, plan, p).await;
            if run.state.observe(result.is_ok(), p) {
                tracing::info!(
                    "{}/{} container {} readiness {}: {}",
                    rec.namespace,
                    rec.name,
                    plan.name,
                    if run.state.ready { "passed" } else { "failed" },
                    result.err().unwrap_or_default()
                );
            }
            run.next_ms = now_ms().saturating_add(ms(p.period));
        }
        run.state.ready
    }

    /// Runs one probe from inside the pod's network namespace.
    async fn probe(&self, rec: &PodRecord, plan: &ContainerPlan, p: &Probe) -> Result<(), String> {
        let pod_ip = rec.addresses().into_iter().next();
        let netns = rec.netns.clone();
        let timeout = p.timeout;
        match &p.action {
            ProbeAction::Tcp { host, port } | ProbeAction::Http { host, port, .. } => {
                let host = host
                    .clone()
                    .or(pod_ip)
                    .ok_or_else(|| "the pod has no address".to_owned())?;
                let http_path = match &p.action {
                    ProbeAction::Http { path, .. } => Some(path.clone()),
                    _ => None,
                };
                let port = *port;
                tokio::task::spawn_blocking(move || {
                    in_netns(&netns, || {
                        connect_probe(&host, port, http_path.as_deref(), timeout)
                    })
                    .map_err(|e| e.to_string())
                })
                .await
                .map_err(|e| e.to_string())??
            }
            ProbeAction::Exec { command } => {
                let mut cmd = shim_command(&self.shim, &netns, None, command);
                cmd.env_clear()
                    .envs(plan.env.iter().map(|(k, v)| (k, v)))
                    .current_dir(&plan.working_dir)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null());
                std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
                let mut child = tokio::process::Command::from(cmd)
                    .kill_on_drop(true)
                    .spawn()
                    .map_err(|e| format!("{}: {e}", self.shim.display()))?;
                match tokio::time::timeout(timeout, child.wait()).await {
                    Ok(Ok(st)) if st.success() => Ok(()),
                    Ok(Ok(st)) => Err(format!("{command:?} exited with {st}")),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => {
                        if let Some(pid) = child.id() {
                            let rec = ProcRecord::of("probe", pid);
                            let _ = tokio::task::spawn_blocking(move || {
                                rec.stop_group(Duration::ZERO);
                            })
                            .await;
                        }
                        let _ = child.wait().await;
                        Err(format!("{command:?} timed out after {timeout:?}"))
                    }
                }
            }
        }
    }

    fn remove(self: Arc<Self>, uid: String) {
        let slot = self.slot(&uid);
        slot.deleted.store(true, Ordering::SeqCst);
        tokio::spawn(async move {
            let _g = slot.lock.lock().await;
            if let Some(rec) = records(&self.dir).into_iter().find(|r| r.uid == uid) {
                let dir = self.dir.clone();
                let cni = self.cni.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    teardown(&dir, Some(&cni), &rec, 5);
                    tracing::info!("{}/{} removed", rec.namespace, rec.name);
                })
                .await;
            }
            self.slots
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&uid);
        });
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Whether the pod's reported status says this run of the container was ready (a restarted kubelet keeps
/// it ready until a probe says otherwise, instead of flapping).
fn seeded_ready(current: Option<&PodStatus>, r: &ContainerRecord) -> bool {
    let Some(started) = r.started_ms else {
        return false;
    };
    current
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == r.name))
        .is_some_and(|c| {
            c.ready
                && c.state
                    .as_ref()
                    .and_then(|s| s.running.as_ref())
                    .and_then(|r| r.started_at.as_ref())
                    == Some(&time_of(started))
        })
}

/// Connects to `host:port` within `timeout`; with `http_path`, sends a GET and wants a 2xx or 3xx answer.
fn connect_probe(
    host: &str,
    port: u16,
    http_path: Option<&str>,
    timeout: Duration,
) -> std::io::Result<Result<(), String>> {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;
    let addr = (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other(format!("{host} has no address")))?;
    let mut s = match std::net::TcpStream::connect_timeout(&addr, timeout) {
        Ok(s) => s,
        Err(e) => return Ok(Err(format!("connect {addr}: {e}"))),
    };
    let Some(path) = http_path else {
        return Ok(Ok(()));
    };
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let host_header = if addr.is_ipv6() {
        format!("[{}]:{port}", addr.ip())
    } else {
        format!("{}:{port}", addr.ip())
    };
    let req = format!(
        "GET {path} HTTP/1.0\r\nHost: {host_header}\r\nUser-Agent: kube-probe/kube-ovn-sandbox\r\nAccept: */*\r\n\r\n"
    );
    if let Err(e) = s.write_all(req.as_bytes()) {
        return Ok(Err(format!("send to {addr}: {e}")));
    }
    let mut head = [0u8; 64];
    let n = match s.read(&mut head) {
        Ok(n) => n,
        Err(e) => return Ok(Err(format!("read from {addr}: {e}"))),
    };
    let line = String::from_utf8_lossy(&head[..n]);
    let code: Option<u16> = line.split_whitespace().nth(1).and_then(|c| c.parse().ok());
    match code {
        Some(c) if (200..400).contains(&c) => Ok(Ok(())),
        Some(c) => Ok(Err(format!("HTTP probe of {addr}{path} answered {c}"))),
        None => Ok(Err(format!("HTTP probe of {addr}{path}: no status line"))),
    }
}

/// Appends one line to a log file.
fn append_line(path: &Path, line: &str) {
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

/// Labels shown for a pod in reports: its annotations (`ovn.kubernetes.io/...`).
pub fn pod_annotation<'a>(ann: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    ann.get(&format!("ovn.kubernetes.io/{key}"))
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_go_to_the_least_loaded_ready_node_their_selector_allows() {
        let node = |name: &str, ready: &str, zone: &str| -> Node {
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {"zone": zone}},
                "status": {"conditions": [{"type": "Ready", "status": ready}]}}))
            .expect("node")
        };
        let pod = |node: Option<&str>, selector: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "d"},
                "spec": {"nodeName": node, "nodeSelector": selector, "containers": []}}))
            .expect("pod")
        };
        let nodes = [
            node("n1", "True", "a"),
            node("n2", "True", "b"),
            node("n3", "False", "b"),
        ];
        let on = |n: &str| pod(Some(n), json!({}));
        // n1 runs two pods, n2 one: n2; n3 is not Ready.
        let running = [on("n1"), on("n1"), on("n2")];
        assert_eq!(
            pick_node(&pod(None, json!({})), &nodes, &running).as_deref(),
            Some("n2")
        );
        // A tie goes by name.
        assert_eq!(
            pick_node(&pod(None, json!({})), &nodes, &[]).as_deref(),
            Some("n1")
        );
        // The selector narrows to n1 even though it is busier; a selector no Ready node holds: none.
        let to_a = pod(None, json!({"zone": "a"}));
        assert_eq!(pick_node(&to_a, &nodes, &running).as_deref(), Some("n1"));
        assert_eq!(
            pick_node(&pod(None, json!({"zone": "c"})), &nodes, &running),
            None
        );
    }

    #[test]
    fn record_names() {
        let s = Settings::default();
        let r = PodRecord::new(
            &s,
            "default",
            "web-1",
            "0b6e0a5c-1d2e-4f00-9a8b-7c6d5e4f3a2b",
        );
        assert_eq!(r.netns_name, "sbx-default-web-1-0b6e0a5c");
        assert_eq!(r.container_id.len(), 64);
        assert!(r.netns.starts_with("/var/run/netns"));
        assert!(kubeovn_netdev::validate_netns_name(&r.netns_name).is_ok());
    }

    #[test]
    fn log_files() {
        let d = tempfile::tempdir().expect("tempdir");
        let dir = StateDir::new(d.path());
        let mut r = PodRecord::new(&Settings::default(), "default", "web", "u-1");
        r.save(&dir).expect("save");
        let e = log_file(&dir, "default/web", None).expect_err("no container yet");
        assert!(e.to_string().contains("no container yet"), "{e}");
        r.containers = ["app", "side"]
            .iter()
            .map(|n| ContainerRecord {
                name: (*n).to_owned(),
                ..ContainerRecord::default()
            })
            .collect();
        r.save(&dir).expect("save");
        let e = log_file(&dir, "web", None).expect_err("two containers");
        assert!(e.to_string().contains("choose one of [app side]"), "{e}");
        assert_eq!(
            log_file(&dir, "web", Some("side")).expect("side"),
            d.path().join("pods/u-1/side.log")
        );
        assert!(log_file(&dir, "web", Some("nope")).is_err());
        assert!(log_file(&dir, "default/other", None).is_err());
    }
}
