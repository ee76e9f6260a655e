//! What both completion endpoints share after validation: submitting the choices to the engine
//! (all-or-nothing admission, decided before any response byte), turning each choice's token
//! events into text frames (incremental detokenization, stop strings, logprobs), delivery
//! timestamps for the metrics, and aborting everything left when the client goes away.

use std::sync::{Arc, Mutex};

use pace_models::sampler::{Sampler, SamplingParams};
use pace_models::tokenizer::{IncrementalDecoder, StopMatcher, Tokenizer};
use pace_scheduler::slo::{Outcome, RequestRecord, SloClass};
use pace_scheduler::{FinishReason, NewRequest, RequestId, SampledToken};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{StreamExt, StreamMap};

use super::error::ApiError;
use crate::serve::engine_thread::{EngineEvent, EngineHandle, SubmitError};
use crate::serve::metrics::{self, Live, Window};
use crate::serve::state::AppState;

/// Validated generation parameters of one HTTP request.
#[derive(Debug, Clone)]
pub struct GenParams {
    /// Choices per prompt.
    pub n: usize,
    /// Sampler parameters (the seed is varied per choice).
    pub sampling: SamplingParams,
    /// Requested `max_tokens`, if any (else: the room left in the context).
    pub max_tokens: Option<usize>,
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
}

/// One prompt, tokenized.
#[derive(Debug, Clone)]
pub struct Prompt {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// Text, for echo.
    pub text: String,
}

/// Text and tokens for one choice, ready to be written.
#[derive(Debug, Default)]
pub struct Frame {
    /// Choice index (prompt index * n + choice).
    pub index: usize,
    /// New text.
    pub text: String,
    /// Sampled tokens carried by this frame (their logprobs, if asked for).
    pub tokens: Vec<SampledToken>,
    /// Set on the last frame of the choice: `stop`, `length`, `abort` or an error.
    pub finish: Option<Finish>,
}

/// How a choice ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Finish {
    /// OpenAI's `finish_reason` value.
    Reason(&'static str),
    /// A server-side end that is reported as an error (dropped, engine error).
    Error(ApiError),
}

struct Choice {
    id: RequestId,
    index: usize,
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    stop_hit: bool,
    /// Tokens whose text has been produced but whose frame is not yet out.
    pending: Vec<SampledToken>,
    num_tokens: usize,
    live: Arc<Mutex<Live>>,
    arrival: f64,
    class: SloClass,
    prompt_tokens: usize,
    done: bool,
}

/// A running generation: every choice of one HTTP request.
pub struct Generation {
    engine: EngineHandle,
    state: Arc<AppState>,
    choices: Vec<Choice>,
    streams: StreamMap<usize, UnboundedReceiverStream<EngineEvent>>,
    /// The request's stop strings, and whether a matched one stays in the output.
    stops: Vec<String>,
    include_stop_str: bool,
    /// Prompt tokens (each prompt counted once).
    pub prompt_tokens: usize,
}

