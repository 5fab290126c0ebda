//! The in-memory database: tables of rows, and `transact` executed as ovsdb-server executes it (RFC 7047
//! section 5.2 and `ovsdb/execution.c`, `ovsdb/transaction.c` of Open vSwitch): named uuids, conditions,
//! mutations, strong and weak references, garbage collection of unreferenced rows of non-root tables, row
//! limits and unique indexes, with the server's error tags and texts.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::{Map, Value as Json};

use crate::datum::{Atom, AtomType, Datum};
use crate::schema::{BaseType, ColumnType, DatabaseSchema, RefType, TableSchema};
use crate::uuid::Uuid;

/// A row's declared columns, every one present (defaults filled in).
pub(crate) type Cols = BTreeMap<String, Datum>;

/// One stored row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rec {
    /// `_version`: changes with every committed change of the row.
    pub version: Uuid,
    /// The declared columns.
    pub cols: Cols,
}

/// A table's rows by uuid (rows shared between versions of the table).
pub(crate) type Table = BTreeMap<Uuid, Arc<Rec>>;
/// Tables by name (shared between the committed state and a transaction's working copy).
pub(crate) type Tables = BTreeMap<String, Arc<Table>>;

/// What a committed transaction changed: table -> row -> (old, new).
pub(crate) type Changes = BTreeMap<String, BTreeMap<Uuid, (Option<Arc<Rec>>, Option<Arc<Rec>>)>>;

/// An OVSDB error object (`{"error": tag, "details": ...}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OvsErr {
    pub tag: String,
    pub details: Option<String>,
}

impl OvsErr {
    pub fn new(tag: &str, details: impl Into<String>) -> Self {
        OvsErr {
            tag: tag.to_owned(),
            details: Some(details.into()),
        }
    }

    fn syntax(details: impl Into<String>) -> Self {
        Self::new("syntax error", details)
    }

    fn constraint(details: impl Into<String>) -> Self {
        Self::new("constraint violation", details)
    }

    pub fn to_json(&self) -> Json {
        let mut m = Map::new();
        m.insert("error".into(), Json::String(self.tag.clone()));
        if let Some(d) = &self.details {
            m.insert("details".into(), Json::String(d.clone()));
        }
        Json::Object(m)
    }
}

/// A small deterministic generator of version-4 UUIDs (splitmix64).
#[derive(Debug, Clone)]
pub(crate) struct UuidGen(u64);

impl UuidGen {
    pub fn new(seed: u64) -> Self {
        UuidGen(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn uuid(&mut self) -> Uuid {
        let v = ((self.next_u64() as u128) << 64) | self.next_u64() as u128;
        // Version 4, variant 1, as uuid_generate() makes them.
        let v = (v & !(0xf << 76) & !(0x3 << 62)) | (0x4 << 76) | (0x2 << 62);
        Uuid::from_u128(v)
    }
}

/// One database held in memory.
#[derive(Debug)]
pub(crate) struct Db {
    pub schema: Arc<DatabaseSchema>,
    pub schema_json: Arc<Json>,
    pub tables: Tables,
    /// Strong references to each row (by uuid: a generated uuid names one row in the whole database),
    /// kept up to date by each commit so that a transaction costs what it touches, not the database's size.
    refs: HashMap<Uuid, usize>,
}

/// The result of running a `transact`.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The reply (one result per operation, an error, or a trailing commit error) and what was committed.
    Done { results: Json, changes: Changes },
    /// A `wait` is not satisfied yet: run the transaction again after the next commit (or its timeout).
    Blocked,
}

impl Db {
    pub fn new(schema: Arc<DatabaseSchema>, schema_json: Arc<Json>) -> Self {
        let tables = schema
            .tables
            .keys()
            .map(|t| (t.clone(), Arc::new(Table::new())))
            .collect();
        Db {
            schema,
            schema_json,
            tables,
            refs: HashMap::new(),
        }
    }

