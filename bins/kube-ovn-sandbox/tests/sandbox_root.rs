//! The whole sandbox as a user runs it (needs root, the OVN/OVS packages and kubectl): `up` brings up every
//! process, the demo pods and an all-answering ping matrix; kubectl sees the pods; pods created with kubectl
//! get sandboxes and run their containers' commands there (an HTTP server reached from another pod and from
//! the host, Ready only once its probe connects; a job restarted once; an exec probe turning Ready and back),
//! with `logs` showing their output; the containers outlive a kubelet restart; deleting a pod stops its
//! processes and removes its network namespace; `up` again is harmless; `down` leaves no process, network
//! namespace or link behind.
//!
//! Run it in a network namespace of its own when another ovs-vswitchd runs on the machine:
//! `unshare --net --mount -- sh -c 'mount -t sysfs sysfs /sys && ip link set lo up && cargo test -p
//! kube-ovn-sandbox --test sandbox_root'`.

#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::Duration;

use kubeovn_sandbox::procs::{self, ProcRecord};

mod common;
use common::*;

#[test]
fn up_ping_kubectl_exec_down() {
    if !runnable() {
        return;
    }
    let (sb, out) = up(
        "sbt",
        &[
            "--default-cidr",
            "10.247.0.0/16",
            "--join-cidr",
            "100.97.0.0/16",
            "--demo-cidr",
            "10.248.0.0/24",
            "--demo-pods",
            "2",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "up failed");
    // 2 + 2 pods and the node: 5 endpoints, 20 pairs.
    assert!(stdout.contains("all 20 pairs answered"), "{stdout}");
    // The same pairs over TCP and UDP, pod to pod on one switch, across the router, and to and from the node.
    assert!(
        stdout.contains("all 20 pairs carried TCP and UDP"),
        "{stdout}"
    );
    assert!(
        stdout.contains("10.248.0."),
        "demo subnet address: {stdout}"
    );

    // kubectl sees the pods, scheduled, running, with addresses in their subnets.
    let pods = sb.pods();
    assert_eq!(pods.len(), 4, "{pods:?}");
    for p in &pods {
        assert_eq!(p["status"]["phase"], "Running", "{p}");
        let ip = p["status"]["podIP"].as_str().unwrap();
        let want = if p["metadata"]["namespace"] == "demo" {
            "10.248.0."
        } else {
            "10.247."
        };
        assert!(ip.starts_with(want), "{ip} of {}", p["metadata"]["name"]);
    }
    assert_eq!(sb.netns().len(), 4, "{:?}", sb.netns());
    assert!(link_exists(&sb.nic), "join interface");
    // One EndpointSlice controller for the cluster, beside (not inside) the kubelet, with one node too.
    let pids: Vec<ProcRecord> =
        serde_json::from_slice(&std::fs::read(sb.dir.path().join("pids.json")).unwrap()).unwrap();
    let named = |n: &str| pids.iter().filter(|p| p.name == n && p.alive()).count();
    assert_eq!(
        (
            named(kubeovn_sandbox::sandbox::ENDPOINTS_PROCESS),
            named("kubelet")
        ),
        (1, 1),
        "{pids:?}"
    );

    // kubectl-ko against the sandbox: passthrough, diagnose, trace across the router.
    let out = sb.ko(&["nbctl", "ls-list"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && text.contains("(demo)") && text.contains("(ovn-default)"),
        "{text}"
    );
    let out = sb.ko(&["diagnose"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("PASS  pod demo/app-2: interface on the bridge with ovn-installed"),
        "{text}"
    );
    for pair in [
        "default/web-2 -> default/web-1",
        "default/web-1 -> demo/app-2",
    ] {
        assert!(
            text.contains(&format!("PASS  TCP and UDP {pair} (")),
            "{pair}: {text}"
        );
    }
    let web1 = pods
        .iter()
        .find(|p| p["metadata"]["name"] == "web-1")
        .and_then(|p| p["status"]["podIP"].as_str())
        .unwrap()
        .to_owned();
    let out = sb.ko(&["trace", "demo/app-1", &web1]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(text.contains("output to \"web-1.default\""), "{text}");

    // Monitoring: the pinger's one-shot report and the monitor's database probes.
    let dir = sb.dir.path().to_str().unwrap();
    let out = sb.tool("kube-ovn-pinger", &["--sandbox", dir, "--once"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("all pairs answered"));
    let out = sb.tool("kube-ovn-monitor", &["--sandbox", dir, "--once"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("kube_ovn_monitor_db_connected{db=\"sb\"} 1"),
        "{text}"
    );

    // Pods whose containers run host processes in their network namespaces (the images are ignored):
    // - web: a shell that says where it runs, waits 2 s, then serves HTTP on 8080; Ready only once its
    //   tcpSocket probe (named port) connects;
    // - job: fails once, then succeeds (restartPolicy OnFailure): one restart, then Succeeded;
    // - extra: sleeps, Ready while its exec probe finds a file (and unready again when it is gone); each run
    //   of the probe leaves a line in `extra-probes` first.
    let flag = sb.dir.path().join("extra-ready");
    let probes = sb.dir.path().join("extra-probes");
    let job_mark = sb.dir.path().join("job-ran");
    let pods_json = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default"},
         "spec": {"containers": [{"name": "web", "image": "any",
            "command": ["sh", "-c"],
            "args": ["echo serving on $(POD_IP); sleep 2; exec python3 -m http.server 8080"],
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "ports": [{"name": "http", "containerPort": 8080}],
            "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 1}}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "job", "namespace": "default"},
         "spec": {"restartPolicy": "OnFailure", "containers": [{"name": "job", "image": "any",
            "command": ["sh", "-c", format!(
                "if [ -e {m} ]; then echo second run; exit 0; fi; touch {m}; echo first run; exit 3",
                m = job_mark.display())]}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "extra", "namespace": "default"},
         "spec": {"containers": [{"name": "extra", "image": "registry.k8s.io/pause:3.10",
            "args": ["sleep", "600"],
            "readinessProbe": {"exec": {"command": ["sh", "-c", format!(
                "echo probed >> {p}; test -e {f}", p = probes.display(), f = flag.display())]},
                               "periodSeconds": 1, "failureThreshold": 1}}]}}
    ]});
    sb.apply(&pods_json);

    // web: running but unready while it sleeps; Ready only when the server answers.
    let mut saw_unready_running = false;
    let mut web_ip = String::new();
    wait_until("pod web to be Ready", Duration::from_secs(30), || {
        let p = sb.pod("web");
        let running = p["status"]["containerStatuses"][0]["state"]["running"].is_object();
        if running && !ready(&p) {
            saw_unready_running = true;
        }
        web_ip = p["status"]["podIP"].as_str().unwrap_or_default().to_owned();
        ready(&p)
    });
    assert!(
        saw_unready_running,
        "web was never seen running and unready while its server slept"
    );
    // From the host, through the node's interface and the cluster router, right after Ready.
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "5", &format!("http://{web_ip}:8080/")])
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && body.contains("Directory listing"),
        "curl from the host to {web_ip}:8080: {out:?}"
    );
    // From a pod in the other subnet.
    assert!(
        sb.http_get_listing("demo/app-1", &format!("http://{web_ip}:8080/"), 5),
        "curl from demo/app-1 to {web_ip}:8080"
    );
    let out = sb.run(&["logs", "default/web"]);
    let log = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success());
    assert!(log.contains(&format!("serving on {web_ip}")), "{log}");
    assert!(log.contains("\"GET / HTTP/1.1\" 200"), "{log}");

    // job: exit 3, restarted once, then exit 0 for good.
    wait_until("pod job to succeed", Duration::from_secs(20), || {
        sb.pod("job")["status"]["phase"] == "Succeeded"
    });
    let cs = sb.pod("job")["status"]["containerStatuses"][0].clone();
    assert_eq!(cs["restartCount"], 1, "{cs}");
    assert_eq!(cs["lastState"]["terminated"]["exitCode"], 3, "{cs}");
    assert_eq!(cs["state"]["terminated"]["exitCode"], 0, "{cs}");
    assert_eq!(cs["state"]["terminated"]["reason"], "Completed", "{cs}");
    let out = sb.run(&["logs", "default/job", "-c", "job"]);
    let log = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(log.contains("first run\nsecond run"), "{log}");

    // extra: running, unready without the file; Ready with it; unready again once it is gone.
    let mut extra_ip = String::new();
    wait_until("pod extra to run", Duration::from_secs(30), || {
        let p = sb.pod("extra");
        extra_ip = p["status"]["podIP"].as_str().unwrap_or_default().to_owned();
        p["status"]["containerStatuses"][0]["state"]["running"].is_object()
    });
    // The kubelet's supervisor of a pod probes, then patches the status that result gives, then waits for its
    // next tick, one after the other: once a second probe has started, the first one has failed, been
    // counted and its status written. Not Ready then: the kubelet says so (Ready False), it does not just
    // not say yet.
    let probe_runs = || {
        std::fs::read_to_string(&probes)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    wait_until(
        "extra's readiness probe to fail and run again",
        Duration::from_secs(10),
        || probe_runs() >= 2,
    );
    let p = sb.pod("extra");
    let ready_condition = p["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .map(|c| c["status"].clone());
    assert_eq!(
        ready_condition,
        Some(serde_json::json!("False")),
        "Ready before its probe passed: {p}"
    );
    assert_eq!(p["status"]["containerStatuses"][0]["ready"], false, "{p}");
    std::fs::write(&flag, "").unwrap();
    wait_until("pod extra to be Ready", Duration::from_secs(10), || {
        ready(&sb.pod("extra"))
    });
    std::fs::remove_file(&flag).unwrap();
    wait_until("pod extra to be unready", Duration::from_secs(10), || {
        !ready(&sb.pod("extra"))
    });
    let out = sb.run(&[
        "exec",
        "demo/app-1",
        "--",
        "ping",
        "-c",
        "2",
        "-W",
        "2",
        &extra_ip,
    ]);
    assert!(out.status.success(), "ping from demo/app-1 to {extra_ip}");
    assert_eq!(sb.netns().len(), 7);

    // The kubelet restarts: the containers keep running and the new kubelet takes them over.
    let web_version = sb.pod("web")["metadata"]["resourceVersion"].clone();
    let web_group = sb.container_group("web");
    let extra_group = sb.container_group("extra");
    assert!(
        procs::group_members(web_group) >= 2,
        "web's monitor and server"
    );
    let pids_file = sb.dir.path().join("pids.json");
    let mut pids: Vec<ProcRecord> =
        serde_json::from_slice(&std::fs::read(&pids_file).unwrap()).unwrap();
    let kubelet = pids.iter_mut().find(|p| p.name == "kubelet").unwrap();
    kubelet.stop(Duration::from_secs(3));
    assert!(
        procs::group_members(web_group) >= 2,
        "web outlives the kubelet"
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kube-ovn-sandbox"));
    cmd.arg("kubelet").arg("--state-dir").arg(sb.dir.path());
    *kubelet =
        procs::spawn_detached("kubelet", cmd, &sb.dir.path().join("logs/kubelet.log")).unwrap();
    std::fs::write(&pids_file, serde_json::to_vec(&pids).unwrap()).unwrap();
    assert_eq!(sb.container_group("web"), web_group, "not started again");

    // Deleting a pod stops its processes (taken over from the previous kubelet) and removes its namespace.
    let out = sb.kubectl(&["delete", "pod", "extra", "--wait=false"]);
    assert!(out.status.success(), "{out:?}");
    wait_until("pod extra's netns to go", Duration::from_secs(20), || {
        sb.netns().len() == 6
    });
    assert_eq!(
        procs::group_members(extra_group),
        0,
        "extra's sleep left running"
    );
    // Probed every second by both kubelets, web's status was never written again: patches only on change.
    let web = sb.pod("web");
    assert!(ready(&web), "web stays Ready across the kubelet's restart");
    assert_eq!(web["metadata"]["resourceVersion"], web_version, "{web}");

    // status is healthy; up again reports the running sandbox.
    assert!(sb.run(&["status"]).status.success());
    let out = sb.run(&["up", "--no-install"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("already up"));

    // down: no process, namespace or link left.
    let pids: Vec<ProcRecord> =
        serde_json::from_slice(&std::fs::read(sb.dir.path().join("pids.json")).unwrap()).unwrap();
    // OVN's six, the API server, the controller, the EndpointSlice controller, the kubelet, the daemon.
    assert_eq!(pids.len(), 11, "{pids:?}");
    let host_veths: Vec<String> = sb
        .records()
        .iter()
        .map(|v| {
            kubeovn_netdev::host_nic_name(v["container_id"].as_str().unwrap(), "eth0")
                .unwrap()
                .0
        })
        .collect();
    assert_eq!(host_veths.len(), 6);
    assert!(host_veths.iter().all(|v| link_exists(v)), "{host_veths:?}");
    assert!(sb.run(&["down"]).status.success());
    for p in &pids {
        assert!(!p.alive(), "{} (pid {}) still running", p.name, p.pid);
    }
    assert!(sb.netns().is_empty(), "{:?}", sb.netns());
    assert_eq!(
        procs::group_members(web_group),
        0,
        "web's server left running"
    );
    for l in host_veths.iter().chain([&sb.bridge, &sb.nic]) {
        assert!(!link_exists(l), "link {l} left behind");
    }
    assert!(!sb.run(&["status"]).status.success());
}
