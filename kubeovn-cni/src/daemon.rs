//! The protocol between the CNI shim (`/opt/cni/bin/kube-ovn`) and the node daemon (`kube-ovn-daemon`),
//! and a small blocking client for it.
//!
//! The runtime execs the shim once per operation; the shim does no networking itself. It validates the
//! `CNI_*` environment and the configuration, forwards one [`Request`] to the daemon over a unix socket and
//! prints the daemon's answer, converted to the runtime's `cniVersion`.
//!
//! # Transport
//!
//! HTTP/1.1 over the unix socket [`DEFAULT_SOCKET`] (the netconf field `server_socket` overrides it). One
//! request per connection (`Connection: close`); bodies are JSON with a `Content-Length` (no chunked
//! encoding). The paths:
//!
//! | command  | request                  |
//! |----------|--------------------------|
//! | `ADD`    | `POST /api/v1/add`       |
//! | `DEL`    | `POST /api/v1/del`       |
//! | `CHECK`  | `POST /api/v1/check`     |
//! | `STATUS` | `POST /api/v1/status`    |
//! | `GC`     | `POST /api/v1/gc`        |
//!
//! `VERSION` never reaches the daemon: the shim answers it.
//!
//! # Messages
//!
//! The request body is a [`Request`]:
//!
//! ```json
//! {"protocol": 1, "command": "ADD", "cniVersion": "1.0.0", "containerID": "abc", "netns": "/var/run/netns/x",
//!  "ifname": "eth0", "pod": {"name": "web-0", "namespace": "default", "uid": "...", "infraContainerID": "abc"},
//!  "provider": "net1.default.ovn", "network": "kube-ovn", "args": {"K8S_POD_NAME": "web-0", ...},
//!  "config": { the network configuration as the runtime gave it, without prevResult },
//!  "runtimeConfig": {...}, "prevResult": { a 1.1.0 result }, "validAttachments": [...]}
//! ```
//!
//! The response body is a [`Response`]: `{"protocol": 1, "result": {...}}` on success (`result` only for
//! `ADD`, always in the latest spec version: the shim converts), or `{"protocol": 1, "error": {"code": ..,
//! "msg": .., "details": ..}}`, the spec's error object, which the shim prints as it is (with the runtime's
//! `cniVersion`). Status codes ([`Response::http_status`]): 200 for success; 400 for a request the daemon
//! cannot use (codes 1, 2, 4, 6, 7, a protocol mismatch); 503 for "try again later" (11) and `STATUS`
//! "not available" (50, 51); 500 for anything else. The shim trusts the body over the status; a non-2xx
//! answer without an error body becomes code 11 for 502/503/504 and [`CODE_BAD_RESPONSE`] otherwise.
//!
//! # Versioning
//!
//! Both messages carry `protocol` ([`PROTOCOL_VERSION`]). New optional fields may be added without a bump;
//! unknown fields are ignored on both sides. The daemon answers a request of another protocol version with
//! [`Request::check_protocol`]'s error: code [`CODE_PROTOCOL_MISMATCH`], HTTP 400.
//!
//! # Timeouts
//!
//! [`DaemonClient`] bounds the connect (default 2 s) and the whole exchange (default per command, see
//! [`default_timeout`]: 60 s for `ADD`, kubelet's own bound). A daemon that is not there, refuses, resets
//! the connection or does not answer in time is [`Error::DaemonUnavailable`] / [`Error::DaemonTimeout`],
//! both code 11 ("try again later").

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::{
    Attachment, CniError, CniResult, Command, Env, ErrorCode, NetConf, RuntimeConfig,
};
use crate::Error;

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// The daemon's socket when the configuration has no `server_socket`.
pub const DEFAULT_SOCKET: &str = "/run/openvswitch/kube-ovn-daemon.sock";

/// Default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Kube-OVN code: the shim and the daemon speak different protocol versions.
pub const CODE_PROTOCOL_MISMATCH: ErrorCode = ErrorCode(120);
/// Kube-OVN code: the daemon's answer is not a valid response.
pub const CODE_BAD_RESPONSE: ErrorCode = ErrorCode(121);

/// The largest response body the client accepts.
const MAX_RESPONSE: usize = 16 << 20;

