//! The plugin's configuration: the `ipam` section of the network configuration, and requested static IPs.

use std::net::IpAddr;
use std::path::PathBuf;

use kubeovn_cni::spec::{Dns, Env, IpCidr, NetConf, Route};
use serde::Deserialize;

use crate::Error;

/// Where state lives when `dataDir` is not given.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/kube-ovn-ipam";

/// The `ipam` section as written.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawIpam {
    #[serde(default)]
    subnet: String,
    #[serde(default)]
    gateway: String,
    #[serde(default)]
    exclude_ips: Vec<String>,
    #[serde(default)]
    routes: Vec<Route>,
    #[serde(default)]
    data_dir: Option<String>,
    #[serde(default)]
    dns: Option<Dns>,
    #[serde(default)]
    fsync: bool,
}

/// The validated `ipam` section.
#[derive(Debug, Clone, PartialEq)]
pub struct IpamConf {
    /// The subnet's CIDRs (network addresses), at most one per family, IPv4 first.
    pub cidrs: Vec<IpCidr>,
    /// The gateway of each CIDR (same order): given, or the first usable address.
    pub gateways: Vec<IpAddr>,
    /// Excluded addresses (`ip`, `a..b`, CIDR), as Kube-OVN writes them.
    pub exclude_ips: Vec<String>,
    /// Routes to return.
    pub routes: Vec<Route>,
    /// DNS settings to return.
    pub dns: Dns,
    /// The state directory's parent.
    pub data_dir: PathBuf,
    /// `"fsync": true`: wait for every state change to reach the disk (fdatasync) before answering.
    pub fsync: bool,
}

impl IpamConf {
    /// Reads and checks the `ipam` section of `conf` (code 7 when invalid).
    pub fn from_conf(conf: &NetConf) -> Result<IpamConf, Error> {
        let bad = |reason: String| Error::Config { reason };
        let raw = conf
            .ipam
            .clone()
            .ok_or_else(|| bad("no ipam section".into()))?;
        let raw: RawIpam = serde_json::from_value(raw).map_err(|e| bad(format!("ipam: {e}")))?;
        if raw.subnet.trim().is_empty() {
            return Err(bad("ipam.subnet is required".into()));
        }
        let mut cidrs: Vec<IpCidr> = Vec::new();
        for part in raw.subnet.split(',').map(str::trim) {
            let c: IpCidr = part
                .parse()
                .map_err(|_| bad(format!("ipam.subnet: invalid CIDR {part:?}")))?;
            if cidrs.iter().any(|o| o.is_ipv4() == c.is_ipv4()) {
                return Err(bad(format!(
                    "ipam.subnet {:?} has two CIDRs of one family",
                    raw.subnet
                )));
            }
            let host_bits = if c.is_ipv4() { 32 } else { 128 } - u32::from(c.prefix);
            if host_bits < 2 {
                return Err(bad(format!(
                    "ipam.subnet: {part} is too small to allocate from"
                )));
            }
            cidrs.push(IpCidr {
                addr: c.network(),
                prefix: c.prefix,
            });
        }
        cidrs.sort_by_key(|c| !c.is_ipv4());
        let mut given: Vec<IpAddr> = Vec::new();
        for part in raw
            .gateway
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let ip: IpAddr = part
                .parse()
                .map_err(|_| bad(format!("ipam.gateway: invalid address {part:?}")))?;
            if !cidrs.iter().any(|c| c.contains(ip)) {
                return Err(bad(format!(
                    "ipam.gateway {ip} is not in ipam.subnet {}",
                    raw.subnet
                )));
            }
            if given.iter().any(|g| g.is_ipv4() == ip.is_ipv4()) {
                return Err(bad(format!(
                    "ipam.gateway {:?} has two addresses of one family",
                    raw.gateway
                )));
            }
            given.push(ip);
        }
        let gateways = cidrs
            .iter()
            .map(|c| {
                given
                    .iter()
                    .copied()
                    .find(|g| c.contains(*g))
                    .unwrap_or_else(|| first_usable(c))
            })
            .collect();
        Ok(IpamConf {
            cidrs,
            gateways,
            exclude_ips: raw.exclude_ips,
            routes: raw.routes,
            dns: raw.dns.unwrap_or_default(),
            data_dir: PathBuf::from(raw.data_dir.unwrap_or_else(|| DEFAULT_DATA_DIR.to_owned())),
            fsync: raw.fsync,
        })
    }

    /// The subnet as Kube-OVN writes it: `"10.88.0.0/16,fd00:88::/112"`.
    pub fn cidr_string(&self) -> String {
        join(self.cidrs.iter())
    }

    /// The gateways as Kube-OVN writes them: `"10.88.0.1,fd00:88::1"`.
    pub fn gateway_string(&self) -> String {
        join(self.gateways.iter())
    }

    /// The CIDR an address belongs to (for its prefix length) and that CIDR's gateway.
    pub fn cidr_of(&self, ip: IpAddr) -> Option<(IpCidr, IpAddr)> {
        self.cidrs
            .iter()
            .zip(&self.gateways)
            .find(|(c, _)| c.contains(ip))
            .map(|(c, g)| (*c, *g))
    }
}

