//! Test harness: a private ovsdb-server in a temporary directory, stopped by pid when dropped.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The shipped schema files.
pub fn schema_path(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("schemas")
        .join(file)
}

/// Whether a program runs; prints why a test is skipped if not.
pub fn have(prog: &str) -> bool {
    let ok = Command::new(prog)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !ok {
        eprintln!(
            "SKIPPED: {prog} is not installed (apt-get install openvswitch-switch ovn-central)"
        );
    }
    ok
}

/// How the database file is created.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// `ovsdb-tool create`.
    Standalone,
    /// `ovsdb-tool create-cluster` with one member (keeps transaction history for monitor_cond_since).
    Clustered,
}

/// A running ovsdb-server, child of the test process.
pub struct OvsdbServer {
    pub dir: tempfile::TempDir,
    pub sock: PathBuf,
    pub db_name: String,
    pub tcp_port: Option<u16>,
    child: Child,
}

fn free_port() -> u16 {
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
        let mut cmd = Command::new("ovsdb-server");
        cmd.arg(format!("--remote=punix:{}", sock.display()))
            .arg(format!(
                "--pidfile={}",
                d.join("ovsdb-server.pid").display()
            ))
            .arg(format!(
                "--log-file={}",
                d.join("ovsdb-server.log").display()
            ))
            .arg(format!("--unixctl={}", d.join("x.ctl").display()))
            .arg("-vconsole:off");
        if let Some(p) = tcp_port {
            cmd.arg(format!("--remote=ptcp:{p}:127.0.0.1"));
        }
        let child = cmd
            .arg(&db)
            .env("OVS_RUNDIR", d)
            .env("OVS_LOGDIR", d)
            .env("OVS_DBDIR", d)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ovsdb-server");
        let mut s = OvsdbServer {
            dir,
            sock,
            db_name,
            tcp_port,
            child,
        };
        let t0 = Instant::now();
        while !s.sock.exists() || !s.tcp_ready() {
            if let Ok(Some(st)) = s.child.try_wait() {
                panic!("ovsdb-server exited: {st}; log:\n{}", s.log());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "ovsdb-server did not start; log:\n{}",
                s.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(s)
    }

    fn tcp_ready(&self) -> bool {
        match self.tcp_port {
            None => true,
            Some(p) => std::net::TcpStream::connect(("127.0.0.1", p)).is_ok(),
        }
    }

    /// `unix:<socket>`
    pub fn unix_remote(&self) -> String {
        format!("unix:{}", self.sock.display())
    }

    /// `tcp:127.0.0.1:<port>`, if started with TCP.
    pub fn tcp_remote(&self) -> Option<String> {
        self.tcp_port.map(|p| format!("tcp:127.0.0.1:{p}"))
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
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
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
