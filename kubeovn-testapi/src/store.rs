//! The object store: one resourceVersion sequence, an event history for watches, and the
//! create/update/delete rules of the API server (uids, generateName, finalizers, namespaces).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{json, Map, Value};
use tokio::sync::broadcast;

use crate::error::{Error, Result};
use crate::resources::{self, ResourceInfo};
use crate::service::{self, Allocator};

/// Watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Object created.
    Added,
    /// Object changed.
    Modified,
    /// Object removed.
    Deleted,
}

impl EventType {
    /// Wire name (`ADDED`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change in the store.
#[derive(Debug)]
pub struct Event {
    /// resourceVersion of the change.
    pub rv: u64,
    /// Storage key of the resource (`group/plural`).
    pub key: String,
    /// Namespace of the object (empty when cluster-scoped).
    pub namespace: String,
    /// What happened.
    pub kind: EventType,
    /// The object after the change (before it, for deletions, with the new resourceVersion).
    pub object: Arc<Value>,
    /// The object before a modification, so that selector watches see objects enter and leave.
    pub previous: Option<Arc<Value>>,
    /// The watch line (`{"type":...,"object":...}\n`) for `kind`, rendered once and shared by
    /// every watcher; dropped when the event ages out of the live window (see [`LINE_WINDOW`]).
    line: Mutex<Option<Bytes>>,
}

/// How many of the newest events keep their rendered watch line; older ones (only replayed to
/// watches resuming from an old resourceVersion) render it again, so memory follows the objects.
pub const LINE_WINDOW: usize = 4096;

/// Renders one watch line: `{"type":TY,"object":OBJ}` and a newline, serialising `obj` in place.
pub fn watch_line(ty: &str, obj: &Value) -> Bytes {
    let mut v = Vec::with_capacity(1024);
    v.extend_from_slice(b"{\"type\":\"");
    v.extend_from_slice(ty.as_bytes());
    v.extend_from_slice(b"\",\"object\":");
    let _ = serde_json::to_writer(&mut v, obj);
    v.extend_from_slice(b"}\n");
    Bytes::from(v)
}

impl Event {
    /// A new event.
    pub fn new(
        rv: u64,
        key: String,
        namespace: String,
        kind: EventType,
        object: Arc<Value>,
        previous: Option<Arc<Value>>,
    ) -> Self {
        Event {
            rv,
            key,
            namespace,
            kind,
            object,
            previous,
            line: Mutex::new(None),
        }
    }

    /// The watch line of this event as type `ty`: rendered once for the event's own type and
    /// shared, rendered afresh for another type (a selector watch seeing an object enter or leave).
    pub fn line(&self, ty: &str) -> Bytes {
        if ty != self.kind.as_str() {
            return watch_line(ty, &self.object);
        }
        let mut g = self.line.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = &*g {
            return b.clone();
        }
        let b = watch_line(ty, &self.object);
        *g = Some(b.clone());
        b
    }

    /// The object as JSON: a slice of the shared watch line, so an answer and every watcher share
    /// one serialisation.
    pub fn object_json(&self) -> Bytes {
        let line = self.line(self.kind.as_str());
        let start = b"{\"type\":\"\",\"object\":".len() + self.kind.as_str().len();
        line.slice(start..line.len().saturating_sub(2).max(start))
    }

