//! Test harness: private ovsdb-servers (standalone or a raft cluster) and ovs-vswitchd in temporary
//! directories, stopped by pid when dropped. It starts the C programs only: no kubeovn-ovn type is used here.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::skip;

/// A schema file kubeovn-ovn ships (`kubeovn-ovn/schemas/FILE`); an absolute path is taken as it is.
pub fn schema_path(file: &str) -> PathBuf {
    if Path::new(file).is_absolute() {
        return PathBuf::from(file);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../kubeovn-ovn/schemas")
        .join(file)
}

/// Whether a program runs; if not, the test is skipped ([`skip::skip`]: a failure under CI).
pub fn have(prog: &str) -> bool {
    let ok = skip::installed(prog);
    if !ok {
        skip::skip(&format!(
            "{prog} is not installed (apt-get install openvswitch-switch ovn-central)"
        ));
    }
    ok
}

/// How the database file is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// `ovsdb-tool create`.
    Standalone,
    /// `ovsdb-tool create-cluster` with one member (keeps transaction history for monitor_cond_since).
    Clustered,
}

/// A running ovsdb-server, child of the test process.
pub struct OvsdbServer {
    /// The temporary directory holding the database, socket, pid file and log.
    pub dir: tempfile::TempDir,
    /// The unix socket it listens on.
    pub sock: PathBuf,
    /// The database's name (from the schema).
    pub db_name: String,
    /// The loopback TCP port it also listens on, if started with TCP.
    pub tcp_port: Option<u16>,
    db: PathBuf,
    child: Option<Child>,
}

/// Spawns ovsdb-server in `d` (pid file, log and control socket named after the socket's file stem).
pub fn spawn_server(
    d: &Path,
    sock: &Path,
    tcp_port: Option<u16>,
    db: &Path,
    extra: &[&str],
) -> Child {
    let stem = sock
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("db")
        .to_owned();
    let log_name = if stem == "db" {
        "ovsdb-server.log".to_owned()
    } else {
        format!("{stem}.log")
    };
    let mut cmd = Command::new("ovsdb-server");
    cmd.arg(format!("--remote=punix:{}", sock.display()))
        .arg(format!(
            "--pidfile={}",
            d.join(format!("{stem}.pid")).display()
        ))
        .arg(format!("--log-file={}", d.join(log_name).display()))
        .arg(format!(
            "--unixctl={}",
            d.join(format!("{stem}.ctl")).display()
        ))
        .arg("-vconsole:off")
        .args(extra);
    if let Some(p) = tcp_port {
        cmd.arg(format!("--remote=ptcp:{p}:127.0.0.1"));
    }
    cmd.arg(db)
        .env("OVS_RUNDIR", d)
        .env("OVS_LOGDIR", d)
        .env("OVS_DBDIR", d)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ovsdb-server")
}

/// Sends `sig` to `pid` (a child of the test).
fn signal_pid(pid: u32, sig: &str) {
    assert!(pid > 0, "not running");
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(st.success());
}

/// A TCP port free on loopback now (bound and released).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

