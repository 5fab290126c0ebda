//! An in-memory OVSDB server for tests: the databases of a schema held in memory, served over in-process
//! streams (or a unix socket) with the JSON-RPC methods the [`Client`] uses, so that the real
//! [`OvsdbNorthbound`] (planner and [`crate::cache::Cache`]) and [`OvsdbOpenVSwitch`] run unchanged without
//! an `ovsdb-server` process.
//!
//! Transactions are executed as ovsdb-server executes them (see `engine`): named uuids, conditions,
//! mutations, strong and weak references, garbage collection of unreferenced rows of non-root tables, row
//! limits, unique indexes, `wait` (blocking until satisfied or timed out) and `assert` on locks, with the
//! server's error tags and texts. Monitors (`monitor`, `monitor_cond`, `monitor_cond_since` with `update`,
//! `update2`, `update3`, `monitor_cond_change`, `monitor_cancel`), `lock`/`steal`/`unlock`, `echo`,
//! `list_dbs`, `get_schema` and the `_Server` database (a standalone server) are served. Like a standalone
//! ovsdb-server it keeps no transaction history: `monitor_cond_since` after a reconnect returns everything.
//!
//! ```
//! # async fn demo() -> Result<(), kubeovn_ovn::Error> {
//! use kubeovn_ovn::memdb::MemDb;
//! use kubeovn_ovn::northbound::{LogicalSwitch, Northbound};
//! let db = MemDb::new_nb();
//! let nb = db.northbound().await?;
//! LogicalSwitch::new("ls0").execute(&nb).await?;
//! assert!(nb.switch("ls0").is_some());
//! assert_eq!(db.rows("Logical_Switch").len(), 1);
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
//! ```
//!
//! Faults for tests: [`MemDb::disconnect_all`] drops every connection (a [`crate::session::Session`] over
//! [`MemDb::listen_unix`] reconnects and its replica resynchronises), [`MemDb::drop_after_next_commit`] commits
//! the next transaction and drops its connection before the reply ([`Error::OutcomeUnknown`]).
//!
//! Creating a northbound database and connecting an [`OvsdbNorthbound`] to it (replica loaded) takes about
//! 1 ms in a debug build (printed by the `memdb_is_fast` test), so a unit test can make one per case.

mod engine;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::{json, Map, Value as Json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use crate::client::{Client, ClientBuilder};
use crate::datum::Datum;
use crate::error::Error;
use crate::framing::{encode_error_response, encode_response, FrameDecoder, Message};
use crate::northbound::OvsdbNorthbound;
use crate::ops::Row;
use crate::schema::{DatabaseSchema, TableSchema};
use crate::uuid::Uuid;
use crate::vswitch::OvsdbOpenVSwitch;

use engine::{Changes, Clause, Db, Outcome, OvsErr, Rec, UuidGen};

/// The `_Server` database's schema (as ovsdb-server 3.x serves it).
const SERVER_SCHEMA: &str = r#"{"name":"_Server","version":"1.2.0","tables":{"Database":{"columns":{
"name":{"type":"string"},
"model":{"type":{"key":{"type":"string","enum":["set",["clustered","relay","standalone"]]}}},
"connected":{"type":"boolean"},
"leader":{"type":"boolean"},
"schema":{"type":{"key":{"type":"string"},"min":0,"max":1}},
"cid":{"type":{"key":{"type":"uuid"},"min":0,"max":1}},
"sid":{"type":{"key":{"type":"uuid"},"min":0,"max":1}},
"index":{"type":{"key":{"type":"integer"},"min":0,"max":1}}}}}}"#;

/// A parsed schema, its JSON and its text (for `_Server`), parsed once per process for the shipped schemas.
type Parsed = (Arc<DatabaseSchema>, Arc<Json>, Arc<str>);

fn parse_schema(text: &str) -> Result<Parsed, Error> {
    let j: Json = serde_json::from_str(text)?;
    let s = DatabaseSchema::parse(&j)?;
    Ok((Arc::new(s), Arc::new(j), Arc::from(text)))
}

fn shipped(cell: &'static OnceLock<Parsed>, text: &'static str) -> Parsed {
    cell.get_or_init(|| {
        // The shipped schemas parse (tested in schema.rs); an empty schema keeps this infallible.
        parse_schema(text).unwrap_or_else(|_| {
            (
                Arc::new(DatabaseSchema {
                    name: String::new(),
                    version: String::new(),
                    cksum: None,
                    tables: BTreeMap::new(),
                }),
                Arc::new(Json::Null),
                Arc::from(""),
            )
        })
    })
    .clone()
}

