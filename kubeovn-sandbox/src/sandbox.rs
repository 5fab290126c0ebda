//! `up`, `down` and `status`: one Kube-OVN node on this machine, every process in the background with its
//! pid recorded in the state directory.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::ResourceExt;
use serde_json::{json, Value};

use crate::cluster;
use crate::kubelet::{self, records, PodRecord};
use crate::ovn::{missing_programs, OvnOptions, OvnStack};
use crate::procs::{log_tail, spawn_detached, ProcRecord};
use crate::report;
use crate::state::{read_json, write_json, Settings, StateDir};
use crate::SandboxError;

/// The Debian packages the sandbox needs.
pub const PACKAGES: &[&str] = &[
    "openvswitch-switch",
    "ovn-central",
    "ovn-host",
    "iputils-ping",
];

/// The environment variable naming the directory of our binaries (default: the running executable's).
pub const BIN_DIR_ENV: &str = "KUBE_OVN_SANDBOX_BIN_DIR";

/// Where our binaries are.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `kube-ovn-testapi`.
    pub testapi: PathBuf,
    /// `kube-ovn-controller`.
    pub controller: PathBuf,
    /// `kube-ovn-daemon`.
    pub daemon: PathBuf,
    /// The CNI shim `kube-ovn`.
    pub shim: PathBuf,
    /// `kube-ovn-sandbox` itself (runs the kubelet).
    pub sandbox: PathBuf,
}

impl Binaries {
    /// Looks in `dir`, else `$KUBE_OVN_SANDBOX_BIN_DIR`, else next to the running executable (the same
    /// cargo target directory).
    pub fn locate(dir: Option<&Path>) -> Result<Binaries, SandboxError> {
        let me = std::env::current_exe()
            .map_err(|e| SandboxError::io("current exe", Path::new("."), e))?;
        let dir = dir
            .map(Path::to_owned)
            .or_else(|| std::env::var_os(BIN_DIR_ENV).map(PathBuf::from))
            .or_else(|| me.parent().map(Path::to_owned))
            .unwrap_or_default();
        let find = |name: &'static str| -> Result<PathBuf, SandboxError> {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                Err(SandboxError::Failed {
                    what: "locate binaries",
                    detail: format!(
                        "{} not found (build it: cargo build --release -p kube-ovn-testapi -p kube-ovn-controller \
                         -p kube-ovn-daemon -p kube-ovn-cni -p kube-ovn-sandbox; or set --bin-dir / {BIN_DIR_ENV})",
                        p.display()
                    ),
                })
            }
        };
        let sandbox = if me.file_name().is_some_and(|n| n == "kube-ovn-sandbox") {
            me.clone()
        } else {
            find("kube-ovn-sandbox")?
        };
        Ok(Binaries {
            testapi: find("kube-ovn-testapi")?,
            controller: find("kube-ovn-controller")?,
            daemon: find("kube-ovn-daemon")?,
            shim: find("kube-ovn")?,
            sandbox,
        })
    }
}

/// Where `up`, `status` and `kill-leader` write what their user reads (the CLI gives stdout); the library's
/// diagnostics go through `tracing`. Write errors (a closed pipe: `status | head`) are ignored.
#[derive(Clone)]
pub struct Console(Arc<Mutex<Box<dyn Write + Send>>>);

impl Console {
    /// Output to `w`.
    pub fn new(w: impl Write + Send + 'static) -> Console {
        Console(Arc::new(Mutex::new(Box::new(w))))
    }

    /// Output to this process's stdout.
    pub fn stdout() -> Console {
        Console::new(std::io::stdout())
    }

    /// No output.
    pub fn silent() -> Console {
        Console::new(std::io::sink())
    }

    /// Writes `s` and flushes (a line in progress).
    pub fn write(&self, s: &str) {
        if let Ok(mut w) = self.0.lock() {
            let _ = w.write_all(s.as_bytes());
            let _ = w.flush();
        }
    }

    /// Writes `s` and a newline.
    pub fn line(&self, s: &str) {
        self.write(&format!("{s}\n"));
    }
}

impl Default for Console {
    fn default() -> Console {
        Console::silent()
    }
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Console")
    }
}

/// The name of the EndpointSlice controller's process in `pids.json` (and of its log).
pub const ENDPOINTS_PROCESS: &str = "endpointslices";

/// How `up` runs.
#[derive(Debug, Clone, Default)]
pub struct UpOptions {
    /// Where the steps, the tables and the matrices go.
    pub console: Console,
    /// The settings of a new sandbox.
    pub settings: Settings,
    /// Where our binaries are (see [`Binaries::locate`]).
    pub bin_dir: Option<PathBuf>,
    /// Install missing Debian packages with apt-get (as root).
    pub install: bool,
    /// Skip the demo namespace, subnet and pods.
    pub no_demo: bool,
    /// How long to wait for the pods to run.
    pub pod_timeout: Option<Duration>,
}

/// Prints numbered steps with their durations.
#[derive(Debug)]
pub struct Progress {
    out: Console,
    step: usize,
    total: usize,
    t0: Instant,
    started: Instant,
}

impl Progress {
    /// A display of `total` steps.
    pub fn new(total: usize, out: Console) -> Progress {
        Progress {
            out,
            step: 0,
            total,
            t0: Instant::now(),
            started: Instant::now(),
        }
    }

    /// Starts a step.
    pub fn begin(&mut self, what: &str) {
        self.step += 1;
        self.t0 = Instant::now();
        self.out
            .write(&format!("[{:>2}/{}] {what:<62}", self.step, self.total));
    }

    /// Ends the step.
    pub fn done(&self, note: &str) {
        self.out.line(&format!(
            "ok {:>6.0} ms {note}",
            self.t0.elapsed().as_secs_f64() * 1e3
        ));
    }