    fn drop_line(&self) {
        self.line.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

type Objects = BTreeMap<(String, String), Arc<Value>>;

struct Inner {
    rv: u64,
    resources: Vec<Arc<ResourceInfo>>,
    objects: HashMap<String, Objects>,
    history: VecDeque<Arc<Event>>,
    compacted: u64,
    /// The ClusterIPs and node ports of the stored Services, kept in step by
    /// [`Store::commit_event`].
    services: Allocator,
}

/// The in-memory store behind the server.
pub struct Store {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<Event>>,
    history_limit: usize,
    counter: AtomicU64,
    seed: u64,
}

/// Current time as RFC 3339 (`2024-01-02T03:04:05Z`).
pub fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format_rfc3339(secs as i64)
}

/// Seconds since the epoch as RFC 3339.
pub fn format_rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// RFC 3339 (`...Z`) back to seconds since the epoch.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 19 {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (hh, mm, ss) = (n(11..13)?, n(14..16)?, n(17..19)?);
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86400 + hh * 3600 + mm * 60 + ss)
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn meta_mut(obj: &mut Value) -> Result<&mut Map<String, Value>> {
    let o = obj
        .as_object_mut()
        .ok_or_else(|| Error::bad_request("the body must be a JSON object"))?;
    let m = o.entry("metadata").or_insert_with(|| json!({}));
    if m.is_null() {
        *m = json!({});
    }
    m.as_object_mut()
        .ok_or_else(|| Error::bad_request("metadata must be an object"))
}

fn has_finalizers(obj: &Value) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
}

/// Whether an update changes more than metadata and status (so `generation` moves).
fn spec_changed(old: &Value, new: &Value) -> bool {
    let (Some(o), Some(n)) = (old.as_object(), new.as_object()) else {
        return old != new;
    };
    fn rest(m: &Map<String, Value>) -> impl Iterator<Item = (&String, &Value)> {
        m.iter().filter(|(k, _)| *k != "metadata" && *k != "status")
    }
    !rest(o).eq(rest(n))
}

/// What [`Store::watch`] hands a new watch.
pub struct WatchStart {
    /// Events to send first, in order.
    pub replay: Vec<Arc<Event>>,
    /// Every later change.
    pub rx: broadcast::Receiver<Arc<Event>>,
    /// resourceVersion when the watch started.
    pub rv: u64,
}

/// The state a request sees in the store, as returned by [`Store::list`].
pub struct ListSnapshot {
    /// resourceVersion of the snapshot.
    pub rv: u64,
    /// Matching objects in (namespace, name) order.
    pub items: Vec<Arc<Value>>,
}

impl Store {
    /// An empty store with the built-in kinds and the default namespaces, allocating ClusterIPs
    /// from [`service::DEFAULT_RANGE`] and node ports from [`service::DEFAULT_NODE_PORT_RANGE`].
    pub fn new(history_limit: usize) -> Self {
        Self::with_services(history_limit, Allocator::default())
    }

