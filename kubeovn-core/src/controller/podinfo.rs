//! The part of a Pod the controller reads. Decoding only this (metadata, `spec.nodeName`,
//! `spec.hostNetwork`) instead of the whole Pod halves the CPU spent on watch events and keeps the
//! informer's store small.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::NamespaceResourceScope;
use serde::{Deserialize, Serialize};

/// A Pod reduced to what the controller needs; other fields are skipped when decoding.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct PodInfo {
    /// Metadata (annotations, name, namespace, deletion timestamp...).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The spec fields read.
    #[serde(default)]
    pub spec: PodInfoSpec,
}

/// `spec` fields of [`PodInfo`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodInfoSpec {
    /// `spec.nodeName`, once scheduled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// `spec.hostNetwork`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_network: Option<bool>,
}

/// Drops what the controller never reads from a pod kept in the informer's store: labels, owner references,
/// finalizers and every annotation but Kube-OVN's (`*.kubernetes.io/*` except kubectl's last-applied copy)
/// and Multus'.
pub fn trim(p: &mut PodInfo) {
    let m = &mut p.metadata;
    m.labels = None;
    m.owner_references = None;
    m.finalizers = None;
    m.generate_name = None;
    m.creation_timestamp = None;
    if let Some(a) = m.annotations.as_mut() {
        a.retain(|k, _| {
            k != "kubectl.kubernetes.io/last-applied-configuration"
                && (k.contains(".kubernetes.io/")
                    || k.starts_with("k8s.v1.cni.cncf.io/")
                    || k.starts_with("v1.multus-cni.io/"))
        });
    }
}

impl kube::Resource for PodInfo {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Pod")
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }
    fn api_version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("pods")
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn decodes_a_full_pod() {
        let p: PodInfo = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "a", "namespace": "n", "annotations": {"k": "v"}},
            "spec": {"nodeName": "n1", "hostNetwork": true, "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running"}
        }))
        .expect("decode");
        assert_eq!(p.spec.node_name.as_deref(), Some("n1"));
        assert_eq!(p.spec.host_network, Some(true));
        let r = p.object_ref(&());
        assert_eq!(
            (r.kind.as_deref(), r.api_version.as_deref()),
            (Some("Pod"), Some("v1"))
        );
        assert_eq!(
            PodInfo::url_path(&(), Some("n")),
            "/api/v1/namespaces/n/pods"
        );
    }
}