static NB: OnceLock<Parsed> = OnceLock::new();
static OVS: OnceLock<Parsed> = OnceLock::new();
static SERVER: OnceLock<Parsed> = OnceLock::new();

/// Tells each MemDb a different seed, so that two of them do not hand out the same uuids.
static SEED: AtomicU64 = AtomicU64::new(0x6b75_6265_6f76_6e00);

/// One monitor of one connection.
#[derive(Debug)]
struct Monitor {
    db: String,
    /// "update", "update2" or "update3".
    method: &'static str,
    tables: BTreeMap<String, MonTable>,
}

#[derive(Debug, Clone)]
struct MonTable {
    columns: Vec<String>,
    conditions: Vec<Clause>,
    initial: bool,
    insert: bool,
    delete: bool,
    modify: bool,
}

/// What a connection's task is told to do.
#[derive(Debug)]
enum Out {
    /// Write these bytes (one or more JSON-RPC messages).
    Bytes(Vec<u8>),
    /// Drop the connection.
    Close,
}

#[derive(Debug)]
struct Conn {
    tx: mpsc::UnboundedSender<Out>,
    /// By the monitor id's JSON text.
    monitors: HashMap<String, Monitor>,
}

#[derive(Debug)]
struct Core {
    dbs: BTreeMap<String, Db>,
    conns: HashMap<u64, Conn>,
    next_conn: u64,
    /// Lock name -> connections asking, the owner first.
    locks: BTreeMap<String, VecDeque<u64>>,
    gen: UuidGen,
    drop_after_commit: bool,
}

#[derive(Debug)]
struct Shared {
    core: Mutex<Core>,
    commits: watch::Sender<u64>,
}

/// An in-memory OVSDB server holding one database (and `_Server`); cheap to clone, all clones share it.
#[derive(Debug, Clone)]
pub struct MemDb {
    shared: Arc<Shared>,
    db: String,
}

impl MemDb {
    /// A server holding an empty database of the schema `schema_json` (the text of an `.ovsschema` file).
    pub fn new(schema_json: &str) -> Result<MemDb, Error> {
        Ok(Self::from_parsed(parse_schema(schema_json)?))
    }

    /// An empty `OVN_Northbound` database of the shipped schema.
    pub fn new_nb() -> MemDb {
        Self::from_parsed(shipped(&NB, include_str!("../../schemas/ovn-nb.ovsschema")))
    }

    /// An `Open_vSwitch` database of the shipped schema with its root row, as `ovs-vsctl init` leaves it.
    pub fn new_ovs() -> MemDb {
        let db = Self::from_parsed(shipped(
            &OVS,
            include_str!("../../schemas/vswitch.ovsschema"),
        ));
        let r = db.transact(&json!([
            "Open_vSwitch",
            {"op": "insert", "table": "Open_vSwitch", "row": {}}
        ]));
        debug_assert!(r[0].get("uuid").is_some(), "{r}");
        db
    }

    fn from_parsed((schema, schema_json, text): Parsed) -> MemDb {
        let name = schema.name.clone();
        let mut dbs = BTreeMap::new();
        let (ss, sj, _) = shipped(&SERVER, SERVER_SCHEMA);
        let mut server = Db::new(ss, sj);
        let seed = SEED.fetch_add(0x9e37_79b9, Ordering::Relaxed);
        let mut gen = UuidGen::new(seed);
        let status = json!(["_Server", {"op": "insert", "table": "Database", "row": {
            "name": name, "model": "standalone", "connected": true, "leader": true,
            "schema": &*text,
        }}]);
        // ovsdb-server's own row for _Server too.
        let own = json!(["_Server", {"op": "insert", "table": "Database", "row": {
            "name": "_Server", "model": "standalone", "connected": true, "leader": true,
            "schema": SERVER_SCHEMA,
        }}]);
        for t in [status, own] {
            if let Some(ops) = t.as_array() {
                // The reserved database refuses writes from clients, not from here: insert directly.
                insert_server_row(&mut server, &ops[1], &mut gen);
            }
        }
        dbs.insert("_Server".to_owned(), server);
        dbs.insert(name.clone(), Db::new(schema, schema_json));
        MemDb {
            shared: Arc::new(Shared {
                core: Mutex::new(Core {
                    dbs,
                    conns: HashMap::new(),
                    next_conn: 1,
                    locks: BTreeMap::new(),
                    gen,
                    drop_after_commit: false,
                }),
                commits: watch::Sender::new(0),
            }),
            db: name,
        }
    }

