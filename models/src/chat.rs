//! Chat templates: turning a list of chat messages into the prompt text a model was trained on.
//!
//! Templates are the Jinja source shipped with the model (GGUF `tokenizer.chat_template`, or
//! `chat_template` in `tokenizer_config.json`), rendered with minijinja the way Hugging Face's
//! `apply_chat_template` renders them with jinja2:
//!
//! - variables `messages` (each with `role` and `content`), `add_generation_prompt`,
//!   `bos_token`, `eos_token`;
//! - `raise_exception(msg)` (the template rejects the conversation: a render error),
//!   `strftime_now(fmt)` (current date, UTC), and a `tojson` filter that writes JSON like
//!   Python's `json.dumps(ensure_ascii=False)` (`", "` and `": "` separators, no HTML escaping;
//!   `indent`, `sort_keys`, `ensure_ascii` and `separators` arguments);
//! - `trim_blocks` and `lstrip_blocks` on, as Hugging Face sets them, and Python string, list
//!   and dict methods (`.strip()`, `.startswith()`, `.items()`, ...) via minijinja-contrib.
//!
//! A syntax error is [`Error::Template`] when the template is loaded; an error while rendering
//! (including `raise_exception`) is [`Error::Template`] for that request only. Models without a
//! template get ChatML ([`ChatTemplate::CHATML`]).
//!
//! The rendered text usually starts with the BOS token when the model wants one: encode it with
//! special-token parsing and without adding BOS again (`Tokenizer::encode(text, false)`).

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{context, Environment, ErrorKind, State};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// Name of the template inside the environment.
const NAME: &str = "chat";
/// Context variable holding the render time (seconds since the Unix epoch) for `strftime_now`.
const NOW_VAR: &str = "__pace_now";

/// One chat message as templates see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The message text (OpenAI content parts are joined into one string before this point).
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into() }
    }
}

/// A compiled chat template with the special-token strings it may use.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// The source refers to a `tools` variable (it renders tool definitions itself).
    uses_tools: bool,
}

/// Instructions one render of a chat template may run.
pub const TEMPLATE_FUEL: u64 = 20_000_000;

impl ChatTemplate {
    /// ChatML, the template used when a model ships none.
    pub const CHATML: &'static str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + \
        message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}\
        {{ '<|im_start|>assistant\\n' }}{% endif %}";

    /// Compiles `source`. A syntax error is [`Error::Template`].
    pub fn new(source: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self> {
        let mut env = Environment::new();
        // A template runs at most this many instructions per render: real ones take thousands
        // for a long conversation; a hostile one (a loop over a huge range) stops with an error.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_owned()).map_err(|e| Error::Template(format!("invalid chat template: {}", describe(&e))))?;
        Ok(Self {
            env,
            bos_token: bos_token.unwrap_or_default().to_owned(),
            eos_token: eos_token.unwrap_or_default().to_owned(),
            uses_tools: source.contains("tools"),
        })
    }

    /// True if the template renders the `tools` variable (the HF convention for tool
    /// definitions); false for templates that ignore it (the caller then offers the tools in
    /// a system message).
    pub fn uses_tools(&self) -> bool {
        self.uses_tools
    }

    /// ChatML with the given special-token strings.
    pub fn chatml(bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self> {
        Self::new(Self::CHATML, bos_token, eos_token)
    }

    /// The tokenizer's own template (with its BOS/EOS strings), or ChatML if it has none.
    pub fn for_tokenizer(tokenizer: &Tokenizer) -> Result<Self> {
        let source = tokenizer.chat_template().unwrap_or(Self::CHATML);
        Self::new(source, tokenizer.bos_token(), tokenizer.eos_token())
    }

    /// Renders `messages`; `add_generation_prompt` appends the opening of an assistant turn.
    /// `strftime_now` sees the current time.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_at(messages, add_generation_prompt, SystemTime::now())
    }

    /// [`render`](Self::render) with `strftime_now` seeing `now`.
    pub fn render_at(&self, messages: &[ChatMessage], add_generation_prompt: bool, now: SystemTime) -> Result<String> {
        self.render_full(messages, add_generation_prompt, &serde_json::Map::new(), now)
    }

    /// [`render`](Self::render) with extra template variables (vLLM's `chat_template_kwargs`,
    /// e.g. `enable_thinking`); `messages`, `add_generation_prompt` and the special tokens
    /// cannot be overridden by them.
    pub fn render_with(&self, messages: &[ChatMessage], add_generation_prompt: bool, extra: &serde_json::Map<String, serde_json::Value>) -> Result<String> {
        self.render_full(messages, add_generation_prompt, extra, SystemTime::now())
    }

    fn render_full(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
        now: SystemTime,
    ) -> Result<String> {
        let secs = now.duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        let tmpl = self.env.get_template(NAME).map_err(|e| Error::Template(describe(&e)))?;
        let fixed = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            __pace_now => secs,
        };
        let ctx = if extra.is_empty() {
            fixed
        } else {
            // The fixed keys first: a merged context resolves a name from its first source.
            context! { ..fixed, ..Value::from_serialize(extra) }
        };
        tmpl.render(ctx).map_err(|e| Error::Template(describe(&e)))
    }
}

/// The error with its cause chain, on one line.
fn describe(e: &minijinja::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}

