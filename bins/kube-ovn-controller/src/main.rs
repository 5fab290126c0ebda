//! `kube-ovn-controller`: see the library's docs and `--help`.

use std::process::ExitCode;

use kube_ovn_controller::{Args, Command, StderrLog};

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if args.command == Command::Crd {
        print!("{}", kubeovn_core::crd::crds_yaml());
        return ExitCode::SUCCESS;
    }
    StderrLog::install(args.log_level);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let shutdown = async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    match rt.block_on(kube_ovn_controller::run(args, shutdown)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kube-ovn-controller: {e}");
            ExitCode::FAILURE
        }
    }
}