/// The default bound on one exchange with the daemon for `command`: 60 s for `ADD` (kubelet's own
/// timeout), 30 s for `GC`, 20 s for `DEL` and `CHECK`, 5 s for `STATUS`.
pub fn default_timeout(command: Command) -> Duration {
    Duration::from_secs(match command {
        Command::Add => 60,
        Command::Gc => 30,
        Command::Del | Command::Check => 20,
        Command::Status | Command::Version => 5,
    })
}

/// The HTTP path of `command`'s request (`None` for `VERSION`, which the shim answers).
pub fn path_of(command: Command) -> Option<&'static str> {
    Some(match command {
        Command::Add => "/api/v1/add",
        Command::Del => "/api/v1/del",
        Command::Check => "/api/v1/check",
        Command::Status => "/api/v1/status",
        Command::Gc => "/api/v1/gc",
        Command::Version => return None,
    })
}

/// The command a request path stands for (the daemon's router).
pub fn command_of_path(path: &str) -> Option<Command> {
    [
        Command::Add,
        Command::Del,
        Command::Check,
        Command::Status,
        Command::Gc,
    ]
    .into_iter()
    .find(|c| path_of(*c) == Some(path))
}

mod command_serde {
    use crate::spec::Command;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(c: &Command, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(c.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Command, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Command::parse(&s).ok_or_else(|| serde::de::Error::custom(format!("unknown command {s:?}")))
    }
}

/// The pod an attachment belongs to, from `CNI_ARGS`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    /// `K8S_POD_NAME`.
    pub name: String,
    /// `K8S_POD_NAMESPACE`.
    pub namespace: String,
    /// `K8S_POD_UID` (empty when the runtime does not pass it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// `K8S_POD_INFRA_CONTAINER_ID` (empty when not passed).
    #[serde(
        rename = "infraContainerID",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub infra_container_id: String,
}

/// What the shim sends the daemon: one CNI operation with everything the daemon needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The protocol version ([`PROTOCOL_VERSION`]).
    pub protocol: u32,
    /// The CNI command (never `VERSION`).
    #[serde(with = "command_serde")]
    pub command: Command,
    /// The configuration's `cniVersion` (what the runtime speaks).
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    /// `CNI_CONTAINERID` (`ADD`, `DEL`, `CHECK`).
    #[serde(
        rename = "containerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub container_id: Option<String>,
    /// `CNI_NETNS` (`ADD`, `CHECK`; `DEL` when the runtime still has it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    /// `CNI_IFNAME` (`ADD`, `DEL`, `CHECK`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ifname: Option<String>,
    /// The pod, when `CNI_ARGS` names it (required for `ADD` and `CHECK`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
    /// The Kube-OVN provider: netconf `provider`, else `ipam.provider`, else empty (omitted on the wire):
    /// the default network, which the daemon names with kubeovn-core's `annotations::DEFAULT_PROVIDER`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub provider: String,
    /// The network's name (netconf `name`).
    #[serde(default)]
    pub network: String,
    /// Netconf `vf_driver` (SR-IOV), when set.
    #[serde(rename = "vfDriver", default, skip_serializing_if = "String::is_empty")]
    pub vf_driver: String,
    /// Netconf `deviceID` (SR-IOV / device plugins), when set.
    #[serde(rename = "deviceID", default, skip_serializing_if = "String::is_empty")]
    pub device_id: String,
    /// `CNI_ARGS`, as a map (the last value of a repeated key).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub args: BTreeMap<String, String>,
    /// The network configuration as the runtime passed it, without `prevResult`, `runtimeConfig` and
    /// `cni.dev/valid-attachments` (they have their own fields).
    pub config: NetConf,
    /// `runtimeConfig` (capability arguments: `ips`, `mac`, `bandwidth`, ...).
    #[serde(
        rename = "runtimeConfig",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub runtime_config: Option<RuntimeConfig>,
    /// `prevResult` (`CHECK`, `DEL`, chained `ADD`), converted to the latest spec version.
    #[serde(
        rename = "prevResult",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub prev_result: Option<CniResult>,
    /// `GC`: the attachments that are still valid (`cni.dev/valid-attachments`).
    #[serde(
        rename = "validAttachments",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub valid_attachments: Option<Vec<Attachment>>,
}