fn join<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
    items.map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

/// The first address after the network address.
fn first_usable(c: &IpCidr) -> IpAddr {
    match c.network() {
        IpAddr::V4(a) => IpAddr::V4(u32::from(a).wrapping_add(1).into()),
        IpAddr::V6(a) => IpAddr::V6(u128::from(a).wrapping_add(1).into()),
    }
}

/// Static addresses asked for through `runtimeConfig.ips`, `args.cni.ips` and `CNI_ARGS` `IP=` (a comma
/// separated list), with or without a prefix length; duplicates are merged, two of one family refused.
pub fn static_ips(conf: &NetConf, env: &Env) -> Result<Vec<IpAddr>, Error> {
    let from_env = env.arg("IP").into_iter().flat_map(|v| v.split(','));
    let mut out: Vec<IpAddr> = Vec::new();
    for text in conf
        .requested_ips()
        .chain(from_env)
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        let addr = text.split_once('/').map_or(text, |(a, _)| a);
        let ip: IpAddr = addr.parse().map_err(|_| Error::Config {
            reason: format!("invalid static IP {text:?}"),
        })?;
        if out.contains(&ip) {
            continue;
        }
        if let Some(other) = out.iter().find(|o| o.is_ipv4() == ip.is_ipv4()) {
            return Err(Error::Config {
                reason: format!("two static IPs of one family requested: {other} and {ip}"),
            });
        }
        out.push(ip);
    }
    out.sort_by_key(|i| !i.is_ipv4());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conf(ipam: serde_json::Value) -> NetConf {
        NetConf {
            cni_version: "1.0.0".into(),
            name: "n".into(),
            plugin_type: "bridge".into(),
            ipam: Some(ipam),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_and_dual_stack() {
        let c = IpamConf::from_conf(&conf(
            json!({"type": "kube-ovn-ipam", "subnet": "fd00:88::/112, 10.88.0.5/16",
            "gateway": "fd00:88::fe"}),
        ))
        .unwrap();
        assert_eq!(c.cidr_string(), "10.88.0.0/16,fd00:88::/112");
        assert_eq!(c.gateway_string(), "10.88.0.1,fd00:88::fe");
        assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        assert!(!c.fsync, "durability is opt-in");
        let synced = IpamConf::from_conf(&conf(
            json!({"type": "kube-ovn-ipam", "subnet": "10.88.0.0/16", "fsync": true}),
        ))
        .unwrap();
        assert!(synced.fsync);
        let (cidr, gw) = c.cidr_of("10.88.3.4".parse().unwrap()).unwrap();
        assert_eq!((cidr.prefix, gw.to_string().as_str()), (16, "10.88.0.1"));
    }

    #[test]
    fn invalid() {
        for ipam in [
            json!({"type": "kube-ovn-ipam"}),
            json!({"type": "kube-ovn-ipam", "subnet": "10.0.0.0/33"}),
            json!({"type": "kube-ovn-ipam", "subnet": "10.0.0.0/8,11.0.0.0/8"}),
            json!({"type": "kube-ovn-ipam", "subnet": "10.0.0.0/32"}),
            json!({"type": "kube-ovn-ipam", "subnet": "10.0.0.0/8", "gateway": "11.0.0.1"}),
            json!({"type": "kube-ovn-ipam", "subnet": "10.0.0.0/8", "gateway": "nope"}),
            json!({"type": "kube-ovn-ipam", "subnet": "10.0.0.0/8", "excludeIps": "10.0.0.1"}),
            json!({"type": "kube-ovn-ipam", "subnet": 5}),
        ] {
            assert!(
                matches!(
                    IpamConf::from_conf(&conf(ipam.clone())),
                    Err(Error::Config { .. })
                ),
                "{ipam}"
            );
        }
    }

    #[test]
    fn static_ips_from_all_conventions() {
        let mut c = conf(json!({}));
        c.runtime_config = serde_json::from_value(json!({"ips": ["10.0.0.5/24"]})).unwrap();
        c.args = serde_json::from_value(json!({"cni": {"ips": ["fd00::5"]}})).unwrap();
        let env = Env::from_lookup(|k| (k == "CNI_COMMAND").then(|| "VERSION".to_owned())).unwrap();
        assert_eq!(static_ips(&c, &env).unwrap().len(), 2);
        let env = Env {
            args: vec![("IP".into(), "10.0.0.5,fd00::6".into())],
            ..env
        };
        assert!(static_ips(&c, &env).is_err(), "two IPv6 addresses");
    }
}
