//! Label and field selectors (`labelSelector=a=b,c in (d,e),!f`, `fieldSelector=spec.nodeName=n1`).

use serde_json::Value;

use crate::error::{Error, Result};

#[derive(Debug, Clone, PartialEq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label or field selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selector {
    reqs: Vec<Req>,
    field: bool,
}

fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn set(s: &str) -> Result<Vec<String>> {
    let s = s.trim();
    let inner = s
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| {
            Error::bad_request(format!(
                "unable to parse requirement: expected a set, found {s:?}"
            ))
        })?;
    Ok(inner.split(',').map(|v| v.trim().to_owned()).collect())
}

impl Selector {
    /// Parses a label selector.
    pub fn labels(s: &str) -> Result<Self> {
        Self::parse(s, false)
    }

    /// Parses a field selector (only `=`, `==` and `!=`).
    pub fn fields(s: &str) -> Result<Self> {
        Self::parse(s, true)
    }

    fn parse(s: &str, field: bool) -> Result<Self> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            let req = if let Some((k, v)) = p.split_once("!=") {
                Req::Ne(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once("==") {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once('=') {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if field {
                return Err(Error::bad_request(format!("invalid field selector: {p:?}")));
            } else if let Some((k, v)) = p.split_once(" notin ") {
                Req::NotIn(k.trim().into(), set(v)?)
            } else if let Some((k, v)) = p.split_once(" in ") {
                Req::In(k.trim().into(), set(v)?)
            } else if let Some(k) = p.strip_prefix('!') {
                Req::NotExists(k.trim().into())
            } else if p.contains([' ', '(', ')']) {
                return Err(Error::bad_request(format!(
                    "unable to parse requirement: {p:?}"
                )));
            } else {
                Req::Exists(p.into())
            };
            reqs.push(req);
        }
        Ok(Selector { reqs, field })
    }

    /// Whether the selector is empty.
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether `obj` matches.
    pub fn matches(&self, obj: &Value) -> bool {
        if self.reqs.is_empty() {
            return true;
        }
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| -> Option<String> {
            if self.field {
                let ptr = format!("/{}", k.replace('.', "/"));
                match obj.pointer(&ptr) {
                    Some(Value::String(s)) => Some(s.clone()),
                    Some(Value::Null) | None => Some(String::new()),
                    Some(v) => Some(v.to_string()),
                }
            } else {
                labels
                    .and_then(|l| l.get(k))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            }
        };
        self.reqs.iter().all(|r| match r {
            Req::Eq(k, v) => get(k).as_deref() == Some(v.as_str()),
            Req::Ne(k, v) => get(k).as_deref() != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.contains(&x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(&x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let o = json!({"metadata": {"labels": {"app": "a", "tier": "web"}}});
        assert!(Selector::labels("app=a,tier in (web, db)")
            .expect("parse")
            .matches(&o));
        assert!(!Selector::labels("app!=a").expect("parse").matches(&o));
        assert!(Selector::labels("!missing,app").expect("parse").matches(&o));
        assert!(!Selector::labels("tier notin (web)")
            .expect("parse")
            .matches(&o));
    }

    #[test]
    fn field_selectors() {
        let o = json!({"metadata": {"name": "p", "namespace": "d"}, "spec": {"nodeName": "n1"}});
        assert!(Selector::fields("spec.nodeName=n1,metadata.namespace==d")
            .expect("parse")
            .matches(&o));
        assert!(!Selector::fields("metadata.name!=p")
            .expect("parse")
            .matches(&o));
        assert!(Selector::fields("spec.missing=")
            .expect("parse")
            .matches(&o));
    }
}
