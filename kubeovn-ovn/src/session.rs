//! A reconnecting session over a list of remotes, with optional raft leader preference.
//!
//! A [`Client`] is one connection: when it dies, it stays dead. A [`Session`] keeps a current client and makes a
//! new one when needed, trying the remotes of its list in turn (starting after the one that failed) and
//! waiting with exponential [`Backoff`] after each full pass. With [`SessionBuilder::leader_only`] it reads the
//! `_Server` database of each member it reaches and keeps only the leader of a clustered database (a
//! standalone database is always accepted); it then watches `_Server` and drops the connection when the member
//! stops being the leader or loses its cluster, so the next request (and a [`crate::cache::Cache`] started with
//! [`crate::cache::CacheBuilder::start_session`]) reconnects to the new leader.
//!
//! Time: every wait here (backoff, retry deadline, connect timeout) and in the cache's resume loop is on
//! tokio's clock (`tokio::time`), which is the injectable clock: tests pause it
//! (`#[tokio::test(start_paused = true)]`) and the runtime jumps to the next timer when all tasks are idle,
//! so a backoff schedule of seconds runs deterministically in microseconds (see the tests below). The
//! protocol core ([`crate::conn`]) takes the time as a parameter instead.
//!
//! Requests are never retried by the session: a transaction whose connection died before its reply is an
//! [`Error::OutcomeUnknown`], for the caller to check.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kubeovn_ovn::Error> {
//! use kubeovn_ovn::session::Session;
//! let s = Session::builder("unix:/run/a.sock,unix:/run/b.sock,unix:/run/c.sock")?
//!     .leader_only("OVN_Northbound")
//!     .connect()
//!     .await?;
//! let client = s.client().await?;
//! println!("{}", client.remote());
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::client::{Client, ClientBuilder, Remote};
use crate::datum::{Atom, Datum};
use crate::error::Error;
use crate::monitor::{MonitorRequest, MonitorRequests};
use crate::ops::{Condition, Operation, Row, Transaction};

/// Exponential backoff between passes over the remote list: `initial`, then multiplied by `factor` up to
/// `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first delay.
    pub initial: Duration,
    /// The largest delay.
    pub max: Duration,
    /// The multiplier (at least 1).
    pub factor: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(8),
            factor: 2,
        }
    }
}

impl Backoff {
    /// The delay after `attempt` failed passes (0: the first).
    pub fn delay(&self, attempt: u32) -> Duration {
        let mut d = self.initial;
        for _ in 0..attempt {
            if d >= self.max {
                break;
            }
            d = d.saturating_mul(self.factor.max(1));
        }
        d.min(self.max)
    }
}

/// A database's row of the `_Server` database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseStatus {
    /// The database.
    pub name: String,
    /// `standalone`, `clustered` or `relay`.
    pub model: String,
    /// Whether the member is connected to its cluster (always true for standalone).
    pub connected: bool,
    /// Whether the member is the leader (always true for standalone).
    pub leader: bool,
}

impl DatabaseStatus {
    fn from_row(r: &Row) -> Option<Self> {
        let s = |c: &str| match r.get(c) {
            Some(Datum::Atom(Atom::String(s))) => Some(s.clone()),
            _ => None,
        };
        let b = |c: &str| match r.get(c) {
            Some(Datum::Atom(Atom::Boolean(b))) => *b,
            Some(Datum::Set(v)) => matches!(v.first(), Some(Atom::Boolean(true))),
            _ => false,
        };
        Some(DatabaseStatus {
            name: s("name")?,
            model: s("model").unwrap_or_default(),
            connected: b("connected"),
            leader: b("leader"),
        })
    }

    /// Whether a leader-only client may use this member for writes.
    pub fn is_writable_leader(&self) -> bool {
        self.model != "clustered" || (self.leader && self.connected)
    }
}

/// Reads `db`'s row of the server's `_Server` database.
pub async fn database_status(client: &Client, db: &str) -> Result<DatabaseStatus, Error> {
    let txn = Transaction::new("_Server")
        .op(Operation::select("Database").filter(Condition::eq("name", db)));
    let r = client.transact(&txn).await?;
    r.first()
        .and_then(|r| r.rows())
        .and_then(|rows| rows.first())
        .and_then(DatabaseStatus::from_row)
        .ok_or_else(|| Error::Protocol {
            method: "transact",
            what: format!("no database {db} in _Server"),
        })
}

/// Settings of a [`Session`].
#[derive(Debug, Clone)]
pub struct SessionBuilder {
    remotes: Vec<Remote>,
    client: ClientBuilder,
    backoff: Backoff,
    leader_only: Option<String>,
    retry_for: Option<Duration>,
}

