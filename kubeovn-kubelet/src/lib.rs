//! A process kubelet: the node agent of kube-ovn-sandbox, usable on its own in tests of a CNI plugin.
//!
//! [`kubelet::Kubelet`] registers a Node, schedules the pods that name no node (when it is the scheduling
//! node), and for each of its pods makes a network namespace (the pod sandbox) and runs CNI `ADD` through a
//! conflist exactly as a container runtime would ([`cni::CniRuntime`], a libcni-style runner); each
//! container's `command` and `args` run as host processes in that namespace ([`containers`]: monitors,
//! restarts per `restartPolicy`, readiness probes, logs), and the pod's status is patched as a kubelet does.
//! [`exec`] enters a pod's namespace as `kubectl exec` would. What it records on disk (the pod sandboxes, their
//! containers' processes) is kubeovn-sandbox-state's format, so `down`, kubectl-ko and the pinger read it
//! without this crate.
//!
//! Imports go one way: `kubelet` uses `containers` and `cni`; `exec`, `containers` and `cni` use only the
//! state crate.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kubeovn_kubelet::SandboxError> {
//! use kubeovn_kubelet::kubelet::Kubelet;
//! use kubeovn_sandbox_state::state::StateDir;
//!
//! // DIR/sandbox.json names the node; DIR/kubeconfig, DIR/cni/{bin,net.d} hold the API and the CNI plugins.
//! let kubelet = Kubelet::new(StateDir::new("/var/lib/kube-ovn-sandbox")).await?;
//! kubelet.run(std::future::pending::<()>()).await?;
//! # Ok(()) }
//! ```

pub mod cni;
pub mod containers;
pub mod exec;
pub mod kubelet;

pub use kubeovn_sandbox_state::SandboxError;
