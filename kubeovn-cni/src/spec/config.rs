//! Network configurations: a single plugin's configuration and configuration lists.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{CniResult, Version};
use crate::Error;

/// DNS settings, in configurations and results.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    /// Name servers, by priority.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_default"
    )]
    pub nameservers: Vec<String>,
    /// The local domain.
    #[serde(
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub domain: String,
    /// Search domains, by priority.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_default"
    )]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_default"
    )]
    pub options: Vec<String>,
}

impl Dns {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_empty()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

/// Reads `null` as the type's default (Go writes `null` for empty lists).
pub(crate) fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// One still-valid attachment, in `cni.dev/valid-attachments` (`GC`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Attachment {
    /// `CNI_CONTAINERID` of the attachment's `ADD`.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// `CNI_IFNAME` of the attachment's `ADD`.
    pub ifname: String,
}

/// `runtimeConfig`: the capability arguments the runtime passes (`ips`, `mac`, and any other).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RuntimeConfig {
    /// Requested static addresses (`ips` capability), with or without a prefix length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ips: Option<Vec<String>>,
    /// Requested MAC address (`mac` capability).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Every other capability argument (`portMappings`, `bandwidth`, ...).
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// The `cni` part of `args` (the convention for arguments in configurations).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CniArgs {
    /// Requested static addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ips: Option<Vec<String>>,
    /// Every other argument.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// `args`: arguments by convention, `{"cni": {...}}` plus anything else.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Args {
    /// The `cni` section.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni: Option<CniArgs>,
    /// Every other section.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// One plugin's configuration: what a plugin reads on stdin, or one entry of a list's `plugins`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NetConf {
    /// The spec version (empty in a list entry; the runtime fills it in).
    #[serde(
        rename = "cniVersion",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub cni_version: String,
    /// The network name (empty in a list entry).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The plugin binary's name.
    #[serde(rename = "type")]
    pub plugin_type: String,
    /// Capabilities the plugin wants runtime arguments for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<BTreeMap<String, bool>>,
    /// The IPAM section, raw: the IPAM plugin parses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam: Option<Value>,
    /// DNS settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Dns>,
    /// Capability arguments from the runtime.
    #[serde(
        rename = "runtimeConfig",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub runtime_config: Option<RuntimeConfig>,
    /// Conventional arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Args>,
    /// The previous plugin's result (chaining, `DEL`, `CHECK`), raw: its version is `cni_version`.
    #[serde(
        rename = "prevResult",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub prev_result: Option<Value>,
    /// `GC` only: the attachments that are still valid.
    #[serde(
        rename = "cni.dev/valid-attachments",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub valid_attachments: Option<Vec<Attachment>>,
    /// Plugin-specific fields, kept unchanged.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl NetConf {
    /// Parses a plugin's configuration from its stdin: JSON errors are code 6, an unknown `cniVersion`
    /// code 1, a missing `type` or invalid `name` code 7.
    pub fn from_slice(bytes: &[u8]) -> Result<NetConf, Error> {
        let conf: NetConf = serde_json::from_slice(bytes).map_err(|source| Error::Decode {
            what: "network configuration",
            source,
        })?;
        conf.validate()?;
        Ok(conf)
    }

    /// Checks the version, `type` and (when set) `name`.
    pub fn validate(&self) -> Result<(), Error> {
        Version::of_config(&self.cni_version)?;
        validate_type(&self.plugin_type)?;
        if !self.name.is_empty() {
            validate_name(&self.name)?;
        }
        Ok(())
    }

    /// The configuration's version (0.1.0 when it gives none; code 1 when unknown).
    pub fn version(&self) -> Result<Version, Error> {
        Version::of_config(&self.cni_version)
    }

    /// The previous result, parsed (its `cniVersion` when it has one, else the configuration's).
    pub fn prev_result(&self) -> Result<Option<CniResult>, Error> {
        match &self.prev_result {
            None | Some(Value::Null) => Ok(None),
            Some(v) => CniResult::from_value_or_version(v.clone(), self.version()?).map(Some),
        }
    }

    /// Static addresses requested through `runtimeConfig.ips` and `args.cni.ips`, in that order.
    pub fn requested_ips(&self) -> impl Iterator<Item = &str> {
        let rc = self
            .runtime_config
            .as_ref()
            .and_then(|r| r.ips.as_deref())
            .unwrap_or_default();
        let args = self
            .args
            .as_ref()
            .and_then(|a| a.cni.as_ref())
            .and_then(|c| c.ips.as_deref())
            .unwrap_or_default();
        rc.iter().chain(args).map(String::as_str)
    }

    /// The configuration as JSON.
    pub fn to_json(&self) -> String {
        // Strings, maps and JSON values always serialise.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A network configuration list: several plugins run in order for one network.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NetConfList {
    /// The spec version of the list and its plugins.
    #[serde(
        rename = "cniVersion",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub cni_version: String,
    /// 1.1.0: every version the list supports; the runtime picks the newest it knows.
    #[serde(
        rename = "cniVersions",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cni_versions: Option<Vec<String>>,
    /// The network name.
    pub name: String,
    /// Runtimes must not call `CHECK`.
    #[serde(rename = "disableCheck", default, skip_serializing_if = "is_false")]
    pub disable_check: bool,
    /// Runtimes must not call `GC`.
    #[serde(rename = "disableGC", default, skip_serializing_if = "is_false")]
    pub disable_gc: bool,
    /// Ignore plugin configurations from other sources.
    #[serde(
        rename = "loadOnlyInlinedPlugins",
        default,
        skip_serializing_if = "is_false"
    )]
    pub load_only_inlined_plugins: bool,
    /// The plugins, in order.
    #[serde(default)]
    pub plugins: Vec<NetConf>,
    /// Fields this crate does not know, kept unchanged.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl NetConfList {
    /// Parses a configuration list (code 6 for bad JSON, 1 for an unknown version, 7 for invalid content).
    pub fn from_slice(bytes: &[u8]) -> Result<NetConfList, Error> {
        let list: NetConfList = serde_json::from_slice(bytes).map_err(|source| Error::Decode {
            what: "network configuration list",
            source,
        })?;
        list.validate()?;
        Ok(list)
    }

    /// Checks the version(s), the name and every plugin.
    pub fn validate(&self) -> Result<(), Error> {
        self.version()?;
        validate_name(&self.name)?;
        for p in &self.plugins {
            validate_type(&p.plugin_type)?;
        }
        Ok(())
    }

    /// The version to run the list with: the newest known of `cniVersions`, else `cniVersion`.
    pub fn version(&self) -> Result<Version, Error> {
        match &self.cni_versions {
            Some(vs) if !vs.is_empty() => Version::negotiate(vs.iter().map(String::as_str))
                .ok_or_else(|| Error::IncompatibleVersion {
                    version: vs.join(","),
                }),
            _ => Version::of_config(&self.cni_version),
        }
    }

    /// The configuration the runtime gives plugin `index`: the list's name and negotiated version filled in,
    /// `runtimeConfig` restricted to the plugin's capabilities, and the previous result (if any).
    pub fn plugin_conf(
        &self,
        index: usize,
        runtime_args: &Map<String, Value>,
        prev_result: Option<&CniResult>,
    ) -> Result<Option<NetConf>, Error> {
        let Some(p) = self.plugins.get(index) else {
            return Ok(None);
        };
        let version = self.version()?;
        let mut conf = p.clone();
        conf.cni_version = version.as_str().to_owned();
        conf.name.clone_from(&self.name);
        if let Some(caps) = &p.capabilities {
            let wanted: Map<String, Value> = runtime_args
                .iter()
                .filter(|(k, _)| caps.get(k.as_str()).copied().unwrap_or(false))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !wanted.is_empty() {
                let rc = serde_json::from_value(Value::Object(wanted)).map_err(|source| {
                    Error::Decode {
                        what: "runtimeConfig",
                        source,
                    }
                })?;
                conf.runtime_config = Some(rc);
            }
        }
        if let Some(r) = prev_result {
            conf.prev_result = Some(r.convert_to(version).to_json_value());
        }
        Ok(Some(conf))
    }
}

