//! The reconciler framework: one [`Reconciler`] per kind, and [`Kinds`], which owns what every kind needs
//! (the watch, the store, the tombstones of deleted objects, the work queue with its retries, readiness and
//! metrics) so that adding a kind is one module and one registration line.
//!
//! In the spirit of kube-runtime's `Controller` and client-go's informer and workqueue, built for our
//! throughput: a key waiting is queued once; a key never runs on two workers at once; a kind's workers run
//! at the concurrency it asks for; stores can be compact (the pod store keeps a few fields of 50,000 pods).
//!
//! - A watch event stores the object, queues its key, and runs the *relations* other kinds declared on this
//!   kind ([`Relations::on`]): each maps the object's old and new state to the keys of the kind that must run
//!   again (a Service when its EndpointSlices change; a policy when a pod's labels change, through a
//!   [`SelectorIndex`] that answers "which selectors match these labels" without scanning every policy).
//! - A key whose object is stored runs [`Reconciler::reconcile`]; a key whose object is gone runs
//!   [`Reconciler::cleanup`] with the object's last state (a tombstone), also for objects deleted while the
//!   watch was down (found when a re-list no longer shows them).
//! - What a run returns decides what happens next: [`Action::Done`], [`Action::Requeue`] after a delay; an
//!   error is retried with a growing backoff, except a permanent one ([`Failure::Permanent`]), which waits
//!   for the object to change, and a lost northbound connection, retried soon. Delays wait in the queue's
//!   one scheduler on tokio's clock, so tests run on paused time.
//! - A kind owns its state: the value registered is the reconciler, and what it remembers lives in its
//!   fields. Kinds never call each other: a change that is not a watch event (addresses released, a
//!   gateway down) is a typed signal ([`Kinds::emit`]) that kinds subscribe to ([`Relations::on_signal`]).
//! - Background work ([`Task`]: garbage collection, status, health checks) runs on the same queues, with
//!   the same retries, metrics and shutdown; start-up work is each kind's or task's `at_start`.
//! - [`Builder::build_fed`] builds the kinds without watches: a test feeds the stores ([`Feed`]) and needs
//!   no API server.
//!
//! ```
//! use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
//! use kubeovn_core::controller::framework::{Action, Context, Key, Kinds, Reconciler, Relations};
//! use k8s_openapi::api::core::v1::{ConfigMap, Secret};
//!
//! struct Ctx { kinds: Arc<Kinds> }
//! impl Context for Ctx {
//!     fn kinds(&self) -> &Kinds { &self.kinds }
//! }
//!
//! /// Counts the ConfigMaps it saw (its own state), run again when a Secret of the same name changes.
//! #[derive(Default)]
//! struct ConfigMaps { seen: AtomicUsize }
//! #[async_trait::async_trait]
//! impl Reconciler<Ctx> for ConfigMaps {
//!     type Object = ConfigMap;
//!     type Error = std::convert::Infallible;
//!     const NAME: &'static str = "configmap";
//!     async fn reconcile(&self, _ctx: &Arc<Ctx>, cm: Arc<ConfigMap>) -> Result<Action, Self::Error> {
//!         self.seen.fetch_add(1, Ordering::Relaxed);
//!         println!("{} keys", cm.data.as_ref().map_or(0, |d| d.len()));
//!         Ok(Action::Done)
//!     }
//!     async fn cleanup(&self, _ctx: &Arc<Ctx>, key: &Key<ConfigMap>, _last: Option<Arc<ConfigMap>>)
//!         -> Result<Action, Self::Error> {
//!         println!("{key} deleted");
//!         Ok(Action::Done)
//!     }
//!     fn relations(_this: &Arc<Self>, r: &mut Relations<'_, Ctx, ConfigMap>) {
//!         r.on::<Secret>(|_, old, new| {
//!             [old, new].into_iter().flatten().map(|s| Key::of(s).as_str().to_owned())
//!                 .map(|k| { let (ns, n) = k.split_once('/').unwrap_or(("", &k)); Key::namespaced(ns, n) })
//!                 .collect()
//!         });
//!     }
//! }
//! # async fn demo(client: kube::Client) {
//! let mut b = Kinds::builder::<Ctx>(client);
//! b.reconcile(ConfigMaps::default());
//! let (kinds, start) = b.build();
//! for informer in start.informers { tokio::spawn(informer); }
//! kinds.ready().await.ok();
//! let ctx = Arc::new(Ctx { kinds: kinds.clone() });
//! for worker in start.workers.start(ctx).await.expect("start hooks") { tokio::spawn(worker); }
//! # }
//! ```

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

use super::metrics::{Metrics, ReconcileMetrics};
use super::queue::WorkQueue;
pub use crate::selector::{Requirement, Selector, SelectorError};

/// A boxed future the framework spawns.
pub type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What the framework needs of a Kubernetes object type.
pub trait Object:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static
{
}

impl<K> Object for K where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static
{
}

/// The key of an object of kind `K` in its store and queue: its namespace (none for cluster-scoped kinds)
/// and name. Typed, so a node's key cannot be queued as a subnet's. One string (`namespace/name`), as the
/// queue keeps two copies of each waiting key: 50,000 pods queued at a restart cost one allocation each.
pub struct Key<K> {
    /// `namespace/name`, or `name`.
    text: String,
    /// The length of the namespace in `text`, if namespaced.
    ns_len: Option<u32>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Key<K> {
    /// The key `namespace/name` (`namespace` None for a cluster-scoped object).
    pub fn new(namespace: Option<&str>, name: &str) -> Self {
        match namespace {
            Some(ns) => Key {
                text: format!("{ns}/{name}"),
                // Kubernetes names are at most 253 bytes; a longer one is kept whole, just not split.
                ns_len: u32::try_from(ns.len()).ok(),
                kind: PhantomData,
            },
            None => Key {
                text: name.to_owned(),
                ns_len: None,
                kind: PhantomData,
            },
        }
    }

    /// The key of a cluster-scoped object.
    pub fn cluster(name: &str) -> Self {
        Self::new(None, name)
    }

    /// The key of a namespaced object.
    pub fn namespaced(namespace: &str, name: &str) -> Self {
        Self::new(Some(namespace), name)
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        match self.ns_len {
            Some(n) => self.text.get(n as usize + 1..).unwrap_or_default(),
            None => &self.text,
        }
    }

    /// The object's namespace (None for cluster-scoped kinds).
    pub fn namespace(&self) -> Option<&str> {
        self.ns_len.and_then(|n| self.text.get(..n as usize))
    }

    /// `namespace/name`, or `name`.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl<K: Resource> Key<K> {
    /// The key of `obj`.
    pub fn of(obj: &K) -> Self {
        let m = obj.meta();
        Self::new(
            m.namespace.as_deref(),
            m.name.as_deref().unwrap_or_default(),
        )
    }
}

impl<K> Clone for Key<K> {
    fn clone(&self) -> Self {
        Key {
            text: self.text.clone(),
            ns_len: self.ns_len,
            kind: PhantomData,
        }
    }
}

impl<K> PartialEq for Key<K> {
    fn eq(&self, o: &Self) -> bool {
        self.ns_len == o.ns_len && self.text == o.text
    }
}

impl<K> Eq for Key<K> {}

impl<K> Hash for Key<K> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.text.hash(h);
        self.ns_len.hash(h);
    }
}

impl<K> fmt::Display for Key<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl<K> fmt::Debug for Key<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// What to do after a successful run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing until the object (or a relation) changes.
    Done,
    /// Run again after this delay (the object may not have changed: polling something outside Kubernetes).
    Requeue(Duration),
}

/// How a failed run is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Retried with a growing backoff (5 ms doubling, up to 5 min).
    Transient,
    /// Retried after this fixed delay (a lost connection that reconnects on its own).
    RetryAfter(Duration),
    /// Not retried: bad input waits for the object to change.
    Permanent,
}

/// An error a reconciler returns: it says how it is retried.
pub trait ReconcileError: fmt::Display + Send + 'static {
    /// How a run that failed with this error is retried.
    fn failure(&self) -> Failure {
        Failure::Transient
    }
}

impl ReconcileError for std::convert::Infallible {}

/// What a reconciler's context gives the framework.
pub trait Context: Send + Sync + 'static {
    /// The kinds (stores and queues).
    fn kinds(&self) -> &Kinds;
    /// Workers per kind, unless a kind asks otherwise (default 4).
    fn workers(&self) -> usize {
        4
    }
    /// Where queue depths, errors and run times are counted (none: not counted).
    fn metrics(&self) -> Option<&Metrics> {
        None
    }
}

