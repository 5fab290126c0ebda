//! The async client: one tokio task per connection moves bytes between the socket and the
//! [`Connection`] state machine; [`Client`] handles send commands to it.
//!
//! Every method enqueues its request before its future is first polled, so creating several futures and
//! awaiting them later pipelines the requests on the one connection.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value as Json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::conn::{Connection, Event, Notification, UpdateKind};
use crate::error::Error;
use crate::framing::FrameDecoder;
use crate::monitor::{
    parse_monitor_since_reply_str, parse_table_updates_str, MonitorRequest, MonitorRequests,
    MonitorSinceReply, TableUpdates,
};
use crate::ops::{parse_results, Condition, OperationResult, Transaction};
use crate::schema::DatabaseSchema;
use crate::uuid::Uuid;

/// Where an ovsdb-server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remote {
    /// `unix:PATH`
    Unix(PathBuf),
    /// `tcp:HOST:PORT` (an IPv6 host in brackets).
    Tcp(String),
    /// `ssl:HOST:PORT`: TLS over TCP, with the certificates of [`ClientBuilder::tls`] (feature `ssl`).
    Ssl(String),
}

impl Remote {
    /// Parses one remote in the `ovn-nbctl --db` syntax.
    pub fn parse(s: &str) -> Result<Remote, Error> {
        let bad = |why| Error::InvalidRemote {
            remote: s.to_owned(),
            why,
        };
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err(bad("empty path"));
            }
            return Ok(Remote::Unix(PathBuf::from(p)));
        }
        if let Some(hp) = s.strip_prefix("tcp:") {
            let (host, port) = hp
                .rsplit_once(':')
                .ok_or_else(|| bad("expected tcp:HOST:PORT"))?;
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(bad("expected tcp:HOST:PORT"));
            }
            return Ok(Remote::Tcp(hp.to_owned()));
        }
        if let Some(hp) = s.strip_prefix("ssl:") {
            if !cfg!(feature = "ssl") {
                return Err(bad("ssl: needs the `ssl` feature of kubeovn-ovn"));
            }
            let (host, port) = hp
                .rsplit_once(':')
                .ok_or_else(|| bad("expected ssl:HOST:PORT"))?;
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(bad("expected ssl:HOST:PORT"));
            }
            return Ok(Remote::Ssl(hp.to_owned()));
        }
        Err(bad("expected unix:PATH, tcp:HOST:PORT or ssl:HOST:PORT"))
    }

    /// Parses a comma-separated list of remotes (the members of a clustered database).
    pub fn parse_list(s: &str) -> Result<Vec<Remote>, Error> {
        s.split(',')
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(Remote::parse)
            .collect()
    }
}

impl std::fmt::Display for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Remote::Unix(p) => write!(f, "unix:{}", p.display()),
            Remote::Tcp(hp) => write!(f, "tcp:{hp}"),
            Remote::Ssl(hp) => write!(f, "ssl:{hp}"),
        }
    }
}

/// Connection settings; [`Client::builder`] starts one.
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    probe_interval: Option<Duration>,
    max_message: usize,
    connect_timeout: Duration,
    #[cfg(feature = "ssl")]
    tls: Option<crate::tls::TlsConfig>,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            probe_interval: Some(Duration::from_secs(5)),
            max_message: crate::framing::DEFAULT_MAX_MESSAGE,
            connect_timeout: Duration::from_secs(10),
            #[cfg(feature = "ssl")]
            tls: None,
        }
    }
}

impl ClientBuilder {
    /// Sends an echo after this long without a message and disconnects after twice this (None: never).
    pub fn inactivity_probe(mut self, interval: Option<Duration>) -> Self {
        self.probe_interval = interval;
        self
    }

    /// The largest message accepted from the server.
    pub fn max_message(mut self, bytes: usize) -> Self {
        self.max_message = bytes;
        self
    }

    /// How long one connection attempt may take.
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// Certificates for `ssl:` remotes (required to connect to one).
    #[cfg(feature = "ssl")]
    pub fn tls(mut self, config: crate::tls::TlsConfig) -> Self {
        self.tls = Some(config);
        self
    }

