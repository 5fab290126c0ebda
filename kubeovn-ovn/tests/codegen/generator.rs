//! The model generator: Rust source with one struct per table of a schema, implementing
//! `kubeovn_ovn::Model`. The checked-in `kubeovn_ovn::models` are its output for the shipped schemas; this
//! test (`main.rs`) fails when they are stale (`KUBEOVN_REGEN=1` rewrites them). A development tool of
//! this crate, not part of its API: it reads the schema through the public `schema` module only.

use std::fmt::Write as _;

use kubeovn_ovn::datum::{Atom, AtomType};
use kubeovn_ovn::schema::{BaseType, ColumnSchema, ColumnType, DatabaseSchema, RefType};

/// Rust keywords a column could be named after; the field gets a trailing `_`.
const KEYWORDS: &[&str] = &[
    "as", "async", "await", "box", "break", "const", "continue", "crate", "dyn", "else", "enum",
    "extern", "false", "fn", "for", "gen", "if", "impl", "in", "let", "loop", "match", "mod",
    "move", "mut", "pub", "ref", "return", "self", "static", "struct", "super", "trait", "true",
    "try", "type", "unsafe", "use", "where", "while", "yield", "uuid",
];

/// The struct name of a table: `Logical_Switch_Port` -> `LogicalSwitchPort`, `NB_Global` -> `NbGlobal`,
/// `ACL` -> `Acl`, `sFlow` -> `SFlow`.
pub fn struct_name(table: &str) -> String {
    let mut out = String::new();
    for seg in table.split('_').filter(|s| !s.is_empty()) {
        let all_upper = seg.chars().all(|c| !c.is_ascii_lowercase());
        for (i, c) in seg.chars().enumerate() {
            if i == 0 {
                out.push(c.to_ascii_uppercase());
            } else if all_upper {
                out.push(c.to_ascii_lowercase());
            } else {
                out.push(c);
            }
        }
    }
    out
}

/// The field name of a column (keywords get a trailing `_`).
pub fn field_name(column: &str) -> String {
    let lower = column.to_ascii_lowercase();
    if KEYWORDS.contains(&lower.as_str()) {
        format!("{lower}_")
    } else {
        lower
    }
}

/// The enum name of an enumerated string column: `ACL.action` -> `AclAction`, `NAT.type` -> `NatType`.
pub fn enum_name(table: &str, column: &str) -> String {
    format!("{}{}", struct_name(table), camel(column))
}

/// The variant name of an enumerated value: `allow-related` -> `AllowRelated`, `dnat_and_snat` ->
/// `DnatAndSnat`, `OpenFlow10` -> `OpenFlow10`.
pub fn variant_name(value: &str) -> String {
    let v = camel(value);
    match v.chars().next() {
        // `Unknown` is the variant of values the models do not know.
        _ if v == "Unknown" => "UnknownValue".to_owned(),
        Some(c) if c.is_ascii_alphabetic() => v,
        _ => format!("V{v}"),
    }
}

fn camel(s: &str) -> String {
    let mut out = String::new();
    for seg in s.split(['-', '_', '.', ' ']).filter(|s| !s.is_empty()) {
        let mut cs = seg.chars();
        if let Some(c) = cs.next() {
            out.push(c.to_ascii_uppercase());
            out.extend(cs.filter(|c| c.is_ascii_alphanumeric()));
        }
    }
    out
}

/// The enumerated string values of a column's key (None when it is not an enumerated string, or a map:
/// map columns keep plain strings).
fn enum_values(ty: &ColumnType) -> Option<Vec<&str>> {
    if ty.is_map() || ty.key.atom != AtomType::String {
        return None;
    }
    let e = ty.key.enumeration.as_ref()?;
    e.iter().map(Atom::as_str).collect()
}

fn rust_atom(t: AtomType) -> &'static str {
    match t {
        AtomType::Integer => "i64",
        AtomType::Real => "f64",
        AtomType::Boolean => "bool",
        AtomType::String => "String",
        AtomType::Uuid => "Uuid",
    }
}

enum Shape {
    Scalar,
    Optional,
    Set,
    Map,
}

fn shape(ty: &ColumnType) -> Shape {
    if ty.is_map() {
        Shape::Map
    } else if ty.is_scalar() {
        Shape::Scalar
    } else if ty.is_optional() {
        Shape::Optional
    } else {
        Shape::Set
    }
}

fn rust_type(table: &str, column: &str, ty: &ColumnType) -> String {
    let e;
    let k = if enum_values(ty).is_some() {
        e = enum_name(table, column);
        e.as_str()
    } else {
        rust_atom(ty.key.atom)
    };
    match (shape(ty), &ty.value) {
        (Shape::Map, Some(v)) => format!("BTreeMap<{k}, {}>", rust_atom(v.atom)),
        (Shape::Scalar, _) => k.to_owned(),
        (Shape::Optional, _) => format!("Option<{k}>"),
        _ => format!("Vec<{k}>"),
    }
}

