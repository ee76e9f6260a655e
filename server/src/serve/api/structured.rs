//! Structured outputs and tool calls: which grammar a request's fields ask for, how tools are
//! offered to the model, and how a reply's text becomes `tool_calls`.
//!
//! Grammar sources, at most one per request (a 400 otherwise):
//! - OpenAI's `response_format`: `json_object`, or `json_schema` with its `schema`;
//! - vLLM's `structured_outputs`: `json` (a schema, as an object or JSON text), `regex`, `choice`,
//!   `grammar` (Lark), `json_object`; and its older top-level `guided_json`, `guided_regex`,
//!   `guided_choice`, `guided_grammar`;
//! - chat `tools` with `tool_choice` `required` or a named function.
//!
//! JSON is laid out compactly (`", "` and `": "`, no other whitespace) unless the request asks
//! for free whitespace (`structured_outputs.disable_any_whitespace: false`) or gives a
//! `whitespace_pattern`, or the schema carries llguidance's own `x-guidance` options.
//!
//! Tools (vLLM's behaviour, OpenAI's shapes):
//! - `none`, or no tools: plain text; the tools are still shown to the model;
//! - a named function: the output is that function's arguments, constrained to its
//!   `parameters` schema;
//! - `required`: the output is a JSON list `[{"name": ..., "parameters": {...}}]` of one or more
//!   calls (one with `parallel_tool_calls: false`), each constrained to its tool's schema;
//! - `auto` (the default when tools are given): unconstrained; a reply that is a call in the
//!   Hermes / Llama 3 JSON style (`<tool_call>{"name", "arguments"}</tool_call>`, or the whole
//!   reply one `{"name", "parameters"|"arguments"}` object naming a tool) becomes `tool_calls`.
//!
//! A reply made of tool calls ends with `finish_reason: "tool_calls"`, or `length` when
//! `max_tokens` cut it: a named call's arguments are then incomplete (as with vLLM), and a
//! `required` list is the calls written in full (or its first call, arguments incomplete, when
//! none was), never the list's raw text.

use pace_models::constraint::{GrammarSpec, JsonWhitespace};
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::types::{CommonParams, FunctionCall, Tool, ToolCall};

/// A request's grammar, with the parameter it came from (for error messages).
#[derive(Debug, Clone)]
pub struct GrammarRequest {
    pub spec: GrammarSpec,
    pub layout: JsonWhitespace,
    /// The request field the grammar came from (`response_format`, `structured_outputs`,
    /// `guided_json`, `tools`, `tool_choice`).
    pub param: &'static str,
}

/// What the reply of a chat request with tools is.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolMode {
    /// Text (no tools, or `tool_choice` `none`).
    None,
    /// Text that may be a call (parsed after generation).
    Auto { names: Vec<String> },
    /// The arguments of this function (the output text is them).
    Named(String),
    /// A JSON list of `{"name", "parameters"}` calls.
    Required,
}

impl ToolMode {
    /// True if the reply is always tool calls.
    pub fn forced(&self) -> bool {
        matches!(self, Self::Named(_) | Self::Required)
    }
}

