//! The crate's error type.

use std::fmt;

/// The longest annotation value an error quotes; annotations are untrusted and may be huge.
const MAX_QUOTED: usize = 200;

/// What is wrong with an annotation value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// An item is not an IP address (nor `ip/prefix` where that is allowed).
    #[error("{0:?} is not an IP address")]
    Ip(String),
    /// The value is not a MAC address.
    #[error("not a MAC address")]
    Mac,
    /// An item is not a CIDR (`addr/prefix`).
    #[error("{0:?} is not a CIDR")]
    Cidr(String),
    /// A dual-stack list has two entries of one family (or more than two entries).
    #[error("at most one IPv4 and one IPv6 entry are allowed")]
    Family,
    /// The value is not a boolean.
    #[error("not a boolean (true or false)")]
    Bool,
    /// The value is not a non-negative integer in range.
    #[error("not a non-negative integer in range")]
    Integer,
    /// The value is not the JSON the key requires.
    #[error("invalid JSON: {0}")]
    Json(String),
    /// An item is not a valid Kubernetes object name.
    #[error("{0:?} is not a valid name")]
    Name(String),
    /// A Multus network selection is malformed.
    #[error("invalid network selection {item:?}: {why}")]
    Network {
        /// The offending list item.
        item: String,
        /// Why it was rejected.
        why: &'static str,
    },
    /// Lists that must have one entry per logical switch do not.
    #[error("{0} entries where {1} were expected (one per logical switch)")]
    Count(usize, usize),
}

/// A bad annotation: which key, the value (shortened), and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotationError {
    /// The annotation key, e.g. `ovn.kubernetes.io/ip_address`.
    pub key: String,
    /// The value, cut to a few hundred characters.
    pub value: String,
    /// What is wrong with it.
    pub problem: Problem,
}

impl AnnotationError {
    /// An error for `key` with value `value`.
    pub fn new(key: impl Into<String>, value: &str, problem: Problem) -> Self {
        let value = if value.len() > MAX_QUOTED {
            let mut end = MAX_QUOTED;
            while !value.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}...", &value[..end])
        } else {
            value.to_owned()
        };
        AnnotationError {
            key: key.into(),
            value,
            problem,
        }
    }
}

impl fmt::Display for AnnotationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "annotation {}={:?}: {}",
            self.key, self.value, self.problem
        )
    }
}

impl std::error::Error for AnnotationError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.problem)
    }
}

/// kubeovn-core's error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An annotation on a Kubernetes object is malformed.
    #[error(transparent)]
    Annotation(#[from] AnnotationError),
}

/// `Result` with kubeovn-core's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
