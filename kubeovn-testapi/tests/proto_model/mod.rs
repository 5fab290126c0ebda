//! The structured protobuf round trip shared by the proptest (`tests/proto_roundtrip.rs`) and the
//! fuzz target `testapi_proto`: a Namespace or ConfigMap model, a small protobuf encoder written
//! apart from the decoder, and the JSON the real server answers for that object. Decoding what
//! [`Object::encode`] wrote must give exactly [`Object::json`].

use serde_json::{Map, Value};

/// A field the table does not know, which the decoder must skip, in one of the four wire types
/// Kubernetes messages use.
#[derive(Debug, Clone)]
pub enum Unknown {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1.
    Fixed64(u64),
    /// Wire type 2.
    Bytes(Vec<u8>),
    /// Wire type 5.
    Fixed32(u32),
}

/// The `ObjectMeta` fields the model sends.
#[derive(Debug, Clone, Default)]
pub struct Meta {
    /// `name` (sent even when empty, as Go does; empty is left out of the JSON).
    pub name: String,
    /// A `name` sent before the real one, which replaces it (a later scalar wins).
    pub stale_name: Option<String>,
    /// `generateName`.
    pub generate_name: String,
    /// `namespace`.
    pub namespace: String,
    /// `generation`, sent when set (kept as sent, zero included).
    pub generation: Option<i64>,
    /// `labels` entries in wire order; a repeated key's last value wins.
    pub labels: Vec<(String, String)>,
    /// `annotations` entries in wire order.
    pub annotations: Vec<(String, String)>,
    /// `finalizers` (empty strings kept in the list).
    pub finalizers: Vec<String>,
    /// Sends an empty `creationTimestamp`: Go's zero time, left out of the JSON.
    pub zero_creation: bool,
    /// Unknown fields: number 18 + offset (ObjectMeta uses 1..=14 and 17); even offsets are sent
    /// before the known fields, odd ones after.
    pub unknown: Vec<(u16, Unknown)>,
}

/// A Namespace or a ConfigMap.
#[derive(Debug, Clone, Default)]
pub struct Object {
    /// ConfigMap rather than Namespace.
    pub config_map: bool,
    /// `metadata`.
    pub meta: Meta,
    /// Sends `metadata` as two messages split after this many of its fields (modulo their count):
    /// protobuf merges a message field sent twice, so the JSON is the same.
    pub split_meta: Option<u8>,
    /// Namespace `spec.finalizers`; `None` sends no spec.
    pub spec_finalizers: Option<Vec<String>>,
    /// ConfigMap `data` entries.
    pub data: Vec<(String, String)>,
    /// ConfigMap `binaryData` entries (base64 in JSON).
    pub binary_data: Vec<(String, Vec<u8>)>,
    /// ConfigMap `immutable`, sent when set.
    pub immutable: Option<bool>,
    /// Map entries leave out an empty key or value (the decoder's defaults) instead of sending it.
    pub sparse_entries: bool,
    /// The envelope names its content type.
    pub content_type: bool,
}

/// A protobuf message being written.
#[derive(Debug, Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn key(&mut self, number: u32, wire: u8) {
        self.varint(u64::from(number) << 3 | u64::from(wire));
    }

    /// A varint field (int32, int64 as two's complement, bool).
    pub fn uint(&mut self, number: u32, v: u64) {
        self.key(number, 0);
        self.varint(v);
    }

    /// A length-delimited field.
    pub fn bytes(&mut self, number: u32, b: &[u8]) {
        self.key(number, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    /// A nested message.
    pub fn message(&mut self, number: u32, f: impl FnOnce(&mut Writer)) {
        let mut w = Writer::default();
        f(&mut w);
        self.bytes(number, &w.0);
    }

    fn unknown(&mut self, number: u32, u: &Unknown) {
        match u {
            Unknown::Varint(v) => self.uint(number, *v),
            Unknown::Fixed64(v) => {
                self.key(number, 1);
                self.0.extend_from_slice(&v.to_le_bytes());
            }
            Unknown::Bytes(b) => self.bytes(number, b),
            Unknown::Fixed32(v) => {
                self.key(number, 5);
                self.0.extend_from_slice(&v.to_le_bytes());
            }
        }
    }

    fn map<'a>(
        &mut self,
        number: u32,
        entries: impl IntoIterator<Item = (&'a str, &'a [u8])>,
        sparse: bool,
    ) {
        for (k, v) in entries {
            self.message(number, |e| {
                if !(sparse && k.is_empty()) {
                    e.bytes(1, k.as_bytes());
                }
                if !(sparse && v.is_empty()) {
                    e.bytes(2, v);
                }
            });
        }
    }
}

/// A body as kubectl sends it: `k8s\0` and a `runtime.Unknown` holding `raw`.
pub fn envelope(api_version: &str, kind: &str, raw: &[u8], content_type: bool) -> Vec<u8> {
    let mut w = Writer::default();
    w.message(1, |t| {
        t.bytes(1, api_version.as_bytes());
        t.bytes(2, kind.as_bytes());
    });
    w.bytes(2, raw);
    w.bytes(3, b"");
    if content_type {
        w.bytes(4, b"application/vnd.kubernetes.protobuf");
    }
    let mut body = b"k8s\0".to_vec();
    body.extend_from_slice(&w.0);
    body
}

