//! kube 5 clients against the in-memory server: list, watch, 410, conflicts, patches, finalizers,
//! CRDs and a kube-runtime Controller.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, CustomResource, CustomResourceExt, ResourceExt};
use kubeovn_testapi::{Config, TestApiServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The server and a client for it: over loopback HTTP, or in-process (no socket) when this file runs as
/// the `kube_client_in_process` suite.
async fn start(config: Config) -> (TestApiServer, Client) {
    if module_path!().starts_with("kube_client_in_process") {
        return TestApiServer::in_process(config).await.unwrap();
    }
    let server = TestApiServer::start(config).await.unwrap();
    let client = server.client().unwrap();
    (server, client)
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": {"app": "x"}}, "data": {"k": "v"}}),
    )
    .unwrap()
}

fn err_code(e: &kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("not an API error: {other:?}"),
    }
}

#[tokio::test]
async fn create_get_list_with_selectors_and_paging() {
    let (server, client) = start(Config::default()).await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..7 {
        api.create(&PostParams::default(), &cm(&format!("c{i}")))
            .await
            .unwrap();
    }
    let mut other = cm("z");
    other.metadata.labels = Some([("app".to_owned(), "y".to_owned())].into());
    api.create(&PostParams::default(), &other).await.unwrap();

    let got = api.get("c3").await.unwrap();
    assert_eq!(got.data.unwrap()["k"], "v");
    assert!(got.metadata.uid.is_some() && got.metadata.creation_timestamp.is_some());

    let l = api
        .list(&ListParams::default().labels("app=x"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 7);
    let l = api
        .list(&ListParams::default().fields("metadata.name=z"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 1);

    // Paging: 3 + 3 + 2.
    let mut names = Vec::new();
    let mut lp = ListParams::default().limit(3);
    loop {
        let page = api.list(&lp).await.unwrap();
        names.extend(page.items.iter().map(|c| c.name_any()));
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
    }
    assert_eq!(names.len(), 8);

    // generateName, AlreadyExists, missing namespace, kind mismatch.
    let mut g = cm("");
    g.metadata.name = None;
    g.metadata.generate_name = Some("gen-".into());
    let g = api.create(&PostParams::default(), &g).await.unwrap();
    assert!(g.name_any().starts_with("gen-") && g.name_any().len() == 9);
    assert_eq!(
        err_code(
            &api.create(&PostParams::default(), &cm("c1"))
                .await
                .unwrap_err()
        ),
        409
    );
    let missing: Api<ConfigMap> = Api::namespaced(client.clone(), "nope");
    assert_eq!(
        err_code(
            &missing
                .create(&PostParams::default(), &cm("a"))
                .await
                .unwrap_err()
        ),
        404
    );
    assert_eq!(err_code(&api.get("absent").await.unwrap_err()), 404);

    // All namespaces, and cluster-scoped namespaces.
    let all: Api<ConfigMap> = Api::all(client.clone());
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        9
    );
    let nss: Api<Namespace> = Api::all(client);
    assert!(nss.get("default").await.is_ok());
    server.shutdown().await;
}

#[tokio::test]
async fn pods_field_selector_on_node_name() {
    let (server, client) = start(Config::default()).await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    for (n, node) in [("a", "n1"), ("b", "n2"), ("c", "n1")] {
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": n},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}}))
        .unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let l = pods
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    assert_eq!(
        l.items.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
        ["a", "c"]
    );
    // Status subresource: the main resource ignores status, /status only takes status.
    let mut p = pods.get("a").await.unwrap();
    p.status = Some(serde_json::from_value(json!({"phase": "Running"})).unwrap());
    let after = pods.replace("a", &PostParams::default(), &p).await.unwrap();
    assert!(after.status.is_none());
    let after = pods
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    assert_eq!(after.status.unwrap().phase.as_deref(), Some("Running"));
    server.shutdown().await;
}

#[tokio::test]
async fn optimistic_concurrency_conflict() {
    let (server, client) = start(Config::default()).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let first = api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let mut a = first.clone();
    a.data = Some([("k".to_owned(), "1".to_owned())].into());
    let updated = api.replace("a", &PostParams::default(), &a).await.unwrap();
    assert_ne!(updated.resource_version(), first.resource_version());
    // The stale copy loses.
    let mut stale = first;
    stale.data = Some([("k".to_owned(), "2".to_owned())].into());
    let e = api
        .replace("a", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(err_code(&e), 409);
    match e {
        kube::Error::Api(s) => assert_eq!(s.reason, "Conflict"),
        _ => unreachable!(),
    }
    assert_eq!(api.get("a").await.unwrap().data.unwrap()["k"], "1");
    server.shutdown().await;
}

#[tokio::test]
async fn patches_of_each_type() {
    let (server, client) = start(Config::default()).await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let pp = PatchParams::default();
    let m = api
        .patch(
            "a",
            &pp,
            &Patch::Merge(
                json!({"metadata": {"labels": {"m": "1"}}, "data": {"k": null, "n": "2"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(m.labels().get("m").map(String::as_str), Some("1"));
    assert_eq!(m.data.as_ref().unwrap().get("k"), None);
    let jp: json_patch_ops::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}},
        {"op": "replace", "path": "/data/n", "value": "3"}
    ]))
    .unwrap();
    let j = api.patch("a", &pp, &Patch::<()>::Json(jp)).await.unwrap();
    assert_eq!(j.annotations()["a"], "b");
    assert_eq!(j.data.unwrap()["n"], "3");
    // A failing JSON patch test op is rejected and changes nothing.
    let bad: json_patch_ops::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/data/n", "value": "nope"}]))
            .unwrap();
    assert_eq!(
        err_code(
            &api.patch("a", &pp, &Patch::<()>::Json(bad))
                .await
                .unwrap_err()
        ),
        422
    );

    let pods: Api<Pod> = Api::namespaced(client, "default");
    let p: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "labels": {"a": "1"}},
        "spec": {"containers": [{"name": "c1", "image": "i1"}, {"name": "c2", "image": "i2"}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    let s = pods
        .patch(
            "p",
            &pp,
            &Patch::Strategic(json!({"metadata": {"labels": {"b": "2"}},
                "spec": {"containers": [{"name": "c2", "image": "i3"}]}})),
        )
        .await
        .unwrap();
    let spec = s.spec.unwrap();
    assert_eq!(spec.containers.len(), 2);
    assert_eq!(spec.containers[1].image.as_deref(), Some("i3"));
    assert_eq!(s.metadata.labels.unwrap().len(), 2);
    // Server-side apply is not supported: 415.
    let e = pods
        .patch(
            "p",
            &PatchParams::apply("t"),
            &Patch::Apply(json!({"metadata": {"name": "p"}})),
        )
        .await;
    assert_eq!(err_code(&e.unwrap_err()), 415);
    server.shutdown().await;
}

use json_patch as json_patch_ops;

#[tokio::test]
async fn finalizers_delay_deletion() {
    let (server, client) = start(Config::default()).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut c = cm("f");
    c.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&PostParams::default(), &c).await.unwrap();
    api.delete("f", &DeleteParams::default()).await.unwrap();
    let held = api.get("f").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    api.patch(
        "f",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(err_code(&api.get("f").await.unwrap_err()), 404);
    // deletecollection
    for n in ["x1", "x2"] {
        api.create(&PostParams::default(), &cm(n)).await.unwrap();
    }
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("app=x"),
    )
    .await
    .unwrap();
    assert!(api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());
    server.shutdown().await;
}

#[tokio::test]
async fn watch_resumes_from_a_resource_version() {
    let (server, client) = start(Config::default()).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    api.create(&PostParams::default(), &cm("b")).await.unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match stream.try_next().await.unwrap().unwrap() {
            WatchEvent::Added(c) => seen.push(format!("ADDED {}", c.name_any())),
            WatchEvent::Modified(c) => seen.push(format!("MODIFIED {}", c.name_any())),
            WatchEvent::Deleted(c) => seen.push(format!("DELETED {}", c.name_any())),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(seen, ["ADDED b", "MODIFIED a", "DELETED b"]);
    // Live events arrive too, and bookmarks when allowed.
    let last = api.create(&PostParams::default(), &cm("c")).await.unwrap();
    match stream.try_next().await.unwrap().unwrap() {
        WatchEvent::Added(c) => assert_eq!(c.name_any(), "c"),
        other => panic!("{other:?}"),
    }
    let mut bm = api
        .watch(
            &WatchParams::default().timeout(5),
            &last.resource_version().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(Duration::from_secs(4), bm.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        WatchEvent::Bookmark(b) => assert!(!b.metadata.resource_version.is_empty()),
        other => panic!("{other:?}"),
    }
    server.shutdown().await;
}

#[tokio::test]
async fn watch_from_a_compacted_version_gets_410_and_watcher_relists() {
    let (server, client) = start(Config {
        history_limit: 4,
        ..Config::default()
    })
    .await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    for i in 0..10 {
        api.create(&PostParams::default(), &cm(&format!("c{i}")))
            .await
            .unwrap();
    }
    let mut s = api
        .watch(&WatchParams::default().timeout(5), "1")
        .await
        .unwrap()
        .boxed();
    match s.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("expected 410, got {other:?}"),
    }
    // kube-runtime's watcher lists and then watches: it sees every object.
    let stream = watcher(api.clone(), watcher::Config::default()).applied_objects();
    let mut stream = stream.boxed();
    let mut names = std::collections::BTreeSet::new();
    while names.len() < 10 {
        let c = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        names.insert(c.name_any());
    }
    api.create(&PostParams::default(), &cm("late"))
        .await
        .unwrap();
    loop {
        let c = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if c.name_any() == "late" {
            break;
        }
    }
    server.shutdown().await;
}

#[tokio::test]
async fn bad_requests_leave_the_store_unchanged() {
    let server = TestApiServer::start(Config {
        max_body_bytes: 4096,
        ..Config::default()
    })
    .await
    .unwrap();
    let url = server.url();
    let rv = server.store().resource_version();
    let client = Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    let send = |method: &str, path: &str, body: Vec<u8>, ct: &str| {
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", ct)
            .body(body)
            .unwrap();
        let client = client.clone();
        async move {
            let r = client.request_text(req).await;
            match r {
                Err(kube::Error::Api(s)) => (s.code, s.reason),
                other => panic!("{other:?}"),
            }
        }
    };
    let cms = "/api/v1/namespaces/default/configmaps";
    assert_eq!(
        send("POST", cms, b"{not json".to_vec(), "application/json").await,
        (400, "BadRequest".into())
    );
    assert_eq!(
        send(
            "POST",
            "/api/v1/namespaces/default/widgets",
            b"{}".to_vec(),
            "application/json"
        )
        .await,
        (404, "NotFound".into())
    );
    let wrong_ns = br#"{"metadata":{"name":"a","namespace":"other"}}"#.to_vec();
    assert_eq!(
        send("POST", cms, wrong_ns, "application/json").await,
        (400, "BadRequest".into())
    );
    let wrong_kind = br#"{"kind":"Pod","metadata":{"name":"a"}}"#.to_vec();
    assert_eq!(
        send("POST", cms, wrong_kind, "application/json").await,
        (400, "BadRequest".into())
    );
    let huge = format!(
        r#"{{"metadata":{{"name":"a"}},"data":{{"k":"{}"}}}}"#,
        "x".repeat(10_000)
    );
    assert_eq!(
        send("POST", cms, huge.into_bytes(), "application/json").await,
        (413, "RequestEntityTooLarge".into())
    );
    assert_eq!(
        send(
            "PUT",
            "/api/v1/namespaces/default/configmaps",
            b"{}".to_vec(),
            "application/json"
        )
        .await,
        (405, "MethodNotAllowed".into())
    );
    assert_eq!(server.store().resource_version(), rv);
    server.shutdown().await;
}

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "test.kubeovn.io",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus"
)]
#[kube(shortname = "wd")]
struct WidgetSpec {
    size: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
struct WidgetStatus {
    doubled: i64,
}

#[tokio::test]
async fn crd_is_served_and_a_controller_reconciles_it() {
    let (server, client) = start(Config::default()).await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &Widget::crd())
        .await
        .unwrap();
    // Discovery knows it.
    let disc = kube::discovery::Discovery::new(client.clone())
        .run()
        .await
        .unwrap();
    let (ar, caps) = disc
        .resolve_gvk(&kube::api::GroupVersionKind::gvk(
            "test.kubeovn.io",
            "v1",
            "Widget",
        ))
        .unwrap();
    assert_eq!(ar.plural, "widgets");
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);

    let widgets: Api<Widget> = Api::namespaced(client.clone(), "default");
    let ctx = Arc::new(widgets.clone());
    async fn reconcile(w: Arc<Widget>, api: Arc<Api<Widget>>) -> Result<Action, kube::Error> {
        let want = w.spec.size * 2;
        if w.status.as_ref().map(|s| s.doubled) != Some(want) {
            api.patch_status(
                &w.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"doubled": want}})),
            )
            .await?;
        }
        Ok(Action::await_change())
    }
    fn error_policy(_: Arc<Widget>, _: &kube::Error, _: Arc<Api<Widget>>) -> Action {
        Action::requeue(Duration::from_millis(100))
    }
    let controller = tokio::spawn(
        Controller::new(widgets.clone(), watcher::Config::default())
            .run(reconcile, error_policy, ctx)
            .for_each(|_| async {}),
    );
    widgets
        .create(
            &PostParams::default(),
            &Widget::new("w1", WidgetSpec { size: 21 }),
        )
        .await
        .unwrap();
    let w2 = widgets
        .create(
            &PostParams::default(),
            &Widget::new("w2", WidgetSpec { size: 1 }),
        )
        .await
        .unwrap();
    assert_eq!(w2.metadata.generation, Some(1));
    widgets
        .patch(
            "w2",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 5}})),
        )
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let w1 = widgets.get("w1").await.unwrap();
        let w2 = widgets.get("w2").await.unwrap();
        if w1.status.map(|s| s.doubled) == Some(42) && w2.status.map(|s| s.doubled) == Some(10) {
            assert_eq!(w2.metadata.generation, Some(2));
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the controller did not reconcile"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    controller.abort();
    // Deleting the CRD stops serving the kind.
    crds.delete("widgets.test.kubeovn.io", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        err_code(&widgets.list(&ListParams::default()).await.unwrap_err()),
        404
    );
    server.shutdown().await;
}