    /// [`Self::new`], allocating Services' ClusterIPs and node ports from `services`.
    pub fn with_services(history_limit: usize, services: Allocator) -> Self {
        let (tx, _) = broadcast::channel(16384);
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        let store = Store {
            inner: Mutex::new(Inner {
                rv: 0,
                resources: resources::builtins().into_iter().map(Arc::new).collect(),
                objects: HashMap::new(),
                history: VecDeque::new(),
                compacted: 0,
                services,
            }),
            tx,
            history_limit: history_limit.max(1),
            counter: AtomicU64::new(1),
            seed,
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let info = store.resource("", "v1", "namespaces");
            if let Some(info) = info {
                let _ = store.create(&info, None, json!({"metadata": {"name": ns}}));
            }
        }
        store
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn next_random(&self) -> u64 {
        // splitmix64 over a counter: unique per store, unpredictable enough for names.
        let mut z = self.seed.wrapping_add(
            self.counter
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn uid(&self) -> String {
        let (a, b) = (self.next_random(), self.next_random());
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            (b >> 48) & 0x3fff | 0x8000,
            b & 0xffff_ffff_ffff
        )
    }

    /// Current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// Served resources.
    pub fn resources(&self) -> Vec<Arc<ResourceInfo>> {
        self.lock().resources.clone()
    }

    /// Looks a resource up by group, version and plural.
    pub fn resource(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceInfo>> {
        self.lock()
            .resources
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
            .cloned()
    }

    /// Records a change: bumps the resourceVersion, stamps the object, stores it and tells the watchers.
    fn commit(
        &self,
        inner: &mut Inner,
        info: &ResourceInfo,
        kind: EventType,
        obj: Value,
    ) -> Arc<Value> {
        self.commit_event(inner, info, kind, obj).object.clone()
    }

    /// [`Self::commit`], returning the event (whose rendered line the HTTP answer shares).
    fn commit_event(
        &self,
        inner: &mut Inner,
        info: &ResourceInfo,
        kind: EventType,
        mut obj: Value,
    ) -> Arc<Event> {
        inner.rv += 1;
        let rv = inner.rv;
        if let Ok(m) = meta_mut(&mut obj) {
            m.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
        let ns = meta_str(&obj, "namespace").to_owned();
        let name = meta_str(&obj, "name").to_owned();
        let obj = Arc::new(obj);
        let key = info.key();
        let objects = inner.objects.entry(key.clone()).or_default();
        let previous = if kind == EventType::Deleted {
            objects.remove(&(ns.clone(), name))
        } else {
            objects.insert((ns.clone(), name), obj.clone())
        };
        if key == "/services" {
            let after = (kind != EventType::Deleted).then_some(&*obj);
            inner.services.commit(previous.as_deref(), after);
        }
        let ev = Arc::new(Event::new(
            rv,
            key,
            ns,
            kind,
            obj.clone(),
            if kind == EventType::Modified {
                previous
            } else {
                None
            },
        ));
        inner.history.push_back(ev.clone());
        if let Some(old) = inner
            .history
            .len()
            .checked_sub(LINE_WINDOW + 1)
            .and_then(|i| inner.history.get(i))
        {
            old.drop_line();
        }
        while inner.history.len() > self.history_limit {
            if let Some(old) = inner.history.pop_front() {
                inner.compacted = old.rv;
            }
        }
        let _ = self.tx.send(ev.clone());
        ev
    }

    fn check_namespace(
        &self,
        inner: &Inner,
        info: &ResourceInfo,
        ns: Option<&str>,
    ) -> Result<String> {
        if !info.namespaced {
            return Ok(String::new());
        }
        let ns = ns
            .filter(|s| !s.is_empty())
            .ok_or_else(|| Error::bad_request("a namespace is required"))?;
        let exists = inner
            .objects
            .get("/namespaces")
            .is_some_and(|o| o.contains_key(&(String::new(), ns.to_owned())));
        if !exists {
            return Err(Error::not_found("", "namespaces", ns));
        }
        Ok(ns.to_owned())
    }

    /// Creates an object (POST).
    pub fn create(&self, info: &ResourceInfo, ns: Option<&str>, obj: Value) -> Result<Arc<Value>> {
        self.create_event(info, ns, obj).map(|e| e.object.clone())
    }

    /// [`Self::create`], returning the change's event ([`Event::object_json`] serves the answer).
    pub fn create_event(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        mut obj: Value,
    ) -> Result<Arc<Event>> {
        let api_version = info.api_version();
        {
            let o = obj
                .as_object_mut()
                .ok_or_else(|| Error::bad_request("the body must be a JSON object"))?;
            match o.get("kind").and_then(Value::as_str) {
                Some(k) if k != info.kind => {
                    return Err(Error::bad_request(format!(
                        "kind {k} does not match the resource {}",
                        info.kind
                    )))
                }
                _ => {}
            }
            match o.get("apiVersion").and_then(Value::as_str) {
                Some(v) if v != api_version => {
                    return Err(Error::bad_request(format!(
                        "apiVersion {v} does not match {api_version}"
                    )))
                }
                _ => {}
            }
            o.insert("kind".into(), Value::String(info.kind.clone()));
            o.insert("apiVersion".into(), Value::String(api_version));
        }
        let body_ns = meta_str(&obj, "namespace").to_owned();
        let ns = match (ns, body_ns.as_str()) {
            (Some(u), b) if !b.is_empty() && b != u => {
                return Err(Error::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ))
            }
            (Some(u), _) => Some(u.to_owned()),
            (None, "") => None,
            (None, b) => Some(b.to_owned()),
        };
        let crd = if info.key() == "apiextensions.k8s.io/customresourcedefinitions" {
            Some(resources::from_crd(&obj).map_err(Error::invalid)?)
        } else {
            None
        };
        let mut inner = self.lock();
        let ns = self.check_namespace(&inner, info, ns.as_deref())?;
        let m = meta_mut(&mut obj)?;
        let mut name = m
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if name.is_empty() {
            let prefix = m
                .get("generateName")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            if prefix.is_empty() {
                return Err(Error::invalid(
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
            const ALPHA: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
            loop {
                let mut r = self.next_random();
                let mut n = prefix.clone();
                for _ in 0..5 {
                    n.push(ALPHA[(r % ALPHA.len() as u64) as usize] as char);
                    r /= ALPHA.len() as u64;
                }
                let taken = inner
                    .objects
                    .get(&info.key())
                    .is_some_and(|o| o.contains_key(&(ns.clone(), n.clone())));
                if !taken {
                    name = n;
                    break;
                }
            }
        }
        validate_name(&name)?;
        if inner
            .objects
            .get(&info.key())
            .is_some_and(|o| o.contains_key(&(ns.clone(), name.clone())))
        {
            return Err(Error::already_exists(&info.group, &info.plural, &name));
        }
        m.insert("name".into(), Value::String(name.clone()));
        if info.namespaced {
            m.insert("namespace".into(), Value::String(ns));
        } else {
            m.remove("namespace");
        }
        m.insert("uid".into(), Value::String(self.uid()));
        m.insert("creationTimestamp".into(), Value::String(now_rfc3339()));
        m.insert("generation".into(), json!(1));
        m.remove("deletionTimestamp");
        m.remove("resourceVersion");
        if info.key() == "/services" {
            // Last: nothing after it fails, so the addresses it chose are committed.
            service::prepare(&inner.services, &name, &mut obj, None)?;
        }
        if info.key() == "/namespaces" {
            name_label(&mut obj, &name);
            obj["status"] = json!({"phase": "Active"});
            // Also under an empty spec, which a protobuf body always carries.
            if obj.pointer("/spec/finalizers").is_none() {
                obj["spec"] = json!({"finalizers": ["kubernetes"]});
            }
        }
        if let Some(served) = crd {
            obj["status"] = json!({
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now_rfc3339()},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now_rfc3339()},
                ],
                "acceptedNames": obj.pointer("/spec/names").cloned().unwrap_or(Value::Null),
                "storedVersions": served.iter().map(|r| r.version.clone()).collect::<Vec<_>>(),
            });
            inner.resources.retain(|r| {
                !served
                    .iter()
                    .any(|s| s.group == r.group && s.plural == r.plural)
            });
            inner.resources.extend(served.into_iter().map(Arc::new));
        }
        Ok(self.commit_event(&mut inner, info, EventType::Added, obj))
    }

    /// Reads one object.
    pub fn get(&self, info: &ResourceInfo, ns: Option<&str>, name: &str) -> Result<Arc<Value>> {
        let ns = if info.namespaced {
            ns.unwrap_or("")
        } else {
            ""
        };
        self.lock()
            .objects
            .get(&info.key())
            .and_then(|o| o.get(&(ns.to_owned(), name.to_owned())))
            .cloned()
            .ok_or_else(|| Error::not_found(&info.group, &info.plural, name))
    }

    /// Lists objects (all namespaces when `ns` is `None`) that pass `filter`.
    pub fn list(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        filter: impl Fn(&Value) -> bool,
    ) -> ListSnapshot {
        self.list_page(info, ns, None, usize::MAX, false, filter).0
    }

    /// One page of [`Self::list`]: at most `limit` matching objects after the key `after` (a continue
    /// token's (namespace, name)), and how many more match (counted only when asked: it walks the rest).
    pub fn list_page(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        after: Option<&(String, String)>,
        limit: usize,
        count_rest: bool,
        filter: impl Fn(&Value) -> bool,
    ) -> (ListSnapshot, usize) {
        use std::ops::Bound;
        let inner = self.lock();
        let mut items = Vec::new();
        let mut rest = 0;
        if let Some(objs) = inner.objects.get(&info.key()) {
            let ns = ns.filter(|_| info.namespaced);
            // Walk the ordered map from the continue key on: a page costs its own size, not the list's.
            let start = match (ns, after) {
                (Some(n), Some(a)) if a.0.as_str() < n => {
                    Bound::Included((n.to_owned(), String::new()))
                }
                (_, Some(a)) => Bound::Excluded(a.clone()),
                (Some(n), None) => Bound::Included((n.to_owned(), String::new())),
                (None, None) => Bound::Unbounded,
            };
            let mut it = objs
                .range((start, Bound::Unbounded))
                .take_while(|((n, _), _)| ns.is_none_or(|ns| n == ns))
                .map(|(_, v)| v)
                .filter(|v| filter(v));
            items.extend(it.by_ref().take(limit).cloned());
            if count_rest {
                rest = it.count();
            } else if it.next().is_some() {
                rest = 1;
            }
        }
        (
            ListSnapshot {
                rv: inner.rv,
                items,
            },
            rest,
        )
    }

    /// Replaces an object (PUT), or with `status_only` only its status (PUT on `/status`).
    ///
    /// A resourceVersion in `new` must match the stored one (409 Conflict otherwise).
    pub fn update(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        new: Value,
        status_only: bool,
    ) -> Result<Arc<Value>> {
        self.update_event(info, ns, name, new, status_only)
            .map(|e| e.object.clone())
    }

    /// [`Self::update`], returning the change's event ([`Event::object_json`] serves the answer).
    pub fn update_event(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        mut new: Value,
        status_only: bool,
    ) -> Result<Arc<Event>> {
        if !new.is_object() {
            return Err(Error::bad_request("the body must be a JSON object"));
        }
        let body_name = meta_str(&new, "name");
        if !body_name.is_empty() && body_name != name {
            return Err(Error::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let body_ns = meta_str(&new, "namespace");
        if info.namespaced && !body_ns.is_empty() && Some(body_ns) != ns {
            return Err(Error::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        if let Some(k) = new.get("kind").and_then(Value::as_str) {
            if k != info.kind {
                return Err(Error::bad_request(format!(
                    "kind {k} does not match the resource {}",
                    info.kind
                )));
            }
        }
        let key_ns = if info.namespaced {
            ns.unwrap_or("").to_owned()
        } else {
            String::new()
        };
        let mut inner = self.lock();
        let old = inner
            .objects
            .get(&info.key())
            .and_then(|o| o.get(&(key_ns, name.to_owned())))
            .cloned()
            .ok_or_else(|| Error::not_found(&info.group, &info.plural, name))?;
        let rv = meta_str(&new, "resourceVersion");
        if !rv.is_empty() && rv != meta_str(&old, "resourceVersion") {
            return Err(Error::conflict(&info.group, &info.plural, name));
        }
        let mut obj = if status_only {
            let mut o = (*old).clone();
            match new.get("status") {
                Some(s) => o["status"] = s.clone(),
                None => {
                    if let Some(m) = o.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            o
        } else {
            if info.status {
                match old.get("status") {
                    Some(s) => new["status"] = s.clone(),
                    None => {
                        if let Some(m) = new.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
            }
            new
        };
        {
            let o = obj
                .as_object_mut()
                .ok_or_else(|| Error::bad_request("the body must be a JSON object"))?;
            o.insert("kind".into(), Value::String(info.kind.clone()));
            o.insert("apiVersion".into(), Value::String(info.api_version()));
        }
        if info.key() == "/services" && !status_only {
            service::prepare(&inner.services, name, &mut obj, Some(&old))?;
        }
        if info.key() == "/namespaces" {
            name_label(&mut obj, name);
        }
        let old_meta = old.get("metadata").cloned().unwrap_or_else(|| json!({}));
        let generation = old_meta
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let bump = !status_only && spec_changed(&old, &obj);
        let m = meta_mut(&mut obj)?;
        for k in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            match old_meta.get(k) {
                Some(v) => m.insert(k.into(), v.clone()),
                None => m.remove(k),
            };
        }
        m.insert(
            "generation".into(),
            json!(if bump { generation + 1 } else { generation }),
        );
        if info.key() == "apiextensions.k8s.io/customresourcedefinitions" && !status_only {
            // An updated CRD may serve other versions or names.
            let before = resources::from_crd(&old).unwrap_or_default();
            let after = resources::from_crd(&obj).map_err(Error::invalid)?;
            inner.resources.retain(|r| {
                !before
                    .iter()
                    .chain(after.iter())
                    .any(|s| s.group == r.group && s.plural == r.plural)
            });
            inner.resources.extend(after.into_iter().map(Arc::new));
        }
        if old_meta.get("deletionTimestamp").is_some() && !has_finalizers(&obj) {
            return Ok(self.commit_event(&mut inner, info, EventType::Deleted, obj));
        }
        Ok(self.commit_event(&mut inner, info, EventType::Modified, obj))
    }

    /// Deletes an object: with finalizers it only gets a deletionTimestamp.
    ///
    /// `precondition_rv` (DeleteOptions.preconditions.resourceVersion) must match when given.
    pub fn delete(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        precondition_rv: Option<&str>,
    ) -> Result<Arc<Value>> {
        let key_ns = if info.namespaced {
            ns.unwrap_or("").to_owned()
        } else {
            String::new()
        };
        let mut inner = self.lock();
        let old = inner
            .objects
            .get(&info.key())
            .and_then(|o| o.get(&(key_ns.clone(), name.to_owned())))
            .cloned()
            .ok_or_else(|| Error::not_found(&info.group, &info.plural, name))?;
        if let Some(rv) = precondition_rv {
            if rv != meta_str(&old, "resourceVersion") {
                return Err(Error::conflict(&info.group, &info.plural, name));
            }
        }
        if has_finalizers(&old) {
            if old.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok(old);
            }
            let mut obj = (*old).clone();
            let m = meta_mut(&mut obj)?;
            m.insert("deletionTimestamp".into(), Value::String(now_rfc3339()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            return Ok(self.commit(&mut inner, info, EventType::Modified, obj));
        }
        if info.key() == "/namespaces" {
            // Cascade: everything in the namespace goes first.
            let all = inner.resources.clone();
            let mut seen = Vec::new();
            for r in all.iter().filter(|r| r.namespaced) {
                if seen.contains(&r.key()) {
                    continue;
                }
                seen.push(r.key());
                let victims: Vec<Arc<Value>> = inner
                    .objects
                    .get(&r.key())
                    .map(|o| {
                        o.range((name.to_owned(), String::new())..)
                            .take_while(|((n, _), _)| n == name)
                            .map(|(_, v)| v.clone())
                            .collect()
                    })
                    .unwrap_or_default();
                for v in victims {
                    self.commit(&mut inner, r, EventType::Deleted, (*v).clone());
                }
            }
        }
        if info.key() == "apiextensions.k8s.io/customresourcedefinitions" {
            if let Ok(served) = resources::from_crd(&old) {
                inner.resources.retain(|r| {
                    !served
                        .iter()
                        .any(|s| s.group == r.group && s.plural == r.plural)
                });
                if let Some(first) = served.first() {
                    let objs: Vec<Arc<Value>> = inner
                        .objects
                        .get(&first.key())
                        .map(|o| o.values().cloned().collect())
                        .unwrap_or_default();
                    for v in objs {
                        self.commit(&mut inner, first, EventType::Deleted, (*v).clone());
                    }
                }
            }
        }
        Ok(self.commit(&mut inner, info, EventType::Deleted, (*old).clone()))
    }

    /// Starts a watch: the events after `from` still in the history (or synthetic ADDED events for
    /// every current object when `from` is `None`), and a receiver for what comes next.
    ///
    /// Fails with 410 Gone when `from` is older than the history holds.
    pub fn watch(&self, info: &ResourceInfo, from: Option<u64>) -> Result<WatchStart> {
        let inner = self.lock();
        let key = info.key();
        let rx = self.tx.subscribe();
        let replay = match from {
            Some(from) => {
                if from < inner.compacted {
                    return Err(Error::gone(format!(
                        "too old resource version: {from} ({})",
                        inner.compacted + 1
                    )));
                }
                let start = inner.history.partition_point(|e| e.rv <= from);
                inner
                    .history
                    .range(start..)
                    .filter(|e| e.key == key)
                    .cloned()
                    .collect()
            }
            None => inner
                .objects
                .get(&key)
                .map(|o| {
                    o.values()
                        .map(|v| {
                            Arc::new(Event::new(
                                meta_str(v, "resourceVersion").parse().unwrap_or(0),
                                key.clone(),
                                meta_str(v, "namespace").to_owned(),
                                EventType::Added,
                                v.clone(),
                                None,
                            ))
                        })
                        .collect()
                })
                .unwrap_or_default(),
        };
        Ok(WatchStart {
            replay,
            rx,
            rv: inner.rv,
        })
    }
}

impl Store {
    /// The events of `info` after `after` still in the history, for a watch that fell behind the
    /// live channel; `None` when the history no longer reaches back that far (410 Gone).
    pub fn history_after(&self, info: &ResourceInfo, after: u64) -> Option<Vec<Arc<Event>>> {
        let inner = self.lock();
        if after < inner.compacted {
            return None;
        }
        let key = info.key();
        let start = inner.history.partition_point(|e| e.rv <= after);
        Some(
            inner
                .history
                .range(start..)
                .filter(|e| e.key == key)
                .cloned()
                .collect(),
        )
    }
}

/// Sets the `kubernetes.io/metadata.name` label of a Namespace to its name, as kube-apiserver does
/// on every create and update (so a namespace selector can match a name).
fn name_label(obj: &mut Value, name: &str) {
    let Ok(m) = meta_mut(obj) else { return };
    let labels = m.entry("labels").or_insert_with(|| json!({}));
    if !labels.is_object() {
        *labels = json!({});
    }
    labels["kubernetes.io/metadata.name"] = json!(name);
}

/// Checks a DNS-1123 subdomain name, as the API server does for most kinds.
fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.' || b == b':'
        })
        && name
            .as_bytes()
            .first()
            .is_some_and(u8::is_ascii_alphanumeric)
        && name
            .as_bytes()
            .last()
            .is_some_and(u8::is_ascii_alphanumeric);
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case \
             alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trip() {
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(parse_rfc3339("2023-11-14T22:13:20Z"), Some(1_700_000_000));
    }

    #[test]
    fn pages_walk_every_namespace_once() {
        let s = Store::new(100);
        let cm = s.resource("", "v1", "configmaps").expect("configmaps");
        for ns in ["default", "kube-system"] {
            for i in 0..5 {
                s.create(
                    &cm,
                    Some(ns),
                    json!({"metadata": {"name": format!("c{i}"), "labels": {"odd": (i % 2).to_string()}}}),
                )
                .expect("create");
            }
        }
        let odd = |v: &Value| v.pointer("/metadata/labels/odd") == Some(&json!("1"));
        for (ns, filter, want) in [
            (None, false, 10),
            (None, true, 4),
            (Some("kube-system"), false, 5),
            (Some("kube-system"), true, 2),
        ] {
            let mut got = Vec::new();
            let mut after: Option<(String, String)> = None;
            loop {
                let (page, rest) =
                    s.list_page(&cm, ns, after.as_ref(), 3, true, |v| !filter || odd(v));
                assert!(page.items.len() <= 3);
                for v in &page.items {
                    let m = |f: &str| v["metadata"][f].as_str().expect("meta").to_owned();
                    got.push((m("namespace"), m("name")));
                }
                if rest == 0 {
                    break;
                }
                after = got.last().cloned();
            }
            let mut sorted = got.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!((got.len(), sorted.len()), (want, want), "{ns:?} {filter}");
            assert!(ns.is_none_or(|n| got.iter().all(|(g, _)| g == n)));
        }
        // A token from before the namespace starts the namespace's list at its beginning.
        let before = ("aaa".to_owned(), "x".to_owned());
        let (page, _) = s.list_page(&cm, Some("kube-system"), Some(&before), 100, true, |_| true);
        assert_eq!(page.items.len(), 5);
    }

    #[test]
    fn finalizers_keep_the_object() {
        let s = Store::new(100);
        let cm = s.resource("", "v1", "configmaps").expect("configmaps");
        s.create(
            &cm,
            Some("default"),
            json!({"metadata": {"name": "a", "finalizers": ["x/y"]}}),
        )
        .expect("create");
        let o = s.delete(&cm, Some("default"), "a", None).expect("delete");
        assert!(o.pointer("/metadata/deletionTimestamp").is_some());
        let mut o = (*s.get(&cm, Some("default"), "a").expect("still there")).clone();
        o["metadata"]["finalizers"] = json!([]);
        s.update(&cm, Some("default"), "a", o, false)
            .expect("update");
        assert!(s.get(&cm, Some("default"), "a").is_err());
    }

    #[test]
    fn history_catch_up_and_shared_lines() {
        let s = Store::new(8);
        let cm = s.resource("", "v1", "configmaps").expect("configmaps");
        let rv = s.resource_version();
        for i in 0..5 {
            s.create(
                &cm,
                Some("default"),
                json!({"metadata": {"name": format!("c{i}")}}),
            )
            .expect("create");
        }
        let missed = s.history_after(&cm, rv).expect("in the history");
        assert_eq!(missed.len(), 5);
        let line = missed[0].line("ADDED");
        assert!(line.starts_with(b"{\"type\":\"ADDED\",\"object\":{"));
        assert!(line.ends_with(b"}\n"));
        let v: Value = serde_json::from_slice(&line).expect("json");
        assert_eq!(v["object"]["metadata"]["name"], "c0");
        // Shared: the same bytes, not a second rendering.
        assert_eq!(line.as_ptr(), missed[0].line("ADDED").as_ptr());
        assert!(missed[0]
            .line("DELETED")
            .starts_with(b"{\"type\":\"DELETED\""));
        let obj: Value = serde_json::from_slice(&missed[0].object_json()).expect("object json");
        assert_eq!(obj, *missed[0].object);
        for i in 5..20 {
            s.create(
                &cm,
                Some("default"),
                json!({"metadata": {"name": format!("c{i}")}}),
            )
            .expect("create");
        }
        assert!(s.history_after(&cm, rv).is_none(), "compacted away");
    }

    #[test]
    fn missing_namespace_is_not_found() {
        let s = Store::new(100);
        let cm = s.resource("", "v1", "configmaps").expect("configmaps");
        let e = s
            .create(&cm, Some("nope"), json!({"metadata": {"name": "a"}}))
            .expect_err("no ns");
        assert_eq!(e.code(), 404);
    }
}
