//! [`CniHandler`]: ADD, DEL, CHECK, STATUS and GC on a node.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnetwork::IpNetwork;
use kubeovn_core::annotations::provider_or_default;
use kubeovn_core::naming::pod_port;
use kubeovn_netdev::{
    host_nic_name, Mac, Namespaces, NetOp, Netdev, RouteSpec, VethPair, VethSpec,
};
use kubeovn_ovn::vswitch::{OpenVSwitch, OvsBatch, PortSpec, QosSpec, QueueSpec};

use super::probe::GatewayProbe;
use super::source::{PodNetwork, PodNetworkSource, SourceError};
use super::{CODE_CHECK_FAILED, CODE_GATEWAY_UNREACHABLE};
use crate::daemon::{PodRef, Request, Response};
use crate::spec::{
    CniError, CniResult, Command, ErrorCode, Interface, IpCidr, IpConfig, Route, Version,
};
use crate::Error;

/// Interface `external_ids` key: the container (sandbox) id of the attachment (for `GC`).
pub const EXT_CONTAINER_ID: &str = "cni_container_id";
/// Interface `external_ids` key: `CNI_IFNAME` of the attachment.
pub const EXT_IFNAME: &str = "cni_ifname";
/// Interface `external_ids` key: the CNI network name of the attachment.
pub const EXT_NETWORK: &str = "cni_network";

/// The logical switch port OVN binds the attachment's interface to (`external_ids:iface-id`): the port the
/// controller created for the pod's network, named by the one rule both use (kubeovn-core's
/// `naming::pod_port`; an empty provider is the default network).
fn iface_id(pod: &PodRef, provider: &str) -> String {
    pod_port(&pod.name, &pod.namespace, provider)
}

/// How the handler behaves.
#[derive(Debug, Clone)]
pub struct HandlerConfig {
    /// The integration bridge (`br-int`).
    pub bridge: String,
    /// MTU of pod interfaces when the pod's network does not say.
    pub mtu: u32,
    /// How long `ADD` waits for the controller to allocate and route the pod.
    pub pod_network_timeout: Duration,
    /// How long `ADD` waits for ovn-controller's `ovn-installed`; `None` does not wait.
    pub ovn_installed_timeout: Option<Duration>,
    /// How long `ADD` waits for the gateway to answer; `None` does not check.
    pub gateway_timeout: Option<Duration>,
    /// No IPv6 address generation (addrgenmode none) on the interface of a pod that has no IPv6 address: no
    /// link-local address, so none of the MLD reports, duplicate address detection and router solicitations
    /// that each new interface floods to every port of its logical switch (with the userspace datapath each
    /// flood is a datapath flow whose actions list every port, revalidated on every flow table change).
    pub ipv4_only_no_ipv6: bool,
    /// TX checksum offload off on the pod's interface (as Kube-OVN's daemon does): a veth hands on TCP and
    /// UDP packets with partial checksums, which the userspace datapath (`datapath_type=netdev`) forwards
    /// unfinished and the receiving pod drops, so only ICMP would pass. Off costs the pod's kernel the
    /// checksums (and TSO, which needs them); a kernel datapath that finishes them can do without.
    pub pod_tx_checksum_off: bool,
}

impl Default for HandlerConfig {
    fn default() -> Self {
        HandlerConfig {
            bridge: "br-int".into(),
            mtu: 1400,
            pod_network_timeout: Duration::from_secs(30),
            ovn_installed_timeout: Some(Duration::from_secs(20)),
            gateway_timeout: Some(Duration::from_secs(10)),
            ipv4_only_no_ipv6: true,
            pod_tx_checksum_off: true,
        }
    }
}

/// One attachment's names, from a request.
struct Attachment<'a> {
    container_id: &'a str,
    netns: Option<&'a str>,
    ifname: &'a str,
    host_if: String,
}

/// The node's CNI handlers, composed from the I/O seams (see the module docs).
pub struct CniHandler {
    cfg: HandlerConfig,
    source: Arc<dyn PodNetworkSource>,
    ovs: Arc<dyn OpenVSwitch>,
    host: Arc<dyn Netdev>,
    namespaces: Arc<dyn Namespaces>,
    probe: Arc<dyn GatewayProbe>,
    /// Per host interface: ADD, DEL and CHECK of one attachment never interleave.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl std::fmt::Debug for CniHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CniHandler")
            .field("cfg", &self.cfg)
            .finish()
    }
}

fn netdev(what: &'static str) -> impl FnOnce(kubeovn_netdev::Error) -> Error {
    move |source| Error::Netdev {
        what,
        source: Box::new(source),
    }
}

fn ovs(what: &'static str) -> impl FnOnce(kubeovn_ovn::Error) -> Error {
    move |source| Error::Ovs {
        what,
        source: Box::new(source),
    }
}

fn cidr(n: &IpNetwork) -> IpCidr {
    IpCidr {
        addr: n.ip(),
        prefix: n.prefix(),
    }
}

fn network_of(n: &IpNetwork) -> IpCidr {
    IpCidr {
        addr: n.network(),
        prefix: n.prefix(),
    }
}

fn default_dst(v4: bool) -> IpCidr {
    IpCidr {
        addr: if v4 {
            IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
        } else {
            IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
        },
        prefix: 0,
    }
}

/// The gateways that get a default route: those of families without an explicit default route in
/// `net.routes` (the `routes` annotation may replace the default route).
fn default_gateways(net: &PodNetwork) -> impl Iterator<Item = IpAddr> + '_ {
    net.gateways.iter().copied().filter(|gw| {
        !net.routes
            .iter()
            .any(|r| r.dst.prefix() == 0 && r.dst.is_ipv4() == gw.is_ipv4())
    })
}

