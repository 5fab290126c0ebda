//! A client-side replica of monitored tables, kept up to date by a monitor, with indexes and change events.
//!
//! [`CacheBuilder`] names the tables (and optionally columns) to replicate and the indexes to keep: every
//! single-column index of the schema (e.g. `Logical_Switch_Port.name`), any extra column the caller names
//! (e.g. `Logical_Switch.name`, which the schema does not index) and keys of map columns (e.g.
//! `external_ids:pod`). [`CacheBuilder::start`] monitors them (`monitor_cond_since` when the server has it,
//! else `monitor_cond`) and spawns one task that applies each update notification atomically: readers take a
//! read lock and never see half an update. [`Cache::subscribe`] gives the row events of each applied update.
//!
//! Rows are stored sparsely (only columns whose value is not the default), so a logical switch port with a
//! name, addresses and a few external_ids costs a few hundred bytes, indexes included.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kubeovn_ovn::Error> {
//! use kubeovn_ovn::{Client, cache::CacheBuilder};
//! let client = Client::connect("unix:/var/run/ovn/ovnnb_db.sock").await?;
//! let cache = CacheBuilder::new("OVN_Northbound")
//!     .table("Logical_Switch_Port")
//!     .map_key_index("Logical_Switch_Port", "external_ids", "pod")
//!     .start(&client)
//!     .await?;
//! if let Some(row) = cache.lookup("Logical_Switch_Port", "name", "pod1.ns") {
//!     println!("{} {:?}", row.uuid(), row.get("addresses"));
//! }
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock, RwLockReadGuard, Weak};
use std::time::Duration;

use tokio::sync::{broadcast, watch};

use crate::client::{Client, ConnectionId, MonitorStream};
use crate::datum::{Atom, AtomType, Datum};
use crate::error::Error;
use crate::model::{Model, ModelError};
use crate::monitor::{MonitorRequest, MonitorRequests, RowUpdate, TableUpdates};
use crate::ops::Row;
use crate::schema::{ColumnType, DatabaseSchema, TableSchema};
use crate::session::Session;
use crate::uuid::Uuid;

/// What an index is keyed by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum IndexKey {
    /// The string value of a column (rows whose value is not one string are not indexed).
    Column(String),
    /// The value of `key` in the string map `column` (e.g. `external_ids:pod`).
    MapKey {
        /// The map column.
        column: String,
        /// The key.
        key: String,
    },
}

impl IndexKey {
    /// The indexed column.
    fn column(&self) -> &str {
        match self {
            IndexKey::Column(c) => c,
            IndexKey::MapKey { column, .. } => column,
        }
    }

    /// The indexed value of `row`, whose column `pos` is this key's column.
    fn extract<'a>(&self, pos: usize, row: &'a CachedRow) -> Option<&'a str> {
        match self {
            IndexKey::Column(_) => match row.value(pos)? {
                Datum::Atom(Atom::String(s)) => Some(s),
                Datum::Set(v) if v.len() == 1 => v[0].as_str(),
                _ => None,
            },
            IndexKey::MapKey { key, .. } => row.value(pos)?.map_get(key)?.as_str(),
        }
    }
}

/// The columns of one replicated table and their default values.
#[derive(Debug)]
pub struct TableColumns {
    table: Arc<str>,
    names: Vec<String>,
    /// Each name's position: rows are decoded and typed models read column by column, and a scan of
    /// twenty names per column was a tenth of an initial sync.
    positions: HashMap<String, u16, FastHash>,
    defaults: Vec<Datum>,
    types: Vec<ColumnType>,
}

impl TableColumns {
    fn new(ts: &TableSchema, only: Option<&[String]>) -> Self {
        let names: Vec<String> = match only {
            Some(cols) => cols.to_vec(),
            None => ts.columns.keys().cloned().collect(),
        };
        let types: Vec<ColumnType> = names
            .iter()
            .map(|n| {
                ts.column(n)
                    .map(|c| c.ty.clone())
                    .unwrap_or_else(|| ColumnType::scalar(AtomType::String))
            })
            .collect();
        let defaults = types.iter().map(default_datum).collect();
        let positions = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i as u16))
            .collect();
        TableColumns {
            table: ts.name.as_str().into(),
            positions,
            names,
            defaults,
            types,
        }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The replicated columns.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The position of a column among [`TableColumns::names`].
    pub fn position(&self, column: &str) -> Option<usize> {
        self.positions.get(column).map(|&i| usize::from(i))
    }
}

fn default_datum(ty: &ColumnType) -> Datum {
    if ty.min == 1 && ty.max == 1 && ty.value.is_none() {
        Datum::Atom(match ty.key.atom {
            AtomType::Integer => Atom::Integer(0),
            AtomType::Real => Atom::Real(0.0),
            AtomType::Boolean => Atom::Boolean(false),
            AtomType::String => Atom::String(String::new()),
            AtomType::Uuid => Atom::Uuid(Uuid::NIL),
        })
    } else if ty.value.is_some() {
        Datum::Map(Vec::new())
    } else {
        Datum::Set(Vec::new())
    }
}

fn is_default(d: &Datum, def: &Datum) -> bool {
    d == def || d.is_empty() && !matches!(def, Datum::Atom(_))
}

/// One replicated row: its UUID and the values of its non-default columns.
#[derive(Debug, Clone)]
pub struct CachedRow {
    uuid: Uuid,
    values: Box<[(u16, Datum)]>,
    columns: Arc<TableColumns>,
}

impl crate::model::RowRead for CachedRow {
    fn column(&self, name: &str) -> Option<&Datum> {
        self.get(name)
    }
}

impl CachedRow {
    fn from_row(uuid: Uuid, row: Row, columns: &Arc<TableColumns>) -> Self {
        let mut values: Vec<(u16, Datum)> = Vec::with_capacity(row.len());
        for (k, v) in row {
            if let Some(i) = columns.position(&k) {
                if !is_default(&v, &columns.defaults[i]) {
                    values.push((i as u16, v));
                }
            }
        }
        values.sort_by_key(|(i, _)| *i);
        CachedRow {
            uuid,
            values: values.into_boxed_slice(),
            columns: columns.clone(),
        }
    }

