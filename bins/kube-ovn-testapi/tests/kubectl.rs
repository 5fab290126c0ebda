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
        Self::start_with(&[])
    }

    /// Starts the binary with more flags.
    fn start_with(flags: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        let child = Command::new(env!("CARGO_BIN_EXE_kube-ovn-testapi"))
            .args(["--listen", "127.0.0.1:0", "--kubeconfig"])
            .arg(&kubeconfig)
            .args(flags)
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
        self.kubectl_of(Path::new("kubectl"), args)
    }

    /// Runs one kubectl binary, with its own discovery and OpenAPI cache in the test's directory.
    fn kubectl_of(&self, kubectl: &Path, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(
                self._dir
                    .path()
                    .join(format!("cache-{}", kubectl.display()).replace('/', "_")),
            )
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
        self.ok_of(Path::new("kubectl"), args)
    }

    /// [`Self::ok`] with one kubectl binary.
    fn ok_of(&self, kubectl: &Path, args: &[&str]) -> String {
        let (ok, out, err) = self.kubectl_of(kubectl, args);
        assert!(ok, "{} {args:?} failed: {err}{out}", kubectl.display());
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

use kubeovn_test_support::skip;

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

    let out = b.ok(&["apply", "-f", &f]);
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
    let out = b.ok(&["apply", "-f", &f2]);
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
    b.ok(&["apply", "-f", &crd]);
    assert!(b
        .ok(&["api-resources", "--api-group=test.kubeovn.io"])
        .contains("gadgets"));

    // `get -w` sees what happens after it starts. It lists first (g0, made before it) and then watches from
    // the list's resourceVersion: once g0's line is printed, every later change is delivered.
    let g0 = write(
        dir.path(),
        "g0.yaml",
        "apiVersion: test.kubeovn.io/v1\nkind: Gadget\nmetadata: {name: g0}\nspec: {size: 1}\n",
    );
    b.ok(&["apply", "-f", &g0]);
    let mut watch = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&b.kubeconfig)
        .args(["get", "gd", "-w", "-o", "name", "--request-timeout=0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let stdout = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for l in std::io::BufReader::new(stdout).lines() {
            if l.is_err() || tx.send(l.unwrap()).is_err() {
                return;
            }
        }
    });
    let mut seen: Vec<String> = Vec::new();
    let mut until = |n: usize, name: &str| {
        while seen.iter().filter(|l| l.as_str() == name).count() < n {
            let l = lines
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("{e}: waiting for {name} in {seen:?}"));
            seen.push(l);
        }
    };
    until(1, "gadget.test.kubeovn.io/g0");
    let g = write(
        dir.path(),
        "g.yaml",
        "apiVersion: test.kubeovn.io/v1\nkind: Gadget\nmetadata: {name: g1}\nspec: {size: 3}\n",
    );
    b.ok(&["apply", "-f", &g]);
    b.ok(&["label", "gd", "g1", "a=b"]);
    assert_eq!(
        b.ok(&["get", "gd", "g1", "-o", "jsonpath={.spec.size}"]),
        "3"
    );
    b.ok(&["delete", "gd", "g1"]);
    // Created, labelled, deleted: three events of g1.
    until(3, "gadget.test.kubeovn.io/g1");
    let _ = watch.kill();
    let _ = watch.wait();
    b.terminate();
}

/// Every kubectl minor version installed beside `kubectl` (`kubectl.1.27` ... `kubectl.1.33`),
/// or plain `kubectl` when there are none.
fn kubectl_versions() -> Vec<PathBuf> {
    let dir = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("kubectl"))
        .find(|k| k.exists())
        .and_then(|k| std::fs::canonicalize(k).ok())
        .and_then(|k| k.parent().map(Path::to_path_buf));
    let mut found: Vec<(u32, PathBuf)> = dir
        .and_then(|d| std::fs::read_dir(d).ok())
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let p = e.ok()?.path();
            let minor = p
                .file_name()?
                .to_str()?
                .strip_prefix("kubectl.1.")?
                .parse()
                .ok()?;
            Some((minor, p))
        })
        .collect();
    found.sort();
    if found.is_empty() {
        return vec![PathBuf::from("kubectl")];
    }
    found.into_iter().map(|(_, p)| p).collect()
}

