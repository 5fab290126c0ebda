//! The translation of a Service and its EndpointSlices into load balancer VIPs and backends, pure (no I/O,
//! no OVN types): what the controller's Service kind writes as OVN load balancers, usable by any other
//! programmer of a load balancer.
//!
//! ```
//! # use std::sync::Arc;
//! use k8s_openapi::api::core::v1::Service;
//! use k8s_openapi::api::discovery::v1::EndpointSlice;
//! let svc: Service = serde_json::from_value(serde_json::json!({
//!     "metadata": {"name": "web", "namespace": "default"},
//!     "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80}]}})).unwrap();
//! let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
//!     "metadata": {"name": "web-1", "namespace": "default"}, "addressType": "IPv4",
//!     "ports": [{"name": "http", "port": 8080}], "endpoints": [{"addresses": ["10.16.0.5"]}]})).unwrap();
//! let d = kubeovn_core::services::desired(&svc, &[Arc::new(slice)]);
//! assert_eq!(d.lbs["tcp"].vips["10.96.0.10:80"], "10.16.0.5:8080");
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The label naming the controller that writes an EndpointSlice.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// The label marking the EndpointSlices of a headless Service.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
/// kube-controller-manager's EndpointSlice controller's name in [`MANAGED_BY_LABEL`] (the sandbox's controller
/// writes it too: consumers treat its slices as kube-controller-manager's).
pub const ENDPOINTSLICE_CONTROLLER: &str = "endpointslice-controller.k8s.io";
/// The most OVN accepts for `options:affinity_timeout`.
pub const MAX_AFFINITY_TIMEOUT: i32 = 65535;
/// The ports a VIP or a backend can have.
const VALID_PORTS: std::ops::RangeInclusive<i32> = 1..=65535;
/// Kubernetes' default ClientIP affinity timeout.
const DEFAULT_AFFINITY_TIMEOUT: i32 = 10800;

/// One protocol's load balancer as a Service wants it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DesiredLb {
    /// VIP (`ip:port`, `[ip6]:port`) to backends (`ip:port,...`, empty: refuse).
    pub vips: BTreeMap<String, String>,
    /// Per VIP, per node: the backends on that node (what `internalTrafficPolicy: Local` balances to).
    pub by_node: BTreeMap<String, BTreeMap<String, String>>,
}

/// What a Service wants in OVN, computed from the Service and its slices alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Load balancers by protocol (absent: none for that protocol).
    pub lbs: BTreeMap<&'static str, DesiredLb>,
    /// `options:affinity_timeout`, if ClientIP affinity.
    pub affinity_timeout: Option<i32>,
    /// `internalTrafficPolicy: Local`: a client reaches only the backends on its own node.
    pub local: bool,
    /// Backend addresses (for the VPC choice).
    pub backend_ips: BTreeSet<IpAddr>,
    /// Problems to report as Warning events: (reason, message).
    pub warnings: Vec<(String, String)>,
}

/// `ip:port`, with brackets for IPv6.
pub fn endpoint(ip: IpAddr, port: i32) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

fn protocol_of(p: Option<&str>) -> Option<&'static str> {
    match p.unwrap_or("TCP") {
        "TCP" => Some("tcp"),
        "UDP" => Some("udp"),
        "SCTP" => Some("sctp"),
        _ => None,
    }
}

/// Whether the Service gets load balancers: not headless, not ExternalName.
pub fn is_balanced(svc: &Service) -> bool {
    let Some(spec) = &svc.spec else { return false };
    if spec.type_.as_deref() == Some("ExternalName") {
        return false;
    }
    !matches!(spec.cluster_ip.as_deref(), Some("None"))
}