fn describe_base(b: &BaseType) -> String {
    let mut s = b.atom.as_str().to_owned();
    if let Some(r) = &b.ref_table {
        let _ = write!(
            s,
            " ({} reference to `{r}`)",
            if b.ref_type == RefType::Weak {
                "weak"
            } else {
                "strong"
            }
        );
    }
    if let Some(e) = &b.enumeration {
        let vals: Vec<String> = e
            .iter()
            .map(|a| match a {
                Atom::String(s) => format!("`{s}`"),
                other => other.to_json().to_string(),
            })
            .collect();
        let _ = write!(s, " in {{{}}}", vals.join(", "));
    }
    match (b.min_integer, b.max_integer) {
        (None, None) => {}
        (lo, hi) => {
            let _ = write!(
                s,
                " in [{}, {}]",
                lo.map_or("..".into(), |v| v.to_string()),
                hi.map_or("..".into(), |v| v.to_string())
            );
        }
    }
    if b.min_length.is_some() || b.max_length.is_some() {
        let _ = write!(
            s,
            " of length [{}, {}]",
            b.min_length.unwrap_or(0),
            b.max_length.map_or("..".into(), |v| v.to_string())
        );
    }
    s
}

fn describe(c: &ColumnSchema) -> String {
    let ty = &c.ty;
    let mut s = match (shape(ty), &ty.value) {
        (Shape::Map, Some(v)) => {
            format!("map of {} to {}", describe_base(&ty.key), describe_base(v))
        }
        (Shape::Scalar, _) => describe_base(&ty.key),
        (Shape::Optional, _) => format!("optional {}", describe_base(&ty.key)),
        _ => format!("set of {}", describe_base(&ty.key)),
    };
    if ty.max != u64::MAX && ty.max > 1 {
        let _ = write!(s, ", at most {}", ty.max);
    }
    if ty.min == 1 && !ty.is_scalar() {
        s.push_str(", at least 1");
    }
    if !c.mutable {
        s.push_str(", immutable");
    }
    if c.ephemeral {
        s.push_str(", ephemeral");
    }
    s
}

fn shape_fns(ty: &ColumnType) -> (&'static str, &'static str) {
    match shape(ty) {
        Shape::Scalar => ("scalar", "scalar_datum"),
        Shape::Optional => ("optional", "optional_datum"),
        Shape::Set => ("set", "set_datum"),
        Shape::Map => ("map", "map_datum"),
    }
}