impl CniHandler {
    /// A handler over the given seams.
    pub fn new(
        cfg: HandlerConfig,
        source: Arc<dyn PodNetworkSource>,
        ovs: Arc<dyn OpenVSwitch>,
        host: Arc<dyn Netdev>,
        namespaces: Arc<dyn Namespaces>,
        probe: Arc<dyn GatewayProbe>,
    ) -> Self {
        CniHandler {
            cfg,
            source,
            ovs,
            host,
            namespaces,
            probe,
            locks: Mutex::new(HashMap::new()),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &HandlerConfig {
        &self.cfg
    }

    /// Handles one request from the shim and answers it (errors become the spec's error object).
    pub async fn handle(&self, req: &Request) -> Response {
        if let Err(e) = req.check_protocol() {
            return Response::failure(e);
        }
        let out = match req.command {
            Command::Add => self.add(req).await.map(Some),
            Command::Del => self.del(req).await.map(|_| None),
            Command::Check => self.check(req).await.map(|_| None),
            Command::Status => self.status().await.map(|_| None),
            Command::Gc => self.gc(req).await.map(|_| None),
            Command::Version => Err(Error::InvalidEnv {
                var: "CNI_COMMAND",
                value: "VERSION".into(),
                reason: "VERSION is answered by the shim",
            }),
        };
        match out {
            Ok(Some(r)) => Response::with_result(&r),
            Ok(None) => Response::ok(),
            Err(e) => Response::failure(e.to_cni(&req.cni_version)),
        }
    }

    fn attachment<'a>(&self, req: &'a Request) -> Result<Attachment<'a>, Error> {
        let missing = |var: &'static str| Error::MissingEnv {
            command: req.command.as_str().to_owned(),
            vars: vec![var],
        };
        let container_id = req
            .container_id
            .as_deref()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| missing("CNI_CONTAINERID"))?;
        let ifname = req
            .ifname
            .as_deref()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| missing("CNI_IFNAME"))?;
        let (host_if, _) = host_nic_name(container_id, ifname).map_err(|e| match e {
            kubeovn_netdev::Error::InvalidContainerId { .. } => Error::InvalidEnv {
                var: "CNI_CONTAINERID",
                value: container_id.to_owned(),
                reason: "not usable in an interface name",
            },
            _ => Error::InvalidEnv {
                var: "CNI_IFNAME",
                value: ifname.to_owned(),
                reason: "not a valid interface name",
            },
        })?;
        Ok(Attachment {
            container_id,
            netns: req.netns.as_deref().filter(|s| !s.is_empty()),
            ifname,
            host_if,
        })
    }

    /// The lock of an attachment (by host interface name) or of a namespace (by [`netns_key`]).
    fn lock_for(&self, host_if: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut m = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        // Drop the entries nobody holds, so the map stays as small as the attachments in flight.
        if m.len() > 64 {
            m.retain(|_, l| Arc::strong_count(l) > 1);
        }
        m.entry(host_if.to_owned()).or_default().clone()
    }

    fn pod<'a>(&self, req: &'a Request) -> Result<&'a PodRef, Error> {
        req.pod.as_ref().ok_or_else(|| Error::InvalidEnv {
            var: "CNI_ARGS",
            value: String::new(),
            reason: "K8S_POD_NAME and K8S_POD_NAMESPACE are required",
        })
    }

    fn existing_netns<'a>(&self, a: &Attachment<'a>) -> Result<&'a str, Error> {
        let netns = a.netns.ok_or_else(|| Error::MissingEnv {
            command: "ADD".into(),
            vars: vec!["CNI_NETNS"],
        })?;
        if !Path::new(netns).exists() {
            return Err(Error::InvalidEnv {
                var: "CNI_NETNS",
                value: netns.to_owned(),
                reason: "the network namespace does not exist",
            });
        }
        Ok(netns)
    }

    /// `ADD`: plugs the pod and returns the CNI result (latest spec version). On failure, whatever this call
    /// created is removed again.
    pub async fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let a = self.attachment(req)?;
        let pod = self.pod(req)?;
        let netns = self.existing_netns(&a)?;
        let lock = self.lock_for(&a.host_if);
        let _held = lock.lock().await;
        // A veth of an earlier attachment in this namespace may still be going away in the background
        // (its DEL returned already): its pod end could hold this ADD's interface name.
        drop(self.lock_for(&netns_key(netns)).lock().await);
        let net = self
            .source
            .pod_network(
                pod,
                provider_or_default(&req.provider),
                self.cfg.pod_network_timeout,
            )
            .await?;
        net.validate().map_err(|reason| SourceError::Invalid {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            reason,
        })?;
        let port_existed = self.ovs.port(&a.host_if).is_some();
        let mtu = net.mtu.unwrap_or(self.cfg.mtu);
        let mut spec = VethSpec::new(&a.host_if, a.ifname, netns)
            .mtu(mtu)
            // Up in the create request: one link notification fewer for ovs-vswitchd, which reacts to each.
            .host_up()
            // The host end is a bridge port and never needs an address. Its IPv6 link-local address would
            // reach ovs-vswitchd as a host address change, each one making it re-read every host interface's
            // addresses (getifaddrs, a dump of all links): a cost that grew with the number of pods on the
            // node. None is made: over netlink before the pod end is up (no carrier until then). Not the
            // disable_ipv6 sysctl: each /proc/sys/net lookup walks one entry per network namespace on the node.
            .then([NetOp::ipv6_addr_gen_none(&a.host_if)]);
        if let Some(mac) = net.mac {
            spec = spec.peer_mac(mac);
        }
        // The pod end in the same round trip: a socket opened in the pod's namespace from the node's thread
        // (a thread per pod cost two wake-ups and a runtime start, long on a node busy with ovs-vswitchd).
        spec = spec.peer_then(pod_ops(a.ifname, &net, mtu, &self.cfg));
        // A failed create leaves no new pair behind; after it, undo what this ADD made.
        let pair = self
            .host
            .create_veth(&spec)
            .await
            .map_err(netdev("create veth"))?;
        match self.plug(req, pod, &a, netns, &net, &pair).await {
            Ok(r) => Ok(r),
            Err(e) => {
                if !port_existed {
                    let mut b = OvsBatch::new();
                    b.delete_port(a.host_if.clone());
                    let _ = self.ovs.commit(b).await;
                }
                if pair.created {
                    let _ = self.host.delete_link(&a.host_if).await;
                }
                Err(e)
            }
        }
    }

    fn port_batch(
        &self,
        req: &Request,
        pod: &PodRef,
        a: &Attachment<'_>,
        netns: &str,
        net: &PodNetwork,
    ) -> OvsBatch {
        let ips = net
            .ips
            .iter()
            .map(|i| i.ip().to_string())
            .collect::<Vec<_>>()
            .join(",");
        let mut port = PortSpec::new(&self.cfg.bridge, &a.host_if)
            .iface_id(iface_id(pod, &req.provider))
            .external_id("pod_name", &pod.name)
            .external_id("pod_namespace", &pod.namespace)
            .external_id("ip_address", ips)
            .external_id("pod_netns", netns)
            .external_id(EXT_CONTAINER_ID, a.container_id)
            .external_id(EXT_IFNAME, a.ifname)
            .external_id(EXT_NETWORK, &req.network);
        if !net.logical_switch.is_empty() {
            port = port.external_id("logical_switch", &net.logical_switch);
        }
        // Traffic the pod sends enters OVS through this interface: policing there limits the pod's egress.
        let (rate, burst) = match net.egress_rate_mbps {
            Some(m) if m > 0 => {
                let kbps = i64::try_from(m.saturating_mul(1000)).unwrap_or(i64::MAX);
                (kbps, kbps / 10 * 8)
            }
            _ => (0, 0),
        };
        port = port.ingress_policing(rate, burst);
        let mut b = OvsBatch::new();
        b.add(port);
        match net.ingress_rate_mbps {
            Some(m) if m > 0 => {
                let bps = m.saturating_mul(1_000_000);
                b.add(
                    QosSpec::new(&a.host_if, "linux-htb")
                        .other_config("max-rate", bps.to_string())
                        .external_id("iface-id", iface_id(pod, &req.provider))
                        .queue(0, QueueSpec::max_rate(bps)),
                );
            }
            _ => {
                if self.ovs.qos(&a.host_if).is_some() {
                    b.delete_qos(a.host_if.clone());
                }
            }
        }
        b
    }

    async fn plug(
        &self,
        req: &Request,
        pod: &PodRef,
        a: &Attachment<'_>,
        netns: &str,
        net: &PodNetwork,
        pair: &VethPair,
    ) -> Result<CniResult, Error> {
        // The MTU asked for: a new pair was made with it, and a found one is refused unless it has it.
        let mtu = pair.host.mtu;
        let batch = self.port_batch(req, pod, a, netns, net);
        // Last, once the pod end is ready: the port makes ovs-vswitchd and ovn-controller busy.
        self.ovs.commit(batch).await.map_err(ovs("add port"))?;

        if let Some(t) = self.cfg.ovn_installed_timeout {
            self.ovs
                .wait_ovn_installed(&a.host_if, t)
                .await
                .map_err(|source| Error::OvnNotInstalled {
                    iface: a.host_if.clone(),
                    source: Box::new(source),
                })?;
        }
        if let Some(t) = self.cfg.gateway_timeout {
            let probes = net.gateways.iter().map(|gw| async move {
                self.probe
                    .probe(Path::new(netns), a.ifname, *gw, t)
                    .await
                    .map_err(|reason| {
                        Error::Plugin(CniError::new(
                            CODE_GATEWAY_UNREACHABLE,
                            format!(
                                "gateway {gw} of pod {}/{} unreachable",
                                pod.namespace, pod.name
                            ),
                            reason,
                        ))
                    })
            });
            futures::future::try_join_all(probes).await?;
        }
        let pod_mac = net.mac.or(pair.peer.as_ref().and_then(|l| l.mac));
        Ok(self.result(a, netns, net, mtu, pair.host.mac, pod_mac))
    }

    fn result(
        &self,
        a: &Attachment<'_>,
        netns: &str,
        net: &PodNetwork,
        mtu: u32,
        host_mac: Option<Mac>,
        pod_mac: Option<Mac>,
    ) -> CniResult {
        let mut r = CniResult::new(Version::LATEST);
        r.interfaces.push(Interface {
            name: a.host_if.clone(),
            mac: host_mac.map(|m| m.to_string()).unwrap_or_default(),
            mtu: Some(mtu),
            ..Default::default()
        });
        r.interfaces.push(Interface {
            name: a.ifname.to_owned(),
            mac: pod_mac.map(|m| m.to_string()).unwrap_or_default(),
            mtu: Some(mtu),
            sandbox: netns.to_owned(),
            ..Default::default()
        });
        for ip in &net.ips {
            r.ips.push(IpConfig {
                address: cidr(ip),
                gateway: net
                    .gateways
                    .iter()
                    .find(|g| g.is_ipv4() == ip.is_ipv4())
                    .copied(),
                interface: Some(1),
            });
        }
        for gw in default_gateways(net) {
            let mut route = Route::to(default_dst(gw.is_ipv4()));
            route.gw = Some(gw);
            r.routes.push(route);
        }
        for pr in &net.routes {
            let mut route = Route::to(network_of(&pr.dst));
            route.gw = pr.gw;
            r.routes.push(route);
        }
        r
    }

    /// `DEL`: removes the attachment's OVS port (with its QoS) and its veth; absent pieces are fine.
    ///
    /// The OVS port is gone when this returns; the veth is deleted right after, in the background: the
    /// kernel's unregistration waits for RCU grace periods (~20 ms here) that nobody needs to wait for. The
    /// deletion holds the attachment's lock, so an `ADD`, `CHECK` or `DEL` of the same attachment waits for it.
    pub async fn del(&self, req: &Request) -> Result<(), Error> {
        let a = self.attachment(req)?;
        let lock = self.lock_for(&a.host_if);
        let held = lock.lock_owned().await;
        self.unplug_port(&a.host_if).await?;
        // Held until the veth is gone: an ADD in the same namespace waits for it (see `add`).
        let ns_held = match a.netns.filter(|n| !n.is_empty()) {
            Some(n) => Some(self.lock_for(&netns_key(n)).lock_owned().await),
            None => None,
        };
        let (host, name) = (self.host.clone(), a.host_if.clone());
        tokio::spawn(async move {
            let _held = (held, ns_held);
            // A failure leaves the veth for the next DEL or GC of the attachment, which retry.
            let _ = host.delete_link(&name).await;
        });
        Ok(())
    }

    async fn unplug_port(&self, host_if: &str) -> Result<(), Error> {
        if self.ovs.port(host_if).is_some() {
            let mut b = OvsBatch::new();
            b.delete_port(host_if.to_owned());
            self.ovs.commit(b).await.map_err(ovs("delete port"))?;
        }
        Ok(())
    }

    async fn unplug(&self, host_if: &str) -> Result<(), Error> {
        self.unplug_port(host_if).await?;
        // Deleting the host end takes the pod end (in the pod's namespace) with it.
        self.host
            .delete_link(host_if)
            .await
            .map_err(netdev("delete veth"))
    }

    /// `CHECK`: the attachment is as `ADD` left it (veth, OVS port and its iface-id, pod addresses and
    /// default routes), else code [`CODE_CHECK_FAILED`].
    pub async fn check(&self, req: &Request) -> Result<(), Error> {
        let a = self.attachment(req)?;
        let pod = self.pod(req)?;
        let netns = self.existing_netns(&a)?;
        let lock = self.lock_for(&a.host_if);
        let _held = lock.lock().await;
        let fail = |reason: String| {
            Error::Plugin(CniError::new(
                CODE_CHECK_FAILED,
                format!("CHECK of pod {}/{} failed", pod.namespace, pod.name),
                reason,
            ))
        };
        let net = self
            .source
            .pod_network(
                pod,
                provider_or_default(&req.provider),
                Duration::from_secs(1),
            )
            .await?;
        match self
            .host
            .link(&a.host_if)
            .await
            .map_err(netdev("look up host interface"))?
        {
            Some(l) if l.admin_up => {}
            Some(_) => return Err(fail(format!("host interface {} is down", a.host_if))),
            None => return Err(fail(format!("host interface {} is missing", a.host_if))),
        }
        let want_id = iface_id(pod, &req.provider);
        match self.ovs.interface(&a.host_if) {
            None => {
                return Err(fail(format!(
                    "OVS interface {} is missing from {}",
                    a.host_if, self.cfg.bridge
                )))
            }
            Some(i) if i.external_ids.get("iface-id") != Some(&want_id) => {
                return Err(fail(format!(
                    "OVS interface {} has iface-id {:?}, want {want_id:?}",
                    a.host_if,
                    i.external_ids.get("iface-id")
                )))
            }
            Some(_) => {}
        }
        let pod_dev = self
            .namespaces
            .open(Path::new(netns))
            .map_err(netdev("enter pod netns"))?;
        let link = pod_dev
            .link(a.ifname)
            .await
            .map_err(netdev("look up pod interface"))?
            .ok_or_else(|| fail(format!("{} is missing in {netns}", a.ifname)))?;
        if let Some(mac) = net.mac {
            if link.mac != Some(mac) {
                return Err(fail(format!(
                    "{} has MAC {:?}, want {mac}",
                    a.ifname, link.mac
                )));
            }
        }
        let have: HashSet<IpNetwork> = pod_dev
            .addresses(a.ifname)
            .await
            .map_err(netdev("list pod addresses"))?
            .into_iter()
            .map(|x| x.addr)
            .collect();
        let mut want: Vec<IpNetwork> = net.ips.clone();
        if let Some(prev) = &req.prev_result {
            for ip in &prev.ips {
                if let Ok(n) = IpNetwork::new(ip.address.addr, ip.address.prefix) {
                    want.push(n);
                }
            }
        }
        for ip in want {
            if !have.contains(&ip) {
                return Err(fail(format!("{} lacks address {ip}", a.ifname)));
            }
        }
        let routes = pod_dev.routes().await.map_err(netdev("list pod routes"))?;
        for gw in default_gateways(&net) {
            if !routes
                .iter()
                .any(|r| r.dst.prefix() == 0 && r.gateway == Some(gw))
            {
                return Err(fail(format!("no default route via {gw}")));
            }
        }
        Ok(())
    }

    /// `STATUS`: ready when the bridge exists and the pod network source can answer; else code 50.
    pub async fn status(&self) -> Result<(), Error> {
        let unavailable = |reason: String| {
            Error::Plugin(CniError::new(
                ErrorCode::NOT_AVAILABLE,
                "kube-ovn daemon not ready",
                reason,
            ))
        };
        if self.ovs.bridge(&self.cfg.bridge).is_none() {
            return Err(unavailable(format!(
                "bridge {} does not exist",
                self.cfg.bridge
            )));
        }
        if !self.source.ready() {
            return Err(unavailable("pod network source not synced".into()));
        }
        Ok(())
    }

    /// `GC`: removes the ports (and veths) this network's `ADD`s created on the bridge for attachments not in
    /// `validAttachments`.
    pub async fn gc(&self, req: &Request) -> Result<(), Error> {
        let valid: HashSet<(String, String)> = req
            .valid_attachments
            .iter()
            .flatten()
            .map(|a| (a.container_id.clone(), a.ifname.clone()))
            .collect();
        let mut first_err = None;
        for port in self.ovs.bridge_ports(&self.cfg.bridge) {
            let Some(iface) = self.ovs.interface(&port) else {
                continue;
            };
            let ext = &iface.external_ids;
            let (Some(cid), Some(ifname)) = (ext.get(EXT_CONTAINER_ID), ext.get(EXT_IFNAME)) else {
                continue;
            };
            if ext.get(EXT_NETWORK).map(String::as_str) != Some(req.network.as_str()) {
                continue;
            }
            if valid.contains(&(cid.clone(), ifname.clone())) {
                continue;
            }
            let lock = self.lock_for(&port);
            let _held = lock.lock().await;
            if let Err(e) = self.unplug(&port).await {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// The steps that configure a pod's interface `ifname`, in order: its MAC and MTU (already so on a new pair,
/// restored on one an earlier ADD left); TX checksum offload off (`pod_tx_checksum_off`); for an IPv4-only
/// pod (`ipv4_only_no_ipv6`) no IPv6 address generation before the link is up, so the kernel never sends from
/// a link-local address; the addresses, IPv6 ones without duplicate address detection; `lo` and the interface
/// up; the default routes via the gateways, then the pod's own routes.
fn pod_ops(ifname: &str, net: &PodNetwork, mtu: u32, cfg: &HandlerConfig) -> Vec<NetOp> {
    let mut ops = Vec::with_capacity(8);
    if let Some(mac) = net.mac {
        ops.push(NetOp::SetMac {
            link: ifname.to_owned(),
            mac,
        });
    }
    ops.push(NetOp::SetMtu {
        link: ifname.to_owned(),
        mtu,
    });
    // Before the link is up, so no packet leaves with a partial checksum. Only the pod's end: what the host
    // end hands the pod comes from ovs-vswitchd's packet socket, checksums complete.
    if cfg.pod_tx_checksum_off {
        ops.push(NetOp::tx_checksum_off(ifname));
    }
    // Netlink only, no sysctl: in a new namespace the first /proc/sys/net lookup walks one entry per network
    // namespace on the node (0.6 ms at 500 pods, growing with every pod).
    if cfg.ipv4_only_no_ipv6 && !net.ips.iter().any(|i| i.is_ipv6()) {
        ops.push(NetOp::ipv6_addr_gen_none(ifname));
    }
    for ip in &net.ips {
        // No duplicate address detection: OVN owns the address, and DAD would hold it back ~1 s.
        ops.push(NetOp::address_no_dad(ifname, *ip));
    }
    ops.push(NetOp::up("lo"));
    ops.push(NetOp::up(ifname));
    for gw in default_gateways(net) {
        ops.push(NetOp::AddRoute(RouteSpec::default_via(gw)));
    }
    for r in &net.routes {
        ops.push(NetOp::AddRoute(match r.gw {
            Some(gw) => RouteSpec::via(r.dst, gw),
            None => RouteSpec::on_link(r.dst, ifname),
        }));
    }
    ops
}

/// The lock key of a network namespace: a path, which no interface name can be.
fn netns_key(netns: &str) -> String {
    format!("netns:{netns}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::probe::MockGatewayProbe;
    use crate::node::source::MockPodNetworkSource;
    use crate::spec::NetConf;
    use kubeovn_netdev::{Link, MockNamespaces, MockNetdev, OperState};
    use kubeovn_ovn::vswitch::{MockOpenVSwitch, OvsOp};
    use std::sync::atomic::{AtomicUsize, Ordering};

    const CID: &str = "0123456789abcdef";
    const HOST_IF: &str = "0123456789ab_h";

    fn request(command: Command, netns: &str) -> Request {
        Request {
            protocol: crate::daemon::PROTOCOL_VERSION,
            command,
            cni_version: "1.0.0".into(),
            container_id: Some(CID.into()),
            netns: Some(netns.into()),
            ifname: Some("eth0".into()),
            pod: Some(PodRef {
                name: "web".into(),
                namespace: "ns".into(),
                ..Default::default()
            }),
            provider: "ovn".into(),
            network: "kube-ovn".into(),
            vf_driver: String::new(),
            device_id: String::new(),
            args: Default::default(),
            config: NetConf::from_slice(
                br#"{"cniVersion":"1.0.0","name":"kube-ovn","type":"kube-ovn"}"#,
            )
            .unwrap(),
            runtime_config: None,
            prev_result: None,
            valid_attachments: None,
        }
    }

    fn pod_net() -> PodNetwork {
        PodNetwork {
            ips: vec!["10.16.0.5/16".parse().unwrap()],
            mac: Some("00:00:00:01:02:03".parse().unwrap()),
            gateways: vec!["10.16.0.1".parse().unwrap()],
            logical_switch: "ovn-default".into(),
            provider: "ovn".into(),
            egress_rate_mbps: Some(2),
            ..Default::default()
        }
    }

    fn link(name: &str, mac: &str) -> Link {
        Link {
            index: 7,
            name: name.into(),
            mac: Some(mac.parse().unwrap()),
            mtu: 1400,
            admin_up: true,
            oper_state: OperState::Up,
            kind: Some("veth".into()),
        }
    }

    /// The CNI error of an ADD that must fail.
    async fn add_error(h: &CniHandler) -> CniError {
        let netns = std::env::temp_dir();
        h.handle(&request(Command::Add, netns.to_str().unwrap()))
            .await
            .into_outcome()
            .unwrap_err()
    }

    fn pair(created: bool) -> VethPair {
        VethPair {
            created,
            host: link(HOST_IF, "02:00:00:00:00:01"),
            peer: Some(link("eth0", "00:00:00:01:02:03")),
        }
    }

    fn source_ok() -> MockPodNetworkSource {
        let mut s = MockPodNetworkSource::new();
        s.expect_pod_network().returning(|_, _, _| Ok(pod_net()));
        s
    }

    /// An IPv4-only pod's end: MAC and MTU (a no-op on a new pair), TX checksum and IPv6 off before it is
    /// up, then address, links, route.
    fn pod_ops_v4() -> Vec<NetOp> {
        vec![
            NetOp::SetMac {
                link: "eth0".into(),
                mac: "00:00:00:01:02:03".parse().unwrap(),
            },
            NetOp::SetMtu {
                link: "eth0".into(),
                mtu: 1400,
            },
            NetOp::tx_checksum_off("eth0"),
            NetOp::ipv6_addr_gen_none("eth0"),
            NetOp::address_no_dad("eth0", "10.16.0.5/16".parse().unwrap()),
            NetOp::up("lo"),
            NetOp::up("eth0"),
            NetOp::AddRoute(RouteSpec::default_via("10.16.0.1".parse().unwrap())),
        ]
    }

    #[test]
    fn pod_ops_of_an_ipv6_pod_keep_ipv6_and_skip_dad() {
        let net = PodNetwork {
            ips: vec![
                "10.16.0.5/16".parse().unwrap(),
                "fd00:10:16::5/64".parse().unwrap(),
            ],
            gateways: vec![
                "10.16.0.1".parse().unwrap(),
                "fd00:10:16::1".parse().unwrap(),
            ],
            ..Default::default()
        };
        let ops = pod_ops("eth0", &net, 1400, &HandlerConfig::default());
        assert!(!ops.contains(&NetOp::ipv6_addr_gen_none("eth0")), "{ops:?}");
        assert!(
            !ops.iter().any(|o| matches!(o, NetOp::Sysctl { .. })),
            "{ops:?}"
        );
        for ip in &net.ips {
            assert!(ops.contains(&NetOp::address_no_dad("eth0", *ip)), "{ops:?}");
        }
        assert_eq!(
            ops.iter()
                .filter(|o| matches!(o, NetOp::AddRoute(_)))
                .count(),
            2
        );
        // An IPv4 pod with the option off keeps the kernel's IPv6 defaults; the same for TX checksumming.
        let v4 = PodNetwork {
            ips: vec!["10.16.0.5/16".parse().unwrap()],
            ..Default::default()
        };
        let kernel_defaults = HandlerConfig {
            ipv4_only_no_ipv6: false,
            pod_tx_checksum_off: false,
            ..Default::default()
        };
        let ops = pod_ops("eth0", &v4, 1400, &kernel_defaults);
        assert!(!ops.contains(&NetOp::ipv6_addr_gen_none("eth0")), "{ops:?}");
        assert!(!ops.contains(&NetOp::tx_checksum_off("eth0")), "{ops:?}");
    }

    /// The ADD path never starts a thread in the pod's namespace.
    fn no_pod_thread() -> MockNamespaces {
        let mut ns = MockNamespaces::new();
        ns.expect_open().times(0);
        ns
    }

    fn handler(
        source: MockPodNetworkSource,
        ovs: MockOpenVSwitch,
        host: MockNetdev,
        ns: MockNamespaces,
        probe: MockGatewayProbe,
    ) -> CniHandler {
        CniHandler::new(
            HandlerConfig::default(),
            Arc::new(source),
            Arc::new(ovs),
            Arc::new(host),
            Arc::new(ns),
            Arc::new(probe),
        )
    }

    /// A handler for ADDs that fail before the gateway probe: the pod's network found, no pod thread.
    fn add_handler(ovs: MockOpenVSwitch, host: MockNetdev) -> CniHandler {
        handler(
            source_ok(),
            ovs,
            host,
            no_pod_thread(),
            MockGatewayProbe::new(),
        )
    }

    #[tokio::test]
    async fn add_plugs_port_and_configures_pod() {
        add_plugs_the_controllers_port("ovn").await;
    }

    /// The shim sends no provider for the default network: the daemon reads the pod's default network and
    /// plugs the port the controller named for it (the controller and the daemon share one naming rule).
    #[tokio::test]
    async fn add_with_empty_provider_plugs_the_controllers_port() {
        add_plugs_the_controllers_port("").await;
    }

    async fn add_plugs_the_controllers_port(provider: &str) {
        use kubeovn_core::annotations::DEFAULT_PROVIDER;
        // The name the controller gives the pod's port on its default network.
        let controller_port = kubeovn_core::naming::pod_port("web", "ns", DEFAULT_PROVIDER);
        assert_eq!(controller_port, "web.ns");
        let netns = std::env::temp_dir();
        let mut host = MockNetdev::new();
        // One round trip on the host side: the pair with its host end up, no IPv6 addresses on that end.
        host.expect_create_veth()
            .withf(|s| {
                s.host_name == HOST_IF
                    && s.peer_name == "eth0"
                    && s.mtu == Some(1400)
                    && s.peer_mac.map(|m| m.to_string()) == Some("00:00:00:01:02:03".into())
                    && s.host_up
                    && s.then == [NetOp::ipv6_addr_gen_none(HOST_IF)]
                    && s.peer_then == pod_ops_v4()
            })
            .times(1)
            .returning(|_| Ok(pair(true)));
        host.expect_link().times(0);
        host.expect_apply().times(0);
        let mut ovs = MockOpenVSwitch::new();
        ovs.expect_port().returning(|_| None);
        ovs.expect_qos().returning(|_| None);
        ovs.expect_commit()
            .withf(move |b| {
                let OvsOp::Port(p) = &b.ops[0] else {
                    return false;
                };
                let ext = |k: &str| p.external_ids.get(k).cloned().flatten();
                b.ops.len() == 1
                    && p.bridge == "br-int"
                    && p.name == HOST_IF
                    && ext("iface-id") == Some(controller_port.clone())
                    && ext("pod_name").as_deref() == Some("web")
                    && ext("pod_namespace").as_deref() == Some("ns")
                    && ext("ip_address").as_deref() == Some("10.16.0.5")
                    && ext(EXT_CONTAINER_ID).as_deref() == Some(CID)
                    && p.ingress_policing_rate == Some(2000)
                    && p.ingress_policing_burst == Some(1600)
            })
            .times(1)
            .returning(|_| Ok(()));
        ovs.expect_wait_ovn_installed()
            .withf(|i, _| i == HOST_IF)
            .times(1)
            .returning(|_, _| Ok(()));
        let mut probe = MockGatewayProbe::new();
        probe
            .expect_probe()
            .withf(|_, ifname, gw, _| ifname == "eth0" && gw.to_string() == "10.16.0.1")
            .times(1)
            .returning(|_, _, _, _| Ok(Duration::from_millis(1)));
        let mut source = MockPodNetworkSource::new();
        source
            .expect_pod_network()
            .withf(|_, provider, _| provider == DEFAULT_PROVIDER)
            .times(1)
            .returning(|_, _, _| Ok(pod_net()));
        let h = handler(source, ovs, host, no_pod_thread(), probe);
        let mut req = request(Command::Add, netns.to_str().unwrap());
        req.provider = provider.into();
        let resp = h.handle(&req).await;
        let r = resp.into_outcome().unwrap().unwrap();
        assert_eq!(r.interfaces[0].name, HOST_IF);
        assert_eq!(r.interfaces[0].mac, "02:00:00:00:00:01");
        assert_eq!(r.interfaces[1].mac, "00:00:00:01:02:03");
        assert_eq!(r.ips[0].address.to_string(), "10.16.0.5/16");
        assert_eq!(r.ips[0].gateway, Some("10.16.0.1".parse().unwrap()));
        assert_eq!(r.routes[0].dst.to_string(), "0.0.0.0/0");
    }

    #[tokio::test]
    async fn failed_add_rolls_back_what_it_created() {
        let mut host = MockNetdev::new();
        host.expect_create_veth()
            .times(1)
            .returning(|_| Ok(pair(true)));
        host.expect_delete_link()
            .withf(|n| n == HOST_IF)
            .times(1)
            .returning(|_| Ok(()));
        let mut ovs = MockOpenVSwitch::new();
        ovs.expect_port().returning(|_| None);
        ovs.expect_qos().returning(|_| None);
        let commits = Arc::new(Mutex::new(Vec::new()));
        let c2 = commits.clone();
        ovs.expect_commit().returning(move |b| {
            c2.lock().unwrap().push(b);
            Ok(())
        });
        ovs.expect_wait_ovn_installed().returning(|i, t| {
            Err(kubeovn_ovn::vswitch::OvsError::Timeout(t, format!("ovn-installed of {i}")).into())
        });
        let h = add_handler(ovs, host);
        let e = add_error(&h).await;
        assert_eq!(e.code, ErrorCode::TRY_AGAIN_LATER, "{e:?}");
        let commits = commits.lock().unwrap();
        assert_eq!(commits.len(), 2);
        assert_eq!(commits[1].ops, vec![OvsOp::DeletePort(HOST_IF.into())]);
    }

    #[tokio::test]
    async fn failed_veth_creation_touches_nothing_else() {
        let mut host = MockNetdev::new();
        // create_veth itself removes a pair it made when a host step fails.
        host.expect_create_veth().times(1).returning(|_| {
            Err(kubeovn_netdev::Error::LinkNotFound {
                link: HOST_IF.into(),
                netns: "host".into(),
            })
        });
        host.expect_delete_link().times(0);
        let mut ovs = MockOpenVSwitch::new();
        ovs.expect_port().returning(|_| None);
        ovs.expect_commit().times(0);
        let h = add_handler(ovs, host);
        let e = add_error(&h).await;
        assert!(e.msg.contains("create veth"), "{e:?}");
    }

    #[tokio::test]
    async fn repeated_add_failure_keeps_what_existed() {
        let mut host = MockNetdev::new();
        // The pair existed: a failed ADD leaves it.
        host.expect_create_veth().returning(|_| Ok(pair(false)));
        host.expect_delete_link().times(0);
        let mut ovs = MockOpenVSwitch::new();
        ovs.expect_port().returning(|_| Some(Default::default()));
        ovs.expect_qos().returning(|_| None);
        ovs.expect_commit().times(1).returning(|_| {
            Err(kubeovn_ovn::Error::Protocol {
                method: "transact",
                what: "refused".into(),
            })
        });
        let h = add_handler(ovs, host);
        let e = add_error(&h).await;
        assert_eq!(e.code, crate::node::CODE_OVS, "{e:?}");
    }

    #[tokio::test]
    async fn del_is_idempotent_and_handles_half_gone() {
        let mut host = MockNetdev::new();
        host.expect_delete_link()
            .withf(|n| n == HOST_IF)
            .times(2)
            .returning(|_| Ok(()));
        let mut ovs = MockOpenVSwitch::new();
        let calls = Arc::new(AtomicUsize::new(0));
        let c2 = calls.clone();
        // The port is there for the first DEL only.
        ovs.expect_port()
            .returning(move |_| (c2.fetch_add(1, Ordering::SeqCst) == 0).then(Default::default));
        ovs.expect_commit()
            .withf(|b| b.ops == vec![OvsOp::DeletePort(HOST_IF.into())])
            .times(1)
            .returning(|_| Ok(()));
        let h = handler(
            MockPodNetworkSource::new(),
            ovs,
            host,
            MockNamespaces::new(),
            MockGatewayProbe::new(),
        );
        let mut req = request(Command::Del, "/var/run/netns/gone");
        req.pod = None;
        assert!(h.handle(&req).await.error.is_none());
        assert!(h.handle(&req).await.error.is_none());
        // The second DEL waited for the first's background veth deletion; let its own run.
        let _ = h.lock_for(HOST_IF).lock().await;
    }

    /// DEL returns while its veth deletion is still running (held at a gate: the kernel's slow unregistration),
    /// and an ADD in the same namespace waits for it: polled while the deletion is held, it has not asked for
    /// the pod's network; once the deletion ends it goes on and creates its veth.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn add_waits_for_a_pending_deletion_in_its_namespace() {
        let netns = std::env::temp_dir();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel::<()>();
        let (release, gate) = std::sync::mpsc::channel::<()>();
        let gate = std::sync::Mutex::new(gate);
        let mut host = MockNetdev::new();
        let o = order.clone();
        host.expect_delete_link()
            .withf(|n| n != HOST_IF)
            .times(1)
            .returning(move |_| {
                let _ = started_tx.send(());
                // Blocks this worker until the test opens the gate (the runtime has another).
                let _ = gate.lock().unwrap().recv();
                o.lock().unwrap().push("deleted");
                Ok(())
            });
        let o = order.clone();
        host.expect_create_veth().times(1).returning(move |_| {
            o.lock().unwrap().push("created");
            Ok(pair(true))
        });
        let mut ovs = MockOpenVSwitch::new();
        ovs.expect_port().returning(|_| None);
        ovs.expect_qos().returning(|_| None);
        ovs.expect_commit().returning(|_| Ok(()));
        ovs.expect_wait_ovn_installed().returning(|_, _| Ok(()));
        let mut probe = MockGatewayProbe::new();
        probe
            .expect_probe()
            .returning(|_, _, _, _| Ok(Duration::from_millis(1)));
        let mut source = MockPodNetworkSource::new();
        let o = order.clone();
        source.expect_pod_network().returning(move |_, _, _| {
            o.lock().unwrap().push("source");
            Ok(pod_net())
        });
        let h = handler(source, ovs, host, no_pod_thread(), probe);
        // An earlier attachment (another container) in the same namespace: its DEL returns while the
        // deletion it started is held.
        let mut del = request(Command::Del, netns.to_str().unwrap());
        del.container_id = Some("fedcba9876543210".into());
        assert!(h.handle(&del).await.error.is_none());
        tokio::time::timeout(Duration::from_secs(10), started.recv())
            .await
            .expect("the veth deletion started")
            .unwrap();
        assert!(order.lock().unwrap().is_empty(), "DEL waited for the veth");
        let add = request(Command::Add, netns.to_str().unwrap());
        let mut adding = Box::pin(h.handle(&add));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        // The namespace's lock is the ADD's only wait before it asks for the pod's network.
        assert!(std::future::Future::poll(adding.as_mut(), &mut cx).is_pending());
        assert!(
            order.lock().unwrap().is_empty(),
            "ADD went on during the deletion: {:?}",
            order.lock().unwrap()
        );
        release.send(()).unwrap();
        let r = adding.await;
        assert!(r.error.is_none(), "{:?}", r.error);
        assert_eq!(*order.lock().unwrap(), ["deleted", "source", "created"]);
    }

    #[tokio::test]
    async fn bad_requests_get_codes_and_touch_nothing() {
        let h = handler(
            MockPodNetworkSource::new(),
            MockOpenVSwitch::new(),
            MockNetdev::new(),
            MockNamespaces::new(),
            MockGatewayProbe::new(),
        );
        let mut r = request(Command::Add, "/var/run/netns/does-not-exist");
        assert_eq!(h.handle(&r).await.error.unwrap().code.0, 4);
        r.container_id = None;
        assert_eq!(h.handle(&r).await.error.unwrap().code.0, 4);
        let mut r = request(Command::Add, "/tmp");
        r.pod = None;
        assert_eq!(h.handle(&r).await.error.unwrap().code.0, 4);
        let mut r = request(Command::Add, "/tmp");
        r.ifname = Some("way-too-long-interface".into());
        assert_eq!(h.handle(&r).await.error.unwrap().code.0, 4);
        let mut r = request(Command::Add, "/tmp");
        r.protocol = 9;
        assert_eq!(
            h.handle(&r).await.error.unwrap().code,
            crate::daemon::CODE_PROTOCOL_MISMATCH
        );
    }
}
