//! The OpenAI schema: request bodies as the client sends them, and the response bodies and
//! stream chunks the server writes (serialised by serde, so the shapes are these types).
//!
//! Requests: OpenAI request bodies as the client sends them. Unknown fields are rejected (400 naming the
//! field), as OpenAI does; fields OpenAI defines that pace does not act on are accepted only in
//! their harmless forms (see `validate`). Numbers are read wide (`i64`, `f64`) so that a negative
//! or out-of-range value becomes a 400 naming the parameter, not a serde type error.
//!
//! Extensions beyond OpenAI's set, as vLLM names them: `top_k`, `min_p`, `min_tokens`,
//! `ignore_eos`, `repetition_penalty`, `stop_token_ids`, `skip_special_tokens`,
//! `include_stop_str_in_output`, and for chat `add_generation_prompt`, `continue_final_message`,
//! `chat_template_kwargs`, `spaces_between_special_tokens`; `priority` (an integer from -10 to 10, lower is served first;
//! default `--default-priority`: a request of priority `p` weighs `2^-p` in smooth goodput and
//! in the smooth scheduler), and pace's smooth-goodput class: `reading_rate` (tokens/s the user
//! reads at; default `--reading-rate`) and `ttft_grace` (seconds before the first token is due;
//! default `--ttft-grace`, which is in milliseconds). `cache_salt` (vLLM's): requests share
//! cached prefixes only with requests of the same salt; a salt of one's own opts out.
//!
//! Fields the routers add to every request they forward (SGLang's model gateway and vLLM's
//! router, docs/fleet.md): `no_stop_trim` (SGLang's name for `include_stop_str_in_output`),
//! `separate_reasoning`, `stream_reasoning` and `include_reasoning` (accepted: pace has no
//! reasoning parser, so the whole answer is `content`, as with either server for a model
//! without one) and `return_hidden_states` (`false` only).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `prompt` of `/v1/completions`: text, texts, token ids, or lists of token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// One text prompt.
    Text(String),
    /// One prompt as token ids.
    Tokens(Vec<i64>),
    /// Several text prompts.
    Texts(Vec<String>),
    /// Several prompts as token ids.
    TokenLists(Vec<Vec<i64>>),
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopInput {
    /// One stop string.
    One(String),
    /// Several stop strings.
    Many(Vec<String>),
}

impl StopInput {
    /// As a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send one usage chunk last, before `[DONE]`.
    pub include_usage: Option<bool>,
    /// Accepted for compatibility (vLLM): usage on every chunk is not sent.
    #[allow(dead_code)]
    pub continuous_usage_stats: Option<bool>,
}

/// Sampling and limit fields shared by both endpoints (OpenAI's, then the extensions).
#[derive(Debug, Clone, Default)]
#[allow(dead_code)] // `user` is accepted (OpenAI's end-user id) and not used.
pub struct CommonParams {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub n: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub stop: Option<StopInput>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub seed: Option<i64>,
    pub user: Option<String>,
    pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub min_tokens: Option<i64>,
    pub ignore_eos: Option<bool>,
    pub repetition_penalty: Option<f64>,
    pub stop_token_ids: Option<Vec<i64>>,
    pub skip_special_tokens: Option<bool>,
    pub include_stop_str_in_output: Option<bool>,
    pub reading_rate: Option<f64>,
    pub ttft_grace: Option<f64>,
    pub priority: Option<i64>,
    pub cache_salt: Option<String>,
    pub response_format: Option<ResponseFormat>,
    pub structured_outputs: Option<StructuredOutputs>,
    pub guided_json: Option<serde_json::Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    pub guided_decoding_backend: Option<String>,
    pub guided_whitespace_pattern: Option<String>,
    pub no_stop_trim: Option<bool>,
    pub separate_reasoning: Option<bool>,
    pub stream_reasoning: Option<bool>,
    pub include_reasoning: Option<bool>,
    pub return_hidden_states: Option<bool>,
}

