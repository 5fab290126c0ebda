//! One subnet's allocator: per-family free space, owners, pools.

use std::hash::BuildHasher;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hashbrown::HashTable;

use crate::mac::Rng;
use crate::range::{
    count_points_in, difference, intersection, normalize, points_to_ranges, Cidrs, IpRangeList,
    RangeSet,
};
use crate::slots::{SlotAddr, Slots, NIL};
use crate::types::*;
use crate::{IpamError, Mac, Result};

/// Addresses of one pool (index 0: the default pool, everything no named pool holds).
#[derive(Clone, Default)]
struct Domain<A> {
    /// The pool's addresses (empty for the default pool, whose members are implied).
    members: RangeSet<A>,
    /// Never handed out since the last swap.
    free: RangeSet<A>,
    /// Released, reused once `free` is empty.
    released: RangeSet<A>,
    using: u128,
}

/// One family of a subnet.
#[derive(Clone)]
pub(crate) struct Fam<A> {
    net: A,
    prefix: u8,
    usable: Option<(A, A)>,
    gateway: Option<A>,
    excluded: RangeSet<A>,
    domains: Vec<Domain<A>>,
    /// Slot ids by address; an address shared without conflict check has several entries.
    index: HashTable<u32>,
}

/// How one family of a request is served.
#[derive(Clone, Copy)]
enum Step<A> {
    Nothing,
    Keep,
    /// `h`: the hash of `a` in the family index (computed once, in plan).
    New {
        a: A,
        h: u64,
        src: Source,
        old: Option<A>,
    },
}

#[derive(Clone, Copy)]
enum Source {
    Free,
    Released,
    /// A static address nobody holds.
    Static,
    /// A static address another owner holds (conflict check off).
    Shared,
}

impl<A: SlotAddr> Fam<A> {
    fn new(net: A, prefix: u8) -> Self {
        let host = A::host_mask(prefix);
        let bcast = net.or(host);
        let usable = match A::BITS - u32::from(prefix) {
            0 => None,
            1 => Some((net, bcast)),
            _ => net.succ().zip(bcast.pred()),
        };
        Fam {
            net,
            prefix,
            usable,
            gateway: None,
            excluded: RangeSet::new(),
            domains: vec![Domain::default()],
            index: HashTable::new(),
        }
    }

    fn in_cidr(&self, a: A) -> bool {
        a.and_not(A::host_mask(self.prefix)) == self.net
    }

    fn in_usable(&self, a: A) -> bool {
        self.usable.is_some_and(|(lo, hi)| lo <= a && a <= hi)
    }

    fn usable_vec(&self) -> Vec<(A, A)> {
        self.usable.into_iter().collect()
    }

    fn owner(&self, slots: &Slots, a: A, except: u32) -> Option<u32> {
        self.owner_h(slots, a, except, slots.hb.hash_one(a))
    }

    /// [`Fam::owner`] with the hash of `a` already computed.
    fn owner_h(&self, slots: &Slots, a: A, except: u32, h: u64) -> Option<u32> {
        self.index
            .find(h, |&id| id != except && A::get(slots, id) == Some(a))
            .copied()
    }

    fn index_insert(&mut self, slots: &Slots, a: A, id: u32, h: u64) {
        let hb = &slots.hb;
        self.index
            .insert_unique(h, id, |&i| hb.hash_one(A::get(slots, i).unwrap_or(a)));
    }

    /// [`Fam::index_insert`] when the index holds every other live slot with an address of this family (not
    /// while an index is rebuilt from scratch): growing it then reads the slots in order.
    fn index_insert_live(&mut self, slots: &Slots, a: A, id: u32, h: u64) {
        let hb = &slots.hb;
        crate::slots::make_room(&mut self.index, slots.capacity_ids(), || {
            slots.ids().filter_map(move |i| {
                A::get(slots, i)
                    .filter(|_| i != id)
                    .map(|x| (i, hb.hash_one(x)))
            })
        });
        self.index_insert(slots, a, id, h);
    }

    fn domain_of(&self, a: A) -> usize {
        self.domains
            .iter()
            .skip(1)
            .position(|d| d.members.contains(a))
            .map_or(0, |i| i + 1)
    }

    /// The next-free candidate of a pool, without taking it.
    fn peek(&self, domain: usize, skip: &[IpAddr]) -> Option<(A, Source)> {
        let d = &self.domains[domain];
        let skipped = |a: A| skip.iter().any(|ip| A::from_ipaddr(*ip) == Some(a));
        if skip.is_empty() {
            if let Some(a) = d.free.first() {
                return Some((a, Source::Free));
            }
            return d.released.first().map(|a| (a, Source::Released));
        }
        if let Some(a) = d.free.first_where_not(skipped) {
            return Some((a, Source::Free));
        }
        d.released
            .first_where_not(skipped)
            .map(|a| (a, Source::Released))
    }

