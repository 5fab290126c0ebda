//! Runs a CNI network configuration list the way a container runtime (libcni) does: each plugin of the
//! list is exec'd from the plugin directory with the `CNI_*` environment and its own configuration on stdin
//! (the list's `name` and `cniVersion` injected, the previous plugin's result as `prevResult`); `DEL` runs
//! the plugins in reverse order.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use kubeovn_sandbox_state::records::PodRecord;
use kubeovn_sandbox_state::SandboxError;

/// One attachment: the pod, its sandbox (container id, netns) and the interface.
#[derive(Debug, Clone)]
pub struct Attachment {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's uid.
    pub uid: String,
    /// The sandbox's container id.
    pub container_id: String,
    /// The network namespace's path.
    pub netns: PathBuf,
    /// The interface inside it.
    pub ifname: String,
}

impl Attachment {
    /// The attachment of the pod sandbox `rec`.
    pub fn of(rec: &PodRecord) -> Attachment {
        Attachment {
            namespace: rec.namespace.clone(),
            name: rec.name.clone(),
            uid: rec.uid.clone(),
            container_id: rec.container_id.clone(),
            netns: rec.netns.clone(),
            ifname: rec.ifname.clone(),
        }
    }

    /// `CNI_ARGS` as the kubelet's runtime writes them.
    pub fn cni_args(&self) -> String {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
            self.namespace, self.name, self.container_id, self.uid
        )
    }
}

/// A loaded conflist and where its plugins are.
#[derive(Debug, Clone)]
pub struct CniRuntime {
    /// `CNI_PATH`: the plugin directory.
    pub bin_dir: PathBuf,
    /// The parsed conflist.
    pub conflist: Value,
}

impl CniRuntime {
    /// Loads `conflist` (a `.conflist` file); plugins are looked up in `bin_dir`.
    pub fn load(bin_dir: &Path, conflist: &Path) -> Result<CniRuntime, SandboxError> {
        let conflist: Value = kubeovn_sandbox_state::state::read_json(conflist)?;
        if conflist
            .get("plugins")
            .and_then(Value::as_array)
            .is_none_or(|p| p.is_empty())
        {
            return Err(SandboxError::Failed {
                what: "load conflist",
                detail: "no plugins".into(),
            });
        }
        Ok(CniRuntime {
            bin_dir: bin_dir.to_owned(),
            conflist,
        })
    }

    fn plugins(&self) -> Vec<Value> {
        self.conflist
            .get("plugins")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    }

    fn plugin_conf(&self, plugin: &Value, prev: Option<&Value>) -> Value {
        let mut conf = plugin.clone();
        if let Some(o) = conf.as_object_mut() {
            o.insert("name".into(), self.conflist["name"].clone());
            o.insert("cniVersion".into(), self.conflist["cniVersion"].clone());
            if let Some(p) = prev {
                o.insert("prevResult".into(), p.clone());
            }
        }
        conf
    }

    /// `ADD` through every plugin; the last result.
    pub fn add(&self, a: &Attachment) -> Result<Value, SandboxError> {
        let mut prev: Option<Value> = None;
        for p in self.plugins() {
            let conf = self.plugin_conf(&p, prev.as_ref());
            let out = self.exec("ADD", &p, &conf, a)?;
            prev = Some(
                serde_json::from_slice(&out).map_err(|e| SandboxError::Failed {
                    what: "CNI ADD",
                    detail: format!("result is not JSON: {e}"),
                })?,
            );
        }
        Ok(prev.unwrap_or(Value::Null))
    }

