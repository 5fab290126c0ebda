//! OpenAPI documents of the served kinds: `/openapi/v2` and `/openapi/v3`.
//!
//! kubectl reads them for `apply`'s validation (it asks whether PATCH takes `fieldValidation`,
//! and validates on the client when it does not), for `explain`, and to pick the patch type of
//! `apply` (strategic merge where a PATCH operation accepts it). The built-in kinds' schemas come
//! from [`crate::proto::table`]; a CRD's from its `openAPIV3Schema`, published under the
//! reversed group name as the real server does (`io.kubeovn.v1.Subnet`). Every kind gets a PATCH
//! operation tagged `x-kubernetes-group-version-kind` that lists `fieldValidation`, which the
//! server honours ([`crate::validate`]).
//!
//! kubectl 1.27 and 1.28 only read `/openapi/v2`, and only as protobuf (the gnostic
//! `openapi.v2.Document`, vendor extensions as YAML text), so v2 is encoded by [`v2_protobuf`].

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use serde_json::{json, Map, Value};

use crate::proto::{self, Card, Kind};
use crate::resources::ResourceInfo;
use crate::store::Store;

/// The content type kubectl asks `/openapi/v2` for.
pub const V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";

/// The content type of the protobuf v2 answer: the real server's, which Go's MIME parser takes
/// (the `@` of the requested one is not a token character).
pub const V2_PROTOBUF_ANSWER: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

const REF_V2: &str = "#/definitions/";
const REF_V3: &str = "#/components/schemas/";

/// The definition name of a table message (`api.core.v1.Pod` -> `io.k8s.api.core.v1.Pod`).
fn builtin_name(message: &str) -> String {
    format!(
        "io.k8s.{}",
        message.replace("apiextensions_apiserver", "apiextensions-apiserver")
    )
}

/// The definition name of a CRD kind: the group reversed, then version and kind.
fn crd_name(group: &str, version: &str, kind: &str) -> String {
    let rev: Vec<&str> = group.split('.').rev().collect();
    format!("{}.{version}.{kind}", rev.join("."))
}

fn gvk(info: &ResourceInfo) -> Value {
    json!({"group": info.group, "version": info.version, "kind": info.kind})
}

fn field_schema(kind: Kind, message: &str) -> Value {
    match kind {
        Kind::String => json!({"type": "string"}),
        Kind::Bytes => json!({"type": "string", "format": "byte"}),
        Kind::Int32 => json!({"type": "integer", "format": "int32"}),
        Kind::Int64 => json!({"type": "integer", "format": "int64"}),
        Kind::Bool => json!({"type": "boolean"}),
        Kind::Double => json!({"type": "number", "format": "double"}),
        Kind::Message => json!({"$ref": format!("{REF_V2}{}", builtin_name(message))}),
    }
}

/// The schema of a built-in message, v2 flavour (`$ref`s to `#/definitions/`).
fn message_schema(name: &str) -> Value {
    let short = name.rsplit('.').next().unwrap_or(name);
    let t = proto::table();
    let doc = t.messages.get(name).map_or("", |m| m.doc);
    let mut s = match short {
        "Time" | "MicroTime" => json!({"type": "string", "format": "date-time"}),
        "IntOrString" => json!({"type": "string", "format": "int-or-string"}),
        "Quantity" => json!({"type": "string"}),
        "FieldsV1" | "RawExtension" => json!({"type": "object"}),
        "JSON"
        | "JSONSchemaPropsOrArray"
        | "JSONSchemaPropsOrBool"
        | "JSONSchemaPropsOrStringArray" => {
            json!({})
        }
        _ => {
            let mut props = Map::new();
            add_properties(name, &mut props);
            if props.contains_key("metadata") {
                // Objects and lists carry TypeMeta, which protobuf leaves to the envelope: without it
                // kubectl's validation refuses apiVersion and kind as unknown fields (items of a List).
                for (k, what) in [
                    ("apiVersion", "the versioned schema"),
                    ("kind", "the REST resource"),
                ] {
                    props.insert(
                        k.to_owned(),
                        json!({"type": "string", "description": format!("{k}: names {what} of this object.")}),
                    );
                }
            }
            json!({"type": "object", "properties": props})
        }
    };
    if !doc.is_empty() {
        s["description"] = Value::String(doc.replace("\\n", "\n"));
    }
    s
}