    fn take(&mut self, domain: usize, a: A, src: Source) {
        let d = &mut self.domains[domain];
        match src {
            Source::Free => {
                if d.free.first() == Some(a) {
                    d.free.take_first();
                } else {
                    d.free.remove(a);
                }
            }
            Source::Released => {
                // Kube-OVN's delayed reuse: once the never-used addresses are gone, the released ones become
                // the free set and later releases wait behind them.
                if d.free.is_empty() {
                    std::mem::swap(&mut d.free, &mut d.released);
                    d.free.remove(a);
                } else {
                    d.released.remove(a);
                }
            }
            Source::Static => {
                if !d.free.remove(a) {
                    d.released.remove(a);
                }
            }
            Source::Shared => return,
        }
        d.using += 1;
    }

    /// The last owner of `a` is gone: the address goes to the released set if next-free may hand it out.
    fn unuse(&mut self, a: A) {
        let usable = self.in_usable(a) && self.gateway != Some(a) && !self.excluded.contains(a);
        let i = self.domain_of(a);
        let d = &mut self.domains[i];
        d.using = d.using.saturating_sub(1);
        if usable {
            d.released.insert(a);
        }
    }

    fn plan(
        &self,
        slots: &Slots,
        subnet: &str,
        me: u32,
        stat: Option<A>,
        domain: usize,
        req: &AllocRequest<'_>,
    ) -> Result<Step<A>> {
        let cur = if me == NIL { None } else { A::get(slots, me) };
        if let Some(a) = stat {
            let ip: IpAddr = a.to_ip().into();
            if self.gateway == Some(a) {
                return Err(IpamError::Gateway {
                    subnet: subnet.to_owned(),
                    ip,
                });
            }
            if !self.in_usable(a) {
                return Err(IpamError::OutOfRange {
                    subnet: subnet.to_owned(),
                    ip,
                });
            }
            if cur == Some(a) {
                return Ok(Step::Keep);
            }
            let h = slots.hb.hash_one(a);
            let src = match self.owner_h(slots, a, me, h) {
                Some(o) if req.check_conflict => {
                    return Err(IpamError::Conflict {
                        subnet: subnet.to_owned(),
                        address: ip.to_string(),
                        owner: slots.owner_name(o),
                    })
                }
                Some(_) => Source::Shared,
                None => Source::Static,
            };
            return Ok(Step::New {
                a,
                h,
                src,
                old: cur,
            });
        }
        if let Some(c) = cur {
            if !req.skip.iter().any(|ip| A::from_ipaddr(*ip) == Some(c)) {
                return Ok(Step::Keep);
            }
        }
        match self.peek(domain, req.skip) {
            Some((a, src)) => Ok(Step::New {
                a,
                h: slots.hb.hash_one(a),
                src,
                old: cur,
            }),
            None => Err(IpamError::NoAvailable {
                subnet: subnet.to_owned(),
                pool: req.pool.map(str::to_owned),
                family: A::FAMILY,
            }),
        }
    }

    fn commit(&mut self, slots: &mut Slots, id: u32, step: Step<A>, domain: usize) {
        let Step::New { a, h, src, old } = step else {
            return;
        };
        if let Some(o) = old {
            self.release_addr(slots, id, o);
        }
        let domain = match src {
            Source::Free | Source::Released => domain,
            _ => self.domain_of(a),
        };
        self.take(domain, a, src);
        A::set(slots, id, Some(a));
        self.index_insert_live(slots, a, id, h);
    }

    fn release_addr(&mut self, slots: &mut Slots, id: u32, a: A) {
        let h = slots.hb.hash_one(a);
        if let Ok(e) = self.index.find_entry(h, |&i| i == id) {
            e.remove();
        }
        A::set(slots, id, None);
        if self.owner_h(slots, a, NIL, h).is_none() {
            self.unuse(a);
        }
    }

    fn released_vec(&self) -> Vec<(A, A)> {
        let mut v: Vec<(A, A)> = self
            .domains
            .iter()
            .flat_map(|d| d.released.ranges())
            .collect();
        normalize(&mut v)
    }

