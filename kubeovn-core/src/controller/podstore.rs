//! The controller's store of pods: what the handlers read of each pod, packed into a few words.
//!
//! kube-runtime's reflector keeps every object whole behind an `Arc`, keyed by an `ObjectRef` that repeats
//! its name, namespace and uid: about 860 bytes per pod even once trimmed to [`PodInfo`]. This store keeps
//! the name, the parsed uid, the node (shared by the pods of a node), the packed annotations and the rare
//! fields behind one pointer, about a third of that; [`PodStore::get`] rebuilds a [`PodInfo`] on demand.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::runtime::watcher::Event;
use tokio::sync::watch;

use super::podinfo::{PodInfo, PodInfoSpec};

/// Fields most pods do not have, boxed so they cost one word when absent.
#[derive(Debug, Default)]
struct Rare {
    /// The uid when it is not a UUID.
    uid: Option<String>,
    deletion_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    host_network: Option<bool>,
}

/// One stored pod (its name is the key).
#[derive(Debug)]
struct Stored {
    /// `metadata.uid` parsed as a UUID (when `uid_is_uuid`).
    uid: [u8; 16],
    uid_is_uuid: bool,
    node: Option<Arc<str>>,
    packed: Option<Box<str>>,
    rare: Option<Box<Rare>>,
}

type Namespace = HashMap<Box<str>, Stored>;

#[derive(Debug, Default)]
struct Pods {
    by_namespace: HashMap<Arc<str>, Namespace>,
    len: usize,
}

impl Pods {
    fn insert(&mut self, interner: &mut Interner, pod: PodInfo) {
        let (ns, name, stored) = compact(interner, pod);
        let pods = self.by_namespace.entry(ns).or_default();
        if pods.insert(name, stored).is_none() {
            self.len += 1;
        }
    }

    fn remove(&mut self, ns: &str, name: &str) {
        if let Some(pods) = self.by_namespace.get_mut(ns) {
            if pods.remove(name).is_some() {
                self.len -= 1;
            }
            if pods.is_empty() {
                self.by_namespace.remove(ns);
            }
        }
    }
}

/// Shares the strings many pods repeat (namespaces, node names).
#[derive(Debug, Default)]
struct Interner(HashMap<Arc<str>, ()>);

impl Interner {
    fn get(&mut self, s: &str) -> Arc<str> {
        if let Some((k, _)) = self.0.get_key_value(s) {
            return k.clone();
        }
        let k: Arc<str> = s.into();
        self.0.insert(k.clone(), ());
        k
    }

    /// Forgets strings no stored pod uses any more.
    fn prune(&mut self) {
        self.0.retain(|k, _| Arc::strong_count(k) > 1);
    }
}

/// The uid's bytes when it is a UUID in the lowercase form it is rebuilt in (else it is kept as text).
fn parse_uid(s: &str) -> Option<[u8; 16]> {
    if s.bytes().any(|c| c.is_ascii_uppercase()) {
        return None;
    }
    kubeovn_ovn::Uuid::parse(s).ok().map(|u| *u.as_bytes())
}

fn compact(interner: &mut Interner, pod: PodInfo) -> (Arc<str>, Box<str>, Stored) {
    let (metadata, spec, packed) = pod.into_parts();
    let ObjectMeta {
        name,
        namespace,
        uid,
        deletion_timestamp,
        deletion_grace_period_seconds,
        ..
    } = metadata;
    let parsed = uid.as_deref().and_then(parse_uid);
    let mut rare = Rare {
        uid: if parsed.is_some() { None } else { uid },
        deletion_timestamp,
        deletion_grace_period_seconds,
        host_network: spec.host_network,
    };
    if rare.host_network == Some(false) {
        rare.host_network = None;
    }
    let has_rare = rare.uid.is_some()
        || rare.deletion_timestamp.is_some()
        || rare.deletion_grace_period_seconds.is_some()
        || rare.host_network.is_some();
    let stored = Stored {
        uid: parsed.unwrap_or_default(),
        uid_is_uuid: parsed.is_some(),
        node: spec.node_name.as_deref().map(|n| interner.get(n)),
        packed,
        rare: has_rare.then(|| Box::new(rare)),
    };
    let ns = interner.get(namespace.as_deref().unwrap_or_default());
    (ns, name.unwrap_or_default().into_boxed_str(), stored)
}

