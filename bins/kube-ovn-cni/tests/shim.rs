//! The shim exec'd as a runtime does (CNI_* environment, configuration on stdin) against a fake daemon
//! on a unix socket in a temporary directory.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const SHIM: &str = env!("CARGO_BIN_EXE_kube-ovn");

/// What the fake daemon does with a request: answer (status, body), or never answer.
enum Reply {
    Answer(u16, String),
    Hang,
}

type Handler = Box<dyn Fn(&str, &Value) -> Reply + Send + Sync>;

/// A fake kube-ovn daemon: records each request (path, JSON body) and answers through its handler.
struct FakeDaemon {
    sock: PathBuf,
    requests: Arc<Mutex<Vec<(String, Value)>>>,
}

fn read_request(s: &mut UnixStream) -> Option<(String, Value)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let path = head.split(' ').nth(1)?.to_owned();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = buf[end + 4..].to_vec();
    while body.len() < len {
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some((path, serde_json::from_slice(&body).ok()?))
}

impl FakeDaemon {
    fn start(dir: &Path, handler: Handler) -> FakeDaemon {
        let sock = dir.join("daemon.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let rec = requests.clone();
        std::thread::spawn(move || {
            let mut hung = Vec::new();
            for conn in listener.incoming() {
                let Ok(mut s) = conn else { continue };
                let Some((path, body)) = read_request(&mut s) else {
                    continue;
                };
                let reply = handler(&path, &body);
                rec.lock().unwrap().push((path, body));
                match reply {
                    Reply::Answer(status, body) => {
                        let _ = write!(
                            s,
                            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        );
                    }
                    Reply::Hang => hung.push(s),
                }
            }
        });
        FakeDaemon { sock, requests }
    }

    /// Answers every request with `{"protocol":1}` plus the result of an ADD.
    fn ok(dir: &Path) -> FakeDaemon {
        FakeDaemon::start(
            dir,
            Box::new(|path, _| {
                let body = if path == "/api/v1/add" {
                    json!({"protocol": 1, "result": add_result()})
                } else {
                    json!({"protocol": 1})
                };
                Reply::Answer(200, body.to_string())
            }),
        )
    }

    fn requests(&self) -> Vec<(String, Value)> {
        self.requests.lock().unwrap().clone()
    }
}

fn add_result() -> Value {
    json!({
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "eth0", "mac": "00:00:00:aa:bb:cc", "mtu": 1400, "sandbox": "/var/run/netns/x"}],
        "ips": [{"address": "10.16.0.5/16", "gateway": "10.16.0.1", "interface": 0},
                {"address": "fd00:10:16::5/64", "gateway": "fd00:10:16::1", "interface": 0}],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.16.0.1", "mtu": 1400}],
        "dns": {"nameservers": ["10.96.0.10"]}
    })
}

struct Env {
    dir: tempfile::TempDir,
    netns: PathBuf,
}

fn setup() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let netns = dir.path().join("netns-1");
    std::fs::write(&netns, b"").unwrap();
    Env { dir, netns }
}

fn conf(version: &str, sock: &Path, extra: Value) -> String {
    let mut c = json!({"cniVersion": version, "name": "kube-ovn", "type": "kube-ovn",
        "server_socket": sock, "ipam": {"type": "kube-ovn"}});
    if let (Some(c), Value::Object(e)) = (c.as_object_mut(), extra) {
        c.extend(e);
    }
    c.to_string()
}

const ARGS: &str = "IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-1;K8S_POD_UID=uid-1;K8S_POD_INFRA_CONTAINER_ID=ctr1";

