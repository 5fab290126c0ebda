//! Runs the `nb_operator` example against a real ovsdb-server (Debian's OVN_Northbound schema) in a temporary
//! directory, while `ovn-nbctl` (an independent client) adds a port: the example must print its own changes
//! and the foreign one, and leave what it built (checked with ovn-nbctl).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kubeovn_test_support::{cargo_build, skip};

const SCHEMA: &str = "/usr/share/ovn/ovn-nb.ovsschema";

/// Whether the program runs; if not, the test is skipped ([`skip::skip`]: a failure under CI).
fn have(prog: &str) -> bool {
    let ok = skip::installed(prog);
    if !ok {
        skip::skip(&format!(
            "{prog} is not installed (apt-get install openvswitch-switch ovn-central)"
        ));
    }
    ok
}

/// Our ovsdb-server child, killed by pid when dropped.
struct Server {
    dir: tempfile::TempDir,
    child: Child,
}

impl Server {
    fn start() -> Option<Server> {
        if !have("ovsdb-server") || !have("ovn-nbctl") {
            return None;
        }
        if !Path::new(SCHEMA).exists() {
            skip::skip(&format!("{SCHEMA} missing (apt-get install ovn-central)"));
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("kubeovn-example")
            .tempdir()
            .expect("tempdir");
        let d = dir.path();
        let st = Command::new("ovsdb-tool")
            .arg("create")
            .arg(d.join("nb.db"))
            .arg(SCHEMA)
            .status()
            .expect("ovsdb-tool");
        assert!(st.success());
        let child = Command::new("ovsdb-server")
            .arg(d.join("nb.db"))
            .arg(format!("--remote=punix:{}", d.join("nb.sock").display()))
            .arg(format!("--unixctl={}", d.join("ctl").display()))
            .arg(format!("--log-file={}", d.join("log").display()))
            .arg("--no-chdir")
            .env("OVS_RUNDIR", d)
            .env("OVS_DBDIR", d)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ovsdb-server");
        let s = Server { dir, child };
        let t0 = Instant::now();
        while std::os::unix::net::UnixStream::connect(s.sock()).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "ovsdb-server did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(s)
    }

    fn sock(&self) -> PathBuf {
        self.dir.path().join("nb.sock")
    }

    fn nbctl(&self, args: &[&str]) -> String {
        let out = Command::new("ovn-nbctl")
            .arg(format!("--db=unix:{}", self.sock().display()))
            .args(args)
            .output()
            .expect("ovn-nbctl");
        assert!(
            out.status.success(),
            "ovn-nbctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The example binary, built beside this test. `cargo test` builds examples as programs, but `cargo test
/// --all-targets` builds them as test harnesses only: then build the program with the cargo that runs us.
fn example() -> PathBuf {
    static BUILD: std::sync::Once = std::sync::Once::new();
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("examples").join("nb_operator");
    BUILD.call_once(|| {
        if bin.exists() {
            return;
        }
        cargo_build::cargo_build(dir, &["-p", "kubeovn-examples", "--example", "nb_operator"]);
    });
    assert!(bin.exists(), "{} not built", bin.display());
    bin
}

#[test]
fn operator_builds_and_watches() {
    let Some(srv) = Server::start() else { return };
    let remote = format!("unix:{}", srv.sock().display());
    // 2 switch ports + the patch's switch port, 1 router port, the switch, the router: 6 inserts at least;
    // then the foreign port below: wait for more than the build gives.
    let child = Command::new(example())
        .args([remote.as_str(), "--events", "40", "--timeout", "6"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nb_operator");
    // Once the example's switch exists, an independent client adds a port to it.
    let t0 = Instant::now();
    while !srv.nbctl(&["ls-list"]).contains("demo") {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the example built nothing"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    srv.nbctl(&["lsp-add", "demo", "foreign.demo"]);
    let out = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("built: switch demo ("), "{stdout}");
    for line in [
        "event insert Logical_Switch demo",
        "event insert Logical_Router demo-router",
        "event insert Logical_Router_Port demo-router-demo",
        "event insert Logical_Switch_Port demo-demo-router",
        "event insert Logical_Switch_Port pod2.demo",
        "event insert Logical_Switch_Port pod3.demo",
        "event insert Logical_Switch_Port foreign.demo",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
    // Fewer than 40 events happen: it stops at the timeout with status 1 and says how many it saw.
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("done events="), "{stdout}");
    // What it built, seen by ovn-nbctl.
    let ports = srv.nbctl(&["lsp-list", "demo"]);
    for p in ["pod2.demo", "pod3.demo", "demo-demo-router", "foreign.demo"] {
        assert!(ports.contains(p), "{ports}");
    }
    assert!(srv
        .nbctl(&["lrp-list", "demo-router"])
        .contains("demo-router-demo"));
    assert_eq!(
        srv.nbctl(&["get", "Logical_Switch_Port", "pod2.demo", "addresses"])
            .trim(),
        "[\"0a:58:0a:63:00:02 10.99.0.2\"]"
    );
}

#[test]
fn operator_exits_after_n_events() {
    let Some(srv) = Server::start() else { return };
    let remote = format!("unix:{}", srv.sock().display());
    let out = Command::new(example())
        .args([remote.as_str(), "--events", "3", "--timeout", "20"])
        .output()
        .expect("nb_operator");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("event ")).count(),
        3,
        "{stdout}"
    );
    assert!(stdout.contains("done events=3"), "{stdout}");
    // A second run finds everything in place (idempotent) and builds nothing new.
    let again = Command::new(example())
        .args([remote.as_str(), "--events", "0"])
        .output()
        .expect("nb_operator");
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("built: switch demo (3 ports)"));
}
