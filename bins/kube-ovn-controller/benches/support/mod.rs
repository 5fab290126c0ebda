//! Helpers shared by the controller benchmarks: the controller binary as a child process, its CPU and RSS,
//! knobs from the environment, percentiles.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};

use kubeovn_testapi::{Config as ApiConfig, TestApiServer};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kubeovn_ovn::monitor::{MonitorRequest, MonitorRequests, TableUpdates};
use kubeovn_ovn::Client;
use serde_json::{json, Value};

use crate::common;

/// A size from the environment variable `name`, else `default`.
pub fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// utime+stime in seconds and RSS in bytes of a process.
pub fn usage(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields after the comm: state is 0, utime 11, stime 12; USER_HZ is 100 on Linux.
    let cpu = (ticks(11) + ticks(12)) / 100.0;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        * 1024.0;
    (cpu, rss)
}

/// Starts the controller binary (`CTRL_BENCH_BIN`, else this build's) against `kubeconfig` and `nb`, its
/// log in `dir/controller-<n>.log`.
pub fn spawn_controller(
    dir: &std::path::Path,
    kubeconfig: &std::path::Path,
    nb: &str,
    n: usize,
) -> Child {
    let log = std::fs::File::create(dir.join(format!("controller-{n}.log"))).unwrap();
    // CTRL_BENCH_BIN runs another build (say, of an older commit) under the same harness, side by side.
    let bin = std::env::var_os("CTRL_BENCH_BIN")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_kube-ovn-controller").into());
    Command::new(bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "--ovn-nb-addr",
            nb,
            "--log-level",
            "info",
            "--gc-interval",
            "600",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// Kills (SIGKILL) and reaps a controller.
pub fn kill(mut child: Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The `p` quantile (0..=1) of `v` (sorted in place).
pub fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

/// The in-memory test API server with Kube-OVN's CRDs, the namespace `bench` and the node `bench-node`; its
/// kubeconfig written to `kubeconfig`.
pub async fn start_api(kubeconfig: &Path) -> (TestApiServer, std::path::PathBuf) {
    let api = TestApiServer::start(ApiConfig::default()).await.unwrap();
    api.write_kubeconfig(kubeconfig).unwrap();
    api.apply_crds(common::crds()).unwrap();
    let store = api.store();
    let ns_info = store.resource("", "v1", "namespaces").unwrap();
    store
        .create(
            &ns_info,
            None,
            json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":"bench"}}),
        )
        .unwrap();
    let node_info = store.resource("", "v1", "nodes").unwrap();
    store
        .create(
            &node_info,
            None,
            json!({"apiVersion":"v1","kind":"Node","metadata":{"name":"bench-node"},
                   "status":{"addresses":[{"type":"InternalIP","address":"172.18.0.2"}]}}),
        )
        .unwrap();
    (api, kubeconfig.to_owned())
}

/// The NB tables of the schema.
pub fn nb_tables() -> Vec<String> {
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(common::nb_schema()).unwrap()).unwrap();
    schema["tables"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

pub type Updates = Arc<Mutex<Vec<(Instant, TableUpdates)>>>;

/// Every update (one per committed transaction) of every NB table from now on.
pub async fn monitor_all(remote: &str) -> (Client, Updates) {
    let client = Client::connect(remote).await.unwrap();
    let mut reqs = MonitorRequests::new();
    for t in nb_tables() {
        reqs = reqs.table(t, MonitorRequest::all());
    }
    let (_, mut stream) = client.monitor_cond("OVN_Northbound", &reqs).await.unwrap();
    let updates: Updates = Arc::default();
    let u = updates.clone();
    tokio::spawn(async move {
        while let Some(Ok(up)) = stream.next().await {
            u.lock().unwrap().push((Instant::now(), up.tables));
        }
    });
    (client, updates)
}

/// NB, SB and ovn-northd in a temporary directory; northd stopped by pid when dropped.
pub struct Northd {
    pub nb: common::OvsdbServer,
    pub sb: common::OvsdbServer,
    northd: Child,
}

impl Northd {
    pub fn start() -> Option<Northd> {
        if !common::have("ovn-northd") || !common::have("ovn-sbctl") {
            return None;
        }
        let nb = common::start_nb()?;
        let sb = common::OvsdbServer::start(
            "/usr/share/ovn/ovn-sb.ovsschema",
            common::ovn::Storage::Standalone,
            false,
        )?;
        let d = nb.dir.path();
        let northd = Command::new("ovn-northd")
            .arg(format!("--ovnnb-db={}", nb.unix_remote()))
            .arg(format!("--ovnsb-db={}", sb.unix_remote()))
            .arg(format!("--pidfile={}", d.join("northd.pid").display()))
            .arg(format!("--log-file={}", d.join("northd.log").display()))
            .arg(format!("--unixctl={}", d.join("northd.ctl").display()))
            .arg("-vconsole:off")
            .env("OVN_RUNDIR", d)
            .env("OVS_RUNDIR", d)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Some(Northd { nb, sb, northd })
    }

    /// Waits until northd has translated NB as it is now into SB.
    pub fn sync(&self) {
        self.wait("sb")
    }

    /// Waits until every chassis has installed NB as it is now (`--wait=hv`).
    pub fn sync_hv(&self) {
        self.wait("hv")
    }

    fn wait(&self, till: &str) {
        let out = Command::new("ovn-nbctl")
            .arg(format!("--db={}", self.nb.unix_remote()))
            .args(["--timeout=300", &format!("--wait={till}"), "sync"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ovn-nbctl --wait=sb sync: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `ovn-sbctl lflow-list` lines and Logical_Flow rows (a row with a datapath group is listed once per
    /// datapath).
    pub fn lflows(&self) -> (usize, usize) {
        let sbctl = |args: &[&str]| {
            let out = Command::new("ovn-sbctl")
                .arg(format!("--db={}", self.sb.unix_remote()))
                .arg("--timeout=120")
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "ovn-sbctl {args:?}");
            out.stdout
        };
        let lines = sbctl(&["lflow-list"])
            .iter()
            .filter(|b| **b == b'\n')
            .count();
        let rows = String::from_utf8(sbctl(&[
            "--bare",
            "--columns=_uuid",
            "list",
            "Logical_Flow",
        ]))
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count();
        (lines, rows)
    }
}

impl Drop for Northd {
    fn drop(&mut self) {
        let _ = self.northd.kill();
        let _ = self.northd.wait();
    }
}

/// One chassis for counting OpenFlow flows: an Open_vSwitch database, ovs-vswitchd on OVS's dummy datapath
/// (`--enable-dummy=override`: ports are in-memory, nothing appears on the host) and ovn-controller on `sb`.
/// Stopped by pid when dropped.
pub struct Chassis {
    pub db: common::OvsdbServer,
    vswitchd: Child,
    controller: Child,
}

impl Chassis {
    /// Starts the chassis on the SB at `sb` (a unix remote); None without the OVS and OVN node binaries.
    pub fn start(sb: &str) -> Option<Chassis> {
        if !common::have("ovs-vswitchd") || !common::have("ovn-controller") {
            return None;
        }
        let db = common::OvsdbServer::start(
            "/usr/share/openvswitch/vswitch.ovsschema",
            common::ovn::Storage::Standalone,
            false,
        )?;
        let d = db.dir.path().to_owned();
        let remote = db.unix_remote();
        let spawn = |prog: &str, args: Vec<String>| {
            Command::new(prog)
                .args(args)
                .arg("-vconsole:off")
                .env("OVS_RUNDIR", &d)
                .env("OVN_RUNDIR", &d)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        };
        let vsctl = |args: &[&str]| {
            let out = Command::new("ovs-vsctl")
                .arg(format!("--db={remote}"))
                .arg("--timeout=60")
                .args(args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "ovs-vsctl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        vsctl(&["--no-wait", "init"]);
        let vswitchd = spawn(
            "ovs-vswitchd",
            vec![
                "--enable-dummy=override".into(),
                remote.clone(),
                format!("--pidfile={}", d.join("vswitchd.pid").display()),
                format!("--log-file={}", d.join("vswitchd.log").display()),
                format!("--unixctl={}", d.join("vswitchd.ctl").display()),
            ],
        );
        vsctl(&[
            "--",
            "add-br",
            "br-int",
            "--",
            "set",
            "bridge",
            "br-int",
            "datapath_type=dummy",
            "fail-mode=secure",
            "--",
            "set",
            "open_vswitch",
            ".",
            "external_ids:system-id=bench",
            &format!("external_ids:ovn-remote={sb}"),
            "external_ids:ovn-encap-type=geneve",
            "external_ids:ovn-encap-ip=127.0.0.1",
        ]);
        let controller = spawn(
            "ovn-controller",
            vec![
                remote.clone(),
                format!("--pidfile={}", d.join("ovn-controller.pid").display()),
                format!("--log-file={}", d.join("ovn-controller.log").display()),
            ],
        );
        Some(Chassis {
            db,
            vswitchd,
            controller,
        })
    }

    /// Plugs a dummy interface for each logical switch port, bound to it by `iface-id`, in one transaction,
    /// and waits until ovn-controller has installed every one (`ovn-installed`).
    pub fn bind(&self, ports: &[String]) {
        let mut args = vec![
            format!("--db={}", self.db.unix_remote()),
            "--timeout=120".into(),
        ];
        for (i, p) in ports.iter().enumerate() {
            let name = format!("d{i}");
            args.extend(
                [
                    "--",
                    "add-port",
                    "br-int",
                    &name,
                    "--",
                    "set",
                    "interface",
                    &name,
                    "type=dummy",
                ]
                .map(String::from),
            );
            args.push(format!("external_ids:iface-id={p}"));
        }
        let out = Command::new("ovs-vsctl").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "ovs-vsctl add-port: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let t = Instant::now();
        loop {
            let out = Command::new("ovs-vsctl")
                .arg(format!("--db={}", self.db.unix_remote()))
                .args(["--bare", "--columns=name", "find", "interface"])
                .arg("external_ids:ovn-installed=\"true\"")
                .output()
                .unwrap();
            let installed = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| !l.trim().is_empty())
                .count();
            if installed >= ports.len() {
                return;
            }
            assert!(
                t.elapsed() < std::time::Duration::from_secs(300),
                "ovn-controller installed {installed} of {} ports",
                ports.len()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// OpenFlow flows on br-int (`ovs-ofctl dump-flows` lines, the reply header left out).
    pub fn flows(&self) -> usize {
        let mgmt = self.db.dir.path().join("br-int.mgmt");
        let out = Command::new("ovs-ofctl")
            .args(["--timeout=120", "dump-flows"])
            .arg(format!("unix:{}", mgmt.display()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ovs-ofctl dump-flows: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("actions="))
            .count()
    }
}

impl Drop for Chassis {
    fn drop(&mut self) {
        for c in [&mut self.controller, &mut self.vswitchd] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