fn extra_str(conf: &NetConf, key: &str) -> Result<Option<String>, Error> {
    match conf.extra.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(Error::InvalidConfig {
            reason: format!("{key} must be a string, not {other}"),
        }),
    }
}

fn extra_secs(conf: &NetConf, key: &str) -> Result<Option<Duration>, Error> {
    match conf.extra.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(s) if s > 0.0 && s <= 3600.0 => Ok(Some(Duration::from_secs_f64(s))),
            _ => Err(Error::InvalidConfig {
                reason: format!("{key} must be a number of seconds in (0, 3600], not {v}"),
            }),
        },
    }
}

impl Request {
    /// Builds the request for the runtime's environment and configuration. Errors: `VERSION` (code 4: it
    /// has no request), `ADD`/`CHECK` without `K8S_POD_NAME`/`K8S_POD_NAMESPACE` (code 4), a `prevResult`
    /// that does not parse (code 6), a wrongly typed Kube-OVN field (code 7).
    pub fn from_cni(env: &Env, conf: &NetConf) -> Result<Request, Error> {
        if env.command == Command::Version {
            return Err(Error::InvalidEnv {
                var: "CNI_COMMAND",
                value: "VERSION".into(),
                reason: "VERSION is answered by the shim",
            });
        }
        let name = env.arg("K8S_POD_NAME").filter(|s| !s.is_empty());
        let namespace = env.arg("K8S_POD_NAMESPACE").filter(|s| !s.is_empty());
        let pod = match (name, namespace) {
            (Some(name), Some(namespace)) => Some(PodRef {
                name: name.to_owned(),
                namespace: namespace.to_owned(),
                uid: env.arg("K8S_POD_UID").unwrap_or_default().to_owned(),
                infra_container_id: env
                    .arg("K8S_POD_INFRA_CONTAINER_ID")
                    .unwrap_or_default()
                    .to_owned(),
            }),
            _ => None,
        };
        if pod.is_none() && matches!(env.command, Command::Add | Command::Check) {
            return Err(Error::InvalidEnv {
                var: "CNI_ARGS",
                value: env
                    .args
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(";"),
                reason: "K8S_POD_NAME and K8S_POD_NAMESPACE are required",
            });
        }
        let ipam_provider = conf
            .ipam
            .as_ref()
            .and_then(|i| i.get("provider"))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        let provider = extra_str(conf, "provider")?
            .or(ipam_provider)
            .unwrap_or_default();
        let prev_result = conf
            .prev_result()?
            .map(|r| r.convert_to(crate::spec::Version::LATEST));
        let mut config = conf.clone();
        config.prev_result = None;
        let runtime_config = config.runtime_config.take();
        let valid_attachments = config.valid_attachments.take();
        Ok(Request {
            protocol: PROTOCOL_VERSION,
            command: env.command,
            cni_version: conf.cni_version.clone(),
            container_id: env.container_id.clone(),
            netns: env.netns.clone(),
            ifname: env.ifname.clone(),
            pod,
            provider,
            network: conf.name.clone(),
            vf_driver: extra_str(conf, "vf_driver")?.unwrap_or_default(),
            device_id: extra_str(conf, "deviceID")?.unwrap_or_default(),
            args: env.args.iter().cloned().collect(),
            config,
            runtime_config,
            prev_result,
            valid_attachments,
        })
    }

    /// The HTTP path for this request.
    pub fn path(&self) -> &'static str {
        path_of(self.command).unwrap_or("/api/v1/version")
    }

    /// The daemon's check of the request's protocol version: code [`CODE_PROTOCOL_MISMATCH`] on a mismatch.
    pub fn check_protocol(&self) -> Result<(), CniError> {
        check_protocol(self.protocol)
    }

    /// The request as JSON.
    pub fn to_json(&self) -> String {
        // Strings, maps and JSON values always serialise.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The error for a peer speaking protocol `version` when it is not [`PROTOCOL_VERSION`].
pub fn check_protocol(version: u32) -> Result<(), CniError> {
    if version == PROTOCOL_VERSION {
        return Ok(());
    }
    Err(CniError::new(
        CODE_PROTOCOL_MISMATCH,
        "kube-ovn CNI shim and daemon protocol mismatch",
        format!("peer speaks protocol {version}, this side {PROTOCOL_VERSION}: upgrade the CNI binary and the daemon together"),
    ))
}

/// What the daemon answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// The protocol version ([`PROTOCOL_VERSION`]).
    pub protocol: u32,
    /// `ADD`'s result, in the latest spec version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<CniResult>,
    /// The failure, when the operation failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<CniError>,
}

