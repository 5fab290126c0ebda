//! Server-side field validation (`?fieldValidation=Strict|Warn`), which the OpenAPI documents
//! advertise: kubectl then leaves unknown fields to the server instead of validating itself.
//!
//! Built-in kinds are checked against [`crate::proto::table`], custom resources against their
//! CRD's structural `openAPIV3Schema` (`x-kubernetes-preserve-unknown-fields` and
//! `x-kubernetes-embedded-resource` honoured). Only unknown fields are reported, as the real
//! server's strict decoding does; values are not type-checked.

use serde_json::Value;

use crate::proto::{self, Card, Kind};
use crate::resources::ResourceInfo;
use crate::store::Store;

/// What the request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Directive {
    /// Unknown fields fail the request (400).
    Strict,
    /// Unknown fields are reported in `Warning` headers.
    Warn,
    /// Not checked (also when the parameter is absent: clients that do not ask pay nothing).
    Ignore,
}

impl Directive {
    /// From the `fieldValidation` query parameter.
    pub fn from_query(v: Option<&str>) -> Self {
        match v {
            Some("Strict") => Directive::Strict,
            Some("Warn") => Directive::Warn,
            _ => Directive::Ignore,
        }
    }
}

/// The unknown fields of `obj` (`spec.foo`, `spec.containers[0].bar`), in document order.
pub fn unknown_fields(store: &Store, info: &ResourceInfo, obj: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let Some(o) = obj.as_object() else {
        return out;
    };
    if let Some(m) = proto::message_for(&info.api_version(), &info.kind) {
        for (k, v) in o {
            if k != "apiVersion" && k != "kind" {
                message_field(m, k, v, k, &mut out);
            }
        }
        return out;
    }
    let Some(schema) = crd_schema(store, info) else {
        return out;
    };
    for (k, v) in o {
        match k.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" => message_value(OBJECT_META, v, k, &mut out),
            _ => match schema.pointer(&format!(
                "/properties/{}",
                k.replace('~', "~0").replace('/', "~1")
            )) {
                Some(s) => schema_value(s, v, k, &mut out),
                None if preserves(&schema) => {}
                None => out.push(k.clone()),
            },
        }
    }
    out
}

const OBJECT_META: &str = "apimachinery.pkg.apis.meta.v1.ObjectMeta";

fn crd_schema(store: &Store, info: &ResourceInfo) -> Option<Value> {
    let crds = store.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")?;
    let crd = store
        .get(&crds, None, &format!("{}.{}", info.plural, info.group))
        .ok()?;
    crd.pointer("/spec/versions")?
        .as_array()?
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(&info.version))?
        .pointer("/schema/openAPIV3Schema")
        .cloned()
}

fn preserves(schema: &Value) -> bool {
    schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// Checks one key of a built-in message's JSON object.
fn message_field(message: &str, key: &str, v: &Value, path: &str, out: &mut Vec<String>) {
    let Some(f) = find_field(message, key) else {
        out.push(path.to_owned());
        return;
    };
    if f.kind != Kind::Message {
        return;
    }
    match (f.card, v) {
        (Card::Optional, _) => message_value(f.message, v, path, out),
        (Card::Repeated, Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                message_value(f.message, item, &format!("{path}[{i}]"), out);
            }
        }
        (Card::Map, Value::Object(m)) => {
            for (k, item) in m {
                message_value(f.message, item, &format!("{path}.{k}"), out);
            }
        }
        _ => {}
    }
}

/// A field by JSON name, looking into inlined (embedded) messages.
fn find_field(message: &str, key: &str) -> Option<&'static proto::Field> {
    let m = proto::table().messages.get(message)?;
    m.fields.iter().find_map(|f| match f.json {
        Some(j) if j == key => Some(f),
        None => find_field(f.message, key),
        Some(_) => None,
    })
}

fn message_value(message: &str, v: &Value, path: &str, out: &mut Vec<String>) {
    let short = message.rsplit('.').next().unwrap_or(message);
    // Values that are not objects of known fields in JSON.
    if matches!(
        short,
        "Time"
            | "MicroTime"
            | "IntOrString"
            | "Quantity"
            | "FieldsV1"
            | "RawExtension"
            | "JSON"
            | "JSONSchemaProps"
            | "JSONSchemaPropsOrArray"
            | "JSONSchemaPropsOrBool"
            | "JSONSchemaPropsOrStringArray"
    ) {
        return;
    }
    if let Value::Object(o) = v {
        for (k, item) in o {
            message_field(message, k, item, &format!("{path}.{k}"), out);
        }
    }
}

fn schema_value(schema: &Value, v: &Value, path: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            if preserves(schema) {
                return;
            }
            let embedded = schema
                .get("x-kubernetes-embedded-resource")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            for (k, item) in o {
                let p = format!("{path}.{k}");
                match (props.and_then(|p| p.get(k)), additional) {
                    (Some(s), _) => schema_value(s, item, &p, out),
                    (None, Some(Value::Bool(true))) => {}
                    (None, Some(s @ Value::Object(_))) => schema_value(s, item, &p, out),
                    _ if embedded && k == "metadata" => message_value(OBJECT_META, item, &p, out),
                    _ if embedded && (k == "apiVersion" || k == "kind") => {}
                    _ => out.push(p),
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items").filter(|s| s.is_object()) {
                for (i, item) in items.iter().enumerate() {
                    schema_value(s, item, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// The real server's strict decoding message.
pub fn strict_error(info: &ResourceInfo, unknown: &[String]) -> String {
    let fields: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field \"{f}\""))
        .collect();
    format!(
        "{kind} in version \"{v}\" cannot be handled as a {kind}: strict decoding error: {}",
        fields.join(", "),
        kind = info.kind,
        v = info.version
    )
}