impl SessionBuilder {
    /// Settings of each connection.
    pub fn client(mut self, b: ClientBuilder) -> Self {
        self.client = b;
        self
    }

    /// Delays between passes over the remotes.
    pub fn backoff(mut self, b: Backoff) -> Self {
        self.backoff = b;
        self
    }

    /// Only the leader of clustered database `db` is used; the connection is dropped when it stops leading.
    pub fn leader_only(mut self, db: impl Into<String>) -> Self {
        self.leader_only = Some(db.into());
        self
    }

    /// How long [`Session::client`] (and the first connect) keeps trying before it fails (None: for ever;
    /// default 30 s).
    pub fn retry_for(mut self, d: Option<Duration>) -> Self {
        self.retry_for = d;
        self
    }

    /// Connects (retrying as configured).
    pub async fn connect(self) -> Result<Session, Error> {
        let (shutdown, _) = watch::channel(false);
        let s = Session {
            inner: Arc::new(Inner {
                remotes: self.remotes,
                client: self.client,
                backoff: self.backoff,
                leader_only: self.leader_only,
                retry_for: self.retry_for,
                current: Mutex::new(None),
                next: AtomicUsize::new(0),
                connecting: tokio::sync::Mutex::new(()),
                connects: AtomicU64::new(0),
                shutdown,
            }),
        };
        s.client().await?;
        Ok(s)
    }
}

struct Inner {
    remotes: Vec<Remote>,
    client: ClientBuilder,
    backoff: Backoff,
    leader_only: Option<String>,
    retry_for: Option<Duration>,
    current: Mutex<Option<Client>>,
    next: AtomicUsize,
    connecting: tokio::sync::Mutex<()>,
    connects: AtomicU64,
    shutdown: watch::Sender<bool>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
        if let Ok(mut c) = self.current.lock() {
            if let Some(c) = c.take() {
                c.close("session dropped");
            }
        }
    }
}

