//! The crate's error type.

use crate::spec::{CniError, ErrorCode, SUPPORTED_VERSIONS};

/// Everything that can go wrong while reading or producing CNI data; each maps to a spec error code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A `cniVersion` this crate does not know (code 1).
    #[error("incompatible CNI version {version:?}")]
    IncompatibleVersion {
        /// The version that was asked for.
        version: String,
    },
    /// A command used with a configuration whose version predates it (code 1).
    #[error(
        "CNI command {command} needs cniVersion {min} or later, the configuration says {version}"
    )]
    CommandNotInVersion {
        /// The command (`CHECK`, `GC`, `STATUS`).
        command: &'static str,
        /// The first spec version with that command.
        min: &'static str,
        /// The configuration's version.
        version: String,
    },
    /// A configuration field the plugin does not support (code 2).
    #[error("unsupported field in network configuration: {field} = {value}")]
    UnsupportedField {
        /// The field's name.
        field: String,
        /// Its value, as JSON.
        value: String,
    },
    /// Required `CNI_*` environment variables are missing (code 4).
    #[error("required environment variables missing for {command}: {}", vars.join(", "))]
    MissingEnv {
        /// The command (`CNI_COMMAND`), or "" when that is the missing one.
        command: String,
        /// The missing variables.
        vars: Vec<&'static str>,
    },
    /// A `CNI_*` environment variable has an invalid value (code 4).
    #[error("invalid environment variable {var}={value:?}: {reason}")]
    InvalidEnv {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Reading input failed (code 5).
    #[error("I/O failure: {what}")]
    Io {
        /// What was being read or written.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Input is not the JSON it should be (code 6).
    #[error("cannot decode {what}")]
    Decode {
        /// What was being decoded ("network configuration", "result", ...).
        what: &'static str,
        /// The JSON error (line and column).
        #[source]
        source: serde_json::Error,
    },
    /// The network configuration is well-formed JSON but not valid (code 7).
    #[error("invalid network configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// An error object reported by a plugin, passed through with its code.
    #[error("{0}")]
    Plugin(#[from] CniError),
    /// The kube-ovn daemon cannot be reached, or the connection broke (code 11, try again later).
    #[error("kube-ovn daemon at {} unavailable ({what})", socket.display())]
    DaemonUnavailable {
        /// The daemon's socket.
        socket: std::path::PathBuf,
        /// The step that failed (`connect`, `send`, `answer`).
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The kube-ovn daemon did not answer in time (code 11, try again later).
    #[error("kube-ovn daemon at {} timed out after {after:?} ({what})", socket.display())]
    DaemonTimeout {
        /// The daemon's socket.
        socket: std::path::PathBuf,
        /// The step that timed out (`connect`, `send`, `answer`).
        what: &'static str,
        /// The bound that was exceeded.
        after: std::time::Duration,
    },
    /// The kube-ovn daemon's answer is not a valid response (code 121).
    #[error("invalid response from the kube-ovn daemon: {reason}")]
    DaemonResponse {
        /// What is wrong.
        reason: String,
    },
    /// The pod's network data could not be had (code 11 while the controller has not published it, 126
    /// when it is malformed).
    #[cfg(feature = "node")]
    #[error(transparent)]
    PodNetwork(#[from] crate::node::SourceError),
    /// A netlink operation on the node failed (code 124).
    #[cfg(feature = "node")]
    #[error("{what}: {source}")]
    Netdev {
        /// The step that failed.
        what: &'static str,
        /// The netlink error.
        #[source]
        source: Box<kubeovn_netdev::Error>,
    },
    /// The Open_vSwitch database refused a change or did not answer (code 123).
    #[cfg(feature = "node")]
    #[error("{what}: {source}")]
    Ovs {
        /// The step that failed.
        what: &'static str,
        /// The OVSDB error.
        #[source]
        source: Box<kubeovn_ovn::Error>,
    },
    /// ovn-controller did not mark the interface `ovn-installed` in time (code 11).
    #[cfg(feature = "node")]
    #[error("interface {iface} not ovn-installed: {source}")]
    OvnNotInstalled {
        /// The host interface.
        iface: String,
        /// The wait's error.
        #[source]
        source: Box<kubeovn_ovn::Error>,
    },
}

impl Error {
    /// The spec error code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::IncompatibleVersion { .. } | Error::CommandNotInVersion { .. } => {
                ErrorCode::INCOMPATIBLE_VERSION
            }
            Error::UnsupportedField { .. } => ErrorCode::UNSUPPORTED_FIELD,
            Error::MissingEnv { .. } | Error::InvalidEnv { .. } => ErrorCode::INVALID_ENVIRONMENT,
            Error::Io { .. } => ErrorCode::IO_FAILURE,
            Error::Decode { .. } => ErrorCode::DECODING_FAILURE,
            Error::InvalidConfig { .. } => ErrorCode::INVALID_NETWORK_CONFIG,
            Error::Plugin(e) => e.code,
            Error::DaemonUnavailable { .. } | Error::DaemonTimeout { .. } => {
                ErrorCode::TRY_AGAIN_LATER
            }
            Error::DaemonResponse { .. } => crate::daemon::CODE_BAD_RESPONSE,
            #[cfg(feature = "node")]
            Error::PodNetwork(crate::node::SourceError::Invalid { .. }) => {
                crate::node::CODE_BAD_POD_NETWORK
            }
            #[cfg(feature = "node")]
            Error::PodNetwork(_) | Error::OvnNotInstalled { .. } => ErrorCode::TRY_AGAIN_LATER,
            #[cfg(feature = "node")]
            Error::Netdev { source, .. } => match **source {
                kubeovn_netdev::Error::InvalidName { .. }
                | kubeovn_netdev::Error::InvalidContainerId { .. } => {
                    ErrorCode::INVALID_ENVIRONMENT
                }
                _ => crate::node::CODE_NETDEV,
            },
            #[cfg(feature = "node")]
            Error::Ovs { .. } => crate::node::CODE_OVS,
        }
    }

    /// The spec's error object for this error, for a runtime speaking `cni_version`.
    pub fn to_cni(&self, cni_version: &str) -> CniError {
        let details = match self {
            Error::IncompatibleVersion { .. } => {
                format!("supported versions: {}", SUPPORTED_VERSIONS.join(", "))
            }
            Error::Io { source, .. } => source.to_string(),
            Error::Decode { source, .. } => source.to_string(),
            Error::DaemonUnavailable { source, .. } => source.to_string(),
            Error::Plugin(e) => {
                return CniError {
                    cni_version: cni_version.to_owned(),
                    ..e.clone()
                }
            }
            _ => String::new(),
        };
        CniError::new(self.code(), self.to_string(), details).with_version(cni_version)
    }
}