/// One kind of object the controller reconciles. The value registered ([`Builder::reconcile`]) is the kind's
/// own state (kube-runtime's per-controller context): what it remembers between runs lives in its fields,
/// not in the shared context, and its relations' closures may hold a clone of it.
#[async_trait::async_trait]
pub trait Reconciler<C: Context>: Send + Sync + 'static {
    /// The object.
    type Object: Object;
    /// The error of a run.
    type Error: ReconcileError;
    /// The kind's name in logs and metrics (`pod`, `subnet`).
    const NAME: &'static str;

    /// Workers running this kind at once (default: the context's [`Context::workers`]).
    fn workers(&self, ctx: &C) -> usize {
        ctx.workers()
    }

    /// Brings the world in line with `obj` (it is stored: created or changed).
    async fn reconcile(&self, ctx: &Arc<C>, obj: Arc<Self::Object>) -> Result<Action, Self::Error>;

    /// Removes what the object `key` had (it is gone); `last` is its last state if the watch saw it.
    async fn cleanup(
        &self,
        ctx: &Arc<C>,
        key: &Key<Self::Object>,
        last: Option<Arc<Self::Object>>,
    ) -> Result<Action, Self::Error>;

    /// Declares the changes of other kinds, and the signals, that run this kind again ([`Relations::on`],
    /// [`Relations::on_signal`]); `this` is the registered value, for mappers that read the kind's state.
    fn relations(_this: &Arc<Self>, _r: &mut Relations<'_, C, Self::Object>) {}

    /// How the watch is set up (label selector, trimming).
    fn watch(&self) -> Watch<Self::Object> {
        Watch::default()
    }

    /// Runs once after every store listed and before any worker runs (e.g. removing what objects deleted
    /// while the controller was down left behind). An error fails the start.
    async fn at_start(&self, _ctx: &Arc<C>) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// Background work on the framework: a periodic or triggered job with the kinds' retries, metrics and
/// shutdown (garbage collection, status publishing, health checks). It runs once when the workers start,
/// then again after the delay its [`Action::Requeue`] asks for, or when a relation triggers it; a failure
/// is retried as a kind's is.
#[async_trait::async_trait]
pub trait Task<C: Context>: Send + Sync + 'static {
    /// The error of a run.
    type Error: ReconcileError;
    /// The task's name in logs and metrics (`gc`, `subnet-status`).
    const NAME: &'static str;

    /// One pass.
    async fn run(&self, ctx: &Arc<C>) -> Result<Action, Self::Error>;

    /// Runs once before any worker runs, as [`Reconciler::at_start`].
    async fn at_start(&self, _ctx: &Arc<C>) -> Result<(), Self::Error> {
        Ok(())
    }

    /// Declares what runs the task at once ([`Relations::on`], [`Relations::on_signal`], mapping to
    /// [`Task::key`]).
    fn relations(_this: &Arc<Self>, _r: &mut Relations<'_, C, Self>)
    where
        Self: Sized,
    {
    }

    /// The task's one key.
    fn key() -> Key<Self>
    where
        Self: Sized,
    {
        Key::cluster(Self::NAME)
    }
}

/// How a kind is watched.
pub struct Watch<K> {
    /// Only objects with these labels (a label selector string).
    pub labels: Option<String>,
    /// Trims an object before it is stored (managedFields are always dropped).
    pub trim: fn(&mut K),
}

impl<K> Default for Watch<K> {
    fn default() -> Self {
        Watch {
            labels: None,
            trim: |_| {},
        }
    }
}

/// Where a kind's objects are kept.
pub trait ObjectStore<K>: Send + Sync + 'static {
    /// The object `key`.
    fn get(&self, key: &Key<K>) -> Option<Arc<K>>;
    /// Every object.
    fn list(&self) -> Vec<Arc<K>>;
    /// The number of objects.
    fn len(&self) -> usize;
    /// Whether the store is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Completes once the first list is in (Err: the writer stopped first).
    fn ready(&self) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;
}

/// Applies watch events to a store.
pub trait StoreWriter<K>: Send + 'static {
    /// Applies one event.
    fn apply(&mut self, ev: &watcher::Event<K>);
}

impl<K: Object> ObjectStore<K> for reflector::Store<K> {
    fn get(&self, key: &Key<K>) -> Option<Arc<K>> {
        let mut r = ObjectRef::new(key.name());
        if let Some(ns) = key.namespace() {
            r = r.within(ns);
        }
        reflector::Store::get(self, &r)
    }
    fn list(&self) -> Vec<Arc<K>> {
        self.state()
    }
    fn len(&self) -> usize {
        self.len()
    }
    fn ready(&self) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> {
        let s = self.clone();
        Box::pin(async move { s.wait_until_ready().await.map_err(|e| e.to_string()) })
    }
}

impl<K: Object> StoreWriter<K> for reflector::store::Writer<K> {
    fn apply(&mut self, ev: &watcher::Event<K>) {
        self.apply_watcher_event(ev);
    }
}

/// The keys of `To` a change of a `From` object runs again: the object's state before and after (None:
/// created, or deleted).
type Mapper<From, To> =
    Box<dyn Fn(&Kinds, Option<&From>, Option<&From>) -> Vec<Key<To>> + Send + Sync>;

/// A relation as the watch of `From` runs it: maps and queues.
type Hook<From> = Arc<dyn Fn(&Kinds, Option<&From>, Option<&From>) + Send + Sync>;

/// A relation on a signal: maps and queues.
type SignalHook<S> = Arc<dyn Fn(&Kinds, &S) + Send + Sync>;

/// The relations a kind declares: which changes of other kinds, and which signals, run it again.
pub struct Relations<'a, C, To> {
    hooks: &'a mut HashMap<TypeId, Box<dyn Any + Send + Sync>>,
    signals: &'a mut HashMap<TypeId, Box<dyn Any + Send + Sync>>,
    watch: &'a mut Vec<WatchFn<C>>,
    to: PhantomData<fn() -> To>,
}

impl<C: Context, To: Send + 'static> Relations<'_, C, To> {
    /// Runs this kind for the keys `map` gives when a signal of type `S` is emitted ([`Kinds::emit`]): a
    /// change that is not a watch event, such as addresses released in a subnet or a gateway node going
    /// down. The emitter does not know who listens.
    pub fn on_signal<S: Send + Sync + 'static>(
        &mut self,
        map: impl Fn(&Kinds, &S) -> Vec<Key<To>> + Send + Sync + 'static,
    ) {
        self.add_signal(Arc::new(move |kinds, s| {
            for k in map(kinds, s) {
                kinds.enqueue(k);
            }
        }));
    }

    /// [`Relations::on_signal`], the keys queued after `delay` (a burst of signals runs the kind once).
    pub fn on_signal_after<S: Send + Sync + 'static>(
        &mut self,
        delay: Duration,
        map: impl Fn(&Kinds, &S) -> Vec<Key<To>> + Send + Sync + 'static,
    ) {
        self.add_signal(Arc::new(move |kinds, s| {
            for k in map(kinds, s) {
                kinds.enqueue_after(k, delay);
            }
        }));
    }

    fn add_signal<S: Send + Sync + 'static>(&mut self, hook: SignalHook<S>) {
        if let Some(v) = self
            .signals
            .entry(TypeId::of::<S>())
            .or_insert_with(|| Box::new(Vec::<SignalHook<S>>::new()))
            .downcast_mut::<Vec<SignalHook<S>>>()
        {
            v.push(hook);
        }
    }

    /// Runs this kind for the keys `map` gives when an object of kind `From` is created, changed or deleted
    /// (`map` sees its old and new state; both are given on a change, so a label change reaches the objects
    /// matching the old labels and those matching the new). `From` is watched if no kind registered it.
    pub fn on<From: Object>(
        &mut self,
        map: impl Fn(&Kinds, Option<&From>, Option<&From>) -> Vec<Key<To>> + Send + Sync + 'static,
    ) {
        let map: Mapper<From, To> = Box::new(map);
        let hook: Hook<From> = Arc::new(move |kinds, old, new| {
            for k in map(kinds, old, new) {
                kinds.enqueue(k);
            }
        });
        if let Some(v) = self
            .hooks
            .entry(TypeId::of::<From>())
            .or_insert_with(|| Box::new(Vec::<Hook<From>>::new()))
            .downcast_mut::<Vec<Hook<From>>>()
        {
            v.push(hook);
        }
        self.watch
            .push(Box::new(|b: &mut Builder<C>| b.watch::<From>()));
    }
}

/// One kind's parts.
struct Slot<K> {
    store: Arc<dyn ObjectStore<K>>,
    /// The same store as its own type, for [`Kinds::store_as`].
    typed: Arc<dyn Any + Send + Sync>,
    queue: Option<Arc<WorkQueue<Key<K>>>>,
    tombs: Mutex<HashMap<Key<K>, Arc<K>>>,
    hooks: Vec<Hook<K>>,
}

