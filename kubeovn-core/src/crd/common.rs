//! Types shared by the CRDs: address counters, conditions, and schemas of Kubernetes types we embed.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// A number of addresses (Kube-OVN's `BigInt`: an IPv6 subnet holds more than 2^64).
///
/// Written as a JSON integer while it fits in 64 bits, as a float beyond (as the API server itself stores
/// such numbers); read from an integer, a float or a decimal string.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IpCount(pub u128);

impl fmt::Display for IpCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<u128> for IpCount {
    fn from(n: u128) -> Self {
        IpCount(n)
    }
}

impl Serialize for IpCount {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match u64::try_from(self.0) {
            Ok(n) => s.serialize_u64(n),
            // serde_json::Value holds no u128: a float keeps every serialiser working.
            Err(_) => s.serialize_f64(self.0 as f64),
        }
    }
}

impl<'de> Deserialize<'de> for IpCount {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = IpCount;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-negative number of addresses")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<IpCount, E> {
                Ok(IpCount(v.into()))
            }
            fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<IpCount, E> {
                Ok(IpCount(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<IpCount, E> {
                u128::try_from(v)
                    .map(IpCount)
                    .map_err(|_| E::custom("negative address count"))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<IpCount, E> {
                if v.is_finite() && v >= 0.0 {
                    // Saturating conversion: an f64 above u128::MAX is clamped.
                    Ok(IpCount(v as u128))
                } else {
                    Err(E::custom("not a non-negative finite number"))
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<IpCount, E> {
                v.trim()
                    .parse::<u128>()
                    .map(IpCount)
                    .or_else(|_| match v.trim().parse::<f64>() {
                        Ok(f) => self.visit_f64(f),
                        Err(_) => Err(E::custom("not a number")),
                    })
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<IpCount, E> {
                Ok(IpCount(0))
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for IpCount {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "IpCount".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "number" })
    }
    fn inline_schema() -> bool {
        true
    }
}

/// Status of a condition: `True`, `False` or `Unknown`.
pub type ConditionStatus = String;

/// A condition as Kube-OVN writes it (`Ready`, `Validated`, `Error`, ...).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Type of condition.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// Machine-readable reason of the last transition.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub reason: String,
    /// Human-readable message.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub message: String,
    /// The generation the condition was computed from.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_zero_i64"
    )]
    pub observed_generation: i64,
    /// Last time the condition was probed.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "time_schema")]
    pub last_update_time: Option<Time>,
    /// Last time the condition changed status.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "time_schema")]
    pub last_transition_time: Option<Time>,
}

pub(crate) fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}

pub(crate) fn is_false(v: &bool) -> bool {
    !*v
}

pub(crate) fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

/// Schema of a `metav1.Time`.
pub(crate) fn time_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "string", "format": "date-time", "nullable": true })
}

/// Schema of a `metav1.LabelSelector` (k8s-openapi types carry no schemars schema without a heavy feature).
fn label_selector_props() -> serde_json::Value {
    serde_json::json!({
        "matchLabels": { "type": "object", "additionalProperties": { "type": "string" } },
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["key", "operator"],
                "properties": {
                    "key": { "type": "string" },
                    "operator": { "type": "string" },
                    "values": { "type": "array", "items": { "type": "string" } }
                }
            }
        }
    })
}

/// Schema of an optional `metav1.LabelSelector`.
pub(crate) fn label_selector_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "object", "nullable": true, "properties": label_selector_props() })
}

/// Schema of a required `metav1.LabelSelector` (empty selects everything).
pub(crate) fn required_label_selector_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "object", "properties": label_selector_props() })
}

/// Schema of a list of `metav1.LabelSelector`.
pub(crate) fn label_selectors_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "items": { "type": "object", "properties": label_selector_props() }
    })
}

/// Reads `null` (Go's nil slice or zero value) as the type's default.
pub(crate) fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

/// Reads `null` and `""` as `None`: Kube-OVN's Go types hold these enums as strings, empty meaning unset.
pub(crate) fn empty_none<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    match Option::<String>::deserialize(d)? {
        Some(s) if !s.is_empty() => T::deserialize(
            serde::de::IntoDeserializer::<D::Error>::into_deserializer(s),
        )
        .map(Some),
        _ => Ok(None),
    }
}
