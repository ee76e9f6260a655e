//! Request validation, the first stage of the request path: an OpenAI body becomes a
//! [`ValidRequest`] once (prompts tokenized and templated, generation parameters, the shape of
//! the response), with every bad value reported as a 400 naming its parameter, before any
//! expensive work or any response byte. Handlers then only run what this returns.

use pace_models::chat::ChatMessage;
use pace_models::constraint::Constraint;
use pace_models::sampler::SamplingParams;
use pace_scheduler::slo::SloClass;

use super::error::{context_length_exceeded, ApiError};
use super::structured::{self, GrammarRequest, ToolMode};
use super::types::{ChatRequest, CommonParams, CompletionRequest, Content, MessageIn, PromptInput};
use crate::serve::state::{Loaded, ServeConfig};

/// Validated generation parameters of one HTTP request.
#[derive(Debug, Clone)]
pub struct GenParams {
    /// Choices per prompt.
    pub n: usize,
    /// Sampler parameters (the seed is varied per choice).
    pub sampling: SamplingParams,
    /// Requested `max_tokens`, if any (else: the room left in the context, at most
    /// `default_max_tokens`).
    pub max_tokens: Option<usize>,
    /// The most a choice generates when the request sends no `max_tokens`: the request's share
    /// of `--max-request-output-tokens`.
    pub default_max_tokens: usize,
    /// Stop tokens are ignored before this many outputs.
    pub min_tokens: usize,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Keep the matched stop string in the output.
    pub include_stop_str: bool,
    /// Extra stop token ids (always active).
    pub stop_token_ids: Vec<u32>,
    /// Do not stop at the model's end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Leave special tokens out of the text.
    pub skip_special_tokens: bool,
    /// Stream with SSE.
    pub stream: bool,
    /// Send a usage chunk last when streaming.
    pub include_usage: bool,
    /// Reading class for the smooth-goodput metrics and scheduler.
    pub class: SloClass,
    /// Prefix-cache salt (`cache_salt`, hashed): shares cached prefixes only within a salt.
    pub cache_salt: Option<u64>,
    /// The compiled grammar every choice's output follows (structured outputs, forced tool
    /// calls); each choice samples under its own copy.
    pub constraint: Option<Constraint>,
}

/// One prompt, tokenized.
#[derive(Debug, Clone)]
pub struct Prompt {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// Text, for echo.
    pub text: String,
}

/// Which endpoint's shapes the response is written in.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// `/v1/completions`; `echo` holds each prompt's text when echo was asked for.
    Completion { echo: Option<Vec<String>>, n: usize, logprobs: bool },
    /// `/v1/chat/completions`; `tools` says whether the reply is (or may be) tool calls.
    Chat { logprobs: bool, tools: ToolMode },
}

/// A completion request, validated: what to generate from, how, and the response's shape.
#[derive(Debug, Clone)]
pub struct ValidRequest {
    /// The prompts (chat: the one rendered conversation).
    pub prompts: Vec<Prompt>,
    /// Generation parameters.
    pub params: GenParams,
    /// The response's shape.
    pub endpoint: Endpoint,
}