impl<K> Slot<K> {
    fn tombs(&self) -> std::sync::MutexGuard<'_, HashMap<Key<K>, Arc<K>>> {
        self.tombs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A queue as metrics see it.
struct QueueView {
    name: &'static str,
    len: Box<dyn Fn() -> usize + Send + Sync>,
    idle: Box<dyn Fn() -> bool + Send + Sync>,
    /// Keys waiting for a delay (a retry or a requeue).
    delayed: Box<dyn Fn() -> usize + Send + Sync>,
}

impl QueueView {
    /// The view of queue `q`, called `name`.
    fn of<K: Clone + Eq + Hash + Send + 'static>(
        name: &'static str,
        q: &Arc<WorkQueue<K>>,
    ) -> Self {
        let (a, b, c) = (q.clone(), q.clone(), q.clone());
        QueueView {
            name,
            len: Box::new(move || a.len()),
            idle: Box::new(move || b.is_idle()),
            delayed: Box::new(move || c.delayed()),
        }
    }
}

/// The kinds: their stores, queues and tombstones. Built by [`Builder`] ([`Kinds::builder`]).
pub struct Kinds {
    slots: HashMap<TypeId, Box<dyn Any + Send + Sync>>,
    queues: Vec<QueueView>,
    ready: Vec<ReadyFn>,
    /// Relations on signals, by signal type.
    signals: Slots,
    /// The registered reconcilers and tasks (`Arc<R>`), by their type.
    instances: Slots,
}

impl fmt::Debug for Kinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kinds")
            .field(
                "queues",
                &self.queues.iter().map(|q| q.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Kinds {
    /// Starts registering kinds watched through `client`, reconciled with a context `C`.
    pub fn builder<C: Context>(client: kube::Client) -> Builder<C> {
        Builder {
            client,
            slots: HashMap::new(),
            queues: Vec::new(),
            ready: Vec::new(),
            hooks: HashMap::new(),
            relation_watches: Vec::new(),
            pending_hooks: Vec::new(),
            workers: Vec::new(),
            starts: Vec::new(),
            signals: HashMap::new(),
            instances: HashMap::new(),
            informer_makers: Vec::new(),
        }
    }

    fn slot<K: 'static>(&self) -> Option<&Slot<K>> {
        let s = self
            .slots
            .get(&TypeId::of::<K>())
            .and_then(|s| s.downcast_ref::<Slot<K>>());
        if s.is_none() {
            tracing::error!(
                kind = std::any::type_name::<K>(),
                "kind not registered with the framework"
            );
        }
        s
    }

    /// The store of kind `K` (None if `K` is not registered).
    pub fn store<K: 'static>(&self) -> Option<&Arc<dyn ObjectStore<K>>> {
        self.slot::<K>().map(|s| &s.store)
    }

    /// The object `key`, if stored.
    pub fn get<K: 'static>(&self, key: &Key<K>) -> Option<Arc<K>> {
        self.slot::<K>().and_then(|s| s.store.get(key))
    }

    /// Every stored object of kind `K`.
    pub fn list<K: 'static>(&self) -> Vec<Arc<K>> {
        self.slot::<K>().map(|s| s.store.list()).unwrap_or_default()
    }

    /// The store of kind `K` as its own type `S` (a compact or indexed store given to
    /// [`Builder::reconcile_in`] or [`Builder::watch_in`]).
    pub fn store_as<K: 'static, S: Send + Sync + 'static>(&self) -> Option<&S> {
        self.slot::<K>().and_then(|s| s.typed.downcast_ref::<S>())
    }

    /// The registered reconciler or task `R`: the kind's own state (tests read it; kinds never read
    /// another's).
    pub fn reconciler<R: Send + Sync + 'static>(&self) -> Option<Arc<R>> {
        self.instances
            .get(&TypeId::of::<R>())
            .and_then(|v| v.downcast_ref::<Arc<R>>())
            .cloned()
    }

    /// Emits the signal `s`: every kind or task that declared [`Relations::on_signal`] for `S` queues the
    /// keys its mapper gives.
    pub fn emit<S: Send + Sync + 'static>(&self, s: &S) {
        if let Some(hooks) = self
            .signals
            .get(&TypeId::of::<S>())
            .and_then(|h| h.downcast_ref::<Vec<SignalHook<S>>>())
        {
            for h in hooks {
                h(self, s);
            }
        }
    }

    /// Queues `key` for its kind's reconciler.
    pub fn enqueue<K: 'static>(&self, key: Key<K>) {
        if let Some(q) = self.slot::<K>().and_then(|s| s.queue.as_ref()) {
            q.add(key);
        }
    }

    /// Queues `key` after `delay`.
    pub fn enqueue_after<K: Send + 'static>(&self, key: Key<K>, delay: Duration) {
        if let Some(q) = self.slot::<K>().and_then(|s| s.queue.as_ref()) {
            q.add_after(key, delay);
        }
    }

    /// The last state of the deleted object `key`, until its cleanup succeeds.
    pub fn tombstone<K: 'static>(&self, key: &Key<K>) -> Option<Arc<K>> {
        self.slot::<K>().and_then(|s| s.tombs().get(key).cloned())
    }

    /// Whether the queue of kind `K` is empty with no key running.
    pub fn is_idle<K: 'static>(&self) -> bool {
        self.slot::<K>()
            .and_then(|s| s.queue.as_ref())
            .is_none_or(|q| q.is_idle())
    }

    /// Whether every queue is empty with no key running.
    pub fn all_idle(&self) -> bool {
        self.queues.iter().all(|q| (q.idle)())
    }

    /// Whether every queue is empty with no key running and none waiting for a delay (a retry after a
    /// failure, or a requeue): nothing runs, and nothing will until a watch event or a signal comes. What a
    /// test waits for, after a change whose effect it saw, to know that the events before it were handled.
    pub fn all_settled(&self) -> bool {
        self.queues.iter().all(|q| (q.idle)() && (q.delayed)() == 0)
    }

    /// Waits until every store has its first list.
    pub async fn ready(&self) -> Result<(), String> {
        futures::future::try_join_all(self.ready.iter().map(|r| r())).await?;
        Ok(())
    }

    /// Publishes each queue's depth to `metrics`.
    pub fn publish_depths(&self, metrics: &Metrics) {
        for q in &self.queues {
            metrics.queue_depth(q.name, (q.len)());
        }
    }

    /// Runs the relations declared on kind `K` for a change from `old` to `new` (the watch does this; tests
    /// and handlers that change an object out of band may too).
    pub fn related<K: 'static>(&self, old: Option<&K>, new: Option<&K>) {
        if let Some(s) = self
            .slots
            .get(&TypeId::of::<K>())
            .and_then(|s| s.downcast_ref::<Slot<K>>())
        {
            for h in &s.hooks {
                h(self, old, new);
            }
        }
    }
}

#[cfg(test)]
impl Kinds {
    /// Takes every key of kind `K` waiting in its queue, in order (tests: what a change queued).
    pub(crate) async fn take_queued<K: 'static>(&self) -> Vec<Key<K>> {
        let Some(q) = self.slot::<K>().and_then(|s| s.queue.clone()) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        while !q.is_empty() {
            let Some(k) = q.get().await else { break };
            q.done(&k);
            out.push(k);
        }
        out
    }
}

/// A kind's or task's workers (its type, and what runs them).
type WorkerFn<C> = (TypeId, Box<dyn FnOnce(Arc<C>) -> BoxFuture + Send>);
type StartFn<C> =
    Box<dyn FnOnce(Arc<C>) -> Pin<Box<dyn Future<Output = Result<(), StartError>> + Send>> + Send>;
type Slots = HashMap<TypeId, Box<dyn Any + Send + Sync>>;
/// Registers the watch of a kind only related to.
type WatchFn<C> = Box<dyn FnOnce(&mut Builder<C>) + Send>;
/// Moves a kind's relation hooks (first map) into its slot (second map).
type HookMover = Box<dyn FnOnce(&mut Slots, &mut Slots) + Send>;
type ReadyFn =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;
/// Makes a kind's informer: a watch of the API server, or (fed) a writer the test feeds.
type InformerMaker = Box<dyn FnOnce(Arc<Kinds>, bool) -> Informer + Send>;

/// A kind's informer as made by an [`InformerMaker`].
enum Informer {
    Watch(BoxFuture),
    Fed(TypeId, Box<dyn FedSlot>),
}

/// A start hook ([`Reconciler::at_start`], [`Task::at_start`]) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("start of {kind}: {message}")]
pub struct StartError {
    /// The kind or task.
    pub kind: &'static str,
    /// Its error.
    pub message: String,
}

