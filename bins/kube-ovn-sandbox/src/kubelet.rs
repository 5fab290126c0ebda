//! The sandbox kubelet: the one node's agent. It registers the Node, schedules every pod without a
//! `spec.nodeName` onto it, and for each of its pods makes a network namespace (the pod sandbox), runs CNI
//! `ADD` through the installed conflist exactly as a runtime would, and reports `Running` with the pod's
//! addresses. A deleted pod (or one marked for deletion) gets CNI `DEL` and its namespace removed.
//!
//! Each sandbox is recorded in `DIR/pods/<uid>.json` before anything is made, so that a restarted kubelet
//! (or `down`) finds and removes what a pod left behind.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::cni::{Attachment, CniRuntime};
use crate::state::{read_json, write_json, Settings, StateDir};
use crate::SandboxError;

/// The node's address reported in its status (the sandbox stays on loopback).
pub const NODE_IP: &str = "127.0.0.1";

/// One pod sandbox the kubelet made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRecord {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's uid.
    pub uid: String,
    /// The sandbox's container id (`CNI_CONTAINERID`).
    pub container_id: String,
    /// The network namespace's name.
    pub netns_name: String,
    /// Its path (`CNI_NETNS`).
    pub netns: PathBuf,
    /// The interface in it.
    pub ifname: String,
    /// The addresses CNI `ADD` returned (empty until it succeeded).
    pub ips: Vec<String>,
}

impl PodRecord {
    /// The record of a new sandbox for a pod.
    pub fn new(settings: &Settings, namespace: &str, name: &str, uid: &str) -> PodRecord {
        let short: String = uid.chars().filter(|c| *c != '-').take(8).collect();
        let netns_name = format!("{}-{namespace}-{name}-{short}", settings.netns_prefix);
        // Kube-OVN derives the host veth's name from the container id's first characters: keep them unique.
        let hex: String = uid.chars().filter(char::is_ascii_hexdigit).collect();
        let container_id = format!("{hex:0<32}{hex:0<32}");
        PodRecord {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: uid.to_owned(),
            container_id,
            netns: settings.netns_dir.join(&netns_name),
            netns_name,
            ifname: "eth0".into(),
            ips: Vec::new(),
        }
    }

    /// The CNI attachment of this sandbox.
    pub fn attachment(&self) -> Attachment {
        Attachment {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            container_id: self.container_id.clone(),
            netns: self.netns.clone(),
            ifname: self.ifname.clone(),
        }
    }

    fn path(dir: &StateDir, uid: &str) -> PathBuf {
        dir.pods_dir().join(format!("{uid}.json"))
    }

    /// Writes the record.
    pub fn save(&self, dir: &StateDir) -> Result<(), SandboxError> {
        write_json(&Self::path(dir, &self.uid), self)
    }

    /// Removes the record.
    pub fn remove(dir: &StateDir, uid: &str) {
        let _ = std::fs::remove_file(Self::path(dir, uid));
    }
}

/// Every record in `DIR/pods`.
pub fn records(dir: &StateDir) -> Vec<PodRecord> {
    let Ok(rd) = std::fs::read_dir(dir.pods_dir()) else {
        return Vec::new();
    };
    let mut out: Vec<PodRecord> = rd
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| read_json(&e.path()).ok())
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

/// The record of pod `namespace/name`.
pub fn find_record(dir: &StateDir, namespace: &str, name: &str) -> Option<PodRecord> {
    records(dir)
        .into_iter()
        .find(|r| r.namespace == namespace && r.name == name)
}

