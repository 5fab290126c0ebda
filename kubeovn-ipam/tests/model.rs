//! Model-based test: random operation sequences against a naive reference model of Kube-OVN's rules.
//!
//! After every step: the allocations match the model, no address has two owners, excluded and gateway addresses
//! are never handed out by next-free, the never-used and released sets match the model (so the reuse order does),
//! counts agree, and snapshot -> restore gives an identical state.
#![allow(clippy::unwrap_used)] // Test helpers panic on purpose.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kubeovn_ipam::range::RangeSet;
use kubeovn_ipam::*;
use proptest::prelude::*;

const V4: u32 = 0x0a00_0000; // 10.0.0.0/28
const V6: u128 = 0xfd00 << 112; // fd00::/124
const GW: u8 = 1;
const EXCLUDED: [u8; 3] = [5, 6, 13];
const POOL: [u8; 3] = [10, 11, 12];

fn addr(fam: usize, off: u8) -> IpAddr {
    if fam == 0 {
        IpAddr::V4(Ipv4Addr::from(V4 + u32::from(off)))
    } else {
        IpAddr::V6(Ipv6Addr::from(V6 + u128::from(off)))
    }
}

fn spec() -> SubnetSpec {
    SubnetSpec::new("s", "10.0.0.0/28,fd00::/124", "10.0.0.1,fd00::1").exclude([
        "10.0.0.5..10.0.0.6",
        "10.0.0.13",
        "fd00::5-fd00::6",
        "fd00::d",
    ])
}

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        pod: u8,
        nic: u8,
        family: Option<usize>,
        pool: bool,
        skip: Option<u8>,
    },
    Static {
        pod: u8,
        nic: u8,
        fam: usize,
        off: u8,
        only: bool,
    },
    Release {
        pod: u8,
        nic: u8,
    },
    ReleasePod {
        pod: u8,
    },
    Reload,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..6u8, 0..2u8, prop::option::of(0..2usize), any::<bool>(), prop::option::of(0..16u8))
            .prop_map(|(pod, nic, family, pool, skip)| Op::Alloc { pod, nic, family, pool, skip }),
        2 => (0..6u8, 0..2u8, 0..2usize, 0..16u8, any::<bool>())
            .prop_map(|(pod, nic, fam, off, only)| Op::Static { pod, nic, fam, off, only }),
        3 => (0..6u8, 0..2u8).prop_map(|(pod, nic)| Op::Release { pod, nic }),
        1 => (0..6u8).prop_map(|pod| Op::ReleasePod { pod }),
        1 => Just(Op::Reload),
    ]
}

#[derive(Clone, Default)]
struct Domain {
    free: BTreeSet<u8>,
    released: BTreeSet<u8>,
}

/// Kube-OVN's rules written the obvious way, over 16-address families.
struct Model {
    dom: [[Domain; 2]; 2], // [family][default, pool]
    owners: BTreeMap<(u8, u8), [Option<u8>; 2]>,
}

fn usable(off: u8) -> bool {
    (1..15).contains(&off) && off != GW && !EXCLUDED.contains(&off)
}

fn dom_of(off: u8) -> usize {
    usize::from(POOL.contains(&off))
}

impl Model {
    fn new() -> Self {
        let mut dom: [[Domain; 2]; 2] = Default::default();
        for f in &mut dom {
            for off in (0..16).filter(|&o| usable(o)) {
                f[dom_of(off)].free.insert(off);
            }
        }
        Model {
            dom,
            owners: BTreeMap::new(),
        }
    }

    fn owner_of(&self, fam: usize, off: u8) -> Option<(u8, u8)> {
        self.owners
            .iter()
            .find(|(_, a)| a[fam] == Some(off))
            .map(|(k, _)| *k)
    }

    fn peek(&self, fam: usize, d: usize, skip: Option<u8>) -> Option<u8> {
        let d = &self.dom[fam][d];
        let ok = |o: &&u8| Some(**o) != skip;
        d.free
            .iter()
            .find(ok)
            .or_else(|| d.released.iter().find(ok))
            .copied()
    }

    /// Next-free swaps released into free once free is empty; a static take never swaps (as in Kube-OVN).
    fn take(&mut self, fam: usize, off: u8, pick: bool) {
        let d = &mut self.dom[fam][dom_of(off)];
        if d.free.remove(&off) {
            return;
        }
        if pick && d.free.is_empty() {
            std::mem::swap(&mut d.free, &mut d.released);
            d.free.remove(&off);
        } else {
            d.released.remove(&off);
        }
    }

