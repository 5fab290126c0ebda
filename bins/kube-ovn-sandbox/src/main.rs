//! `kube-ovn-sandbox`: a whole Kube-OVN on this machine. See `--help`; the work is in the kubeovn-sandbox
//! library (and its parts: kubeovn-sandbox-state, kubeovn-ovn-stack, kubeovn-kubelet).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use kube_ovn_cmd::log::LogFormat;
use kubeovn_sandbox::sandbox::{self, UpOptions};
use kubeovn_sandbox::state::{Settings, StateDir, DEFAULT_STATE_DIR, STATE_DIR_ENV};

/// A whole Kube-OVN on this machine: OVN/OVS, an in-memory Kubernetes API server, kube-ovn-controller,
/// kube-ovn-daemon with the CNI shim, a process kubelet per node and the EndpointSlice controller, in one
/// state directory.
#[derive(Debug, Parser)]
#[command(name = "kube-ovn-sandbox", version)]
struct Cli {
    /// The state directory (sockets, logs, pids, pod records).
    #[arg(long, global = true, env = STATE_DIR_ENV, default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Level of kubeovn-rs' own modules (other crates log from warn up); RUST_LOG, when set, replaces this
    /// filter with per-module directives (e.g. RUST_LOG=info,kubeovn_kubelet=debug).
    #[arg(long, global = true, value_name = "LEVEL", default_value = "info",
          value_parser = ["error", "warn", "info", "debug", "trace"])]
    log_level: String,
    /// Log line format on stderr.
    #[arg(
        long,
        global = true,
        value_enum,
        value_name = "FORMAT",
        default_value_t
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start OVN/OVS, the API server, kube-ovn-controller, kube-ovn-daemon, a kubelet per node and the
    /// EndpointSlice controller; create a second subnet and demo pods; print their addresses, a ping matrix, a
    /// TCP/UDP matrix and the demo Service's answers.
    Up(Box<UpArgs>),
    /// Stop everything `up` started and remove its network namespaces and links.
    Down,
    /// The processes and the pods' sandboxes.
    Status,
    /// Run a command in a pod's network namespace: `exec NAMESPACE/POD -- COMMAND...`.
    Exec {
        /// The pod (`POD` alone is in `default`).
        #[arg(value_name = "NAMESPACE/POD")]
        pod: String,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Print a container's output (stdout and stderr, across restarts).
    Logs {
        /// The pod (`POD` alone is in `default`).
        #[arg(value_name = "NAMESPACE/POD")]
        pod: String,
        /// The container (needed when the pod has several).
        #[arg(short, long)]
        container: Option<String>,
    },
    /// (with `up --raft`) SIGKILL the raft leader of NB or SB, report how long the election took, then start
    /// the member again.
    KillLeader {
        /// The database.
        #[arg(value_parser = ["nb", "sb"])]
        db: String,
    },
    /// (started by `up`) The node agent of the node whose state directory is `--state-dir`.
    #[command(hide = true)]
    Kubelet,
    /// (started by `up`, once per cluster) The EndpointSlice controller, as kube-controller-manager's.
    #[command(hide = true)]
    Endpoints,
    /// (started by `up --raft`) Forwards NB and SB to their raft leaders for the tools that take one remote.
    #[command(hide = true)]
    LeaderProxy,
}

