//! The crate's error type.

pub use crate::annotations::{AnnotationError, Problem};

/// kubeovn-core's error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An annotation on a Kubernetes object is malformed.
    #[error(transparent)]
    Annotation(#[from] AnnotationError),
    /// An AdminNetworkPolicy or BaselineAdminNetworkPolicy is refused.
    #[error(transparent)]
    AdminNetworkPolicy(#[from] crate::crd::AnpError),
    /// A field of a Kubernetes object (a CRD spec) is malformed.
    #[error("{kind} {name}: {field}={value:?}: {problem}")]
    InvalidField {
        /// Kind of the object, e.g. `Subnet`.
        kind: &'static str,
        /// Its name.
        name: String,
        /// The field, e.g. `spec.cidrBlock`.
        field: &'static str,
        /// The value, shortened.
        value: String,
        /// What is wrong with it.
        problem: Problem,
    },
}

/// `Result` with kubeovn-core's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
