//! A single-machine Kube-OVN, as a library: starts OVN/OVS, the test API server, our binaries, one process
//! kubelet per node and the cluster's EndpointSlice controller in one state directory, and stops them by pid.
//! The `kube-ovn-sandbox` binary (`up`, `down`, `status`, `exec`, `logs`, `kill-leader`) is a thin CLI over it.
//!
//! The parts (each usable alone; this crate re-exports them under their old module names):
//! - kubeovn-sandbox-state: the state directory's layout ([`state`]), the processes started ([`procs`]), the
//!   kubelet's pod records ([`records`]), TCP/UDP checks between namespaces ([`transport`]);
//! - kubeovn-ovn-stack: a single-node OVN in a directory ([`ovn`]), CPU cgroups ([`cgroup`]);
//! - kubeovn-kubelet: the process kubelet ([`kubelet`], [`containers`], [`exec`]) and the CNI runner ([`cni`]).
//!
//! Here: [`sandbox`] brings everything up and down; [`cluster`] wires nodes beyond the first (their own network
//! namespaces, Geneve over an underlay bridge, an external network); [`report`] prints the pods, a ping matrix,
//! a TCP and UDP one and the demo Service's answers; [`endpoints`] is the EndpointSlice controller, one per
//! cluster as kube-controller-manager's (`kube-ovn-sandbox endpoints`, started once by `up`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), kubeovn_sandbox::SandboxError> {
//! use kubeovn_sandbox::sandbox::{self, UpOptions};
//! use kubeovn_sandbox::state::StateDir;
//!
//! let dir = StateDir::new("/tmp/sbx");
//! let reach = sandbox::up(&dir, &UpOptions::default()).await?;
//! assert!(reach.all_ok());
//! sandbox::down(&dir)?;
//! # Ok(()) }
//! ```

pub mod cluster;
pub mod endpoints;
pub mod report;
pub mod sandbox;

pub use kubeovn_kubelet::{cni, containers, exec, kubelet};
pub use kubeovn_ovn_stack::{block_on_thread, cgroup, ovn};
pub use kubeovn_sandbox_state::{procs, records, state, transport, SandboxError};
