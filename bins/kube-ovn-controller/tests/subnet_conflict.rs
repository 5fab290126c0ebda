//! Subnet validation against a real NB ovsdb-server and the test API server (issue #16, fault 3): a Subnet
//! whose CIDR overlaps an accepted subnet of its VPC is refused (`Validated=False`, reason
//! `ValidateLogicalSwitchFailed`, a Warning event), gets no logical switch or router port and no allocator
//! subnet, leaves the older subnet untouched, and its pods get an event instead of an address; fixing the spec
//! makes it Ready, a restart keeps the older subnet, and a refused subnet is accepted once the subnet (or the
//! node) it conflicted with is deleted.

#![allow(clippy::unwrap_used)]

mod common;

use common::{pod, wait_for, warning_for, Env};
use serde_json::Value;

const REFUSED: &str = "ValidateLogicalSwitchFailed";

fn condition<'a>(s: &'a Value, ty: &str) -> Option<&'a Value> {
    s.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)
}

/// Waits for the Subnet's `Validated` condition to be `status`; returns (reason, message).
async fn validated(env: &Env, name: &str, status: &str) -> (String, String) {
    wait_for(&format!("subnet {name} Validated={status}"), 20, || async {
        let s = env.get_json(&["subnets.kubeovn.io", name]).await?;
        let c = condition(&s, "Validated")?;
        (c["status"] == status).then(|| {
            (
                c["reason"].as_str().unwrap_or_default().to_owned(),
                c["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
    })
    .await
}

async fn ready(env: &Env, name: &str) {
    wait_for(&format!("subnet {name} ready"), 20, || async {
        let s = env.get_json(&["subnets.kubeovn.io", name]).await?;
        (condition(&s, "Ready")?["status"] == "True"
            && condition(&s, "Validated")?["status"] == "True")
            .then_some(())
    })
    .await;
}

/// The pod's address once the controller gave it one.
async fn pod_ip(env: &Env, ns: &str, name: &str) -> String {
    wait_for(&format!("{ns}/{name} addressed"), 30, || async {
        let p = env.get_json(&["pod", "-n", ns, name]).await?;
        p.pointer("/metadata/annotations/ovn.kubernetes.io~1ip_address")?
            .as_str()
            .map(str::to_owned)
    })
    .await
}

async fn subnet(env: &Env, name: &str, cidr: &str, ns: &str) {
    env.apply(&format!(
        r#"{{"apiVersion":"kubeovn.io/v1","kind":"Subnet","metadata":{{"name":"{name}"}},
        "spec":{{"cidrBlock":"{cidr}","namespaces":["{ns}"],"protocol":"IPv4","vpc":"ovn-cluster"}}}}"#
    ))
    .await;
}

/// Creates a Subnet that must be refused: `Validated` False with Kube-OVN's reason and a message holding each
/// of `words`, no logical switch and no router port (checked after the refusal is written).
async fn refused_subnet(env: &Env, name: &str, cidr: &str, ns: &str, words: &[&str]) {
    subnet(env, name, cidr, ns).await;
    let (reason, message) = validated(env, name, "False").await;
    assert_eq!(reason, REFUSED);
    for w in words {
        assert!(message.contains(w), "{message:?} lacks {w:?}");
    }
    assert_eq!(nb_get(env, "logical_switch", name, "name").await, "");
    let lrp = format!("ovn-cluster-{name}");
    assert_eq!(nb_get(env, "logical_router_port", &lrp, "name").await, "");
}

/// `ovn-nbctl --if-exists get TABLE NAME COLUMN` (empty when the row is absent).
async fn nb_get(env: &Env, table: &str, name: &str, column: &str) -> String {
    env.nbctl(&["--if-exists", "get", table, name, column])
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_subnet_refused_then_fixed() {
    let Some(mut env) = Env::start().await else {
        return;
    };
    env.start_controller(common::test_config()).await;
    ready(&env, "ovn-default").await;
    env.apply(
        r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"},
        "status":{"addresses":[{"type":"InternalIP","address":"172.18.0.2"}]}}"#,
    )
    .await;
    for ns in ["ns1", "ns2", "ns3"] {
        env.apply(&format!(
            r#"{{"apiVersion":"v1","kind":"Namespace","metadata":{{"name":"{ns}"}}}}"#
        ))
        .await;
    }

    // Specs of the wrong type (the test API server, like Kube-OVN's own looser CRDs, does not check types):
    // each refused where the user looks, naming the field, and the other objects of its kind still handled
    // (a typed watch that failed on them would hide every Subnet or IPPool).
    env.apply(
        r#"{"apiVersion":"kubeovn.io/v1","kind":"Subnet","metadata":{"name":"typo"},
        "spec":{"cidrBlock":1066,"vpc":"ovn-cluster"}}"#,
    )
    .await;
    let (reason, message) = validated(&env, "typo", "False").await;
    assert_eq!(reason, REFUSED);
    assert!(
        message.contains("spec.cidrBlock: invalid type"),
        "{message}"
    );
    env.apply(
        r#"{"apiVersion":"kubeovn.io/v1","kind":"IPPool","metadata":{"name":"typo-pool"},
        "spec":{"subnet":"ovn-default","ips":"10.16.0.9"}}"#,
    )
    .await;
    let note = warning_for(&env, "default", "typo-pool", "InvalidIPPool").await;
    assert!(note.contains("spec.ips: invalid type"), "{note}");

    // The sandbox's demo subnet, up with a pod.
    subnet(&env, "demo", "10.66.0.0/24", "ns1").await;
    ready(&env, "demo").await;
    env.apply(&pod("ns1", "a", "n1", &[])).await;
    let a_ip = pod_ip(&env, "ns1", "a").await;
    assert!(a_ip.starts_with("10.66.0."), "{a_ip}");
    let demo_ls = nb_get(&env, "logical_switch", "demo", "_uuid").await;
    let demo_lrp = nb_get(&env, "logical_router_port", "ovn-cluster-demo", "_uuid").await;
    assert!(!demo_ls.is_empty() && !demo_lrp.is_empty());

    // Another subnet with the same block: refused, with the conflict named.
    refused_subnet(
        &env,
        "clash",
        "10.66.0.0/24",
        "ns2",
        &["10.66.0.0/24", "demo"],
    )
    .await;
    let s = env
        .get_json(&["subnets.kubeovn.io", "clash"])
        .await
        .unwrap();
    assert_eq!(condition(&s, "Ready").unwrap()["status"], "False");
    let note = warning_for(&env, "default", "clash", REFUSED).await;
    assert!(note.contains("demo"), "{note}");
    // No allocator subnet; demo's switch and router port are the same rows as before.
    let ipam = env.controller.as_ref().unwrap().ipam.clone();
    assert!(ipam.subnet("clash").is_none(), "the allocator got clash");
    assert_eq!(
        nb_get(&env, "logical_switch", "demo", "_uuid").await,
        demo_ls
    );
    assert_eq!(
        nb_get(&env, "logical_router_port", "ovn-cluster-demo", "_uuid").await,
        demo_lrp
    );
    assert_eq!(
        nb_get(&env, "logical_router_port", "ovn-cluster-demo", "networks").await,
        "[\"10.66.0.1/24\"]"
    );
    assert!(ipam.subnet("demo").is_some());

    // A pod of the refused subnet's namespace: a Warning naming the refusal, no address (not ovn-default's).
    env.apply(&pod("ns2", "b", "n1", &[])).await;
    let note = warning_for(&env, "ns2", "b", "SubnetNotValidated").await;
    assert!(note.contains("clash"), "{note}");
    let b = env.get_json(&["pod", "-n", "ns2", "b"]).await.unwrap();
    assert!(
        b.pointer("/metadata/annotations/ovn.kubernetes.io~1ip_address")
            .is_none(),
        "{b}"
    );

    // A restart keeps the older subnet (clash sorts first by name, demo has the switch): demo still gives
    // addresses, clash is still refused and kept out of NB and the allocator.
    env.kill_controller().await;
    env.start_controller(common::test_config()).await;
    env.apply(&pod("ns1", "a2", "n1", &[])).await;
    let a2_ip = pod_ip(&env, "ns1", "a2").await;
    assert!(a2_ip.starts_with("10.66.0.") && a2_ip != a_ip, "{a2_ip}");
    let ipam = env.controller.as_ref().unwrap().ipam.clone();
    assert!(ipam.subnet("clash").is_none(), "the allocator got clash");
    assert_eq!(validated(&env, "clash", "False").await.0, REFUSED);
    assert_eq!(
        validated(&env, "demo", "True").await.0,
        "ValidateLogicalSwitchSuccess"
    );
    assert_eq!(nb_get(&env, "logical_switch", "clash", "name").await, "");
    assert_eq!(
        nb_get(&env, "logical_switch", "demo", "_uuid").await,
        demo_ls
    );

    // Fixing the spec makes it Ready with its switch and router port; the pod gets its address.
    subnet(&env, "clash", "10.67.0.0/24", "ns2").await;
    ready(&env, "clash").await;
    assert_eq!(
        nb_get(&env, "logical_switch", "clash", "other_config:subnet").await,
        "\"10.67.0.0/24\""
    );
    assert_eq!(
        nb_get(&env, "logical_router_port", "ovn-cluster-clash", "networks").await,
        "[\"10.67.0.1/24\"]"
    );
    let b_ip = pod_ip(&env, "ns2", "b").await;
    assert!(b_ip.starts_with("10.67.0."), "{b_ip}");

    // A newcomer overlapping demo waits, refused, until demo is deleted, then becomes Ready by itself.
    refused_subnet(&env, "late", "10.66.0.0/25", "ns3", &["demo"]).await;
    env.kubectl(&["delete", "pod", "-n", "ns1", "a", "a2"])
        .await;
    env.kubectl(&["delete", "subnets.kubeovn.io", "demo"]).await;
    ready(&env, "late").await;
    assert_eq!(
        nb_get(&env, "logical_router_port", "ovn-cluster-late", "networks").await,
        "[\"10.66.0.1/25\"]"
    );
    assert_eq!(nb_get(&env, "logical_switch", "demo", "name").await, "");

    // A subnet holding a node's address is refused until the node goes.
    refused_subnet(
        &env,
        "nodes",
        "172.18.0.0/24",
        "ns3",
        &["172.18.0.2", "node n1"],
    )
    .await;
    env.kubectl(&["delete", "node", "n1"]).await;
    ready(&env, "nodes").await;
    env.kill_controller().await;
}
