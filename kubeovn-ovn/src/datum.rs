//! The OVSDB data model (RFC 7047 section 5.1): atoms, sets and maps, and their JSON forms.
//!
//! JSON forms: an integer, real, boolean or string atom is the JSON value itself; a uuid is `["uuid","..."]`;
//! a reference to a row inserted in the same transaction is `["named-uuid","name"]`; a set is
//! `["set",[atom,...]]` (a set of exactly one atom may be the bare atom); a map is `["map",[[key,value],...]]`.
//! Without the column type an integer-valued real and a one-element set cannot be told from an integer and a
//! bare atom: [`Datum::from_json`] guesses, [`Datum::from_json_typed`] decodes exactly.

use std::cmp::Ordering;
use std::fmt;

use serde_json::Value as Json;

use crate::schema::{BaseType, ColumnType};
use crate::uuid::Uuid;

/// The five atomic types of OVSDB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AtomType {
    /// A 64-bit signed integer.
    Integer,
    /// A double-precision float.
    Real,
    /// `true` or `false`.
    Boolean,
    /// A UTF-8 string.
    String,
    /// A UUID (or, inside a transaction, a named-uuid).
    Uuid,
}

impl AtomType {
    /// The name used in schemas (`"integer"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            AtomType::Integer => "integer",
            AtomType::Real => "real",
            AtomType::Boolean => "boolean",
            AtomType::String => "string",
            AtomType::Uuid => "uuid",
        }
    }

    /// Parses a schema atomic-type name.
    pub fn from_name(s: &str) -> Option<Self> {
        Some(match s {
            "integer" => AtomType::Integer,
            "real" => AtomType::Real,
            "boolean" => AtomType::Boolean,
            "string" => AtomType::String,
            "uuid" => AtomType::Uuid,
            _ => return None,
        })
    }
}

impl fmt::Display for AtomType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One OVSDB atom.
///
/// Atoms are totally ordered (reals by `f64::total_cmp`) so that sets and maps can be sorted and compared.
#[derive(Debug, Clone)]
pub enum Atom {
    /// An integer.
    Integer(i64),
    /// A real.
    Real(f64),
    /// A boolean.
    Boolean(bool),
    /// A string.
    String(String),
    /// A row UUID.
    Uuid(Uuid),
    /// The `uuid-name` of a row inserted by the same transaction.
    NamedUuid(String),
}

impl Atom {
    /// The atom's type (a named-uuid is of type uuid).
    pub fn atom_type(&self) -> AtomType {
        match self {
            Atom::Integer(_) => AtomType::Integer,
            Atom::Real(_) => AtomType::Real,
            Atom::Boolean(_) => AtomType::Boolean,
            Atom::String(_) => AtomType::String,
            Atom::Uuid(_) | Atom::NamedUuid(_) => AtomType::Uuid,
        }
    }

