//! The registry of subnets: [`Ipam`] for one owner, [`SharedIpam`] for concurrent callers.

use std::cell::RefCell;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use hashbrown::HashMap;

use crate::mac::Rng;
use crate::types::*;
use crate::{IpamError, Result, Subnet};

fn no_subnet(name: &str) -> IpamError {
    IpamError::NoSuchSubnet {
        subnet: name.to_owned(),
    }
}

/// Applies records subnet by subnet, then derives each touched subnet's free space once.
fn restore_into(
    mut subnet: impl FnMut(&str, &mut dyn FnMut(&mut Subnet)) -> bool,
    records: impl IntoIterator<Item = Allocation>,
    touched: &mut Vec<String>,
) -> RestoreReport {
    let mut report = RestoreReport::default();
    for rec in records {
        let mut res = Ok(());
        let found = subnet(&rec.subnet, &mut |s| res = s.restore_record(&rec, false));
        if !found {
            res = Err(no_subnet(&rec.subnet));
        } else if !touched.contains(&rec.subnet) {
            touched.push(rec.subnet.clone());
        }
        match res {
            Ok(()) => report.restored += 1,
            Err(error) => report
                .conflicts
                .push(RestoreConflict { record: rec, error }),
        }
    }
    report
}

/// Kube-OVN's IPAM for one owner: every subnet of a cluster (or node), behind `&mut self`.
///
/// For callers on several threads, wrap it in a [`SharedIpam`], which locks per subnet.
#[derive(Debug)]
pub struct Ipam {
    subnets: HashMap<String, Subnet>,
    rng: Rng,
}

impl Default for Ipam {
    fn default() -> Self {
        Self::new()
    }
}

impl Ipam {
    /// An empty IPAM with random MACs seeded from the OS.
    pub fn new() -> Self {
        Ipam {
            subnets: HashMap::new(),
            rng: Rng::from_entropy(),
        }
    }

    /// An empty IPAM whose MACs are a function of `seed` and the call sequence (for tests).
    pub fn with_seed(seed: u64) -> Self {
        Ipam {
            subnets: HashMap::new(),
            rng: Rng(seed),
        }
    }

    /// Adds a subnet or applies a new spec to it; returns the allocations the new spec invalidated.
    pub fn add_or_update_subnet(&mut self, spec: &SubnetSpec) -> Result<Vec<Allocation>> {
        match self.subnets.get_mut(&spec.name) {
            Some(s) => s.update(spec),
            None => {
                let s = Subnet::new(spec, self.rng.next_u64())?;
                self.subnets.insert(spec.name.clone(), s);
                Ok(Vec::new())
            }
        }
    }

    /// Removes a subnet and everything allocated in it.
    pub fn delete_subnet(&mut self, name: &str) -> Result<Subnet> {
        self.subnets.remove(name).ok_or_else(|| no_subnet(name))
    }

    /// A subnet.
    pub fn subnet(&self, name: &str) -> Option<&Subnet> {
        self.subnets.get(name)
    }

    /// A subnet, mutable.
    pub fn subnet_mut(&mut self, name: &str) -> Option<&mut Subnet> {
        self.subnets.get_mut(name)
    }

    /// Every subnet, in no particular order.
    pub fn subnets(&self) -> impl Iterator<Item = &Subnet> {
        self.subnets.values()
    }

    fn get_mut(&mut self, name: &str) -> Result<&mut Subnet> {
        self.subnets.get_mut(name).ok_or_else(|| no_subnet(name))
    }

    fn get_ref(&self, name: &str) -> Result<&Subnet> {
        self.subnets.get(name).ok_or_else(|| no_subnet(name))
    }

    /// Adds or replaces a named pool of a subnet.
    pub fn add_or_update_pool(&mut self, subnet: &str, pool: &PoolSpec) -> Result<()> {
        self.get_mut(subnet)?.add_or_update_pool(pool)
    }

    /// Removes a named pool; its addresses return to the subnet's default pool.
    pub fn delete_pool(&mut self, subnet: &str, pool: &str) -> Result<()> {
        self.get_mut(subnet)?.delete_pool(pool)
    }

    /// Allocates for a (pod, nic) in a subnet; see [`AllocRequest`] and [`Subnet::allocate`].
    pub fn allocate(&mut self, subnet: &str, req: &AllocRequest<'_>) -> Result<Addresses> {
        self.get_mut(subnet)?.allocate(req)
    }

