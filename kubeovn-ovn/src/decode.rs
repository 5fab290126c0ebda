//! Decoding monitor updates straight from JSON text into rows and datums (serde seeds driven by the schema),
//! without building a `serde_json::Value` tree first: the initial reply for a large database is tens of
//! megabytes, and the tree costs more than the rows it is turned into.
//!
//! The result is exactly that of the `Value`-based decoders ([`crate::monitor::parse_table_updates`],
//! [`Datum::from_json_typed`], [`Datum::from_json`]); on any error the caller re-decodes through them to
//! report the same typed error.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{
    DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor,
};

use crate::datum::{Atom, AtomType, Datum};
use crate::monitor::{RowUpdate, TableUpdates};
use crate::ops::Row;
use crate::schema::{ColumnType, DatabaseSchema, TableSchema};
use crate::uuid::Uuid;

/// Converts an untyped atom to column type `ty` as [`Atom::from_json_typed`] does.
fn typed(a: Atom, ty: AtomType) -> Result<Atom, &'static str> {
    match (ty, a) {
        (AtomType::Real, Atom::Integer(i)) => Ok(Atom::Real(i as f64)),
        (t, a) if a.atom_type() == t => Ok(a),
        _ => Err("atom of the wrong type"),
    }
}

/// An atom as [`Atom::from_json`] reads it.
#[derive(Clone, Copy)]
struct AtomSeed;

impl<'de> DeserializeSeed<'de> for AtomSeed {
    type Value = Atom;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Atom, D::Error> {
        match d.deserialize_any(DatumVisitor { untyped_atom: true })? {
            Datum::Atom(a) => Ok(a),
            _ => Err(D::Error::custom("not an atom")),
        }
    }
}

/// A `[key, value]` map entry.
#[derive(Clone, Copy)]
struct PairSeed;

impl<'de> DeserializeSeed<'de> for PairSeed {
    type Value = (Atom, Atom);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(Atom, Atom), D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = (Atom, Atom);
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a [key, value] pair")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<(Atom, Atom), A::Error> {
                let k = s
                    .next_element_seed(AtomSeed)?
                    .ok_or_else(|| A::Error::custom("map entry must be [key, value]"))?;
                let v = s
                    .next_element_seed(AtomSeed)?
                    .ok_or_else(|| A::Error::custom("map entry must be [key, value]"))?;
                if s.next_element::<IgnoredAny>()?.is_some() {
                    return Err(A::Error::custom("map entry must be [key, value]"));
                }
                Ok((k, v))
            }
        }
        d.deserialize_seq(V)
    }
}

/// A sequence of elements decoded by `seed`.
struct ListSeed<S>(S);

impl<'de, S: DeserializeSeed<'de> + Copy> DeserializeSeed<'de> for ListSeed<S> {
    type Value = Vec<S::Value>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        struct V<S>(S);
        impl<'de, S: DeserializeSeed<'de> + Copy> Visitor<'de> for V<S> {
            type Value = Vec<S::Value>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(s.size_hint().unwrap_or(0).min(4096));
                while let Some(x) = s.next_element_seed(self.0)? {
                    out.push(x);
                }
                Ok(out)
            }
        }
        d.deserialize_seq(V(self.0))
    }
}

/// Any datum form, untyped (as [`Datum::from_json`]); with `untyped_atom` only atoms are accepted (a tagged
/// `set` or `map` is then an error, as inside a set).
struct DatumVisitor {
    untyped_atom: bool,
}

