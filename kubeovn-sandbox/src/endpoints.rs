//! The sandbox's EndpointSlice controller: what kube-controller-manager's does in a cluster. For every Service
//! with a selector (not ExternalName) it keeps `discovery.k8s.io/v1` EndpointSlices listing the Service's
//! pods, per address family, grouped by the ports each pod resolves, at most
//! [`MAX_ENDPOINTS_PER_SLICE`] endpoints a slice.
//!
//! The translation is pure: [`desired`] maps a Service and pods to endpoints grouped by port set, [`plan`]
//! compares them with the existing slices and says what to create, update and delete, keeping endpoints in the
//! slices they are in (as upstream's reconciler does, so one pod's change rewrites one slice).
//!
//! The driver is a kind on kubeovn-core's controller framework, [`EndpointSlices`] (a worked example of it):
//! one key per Service; the framework watches Services, pods and the managed slices (by their label), keeps
//! the stores, queues and retries. Its relations run a Service again when a pod it selects (before or after
//! the change) or one of its slices changes. What the kind remembers is its own state: the slices it wrote
//! that the watch has not delivered yet ([`overlay`], upstream's EndpointSliceTracker), so a quick second
//! change never works on a slice it has already replaced. A slice is written only when its content differs,
//! so its own writes coming back write nothing.
//!
//! One controller runs per cluster, as kube-controller-manager's: `up` starts `kube-ovn-sandbox endpoints`
//! once, whatever the number of nodes.
//!
//! The test API server has no ownerReference garbage collector, so the slices of a deleted Service (or one
//! without a selector any more) are deleted here; at start, managed slices whose Service is gone are too.
//! Zones (`zone`, topology hints) are left out: the sandbox's nodes have none.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, PostParams};
use kube::ResourceExt;
use kubeovn_core::controller::framework::{
    Action, Builder, Context, Key, Kinds, ReconcileError, Reconciler, Relations, Watch,
};

use crate::SandboxError;

/// The label naming a slice's Service (kubeovn-core's, which the controller's Service kind reads).
pub const LABEL_SERVICE_NAME: &str = kubeovn_core::services::SERVICE_NAME_LABEL;
/// The label naming a slice's controller.
pub const LABEL_MANAGED_BY: &str = kubeovn_core::services::MANAGED_BY_LABEL;
/// The label marking the slices of a headless Service.
pub const LABEL_HEADLESS: &str = kubeovn_core::services::HEADLESS_LABEL;
/// The controller name in [`LABEL_MANAGED_BY`], kube-controller-manager's: consumers treat our slices as
/// theirs.
pub const CONTROLLER_NAME: &str = kubeovn_core::services::ENDPOINTSLICE_CONTROLLER;
/// Upstream's default `--max-endpoints-per-slice`.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;

/// An address family, the slice's `addressType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// `IPv4`.
    V4,
    /// `IPv6`.
    V6,
}

impl Family {
    /// The `addressType` value.
    pub fn address_type(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    /// The family of an `addressType` (None for `FQDN` and anything else).
    pub fn from_address_type(t: &str) -> Option<Family> {
        match t {
            "IPv4" => Some(Family::V4),
            "IPv6" => Some(Family::V6),
            _ => None,
        }
    }

    fn of(ip: &IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
}

/// Whether this controller keeps slices for the Service: a non-empty selector and not ExternalName.
pub fn manages(svc: &Service) -> bool {
    let Some(spec) = &svc.spec else { return false };
    spec.type_.as_deref() != Some("ExternalName")
        && spec.selector.as_ref().is_some_and(|s| !s.is_empty())
}

fn cluster_ip(svc: &Service) -> &str {
    svc.spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .unwrap_or("")
}

/// The families the Service's slices have: its `ipFamilies`; without them (an API server that does not
/// default them) its ClusterIP's, and both for a headless Service, as upstream.
pub fn families(svc: &Service) -> BTreeSet<Family> {
    let listed: BTreeSet<Family> = svc
        .spec
        .as_ref()
        .and_then(|s| s.ip_families.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|f| Family::from_address_type(f))
        .collect();
    if !listed.is_empty() {
        return listed;
    }
    match cluster_ip(svc) {
        "" | "None" => [Family::V4, Family::V6].into(),
        ip => match ip.parse::<IpAddr>() {
            Ok(ip) => [Family::of(&ip)].into(),
            Err(_) => [Family::V4].into(),
        },
    }
}

/// Whether the Service's selector selects the pod (same namespace, every selector label on the pod).
pub fn selects(svc: &Service, pod: &Pod) -> bool {
    let Some(selector) = svc.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
        return false;
    };
    if selector.is_empty() || svc.metadata.namespace != pod.metadata.namespace {
        return false;
    }
    let labels = pod.labels();
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Whether a pod can be an endpoint at all: not terminal (Succeeded, Failed) and with an address.
fn in_endpoints(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return false;
    }
    !pod_ips(pod).is_empty()
}

/// The pod's addresses: `status.podIPs`, else `status.podIP` (kube-apiserver fills the first from the
/// second; the test API server does not). Unparsable ones are left out, the rest written canonically.
fn pod_ips(pod: &Pod) -> Vec<IpAddr> {
    let Some(status) = &pod.status else {
        return Vec::new();
    };
    let listed: Vec<&str> = match status.pod_ips.as_deref() {
        Some(ips) if !ips.is_empty() => ips.iter().map(|p| p.ip.as_str()).collect(),
        _ => status.pod_ip.as_deref().into_iter().collect(),
    };
    listed.iter().filter_map(|s| s.parse().ok()).collect()
}

/// The pod's `Ready` condition.
fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The container port named `name` with `protocol` in the pod: its containers, then its sidecars (init
/// containers that restart always), as upstream's `FindPort`.
fn named_port(pod: &Pod, name: &str, protocol: &str) -> Option<i32> {
    let spec = pod.spec.as_ref()?;
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    spec.containers
        .iter()
        .chain(sidecars)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| {
            p.name.as_deref() == Some(name) && p.protocol.as_deref().unwrap_or("TCP") == protocol
        })
        .map(|p| p.container_port)
}

/// The Service's ports as this pod serves them: a numeric `targetPort` as is (the Service's `port` when
/// unset), a named one resolved in the pod's containers; a port whose name the pod does not have is left out
/// (so the pod goes into slices without it).
pub fn endpoint_ports(svc: &Service, pod: &Pod) -> Vec<EndpointPort> {
    let Some(spec) = &svc.spec else {
        return Vec::new();
    };
    spec.ports
        .iter()
        .flatten()
        .filter_map(|sp| {
            let protocol = sp.protocol.clone().unwrap_or_else(|| "TCP".into());
            let port = match &sp.target_port {
                None | Some(IntOrString::Int(0)) => sp.port,
                Some(IntOrString::Int(n)) => *n,
                Some(IntOrString::String(name)) => named_port(pod, name, &protocol)?,
            };
            Some(EndpointPort {
                name: Some(sp.name.clone().unwrap_or_default()),
                port: Some(port),
                protocol: Some(protocol),
                app_protocol: sp.app_protocol.clone(),
            })
        })
        .collect()
}

/// The pod's endpoint in a slice of `family` (no addresses when it has none of that family).
pub fn pod_endpoint(svc: &Service, pod: &Pod, family: Family) -> Endpoint {
    let serving = pod_ready(pod);
    let terminating = pod.metadata.deletion_timestamp.is_some();
    let publish = svc
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    // As upstream: a terminating pod is never ready, unless the Service publishes not-ready addresses.
    let ready = publish || (serving && !terminating);
    let spec = pod.spec.as_ref();
    let hostname = spec
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .filter(|_| {
            spec.and_then(|s| s.subdomain.as_deref()) == Some(svc.name_any().as_str())
                && svc.metadata.namespace == pod.metadata.namespace
        });
    Endpoint {
        addresses: pod_ips(pod)
            .iter()
            .filter(|ip| Family::of(ip) == family)
            .map(IpAddr::to_string)
            .collect(),
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        hostname,
        node_name: spec
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..ObjectReference::default()
        }),
        ..Endpoint::default()
    }
}