    /// Releases a (pod, nic) of a subnet; `Ok(None)` if it held nothing.
    pub fn release(&mut self, subnet: &str, pod: &str, nic: &str) -> Result<Option<Addresses>> {
        Ok(self.get_mut(subnet)?.release(pod, nic))
    }

    /// Releases every nic of a pod in every subnet; returns how many.
    pub fn release_pod(&mut self, pod: &str) -> usize {
        self.subnets.values_mut().map(|s| s.release_pod(pod)).sum()
    }

    /// The addresses of a (pod, nic) in a subnet.
    pub fn get(&self, subnet: &str, pod: &str, nic: &str) -> Result<Option<Addresses>> {
        Ok(self.get_ref(subnet)?.get(pod, nic))
    }

    /// Every allocation of a pod, in every subnet.
    pub fn pod_allocations(&self, pod: &str) -> Vec<Allocation> {
        let mut v: Vec<Allocation> = self
            .subnets
            .values()
            .flat_map(|s| {
                s.pod(pod)
                    .map(|n| Allocation::new(s.name(), n.pod, n.nic, n.addrs))
            })
            .collect();
        v.sort_by(|a, b| (&a.subnet, &a.nic).cmp(&(&b.subnet, &b.nic)));
        v
    }

    /// The owner of an address, in whichever subnet holds it.
    pub fn owner(&self, ip: IpAddr) -> Option<Allocation> {
        self.subnets.values().find_map(|s| {
            s.owner(ip)
                .map(|n| Allocation::new(s.name(), n.pod, n.nic, n.addrs))
        })
    }

    /// True when `ip` is allocated in some subnet.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.subnets.values().any(|s| s.contains(ip))
    }

    /// Counts and ranges of a subnet and its pools.
    pub fn stats(&self, subnet: &str) -> Result<SubnetStats> {
        Ok(self.get_ref(subnet)?.stats())
    }

    /// Rebuilds allocations from the records a controller finds at start (IP records, pod annotations,
    /// northbound ports), all sources at once. A record that repeats a known (pod, nic, ip) is fine; one that
    /// contradicts an earlier record is refused and reported, never double-assigned.
    pub fn restore(&mut self, records: impl IntoIterator<Item = Allocation>) -> RestoreReport {
        let mut touched = Vec::new();
        let subnets = &mut self.subnets;
        let report = restore_into(
            |name, f| match subnets.get_mut(name) {
                Some(s) => {
                    f(s);
                    true
                }
                None => false,
            },
            records,
            &mut touched,
        );
        for name in touched {
            if let Some(s) = self.subnets.get_mut(&name) {
                s.finish_restore();
            }
        }
        report
    }

    /// The whole state, for persisting with serde.
    pub fn snapshot(&self) -> Snapshot {
        let mut subnets: Vec<SubnetSnapshot> =
            self.subnets.values().map(Subnet::snapshot).collect();
        subnets.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        Snapshot {
            subnets,
            rng: self.rng.0,
        }
    }

    /// Rebuilds the state from a snapshot.
    pub fn from_snapshot(snap: &Snapshot) -> Result<Ipam> {
        let mut subnets = HashMap::with_capacity(snap.subnets.len());
        for s in &snap.subnets {
            subnets.insert(s.spec.name.clone(), Subnet::from_snapshot(s)?);
        }
        Ok(Ipam {
            subnets,
            rng: Rng(snap.rng),
        })
    }
}

/// A handle for concurrent callers: a registry of subnets, each behind its own mutex.
///
/// Allocations in different subnets run in parallel (Kube-OVN serialises all of them behind one lock). Clone the
/// `Arc` to share it; [`SharedIpam::subnet`] gives a subnet's own handle for hot loops.
///
/// ```
/// use std::sync::Arc;
/// use kubeovn_ipam::{AllocRequest, SharedIpam, SubnetSpec};
///
/// let ipam = Arc::new(SharedIpam::new());
/// ipam.add_or_update_subnet(&SubnetSpec::new("a", "10.1.0.0/24", "10.1.0.1"))?;
/// ipam.add_or_update_subnet(&SubnetSpec::new("b", "10.2.0.0/24", "10.2.0.1"))?;
/// let workers: Vec<_> = ["a", "b"]
///     .into_iter()
///     .map(|subnet| {
///         let ipam = ipam.clone();
///         std::thread::spawn(move || ipam.allocate(subnet, &AllocRequest::new("pod", "eth0")))
///     })
///     .collect();
/// for w in workers {
///     assert!(w.join().expect("no panic")?.v4.is_some());
/// }
/// assert_eq!(ipam.pod_allocations("pod").len(), 2);
/// # Ok::<(), kubeovn_ipam::IpamError>(())
/// ```
#[derive(Debug)]
pub struct SharedIpam {
    subnets: RwLock<HashMap<String, Arc<Mutex<Subnet>>>>,
    rng: Mutex<Option<Rng>>,
    /// Identifies this handle in the per-thread caches.
    id: u64,
    /// Bumped when a subnet is added or deleted; per-thread caches older than this are dropped.
    version: AtomicU64,
}