impl<'de> Visitor<'de> for DatumVisitor {
    type Value = Datum;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an OVSDB datum")
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Datum, E> {
        Ok(Datum::Atom(Atom::Boolean(v)))
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Datum, E> {
        Ok(Datum::Atom(Atom::Integer(v)))
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Datum, E> {
        Ok(Datum::Atom(match i64::try_from(v) {
            Ok(i) => Atom::Integer(i),
            Err(_) => Atom::Real(v as f64),
        }))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Datum, E> {
        Ok(Datum::Atom(Atom::Real(v)))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Datum, E> {
        Ok(Datum::Atom(Atom::String(v.to_owned())))
    }
    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Datum, E> {
        Ok(Datum::Atom(Atom::String(v)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Datum, A::Error> {
        let tag: Tag = s
            .next_element()?
            .ok_or_else(|| A::Error::custom("not an atom"))?;
        let d = match tag {
            Tag::Uuid => {
                let v: UuidStr = s
                    .next_element()?
                    .ok_or_else(|| A::Error::custom("not an atom"))?;
                Datum::Atom(Atom::Uuid(v.0))
            }
            Tag::NamedUuid => {
                let v: String = s
                    .next_element()?
                    .ok_or_else(|| A::Error::custom("not an atom"))?;
                Datum::Atom(Atom::NamedUuid(v))
            }
            Tag::Set if !self.untyped_atom => Datum::Set(
                s.next_element_seed(ListSeed(AtomSeed))?
                    .ok_or_else(|| A::Error::custom("not an atom"))?,
            ),
            Tag::Map if !self.untyped_atom => Datum::Map(
                s.next_element_seed(ListSeed(PairSeed))?
                    .ok_or_else(|| A::Error::custom("not an atom"))?,
            ),
            _ => return Err(A::Error::custom("not an atom")),
        };
        if s.next_element::<IgnoredAny>()?.is_some() {
            return Err(A::Error::custom("not an atom"));
        }
        Ok(d)
    }
}

/// The first element of a tagged JSON array.
enum Tag {
    Uuid,
    NamedUuid,
    Set,
    Map,
}

impl<'de> serde::Deserialize<'de> for Tag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Tag, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Tag;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("uuid, named-uuid, set or map")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Tag, E> {
                Ok(match v {
                    "uuid" => Tag::Uuid,
                    "named-uuid" => Tag::NamedUuid,
                    "set" => Tag::Set,
                    "map" => Tag::Map,
                    _ => return Err(E::custom("not an atom")),
                })
            }
        }
        d.deserialize_str(V)
    }
}

/// A UUID in its string form.
struct UuidStr(Uuid);

impl<'de> serde::Deserialize<'de> for UuidStr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<UuidStr, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = UuidStr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a uuid")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<UuidStr, E> {
                Uuid::parse(v)
                    .map(UuidStr)
                    .map_err(|_| E::custom("bad uuid"))
            }
        }
        d.deserialize_str(V)
    }
}

/// A datum of column type `ty` as [`Datum::from_json_typed`] reads it, or untyped without one.
#[derive(Clone, Copy)]
struct DatumSeed<'s>(Option<&'s ColumnType>);

impl<'de> DeserializeSeed<'de> for DatumSeed<'_> {
    type Value = Datum;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Datum, D::Error> {
        let raw = d.deserialize_any(DatumVisitor {
            untyped_atom: false,
        })?;
        let Some(ty) = self.0 else { return Ok(raw) };
        let key = ty.key.atom;
        let err = |w: &str| D::Error::custom(w);
        if let Some(vt) = &ty.value {
            let Datum::Map(m) = raw else {
                return Err(err("expected a map"));
            };
            return m
                .into_iter()
                .map(|(k, v)| Ok((typed(k, key).map_err(err)?, typed(v, vt.atom).map_err(err)?)))
                .collect::<Result<_, _>>()
                .map(Datum::Map);
        }
        if ty.is_scalar() {
            return match raw {
                Datum::Atom(a) => typed(a, key).map(Datum::Atom).map_err(err),
                _ => Err(err("not an atom")),
            };
        }
        match raw {
            Datum::Set(v) => v
                .into_iter()
                .map(|a| typed(a, key).map_err(err))
                .collect::<Result<_, _>>()
                .map(Datum::Set),
            Datum::Atom(a) => Ok(Datum::Set(vec![typed(a, key).map_err(err)?])),
            Datum::Map(_) => Err(err("not an atom")),
        }
    }
}