    fn core(&self) -> std::sync::MutexGuard<'_, Core> {
        lock_core(&self.shared)
    }

    /// The database's name (`OVN_Northbound`, ...).
    pub fn db_name(&self) -> &str {
        &self.db
    }

    /// The database's schema.
    pub fn schema(&self) -> Arc<DatabaseSchema> {
        self.core().dbs[&self.db].schema.clone()
    }

    /// A new client connected over an in-process stream (needs a tokio runtime). The client already knows the
    /// schema, so that nothing waits for `get_schema`.
    pub fn connect(&self) -> Client {
        self.connect_with(&ClientBuilder::default())
    }

    /// Like [`MemDb::connect`] with the given connection settings.
    pub fn connect_with(&self, builder: &ClientBuilder) -> Client {
        let (a, b) = tokio::io::duplex(256 * 1024);
        self.serve(b);
        let c = builder.with_stream(a, format!("memdb:{}", self.db));
        c.set_schema(self.schema());
        c
    }

    /// An [`OvsdbNorthbound`] over a new connection (an `OVN_Northbound` database).
    pub async fn northbound(&self) -> Result<OvsdbNorthbound, Error> {
        OvsdbNorthbound::with_client(self.connect(), &[]).await
    }

    /// An [`OvsdbOpenVSwitch`] over a new connection (an `Open_vSwitch` database).
    pub async fn open_vswitch(&self) -> Result<OvsdbOpenVSwitch, Error> {
        OvsdbOpenVSwitch::with_client(self.connect()).await
    }

    /// Serves connections on a unix socket at `path` (for a [`crate::session::Session`], which reconnects
    /// after [`MemDb::disconnect_all`]) until the MemDb is dropped; returns the remote, `unix:PATH`.
    pub fn listen_unix(&self, path: &Path) -> Result<String, Error> {
        let remote = format!("unix:{}", path.display());
        let io = |source| Error::Io {
            remote: remote.clone(),
            source,
        };
        let l = tokio::net::UnixListener::bind(path).map_err(io)?;
        let weak = Arc::downgrade(&self.shared);
        // Ends (closing the socket) when the last MemDb handle and connection are gone.
        let mut gone = self.shared.commits.subscribe();
        let db = self.db.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    a = l.accept() => {
                        let (Ok((s, _)), Some(shared)) = (a, weak.upgrade()) else { return };
                        MemDb { shared, db: db.clone() }.serve(s);
                    }
                    c = gone.changed() => if c.is_err() { return },
                }
            }
        });
        Ok(remote)
    }

    /// Serves one connection over `stream` (needs a tokio runtime).
    pub fn serve<S>(&self, stream: S)
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = {
            let mut core = self.core();
            let id = core.next_conn;
            core.next_conn += 1;
            core.conns.insert(
                id,
                Conn {
                    tx,
                    monitors: HashMap::new(),
                },
            );
            id
        };
        tokio::spawn(serve(self.shared.clone(), id, stream, rx));
    }

    /// Drops every connection now (as a server restart would, without losing the data).
    pub fn disconnect_all(&self) {
        for c in self.core().conns.values() {
            let _ = c.tx.send(Out::Close);
        }
    }

    /// The next transaction that commits something also drops its connection instead of replying: the
    /// client sees [`Error::OutcomeUnknown`] for a transaction that did commit.
    pub fn drop_after_next_commit(&self) {
        self.core().drop_after_commit = true;
    }

    /// How many connections are open.
    pub fn connections(&self) -> usize {
        self.core().conns.len()
    }

    /// Runs `transact` params (`[db, op, ...]`) directly, as a connected client would, and returns the
    /// result array (or an error object); monitors see the changes.
    pub fn transact(&self, params: &Json) -> Json {
        let mut core = self.core();
        match run_transact(&mut core, &self.shared, 0, params, 0) {
            Ok(Some((results, _))) => results,
            Ok(None) => {
                OvsErr::new("not supported", "a blocking wait outside a connection").to_json()
            }
            Err(e) => e.to_json(),
        }
    }

    /// Every row of `table`: its uuid and declared columns (an empty list for an unknown table).
    pub fn rows(&self, table: &str) -> Vec<(Uuid, Row)> {
        let core = self.core();
        core.dbs[&self.db]
            .table(table)
            .map(|t| t.iter().map(|(u, r)| (*u, r.cols.clone())).collect())
            .unwrap_or_default()
    }
}