/// A slice's ports in a canonical order: the identity of a group of endpoints.
pub type PortKey = Vec<(String, String, i32, Option<String>)>;

/// The canonical form of a port list.
pub fn port_key(ports: &[EndpointPort]) -> PortKey {
    let mut key: PortKey = ports
        .iter()
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                p.port.unwrap_or(0),
                p.app_protocol.clone(),
            )
        })
        .collect();
    key.sort();
    key
}

/// An endpoint's identity: its target (namespace, name, uid), else its first address.
pub type EndpointKey = (String, String, String);

/// The identity of an endpoint.
pub fn endpoint_key(ep: &Endpoint) -> EndpointKey {
    match &ep.target_ref {
        Some(r) => (
            r.namespace.clone().unwrap_or_default(),
            r.name.clone().unwrap_or_default(),
            r.uid.clone().unwrap_or_default(),
        ),
        None => (
            String::new(),
            String::new(),
            ep.addresses.first().cloned().unwrap_or_default(),
        ),
    }
}

/// The endpoints of one port set: the ports (in the Service's order) and the endpoints by identity.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Group {
    /// The ports every endpoint of the group serves.
    pub ports: Vec<EndpointPort>,
    /// The endpoints.
    pub endpoints: BTreeMap<EndpointKey, Endpoint>,
}

/// What the Service's slices of `family` should hold: each selected, non-terminal pod with an address,
/// grouped by the ports it resolves. A group may be empty (its pods have no address of this family), as
/// upstream: it creates no slice but keeps an empty one.
pub fn desired<'a>(
    svc: &Service,
    pods: impl IntoIterator<Item = &'a Pod>,
    family: Family,
) -> BTreeMap<PortKey, Group> {
    let mut groups: BTreeMap<PortKey, Group> = BTreeMap::new();
    for pod in pods {
        if !selects(svc, pod) || !in_endpoints(pod) {
            continue;
        }
        let ports = endpoint_ports(svc, pod);
        let group = groups.entry(port_key(&ports)).or_insert_with(|| Group {
            ports,
            endpoints: BTreeMap::new(),
        });
        let ep = pod_endpoint(svc, pod, family);
        if !ep.addresses.is_empty() {
            group.endpoints.insert(endpoint_key(&ep), ep);
        }
    }
    groups
}

/// The labels of the Service's slices: the Service's own (but the reserved ones), the Service's name, the
/// controller's, and the headless mark.
pub fn slice_labels(svc: &Service) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = svc
        .labels()
        .iter()
        .filter(|(k, _)| {
            ![LABEL_SERVICE_NAME, LABEL_MANAGED_BY, LABEL_HEADLESS].contains(&k.as_str())
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if matches!(cluster_ip(svc), "" | "None") {
        labels.insert(LABEL_HEADLESS.into(), String::new());
    }
    labels.insert(LABEL_SERVICE_NAME.into(), svc.name_any());
    labels.insert(LABEL_MANAGED_BY.into(), CONTROLLER_NAME.into());
    labels
}

/// The controller reference to the Service that every slice carries.
pub fn owner_reference(svc: &Service) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name: svc.name_any(),
        uid: svc.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Whether the slice belongs to this Service (not to a deleted one of the same name).
fn owned_by(slice: &EndpointSlice, svc: &Service) -> bool {
    let uid = svc.metadata.uid.as_deref().unwrap_or_default();
    slice
        .owner_references()
        .iter()
        .any(|o| o.uid == uid && o.kind == "Service" && o.api_version == "v1")
}

fn new_slice(
    svc: &Service,
    labels: &BTreeMap<String, String>,
    family: Family,
    ports: Vec<EndpointPort>,
) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", svc.name_any())),
            namespace: svc.metadata.namespace.clone(),
            labels: Some(labels.clone()),
            owner_references: Some(vec![owner_reference(svc)]),
            ..ObjectMeta::default()
        },
        address_type: family.address_type().into(),
        endpoints: Some(Vec::new()),
        ports: Some(ports),
    }
}

fn endpoints_of(slice: &EndpointSlice) -> &[Endpoint] {
    slice.endpoints.as_deref().unwrap_or_default()
}

/// What one reconciliation of a Service writes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// New slices (with `generateName`).
    pub create: Vec<EndpointSlice>,
    /// Existing slices with new content (name and resourceVersion kept).
    pub update: Vec<EndpointSlice>,
    /// Slices to delete.
    pub delete: Vec<EndpointSlice>,
}

impl Plan {
    /// Whether nothing is to be written.
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.update.is_empty() && self.delete.is_empty()
    }
}

/// What to write so that the slices `existing` (the managed ones labelled with the Service's name) become
/// what the Service and `pods` ask for, `max` endpoints a slice. `svc` None (deleted), without a selector or
/// ExternalName: every managed slice goes.
pub fn plan(svc: Option<&Service>, pods: &[&Pod], existing: &[EndpointSlice], max: usize) -> Plan {
    let mut plan = Plan::default();
    let Some(svc) = svc.filter(|s| manages(s)) else {
        plan.delete = existing.to_vec();
        return plan;
    };
    let max = max.max(1);
    let families = families(svc);
    let mut by_family: BTreeMap<Family, Vec<&EndpointSlice>> = BTreeMap::new();
    for s in existing {
        match Family::from_address_type(&s.address_type) {
            Some(f) if families.contains(&f) => by_family.entry(f).or_default().push(s),
            _ => plan.delete.push(s.clone()),
        }
    }
    let labels = slice_labels(svc);
    for f in families {
        let slices = by_family.remove(&f).unwrap_or_default();
        plan_family(svc, &labels, pods, &slices, f, max, &mut plan);
    }
    // As upstream: no new slices for a Service being deleted (its garbage collection would race them).
    if svc.metadata.deletion_timestamp.is_some() {
        plan.create.clear();
    }
    plan
}

