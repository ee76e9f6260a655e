//! Constrained decoding (structured outputs): a grammar decides, before each sampled token,
//! which token ids may come next, and the sampler masks the rest.
//!
//! The grammar engine is [llguidance](https://github.com/guidance-ai/llguidance) (as in vLLM,
//! SGLang and llama.cpp). [`Grammars`] is built once per model: a token trie over the exact
//! bytes each id contributes to the output ([`Tokenizer::grammar_words`]) and llguidance's
//! parser factory. [`Grammars::compile`] turns a request's [`GrammarSpec`] (a JSON schema,
//! `json_object`, a regex, a choice of strings or a Lark grammar) into a [`Constraint`]; a
//! grammar llguidance rejects is an error with its message, for the request's 400.
//!
//! A [`Constraint`] follows one output: [`Constraint::compute_mask`] gives the allowed ids for
//! the next token (end-of-generation ids only once the grammar accepts; only them once nothing
//! can follow), [`Constraint::commit`] advances it by the sampled token. Work per mask is bounded
//! by llguidance's parser limits (lexer fuel, Earley items, lexer states), set in
//! [`Grammars::new`]; a grammar that exceeds them, or any internal error, stops the constraint
//! and its masks allow only end-of-generation, so the request ends instead of running free.
//! A grammar that never finishes is bounded by `max_tokens` like any other request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// What a request constrains its output to.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// A JSON value valid against this JSON schema (draft 2020-12 keywords llguidance supports;
    /// `$ref` only within the document).
    JsonSchema(Value),
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// Text matching this regular expression in full.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A Lark grammar (llguidance's dialect; JSON schemas embed as `%json {...}`).
    Lark(String),
}

impl GrammarSpec {
    /// A short name for logs and metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::JsonSchema(_) => "json_schema",
            Self::JsonObject => "json_object",
            Self::Regex(_) => "regex",
            Self::Choice(_) => "choice",
            Self::Lark(_) => "grammar",
        }
    }
}

/// How JSON is laid out when the schema does not say (its own top-level `x-guidance` key wins).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum JsonWhitespace {
    /// `", "` between items and `": "` after keys, no other whitespace (pace's default: small
    /// models given free whitespace can emit newlines until `max_tokens`).
    #[default]
    Compact,
    /// Any JSON whitespace between tokens (vLLM's default).
    Flexible,
    /// Whitespace matching this regex between tokens (vLLM's `whitespace_pattern`).
    Pattern(String),
}

/// Process-wide counters of mask work, for metrics.
#[derive(Debug, Default)]
pub struct MaskStats {
    /// Masks computed.
    pub masks: AtomicU64,
    /// Nanoseconds spent computing them.
    pub nanos: AtomicU64,
    /// Constraints that stopped on an error (limits exceeded, internal error).
    pub errors: AtomicU64,
}

/// Every model's grammar machinery: the token trie and llguidance's parser factory. Build once
/// at load ([`Grammars::new`]) and share.
pub struct Grammars {
    factory: ParserFactory,
    vocab: usize,
    eos: Arc<SimpleVob>,
    stats: Arc<MaskStats>,
    bounds: JsonBounds,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").field("vocab", &self.vocab).finish_non_exhaustive()
    }
}

