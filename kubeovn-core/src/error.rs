//! The crate's error type, and the errors of the CRD checks it wraps (re-exported by `crd`).

use std::fmt;

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
    AdminNetworkPolicy(#[from] AnpError),
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

/// A one-of object (subject, peer, port) with no field or several fields set.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("exactly one of {expected} must be set, found {}", Names(.found))]
pub struct OneOfError {
    /// The fields of which one must be set, e.g. `namespaces, pods`.
    pub expected: &'static str,
    /// The fields that are set.
    pub found: Vec<&'static str>,
}

/// Field names joined by `, `, or `none`.
struct Names<'a>(&'a [&'static str]);

impl fmt::Display for Names<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        f.write_str(&self.0.join(", "))
    }
}

/// Why an admin network policy is refused; each names the field, e.g. `spec.egress[2].to[0]`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AnpError {
    /// A subject, peer or port entry with no field or several set.
    #[error("{field}: {error}")]
    OneOf {
        /// The object, e.g. `spec.subject`.
        field: String,
        /// What is set.
        error: OneOfError,
    },
    /// `spec.priority` outside what is accepted.
    #[error(
        "spec.priority: {priority} is outside 0..={max} (admin policy priorities map onto OVN ACL \
         priorities 30000 - 100 x priority; the API allows up to 1000)"
    )]
    Priority {
        /// The priority given.
        priority: i32,
        /// The highest accepted (`crd::MAX_PRIORITY`).
        max: i32,
    },
    /// A list longer than allowed.
    #[error("{field}: {count} items, at most {max} allowed")]
    TooMany {
        /// The list, e.g. `spec.ingress`.
        field: String,
        /// Its length.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A list that must not be empty (`from`, `to`, `ports` when given, `networks`).
    #[error("{field}: must not be empty")]
    Empty {
        /// The list.
        field: String,
    },
    /// A `networks` entry that is not a CIDR.
    #[error("{field}: {value:?} is not a CIDR (address/prefix length)")]
    Cidr {
        /// The entry, e.g. `spec.egress[0].to[1].networks[0]`.
        field: String,
        /// Its value.
        value: String,
    },
    /// A port (or range bound) 0.
    #[error("{field}: port 0 is not a port (1..=65535)")]
    PortZero {
        /// The port entry.
        field: String,
    },
    /// A range whose start is above its end.
    #[error("{field}: start {start} is above end {end}")]
    PortRange {
        /// The port entry.
        field: String,
        /// Its start.
        start: u16,
        /// Its end.
        end: u16,
    },
    /// A named port in a rule with a peer that has no named ports.
    #[error(
        "{field}: networks/nodes/domainNames peer cannot be set with namedPorts since there are no \
         namedPorts for networks/nodes/domainNames"
    )]
    NamedPortPeer {
        /// The rule.
        field: String,
    },
    /// An empty named port.
    #[error("{field}: empty namedPort")]
    EmptyNamedPort {
        /// The port entry.
        field: String,
    },
    /// A rule name longer than `crd::MAX_RULE_NAME`.
    #[error("{field}: {len} characters, at most {max}")]
    NameTooLong {
        /// The rule's `name`.
        field: String,
        /// Its length in characters.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A `domainNames` entry in a rule whose action is not Allow.
    #[error("{field}: domainNames peers are only allowed in Allow rules")]
    DomainNamesNotAllow {
        /// The rule.
        field: String,
    },
    /// A `BaselineAdminNetworkPolicy` not named `default`.
    #[error(
        "BaselineAdminNetworkPolicy {name:?}: only one baseline admin network policy, with \
         metadata.name=\"default\", can exist in the cluster"
    )]
    BaselineName {
        /// The name given.
        name: String,
    },
}
