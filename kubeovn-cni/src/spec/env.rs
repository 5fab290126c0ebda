//! The runtime's environment: `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS`,
//! `CNI_PATH`.

use super::Version;
use crate::Error;

/// A CNI command (`CNI_COMMAND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// Attach a container.
    Add,
    /// Detach a container (idempotent).
    Del,
    /// Check an attachment (0.4.0+).
    Check,
    /// Report supported versions.
    Version,
    /// Release resources of attachments not in `cni.dev/valid-attachments` (1.1.0+).
    Gc,
    /// Report readiness (1.1.0+).
    Status,
}

impl Command {
    /// Parses `CNI_COMMAND` (exact, upper case).
    pub fn parse(s: &str) -> Option<Command> {
        Some(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            _ => return None,
        })
    }

    /// The command as the spec writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Gc => "GC",
            Command::Status => "STATUS",
        }
    }

    /// The first spec version that has this command.
    pub fn min_version(self) -> Version {
        match self {
            Command::Add | Command::Del | Command::Version => Version::V0_1_0,
            Command::Check => Version::V0_4_0,
            Command::Gc | Command::Status => Version::V1_1_0,
        }
    }

    /// [`Error::CommandNotInVersion`] (code 1) when a configuration of `version` cannot use this command.
    pub fn check_version(self, version: Version) -> Result<(), Error> {
        if version < self.min_version() {
            return Err(Error::CommandNotInVersion {
                command: self.as_str(),
                min: self.min_version().as_str(),
                version: version.as_str().to_owned(),
            });
        }
        Ok(())
    }

    /// Variables the command requires (besides `CNI_COMMAND`), as the spec lists them.
    pub fn required_vars(self) -> &'static [&'static str] {
        match self {
            Command::Add | Command::Check => {
                &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"]
            }
            Command::Del => &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"],
            Command::Gc | Command::Status => &["CNI_PATH"],
            Command::Version => &[],
        }
    }
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `CNI_*` environment of one plugin execution, validated for its command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Env {
    /// `CNI_COMMAND`.
    pub command: Command,
    /// `CNI_CONTAINERID` (set for ADD, DEL, CHECK).
    pub container_id: Option<String>,
    /// `CNI_NETNS` (set for ADD, CHECK; optional for DEL).
    pub netns: Option<String>,
    /// `CNI_IFNAME` (set for ADD, DEL, CHECK).
    pub ifname: Option<String>,
    /// `CNI_ARGS` as key/value pairs, in order.
    pub args: Vec<(String, String)>,
    /// `CNI_PATH`, split on `:`.
    pub path: Vec<String>,
}

