//! The node's join port and its routes, following the API as Kube-OVN's daemon does: a watch on this Node
//! waits for the controller to allocate the join address (`ovn.kubernetes.io/ip_address`, ...), then node
//! start plugs the join interface; a watch on Subnets keeps a route to every subnet of the default VPC via
//! the join gateway on that interface, and removes it when the subnet goes, changes CIDR or moves VPC.
//!
//! Until the join interface is up, [`AfterJoin`] holds pod ADDs (up to their pod-network timeout, then a
//! retryable error) and `STATUS` answers not ready: Kube-OVN's daemon does not serve the CNI before its join
//! interface exists, so kubelet retries the sandbox; here the socket is up and says why.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use kubeovn_core::crd::Subnet;
use kubeovn_core::naming::DEFAULT_VPC;
use kubeovn_netdev::{NatRules, Netdev, RouteSpec};
use kubeovn_ovn::vswitch::OpenVSwitch;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::kube::join_from_node_annotations;
use super::nat::{nat_rules, NAT_TABLE};
use super::routed::routed_cidrs;
use super::start::{init_node, join_routes, sync_join_routes, JoinNetwork, NodeConfig};
use super::{PodNetwork, PodNetworkSource, SourceError};
use crate::daemon::PodRef;

/// How often the routes are checked again without a change in the API (one route dump): repairs a route
/// someone else removed and retries a failed step.
pub const RESYNC: Duration = Duration::from_secs(10);

/// The background task that plugs the join interface and keeps its routes; [`NodeSync::joined`] turns true
/// once the interface is up.
pub struct NodeSync {
    joined: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for NodeSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeSync")
            .field("joined", &*self.joined.borrow())
            .finish()
    }
}

impl Drop for NodeSync {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl NodeSync {
    /// Starts watching node `cfg.node_name` and the Subnets in the background of the current runtime.
    /// `cfg` is node start's configuration (its `join` is filled from the node's annotations); `pod_cidrs`
    /// are routed through the join gateway besides the subnets.
    pub fn start(
        client: Client,
        ovs: Arc<dyn OpenVSwitch>,
        host: Arc<dyn Netdev>,
        cfg: NodeConfig,
        pod_cidrs: Vec<IpNetwork>,
    ) -> Self {
        let (tx, joined) = watch::channel(false);
        let task = tokio::spawn(run(client, ovs, host, cfg, pod_cidrs, tx));
        NodeSync { joined, task }
    }

