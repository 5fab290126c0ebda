//! Address ranges: the free-space representation and Kube-OVN's range strings.
//!
//! Addresses are plain integers (`u32` for IPv4, `u128` for IPv6) behind the [`Addr`] trait, so one
//! implementation serves both families and a range costs the same whatever its size.

use std::collections::BTreeMap;
use std::fmt;
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use crate::{Family, IpamError, Result};

/// An address of one family as an integer.
pub trait Addr: Copy + Default + Ord + Hash + fmt::Debug + Send + Sync + 'static {
    /// The std address type.
    type Ip: Copy + fmt::Display + FromStr + Into<IpAddr>;
    /// The family.
    const FAMILY: Family;
    /// Number of bits.
    const BITS: u32;
    /// The highest address.
    const MAX: Self;
    /// Converts to the std type.
    fn to_ip(self) -> Self::Ip;
    /// Converts from the std type.
    fn from_ip(ip: Self::Ip) -> Self;
    /// Converts from an [`IpAddr`] of this family.
    fn from_ipaddr(ip: IpAddr) -> Option<Self>;
    /// The next address, if any.
    fn succ(self) -> Option<Self>;
    /// The previous address, if any.
    fn pred(self) -> Option<Self>;
    /// Number of addresses in `lo..=hi` (saturating).
    fn span(lo: Self, hi: Self) -> u128;
    /// The host bits of a prefix length (`0` for a full-length prefix).
    fn host_mask(prefix: u8) -> Self;
    /// Bitwise and-not: `self & !mask`.
    fn and_not(self, mask: Self) -> Self;
    /// Bitwise or.
    fn or(self, mask: Self) -> Self;
}

impl Addr for u32 {
    type Ip = Ipv4Addr;
    const FAMILY: Family = Family::V4;
    const BITS: u32 = 32;
    const MAX: Self = u32::MAX;
    fn to_ip(self) -> Ipv4Addr {
        Ipv4Addr::from(self)
    }
    fn from_ip(ip: Ipv4Addr) -> Self {
        u32::from(ip)
    }
    fn from_ipaddr(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V4(v) => Some(u32::from(v)),
            IpAddr::V6(_) => None,
        }
    }
    fn succ(self) -> Option<Self> {
        self.checked_add(1)
    }
    fn pred(self) -> Option<Self> {
        self.checked_sub(1)
    }
    fn span(lo: Self, hi: Self) -> u128 {
        u128::from(hi - lo) + 1
    }
    fn host_mask(prefix: u8) -> Self {
        u32::MAX.checked_shr(u32::from(prefix)).unwrap_or(0)
    }
    fn and_not(self, mask: Self) -> Self {
        self & !mask
    }
    fn or(self, mask: Self) -> Self {
        self | mask
    }
}

impl Addr for u128 {
    type Ip = Ipv6Addr;
    const FAMILY: Family = Family::V6;
    const BITS: u32 = 128;
    const MAX: Self = u128::MAX;
    fn to_ip(self) -> Ipv6Addr {
        Ipv6Addr::from(self)
    }
    fn from_ip(ip: Ipv6Addr) -> Self {
        u128::from(ip)
    }
    fn from_ipaddr(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V6(v) => Some(u128::from(v)),
            IpAddr::V4(_) => None,
        }
    }
    fn succ(self) -> Option<Self> {
        self.checked_add(1)
    }
    fn pred(self) -> Option<Self> {
        self.checked_sub(1)
    }
    fn span(lo: Self, hi: Self) -> u128 {
        (hi - lo).saturating_add(1)
    }
    fn host_mask(prefix: u8) -> Self {
        u128::MAX.checked_shr(u32::from(prefix)).unwrap_or(0)
    }
    fn and_not(self, mask: Self) -> Self {
        self & !mask
    }
    fn or(self, mask: Self) -> Self {
        self | mask
    }
}

/// True when `b` starts at or before the address after `a_hi` (the two ranges touch or overlap).
fn touches<A: Addr>(a_hi: A, b_lo: A) -> bool {
    b_lo <= a_hi || a_hi.succ() == Some(b_lo)
}

/// A set of addresses kept as disjoint, non-adjacent inclusive ranges, keyed by range end.
///
/// Keying by end lets "take the lowest address" change the first entry's value in place.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct RangeSet<A> {
    map: BTreeMap<A, A>,
}