    fn value(&self, i: usize) -> Option<&Datum> {
        self.values
            .iter()
            .find(|(j, _)| *j as usize == i)
            .map(|(_, d)| d)
            .or_else(|| self.columns.defaults.get(i))
    }

    /// The row's UUID.
    pub fn uuid(&self) -> Uuid {
        self.uuid
    }

    /// The table this row belongs to.
    pub fn table(&self) -> &str {
        &self.columns.table
    }

    /// A column's value (its default if not set); None for a column that is not replicated.
    pub fn get(&self, column: &str) -> Option<&Datum> {
        self.value(self.columns.position(column)?)
    }

    /// A string column's value ("" if it is not a string).
    pub fn get_str(&self, column: &str) -> &str {
        match self.get(column) {
            Some(Datum::Atom(Atom::String(s))) => s,
            Some(Datum::Set(v)) if v.len() == 1 => v[0].as_str().unwrap_or(""),
            _ => "",
        }
    }

    /// The value of `key` in the string map `column`.
    pub fn map_get(&self, column: &str, key: &str) -> Option<&str> {
        self.get(column)?.map_get(key)?.as_str()
    }

    /// The UUIDs held by a set (or scalar) column of references.
    pub fn uuids(&self, column: &str) -> impl Iterator<Item = Uuid> + '_ {
        self.get(column)
            .map(Datum::atoms)
            .unwrap_or(&[])
            .iter()
            .filter_map(Atom::as_uuid)
    }

    /// Every replicated column with its value, as an untyped row.
    pub fn to_row(&self) -> Row {
        self.columns
            .names
            .iter()
            .enumerate()
            .filter_map(|(i, n)| Some((n.clone(), self.value(i)?.clone())))
            .collect()
    }

    /// The row as a typed model (columns not replicated take their defaults), read in place.
    pub fn to_model<M: Model>(&self) -> Result<M, ModelError> {
        M::from_row(self.uuid, self)
    }

    fn apply_modify(&self, diff: Row) -> CachedRow {
        self.clone().apply_modify_owned(diff)
    }

    /// Applies a difference to a row nobody else holds: its values move, nothing is copied (a switch's ports
    /// set of thousands is extended in place, not cloned per transaction).
    fn apply_modify_owned(self, diff: Row) -> CachedRow {
        let mut values: Vec<(u16, Datum)> = self.values.into_vec();
        for (k, d) in diff {
            let Some(i) = self.columns.position(&k) else {
                continue;
            };
            let ty = &self.columns.types[i];
            let cur = values
                .iter()
                .position(|(j, _)| *j as usize == i)
                .map(|p| values.remove(p).1)
                .unwrap_or_else(|| self.columns.defaults[i].clone());
            let new = apply_diff(cur, d, ty);
            if !is_default(&new, &self.columns.defaults[i]) {
                values.push((i as u16, new));
            }
        }
        values.sort_by_key(|(i, _)| *i);
        CachedRow {
            uuid: self.uuid,
            values: values.into_boxed_slice(),
            columns: self.columns.clone(),
        }
    }
}

/// Applies an update2 `modify` difference to a column value.
fn apply_diff(cur: Datum, diff: Datum, ty: &ColumnType) -> Datum {
    if ty.min == 1 && ty.max == 1 && ty.value.is_none() {
        return match diff {
            Datum::Set(mut v) if v.len() == 1 => Datum::Atom(v.remove(0)),
            d => d,
        };
    }
    if ty.max == 1 && ty.value.is_none() {
        // An optional value (0 or 1 element): ovsdb-server sends the new value, not a difference.
        return match diff {
            Datum::Atom(a) => Datum::Set(vec![a]),
            d => d,
        };
    }
    if ty.value.is_some() {
        let mut m = match cur {
            Datum::Map(m) => m,
            _ => Vec::new(),
        };
        if let Datum::Map(dm) = diff {
            for (k, v) in dm {
                match m.iter().position(|(mk, _)| *mk == k) {
                    Some(p) if m[p].1 == v => {
                        m.remove(p);
                    }
                    Some(p) => m[p].1 = v,
                    None => m.push((k, v)),
                }
            }
        }
        return Datum::Map(m);
    }
    let mut s: Vec<Atom> = match cur {
        Datum::Set(s) => s,
        Datum::Atom(a) => vec![a],
        Datum::Map(_) => Vec::new(),
    };
    let add: Vec<Atom> = match diff {
        Datum::Set(s) => s,
        Datum::Atom(a) => vec![a],
        Datum::Map(_) => Vec::new(),
    };
    if add.len() <= 4 {
        for a in add {
            // Reference sets (a switch's ports) are scanned per transaction: compare UUIDs directly, not
            // through Atom's total order.
            let found = match &a {
                Atom::Uuid(u) => s.iter().position(|x| matches!(x, Atom::Uuid(v) if v == u)),
                _ => s.iter().position(|x| *x == a),
            };
            match found {
                Some(p) => {
                    s.remove(p);
                }
                None => s.push(a),
            }
        }
        return Datum::Set(s);
    }
    // A big difference (a batch adding many ports to one switch): O(|set| + |diff|), not the product.
    let mut toggle: std::collections::HashSet<&Atom, FastHash> =
        std::collections::HashSet::with_capacity_and_hasher(add.len(), FastHash);
    toggle.extend(add.iter());
    s.retain(|x| !toggle.remove(x));
    let absent: Vec<bool> = add.iter().map(|a| toggle.contains(a)).collect();
    drop(toggle);
    s.extend(
        add.into_iter()
            .zip(absent)
            .filter_map(|(a, absent)| absent.then_some(a)),
    );
    Datum::Set(s)
}

/// A cheap hasher (multiply-rotate, as rustc's FxHash) for keys the database holds: row UUIDs (random), set
/// elements and indexed values. SipHash's flooding resistance buys nothing against the database we
/// replicate (its writers are trusted), and it was the largest item of a batched writer's profile (the
/// switch's ports set is rescanned per transaction) and of an indexed lookup.
#[derive(Debug, Clone, Copy, Default)]
struct FastHash;

impl std::hash::BuildHasher for FastHash {
    type Hasher = FastHasher;
    fn build_hasher(&self) -> FastHasher {
        FastHasher(0)
    }
}