impl Generation {
    /// Submits `prompts.len() * n` requests. All are admitted or none: on a rejection the others
    /// are aborted and the rejection is returned (as 429/503 with Retry-After).
    pub async fn start(state: &Arc<AppState>, engine: &EngineHandle, tokenizer: &Arc<Tokenizer>, prompts: &[Prompt], p: &GenParams, max_model_len: usize, arrival: f64) -> Result<Self, ApiError> {
        let mut gen = Generation {
            engine: engine.clone(),
            state: state.clone(),
            choices: Vec::new(),
            streams: StreamMap::new(),
            stops: p.stop.clone(),
            include_stop_str: p.include_stop_str,
            prompt_tokens: prompts.iter().map(|p| p.tokens.len()).sum(),
        };
        let mut stop_ids = p.stop_token_ids.clone();
        if !p.ignore_eos {
            stop_ids.extend_from_slice(tokenizer.eos_token_ids());
        }
        for (pi, prompt) in prompts.iter().enumerate() {
            let room = max_model_len.saturating_sub(prompt.tokens.len());
            let max_tokens = p.max_tokens.unwrap_or(room).min(room).max(1);
            for c in 0..p.n {
                let index = pi * p.n + c;
                let mut sampling = p.sampling.clone();
                sampling.seed = p.sampling.seed.map(|s| s.wrapping_add(index as u64));
                let sampler = Sampler::new(sampling, &prompt.tokens).map_err(|e| ApiError::param(e.param, e.message))?;
                let id = engine.next_id();
                let req = NewRequest {
                    id,
                    prompt: prompt.tokens.clone(),
                    max_tokens,
                    min_tokens: p.min_tokens,
                    stop_token_ids: stop_ids.clone(),
                    arrival,
                    class: Some(p.class),
                };
                match engine.submit(req, sampler).await {
                    Ok(rx) => {
                        let live = state.window.start(id, arrival, p.class);
                        gen.streams.insert(index, UnboundedReceiverStream::new(rx));
                        gen.choices.push(Choice {
                            id,
                            index,
                            decoder: IncrementalDecoder::continuation(tokenizer.clone(), p.skip_special_tokens),
                            stop: StopMatcher::new(p.stop.clone()).map_err(|e| ApiError::param("stop", e.to_string()))?,
                            stop_hit: false,
                            pending: Vec::new(),
                            num_tokens: 0,
                            live,
                            arrival,
                            class: p.class,
                            prompt_tokens: prompt.tokens.len(),
                            done: false,
                        });
                        metrics_prompt_tokens(prompt.tokens.len());
                    }
                    Err(SubmitError::Rejected(r)) => {
                        // Rejected: nothing was written yet; give back what was admitted.
                        let label = metrics::reject_label(r.reason);
                        ::metrics::counter!("pace_requests_rejected_total", "reason" => label).increment(1);
                        let now = engine.now();
                        state.window.finish(id, RequestRecord { arrival, token_times: vec![], outcome: Outcome::Rejected, end: now, class: p.class }, prompt.tokens.len(), "rejected");
                        drop(gen); // aborts the admitted choices
                        let message = format!("request rejected at admission ({label}); retry after {:.1} s", r.retry_after_s);
                        return Err(if r.reason.is_overload() {
                            if r.reason == pace_scheduler::RejectReason::PredictedLate {
                                ApiError::Unavailable { message, retry_after_s: r.retry_after_s }
                            } else {
                                ApiError::Overloaded { message, retry_after_s: r.retry_after_s }
                            }
                        } else {
                            ApiError::invalid(format!("request cannot be served ({label})"), None)
                        });
                    }
                    Err(SubmitError::EngineGone) => {
                        drop(gen);
                        return Err(ApiError::Unavailable { message: "the engine has stopped".into(), retry_after_s: 5.0 });
                    }
                }
            }
        }
        Ok(gen)
    }

    /// Number of choices.
    pub fn num_choices(&self) -> usize {
        self.choices.len()
    }

    /// Completion tokens generated so far, over all choices.
    pub fn completion_tokens(&self) -> usize {
        self.choices.iter().map(|c| c.num_tokens).sum()
    }

    /// The next frame, or `None` when every choice has finished.
    pub async fn next_frame(&mut self) -> Option<Frame> {
        loop {
            let (index, ev) = self.streams.next().await?;
            let Some(ci) = self.choices.iter().position(|c| c.index == index) else { continue };
            if let Some(frame) = self.on_event(ci, ev) {
                return Some(frame);
            }
        }
    }

