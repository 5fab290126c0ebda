//! Transactions (RFC 7047 section 5.2): typed operation builders, validation against the schema before
//! anything is sent, and result parsing with per-operation errors.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::ser::{SerializeMap, SerializeSeq, SerializeTuple};
use serde::{Serialize, Serializer};
use serde_json::Value as Json;

use crate::datum::{Atom, AtomType, Datum, DatumError};
use crate::schema::{ColumnType, DatabaseSchema, TableSchema};
use crate::uuid::Uuid;

/// A row: column name to datum. Ordered so that encoding is deterministic.
pub type Row = BTreeMap<String, Datum>;

/// A condition function (RFC 7047 section 5.1, `<function>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Function {
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `>=`
    Ge,
    /// `>`
    Gt,
    /// `includes`: the column's set or map contains the value's elements.
    Includes,
    /// `excludes`: the column's set or map contains none of the value's elements.
    Excludes,
}

impl Function {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Function::Lt => "<",
            Function::Le => "<=",
            Function::Eq => "==",
            Function::Ne => "!=",
            Function::Ge => ">=",
            Function::Gt => ">",
            Function::Includes => "includes",
            Function::Excludes => "excludes",
        }
    }
}

/// One `[column, function, value]` condition of a `where` clause.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    /// The column compared.
    pub column: String,
    /// The comparison.
    pub function: Function,
    /// The value compared with.
    pub value: Datum,
}

impl Condition {
    /// A condition from its parts.
    pub fn new(column: impl Into<String>, function: Function, value: impl Into<Datum>) -> Self {
        Condition {
            column: column.into(),
            function,
            value: value.into(),
        }
    }
    /// `column == value`
    pub fn eq(column: impl Into<String>, value: impl Into<Datum>) -> Self {
        Self::new(column, Function::Eq, value)
    }
    /// `column != value`
    pub fn ne(column: impl Into<String>, value: impl Into<Datum>) -> Self {
        Self::new(column, Function::Ne, value)
    }
    /// `_uuid == uuid`
    pub fn uuid(uuid: Uuid) -> Self {
        Self::new("_uuid", Function::Eq, Datum::uuid(uuid))
    }
    /// `column includes value`
    pub fn includes(column: impl Into<String>, value: impl Into<Datum>) -> Self {
        Self::new(column, Function::Includes, value)
    }
    /// `column excludes value`
    pub fn excludes(column: impl Into<String>, value: impl Into<Datum>) -> Self {
        Self::new(column, Function::Excludes, value)
    }
}

impl Serialize for Condition {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(3)?;
        t.serialize_element(&self.column)?;
        t.serialize_element(self.function.as_str())?;
        t.serialize_element(&self.value)?;
        t.end()
    }
}

/// A mutator (RFC 7047 section 5.1, `<mutator>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutator {
    /// `+=`
    Add,
    /// `-=`
    Sub,
    /// `*=`
    Mul,
    /// `/=`
    Div,
    /// `%=`
    Mod,
    /// `insert`: add elements to a set or pairs to a map.
    Insert,
    /// `delete`: remove elements from a set, or pairs (or keys) from a map.
    Delete,
}

impl Mutator {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Mutator::Add => "+=",
            Mutator::Sub => "-=",
            Mutator::Mul => "*=",
            Mutator::Div => "/=",
            Mutator::Mod => "%=",
            Mutator::Insert => "insert",
            Mutator::Delete => "delete",
        }
    }
}

/// One `[column, mutator, value]` mutation.
#[derive(Debug, Clone, PartialEq)]
pub struct Mutation {
    /// The column mutated.
    pub column: String,
    /// How.
    pub mutator: Mutator,
    /// The argument.
    pub value: Datum,
}

impl Serialize for Mutation {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(3)?;
        t.serialize_element(&self.column)?;
        t.serialize_element(self.mutator.as_str())?;
        t.serialize_element(&self.value)?;
        t.end()
    }
}

/// `until` of a wait operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitUntil {
    /// Wait until the selected rows equal the given rows.
    Equal,
    /// Wait until they differ.
    NotEqual,
}

/// One operation of a transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum Operation {
    /// Insert a row; `uuid_name` lets later operations refer to it as `["named-uuid", name]`.
    Insert {
        /// Table.
        table: String,
        /// Initial values (omitted columns get their defaults).
        row: Row,
        /// Name for the new row's UUID within the transaction.
        uuid_name: Option<String>,
        /// A UUID chosen by the client (the `uuid` member, an OVS extension).
        uuid: Option<Uuid>,
    },
    /// Select rows.
    Select {
        /// Table.
        table: String,
        /// Conditions, all of which must hold (empty: every row).
        conditions: Vec<Condition>,
        /// Columns to return (None: all).
        columns: Option<Vec<String>>,
    },
    /// Update the matching rows.
    Update {
        /// Table.
        table: String,
        /// Conditions.
        conditions: Vec<Condition>,
        /// New values.
        row: Row,
    },
    /// Mutate the matching rows.
    Mutate {
        /// Table.
        table: String,
        /// Conditions.
        conditions: Vec<Condition>,
        /// Mutations, applied in order.
        mutations: Vec<Mutation>,
    },
    /// Delete the matching rows.
    Delete {
        /// Table.
        table: String,
        /// Conditions.
        conditions: Vec<Condition>,
    },
    /// Wait until the selected rows (do not) equal `rows`, or fail after `timeout_ms`.
    Wait {
        /// Table.
        table: String,
        /// Conditions.
        conditions: Vec<Condition>,
        /// Columns compared.
        columns: Vec<String>,
        /// Equal or not equal.
        until: WaitUntil,
        /// The rows expected.
        rows: Vec<Row>,
        /// Milliseconds to wait (None: forever; 0: check once).
        timeout_ms: Option<u64>,
    },
    /// Commit durably (or not) before replying.
    Commit {
        /// Whether to wait for the commit to reach disk.
        durable: bool,
    },
    /// Abort the transaction (always fails with `aborted`).
    Abort,
    /// A comment recorded in the database log.
    Comment(String),
    /// Fail unless this client holds the lock.
    Assert {
        /// The lock name.
        lock: String,
    },
}

