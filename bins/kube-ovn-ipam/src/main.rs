//! `kube-ovn-ipam`: a CNI IPAM plugin with Kube-OVN's allocation rules, a drop-in for `host-local`.
//!
//! A main plugin (bridge, ptp, macvlan, ...) delegates to it with `"ipam": {"type": "kube-ovn-ipam", ...}`:
//!
//! ```json
//! {"type": "kube-ovn-ipam", "subnet": "10.88.0.0/16,fd00:88::/112", "gateway": "10.88.0.1,fd00:88::1",
//!  "excludeIps": ["10.88.0.2..10.88.0.10"], "routes": [{"dst": "0.0.0.0/0"}],
//!  "dataDir": "/var/lib/cni/kube-ovn-ipam", "fsync": false}
//! ```
//!
//! - Allocation is `kubeovn-ipam`'s: next free address with delayed reuse of released ones, excluded
//!   addresses, the gateway (default: the subnet's first usable address) never handed out, dual stack.
//! - Commands: `ADD` (idempotent per container id and interface), `DEL` (idempotent; unknown containers are
//!   fine), `CHECK`, `VERSION`, and for 1.1.0 `GC` (releases every attachment not in
//!   `cni.dev/valid-attachments`) and `STATUS` (code 50 when a family has no free address left).
//! - Static addresses: `runtimeConfig.ips`, `args.cni.ips`, `CNI_ARGS` `IP=a[,b]`.
//! - State: `dataDir/<network>/`: `state` (`kubeovn-ipam`'s subnet snapshot, one line per allocation,
//!   replaced atomically: temporary file, rename) and `journal` (one line per allocation or release since,
//!   appended in one write), behind an flock on `lock`. Each call reads both, appends one line; every 64
//!   changes the journal is folded into a new state. A new attachment's `ADD` (and a `DEL`) does not
//!   rebuild the allocator: the state's first line keeps the free and released address sets, the journal
//!   says what changed since, and one pass over the allocation lines finds the few entries that matter.
//! - Durability: `"fsync": false` (the default) does not wait for the disk, like `host-local`: a crash or
//!   kill of the plugin at any point still leaves a consistent state (the rename is atomic, a torn last
//!   journal line is ignored and cut off), but a power loss or kernel crash may lose the latest changes,
//!   and after one every container is re-created anyway. `"fsync": true` fdatasyncs each journal append,
//!   and the temporary state file before its rename and the directory after it, before answering (a few
//!   ms per call on most disks).
//! - Errors: the spec's error object on stdout and exit status 1; codes 1-7 as the spec defines them, and
//!   100 (no free address), 101 (requested static address unavailable: used, gateway, out of range),
//!   102 (`CHECK` found no or another allocation), 50 (`STATUS`: not available).

mod conf;
mod plugin;
mod state;
mod store;

