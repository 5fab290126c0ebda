//! kubectl's protobuf bodies (`k8s\0` + runtime.Unknown) as the test API server decodes them. Any bytes:
//! decoding never panics nor exhausts the stack, and an accepted body is a JSON object with its apiVersion
//! and kind whose text parses back to the same value. The bytes as the message of a built-in kind: the body
//! decoder and the message decoder agree (same object, or the same refusal). Schemas nested up to 255 deep
//! through every recursion path: shallow ones decode, deep ones are refused. And the structured round trip:
//! a Namespace or ConfigMap built from the bytes (names, labels, data, unknown fields, metadata split in
//! two messages) and encoded by the test model decodes to exactly the model's JSON.
#![no_main]

use arbitrary::{Result, Unstructured};
use kubeovn_testapi::proto;
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

#[allow(dead_code)]
#[path = "../../kubeovn-testapi/tests/proto_model/mod.rs"]
mod proto_model;

use proto_model::{Meta, Object, Unknown};

/// Root kinds whose messages reach the decoder's special cases: times, IntOrString, quantities,
/// embedded JSON, the JSONSchemaProps unions and deep nesting.
const ROOTS: [(&str, &str); 8] = [
    ("v1", "Namespace"),
    ("v1", "ConfigMap"),
    ("v1", "Pod"),
    ("v1", "Service"),
    ("v1", "Event"),
    ("apps/v1", "Deployment"),
    ("discovery.k8s.io/v1", "EndpointSlice"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
];

/// An accepted body: an object with its type, and its JSON text parses back to the same value.
fn check_json(v: &Value) {
    let obj = v.as_object().expect("a decoded body is a JSON object");
    assert!(obj.get("apiVersion").is_some_and(Value::is_string));
    assert!(obj.get("kind").is_some_and(Value::is_string));
    reparses(v);
}

/// The JSON text of a decoded value parses back (the server's JSON requests parse the same
/// way) to the same value.
fn reparses(v: &Value) {
    let text = serde_json::to_string(v).expect("serialises");
    let back: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the decoded JSON does not parse back: {e}"));
    assert_eq!(&back, v, "{text}");
}

const PROPS: &str = "apiextensions_apiserver.pkg.apis.apiextensions.v1.JSONSchemaProps";

/// A JSONSchemaProps nested one step per byte of `steps` (outermost first) through each way the
/// decoder recurses: an optional field, a list, a map value and the two unions. A step nests the
/// schema one or two decoder levels deeper.
fn nested(steps: &[u8]) -> Vec<u8> {
    // Each step's keys, from the inner message outwards.
    const STEPS: [&[&[u8]]; 5] = [
        &[&[0xe2, 0x01]],          // not
        &[&[0xca, 0x01]],          // allOf
        &[&[0x12], &[0xea, 0x01]], // properties: an entry's value
        &[&[0x0a], &[0xc2, 0x01]], // items: schema
        &[&[0x12], &[0xf2, 0x01]], // additionalProperties: schema
    ];
    let keys: Vec<&[u8]> = (steps.iter().rev())
        .flat_map(|s| STEPS[usize::from(*s) % STEPS.len()].iter().copied())
        .collect();
    let varint = |out: &mut Vec<u8>, mut v: usize| {
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    };
    // Each message's length, innermost (empty) first.
    let (mut lens, mut len) = (Vec::with_capacity(keys.len()), 0);
    for k in &keys {
        lens.push(len);
        let mut prefix = k.to_vec();
        varint(&mut prefix, len);
        len += prefix.len();
    }
    let mut out = Vec::with_capacity(len);
    for (k, l) in keys.iter().zip(&lens).rev() {
        out.extend_from_slice(k);
        varint(&mut out, *l);
    }
    out
}

fn key(u: &mut Unstructured) -> Result<String> {
    // Few distinct keys half of the time, so that repeated keys (last one wins) are common.
    Ok(if u.ratio(1, 2)? {
        ["", "a", "b"][u.choose_index(3)?].to_owned()
    } else {
        u.arbitrary()?
    })
}

fn entries<V>(
    u: &mut Unstructured,
    value: impl Fn(&mut Unstructured) -> Result<V>,
) -> Result<Vec<(String, V)>> {
    let n = u.int_in_range(0..=3)?;
    (0..n).map(|_| Ok((key(u)?, value(u)?))).collect()
}

fn strings(u: &mut Unstructured) -> Result<Vec<String>> {
    let n = u.int_in_range(0..=3)?;
    (0..n).map(|_| u.arbitrary()).collect()
}

fn unknown(u: &mut Unstructured) -> Result<Unknown> {
    Ok(match u.int_in_range(0..=3)? {
        0 => Unknown::Varint(u.arbitrary()?),
        1 => Unknown::Fixed64(u.arbitrary()?),
        2 => Unknown::Bytes(u.arbitrary()?),
        _ => Unknown::Fixed32(u.arbitrary()?),
    })
}

fn object(u: &mut Unstructured) -> Result<Object> {
    let text = |u: &mut Unstructured| u.arbitrary::<String>();
    let meta = Meta {
        name: u.arbitrary()?,
        stale_name: u.arbitrary()?,
        generate_name: u.arbitrary()?,
        namespace: u.arbitrary()?,
        generation: u.arbitrary()?,
        labels: entries(u, text)?,
        annotations: entries(u, text)?,
        finalizers: strings(u)?,
        zero_creation: u.arbitrary()?,
        unknown: (0..u.int_in_range(0..=2)?)
            .map(|_| Ok((u.arbitrary()?, unknown(u)?)))
            .collect::<Result<_>>()?,
    };
    Ok(Object {
        config_map: u.arbitrary()?,
        meta,
        split_meta: u.arbitrary()?,
        spec_finalizers: if u.arbitrary()? {
            Some(strings(u)?)
        } else {
            None
        },
        data: entries(u, text)?,
        binary_data: entries(u, |u| u.arbitrary::<Vec<u8>>())?,
        immutable: u.arbitrary()?,
        sparse_entries: u.arbitrary()?,
        content_type: u.arbitrary()?,
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = proto::decode_body(data) {
        check_json(&v);
    }

    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let (api_version, kind) = ROOTS[usize::from(sel) % ROOTS.len()];
    let name = proto::message_for(api_version, kind).expect("a root kind is in the table");
    let body = proto_model::envelope(api_version, kind, rest, sel & 0x80 != 0);
    match (proto::decode_message(name, rest), proto::decode_body(&body)) {
        (Ok(Value::Object(fields)), Ok(v)) => {
            let mut want = Map::new();
            want.insert("apiVersion".into(), api_version.into());
            want.insert("kind".into(), kind.into());
            want.extend(fields);
            assert_eq!(v, Value::Object(want));
            check_json(&v);
        }
        (Err(a), Err(b)) => assert_eq!((a.code(), a.to_string()), (b.code(), b.to_string())),
        (m, b) => panic!("message decoder {m:?}, body decoder {b:?}"),
    }

    // Deep nesting: decoded within bounds or refused, never a stack overflow.
    if let [n, steps @ ..] = rest {
        // Up to 255 steps: past every bound, yet fast enough to run on every input.
        let n = usize::from(*n);
        let steps: Vec<u8> = steps.iter().copied().chain([0]).cycle().take(n).collect();
        match proto::decode_message(PROPS, &nested(&steps)) {
            Ok(v) => {
                assert!(n <= 100, "{n} nested schemas accepted");
                reparses(&v);
            }
            Err(e) => {
                assert_eq!(e.code(), 400);
                assert!(n > 50, "{n} nested schemas refused: {e}");
            }
        }
    }

    if let Ok(o) = object(&mut Unstructured::new(rest)) {
        let v = proto::decode_body(&o.encode()).unwrap_or_else(|e| panic!("{o:?}: {e}"));
        assert_eq!(v, o.json(), "{o:?}");
    }
});