fn insert_server_row(db: &mut Db, op: &Json, gen: &mut UuidGen) {
    let Some(ts) = db.schema.table("Database").cloned() else {
        return;
    };
    let mut cols: engine::Cols = ts
        .columns
        .values()
        .map(|c| (c.name.clone(), engine::default_datum(&c.ty)))
        .collect();
    if let Some(row) = op.get("row").and_then(Json::as_object) {
        for (c, v) in row {
            if let Some(cs) = ts.columns.get(c) {
                if let Ok(d) = Datum::from_json_typed(v, &cs.ty) {
                    cols.insert(c.clone(), d);
                }
            }
        }
    }
    let t = Arc::make_mut(db.tables.entry("Database".to_owned()).or_default());
    t.insert(
        gen.uuid(),
        Arc::new(Rec {
            version: gen.uuid(),
            cols,
        }),
    );
}

/// Runs a transact request: the results and whether to drop the connection instead of replying, or None
/// when it blocks on a `wait`.
fn run_transact(
    core: &mut Core,
    shared: &Shared,
    conn: u64,
    params: &Json,
    elapsed_ms: u64,
) -> Result<Option<(Json, bool)>, OvsErr> {
    let arr = params
        .as_array()
        .ok_or_else(|| OvsErr::new("syntax error", "array expected"))?;
    let name = arr.first().and_then(Json::as_str).unwrap_or("");
    let Core {
        dbs, gen, locks, ..
    } = core;
    let Some(db) = dbs.get_mut(name) else {
        return Err(OvsErr::new(
            "unknown database",
            format!("transact request specifies unknown database {name}"),
        ));
    };
    let owns = |l: &str| locks.get(l).and_then(|q| q.front()) == Some(&conn);
    match db.transact(&arr[1..], elapsed_ms, gen, &owns) {
        Outcome::Blocked => Ok(None),
        Outcome::Done { results, changes } => {
            if !changes.is_empty() {
                publish(core, name, &changes);
                shared.commits.send_modify(|n| *n += 1);
            }
            let drop = !changes.is_empty() && std::mem::take(&mut core.drop_after_commit);
            Ok(Some((results, drop)))
        }
    }
}

/// Sends the changes of a commit to every monitor of `db`.
fn publish(core: &Core, db: &str, changes: &Changes) {
    let Some(d) = core.dbs.get(db) else { return };
    for conn in core.conns.values() {
        for (id, m) in &conn.monitors {
            if m.db != db {
                continue;
            }
            let updates = compose(&d.schema, m, changes);
            if updates.is_empty() {
                continue;
            }
            let mon: Json = serde_json::from_str(id).unwrap_or(Json::Null);
            let params = match m.method {
                "update3" => json!([mon, Uuid::NIL.to_string(), Json::Object(updates)]),
                _ => json!([mon, Json::Object(updates)]),
            };
            let mut out = Vec::new();
            Message::Notification {
                method: m.method.to_owned(),
                params,
            }
            .encode(&mut out);
            let _ = conn.tx.send(Out::Bytes(out));
        }
    }
}

/// A monitored column's value: a declared column, or `_version`.
fn col<'r>(r: &'r Rec, c: &str) -> Option<Cow<'r, Datum>> {
    match c {
        "_version" => Some(Cow::Owned(Datum::uuid(r.version))),
        c => r.cols.get(c).map(Cow::Borrowed),
    }
}

fn cols_json(r: &Rec, columns: &[String], ts: &TableSchema, skip_defaults: bool) -> Json {
    let mut m = Map::new();
    for c in columns {
        let (Some(d), Some(cs)) = (col(r, c), ts.column(c)) else {
            continue;
        };
        if skip_defaults && engine::is_default(&d, &cs.ty) {
            continue;
        }
        m.insert(c.clone(), engine::datum_json(&d));
    }
    Json::Object(m)
}

