//! Kubernetes label selectors, parsed once and matched without I/O (`matchLabels` and `matchExpressions`),
//! in a canonical order so two selectors that select the same way compare equal and hash alike.
//!
//! ```
//! use std::collections::BTreeMap;
//! use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
//! use kubeovn_core::selector::Selector;
//! let s: LabelSelector = serde_json::from_value(serde_json::json!({"matchLabels": {"app": "web"}})).unwrap();
//! let s = Selector::from_label_selector(&s).unwrap();
//! let labels = BTreeMap::from([("app".to_owned(), "web".to_owned())]);
//! assert!(s.matches(&labels));
//! assert_eq!(s.to_string(), "app=web");
//! ```

use std::collections::BTreeMap;
use std::fmt;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Requirement {
    /// The label has this value.
    Equals(String, String),
    /// The label has one of these values.
    In(String, Vec<String>),
    /// The label is absent or has none of these values.
    NotIn(String, Vec<String>),
    /// The label is present.
    Exists(String),
    /// The label is absent.
    DoesNotExist(String),
}

/// A label selector: every requirement holds (no requirement: everything matches).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Selector(pub Vec<Requirement>);

/// A label selector Kubernetes would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("label selector: {0}")]
pub struct SelectorError(pub String);

impl Selector {
    /// From Kubernetes' `LabelSelector`.
    pub fn from_label_selector(
        s: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    ) -> Result<Self, SelectorError> {
        let mut reqs: Vec<Requirement> = s
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| Requirement::Equals(k.clone(), v.clone()))
            .collect();
        for e in s.match_expressions.iter().flatten() {
            let vals = e.values.clone().unwrap_or_default();
            let k = e.key.clone();
            reqs.push(match e.operator.as_str() {
                "In" if !vals.is_empty() => Requirement::In(k, vals),
                "NotIn" if !vals.is_empty() => Requirement::NotIn(k, vals),
                "Exists" if vals.is_empty() => Requirement::Exists(k),
                "DoesNotExist" if vals.is_empty() => Requirement::DoesNotExist(k),
                op => {
                    return Err(SelectorError(format!(
                        "operator {op:?} with {} values on key {k:?}",
                        vals.len()
                    )))
                }
            });
        }
        Ok(Selector::new(reqs))
    }

    /// From requirements, in canonical order (sorted, values sorted, duplicates dropped).
    pub fn new(mut reqs: Vec<Requirement>) -> Self {
        for r in &mut reqs {
            if let Requirement::In(_, vs) | Requirement::NotIn(_, vs) = r {
                vs.sort();
                vs.dedup();
            }
        }
        reqs.sort();
        reqs.dedup();
        Selector(reqs)
    }

    /// The selector that matches everything.
    pub fn everything() -> Self {
        Selector(Vec::new())
    }

    /// Whether it matches everything.
    pub fn is_everything(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }

    /// An equality term to index the selector by.
    #[cfg(feature = "controller")]
    pub(crate) fn anchor(&self) -> Option<(String, String)> {
        self.0.iter().find_map(|r| match r {
            Requirement::Equals(k, v) => Some((k.clone(), v.clone())),
            Requirement::In(k, vs) if vs.len() == 1 => Some((k.clone(), vs[0].clone())),
            _ => None,
        })
    }
}

impl fmt::Display for Selector {
    /// Kubernetes' label selector syntax (`a=b,c in (d,e),!f`); the empty selector is `{}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("{}");
        }
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match r {
                Requirement::Equals(k, v) => write!(f, "{k}={v}")?,
                Requirement::In(k, vs) => write!(f, "{k} in ({})", vs.join(","))?,
                Requirement::NotIn(k, vs) => write!(f, "{k} notin ({})", vs.join(","))?,
                Requirement::Exists(k) => write!(f, "{k}")?,
                Requirement::DoesNotExist(k) => write!(f, "!{k}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn req() -> impl Strategy<Value = Requirement> {
        let k = "[ab]";
        let vs = proptest::collection::vec("[xyz]", 1..3);
        prop_oneof![
            (k, "[xyz]").prop_map(|(k, v)| Requirement::Equals(k, v)),
            (k, vs.clone()).prop_map(|(k, v)| Requirement::In(k, v)),
            (k, vs).prop_map(|(k, v)| Requirement::NotIn(k, v)),
            k.prop_map(Requirement::Exists),
            k.prop_map(Requirement::DoesNotExist),
        ]
    }

    proptest! {
        /// The canonical form selects exactly what the requirements in any order select.
        #[test]
        fn canonical_order_selects_the_same(
            mut reqs in proptest::collection::vec(req(), 0..4),
            labels in proptest::collection::btree_map("[ab]", "[xyz]", 0..3),
        ) {
            let raw = Selector(reqs.clone());
            let canon = Selector::new(reqs.clone());
            reqs.reverse();
            prop_assert_eq!(&Selector::new(reqs), &canon);
            prop_assert_eq!(raw.matches(&labels), canon.matches(&labels));
        }
    }
}
