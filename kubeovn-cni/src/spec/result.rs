//! Results of every spec version, parsed into one form and converted on request.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config::null_default;
use super::{Dns, IpCidr, Version};
use crate::Error;

/// An interface created by an attachment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    /// The interface name.
    pub name: String,
    /// Its hardware address, if it has one.
    #[serde(
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub mac: String,
    /// Its MTU (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// The sandbox (netns path) it lives in; empty on the host.
    #[serde(
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub sandbox: String,
    /// A socket for the interface (1.1.0).
    #[serde(
        rename = "socketPath",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub socket_path: String,
    /// The PCI device of the interface (1.1.0).
    #[serde(
        rename = "pciID",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub pci_id: String,
}

/// An address assigned by an attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// The address with its prefix length ("10.1.0.5/16").
    pub address: IpCidr,
    /// The subnet's gateway, if there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces` (IPAM plugins leave it out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<u32>,
}

/// A route created by an attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// The destination.
    pub dst: IpCidr,
    /// The next hop; when unset the address's gateway may be used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    /// Path MTU (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// MSS to advertise (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    /// Route priority, lower wins (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// Routing table (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    /// Scope: 0 global, 253 link, 254 host (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u32>,
}

impl Route {
    /// A route to `dst` with no other attribute.
    pub fn to(dst: IpCidr) -> Route {
        Route {
            dst,
            gw: None,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }
}

/// A successful `ADD` result (any version), in the 1.1.0 form; serialises in the form of `cni_version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniResult {
    /// The version the result is written in.
    pub cni_version: Version,
    /// Interfaces (IPAM plugins return none).
    pub interfaces: Vec<Interface>,
    /// Addresses.
    pub ips: Vec<IpConfig>,
    /// Routes.
    pub routes: Vec<Route>,
    /// DNS settings.
    pub dns: Dns,
}

impl CniResult {
    /// An empty result in `version`.
    pub fn new(version: Version) -> CniResult {
        CniResult {
            cni_version: version,
            interfaces: Vec::new(),
            ips: Vec::new(),
            routes: Vec::new(),
            dns: Dns::default(),
        }
    }

    /// Parses a result of any supported version (code 6 for bad JSON, 1 for a missing or unknown version).
    pub fn from_slice(bytes: &[u8]) -> Result<CniResult, Error> {
        let w: WireIn = serde_json::from_slice(bytes).map_err(|source| Error::Decode {
            what: "result",
            source,
        })?;
        w.into_result(None)
    }

    /// Parses a result from JSON; `version` is used when the result carries no `cniVersion` (a `prevResult`).
    pub fn from_value_or_version(v: Value, version: Version) -> Result<CniResult, Error> {
        let w: WireIn = serde_json::from_value(v).map_err(|source| Error::Decode {
            what: "result",
            source,
        })?;
        w.into_result(Some(version))
    }

    /// The result converted to `version` (code 1 when unknown).
    pub fn convert(&self, version: &str) -> Result<CniResult, Error> {
        Ok(self.convert_to(Version::parse(version)?))
    }

    /// The result converted to `version`. Going down drops what the older form cannot say: 1.1.0 interface
    /// and route attributes below 1.0.0; below 0.3.0 the interfaces and all but the first IPv4 and IPv6
    /// address (and routes of a family without an address).
    pub fn convert_to(&self, version: Version) -> CniResult {
        let mut r = self.clone();
        r.cni_version = version;
        if version < Version::V1_0_0 {
            for i in &mut r.interfaces {
                i.mtu = None;
                i.socket_path.clear();
                i.pci_id.clear();
            }
            for rt in &mut r.routes {
                *rt = Route {
                    gw: rt.gw,
                    ..Route::to(rt.dst)
                };
            }
        }
        if version < Version::V0_3_0 {
            r.interfaces.clear();
            let v4 = r.ips.iter().find(|i| i.address.is_ipv4()).cloned();
            let v6 = r.ips.iter().find(|i| !i.address.is_ipv4()).cloned();
            let (has4, has6) = (v4.is_some(), v6.is_some());
            r.ips = v4
                .into_iter()
                .chain(v6)
                .map(|i| IpConfig {
                    interface: None,
                    ..i
                })
                .collect();
            let (r4, r6): (Vec<Route>, Vec<Route>) =
                r.routes.into_iter().partition(|rt| rt.dst.is_ipv4());
            r.routes = r4
                .into_iter()
                .filter(|_| has4)
                .chain(r6.into_iter().filter(|_| has6))
                .collect();
        }
        r
    }

