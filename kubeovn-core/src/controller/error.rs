//! The controller's errors.

use std::sync::Arc;

/// Why a controller step failed. Handlers return it; the work queue retries with backoff.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ControllerError {
    /// A Kubernetes API call failed.
    #[error("kubernetes {action}: {source}")]
    Kube {
        /// What was being done ("patch pod ns/name", ...).
        action: String,
        /// The client's error.
        #[source]
        source: Arc<kube::Error>,
    },
    /// A northbound transaction failed.
    #[error("northbound: {0}")]
    Nb(#[source] Arc<kubeovn_ovn::Error>),
    /// The address allocator refused.
    #[error("ipam: {0}")]
    Ipam(#[from] kubeovn_ipam::IpamError),
    /// An object's annotation or spec is not usable (reported as a Warning event, not retried).
    #[error("{object}: {reason}")]
    Invalid {
        /// The object ("pod ns/name", "subnet x").
        object: String,
        /// Why.
        reason: String,
    },
    /// Something the handler needs is not there yet (retried).
    #[error("{0} is not ready")]
    NotReady(String),
    /// The controller is stopping.
    #[error("the controller is stopping")]
    Stopped,
    /// This instance no longer holds the leader lease (another candidate took it, or renewals failed for a
    /// whole lease duration): it stops, and a restart campaigns again.
    #[error("leadership lost: lease {lease} is no longer held by {identity}")]
    LeadershipLost {
        /// The Lease, `namespace/name`.
        lease: String,
        /// This instance's identity in it.
        identity: String,
    },
}

impl ControllerError {
    /// Wraps a kube error with what was being done.
    pub fn kube(action: impl Into<String>, e: kube::Error) -> Self {
        ControllerError::Kube {
            action: action.into(),
            source: Arc::new(e),
        }
    }
    /// An invalid-input error.
    pub fn invalid(object: impl Into<String>, reason: impl Into<String>) -> Self {
        ControllerError::Invalid {
            object: object.into(),
            reason: reason.into(),
        }
    }
    /// Whether the northbound connection failed: the change may or may not be in. Retrying is safe, since
    /// the next commit is planned against a replica resumed on a newer connection.
    pub fn is_nb_connection_error(&self) -> bool {
        matches!(self, ControllerError::Nb(e) if e.is_connection_error())
    }
    /// Whether retrying cannot help (bad input waits for the object to change).
    pub fn is_permanent(&self) -> bool {
        matches!(self, ControllerError::Invalid { .. })
            || matches!(self, ControllerError::Ipam(e) if !is_transient_ipam(e))
    }
}

fn is_transient_ipam(e: &kubeovn_ipam::IpamError) -> bool {
    // A missing subnet may appear once its Subnet is handled; exhaustion may end when pods go away.
    matches!(
        e,
        kubeovn_ipam::IpamError::NoSuchSubnet { .. } | kubeovn_ipam::IpamError::NoAvailable { .. }
    )
}

/// The retry delay after a lost northbound connection. Not the queue's growing backoff: each attempt already
/// waits for the northbound (the session reconnects with its own backoff, a commit waits for the replica),
/// so a long outage must not leave keys minutes away once it ends.
pub const NB_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

impl super::framework::ReconcileError for ControllerError {
    fn failure(&self) -> super::framework::Failure {
        use super::framework::Failure;
        if self.is_nb_connection_error() {
            Failure::RetryAfter(NB_RETRY)
        } else if self.is_permanent() {
            Failure::Permanent
        } else {
            Failure::Transient
        }
    }
}

impl From<kubeovn_ovn::Error> for ControllerError {
    fn from(e: kubeovn_ovn::Error) -> Self {
        ControllerError::Nb(Arc::new(e))
    }
}

/// Result of controller steps.
pub type Result<T, E = ControllerError> = std::result::Result<T, E>;