    /// Connects to the first reachable of the comma-separated `remotes`.
    pub async fn connect(self, remotes: &str) -> Result<Client, Error> {
        let list = Remote::parse_list(remotes)?;
        let mut last = Error::InvalidRemote {
            remote: remotes.to_owned(),
            why: "no remote given",
        };
        for r in list {
            match self.connect_one(&r).await {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Connects to one remote.
    pub async fn connect_remote(&self, remote: &Remote) -> Result<Client, Error> {
        self.connect_one(remote).await
    }

    /// A client over an already connected byte stream (an in-process pipe such as the `mock` feature's
    /// `memdb::MemDb::connect` makes, or a socket set up by the caller); `name` is its [`Client::remote`]. Must be called within a tokio runtime: the connection's task is spawned here.
    pub fn with_stream<S>(&self, stream: S, name: impl Into<String>) -> Client
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        let core = Connection::with_decoder(
            now(),
            self.probe_interval,
            FrameDecoder::with_max_message(self.max_message),
        );
        let (r, w) = tokio::io::split(stream);
        tokio::spawn(drive(r, w, rx, core));
        Client::from_parts(tx, name.into())
    }

    async fn connect_one(&self, remote: &Remote) -> Result<Client, Error> {
        let name = remote.to_string();
        let io_err = |source| Error::Io {
            remote: name.clone(),
            source,
        };
        let timed_out = || {
            io_err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connect timed out",
            ))
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let core = Connection::with_decoder(
            now(),
            self.probe_interval,
            FrameDecoder::with_max_message(self.max_message),
        );
        match remote {
            Remote::Unix(p) => {
                let s =
                    tokio::time::timeout(self.connect_timeout, tokio::net::UnixStream::connect(p))
                        .await
                        .map_err(|_| timed_out())?
                        .map_err(io_err)?;
                let (r, w) = s.into_split();
                tokio::spawn(drive(r, w, rx, core));
            }
            Remote::Tcp(hp) => {
                let s = tokio::time::timeout(
                    self.connect_timeout,
                    tokio::net::TcpStream::connect(hp.as_str()),
                )
                .await
                .map_err(|_| timed_out())?
                .map_err(io_err)?;
                s.set_nodelay(true).map_err(io_err)?;
                let (r, w) = s.into_split();
                tokio::spawn(drive(r, w, rx, core));
            }
            #[cfg(feature = "ssl")]
            Remote::Ssl(hp) => {
                let tls_err =
                    |what: String, source: Option<Box<dyn std::error::Error + Send + Sync>>| {
                        Error::Tls {
                            remote: name.clone(),
                            what,
                            source,
                        }
                    };
                let cfg = self.tls.as_ref().ok_or_else(|| {
                    tls_err("no TLS configuration (ClientBuilder::tls)".into(), None)
                })?;
                let host = hp.rsplit_once(':').map_or(hp.as_str(), |(h, _)| h);
                let (config, server_name) = cfg.client_config(host).map_err(|e| match e {
                    Error::Tls { what, source, .. } => tls_err(what, source),
                    e => e,
                })?;
                let tls = async {
                    let s = tokio::net::TcpStream::connect(hp.as_str())
                        .await
                        .map_err(io_err)?;
                    s.set_nodelay(true).map_err(io_err)?;
                    tokio_rustls::TlsConnector::from(config)
                        .connect(server_name, s)
                        .await
                        .map_err(|e| {
                            // A handshake failure is an io::Error wrapping the rustls::Error.
                            let what = e.to_string();
                            match e.into_inner().map(|i| i.downcast::<rustls::Error>()) {
                                Some(Ok(r)) => tls_err(what, Some(r)),
                                Some(Err(other)) => tls_err(what, Some(other)),
                                None => tls_err(what, None),
                            }
                        })
                };
                let s = tokio::time::timeout(self.connect_timeout, tls)
                    .await
                    .map_err(|_| timed_out())??;
                let (r, w) = tokio::io::split(s);
                tokio::spawn(drive(r, w, rx, core));
            }
            #[cfg(not(feature = "ssl"))]
            Remote::Ssl(_) => {
                return Err(Error::InvalidRemote {
                    remote: name,
                    why: "ssl: needs the `ssl` feature of kubeovn-ovn",
                })
            }
        }
        Ok(Client::from_parts(tx, name))
    }
}

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// A reply's result, as JSON text: each caller decodes it for what it expects.
type Reply = oneshot::Sender<Result<Box<RawValue>, Error>>;

/// A raw update notification routed to a monitor stream.
#[derive(Debug)]
struct RawUpdate {
    last_txn_id: Option<Uuid>,
    updates: Box<RawValue>,
}

/// Decodes a result's JSON text into a `Value`.
fn to_json(method: &'static str, raw: &RawValue) -> Result<Json, Error> {
    serde_json::from_str(raw.get()).map_err(|e| Error::Protocol {
        method,
        what: e.to_string(),
    })
}

enum Command {
    Call {
        method: &'static str,
        params: Vec<u8>,
        reply: Reply,
        subscribe: Option<(String, mpsc::UnboundedSender<RawUpdate>)>,
    },
    Unsubscribe(String),
    Locks(mpsc::UnboundedSender<LockEvent>),
    Close(String),
}

/// A change of lock ownership announced by the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockEvent {
    /// `locked`: a lock this client asked for is now held.
    Locked(String),
    /// `stolen`: another client stole a lock this client held.
    Stolen(String),
}