/// Runs the shim with `cmd`, the standard variables (overridden or removed by `vars`: an empty value
/// removes), and `stdin`.
fn shim(cmd: &str, netns: &Path, stdin: &str, vars: &[(&str, &str)]) -> Output {
    let mut env: Vec<(String, String)> = [
        ("CNI_COMMAND", cmd),
        ("CNI_CONTAINERID", "ctr1"),
        ("CNI_NETNS", netns.to_str().unwrap()),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
        ("CNI_ARGS", ARGS),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    for (k, v) in vars {
        env.retain(|(kk, _)| kk != k);
        if !v.is_empty() {
            env.push(((*k).to_owned(), (*v).to_owned()));
        }
    }
    let mut child = Command::new(SHIM)
        .env_clear()
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn stdout_json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout {:?} stderr {:?}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// The error code the shim printed (and that it exited non-zero).
fn error_code(o: &Output) -> u64 {
    assert!(!o.status.success(), "expected failure, got {o:?}");
    stdout_json(o)["code"].as_u64().unwrap()
}

#[test]
fn add_converted_to_each_version() {
    let e = setup();
    let d = FakeDaemon::ok(e.dir.path());
    for v in ["0.4.0", "1.0.0", "1.1.0"] {
        let o = shim("ADD", &e.netns, &conf(v, &d.sock, json!({})), &[]);
        assert!(o.status.success(), "{v}: {o:?}");
        let r = stdout_json(&o);
        assert_eq!(r["cniVersion"], v);
        assert_eq!(r["ips"][0]["address"], "10.16.0.5/16");
        assert_eq!(r["ips"][1]["gateway"], "fd00:10:16::1");
        assert_eq!(r["dns"]["nameservers"][0], "10.96.0.10");
        match v {
            "0.4.0" => {
                assert_eq!(r["ips"][0]["version"], "4");
                assert_eq!(r["ips"][1]["version"], "6");
                assert!(r["interfaces"][0].get("mtu").is_none());
                assert!(r["routes"][0].get("mtu").is_none());
            }
            "1.0.0" => {
                assert!(r["ips"][0].get("version").is_none());
                assert_eq!(r["interfaces"][0]["name"], "eth0");
            }
            _ => {
                assert_eq!(r["interfaces"][0]["mtu"], 1400);
                assert_eq!(r["routes"][0]["mtu"], 1400);
            }
        }
    }
    let reqs = d.requests();
    assert_eq!(reqs.len(), 3);
    let (path, req) = &reqs[0];
    assert_eq!(path, "/api/v1/add");
    assert_eq!(req["protocol"], 1);
    assert_eq!(req["command"], "ADD");
    assert_eq!(req["cniVersion"], "0.4.0");
    assert_eq!(req["containerID"], "ctr1");
    assert_eq!(req["netns"], e.netns.to_str().unwrap());
    assert_eq!(req["ifname"], "eth0");
    assert_eq!(
        req["pod"],
        json!({"name": "pod-1", "namespace": "bench", "uid": "uid-1", "infraContainerID": "ctr1"})
    );
    // No provider in the netconf: none on the wire, the daemon takes the default network.
    assert!(req.get("provider").is_none(), "{req}");
    assert_eq!(req["network"], "kube-ovn");
    assert_eq!(req["config"]["ipam"]["type"], "kube-ovn");
}

#[test]
fn del_check_gc_status() {
    let e = setup();
    let d = FakeDaemon::ok(e.dir.path());
    // DEL: nothing on stdout; the netns may be gone.
    let o = shim(
        "DEL",
        Path::new("/nonexistent/netns"),
        &conf("1.0.0", &d.sock, json!({})),
        &[],
    );
    assert!(o.status.success() && o.stdout.is_empty(), "{o:?}");
    // CHECK with a 1.0.0 prevResult: the daemon gets it in 1.1.0 form.
    let prev = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.16.0.5/16", "gateway": "10.16.0.1"}]});
    let o = shim(
        "CHECK",
        &e.netns,
        &conf("1.0.0", &d.sock, json!({"prevResult": prev})),
        &[],
    );
    assert!(o.status.success() && o.stdout.is_empty(), "{o:?}");
    // GC with the valid attachments.
    let valid = json!([{"containerID": "ctr1", "ifname": "eth0"}, {"containerID": "ctr2", "ifname": "net1"}]);
    let o = shim(
        "GC",
        &e.netns,
        &conf(
            "1.1.0",
            &d.sock,
            json!({"cni.dev/valid-attachments": valid}),
        ),
        &[
            ("CNI_CONTAINERID", ""),
            ("CNI_IFNAME", ""),
            ("CNI_NETNS", ""),
            ("CNI_ARGS", ""),
        ],
    );
    assert!(o.status.success() && o.stdout.is_empty(), "{o:?}");
    let o = shim(
        "STATUS",
        &e.netns,
        &conf("1.1.0", &d.sock, json!({})),
        &[("CNI_CONTAINERID", ""), ("CNI_IFNAME", "")],
    );
    assert!(o.status.success() && o.stdout.is_empty(), "{o:?}");

    let reqs = d.requests();
    let paths: Vec<&str> = reqs.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/api/v1/del",
            "/api/v1/check",
            "/api/v1/gc",
            "/api/v1/status"
        ]
    );
    assert_eq!(reqs[0].1["netns"], "/nonexistent/netns");
    assert_eq!(reqs[0].1["pod"]["name"], "pod-1");
    assert_eq!(reqs[1].1["prevResult"]["cniVersion"], "1.1.0");
    assert_eq!(reqs[1].1["prevResult"]["ips"][0]["address"], "10.16.0.5/16");
    assert!(reqs[1].1["config"].get("prevResult").is_none());
    assert_eq!(reqs[2].1["validAttachments"], valid);
    assert!(reqs[2].1.get("containerID").is_none());
    assert_eq!(reqs[3].1["command"], "STATUS");
}