    /// Since the first step.
    pub fn total_elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

fn failed(what: &'static str, detail: impl Into<String>) -> SandboxError {
    SandboxError::Failed {
        what,
        detail: detail.into(),
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Checks the OVN/OVS programs; installs the packages with apt-get when allowed, else says what to run.
pub fn ensure_packages(install: bool) -> Result<String, SandboxError> {
    let Some(missing) = missing_programs() else {
        return Ok("installed".into());
    };
    let cmd = format!(
        "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {}",
        PACKAGES.join(" ")
    );
    if !install || !is_root() {
        return Err(failed(
            "OVN/OVS packages",
            format!("{missing} is missing; install them with:\n  sudo sh -c '{cmd}'"),
        ));
    }
    let st = Command::new("sh")
        .arg("-c")
        .arg(&cmd)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| SandboxError::io("apt-get", Path::new("apt-get"), e))?;
    if !st.success() {
        return Err(failed("apt-get install", format!("`{cmd}` failed: {st}")));
    }
    match missing_programs() {
        None => Ok(format!("installed {}", PACKAGES.join(" "))),
        Some(p) => Err(failed("OVN/OVS packages", format!("{p} still missing"))),
    }
}

/// The first usable address of an IPv4 CIDR (`10.16.0.0/16` -> `10.16.0.1`): Kube-OVN's default gateway.
pub fn first_host(cidr: &str) -> Result<String, SandboxError> {
    let (ip, len) = cidr
        .split_once('/')
        .ok_or_else(|| failed("CIDR", format!("{cidr:?} has no prefix length")))?;
    let ip: Ipv4Addr = ip
        .parse()
        .map_err(|e| failed("CIDR", format!("{cidr:?}: {e}")))?;
    let len: u32 = len
        .parse()
        .ok()
        .filter(|l| *l <= 30)
        .ok_or_else(|| failed("CIDR", format!("{cidr:?}: prefix must be 0..=30")))?;
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    Ok(Ipv4Addr::from((u32::from(ip) & mask) + 1).to_string())
}

fn free_port(preferred: u16) -> u16 {
    if preferred != 0 && TcpListener::bind(("127.0.0.1", preferred)).is_ok() {
        return preferred;
    }
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(preferred)
}

fn load_pids(dir: &StateDir) -> Vec<ProcRecord> {
    read_json(&dir.pids_file()).unwrap_or_default()
}

fn save_pids(dir: &StateDir, pids: &[ProcRecord]) -> Result<(), SandboxError> {
    write_json(&dir.pids_file(), &pids)
}

async fn wait_for<F, Fut>(
    what: &str,
    timeout: Duration,
    log: Option<&Path>,
    mut f: F,
) -> Result<(), SandboxError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t0 = Instant::now();
    while !f().await {
        if t0.elapsed() > timeout {
            return Err(SandboxError::Timeout {
                what: what.to_owned(),
                log: log.map(|l| log_tail(l, 20)).unwrap_or_default(),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

fn check_alive(rec: &ProcRecord, log: &Path) -> Result<(), SandboxError> {
    if rec.alive() {
        Ok(())
    } else {
        Err(SandboxError::Exited {
            name: "a sandbox process",
            status: format!(
                "{} (pid {}) exited:\n{}",
                rec.name,
                rec.pid,
                log_tail(log, 20)
            ),
        })
    }
}

/// The Kube-OVN CRDs (`kubeovn_core::crd`, the ones `kube-ovn-controller crd` prints and dist/crds.yaml
/// holds), as JSON for the test API server.
pub fn crds() -> Vec<Value> {
    kubeovn_core::crd::crds()
        .iter()
        .filter_map(|c| serde_json::to_value(c).ok())
        .collect()
}

fn dynamic(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: "v1".into(),
        api_version: if group.is_empty() {
            "v1".into()
        } else {
            format!("{group}/v1")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

async fn create_json(api: &Api<DynamicObject>, v: Value) -> Result<(), SandboxError> {
    let o: DynamicObject =
        serde_json::from_value(v).map_err(|e| failed("object", e.to_string()))?;
    match api.create(&PostParams::default(), &o).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(failed("create object", format!("{}: {e}", o.name_any()))),
    }
}

/// Another running ovs-vswitchd (pid, command line): the userspace datapath's `ovs-netdev` tap is one per
/// network namespace, so a second ovs-vswitchd on the netdev datapath cannot open its bridges.
pub fn other_vswitchd() -> Option<(u32, String)> {
    let rd = std::fs::read_dir("/proc").ok()?;
    let netns = |dir: &Path| std::fs::read_link(dir.join("ns/net")).ok();
    let ours = netns(Path::new("/proc/self"));
    rd.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        if comm.trim() != "ovs-vswitchd" || !ProcRecord::of("", pid).alive() {
            return None;
        }
        // One in another network namespace has its own tap.
        if ours.is_some() && netns(&e.path()) != ours {
            return None;
        }
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        Some((pid, cmd.trim().to_owned()))
    })
}

/// Whether a sandbox runs in `dir`: every recorded process alive.
pub fn is_up(dir: &StateDir) -> bool {
    let pids = load_pids(dir);
    !pids.is_empty() && pids.iter().all(ProcRecord::alive)
}

/// `up`: starts everything, creates the demo, prints the table and the ping matrix. Safe to run twice: a
/// running sandbox is reported, a half-dead one is taken down first.
pub async fn up(dir: &StateDir, opts: &UpOptions) -> Result<report::Reachability, SandboxError> {
    if !is_root() {
        return Err(failed(
            "up",
            "the sandbox makes network namespaces and an OVS bridge: run it as root (sudo)",
        ));
    }
    // Each node beyond the first: its OVS, kubelet and daemon.
    let total = if opts.no_demo { 10 } else { 12 } + 3 * opts.settings.nodes.saturating_sub(1);
    let out = &opts.console;
    let mut pr = Progress::new(total, out.clone());
    pr.begin("OVN/OVS packages");
    let note = ensure_packages(opts.install)?;
    pr.done(&note);

    if is_up(dir) {
        out.line(&format!(
            "the sandbox in {} is already up (kube-ovn-sandbox down --state-dir {} stops it)",
            dir.root().display(),
            dir.root().display()
        ));
        let settings = dir.load_settings()?;
        return show(dir, &settings, out).await;
    }
    if dir.pids_file().exists() {
        out.line(&format!(
            "a previous sandbox in {} is partly down: cleaning it up",
            dir.root().display()
        ));
        down(dir)?;
    }

    if let Some((pid, cmd)) = other_vswitchd() {
        return Err(failed(
            "up",
            format!(
                "another ovs-vswitchd runs (pid {pid}: {cmd}); the userspace datapath's ovs-netdev device \
                 exists once per network namespace: stop it first (a system one: systemctl stop openvswitch-switch)"
            ),
        ));
    }
    let mut settings = opts.settings.clone();
    let bins = Binaries::locate(opts.bin_dir.as_deref())?;
    make_dirs(dir)?;
    let port: u16 = settings
        .api_addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(16443);
    settings.api_addr = format!("127.0.0.1:{}", free_port(port));
    settings.daemon_metrics_addr = format!("127.0.0.1:{}", free_port(10665));
    if settings.nodes > 1 {
        settings.node_ip = cluster::node_ip(&settings, 1)?;
    }
    // This machine is the first node: its daemon turns forwarding on for pods' egress; `down` restores it.
    settings.host_ip_forward = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
        .ok()
        .map(|v| v.trim().to_owned());
    dir.save_settings(&settings)?;
    let mut pids: Vec<ProcRecord> = Vec::new();

    let r = start_all(dir, &settings, &bins, opts, &mut pr, &mut pids).await;
    // Whatever was started is recorded, so `down` can stop it even after a failure.
    save_pids(dir, &pids)?;
    if let Err(e) = r {
        tracing::error!(
            "up failed: {e}; cleaning up (logs stay in {})",
            dir.logs_dir().display()
        );
        let _ = down(dir);
        return Err(e);
    }
    out.line(&format!(
        "\nsandbox up in {:.1} s: state in {}",
        pr.total_elapsed().as_secs_f64(),
        dir.root().display()
    ));
    show(dir, &settings, out).await
}

async fn start_all(
    dir: &StateDir,
    settings: &Settings,
    bins: &Binaries,
    opts: &UpOptions,
    pr: &mut Progress,
    pids: &mut Vec<ProcRecord>,
) -> Result<(), SandboxError> {
    pr.begin("OVN: NB, SB, northd, ovs-vswitchd (netdev), ovn-controller");
    let mut o = OvnOptions::new(&settings.bridge);
    o.system_id = settings.node_name.clone();
    o.raft = settings.raft;
    if settings.raft {
        let ovn = dir.ovn_dir();
        o.northd_remotes = Some((
            format!("unix:{}", leader_socket(&ovn, "nb").display()),
            format!("unix:{}", leader_socket(&ovn, "sb").display()),
        ));
    }
    if settings.nodes > 1 {
        o.encap_ip = settings.node_ip.clone();
    }
    if settings.raft {
        // ovn-northd reaches each database's leader through it (see `leader_proxy`). Up before ovn-northd
        // starts: an ovn-northd that filled the southbound only after ovn-controller had started (its first
        // connection refused) was seen to crash ovn-controller 23.03 (SIGSEGV).
        let ovn = dir.ovn_dir();
        std::fs::create_dir_all(&ovn).map_err(|e| SandboxError::io("create directory", &ovn, e))?;
        let socks = [leader_socket(&ovn, "nb"), leader_socket(&ovn, "sb")];
        for s in &socks {
            let _ = std::fs::remove_file(s);
        }
        let mut cmd = Command::new(&bins.sandbox);
        cmd.arg("--state-dir").arg(dir.root()).arg("leader-proxy");
        pids.push(spawn_detached(
            "leader-proxy",
            cmd,
            &dir.log("leader-proxy"),
        )?);
        save_pids(dir, pids)?;
        wait_for("the leader proxy", Duration::from_secs(10), None, || {
            let up = socks.iter().all(|s| s.exists());
            async move { up }
        })
        .await?;
    }
    let stack = OvnStack::start(&dir.ovn_dir(), o).await?;
    for (name, pid) in stack.detach() {
        pids.push(ProcRecord::of(name, pid));
    }
    save_pids(dir, pids)?;
    if settings.nodes > 1 {
        // The underlay's switch, and this node's address on it.
        cluster::underlay(
            &dir.ovs_remote(),
            settings,
            cluster::node_ip_cidr(settings, 1)?,
            &[],
        )
        .await?;
        let ext = cluster::wire_external(settings, &dir.ovs_remote()).await?;
        cluster::route_external(settings, settings).await?;
        // The world's server: it answers with the address it sees.
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", ext.display()))
            .arg("--")
            .arg(&bins.sandbox)
            .arg(crate::transport::SERVE_PEER_COMMAND)
            .arg(SocketAddr::new(cluster::external_ip(settings)?, 80).to_string());
        pids.push(spawn_detached(
            "external-server",
            cmd,
            &dir.log("external-server"),
        )?);
        save_pids(dir, pids)?;
    }
    pr.done(&if settings.nodes > 1 {
        format!(
            "underlay {}, external network {} in namespace {}",
            settings.underlay_cidr,
            settings.external_cidr,
            cluster::external_netns(settings)
        )
    } else {
        String::new()
    });

    pr.begin("kube-ovn-testapi (in-memory Kubernetes API)");
    let log = dir.log("kube-ovn-testapi");
    let _ = std::fs::remove_file(dir.kubeconfig());
    let mut cmd = Command::new(&bins.testapi);
    cmd.arg("--listen")
        .arg(&settings.api_addr)
        .arg("--kubeconfig")
        .arg(dir.kubeconfig())
        .arg("--service-cluster-ip-range")
        .arg(&settings.service_cidr);
    let api = spawn_detached("kube-ovn-testapi", cmd, &log)?;
    pids.push(api.clone());
    save_pids(dir, pids)?;
    let addr: SocketAddr = settings
        .api_addr
        .parse()
        .map_err(|e| failed("API address", format!("{e}")))?;
    let kc = dir.kubeconfig();
    wait_for(
        "the test API server",
        Duration::from_secs(15),
        Some(&log),
        || {
            let ok = kc.exists() && std::net::TcpStream::connect(addr).is_ok();
            let alive = api.alive();
            async move { ok || !alive }
        },
    )
    .await?;
    check_alive(&api, &log)?;
    let client = kubelet::client(&dir.kubeconfig()).await?;
    let crd_api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &dynamic(
            "apiextensions.k8s.io",
            "CustomResourceDefinition",
            "customresourcedefinitions",
        ),
    );
    for c in crds() {
        create_json(&crd_api, c).await?;
    }
    pr.done(&format!("http://{} (+ Kube-OVN CRDs)", settings.api_addr));

    pr.begin("kube-ovn-controller");
    let log = dir.log("kube-ovn-controller");
    let mut cmd = Command::new(&bins.controller);
    cmd.arg("--kubeconfig")
        .arg(dir.kubeconfig())
        .arg("--ovn-nb-addr")
        .arg(dir.nb_remote())
        .arg("--ovn-sb-addr")
        .arg(dir.sb_remote())
        .arg("--default-cidr")
        .arg(&settings.default_cidr)
        .arg("--default-gateway")
        .arg(first_host(&settings.default_cidr)?)
        .arg("--node-switch-cidr")
        .arg(&settings.join_cidr)
        .arg("--node-switch-gateway")
        .arg(first_host(&settings.join_cidr)?)
        .arg("--service-cluster-ip-range")
        .arg(&settings.service_cidr)
        .arg("--log-level")
        .arg("info");
    let ctl = spawn_detached("kube-ovn-controller", cmd, &log)?;
    pids.push(ctl.clone());
    save_pids(dir, pids)?;
    let subnets: Api<DynamicObject> =
        Api::all_with(client.clone(), &dynamic("kubeovn.io", "Subnet", "subnets"));
    wait_for(
        "the default subnet ovn-default",
        Duration::from_secs(30),
        Some(&log),
        || {
            let s = subnets.clone();
            let alive = ctl.alive();
            async move { !alive || s.get("ovn-default").await.is_ok() }
        },
    )
    .await?;
    check_alive(&ctl, &log)?;
    pr.done("subnets ovn-default and join");

    pr.begin("CNI shim and conflist");
    install_cni(dir, bins)?;
    pr.done(&format!("{}", dir.conflist().display()));

    // Cluster-scoped, as kube-controller-manager's: one process whatever the number of nodes.
    pr.begin("EndpointSlice controller (one per cluster)");
    let mut cmd = Command::new(&bins.sandbox);
    cmd.arg("endpoints").arg("--state-dir").arg(dir.root());
    let slices = spawn_detached(ENDPOINTS_PROCESS, cmd, &dir.log(ENDPOINTS_PROCESS))?;
    pids.push(slices);
    save_pids(dir, pids)?;
    pr.done("");

    start_agents(dir, settings, bins, &client, pr, pids).await?;
    for k in 2..=settings.nodes {
        start_node(dir, settings, k, bins, &client, pr).await?;
    }

    pr.begin("all processes running");
    for p in pids.iter() {
        if !p.alive() {
            return Err(SandboxError::Exited {
                name: "a sandbox process",
                status: format!("{} (pid {}) exited", p.name, p.pid),
            });
        }
    }
    pr.done(&format!("{} processes", pids.len()));

    if opts.no_demo {
        pr.begin("no demo");
        pr.done("");
        return Ok(());
    }
    pr.begin(&format!(
        "demo: namespace {} bound to subnet {} ({})",
        settings.demo_namespace, settings.demo_namespace, settings.demo_cidr
    ));
    create_demo_subnet(&client, settings).await?;
    pr.done("");

    pr.begin(&format!(
        "demo: {} pods in default, {} in {}",
        settings.demo_pods, settings.demo_pods, settings.demo_namespace
    ));
    create_demo_pods(&client, settings).await?;
    pr.done("");

    pr.begin("pods running (CNI ADD through the shim)");
    let timeout = opts.pod_timeout.unwrap_or(Duration::from_secs(90));
    let pods: Api<Pod> = Api::all(client.clone());
    let want = settings.demo_pods * 2;
    wait_for(
        "the demo pods to run",
        timeout,
        Some(&dir.log("kubelet")),
        || {
            let p = pods.clone();
            async move {
                p.list(&Default::default())
                    .await
                    .map(|l| {
                        l.items
                            .iter()
                            .filter(|p| {
                                p.labels().get("app").map(String::as_str)
                                    == Some("kube-ovn-sandbox-demo")
                                    && p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some()
                            })
                            .count()
                            >= want
                    })
                    .unwrap_or(false)
            }
        },
    )
    .await?;
    pr.done(&format!("{want} pods"));
    Ok(())
}

/// Creates a node's state directories (its root, logs, CNI and pod records).
fn make_dirs(dir: &StateDir) -> Result<(), SandboxError> {
    for d in [
        dir.root().to_owned(),
        dir.logs_dir(),
        dir.cni_bin_dir(),
        dir.cni_conf_dir(),
        dir.pods_dir(),
    ] {
        std::fs::create_dir_all(&d).map_err(|e| SandboxError::io("create directory", &d, e))?;
    }
    Ok(())
}

/// Puts the CNI shim and the conflist (naming the node's daemon socket) in `dir`.
fn install_cni(dir: &StateDir, bins: &Binaries) -> Result<(), SandboxError> {
    let shim = dir.cni_bin_dir().join("kube-ovn");
    // Copy to a new file and rename: a running shim keeps its old inode.
    let tmp = shim.with_extension("new");
    std::fs::copy(&bins.shim, &tmp).map_err(|e| SandboxError::io("copy shim", &tmp, e))?;
    std::fs::rename(&tmp, &shim).map_err(|e| SandboxError::io("install shim", &shim, e))?;
    write_json(&dir.conflist(), &crate::cni::conflist(&dir.daemon_socket()))
}

/// Starts a node's kubelet, then its daemon (its Open_vSwitch is up), and waits until the node is
/// registered with a join address and the daemon serves with the join interface up.
async fn start_agents(
    dir: &StateDir,
    settings: &Settings,
    bins: &Binaries,
    client: &kube::Client,
    pr: &mut Progress,
    pids: &mut Vec<ProcRecord>,
) -> Result<(), SandboxError> {
    pr.begin(&format!(
        "sandbox kubelet of {} (node registration, pod sandboxes)",
        settings.node_name
    ));
    let log = dir.log("kubelet");
    let mut cmd = Command::new(&bins.sandbox);
    cmd.arg("kubelet").arg("--state-dir").arg(dir.root());
    let kl = spawn_detached("kubelet", cmd, &log)?;
    pids.push(kl.clone());
    save_pids(dir, pids)?;
    let nodes: Api<Node> = Api::all(client.clone());
    let node_name = settings.node_name.clone();
    wait_for(
        "the node to register",
        Duration::from_secs(15),
        Some(&log),
        || {
            let n = nodes.clone();
            let name = node_name.clone();
            let alive = kl.alive();
            async move { !alive || n.get(&name).await.is_ok() }
        },
    )
    .await?;
    check_alive(&kl, &log)?;
    // The controller allocates the node's join address.
    let controller_log = dir.log("kube-ovn-controller");
    wait_for(
        "the node's join address",
        Duration::from_secs(20),
        controller_log.exists().then_some(controller_log.as_path()),
        || {
            let n = nodes.clone();
            let name = node_name.clone();
            async move {
                n.get(&name)
                    .await
                    .map(|n| n.annotations().contains_key("ovn.kubernetes.io/ip_address"))
                    .unwrap_or(false)
            }
        },
    )
    .await?;
    pr.done(&format!("node {}", settings.node_name));

    pr.begin(&format!(
        "kube-ovn-daemon of {} (node start: chassis, bridge, join port)",
        settings.node_name
    ));
    let log = dir.log("kube-ovn-daemon");
    let mut cmd = Command::new(&bins.daemon);
    daemon_args(&mut cmd, dir, settings);
    let dm = spawn_detached("kube-ovn-daemon", cmd, &log)?;
    pids.push(dm.clone());
    save_pids(dir, pids)?;
    let sock = dir.daemon_socket();
    let nic = settings.node_nic.clone();
    // The join interface is in the node's namespace.
    let nd = std::sync::Arc::new(cluster::netdev(settings)?);
    wait_for(
        "the daemon's socket and the node's join interface",
        Duration::from_secs(30),
        Some(&log),
        || {
            let serving = std::os::unix::net::UnixStream::connect(&sock).is_ok();
            let alive = dm.alive();
            let (nd, nic) = (nd.clone(), nic.clone());
            async move {
                use kubeovn_netdev::Netdev;
                !alive || (serving && matches!(nd.link(&nic).await, Ok(Some(_))))
            }
        },
    )
    .await?;
    check_alive(&dm, &log)?;
    pr.done(&format!("{} up", settings.node_nic));

    Ok(())
}

/// Starts node `k` of the cluster (beyond the first): its namespace on the underlay, its Open_vSwitch
/// database, ovs-vswitchd and ovn-controller there, then its kubelet and daemon; its state in
/// `DIR/nodes/NAME`.
async fn start_node(
    root: &StateDir,
    cluster_settings: &Settings,
    k: usize,
    bins: &Binaries,
    client: &kube::Client,
    pr: &mut Progress,
) -> Result<(), SandboxError> {
    let name = cluster::node_name(cluster_settings, k);
    pr.begin(&format!(
        "node {name}: namespace, underlay, ovs-vswitchd, ovn-controller"
    ));
    let mut s = cluster::node_settings(cluster_settings, k, &root.sb_remote())?;
    s.daemon_metrics_addr = format!("127.0.0.1:{}", free_port(0));
    let dir = root.node_dir(&name);
    make_dirs(&dir)?;
    dir.save_settings(&s)?;
    std::fs::copy(root.kubeconfig(), dir.kubeconfig())
        .map_err(|e| SandboxError::io("copy kubeconfig", &dir.kubeconfig(), e))?;
    install_cni(&dir, bins)?;
    let mut pids: Vec<ProcRecord> = Vec::new();
    let netns = cluster::wire_node(cluster_settings, &s, k, &root.ovs_remote()).await?;
    let mut o = OvnOptions::new(&s.bridge).chassis_of(root.sb_remote(), Some(netns));
    o.system_id = name.clone();
    o.encap_ip = s.node_ip.clone();
    let stack = OvnStack::start(&dir.ovn_dir(), o).await?;
    for (n, pid) in stack.detach() {
        pids.push(ProcRecord::of(n, pid));
    }
    save_pids(&dir, &pids)?;
    cluster::underlay(
        &dir.ovs_remote(),
        &s,
        cluster::node_ip_cidr(cluster_settings, k)?,
        &[cluster::NODE_UNDERLAY_NIC.to_owned()],
    )
    .await?;
    cluster::route_external(cluster_settings, &s).await?;
    pr.done(&s.node_ip);
    let r = start_agents(&dir, &s, bins, client, pr, &mut pids).await;
    save_pids(&dir, &pids)?;
    r
}

/// The daemon's flags for this sandbox.
pub fn daemon_args(cmd: &mut Command, dir: &StateDir, s: &Settings) {
    cmd.arg("--kubeconfig")
        .arg(dir.kubeconfig())
        .arg("--node-name")
        .arg(&s.node_name)
        .arg("--socket")
        .arg(dir.daemon_socket())
        .arg("--metrics-addr")
        .arg(&s.daemon_metrics_addr)
        .arg("--ovs-remote")
        .arg(dir.ovs_remote())
        .arg("--ovn-remote")
        .arg(s.sb_remote.clone().unwrap_or_else(|| dir.sb_remote()))
        .arg("--bridge")
        .arg(&s.bridge)
        .arg("--datapath-type")
        .arg("netdev")
        .arg("--node-nic")
        .arg(&s.node_nic)
        .arg("--pod-cidrs")
        .arg(format!("{},{}", s.default_cidr, s.demo_cidr))
        .arg("--service-cluster-ip-range")
        .arg(&s.service_cidr);
    if s.nodes > 1 {
        cmd.arg("--encap-ip").arg(&s.node_ip);
    }
    if let Some(p) = cluster::netns_path(s) {
        cmd.arg("--netns").arg(p);
    }
}

async fn create_demo_subnet(client: &kube::Client, s: &Settings) -> Result<(), SandboxError> {
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": s.demo_namespace}
    }))
    .map_err(|e| failed("namespace", e.to_string()))?;
    match nss.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(failed("create namespace", e.to_string())),
    }
    let subnets: Api<DynamicObject> =
        Api::all_with(client.clone(), &dynamic("kubeovn.io", "Subnet", "subnets"));
    create_json(
        &subnets,
        json!({
            "apiVersion": "kubeovn.io/v1", "kind": "Subnet",
            "metadata": {"name": s.demo_namespace},
            "spec": {"protocol": "IPv4", "cidrBlock": s.demo_cidr, "gateway": first_host(&s.demo_cidr)?,
                     "namespaces": [s.demo_namespace], "vpc": "ovn-cluster"}
        }),
    )
    .await?;
    // Pods of the namespace go to the subnet once the controller has bound them.
    let name = s.demo_namespace.clone();
    wait_for(
        "the demo namespace's subnet binding",
        Duration::from_secs(20),
        None,
        || {
            let n = nss.clone();
            let name = name.clone();
            async move {
                n.get(&name)
                    .await
                    .map(|ns| {
                        ns.annotations()
                            .get("ovn.kubernetes.io/logical_switch")
                            .is_some_and(|v| v.split(',').any(|x| x == name))
                    })
                    .unwrap_or(false)
            }
        },
    )
    .await
}

