//! IP records (`ips.kubeovn.io`): one per pod network and per node port, named like the port.
//!
//! The records the controller writes carry `ovn.kubernetes.io/ip_reserved=false` (as Kube-OVN's do since
//! 1.13); any other record is a user's reservation: never garbage collected, its address kept reserved.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kubeovn_ipam::{Addresses, Allocation, Mac, SharedIpam};

use super::error::{ControllerError, Result};
use super::Ctx;
use crate::crd::{IPSpec, IP};

/// Label of a record: `false` on those the controller writes for a pod or a node.
pub(crate) const RESERVED_LABEL: &str = "ovn.kubernetes.io/ip_reserved";
/// Label naming a record's subnet.
const SUBNET_LABEL: &str = "ovn.kubernetes.io/subnet";

pub(crate) fn api(ctx: &Ctx) -> Api<IP> {
    Api::all(ctx.client.clone())
}

/// What an IP record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IpRecord {
    pub name: String,
    pub subnet: String,
    pub namespace: String,
    pub pod: String,
    pub node: String,
    pub addrs: Addresses,
    pub pod_type: String,
}

impl IpRecord {
    fn spec(&self) -> IPSpec {
        let ips: Vec<String> = self.addrs.ips().map(|i| i.to_string()).collect();
        IPSpec {
            pod_name: self.pod.clone(),
            namespace: self.namespace.clone(),
            subnet: self.subnet.clone(),
            attach_subnets: Vec::new(),
            node_name: self.node.clone(),
            ip_address: ips.join(","),
            v4_ip_address: self.addrs.v4.map(|a| a.to_string()).unwrap_or_default(),
            v6_ip_address: self.addrs.v6.map(|a| a.to_string()).unwrap_or_default(),
            attach_ips: Vec::new(),
            mac_address: self.addrs.mac.to_string(),
            attach_macs: Vec::new(),
            container_id: String::new(),
            pod_type: self.pod_type.clone(),
        }
    }

    fn object(&self) -> IP {
        let mut labels = BTreeMap::new();
        labels.insert("ovn.kubernetes.io/subnet".to_owned(), self.subnet.clone());
        labels.insert(self.subnet.clone(), String::new());
        labels.insert(RESERVED_LABEL.to_owned(), "false".to_owned());
        if !self.node.is_empty() {
            labels.insert("ovn.kubernetes.io/node-name".to_owned(), self.node.clone());
        }
        let mut o = IP::new(&self.name, self.spec());
        o.metadata.labels = Some(labels);
        o
    }

    fn from_object(o: &IP) -> Option<IpRecord> {
        Self::from_spec(o.metadata.name.clone()?, &o.spec)
    }

    fn from_spec(name: String, spec: &IPSpec) -> Option<IpRecord> {
        let (v4, v6) = spec_ips(spec);
        Some(IpRecord {
            name,
            subnet: spec.subnet.clone(),
            namespace: spec.namespace.clone(),
            pod: spec.pod_name.clone(),
            node: spec.node_name.clone(),
            addrs: Addresses {
                v4,
                v6,
                mac: spec.mac_address.parse().ok()?,
            },
            pod_type: spec.pod_type.clone(),
        })
    }
}

/// The addresses a spec names, in `ipAddress` or the per-family fields.
fn spec_ips(spec: &IPSpec) -> (Option<Ipv4Addr>, Option<Ipv6Addr>) {
    let (mut v4, mut v6) = (None, None);
    for ip in spec
        .ip_address
        .split(',')
        .chain([spec.v4_ip_address.as_str(), spec.v6_ip_address.as_str()])
    {
        match ip.trim().parse::<IpAddr>() {
            Ok(IpAddr::V4(a)) => v4 = Some(a),
            Ok(IpAddr::V6(a)) => v6 = Some(a),
            // Empty fields are the usual case; a malformed address is said, not dropped in silence.
            Err(e) if !ip.trim().is_empty() => {
                tracing::warn!(address = ip, error = %e, "IP record address ignored: not an IP address")
            }
            Err(_) => {}
        }
    }
    (v4, v6)
}

