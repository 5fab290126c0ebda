//! The membership state machine: the sets policies name and their members, kept from the watches of pods,
//! namespaces and nodes (see the module docs of `netpol`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerPort, Namespace, Node};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::NamespaceResourceScope;
use kubeovn_ovn::northbound::{
    AclParent, AclSet, AddressSet, Batch, Meter, MeterUnit, Op, PortGroup,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Notify};

use crate::annotations::{self, DEFAULT_PROVIDER};
use crate::controller::error::ControllerError;
use crate::controller::framework::{Key, SelectorIndex, Watch};
use crate::naming;
use crate::netpol::{
    namespace_acls, namespace_group, Direction, Families, Form, Logging, Members, Pods, Protocol,
    SetKey, Translation, OWNER_KEY, SELECTOR_KEY,
};

/// How long a policy's run waits for its sets to be written before it is retried.
pub(crate) const FLUSH_WAIT: Duration = Duration::from_secs(30);

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
pub(crate) fn trim_pod(p: &mut PolicyPod) {
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
pub(crate) struct Facts {
    labels: BTreeMap<String, String>,
    ips: Vec<IpAddr>,
    /// Its switch port, once it has one.
    port: Option<String>,
    named: Vec<(Protocol, String, u16)>,
}

pub(crate) fn facts(p: &PolicyPod) -> Option<Facts> {
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
pub(crate) struct Owner {
    pub(crate) namespace: Option<String>,
    /// Every set it holds (what its ACLs name now, and what they are about to name).
    pub(crate) held: BTreeSet<SetKey>,
    /// What its ACLs name once written.
    pub(crate) next: BTreeSet<SetKey>,
    pub(crate) isolates: Vec<(Direction, Pods)>,
    /// The isolation in force: its subjects are in the namespace's group under the drop. An isolation
    /// joins only once the policy's allows are written, and leaves before they go, so that a policy's
    /// pods are never dropped by it without its allows.
    pub(crate) enforced: Vec<(Direction, Pods)>,
    pub(crate) named: BTreeSet<(Pods, Protocol, String)>,
    pub(crate) logging: Logging,
    pub(crate) problems: Vec<String>,
    /// The port group its ACLs hang on (admin policies).
    pub(crate) parent: Option<String>,
}

/// The pods of a namespace isolated in one direction.
pub(crate) type Group = (String, Direction);

#[derive(Default)]
pub(crate) struct Inner {
    pub(crate) pods: HashMap<String, HashMap<String, Facts>>,
    pub(crate) namespaces: HashMap<String, BTreeMap<String, String>>,
    pub(crate) nodes: HashMap<String, (BTreeMap<String, String>, Vec<IpAddr>)>,
    pub(crate) holders: HashMap<SetKey, usize>,
    /// Sets of the pods of one namespace, by namespace.
    pub(crate) in_ns: HashMap<String, HashSet<SetKey>>,
    /// Sets across namespaces, by namespace selector.
    pub(crate) across: SelectorIndex<SetKey>,
    pub(crate) node_sets: HashSet<SetKey>,
    pub(crate) owners: HashMap<String, Owner>,
    pub(crate) dirty_sets: HashSet<SetKey>,
    pub(crate) dirty_groups: HashSet<Group>,
    /// NetworkPolicies refused (they hold nothing, but are known).
    pub(crate) refused: HashSet<String>,
    /// Groups left unwritten by [`NetpolState::take`] until their namespace's policies are known.
    pub(crate) deferred: HashSet<Group>,
    /// Every NetworkPolicy the store listed was known here once: NB no longer holds isolation of policies
    /// this controller has not seen, so nothing is deferred any more.
    pub(crate) loaded: bool,
    /// Bumped by every mark.
    pub(crate) generation: u64,
}

/// The sets policies name and their members, kept from the watches (see the module doc).
pub struct NetpolState {
    pub(crate) inner: Mutex<Inner>,
    /// One run of the admin policies at a time (they are translated together).
    pub(crate) admin: tokio::sync::Mutex<()>,
    pub(crate) wake: Notify,
    pub(crate) flushed: watch::Sender<u64>,
    pub(crate) families: Families,
    pub(crate) node_cidrs: Vec<String>,
    /// The admin policies a pod's or namespace's change concerns, found by the NetworkPolicy kind's
    /// relation (it feeds the membership) and taken by the admin kinds' relations, which run after it.
    pub(crate) admin_touched: Mutex<Vec<String>>,
}

impl std::fmt::Debug for NetpolState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetpolState").finish_non_exhaustive()
    }
}

pub(crate) fn owner_of(np: &Key<NetworkPolicy>) -> String {
    format!(
        "NetworkPolicy/{}/{}",
        np.namespace().unwrap_or_default(),
        np.name()
    )
}

pub(crate) fn np_key(owner: &str) -> Option<Key<NetworkPolicy>> {
    let rest = owner.strip_prefix("NetworkPolicy/")?;
    let (ns, name) = rest.split_once('/')?;
    Some(Key::namespaced(ns, name))
}

impl Inner {
    pub(crate) fn mark_set(&mut self, s: &SetKey) {
        self.dirty_sets.insert(s.clone());
        self.generation += 1;
    }
    pub(crate) fn mark_group(&mut self, g: Group) {
        self.dirty_groups.insert(g);
        self.generation += 1;
    }

