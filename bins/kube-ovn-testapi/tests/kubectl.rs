//! kubectl (a client no one here wrote) against the `kube-ovn-testapi` binary on loopback.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Binary {
    child: Child,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl Binary {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        let child = Command::new(env!("CARGO_BIN_EXE_kube-ovn-testapi"))
            .args(["--listen", "127.0.0.1:0", "--kubeconfig"])
            .arg(&kubeconfig)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !kubeconfig.exists() {
            assert!(Instant::now() < deadline, "the binary wrote no kubeconfig");
            std::thread::sleep(Duration::from_millis(20));
        }
        Binary {
            child,
            kubeconfig,
            _dir: dir,
        }
    }

    fn kubectl(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs kubectl and returns stdout, failing the test on a non-zero exit.
    fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.kubectl(args);
        assert!(ok, "kubectl {args:?} failed: {err}{out}");
        out
    }

    fn terminate(mut self) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                assert!(s.success(), "the binary exited with {s}");
                return;
            }
            assert!(Instant::now() < deadline, "the binary ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[path = "../../../test-support/skip.rs"]
mod skip;

/// Whether kubectl runs; if not, the test is skipped ([`skip::skip`]: a failure under CI).
fn have_kubectl() -> bool {
    match Command::new("kubectl")
        .args(["version", "--client"])
        .output()
    {
        Ok(o) if o.status.success() => true,
        _ => {
            skip::skip("kubectl is not installed on this machine");
            false
        }
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

const MANIFEST: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  nodeName: node1
  containers:
  - name: c
    image: nginx
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: cfg
data:
  a: \"1\"
";

#[test]
fn kubectl_apply_get_label_annotate_patch_delete() {
    if !have_kubectl() {
        return;
    }
    let b = Binary::start();
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "m.yaml", MANIFEST);

    let out = b.ok(&["apply", "--validate=false", "-f", &f]);
    assert!(
        out.contains("pod/web created") && out.contains("configmap/cfg created"),
        "{out}"
    );
    // Re-applying a change goes through kubectl's three-way strategic merge patch.
    let f2 = write(
        dir.path(),
        "m2.yaml",
        &MANIFEST.replace("a: \"1\"", "a: \"2\""),
    );
    let out = b.ok(&["apply", "--validate=false", "-f", &f2]);
    assert!(
        out.contains("configmap/cfg configured") && out.contains("pod/web unchanged"),
        "{out}"
    );
    assert_eq!(b.ok(&["get", "cm", "cfg", "-o", "jsonpath={.data.a}"]), "2");

    let table = b.ok(&["get", "pods"]);
    assert!(
        table.starts_with("NAME") && table.contains("web"),
        "{table}"
    );
    let yaml = b.ok(&["get", "pod", "web", "-o", "yaml"]);
    assert!(
        yaml.contains("kind: Pod") && yaml.contains("uid:"),
        "{yaml}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&b.ok(&["get", "pods", "-o", "json"])).unwrap();
    assert_eq!(json["items"][0]["metadata"]["name"], "web");
    let by_node = b.ok(&[
        "get",
        "pods",
        "--field-selector",
        "spec.nodeName=node1",
        "-o",
        "name",
    ]);
    assert_eq!(by_node.trim(), "pod/web");

    b.ok(&["label", "pod", "web", "tier=fe"]);
    b.ok(&["annotate", "pod", "web", "note=hi"]);
    b.ok(&[
        "patch",
        "pod",
        "web",
        "-p",
        r#"{"metadata":{"labels":{"x":"y"}}}"#,
    ]);
    b.ok(&[
        "patch",
        "pod",
        "web",
        "--type=json",
        "-p",
        r#"[{"op":"add","path":"/metadata/labels/j","value":"k"}]"#,
    ]);
    b.ok(&[
        "patch",
        "cm",
        "cfg",
        "--type=merge",
        "-p",
        r#"{"data":{"b":"3"}}"#,
    ]);
    let labels = b.ok(&["get", "pod", "web", "-o", "jsonpath={.metadata.labels}"]);
    let labels: serde_json::Value = serde_json::from_str(&labels).unwrap();
    assert_eq!(
        labels,
        serde_json::json!({"app": "web", "tier": "fe", "x": "y", "j": "k"})
    );
    assert_eq!(
        b.ok(&[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.metadata.annotations.note}"
        ]),
        "hi"
    );
    assert_eq!(
        b.ok(&["get", "pods", "-l", "tier=fe", "-o", "name"]).trim(),
        "pod/web"
    );
    assert_eq!(b.ok(&["get", "cm", "cfg", "-o", "jsonpath={.data.b}"]), "3");

    b.ok(&["delete", "pod", "web"]);
    let (ok, _, err) = b.kubectl(&["get", "pod", "web"]);
    assert!(!ok && err.contains("NotFound"), "{err}");
    // Errors come back as Status objects kubectl prints.
    let (ok, _, err) = b.kubectl(&["get", "widgets"]);
    assert!(!ok && err.contains("doesn't have a resource type"), "{err}");
    b.terminate();
}

#[test]
fn kubectl_api_resources_crds_and_watch() {
    if !have_kubectl() {
        return;
    }
    let b = Binary::start();
    let dir = tempfile::tempdir().unwrap();
    let res = b.ok(&["api-resources"]);
    for line in [
        "pods",
        "po",
        "networkpolicies",
        "endpointslices",
        "leases",
        "customresourcedefinitions",
    ] {
        assert!(res.contains(line), "{line} missing in\n{res}");
    }
    let crd = write(
        dir.path(),
        "crd.yaml",
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.test.kubeovn.io
spec:
  group: test.kubeovn.io
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget, shortNames: [gd]}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
",
    );
    b.ok(&["apply", "--validate=false", "-f", &crd]);
    assert!(b
        .ok(&["api-resources", "--api-group=test.kubeovn.io"])
        .contains("gadgets"));

    // `get -w` sees what happens after it starts.
    let mut watch = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&b.kubeconfig)
        .args(["get", "gd", "-w", "-o", "name", "--request-timeout=0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let g = write(
        dir.path(),
        "g.yaml",
        "apiVersion: test.kubeovn.io/v1\nkind: Gadget\nmetadata: {name: g1}\nspec: {size: 3}\n",
    );
    b.ok(&["apply", "--validate=false", "-f", &g]);
    b.ok(&["label", "gd", "g1", "a=b"]);
    assert_eq!(
        b.ok(&["get", "gd", "g1", "-o", "jsonpath={.spec.size}"]),
        "3"
    );
    b.ok(&["delete", "gd", "g1"]);
    std::thread::sleep(Duration::from_millis(700));
    let _ = watch.kill();
    let out = watch.wait_with_output().unwrap();
    let seen = String::from_utf8_lossy(&out.stdout);
    assert!(
        seen.lines()
            .filter(|l| l.contains("gadget.test.kubeovn.io/g1"))
            .count()
            >= 3,
        "{seen}"
    );
    b.terminate();
}