impl Grammars {
    /// Builds the token trie of `tokenizer` padded to `model_vocab` ids (the logits' length;
    /// ids past the tokenizer are never allowed) and the parser factory. Takes tens of
    /// milliseconds for a 50k vocabulary.
    pub fn new(tokenizer: &Tokenizer, model_vocab: usize) -> Result<Self> {
        let mut words = tokenizer.grammar_words();
        if words.len() < model_vocab {
            words.resize(model_vocab, Vec::new());
        }
        let vocab = words.len();
        let eog = tokenizer.eos_token_ids().to_vec();
        let eos =
            tokenizer.eos_token_id().or(eog.first().copied()).ok_or_else(|| Error::Unsupported("structured outputs need an end-of-generation token".into()))?;
        let info = TokRxInfo { tok_bos: tokenizer.bos_token_id(), ..TokRxInfo::new(vocab as u32, eos) };
        let mut ends = vec![eos];
        ends.extend(eog.iter().copied().filter(|&t| t != eos && (t as usize) < vocab));
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&ends);
        let eos_set = Arc::new(trie.eos_token_set());
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| Error::Invalid(format!("building the grammar engine: {e}")))?;
        factory.quiet();
        // Bounds on one request's work. Per mask: llguidance's defaults (about 15 ms of lexer
        // and parser work at most). Lexer states hold about 1-2 kB each: 50k of them (not the
        // default 250k) keep one hostile grammar under ~100 MB.
        *factory.limits_mut() = ParserLimits { max_lexer_states: 50_000, ..ParserLimits::default() };
        Ok(Self { factory, vocab, eos: eos_set, stats: Arc::new(MaskStats::default()), bounds: JsonBounds::default() })
    }

    /// The bounds JSON schemas get where they set none ([`JsonBounds`]).
    pub fn with_json_bounds(mut self, bounds: JsonBounds) -> Self {
        self.bounds = bounds;
        self
    }

    /// Ids in a mask (the model's vocabulary).
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// Counters of the masks computed by every constraint compiled here.
    pub fn stats(&self) -> &Arc<MaskStats> {
        &self.stats
    }

    /// Compiles a request's grammar. An invalid schema, regex or grammar, or one past the size
    /// limits ([`MAX_GRAMMAR_RULES`], [`MAX_SCHEMA_NODES`]), is an error carrying llguidance's
    /// message or the limit (for a 400).
    ///
    /// llguidance compiles recursively: a chain of N rules (`r0: "a" r1`, `r1: "a" r2`, ...) or
    /// of N `$ref`s takes 3-8 KiB of stack per link, so a few hundred links in a 4 MiB body
    /// overflow a 2 MiB thread stack and abort the process. Compilation therefore runs on its own
    /// thread with a [`COMPILE_STACK`] stack (reserved, touched only as deep as it goes), and
    /// chains are bounded by the limits (measured: 20,000 Lark rules take about 60 MiB; a schema's
    /// `$ref` chains meet llguidance's "schema too large" before 100 MiB).
    pub fn compile(&self, spec: &GrammarSpec, ws: &JsonWhitespace) -> std::result::Result<Constraint, String> {
        check_size(spec)?;
        std::thread::scope(|s| {
            let compiler = std::thread::Builder::new().name("pace-grammar".into()).stack_size(COMPILE_STACK);
            let job = compiler.spawn_scoped(s, || self.compile_here(spec, ws)).map_err(|e| format!("could not start the grammar compiler: {e}"))?;
            job.join().unwrap_or_else(|_| Err("the grammar compiler failed".into()))
        })
    }

    fn compile_here(&self, spec: &GrammarSpec, ws: &JsonWhitespace) -> std::result::Result<Constraint, String> {
        let grammar = match spec {
            GrammarSpec::JsonSchema(schema) => {
                if !schema.is_object() {
                    return Err("the JSON schema must be an object".into());
                }
                TopLevelGrammar::from_json_schema(with_layout(self.bounds.apply(schema.clone()), ws))
            }
            GrammarSpec::JsonObject => TopLevelGrammar::from_json_schema(with_layout(self.bounds.apply(bounded_object()), ws)),
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
            GrammarSpec::Choice(options) => {
                if options.is_empty() {
                    return Err("the choice list is empty".into());
                }
                let alternatives: Vec<String> = options.iter().map(|o| regex_syntax::escape(o)).collect();
                TopLevelGrammar::from_regex(&format!("({})", alternatives.join("|")))
            }
            GrammarSpec::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        };
        let parser = self.factory.create_parser(grammar).map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        Ok(Constraint { matcher, mask: None, stats: self.stats.clone(), eos: self.eos.clone(), error_counted: false })
    }
}

/// Stack of the thread a grammar compiles on (see [`Grammars::compile`]).
pub const COMPILE_STACK: usize = 256 << 20;

/// Most rule and terminal definitions in a Lark grammar (counted as its `:` characters, which
/// every definition has).
pub const MAX_GRAMMAR_RULES: usize = 20_000;

/// Most JSON values (objects, arrays, strings, numbers, ...) in a JSON schema.
pub const MAX_SCHEMA_NODES: usize = 100_000;

/// The size limits, checked before llguidance sees the grammar.
fn check_size(spec: &GrammarSpec) -> std::result::Result<(), String> {
    match spec {
        GrammarSpec::Lark(lark) => {
            let defs = lark.bytes().filter(|&b| b == b':').count();
            if defs > MAX_GRAMMAR_RULES {
                return Err(format!("the grammar has more than {MAX_GRAMMAR_RULES} rule definitions (':' counted: {defs})"));
            }
        }
        GrammarSpec::JsonSchema(schema) => {
            let (mut nodes, mut stack) = (0usize, vec![schema]);
            while let Some(v) = stack.pop() {
                nodes += 1;
                if nodes > MAX_SCHEMA_NODES {
                    return Err(format!("the JSON schema has more than {MAX_SCHEMA_NODES} values"));
                }
                match v {
                    Value::Array(a) => stack.extend(a),
                    Value::Object(o) => stack.extend(o.values()),
                    _ => {}
                }
            }
        }
        GrammarSpec::JsonObject | GrammarSpec::Regex(_) | GrammarSpec::Choice(_) => {}
    }
    Ok(())
}

