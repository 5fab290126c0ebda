//! `kube-ovn-testapi --listen 127.0.0.1:PORT --kubeconfig FILE`: serves kubeovn-testapi's in-memory
//! Kubernetes API on that address, writes a kubeconfig for it to FILE and runs until SIGTERM (or
//! Ctrl-C). `--service-cluster-ip-range CIDR[,CIDR]` sets where Services' ClusterIPs come from
//! (kube-apiserver's flag; default 10.96.0.0/12), `--service-node-port-range FIRST-LAST` their node
//! ports (default 30000-32767). Logs as the other binaries (kube-ovn-cmd): stderr, text or
//! `--log-format json`, `--log-level`, `RUST_LOG` per module.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use kubeovn_testapi::{Config, TestApiServer};

/// In-memory Kubernetes API server for tests and debugging (kubectl and kube-rs clients accept it).
#[derive(Debug, Parser)]
#[command(name = "kube-ovn-testapi", version)]
struct Args {
    /// Address to listen on (port 0 picks a free one)
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Where to write a kubeconfig for the server
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Where Services' ClusterIPs come from: a CIDR, or an IPv4 and an IPv6 CIDR for dual stack
    #[arg(long, value_name = "CIDR[,CIDR]", default_value = "10.96.0.0/12")]
    service_cluster_ip_range: String,
    /// Where NodePort Services' node ports come from
    #[arg(long, value_name = "FIRST-LAST", default_value = "30000-32767")]
    service_node_port_range: String,
    #[command(flatten)]
    log: kube_ovn_cmd::log::LogArgs,
}

async fn serve(args: Args) -> Result<(), String> {
    let config = Config {
        listen: args.listen,
        service_cluster_ip_range: args.service_cluster_ip_range,
        service_node_port_range: args.service_node_port_range,
        ..Config::default()
    };
    let server = TestApiServer::start(config)
        .await
        .map_err(|e| e.to_string())?;
    if let Some(path) = &args.kubeconfig {
        server.write_kubeconfig(path).map_err(|e| e.to_string())?;
    }
    tracing::info!(url = %server.url(), "serving");
    kube_ovn_cmd::shutdown_signal().await;
    tracing::info!("stopping");
    server.shutdown().await;
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    args.log.init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_keep_their_names_and_forms() {
        let a = Args::try_parse_from([
            "kube-ovn-testapi",
            "--listen=127.0.0.1:6443",
            "--kubeconfig",
            "/tmp/kc",
            "--service-cluster-ip-range=10.96.0.0/12,fd00:96::/108",
            "--service-node-port-range",
            "31000-31999",
            "--log-format=json",
        ])
        .expect("flags");
        assert_eq!(a.listen, "127.0.0.1:6443".parse().expect("addr"));
        assert_eq!(a.kubeconfig, Some(PathBuf::from("/tmp/kc")));
        assert_eq!(a.service_cluster_ip_range, "10.96.0.0/12,fd00:96::/108");
        assert_eq!(a.service_node_port_range, "31000-31999");
        assert_eq!(a.log.format, kube_ovn_cmd::log::LogFormat::Json);
        let d = Args::try_parse_from(["kube-ovn-testapi"]).expect("defaults");
        let c = Config::default();
        assert_eq!(d.listen, c.listen);
        assert_eq!(d.service_cluster_ip_range, c.service_cluster_ip_range);
        assert_eq!(d.service_node_port_range, c.service_node_port_range);
        assert_eq!(d.log, kube_ovn_cmd::log::LogArgs::default());
        assert!(Args::try_parse_from(["kube-ovn-testapi", "--listen", "nowhere"]).is_err());
    }
}