#[derive(Debug, Clone, Copy)]
struct FastHasher(u64);

impl FastHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl std::hash::Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut it = bytes.chunks_exact(8);
        for c in &mut it {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = it.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 56));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        // The multiply leaves the low bits (the bucket index) depending on the input's low bits only, and
        // names such as `pod-12345.bench` vary in their high bytes: rotate the well-mixed high bits down.
        self.0.rotate_left(26)
    }
}

/// What happened to a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A new row.
    Insert,
    /// A changed row.
    Modify,
    /// A removed row.
    Delete,
}

/// One row change, sent to subscribers after its whole update has been applied.
#[derive(Debug, Clone)]
pub struct RowEvent {
    /// Insert, modify or delete.
    pub kind: EventKind,
    /// The table.
    pub table: Arc<str>,
    /// The row.
    pub uuid: Uuid,
    /// The row before (modify, delete).
    pub old: Option<Arc<CachedRow>>,
    /// The row after (insert, modify).
    pub new: Option<Arc<CachedRow>>,
}

/// The rows under one index value (almost always one, kept inline): the rows themselves, so a lookup is one
/// hash probe (no second one in the table by UUID). A row leaves every index before it is modified (see
/// [`TableCache::remove`]), so an index never keeps a replaced row alive and the in-place modify still owns
/// its row.
#[derive(Debug)]
enum Ids {
    One(Arc<CachedRow>),
    // Boxed so the enum stays two words (most index values hold one row); a Vec, not a slice, as shared
    // values (a switch name) gain rows one at a time.
    #[allow(clippy::box_collection)]
    Many(Box<Vec<Arc<CachedRow>>>),
}

impl Ids {
    fn first(&self) -> Option<&Arc<CachedRow>> {
        match self {
            Ids::One(r) => Some(r),
            Ids::Many(v) => v.first(),
        }
    }

    fn as_slice(&self) -> &[Arc<CachedRow>] {
        match self {
            Ids::One(r) => std::slice::from_ref(r),
            Ids::Many(v) => v,
        }
    }

    fn push(&mut self, r: Arc<CachedRow>) {
        match self {
            Ids::One(a) => *self = Ids::Many(Box::new(vec![a.clone(), r])),
            Ids::Many(v) => v.push(r),
        }
    }

    /// Removes the row `u`; true if nothing is left.
    fn remove(&mut self, u: Uuid) -> bool {
        match self {
            Ids::One(a) => a.uuid == u,
            Ids::Many(v) => {
                v.retain(|x| x.uuid != u);
                let empty = v.is_empty();
                if v.len() == 1 {
                    let one = v[0].clone();
                    *self = Ids::One(one);
                }
                empty
            }
        }
    }
}

#[derive(Debug)]
struct Index {
    key: IndexKey,
    /// The position of the key's column among the replicated ones (None: not replicated, nothing indexed).
    pos: Option<usize>,
    map: HashMap<Box<str>, Ids, FastHash>,
}

impl Index {
    fn extract<'a>(&self, row: &'a CachedRow) -> Option<&'a str> {
        self.key.extract(self.pos?, row)
    }

    fn add(&mut self, row: &Arc<CachedRow>) {
        if let Some(k) = self.extract(row) {
            match self.map.get_mut(k) {
                Some(v) => v.push(row.clone()),
                None => {
                    self.map.insert(k.into(), Ids::One(row.clone()));
                }
            }
        }
    }

    fn remove(&mut self, row: &CachedRow) {
        if let Some(k) = self.extract(row) {
            if let Some(v) = self.map.get_mut(k) {
                if v.remove(row.uuid) {
                    self.map.remove(k);
                }
            }
        }
    }
}

#[derive(Debug)]
struct TableCache {
    columns: Arc<TableColumns>,
    rows: HashMap<Uuid, Arc<CachedRow>, FastHash>,
    indexes: Vec<Index>,
}

impl TableCache {
    /// Room for `n` rows (not in the indexes: many rows may share a value, or have none).
    fn reserve(&mut self, n: usize) {
        self.rows.reserve(n);
    }

    fn insert(&mut self, row: Arc<CachedRow>) -> Option<Arc<CachedRow>> {
        let old = self.remove(row.uuid);
        for ix in &mut self.indexes {
            ix.add(&row);
        }
        self.rows.insert(row.uuid, row);
        old
    }

    fn remove(&mut self, uuid: Uuid) -> Option<Arc<CachedRow>> {
        let old = self.rows.remove(&uuid)?;
        for ix in &mut self.indexes {
            ix.remove(&old);
        }
        Some(old)
    }

    fn index(&self, key: &IndexKey) -> Option<&Index> {
        self.indexes.iter().find(|i| i.key == *key)
    }

    fn column_index(&self, column: &str) -> Option<&Index> {
        self.indexes
            .iter()
            .find(|i| matches!(&i.key, IndexKey::Column(c) if c == column))
    }

    fn map_key_index(&self, column: &str, key: &str) -> Option<&Index> {
        self.indexes.iter().find(
            |i| matches!(&i.key, IndexKey::MapKey { column: c, key: k } if c == column && k == key),
        )
    }
}

#[derive(Debug, Default)]
struct State {
    tables: HashMap<String, TableCache, FastHash>,
    last_txn_id: Option<Uuid>,
}

