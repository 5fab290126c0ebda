//! `kube-ovn-testapi --listen 127.0.0.1:PORT --kubeconfig FILE`: serves the in-memory Kubernetes API
//! on that address, writes a kubeconfig for it to FILE and runs until SIGTERM (or Ctrl-C).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use kube_ovn_testapi::{Config, TestApiServer};

const USAGE: &str = "usage: kube-ovn-testapi --listen 127.0.0.1:PORT [--kubeconfig FILE]";

fn parse_args() -> Result<(SocketAddr, Option<PathBuf>), String> {
    let mut listen = None;
    let mut kubeconfig = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f.to_owned(), Some(v.to_owned())),
            None => (a.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--listen" => {
                listen = Some(
                    value()?
                        .parse::<SocketAddr>()
                        .map_err(|e| format!("--listen: {e}"))?,
                )
            }
            "--kubeconfig" => kubeconfig = Some(PathBuf::from(value()?)),
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok((
        listen.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
        kubeconfig,
    ))
}

fn main() -> ExitCode {
    let (listen, kubeconfig) = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kube-ovn-testapi: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        let server = match TestApiServer::start(Config {
            listen,
            ..Config::default()
        })
        .await
        {
            Ok(s) => s,
            Err(e) => {
                eprintln!("kube-ovn-testapi: {e}");
                return ExitCode::FAILURE;
            }
        };
        if let Some(path) = kubeconfig {
            if let Err(e) = server.write_kubeconfig(&path) {
                eprintln!("kube-ovn-testapi: {e}");
                return ExitCode::FAILURE;
            }
        }
        eprintln!("kube-ovn-testapi: serving on {}", server.url());
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("kube-ovn-testapi: installing the SIGTERM handler: {e}");
                    return ExitCode::FAILURE;
                }
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        server.shutdown().await;
        ExitCode::SUCCESS
    })
}