/// Registers kinds; [`Builder::build`] makes the [`Kinds`].
pub struct Builder<C> {
    client: kube::Client,
    slots: Slots,
    queues: Vec<QueueView>,
    ready: Vec<ReadyFn>,
    hooks: Slots,
    signals: Slots,
    instances: Slots,
    relation_watches: Vec<WatchFn<C>>,
    /// Moves each kind's hooks into its slot at build time.
    pending_hooks: Vec<HookMover>,
    informer_makers: Vec<InformerMaker>,
    workers: Vec<WorkerFn<C>>,
    starts: Vec<StartFn<C>>,
}

impl<C> fmt::Debug for Builder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder").finish_non_exhaustive()
    }
}

/// What [`Builder::build`] returns besides the kinds: the informers to spawn now, the workers to run once
/// the context exists.
pub struct Start<C> {
    /// One watch per kind: spawn them (stores fill, keys are queued, relations run).
    pub informers: Vec<BoxFuture>,
    /// The kinds' workers.
    pub workers: Workers<C>,
}

/// The kinds' and tasks' workers, started with [`Workers::start`] (or [`Workers::run`] without the start
/// hooks).
pub struct Workers<C> {
    run: Vec<WorkerFn<C>>,
    starts: Vec<StartFn<C>>,
}

impl<C> fmt::Debug for Workers<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workers")
            .field("kinds", &self.run.len())
            .finish()
    }
}

impl<C: Context> Workers<C> {
    /// Runs every start hook in the order of registration, then gives the worker pools (spawn them).
    pub async fn start(self, ctx: Arc<C>) -> Result<Vec<BoxFuture>, StartError> {
        for s in self.starts {
            s(ctx.clone()).await?;
        }
        Ok(self.run.into_iter().map(|(_, r)| r(ctx.clone())).collect())
    }

    /// Runs every start hook in the order of registration (once; [`Workers::start`] then runs none).
    pub async fn at_start(&mut self, ctx: Arc<C>) -> Result<(), StartError> {
        for s in std::mem::take(&mut self.starts) {
            s(ctx.clone()).await?;
        }
        Ok(())
    }

    /// The worker pools of every kind and task, without the start hooks (spawn them).
    pub fn run(self, ctx: Arc<C>) -> Vec<BoxFuture> {
        self.run.into_iter().map(|(_, r)| r(ctx.clone())).collect()
    }

    /// Takes the workers of the kind or task `R` alone (tests that run one kind by itself beside the
    /// others driven by hand).
    pub fn take<R: 'static>(&mut self) -> Workers<C> {
        let (mine, rest) = std::mem::take(&mut self.run)
            .into_iter()
            .partition(|(t, _)| *t == TypeId::of::<R>());
        self.run = rest;
        Workers {
            run: mine,
            starts: Vec::new(),
        }
    }
}

/// A store that holds nothing: a task's slot.
struct NoStore;

impl<K> ObjectStore<K> for NoStore {
    fn get(&self, _: &Key<K>) -> Option<Arc<K>> {
        None
    }
    fn list(&self) -> Vec<Arc<K>> {
        Vec::new()
    }
    fn len(&self) -> usize {
        0
    }
    fn ready(&self) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> {
        Box::pin(async { Ok(()) })
    }
}

impl<C: Context> Builder<C> {
    /// Watches kind `K` into kube-runtime's store (no reconciler: other kinds read it, or relate to it).
    /// Registering a kind twice keeps the first.
    pub fn watch<K: Object>(&mut self) {
        self.watch_with::<K>(Watch::default());
    }

    /// Watches kind `K` as `watch` says (no reconciler), e.g. trimmed to what its readers need.
    pub fn watch_with<K: Object>(&mut self, watch: Watch<K>) {
        if self.slots.contains_key(&TypeId::of::<K>()) {
            return;
        }
        let (store, writer) = reflector::store::<K>();
        self.add_slot::<K, _>(None, Arc::new(store), writer, watch);
    }

    /// Watches kind `K` into `store` (no reconciler), e.g. a store that also keeps an index; readers get it
    /// back as its own type with [`Kinds::store_as`].
    pub fn watch_in<K: Object, S: ObjectStore<K>>(
        &mut self,
        store: Arc<S>,
        writer: impl StoreWriter<K>,
    ) {
        if self.slots.contains_key(&TypeId::of::<K>()) {
            return;
        }
        self.add_slot::<K, S>(None, store, writer, Watch::default());
    }

    /// Registers the reconciler `r` (its kind watched into kube-runtime's store).
    pub fn reconcile<R: Reconciler<C>>(&mut self, r: R) {
        let (store, writer) = reflector::store::<R::Object>();
        self.reconcile_in(r, Arc::new(store), writer);
    }

    /// Registers the reconciler `r` with its own store (a compact one, such as the pod store).
    pub fn reconcile_in<R: Reconciler<C>, S: ObjectStore<R::Object>>(
        &mut self,
        r: R,
        store: Arc<S>,
        writer: impl StoreWriter<R::Object>,
    ) {
        let r = Arc::new(r);
        let queue = WorkQueue::<Key<R::Object>>::new(R::NAME);
        self.add_slot::<R::Object, S>(Some((R::NAME, queue.clone())), store, writer, r.watch());
        self.declare(|rel| R::relations(&r, rel));
        self.instances
            .insert(TypeId::of::<R>(), Box::new(r.clone()));
        let rs = r.clone();
        self.start_hook(R::NAME, move |ctx| {
            Box::pin(async move { rs.at_start(&ctx).await })
        });
        self.workers.push((
            TypeId::of::<R>(),
            Box::new(move |ctx: Arc<C>| Box::pin(run_workers::<C, R>(ctx, r, queue))),
        ));
    }

    /// Registers the background task `t`: it runs when the workers start, then as its runs and relations
    /// ask.
    pub fn task<T: Task<C>>(&mut self, t: T) {
        let t = Arc::new(t);
        let queue = WorkQueue::<Key<T>>::new(T::NAME);
        self.queues.push(QueueView::of(T::NAME, &queue));
        let store: Arc<NoStore> = Arc::new(NoStore);
        self.slots.insert(
            TypeId::of::<T>(),
            Box::new(Slot::<T> {
                store: store.clone(),
                typed: store,
                queue: Some(queue.clone()),
                tombs: Mutex::default(),
                hooks: Vec::new(),
            }),
        );
        self.declare(|rel| T::relations(&t, rel));
        self.instances
            .insert(TypeId::of::<T>(), Box::new(t.clone()));
        let ts = t.clone();
        self.start_hook(T::NAME, move |ctx| {
            Box::pin(async move { ts.at_start(&ctx).await })
        });
        self.workers.push((
            TypeId::of::<T>(),
            Box::new(move |ctx: Arc<C>| Box::pin(run_task::<C, T>(ctx, t, queue))),
        ));
    }

