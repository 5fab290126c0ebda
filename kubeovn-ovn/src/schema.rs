//! Database schemas (RFC 7047 section 3.2) parsed from `.ovsschema` files or `get_schema` replies.

use std::collections::BTreeMap;

use serde_json::Value as Json;

use crate::datum::{Atom, AtomType, Datum};

/// Why a schema document could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid schema at {path}: {what}")]
pub struct SchemaError {
    /// Where in the document (`tables.Logical_Switch.columns.ports.type`).
    pub path: String,
    /// What was wrong.
    pub what: String,
}

fn serr(path: &str, what: impl Into<String>) -> SchemaError {
    SchemaError {
        path: path.to_owned(),
        what: what.into(),
    }
}

/// A whole database schema.
#[derive(Debug, Clone, PartialEq)]
pub struct DatabaseSchema {
    /// The database name (`OVN_Northbound`).
    pub name: String,
    /// The schema version (`7.0.0`).
    pub version: String,
    /// The optional checksum string.
    pub cksum: Option<String>,
    /// Tables by name.
    pub tables: BTreeMap<String, TableSchema>,
}

/// One table of a schema.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSchema {
    /// The table name.
    pub name: String,
    /// The declared columns by name (without `_uuid` and `_version`).
    pub columns: BTreeMap<String, ColumnSchema>,
    /// The maximum number of rows, if limited.
    pub max_rows: Option<u64>,
    /// Whether rows are kept without strong references to them.
    pub is_root: bool,
    /// Sets of columns whose values must be unique across rows.
    pub indexes: Vec<Vec<String>>,
    uuid_column: ColumnSchema,
    version_column: ColumnSchema,
}

/// One column of a table.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnSchema {
    /// The column name.
    pub name: String,
    /// The column type.
    pub ty: ColumnType,
    /// Whether the column is not persisted.
    pub ephemeral: bool,
    /// Whether the column may change after insertion.
    pub mutable: bool,
}

/// A column type: a key base type, an optional value base type (for maps) and element counts.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnType {
    /// The key (or element) type.
    pub key: BaseType,
    /// The value type, for a map.
    pub value: Option<BaseType>,
    /// Minimum number of elements (0 or 1).
    pub min: u64,
    /// Maximum number of elements (`u64::MAX` for `"unlimited"`).
    pub max: u64,
}

/// Strong or weak reference semantics of a uuid column with a `refTable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RefType {
    /// A strong reference: the referenced row must exist and is kept alive.
    #[default]
    Strong,
    /// A weak reference: removed when the referenced row goes away.
    Weak,
}

/// An atomic type with its constraints.
#[derive(Debug, Clone, PartialEq)]
pub struct BaseType {
    /// The atomic type.
    pub atom: AtomType,
    /// Allowed values, if enumerated (sorted).
    pub enumeration: Option<Vec<Atom>>,
    /// Smallest allowed integer.
    pub min_integer: Option<i64>,
    /// Largest allowed integer.
    pub max_integer: Option<i64>,
    /// Smallest allowed real.
    pub min_real: Option<f64>,
    /// Largest allowed real.
    pub max_real: Option<f64>,
    /// Shortest allowed string, in characters.
    pub min_length: Option<u64>,
    /// Longest allowed string, in characters.
    pub max_length: Option<u64>,
    /// The table a uuid refers to.
    pub ref_table: Option<String>,
    /// Strong or weak (meaningful with `ref_table`).
    pub ref_type: RefType,
}

impl BaseType {
    /// An unconstrained base type.
    pub fn new(atom: AtomType) -> Self {
        BaseType {
            atom,
            enumeration: None,
            min_integer: None,
            max_integer: None,
            min_real: None,
            max_real: None,
            min_length: None,
            max_length: None,
            ref_table: None,
            ref_type: RefType::Strong,
        }
    }