/// A row object, each column decoded with its type from `table` (untyped without, or for unknown columns).
#[derive(Clone, Copy)]
struct RowSeed<'s>(Option<&'s TableSchema>);

impl<'de> DeserializeSeed<'de> for RowSeed<'_> {
    type Value = Row;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Row, D::Error> {
        struct V<'s>(Option<&'s TableSchema>);
        impl<'de> Visitor<'de> for V<'_> {
            type Value = Row;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a row object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Row, A::Error> {
                let mut row = Row::new();
                while let Some(k) = m.next_key::<String>()? {
                    let ty = self.0.and_then(|t| t.column(&k)).map(|c| &c.ty);
                    let v = m.next_value_seed(DatumSeed(ty))?;
                    row.insert(k, v);
                }
                Ok(row)
            }
        }
        d.deserialize_map(V(self.0))
    }
}

/// One `<row-update>` (v1) or `<row-update2>` (v2).
#[derive(Clone, Copy)]
struct RowUpdateSeed<'s> {
    table: Option<&'s TableSchema>,
    v2: bool,
}

impl<'de> DeserializeSeed<'de> for RowUpdateSeed<'_> {
    type Value = RowUpdate;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<RowUpdate, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RowUpdateSeed<'_> {
    type Value = RowUpdate;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a row update object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<RowUpdate, A::Error> {
        let row = RowSeed(self.table);
        if self.v2 {
            let k: String = m
                .next_key()?
                .ok_or_else(|| A::Error::custom("empty row update"))?;
            let u = match k.as_str() {
                "initial" => RowUpdate::Initial(m.next_value_seed(row)?),
                "insert" => RowUpdate::Insert(m.next_value_seed(row)?),
                // Differences decode with the same element types as rows (counts are not checked).
                "modify" => RowUpdate::Modify(m.next_value_seed(row)?),
                "delete" => RowUpdate::Delete(m.next_value_seed(OptionSeed(row))?),
                _ => return Err(A::Error::custom("unknown row update")),
            };
            // A second key would make the Value-based decoder's choice depend on key order: refuse.
            if m.next_key::<IgnoredAny>()?.is_some() {
                return Err(A::Error::custom("more than one row update"));
            }
            return Ok(u);
        }
        let (mut old, mut new) = (None, None);
        while let Some(k) = m.next_key::<String>()? {
            match k.as_str() {
                "old" => old = Some(m.next_value_seed(row)?),
                "new" => new = Some(m.next_value_seed(row)?),
                _ => {
                    m.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(RowUpdate::Update { old, new })
    }
}

/// `null` or a row.
struct OptionSeed<'s>(RowSeed<'s>);

impl<'de> DeserializeSeed<'de> for OptionSeed<'_> {
    type Value = Option<Row>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<Row>, D::Error> {
        struct V<'s>(RowSeed<'s>);
        impl<'de> Visitor<'de> for V<'_> {
            type Value = Option<Row>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("null or a row")
            }
            fn visit_none<E: serde::de::Error>(self) -> Result<Option<Row>, E> {
                Ok(None)
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Option<Row>, E> {
                Ok(None)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<Row>, D::Error> {
                self.0.deserialize(d).map(Some)
            }
        }
        d.deserialize_option(V(self.0))
    }
}

/// The rows of one table in an update.
struct RowsSeed<'s> {
    table: Option<&'s TableSchema>,
    v2: bool,
}

impl<'de> DeserializeSeed<'de> for RowsSeed<'_> {
    type Value = BTreeMap<Uuid, RowUpdate>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RowsSeed<'_> {
    type Value = BTreeMap<Uuid, RowUpdate>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of row updates by uuid")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
        let mut out = BTreeMap::new();
        let seed = RowUpdateSeed {
            table: self.table,
            v2: self.v2,
        };
        while let Some(UuidStr(u)) = m.next_key()? {
            out.insert(u, m.next_value_seed(seed)?);
        }
        Ok(out)
    }
}