/// The demo pods: `web-N` in default serve their name on TCP and UDP 8080 (this program's `serve-name`,
/// run by the sandbox kubelet in the pod's namespace) behind the Service `default/web`; `app-N` in the demo
/// namespace run nothing.
async fn create_demo_pods(client: &kube::Client, s: &Settings) -> Result<(), SandboxError> {
    let exe = std::env::current_exe()
        .map_err(|e| SandboxError::io("locate this program", Path::new("/proc/self/exe"), e))?;
    let port = DEMO_BACKEND_PORT;
    for (ns, prefix) in [("default", "web"), (s.demo_namespace.as_str(), "app")] {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        for i in 1..=s.demo_pods {
            let container = if prefix == "web" {
                json!({"name": "main", "image": "kube-ovn-sandbox",
                       "command": [exe, crate::transport::SERVE_NAME_COMMAND, port.to_string()],
                       "ports": [{"name": "tcp", "containerPort": port},
                                 {"name": "udp", "containerPort": port, "protocol": "UDP"}],
                       "readinessProbe": {"tcpSocket": {"port": "tcp"}, "periodSeconds": 1}})
            } else {
                json!({"name": "main", "image": "registry.k8s.io/pause:3.10"})
            };
            let pod: Pod = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{prefix}-{i}"), "namespace": ns,
                             "labels": {"app": "kube-ovn-sandbox-demo", "role": prefix}},
                "spec": {"containers": [container]}
            }))
            .map_err(|e| failed("pod", e.to_string()))?;
            match api.create(&PostParams::default(), &pod).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(failed("create pod", e.to_string())),
            }
        }
    }
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": DEMO_SERVICE.0, "namespace": "default"},
        "spec": {"selector": {"role": "web"},
                 "ports": [{"name": "tcp", "port": DEMO_SERVICE.1, "targetPort": "tcp"},
                           {"name": "udp", "port": DEMO_SERVICE.1, "targetPort": "udp", "protocol": "UDP"}]}
    }))
    .map_err(|e| failed("service", e.to_string()))?;
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    match api.create(&PostParams::default(), &svc).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(failed("create service", e.to_string())),
    }
    Ok(())
}