impl Operation {
    /// The wire name of the operation (`"insert"`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Operation::Insert { .. } => "insert",
            Operation::Select { .. } => "select",
            Operation::Update { .. } => "update",
            Operation::Mutate { .. } => "mutate",
            Operation::Delete { .. } => "delete",
            Operation::Wait { .. } => "wait",
            Operation::Commit { .. } => "commit",
            Operation::Abort => "abort",
            Operation::Comment(_) => "comment",
            Operation::Assert { .. } => "assert",
        }
    }

    /// The table the operation works on, if any.
    pub fn table(&self) -> Option<&str> {
        match self {
            Operation::Insert { table, .. }
            | Operation::Select { table, .. }
            | Operation::Update { table, .. }
            | Operation::Mutate { table, .. }
            | Operation::Delete { table, .. }
            | Operation::Wait { table, .. } => Some(table),
            _ => None,
        }
    }

    /// Starts an insert into `table`.
    pub fn insert(table: impl Into<String>) -> Insert {
        Insert(Operation::Insert {
            table: table.into(),
            row: Row::new(),
            uuid_name: None,
            uuid: None,
        })
    }
    /// Starts a select from `table`.
    pub fn select(table: impl Into<String>) -> Select {
        Select(Operation::Select {
            table: table.into(),
            conditions: Vec::new(),
            columns: None,
        })
    }
    /// Starts an update of `table`.
    pub fn update(table: impl Into<String>) -> Update {
        Update(Operation::Update {
            table: table.into(),
            conditions: Vec::new(),
            row: Row::new(),
        })
    }
    /// Starts a mutate of `table`.
    pub fn mutate(table: impl Into<String>) -> Mutate {
        Mutate(Operation::Mutate {
            table: table.into(),
            conditions: Vec::new(),
            mutations: Vec::new(),
        })
    }
    /// Starts a delete from `table`.
    pub fn delete(table: impl Into<String>) -> Delete {
        Delete(Operation::Delete {
            table: table.into(),
            conditions: Vec::new(),
        })
    }
    /// Starts a wait on `table` (until equal, no timeout).
    pub fn wait(table: impl Into<String>) -> Wait {
        Wait(Operation::Wait {
            table: table.into(),
            conditions: Vec::new(),
            columns: Vec::new(),
            until: WaitUntil::Equal,
            rows: Vec::new(),
            timeout_ms: None,
        })
    }
    /// A commit operation.
    pub fn commit(durable: bool) -> Operation {
        Operation::Commit { durable }
    }
    /// An abort operation.
    pub fn abort() -> Operation {
        Operation::Abort
    }
    /// A comment operation.
    pub fn comment(text: impl Into<String>) -> Operation {
        Operation::Comment(text.into())
    }
    /// An assert operation on `lock`.
    pub fn assert_lock(lock: impl Into<String>) -> Operation {
        Operation::Assert { lock: lock.into() }
    }

    fn conditions_mut(&mut self) -> Option<&mut Vec<Condition>> {
        match self {
            Operation::Select { conditions, .. }
            | Operation::Update { conditions, .. }
            | Operation::Mutate { conditions, .. }
            | Operation::Delete { conditions, .. }
            | Operation::Wait { conditions, .. } => Some(conditions),
            _ => None,
        }
    }

    fn row_mut(&mut self) -> Option<&mut Row> {
        match self {
            Operation::Insert { row, .. } | Operation::Update { row, .. } => Some(row),
            _ => None,
        }
    }
}

macro_rules! builder {
    ($name:ident, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone, PartialEq)]
        pub struct $name(Operation);
        impl From<$name> for Operation {
            fn from(b: $name) -> Operation {
                b.0
            }
        }
        impl $name {
            /// The operation built so far.
            pub fn build(self) -> Operation {
                self.0
            }
        }
    };
}
macro_rules! with_where {
    ($name:ident) => {
        impl $name {
            /// Adds a condition (all conditions must hold).
            pub fn filter(mut self, c: Condition) -> Self {
                if let Some(cs) = self.0.conditions_mut() {
                    cs.push(c);
                }
                self
            }
            /// `_uuid == uuid`
            pub fn uuid(self, uuid: Uuid) -> Self {
                self.filter(Condition::uuid(uuid))
            }
            /// `column == value`
            pub fn where_eq(self, column: impl Into<String>, value: impl Into<Datum>) -> Self {
                self.filter(Condition::eq(column, value))
            }
        }
    };
}
macro_rules! with_row {
    ($name:ident) => {
        impl $name {
            /// Sets one column.
            pub fn value(mut self, column: impl Into<String>, value: impl Into<Datum>) -> Self {
                if let Some(r) = self.0.row_mut() {
                    r.insert(column.into(), value.into());
                }
                self
            }
            /// Sets several columns.
            pub fn row(mut self, row: Row) -> Self {
                if let Some(r) = self.0.row_mut() {
                    r.extend(row);
                }
                self
            }
        }
    };
}