#[derive(Debug, Args)]
struct UpArgs {
    /// Where kube-ovn-testapi, kube-ovn-controller, kube-ovn-daemon and kube-ovn are (default: next to this
    /// program).
    #[arg(long, env = sandbox::BIN_DIR_ENV)]
    bin_dir: Option<PathBuf>,
    /// Do not apt-get install missing OVN/OVS packages.
    #[arg(long)]
    no_install: bool,
    /// No demo namespace, subnet and pods.
    #[arg(long)]
    no_demo: bool,
    /// The first node's name.
    #[arg(long, default_value = "sandbox")]
    node_name: String,
    /// The integration bridge.
    #[arg(long, default_value = "br-sbx")]
    bridge: String,
    /// The node's join interface.
    #[arg(long, default_value = "ovn0")]
    node_nic: String,
    /// The API server's port (another if taken).
    #[arg(long, default_value_t = 16443)]
    api_port: u16,
    /// The default subnet.
    #[arg(long, default_value = "10.16.0.0/16")]
    default_cidr: String,
    /// The join subnet.
    #[arg(long, default_value = "100.64.0.0/16")]
    join_cidr: String,
    /// The second subnet, bound to --demo-namespace.
    #[arg(long, default_value = "10.66.0.0/24")]
    demo_cidr: String,
    /// The namespace of the second subnet.
    #[arg(long, default_value = "demo")]
    demo_namespace: String,
    /// Demo pods per namespace.
    #[arg(long, default_value_t = 3)]
    demo_pods: usize,
    /// Prefix of the pods' network namespaces.
    #[arg(long, default_value = "sbx")]
    netns_prefix: String,
    /// Where Services' ClusterIPs come from (`CIDR[,CIDR]` for dual stack).
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cidr: String,
    /// Seconds to wait for the pods to run.
    #[arg(long, value_name = "SECS", default_value_t = 90)]
    pod_timeout: u64,
    /// Nodes: the first in this machine's network namespace, each other in one of its own, joined by Geneve
    /// over an underlay segment.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=16))]
    nodes: u8,
    /// The underlay segment of the nodes' tunnels.
    #[arg(long, default_value = "198.18.0.0/24")]
    underlay_cidr: String,
    /// NB and SB as raft clusters of 3 members each; every client is given all three.
    #[arg(long)]
    raft: bool,
}

impl UpArgs {
    fn options(self) -> UpOptions {
        let settings = Settings {
            node_name: self.node_name,
            bridge: self.bridge,
            node_nic: self.node_nic,
            api_addr: format!("127.0.0.1:{}", self.api_port),
            default_cidr: self.default_cidr,
            join_cidr: self.join_cidr,
            demo_cidr: self.demo_cidr,
            demo_namespace: self.demo_namespace,
            demo_pods: self.demo_pods,
            netns_prefix: self.netns_prefix,
            service_cidr: self.service_cidr,
            nodes: usize::from(self.nodes),
            underlay_cidr: self.underlay_cidr,
            raft: self.raft,
            ..Settings::default()
        };
        UpOptions {
            console: sandbox::Console::stdout(),
            settings,
            bin_dir: self.bin_dir,
            install: !self.no_install,
            no_demo: self.no_demo,
            pod_timeout: Some(Duration::from_secs(self.pod_timeout)),
        }
    }
}

/// `tracing` events on stderr (kube-ovn-cmd's set-up, as the other binaries').
fn init_logs(level: &str, format: LogFormat) {
    kube_ovn_cmd::log::init(level.parse().unwrap_or(tracing::Level::INFO), format);
}

fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("kube-ovn-sandbox: tokio runtime: {e}");
            ExitCode::FAILURE
        })
}

