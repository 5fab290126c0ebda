//! A single-node OVN in one directory: NB and SB ovsdb-servers, ovn-northd, an Open_vSwitch ovsdb-server,
//! ovs-vswitchd on the userspace datapath and ovn-controller, each with its own socket, pid file, log and
//! control socket under the directory, so several stacks can run side by side.
//!
//! The processes are children of this process, stopped by pid (SIGTERM, then SIGKILL) by [`OvnStack::stop`]
//! or on drop; the tap devices the userspace datapath leaves behind (the bridge's own port, internal ports)
//! are deleted afterwards. Chassis settings and the integration bridge go through kubeovn-ovn's
//! [`OvsdbOpenVSwitch`], not `ovs-vsctl`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kubeovn_ovn_stack::SandboxError> {
//! use kubeovn_ovn_stack::ovn::{OvnOptions, OvnStack};
//! let dir = std::path::Path::new("/tmp/ovn-demo");
//! let stack = OvnStack::start(dir, OvnOptions::new("br-demo")).await?;
//! println!("NB at {}, OVS at {}", stack.nb_remote(), stack.ovs_remote());
//! stack.stop();
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kubeovn_ovn::ops::{Operation, Transaction};
use kubeovn_ovn::vswitch::{BridgeSpec, GlobalSpec, OpenVSwitch, OvsBatch, OvsdbOpenVSwitch};
use kubeovn_ovn::Client;

use crate::cgroup::CpuGroup;
use crate::SandboxError;

/// The Open_vSwitch schema Debian installs.
pub const VSWITCH_SCHEMA: &str = "/usr/share/openvswitch/vswitch.ovsschema";
/// The OVN northbound schema.
pub const NB_SCHEMA: &str = "/usr/share/ovn/ovn-nb.ovsschema";
/// The OVN southbound schema.
pub const SB_SCHEMA: &str = "/usr/share/ovn/ovn-sb.ovsschema";

/// What to start and how.
#[derive(Debug, Clone)]
pub struct OvnOptions {
    /// The integration bridge (`external_ids:ovn-bridge`); unique per stack when stacks run side by side.
    pub bridge: String,
    /// The chassis name (`external_ids:system-id`).
    pub system_id: String,
    /// `ovn-encap-ip`.
    pub encap_ip: String,
    /// `ovn-encap-type`.
    pub encap_type: String,
    /// Bridge datapath type: `netdev` (userspace) where there is no OVS kernel module.
    pub datapath_type: String,
    /// Start ovs-vswitchd and ovn-controller (false: only NB, SB and northd, for control-plane tests).
    pub chassis: bool,
    /// Start NB, SB and ovn-northd (false: a chassis of a cluster whose southbound is `sb_remote`).
    pub central: bool,
    /// The southbound database ovn-controller joins when this stack has none of its own.
    pub sb_remote: Option<String>,
    /// The network namespace the processes run in (a node of its own on this machine); `None`: this
    /// process's. Its tap devices go with the namespace.
    pub netns: Option<PathBuf>,
    /// NB and SB as raft clusters of [`RAFT_MEMBERS`] ovsdb-servers each (members talk raft over loopback
    /// TCP; clients reach every member's unix socket).
    pub raft: bool,
    /// The NB and SB remotes ovn-northd is given (`None`: the stack's own).
    pub northd_remotes: Option<(String, String)>,
    /// Write the chassis settings and create the bridge (false leaves that to the caller, e.g. the daemon).
    pub configure_chassis: bool,
    /// How long to wait for each process to come up.
    pub start_timeout: Duration,
    /// Run each part in a CPU cgroup of its own, as on a node ([`crate::cgroup`]): `<prefix>-ovn-central`
    /// (NB, SB, ovn-northd) and `<prefix>-ovs-ovn` (the Open_vSwitch database, ovs-vswitchd, ovn-controller),
    /// like Kube-OVN's pods of those names. `None`: the processes stay in this process's group.
    pub cgroup_prefix: Option<String>,
}

