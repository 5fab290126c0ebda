//! The pod's network data and where it comes from.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use ipnetwork::IpNetwork;
use kubeovn_core::annotations::provider_or_default;
use kubeovn_netdev::Mac;
use serde_json::Value;
use tokio::sync::watch;

use crate::daemon::PodRef;

/// An extra route of the pod (the `routes` annotation): `dst` via `gw`, or on-link when `gw` is `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRoute {
    /// Destination.
    pub dst: IpNetwork,
    /// Next hop.
    pub gw: Option<IpAddr>,
}

/// What the node needs to plug one pod interface: the controller's allocation for one provider, neutral of
/// where it came from (annotations, a test's table).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodNetwork {
    /// The pod's addresses with the subnet's prefix length (`10.16.0.5/16`), one per family.
    pub ips: Vec<IpNetwork>,
    /// The pod interface's MAC (OVN's port security expects it); random when `None`.
    pub mac: Option<Mac>,
    /// Default gateways, at most one per family.
    pub gateways: Vec<IpAddr>,
    /// The logical switch the port is on (informational: OVN binds by `iface-id`).
    pub logical_switch: String,
    /// The Kube-OVN provider (`ovn`, or `<name>.<namespace>.ovn` for attachments).
    pub provider: String,
    /// Extra routes.
    pub routes: Vec<PodRoute>,
    /// Interface MTU; the handler's default when `None`.
    pub mtu: Option<u32>,
    /// Traffic into the pod, Mbit/s (an HTB QoS on the OVS port).
    pub ingress_rate_mbps: Option<u64>,
    /// Traffic out of the pod, Mbit/s (ingress policing on the OVS interface).
    pub egress_rate_mbps: Option<u64>,
}

impl PodNetwork {
    /// Checks that the data can be applied: at least one address, at most one address and gateway per family,
    /// gateways of an address's family, routes' gateways of their destination's family.
    pub fn validate(&self) -> Result<(), String> {
        if self.ips.is_empty() {
            return Err("no IP address".into());
        }
        for v4 in [true, false] {
            if self.ips.iter().filter(|i| i.is_ipv4() == v4).count() > 1 {
                return Err("more than one address of a family".into());
            }
            if self.gateways.iter().filter(|g| g.is_ipv4() == v4).count() > 1 {
                return Err("more than one gateway of a family".into());
            }
        }
        for g in &self.gateways {
            if !self.ips.iter().any(|i| i.is_ipv4() == g.is_ipv4()) {
                return Err(format!("gateway {g} has no address of its family"));
            }
        }
        for r in &self.routes {
            if let Some(gw) = r.gw {
                if gw.is_ipv4() != r.dst.is_ipv4() {
                    return Err(format!("route {} via {gw} mixes families", r.dst));
                }
            }
        }
        if let Some(m) = self.mtu {
            if !(68..=65535).contains(&m) {
                return Err(format!("MTU {m} out of range"));
            }
        }
        Ok(())
    }
}

/// Why a pod's network could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The pod is not known to the source (after the wait).
    #[error("pod {namespace}/{name} not found")]
    NotFound {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The controller has not allocated or routed the pod's address in time.
    #[error("pod {namespace}/{name}: network of provider {provider} not ready after {waited:?} ({missing})")]
    NotReady {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Provider.
        provider: String,
        /// How long the source waited.
        waited: Duration,
        /// What was missing (`allocated`, `routed`).
        missing: String,
    },
    /// The pod's network data is malformed.
    #[error("pod {namespace}/{name}: invalid network data: {reason}")]
    Invalid {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The source itself is not usable (API server down, cache not synced).
    #[error("pod network source unavailable: {0}")]
    Unavailable(String),
}

/// Where the daemon gets a pod's network data. Implementations wait, up to `timeout`, until the controller
/// has allocated and routed the pod's address for `provider`.
#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub trait PodNetworkSource: Send + Sync {
    /// The pod's network for `provider`, waiting at most `timeout` for it to be ready.
    async fn pod_network(
        &self,
        pod: &PodRef,
        provider: &str,
        timeout: Duration,
    ) -> Result<PodNetwork, SourceError>;

    /// Whether the source can answer (for `STATUS`): its cache is synced, its connection is up.
    fn ready(&self) -> bool {
        true
    }
}

type Key = (String, String, String);

/// Why a static pod table does not load: what is wrong, and in which pod.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod table: {0}")]
pub struct PodTableError(String);