/// The table updates one monitor gets for `changes`.
fn compose(schema: &DatabaseSchema, m: &Monitor, changes: &Changes) -> Map<String, Json> {
    let v2 = m.method != "update";
    let mut out = Map::new();
    for (t, mt) in &m.tables {
        let (Some(rows), Some(ts)) = (changes.get(t), schema.table(t)) else {
            continue;
        };
        let mut tu = Map::new();
        for (u, (old, new)) in rows {
            let seen_old = old.as_ref().filter(|o| engine::eval(*u, o, &mt.conditions));
            let seen_new = new.as_ref().filter(|n| engine::eval(*u, n, &mt.conditions));
            let upd = match (seen_old, seen_new) {
                (None, Some(n)) if mt.insert => {
                    if v2 {
                        json!({"insert": cols_json(n, &mt.columns, ts, true)})
                    } else {
                        json!({"new": cols_json(n, &mt.columns, ts, false)})
                    }
                }
                (Some(o), None) if mt.delete => {
                    if v2 {
                        json!({"delete": null})
                    } else {
                        json!({"old": cols_json(o, &mt.columns, ts, false)})
                    }
                }
                (Some(o), Some(n)) if mt.modify => {
                    let changed: Vec<String> = mt
                        .columns
                        .iter()
                        .filter(|c| col(o, c) != col(n, c))
                        .cloned()
                        .collect();
                    if changed.is_empty() {
                        continue;
                    }
                    if v2 {
                        let mut d = Map::new();
                        for c in &changed {
                            let (Some(ov), Some(nv), Some(cs)) =
                                (col(o, c), col(n, c), ts.column(c))
                            else {
                                continue;
                            };
                            d.insert(c.clone(), engine::diff(&ov, &nv, &cs.ty).to_json());
                        }
                        json!({"modify": d})
                    } else {
                        json!({"old": cols_json(o, &changed, ts, false), "new": cols_json(n, &mt.columns, ts, false)})
                    }
                }
                _ => continue,
            };
            tu.insert(u.to_string(), upd);
        }
        if !tu.is_empty() {
            out.insert(t.clone(), Json::Object(tu));
        }
    }
    out
}

/// The initial contents one monitor reports.
fn initial(db: &Db, m: &Monitor) -> Map<String, Json> {
    let v2 = m.method != "update";
    let mut out = Map::new();
    for (t, mt) in &m.tables {
        if !mt.initial {
            continue;
        }
        let (Some(rows), Some(ts)) = (db.table(t), db.schema.table(t)) else {
            continue;
        };
        let mut tu = Map::new();
        for (u, r) in rows {
            if !engine::eval(*u, r, &mt.conditions) {
                continue;
            }
            let v = if v2 {
                json!({"initial": cols_json(r, &mt.columns, ts, true)})
            } else {
                json!({"new": cols_json(r, &mt.columns, ts, false)})
            };
            tu.insert(u.to_string(), v);
        }
        if !tu.is_empty() {
            out.insert(t.clone(), Json::Object(tu));
        }
    }
    out
}

fn parse_requests(
    db: &Db,
    j: &Json,
    conditional: bool,
) -> Result<BTreeMap<String, MonTable>, OvsErr> {
    let o = j
        .as_object()
        .ok_or_else(|| OvsErr::new("syntax error", "monitor requests must be an object"))?;
    let mut out = BTreeMap::new();
    for (t, reqs) in o {
        let ts = db
            .schema
            .table(t)
            .ok_or_else(|| OvsErr::new("syntax error", format!("no table named {t}")))?;
        let list: Vec<&Json> = match reqs {
            Json::Array(a) => a.iter().collect(),
            r => vec![r],
        };
        let mut mt = MonTable {
            columns: Vec::new(),
            conditions: Vec::new(),
            initial: false,
            insert: false,
            delete: false,
            modify: false,
        };
        for r in list {
            let cols: Option<Vec<String>> = match r.get("columns") {
                None => None,
                Some(c) => Some(
                    c.as_array()
                        .ok_or_else(|| OvsErr::new("syntax error", "columns must be an array"))?
                        .iter()
                        .map(|c| {
                            let c = c.as_str().unwrap_or("");
                            ts.column(c).map(|_| c.to_owned()).ok_or_else(|| {
                                OvsErr::new(
                                    "syntax error",
                                    format!("{c} is not a valid column name"),
                                )
                            })
                        })
                        .collect::<Result<_, _>>()?,
                ),
            };
            // Without a column list the server also reports `_version`.
            let mut wanted = engine::monitored_columns(ts, cols.as_deref());
            if cols.is_none() {
                wanted.push("_version".to_owned());
            }
            for c in wanted {
                if !mt.columns.contains(&c) {
                    mt.columns.push(c);
                }
            }
            if conditional {
                if let Some(w) = r.get("where") {
                    mt.conditions = engine::parse_conditions(ts, &db.schema, w)?;
                }
            }
            let sel = r.get("select");
            let flag = |k: &str| {
                sel.and_then(|s| s.get(k))
                    .and_then(Json::as_bool)
                    .unwrap_or(true)
            };
            mt.initial |= flag("initial");
            mt.insert |= flag("insert");
            mt.delete |= flag("delete");
            mt.modify |= flag("modify");
        }
        out.insert(t.clone(), mt);
    }
    Ok(out)
}