    fn parse(j: &Json, path: &str) -> Result<Self, SchemaError> {
        match j {
            Json::String(s) => AtomType::from_name(s)
                .map(BaseType::new)
                .ok_or_else(|| serr(path, format!("unknown type {s:?}"))),
            Json::Object(o) => {
                let t = o
                    .get("type")
                    .and_then(Json::as_str)
                    .ok_or_else(|| serr(path, "missing \"type\""))?;
                let mut bt = BaseType::new(
                    AtomType::from_name(t)
                        .ok_or_else(|| serr(path, format!("unknown type {t:?}")))?,
                );
                if let Some(e) = o.get("enum") {
                    let d = Datum::from_json(e).map_err(|e| serr(path, format!("enum: {e}")))?;
                    let mut atoms = Vec::with_capacity(d.len());
                    for a in d.atoms() {
                        atoms.push(if bt.atom == AtomType::Real {
                            match a {
                                Atom::Integer(i) => Atom::Real(*i as f64),
                                a => a.clone(),
                            }
                        } else {
                            a.clone()
                        });
                    }
                    if let Some(a) = atoms.iter().find(|a| a.atom_type() != bt.atom) {
                        return Err(serr(path, format!("enum value {a:?} is not a {}", bt.atom)));
                    }
                    // A set: kept sorted and without duplicates, as ovsdb-server returns it.
                    atoms.sort();
                    atoms.dedup();
                    bt.enumeration = Some(atoms);
                }
                let int = |k: &str| o.get(k).and_then(Json::as_i64);
                let uint = |k: &str| o.get(k).and_then(Json::as_u64);
                let real = |k: &str| o.get(k).and_then(Json::as_f64);
                bt.min_integer = int("minInteger");
                bt.max_integer = int("maxInteger");
                bt.min_real = real("minReal");
                bt.max_real = real("maxReal");
                bt.min_length = uint("minLength");
                bt.max_length = uint("maxLength");
                bt.ref_table = o.get("refTable").and_then(Json::as_str).map(str::to_owned);
                bt.ref_type = match o.get("refType").and_then(Json::as_str) {
                    None | Some("strong") => RefType::Strong,
                    Some("weak") => RefType::Weak,
                    Some(x) => return Err(serr(path, format!("unknown refType {x:?}"))),
                };
                Ok(bt)
            }
            _ => Err(serr(path, "a base type is a string or an object")),
        }
    }
}

impl ColumnType {
    /// A scalar column of `atom`.
    pub fn scalar(atom: AtomType) -> Self {
        ColumnType {
            key: BaseType::new(atom),
            value: None,
            min: 1,
            max: 1,
        }
    }

    /// Parses the JSON `type` of a column.
    pub fn parse(j: &Json) -> Result<Self, SchemaError> {
        Self::parse_at(j, "type")
    }

    fn parse_at(j: &Json, path: &str) -> Result<Self, SchemaError> {
        match j {
            Json::String(_) => Ok(ColumnType {
                key: BaseType::parse(j, path)?,
                value: None,
                min: 1,
                max: 1,
            }),
            Json::Object(o) => {
                let key = BaseType::parse(
                    o.get("key").ok_or_else(|| serr(path, "missing \"key\""))?,
                    &format!("{path}.key"),
                )?;
                let value = o
                    .get("value")
                    .map(|v| BaseType::parse(v, &format!("{path}.value")))
                    .transpose()?;
                let min = match o.get("min") {
                    None => 1,
                    Some(v) => v
                        .as_u64()
                        .filter(|m| *m <= 1)
                        .ok_or_else(|| serr(path, "min must be 0 or 1"))?,
                };
                let max = match o.get("max") {
                    None => 1,
                    Some(Json::String(s)) if s == "unlimited" => u64::MAX,
                    Some(v) => v
                        .as_u64()
                        .filter(|m| *m >= 1)
                        .ok_or_else(|| serr(path, "max must be >= 1 or \"unlimited\""))?,
                };
                if min > max {
                    return Err(serr(path, "min > max"));
                }
                Ok(ColumnType {
                    key,
                    value,
                    min,
                    max,
                })
            }
            _ => Err(serr(path, "a type is a string or an object")),
        }
    }

    /// Exactly one atom (`min` = `max` = 1, not a map).
    pub fn is_scalar(&self) -> bool {
        self.value.is_none() && self.min == 1 && self.max == 1
    }