impl<A: Addr> fmt::Debug for RangeSet<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RangeSet({self})")
    }
}

impl<A: Addr> RangeSet<A> {
    /// An empty set.
    pub fn new() -> Self {
        RangeSet {
            map: BTreeMap::new(),
        }
    }

    /// Builds from sorted, disjoint, non-adjacent ranges (as produced by the helpers of this module).
    pub(crate) fn from_sorted(ranges: Vec<(A, A)>) -> Self {
        RangeSet {
            map: ranges.into_iter().map(|(lo, hi)| (hi, lo)).collect(),
        }
    }

    /// Builds from any ranges (`lo > hi` ranges are ignored).
    pub fn from_ranges(ranges: impl IntoIterator<Item = (A, A)>) -> Self {
        let mut v: Vec<(A, A)> = ranges.into_iter().filter(|(lo, hi)| lo <= hi).collect();
        Self::from_sorted(normalize(&mut v))
    }

    /// The ranges, lowest first, as `(first, last)`.
    pub fn ranges(&self) -> impl DoubleEndedIterator<Item = (A, A)> + '_ {
        self.map.iter().map(|(&hi, &lo)| (lo, hi))
    }

    /// The ranges collected into a vector.
    pub(crate) fn to_vec(&self) -> Vec<(A, A)> {
        self.ranges().collect()
    }

    /// True when the set holds no address.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Number of addresses (saturating at `u128::MAX`).
    pub fn len(&self) -> u128 {
        self.ranges()
            .fold(0u128, |n, (lo, hi)| n.saturating_add(A::span(lo, hi)))
    }

    /// Number of ranges.
    pub fn range_count(&self) -> usize {
        self.map.len()
    }

    /// True when `a` is in the set.
    pub fn contains(&self, a: A) -> bool {
        self.map.range(a..).next().is_some_and(|(_, &lo)| lo <= a)
    }

    /// The lowest address.
    pub fn first(&self) -> Option<A> {
        self.map.first_key_value().map(|(_, &lo)| lo)
    }

    /// The lowest address for which `skip` is false.
    pub fn first_where_not(&self, skip: impl Fn(A) -> bool) -> Option<A> {
        for (lo, hi) in self.ranges() {
            let mut a = lo;
            loop {
                if !skip(a) {
                    return Some(a);
                }
                match a.succ() {
                    Some(n) if n <= hi => a = n,
                    _ => break,
                }
            }
        }
        None
    }

    /// Removes and returns the lowest address.
    pub fn take_first(&mut self) -> Option<A> {
        let mut e = self.map.first_entry()?;
        let lo = *e.get();
        if lo == *e.key() {
            e.remove();
        } else if let Some(n) = lo.succ() {
            *e.get_mut() = n;
        }
        Some(lo)
    }

    /// Adds one address; false if it was present.
    pub fn insert(&mut self, a: A) -> bool {
        let after = self.map.range(a..).next().map(|(&hi, &lo)| (hi, lo));
        if let Some((_, lo)) = after {
            if lo <= a {
                return false;
            }
        }
        let join_after = after
            .filter(|&(_, lo)| a.succ() == Some(lo))
            .map(|(hi, _)| hi);
        let join_before = a.pred().and_then(|p| self.map.get(&p).map(|&lo| (p, lo)));
        match (join_before, join_after) {
            (Some((phi, plo)), Some(hi)) => {
                self.map.remove(&phi);
                self.map.insert(hi, plo);
            }
            (Some((phi, plo)), None) => {
                self.map.remove(&phi);
                self.map.insert(a, plo);
            }
            (None, Some(hi)) => {
                self.map.insert(hi, a);
            }
            (None, None) => {
                self.map.insert(a, a);
            }
        }
        true
    }

    /// Adds `lo..=hi`, merging with touching ranges.
    pub fn insert_range(&mut self, lo: A, hi: A) {
        if lo > hi {
            return;
        }
        let (mut lo, mut hi) = (lo, hi);
        let from = lo.pred().unwrap_or(lo);
        while let Some((&e, &s)) = self.map.range(from..).next() {
            if !touches(hi, s) {
                break;
            }
            self.map.remove(&e);
            lo = lo.min(s);
            hi = hi.max(e);
        }
        self.map.insert(hi, lo);
    }

    /// Removes one address; false if it was absent.
    pub fn remove(&mut self, a: A) -> bool {
        let Some((&hi, lo)) = self.map.range_mut(a..).next() else {
            return false;
        };
        let start = *lo;
        if start > a {
            return false;
        }
        if start == hi {
            self.map.remove(&hi);
        } else if a == start {
            if let Some(n) = a.succ() {
                *lo = n;
            }
        } else if a == hi {
            self.map.remove(&hi);
            if let Some(p) = a.pred() {
                self.map.insert(p, start);
            }
        } else {
            if let Some(n) = a.succ() {
                *lo = n;
            }
            if let Some(p) = a.pred() {
                self.map.insert(p, start);
            }
        }
        true
    }

    /// Removes every address of `lo..=hi`.
    pub fn remove_range(&mut self, lo: A, hi: A) {
        if lo > hi {
            return;
        }
        while let Some((&e, &s)) = self.map.range(lo..).next() {
            if s > hi {
                break;
            }
            self.map.remove(&e);
            if s < lo {
                if let Some(p) = lo.pred() {
                    self.map.insert(p, s);
                }
            }
            if e > hi {
                if let Some(n) = hi.succ() {
                    self.map.insert(e, n);
                }
                break;
            }
        }
    }

    /// Removes every address.
    pub fn clear(&mut self) {
        self.map.clear();
    }
}