struct Shared {
    tx: mpsc::UnboundedSender<Command>,
    remote: String,
    schemas: Mutex<HashMap<String, Arc<DatabaseSchema>>>,
    next_monitor: AtomicU64,
}

/// Names a connection without keeping it alive (a weak reference, so its address is not reused while the
/// name exists).
#[derive(Clone)]
pub(crate) struct ConnectionId(Weak<Shared>);

impl ConnectionId {
    /// Whether `c` is a handle on the connection named.
    pub(crate) fn is(&self, c: &Client) -> bool {
        std::ptr::eq(self.0.as_ptr(), Arc::as_ptr(&c.shared))
    }
}

/// A handle on one OVSDB connection; cheap to clone, all clones share the connection. The connection's task
/// ends when the last handle is dropped and no request is waiting.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("remote", &self.shared.remote)
            .finish()
    }
}

fn disconnected() -> Error {
    Error::Disconnected("the connection task has stopped".into())
}

impl Client {
    fn from_parts(tx: mpsc::UnboundedSender<Command>, remote: String) -> Client {
        Client {
            shared: Arc::new(Shared {
                tx,
                remote,
                schemas: Mutex::new(HashMap::new()),
                next_monitor: AtomicU64::new(1),
            }),
        }
    }

    /// Settings for a new connection.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// Connects with default settings to `unix:PATH` or `tcp:HOST:PORT` (or the first reachable of a
    /// comma-separated list).
    pub async fn connect(remotes: &str) -> Result<Client, Error> {
        ClientBuilder::default().connect(remotes).await
    }

    /// The remote this client is connected to.
    pub fn remote(&self) -> &str {
        &self.shared.remote
    }

    /// Whether `self` and `other` are handles on the same connection.
    pub fn same_connection(&self, other: &Client) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Names this connection without keeping it alive.
    pub(crate) fn connection_id(&self) -> ConnectionId {
        ConnectionId(Arc::downgrade(&self.shared))
    }

    /// Whether the connection has stopped (closed by either side or failed).
    pub fn is_closed(&self) -> bool {
        self.shared.tx.is_closed()
    }

    /// Waits until the connection stops.
    pub async fn closed(&self) {
        self.shared.tx.closed().await
    }

    /// Drops the connection now: requests waiting for a reply fail ([`Error::OutcomeUnknown`] for
    /// transactions), monitors end. Used to leave a member that is no longer the leader.
    pub fn close(&self, why: impl Into<String>) {
        let _ = self.shared.tx.send(Command::Close(why.into()));
    }

    fn start(
        &self,
        method: &'static str,
        params: &(impl Serialize + ?Sized),
        subscribe: Option<(String, mpsc::UnboundedSender<RawUpdate>)>,
    ) -> Result<oneshot::Receiver<Result<Box<RawValue>, Error>>, Error> {
        let params = serde_json::to_vec(params)?;
        let (reply, rx) = oneshot::channel();
        self.shared
            .tx
            .send(Command::Call {
                method,
                params,
                reply,
                subscribe,
            })
            .map_err(|_| disconnected())?;
        Ok(rx)
    }

