//! An OVN test stack and the process helpers around it: [`ovn::OvnStack`] starts a single-node OVN (NB and SB
//! ovsdb-servers, ovn-northd, an Open_vSwitch ovsdb-server, ovs-vswitchd on the userspace datapath and
//! ovn-controller) in one directory, each process with its own sockets, and stops it by pid; [`cgroup`] gives
//! its parts CPU cgroups of their own, as on a node.
//!
//! The end-to-end tests of the daemon and the controller run on it, and so does kube-ovn-sandbox. It needs the
//! Debian packages `openvswitch-switch ovn-central ovn-host` ([`ovn::missing_programs`] says which is missing).
//!
//! ```no_run
//! # async fn demo() -> Result<(), kubeovn_ovn_stack::SandboxError> {
//! use kubeovn_ovn_stack::ovn::{OvnOptions, OvnStack};
//!
//! let stack = OvnStack::start(std::path::Path::new("/tmp/ovn-test"), OvnOptions::new("br-test")).await?;
//! println!("NB at {}, OVS at {}", stack.nb_remote(), stack.ovs_remote());
//! stack.stop();
//! # Ok(()) }
//! ```

pub mod cgroup;
pub mod ovn;

pub use kubeovn_sandbox_state::SandboxError;

/// Runs `f` to completion on a thread of its own with a runtime of its own: for cleanup that may be called
/// from inside a tokio runtime (a test's drop), where `block_on` would panic.
pub fn block_on_thread<F>(f: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let _ = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread().build() {
            rt.block_on(f);
        }
    })
    .join();
}
