//! The sandbox's EndpointSlice controller against the in-process test API server (no root): pods and Services
//! made through the API, slices read back through the API and through kubectl (an independent client).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kubeovn_core::controller::framework::Kinds;
use kubeovn_sandbox::endpoints::{self, CONTROLLER_NAME, LABEL_MANAGED_BY, LABEL_SERVICE_NAME};
use kubeovn_testapi::{Config, TestApiServer};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use kubeovn_test_support::skip;

const NS: &str = "default";

struct Env {
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    _api: TestApiServer,
    client: kube::Client,
}

/// The controller running in this process, with its framework's stores and queues.
struct Running {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    kinds: Arc<Kinds>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap();
    }

    /// Waits (at most 10 s) until the controller has nothing queued, nothing running and nothing waiting to
    /// be retried: every change its watches delivered so far has been handled, and nothing more is written
    /// until another comes. It says nothing of events still on their way: see [`Env::orphan_deleted`].
    async fn settled(&self, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.kinds.all_settled() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for the controller to settle {what}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Env {
    async fn start() -> Env {
        let dir = tempfile::tempdir().unwrap();
        // Dual stack: the tests have Services of both families.
        let api = TestApiServer::start(Config {
            service_cluster_ip_range: "10.96.0.0/12,fd00:96::/108".into(),
            ..Config::default()
        })
        .await
        .unwrap();
        let kubeconfig = api.write_kubeconfig_in(dir.path()).unwrap();
        let client = api.client().unwrap();
        Env {
            dir,
            kubeconfig,
            _api: api,
            client,
        }
    }

    /// Starts the controller; returns once its workers run (its first lists stored, every Service queued, its
    /// start hook done).
    async fn controller(&self) -> Running {
        let (stop, rx) = oneshot::channel::<()>();
        let (started, kinds) = oneshot::channel::<Arc<Kinds>>();
        let client = self.client.clone();
        let task = tokio::spawn(async move {
            endpoints::run_with(
                client,
                async {
                    let _ = rx.await;
                },
                |kinds| {
                    let _ = started.send(kinds);
                },
            )
            .await
            .unwrap();
        });
        let kinds = tokio::time::timeout(Duration::from_secs(10), kinds)
            .await
            .expect("the controller started within 10 s")
            .unwrap();
        Running { stop, task, kinds }
    }

    /// The barrier on the slice watch: creates a slice the controller manages for Service `svc`, which does not
    /// exist, and waits (at most 10 s) until the controller deleted it, which it does once the watch has
    /// delivered it. A watch delivers one resource's events in resourceVersion order, so by then it has
    /// delivered every slice change made before this one, and each has queued its Service before this slice
    /// queued `svc`.
    async fn orphan_deleted(&self, svc: &str) {
        let name = format!("{svc}-orphan");
        let orphan: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {LABEL_SERVICE_NAME: svc, LABEL_MANAGED_BY: CONTROLLER_NAME}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["192.0.2.9"]}],
            "ports": [{"port": 80}],
        }))
        .unwrap();
        self.slices()
            .create(&PostParams::default(), &orphan)
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.slices().get_opt(&name).await.unwrap().is_some() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for the orphan slice {name} to be deleted"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), NS)
    }

    fn slices(&self) -> Api<EndpointSlice> {
        Api::namespaced(self.client.clone(), NS)
    }

    /// A pod with `labels`, scheduled, with `ips` and Ready `ready`; its container names `ports`.
    async fn pod(
        &self,
        name: &str,
        labels: Value,
        ips: &[&str],
        ready: bool,
        ports: &[(&str, i32)],
    ) {
        let ports: Vec<Value> = ports
            .iter()
            .map(|(n, p)| json!({"name": n, "containerPort": p, "protocol": "TCP"}))
            .collect();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": "sandbox", "containers": [{"name": "c", "image": "any", "ports": ports}]},
        }))
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
        self.status(name, ips, ready).await;
    }

    /// What the kubelet reports.
    async fn status(&self, name: &str, ips: &[&str], ready: bool) {
        let status = json!({"status": {
            "phase": "Running",
            "podIP": ips.first(),
            "podIPs": ips.iter().map(|i| json!({"ip": i})).collect::<Vec<_>>(),
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        }});
        self.pods()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }

    async fn service(&self, spec: Value) -> Service {
        let svc: Service = serde_json::from_value(spec).unwrap();
        self.services()
            .create(&PostParams::default(), &svc)
            .await
            .unwrap()
    }

    async fn slices_of(&self, svc: &str) -> Vec<EndpointSlice> {
        let lp = ListParams::default().labels(&format!("{LABEL_SERVICE_NAME}={svc}"));
        self.slices().list(&lp).await.unwrap().items
    }

    /// Polls the Service's slices until `what` holds of their summary; fails after 10 s with the last one.
    async fn wait(
        &self,
        svc: &str,
        what: &str,
        ok: impl Fn(&Summary) -> bool,
    ) -> Vec<EndpointSlice> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let slices = self.slices_of(svc).await;
            let s = summary(&slices);
            if ok(&s) {
                return slices;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {s:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn kubectl(&self, args: &[&str]) -> Value {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

/// The slices as (addressType, sorted "port-name:number"s) -> pod name -> (ready, serving, terminating).
type Summary = BTreeMap<(String, Vec<String>), BTreeMap<String, (bool, bool, bool)>>;

fn summary(slices: &[EndpointSlice]) -> Summary {
    let mut s = Summary::new();
    for sl in slices {
        let mut ports: Vec<String> = sl
            .ports
            .iter()
            .flatten()
            .map(|p| {
                format!(
                    "{}:{}",
                    p.name.clone().unwrap_or_default(),
                    p.port.unwrap_or(0)
                )
            })
            .collect();
        ports.sort();
        let group = s.entry((sl.address_type.clone(), ports)).or_default();
        for ep in sl.endpoints.iter().flatten() {
            let c = ep.conditions.clone().unwrap_or_default();
            let name = ep
                .target_ref
                .as_ref()
                .and_then(|r| r.name.clone())
                .unwrap_or_default();
            let prev = group.insert(
                name.clone(),
                (c.ready.unwrap(), c.serving.unwrap(), c.terminating.unwrap()),
            );
            assert!(prev.is_none(), "{name} twice in one port set: {slices:#?}");
        }
    }
    s
}

fn group<'a>(
    s: &'a Summary,
    family: &str,
    ports: &[&str],
) -> Option<&'a BTreeMap<String, (bool, bool, bool)>> {
    s.get(&(
        family.to_owned(),
        ports.iter().map(|p| p.to_string()).collect(),
    ))
}

fn pods_in(s: &Summary) -> Vec<String> {
    let mut v: Vec<String> = s.values().flat_map(|g| g.keys().cloned()).collect();
    v.sort();
    v
}

fn versions(slices: &[EndpointSlice]) -> BTreeMap<String, String> {
    slices
        .iter()
        .map(|s| {
            (
                s.metadata.name.clone().unwrap(),
                s.metadata.resource_version.clone().unwrap(),
            )
        })
        .collect()
}

fn have_kubectl() -> bool {
    let ok = Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip::skip("kubectl is not installed");
    }
    ok
}