/// Prints the table, the ping matrix and the TCP and UDP one; returns both.
pub async fn show(
    dir: &StateDir,
    settings: &Settings,
    out: &Console,
) -> Result<report::Reachability, SandboxError> {
    let client = kubelet::client(&dir.kubeconfig()).await?;
    let eps = report::endpoints(&client, dir, settings).await?;
    out.line(&format!("\n{}", report::table(&eps)));
    let m = report::ping_matrix(&eps, Duration::from_secs(1)).await;
    out.line(&format!(
        "ping matrix (ICMP echo from each pod's network namespace; same subnet through its logical switch, \
         across subnets and from the node through the ovn-cluster router):\n{}",
        m.render()
    ));
    if m.all_ok() {
        out.line(&format!(
            "all {} pairs answered",
            m.labels.len() * m.labels.len().saturating_sub(1)
        ));
    } else {
        out.line(&format!("{} pairs did not answer", m.failures()));
    }
    let t = report::transport_matrix(&eps, Duration::from_secs(1)).await;
    out.line(&format!(
        "\nTCP and UDP matrix (16 KiB echoed over TCP, a datagram echoed over UDP, from each pod's network \
         namespace to each address):\n{}",
        t.render()
    ));
    if t.all_ok() {
        out.line(&format!(
            "all {} pairs carried TCP and UDP",
            t.labels.len() * t.labels.len().saturating_sub(1)
        ));
    } else {
        out.line(&format!(
            "{} pairs did not carry TCP and UDP:\n{}",
            t.failures(),
            t.details()
        ));
    }
    let service = demo_service_report(&client, &eps).await;
    if let Some(r) = &service {
        out.line(&format!(
            "\nService {} (ClusterIP {}; backends answer with their pod name): {} TCP connections and {} UDP \
             requests from each pod and the node:\n{}",
            r.service,
            r.vip,
            report::SERVICE_TRIES,
            report::SERVICE_TRIES,
            r.render()
        ));
        let seen: Vec<String> = r.backends().into_iter().collect();
        if r.all_ok() {
            out.line(&format!(
                "every request answered; backends seen: {}",
                seen.join(", ")
            ));
        } else {
            out.line("some requests were not answered");
        }
    }
    let d = dir.root().display();
    out.line(&format!(
        "\nnext:\n  kubectl --kubeconfig {d}/kubeconfig get pods -A -o wide\n  \
         kube-ovn-sandbox exec --state-dir {d} default/web-1 -- ip addr\n  \
         kube-ovn-sandbox status --state-dir {d}\n  kube-ovn-sandbox down --state-dir {d}"
    ));
    Ok(report::Reachability {
        ping: m,
        transport: t,
        service,
    })
}