fn expand(ns: &str, name: &str, s: &Stored) -> PodInfo {
    let rare = s.rare.as_deref();
    let uid = if s.uid_is_uuid {
        Some(kubeovn_ovn::Uuid::from_bytes(s.uid).to_string())
    } else {
        rare.and_then(|r| r.uid.clone())
    };
    let metadata = ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(ns.to_owned()),
        uid,
        deletion_timestamp: rare.and_then(|r| r.deletion_timestamp.clone()),
        deletion_grace_period_seconds: rare.and_then(|r| r.deletion_grace_period_seconds),
        ..ObjectMeta::default()
    };
    let spec = PodInfoSpec {
        node_name: s.node.as_deref().map(str::to_owned),
        host_network: rare.and_then(|r| r.host_network),
    };
    PodInfo::with_packed(metadata, spec, s.packed.clone())
}

#[derive(Debug, Default)]
struct Shared {
    pods: RwLock<Pods>,
}

/// The pods the controller has seen, compact; cheap to clone (clones share it).
#[derive(Debug, Clone)]
pub(crate) struct PodStore {
    shared: Arc<Shared>,
    ready: watch::Receiver<bool>,
}

/// What the informer applies its events through.
#[derive(Debug)]
pub(crate) struct PodStoreWriter {
    shared: Arc<Shared>,
    ready: watch::Sender<bool>,
    interner: Interner,
    /// The pods of a (re)list in progress, swapped in whole when it ends (as kube-runtime's store does).
    buffer: Option<Pods>,
}

/// The writer went away before the first list completed.
#[derive(Debug, thiserror::Error)]
#[error("the pod informer stopped before its first list completed")]
pub(crate) struct WriterDropped;

