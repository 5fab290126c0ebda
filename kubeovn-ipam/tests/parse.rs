//! Property tests of the range/exclude parser: parse -> format -> parse round trip, membership, clipping.
#![allow(clippy::unwrap_used)] // Test helpers panic on purpose.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kubeovn_ipam::IpRangeList;
use proptest::prelude::*;

/// An item and a naive membership test for it. Small address spaces so items overlap and touch.
#[derive(Clone, Debug)]
struct Item {
    text: String,
    v6: bool,
    lo: u128,
    hi: u128,
}

fn v4(x: u128) -> String {
    Ipv4Addr::from(0x0a00_0000 + x as u32).to_string()
}

fn v6(x: u128) -> String {
    Ipv6Addr::from((0xfd00u128 << 112) + x).to_string()
}

fn item() -> impl Strategy<Value = Item> {
    (any::<bool>(), 0..3u8, 0..300u128, 0..40u128, 24..33u8).prop_map(
        |(is6, kind, a, len, prefix)| {
            let f = if is6 { v6 } else { v4 };
            match kind {
                0 => Item {
                    text: f(a),
                    v6: is6,
                    lo: a,
                    hi: a,
                },
                1 => {
                    let sep = if len % 2 == 0 { ".." } else { "-" };
                    Item {
                        text: format!("{}{sep}{}", f(a), f(a + len)),
                        v6: is6,
                        lo: a,
                        hi: a + len,
                    }
                }
                _ => {
                    let host = 32 - u32::from(prefix);
                    let net = a & !((1u128 << host) - 1);
                    let p = if is6 { 96 + prefix } else { prefix };
                    Item {
                        text: format!("{}/{p}", f(a)),
                        v6: is6,
                        lo: net,
                        hi: net + (1 << host) - 1,
                    }
                }
            }
        },
    )
}

fn probe(is6: bool, x: u128) -> IpAddr {
    if is6 {
        IpAddr::V6(Ipv6Addr::from((0xfd00u128 << 112) + x))
    } else {
        IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + x as u32))
    }
}

proptest! {
    #[test]
    fn round_trip_and_membership(items in prop::collection::vec(item(), 0..12), probes in prop::collection::vec((any::<bool>(), 0..400u128), 20)) {
        let texts: Vec<&str> = items.iter().map(|i| i.text.as_str()).collect();
        let l = IpRangeList::parse(&texts).unwrap();
        let s = l.to_string();
        prop_assert_eq!(&s.parse::<IpRangeList>().unwrap(), &l);
        let parts: Vec<&str> = if s.is_empty() { vec![] } else { s.split(',').collect() };
        prop_assert_eq!(&IpRangeList::parse(&parts).unwrap(), &l);
        // The formatted form is canonical: formatting again gives the same text.
        prop_assert_eq!(IpRangeList::parse(&parts).unwrap().to_string(), s);
        for (is6, x) in probes {
            let want = items.iter().any(|i| i.v6 == is6 && i.lo <= x && x <= i.hi);
            prop_assert_eq!(l.contains(probe(is6, x)), want, "{:?}", probe(is6, x));
        }
    }

    #[test]
    fn clipping(items in prop::collection::vec(item(), 0..12), prefix in 24..31u8, base in 0..300u128, probes in prop::collection::vec((any::<bool>(), 0..400u128), 20)) {
        let texts: Vec<&str> = items.iter().map(|i| i.text.as_str()).collect();
        let l = IpRangeList::parse(&texts).unwrap();
        let host = 32 - u32::from(prefix);
        let net = base & !((1u128 << host) - 1);
        let cidr = format!("{}/{prefix},{}/{}", v4(net), v6(net), 96 + prefix);
        let c = l.clip_to_cidr(&cidr).unwrap();
        for (is6, x) in probes {
            let inside = net <= x && x < net + (1 << host);
            prop_assert_eq!(c.contains(probe(is6, x)), inside && l.contains(probe(is6, x)));
        }
        // Clipping to only one family drops the other.
        let only4 = l.clip_to_cidr(&format!("{}/{prefix}", v4(net))).unwrap();
        prop_assert!(only4.v6.is_empty());
    }

    #[test]
    fn garbage_never_panics(s in "\\PC{0,40}") {
        let _ = s.parse::<IpRangeList>();
        let _ = IpRangeList::parse(&[s.as_str()]);
    }
}
