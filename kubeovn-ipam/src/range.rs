//! Address ranges: the free-space representation and Kube-OVN's range strings.
//!
//! Addresses are plain integers (`u32` for IPv4, `u128` for IPv6) behind the [`Addr`] trait, so one
//! implementation serves both families and a range costs the same whatever its size.

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

/// Ranges per chunk: small enough that shifting inside a chunk is a few cache lines.
const CHUNK: usize = 32;

/// A set of addresses kept as disjoint, non-adjacent inclusive ranges, sorted.
///
/// The ranges live in chunks of at most 32 ranges; emptied chunks are kept for reuse, so once the set has reached
/// its peak size, inserting and removing addresses allocate nothing (a `BTreeMap` frees and allocates nodes as it
/// splits and merges). Taking the lowest address changes the first range in place.
#[derive(Clone, Default)]
pub struct RangeSet<A> {
    /// Non-empty chunks, in order.
    chunks: Vec<Vec<(A, A)>>,
    /// The last address of each chunk: the outer binary search stays in one contiguous array.
    maxes: Vec<A>,
    /// Emptied chunks, kept for reuse.
    spare: Vec<Vec<(A, A)>>,
}

impl<A: Addr> PartialEq for RangeSet<A> {
    fn eq(&self, other: &Self) -> bool {
        self.ranges().eq(other.ranges())
    }
}

impl<A: Addr> Eq for RangeSet<A> {}

impl<A: Addr> fmt::Debug for RangeSet<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RangeSet({self})")
    }
}

impl<A: Addr> RangeSet<A> {
    /// An empty set.
    pub fn new() -> Self {
        RangeSet {
            chunks: Vec::new(),
            maxes: Vec::new(),
            spare: Vec::new(),
        }
    }

    /// Builds from sorted, disjoint, non-adjacent ranges (as produced by the helpers of this module).
    pub(crate) fn from_sorted(ranges: Vec<(A, A)>) -> Self {
        let mut s = RangeSet::new();
        s.chunks = ranges.chunks(CHUNK).map(|c| c.to_vec()).collect();
        s.maxes = s
            .chunks
            .iter()
            .filter_map(|c| c.last())
            .map(|r| r.1)
            .collect();
        s
    }

    /// Builds from any ranges (`lo > hi` ranges are ignored).
    pub fn from_ranges(ranges: impl IntoIterator<Item = (A, A)>) -> Self {
        let mut v: Vec<(A, A)> = ranges.into_iter().filter(|(lo, hi)| lo <= hi).collect();
        Self::from_sorted(normalize(&mut v))
    }