const GADGET_CRD: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gizmos.test.kubeovn.io
spec:
  group: test.kubeovn.io
  scope: Namespaced
  names: {plural: gizmos, singular: gizmo, kind: Gizmo}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        description: A gizmo for the kubectl tests.
        properties:
          spec:
            type: object
            properties:
              size: {type: integer, description: How big the gizmo is.}
              color: {type: string}
";

/// kubectl's typed commands send protobuf bodies (1.32 on), `apply` reads the OpenAPI
/// documents to validate (v2 protobuf up to 1.28, v3 after) and `explain` renders them: each
/// installed kubectl version works as against a cluster, without `--validate=false`.
#[test]
fn kubectl_versions_create_run_expose_apply_explain() {
    if !have_kubectl() {
        return;
    }
    let b = Binary::start();
    let dir = tempfile::tempdir().unwrap();
    let crd = write(dir.path(), "crd.yaml", GADGET_CRD);
    b.ok(&["apply", "-f", &crd]);
    let versions = kubectl_versions();
    println!("kubectl versions: {versions:?}");
    for (i, k) in versions.iter().enumerate() {
        let ns = format!("ns{i}");
        let out = b.ok_of(k, &["create", "namespace", &ns]);
        assert!(out.contains(&format!("namespace/{ns} created")), "{out}");
        let run = |args: &[&str]| {
            let mut a: Vec<String> = vec!["-n".into(), ns.clone()];
            a.extend(args.iter().map(|s| (*s).to_owned()));
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            b.ok_of(k, &a)
        };
        run(&[
            "create",
            "deployment",
            "web",
            "--image=nginx:1.27",
            "--replicas=3",
            "--port=80",
        ]);
        run(&[
            "run",
            "solo",
            "--image=busybox",
            "--labels=app=solo",
            "--env=MODE=test",
        ]);
        run(&[
            "expose",
            "deployment",
            "web",
            "--port=8080",
            "--target-port=80",
        ]);
        run(&["create", "configmap", "conf", "--from-literal=k=v"]);
        run(&[
            "create",
            "secret",
            "generic",
            "pw",
            "--from-literal=p=s3cret",
        ]);

        let dep: serde_json::Value =
            serde_json::from_str(&run(&["get", "deployment", "web", "-o", "json"])).unwrap();
        assert_eq!(dep["spec"]["replicas"], 3, "{dep}");
        assert_eq!(
            dep["spec"]["selector"]["matchLabels"]["app"], "web",
            "{dep}"
        );
        let c = &dep["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["image"], "nginx:1.27", "{dep}");
        assert_eq!(c["ports"][0]["containerPort"], 80, "{dep}");
        let out = run(&["scale", "deployment", "web", "--replicas=5"]);
        assert!(out.contains("deployment.apps/web scaled"), "{out}");
        assert_eq!(
            run(&[
                "get",
                "deployment",
                "web",
                "-o",
                "jsonpath={.spec.replicas}"
            ]),
            "5"
        );
        let pod: serde_json::Value =
            serde_json::from_str(&run(&["get", "pod", "solo", "-o", "json"])).unwrap();
        assert_eq!(pod["metadata"]["labels"]["app"], "solo", "{pod}");
        assert_eq!(
            pod["spec"]["containers"][0]["env"][0]["value"], "test",
            "{pod}"
        );
        assert!(
            pod["metadata"]
                .get("resourceVersion")
                .is_some_and(|v| v != ""),
            "{pod}"
        );
        let svc: serde_json::Value =
            serde_json::from_str(&run(&["get", "service", "web", "-o", "json"])).unwrap();
        assert_eq!(svc["spec"]["ports"][0]["port"], 8080, "{svc}");
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], 80, "{svc}");
        assert_eq!(svc["spec"]["selector"]["app"], "web", "{svc}");
        assert_eq!(
            run(&["get", "secret", "pw", "-o", "jsonpath={.data.p}"]),
            "czNjcmV0"
        );

        // apply validates against the OpenAPI documents, then re-applies through a patch.
        let m = write(
            dir.path(),
            "m.yaml",
            &MANIFEST.replace("name: cfg", &format!("name: cfg{i}")),
        );
        let out = run(&["apply", "-f", &m]);
        assert!(out.contains("pod/web created"), "{out}");
        let g = format!("apiVersion: test.kubeovn.io/v1\nkind: Gizmo\nmetadata: {{name: g1, namespace: {ns}}}\nspec: {{size: 3}}\n");
        let gf = write(dir.path(), "g.yaml", &g);
        run(&["apply", "-f", &gf]);
        let gf = write(
            dir.path(),
            "g.yaml",
            &g.replace("size: 3", "size: 4, color: red"),
        );
        let out = run(&["apply", "-f", &gf]);
        assert!(out.contains("gizmo.test.kubeovn.io/g1 configured"), "{out}");
        assert_eq!(
            run(&[
                "get",
                "gizmo",
                "g1",
                "-o",
                "jsonpath={.spec.size}/{.spec.color}"
            ]),
            "4/red"
        );

        // Typos fail as on a cluster: kubectl leaves them to the server's strict validation.
        let bad = write(
            dir.path(),
            "bad.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bad}\ndatta: {a: b}\n",
        );
        let (ok, _, err) = b.kubectl_of(k, &["-n", &ns, "apply", "-f", &bad]);
        assert!(!ok && err.contains(r#"unknown field "datta""#), "{err}");
        let gf = write(dir.path(), "g.yaml", &g.replace("size: 3", "colour: red"));
        let (ok, _, err) = b.kubectl_of(k, &["apply", "-f", &gf]);
        assert!(
            !ok && err.contains(r#"unknown field "spec.colour""#),
            "{err}"
        );

        // A server-side dry run must not persist anything.
        let (ok, _, err) = b.kubectl_of(
            k,
            &["-n", &ns, "create", "configmap", "dry", "--dry-run=server"],
        );
        assert!(!ok && err.contains("dryRun is not supported"), "{err}");
        let (ok, _, err) = b.kubectl_of(k, &["-n", &ns, "get", "configmap", "dry"]);
        assert!(!ok && err.contains("NotFound"), "{err}");

        let out = b.ok_of(k, &["explain", "pods.spec.containers.ports"]);
        assert!(
            out.contains("ContainerPort") && out.contains("containerPort"),
            "{out}"
        );
        let out = b.ok_of(k, &["explain", "deployments.spec"]);
        assert!(
            out.contains("replicas") && out.contains("template"),
            "{out}"
        );
        let out = b.ok_of(k, &["explain", "gizmos.spec"]);
        assert!(
            out.contains("How big the gizmo is") && out.contains("color"),
            "{out}"
        );
    }
    b.terminate();
}

const DUAL_STACK_SERVICE: &str = "apiVersion: v1
kind: Service
metadata: {name: both}
spec:
  ipFamilyPolicy: PreferDualStack
  ipFamilies: [IPv6, IPv4]
  selector: {run: web}
  ports: [{port: 80, targetPort: 8080}]
";

/// What a user types to give a pod a Service (`expose`, `create service`, `get svc`, `apply`)
/// works with kubectl 1.27, 1.32 and 1.33 (protobuf bodies from 1.32 on): ClusterIPs come
/// from `--service-cluster-ip-range`, both families when asked, a taken one is refused, and
/// deleting a Service frees its address; a NodePort Service shows its node port.
#[test]
fn kubectl_expose_and_create_service_get_cluster_ips() {
    if !have_kubectl() {
        return;
    }
    let b = Binary::start_with(&[
        "--service-cluster-ip-range",
        "10.96.0.0/12,fd00:10:96::/108",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let both = write(dir.path(), "both.yaml", DUAL_STACK_SERVICE);
    let versions: Vec<PathBuf> = kubectl_versions()
        .into_iter()
        .filter(|k| {
            let n = k.file_name().and_then(|n| n.to_str()).unwrap_or("");
            n == "kubectl.1.27" || n == "kubectl.1.32" || n == "kubectl.1.33" || n == "kubectl"
        })
        .collect();
    println!("kubectl versions: {versions:?}");
    let mut seen = Vec::new();
    for (i, k) in versions.iter().enumerate() {
        let ns = format!("svc{i}");
        b.ok_of(k, &["create", "namespace", &ns]);
        let run = |args: &[&str]| {
            let mut a: Vec<&str> = vec!["-n", &ns];
            a.extend(args);
            b.ok_of(k, &a)
        };
        run(&[
            "run",
            "web",
            "--image=any",
            "--",
            "python3",
            "-m",
            "http.server",
            "8080",
        ]);
        let out = run(&[
            "expose",
            "pod",
            "web",
            "--port",
            "80",
            "--target-port",
            "8080",
        ]);
        assert!(out.contains("service/web exposed"), "{out}");
        let out = run(&["create", "service", "clusterip", "x", "--tcp=80:8080"]);
        assert!(out.contains("service/x created"), "{out}");

        let list: serde_json::Value =
            serde_json::from_str(&run(&["get", "svc", "-o", "json"])).unwrap();
        let items = list["items"].as_array().unwrap();
        assert_eq!(items.len(), 2, "{list}");
        for svc in items {
            let spec = &svc["spec"];
            let ip: std::net::Ipv4Addr = spec["clusterIP"].as_str().unwrap().parse().unwrap();
            assert!(
                ip.octets()[0] == 10 && (96..112).contains(&ip.octets()[1]),
                "{svc}"
            );
            assert_eq!(
                spec["clusterIPs"],
                serde_json::json!([ip.to_string()]),
                "{svc}"
            );
            assert_eq!(spec["ipFamilies"], serde_json::json!(["IPv4"]), "{svc}");
            assert_eq!(spec["ports"][0]["port"], 80, "{svc}");
            assert_eq!(spec["ports"][0]["targetPort"], 8080, "{svc}");
            assert_eq!(spec["ports"][0]["protocol"], "TCP", "{svc}");
            assert!(!seen.contains(&ip), "{ip} handed out twice");
            seen.push(ip);
        }
        let web_ip = items
            .iter()
            .find(|s| s["metadata"]["name"] == "web")
            .unwrap()["spec"]["clusterIP"]
            .as_str()
            .unwrap()
            .to_owned();

        // The table kubectl prints, as on a cluster.
        let table = run(&["get", "svc"]);
        let mut lines = table.lines();
        let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        assert_eq!(
            header,
            [
                "NAME",
                "TYPE",
                "CLUSTER-IP",
                "EXTERNAL-IP",
                "PORT(S)",
                "AGE"
            ],
            "{table}"
        );
        let web: Vec<&str> = lines
            .find(|l| l.starts_with("web "))
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(
            web[..5],
            ["web", "ClusterIP", &web_ip, "<none>", "80/TCP"],
            "{table}"
        );
        run(&["create", "service", "nodeport", "np", "--tcp=80:8080"]);
        let np = run(&["get", "svc", "np"]);
        assert!(np.contains("NodePort") && np.contains("80:30"), "{np}");
        let wide = run(&["get", "svc", "web", "-o", "wide"]);
        assert!(
            wide.contains("SELECTOR") && wide.contains("run=web"),
            "{wide}"
        );

        // Taken: refused with kube-apiserver's message. Freed by deletion: given again.
        let (ok, _, err) = b.kubectl_of(
            k,
            &[
                "-n",
                &ns,
                "create",
                "service",
                "clusterip",
                "y",
                "--tcp=80:8080",
                "--clusterip",
                &web_ip,
            ],
        );
        assert!(
            !ok && err.contains(&format!(
                "failed to allocate IP {web_ip}: provided IP is already allocated"
            )),
            "{err}"
        );
        run(&["delete", "svc", "web"]);
        run(&[
            "create",
            "service",
            "clusterip",
            "y",
            "--tcp=80:8080",
            "--clusterip",
            &web_ip,
        ]);
        assert_eq!(
            run(&["get", "svc", "y", "-o", "jsonpath={.spec.clusterIP}"]),
            web_ip
        );

        // Dual stack through apply, in the order of ipFamilies; applied again, unchanged.
        run(&["apply", "-f", &both]);
        let ips = run(&["get", "svc", "both", "-o", "jsonpath={.spec.clusterIPs[*]}"]);
        let ips: Vec<&str> = ips.split_whitespace().collect();
        assert!(
            ips.len() == 2 && ips[0].starts_with("fd00:10:96::") && ips[1].starts_with("10."),
            "{ips:?}"
        );
        let out = run(&["apply", "-f", &both]);
        assert!(
            out.contains("unchanged") || out.contains("configured"),
            "{out}"
        );
        let again = run(&["get", "svc", "both", "-o", "jsonpath={.spec.clusterIPs[*]}"]);
        assert_eq!(again.split_whitespace().collect::<Vec<_>>(), ips);
    }
    b.terminate();
}