/// Defines a request body struct with its own fields plus every [`CommonParams`] field, and a
/// `common()` accessor. (serde's `flatten` cannot be combined with `deny_unknown_fields`.)
macro_rules! with_common_params {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident : $t:ty,)* }) => {
        $(#[$m])*
        pub struct $name {
            $($(#[$fm])* pub $f: $t,)*
            pub model: Option<String>,
            pub max_tokens: Option<i64>,
            pub temperature: Option<f64>,
            pub top_p: Option<f64>,
            pub n: Option<i64>,
            pub stream: Option<bool>,
            pub stream_options: Option<StreamOptions>,
            pub stop: Option<StopInput>,
            pub presence_penalty: Option<f64>,
            pub frequency_penalty: Option<f64>,
            pub seed: Option<i64>,
            pub user: Option<String>,
            pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
            pub top_k: Option<i64>,
            pub min_p: Option<f64>,
            pub min_tokens: Option<i64>,
            pub ignore_eos: Option<bool>,
            pub repetition_penalty: Option<f64>,
            pub stop_token_ids: Option<Vec<i64>>,
            pub skip_special_tokens: Option<bool>,
            pub include_stop_str_in_output: Option<bool>,
            pub reading_rate: Option<f64>,
            pub ttft_grace: Option<f64>,
            pub priority: Option<i64>,
            pub cache_salt: Option<String>,
            pub response_format: Option<ResponseFormat>,
            pub structured_outputs: Option<StructuredOutputs>,
            pub guided_json: Option<serde_json::Value>,
            pub guided_regex: Option<String>,
            pub guided_choice: Option<Vec<String>>,
            pub guided_grammar: Option<String>,
            pub guided_decoding_backend: Option<String>,
            pub guided_whitespace_pattern: Option<String>,
            pub no_stop_trim: Option<bool>,
            pub separate_reasoning: Option<bool>,
            pub stream_reasoning: Option<bool>,
            pub include_reasoning: Option<bool>,
            pub return_hidden_states: Option<bool>,
        }

        impl $name {
            /// The shared fields.
            pub fn common(&self) -> CommonParams {
                // Field by field: the prompt or messages (up to the body limit) are not copied.
                let Self { model, max_tokens, temperature, top_p, n, stream, stream_options, stop, presence_penalty, frequency_penalty, seed, user, logit_bias, top_k, min_p, min_tokens, ignore_eos, repetition_penalty, stop_token_ids, skip_special_tokens, include_stop_str_in_output, reading_rate, ttft_grace, priority, cache_salt, response_format, structured_outputs, guided_json, guided_regex, guided_choice, guided_grammar, guided_decoding_backend, guided_whitespace_pattern, no_stop_trim, separate_reasoning, stream_reasoning, include_reasoning, return_hidden_states, .. } = self;
                CommonParams { model: model.clone(), max_tokens: max_tokens.clone(), temperature: temperature.clone(), top_p: top_p.clone(), n: n.clone(), stream: stream.clone(), stream_options: stream_options.clone(), stop: stop.clone(), presence_penalty: presence_penalty.clone(), frequency_penalty: frequency_penalty.clone(), seed: seed.clone(), user: user.clone(), logit_bias: logit_bias.clone(), top_k: top_k.clone(), min_p: min_p.clone(), min_tokens: min_tokens.clone(), ignore_eos: ignore_eos.clone(), repetition_penalty: repetition_penalty.clone(), stop_token_ids: stop_token_ids.clone(), skip_special_tokens: skip_special_tokens.clone(), include_stop_str_in_output: include_stop_str_in_output.clone(), reading_rate: reading_rate.clone(), ttft_grace: ttft_grace.clone(), priority: priority.clone(), cache_salt: cache_salt.clone(), response_format: response_format.clone(), structured_outputs: structured_outputs.clone(), guided_json: guided_json.clone(), guided_regex: guided_regex.clone(), guided_choice: guided_choice.clone(), guided_grammar: guided_grammar.clone(), guided_decoding_backend: guided_decoding_backend.clone(), guided_whitespace_pattern: guided_whitespace_pattern.clone(), no_stop_trim: *no_stop_trim, separate_reasoning: *separate_reasoning, stream_reasoning: *stream_reasoning, include_reasoning: *include_reasoning, return_hidden_states: *return_hidden_states }
            }
        }
    };
}

with_common_params! {
    /// `/v1/completions` body.
    #[derive(Debug, Clone, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct CompletionRequest {
        pub prompt: PromptInput,
        /// Number of top log-probabilities per token (0 = only the chosen token's).
        pub logprobs: Option<i64>,
        pub echo: Option<bool>,
        pub best_of: Option<i64>,
        pub suffix: Option<String>,
        /// Encode the prompt with the model's BOS (default true, as vLLM).
        pub add_special_tokens: Option<bool>,
    }
}

/// One part of a message's content list.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

/// A message's `content`: text or a list of parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts (only `text` parts are supported).
    Parts(Vec<ContentPart>),
}

/// One chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct MessageIn {
    pub role: String,
    pub content: Option<Content>,
    /// Accepted; templates here do not use participant names.
    #[allow(dead_code)]
    pub name: Option<String>,
    /// An assistant message's earlier tool calls (OpenAI's shape).
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A `tool` message's call id (accepted; the result is matched by order).
    #[allow(dead_code)]
    pub tool_call_id: Option<String>,
}