/// The grammar the structured-output fields ask for (not tools), or None.
pub fn grammar_of(c: &CommonParams) -> Result<Option<GrammarRequest>, ApiError> {
    let mut found: Vec<GrammarRequest> = Vec::new();
    let mut layout = JsonWhitespace::Compact;
    if let Some(rf) = &c.response_format {
        let spec = match rf.kind.as_str() {
            "text" => {
                if rf.json_schema.is_some() {
                    return Err(ApiError::param("response_format", "json_schema is only allowed with type 'json_schema'"));
                }
                None
            }
            "json_object" => {
                if rf.json_schema.is_some() {
                    return Err(ApiError::param("response_format", "json_schema is only allowed with type 'json_schema'"));
                }
                Some(GrammarSpec::JsonObject)
            }
            "json_schema" => {
                let js = rf
                    .json_schema
                    .as_ref()
                    .ok_or_else(|| ApiError::param("response_format", "response_format of type 'json_schema' needs a 'json_schema' field"))?;
                // OpenAI allows a json_schema without `schema` (any JSON object).
                Some(match &js.schema {
                    None => GrammarSpec::JsonObject,
                    Some(s) => GrammarSpec::JsonSchema(schema_object(s, "response_format")?),
                })
            }
            other => {
                return Err(ApiError::param(
                    "response_format",
                    format!("response_format type '{other}' is not supported (use 'text', 'json_object' or 'json_schema')"),
                ))
            }
        };
        if let Some(spec) = spec {
            found.push(GrammarRequest { spec, layout: layout.clone(), param: "response_format" });
        }
    }
    if let Some(so) = &c.structured_outputs {
        let mut kinds = Vec::new();
        if let Some(j) = &so.json {
            kinds.push(GrammarSpec::JsonSchema(schema_value(j, "structured_outputs")?));
        }
        if let Some(r) = &so.regex {
            kinds.push(GrammarSpec::Regex(r.clone()));
        }
        if let Some(ch) = &so.choice {
            kinds.push(GrammarSpec::Choice(ch.clone()));
        }
        if let Some(g) = &so.grammar {
            kinds.push(GrammarSpec::Lark(g.clone()));
        }
        if so.json_object == Some(true) {
            kinds.push(GrammarSpec::JsonObject);
        }
        if kinds.len() > 1 {
            return Err(ApiError::param(
                "structured_outputs",
                "You can only use one kind of constraints for structured outputs ('json', 'regex', 'choice', 'grammar' or 'json_object').",
            ));
        }
        if so.disable_any_whitespace == Some(false) {
            layout = JsonWhitespace::Flexible;
        }
        if let Some(p) = &so.whitespace_pattern {
            layout = JsonWhitespace::Pattern(p.clone());
        }
        if let Some(spec) = kinds.pop() {
            found.push(GrammarRequest { spec, layout: layout.clone(), param: "structured_outputs" });
        }
    }
    if let Some(p) = &c.guided_whitespace_pattern {
        layout = JsonWhitespace::Pattern(p.clone());
    }
    if let Some(j) = &c.guided_json {
        found.push(GrammarRequest { spec: GrammarSpec::JsonSchema(schema_value(j, "guided_json")?), layout: layout.clone(), param: "guided_json" });
    }
    if let Some(r) = &c.guided_regex {
        found.push(GrammarRequest { spec: GrammarSpec::Regex(r.clone()), layout: layout.clone(), param: "guided_regex" });
    }
    if let Some(ch) = &c.guided_choice {
        found.push(GrammarRequest { spec: GrammarSpec::Choice(ch.clone()), layout: layout.clone(), param: "guided_choice" });
    }
    if let Some(g) = &c.guided_grammar {
        found.push(GrammarRequest { spec: GrammarSpec::Lark(g.clone()), layout: layout.clone(), param: "guided_grammar" });
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|g| g.param).collect();
        return Err(ApiError::param(found[1].param, format!("only one structured output constraint per request; got {}", names.join(", "))));
    }
    Ok(found.pop())
}

/// A schema given as an object or as JSON text.
fn schema_value(v: &Value, param: &str) -> Result<Value, ApiError> {
    match v {
        Value::String(s) => {
            let parsed: Value = serde_json::from_str(s).map_err(|e| ApiError::param(param, format!("the JSON schema is not valid JSON: {e}")))?;
            schema_object(&parsed, param)
        }
        other => schema_object(other, param),
    }
}

fn schema_object(v: &Value, param: &str) -> Result<Value, ApiError> {
    match v {
        Value::Object(_) => Ok(v.clone()),
        Value::Bool(true) => Ok(json!({})),
        _ => Err(ApiError::param(param, "the JSON schema must be an object")),
    }
}

/// The most tools a request may carry (OpenAI's own limit): each one is checked, shown to the
/// model and, for a forced call, compiled into the grammar.
pub const MAX_TOOLS: usize = 128;

