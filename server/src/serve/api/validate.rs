//! Request validation: OpenAI bodies become [`GenParams`] once, with every bad value reported as
//! a 400 naming its parameter, before any expensive work or any response byte.

use pace_models::sampler::SamplingParams;
use pace_scheduler::slo::SloClass;

use super::error::{context_length_exceeded, ApiError};
use super::generation::{GenParams, Prompt};
use super::types::CommonParams;
use crate::serve::state::ServeConfig;

fn in_range(param: &str, v: Option<f64>, lo: f64, hi: f64, lo_open: bool) -> Result<Option<f64>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if !x.is_finite() || x > hi || x < lo || (lo_open && x == lo) => Err(ApiError::param(
            param,
            format!("{x} is not a valid value for '{param}': it must be in {}{lo}, {hi}]", if lo_open { "(" } else { "[" }),
        )),
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
pub fn gen_params(c: &CommonParams, cfg: &ServeConfig, vocab: usize, max_tokens: (Option<i64>, &str), logprobs: Option<usize>) -> Result<GenParams, ApiError> {
    check_model(&c.model, cfg)?;
    let max_tokens = match max_tokens.0 {
        None => None,
        Some(v) if v <= 0 => return Err(ApiError::param(max_tokens.1, format!("{} must be at least 1, got {v}", max_tokens.1))),
        Some(v) => Some(v as usize),
    };
    let temperature = in_range("temperature", c.temperature, 0.0, 2.0, false)?.unwrap_or(1.0);
    let top_p = in_range("top_p", c.top_p, 0.0, 1.0, true)?.unwrap_or(1.0);
    let presence = in_range("presence_penalty", c.presence_penalty, -2.0, 2.0, false)?.unwrap_or(0.0);
    let frequency = in_range("frequency_penalty", c.frequency_penalty, -2.0, 2.0, false)?.unwrap_or(0.0);
    let repetition = in_range("repetition_penalty", c.repetition_penalty, 0.0, 10.0, true)?.unwrap_or(1.0);
    let min_p = in_range("min_p", c.min_p, 0.0, 1.0, false)?.unwrap_or(0.0);
    let top_k = match c.top_k {
        None | Some(-1) | Some(0) => 0,
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
    let stop_token_ids = c
        .stop_token_ids
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|t| {
            if t >= 0 && (t as usize) < vocab {
                Ok(t as u32)
            } else {
                Err(ApiError::param("stop_token_ids", format!("token id {t} is outside the vocabulary (size {vocab})")))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let stream = c.stream.unwrap_or(false);
    if c.stream_options.is_some() && !stream {
        return Err(ApiError::param("stream_options", "stream_options is only allowed when stream is true"));
    }
    if c.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
        return Err(ApiError::param("logit_bias", "logit_bias is not supported"));
    }
    if let Some(lp) = logprobs {
        if lp > cfg.max_logprobs {
            return Err(ApiError::param("logprobs", format!("at most {} logprobs are allowed, got {lp}", cfg.max_logprobs)));
        }
    }
    let reading_rate = in_range("reading_rate", c.reading_rate, 0.0, 1e6, true)?.unwrap_or(cfg.default_class.reading_rate);
    let grace = in_range("ttft_grace", c.ttft_grace, 0.0, 3600.0, false)?.unwrap_or(cfg.default_class.grace);
    let weight = match c.priority {
        None => cfg.default_class.weight,
        Some(p) if (-10..=10).contains(&p) => SloClass::priority_weight(p),
        Some(p) => return Err(ApiError::param("priority", format!("priority must be an integer from -10 to 10 (lower is served first), got {p}"))),
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
        min_tokens,
        stop,
        include_stop_str: c.include_stop_str_in_output.unwrap_or(false),
        stop_token_ids,
        ignore_eos: c.ignore_eos.unwrap_or(false),
        skip_special_tokens: c.skip_special_tokens.unwrap_or(true),
        stream,
        include_usage: stream && c.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false),
        class: SloClass { reading_rate, grace, weight },
    })
}

/// Checks each prompt against the context: non-empty, shorter than `max_model_len`, and with
/// room for `max_tokens` after it. `param` names the prompt field (`prompt` or `messages`).
pub fn check_lengths(prompts: &[Prompt], p: &GenParams, max_model_len: usize, param: &str) -> Result<(), ApiError> {
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