/// `response_format`: `{"type": "text"}`, `{"type": "json_object"}` or
/// `{"type": "json_schema", "json_schema": {"name", "description", "schema", "strict"}}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    pub json_schema: Option<JsonSchemaFormat>,
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // `name`, `description` and `strict` are accepted; every schema is enforced.
pub struct JsonSchemaFormat {
    pub name: Option<String>,
    pub description: Option<String>,
    pub schema: Option<serde_json::Value>,
    pub strict: Option<bool>,
}

/// vLLM's `structured_outputs`: exactly one of `json`, `regex`, `choice`, `grammar`,
/// `json_object`, plus layout options.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StructuredOutputs {
    pub json: Option<serde_json::Value>,
    pub regex: Option<String>,
    pub choice: Option<Vec<String>>,
    pub grammar: Option<String>,
    pub json_object: Option<bool>,
    /// No whitespace beyond the separators (pace's default is compact layout; `false` allows
    /// any JSON whitespace, vLLM's default).
    pub disable_any_whitespace: Option<bool>,
    /// Accepted for vLLM compatibility; the schema's own `additionalProperties` decides.
    #[allow(dead_code)]
    pub disable_additional_properties: Option<bool>,
    /// Accepted for vLLM compatibility: pace has one backend and never falls back.
    #[allow(dead_code)]
    pub disable_fallback: Option<bool>,
    /// A regex for the whitespace JSON may use between tokens.
    pub whitespace_pattern: Option<String>,
}

/// One entry of chat `tools`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDef,
}

/// A tool's function.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionDef {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

with_common_params! {
    /// `/v1/chat/completions` body.
    #[derive(Debug, Clone, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct ChatRequest {
        pub messages: Vec<MessageIn>,
        pub max_completion_tokens: Option<i64>,
        pub logprobs: Option<bool>,
        pub top_logprobs: Option<i64>,
        pub tools: Option<Vec<Tool>>,
        pub tool_choice: Option<serde_json::Value>,
        /// `false`: at most one call (with `tool_choice` `required`).
        pub parallel_tool_calls: Option<bool>,
        /// Render the template with a generation prompt (default true).
        pub add_generation_prompt: Option<bool>,
        /// vLLM's: the reply continues the final (assistant) message instead of starting a new
        /// one; needs `add_generation_prompt` false or unset.
        pub continue_final_message: Option<bool>,
        /// vLLM's: extra variables for the chat template (e.g. `{"enable_thinking": false}`).
        pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
        /// vLLM's: spaces between special tokens in the output text; only meaningful with
        /// `skip_special_tokens` false, where pace supports only `false`.
        pub spaces_between_special_tokens: Option<bool>,
    }
}

/// `/tokenize` body: a prompt or chat messages.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<MessageIn>>,
    pub add_special_tokens: Option<bool>,
    pub add_generation_prompt: Option<bool>,
}

/// `/detokenize` body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<i64>,
}

// ------------------------------------------------------------------------------- responses

/// `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details`, as OpenAI reports it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV came from the prefix cache instead of being computed.
    pub cached_tokens: usize,
}

impl Usage {
    /// Usage of `prompt` prompt tokens (`cached` of them from the prefix cache) and `completion`
    /// generated ones.
    pub fn new(prompt: usize, cached: usize, completion: usize) -> Self {
        Self {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: cached },
        }
    }
}

/// A response body or a stream chunk of either endpoint: `object` is `text_completion`,
/// `chat.completion` or `chat.completion.chunk`; `C` is the endpoint's choice.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionBody<C> {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<C>,
    /// Always on a whole response; on a stream only the last chunk (no choices) carries it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// `/v1/completions` logprobs of a run of tokens.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f32>>,
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    pub text_offset: Vec<usize>,
}

/// One choice of a `/v1/completions` response or chunk.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// A candidate token and its log-probability (chat).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// One generated token's log-probability and the top candidates (chat).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: Option<f32>,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

/// Chat logprobs of a run of tokens.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<TokenLogprob>,
}

/// The assistant's message in a whole chat response: text, or (`content` null) tool calls.
#[derive(Debug, Clone, Serialize)]
pub struct MessageOut {
    pub role: &'static str,
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// One tool call of an assistant message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

/// The function of a tool call: its name and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// A fragment of a tool call in a stream chunk: the first carries `id`, `type` and the name.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionCallDelta,
}

/// The function part of a [`ToolCallDelta`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionCallDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

/// One choice of a whole chat response.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: MessageOut,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// The new text of a chat stream chunk; `role` on a choice's first chunk only; tool-call
/// fragments instead of text when the reply is a tool call.
#[derive(Debug, Clone, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
}

/// One choice of a chat stream chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}