/// Generates the models of `schema`; `source` names the schema file in the header comment.
pub fn generate(schema: &DatabaseSchema, source: &str) -> String {
    let mut o = String::new();
    let w = &mut o;
    let _ = writeln!(
        w,
        "//! Typed rows of the `{}` database, schema version {}.",
        schema.name, schema.version
    );
    let _ = writeln!(w, "//!");
    let _ = writeln!(
        w,
        "//! Generated by `tests/codegen` from `{source}`: do not edit; regenerate with"
    );
    let _ = writeln!(
        w,
        "//! `KUBEOVN_REGEN=1 cargo test -p kubeovn-ovn --test codegen`."
    );
    let _ = writeln!(w);
    let _ = writeln!(w, "#![allow(unused_imports)]");
    let _ = writeln!(w);
    let _ = writeln!(w, "use std::collections::BTreeMap;");
    let _ = writeln!(w);
    let _ = writeln!(w, "use crate::model::{{self, Model, ModelError, RowRead}};");
    let _ = writeln!(w, "use crate::ops::Row;");
    let _ = writeln!(w, "use crate::uuid::Uuid;");
    let _ = writeln!(w);
    let _ = writeln!(w, "/// The database name.");
    let _ = writeln!(w, "pub const DATABASE: &str = {:?};", schema.name);
    let _ = writeln!(
        w,
        "/// The schema version these models were generated from."
    );
    let _ = writeln!(w, "pub const SCHEMA_VERSION: &str = {:?};", schema.version);
    let _ = writeln!(w, "/// The tables, by name.");
    let names: Vec<String> = schema.tables.keys().map(|t| format!("{t:?}")).collect();
    let _ = writeln!(w, "pub const TABLES: &[&str] = &[{}];", names.join(", "));
    for (tname, t) in &schema.tables {
        for (cname, c) in &t.columns {
            if let Some(values) = enum_values(&c.ty) {
                write_enum(w, tname, cname, &values);
            }
        }
    }
    for (tname, t) in &schema.tables {
        let sname = struct_name(tname);
        let _ = writeln!(w);
        let mut flags = Vec::new();
        if t.is_root {
            flags.push("root".to_owned());
        }
        if let Some(m) = t.max_rows {
            flags.push(format!("at most {m} rows"));
        }
        for ix in &t.indexes {
            flags.push(format!("unique ({})", ix.join(", ")));
        }
        let suffix = if flags.is_empty() {
            String::new()
        } else {
            format!(" ({})", flags.join("; "))
        };
        let _ = writeln!(w, "/// A row of table `{tname}`{suffix}.");
        let _ = writeln!(w, "#[derive(Debug, Clone, PartialEq, Default)]");
        let _ = writeln!(w, "pub struct {sname} {{");
        let _ = writeln!(w, "    /// The row's `_uuid`.");
        let _ = writeln!(w, "    pub uuid: Uuid,");
        for (cname, c) in &t.columns {
            let _ = writeln!(w, "    /// `{cname}`: {}.", describe(c));
            let _ = writeln!(
                w,
                "    pub {}: {},",
                field_name(cname),
                rust_type(tname, cname, &c.ty)
            );
        }
        let _ = writeln!(w, "}}");
        let _ = writeln!(w);
        let _ = writeln!(w, "impl {sname} {{");
        for cname in t.columns.keys() {
            let _ = writeln!(
                w,
                "    /// The column name of [`{sname}::{}`].",
                field_name(cname)
            );
            let _ = writeln!(
                w,
                "    pub const {}: &'static str = {cname:?};",
                cname.to_ascii_uppercase()
            );
        }
        let _ = writeln!(w, "}}");
        let _ = writeln!(w);
        let _ = writeln!(w, "impl Model for {sname} {{");
        let _ = writeln!(w, "    const TABLE: &'static str = {tname:?};");
        let _ = writeln!(w);
        let _ = writeln!(w, "    fn uuid(&self) -> Uuid {{");
        let _ = writeln!(w, "        self.uuid");
        let _ = writeln!(w, "    }}");
        let _ = writeln!(w);
        let _ = writeln!(
            w,
            "    fn from_row<R: RowRead + ?Sized>(uuid: Uuid, row: &R) -> Result<Self, ModelError> {{"
        );
        let _ = writeln!(w, "        Ok({sname} {{");
        let _ = writeln!(w, "            uuid,");
        for (cname, c) in &t.columns {
            let (get, _) = shape_fns(&c.ty);
            let _ = writeln!(
                w,
                "            {}: model::{get}(Self::TABLE, {cname:?}, row)?,",
                field_name(cname)
            );
        }
        let _ = writeln!(w, "        }})");
        let _ = writeln!(w, "    }}");
        let _ = writeln!(w);
        let _ = writeln!(w, "    fn to_row(&self) -> Row {{");
        let _ = writeln!(w, "        let mut row = Row::new();");
        for (cname, c) in &t.columns {
            let (_, put) = shape_fns(&c.ty);
            let _ = writeln!(
                w,
                "        row.insert({cname:?}.to_owned(), model::{put}(&self.{}));",
                field_name(cname)
            );
        }
        let _ = writeln!(w, "        row");
        let _ = writeln!(w, "    }}");
        let _ = writeln!(w, "}}");
    }
    o
}

fn write_enum(w: &mut String, table: &str, column: &str, values: &[&str]) {
    let _ = writeln!(w);
    let _ = writeln!(w, "crate::string_enum! {{");
    let _ = writeln!(w, "    /// The values of `{table}.{column}`.");
    let _ = writeln!(w, "    {} {{", enum_name(table, column));
    for v in values {
        let _ = writeln!(w, "        \"`{v}`.\" {} = {v:?},", variant_name(v));
    }
    let _ = writeln!(w, "    }}");
    let _ = writeln!(w, "}}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(struct_name("Logical_Switch_Port"), "LogicalSwitchPort");
        assert_eq!(struct_name("NB_Global"), "NbGlobal");
        assert_eq!(struct_name("ACL"), "Acl");
        assert_eq!(struct_name("sFlow"), "SFlow");
        assert_eq!(struct_name("QoS"), "QoS");
        assert_eq!(struct_name("DHCP_Options"), "DhcpOptions");
        assert_eq!(field_name("type"), "type_");
        assert_eq!(field_name("match"), "match_");
        assert_eq!(field_name("external_ids"), "external_ids");
        assert_eq!(enum_name("ACL", "action"), "AclAction");
        assert_eq!(enum_name("NAT", "type"), "NatType");
        assert_eq!(variant_name("allow-related"), "AllowRelated");
        assert_eq!(variant_name("dnat_and_snat"), "DnatAndSnat");
        assert_eq!(variant_name("OpenFlow10"), "OpenFlow10");
        assert_eq!(variant_name("dot1q-tunnel"), "Dot1qTunnel");
    }
}
