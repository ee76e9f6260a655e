//! What both completion endpoints share after validation: submitting the choices to the engine
//! (all-or-nothing admission, decided before any response byte), turning each choice's token
//! events into text frames (incremental detokenization, stop strings, logprobs), delivery
//! timestamps for the metrics, and aborting everything left when the client goes away.

use std::sync::{Arc, Mutex};

use pace_models::sampler::Sampler;
use pace_models::tokenizer::{IncrementalDecoder, StopMatcher, Tokenizer};
use pace_scheduler::slo::{RequestRecord, SloClass};
use pace_scheduler::{FinishReason, NewRequest, RequestId, SampledToken};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{StreamExt, StreamMap};

use super::error::ApiError;
use super::validate::{GenParams, Prompt};
use crate::serve::engine_thread::{EngineEvent, EngineHandle, SubmitError};
use crate::serve::metrics::{self, Live};
use crate::serve::state::AppState;

/// Text and tokens for one choice, ready to be written.
#[derive(Debug, Default)]
pub struct Frame {
    /// Choice index (prompt index * n + choice).
    pub index: usize,
    /// New text.
    pub text: String,
    /// Sampled tokens carried by this frame (their logprobs, if asked for).
    pub tokens: Vec<SampledToken>,
    /// Set on the last frame of the choice: how it ended (a matched stop string is `Stop`).
    /// Ends that are errors ([`ApiError::from_finish`]) are written as errors.
    pub finish: Option<FinishReason>,
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
    /// The id the client knows it by, in log lines.
    name: String,
    /// Index of its prompt, and how many of the prompt's tokens came from the prefix cache.
    prompt_index: usize,
    cached_tokens: usize,
    /// The engine has finished it.
    done: bool,
    /// Its record has gone to the metrics (at its last frame's delivery, or when dropped).
    recorded: bool,
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
    /// are aborted and the rejection is returned (as 429/503 with Retry-After). `request_id` is
    /// the response's `id`, which log lines carry.
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        state: &Arc<AppState>,
        engine: &EngineHandle,
        tokenizer: &Arc<Tokenizer>,
        prompts: &[Prompt],
        p: &GenParams,
        max_model_len: usize,
        arrival: f64,
        request_id: &str,
    ) -> Result<Self, ApiError> {
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
            let max_tokens = p.max_tokens.unwrap_or(p.default_max_tokens).min(room).max(1);
            for c in 0..p.n {
                let index = pi * p.n + c;
                let name = if prompts.len() * p.n > 1 { format!("{request_id}#{index}") } else { request_id.to_string() };
                let mut sampling = p.sampling.clone();
                sampling.seed = p.sampling.seed.map(|s| s.wrapping_add(index as u64));
                let mut sampler = Sampler::new(sampling, &prompt.tokens).map_err(|e| ApiError::param(e.param, e.message))?;
                if let Some(c) = &p.constraint {
                    sampler = sampler.with_constraint(c.clone());
                }
                let id = engine.next_id();
                let req = NewRequest {
                    id,
                    prompt: prompt.tokens.clone(),
                    max_tokens,
                    min_tokens: p.min_tokens,
                    stop_token_ids: stop_ids.clone(),
                    arrival,
                    class: Some(p.class),
                    cache_salt: p.cache_salt,
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
                            name,
                            prompt_index: pi,
                            cached_tokens: 0,
                            done: false,
                            recorded: false,
                        });
                        metrics::record_prompt_tokens(prompt.tokens.len());
                    }
                    Err(SubmitError::Rejected(r)) => {
                        // Rejected: nothing was written yet; give back what was admitted.
                        metrics::record_rejected(metrics::reject_label(r.reason));
                        let record = RequestRecord {
                            arrival,
                            token_times: vec![],
                            outcome: metrics::outcome(FinishReason::Rejected),
                            end: engine.now(),
                            class: p.class,
                        };
                        state.window.finish(id, &name, record, prompt.tokens.len(), FinishReason::Rejected, None);
                        drop(gen); // aborts the admitted choices
                        return Err(r.into());
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

    /// Prompt tokens that came from the prefix cache, each prompt counted once, as
    /// `prompt_tokens` counts it: by the choice of it that found the fewest (the others of `n`
    /// share what that one computed).
    pub fn cached_tokens(&self) -> usize {
        let mut least: Vec<Option<usize>> = Vec::new();
        for c in &self.choices {
            if least.len() <= c.prompt_index {
                least.resize(c.prompt_index + 1, None);
            }
            let l = &mut least[c.prompt_index];
            *l = Some(l.map_or(c.cached_tokens, |v| v.min(c.cached_tokens)));
        }
        least.iter().flatten().sum()
    }

    /// Completion tokens generated so far, over all choices.
    pub fn completion_tokens(&self) -> usize {
        self.choices.iter().map(|c| c.num_tokens).sum()
    }

    /// The next frame, or `None` when every choice has finished. A choice whose channel closed
    /// without a finish (the engine thread is gone) ends as an error.
    pub async fn next_frame(&mut self) -> Option<Frame> {
        loop {
            let Some((index, ev)) = self.streams.next().await else {
                let c = self.choices.iter_mut().find(|c| !c.done)?;
                c.done = true;
                return Some(Frame { index: c.index, text: String::new(), tokens: std::mem::take(&mut c.pending), finish: Some(FinishReason::Error) });
            };
            let Some(ci) = self.choices.iter().position(|c| c.index == index) else {
                continue;
            };
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
            EngineEvent::Scheduled { at, cached_tokens } => {
                if let Ok(mut live) = c.live.lock() {
                    live.scheduled.get_or_insert(at);
                }
                c.cached_tokens = cached_tokens;
                None
            }
            EngineEvent::Finished { reason } => {
                c.done = true;
                let mut text = String::new();
                if !c.stop_hit {
                    let rest = c.decoder.finish();
                    text.push_str(&c.stop.push(&rest).text);
                    text.push_str(&c.stop.finish());
                }
                // The engine says `Stop` for a stop string only once it has heard of it.
                let finish = if c.stop_hit { FinishReason::Stop } else { reason };
                Some(Frame { index: c.index, text, tokens: std::mem::take(&mut c.pending), finish: Some(finish) })
            }
        }
    }

    /// Marks a frame written at engine time `now`: its tokens are delivered then. When it is
    /// the choice's last frame, the request's record goes to the metrics.
    pub fn delivered(&mut self, frame: &Frame, now: f64) {
        let Some(c) = self.choices.iter_mut().find(|c| c.index == frame.index) else {
            return;
        };
        if let Ok(mut live) = c.live.lock() {
            live.deliver(frame.tokens.len(), now);
        }
        if let Some(reason) = frame.finish {
            if !std::mem::replace(&mut c.recorded, true) {
                c.record(&self.state, reason, now);
            }
        }
    }
}

impl Choice {
    /// Sends its record to the metrics, as ended by `reason` at `now`.
    fn record(&self, state: &AppState, reason: FinishReason, now: f64) {
        let (token_times, scheduled) = snapshot(&self.live);
        let record = RequestRecord { arrival: self.arrival, token_times, outcome: metrics::outcome(reason), end: now, class: self.class };
        state.window.finish(self.id, &self.name, record, self.prompt_tokens, reason, scheduled);
    }
}

fn snapshot(live: &Mutex<Live>) -> (Vec<f64>, Option<f64>) {
    live.lock().map(|l| (l.token_times.clone(), l.scheduled)).unwrap_or_default()
}

impl Drop for Generation {
    /// The client is gone (or the request ended): abort whatever has not finished. Choices whose
    /// end never reached the client are recorded as aborted, those the engine had already
    /// finished included (a non-streaming response whose client left after one of its choices).
    fn drop(&mut self) {
        let now = self.engine.now();
        for c in &mut self.choices {
            if !c.done {
                self.engine.abort(c.id);
            }
            if !std::mem::replace(&mut c.recorded, true) {
                c.record(&self.state, FinishReason::Abort, now);
            }
        }
    }
}