/// Either kind of network configuration, told apart by a `plugins` key.
#[derive(Debug, Clone, PartialEq)]
pub enum NetworkConfig {
    /// A single plugin's configuration.
    Single(Box<NetConf>),
    /// A configuration list.
    List(NetConfList),
}

impl NetworkConfig {
    /// Parses either kind; a top-level `plugins` key makes it a list.
    pub fn from_slice(bytes: &[u8]) -> Result<NetworkConfig, Error> {
        let v: Value = serde_json::from_slice(bytes).map_err(|source| Error::Decode {
            what: "network configuration",
            source,
        })?;
        if v.get("plugins").is_some() {
            let l: NetConfList = serde_json::from_value(v).map_err(|source| Error::Decode {
                what: "network configuration list",
                source,
            })?;
            l.validate()?;
            Ok(NetworkConfig::List(l))
        } else {
            let c: NetConf = serde_json::from_value(v).map_err(|source| Error::Decode {
                what: "network configuration",
                source,
            })?;
            c.validate()?;
            Ok(NetworkConfig::Single(Box::new(c)))
        }
    }

    /// The configuration as JSON.
    pub fn to_json(&self) -> String {
        match self {
            NetworkConfig::Single(c) => c.to_json(),
            NetworkConfig::List(l) => serde_json::to_string(l).unwrap_or_default(),
        }
    }
}

