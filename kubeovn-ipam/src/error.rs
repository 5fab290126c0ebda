//! The crate's error type.

use std::net::IpAddr;

use crate::Family;

/// Everything that can go wrong in the IPAM. Bad input returns one of these and leaves the state unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    /// A CIDR string did not parse, or named a family twice.
    #[error("invalid CIDR {cidr:?}: {reason}")]
    InvalidCidr {
        /// The text given.
        cidr: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An IP address, range or CIDR item did not parse.
    #[error("invalid IP address or range {text:?}")]
    InvalidIp {
        /// The text given.
        text: String,
    },
    /// A MAC address did not parse.
    #[error("invalid MAC address {text:?}")]
    InvalidMac {
        /// The text given.
        text: String,
    },
    /// A pod or nic name is empty, too long or contains a NUL byte.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The subnet has no CIDR of the requested family.
    #[error("subnet {subnet} has no {family} CIDR")]
    InvalidFamily {
        /// The subnet.
        subnet: String,
        /// The family asked for.
        family: Family,
    },
    /// A request that contradicts itself (two static IPs of one family, a static IP of a family excluded by
    /// the family filter).
    #[error("invalid request for {pod}/{nic} in subnet {subnet}: {reason}")]
    InvalidRequest {
        /// The subnet.
        subnet: String,
        /// The pod.
        pod: String,
        /// The nic.
        nic: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The address is outside the subnet's usable range (network and broadcast addresses included).
    #[error("{ip} is out of the usable range of subnet {subnet}")]
    OutOfRange {
        /// The subnet.
        subnet: String,
        /// The address.
        ip: IpAddr,
    },
    /// The address is the subnet's gateway, which is never handed out.
    #[error("{ip} is the gateway of subnet {subnet}")]
    Gateway {
        /// The subnet.
        subnet: String,
        /// The address.
        ip: IpAddr,
    },
    /// The IP or MAC address belongs to another owner.
    #[error("{address} in subnet {subnet} is already used by {owner}")]
    Conflict {
        /// The subnet.
        subnet: String,
        /// The IP or MAC address in conflict.
        address: String,
        /// The current owner, `pod/nic` (or `gateway`).
        owner: String,
    },
    /// No free address is left (in the pool, if one was named).
    #[error("no available {family} address in subnet {subnet}{}", pool_suffix(.pool))]
    NoAvailable {
        /// The subnet.
        subnet: String,
        /// The pool, if one was named.
        pool: Option<String>,
        /// The family.
        family: Family,
    },
    /// The subnet does not exist.
    #[error("no such subnet {subnet}")]
    NoSuchSubnet {
        /// The subnet.
        subnet: String,
    },
    /// The pool does not exist in the subnet.
    #[error("no such pool {pool} in subnet {subnet}")]
    NoSuchPool {
        /// The subnet.
        subnet: String,
        /// The pool.
        pool: String,
    },
    /// A pool shares addresses with another pool of the subnet.
    #[error("pool {pool} overlaps pool {other} in subnet {subnet}")]
    OverlappingPools {
        /// The subnet.
        subnet: String,
        /// The pool being added.
        pool: String,
        /// The pool it overlaps.
        other: String,
    },
}

fn pool_suffix(pool: &Option<String>) -> String {
    pool.as_ref()
        .map(|p| format!(" pool {p}"))
        .unwrap_or_default()
}

/// The crate's result type.
pub type Result<T, E = IpamError> = std::result::Result<T, E>;
