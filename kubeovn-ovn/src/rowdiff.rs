//! Small helpers shared by the high-level APIs (northbound, Open_vSwitch): string maps to and from datums,
//! and "what would change" merges that let an ensure skip a write when nothing differs.

use std::collections::BTreeMap;

use crate::datum::{Atom, Datum};

/// A string-to-string OVSDB map column (`external_ids`, `options`, ...).
pub(crate) type Map = BTreeMap<String, String>;

/// The datum of a string map.
pub(crate) fn map_datum(m: &Map) -> Datum {
    Datum::map(m.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

/// A map column's strings (non-string entries ignored; an absent column is empty).
pub(crate) fn map_of(d: Option<&Datum>) -> Map {
    d.and_then(Datum::as_map)
        .unwrap_or(&[])
        .iter()
        .filter_map(|(k, v)| Some((k.as_str()?.to_owned(), v.as_str()?.to_owned())))
        .collect()
}

/// `want` merged over the current map; None if nothing changes.
pub(crate) fn merged(d: Option<&Datum>, want: &Map) -> Option<Map> {
    let mut cur = map_of(d);
    let mut changed = false;
    for (k, v) in want {
        if cur.get(k) != Some(v) {
            cur.insert(k.clone(), v.clone());
            changed = true;
        }
    }
    changed.then_some(cur)
}

/// `want` merged over the current map, keys whose value is None removed; None if nothing changes.
pub(crate) fn merged_opt(
    d: Option<&Datum>,
    want: &BTreeMap<String, Option<String>>,
) -> Option<Map> {
    let mut cur = map_of(d);
    let mut changed = false;
    for (k, v) in want {
        match v {
            Some(v) if cur.get(k) != Some(v) => {
                cur.insert(k.clone(), v.clone());
                changed = true;
            }
            None if cur.contains_key(k) => {
                cur.remove(k);
                changed = true;
            }
            _ => {}
        }
    }
    changed.then_some(cur)
}

/// The integer of an optional integer column.
pub(crate) fn int_of(d: Option<&Datum>) -> Option<i64> {
    match d?.atoms().first()? {
        Atom::Integer(i) => Some(*i),
        _ => None,
    }
}