impl ValidRequest {
    /// Validates a `/v1/completions` body.
    pub fn completion(req: &CompletionRequest, cfg: &ServeConfig, l: &Loaded) -> Result<Self, ApiError> {
        let common = req.common();
        let logprobs = match req.logprobs {
            None => None,
            Some(v) if v >= 0 => Some(v as usize),
            Some(v) => return Err(ApiError::param("logprobs", format!("logprobs must be >= 0, got {v}"))),
        };
        let params = gen_params(&common, cfg, l.tokenizer.vocab_size(), (common.max_tokens, "max_tokens"), logprobs)?;
        if req.best_of.is_some_and(|b| b != params.n as i64 && b != 1) {
            return Err(ApiError::param("best_of", "best_of other than n is not supported"));
        }
        if req.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::param("suffix", "suffix is not supported"));
        }
        let echo = req.echo.unwrap_or(false);
        if echo && logprobs.is_some() {
            return Err(ApiError::param("echo", "echo together with logprobs is not supported"));
        }
        let prompts = completion_prompts(&req.prompt, l, req.add_special_tokens.unwrap_or(true), cfg.max_prompts)?;
        check_lengths(&prompts, &params, l.max_model_len, "prompt")?;
        let mut params = bound_output(params, prompts.len(), cfg, "max_tokens")?;
        params.constraint = compile_grammar(structured::grammar_of(&common)?, &params, l)?;
        let endpoint = Endpoint::Completion { echo: echo.then(|| prompts.iter().map(|p| p.text.clone()).collect()), n: params.n, logprobs: logprobs.is_some() };
        Ok(Self { prompts, params, endpoint })
    }

    /// Validates a `/v1/chat/completions` body.
    pub fn chat(req: &ChatRequest, cfg: &ServeConfig, l: &Loaded) -> Result<Self, ApiError> {
        let common = req.common();
        let (tool_mode, tool_grammar) = structured::tool_plan(req.tools.as_deref(), req.tool_choice.as_ref(), req.parallel_tool_calls)?;
        let grammar = match (structured::grammar_of(&common)?, tool_grammar) {
            (Some(g), Some(_)) => return Err(ApiError::param(g.param, format!("{} cannot be combined with a tool_choice that forces a tool call", g.param))),
            (g, t) => g.or(t),
        };
        let want_logprobs = req.logprobs.unwrap_or(false);
        let top = match req.top_logprobs {
            None => 0,
            Some(v) if v >= 0 => v as usize,
            Some(v) => return Err(ApiError::param("top_logprobs", format!("top_logprobs must be >= 0, got {v}"))),
        };
        if top > 0 && !want_logprobs {
            return Err(ApiError::param("top_logprobs", "top_logprobs requires logprobs to be true"));
        }
        let (max_tokens, name) = match req.max_completion_tokens {
            Some(v) => (Some(v), "max_completion_tokens"),
            None => (common.max_tokens, "max_tokens"),
        };
        let params = gen_params(&common, cfg, l.tokenizer.vocab_size(), (max_tokens, name), want_logprobs.then_some(top))?;
        let mut params = bound_output(params, 1, cfg, name)?;
        params.constraint = compile_grammar(grammar, &params, l)?;
        if req.spaces_between_special_tokens == Some(true) && common.skip_special_tokens == Some(false) {
            return Err(ApiError::param(
                "spaces_between_special_tokens",
                "spaces_between_special_tokens with skip_special_tokens false is not supported: special tokens are written without spaces",
            ));
        }
        let opts = ChatOptions {
            add_generation_prompt: req.add_generation_prompt,
            continue_final_message: req.continue_final_message.unwrap_or(false),
            template_kwargs: req.chat_template_kwargs.as_ref(),
        };
        let tools = req.tools.as_deref().unwrap_or_default();
        let prompts = vec![chat_prompt_with(l, &req.messages, opts, tools)?];
        check_lengths(&prompts, &params, l.max_model_len, "messages")?;
        Ok(Self { prompts, params, endpoint: Endpoint::Chat { logprobs: want_logprobs, tools: tool_mode } })
    }
}

/// Compiles the request's grammar (a 400 naming its parameter when llguidance rejects it).
/// A constrained output ends where its grammar does: `ignore_eos` does not extend it (the
/// request ends once the grammar is complete or its end-of-sequence token is taken, so
/// benchmarks that always send `ignore_eos` still work), and `min_tokens`, which would forbid
/// the only token a complete grammar allows, is refused.
fn compile_grammar(g: Option<GrammarRequest>, p: &GenParams, l: &Loaded) -> Result<Option<Constraint>, ApiError> {
    let Some(g) = g else { return Ok(None) };
    if p.min_tokens > 0 {
        return Err(ApiError::param("min_tokens", format!("min_tokens cannot be combined with {}: the output ends where its grammar does", g.param)));
    }
    let grammars =
        l.grammars.as_ref().ok_or_else(|| ApiError::param(g.param, "structured outputs are not available for this model (no end-of-generation token)"))?;
    let t = std::time::Instant::now();
    let c = grammars.compile(&g.spec, &g.layout).map_err(|e| ApiError::param(g.param, format!("Grammar error: {e}")))?;
    crate::serve::metrics::record_grammar_compile(g.spec.kind(), t.elapsed().as_secs_f64());
    Ok(Some(c))
}

/// Most `stop_token_ids` a request may send (each generated token is checked against them).
pub const MAX_STOP_TOKEN_IDS: usize = 64;

/// Token ids from a request, each inside the vocabulary (400 naming `param` otherwise).
pub fn token_ids(ids: &[i64], vocab: usize, param: &str) -> Result<Vec<u32>, ApiError> {
    ids.iter()
        .map(|&t| {
            if t >= 0 && (t as usize) < vocab {
                Ok(t as u32)
            } else {
                Err(ApiError::param(param, format!("token id {t} is outside the vocabulary (size {vocab})")))
            }
        })
        .collect()
}

