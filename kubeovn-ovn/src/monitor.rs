//! Monitors: what to watch (`<monitor-requests>`, `<monitor-cond-requests>`) and the table updates the server
//! sends back (`update` for `monitor`, `update2` for `monitor_cond`, `update3` for `monitor_cond_since`).

use std::collections::BTreeMap;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use serde_json::Value as Json;

use crate::datum::DatumError;
use crate::ops::{parse_row, parse_row_typed, Condition, Row};
use crate::schema::DatabaseSchema;
use crate::uuid::Uuid;

/// Which kinds of change a monitor reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MonitorSelect {
    /// Rows present when the monitor starts.
    pub initial: bool,
    /// Inserted rows.
    pub insert: bool,
    /// Deleted rows.
    pub delete: bool,
    /// Modified rows.
    pub modify: bool,
}

impl Default for MonitorSelect {
    fn default() -> Self {
        MonitorSelect {
            initial: true,
            insert: true,
            delete: true,
            modify: true,
        }
    }
}

/// What to monitor in one table.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MonitorRequest {
    /// Columns to report (None: all).
    pub columns: Option<Vec<String>>,
    /// Conditions rows must meet (monitor_cond only; None: every row).
    pub conditions: Option<Vec<Condition>>,
    /// Kinds of change (None: all).
    pub select: Option<MonitorSelect>,
}

impl MonitorRequest {
    /// Every column, every row, every change.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only these columns.
    pub fn columns<I: IntoIterator<Item = S>, S: Into<String>>(mut self, cols: I) -> Self {
        self.columns = Some(cols.into_iter().map(Into::into).collect());
        self
    }

    /// Only rows meeting this condition too (monitor_cond and monitor_cond_since).
    pub fn filter(mut self, c: Condition) -> Self {
        self.conditions.get_or_insert_with(Vec::new).push(c);
        self
    }

    /// Only these kinds of change.
    pub fn select(mut self, s: MonitorSelect) -> Self {
        self.select = Some(s);
        self
    }
}

impl Serialize for MonitorRequest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        if let Some(c) = &self.columns {
            m.serialize_entry("columns", c)?;
        }
        if let Some(w) = &self.conditions {
            m.serialize_entry("where", w)?;
        }
        if let Some(sel) = &self.select {
            m.serialize_entry("select", sel)?;
        }
        m.end()
    }
}

/// Monitor requests by table (each table may have several requests with disjoint columns).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MonitorRequests(pub BTreeMap<String, Vec<MonitorRequest>>);

impl MonitorRequests {
    /// No tables yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a request for `table`.
    pub fn table(mut self, table: impl Into<String>, req: MonitorRequest) -> Self {
        self.0.entry(table.into()).or_default().push(req);
        self
    }

    /// Checks tables, columns and conditions against the schema.
    pub fn validate(&self, schema: &DatabaseSchema) -> Result<(), crate::ops::ValidationError> {
        use crate::ops::{Operation, Transaction, ValidationError};
        for (t, reqs) in &self.0 {
            let ts = schema
                .table(t)
                .ok_or_else(|| ValidationError::UnknownTable {
                    index: 0,
                    table: t.clone(),
                })?;
            for r in reqs {
                for c in r.columns.iter().flatten() {
                    if ts.column(c).is_none() {
                        return Err(ValidationError::UnknownColumn {
                            index: 0,
                            table: t.clone(),
                            column: c.clone(),
                        });
                    }
                }
                // Conditions are checked as those of a select.
                let mut sel = Operation::select(t.clone());
                for c in r.conditions.iter().flatten() {
                    sel = sel.filter(c.clone());
                }
                Transaction::new(schema.name.clone())
                    .op(sel)
                    .validate(schema)?;
            }
        }
        Ok(())
    }
}

impl Serialize for MonitorRequests {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// The change to one row.
#[derive(Debug, Clone, PartialEq)]
pub enum RowUpdate {
    /// `update` format: the old values of the changed columns and/or the new row.
    Update {
        /// Old values (absent for an insert).
        old: Option<Row>,
        /// New row (absent for a delete).
        new: Option<Row>,
    },
    /// update2/3: a row present when the monitor started.
    Initial(Row),
    /// update2/3: an inserted row.
    Insert(Row),
    /// update2/3: a deleted row (with its last values if the server sent them).
    Delete(Option<Row>),
    /// update2/3: a modified row; each column holds the difference (for sets and maps, the elements added or
    /// removed; for scalars, the new value).
    Modify(Row),
}

/// Row changes by table, then by row UUID.
pub type TableUpdates = BTreeMap<String, BTreeMap<Uuid, RowUpdate>>;

/// Why an update could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UpdateError {
    /// Not shaped like table updates.
    #[error("malformed table updates: {0}")]
    Malformed(String),
    /// A bad datum inside a row.
    #[error("table {table:?} row {row}: {source}")]
    Datum {
        /// Table.
        table: String,
        /// Row.
        row: Uuid,
        /// The datum error.
        #[source]
        source: DatumError,
    },
}