    /// The string, if this is a string atom.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Atom::String(s) => Some(s),
            _ => None,
        }
    }

    /// The integer, if this is an integer atom.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Atom::Integer(i) => Some(*i),
            _ => None,
        }
    }

    /// The UUID, if this is a uuid atom.
    pub fn as_uuid(&self) -> Option<Uuid> {
        match self {
            Atom::Uuid(u) => Some(*u),
            _ => None,
        }
    }

    /// The atom's JSON form.
    pub fn to_json(&self) -> Json {
        match self {
            Atom::Integer(i) => Json::from(*i),
            Atom::Real(r) => serde_json::Number::from_f64(*r)
                .map(Json::Number)
                .unwrap_or(Json::Null),
            Atom::Boolean(b) => Json::Bool(*b),
            Atom::String(s) => Json::String(s.clone()),
            Atom::Uuid(u) => Json::Array(vec![Json::from("uuid"), Json::String(u.to_string())]),
            Atom::NamedUuid(n) => {
                Json::Array(vec![Json::from("named-uuid"), Json::String(n.clone())])
            }
        }
    }

    /// Decodes an atom without knowing its type (integers stay integers).
    pub fn from_json(j: &Json) -> Result<Self, DatumError> {
        match j {
            Json::Bool(b) => Ok(Atom::Boolean(*b)),
            Json::String(s) => Ok(Atom::String(s.clone())),
            Json::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Ok(Atom::Integer(i))
                } else if let Some(f) = n.as_f64() {
                    Ok(Atom::Real(f))
                } else {
                    Err(DatumError::syntax("number out of range", j))
                }
            }
            Json::Array(a) if a.len() == 2 => match (&a[0], &a[1]) {
                (Json::String(tag), Json::String(s)) if tag == "uuid" => Uuid::parse(s)
                    .map(Atom::Uuid)
                    .map_err(|_| DatumError::syntax("bad uuid", j)),
                (Json::String(tag), Json::String(s)) if tag == "named-uuid" => {
                    Ok(Atom::NamedUuid(s.clone()))
                }
                _ => Err(DatumError::syntax("not an atom", j)),
            },
            _ => Err(DatumError::syntax("not an atom", j)),
        }
    }

    /// Decodes an atom of a known type (an integer is accepted for a real).
    pub fn from_json_typed(j: &Json, ty: AtomType) -> Result<Self, DatumError> {
        let a = Atom::from_json(j)?;
        match (ty, a) {
            (AtomType::Real, Atom::Integer(i)) => Ok(Atom::Real(i as f64)),
            (t, a) if a.atom_type() == t => Ok(a),
            (t, a) => Err(DatumError::WrongType {
                expected: t,
                found: a.atom_type(),
            }),
        }
    }

    fn rank(&self) -> u8 {
        match self {
            Atom::Integer(_) => 0,
            Atom::Real(_) => 1,
            Atom::Boolean(_) => 2,
            Atom::String(_) => 3,
            Atom::Uuid(_) => 4,
            Atom::NamedUuid(_) => 5,
        }
    }
}