/// A `transact` waiting for a `wait` operation.
struct Trigger {
    id: Json,
    params: Json,
    start: tokio::time::Instant,
    timeout_ms: Option<u64>,
}

fn reply(out: &mut Vec<u8>, id: &Json, r: Result<Json, OvsErr>) {
    match r {
        Ok(v) => encode_response(out, id, &v),
        Err(e) => encode_error_response(out, id, &e.to_json()),
    }
}

fn lock_notify(core: &Core, conn: u64, method: &str, name: &str) {
    if let Some(c) = core.conns.get(&conn) {
        let mut out = Vec::new();
        Message::Notification {
            method: method.to_owned(),
            params: json!([name]),
        }
        .encode(&mut out);
        let _ = c.tx.send(Out::Bytes(out));
    }
}

/// Handles one request and queues its reply (unless the transaction blocks on a `wait`, or the connection is
/// to be dropped instead of replying).
fn handle(
    shared: &Shared,
    conn: u64,
    id: &Json,
    method: &str,
    params: &Json,
    elapsed_ms: u64,
) -> Handled {
    let mut guard = lock_core(shared);
    let core = &mut *guard;
    let p = |i: usize| params.get(i).cloned().unwrap_or(Json::Null);
    let unknown_db = |name: &Json| {
        OvsErr::new(
            "unknown database",
            format!("{method} request specifies unknown database {name}"),
        )
    };
    let r: Result<Json, OvsErr> = match method {
        "echo" => Ok(params.clone()),
        "list_dbs" => Ok(json!(core.dbs.keys().collect::<Vec<_>>())),
        "get_schema" => match p(0).as_str().and_then(|n| core.dbs.get(n)) {
            Some(db) => Ok((*db.schema_json).clone()),
            None => Err(unknown_db(&p(0))),
        },
        "transact" => match run_transact(core, shared, conn, params, elapsed_ms) {
            Ok(None) => return Handled::Blocked,
            Ok(Some((_, true))) => return Handled::Drop,
            Ok(Some((r, false))) => Ok(r),
            Err(e) => Err(e),
        },
        "monitor" | "monitor_cond" | "monitor_cond_since" => {
            start_monitor(core, conn, method, &p(0), &p(1), &p(2))
        }
        "monitor_cond_change" => cond_change(core, conn, &p(0), &p(1), &p(2)),
        "monitor_cancel" => {
            let mid = p(0).to_string();
            match core
                .conns
                .get_mut(&conn)
                .and_then(|c| c.monitors.remove(&mid))
            {
                Some(_) => Ok(json!({})),
                None => Err(OvsErr::new("unknown monitor", mid)),
            }
        }
        "lock" | "steal" | "unlock" => {
            let name = p(0).as_str().unwrap_or("").to_owned();
            let waiting = core.locks.get(&name).is_some_and(|q| q.contains(&conn));
            match method {
                "lock" | "steal" if waiting => Err(OvsErr::new(
                    "syntax error",
                    format!("must issue \"unlock\" before new \"{method}\""),
                )),
                "lock" => {
                    let q = core.locks.entry(name.clone()).or_default();
                    q.push_back(conn);
                    Ok(json!({"locked": q.front() == Some(&conn)}))
                }
                "steal" => {
                    // The victim keeps waiting behind the thief.
                    let q = core.locks.entry(name.clone()).or_default();
                    let prev = q.front().copied();
                    q.push_front(conn);
                    if let Some(prev) = prev {
                        lock_notify(core, prev, "stolen", &name);
                    }
                    Ok(json!({"locked": true}))
                }
                _ => {
                    release_lock(core, conn, &name);
                    Ok(json!({}))
                }
            }
        }
        _ => Err(OvsErr {
            tag: "unknown method".into(),
            details: None,
        }),
    };
    // Sent while the lock is held: no update of a later commit can overtake the reply (a monitor's initial
    // contents come before its first update, as from ovsdb-server's single thread).
    let mut out = Vec::new();
    reply(&mut out, id, r);
    if let Some(c) = core.conns.get(&conn) {
        let _ = c.tx.send(Out::Bytes(out));
    }
    Handled::Sent
}

