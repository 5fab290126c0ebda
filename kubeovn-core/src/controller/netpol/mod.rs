//! NetworkPolicies in OVN: each policy's allows as ACLs on its namespace's isolation port group, the pods
//! and peers it names as port groups and address sets shared by every policy naming the same selector.
//!
//! The sets' members are kept by [`NetpolState`] from the watches of pods, namespaces and nodes as they
//! happen: a pod's label or address change marks the few sets it enters or leaves, and one writer task
//! ([`Flusher`], a task on the framework) writes each marked set's exact members (the planner sends the difference as
//! mutations). No policy is translated again for it, except one whose named ports resolve differently.
//! A policy's run holds the sets it names, waits until the writer has created them, writes its ACLs, then
//! lets go of the sets it no longer names (deleted once nobody holds them).

//!
//! One feature, four parts: the membership state machine ([`state`]: the sets and their members, fed by
//! the watches), the writer task ([`flusher`]), the NetworkPolicy kind ([`policy`]) and the admin policy
//! kinds ([`admin`]). The kinds share the state, never each other.

mod admin;
mod flusher;
mod policy;
mod state;

pub(crate) use admin::AdminPolicies;
pub(crate) use flusher::Flusher;
pub(crate) use policy::NetworkPolicies;
pub(crate) use state::{families, pod_watch};
pub use state::{NetpolState, PolicyContainer, PolicyPod, PolicyPodSpec};

#[cfg(test)]
#[allow(unused_imports)]
mod tests {
    use super::state::*;
    use super::*;
    use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
    use std::net::IpAddr;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use k8s_openapi::api::core::v1::{ContainerPort, Namespace, Node};
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::core::NamespaceResourceScope;
    use kube::runtime::events::EventType;
    use kubeovn_ovn::northbound::{
        AclDirection, AclParent, AclSet, AddressSet, Batch, Meter, MeterUnit, Op, PortGroup,
    };
    use serde::{Deserialize, Serialize};
    use tokio::sync::{watch, Notify};

    use crate::annotations::{self, DEFAULT_PROVIDER};
    use crate::controller::error::ControllerError;
    use crate::controller::framework::{
        Action, Key, Kinds, Reconciler, Relations, SelectorIndex, Task, Watch,
    };
    use crate::controller::Ctx;
    use crate::naming;
    use crate::netpol::{
        self, namespace_acls, namespace_group, Direction, Families, Form, Logging, Members, Pods,
        Protocol, SetKey, Translation, OWNER_KEY, SELECTOR_KEY,
    };

    /// How long a policy's run waits for its sets to be written before it is retried.
    use crate::controller::testing::Harness;

    /// The harness with the policy sets' writer running, as at any start (policy runs wait for it).
    async fn start() -> Harness {
        let mut h = Harness::start().await;
        h.serve_kind::<Flusher>();
        h
    }
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
    use kubeovn_ovn::northbound::{Northbound, SwitchPort};
    use serde_json::json;

    async fn namespace(h: &Harness, name: &str, labels: serde_json::Value) {
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
                .expect("namespace");
        h.create_cluster(&ns).await;
    }