    /// Zero or one atom.
    pub fn is_optional(&self) -> bool {
        self.value.is_none() && self.min == 0 && self.max == 1
    }

    /// A map column.
    pub fn is_map(&self) -> bool {
        self.value.is_some()
    }

    /// A set column (neither scalar nor map).
    pub fn is_set(&self) -> bool {
        self.value.is_none() && !self.is_scalar()
    }
}

impl TableSchema {
    /// Parses one table from its JSON object.
    pub fn parse(name: &str, j: &Json) -> Result<Self, SchemaError> {
        let path = format!("tables.{name}");
        let o = j
            .as_object()
            .ok_or_else(|| serr(&path, "a table is an object"))?;
        let cols = o
            .get("columns")
            .and_then(Json::as_object)
            .ok_or_else(|| serr(&path, "missing \"columns\""))?;
        let mut columns = BTreeMap::new();
        for (cname, cj) in cols {
            let cpath = format!("{path}.columns.{cname}");
            if cname.starts_with('_') {
                return Err(serr(&cpath, "column names starting with _ are reserved"));
            }
            let co = cj
                .as_object()
                .ok_or_else(|| serr(&cpath, "a column is an object"))?;
            let ty = ColumnType::parse_at(
                co.get("type")
                    .ok_or_else(|| serr(&cpath, "missing \"type\""))?,
                &format!("{cpath}.type"),
            )?;
            columns.insert(
                cname.clone(),
                ColumnSchema {
                    name: cname.clone(),
                    ty,
                    ephemeral: co.get("ephemeral").and_then(Json::as_bool).unwrap_or(false),
                    mutable: co.get("mutable").and_then(Json::as_bool).unwrap_or(true),
                },
            );
        }
        let mut indexes = Vec::new();
        if let Some(ix) = o.get("indexes") {
            for i in ix
                .as_array()
                .ok_or_else(|| serr(&path, "indexes must be an array"))?
            {
                let cols: Vec<String> = i
                    .as_array()
                    .ok_or_else(|| serr(&path, "an index is an array of column names"))?
                    .iter()
                    .map(|c| {
                        c.as_str()
                            .map(str::to_owned)
                            .ok_or_else(|| serr(&path, "index column must be a string"))
                    })
                    .collect::<Result<_, _>>()?;
                if let Some(c) = cols
                    .iter()
                    .find(|c| !columns.contains_key(*c) && *c != "_uuid" && *c != "_version")
                {
                    return Err(serr(&path, format!("index names unknown column {c:?}")));
                }
                indexes.push(cols);
            }
        }
        Ok(TableSchema {
            name: name.to_owned(),
            columns,
            max_rows: o.get("maxRows").and_then(Json::as_u64),
            is_root: o.get("isRoot").and_then(Json::as_bool).unwrap_or(false),
            indexes,
            uuid_column: implicit("_uuid"),
            version_column: implicit("_version"),
        })
    }

    /// A column by name, including the implicit `_uuid` and `_version`.
    pub fn column(&self, name: &str) -> Option<&ColumnSchema> {
        match name {
            "_uuid" => Some(&self.uuid_column),
            "_version" => Some(&self.version_column),
            _ => self.columns.get(name),
        }
    }
}

fn implicit(name: &str) -> ColumnSchema {
    ColumnSchema {
        name: name.to_owned(),
        ty: ColumnType::scalar(AtomType::Uuid),
        ephemeral: false,
        mutable: false,
    }
}