    fn unuse(&mut self, fam: usize, off: u8) {
        if usable(off) {
            self.dom[fam][dom_of(off)].released.insert(off);
        }
    }

    /// Returns the new addresses, or None when the request must fail (and change nothing).
    fn alloc(
        &mut self,
        key: (u8, u8),
        want: [bool; 2],
        stat: [Option<u8>; 2],
        pool: bool,
        skip: Option<u8>,
    ) -> Option<[Option<u8>; 2]> {
        let cur = self.owners.get(&key).copied().unwrap_or_default();
        let mut plan = [None; 2];
        for fam in 0..2 {
            if !want[fam] {
                continue;
            }
            if let Some(off) = stat[fam] {
                if off == GW || !(1..15).contains(&off) {
                    return None;
                }
                if cur[fam] == Some(off) {
                    continue;
                }
                if self.owner_of(fam, off).is_some() {
                    return None;
                }
                plan[fam] = Some(off);
            } else {
                if cur[fam].is_some() && cur[fam] != skip {
                    continue;
                }
                plan[fam] = Some(self.peek(fam, usize::from(pool), skip)?);
            }
        }
        let mut now = cur;
        for fam in 0..2 {
            if let Some(new) = plan[fam] {
                if let Some(old) = cur[fam] {
                    now[fam] = None;
                    self.owners.insert(key, now);
                    self.unuse(fam, old);
                }
                self.take(fam, new, stat[fam].is_none());
                now[fam] = Some(new);
            }
        }
        self.owners.insert(key, now);
        Some(now)
    }

    fn release(&mut self, key: (u8, u8)) {
        if let Some(a) = self.owners.remove(&key) {
            for (fam, off) in a.iter().enumerate() {
                if let Some(off) = off {
                    self.unuse(fam, *off);
                }
            }
        }
    }
}

fn pod(p: u8) -> String {
    format!("pod{p}")
}

fn nic(n: u8) -> String {
    format!("eth{n}")
}

fn offset(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(a) => (u32::from(a) - V4) as u8,
        IpAddr::V6(a) => (u128::from(a) - V6) as u8,
    }
}

fn set_of(fam: usize, offs: impl Iterator<Item = u8>) -> IpRangeList {
    let mut l = IpRangeList::default();
    if fam == 0 {
        l.v4 = RangeSet::from_ranges(offs.map(|o| (V4 + u32::from(o), V4 + u32::from(o))));
    } else {
        l.v6 = RangeSet::from_ranges(offs.map(|o| (V6 + u128::from(o), V6 + u128::from(o))));
    }
    l
}

