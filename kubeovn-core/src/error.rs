//! The crate's error type.

pub use crate::annotations::{AnnotationError, Problem};

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