/// `monitor`, `monitor_cond`, `monitor_cond_since`: registers the monitor, returns its initial contents.
fn start_monitor(
    core: &mut Core,
    conn: u64,
    method: &str,
    name: &Json,
    id: &Json,
    requests: &Json,
) -> Result<Json, OvsErr> {
    let db = name.as_str().and_then(|n| core.dbs.get(n)).ok_or_else(|| {
        OvsErr::new(
            "unknown database",
            format!("{method} request specifies unknown database {name}"),
        )
    })?;
    let tables = parse_requests(db, requests, method != "monitor")?;
    let m = Monitor {
        db: db.schema.name.clone(),
        method: match method {
            "monitor" => "update",
            "monitor_cond" => "update2",
            _ => "update3",
        },
        tables,
    };
    let init = Json::Object(initial(db, &m));
    let c = core
        .conns
        .get_mut(&conn)
        .ok_or_else(|| OvsErr::new("unknown connection", ""))?;
    let mid = id.to_string();
    if c.monitors.contains_key(&mid) {
        return Err(OvsErr::new("duplicate monitor ID", mid));
    }
    c.monitors.insert(mid, m);
    Ok(if method == "monitor_cond_since" {
        // A standalone server keeps no history: never found, the zero transaction id.
        json!([false, Uuid::NIL.to_string(), init])
    } else {
        init
    })
}

/// `monitor_cond_change`: new conditions for some tables of a monitor, which is renamed `new`; the rows that
/// enter or leave its view are reported as inserts and deletes. On an error the monitor stays as it was.
fn cond_change(
    core: &mut Core,
    conn: u64,
    old: &Json,
    new: &Json,
    requests: &Json,
) -> Result<Json, OvsErr> {
    let (old, new) = (old.to_string(), new.to_string());
    let m = core
        .conns
        .get(&conn)
        .and_then(|c| c.monitors.get(&old))
        .ok_or_else(|| OvsErr::new("unknown monitor", old.clone()))?;
    let db = core
        .dbs
        .get(&m.db)
        .ok_or_else(|| OvsErr::new("unknown database", m.db.clone()))?;
    let o = requests
        .as_object()
        .ok_or_else(|| OvsErr::new("syntax error", "monitor requests must be an object"))?;
    let mut tables = m.tables.clone();
    for (t, reqs) in o {
        let (Some(ts), Some(mt)) = (db.schema.table(t), tables.get_mut(t)) else {
            return Err(OvsErr::new("syntax error", format!("no table named {t}")));
        };
        let r = reqs.get(0).unwrap_or(reqs);
        mt.conditions = match r.get("where") {
            Some(w) => engine::parse_conditions(ts, &db.schema, w)?,
            None => Vec::new(),
        };
    }
    let before = Json::Object(initial(db, m));
    let changed = Monitor {
        db: m.db.clone(),
        method: m.method,
        tables,
    };
    let after = Json::Object(initial(db, &changed));
    let upd = membership_change(&before, &after);
    let Some(c) = core.conns.get_mut(&conn) else {
        return Err(OvsErr::new("unknown connection", ""));
    };
    c.monitors.remove(&old);
    if upd.as_object().is_some_and(|o| !o.is_empty()) && changed.method != "update" {
        let mon: Json = serde_json::from_str(&new).unwrap_or(Json::Null);
        let params = match changed.method {
            "update3" => json!([mon, Uuid::NIL.to_string(), upd]),
            _ => json!([mon, upd]),
        };
        let mut b = Vec::new();
        Message::Notification {
            method: changed.method.to_owned(),
            params,
        }
        .encode(&mut b);
        let _ = c.tx.send(Out::Bytes(b));
    }
    c.monitors.insert(new, changed);
    Ok(json!({}))
}

/// Rows that entered or left a monitor's view when its conditions changed, as update2 inserts and deletes.
fn membership_change(before: &Json, after: &Json) -> Json {
    let mut out = Map::new();
    let empty = Map::new();
    let tables: std::collections::BTreeSet<&String> = before
        .as_object()
        .unwrap_or(&empty)
        .keys()
        .chain(after.as_object().unwrap_or(&empty).keys())
        .collect();
    for t in tables {
        let b = before.get(t).and_then(Json::as_object).unwrap_or(&empty);
        let a = after.get(t).and_then(Json::as_object).unwrap_or(&empty);
        let mut tu = Map::new();
        for (u, v) in a {
            if !b.contains_key(u) {
                tu.insert(
                    u.clone(),
                    json!({"insert": v.get("initial").cloned().unwrap_or(Json::Null)}),
                );
            }
        }
        for u in b.keys() {
            if !a.contains_key(u) {
                tu.insert(u.clone(), json!({"delete": null}));
            }
        }
        if !tu.is_empty() {
            out.insert(t.clone(), Json::Object(tu));
        }
    }
    Json::Object(out)
}