/// The demo Service's name and port.
const DEMO_SERVICE: (&str, i32) = ("web", 80);
/// The port the demo's backends serve their name on.
const DEMO_BACKEND_PORT: u16 = 8080;

/// Asks the demo Service (`default/web`), if it exists and has a ClusterIP, from every endpoint. Its load
/// balancer is programmed asynchronously: a first round that finds no backend is retried for a few seconds.
async fn demo_service_report(
    client: &kube::Client,
    eps: &[report::Endpoint],
) -> Option<report::ServiceReport> {
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc = api.get_opt(DEMO_SERVICE.0).await.ok().flatten()?;
    let ip: IpAddr = svc.spec.as_ref()?.cluster_ip.as_deref()?.parse().ok()?;
    let vip = std::net::SocketAddr::new(ip, u16::try_from(DEMO_SERVICE.1).ok()?);
    let name = format!("default/{}", DEMO_SERVICE.0);
    // The backends it should reach: every pod it selects (they turn Ready within seconds of `up`).
    let selector = svc.spec.as_ref()?.selector.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let selected: std::collections::BTreeSet<String> = pods
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| selector.iter().all(|(k, v)| p.labels().get(k) == Some(v)))
        .map(|p| p.name_any())
        .collect();
    let t0 = std::time::Instant::now();
    loop {
        let r = report::service_report(&name, vip, eps, Duration::from_secs(1)).await;
        let complete = !selected.is_empty() && r.backends().is_superset(&selected);
        if (r.all_ok() && complete) || t0.elapsed() > Duration::from_secs(15) {
            return Some(r);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `down`: stops every recorded process (kubelet first), removes every pod sandbox (CNI DEL while the daemon
/// still answers, then the network namespace and any host veth left), then the datapath's taps and the
/// join interface. Idempotent.
pub fn down(dir: &StateDir) -> Result<(), SandboxError> {
    let settings = dir.load_settings().ok();
    // The other nodes first: their pods' CNI DEL needs their daemons, which need this node's SB.
    for node in dir.node_dirs().iter().rev() {
        let ns = node.load_settings().ok();
        down(node)?;
        if let (Some(c), Some(n)) = (&settings, &ns) {
            let k: usize = n
                .node_name
                .strip_prefix(&c.node_name)
                .and_then(|k| k.parse().ok())
                .unwrap_or(0);
            if let Some(netns) = &n.node_netns {
                cluster::unwire_node(c, netns, &cluster::host_veth(c, k));
            }
        }
        let _ = std::fs::remove_dir_all(node.root());
    }
    let _ = std::fs::remove_dir(dir.root().join("nodes"));
    if let Some(c) = settings.as_ref().filter(|c| c.nodes > 1) {
        cluster::unwire_node(c, &cluster::external_netns(c), &cluster::external_veth(c));
    }
    let pids = load_pids(dir);
    let grace = Duration::from_secs(3);
    let find = |n: &str| pids.iter().find(|p| p.name == n);
    if let Some(k) = find("kubelet") {
        k.stop(grace);
    }
    let daemon_alive = find("kube-ovn-daemon").is_some_and(ProcRecord::alive);
    let cni = if daemon_alive {
        crate::cni::CniRuntime::load(&dir.cni_bin_dir(), &dir.conflist()).ok()
    } else {
        None
    };
    for rec in records(dir) {
        kubelet::teardown(dir, cni.as_ref(), &rec, 1);
        remove_host_veth(&rec);
    }
    // What the daemon of a node on this machine's own namespace left in it, its masquerade and forwarding,
    // goes with the daemon and before ovs-vswitchd: a sandbox started once no ovs-vswitchd is left must not
    // see them change under it.
    if let Some(s) = settings.as_ref().filter(|s| s.node_netns.is_none()) {
        if let Some(d) = find("kube-ovn-daemon") {
            d.stop(grace);
        }
        cluster::remove_nat(s);
        if let Some(v) = &s.host_ip_forward {
            let _ = std::fs::write("/proc/sys/net/ipv4/ip_forward", v);
        }
    }
    // ovs-vswitchd's daemon first, so that its monitor does not leave it behind.
    crate::ovn::stop_monitored_vswitchd(&dir.ovn_dir(), grace);
    // Newest first: our binaries, then ovn-controller and ovs-vswitchd before the databases.
    for p in pids.iter().rev() {
        p.stop(grace);
    }
    // The datapath's shared tap is only removed when no ovs-vswitchd is left, zombies included.
    if let Some(v) = find("ovs-vswitchd") {
        v.wait_reaped(Duration::from_secs(2));
    }
    if let Some(s) = &settings {
        // Sandboxes of pods whose records were lost: the prefix is the sandbox's own.
        if let Ok(rd) = std::fs::read_dir(&s.netns_dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(&format!("{}-", s.netns_prefix)) {
                    let _ = kubeovn_netdev::delete_named_netns(&s.netns_dir, &name);
                }
            }
        }
        // A node in a namespace of its own leaves its taps there (and shares their names with the first).
        if s.node_netns.is_none() {
            crate::ovn::cleanup_taps(vec![
                s.bridge.clone(),
                s.node_nic.clone(),
                cluster::underlay_bridge(s),
            ]);
        }
    }
    for f in [dir.pids_file(), dir.kubeconfig()] {
        let _ = std::fs::remove_file(f);
    }
    let _ = std::fs::remove_dir_all(dir.pods_dir());
    let _ = std::fs::remove_dir_all(dir.root().join("run"));
    Ok(())
}

fn remove_host_veth(rec: &PodRecord) {
    if let Ok((host, _)) = kubeovn_netdev::host_nic_name(&rec.container_id, &rec.ifname) {
        cluster::delete_host_link(&host);
    }
}

/// Which member of raft database `db` (`nb` or `sb`) leads now, by its `_Server` row (`None`: none answers
/// as leader).
async fn raft_leader(dir: &StateDir, db: &str, skip: Option<usize>) -> Option<usize> {
    let name = if db == "nb" {
        "OVN_Northbound"
    } else {
        "OVN_Southbound"
    };
    for (i, stem) in crate::ovn::member_stems(db).iter().enumerate() {
        if Some(i) == skip {
            continue;
        }
        let remote = format!(
            "unix:{}",
            dir.ovn_dir().join(format!("{stem}.sock")).display()
        );
        let client = match tokio::time::timeout(
            Duration::from_millis(500),
            kubeovn_ovn::Client::connect(&remote),
        )
        .await
        {
            Ok(Ok(c)) => c,
            _ => continue,
        };
        let st = tokio::time::timeout(
            Duration::from_millis(500),
            kubeovn_ovn::session::database_status(&client, name),
        )
        .await;
        if let Ok(Ok(st)) = st {
            if st.leader && st.connected {
                return Some(i);
            }
        }
    }
    None
}

/// The socket of the leader proxy of raft database `db` (`nb` or `sb`).
pub fn leader_socket(dir: &Path, db: &str) -> PathBuf {
    dir.join(format!("{db}-leader.sock"))
}

/// The leader proxy (`up --raft` runs it in the background): a unix socket per database that always leads
/// to its raft leader, as Kube-OVN's `ovn-nb`/`ovn-sb` Services select the leader's pod. ovn-northd must
/// talk to the leader; given all three members it finds the new one only after its reconnect backoff (8 s
/// here), through this socket after one reconnect. Each connection is spliced to the member leading when it
/// was made and is closed when another member leads. Runs until the process ends.
pub async fn leader_proxy(dir: &StateDir) -> Result<(), SandboxError> {
    let mut tasks = Vec::new();
    for db in ["nb", "sb"] {
        let path = leader_socket(&dir.ovn_dir(), db);
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path)
            .map_err(|e| SandboxError::io("bind leader proxy", &path, e))?;
        let (tx, rx) = tokio::sync::watch::channel::<Option<usize>>(None);
        let d = dir.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let now = raft_leader(&d, db, None).await;
                tx.send_if_modified(|l| {
                    let changed = *l != now && now.is_some();
                    if changed {
                        *l = now;
                    }
                    changed
                });
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
        let d = dir.clone();
        tasks.push(tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut rx = rx.clone();
                let d = d.clone();
                tokio::spawn(async move {
                    let Ok(Ok(_)) =
                        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(Option::is_some))
                            .await
                    else {
                        return;
                    };
                    let Some(i) = *rx.borrow_and_update() else {
                        return;
                    };
                    let stem = crate::ovn::member_stems(db)[i];
                    let sock = d.ovn_dir().join(format!("{stem}.sock"));
                    let Ok(mut member) = tokio::net::UnixStream::connect(&sock).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut member) => {}
                        // Another member leads: the client reconnects, to it.
                        _ = rx.wait_for(|l| *l != Some(i)) => {}
                    }
                });
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    Ok(())
}