impl Ord for Atom {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Atom::Integer(a), Atom::Integer(b)) => a.cmp(b),
            (Atom::Real(a), Atom::Real(b)) => a.total_cmp(b),
            (Atom::Boolean(a), Atom::Boolean(b)) => a.cmp(b),
            (Atom::String(a), Atom::String(b)) => a.cmp(b),
            (Atom::Uuid(a), Atom::Uuid(b)) => a.cmp(b),
            (Atom::NamedUuid(a), Atom::NamedUuid(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}
impl PartialOrd for Atom {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Atom {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Atom {}
impl std::hash::Hash for Atom {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.rank().hash(state);
        match self {
            Atom::Integer(i) => i.hash(state),
            Atom::Real(r) => r.to_bits().hash(state),
            Atom::Boolean(b) => b.hash(state),
            Atom::String(s) | Atom::NamedUuid(s) => s.hash(state),
            Atom::Uuid(u) => u.hash(state),
        }
    }
}

impl From<i64> for Atom {
    fn from(v: i64) -> Self {
        Atom::Integer(v)
    }
}
impl From<f64> for Atom {
    fn from(v: f64) -> Self {
        Atom::Real(v)
    }
}
impl From<bool> for Atom {
    fn from(v: bool) -> Self {
        Atom::Boolean(v)
    }
}
impl From<&str> for Atom {
    fn from(v: &str) -> Self {
        Atom::String(v.to_owned())
    }
}
impl From<String> for Atom {
    fn from(v: String) -> Self {
        Atom::String(v)
    }
}
impl From<Uuid> for Atom {
    fn from(v: Uuid) -> Self {
        Atom::Uuid(v)
    }
}

/// An OVSDB datum: the value of one column. A scalar column holds an atom, others a set or a map.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Datum {
    /// A single atom (a column with `min` = `max` = 1, or a bare atom on the wire).
    Atom(Atom),
    /// A set of atoms.
    Set(Vec<Atom>),
    /// A map from key atoms to value atoms.
    Map(Vec<(Atom, Atom)>),
}

impl Datum {
    /// The empty set (also the "absent" value of an optional column).
    pub fn empty() -> Self {
        Datum::Set(Vec::new())
    }

    /// A set from atoms.
    pub fn set<I: IntoIterator<Item = A>, A: Into<Atom>>(items: I) -> Self {
        Datum::Set(items.into_iter().map(Into::into).collect())
    }

    /// A map from pairs.
    pub fn map<I, K, V>(items: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<Atom>,
        V: Into<Atom>,
    {
        Datum::Map(
            items
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }

    /// A `["uuid", ...]` atom.
    pub fn uuid(u: Uuid) -> Self {
        Datum::Atom(Atom::Uuid(u))
    }

    /// A `["named-uuid", name]` atom: a reference to a row inserted with that `uuid-name`.
    pub fn named_uuid(name: impl Into<String>) -> Self {
        Datum::Atom(Atom::NamedUuid(name.into()))
    }

    /// The atom, if the datum is a single atom or a one-element set.
    pub fn as_atom(&self) -> Option<&Atom> {
        match self {
            Datum::Atom(a) => Some(a),
            Datum::Set(s) if s.len() == 1 => Some(&s[0]),
            _ => None,
        }
    }

    /// The elements as a slice (one for an atom, none for a map).
    pub fn atoms(&self) -> &[Atom] {
        match self {
            Datum::Atom(a) => std::slice::from_ref(a),
            Datum::Set(s) => s,
            Datum::Map(_) => &[],
        }
    }

    /// The string, if the datum is one string atom.
    pub fn as_str(&self) -> Option<&str> {
        self.as_atom().and_then(Atom::as_str)
    }

    /// The map entries, if the datum is a map.
    pub fn as_map(&self) -> Option<&[(Atom, Atom)]> {
        match self {
            Datum::Map(m) => Some(m),
            _ => None,
        }
    }

    /// The value for `key` in a map datum.
    pub fn map_get(&self, key: &str) -> Option<&Atom> {
        self.as_map()?
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    /// Number of elements (1 for an atom).
    pub fn len(&self) -> usize {
        match self {
            Datum::Atom(_) => 1,
            Datum::Set(s) => s.len(),
            Datum::Map(m) => m.len(),
        }
    }

    /// Whether the datum is an empty set or map.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The datum's JSON form.
    pub fn to_json(&self) -> Json {
        match self {
            Datum::Atom(a) => a.to_json(),
            Datum::Set(s) => Json::Array(vec![
                Json::from("set"),
                Json::Array(s.iter().map(Atom::to_json).collect()),
            ]),
            Datum::Map(m) => Json::Array(vec![
                Json::from("map"),
                Json::Array(
                    m.iter()
                        .map(|(k, v)| Json::Array(vec![k.to_json(), v.to_json()]))
                        .collect(),
                ),
            ]),
        }
    }

    /// Decodes a datum without its column type: bare atoms stay atoms, integers stay integers.
    pub fn from_json(j: &Json) -> Result<Self, DatumError> {
        if let Json::Array(a) = j {
            if a.len() == 2 {
                if let (Json::String(tag), Json::Array(items)) = (&a[0], &a[1]) {
                    match tag.as_str() {
                        "set" => {
                            return items
                                .iter()
                                .map(Atom::from_json)
                                .collect::<Result<_, _>>()
                                .map(Datum::Set)
                        }
                        "map" => {
                            return items
                                .iter()
                                .map(pair_from_json)
                                .collect::<Result<_, _>>()
                                .map(Datum::Map)
                        }
                        _ => {}
                    }
                }
            }
        }
        Atom::from_json(j).map(Datum::Atom)
    }

    /// Decodes a datum for a column of type `ty`: a scalar column gives [`Datum::Atom`], a set column
    /// [`Datum::Set`] (also from a bare atom), a map column [`Datum::Map`]; reals may be written as integers.
    /// Counts and constraints are not checked here: see [`ColumnType::validate`].
    pub fn from_json_typed(j: &Json, ty: &ColumnType) -> Result<Self, DatumError> {
        let tagged = |tag: &str| -> Option<&Vec<Json>> {
            match j {
                Json::Array(a) if a.len() == 2 && a[0].as_str() == Some(tag) => a[1].as_array(),
                _ => None,
            }
        };
        if let Some(vt) = &ty.value {
            let items = tagged("map").ok_or_else(|| DatumError::syntax("expected a map", j))?;
            let mut out = Vec::with_capacity(items.len());
            for it in items {
                match it {
                    Json::Array(kv) if kv.len() == 2 => out.push((
                        Atom::from_json_typed(&kv[0], ty.key.atom)?,
                        Atom::from_json_typed(&kv[1], vt.atom)?,
                    )),
                    _ => return Err(DatumError::syntax("map entry must be [key, value]", it)),
                }
            }
            return Ok(Datum::Map(out));
        }
        if ty.is_scalar() {
            return Atom::from_json_typed(j, ty.key.atom).map(Datum::Atom);
        }
        match tagged("set") {
            Some(items) => items
                .iter()
                .map(|it| Atom::from_json_typed(it, ty.key.atom))
                .collect::<Result<_, _>>()
                .map(Datum::Set),
            None => Ok(Datum::Set(vec![Atom::from_json_typed(j, ty.key.atom)?])),
        }
    }

    /// The datum in canonical form for comparison: sets and maps sorted and deduplicated, a one-element
    /// set as its atom.
    pub fn canonical(&self) -> Datum {
        match self {
            Datum::Atom(a) => Datum::Atom(a.clone()),
            Datum::Set(s) => {
                let mut s = s.clone();
                s.sort();
                s.dedup();
                if s.len() == 1 {
                    Datum::Atom(s.remove(0))
                } else {
                    Datum::Set(s)
                }
            }
            Datum::Map(m) => {
                let mut m = m.clone();
                m.sort();
                m.dedup_by(|a, b| a.0 == b.0);
                Datum::Map(m)
            }
        }
    }
}

fn pair_from_json(j: &Json) -> Result<(Atom, Atom), DatumError> {
    match j {
        Json::Array(kv) if kv.len() == 2 => {
            Ok((Atom::from_json(&kv[0])?, Atom::from_json(&kv[1])?))
        }
        _ => Err(DatumError::syntax("map entry must be [key, value]", j)),
    }
}

impl<T: Into<Atom>> From<T> for Datum {
    fn from(v: T) -> Self {
        Datum::Atom(v.into())
    }
}

impl serde::Serialize for Atom {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        match self {
            Atom::Integer(i) => s.serialize_i64(*i),
            Atom::Real(r) => s.serialize_f64(*r),
            Atom::Boolean(b) => s.serialize_bool(*b),
            Atom::String(v) => s.serialize_str(v),
            Atom::Uuid(u) => {
                let mut t = s.serialize_tuple(2)?;
                t.serialize_element("uuid")?;
                t.serialize_element(u)?;
                t.end()
            }
            Atom::NamedUuid(n) => {
                let mut t = s.serialize_tuple(2)?;
                t.serialize_element("named-uuid")?;
                t.serialize_element(n)?;
                t.end()
            }
        }
    }
}

struct Pair<'a>(&'a Atom, &'a Atom);
impl serde::Serialize for Pair<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let mut t = s.serialize_tuple(2)?;
        t.serialize_element(self.0)?;
        t.serialize_element(self.1)?;
        t.end()
    }
}
struct Pairs<'a>(&'a [(Atom, Atom)]);
impl serde::Serialize for Pairs<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|(k, v)| Pair(k, v)))
    }
}