/// An IP record as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    pub name: String,
    pub subnet: String,
    /// The pod's namespace (empty for a node's record or a reservation not bound to a pod).
    pub namespace: String,
    /// The pod, or the node for a node's record.
    pub pod: String,
    /// The addresses (no MAC: a reservation may name none).
    pub v4: Option<Ipv4Addr>,
    pub v6: Option<Ipv6Addr>,
    pub mac: Option<Mac>,
    /// Whether the controller wrote it for a pod or a node; else it is a reservation, left alone.
    pub ours: bool,
}

impl Listed {
    fn new(name: String, labels: Option<&BTreeMap<String, String>>, spec: &IPSpec) -> Self {
        let (v4, v6) = spec_ips(spec);
        Listed {
            name,
            subnet: spec.subnet.clone(),
            namespace: spec.namespace.clone(),
            pod: spec.pod_name.clone(),
            v4,
            v6,
            mac: spec.mac_address.parse().ok(),
            ours: is_ours(labels),
        }
    }

    /// The owner key used in the allocator: `namespace/pod`, or the record's name (node ports, reservations
    /// not bound to a pod).
    pub fn owner(&self) -> String {
        if self.namespace.is_empty() {
            self.name.clone()
        } else {
            crate::naming::pod_key(&self.namespace, &self.pod)
        }
    }

    /// The allocator record; None if it names no subnet or no address.
    pub fn allocation(&self) -> Option<Allocation> {
        if self.subnet.is_empty() || (self.v4.is_none() && self.v6.is_none()) {
            return None;
        }
        Some(Allocation {
            subnet: self.subnet.clone(),
            pod: self.owner(),
            nic: self.name.clone(),
            v4: self.v4,
            v6: self.v6,
            mac: self.mac,
            pool: None,
        })
    }
}

/// Whether a record's labels say the controller wrote it: `ip_reserved=false`, or no `ip_reserved` label
/// but the subnet label (records written before the mark existed, by this controller or Kube-OVN < 1.13).
fn is_ours(labels: Option<&BTreeMap<String, String>>) -> bool {
    let get = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    match get(RESERVED_LABEL) {
        Some(v) => v == "false",
        None => get(SUBNET_LABEL).is_some(),
    }
}

/// Every IP record (an absent IP CRD gives none). Decoded as the typed CRD, not as JSON values: at start
/// this lists one record per pod.
pub(crate) async fn list_records(client: &kube::Client) -> Result<Vec<Listed>> {
    let api: Api<IP> = Api::all(client.clone());
    let mut out = Vec::new();
    let mut lp = ListParams::default().limit(10_000);
    loop {
        let page = match api.list(&lp).await {
            Ok(p) => p,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(out),
            Err(e) => return Err(ControllerError::kube("list ips", e)),
        };
        out.extend(page.items.iter().filter_map(|ip| {
            Some(Listed::new(
                ip.metadata.name.clone()?,
                ip.metadata.labels.as_ref(),
                &ip.spec,
            ))
        }));
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => return Ok(out),
        }
    }
}

/// The reservations the allocator should hold, by record name: applied when seen, re-applied when their
/// subnet is (re)loaded (one created before its subnet waits for it), released when their record goes,
/// including records that vanished while the watch was away (a re-list sends no delete for them).
#[derive(Debug, Default)]
pub(crate) struct Reservations {
    wanted: HashMap<String, Allocation>,
    /// Records seen since the watch's (re-)list began; None outside a re-list.
    seen: Option<HashSet<String>>,
}

impl Reservations {
    /// Records a reservation the rebuild restored, so a delete missed before the watch's first list still
    /// releases it.
    pub fn restored(&mut self, name: &str, a: Allocation) {
        self.wanted.insert(name.to_owned(), a);
    }

    /// A record created or modified: its old reservation (if it names other addresses) released, the new
    /// one taken. Returns the subnets where addresses were freed.
    pub fn set(
        &mut self,
        ipam: &SharedIpam,
        name: &str,
        a: Allocation,
        keep: &dyn Fn(&Allocation) -> bool,
    ) -> Vec<String> {
        if let Some(s) = &mut self.seen {
            s.insert(name.to_owned());
        }
        let mut freed = Vec::new();
        match self.wanted.insert(name.to_owned(), a.clone()) {
            Some(old) if old != a => freed.extend(release(ipam, &old, keep)),
            _ => {}
        }
        reserve(ipam, name, &a, true);
        freed
    }