fn release_lock(core: &mut Core, conn: u64, name: &str) {
    let Some(q) = core.locks.get_mut(name) else {
        return;
    };
    q.retain(|c| *c != conn);
    // As ovsdb-server: whoever owns the lock after any waiter leaves is told `locked` (again).
    let owner = q.front().copied();
    if q.is_empty() {
        core.locks.remove(name);
    }
    if let Some(n) = owner {
        lock_notify(core, n, "locked", name);
    }
}

/// What became of a request.
enum Handled {
    /// The reply is queued.
    Sent,
    Blocked,
    Drop,
}

async fn serve<S>(shared: Arc<Shared>, conn: u64, stream: S, mut rx: mpsc::UnboundedReceiver<Out>)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut dec = FrameDecoder::new();
    let mut commits = shared.commits.subscribe();
    let mut triggers: Vec<Trigger> = Vec::new();
    let far = tokio::time::Instant::now() + Duration::from_secs(86400 * 365);
    'conn: loop {
        let next_deadline = triggers
            .iter()
            .filter_map(|t| {
                t.timeout_ms
                    .and_then(|ms| t.start.checked_add(Duration::from_millis(ms)))
            })
            .min();
        tokio::select! {
            r = rd.read_buf(dec.read_buffer(64 * 1024)) => {
                match r {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                loop {
                    let msg = match dec.next_message() {
                        Ok(Some(m)) => m,
                        Ok(None) => break,
                        Err(e) if e.is_fatal() => break 'conn,
                        Err(_) => continue,
                    };
                    let Message::Request { id, method, params } = msg else { continue };
                    match handle(&shared, conn, &id, &method, &params, 0) {
                        Handled::Sent => {}
                        Handled::Drop => break 'conn,
                        Handled::Blocked => {
                            let timeout_ms = timeout_of(&params);
                            triggers.push(Trigger { id, params, start: tokio::time::Instant::now(), timeout_ms });
                        }
                    }
                }
            }
            out = rx.recv() => match out {
                Some(Out::Bytes(b)) => {
                    if wr.write_all(&b).await.is_err() {
                        break;
                    }
                }
                Some(Out::Close) | None => break,
            },
            _ = commits.changed(), if !triggers.is_empty() => {
                if retry(&shared, conn, &mut triggers) { break; }
            }
            _ = tokio::time::sleep_until(next_deadline.unwrap_or(far)), if next_deadline.is_some() => {
                if retry(&shared, conn, &mut triggers) { break; }
            }
        }
    }
    let _ = wr.shutdown().await;
    let mut core = lock_core(&shared);
    core.conns.remove(&conn);
    let held: Vec<String> = core
        .locks
        .iter()
        .filter(|(_, q)| q.contains(&conn))
        .map(|(n, _)| n.clone())
        .collect();
    for n in held {
        release_lock(&mut core, conn, &n);
    }
}

/// The server's state. A panic while holding the lock leaves consistent data (a commit is applied at once).
fn lock_core(shared: &Shared) -> std::sync::MutexGuard<'_, Core> {
    shared
        .core
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The smallest `timeout` of the `wait` operations of transact params.
fn timeout_of(params: &Json) -> Option<u64> {
    params
        .as_array()?
        .iter()
        .filter(|o| o.get("op").and_then(Json::as_str) == Some("wait"))
        .filter_map(|o| o.get("timeout").and_then(Json::as_u64))
        .min()
}

/// Runs waiting transactions again; true if the connection must be dropped.
fn retry(shared: &Shared, conn: u64, triggers: &mut Vec<Trigger>) -> bool {
    let mut keep = Vec::new();
    for t in triggers.drain(..) {
        let elapsed = t.start.elapsed().as_millis() as u64;
        match handle(shared, conn, &t.id, "transact", &t.params, elapsed.max(1)) {
            Handled::Sent => {}
            Handled::Drop => return true,
            Handled::Blocked => keep.push(t),
        }
    }
    *triggers = keep;
    false
}

#[cfg(test)]
mod tests;
