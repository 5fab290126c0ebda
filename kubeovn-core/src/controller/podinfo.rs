//! The part of a Pod the controller reads. Decoding only this (metadata, `spec.nodeName`,
//! `spec.hostNetwork`) instead of the whole Pod halves the CPU spent on watch events and keeps the
//! informer's store small.

use std::borrow::Cow;
use std::collections::BTreeMap;

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
    /// The annotations [`trim`] kept, packed into one string (`metadata.annotations` is then None): one
    /// allocation per stored pod instead of two per entry plus the map's nodes.
    #[serde(skip)]
    packed: Option<Box<str>>,
}

static NO_ANNOTATIONS: BTreeMap<String, String> = BTreeMap::new();

impl PodInfo {
    /// The pod's annotations: `metadata.annotations`, or once trimmed the ones [`trim`] kept.
    pub fn annotation_map(&self) -> Cow<'_, BTreeMap<String, String>> {
        match (&self.packed, &self.metadata.annotations) {
            (Some(p), _) => Cow::Owned(unpack(p)),
            (None, Some(a)) => Cow::Borrowed(a),
            (None, None) => Cow::Borrowed(&NO_ANNOTATIONS),
        }
    }

    /// Metadata (annotations moved into the packed string), spec and the packed annotations.
    pub(crate) fn into_parts(mut self) -> (ObjectMeta, PodInfoSpec, Option<Box<str>>) {
        if let Some(a) = self.metadata.annotations.take() {
            if self.packed.is_none() && !a.is_empty() {
                self.packed = Some(pack(&a));
            }
        }
        (self.metadata, self.spec, self.packed)
    }

    /// A trimmed pod from its parts (see [`PodInfo::into_parts`]).
    pub(crate) fn with_packed(
        metadata: ObjectMeta,
        spec: PodInfoSpec,
        packed: Option<Box<str>>,
    ) -> Self {
        PodInfo {
            metadata,
            spec,
            packed,
        }
    }
}

/// The prefix of Kube-OVN's own annotations, stored once per pod as a marker instead of once per key.
const OVN_PREFIX: &str = "ovn.kubernetes.io/";

/// `len:key` `len:value` pairs, lengths in bytes, in decimal; a key written `len;rest` had [`OVN_PREFIX`].
fn pack(a: &BTreeMap<String, String>) -> Box<str> {
    use std::fmt::Write;
    let mut out = String::with_capacity(a.iter().map(|(k, v)| k.len() + v.len() + 8).sum());
    for (k, v) in a {
        let _ = match k.strip_prefix(OVN_PREFIX) {
            Some(rest) => write!(out, "{};{rest}", rest.len()),
            None => write!(out, "{}:{k}", k.len()),
        };
        let _ = write!(out, "{}:{v}", v.len());
    }
    out.into_boxed_str()
}

pub(crate) fn unpack(mut s: &str) -> BTreeMap<String, String> {
    /// One field and whether it was marked with `;`.
    fn field<'a>(s: &mut &'a str) -> Option<(&'a str, bool)> {
        let at = s.find([':', ';'])?;
        let n: usize = s[..at].parse().ok()?;
        let marked = s.as_bytes()[at] == b';';
        let rest = &s[at + 1..];
        let v = rest.get(..n)?;
        *s = rest.get(n..)?;
        Some((v, marked))
    }
    let mut out = BTreeMap::new();
    while !s.is_empty() {
        let (Some((k, marked)), Some((v, _))) = (field(&mut s), field(&mut s)) else {
            break;
        };
        let k = if marked {
            format!("{OVN_PREFIX}{k}")
        } else {
            k.to_owned()
        };
        out.insert(k, v.to_owned());
    }
    out
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
/// finalizers, the resourceVersion (the watcher keeps its own) and every annotation but Kube-OVN's
/// (`*.kubernetes.io/*` except kubectl's last-applied copy) and Multus', which are packed (read them with
/// [`PodInfo::annotation_map`]).
pub fn trim(p: &mut PodInfo) {
    let m = &mut p.metadata;
    m.resource_version = None;
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
    if let Some(a) = m.annotations.take() {
        p.packed = (!a.is_empty()).then(|| pack(&a));
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
    fn trim_packs_the_kept_annotations() {
        let mut p: PodInfo = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "n", "resourceVersion": "7", "annotations": {
                "ovn.kubernetes.io/ip_address": "10.16.0.5",
                "ovn.kubernetes.io/odd": "1:2:3 \u{0} é",
                "k8s.v1.cni.cncf.io/networks": "",
                "kubectl.kubernetes.io/last-applied-configuration": "{}",
                "app": "x"
            }}
        }))
        .expect("decode");
        let before = p.annotation_map().into_owned();
        trim(&mut p);
        assert!(p.metadata.annotations.is_none() && p.metadata.resource_version.is_none());
        let mut want = before;
        want.retain(|k, _| k != "app" && !k.starts_with("kubectl."));
        assert_eq!(p.annotation_map().into_owned(), want);
        let mut bare = PodInfo::default();
        trim(&mut bare);
        assert!(bare.annotation_map().is_empty());
    }

    proptest::proptest! {
        #[test]
        fn pack_round_trips(
            a in proptest::collection::btree_map("(ovn\\.kubernetes\\.io/)?[^;]*;?.*", ".*", 0..8)
        ) {
            proptest::prop_assert_eq!(unpack(&pack(&a)), a);
        }
    }

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
