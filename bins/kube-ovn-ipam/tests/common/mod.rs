//! Runs the built plugin as a runtime does: CNI_* environment, configuration on stdin.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

/// The plugin binary under test.
pub const PLUGIN: &str = env!("CARGO_BIN_EXE_kube-ovn-ipam");

/// What one execution returned.
#[derive(Debug)]
pub struct Out {
    /// Exit status code.
    pub code: i32,
    /// Stdout parsed as JSON (`Null` when empty).
    pub json: Value,
    /// Stdout.
    pub stdout: String,
    /// Stderr.
    pub stderr: String,
}

impl Out {
    /// Asserts success and returns the JSON.
    pub fn ok(self) -> Value {
        assert_eq!(self.code, 0, "expected success: {self:?}");
        self.json
    }

    /// Asserts a CNI error with `code` and returns it.
    pub fn err(self, code: u64) -> Value {
        assert_ne!(self.code, 0, "expected failure: {self:?}");
        assert_eq!(self.json["code"], code, "{self:?}");
        for k in ["cniVersion", "msg", "details"] {
            assert!(self.json.get(k).is_some(), "error JSON lacks {k}: {self:?}");
        }
        self.json
    }

    /// The addresses of an ADD result.
    pub fn addresses(v: &Value) -> Vec<String> {
        v["ips"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|i| i["address"].as_str().unwrap_or("").to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Runs `program` with `env` and `stdin`.
pub fn exec(program: &[&str], env: &[(&str, &str)], stdin: &[u8]) -> Out {
    let mut cmd = Command::new(program[0]);
    cmd.args(&program[1..])
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn plugin");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write stdin");
    let o = child.wait_with_output().expect("wait plugin");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let json = if stdout.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&stdout).unwrap_or(Value::Null)
    };
    Out {
        code: o.status.code().unwrap_or(-1),
        json,
        stdout,
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// A network whose state lives in its own temporary directory.
pub struct Net {
    /// The network configuration (the `ipam` section gets `dataDir`).
    pub conf: Value,
    dir: tempfile::TempDir,
}

impl Net {
    /// A network `name` with this `ipam` section (without `type` and `dataDir`), `cniVersion` 1.1.0.
    pub fn new(name: &str, mut ipam: Value) -> Net {
        let dir = tempfile::tempdir().expect("tempdir");
        ipam["type"] = json!("kube-ovn-ipam");
        ipam["dataDir"] = json!(dir.path());
        let conf = json!({"cniVersion": "1.1.0", "name": name, "type": "bridge", "ipam": ipam});
        Net { conf, dir }
    }

    /// The state directory of the network.
    pub fn state_dir(&self) -> PathBuf {
        self.dir
            .path()
            .join(self.conf["name"].as_str().unwrap_or(""))
    }

    /// Runs a command with the standard environment for `container` and `eth0`, plus `extra`.
    pub fn run_with(
        &self,
        command: &str,
        container: &str,
        conf: &Value,
        extra: &[(&str, &str)],
    ) -> Out {
        let mut env = vec![
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", container),
            ("CNI_NETNS", "/var/run/netns/nothing"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/usr/lib/cni"),
        ];
        for (k, v) in extra {
            env.retain(|(ek, _)| ek != k);
            env.push((k, v));
        }
        exec(&[PLUGIN], &env, conf.to_string().as_bytes())
    }

    /// Runs a command with the network's configuration.
    pub fn run(&self, command: &str, container: &str) -> Out {
        self.run_with(command, container, &self.conf, &[])
    }

    /// The network's configuration with `key` set to `value`.
    pub fn with(&self, key: &str, value: Value) -> Value {
        let mut c = self.conf.clone();
        c[key] = value;
        c
    }

    /// The bytes of every state file, to compare before and after a failed call.
    pub fn snapshot_files(&self) -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(self.state_dir())
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| {
                        (
                            e.file_name().to_string_lossy().into_owned(),
                            std::fs::read(e.path()).unwrap_or_default(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// The temporary directory.
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }
}