fn add_properties(name: &str, props: &mut Map<String, Value>) {
    let Some(m) = proto::table().messages.get(name) else {
        return;
    };
    for f in &m.fields {
        let Some(json_name) = f.json else {
            add_properties(f.message, props);
            continue;
        };
        let item = field_schema(f.kind, f.message);
        let mut s = match f.card {
            Card::Optional => item,
            Card::Repeated => json!({"type": "array", "items": item}),
            Card::Map => json!({"type": "object", "additionalProperties": item}),
        };
        if !f.doc.is_empty() {
            s["description"] = Value::String(f.doc.replace("\\n", "\n"));
        }
        props.insert(json_name.to_owned(), s);
    }
}

/// Every definition: the built-in messages and the served CRD versions, v2 flavour.
fn definitions(store: &Store) -> BTreeMap<String, Value> {
    let t = proto::table();
    let mut defs = BTreeMap::new();
    for name in &t.order {
        defs.insert(builtin_name(name), message_schema(name));
    }
    let resources = store.resources();
    for info in &resources {
        if let Some(m) = proto::message_for(&info.api_version(), &info.kind) {
            if let Some(Value::Object(d)) = defs.get_mut(&builtin_name(m)) {
                d.insert("x-kubernetes-group-version-kind".into(), json!([gvk(info)]));
            }
        }
    }
    for (info, schema) in crd_schemas(store) {
        defs.insert(crd_name(&info.group, &info.version, &info.kind), schema);
    }
    defs
}

/// The served CRD versions and their schemas (with apiVersion, kind and metadata added, as the
/// real server publishes them).
fn crd_schemas(store: &Store) -> Vec<(ResourceInfo, Value)> {
    let Some(crds) = store.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for crd in store.list(&crds, None, |_| true).items {
        let Ok(infos) = crate::resources::from_crd(&crd) else {
            continue;
        };
        let versions = crd.pointer("/spec/versions").and_then(Value::as_array);
        for info in infos {
            let schema = versions
                .and_then(|vs| {
                    vs.iter()
                        .find(|v| v.get("name").and_then(Value::as_str) == Some(&info.version))
                })
                .and_then(|v| v.pointer("/schema/openAPIV3Schema"))
                .cloned()
                .unwrap_or_else(
                    || json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
                );
            let mut schema = match schema {
                Value::Object(m) => m,
                _ => Map::new(),
            };
            let props = schema
                .entry("properties")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(p) = props {
                p.insert("apiVersion".into(), json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."}));
                p.insert("kind".into(), json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."}));
                p.insert(
                    "metadata".into(),
                    json!({"$ref": format!("{REF_V2}io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")}),
                );
            }
            schema.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([gvk(&info)]),
            );
            out.push((info, Value::Object(schema)));
        }
    }
    out
}

fn definition_of(info: &ResourceInfo) -> String {
    match proto::message_for(&info.api_version(), &info.kind) {
        Some(m) => builtin_name(m),
        None => crd_name(&info.group, &info.version, &info.kind),
    }
}

fn object_path(info: &ResourceInfo) -> String {
    let prefix = if info.group.is_empty() {
        format!("/api/{}", info.version)
    } else {
        format!("/apis/{}/{}", info.group, info.version)
    };
    if info.namespaced {
        format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", info.plural)
    } else {
        format!("{prefix}/{}/{{name}}", info.plural)
    }
}

/// The PATCH content types: strategic merge for the built-in kinds only, as the real server
/// (server-side apply is not served).
fn patch_types(info: &ResourceInfo) -> Vec<&'static str> {
    let mut t = vec![
        "application/json-patch+json",
        "application/merge-patch+json",
    ];
    if proto::message_for(&info.api_version(), &info.kind).is_some() {
        t.push("application/strategic-merge-patch+json");
    }
    t
}

fn v2_patch(info: &ResourceInfo) -> Value {
    let query = |n: &str| json!({"name": n, "in": "query", "type": "string", "uniqueItems": true});
    json!({
        "consumes": patch_types(info),
        "produces": ["application/json"],
        "operationId": format!("patch{}", info.kind),
        "parameters": [
            {"name": "body", "in": "body", "required": true, "schema": {"type": "object"}},
            query("fieldManager"),
            query("fieldValidation"),
        ],
        "responses": {"200": {"description": "OK", "schema": {"$ref": format!("{REF_V2}{}", definition_of(info))}}},
        "x-kubernetes-action": "patch",
        "x-kubernetes-group-version-kind": gvk(info),
    })
}