use std::io::{Read, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use kubeovn_cni::spec::{CniError, ErrorCode, Version};
use kubeovn_ipam::IpamError;

/// Plugin-specific error code: no free address is left.
pub const CODE_EXHAUSTED: ErrorCode = ErrorCode(100);
/// Plugin-specific error code: a requested static address is in use, the gateway or outside the subnet.
pub const CODE_STATIC_UNAVAILABLE: ErrorCode = ErrorCode(101);
/// Plugin-specific error code: `CHECK` found no allocation, or another one than `prevResult` lists.
pub const CODE_CHECK_FAILED: ErrorCode = ErrorCode(102);

/// What the allocator refused, and for whom.
#[derive(Debug)]
pub struct IpamFailure {
    /// `allocate`, `create`, ...
    pub op: &'static str,
    /// The network.
    pub network: String,
    /// The container.
    pub container: String,
    /// The interface.
    pub ifname: String,
    /// The allocator's error.
    pub source: IpamError,
}

impl Error {
    /// An allocator error with its context.
    pub fn ipam(
        op: &'static str,
        network: &str,
        container: &str,
        ifname: &str,
        source: IpamError,
    ) -> Error {
        Error::Ipam(Box::new(IpamFailure {
            op,
            network: network.to_owned(),
            container: container.to_owned(),
            ifname: ifname.to_owned(),
            source,
        }))
    }
}

/// Everything the plugin can fail with; each maps to a CNI error code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Environment, configuration JSON or version (codes 1, 4, 6, 7).
    #[error(transparent)]
    Spec(#[from] kubeovn_cni::Error),
    /// The `ipam` section is invalid (code 7).
    #[error("invalid ipam configuration: {reason}")]
    Config {
        /// What is wrong.
        reason: String,
    },
    /// The allocator refused (code 100, 101 or 7).
    #[error("{} {}/{} in network {}", .0.op, .0.container, .0.ifname, .0.network)]
    Ipam(Box<IpamFailure>),
    /// The state could not be read or written (code 5).
    #[error("cannot {what} {}", path.display())]
    Io {
        /// The operation.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The state file is not a valid snapshot (code 5).
    #[error("corrupt state file {}", path.display())]
    State {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// `CHECK` failed (code 102).
    #[error("CHECK {container}/{ifname}: {reason}")]
    Check {
        /// The container.
        container: String,
        /// The interface.
        ifname: String,
        /// What does not match.
        reason: String,
    },
    /// `STATUS`: the plugin cannot serve `ADD` (code 50).
    #[error("not available: {reason}")]
    NotAvailable {
        /// Why.
        reason: String,
    },
}

impl Error {
    /// The CNI error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Spec(e) => e.code(),
            Error::Config { .. } => ErrorCode::INVALID_NETWORK_CONFIG,
            Error::Ipam(f) => match f.source {
                IpamError::NoAvailable { .. } => CODE_EXHAUSTED,
                IpamError::Conflict { .. }
                | IpamError::Gateway { .. }
                | IpamError::OutOfRange { .. } => CODE_STATIC_UNAVAILABLE,
                _ => ErrorCode::INVALID_NETWORK_CONFIG,
            },
            Error::Io { .. } | Error::State { .. } => ErrorCode::IO_FAILURE,
            Error::Check { .. } => CODE_CHECK_FAILED,
            Error::NotAvailable { .. } => ErrorCode::NOT_AVAILABLE,
        }
    }

    /// The spec's error object, for a runtime speaking `version`.
    pub fn to_cni(&self, version: &str) -> CniError {
        if let Error::Spec(e) = self {
            return e.to_cni(version);
        }
        let details = std::error::Error::source(self)
            .map(|s| s.to_string())
            .unwrap_or_default();
        CniError::new(self.code(), self.to_string(), details).with_version(version)
    }
}

/// The version to answer errors in: the input's `cniVersion` when it is one we know.
fn input_version(stdin: &[u8]) -> &'static str {
    #[derive(serde::Deserialize)]
    struct Peek {
        #[serde(rename = "cniVersion", default)]
        cni_version: String,
    }
    serde_json::from_slice::<Peek>(stdin)
        .ok()
        .and_then(|p| Version::parse(&p.cni_version).ok())
        .unwrap_or(Version::LATEST)
        .as_str()
}

fn main() -> ExitCode {
    let mut stdin = Vec::new();
    let read = std::io::stdin().lock().read_to_end(&mut stdin);
    let outcome = match read {
        Ok(_) => plugin::run(&stdin),
        Err(source) => Err(Error::Spec(kubeovn_cni::Error::Io {
            what: "reading stdin",
            source,
        })),
    };
    let mut out = std::io::stdout().lock();
    match outcome {
        Ok(text) => {
            if let Some(text) = text {
                // A runtime that closed its pipe gets nothing either way.
                let _ = writeln!(out, "{text}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            let cni = e.to_cni(input_version(&stdin));
            let _ = writeln!(out, "{}", cni.to_json());
            let _ = writeln!(
                std::io::stderr(),
                "kube-ovn-ipam: {} ({})",
                cni.msg,
                cni.details
            );
            ExitCode::FAILURE
        }
    }
}

/// The addresses a result lists, for `CHECK`.
fn result_ips(r: &kubeovn_cni::spec::CniResult) -> Vec<IpAddr> {
    r.ips.iter().map(|i| i.address.addr).collect()
}