const HTTP: &str = "http:8080";
const METRICS: &str = "metrics:9100";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_follow_pods_and_services() {
    if !have_kubectl() {
        return;
    }
    let env = Env::start().await;
    let c = env.controller().await;
    let web = json!({"app": "web"});
    env.pod(
        "a",
        web.clone(),
        &["10.16.0.2", "fd00:10:16::2"],
        true,
        &[("http", 8080)],
    )
    .await;
    env.pod("b", web.clone(), &["10.16.0.3"], false, &[("http", 8081)])
        .await;
    env.pod(
        "c",
        json!({"app": "db"}),
        &["10.16.0.4"],
        true,
        &[("http", 8080)],
    )
    .await;
    env.pod("e", web.clone(), &["10.16.0.6"], true, &[("other", 8080)])
        .await;
    env.pod("d", web.clone(), &["10.16.0.5"], true, &[("http", 8080)])
        .await;
    let done = json!({"status": {"phase": "Succeeded"}});
    env.pods()
        .patch_status("d", &PatchParams::default(), &Patch::Merge(&done))
        .await
        .unwrap();
    let svc = env
        .service(json!({
            "metadata": {"name": "web", "labels": {"tier": "front"}},
            "spec": {
                "selector": {"app": "web"},
                "clusterIP": "10.96.0.10",
                "clusterIPs": ["10.96.0.10", "fd00:96::10"],
                "ipFamilies": ["IPv4", "IPv6"],
                "ipFamilyPolicy": "RequireDualStack",
                "ports": [
                    {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
                    {"name": "metrics", "port": 9090, "targetPort": 9100, "protocol": "TCP"},
                ],
            },
        }))
        .await;

    // Pods resolving `http` to different numbers in different slices, the pod without it in a slice with
    // only `metrics`; the Succeeded and the unselected pods nowhere; IPv6 only for the pod that has one.
    let expect = |s: &Summary| {
        group(s, "IPv4", &[HTTP, METRICS]).map(|g| g.keys().cloned().collect::<Vec<_>>())
            == Some(vec!["a".into()])
            && group(s, "IPv4", &["http:8081", METRICS]).and_then(|g| g.get("b"))
                == Some(&(false, false, false))
            && group(s, "IPv4", &[METRICS]).is_some_and(|g| g.contains_key("e"))
            && group(s, "IPv6", &[HTTP, METRICS]).map(|g| g.keys().cloned().collect::<Vec<_>>())
                == Some(vec!["a".into()])
            && pods_in(s) == ["a", "a", "b", "e"]
    };
    env.wait("web", "the first slices", expect).await;

    // kubectl sees the same, with the labels and the owner a consumer relies on.
    let list = env.kubectl(&[
        "get",
        "endpointslices",
        "-n",
        NS,
        "-l",
        "kubernetes.io/service-name=web",
        "-o",
        "json",
    ]);
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 4, "{list:#}");
    for it in items {
        assert_eq!(it["apiVersion"], "discovery.k8s.io/v1");
        assert!(
            it["metadata"]["name"].as_str().unwrap().starts_with("web-"),
            "{it:#}"
        );
        assert_eq!(it["metadata"]["labels"][LABEL_MANAGED_BY], CONTROLLER_NAME);
        assert_eq!(it["metadata"]["labels"]["tier"], "front");
        let owner = &it["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "Service");
        assert_eq!(owner["name"], "web");
        assert_eq!(owner["uid"].as_str(), svc.metadata.uid.as_deref());
        assert_eq!(owner["controller"], true);
        assert_eq!(owner["blockOwnerDeletion"], true);
        for ep in it["endpoints"].as_array().unwrap() {
            assert_eq!(ep["nodeName"], "sandbox");
            assert_eq!(ep["targetRef"]["kind"], "Pod");
            assert!(ep.get("zone").is_none());
        }
        let a = it["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["targetRef"]["name"] == "a");
        if let Some(a) = a {
            let want = if it["addressType"] == "IPv4" {
                "10.16.0.2"
            } else {
                "fd00:10:16::2"
            };
            assert_eq!(a["addresses"], json!([want]));
        }
    }

    // b becomes ready; how long until its slice says so.
    let t = Instant::now();
    env.status("b", &["10.16.0.3"], true).await;
    env.wait("web", "b ready", |s| {
        group(s, "IPv4", &["http:8081", METRICS]).and_then(|g| g.get("b"))
            == Some(&(true, true, false))
    })
    .await;
    eprintln!("pod ready -> slice updated in {:?}", t.elapsed());

    // a terminating (held by a finalizer): not ready, still serving, terminating, in both families.
    let hold = json!({"metadata": {"finalizers": ["test.kube-ovn/hold"]}});
    env.pods()
        .patch("a", &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .unwrap();
    env.pods()
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    env.wait("web", "a terminating", |s| {
        group(s, "IPv4", &[HTTP, METRICS]).and_then(|g| g.get("a")) == Some(&(false, true, true))
            && group(s, "IPv6", &[HTTP, METRICS]).and_then(|g| g.get("a"))
                == Some(&(false, true, true))
    })
    .await;

    // b relabelled out of the selector; then e's IP changes and a goes when its finalizer does.
    let out = json!({"metadata": {"labels": {"app": "other"}}});
    env.pods()
        .patch("b", &PatchParams::default(), &Patch::Merge(&out))
        .await
        .unwrap();
    env.wait("web", "b relabelled out", |s| pods_in(s) == ["a", "a", "e"])
        .await;
    env.status("e", &["10.16.0.66"], true).await;
    let release = json!({"metadata": {"finalizers": null}});
    env.pods()
        .patch("a", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .unwrap();
    let slices = env
        .wait("web", "b and a gone", |s| pods_in(s) == ["e"])
        .await;
    let e = slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .find(|ep| ep.target_ref.as_ref().and_then(|r| r.name.as_deref()) == Some("e"))
        .unwrap();
    assert_eq!(e.addresses, vec!["10.16.0.66".to_owned()]);

    // Settled: nothing more is written (the controller's own writes coming back through the watch write
    // nothing). The pod watch has nothing more for web: its last pod event, a's deletion, shows in the slices
    // already. The slice watch's echoes of the controller's writes: delivered, and web queued by each, once
    // an orphan slice made after them is deleted; run to the end (and any retry of theirs too) once the
    // controller settles after that. A write from any of those runs changes a version.
    let settled = versions(&env.slices_of("web").await);
    env.orphan_deleted("settle-marker").await;
    c.settled("after the orphan slice").await;
    assert_eq!(
        versions(&env.slices_of("web").await),
        settled,
        "slices rewritten while nothing changed"
    );

    // A Service without a selector with a slice its owner wrote: left alone.
    env.service(json!({"metadata": {"name": "manual"}, "spec": {"clusterIP": "10.96.0.11", "ports": [{"port": 80}]}}))
        .await;
    let own: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "manual-1", "labels": {LABEL_SERVICE_NAME: "manual", LABEL_MANAGED_BY: "someone"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["192.0.2.1"]}],
        "ports": [{"port": 80}],
    }))
    .unwrap();
    env.slices()
        .create(&PostParams::default(), &own)
        .await
        .unwrap();

    // The selector removed: the controller's slices go.
    let no_selector = json!({"spec": {"selector": null}});
    env.services()
        .patch("web", &PatchParams::default(), &Patch::Merge(&no_selector))
        .await
        .unwrap();
    env.wait("web", "slices deleted without a selector", |s| s.is_empty())
        .await;

    // Back with a selector, then the Service deleted: its slices go with it.
    let selector = json!({"spec": {"selector": {"app": "web"}}});
    env.services()
        .patch("web", &PatchParams::default(), &Patch::Merge(&selector))
        .await
        .unwrap();
    env.wait("web", "slices back", |s| pods_in(s) == ["e"])
        .await;
    env.services()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    env.wait("web", "slices deleted with the Service", |s| s.is_empty())
        .await;

    let manual = env.slices_of("manual").await;
    assert_eq!(manual.len(), 1, "the user's slice stays");
    assert_eq!(
        manual[0].metadata.resource_version,
        env.slices()
            .get("manual-1")
            .await
            .unwrap()
            .metadata
            .resource_version
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_hundred_endpoints_split_and_a_restart_writes_nothing() {
    let env = Env::start().await;
    const N: usize = 230;
    for i in 0..N {
        let ip = format!("10.16.{}.{}", i / 200, i % 200 + 2);
        env.pod(
            &format!("p{i:03}"),
            json!({"app": "many"}),
            &[&ip],
            true,
            &[],
        )
        .await;
    }
    env.service(json!({
        "metadata": {"name": "many"},
        "spec": {"selector": {"app": "many"}, "clusterIP": "10.96.0.20", "ports": [{"name": "", "port": 80, "targetPort": 8080}]},
    }))
    .await;
    env.service(json!({
        "metadata": {"name": "gone"},
        "spec": {"selector": {"app": "many"}, "clusterIP": "10.96.0.21", "ports": [{"port": 81}]},
    }))
    .await;
    let t = Instant::now();
    let c = env.controller().await;
    let slices = env
        .wait("many", "230 endpoints", |s| pods_in(s).len() == N)
        .await;
    eprintln!("{N} endpoints in slices {:?} after start", t.elapsed());
    let mut sizes: Vec<usize> = slices
        .iter()
        .map(|s| s.endpoints.iter().flatten().count())
        .collect();
    sizes.sort();
    assert_eq!(sizes, vec![30, 100, 100]);
    for s in &slices {
        let ports: Vec<_> = s
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone(), p.port, p.protocol.clone()))
            .collect();
        assert_eq!(
            ports,
            vec![(Some(String::new()), Some(8080), Some("TCP".to_owned()))]
        );
    }
    env.wait("gone", "the other Service's slices", |s| {
        pods_in(s).len() == N
    })
    .await;
    let before = versions(&env.slices_of("many").await);

    // Stopped; meanwhile a Service is deleted. Started again: that Service's slices go, the others stay
    // untouched.
    c.stop().await;
    env.services()
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    // Once started, the new controller has every Service queued by its first lists (many among them), and
    // has run its start hook (the orphans' cleanup). Settled, it has run many to the end: had the restart
    // rewritten a slice, that run would have.
    let c = env.controller().await;
    env.wait("gone", "slices of the Service deleted while stopped", |s| {
        s.is_empty()
    })
    .await;
    c.settled("after the restart").await;
    assert_eq!(
        versions(&env.slices_of("many").await),
        before,
        "a restart rewrote slices"
    );

    // One pod more goes into the slice with room; one less leaves the others as they are.
    env.pod("extra", json!({"app": "many"}), &["10.16.9.9"], true, &[])
        .await;
    let slices = env
        .wait("many", "the extra pod", |s| pods_in(s).len() == N + 1)
        .await;
    let after = versions(&slices);
    assert_eq!(after.len(), 3);
    assert_eq!(
        after
            .iter()
            .filter(|(n, v)| before.get(*n) != Some(*v))
            .count(),
        1,
        "{before:?} -> {after:?}"
    );
    c.stop().await;
}