    /// Calls any method with JSON params; the request is sent before the future is polled.
    pub fn call(
        &self,
        method: &'static str,
        params: &(impl Serialize + ?Sized),
    ) -> impl Future<Output = Result<Json, Error>> + Send + 'static {
        let rx = self.start(method, params, None);
        async move { to_json(method, &rx?.await.map_err(|_| disconnected())??) }
    }

    /// `list_dbs`: the databases the server holds.
    pub async fn list_dbs(&self) -> Result<Vec<String>, Error> {
        let r = self.call("list_dbs", &[(); 0]).await?;
        serde_json::from_value(r).map_err(|e| Error::Protocol {
            method: "list_dbs",
            what: e.to_string(),
        })
    }

    /// `get_schema`: the schema of `db`, parsed; it is also kept to validate later transactions and to
    /// decode monitor updates.
    pub async fn get_schema(&self, db: &str) -> Result<Arc<DatabaseSchema>, Error> {
        let j = self.call("get_schema", &[db]).await?;
        let s = Arc::new(DatabaseSchema::parse(&j)?);
        self.set_schema(s.clone());
        Ok(s)
    }

    /// Uses `schema` to validate transactions on its database (instead of fetching it).
    pub fn set_schema(&self, schema: Arc<DatabaseSchema>) {
        if let Ok(mut m) = self.shared.schemas.lock() {
            m.insert(schema.name.clone(), schema);
        }
    }

    /// The schema of `db` this client knows, if any.
    pub fn schema(&self, db: &str) -> Option<Arc<DatabaseSchema>> {
        self.shared
            .schemas
            .lock()
            .ok()
            .and_then(|m| m.get(db).cloned())
    }

    async fn schema_or_fetch(&self, db: &str) -> Result<Arc<DatabaseSchema>, Error> {
        match self.schema(db) {
            Some(s) => Ok(s),
            None => self.get_schema(db).await,
        }
    }

    /// `echo`: a round trip with the server.
    pub async fn echo(&self) -> Result<(), Error> {
        self.call("echo", &[(); 0]).await.map(|_| ())
    }

    /// `transact`: runs `txn` and returns one result per operation, or the failed operation's error. When the
    /// client knows the database's schema (see [`Client::get_schema`]) the transaction is validated first and
    /// nothing is sent if it is invalid. The request is sent before the future is polled.
    ///
    /// If the connection was already gone the error is [`Error::Disconnected`] (nothing was sent); if it dies
    /// while the transaction waits for its reply the error is [`Error::OutcomeUnknown`]: it may have committed.
    pub fn transact<'a>(
        &self,
        txn: &'a Transaction,
    ) -> impl Future<Output = Result<Vec<OperationResult>, Error>> + Send + 'a {
        let started = match self.schema(&txn.db) {
            Some(s) => txn.validate(&s).map_err(Error::from),
            None => Ok(()),
        }
        .and_then(|()| self.start("transact", txn, None));
        async move {
            let raw = started?.await.map_err(|_| disconnected())??;
            Ok(parse_results(&txn.ops, &to_json("transact", &raw)?)?)
        }
    }

    async fn start_monitor(
        &self,
        method: &'static str,
        db: &str,
        requests: &MonitorRequests,
        since: Option<Option<Uuid>>,
    ) -> Result<(Box<RawValue>, MonitorStream), Error> {
        let schema = self.schema_or_fetch(db).await?;
        requests.validate(&schema)?;
        let id = format!(
            "m{}",
            self.shared.next_monitor.fetch_add(1, Ordering::Relaxed)
        );
        let (stx, srx) = mpsc::unbounded_channel();
        let rx = match since {
            None => self.start(method, &(db, &id, requests), Some((id.clone(), stx)))?,
            Some(last) => {
                let last = last.unwrap_or(Uuid::NIL);
                self.start(method, &(db, &id, requests, last), Some((id.clone(), stx)))?
            }
        };
        let j = match rx.await.map_err(|_| disconnected())? {
            Ok(j) => j,
            Err(e) => {
                let _ = self.shared.tx.send(Command::Unsubscribe(id));
                return Err(e);
            }
        };
        let kind = match method {
            "monitor" => UpdateKind::Update,
            "monitor_cond" => UpdateKind::Update2,
            _ => UpdateKind::Update3,
        };
        Ok((
            j,
            MonitorStream {
                id,
                db: db.to_owned(),
                kind,
                rx: srx,
                schema,
                last_txn_id: None,
                client: self.clone(),
            },
        ))
    }

    /// `monitor`: the current contents (in `update` form) and a stream of later changes.
    pub async fn monitor(
        &self,
        db: &str,
        requests: &MonitorRequests,
    ) -> Result<(TableUpdates, MonitorStream), Error> {
        let (j, s) = self.start_monitor("monitor", db, requests, None).await?;
        Ok((parse_table_updates_str(j.get(), false, Some(&s.schema))?, s))
    }

    /// `monitor_cond`: the current contents (in `update2` form) and a stream of later changes.
    pub async fn monitor_cond(
        &self,
        db: &str,
        requests: &MonitorRequests,
    ) -> Result<(TableUpdates, MonitorStream), Error> {
        let (j, s) = self
            .start_monitor("monitor_cond", db, requests, None)
            .await?;
        Ok((parse_table_updates_str(j.get(), true, Some(&s.schema))?, s))
    }

    /// `monitor_cond_since`: the changes since transaction `last_txn_id` if the server still has it (else
    /// the current contents), and a stream of later changes in `update3` form.
    pub async fn monitor_cond_since(
        &self,
        db: &str,
        requests: &MonitorRequests,
        last_txn_id: Option<Uuid>,
    ) -> Result<(MonitorSinceReply, MonitorStream), Error> {
        let (j, mut s) = self
            .start_monitor("monitor_cond_since", db, requests, Some(last_txn_id))
            .await?;
        let r = parse_monitor_since_reply_str(j.get(), Some(&s.schema))?;
        s.last_txn_id = r.last_txn_id;
        Ok((r, s))
    }

    /// `monitor_cond_change`: replaces the conditions of the given tables of a conditional monitor (the
    /// server does not support changing columns). An empty list means every row.
    pub async fn monitor_cond_change(
        &self,
        stream: &MonitorStream,
        conditions: &BTreeMap<String, Vec<Condition>>,
    ) -> Result<(), Error> {
        let mut requests = MonitorRequests::new();
        for (t, cs) in conditions {
            let mut r = MonitorRequest::all();
            r.conditions = Some(cs.clone());
            requests = requests.table(t.clone(), r);
        }
        requests.validate(&stream.schema)?;
        self.call("monitor_cond_change", &(&stream.id, &stream.id, &requests))
            .await
            .map(|_| ())
    }

    /// `monitor_cancel`: stops a monitor and waits for the server to confirm. (Dropping the stream also
    /// cancels it, without waiting.)
    pub async fn monitor_cancel(&self, mut stream: MonitorStream) -> Result<(), Error> {
        let id = std::mem::take(&mut stream.id);
        let r = self.call("monitor_cancel", &[&id]).await;
        let _ = self.shared.tx.send(Command::Unsubscribe(id));
        r.map(|_| ())
    }

    /// `lock`: asks for a lock; true if it is held now, else a [`LockEvent::Locked`] follows when it is.
    pub async fn lock(&self, name: &str) -> Result<bool, Error> {
        let r = self.call("lock", &[name]).await?;
        r.get("locked")
            .and_then(Json::as_bool)
            .ok_or(Error::Protocol {
                method: "lock",
                what: r.to_string(),
            })
    }

    /// `steal`: takes a lock from whoever holds it.
    pub async fn steal(&self, name: &str) -> Result<bool, Error> {
        let r = self.call("steal", &[name]).await?;
        r.get("locked")
            .and_then(Json::as_bool)
            .ok_or(Error::Protocol {
                method: "steal",
                what: r.to_string(),
            })
    }

    /// `unlock`: releases (or stops waiting for) a lock.
    pub async fn unlock(&self, name: &str) -> Result<(), Error> {
        self.call("unlock", &[name]).await.map(|_| ())
    }

    /// A receiver of `locked` and `stolen` notifications from now on.
    pub fn lock_events(&self) -> mpsc::UnboundedReceiver<LockEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = self.shared.tx.send(Command::Locks(tx));
        rx
    }
}