/// A reconnecting handle over a list of remotes; cheap to clone.
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("remotes", &self.inner.remotes)
            .field("leader_only", &self.inner.leader_only)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Settings for a session over the comma-separated `remotes`.
    pub fn builder(remotes: &str) -> Result<SessionBuilder, Error> {
        let remotes = Remote::parse_list(remotes)?;
        if remotes.is_empty() {
            return Err(Error::InvalidRemote {
                remote: String::new(),
                why: "no remote given",
            });
        }
        Ok(SessionBuilder {
            remotes,
            client: ClientBuilder::default(),
            backoff: Backoff::default(),
            leader_only: None,
            retry_for: Some(Duration::from_secs(30)),
        })
    }

    /// Connects with default settings.
    pub async fn connect(remotes: &str) -> Result<Session, Error> {
        Self::builder(remotes)?.connect().await
    }

    /// The current connection if it is up.
    pub fn current(&self) -> Option<Client> {
        let c = self.inner.current.lock().ok()?;
        c.as_ref().filter(|c| !c.is_closed()).cloned()
    }

    /// How many connections this session has made.
    pub fn connects(&self) -> u64 {
        self.inner.connects.load(Ordering::Relaxed)
    }

    /// The backoff between passes over the remotes (also used by caches resuming on this session).
    pub fn backoff(&self) -> Backoff {
        self.inner.backoff
    }

    /// The database whose leader this session insists on, if any.
    pub fn leader_only_db(&self) -> Option<&str> {
        self.inner.leader_only.as_deref()
    }

    /// The current connection, or a new one (trying for as long as configured).
    pub async fn client(&self) -> Result<Client, Error> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        self.reconnect(self.inner.retry_for).await
    }

    /// The current connection, or a new one, trying for ever (for background tasks).
    pub async fn client_forever(&self) -> Result<Client, Error> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        self.reconnect(None).await
    }

    async fn reconnect(&self, retry_for: Option<Duration>) -> Result<Client, Error> {
        let deadline = retry_for.map(|d| tokio::time::Instant::now() + d);
        // One connector at a time; a caller with a deadline does not wait for ever behind one without.
        let _g = match deadline {
            Some(dl) => tokio::time::timeout_at(dl, self.inner.connecting.lock())
                .await
                .map_err(|_| Error::Disconnected("no connection within the retry time".into()))?,
            None => self.inner.connecting.lock().await,
        };
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let n = self.inner.remotes.len();
        let mut attempt = 0u32;
        loop {
            let mut last = None;
            for _ in 0..n {
                let i = self.inner.next.fetch_add(1, Ordering::Relaxed) % n;
                match self.try_one(&self.inner.remotes[i]).await {
                    Ok(c) => {
                        // Next time, start with this one again.
                        self.inner.next.store(i, Ordering::Relaxed);
                        if let Ok(mut cur) = self.inner.current.lock() {
                            *cur = Some(c.clone());
                        }
                        self.inner.connects.fetch_add(1, Ordering::Relaxed);
                        return Ok(c);
                    }
                    Err(e) => last = Some(e),
                }
            }
            let d = self.inner.backoff.delay(attempt);
            attempt = attempt.saturating_add(1);
            if let Some(dl) = deadline {
                if tokio::time::Instant::now() + d > dl {
                    return Err(last.unwrap_or(Error::Disconnected("no remote".into())));
                }
            }
            tokio::time::sleep(d).await;
        }
    }

    async fn try_one(&self, r: &Remote) -> Result<Client, Error> {
        let c = self.inner.client.connect_remote(r).await?;
        let Some(db) = &self.inner.leader_only else {
            return Ok(c);
        };
        let st = match database_status(&c, db).await {
            Ok(st) => st,
            Err(e) => {
                c.close("status query failed");
                return Err(e);
            }
        };
        if !st.is_writable_leader() {
            c.close("not the leader");
            return Err(Error::NotLeader {
                remote: r.to_string(),
                db: db.clone(),
            });
        }
        if st.model == "clustered" {
            self.watch_leadership(&c, db).await?;
        }
        Ok(c)
    }

    /// Monitors `_Server.Database` on `c` and closes `c` when it stops being a writable leader of `db`.
    async fn watch_leadership(&self, c: &Client, db: &str) -> Result<(), Error> {
        let req = MonitorRequests::new().table(
            "Database",
            MonitorRequest::all().columns(["name", "model", "connected", "leader"]),
        );
        let (_, mut stream) = match c.monitor("_Server", &req).await {
            Ok(x) => x,
            Err(e) => {
                c.close("_Server monitor failed");
                return Err(e);
            }
        };
        let client = c.clone();
        let db = db.to_owned();
        let mut shutdown = self.inner.shutdown.subscribe();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    u = stream.next() => {
                        let Some(Ok(_)) = u else { return };
                        match database_status(&client, &db).await {
                            Ok(st) if st.is_writable_leader() => {}
                            _ => {
                                client.close("no longer the leader");
                                return;
                            }
                        }
                    }
                    _ = shutdown.changed() => return,
                }
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_max() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(1000),
            factor: 2,
        };
        let v: Vec<u64> = (0..6).map(|i| b.delay(i).as_millis() as u64).collect();
        assert_eq!(v, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.delay(u32::MAX), Duration::from_millis(1000));
        let flat = Backoff { factor: 0, ..b };
        assert_eq!(flat.delay(5), Duration::from_millis(100));
    }

    #[test]
    fn status_row() {
        let mut r = Row::new();
        r.insert("name".into(), Datum::from("OVN_Northbound"));
        r.insert("model".into(), Datum::from("clustered"));
        r.insert("connected".into(), Datum::Atom(Atom::Boolean(true)));
        r.insert("leader".into(), Datum::Atom(Atom::Boolean(false)));
        let st = DatabaseStatus::from_row(&r).unwrap();
        assert!(!st.is_writable_leader());
        r.insert("model".into(), Datum::from("standalone"));
        assert!(DatabaseStatus::from_row(&r).unwrap().is_writable_leader());
    }

    #[tokio::test]
    async fn gives_up_after_retry_for() {
        let s = Session::builder("unix:/nonexistent/a.sock,unix:/nonexistent/b.sock")
            .unwrap()
            .backoff(Backoff {
                initial: Duration::from_millis(10),
                max: Duration::from_millis(20),
                factor: 2,
            })
            .retry_for(Some(Duration::from_millis(100)))
            .connect()
            .await;
        assert!(matches!(s, Err(Error::Io { .. })), "{s:?}");
    }

    fn backoff_1_2_4() -> Backoff {
        Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(4),
            factor: 2,
        }
    }

    /// The backoff schedule on a paused clock: passes at 0, 1, 3 and 7 s; the next wait (4 s) would pass the
    /// 10 s retry time, so the session gives up at exactly 7 s of tokio time, without sleeping.
    #[tokio::test(start_paused = true)]
    async fn backoff_schedule_on_a_paused_clock() {
        let (start, wall) = (tokio::time::Instant::now(), std::time::Instant::now());
        let s = Session::builder("unix:/nonexistent/kubeovn-backoff.sock")
            .unwrap()
            .backoff(backoff_1_2_4())
            .retry_for(Some(Duration::from_secs(10)))
            .connect()
            .await;
        assert!(matches!(s, Err(Error::Io { .. })), "{s:?}");
        assert_eq!(start.elapsed(), Duration::from_secs(7));
        assert!(
            wall.elapsed() < Duration::from_secs(2),
            "{:?}",
            wall.elapsed()
        );
    }

    /// A server that appears at 5 s is reached by the pass at 7 s (0, 1, 3, 7), on a paused clock.
    #[tokio::test(start_paused = true)]
    async fn reconnects_when_the_server_appears() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("late.sock");
        let remote = format!("unix:{}", sock.display());
        let (start, wall) = (tokio::time::Instant::now(), std::time::Instant::now());
        let server = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let l = tokio::net::UnixListener::bind(&sock).unwrap();
            let bound = tokio::time::Instant::now();
            let (conn, _) = l.accept().await.unwrap();
            (bound, conn)
        });
        let s = Session::builder(&remote)
            .unwrap()
            .backoff(backoff_1_2_4())
            .retry_for(Some(Duration::from_secs(60)))
            .connect()
            .await
            .unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(7));
        assert_eq!(s.connects(), 1);
        let (bound, _conn) = server.await.unwrap();
        assert_eq!(bound - start, Duration::from_secs(5));
        assert!(
            wall.elapsed() < Duration::from_secs(2),
            "{:?}",
            wall.elapsed()
        );
    }
}