/// `<table-updates>` or `<table-updates2>`.
#[derive(Clone, Copy)]
pub(crate) struct TableUpdatesSeed<'s> {
    pub(crate) schema: Option<&'s DatabaseSchema>,
    pub(crate) v2: bool,
}

impl<'de> DeserializeSeed<'de> for TableUpdatesSeed<'_> {
    type Value = TableUpdates;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<TableUpdates, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for TableUpdatesSeed<'_> {
    type Value = TableUpdates;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of table updates")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<TableUpdates, A::Error> {
        let mut out = TableUpdates::new();
        while let Some(t) = m.next_key::<String>()? {
            let table = self.schema.and_then(|s| s.table(&t));
            let rows = m.next_value_seed(RowsSeed { table, v2: self.v2 })?;
            out.insert(t, rows);
        }
        Ok(out)
    }
}

/// `[found, last-txn-id, table-updates2]`: the reply to `monitor_cond_since`.
pub(crate) struct SinceReplySeed<'s>(pub(crate) Option<&'s DatabaseSchema>);

impl<'de> DeserializeSeed<'de> for SinceReplySeed<'_> {
    type Value = (bool, Option<Uuid>, TableUpdates);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for SinceReplySeed<'_> {
    type Value = (bool, Option<Uuid>, TableUpdates);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[found, last-txn-id, updates]")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
        let bad = || A::Error::custom("expected [found, last-txn-id, updates]");
        // Lenient as the Value-based reader: a non-boolean `found` is false, a bad id is none.
        let found: serde_json::Value = s.next_element()?.ok_or_else(bad)?;
        let last: serde_json::Value = s.next_element()?.ok_or_else(bad)?;
        let updates = s
            .next_element_seed(TableUpdatesSeed {
                schema: self.0,
                v2: true,
            })?
            .ok_or_else(bad)?;
        if s.next_element::<IgnoredAny>()?.is_some() {
            return Err(bad());
        }
        Ok((
            found.as_bool().unwrap_or(false),
            last.as_str().and_then(|s| Uuid::parse(s).ok()),
            updates,
        ))
    }
}

