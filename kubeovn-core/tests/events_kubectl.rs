//! A bad pod annotation published through kube-runtime's Recorder (behind `EventSink`) to the project's test
//! API server, and read back with kubectl as a Warning on the pod.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::process::Command;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Recorder, Reporter};
use kubeovn_core::annotations::{PodNetworkAnnotations, MAC_ADDRESS};
use kubeovn_core::events::{warn_bad_annotation, EventSink};

use kubeovn_test_support::skip;

#[test]
fn bad_annotation_is_a_warning_event_on_the_pod() {
    if Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_err()
    {
        skip::skip("kubectl is not installed on this machine");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = rt
        .block_on(kubeovn_testapi::TestApiServer::start(
            kubeovn_testapi::Config::default(),
        ))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = server.write_kubeconfig_in(dir.path()).unwrap();

    let anns = BTreeMap::from([(MAC_ADDRESS.to_owned(), "00:00:00:zz:00:01".to_owned())]);
    let err = PodNetworkAnnotations::parse(&anns, "ovn").unwrap_err();
    let pod = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some("default".into()),
        name: Some("web-0".into()),
        uid: Some("0b5c8f0e-1111-2222-3333-444455556666".into()),
        ..Default::default()
    };
    rt.block_on(async {
        let client = server.client().unwrap();
        let recorder = Recorder::new(client, Reporter::from("kube-ovn-controller"));
        let sink: &dyn EventSink = &recorder;
        warn_bad_annotation(sink, &pod, &err).await.unwrap();
    });

    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kc)
        .args(["get", "events.events.k8s.io", "-n", "default", "-o", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ev = &list["items"][0];
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["reason"], "InvalidAnnotation");
    assert_eq!(ev["regarding"]["name"], "web-0");
    assert_eq!(ev["reportingController"], "kube-ovn-controller");
    let note = ev["note"].as_str().unwrap();
    assert!(
        note.contains(MAC_ADDRESS) && note.contains("00:00:00:zz:00:01"),
        "{note}"
    );

    rt.block_on(server.shutdown());
}