/// Tools and `tool_choice` checked (vLLM's messages): the reply's mode and, when the reply is
/// forced to be a call, its grammar.
pub fn tool_plan(tools: Option<&[Tool]>, choice: Option<&Value>, parallel: Option<bool>) -> Result<(ToolMode, Option<GrammarRequest>), ApiError> {
    let tools = match tools {
        None => {
            return match choice {
                None => Ok((ToolMode::None, None)),
                Some(v) if v == "none" => Ok((ToolMode::None, None)),
                Some(_) => Err(ApiError::param("tool_choice", "When using `tool_choice`, `tools` must be set.")),
            }
        }
        Some([]) => return Err(ApiError::param("tools", "`tools` must not be an empty array; leave it out when there are no tools")),
        Some(t) if t.len() > MAX_TOOLS => {
            return Err(ApiError::param("tools", format!("at most {MAX_TOOLS} tools are accepted ({} given)", t.len())));
        }
        Some(t) => t,
    };
    let mut names = std::collections::HashSet::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        if t.kind != "function" {
            return Err(ApiError::param(&format!("tools[{i}].type"), format!("tool type '{}' is not supported (only 'function')", t.kind)));
        }
        let n = &t.function.name;
        if n.is_empty() || n.len() > 64 || !n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.') {
            return Err(ApiError::param(&format!("tools[{i}].function.name"), "a function name is 1 to 64 characters of a-z, A-Z, 0-9, '_', '-' and '.'"));
        }
        if !names.insert(n.as_str()) {
            return Err(ApiError::param(&format!("tools[{i}].function.name"), format!("two tools are named '{n}'")));
        }
        if let Some(p) = &t.function.parameters {
            if !p.is_object() {
                return Err(ApiError::param(&format!("tools[{i}].function.parameters"), "parameters must be a JSON schema object"));
            }
        }
    }
    let params_of = |t: &Tool| t.function.parameters.clone().unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    let mode = match choice {
        None => "auto".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| o.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| ApiError::param("tool_choice", "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}"))?;
            let tool = tools
                .iter()
                .find(|t| t.function.name == name)
                .ok_or_else(|| ApiError::param("tool_choice", "The tool specified in `tool_choice` does not match any of the specified `tools`"))?;
            let spec = GrammarSpec::JsonSchema(params_of(tool));
            return Ok((ToolMode::Named(name.to_string()), Some(GrammarRequest { spec, layout: JsonWhitespace::Compact, param: "tools" })));
        }
        Some(_) => return Err(ApiError::param("tool_choice", "tool_choice must be 'none', 'auto', 'required' or a named function")),
    };
    match mode.as_str() {
        "none" => Ok((ToolMode::None, None)),
        "auto" => Ok((ToolMode::Auto { names: tools.iter().map(|t| t.function.name.clone()).collect() }, None)),
        "required" => {
            let mut defs = Map::new();
            let mut any_of = Vec::new();
            for t in tools {
                let mut p = params_of(t);
                // Definitions move to the top level, where `#/$defs/...` references resolve.
                for key in ["$defs", "definitions"] {
                    if let Some(Value::Object(d)) = p.as_object_mut().and_then(|o| o.remove(key)) {
                        for (k, v) in d {
                            match defs.get(&k) {
                                Some(old) if old != &v => {
                                    return Err(ApiError::param("tools", format!("tools define '{k}' differently; give the definitions distinct names")))
                                }
                                _ => {
                                    defs.insert(k, v);
                                }
                            }
                        }
                    }
                }
                any_of.push(json!({
                    "type": "object",
                    "properties": {"name": {"type": "string", "enum": [t.function.name]}, "parameters": p},
                    "required": ["name", "parameters"],
                    "additionalProperties": false
                }));
            }
            let mut schema = json!({"type": "array", "minItems": 1, "items": {"anyOf": any_of}});
            if parallel == Some(false) {
                schema["maxItems"] = json!(1);
            }
            if !defs.is_empty() {
                schema["$defs"] = Value::Object(defs);
            }
            Ok((ToolMode::Required, Some(GrammarRequest { spec: GrammarSpec::JsonSchema(schema), layout: JsonWhitespace::Compact, param: "tools" })))
        }
        other => Err(ApiError::param("tool_choice", format!("tool_choice '{other}' is not supported (use 'none', 'auto', 'required' or a named function)"))),
    }
}

/// The tools as the chat template's `tools` variable (HF convention: the OpenAI objects).
pub fn template_tools(tools: &[Tool]) -> Value {
    serde_json::to_value(tools).unwrap_or(Value::Null)
}

/// A system-prompt paragraph offering the tools, for templates that do not render `tools`
/// themselves (the model must see the tools to call them well).
pub fn tools_system_text(tools: &[Tool]) -> String {
    let mut s = String::from("You can call functions. Available functions, as JSON schemas:\n");
    for t in tools {
        s.push_str(&serde_json::to_string(&t.function).unwrap_or_default());
        s.push('\n');
    }
    s.push_str("To call a function, reply with only <tool_call>{\"name\": <function name>, \"arguments\": <arguments object>}</tool_call>.");
    s
}