    fn used_sorted(&self, slots: &Slots) -> Vec<A> {
        let mut v: Vec<A> = self
            .index
            .iter()
            .filter_map(|&id| A::get(slots, id))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Derives every pool's free, released and using from the owners, in one pass over sorted lists.
    fn rebuild(&mut self, slots: &Slots, carry_released: &[(A, A)]) {
        let usable = self.usable_vec();
        let mut blocked = self.excluded.to_vec();
        blocked.extend(self.gateway.map(|g| (g, g)));
        let blocked = normalize(&mut blocked);
        let used = self.used_sorted(slots);
        let used_r = points_to_ranges(&used);
        let mut pooled: Vec<(A, A)> = self
            .domains
            .iter()
            .skip(1)
            .flat_map(|d| d.members.ranges())
            .collect();
        let pooled = normalize(&mut pooled);
        let default_members = difference(&usable, &pooled);
        for (i, d) in self.domains.iter_mut().enumerate() {
            let members = if i == 0 {
                default_members.clone()
            } else {
                intersection(&d.members.to_vec(), &usable)
            };
            let base = difference(&members, &blocked);
            let rel = difference(&intersection(carry_released, &base), &used_r);
            let free = difference(&difference(&base, &used_r), &rel);
            d.using = count_points_in(&used, &members);
            d.released = RangeSet::from_sorted(rel);
            d.free = RangeSet::from_sorted(free);
        }
    }

    fn stats(&self, slots: &Slots, domain: Option<usize>) -> FamilyStats {
        let ds: Vec<&Domain<A>> = match domain {
            Some(i) => vec![&self.domains[i]],
            None => self.domains.iter().collect(),
        };
        let mut avail: Vec<(A, A)> = ds
            .iter()
            .flat_map(|d| d.free.ranges().chain(d.released.ranges()))
            .collect();
        let avail = RangeSet::from_sorted(normalize(&mut avail));
        let mut used = self.used_sorted(slots);
        if let Some(i) = domain {
            let members = if i == 0 {
                let mut pooled: Vec<(A, A)> = self
                    .domains
                    .iter()
                    .skip(1)
                    .flat_map(|d| d.members.ranges())
                    .collect();
                difference(&self.usable_vec(), &normalize(&mut pooled))
            } else {
                self.domains[i].members.to_vec()
            };
            used.retain(|&a| count_points_in(&[a], &members) == 1);
        }
        FamilyStats {
            available: avail.len(),
            using: ds.iter().map(|d| d.using).sum(),
            available_range: avail.to_string(),
            using_range: RangeSet::from_sorted(points_to_ranges(&used)).to_string(),
        }
    }
}

/// One subnet: its layout, pools and owners. Reached through [`Ipam`](crate::Ipam) or
/// [`SharedIpam`](crate::SharedIpam); usable alone too.
pub struct Subnet {
    spec: SubnetSpec,
    v4: Option<Fam<u32>>,
    v6: Option<Fam<u128>>,
    pools: Vec<(PoolSpec, IpRangeList)>,
    slots: Slots,
    rng: Rng,
}

impl std::fmt::Debug for Subnet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subnet")
            .field("spec", &self.spec)
            .field("nics", &self.slots.live())
            .finish()
    }
}

fn check_names(pod: &str, nic: &str) -> Result<()> {
    let bad = |reason| IpamError::InvalidName {
        name: format!("{pod}/{nic}"),
        reason,
    };
    if pod.is_empty() {
        return Err(bad("empty pod name"));
    }
    if pod.len() + nic.len() > u16::MAX as usize {
        return Err(bad("pod and nic names longer than 65535 bytes"));
    }
    Ok(())
}

/// Parses and validates a spec into empty families.
/// The IPv4 and IPv6 families of a subnet.
type Families = (Option<Fam<u32>>, Option<Fam<u128>>);

/// Released ranges per family, carried over a rebuild.
type Carried = (Vec<(u32, u32)>, Vec<(u128, u128)>);

fn layout(spec: &SubnetSpec) -> Result<Families> {
    if spec.name.is_empty() {
        return Err(IpamError::InvalidName {
            name: String::new(),
            reason: "empty subnet name",
        });
    }
    let c = Cidrs::parse(&spec.cidr)?;
    let mut v4 = c.v4.map(|(n, p)| Fam::<u32>::new(n, p));
    let mut v6 = c.v6.map(|(n, p)| Fam::<u128>::new(n, p));
    for part in spec
        .gateway
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let ip: IpAddr = part.parse().map_err(|_| IpamError::InvalidIp {
            text: part.to_owned(),
        })?;
        let no_family = || IpamError::InvalidFamily {
            subnet: spec.name.clone(),
            family: Family::of(ip),
        };
        let out = || IpamError::OutOfRange {
            subnet: spec.name.clone(),
            ip,
        };
        let twice = || IpamError::InvalidIp {
            text: spec.gateway.clone(),
        };
        match ip {
            IpAddr::V4(a) => {
                let f = v4.as_mut().ok_or_else(no_family)?;
                let a = u32::from(a);
                if !f.in_cidr(a) {
                    return Err(out());
                }
                if f.gateway.replace(a).is_some() {
                    return Err(twice());
                }
            }
            IpAddr::V6(a) => {
                let f = v6.as_mut().ok_or_else(no_family)?;
                let a = u128::from(a);
                if !f.in_cidr(a) {
                    return Err(out());
                }
                if f.gateway.replace(a).is_some() {
                    return Err(twice());
                }
            }
        }
    }
    let ex = IpRangeList::parse(&spec.exclude_ips)?;
    if let Some(f) = v4.as_mut() {
        f.excluded = RangeSet::from_sorted(intersection(&ex.v4.to_vec(), &f.usable_vec()));
    }
    if let Some(f) = v6.as_mut() {
        f.excluded = RangeSet::from_sorted(intersection(&ex.v6.to_vec(), &f.usable_vec()));
    }
    Ok((v4, v6))
}