#[tokio::test]
async fn selector_watches_see_objects_enter_and_leave() {
    let (server, client) = start(Config::default()).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let start_rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut s = api
        .watch(
            &WatchParams::default().labels("pick=yes").timeout(5),
            &start_rv,
        )
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let pp = PatchParams::default();
    let on = Patch::Merge(json!({"metadata": {"labels": {"pick": "yes"}}}));
    let off = Patch::Merge(json!({"metadata": {"labels": {"pick": "no"}}}));
    api.patch("a", &pp, &on).await.unwrap();
    api.patch("a", &pp, &Patch::Merge(json!({"data": {"k": "2"}})))
        .await
        .unwrap();
    api.patch("a", &pp, &off).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match s.try_next().await.unwrap().unwrap() {
            WatchEvent::Added(_) => seen.push("ADDED"),
            WatchEvent::Modified(_) => seen.push("MODIFIED"),
            WatchEvent::Deleted(_) => seen.push("DELETED"),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(seen, ["ADDED", "MODIFIED", "DELETED"]);
    server.shutdown().await;
}

#[tokio::test]
async fn streaming_list_watcher_gets_initial_events() {
    let (server, client) = start(Config::default()).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    for i in 0..5 {
        api.create(&PostParams::default(), &cm(&format!("c{i}")))
            .await
            .unwrap();
    }
    let mut stream = watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut init = 0;
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        match ev {
            watcher::Event::InitApply(_) => init += 1,
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(init, 5);
    api.create(&PostParams::default(), &cm("late"))
        .await
        .unwrap();
    match tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        watcher::Event::Apply(c) => assert_eq!(c.name_any(), "late"),
        other => panic!("{other:?}"),
    }
    server.shutdown().await;
}

#[tokio::test]
async fn many_creates_reach_three_watchers_in_order() {
    let (server, client) = start(Config::default()).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut watchers = Vec::new();
    for _ in 0..3 {
        watchers.push(
            api.watch(&WatchParams::default().timeout(30), &rv)
                .await
                .unwrap()
                .boxed(),
        );
    }
    let n = 300;
    let mut tasks = Vec::new();
    for t in 0..4 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..n / 4 {
                api.create(&PostParams::default(), &cm(&format!("t{t}-{i}")))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for mut w in watchers {
        let mut last = 0u64;
        let mut count = 0;
        while count < n {
            if let WatchEvent::Added(c) = w.try_next().await.unwrap().unwrap() {
                let rv: u64 = c.resource_version().unwrap().parse().unwrap();
                assert!(rv > last, "events out of order");
                last = rv;
                count += 1;
            }
        }
    }
    server.shutdown().await;
}

fn svc(v: serde_json::Value) -> Service {
    serde_json::from_value(v).unwrap()
}

/// The message of a refused request, failing the test on another code.
fn refused(r: Result<Service, kube::Error>, code: u16) -> String {
    match r {
        Err(kube::Error::Api(s)) if s.code == code => s.message,
        other => panic!("expected {code}, got {other:?}"),
    }
}

/// A Service created without `clusterIP` gets one from the range, with the fields and defaults
/// kube-apiserver fills; a taken or foreign address is refused with its message; an update
/// that omits the address keeps it, one that changes it is refused; deletion frees it.
#[tokio::test]
async fn services_get_cluster_ips_and_kube_apiserver_defaults() {
    let (server, client) = start(Config::default()).await;
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    let web = api
        .create(
            &pp,
            &svc(json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"},
                "ports": [{"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "dns"}]}})),
        )
        .await
        .unwrap();
    let spec = web.spec.clone().unwrap();
    let ip: std::net::Ipv4Addr = spec.cluster_ip.clone().unwrap().parse().unwrap();
    let octets = ip.octets();
    assert!(
        octets[0] == 10
            && (96..112).contains(&octets[1])
            && ip != std::net::Ipv4Addr::new(10, 96, 0, 0),
        "{ip} is not a usable address of 10.96.0.0/12"
    );
    assert_eq!(spec.cluster_ips, Some(vec![ip.to_string()]));
    assert_eq!(spec.ip_families, Some(vec!["IPv4".to_owned()]));
    assert_eq!(spec.ip_family_policy.as_deref(), Some("SingleStack"));
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(spec.session_affinity.as_deref(), Some("None"));
    assert_eq!(spec.internal_traffic_policy.as_deref(), Some("Cluster"));
    assert_eq!(spec.external_traffic_policy, None);
    let ports = spec.ports.clone().unwrap();
    assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
    assert_eq!(ports[0].target_port, Some(IntOrString::Int(80)));
    assert_eq!(
        ports[1].target_port,
        Some(IntOrString::String("dns".into()))
    );
    assert!(web.status.unwrap().load_balancer.is_some());

    // Another Service gets another address.
    let second = api
        .create(
            &pp,
            &svc(json!({"metadata": {"name": "second"}, "spec": {"ports": [{"port": 80}]}})),
        )
        .await
        .unwrap();
    let second_ip = second.spec.unwrap().cluster_ip.unwrap();
    assert_ne!(second_ip, ip.to_string());

    // Taken and foreign addresses: kube-apiserver's 422s, nothing stored.
    let rv = server.store().resource_version();
    let msg = refused(
        api.create(&pp, &svc(json!({"metadata": {"name": "dup"}, "spec": {"clusterIP": ip.to_string(), "ports": [{"port": 80}]}})))
            .await,
        422,
    );
    assert_eq!(
        msg,
        format!("Service \"dup\" is invalid: spec.clusterIPs: Invalid value: []string{{\"{ip}\"}}: failed to allocate IP {ip}: provided IP is already allocated")
    );
    let msg = refused(
        api.create(&pp, &svc(json!({"metadata": {"name": "far"}, "spec": {"clusterIP": "10.200.0.1", "ports": [{"port": 80}]}})))
            .await,
        422,
    );
    assert!(
        msg.contains("failed to allocate IP 10.200.0.1: the provided IP (10.200.0.1) is not in the valid range. The range of valid IPs is 10.96.0.0/12"),
        "{msg}"
    );
    let msg = refused(
        api.create(&pp, &svc(json!({"metadata": {"name": "net"}, "spec": {"clusterIP": "10.96.0.0", "ports": [{"port": 80}]}})))
            .await,
        422,
    );
    assert!(msg.contains("is not in the valid range"), "{msg}");
    assert_eq!(server.store().resource_version(), rv);

    // Replace without the address (kubectl replace/apply): kept. Changing it: refused.
    let mut put = api.get("web").await.unwrap();
    let s = put.spec.as_mut().unwrap();
    s.cluster_ip = None;
    s.cluster_ips = None;
    s.ip_families = None;
    s.ip_family_policy = None;
    s.selector = Some([("app".to_owned(), "web2".to_owned())].into());
    let put = api.replace("web", &pp, &put).await.unwrap();
    let s = put.spec.clone().unwrap();
    assert_eq!(s.cluster_ip, Some(ip.to_string()));
    assert_eq!(s.cluster_ips, Some(vec![ip.to_string()]));
    assert_eq!(s.ip_family_policy.as_deref(), Some("SingleStack"));
    let msg = refused(
        api.patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"clusterIP": "10.96.0.200"}})),
        )
        .await,
        422,
    );
    assert_eq!(
        msg,
        "Service \"web\" is invalid: spec.clusterIPs[0]: Invalid value: []string{\"10.96.0.200\"}: may not change once set"
    );

    // Deletion frees the address: it can be asked for again.
    api.delete("web", &DeleteParams::default()).await.unwrap();
    let again = api
        .create(&pp, &svc(json!({"metadata": {"name": "again"}, "spec": {"clusterIP": ip.to_string(), "ports": [{"port": 80}]}})))
        .await
        .unwrap();
    assert_eq!(again.spec.unwrap().cluster_ips, Some(vec![ip.to_string()]));

    // Type-dependent defaults, headless and ExternalName Services.
    let np = api
        .create(&pp, &svc(json!({"metadata": {"name": "np"}, "spec": {"type": "NodePort", "sessionAffinity": "ClientIP", "ports": [{"port": 80}]}})))
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(np.external_traffic_policy.as_deref(), Some("Cluster"));
    let timeout = np
        .session_affinity_config
        .and_then(|c| c.client_ip?.timeout_seconds);
    assert_eq!(timeout, Some(10800));
    let hl = api
        .create(&pp, &svc(json!({"metadata": {"name": "hl"}, "spec": {"clusterIP": "None", "selector": {"app": "x"}}})))
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(hl.cluster_ips, Some(vec!["None".to_owned()]));
    let en = api
        .create(&pp, &svc(json!({"metadata": {"name": "en"}, "spec": {"type": "ExternalName", "externalName": "example.com"}})))
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(
        (en.cluster_ip, en.cluster_ips, en.ip_families),
        (None, None, None)
    );

    // Ports kube-apiserver refuses.
    for (ports, want) in [
        (
            json!([{"port": 0}]),
            "spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive",
        ),
        (
            json!([{"name": "a", "port": 80}, {"name": "b", "port": 80}]),
            "spec.ports[1]: Duplicate value: core.ServicePort{Name:\"\", Protocol:\"TCP\"",
        ),
        (
            json!([{"port": 80}, {"port": 81}]),
            "spec.ports[0].name: Required value",
        ),
        (json!([]), "spec.ports: Required value"),
    ] {
        let rv = server.store().resource_version();
        let msg = refused(
            api.create(
                &pp,
                &svc(json!({"metadata": {"name": "bad"}, "spec": {"ports": ports}})),
            )
            .await,
            422,
        );
        assert!(msg.contains(want), "{msg}");
        assert_eq!(
            server.store().resource_version(),
            rv,
            "a refused Service changed the store"
        );
    }
    // Same port on two protocols is fine.
    api.create(&pp, &svc(json!({"metadata": {"name": "dns"}, "spec": {"ports": [{"name": "u", "port": 53, "protocol": "UDP"}, {"name": "t", "port": 53}]}})))
        .await
        .unwrap();
    server.shutdown().await;
}

