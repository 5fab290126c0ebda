//! Parses arbitrary text as Kube-OVN annotation values (pod, namespace, node, ip_pool, Multus networks): a bad
//! value is an error naming its key, never a panic; whatever parses renders back to text that parses to an
//! equal value.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;

// kubeovn-core without its default `controller` feature: the types, not the Kubernetes client stack.
use kubeovn_core::annotations::{
    self as a, IpPoolRequest, NamespaceAnnotations, NodeAnnotations, PodNetworkAnnotations,
};

const POD_KEYS: &[&str] = &[
    a::IP_ADDRESS,
    a::MAC_ADDRESS,
    a::CIDR,
    a::GATEWAY,
    a::LOGICAL_SWITCH,
    a::ALLOCATED,
    a::IP_POOL,
    a::INGRESS_RATE,
    a::ROUTES,
    a::PORT_SECURITY,
    a::VLAN_ID,
    a::EXCLUDE_IPS,
];

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    // Up to three keys get values from the input, separated by NUL.
    let mut anns = BTreeMap::new();
    for (i, v) in text.split('\0').take(3).enumerate() {
        let k = POD_KEYS[(sel as usize + i * 5) % POD_KEYS.len()];
        anns.insert(k.to_owned(), v.to_owned());
    }
    match PodNetworkAnnotations::parse(&anns, "ovn") {
        Ok(p) => {
            let again = PodNetworkAnnotations::parse(&p.render("ovn"), "ovn")
                .expect("rendered pod annotations parse");
            assert_eq!(again, p);
        }
        Err(e) => assert!(anns.contains_key(&e.key), "error names a given key"),
    }
    match NamespaceAnnotations::parse(&anns) {
        // Kube-OVN writes one cidr and one exclude list per switch; only such values render losslessly.
        Ok(n) => {
            let k = n.logical_switches.len();
            if n.cidrs.len() == k && n.exclude_ips.len() == k {
                let again = NamespaceAnnotations::parse(&n.render())
                    .expect("rendered namespace annotations parse");
                assert_eq!(again, n);
            }
        }
        Err(e) => assert!(anns.contains_key(&e.key), "error names a given key"),
    }
    if let Ok(n) = NodeAnnotations::parse(&anns) {
        assert_eq!(NodeAnnotations::parse(&n.render()).expect("node"), n);
    }
    if let Ok(p) = IpPoolRequest::parse(a::IP_POOL, text) {
        assert_eq!(
            IpPoolRequest::parse(a::IP_POOL, &p.render()).expect("pool"),
            p
        );
    }
    match a::parse_networks(text, "default") {
        Ok(nets) => {
            let again = a::parse_networks(&a::render_networks(&nets), "other")
                .expect("rendered networks parse");
            assert_eq!(again, nets);
        }
        Err(e) => assert_eq!(e.key, a::NETWORKS),
    }
});
