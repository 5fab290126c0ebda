//! Patches: JSON merge (RFC 7386), JSON patch (RFC 6902) and a schema-free strategic merge.
//!
//! The strategic merge follows the patch directives kubectl sends (`$patch`, `$setElementOrder/`,
//! `$deleteFromPrimitiveList/`, `$retainKeys`) and merges lists of objects by their merge key
//! (`name` for containers, env and volumes, `type` for conditions, ...); `finalizers` lists merge as
//! sets. Other lists are replaced, as JSON merge patch does.

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Patch flavours, by `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/merge-patch+json`
    Merge,
    /// `application/json-patch+json`
    Json,
    /// `application/strategic-merge-patch+json`
    Strategic,
}

impl PatchKind {
    /// The patch kind for a `Content-Type`, or 415.
    pub fn from_content_type(ct: &str) -> Result<Self> {
        match ct.split(';').next().unwrap_or("").trim() {
            "application/merge-patch+json" => Ok(PatchKind::Merge),
            "application/json-patch+json" => Ok(PatchKind::Json),
            "application/strategic-merge-patch+json" => Ok(PatchKind::Strategic),
            other => Err(Error::unsupported_media(other)),
        }
    }
}

/// Applies `patch` to `target`.
pub fn apply(kind: PatchKind, target: &mut Value, patch: &Value) -> Result<()> {
    match kind {
        PatchKind::Merge => {
            if !patch.is_object() {
                return Err(Error::bad_request("a merge patch must be a JSON object"));
            }
            json_patch::merge(target, patch);
            Ok(())
        }
        PatchKind::Json => {
            let p: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| Error::bad_request(format!("invalid JSON patch: {e}")))?;
            json_patch::patch(target, &p)
                .map_err(|e| Error::invalid(format!("the JSON patch failed: {e}")))
        }
        PatchKind::Strategic => {
            let p = patch
                .as_object()
                .ok_or_else(|| Error::bad_request("a strategic merge patch must be an object"))?;
            strategic(target, p, "");
            Ok(())
        }
    }
}

fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets" => "name",
        "volumeMounts" => "mountPath",
        "conditions" => "type",
        "ownerReferences" => "uid",
        "ports" => "port",
        _ => return None,
    })
}

fn strategic(target: &mut Value, patch: &Map<String, Value>, _field: &str) {
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut p = patch.clone();
        p.remove("$patch");
        *target = Value::Object(p);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Some(t) = target.as_object_mut() else {
        return;
    };
    for (k, v) in patch {
        if let Some(list) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(items)), Some(del)) = (t.get_mut(list), v.as_array()) {
                items.retain(|i| !del.contains(i));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        match v {
            Value::Null => {
                t.remove(k);
            }
            Value::Object(p) => {
                if p.get("$patch").and_then(Value::as_str) == Some("delete") {
                    t.remove(k);
                } else {
                    strategic(t.entry(k.clone()).or_insert(Value::Null), p, k);
                }
            }
            Value::Array(p) => {
                let merged = match t.get_mut(k) {
                    Some(Value::Array(cur)) => merge_list(k, cur, p),
                    _ => false,
                };
                if !merged {
                    let clean: Vec<Value> = p
                        .iter()
                        .filter(|e| e.get("$patch").is_none())
                        .cloned()
                        .collect();
                    t.insert(k.clone(), Value::Array(clean));
                }
            }
            other => {
                t.insert(k.clone(), other.clone());
            }
        }
    }
}

/// Merges `patch` into `cur` when the field has merge semantics; false means "replace".
fn merge_list(field: &str, cur: &mut Vec<Value>, patch: &[Value]) -> bool {
    if field == "finalizers" {
        for p in patch {
            if !cur.contains(p) {
                cur.push(p.clone());
            }
        }
        return true;
    }
    let key = match merge_key(field) {
        Some(k) if field != "ports" || patch.iter().all(|p| p.get(k).is_some()) => k,
        _ if field == "ports" && patch.iter().all(|p| p.get("containerPort").is_some()) => {
            "containerPort"
        }
        _ => return false,
    };
    if !patch.iter().all(Value::is_object) {
        return false;
    }
    for p in patch {
        let Some(pm) = p.as_object() else { continue };
        let id = pm.get(key).cloned();
        let pos = cur
            .iter()
            .position(|c| c.get(key) == id.as_ref() && id.is_some());
        match (pos, pm.get("$patch").and_then(Value::as_str)) {
            (Some(i), Some("delete")) => {
                cur.remove(i);
            }
            (None, Some("delete")) => {}
            (Some(i), _) => strategic(&mut cur[i], pm, field),
            (None, _) => {
                let mut v = Value::Null;
                strategic(&mut v, pm, field);
                cur.push(v);
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merges_named_containers() {
        let mut pod = json!({"metadata": {"labels": {"a": "1"}, "finalizers": ["x"]},
            "spec": {"containers": [{"name": "c1", "image": "i1"}, {"name": "c2", "image": "i2"}]}});
        let patch = json!({"metadata": {"labels": {"b": "2", "a": null}, "finalizers": ["y"]},
            "spec": {"$setElementOrder/containers": [{"name": "c1"}, {"name": "c2"}],
                "containers": [{"name": "c2", "image": "i3"}, {"name": "c1", "$patch": "delete"}]}});
        apply(PatchKind::Strategic, &mut pod, &patch).expect("patch");
        assert_eq!(pod["metadata"]["labels"], json!({"b": "2"}));
        assert_eq!(pod["metadata"]["finalizers"], json!(["x", "y"]));
        assert_eq!(
            pod["spec"]["containers"],
            json!([{"name": "c2", "image": "i3"}])
        );
    }

    #[test]
    fn unknown_patch_type_is_415() {
        let e = PatchKind::from_content_type("application/apply-patch+yaml").expect_err("415");
        assert_eq!(e.code(), 415);
    }
}
