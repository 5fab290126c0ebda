//! The state directory of a kube-ovn-sandbox: what a running sandbox leaves on disk for the tools that read it
//! (`kube-ovn-sandbox down|status|exec|logs`, `kubectl ko`, `kube-ovn-pinger`, the monitor).
//!
//! Small on purpose (serde, nix, no Kubernetes client, no OVSDB): a tool reads a sandbox through it without
//! building the sandbox's stack. [`state`] is the layout (settings, sockets, logs, the nodes beyond the first),
//! [`records`] the pod sandboxes the kubelet made, [`procs`] the processes started and how to stop them by pid,
//! [`transport`] TCP and UDP checks between two network namespaces, [`matrix`] the pod table and the ping
//! matrix as text.
//!
//! ```no_run
//! use kubeovn_sandbox_state::{records, state::StateDir};
//!
//! let dir = StateDir::new("/var/lib/kube-ovn-sandbox");
//! let settings = dir.load_settings()?;
//! println!("NB at {}, {} node(s)", dir.nb_remote(), settings.nodes);
//! for pod in records::all_records(&dir) {
//!     println!("{}/{} in {} with {:?}", pod.namespace, pod.name, pod.netns.display(), pod.addresses());
//! }
//! # Ok::<(), kubeovn_sandbox_state::SandboxError>(())
//! ```

pub mod matrix;
pub mod procs;
pub mod records;
pub mod state;
pub mod transport;

pub use state::{member_stems, remotes, server_name, RAFT_MEMBERS};

use std::path::{Path, PathBuf};

/// Why the sandbox could not start, read or run something (shared by the sandbox's crates).
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
    Ovsdb(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl SandboxError {
    /// An I/O error of step `what` on `path`.
    pub fn io(what: &'static str, path: &Path, source: std::io::Error) -> Self {
        SandboxError::Io {
            what,
            path: path.to_owned(),
            source,
        }
    }

    /// An OVSDB client's error (kubeovn-ovn's, kept as the source).
    pub fn ovsdb(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        SandboxError::Ovsdb(Box::new(e))
    }
}