/// Bounds the output tokens of a request with `num_prompts` prompts: an explicit `max_tokens`
/// over `--max-request-output-tokens` (times the choices) is a 400; without one, each choice's
/// default is its share of that limit.
fn bound_output(mut p: GenParams, num_prompts: usize, cfg: &ServeConfig, param: &str) -> Result<GenParams, ApiError> {
    let choices = num_prompts.max(1) * p.n;
    let cap = cfg.max_request_output_tokens;
    if let Some(mt) = p.max_tokens {
        if mt.saturating_mul(choices) > cap {
            let what = if choices > 1 { format!("{choices} choices x {param} {mt}") } else { format!("{param} {mt}") };
            return Err(ApiError::param(param, format!("{what} asks for more output tokens than this server allows per request ({cap})")));
        }
    }
    p.default_max_tokens = (cap / choices).max(1).min(cfg.sampling.max_tokens.unwrap_or(usize::MAX));
    Ok(p)
}

fn completion_prompts(input: &PromptInput, l: &Loaded, add_special: bool, max_prompts: usize) -> Result<Vec<Prompt>, ApiError> {
    // Count before any tokenization: a long list of tiny prompts costs nothing to refuse.
    let count = match input {
        PromptInput::Text(_) | PromptInput::Tokens(_) => 1,
        PromptInput::Texts(ts) => ts.len(),
        PromptInput::TokenLists(ls) => ls.len(),
    };
    if count == 0 {
        return Err(ApiError::param("prompt", "the prompt list is empty"));
    }
    if count > max_prompts {
        return Err(ApiError::param("prompt", format!("at most {max_prompts} prompts per request, got {count}")));
    }
    let vocab = l.tokenizer.vocab_size();
    let from_ids = |ids: &[i64]| -> Result<Prompt, ApiError> {
        let tokens = token_ids(ids, vocab, "prompt")?;
        let text = l.tokenizer.decode(&tokens, false).unwrap_or_default();
        Ok(Prompt { tokens, text })
    };
    let from_text = |text: &str| -> Result<Prompt, ApiError> {
        let tokens = l.tokenizer.encode(text, add_special).map_err(|e| ApiError::param("prompt", e.to_string()))?;
        Ok(Prompt { tokens, text: text.to_string() })
    };
    let prompts: Vec<Prompt> = match input {
        PromptInput::Text(t) => vec![from_text(t)?],
        PromptInput::Tokens(ids) => vec![from_ids(ids)?],
        PromptInput::Texts(ts) => ts.iter().map(|t| from_text(t)).collect::<Result<_, _>>()?,
        PromptInput::TokenLists(ls) => ls.iter().map(|ids| from_ids(ids)).collect::<Result<_, _>>()?,
    };
    Ok(prompts)
}

/// Flattens OpenAI messages into the template's messages (text content only).
fn chat_messages(messages: &[MessageIn]) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::param("messages", "messages must not be empty"));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                "system" | "user" | "assistant" => m.role.clone(),
                "developer" => "system".to_string(),
                // A tool's result goes back to the model as a user turn in the Hermes form.
                "tool" => "user".to_string(),
                other => {
                    return Err(ApiError::param(
                        &format!("messages[{i}].role"),
                        format!("unsupported role '{other}' (use system, developer, user, assistant or tool)"),
                    ))
                }
            };
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut s = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => s.push_str(t),
                            _ => return Err(ApiError::param(&format!("messages[{i}].content[{j}]"), "only text content parts are supported")),
                        }
                    }
                    s
                }
            };
            let content = if m.role == "tool" { format!("<tool_response>\n{content}\n</tool_response>") } else { content };
            // Earlier tool calls of the assistant, written as it would have written them.
            let mut content = content;
            for (j, call) in m.tool_calls.iter().flatten().enumerate() {
                let f = call
                    .get("function")
                    .filter(|f| f.get("name").and_then(serde_json::Value::as_str).is_some())
                    .ok_or_else(|| ApiError::param(&format!("messages[{i}].tool_calls[{j}]"), "a tool call needs function.name"))?;
                let args = match f.get("arguments") {
                    Some(serde_json::Value::String(a)) => serde_json::from_str(a).unwrap_or(serde_json::Value::String(a.clone())),
                    Some(v) => v.clone(),
                    None => serde_json::json!({}),
                };
                let call = serde_json::json!({"name": f["name"], "arguments": args});
                if !content.is_empty() {
                    content.push('\n');
                }
                content.push_str(&format!("<tool_call>\n{call}\n</tool_call>"));
            }
            Ok(ChatMessage::new(role, content))
        })
        .collect()
}