impl<A: Addr> fmt::Display for RangeSet<A> {
    /// Kube-OVN's format: `10.0.0.1,10.0.0.3-10.0.0.99`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (lo, hi)) in self.ranges().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if lo == hi {
                write!(f, "{}", lo.to_ip())?;
            } else {
                write!(f, "{}-{}", lo.to_ip(), hi.to_ip())?;
            }
        }
        Ok(())
    }
}

/// Sorts ranges and merges the touching ones.
pub(crate) fn normalize<A: Addr>(v: &mut [(A, A)]) -> Vec<(A, A)> {
    v.sort_unstable();
    let mut out: Vec<(A, A)> = Vec::with_capacity(v.len());
    for &(lo, hi) in v.iter() {
        match out.last_mut() {
            Some(last) if touches(last.1, lo) => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// Sorted distinct points to ranges.
pub(crate) fn points_to_ranges<A: Addr>(points: &[A]) -> Vec<(A, A)> {
    let mut out: Vec<(A, A)> = Vec::new();
    for &p in points {
        match out.last_mut() {
            Some(last) if last.1.succ() == Some(p) || last.1 == p => last.1 = p,
            _ => out.push((p, p)),
        }
    }
    out
}

/// `a - b` for normalized range lists, in one pass.
pub(crate) fn difference<A: Addr>(a: &[(A, A)], b: &[(A, A)]) -> Vec<(A, A)> {
    let mut out = Vec::with_capacity(a.len());
    let mut j = 0;
    for &(lo, hi) in a {
        let mut cur = Some(lo);
        while let Some(c) = cur {
            while j < b.len() && b[j].1 < c {
                j += 1;
            }
            if j == b.len() || b[j].0 > hi {
                out.push((c, hi));
                break;
            }
            if b[j].0 > c {
                if let Some(p) = b[j].0.pred() {
                    out.push((c, p));
                }
            }
            cur = b[j].1.succ().filter(|&n| n <= hi);
        }
    }
    out
}

/// `a ∩ b` for normalized range lists, in one pass.
pub(crate) fn intersection<A: Addr>(a: &[(A, A)], b: &[(A, A)]) -> Vec<(A, A)> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < a.len() && j < b.len() {
        let lo = a[i].0.max(b[j].0);
        let hi = a[i].1.min(b[j].1);
        if lo <= hi {
            out.push((lo, hi));
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// `a ∪ b` for normalized range lists.
#[allow(dead_code)]
pub(crate) fn union<A: Addr>(a: &[(A, A)], b: &[(A, A)]) -> Vec<(A, A)> {
    let mut v: Vec<(A, A)> = a.iter().chain(b).copied().collect();
    normalize(&mut v)
}

/// Number of sorted points inside normalized ranges.
pub(crate) fn count_points_in<A: Addr>(points: &[A], ranges: &[(A, A)]) -> u128 {
    let mut n = 0u128;
    let mut j = 0;
    for &p in points {
        while j < ranges.len() && ranges[j].1 < p {
            j += 1;
        }
        if j < ranges.len() && ranges[j].0 <= p {
            n += 1;
        }
    }
    n
}

/// Network address and prefix length of a CIDR.
pub(crate) fn parse_cidr<A: Addr>(text: &str) -> Result<(A, u8)> {
    let bad = |reason| IpamError::InvalidCidr {
        cidr: text.to_owned(),
        reason,
    };
    let (ip, len) = text
        .trim()
        .split_once('/')
        .ok_or_else(|| bad("missing /prefix"))?;
    let ip: A::Ip = ip.parse().map_err(|_| bad("bad address"))?;
    let prefix: u8 = len.parse().map_err(|_| bad("bad prefix length"))?;
    if u32::from(prefix) > A::BITS {
        return Err(bad("prefix length too long"));
    }
    Ok((A::from_ip(ip).and_not(A::host_mask(prefix)), prefix))
}

/// One item: `ip`, `a..b`, `a-b` or a CIDR, as an inclusive range of one family.
pub(crate) fn parse_item(text: &str) -> Result<IpRangeItem> {
    let t = text.trim();
    let bad = || IpamError::InvalidIp {
        text: text.to_owned(),
    };
    fn pair<A: Addr>(lo: &str, hi: &str) -> Option<(A, A)> {
        let lo = A::from_ip(lo.trim().parse().ok()?);
        let hi = A::from_ip(hi.trim().parse().ok()?);
        (lo <= hi).then_some((lo, hi))
    }
    if t.contains('/') {
        let v4 = parse_cidr::<u32>(t).map(|(n, p)| IpRangeItem::V4(n, n.or(u32::host_mask(p))));
        return v4
            .or_else(|_| {
                parse_cidr::<u128>(t).map(|(n, p)| IpRangeItem::V6(n, n.or(u128::host_mask(p))))
            })
            .map_err(|_| bad());
    }
    let (lo, hi) = t
        .split_once("..")
        .or_else(|| t.split_once('-'))
        .unwrap_or((t, t));
    if let Some((lo, hi)) = pair::<u32>(lo, hi) {
        return Ok(IpRangeItem::V4(lo, hi));
    }
    if let Some((lo, hi)) = pair::<u128>(lo, hi) {
        return Ok(IpRangeItem::V6(lo, hi));
    }
    Err(bad())
}

/// One parsed range item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IpRangeItem {
    V4(u32, u32),
    V6(u128, u128),
}

/// A list of IPv4 and IPv6 ranges, as Kube-OVN writes exclude IPs, IP pools and range statistics.
///
/// Parses items of the form `ip`, `first..last`, `first-last` and CIDR; formats as
/// `10.0.0.1,10.0.0.3-10.0.0.99,fd00::1` (IPv4 first).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IpRangeList {
    /// The IPv4 ranges.
    pub v4: RangeSet<u32>,
    /// The IPv6 ranges.
    pub v6: RangeSet<u128>,
}

impl IpRangeList {
    /// Parses a list of items (`ip`, `a..b`, `a-b`, CIDR); any bad item fails the whole list.
    pub fn parse<S: AsRef<str>>(items: &[S]) -> Result<Self> {
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        for item in items {
            match parse_item(item.as_ref())? {
                IpRangeItem::V4(lo, hi) => v4.push((lo, hi)),
                IpRangeItem::V6(lo, hi) => v6.push((lo, hi)),
            }
        }
        Ok(IpRangeList {
            v4: RangeSet::from_sorted(normalize(&mut v4)),
            v6: RangeSet::from_sorted(normalize(&mut v6)),
        })
    }

    /// Keeps only the addresses inside a subnet's CIDRs (`"v4,v6"`, either may be absent).
    pub fn clip_to_cidr(&self, cidr: &str) -> Result<Self> {
        let c = crate::subnet::Cidrs::parse(cidr)?;
        let clip = |lim: Option<(u32, u32)>| {
            lim.map(|l| intersection(&self.v4.to_vec(), &[l]))
                .unwrap_or_default()
        };
        let clip6 = |lim: Option<(u128, u128)>| {
            lim.map(|l| intersection(&self.v6.to_vec(), &[l]))
                .unwrap_or_default()
        };
        Ok(IpRangeList {
            v4: RangeSet::from_sorted(clip(c.v4.map(|(n, p)| (n, n.or(u32::host_mask(p)))))),
            v6: RangeSet::from_sorted(clip6(c.v6.map(|(n, p)| (n, n.or(u128::host_mask(p)))))),
        })
    }

    /// True when the list holds no address.
    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }

    /// True when `ip` is in the list.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v) => self.v4.contains(u32::from(v)),
            IpAddr::V6(v) => self.v6.contains(u128::from(v)),
        }
    }
}

