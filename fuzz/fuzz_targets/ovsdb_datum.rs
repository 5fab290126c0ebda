//! OVSDB datums: whatever JSON decodes as a datum (untyped, or typed for one of a few column types) encodes
//! back to JSON that decodes to the same datum; validation never panics; the direct decoder (from the text,
//! no Value tree, as monitor updates are read) gives exactly the Value decoder's datum, or refuses as it does.
#![no_main]

use kubeovn_ovn::serde_json::{self, json, Value};
use kubeovn_ovn::decode::datum_from_str;
use kubeovn_ovn::{ColumnType, Datum};
use libfuzzer_sys::fuzz_target;

fn column_type(sel: u8) -> ColumnType {
    let j = match sel % 6 {
        0 => json!("integer"),
        1 => json!({"key": "string", "min": 0, "max": "unlimited"}),
        2 => json!({"key": "string", "value": "string", "min": 0, "max": "unlimited"}),
        3 => json!({"key": {"type": "uuid", "refTable": "T"}, "min": 0, "max": 1}),
        4 => json!({"key": {"type": "real", "minReal": -1.5, "maxReal": 1e9}, "min": 0, "max": 4}),
        _ => json!({"key": {"type": "string", "enum": ["set", ["a", "b"]]}, "value": "boolean", "min": 1, "max": 2}),
    };
    ColumnType::parse(&j).expect("valid column type")
}

fuzz_target!(|input: &[u8]| {
    let Some((&sel, text)) = input.split_first() else { return };
    let Ok(j) = serde_json::from_slice::<Value>(text) else { return };

    let ty = column_type(sel);
    if let Ok(text) = std::str::from_utf8(text) {
        let slow = Datum::from_json(&j).ok();
        assert_eq!(datum_from_str(text, None).ok(), slow, "untyped {text}");
        let slow = Datum::from_json_typed(&j, &ty).ok();
        assert_eq!(datum_from_str(text, Some(&ty)).ok(), slow, "typed {text}");
    }

    if let Ok(d) = Datum::from_json(&j) {
        let back = d.to_json();
        assert_eq!(Datum::from_json(&back).as_ref(), Ok(&d));
        // serde and to_json agree.
        assert_eq!(serde_json::to_value(&d).ok(), Some(back));
        let _ = d.canonical();
    }

    if let Ok(d) = Datum::from_json_typed(&j, &ty) {
        let _ = ty.validate(&d);
        let back = d.to_json();
        assert_eq!(Datum::from_json_typed(&back, &ty).as_ref(), Ok(&d));
    }
});
