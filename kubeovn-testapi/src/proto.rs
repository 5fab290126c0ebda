//! Kubernetes protobuf request bodies, decoded into the JSON objects the store keeps.
//!
//! Typed clients (kubectl 1.32 and later in `create namespace`, `create deployment`, `run`,
//! `expose`, ...) send `application/vnd.kubernetes.protobuf`: the magic `k8s\0` and a
//! `runtime.Unknown` whose `raw` is the object's message. The messages of the built-in kinds are
//! described by `kinds.table` (field numbers, JSON names, types and docs), generated from the
//! k8s-pb and k8s-openapi crates by `gen/proto_table.py`; the same table gives the OpenAPI
//! schemas of these kinds ([`crate::openapi`]).
//!
//! JSON follows the Go encoding the real server answers with: empty strings, lists and maps are
//! omitted (their Go fields are `omitempty`), a zero `Time` is omitted, `IntOrString` is a number
//! or a string, `Quantity` a string, raw extensions and `FieldsV1` embedded JSON, embedded Go
//! structs inlined. Numbers and booleans are kept as sent: the wire does not tell a Go pointer
//! (sent only when set, its zero meant: `replicas: 0`) from a plain field (always sent, its zero
//! left out of Go's JSON: `stdin: false`), and keeping the second changes no meaning where
//! dropping the first would.

use std::collections::HashMap;
use std::sync::OnceLock;

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The 4 bytes every Kubernetes protobuf body starts with.
pub const MAGIC: &[u8] = b"k8s\0";

/// The content type of Kubernetes protobuf bodies.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// A field's scalar or message type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `string`.
    String,
    /// `int32`.
    Int32,
    /// `int64`.
    Int64,
    /// `bool`.
    Bool,
    /// `double`.
    Double,
    /// `bytes` (base64 in JSON).
    Bytes,
    /// A nested message.
    Message,
}

/// How many values a field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Card {
    /// At most one.
    Optional,
    /// A list.
    Repeated,
    /// A map from strings (entries: key 1, value 2).
    Map,
}

/// One field of a message.
#[derive(Debug)]
pub struct Field {
    /// Protobuf field number.
    pub number: u32,
    /// JSON name; `None` for an embedded Go struct whose fields are inlined.
    pub json: Option<&'static str>,
    /// Value type (of the map value for maps).
    pub kind: Kind,
    /// Cardinality.
    pub card: Card,
    /// The message type, for [`Kind::Message`].
    pub message: &'static str,
    /// Documentation.
    pub doc: &'static str,
}

/// One message type.
#[derive(Debug)]
pub struct Message {
    /// Documentation.
    pub doc: &'static str,
    /// Fields in declaration order.
    pub fields: Vec<Field>,
}

/// The message types of the built-in kinds, by full name (`api.core.v1.Pod`).
pub struct Table {
    /// Messages by name.
    pub messages: HashMap<&'static str, Message>,
    /// Names in table order (roots first).
    pub order: Vec<&'static str>,
}

const TABLE: &str = include_str!("kinds.table");

/// The parsed table (parsed once).
pub fn table() -> &'static Table {
    static T: OnceLock<Table> = OnceLock::new();
    T.get_or_init(|| parse_table(TABLE))
}

fn parse_table(text: &'static str) -> Table {
    let mut messages = HashMap::new();
    let mut order = Vec::new();
    let mut current: Option<(&'static str, Message)> = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let cols: Vec<&'static str> = line.split('\t').collect();
        match cols.as_slice() {
            ["M", name, doc] => {
                if let Some((n, m)) = current.take() {
                    messages.insert(n, m);
                }
                order.push(*name);
                current = Some((
                    name,
                    Message {
                        doc,
                        fields: Vec::new(),
                    },
                ));
            }
            ["F", number, json, kind, card, message, doc] => {
                let (Some((_, m)), Ok(number)) = (current.as_mut(), number.parse()) else {
                    continue;
                };
                let kind = match *kind {
                    "string" => Kind::String,
                    "int32" => Kind::Int32,
                    "int64" => Kind::Int64,
                    "bool" => Kind::Bool,
                    "double" => Kind::Double,
                    "bytes" => Kind::Bytes,
                    _ => Kind::Message,
                };
                let card = match *card {
                    "rep" => Card::Repeated,
                    "map" => Card::Map,
                    _ => Card::Optional,
                };
                m.fields.push(Field {
                    number,
                    json: (*json != "-").then_some(*json),
                    kind,
                    card,
                    message,
                    doc,
                });
            }
            _ => {}
        }
    }
    if let Some((n, m)) = current {
        messages.insert(n, m);
    }
    Table { messages, order }
}