impl OvnOptions {
    /// A full stack with integration bridge `bridge`, chassis `sandbox-<bridge>`, geneve on 127.0.0.1.
    pub fn new(bridge: impl Into<String>) -> Self {
        let bridge = bridge.into();
        OvnOptions {
            system_id: format!("sandbox-{bridge}"),
            bridge,
            encap_ip: "127.0.0.1".into(),
            encap_type: "geneve".into(),
            datapath_type: "netdev".into(),
            chassis: true,
            central: true,
            sb_remote: None,
            netns: None,
            raft: false,
            northd_remotes: None,
            configure_chassis: true,
            start_timeout: Duration::from_secs(15),
            cgroup_prefix: None,
        }
    }

    /// Each part in a CPU cgroup of its own, named `<prefix>-ovn-central` and `<prefix>-ovs-ovn`.
    pub fn in_cgroups(mut self, prefix: impl Into<String>) -> Self {
        self.cgroup_prefix = Some(prefix.into());
        self
    }

    /// NB, SB and ovn-northd only.
    pub fn central_only(mut self) -> Self {
        self.chassis = false;
        self.configure_chassis = false;
        self
    }

    /// A chassis of the cluster whose southbound database is `sb_remote`: the Open_vSwitch database,
    /// ovs-vswitchd and ovn-controller only, in network namespace `netns` if given.
    pub fn chassis_of(mut self, sb_remote: impl Into<String>, netns: Option<PathBuf>) -> Self {
        self.central = false;
        self.sb_remote = Some(sb_remote.into());
        self.netns = netns;
        self
    }

    /// Leaves the chassis settings and bridge to the caller (ovn-controller still starts).
    pub fn without_chassis_config(mut self) -> Self {
        self.configure_chassis = false;
        self
    }
}

struct Proc {
    name: &'static str,
    stem: String,
    child: Child,
}

/// A running stack; [`OvnStack::stop`] (or drop) stops its processes.
pub struct OvnStack {
    dir: PathBuf,
    opts: OvnOptions,
    procs: Mutex<Vec<Proc>>,
    taps: Mutex<Vec<String>>,
    /// `ovn-central` and `ovs-ovn`, when asked for; removed once the processes are stopped.
    groups: Mutex<Vec<(&'static str, CpuGroup)>>,
}

impl std::fmt::Debug for OvnStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OvnStack")
            .field("dir", &self.dir)
            .field("bridge", &self.opts.bridge)
            .finish()
    }
}

// The socket names are the state directory's format: kubectl-ko and the monitor find them there too.
pub use kubeovn_sandbox_state::{member_stems, remotes, server_name, RAFT_MEMBERS};