    /// The result as JSON, in its version's form.
    pub fn to_json_value(&self) -> Value {
        // Only strings, numbers and lists: serialising cannot fail.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The result as JSON text, in its version's form.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Every field of every version's result, for parsing.
#[derive(Deserialize)]
struct WireIn {
    #[serde(rename = "cniVersion", default)]
    cni_version: Option<String>,
    #[serde(default, deserialize_with = "null_default")]
    interfaces: Vec<Interface>,
    #[serde(default, deserialize_with = "null_default")]
    ips: Vec<IpConfig>,
    #[serde(default, deserialize_with = "null_default")]
    routes: Vec<Route>,
    #[serde(default, deserialize_with = "null_default")]
    dns: Dns,
    #[serde(default)]
    ip4: Option<WireIp02>,
    #[serde(default)]
    ip6: Option<WireIp02>,
}

/// `ip4` / `ip6` of 0.1.0 and 0.2.0.
#[derive(Deserialize)]
struct WireIp02 {
    ip: IpCidr,
    #[serde(default)]
    gateway: Option<IpAddr>,
    #[serde(default, deserialize_with = "null_default")]
    routes: Vec<Route>,
}

impl WireIn {
    fn into_result(self, fallback: Option<Version>) -> Result<CniResult, Error> {
        let version = match (self.cni_version, fallback) {
            (Some(v), _) => Version::parse(&v)?,
            (None, Some(v)) => v,
            (None, None) => {
                return Err(Error::IncompatibleVersion {
                    version: String::new(),
                })
            }
        };
        let mut r = CniResult::new(version);
        r.dns = self.dns;
        if version < Version::V0_3_0 {
            for ip in [self.ip4, self.ip6].into_iter().flatten() {
                r.ips.push(IpConfig {
                    address: ip.ip,
                    gateway: ip.gateway,
                    interface: None,
                });
                r.routes.extend(ip.routes);
            }
        } else {
            r.interfaces = self.interfaces;
            r.ips = self.ips;
            r.routes = self.routes;
        }
        Ok(r.convert_to(version))
    }
}

impl<'de> Deserialize<'de> for CniResult {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<CniResult, D::Error> {
        WireIn::deserialize(d)?
            .into_result(None)
            .map_err(serde::de::Error::custom)
    }
}

#[derive(Serialize)]
struct OutIp<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<&'static str>,
    address: &'a IpCidr,
    #[serde(skip_serializing_if = "Option::is_none")]
    gateway: &'a Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    interface: &'a Option<u32>,
}

#[derive(Serialize)]
struct Out<'a> {
    #[serde(rename = "cniVersion")]
    cni_version: Version,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    interfaces: &'a [Interface],
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ips: Vec<OutIp<'a>>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    routes: &'a [Route],
    #[serde(skip_serializing_if = "Dns::is_empty")]
    dns: &'a Dns,
}

#[derive(Serialize)]
struct OutIp02<'a> {
    ip: &'a IpCidr,
    #[serde(skip_serializing_if = "Option::is_none")]
    gateway: &'a Option<IpAddr>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    routes: Vec<&'a Route>,
}

#[derive(Serialize)]
struct Out02<'a> {
    #[serde(rename = "cniVersion")]
    cni_version: Version,
    #[serde(skip_serializing_if = "Option::is_none")]
    ip4: Option<OutIp02<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ip6: Option<OutIp02<'a>>,
    #[serde(skip_serializing_if = "Dns::is_empty")]
    dns: &'a Dns,
}