impl PodStore {
    /// An empty store and its writer.
    pub(crate) fn new() -> (PodStore, PodStoreWriter) {
        let shared = Arc::new(Shared::default());
        let (tx, rx) = watch::channel(false);
        (
            PodStore {
                shared: shared.clone(),
                ready: rx,
            },
            PodStoreWriter {
                shared,
                ready: tx,
                interner: Interner::default(),
                buffer: None,
            },
        )
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Pods> {
        self.shared.pods.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The pod `namespace/name`, rebuilt as a [`PodInfo`].
    pub(crate) fn get(&self, namespace: &str, name: &str) -> Option<Arc<PodInfo>> {
        let pods = self.read();
        let s = pods.by_namespace.get(namespace)?.get(name)?;
        Some(Arc::new(expand(namespace, name, s)))
    }

    /// Whether the pod `namespace/name` is stored.
    pub(crate) fn contains(&self, namespace: &str, name: &str) -> bool {
        self.read()
            .by_namespace
            .get(namespace)
            .is_some_and(|p| p.contains_key(name))
    }

    /// The number of pods.
    pub(crate) fn len(&self) -> usize {
        self.read().len
    }

    /// Calls `f` with the namespace, name and annotations of every pod (under the read lock: keep it short).
    pub(crate) fn for_each_annotations(
        &self,
        mut f: impl FnMut(&str, &str, &BTreeMap<String, String>),
    ) {
        let pods = self.read();
        for (ns, p) in &pods.by_namespace {
            for (name, s) in p {
                let a = s
                    .packed
                    .as_deref()
                    .map(super::podinfo::unpack)
                    .unwrap_or_default();
                f(ns, name, &a);
            }
        }
    }

    /// Waits for the first complete list.
    pub(crate) async fn wait_until_ready(&self) -> Result<(), WriterDropped> {
        let mut rx = self.ready.clone();
        rx.wait_for(|r| *r)
            .await
            .map(|_| ())
            .map_err(|_| WriterDropped)
    }
}

impl PodStoreWriter {
    /// Applies one watcher event (the pod already trimmed).
    pub(crate) fn apply(&mut self, ev: &Event<PodInfo>) {
        match ev {
            Event::Init => self.buffer = Some(Pods::default()),
            Event::InitApply(p) => {
                if let Some(b) = self.buffer.as_mut() {
                    b.insert(&mut self.interner, p.clone());
                }
            }
            Event::InitDone => {
                if let Some(b) = self.buffer.take() {
                    let old = std::mem::replace(
                        &mut *self.shared.pods.write().unwrap_or_else(|e| e.into_inner()),
                        b,
                    );
                    drop(old);
                    self.interner.prune();
                }
                self.ready.send_replace(true);
            }
            Event::Apply(p) => {
                let mut pods = self.shared.pods.write().unwrap_or_else(|e| e.into_inner());
                pods.insert(&mut self.interner, p.clone());
            }
            Event::Delete(p) => {
                let (ns, name) = (
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                    p.metadata.name.as_deref().unwrap_or_default(),
                );
                self.shared
                    .pods
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(ns, name);
            }
        }
    }
}

impl super::framework::ObjectStore<PodInfo> for PodStore {
    fn get(&self, key: &super::framework::Key<PodInfo>) -> Option<Arc<PodInfo>> {
        PodStore::get(self, key.namespace().unwrap_or_default(), key.name())
    }
    fn list(&self) -> Vec<Arc<PodInfo>> {
        let pods = self.read();
        let mut out = Vec::with_capacity(pods.len);
        for (ns, p) in &pods.by_namespace {
            for (name, s) in p {
                out.push(Arc::new(expand(ns, name, s)));
            }
        }
        out
    }
    fn len(&self) -> usize {
        PodStore::len(self)
    }
    fn ready(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> {
        let s = self.clone();
        Box::pin(async move { s.wait_until_ready().await.map_err(|e| e.to_string()) })
    }
}

impl super::framework::StoreWriter<PodInfo> for PodStoreWriter {
    fn apply(&mut self, ev: &Event<PodInfo>) {
        PodStoreWriter::apply(self, ev);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::podinfo::trim;

    fn pod(v: serde_json::Value) -> PodInfo {
        let mut p: PodInfo = serde_json::from_value(v).expect("pod");
        trim(&mut p);
        p
    }

    #[tokio::test]
    async fn keeps_what_the_handlers_read() {
        let (store, mut w) = PodStore::new();
        let full = pod(serde_json::json!({
            "metadata": {"name": "a", "namespace": "n", "uid": "6b1f0c2e-1111-4222-8333-000000000001",
                "annotations": {"ovn.kubernetes.io/ip_address": "10.16.0.5", "app": "x"}},
            "spec": {"nodeName": "n1", "hostNetwork": false}
        }));
        let odd = pod(serde_json::json!({
            "metadata": {"name": "b", "namespace": "n", "uid": "not-a-uuid",
                "deletionTimestamp": "2026-11-24T10:00:00Z", "deletionGracePeriodSeconds": 30},
            "spec": {"hostNetwork": true}
        }));
        w.apply(&Event::Init);
        w.apply(&Event::InitApply(full.clone()));
        assert_eq!(store.len(), 0, "a list in progress is not visible");
        w.apply(&Event::InitDone);
        store.wait_until_ready().await.expect("ready");
        w.apply(&Event::Apply(odd.clone()));
        assert_eq!(store.len(), 2);
        let mut want = full.clone();
        want.spec.host_network = None;
        assert_eq!(*store.get("n", "a").expect("a"), want);
        assert_eq!(
            store.get("n", "a").unwrap().annotation_map(),
            full.annotation_map()
        );
        assert_eq!(*store.get("n", "b").expect("b"), odd);
        assert!(store.get("m", "a").is_none() && !store.contains("n", "c"));
        let upper = pod(serde_json::json!({
            "metadata": {"name": "c", "namespace": "m", "uid": "6B1F0C2E-1111-4222-8333-000000000001"}
        }));
        w.apply(&Event::Apply(upper.clone()));
        assert_eq!(*store.get("m", "c").expect("c"), upper);
        let mut seen = Vec::new();
        store.for_each_annotations(|ns, name, a| seen.push(format!("{ns}/{name}:{}", a.len())));
        seen.sort();
        assert_eq!(seen, ["m/c:0", "n/a:1", "n/b:0"]);
        w.apply(&Event::Delete(full));
        assert_eq!(store.len(), 2);
        // A relist replaces everything.
        w.apply(&Event::Init);
        w.apply(&Event::InitDone);
        assert_eq!(store.len(), 0);
    }

    #[tokio::test]
    async fn a_dropped_writer_is_an_error() {
        let (store, w) = PodStore::new();
        drop(w);
        assert!(store.wait_until_ready().await.is_err());
    }
}