fn pool_members<A: SlotAddr>(f: &Fam<A>, list: &RangeSet<A>) -> RangeSet<A> {
    RangeSet::from_sorted(intersection(&list.to_vec(), &f.usable_vec()))
}

impl Subnet {
    /// An empty subnet; `seed` drives MAC generation.
    pub fn new(spec: &SubnetSpec, seed: u64) -> Result<Subnet> {
        let (mut v4, mut v6) = layout(spec)?;
        if let Some(f) = v4.as_mut() {
            f.rebuild(&Slots::default(), &[]);
        }
        if let Some(f) = v6.as_mut() {
            f.rebuild(&Slots::default(), &[]);
        }
        Ok(Subnet {
            spec: spec.clone(),
            v4,
            v6,
            pools: Vec::new(),
            slots: Slots::default(),
            rng: Rng(seed),
        })
    }

    /// The subnet's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The spec the subnet was last configured with.
    pub fn spec(&self) -> &SubnetSpec {
        &self.spec
    }

    /// Number of (pod, nic) owners.
    pub fn len(&self) -> usize {
        self.slots.live()
    }

    /// True when nothing is allocated.
    pub fn is_empty(&self) -> bool {
        self.slots.live() == 0
    }

    /// The named pools.
    pub fn pools(&self) -> impl Iterator<Item = &PoolSpec> {
        self.pools.iter().map(|(p, _)| p)
    }