impl Serialize for CniResult {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self.convert_to(self.cni_version);
        if r.cni_version < Version::V0_3_0 {
            let fam = |v4: bool| {
                r.ips
                    .iter()
                    .find(|i| i.address.is_ipv4() == v4)
                    .map(|i| OutIp02 {
                        ip: &i.address,
                        gateway: &i.gateway,
                        routes: r
                            .routes
                            .iter()
                            .filter(|rt| rt.dst.is_ipv4() == v4)
                            .collect(),
                    })
            };
            return Out02 {
                cni_version: r.cni_version,
                ip4: fam(true),
                ip6: fam(false),
                dns: &r.dns,
            }
            .serialize(s);
        }
        let with_version = r.cni_version < Version::V1_0_0;
        let ips = r
            .ips
            .iter()
            .map(|i| OutIp {
                version: with_version.then_some(if i.address.is_ipv4() { "4" } else { "6" }),
                address: &i.address,
                gateway: &i.gateway,
                interface: &i.interface,
            })
            .collect();
        Out {
            cni_version: r.cni_version,
            interfaces: &r.interfaces,
            ips,
            routes: &r.routes,
            dns: &r.dns,
        }
        .serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn full() -> CniResult {
        CniResult::from_slice(
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [{"name": "cni0", "mac": "00:11:22:33:44:55", "mtu": 1400},
                               {"name": "eth0", "mac": "99:88:77:66:55:44", "sandbox": "/var/run/netns/blue",
                                "socketPath": "/s", "pciID": "0000:00:01.0"}],
                "ips": [{"address": "10.1.0.5/16", "gateway": "10.1.0.1", "interface": 1},
                        {"address": "10.2.0.5/16", "interface": 1},
                        {"address": "fd00::5/64", "gateway": "fd00::1", "interface": 1}],
                "routes": [{"dst": "0.0.0.0/0", "mtu": 1300, "table": 100}, {"dst": "::/0", "gw": "fd00::1"},
                           {"dst": "192.168.0.0/16", "gw": "10.1.0.254", "scope": 253}],
                "dns": {"nameservers": ["10.1.0.1"], "search": ["svc"]}
            })
            .to_string()
            .as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn versions_shapes() {
        let r = full();
        let v040 = r.convert("0.4.0").unwrap().to_json_value();
        assert_eq!(
            v040["ips"][2],
            json!({"version": "6", "address": "fd00::5/64", "gateway": "fd00::1", "interface": 1})
        );
        assert_eq!(v040["routes"][0], json!({"dst": "0.0.0.0/0"}));
        assert_eq!(
            v040["interfaces"][0],
            json!({"name": "cni0", "mac": "00:11:22:33:44:55"})
        );
        let v100 = r.convert("1.0.0").unwrap().to_json_value();
        assert!(v100["ips"][0].get("version").is_none());
        assert_eq!(
            v100["routes"][0]["mtu"], 1300,
            "1.0.0 and 1.1.0 share a form"
        );
        let v020 = r.convert("0.2.0").unwrap().to_json_value();
        assert_eq!(
            v020,
            json!({"cniVersion": "0.2.0",
                "ip4": {"ip": "10.1.0.5/16", "gateway": "10.1.0.1",
                        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.1.0.254"}]},
                "ip6": {"ip": "fd00::5/64", "gateway": "fd00::1", "routes": [{"dst": "::/0", "gw": "fd00::1"}]},
                "dns": {"nameservers": ["10.1.0.1"], "search": ["svc"]}})
        );
        // Up again: nothing invented.
        let up = CniResult::from_slice(v020.to_string().as_bytes())
            .unwrap()
            .convert("1.0.0")
            .unwrap();
        assert_eq!(up.ips.len(), 2);
        assert!(up.interfaces.is_empty());
        let e = r.convert("1.2.0").unwrap_err();
        assert_eq!(e.code().0, 1);
    }

    #[test]
    fn bad_results() {
        let code = |s: &str| CniResult::from_slice(s.as_bytes()).unwrap_err().code().0;
        assert_eq!(code("nope"), 6);
        assert_eq!(code(r#"{"ips":[]}"#), 1, "no version");
        assert_eq!(code(r#"{"cniVersion":"0.9.0"}"#), 1);
        assert_eq!(
            code(r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.1"}]}"#),
            6
        );
        assert_eq!(
            code(r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.1/8","gateway":"x"}]}"#),
            6
        );
        // Go writes null for empty lists.
        let r = CniResult::from_slice(br#"{"cniVersion":"0.3.1","ips":null,"dns":{}}"#).unwrap();
        assert!(r.ips.is_empty());
        let p = CniResult::from_value_or_version(
            json!({"ips": [{"address": "10.0.0.1/8"}]}),
            Version::V1_0_0,
        )
        .unwrap();
        assert_eq!(p.cni_version, Version::V1_0_0);
    }

    fn cidr() -> impl Strategy<Value = IpCidr> {
        prop_oneof![
            (any::<u32>(), 0u8..=32).prop_map(|(a, p)| IpCidr {
                addr: IpAddr::V4(a.into()),
                prefix: p
            }),
            (any::<u128>(), 0u8..=128).prop_map(|(a, p)| IpCidr {
                addr: IpAddr::V6(a.into()),
                prefix: p
            }),
        ]
    }

    fn ip() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            any::<u32>().prop_map(|a| IpAddr::V4(a.into())),
            any::<u128>().prop_map(|a| IpAddr::V6(a.into()))
        ]
    }

    fn result() -> impl Strategy<Value = CniResult> {
        let iface = (
            "[a-z0-9]{1,15}",
            "[0-9a-f:]{0,17}",
            proptest::option::of(any::<u32>()),
            "[a-z/]{0,8}",
            "[a-z/]{0,4}",
            "[0-9:.]{0,4}",
        )
            .prop_map(|(name, mac, mtu, sandbox, socket_path, pci_id)| Interface {
                name,
                mac,
                mtu,
                sandbox,
                socket_path,
                pci_id,
            });
        let ipc = (
            cidr(),
            proptest::option::of(ip()),
            proptest::option::of(0u32..4),
        )
            .prop_map(|(address, gateway, interface)| IpConfig {
                address,
                gateway,
                interface,
            });
        let opt = || proptest::option::of(any::<u32>());
        let route = (
            cidr(),
            proptest::option::of(ip()),
            opt(),
            opt(),
            opt(),
            opt(),
            opt(),
        )
            .prop_map(|(dst, gw, mtu, advmss, priority, table, scope)| Route {
                dst,
                gw,
                mtu,
                advmss,
                priority,
                table,
                scope,
            });
        let dns = (
            proptest::collection::vec("[0-9.]{1,15}", 0..3),
            "[a-z.]{0,10}",
            proptest::collection::vec("[a-z]{1,5}", 0..2),
        )
            .prop_map(|(nameservers, domain, search)| Dns {
                nameservers,
                domain,
                search,
                options: vec![],
            });
        (
            proptest::collection::vec(iface, 0..3),
            proptest::collection::vec(ipc, 0..4),
            proptest::collection::vec(route, 0..4),
            dns,
        )
            .prop_map(|(interfaces, ips, routes, dns)| CniResult {
                cni_version: Version::LATEST,
                interfaces,
                ips,
                routes,
                dns,
            })
    }

    proptest! {
        #[test]
        fn convert_serialise_parse_round_trip(r in result(), v in 0usize..7) {
            let version = Version::ALL[v];
            let c = r.convert_to(version);
            prop_assert_eq!(c.convert_to(version), c.clone(), "conversion is idempotent");
            let back = CniResult::from_slice(c.to_json().as_bytes()).unwrap();
            prop_assert_eq!(&back, &c);
            if version >= Version::V1_0_0 {
                prop_assert_eq!(CniResult { cni_version: Version::LATEST, ..c }, r, "1.x keeps everything");
            }
        }
    }
}