/// A fresh tool-call id, as OpenAI writes them.
pub fn call_id() -> String {
    format!("call_{:024x}", rand::random::<u128>() >> 32)
}

/// The calls of a finished reply, in the mode's format; None if it is not (or not entirely)
/// calls (then it is plain text). `Named` always yields its one call with the text as arguments.
pub fn parse_calls(mode: &ToolMode, text: &str) -> Option<Vec<ToolCall>> {
    let call = |name: &str, args: &Value| ToolCall {
        id: call_id(),
        kind: "function",
        function: FunctionCall { name: name.to_string(), arguments: serde_json::to_string(args).unwrap_or_default() },
    };
    match mode {
        ToolMode::None => None,
        ToolMode::Named(name) => {
            Some(vec![ToolCall { id: call_id(), kind: "function", function: FunctionCall { name: name.clone(), arguments: text.to_string() } }])
        }
        ToolMode::Required => {
            let (items, cut) = list_prefix(text)?;
            let mut calls = items.iter().map(|c| Some(call(c.get("name")?.as_str()?, c.get("parameters")?))).collect::<Option<Vec<_>>>()?;
            if calls.is_empty() {
                // Cut inside the first call: once its name is written it is that call, its
                // arguments incomplete (as a named call cut by max_tokens); before that, no call
                // (and still no text: the reply was to be calls).
                let first = cut?.strip_prefix(r#"{"name": ""#).and_then(|c| c.split_once(r#"", "parameters": "#));
                if let Some((name, args)) = first {
                    calls.push(ToolCall { id: call_id(), kind: "function", function: FunctionCall { name: name.to_string(), arguments: args.to_string() } });
                }
            }
            Some(calls)
        }
        ToolMode::Auto { names } => {
            let known = |v: &Value| -> Option<ToolCall> {
                let name = v.get("name")?.as_str()?;
                if !names.iter().any(|n| n == name) {
                    return None;
                }
                let args = v.get("arguments").or_else(|| v.get("parameters")).cloned().unwrap_or_else(|| json!({}));
                // Some models write the arguments as a JSON string.
                let args = match args {
                    Value::String(s) => serde_json::from_str(&s).ok()?,
                    a => a,
                };
                args.is_object().then(|| call(name, &args))
            };
            let t = text.trim();
            if t.starts_with("<tool_call>") {
                let mut calls = Vec::new();
                let mut rest = t;
                while let Some(start) = rest.strip_prefix("<tool_call>") {
                    let end = start.find("</tool_call>")?;
                    let v: Value = serde_json::from_str(start[..end].trim()).ok()?;
                    calls.push(known(&v)?);
                    rest = start[end + "</tool_call>".len()..].trim_start();
                }
                // Trailing text after the calls is not allowed; an unclosed last call neither.
                (rest.is_empty() && !calls.is_empty()).then_some(calls)
            } else if t.starts_with('{') || t.starts_with('[') {
                let v: Value = serde_json::from_str(t).ok()?;
                match v {
                    Value::Array(items) => items.iter().map(known).collect::<Option<Vec<_>>>().filter(|v| !v.is_empty()),
                    obj => Some(vec![known(&obj)?]),
                }
            } else {
                None
            }
        }
    }
}

/// The complete items of a JSON list that may be cut short (by `max_tokens`): the items, and
/// the text of the cut item if the list did not close. None if `text` is not a list's start or
/// has anything but items after the `[`.
fn list_prefix(text: &str) -> Option<(Vec<Value>, Option<&str>)> {
    let mut rest = text.trim_start().strip_prefix('[')?;
    let mut items = Vec::new();
    loop {
        rest = rest.trim_start();
        if items.is_empty() {
            if let Some(after) = rest.strip_prefix(']') {
                return after.trim().is_empty().then_some((items, None));
            }
        }
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match values.next() {
            Some(Ok(v)) => items.push(v),
            // A value cut short: the text ran out inside it.
            Some(Err(e)) if e.is_eof() => return Some((items, Some(rest))),
            None => return Some((items, None)),
            Some(Err(_)) => return None,
        }
        rest = rest[values.byte_offset()..].trim_start();
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else if let Some(after) = rest.strip_prefix(']') {
            return after.trim().is_empty().then_some((items, None));
        } else {
            return rest.is_empty().then_some((items, None));
        }
    }
}

/// For streaming `auto`: could `prefix` (the reply so far) still become a call? While it could,
/// its text is held back; once not, it streams as content.
pub fn may_be_call(prefix: &str) -> bool {
    let t = prefix.trim_start();
    t.is_empty() || "<tool_call>".starts_with(t) || t.starts_with("<tool_call>") || t.starts_with('{') || t.starts_with('[')
}

/// Streams a `required` reply as it is written: the grammar fixes its layout to
/// `[{"name": "NAME", "parameters": VALUE}, ...]` (compact, properties in schema order), so each
/// call's name is known once its string closes, and the bytes of its parameters can go out as
/// argument fragments while they are generated.
#[derive(Debug, Default)]
pub struct RequiredCalls {
    text: String,
    /// Bytes of `text` already consumed.
    pos: usize,
    state: CallState,
    /// Calls started so far.
    calls: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq)]