/// A dual-stack range gives both families when the policy asks, in the order of `ipFamilies`;
/// a single-family range refuses RequireDualStack.
#[tokio::test]
async fn dual_stack_services_follow_ip_family_policy() {
    let (server, client) = start(Config {
        service_cluster_ip_range: "10.96.0.0/16,fd00:10:96::/112".into(),
        ..Config::default()
    })
    .await;
    let api: Api<Service> = Api::namespaced(client, "default");
    let pp = PostParams::default();
    let create = |name: &str, extra: serde_json::Value| {
        let mut spec = json!({"ports": [{"port": 80}]});
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let s = svc(json!({"metadata": {"name": name}, "spec": spec}));
        let api = api.clone();
        async move { api.create(&PostParams::default(), &s).await }
    };
    let fam = |s: &Service| {
        let s = s.spec.clone().unwrap();
        (
            s.cluster_ips.unwrap(),
            s.ip_families.unwrap(),
            s.ip_family_policy.unwrap(),
        )
    };
    let (ips, families, _) = fam(&create("single", json!({})).await.unwrap());
    assert_eq!(families, ["IPv4"]);
    assert!(ips[0].starts_with("10.96."), "{ips:?}");
    let (ips, families, policy) = fam(&create(
        "prefer",
        json!({"ipFamilyPolicy": "PreferDualStack"}),
    )
    .await
    .unwrap());
    assert_eq!(
        (families.as_slice(), policy.as_str()),
        (
            &["IPv4".to_owned(), "IPv6".to_owned()][..],
            "PreferDualStack"
        )
    );
    assert!(
        ips[0].starts_with("10.96.") && ips[1].starts_with("fd00:10:96::"),
        "{ips:?}"
    );
    assert_ne!(ips[1], "fd00:10:96::", "the network address");
    let (ips, families, policy) = fam(&create(
        "v6first",
        json!({"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6", "IPv4"]}),
    )
    .await
    .unwrap());
    assert_eq!(
        (families, policy.as_str()),
        (
            vec!["IPv6".to_owned(), "IPv4".to_owned()],
            "RequireDualStack"
        )
    );
    assert!(
        ips[0].starts_with("fd00:10:96::") && ips[1].starts_with("10.96."),
        "{ips:?}"
    );
    let (ips, families, _) = fam(&create("v6only", json!({"ipFamilies": ["IPv6"]}))
        .await
        .unwrap());
    assert_eq!((ips.len(), families), (1, vec!["IPv6".to_owned()]));
    // Both asked for, both kept; one of them taken: refused.
    let (ips, _, policy) = fam(&create(
        "asked",
        json!({"clusterIPs": ["fd00:10:96::99", "10.96.7.7"], "clusterIP": "fd00:10:96::99"}),
    )
    .await
    .unwrap());
    assert_eq!(
        (ips, policy.as_str()),
        (
            vec!["fd00:10:96::99".to_owned(), "10.96.7.7".to_owned()],
            "RequireDualStack"
        )
    );
    let msg = refused(
        create("taken", json!({"clusterIP": "fd00:10:96::99"})).await,
        422,
    );
    assert!(
        msg.contains("failed to allocate IP fd00:10:96::99: provided IP is already allocated"),
        "{msg}"
    );
    server.shutdown().await;

    let (server, client) = start(Config::default()).await;
    let api: Api<Service> = Api::namespaced(client, "default");
    let s = svc(
        json!({"metadata": {"name": "req"}, "spec": {"ipFamilyPolicy": "RequireDualStack", "ports": [{"port": 80}]}}),
    );
    let msg = refused(api.create(&pp, &s).await, 422);
    assert!(
        msg.contains("this cluster is not configured for dual-stack services"),
        "{msg}"
    );
    let prefer = svc(
        json!({"metadata": {"name": "prefer"}, "spec": {"ipFamilyPolicy": "PreferDualStack", "ports": [{"port": 80}]}}),
    );
    let (ips, families, _) = fam(&api.create(&pp, &prefer).await.unwrap());
    assert_eq!((ips.len(), families), (1, vec!["IPv4".to_owned()]));
    server.shutdown().await;
}