/// Decodes one datum from JSON text, typed by `ty` or untyped (for tests and fuzzing: the same result as the
/// `Value`-based decoders).
pub fn datum_from_str(s: &str, ty: Option<&ColumnType>) -> Result<Datum, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(s);
    let d = DatumSeed(ty).deserialize(&mut de)?;
    de.end()?;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datum::tests::datum;
    use crate::monitor::{parse_monitor_since_reply, parse_table_updates, parse_table_updates_str};
    use proptest::prelude::*;
    use serde_json::{json, Value as Json};

    fn types() -> Vec<ColumnType> {
        [
            json!("string"),
            json!("integer"),
            json!("real"),
            json!("boolean"),
            json!({"key": {"type": "uuid", "refTable": "T"}}),
            json!({"key": "string", "min": 0, "max": 1}),
            json!({"key": "real", "min": 0, "max": "unlimited"}),
            json!({"key": "uuid", "min": 0, "max": "unlimited"}),
            json!({"key": "string", "value": "string", "min": 0, "max": "unlimited"}),
            json!({"key": "integer", "value": "real", "min": 0, "max": "unlimited"}),
        ]
        .iter()
        .map(|j| ColumnType::parse(j).unwrap())
        .collect()
    }

    /// The direct decoder agrees with the Value-based one: same datum, or both refuse.
    fn agree(text: &str, ty: Option<&ColumnType>) -> Result<(), TestCaseError> {
        let j: Json = serde_json::from_str(text).unwrap();
        let slow = match ty {
            Some(ty) => Datum::from_json_typed(&j, ty),
            None => Datum::from_json(&j),
        };
        let fast = datum_from_str(text, ty);
        match (slow, fast) {
            (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
            (Err(_), Err(_)) => {}
            (a, b) => prop_assert!(false, "{text} as {ty:?}: {a:?} vs {b:?}"),
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn datums_decode_as_the_value_reader_does(d in datum(), t in 0usize..10) {
            let text = serde_json::to_string(&d).unwrap();
            agree(&text, None)?;
            agree(&text, Some(&types()[t]))?;
        }

        #[test]
        fn any_json_decodes_as_the_value_reader_does(j in json_value(), t in 0usize..10) {
            let text = j.to_string();
            agree(&text, None)?;
            agree(&text, Some(&types()[t]))?;
        }
    }

    fn json_value() -> impl Strategy<Value = Json> {
        let leaf = prop_oneof![
            Just(Json::Null),
            any::<bool>().prop_map(Json::from),
            any::<i64>().prop_map(Json::from),
            any::<u64>().prop_map(Json::from),
            (-1e6f64..1e6).prop_map(Json::from),
            prop_oneof![
                Just("set"),
                Just("map"),
                Just("uuid"),
                Just("named-uuid"),
                Just("00000000-0000-0000-0000-00000000000a"),
                Just("x")
            ]
            .prop_map(Json::from),
        ];
        leaf.prop_recursive(3, 16, 3, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Json::Array),
                proptest::collection::vec(inner, 0..2).prop_map(|v| {
                    Json::Object(
                        v.into_iter()
                            .enumerate()
                            .map(|(i, x)| (i.to_string(), x))
                            .collect(),
                    )
                }),
            ]
        })
    }

    #[test]
    fn table_updates_decode_as_the_value_reader_does() {
        let nb = DatabaseSchema::parse_str(include_str!("../schemas/ovn-nb.ovsschema")).unwrap();
        let u1 = "00000000-0000-0000-0000-000000000001";
        let u2 = "00000000-0000-0000-0000-000000000002";
        let v2 = json!({
            "Logical_Switch": {u1: {"modify": {"ports": ["uuid", u1], "name": "b",
                                                "other_config": ["map", [["subnet", "10.0.0.0/24"]]]}}},
            "Logical_Switch_Port": {u1: {"insert": {"name": "p", "tag_request": 3, "addresses": "router"}},
                                    u2: {"delete": null}},
            "ACL": {u2: {"initial": {"priority": 5, "action": "allow", "label": 0}}},
            "Unknown": {u1: {"delete": {"x": ["set", [1, 2.5]]}}},
        });
        let text = v2.to_string();
        assert_eq!(
            parse_table_updates_str(&text, true, Some(&nb)).unwrap(),
            parse_table_updates(&v2, true, Some(&nb)).unwrap()
        );
        assert_eq!(
            parse_table_updates_str(&text, true, None).unwrap(),
            parse_table_updates(&v2, true, None).unwrap()
        );
        let v1 = json!({"Logical_Switch": {u1: {"old": {"name": "a"}, "new": {"name": "b", "ports": ["set", []]}}}});
        assert_eq!(
            parse_table_updates_str(&v1.to_string(), false, Some(&nb)).unwrap(),
            parse_table_updates(&v1, false, Some(&nb)).unwrap()
        );
        let since = json!([true, u2, v2]);
        assert_eq!(
            crate::monitor::parse_monitor_since_reply_str(&since.to_string(), Some(&nb)).unwrap(),
            parse_monitor_since_reply(&since, Some(&nb)).unwrap()
        );
        // Errors are the Value reader's typed errors.
        let bad = json!({"Logical_Switch_Port": {u1: {"insert": {"tag_request": "x"}}}});
        assert_eq!(
            parse_table_updates_str(&bad.to_string(), true, Some(&nb)).unwrap_err(),
            parse_table_updates(&bad, true, Some(&nb)).unwrap_err()
        );
        assert!(matches!(
            parse_table_updates_str("{\"T\": 3", true, None),
            Err(crate::monitor::UpdateError::Malformed(_))
        ));
    }
}