    /// Runs a kind's or task's relation declarations.
    fn declare<To: Send + 'static>(&mut self, declare: impl FnOnce(&mut Relations<'_, C, To>)) {
        let mut watches = Vec::new();
        declare(&mut Relations {
            hooks: &mut self.hooks,
            signals: &mut self.signals,
            watch: &mut watches,
            to: PhantomData,
        });
        self.relation_watches.extend(watches);
    }

    /// Adds the start hook of `kind`.
    fn start_hook<E: ReconcileError>(
        &mut self,
        kind: &'static str,
        run: impl FnOnce(Arc<C>) -> Pin<Box<dyn Future<Output = Result<(), E>> + Send>> + Send + 'static,
    ) {
        self.starts.push(Box::new(move |ctx: Arc<C>| {
            Box::pin(async move {
                run(ctx).await.map_err(|e| StartError {
                    kind,
                    message: e.to_string(),
                })
            })
        }));
    }

    fn add_slot<K: Object, S: ObjectStore<K>>(
        &mut self,
        queue: Option<(&'static str, Arc<WorkQueue<Key<K>>>)>,
        store: Arc<S>,
        writer: impl StoreWriter<K>,
        watch: Watch<K>,
    ) {
        let name = queue
            .as_ref()
            .map(|q| q.0)
            .unwrap_or(std::any::type_name::<K>());
        let queue = queue.map(|q| q.1);
        if let Some(q) = &queue {
            self.queues.push(QueueView::of(name, q));
        }
        let s = store.clone();
        self.ready.push(Box::new(move || s.ready()));
        self.slots.insert(
            TypeId::of::<K>(),
            Box::new(Slot::<K> {
                store: store.clone(),
                typed: store,
                queue,
                tombs: Mutex::default(),
                hooks: Vec::new(),
            }),
        );
        self.pending_hooks.push(Box::new(|hooks, slots| {
            let slot = slots
                .get_mut(&TypeId::of::<K>())
                .and_then(|s| s.downcast_mut::<Slot<K>>());
            let h = hooks
                .remove(&TypeId::of::<K>())
                .and_then(|h| h.downcast::<Vec<Hook<K>>>().ok());
            if let (Some(s), Some(h)) = (slot, h) {
                s.hooks = *h;
            }
        }));
        let api = Api::<K>::all(self.client.clone());
        self.informer_makers
            .push(Box::new(move |kinds: Arc<Kinds>, fed: bool| {
                if fed {
                    let w: FedWriter<K> = FedWriter {
                        writer: Box::new(writer),
                        relist: Relist::default(),
                        listed: false,
                    };
                    return Informer::Fed(TypeId::of::<K>(), Box::new(Mutex::new(w)));
                }
                let mut writer = writer;
                Informer::Watch(Box::pin(async move {
                    let mut cfg = watcher::Config::default().any_semantic();
                    if let Some(l) = &watch.labels {
                        cfg = cfg.labels(l);
                    }
                    let trim = watch.trim;
                    let stream =
                        watcher::watcher(api, cfg)
                            .default_backoff()
                            .modify(move |o: &mut K| {
                                // managedFields are never read; dropping them keeps the store small.
                                o.meta_mut().managed_fields = None;
                                trim(o);
                            });
                    futures::pin_mut!(stream);
                    let mut relist = Relist::default();
                    while let Some(ev) = stream.next().await {
                        match ev {
                            Ok(ev) => observe(&kinds, &mut writer, &mut relist, ev),
                            Err(e) => tracing::warn!(kind = name, error = %e, "watch"),
                        }
                    }
                }))
            }));
    }

    fn finish(mut self, fed: bool) -> (Arc<Kinds>, Start<C>, Feed) {
        // Kinds only related to are watched too.
        for w in std::mem::take(&mut self.relation_watches) {
            w(&mut self);
        }
        for f in std::mem::take(&mut self.pending_hooks) {
            f(&mut self.hooks, &mut self.slots);
        }
        let kinds = Arc::new(Kinds {
            slots: self.slots,
            queues: self.queues,
            ready: self.ready,
            signals: self.signals,
            instances: self.instances,
        });
        let mut informers = Vec::new();
        let mut feed = Feed {
            kinds: kinds.clone(),
            writers: HashMap::new(),
        };
        for m in self.informer_makers {
            match m(kinds.clone(), fed) {
                Informer::Watch(f) => informers.push(f),
                Informer::Fed(t, w) => {
                    feed.writers.insert(t, w);
                }
            }
        }
        let workers = Workers {
            run: self.workers,
            starts: self.starts,
        };
        (kinds, Start { informers, workers }, feed)
    }

    /// The kinds, and what to start.
    pub fn build(self) -> (Arc<Kinds>, Start<C>) {
        let (kinds, start, _) = self.finish(false);
        (kinds, start)
    }

    /// The kinds with no watch: the stores are filled through the [`Feed`] (tests that put objects in
    /// directly, with no API server). `Start::informers` is empty.
    pub fn build_fed(self) -> (Arc<Kinds>, Start<C>, Feed) {
        self.finish(true)
    }
}

/// A fed kind's store writer and re-list state.
struct FedWriter<K> {
    writer: Box<dyn StoreWriter<K>>,
    relist: Relist<K>,
    listed: bool,
}

/// Puts objects straight into the stores of kinds built with [`Builder::build_fed`], as their watches
/// would: the store, the tombstones, the queue and the relations, in the caller's task.
pub struct Feed {
    kinds: Arc<Kinds>,
    writers: HashMap<TypeId, Box<dyn FedSlot>>,
}

/// A fed kind's writer, its type erased.
trait FedSlot: Send + Sync {
    fn any(&self) -> &dyn Any;
    /// The first list, empty, unless listed already.
    fn list_empty(&self, kinds: &Kinds);
}

impl<K: Object> FedSlot for Mutex<FedWriter<K>> {
    fn any(&self) -> &dyn Any {
        self
    }
    fn list_empty(&self, kinds: &Kinds) {
        let mut w = self.lock().unwrap_or_else(|e| e.into_inner());
        if w.listed {
            return;
        }
        let w = &mut *w;
        for ev in [WatchEvent::<K>::Init, WatchEvent::InitDone] {
            observe(kinds, &mut w.writer, &mut w.relist, ev);
        }
        w.listed = true;
    }
}

impl fmt::Debug for Feed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Feed")
            .field("kinds", &self.writers.len())
            .finish()
    }
}

impl Feed {
    /// Applies one watch event of kind `K` (false: `K` is not fed).
    pub fn event<K: Object>(&self, ev: WatchEvent<K>) -> bool {
        let Some(w) = self
            .writers
            .get(&TypeId::of::<K>())
            .and_then(|w| w.any().downcast_ref::<Mutex<FedWriter<K>>>())
        else {
            return false;
        };
        let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
        let w = &mut *w;
        if matches!(ev, WatchEvent::InitDone) {
            w.listed = true;
        }
        observe(&self.kinds, &mut w.writer, &mut w.relist, ev);
        true
    }

    /// The first list of kind `K`: `objects`, then the store is ready.
    pub fn list<K: Object>(&self, objects: impl IntoIterator<Item = K>) {
        self.event(WatchEvent::<K>::Init);
        for o in objects {
            self.event(WatchEvent::InitApply(o));
        }
        self.event(WatchEvent::<K>::InitDone);
    }

    /// The first list, empty, of every fed kind not listed yet: every store is then ready.
    pub fn list_rest(&self) {
        for w in self.writers.values() {
            w.list_empty(&self.kinds);
        }
    }

    /// `obj` created or changed.
    pub fn apply<K: Object>(&self, obj: K) {
        self.event(WatchEvent::Apply(obj));
    }

    /// `obj` deleted.
    pub fn delete<K: Object>(&self, obj: K) {
        self.event(WatchEvent::Delete(obj));
    }
}

impl<K, W: StoreWriter<K> + ?Sized> StoreWriter<K> for Box<W> {
    fn apply(&mut self, ev: &watcher::Event<K>) {
        (**self).apply(ev);
    }
}

/// The objects a re-list in progress has not shown again yet.
struct Relist<K> {
    before: Option<HashMap<Key<K>, Arc<K>>>,
}

impl<K> Default for Relist<K> {
    fn default() -> Self {
        Relist { before: None }
    }
}

/// Applies one watch event: the store, the tombstones, the queue, the relations.
fn observe<K: Object>(
    kinds: &Kinds,
    writer: &mut impl StoreWriter<K>,
    relist: &mut Relist<K>,
    ev: WatchEvent<K>,
) {
    let Some(slot) = kinds
        .slots
        .get(&TypeId::of::<K>())
        .and_then(|s| s.downcast_ref::<Slot<K>>())
    else {
        return;
    };
    let related = !slot.hooks.is_empty();
    match &ev {
        WatchEvent::Init => {
            // A re-list: what it does not show again was deleted while the watch was down.
            relist.before = Some(
                slot.store
                    .list()
                    .into_iter()
                    .map(|o| (Key::of(o.as_ref()), o))
                    .collect(),
            );
            writer.apply(&ev);
        }
        WatchEvent::InitApply(o) | WatchEvent::Apply(o) => {
            let key = Key::of(o);
            let old = match (&ev, relist.before.as_mut()) {
                (WatchEvent::InitApply(_), Some(b)) => b.remove(&key),
                (WatchEvent::Apply(_), _) if related => slot.store.get(&key),
                _ => None,
            };
            writer.apply(&ev);
            slot.tombs().remove(&key);
            if related {
                kinds.related(old.as_deref(), Some(o));
            }
            if let Some(q) = &slot.queue {
                q.add(key);
            }
        }
        WatchEvent::InitDone => {
            writer.apply(&ev);
            for (key, last) in relist.before.take().unwrap_or_default() {
                if related {
                    kinds.related(Some(last.as_ref()), None);
                }
                slot.tombs().insert(key.clone(), last);
                if let Some(q) = &slot.queue {
                    q.add(key);
                }
            }
        }
        WatchEvent::Delete(o) => {
            writer.apply(&ev);
            let key = Key::of(o);
            if related {
                kinds.related(Some(o), None);
            }
            slot.tombs().insert(key.clone(), Arc::new(o.clone()));
            if let Some(q) = &slot.queue {
                q.add(key);
            }
        }
    }
}