/// The command that starts the ovsdb-server of `stem` in `dir` (as the stack starts it): to start a stopped
/// raft member again.
pub fn ovsdb_server_command(dir: &Path, stem: &str) -> Command {
    let mut cmd = Command::new("ovsdb-server");
    cmd.arg(format!(
        "--remote=punix:{}",
        dir.join(format!("{stem}.sock")).display()
    ))
    .arg(dir.join(format!("{stem}.db")))
    .arg(format!(
        "--unixctl={}",
        dir.join(format!("{stem}.ctl")).display()
    ))
    .arg(format!(
        "--pidfile={}",
        dir.join(format!("{stem}.pid")).display()
    ))
    .arg(format!(
        "--log-file={}",
        dir.join(format!("{stem}.log")).display()
    ))
    .arg("-vconsole:off")
    .env("OVS_RUNDIR", dir)
    .env("OVS_LOGDIR", dir)
    .env("OVS_DBDIR", dir);
    cmd
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// Stops the ovs-vswitchd daemon that runs under its `--monitor` in `dir` (named by its pid file: the recorded
/// pid is the monitor's, and the daemon is a new process after each restart); the monitor then exits by itself
/// instead of leaving the daemon behind.
pub fn stop_monitored_vswitchd(dir: &Path, grace: Duration) {
    if let Some(d) =
        kubeovn_sandbox_state::procs::from_pidfile(&dir.join("vswitchd.pid"), "ovs-vswitchd")
    {
        d.stop(grace);
    }
}

fn have(prog: &str) -> bool {
    Command::new(prog)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Whether the OVN/OVS programs this module starts are installed (`None`), or which one is missing.
pub fn missing_programs() -> Option<&'static str> {
    [
        "ovsdb-tool",
        "ovsdb-server",
        "ovs-vswitchd",
        "ovn-northd",
        "ovn-controller",
    ]
    .into_iter()
    .find(|p| !have(p))
}

impl OvnStack {
    /// Creates the databases in `dir` (created if needed; existing databases are recreated) and starts the
    /// processes, waiting until each answers. On failure, whatever was started is stopped.
    pub async fn start(dir: &Path, opts: OvnOptions) -> Result<OvnStack, SandboxError> {
        if let Some(p) = missing_programs() {
            return Err(SandboxError::Missing(p));
        }
        std::fs::create_dir_all(dir).map_err(|e| SandboxError::io("create state dir", dir, e))?;
        let stack = OvnStack {
            dir: dir.to_owned(),
            opts,
            procs: Mutex::new(Vec::new()),
            taps: Mutex::new(Vec::new()),
            groups: Mutex::new(Vec::new()),
        };
        if let Some(prefix) = &stack.opts.cgroup_prefix {
            let mut groups = stack.groups.lock().unwrap_or_else(|e| e.into_inner());
            for part in ["ovn-central", "ovs-ovn"] {
                groups.push((part, CpuGroup::create(&format!("{prefix}-{part}"))?));
            }
        }
        // Drop stops what was started if a later step fails.
        stack.start_all().await?;
        Ok(stack)
    }

    async fn start_all(&self) -> Result<(), SandboxError> {
        let mut dbs: Vec<(&'static str, &str)> = Vec::new();
        if self.opts.central {
            let members = if self.opts.raft { RAFT_MEMBERS } else { 1 };
            for (db, schema) in [("nb", NB_SCHEMA), ("sb", SB_SCHEMA)] {
                let stems = member_stems(db);
                if self.opts.raft {
                    self.create_cluster(&stems[..members], schema)?;
                }
                dbs.extend(stems[..members].iter().map(|s| (*s, schema)));
            }
        }
        if self.opts.chassis {
            dbs.push(("ovs", VSWITCH_SCHEMA));
        }
        for (stem, schema) in &dbs {
            let db = self.dir.join(format!("{stem}.db"));
            if !(self.opts.raft && *stem != "ovs") {
                let _ = std::fs::remove_file(&db);
                self.run_tool(
                    Command::new("ovsdb-tool")
                        .arg("create")
                        .arg(&db)
                        .arg(schema),
                    "ovsdb-tool create",
                )?;
            }
            let mut cmd = Command::new("ovsdb-server");
            cmd.arg(format!("--remote=punix:{}", self.sock(stem).display()))
                .arg(&db);
            self.spawn(server_name(stem), stem, cmd)?;
        }
        for (stem, _) in &dbs {
            self.wait_socket(&self.sock(stem)).await?;
        }
        if self.opts.raft && self.opts.central {
            // Clients start once every member has joined its cluster: ovn-controller 23.03 given a member
            // that has not yet joined was seen to crash (SIGSEGV) moments later.
            for (stem, schema) in dbs.iter().filter(|(s, _)| *s != "ovs") {
                self.wait_joined(stem, schema).await?;
            }
        }
        if self.opts.central {
            let (nb, sb) = self
                .opts
                .northd_remotes
                .clone()
                .unwrap_or_else(|| (self.nb_remote(), self.sb_remote()));
            let mut northd = Command::new("ovn-northd");
            northd
                .arg(format!("--ovnnb-db={nb}"))
                .arg(format!("--ovnsb-db={sb}"));
            self.spawn("ovn-northd", "northd", northd)?;
        }
        if !self.opts.chassis {
            return Ok(());
        }
        // The Open_vSwitch root row, as `ovs-vsctl init` makes it.
        let client = Client::connect(&self.ovs_remote())
            .await
            .map_err(SandboxError::ovsdb)?;
        client
            .transact(&Transaction::new("Open_vSwitch").op(Operation::insert("Open_vSwitch")))
            .await
            .map_err(SandboxError::ovsdb)?;
        let mut vswitchd = Command::new("ovs-vswitchd");
        // Restarted by its monitor if it crashes, as OVS runs in production (OVS 3.1's userspace conntrack
        // has aborted here: see `no_zero_snat`).
        vswitchd.arg(self.ovs_remote()).arg("--monitor");
        self.spawn("ovs-vswitchd", "vswitchd", vswitchd)?;
        if self.opts.configure_chassis {
            let ovs = OvsdbOpenVSwitch::with_client(client)
                .await
                .map_err(SandboxError::ovsdb)?;
            self.configure(&ovs).await?;
        }
        let mut controller = Command::new("ovn-controller");
        controller.arg(self.ovs_remote());
        self.spawn("ovn-controller", "controller", controller)?;
        if self.opts.configure_chassis {
            self.wait_chassis().await?;
        }
        // Only on a chassis this stack configures: elsewhere the caller sets the bridge up later.
        if self.opts.configure_chassis && self.opts.datapath_type == "netdev" {
            self.no_zero_snat().await?;
        }
        Ok(())
    }

    /// Stops ovn-controller committing connections with an all-zero SNAT (`ct_commit` as `ct(commit,
    /// nat(src))`) on this userspace datapath: OVS 3.1's userspace conntrack keeps an un-NAT entry for each
    /// such commit under the reply's own key, and a reply that meets it first aborts ovs-vswitchd
    /// (`conntrack.c:1063: assertion conn->conn_type == CT_CONN_TYPE_DEFAULT failed`), which every connection a
    /// stateful ACL allows risks. ovn-controller takes the feature from the datapath's `capabilities`, which
    /// ovs-vswitchd writes once, when they are empty (they stay as set here across its restarts).
    async fn no_zero_snat(&self) -> Result<(), SandboxError> {
        use kubeovn_ovn::ops::OperationResult;
        use kubeovn_ovn::Datum;
        let ovs = Client::connect(&self.ovs_remote())
            .await
            .map_err(SandboxError::ovsdb)?;
        let t0 = Instant::now();
        loop {
            let txn = Transaction::new("Open_vSwitch").op(Operation::select("Datapath"));
            let written = match ovs
                .transact(&txn)
                .await
                .map_err(SandboxError::ovsdb)?
                .first()
            {
                Some(OperationResult::Select(rows)) => rows.iter().any(|r| {
                    r.get("capabilities")
                        .and_then(Datum::as_map)
                        .is_some_and(|m| m.iter().any(|(k, _)| k.as_str() == Some("ct_zero_snat")))
                }),
                _ => false,
            };
            if written {
                break;
            }
            self.check_alive()?;
            if t0.elapsed() > self.opts.start_timeout {
                return Err(SandboxError::Timeout {
                    what: "the datapath's capabilities in the Open_vSwitch database".into(),
                    log: self.log_tail("vswitchd"),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let txn = Transaction::new("Open_vSwitch").op(Operation::mutate("Datapath")
            .delete("capabilities", Datum::set(["ct_zero_snat"]))
            .insert("capabilities", Datum::map([("ct_zero_snat", "false")])));
        ovs.transact(&txn).await.map_err(SandboxError::ovsdb)?;
        Ok(())
    }

    /// Writes the chassis settings (`system-id`, `ovn-remote`, encap, `ovn-bridge`, its datapath type) and
    /// creates the integration bridge (fail mode secure).
    pub async fn configure(&self, ovs: &dyn OpenVSwitch) -> Result<(), SandboxError> {
        let o = &self.opts;
        let mut b = OvsBatch::new();
        b.add(
            GlobalSpec::new()
                .external_id("system-id", &o.system_id)
                .external_id("ovn-remote", self.sb_remote())
                .external_id("ovn-encap-type", &o.encap_type)
                .external_id("ovn-encap-ip", &o.encap_ip)
                .external_id("ovn-bridge", &o.bridge)
                .external_id("ovn-bridge-datapath-type", &o.datapath_type),
        );
        b.add(
            BridgeSpec::new(&o.bridge)
                .datapath_type(&o.datapath_type)
                .fail_mode(kubeovn_ovn::vswitch::BridgeFailMode::Secure),
        );
        ovs.commit(b).await.map_err(SandboxError::ovsdb)?;
        Ok(())
    }

    /// Waits until ovn-controller has registered the chassis in the southbound database.
    pub async fn wait_chassis(&self) -> Result<(), SandboxError> {
        let sb = Client::connect(&self.sb_remote())
            .await
            .map_err(SandboxError::ovsdb)?;
        let t0 = Instant::now();
        loop {
            let txn = Transaction::new("OVN_Southbound").op(Operation::select("Chassis"));
            let res = sb.transact(&txn).await.map_err(SandboxError::ovsdb)?;
            let found = match res.first() {
                Some(kubeovn_ovn::ops::OperationResult::Select(rows)) => rows.iter().any(|r| {
                    r.get("name").and_then(|d| d.as_str()) == Some(self.opts.system_id.as_str())
                }),
                _ => false,
            };
            if found {
                return Ok(());
            }
            self.check_alive()?;
            if t0.elapsed() > self.opts.start_timeout {
                return Err(SandboxError::Timeout {
                    what: format!("chassis {} in the southbound database", self.opts.system_id),
                    log: self.log_tail("controller"),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until raft member `stem` reports itself connected to its cluster (`_Server`'s `connected`).
    async fn wait_joined(&self, stem: &str, schema: &str) -> Result<(), SandboxError> {
        let name = if schema == NB_SCHEMA {
            "OVN_Northbound"
        } else {
            "OVN_Southbound"
        };
        let remote = format!("unix:{}", self.sock(stem).display());
        let t0 = Instant::now();
        loop {
            if let Ok(c) = Client::connect(&remote).await {
                if kubeovn_ovn::session::database_status(&c, name)
                    .await
                    .is_ok_and(|st| st.connected)
                {
                    return Ok(());
                }
            }
            self.check_alive()?;
            if t0.elapsed() > self.opts.start_timeout {
                return Err(SandboxError::Timeout {
                    what: format!("raft member {stem} to join its cluster"),
                    log: self.log_tail(stem),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Creates the raft cluster of one database: the first member's file with `ovsdb-tool create-cluster`,
    /// the others' with `join-cluster` (each with a loopback TCP address of its own for raft).
    fn create_cluster(&self, stems: &[&str], schema: &str) -> Result<(), SandboxError> {
        let name = if schema == NB_SCHEMA {
            "OVN_Northbound"
        } else {
            "OVN_Southbound"
        };
        let ports: Vec<u16> = stems.iter().map(|_| free_tcp_port()).collect();
        for (i, stem) in stems.iter().enumerate() {
            let db = self.dir.join(format!("{stem}.db"));
            let _ = std::fs::remove_file(&db);
            let local = format!("tcp:127.0.0.1:{}", ports[i]);
            let mut c = Command::new("ovsdb-tool");
            if i == 0 {
                c.arg("create-cluster").arg(&db).arg(schema).arg(&local);
            } else {
                c.arg("join-cluster")
                    .arg(&db)
                    .arg(name)
                    .arg(&local)
                    .arg(format!("tcp:127.0.0.1:{}", ports[0]));
            }
            self.run_tool(&mut c, "ovsdb-tool create-cluster/join-cluster")?;
        }
        Ok(())
    }

    fn run_tool(&self, cmd: &mut Command, what: &'static str) -> Result<(), SandboxError> {
        let out = cmd
            .env("OVS_RUNDIR", &self.dir)
            .env("OVS_DBDIR", &self.dir)
            .output()
            .map_err(|e| SandboxError::io(what, &self.dir, e))?;
        if !out.status.success() {
            return Err(SandboxError::Failed {
                what,
                detail: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(())
    }

    fn spawn(&self, name: &'static str, stem: &str, mut cmd: Command) -> Result<(), SandboxError> {
        let d = &self.dir;
        // ovn-controller 23.03 refuses --unixctl (its help lists it): OVN_RUNDIR places its control socket.
        if !name.starts_with("ovn-") {
            cmd.arg(format!(
                "--unixctl={}",
                d.join(format!("{stem}.ctl")).display()
            ));
        }
        cmd.arg(format!(
            "--pidfile={}",
            d.join(format!("{stem}.pid")).display()
        ))
        .arg(format!(
            "--log-file={}",
            d.join(format!("{stem}.log")).display()
        ))
        .arg("-vconsole:off")
        .env("OVS_RUNDIR", d)
        .env("OVS_LOGDIR", d)
        .env("OVS_DBDIR", d)
        .env("OVN_RUNDIR", d)
        .env("OVN_LOGDIR", d)
        .env("OVN_DBDIR", d)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if let Some(ns) = &self.opts.netns {
            // nsenter execs the program itself: the pid stays the program's.
            let mut inner = Command::new("nsenter");
            inner
                .arg(format!("--net={}", ns.display()))
                .arg("--")
                .arg(cmd.get_program())
                .args(cmd.get_args());
            for (k, v) in cmd.get_envs() {
                if let Some(v) = v {
                    inner.env(k, v);
                }
            }
            inner
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            cmd = inner;
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| SandboxError::io("spawn", Path::new(name), e))?;
        // Moved right after the start, before it does any work worth scheduling.
        let part = if matches!(stem, "nb" | "sb" | "northd") {
            "ovn-central"
        } else {
            "ovs-ovn"
        };
        let groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        let moved = groups
            .iter()
            .find(|(p, _)| *p == part)
            .map(|(_, g)| g.add(child.id()));
        drop(groups);
        if let Some(Err(e)) = moved {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        self.procs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Proc {
                name,
                stem: stem.to_owned(),
                child,
            });
        Ok(())
    }

    async fn wait_socket(&self, sock: &Path) -> Result<(), SandboxError> {
        let t0 = Instant::now();
        while std::os::unix::net::UnixStream::connect(sock).is_err() {
            self.check_alive()?;
            if t0.elapsed() > self.opts.start_timeout {
                return Err(SandboxError::Timeout {
                    what: format!("socket {}", sock.display()),
                    log: String::new(),
                });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// An error if one of the processes has exited.
    pub fn check_alive(&self) -> Result<(), SandboxError> {
        let mut procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        for p in procs.iter_mut() {
            if let Ok(Some(st)) = p.child.try_wait() {
                return Err(SandboxError::Exited {
                    name: p.name,
                    status: format!("{st}\n{}", self.log_tail(&p.stem)),
                });
            }
        }
        Ok(())
    }

    fn log_tail(&self, stem: &str) -> String {
        let s = std::fs::read_to_string(self.dir.join(format!("{stem}.log"))).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn sock(&self, stem: &str) -> PathBuf {
        self.dir.join(format!("{stem}.sock"))
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The options the stack was started with.
    pub fn options(&self) -> &OvnOptions {
        &self.opts
    }

    /// The integration bridge.
    pub fn bridge(&self) -> &str {
        &self.opts.bridge
    }

    /// `unix:<dir>/nb.sock` (every member's socket, comma-separated, with raft).
    pub fn nb_remote(&self) -> String {
        remotes(&self.dir, "nb", self.opts.raft)
    }

    /// `unix:<dir>/sb.sock` (every member's with raft), or the cluster's southbound of a chassis-only stack.
    pub fn sb_remote(&self) -> String {
        match &self.opts.sb_remote {
            Some(r) => r.clone(),
            None => remotes(&self.dir, "sb", self.opts.raft),
        }
    }

    /// `unix:<dir>/ovs.sock` (the Open_vSwitch database).
    pub fn ovs_remote(&self) -> String {
        format!("unix:{}", self.sock("ovs").display())
    }

    /// The pids of the running processes, by name.
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        self.procs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|p| (p.name, p.child.id()))
            .collect()
    }

    /// Stops the processes (newest first: ovn-controller and ovs-vswitchd before the databases) by pid, then
    /// deletes the tap devices the userspace datapath leaves. Idempotent.
    pub fn stop(&self) {
        let procs: Vec<Proc> =
            std::mem::take(&mut *self.procs.lock().unwrap_or_else(|e| e.into_inner()));
        let had_vswitchd = procs.iter().any(|p| p.name == "ovs-vswitchd");
        if had_vswitchd {
            stop_monitored_vswitchd(&self.dir, Duration::from_secs(3));
        }
        for mut p in procs.into_iter().rev() {
            stop_child(&mut p.child);
        }
        self.groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        // In a namespace of its own, the taps go with it (and the names may be the machine's too).
        if had_vswitchd && self.opts.netns.is_none() {
            let mut names = vec![self.opts.bridge.clone()];
            names.append(&mut self.taps.lock().unwrap_or_else(|e| e.into_inner()));
            cleanup_taps(names);
        }
    }

    /// Leaves the processes running (they outlive this process: the sandbox's `up` returns while they run)
    /// and returns their pids; the stack no longer stops them, whoever has the pids does. Its CPU cgroups
    /// are given up: the processes go back to the root group.
    pub fn detach(self) -> Vec<(&'static str, u32)> {
        let procs: Vec<Proc> =
            std::mem::take(&mut *self.procs.lock().unwrap_or_else(|e| e.into_inner()));
        procs.iter().map(|p| (p.name, p.child.id())).collect()
    }

    /// Also deletes tap `name` on [`OvnStack::stop`]: an internal port (like `ovn0`) added to the bridge.
    pub fn cleanup_on_stop(&self, name: impl Into<String>) {
        self.taps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(name.into());
    }
}

impl Drop for OvnStack {
    fn drop(&mut self) {
        self.stop();
    }
}

fn stop_child(child: &mut Child) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let Ok(raw) = i32::try_from(child.id()) else {
        return;
    };
    let _ = kill(Pid::from_raw(raw), Signal::SIGTERM);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Whether another ovs-vswitchd runs on the machine (then the shared `ovs-netdev` tap is its too).
fn other_vswitchd_running() -> bool {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return true;
    };
    rd.flatten().any(|e| {
        e.file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
            && std::fs::read_to_string(e.path().join("comm"))
                .map(|c| c.trim() == "ovs-vswitchd")
                .unwrap_or(false)
    })
}

/// Deletes the taps ovs-vswitchd's userspace datapath left (`names`: bridges, internal ports), and
/// `ovs-netdev` when no other ovs-vswitchd uses it.
pub fn cleanup_taps(mut names: Vec<String>) {
    if !other_vswitchd_running() {
        names.push("ovs-netdev".into());
    }
    // stop() may run inside a tokio runtime (a test's drop).
    crate::block_on_thread(async move {
        use kubeovn_netdev::Netdev;
        let Ok(host) = kubeovn_netdev::NetlinkNetdev::current() else {
            return;
        };
        for n in names {
            if let Ok(Some(l)) = host.link(&n).await {
                if l.kind.as_deref() == Some("tun") {
                    let _ = host.delete_link(&n).await;
                }
            }
        }
    });
}
