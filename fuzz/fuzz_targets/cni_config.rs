//! Parses arbitrary bytes as a CNI network configuration (single or list); whatever parses must serialise
//! and parse back to an equal value, and the list form must agree with the auto-detecting parser.
#![no_main]

use kubeovn_cni::spec::{NetConf, NetConfList, NetworkConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = NetConf::from_slice(data) {
        let again =
            NetConf::from_slice(c.to_json().as_bytes()).expect("a serialised configuration parses");
        assert_eq!(again, c);
    }
    if let Ok(l) = NetConfList::from_slice(data) {
        let text = serde_json::to_string(&l).expect("serialises");
        let again = NetConfList::from_slice(text.as_bytes()).expect("a serialised list parses");
        assert_eq!(again, l);
    }
    if let Ok(n) = NetworkConfig::from_slice(data) {
        let again = NetworkConfig::from_slice(n.to_json().as_bytes())
            .expect("a serialised configuration parses");
        assert_eq!(again, n);
        if let NetworkConfig::Single(c) = &n {
            // Every plugin's previous result either parses or is refused with a spec error, never a panic.
            let _ = c.prev_result();
        }
    }
});