/// The message of a kind (`apps/v1`, `Deployment` -> `api.apps.v1.Deployment`), if the table
/// has it.
pub fn message_for(api_version: &str, kind: &str) -> Option<&'static str> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let module = match group {
        "" => format!("api.core.{version}"),
        "apiextensions.k8s.io" => {
            format!("apiextensions_apiserver.pkg.apis.apiextensions.{version}")
        }
        g => format!("api.{}.{version}", g.split('.').next().unwrap_or(g)),
    };
    let name = format!("{module}.{kind}");
    table()
        .messages
        .get_key_value(name.as_str())
        .map(|(k, _)| *k)
}

/// Decodes a protobuf body (`k8s\0` + `runtime.Unknown`) into the object's JSON.
pub fn decode_body(body: &[u8]) -> Result<Value> {
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| Error::bad_request("the protobuf body does not start with k8s\\0"))?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    let mut content_type = String::new();
    for f in Fields(rest) {
        match f? {
            (1, Wire::Len(tm)) => {
                for g in Fields(tm) {
                    match g? {
                        (1, Wire::Len(v)) => api_version = utf8(v)?,
                        (2, Wire::Len(v)) => kind = utf8(v)?,
                        _ => {}
                    }
                }
            }
            (2, Wire::Len(v)) => raw = v,
            (4, Wire::Len(v)) => content_type = utf8(v)?,
            _ => {}
        }
    }
    if !(content_type.is_empty() || content_type == CONTENT_TYPE) {
        return Err(Error::unsupported_media(&content_type));
    }
    let name = message_for(&api_version, &kind).ok_or_else(|| {
        Error::unsupported_media(&format!("{CONTENT_TYPE} for {api_version} {kind}"))
    })?;
    let mut obj = Map::new();
    obj.insert("apiVersion".into(), Value::String(api_version));
    obj.insert("kind".into(), Value::String(kind));
    decode_into(name, raw, &mut obj, 0)?;
    json_depth_ok(Value::Object(obj))
}

/// Deepest nesting decoded: a body of nested messages must not exhaust the stack.
const MAX_DEPTH: u32 = 100;

/// Decodes one message of type `name` into JSON.
pub fn decode_message(name: &str, data: &[u8]) -> Result<Value> {
    json_depth_ok(message_at(name, data, 0)?)
}

/// The deepest nesting of arrays and objects serde_json parses: the server's own JSON requests and
/// Rust clients could not read back an object nested deeper (a message level can add two JSON
/// levels, and embedded JSON more).
const MAX_JSON_DEPTH: usize = 127;

fn json_depth_ok(v: Value) -> Result<Value> {
    if nests_deeper(&v, MAX_JSON_DEPTH) {
        return Err(Error::bad_request(format!(
            "protobuf: the object nests deeper than {MAX_JSON_DEPTH} levels of JSON"
        )));
    }
    Ok(v)
}

/// Whether `v` nests more than `limit` arrays and objects (recursing at most `limit` deep).
fn nests_deeper(v: &Value, limit: usize) -> bool {
    match v {
        Value::Array(a) => limit == 0 || a.iter().any(|c| nests_deeper(c, limit - 1)),
        Value::Object(m) => limit == 0 || m.values().any(|c| nests_deeper(c, limit - 1)),
        _ => false,
    }
}

fn message_at(name: &str, data: &[u8], depth: u32) -> Result<Value> {
    if let Some(v) = special(name, data, depth)? {
        return Ok(v);
    }
    let mut obj = Map::new();
    decode_into(name, data, &mut obj, depth)?;
    Ok(Value::Object(obj))
}

