//! Parses arbitrary bytes as a CNI result; whatever parses must serialise and parse back equal, and every
//! conversion must be idempotent and survive its own serialisation.
#![no_main]

use kubeovn_cni::spec::{CniResult, Version};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(r) = CniResult::from_slice(data) else {
        return;
    };
    let again = CniResult::from_slice(r.to_json().as_bytes()).expect("a serialised result parses");
    assert_eq!(again, r);
    for v in Version::ALL {
        let c = r.convert_to(v);
        assert_eq!(c.convert_to(v), c, "conversion to {v} is idempotent");
        let back =
            CniResult::from_slice(c.to_json().as_bytes()).expect("a converted result parses");
        assert_eq!(back, c, "{v}");
        if v >= Version::V1_0_0 && r.cni_version >= Version::V1_0_0 {
            assert_eq!(
                CniResult {
                    cni_version: r.cni_version,
                    ..c
                },
                r,
                "1.x keeps everything"
            );
        }
    }
});
