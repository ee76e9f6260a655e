//! A small JSON-schema checker for the keywords the structured-output tests use: `type`,
//! `enum`, `const`, `properties`, `required`, `additionalProperties: false`, `items`,
//! `minItems`, `maxItems`, `minLength`, `maxLength`, `minimum`, `maximum`, `anyOf`, and local
//! `$ref`s (`#/$defs/...`). Anything else in a schema is a test error, so a schema the checker
//! cannot judge is never passed silently.
#![allow(dead_code)]

use serde_json::Value;

/// Ok if `v` is valid against `schema` (resolving `$ref` in `root`), else the first violation.
pub fn check(v: &Value, schema: &Value) -> Result<(), String> {
    check_in(v, schema, schema, "$")
}

fn check_in(v: &Value, s: &Value, root: &Value, at: &str) -> Result<(), String> {
    let o = s.as_object().ok_or_else(|| format!("{at}: schema {s} is not an object"))?;
    const KNOWN: [&str; 18] = [
        "type",
        "enum",
        "const",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "anyOf",
        "$ref",
        "$defs",
        "description",
        "title",
    ];
    if let Some(k) = o.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(format!("{at}: the checker does not know keyword {k}"));
    }
    let fail = |why: String| Err(format!("{at}: {why} (value {v})"));
    if let Some(r) = o.get("$ref").and_then(Value::as_str) {
        let mut target = root;
        for part in r.strip_prefix("#/").ok_or_else(|| format!("{at}: non-local $ref {r}"))?.split('/') {
            target = target.get(part).ok_or_else(|| format!("{at}: unresolved $ref {r}"))?;
        }
        check_in(v, target, root, at)?;
    }
    if let Some(t) = o.get("type").and_then(Value::as_str) {
        let ok = match t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            other => return Err(format!("{at}: unknown type {other}")),
        };
        if !ok {
            return fail(format!("not of type {t}"));
        }
    }
    if let Some(e) = o.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            return fail(format!("not one of {e:?}"));
        }
    }
    if let Some(c) = o.get("const") {
        if c != v {
            return fail(format!("not {c}"));
        }
    }
    if let Some(any) = o.get("anyOf").and_then(Value::as_array) {
        if !any.iter().any(|s| check_in(v, s, root, at).is_ok()) {
            return fail("matches no anyOf branch".into());
        }
    }
    if let Value::Object(m) = v {
        let props = o.get("properties").and_then(Value::as_object);
        for r in o.get("required").and_then(Value::as_array).into_iter().flatten() {
            if !m.contains_key(r.as_str().unwrap_or_default()) {
                return fail(format!("missing required {r}"));
            }
        }
        for (k, val) in m {
            match props.and_then(|p| p.get(k)) {
                Some(ps) => check_in(val, ps, root, &format!("{at}.{k}"))?,
                None if o.get("additionalProperties") == Some(&Value::Bool(false)) => return fail(format!("extra property {k}")),
                None => {}
            }
        }
    }
    if let Value::Array(a) = v {
        if let Some(n) = o.get("minItems").and_then(Value::as_u64) {
            if (a.len() as u64) < n {
                return fail(format!("fewer than {n} items"));
            }
        }
        if let Some(n) = o.get("maxItems").and_then(Value::as_u64) {
            if a.len() as u64 > n {
                return fail(format!("more than {n} items"));
            }
        }
        if let Some(items) = o.get("items") {
            for (i, x) in a.iter().enumerate() {
                check_in(x, items, root, &format!("{at}[{i}]"))?;
            }
        }
    }
    if let Value::String(s) = v {
        let n = s.chars().count() as u64;
        if o.get("minLength").and_then(Value::as_u64).is_some_and(|m| n < m) || o.get("maxLength").and_then(Value::as_u64).is_some_and(|m| n > m) {
            return fail("length out of bounds".into());
        }
    }
    if let Some(x) = v.as_f64() {
        if o.get("minimum").and_then(Value::as_f64).is_some_and(|m| x < m) || o.get("maximum").and_then(Value::as_f64).is_some_and(|m| x > m) {
            return fail("number out of bounds".into());
        }
    }
    Ok(())
}