builder!(Insert, "Builder of an insert operation.");
builder!(Select, "Builder of a select operation.");
builder!(Update, "Builder of an update operation.");
builder!(Mutate, "Builder of a mutate operation.");
builder!(Delete, "Builder of a delete operation.");
builder!(Wait, "Builder of a wait operation.");
with_row!(Insert);
with_row!(Update);
with_where!(Select);
with_where!(Update);
with_where!(Mutate);
with_where!(Delete);
with_where!(Wait);

impl Insert {
    /// Names the new row so that other operations can refer to it with [`Datum::named_uuid`].
    pub fn uuid_name(mut self, name: impl Into<String>) -> Self {
        if let Operation::Insert { uuid_name, .. } = &mut self.0 {
            *uuid_name = Some(name.into());
        }
        self
    }
    /// Chooses the new row's UUID (OVS extension `"uuid"`).
    pub fn with_uuid(mut self, u: Uuid) -> Self {
        if let Operation::Insert { uuid, .. } = &mut self.0 {
            *uuid = Some(u);
        }
        self
    }
}

impl Select {
    /// Limits the returned columns.
    pub fn columns<I: IntoIterator<Item = S>, S: Into<String>>(mut self, cols: I) -> Self {
        if let Operation::Select { columns, .. } = &mut self.0 {
            *columns = Some(cols.into_iter().map(Into::into).collect());
        }
        self
    }
}

impl Mutate {
    /// Adds a mutation.
    pub fn mutation(
        mut self,
        column: impl Into<String>,
        mutator: Mutator,
        value: impl Into<Datum>,
    ) -> Self {
        if let Operation::Mutate { mutations, .. } = &mut self.0 {
            mutations.push(Mutation {
                column: column.into(),
                mutator,
                value: value.into(),
            });
        }
        self
    }
    /// `column insert value`
    pub fn insert(self, column: impl Into<String>, value: impl Into<Datum>) -> Self {
        self.mutation(column, Mutator::Insert, value)
    }
    /// `column delete value`
    pub fn delete(self, column: impl Into<String>, value: impl Into<Datum>) -> Self {
        self.mutation(column, Mutator::Delete, value)
    }
    /// `column += value`
    pub fn add(self, column: impl Into<String>, value: impl Into<Datum>) -> Self {
        self.mutation(column, Mutator::Add, value)
    }
}

impl Wait {
    /// The columns compared.
    pub fn columns<I: IntoIterator<Item = S>, S: Into<String>>(mut self, cols: I) -> Self {
        if let Operation::Wait { columns, .. } = &mut self.0 {
            *columns = cols.into_iter().map(Into::into).collect();
        }
        self
    }
    /// Wait until equal or not equal.
    pub fn until(mut self, u: WaitUntil) -> Self {
        if let Operation::Wait { until, .. } = &mut self.0 {
            *until = u;
        }
        self
    }
    /// Adds an expected row.
    pub fn expect_row(mut self, row: Row) -> Self {
        if let Operation::Wait { rows, .. } = &mut self.0 {
            rows.push(row);
        }
        self
    }
    /// Gives up after `ms` milliseconds.
    pub fn timeout_ms(mut self, ms: u64) -> Self {
        if let Operation::Wait { timeout_ms, .. } = &mut self.0 {
            *timeout_ms = Some(ms);
        }
        self
    }
}

impl Serialize for Operation {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("op", self.name())?;
        if let Some(t) = self.table() {
            m.serialize_entry("table", t)?;
        }
        match self {
            Operation::Insert {
                row,
                uuid_name,
                uuid,
                ..
            } => {
                m.serialize_entry("row", row)?;
                if let Some(n) = uuid_name {
                    m.serialize_entry("uuid-name", n)?;
                }
                if let Some(u) = uuid {
                    m.serialize_entry("uuid", u)?;
                }
            }
            Operation::Select {
                conditions,
                columns,
                ..
            } => {
                m.serialize_entry("where", conditions)?;
                if let Some(c) = columns {
                    m.serialize_entry("columns", c)?;
                }
            }
            Operation::Update {
                conditions, row, ..
            } => {
                m.serialize_entry("where", conditions)?;
                m.serialize_entry("row", row)?;
            }
            Operation::Mutate {
                conditions,
                mutations,
                ..
            } => {
                m.serialize_entry("where", conditions)?;
                m.serialize_entry("mutations", mutations)?;
            }
            Operation::Delete { conditions, .. } => m.serialize_entry("where", conditions)?,
            Operation::Wait {
                conditions,
                columns,
                until,
                rows,
                timeout_ms,
                ..
            } => {
                m.serialize_entry("where", conditions)?;
                m.serialize_entry("columns", columns)?;
                m.serialize_entry(
                    "until",
                    if *until == WaitUntil::Equal {
                        "=="
                    } else {
                        "!="
                    },
                )?;
                m.serialize_entry("rows", rows)?;
                if let Some(t) = timeout_ms {
                    m.serialize_entry("timeout", t)?;
                }
            }
            Operation::Commit { durable } => m.serialize_entry("durable", durable)?,
            Operation::Abort => {}
            Operation::Comment(c) => m.serialize_entry("comment", c)?,
            Operation::Assert { lock } => m.serialize_entry("lock", lock)?,
        }
        m.end()
    }
}

/// A transaction: the database name and its operations, sent as the `transact` params
/// `[db, op, op, ...]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Transaction {
    /// The database.
    pub db: String,
    /// The operations, executed in order.
    pub ops: Vec<Operation>,
}

impl Transaction {
    /// An empty transaction on `db`.
    pub fn new(db: impl Into<String>) -> Self {
        Transaction {
            db: db.into(),
            ops: Vec::new(),
        }
    }

    /// Appends an operation.
    pub fn op(mut self, op: impl Into<Operation>) -> Self {
        self.ops.push(op.into());
        self
    }