impl serde::Serialize for Datum {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        match self {
            Datum::Atom(a) => a.serialize(s),
            Datum::Set(v) => {
                let mut t = s.serialize_tuple(2)?;
                t.serialize_element("set")?;
                t.serialize_element(v)?;
                t.end()
            }
            Datum::Map(m) => {
                let mut t = s.serialize_tuple(2)?;
                t.serialize_element("map")?;
                t.serialize_element(&Pairs(m))?;
                t.end()
            }
        }
    }
}

impl<'de> serde::Deserialize<'de> for Datum {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let j = Json::deserialize(d)?;
        Datum::from_json(&j).map_err(serde::de::Error::custom)
    }
}

impl<'de> serde::Deserialize<'de> for Atom {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let j = Json::deserialize(d)?;
        Atom::from_json(&j).map_err(serde::de::Error::custom)
    }
}

/// Why a JSON value is not a valid datum, or a datum does not fit its column type.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DatumError {
    /// Not the JSON form of an atom, set or map.
    #[error("{what}: {json}")]
    Syntax {
        /// What was wrong.
        what: &'static str,
        /// The offending JSON (truncated).
        json: String,
    },
    /// An atom of the wrong type.
    #[error("expected {expected}, found {found}")]
    WrongType {
        /// The column's atomic type.
        expected: AtomType,
        /// The atom's type.
        found: AtomType,
    },
    /// A set or map given for a scalar, or a map for a set, or the reverse.
    #[error("expected {expected}, found {found}")]
    WrongShape {
        /// What the column type needs.
        expected: &'static str,
        /// What was given.
        found: &'static str,
    },
    /// Too few or too many elements.
    #[error("{n} elements, the column allows {min} to {max}")]
    Count {
        /// Number of elements given.
        n: usize,
        /// The column's minimum.
        min: u64,
        /// The column's maximum (`u64::MAX` for unlimited).
        max: u64,
    },
    /// An atom outside the base type's constraints (enum, range, length).
    #[error("{atom:?} violates the constraint {constraint}")]
    Constraint {
        /// The atom.
        atom: Atom,
        /// The constraint, described.
        constraint: String,
    },
    /// The same set element or map key twice.
    #[error("duplicate element {0:?}")]
    Duplicate(Atom),
}

