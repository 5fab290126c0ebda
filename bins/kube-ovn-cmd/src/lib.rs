//! What the kubeovn-rs binaries (`kube-ovn-controller`, `kube-ovn-daemon`, `kube-ovn-monitor`,
//! `kube-ovn-pinger`, `kube-ovn-bench`) share, so that each `main.rs` only parses its flags and composes
//! the libraries:
//!
//! - [`log`]: the `--log-level` and `--log-format json|text` flags ([`log::LogArgs`], flattened into each
//!   binary's clap parser) and the one `tracing-subscriber` set-up, with per-module filters from `RUST_LOG`;
//! - [`metrics`]: the Prometheus `/metrics` endpoint;
//! - [`shutdown_signal`]: SIGTERM or SIGINT, the end of a long-running binary.
//!
//! ```no_run
//! use clap::Parser;
//!
//! #[derive(Parser)]
//! struct Args {
//!     /// Northbound remote.
//!     #[arg(long = "ovn-nb-addr", default_value = "tcp:127.0.0.1:6641")]
//!     nb: String,
//!     #[command(flatten)]
//!     log: kube_ovn_cmd::log::LogArgs,
//! }
//!
//! let args = Args::parse();
//! args.log.init();
//! tracing::info!(nb = %args.nb, "starting");
//! ```
//!
//! The CNI plugins (`kube-ovn`, the shim kubelet execs per pod, and `kube-ovn-ipam`) do not use it: they
//! take their input from the environment and stdin and stay lean.

pub mod log;
pub mod metrics;

/// Resolves at the first SIGTERM or SIGINT (Ctrl-C); never when no handler could be installed.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install the SIGTERM/SIGINT handlers: stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