fn plan_family(
    svc: &Service,
    labels: &BTreeMap<String, String>,
    pods: &[&Pod],
    existing: &[&EndpointSlice],
    family: Family,
    max: usize,
    out: &mut Plan,
) {
    let mut p = Plan::default();
    let mut by_ports: BTreeMap<PortKey, Vec<&EndpointSlice>> = BTreeMap::new();
    for s in existing {
        if owned_by(s, svc) {
            by_ports
                .entry(port_key(s.ports.as_deref().unwrap_or_default()))
                .or_default()
                .push(s);
        } else {
            p.delete.push((*s).clone());
        }
    }
    for (key, group) in desired(svc, pods.iter().copied(), family) {
        let slices = by_ports.remove(&key).unwrap_or_default();
        plan_group(svc, labels, family, group, &slices, max, &mut p);
    }
    // Port sets no pod resolves any more.
    p.delete
        .extend(by_ports.into_values().flatten().map(|s| (*s).clone()));
    // A Service without endpoints keeps one empty slice, so that consumers see it has been handled.
    if existing.len() == p.delete.len() && p.create.is_empty() {
        let placeholder = new_slice(svc, labels, family, Vec::new());
        match p.delete.as_slice() {
            [only] if is_placeholder(only, &placeholder) => p.delete.clear(),
            _ => p.create.push(placeholder),
        }
    }
    // Rather than create one slice and delete another, reuse the deleted one's name.
    let mut i = 0;
    while i < p.delete.len() && !p.create.is_empty() {
        if owned_by(&p.delete[i], svc) {
            let old = p.delete.remove(i);
            if let Some(mut slice) = p.create.pop() {
                slice.metadata.generate_name = None;
                slice.metadata.name = old.metadata.name;
                slice.metadata.resource_version = old.metadata.resource_version;
                slice.metadata.annotations = old.metadata.annotations;
                p.update.push(slice);
            }
        } else {
            i += 1;
        }
    }
    out.create.append(&mut p.create);
    out.update.append(&mut p.update);
    out.delete.append(&mut p.delete);
}

fn is_placeholder(slice: &EndpointSlice, placeholder: &EndpointSlice) -> bool {
    slice.metadata.namespace == placeholder.metadata.namespace
        && slice.metadata.labels == placeholder.metadata.labels
        && slice.metadata.owner_references == placeholder.metadata.owner_references
        && slice.address_type == placeholder.address_type
        && slice.ports.as_deref().unwrap_or_default().is_empty()
        && endpoints_of(slice).is_empty()
}

/// One port set's slices, in the three steps of upstream's reconciler: keep (and refresh) the wanted
/// endpoints where they are and drop the rest; fill the slices being written anyway; then the unchanged slice
/// closest to full that takes all the rest, or new slices.
fn plan_group(
    svc: &Service,
    labels: &BTreeMap<String, String>,
    family: Family,
    mut group: Group,
    existing: &[&EndpointSlice],
    max: usize,
    p: &mut Plan,
) {
    let mut existing = existing.to_vec();
    existing.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut changed: Vec<EndpointSlice> = Vec::new();
    let mut unchanged: Vec<&EndpointSlice> = Vec::new();
    for s in existing {
        let old = endpoints_of(s);
        let mut kept = Vec::with_capacity(old.len());
        let mut differs = false;
        for ep in old {
            // The wanted version; a second copy of an endpoint (in another slice) is dropped.
            if let Some(want) = group.endpoints.remove(&endpoint_key(ep)) {
                differs |= want != *ep;
                kept.push(want);
            }
        }
        let labels_differ = s.metadata.labels.as_ref() != Some(labels);
        if differs || kept.len() != old.len() {
            if kept.is_empty() {
                p.delete.push(s.clone());
                continue;
            }
            let mut s = s.clone();
            s.endpoints = Some(kept);
            s.metadata.labels = Some(labels.clone());
            changed.push(s);
        } else if labels_differ {
            let mut s = s.clone();
            s.metadata.labels = Some(labels.clone());
            changed.push(s);
        } else {
            unchanged.push(s);
        }
    }
    let mut rest: std::collections::VecDeque<Endpoint> =
        std::mem::take(&mut group.endpoints).into_values().collect();
    let fill = |slice: &mut EndpointSlice, rest: &mut std::collections::VecDeque<Endpoint>| {
        let eps = slice.endpoints.get_or_insert_with(Vec::new);
        while eps.len() < max {
            let Some(ep) = rest.pop_front() else { break };
            eps.push(ep);
        }
    };
    // Fill the fullest of the slices written anyway first.
    changed.sort_by_key(|s| std::cmp::Reverse(endpoints_of(s).len()));
    for s in &mut changed {
        fill(s, &mut rest);
    }
    while !rest.is_empty() {
        let left = rest.len();
        let closest = if left < max {
            // The unchanged slice that the rest fills closest to full.
            unchanged
                .iter()
                .enumerate()
                .filter(|(_, s)| endpoints_of(s).len() + left <= max)
                .max_by_key(|(i, s)| (endpoints_of(s).len(), std::cmp::Reverse(*i)))
                .map(|(i, _)| i)
        } else {
            None
        };
        let mut slice = match closest {
            Some(i) => unchanged.remove(i).clone(),
            None => new_slice(svc, labels, family, group.ports.clone()),
        };
        fill(&mut slice, &mut rest);
        if slice.metadata.name.is_some() {
            changed.push(slice);
        } else {
            p.create.push(slice);
        }
    }
    p.update.append(&mut changed);
}

/// The context the EndpointSlice kind runs in: the framework's kinds (stores and queues) and the API client
/// the slices are written with.
pub struct Ctx {
    kinds: Arc<Kinds>,
    client: kube::Client,
}

impl Context for Ctx {
    fn kinds(&self) -> &Kinds {
        &self.kinds
    }
    fn workers(&self) -> usize {
        2
    }
}

/// A failed run: an API request (retried with the framework's backoff).
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct SliceError {
    what: &'static str,
    #[source]
    source: kube::Error,
}

impl ReconcileError for SliceError {}