/// A full range refuses the next Service and serves again once one is deleted (also when its
/// namespace goes): a /30 has two usable addresses, never its network or broadcast address.
#[tokio::test]
async fn a_full_service_range_refuses_until_an_address_is_freed() {
    let (server, client) = start(Config {
        service_cluster_ip_range: "10.96.0.0/30".into(),
        ..Config::default()
    })
    .await;
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap(),
    )
    .await
    .unwrap();
    let team: Api<Service> = Api::namespaced(client.clone(), "team");
    let default: Api<Service> = Api::namespaced(client, "default");
    let pp = PostParams::default();
    let one =
        |name: &str| svc(json!({"metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}}));
    let a = team.create(&pp, &one("a")).await.unwrap();
    let b = default.create(&pp, &one("b")).await.unwrap();
    let a_ip = a.spec.unwrap().cluster_ip.unwrap();
    let mut got = vec![a_ip.clone(), b.spec.unwrap().cluster_ip.unwrap()];
    got.sort();
    assert_eq!(got, ["10.96.0.1", "10.96.0.2"]);
    let rv = server.store().resource_version();
    let msg = refused(default.create(&pp, &one("c")).await, 500);
    assert!(msg.contains("range is full"), "{msg}");
    assert_eq!(server.store().resource_version(), rv);
    // The namespace's deletion takes its Service and frees the address.
    nss.delete("team", &DeleteParams::default()).await.unwrap();
    let c = default.create(&pp, &one("c")).await.unwrap();
    assert_eq!(c.spec.unwrap().cluster_ip, Some(a_ip));
    server.shutdown().await;
}

/// kube-apiserver labels every Namespace with its name, on create and on update.
#[tokio::test]
async fn namespaces_carry_their_name_label() {
    let (server, client) = start(Config::default()).await;
    let nss: Api<Namespace> = Api::all(client);
    let label = |n: &Namespace| {
        n.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/metadata.name"))
            .cloned()
    };
    assert_eq!(
        label(&nss.get("kube-system").await.unwrap()).as_deref(),
        Some("kube-system")
    );
    let mut ns = nss
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "blue", "labels": {"team": "b"}}}))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(label(&ns).as_deref(), Some("blue"));
    ns.metadata.labels =
        Some([("kubernetes.io/metadata.name".to_owned(), "red".to_owned())].into());
    let ns = nss
        .replace("blue", &PostParams::default(), &ns)
        .await
        .unwrap();
    assert_eq!(label(&ns).as_deref(), Some("blue"));
    server.shutdown().await;
}