/// `kube-ovn-sandbox endpoints`, the process `up` starts once per cluster, keeps the slices of the pods
/// `kube-ovn-sandbox kubelet` runs: a host-network pod (no network namespace, so no root) reported Ready by
/// that kubelet appears in its Service's slice. Both stop on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoints_process_keeps_slices() {
    use kubeovn_sandbox::state::{write_json, Settings, StateDir};
    let env = Env::start().await;
    let state = StateDir::new(env.dir.path().join("state"));
    std::fs::create_dir_all(state.cni_conf_dir()).unwrap();
    state.save_settings(&Settings::default()).unwrap();
    std::fs::copy(&env.kubeconfig, state.kubeconfig()).unwrap();
    // Never run: host-network pods get no CNI ADD.
    write_json(
        &state.conflist(),
        &json!({"cniVersion": "1.0.0", "name": "t", "plugins": [{"type": "none"}]}),
    )
    .unwrap();
    let start = |what: &str| {
        let log = std::fs::File::create(env.dir.path().join(format!("{what}.log"))).unwrap();
        std::process::Command::new(env!("CARGO_BIN_EXE_kube-ovn-sandbox"))
            .arg(what)
            .arg("--state-dir")
            .arg(state.root())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap()
    };
    let mut kubelet = start("kubelet");
    let mut slices_process = start("endpoints");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "host", "labels": {"app": "host"}},
        "spec": {"hostNetwork": true, "containers": [{"name": "c", "image": "any", "command": ["sleep", "60"]}]},
    }))
    .unwrap();
    env.pods()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    env.service(json!({
        "metadata": {"name": "host"},
        "spec": {"selector": {"app": "host"}, "clusterIP": "10.96.0.30", "ports": [{"port": 80, "targetPort": 8080}]},
    }))
    .await;
    let slices = env
        .wait("host", "the host-network pod ready in the slice", |s| {
            group(s, "IPv4", &[":8080"]).and_then(|g| g.get("host")) == Some(&(true, true, false))
        })
        .await;
    let ep = slices[0].endpoints.as_ref().unwrap()[0].clone();
    assert_eq!(ep.addresses, vec!["127.0.0.1".to_owned()]);
    assert_eq!(ep.node_name.as_deref(), Some("sandbox"));
    env.pods()
        .delete("host", &DeleteParams::default())
        .await
        .unwrap();
    env.wait("host", "the pod gone from the slice", |s| {
        pods_in(s).is_empty()
    })
    .await;

    // SIGTERM stops each.
    for (what, child) in [
        ("kubelet", &mut kubelet),
        ("endpoints", &mut slices_process),
    ] {
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{what} did not stop on SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let log = std::fs::read_to_string(env.dir.path().join(format!("{what}.log"))).unwrap();
        assert!(status.success(), "{what} exited {status}: {log}");
    }
}