impl State {
    /// Applies one update; returns the events.
    fn apply(&mut self, updates: TableUpdates, events: bool) -> Vec<RowEvent> {
        let mut out = Vec::new();
        for (t, rows) in updates {
            let Some(tc) = self.tables.get_mut(&t) else {
                continue;
            };
            if tc.rows.is_empty() {
                // The initial contents: size the maps once instead of rehashing them as they grow.
                tc.reserve(rows.len());
            }
            for (uuid, ru) in rows {
                let (kind, old, new) = match ru {
                    RowUpdate::Initial(r) | RowUpdate::Insert(r) => {
                        let new = Arc::new(CachedRow::from_row(uuid, r, &tc.columns));
                        let old = tc.insert(new.clone());
                        let kind = if old.is_some() {
                            EventKind::Modify
                        } else {
                            EventKind::Insert
                        };
                        (kind, old, Some(new))
                    }
                    RowUpdate::Modify(diff) => {
                        let Some(old) = tc.remove(uuid) else {
                            continue;
                        };
                        // Without subscribers the old row is only ours (unless a reader still holds it):
                        // change it in place instead of copying every column.
                        let (old, new) = if events {
                            let new = Arc::new(old.apply_modify(diff));
                            (Some(old), new)
                        } else {
                            let new = match Arc::try_unwrap(old) {
                                Ok(row) => row.apply_modify_owned(diff),
                                Err(shared) => shared.apply_modify(diff),
                            };
                            (None, Arc::new(new))
                        };
                        tc.insert(new.clone());
                        (EventKind::Modify, old, Some(new))
                    }
                    RowUpdate::Delete(_) => {
                        let Some(old) = tc.remove(uuid) else { continue };
                        (EventKind::Delete, Some(old), None)
                    }
                    RowUpdate::Update { new, .. } => match new {
                        // `update` form: `new` holds every monitored column.
                        Some(r) => {
                            let new = Arc::new(CachedRow::from_row(uuid, r, &tc.columns));
                            let prev = tc.insert(new.clone());
                            let kind = if prev.is_some() {
                                EventKind::Modify
                            } else {
                                EventKind::Insert
                            };
                            (kind, prev, Some(new))
                        }
                        None => {
                            let Some(old) = tc.remove(uuid) else { continue };
                            (EventKind::Delete, Some(old), None)
                        }
                    },
                };
                if events {
                    out.push(RowEvent {
                        kind,
                        table: tc.columns.table.clone(),
                        uuid,
                        old,
                        new,
                    });
                }
            }
        }
        out
    }
}

impl State {
    /// Replaces the replica's contents by `full` (every row of every replicated table) and returns the
    /// difference as events: rows gone are deleted, new rows inserted, changed rows modified, equal rows left
    /// alone.
    fn resync(&mut self, mut full: TableUpdates, events: bool) -> Vec<RowEvent> {
        let mut out = Vec::new();
        for (t, tc) in self.tables.iter_mut() {
            let rows = full.remove(t).unwrap_or_default();
            let mut seen = std::collections::HashSet::with_capacity(rows.len());
            for (uuid, ru) in rows {
                let r = match ru {
                    RowUpdate::Initial(r) | RowUpdate::Insert(r) => r,
                    RowUpdate::Update { new: Some(r), .. } => r,
                    _ => continue,
                };
                seen.insert(uuid);
                let new = CachedRow::from_row(uuid, r, &tc.columns);
                if let Some(old) = tc.rows.get(&uuid) {
                    if old.values == new.values {
                        continue;
                    }
                }
                let new = Arc::new(new);
                let old = tc.insert(new.clone());
                if events {
                    out.push(RowEvent {
                        kind: if old.is_some() {
                            EventKind::Modify
                        } else {
                            EventKind::Insert
                        },
                        table: tc.columns.table.clone(),
                        uuid,
                        old,
                        new: Some(new),
                    });
                }
            }
            let gone: Vec<Uuid> = tc
                .rows
                .keys()
                .filter(|u| !seen.contains(u))
                .copied()
                .collect();
            for uuid in gone {
                if let Some(old) = tc.remove(uuid) {
                    if events {
                        out.push(RowEvent {
                            kind: EventKind::Delete,
                            table: tc.columns.table.clone(),
                            uuid,
                            old: Some(old),
                            new: None,
                        });
                    }
                }
            }
        }
        out
    }
}

/// A consistent read-only view of the replica (holds the read lock: keep it short, never across an await).
pub struct CacheView<'a> {
    state: RwLockReadGuard<'a, State>,
}

impl std::fmt::Debug for CacheView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheView").finish_non_exhaustive()
    }
}

impl CacheView<'_> {
    /// A row by UUID.
    pub fn get(&self, table: &str, uuid: Uuid) -> Option<&Arc<CachedRow>> {
        self.state.tables.get(table)?.rows.get(&uuid)
    }

    /// The first row whose indexed `column` has the string `value`.
    pub fn lookup(&self, table: &str, column: &str, value: &str) -> Option<&Arc<CachedRow>> {
        let tc = self.state.tables.get(table)?;
        tc.column_index(column)?.map.get(value)?.first()
    }

    /// The first row whose `map_column` has `key` = `value` (needs [`CacheBuilder::map_key_index`]).
    pub fn lookup_map(
        &self,
        table: &str,
        map_column: &str,
        key: &str,
        value: &str,
    ) -> Option<&Arc<CachedRow>> {
        let tc = self.state.tables.get(table)?;
        tc.map_key_index(map_column, key)?.map.get(value)?.first()
    }

    /// The first row whose indexed `key` has `value`.
    pub fn lookup_key(&self, table: &str, key: &IndexKey, value: &str) -> Option<&Arc<CachedRow>> {
        let tc = self.state.tables.get(table)?;
        tc.index(key)?.map.get(value)?.first()
    }

    /// Every row whose indexed `key` has `value`.
    pub fn lookup_all(&self, table: &str, key: &IndexKey, value: &str) -> Vec<&Arc<CachedRow>> {
        let Some(tc) = self.state.tables.get(table) else {
            return Vec::new();
        };
        tc.index(key)
            .and_then(|i| i.map.get(value))
            .map(|v| v.as_slice().iter().collect())
            .unwrap_or_default()
    }

    /// Every row of a table (in no particular order).
    pub fn rows(&self, table: &str) -> impl Iterator<Item = &Arc<CachedRow>> + '_ {
        self.state
            .tables
            .get(table)
            .into_iter()
            .flat_map(|t| t.rows.values())
    }

    /// The number of rows of a table.
    pub fn len(&self, table: &str) -> usize {
        self.state.tables.get(table).map_or(0, |t| t.rows.len())
    }

    /// Whether a table has no rows.
    pub fn is_empty(&self, table: &str) -> bool {
        self.len(table) == 0
    }
}

struct Inner {
    db: String,
    state: RwLock<State>,
    events: broadcast::Sender<RowEvent>,
    generation: watch::Sender<u64>,
    closed: watch::Sender<Option<String>>,
    online: watch::Sender<bool>,
    /// The connection the monitor runs on (set before `online` turns true).
    monitored: std::sync::Mutex<Option<ConnectionId>>,
    resyncs: std::sync::atomic::AtomicU64,
    full_resyncs: std::sync::atomic::AtomicU64,
    task: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(mut t) = self.task.lock() {
            if let Some(h) = t.take() {
                h.abort();
            }
        }
    }
}

