//! A single-machine Kube-OVN: starts OVN/OVS, the test API server and our binaries in one state directory.
//!
//! The `kube-ovn-sandbox` binary (`up`, `down`, `status`, `exec`) is built from these modules:
//! [`sandbox`] starts and stops everything, each process in the background with its pid recorded in the
//! [`state`] directory ([`procs`]); [`kubelet`] is the node agent that gives every pod a network namespace
//! through our CNI shim ([`cni`] runs a conflist as a container runtime does); [`report`] prints the pods, a
//! ping matrix and a TCP and UDP one ([`transport`]); [`exec`] enters a pod's namespace. The kubelet's
//! process also keeps the EndpointSlices of Services with selectors ([`endpoints`]), as
//! kube-controller-manager does in a cluster.
//!
//! [`ovn`] starts a single-node OVN (NB, SB, ovn-northd, ovs-vswitchd on the userspace datapath,
//! ovn-controller) in a directory, each process with its own sockets, and stops it by pid; the end-to-end
//! tests of the daemon and the controller use it; [`cgroup`] can give its parts CPU cgroups of their own, as
//! on a node (the node benchmark does).
//!
//! ```no_run
//! # async fn demo() -> Result<(), kube_ovn_sandbox::SandboxError> {
//! let stack = kube_ovn_sandbox::ovn::OvnStack::start(
//!     std::path::Path::new("/tmp/sandbox"),
//!     kube_ovn_sandbox::ovn::OvnOptions::new("br-int"),
//! )
//! .await?;
//! println!("{}", stack.nb_remote());
//! # Ok(()) }
//! ```

pub mod cgroup;
pub mod cluster;
// What a unit test does when it cannot run here (a failure under CI); shared with the test crates.
pub mod cni;
pub mod containers;
pub mod endpoints;
pub mod exec;
pub mod kubelet;
pub mod ovn;
pub mod procs;
pub mod report;
pub mod sandbox;
#[cfg(test)]
#[path = "../../../test-support/skip.rs"]
mod skip;
pub mod state;
pub mod transport;

use std::path::{Path, PathBuf};

/// Why the sandbox could not start or run something.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// A program is not installed.
    #[error("{0} is not installed (apt-get install openvswitch-switch ovn-central ovn-host)")]
    Missing(&'static str),
    /// A file or process operation failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// The step.
        what: &'static str,
        /// The path or program.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A tool exited with an error.
    #[error("{what} failed: {detail}")]
    Failed {
        /// The tool.
        what: &'static str,
        /// Its stderr.
        detail: String,
    },
    /// A process exited early.
    #[error("{name} exited: {status}")]
    Exited {
        /// The process.
        name: &'static str,
        /// How it exited.
        status: String,
    },
    /// Something did not come up in time.
    #[error("timed out waiting for {what}\n{log}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The tail of the relevant log.
        log: String,
    },
    /// An OVSDB request failed.
    #[error("OVSDB: {0}")]
    Ovsdb(#[from] kubeovn_ovn::Error),
}

impl SandboxError {
    pub(crate) fn io(what: &'static str, path: &Path, source: std::io::Error) -> Self {
        SandboxError::Io {
            what,
            path: path.to_owned(),
            source,
        }
    }
}