/// One batch of changes from a monitor.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    /// For update3: the transaction these changes complete.
    pub last_txn_id: Option<Uuid>,
    /// The changes.
    pub tables: TableUpdates,
}

/// The changes a monitor reports after its initial reply, in order. Dropping it cancels the monitor.
#[derive(Debug)]
pub struct MonitorStream {
    id: String,
    db: String,
    kind: UpdateKind,
    rx: mpsc::UnboundedReceiver<RawUpdate>,
    schema: Arc<DatabaseSchema>,
    last_txn_id: Option<Uuid>,
    client: Client,
}

impl MonitorStream {
    /// The monitor's id on the connection.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The database monitored.
    pub fn db(&self) -> &str {
        &self.db
    }

    /// The id of the last transaction seen (monitor_cond_since only): resume from here after a reconnect.
    pub fn last_txn_id(&self) -> Option<Uuid> {
        self.last_txn_id
    }

    /// The next batch of changes; None when the connection is gone or the monitor was cancelled.
    pub async fn next(&mut self) -> Option<Result<Update, Error>> {
        let raw = self.rx.recv().await?;
        let v2 = self.kind != UpdateKind::Update;
        if raw.last_txn_id.is_some() {
            self.last_txn_id = raw.last_txn_id;
        }
        Some(
            parse_table_updates_str(raw.updates.get(), v2, Some(&self.schema))
                .map(|tables| Update {
                    last_txn_id: raw.last_txn_id,
                    tables,
                })
                .map_err(Error::from),
        )
    }

