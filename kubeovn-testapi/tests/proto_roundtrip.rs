//! Structured protobuf round trip: any Namespace or ConfigMap the model encodes (arbitrary names,
//! labels, data, unknown fields) decodes to exactly the model's JSON. The fuzz target
//! `testapi_proto` runs the same model.

mod proto_model;

use kubeovn_testapi::proto;
use proptest::prelude::*;
use proto_model::{Meta, Object, Unknown};

fn text() -> impl Strategy<Value = String> {
    // Empty strings, ASCII, multi-byte text and NUL, which Go sends as is.
    "(|[a-z0-9./-]{1,8}|\\PC{0,6}|a\u{0}b)"
}

fn entries() -> impl Strategy<Value = Vec<(String, String)>> {
    // Few keys so that repeats (last wins) are common.
    proptest::collection::vec(("[ab]{0,2}|\\PC{0,4}", text()), 0..4)
}

fn unknown() -> impl Strategy<Value = Unknown> {
    prop_oneof![
        any::<u64>().prop_map(Unknown::Varint),
        any::<u64>().prop_map(Unknown::Fixed64),
        proptest::collection::vec(any::<u8>(), 0..6).prop_map(Unknown::Bytes),
        any::<u32>().prop_map(Unknown::Fixed32),
    ]
}

fn meta() -> impl Strategy<Value = Meta> {
    (
        (text(), text(), text(), proptest::option::of(any::<i64>())),
        (
            entries(),
            entries(),
            proptest::collection::vec(text(), 0..3),
        ),
        (any::<bool>(), proptest::option::of(text())),
        proptest::collection::vec((any::<u16>(), unknown()), 0..3),
    )
        .prop_map(
            |(
                (name, generate_name, namespace, generation),
                (labels, annotations, finalizers),
                (zero_creation, stale_name),
                unknown,
            )| Meta {
                name,
                stale_name,
                generate_name,
                namespace,
                generation,
                labels,
                annotations,
                finalizers,
                zero_creation,
                unknown,
            },
        )
}

fn object() -> impl Strategy<Value = Object> {
    (
        any::<bool>(),
        (meta(), proptest::option::of(any::<u8>())),
        proptest::option::of(proptest::collection::vec(text(), 0..3)),
        entries(),
        proptest::collection::vec(
            ("[ab]{0,2}", proptest::collection::vec(any::<u8>(), 0..8)),
            0..3,
        ),
        proptest::option::of(any::<bool>()),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                config_map,
                (meta, split_meta),
                spec_finalizers,
                data,
                binary_data,
                immutable,
                sparse_entries,
                content_type,
            )| {
                Object {
                    config_map,
                    meta,
                    split_meta,
                    spec_finalizers,
                    data,
                    binary_data,
                    immutable,
                    sparse_entries,
                    content_type,
                }
            },
        )
}

proptest! {
    #[test]
    fn encoded_objects_decode_to_their_json(o in object()) {
        let body = o.encode();
        let v = proto::decode_body(&body).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(v, o.json());
    }
}
