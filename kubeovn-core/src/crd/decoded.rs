//! Custom resources as a watcher reads them: typed, yet one whose spec does not decode stays visible.
//!
//! The CRD types are strict (a `protocol: IPv5` is an error, see the tests). The API server's schema
//! normally refuses such objects, but one can get in (Kube-OVN's own, looser CRDs; a server that does not
//! validate types). Decoded strictly, that one object would fail the whole list of its kind and never be
//! seen; as a [`Decoded`] it is listed with the default spec and the reason, so its handler can refuse it
//! where the user looks (a condition, an event).

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// A custom resource whose spec, when it does not decode as `K`'s, is read as the default spec, with why.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded<K> {
    /// The object: metadata and status as sent, the spec as sent or (see `spec_error`) the default one.
    pub object: K,
    /// Why the spec as sent did not decode (`spec.cidrBlock: invalid type: integer ...`).
    pub spec_error: Option<String>,
}

impl<K> Decoded<K> {
    /// An object whose spec decoded.
    pub fn new(object: K) -> Self {
        Decoded {
            object,
            spec_error: None,
        }
    }
}

impl<K: DeserializeOwned + Serialize + Default> Decoded<K> {
    /// Decodes `v`: strictly, else with the default spec (the error names the first field that failed);
    /// an error only when the metadata or the status do not decode either.
    pub fn from_value(v: Value) -> Result<Self, serde_json::Error> {
        let e = match K::deserialize(&v) {
            Ok(object) => return Ok(Decoded::new(object)),
            Err(e) => e,
        };
        let default_spec = serde_json::to_value(K::default())?
            .get("spec")
            .cloned()
            .unwrap_or(Value::Null);
        let why = Self::locate(&v, &default_spec, &e);
        let mut fallback = v;
        match &mut fallback {
            Value::Object(m) => {
                m.insert("spec".to_owned(), default_spec);
            }
            _ => return Err(e),
        }
        Ok(Decoded {
            object: K::deserialize(fallback)?,
            spec_error: Some(why),
        })
    }

    /// `spec.<field>: <error>` for the first spec field that fails on its own (over the default spec), else
    /// `spec: <error>` (a missing required field, a spec that is not an object).
    fn locate(v: &Value, default_spec: &Value, e: &serde_json::Error) -> String {
        if let (Some(Value::Object(spec)), Value::Object(base)) = (v.get("spec"), default_spec) {
            for (field, value) in spec {
                let mut one = base.clone();
                one.insert(field.clone(), value.clone());
                let mut probe = v.clone();
                if let Value::Object(m) = &mut probe {
                    m.insert("spec".to_owned(), Value::Object(one));
                }
                if let Err(e) = K::deserialize(&probe) {
                    return format!("spec.{field}: {e}");
                }
            }
        }
        format!("spec: {e}")
    }
}

impl<'de, K: DeserializeOwned + Serialize + Default> Deserialize<'de> for Decoded<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::from_value(Value::deserialize(d)?).map_err(D::Error::custom)
    }
}

impl<K: Resource> Resource for Decoded<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        self.object.meta()
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.object.meta_mut()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::crd::{IPPool, Subnet};

    fn subnet(spec: Value) -> Decoded<Subnet> {
        serde_json::from_value(json!({
            "apiVersion": "kubeovn.io/v1", "kind": "Subnet", "metadata": {"name": "s"},
            "spec": spec,
            "status": {"conditions": [{"type": "Validated", "status": "False", "reason": "r"}]},
        }))
        .expect("decoded")
    }

    #[test]
    fn a_spec_that_does_not_decode_is_kept_with_the_field_that_failed() {
        let ok = subnet(json!({"cidrBlock": "10.66.0.0/24", "namespaces": ["ns1"]}));
        assert_eq!(ok.spec_error, None);
        assert_eq!(ok.object.spec.namespaces, ["ns1"]);

        for (spec, want) in [
            (
                json!({"cidrBlock": 5, "vpc": "v"}),
                "spec.cidrBlock: invalid type: integer `5`",
            ),
            (
                json!({"vpc": "v", "protocol": "IPv5"}),
                "spec.protocol: unknown variant `IPv5`",
            ),
            (json!({"mtu": -1}), "spec.mtu: invalid value"),
            (json!("x"), "spec: invalid type: string"),
        ] {
            let d = subnet(spec.clone());
            let e = d.spec_error.expect("refused");
            assert!(e.starts_with(want), "{spec}: {e}");
            // Metadata and status as sent; the spec the default one.
            assert_eq!(d.object.metadata.name.as_deref(), Some("s"));
            assert_eq!(d.object.spec, Default::default());
            let st = d.object.status.expect("status");
            assert_eq!(st.conditions[0].reason, "r");
        }
        // No spec at all.
        let d: Decoded<Subnet> = serde_json::from_value(
            json!({"apiVersion": "kubeovn.io/v1", "kind": "Subnet", "metadata": {"name": "s"}}),
        )
        .expect("decoded");
        assert!(d.spec_error.expect("refused").contains("spec"));

        // A pool's required fields missing.
        let p: Decoded<IPPool> = serde_json::from_value(json!({
            "apiVersion": "kubeovn.io/v1", "kind": "IPPool", "metadata": {"name": "p"},
            "spec": {"subnet": "s"},
        }))
        .expect("decoded");
        let e = p.spec_error.expect("refused");
        assert!(e.contains("missing field `ips`"), "{e}");

        // Unreadable metadata is still an error.
        assert!(serde_json::from_value::<Decoded<Subnet>>(
            json!({"apiVersion": "kubeovn.io/v1", "kind": "Subnet", "metadata": 5, "spec": {}})
        )
        .is_err());
    }
}
