//! NetworkPolicies in OVN: each policy's allows as ACLs on its namespace's isolation port group, the pods
//! and peers it names as port groups and address sets shared by every policy naming the same selector.
//!
//! The sets' members are kept by [`NetpolState`] from the watches of pods, namespaces and nodes as they
//! happen: a pod's label or address change marks the few sets it enters or leaves, and one writer task
//! ([`Flusher`], a task on the framework) writes each marked set's exact members (the planner sends the difference as
//! mutations). No policy is translated again for it, except one whose named ports resolve differently.
//! A policy's run holds the sets it names, waits until the writer has created them, writes its ACLs, then
//! lets go of the sets it no longer names (deleted once nobody holds them).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerPort, Namespace, Node};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::NamespaceResourceScope;
use kube::runtime::events::EventType;
use kubeovn_ovn::northbound::{
    AclDirection, AclParent, AclSet, AddressSet, Batch, Meter, MeterUnit, Op, PortGroup,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Notify};

use super::error::ControllerError;
use super::framework::{Action, Key, Kinds, Reconciler, Relations, SelectorIndex, Task, Watch};
use super::Ctx;
use crate::annotations::{self, DEFAULT_PROVIDER};
use crate::naming;
use crate::netpol::{
    self, namespace_acls, namespace_group, Direction, Families, Form, Logging, Members, Pods,
    Protocol, SetKey, Translation, OWNER_KEY, SELECTOR_KEY,
};

/// How long a policy's run waits for its sets to be written before it is retried.
const FLUSH_WAIT: Duration = Duration::from_secs(30);

/// A pod as policies see it: labels, addresses (annotations), named container ports.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct PolicyPod {
    /// Metadata (labels and Kube-OVN's address annotations kept).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The spec fields read.
    #[serde(default)]
    pub spec: PolicyPodSpec,
}

/// `spec` fields of [`PolicyPod`].
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyPodSpec {
    /// Containers (their ports).
    #[serde(default)]
    pub containers: Vec<PolicyContainer>,
    /// `spec.hostNetwork`: such pods are in no set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_network: Option<bool>,
}

/// A container's ports.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct PolicyContainer {
    /// Ports.
    #[serde(default)]
    pub ports: Vec<ContainerPort>,
}

impl kube::Resource for PolicyPod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Pod".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn api_version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "pods".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Keeps what policies read of a pod.
fn trim_pod(p: &mut PolicyPod) {
    let m = &mut p.metadata;
    m.owner_references = None;
    m.finalizers = None;
    if let Some(a) = m.annotations.as_mut() {
        a.retain(|k, _| k == annotations::IP_ADDRESS || k == annotations::ALLOCATED);
    }
    for c in &mut p.spec.containers {
        c.ports.retain(|p| p.name.is_some());
    }
}

/// What a pod contributes to sets.
#[derive(Clone, Debug, Default, PartialEq)]
struct Facts {
    labels: BTreeMap<String, String>,
    ips: Vec<IpAddr>,
    /// Its switch port, once it has one.
    port: Option<String>,
    named: Vec<(Protocol, String, u16)>,
}

fn facts(p: &PolicyPod) -> Option<Facts> {
    if p.spec.host_network == Some(true) {
        return None;
    }
    let m = &p.metadata;
    let (ns, name) = (m.namespace.as_deref()?, m.name.as_deref()?);
    let anns = m.annotations.as_ref();
    let allocated = anns
        .and_then(|a| a.get(annotations::ALLOCATED))
        .is_some_and(|v| v == "true");
    let ips = if allocated {
        anns.and_then(|a| a.get(annotations::IP_ADDRESS))
            .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let named = p
        .spec
        .containers
        .iter()
        .flat_map(|c| &c.ports)
        .filter_map(|cp| {
            let proto = Protocol::parse(cp.protocol.as_deref().unwrap_or("TCP"))?;
            Some((
                proto,
                cp.name.clone()?,
                u16::try_from(cp.container_port).ok()?,
            ))
        })
        .collect();
    Some(Facts {
        labels: m.labels.clone().unwrap_or_default(),
        ips,
        port: allocated.then(|| naming::pod_port(name, ns, DEFAULT_PROVIDER)),
        named,
    })
}

/// One policy's hold on the sets and the isolation it asks.
#[derive(Debug, Default)]
struct Owner {
    namespace: Option<String>,
    /// Every set it holds (what its ACLs name now, and what they are about to name).
    held: BTreeSet<SetKey>,
    /// What its ACLs name once written.
    next: BTreeSet<SetKey>,
    isolates: Vec<(Direction, Pods)>,
    /// The isolation in force: its subjects are in the namespace's group under the drop. An isolation
    /// joins only once the policy's allows are written, and leaves before they go, so that a policy's
    /// pods are never dropped by it without its allows.
    enforced: Vec<(Direction, Pods)>,
    named: BTreeSet<(Pods, Protocol, String)>,
    logging: Logging,
    problems: Vec<String>,
    /// The port group its ACLs hang on (admin policies).
    parent: Option<String>,
}

/// The pods of a namespace isolated in one direction.
type Group = (String, Direction);

#[derive(Default)]
struct Inner {
    pods: HashMap<String, HashMap<String, Facts>>,
    namespaces: HashMap<String, BTreeMap<String, String>>,
    nodes: HashMap<String, (BTreeMap<String, String>, Vec<IpAddr>)>,
    holders: HashMap<SetKey, usize>,
    /// Sets of the pods of one namespace, by namespace.
    in_ns: HashMap<String, HashSet<SetKey>>,
    /// Sets across namespaces, by namespace selector.
    across: SelectorIndex<SetKey>,
    node_sets: HashSet<SetKey>,
    owners: HashMap<String, Owner>,
    dirty_sets: HashSet<SetKey>,
    dirty_groups: HashSet<Group>,
    /// NetworkPolicies refused (they hold nothing, but are known).
    refused: HashSet<String>,
    /// Groups left unwritten by [`NetpolState::take`] until their namespace's policies are known.
    deferred: HashSet<Group>,
    /// Every NetworkPolicy the store listed was known here once: NB no longer holds isolation of policies
    /// this controller has not seen, so nothing is deferred any more.
    loaded: bool,
    /// Bumped by every mark.
    generation: u64,
}

/// The sets policies name and their members, kept from the watches (see the module doc).
pub struct NetpolState {
    inner: Mutex<Inner>,
    /// One run of the admin policies at a time (they are translated together).
    admin: tokio::sync::Mutex<()>,
    wake: Notify,
    flushed: watch::Sender<u64>,
    families: Families,
    pub(crate) node_cidrs: Vec<String>,
    /// The admin policies a pod's or namespace's change concerns, found by the NetworkPolicy kind's
    /// relation (it feeds the membership) and taken by the admin kinds' relations, which run after it.
    admin_touched: Mutex<Vec<String>>,
}

impl std::fmt::Debug for NetpolState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetpolState").finish_non_exhaustive()
    }
}

fn owner_of(np: &Key<NetworkPolicy>) -> String {
    format!(
        "NetworkPolicy/{}/{}",
        np.namespace().unwrap_or_default(),
        np.name()
    )
}