fn check(ipam: &Ipam, model: &Model) {
    let s = ipam.subnet("s").unwrap();
    // Allocations match; no address owned twice; MACs unique, local, unicast.
    let mut got = BTreeMap::new();
    let mut macs = BTreeSet::new();
    let mut used: [BTreeSet<u8>; 2] = Default::default();
    for n in s.iter() {
        let p: u8 = n.pod[3..].parse().unwrap();
        let i: u8 = n.nic[3..].parse().unwrap();
        let a = [
            n.addrs.v4.map(|x| offset(x.into())),
            n.addrs.v6.map(|x| offset(x.into())),
        ];
        for fam in 0..2 {
            if let Some(o) = a[fam] {
                assert!(used[fam].insert(o), "address {o} owned twice");
            }
        }
        assert!(macs.insert(n.addrs.mac), "MAC {} twice", n.addrs.mac);
        assert!(n.addrs.mac.is_local() && n.addrs.mac.is_unicast());
        got.insert((p, i), a);
    }
    assert_eq!(got, model.owners);
    let st = s.stats();
    for (fam, family, fs) in [(0, Family::V4, &st.v4), (1, Family::V6, &st.v6)] {
        let (free, rel) = s.free_and_released(family);
        let mfree = set_of(
            fam,
            model.dom[fam].iter().flat_map(|d| d.free.iter().copied()),
        );
        let mrel = set_of(
            fam,
            model.dom[fam]
                .iter()
                .flat_map(|d| d.released.iter().copied()),
        );
        assert_eq!(free.parse::<IpRangeList>().unwrap(), mfree, "{family} free");
        assert_eq!(
            rel.parse::<IpRangeList>().unwrap(),
            mrel,
            "{family} released"
        );
        let avail: usize = model.dom[fam]
            .iter()
            .map(|d| d.free.len() + d.released.len())
            .sum();
        assert_eq!(fs.available, avail as u128);
        assert_eq!(fs.using, used[fam].len() as u128);
        let pool_using = used[fam].iter().filter(|o| POOL.contains(o)).count();
        let ps = if fam == 0 {
            &st.pools[0].v4
        } else {
            &st.pools[0].v6
        };
        assert_eq!(ps.using, pool_using as u128);
        assert_eq!(
            ps.available,
            (model.dom[fam][1].free.len() + model.dom[fam][1].released.len()) as u128
        );
    }
    // Snapshot -> restore is identical, through JSON.
    let snap = ipam.snapshot();
    let json = serde_json::to_string(&snap).unwrap();
    let back = Ipam::from_snapshot(&serde_json::from_str(&json).unwrap()).unwrap();
    assert_eq!(back.snapshot(), snap);
    for f in [Family::V4, Family::V6] {
        assert_eq!(
            back.subnet("s").unwrap().free_and_released(f),
            s.free_and_released(f)
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn matches_the_model(ops in prop::collection::vec(op(), 1..60)) {
        let mut ipam = Ipam::with_seed(5);
        ipam.add_or_update_subnet(&spec()).unwrap();
        ipam.add_or_update_pool("s", &PoolSpec::new("p", ["10.0.0.10..10.0.0.12", "fd00::a-fd00::c"])).unwrap();
        let mut model = Model::new();
        for op in ops {
            match op {
                Op::Alloc { pod: p, nic: n, family, pool, skip } => {
                    let skips: Vec<IpAddr> = skip.iter().flat_map(|&o| [addr(0, o), addr(1, o)]).collect();
                    let (pn, nn) = (pod(p), nic(n));
                    let mut req = AllocRequest::new(&pn, &nn).skip(&skips);
                    if pool {
                        req = req.pool("p");
                    }
                    let want = match family {
                        None => [true, true],
                        Some(f) => {
                            req = req.family(if f == 0 { Family::V4 } else { Family::V6 });
                            [f == 0, f == 1]
                        }
                    };
                    let before = ipam.snapshot();
                    let prev = model.owners.get(&(p, n)).copied().unwrap_or_default();
                    let got = ipam.allocate("s", &req);
                    let want = model.alloc((p, n), want, [None, None], pool, skip);
                    match (got, want) {
                        (Ok(a), Some(w)) => {
                            let g = [a.v4.map(|x| offset(x.into())), a.v6.map(|x| offset(x.into()))];
                            prop_assert_eq!(g, w);
                            // Newly picked addresses are never the gateway nor excluded.
                            for fam in 0..2 {
                                if let Some(o) = g[fam].filter(|&o| Some(o) != prev[fam]) {
                                    prop_assert!(o != GW && !EXCLUDED.contains(&o));
                                }
                            }
                        }
                        (Err(_), None) => prop_assert_eq!(ipam.snapshot(), before),
                        (g, w) => prop_assert!(false, "ipam {:?} model {:?}", g, w),
                    }
                }
                Op::Static { pod: p, nic: n, fam, off, only } => {
                    let ips = [addr(fam, off)];
                    let (pn, nn) = (pod(p), nic(n));
                    let mut req = AllocRequest::new(&pn, &nn).static_ips(&ips);
                    let mut want = [true, true];
                    if only {
                        req = req.family(if fam == 0 { Family::V4 } else { Family::V6 });
                        want = [fam == 0, fam == 1];
                    }
                    let mut stat = [None, None];
                    stat[fam] = Some(off);
                    let before = ipam.snapshot();
                    let got = ipam.allocate("s", &req);
                    let want = model.alloc((p, n), want, stat, false, None);
                    match (got, want) {
                        (Ok(a), Some(w)) => {
                            let g = [a.v4.map(|x| offset(x.into())), a.v6.map(|x| offset(x.into()))];
                            prop_assert_eq!(g, w);
                        }
                        (Err(_), None) => prop_assert_eq!(ipam.snapshot(), before),
                        (g, w) => prop_assert!(false, "ipam {:?} model {:?}", g, w),
                    }
                }
                Op::Release { pod: p, nic: n } => {
                    let had = ipam.release("s", &pod(p), &nic(n)).unwrap().is_some();
                    prop_assert_eq!(had, model.owners.contains_key(&(p, n)));
                    model.release((p, n));
                }
                Op::ReleasePod { pod: p } => {
                    let n = ipam.release_pod(&pod(p));
                    let keys: Vec<_> = model.owners.keys().filter(|k| k.0 == p).copied().collect();
                    prop_assert_eq!(n, keys.len());
                    for k in keys {
                        model.release(k);
                    }
                }
                Op::Reload => {
                    ipam = Ipam::from_snapshot(&ipam.snapshot()).unwrap();
                }
            }
            check(&ipam, &model);
        }
    }
}