/// Network names: `[a-zA-Z0-9][a-zA-Z0-9_.-]*` (also used as a directory name).
fn validate_name(name: &str) -> Result<(), Error> {
    if !valid_name(name) {
        return Err(Error::InvalidConfig {
            reason: format!("invalid network name {name:?}"),
        });
    }
    Ok(())
}

pub(crate) fn valid_name(name: &str) -> bool {
    let mut b = name.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphanumeric())
        && b.all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

fn validate_type(t: &str) -> Result<(), Error> {
    if t.is_empty() || t.contains(['/', '\\']) || t == "." || t == ".." {
        return Err(Error::InvalidConfig {
            reason: format!("invalid plugin type {t:?}"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BRIDGE: &str = r#"{
        "cniVersion": "1.1.0", "name": "dbnet", "type": "bridge", "bridge": "cni0",
        "keyA": ["some more", "plugin specific", "configuration"],
        "ipam": {"type": "host-local", "subnet": "10.1.0.0/16", "gateway": "10.1.0.1"},
        "dns": {"nameservers": ["10.1.0.1"]},
        "runtimeConfig": {"ips": ["10.1.0.9/16"], "portMappings": [{"hostPort": 80}]},
        "args": {"cni": {"ips": ["10.1.0.10"], "x": 1}, "other": true},
        "prevResult": {"cniVersion": "1.1.0", "ips": [{"address": "10.1.0.5/16"}]},
        "cni.dev/valid-attachments": [{"containerID": "abc", "ifname": "eth0"}]
    }"#;

    #[test]
    fn single_conf_keeps_everything() {
        let c = NetConf::from_slice(BRIDGE.as_bytes()).unwrap();
        assert_eq!(c.plugin_type, "bridge");
        assert_eq!(c.extra["bridge"], "cni0");
        assert_eq!(c.ipam.as_ref().unwrap()["gateway"], "10.1.0.1");
        assert_eq!(
            c.requested_ips().collect::<Vec<_>>(),
            ["10.1.0.9/16", "10.1.0.10"]
        );
        assert_eq!(
            c.runtime_config.as_ref().unwrap().other["portMappings"][0]["hostPort"],
            80
        );
        assert_eq!(c.args.as_ref().unwrap().other["other"], true);
        assert_eq!(c.valid_attachments.as_ref().unwrap()[0].container_id, "abc");
        let prev = c.prev_result().unwrap().unwrap();
        assert_eq!(prev.ips[0].address.to_string(), "10.1.0.5/16");
        let again = NetConf::from_slice(c.to_json().as_bytes()).unwrap();
        assert_eq!(again, c);
        let v1: Value = serde_json::from_str(BRIDGE).unwrap();
        let v2: Value = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(v1, v2, "nothing lost, nothing added");
    }

    #[test]
    fn bad_configs_give_codes() {
        let code = |s: &str| NetConf::from_slice(s.as_bytes()).unwrap_err().code().0;
        assert_eq!(code("{"), 6);
        assert_eq!(code("[]"), 6);
        assert_eq!(
            code(r#"{"cniVersion":"1.0.0","name":"n"}"#),
            6,
            "type is required"
        );
        assert_eq!(code(r#"{"cniVersion":"7.0.0","name":"n","type":"x"}"#), 1);
        assert_eq!(
            code(r#"{"cniVersion":"1.0.0","name":"n","type":"../x"}"#),
            7
        );
        assert_eq!(code(r#"{"cniVersion":"1.0.0","name":"a b","type":"x"}"#), 7);
        assert_eq!(
            code(r#"{"cniVersion":"1.0.0","name":"n","type":"x","dns":{"nameservers":1}}"#),
            6
        );
    }

    #[test]
    fn list_and_plugin_conf() {
        let list = r#"{"cniVersion":"1.0.0","cniVersions":["1.0.0","1.1.0","5.0.0"],"name":"net","disableGC":true,
            "plugins":[{"type":"bridge","ipam":{"type":"kube-ovn-ipam"}},
                       {"type":"portmap","capabilities":{"portMappings":true}}]}"#;
        let l = match NetworkConfig::from_slice(list.as_bytes()).unwrap() {
            NetworkConfig::List(l) => l,
            other => panic!("{other:?}"),
        };
        assert_eq!(l.version().unwrap(), Version::V1_1_0);
        assert!(l.disable_gc && !l.disable_check);
        let mut rt = Map::new();
        rt.insert(
            "portMappings".into(),
            serde_json::json!([{"hostPort": 8080}]),
        );
        rt.insert("ips".into(), serde_json::json!(["10.0.0.1"]));
        let prev =
            CniResult::from_slice(br#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/8"}]}"#)
                .unwrap();
        let p0 = l.plugin_conf(0, &rt, None).unwrap().unwrap();
        assert_eq!(
            (p0.name.as_str(), p0.cni_version.as_str()),
            ("net", "1.1.0")
        );
        assert!(
            p0.runtime_config.is_none(),
            "bridge asked for no capabilities"
        );
        let p1 = l.plugin_conf(1, &rt, Some(&prev)).unwrap().unwrap();
        let rc = p1.runtime_config.unwrap();
        assert!(rc.ips.is_none());
        assert_eq!(rc.other["portMappings"][0]["hostPort"], 8080);
        assert_eq!(p1.prev_result.unwrap()["cniVersion"], "1.1.0");
        assert!(l.plugin_conf(2, &rt, None).unwrap().is_none());
        let again = NetConfList::from_slice(serde_json::to_string(&l).unwrap().as_bytes()).unwrap();
        assert_eq!(again, l);
        assert!(matches!(
            NetworkConfig::from_slice(br#"{"cniVersion":"1.0.0","name":"n","type":"x"}"#).unwrap(),
            NetworkConfig::Single(_)
        ));
        assert_eq!(
            NetConfList::from_slice(br#"{"name":"n","cniVersions":["9.0.0"]}"#)
                .unwrap_err()
                .code()
                .0,
            1
        );
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            "[a-z0-9 ./\\\"]{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z]{1,4}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    use proptest::strategy::Strategy as _;

    proptest::proptest! {
        #[test]
        fn conf_round_trip(
            extra in proptest::collection::btree_map("x[a-z]{0,6}", json_value(), 0..4),
            ipam in proptest::option::of(json_value().prop_filter("null reads as absent", |v| !v.is_null())),
            ips in proptest::option::of(proptest::collection::vec("[0-9./]{1,12}", 0..3)),
            v in 0usize..7,
        ) {
            let conf = NetConf {
                cni_version: Version::ALL[v].as_str().to_owned(),
                name: "net-1".into(),
                plugin_type: "kube-ovn-ipam".into(),
                ipam,
                runtime_config: ips.clone().map(|ips| RuntimeConfig { ips: Some(ips), ..Default::default() }),
                args: ips.map(|ips| Args { cni: Some(CniArgs { ips: Some(ips), other: Map::new() }), other: Map::new() }),
                extra: extra.into_iter().collect(),
                ..Default::default()
            };
            let back = NetConf::from_slice(conf.to_json().as_bytes()).unwrap();
            proptest::prop_assert_eq!(back, conf);
        }
    }
}