fn np_key(owner: &str) -> Option<Key<NetworkPolicy>> {
    let rest = owner.strip_prefix("NetworkPolicy/")?;
    let (ns, name) = rest.split_once('/')?;
    Some(Key::namespaced(ns, name))
}

impl Inner {
    fn mark_set(&mut self, s: &SetKey) {
        self.dirty_sets.insert(s.clone());
        self.generation += 1;
    }
    fn mark_group(&mut self, g: Group) {
        self.dirty_groups.insert(g);
        self.generation += 1;
    }

    /// Marks again the groups of `ns` left unwritten (one of its policies became known).
    fn undefer(&mut self, ns: &str) {
        let back: Vec<Group> = self
            .deferred
            .iter()
            .filter(|(n, _)| n == ns)
            .cloned()
            .collect();
        for x in back {
            self.deferred.remove(&x);
            self.mark_group(x);
        }
    }

    fn hold(&mut self, s: &SetKey) {
        let n = self.holders.entry(s.clone()).or_insert(0);
        *n += 1;
        if *n == 1 {
            match &s.members {
                Members::Pods(Pods::In { namespace, .. }) => {
                    self.in_ns
                        .entry(namespace.clone())
                        .or_default()
                        .insert(s.clone());
                }
                Members::Pods(Pods::Across { namespaces, .. }) => {
                    self.across.set(s.clone(), vec![namespaces.clone()]);
                }
                Members::Nodes(_) => {
                    self.node_sets.insert(s.clone());
                }
            }
            self.mark_set(s);
        }
    }