    /// Marks again the groups of `ns` left unwritten (one of its policies became known).
    pub(crate) fn undefer(&mut self, ns: &str) {
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

    pub(crate) fn hold(&mut self, s: &SetKey) {
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

    pub(crate) fn release(&mut self, s: &SetKey) {
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
    pub(crate) fn pod_in(&self, s: &SetKey, ns: &str, f: &Facts) -> bool {
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
    pub(crate) fn pods_of<'a>(&'a self, p: &'a Pods) -> Vec<(&'a str, &'a str, &'a Facts)> {
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
    pub(crate) fn members(&self, s: &SetKey) -> (Vec<String>, Vec<IpAddr>) {
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
    pub(crate) fn isolating(&self, ns: &str, dir: Direction) -> Vec<&Pods> {
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
    pub(crate) fn group_wanted(&self, ns: &str, dir: Direction) -> bool {
        self.owners
            .values()
            .filter(|o| o.namespace.as_deref() == Some(ns))
            .flat_map(|o| o.isolates.iter().chain(&o.enforced))
            .any(|(d, _)| *d == dir)
    }

    /// Marks what a pod's change touches; returns the policies whose named ports it may change.
    pub(crate) fn pod_changed(&mut self, ns: &str, name: &str, new: Option<Facts>) -> Vec<String> {
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
    pub(crate) fn namespace_changed(
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

    pub(crate) fn node_changed(
        &mut self,
        name: &str,
        new: Option<(BTreeMap<String, String>, Vec<IpAddr>)>,
    ) {
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

pub(crate) fn ns_labels(n: &Namespace) -> BTreeMap<String, String> {
    let mut l = n.metadata.labels.clone().unwrap_or_default();
    // As kube-apiserver guarantees; the watch may show a namespace created without it.
    if let Some(name) = &n.metadata.name {
        l.entry("kubernetes.io/metadata.name".to_owned())
            .or_insert_with(|| name.clone());
    }
    l
}

pub(crate) fn node_facts(n: &Node) -> (BTreeMap<String, String>, Vec<IpAddr>) {
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
    pub(crate) fn split_owners(&self, owners: Vec<String>) -> Vec<Key<NetworkPolicy>> {
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
    pub(crate) fn take_admin(&self, prefix: &str) -> Vec<String> {
        let mut t = self.admin_touched.lock().unwrap_or_else(|e| e.into_inner());
        let (mine, rest): (Vec<String>, Vec<String>) =
            t.drain(..).partition(|o| o.starts_with(prefix));
        *t = rest;
        mine
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the writer if something was marked since `before`.
    pub(crate) fn wake_if(&self, before: u64, after: u64) {
        if after != before {
            self.wake.notify_one();
        }
    }

    pub(crate) fn pod_event(
        &self,
        old: Option<&PolicyPod>,
        new: Option<&PolicyPod>,
    ) -> Vec<String> {
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

    pub(crate) fn namespace_event(
        &self,
        old: Option<&Namespace>,
        new: Option<&Namespace>,
    ) -> Vec<String> {
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

    pub(crate) fn node_event(&self, old: Option<&Node>, new: Option<&Node>) {
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
    pub(crate) fn numbers(&self, pods: &Pods, protocol: Protocol, name: &str) -> BTreeSet<u16> {
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
    pub(crate) fn hold(
        &self,
        owner: &str,
        ns: Option<&str>,
        t: &Translation,
        written: bool,
    ) -> u64 {
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
    pub(crate) fn settle(&self, owner: &str) -> u64 {
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
    pub(crate) fn withdraw(&self, owner: &str) -> u64 {
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
    pub(crate) fn forget(&self, owner: &str) {
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
    pub(crate) fn parent_of(&self, owner: &str) -> Option<String> {
        self.lock().owners.get(owner).and_then(|o| o.parent.clone())
    }

    /// The admin policies' owners known.
    pub(crate) fn admin_owners(&self) -> Vec<String> {
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
    pub(crate) fn swap_problems(&self, owner: &str, now: Vec<String>) -> Vec<String> {
        let mut g = self.lock();
        g.owners
            .get_mut(owner)
            .map(|o| std::mem::replace(&mut o.problems, now))
            .unwrap_or_default()
    }

    /// Waits until the writer has written everything marked up to `generation`.
    pub(crate) async fn flushed(&self, generation: u64) -> Result<(), ControllerError> {
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
    pub(crate) fn take(
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
                    .map(|a| crate::controller::plan::ovn_acl(a, &name, &owner, meter.as_deref()))
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

    pub(crate) fn family_list(&self) -> Vec<bool> {
        match self.families {
            Families::V4 => vec![false],
            Families::V6 => vec![true],
            Families::Dual => vec![false, true],
        }
    }

    /// Marks again what a failed write took.
    pub(crate) fn retake(&self, sets: Vec<SetKey>, groups: Vec<Group>) {
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
pub(crate) fn meter_name(owner: &str) -> String {
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

/// How pods are watched for policies.
pub(crate) fn pod_watch() -> Watch<PolicyPod> {
    Watch {
        labels: None,
        trim: trim_pod,
    }
}
