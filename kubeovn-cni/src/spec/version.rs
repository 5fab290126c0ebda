//! Spec versions and the `VERSION` answer.

use serde::{Deserialize, Serialize};

use crate::Error;

/// Every spec version this crate reads and writes, oldest first.
pub const SUPPORTED_VERSIONS: &[&str] = &[
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// A CNI specification version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    /// 0.1.0: `ip4`/`ip6` results.
    V0_1_0,
    /// 0.2.0: adds the `VERSION` command.
    V0_2_0,
    /// 0.3.0: rich results (`interfaces`, `ips` with `version`), chaining.
    V0_3_0,
    /// 0.3.1: typo fixes.
    V0_3_1,
    /// 0.4.0: adds `CHECK`.
    V0_4_0,
    /// 1.0.0: `ips` lose `version`.
    V1_0_0,
    /// 1.1.0: adds `GC`, `STATUS`, route and interface attributes.
    V1_1_0,
}

impl Version {
    /// The newest version.
    pub const LATEST: Version = Version::V1_1_0;

    /// All versions, oldest first (same order as [`SUPPORTED_VERSIONS`]).
    pub const ALL: [Version; 7] = [
        Version::V0_1_0,
        Version::V0_2_0,
        Version::V0_3_0,
        Version::V0_3_1,
        Version::V0_4_0,
        Version::V1_0_0,
        Version::V1_1_0,
    ];

    /// Parses `"1.0.0"` and friends; anything else is [`Error::IncompatibleVersion`] (code 1).
    pub fn parse(s: &str) -> Result<Version, Error> {
        Ok(match s {
            "0.1.0" => Version::V0_1_0,
            "0.2.0" => Version::V0_2_0,
            "0.3.0" => Version::V0_3_0,
            "0.3.1" => Version::V0_3_1,
            "0.4.0" => Version::V0_4_0,
            "1.0.0" => Version::V1_0_0,
            "1.1.0" => Version::V1_1_0,
            _ => {
                return Err(Error::IncompatibleVersion {
                    version: s.to_owned(),
                })
            }
        })
    }

    /// The version of a configuration: a missing (empty) `cniVersion` means 0.1.0, as libcni reads it.
    pub fn of_config(s: &str) -> Result<Version, Error> {
        if s.is_empty() {
            Ok(Version::V0_1_0)
        } else {
            Version::parse(s)
        }
    }

    /// The version as the spec writes it.
    pub fn as_str(self) -> &'static str {
        SUPPORTED_VERSIONS[self as usize]
    }

    /// The newest version in `candidates` (a conflist's `cniVersions`) that this crate supports.
    pub fn negotiate<'a>(candidates: impl IntoIterator<Item = &'a str>) -> Option<Version> {
        candidates
            .into_iter()
            .filter_map(|c| Version::parse(c).ok())
            .max()
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Version {
    type Err = Error;
    fn from_str(s: &str) -> Result<Version, Error> {
        Version::parse(s)
    }
}

impl Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Version, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Version::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// The answer to `VERSION`: `{"cniVersion": ..., "supportedVersions": [...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    /// The version given on input (the latest when none was).
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    /// The versions the plugin supports.
    #[serde(rename = "supportedVersions")]
    pub supported_versions: Vec<String>,
}

impl VersionInfo {
    /// The answer of a plugin supporting every version of this crate, to a request in `cni_version`
    /// (empty: the latest).
    pub fn all(cni_version: &str) -> VersionInfo {
        let v = if cni_version.is_empty() {
            Version::LATEST.as_str()
        } else {
            cni_version
        };
        VersionInfo {
            cni_version: v.to_owned(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// Whether the plugin claims to support `version`.
    pub fn supports(&self, version: &str) -> bool {
        self.supported_versions.iter().any(|v| v == version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_order() {
        for (i, s) in SUPPORTED_VERSIONS.iter().enumerate() {
            let v = Version::parse(s).unwrap();
            assert_eq!(v, Version::ALL[i]);
            assert_eq!(v.as_str(), *s);
        }
        assert!(Version::V0_4_0 < Version::V1_0_0);
        let e = Version::parse("2.0.0").unwrap_err();
        assert_eq!(e.code().0, 1);
        assert_eq!(Version::of_config("").unwrap(), Version::V0_1_0);
    }

    #[test]
    fn negotiate_picks_newest_known() {
        assert_eq!(
            Version::negotiate(["0.4.0", "1.0.0", "9.9.9"]),
            Some(Version::V1_0_0)
        );
        assert_eq!(Version::negotiate(["9.9.9"]), None);
    }

    #[test]
    fn version_info_json() {
        let v = VersionInfo::all("1.0.0");
        let j = serde_json::to_string(&v).unwrap();
        assert!(
            j.starts_with(r#"{"cniVersion":"1.0.0","supportedVersions":["0.1.0""#),
            "{j}"
        );
        assert!(v.supports("1.1.0"));
        assert_eq!(VersionInfo::all("").cni_version, "1.1.0");
    }
}
