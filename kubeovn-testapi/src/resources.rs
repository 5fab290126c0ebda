//! The served resource types: the built-in kinds and the ones CRDs add.

use serde_json::{json, Value};

/// One served resource (a group, version and plural) as discovery describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceInfo {
    /// API group, empty for the core group.
    pub group: String,
    /// API version inside the group (`v1`).
    pub version: String,
    /// Plural name used in paths (`pods`).
    pub plural: String,
    /// Singular name (`pod`).
    pub singular: String,
    /// Kind (`Pod`).
    pub kind: String,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// Short names kubectl accepts (`po`).
    pub short_names: Vec<String>,
    /// Whether the `status` subresource is served.
    pub status: bool,
    /// Whether the `scale` subresource (`autoscaling/v1` `Scale` over `spec.replicas`) is served.
    pub scale: bool,
}

impl ResourceInfo {
    /// `apiVersion` of the objects (`v1`, `apps/v1`).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Storage key: objects are shared by every version of a group and plural.
    pub fn key(&self) -> String {
        format!("{}/{}", self.group, self.plural)
    }

    /// Discovery entries (`APIResource`) for the resource and its subresources.
    pub fn discovery(&self) -> Vec<Value> {
        let mut out = vec![json!({
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            "shortNames": self.short_names,
        })];
        if self.status {
            out.push(json!({
                "name": format!("{}/status", self.plural),
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if self.scale {
            out.push(json!({
                "name": format!("{}/scale", self.plural),
                "singularName": "",
                "namespaced": self.namespaced,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": ["get", "patch", "update"],
            }));
        }
        out
    }
}

fn builtin(
    group: &str,
    plural: &str,
    kind: &str,
    namespaced: bool,
    short: &[&str],
    status: bool,
) -> ResourceInfo {
    ResourceInfo {
        group: group.to_owned(),
        version: "v1".to_owned(),
        plural: plural.to_owned(),
        singular: kind.to_ascii_lowercase(),
        kind: kind.to_owned(),
        namespaced,
        short_names: short.iter().map(|s| (*s).to_owned()).collect(),
        status,
        scale: group == "apps" && plural != "daemonsets",
    }
}

/// The kinds served from the start.
pub fn builtins() -> Vec<ResourceInfo> {
    vec![
        builtin("", "namespaces", "Namespace", false, &["ns"], true),
        builtin("", "pods", "Pod", true, &["po"], true),
        builtin("", "nodes", "Node", false, &["no"], true),
        builtin("", "services", "Service", true, &["svc"], true),
        builtin("", "endpoints", "Endpoints", true, &["ep"], false),
        builtin("", "events", "Event", true, &["ev"], false),
        builtin("", "configmaps", "ConfigMap", true, &["cm"], false),
        builtin("", "secrets", "Secret", true, &[], false),
        builtin(
            "",
            "serviceaccounts",
            "ServiceAccount",
            true,
            &["sa"],
            false,
        ),
        builtin("apps", "deployments", "Deployment", true, &["deploy"], true),
        builtin("apps", "replicasets", "ReplicaSet", true, &["rs"], true),
        builtin("apps", "daemonsets", "DaemonSet", true, &["ds"], true),
        builtin("apps", "statefulsets", "StatefulSet", true, &["sts"], true),
        builtin("events.k8s.io", "events", "Event", true, &[], false),
        builtin(
            "discovery.k8s.io",
            "endpointslices",
            "EndpointSlice",
            true,
            &[],
            false,
        ),
        builtin(
            "networking.k8s.io",
            "networkpolicies",
            "NetworkPolicy",
            true,
            &["netpol"],
            false,
        ),
        builtin("coordination.k8s.io", "leases", "Lease", true, &[], false),
        builtin(
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            true,
        ),
    ]
}

/// The resources (one per served version) a CRD object declares.
pub fn from_crd(crd: &Value) -> Result<Vec<ResourceInfo>, String> {
    let spec = crd.get("spec").ok_or("spec is required")?;
    let s = |v: Option<&Value>, what: &str| -> Result<String, String> {
        v.and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| format!("{what} is required"))
    };
    let group = s(spec.get("group"), "spec.group")?;
    let names = spec.get("names").ok_or("spec.names is required")?;
    let plural = s(names.get("plural"), "spec.names.plural")?;
    let kind = s(names.get("kind"), "spec.names.kind")?;
    let singular = names
        .get("singular")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| kind.to_ascii_lowercase());
    let short_names = names
        .get("shortNames")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let namespaced = match spec.get("scope").and_then(Value::as_str) {
        Some("Namespaced") | None => true,
        Some("Cluster") => false,
        Some(other) => return Err(format!("spec.scope: unsupported value {other:?}")),
    };
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .filter(|v| !v.is_empty())
        .ok_or("spec.versions must have at least one version")?;
    let mut out = Vec::new();
    for v in versions {
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let version = s(v.get("name"), "spec.versions[].name")?;
        let status = v.pointer("/subresources/status").is_some();
        out.push(ResourceInfo {
            group: group.clone(),
            version,
            plural: plural.clone(),
            singular: singular.clone(),
            kind: kind.clone(),
            namespaced,
            short_names: short_names.clone(),
            status,
            scale: false,
        });
    }
    Ok(out)
}