impl Response {
    /// Success without a result (`DEL`, `CHECK`, `STATUS`, `GC`).
    pub fn ok() -> Response {
        Response {
            protocol: PROTOCOL_VERSION,
            result: None,
            error: None,
        }
    }

    /// Success with `ADD`'s result (converted to the latest spec version).
    pub fn with_result(result: &CniResult) -> Response {
        Response {
            result: Some(result.convert_to(crate::spec::Version::LATEST)),
            ..Response::ok()
        }
    }

    /// A failure.
    pub fn failure(error: CniError) -> Response {
        Response {
            error: Some(error),
            ..Response::ok()
        }
    }

    /// The HTTP status the daemon answers with (see the module docs).
    pub fn http_status(&self) -> u16 {
        match &self.error {
            None => 200,
            Some(e) => match e.code {
                ErrorCode::TRY_AGAIN_LATER
                | ErrorCode::NOT_AVAILABLE
                | ErrorCode::LIMITED_CONNECTIVITY => 503,
                CODE_PROTOCOL_MISMATCH | ErrorCode(1 | 2 | 4 | 6 | 7) => 400,
                _ => 500,
            },
        }
    }

    /// The outcome: the result (if any), or the daemon's error.
    pub fn into_outcome(self) -> Result<Option<CniResult>, CniError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.result),
        }
    }

    /// The response as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A blocking HTTP/1.1 client for the daemon's unix socket, with bounded connect and exchange times.
#[derive(Debug, Clone)]
pub struct DaemonClient {
    socket: PathBuf,
    connect_timeout: Duration,
    request_timeout: Option<Duration>,
}

impl DaemonClient {
    /// A client for `socket`, with [`DEFAULT_CONNECT_TIMEOUT`] and [`default_timeout`] per command.
    pub fn new(socket: impl Into<PathBuf>) -> DaemonClient {
        DaemonClient {
            socket: socket.into(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: None,
        }
    }

    /// The client the configuration asks for: `server_socket` (default [`DEFAULT_SOCKET`]),
    /// `connect_timeout` and `request_timeout` in seconds (code 7 when not a positive number up to 3600).
    pub fn from_netconf(conf: &NetConf) -> Result<DaemonClient, Error> {
        let socket = extra_str(conf, "server_socket")?.unwrap_or_else(|| DEFAULT_SOCKET.to_owned());
        let mut c = DaemonClient::new(socket);
        if let Some(t) = extra_secs(conf, "connect_timeout")? {
            c.connect_timeout = t;
        }
        c.request_timeout = extra_secs(conf, "request_timeout")?;
        Ok(c)
    }

    /// Sets the connect timeout.
    pub fn connect_timeout(mut self, t: Duration) -> DaemonClient {
        self.connect_timeout = t;
        self
    }

    /// Sets the bound on a whole exchange (connect, send, answer), for every command.
    pub fn request_timeout(mut self, t: Duration) -> DaemonClient {
        self.request_timeout = Some(t);
        self
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The bound on an exchange for `command`.
    pub fn timeout_for(&self, command: Command) -> Duration {
        self.request_timeout
            .unwrap_or_else(|| default_timeout(command))
    }

    /// Sends `req` and returns the daemon's response (which may carry the daemon's error). Transport
    /// failures are code 11 ([`Error::DaemonUnavailable`], [`Error::DaemonTimeout`]); an answer that is
    /// not a [`Response`] is [`Error::DaemonResponse`].
    pub fn call(&self, req: &Request) -> Result<Response, Error> {
        let timeout = self.timeout_for(req.command);
        let deadline = Instant::now() + timeout;
        let body = req.to_json();
        let (status, bytes) = self.exchange(req.path(), body.as_bytes(), deadline, timeout)?;
        let resp: Option<Response> = serde_json::from_slice(&bytes).ok();
        match resp {
            Some(r) if r.error.is_some() || (200..300).contains(&status) => {
                if r.error.is_none() {
                    check_protocol(r.protocol)?;
                }
                Ok(r)
            }
            _ if matches!(status, 502..=504) => Err(Error::DaemonUnavailable {
                socket: self.socket.clone(),
                what: "answered",
                source: std::io::Error::other(format!(
                    "HTTP {status}: {}",
                    String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
                )),
            }),
            _ => Err(Error::DaemonResponse {
                reason: format!(
                    "HTTP {status}, body {:?}",
                    String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
                ),
            }),
        }
    }

    fn connect(&self, deadline: Instant, timeout: Duration) -> Result<UnixStream, Error> {
        let unavailable = |source| Error::DaemonUnavailable {
            socket: self.socket.clone(),
            what: "connect",
            source,
        };
        let bound = self
            .connect_timeout
            .min(deadline.saturating_duration_since(Instant::now()))
            .max(Duration::from_millis(1));
        // A unix connect fails at once when nobody listens; it only blocks while the listener's backlog
        // is full, and Linux bounds that wait by the socket's send timeout (then EAGAIN).
        let sock = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)
            .map_err(unavailable)?;
        let addr = socket2::SockAddr::unix(&self.socket).map_err(unavailable)?;
        sock.set_write_timeout(Some(bound)).map_err(unavailable)?;
        match sock.connect(&addr) {
            Ok(()) => Ok(UnixStream::from(std::os::fd::OwnedFd::from(sock))),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(Error::DaemonTimeout {
                    socket: self.socket.clone(),
                    what: "connect",
                    after: if bound < self.connect_timeout {
                        timeout
                    } else {
                        bound
                    },
                })
            }
            Err(e) => Err(unavailable(e)),
        }
    }