    /// `DEL` through every plugin in reverse order (every plugin runs; the first error is returned).
    pub fn del(&self, a: &Attachment) -> Result<(), SandboxError> {
        let mut first = None;
        for p in self.plugins().iter().rev() {
            let conf = self.plugin_conf(p, None);
            if let Err(e) = self.exec("DEL", p, &conf, a) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn exec(
        &self,
        command: &str,
        plugin: &Value,
        conf: &Value,
        a: &Attachment,
    ) -> Result<Vec<u8>, SandboxError> {
        let ty = plugin
            .get("type")
            .and_then(Value::as_str)
            .ok_or(SandboxError::Failed {
                what: "CNI",
                detail: "a plugin has no type".into(),
            })?;
        let bin = self.bin_dir.join(ty);
        let mut child = Command::new(&bin)
            .env_clear()
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &a.container_id)
            .env("CNI_NETNS", &a.netns)
            .env("CNI_IFNAME", &a.ifname)
            .env("CNI_PATH", &self.bin_dir)
            .env("CNI_ARGS", a.cni_args())
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| SandboxError::io("exec CNI plugin", &bin, e))?;
        let input = serde_json::to_vec(conf).unwrap_or_default();
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(&input);
        }
        let out = child
            .wait_with_output()
            .map_err(|e| SandboxError::io("wait CNI plugin", &bin, e))?;
        if !out.status.success() {
            let msg = serde_json::from_slice::<Value>(&out.stdout)
                .ok()
                .map(|v| {
                    format!(
                        "code {}: {} {}",
                        v["code"],
                        v["msg"].as_str().unwrap_or(""),
                        v["details"].as_str().unwrap_or("")
                    )
                })
                .unwrap_or_else(|| String::from_utf8_lossy(&out.stdout).into_owned());
            return Err(SandboxError::Failed {
                what: if command == "ADD" {
                    "CNI ADD"
                } else {
                    "CNI DEL"
                },
                detail: format!(
                    "{}/{}: {msg} {}",
                    a.namespace,
                    a.name,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        Ok(out.stdout)
    }
}

/// The conflist the sandbox installs: the shim, talking to the daemon at `socket`.
pub fn conflist(socket: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "kube-ovn",
        "plugins": [{
            "type": "kube-ovn",
            "server_socket": socket,
            "ipam": {"type": "kube-ovn", "server_socket": socket}
        }]
    })
}

/// The addresses (`10.16.0.5/16`) of a CNI result.
pub fn result_ips(result: &Value) -> Vec<String> {
    result["ips"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|ip| ip["address"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_injects_name_version_and_prev_result() {
        let rt = CniRuntime {
            bin_dir: PathBuf::from("/x"),
            conflist: conflist(Path::new("/run/d.sock")),
        };
        let p = rt.plugins()[0].clone();
        let c = rt.plugin_conf(&p, Some(&json!({"ips": []})));
        assert_eq!(c["name"], "kube-ovn");
        assert_eq!(c["cniVersion"], "1.0.0");
        assert_eq!(c["server_socket"], "/run/d.sock");
        assert_eq!(c["prevResult"], json!({"ips": []}));
    }

    #[test]
    fn args_and_ips() {
        let a = Attachment {
            namespace: "default".into(),
            name: "p".into(),
            uid: "u".into(),
            container_id: "c".into(),
            netns: PathBuf::from("/var/run/netns/x"),
            ifname: "eth0".into(),
        };
        assert!(a.cni_args().contains("K8S_POD_NAME=p;"));
        let r = json!({"ips": [{"address": "10.16.0.2/16"}]});
        assert_eq!(result_ips(&r), vec!["10.16.0.2/16".to_owned()]);
    }

    #[test]
    fn missing_plugin_is_an_error() {
        let rt = CniRuntime {
            bin_dir: PathBuf::from("/nonexistent"),
            conflist: conflist(Path::new("/run/d.sock")),
        };
        let a = Attachment {
            namespace: "n".into(),
            name: "p".into(),
            uid: "u".into(),
            container_id: "c".into(),
            netns: PathBuf::from("/nonexistent"),
            ifname: "eth0".into(),
        };
        assert!(rt.add(&a).is_err());
        assert!(rt.del(&a).is_err());
    }
}