type SubnetRef = Arc<Mutex<Subnet>>;

/// The last handle's subnets this thread used. Taking the registry's read lock on every call makes both cores
/// write its cache line; a hit here only reads the version.
#[derive(Default)]
struct ThreadCache {
    owner: u64,
    version: u64,
    map: HashMap<String, SubnetRef>,
}

thread_local! {
    static CACHE: RefCell<ThreadCache> = RefCell::new(ThreadCache::default());
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn lock(m: &Mutex<Subnet>) -> MutexGuard<'_, Subnet> {
    // A panic while holding the lock cannot leave a subnet half-changed: mutations validate first.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl From<Ipam> for SharedIpam {
    fn from(ipam: Ipam) -> Self {
        let map = ipam
            .subnets
            .into_iter()
            .map(|(k, v)| (k, Arc::new(Mutex::new(v))))
            .collect();
        SharedIpam {
            subnets: RwLock::new(map),
            rng: Mutex::new(Some(ipam.rng)),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            version: AtomicU64::new(0),
        }
    }
}

impl Default for SharedIpam {
    fn default() -> Self {
        Self::new()
    }
}

impl SharedIpam {
    /// An empty handle with random MACs.
    pub fn new() -> Self {
        Ipam::new().into()
    }

    /// An empty handle with deterministic MACs.
    pub fn with_seed(seed: u64) -> Self {
        Ipam::with_seed(seed).into()
    }

    fn map(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<Mutex<Subnet>>>> {
        self.subnets.read().unwrap_or_else(|e| e.into_inner())
    }

    fn next_seed(&self) -> u64 {
        let mut g = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        g.get_or_insert_with(Rng::from_entropy).next_u64()
    }

    /// A subnet's own handle: lock it to work on the subnet without touching the registry.
    ///
    /// Each thread keeps the handles it used in a small cache, checked against the registry's version.
    pub fn subnet(&self, name: &str) -> Option<Arc<Mutex<Subnet>>> {
        let v = self.version.load(Ordering::Acquire);
        let hit = CACHE
            .try_with(|c| {
                let c = c.borrow();
                if c.owner == self.id && c.version == v {
                    c.map.get(name).cloned()
                } else {
                    None
                }
            })
            .ok()
            .flatten();
        if hit.is_some() {
            return hit;
        }
        let found = self.map().get(name).cloned()?;
        let _ = CACHE.try_with(|c| {
            let mut c = c.borrow_mut();
            if c.owner != self.id || c.version != v {
                c.map.clear();
                c.owner = self.id;
                c.version = v;
            }
            c.map.insert(name.to_owned(), found.clone());
        });
        Some(found)
    }

    /// Runs `f` on a locked subnet.
    pub fn with_subnet<R>(&self, name: &str, f: impl FnOnce(&mut Subnet) -> R) -> Result<R> {
        let s = self.subnet(name).ok_or_else(|| no_subnet(name))?;
        let mut g = lock(&s);
        Ok(f(&mut g))
    }

    /// Names of the subnets, sorted.
    pub fn subnet_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.map().keys().cloned().collect();
        v.sort();
        v
    }

    /// Adds a subnet or applies a new spec to it; returns the allocations the new spec invalidated.
    pub fn add_or_update_subnet(&self, spec: &SubnetSpec) -> Result<Vec<Allocation>> {
        if let Some(s) = self.subnet(&spec.name) {
            return lock(&s).update(spec);
        }
        let sub = Subnet::new(spec, self.next_seed())?;
        let mut w = self.subnets.write().unwrap_or_else(|e| e.into_inner());
        match w.get(&spec.name).cloned() {
            // Another caller added it meanwhile.
            Some(s) => {
                drop(w);
                lock(&s).update(spec)
            }
            None => {
                w.insert(spec.name.clone(), Arc::new(Mutex::new(sub)));
                self.version.fetch_add(1, Ordering::Release);
                Ok(Vec::new())
            }
        }
    }

