//! The range/CIDR/exclude parser: anything that parses formats canonically and parses back to the same set;
//! clipping only removes addresses; MAC text round-trips.
#![no_main]

use kubeovn_ipam::{IpRangeList, Mac};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (Vec<String>, String, String)| {
    let (items, cidr, mac) = input;
    if let Ok(l) = IpRangeList::parse(&items) {
        let s = l.to_string();
        let back: IpRangeList = s.parse().expect("formatted list parses");
        assert_eq!(back, l, "{s}");
        assert_eq!(back.to_string(), s, "format is canonical");
        // Every single-address item is in the list.
        for it in &items {
            if let Ok(ip) = it.trim().parse() {
                assert!(l.contains(ip), "{it}");
            }
        }
        if let Ok(c) = l.clip_to_cidr(&cidr) {
            for (lo, hi) in c.v4.ranges() {
                assert!(l.v4.contains(lo) && l.v4.contains(hi));
            }
            for (lo, hi) in c.v6.ranges() {
                assert!(l.v6.contains(lo) && l.v6.contains(hi));
            }
            assert!(c.v4.len() <= l.v4.len() && c.v6.len() <= l.v6.len());
        }
    }
    if let Ok(m) = mac.parse::<Mac>() {
        assert_eq!(m.to_string().parse::<Mac>().expect("formatted MAC parses"), m);
    }
});