/// How a conversation is rendered: vLLM's chat options.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChatOptions<'a> {
    /// `add_generation_prompt` as sent (`None`: true, unless the final message is continued).
    pub add_generation_prompt: Option<bool>,
    /// `continue_final_message`.
    pub continue_final_message: bool,
    /// `chat_template_kwargs`.
    pub template_kwargs: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// The conversation rendered with the model's chat template and tokenized (also what
/// `/tokenize` counts for `messages`).
pub fn chat_prompt(l: &Loaded, messages: &[MessageIn], add_generation_prompt: bool) -> Result<Prompt, ApiError> {
    chat_prompt_with(l, messages, ChatOptions { add_generation_prompt: Some(add_generation_prompt), ..ChatOptions::default() }, &[])
}

/// [`chat_prompt`] with vLLM's options. `continue_final_message`: the final message must be the
/// assistant's; the rendering is cut right after its text, so the reply continues it.
///
/// `tools` go to the template as its `tools` variable; a template that does not use one gets
/// them as a system message (merged into the first system message if there is one).
pub fn chat_prompt_with(l: &Loaded, messages: &[MessageIn], opts: ChatOptions, tools: &[super::types::Tool]) -> Result<Prompt, ApiError> {
    // Every message renders into at least one token, so a conversation with more messages than
    // the context has tokens cannot fit: refused before the template renders it (100,000 short
    // messages, under the body limit, took most of a second of a core to render and tokenize).
    if messages.len() > l.max_model_len {
        return Err(ApiError::Invalid {
            message: format!(
                "This model's maximum context length is {} tokens. However, the messages are {} (each takes at least one token). Please reduce the length of the messages.",
                l.max_model_len,
                messages.len()
            ),
            param: Some("messages".into()),
            code: Some("context_length_exceeded"),
        });
    }
    let mut msgs = chat_messages(messages)?;
    let mut tool_kwargs = None;
    if !tools.is_empty() {
        if l.template.uses_tools() {
            let mut kw = opts.template_kwargs.cloned().unwrap_or_default();
            kw.insert("tools".into(), structured::template_tools(tools));
            tool_kwargs = Some(kw);
        } else {
            let text = structured::tools_system_text(tools);
            match msgs.first_mut() {
                Some(m) if m.role == "system" => m.content = format!("{}\n\n{text}", m.content),
                _ => msgs.insert(0, ChatMessage::new("system", text)),
            }
        }
    }
    if opts.continue_final_message && opts.add_generation_prompt == Some(true) {
        return Err(ApiError::param("continue_final_message", "continue_final_message and add_generation_prompt cannot both be true"));
    }
    let add = opts.add_generation_prompt.unwrap_or(!opts.continue_final_message);
    let empty = serde_json::Map::new();
    let kwargs = tool_kwargs.as_ref().or(opts.template_kwargs).unwrap_or(&empty);
    let mut text = l.template.render_with(&msgs, add, kwargs).map_err(|e| ApiError::param("messages", e.to_string()))?;
    if opts.continue_final_message {
        let last = msgs
            .last()
            .filter(|m| m.role == "assistant" && !m.content.is_empty())
            .ok_or_else(|| ApiError::param("continue_final_message", "continue_final_message needs a final assistant message with text to continue"))?;
        let end = text
            .rfind(&last.content)
            .map(|i| i + last.content.len())
            .ok_or_else(|| ApiError::param("continue_final_message", "the chat template's rendering does not contain the final message's text"))?;
        text.truncate(end);
    }
    let tokens = l.tokenizer.encode(&text, false).map_err(|e| ApiError::param("messages", e.to_string()))?;
    Ok(Prompt { tokens, text })
}

fn in_range(param: &str, v: Option<f64>, lo: f64, hi: f64, lo_open: bool) -> Result<Option<f64>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if !x.is_finite() || x > hi || x < lo || (lo_open && x == lo) => {
            Err(ApiError::param(param, format!("{x} is not a valid value for '{param}': it must be in {}{lo}, {hi}]", if lo_open { "(" } else { "[" })))
        }
        Some(x) => Ok(Some(x)),
    }
}

/// Checks the `model` field against the served names (404 `model_not_found`).
pub fn check_model(model: &Option<String>, cfg: &ServeConfig) -> Result<(), ApiError> {
    match model {
        Some(m) if !cfg.served_model_names.iter().any(|n| n == m) => Err(ApiError::ModelNotFound(m.clone())),
        _ => Ok(()),
    }
}