enum CallState {
    /// Before `[{"name": "` (the first call) or `, {"name": "` (a later one).
    #[default]
    Head,
    /// Inside the parameters value: bracket depth, inside a string, after a backslash.
    Value { depth: u32, in_str: bool, escaped: bool, started: bool },
    /// After a call's value: `}` then `, ` or `]`.
    Tail,
    /// The list is closed, or the text did not have the expected layout.
    Done,
}

/// Whether text starts with a literal: yes, not yet (a prefix of it so far), or no.
enum Literal {
    Yes,
    NotYet,
    No,
}

fn literal(text: &str, lit: &str) -> Literal {
    if text.starts_with(lit) {
        Literal::Yes
    } else if lit.starts_with(text) {
        Literal::NotYet
    } else {
        Literal::No
    }
}

/// One fragment of a streamed call: a new call (`name` set) or more of its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct CallFragment {
    pub index: usize,
    pub name: Option<String>,
    pub arguments: String,
}

impl RequiredCalls {
    /// Adds generated text; returns the fragments it completes.
    pub fn push(&mut self, more: &str) -> Vec<CallFragment> {
        self.text.push_str(more);
        let mut out: Vec<CallFragment> = Vec::new();
        loop {
            let rest = &self.text[self.pos..];
            match self.state {
                CallState::Done => break,
                CallState::Head => {
                    let open = if self.calls == 0 { "[{\"name\": \"" } else { ", {\"name\": \"" };
                    let close = "\", \"parameters\": ";
                    match literal(rest, open) {
                        Literal::Yes => {}
                        Literal::NotYet => break,
                        Literal::No => {
                            self.state = CallState::Done;
                            break;
                        }
                    }
                    let Some(end) = rest[open.len()..].find('"') else { break };
                    let name = rest[open.len()..open.len() + end].to_string();
                    match literal(&rest[open.len() + end..], close) {
                        Literal::Yes => {}
                        Literal::NotYet => break,
                        Literal::No => {
                            self.state = CallState::Done;
                            break;
                        }
                    }
                    self.pos += open.len() + end + close.len();
                    out.push(CallFragment { index: self.calls, name: Some(name), arguments: String::new() });
                    self.calls += 1;
                    self.state = CallState::Value { depth: 0, in_str: false, escaped: false, started: false };
                }
                CallState::Value { mut depth, mut in_str, mut escaped, mut started } => {
                    let mut end = None;
                    for (i, c) in rest.char_indices() {
                        if in_str {
                            if escaped {
                                escaped = false;
                            } else if c == '\\' {
                                escaped = true;
                            } else if c == '"' {
                                in_str = false;
                                if depth == 0 {
                                    end = Some(i + 1);
                                    break;
                                }
                            }
                            continue;
                        }
                        match c {
                            '"' => in_str = true,
                            '{' | '[' => depth += 1,
                            '}' | ']' if depth > 0 => {
                                depth -= 1;
                                if depth == 0 {
                                    end = Some(i + 1);
                                    break;
                                }
                            }
                            // A scalar value at the top ends at the call's closing brace.
                            '}' if depth == 0 && started => {
                                end = Some(i);
                                break;
                            }
                            _ => {}
                        }
                        started = true;
                    }
                    let upto = end.unwrap_or(rest.len());
                    // A top-level scalar is held until it ends (it may still be extended).
                    let scalar_open = end.is_none() && depth == 0 && !in_str;
                    if upto > 0 && !scalar_open {
                        let frag = rest[..upto].to_string();
                        match out.last_mut() {
                            Some(f) if f.index + 1 == self.calls => f.arguments.push_str(&frag),
                            _ => out.push(CallFragment { index: self.calls - 1, name: None, arguments: frag }),
                        }
                        self.pos += upto;
                    }
                    match end {
                        Some(_) => self.state = CallState::Tail,
                        None => {
                            if !scalar_open {
                                self.state = CallState::Value { depth, in_str, escaped, started };
                            }
                            break;
                        }
                    }
                }
                CallState::Tail => {
                    // `}` then `, ` (next call: its head includes the comma) or `]`.
                    if rest.is_empty() {
                        break;
                    }
                    if !rest.starts_with('}') {
                        self.state = CallState::Done;
                        break;
                    }
                    let after = &rest[1..];
                    if after.is_empty() {
                        break;
                    }
                    self.pos += 1;
                    self.state = if after.starts_with(']') { CallState::Done } else { CallState::Head };
                }
            }
        }
        out
    }