    /// A record deleted (or no longer a reservation): its addresses released. Returns the subnet freed.
    pub fn remove(
        &mut self,
        ipam: &SharedIpam,
        name: &str,
        keep: &dyn Fn(&Allocation) -> bool,
    ) -> Option<String> {
        if let Some(s) = &mut self.seen {
            s.insert(name.to_owned());
        }
        release(ipam, &self.wanted.remove(name)?, keep)
    }

    /// The watch (re-)lists: records not seen until [`Reservations::listed`] are gone.
    pub fn listing(&mut self) {
        self.seen = Some(HashSet::new());
    }

    /// The (re-)list is complete: releases the reservations of records it did not show. Returns the subnets
    /// where addresses were freed.
    pub fn listed(&mut self, ipam: &SharedIpam, keep: &dyn Fn(&Allocation) -> bool) -> Vec<String> {
        let Some(seen) = self.seen.take() else {
            return Vec::new();
        };
        let gone: Vec<String> = self
            .wanted
            .keys()
            .filter(|n| !seen.contains(*n))
            .cloned()
            .collect();
        gone.iter()
            .filter_map(|n| release(ipam, &self.wanted.remove(n)?, keep))
            .collect()
    }

    /// A subnet was loaded: takes its reservations (again: a reload after a delete or a fix starts empty;
    /// one held already is kept). Called before pods can see the subnet, so none is given a reserved address.
    pub fn subnet_loaded(&self, ipam: &SharedIpam, subnet: &str) {
        for (name, a) in self.wanted.iter().filter(|(_, a)| a.subnet == subnet) {
            // A refusal was warned of when the record was seen; not again at each subnet update.
            reserve(ipam, name, a, false);
        }
    }
}

/// Takes a reservation's addresses under the subnet's lock, like a pod's static address; one whose subnet is
/// not loaded waits for it ([`Reservations::subnet_loaded`]). A refusal is warned of if `loud`.
fn reserve(ipam: &SharedIpam, name: &str, a: &Allocation, loud: bool) {
    let ips: Vec<IpAddr> =
        a.v4.map(IpAddr::V4)
            .into_iter()
            .chain(a.v6.map(IpAddr::V6))
            .collect();
    let mut req = kubeovn_ipam::AllocRequest::new(&a.pod, &a.nic).static_ips(&ips);
    if let Some(m) = a.mac {
        req = req.mac(m);
    }
    match ipam.allocate(&a.subnet, &req) {
        Ok(_) => {}
        Err(kubeovn_ipam::IpamError::NoSuchSubnet { .. }) => {
            tracing::debug!(ip = %name, subnet = %a.subnet, "reservation waits for its subnet")
        }
        Err(e) if loud => {
            tracing::warn!(ip = %name, subnet = %a.subnet, error = %e, "reservation refused")
        }
        Err(e) => {
            tracing::debug!(ip = %name, subnet = %a.subnet, error = %e, "reservation refused")
        }
    }
}

/// Releases a reservation unless `keep` says a live pod uses it; returns its subnet if addresses were freed.
fn release(
    ipam: &SharedIpam,
    a: &Allocation,
    keep: &dyn Fn(&Allocation) -> bool,
) -> Option<String> {
    if keep(a) {
        return None;
    }
    match ipam.release(&a.subnet, &a.pod, &a.nic) {
        Ok(Some(_)) => Some(a.subnet.clone()),
        _ => None,
    }
}

/// Whether a reservation is the allocation of a live pod's own port (a record named like the port): it
/// stays that pod's until the pod goes. Any other reservation is held apart from the pod's addresses.
pub(crate) fn held_by_live_pod(ctx: &Ctx, a: &Allocation) -> bool {
    let (ns, pod) = super::split_key(&a.pod);
    !ns.is_empty()
        && a.nic == crate::naming::pod_port(pod, ns, crate::annotations::DEFAULT_PROVIDER)
        && ctx.pods.contains(ns, pod)
}