    /// True once the join interface is up (never goes back).
    pub fn joined(&self) -> watch::Receiver<bool> {
        self.joined.clone()
    }
}

async fn run(
    client: Client,
    ovs: Arc<dyn OpenVSwitch>,
    host: Arc<dyn Netdev>,
    mut cfg: NodeConfig,
    pod_cidrs: Vec<IpNetwork>,
    joined: watch::Sender<bool>,
) {
    let node = cfg.node_name.clone();
    let nodes = watcher(
        Api::<Node>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={node}")),
    )
    .default_backoff();
    let (store, writer): (Store<Subnet>, _) = reflector::store();
    let subnets = reflector::reflector(
        writer,
        watcher(Api::<Subnet>::all(client), watcher::Config::default()).default_backoff(),
    );
    let mut nodes = std::pin::pin!(nodes);
    let mut subnets = std::pin::pin!(subnets);
    let mut tick = tokio::time::interval(RESYNC);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut join: Option<JoinNetwork> = None;
    let mut plugged: Option<JoinNetwork> = None;
    let mut subnets_synced = false;
    // The routes of the last successful sync: a subnet event that changes none of them (status counters)
    // costs no netlink dump.
    let mut synced: Option<Vec<RouteSpec>> = None;
    // The NAT rules last written (`None`: write them).
    let mut nat_applied: Option<NatRules> = None;
    loop {
        tokio::select! {
            ev = nodes.next() => match ev {
                Some(Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n))) => {
                    let ann = n.metadata.annotations.unwrap_or_default();
                    match join_from_node_annotations(&ann, Vec::new()) {
                        Ok(j) => join = j,
                        Err(e) => tracing::warn!(%node, error = %e, "node annotations"),
                    }
                }
                Some(Ok(_)) => {}
                // The backoff retries; the last known state stays meanwhile.
                Some(Err(e)) => tracing::warn!(%node, error = %e, "watch node"),
                None => return,
            },
            ev = subnets.next() => match ev {
                Some(Ok(watcher::Event::InitDone)) => subnets_synced = true,
                Some(Ok(_)) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "watch subnets"),
                None => return,
            },
            _ = tick.tick() => {
                synced = None;
                nat_applied = None;
            }
        }
        let Some(j) = &join else { continue };
        if plugged.as_ref() != Some(j) {
            cfg.join = Some(j.clone());
            if let Err(e) = init_node(ovs.as_ref(), host.as_ref(), &cfg).await {
                tracing::warn!(nic = %cfg.nic, error = %e, "join interface");
                continue;
            }
            let ips: Vec<String> = j.ips.iter().map(ToString::to_string).collect();
            tracing::info!(nic = %cfg.nic, ips = %ips.join(","), "join interface up");
            // Pods' egress is forwarded by the node (Kube-OVN's daemon turns forwarding on at start).
            let mut forwarding = vec![("net.ipv4.ip_forward", "1")];
            if j.ips.iter().any(IpNetwork::is_ipv6) {
                forwarding.push(("net.ipv6.conf.all.forwarding", "1"));
            }
            for (k, v) in forwarding {
                if let Err(e) = host.set_sysctl(k, v).await {
                    tracing::warn!(sysctl = k, error = %e, "forwarding");
                }
            }
            plugged = Some(j.clone());
            synced = None;
            nat_applied = None;
            joined.send_replace(true);
        }
        // Before the first full list every route on the join interface would look stale.
        if !subnets_synced {
            continue;
        }
        let subnets = store.state();
        let mut cidrs = routed_cidrs(&subnets, DEFAULT_VPC);
        cidrs.extend(pod_cidrs.iter().copied());
        // Never masqueraded: the cluster's own ranges, the join subnet's among them.
        let mut cluster = cidrs.clone();
        cluster.extend(
            j.ips
                .iter()
                .filter_map(|ip| IpNetwork::new(ip.network(), ip.prefix()).ok()),
        );
        let nat = nat_rules(&subnets, &node, DEFAULT_VPC, &cluster);
        if nat_applied.as_ref() != Some(&nat) {
            match host.set_nat(NAT_TABLE, &nat).await {
                Ok(()) => {
                    if nat_applied.is_none() || !nat.sources.is_empty() {
                        let s: Vec<String> =
                            nat.sources.iter().map(|s| s.cidr.to_string()).collect();
                        tracing::info!(sources = %s.join(","), "masquerading");
                    }
                    nat_applied = Some(nat);
                }
                // Tried again at the next event or tick.
                Err(e) => tracing::warn!(table = NAT_TABLE, error = %e, "NAT table"),
            }
        }
        let want = join_routes(j, &cfg.nic, &cidrs);
        if synced.as_ref() == Some(&want) {
            continue;
        }
        match sync_join_routes(host.as_ref(), &cfg.nic, &want).await {
            Ok(ch) => {
                for r in &ch.added {
                    tracing::info!(route = %r, "route added");
                }
                for r in &ch.deleted {
                    tracing::info!(route = %r, "route deleted");
                }
                for f in &ch.failed {
                    tracing::warn!("{f}");
                }
                // A failed route is tried again at the next tick.
                synced = ch.failed.is_empty().then_some(want);
            }
            Err(e) => tracing::warn!(error = %e, "join routes"),
        }
    }
}

/// A [`PodNetworkSource`] that answers only once the node's join interface is up: an ADD waits for it
/// within its pod-network timeout and then fails with a retryable error (`Unavailable`, CNI code 11) that
/// says what is missing; `STATUS` is not ready until then.
pub struct AfterJoin {
    inner: Arc<dyn PodNetworkSource>,
    joined: watch::Receiver<bool>,
    why: String,
}

impl std::fmt::Debug for AfterJoin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AfterJoin")
            .field("joined", &*self.joined.borrow())
            .finish()
    }
}

impl AfterJoin {
    /// Wraps `inner`; `joined` is [`NodeSync::joined`] for node `node` and join interface `nic`.
    pub fn new(
        inner: Arc<dyn PodNetworkSource>,
        joined: watch::Receiver<bool>,
        node: &str,
        nic: &str,
    ) -> Self {
        AfterJoin {
            inner,
            joined,
            why: format!(
                "node {node}: join interface {nic} not set up yet (the controller has not written the \
                 node's ovn.kubernetes.io/ip_address annotation, or {nic} did not come up)"
            ),
        }
    }
}

#[async_trait::async_trait]
impl PodNetworkSource for AfterJoin {
    async fn pod_network(
        &self,
        pod: &PodRef,
        provider: &str,
        timeout: Duration,
    ) -> Result<PodNetwork, SourceError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.joined.clone();
        match tokio::time::timeout_at(deadline, rx.wait_for(|j| *j)).await {
            Ok(Ok(_)) => {}
            _ => return Err(SourceError::Unavailable(self.why.clone())),
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.inner.pod_network(pod, provider, left).await
    }