/// The messages whose JSON is not an object of their fields (times, IntOrString, embedded JSON,
/// unions); `None` for the others.
fn special(name: &str, data: &[u8], depth: u32) -> Result<Option<Value>> {
    if depth > MAX_DEPTH {
        return Err(Error::bad_request("protobuf: messages nested too deeply"));
    }
    let v = match name.rsplit('.').next().unwrap_or(name) {
        // As Go reads them: an empty message is the zero time (left out), anything else
        // time.Unix(seconds, nanos), where Time drops the nanoseconds.
        "Time" | "MicroTime" => {
            if data.is_empty() {
                return Ok(Some(Value::Null));
            }
            let (mut secs, mut nanos) = (0i64, 0i64);
            for f in Fields(data) {
                match f? {
                    (1, Wire::Varint(v)) => secs = v as i64,
                    (2, Wire::Varint(v)) => nanos = i64::from(v as i32),
                    _ => {}
                }
            }
            let micro = name.ends_with("MicroTime");
            Ok(Value::String(rfc3339(
                secs,
                if micro { nanos } else { 0 },
                micro,
            )))
        }
        "IntOrString" => {
            let (mut ty, mut int, mut s) = (0, 0i64, String::new());
            for f in Fields(data) {
                match f? {
                    (1, Wire::Varint(v)) => ty = v,
                    (2, Wire::Varint(v)) => int = i64::from(v as i32),
                    (3, Wire::Len(v)) => s = utf8(v)?,
                    _ => {}
                }
            }
            Ok(if ty == 0 { int.into() } else { s.into() })
        }
        "Quantity" => {
            let mut s = String::new();
            for f in Fields(data) {
                if let (1, Wire::Len(v)) = f? {
                    s = utf8(v)?;
                }
            }
            Ok(s.into())
        }
        "RawExtension" | "FieldsV1" | "JSON" => {
            let mut raw: &[u8] = &[];
            for f in Fields(data) {
                if let (1, Wire::Len(v)) = f? {
                    raw = v;
                }
            }
            if raw.is_empty() {
                return Ok(Some(Value::Null));
            }
            serde_json::from_slice(raw)
                .map_err(|e| Error::bad_request(format!("{name}: embedded JSON: {e}")))
        }
        // Unions: a list when one was sent, else the schema, else (OrBool) the boolean.
        short @ ("JSONSchemaPropsOrArray"
        | "JSONSchemaPropsOrBool"
        | "JSONSchemaPropsOrStringArray") => {
            const PROPS: &str = "apiextensions_apiserver.pkg.apis.apiextensions.v1.JSONSchemaProps";
            let (mut schema, mut list, mut allows) = (None, Vec::new(), false);
            let or_bool = short == "JSONSchemaPropsOrBool";
            for f in Fields(data) {
                match (f?, or_bool) {
                    ((1, Wire::Varint(v)), true) => allows = v != 0,
                    ((2, Wire::Len(v)), true) | ((1, Wire::Len(v)), false) => {
                        schema = Some(message_at(PROPS, v, depth + 1)?)
                    }
                    ((2, Wire::Len(v)), false) if short == "JSONSchemaPropsOrArray" => {
                        list.push(message_at(PROPS, v, depth + 1)?)
                    }
                    ((2, Wire::Len(v)), false) => list.push(Value::String(utf8(v)?)),
                    _ => {}
                }
            }
            Ok(if !list.is_empty() {
                Value::Array(list)
            } else {
                schema.unwrap_or(if or_bool {
                    Value::Bool(allows)
                } else {
                    Value::Null
                })
            })
        }
        _ => return Ok(None),
    };
    v.map(Some)
}