/// Reads `<table-updates>` (update, `v2` false) or `<table-updates2>` (update2 and update3, `v2` true); with a
/// schema, datums are decoded exactly by column type.
pub fn parse_table_updates(
    j: &Json,
    v2: bool,
    schema: Option<&DatabaseSchema>,
) -> Result<TableUpdates, UpdateError> {
    let mal = |w: &str| UpdateError::Malformed(w.to_owned());
    let tables = j.as_object().ok_or_else(|| mal("not an object"))?;
    let mut out = TableUpdates::new();
    for (t, rows) in tables {
        let ts = schema.and_then(|s| s.table(t));
        let rows = rows
            .as_object()
            .ok_or_else(|| mal("table entry is not an object"))?;
        let mut tout = BTreeMap::new();
        for (u, r) in rows {
            let uuid = Uuid::parse(u)
                .map_err(|_| UpdateError::Malformed(format!("row key {u:?} is not a uuid")))?;
            let derr = |source| UpdateError::Datum {
                table: t.clone(),
                row: uuid,
                source,
            };
            let row = |j: &Json| match ts {
                Some(ts) => parse_row_typed(j, ts),
                None => parse_row(j),
            };
            let ro = r
                .as_object()
                .ok_or_else(|| mal("row update is not an object"))?;
            let upd = if v2 {
                let (k, v) = ro.iter().next().ok_or_else(|| mal("empty row update"))?;
                match k.as_str() {
                    "initial" => RowUpdate::Initial(row(v).map_err(derr)?),
                    "insert" => RowUpdate::Insert(row(v).map_err(derr)?),
                    "modify" => RowUpdate::Modify(parse_modify(v, ts).map_err(derr)?),
                    "delete" => RowUpdate::Delete(if v.is_null() {
                        None
                    } else {
                        Some(row(v).map_err(derr)?)
                    }),
                    other => {
                        return Err(UpdateError::Malformed(format!(
                            "unknown row update {other:?}"
                        )))
                    }
                }
            } else {
                RowUpdate::Update {
                    old: ro.get("old").map(&row).transpose().map_err(derr)?,
                    new: ro.get("new").map(&row).transpose().map_err(derr)?,
                }
            };
            tout.insert(uuid, upd);
        }
        out.insert(t.clone(), tout);
    }
    Ok(out)
}

/// Reads `<table-updates>` (`v2` false) or `<table-updates2>` (`v2` true) from JSON text, decoding rows and
/// datums directly (no `serde_json::Value` tree): the same result as [`parse_table_updates`], several times
/// faster on a large initial reply.
pub fn parse_table_updates_str(
    text: &str,
    v2: bool,
    schema: Option<&DatabaseSchema>,
) -> Result<TableUpdates, UpdateError> {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_str(text);
    let fast = crate::decode::TableUpdatesSeed { schema, v2 }
        .deserialize(&mut de)
        .and_then(|u| de.end().map(|()| u));
    fast.or_else(|e| slow_path(text, e, |j| parse_table_updates(j, v2, schema)))
}

/// The exact error (or, for the odd input the direct decoder refuses, the result) of the Value-based reader.
fn slow_path<T>(
    text: &str,
    fast: serde_json::Error,
    f: impl FnOnce(&Json) -> Result<T, UpdateError>,
) -> Result<T, UpdateError> {
    match serde_json::from_str::<Json>(text) {
        Ok(j) => f(&j),
        Err(_) => Err(UpdateError::Malformed(fast.to_string())),
    }
}

/// Reads the reply to `monitor_cond_since` from JSON text, decoding directly (see
/// [`parse_table_updates_str`]).
pub fn parse_monitor_since_reply_str(
    text: &str,
    schema: Option<&DatabaseSchema>,
) -> Result<MonitorSinceReply, UpdateError> {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_str(text);
    let fast = crate::decode::SinceReplySeed(schema)
        .deserialize(&mut de)
        .and_then(|u| de.end().map(|()| u));
    match fast {
        Ok((found, last_txn_id, updates)) => Ok(MonitorSinceReply {
            found,
            last_txn_id,
            updates,
        }),
        Err(e) => slow_path(text, e, |j| parse_monitor_since_reply(j, schema)),
    }
}