/// The whole v2 document (JSON).
pub fn v2(store: &Store) -> Value {
    let mut paths = Map::new();
    for info in store.resources() {
        paths.insert(object_path(&info), json!({"patch": v2_patch(&info)}));
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "definitions": definitions(store),
    })
}

/// `/openapi/v3`: one entry per group version, with a hash of its document.
pub fn v3_root(store: &Store) -> Value {
    let gvs: BTreeSet<(String, String)> = store
        .resources()
        .iter()
        .map(|r| (r.group.clone(), r.version.clone()))
        .collect();
    let defs = definitions(store);
    let mut paths = Map::new();
    for (g, v) in gvs {
        let key = if g.is_empty() {
            format!("api/{v}")
        } else {
            format!("apis/{g}/{v}")
        };
        let Some(doc) = group_version_doc(store, &defs, &g, &v) else {
            continue;
        };
        let mut h = std::collections::hash_map::DefaultHasher::new();
        doc.to_string().hash(&mut h);
        paths.insert(
            key.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={:016X}", h.finish())}),
        );
    }
    json!({"paths": paths})
}

/// `/openapi/v3/api/v1`, `/openapi/v3/apis/<group>/<version>`: the kinds of one group version
/// and every schema they reach.
pub fn v3_group_version(store: &Store, group: &str, version: &str) -> Option<Value> {
    group_version_doc(store, &definitions(store), group, version)
}

fn group_version_doc(
    store: &Store,
    defs: &BTreeMap<String, Value>,
    group: &str,
    version: &str,
) -> Option<Value> {
    let infos: Vec<_> = store
        .resources()
        .into_iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if infos.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    let mut wanted: Vec<String> = vec!["io.k8s.apimachinery.pkg.apis.meta.v1.Patch".into()];
    for info in &infos {
        let name = definition_of(info);
        let content: Map<String, Value> = patch_types(info)
            .into_iter()
            .map(|t| (t.to_owned(), json!({"schema": {"$ref": format!("{REF_V3}io.k8s.apimachinery.pkg.apis.meta.v1.Patch")}})))
            .collect();
        let query = |n: &str| json!({"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": true}});
        paths.insert(
            object_path(info),
            json!({"patch": {
                "operationId": format!("patch{}", info.kind),
                "parameters": [query("fieldManager"), query("fieldValidation")],
                "requestBody": {"content": content, "required": true},
                "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": format!("{REF_V3}{name}")}}}}},
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk(info),
            }}),
        );
        wanted.push(name);
    }
    // Every schema the kinds reach through $refs.
    let mut schemas = Map::new();
    while let Some(name) = wanted.pop() {
        if schemas.contains_key(&name) {
            continue;
        }
        let s = match defs.get(&name) {
            Some(s) => s.clone(),
            None if name.ends_with(".Patch") => {
                json!({"type": "object", "description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body."})
            }
            None => continue,
        };
        collect_refs(&s, &mut wanted);
        schemas.insert(name, v3_schema(s));
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

fn collect_refs(s: &Value, out: &mut Vec<String>) {
    match s {
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => {
                        if let Some(n) = r.strip_prefix(REF_V2) {
                            out.push(n.to_owned());
                        }
                    }
                    _ => collect_refs(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

/// v2 schema -> v3: refs move to components; `int-or-string` becomes the v3 extension.
fn v3_schema(mut s: Value) -> Value {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get_mut("$ref") {
                    if let Some(n) = r.strip_prefix(REF_V2) {
                        *r = format!("{REF_V3}{n}");
                    }
                }
                if m.get("format").and_then(Value::as_str) == Some("int-or-string") {
                    m.remove("type");
                    m.remove("format");
                    m.insert("x-kubernetes-int-or-string".into(), Value::Bool(true));
                }
                m.values_mut().for_each(walk);
            }
            Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut s);
    s
}

/// The v2 document as the gnostic `openapi.v2.Document` protobuf kubectl decodes.
pub fn v2_protobuf(doc: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    put_str(
        &mut out,
        1,
        doc.get("swagger").and_then(Value::as_str).unwrap_or("2.0"),
    );
    let mut info = Vec::new();
    put_str(&mut info, 1, "Kubernetes");
    put_str(&mut info, 2, "v1.32.0");
    put_msg(&mut out, 2, &info);
    let mut paths = Vec::new();
    for (path, item) in doc
        .get("paths")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let mut pi = Vec::new();
        if let Some(op) = item.get("patch") {
            put_msg(&mut pi, 8, &operation(op));
        }
        let mut named = Vec::new();
        put_str(&mut named, 1, path);
        put_msg(&mut named, 2, &pi);
        put_msg(&mut paths, 2, &named);
    }
    put_msg(&mut out, 8, &paths);
    let mut defs = Vec::new();
    for (name, s) in doc
        .get("definitions")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let mut named = Vec::new();
        put_str(&mut named, 1, name);
        put_msg(&mut named, 2, &schema(s));
        put_msg(&mut defs, 1, &named);
    }
    put_msg(&mut out, 9, &defs);
    out
}