/// Runs `R`'s workers on its queue until the queue shuts down.
async fn run_workers<C: Context, R: Reconciler<C>>(
    ctx: Arc<C>,
    r: Arc<R>,
    queue: Arc<WorkQueue<Key<R::Object>>>,
) {
    let workers = r.workers(&ctx);
    let metrics = ctx.metrics().cloned();
    let observe = Arc::new(metrics.as_ref().map(|m| m.reconcile_metrics(R::NAME)));
    let q = queue.clone();
    queue
        .run(workers, metrics, move |key: Key<R::Object>| {
            let ctx = ctx.clone();
            let r = r.clone();
            let q = q.clone();
            let observe = observe.clone();
            async move {
                let result = run_observed::<C, R>(&r, &ctx, &key, observe.as_ref().as_ref()).await;
                after_run::<R::Error, R::Object>(R::NAME, &q, key, result)
            }
        })
        .await;
}

/// Runs task `T` on its one-key queue until the queue shuts down: first when started, then as asked.
async fn run_task<C: Context, T: Task<C>>(ctx: Arc<C>, t: Arc<T>, queue: Arc<WorkQueue<Key<T>>>) {
    let metrics = ctx.metrics().cloned();
    let observe = Arc::new(metrics.as_ref().map(|m| m.reconcile_metrics(T::NAME)));
    queue.add(T::key());
    let q = queue.clone();
    queue
        .run(1, metrics, move |key: Key<T>| {
            let ctx = ctx.clone();
            let t = t.clone();
            let q = q.clone();
            let observe = observe.clone();
            async move {
                let started = Instant::now();
                let result = t.run(&ctx).await;
                if let Some(m) = observe.as_ref() {
                    m.observe(started.elapsed(), result.is_ok());
                }
                after_run::<T::Error, T>(T::NAME, &q, key, result)
            }
        })
        .await;
}

/// Runs `key` once as a worker would: [`Reconciler::reconcile`] if its object is stored, else
/// [`Reconciler::cleanup`] with its tombstone (dropped once the cleanup succeeds). Tests drive reconcilers
/// with it. `R` must be registered.
pub async fn run_once<C: Context, R: Reconciler<C>>(
    ctx: &Arc<C>,
    key: &Key<R::Object>,
) -> Result<Action, R::Error> {
    let r = ctx.kinds().reconciler::<R>().unwrap_or_else(|| {
        // A test's mistake, not input: said plainly.
        panic!("{} is not registered", std::any::type_name::<R>())
    });
    let observe = ctx.metrics().map(|m| m.reconcile_metrics(R::NAME));
    run_observed::<C, R>(&r, ctx, key, observe.as_ref()).await
}

/// Runs task `T` once, as its worker would (tests). `T` must be registered.
pub async fn run_task_once<C: Context, T: Task<C>>(ctx: &Arc<C>) -> Result<Action, T::Error> {
    let t = ctx
        .kinds()
        .reconciler::<T>()
        .unwrap_or_else(|| panic!("{} is not registered", std::any::type_name::<T>()));
    t.run(ctx).await
}

/// [`run_once`], its run time recorded in `observe`.
async fn run_observed<C: Context, R: Reconciler<C>>(
    r: &R,
    ctx: &Arc<C>,
    key: &Key<R::Object>,
    observe: Option<&ReconcileMetrics>,
) -> Result<Action, R::Error> {
    let kinds = ctx.kinds();
    let store = kinds.store::<R::Object>().cloned();
    let started = Instant::now();
    let result = match store.as_ref().and_then(|s| s.get(key)) {
        Some(obj) => r.reconcile(ctx, obj).await,
        None => {
            let last = kinds.tombstone(key);
            let r = r.cleanup(ctx, key, last.clone()).await;
            if let (Ok(_), Some(last), Some(slot)) = (&r, last, kinds.slot::<R::Object>()) {
                // Only the state this cleanup saw: a newer delete of the same key keeps its own.
                let mut t = slot.tombs();
                if t.get(key).is_some_and(|x| Arc::ptr_eq(x, &last)) {
                    t.remove(key);
                }
            }
            r
        }
    };
    if let Some(m) = observe {
        m.observe(started.elapsed(), result.is_ok());
    }
    result
}

/// What a run's result asks of the queue. `Err(true)`: retry with backoff.
fn after_run<E: ReconcileError, K: Send + 'static>(
    name: &'static str,
    queue: &Arc<WorkQueue<Key<K>>>,
    key: Key<K>,
    result: Result<Action, E>,
) -> Result<(), bool> {
    match result {
        Ok(action) => {
            if let Action::Requeue(d) = action {
                queue.add_after(key, d);
            }
            Ok(())
        }
        Err(e) => match e.failure() {
            Failure::Transient => {
                tracing::warn!(kind = name, %key, error = %e, retry = true, "handler failed");
                Err(true)
            }
            Failure::RetryAfter(d) => {
                tracing::warn!(kind = name, %key, error = %e, retry_ms = d.as_millis() as u64, "handler failed");
                queue.add_after(key, d);
                Err(false)
            }
            Failure::Permanent => {
                tracing::warn!(kind = name, %key, error = %e, retry = false, "handler failed");
                Err(false)
            }
        },
    }
}

/// Which keys' label selectors match a set of labels, without scanning every selector: equality terms
/// (`matchLabels`, `In` with one value) are indexed by `(key, value)`; a selector with no equality term
/// (empty, `Exists`, `NotIn`, `DoesNotExist`, `In` with several values) is checked on every lookup.
/// What a NetworkPolicy needs to re-run only the policies a pod's old or new labels concern.
#[derive(Debug, Clone)]
pub struct SelectorIndex<T: Clone + Eq + Hash> {
    selectors: HashMap<T, Vec<Selector>>,
    by_label: HashMap<(String, String), HashSet<T>>,
    scanned: HashSet<T>,
}

impl<T: Clone + Eq + Hash> Default for SelectorIndex<T> {
    fn default() -> Self {
        SelectorIndex {
            selectors: HashMap::new(),
            by_label: HashMap::new(),
            scanned: HashSet::new(),
        }
    }
}

impl<T: Clone + Eq + Hash> SelectorIndex<T> {
    /// Sets the selectors of `owner` (replacing its previous ones; an owner matches if any of its selectors
    /// does).
    pub fn set(&mut self, owner: T, selectors: Vec<Selector>) {
        self.remove(&owner);
        for s in &selectors {
            match s.anchor() {
                Some(a) => {
                    self.by_label.entry(a).or_default().insert(owner.clone());
                }
                None => {
                    self.scanned.insert(owner.clone());
                }
            }
        }
        if !selectors.is_empty() {
            self.selectors.insert(owner, selectors);
        }
    }

    /// Forgets `owner`.
    pub fn remove(&mut self, owner: &T) {
        let Some(old) = self.selectors.remove(owner) else {
            return;
        };
        for s in &old {
            match s.anchor() {
                Some(a) => {
                    if let Some(set) = self.by_label.get_mut(&a) {
                        set.remove(owner);
                        if set.is_empty() {
                            self.by_label.remove(&a);
                        }
                    }
                }
                None => {
                    self.scanned.remove(owner);
                }
            }
        }
    }

    /// The owners with a selector matching `labels`.
    pub fn matching(&self, labels: &BTreeMap<String, String>) -> HashSet<T> {
        let mut out = HashSet::new();
        let candidates = labels
            .iter()
            .filter_map(|(k, v)| self.by_label.get(&(k.clone(), v.clone())))
            .flatten()
            .chain(self.scanned.iter());
        for o in candidates {
            if out.contains(o) {
                continue;
            }
            if self
                .selectors
                .get(o)
                .is_some_and(|ss| ss.iter().any(|s| s.matches(labels)))
            {
                out.insert(o.clone());
            }
        }
        out
    }

    /// The owners whose selectors match `old` or `new` labels (a relabelled object concerns both).
    pub fn matching_either(
        &self,
        old: Option<&BTreeMap<String, String>>,
        new: Option<&BTreeMap<String, String>>,
    ) -> HashSet<T> {
        let mut out = old.map(|l| self.matching(l)).unwrap_or_default();
        if let Some(n) = new {
            if old != Some(n) {
                out.extend(self.matching(n));
            }
        }
        out
    }

    /// The number of owners.
    pub fn len(&self) -> usize {
        self.selectors.len()
    }

