//! `kube-ovn-sandbox`: a whole Kube-OVN on this machine. See `--help`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use kube_ovn_sandbox::sandbox::{self, UpOptions};
use kube_ovn_sandbox::state::{StateDir, DEFAULT_STATE_DIR};

const USAGE: &str = "usage: kube-ovn-sandbox [--state-dir DIR] COMMAND
  up        start OVN/OVS, the API server, kube-ovn-controller, kube-ovn-daemon and a kubelet; create a
            second subnet and demo pods; print their addresses and a ping matrix
  down      stop everything `up` started and remove its network namespaces and links
  status    the processes and the pods' sandboxes
  exec NAMESPACE/POD -- COMMAND...   run a command in a pod's network namespace
  logs NAMESPACE/POD [-c CONTAINER]  print a container's output (stdout and stderr, across restarts)
  kill-leader nb|sb  (with up --raft) SIGKILL the raft leader of NB or SB, report how long the election
            took, then start the member again

  --state-dir DIR       default $KUBE_OVN_SANDBOX_DIR or /var/lib/kube-ovn-sandbox
up options:
  --bin-dir DIR         where kube-ovn-testapi, kube-ovn-controller, kube-ovn-daemon and kube-ovn are
                        (default $KUBE_OVN_SANDBOX_BIN_DIR, else next to this program)
  --no-install          do not apt-get install missing OVN/OVS packages
  --no-demo             no demo namespace, subnet and pods
  --node-name NAME      (sandbox)         --bridge NAME        (br-sbx)
  --node-nic NAME       (ovn0)            --api-port PORT      (16443, another if taken)
  --default-cidr CIDR   (10.16.0.0/16)    --join-cidr CIDR     (100.64.0.0/16)
  --demo-cidr CIDR      (10.66.0.0/24)    --demo-namespace NS  (demo)
  --demo-pods N         (3 per namespace) --netns-prefix P     (sbx)
  --service-cidr CIDR[,CIDR]  (10.96.0.0/12) where Services' ClusterIPs come from
  --pod-timeout SECS    (90)
  --nodes N             (1) nodes: the first in this machine's network namespace, each other in one of
                        its own, joined by Geneve over an underlay segment (--underlay-cidr, 198.18.0.0/24)
  --raft                NB and SB as raft clusters of 3 members each; every client is given all three";

enum Cmd {
    Up(Box<UpOptions>),
    Down,
    Status,
    Exec(String, Vec<String>),
    Logs(String, Option<String>),
    KillLeader(String),
    LeaderProxy,
    Kubelet,
}