    fn on_event(&mut self, ci: usize, ev: EngineEvent) -> Option<Frame> {
        let engine = self.engine.clone();
        let (stops, include_stop) = (&self.stops, self.include_stop_str);
        let c = &mut self.choices[ci];
        match ev {
            EngineEvent::Token { sampled } => {
                if c.stop_hit || c.done {
                    return None; // produced after a stop string was matched: not part of the output
                }
                c.num_tokens += 1;
                let text = c.decoder.push(sampled.token).unwrap_or_default();
                c.pending.push(sampled);
                let out = c.stop.push(&text);
                if let Some(which) = out.stopped {
                    c.stop_hit = true;
                    engine.stop(c.id);
                    let mut text = out.text;
                    if include_stop {
                        text.push_str(&stops[which]);
                    }
                    return Some(Frame { index: c.index, text, tokens: std::mem::take(&mut c.pending), finish: None });
                }
                if out.text.is_empty() {
                    // Held back (incomplete UTF-8 or a possible stop string): no frame yet.
                    return None;
                }
                Some(Frame { index: c.index, text: out.text, tokens: std::mem::take(&mut c.pending), finish: None })
            }
            EngineEvent::Finished { reason, time } => {
                c.done = true;
                let mut text = String::new();
                if !c.stop_hit {
                    let rest = c.decoder.finish();
                    text.push_str(&c.stop.push(&rest).text);
                    text.push_str(&c.stop.finish());
                }
                let finish = match (reason, c.stop_hit) {
                    (_, true) | (FinishReason::Stop, _) => Finish::Reason("stop"),
                    (FinishReason::Length, _) => Finish::Reason("length"),
                    (FinishReason::Abort, _) => Finish::Reason("abort"),
                    (FinishReason::Dropped, _) => Finish::Error(ApiError::Dropped),
                    (FinishReason::Error, _) => Finish::Error(ApiError::Internal("the engine step that carried this request failed".into())),
                    (FinishReason::Rejected, _) => Finish::Error(ApiError::Overloaded { message: "rejected".into(), retry_after_s: 1.0 }),
                };
                let _ = time;
                Some(Frame { index: c.index, text, tokens: std::mem::take(&mut c.pending), finish: Some(finish) })
            }
        }
    }

    /// Marks a frame written at engine time `now`: its tokens are delivered then. When it is
    /// the choice's last frame, the request's record goes to the metrics.
    pub fn delivered(&mut self, frame: &Frame, now: f64) {
        let Some(c) = self.choices.iter_mut().find(|c| c.index == frame.index) else { return };
        if let Ok(mut live) = c.live.lock() {
            live.token_times.extend(std::iter::repeat_n(now, frame.tokens.len()));
        }
        if let Some(f) = &frame.finish {
            let (outcome, label) = match f {
                Finish::Reason("stop") => (Outcome::Completed, "stop"),
                Finish::Reason("length") => (Outcome::Completed, "length"),
                Finish::Reason(_) => (Outcome::Aborted, "abort"),
                Finish::Error(ApiError::Dropped) => (Outcome::Dropped, "dropped"),
                Finish::Error(_) => (Outcome::Failed, "error"),
            };
            let token_times = c.live.lock().map(|l| l.token_times.clone()).unwrap_or_default();
            let record = RequestRecord { arrival: c.arrival, token_times, outcome, end: now, class: c.class };
            log_finished(c.id, &record, c.prompt_tokens, label, &self.state.window);
            self.state.window.finish(c.id, record, c.prompt_tokens, label);
        }
    }
}

impl Drop for Generation {
    /// The client is gone (or the request ended): abort whatever has not finished. Requests
    /// that never reached the end are recorded as aborted.
    fn drop(&mut self) {
        let now = self.engine.now();
        for c in &self.choices {
            if !c.done {
                self.engine.abort(c.id);
                let token_times = c.live.lock().map(|l| l.token_times.clone()).unwrap_or_default();
                let record = RequestRecord { arrival: c.arrival, token_times, outcome: Outcome::Aborted, end: now, class: c.class };
                log_finished(c.id, &record, c.prompt_tokens, "abort", &self.state.window);
                self.state.window.finish(c.id, record, c.prompt_tokens, "abort");
            }
        }
    }
}

fn metrics_prompt_tokens(n: usize) {
    ::metrics::counter!("pace_prompt_tokens_total").increment(n as u64);
}

fn log_finished(id: RequestId, r: &RequestRecord, prompt_tokens: usize, reason: &str, _w: &Window) {
    tracing::info!(
        target: "pace::request",
        "request {id} finished: reason={reason} prompt_tokens={prompt_tokens} output_tokens={} ttft={} tpot={:.4} idle={:.3}",
        r.num_tokens(),
        r.ttft().map(|t| format!("{t:.3}")).unwrap_or_else(|| "-".into()),
        r.tpot(),
        r.idle_latency()
    );
}