impl OvsdbServer {
    /// Starts ovsdb-server on a fresh database from `schema_file` (in `schemas/`); None (with a printed reason)
    /// when the OVS binaries are absent.
    pub fn start(schema_file: &str, storage: Storage, tcp: bool) -> Option<Self> {
        if !have("ovsdb-server") || !have("ovsdb-tool") {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("kubeovn-ovn-test")
            .tempdir()
            .expect("tempdir");
        let d = dir.path();
        let db = d.join("test.db");
        let schema = schema_path(schema_file);
        let mut create = Command::new("ovsdb-tool");
        match storage {
            Storage::Standalone => create.arg("create").arg(&db).arg(&schema),
            Storage::Clustered => create
                .arg("create-cluster")
                .arg(&db)
                .arg(&schema)
                .arg(format!("tcp:127.0.0.1:{}", free_port())),
        };
        let out = create
            .env("OVS_RUNDIR", d)
            .env("OVS_DBDIR", d)
            .output()
            .expect("ovsdb-tool");
        assert!(
            out.status.success(),
            "ovsdb-tool: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let db_name = String::from_utf8(
            Command::new("ovsdb-tool")
                .arg("schema-name")
                .arg(&schema)
                .output()
                .expect("schema-name")
                .stdout,
        )
        .expect("utf8")
        .trim()
        .to_owned();
        let sock = d.join("db.sock");
        let tcp_port = tcp.then(free_port);
        let child = spawn_server(d, &sock, tcp_port, &db, &[]);
        let mut s = OvsdbServer {
            dir,
            sock,
            db_name,
            tcp_port,
            db,
            child: Some(child),
        };
        s.wait_ready();
        Some(s)
    }

    fn wait_ready(&mut self) {
        let t0 = Instant::now();
        while std::os::unix::net::UnixStream::connect(&self.sock).is_err() || !self.tcp_ready() {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!("ovsdb-server exited: {st}; log:\n{}", self.log());
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "ovsdb-server did not start; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL (our own child, by pid) and reap it; the socket file stays behind.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same socket and database file.
    pub fn restart(&mut self) {
        self.kill9();
        let d = self.dir.path().to_owned();
        self.child = Some(spawn_server(&d, &self.sock, self.tcp_port, &self.db, &[]));
        self.wait_ready();
    }

    fn tcp_ready(&self) -> bool {
        match self.tcp_port {
            None => true,
            Some(p) => std::net::TcpStream::connect(("127.0.0.1", p)).is_ok(),
        }
    }

    /// Starts ovs-vswitchd on this (Open_vSwitch) database with the dummy datapath and netdevs only
    /// (`--enable-dummy=override --disable-system`: no kernel object is created); stopped when dropped.
    pub fn start_vswitchd(&self) -> Option<Vswitchd> {
        if !have("ovs-vswitchd") {
            return None;
        }
        let d = self.dir.path();
        let child = Command::new("ovs-vswitchd")
            .arg(self.unix_remote())
            .arg("--enable-dummy=override")
            .arg("--disable-system")
            .arg(format!("--pidfile={}", d.join("vswitchd.pid").display()))
            .arg(format!("--unixctl={}", d.join("vswitchd.ctl").display()))
            .arg(format!("--log-file={}", d.join("vswitchd.log").display()))
            .arg("-vconsole:off")
            .env("OVS_RUNDIR", d)
            .env("OVS_LOGDIR", d)
            .env("OVS_DBDIR", d)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ovs-vswitchd");
        Some(Vswitchd { child })
    }

    /// `unix:<socket>`
    pub fn unix_remote(&self) -> String {
        format!("unix:{}", self.sock.display())
    }

    /// `tcp:127.0.0.1:<port>`, if started with TCP.
    pub fn tcp_remote(&self) -> Option<String> {
        self.tcp_port.map(|p| format!("tcp:127.0.0.1:{p}"))
    }

    /// The server's pid (0 when killed).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Sends `sig` (`STOP`, `CONT`) to the server, our own child, by pid.
    pub fn signal(&self, sig: &str) {
        signal_pid(self.pid(), sig);
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ovsdb-server.log")).unwrap_or_default()
    }

    /// Runs a C client (`ovn-nbctl`, `ovs-vsctl`, ...) with `--db=unix:SOCK` first; panics on failure.
    pub fn ctl(&self, prog: &str, args: &[&str]) -> String {
        let out = Command::new(prog)
            .arg(format!("--db={}", self.unix_remote()))
            .args(args)
            .env("OVS_RUNDIR", self.dir.path())
            .env("OVN_RUNDIR", self.dir.path())
            .output()
            .unwrap_or_else(|e| panic!("{prog}: {e}"));
        assert!(
            out.status.success(),
            "{prog} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for OvsdbServer {
    fn drop(&mut self) {
        // Our own child, by pid: no other process is touched.
        self.kill9();
    }
}

/// A raft cluster of `n` ovsdb-servers (one database), each on its own unix socket in one temporary directory.
pub struct Cluster {
    /// The temporary directory holding every member's database, socket and log.
    pub dir: tempfile::TempDir,
    /// The database's name (from the schema).
    pub db_name: String,
    /// Member i's unix socket.
    pub socks: Vec<PathBuf>,
    dbs: Vec<PathBuf>,
    children: Vec<Option<Child>>,
}

impl Cluster {
    /// Creates the cluster (`ovsdb-tool create-cluster`, then `join-cluster` for the others), starts every
    /// member and waits until all of them are cluster members. None without the OVS binaries.
    pub fn start(schema_file: &str, n: usize) -> Option<Self> {
        if !have("ovsdb-server") || !have("ovsdb-tool") || !have("ovs-appctl") {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("kubeovn-ovn-raft")
            .tempdir()
            .expect("tempdir");
        let d = dir.path().to_owned();
        let schema = schema_path(schema_file);
        let db_name = String::from_utf8(
            Command::new("ovsdb-tool")
                .arg("schema-name")
                .arg(&schema)
                .output()
                .expect("schema-name")
                .stdout,
        )
        .expect("utf8")
        .trim()
        .to_owned();
        let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let mut dbs = Vec::new();
        let mut socks = Vec::new();
        for i in 0..n {
            let db = d.join(format!("s{i}.db"));
            let local = format!("tcp:127.0.0.1:{}", ports[i]);
            let mut c = Command::new("ovsdb-tool");
            if i == 0 {
                c.arg("create-cluster").arg(&db).arg(&schema).arg(&local);
            } else {
                c.arg("join-cluster")
                    .arg(&db)
                    .arg(&db_name)
                    .arg(&local)
                    .arg(format!("tcp:127.0.0.1:{}", ports[0]));
            }
            let out = c.env("OVS_RUNDIR", &d).output().expect("ovsdb-tool");
            assert!(
                out.status.success(),
                "ovsdb-tool: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            dbs.push(db);
            socks.push(d.join(format!("s{i}.sock")));
        }
        let children = (0..n)
            .map(|i| Some(spawn_server(&d, &socks[i], None, &dbs[i], &[])))
            .collect();
        let c = Cluster {
            dir,
            db_name,
            socks,
            dbs,
            children,
        };
        let t0 = Instant::now();
        for i in 0..n {
            while !c.status(i).contains("Status: cluster member") {
                assert!(
                    t0.elapsed() < Duration::from_secs(20),
                    "member {i} did not join: {}",
                    c.status(i)
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Some(c)
    }

    /// `unix:<sock i>`
    pub fn remote(&self, i: usize) -> String {
        format!("unix:{}", self.socks[i].display())
    }

    /// Every member, comma-separated.
    pub fn remotes(&self) -> String {
        (0..self.socks.len())
            .map(|i| self.remote(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `ovs-appctl cluster/status` of member i ("" if it does not answer).
    pub fn status(&self, i: usize) -> String {
        let ctl = self.dir.path().join(format!("s{i}.ctl"));
        Command::new("ovs-appctl")
            .arg("-t")
            .arg(ctl)
            .arg("cluster/status")
            .arg(&self.db_name)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// The member that is leader now, waiting up to 20 s for an election.
    pub fn leader(&self) -> usize {
        let t0 = Instant::now();
        loop {
            for i in 0..self.socks.len() {
                if self.children[i].is_some() && self.status(i).contains("Role: leader") {
                    return i;
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "no leader");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The pid of member i (0 if killed).
    pub fn pid(&self, i: usize) -> u32 {
        self.children[i].as_ref().map_or(0, Child::id)
    }

    /// SIGKILL member i (our own child, by pid).
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `sig` (`STOP`, `CONT`) to member i, our own child, by pid.
    pub fn signal(&self, i: usize, sig: &str) {
        signal_pid(self.pid(i), sig);
    }

    /// Starts member i again on its socket and database.
    pub fn restart(&mut self, i: usize) {
        self.kill9(i);
        let d = self.dir.path().to_owned();
        self.children[i] = Some(spawn_server(&d, &self.socks[i], None, &self.dbs[i], &[]));
        let t0 = Instant::now();
        while std::os::unix::net::UnixStream::connect(&self.socks[i]).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(10), "restart {i}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Runs a C client with `--db=<every live member>`; panics on failure.
    pub fn ctl(&self, prog: &str, args: &[&str]) -> String {
        let live: Vec<String> = (0..self.socks.len())
            .filter(|i| self.children[*i].is_some())
            .map(|i| self.remote(i))
            .collect();
        let out = Command::new(prog)
            .arg(format!("--db={}", live.join(",")))
            .args(args)
            .env("OVS_RUNDIR", self.dir.path())
            .env("OVN_RUNDIR", self.dir.path())
            .output()
            .unwrap_or_else(|e| panic!("{prog}: {e}"));
        assert!(
            out.status.success(),
            "{prog} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.kill9(i);
        }
    }
}

/// A running ovs-vswitchd, child of the test process, killed by pid when dropped.
pub struct Vswitchd {
    child: Child,
}

impl Drop for Vswitchd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