/// Bounds a JSON schema gets where it sets none, so that a model looping inside a value (a small
/// model writes `8111222323123448888...` for an integer) has to close it and reach a valid end
/// instead of running into `max_tokens`:
/// - an `integer` without a bound on a side is kept within [`INT_BOUND`] on that side (at most 19
///   digits and a sign, inside the signed 64-bit range);
/// - a `string` without `maxLength` (and without `pattern`, `format`, `enum` or `const`, which
///   bound it their own way) gets `maxLength` = `max_length`;
/// - an `array` without `maxItems` gets `maxItems` = `max_items`, and an object open to more
///   properties than it names gets `maxProperties` = `max_items` (or its named count);
/// - `json_object` is an object whose values are any JSON bounded the same way.
///
/// A schema's own bounds always win, so a request that needs longer values says so in its
/// schema. Not bounded: a number's digits (a JSON schema cannot limit a fraction's) and the
/// names of properties a schema does not name (llguidance has no `propertyNames`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonBounds {
    /// `maxLength` of a string that sets none (characters).
    pub max_length: u64,
    /// `maxItems` of an array that sets none.
    pub max_items: u64,
}

impl Default for JsonBounds {
    fn default() -> Self {
        Self { max_length: 4096, max_items: 1024 }
    }
}

/// The magnitude an integer without a bound is kept within (10^18: 19 digits).
pub const INT_BOUND: f64 = 1e18;

/// The `$defs` entry [`bounded_object`] adds for "any JSON value".
const ANY_DEF: &str = "__pace_any_json";

/// `json_object` as a schema: an object whose values are any JSON (null, booleans, numbers,
/// integers, strings, arrays and objects of the same), so that [`JsonBounds::apply`] reaches
/// every value.
fn bounded_object() -> Value {
    let any = serde_json::json!({"$ref": format!("#/$defs/{ANY_DEF}")});
    serde_json::json!({
        "type": "object",
        "additionalProperties": any,
        "$defs": {ANY_DEF: {"anyOf": [
            {"type": "null"}, {"type": "boolean"}, {"type": "integer"}, {"type": "number"}, {"type": "string"},
            {"type": "array", "items": any}, {"type": "object", "additionalProperties": any},
        ]}},
    })
}

impl JsonBounds {
    /// `schema` with these bounds added wherever it sets none (every subschema: properties,
    /// items, combinators, definitions).
    pub fn apply(&self, mut schema: Value) -> Value {
        self.bound(&mut schema);
        schema
    }

    fn bound(&self, schema: &mut Value) {
        let Some(o) = schema.as_object_mut() else { return };
        let types: Vec<String> = match o.get("type") {
            Some(Value::String(t)) => vec![t.clone()],
            Some(Value::Array(a)) => a.iter().filter_map(|t| t.as_str().map(str::to_string)).collect(),
            _ => Vec::new(),
        };
        let has = |o: &serde_json::Map<String, Value>, keys: &[&str]| keys.iter().any(|k| o.contains_key(*k));
        let unconstrained = !has(o, &["enum", "const"]);
        if types.iter().any(|t| t == "integer") && unconstrained {
            // A side is bounded only where the other side's own bound leaves room.
            let side = |o: &serde_json::Map<String, Value>, keys: [&str; 2]| keys.iter().find_map(|k| o.get(*k).and_then(Value::as_f64));
            let (lo, hi) = (side(o, ["minimum", "exclusiveMinimum"]), side(o, ["maximum", "exclusiveMaximum"]));
            if lo.is_none() && hi.is_none_or(|h| h > -INT_BOUND) {
                o.insert("minimum".into(), Value::from(-INT_BOUND));
            }
            if hi.is_none() && lo.is_none_or(|l| l < INT_BOUND) {
                o.insert("maximum".into(), Value::from(INT_BOUND));
            }
        }
        if types.iter().any(|t| t == "string") && unconstrained && !has(o, &["maxLength", "pattern", "format"]) {
            let min = o.get("minLength").and_then(Value::as_u64).unwrap_or(0);
            o.insert("maxLength".into(), Value::from(self.max_length.max(min)));
        }
        if types.iter().any(|t| t == "array") && unconstrained && !o.contains_key("maxItems") {
            let min = o.get("minItems").and_then(Value::as_u64).unwrap_or(0);
            o.insert("maxItems".into(), Value::from(self.max_items.max(min)));
        }
        let closed = matches!(o.get("additionalProperties"), Some(Value::Bool(false))) && !o.contains_key("patternProperties");
        if types.iter().any(|t| t == "object") && unconstrained && !closed && !o.contains_key("maxProperties") {
            let named = o.get("properties").and_then(Value::as_object).map_or(0, |p| p.len() as u64);
            let min = o.get("minProperties").and_then(Value::as_u64).unwrap_or(0);
            o.insert("maxProperties".into(), Value::from(self.max_items.max(min).max(named)));
        }
        for (key, sub) in o.iter_mut() {
            match key.as_str() {
                // A schema, or a list of schemas (`items` is either).
                "additionalProperties"
                | "items"
                | "additionalItems"
                | "prefixItems"
                | "anyOf"
                | "oneOf"
                | "allOf"
                | "not"
                | "if"
                | "then"
                | "else"
                | "contains" => match sub {
                    Value::Array(a) => a.iter_mut().for_each(|s| self.bound(s)),
                    s => self.bound(s),
                },
                // A map of names to schemas.
                "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
                    if let Value::Object(m) = sub {
                        m.values_mut().for_each(|s| self.bound(s));
                    }
                }
                _ => {}
            }
        }
    }
}

