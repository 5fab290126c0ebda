//! What kubeovn-rs's tests share, as a dev-dependency of every crate that has such tests.
//!
//! - [`skip`]: a test that cannot run here (not root, a program missing) says so and passes, or fails under CI
//!   (`CI=true`, as `.ci/run` sets it), where a skip would hide a broken setup.
//! - [`cargo_build`]: builds the workspace binaries a test runs when the `cargo test` running it did not.
//! - [`ovsdb`]: private ovsdb-servers (standalone or a raft cluster) and ovs-vswitchd in temporary directories,
//!   killed by pid when dropped.
//!
//! It depends on no workspace crate: a crate's own tests would otherwise see two copies of its types.
//!
//! ```no_run
//! use kubeovn_test_support::skip;
//!
//! fn needs_root() {
//!     if !skip::is_root() {
//!         skip::skip("needs root (network namespaces)");
//!         return;
//!     }
//!     // ...
//! }
//! ```

pub mod cargo_build;
pub mod ovsdb;
pub mod skip;

pub use cargo_build::cargo_build;