    /// Appends an operation in place.
    pub fn push(&mut self, op: impl Into<Operation>) {
        self.ops.push(op.into());
    }

    /// Folds set `insert`/`delete` mutations of the same rows into one operation: a mutate whose table,
    /// conditions, column and mutator equal those of a later mutate is dropped and its elements are added to
    /// the later one, when every operation between them is an insert, update or delete on another table (they
    /// cannot observe the mutated rows). Planners emit one `ports insert` per new port; ovsdb-server applies
    /// each mutation to the whole set, so N of them cost O(N^2) on the server, one costs O(N).
    ///
    /// Returns, for each old operation index, its new index (None for an operation folded into a later
    /// one), so that results can still be matched to the operations that produced them.
    pub fn coalesce_set_mutations(&mut self) -> Vec<Option<usize>> {
        fn key(op: &Operation) -> Option<(&str, &[Condition], &str, Mutator)> {
            match op {
                Operation::Mutate {
                    table,
                    conditions,
                    mutations,
                } if mutations.len() == 1
                    && matches!(mutations[0].mutator, Mutator::Insert | Mutator::Delete)
                    && matches!(mutations[0].value, Datum::Atom(_) | Datum::Set(_)) =>
                {
                    Some((
                        table,
                        conditions,
                        &mutations[0].column,
                        mutations[0].mutator,
                    ))
                }
                _ => None,
            }
        }
        let n = self.ops.len();
        // into[i] = j: op i is folded into op j > i.
        let mut into: Vec<Option<usize>> = vec![None; n];
        // Open mutates that a later one may absorb: index of the latest with each key.
        let mut open: Vec<usize> = Vec::new();
        for j in 0..n {
            let op = &self.ops[j];
            if let Some(k) = key(op) {
                if let Some(pos) = open.iter().position(|&i| key(&self.ops[i]) == Some(k)) {
                    into[open[pos]] = Some(j);
                    open.remove(pos);
                }
                open.push(j);
                continue;
            }
            match op {
                Operation::Insert { table, .. }
                | Operation::Update { table, .. }
                | Operation::Delete { table, .. } => {
                    open.retain(|&i| self.ops[i].table() != Some(table.as_str()));
                }
                _ => open.clear(),
            }
        }
        if into.iter().all(Option::is_none) {
            return (0..n).map(Some).collect();
        }
        // Move the elements forward along each chain, in order, without duplicates.
        let mut carried: Vec<Option<Vec<Atom>>> = vec![None; n];
        let mut ops: Vec<Option<Operation>> = std::mem::take(&mut self.ops)
            .into_iter()
            .map(Some)
            .collect();
        for i in 0..n {
            let Some(Operation::Mutate { mutations, .. }) = ops[i].as_mut() else {
                continue;
            };
            if carried[i].is_none() && into[i].is_none() {
                continue;
            }
            let own = match std::mem::replace(&mut mutations[0].value, Datum::Set(Vec::new())) {
                Datum::Atom(a) => vec![a],
                Datum::Set(v) => v,
                m @ Datum::Map(_) => {
                    mutations[0].value = m;
                    continue;
                }
            };
            let mut all = carried[i].take().unwrap_or_default();
            all.extend(own);
            match into[i] {
                Some(j) => carried[j] = Some(all),
                None => {
                    let mut seen = std::collections::HashSet::with_capacity(all.len());
                    all.retain(|a| seen.insert(a.clone()));
                    mutations[0].value = Datum::Set(all);
                }
            }
        }
        let mut map = Vec::with_capacity(n);
        for (i, op) in ops.into_iter().enumerate() {
            match (into[i], op) {
                (None, Some(op)) => {
                    map.push(Some(self.ops.len()));
                    self.ops.push(op);
                }
                _ => map.push(None),
            }
        }
        map
    }

    /// Checks every operation against `schema`: database name, tables, columns, datum types and
    /// constraints, condition and mutation argument types, writes to immutable or implicit columns, and
    /// that each named-uuid used is declared by an insert of this transaction, once.
    pub fn validate(&self, schema: &DatabaseSchema) -> Result<(), ValidationError> {
        if self.db != schema.name {
            return Err(ValidationError::WrongDatabase {
                expected: schema.name.clone(),
                found: self.db.clone(),
            });
        }
        let mut declared = BTreeSet::new();
        for (i, op) in self.ops.iter().enumerate() {
            if let Operation::Insert {
                uuid_name: Some(n), ..
            } = op
            {
                if !declared.insert(n.as_str()) {
                    return Err(ValidationError::DuplicateUuidName {
                        index: i,
                        name: n.clone(),
                    });
                }
            }
        }
        for (i, op) in self.ops.iter().enumerate() {
            validate_op(schema, i, op, &declared)?;
        }
        Ok(())
    }
}

impl Serialize for Transaction {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut q = s.serialize_seq(Some(self.ops.len() + 1))?;
        q.serialize_element(&self.db)?;
        for op in &self.ops {
            q.serialize_element(op)?;
        }
        q.end()
    }
}