    fn ready(&self) -> bool {
        *self.joined.borrow() && self.inner.ready()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::StaticPodNetworks;
    use serde_json::json;

    /// A Subnet object, validated by the controller unless `v` says otherwise.
    fn subnet(mut v: serde_json::Value) -> Arc<Subnet> {
        if v.get("status").is_none() {
            v["status"] = json!({"conditions": [{"type": "Validated", "status": "True"}]});
        }
        Arc::new(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn only_overlay_subnets_of_the_default_vpc_are_routed() {
        let list = [
            subnet(
                json!({"metadata": {"name": "b"}, "spec": {"cidrBlock": "10.2.0.0/16,fd00:2::/64"}}),
            ),
            subnet(
                json!({"metadata": {"name": "a"}, "spec": {"vpc": "ovn-cluster", "cidrBlock": "10.1.0.0/16"}}),
            ),
            subnet(
                json!({"metadata": {"name": "custom"}, "spec": {"vpc": "vpc1", "cidrBlock": "10.3.0.0/16"}}),
            ),
            subnet(
                json!({"metadata": {"name": "underlay"}, "spec": {"vlan": "v1", "cidrBlock": "10.4.0.0/16"}}),
            ),
            subnet(
                json!({"metadata": {"name": "lgw"}, "spec": {"vlan": "v1", "logicalGateway": true, "cidrBlock": "10.5.0.0/16"}}),
            ),
            subnet(
                json!({"metadata": {"name": "u2o"}, "spec": {"vlan": "v1", "u2oInterconnection": true, "cidrBlock": "10.6.0.0/16"}}),
            ),
            subnet(
                json!({"metadata": {"name": "u2o-lb"}, "spec": {"vlan": "v1", "u2oInterconnection": true, "enableLb": true, "cidrBlock": "10.7.0.0/16"}}),
            ),
            subnet(
                json!({"metadata": {"name": "refused"}, "spec": {"cidrBlock": "10.8.0.0/16"},
                "status": {"conditions": [{"type": "Validated", "status": "False"}]}}),
            ),
            subnet(
                json!({"metadata": {"name": "pending"}, "spec": {"cidrBlock": "10.9.0.0/16"}, "status": {}}),
            ),
            subnet(json!({"metadata": {"name": "bad"}, "spec": {"cidrBlock": "nonsense"}})),
        ];
        let got: Vec<String> = routed_cidrs(&list, DEFAULT_VPC)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            got,
            [
                "10.1.0.0/16",
                "10.2.0.0/16",
                "fd00:2::/64",
                "10.5.0.0/16",
                "10.6.0.0/16"
            ]
        );
    }

    #[test]
    fn join_routes_skip_the_join_subnet_and_families_without_gateway() {
        let join = JoinNetwork {
            ips: vec!["100.64.0.2/16".parse().unwrap()],
            mac: "00:00:00:11:22:33".parse().unwrap(),
            gateways: vec!["100.64.0.1".parse().unwrap()],
            pod_cidrs: Vec::new(),
        };
        let cidrs: Vec<IpNetwork> = ["100.64.0.0/16", "10.1.0.5/16", "10.1.0.0/16", "fd00::/64"]
            .iter()
            .map(|c| c.parse().unwrap())
            .collect();
        let r = join_routes(&join, "ovn0", &cidrs);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].to_string(), "10.1.0.0/16 via 100.64.0.1 dev ovn0");
    }

    /// While the join interface is down a pod's network is refused after its timeout; a request already
    /// waiting when the interface comes up (polled once: it watches the flag) is served then, not refused
    /// and not before.
    #[tokio::test]
    async fn pods_wait_for_the_join_interface() {
        let inner = Arc::new(StaticPodNetworks::new());
        inner.insert(
            "ns",
            "p",
            PodNetwork {
                ips: vec!["10.1.0.5/16".parse().unwrap()],
                provider: "ovn".into(),
                ..Default::default()
            },
        );
        let (tx, rx) = watch::channel(false);
        let src = AfterJoin::new(inner, rx, "n1", "ovn0");
        let pod = PodRef {
            namespace: "ns".into(),
            name: "p".into(),
            ..Default::default()
        };
        assert!(!src.ready());
        let t0 = tokio::time::Instant::now();
        let e = src
            .pod_network(&pod, "ovn", Duration::from_millis(20))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, SourceError::Unavailable(m) if m.contains("ovn0")),
            "{e}"
        );
        assert!(t0.elapsed() >= Duration::from_millis(20));
        let mut waiting = Box::pin(src.pod_network(&pod, "ovn", Duration::from_secs(5)));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(std::future::Future::poll(waiting.as_mut(), &mut cx).is_pending());
        tx.send_replace(true);
        assert!(src.ready());
        assert_eq!(waiting.await.unwrap().ips.len(), 1);
    }
}