/// Keeps the reservations users create, modify and delete while the controller runs in the allocator (those
/// there at start were restored by the rebuild): an address reserved is never handed to a pod, one
/// unreserved serves the pods waiting for one. Watches only records not labelled as the controller's.
pub(crate) async fn watch_reservations(ctx: std::sync::Arc<Ctx>) {
    use futures::StreamExt;
    use kube::runtime::watcher::{self, Event};
    use kube::runtime::WatchStreamExt;

    let api: Api<IP> = Api::all(ctx.client.clone());
    let selector = format!("{RESERVED_LABEL}!=false");
    let stream = watcher::watcher(
        api,
        watcher::Config::default().labels(&selector).any_semantic(),
    )
    .default_backoff();
    futures::pin_mut!(stream);
    let keep = |a: &Allocation| held_by_live_pod(&ctx, a);
    while let Some(ev) = stream.next().await {
        let (ip, apply) = match ev {
            Ok(Event::Apply(ip)) | Ok(Event::InitApply(ip)) => (ip, true),
            Ok(Event::Delete(ip)) => (ip, false),
            Ok(Event::Init) => {
                ctx.reservations().listing();
                continue;
            }
            Ok(Event::InitDone) => {
                let freed = ctx.reservations().listed(&ctx.ipam, &keep);
                for s in freed {
                    super::pod::wake(&ctx, &s);
                }
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "watch ip reservations");
                continue;
            }
        };
        let Some(name) = ip.metadata.name.clone() else {
            continue;
        };
        let r = Listed::new(name, ip.metadata.labels.as_ref(), &ip.spec);
        // Records of the controller written before its label existed match the selector too; one the
        // controller took over, or that names no address any more, is no longer a reservation.
        let a = r.allocation().filter(|_| apply && !r.ours);
        let freed = match a {
            Some(a) => ctx.reservations().set(&ctx.ipam, &r.name, a, &keep),
            None => ctx
                .reservations()
                .remove(&ctx.ipam, &r.name, &keep)
                .into_iter()
                .collect(),
        };
        for s in freed {
            super::pod::wake(&ctx, &s);
        }
    }
}

/// Creates the record, or replaces it if it says something else.
pub(crate) async fn ensure(ctx: &Ctx, rec: &IpRecord) -> Result<()> {
    let api = api(ctx);
    let obj = rec.object();
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let cur = api
                .get(&rec.name)
                .await
                .map_err(|e| ControllerError::kube(format!("get ip {}", rec.name), e))?;
            if IpRecord::from_object(&cur).as_ref() == Some(rec) {
                return Ok(());
            }
            let mut new = obj;
            new.metadata.resource_version = cur.metadata.resource_version.clone();
            api.replace(&rec.name, &PostParams::default(), &new)
                .await
                .map(|_| ())
                .map_err(|e| ControllerError::kube(format!("replace ip {}", rec.name), e))
        }
        Err(e) => Err(ControllerError::kube(format!("create ip {}", rec.name), e)),
    }
}