    fn exchange(
        &self,
        path: &str,
        body: &[u8],
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(u16, Vec<u8>), Error> {
        let mut stream = self.connect(deadline, timeout)?;
        let timed_out = |what| Error::DaemonTimeout {
            socket: self.socket.clone(),
            what,
            after: timeout,
        };
        let io = |what, source: std::io::Error| {
            if matches!(
                source.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                timed_out(what)
            } else {
                Error::DaemonUnavailable {
                    socket: self.socket.clone(),
                    what,
                    source,
                }
            }
        };
        let remaining = || {
            let r = deadline.saturating_duration_since(Instant::now());
            (!r.is_zero()).then_some(r)
        };
        let mut msg = format!(
            "POST {path} HTTP/1.1\r\nHost: kube-ovn-daemon\r\nContent-Type: application/json\r\n\
             Accept: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        msg.extend_from_slice(body);
        let r = remaining().ok_or_else(|| timed_out("send"))?;
        stream
            .set_write_timeout(Some(r))
            .map_err(|e| io("send", e))?;
        stream.write_all(&msg).map_err(|e| io("send", e))?;

        let mut buf = Vec::with_capacity(4096);
        let mut chunk = [0u8; 8192];
        let mut head: Option<(u16, usize, Option<usize>)> = None; // status, body start, length
        loop {
            if let Some((status, start, Some(len))) = head {
                if buf.len() >= start + len {
                    return Ok((status, buf[start..start + len].to_vec()));
                }
            }
            let r = remaining().ok_or_else(|| timed_out("answer"))?;
            stream
                .set_read_timeout(Some(r))
                .map_err(|e| io("answer", e))?;
            let n = match stream.read(&mut chunk) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io("answer", e)),
            };
            if n == 0 {
                return match head {
                    Some((status, start, None)) => Ok((status, buf[start..].to_vec())),
                    _ => Err(Error::DaemonUnavailable {
                        socket: self.socket.clone(),
                        what: "answer",
                        source: std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "connection closed before a complete response",
                        ),
                    }),
                };
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.len() > MAX_RESPONSE {
                return Err(Error::DaemonResponse {
                    reason: format!("response larger than {MAX_RESPONSE} bytes"),
                });
            }
            if head.is_none() {
                if let Some(end) = find_head_end(&buf) {
                    head = Some(parse_head(&buf[..end]).map(|(s, l)| (s, end + 4, l))?);
                }
            }
        }
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

/// Parses a response head: status code and `Content-Length` (if any).
fn parse_head(head: &[u8]) -> Result<(u16, Option<usize>), Error> {
    let bad = |reason: String| Error::DaemonResponse { reason };
    let text = std::str::from_utf8(head).map_err(|_| bad("response head is not UTF-8".into()))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let (proto, code) = (parts.next().unwrap_or_default(), parts.next());
    let status = code
        .and_then(|c| c.parse::<u16>().ok())
        .filter(|_| proto.starts_with("HTTP/1."))
        .ok_or_else(|| bad(format!("bad status line {status_line:?}")))?;
    let mut len = None;
    for line in lines {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        if k.eq_ignore_ascii_case("content-length") {
            len = Some(
                v.parse::<usize>()
                    .map_err(|_| bad(format!("bad Content-Length {v:?}")))?,
            );
        } else if k.eq_ignore_ascii_case("transfer-encoding") && !v.eq_ignore_ascii_case("identity")
        {
            return Err(bad(format!("unsupported Transfer-Encoding {v:?}")));
        }
    }
    Ok((status, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(cmd: &str, args: &str) -> Env {
        let m: HashMap<&str, String> = [
            ("CNI_COMMAND", cmd.to_owned()),
            ("CNI_CONTAINERID", "c1".to_owned()),
            ("CNI_NETNS", "/var/run/netns/x".to_owned()),
            ("CNI_IFNAME", "eth0".to_owned()),
            ("CNI_PATH", "/opt/cni/bin".to_owned()),
            ("CNI_ARGS", args.to_owned()),
        ]
        .into_iter()
        .collect();
        Env::from_lookup(|k| m.get(k).cloned()).unwrap()
    }

    const ARGS: &str = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=u-1;K8S_POD_INFRA_CONTAINER_ID=c1";

    #[test]
    fn request_from_cni() {
        let conf = NetConf::from_slice(
            br#"{"cniVersion":"1.0.0","name":"kube-ovn","type":"kube-ovn",
            "server_socket":"/tmp/s.sock","ipam":{"type":"kube-ovn","provider":"a.b.ovn"},
            "runtimeConfig":{"mac":"00:11:22:33:44:55"},
            "prevResult":{"ips":[{"address":"10.0.0.2/24"}]}}"#,
        )
        .unwrap();
        let r = Request::from_cni(&env("CHECK", ARGS), &conf).unwrap();
        assert_eq!(r.path(), "/api/v1/check");
        assert_eq!(r.provider, "a.b.ovn");
        let pod = r.pod.as_ref().unwrap();
        assert_eq!(
            (pod.name.as_str(), pod.namespace.as_str(), pod.uid.as_str()),
            ("p", "ns", "u-1")
        );
        assert_eq!(pod.infra_container_id, "c1");
        assert_eq!(
            r.prev_result.as_ref().unwrap().cni_version,
            crate::spec::Version::LATEST
        );
        assert!(r.config.prev_result.is_none() && r.config.runtime_config.is_none());
        assert_eq!(
            r.runtime_config.as_ref().unwrap().mac.as_deref(),
            Some("00:11:22:33:44:55")
        );
        let v: Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(v["command"], "CHECK");
        assert_eq!(v["protocol"], 1);
        assert_eq!(v["pod"]["infraContainerID"], "c1");
        let back: Request = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        assert!(back.check_protocol().is_ok());

        let c = DaemonClient::from_netconf(&conf).unwrap();
        assert_eq!(c.socket(), Path::new("/tmp/s.sock"));
        assert_eq!(c.timeout_for(Command::Add), Duration::from_secs(60));
    }

    #[test]
    fn request_errors() {
        let conf =
            NetConf::from_slice(br#"{"cniVersion":"1.1.0","name":"n","type":"kube-ovn"}"#).unwrap();
        let e = Request::from_cni(&env("ADD", "IgnoreUnknown=1"), &conf).unwrap_err();
        assert_eq!(e.code().0, 4);
        // DEL does not need the pod.
        let r = Request::from_cni(&env("DEL", "IgnoreUnknown=1"), &conf).unwrap();
        assert_eq!(r.provider, "");
        assert!(r.pod.is_none());
        let bad = NetConf::from_slice(
            br#"{"cniVersion":"1.1.0","name":"n","type":"kube-ovn","request_timeout":"x"}"#,
        )
        .unwrap();
        assert_eq!(DaemonClient::from_netconf(&bad).unwrap_err().code().0, 7);
        let bad = NetConf::from_slice(
            br#"{"cniVersion":"1.1.0","name":"n","type":"kube-ovn","prevResult":{"ips":"x"}}"#,
        )
        .unwrap();
        assert_eq!(
            Request::from_cni(&env("DEL", ARGS), &bad)
                .unwrap_err()
                .code()
                .0,
            6
        );
    }

    #[test]
    fn responses_and_paths() {
        let res = CniResult::from_slice(
            br#"{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.0.0.2/24"}]}"#,
        )
        .unwrap();
        let r = Response::with_result(&res);
        assert_eq!(r.http_status(), 200);
        let back: Response = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(
            back.into_outcome().unwrap().unwrap().cni_version.as_str(),
            "1.1.0"
        );
        for (code, status) in [
            (11, 503),
            (50, 503),
            (4, 400),
            (120, 400),
            (3, 500),
            (200, 500),
        ] {
            assert_eq!(
                Response::failure(CniError::new(ErrorCode(code), "m", "")).http_status(),
                status
            );
        }
        assert_eq!(check_protocol(2).unwrap_err().code, CODE_PROTOCOL_MISMATCH);
        for c in [
            Command::Add,
            Command::Del,
            Command::Check,
            Command::Status,
            Command::Gc,
        ] {
            assert_eq!(command_of_path(path_of(c).unwrap()), Some(c));
        }
        assert_eq!(command_of_path("/api/v1/nope"), None);
        assert_eq!(path_of(Command::Version), None);
    }

    #[test]
    fn heads() {
        assert_eq!(
            parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\nX: y").unwrap(),
            (200, Some(12))
        );
        assert_eq!(parse_head(b"HTTP/1.0 503 Busy").unwrap(), (503, None));
        assert!(parse_head(b"SSH-2.0 hi").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked").is_err());
        assert_eq!(find_head_end(b"a\r\n\r\nb"), Some(1));
    }

    #[test]
    fn full_backlog_connect_times_out() {
        let dir = std::env::temp_dir().join(format!("kubeovn-cni-backlog-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.sock");
        // A daemon that never accepts, with a backlog of 1: fill it with non-blocking connects.
        let listener =
            socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None).unwrap();
        listener
            .bind(&socket2::SockAddr::unix(&path).unwrap())
            .unwrap();
        listener.listen(1).unwrap();
        let mut held = Vec::new();
        for _ in 0..64 {
            let s =
                socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None).unwrap();
            s.set_nonblocking(true).unwrap();
            let full = s.connect(&socket2::SockAddr::unix(&path).unwrap()).is_err();
            held.push(s);
            if full {
                break;
            }
        }
        let c = DaemonClient::new(&path).connect_timeout(Duration::from_millis(200));
        let conf =
            NetConf::from_slice(br#"{"cniVersion":"1.1.0","name":"n","type":"kube-ovn"}"#).unwrap();
        let req = Request::from_cni(&env("DEL", ARGS), &conf).unwrap();
        let t = Instant::now();
        let e = c.call(&req).unwrap_err();
        assert!(
            matches!(
                e,
                Error::DaemonTimeout {
                    what: "connect",
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(e.code(), ErrorCode::TRY_AGAIN_LATER);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn daemon_down_is_try_again() {
        let dir = std::env::temp_dir().join(format!("kubeovn-cni-daemon-{}", std::process::id()));
        let c = DaemonClient::new(dir.join("none.sock"));
        let conf =
            NetConf::from_slice(br#"{"cniVersion":"1.1.0","name":"n","type":"kube-ovn"}"#).unwrap();
        let req = Request::from_cni(&env("DEL", ARGS), &conf).unwrap();
        let e = c.call(&req).unwrap_err();
        assert_eq!(e.code(), ErrorCode::TRY_AGAIN_LATER, "{e}");
    }
}
