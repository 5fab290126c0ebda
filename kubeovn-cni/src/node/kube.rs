//! The Kubernetes [`PodNetworkSource`]: a watch-based cache (kube-runtime reflector) of this node's pods,
//! read through kubeovn-core's annotation parser.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use kubeovn_core::annotations::{NodeAnnotations, PodNetworkAnnotations};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{DaemonError, JoinNetwork, PodNetwork, PodNetworkSource, PodRoute, SourceError};
use crate::daemon::PodRef;

fn default_dst(gw: Option<IpAddr>) -> IpNetwork {
    let ip = match gw {
        Some(IpAddr::V6(_)) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        _ => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
    };
    IpNetwork::new(ip, 0).unwrap_or_else(|_| IpNetwork::from(ip))
}

/// Each address with the prefix of the CIDR of its family (`ip_address` and `cidr` annotations).
fn with_prefixes(
    ips: &[IpAddr],
    cidrs: &[IpNetwork],
    what: &str,
) -> Result<Vec<IpNetwork>, String> {
    ips.iter()
        .map(|ip| {
            let cidr = cidrs
                .iter()
                .find(|c| c.is_ipv4() == ip.is_ipv4())
                .ok_or_else(|| format!("no {what} of the family of {ip}"))?;
            IpNetwork::new(*ip, cidr.prefix()).map_err(|e| e.to_string())
        })
        .collect()
}

/// The pod's network for `provider` from its annotations: `Ok(None)` while the controller has not set
/// `allocated` and `routed`, `Err` when the annotations do not parse or do not fit together.
pub fn pod_network_from_annotations(
    annotations: &BTreeMap<String, String>,
    provider: &str,
) -> Result<Option<PodNetwork>, String> {
    let a = PodNetworkAnnotations::parse(annotations, provider).map_err(|e| e.to_string())?;
    if !a.allocated || !a.routed {
        return Ok(None);
    }
    Ok(Some(PodNetwork {
        ips: with_prefixes(&a.ip_addresses, &a.cidrs, "cidr")?,
        mac: a.mac_address,
        gateways: a.gateways.clone(),
        logical_switch: a.logical_switch.clone().unwrap_or_default(),
        provider: provider.to_owned(),
        routes: a
            .routes
            .iter()
            .map(|r| PodRoute {
                dst: r.dst.unwrap_or_else(|| default_dst(r.gw)),
                gw: r.gw,
            })
            .collect(),
        mtu: None,
        ingress_rate_mbps: a.ingress_rate,
        egress_rate_mbps: a.egress_rate,
    }))
}

/// The node's join network from its annotations (`None` until the controller has allocated it), with
/// `pod_cidrs` routed through the join gateway.
pub fn join_from_node_annotations(
    annotations: &BTreeMap<String, String>,
    pod_cidrs: Vec<IpNetwork>,
) -> Result<Option<JoinNetwork>, String> {
    let a = NodeAnnotations::parse(annotations).map_err(|e| e.to_string())?;
    if a.ip_addresses.is_empty() {
        return Ok(None);
    }
    let Some(mac) = a.mac_address else {
        return Ok(None);
    };
    Ok(Some(JoinNetwork {
        ips: with_prefixes(&a.ip_addresses, &a.cidrs, "join cidr")?,
        mac,
        gateways: a.gateways,
        pod_cidrs,
    }))
}

/// Reads node `name`'s join network from the API (one GET).
pub async fn node_join_network(
    client: Client,
    name: &str,
    pod_cidrs: Vec<IpNetwork>,
) -> Result<Option<JoinNetwork>, DaemonError> {
    let node = Api::<Node>::all(client)
        .get(name)
        .await
        .map_err(|e| DaemonError::Kube(format!("get node {name}: {e}")))?;
    join_from_node_annotations(&node.metadata.annotations.unwrap_or_default(), pod_cidrs)
        .map_err(|e| DaemonError::Kube(format!("node {name} annotations: {e}")))
}

/// [`PodNetworkSource`] over a reflector of the pods scheduled to one node (`fieldSelector
/// spec.nodeName=<node>`): requests read the local cache and wait on its changes, never a GET per request.
pub struct KubePodNetworks {
    store: Store<Pod>,
    changed: watch::Receiver<u64>,
    ready: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for KubePodNetworks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubePodNetworks")
            .field("ready", &self.ready.load(Ordering::Relaxed))
            .finish()
    }
}