impl DatabaseSchema {
    /// Parses a schema from its JSON document.
    pub fn parse(j: &Json) -> Result<Self, SchemaError> {
        let o = j
            .as_object()
            .ok_or_else(|| serr("", "a schema is an object"))?;
        let name = o
            .get("name")
            .and_then(Json::as_str)
            .ok_or_else(|| serr("name", "missing"))?
            .to_owned();
        let version = o
            .get("version")
            .and_then(Json::as_str)
            .unwrap_or("")
            .to_owned();
        let cksum = o.get("cksum").and_then(Json::as_str).map(str::to_owned);
        let tj = o
            .get("tables")
            .and_then(Json::as_object)
            .ok_or_else(|| serr("tables", "missing"))?;
        let mut tables = BTreeMap::new();
        for (t, j) in tj {
            tables.insert(t.clone(), TableSchema::parse(t, j)?);
        }
        for t in tables.values() {
            for c in t.columns.values() {
                for bt in std::iter::once(&c.ty.key).chain(c.ty.value.as_ref()) {
                    if let Some(r) = &bt.ref_table {
                        if !tables.contains_key(r) {
                            return Err(serr(
                                &format!("tables.{}.columns.{}", t.name, c.name),
                                format!("refTable {r:?} does not exist"),
                            ));
                        }
                    }
                }
            }
        }
        Ok(DatabaseSchema {
            name,
            version,
            cksum,
            tables,
        })
    }

    /// Parses a schema from the text of a `.ovsschema` file.
    pub fn parse_str(text: &str) -> Result<Self, SchemaError> {
        let j: Json = serde_json::from_str(text).map_err(|e| serr("", e.to_string()))?;
        Self::parse(&j)
    }

    /// A table by name.
    pub fn table(&self, name: &str) -> Option<&TableSchema> {
        self.tables.get(name)
    }
}

impl std::str::FromStr for DatabaseSchema {
    type Err = SchemaError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DatabaseSchema::parse_str(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(path: &str) -> Option<DatabaseSchema> {
        let text = std::fs::read_to_string(path).ok()?;
        Some(DatabaseSchema::parse_str(&text).unwrap())
    }

    #[test]
    fn shipped_schemas_parse() {
        let nb = DatabaseSchema::parse_str(include_str!("../schemas/ovn-nb.ovsschema")).unwrap();
        assert_eq!(nb.name, "OVN_Northbound");
        let lsp = nb.table("Logical_Switch_Port").unwrap();
        assert_eq!(lsp.indexes, vec![vec!["name".to_string()]]);
        let tag = &lsp.column("tag_request").unwrap().ty;
        assert_eq!(tag.key.max_integer, Some(4095));
        assert!(tag.is_optional());
        let ls = nb.table("Logical_Switch").unwrap();
        assert!(ls.is_root);
        let ports = &ls.column("ports").unwrap().ty;
        assert!(ports.is_set());
        assert_eq!(ports.key.ref_table.as_deref(), Some("Logical_Switch_Port"));
        assert_eq!(nb.table("NB_Global").unwrap().max_rows, Some(1));
        let acl = nb.table("ACL").unwrap();
        assert!(
            acl.column("action")
                .unwrap()
                .ty
                .key
                .enumeration
                .as_ref()
                .unwrap()
                .len()
                >= 4
        );
        assert!(acl.column("_uuid").is_some());
        let ovs = DatabaseSchema::parse_str(include_str!("../schemas/vswitch.ovsschema")).unwrap();
        assert_eq!(ovs.name, "Open_vSwitch");
        let sb = DatabaseSchema::parse_str(include_str!("../schemas/ovn-sb.ovsschema")).unwrap();
        assert_eq!(sb.name, "OVN_Southbound");
        assert!(sb.tables.len() > 20);
    }

    #[test]
    fn system_schemas_parse_if_present() {
        for p in [
            "/usr/share/ovn/ovn-nb.ovsschema",
            "/usr/share/ovn/ovn-sb.ovsschema",
            "/usr/share/openvswitch/vswitch.ovsschema",
        ] {
            match load(p) {
                Some(s) => assert!(!s.tables.is_empty()),
                None => crate::skip::skip(&format!("{p} is not installed")),
            }
        }
    }

    #[test]
    fn errors() {
        assert!(DatabaseSchema::parse_str(
            r#"{"name":"x","tables":{"T":{"columns":{"a":{"type":"nope"}}}}}"#
        )
        .is_err());
        assert!(DatabaseSchema::parse_str(
            r#"{"name":"x","tables":{"T":{"columns":{"a":{"type":{"key":{"type":"uuid","refTable":"U"}}}}}}}"#
        )
        .is_err());
    }
}