    /// Like [`MonitorStream::next`], giving up after `t`.
    pub async fn next_timeout(&mut self, t: Duration) -> Option<Result<Update, Error>> {
        tokio::time::timeout(t, self.next()).await.ok().flatten()
    }
}

impl Drop for MonitorStream {
    fn drop(&mut self) {
        if self.id.is_empty() {
            return;
        }
        let id = std::mem::take(&mut self.id);
        // Tell the server to stop (nobody waits for the reply) and stop routing.
        if let Ok(params) = serde_json::to_vec(&[&id]) {
            let (reply, _) = oneshot::channel();
            let _ = self.client.shared.tx.send(Command::Call {
                method: "monitor_cancel",
                params,
                reply,
                subscribe: None,
            });
        }
        let _ = self.client.shared.tx.send(Command::Unsubscribe(id));
    }
}

type Token = (&'static str, Reply);

struct Driver {
    core: Connection<Token>,
    subs: HashMap<String, mpsc::UnboundedSender<RawUpdate>>,
    locks: Vec<mpsc::UnboundedSender<LockEvent>>,
}

impl Driver {
    /// Handles a command; Some(reason) to stop the connection.
    fn command(&mut self, c: Command) -> Option<String> {
        match c {
            Command::Call {
                method,
                params,
                reply,
                subscribe,
            } => {
                if let Some((id, tx)) = subscribe {
                    self.subs.insert(id, tx);
                }
                self.core
                    .send_request_encoded(method, &params, (method, reply));
            }
            Command::Unsubscribe(id) => {
                self.subs.remove(&id);
            }
            Command::Locks(tx) => self.locks.push(tx),
            Command::Close(why) => return Some(why),
        }
        None
    }

    fn dispatch(&mut self) {
        while let Some(ev) = self.core.poll_event() {
            match ev {
                Event::Reply {
                    token: (method, reply),
                    result,
                } => {
                    let _ = reply.send(result.map_err(|error| Error::Rpc { method, error }));
                }
                Event::Notification(Notification::Update {
                    monitor,
                    last_txn_id,
                    updates,
                    ..
                }) => {
                    if let Some(id) = monitor.as_str() {
                        if let Some(tx) = self.subs.get(id) {
                            if tx
                                .send(RawUpdate {
                                    last_txn_id,
                                    updates,
                                })
                                .is_err()
                            {
                                self.subs.remove(id);
                            }
                        }
                    }
                }
                Event::Notification(Notification::Locked(n)) => {
                    self.locks
                        .retain(|tx| tx.send(LockEvent::Locked(n.clone())).is_ok());
                }
                Event::Notification(Notification::Stolen(n)) => {
                    self.locks
                        .retain(|tx| tx.send(LockEvent::Stolen(n.clone())).is_ok());
                }
                Event::Notification(Notification::Other { .. }) => {}
            }
        }
    }
}

async fn drive<R, W>(
    mut rd: R,
    mut wr: W,
    mut rx: mpsc::UnboundedReceiver<Command>,
    core: Connection<Token>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut d = Driver {
        core,
        subs: HashMap::new(),
        locks: Vec::new(),
    };
    let mut wbuf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut wpos = 0usize;
    let mut closing = false;
    // A TLS stream may keep part of what it accepted until flushed.
    let mut unflushed = false;
    let far = tokio::time::Instant::now() + Duration::from_secs(86400 * 365);
    let reason: String = loop {
        if wpos == wbuf.len() {
            wbuf.clear();
            wpos = 0;
            d.core.take_output(&mut wbuf);
        }
        if closing && wbuf.is_empty() && d.core.in_flight() == 0 {
            break "closed by the client".into();
        }
        let deadline = d.core.poll_timeout().map(tokio::time::Instant::from_std);
        tokio::select! {
            c = rx.recv(), if !closing => match c {
                Some(c) => {
                    let mut stop = d.command(c);
                    // Take what else is queued so that one write carries many requests.
                    for _ in 0..4096 {
                        if stop.is_some() {
                            break;
                        }
                        match rx.try_recv() {
                            Ok(c) => stop = d.command(c),
                            Err(_) => break,
                        }
                    }
                    if let Some(why) = stop {
                        break format!("closed by the client: {why}");
                    }
                }
                None => closing = true,
            },
            r = rd.read_buf(d.core.read_buffer()) => match r {
                Ok(0) => break "closed by the server".into(),
                Ok(_) => {
                    if let Err(e) = d.core.handle_input(now()) {
                        break format!("{e}");
                    }
                    d.dispatch();
                }
                Err(e) => break format!("read: {e}"),
            },
            w = async {
                if wpos < wbuf.len() {
                    wr.write(&wbuf[wpos..]).await.map(Some)
                } else {
                    wr.flush().await.map(|()| None)
                }
            }, if wpos < wbuf.len() || unflushed => match w {
                Ok(Some(0)) => break "write returned 0".into(),
                Ok(Some(n)) => {
                    wpos += n;
                    unflushed = true;
                }
                Ok(None) => unflushed = false,
                Err(e) => break format!("write: {e}"),
            },
            _ = tokio::time::sleep_until(deadline.unwrap_or(far)), if deadline.is_some() => {
                if let Err(e) = d.core.handle_timeout(now()) {
                    break format!("{e}");
                }
            },
        }
    };
    // Refuse new commands first, so that whoever sees a monitor end also sees the client closed.
    rx.close();
    let _ = wr.shutdown().await;
    for (method, reply) in d.core.drain_pending() {
        let e = if method == "transact" {
            Error::OutcomeUnknown(reason.clone())
        } else {
            Error::Disconnected(reason.clone())
        };
        let _ = reply.send(Err(e));
    }
    // Commands still queued were never sent: their replies are dropped (Disconnected).
    while let Ok(c) = rx.try_recv() {
        drop(c);
    }
    // Dropping the subscribers ends the monitor streams.
    drop(d);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remotes() {
        assert_eq!(
            Remote::parse("unix:/a/b").unwrap(),
            Remote::Unix("/a/b".into())
        );
        assert_eq!(
            Remote::parse("tcp:127.0.0.1:6641").unwrap(),
            Remote::Tcp("127.0.0.1:6641".into())
        );
        assert_eq!(
            Remote::parse("tcp:[::1]:6641").unwrap(),
            Remote::Tcp("[::1]:6641".into())
        );
        assert!(Remote::parse("tcp:1.2.3.4").is_err());
        assert_eq!(
            Remote::parse("ssl:1.2.3.4:6641").is_ok(),
            cfg!(feature = "ssl")
        );
        assert!(Remote::parse("ssl:1.2.3.4").is_err());
        assert!(Remote::parse("punix:/x").is_err());
        assert_eq!(Remote::parse_list("tcp:a:1, tcp:b:2").unwrap().len(), 2);
        assert_eq!(Remote::parse("unix:/x").unwrap().to_string(), "unix:/x");
    }
}