impl DatumError {
    pub(crate) fn syntax(what: &'static str, j: &Json) -> Self {
        let mut json = j.to_string();
        if json.len() > 200 {
            let mut cut = 200;
            while !json.is_char_boundary(cut) {
                cut -= 1;
            }
            json.truncate(cut);
            json.push('…');
        }
        DatumError::Syntax { what, json }
    }
}

impl ColumnType {
    /// Checks that `datum` is a value of this column type: shape, atom types, counts, constraints and no
    /// duplicates. A named-uuid is accepted wherever a uuid is.
    pub fn validate(&self, datum: &Datum) -> Result<(), DatumError> {
        self.validate_with(datum, true)
    }

    pub(crate) fn validate_with(&self, datum: &Datum, constraints: bool) -> Result<(), DatumError> {
        let n = match (datum, &self.value) {
            (Datum::Map(m), Some(vt)) => {
                for (k, v) in m {
                    check_atom(&self.key, k, constraints)?;
                    check_atom(vt, v, constraints)?;
                }
                if m.len() > 1 {
                    let mut keys: Vec<&Atom> = m.iter().map(|(k, _)| k).collect();
                    keys.sort();
                    if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
                        return Err(DatumError::Duplicate(w[0].clone()));
                    }
                }
                m.len()
            }
            (Datum::Set(s), Some(_)) if s.is_empty() => 0,
            (_, Some(_)) => {
                return Err(DatumError::WrongShape {
                    expected: "a map",
                    found: datum.shape(),
                })
            }
            (Datum::Map(_), None) => {
                return Err(DatumError::WrongShape {
                    expected: "a set or atom",
                    found: "a map",
                })
            }
            (Datum::Atom(a), None) => {
                check_atom(&self.key, a, constraints)?;
                1
            }
            (Datum::Set(s), None) => {
                for a in s {
                    check_atom(&self.key, a, constraints)?;
                }
                if s.len() > 1 {
                    let mut v: Vec<&Atom> = s.iter().collect();
                    v.sort();
                    if let Some(w) = v.windows(2).find(|w| w[0] == w[1]) {
                        return Err(DatumError::Duplicate(w[0].clone()));
                    }
                }
                s.len()
            }
        };
        if (n as u64) < self.min || (n as u64) > self.max {
            return Err(DatumError::Count {
                n,
                min: self.min,
                max: self.max,
            });
        }
        Ok(())
    }
}

