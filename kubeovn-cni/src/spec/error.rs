//! The spec's error object and error codes.

use serde::{Deserialize, Serialize};

/// A CNI error code: 0-99 are the spec's, 100 and up are plugin-specific.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ErrorCode(pub u32);

impl ErrorCode {
    /// 1: incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: ErrorCode = ErrorCode(1);
    /// 2: unsupported field in the network configuration.
    pub const UNSUPPORTED_FIELD: ErrorCode = ErrorCode(2);
    /// 3: container unknown or does not exist.
    pub const UNKNOWN_CONTAINER: ErrorCode = ErrorCode(3);
    /// 4: invalid necessary environment variables.
    pub const INVALID_ENVIRONMENT: ErrorCode = ErrorCode(4);
    /// 5: I/O failure.
    pub const IO_FAILURE: ErrorCode = ErrorCode(5);
    /// 6: failed to decode content.
    pub const DECODING_FAILURE: ErrorCode = ErrorCode(6);
    /// 7: invalid network configuration.
    pub const INVALID_NETWORK_CONFIG: ErrorCode = ErrorCode(7);
    /// 11: try again later (a transient condition).
    pub const TRY_AGAIN_LATER: ErrorCode = ErrorCode(11);
    /// 50 (`STATUS`): the plugin cannot service `ADD` requests.
    pub const NOT_AVAILABLE: ErrorCode = ErrorCode(50);
    /// 51 (`STATUS`): not available, and existing containers may have limited connectivity.
    pub const LIMITED_CONNECTIVITY: ErrorCode = ErrorCode(51);
    /// The first plugin-specific code.
    pub const FIRST_PLUGIN_CODE: ErrorCode = ErrorCode(100);

    /// The spec's description of a well-known code; `None` for plugin-specific and unassigned codes.
    pub fn description(self) -> Option<&'static str> {
        Some(match self.0 {
            1 => "Incompatible CNI version",
            2 => "Unsupported field in network configuration",
            3 => "Container unknown or does not exist",
            4 => "Invalid necessary environment variables",
            5 => "I/O failure",
            6 => "Failed to decode content",
            7 => "Invalid network config",
            11 => "Try again later",
            50 => "The plugin is not available",
            51 => {
                "The plugin is not available, and existing containers may have limited connectivity"
            }
            _ => return None,
        })
    }

    /// Whether the code is plugin-specific (100 and up).
    pub fn is_plugin_specific(self) -> bool {
        self.0 >= 100
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The spec's error object: `{"cniVersion", "code", "msg", "details"}`, printed on stdout with a non-zero exit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("CNI error {code}: {msg}{}", if details.is_empty() { String::new() } else { format!(" ({details})") })]
pub struct CniError {
    /// The protocol version in use.
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    /// The error code.
    pub code: ErrorCode,
    /// A short message.
    #[serde(default)]
    pub msg: String,
    /// A longer description.
    #[serde(default)]
    pub details: String,
}

impl CniError {
    /// An error with the latest spec version; set the runtime's with [`CniError::with_version`].
    pub fn new(code: ErrorCode, msg: impl Into<String>, details: impl Into<String>) -> CniError {
        CniError {
            cni_version: super::Version::LATEST.as_str().to_owned(),
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }

    /// The same error for a runtime speaking `cni_version` (an empty one keeps the current version).
    pub fn with_version(mut self, cni_version: &str) -> CniError {
        if !cni_version.is_empty() {
            cni_version.clone_into(&mut self.cni_version);
        }
        self
    }

    /// The error as the JSON a plugin prints.
    pub fn to_json(&self) -> String {
        // A struct of strings and an integer always serialises.
        serde_json::to_string(self)
            .unwrap_or_else(|_| String::from(r#"{"code":999,"msg":"error"}"#))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[test]
    fn error_json_shape() {
        let e = CniError::new(
            ErrorCode::INVALID_NETWORK_CONFIG,
            "Invalid Configuration",
            "too small",
        )
        .with_version("1.0.0");
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"cniVersion":"1.0.0","code":7,"msg":"Invalid Configuration","details":"too small"})
        );
        let back: CniError = serde_json::from_value(v).unwrap();
        assert_eq!(back, e);
        assert_eq!(ErrorCode(7).description(), Some("Invalid network config"));
        assert!(ErrorCode(100).is_plugin_specific());
    }

    #[test]
    fn crate_errors_map_to_codes() {
        let decode = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let cases: Vec<(Error, u32)> = vec![
            (
                Error::IncompatibleVersion {
                    version: "9".into(),
                },
                1,
            ),
            (
                Error::UnsupportedField {
                    field: "x".into(),
                    value: "1".into(),
                },
                2,
            ),
            (
                Error::MissingEnv {
                    command: "ADD".into(),
                    vars: vec!["CNI_NETNS"],
                },
                4,
            ),
            (
                Error::Decode {
                    what: "network configuration",
                    source: decode,
                },
                6,
            ),
            (
                Error::InvalidConfig {
                    reason: "no".into(),
                },
                7,
            ),
            (Error::Plugin(CniError::new(ErrorCode(123), "m", "d")), 123),
        ];
        for (e, code) in cases {
            let c = e.to_cni("0.4.0");
            assert_eq!(c.code.0, code, "{e}");
            assert_eq!(c.cni_version, "0.4.0");
            assert!(!c.msg.is_empty());
        }
    }
}