/// In a `modify`, a set column's difference is a set even when the column allows one element, and a map
/// difference is a map: decode with the column's element type but no count limits.
fn parse_modify(j: &Json, ts: Option<&crate::schema::TableSchema>) -> Result<Row, DatumError> {
    let Some(ts) = ts else { return parse_row(j) };
    let o = j
        .as_object()
        .ok_or_else(|| DatumError::syntax("a row is an object", j))?;
    o.iter()
        .map(|(k, v)| {
            let d = match ts.column(k) {
                Some(c) if !c.ty.is_scalar() => {
                    let mut ty = c.ty.clone();
                    ty.min = 0;
                    ty.max = u64::MAX;
                    crate::datum::Datum::from_json_typed(v, &ty)?
                }
                Some(c) => crate::datum::Datum::from_json_typed(v, &c.ty)?,
                None => crate::datum::Datum::from_json(v)?,
            };
            Ok((k.clone(), d))
        })
        .collect()
}

/// The reply to `monitor_cond_since`.
#[derive(Debug, Clone, PartialEq)]
pub struct MonitorSinceReply {
    /// Whether the server still had the requested transaction, so that `updates` holds only what changed since.
    pub found: bool,
    /// The id of the last transaction the updates include (to resume from later).
    pub last_txn_id: Option<Uuid>,
    /// The initial contents (everything if not found, the difference if found).
    pub updates: TableUpdates,
}

/// Reads the reply to `monitor_cond_since`: `[found, last-txn-id, table-updates2]`.
pub fn parse_monitor_since_reply(
    j: &Json,
    schema: Option<&DatabaseSchema>,
) -> Result<MonitorSinceReply, UpdateError> {
    let a = j
        .as_array()
        .filter(|a| a.len() == 3)
        .ok_or_else(|| UpdateError::Malformed("expected [found, last-txn-id, updates]".into()))?;
    Ok(MonitorSinceReply {
        found: a[0].as_bool().unwrap_or(false),
        last_txn_id: a[1].as_str().and_then(|s| Uuid::parse(s).ok()),
        updates: parse_table_updates(&a[2], true, schema)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datum::Datum;
    use serde_json::json;

    #[test]
    fn requests_serialize() {
        let r = MonitorRequests::new()
            .table(
                "Logical_Switch",
                MonitorRequest::all().columns(["name", "ports"]),
            )
            .table(
                "ACL",
                MonitorRequest::all()
                    .filter(Condition::eq("priority", 5i64))
                    .select(MonitorSelect {
                        initial: false,
                        ..Default::default()
                    }),
            );
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"ACL":[{"where":[["priority","==",5]],"select":{"initial":false,"insert":true,"delete":true,"modify":true}}],
                   "Logical_Switch":[{"columns":["name","ports"]}]})
        );
        let nb = DatabaseSchema::parse_str(include_str!("../schemas/ovn-nb.ovsschema")).unwrap();
        r.validate(&nb).unwrap();
        assert!(MonitorRequests::new()
            .table("X", MonitorRequest::all())
            .validate(&nb)
            .is_err());
        assert!(MonitorRequests::new()
            .table("ACL", MonitorRequest::all().columns(["nope"]))
            .validate(&nb)
            .is_err());
    }

    #[test]
    fn updates_parse() {
        let nb = DatabaseSchema::parse_str(include_str!("../schemas/ovn-nb.ovsschema")).unwrap();
        let u1 = "00000000-0000-0000-0000-000000000001";
        let j = json!({"Logical_Switch": {u1: {"modify": {"ports": ["uuid", u1], "name": "b"}}},
                       "Logical_Switch_Port": {u1: {"insert": {"name": "p", "tag_request": 3}}, "00000000-0000-0000-0000-000000000002": {"delete": null}}});
        let t = parse_table_updates(&j, true, Some(&nb)).unwrap();
        let RowUpdate::Modify(m) = &t["Logical_Switch"][&Uuid::from_u128(1)] else {
            panic!()
        };
        assert_eq!(m["ports"], Datum::set([Uuid::from_u128(1)]));
        assert_eq!(m["name"], Datum::from("b"));
        let RowUpdate::Insert(r) = &t["Logical_Switch_Port"][&Uuid::from_u128(1)] else {
            panic!()
        };
        assert_eq!(r["tag_request"], Datum::set([3i64]));
        assert_eq!(
            t["Logical_Switch_Port"][&Uuid::from_u128(2)],
            RowUpdate::Delete(None)
        );
        let v1 = json!({"T": {u1: {"new": {"a": 1}}}});
        let t = parse_table_updates(&v1, false, None).unwrap();
        assert!(matches!(
            &t["T"][&Uuid::from_u128(1)],
            RowUpdate::Update {
                old: None,
                new: Some(_)
            }
        ));
        let since = parse_monitor_since_reply(&json!([true, u1, {}]), None).unwrap();
        assert!(since.found);
        assert_eq!(since.last_txn_id, Some(Uuid::from_u128(1)));
    }
}