impl Datum {
    fn shape(&self) -> &'static str {
        match self {
            Datum::Atom(_) => "an atom",
            Datum::Set(_) => "a set",
            Datum::Map(_) => "a map",
        }
    }
}

fn check_atom(bt: &BaseType, a: &Atom, constraints: bool) -> Result<(), DatumError> {
    if a.atom_type() != bt.atom {
        return Err(DatumError::WrongType {
            expected: bt.atom,
            found: a.atom_type(),
        });
    }
    if !constraints {
        return Ok(());
    }
    let violated = |c: String| {
        Err(DatumError::Constraint {
            atom: a.clone(),
            constraint: c,
        })
    };
    if let Some(e) = &bt.enumeration {
        if !e.contains(a) {
            return violated(format!("enum {e:?}"));
        }
    }
    match a {
        Atom::Integer(i)
            if bt.min_integer.is_some_and(|m| *i < m) || bt.max_integer.is_some_and(|m| *i > m) =>
        {
            violated(format!(
                "integer in [{:?}, {:?}]",
                bt.min_integer, bt.max_integer
            ))
        }
        Atom::Real(r)
            if bt.min_real.is_some_and(|m| *r < m) || bt.max_real.is_some_and(|m| *r > m) =>
        {
            violated(format!("real in [{:?}, {:?}]", bt.min_real, bt.max_real))
        }
        Atom::String(s) => {
            let n = s.chars().count() as u64;
            if bt.min_length.is_some_and(|m| n < m) || bt.max_length.is_some_and(|m| n > m) {
                violated(format!(
                    "length in [{:?}, {:?}]",
                    bt.min_length, bt.max_length
                ))
            } else {
                Ok(())
            }
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn json_forms() {
        let u = Uuid::from_u128(7);
        assert_eq!(
            Datum::uuid(u).to_json(),
            json!(["uuid", "00000000-0000-0000-0000-000000000007"])
        );
        assert_eq!(Datum::named_uuid("p").to_json(), json!(["named-uuid", "p"]));
        assert_eq!(Datum::set(["a", "b"]).to_json(), json!(["set", ["a", "b"]]));
        assert_eq!(
            Datum::map([("k", "v")]).to_json(),
            json!(["map", [["k", "v"]]])
        );
        assert_eq!(Datum::from(3i64).to_json(), json!(3));
        // serde and to_json agree
        let d = Datum::map([("k", 1i64)]);
        assert_eq!(serde_json::to_value(&d).unwrap(), d.to_json());
    }

    #[test]
    fn typed_decoding() {
        let set_ty =
            ColumnType::parse(&json!({"key": "string", "min": 0, "max": "unlimited"})).unwrap();
        assert_eq!(
            Datum::from_json_typed(&json!("a"), &set_ty).unwrap(),
            Datum::set(["a"])
        );
        assert_eq!(
            Datum::from_json_typed(&json!(["set", []]), &set_ty).unwrap(),
            Datum::empty()
        );
        let real_ty = ColumnType::parse(&json!("real")).unwrap();
        assert_eq!(
            Datum::from_json_typed(&json!(2), &real_ty).unwrap(),
            Datum::from(2.0)
        );
        let map_ty = ColumnType::parse(
            &json!({"key": "string", "value": "integer", "min": 0, "max": "unlimited"}),
        )
        .unwrap();
        assert_eq!(
            Datum::from_json_typed(&json!(["map", [["a", 1]]]), &map_ty).unwrap(),
            Datum::map([("a", 1i64)])
        );
        assert!(Datum::from_json_typed(&json!(["map", [["a", "x"]]]), &map_ty).is_err());
        assert!(Datum::from_json_typed(&json!("x"), &real_ty).is_err());
    }

    #[test]
    fn validation() {
        let ty = ColumnType::parse(
            &json!({"key": {"type": "integer", "minInteger": 0, "maxInteger": 4095},
            "min": 0, "max": 1}),
        )
        .unwrap();
        ty.validate(&Datum::empty()).unwrap();
        ty.validate(&Datum::set([5i64])).unwrap();
        ty.validate(&Datum::from(5i64)).unwrap();
        assert!(matches!(
            ty.validate(&Datum::from(5000i64)),
            Err(DatumError::Constraint { .. })
        ));
        assert!(matches!(
            ty.validate(&Datum::set([1i64, 2])),
            Err(DatumError::Count { .. })
        ));
        assert!(matches!(
            ty.validate(&Datum::from("x")),
            Err(DatumError::WrongType { .. })
        ));
        let en =
            ColumnType::parse(&json!({"key": {"type": "string", "enum": ["set", ["a", "b"]]}}))
                .unwrap();
        en.validate(&Datum::from("a")).unwrap();
        assert!(en.validate(&Datum::from("c")).is_err());
        assert!(en.validate(&Datum::empty()).is_err());
        let set =
            ColumnType::parse(&json!({"key": "string", "min": 0, "max": "unlimited"})).unwrap();
        assert!(matches!(
            set.validate(&Datum::set(["a", "a"])),
            Err(DatumError::Duplicate(_))
        ));
        let uuid = ColumnType::parse(&json!({"key": {"type": "uuid", "refTable": "T"}})).unwrap();
        uuid.validate(&Datum::named_uuid("x")).unwrap();
    }

    pub(crate) fn atom() -> impl Strategy<Value = Atom> {
        prop_oneof![
            any::<i64>().prop_map(Atom::Integer),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Atom::Real),
            any::<bool>().prop_map(Atom::Boolean),
            ".{0,12}".prop_map(Atom::String),
            any::<u128>().prop_map(|v| Atom::Uuid(Uuid::from_u128(v))),
            "[a-z_][a-z0-9_]{0,8}".prop_map(Atom::NamedUuid),
        ]
    }

    pub(crate) fn datum() -> impl Strategy<Value = Datum> {
        prop_oneof![
            atom().prop_map(Datum::Atom),
            proptest::collection::vec(atom(), 0..5).prop_map(Datum::Set),
            proptest::collection::vec((atom(), atom()), 0..5).prop_map(Datum::Map),
        ]
    }

    proptest! {
        #[test]
        fn untyped_round_trip(d in datum()) {
            let j = d.to_json();
            let back = Datum::from_json(&j).unwrap();
            // Reals that happen to be integral come back as integers when untyped: compare JSON.
            prop_assert_eq!(back.to_json(), j.clone());
            let text = serde_json::to_string(&d).unwrap();
            let parsed: Json = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(parsed, j);
        }

        #[test]
        fn typed_round_trip(v in proptest::collection::vec(any::<i64>(), 0..6), s in ".{0,8}") {
            let set_ty = ColumnType::parse(&json!({"key": "integer", "min": 0, "max": "unlimited"})).unwrap();
            let d = Datum::set(v);
            prop_assert_eq!(Datum::from_json_typed(&d.to_json(), &set_ty).unwrap(), d);
            let str_ty = ColumnType::parse(&json!("string")).unwrap();
            let a = Datum::from(s);
            prop_assert_eq!(Datum::from_json_typed(&a.to_json(), &str_ty).unwrap(), a);
        }
    }
}