/// An in-memory [`PodNetworkSource`] for tests and the sandbox: a table of (namespace, name, provider) to
/// [`PodNetwork`]. Waiters wake up when an entry is inserted.
#[derive(Debug)]
pub struct StaticPodNetworks {
    table: Mutex<HashMap<Key, PodNetwork>>,
    changed: watch::Sender<u64>,
}

impl Default for StaticPodNetworks {
    fn default() -> Self {
        StaticPodNetworks {
            table: Mutex::new(HashMap::new()),
            changed: watch::channel(0).0,
        }
    }
}

impl StaticPodNetworks {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    fn key(namespace: &str, name: &str, provider: &str) -> Key {
        (namespace.to_owned(), name.to_owned(), provider.to_owned())
    }

    /// Sets the network of pod `namespace/name` for `net.provider`, waking waiters.
    pub fn insert(&self, namespace: &str, name: &str, net: PodNetwork) {
        let key = Self::key(namespace, name, &net.provider);
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, net);
        self.changed.send_modify(|v| *v += 1);
    }

    /// Removes the pod's network for `provider`.
    pub fn remove(&self, namespace: &str, name: &str, provider: &str) -> Option<PodNetwork> {
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&Self::key(namespace, name, provider))
    }

    /// A table from JSON (`kube-ovn-daemon --pod-source static:FILE`): a JSON array of `{"namespace", "name", "provider"?, "ips": ["10.0.0.2/24"],
    /// "mac"?, "gateways"?, "logical_switch"?, "routes"?: [{"dst", "gw"?}], "mtu"?, "ingress_rate"?,
    /// "egress_rate"?}`.
    pub fn from_json(text: &str) -> Result<Self, PodTableError> {
        let bad = PodTableError;
        let v: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let table = StaticPodNetworks::new();
        let strs = |p: &Value, k: &str| -> Vec<String> {
            p[k].as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        for p in v.as_array().ok_or_else(|| bad("not a JSON array".into()))? {
            let s = |k: &str| p[k].as_str().unwrap_or_default().to_owned();
            let parse_err = |k: &str, x: &str| {
                bad(format!("pod {}/{}: bad {k} {x}", s("namespace"), s("name")))
            };
            let net = PodNetwork {
                ips: strs(p, "ips")
                    .iter()
                    .map(|x| x.parse().map_err(|_| parse_err("ip", x)))
                    .collect::<Result<_, _>>()?,
                mac: match p["mac"].as_str() {
                    Some(m) => Some(m.parse().map_err(|_| parse_err("mac", m))?),
                    None => None,
                },
                gateways: strs(p, "gateways")
                    .iter()
                    .map(|x| x.parse().map_err(|_| parse_err("gateway", x)))
                    .collect::<Result<_, _>>()?,
                logical_switch: s("logical_switch"),
                provider: provider_or_default(p["provider"].as_str().unwrap_or_default())
                    .to_owned(),
                routes: p["routes"]
                    .as_array()
                    .map(|a| a.as_slice())
                    .unwrap_or_default()
                    .iter()
                    .map(|r| {
                        let dst = r["dst"].as_str().unwrap_or_default();
                        Ok(PodRoute {
                            dst: dst.parse().map_err(|_| parse_err("route", dst))?,
                            gw: match r["gw"].as_str() {
                                Some(g) => Some(g.parse().map_err(|_| parse_err("route gw", g))?),
                                None => None,
                            },
                        })
                    })
                    .collect::<Result<_, PodTableError>>()?,
                mtu: p["mtu"].as_u64().and_then(|m| u32::try_from(m).ok()),
                ingress_rate_mbps: p["ingress_rate"].as_u64(),
                egress_rate_mbps: p["egress_rate"].as_u64(),
            };
            net.validate()
                .map_err(|e| bad(format!("pod {}/{}: {e}", s("namespace"), s("name"))))?;
            table.insert(&s("namespace"), &s("name"), net);
        }
        Ok(table)
    }

    fn get(&self, key: &Key) -> Option<PodNetwork> {
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }
}

