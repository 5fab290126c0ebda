//! Shared helpers for the kubeovn-rs benchmarks: names, a seeded shuffle, pre-filled subnets.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kubeovn_ipam::{AllocRequest, Allocation, Subnet, SubnetSpec};

/// `n` pod names shaped like Kubernetes' (`namespace/deployment-hash-suffix`).
pub fn pod_names(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("default/web-7d4b9c{:05}", i))
        .collect()
}

/// xorshift64*: deterministic shuffles without a `rand` dependency.
#[derive(Clone, Debug)]
pub struct XorShift(pub u64);

impl XorShift {
    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value below `n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Fisher-Yates with a fixed seed.
pub fn shuffle<T>(v: &mut [T], seed: u64) {
    let mut r = XorShift(seed | 1);
    for i in (1..v.len()).rev() {
        v.swap(i, r.below(i + 1));
    }
}

/// The /16 of the benchmarks.
pub fn spec16() -> SubnetSpec {
    SubnetSpec::new("s16", "10.16.0.0/16", "10.16.0.1")
}

/// Dual stack /16 + /112.
pub fn spec_dual() -> SubnetSpec {
    SubnetSpec::new(
        "dual",
        "10.16.0.0/16,fd00:10:16::/112",
        "10.16.0.1,fd00:10:16::1",
    )
}

/// A /8.
pub fn spec8() -> SubnetSpec {
    SubnetSpec::new("s8", "10.0.0.0/8", "10.0.0.1")
}

/// A subnet with the first `n` names allocated next-free.
pub fn filled(spec: &SubnetSpec, names: &[String], n: usize) -> Subnet {
    let mut s = Subnet::new(spec, 1).expect("valid spec");
    for name in &names[..n] {
        s.allocate(&AllocRequest::new(name, "eth0")).expect("room");
    }
    s
}

/// `n` allocation records numbered from the second address of each family's CIDR (as a fill gives them).
pub fn records(spec: &SubnetSpec, names: &[String], n: usize) -> Vec<Allocation> {
    let (b4, b6) = bases(spec);
    names[..n]
        .iter()
        .enumerate()
        .map(|(i, name)| Allocation {
            subnet: spec.name.clone(),
            pod: name.clone(),
            nic: "eth0".into(),
            v4: b4.map(|b| Ipv4Addr::from(b + 2 + i as u32)),
            v6: b6.map(|b| Ipv6Addr::from(b + 2 + i as u128)),
            ..Default::default()
        })
        .collect()
}

/// `n` distinct static requests (one address per family of the subnet, above the gateway).
pub fn static_ips(spec: &SubnetSpec, n: usize) -> Vec<Vec<IpAddr>> {
    let (b4, b6) = bases(spec);
    (0..n)
        .map(|i| {
            let v4 = b4.map(|b| IpAddr::V4(Ipv4Addr::from(b + 2 + i as u32)));
            let v6 = b6.map(|b| IpAddr::V6(Ipv6Addr::from(b + 2 + i as u128)));
            v4.into_iter().chain(v6).collect()
        })
        .collect()
}

/// Network addresses of a spec's CIDRs.
fn bases(spec: &SubnetSpec) -> (Option<u32>, Option<u128>) {
    let mut b4 = None;
    let mut b6 = None;
    for part in spec.cidr.split(',') {
        let ip = part.split('/').next().unwrap_or_default();
        match ip.parse::<IpAddr>() {
            Ok(IpAddr::V4(a)) => b4 = Some(u32::from(a)),
            Ok(IpAddr::V6(a)) => b6 = Some(u128::from(a)),
            Err(_) => {}
        }
    }
    (b4, b6)
}