impl Env {
    /// Reads and validates the environment through `get` (an empty value counts as unset): missing
    /// required variables and invalid values are code 4.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Env, Error> {
        let var = |k: &str| get(k).filter(|v| !v.is_empty());
        let Some(cmd) = var("CNI_COMMAND") else {
            return Err(Error::MissingEnv {
                command: String::new(),
                vars: vec!["CNI_COMMAND"],
            });
        };
        let command = Command::parse(&cmd).ok_or(Error::InvalidEnv {
            var: "CNI_COMMAND",
            value: cmd.clone(),
            reason: "unknown command",
        })?;
        let required = command.required_vars();
        let missing: Vec<&'static str> = required
            .iter()
            .copied()
            .filter(|k| var(k).is_none())
            .collect();
        if !missing.is_empty() {
            return Err(Error::MissingEnv {
                command: cmd,
                vars: missing,
            });
        }
        let container_id = var("CNI_CONTAINERID");
        if let Some(id) = container_id
            .as_deref()
            .filter(|_| required.contains(&"CNI_CONTAINERID"))
        {
            if !super::config::valid_name(id) {
                return Err(Error::InvalidEnv {
                    var: "CNI_CONTAINERID",
                    value: id.to_owned(),
                    reason: "must match [a-zA-Z0-9][a-zA-Z0-9_.-]*",
                });
            }
        }
        let ifname = var("CNI_IFNAME");
        if let Some(name) = ifname
            .as_deref()
            .filter(|_| required.contains(&"CNI_IFNAME"))
        {
            validate_ifname(name)?;
        }
        let args = match var("CNI_ARGS") {
            Some(a) => parse_cni_args(&a)?,
            None => Vec::new(),
        };
        let path = var("CNI_PATH")
            .map(|p| {
                p.split(':')
                    .filter(|d| !d.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        Ok(Env {
            command,
            container_id,
            netns: var("CNI_NETNS"),
            ifname,
            args,
            path,
        })
    }

    /// Reads the process environment (the only I/O of this module).
    pub fn from_process() -> Result<Env, Error> {
        Env::from_lookup(|k| std::env::var(k).ok())
    }

    /// The value of `key` in `CNI_ARGS` (the last one when repeated).
    pub fn arg(&self, key: &str) -> Option<&str> {
        self.args
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// `(CNI_CONTAINERID, CNI_IFNAME)`, the attachment's identity, when both are set.
    pub fn attachment(&self) -> Option<(&str, &str)> {
        Some((self.container_id.as_deref()?, self.ifname.as_deref()?))
    }
}

fn validate_ifname(name: &str) -> Result<(), Error> {
    let reason = if name.len() > 15 {
        "longer than 15 bytes"
    } else if name == "." || name == ".." {
        "must not be . or .."
    } else if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        "must not contain /, : or whitespace"
    } else {
        return Ok(());
    };
    Err(Error::InvalidEnv {
        var: "CNI_IFNAME",
        value: name.to_owned(),
        reason,
    })
}

/// Parses `CNI_ARGS` (`"K1=V1;K2=V2"`) into pairs; empty segments are skipped, a segment without `=` or
/// with an empty key is code 4.
pub fn parse_cni_args(s: &str) -> Result<Vec<(String, String)>, Error> {
    s.split(';')
        .filter(|p| !p.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => Err(Error::InvalidEnv {
                var: "CNI_ARGS",
                value: s.to_owned(),
                reason: "expected KEY=VALUE pairs",
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> Result<Env, Error> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Env::from_lookup(|k| m.get(k).cloned())
    }

    const FULL: &[(&str, &str)] = &[
        ("CNI_CONTAINERID", "abc-1"),
        ("CNI_NETNS", "/var/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin::/usr/lib/cni"),
        ("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=p;IP=10.0.0.5"),
    ];

    #[test]
    fn add_full() {
        let mut v = FULL.to_vec();
        v.push(("CNI_COMMAND", "ADD"));
        let e = env(&v).unwrap();
        assert_eq!(e.command, Command::Add);
        assert_eq!(e.attachment(), Some(("abc-1", "eth0")));
        assert_eq!(e.path, ["/opt/cni/bin", "/usr/lib/cni"]);
        assert_eq!(e.arg("IP"), Some("10.0.0.5"));
        assert_eq!(e.arg("nope"), None);
    }

    #[test]
    fn required_per_command() {
        type Case = (
            &'static str,
            &'static [&'static str],
            Option<&'static [&'static str]>,
        );
        let cases: &[Case] = &[
            (
                "ADD",
                &["CNI_PATH"],
                Some(&["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"]),
            ),
            (
                "CHECK",
                &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"],
                Some(&["CNI_NETNS"]),
            ),
            ("DEL", &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"], None),
            (
                "DEL",
                &["CNI_PATH"],
                Some(&["CNI_CONTAINERID", "CNI_IFNAME"]),
            ),
            ("GC", &["CNI_PATH"], None),
            ("STATUS", &[], Some(&["CNI_PATH"])),
            ("VERSION", &[], None),
        ];
        for (cmd, present, missing) in cases {
            let mut v: Vec<(&str, &str)> = FULL
                .iter()
                .copied()
                .filter(|(k, _)| present.contains(k) || *k == "CNI_ARGS")
                .collect();
            v.push(("CNI_COMMAND", cmd));
            match (env(&v), missing) {
                (Ok(e), None) => assert_eq!(e.command.as_str(), *cmd),
                (Err(Error::MissingEnv { vars, .. }), Some(m)) => assert_eq!(&vars, m, "{cmd}"),
                (other, m) => panic!("{cmd}: {other:?}, expected missing {m:?}"),
            }
        }
        let e = env(&[]).unwrap_err();
        assert_eq!(e.code().0, 4);
    }

    #[test]
    fn invalid_values() {
        let with = |k: &str, val: &str| {
            let mut v: Vec<(&str, &str)> =
                FULL.iter().copied().filter(|(kk, _)| *kk != k).collect();
            v.push((k, val));
            if k != "CNI_COMMAND" {
                v.push(("CNI_COMMAND", "ADD"));
            }
            env(&v)
        };
        for (k, val) in [
            ("CNI_COMMAND", "add"),
            ("CNI_CONTAINERID", "-bad"),
            ("CNI_CONTAINERID", "a/b"),
            ("CNI_IFNAME", "a-very-long-name0"),
            ("CNI_IFNAME", "a:b"),
            ("CNI_IFNAME", ".."),
            ("CNI_ARGS", "novalue"),
            ("CNI_ARGS", "=x"),
        ] {
            let e = with(k, val).unwrap_err();
            assert_eq!(e.code().0, 4, "{k}={val}: {e}");
        }
        assert_eq!(
            parse_cni_args("A=1;;B=x=y;").unwrap(),
            [("A".into(), "1".into()), ("B".into(), "x=y".into())]
        );
    }

    #[test]
    fn command_versions() {
        assert!(Command::Gc.check_version(Version::V1_0_0).is_err());
        assert!(Command::Gc.check_version(Version::V1_1_0).is_ok());
        assert_eq!(
            Command::Check
                .check_version(Version::V0_3_1)
                .unwrap_err()
                .code()
                .0,
            1
        );
        assert!(Command::Add.check_version(Version::V0_1_0).is_ok());
    }
}