    /// The ranges, lowest first, as `(first, last)`.
    pub fn ranges(&self) -> impl Iterator<Item = (A, A)> + '_ {
        self.chunks.iter().flatten().copied()
    }

    /// The ranges collected into a vector.
    pub(crate) fn to_vec(&self) -> Vec<(A, A)> {
        self.ranges().collect()
    }

    /// True when the set holds no address.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Number of addresses (saturating at `u128::MAX`).
    pub fn len(&self) -> u128 {
        self.ranges()
            .fold(0u128, |n, (lo, hi)| n.saturating_add(A::span(lo, hi)))
    }

    /// Number of ranges.
    pub fn range_count(&self) -> usize {
        self.chunks.iter().map(Vec::len).sum()
    }

    /// Chunk and index of the first range ending at or after `a` (`chunks.len()` if none).
    fn locate(&self, a: A) -> (usize, usize) {
        let ci = self.maxes.partition_point(|&m| m < a);
        match self.chunks.get(ci) {
            Some(c) => (ci, c.partition_point(|r| r.1 < a)),
            None => (ci, 0),
        }
    }

    fn at(&self, (ci, j): (usize, usize)) -> Option<(A, A)> {
        self.chunks.get(ci).and_then(|c| c.get(j)).copied()
    }

    fn at_mut(&mut self, (ci, j): (usize, usize)) -> Option<&mut (A, A)> {
        self.chunks.get_mut(ci).and_then(|c| c.get_mut(j))
    }

    /// The position before `(ci, j)`.
    fn before(&self, (ci, j): (usize, usize)) -> Option<(usize, usize)> {
        if j > 0 {
            Some((ci, j - 1))
        } else if ci > 0 {
            Some((ci - 1, self.chunks[ci - 1].len() - 1))
        } else {
            None
        }
    }

    fn fix_max(&mut self, ci: usize) {
        if let (Some(m), Some(last)) = (
            self.maxes.get_mut(ci),
            self.chunks.get(ci).and_then(|c| c.last()),
        ) {
            *m = last.1;
        }
    }

    /// Sets the end of the range at `pos`.
    fn set_end(&mut self, pos: (usize, usize), end: A) {
        if let Some(r) = self.at_mut(pos) {
            r.1 = end;
        }
        self.fix_max(pos.0);
    }

    fn remove_at(&mut self, (ci, j): (usize, usize)) {
        let c = &mut self.chunks[ci];
        c.remove(j);
        if c.is_empty() {
            let c = self.chunks.remove(ci);
            self.maxes.remove(ci);
            self.spare.push(c);
        } else {
            self.fix_max(ci);
        }
    }

    /// Inserts a range at chunk `ci`, index `j` (`ci == chunks.len()` appends), splitting a full chunk.
    fn insert_at(&mut self, (ci, j): (usize, usize), r: (A, A)) {
        if self.chunks.is_empty() {
            let mut c = self
                .spare
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(CHUNK));
            c.push(r);
            self.chunks.push(c);
            self.maxes.push(r.1);
            return;
        }
        let (ci, j) = if ci == self.chunks.len() {
            (ci - 1, self.chunks[ci - 1].len())
        } else {
            (ci, j)
        };
        if self.chunks[ci].len() == CHUNK {
            let mut tail = self
                .spare
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(CHUNK));
            tail.extend(self.chunks[ci].drain(CHUNK / 2..));
            self.chunks.insert(ci + 1, tail);
            self.maxes.insert(ci + 1, r.1);
            self.fix_max(ci + 1);
            if j > CHUNK / 2 {
                self.chunks[ci + 1].insert(j - CHUNK / 2, r);
                self.fix_max(ci + 1);
                self.fix_max(ci);
                return;
            }
        }
        self.chunks[ci].insert(j, r);
        self.fix_max(ci);
    }

    /// True when `a` is in the set.
    pub fn contains(&self, a: A) -> bool {
        self.at(self.locate(a)).is_some_and(|(lo, _)| lo <= a)
    }

    /// The lowest address.
    pub fn first(&self) -> Option<A> {
        self.chunks.first().and_then(|c| c.first()).map(|r| r.0)
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
        let r = self.at_mut((0, 0))?;
        let lo = r.0;
        match lo.succ() {
            Some(n) if lo != r.1 => r.0 = n,
            _ => self.remove_at((0, 0)),
        }
        Some(lo)
    }

    /// Adds one address; false if it was present.
    pub fn insert(&mut self, a: A) -> bool {
        let pos = self.locate(a);
        let next = self.at(pos);
        if next.is_some_and(|(lo, _)| lo <= a) {
            return false;
        }
        let prev = self.before(pos);
        let join_before = prev.filter(|&p| self.at(p).is_some_and(|r| r.1.succ() == Some(a)));
        let join_after = next.is_some_and(|(lo, _)| a.succ() == Some(lo));
        match (join_before, join_after) {
            (Some(p), true) => {
                let hi = next.map_or(a, |r| r.1);
                self.remove_at(pos);
                self.set_end(p, hi);
            }
            (Some(p), false) => self.set_end(p, a),
            (None, true) => {
                if let Some(r) = self.at_mut(pos) {
                    r.0 = a;
                }
            }
            (None, false) => self.insert_at(pos, (a, a)),
        }
        true
    }

    /// Removes one address; false if it was absent.
    pub fn remove(&mut self, a: A) -> bool {
        let pos = self.locate(a);
        let Some((lo, hi)) = self.at(pos) else {
            return false;
        };
        if lo > a {
            return false;
        }
        match (a.pred().filter(|_| a > lo), a.succ().filter(|_| a < hi)) {
            (None, None) => self.remove_at(pos),
            (None, Some(n)) => {
                if let Some(r) = self.at_mut(pos) {
                    r.0 = n;
                }
            }
            (Some(p), None) => self.set_end(pos, p),
            (Some(p), Some(n)) => {
                self.set_end(pos, p);
                self.insert_at((pos.0, pos.1 + 1), (n, hi));
            }
        }
        true
    }

    /// Adds `lo..=hi`, merging with touching ranges.
    pub fn insert_range(&mut self, lo: A, hi: A) {
        if lo <= hi {
            *self = Self::from_sorted(union(&self.to_vec(), &[(lo, hi)]));
        }
    }

    /// Removes every address of `lo..=hi`.
    pub fn remove_range(&mut self, lo: A, hi: A) {
        if lo <= hi {
            *self = Self::from_sorted(difference(&self.to_vec(), &[(lo, hi)]));
        }
    }

    /// Removes every address.
    pub fn clear(&mut self) {
        let chunks = std::mem::take(&mut self.chunks);
        self.maxes.clear();
        self.spare.extend(chunks.into_iter().map(|mut c| {
            c.clear();
            c
        }));
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

/// The CIDRs of a subnet, at most one per family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Cidrs {
    pub(crate) v4: Option<(u32, u8)>,
    pub(crate) v6: Option<(u128, u8)>,
}

impl Cidrs {
    pub(crate) fn parse(text: &str) -> Result<Cidrs> {
        let mut c = Cidrs::default();
        if text.trim().is_empty() {
            return Ok(c);
        }
        for part in text.split(',') {
            let twice = || IpamError::InvalidCidr {
                cidr: text.to_owned(),
                reason: "two CIDRs of one family",
            };
            if part.contains(':') {
                if c.v6.replace(parse_cidr::<u128>(part)?).is_some() {
                    return Err(twice());
                }
            } else if c.v4.replace(parse_cidr::<u32>(part)?).is_some() {
                return Err(twice());
            }
        }
        Ok(c)
    }
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
        let c = Cidrs::parse(cidr)?;
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
    fn chunked_set_matches_a_btreeset() {
        let mut s = RangeSet::<u32>::new();
        let mut m = std::collections::BTreeSet::new();
        let mut x = 12345u64;
        for i in 0..20000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let a = (x % 600) as u32;
            match x % 5 {
                0 | 1 => assert_eq!(s.insert(a), m.insert(a)),
                2 | 3 => assert_eq!(s.remove(a), m.remove(&a)),
                _ => assert_eq!(s.take_first(), m.pop_first()),
            }
            if i % 97 == 0 {
                let want = RangeSet::from_ranges(m.iter().map(|&a| (a, a)));
                assert_eq!(s, want);
                assert_eq!(s.len(), m.len() as u128);
                assert!(s.chunks.iter().all(|c| !c.is_empty() && c.len() <= CHUNK));
                let maxes: Vec<u32> = s.chunks.iter().map(|c| c.last().unwrap().1).collect();
                assert_eq!(s.maxes, maxes);
                let v = s.to_vec();
                assert!(v.windows(2).all(|w| w[0].1.succ().unwrap() < w[1].0));
                assert_eq!(s.contains(a), m.contains(&a));
            }
        }
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