impl Drop for KubePodNetworks {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl KubePodNetworks {
    /// Starts watching the pods of `node_name` in the background of the current runtime.
    pub fn start(client: Client, node_name: &str) -> Self {
        let api: Api<Pod> = Api::all(client);
        let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
        let (store, writer) = reflector::store();
        let (tx, changed) = watch::channel(0u64);
        let ready = Arc::new(AtomicBool::new(false));
        let r = ready.clone();
        let stream = reflector::reflector(writer, watcher(api, cfg).default_backoff());
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::InitDone) => r.store(true, Ordering::Relaxed),
                    Ok(_) => {}
                    // The backoff retries; requests keep reading the last known state meanwhile.
                    Err(_) => continue,
                }
                tx.send_modify(|v| *v = v.wrapping_add(1));
            }
        });
        KubePodNetworks {
            store,
            changed,
            ready,
            task,
        }
    }

    /// Waits until the first list has been loaded, at most `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.store.wait_until_ready())
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false)
    }
}

#[async_trait::async_trait]
impl PodNetworkSource for KubePodNetworks {
    async fn pod_network(
        &self,
        pod: &PodRef,
        provider: &str,
        timeout: Duration,
    ) -> Result<PodNetwork, SourceError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let key = ObjectRef::<Pod>::new(&pod.name).within(&pod.namespace);
        let mut rx = self.changed.clone();
        let mut missing = "pod";
        loop {
            // Mark the current version seen before reading: a change after the read wakes the wait.
            rx.borrow_and_update();
            if let Some(p) = self.store.get(&key) {
                let uid_ok =
                    pod.uid.is_empty() || p.metadata.uid.as_deref().is_none_or(|u| u == pod.uid);
                if uid_ok {
                    let ann = p.metadata.annotations.clone().unwrap_or_default();
                    match pod_network_from_annotations(&ann, provider) {
                        Ok(Some(n)) => return Ok(n),
                        Ok(None) => missing = "allocated and routed annotations",
                        Err(reason) => {
                            return Err(SourceError::Invalid {
                                namespace: pod.namespace.clone(),
                                name: pod.name.clone(),
                                reason,
                            })
                        }
                    }
                } else {
                    missing = "pod with this uid";
                }
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                _ => {
                    return Err(if missing == "pod" {
                        SourceError::NotFound {
                            namespace: pod.namespace.clone(),
                            name: pod.name.clone(),
                        }
                    } else {
                        SourceError::NotReady {
                            namespace: pod.namespace.clone(),
                            name: pod.name.clone(),
                            provider: provider.to_owned(),
                            waited: timeout,
                            missing: missing.into(),
                        }
                    })
                }
            }
        }
    }

    fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn annotations_to_pod_network() {
        let mut a = ann(&[
            ("ovn.kubernetes.io/ip_address", "10.16.0.5,fd00::5"),
            ("ovn.kubernetes.io/mac_address", "00:00:00:12:34:56"),
            ("ovn.kubernetes.io/cidr", "10.16.0.0/16,fd00::/64"),
            ("ovn.kubernetes.io/gateway", "10.16.0.1,fd00::1"),
            ("ovn.kubernetes.io/logical_switch", "ovn-default"),
            ("ovn.kubernetes.io/allocated", "true"),
            ("ovn.kubernetes.io/ingress_rate", "10"),
        ]);
        assert_eq!(pod_network_from_annotations(&a, "ovn").unwrap(), None);
        a.insert("ovn.kubernetes.io/routed".into(), "true".into());
        let n = pod_network_from_annotations(&a, "ovn").unwrap().unwrap();
        assert_eq!(n.ips[0].to_string(), "10.16.0.5/16");
        assert_eq!(n.ips[1].to_string(), "fd00::5/64");
        assert_eq!(n.mac.unwrap().to_string(), "00:00:00:12:34:56");
        assert_eq!(n.gateways.len(), 2);
        assert_eq!(n.logical_switch, "ovn-default");
        assert_eq!(n.ingress_rate_mbps, Some(10));
        assert!(n.validate().is_ok());
        // Another provider reads its own prefixed keys.
        assert_eq!(
            pod_network_from_annotations(&a, "net1.default.ovn").unwrap(),
            None
        );
        a.insert("ovn.kubernetes.io/ip_address".into(), "nonsense".into());
        assert!(pod_network_from_annotations(&a, "ovn").is_err());
    }

    #[test]
    fn node_annotations_to_join() {
        let a = ann(&[
            ("ovn.kubernetes.io/ip_address", "100.64.0.2"),
            ("ovn.kubernetes.io/mac_address", "00:00:00:aa:bb:cc"),
            ("ovn.kubernetes.io/cidr", "100.64.0.0/16"),
            ("ovn.kubernetes.io/gateway", "100.64.0.1"),
        ]);
        let j = join_from_node_annotations(&a, vec!["10.16.0.0/16".parse().unwrap()])
            .unwrap()
            .unwrap();
        assert_eq!(j.ips[0].to_string(), "100.64.0.2/16");
        assert_eq!(j.gateways[0].to_string(), "100.64.0.1");
        assert_eq!(
            join_from_node_annotations(&BTreeMap::new(), vec![]).unwrap(),
            None
        );
    }
}