fn api_err(what: &'static str) -> impl Fn(kube::Error) -> SliceError {
    move |source| SliceError { what, source }
}

/// What this kind wrote that its store may not show yet: the slice as the API answered, or its deletion.
#[derive(Debug, Clone)]
pub enum Written {
    /// Created or replaced: the API's answer.
    At(Arc<EndpointSlice>),
    /// Deleted at this resourceVersion.
    Deleted(Option<String>),
}

/// A resourceVersion as a number (the API server's are etcd revisions; the test API server's too).
fn revision(s: &EndpointSlice) -> Option<u64> {
    s.metadata.resource_version.as_deref()?.parse().ok()
}

/// The slices of one Service as this kind must see them: the store's (`stored`), except where its own writes
/// (`written`, this Service's, by slice name) are newer than what the watch delivered so far (upstream's
/// EndpointSliceTracker). An entry of `written` goes once the store caught up with it; the store's version
/// wins when it is as new or newer (someone else's change after ours), or when versions do not compare.
pub fn overlay(
    stored: Vec<Arc<EndpointSlice>>,
    written: &mut HashMap<String, Written>,
) -> Vec<EndpointSlice> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for s in stored {
        let name = s.metadata.name.clone().unwrap_or_default();
        seen.insert(name.clone());
        let have = revision(&s);
        let wrote = |w: Option<&str>| w.and_then(|w| w.parse::<u64>().ok());
        // Older than the write (the write's own echo is as new); as new as the deleted version or older.
        let behind = |w: Option<&str>| matches!((have, wrote(w)), (Some(h), Some(w)) if h < w);
        let deleted = |w: Option<&str>| matches!((have, wrote(w)), (Some(h), Some(w)) if h <= w);
        match written.get(&name) {
            Some(Written::At(w)) if behind(w.metadata.resource_version.as_deref()) => {
                out.push((**w).clone())
            }
            Some(Written::Deleted(rv)) if rv.is_none() || deleted(rv.as_deref()) => {}
            _ => {
                written.remove(&name);
                out.push((*s).clone());
            }
        }
    }
    // Created here, not in the store yet; deleted here and gone from the store: nothing left to wait for.
    written.retain(|name, w| match w {
        Written::At(s) if !seen.contains(name) => {
            out.push((**s).clone());
            true
        }
        Written::Deleted(_) => seen.contains(name),
        Written::At(_) => true,
    });
    out
}

/// The EndpointSlice controller as a kind on kubeovn-core's framework: one key per Service, run again when a
/// pod it selects (before or after the change) or one of its managed slices changes. Its state is what it
/// wrote that the slice watch has not delivered yet, per Service (`namespace/name`) and slice name.
#[derive(Debug, Default)]
pub struct EndpointSlices {
    written: Mutex<HashMap<String, HashMap<String, Written>>>,
}

impl EndpointSlices {
    /// The managed slices of Service `namespace/name` as this kind must see them (see [`overlay`]).
    fn existing(&self, kinds: &Kinds, namespace: &str, name: &str) -> Vec<EndpointSlice> {
        let stored: Vec<Arc<EndpointSlice>> = kinds
            .list::<EndpointSlice>()
            .into_iter()
            .filter(|s| {
                s.metadata.namespace.as_deref() == Some(namespace)
                    && s.labels().get(LABEL_SERVICE_NAME).map(String::as_str) == Some(name)
            })
            .collect();
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        let key = format!("{namespace}/{name}");
        let mine = written.entry(key.clone()).or_default();
        let seen = overlay(stored, mine);
        if mine.is_empty() {
            written.remove(&key);
        }
        seen
    }

    fn wrote(&self, namespace: &str, service: &str, slice: String, w: Written) {
        self.written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(format!("{namespace}/{service}"))
            .or_default()
            .insert(slice, w);
    }

    /// Writes what the Service (None: gone) and the namespace's pods ask for. A conflict or a slice not found
    /// means this kind's view was wrong: what it remembered of its writes is dropped, and the run is retried on
    /// the store alone.
    async fn sync(
        &self,
        ctx: &Ctx,
        namespace: &str,
        name: &str,
        svc: Option<&Service>,
    ) -> Result<Action, SliceError> {
        let r = self.write(ctx, namespace, name, svc).await;
        if let Err(SliceError {
            source: kube::Error::Api(e),
            ..
        }) = &r
        {
            if e.code == 404 || e.code == 409 {
                self.written
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&format!("{namespace}/{name}"));
            }
        }
        r
    }

    async fn write(
        &self,
        ctx: &Ctx,
        namespace: &str,
        name: &str,
        svc: Option<&Service>,
    ) -> Result<Action, SliceError> {
        let pods: Vec<Arc<Pod>> = ctx
            .kinds
            .list::<Pod>()
            .into_iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
            .collect();
        let pods: Vec<&Pod> = pods.iter().map(|p| &**p).collect();
        let existing = self.existing(&ctx.kinds, namespace, name);
        let plan = plan(svc, &pods, &existing, MAX_ENDPOINTS_PER_SLICE);
        let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), namespace);
        let pp = PostParams::default();
        // Each answer is remembered at once: a run before the watch delivers it must not write it again.
        for s in &plan.create {
            let made = api.create(&pp, s).await.map_err(api_err("create"))?;
            let slice = made.metadata.name.clone().unwrap_or_default();
            self.wrote(namespace, name, slice, Written::At(Arc::new(made)));
        }
        for s in &plan.update {
            let slice = s.metadata.name.clone().unwrap_or_default();
            let made = api
                .replace(&slice, &pp, s)
                .await
                .map_err(api_err("replace"))?;
            self.wrote(namespace, name, slice, Written::At(Arc::new(made)));
        }
        for s in &plan.delete {
            let slice = s.metadata.name.clone().unwrap_or_default();
            match api.delete(&slice, &DeleteParams::default()).await {
                Ok(_) => {}
                // Already gone: its delete event came or comes.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(api_err("delete")(e)),
            }
            let rv = s.metadata.resource_version.clone();
            self.wrote(namespace, name, slice, Written::Deleted(rv));
        }
        Ok(Action::Done)
    }
}

/// The Services in `pod`'s namespace whose selector selects it.
fn services_selecting(kinds: &Kinds, pod: &Pod) -> Vec<Key<Service>> {
    kinds
        .list::<Service>()
        .iter()
        .filter(|s| selects(s, pod))
        .map(|s| Key::of(&**s))
        .collect()
}

#[async_trait::async_trait]
impl Reconciler<Ctx> for EndpointSlices {
    type Object = Service;
    type Error = SliceError;
    const NAME: &'static str = "endpointslice";

