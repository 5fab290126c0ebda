//! Container Network Interface (CNI) support for kubeovn-rs.
//!
//! [`spec`] holds the CNI specification 1.0.0 and 1.1.0 as plain Rust types: network configurations and
//! configuration lists, the runtime's environment, results of every spec version (and conversion between
//! them), version negotiation and the spec's error object. It does no I/O apart from
//! [`spec::Env::from_process`], which reads the process environment.
//!
//! [`daemon`] is the protocol between the CNI shim (`/opt/cni/bin/kube-ovn`) and the node daemon: the
//! request and response types, their HTTP paths over the daemon's unix socket, and a small blocking
//! client with bounded timeouts.
//!
//! `node` (feature `node`) is the node daemon as a library: `node::Daemon` composes node start, the join
//! port and its routes (watches on the Node and the Subnets), the Kubernetes pod source, the server half of
//! the protocol with its metrics, and the handlers (`ADD`, `DEL`, `CHECK`, `STATUS` and `GC`) over the
//! Open_vSwitch database, netlink and pod-network-source traits. Like a library should, it leaves the
//! Kubernetes API version (k8s-openapi's `v1_*` feature) to the binary that embeds it.
//!
//! ```
//! use kubeovn_cni::spec::{CniResult, NetConf};
//!
//! let conf = NetConf::from_slice(br#"{"cniVersion":"1.0.0","name":"net","type":"bridge",
//!     "ipam":{"type":"kube-ovn-ipam","subnet":"10.88.0.0/16"}}"#)?;
//! assert_eq!(conf.ipam.as_ref().and_then(|i| i["subnet"].as_str()), Some("10.88.0.0/16"));
//!
//! // A 1.0.0 result, converted for a runtime that asked for 0.3.1.
//! let result = CniResult::from_slice(br#"{"cniVersion":"1.0.0","ips":[{"address":"10.88.0.5/16"}]}"#)?;
//! let old = result.convert("0.3.1")?;
//! assert_eq!(old.to_json_value()["ips"][0]["version"], "4");
//! # Ok::<(), kubeovn_cni::Error>(())
//! ```

pub mod daemon;
#[cfg(feature = "node")]
pub mod node;
pub mod spec;

mod error;

pub use error::Error;