fn operation(op: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let strs = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    put_str(
        &mut out,
        5,
        op.get("operationId").and_then(Value::as_str).unwrap_or(""),
    );
    for p in strs(op.get("produces")) {
        put_str(&mut out, 6, &p);
    }
    for c in strs(op.get("consumes")) {
        put_str(&mut out, 7, &c);
    }
    for p in op
        .get("parameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let s = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or("");
        let mut param = Vec::new();
        if s("in") == "body" {
            let mut body = Vec::new();
            put_str(&mut body, 2, s("name"));
            put_str(&mut body, 3, "body");
            put_bool(&mut body, 4, true);
            put_msg(
                &mut body,
                5,
                &schema(p.get("schema").unwrap_or(&Value::Null)),
            );
            put_msg(&mut param, 1, &body);
        } else {
            let mut q = Vec::new();
            put_str(&mut q, 2, s("in"));
            put_str(&mut q, 4, s("name"));
            put_str(&mut q, 6, s("type"));
            put_bool(&mut q, 20, true);
            let mut nb = Vec::new();
            put_msg(&mut nb, 3, &q);
            put_msg(&mut param, 2, &nb);
        }
        let mut item = Vec::new();
        put_msg(&mut item, 1, &param);
        put_msg(&mut out, 8, &item);
    }
    let mut responses = Vec::new();
    for (code, r) in op
        .get("responses")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let mut resp = Vec::new();
        put_str(
            &mut resp,
            1,
            r.get("description").and_then(Value::as_str).unwrap_or(""),
        );
        if let Some(s) = r.get("schema") {
            let mut si = Vec::new();
            put_msg(&mut si, 1, &schema(s));
            put_msg(&mut resp, 2, &si);
        }
        let mut rv = Vec::new();
        put_msg(&mut rv, 1, &resp);
        let mut named = Vec::new();
        put_str(&mut named, 1, code);
        put_msg(&mut named, 2, &rv);
        put_msg(&mut responses, 1, &named);
    }
    put_msg(&mut out, 9, &responses);
    vendor_extensions(&mut out, 13, op);
    out
}

/// `x-` keys as gnostic `NamedAny`s whose `Any.yaml` holds the value (JSON is YAML).
fn vendor_extensions(out: &mut Vec<u8>, field: u32, obj: &Value) {
    for (k, v) in obj.as_object().into_iter().flatten() {
        if !k.starts_with("x-") {
            continue;
        }
        let mut any = Vec::new();
        put_str(&mut any, 2, &format!("{v}\n"));
        let mut named = Vec::new();
        put_str(&mut named, 1, k);
        put_msg(&mut named, 2, &any);
        put_msg(out, field, &named);
    }
}