    /// A pod with an address, and its switch port.
    async fn pod(h: &Harness, ns: &str, name: &str, app: &str, ip: &str) {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "labels": {"app": app},
                "annotations": {"ovn.kubernetes.io/allocated": "true", "ovn.kubernetes.io/ip_address": ip}},
            "spec": {"containers": [{"name": "c", "image": "i",
                "ports": [{"name": "http", "containerPort": 8080}]}]}}))
        .expect("pod");
        Api::<Pod>::namespaced(h.client.clone(), ns)
            .create(&PostParams::default(), &p)
            .await
            .expect("create pod");
        let port = naming::pod_port(name, ns, DEFAULT_PROVIDER);
        SwitchPort::new("ovn-default", &port)
            .execute(h.nb.as_ref())
            .await
            .expect("port");
        let key = Key::<PolicyPod>::namespaced(ns, name);
        h.until("policy pod stored", || h.ctx.kinds.get(&key).is_some())
            .await;
    }

    fn addresses(h: &Harness, set: &str) -> Vec<String> {
        let mut a =
            h.nb.address_set(set)
                .map(|s| s.addresses)
                .unwrap_or_default();
        a.sort();
        a
    }

    /// The namespace group's ports and the drop in a flusher batch (None: the batch has no such group).
    fn group_in(b: &Batch, name: &str) -> Option<(Vec<String>, usize)> {
        let ports = b.ops.iter().find_map(|o| match o {
            Op::PortGroup(g) if g.name == name => Some(g.ports.clone().unwrap_or_default()),
            _ => None,
        })?;
        let drops = b
            .ops
            .iter()
            .filter_map(|o| match o {
                Op::AclSet(s) if s.parent == AclParent::PortGroup(name.into()) => Some(s),
                _ => None,
            })
            .flat_map(|s| &s.acls)
            .filter(|a| a.action == kubeovn_ovn::northbound::AclAction::Drop)
            .count();
        Some((ports, drops))
    }

    #[test]
    fn a_policy_isolates_only_once_its_allows_are_written_and_stops_before_they_go() {
        let st = NetpolState::new(Families::V4, vec!["100.64.0.0/16".into()]);
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "x"}})).expect("ns");
        st.namespace_event(None, Some(&ns));
        let pod: PolicyPod = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "x", "labels": {"app": "a"},
                "annotations": {"ovn.kubernetes.io/allocated": "true", "ovn.kubernetes.io/ip_address": "10.16.0.10"}}}))
        .expect("pod");
        st.pod_event(None, Some(&pod));
        let np: NetworkPolicy = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "x"},
            "spec": {"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}}))
        .expect("policy");
        let t = netpol::network_policy(&np, Families::V4, &|_: &Pods, _, _: &str| BTreeSet::new())
            .expect("translation");
        let none = || Vec::new();
        let absent = |_: &str| false;
        let owner = "NetworkPolicy/x/p";

        // Held, its allows not written yet: the group exists (to hold them) but is empty, with no drop.
        st.hold(owner, Some("x"), &t, false);
        let (b, ..) = st.take(&none, &absent);
        assert_eq!(group_in(&b, "np_x_ingress"), Some((vec![], 0)));
        // Its allows written: the pod joins the group under the drop.
        st.settle(owner);
        let (b, ..) = st.take(&none, &absent);
        assert_eq!(group_in(&b, "np_x_ingress"), Some((vec!["a.x".into()], 1)));
        // Withdrawn before its allows go: nothing isolates, so the group goes.
        st.withdraw(owner);
        let (b, ..) = st.take(&none, &absent);
        assert!(b
            .ops
            .iter()
            .any(|o| matches!(o, Op::DeletePortGroup(n) if n == "np_x_ingress")));

        // Its allows already in NB (a restart): in force at once.
        st.forget(owner);
        st.hold(owner, Some("x"), &t, true);
        let (b, ..) = st.take(&none, &absent);
        assert_eq!(group_in(&b, "np_x_ingress"), Some((vec!["a.x".into()], 1)));

        // Just after a restart, a group in NB is not written while another policy of its namespace is
        // unknown; it is once that one is known.
        let st = NetpolState::new(Families::V4, vec!["100.64.0.0/16".into()]);
        st.namespace_event(None, Some(&ns));
        st.pod_event(None, Some(&pod));
        st.hold(owner, Some("x"), &t, true);
        let other = "NetworkPolicy/x/q";
        st.hold("NetworkPolicy/x/r", Some("x"), &t, true);
        let listed = || {
            vec![
                owner.to_owned(),
                other.to_owned(),
                "NetworkPolicy/x/r".to_owned(),
            ]
        };
        let present = |_: &str| true;
        let (b, ..) = st.take(&listed, &present);
        assert_eq!(group_in(&b, "np_x_ingress"), None);
        st.hold(other, Some("x"), &t, true);
        let (b, ..) = st.take(&listed, &present);
        assert_eq!(group_in(&b, "np_x_ingress"), Some((vec!["a.x".into()], 1)));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_policy_changed_from_ingress_to_egress_moves_its_isolation() {
        let h = start().await;
        namespace(&h, "x", json!({})).await;
        pod(&h, "x", "a", "a", "10.16.0.10").await;
        let deny = |types: serde_json::Value| -> NetworkPolicy {
            serde_json::from_value(json!({"metadata": {"name": "deny", "namespace": "x"},
                "spec": {"podSelector": {}, "policyTypes": types}}))
            .expect("policy")
        };
        let np = h.create(&deny(json!(["Ingress"]))).await;
        let key = Key::of(&np);
        h.run::<NetworkPolicies>(key.clone()).await.expect("run");
        let ports = |g: &str| h.nb.port_group(g).map(|g| g.ports.len());
        assert_eq!(ports("np_x_ingress"), Some(1));
        assert_eq!(ports("np_x_egress"), None);
        let api = Api::<NetworkPolicy>::namespaced(h.client.clone(), "x");
        api.patch(
            "deny",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"policyTypes": ["Egress"]}})),
        )
        .await
        .expect("patch");
        h.until("policy changed in the store", || {
            h.ctx.kinds.get(&key).is_some_and(|p| {
                p.spec.as_ref().and_then(|s| s.policy_types.clone()) == Some(vec!["Egress".into()])
            })
        })
        .await;
        h.run::<NetworkPolicies>(key.clone()).await.expect("run");
        h.until("isolation moved", || {
            ports("np_x_ingress").is_none() && ports("np_x_egress") == Some(1)
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_policy_gets_shared_sets_and_follows_labels_without_running_again() {
        let h = start().await;
        namespace(&h, "x", json!({"team": "a"})).await;
        namespace(&h, "y", json!({"team": "b"})).await;
        pod(&h, "x", "a", "a", "10.16.0.10").await;
        pod(&h, "x", "b", "b", "10.16.0.11").await;
        pod(&h, "y", "c", "c", "10.16.0.12").await;
        let np: NetworkPolicy = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "x"},
            "spec": {"podSelector": {"matchLabels": {"app": "a"}},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "b"}}},
                                      {"namespaceSelector": {"matchLabels": {"team": "b"}}}],
                             "ports": [{"port": 80}, {"port": "http"}]}]}}))
        .expect("policy");
        let np = h.create(&np).await;
        let key = Key::of(&np);
        h.run::<NetworkPolicies>(key.clone()).await.expect("run");

        // The namespace's isolation group holds the selected pod; its ACLs: the drop, the nodes, and the
        // policy's allows (the named port resolved to 8080).
        h.until("the pod in the namespace group", || {
            h.nb.port_group("np_x_ingress")
                .is_some_and(|g| g.ports.len() == 1)
        })
        .await;
        let acls = h.nb.acls(&AclParent::PortGroup("np_x_ingress".into()));
        let owned = |o: &str| {
            acls.iter()
                .filter(|a| a.external_ids.get(OWNER_KEY).map(String::as_str) == Some(o))
                .count()
        };
        assert_eq!(owned("Namespace/x"), 2, "{acls:#?}");
        assert_eq!(
            owned("NetworkPolicy/x/p"),
            4,
            "two peers, numbered and named: {acls:#?}"
        );
        assert!(acls.iter().any(|a| a.match_.ends_with("tcp.dst == 8080")));
        let same_ns = SetKey::addresses(Pods::In {
            namespace: "x".into(),
            pods: crate::selector::Selector::new(vec![crate::selector::Requirement::Equals(
                "app".into(),
                "b".into(),
            )]),
        });
        assert_eq!(addresses(&h, &same_ns.family(false)), ["10.16.0.11"]);

        // Running again writes nothing.
        let before = h.nb_rows();
        h.run::<NetworkPolicies>(key.clone()).await.expect("run");
        assert_eq!(h.nb_rows(), before);

        // A relabel moves the pod out of the set, with no run of the policy.
        Api::<Pod>::namespaced(h.client.clone(), "x")
            .patch(
                "b",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"app": "z"}}})),
            )
            .await
            .expect("relabel");
        h.until("pod left the set", || {
            addresses(&h, &same_ns.family(false)).is_empty()
        })
        .await;
        // A namespace relabel moves its pods out of the namespace selector's set.
        Api::<Namespace>::all(h.client.clone())
            .patch(
                "y",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"team": "c"}}})),
            )
            .await
            .expect("relabel namespace");
        h.until("namespace left the set", || {
            h.nb.address_sets_with_external_id(SELECTOR_KEY)
                .iter()
                .all(|s| !s.addresses.contains(&"10.16.0.12".to_owned()))
        })
        .await;

        // Deleted: its ACLs, the group and the sets go.
        Api::<NetworkPolicy>::namespaced(h.client.clone(), "x")
            .delete("p", &DeleteParams::default())
            .await
            .expect("delete");
        h.gone(&key).await;
        h.run::<NetworkPolicies>(key.clone())
            .await
            .expect("cleanup");
        h.until("group and sets gone", || {
            h.nb.port_group("np_x_ingress").is_none()
                && h.nb.address_set(&same_ns.family(false)).is_none()
        })
        .await;
    }
}