    async fn reconcile(&self, ctx: &Arc<Ctx>, svc: Arc<Service>) -> Result<Action, SliceError> {
        let ns = svc.metadata.namespace.clone().unwrap_or_default();
        self.sync(ctx, &ns, &svc.name_any(), Some(&svc)).await
    }

    /// The Service is gone (the test API server has no ownerReference garbage collector): its slices go.
    async fn cleanup(
        &self,
        ctx: &Arc<Ctx>,
        key: &Key<Service>,
        _last: Option<Arc<Service>>,
    ) -> Result<Action, SliceError> {
        let ns = key.namespace().unwrap_or_default().to_owned();
        self.sync(ctx, &ns, key.name(), None).await
    }

    fn relations(_this: &Arc<Self>, r: &mut Relations<'_, Ctx, Service>) {
        // A pod: the Services that selected it before the change and those that select it after.
        r.on::<Pod>(|kinds, old, new| {
            let mut keys: Vec<Key<Service>> = old
                .into_iter()
                .chain(new)
                .flat_map(|p| services_selecting(kinds, p))
                .collect();
            keys.sort_by(|a, b| a.as_str().cmp(b.as_str()));
            keys.dedup();
            keys
        });
        // A managed slice (written by someone else, deleted, or this kind's own echo): its Service.
        r.on::<EndpointSlice>(|_, old, new| {
            let mut keys: Vec<Key<Service>> = old
                .into_iter()
                .chain(new)
                .filter_map(|s| {
                    let svc = s.labels().get(LABEL_SERVICE_NAME)?;
                    Some(Key::namespaced(s.metadata.namespace.as_deref()?, svc))
                })
                .collect();
            keys.dedup();
            keys
        });
    }

    /// Slices whose Service went while no controller ran are deleted.
    async fn at_start(&self, ctx: &Arc<Ctx>) -> Result<(), SliceError> {
        let mut orphans: BTreeSet<(String, String)> = BTreeSet::new();
        for s in ctx.kinds.list::<EndpointSlice>() {
            let (Some(ns), Some(svc)) = (
                s.metadata.namespace.clone(),
                s.labels().get(LABEL_SERVICE_NAME).cloned(),
            ) else {
                continue;
            };
            if ctx
                .kinds
                .get(&Key::<Service>::namespaced(&ns, &svc))
                .is_none()
            {
                orphans.insert((ns, svc));
            }
        }
        for (ns, svc) in orphans {
            self.sync(ctx, &ns, &svc, None).await?;
        }
        Ok(())
    }
}

/// Registers the kind on `b`: the managed slices watched by their label, Services and pods in full.
pub fn register(b: &mut Builder<Ctx>) {
    b.watch_with::<EndpointSlice>(Watch {
        labels: Some(format!("{LABEL_MANAGED_BY}={CONTROLLER_NAME}")),
        ..Watch::default()
    });
    b.reconcile(EndpointSlices::default());
}

/// Keeps the EndpointSlices of every Service with a selector until `shutdown` completes: once per cluster,
/// as kube-controller-manager's controller (`kube-ovn-sandbox endpoints`, started by `up`).
pub async fn run(
    client: kube::Client,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), SandboxError> {
    run_with(client, shutdown, |_| {}).await
}