/// The programs `up` runs as this binary's hidden subcommands with raw arguments: a container's monitor (before
/// any thread exists: it enters a namespace) and the demo's servers.
fn helper(args: &[String]) -> Option<ExitCode> {
    use kubeovn_sandbox::{containers, transport};
    let first = args.first()?.as_str();
    if ![
        containers::SHIM_COMMAND,
        transport::SERVE_NAME_COMMAND,
        transport::SERVE_PEER_COMMAND,
    ]
    .contains(&first)
    {
        return None;
    }
    // Their messages (a container that could not start) go to their stderr: the container's log.
    init_logs("info", LogFormat::Text);
    if first == containers::SHIM_COMMAND {
        let code = containers::shim(&args[1..]);
        return Some(ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1)));
    }
    if first == transport::SERVE_NAME_COMMAND {
        // The demo's backends: answer with the pod's name.
        let port = args.get(1).and_then(|p| p.parse().ok()).unwrap_or(8080);
        let name = std::env::var("HOSTNAME").unwrap_or_else(|_| "?".into());
        return Some(match transport::serve_name(port, &name) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("kube-ovn-sandbox serve-name: {e}");
                ExitCode::FAILURE
            }
        });
    }
    if first == transport::SERVE_PEER_COMMAND {
        // The external network's server: answer with the peer's address.
        let Some(addr) = args.get(1).and_then(|a| a.parse().ok()) else {
            eprintln!("kube-ovn-sandbox serve-peer: an ADDRESS:PORT to serve on is needed");
            return Some(ExitCode::from(2));
        };
        return Some(match transport::serve_peer(addr) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("kube-ovn-sandbox serve-peer: {e}");
                ExitCode::FAILURE
            }
        });
    }
    None
}

fn main() -> ExitCode {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    if let Some(code) = helper(&raw) {
        return code;
    }
    let cli = Cli::parse();
    let dir = StateDir::new(&cli.state_dir);
    init_logs(&cli.log_level, cli.log_format);
    match cli.command {
        Command::Exec { pod, command } => {
            // Before any thread exists: setns then exec.
            let e = kubeovn_sandbox::exec::exec(&dir, &pod, &command);
            eprintln!("kube-ovn-sandbox exec: {e}");
            ExitCode::from(127)
        }
        Command::Logs { pod, container } => {
            match kubeovn_sandbox::kubelet::log_file(&dir, &pod, container.as_deref()) {
                Ok(path) => {
                    // A container that has not written anything yet has no log file: no output.
                    let text = std::fs::read(&path).unwrap_or_default();
                    let _ = std::io::Write::write_all(&mut std::io::stdout(), &text);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("kube-ovn-sandbox logs: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Down => match sandbox::down(&dir) {
            Ok(()) => {
                println!("sandbox in {} is down", dir.root().display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("kube-ovn-sandbox down: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Status => match sandbox::status(&dir, &sandbox::Console::stdout()) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(3),
            Err(e) => {
                eprintln!("kube-ovn-sandbox status: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Up(args) => {
            let opts = args.options();
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(c) => return c,
            };
            match rt.block_on(sandbox::up(&dir, &opts)) {
                Ok(m) if m.all_ok() => ExitCode::SUCCESS,
                Ok(_) => ExitCode::from(4),
                Err(e) => {
                    eprintln!("kube-ovn-sandbox up: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::KillLeader { db } => {
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(c) => return c,
            };
            match rt.block_on(sandbox::kill_leader(&dir, &db, &sandbox::Console::stdout())) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("kube-ovn-sandbox kill-leader: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::LeaderProxy => {
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(c) => return c,
            };
            match rt.block_on(sandbox::leader_proxy(&dir)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("kube-ovn-sandbox leader-proxy: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Kubelet => {
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(c) => return c,
            };
            rt.block_on(async {
                let k = match kubeovn_sandbox::kubelet::Kubelet::new(dir).await {
                    Ok(k) => k,
                    Err(e) => {
                        eprintln!("kubelet: {e}");
                        return ExitCode::FAILURE;
                    }
                };
                match k.run(kube_ovn_cmd::shutdown_signal()).await {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("kubelet: {e}");
                        ExitCode::FAILURE
                    }
                }
            })
        }
        Command::Endpoints => {
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(c) => return c,
            };
            rt.block_on(async {
                let r = match kubeovn_sandbox::kubelet::client(&dir.kubeconfig()).await {
                    Ok(c) => {
                        kubeovn_sandbox::endpoints::run(c, kube_ovn_cmd::shutdown_signal()).await
                    }
                    Err(e) => Err(e),
                };
                match r {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("endpointslices: {e}");
                        ExitCode::FAILURE
                    }
                }
            })
        }
    }
}
