//! Our versions of Kube-OVN's `pkg/ipam` test scenarios, plus the fixes this crate adds.
#![allow(clippy::unwrap_used)] // Test helpers panic on purpose.

use std::net::IpAddr;

use kubeovn_ipam::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn req<'a>(pod: &'a str) -> AllocRequest<'a> {
    AllocRequest::new(pod, "eth0")
}

fn ipam_with(spec: SubnetSpec) -> Ipam {
    let mut ipam = Ipam::with_seed(42);
    ipam.add_or_update_subnet(&spec).unwrap();
    ipam
}

fn v4(a: Addresses) -> String {
    a.v4.map(|x| x.to_string()).unwrap_or_default()
}

#[test]
fn exclude_strings_and_usable_range() {
    let spec = SubnetSpec::new("s", "10.16.0.0/16", "10.16.0.1").exclude([
        "10.16.0.2..10.16.0.10",
        "10.16.0.12",
        "10.16.1.0/24",
        "10.15.255.250..10.16.0.1", // partly outside: clipped
        "192.168.0.1",              // outside: ignored
        "fd00::1",                  // other family: ignored
    ]);
    let mut ipam = ipam_with(spec);
    assert_eq!(v4(ipam.allocate("s", &req("a")).unwrap()), "10.16.0.11");
    assert_eq!(v4(ipam.allocate("s", &req("b")).unwrap()), "10.16.0.13");
    let st = ipam.stats("s").unwrap();
    // 65534 usable - gateway - 9 - 1 - 256 excluded - 2 used.
    assert_eq!(st.v4.available, 65534 - 1 - 9 - 1 - 256 - 2);
    assert_eq!(st.v4.using, 2);
    assert_eq!(st.v4.using_range, "10.16.0.11,10.16.0.13");
    assert!(st
        .v4
        .available_range
        .starts_with("10.16.0.14-10.16.0.255,10.16.2.0-10.16.255.254"));
    // Excluded addresses may be taken statically; the gateway, network and broadcast never.
    let s = [ip("10.16.0.5")];
    assert_eq!(
        v4(ipam.allocate("s", &req("c").static_ips(&s)).unwrap()),
        "10.16.0.5"
    );
    for (bad, want_gw) in [
        ("10.16.0.1", true),
        ("10.16.0.0", false),
        ("10.16.255.255", false),
        ("10.17.0.1", false),
    ] {
        let s = [ip(bad)];
        let err = ipam.allocate("s", &req("d").static_ips(&s)).unwrap_err();
        assert_eq!(
            matches!(err, IpamError::Gateway { .. }),
            want_gw,
            "{bad}: {err}"
        );
        assert_eq!(
            matches!(err, IpamError::OutOfRange { .. }),
            !want_gw,
            "{bad}: {err}"
        );
    }
    assert_eq!(ipam.get("s", "d", "eth0").unwrap(), None);
    // Releasing an excluded address does not make it allocatable.
    ipam.release("s", "c", "eth0").unwrap();
    assert_eq!(
        ipam.stats("s").unwrap().v4.available,
        65534 - 1 - 9 - 1 - 256 - 2
    );
}

