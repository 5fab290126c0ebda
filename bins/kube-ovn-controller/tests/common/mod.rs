//! End-to-end harness: a real NB ovsdb-server in a temporary directory (stopped by pid), the in-memory test
//! API server, the controller library in-process, kubectl and ovn-nbctl as independent checkers.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kubeovn_core::controller::{Config, Controller};
use kubeovn_ovn::northbound::OvsdbNorthbound;
use kubeovn_testapi::{Config as ApiConfig, TestApiServer};
use serde_json::{json, Value};
use tokio::sync::oneshot;

/// kubeovn-ovn's harness: ovsdb-servers (standalone or a raft cluster) that tests kill and restart by pid.
pub use kubeovn_test_support::ovsdb as ovn;

pub use ovn::{have, OvsdbServer};

/// The NB schema: the installed one, else the copy kubeovn-ovn ships.
pub fn nb_schema() -> PathBuf {
    ["/usr/share/ovn/ovn-nb.ovsschema"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kubeovn-ovn/schemas/ovn-nb.ovsschema")
        })
}

/// A private standalone NB ovsdb-server in a temporary directory of its own; None (with the reason printed)
/// without the OVS binaries.
pub fn start_nb() -> Option<OvsdbServer> {
    OvsdbServer::start(nb_schema().to_str()?, ovn::Storage::Standalone, false)
}

/// Kube-OVN's CRDs (kubeovn-core), as JSON objects.
pub fn crds() -> Vec<Value> {
    kubeovn_core::crd::crds()
        .iter()
        .map(|c| serde_json::to_value(c).unwrap())
        .collect()
}

/// Test API server + NB + a controller that can be stopped and started again.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub nb: OvsdbServer,
    pub api: TestApiServer,
    pub client: kube::Client,
    pub kubeconfig: PathBuf,
    pub controller: Option<Running>,
}

/// A running controller (in-process).
pub struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    pub ipam: Arc<kubeovn_ipam::SharedIpam>,
    pub metrics: kubeovn_core::controller::Metrics,
}

impl Running {
    /// Stops it the hard way (no cleanup), like a killed process.
    pub async fn kill(mut self) {
        self.stop.take();
        self.task.abort();
        let _ = self.task.await;
    }
}

pub fn test_config() -> Config {
    Config {
        gc_interval: Duration::from_millis(700),
        status_interval: Duration::from_millis(200),
        ..Config::default()
    }
}

impl Env {
    pub async fn start() -> Option<Env> {
        if !have("ovsdb-server") || !have("ovn-nbctl") || !have("kubectl") {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("kube-ovn-controller-e2e")
            .tempdir()
            .unwrap();
        let nb = start_nb()?;
        let api = TestApiServer::start(ApiConfig::default()).await.unwrap();
        let kubeconfig = api.write_kubeconfig_in(dir.path()).unwrap();
        let client = api.client().unwrap();
        let env = Env {
            dir,
            nb,
            api,
            client,
            kubeconfig,
            controller: None,
        };
        // The CRDs as a user installs them: the binary's `crd` output through kubectl.
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kube-ovn-controller"))
            .arg("crd")
            .output()
            .unwrap();
        assert!(out.status.success());
        env.apply(&String::from_utf8(out.stdout).unwrap()).await;
        Some(env)
    }

    pub async fn start_controller(&mut self, config: Config) {
        let nb = OvsdbNorthbound::connect(&self.nb.unix_remote())
            .await
            .unwrap();
        let c = Controller::new(self.client.clone(), Arc::new(nb), config);
        let ipam = c.ipam();
        let metrics = c.metrics();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let r = c
                .run(async {
                    let _ = rx.await;
                })
                .await;
            if let Err(e) = r {
                eprintln!("controller stopped: {e}");
            }
        });
        self.controller = Some(Running {
            stop: Some(tx),
            task,
            ipam,
            metrics,
        });
    }

    pub async fn kill_controller(&mut self) {
        if let Some(c) = self.controller.take() {
            c.kill().await;
        }
    }

    /// `ovn-nbctl --db=unix:... args`, stdout trimmed.
    pub async fn nbctl(&self, args: &[&str]) -> String {
        let db = format!("--db={}", self.nb.unix_remote());
        let args: Vec<String> = std::iter::once(db)
            .chain(args.iter().map(|s| s.to_string()))
            .collect();
        tokio::task::spawn_blocking(move || {
            let out = Command::new("ovn-nbctl").args(&args).output().unwrap();
            assert!(
                out.status.success(),
                "ovn-nbctl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        })
        .await
        .unwrap()
    }

    /// kubectl with this cluster's kubeconfig: (success, stdout, stderr).
    pub async fn kubectl_io(&self, args: &[&str], stdin: Option<String>) -> (bool, String, String) {
        let kc = self.kubeconfig.clone();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let mut child = Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&kc)
                .args(&args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            if let Some(s) = stdin {
                child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
            }
            drop(child.stdin.take());
            let out = child.wait_with_output().unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
        .await
        .unwrap()
    }

    pub async fn kubectl(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.kubectl_io(args, None).await;
        assert!(ok, "kubectl {args:?}: {err}");
        out
    }

    /// `kubectl apply -f -` of a YAML/JSON text.
    pub async fn apply(&self, doc: &str) {
        let (ok, _, err) = self
            .kubectl_io(&["apply", "-f", "-"], Some(doc.to_owned()))
            .await;
        assert!(ok, "kubectl apply: {err}\n{doc}");
    }

    /// `kubectl get KIND NAME -o json`, None if absent.
    pub async fn get_json(&self, args: &[&str]) -> Option<Value> {
        let mut a = vec!["get"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["-o", "json"]);
        let (ok, out, _) = self.kubectl_io(&a, None).await;
        ok.then(|| serde_json::from_str(&out).unwrap())
    }
}

/// Polls `f` until it returns Some, for up to `secs` seconds.
pub async fn wait_for<T, F, Fut>(what: &str, secs: u64, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The note of a Warning event with `reason` on the object `name` in `ns` (events of cluster-scoped objects
/// are in `default`), waited for.
pub async fn warning_for(env: &Env, ns: &str, name: &str, reason: &str) -> String {
    wait_for(&format!("{reason} event on {ns}/{name}"), 20, || async {
        let evs = env.get_json(&["events.events.k8s.io", "-n", ns]).await?;
        evs["items"].as_array()?.iter().find_map(|e| {
            (e.pointer("/regarding/name")?.as_str()? == name
                && e["type"] == "Warning"
                && e["reason"] == reason)
                .then(|| e["note"].as_str().unwrap_or_default().to_owned())
        })
    })
    .await
}

/// A pod manifest.
pub fn pod(ns: &str, name: &str, node: &str, annotations: &[(&str, &str)]) -> String {
    let anns: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": anns},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]}
    })
    .to_string()
}