    /// Calls started so far.
    pub fn started(&self) -> usize {
        self.calls
    }

    /// Everything pushed so far.
    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, params: Value) -> Tool {
        serde_json::from_value(json!({"type": "function", "function": {"name": name, "parameters": params}})).unwrap()
    }

    #[test]
    fn auto_replies_are_parsed_into_calls_only_when_whole() {
        let mode = ToolMode::Auto { names: vec!["get_weather".into()] };
        let c = parse_calls(&mode, " <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>").unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].function.name, "get_weather");
        assert_eq!(c[0].function.arguments, r#"{"city":"Paris"}"#);
        assert!(c[0].id.starts_with("call_"));
        // Llama 3 style: the whole reply one object with "parameters".
        let c = parse_calls(&mode, r#"{"name": "get_weather", "parameters": {"city": "Oslo"}}"#).unwrap();
        assert_eq!(c[0].function.arguments, r#"{"city":"Oslo"}"#);
        // Two calls.
        let two = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Rome\\\"}\"}</tool_call>";
        let c = parse_calls(&mode, two).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[1].function.arguments, r#"{"city":"Rome"}"#);
        // Not calls: text, unknown name, trailing text, unclosed.
        for t in [
            "The weather is nice.",
            r#"{"name": "other", "arguments": {}}"#,
            "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call> and more",
            "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}",
            r#"{"answer": 42}"#,
        ] {
            assert!(parse_calls(&mode, t).is_none(), "{t}");
        }
        assert!(may_be_call("  <tool") && may_be_call("{") && may_be_call(""));
        assert!(!may_be_call("Sure") && !may_be_call("<b>"));
    }

    /// `required` output cut by `max_tokens`: the calls written in full are the reply; a first
    /// call cut after its name is that call with incomplete arguments; garbage is not calls.
    #[test]
    fn required_calls_cut_short_keep_the_complete_ones() {
        let w = |city: &str| format!(r#"{{"name": "get_weather", "parameters": {{"city": "{city}", "unit": "celsius"}}}}"#);
        let whole = format!("[{}, {}]", w("Paris"), w("Rome"));
        assert_eq!(parse_calls(&ToolMode::Required, &whole).map(|c| c.len()), Some(2));
        let cut = format!(r#"[{}, {}, {{"name": "get_weather", "parameters": {{"city": "Os"#, w("Paris"), w("Rome"));
        let c = parse_calls(&ToolMode::Required, &cut).unwrap();
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(c[1].function.arguments, r#"{"city":"Rome","unit":"celsius"}"#);
        for (text, n) in [(format!("[{}, ", w("Paris")), 1), (format!("[{}", w("Paris")), 1)] {
            assert_eq!(parse_calls(&ToolMode::Required, &text).map(|c| c.len()), Some(n), "{text}");
        }
        let first = parse_calls(&ToolMode::Required, r#"[{"name": "get_weather", "parameters": {"city": "Pa"#).unwrap();
        assert_eq!((first[0].function.name.as_str(), first[0].function.arguments.as_str()), ("get_weather", r#"{"city": "Pa"#));
        assert_eq!(parse_calls(&ToolMode::Required, r#"[{"name": "get_w"#).map(|c| c.len()), Some(0));
        for bad in ["", "x", "[]", "[1, 2]", r#"[{"name": "a"}]"#, &format!("[{}] and more", w("Paris"))] {
            assert!(parse_calls(&ToolMode::Required, bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn required_calls_stream_as_they_are_written() {
        let full = r#"[{"name": "get_weather", "parameters": {"city": "Pa]{ris\"", "n": [1, {"x": 2}]}}, {"name": "t", "parameters": 7}, {"name": "s", "parameters": "a}b"}]"#;
        // Any split of the text gives the same calls, fragment by fragment.
        for step in [1, 2, 3, 7, 1000] {
            let mut r = RequiredCalls::default();
            let mut calls: Vec<(String, String)> = Vec::new();
            let chars: Vec<char> = full.chars().collect();
            for chunk in chars.chunks(step) {
                for f in r.push(&chunk.iter().collect::<String>()) {
                    if let Some(n) = f.name {
                        assert_eq!(f.index, calls.len());
                        calls.push((n, String::new()));
                    }
                    calls[f.index].1.push_str(&f.arguments);
                }
            }
            assert_eq!(
                calls,
                vec![
                    ("get_weather".to_string(), r#"{"city": "Pa]{ris\"", "n": [1, {"x": 2}]}"#.to_string()),
                    ("t".to_string(), "7".to_string()),
                    ("s".to_string(), r#""a}b""#.to_string())
                ],
                "step {step}"
            );
            assert_eq!(r.started(), 3);
        }
        // Not the layout: nothing is started.
        let mut r = RequiredCalls::default();
        assert!(r.push("{\"oops\": 1}").is_empty());
        assert_eq!(r.started(), 0);
    }

    #[test]
    fn tool_choice_is_checked_like_vllm() {
        let t = vec![
            tool("a", json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/X"}}, "$defs": {"X": {"type": "integer"}}})),
            tool("b", json!({"type": "object"})),
        ];
        let err = |r: Result<(ToolMode, Option<GrammarRequest>), ApiError>| match r {
            Err(ApiError::Invalid { message, param, .. }) => (param.unwrap_or_default(), message),
            other => panic!("{other:?}"),
        };
        assert_eq!(err(tool_plan(None, Some(&json!("required")), None)).1, "When using `tool_choice`, `tools` must be set.");
        assert_eq!(err(tool_plan(Some(&[]), None, None)).0, "tools");
        assert!(err(tool_plan(Some(&t), Some(&json!({"type": "function", "function": {"name": "zz"}})), None)).1.contains("does not match"));
        assert_eq!(err(tool_plan(Some(&t), Some(&json!("sometimes")), None)).0, "tool_choice");
        assert_eq!(tool_plan(Some(&t), None, None).unwrap().0, ToolMode::Auto { names: vec!["a".into(), "b".into()] });
        assert_eq!(tool_plan(Some(&t), Some(&json!("none")), None).unwrap().0, ToolMode::None);
        let (mode, g) = tool_plan(Some(&t), Some(&json!({"type": "function", "function": {"name": "b"}})), None).unwrap();
        assert_eq!(mode, ToolMode::Named("b".into()));
        assert!(matches!(g.unwrap().spec, GrammarSpec::JsonSchema(s) if s == json!({"type": "object"})));
        let (mode, g) = tool_plan(Some(&t), Some(&json!("required")), Some(false)).unwrap();
        assert_eq!(mode, ToolMode::Required);
        let GrammarSpec::JsonSchema(s) = g.unwrap().spec else { panic!() };
        assert_eq!(s["maxItems"], 1);
        assert_eq!(s["$defs"]["X"], json!({"type": "integer"}));
        assert!(s["items"]["anyOf"][0]["properties"]["parameters"].get("$defs").is_none());
        let dup = vec![tool("a", json!({"type": "object"})), tool("a", json!({"type": "object"}))];
        assert!(err(tool_plan(Some(&dup), None, None)).1.contains("two tools"));
        // A count limit, and a duplicate check that does not grow with the square of the count.
        let many: Vec<Tool> = (0..=MAX_TOOLS).map(|i| tool(&format!("f{i}"), json!({"type": "object"}))).collect();
        assert_eq!(err(tool_plan(Some(&many), None, None)), ("tools".to_string(), format!("at most {MAX_TOOLS} tools are accepted (129 given)")));
        assert!(tool_plan(Some(&many[..MAX_TOOLS]), None, None).is_ok());
    }
}