/// Adds the layout options unless the schema sets its own.
fn with_layout(mut schema: Value, ws: &JsonWhitespace) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        if !obj.contains_key("x-guidance") {
            let opts = match ws {
                JsonWhitespace::Compact => serde_json::json!({
                    "whitespace_flexible": false,
                    "item_separator": ", ",
                    "key_separator": ": ",
                }),
                JsonWhitespace::Flexible => serde_json::json!({"whitespace_flexible": true}),
                JsonWhitespace::Pattern(p) => serde_json::json!({"whitespace_pattern": p}),
            };
            obj.insert("x-guidance".into(), opts);
        }
    }
    schema
}

/// One output's grammar state. Cloning deep-copies it (each of `n` choices gets its own).
pub struct Constraint {
    matcher: Matcher,
    /// The mask for the next token, computed ahead ([`Constraint::compute_mask`]).
    mask: Option<SimpleVob>,
    stats: Arc<MaskStats>,
    /// The end-of-generation ids as a mask (what an errored constraint allows).
    eos: Arc<SimpleVob>,
    error_counted: bool,
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
            mask: self.mask.clone(),
            stats: self.stats.clone(),
            eos: self.eos.clone(),
            error_counted: self.error_counted,
        }
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("stopped", &self.matcher.is_stopped()).field("error", &self.matcher.get_error()).finish_non_exhaustive()
    }
}

impl Constraint {
    /// Computes the mask for the next token if it is not computed yet (the runner calls this
    /// while the forward pass runs). On a grammar error the mask allows only end-of-generation.
    pub fn compute_mask(&mut self) {
        if self.mask.is_some() {
            return;
        }
        let t = Instant::now();
        let mask = match self.matcher.compute_mask_or_eos() {
            Ok(m) => m,
            Err(e) => {
                self.note_error(&e.to_string());
                self.eos_only()
            }
        };
        self.stats.masks.fetch_add(1, Ordering::Relaxed);
        self.stats.nanos.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.mask = Some(mask);
    }

    fn eos_only(&self) -> SimpleVob {
        (*self.eos).clone()
    }

    fn note_error(&mut self, message: &str) {
        if !self.error_counted {
            self.error_counted = true;
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %message, "structured output grammar stopped on an error; ending the output");
        }
    }

    /// Sets every disallowed logit to -inf (ids past the mask too), computing the mask first if
    /// needed.
    pub fn apply(&mut self, logits: &mut [f32]) {
        self.compute_mask();
        let mask = self.mask.as_ref().expect("computed above");
        let words = mask.as_slice();
        let n = mask.len().min(logits.len());
        for (w, chunk) in logits[..n].chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX && chunk.len() == 32 {
                continue;
            }
            if bits == 0 {
                chunk.fill(f32::NEG_INFINITY);
                continue;
            }
            for (j, l) in chunk.iter_mut().enumerate() {
                if bits & (1 << j) == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        logits[n..].fill(f32::NEG_INFINITY);
    }

    /// True if the (computed) mask allows `token`.
    pub fn allows(&mut self, token: u32) -> bool {
        self.compute_mask();
        self.mask.as_ref().is_some_and(|m| (token as usize) < m.len() && m.is_allowed(token))
    }

    /// Advances the grammar by the sampled token and forgets the mask.
    pub fn commit(&mut self, token: u32) {
        self.mask = None;
        if self.matcher.is_stopped() {
            return;
        }
        if let Err(e) = self.matcher.consume_token(token) {
            self.note_error(&e.to_string());
        }
    }

    /// True once nothing but end-of-generation can follow (the grammar is complete, or it
    /// stopped on an error).
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// True if the constraint stopped on an error.
    pub fn is_error(&self) -> bool {
        self.matcher.is_error()
    }
}

/// Checked at compile time: constraints move between threads with their sampler.
#[allow(dead_code)]
fn assert_send() {
    fn is_send<T: Send>() {}
    is_send::<Constraint>();
    fn is_sync<T: Send + Sync>() {}
    is_sync::<Grammars>();
}