#[async_trait]
impl PodNetworkSource for StaticPodNetworks {
    async fn pod_network(
        &self,
        pod: &PodRef,
        provider: &str,
        timeout: Duration,
    ) -> Result<PodNetwork, SourceError> {
        let key = Self::key(&pod.namespace, &pod.name, provider);
        let deadline = tokio::time::Instant::now() + timeout;
        // Subscribe before looking: an insert between the lookup and the wait is not missed.
        let mut rx = self.changed.subscribe();
        loop {
            if let Some(n) = self.get(&key) {
                return Ok(n);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                _ => {
                    return Err(SourceError::NotReady {
                        namespace: pod.namespace.clone(),
                        name: pod.name.clone(),
                        provider: provider.to_owned(),
                        waited: timeout,
                        missing: "allocated".into(),
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(provider: &str) -> PodNetwork {
        PodNetwork {
            ips: vec!["10.16.0.5/16".parse().unwrap()],
            gateways: vec!["10.16.0.1".parse().unwrap()],
            provider: provider.into(),
            ..Default::default()
        }
    }

    #[test]
    fn validation() {
        assert!(net("ovn").validate().is_ok());
        let mut n = net("ovn");
        n.ips.clear();
        assert!(n.validate().is_err());
        let mut n = net("ovn");
        n.gateways.push("10.16.0.2".parse().unwrap());
        assert!(n.validate().is_err());
        let mut n = net("ovn");
        n.gateways = vec!["fd00::1".parse().unwrap()];
        assert!(n.validate().is_err());
        let mut n = net("ovn");
        n.routes.push(PodRoute {
            dst: "10.0.0.0/8".parse().unwrap(),
            gw: Some("fd00::1".parse().unwrap()),
        });
        assert!(n.validate().is_err());
        let mut n = net("ovn");
        n.mtu = Some(10);
        assert!(n.validate().is_err());
    }

    #[tokio::test]
    async fn static_source_waits_for_insert() {
        let s = std::sync::Arc::new(StaticPodNetworks::new());
        let pod = PodRef {
            name: "p".into(),
            namespace: "ns".into(),
            ..Default::default()
        };
        let e = s
            .pod_network(&pod, "ovn", Duration::from_millis(20))
            .await
            .unwrap_err();
        assert!(matches!(e, SourceError::NotReady { .. }), "{e}");
        // A waiter polled by hand: waiting before any insert, still waiting after another provider's (it
        // woke, looked and waits again), served by its own provider's.
        let mut waiting = Box::pin(s.pod_network(&pod, "ovn", Duration::from_secs(5)));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(std::future::Future::poll(waiting.as_mut(), &mut cx).is_pending());
        s.insert("ns", "p", net("other.ns.ovn"));
        assert!(std::future::Future::poll(waiting.as_mut(), &mut cx).is_pending());
        s.insert("ns", "p", net("ovn"));
        let got = waiting.await.unwrap();
        assert_eq!(got.provider, "ovn");
        assert!(s.remove("ns", "p", "ovn").is_some());
    }

    #[test]
    fn pod_table_from_json() {
        let t = StaticPodNetworks::from_json(
            r#"[{"namespace": "ns", "name": "a", "ips": ["10.0.0.2/24"], "mac": "00:00:00:00:00:0a",
                 "gateways": ["10.0.0.1"], "routes": [{"dst": "10.9.0.0/16", "gw": "10.0.0.254"}], "mtu": 1300},
                {"namespace": "ns", "name": "b", "provider": "net1.ns.ovn", "ips": ["10.1.0.2/24"]}]"#,
        )
        .unwrap();
        // No provider (or an empty one) is the default network.
        let a = t.get(&StaticPodNetworks::key("ns", "a", "ovn")).unwrap();
        assert_eq!(a.mac.unwrap().to_string(), "00:00:00:00:00:0a");
        assert_eq!(a.routes[0].gw, Some("10.0.0.254".parse().unwrap()));
        assert_eq!(a.mtu, Some(1300));
        assert!(t
            .get(&StaticPodNetworks::key("ns", "b", "net1.ns.ovn"))
            .is_some());
        for (bad, why) in [
            ("{}", "not a JSON array"),
            (
                r#"[{"namespace": "ns", "name": "a", "ips": ["10.0.0.300/24"]}]"#,
                "pod ns/a: bad ip",
            ),
            (
                r#"[{"namespace": "ns", "name": "a", "ips": [], "mac": "zz"}]"#,
                "pod ns/a: bad mac",
            ),
        ] {
            let e = StaticPodNetworks::from_json(bad).unwrap_err();
            assert!(e.to_string().contains(why), "{bad}: {e}");
        }
    }
}