/// Why a transaction was rejected before being sent.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    /// The transaction names another database than the schema's.
    #[error("transaction is for database {found:?}, schema is {expected:?}")]
    WrongDatabase {
        /// The schema's database.
        expected: String,
        /// The transaction's.
        found: String,
    },
    /// No such table.
    #[error("operation {index}: no table {table:?}")]
    UnknownTable {
        /// Index of the operation.
        index: usize,
        /// The table named.
        table: String,
    },
    /// No such column.
    #[error("operation {index}: table {table:?} has no column {column:?}")]
    UnknownColumn {
        /// Index of the operation.
        index: usize,
        /// Table.
        table: String,
        /// The column named.
        column: String,
    },
    /// A datum that does not fit the column type.
    #[error("operation {index}: {table}.{column}: {source}")]
    Datum {
        /// Index of the operation.
        index: usize,
        /// Table.
        table: String,
        /// Column.
        column: String,
        /// What is wrong with the value.
        #[source]
        source: DatumError,
    },
    /// A column that may not be written (`_uuid`, `_version`, or not mutable after insert).
    #[error("operation {index}: {table}.{column} cannot be written by {op}")]
    ReadOnly {
        /// Index of the operation.
        index: usize,
        /// Table.
        table: String,
        /// Column.
        column: String,
        /// The operation.
        op: &'static str,
    },
    /// A condition function or mutator that does not apply to the column type.
    #[error("operation {index}: {table}.{column}: {what}")]
    NotApplicable {
        /// Index of the operation.
        index: usize,
        /// Table.
        table: String,
        /// Column.
        column: String,
        /// What does not apply.
        what: String,
    },
    /// Two inserts with the same uuid-name.
    #[error("operation {index}: uuid-name {name:?} declared twice")]
    DuplicateUuidName {
        /// Index of the second insert.
        index: usize,
        /// The name.
        name: String,
    },
    /// A named-uuid no insert of the transaction declares.
    #[error(
        "operation {index}: named-uuid {name:?} is not declared by an insert of this transaction"
    )]
    UndeclaredUuidName {
        /// Index of the operation using it.
        index: usize,
        /// The name.
        name: String,
    },
}

fn table<'s>(
    schema: &'s DatabaseSchema,
    index: usize,
    name: &str,
) -> Result<&'s TableSchema, ValidationError> {
    schema
        .table(name)
        .ok_or_else(|| ValidationError::UnknownTable {
            index,
            table: name.to_owned(),
        })
}

fn column_type<'s>(
    t: &'s TableSchema,
    index: usize,
    column: &str,
) -> Result<&'s ColumnType, ValidationError> {
    t.column(column)
        .map(|c| &c.ty)
        .ok_or_else(|| ValidationError::UnknownColumn {
            index,
            table: t.name.clone(),
            column: column.to_owned(),
        })
}

fn check_named(d: &Datum, index: usize, declared: &BTreeSet<&str>) -> Result<(), ValidationError> {
    let check = |a: &Atom| match a {
        Atom::NamedUuid(n) if !declared.contains(n.as_str()) => {
            Err(ValidationError::UndeclaredUuidName {
                index,
                name: n.clone(),
            })
        }
        _ => Ok(()),
    };
    match d {
        Datum::Atom(a) => check(a),
        Datum::Set(s) => s.iter().try_for_each(check),
        Datum::Map(m) => m
            .iter()
            .try_for_each(|(k, v)| check(k).and_then(|_| check(v))),
    }
}