/// NodePort and LoadBalancer Services get node ports from the range, as kube-apiserver gives
/// them: a taken or foreign one refused, kept by a replace that omits them, freed when the
/// Service becomes a ClusterIP one.
#[tokio::test]
async fn node_ports_are_allocated_kept_and_freed() {
    let (server, client) = start(Config {
        service_node_port_range: "30000-30002".into(),
        ..Config::default()
    })
    .await;
    let api: Api<Service> = Api::namespaced(client, "default");
    let pp = PostParams::default();
    let node_ports = |s: &Service| -> Vec<Option<i32>> {
        s.spec
            .as_ref()
            .unwrap()
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| p.node_port)
            .collect()
    };
    let np = api
        .create(&pp, &svc(json!({"metadata": {"name": "np"}, "spec": {"type": "NodePort",
            "ports": [{"name": "dns-udp", "port": 53, "protocol": "UDP"}, {"name": "dns", "port": 53}, {"name": "web", "port": 80}]}})))
        .await
        .unwrap();
    // The same port number on two protocols shares its node port.
    let got = node_ports(&np);
    assert_eq!(got[0], got[1]);
    assert_ne!(got[0], got[2]);
    for n in got.iter().flatten() {
        assert!((30000..=30002).contains(n), "{got:?}");
    }
    let rv = server.store().resource_version();
    let msg = refused(
        api.create(
            &pp,
            &svc(
                json!({"metadata": {"name": "taken"}, "spec": {"type": "NodePort",
            "ports": [{"port": 80, "nodePort": got[2]}]}}),
            ),
        )
        .await,
        422,
    );
    assert_eq!(
        msg,
        format!("Service \"taken\" is invalid: spec.ports[0].nodePort: Invalid value: {}: provided port is already allocated", got[2].unwrap())
    );
    let msg = refused(
        api.create(
            &pp,
            &svc(
                json!({"metadata": {"name": "far"}, "spec": {"type": "NodePort",
            "ports": [{"port": 80, "nodePort": 31000}]}}),
            ),
        )
        .await,
        422,
    );
    assert!(
        msg.ends_with(
            "provided port is not in the valid range. The range of valid ports is 30000-30002"
        ),
        "{msg}"
    );
    assert_eq!(server.store().resource_version(), rv);
    // A LoadBalancer that asks for none gets none; the next one takes the last free port.
    let quiet = api
        .create(
            &pp,
            &svc(
                json!({"metadata": {"name": "quiet"}, "spec": {"type": "LoadBalancer",
            "allocateLoadBalancerNodePorts": false, "ports": [{"port": 80}]}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(node_ports(&quiet), [None]);
    let lb = api
        .create(&pp, &svc(json!({"metadata": {"name": "lb"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}})))
        .await
        .unwrap();
    assert_eq!(
        lb.spec.unwrap().external_traffic_policy.as_deref(),
        Some("Cluster")
    );
    let msg = refused(
        api.create(&pp, &svc(json!({"metadata": {"name": "full"}, "spec": {"type": "NodePort", "ports": [{"port": 80}]}})))
            .await,
        500,
    );
    assert!(msg.contains("range is full"), "{msg}");

    // A replace without the node ports keeps them.
    let mut put = api.get("np").await.unwrap();
    for p in put.spec.as_mut().unwrap().ports.as_mut().unwrap() {
        p.node_port = None;
    }
    assert_eq!(
        node_ports(&api.replace("np", &pp, &put).await.unwrap()),
        got
    );
    // Back to ClusterIP: the node ports go, and another Service can have them.
    let cip = api
        .patch(
            "np",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "ClusterIP"}})),
        )
        .await
        .unwrap();
    assert_eq!(node_ports(&cip), [None, None, None]);
    assert_eq!(cip.spec.unwrap().external_traffic_policy, None);
    let again = api
        .create(
            &pp,
            &svc(
                json!({"metadata": {"name": "again"}, "spec": {"type": "NodePort",
            "ports": [{"port": 80, "nodePort": got[2]}]}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(node_ports(&again), [got[2]]);
    server.shutdown().await;
}

#[tokio::test]
async fn apply_crds_creates_then_replaces_and_serves_at_once() {
    let (server, client) = start(Config::default()).await;
    server.apply_crds([Widget::crd()]).unwrap();
    let widgets: Api<Widget> = Api::namespaced(client.clone(), "default");
    widgets
        .create(
            &PostParams::default(),
            &Widget::new("w", WidgetSpec { size: 1 }),
        )
        .await
        .unwrap();
    // Again, with another short name: replaced, not refused; the objects stay.
    let mut crd = Widget::crd();
    crd.spec.names.short_names = Some(vec!["wdg".into()]);
    server.apply_crds([&crd]).unwrap();
    let stored = Api::<CustomResourceDefinition>::all(client)
        .get("widgets.test.kubeovn.io")
        .await
        .unwrap();
    assert_eq!(stored.spec.names.short_names, Some(vec!["wdg".into()]));
    assert_eq!(widgets.get("w").await.unwrap().spec.size, 1);
    server.shutdown().await;
}

#[tokio::test]
async fn in_process_needs_no_socket_and_stops_with_the_server() {
    let (server, client) = TestApiServer::in_process(Config::default()).await.unwrap();
    assert_eq!(server.addr(), "0.0.0.0:0".parse().unwrap());
    // client() of a server without a socket is in-process too, and sees the same store.
    let other = server.client().unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let mut stream = watcher(api.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    Api::<ConfigMap>::default_namespaced(other)
        .create(&PostParams::default(), &cm("seen"))
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.name_any(), "seen");
    let late = server.in_process_client();
    server.shutdown().await;
    // Requests after the shutdown are refused with 503.
    let e = Api::<ConfigMap>::default_namespaced(late)
        .get("seen")
        .await
        .unwrap_err();
    assert_eq!(err_code(&e), 503);
}

#[tokio::test]
async fn kubeconfig_in_a_directory_names_the_server() {
    let server = TestApiServer::start(Config::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = server.write_kubeconfig_in(dir.path()).unwrap();
    assert_eq!(path, dir.path().join("kubeconfig"));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains(&format!("server: {}", server.url())),
        "{text}"
    );
    server.shutdown().await;
}