/// A replica of monitored tables; cheap to clone (all clones share it). Dropping the last clone stops the
/// monitor.
#[derive(Clone)]
pub struct Cache {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("db", &self.inner.db)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
struct TableSpec {
    columns: Option<Vec<String>>,
    indexes: Vec<IndexKey>,
}

/// Which tables, columns and indexes a [`Cache`] keeps.
#[derive(Debug, Clone)]
pub struct CacheBuilder {
    db: String,
    tables: BTreeMap<String, TableSpec>,
    capacity: usize,
}

impl CacheBuilder {
    /// A cache of database `db` with no tables yet.
    pub fn new(db: impl Into<String>) -> Self {
        CacheBuilder {
            db: db.into(),
            tables: BTreeMap::new(),
            capacity: 4096,
        }
    }

    fn spec(&mut self, table: &str) -> &mut TableSpec {
        self.tables
            .entry(table.to_owned())
            .or_insert_with(|| TableSpec {
                columns: None,
                indexes: Vec::new(),
            })
    }

    /// Replicates every column of `table`.
    pub fn table(mut self, table: &str) -> Self {
        self.spec(table);
        self
    }

    /// Replicates only `columns` of `table`.
    pub fn table_columns<I: IntoIterator<Item = S>, S: Into<String>>(
        mut self,
        table: &str,
        columns: I,
    ) -> Self {
        self.spec(table).columns = Some(columns.into_iter().map(Into::into).collect());
        self
    }

    /// Indexes `table` by the string value of `column` (the schema's single-column indexes are kept anyway).
    pub fn index(mut self, table: &str, column: &str) -> Self {
        let k = IndexKey::Column(column.to_owned());
        let s = self.spec(table);
        if !s.indexes.contains(&k) {
            s.indexes.push(k);
        }
        self
    }

    /// Indexes `table` by the value of `key` in the map `column` (e.g. `external_ids`, `pod`).
    pub fn map_key_index(mut self, table: &str, column: &str, key: &str) -> Self {
        let k = IndexKey::MapKey {
            column: column.to_owned(),
            key: key.to_owned(),
        };
        let s = self.spec(table);
        if !s.indexes.contains(&k) {
            s.indexes.push(k);
        }
        self
    }

    /// How many row events a slow subscriber may lag behind before it misses some (default 4096).
    pub fn event_capacity(mut self, n: usize) -> Self {
        self.capacity = n.max(1);
        self
    }

    /// Builds the empty replica for `schema` (the monitor is not started): for tests and [`Cache::apply`].
    pub fn build(&self, schema: &DatabaseSchema) -> Result<Cache, Error> {
        let mut state = State::default();
        for (t, spec) in &self.tables {
            let ts = schema.table(t).ok_or_else(|| Error::Protocol {
                method: "cache",
                what: format!("no table {t} in {}", schema.name),
            })?;
            let columns = Arc::new(TableColumns::new(ts, spec.columns.as_deref()));
            let mut keys: Vec<IndexKey> = ts
                .indexes
                .iter()
                .filter(|ix| ix.len() == 1)
                .map(|ix| IndexKey::Column(ix[0].clone()))
                .collect();
            for k in &spec.indexes {
                if !keys.contains(k) {
                    keys.push(k.clone());
                }
            }
            let indexes = keys
                .into_iter()
                .map(|key| Index {
                    pos: columns.position(key.column()),
                    key,
                    map: HashMap::default(),
                })
                .collect();
            state.tables.insert(
                t.clone(),
                TableCache {
                    columns,
                    rows: HashMap::default(),
                    indexes,
                },
            );
        }
        let (events, _) = broadcast::channel(self.capacity);
        Ok(Cache {
            inner: Arc::new(Inner {
                db: self.db.clone(),
                state: RwLock::new(state),
                events,
                generation: watch::Sender::new(0),
                closed: watch::Sender::new(None),
                online: watch::Sender::new(false),
                monitored: std::sync::Mutex::new(None),
                resyncs: std::sync::atomic::AtomicU64::new(0),
                full_resyncs: std::sync::atomic::AtomicU64::new(0),
                task: std::sync::Mutex::new(None),
            }),
        })
    }

    fn requests(&self, schema: &DatabaseSchema) -> MonitorRequests {
        let mut r = MonitorRequests::new();
        for (t, spec) in &self.tables {
            let mut req = MonitorRequest::all();
            if let Some(c) = &spec.columns {
                req = req.columns(c.iter().cloned());
            } else if let Some(ts) = schema.tables.get(t) {
                // The declared columns by name: without a list the server also sends every row's
                // `_version`, a fifth of the initial reply for small rows.
                req = req.columns(ts.columns.keys().cloned());
            }
            r = r.table(t.clone(), req);
        }
        r
    }

    /// Fetches the schema if needed, monitors the tables, loads their current rows and starts applying
    /// changes; returns once the initial contents are in the replica.
    pub async fn start(self, client: &Client) -> Result<Cache, Error> {
        let schema = match client.schema(&self.db) {
            Some(s) => s,
            None => client.get_schema(&self.db).await?,
        };
        let cache = self.build(&schema)?;
        let requests = self.requests(&schema);
        let (initial, last, stream) =
            match client.monitor_cond_since(&self.db, &requests, None).await {
                Ok((r, s)) => (r.updates, r.last_txn_id, s),
                Err(Error::Rpc { .. }) => {
                    let (u, s) = client.monitor_cond(&self.db, &requests).await?;
                    (u, None, s)
                }
                Err(e) => return Err(e),
            };
        cache.apply(initial, last);
        cache
            .inner
            .resyncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        cache.set_monitored(client);
        cache.inner.online.send_replace(true);
        let weak = Arc::downgrade(&cache.inner);
        let h = tokio::spawn(run(weak, stream));
        if let Ok(mut t) = cache.inner.task.lock() {
            *t = Some(h.abort_handle());
        }
        Ok(cache)
    }