/// The Service's load balancers from its spec and status and its slices.
pub fn desired(svc: &Service, slices: &[Arc<EndpointSlice>]) -> Desired {
    let mut d = Desired::default();
    let Some(spec) = svc.spec.as_ref().filter(|_| is_balanced(svc)) else {
        return d;
    };
    let mut ips: Vec<IpAddr> = Vec::new();
    let mut bad = Vec::new();
    let cluster_ips: Vec<&String> = match &spec.cluster_ips {
        Some(v) if !v.is_empty() => v.iter().collect(),
        _ => spec.cluster_ip.iter().collect(),
    };
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_ref());
    for s in cluster_ips
        .into_iter()
        .chain(spec.external_ips.iter().flatten())
        .chain(ingress)
    {
        if s.is_empty() || s == "None" {
            continue;
        }
        match s.parse::<IpAddr>() {
            Ok(ip) if !ips.contains(&ip) => ips.push(ip),
            Ok(_) => {}
            Err(_) => bad.push(s.clone()),
        }
    }
    if !bad.is_empty() {
        d.warnings.push((
            "InvalidServiceIP".into(),
            format!("not an IP address, left out: {}", bad.join(", ")),
        ));
    }
    if spec.session_affinity.as_deref() == Some("ClientIP") {
        let t = spec
            .session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT);
        if t > MAX_AFFINITY_TIMEOUT {
            d.warnings.push((
                "AffinityTimeoutClamped".into(),
                format!(
                    "sessionAffinityConfig.clientIP.timeoutSeconds {t} is above OVN's limit; {MAX_AFFINITY_TIMEOUT} s is used"
                ),
            ));
        }
        d.affinity_timeout = Some(t.clamp(1, MAX_AFFINITY_TIMEOUT));
    }
    d.local = spec.internal_traffic_policy.as_deref() == Some("Local");
    if d.local && d.affinity_timeout.is_some() {
        d.warnings.push((
            "AffinityWithLocalTraffic".into(),
            "sessionAffinity ClientIP is not applied with internalTrafficPolicy Local: OVN 23.03's template \
             load balancers (per-node backends) cannot keep an affinity"
                .into(),
        ));
        d.affinity_timeout = None;
    }
    for port in spec.ports.iter().flatten() {
        let Some(proto) = protocol_of(port.protocol.as_deref()) else {
            d.warnings.push((
                "UnsupportedProtocol".into(),
                format!(
                    "port {} has protocol {:?}; only TCP, UDP and SCTP are balanced",
                    port.port,
                    port.protocol.as_deref().unwrap_or_default()
                ),
            ));
            continue;
        };
        if !VALID_PORTS.contains(&port.port) {
            d.warnings.push((
                "InvalidPort".into(),
                format!("port {} is outside 1-65535; left out", port.port),
            ));
            continue;
        }
        let name = port.name.as_deref().unwrap_or_default();
        for ip in &ips {
            let backends = backends(slices, name, proto, ip.is_ipv4());
            d.backend_ips.extend(backends.iter().map(|(ip, _, _)| *ip));
            let list: Vec<String> = backends
                .iter()
                .map(|(ip, p, _)| endpoint(*ip, *p))
                .collect();
            let vip = endpoint(*ip, port.port);
            let lb = d.lbs.entry(proto).or_default();
            lb.vips.insert(vip.clone(), list.join(","));
            let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (ip, p, node) in &backends {
                if let Some(n) = node {
                    by_node
                        .entry(n.clone())
                        .or_default()
                        .push(endpoint(*ip, *p));
                }
            }
            lb.by_node.insert(
                vip,
                by_node.into_iter().map(|(n, v)| (n, v.join(","))).collect(),
            );
        }
    }
    d
}

/// The backends of the Service port named `name`/`proto` in family v4/v6: ready endpoints, else serving and
/// terminating ones (as kube-proxy does), sorted and without duplicates.
fn backends(
    slices: &[Arc<EndpointSlice>],
    name: &str,
    proto: &str,
    v4: bool,
) -> BTreeSet<(IpAddr, i32, Option<String>)> {
    let mut ready = BTreeSet::new();
    let mut terminating = BTreeSet::new();
    let family = if v4 { "IPv4" } else { "IPv6" };
    for s in slices.iter().filter(|s| s.address_type == family) {
        let Some(port) = s.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or_default() == name
                && protocol_of(p.protocol.as_deref()) == Some(proto)
        }) else {
            continue;
        };
        // A slice port out of range cannot be a backend (the API refuses it; a slice written past it is ignored).
        let Some(num) = port.port.filter(|p| VALID_PORTS.contains(p)) else {
            continue;
        };
        for e in s.endpoints.iter().flatten() {
            let Some(ip) = e.addresses.first().and_then(|a| a.parse::<IpAddr>().ok()) else {
                continue;
            };
            if ip.is_ipv4() != v4 {
                continue;
            }
            let c = e.conditions.as_ref();
            // Unset conditions read as ready and serving, not terminating (the API's defaults).
            let is_ready = c.and_then(|c| c.ready).unwrap_or(true);
            let serving = c.and_then(|c| c.serving).unwrap_or(is_ready);
            let term = c.and_then(|c| c.terminating).unwrap_or(false);
            let node = e.node_name.clone();
            if is_ready {
                ready.insert((ip, num, node));
            } else if serving && term {
                terminating.insert((ip, num, node));
            }
        }
    }
    if ready.is_empty() {
        terminating
    } else {
        ready
    }
}