#[test]
fn slash30_reuse_order() {
    let mut ipam = ipam_with(SubnetSpec::new("s", "10.0.0.0/30", ""));
    let a = ipam.allocate("s", &req("p1")).unwrap();
    assert_eq!(v4(a), "10.0.0.1");
    ipam.release("s", "p1", "eth0").unwrap();
    // Never-used .2 goes before released .1.
    assert_eq!(v4(ipam.allocate("s", &req("p2")).unwrap()), "10.0.0.2");
    ipam.release("s", "p2", "eth0").unwrap();
    assert_eq!(v4(ipam.allocate("s", &req("p3")).unwrap()), "10.0.0.1");
    assert_eq!(v4(ipam.allocate("s", &req("p4")).unwrap()), "10.0.0.2");
    let err = ipam.allocate("s", &req("p5")).unwrap_err();
    assert!(
        matches!(
            err,
            IpamError::NoAvailable {
                family: Family::V4,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn delayed_reuse_waits_for_swapped_set() {
    // Free .1-.6; after exhaustion released {.2,.4} becomes the free set; .1 released later waits behind them.
    let mut ipam = ipam_with(SubnetSpec::new("s", "10.0.0.0/29", ""));
    for p in ["a", "b", "c", "d", "e", "f"] {
        ipam.allocate("s", &req(p)).unwrap();
    }
    ipam.release("s", "d", "eth0").unwrap();
    ipam.release("s", "b", "eth0").unwrap();
    assert_eq!(v4(ipam.allocate("s", &req("g")).unwrap()), "10.0.0.2");
    ipam.release("s", "a", "eth0").unwrap();
    assert_eq!(v4(ipam.allocate("s", &req("h")).unwrap()), "10.0.0.4");
    assert_eq!(v4(ipam.allocate("s", &req("i")).unwrap()), "10.0.0.1");
}

#[test]
fn tiny_prefixes() {
    let mut ipam = Ipam::with_seed(1);
    ipam.add_or_update_subnet(&SubnetSpec::new("p31", "10.0.0.0/31", ""))
        .unwrap();
    ipam.add_or_update_subnet(&SubnetSpec::new("p32", "10.0.0.8/32", ""))
        .unwrap();
    ipam.add_or_update_subnet(&SubnetSpec::new("p127", "fd00::/127", ""))
        .unwrap();
    ipam.add_or_update_subnet(&SubnetSpec::new("p64", "fd00:1::/126", ""))
        .unwrap();
    assert_eq!(v4(ipam.allocate("p31", &req("a")).unwrap()), "10.0.0.0");
    assert_eq!(v4(ipam.allocate("p31", &req("b")).unwrap()), "10.0.0.1");
    assert!(ipam.allocate("p31", &req("c")).is_err());
    assert!(matches!(
        ipam.allocate("p32", &req("a")).unwrap_err(),
        IpamError::NoAvailable { .. }
    ));
    assert_eq!(
        ipam.allocate("p127", &req("a"))
            .unwrap()
            .v6
            .unwrap()
            .to_string(),
        "fd00::"
    );
    assert_eq!(
        ipam.allocate("p127", &req("b"))
            .unwrap()
            .v6
            .unwrap()
            .to_string(),
        "fd00::1"
    );
    // IPv6 loses the subnet-router anycast (::0) and the all-ones address.
    assert_eq!(
        ipam.stats("p64").unwrap().v6.available_range,
        "fd00:1::1-fd00:1::2"
    );
}

#[test]
fn static_conflicts_and_live_migration() {
    let mut ipam = ipam_with(SubnetSpec::new("s", "10.0.0.0/24", "10.0.0.1"));
    let s = [ip("10.0.0.20")];
    let a = ipam.allocate("s", &req("p1").static_ips(&s)).unwrap();
    assert_eq!(v4(a), "10.0.0.20");
    // Same request again: same addresses and MAC.
    assert_eq!(ipam.allocate("s", &req("p1").static_ips(&s)).unwrap(), a);
    let err = ipam.allocate("s", &req("p2").static_ips(&s)).unwrap_err();
    assert_eq!(
        err,
        IpamError::Conflict {
            subnet: "s".into(),
            address: "10.0.0.20".into(),
            owner: "p1/eth0".into()
        }
    );
    // Live migration: the target pod shares the address.
    let b = ipam
        .allocate("s", &req("p2").static_ips(&s).check_conflict(false))
        .unwrap();
    assert_eq!(v4(b), "10.0.0.20");
    assert_ne!(a.mac, b.mac);
    assert_eq!(ipam.stats("s").unwrap().v4.using, 1);
    // The shared state survives a snapshot round trip; restoring it from outside records reports the sharing.
    let snap = ipam.snapshot();
    assert_eq!(Ipam::from_snapshot(&snap).unwrap().snapshot(), snap);
    assert_eq!(
        snap.subnets[0]
            .allocations
            .iter()
            .filter(|e| e.shared)
            .count(),
        2
    );
    let mut fresh = ipam_with(SubnetSpec::new("s", "10.0.0.0/24", "10.0.0.1"));
    let recs = ipam
        .subnet("s")
        .unwrap()
        .iter()
        .map(|n| Allocation::new("s", n.pod, n.nic, n.addrs));
    assert_eq!(fresh.restore(recs.collect::<Vec<_>>()).conflicts.len(), 1);
    ipam.release("s", "p1", "eth0").unwrap();
    assert_eq!(ipam.owner(ip("10.0.0.20")).unwrap().pod, "p2");
    ipam.release("s", "p2", "eth0").unwrap();
    assert!(!ipam.contains(ip("10.0.0.20")));
    assert_eq!(ipam.stats("s").unwrap().v4.using, 0);
    // Next-free never returns a static address in use.
    let s = [ip("10.0.0.2")];
    ipam.allocate("s", &req("x").static_ips(&s)).unwrap();
    assert_eq!(v4(ipam.allocate("s", &req("y")).unwrap()), "10.0.0.3");
    // Two static IPs of one family, a static IP of another family than asked: refused.
    let two = [ip("10.0.0.50"), ip("10.0.0.51")];
    assert!(matches!(
        ipam.allocate("s", &req("z").static_ips(&two)),
        Err(IpamError::InvalidRequest { .. })
    ));
    let v6 = [ip("fd00::5")];
    assert!(matches!(
        ipam.allocate("s", &req("z").static_ips(&v6)),
        Err(IpamError::InvalidFamily { .. })
    ));
}

#[test]
fn replacing_a_static_ip_releases_only_that_family() {
    let mut ipam = ipam_with(SubnetSpec::new(
        "s",
        "10.0.0.0/24,fd00::/120",
        "10.0.0.1,fd00::1",
    ));
    let s = [ip("10.0.0.10"), ip("fd00::10")];
    let a = ipam.allocate("s", &req("p").static_ips(&s)).unwrap();
    let s2 = [ip("10.0.0.11")];
    let b = ipam.allocate("s", &req("p").static_ips(&s2)).unwrap();
    assert_eq!(v4(b), "10.0.0.11");
    assert_eq!(b.v6, a.v6);
    assert_eq!(b.mac, a.mac);
    assert!(!ipam.contains(ip("10.0.0.10")));
    assert!(ipam.contains(ip("fd00::10")));
    let (_, released) = ipam.subnet("s").unwrap().free_and_released(Family::V4);
    assert_eq!(released, "10.0.0.10");
}

#[test]
fn dual_stack_allocates_both_with_one_mac_and_rolls_back() {
    let spec = SubnetSpec::new("d", "10.0.0.0/29,fd00::/126", "10.0.0.1,fd00::1");
    let mut ipam = ipam_with(spec);
    let a = ipam.allocate("d", &req("a")).unwrap();
    assert_eq!(
        (v4(a), a.v6.unwrap().to_string()),
        ("10.0.0.2".into(), "fd00::2".into())
    );
    // v6 has fd00::2 only (::1 gateway, ::3 all-ones): the next dual request fails on v6 and takes no v4.
    let before = ipam.snapshot();
    let err = ipam.allocate("d", &req("b")).unwrap_err();
    assert!(
        matches!(
            err,
            IpamError::NoAvailable {
                family: Family::V6,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(ipam.snapshot(), before);
    // A v4-only request still works, and a later v6 request for the same nic keeps its v4 and MAC.
    let b = ipam.allocate("d", &req("b").family(Family::V4)).unwrap();
    assert_eq!((v4(b), b.v6), ("10.0.0.3".into(), None));
    ipam.release("d", "a", "eth0").unwrap();
    let b2 = ipam.allocate("d", &req("b")).unwrap();
    assert_eq!((b2.v4, b2.mac), (b.v4, b.mac));
    assert_eq!(b2.v6.unwrap().to_string(), "fd00::2");
}

#[test]
fn skip_list() {
    let mut ipam = ipam_with(SubnetSpec::new("s", "10.0.0.0/24", "10.0.0.1"));
    let skip = [ip("10.0.0.2"), ip("10.0.0.3")];
    assert_eq!(
        v4(ipam.allocate("s", &req("a").skip(&skip)).unwrap()),
        "10.0.0.4"
    );
    // An existing address in the skip list is replaced (Kube-OVN: a pod whose address failed a check).
    let skip = [ip("10.0.0.4")];
    assert_eq!(
        v4(ipam.allocate("s", &req("a").skip(&skip)).unwrap()),
        "10.0.0.2"
    );
    assert!(!ipam.contains(ip("10.0.0.4")));
}

#[test]
fn pools() {
    let mut ipam = ipam_with(SubnetSpec::new("s", "10.0.0.0/27", "10.0.0.1"));
    ipam.add_or_update_pool(
        "s",
        &PoolSpec::new("p", ["10.0.0.2..10.0.0.4", "10.0.0.16/30"]),
    )
    .unwrap();
    let err = ipam
        .add_or_update_pool("s", &PoolSpec::new("q", ["10.0.0.4"]))
        .unwrap_err();
    assert_eq!(
        err,
        IpamError::OverlappingPools {
            subnet: "s".into(),
            pool: "q".into(),
            other: "p".into()
        }
    );
    assert!(matches!(
        ipam.allocate("s", &req("x").pool("nope")),
        Err(IpamError::NoSuchPool { .. })
    ));
    assert_eq!(
        v4(ipam.allocate("s", &req("a").pool("p")).unwrap()),
        "10.0.0.2"
    );
    // The default pool never hands out pooled addresses.
    let mut got = Vec::new();
    for i in 0..100 {
        match ipam.allocate("s", &req(&format!("d{i}"))) {
            Ok(a) => got.push(v4(a)),
            Err(e) => {
                assert!(matches!(e, IpamError::NoAvailable { pool: None, .. }));
                break;
            }
        }
    }
    assert_eq!(got.len(), 30 - 1 - 7);
    assert_eq!(got[0], "10.0.0.5");
    assert!(!got
        .iter()
        .any(|a| ["10.0.0.3", "10.0.0.16", "10.0.0.17"].contains(&a.as_str())));
    let st = ipam.stats("s").unwrap();
    assert_eq!(st.pools.len(), 1);
    let p = &st.pools[0].v4;
    assert_eq!((p.available, p.using), (6, 1));
    assert_eq!(p.available_range, "10.0.0.3-10.0.0.4,10.0.0.16-10.0.0.19");
    assert_eq!(p.using_range, "10.0.0.2");
    assert_eq!(
        ipam.subnet("s").unwrap().pool_of(ip("10.0.0.17")),
        Some("p")
    );
    // Removing the pool returns its addresses to the default pool.
    ipam.delete_pool("s", "p").unwrap();
    assert_eq!(v4(ipam.allocate("s", &req("after")).unwrap()), "10.0.0.3");
    assert_eq!(ipam.stats("s").unwrap().v4.available, 5);
}

#[test]
fn mac_only_subnet_and_static_macs() {
    let gw: Mac = "0a:00:00:00:00:01".parse().unwrap();
    let mut ipam = ipam_with(SubnetSpec::new("m", "", "").gateway_mac(gw));
    let a = ipam.allocate("m", &req("a")).unwrap();
    assert_eq!((a.v4, a.v6), (None, None));
    assert!(a.mac.is_local() && a.mac.is_unicast());
    let s = [ip("10.0.0.1")];
    assert!(matches!(
        ipam.allocate("m", &req("b").static_ips(&s)),
        Err(IpamError::InvalidFamily { .. })
    ));
    assert!(matches!(
        ipam.allocate("m", &req("b").family(Family::V6)),
        Err(IpamError::InvalidFamily { .. })
    ));
    let m: Mac = "0a:00:00:00:00:02".parse().unwrap();
    assert_eq!(ipam.allocate("m", &req("b").mac(m)).unwrap().mac, m);
    let err = ipam.allocate("m", &req("c").mac(m)).unwrap_err();
    assert!(
        matches!(&err, IpamError::Conflict { owner, .. } if owner == "b/eth0"),
        "{err}"
    );
    let err = ipam.allocate("m", &req("c").mac(gw)).unwrap_err();
    assert!(
        matches!(&err, IpamError::Conflict { owner, .. } if owner == "gateway"),
        "{err}"
    );
    assert_eq!(ipam.get("m", "c", "eth0").unwrap(), None);
    // A nic changes its MAC on request; the old one is free again.
    let m2: Mac = "0a:00:00:00:00:03".parse().unwrap();
    assert_eq!(ipam.allocate("m", &req("b").mac(m2)).unwrap().mac, m2);
    assert_eq!(ipam.allocate("m", &req("c").mac(m)).unwrap().mac, m);
}

#[test]
fn pods_with_several_nics() {
    let mut ipam = Ipam::with_seed(3);
    ipam.add_or_update_subnet(&SubnetSpec::new("a", "10.0.0.0/24", "10.0.0.1"))
        .unwrap();
    ipam.add_or_update_subnet(&SubnetSpec::new("b", "10.1.0.0/24", "10.1.0.1"))
        .unwrap();
    ipam.allocate("a", &AllocRequest::new("p", "eth0")).unwrap();
    ipam.allocate("a", &AllocRequest::new("p", "net1")).unwrap();
    ipam.allocate("a", &AllocRequest::new("q", "eth0")).unwrap();
    ipam.allocate("b", &AllocRequest::new("p", "eth0")).unwrap();
    let all = ipam.pod_allocations("p");
    assert_eq!(all.len(), 3);
    assert_eq!(ipam.subnet("a").unwrap().pod("p").count(), 2);
    assert_eq!(ipam.subnet("a").unwrap().iter().count(), 3);
    assert_eq!(
        ipam.release("a", "p", "net1").unwrap().map(v4).as_deref(),
        Some("10.0.0.3")
    );
    assert_eq!(ipam.release("a", "p", "net1").unwrap(), None);
    assert_eq!(ipam.release_pod("p"), 2);
    assert!(ipam.pod_allocations("p").is_empty());
    assert_eq!(
        ipam.get("a", "q", "eth0").unwrap().map(v4).as_deref(),
        Some("10.0.0.4")
    );
    assert!(matches!(
        ipam.release("zz", "p", "eth0"),
        Err(IpamError::NoSuchSubnet { .. })
    ));
}

#[test]
fn update_keeps_valid_allocations_and_reports_dropped() {
    let mut ipam = ipam_with(SubnetSpec::new(
        "s",
        "10.0.0.0/24,fd00::/120",
        "10.0.0.1,fd00::1",
    ));
    let s = [ip("10.0.0.200"), ip("fd00::20")];
    ipam.allocate("s", &req("hi").static_ips(&s)).unwrap();
    let lo = ipam.allocate("s", &req("lo")).unwrap();
    let s = [ip("10.0.0.5")];
    ipam.allocate("s", &req("ex").static_ips(&s)).unwrap();
    // Shrink v4 to /25, exclude .5 (kept: excluded addresses may stay in use), drop v6 entirely.
    let spec = SubnetSpec::new("s", "10.0.0.0/25", "10.0.0.1").exclude(["10.0.0.5"]);
    let dropped = ipam.add_or_update_subnet(&spec).unwrap();
    assert_eq!(dropped.len(), 3);
    let hi = dropped.iter().find(|d| d.pod == "hi").unwrap();
    assert_eq!(hi.v4.unwrap().to_string(), "10.0.0.200");
    assert_eq!(hi.v6.unwrap().to_string(), "fd00::20");
    // "hi" lost every address: released. "lo" keeps v4 and MAC.
    assert_eq!(ipam.get("s", "hi", "eth0").unwrap(), None);
    let lo2 = ipam.get("s", "lo", "eth0").unwrap().unwrap();
    assert_eq!((lo2.v4, lo2.v6, lo2.mac), (lo.v4, None, lo.mac));
    assert!(ipam.contains(ip("10.0.0.5")));
    let st = ipam.stats("s").unwrap();
    assert_eq!(st.v4.using, 2);
    assert_eq!(st.v4.available, 126 - 1 - 2);
    // Bad specs change nothing.
    let snap = ipam.snapshot();
    for bad in [
        SubnetSpec::new("s", "10.0.0.0/33", ""),
        SubnetSpec::new("s", "10.0.0.0/24,10.1.0.0/24", ""),
        SubnetSpec::new("s", "10.0.0.0/24", "10.9.0.1"),
        SubnetSpec::new("s", "10.0.0.0/24", "fd00::1"),
        SubnetSpec::new("s", "10.0.0.0/24", "").exclude(["10.0.0.x"]),
    ] {
        assert!(ipam.add_or_update_subnet(&bad).is_err(), "{bad:?}");
    }
    assert_eq!(ipam.snapshot(), snap);
    ipam.delete_subnet("s").unwrap();
    assert!(matches!(
        ipam.delete_subnet("s"),
        Err(IpamError::NoSuchSubnet { .. })
    ));
}

fn rec(subnet: &str, pod: &str, v4: Option<&str>, mac: Option<&str>) -> Allocation {
    Allocation {
        subnet: subnet.into(),
        pod: pod.into(),
        nic: "eth0".into(),
        v4: v4.map(|s| s.parse().unwrap()),
        v6: None,
        mac: mac.map(|m| m.parse().unwrap()),
        pool: None,
    }
}

#[test]
fn restore_from_several_sources_reports_conflicts() {
    let mut ipam = ipam_with(SubnetSpec::new("s", "10.0.0.0/24", "10.0.0.1"));
    let m1 = Some("0a:00:00:00:00:01");
    let records = vec![
        // IP record, then the pod annotation and the northbound port say the same: not a conflict.
        rec("s", "a", Some("10.0.0.7"), m1),
        rec("s", "a", Some("10.0.0.7"), m1),
        rec("s", "a", Some("10.0.0.7"), None),
        // Another pod claims a's address: Kube-OVN #4304 would double-assign it.
        rec("s", "b", Some("10.0.0.7"), None),
        // a's other source disagrees on the address.
        rec("s", "a", Some("10.0.0.8"), None),
        // Another pod claims a's MAC.
        rec("s", "c", Some("10.0.0.9"), m1),
        rec("s", "gw", Some("10.0.0.1"), None),
        rec("nope", "x", Some("10.0.0.3"), None),
        rec("s", "d", Some("10.0.0.2"), None),
        // The pod annotation had no MAC; the northbound port has it: adopted, not a conflict.
        rec("s", "d", Some("10.0.0.2"), Some("0a:00:00:00:00:0d")),
    ];
    let report = ipam.restore(records);
    assert_eq!(report.restored, 5);
    assert_eq!(
        ipam.get("s", "d", "eth0").unwrap().unwrap().mac.to_string(),
        "0a:00:00:00:00:0d"
    );
    let pods: Vec<(&str, &str)> = report
        .conflicts
        .iter()
        .map(|c| {
            let kind = match c.error {
                IpamError::Conflict { .. } => "conflict",
                IpamError::Gateway { .. } => "gateway",
                IpamError::NoSuchSubnet { .. } => "subnet",
                _ => "other",
            };
            (c.record.pod.as_str(), kind)
        })
        .collect();
    assert_eq!(
        pods,
        [
            ("b", "conflict"),
            ("a", "conflict"),
            ("c", "conflict"),
            ("gw", "gateway"),
            ("x", "subnet")
        ]
    );
    assert_eq!(ipam.owner(ip("10.0.0.7")).unwrap().pod, "a");
    assert_eq!(ipam.get("s", "b", "eth0").unwrap(), None);
    // Free space is derived from what was restored.
    assert_eq!(v4(ipam.allocate("s", &req("new")).unwrap()), "10.0.0.3");
    let st = ipam.stats("s").unwrap();
    assert_eq!((st.v4.using, st.v4.available), (3, 253 - 3));
}

#[test]
fn snapshot_round_trip_keeps_reuse_order() {
    let mut ipam = ipam_with(SubnetSpec::new(
        "s",
        "10.0.0.0/29,fd00::/125",
        "10.0.0.1,fd00::1",
    ));
    ipam.add_or_update_pool("s", &PoolSpec::new("p", ["10.0.0.6"]))
        .unwrap();
    for p in ["a", "b", "c"] {
        ipam.allocate("s", &req(p)).unwrap();
    }
    ipam.release("s", "b", "eth0").unwrap();
    let json = serde_json::to_string(&ipam.snapshot()).unwrap();
    let mut back = Ipam::from_snapshot(&serde_json::from_str(&json).unwrap()).unwrap();
    assert_eq!(back.snapshot(), ipam.snapshot());
    // Same MACs and same reuse order after the reload.
    for p in ["d", "e", "f"] {
        assert_eq!(
            back.allocate("s", &req(p)).ok(),
            ipam.allocate("s", &req(p)).ok()
        );
    }
    // A snapshot that double-assigns is refused.
    let mut snap = ipam.snapshot();
    let mut dup = snap.subnets[0].allocations[0].clone();
    dup.pod = "zzz".into();
    snap.subnets[0].allocations.push(dup);
    assert!(Ipam::from_snapshot(&snap).is_err());
}

#[test]
fn shared_handle_locks_per_subnet() {
    let shared = std::sync::Arc::new(SharedIpam::with_seed(9));
    shared
        .add_or_update_subnet(&SubnetSpec::new("a", "10.0.0.0/16", "10.0.0.1"))
        .unwrap();
    shared
        .add_or_update_subnet(&SubnetSpec::new("b", "10.1.0.0/16", "10.1.0.1"))
        .unwrap();
    let threads: Vec<_> = ["a", "b", "a", "b"]
        .into_iter()
        .enumerate()
        .map(|(t, subnet)| {
            let shared = shared.clone();
            std::thread::spawn(move || {
                for i in 0..500 {
                    let pod = format!("t{t}-{i}");
                    shared
                        .allocate(subnet, &AllocRequest::new(&pod, "eth0"))
                        .unwrap();
                    if i % 3 == 0 {
                        shared.release(subnet, &pod, "eth0").unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let total: u128 = ["a", "b"]
        .iter()
        .map(|s| shared.stats(s).unwrap().v4.using)
        .sum();
    assert_eq!(total, 4 * (500 - 167));
    let snap = shared.snapshot();
    let back = SharedIpam::from_snapshot(&snap).unwrap();
    assert_eq!(back.snapshot(), snap);
    assert_eq!(shared.subnet_names(), ["a", "b"]);
    // Which address a kept pod got depends on the threads' interleaving; that it is held does not.
    let kept = shared.get("a", "t0-1", "eth0").unwrap().unwrap();
    let v4 = kept.v4.unwrap();
    assert!(shared.contains(IpAddr::V4(v4)));
    assert_eq!(shared.owner(IpAddr::V4(v4)).unwrap().pod, "t0-1");
    // Released pods hold nothing.
    assert_eq!(shared.get("a", "t0-0", "eth0").unwrap(), None);
}

#[test]
fn empty_big_subnets_cost_like_small_ones() {
    let mut ipam = Ipam::with_seed(1);
    ipam.add_or_update_subnet(&SubnetSpec::new("eight", "10.0.0.0/8", "10.0.0.1"))
        .unwrap();
    ipam.add_or_update_subnet(&SubnetSpec::new("v6", "fd00::/64", "fd00::1"))
        .unwrap();
    for s in ["eight", "v6"] {
        assert!(ipam.subnet(s).unwrap().heap_bytes() < 4096);
    }
    assert_eq!(ipam.stats("eight").unwrap().v4.available, (1 << 24) - 3);
    assert_eq!(ipam.stats("v6").unwrap().v6.available, (1u128 << 64) - 3);
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let mut ipam = ipam_with(SubnetSpec::new("s", "10.0.0.0/24", "10.0.0.1"));
    assert!(matches!(
        ipam.allocate("s", &req("")),
        Err(IpamError::InvalidName { .. })
    ));
    let long = "x".repeat(70_000);
    assert!(matches!(
        ipam.allocate("s", &req(&long)),
        Err(IpamError::InvalidName { .. })
    ));
    assert!(matches!(
        ipam.allocate("nope", &req("a")),
        Err(IpamError::NoSuchSubnet { .. })
    ));
    assert!(matches!(
        ipam.add_or_update_pool("s", &PoolSpec::new("p", ["x"])),
        Err(IpamError::InvalidIp { .. })
    ));
    assert!(matches!(
        ipam.delete_pool("s", "p"),
        Err(IpamError::NoSuchPool { .. })
    ));
    assert!(matches!(
        "zz".parse::<Mac>(),
        Err(IpamError::InvalidMac { .. })
    ));
    assert!(matches!(
        Ipam::new().add_or_update_subnet(&SubnetSpec::new("x", "10.0.0.0", "")),
        Err(IpamError::InvalidCidr { .. })
    ));
    assert_eq!(ipam.stats("s").unwrap().v4.using, 0);
}

#[test]
fn shared_handle_cache_follows_deletes_and_instances() {
    let one = SharedIpam::with_seed(1);
    let two = SharedIpam::with_seed(2);
    one.add_or_update_subnet(&SubnetSpec::new("s", "10.0.0.0/24", "10.0.0.1"))
        .unwrap();
    two.add_or_update_subnet(&SubnetSpec::new("s", "10.9.0.0/24", "10.9.0.1"))
        .unwrap();
    let a = one.allocate("s", &req("p")).unwrap();
    let b = two.allocate("s", &req("p")).unwrap();
    assert_eq!((v4(a), v4(b)), ("10.0.0.2".into(), "10.9.0.2".into()));
    assert_eq!(v4(one.allocate("s", &req("q")).unwrap()), "10.0.0.3");
    one.delete_subnet("s").unwrap();
    assert!(matches!(
        one.allocate("s", &req("r")),
        Err(IpamError::NoSuchSubnet { .. })
    ));
    one.add_or_update_subnet(&SubnetSpec::new("s", "10.1.0.0/24", "10.1.0.1"))
        .unwrap();
    assert_eq!(v4(one.allocate("s", &req("r")).unwrap()), "10.1.0.2");
    assert_eq!(v4(two.allocate("s", &req("r")).unwrap()), "10.9.0.3");
}