/// Deletes a record (gone already is fine).
pub(crate) async fn delete(ctx: &Ctx, name: &str) -> Result<()> {
    match api(ctx).delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(ControllerError::kube(format!("delete ip {name}"), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_the_controllers_records_from_reservations() {
        let l = |kv: &[(&str, &str)]| {
            let m: BTreeMap<String, String> = kv
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            is_ours(Some(&m))
        };
        assert!(l(&[(RESERVED_LABEL, "false")]));
        assert!(!l(&[(RESERVED_LABEL, "true")]));
        assert!(!l(&[(RESERVED_LABEL, "true"), (SUBNET_LABEL, "s")]));
        // Written before the mark existed.
        assert!(l(&[(SUBNET_LABEL, "s"), ("s", "")]));
        // A user's record as Kube-OVN's docs write it.
        assert!(!l(&[]) && !is_ours(None));
        let rec = IpRecord {
            name: "p.ns".into(),
            subnet: "s".into(),
            namespace: "ns".into(),
            pod: "p".into(),
            node: String::new(),
            addrs: Addresses {
                v4: Some(Ipv4Addr::new(10, 0, 0, 2)),
                v6: None,
                mac: "00:00:00:00:00:01".parse().expect("mac"),
            },
            pod_type: String::new(),
        };
        assert!(is_ours(rec.object().metadata.labels.as_ref()));
    }

    fn reservation(name: &str, subnet: &str, ip: &str) -> Allocation {
        Listed {
            name: name.into(),
            subnet: subnet.into(),
            namespace: String::new(),
            pod: String::new(),
            v4: Some(ip.parse().expect("ip")),
            v6: None,
            mac: None,
            ours: false,
        }
        .allocation()
        .expect("allocation")
    }

    fn held(ipam: &SharedIpam, ip: &str) -> Option<String> {
        ipam.owner(ip.parse().expect("ip")).map(|a| a.nic)
    }

    /// Loads subnet `name`, `{prefix}.0.0/24`.
    fn load(ipam: &SharedIpam, name: &str, prefix: &str) {
        ipam.add_or_update_subnet(&kubeovn_ipam::SubnetSpec::new(
            name,
            format!("{prefix}.0.0/24"),
            format!("{prefix}.0.1"),
        ))
        .expect("subnet");
    }

    const KEEP_NONE: &dyn Fn(&Allocation) -> bool = &|_| false;

    /// A user's IP record `name` reserving `ip` in `subnet`, labelled `ip_reserved=<reserved>` if given.
    fn user_record(name: &str, subnet: &str, ip: &str, reserved: Option<&str>) -> IP {
        let mut o = IP::new(
            name,
            IPSpec {
                subnet: subnet.into(),
                ip_address: ip.into(),
                ..IPSpec::default()
            },
        );
        o.metadata.labels =
            reserved.map(|v| BTreeMap::from([(RESERVED_LABEL.to_owned(), v.to_owned())]));
        o
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_users_record_holds_its_address_against_pods_until_it_goes() {
        use crate::annotations::IP_ADDRESS;
        use crate::controller::framework::Key;
        use crate::controller::pod::Pods;
        use crate::controller::testing::{pod, Harness};

        let h = Harness::start().await;
        h.spawn(watch_reservations(h.ctx.clone()));
        let ips: Api<IP> = Api::all(h.client.clone());
        let pp = PostParams::default();
        // No label (Kube-OVN's documented reservation) and `ip_reserved=true`: reservations. One labelled
        // `false` is the controller's own record, not a reservation.
        for (name, ip, label) in [
            ("keep", "10.16.0.50", None),
            ("keep-too", "10.16.0.51", Some("true")),
            ("ours", "10.16.0.52", Some("false")),
        ] {
            ips.create(&pp, &user_record(name, "ovn-default", ip, label))
                .await
                .expect("create ip");
        }
        h.until("reservations held", || {
            h.holder("10.16.0.50").as_deref() == Some("keep")
                && h.holder("10.16.0.51").as_deref() == Some("keep-too")
        })
        .await;
        assert_eq!(h.holder("10.16.0.52"), None);

        // A pod asking for a reserved address is refused (no blind retries: the release wakes it).
        h.create_pod(&pod("default", "a", &[(IP_ADDRESS, "10.16.0.50")], None))
            .await;
        let e = h
            .run::<Pods>(Key::namespaced("default", "a"))
            .await
            .expect_err("reserved");
        assert!(e.is_permanent(), "{e}");
        assert_eq!(h.holder("10.16.0.50").as_deref(), Some("keep"));

        // The record goes: the address is free, the pod woken and given it.
        ips.delete("keep", &DeleteParams::default())
            .await
            .expect("delete");
        h.until("reservation released", || h.holder("10.16.0.50").is_none())
            .await;
        assert!(h
            .ctx
            .waiting
            .of("ovn-default")
            .contains(&"default/a".to_owned()));
        h.run::<Pods>(Key::namespaced("default", "a"))
            .await
            .expect("served");
        assert_eq!(h.holder("10.16.0.50").as_deref(), Some("a.default"));
        assert_eq!(h.holder("10.16.0.51").as_deref(), Some("keep-too"));
    }

    /// Kube-OVN's way to fix a pod's address ahead: a record named like the pod's port, naming the pod. The
    /// pod gets that address; the controller then owns the record, and the address goes with the pod.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reservation_named_like_a_pods_port_gives_the_pod_its_address() {
        use crate::annotations::IP_ADDRESS;
        use crate::controller::framework::Key;
        use crate::controller::pod::Pods;
        use crate::controller::testing::{pod, Harness};

        let h = Harness::start().await;
        h.spawn(watch_reservations(h.ctx.clone()));
        let ips: Api<IP> = Api::all(h.client.clone());
        let mut r = user_record("a.default", "ovn-default", "10.16.0.120", None);
        r.spec.namespace = "default".into();
        r.spec.pod_name = "a".into();
        ips.create(&PostParams::default(), &r)
            .await
            .expect("create ip");
        h.until("reserved", || {
            h.holder("10.16.0.120").as_deref() == Some("a.default")
        })
        .await;

        let key = Key::namespaced("default", "a");
        h.create_pod(&pod("default", "a", &[], None)).await;
        h.run::<Pods>(key.clone()).await.expect("run");
        let p: crate::controller::PodInfo = h.get_in("default", "a").await.expect("pod");
        assert_eq!(
            p.annotation_map().get(IP_ADDRESS).map(String::as_str),
            Some("10.16.0.120")
        );
        // The record is the controller's now (the watch drops it as a reservation, the pod keeps it).
        let rec = ips.get("a.default").await.expect("record");
        assert!(is_ours(rec.metadata.labels.as_ref()));
        // A later record, seen after the take-over, shows the watch handled it.
        ips.create(
            &PostParams::default(),
            &user_record("probe", "ovn-default", "10.16.0.121", None),
        )
        .await
        .expect("probe");
        h.until("probe", || {
            h.holder("10.16.0.121").as_deref() == Some("probe")
        })
        .await;
        assert_eq!(h.holder("10.16.0.120").as_deref(), Some("a.default"));

        // The pod goes: its record and address with it.
        Api::<crate::controller::PodInfo>::namespaced(h.client.clone(), "default")
            .delete("a", &DeleteParams::default())
            .await
            .expect("delete pod");
        h.gone(&key).await;
        h.run::<Pods>(key).await.expect("cleanup");
        assert!(ips.get_opt("a.default").await.expect("get").is_none());
        assert_eq!(h.holder("10.16.0.120"), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reservation_moved_or_dropped_frees_its_address_for_waiting_pods() {
        use crate::annotations::LOGICAL_SWITCH;
        use crate::controller::framework::Key;
        use crate::controller::pod::Pods;
        use crate::controller::subnet::Subnets;
        use crate::controller::testing::{pod, Harness};
        use crate::crd::{Decoded, Subnet, SubnetSpec};

        let h = Harness::start().await;
        // One free address, 10.72.0.2, reserved before any pod asks.
        let s = Subnet::new(
            "small",
            SubnetSpec {
                cidr_block: "10.72.0.0/29".into(),
                exclude_ips: vec!["10.72.0.3..10.72.0.6".into()],
                ..SubnetSpec::default()
            },
        );
        let s = Api::<Subnet>::all(h.client.clone())
            .create(&PostParams::default(), &s)
            .await
            .expect("subnet");
        h.stored(&Decoded::new(s)).await;
        h.run::<Subnets>(Key::cluster("small"))
            .await
            .expect("subnet");
        h.spawn(watch_reservations(h.ctx.clone()));
        let ips: Api<IP> = Api::all(h.client.clone());
        ips.create(
            &PostParams::default(),
            &user_record("r", "small", "10.72.0.2", None),
        )
        .await
        .expect("create ip");
        h.until("reserved", || h.holder("10.72.0.2").as_deref() == Some("r"))
            .await;

        // The subnet is full for pods: the pod waits.
        let key = Key::namespaced("default", "p");
        h.create_pod(&pod("default", "p", &[(LOGICAL_SWITCH, "small")], None))
            .await;
        let e = h.run::<Pods>(key.clone()).await.expect_err("full");
        assert!(!e.is_permanent(), "{e}");
        assert_eq!(h.ctx.waiting.of("small"), vec!["default/p".to_owned()]);

        // Moved to the default subnet: its old address is freed and serves the pod.
        let mut moved = ips.get("r").await.expect("get");
        moved.spec.subnet = "ovn-default".into();
        moved.spec.ip_address = "10.16.0.99".into();
        ips.replace("r", &PostParams::default(), &moved)
            .await
            .expect("replace");
        h.until("moved", || {
            h.holder("10.72.0.2").is_none() && h.holder("10.16.0.99").as_deref() == Some("r")
        })
        .await;
        h.run::<Pods>(key).await.expect("served");
        assert_eq!(h.holder("10.72.0.2").as_deref(), Some("p.default"));
        assert!(h.ctx.waiting.of("small").is_empty());

        // Dropped: freed.
        ips.delete("r", &DeleteParams::default())
            .await
            .expect("delete");
        h.until("released", || h.holder("10.16.0.99").is_none())
            .await;
    }

    #[test]
    fn a_relist_releases_reservations_deleted_while_away() {
        let ipam = SharedIpam::new();
        load(&ipam, "s", "10.0");
        let mut r = Reservations::default();
        // One restored at start, one seen by the watch; both deleted while the watch was away.
        let a = reservation("a", "s", "10.0.0.5");
        ipam.restore([a.clone()]);
        r.restored("a", a);
        r.set(&ipam, "b", reservation("b", "s", "10.0.0.6"), KEEP_NONE);
        r.set(&ipam, "c", reservation("c", "s", "10.0.0.7"), KEEP_NONE);
        assert_eq!(held(&ipam, "10.0.0.5").as_deref(), Some("a"));
        assert_eq!(held(&ipam, "10.0.0.6").as_deref(), Some("b"));

        r.listing();
        r.set(&ipam, "c", reservation("c", "s", "10.0.0.7"), KEEP_NONE);
        assert_eq!(r.listed(&ipam, KEEP_NONE), vec!["s".to_owned(); 2]);
        assert_eq!(held(&ipam, "10.0.0.5"), None);
        assert_eq!(held(&ipam, "10.0.0.6"), None);
        assert_eq!(held(&ipam, "10.0.0.7").as_deref(), Some("c"));
        // A later delete of a record never seen again frees nothing twice.
        assert_eq!(r.remove(&ipam, "a", KEEP_NONE), None);
        assert_eq!(r.remove(&ipam, "c", KEEP_NONE).as_deref(), Some("s"));
    }

    #[test]
    fn a_reservation_waits_for_its_subnet_and_follows_its_record() {
        let ipam = SharedIpam::new();
        let mut r = Reservations::default();
        assert!(r
            .set(&ipam, "a", reservation("a", "s", "10.0.0.5"), KEEP_NONE)
            .is_empty());
        assert_eq!(held(&ipam, "10.0.0.5"), None);
        load(&ipam, "s", "10.0");
        r.subnet_loaded(&ipam, "s");
        assert_eq!(held(&ipam, "10.0.0.5").as_deref(), Some("a"));
        // Loaded again (an update): kept, not duplicated.
        r.subnet_loaded(&ipam, "s");
        assert_eq!(ipam.stats("s").expect("stats").v4.using, 1);

        // Modified to another address, then to another subnet (not loaded): the old one freed each time.
        assert_eq!(
            r.set(&ipam, "a", reservation("a", "s", "10.0.0.9"), KEEP_NONE),
            vec!["s".to_owned()]
        );
        assert_eq!(held(&ipam, "10.0.0.5"), None);
        assert_eq!(held(&ipam, "10.0.0.9").as_deref(), Some("a"));
        r.set(&ipam, "a", reservation("a", "t", "10.1.0.9"), KEEP_NONE);
        assert_eq!(held(&ipam, "10.0.0.9"), None);
        load(&ipam, "t", "10.1");
        r.subnet_loaded(&ipam, "t");
        assert_eq!(held(&ipam, "10.1.0.9").as_deref(), Some("a"));
        // The pod-port rule: kept while `keep` says a live pod uses it.
        assert_eq!(r.remove(&ipam, "a", &|_| true), None);
        assert_eq!(held(&ipam, "10.1.0.9").as_deref(), Some("a"));
    }
}