/// Removes a sandbox: CNI `DEL` (tried a few times while the daemon answers "try again"), then the network
/// namespace and the record. The namespace goes even if `DEL` failed: the veth pair dies with it.
pub fn teardown(dir: &StateDir, cni: Option<&CniRuntime>, rec: &PodRecord, attempts: u32) {
    if let Some(cni) = cni {
        for i in 0..attempts.max(1) {
            match cni.del(&rec.attachment()) {
                Ok(()) => break,
                Err(e) => {
                    eprintln!(
                        "kubelet: DEL {}/{} (attempt {}): {e}",
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
        eprintln!("kubelet: delete netns {}: {e}", rec.netns_name);
    }
    PodRecord::remove(dir, &rec.uid);
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
pub async fn register_node(client: &kube::Client, name: &str) -> Result<(), SandboxError> {
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
        "addresses": [{"type": "InternalIP", "address": NODE_IP}, {"type": "Hostname", "address": name}],
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

/// Per-pod state: serialises setup and teardown of one pod.
#[derive(Default)]
struct PodSlot {
    lock: tokio::sync::Mutex<()>,
    deleted: AtomicBool,
    in_flight: AtomicBool,
}

/// The running kubelet.
pub struct Kubelet {
    dir: StateDir,
    settings: Settings,
    client: kube::Client,
    cni: Arc<CniRuntime>,
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
        Ok(Arc::new(Kubelet {
            dir,
            settings,
            client,
            cni: Arc::new(cni),
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
        register_node(&self.client, &self.settings.node_name).await?;
        let heartbeat = {
            let k = self.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    let _ = register_node(&k.client, &k.settings.node_name).await;
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
                Some(Err(e)) => eprintln!("kubelet: watch: {e}"),
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
                // The scheduler's part: one node, every pod goes there.
                let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
                let patch = json!({"spec": {"nodeName": node}});
                if let Err(e) = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    eprintln!("kubelet: schedule {ns}/{name}: {e}");
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
        if have && phase.as_deref() == Some("Running") {
            return;
        }
        let slot = self.slot(&uid);
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
                    let _ = self.report_running(&ns, &name, &[NODE_IP.to_owned()]).await;
                } else {
                    self.setup(&slot, &ns, &name, &uid).await;
                }
            }
            slot.in_flight.store(false, Ordering::SeqCst);
        });
    }

    async fn setup(&self, slot: &PodSlot, ns: &str, name: &str, uid: &str) {
        let mut rec = records(&self.dir)
            .into_iter()
            .find(|r| r.uid == uid)
            .unwrap_or_else(|| PodRecord::new(&self.settings, ns, name, uid));
        let mut delay = Duration::from_millis(200);
        loop {
            if slot.deleted.load(Ordering::SeqCst) {
                return;
            }
            match self.try_setup(&mut rec).await {
                Ok(()) => break,
                Err(e) => {
                    eprintln!("kubelet: sandbox of {ns}/{name}: {e} (retrying in {delay:?})");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
        let ips: Vec<String> = rec
            .ips
            .iter()
            .map(|c| c.split('/').next().unwrap_or(c).to_owned())
            .collect();
        let mut delay = Duration::from_millis(100);
        for _ in 0..20 {
            match self.report_running(ns, name, &ips).await {
                Ok(()) => return,
                Err(e) => eprintln!("kubelet: status of {ns}/{name}: {e}"),
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(3));
        }
    }

    async fn try_setup(&self, rec: &mut PodRecord) -> Result<(), SandboxError> {
        rec.save(&self.dir)?;
        let ns_dir = self.settings.netns_dir.clone();
        let netns_name = rec.netns_name.clone();
        let cni = self.cni.clone();
        let attachment = rec.attachment();
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
        eprintln!(
            "kubelet: {}/{} up in {} with {:?}",
            rec.namespace, rec.name, rec.netns_name, rec.ips
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
            "hostIP": NODE_IP,
            "hostIPs": [{"ip": NODE_IP}],
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
                    eprintln!("kubelet: {}/{} removed", rec.namespace, rec.name);
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

/// Labels shown for a pod in reports: its annotations (`ovn.kubernetes.io/...`).
pub fn pod_annotation<'a>(ann: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    ann.get(&format!("ovn.kubernetes.io/{key}"))
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