    /// Removes a subnet.
    pub fn delete_subnet(&self, name: &str) -> Result<()> {
        let mut w = self.subnets.write().unwrap_or_else(|e| e.into_inner());
        let removed = w.remove(name).map(drop).ok_or_else(|| no_subnet(name));
        self.version.fetch_add(1, Ordering::Release);
        removed
    }

    /// Adds or replaces a named pool.
    pub fn add_or_update_pool(&self, subnet: &str, pool: &PoolSpec) -> Result<()> {
        self.with_subnet(subnet, |s| s.add_or_update_pool(pool))?
    }

    /// Removes a named pool.
    pub fn delete_pool(&self, subnet: &str, pool: &str) -> Result<()> {
        self.with_subnet(subnet, |s| s.delete_pool(pool))?
    }

    /// Allocates for a (pod, nic); locks only that subnet.
    pub fn allocate(&self, subnet: &str, req: &AllocRequest<'_>) -> Result<Addresses> {
        self.with_subnet(subnet, |s| s.allocate(req))?
    }

    /// Releases a (pod, nic); `Ok(None)` if it held nothing.
    pub fn release(&self, subnet: &str, pod: &str, nic: &str) -> Result<Option<Addresses>> {
        self.with_subnet(subnet, |s| s.release(pod, nic))
    }

    /// Releases every nic of a pod in every subnet, one subnet lock at a time.
    pub fn release_pod(&self, pod: &str) -> usize {
        let subs: Vec<_> = self.map().values().cloned().collect();
        subs.iter().map(|s| lock(s).release_pod(pod)).sum()
    }

    /// The addresses of a (pod, nic).
    pub fn get(&self, subnet: &str, pod: &str, nic: &str) -> Result<Option<Addresses>> {
        self.with_subnet(subnet, |s| s.get(pod, nic))
    }

    /// Every allocation of a pod, in every subnet.
    pub fn pod_allocations(&self, pod: &str) -> Vec<Allocation> {
        let subs: Vec<_> = self.map().values().cloned().collect();
        let mut v: Vec<Allocation> = Vec::new();
        for s in subs {
            let g = lock(&s);
            v.extend(
                g.pod(pod)
                    .map(|n| Allocation::new(g.name(), n.pod, n.nic, n.addrs)),
            );
        }
        v.sort_by(|a, b| (&a.subnet, &a.nic).cmp(&(&b.subnet, &b.nic)));
        v
    }

    /// The owner of an address.
    pub fn owner(&self, ip: IpAddr) -> Option<Allocation> {
        let subs: Vec<_> = self.map().values().cloned().collect();
        subs.iter().find_map(|s| {
            let g = lock(s);
            g.owner(ip)
                .map(|n| Allocation::new(g.name(), n.pod, n.nic, n.addrs))
        })
    }

    /// True when `ip` is allocated in some subnet.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.owner(ip).is_some()
    }

    /// Counts and ranges of a subnet and its pools.
    pub fn stats(&self, subnet: &str) -> Result<SubnetStats> {
        self.with_subnet(subnet, |s| s.stats())
    }

    /// Rebuilds allocations from existing records; see [`Ipam::restore`].
    pub fn restore(&self, records: impl IntoIterator<Item = Allocation>) -> RestoreReport {
        let mut touched = Vec::new();
        let report = restore_into(
            |name, f| match self.subnet(name) {
                Some(s) => {
                    f(&mut lock(&s));
                    true
                }
                None => false,
            },
            records,
            &mut touched,
        );
        for name in touched {
            if let Some(s) = self.subnet(&name) {
                lock(&s).finish_restore();
            }
        }
        report
    }

    /// The whole state (each subnet is consistent; subnets are locked one after another).
    pub fn snapshot(&self) -> Snapshot {
        let subs: Vec<_> = self.map().values().cloned().collect();
        let mut subnets: Vec<SubnetSnapshot> = subs.iter().map(|s| lock(s).snapshot()).collect();
        subnets.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        let rng = self
            .rng
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, |r| r.0);
        Snapshot { subnets, rng }
    }

    /// Rebuilds a handle from a snapshot.
    pub fn from_snapshot(snap: &Snapshot) -> Result<SharedIpam> {
        Ipam::from_snapshot(snap).map(Into::into)
    }
}
