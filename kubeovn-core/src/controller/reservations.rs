//! Users' reservations (IP records the controller did not write) as the allocator must hold them: applied
//! when seen, re-applied when their subnet is (re)loaded (one created before its subnet waits for it),
//! released when their record goes. Plain data over the allocator: the reservation kind (`ip.rs`) fills it,
//! the subnet table (the views) applies it when a subnet loads, so no pod gets a reserved address.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use kubeovn_ipam::{Allocation, SharedIpam};

use super::podstore::PodStore;

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

    /// Record `name` exists (during a [`Reservations::listing`]).
    pub fn seen(&mut self, name: &str) {
        if let Some(s) = &mut self.seen {
            s.insert(name.to_owned());
        }
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
pub(crate) fn reserve(ipam: &SharedIpam, name: &str, a: &Allocation, loud: bool) {
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
pub(crate) fn held_by_live_pod(pods: &PodStore, a: &Allocation) -> bool {
    let (ns, pod) = super::split_key(&a.pod);
    !ns.is_empty()
        && a.nic == crate::naming::pod_port(pod, ns, crate::annotations::DEFAULT_PROVIDER)
        && pods.contains(ns, pod)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::api::Listed;

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