/// `kill-leader nb|sb`: SIGKILLs the raft leader of NB or SB (a crash, no leadership transfer), reports how
/// long the election of the next took, then starts the member again and waits until it is back in the
/// cluster. Returns the election time.
pub async fn kill_leader(
    dir: &StateDir,
    db: &str,
    out: &Console,
) -> Result<Duration, SandboxError> {
    let s = dir.load_settings()?;
    if !s.raft {
        return Err(failed(
            "kill-leader",
            "this sandbox runs NB and SB standalone: start it with `up --raft`",
        ));
    }
    if db != "nb" && db != "sb" {
        return Err(failed("kill-leader", format!("{db:?}: say nb or sb")));
    }
    let mut leader = None;
    let t0 = Instant::now();
    while leader.is_none() && t0.elapsed() < Duration::from_secs(10) {
        leader = raft_leader(dir, db, None).await;
        if leader.is_none() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let Some(i) = leader else {
        return Err(failed("kill-leader", format!("{db}: no member is leader")));
    };
    let stem = crate::ovn::member_stems(db)[i];
    let name = crate::ovn::server_name(stem);
    let mut pids = load_pids(dir);
    let Some(rec) = pids.iter().find(|p| p.name == name).cloned() else {
        return Err(failed("kill-leader", format!("no record of {name}")));
    };
    if let Ok(raw) = i32::try_from(rec.pid) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(raw),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    rec.wait_reaped(Duration::from_secs(2));
    let killed = Instant::now();
    out.line(&format!("{db}: killed leader {stem} (pid {})", rec.pid));
    let elected = loop {
        if let Some(j) = raft_leader(dir, db, Some(i)).await {
            let took = killed.elapsed();
            out.line(&format!(
                "{db}: {} leads after {:.0} ms",
                crate::ovn::member_stems(db)[j],
                took.as_secs_f64() * 1000.0
            ));
            break took;
        }
        if killed.elapsed() > Duration::from_secs(30) {
            return Err(failed(
                "kill-leader",
                format!("{db}: no new leader in 30 s"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The member comes back and catches up from the others.
    let back = spawn_detached(
        name,
        crate::ovn::ovsdb_server_command(&dir.ovn_dir(), stem),
        &dir.log(&format!("{stem}-restart")),
    )?;
    pids.retain(|p| p.name != name);
    pids.push(back.clone());
    save_pids(dir, &pids)?;
    let sock = dir.ovn_dir().join(format!("{stem}.sock"));
    wait_for(
        &format!("{stem} to start again"),
        Duration::from_secs(15),
        None,
        || {
            let up = std::os::unix::net::UnixStream::connect(&sock).is_ok();
            async move { up }
        },
    )
    .await?;
    out.line(&format!("{db}: {stem} started again (pid {})", back.pid));
    Ok(elected)
}

/// `status`: each process, alive or not, and the pods' sandboxes.
pub fn status(dir: &StateDir, console: &Console) -> Result<bool, SandboxError> {
    use std::fmt::Write as _;
    let pids = load_pids(dir);
    let mut out = String::new();
    if pids.is_empty() {
        let _ = writeln!(out, "no sandbox in {}", dir.root().display());
        console.write(&out);
        return Ok(false);
    }
    let mut all = true;
    let node = |d: &StateDir| d.load_settings().map(|s| s.node_name).unwrap_or_default();
    let _ = writeln!(out, "{:<12} {:<22} {:>8}  STATE", "NODE", "PROCESS", "PID");
    let nodes = dir.node_dirs();
    let recs = kubelet::all_records(dir);
    for (d, pids) in std::iter::once((dir, pids)).chain(nodes.iter().map(|d| (d, load_pids(d)))) {
        let name = node(d);
        for p in &pids {
            let alive = p.alive();
            all &= alive;
            let _ = writeln!(
                out,
                "{:<12} {:<22} {:>8}  {}",
                name,
                p.name,
                p.pid,
                if alive { "running" } else { "DEAD" }
            );
        }
    }

    let _ = writeln!(out, "\n{:<32} {:<44} IPS", "POD", "NETNS");
    for r in &recs {
        let _ = writeln!(
            out,
            "{:<32} {:<44} {}",
            format!("{}/{}", r.namespace, r.name),
            r.netns_name,
            r.ips.join(",")
        );
    }
    let _ = writeln!(out, "\nkubeconfig: {}", dir.kubeconfig().display());
    console.write(&out);
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateways() {
        assert_eq!(first_host("10.16.0.0/16").expect("ok"), "10.16.0.1");
        assert_eq!(first_host("10.66.0.7/24").expect("ok"), "10.66.0.1");
        assert!(first_host("10.0.0.0").is_err());
        assert!(first_host("10.0.0.0/31").is_err());
        assert!(first_host("x/24").is_err());
    }

    #[test]
    fn crds_are_cluster_scoped_kubeovn() {
        let c = crds();
        assert!(c.len() >= 4);
        // Kube-OVN's own, and the network-policy-api's admin policies.
        assert!(c.iter().all(|c| c["spec"]["group"] == "kubeovn.io"
            || c["spec"]["group"] == "policy.networking.k8s.io"));
        assert!(c.iter().all(|c| c["spec"]["scope"] == "Cluster"));
        assert!(c.iter().any(|c| c["spec"]["names"]["plural"] == "subnets"));
    }

    #[test]
    fn status_of_an_empty_dir() {
        let d = tempfile::tempdir().expect("tempdir");
        assert!(!status(&StateDir::new(d.path()), &Console::silent()).expect("status"));
        assert!(!is_up(&StateDir::new(d.path())));
        down(&StateDir::new(d.path())).expect("down of nothing");
    }
}
