//! Typed rows: the [`Model`] trait the generated structs of [`crate::models`] implement, and the conversions
//! between Rust values and datums they use.
//!
//! Shapes: a scalar column is `T`, an optional one (`min` 0, `max` 1) `Option<T>`, a set `Vec<T>`, a map
//! `BTreeMap<K, V>`, with `T` one of `i64`, `f64`, `bool`, `String`, [`Uuid`]. A column missing from a row (a
//! monitor of some columns only) takes its default; both the exact (typed) and the loose (untyped: bare atom
//! for a one-element set, integer for a real) forms of a datum are accepted.
//!
//! A string column with an `enum` constraint is a generated Rust enum (made by [`string_enum!`](crate::string_enum)). A value the
//! enum does not know, written by a newer server, reads as its `Unknown` variant instead of failing the row, so
//! the row stays visible (to be updated or deleted); [`FromStr`](std::str::FromStr) accepts only the known
//! values, and the schema refuses `Unknown` values before a transaction is sent.

use std::collections::BTreeMap;

use crate::datum::{Atom, AtomType, Datum};
use crate::ops::Row;
use crate::uuid::Uuid;

/// A column value that does not fit the model's field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{table}.{column}: expected {expected}, found {found}")]
pub struct ModelError {
    /// Table.
    pub table: &'static str,
    /// Column.
    pub column: &'static str,
    /// The field's shape.
    pub expected: &'static str,
    /// The datum found (abridged).
    pub found: String,
}

/// A string that is none of an enumerated column's values (see [`string_enum!`](crate::string_enum)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a {type_name} (one of {known})")]
pub struct UnknownValue {
    /// The enum's name.
    pub type_name: &'static str,
    /// The string given.
    pub value: String,
    /// The known values, comma separated.
    pub known: &'static str,
}

