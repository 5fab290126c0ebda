//! A small YAML emitter for JSON values (block style), enough for Kubernetes manifests.
//!
//! Strings that YAML could read as something else (numbers, booleans, null, or text with indicators) are
//! written as JSON double-quoted scalars, which YAML reads the same way; everything else is plain.

use serde_json::Value;

/// `value` as a YAML document (ends with a newline).
pub fn to_string(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(m) if !m.is_empty() => write_map(&mut out, m, 0),
        Value::Array(a) if !a.is_empty() => write_seq(&mut out, a, 0),
        scalar => {
            out.push_str(&scalar_text(scalar));
            out.push('\n');
        }
    }
    out
}

fn indent(out: &mut String, n: usize) {
    out.extend(std::iter::repeat_n(' ', n));
}

fn write_map(out: &mut String, m: &serde_json::Map<String, Value>, ind: usize) {
    for (k, v) in m {
        indent(out, ind);
        out.push_str(&string_text(k));
        out.push(':');
        write_value_after_key(out, v, ind);
    }
}

fn write_seq(out: &mut String, a: &[Value], ind: usize) {
    for v in a {
        indent(out, ind);
        out.push('-');
        match v {
            Value::Object(m) if !m.is_empty() => {
                // First key on the dash's line, the rest aligned under it.
                out.push(' ');
                let mut first = true;
                for (k, v) in m {
                    if !first {
                        indent(out, ind + 2);
                    }
                    first = false;
                    out.push_str(&string_text(k));
                    out.push(':');
                    write_value_after_key(out, v, ind + 2);
                }
            }
            Value::Array(inner) if !inner.is_empty() => {
                out.push('\n');
                write_seq(out, inner, ind + 2);
            }
            scalar => {
                out.push(' ');
                out.push_str(&scalar_text(scalar));
                out.push('\n');
            }
        }
    }
}

fn write_value_after_key(out: &mut String, v: &Value, ind: usize) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            out.push('\n');
            write_map(out, m, ind + 2);
        }
        Value::Array(a) if !a.is_empty() => {
            out.push('\n');
            write_seq(out, a, ind);
        }
        scalar => {
            out.push(' ');
            out.push_str(&scalar_text(scalar));
            out.push('\n');
        }
    }
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => string_text(s),
        Value::Array(_) => "[]".to_owned(),
        Value::Object(_) => "{}".to_owned(),
    }
}

/// Plain when unambiguous, else a JSON (= YAML double-quoted) string.
fn string_text(s: &str) -> String {
    if is_plain_safe(s) {
        s.to_owned()
    } else {
        // Serialising a str cannot fail.
        serde_json::to_string(s).unwrap_or_default()
    }
}

fn is_plain_safe(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    if !(first.is_ascii_alphabetic() || first == '_' || first == '/' || first == '.') {
        return false;
    }
    if s.ends_with(' ') || s.contains(": ") || s.contains(" #") || s.ends_with(':') {
        return false;
    }
    if !s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || " _-./()=,'".contains(c))
    {
        return false;
    }
    // YAML 1.1 and 1.2 keywords, and anything a YAML reader might take for a number (".5", ".inf", ".nan").
    let keyword = matches!(
        s.to_ascii_lowercase().as_str(),
        "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "y" | "n" | "~"
    );
    let dot_number = first == '.'
        && s[1..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit() || "iInN".contains(c));
    !keyword && !dot_number
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    proptest! {
        /// Every string is either plain-safe or written as a JSON string that reads back to itself.
        #[test]
        fn strings_are_plain_or_exactly_quoted(s in ".{0,24}|[a-z][a-z .:#-]{0,12}|true|no|~|[0-9.e+-]{1,8}") {
            let t = string_text(&s);
            if t == s {
                let first = s.chars().next().unwrap_or('0');
                prop_assert!(first.is_ascii_alphabetic() || "_/.".contains(first));
                prop_assert!(!s.contains(": ") && !s.contains(" #") && !s.ends_with(' '));
                // YAML numbers start with a digit, a sign or ".<digit>", ".inf", ".nan".
                let dot_num = s.starts_with('.')
                    && s[1..].starts_with(|c: char| c.is_ascii_digit() || "iInN".contains(c));
                prop_assert!(!dot_num);
                let lower = s.to_ascii_lowercase();
                prop_assert!(!["true", "false", "null", "yes", "no", "on", "off", "y", "n"].contains(&lower.as_str()));
            } else {
                prop_assert_eq!(serde_json::from_str::<String>(&t).expect("valid JSON string"), s);
            }
        }
    }

    #[test]
    fn emits_block_yaml() {
        let v = json!({
            "apiVersion": "v1",
            "kind": "X",
            "metadata": {"labels": {}, "name": "a"},
            "spec": {
                "empty": "",
                "list": [1, "two", {"k": "v", "n": [true, null]}, [], {}],
                "quoted key: x": 1.5,
                "tricky": ["true", "10", "a: b", "-x", "#c", "ok thing", "yes", "x\ny", ".5", ".inf", "1e3"]
            }
        });
        let y = to_string(&v);
        let expected = r##"apiVersion: v1
kind: X
metadata:
  labels: {}
  name: a
spec:
  empty: ""
  list:
  - 1
  - two
  - k: v
    "n":
    - true
    - null
  - []
  - {}
  "quoted key: x": 1.5
  tricky:
  - "true"
  - "10"
  - "a: b"
  - "-x"
  - "#c"
  - ok thing
  - "yes"
  - "x\ny"
  - ".5"
  - ".inf"
  - "1e3"
"##;
        assert_eq!(y, expected);
    }
}
