//! Operation sequences on a small dual-stack subnet with a pool. After every step: no address has two owners,
//! next-free never hands out the gateway or an excluded address, counts add up, a failed operation changed
//! nothing, and snapshot -> restore is identical.
#![no_main]

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use arbitrary::Arbitrary;
use kubeovn_ipam::{AllocRequest, Allocation, Family, Ipam, IpRangeList, PoolSpec, SubnetSpec};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Alloc { pod: u8, nic: bool, family: Option<bool>, pool: bool, skip: Option<u8>, mac: Option<u8> },
    Static { pod: u8, nic: bool, v6: bool, off: u8, check: bool },
    Release { pod: u8, nic: bool },
    ReleasePod { pod: u8 },
    Update { spec: u8 },
    Pool { lo: u8, len: u8, delete: bool },
    Restore { pod: u8, off4: Option<u8>, off6: Option<u8> },
    Reload,
}

const SPECS: [(&str, &str, &[&str]); 4] = [
    ("10.0.0.0/27,fd00::/123", "10.0.0.1,fd00::1", &["10.0.0.5..10.0.0.7", "fd00::5-fd00::7"]),
    ("10.0.0.0/28,fd00::/124", "10.0.0.14,fd00::2", &["10.0.0.0/30"]),
    ("10.0.0.0/26", "10.0.0.1", &["10.0.0.40..10.0.0.63"]),
    ("fd00::/122", "", &[]),
];

fn spec(i: u8) -> SubnetSpec {
    let (cidr, gw, ex) = SPECS[i as usize % SPECS.len()];
    SubnetSpec::new("s", cidr, gw).exclude(ex.iter().copied())
}

fn v4(off: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, off % 64))
}

fn v6(off: u8) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(off % 64)))
}

fn names(pod: u8, nic: bool) -> (String, &'static str) {
    (format!("p{}", pod % 8), if nic { "net1" } else { "eth0" })
}

fn check(ipam: &Ipam, shared: bool) {
    let s = ipam.subnet("s").expect("subnet");
    let sp = s.spec();
    let excluded = IpRangeList::parse(&sp.exclude_ips).expect("valid");
    let gws: Vec<IpAddr> = sp.gateway.split(',').filter(|g| !g.is_empty()).map(|g| g.parse().expect("ip")).collect();
    let mut used = BTreeSet::new();
    let mut macs = BTreeSet::new();
    for n in s.iter() {
        for ip in n.addrs.ips() {
            assert!(s.cidr_contains(ip));
            assert!(!gws.contains(&ip), "gateway {ip} allocated");
            let fresh = used.insert(ip);
            assert!(fresh || shared, "{ip} owned twice");
        }
        let fresh = macs.insert(n.addrs.mac);
        assert!(fresh || shared, "MAC twice");
        assert!(Some(n.addrs.mac) != sp.gateway_mac);
    }
    let st = s.stats();
    for (fam, fs) in [(Family::V4, &st.v4), (Family::V6, &st.v6)] {
        let used_f = used.iter().filter(|ip| Family::of(**ip) == fam).count() as u128;
        assert_eq!(fs.using, used_f);
        let avail: IpRangeList = fs.available_range.parse().expect("range");
        assert_eq!(avail.v4.len() + avail.v6.len(), fs.available);
        for ip in used.iter().filter(|ip| Family::of(**ip) == fam) {
            assert!(!avail.contains(*ip), "{ip} both used and available");
        }
        for (lo, hi) in avail.v4.ranges().chain([]) {
            for a in [lo, hi] {
                let ip = IpAddr::V4(Ipv4Addr::from(a));
                assert!(!excluded.contains(ip) && !gws.contains(&ip), "{ip} available");
            }
        }
    }
    let pool_sum: u128 = st.pools.iter().map(|p| p.v4.using + p.v6.using).sum();
    assert!(pool_sum <= st.v4.using + st.v6.using);
    let snap = ipam.snapshot();
    let back = Ipam::from_snapshot(&snap).expect("own snapshot loads");
    assert_eq!(back.snapshot(), snap);
    for f in [Family::V4, Family::V6] {
        assert_eq!(back.subnet("s").expect("subnet").free_and_released(f), s.free_and_released(f));
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let mut ipam = Ipam::with_seed(1);
    ipam.add_or_update_subnet(&spec(0)).expect("spec");
    let mut shared = false;
    for op in ops.into_iter().take(64) {
        let before = ipam.snapshot();
        let failed = match op {
            Op::Alloc { pod, nic, family, pool, skip, mac } => {
                let (p, n) = names(pod, nic);
                let skips: Vec<IpAddr> = skip.iter().flat_map(|&o| [v4(o), v6(o)]).collect();
                let mut r = AllocRequest::new(&p, n).skip(&skips);
                if let Some(f) = family {
                    r = r.family(if f { Family::V6 } else { Family::V4 });
                }
                if pool {
                    r = r.pool("pool");
                }
                if let Some(m) = mac {
                    r = r.mac(kubeovn_ipam::Mac([0x0a, 0, 0, 0, 0, m % 4]));
                }
                let old = ipam.get("s", &p, n).expect("subnet");
                match ipam.allocate("s", &r) {
                    Ok(a) => {
                        let s = ipam.subnet("s").expect("subnet");
                        let ex = IpRangeList::parse(&s.spec().exclude_ips).expect("valid");
                        for ip in a.ips() {
                            let kept = old.is_some_and(|o| o.ips().any(|x| x == ip));
                            assert!(kept || !ex.contains(ip), "next-free gave excluded {ip}");
                            assert!(!skips.contains(&ip) || kept);
                        }
                        false
                    }
                    Err(_) => true,
                }
            }
            Op::Static { pod, nic, v6: six, off, check } => {
                let (p, n) = names(pod, nic);
                let ips = [if six { v6(off) } else { v4(off) }];
                shared |= !check;
                ipam.allocate("s", &AllocRequest::new(&p, n).static_ips(&ips).check_conflict(check)).is_err()
            }
            Op::Release { pod, nic } => {
                let (p, n) = names(pod, nic);
                ipam.release("s", &p, n).is_err()
            }
            Op::ReleasePod { pod } => {
                ipam.release_pod(&names(pod, false).0);
                false
            }
            Op::Update { spec: i } => {
                let dropped = ipam.add_or_update_subnet(&spec(i));
                dropped.is_err()
            }
            Op::Pool { lo, len, delete } => {
                if delete {
                    ipam.delete_pool("s", "pool").is_err()
                } else {
                    let lo = lo % 64;
                    let hi = lo.saturating_add(len % 8).min(63);
                    let items = [format!("{}..{}", v4(lo), v4(hi)), format!("{}..{}", v6(lo), v6(hi))];
                    ipam.add_or_update_pool("s", &PoolSpec::new("pool", items)).is_err()
                }
            }
            Op::Restore { pod, off4, off6 } => {
                let (p, n) = names(pod, false);
                let rec = Allocation {
                    subnet: "s".into(),
                    pod: p,
                    nic: n.into(),
                    v4: off4.map(|o| Ipv4Addr::new(10, 0, 0, o % 64)),
                    v6: off6.map(|o| Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(o % 64))),
                    ..Default::default()
                };
                let rep = ipam.restore([rec]);
                if rep.restored == 0 {
                    assert_eq!(ipam.snapshot(), before, "a refused record changed state");
                }
                false
            }
            Op::Reload => {
                ipam = Ipam::from_snapshot(&ipam.snapshot()).expect("reload");
                false
            }
        };
        if failed {
            assert_eq!(ipam.snapshot(), before, "a failed operation changed state");
        }
        check(&ipam, shared);
    }
});
