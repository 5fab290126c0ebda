//! `kube-ovn-testapi --listen 127.0.0.1:PORT --kubeconfig FILE`: serves the in-memory Kubernetes API
//! on that address, writes a kubeconfig for it to FILE and runs until SIGTERM (or Ctrl-C).
//! `--service-cluster-ip-range CIDR[,CIDR]` sets where Services' ClusterIPs come from
//! (kube-apiserver's flag; default 10.96.0.0/12), `--service-node-port-range FIRST-LAST` their node
//! ports (default 30000-32767).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use kubeovn_testapi::{Config, TestApiServer};

const USAGE: &str = "usage: kube-ovn-testapi --listen 127.0.0.1:PORT [--kubeconfig FILE] \
                     [--service-cluster-ip-range CIDR[,CIDR]] [--service-node-port-range FIRST-LAST]";

fn parse_args() -> Result<(Config, Option<PathBuf>), String> {
    let mut config = Config::default();
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
                config.listen = value()?
                    .parse::<SocketAddr>()
                    .map_err(|e| format!("--listen: {e}"))?
            }
            "--kubeconfig" => kubeconfig = Some(PathBuf::from(value()?)),
            "--service-cluster-ip-range" => config.service_cluster_ip_range = value()?,
            "--service-node-port-range" => config.service_node_port_range = value()?,
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok((config, kubeconfig))
}

fn main() -> ExitCode {
    let (config, kubeconfig) = match parse_args() {
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
        let server = match TestApiServer::start(config).await {
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
