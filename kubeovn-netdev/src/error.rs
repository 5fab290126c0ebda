//! The crate's one error type.

use std::io;

/// Everything that can go wrong in this crate. Variants name the link, the namespace and, for kernel failures, the
/// errno (see [`Error::errno`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An interface name is empty, longer than 15 bytes (`IFNAMSIZ - 1`) or holds `/`, whitespace or `:`.
    #[error("invalid interface name {name:?}: {reason}")]
    InvalidName {
        /// The name as given.
        name: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A container id is too short to derive Kube-OVN's interface names from.
    #[error("invalid container id {id:?}: {reason}")]
    InvalidContainerId {
        /// The id as given.
        id: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A network namespace name is empty, `.`/`..`, holds `/` or is too long.
    #[error("invalid network namespace name {name:?}")]
    InvalidNetnsName {
        /// The name as given.
        name: String,
    },
    /// A sysctl key is empty, absolute, or climbs out of `/proc/sys` with `..`.
    #[error("invalid sysctl key {key:?}")]
    InvalidSysctl {
        /// The key as given.
        key: String,
    },
    /// A route names neither a gateway nor a device, or mixes address families.
    #[error("invalid route {route}: {reason}")]
    InvalidRoute {
        /// The route, printed.
        route: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The link an operation needs does not exist.
    #[error("link {link:?} not found in netns {netns}")]
    LinkNotFound {
        /// The link's name.
        link: String,
        /// The namespace searched.
        netns: String,
    },
    /// The object exists with parameters other than the ones asked for, so "create" cannot succeed idempotently.
    #[error("{what} already exists in netns {netns} with other parameters: {detail}")]
    Conflict {
        /// What was being created (`link eth0`, `route 0.0.0.0/0`).
        what: String,
        /// The namespace.
        netns: String,
        /// What differs.
        detail: String,
    },
    /// The kernel refused a netlink request.
    #[error("netlink {op} {target} in netns {netns} failed (errno {errno:?}): {source}")]
    Netlink {
        /// The operation (`add link`, `del route`, ...).
        op: &'static str,
        /// Its object (a link name, an address, a route).
        target: String,
        /// The namespace.
        netns: String,
        /// The kernel's errno, positive (`libc::EEXIST` = 17), when the failure was a netlink NACK.
        errno: Option<i32>,
        /// rtnetlink's error.
        #[source]
        source: Box<rtnetlink::Error>,
    },
    /// A system call or file operation failed (setns, unshare, mount, open, /proc/sys I/O).
    #[error("{op} {target} (netns {netns}) failed: {source}")]
    Io {
        /// The operation (`setns`, `write sysctl`, ...).
        op: &'static str,
        /// Its object (a path, a key).
        target: String,
        /// The namespace.
        netns: String,
        /// The OS error; `raw_os_error()` is the errno.
        #[source]
        source: io::Error,
    },
    /// An nftables table name is empty, longer than 255 bytes or holds a NUL.
    #[error("invalid nftables table name {name:?}: {reason}")]
    InvalidTableName {
        /// The name as given.
        name: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The kernel refused an nftables batch; none of it was applied.
    #[error("nftables {op} in table {table} (netns {netns}) failed: {}", io::Error::from_raw_os_error(*.errno))]
    Nftables {
        /// What the refused message did (`add rule 2 of ip kube-ovn postrouting (ip saddr 10.16.0.0/16 ...)`).
        op: String,
        /// The table.
        table: String,
        /// The namespace.
        netns: String,
        /// The kernel's errno, positive.
        errno: i32,
    },
    /// The thread serving a namespace has stopped (it failed to start or its runtime died).
    #[error("the netlink worker thread for netns {netns} has stopped")]
    WorkerGone {
        /// The namespace it served.
        netns: String,
    },
}

impl Error {
    /// The kernel's errno behind this error, if there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Netlink { errno, .. } => *errno,
            Error::Io { source, .. } => source.raw_os_error(),
            Error::Nftables { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    pub(crate) fn netlink(
        op: &'static str,
        target: impl Into<String>,
        netns: &str,
        source: rtnetlink::Error,
    ) -> Self {
        Error::Netlink {
            op,
            target: target.into(),
            netns: netns.to_string(),
            errno: nl_errno(&source),
            source: Box::new(source),
        }
    }

    pub(crate) fn io(
        op: &'static str,
        target: impl Into<String>,
        netns: &str,
        source: io::Error,
    ) -> Self {
        Error::Io {
            op,
            target: target.into(),
            netns: netns.to_string(),
            source,
        }
    }
}

/// "No such device": a link that does not exist (netlink NACKs, ethtool's ioctl).
pub(crate) const ENODEV: i32 = 19;

/// The positive errno of a netlink NACK.
pub(crate) fn nl_errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