    /// Like [`CacheBuilder::start`], over a reconnecting [`Session`]: when the connection drops the replica
    /// keeps its last contents (marked offline, see [`Cache::is_online`]) while the session reconnects; then
    /// the monitor resumes with `monitor_cond_since` from the last transaction id. If the server still has
    /// that transaction (clustered databases) only the missed changes are applied; otherwise (standalone
    /// databases, or history gone) the replica is rebuilt from the full contents and only the difference is
    /// emitted as events. Either way the change is applied atomically.
    pub async fn start_session(self, session: &Session) -> Result<Cache, Error> {
        let client = session.client().await?;
        let schema = match client.schema(&self.db) {
            Some(s) => s,
            None => client.get_schema(&self.db).await?,
        };
        let cache = self.build(&schema)?;
        let requests = self.requests(&schema);
        let stream = resume(&cache, &client, &self.db, &requests).await?;
        let weak = Arc::downgrade(&cache.inner);
        let h = tokio::spawn(run_session(
            weak,
            stream,
            session.clone(),
            (self.db.clone(), requests),
        ));
        if let Ok(mut t) = cache.inner.task.lock() {
            *t = Some(h.abort_handle());
        }
        Ok(cache)
    }
}

/// (Re)starts the monitor on `client` from the cache's last transaction and brings the replica up to date.
async fn resume(
    cache: &Cache,
    client: &Client,
    db: &str,
    requests: &MonitorRequests,
) -> Result<MonitorStream, Error> {
    if client.schema(db).is_none() {
        client.get_schema(db).await?;
    }
    let first = cache
        .inner
        .resyncs
        .load(std::sync::atomic::Ordering::Relaxed)
        == 0
        && !*cache.inner.online.borrow();
    let since = cache.last_txn_id().filter(|u| *u != Uuid::NIL);
    let stream = match client.monitor_cond_since(db, requests, since).await {
        Ok((r, s)) => {
            let last = r.last_txn_id.filter(|u| *u != Uuid::NIL);
            if first || (r.found && since.is_some()) {
                cache.apply(r.updates, last);
            } else {
                cache.resync(r.updates, last);
            }
            s
        }
        Err(Error::Rpc { .. }) => {
            let (u, s) = client.monitor_cond(db, requests).await?;
            if first {
                cache.apply(u, None);
            } else {
                cache.resync(u, None);
            }
            s
        }
        Err(e) => return Err(e),
    };
    cache
        .inner
        .resyncs
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    cache.set_monitored(client);
    cache.inner.online.send_replace(true);
    Ok(stream)
}

async fn run_session(
    weak: Weak<Inner>,
    mut stream: MonitorStream,
    session: Session,
    (db, requests): (String, MonitorRequests),
) {
    loop {
        let next = stream.next().await;
        let Some(inner) = weak.upgrade() else { return };
        let cache = Cache { inner };
        if let Some(Ok(u)) = next {
            cache.apply(u.tables, u.last_txn_id);
            continue;
        }
        // The monitor ended (connection lost, or an update that could not be read): resume on a fresh monitor.
        cache.inner.online.send_replace(false);
        drop(stream);
        let mut attempt = 0u32;
        stream = loop {
            let client = match session.client_forever().await {
                Ok(c) => c,
                Err(e) => {
                    cache.inner.closed.send_replace(Some(e.to_string()));
                    return;
                }
            };
            match resume(&cache, &client, &db, &requests).await {
                Ok(s) => break s,
                Err(e) => {
                    if !e.is_connection_error() {
                        // e.g. the schema changed: resuming needs the connection dropped.
                        client.close("cache resync failed");
                    }
                    tokio::time::sleep(session.backoff().delay(attempt)).await;
                    attempt = attempt.saturating_add(1);
                }
            }
        };
        drop(cache);
    }
}

async fn run(weak: Weak<Inner>, mut stream: MonitorStream) {
    loop {
        let next = stream.next().await;
        let Some(inner) = weak.upgrade() else { return };
        let cache = Cache { inner };
        match next {
            Some(Ok(u)) => cache.apply(u.tables, u.last_txn_id),
            Some(Err(e)) => {
                cache.inner.online.send_replace(false);
                cache.inner.closed.send_replace(Some(e.to_string()));
                return;
            }
            None => {
                cache.inner.online.send_replace(false);
                cache
                    .inner
                    .closed
                    .send_replace(Some("monitor closed".to_owned()));
                return;
            }
        }
    }
}

impl Cache {
    /// The database replicated.
    pub fn db(&self) -> &str {
        &self.inner.db
    }

    /// Applies one batch of changes atomically and tells subscribers (normally done by the monitor task).
    pub fn apply(&self, updates: TableUpdates, last_txn_id: Option<Uuid>) {
        let events = self.inner.events.receiver_count() > 0;
        let evs = {
            let Ok(mut st) = self.inner.state.write() else {
                return;
            };
            if last_txn_id.is_some() {
                st.last_txn_id = last_txn_id;
            }
            st.apply(updates, events)
        };
        for e in evs {
            let _ = self.inner.events.send(e);
        }
        self.inner.generation.send_modify(|g| *g += 1);
    }

    /// Replaces the contents by `full` (every row of the replicated tables, as in an initial monitor reply)
    /// atomically and tells subscribers only what differs.
    pub fn resync(&self, full: TableUpdates, last_txn_id: Option<Uuid>) {
        self.inner
            .full_resyncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let events = self.inner.events.receiver_count() > 0;
        let evs = {
            let Ok(mut st) = self.inner.state.write() else {
                return;
            };
            st.last_txn_id = last_txn_id;
            st.resync(full, events)
        };
        for e in evs {
            let _ = self.inner.events.send(e);
        }
        self.inner.generation.send_modify(|g| *g += 1);
    }

    /// Whether the replica is being kept up to date now (false while a session cache reconnects, or after
    /// the monitor of a plain cache stopped).
    pub fn is_online(&self) -> bool {
        *self.inner.online.borrow()
    }