fn decode_into(name: &str, data: &[u8], obj: &mut Map<String, Value>, depth: u32) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(Error::bad_request("protobuf: messages nested too deeply"));
    }
    let msg = table()
        .messages
        .get(name)
        .ok_or_else(|| Error::internal(format!("no protobuf message {name}")))?;
    for f in Fields(data) {
        let (number, wire) = f?;
        // Fields added after the table was generated are skipped, as an older server would.
        let Some(field) = msg.fields.iter().find(|f| f.number == number) else {
            continue;
        };
        let Some(json) = field.json else {
            if let Wire::Len(v) = wire {
                decode_into(field.message, v, obj, depth + 1)?;
            }
            continue;
        };
        match field.card {
            // As in Go's decoder, a message field sent twice merges (protobuf's rule for
            // concatenated messages) and a later scalar replaces an earlier one, also when the
            // later one is a zero that Go's JSON leaves out.
            Card::Optional => {
                let value = match (field.kind, wire) {
                    (Kind::Message, Wire::Len(v)) => match special(field.message, v, depth + 1)? {
                        Some(value) => Some(value),
                        None => {
                            let slot = obj.entry(json).or_insert_with(|| Value::Object(Map::new()));
                            if !slot.is_object() {
                                *slot = Value::Object(Map::new());
                            }
                            if let Value::Object(m) = slot {
                                decode_into(field.message, v, m, depth + 1)?;
                            }
                            None
                        }
                    },
                    _ => Some(scalar(field, field.kind, wire, depth)?),
                };
                match value {
                    Some(v) if omitted(&v) => {
                        obj.remove(json);
                    }
                    Some(v) => {
                        obj.insert(json.to_owned(), v);
                    }
                    None => {}
                }
            }
            Card::Repeated => {
                let slot = obj.entry(json).or_insert_with(|| Value::Array(Vec::new()));
                let Value::Array(items) = slot else { continue };
                match (field.kind, wire) {
                    // Packed numbers: a run of varints.
                    (Kind::Int32 | Kind::Int64, Wire::Len(mut run)) => {
                        while !run.is_empty() {
                            let v = varint(&mut run)?;
                            items.push(int(field.kind, v));
                        }
                    }
                    (k, w) => items.push(scalar(field, k, w, depth)?),
                }
            }
            Card::Map => {
                let Wire::Len(entry) = wire else {
                    return Err(wire_error(name, field));
                };
                let (mut key, mut value) = (String::new(), None);
                for e in Fields(entry) {
                    match e? {
                        (1, Wire::Len(k)) => key = utf8(k)?,
                        (2, w) => value = Some(scalar(field, field.kind, w, depth)?),
                        _ => {}
                    }
                }
                let value = value.unwrap_or_else(|| match field.kind {
                    Kind::Message => Value::Object(Map::new()),
                    _ => Value::String(String::new()),
                });
                if let Value::Object(m) =
                    obj.entry(json).or_insert_with(|| Value::Object(Map::new()))
                {
                    m.insert(key, value);
                }
            }
        }
    }
    Ok(())
}