impl fmt::Display for IpRangeList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sep = if !self.v4.is_empty() && !self.v6.is_empty() {
            ","
        } else {
            ""
        };
        write!(f, "{}{sep}{}", self.v4, self.v6)
    }
}

impl FromStr for IpRangeList {
    type Err = IpamError;

    /// Parses the comma separated form; the empty string is the empty list.
    fn from_str(s: &str) -> Result<Self> {
        if s.trim().is_empty() {
            return Ok(IpRangeList::default());
        }
        let items: Vec<&str> = s.split(',').collect();
        IpRangeList::parse(&items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> IpRangeList {
        IpRangeList::parse(items).unwrap()
    }

    #[test]
    fn parses_kube_ovn_items() {
        let l = set(&[
            "10.0.0.5",
            "10.0.0.7..10.0.0.9",
            "10.0.0.10-10.0.0.11",
            "10.0.1.0/30",
            "fd00::1..fd00::3",
        ]);
        assert_eq!(
            l.to_string(),
            "10.0.0.5,10.0.0.7-10.0.0.11,10.0.1.0-10.0.1.3,fd00::1-fd00::3"
        );
        assert_eq!(l.to_string().parse::<IpRangeList>().unwrap(), l);
        for bad in [
            "",
            "10.0.0.300",
            "10.0.0.9..10.0.0.7",
            "10.0.0.1..fd00::1",
            "10.0.0.0/33",
            "x",
            "1.2.3.4/",
        ] {
            assert!(IpRangeList::parse(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn clips_to_cidr() {
        let l = set(&[
            "10.0.0.250..10.0.1.5",
            "10.0.3.0/24",
            "fd00::ffff..fd00:0:0:1::2",
        ]);
        let c = l.clip_to_cidr("10.0.1.0/24,fd00::/64").unwrap();
        assert_eq!(
            c.to_string(),
            "10.0.1.0-10.0.1.5,fd00::ffff-fd00::ffff:ffff:ffff:ffff"
        );
    }

    #[test]
    fn insert_remove_take() {
        let mut s = RangeSet::<u32>::new();
        s.insert_range(1, 10);
        assert!(s.remove(5));
        assert!(!s.remove(5));
        assert_eq!(s.to_vec(), vec![(1, 4), (6, 10)]);
        assert!(s.insert(5));
        assert_eq!(s.to_vec(), vec![(1, 10)]);
        assert_eq!(s.take_first(), Some(1));
        assert!(s.remove(10));
        assert!(s.remove(9) && s.remove(2));
        assert_eq!(s.to_vec(), vec![(3, 8)]);
        s.remove_range(4, 5);
        assert_eq!(s.to_vec(), vec![(3, 3), (6, 8)]);
        assert_eq!(s.first_where_not(|a| a == 3 || a == 6), Some(7));
        assert_eq!(s.len(), 4);
        s.insert(u32::MAX);
        s.insert(0);
        assert!(s.contains(u32::MAX) && s.contains(0) && !s.contains(1));
    }

    #[test]
    fn set_algebra() {
        let a = vec![(1u32, 10), (20, 30)];
        let b = vec![(5u32, 6), (10, 22), (30, 40)];
        assert_eq!(difference(&a, &b), vec![(1, 4), (7, 9), (23, 29)]);
        assert_eq!(
            intersection(&a, &b),
            vec![(5, 6), (10, 10), (20, 22), (30, 30)]
        );
        assert_eq!(union(&a, &b), vec![(1, 40)]);
        assert_eq!(count_points_in(&[1, 11, 25, 41], &a), 2);
        assert_eq!(points_to_ranges(&[1u32, 2, 3, 5]), vec![(1, 3), (5, 5)]);
    }
}