fn parse(args: Vec<String>) -> Result<(StateDir, Cmd), String> {
    let mut dir = std::env::var_os("KUBE_OVN_SANDBOX_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
    let mut up = UpOptions {
        install: true,
        ..UpOptions::default()
    };
    let mut command: Option<String> = None;
    let mut container: Option<String> = None;
    let mut positional = Vec::new();
    let mut rest = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        if a == "--" {
            rest.extend(it.by_ref());
            break;
        }
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (a.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        let s = &mut up.settings;
        match flag.as_str() {
            "--state-dir" => dir = PathBuf::from(value()?),
            "--bin-dir" => up.bin_dir = Some(PathBuf::from(value()?)),
            "--no-install" => up.install = false,
            "--no-demo" => up.no_demo = true,
            "-c" | "--container" => container = Some(value()?),
            "--node-name" => s.node_name = value()?,
            "--bridge" => s.bridge = value()?,
            "--node-nic" => s.node_nic = value()?,
            "--api-port" => {
                let p: u16 = value()?.parse().map_err(|e| format!("--api-port: {e}"))?;
                s.api_addr = format!("127.0.0.1:{p}");
            }
            "--default-cidr" => s.default_cidr = value()?,
            "--join-cidr" => s.join_cidr = value()?,
            "--demo-cidr" => s.demo_cidr = value()?,
            "--demo-namespace" => s.demo_namespace = value()?,
            "--demo-pods" => {
                s.demo_pods = value()?.parse().map_err(|e| format!("--demo-pods: {e}"))?
            }
            "--netns-prefix" => s.netns_prefix = value()?,
            "--service-cidr" => s.service_cidr = value()?,
            "--nodes" => {
                s.nodes = value()?
                    .parse()
                    .ok()
                    .filter(|n| (1..=16).contains(n))
                    .ok_or_else(|| format!("--nodes: a number from 1 to 16\n{USAGE}"))?
            }
            "--underlay-cidr" => s.underlay_cidr = value()?,
            "--raft" => s.raft = true,
            "--pod-timeout" => {
                let secs: u64 = value()?
                    .parse()
                    .map_err(|e| format!("--pod-timeout: {e}"))?;
                up.pod_timeout = Some(Duration::from_secs(secs));
            }
            "-h" | "--help" | "help" => return Err(USAGE.to_owned()),
            f if f.starts_with('-') => return Err(format!("unknown flag {f:?}\n{USAGE}")),
            _ if command.is_none() => command = Some(a),
            _ => positional.push(a),
        }
    }
    let dir = StateDir::new(dir);
    let cmd = match command.as_deref() {
        Some("up") => Cmd::Up(Box::new(up)),
        Some("down") => Cmd::Down,
        Some("status") => Cmd::Status,
        Some("kubelet") => Cmd::Kubelet,
        Some("leader-proxy") => Cmd::LeaderProxy,
        Some("kill-leader") => {
            let [db] = positional.as_slice() else {
                return Err(format!("kill-leader takes nb or sb\n{USAGE}"));
            };
            Cmd::KillLeader(db.clone())
        }
        Some("exec") => {
            let [target] = positional.as_slice() else {
                return Err(format!("exec takes NAMESPACE/POD -- COMMAND...\n{USAGE}"));
            };
            if rest.is_empty() {
                return Err("exec: no command after --".into());
            }
            Cmd::Exec(target.clone(), rest)
        }
        Some("logs") => {
            let [target] = positional.as_slice() else {
                return Err(format!("logs takes NAMESPACE/POD [-c CONTAINER]\n{USAGE}"));
            };
            Cmd::Logs(target.clone(), container)
        }
        Some(other) => return Err(format!("unknown command {other:?}\n{USAGE}")),
        None => return Err(USAGE.to_owned()),
    };
    Ok((dir, cmd))
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

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(kube_ovn_sandbox::containers::SHIM_COMMAND) {
        // The kubelet's monitor of one container: before any thread exists (it enters a namespace).
        let code = kube_ovn_sandbox::containers::shim(&args[1..]);
        return ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1));
    }
    if args.first().map(String::as_str) == Some(kube_ovn_sandbox::transport::SERVE_NAME_COMMAND) {
        // The demo's backends: answer with the pod's name.
        let port = args.get(1).and_then(|p| p.parse().ok()).unwrap_or(8080);
        let name = std::env::var("HOSTNAME").unwrap_or_else(|_| "?".into());
        if let Err(e) = kube_ovn_sandbox::transport::serve_name(port, &name) {
            eprintln!("kube-ovn-sandbox serve-name: {e}");
            return ExitCode::FAILURE;
        }
        return ExitCode::SUCCESS;
    }
    if args.first().map(String::as_str) == Some(kube_ovn_sandbox::transport::SERVE_PEER_COMMAND) {
        // The external network's server: answer with the peer's address.
        let Some(addr) = args.get(1).and_then(|a| a.parse().ok()) else {
            eprintln!("kube-ovn-sandbox serve-peer: an ADDRESS:PORT to serve on is needed");
            return ExitCode::from(2);
        };
        if let Err(e) = kube_ovn_sandbox::transport::serve_peer(addr) {
            eprintln!("kube-ovn-sandbox serve-peer: {e}");
            return ExitCode::FAILURE;
        }
        return ExitCode::SUCCESS;
    }
    let (dir, cmd) = match parse(args) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match cmd {
        Cmd::Exec(target, argv) => {
            // Before any thread exists: setns then exec.
            let e = kube_ovn_sandbox::exec::exec(&dir, &target, &argv);
            eprintln!("kube-ovn-sandbox: {e}");
            ExitCode::from(127)
        }
        Cmd::Logs(target, container) => {
            match kube_ovn_sandbox::kubelet::log_file(&dir, &target, container.as_deref()) {
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
        Cmd::Down => match sandbox::down(&dir) {
            Ok(()) => {
                println!("sandbox in {} is down", dir.root().display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("kube-ovn-sandbox down: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Status => match sandbox::status(&dir) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(3),
            Err(e) => {
                eprintln!("kube-ovn-sandbox status: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Up(opts) => {
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
        Cmd::KillLeader(db) => {
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(c) => return c,
            };
            match rt.block_on(sandbox::kill_leader(&dir, &db)) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("kube-ovn-sandbox kill-leader: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::LeaderProxy => {
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
        Cmd::Kubelet => {
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(c) => return c,
            };
            rt.block_on(async {
                let kubeconfig = dir.kubeconfig();
                let k = match kube_ovn_sandbox::kubelet::Kubelet::new(dir).await {
                    Ok(k) => k,
                    Err(e) => {
                        eprintln!("kubelet: {e}");
                        return ExitCode::FAILURE;
                    }
                };
                let shutdown = async {
                    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    {
                        Ok(mut t) => {
                            tokio::select! {
                                _ = t.recv() => {}
                                _ = tokio::signal::ctrl_c() => {}
                            }
                        }
                        Err(_) => std::future::pending().await,
                    }
                };
                // The EndpointSlice controller runs beside the kubelet, in the same process, until the same
                // signal.
                let shutdown = futures::FutureExt::shared(Box::pin(shutdown));
                let slices = async {
                    let r = match kube_ovn_sandbox::kubelet::client(&kubeconfig).await {
                        Ok(c) => kube_ovn_sandbox::endpoints::run(c, shutdown.clone()).await,
                        Err(e) => Err(e),
                    };
                    if let Err(e) = r {
                        eprintln!("endpointslices: {e}");
                    }
                };
                let (kubelet, ()) = tokio::join!(k.run(shutdown.clone()), slices);
                match kubelet {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("kubelet: {e}");
                        ExitCode::FAILURE
                    }
                }
            })
        }
    }
}