/// Defines the enum of an enumerated string column: its known values as unit variants (the first is the
/// default) and `Unknown(String)` for a value a newer schema added, with `as_str`, `Display`, `FromStr` (known
/// values only), `From<_> for Atom` (so also `Datum`) and [`AtomValue`] (an unknown string reads as `Unknown`).
#[macro_export]
macro_rules! string_enum {
    ($(#[$m:meta])* $name:ident { $first_doc:literal $first:ident = $first_val:literal, $($doc:literal $var:ident = $val:literal,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub enum $name {
            #[doc = $first_doc]
            #[default]
            $first,
            $(#[doc = $doc] $var,)*
            /// A value these models do not know (written by a newer server).
            Unknown(String),
        }

        impl $name {
            /// The known values.
            pub const ALL: &'static [$name] = &[$name::$first, $($name::$var),*];

            /// The value as stored in the database.
            pub fn as_str(&self) -> &str {
                match self {
                    $name::$first => $first_val,
                    $($name::$var => $val,)*
                    $name::Unknown(s) => s,
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::model::UnknownValue;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $first_val => Ok($name::$first),
                    $($val => Ok($name::$var),)*
                    _ => Err($crate::model::UnknownValue {
                        type_name: stringify!($name),
                        value: s.to_owned(),
                        known: concat!($first_val $(, ", ", $val)*),
                    }),
                }
            }
        }

        impl $crate::model::AtomValue for $name {
            const TYPE: $crate::datum::AtomType = $crate::datum::AtomType::String;
            fn from_atom(a: &$crate::datum::Atom) -> Option<Self> {
                a.as_str()
                    .map(|s| s.parse().unwrap_or_else(|_| $name::Unknown(s.to_owned())))
            }
            fn to_atom(&self) -> $crate::datum::Atom {
                $crate::datum::Atom::String(self.as_str().to_owned())
            }
        }

        impl From<$name> for $crate::datum::Atom {
            fn from(v: $name) -> Self {
                match v {
                    $name::Unknown(s) => $crate::datum::Atom::String(s),
                    known => $crate::datum::Atom::String(known.as_str().to_owned()),
                }
            }
        }

        impl From<&$name> for $crate::datum::Atom {
            fn from(v: &$name) -> Self {
                $crate::datum::Atom::String(v.as_str().to_owned())
            }
        }
    };
}

/// Something a model reads its columns from: an untyped [`Row`], or a replica's row read in place.
pub trait RowRead {
    /// A column's value; None when absent (the model's field takes its default).
    fn column(&self, name: &str) -> Option<&Datum>;
}

impl RowRead for Row {
    fn column(&self, name: &str) -> Option<&Datum> {
        self.get(name)
    }
}

/// A typed row of one table.
pub trait Model: Sized {
    /// The table's name.
    const TABLE: &'static str;

    /// The row's UUID.
    fn uuid(&self) -> Uuid;

    /// Reads a row (missing columns take their defaults).
    fn from_row<R: RowRead + ?Sized>(uuid: Uuid, row: &R) -> Result<Self, ModelError>;

    /// Every column except `_uuid` and `_version`, e.g. for an insert.
    fn to_row(&self) -> Row;

    /// Reads a row of a select result, taking the UUID from its `_uuid` column (nil if absent).
    fn from_select_row(row: &Row) -> Result<Self, ModelError> {
        let uuid = row
            .get("_uuid")
            .and_then(Datum::as_atom)
            .and_then(Atom::as_uuid)
            .unwrap_or(Uuid::NIL);
        Self::from_row(uuid, row)
    }
}

/// A Rust type that holds one atom.
pub trait AtomValue: Sized {
    /// The OVSDB atomic type.
    const TYPE: AtomType;
    /// Reads an atom of this type (an integer is accepted for a real).
    fn from_atom(a: &Atom) -> Option<Self>;
    /// The atom.
    fn to_atom(&self) -> Atom;
}

impl AtomValue for i64 {
    const TYPE: AtomType = AtomType::Integer;
    fn from_atom(a: &Atom) -> Option<Self> {
        a.as_i64()
    }
    fn to_atom(&self) -> Atom {
        Atom::Integer(*self)
    }
}
impl AtomValue for f64 {
    const TYPE: AtomType = AtomType::Real;
    fn from_atom(a: &Atom) -> Option<Self> {
        match a {
            Atom::Real(r) => Some(*r),
            Atom::Integer(i) => Some(*i as f64),
            _ => None,
        }
    }
    fn to_atom(&self) -> Atom {
        Atom::Real(*self)
    }
}
impl AtomValue for bool {
    const TYPE: AtomType = AtomType::Boolean;
    fn from_atom(a: &Atom) -> Option<Self> {
        match a {
            Atom::Boolean(b) => Some(*b),
            _ => None,
        }
    }
    fn to_atom(&self) -> Atom {
        Atom::Boolean(*self)
    }
}
impl AtomValue for String {
    const TYPE: AtomType = AtomType::String;
    fn from_atom(a: &Atom) -> Option<Self> {
        a.as_str().map(str::to_owned)
    }
    fn to_atom(&self) -> Atom {
        Atom::String(self.clone())
    }
}
impl AtomValue for Uuid {
    const TYPE: AtomType = AtomType::Uuid;
    fn from_atom(a: &Atom) -> Option<Self> {
        a.as_uuid()
    }
    fn to_atom(&self) -> Atom {
        Atom::Uuid(*self)
    }
}

fn err(table: &'static str, column: &'static str, expected: &'static str, d: &Datum) -> ModelError {
    let mut found = d.to_json().to_string();
    if found.len() > 120 {
        let mut cut = 120;
        while !found.is_char_boundary(cut) {
            cut -= 1;
        }
        found.truncate(cut);
        found.push('…');
    }
    ModelError {
        table,
        column,
        expected,
        found,
    }
}

fn atoms<T: AtomValue>(
    table: &'static str,
    column: &'static str,
    expected: &'static str,
    d: &Datum,
) -> Result<Vec<T>, ModelError> {
    if matches!(d, Datum::Map(m) if !m.is_empty()) {
        return Err(err(table, column, expected, d));
    }
    d.atoms()
        .iter()
        .map(|a| T::from_atom(a).ok_or_else(|| err(table, column, expected, d)))
        .collect()
}

/// Reads a scalar column.
pub fn scalar<T: AtomValue + Default>(
    table: &'static str,
    column: &'static str,
    row: &(impl RowRead + ?Sized),
) -> Result<T, ModelError> {
    let Some(d) = row.column(column) else {
        return Ok(T::default());
    };
    // Read in place: no vector for the one atom.
    match (d, d.atoms()) {
        (Datum::Map(m), _) if !m.is_empty() => Err(err(table, column, "one atom", d)),
        (_, [a]) => T::from_atom(a).ok_or_else(|| err(table, column, "one atom", d)),
        _ => Err(err(table, column, "one atom", d)),
    }
}

/// Reads an optional column.
pub fn optional<T: AtomValue>(
    table: &'static str,
    column: &'static str,
    row: &(impl RowRead + ?Sized),
) -> Result<Option<T>, ModelError> {
    let Some(d) = row.column(column) else {
        return Ok(None);
    };
    match (d, d.atoms()) {
        (Datum::Map(m), _) if !m.is_empty() => Err(err(table, column, "zero or one atom", d)),
        (_, []) => Ok(None),
        (_, [a]) => T::from_atom(a)
            .map(Some)
            .ok_or_else(|| err(table, column, "zero or one atom", d)),
        _ => Err(err(table, column, "zero or one atom", d)),
    }
}

/// Reads a set column.
pub fn set<T: AtomValue>(
    table: &'static str,
    column: &'static str,
    row: &(impl RowRead + ?Sized),
) -> Result<Vec<T>, ModelError> {
    match row.column(column) {
        None => Ok(Vec::new()),
        Some(d) => atoms::<T>(table, column, "a set", d),
    }
}

/// Reads a map column.
pub fn map<K: AtomValue + Ord, V: AtomValue>(
    table: &'static str,
    column: &'static str,
    row: &(impl RowRead + ?Sized),
) -> Result<BTreeMap<K, V>, ModelError> {
    match row.column(column) {
        None => Ok(BTreeMap::new()),
        Some(Datum::Map(m)) => m
            .iter()
            .map(|(k, v)| match (K::from_atom(k), V::from_atom(v)) {
                (Some(k), Some(v)) => Ok((k, v)),
                _ => Err(err(table, column, "a map", &Datum::Map(m.clone()))),
            })
            .collect(),
        Some(Datum::Set(s)) if s.is_empty() => Ok(BTreeMap::new()),
        Some(d) => Err(err(table, column, "a map", d)),
    }
}

/// The datum of a scalar field.
pub fn scalar_datum<T: AtomValue>(v: &T) -> Datum {
    Datum::Atom(v.to_atom())
}

/// The datum of an optional field (an empty set for None).
pub fn optional_datum<T: AtomValue>(v: &Option<T>) -> Datum {
    Datum::Set(v.iter().map(T::to_atom).collect())
}

/// The datum of a set field.
pub fn set_datum<T: AtomValue>(v: &[T]) -> Datum {
    Datum::Set(v.iter().map(T::to_atom).collect())
}

/// The datum of a map field.
pub fn map_datum<K: AtomValue, V: AtomValue>(v: &BTreeMap<K, V>) -> Datum {
    Datum::Map(v.iter().map(|(k, v)| (k.to_atom(), v.to_atom())).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loose_and_exact_forms() {
        let row: Row = [
            ("a".to_string(), Datum::from("x")),
            ("b".to_string(), Datum::set(["x"])),
            ("c".to_string(), Datum::from(3i64)),
            ("d".to_string(), Datum::empty()),
            ("e".to_string(), Datum::map([("k", "v")])),
        ]
        .into_iter()
        .collect();
        assert_eq!(scalar::<String>("T", "a", &row).unwrap(), "x");
        assert_eq!(scalar::<String>("T", "b", &row).unwrap(), "x");
        assert_eq!(
            optional::<String>("T", "a", &row).unwrap(),
            Some("x".into())
        );
        assert_eq!(optional::<i64>("T", "d", &row).unwrap(), None);
        assert_eq!(
            set::<String>("T", "a", &row).unwrap(),
            vec!["x".to_string()]
        );
        assert_eq!(scalar::<f64>("T", "c", &row).unwrap(), 3.0);
        assert_eq!(
            map::<String, String>("T", "d", &row).unwrap(),
            BTreeMap::new()
        );
        assert_eq!(map::<String, String>("T", "e", &row).unwrap()["k"], "v");
        assert_eq!(scalar::<i64>("T", "missing", &row).unwrap(), 0);
        assert!(scalar::<i64>("T", "a", &row).is_err());
        assert!(scalar::<String>("T", "d", &row).is_err());
        assert!(map::<String, String>("T", "a", &row).is_err());
        assert!(set::<String>("T", "e", &row).is_err());
    }
}