/// Services and slices for the tests of this module and of the controller's Service kind.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;
    use serde_json::json;

    pub(crate) fn service(v: serde_json::Value) -> Service {
        serde_json::from_value(v).expect("service")
    }

    pub(crate) fn slice(
        name: &str,
        svc: &str,
        family: &str,
        ports: serde_json::Value,
        eps: serde_json::Value,
    ) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "labels": {SERVICE_NAME_LABEL: svc}},
            "addressType": family, "ports": ports, "endpoints": eps,
        }))
        .expect("slice")
    }

    pub(crate) fn web(cluster_ips: &[&str]) -> Service {
        service(json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"clusterIP": cluster_ips[0], "clusterIPs": cluster_ips,
                "ports": [{"name": "http", "port": 80, "targetPort": 8080},
                          {"name": "dns", "port": 53, "protocol": "UDP"}]}
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{service, slice, web};
    use super::*;
    use serde_json::json;

    #[test]
    fn vips_per_family_and_port_backends_by_name_ready_else_terminating() {
        let v4 = slice(
            "web-a",
            "web",
            "IPv4",
            json!([{"name": "http", "port": 8080}, {"name": "dns", "port": 5353, "protocol": "UDP"}]),
            json!([
                {"addresses": ["10.16.0.5"], "conditions": {"ready": true}},
                {"addresses": ["10.16.0.6"]},
                {"addresses": ["10.16.0.7"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                {"addresses": ["10.16.0.8"], "conditions": {"ready": false}},
            ]),
        );
        let v6 = slice(
            "web-b",
            "web",
            "IPv6",
            json!([{"name": "http", "port": 8080}]),
            json!([{"addresses": ["fd00::5"]}]),
        );
        let d = desired(
            &web(&["10.96.0.10", "fd00:96::10"]),
            &[Arc::new(v4.clone()), Arc::new(v6)],
        );
        let tcp = &d.lbs["tcp"].vips;
        assert_eq!(tcp["10.96.0.10:80"], "10.16.0.5:8080,10.16.0.6:8080");
        assert_eq!(tcp["[fd00:96::10]:80"], "[fd00::5]:8080");
        let udp = &d.lbs["udp"].vips;
        assert_eq!(udp["10.96.0.10:53"], "10.16.0.5:5353,10.16.0.6:5353");
        // No IPv6 slice port named dns: the VIP stays, without backends (it refuses).
        assert_eq!(udp["[fd00:96::10]:53"], "");
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);

        // Nothing ready: the serving, terminating endpoint takes over; the not-serving one never.
        let only_term = slice(
            "web-a",
            "web",
            "IPv4",
            json!([{"name": "http", "port": 8080}]),
            json!([
                {"addresses": ["10.16.0.7"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                {"addresses": ["10.16.0.8"], "conditions": {"ready": false, "serving": false, "terminating": true}},
            ]),
        );
        let d = desired(&web(&["10.96.0.10"]), &[Arc::new(only_term)]);
        assert_eq!(d.lbs["tcp"].vips["10.96.0.10:80"], "10.16.0.7:8080");
    }

    #[test]
    fn headless_external_name_affinity_and_external_ips() {
        let headless = service(json!({"metadata": {"name": "h", "namespace": "default"},
            "spec": {"clusterIP": "None", "ports": [{"port": 80}]}}));
        assert_eq!(desired(&headless, &[]), Desired::default());
        let ext = service(json!({"metadata": {"name": "e", "namespace": "default"},
            "spec": {"type": "ExternalName", "externalName": "example.com"}}));
        assert_eq!(desired(&ext, &[]), Desired::default());

        let s = service(json!({"metadata": {"name": "s", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.11", "externalIPs": ["192.0.2.7", "bogus"],
                "sessionAffinity": "ClientIP",
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 86400}},
                "ports": [{"port": 443, "protocol": "SCTP"}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.9"}]}}}));
        let d = desired(&s, &[]);
        let vips: Vec<&String> = d.lbs["sctp"].vips.keys().collect();
        assert_eq!(
            vips,
            ["10.96.0.11:443", "192.0.2.7:443", "198.51.100.9:443"]
        );
        assert_eq!(d.affinity_timeout, Some(MAX_AFFINITY_TIMEOUT));
        let reasons: Vec<&str> = d.warnings.iter().map(|(r, _)| r.as_str()).collect();
        assert_eq!(reasons, ["InvalidServiceIP", "AffinityTimeoutClamped"]);

        // Ports outside 1-65535 (the fuzz target found them reaching the VIPs): left out, with a warning.
        let s = service(json!({"metadata": {"name": "p", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.12", "ports": [{"port": 666928}, {"port": 0}, {"name": "ok", "port": 80}]}}));
        let sl = slice(
            "p-1",
            "p",
            "IPv4",
            json!([{"name": "ok", "port": 70000}]),
            json!([{"addresses": ["10.16.0.5"]}]),
        );
        let d = desired(&s, &[Arc::new(sl)]);
        assert_eq!(
            d.lbs["tcp"].vips.keys().collect::<Vec<_>>(),
            ["10.96.0.12:80"]
        );
        assert_eq!(
            d.lbs["tcp"].vips["10.96.0.12:80"], "",
            "a slice port out of range is no backend"
        );
        assert_eq!(
            d.warnings
                .iter()
                .filter(|(r, _)| r == "InvalidPort")
                .count(),
            2
        );
    }
}
