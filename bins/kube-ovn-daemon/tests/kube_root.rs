//! The daemon with the Kubernetes pod-network source, against the in-process test API server: the ADD
//! waits for the controller's `allocated`/`routed` annotations (patched after the ADD started); node start
//! reads the join network from the node's annotations. As root, on a real OVN.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Harness;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use kubeovn_cni::node::{
    init_node, node_join_network, KubePodNetworks, NodeConfig, StaticPodNetworks,
};
use kubeovn_netdev::NetlinkNetdev;
use kubeovn_testapi::{Config, TestApiServer};
use serde_json::json;

fn pod_object(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "e2e"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
    }))
    .unwrap()
}

#[test]
fn add_waits_for_annotations_from_the_api_server() {
    if !common::runnable() {
        return;
    }
    let rt = common::runtime();
    let node = "kube-e2e-node";
    let (server, client, source) = rt.block_on(async {
        let server = TestApiServer::start(Config::default()).await.unwrap();
        let client = server.client().unwrap();
        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(json!({"metadata": {"name": "e2e"}})).unwrap();
        Api::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        let pods: Api<Pod> = Api::namespaced(client.clone(), "e2e");
        pods.create(&PostParams::default(), &pod_object("kp", node))
            .await
            .unwrap();
        // A pod of another node must not be in this node's cache.
        pods.create(&PostParams::default(), &pod_object("other", "elsewhere"))
            .await
            .unwrap();
        let source = Arc::new(KubePodNetworks::start(client.clone(), node));
        assert!(source.wait_ready(Duration::from_secs(5)).await);
        (server, client, source)
    });
    let mut h = Harness::start_with(
        |c| c.pod_network_timeout = Duration::from_secs(3),
        rt,
        Arc::new(StaticPodNetworks::new()),
        source,
    );
    h.subnet("ls-k", "lr", "00:00:00:ee:00:09", "10.231.9.1/24");
    let p = h.pod("kp");
    h.lsp("ls-k", &p, "00:00:00:aa:09:05", "10.231.9.5");
    let conf = h.netconf("1.1.0");

    // STATUS: the cache is synced, the bridge exists.
    let (code, out) = h.shim("STATUS", &p, &conf);
    assert_eq!(code, 0, "{out}");

    // The ADD starts before the controller's annotations; they arrive 600 ms later, routed last.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "e2e");
    let t0 = Instant::now();
    let patcher = h.rt.spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let ann = json!({"metadata": {"annotations": {
            "ovn.kubernetes.io/ip_address": "10.231.9.5",
            "ovn.kubernetes.io/mac_address": "00:00:00:aa:09:05",
            "ovn.kubernetes.io/cidr": "10.231.9.0/24",
            "ovn.kubernetes.io/gateway": "10.231.9.1",
            "ovn.kubernetes.io/logical_switch": "ls-k",
            "ovn.kubernetes.io/allocated": "true",
        }}});
        pods.patch("kp", &PatchParams::default(), &Patch::Merge(&ann))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let routed = json!({"metadata": {"annotations": {"ovn.kubernetes.io/routed": "true"}}});
        pods.patch("kp", &PatchParams::default(), &Patch::Merge(&routed))
            .await
            .unwrap();
    });
    let (code, out) = h.shim("ADD", &p, &conf);
    assert_eq!(code, 0, "{out}");
    assert!(
        t0.elapsed() >= Duration::from_millis(600),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(out["ips"][0]["address"], "10.231.9.5/24");
    assert_eq!(out["interfaces"][1]["mac"], "00:00:00:aa:09:05");
    h.rt.block_on(patcher).unwrap();
    assert!(h.ping(&p, "10.231.9.1"), "pod reaches its gateway");
    let (code, _) = h.shim("DEL", &p, &conf);
    assert_eq!(code, 0);
    assert!(h.ports().is_empty());
    assert!(Harness::veth_gone(&p));

    // Another node's pod is not served by this node's daemon: not found after the bound.
    let mut other = h.pod("other");
    other.ifname = "eth0".into();
    let t = Instant::now();
    let (code, out) = h.shim("ADD", &other, &{
        let mut c = conf.clone();
        c["request_timeout"] = json!(20);
        c
    });
    assert_ne!(code, 0);
    assert_eq!(out["code"], 11, "{out}");
    assert!(
        t.elapsed() >= Duration::from_millis(2900),
        "{:?}",
        t.elapsed()
    );

    // Node start from the node's annotations: the join port in OVS (internal, iface-id node-<node>) and
    // the join interface's address and pod-CIDR route. ovs-vswitchd's tap stays unaddressed in the root
    // namespace; the address and route go to a stand-in interface in a namespace the test owns.
    let nic = format!("ovnj{}", &h.tag[..5]);
    h.stack.cleanup_on_stop(nic.clone());
    let node_ns = format!("kovn-{}-node", h.tag);
    assert!(std::process::Command::new("ip")
        .args(["netns", "add", &node_ns])
        .status()
        .unwrap()
        .success());
    assert!(std::process::Command::new("ip")
        .args(["-n", &node_ns, "link", "add", &nic, "type", "veth", "peer", "name", "peer0"])
        .status()
        .unwrap()
        .success());
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": node, "annotations": {
            "ovn.kubernetes.io/ip_address": "100.64.7.2",
            "ovn.kubernetes.io/mac_address": "00:00:00:77:00:02",
            "ovn.kubernetes.io/cidr": "100.64.7.0/24",
            "ovn.kubernetes.io/gateway": "100.64.7.1",
        }}
    }))
    .unwrap();
    let ovs = h.ovs.clone();
    let (bridge, sb) = (h.bridge.clone(), h.stack.sb_remote());
    let system_id = h.stack.options().system_id.clone();
    let res = h.rt.block_on(async {
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &n)
            .await
            .unwrap();
        let join = node_join_network(client.clone(), node, vec!["10.231.0.0/16".parse().unwrap()])
            .await
            .unwrap()
            .unwrap();
        let mut cfg = NodeConfig::new(system_id, sb);
        cfg.bridge = bridge;
        cfg.datapath_type = "netdev".into();
        cfg.nic = nic.clone();
        cfg.join = Some(join);
        let host = NetlinkNetdev::open(format!("/var/run/netns/{node_ns}")).unwrap();
        init_node(ovs.as_ref(), &host, &cfg).await
    });
    let addr = std::process::Command::new("ip")
        .args(["-n", &node_ns, "addr", "show", &nic])
        .output()
        .unwrap();
    let route = std::process::Command::new("ip")
        .args(["-n", &node_ns, "route", "show", "10.231.0.0/16"])
        .output()
        .unwrap();
    let _ = std::process::Command::new("ip")
        .args(["netns", "del", &node_ns])
        .status();
    res.unwrap();
    let addr = String::from_utf8_lossy(&addr.stdout);
    assert!(
        addr.contains("100.64.7.2/24") && addr.contains("00:00:00:77:00:02"),
        "{addr}"
    );
    assert!(String::from_utf8_lossy(&route.stdout).contains("via 100.64.7.1"));
    let (_, ids) = h.vsctl(&["get", "interface", &nic, "external_ids:iface-id"]);
    assert_eq!(ids, format!("node-{}", h.stack.options().system_id));
    let (_, ty) = h.vsctl(&["get", "interface", &nic, "type"]);
    assert_eq!(ty, "internal");
    drop(h);
    let rt = common::runtime();
    rt.block_on(server.shutdown());
}