    /// True when `ip` is inside one of the subnet's CIDRs.
    pub fn cidr_contains(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => self.v4.as_ref().is_some_and(|f| f.in_cidr(u32::from(a))),
            IpAddr::V6(a) => self.v6.as_ref().is_some_and(|f| f.in_cidr(u128::from(a))),
        }
    }

    fn addresses(&self, id: u32) -> Addresses {
        Addresses {
            v4: self.slots.v4(id).map(Ipv4Addr::from),
            v6: self.slots.v6(id).map(Ipv6Addr::from),
            mac: self.slots.mac(id),
        }
    }

    fn nic_ref(&self, id: u32) -> NicRef<'_> {
        NicRef {
            pod: self.slots.pod(id),
            nic: self.slots.nic(id),
            addrs: self.addresses(id),
        }
    }

    fn fresh_mac(&mut self) -> Mac {
        loop {
            let m = self.rng.mac();
            if Some(m) != self.spec.gateway_mac && self.slots.mac_owner(m, NIL).is_none() {
                return m;
            }
        }
    }

    fn pool_index(&self, pool: Option<&str>) -> Result<usize> {
        match pool {
            None | Some("") => Ok(0),
            Some(p) => self
                .pools
                .iter()
                .position(|(s, _)| s.name == p)
                .map(|i| i + 1)
                .ok_or_else(|| IpamError::NoSuchPool {
                    subnet: self.spec.name.clone(),
                    pool: p.to_owned(),
                }),
        }
    }

    /// Allocates (or returns the existing) addresses of a (pod, nic); see [`AllocRequest`].
    ///
    /// Validates everything before changing anything, so a failure of one family leaves the other untouched.
    pub fn allocate(&mut self, req: &AllocRequest<'_>) -> Result<Addresses> {
        let name = &self.spec.name;
        check_names(req.pod, req.nic)?;
        let bad_req = |reason| IpamError::InvalidRequest {
            subnet: name.clone(),
            pod: req.pod.to_owned(),
            nic: req.nic.to_owned(),
            reason,
        };
        let no_family = |family| IpamError::InvalidFamily {
            subnet: name.clone(),
            family,
        };
        let (mut s4, mut s6) = (None::<u32>, None::<u128>);
        for &ip in req.static_ips {
            if req.family.is_some_and(|f| f != Family::of(ip)) {
                return Err(bad_req("static IP of another family than requested"));
            }
            let dup = match ip {
                IpAddr::V4(a) => s4.replace(u32::from(a)).is_some(),
                IpAddr::V6(a) => s6.replace(u128::from(a)).is_some(),
            };
            if dup {
                return Err(bad_req("two static IPs of one family"));
            }
        }
        let (want4, want6) = match req.family {
            None => (self.v4.is_some(), self.v6.is_some()),
            Some(Family::V4) => (true, false),
            Some(Family::V6) => (false, true),
        };
        if (want4 || s4.is_some()) && self.v4.is_none() {
            return Err(no_family(Family::V4));
        }
        if (want6 || s6.is_some()) && self.v6.is_none() {
            return Err(no_family(Family::V6));
        }
        let domain = self.pool_index(req.pool)?;
        let pod_hash = self.slots.pod_hash(req.pod);
        let (existing, head) = self.slots.find_with_head(req.pod, req.nic, pod_hash);
        let me = existing.unwrap_or(NIL);
        if let Some(m) = req.mac {
            let conflict = |owner: String| IpamError::Conflict {
                subnet: name.clone(),
                address: m.to_string(),
                owner,
            };
            if Some(m) == self.spec.gateway_mac {
                return Err(conflict("gateway".to_owned()));
            }
            if req.check_conflict {
                if let Some(o) = self.slots.mac_owner(m, me) {
                    return Err(conflict(self.slots.owner_name(o)));
                }
            }
        }
        let p4 = match &self.v4 {
            Some(f) if want4 => f.plan(&self.slots, name, me, s4, domain, req)?,
            _ => Step::Nothing,
        };
        let p6 = match &self.v6 {
            Some(f) if want6 => f.plan(&self.slots, name, me, s6, domain, req)?,
            _ => Step::Nothing,
        };
        // Nothing can fail from here on.
        let id = match existing {
            Some(id) => {
                if let Some(m) = req.mac.filter(|&m| m != self.slots.mac(id)) {
                    self.slots.set_mac(id, m);
                }
                id
            }
            None => {
                let mac = match req.mac {
                    Some(m) => m,
                    None => self.fresh_mac(),
                };
                self.slots.create_at(req.pod, req.nic, mac, pod_hash, head)
            }
        };
        if let Some(f) = self.v4.as_mut() {
            f.commit(&mut self.slots, id, p4, domain);
        }
        if let Some(f) = self.v6.as_mut() {
            f.commit(&mut self.slots, id, p6, domain);
        }
        Ok(self.addresses(id))
    }

    fn release_id(&mut self, id: u32, pod_hash: Option<u64>) -> Addresses {
        let addrs = self.addresses(id);
        if let (Some(f), Some(a)) = (self.v4.as_mut(), self.slots.v4(id)) {
            f.release_addr(&mut self.slots, id, a);
        }
        if let (Some(f), Some(a)) = (self.v6.as_mut(), self.slots.v6(id)) {
            f.release_addr(&mut self.slots, id, a);
        }
        match pod_hash {
            Some(h) => self.slots.remove_h(id, h),
            None => self.slots.remove(id),
        }
        addrs
    }

    /// Releases a (pod, nic); `None` if it held nothing (releasing twice is fine).
    pub fn release(&mut self, pod: &str, nic: &str) -> Option<Addresses> {
        let h = self.slots.pod_hash(pod);
        let id = self.slots.find_h(pod, nic, h)?;
        Some(self.release_id(id, Some(h)))
    }

    /// Releases every nic of a pod; returns how many.
    pub fn release_pod(&mut self, pod: &str) -> usize {
        let ids: Vec<u32> = self.slots.pod_ids(pod).collect();
        for &id in &ids {
            self.release_id(id, None);
        }
        ids.len()
    }

    /// The addresses of a (pod, nic).
    pub fn get(&self, pod: &str, nic: &str) -> Option<Addresses> {
        self.slots.find(pod, nic).map(|id| self.addresses(id))
    }

    /// The nics of a pod.
    pub fn pod(&self, pod: &str) -> impl Iterator<Item = NicRef<'_>> {
        self.slots.pod_ids(pod).map(|id| self.nic_ref(id))
    }

    /// Every (pod, nic) of the subnet, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = NicRef<'_>> {
        self.slots.ids().map(|id| self.nic_ref(id))
    }

    /// The owner of an address (the first one, if shared).
    pub fn owner(&self, ip: IpAddr) -> Option<NicRef<'_>> {
        let id = match ip {
            IpAddr::V4(a) => self.v4.as_ref()?.owner(&self.slots, u32::from(a), NIL)?,
            IpAddr::V6(a) => self.v6.as_ref()?.owner(&self.slots, u128::from(a), NIL)?,
        };
        Some(self.nic_ref(id))
    }

    /// True when `ip` is allocated to some (pod, nic).
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.owner(ip).is_some()
    }

    /// The named pool `ip` belongs to, if any.
    pub fn pool_of(&self, ip: IpAddr) -> Option<&str> {
        let i = match ip {
            IpAddr::V4(a) => self.v4.as_ref()?.domain_of(u32::from(a)),
            IpAddr::V6(a) => self.v6.as_ref()?.domain_of(u128::from(a)),
        };
        (i > 0).then(|| self.pools[i - 1].0.name.as_str())
    }

    /// Counts and ranges of the subnet and of each named pool.
    pub fn stats(&self) -> SubnetStats {
        let s = &self.slots;
        SubnetStats {
            v4: self
                .v4
                .as_ref()
                .map(|f| f.stats(s, None))
                .unwrap_or_default(),
            v6: self
                .v6
                .as_ref()
                .map(|f| f.stats(s, None))
                .unwrap_or_default(),
            pools: self
                .pools
                .iter()
                .enumerate()
                .map(|(i, (p, _))| PoolStats {
                    name: p.name.clone(),
                    v4: self
                        .v4
                        .as_ref()
                        .map(|f| f.stats(s, Some(i + 1)))
                        .unwrap_or_default(),
                    v6: self
                        .v6
                        .as_ref()
                        .map(|f| f.stats(s, Some(i + 1)))
                        .unwrap_or_default(),
                })
                .collect(),
        }
    }

    /// The never-used and the released sets of a family, in range format (for tests and debugging).
    pub fn free_and_released(&self, family: Family) -> (String, String) {
        fn f<A: SlotAddr>(fam: &Fam<A>) -> (String, String) {
            let mut free: Vec<(A, A)> = fam.domains.iter().flat_map(|d| d.free.ranges()).collect();
            let free = RangeSet::from_sorted(normalize(&mut free));
            let rel = RangeSet::from_sorted(fam.released_vec());
            (free.to_string(), rel.to_string())
        }
        match family {
            Family::V4 => self.v4.as_ref().map(f).unwrap_or_default(),
            Family::V6 => self.v6.as_ref().map(f).unwrap_or_default(),
        }
    }

    /// Heap bytes held by the subnet's tables (approximate; for benchmarks).
    pub fn heap_bytes(&self) -> usize {
        self.slots.heap_bytes()
            + self.v4.as_ref().map_or(0, |f| f.index.allocation_size())
            + self.v6.as_ref().map_or(0, |f| f.index.allocation_size())
    }

    fn rebuild(&mut self, carry4: &[(u32, u32)], carry6: &[(u128, u128)]) {
        if let Some(f) = self.v4.as_mut() {
            f.rebuild(&self.slots, carry4);
        }
        if let Some(f) = self.v6.as_mut() {
            f.rebuild(&self.slots, carry6);
        }
    }

    fn carried(&self) -> Carried {
        (
            self.v4.as_ref().map(Fam::released_vec).unwrap_or_default(),
            self.v6.as_ref().map(Fam::released_vec).unwrap_or_default(),
        )
    }

    /// Applies a new spec: allocations still valid are kept, the others dropped and returned.
    pub fn update(&mut self, spec: &SubnetSpec) -> Result<Vec<Allocation>> {
        let (mut v4, mut v6) = layout(spec)?;
        if spec.name != self.spec.name {
            return Err(IpamError::InvalidName {
                name: spec.name.clone(),
                reason: "subnet name changed",
            });
        }
        let (carry4, carry6) = self.carried();
        for (_, list) in &self.pools {
            if let Some(f) = v4.as_mut() {
                let m = pool_members(f, &list.v4);
                f.domains.push(Domain {
                    members: m,
                    ..Default::default()
                });
            }
            if let Some(f) = v6.as_mut() {
                let m = pool_members(f, &list.v6);
                f.domains.push(Domain {
                    members: m,
                    ..Default::default()
                });
            }
        }
        let ids: Vec<u32> = self.slots.ids().collect();
        let mut dropped = Vec::new();
        let ok = |f: &Option<Fam<u32>>, a: u32| {
            f.as_ref()
                .is_some_and(|f| f.in_usable(a) && f.gateway != Some(a))
        };
        let ok6 = |f: &Option<Fam<u128>>, a: u128| {
            f.as_ref()
                .is_some_and(|f| f.in_usable(a) && f.gateway != Some(a))
        };
        let has_family = v4.is_some() || v6.is_some();
        for id in ids {
            let d4 = self.slots.v4(id).filter(|&a| !ok(&v4, a));
            let d6 = self.slots.v6(id).filter(|&a| !ok6(&v6, a));
            if d4.is_some() || d6.is_some() {
                let mut rec = Allocation::new(
                    &spec.name,
                    self.slots.pod(id),
                    self.slots.nic(id),
                    self.addresses(id),
                );
                rec.v4 = d4.map(Ipv4Addr::from);
                rec.v6 = d6.map(Ipv6Addr::from);
                dropped.push(rec);
                if d4.is_some() {
                    self.slots.set_v4(id, None);
                }
                if d6.is_some() {
                    self.slots.set_v6(id, None);
                }
            }
            if has_family && self.slots.v4(id).is_none() && self.slots.v6(id).is_none() {
                self.slots.remove(id);
                continue;
            }
            if spec.gateway_mac.is_some() && Some(self.slots.mac(id)) == spec.gateway_mac {
                self.spec.gateway_mac = spec.gateway_mac;
                let m = self.fresh_mac();
                self.slots.set_mac(id, m);
            }
        }
        for id in self.slots.ids().collect::<Vec<_>>() {
            if let (Some(f), Some(a)) = (v4.as_mut(), self.slots.v4(id)) {
                f.index_insert(&self.slots, a, id, self.slots.hb.hash_one(a));
            }
            if let (Some(f), Some(a)) = (v6.as_mut(), self.slots.v6(id)) {
                f.index_insert(&self.slots, a, id, self.slots.hb.hash_one(a));
            }
        }
        self.v4 = v4;
        self.v6 = v6;
        self.spec = spec.clone();
        self.rebuild(&carry4, &carry6);
        Ok(dropped)
    }

    /// Adds or replaces a named pool; its addresses are clipped to the subnet and must not overlap another pool.
    pub fn add_or_update_pool(&mut self, pool: &PoolSpec) -> Result<()> {
        if pool.name.is_empty() {
            return Err(IpamError::InvalidName {
                name: String::new(),
                reason: "empty pool name",
            });
        }
        let list = IpRangeList::parse(&pool.ips)?;
        let m4 = self
            .v4
            .as_ref()
            .map(|f| pool_members(f, &list.v4))
            .unwrap_or_default();
        let m6 = self
            .v6
            .as_ref()
            .map(|f| pool_members(f, &list.v6))
            .unwrap_or_default();
        for (i, (other, _)) in self.pools.iter().enumerate() {
            if other.name == pool.name {
                continue;
            }
            let o4 = self
                .v4
                .as_ref()
                .map(|f| intersection(&f.domains[i + 1].members.to_vec(), &m4.to_vec()));
            let o6 = self
                .v6
                .as_ref()
                .map(|f| intersection(&f.domains[i + 1].members.to_vec(), &m6.to_vec()));
            if o4.is_some_and(|v| !v.is_empty()) || o6.is_some_and(|v| !v.is_empty()) {
                return Err(IpamError::OverlappingPools {
                    subnet: self.spec.name.clone(),
                    pool: pool.name.clone(),
                    other: other.name.clone(),
                });
            }
        }
        let (carry4, carry6) = self.carried();
        let at = match self.pools.iter().position(|(p, _)| p.name == pool.name) {
            Some(i) => {
                self.pools[i] = (pool.clone(), list);
                i + 1
            }
            None => {
                self.pools.push((pool.clone(), list));
                if let Some(f) = self.v4.as_mut() {
                    f.domains.push(Domain::default());
                }
                if let Some(f) = self.v6.as_mut() {
                    f.domains.push(Domain::default());
                }
                self.pools.len()
            }
        };
        if let Some(f) = self.v4.as_mut() {
            f.domains[at].members = m4;
        }
        if let Some(f) = self.v6.as_mut() {
            f.domains[at].members = m6;
        }
        self.rebuild(&carry4, &carry6);
        Ok(())
    }

    /// Removes a named pool; its addresses return to the default pool (allocations stay).
    pub fn delete_pool(&mut self, name: &str) -> Result<()> {
        let i = self.pool_index(Some(name))?;
        if i == 0 {
            return Err(IpamError::NoSuchPool {
                subnet: self.spec.name.clone(),
                pool: name.to_owned(),
            });
        }
        let (carry4, carry6) = self.carried();
        self.pools.remove(i - 1);
        if let Some(f) = self.v4.as_mut() {
            f.domains.remove(i);
        }
        if let Some(f) = self.v6.as_mut() {
            f.domains.remove(i);
        }
        self.rebuild(&carry4, &carry6);
        Ok(())
    }

    /// Records one existing allocation without touching free space; [`Subnet::finish_restore`] derives it.
    /// `shared` lets the record share an IP or MAC with another owner (a snapshot's live-migration entries).
    pub(crate) fn restore_record(&mut self, rec: &Allocation, shared: bool) -> Result<()> {
        let name = &self.spec.name;
        check_names(&rec.pod, &rec.nic)?;
        if let Some(p) = rec.pool.as_deref() {
            self.pool_index(Some(p))?;
        }
        let existing = self.slots.find(&rec.pod, &rec.nic);
        let me = existing.unwrap_or(NIL);
        let conflict = |address: String, owner: String| IpamError::Conflict {
            subnet: name.clone(),
            address,
            owner,
        };
        fn check<A: SlotAddr>(
            f: Option<&Fam<A>>,
            slots: &Slots,
            subnet: &str,
            me: u32,
            a: Option<A>,
            shared: bool,
        ) -> Result<()> {
            let Some(a) = a else { return Ok(()) };
            let ip: IpAddr = a.to_ip().into();
            let f = f.ok_or(IpamError::InvalidFamily {
                subnet: subnet.to_owned(),
                family: A::FAMILY,
            })?;
            if f.gateway == Some(a) {
                return Err(IpamError::Gateway {
                    subnet: subnet.to_owned(),
                    ip,
                });
            }
            if !f.in_usable(a) {
                return Err(IpamError::OutOfRange {
                    subnet: subnet.to_owned(),
                    ip,
                });
            }
            let c = |owner| IpamError::Conflict {
                subnet: subnet.to_owned(),
                address: ip.to_string(),
                owner,
            };
            if let Some(o) = f.owner(slots, a, me).filter(|_| !shared) {
                return Err(c(slots.owner_name(o)));
            }
            if me != NIL && A::get(slots, me).is_some_and(|cur| cur != a) {
                return Err(c(format!(
                    "{} (holds {})",
                    slots.owner_name(me),
                    A::get(slots, me).map_or(a, |x| x).to_ip()
                )));
            }
            Ok(())
        }
        let a4 = rec.v4.map(u32::from);
        let a6 = rec.v6.map(u128::from);
        check(self.v4.as_ref(), &self.slots, name, me, a4, shared)?;
        check(self.v6.as_ref(), &self.slots, name, me, a6, shared)?;
        if let Some(m) = rec.mac {
            if Some(m) == self.spec.gateway_mac {
                return Err(conflict(m.to_string(), "gateway".to_owned()));
            }
            if let Some(o) = self.slots.mac_owner(m, me).filter(|_| !shared) {
                return Err(conflict(m.to_string(), self.slots.owner_name(o)));
            }
            if existing.is_some_and(|id| self.slots.mac(id) != m && !self.slots.mac_guessed(id)) {
                return Err(conflict(
                    m.to_string(),
                    format!("{}/{} (has another MAC)", rec.pod, rec.nic),
                ));
            }
        }
        let id = match existing {
            Some(id) => {
                if let Some(m) = rec.mac.filter(|_| self.slots.mac_guessed(id)) {
                    self.slots.set_mac(id, m);
                    self.slots.set_mac_guessed(id, false);
                }
                id
            }
            None => {
                let mac = match rec.mac {
                    Some(m) => m,
                    None => self.fresh_mac(),
                };
                let id = self.slots.create(&rec.pod, &rec.nic, mac);
                self.slots.set_mac_guessed(id, rec.mac.is_none());
                id
            }
        };
        if let (Some(f), Some(a)) = (self.v4.as_mut(), a4) {
            if self.slots.v4(id).is_none() {
                self.slots.set_v4(id, Some(a));
                f.index_insert(&self.slots, a, id, self.slots.hb.hash_one(a));
            }
        }
        if let (Some(f), Some(a)) = (self.v6.as_mut(), a6) {
            if self.slots.v6(id).is_none() {
                self.slots.set_v6(id, Some(a));
                f.index_insert(&self.slots, a, id, self.slots.hb.hash_one(a));
            }
        }
        Ok(())
    }

    /// Derives free space after [`Subnet::restore_record`] calls.
    pub(crate) fn finish_restore(&mut self) {
        let (carry4, carry6) = self.carried();
        self.rebuild(&carry4, &carry6);
    }

    /// The subnet's persistent state.
    pub fn snapshot(&self) -> SubnetSnapshot {
        let s = &self.slots;
        let mut allocations: Vec<SnapshotEntry> = s
            .ids()
            .map(|id| {
                let shared = s.v4(id).is_some_and(|a| {
                    self.v4
                        .as_ref()
                        .is_some_and(|f| f.owner(s, a, id).is_some())
                }) || s.v6(id).is_some_and(|a| {
                    self.v6
                        .as_ref()
                        .is_some_and(|f| f.owner(s, a, id).is_some())
                }) || s.mac_owner(s.mac(id), id).is_some();
                let n = self.nic_ref(id);
                SnapshotEntry {
                    pod: n.pod.to_owned(),
                    nic: n.nic.to_owned(),
                    v4: n.addrs.v4,
                    v6: n.addrs.v6,
                    mac: n.addrs.mac,
                    shared,
                }
            })
            .collect();
        allocations.sort_unstable();
        let (c4, c6) = self.carried();
        let released = IpRangeList {
            v4: RangeSet::from_sorted(c4),
            v6: RangeSet::from_sorted(c6),
        };
        SubnetSnapshot {
            spec: self.spec.clone(),
            pools: self.pools.iter().map(|(p, _)| p.clone()).collect(),
            allocations,
            released: released.to_string(),
            rng: self.rng.0,
        }
    }

    /// Rebuilds a subnet from its snapshot; an inconsistent snapshot is an error.
    pub fn from_snapshot(snap: &SubnetSnapshot) -> Result<Subnet> {
        let mut s = Subnet::new(&snap.spec, snap.rng)?;
        for p in &snap.pools {
            s.add_or_update_pool(p)?;
        }
        let mut rec = Allocation {
            subnet: snap.spec.name.clone(),
            ..Default::default()
        };
        for e in &snap.allocations {
            rec.pod.clone_from(&e.pod);
            rec.nic.clone_from(&e.nic);
            rec.v4 = e.v4;
            rec.v6 = e.v6;
            rec.mac = Some(e.mac);
            s.restore_record(&rec, e.shared)?;
        }
        let released: IpRangeList = snap.released.parse()?;
        s.rebuild(&released.v4.to_vec(), &released.v6.to_vec());
        s.rng = Rng(snap.rng);
        Ok(s)
    }
}