/// Whether Go's JSON encoding leaves a decoded optional value out.
fn omitted(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

fn int(kind: Kind, v: u64) -> Value {
    if kind == Kind::Int32 {
        (v as i32).into()
    } else {
        (v as i64).into()
    }
}

fn scalar(field: &Field, kind: Kind, wire: Wire<'_>, depth: u32) -> Result<Value> {
    Ok(match (kind, wire) {
        (Kind::String, Wire::Len(v)) => Value::String(utf8(v)?),
        (Kind::Bytes, Wire::Len(v)) => Value::String(base64(v)),
        (Kind::Message, Wire::Len(v)) => message_at(field.message, v, depth + 1)?,
        (Kind::Int32 | Kind::Int64, Wire::Varint(v)) => int(kind, v),
        (Kind::Bool, Wire::Varint(v)) => Value::Bool(v != 0),
        (Kind::Double, Wire::Fixed64(v)) => {
            serde_json::Number::from_f64(f64::from_bits(v)).map_or(Value::Null, Value::Number)
        }
        _ => return Err(wire_error("", field)),
    })
}

fn wire_error(msg: &str, field: &Field) -> Error {
    Error::bad_request(format!(
        "protobuf: field {} ({}) of {msg} has the wrong wire type",
        field.number,
        field.json.unwrap_or("inline")
    ))
}

fn utf8(v: &[u8]) -> Result<String> {
    String::from_utf8(v.to_vec()).map_err(|_| Error::bad_request("protobuf: a string is not UTF-8"))
}

fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= c.len() {
                out.push(char::from(A[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// RFC 3339 in UTC as Go's `metav1.Time` (seconds) and `MicroTime` (microseconds) print it.
/// As Go's `MicroTime` reads them, nanoseconds are truncated (toward zero) to microseconds, then
/// those outside `[0, 1e9)` move into the seconds (`time.Unix`).
fn rfc3339(secs: i64, nanos: i64, micro: bool) -> String {
    const NANOS: i64 = 1_000_000_000;
    let nanos = nanos / 1000 * 1000;
    let (secs, nanos) = (
        secs.saturating_add(nanos.div_euclid(NANOS)),
        nanos.rem_euclid(NANOS),
    );
    let s = crate::store::format_rfc3339(secs);
    match s.strip_suffix('Z') {
        Some(base) if micro => format!("{base}.{:06}Z", nanos / 1000),
        _ => s,
    }
}

/// A field's value on the wire.
#[derive(Debug, Clone, Copy)]
enum Wire<'a> {
    Varint(u64),
    Fixed64(u64),
    Len(&'a [u8]),
    Fixed32,
}

/// The fields of a message, in wire order.
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Wire<'a>)>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let r = self.field();
        if r.is_err() {
            self.0 = &[];
        }
        Some(r)
    }
}

impl<'a> Fields<'a> {
    fn field(&mut self) -> Result<(u32, Wire<'a>)> {
        let key = varint(&mut self.0)?;
        let number = u32::try_from(key >> 3).map_err(|_| truncated())?;
        let wire = match key & 7 {
            0 => Wire::Varint(varint(&mut self.0)?),
            1 => Wire::Fixed64(u64::from_le_bytes(
                self.take(8)?.try_into().map_err(|_| truncated())?,
            )),
            2 => {
                let len = usize::try_from(varint(&mut self.0)?).map_err(|_| truncated())?;
                Wire::Len(self.take(len)?)
            }
            5 => {
                self.take(4)?;
                Wire::Fixed32
            }
            w => {
                return Err(Error::bad_request(format!(
                    "protobuf: unsupported wire type {w}"
                )))
            }
        };
        Ok((number, wire))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.0.len() {
            return Err(truncated());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
}

fn truncated() -> Error {
    Error::bad_request("protobuf: the message is truncated")
}

fn varint(buf: &mut &[u8]) -> Result<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let (&b, rest) = buf.split_first().ok_or_else(truncated)?;
        *buf = rest;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Ok(v);
        }
    }
    Err(Error::bad_request("protobuf: a varint is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_and_inlines() {
        let t = table();
        let spec = &t.messages["api.core.v1.ServiceSpec"];
        assert!(spec.fields.iter().any(|f| f.json == Some("clusterIP")));
        let vol = &t.messages["api.core.v1.Volume"];
        assert!(vol
            .fields
            .iter()
            .any(|f| f.json.is_none() && f.message == "api.core.v1.VolumeSource"));
        assert_eq!(
            message_for("apps/v1", "Deployment"),
            Some("api.apps.v1.Deployment")
        );
        assert_eq!(message_for("v1", "Pod"), Some("api.core.v1.Pod"));
    }

    #[test]
    fn bad_bodies_are_bad_requests() {
        let code = |b: &[u8]| decode_body(b).err().map(|e| e.code());
        assert_eq!(code(b"{}"), Some(400));
        // Truncated: typeMeta claims 100 bytes.
        assert_eq!(code(b"k8s\0\x0a\x64\x0a\x02v1"), Some(400));
        // A kind the table does not have.
        let mut body = b"k8s\0\x0a\x0c\x0a\x02v1\x12\x06Widget".to_vec();
        body.extend_from_slice(b"\x12\x00");
        assert_eq!(code(&body), Some(415));
        // A Namespace with a name, a label and an empty time.
        let meta = b"\x0a\x03foo\x42\x00\x5a\x08\x0a\x01a\x12\x03b\x00c";
        let mut ns = vec![0x0a, meta.len() as u8];
        ns.extend_from_slice(meta);
        let mut body = b"k8s\0\x0a\x0f\x0a\x02v1\x12\x09Namespace\x12".to_vec();
        body.push(ns.len() as u8);
        body.extend_from_slice(&ns);
        let v = decode_body(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": "foo", "labels": {"a": "b\0c"}}})
        );
    }

    #[test]
    fn a_message_sent_twice_is_merged() {
        // metadata {name: x, labels: {a: b}} then metadata {name: "", namespace: ns}: Go's decoder
        // merges the two (the labels stay) and the later empty name replaces x.
        let first = b"\x0a\x01x\x5a\x06\x0a\x01a\x12\x01b";
        let second = b"\x0a\x00\x1a\x02ns";
        let mut ns = vec![0x0a, first.len() as u8];
        ns.extend_from_slice(first);
        ns.extend_from_slice(&[0x0a, second.len() as u8]);
        ns.extend_from_slice(second);
        let mut body = b"k8s\0\x0a\x0f\x0a\x02v1\x12\x09Namespace\x12".to_vec();
        body.push(ns.len() as u8);
        body.extend_from_slice(&ns);
        assert_eq!(
            decode_body(&body).unwrap(),
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"namespace": "ns", "labels": {"a": "b"}}})
        );
    }

    /// An empty message wrapped `n` times in the length-delimited field whose tag bytes are `tag`.
    fn nested(tag: &[u8], n: usize) -> Vec<u8> {
        let mut m: Vec<u8> = Vec::new();
        for _ in 0..n {
            let mut outer = tag.to_vec();
            let mut len = m.len();
            while len >= 0x80 {
                outer.push((len as u8) | 0x80);
                len >>= 7;
            }
            outer.push(len as u8);
            outer.extend_from_slice(&m);
            m = outer;
        }
        m
    }

    #[test]
    fn deep_nesting_is_refused() {
        // JSONSchemaProps.not (field 28) nested 10000 times.
        let m = nested(&[0xe2, 0x01], 10_000);
        let e = decode_message(
            "apiextensions_apiserver.pkg.apis.apiextensions.v1.JSONSchemaProps",
            &m,
        )
        .unwrap_err();
        assert_eq!(e.code(), 400);
    }

    #[test]
    fn json_nesting_stays_readable() {
        // MAX_JSON_DEPTH is serde_json's limit.
        let nest = |n| (0..n).fold(Value::Null, |v, _| Value::Array(vec![v]));
        let text = |n| serde_json::to_string(&nest(n)).unwrap();
        assert!(serde_json::from_str::<Value>(&text(MAX_JSON_DEPTH)).is_ok());
        assert!(serde_json::from_str::<Value>(&text(MAX_JSON_DEPTH + 1)).is_err());
        assert!(!nests_deeper(&nest(MAX_JSON_DEPTH), MAX_JSON_DEPTH));
        assert!(nests_deeper(&nest(MAX_JSON_DEPTH + 1), MAX_JSON_DEPTH));
        // JSONSchemaProps.allOf (field 25) nested 80 times: within the message depth, but
        // {"allOf": [...]} is two JSON levels each, which no JSON client could read back.
        let m = nested(&[0xca, 0x01], 80);
        let e = decode_message(
            "apiextensions_apiserver.pkg.apis.apiextensions.v1.JSONSchemaProps",
            &m,
        )
        .unwrap_err();
        assert_eq!(e.code(), 400);
    }

    #[test]
    fn times_and_base64() {
        let time = |m: &str, data: &[u8]| {
            decode_message(&format!("apimachinery.pkg.apis.meta.v1.{m}"), data).unwrap()
        };
        // Empty: Go's zero time. Nanoseconds only: 1970. Time drops nanoseconds that MicroTime keeps.
        assert_eq!(time("Time", b""), Value::Null);
        assert_eq!(time("Time", b"\x10\x05"), "1970-01-01T00:00:00Z");
        assert_eq!(
            time("Time", b"\x08\x01\x10\x98\xf8\xff\xff\x0f"),
            "1970-01-01T00:00:01Z"
        );
        assert_eq!(
            time("MicroTime", b"\x08\x01\x10\x98\xf8\xff\xff\x0f"),
            "1970-01-01T00:00:00.999999Z"
        );
        assert_eq!(rfc3339(0, 0, false), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(1_700_000_000, 123_456_789, true),
            "2023-11-14T22:13:20.123456Z"
        );
        // Go's time.Unix normalises nanoseconds outside [0, 1e9) into the seconds.
        assert_eq!(rfc3339(0, -1000, true), "1969-12-31T23:59:59.999999Z");
        assert_eq!(rfc3339(0, -1500, true), "1969-12-31T23:59:59.999999Z");
        assert_eq!(
            rfc3339(0, 2_000_001_000, true),
            "1970-01-01T00:00:02.000001Z"
        );
        assert_eq!(base64(b"hello"), "aGVsbG8=");
        assert_eq!(base64(b"hi!"), "aGkh");
    }
}