/// [`run`], handing the framework's kinds (stores and queues) to `started` once the workers run (after the
/// first lists and the start hook): a test waits on them ([`Kinds::all_settled`]) to know that every change
/// the watches delivered so far has been handled.
pub async fn run_with(
    client: kube::Client,
    shutdown: impl std::future::Future<Output = ()>,
    started: impl FnOnce(Arc<Kinds>),
) -> Result<(), SandboxError> {
    let mut b = Kinds::builder::<Ctx>(client.clone());
    register(&mut b);
    let (kinds, start) = b.build();
    let mut tasks = tokio::task::JoinSet::new();
    for informer in start.informers {
        tasks.spawn(informer);
    }
    tokio::pin!(shutdown);
    tokio::select! {
        _ = &mut shutdown => return Ok(()),
        r = kinds.ready() => r.map_err(|detail| SandboxError::Failed { what: "endpointslice watches", detail })?,
    }
    let ctx = Arc::new(Ctx {
        kinds: kinds.clone(),
        client,
    });
    let workers = start
        .workers
        .start(ctx)
        .await
        .map_err(|e| SandboxError::Failed {
            what: "endpointslice controller start",
            detail: e.to_string(),
        })?;
    for w in workers {
        tasks.spawn(w);
    }
    started(kinds);
    tracing::info!("EndpointSlice controller running");
    shutdown.await;
    tasks.abort_all();
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn svc(spec: Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "svc-uid", "labels": {"team": "a"}},
            "spec": spec,
        }))
        .unwrap()
    }

    /// A Service selecting `app=web` with a named and a numeric port.
    fn web(extra: Value) -> Service {
        let mut spec = json!({
            "selector": {"app": "web"},
            "clusterIP": "10.96.0.10",
            "ports": [
                {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
                {"name": "metrics", "port": 9090, "targetPort": 9100, "protocol": "TCP"},
            ],
        });
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        svc(spec)
    }

    /// A running, ready pod labelled `app=web` with `ips` and its `http` port on `http` (none if None).
    fn pod(name: &str, ips: &[&str], http: Option<i32>) -> Pod {
        let ports: Vec<Value> = http
            .map(|p| json!({"name": "http", "containerPort": p}))
            .into_iter()
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "labels": {"app": "web"}},
            "spec": {"nodeName": "node1", "containers": [{"name": "c", "ports": ports}]},
            "status": {
                "phase": "Running",
                "podIP": ips.first(),
                "podIPs": ips.iter().map(|i| json!({"ip": i})).collect::<Vec<_>>(),
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }))
        .unwrap()
    }

    fn set_ready(p: &mut Pod, ready: bool) {
        let c = &mut p.status.as_mut().unwrap().conditions.as_mut().unwrap()[0];
        c.status = if ready { "True" } else { "False" }.into();
    }

    fn terminating(p: &mut Pod) {
        p.metadata.deletion_timestamp =
            Some(serde_json::from_value(json!("2026-01-01T00:00:00Z")).unwrap());
    }

    /// What the API server does with a plan: names for new slices, replacements, deletions.
    fn apply(slices: &mut Vec<EndpointSlice>, plan: Plan, next: &mut u32) {
        for d in &plan.delete {
            let before = slices.len();
            slices.retain(|s| s.metadata.name != d.metadata.name);
            assert_eq!(slices.len(), before - 1, "deletes a slice that exists");
        }
        for u in plan.update {
            let at = slices
                .iter()
                .position(|s| s.metadata.name == u.metadata.name)
                .expect("updates a slice that exists");
            slices[at] = u;
        }
        for mut c in plan.create {
            *next += 1;
            let prefix = c.metadata.generate_name.take().unwrap();
            c.metadata.name = Some(format!("{prefix}{next:05}"));
            slices.push(c);
        }
    }

    fn converge(svc: Option<&Service>, pods: &[Pod], slices: &mut Vec<EndpointSlice>, max: usize) {
        let pods: Vec<&Pod> = pods.iter().collect();
        let mut next = slices.len() as u32 * 1000;
        let p = plan(svc, &pods, slices, max);
        apply(slices, p, &mut next);
        // The result is stable: nothing more to write (no write loop through the watch).
        let again = plan(svc, &pods, slices, max);
        assert!(again.is_empty(), "second plan writes: {again:?}");
    }

    fn of_family<'a>(
        slices: &'a [EndpointSlice],
        t: &'a str,
    ) -> impl Iterator<Item = &'a EndpointSlice> {
        slices.iter().filter(move |s| s.address_type == t)
    }

    fn names_in(s: &EndpointSlice) -> Vec<String> {
        let mut n: Vec<String> = endpoints_of(s).iter().map(|e| endpoint_key(e).1).collect();
        n.sort();
        n
    }

    fn ports_of(s: &EndpointSlice) -> Vec<(String, i32)> {
        let mut p: Vec<(String, i32)> = s
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone().unwrap(), p.port.unwrap()))
            .collect();
        p.sort();
        p
    }

    #[test]
    fn endpoint_conditions_follow_readiness_and_termination() {
        let s = web(json!({}));
        let cond = |p: &Pod, s: &Service| {
            let c = pod_endpoint(s, p, Family::V4).conditions.unwrap();
            (c.ready.unwrap(), c.serving.unwrap(), c.terminating.unwrap())
        };
        let mut p = pod("a", &["10.0.0.1"], Some(8080));
        assert_eq!(cond(&p, &s), (true, true, false));
        set_ready(&mut p, false);
        assert_eq!(cond(&p, &s), (false, false, false));
        set_ready(&mut p, true);
        terminating(&mut p);
        assert_eq!(cond(&p, &s), (false, true, true));
        let publish = web(json!({"publishNotReadyAddresses": true}));
        set_ready(&mut p, false);
        assert_eq!(cond(&p, &publish), (true, false, true));

        let ep = pod_endpoint(&s, &p, Family::V4);
        assert_eq!(ep.addresses, vec!["10.0.0.1".to_owned()]);
        assert_eq!(ep.node_name.as_deref(), Some("node1"));
        assert_eq!(ep.zone, None);
        let r = ep.target_ref.unwrap();
        assert_eq!(
            (
                r.kind.as_deref(),
                r.namespace.as_deref(),
                r.name.as_deref(),
                r.uid.as_deref()
            ),
            (Some("Pod"), Some("ns"), Some("a"), Some("uid-a"))
        );
    }

    #[test]
    fn named_ports_resolve_per_pod_into_separate_slices() {
        let s = web(json!({}));
        let pods = vec![
            pod("a", &["10.0.0.1"], Some(8080)),
            pod("b", &["10.0.0.2"], Some(8080)),
            pod("c", &["10.0.0.3"], Some(8081)),
            pod("d", &["10.0.0.4"], None),
        ];
        let mut slices = Vec::new();
        converge(Some(&s), &pods, &mut slices, 100);
        type Got = (Vec<(String, i32)>, Vec<String>);
        let mut got: Vec<Got> = slices.iter().map(|s| (ports_of(s), names_in(s))).collect();
        got.sort();
        let m = || ("metrics".to_owned(), 9100);
        assert_eq!(
            got,
            vec![
                (
                    vec![("http".into(), 8080), m()],
                    vec!["a".into(), "b".into()]
                ),
                (vec![("http".into(), 8081), m()], vec!["c".into()]),
                (vec![m()], vec!["d".into()]),
            ]
        );
        for sl in &slices {
            assert_eq!(sl.address_type, "IPv4");
            assert_eq!(sl.metadata.generate_name, None);
            assert!(sl.metadata.name.as_deref().unwrap().starts_with("web-"));
            let l = sl.metadata.labels.as_ref().unwrap();
            assert_eq!(l[LABEL_SERVICE_NAME], "web");
            assert_eq!(l[LABEL_MANAGED_BY], CONTROLLER_NAME);
            assert_eq!(l["team"], "a");
            assert!(!l.contains_key(LABEL_HEADLESS));
            let o = &sl.metadata.owner_references.as_ref().unwrap()[0];
            assert_eq!((o.kind.as_str(), o.uid.as_str()), ("Service", "svc-uid"));
            assert_eq!(
                (o.controller, o.block_owner_deletion),
                (Some(true), Some(true))
            );
        }
        // Pod c's container renamed its port: it moves to the slice of 8080.
        let mut pods = pods;
        pods[2] = pod("c", &["10.0.0.3"], Some(8080));
        converge(Some(&s), &pods, &mut slices, 100);
        let mut got: Vec<Vec<String>> = slices.iter().map(names_in).collect();
        got.sort();
        assert_eq!(got, vec![vec!["a", "b", "c"], vec!["d"]]);
    }

    #[test]
    fn families_make_one_slice_each() {
        let both = web(json!({"ipFamilies": ["IPv4", "IPv6"]}));
        assert_eq!(families(&both), [Family::V4, Family::V6].into());
        assert_eq!(
            families(&web(json!({"clusterIP": "fd00::10"}))),
            [Family::V6].into()
        );
        assert_eq!(families(&web(json!({}))), [Family::V4].into());
        assert_eq!(
            families(&web(json!({"clusterIP": "None"}))),
            [Family::V4, Family::V6].into()
        );
        let pods = vec![
            pod("a", &["10.0.0.1", "fd00::1"], Some(8080)),
            pod("b", &["10.0.0.2"], Some(8080)),
            pod("c", &["fd00::3"], Some(8080)),
        ];
        let mut slices = Vec::new();
        converge(Some(&both), &pods, &mut slices, 100);
        let v4: Vec<_> = of_family(&slices, "IPv4").map(names_in).collect();
        let v6: Vec<_> = of_family(&slices, "IPv6").map(names_in).collect();
        assert_eq!(v4, vec![vec!["a", "b"]]);
        assert_eq!(v6, vec![vec!["a", "c"]]);
        let v6_addr = &endpoints_of(of_family(&slices, "IPv6").next().unwrap())[0].addresses;
        assert_eq!(v6_addr, &vec!["fd00::1".to_owned()]);
        // Down to IPv4 only: the IPv6 slice goes.
        let v4only = web(json!({"ipFamilies": ["IPv4"]}));
        converge(Some(&v4only), &pods, &mut slices, 100);
        assert_eq!(of_family(&slices, "IPv6").count(), 0);
        assert_eq!(slices.len(), 1);
    }

    #[test]
    fn left_out_pods() {
        let s = web(json!({}));
        let mut done = pod("done", &["10.0.0.1"], Some(8080));
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let mut failed = pod("failed", &["10.0.0.2"], Some(8080));
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        let no_ip = pod("noip", &[], Some(8080));
        let mut other = pod("other", &["10.0.0.3"], Some(8080));
        other.metadata.labels = Some([("app".to_owned(), "db".to_owned())].into());
        let mut elsewhere = pod("elsewhere", &["10.0.0.4"], Some(8080));
        elsewhere.metadata.namespace = Some("other".into());
        let v6 = pod("v6", &["fd00::5"], Some(8080));
        let pods = [
            done,
            failed,
            no_ip,
            other,
            elsewhere,
            v6,
            pod("in", &["10.0.0.6"], Some(8080)),
        ];
        let g = desired(&s, &pods, Family::V4);
        let names: Vec<&str> = g
            .values()
            .flat_map(|g| g.endpoints.keys().map(|k| k.1.as_str()))
            .collect();
        assert_eq!(names, vec!["in"]);
    }

    #[test]
    fn no_endpoints_keep_one_empty_slice() {
        let s = web(json!({}));
        let mut slices = Vec::new();
        converge(Some(&s), &[], &mut slices, 100);
        assert_eq!(slices.len(), 1);
        assert!(endpoints_of(&slices[0]).is_empty());
        assert!(slices[0].ports.as_ref().unwrap().is_empty());
        let name = slices[0].metadata.name.clone();
        // The first pod goes into that slice rather than a new one.
        converge(
            Some(&s),
            &[pod("a", &["10.0.0.1"], Some(8080))],
            &mut slices,
            100,
        );
        assert_eq!(slices.len(), 1);
        assert_eq!(slices[0].metadata.name, name);
        assert_eq!(names_in(&slices[0]), vec!["a"]);
        assert_eq!(ports_of(&slices[0]).len(), 2);
    }

    #[test]
    fn over_max_splits_and_one_change_rewrites_one_slice() {
        let s = web(json!({}));
        let mut pods: Vec<Pod> = (0..250)
            .map(|i| {
                pod(
                    &format!("p{i:03}"),
                    &[&format!("10.0.{}.{}", i / 200, i % 200 + 1)],
                    Some(8080),
                )
            })
            .collect();
        let mut slices = Vec::new();
        converge(Some(&s), &pods, &mut slices, 100);
        let mut sizes: Vec<usize> = slices.iter().map(|s| endpoints_of(s).len()).collect();
        sizes.sort();
        assert_eq!(sizes, vec![50, 100, 100]);
        set_ready(&mut pods[7], false);
        let refs: Vec<&Pod> = pods.iter().collect();
        let p = plan(Some(&s), &refs, &slices, 100);
        assert_eq!((p.create.len(), p.update.len(), p.delete.len()), (0, 1, 0));
        // A pod gone and another added: the one slice with room takes it.
        pods.remove(3);
        pods.push(pod("new", &["10.9.0.1"], Some(8080)));
        converge(Some(&s), &pods, &mut slices, 100);
        assert_eq!(slices.len(), 3);
    }

    #[test]
    fn slices_go_without_selector_service_or_owner() {
        let s = web(json!({}));
        let pods = vec![pod("a", &["10.0.0.1"], Some(8080))];
        let mut slices = Vec::new();
        converge(Some(&s), &pods, &mut slices, 100);
        let no_selector = web(json!({"selector": null}));
        assert!(!manages(&no_selector));
        let p = plan(Some(&no_selector), &[], &slices, 100);
        assert_eq!(p.delete.len(), 1);
        let ext = web(json!({"type": "ExternalName", "externalName": "example.com"}));
        assert_eq!(plan(Some(&ext), &[], &slices, 100).delete.len(), 1);
        assert_eq!(plan(None, &[], &slices, 100).delete.len(), 1);
        // A Service of the same name created again: the old one's slice is replaced.
        let mut again = s.clone();
        again.metadata.uid = Some("svc-uid-2".into());
        let old = slices[0].metadata.name.clone();
        converge(Some(&again), &pods, &mut slices, 100);
        assert_eq!(slices.len(), 1);
        assert_ne!(slices[0].metadata.name, old);
        assert_eq!(
            slices[0].metadata.owner_references.as_ref().unwrap()[0].uid,
            "svc-uid-2"
        );
    }

    #[test]
    fn headless_without_ports() {
        let s =
            svc(json!({"selector": {"app": "web"}, "clusterIP": "None", "ipFamilies": ["IPv4"]}));
        let mut slices = Vec::new();
        converge(Some(&s), &[pod("a", &["10.0.0.1"], None)], &mut slices, 100);
        assert_eq!(slices.len(), 1);
        assert!(slices[0].ports.as_ref().unwrap().is_empty());
        assert_eq!(names_in(&slices[0]), vec!["a"]);
        assert_eq!(
            slices[0].metadata.labels.as_ref().unwrap()[LABEL_HEADLESS],
            ""
        );
    }

    #[test]
    fn labels_follow_the_service() {
        let s = web(json!({}));
        let pods = vec![pod("a", &["10.0.0.1"], Some(8080))];
        let mut slices = Vec::new();
        converge(Some(&s), &pods, &mut slices, 100);
        let mut relabelled = s.clone();
        relabelled.metadata.labels = Some([("team".to_owned(), "b".to_owned())].into());
        let refs: Vec<&Pod> = pods.iter().collect();
        let p = plan(Some(&relabelled), &refs, &slices, 100);
        assert_eq!(p.update.len(), 1);
        assert_eq!(p.update[0].metadata.labels.as_ref().unwrap()["team"], "b");
    }

    fn slice_at(rv: &str) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "web-x", "namespace": "ns", "resourceVersion": rv,
                         "labels": {LABEL_SERVICE_NAME: "web", LABEL_MANAGED_BY: CONTROLLER_NAME}},
            "addressType": "IPv4",
        }))
        .unwrap()
    }

    /// The pod relation on the framework's stores, fed with no API server: a pod maps to the Services of its
    /// namespace whose selector it matches.
    #[tokio::test]
    async fn a_pod_relates_to_the_services_selecting_it() {
        // Never contacted: the kinds are fed.
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap()))
                .unwrap();
        let mut b = Kinds::builder::<Ctx>(client);
        register(&mut b);
        let (kinds, _start, feed) = b.build_fed();
        let mut other = web(json!({"selector": {"app": "other"}}));
        other.metadata.name = Some("other".into());
        let mut elsewhere = web(json!({}));
        elsewhere.metadata.namespace = Some("ns2".into());
        feed.list([web(json!({})), other, elsewhere]);
        feed.list_rest();
        let names = |keys: Vec<Key<Service>>| -> Vec<String> {
            keys.iter().map(|k| k.as_str().to_owned()).collect()
        };
        let p = pod("a", &["10.16.0.5"], Some(8080));
        assert_eq!(names(services_selecting(&kinds, &p)), ["ns/web"]);
        let mut unlabelled = p.clone();
        unlabelled.metadata.labels = None;
        assert!(services_selecting(&kinds, &unlabelled).is_empty());
        assert!(kinds
            .get(&Key::<Service>::namespaced("ns", "other"))
            .is_some());
    }

    #[test]
    fn own_writes_win_over_older_store_versions() {
        let stored = |rv: &str| vec![Arc::new(slice_at(rv))];
        let rv_of = |v: &[EndpointSlice]| -> Vec<String> {
            v.iter()
                .map(|s| s.metadata.resource_version.clone().unwrap())
                .collect()
        };
        let mut written = HashMap::new();
        // Written at 2 while the store still has 1 (the write's echo has not come): the write is seen.
        written.insert("web-x".to_owned(), Written::At(Arc::new(slice_at("2"))));
        assert_eq!(rv_of(&overlay(stored("1"), &mut written)), ["2"]);
        assert_eq!(written.len(), 1);
        // The echo came: the store's, and the entry goes.
        assert_eq!(rv_of(&overlay(stored("2"), &mut written)), ["2"]);
        assert!(written.is_empty());
        // Someone else's later change goes through.
        written.insert("web-x".to_owned(), Written::At(Arc::new(slice_at("2"))));
        assert_eq!(rv_of(&overlay(stored("3"), &mut written)), ["3"]);
        assert!(written.is_empty());
        // Created here, not in the store yet.
        written.insert("web-x".to_owned(), Written::At(Arc::new(slice_at("4"))));
        assert_eq!(rv_of(&overlay(vec![], &mut written)), ["4"]);
        written.clear();
        // Deleted here at 3: the store's 3 is not seen; once the store lost it, the entry goes.
        written.insert("web-x".to_owned(), Written::Deleted(Some("3".into())));
        assert!(overlay(stored("3"), &mut written).is_empty());
        assert_eq!(written.len(), 1);
        assert!(overlay(vec![], &mut written).is_empty());
        assert!(written.is_empty());
    }

    /// One generated pod: labels selected or not, its addresses, readiness, phase, termination and the
    /// port number its container names `http` (if any).
    #[derive(Debug, Clone)]
    struct Gen {
        selected: bool,
        v4: bool,
        v6: bool,
        ready: bool,
        phase: &'static str,
        terminating: bool,
        http: Option<i32>,
    }

    fn gen_pod() -> impl Strategy<Value = Gen> {
        (
            prop::bool::weighted(0.8),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            prop::sample::select(vec!["Running", "Running", "Pending", "Succeeded", "Failed"]),
            prop::bool::weighted(0.2),
            prop::option::of(8080..8083i32),
        )
            .prop_map(|(selected, v4, v6, ready, phase, terminating, http)| Gen {
                selected,
                v4,
                v6,
                ready,
                phase,
                terminating,
                http,
            })
    }

    fn make(pods: &[Gen]) -> Vec<Pod> {
        pods.iter()
            .enumerate()
            .map(|(i, g)| {
                let v4 = format!("10.0.{}.{}", i / 250, i % 250 + 1);
                let v6 = format!("fd00::{:x}", i + 1);
                let mut ips: Vec<&str> = Vec::new();
                if g.v4 {
                    ips.push(&v4);
                }
                if g.v6 {
                    ips.push(&v6);
                }
                let mut p = pod(&format!("p{i}"), &ips, g.http);
                if !g.selected {
                    p.metadata.labels = Some([("app".to_owned(), "other".to_owned())].into());
                }
                set_ready(&mut p, g.ready);
                p.status.as_mut().unwrap().phase = Some(g.phase.into());
                if g.terminating {
                    terminating(&mut p);
                }
                p
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// From any earlier state, one plan brings the slices to: every selected, non-terminal pod with an
        /// address of a family exactly once among that family's slices, in a slice whose ports are the ones
        /// it resolves, with its current conditions; no other endpoint; at most `max` a slice; and a second
        /// plan writes nothing.
        #[test]
        fn every_pod_once_per_family_and_port_set(
            before in prop::collection::vec(gen_pod(), 0..30),
            after in prop::collection::vec(gen_pod(), 0..30),
            fams in prop::sample::select(vec![vec!["IPv4"], vec!["IPv6"], vec!["IPv4", "IPv6"]]),
            publish in any::<bool>(),
            max in 1usize..6,
        ) {
            let s = web(json!({"ipFamilies": fams, "publishNotReadyAddresses": publish}));
            let mut slices = Vec::new();
            converge(Some(&s), &make(&before), &mut slices, max);
            let pods = make(&after);
            converge(Some(&s), &pods, &mut slices, max);
            for f in families(&s) {
                let mine: Vec<&EndpointSlice> = of_family(&slices, f.address_type()).collect();
                let mut seen: BTreeMap<EndpointKey, usize> = BTreeMap::new();
                for sl in &mine {
                    prop_assert!(endpoints_of(sl).len() <= max);
                    prop_assert_eq!(sl.metadata.labels.as_ref(), Some(&slice_labels(&s)));
                    for ep in endpoints_of(sl) {
                        *seen.entry(endpoint_key(ep)).or_default() += 1;
                        let p = pods.iter().find(|p| p.metadata.name.as_deref() == Some(endpoint_key(ep).1.as_str()));
                        let p = p.expect("an endpoint of a pod that exists");
                        prop_assert_eq!(port_key(sl.ports.as_deref().unwrap()), port_key(&endpoint_ports(&s, p)));
                        prop_assert_eq!(ep, &pod_endpoint(&s, p, f));
                    }
                }
                for (p, g) in pods.iter().zip(&after) {
                    let has = match f { Family::V4 => g.v4, Family::V6 => g.v6 };
                    let expected = g.selected && has && !matches!(g.phase, "Succeeded" | "Failed");
                    let key = (p.metadata.namespace.clone().unwrap(), p.metadata.name.clone().unwrap(), p.metadata.uid.clone().unwrap());
                    prop_assert_eq!(seen.get(&key).copied().unwrap_or(0), usize::from(expected), "pod {:?} in {}", g, f.address_type());
                }
            }
            let wanted = families(&s);
            prop_assert!(slices.iter().all(|sl| Family::from_address_type(&sl.address_type).is_some_and(|f| wanted.contains(&f))));
        }
    }
}
