//! The deploy manifests in dist/: the CRDs are exactly what the code generates (`kube-ovn-controller crd`),
//! every manifest parses (`kubectl kustomize dist/` reads them all), and the kinds the test API server
//! serves (CRDs, the ConfigMap) are accepted by it through kubectl, with a conflist that names our shim.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn dist() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist")
}

use kubeovn_test_support::skip;

/// Whether kubectl runs; if not, the test is skipped ([`skip::skip`]: a failure under CI).
fn have_kubectl() -> bool {
    let ok = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip::skip("kubectl is not installed");
    }
    ok
}

#[test]
fn crds_are_the_generated_ones() {
    let file = std::fs::read_to_string(dist().join("crds.yaml")).unwrap();
    assert!(
        file == kubeovn_core::crd::crds_yaml(),
        "dist/crds.yaml is stale: regenerate it with `kube-ovn-controller crd > dist/crds.yaml`"
    );
}

#[test]
fn every_manifest_parses() {
    if !have_kubectl() {
        return;
    }
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dist())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut kinds: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("kind: "))
        .collect();
    kinds.sort_unstable();
    let count = |k: &str| kinds.iter().filter(|x| **x == k).count();
    assert_eq!(
        count("CustomResourceDefinition"),
        kubeovn_core::crd::crds().len()
    );
    assert_eq!(
        count("Deployment"),
        2,
        "ovn-central and kube-ovn-controller"
    );
    assert_eq!(count("DaemonSet"), 2, "ovs-ovn and kube-ovn-cni");
    assert_eq!(count("ConfigMap"), 1);
    assert_eq!(count("ServiceAccount"), 3);
    assert_eq!(count("ClusterRole"), count("ClusterRoleBinding"));
    for name in [
        "kube-ovn-controller",
        "kube-ovn-cni",
        "ovn-central",
        "ovs-ovn",
        "ovn-config",
    ] {
        assert!(text.contains(&format!("name: {name}\n")), "{name} missing");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_kinds_apply_to_the_api_server() {
    if !have_kubectl() {
        return;
    }
    let api = kubeovn_testapi::TestApiServer::start(kubeovn_testapi::Config::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kc).unwrap();
    let kubectl = |args: &[&str]| {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kc)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let crds = dist().join("crds.yaml");
    let config = dist().join("config.yaml");
    kubectl(&[
        "create",
        "-f",
        crds.to_str().unwrap(),
        "-f",
        config.to_str().unwrap(),
    ]);
    for kind in ["subnets", "vpcs", "ips", "ippools"] {
        kubectl(&["get", kind]);
    }
    let cm: Value = serde_json::from_str(&kubectl(&[
        "get",
        "configmap",
        "-n",
        "kube-system",
        "ovn-config",
        "-o",
        "json",
    ]))
    .unwrap();
    let conflist: Value =
        serde_json::from_str(cm["data"]["01-kube-ovn.conflist"].as_str().unwrap()).unwrap();
    assert_eq!(conflist["plugins"][0]["type"], "kube-ovn");
    assert_eq!(cm["data"]["default-cidr"], "10.16.0.0/16");
    api.shutdown().await;
}