fn validate_op(
    schema: &DatabaseSchema,
    index: usize,
    op: &Operation,
    declared: &BTreeSet<&str>,
) -> Result<(), ValidationError> {
    let Some(tname) = op.table() else {
        return Ok(());
    };
    let t = table(schema, index, tname)?;
    let datum_err = |column: &str, source| ValidationError::Datum {
        index,
        table: t.name.clone(),
        column: column.to_owned(),
        source,
    };
    let conditions: &[Condition] = match op {
        Operation::Select { conditions, .. }
        | Operation::Update { conditions, .. }
        | Operation::Mutate { conditions, .. }
        | Operation::Delete { conditions, .. }
        | Operation::Wait { conditions, .. } => conditions,
        _ => &[],
    };
    for c in conditions {
        let ty = column_type(t, index, &c.column)?;
        check_named(&c.value, index, declared)?;
        let relaxed = match c.function {
            Function::Eq | Function::Ne => ty.clone(),
            Function::Includes | Function::Excludes => {
                let mut r = ty.clone();
                if !ty.is_scalar() {
                    r.min = 0;
                    if c.function == Function::Excludes {
                        r.max = u64::MAX;
                    }
                }
                r
            }
            Function::Lt | Function::Le | Function::Gt | Function::Ge => {
                if !(ty.is_scalar() || ty.is_optional())
                    || !matches!(ty.key.atom, AtomType::Integer | AtomType::Real)
                {
                    return Err(ValidationError::NotApplicable {
                        index,
                        table: t.name.clone(),
                        column: c.column.clone(),
                        what: format!("{} needs an integer or real column", c.function.as_str()),
                    });
                }
                ColumnType::scalar(ty.key.atom)
            }
        };
        relaxed
            .validate_with(&c.value, false)
            .map_err(|e| datum_err(&c.column, e))?;
    }
    match op {
        Operation::Insert { row, .. } | Operation::Update { row, .. } => {
            for (col, d) in row {
                let cs = t
                    .column(col)
                    .ok_or_else(|| ValidationError::UnknownColumn {
                        index,
                        table: t.name.clone(),
                        column: col.clone(),
                    })?;
                let is_update = matches!(op, Operation::Update { .. });
                if col.starts_with('_') || (is_update && !cs.mutable) {
                    return Err(ValidationError::ReadOnly {
                        index,
                        table: t.name.clone(),
                        column: col.clone(),
                        op: op.name(),
                    });
                }
                check_named(d, index, declared)?;
                cs.ty.validate(d).map_err(|e| datum_err(col, e))?;
            }
        }
        Operation::Select {
            columns: Some(cols),
            ..
        }
        | Operation::Wait { columns: cols, .. } => {
            for c in cols {
                column_type(t, index, c)?;
            }
            if let Operation::Wait { rows, .. } = op {
                for r in rows {
                    for (col, d) in r {
                        column_type(t, index, col)?
                            .validate(d)
                            .map_err(|e| datum_err(col, e))?;
                    }
                }
            }
        }
        Operation::Mutate { mutations, .. } => {
            for m in mutations {
                let cs = t
                    .column(&m.column)
                    .ok_or_else(|| ValidationError::UnknownColumn {
                        index,
                        table: t.name.clone(),
                        column: m.column.clone(),
                    })?;
                if m.column.starts_with('_') || !cs.mutable {
                    return Err(ValidationError::ReadOnly {
                        index,
                        table: t.name.clone(),
                        column: m.column.clone(),
                        op: "mutate",
                    });
                }
                check_named(&m.value, index, declared)?;
                validate_mutation(&cs.ty, m).map_err(|what| match what {
                    Ok(e) => datum_err(&m.column, e),
                    Err(what) => ValidationError::NotApplicable {
                        index,
                        table: t.name.clone(),
                        column: m.column.clone(),
                        what,
                    },
                })?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn validate_mutation(ty: &ColumnType, m: &Mutation) -> Result<(), Result<DatumError, String>> {
    match m.mutator {
        Mutator::Add | Mutator::Sub | Mutator::Mul | Mutator::Div | Mutator::Mod => {
            let numeric = match m.mutator {
                Mutator::Mod => ty.key.atom == AtomType::Integer,
                _ => matches!(ty.key.atom, AtomType::Integer | AtomType::Real),
            };
            if !numeric || ty.is_map() {
                return Err(Err(format!(
                    "{} needs an integer or real column",
                    m.mutator.as_str()
                )));
            }
            let mut arg = ColumnType::scalar(ty.key.atom);
            arg.key = ty.key.clone();
            // The result is checked against the constraints by the server; the argument only has the type.
            arg.validate_with(&m.value, false).map_err(Ok)
        }
        Mutator::Insert | Mutator::Delete => {
            if ty.is_scalar() {
                return Err(Err(format!(
                    "{} needs a set or map column",
                    m.mutator.as_str()
                )));
            }
            let mut arg = ty.clone();
            arg.min = 0;
            if m.mutator == Mutator::Delete {
                arg.max = u64::MAX;
            }
            match arg.validate(&m.value) {
                Ok(()) => Ok(()),
                Err(e) if m.mutator == Mutator::Delete && ty.is_map() => {
                    // Deleting from a map also takes a set of keys.
                    let keys = ColumnType {
                        key: ty.key.clone(),
                        value: None,
                        min: 0,
                        max: u64::MAX,
                    };
                    keys.validate(&m.value).map_err(|_| Ok(e))
                }
                Err(e) => Err(Ok(e)),
            }
        }
    }
}

/// The server's error object: `{"error": "...", "details": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OvsdbError {
    /// The error tag (`"constraint violation"`, `"referential integrity violation"`, ...).
    pub error: String,
    /// The server's explanation, if any.
    pub details: Option<String>,
}

impl OvsdbError {
    /// Reads an error object (or a bare string).
    pub fn from_json(j: &Json) -> Self {
        match j {
            Json::String(s) => OvsdbError {
                error: s.clone(),
                details: None,
            },
            Json::Object(o) => OvsdbError {
                error: o
                    .get("error")
                    .and_then(Json::as_str)
                    .unwrap_or("unknown error")
                    .to_owned(),
                details: o.get("details").map(|d| match d {
                    Json::String(s) => s.clone(),
                    other => other.to_string(),
                }),
            },
            other => OvsdbError {
                error: other.to_string(),
                details: None,
            },
        }
    }
}

impl fmt::Display for OvsdbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.details {
            Some(d) => write!(f, "{}: {}", self.error, d),
            None => f.write_str(&self.error),
        }
    }
}

/// The result of one successful operation.
#[derive(Debug, Clone, PartialEq)]
pub enum OperationResult {
    /// insert: the new row's UUID.
    Insert(Uuid),
    /// select: the rows (untyped datums; see [`Datum::from_json_typed`] for exact decoding).
    Select(Vec<Row>),
    /// update, mutate, delete: the number of rows matched.
    Count(u64),
    /// wait, commit, comment, assert: nothing.
    Empty,
}

impl OperationResult {
    /// The inserted UUID, for an insert.
    pub fn uuid(&self) -> Option<Uuid> {
        match self {
            OperationResult::Insert(u) => Some(*u),
            _ => None,
        }
    }
    /// The rows, for a select.
    pub fn rows(&self) -> Option<&[Row]> {
        match self {
            OperationResult::Select(r) => Some(r),
            _ => None,
        }
    }
    /// The count, for update, mutate and delete.
    pub fn count(&self) -> Option<u64> {
        match self {
            OperationResult::Count(c) => Some(*c),
            _ => None,
        }
    }
}

/// A transaction the server refused: which operation failed (None when the error came after all
/// operations, e.g. at commit for a constraint or referential integrity violation) and the server's error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("transaction failed at {}: {error}", match (.index, .op) { (Some(i), Some(op)) => format!("operation {i} ({op})"), _ => "commit".to_owned() })]
pub struct TransactError {
    /// Index of the failed operation, or None for the trailing (commit-time) error.
    pub index: Option<usize>,
    /// Name of the failed operation.
    pub op: Option<&'static str>,
    /// The server's error and details.
    pub error: OvsdbError,
}

/// Why a `transact` reply could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResultError {
    /// The transaction failed on the server.
    #[error(transparent)]
    Failed(#[from] TransactError),
    /// The reply was not shaped like a transact result.
    #[error("malformed transact reply: {0}")]
    Malformed(String),
}

/// Parses a `transact` result array for the operations `ops` that were sent.
pub fn parse_results(
    ops: &[Operation],
    result: &Json,
) -> Result<Vec<OperationResult>, ResultError> {
    let arr = result
        .as_array()
        .ok_or_else(|| ResultError::Malformed("result is not an array".into()))?;
    // The first error decides: an error for operation i, or a trailing error beyond the operations.
    for (i, r) in arr.iter().enumerate() {
        if let Some(e) = r.as_object().and_then(|o| o.get("error")) {
            if !e.is_null() {
                let err = OvsdbError::from_json(r);
                return Err(TransactError {
                    index: (i < ops.len()).then_some(i),
                    op: ops.get(i).map(Operation::name),
                    error: err,
                }
                .into());
            }
        }
    }
    if arr.len() < ops.len() {
        return Err(ResultError::Malformed(format!(
            "{} results for {} operations",
            arr.len(),
            ops.len()
        )));
    }
    let mut out = Vec::with_capacity(ops.len());
    for (op, r) in ops.iter().zip(arr) {
        out.push(match op {
            Operation::Insert { .. } => {
                let u = r
                    .get("uuid")
                    .and_then(|u| Atom::from_json(u).ok())
                    .and_then(|a| a.as_uuid())
                    .ok_or_else(|| {
                        ResultError::Malformed(format!("insert result without uuid: {r}"))
                    })?;
                OperationResult::Insert(u)
            }
            Operation::Select { .. } => {
                let rows = r.get("rows").and_then(Json::as_array).ok_or_else(|| {
                    ResultError::Malformed(format!("select result without rows: {r}"))
                })?;
                let mut out_rows = Vec::with_capacity(rows.len());
                for row in rows {
                    out_rows
                        .push(parse_row(row).map_err(|e| ResultError::Malformed(e.to_string()))?);
                }
                OperationResult::Select(out_rows)
            }
            Operation::Update { .. } | Operation::Mutate { .. } | Operation::Delete { .. } => {
                OperationResult::Count(
                    r.get("count").and_then(Json::as_u64).ok_or_else(|| {
                        ResultError::Malformed(format!("result without count: {r}"))
                    })?,
                )
            }
            _ => OperationResult::Empty,
        });
    }
    Ok(out)
}

/// Reads a JSON row object into a [`Row`] without the schema.
pub fn parse_row(j: &Json) -> Result<Row, DatumError> {
    let o = j
        .as_object()
        .ok_or_else(|| DatumError::syntax("a row is an object", j))?;
    o.iter()
        .map(|(k, v)| Datum::from_json(v).map(|d| (k.clone(), d)))
        .collect()
}

/// Reads a JSON row object into a [`Row`], decoding each column with its type from `table` (unknown columns
/// are decoded untyped).
pub fn parse_row_typed(j: &Json, table: &TableSchema) -> Result<Row, DatumError> {
    let o = j
        .as_object()
        .ok_or_else(|| DatumError::syntax("a row is an object", j))?;
    o.iter()
        .map(|(k, v)| {
            let d = match table.column(k) {
                Some(c) => Datum::from_json_typed(v, &c.ty)?,
                None => Datum::from_json(v)?,
            };
            Ok((k.clone(), d))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn coalesce_set_mutations_folds_forward() {
        let ls = || Operation::mutate("Logical_Switch").filter(Condition::eq("name", "ls0"));
        let mut txn = Transaction::new("OVN_Northbound");
        for i in 0..3 {
            txn.push(Operation::insert("Logical_Switch_Port").uuid_name(format!("p{i}")));
            txn.push(ls().insert("ports", Datum::named_uuid(format!("p{i}"))));
        }
        // Another switch, then an op on the mutated table: no folding across it.
        txn.push(
            Operation::mutate("Logical_Switch")
                .filter(Condition::eq("name", "ls1"))
                .insert("ports", Datum::named_uuid("p0")),
        );
        txn.push(Operation::update("Logical_Switch").filter(Condition::eq("name", "ls0")));
        txn.push(ls().insert("ports", Datum::named_uuid("p2")));
        let map = txn.coalesce_set_mutations();
        assert_eq!(
            map,
            vec![
                Some(0),
                None,
                Some(1),
                None,
                Some(2),
                Some(3),
                Some(4),
                Some(5),
                Some(6)
            ]
        );
        // The transaction serializes as [db, op...].
        let j = serde_json::to_value(&txn).unwrap();
        assert_eq!(
            j[4]["mutations"],
            json!([[
                "ports",
                "insert",
                [
                    "set",
                    [
                        ["named-uuid", "p0"],
                        ["named-uuid", "p1"],
                        ["named-uuid", "p2"]
                    ]
                ]
            ]])
        );
        assert_eq!(
            j[7]["mutations"],
            json!([["ports", "insert", ["named-uuid", "p2"]]])
        );
        // Nothing to fold: identity.
        let mut t = Transaction::new("x").op(ls().insert("ports", Datum::named_uuid("a")));
        assert_eq!(t.coalesce_set_mutations(), vec![Some(0)]);
    }

    fn nb() -> DatabaseSchema {
        DatabaseSchema::parse_str(include_str!("../schemas/ovn-nb.ovsschema")).unwrap()
    }

    #[test]
    fn encodes_like_the_rfc() {
        let txn = Transaction::new("OVN_Northbound")
            .op(Operation::insert("Logical_Switch_Port")
                .uuid_name("p")
                .value("name", "a")
                .value("external_ids", Datum::map([("k", "v")])))
            .op(Operation::mutate("Logical_Switch")
                .where_eq("name", "ls0")
                .insert("ports", Datum::named_uuid("p")))
            .op(Operation::select("Logical_Switch").columns(["name"]))
            .op(Operation::delete("ACL").filter(Condition::includes("match", "x")))
            .op(Operation::wait("Logical_Switch")
                .columns(["name"])
                .timeout_ms(0))
            .op(Operation::comment("hi"))
            .op(Operation::commit(false));
        // The transaction serializes as [db, op...].
        let j = serde_json::to_value(&txn).unwrap();
        assert_eq!(
            j,
            json!(["OVN_Northbound",
                {"op":"insert","table":"Logical_Switch_Port","row":{"external_ids":["map",[["k","v"]]],"name":"a"},"uuid-name":"p"},
                {"op":"mutate","table":"Logical_Switch","where":[["name","==","ls0"]],"mutations":[["ports","insert",["named-uuid","p"]]]},
                {"op":"select","table":"Logical_Switch","where":[],"columns":["name"]},
                {"op":"delete","table":"ACL","where":[["match","includes","x"]]},
                {"op":"wait","table":"Logical_Switch","where":[],"columns":["name"],"until":"==","rows":[],"timeout":0},
                {"op":"comment","comment":"hi"},
                {"op":"commit","durable":false}])
        );
    }

    #[test]
    fn validation_catches_mistakes() {
        let s = nb();
        let ok = Transaction::new("OVN_Northbound")
            .op(Operation::insert("Logical_Switch_Port")
                .uuid_name("p")
                .value("name", "a")
                .value("tag_request", 5i64))
            .op(Operation::mutate("Logical_Switch")
                .where_eq("name", "ls0")
                .insert("ports", Datum::named_uuid("p")))
            .op(Operation::mutate("Logical_Switch")
                .uuid(Uuid::NIL)
                .delete("external_ids", Datum::set(["k"])))
            .op(Operation::update("Logical_Switch_Port")
                .where_eq("name", "a")
                .value("enabled", Datum::set([true])))
            .op(
                Operation::delete("Logical_Switch_Port").filter(Condition::new(
                    "tag",
                    Function::Lt,
                    5i64,
                )),
            );
        ok.validate(&s).unwrap();
        let err = |op: Operation| {
            Transaction::new("OVN_Northbound")
                .op(op)
                .validate(&s)
                .unwrap_err()
        };
        assert!(matches!(
            err(Operation::insert("Nope").build()),
            ValidationError::UnknownTable { .. }
        ));
        assert!(matches!(
            err(Operation::insert("Logical_Switch")
                .value("nmae", "x")
                .build()),
            ValidationError::UnknownColumn { .. }
        ));
        assert!(matches!(
            err(Operation::insert("Logical_Switch")
                .value("name", 3i64)
                .build()),
            ValidationError::Datum {
                source: DatumError::WrongType { .. },
                ..
            }
        ));
        assert!(matches!(
            err(Operation::insert("Logical_Switch_Port")
                .value("name", "a")
                .value("tag_request", 5000i64)
                .build()),
            ValidationError::Datum {
                source: DatumError::Constraint { .. },
                ..
            }
        ));
        assert!(matches!(
            err(Operation::insert("ACL").value("action", "explode").build()),
            ValidationError::Datum {
                source: DatumError::Constraint { .. },
                ..
            }
        ));
        assert!(matches!(
            err(Operation::mutate("Logical_Switch")
                .insert("ports", Datum::named_uuid("zz"))
                .build()),
            ValidationError::UndeclaredUuidName { .. }
        ));
        assert!(matches!(
            err(Operation::update("Logical_Switch")
                .value("_uuid", Datum::uuid(Uuid::NIL))
                .build()),
            ValidationError::ReadOnly { .. }
        ));
        assert!(matches!(
            err(Operation::mutate("Logical_Switch")
                .add("name", 1i64)
                .build()),
            ValidationError::NotApplicable { .. }
        ));
        assert!(matches!(
            err(Operation::select("Logical_Switch")
                .filter(Condition::eq("name", 1i64))
                .build()),
            ValidationError::Datum { .. }
        ));
        let wrong_db = Transaction::new("Open_vSwitch").validate(&s).unwrap_err();
        assert!(matches!(wrong_db, ValidationError::WrongDatabase { .. }));
    }

    #[test]
    fn results_and_errors() {
        let ops = vec![
            Operation::insert("T").build(),
            Operation::select("T").build(),
            Operation::mutate("T").build(),
            Operation::comment("c"),
        ];
        let r = json!([
            {"uuid":["uuid","00000000-0000-0000-0000-000000000001"]},
            {"rows":[{"name":"a","ports":["set",[]]}]},
            {"count":2},
            {}
        ]);
        let res = parse_results(&ops, &r).unwrap();
        assert_eq!(res[0].uuid(), Some(Uuid::from_u128(1)));
        assert_eq!(res[1].rows().unwrap()[0]["name"], Datum::from("a"));
        assert_eq!(res[2].count(), Some(2));
        // An operation error.
        let r = json!([{"uuid":["uuid","00000000-0000-0000-0000-000000000001"]}, {"error":"syntax error","details":"bad"}, null, null]);
        let e = parse_results(&ops, &r).unwrap_err();
        assert_eq!(
            e,
            ResultError::Failed(TransactError {
                index: Some(1),
                op: Some("select"),
                error: OvsdbError {
                    error: "syntax error".into(),
                    details: Some("bad".into())
                }
            })
        );
        // The trailing commit error.
        let r = json!([{"uuid":["uuid","00000000-0000-0000-0000-000000000001"]}, {"rows":[]}, {"count":0}, {},
            {"error":"constraint violation","details":"duplicate"}]);
        let ResultError::Failed(e) = parse_results(&ops, &r).unwrap_err() else {
            panic!()
        };
        assert_eq!(e.index, None);
        assert_eq!(e.error.error, "constraint violation");
    }
}