#[cfg(test)]
mod server_tests {
    use super::*;

    /// A caller with a deadline is not held up by a background reconnect that tries for ever: on a paused
    /// clock, it gives up at exactly its retry time while the background task still holds the connector
    /// lock and goes on trying.
    #[tokio::test(start_paused = true)]
    async fn deadline_is_kept_behind_a_background_reconnect() {
        let dir = std::env::temp_dir().join(format!("kubeovn-ovn-session-{}", std::process::id()));
        let sock = dir.join("none.sock");
        let remote = format!("unix:{}", sock.display());
        let inner = Arc::new(Inner {
            remotes: Remote::parse_list(&remote).unwrap(),
            client: ClientBuilder::default(),
            backoff: Backoff {
                initial: Duration::from_millis(50),
                max: Duration::from_millis(50),
                factor: 1,
            },
            leader_only: None,
            retry_for: Some(Duration::from_millis(200)),
            current: Mutex::new(None),
            next: AtomicUsize::new(0),
            connecting: tokio::sync::Mutex::new(()),
            connects: AtomicU64::new(0),
            shutdown: watch::channel(false).0,
        });
        let s = Session { inner };
        let bg = {
            let s = s.clone();
            tokio::spawn(async move { s.client_forever().await })
        };
        // The barrier: the background task holds the connector lock (it takes it before its first attempt
        // and keeps it between passes).
        let mut polls = 0;
        while s.inner.connecting.try_lock().is_ok() {
            polls += 1;
            assert!(polls < 100, "the background reconnect never took the lock");
            tokio::task::yield_now().await;
        }
        let (t0, wall) = (tokio::time::Instant::now(), std::time::Instant::now());
        let e = s.client().await.unwrap_err();
        assert!(matches!(e, Error::Disconnected(_)), "{e:?}");
        assert_eq!(t0.elapsed(), Duration::from_millis(200));
        assert!(
            wall.elapsed() < Duration::from_secs(2),
            "{:?}",
            wall.elapsed()
        );
        // The background reconnect is still at it.
        assert!(s.inner.connecting.try_lock().is_err() && !bg.is_finished());
        assert_eq!(s.connects(), 0);
        bg.abort();
    }
}

/// The connection a high-level API writes on: with a session, its current (or a new) connection once the
/// replica follows that very connection ([`crate::cache::Cache::follows`]), since a write is planned against
/// the replica: after a transaction whose outcome is unknown, the next plan is made on a replica resumed on a
/// newer connection, which shows whether it committed, so it is re-checked instead of blindly resent. The
/// replica shows what committed before the new connection's snapshot: a request the old server still held
/// (unread in its socket, or a stalled former raft leader's) can commit after it, so inserts into tables
/// without a unique index are not yet proof against that case. Without a session, the fixed client.
pub(crate) async fn write_client(
    session: Option<&Session>,
    fixed: &Client,
    cache: &crate::cache::Cache,
    wait: Duration,
) -> Result<Client, Error> {
    let Some(s) = session else {
        return Ok(fixed.clone());
    };
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if !cache.wait_online(left).await {
            return Err(Error::Disconnected("the replica is resynchronising".into()));
        }
        let c = s.client().await?;
        if cache.follows(&c) {
            return Ok(c);
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if cache.wait_follows(&c, left).await {
            return Ok(c);
        }
        if !c.is_closed() || tokio::time::Instant::now() >= deadline {
            return Err(Error::Disconnected(
                "the replica did not resume on the current connection in time".into(),
            ));
        }
        // That connection died before the replica moved to it: try the next one.
    }
}