    /// Waits until the replica is online, up to `timeout`; false on timeout.
    pub async fn wait_online(&self, timeout: Duration) -> bool {
        let mut rx = self.inner.online.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|o| *o))
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false)
    }

    fn set_monitored(&self, client: &Client) {
        if let Ok(mut m) = self.inner.monitored.lock() {
            *m = Some(client.connection_id());
        }
    }

    fn monitors(&self, client: &Client) -> bool {
        self.inner
            .monitored
            .lock()
            .is_ok_and(|m| m.as_ref().is_some_and(|id| id.is(client)))
    }

    /// Whether the replica is online and its monitor runs on `client`'s connection. It then shows every
    /// change committed before that connection was made, so the outcome of a transaction sent on an earlier
    /// connection (one whose reply never came, [`Error::OutcomeUnknown`]) can be read from it, and every
    /// later change on `client` arrives in order after its reply.
    pub fn follows(&self, client: &Client) -> bool {
        *self.inner.online.borrow() && self.monitors(client)
    }

    /// Waits until the replica [`follows`](Cache::follows) `client`, up to `timeout`; false on timeout or
    /// when `client`'s connection has closed meanwhile.
    pub async fn wait_follows(&self, client: &Client, timeout: Duration) -> bool {
        let mut rx = self.inner.online.subscribe();
        // `monitored` is set before `online` turns true, so each resume wakes this up after the switch.
        let waited = tokio::time::timeout(
            timeout,
            rx.wait_for(|o| (*o && self.monitors(client)) || client.is_closed()),
        )
        .await;
        waited.is_ok_and(|r| r.is_ok()) && self.follows(client)
    }

    /// How many times the monitor was (re)started (1 after the first start).
    pub fn resyncs(&self) -> u64 {
        self.inner
            .resyncs
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many of those restarts had to rebuild the replica from the full contents (the server did not
    /// have the last transaction id).
    pub fn full_resyncs(&self) -> u64 {
        self.inner
            .full_resyncs
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A consistent view for several lookups.
    pub fn view(&self) -> CacheView<'_> {
        CacheView {
            state: self.inner.state.read().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// A row by UUID.
    pub fn get(&self, table: &str, uuid: Uuid) -> Option<Arc<CachedRow>> {
        self.view().get(table, uuid).cloned()
    }

    /// The first row whose indexed string `column` equals `value`.
    pub fn lookup(&self, table: &str, column: &str, value: &str) -> Option<Arc<CachedRow>> {
        self.view().lookup(table, column, value).cloned()
    }

    /// The first row whose `map_column` has `key` = `value` (needs [`CacheBuilder::map_key_index`]).
    pub fn lookup_map(
        &self,
        table: &str,
        map_column: &str,
        key: &str,
        value: &str,
    ) -> Option<Arc<CachedRow>> {
        self.view()
            .lookup_map(table, map_column, key, value)
            .cloned()
    }

    /// Every row whose indexed `key` has `value`.
    pub fn lookup_all(&self, table: &str, key: &IndexKey, value: &str) -> Vec<Arc<CachedRow>> {
        self.view()
            .lookup_all(table, key, value)
            .into_iter()
            .cloned()
            .collect()
    }

    /// Every row of a table.
    pub fn rows(&self, table: &str) -> Vec<Arc<CachedRow>> {
        self.view().rows(table).cloned().collect()
    }

    /// Every row of a table as typed models (rows that do not fit are skipped).
    pub fn models<M: Model>(&self) -> Vec<M> {
        self.view()
            .rows(M::TABLE)
            .filter_map(|r| r.to_model().ok())
            .collect()
    }

    /// The number of rows of a table.
    pub fn len(&self, table: &str) -> usize {
        self.view().len(table)
    }

    /// The last transaction applied (monitor_cond_since only).
    pub fn last_txn_id(&self) -> Option<Uuid> {
        self.view().state.last_txn_id
    }

    /// Row events of every update applied from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<RowEvent> {
        self.inner.events.subscribe()
    }

    /// Why the monitor stopped, if it did (the replica is then frozen).
    pub fn closed(&self) -> Option<String> {
        self.inner.closed.borrow().clone()
    }

    /// Waits until `cond` holds on the replica (checked now and after each applied update), up to `timeout`;
    /// false on timeout or if the monitor stopped.
    pub async fn wait_for<F>(&self, timeout: Duration, mut cond: F) -> bool
    where
        F: FnMut(&CacheView<'_>) -> bool,
    {
        let mut rx = self.inner.generation.subscribe();
        let fut = async {
            loop {
                if cond(&self.view()) {
                    return true;
                }
                if self.closed().is_some() || rx.changed().await.is_err() {
                    return false;
                }
            }
        };
        tokio::time::timeout(timeout, fut).await.unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> DatabaseSchema {
        include_str!("../schemas/ovn-nb.ovsschema").parse().unwrap()
    }

    fn lsp(name: &str, pod: &str) -> Row {
        let mut r = Row::new();
        r.insert("name".into(), Datum::from(name));
        r.insert(
            "addresses".into(),
            Datum::set(["0a:58:0a:10:00:05 10.16.0.5"]),
        );
        r.insert(
            "external_ids".into(),
            Datum::map([("pod", pod), ("vendor", "kube-ovn")]),
        );
        r
    }

    fn one(t: &str, u: Uuid, ru: RowUpdate) -> TableUpdates {
        let mut m = TableUpdates::new();
        m.entry(t.to_owned()).or_default().insert(u, ru);
        m
    }

    fn uuid(i: u8) -> Uuid {
        Uuid::parse(&format!("00000000-0000-0000-0000-0000000000{i:02x}")).unwrap()
    }

    #[test]
    fn insert_modify_delete_and_indexes() {
        let c = CacheBuilder::new("OVN_Northbound")
            .table("Logical_Switch_Port")
            .map_key_index("Logical_Switch_Port", "external_ids", "pod")
            .build(&schema())
            .unwrap();
        let mut rx = c.subscribe();
        let u = uuid(1);
        c.apply(
            one(
                "Logical_Switch_Port",
                u,
                RowUpdate::Insert(lsp("p1", "ns/p1")),
            ),
            None,
        );
        assert_eq!(
            c.lookup("Logical_Switch_Port", "name", "p1")
                .unwrap()
                .uuid(),
            u
        );
        assert_eq!(
            c.lookup_map("Logical_Switch_Port", "external_ids", "pod", "ns/p1")
                .unwrap()
                .uuid(),
            u
        );
        // modify: rename, drop the vendor key, change pod
        let mut diff = Row::new();
        diff.insert("name".into(), Datum::from("p2"));
        diff.insert(
            "external_ids".into(),
            Datum::map([("pod", "ns/p2"), ("vendor", "kube-ovn")]),
        );
        c.apply(one("Logical_Switch_Port", u, RowUpdate::Modify(diff)), None);
        assert!(c.lookup("Logical_Switch_Port", "name", "p1").is_none());
        let r = c.lookup("Logical_Switch_Port", "name", "p2").unwrap();
        assert_eq!(r.map_get("external_ids", "pod"), Some("ns/p2"));
        assert_eq!(r.map_get("external_ids", "vendor"), None);
        assert_eq!(r.get("enabled"), Some(&Datum::Set(vec![])));
        let m: crate::models::nb::LogicalSwitchPort = r.to_model().unwrap();
        assert_eq!(m.name, "p2");
        c.apply(one("Logical_Switch_Port", u, RowUpdate::Delete(None)), None);
        assert_eq!(c.len("Logical_Switch_Port"), 0);
        assert!(c
            .lookup_map("Logical_Switch_Port", "external_ids", "pod", "ns/p2")
            .is_none());
        let kinds: Vec<EventKind> = (0..3).map(|_| rx.try_recv().unwrap().kind).collect();
        assert_eq!(
            kinds,
            [EventKind::Insert, EventKind::Modify, EventKind::Delete]
        );
    }

    #[test]
    fn resync_emits_only_the_difference() {
        let c = CacheBuilder::new("OVN_Northbound")
            .table("Logical_Switch_Port")
            .build(&schema())
            .unwrap();
        let mut full = TableUpdates::new();
        for (i, n) in [(1, "a"), (2, "b"), (3, "c")] {
            full.entry("Logical_Switch_Port".into())
                .or_default()
                .insert(uuid(i), RowUpdate::Initial(lsp(n, n)));
        }
        c.apply(full, None);
        let mut rx = c.subscribe();
        // After a reconnect: a unchanged, b changed, c gone, d new.
        let mut full = TableUpdates::new();
        let t = full.entry("Logical_Switch_Port".into()).or_default();
        t.insert(uuid(1), RowUpdate::Initial(lsp("a", "a")));
        t.insert(uuid(2), RowUpdate::Initial(lsp("b", "b2")));
        t.insert(uuid(4), RowUpdate::Initial(lsp("d", "d")));
        c.resync(full, None);
        let mut evs: Vec<(EventKind, Uuid)> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|e| (e.kind, e.uuid))
            .collect();
        evs.sort_by_key(|(_, u)| *u);
        assert_eq!(
            evs,
            [
                (EventKind::Modify, uuid(2)),
                (EventKind::Delete, uuid(3)),
                (EventKind::Insert, uuid(4))
            ]
        );
        assert!(c.lookup("Logical_Switch_Port", "name", "c").is_none());
        assert_eq!(c.full_resyncs(), 1);
    }

    #[test]
    fn optional_value_diff_is_the_new_value() {
        let ty = schema()
            .table("Logical_Switch_Port")
            .unwrap()
            .column("tag_request")
            .unwrap()
            .ty
            .clone();
        assert_eq!(
            apply_diff(Datum::set([1400i64]), Datum::set([1300i64]), &ty),
            Datum::set([1300i64])
        );
        assert_eq!(
            apply_diff(Datum::set([1400i64]), Datum::Set(vec![]), &ty),
            Datum::Set(vec![])
        );
    }

    #[test]
    fn set_diff_is_symmetric() {
        let ty = schema()
            .table("Logical_Switch")
            .unwrap()
            .column("ports")
            .unwrap()
            .ty
            .clone();
        let d = apply_diff(
            Datum::set([uuid(1), uuid(2)]),
            Datum::set([uuid(2), uuid(3)]),
            &ty,
        );
        assert_eq!(d, Datum::set([uuid(1), uuid(3)]));
        // A big difference takes the hashed path: same result, same order.
        let d = apply_diff(
            Datum::Set((0..10).map(uuid).map(Atom::from).collect()),
            Datum::Set((5..20).map(uuid).map(Atom::from).collect()),
            &ty,
        );
        let want: Vec<Atom> = (0..5).chain(10..20).map(uuid).map(Atom::from).collect();
        assert_eq!(d, Datum::Set(want));
    }

    /// Without subscribers a modify changes the row in place; a reader still holding the old row keeps it
    /// unchanged (copy only then), and the indexes follow the new values either way.
    #[test]
    fn modify_in_place_leaves_held_rows_alone() {
        let c = CacheBuilder::new("OVN_Northbound")
            .table("Logical_Switch")
            .index("Logical_Switch", "name")
            .build(&schema())
            .unwrap();
        let ls = |name: &str, ports: &[u8]| {
            let mut r = Row::new();
            r.insert("name".into(), Datum::from(name));
            r.insert("ports".into(), Datum::set(ports.iter().map(|i| uuid(*i))));
            r
        };
        c.apply(
            one(
                "Logical_Switch",
                uuid(1),
                RowUpdate::Insert(ls("a", &[1, 2])),
            ),
            None,
        );
        let modify = |ports: &[u8], name: &str| {
            let mut d = Row::new();
            d.insert("ports".into(), Datum::set(ports.iter().map(|i| uuid(*i))));
            d.insert("name".into(), Datum::from(name));
            one("Logical_Switch", uuid(1), RowUpdate::Modify(d))
        };
        let held = c.get("Logical_Switch", uuid(1)).unwrap();
        c.apply(modify(&[3], "b"), None);
        let ports = |r: &CachedRow| r.uuids("ports").collect::<Vec<_>>();
        assert_eq!(ports(&held), [uuid(1), uuid(2)]);
        assert_eq!(held.get_str("name"), "a");
        drop(held);
        // Nobody holds it now: in place.
        c.apply(modify(&[1], "c"), None);
        let now = c.lookup("Logical_Switch", "name", "c").unwrap();
        assert_eq!(ports(&now), [uuid(2), uuid(3)]);
        assert!(c.lookup("Logical_Switch", "name", "a").is_none());
        assert!(c.lookup("Logical_Switch", "name", "b").is_none());
    }
}