#[test]
fn version_without_daemon() {
    let e = setup();
    let o = shim(
        "VERSION",
        &e.netns,
        r#"{"cniVersion":"1.0.0"}"#,
        &[("CNI_PATH", "")],
    );
    assert!(o.status.success(), "{o:?}");
    let r = stdout_json(&o);
    assert_eq!(r["cniVersion"], "1.0.0");
    let versions: Vec<&str> = r["supportedVersions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for v in ["0.4.0", "1.0.0", "1.1.0"] {
        assert!(versions.contains(&v), "{versions:?}");
    }
}

#[test]
fn input_errors() {
    let e = setup();
    let sock = e.dir.path().join("daemon.sock");
    let good = conf("1.0.0", &sock, json!({}));
    // Missing variables and invalid values: code 4.
    for vars in [
        &[("CNI_COMMAND", "")][..],
        &[("CNI_NETNS", "")],
        &[("CNI_CONTAINERID", "")],
        &[("CNI_IFNAME", "")],
        &[("CNI_IFNAME", "a/b")],
        &[("CNI_ARGS", "K8S_POD_NAMESPACE=bench")],
    ] {
        let o = shim("ADD", &e.netns, &good, vars);
        assert_eq!(error_code(&o), 4, "{vars:?}: {o:?}");
        assert_eq!(stdout_json(&o)["cniVersion"], "1.0.0");
    }
    // A netns that does not exist: code 4, before any daemon call.
    let o = shim("ADD", Path::new("/nonexistent/netns"), &good, &[]);
    assert_eq!(error_code(&o), 4);
    assert!(stdout_json(&o)["msg"]
        .as_str()
        .unwrap()
        .contains("CNI_NETNS"));
    // Malformed JSON: 6; an unknown version: 1; GC in a 1.0.0 configuration: 1; bad timeout: 7.
    assert_eq!(
        error_code(&shim("ADD", &e.netns, r#"{"cniVersion":"#, &[])),
        6
    );
    assert_eq!(
        error_code(&shim(
            "ADD",
            &e.netns,
            &conf("9.9.9", &sock, json!({})),
            &[]
        )),
        1
    );
    assert_eq!(error_code(&shim("GC", &e.netns, &good, &[])), 1);
    assert_eq!(
        error_code(&shim(
            "ADD",
            &e.netns,
            &conf("1.0.0", &sock, json!({"request_timeout": -1})),
            &[]
        )),
        7
    );
}

#[test]
fn daemon_down_is_try_again_quickly() {
    let e = setup();
    let sock = e.dir.path().join("nobody.sock");
    for cmd in ["ADD", "DEL"] {
        let t = Instant::now();
        let o = shim(cmd, &e.netns, &conf("1.0.0", &sock, json!({})), &[]);
        assert_eq!(error_code(&o), 11, "{o:?}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }
    // A socket file nobody listens on any more (daemon crashed): refused, also 11.
    drop(UnixListener::bind(&sock).unwrap());
    let o = shim("ADD", &e.netns, &conf("1.0.0", &sock, json!({})), &[]);
    assert_eq!(error_code(&o), 11, "{o:?}");
}

#[test]
fn daemon_that_never_answers_times_out() {
    let e = setup();
    let d = FakeDaemon::start(e.dir.path(), Box::new(|_, _| Reply::Hang));
    let t = Instant::now();
    let o = shim(
        "ADD",
        &e.netns,
        &conf("1.0.0", &d.sock, json!({"request_timeout": 0.5})),
        &[],
    );
    let took = t.elapsed();
    assert_eq!(error_code(&o), 11, "{o:?}");
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert!(stdout_json(&o)["msg"]
        .as_str()
        .unwrap()
        .contains("timed out"));
    assert_eq!(d.requests().len(), 1);
}

#[test]
fn daemon_errors_pass_through() {
    let e = setup();
    let d = FakeDaemon::start(
        e.dir.path(),
        Box::new(|path, req| {
            let pod = req["pod"]["name"].as_str().unwrap_or_default();
            match (path, pod) {
                ("/api/v1/status", _) => Reply::Answer(
                    503,
                    json!({"protocol": 1, "error": {"code": 50, "msg": "ovs-vswitchd not ready"}})
                        .to_string(),
                ),
                (_, "exhausted") => Reply::Answer(
                    500,
                    json!({"protocol": 1, "error": {"cniVersion": "1.1.0", "code": 105,
                        "msg": "no address left", "details": "subnet ovn-default"}})
                    .to_string(),
                ),
                (_, "busy") => Reply::Answer(503, String::new()),
                (_, "garbage") => Reply::Answer(200, "<html>".into()),
                (_, "noresult") => Reply::Answer(200, json!({"protocol": 1}).to_string()),
                (_, "future") => Reply::Answer(
                    200,
                    json!({"protocol": 2, "result": add_result()}).to_string(),
                ),
                _ => Reply::Answer(200, json!({"protocol": 1}).to_string()),
            }
        }),
    );
    let args = |pod: &str| format!("K8S_POD_NAMESPACE=bench;K8S_POD_NAME={pod}");
    let c = conf("1.0.0", &d.sock, json!({}));

    let o = shim("ADD", &e.netns, &c, &[("CNI_ARGS", &args("exhausted"))]);
    assert_eq!(error_code(&o), 105);
    let r = stdout_json(&o);
    assert_eq!(r["cniVersion"], "1.0.0");
    assert_eq!(r["msg"], "no address left");
    assert_eq!(r["details"], "subnet ovn-default");

    let o = shim("ADD", &e.netns, &c, &[("CNI_ARGS", &args("busy"))]);
    assert_eq!(error_code(&o), 11);
    for pod in ["garbage", "noresult", "future"] {
        let o = shim("ADD", &e.netns, &c, &[("CNI_ARGS", &args(pod))]);
        let code = error_code(&o);
        assert!(code == 121 || code == 120, "{pod}: {o:?}");
    }

    let o = shim("STATUS", &e.netns, &conf("1.1.0", &d.sock, json!({})), &[]);
    assert_eq!(error_code(&o), 50);
    assert_eq!(stdout_json(&o)["msg"], "ovs-vswitchd not ready");
}

#[test]
fn debug_log_only_when_asked() {
    let e = setup();
    let d = FakeDaemon::ok(e.dir.path());
    let c = conf("1.0.0", &d.sock, json!({}));
    let o = shim("DEL", &e.netns, &c, &[]);
    assert!(o.status.success() && o.stderr.is_empty(), "{o:?}");
    let o = shim("DEL", &e.netns, &c, &[("KUBE_OVN_CNI_DEBUG", "1")]);
    assert!(o.status.success(), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("/api/v1/del"));
    let o = shim(
        "DEL",
        &e.netns,
        &conf("1.0.0", &d.sock, json!({"debug": true})),
        &[],
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("/api/v1/del"));
}

/// The shim's own overhead: exec + round trip to the fake daemon, ADD, 500 runs. Not a timed assertion:
/// `cargo test --release -p kube-ovn-cni --test shim -- --ignored --nocapture overhead`.
#[test]
#[ignore]
fn overhead() {
    let e = setup();
    let d = FakeDaemon::ok(e.dir.path());
    let runs: usize = std::env::var("SHIM_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    let c = conf("1.0.0", &d.sock, json!({}));
    for (cmd, label) in [
        ("ADD", "ADD (exec + daemon round trip)"),
        ("VERSION", "VERSION (exec only)"),
    ] {
        let mut lat = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = Instant::now();
            let o = shim(cmd, &e.netns, &c, &[]);
            lat.push(t.elapsed());
            assert!(o.status.success());
        }
        lat.sort();
        let p = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
        println!(
            "{label}: {runs} runs, p50 {:?}, p90 {:?}, p99 {:?}, max {:?}",
            p(0.50),
            p(0.90),
            p(0.99),
            lat[lat.len() - 1]
        );
    }
}