/// Validates the fields both endpoints share. `max_tokens` is the endpoint's effective value
/// (chat prefers `max_completion_tokens`); `logprobs` the number of top logprobs asked for.
fn gen_params(c: &CommonParams, cfg: &ServeConfig, vocab: usize, max_tokens: (Option<i64>, &str), logprobs: Option<usize>) -> Result<GenParams, ApiError> {
    check_model(&c.model, cfg)?;
    let max_tokens = match max_tokens.0 {
        None => None,
        Some(v) if v <= 0 => return Err(ApiError::param(max_tokens.1, format!("{} must be at least 1, got {v}", max_tokens.1))),
        Some(v) => Some(v as usize),
    };
    let d = &cfg.sampling;
    let temperature = in_range("temperature", c.temperature, 0.0, 2.0, false)?.unwrap_or(d.temperature);
    let top_p = in_range("top_p", c.top_p, 0.0, 1.0, true)?.unwrap_or(d.top_p);
    let presence = in_range("presence_penalty", c.presence_penalty, -2.0, 2.0, false)?.unwrap_or(0.0);
    let frequency = in_range("frequency_penalty", c.frequency_penalty, -2.0, 2.0, false)?.unwrap_or(0.0);
    let repetition = in_range("repetition_penalty", c.repetition_penalty, 0.0, 10.0, true)?.unwrap_or(d.repetition_penalty);
    let min_p = in_range("min_p", c.min_p, 0.0, 1.0, false)?.unwrap_or(d.min_p);
    let top_k = match c.top_k {
        None => d.top_k,
        Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => k.min(u32::MAX as i64) as u32,
        Some(k) => return Err(ApiError::param("top_k", format!("top_k must be -1 (off) or positive, got {k}"))),
    };
    let n = match c.n {
        None => 1,
        Some(v) if v >= 1 && v as usize <= cfg.max_n => v as usize,
        Some(v) => return Err(ApiError::param("n", format!("n must be between 1 and {}, got {v}", cfg.max_n))),
    };
    let min_tokens = match c.min_tokens {
        None => 0,
        Some(v) if v >= 0 => v as usize,
        Some(v) => return Err(ApiError::param("min_tokens", format!("min_tokens must be >= 0, got {v}"))),
    };
    if let (Some(mt), true) = (max_tokens, min_tokens > 0) {
        if min_tokens > mt {
            return Err(ApiError::param("min_tokens", format!("min_tokens ({min_tokens}) exceeds max_tokens ({mt})")));
        }
    }
    let stop = c.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > cfg.max_stop {
        return Err(ApiError::param("stop", format!("at most {} stop sequences are allowed, got {}", cfg.max_stop, stop.len())));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::param("stop", "stop sequences must not be empty"));
    }
    if let Some(long) = stop.iter().find(|s| s.len() > cfg.max_stop_bytes) {
        return Err(ApiError::param("stop", format!("stop sequences may be at most {} bytes long, got one of {}", cfg.max_stop_bytes, long.len())));
    }
    let ids = c.stop_token_ids.as_deref().unwrap_or_default();
    // Checked against every generated token: their number must stay a small constant.
    if ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(ApiError::param("stop_token_ids", format!("at most {MAX_STOP_TOKEN_IDS} stop token ids are allowed, got {}", ids.len())));
    }
    let stop_token_ids = token_ids(ids, vocab, "stop_token_ids")?;
    let stream = c.stream.unwrap_or(false);
    if c.stream_options.is_some() && !stream {
        return Err(ApiError::param("stream_options", "stream_options is only allowed when stream is true"));
    }
    if c.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
        return Err(ApiError::param("logit_bias", "logit_bias is not supported"));
    }
    if c.return_hidden_states == Some(true) {
        return Err(ApiError::param("return_hidden_states", "return_hidden_states is not supported (only false)"));
    }
    if let Some(lp) = logprobs {
        if lp > cfg.max_logprobs {
            return Err(ApiError::param("logprobs", format!("at most {} logprobs are allowed, got {lp}", cfg.max_logprobs)));
        }
    }
    // Clamped into the operator's range: one client's claim shapes what smooth gives everyone.
    let (lo, hi) = cfg.reading_rate_range;
    let reading_rate = in_range("reading_rate", c.reading_rate, 0.0, 1e6, true)?.map_or(cfg.default_class.reading_rate, |r| r.clamp(lo, hi));
    let grace = in_range("ttft_grace", c.ttft_grace, 0.0, 3600.0, false)?.unwrap_or(cfg.default_class.grace);
    let weight = priority_weight(c.priority, cfg.default_class.weight, cfg.priority_range)?;
    let cache_salt = match c.cache_salt.as_deref() {
        None => None,
        Some(s) if !s.is_empty() && s.len() <= 1024 => {
            use std::hash::{Hash, Hasher};
            let mut h = std::hash::DefaultHasher::new();
            s.hash(&mut h);
            Some(h.finish() | 1)
        }
        Some(_) => return Err(ApiError::param("cache_salt", "cache_salt must be a non-empty string of at most 1024 bytes")),
    };
    let sampling = SamplingParams {
        temperature: temperature as f32,
        top_p: top_p as f32,
        top_k,
        min_p: min_p as f32,
        seed: c.seed.map(|s| s as u64),
        presence_penalty: presence as f32,
        frequency_penalty: frequency as f32,
        repetition_penalty: repetition as f32,
        logprobs,
    };
    sampling.validate().map_err(|e| ApiError::param(e.param, e.message))?;
    Ok(GenParams {
        n,
        sampling,
        max_tokens,
        default_max_tokens: cfg.max_request_output_tokens.max(1).min(cfg.sampling.max_tokens.unwrap_or(usize::MAX)),
        min_tokens,
        stop,
        include_stop_str: c.include_stop_str_in_output.unwrap_or(false) || c.no_stop_trim.unwrap_or(false),
        stop_token_ids,
        ignore_eos: c.ignore_eos.unwrap_or(false),
        skip_special_tokens: c.skip_special_tokens.unwrap_or(true),
        stream,
        include_usage: stream && c.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false),
        class: SloClass { reading_rate, grace, weight },
        cache_salt,
        constraint: None,
    })
}