/// `raise_exception(message)`: fails the render with the template's message.
fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the render time formatted in UTC.
fn strftime_now(state: &State, format: String) -> std::result::Result<String, minijinja::Error> {
    let secs = state.lookup(NOW_VAR).and_then(|v| v.as_i64()).unwrap_or(0);
    Ok(strftime(secs, &format))
}

/// Formats Unix time `secs` (UTC) with the common strftime codes
/// (`%Y %y %m %d %e %H %I %M %S %p %b %B %a %A %j %%`); other codes are kept as written.
fn strftime(secs: i64, format: &str) -> String {
    const MONTHS: [&str; 12] = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (tod / 3600, tod % 3600 / 60, tod % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let month = MONTHS[(m - 1) as usize];
    let day = DAYS[weekday];
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:>2}")),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('I') => out.push_str(&format!("{:02}", if hh % 12 == 0 { 12 } else { hh % 12 })),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('A') => out.push_str(day),
            Some('a') => out.push_str(&day[..3]),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Day count since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Options of the `tojson` filter, as Python's `json.dumps` takes them.
struct JsonStyle {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// `tojson(indent=None, sort_keys=False, ensure_ascii=False, separators=None)`, Hugging Face's
/// definition: `json.dumps` output, no HTML escaping. Indents above 16 spaces are capped.
fn tojson(value: Value, indent: Option<Value>, kwargs: Kwargs) -> std::result::Result<String, minijinja::Error> {
    let indent = match indent.or(kwargs.get::<Option<Value>>("indent")?) {
        Some(v) if v.kind() == ValueKind::Number => Some(" ".repeat(v.as_usize().unwrap_or(0).min(16))),
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        _ => None,
    };
    let (mut item_sep, key_sep) = if indent.is_some() { (",".to_owned(), ": ".to_owned()) } else { (", ".to_owned(), ": ".to_owned()) };
    let mut key_sep = key_sep;
    if let Some(seps) = kwargs.get::<Option<Vec<String>>>("separators")? {
        if let [a, b] = seps.as_slice() {
            item_sep = a.clone();
            key_sep = b.clone();
        }
    }
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&value, &style, 0, &mut out)?;
    Ok(out)
}

fn write_json(v: &Value, st: &JsonStyle, level: usize, out: &mut String) -> std::result::Result<(), minijinja::Error> {
    let newline = |out: &mut String, level: usize| {
        if let Some(ind) = &st.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => match v.as_i64() {
            Some(i) if !v.to_string().contains(['.', 'e', 'E']) => out.push_str(&i.to_string()),
            _ => {
                let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                out.push_str(&python_float(f));
            }
        },
        ValueKind::String => write_json_str(v.as_str().unwrap_or_default(), st.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&st.item_sep);
                }
                newline(out, level + 1);
                write_json(item, st, level + 1, out)?;
            }
            if !items.is_empty() {
                newline(out, level);
            }
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if st.sort_keys {
                keys.sort_by_key(|k| k.to_string());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&st.item_sep);
                }
                newline(out, level + 1);
                let key = k.as_str().map(str::to_owned).unwrap_or_else(|| k.to_string());
                write_json_str(&key, st.ensure_ascii, out);
                out.push_str(&st.key_sep);
                write_json(&v.get_item(k)?, st, level + 1, out)?;
            }
            if !keys.is_empty() {
                newline(out, level);
            }
            out.push('}');
        }
        _ => write_json_str(&v.to_string(), st.ensure_ascii, out),
    }
    Ok(())
}

/// A float as Python's `json.dumps` writes it (`1.0`, `0.1`, `1e-07`, `NaN`).
fn python_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        }
    } else if f == f.trunc() && f.abs() < 1e16 {
        format!("{f:.1}")
    } else {
        format!("{f}")
    }
}

fn write_json_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render_src(src: &str) -> Result<String> {
        let t = ChatTemplate::new(src, Some("<s>"), Some("</s>"))?;
        t.render(&[ChatMessage::new("user", "hi")], false)
    }

    #[test]
    fn dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime(t, "%Y-%m-%d %H:%M:%S %a %A %b %B %j %y %I%p %%"), "2024-02-29 13:05:09 Thu Thursday Feb February 060 24 01PM %");
        assert_eq!(strftime(0, "%d %b %Y"), "01 Jan 1970");
        assert_eq!(days_from_civil(2024, 2, 29), t / 86_400);
    }

    #[test]
    fn tojson_matches_python() {
        let src = r#"{{ {"b": [1, 2.5, "x\"y"], "a": {"n": none, "t": true, "u": "é<>"}} | tojson }}"#;
        assert_eq!(render_src(src).ok().as_deref(), Some(r#"{"b": [1, 2.5, "x\"y"], "a": {"n": null, "t": true, "u": "é<>"}}"#));
        let src = r#"{{ {"b": 1, "a": [1]} | tojson(indent=2, sort_keys=true) }}"#;
        assert_eq!(render_src(src).ok().as_deref(), Some("{\n  \"a\": [\n    1\n  ],\n  \"b\": 1\n}"));
        let src = r#"{{ "é" | tojson(ensure_ascii=true) }}{{ 3.0 | tojson }}"#;
        assert_eq!(render_src(src).ok().as_deref(), Some(r#""\u00e9"3.0"#));
    }

    #[test]
    fn python_methods_and_bos() {
        let src = "{{ bos_token }}{% for m in messages %}{{ m['content'].strip().upper() }}{% endfor %}{{ eos_token }}";
        assert_eq!(render_src(src).ok().as_deref(), Some("<s>HI</s>"));
    }
}