fn schema(s: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let str_of = |k: &str| s.get(k).and_then(Value::as_str);
    if let Some(r) = str_of("$ref") {
        put_str(&mut out, 1, r);
    }
    if let Some(f) = str_of("format") {
        put_str(&mut out, 2, f);
    }
    if let Some(d) = str_of("description") {
        put_str(&mut out, 4, d);
    }
    for r in s
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(r) = r.as_str() {
            put_str(&mut out, 19, r);
        }
    }
    match s.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            let mut ap = Vec::new();
            put_bool(&mut ap, 2, *b);
            put_msg(&mut out, 21, &ap);
        }
        Some(a @ Value::Object(_)) => {
            let mut ap = Vec::new();
            put_msg(&mut ap, 1, &schema(a));
            put_msg(&mut out, 21, &ap);
        }
        _ => {}
    }
    if let Some(t) = str_of("type") {
        let mut ti = Vec::new();
        put_str(&mut ti, 1, t);
        put_msg(&mut out, 22, &ti);
    }
    if let Some(items) = s.get("items").filter(|i| i.is_object()) {
        let mut ii = Vec::new();
        put_msg(&mut ii, 1, &schema(items));
        put_msg(&mut out, 23, &ii);
    }
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        let mut p = Vec::new();
        for (name, ps) in props {
            let mut named = Vec::new();
            put_str(&mut named, 1, name);
            put_msg(&mut named, 2, &schema(ps));
            put_msg(&mut p, 1, &named);
        }
        put_msg(&mut out, 25, &p);
    }
    vendor_extensions(&mut out, 31, s);
    out
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_msg(out: &mut Vec<u8>, field: u32, data: &[u8]) {
    put_varint(out, u64::from(field) << 3 | 2);
    put_varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

fn put_str(out: &mut Vec<u8>, field: u32, s: &str) {
    put_msg(out, field, s.as_bytes());
}

fn put_bool(out: &mut Vec<u8>, field: u32, b: bool) {
    put_varint(out, u64::from(field) << 3);
    out.push(u8::from(b));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_with_crd() -> Store {
        let store = Store::new(100);
        let crds = store
            .resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            .unwrap();
        let crd = json!({"metadata": {"name": "gizmos.test.kubeovn.io"}, "spec": {
            "group": "test.kubeovn.io", "scope": "Cluster",
            "names": {"plural": "gizmos", "kind": "Gizmo"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema":
                {"type": "object", "properties": {"spec": {"type": "object"}}}}}]}});
        store.create(&crds, None, crd).unwrap();
        store
    }

    #[test]
    fn every_v3_document_resolves_its_refs_and_tags_its_kinds() {
        let store = store_with_crd();
        let root = v3_root(&store);
        let paths = root["paths"].as_object().unwrap();
        assert!(paths.contains_key("api/v1") && paths.contains_key("apis/test.kubeovn.io/v1"));
        for key in paths.keys() {
            let parts: Vec<&str> = key.split('/').collect();
            let doc = match parts.as_slice() {
                ["api", v] => v3_group_version(&store, "", v),
                ["apis", g, v] => v3_group_version(&store, g, v),
                _ => None,
            }
            .unwrap();
            let schemas = doc["components"]["schemas"].as_object().unwrap();
            let text = doc.to_string();
            assert!(!text.contains(REF_V2), "{key}: a v2 ref is left");
            for r in text.split(REF_V3).skip(1) {
                let name = r.split('"').next().unwrap();
                assert!(schemas.contains_key(name), "{key}: {name} is not defined");
            }
            for (path, item) in doc["paths"].as_object().unwrap() {
                let op = &item["patch"];
                let gvk = &op["x-kubernetes-group-version-kind"];
                assert!(gvk["kind"].is_string(), "{path}");
                assert!(op["parameters"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p["name"] == "fieldValidation"));
                let name = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
                    .as_str()
                    .unwrap()
                    .strip_prefix(REF_V3)
                    .unwrap();
                assert_eq!(
                    schemas[name]["x-kubernetes-group-version-kind"][0], *gvk,
                    "{path}"
                );
                // TypeMeta: kubectl validates a List's items with these schemas.
                for k in ["apiVersion", "kind", "metadata"] {
                    assert!(schemas[name]["properties"][k].is_object(), "{path}: no {k}");
                }
            }
        }
        let gizmo = v3_group_version(&store, "test.kubeovn.io", "v1").unwrap();
        let s = &gizmo["components"]["schemas"]["io.kubeovn.test.v1.Gizmo"];
        assert!(s["properties"]["metadata"]["$ref"].is_string(), "{s}");
    }

    #[test]
    fn v2_protobuf_has_every_definition() {
        let store = store_with_crd();
        let doc = v2(&store);
        let pb = v2_protobuf(&doc);
        // Each definition's name is in the encoding, length-prefixed after field 1.
        for name in doc["definitions"].as_object().unwrap().keys() {
            let mut needle = vec![0x0a, name.len() as u8];
            needle.extend_from_slice(name.as_bytes());
            assert!(pb.windows(needle.len()).any(|w| w == needle), "{name}");
        }
    }
}