    fn release(&mut self, s: &SetKey) {
        let Some(n) = self.holders.get_mut(s) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            self.holders.remove(s);
            match &s.members {
                Members::Pods(Pods::In { namespace, .. }) => {
                    if let Some(v) = self.in_ns.get_mut(namespace) {
                        v.remove(s);
                        if v.is_empty() {
                            self.in_ns.remove(namespace);
                        }
                    }
                }
                Members::Pods(Pods::Across { .. }) => self.across.remove(s),
                Members::Nodes(_) => {
                    self.node_sets.remove(s);
                }
            }
            self.mark_set(s);
        }
    }

    /// Whether a pod (`f`) of `ns` belongs to set `s`.
    fn pod_in(&self, s: &SetKey, ns: &str, f: &Facts) -> bool {
        let Members::Pods(p) = &s.members else {
            return false;
        };
        let empty = BTreeMap::new();
        let nsl = self.namespaces.get(ns).unwrap_or(&empty);
        p.matches(ns, nsl, &f.labels)
            && s.port.as_ref().is_none_or(|np| {
                f.named
                    .iter()
                    .any(|(pr, n, num)| *pr == np.protocol && *n == np.name && *num == np.number)
            })
    }

    /// The pods of `p`, by namespace.
    fn pods_of<'a>(&'a self, p: &'a Pods) -> Vec<(&'a str, &'a str, &'a Facts)> {
        let empty = BTreeMap::new();
        let mut out = Vec::new();
        let mut add =
            |ns: &'a str, pods: &'a HashMap<String, Facts>, sel: &crate::selector::Selector| {
                for (name, f) in pods {
                    if sel.matches(&f.labels) {
                        out.push((ns, name.as_str(), f));
                    }
                }
            };
        match p {
            Pods::In { namespace, pods } => {
                if let Some((ns, ps)) = self.pods.get_key_value(namespace) {
                    add(ns, ps, pods);
                }
            }
            Pods::Across { namespaces, pods } => {
                for (ns, ps) in &self.pods {
                    if namespaces.matches(self.namespaces.get(ns).unwrap_or(&empty)) {
                        add(ns, ps, pods);
                    }
                }
            }
        }
        out
    }

    /// The switch ports (port groups) or addresses (address sets) of set `s`.
    fn members(&self, s: &SetKey) -> (Vec<String>, Vec<IpAddr>) {
        let mut ports = Vec::new();
        let mut ips = Vec::new();
        match &s.members {
            Members::Pods(p) => {
                for (_, _, f) in self.pods_of(p) {
                    let ok = s.port.as_ref().is_none_or(|np| {
                        f.named.iter().any(|(pr, n, num)| {
                            *pr == np.protocol && *n == np.name && *num == np.number
                        })
                    });
                    if !ok {
                        continue;
                    }
                    match s.form {
                        Form::PortGroup => ports.extend(f.port.clone()),
                        Form::AddressSet => ips.extend(f.ips.iter().copied()),
                    }
                }
            }
            Members::Nodes(sel) => {
                for (labels, addrs) in self.nodes.values() {
                    if sel.matches(labels) {
                        ips.extend(addrs.iter().copied());
                    }
                }
            }
        }
        ports.sort();
        ports.dedup();
        ips.sort();
        ips.dedup();
        (ports, ips)
    }

    /// The subjects of the isolation in force for pods of `ns` in `dir`.
    fn isolating(&self, ns: &str, dir: Direction) -> Vec<&Pods> {
        self.owners
            .values()
            .filter(|o| o.namespace.as_deref() == Some(ns))
            .flat_map(|o| o.enforced.iter())
            .filter(|(d, _)| *d == dir)
            .map(|(_, p)| p)
            .collect()
    }

    /// Whether any policy of `ns` isolates, or is about to isolate, pods in `dir` (its group must exist to
    /// hold the policies' ACLs).
    fn group_wanted(&self, ns: &str, dir: Direction) -> bool {
        self.owners
            .values()
            .filter(|o| o.namespace.as_deref() == Some(ns))
            .flat_map(|o| o.isolates.iter().chain(&o.enforced))
            .any(|(d, _)| *d == dir)
    }

    /// Marks what a pod's change touches; returns the policies whose named ports it may change.
    fn pod_changed(&mut self, ns: &str, name: &str, new: Option<Facts>) -> Vec<String> {
        let old = self.pods.get(ns).and_then(|m| m.get(name)).cloned();
        if old == new {
            return Vec::new();
        }
        match &new {
            Some(f) => {
                self.pods
                    .entry(ns.to_owned())
                    .or_default()
                    .insert(name.to_owned(), f.clone());
            }
            None => {
                if let Some(m) = self.pods.get_mut(ns) {
                    m.remove(name);
                    if m.is_empty() {
                        self.pods.remove(ns);
                    }
                }
            }
        }
        let nsl = self.namespaces.get(ns).cloned().unwrap_or_default();
        let mut candidates: Vec<SetKey> = self
            .in_ns
            .get(ns)
            .map(|v| v.iter().cloned().collect())
            .unwrap_or_default();
        candidates.extend(self.across.matching(&nsl));
        let either = |s: &SetKey, me: &Inner| {
            old.as_ref().is_some_and(|f| me.pod_in(s, ns, f))
                || new.as_ref().is_some_and(|f| me.pod_in(s, ns, f))
        };
        for s in candidates {
            if either(&s, self) {
                self.mark_set(&s);
            }
        }
        for dir in [Direction::Ingress, Direction::Egress] {
            let hit = self.isolating(ns, dir).iter().any(|p| {
                old.as_ref().is_some_and(|f| p.matches(ns, &nsl, &f.labels))
                    || new.as_ref().is_some_and(|f| p.matches(ns, &nsl, &f.labels))
            });
            if hit {
                self.mark_group((ns.to_owned(), dir));
            }
        }
        // Named ports resolve per pod: a policy naming ports of pods this one is (or was) among runs again
        // if the numbers or the membership changed.
        let ports_of = |f: &Option<Facts>| f.as_ref().map(|f| f.named.clone());
        let moved = old.as_ref().map(|f| &f.labels) != new.as_ref().map(|f| &f.labels)
            || ports_of(&old) != ports_of(&new);
        if !moved {
            return Vec::new();
        }
        self.owners
            .iter()
            .filter(|(_, o)| {
                o.named.iter().any(|(p, _, _)| {
                    old.as_ref().is_some_and(|f| p.matches(ns, &nsl, &f.labels))
                        || new.as_ref().is_some_and(|f| p.matches(ns, &nsl, &f.labels))
                })
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Marks what a namespace's label change touches; returns the policies naming ports across it.
    fn namespace_changed(
        &mut self,
        ns: &str,
        labels: Option<BTreeMap<String, String>>,
    ) -> Vec<String> {
        let old = self.namespaces.get(ns).cloned();
        if old == labels {
            return Vec::new();
        }
        match &labels {
            Some(l) => {
                self.namespaces.insert(ns.to_owned(), l.clone());
            }
            None => {
                self.namespaces.remove(ns);
            }
        }
        if !self.pods.contains_key(ns) {
            return Vec::new();
        }
        for s in self.across.matching_either(old.as_ref(), labels.as_ref()) {
            self.mark_set(&s);
        }
        self.owners
            .iter()
            .filter(|(_, o)| {
                o.named
                    .iter()
                    .any(|(p, _, _)| matches!(p, Pods::Across { .. }))
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn node_changed(&mut self, name: &str, new: Option<(BTreeMap<String, String>, Vec<IpAddr>)>) {
        let old = self.nodes.get(name).cloned();
        if old == new {
            return;
        }
        match new {
            Some(n) => {
                self.nodes.insert(name.to_owned(), n);
            }
            None => {
                self.nodes.remove(name);
            }
        }
        let sets: Vec<SetKey> = self.node_sets.iter().cloned().collect();
        for s in sets {
            self.mark_set(&s);
        }
    }
}

fn ns_labels(n: &Namespace) -> BTreeMap<String, String> {
    let mut l = n.metadata.labels.clone().unwrap_or_default();
    // As kube-apiserver guarantees; the watch may show a namespace created without it.
    if let Some(name) = &n.metadata.name {
        l.entry("kubernetes.io/metadata.name".to_owned())
            .or_insert_with(|| name.clone());
    }
    l
}

fn node_facts(n: &Node) -> (BTreeMap<String, String>, Vec<IpAddr>) {
    let ips = n
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| {
            a.iter()
                .filter(|a| a.type_ == "InternalIP")
                .filter_map(|a| a.address.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    (n.metadata.labels.clone().unwrap_or_default(), ips)
}

impl NetpolState {
    /// Empty state for a cluster of `families` whose nodes reach pods from `node_cidrs`.
    pub fn new(families: Families, node_cidrs: Vec<String>) -> Self {
        NetpolState {
            inner: Mutex::new(Inner::default()),
            admin: tokio::sync::Mutex::new(()),
            wake: Notify::new(),
            flushed: watch::channel(0).0,
            families,
            node_cidrs,
            admin_touched: Mutex::default(),
        }
    }

    /// The owners among `owners` that are admin policies, kept for the admin kinds' relations; the
    /// NetworkPolicy keys among them.
    fn split_owners(&self, owners: Vec<String>) -> Vec<Key<NetworkPolicy>> {
        let admin: Vec<String> = owners
            .iter()
            .filter(|o| {
                o.starts_with("AdminNetworkPolicy/") || o.starts_with("BaselineAdminNetworkPolicy/")
            })
            .cloned()
            .collect();
        if !admin.is_empty() {
            self.admin_touched
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(admin);
        }
        owners.iter().filter_map(|o| np_key(o)).collect()
    }

    /// Takes the admin owners of kind `prefix` (`AdminNetworkPolicy/`) the last changes concerned.
    fn take_admin(&self, prefix: &str) -> Vec<String> {
        let mut t = self.admin_touched.lock().unwrap_or_else(|e| e.into_inner());
        let (mine, rest): (Vec<String>, Vec<String>) =
            t.drain(..).partition(|o| o.starts_with(prefix));
        *t = rest;
        mine
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the writer if something was marked since `before`.
    fn wake_if(&self, before: u64, after: u64) {
        if after != before {
            self.wake.notify_one();
        }
    }

    fn pod_event(&self, old: Option<&PolicyPod>, new: Option<&PolicyPod>) -> Vec<String> {
        let Some(m) = new.or(old).map(|p| &p.metadata) else {
            return Vec::new();
        };
        let (Some(ns), Some(name)) = (m.namespace.as_deref(), m.name.as_deref()) else {
            return Vec::new();
        };
        let f = new.and_then(facts);
        let mut g = self.lock();
        let before = g.generation;
        let rerun = g.pod_changed(ns, name, f);
        let after = g.generation;
        drop(g);
        self.wake_if(before, after);
        rerun
    }

    fn namespace_event(&self, old: Option<&Namespace>, new: Option<&Namespace>) -> Vec<String> {
        let Some(name) = new.or(old).and_then(|n| n.metadata.name.clone()) else {
            return Vec::new();
        };
        let mut g = self.lock();
        let before = g.generation;
        let rerun = g.namespace_changed(&name, new.map(ns_labels));
        let after = g.generation;
        drop(g);
        self.wake_if(before, after);
        rerun
    }

    fn node_event(&self, old: Option<&Node>, new: Option<&Node>) {
        let Some(name) = new.or(old).and_then(|n| n.metadata.name.clone()) else {
            return;
        };
        let mut g = self.lock();
        let before = g.generation;
        g.node_changed(&name, new.map(node_facts));
        let after = g.generation;
        drop(g);
        self.wake_if(before, after);
    }

    /// The numbers a named port resolves to among `pods`.
    fn numbers(&self, pods: &Pods, protocol: Protocol, name: &str) -> BTreeSet<u16> {
        let g = self.lock();
        g.pods_of(pods)
            .into_iter()
            .flat_map(|(_, _, f)| f.named.iter())
            .filter(|(p, n, _)| *p == protocol && n == name)
            .map(|(_, _, num)| *num)
            .collect()
    }

    /// Holds the sets of `t` for `owner` (of namespace `ns`) and records its isolation; returns the
    /// generation to wait for.
    /// `written`: its ACLs are in NB as `t` has them, so its isolation can be in force at once (a restart,
    /// or a change of subjects alone).
    fn hold(&self, owner: &str, ns: Option<&str>, t: &Translation, written: bool) -> u64 {
        let mut g = self.lock();
        let before = g.generation;
        g.refused.remove(owner);
        if let Some(ns) = ns {
            g.undefer(ns);
        }
        let mut o = g.owners.remove(owner).unwrap_or_default();
        for s in &t.sets {
            if !o.held.contains(s) {
                g.hold(s);
                o.held.insert(s.clone());
            }
        }
        o.next = t.sets.clone();
        o.named = t.named.clone();
        if let Some(ns) = ns {
            let changed = o.isolates != t.isolates || o.logging != t.logging;
            if changed {
                for (d, _) in o.isolates.iter().chain(&t.isolates) {
                    g.mark_group((ns.to_owned(), *d));
                }
            }
            // An isolation the policy no longer asks leaves before its allows change; a new one joins in
            // `settle`, after them.
            if written {
                o.enforced = t.isolates.clone();
            } else {
                o.enforced.retain(|e| t.isolates.contains(e));
            }
        }
        o.namespace = ns.map(str::to_owned);
        o.parent = t.parent.as_ref().map(SetKey::name);
        o.isolates = t.isolates.clone();
        o.logging = t.logging;
        g.owners.insert(owner.to_owned(), o);
        let after = g.generation;
        drop(g);
        self.wake_if(before, after);
        after
    }

    /// Lets go of the sets `owner`'s ACLs no longer name and puts its isolation in force (its ACLs are
    /// written); returns the generation to wait for.
    fn settle(&self, owner: &str) -> u64 {
        let mut g = self.lock();
        let before = g.generation;
        let Some(mut o) = g.owners.remove(owner) else {
            return before;
        };
        let gone: Vec<SetKey> = o.held.difference(&o.next).cloned().collect();
        for s in &gone {
            g.release(s);
            o.held.remove(s);
        }
        if o.enforced != o.isolates {
            if let Some(ns) = &o.namespace {
                for (d, _) in &o.isolates {
                    g.mark_group((ns.clone(), *d));
                }
            }
            o.enforced = o.isolates.clone();
        }
        g.owners.insert(owner.to_owned(), o);
        let after = g.generation;
        drop(g);
        self.wake_if(before, after);
        after
    }

    /// Takes `owner`'s isolation out of force, before its ACLs are removed; returns the generation to wait
    /// for.
    fn withdraw(&self, owner: &str) -> u64 {
        let mut g = self.lock();
        let before = g.generation;
        if let Some(mut o) = g.owners.remove(owner) {
            if let Some(ns) = &o.namespace {
                for (d, _) in o.isolates.iter().chain(&o.enforced) {
                    g.mark_group((ns.clone(), *d));
                }
            }
            o.isolates.clear();
            o.enforced.clear();
            g.owners.insert(owner.to_owned(), o);
        }
        let after = g.generation;
        drop(g);
        self.wake_if(before, after);
        after
    }

    /// Forgets `owner` (its ACLs are gone).
    fn forget(&self, owner: &str) {
        let mut g = self.lock();
        let before = g.generation;
        if let Some(o) = g.owners.remove(owner) {
            for s in &o.held {
                g.release(s);
            }
            if let Some(ns) = &o.namespace {
                for (d, _) in &o.isolates {
                    g.mark_group((ns.clone(), *d));
                }
            }
        }
        let after = g.generation;
        drop(g);
        self.wake_if(before, after);
    }

    /// The port group `owner`'s ACLs hang on now.
    fn parent_of(&self, owner: &str) -> Option<String> {
        self.lock().owners.get(owner).and_then(|o| o.parent.clone())
    }

    /// The admin policies' owners known.
    fn admin_owners(&self) -> Vec<String> {
        self.lock()
            .owners
            .keys()
            .filter(|o| {
                o.starts_with("AdminNetworkPolicy/") || o.starts_with("BaselineAdminNetworkPolicy/")
            })
            .cloned()
            .collect()
    }

    /// The problems last reported for `owner`, replaced by `now`.
    fn swap_problems(&self, owner: &str, now: Vec<String>) -> Vec<String> {
        let mut g = self.lock();
        g.owners
            .get_mut(owner)
            .map(|o| std::mem::replace(&mut o.problems, now))
            .unwrap_or_default()
    }

    /// Waits until the writer has written everything marked up to `generation`.
    async fn flushed(&self, generation: u64) -> Result<(), ControllerError> {
        let mut rx = self.flushed.subscribe();
        let waited = tokio::time::timeout(FLUSH_WAIT, rx.wait_for(|g| *g >= generation)).await;
        match waited {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(ControllerError::Stopped),
            Err(_) => Err(ControllerError::NotReady(
                "network policy sets not written yet".into(),
            )),
        }
    }

    /// The batch writing everything marked, and the generation it covers; what it took is unmarked.
    /// `policies` lists the owners of every NetworkPolicy known to the store, and `exists` tells the port
    /// groups in NB: a namespace group that exists is not written while a policy of its namespace is not
    /// yet known here (just after a restart), as it would lose that policy's pods and drop for a moment.
    /// The policy's own run marks the group again.
    fn take(
        &self,
        policies: &dyn Fn() -> Vec<String>,
        exists: &dyn Fn(&str) -> bool,
    ) -> (Batch, u64, Vec<SetKey>, Vec<Group>) {
        let mut g = self.lock();
        let sets: Vec<SetKey> = g.dirty_sets.drain().collect();
        let mut groups: Vec<Group> = g.dirty_groups.drain().collect();
        if !groups.is_empty() && !g.loaded {
            let unknown: HashSet<String> = policies()
                .into_iter()
                .filter(|o| !g.owners.contains_key(o) && !g.refused.contains(o))
                .filter_map(|o| np_key(&o).and_then(|k| k.namespace().map(str::to_owned)))
                .collect();
            let (now, later): (Vec<Group>, Vec<Group>) =
                groups.into_iter().partition(|(ns, dir)| {
                    !unknown.contains(ns) || !exists(&namespace_group(ns, *dir))
                });
            groups = now;
            g.loaded = unknown.is_empty();
            g.deferred.extend(later);
        }
        let generation = g.generation;
        let mut b = Batch::new();
        for s in &sets {
            let name = s.name();
            let alive = g.holders.contains_key(s);
            match (s.form, alive) {
                (Form::PortGroup, true) => {
                    let (ports, _) = g.members(s);
                    b.add(
                        PortGroup::new(&name)
                            .ports(ports)
                            .external_id("vendor", "kube-ovn")
                            .external_id(SELECTOR_KEY, s.text()),
                    );
                }
                (Form::PortGroup, false) => {
                    b.add(Op::DeletePortGroup(name));
                }
                (Form::AddressSet, alive) => {
                    let (_, ips) = if alive {
                        g.members(s)
                    } else {
                        Default::default()
                    };
                    for v6 in self.family_list() {
                        let n = s.family(v6);
                        if alive {
                            let addrs = ips
                                .iter()
                                .filter(|ip| ip.is_ipv6() == v6)
                                .map(IpAddr::to_string);
                            b.add(
                                AddressSet::new(&n, addrs)
                                    .external_id("vendor", "kube-ovn")
                                    .external_id(SELECTOR_KEY, s.text()),
                            );
                        } else {
                            b.add(Op::DeleteAddressSet(n));
                        }
                    }
                }
            }
        }
        for (ns, dir) in &groups {
            let name = namespace_group(ns, *dir);
            if !g.group_wanted(ns, *dir) {
                b.add(Op::DeletePortGroup(name));
                continue;
            }
            let subjects = g.isolating(ns, *dir);
            let empty = BTreeMap::new();
            let nsl = g.namespaces.get(ns).unwrap_or(&empty);
            let mut ports: Vec<String> = g
                .pods
                .get(ns)
                .map(|m| {
                    m.values()
                        .filter(|f| subjects.iter().any(|p| p.matches(ns, nsl, &f.labels)))
                        .filter_map(|f| f.port.clone())
                        .collect()
                })
                .unwrap_or_default();
            ports.sort();
            let logging = g
                .owners
                .values()
                .filter(|o| o.namespace.as_deref() == Some(ns.as_str()))
                .fold(Logging::default(), |a, o| Logging {
                    allow: a.allow || o.logging.allow,
                    drop: a.drop || o.logging.drop,
                    rate: a.rate.max(o.logging.rate),
                });
            let owner = format!("Namespace/{ns}");
            b.add(
                PortGroup::new(&name)
                    .ports(ports)
                    .external_id("vendor", "kube-ovn")
                    .external_id(OWNER_KEY, owner.as_str()),
            );
            let meter = logging.rate.map(|r| {
                let m = meter_name(&owner);
                b.add(Meter::new(&m, MeterUnit::Pktps, r, 0));
                m
            });
            // No drop until an isolation is in force (the group may exist only to hold new allows).
            let acls = if subjects.is_empty() {
                Vec::new()
            } else {
                namespace_acls(ns, *dir, &self.node_cidrs, logging.drop)
                    .iter()
                    .map(|a| super::plan::ovn_acl(a, &name, &owner, meter.as_deref()))
                    .collect()
            };
            b.add(AclSet::new(
                AclParent::PortGroup(name.clone()),
                OWNER_KEY,
                owner,
                acls,
            ));
        }
        (b, generation, sets, groups)
    }

    fn family_list(&self) -> Vec<bool> {
        match self.families {
            Families::V4 => vec![false],
            Families::V6 => vec![true],
            Families::Dual => vec![false, true],
        }
    }

    /// Marks again what a failed write took.
    fn retake(&self, sets: Vec<SetKey>, groups: Vec<Group>) {
        let mut g = self.lock();
        for s in sets {
            g.mark_set(&s);
        }
        for x in groups {
            g.mark_group(x);
        }
    }
}

/// The meter limiting `owner`'s log lines.
fn meter_name(owner: &str) -> String {
    format!(
        "acl_log_{}",
        SetKey::addresses(Pods::In {
            namespace: owner.to_owned(),
            pods: Default::default(),
        })
        .name()
        .trim_start_matches("as_")
    )
}

/// Writes the marked sets and namespace groups, one batch at a time: a task on the framework, each run
/// waiting for the next mark.
pub(crate) struct Flusher {
    st: Arc<NetpolState>,
}

impl Flusher {
    /// The flusher of `st`.
    pub fn new(st: Arc<NetpolState>) -> Self {
        Flusher { st }
    }
}

#[async_trait::async_trait]
impl Task<Ctx> for Flusher {
    type Error = ControllerError;
    const NAME: &'static str = "netpol-flusher";

    async fn run(&self, ctx: &Arc<Ctx>) -> Result<Action, ControllerError> {
        let st = &self.st;
        st.wake.notified().await;
        let policies = || {
            ctx.kinds
                .list::<NetworkPolicy>()
                .iter()
                .map(|np| owner_of(&Key::of(np.as_ref())))
                .collect()
        };
        let exists = |g: &str| ctx.nb.port_group(g).is_some();
        let (b, generation, sets, groups) = st.take(&policies, &exists);
        if b.is_empty() {
            st.flushed.send_replace(generation);
            return Ok(Action::Requeue(Duration::ZERO));
        }
        match ctx.writer.commit(b).await {
            Ok(()) => {
                st.flushed.send_replace(generation);
                Ok(Action::Requeue(Duration::ZERO))
            }
            Err(e) => {
                // Marked again and retried (the queue's backoff) with whatever came meanwhile.
                st.retake(sets, groups);
                st.wake.notify_one();
                Err(e)
            }
        }
    }
}

/// The NetworkPolicy kind. Its state, the sets policies name and their members, is shared with the admin
/// kinds and the flusher (one feature, one state).
pub(crate) struct NetworkPolicies {
    st: Arc<NetpolState>,
}

impl NetworkPolicies {
    /// The kind over `st`.
    pub fn new(st: Arc<NetpolState>) -> Self {
        NetworkPolicies { st }
    }
}

/// The families of the cluster's pods, from the default subnet's CIDR.
pub(crate) fn families(cidr: &str) -> Families {
    let v4 = cidr.split(',').any(|c| c.contains('.'));
    let v6 = cidr.split(',').any(|c| c.contains(':'));
    match (v4, v6) {
        (true, true) => Families::Dual,
        (false, true) => Families::V6,
        _ => Families::V4,
    }
}

/// Writes `owner`'s ACLs on its namespace's groups (`acls` empty: removes them).
async fn write_acls(
    ctx: &Ctx,
    owner: &str,
    ns: &str,
    t: Option<&Translation>,
) -> Result<(), ControllerError> {
    let mut b = Batch::new();
    let meter = t.and_then(|t| t.logging.rate).map(|r| {
        let m = meter_name(owner);
        b.add(Meter::new(&m, MeterUnit::Pktps, r, 0));
        m
    });
    for dir in [Direction::Ingress, Direction::Egress] {
        let group = namespace_group(ns, dir);
        let isolates = t.is_some_and(|t| t.isolates.iter().any(|(d, _)| *d == dir));
        if !isolates && ctx.nb.port_group(&group).is_none() {
            continue;
        }
        let acls = t
            .filter(|_| isolates)
            .map(|t| {
                t.acls
                    .iter()
                    .filter(|a| a.direction == dir)
                    .map(|a| super::plan::ovn_acl(a, &group, owner, meter.as_deref()))
                    .collect()
            })
            .unwrap_or_default();
        b.add(AclSet::new(
            AclParent::PortGroup(group),
            OWNER_KEY,
            owner,
            acls,
        ));
    }
    if meter.is_none() && ctx.nb.meter(&meter_name(owner)).is_some() {
        b.delete_meter(meter_name(owner));
    }
    ctx.writer.commit(b).await
}

/// Whether `owner`'s ACLs in NB are those of `t` (the same direction, priority and match each).
fn acls_written(ctx: &Ctx, owner: &str, ns: &str, t: &Translation) -> bool {
    [Direction::Ingress, Direction::Egress]
        .into_iter()
        .all(|dir| {
            let group = namespace_group(ns, dir);
            let key = |d: &AclDirection, p: i64, m: &str| (d.as_str().to_owned(), p, m.to_owned());
            let mut want: Vec<_> = t
                .acls
                .iter()
                .filter(|a| a.direction == dir)
                .map(|a| super::plan::ovn_acl(a, &group, owner, None))
                .map(|a| key(&a.direction, a.priority, &a.match_))
                .collect();
            let mut have: Vec<_> = ctx
                .nb
                .acls(&AclParent::PortGroup(group))
                .iter()
                .filter(|a| a.external_ids.get(OWNER_KEY).map(String::as_str) == Some(owner))
                .map(|a| key(&a.direction, a.priority, &a.match_))
                .collect();
            want.sort();
            have.sort();
            want == have
        })
}

/// Removes `owner`'s ACLs: its isolation first, so that its pods are never left dropped without its allows.
/// `refused`: the policy stays, refused (else it was deleted).
async fn remove(
    ctx: &Ctx,
    st: &NetpolState,
    owner: &str,
    ns: &str,
    refused: bool,
) -> Result<(), ControllerError> {
    st.flushed(st.withdraw(owner)).await?;
    write_acls(ctx, owner, ns, None).await?;
    st.forget(owner);
    let mut g = st.lock();
    if refused {
        g.refused.insert(owner.to_owned());
    } else {
        g.refused.remove(owner);
    }
    let before = g.generation;
    g.undefer(ns);
    let after = g.generation;
    drop(g);
    st.wake_if(before, after);
    Ok(())
}

#[async_trait::async_trait]
impl Reconciler<Ctx> for NetworkPolicies {
    type Object = NetworkPolicy;
    type Error = ControllerError;
    const NAME: &'static str = "networkpolicy";

    fn workers(&self, ctx: &Ctx) -> usize {
        ctx.config.pod_workers
    }

    async fn reconcile(
        &self,
        ctx: &Arc<Ctx>,
        np: Arc<NetworkPolicy>,
    ) -> Result<Action, ControllerError> {
        let key = Key::of(np.as_ref());
        let owner = owner_of(&key);
        let ns = key.namespace().unwrap_or_default().to_owned();
        let st = &*self.st;
        let t = match netpol::network_policy(&np, st.families, &|p: &Pods, pr, n: &str| {
            st.numbers(p, pr, n)
        }) {
            Ok(t) => t,
            Err(e) => {
                ctx.event(
                    np.as_ref(),
                    EventType::Warning,
                    "InvalidNetworkPolicy",
                    e.to_string(),
                )
                .await;
                // Not enforced at all is what Kubernetes would do with a policy it refused.
                remove(ctx, st, &owner, &ns, true).await?;
                return Ok(Action::Done);
            }
        };
        let generation = st.hold(&owner, Some(&ns), &t, acls_written(ctx, &owner, &ns, &t));
        st.flushed(generation).await?;
        write_acls(ctx, &owner, &ns, Some(&t)).await?;
        // Its isolation joins with the next flush; nothing waits for it.
        st.settle(&owner);
        let before = st.swap_problems(&owner, t.problems.clone());
        for p in &t.problems {
            if !before.contains(p) {
                ctx.event(
                    np.as_ref(),
                    EventType::Warning,
                    "NetworkPolicyPartlyApplied",
                    p.clone(),
                )
                .await;
            }
        }
        Ok(Action::Done)
    }

    async fn cleanup(
        &self,
        ctx: &Arc<Ctx>,
        key: &Key<NetworkPolicy>,
        _last: Option<Arc<NetworkPolicy>>,
    ) -> Result<Action, ControllerError> {
        remove(
            ctx,
            &self.st,
            &owner_of(key),
            key.namespace().unwrap_or_default(),
            false,
        )
        .await?;
        Ok(Action::Done)
    }

    fn relations(this: &Arc<Self>, r: &mut Relations<'_, Ctx, NetworkPolicy>) {
        // These relations feed the membership (the sets' members follow pods, namespaces and nodes) and
        // run the policies a change concerns; the admin policies among them are left for the admin kinds'
        // relations, which run after these (registered later).
        let st = this.st.clone();
        r.on::<PolicyPod>(move |_: &Kinds, old, new| st.split_owners(st.pod_event(old, new)));
        let st = this.st.clone();
        r.on::<Namespace>(move |_: &Kinds, old, new| st.split_owners(st.namespace_event(old, new)));
        let st = this.st.clone();
        r.on::<Node>(move |_: &Kinds, old, new| {
            st.node_event(old, new);
            Vec::new()
        });
    }
}

/// Translates every admin policy and writes each one's ACLs on its subject's port group (Passes make
/// them depend on each other: they are translated together, one run at a time).
async fn sync_admin(ctx: &Arc<Ctx>, st: &NetpolState) -> Result<Action, ControllerError> {
    use crate::crd::{AdminNetworkPolicy, BaselineAdminNetworkPolicy, BASELINE_NAME};
    let _one = st.admin.lock().await;
    let anps = ctx.kinds.list::<AdminNetworkPolicy>();
    let banp = ctx
        .kinds
        .get(&Key::<BaselineAdminNetworkPolicy>::cluster(BASELINE_NAME));
    let refs: Vec<&AdminNetworkPolicy> = anps.iter().map(|a| a.as_ref()).collect();
    let names = |p: &Pods, pr, n: &str| st.numbers(p, pr, n);
    let ts = netpol::admin_policies(&refs, banp.as_deref(), st.families, &names, &st.node_cidrs);
    let known: HashSet<&str> = ts.iter().map(|t| t.owner.as_str()).collect();
    let gone: Vec<String> = st
        .admin_owners()
        .into_iter()
        .filter(|o| !known.contains(o.as_str()))
        .collect();
    let before: HashMap<String, Option<String>> = ts
        .iter()
        .map(|t| t.owner.clone())
        .chain(gone.iter().cloned())
        .map(|o| {
            let p = st.parent_of(&o);
            (o, p)
        })
        .collect();
    let mut generation = 0;
    for t in &ts {
        generation = generation.max(st.hold(&t.owner, None, t, false));
    }
    st.flushed(generation).await?;
    let mut b = Batch::new();
    let clear = |b: &mut Batch, owner: &str, parent: &str| {
        if ctx.nb.port_group(parent).is_some() {
            b.add(AclSet::new(
                AclParent::PortGroup(parent.to_owned()),
                OWNER_KEY,
                owner,
                Vec::new(),
            ));
        }
    };
    for t in &ts {
        let now = t.parent.as_ref().map(SetKey::name);
        if let Some(Some(old)) = before.get(&t.owner) {
            if Some(old) != now.as_ref() {
                clear(&mut b, &t.owner, old);
            }
        }
        if let Some(parent) = now {
            let acls = t
                .acls
                .iter()
                .map(|a| super::plan::ovn_acl(a, &parent, &t.owner, None))
                .collect();
            b.add(AclSet::new(
                AclParent::PortGroup(parent),
                OWNER_KEY,
                t.owner.as_str(),
                acls,
            ));
        }
    }
    for o in &gone {
        if let Some(Some(old)) = before.get(o) {
            clear(&mut b, o, old);
        }
    }
    ctx.writer.commit(b).await?;
    for t in &ts {
        st.settle(&t.owner);
        let reported = st.swap_problems(&t.owner, t.problems.clone());
        let new: Vec<&String> = t
            .problems
            .iter()
            .filter(|p| !reported.contains(p))
            .collect();
        if new.is_empty() {
            continue;
        }
        let name = t.owner.split_once('/').map(|x| x.1).unwrap_or_default();
        for p in new {
            if t.owner.starts_with("Admin") {
                if let Some(a) = ctx.kinds.get(&Key::<AdminNetworkPolicy>::cluster(name)) {
                    ctx.event(
                        a.as_ref(),
                        EventType::Warning,
                        "AdminNetworkPolicyPartlyApplied",
                        p.clone(),
                    )
                    .await;
                }
            } else if let Some(a) = &banp {
                ctx.event(
                    a.as_ref(),
                    EventType::Warning,
                    "BaselineAdminNetworkPolicyPartlyApplied",
                    p.clone(),
                )
                .await;
            }
        }
    }
    for o in &gone {
        st.forget(o);
    }
    Ok(Action::Done)
}

/// An admin policy kind: both are translated together, so either one's change runs [`sync_admin`].
pub(crate) trait AdminKind: super::framework::Object {
    /// The kind's name in logs and metrics.
    const NAME: &'static str;
    /// The prefix of its owners (`AdminNetworkPolicy/`).
    const OWNER_PREFIX: &'static str;
}

impl AdminKind for crate::crd::AdminNetworkPolicy {
    const NAME: &'static str = "adminnetworkpolicy";
    const OWNER_PREFIX: &'static str = "AdminNetworkPolicy/";
}

impl AdminKind for crate::crd::BaselineAdminNetworkPolicy {
    const NAME: &'static str = "baselineadminnetworkpolicy";
    const OWNER_PREFIX: &'static str = "BaselineAdminNetworkPolicy/";
}

/// The AdminNetworkPolicy and BaselineAdminNetworkPolicy kinds (every run translates all admin policies, see
/// [`sync_admin`]).
pub(crate) struct AdminPolicies<K> {
    st: Arc<NetpolState>,
    kind: std::marker::PhantomData<fn() -> K>,
}

impl<K> AdminPolicies<K> {
    /// The kind over `st`.
    pub fn new(st: Arc<NetpolState>) -> Self {
        AdminPolicies {
            st,
            kind: std::marker::PhantomData,
        }
    }
}

#[async_trait::async_trait]
impl<K: AdminKind> Reconciler<Ctx> for AdminPolicies<K> {
    type Object = K;
    type Error = ControllerError;
    const NAME: &'static str = K::NAME;

    fn workers(&self, _: &Ctx) -> usize {
        1
    }

    async fn reconcile(&self, ctx: &Arc<Ctx>, _: Arc<K>) -> Result<Action, ControllerError> {
        sync_admin(ctx, &self.st).await
    }

    async fn cleanup(
        &self,
        ctx: &Arc<Ctx>,
        _: &Key<K>,
        _: Option<Arc<K>>,
    ) -> Result<Action, ControllerError> {
        sync_admin(ctx, &self.st).await
    }

    fn relations(this: &Arc<Self>, r: &mut Relations<'_, Ctx, K>) {
        // The admin policies the NetworkPolicy kind's relations found concerned (see there).
        fn keys<K>(st: &NetpolState, prefix: &str) -> Vec<Key<K>> {
            st.take_admin(prefix)
                .iter()
                .filter_map(|o| o.strip_prefix(prefix))
                .map(Key::cluster)
                .collect()
        }
        let st = this.st.clone();
        r.on::<PolicyPod>(move |_: &Kinds, _, _| keys(&st, K::OWNER_PREFIX));
        let st = this.st.clone();
        r.on::<Namespace>(move |_: &Kinds, _, _| keys(&st, K::OWNER_PREFIX));
    }
}

/// How pods are watched for policies.
pub(crate) fn pod_watch() -> Watch<PolicyPod> {
    Watch {
        labels: None,
        trim: trim_pod,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::testing::Harness;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
    use kubeovn_ovn::northbound::{Northbound, SwitchPort};
    use serde_json::json;

    async fn namespace(h: &Harness, name: &str, labels: serde_json::Value) {
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
                .expect("namespace");
        h.create_cluster(&ns).await;
    }

    /// A pod with an address, and its switch port.
    async fn pod(h: &Harness, ns: &str, name: &str, app: &str, ip: &str) {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "labels": {"app": app},
                "annotations": {"ovn.kubernetes.io/allocated": "true", "ovn.kubernetes.io/ip_address": ip}},
            "spec": {"containers": [{"name": "c", "image": "i",
                "ports": [{"name": "http", "containerPort": 8080}]}]}}))
        .expect("pod");
        Api::<Pod>::namespaced(h.client.clone(), ns)
            .create(&PostParams::default(), &p)
            .await
            .expect("create pod");
        let port = naming::pod_port(name, ns, DEFAULT_PROVIDER);
        SwitchPort::new("ovn-default", &port)
            .execute(h.nb.as_ref())
            .await
            .expect("port");
        let key = Key::<PolicyPod>::namespaced(ns, name);
        h.until("policy pod stored", || h.ctx.kinds.get(&key).is_some())
            .await;
    }

    fn addresses(h: &Harness, set: &str) -> Vec<String> {
        let mut a =
            h.nb.address_set(set)
                .map(|s| s.addresses)
                .unwrap_or_default();
        a.sort();
        a
    }

    /// The namespace group's ports and the drop in a flusher batch (None: the batch has no such group).
    fn group_in(b: &Batch, name: &str) -> Option<(Vec<String>, usize)> {
        let ports = b.ops.iter().find_map(|o| match o {
            Op::PortGroup(g) if g.name == name => Some(g.ports.clone().unwrap_or_default()),
            _ => None,
        })?;
        let drops = b
            .ops
            .iter()
            .filter_map(|o| match o {
                Op::AclSet(s) if s.parent == AclParent::PortGroup(name.into()) => Some(s),
                _ => None,
            })
            .flat_map(|s| &s.acls)
            .filter(|a| a.action == kubeovn_ovn::northbound::AclAction::Drop)
            .count();
        Some((ports, drops))
    }

    #[test]
    fn a_policy_isolates_only_once_its_allows_are_written_and_stops_before_they_go() {
        let st = NetpolState::new(Families::V4, vec!["100.64.0.0/16".into()]);
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "x"}})).expect("ns");
        st.namespace_event(None, Some(&ns));
        let pod: PolicyPod = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "x", "labels": {"app": "a"},
                "annotations": {"ovn.kubernetes.io/allocated": "true", "ovn.kubernetes.io/ip_address": "10.16.0.10"}}}))
        .expect("pod");
        st.pod_event(None, Some(&pod));
        let np: NetworkPolicy = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "x"},
            "spec": {"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}}))
        .expect("policy");
        let t = netpol::network_policy(&np, Families::V4, &|_: &Pods, _, _: &str| BTreeSet::new())
            .expect("translation");
        let none = || Vec::new();
        let absent = |_: &str| false;
        let owner = "NetworkPolicy/x/p";

        // Held, its allows not written yet: the group exists (to hold them) but is empty, with no drop.
        st.hold(owner, Some("x"), &t, false);
        let (b, ..) = st.take(&none, &absent);
        assert_eq!(group_in(&b, "np_x_ingress"), Some((vec![], 0)));
        // Its allows written: the pod joins the group under the drop.
        st.settle(owner);
        let (b, ..) = st.take(&none, &absent);
        assert_eq!(group_in(&b, "np_x_ingress"), Some((vec!["a.x".into()], 1)));
        // Withdrawn before its allows go: nothing isolates, so the group goes.
        st.withdraw(owner);
        let (b, ..) = st.take(&none, &absent);
        assert!(b
            .ops
            .iter()
            .any(|o| matches!(o, Op::DeletePortGroup(n) if n == "np_x_ingress")));

        // Its allows already in NB (a restart): in force at once.
        st.forget(owner);
        st.hold(owner, Some("x"), &t, true);
        let (b, ..) = st.take(&none, &absent);
        assert_eq!(group_in(&b, "np_x_ingress"), Some((vec!["a.x".into()], 1)));

        // Just after a restart, a group in NB is not written while another policy of its namespace is
        // unknown; it is once that one is known.
        let st = NetpolState::new(Families::V4, vec!["100.64.0.0/16".into()]);
        st.namespace_event(None, Some(&ns));
        st.pod_event(None, Some(&pod));
        st.hold(owner, Some("x"), &t, true);
        let other = "NetworkPolicy/x/q";
        st.hold("NetworkPolicy/x/r", Some("x"), &t, true);
        let listed = || {
            vec![
                owner.to_owned(),
                other.to_owned(),
                "NetworkPolicy/x/r".to_owned(),
            ]
        };
        let present = |_: &str| true;
        let (b, ..) = st.take(&listed, &present);
        assert_eq!(group_in(&b, "np_x_ingress"), None);
        st.hold(other, Some("x"), &t, true);
        let (b, ..) = st.take(&listed, &present);
        assert_eq!(group_in(&b, "np_x_ingress"), Some((vec!["a.x".into()], 1)));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_policy_changed_from_ingress_to_egress_moves_its_isolation() {
        let h = Harness::start().await;
        namespace(&h, "x", json!({})).await;
        pod(&h, "x", "a", "a", "10.16.0.10").await;
        let deny = |types: serde_json::Value| -> NetworkPolicy {
            serde_json::from_value(json!({"metadata": {"name": "deny", "namespace": "x"},
                "spec": {"podSelector": {}, "policyTypes": types}}))
            .expect("policy")
        };
        let np = h.create(&deny(json!(["Ingress"]))).await;
        let key = Key::of(&np);
        h.run::<NetworkPolicies>(key.clone()).await.expect("run");
        let ports = |g: &str| h.nb.port_group(g).map(|g| g.ports.len());
        assert_eq!(ports("np_x_ingress"), Some(1));
        assert_eq!(ports("np_x_egress"), None);
        let api = Api::<NetworkPolicy>::namespaced(h.client.clone(), "x");
        api.patch(
            "deny",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"policyTypes": ["Egress"]}})),
        )
        .await
        .expect("patch");
        h.until("policy changed in the store", || {
            h.ctx.kinds.get(&key).is_some_and(|p| {
                p.spec.as_ref().and_then(|s| s.policy_types.clone()) == Some(vec!["Egress".into()])
            })
        })
        .await;
        h.run::<NetworkPolicies>(key.clone()).await.expect("run");
        h.until("isolation moved", || {
            ports("np_x_ingress").is_none() && ports("np_x_egress") == Some(1)
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_policy_gets_shared_sets_and_follows_labels_without_running_again() {
        let h = Harness::start().await;
        namespace(&h, "x", json!({"team": "a"})).await;
        namespace(&h, "y", json!({"team": "b"})).await;
        pod(&h, "x", "a", "a", "10.16.0.10").await;
        pod(&h, "x", "b", "b", "10.16.0.11").await;
        pod(&h, "y", "c", "c", "10.16.0.12").await;
        let np: NetworkPolicy = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "x"},
            "spec": {"podSelector": {"matchLabels": {"app": "a"}},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "b"}}},
                                      {"namespaceSelector": {"matchLabels": {"team": "b"}}}],
                             "ports": [{"port": 80}, {"port": "http"}]}]}}))
        .expect("policy");
        let np = h.create(&np).await;
        let key = Key::of(&np);
        h.run::<NetworkPolicies>(key.clone()).await.expect("run");

        // The namespace's isolation group holds the selected pod; its ACLs: the drop, the nodes, and the
        // policy's allows (the named port resolved to 8080).
        h.until("the pod in the namespace group", || {
            h.nb.port_group("np_x_ingress")
                .is_some_and(|g| g.ports.len() == 1)
        })
        .await;
        let acls = h.nb.acls(&AclParent::PortGroup("np_x_ingress".into()));
        let owned = |o: &str| {
            acls.iter()
                .filter(|a| a.external_ids.get(OWNER_KEY).map(String::as_str) == Some(o))
                .count()
        };
        assert_eq!(owned("Namespace/x"), 2, "{acls:#?}");
        assert_eq!(
            owned("NetworkPolicy/x/p"),
            4,
            "two peers, numbered and named: {acls:#?}"
        );
        assert!(acls.iter().any(|a| a.match_.ends_with("tcp.dst == 8080")));
        let same_ns = SetKey::addresses(Pods::In {
            namespace: "x".into(),
            pods: crate::selector::Selector::new(vec![crate::selector::Requirement::Equals(
                "app".into(),
                "b".into(),
            )]),
        });
        assert_eq!(addresses(&h, &same_ns.family(false)), ["10.16.0.11"]);

        // Running again writes nothing.
        let before = h.nb_rows();
        h.run::<NetworkPolicies>(key.clone()).await.expect("run");
        assert_eq!(h.nb_rows(), before);

        // A relabel moves the pod out of the set, with no run of the policy.
        Api::<Pod>::namespaced(h.client.clone(), "x")
            .patch(
                "b",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"app": "z"}}})),
            )
            .await
            .expect("relabel");
        h.until("pod left the set", || {
            addresses(&h, &same_ns.family(false)).is_empty()
        })
        .await;
        // A namespace relabel moves its pods out of the namespace selector's set.
        Api::<Namespace>::all(h.client.clone())
            .patch(
                "y",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"team": "c"}}})),
            )
            .await
            .expect("relabel namespace");
        h.until("namespace left the set", || {
            h.nb.address_sets_with_external_id(SELECTOR_KEY)
                .iter()
                .all(|s| !s.addresses.contains(&"10.16.0.12".to_owned()))
        })
        .await;

        // Deleted: its ACLs, the group and the sets go.
        Api::<NetworkPolicy>::namespaced(h.client.clone(), "x")
            .delete("p", &DeleteParams::default())
            .await
            .expect("delete");
        h.gone(&key).await;
        h.run::<NetworkPolicies>(key.clone())
            .await
            .expect("cleanup");
        h.until("group and sets gone", || {
            h.nb.port_group("np_x_ingress").is_none()
                && h.nb.address_set(&same_ns.family(false)).is_none()
        })
        .await;
    }
}