    /// Runs `transact` params (`[db, op, ...]`, the database name already checked); `elapsed_ms` is how long
    /// the request has waited (for `wait` timeouts); `owns_lock` tells `assert` whether a lock is held.
    pub fn transact(
        &mut self,
        ops: &[Json],
        elapsed_ms: u64,
        gen: &mut UuidGen,
        owns_lock: &dyn Fn(&str) -> bool,
    ) -> Outcome {
        let mut x = Txn {
            schema: &self.schema,
            base: &self.tables,
            base_refs: &self.refs,
            delta: HashMap::new(),
            work: self.tables.clone(),
            touched: BTreeMap::new(),
            symtab: HashMap::new(),
            gen,
            elapsed_ms,
        };
        let n = ops.len();
        let mut results = Vec::with_capacity(n + 1);
        let mut failed = false;
        for (i, op) in ops.iter().enumerate() {
            match x.op(op, i + 1, n, owns_lock) {
                Ok(r) => results.push(r),
                Err(Fail::Blocked) => return Outcome::Blocked,
                Err(Fail::Err(e)) => {
                    results.push(e.to_json());
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            while results.len() < n {
                results.push(Json::Null);
            }
            return Outcome::Done {
                results: Json::Array(results),
                changes: Changes::new(),
            };
        }
        match x.precommit() {
            Ok(changes) => {
                let Txn { work, delta, .. } = x;
                if !changes.is_empty() {
                    self.tables = work;
                    for (u, d) in delta {
                        let n = self.refs.get(&u).copied().unwrap_or(0) as i64 + d;
                        if n > 0 {
                            self.refs.insert(u, n as usize);
                        } else {
                            self.refs.remove(&u);
                        }
                    }
                }
                Outcome::Done {
                    results: Json::Array(results),
                    changes,
                }
            }
            Err(e) => {
                results.push(e.to_json());
                Outcome::Done {
                    results: Json::Array(results),
                    changes: Changes::new(),
                }
            }
        }
    }

    /// A table's rows.
    pub fn table(&self, name: &str) -> Option<&Table> {
        self.tables.get(name).map(|t| &**t)
    }
}

enum Fail {
    Err(OvsErr),
    Blocked,
}

impl From<OvsErr> for Fail {
    fn from(e: OvsErr) -> Self {
        Fail::Err(e)
    }
}

struct Txn<'a> {
    schema: &'a DatabaseSchema,
    base: &'a Tables,
    /// Strong reference counts before the transaction, and the transaction's changes to them.
    base_refs: &'a HashMap<Uuid, usize>,
    delta: HashMap<Uuid, i64>,
    work: Tables,
    /// Rows inserted, modified or deleted by the operations (and later by garbage collection and weak
    /// reference removal).
    touched: BTreeMap<String, BTreeSet<Uuid>>,
    /// uuid-name -> (uuid, declared by an insert)
    symtab: HashMap<String, (Uuid, bool)>,
    gen: &'a mut UuidGen,
    elapsed_ms: u64,
}

/// A parsed `where` clause.
#[derive(Debug, Clone)]
pub(crate) enum Clause {
    Const(bool),
    Cmp {
        column: String,
        function: String,
        arg: Datum,
    },
}

fn type_english(ty: &ColumnType) -> String {
    let key = ty.key.atom.as_str();
    if ty.is_scalar() {
        return key.to_owned();
    }
    let mut s = String::from(if ty.is_map() { "map" } else { "set" });
    if ty.max == u64::MAX {
        if ty.min > 0 {
            s.push_str(&format!(" of {} or more", ty.min));
        } else {
            s.push_str(" of");
        }
    } else if ty.min > 0 {
        s.push_str(&format!(" of {} to {}", ty.min, ty.max));
    } else {
        s.push_str(&format!(" of up to {}", ty.max));
    }
    match &ty.value {
        None => s.push_str(&format!(" {key}s")),
        Some(v) => s.push_str(&format!(" ({key}, {}) pairs", v.atom.as_str())),
    }
    s
}

/// An atom in ovsdb-server's text form (strings quoted unless they read as a bare identifier).
fn atom_string(a: &Atom) -> String {
    match a {
        Atom::Integer(i) => i.to_string(),
        Atom::Real(r) => format!("{r}"),
        Atom::Boolean(b) => b.to_string(),
        Atom::Uuid(u) => u.to_string(),
        Atom::NamedUuid(n) => n.clone(),
        Atom::String(s) => {
            let mut ch = s.chars();
            let bare = match ch.next() {
                Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                    ch.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
                }
                _ => false,
            } && s != "true"
                && s != "false"
                && Uuid::parse(s).is_err();
            if bare {
                s.clone()
            } else {
                Json::String(s.clone()).to_string()
            }
        }
    }
}

/// A datum in ovsdb-server's text form.
fn datum_string(d: &Datum, ty: &ColumnType) -> String {
    match d {
        Datum::Atom(a) => atom_string(a),
        Datum::Set(s) if s.len() == 1 && ty.max == 1 => atom_string(&s[0]),
        Datum::Set(s) => format!(
            "[{}]",
            s.iter().map(atom_string).collect::<Vec<_>>().join(", ")
        ),
        Datum::Map(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, v)| format!("{}={}", atom_string(k), atom_string(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The datum's JSON as ovsdb-server writes it (a one-element set as its atom).
pub(crate) fn datum_json(d: &Datum) -> Json {
    match d {
        Datum::Set(s) if s.len() == 1 => s[0].to_json(),
        d => d.to_json(),
    }
}

/// The default value of a column: its minimum number of the atom type's default.
pub(crate) fn default_datum(ty: &ColumnType) -> Datum {
    if ty.is_map() {
        return Datum::Map(Vec::new());
    }
    if ty.min == 0 {
        return Datum::Set(Vec::new());
    }
    let a = match ty.key.atom {
        AtomType::Integer => Atom::Integer(0),
        AtomType::Real => Atom::Real(0.0),
        AtomType::Boolean => Atom::Boolean(false),
        AtomType::String => Atom::String(String::new()),
        AtomType::Uuid => Atom::Uuid(Uuid::NIL),
    };
    if ty.is_scalar() {
        Datum::Atom(a)
    } else {
        Datum::Set(vec![a])
    }
}

/// The elements of a set-like datum.
fn elems(d: &Datum) -> &[Atom] {
    d.atoms()
}

fn pairs(d: &Datum) -> &[(Atom, Atom)] {
    d.as_map().unwrap_or(&[])
}

/// Sorts and checks for duplicates; an error names the duplicate.
fn canonical(d: Datum) -> Result<Datum, Atom> {
    Ok(match d {
        Datum::Atom(a) => Datum::Atom(a),
        Datum::Set(mut s) => {
            s.sort();
            if let Some(w) = s.windows(2).find(|w| w[0] == w[1]) {
                return Err(w[0].clone());
            }
            Datum::Set(s)
        }
        Datum::Map(mut m) => {
            m.sort_by(|a, b| a.0.cmp(&b.0));
            if let Some(w) = m.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(w[0].0.clone());
            }
            Datum::Map(m)
        }
    })
}

fn check_atom(a: &Atom, bt: &BaseType) -> Result<(), OvsErr> {
    if let Some(e) = &bt.enumeration {
        if !e.contains(a) {
            let allowed = Datum::Set(e.clone());
            let mut ty = ColumnType::scalar(bt.atom);
            ty.max = u64::MAX;
            return Err(OvsErr::constraint(format!(
                "{} is not one of the allowed values ({})",
                atom_string(a),
                datum_string(&allowed, &ty)
            )));
        }
    }
    match a {
        Atom::Integer(i) => {
            if let Some(m) = bt.min_integer.filter(|m| i < m) {
                if let Some(x) = bt.max_integer {
                    return Err(OvsErr::constraint(format!(
                        "{i} is not in the valid range {m} to {x} (inclusive)"
                    )));
                }
                return Err(OvsErr::constraint(format!(
                    "{i} is less than minimum allowed value {m}"
                )));
            }
            if let Some(x) = bt.max_integer.filter(|x| i > x) {
                if let Some(m) = bt.min_integer {
                    return Err(OvsErr::constraint(format!(
                        "{i} is not in the valid range {m} to {x} (inclusive)"
                    )));
                }
                return Err(OvsErr::constraint(format!(
                    "{i} is greater than maximum allowed value {x}"
                )));
            }
        }
        Atom::Real(r)
            if bt.min_real.is_some_and(|m| *r < m) || bt.max_real.is_some_and(|x| *r > x) =>
        {
            return Err(OvsErr::constraint(format!(
                "{r} is not in the valid range {:?} to {:?} (inclusive)",
                bt.min_real, bt.max_real
            )));
        }
        Atom::String(s) => {
            let n = s.chars().count() as u64;
            if let Some(m) = bt.min_length.filter(|m| n < *m) {
                return Err(OvsErr::constraint(format!(
                    "\"{s}\" length {n} is less than minimum allowed length {m}"
                )));
            }
            if let Some(x) = bt.max_length.filter(|x| n > *x) {
                return Err(OvsErr::constraint(format!(
                    "\"{s}\" length {n} is greater than maximum allowed length {x}"
                )));
            }
        }
        _ => {}
    }
    Ok(())
}

fn check_constraints(d: &Datum, ty: &ColumnType) -> Result<(), OvsErr> {
    match d {
        Datum::Map(m) => {
            for (k, v) in m {
                check_atom(k, &ty.key)?;
                if let Some(vt) = &ty.value {
                    check_atom(v, vt)?;
                }
            }
        }
        d => {
            for a in d.atoms() {
                check_atom(a, &ty.key)?;
            }
        }
    }
    Ok(())
}

fn is_strong(bt: &BaseType) -> bool {
    bt.ref_table.is_some() && bt.ref_type == RefType::Strong
}

fn is_weak(bt: &BaseType) -> bool {
    bt.ref_table.is_some() && bt.ref_type == RefType::Weak
}

/// The strong references of a row: (target table, target uuid), self references left out.
fn strong_refs<'r>(
    ts: &'r TableSchema,
    uuid: Uuid,
    cols: &'r Cols,
) -> impl Iterator<Item = (&'r str, Uuid)> + 'r {
    ts.columns.values().flat_map(move |c| {
        let d = cols.get(&c.name);
        let mut out: Vec<(&'r str, Uuid)> = Vec::new();
        if let Some(d) = d {
            if is_strong(&c.ty.key) {
                let t = c.ty.key.ref_table.as_deref().unwrap_or_default();
                let keys: Box<dyn Iterator<Item = &Atom>> = match d {
                    Datum::Map(m) => Box::new(m.iter().map(|(k, _)| k)),
                    d => Box::new(d.atoms().iter()),
                };
                out.extend(keys.filter_map(Atom::as_uuid).map(|u| (t, u)));
            }
            if let Some(vt) = c.ty.value.as_ref().filter(|vt| is_strong(vt)) {
                let t = vt.ref_table.as_deref().unwrap_or_default();
                out.extend(
                    pairs(d)
                        .iter()
                        .filter_map(|(_, v)| v.as_uuid())
                        .map(|u| (t, u)),
                );
            }
        }
        out.into_iter().filter(move |(_, u)| *u != uuid)
    })
}

impl Txn<'_> {
    /// The operation's table; `at` is "I of N" for the parser's error prefix.
    fn table_schema(&self, op: &Map<String, Json>, at: &str) -> Result<&TableSchema, OvsErr> {
        let parse =
            |what: String| OvsErr::syntax(format!("Parsing ovsdb operation {at} failed: {what}"));
        let name = op
            .get("table")
            .and_then(Json::as_str)
            .ok_or_else(|| parse("Required 'table' member is missing.".into()))?;
        self.schema
            .table(name)
            .ok_or_else(|| parse(format!("No table named {name}.")))
    }

    fn resolve(&mut self, a: Atom) -> Atom {
        match a {
            Atom::NamedUuid(n) => {
                let gen = &mut *self.gen;
                let (u, _) = *self.symtab.entry(n).or_insert_with(|| (gen.uuid(), false));
                Atom::Uuid(u)
            }
            a => a,
        }
    }

    /// Parses a datum of type `ty` (counts and constraints of `ty` checked), resolving named uuids.
    fn datum(&mut self, j: &Json, ty: &ColumnType, constraints: bool) -> Result<Datum, OvsErr> {
        let d = Datum::from_json_typed(j, ty).map_err(|e| OvsErr::syntax(e.to_string()))?;
        let d = match d {
            Datum::Atom(a) => Datum::Atom(self.resolve(a)),
            Datum::Set(s) => Datum::Set(s.into_iter().map(|a| self.resolve(a)).collect()),
            Datum::Map(m) => Datum::Map(
                m.into_iter()
                    .map(|(k, v)| (self.resolve(k), self.resolve(v)))
                    .collect(),
            ),
        };
        let n = d.len() as u64;
        if !matches!(d, Datum::Atom(_)) && (n < ty.min || n > ty.max) {
            return Err(OvsErr::syntax(format!(
                "{} must have {} to {} members but {} are present",
                if ty.is_map() { "map" } else { "set" },
                ty.min,
                ty.max.min(u32::MAX as u64),
                n
            )));
        }
        let d = canonical(d).map_err(|a| {
            OvsErr::syntax(
                format!(
                    "{} contains duplicate {}",
                    if ty.is_map() { "map" } else { "set" },
                    if ty.is_map() { "key" } else { "value" }
                ) + &format!(" ({})", atom_string(&a)),
            )
        })?;
        if constraints {
            check_constraints(&d, ty)?;
        }
        Ok(d)
    }

    fn row(&mut self, ts: &TableSchema, j: Option<&Json>) -> Result<Vec<(String, Datum)>, OvsErr> {
        let o = j
            .and_then(Json::as_object)
            .ok_or_else(|| OvsErr::syntax("Required 'row' member is missing or not an object."))?;
        let mut out = Vec::with_capacity(o.len());
        for (c, v) in o {
            let cs = ts.columns.get(c).ok_or_else(|| {
                OvsErr::new(
                    "unknown column",
                    format!("No column {c} in table {}.", ts.name),
                )
            })?;
            let d = self.datum(v, &cs.ty, true)?;
            out.push((c.clone(), d));
        }
        Ok(out)
    }

    fn conditions(&mut self, ts: &TableSchema, j: Option<&Json>) -> Result<Vec<Clause>, OvsErr> {
        let arr = j
            .and_then(Json::as_array)
            .ok_or_else(|| OvsErr::syntax("Required 'where' member is missing or not an array."))?;
        arr.iter().map(|c| self.clause(ts, c)).collect()
    }

    fn clause(&mut self, ts: &TableSchema, j: &Json) -> Result<Clause, OvsErr> {
        if let Some(b) = j.as_bool() {
            return Ok(Clause::Const(b));
        }
        let a = j
            .as_array()
            .filter(|a| a.len() == 3 && a[0].is_string() && a[1].is_string())
            .ok_or_else(|| OvsErr::syntax("Parse error in condition."))?;
        let (col, f) = (a[0].as_str().unwrap_or(""), a[1].as_str().unwrap_or(""));
        let cs = ts.column(col).ok_or_else(|| {
            OvsErr::new(
                "unknown column",
                format!("No column {col} in table {}.", ts.name),
            )
        })?;
        let mut ty = cs.ty.clone();
        match f {
            "<" | "<=" | ">" | ">=" => {
                if !(ty.is_scalar() || ty.is_optional())
                    || !matches!(ty.key.atom, AtomType::Integer | AtomType::Real)
                {
                    return Err(OvsErr::syntax(format!(
                        "Type mismatch: \"{f}\" operator may not be applied to column {col} of type {}.",
                        type_english(&ty)
                    )));
                }
            }
            "==" | "!=" => {}
            "excludes" if !ty.is_scalar() => {
                ty.min = 0;
                ty.max = u64::MAX;
            }
            "includes" if !ty.is_scalar() => ty.min = 0,
            "includes" | "excludes" => {}
            _ => {
                return Err(OvsErr::new(
                    "unknown function",
                    format!("No function named {f}."),
                ))
            }
        }
        let arg = self.datum(&a[2], &ty, true)?;
        Ok(Clause::Cmp {
            column: col.to_owned(),
            function: f.to_owned(),
            arg,
        })
    }

    fn matches(&self, table: &str, conds: &[Clause]) -> Vec<Uuid> {
        let Some(t) = self.work.get(table) else {
            return Vec::new();
        };
        // The planner's usual `_uuid ==` clause: a lookup instead of a scan.
        for c in conds {
            if let Clause::Cmp {
                column,
                function,
                arg: Datum::Atom(Atom::Uuid(u)),
            } = c
            {
                if column == "_uuid" && function == "==" {
                    return t
                        .get(u)
                        .filter(|r| eval(*u, r, conds))
                        .map(|_| vec![*u])
                        .unwrap_or_default();
                }
            }
        }
        t.iter()
            .filter(|(u, r)| eval(**u, r, conds))
            .map(|(u, _)| *u)
            .collect()
    }

    /// The strong references to row `u` now.
    fn refs(&self, u: Uuid) -> i64 {
        self.base_refs.get(&u).copied().unwrap_or(0) as i64
            + self.delta.get(&u).copied().unwrap_or(0)
    }

    fn touch(&mut self, table: &str, u: Uuid) {
        self.touched.entry(table.to_owned()).or_default().insert(u);
    }

    fn table_mut(&mut self, name: &str) -> &mut Table {
        Arc::make_mut(self.work.entry(name.to_owned()).or_default())
    }

    fn op(
        &mut self,
        j: &Json,
        i: usize,
        n: usize,
        owns_lock: &dyn Fn(&str) -> bool,
    ) -> Result<Json, Fail> {
        let at = format!("{i} of {n}");
        let parse =
            |what: String| OvsErr::syntax(format!("Parsing ovsdb operation {at} failed: {what}"));
        let o = j
            .as_object()
            .ok_or_else(|| parse("Operation is not an object.".into()))?;
        let name = o
            .get("op")
            .and_then(Json::as_str)
            .ok_or_else(|| parse("Required 'op' member is missing.".into()))?;
        let mut result = Map::new();
        match name {
            "insert" => {
                let ts = self.table_schema(o, &at)?.clone();
                let explicit = match o.get("uuid") {
                    None => None,
                    Some(u) => Some(
                        u.as_str()
                            .and_then(|s| Uuid::parse(s).ok())
                            .ok_or_else(|| OvsErr::syntax("bad uuid"))?,
                    ),
                };
                if let Some(u) = explicit {
                    if self.work[&ts.name].contains_key(&u) || self.base[&ts.name].contains_key(&u)
                    {
                        return Err(OvsErr::new(
                            "duplicate uuid",
                            "This UUID would duplicate a UUID already present within the table or deleted within the same transaction.",
                        )
                        .into());
                    }
                }
                let uuid = match o.get("uuid-name").and_then(Json::as_str) {
                    Some(nm) => {
                        if let Some((_, true)) = self.symtab.get(nm) {
                            return Err(OvsErr::new(
                                "duplicate uuid-name",
                                "This \"uuid-name\" appeared on an earlier \"insert\" operation.",
                            )
                            .into());
                        }
                        let u = match (explicit, self.symtab.get(nm)) {
                            (Some(u), _) => u,
                            (None, Some((u, _))) => *u,
                            (None, None) => self.gen.uuid(),
                        };
                        self.symtab.insert(nm.to_owned(), (u, true));
                        u
                    }
                    None => match explicit {
                        Some(u) => u,
                        None => loop {
                            let u = self.gen.uuid();
                            if !self.work[&ts.name].contains_key(&u) {
                                break u;
                            }
                        },
                    },
                };
                let given = self.row(&ts, o.get("row"))?;
                let mut cols: Cols = ts
                    .columns
                    .values()
                    .map(|c| (c.name.clone(), default_datum(&c.ty)))
                    .collect();
                for (c, d) in given {
                    cols.insert(c, d);
                }
                // Defaults must meet the constraints too (an enum column left out fails).
                for c in ts.columns.values() {
                    if cols[&c.name].len() == 1 {
                        check_constraints(&cols[&c.name], &c.ty)?;
                    }
                }
                let version = self.gen.uuid();
                self.table_mut(&ts.name)
                    .insert(uuid, Arc::new(Rec { version, cols }));
                self.touch(&ts.name, uuid);
                result.insert("uuid".into(), Atom::Uuid(uuid).to_json());
            }
            "select" => {
                let ts = self.table_schema(o, &at)?.clone();
                let conds = self.conditions(&ts, o.get("where"))?;
                let columns = self.column_list(&ts, o.get("columns"))?;
                let rows: Vec<Json> = self
                    .matches(&ts.name, &conds)
                    .into_iter()
                    .map(|u| row_json(u, &self.work[&ts.name][&u], &columns))
                    .collect();
                result.insert("rows".into(), Json::Array(rows));
            }
            "update" => {
                let ts = self.table_schema(o, &at)?.clone();
                let row = self.row(&ts, o.get("row"))?;
                for (c, _) in &row {
                    if !ts.columns[c].mutable {
                        return Err(OvsErr::constraint(format!(
                            "Cannot update immutable column {c} in table {}.",
                            ts.name
                        ))
                        .into());
                    }
                }
                let conds = self.conditions(&ts, o.get("where"))?;
                let hits = self.matches(&ts.name, &conds);
                for u in &hits {
                    let t = self.table_mut(&ts.name);
                    let Some(r) = t.get_mut(u) else { continue };
                    if row.iter().all(|(c, d)| r.cols.get(c) == Some(d)) {
                        continue;
                    }
                    let r = Arc::make_mut(r);
                    for (c, d) in &row {
                        r.cols.insert(c.clone(), d.clone());
                    }
                    self.touch(&ts.name, *u);
                }
                result.insert("count".into(), Json::from(hits.len()));
            }
            "mutate" => {
                let ts = self.table_schema(o, &at)?.clone();
                let muts = self.mutations(&ts, o.get("mutations"))?;
                let conds = self.conditions(&ts, o.get("where"))?;
                let hits = self.matches(&ts.name, &conds);
                for u in &hits {
                    let t = self.table_mut(&ts.name);
                    let Some(r) = t.get_mut(u) else { continue };
                    let mut cols = r.cols.clone();
                    for m in &muts {
                        let ty = &ts.columns[&m.column].ty;
                        let cur = cols.remove(&m.column).unwrap_or_else(|| default_datum(ty));
                        cols.insert(m.column.clone(), mutate(cur, ty, m)?);
                    }
                    if cols != r.cols {
                        Arc::make_mut(r).cols = cols;
                        self.touch(&ts.name, *u);
                    }
                }
                result.insert("count".into(), Json::from(hits.len()));
            }
            "delete" => {
                let ts = self.table_schema(o, &at)?.clone();
                let conds = self.conditions(&ts, o.get("where"))?;
                let hits = self.matches(&ts.name, &conds);
                for u in &hits {
                    self.table_mut(&ts.name).remove(u);
                    self.touch(&ts.name, *u);
                }
                result.insert("count".into(), Json::from(hits.len()));
            }
            "wait" => {
                let ts = self.table_schema(o, &at)?.clone();
                let timeout = match o.get("timeout") {
                    None => None,
                    Some(t) => Some(
                        t.as_i64()
                            .filter(|t| *t >= 0)
                            .ok_or_else(|| OvsErr::syntax("timeout must be nonnegative"))?
                            as u64,
                    ),
                };
                let conds = self.conditions(&ts, o.get("where"))?;
                let columns = self.column_list(&ts, o.get("columns"))?;
                let until = o.get("until").and_then(Json::as_str).unwrap_or("");
                if until != "==" && until != "!=" {
                    return Err(OvsErr::syntax("\"until\" must be \"==\" or \"!=\"").into());
                }
                let mut expected = BTreeSet::new();
                for r in o.get("rows").and_then(Json::as_array).into_iter().flatten() {
                    let given = self.row(&ts, Some(r))?;
                    let mut cols: Cols = ts
                        .columns
                        .values()
                        .map(|c| (c.name.clone(), default_datum(&c.ty)))
                        .collect();
                    cols.extend(given);
                    expected.insert(project(&cols, &columns));
                }
                let actual: BTreeSet<Vec<Datum>> = self
                    .matches(&ts.name, &conds)
                    .into_iter()
                    .map(|u| project(&self.work[&ts.name][&u].cols, &columns))
                    .collect();
                let equal = actual == expected;
                if (until == "==") != equal {
                    if let Some(t) = timeout {
                        if self.elapsed_ms >= t {
                            return Err(OvsErr::new(
                                "timed out",
                                if self.elapsed_ms > 0 {
                                    format!("\"wait\" timed out after {} ms", self.elapsed_ms)
                                } else {
                                    "\"where\" clause test failed".to_owned()
                                },
                            )
                            .into());
                        }
                    }
                    return Err(Fail::Blocked);
                }
            }
            "commit" | "comment" => {}
            "abort" => return Err(OvsErr::new("aborted", "aborted by request").into()),
            "assert" => {
                let lock = o.get("lock").and_then(Json::as_str).unwrap_or("");
                if !owns_lock(lock) {
                    return Err(OvsErr::new(
                        "not owner",
                        format!("Asserted lock {lock} not held."),
                    )
                    .into());
                }
            }
            other => return Err(parse(format!("No operation \"{other}\"")).into()),
        }
        let read_only = matches!(name, "select" | "wait" | "abort" | "comment" | "assert");
        if !read_only && self.schema.name.starts_with('_') {
            return Err(OvsErr::new(
                "not allowed",
                format!(
                    "{name} operation not allowed on table in reserved database {}",
                    self.schema.name
                ),
            )
            .into());
        }
        Ok(Json::Object(result))
    }

    fn column_list(&self, ts: &TableSchema, j: Option<&Json>) -> Result<Vec<String>, OvsErr> {
        match j {
            None => Ok(["_uuid", "_version"]
                .into_iter()
                .map(str::to_owned)
                .chain(ts.columns.keys().cloned())
                .collect()),
            Some(Json::Array(a)) => a
                .iter()
                .map(|c| {
                    let c = c.as_str().unwrap_or("");
                    ts.column(c)
                        .map(|_| c.to_owned())
                        .ok_or_else(|| OvsErr::syntax(format!("{c} is not a valid column name")))
                })
                .collect(),
            Some(_) => Err(OvsErr::syntax("array of column names expected")),
        }
    }

    fn mutations(&mut self, ts: &TableSchema, j: Option<&Json>) -> Result<Vec<Mutation>, OvsErr> {
        let arr = j
            .and_then(Json::as_array)
            .ok_or_else(|| OvsErr::syntax("Required 'mutations' member is missing."))?;
        let mut out = Vec::with_capacity(arr.len());
        for m in arr {
            let a = m
                .as_array()
                .filter(|a| a.len() == 3 && a[0].is_string() && a[1].is_string())
                .ok_or_else(|| OvsErr::syntax("Parse error in mutation."))?;
            let (col, op) = (a[0].as_str().unwrap_or(""), a[1].as_str().unwrap_or(""));
            let cs = ts.columns.get(col).ok_or_else(|| {
                OvsErr::new(
                    "unknown column",
                    format!("No column {col} in table {}.", ts.name),
                )
            })?;
            if !cs.mutable {
                return Err(OvsErr::constraint(format!(
                    "Cannot mutate immutable column {col} in table {}.",
                    ts.name
                )));
            }
            let mismatch = || {
                OvsErr::syntax(format!(
                    "Type mismatch: \"{op}\" operator may not be applied to column {col} of type {}.",
                    type_english(&cs.ty)
                ))
            };
            let mut ty = cs.ty.clone();
            let arg = match op {
                "+=" | "-=" | "*=" | "/=" | "%=" => {
                    if ty.is_map()
                        || !matches!(ty.key.atom, AtomType::Integer | AtomType::Real)
                        || (op == "%=" && ty.key.atom == AtomType::Real)
                    {
                        return Err(mismatch());
                    }
                    let scalar = ColumnType::scalar(ty.key.atom);
                    self.datum(&a[2], &scalar, false)?
                }
                "insert" | "delete" => {
                    if ty.is_scalar() {
                        return Err(mismatch());
                    }
                    ty.min = 0;
                    if op == "delete" {
                        ty.max = u64::MAX;
                    }
                    match self.datum(&a[2], &ty, true) {
                        Ok(d) => d,
                        Err(e) if ty.is_map() && op == "delete" => {
                            // Deleting from a map also takes a set of keys.
                            let keys = ColumnType {
                                key: ty.key.clone(),
                                value: None,
                                min: 0,
                                max: u64::MAX,
                            };
                            self.datum(&a[2], &keys, true).map_err(|_| e)?
                        }
                        Err(e) => return Err(e),
                    }
                }
                _ => {
                    return Err(OvsErr::new(
                        "unknown mutator",
                        format!("No mutator named {op}."),
                    ))
                }
            };
            out.push(Mutation {
                column: col.to_owned(),
                op: op.to_owned(),
                arg,
            });
        }
        Ok(out)
    }

    /// ovsdb-server's commit checks, in its order; on success the changes to publish.
    fn precommit(&mut self) -> Result<Changes, OvsErr> {
        // Rows whose operations left them as they were are not changes.
        let touched = std::mem::take(&mut self.touched);
        for (t, us) in touched {
            for u in us {
                let old = self.base[&t].get(&u);
                let new = self.work[&t].get(&u);
                let same = match (old, new) {
                    (Some(o), Some(n)) => o.cols == n.cols,
                    (None, None) => false,
                    _ => false,
                };
                if !same {
                    self.touch(&t, u);
                }
            }
        }
        if self.touched.is_empty() {
            return Ok(Changes::new());
        }
        let schema = self.schema;
        // Strong references of changed rows must point at rows that exist (or that this transaction deleted,
        // which the next check reports).
        for (t, us) in &self.touched {
            let ts = &schema.tables[t];
            for u in us {
                let Some(new) = self.work[t].get(u) else {
                    continue;
                };
                for c in ts.columns.values() {
                    for (bt, atoms) in ref_atoms(&c.ty, &new.cols[&c.name]) {
                        if !is_strong(bt) {
                            continue;
                        }
                        let rt = bt.ref_table.as_deref().unwrap_or_default();
                        for a in atoms {
                            let Some(target) = a.as_uuid() else { continue };
                            if target == *u {
                                continue;
                            }
                            let exists = self.work[rt].contains_key(&target)
                                || self.touched.get(rt).is_some_and(|s| s.contains(&target));
                            if !exists {
                                return Err(OvsErr::new(
                                    "referential integrity violation",
                                    format!(
                                        "Table {t} column {} row {u} references nonexistent row {target} in table {rt}.",
                                        c.name
                                    ),
                                ));
                            }
                        }
                    }
                }
            }
        }
        // Strong reference counts: the committed counts plus what the changed rows add and remove.
        let touched: Vec<(String, Uuid)> = self
            .touched
            .iter()
            .flat_map(|(t, us)| us.iter().map(move |u| (t.clone(), *u)))
            .collect();
        for (t, u) in &touched {
            let ts = &schema.tables[t];
            if let Some(o) = self.base[t].get(u) {
                for (_, target) in strong_refs(ts, *u, &o.cols) {
                    *self.delta.entry(target).or_default() -= 1;
                }
            }
            if let Some(n) = self.work[t].get(u) {
                for (_, target) in strong_refs(ts, *u, &n.cols) {
                    *self.delta.entry(target).or_default() += 1;
                }
            }
        }
        for (t, u) in &touched {
            if self.work[t].contains_key(u) {
                continue;
            }
            let n = self.refs(*u);
            if n > 0 {
                return Err(OvsErr::new(
                    "referential integrity violation",
                    format!("cannot delete {t} row {u} because of {n} remaining reference(s)"),
                ));
            }
        }
        // Garbage: rows of non-root tables nothing refers to strongly, transitively. Only rows the
        // transaction changed or stopped referring to can have become garbage.
        let mut candidates: Vec<(String, Uuid)> = touched.clone();
        for (t, u) in &touched {
            if let Some(o) = self.base[t].get(u) {
                candidates.extend(
                    strong_refs(&schema.tables[t], *u, &o.cols).map(|(rt, x)| (rt.to_owned(), x)),
                );
            }
        }
        while let Some((t, u)) = candidates.pop() {
            if schema.tables[&t].is_root || self.refs(u) > 0 {
                continue;
            }
            let Some(r) = self.table_mut(&t).remove(&u) else {
                continue;
            };
            for (rt, target) in strong_refs(&schema.tables[&t], u, &r.cols) {
                *self.delta.entry(target).or_default() -= 1;
                candidates.push((rt.to_owned(), target));
            }
            self.touch(&t, u);
        }
        for t in self.touched.keys() {
            let ts = &schema.tables[t];
            let n = self.work[t].len() as u64;
            if let Some(max) = ts.max_rows.filter(|m| n > *m) {
                return Err(OvsErr::constraint(format!(
                    "transaction causes \"{t}\" table to contain {n} rows, greater than the schema-defined limit of {max} row(s)"
                )));
            }
        }
        self.weak_refs()?;
        self.indexes()?;
        // New versions of what changed, and the changes to publish.
        let mut changes = Changes::new();
        let touched = self.touched.clone();
        for (t, us) in touched {
            for u in us {
                let old = self.base[&t].get(&u).cloned();
                let mut new = self.work[&t].get(&u).cloned();
                if let (Some(o), Some(n)) = (&old, &new) {
                    if o.cols == n.cols {
                        continue;
                    }
                }
                if old.is_none() && new.is_none() {
                    continue;
                }
                if let (Some(_), Some(n)) = (&old, &mut new) {
                    let version = self.gen.uuid();
                    Arc::make_mut(n).version = version;
                    self.table_mut(&t).insert(u, n.clone());
                }
                changes.entry(t.clone()).or_default().insert(u, (old, new));
            }
        }
        Ok(changes)
    }

    /// Removes weak references to rows that do not exist; a column left below its minimum fails.
    fn weak_refs(&mut self) -> Result<(), OvsErr> {
        let schema = self.schema;
        for (t, ts) in &schema.tables {
            let weak_cols: Vec<_> = ts
                .columns
                .values()
                .filter(|c| is_weak(&c.ty.key) || c.ty.value.as_ref().is_some_and(is_weak))
                .collect();
            if weak_cols.is_empty() {
                continue;
            }
            // Rows the transaction changed, and every row when a table they refer to lost rows.
            let lost = weak_cols.iter().any(|c| {
                [Some(&c.ty.key), c.ty.value.as_ref()]
                    .into_iter()
                    .flatten()
                    .filter_map(|bt| bt.ref_table.as_deref())
                    .any(|rt| {
                        self.touched
                            .get(rt)
                            .is_some_and(|us| us.iter().any(|u| !self.work[rt].contains_key(u)))
                    })
            });
            let uuids: Vec<Uuid> = if lost {
                self.work[t].keys().copied().collect()
            } else {
                self.touched
                    .get(t)
                    .map(|us| {
                        us.iter()
                            .filter(|u| self.work[t].contains_key(u))
                            .copied()
                            .collect()
                    })
                    .unwrap_or_default()
            };
            for u in uuids {
                for c in &weak_cols {
                    let d = &self.work[t][&u].cols[&c.name];
                    let exists = |bt: &BaseType, a: &Atom| {
                        !is_weak(bt)
                            || a.as_uuid().is_some_and(|x| {
                                self.work[bt.ref_table.as_deref().unwrap_or_default()]
                                    .contains_key(&x)
                            })
                    };
                    let mut zero = false;
                    let kept = match d {
                        Datum::Map(m) => {
                            let vt = c.ty.value.as_ref().unwrap_or(&c.ty.key);
                            let keep: Vec<_> = m
                                .iter()
                                .filter(|(k, v)| {
                                    let ok = exists(&c.ty.key, k) && exists(vt, v);
                                    if !ok
                                        && (k.as_uuid() == Some(Uuid::NIL)
                                            || v.as_uuid() == Some(Uuid::NIL))
                                    {
                                        zero = true;
                                    }
                                    ok
                                })
                                .cloned()
                                .collect();
                            (keep.len() != m.len()).then_some(Datum::Map(keep))
                        }
                        d => {
                            let all = elems(d);
                            let keep: Vec<Atom> = all
                                .iter()
                                .filter(|a| {
                                    let ok = exists(&c.ty.key, a);
                                    if !ok && a.as_uuid() == Some(Uuid::NIL) {
                                        zero = true;
                                    }
                                    ok
                                })
                                .cloned()
                                .collect();
                            (keep.len() != all.len()).then_some(
                                if c.ty.is_scalar() && keep.len() == 1 {
                                    Datum::Atom(keep[0].clone())
                                } else {
                                    Datum::Set(keep)
                                },
                            )
                        }
                    };
                    let Some(kept) = kept else { continue };
                    let orig = d.len();
                    let inserted = !self.base[t].contains_key(&u);
                    if (kept.len() as u64) < c.ty.min {
                        return Err(OvsErr::constraint(if zero && inserted {
                            format!(
                                "Weak reference column \"{}\" in \"{t}\" row {u} (inserted within this transaction) contained all-zeros UUID (probably as the default value for this column) but deleting this value caused a constraint volation because this column is not allowed to be empty.",
                                c.name
                            )
                        } else {
                            format!(
                                "Deletion of {} weak reference(s) to deleted (or never-existing) rows from column \"{}\" in \"{t}\" row {u} {}caused this column to become empty, but constraints on this column disallow an empty column.",
                                orig - kept.len(),
                                c.name,
                                if inserted { "(inserted within this transaction) " } else { "" }
                            )
                        }));
                    }
                    let name = c.name.clone();
                    let tm = self.table_mut(t);
                    if let Some(r) = tm.get_mut(&u) {
                        Arc::make_mut(r).cols.insert(name, kept);
                    }
                    self.touch(t, u);
                }
            }
        }
        Ok(())
    }

    /// Unique indexes hold over the new contents of every changed table.
    fn indexes(&self) -> Result<(), OvsErr> {
        for (t, us) in &self.touched {
            let ts = &self.schema.tables[t];
            for ix in &ts.indexes {
                let mut seen: HashMap<Vec<Cow<'_, Datum>>, Uuid> = HashMap::new();
                // Rows the transaction changed first, so that a clash names one of them.
                let rows = &self.work[t];
                let order = us
                    .iter()
                    .filter(|u| rows.contains_key(u))
                    .chain(rows.keys().filter(|u| !us.contains(u)));
                for u in order {
                    let key = index_key(*u, &rows[u], ix);
                    if let Some(other) = seen.insert(key, *u) {
                        if !us.contains(u) && !us.contains(&other) {
                            continue;
                        }
                        return Err(self.duplicate(ts, ix, other, *u));
                    }
                }
            }
        }
        Ok(())
    }

    fn duplicate(&self, ts: &TableSchema, ix: &[String], a: Uuid, b: Uuid) -> OvsErr {
        // ovsdb-server orders the two rows by all their columns, _uuid first: the greater one is "First".
        let (first, second) = if a > b { (a, b) } else { (b, a) };
        let rows = &self.work[&ts.name];
        let values = |u: Uuid| {
            ix.iter()
                .map(|c| match c.as_str() {
                    "_uuid" => u.to_string(),
                    "_version" => rows[&u].version.to_string(),
                    c => datum_string(&rows[&u].cols[c], &ts.columns[c].ty),
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let describe = |u: Uuid, title: &str| {
            let what = match self.base[&ts.name].get(&u) {
                None => "was inserted by this transaction.".to_owned(),
                Some(old) if old.cols == rows[&u].cols => {
                    "existed in the database before this transaction and was not modified by the transaction.".to_owned()
                }
                Some(old) if ix.iter().all(|c| old.cols.get(c) == rows[&u].cols.get(c)) => {
                    "existed in the database before this transaction, which modified some of the row's columns but not any columns in this index.".to_owned()
                }
                Some(old) => format!(
                    "had the following index values before the transaction: {}.",
                    ix.iter()
                        .map(|c| old
                            .cols
                            .get(c)
                            .map(|d| datum_string(d, &ts.columns[c].ty))
                            .unwrap_or_default())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            format!("{title} row, with UUID {u}, {what}")
        };
        OvsErr::constraint(format!(
            "Transaction causes multiple rows in \"{}\" table to have identical values ({}) for index on {}.  {}  {}",
            ts.name,
            values(first),
            if ix.len() == 1 { "column" } else { "columns" }.to_owned()
                + " "
                + &ix.iter().map(|c| format!("\"{c}\"")).collect::<Vec<_>>().join(", "),
            describe(first, "First"),
            describe(second, "Second"),
        ))
    }
}

fn index_key<'r>(u: Uuid, r: &'r Rec, ix: &[String]) -> Vec<Cow<'r, Datum>> {
    ix.iter()
        .map(|c| match c.as_str() {
            "_uuid" => Cow::Owned(Datum::uuid(u)),
            "_version" => Cow::Owned(Datum::uuid(r.version)),
            c => r
                .cols
                .get(c)
                .map(Cow::Borrowed)
                .unwrap_or_else(|| Cow::Owned(Datum::empty())),
        })
        .collect()
}

/// The (base type, atoms) pairs of a datum that may hold references.
fn ref_atoms<'d>(ty: &'d ColumnType, d: &'d Datum) -> Vec<(&'d BaseType, Vec<&'d Atom>)> {
    let mut out = Vec::new();
    match d {
        Datum::Map(m) => {
            out.push((&ty.key, m.iter().map(|(k, _)| k).collect()));
            if let Some(vt) = &ty.value {
                out.push((vt, m.iter().map(|(_, v)| v).collect()));
            }
        }
        d => out.push((&ty.key, d.atoms().iter().collect())),
    }
    out
}

fn project(cols: &Cols, columns: &[String]) -> Vec<Datum> {
    columns
        .iter()
        .map(|c| cols.get(c).cloned().unwrap_or_else(Datum::empty))
        .collect()
}

/// A row's JSON with `columns` (which may name `_uuid` and `_version`).
pub(crate) fn row_json(u: Uuid, r: &Rec, columns: &[String]) -> Json {
    let mut m = Map::new();
    for c in columns {
        let v = match c.as_str() {
            "_uuid" => Atom::Uuid(u).to_json(),
            "_version" => Atom::Uuid(r.version).to_json(),
            c => match r.cols.get(c) {
                Some(d) => datum_json(d),
                None => continue,
            },
        };
        m.insert(c.clone(), v);
    }
    Json::Object(m)
}

/// Evaluates `where` clauses on a row.
pub(crate) fn eval(u: Uuid, r: &Rec, conds: &[Clause]) -> bool {
    conds.iter().all(|c| match c {
        Clause::Const(b) => *b,
        Clause::Cmp {
            column,
            function,
            arg,
        } => {
            let uuid_d;
            let field = match column.as_str() {
                "_uuid" => {
                    uuid_d = Datum::uuid(u);
                    &uuid_d
                }
                "_version" => {
                    uuid_d = Datum::uuid(r.version);
                    &uuid_d
                }
                c => match r.cols.get(c) {
                    Some(d) => d,
                    None => return false,
                },
            };
            clause(field, function, arg)
        }
    })
}

fn clause(field: &Datum, f: &str, arg: &Datum) -> bool {
    let one = |d: &Datum| match d {
        Datum::Atom(a) => Some(a.clone()),
        Datum::Set(s) if s.len() == 1 => Some(s[0].clone()),
        _ => None,
    };
    if let (Some(x), Some(y), false) = (one(field), one(arg), matches!(field, Datum::Map(_))) {
        let cmp = x.cmp(&y);
        return match f {
            "<" => cmp.is_lt(),
            "<=" => cmp.is_le(),
            "==" | "includes" => cmp.is_eq(),
            "!=" | "excludes" => cmp.is_ne(),
            ">=" => cmp.is_ge(),
            ">" => cmp.is_gt(),
            _ => false,
        };
    }
    match f {
        "==" => norm(field) == norm(arg),
        "!=" => norm(field) != norm(arg),
        "includes" => match (field, arg) {
            (Datum::Map(fm), Datum::Map(am)) => am.iter().all(|p| fm.contains(p)),
            _ => elems(arg).iter().all(|a| elems(field).contains(a)),
        },
        "excludes" => match (field, arg) {
            (Datum::Map(fm), Datum::Map(am)) => am.iter().all(|p| !fm.contains(p)),
            _ => elems(arg).iter().all(|a| !elems(field).contains(a)),
        },
        // An ordering on an empty optional value is false.
        _ => false,
    }
}

fn norm(d: &Datum) -> Datum {
    match d {
        Datum::Atom(a) => Datum::Set(vec![a.clone()]),
        Datum::Map(m) if m.is_empty() => Datum::Set(Vec::new()),
        d => d.clone(),
    }
}

struct Mutation {
    column: String,
    op: String,
    arg: Datum,
}

fn mutate(cur: Datum, ty: &ColumnType, m: &Mutation) -> Result<Datum, OvsErr> {
    match m.op.as_str() {
        "insert" => {
            let out = match (cur, &m.arg) {
                (Datum::Map(mut c), Datum::Map(a)) => {
                    for (k, v) in a {
                        if !c.iter().any(|(ck, _)| ck == k) {
                            c.push((k.clone(), v.clone()));
                        }
                    }
                    c.sort_by(|a, b| a.0.cmp(&b.0));
                    Datum::Map(c)
                }
                (c, a) => {
                    let mut s: Vec<Atom> = elems(&c).to_vec();
                    for x in elems(a) {
                        if !s.contains(x) {
                            s.push(x.clone());
                        }
                    }
                    s.sort();
                    if ty.is_scalar() && s.len() == 1 {
                        Datum::Atom(s.remove(0))
                    } else {
                        Datum::Set(s)
                    }
                }
            };
            check_count(out, ty)
        }
        "delete" => {
            let out = match (cur, &m.arg) {
                (Datum::Map(c), Datum::Map(a)) => {
                    Datum::Map(c.into_iter().filter(|p| !a.contains(p)).collect())
                }
                (Datum::Map(c), a) => {
                    let keys = elems(a);
                    Datum::Map(c.into_iter().filter(|(k, _)| !keys.contains(k)).collect())
                }
                (c, a) => Datum::Set(
                    elems(&c)
                        .iter()
                        .filter(|x| !elems(a).contains(x))
                        .cloned()
                        .collect(),
                ),
            };
            check_count(out, ty)
        }
        op => {
            let y = m.arg.as_atom().cloned().unwrap_or(Atom::Integer(0));
            let scalar = matches!(cur, Datum::Atom(_));
            let mut out = Vec::new();
            for x in elems(&cur) {
                let r = match (x, &y) {
                    (Atom::Integer(x), Atom::Integer(y)) => {
                        let (x, y) = (*x, *y);
                        let v = match op {
                            "+=" => x.checked_add(y),
                            "-=" => x.checked_sub(y),
                            "*=" => x.checked_mul(y),
                            "/=" | "%=" if y == 0 => {
                                return Err(OvsErr::new("domain error", "Division by zero."))
                            }
                            "/=" => x.checked_div(y),
                            _ => x.checked_rem(y),
                        };
                        Atom::Integer(v.ok_or_else(|| {
                            OvsErr::new(
                                "range error",
                                format!("Result of \"{op}\" operation is out of range."),
                            )
                        })?)
                    }
                    (Atom::Real(x), Atom::Real(y)) => {
                        let v = match op {
                            "+=" => x + y,
                            "-=" => x - y,
                            "*=" => x * y,
                            _ if *y == 0.0 => {
                                return Err(OvsErr::new("domain error", "Division by zero."))
                            }
                            _ => x / y,
                        };
                        if !v.is_finite() {
                            return Err(OvsErr::new(
                                "range error",
                                format!("Result of \"{op}\" operation is out of range."),
                            ));
                        }
                        Atom::Real(v)
                    }
                    (x, _) => x.clone(),
                };
                check_atom(&r, &ty.key)?;
                out.push(r);
            }
            if scalar {
                return Ok(Datum::Atom(out.remove(0)));
            }
            canonical(Datum::Set(out)).map_err(|_| {
                OvsErr::constraint(format!("Result of \"{op}\" operation contains duplicates."))
            })
        }
    }
}

fn check_count(d: Datum, ty: &ColumnType) -> Result<Datum, OvsErr> {
    let n = d.len() as u64;
    if n < ty.min || n > ty.max {
        return Err(OvsErr::constraint(format!(
            "Attempted to store {n} elements in {}.",
            type_english(ty)
        )));
    }
    Ok(d)
}

/// The columns of `ts` a monitor reports: `columns` if given, else every declared column.
pub(crate) fn monitored_columns(ts: &TableSchema, columns: Option<&[String]>) -> Vec<String> {
    match columns {
        Some(c) => c.to_vec(),
        None => ts.columns.keys().cloned().collect(),
    }
}

/// Parses monitor conditions (`where` clauses) for `ts`.
pub(crate) fn parse_conditions(
    ts: &TableSchema,
    schema: &DatabaseSchema,
    j: &Json,
) -> Result<Vec<Clause>, OvsErr> {
    let tables = Tables::new();
    let refs = HashMap::new();
    let mut gen = UuidGen::new(0);
    let mut x = Txn {
        schema,
        base: &tables,
        base_refs: &refs,
        delta: HashMap::new(),
        work: Tables::new(),
        touched: BTreeMap::new(),
        symtab: HashMap::new(),
        gen: &mut gen,
        elapsed_ms: 0,
    };
    x.conditions(ts, Some(j))
}

/// Whether a column's value is its default (left out of inserted rows in update2).
pub(crate) fn is_default(d: &Datum, ty: &ColumnType) -> bool {
    d == &default_datum(ty)
}

/// The update2 difference of a column: the new value of a column of at most one atom (scalar or optional),
/// else the elements (pairs) added, removed or (for maps) changed.
pub(crate) fn diff(old: &Datum, new: &Datum, ty: &ColumnType) -> Datum {
    if ty.value.is_none() && ty.max == 1 {
        return new.clone();
    }
    match (old, new) {
        (Datum::Map(o), Datum::Map(n)) => {
            let mut out: Vec<(Atom, Atom)> = Vec::new();
            for (k, v) in o {
                if !n.iter().any(|(nk, _)| nk == k) {
                    out.push((k.clone(), v.clone()));
                }
            }
            for (k, v) in n {
                match o.iter().find(|(ok, _)| ok == k) {
                    Some((_, ov)) if ov == v => {}
                    _ => out.push((k.clone(), v.clone())),
                }
            }
            out.sort_by(|a, b| a.0.cmp(&b.0));
            Datum::Map(out)
        }
        (o, n) => {
            // Both sorted: the symmetric difference in one pass.
            let (o, n) = (elems(o), elems(n));
            let (mut i, mut j) = (0, 0);
            let mut out = Vec::new();
            while i < o.len() || j < n.len() {
                match (o.get(i), n.get(j)) {
                    (Some(a), Some(b)) if a == b => {
                        i += 1;
                        j += 1;
                    }
                    (Some(a), Some(b)) if a < b => {
                        out.push(a.clone());
                        i += 1;
                    }
                    (Some(_), Some(b)) | (None, Some(b)) => {
                        out.push(b.clone());
                        j += 1;
                    }
                    (Some(a), None) => {
                        out.push(a.clone());
                        i += 1;
                    }
                    (None, None) => break,
                }
            }
            Datum::Set(out)
        }
    }
}