impl Object {
    /// The kind's name.
    pub fn kind(&self) -> &'static str {
        if self.config_map {
            "ConfigMap"
        } else {
            "Namespace"
        }
    }

    /// The whole body.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        let (meta, ends) = self.meta.encode(self.sparse_entries);
        // Split after a field: 0 sends an empty message first.
        let at = self.split_meta.map_or(meta.len(), |k| {
            [&[0][..], &ends].concat()[usize::from(k) % (ends.len() + 1)]
        });
        w.bytes(1, &meta[..at]);
        if at < meta.len() {
            w.bytes(1, &meta[at..]);
        }
        if self.config_map {
            let data = self.data.iter().map(|(k, v)| (&k[..], v.as_bytes()));
            w.map(2, data, self.sparse_entries);
            let binary = self.binary_data.iter().map(|(k, v)| (&k[..], &v[..]));
            w.map(3, binary, self.sparse_entries);
            if let Some(b) = self.immutable {
                w.uint(4, u64::from(b));
            }
        } else if let Some(fins) = &self.spec_finalizers {
            w.message(2, |s| {
                for f in fins {
                    s.bytes(1, f.as_bytes());
                }
            });
        }
        envelope("v1", self.kind(), &w.0, self.content_type)
    }

    /// The JSON the decoder must give.
    pub fn json(&self) -> Value {
        let mut obj = Map::new();
        obj.insert("apiVersion".into(), "v1".into());
        obj.insert("kind".into(), self.kind().into());
        obj.insert("metadata".into(), self.meta.json());
        if self.config_map {
            if !self.data.is_empty() {
                let m = last_wins(self.data.iter().map(|(k, v)| (k, Value::from(v.as_str()))));
                obj.insert("data".into(), m);
            }
            if !self.binary_data.is_empty() {
                let m = last_wins(self.binary_data.iter().map(|(k, v)| (k, base64(v).into())));
                obj.insert("binaryData".into(), m);
            }
            if let Some(b) = self.immutable {
                obj.insert("immutable".into(), b.into());
            }
        } else if let Some(fins) = &self.spec_finalizers {
            let mut spec = Map::new();
            if !fins.is_empty() {
                spec.insert("finalizers".into(), fins.clone().into());
            }
            obj.insert("spec".into(), spec.into());
        }
        obj.into()
    }
}

impl Meta {
    /// The message, and where each of its fields ends.
    fn encode(&self, sparse: bool) -> (Vec<u8>, Vec<usize>) {
        let (mut w, mut ends) = (Writer::default(), Vec::new());
        let unknown = |w: &mut Writer, ends: &mut Vec<usize>, parity: u16| {
            for (off, u) in self.unknown.iter().filter(|(o, _)| o % 2 == parity) {
                w.unknown(18 + u32::from(*off), u);
                ends.push(w.0.len());
            }
        };
        unknown(&mut w, &mut ends, 0);
        if let Some(s) = &self.stale_name {
            w.bytes(1, s.as_bytes());
            ends.push(w.0.len());
        }
        for (number, s) in [
            (1, &self.name),
            (2, &self.generate_name),
            (3, &self.namespace),
        ] {
            w.bytes(number, s.as_bytes());
            ends.push(w.0.len());
        }
        if let Some(g) = self.generation {
            w.uint(7, g as u64);
            ends.push(w.0.len());
        }
        if self.zero_creation {
            w.bytes(8, b"");
            ends.push(w.0.len());
        }
        for (number, m) in [(11, &self.labels), (12, &self.annotations)] {
            for (k, v) in m {
                w.map(number, [(&k[..], v.as_bytes())], sparse);
                ends.push(w.0.len());
            }
        }
        for f in &self.finalizers {
            w.bytes(14, f.as_bytes());
            ends.push(w.0.len());
        }
        unknown(&mut w, &mut ends, 1);
        (w.0, ends)
    }

    fn json(&self) -> Value {
        let mut m = Map::new();
        for (key, s) in [
            ("name", &self.name),
            ("generateName", &self.generate_name),
            ("namespace", &self.namespace),
        ] {
            if !s.is_empty() {
                m.insert(key.into(), s.as_str().into());
            }
        }
        if let Some(g) = self.generation {
            m.insert("generation".into(), g.into());
        }
        for (key, entries) in [("labels", &self.labels), ("annotations", &self.annotations)] {
            if !entries.is_empty() {
                let v = last_wins(entries.iter().map(|(k, v)| (k, Value::from(v.as_str()))));
                m.insert(key.into(), v);
            }
        }
        if !self.finalizers.is_empty() {
            m.insert("finalizers".into(), self.finalizers.clone().into());
        }
        m.into()
    }
}

fn last_wins<'a>(entries: impl Iterator<Item = (&'a String, Value)>) -> Value {
    let mut m = Map::new();
    for (k, v) in entries {
        m.insert(k.clone(), v);
    }
    m.into()
}

/// Standard base64 with padding, bit by bit (unlike the decoder's, which works in 3-byte chunks).
fn base64(data: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let (mut out, mut acc, mut bits) = (String::new(), 0u32, 0);
    for &b in data {
        acc = acc << 8 | u32::from(b);
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(char::from(A[(acc >> bits & 63) as usize]));
        }
        acc &= (1 << bits) - 1;
    }
    if bits > 0 {
        out.push(char::from(A[(acc << (6 - bits) & 63) as usize]));
    }
    while out.len() % 4 != 0 {
        out.push('=');
    }
    out
}