/// The weight of a request's `priority` (vLLM's meaning: lower is served first): any integer
/// from -10 to 10 is valid, and is clamped into the operator's `--priority-range`, so that a
/// client cannot claim more of the machine than the operator grants (by default it may only
/// lower its own priority). No priority: the server's default weight.
fn priority_weight(priority: Option<i64>, default_weight: f64, (lo, hi): (i64, i64)) -> Result<f64, ApiError> {
    match priority {
        None => Ok(default_weight),
        Some(p) if (-10..=10).contains(&p) => Ok(SloClass::priority_weight(p.clamp(lo, hi))),
        Some(p) => Err(ApiError::param("priority", format!("priority must be an integer from -10 to 10 (lower is served first), got {p}"))),
    }
}

/// Checks each prompt against the context: non-empty, shorter than `max_model_len`, and with
/// room for `max_tokens` after it. `param` names the prompt field (`prompt` or `messages`).
fn check_lengths(prompts: &[Prompt], p: &GenParams, max_model_len: usize, param: &str) -> Result<(), ApiError> {
    for prompt in prompts {
        let n = prompt.tokens.len();
        if n == 0 {
            return Err(ApiError::param(param, "the prompt is empty"));
        }
        if n >= max_model_len {
            return Err(context_length_exceeded(max_model_len, n, param));
        }
        if let Some(mt) = p.max_tokens {
            if n + mt > max_model_len {
                return Err(ApiError::Invalid {
                    message: format!(
                        "This model's maximum context length is {max_model_len} tokens. However, you requested {} tokens ({n} in the messages/prompt, {mt} in the completion). Please reduce the length of the messages/prompt or the completion.",
                        n + mt
                    ),
                    param: Some("max_tokens".into()),
                    code: Some("context_length_exceeded"),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::priority_weight;

    #[test]
    fn a_clients_priority_is_clamped_into_the_operators_range() {
        // The default range, 0 to 10: a client may lower its own priority, never raise it.
        assert_eq!(priority_weight(Some(-10), 1.0, (0, 10)).unwrap(), 1.0);
        assert_eq!(priority_weight(Some(-1), 1.0, (0, 10)).unwrap(), 1.0);
        assert_eq!(priority_weight(Some(3), 1.0, (0, 10)).unwrap(), 0.125);
        assert_eq!(priority_weight(None, 0.5, (0, 10)).unwrap(), 0.5);
        // An operator who trusts its clients.
        assert_eq!(priority_weight(Some(-2), 1.0, (-10, 10)).unwrap(), 4.0);
        assert!(priority_weight(Some(11), 1.0, (-10, 10)).is_err());
    }
}
