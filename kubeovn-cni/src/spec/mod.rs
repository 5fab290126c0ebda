//! CNI specification 1.0.0 / 1.1.0 types, without I/O.
//!
//! - [`NetConf`], [`NetConfList`], [`NetworkConfig`]: what a plugin reads on stdin and what a runtime loads
//!   from disk; plugin-specific fields are kept (`extra`), `ipam` stays raw JSON for the IPAM plugin.
//! - [`Env`], [`Command`]: the `CNI_*` environment, validated per command.
//! - [`CniResult`]: results of every spec version, parsed into one form and converted on request.
//! - [`CniError`], [`ErrorCode`]: the spec's error object and its well-known codes.
//! - [`Version`], [`VersionInfo`]: supported versions and the `VERSION` answer.

mod cidr;
mod config;
mod env;
mod error;
mod result;
mod version;

pub use cidr::IpCidr;
pub use config::{
    Args, Attachment, CniArgs, Dns, NetConf, NetConfList, NetworkConfig, RuntimeConfig,
};
pub use env::{parse_cni_args, Command, Env};
pub use error::{CniError, ErrorCode};
pub use result::{CniResult, Interface, IpConfig, Route};
pub use version::{Version, VersionInfo, SUPPORTED_VERSIONS};