    /// Whether no owner has a selector.
    pub fn is_empty(&self) -> bool {
        self.selectors.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use proptest::prelude::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct TestCtx {
        kinds: Arc<Kinds>,
    }

    impl Context for TestCtx {
        fn kinds(&self) -> &Kinds {
            &self.kinds
        }
    }

    #[derive(Debug)]
    enum TestError {
        Transient,
        Permanent,
    }

    impl fmt::Display for TestError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{self:?}")
        }
    }

    impl ReconcileError for TestError {
        fn failure(&self) -> Failure {
            match self {
                TestError::Transient => Failure::Transient,
                TestError::Permanent => Failure::Permanent,
            }
        }
    }

    /// A signal: the ConfigMap of that name must run again.
    struct Poke(String);

    /// ConfigMaps, run again when a Secret naming them in its `owner` label changes, or when poked. What it
    /// saw is its own state.
    #[derive(Default)]
    struct Maps {
        runs: Mutex<Vec<String>>,
        failures_left: AtomicUsize,
        started: AtomicUsize,
    }

    impl Maps {
        fn log(&self, s: String) {
            self.runs.lock().unwrap_or_else(|e| e.into_inner()).push(s);
        }
        fn runs(&self) -> Vec<String> {
            self.runs.lock().unwrap_or_else(|e| e.into_inner()).clone()
        }
        fn count(&self, what: &str) -> usize {
            self.runs().iter().filter(|r| *r == what).count()
        }
    }

    #[async_trait::async_trait]
    impl Reconciler<TestCtx> for Maps {
        type Object = ConfigMap;
        type Error = TestError;
        const NAME: &'static str = "configmap";

        async fn reconcile(
            &self,
            _ctx: &Arc<TestCtx>,
            cm: Arc<ConfigMap>,
        ) -> Result<Action, TestError> {
            let name = cm.metadata.name.clone().unwrap_or_default();
            self.log(format!("reconcile {name}"));
            if name == "bad" {
                return Err(TestError::Permanent);
            }
            if name == "flaky"
                && self
                    .failures_left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            {
                return Err(TestError::Transient);
            }
            if name == "poll" {
                return Ok(Action::Requeue(Duration::from_secs(30)));
            }
            Ok(Action::Done)
        }

        async fn cleanup(
            &self,
            _ctx: &Arc<TestCtx>,
            key: &Key<ConfigMap>,
            last: Option<Arc<ConfigMap>>,
        ) -> Result<Action, TestError> {
            let data = last
                .and_then(|c| c.data.clone())
                .and_then(|d| d.get("v").cloned())
                .unwrap_or_default();
            self.log(format!("cleanup {key} last={data}"));
            Ok(Action::Done)
        }

        fn relations(_this: &Arc<Self>, r: &mut Relations<'_, TestCtx, ConfigMap>) {
            r.on::<Secret>(|_, old, new| {
                [old, new]
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.metadata.labels.as_ref()?.get("owner").cloned())
                    .map(|o| Key::namespaced("default", &o))
                    .collect()
            });
            r.on_signal::<Poke>(|_, p| vec![Key::namespaced("default", &p.0)]);
        }

        async fn at_start(&self, _ctx: &Arc<TestCtx>) -> Result<(), TestError> {
            self.started.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    /// A periodic task that counts its passes and fails its second.
    #[derive(Default)]
    struct Tick {
        passes: AtomicUsize,
    }

    #[async_trait::async_trait]
    impl Task<TestCtx> for Tick {
        type Error = TestError;
        const NAME: &'static str = "tick";

        async fn run(&self, _ctx: &Arc<TestCtx>) -> Result<Action, TestError> {
            if self.passes.fetch_add(1, Ordering::SeqCst) == 1 {
                return Err(TestError::Transient);
            }
            Ok(Action::Requeue(Duration::from_secs(10)))
        }

        fn relations(_this: &Arc<Self>, r: &mut Relations<'_, TestCtx, Self>) {
            r.on_signal::<Poke>(|_, _| vec![Tick::key()]);
        }
    }

    fn cm(name: &str, v: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(name.to_owned());
        c.metadata.namespace = Some("default".to_owned());
        c.data = Some(BTreeMap::from([("v".to_owned(), v.to_owned())]));
        c
    }

    /// Lets every runnable task run (time is paused: nothing else moves).
    async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn reconciles_cleans_up_with_the_last_state_retries_and_follows_relations() {
        // No API server: the stores are fed as their watches would fill them; the client is never used.
        let client = kube::Client::try_from(kube::Config::new(
            "http://127.0.0.1:9".parse().expect("url"),
        ))
        .expect("client");
        let mut b = Kinds::builder::<TestCtx>(client);
        b.reconcile(Maps {
            failures_left: AtomicUsize::new(2),
            ..Maps::default()
        });
        b.task(Tick::default());
        let (kinds, start, feed) = b.build_fed();
        assert!(start.informers.is_empty(), "fed: no watch");
        assert!(
            kinds.store::<Secret>().is_some(),
            "a related kind is stored"
        );
        feed.list([cm("a", "1")]);
        feed.list_rest();
        kinds.ready().await.expect("ready");
        let ctx = Arc::new(TestCtx {
            kinds: kinds.clone(),
        });
        let maps = kinds.reconciler::<Maps>().expect("registered");
        let tick = kinds.reconciler::<Tick>().expect("registered");
        let workers = start.workers.start(ctx.clone()).await.expect("start");
        assert_eq!(maps.started.load(Ordering::SeqCst), 1, "start hook ran");
        let tasks: Vec<_> = workers.into_iter().map(tokio::spawn).collect();
        settle().await;
        assert_eq!(maps.runs(), ["reconcile a"]);
        assert_eq!(
            tick.passes.load(Ordering::SeqCst),
            1,
            "a task runs at start"
        );

        // A transient error is retried with backoff until it passes; a permanent one waits for a change.
        feed.apply(cm("flaky", "1"));
        feed.apply(cm("bad", "1"));
        settle().await;
        assert_eq!(maps.count("reconcile flaky"), 1);
        tokio::time::sleep(Duration::from_millis(5)).await;
        settle().await;
        assert_eq!(maps.count("reconcile flaky"), 2, "first retry after 5 ms");
        tokio::time::sleep(Duration::from_millis(10)).await;
        settle().await;
        assert_eq!(maps.count("reconcile flaky"), 3, "second after 10 more");
        // Long after: no further run of either.
        tokio::time::sleep(Duration::from_secs(600)).await;
        settle().await;
        assert_eq!(maps.count("reconcile flaky"), 3, "passes at the third run");
        assert_eq!(
            maps.count("reconcile bad"),
            1,
            "a permanent error is not retried"
        );
        // The task: its second pass failed and was retried; it runs every 10 s.
        assert!(tick.passes.load(Ordering::SeqCst) > 50);

        // A related object's change runs the objects its old and new states name; so does a signal.
        let mut s = Secret::default();
        s.metadata.name = Some("s".to_owned());
        s.metadata.namespace = Some("default".to_owned());
        s.metadata.labels = Some(BTreeMap::from([("owner".to_owned(), "bad".to_owned())]));
        feed.apply(s);
        settle().await;
        assert_eq!(maps.count("reconcile bad"), 2, "relation ran");
        let passes = tick.passes.load(Ordering::SeqCst);
        kinds.emit(&Poke("a".to_owned()));
        settle().await;
        assert_eq!(maps.count("reconcile a"), 2, "signal ran the kind");
        assert_eq!(
            tick.passes.load(Ordering::SeqCst),
            passes + 1,
            "and the task"
        );

        // A requeue comes back after its delay, once.
        feed.apply(cm("poll", "1"));
        settle().await;
        assert_eq!(maps.count("reconcile poll"), 1);
        assert!(
            kinds.all_idle() && !kinds.all_settled(),
            "idle, not settled: keys wait for their delays"
        );
        tokio::time::sleep(Duration::from_secs(30)).await;
        settle().await;
        assert_eq!(maps.count("reconcile poll"), 2);

        // A delete runs the cleanup with the last state, and drops the tombstone once it succeeded.
        feed.delete(cm("a", "1"));
        settle().await;
        assert!(maps.runs().iter().any(|r| r == "cleanup default/a last=1"));
        assert!(kinds
            .tombstone(&Key::<ConfigMap>::namespaced("default", "a"))
            .is_none());
        assert!(kinds.all_idle());
        for t in tasks {
            t.abort();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_start_hook_fails_the_start() {
        struct Refuses;
        #[async_trait::async_trait]
        impl Task<TestCtx> for Refuses {
            type Error = TestError;
            const NAME: &'static str = "refuses";
            async fn run(&self, _: &Arc<TestCtx>) -> Result<Action, TestError> {
                Ok(Action::Done)
            }
            async fn at_start(&self, _: &Arc<TestCtx>) -> Result<(), TestError> {
                Err(TestError::Permanent)
            }
        }
        let client = kube::Client::try_from(kube::Config::new(
            "http://127.0.0.1:9".parse().expect("url"),
        ))
        .expect("client");
        let mut b = Kinds::builder::<TestCtx>(client);
        b.task(Refuses);
        let (kinds, start, _feed) = b.build_fed();
        let ctx = Arc::new(TestCtx { kinds });
        let e = start.workers.start(ctx).await.err().expect("refused");
        assert_eq!(e.kind, "refuses");
    }

    /// A slot and its writer, as the builder makes them, without a watch.
    type Fixture = (
        Kinds,
        reflector::store::Writer<ConfigMap>,
        Arc<WorkQueue<Key<ConfigMap>>>,
        Arc<Mutex<Vec<String>>>,
    );

    fn slot_with_relation() -> Fixture {
        let (store, writer) = reflector::store::<ConfigMap>();
        let queue = WorkQueue::new("configmap");
        let related = Arc::new(Mutex::new(Vec::new()));
        let r = related.clone();
        let hook: Hook<ConfigMap> = Arc::new(move |_, old, new| {
            let name = |c: Option<&ConfigMap>| {
                c.and_then(|c| c.data.as_ref()?.get("v").cloned())
                    .unwrap_or_else(|| "-".to_owned())
            };
            r.lock().unwrap_or_else(|e| e.into_inner()).push(format!(
                "{}->{}",
                name(old),
                name(new)
            ));
        });
        let store = Arc::new(store);
        let slot = Slot::<ConfigMap> {
            store: store.clone(),
            typed: store,
            queue: Some(queue.clone()),
            tombs: Mutex::default(),
            hooks: vec![hook],
        };
        let mut slots: Slots = HashMap::new();
        slots.insert(TypeId::of::<ConfigMap>(), Box::new(slot));
        let kinds = Kinds {
            slots,
            queues: Vec::new(),
            ready: Vec::new(),
            signals: HashMap::new(),
            instances: HashMap::new(),
        };
        (kinds, writer, queue, related)
    }

    fn namespaced(c: ConfigMap) -> ConfigMap {
        let mut c = c;
        c.metadata.namespace = Some("default".to_owned());
        c
    }

    #[tokio::test]
    async fn a_relist_finds_what_was_deleted_while_the_watch_was_down() {
        let (kinds, mut w, queue, related) = slot_with_relation();
        let mut relist = Relist::default();
        let (a, b) = (namespaced(cm("a", "1")), namespaced(cm("b", "1")));
        for ev in [
            WatchEvent::Init,
            WatchEvent::InitApply(a.clone()),
            WatchEvent::InitApply(b.clone()),
            WatchEvent::InitDone,
        ] {
            observe(&kinds, &mut w, &mut relist, ev);
        }
        assert_eq!(queue.len(), 2);
        let a2 = namespaced(cm("a", "2"));
        observe(&kinds, &mut w, &mut relist, WatchEvent::Apply(a2.clone()));
        // The watch drops; on the re-list, b is gone and a changed again.
        let a3 = namespaced(cm("a", "3"));
        for ev in [
            WatchEvent::Init,
            WatchEvent::InitApply(a3),
            WatchEvent::InitDone,
        ] {
            observe(&kinds, &mut w, &mut relist, ev);
        }
        let kb = Key::<ConfigMap>::namespaced("default", "b");
        assert!(kinds.get(&kb).is_none());
        let tomb = kinds
            .tombstone(&kb)
            .expect("b's last state kept for its cleanup");
        assert_eq!(
            tomb.data
                .as_ref()
                .and_then(|d| d.get("v"))
                .map(String::as_str),
            Some("1")
        );
        assert_eq!(
            *related.lock().unwrap_or_else(|e| e.into_inner()),
            ["-->1", "-->1", "1->2", "2->3", "1->-"],
            "relations see the old and new states, also across a re-list"
        );
        // A re-created b drops the tombstone.
        observe(&kinds, &mut w, &mut relist, WatchEvent::Apply(b));
        assert!(kinds.tombstone(&kb).is_none());
        assert!(kinds.get(&kb).is_some());
    }

    fn labels(v: &[(&str, &str)]) -> BTreeMap<String, String> {
        v.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn keys_split_back_into_namespace_and_name() {
        let k = Key::<ConfigMap>::namespaced("kube-system", "coredns");
        assert_eq!((k.namespace(), k.name()), (Some("kube-system"), "coredns"));
        assert_eq!(k.to_string(), "kube-system/coredns");
        let c = Key::<ConfigMap>::cluster("node-1");
        assert_eq!((c.namespace(), c.name()), (None, "node-1"));
        assert_ne!(Key::<ConfigMap>::namespaced("", "a"), Key::cluster("a"));
        assert_eq!(
            Key::of(&namespaced(cm("a", "1"))),
            Key::namespaced("default", "a")
        );
    }

    #[test]
    fn selector_index_answers_old_and_new_labels() {
        let mut idx = SelectorIndex::<&str>::default();
        let eq = |k: &str, v: &str| Requirement::Equals(k.to_owned(), v.to_owned());
        idx.set("web", vec![Selector(vec![eq("app", "web")])]);
        idx.set(
            "web-prod",
            vec![Selector(vec![
                eq("app", "web"),
                Requirement::In("env".into(), vec!["prod".into(), "stage".into()]),
            ])],
        );
        idx.set("all", vec![Selector::default()]);
        idx.set(
            "no-db",
            vec![Selector(vec![Requirement::NotIn(
                "app".into(),
                vec!["db".into()],
            )])],
        );
        let m = |idx: &SelectorIndex<&'static str>, l: &[(&str, &str)]| {
            let mut v: Vec<_> = idx.matching(&labels(l)).into_iter().collect();
            v.sort();
            v
        };
        assert_eq!(m(&idx, &[("app", "web")]), ["all", "no-db", "web"]);
        assert_eq!(
            m(&idx, &[("app", "web"), ("env", "prod")]),
            ["all", "no-db", "web", "web-prod"]
        );
        assert_eq!(m(&idx, &[("app", "db")]), ["all"]);
        let mut either: Vec<_> = idx
            .matching_either(
                Some(&labels(&[("app", "db")])),
                Some(&labels(&[("app", "web")])),
            )
            .into_iter()
            .collect();
        either.sort();
        assert_eq!(either, ["all", "no-db", "web"]);
        idx.remove(&"web");
        assert_eq!(m(&idx, &[("app", "web")]), ["all", "no-db"]);
        assert_eq!(idx.len(), 3);
    }

    #[test]
    fn a_bad_label_selector_is_an_error() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
            LabelSelector, LabelSelectorRequirement,
        };
        let s = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "app".into(),
                operator: "In".into(),
                values: None,
            }]),
            match_labels: None,
        };
        assert!(Selector::from_label_selector(&s).is_err());
    }

    fn requirement() -> impl Strategy<Value = Requirement> {
        let key = prop::sample::select(vec!["a", "b", "c"]).prop_map(str::to_owned);
        let val = prop::sample::select(vec!["x", "y"]).prop_map(str::to_owned);
        let vals = prop::collection::vec(val.clone(), 1..3);
        prop_oneof![
            (key.clone(), val).prop_map(|(k, v)| Requirement::Equals(k, v)),
            (key.clone(), vals.clone()).prop_map(|(k, v)| Requirement::In(k, v)),
            (key.clone(), vals).prop_map(|(k, v)| Requirement::NotIn(k, v)),
            key.clone().prop_map(Requirement::Exists),
            key.prop_map(Requirement::DoesNotExist),
        ]
    }

    proptest! {
        /// The index finds exactly the owners a scan of every selector finds, through sets and removes.
        #[test]
        fn selector_index_equals_a_scan(
            owners in prop::collection::vec(
                (0u8..6, prop::collection::vec(prop::collection::vec(requirement(), 0..3).prop_map(Selector), 0..3)),
                0..12,
            ),
            removed in prop::collection::vec(0u8..6, 0..3),
            objects in prop::collection::vec(
                prop::collection::btree_map(
                    prop::sample::select(vec!["a", "b", "c"]).prop_map(str::to_owned),
                    prop::sample::select(vec!["x", "y"]).prop_map(str::to_owned),
                    0..3,
                ),
                1..6,
            ),
        ) {
            let mut idx = SelectorIndex::<u8>::default();
            let mut truth: HashMap<u8, Vec<Selector>> = HashMap::new();
            for (o, sels) in owners {
                idx.set(o, sels.clone());
                if sels.is_empty() { truth.remove(&o); } else { truth.insert(o, sels); }
            }
            for r in removed {
                idx.remove(&r);
                truth.remove(&r);
            }
            prop_assert_eq!(idx.len(), truth.len());
            for l in &objects {
                let want: HashSet<u8> = truth
                    .iter()
                    .filter(|(_, ss)| ss.iter().any(|s| s.matches(l)))
                    .map(|(o, _)| *o)
                    .collect();
                prop_assert_eq!(idx.matching(l), want);
            }
        }
    }
}
