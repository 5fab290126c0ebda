//! OVSDB client for OVN and Open vSwitch, written for kubeovn-rs.
//!
//! This crate speaks the OVSDB management protocol (RFC 7047 and the `monitor_cond`, `monitor_cond_since`
//! extensions of Open vSwitch) to `ovsdb-server`: the OVN northbound and southbound databases and the
//! `Open_vSwitch` database. It knows nothing of Kubernetes.
//!
//! The protocol logic is plain code without I/O: [`datum`] (atoms, sets, maps), [`schema`] (schema parsing and
//! datum validation), [`framing`] (splitting a byte stream of concatenated JSON texts into JSON-RPC messages),
//! [`ops`] (transaction builders validated against the schema, result parsing), [`monitor`] (monitor requests
//! and table updates, decoded by [`decode`] straight from the JSON text into rows, without a `Value` tree) and
//! [`conn`] (request/response matching, echo, notifications, inactivity probe, with
//! time passed in). [`client`] drives one connection with one tokio task.
//!
//! Above one connection: [`session`] reconnects over a list of remotes with exponential backoff and, for
//! clustered databases, can insist on the raft leader (read from `_Server`, left when it stops leading);
//! [`cache`] replicates tables and resumes after reconnects with `monitor_cond_since` (or rebuilds and emits the
//! difference); [`northbound`] and [`vswitch`] are idempotent, batchable, mockable APIs for `OVN_Northbound` and
//! `Open_vSwitch`; with the `mock` feature, `memdb` is an in-memory server for users' tests that runs them
//! unchanged. A transaction cut off by a dropped connection is an [`Error::OutcomeUnknown`], never reported as
//! committed or failed.
//!
//! Building and validating a transaction needs no server:
//!
//! ```
//! use kubeovn_ovn::{DatabaseSchema, Datum, ops::{Transaction, Operation, Condition}};
//!
//! let schema: DatabaseSchema = include_str!("../schemas/ovn-nb.ovsschema").parse().unwrap();
//! let txn = Transaction::new("OVN_Northbound")
//!     .op(Operation::insert("Logical_Switch_Port")
//!         .uuid_name("p")
//!         .value("name", "pod1.ns")
//!         .value("addresses", Datum::set(["0a:58:0a:10:00:05 10.16.0.5"])))
//!     .op(Operation::mutate("Logical_Switch")
//!         .filter(Condition::eq("name", "ls0"))
//!         .insert("ports", Datum::named_uuid("p")));
//! txn.validate(&schema).unwrap();
//!
//! // A column that does not exist is caught before anything is sent.
//! let bad = Transaction::new("OVN_Northbound")
//!     .op(Operation::insert("Logical_Switch").value("nmae", "ls0"));
//! assert!(bad.validate(&schema).is_err());
//! ```
//!
//! Talking to a server:
//!
//! ```no_run
//! # async fn demo() -> Result<(), kubeovn_ovn::Error> {
//! use kubeovn_ovn::{Client, ops::{Transaction, Operation}};
//!
//! let client = Client::connect("unix:/var/run/ovn/ovnnb_db.sock").await?;
//! println!("{:?}", client.list_dbs().await?);
//! let schema = client.get_schema("OVN_Northbound").await?;
//! let txn = Transaction::new("OVN_Northbound").op(Operation::insert("Logical_Switch").value("name", "ls0"));
//! txn.validate(&schema)?;
//! let results = client.transact(&txn).await?;
//! println!("new switch: {:?}", results[0].uuid());
//! # Ok(()) }
//! ```

pub mod cache;
// What a unit test does when it cannot run here (a failure under CI); shared with the test crates.
pub mod client;
pub mod conn;
pub mod datum;
pub mod decode;
pub mod error;
pub mod framing;
#[cfg(feature = "mock")]
pub mod memdb;
pub mod model;
pub mod models;
pub mod monitor;
pub mod northbound;
pub mod ops;
mod rowdiff;
pub mod schema;
pub mod session;
#[cfg(test)]
use kubeovn_test_support::skip;
#[cfg(feature = "ssl")]
pub mod tls;
pub mod uuid;
pub mod vswitch;

pub use client::{Client, Remote};
pub use datum::{Atom, AtomType, Datum};
pub use error::Error;
pub use model::Model;
pub use schema::{ColumnType, DatabaseSchema};
#[cfg(feature = "ssl")]
pub use tls::TlsConfig;
pub use uuid::Uuid;

/// Re-exported so that users of the raw JSON parts of the API use the same version.
pub use serde_json;
