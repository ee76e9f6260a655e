//! What goes into the scheduler (a request) and what comes out of it (events, rejections).

use serde::{Deserialize, Serialize};

use crate::plan::{RequestId, SampledToken};
use crate::slo::SloClass;

/// A validated request as the server hands it to the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRequest {
    /// Unique while the request lives.
    pub id: RequestId,
    /// Prompt token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Most output tokens to generate.
    pub max_tokens: usize,
    /// Stop tokens are ignored until this many tokens were generated.
    pub min_tokens: usize,
    /// Stop token ids (the model's EOS ids included unless the client set `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    /// Arrival time, seconds on the engine's clock.
    pub arrival: f64,
    /// Reading class for deadlines; `None` takes the configured default.
    pub class: Option<SloClass>,
    /// Prefix-cache salt: requests share cached prefixes only with requests of the same salt
    /// (`None`: the shared default). A salt nobody else uses opts a request out of sharing.
    pub cache_salt: Option<u64>,
}

/// Why a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token was sampled (or the server matched a stop string and said so).
    Stop,
    /// `max_tokens` generated, or the sequence reached `max_model_len`.
    Length,
    /// The client went away.
    Abort,
    /// The policy dropped it after admission (drop-late).
    Dropped,
    /// Refused at admission. [`crate::Scheduler::add`] reports this as an `Err`; the variant exists
    /// so that the server and the benchmark name every finish the same way.
    Rejected,
    /// The engine step that carried it failed.
    Error,
}

/// Why admission refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectReason {
    /// The waiting queue holds `max_queue_requests`.
    QueueFull,
    /// The waiting queue holds `max_queue_tokens` prompt tokens.
    QueueTokens,
    /// The policy predicts a negative benefit (smooth).
    PredictedLate,
    /// The prompt cannot fit `max_model_len` or the whole KV cache.
    TooLong,
    /// Malformed: empty prompt, zero `max_tokens`, an id already in use, a non-finite arrival.
    Invalid,
}

impl RejectReason {
    /// Every reason, for counters.
    pub const ALL: [RejectReason; 5] =
        [RejectReason::QueueFull, RejectReason::QueueTokens, RejectReason::PredictedLate, RejectReason::TooLong, RejectReason::Invalid];

    /// True for overload (429/503 with Retry-After); false for a request that can never run
    /// (a 4xx the client must fix).
    pub fn is_overload(self) -> bool {
        matches!(self, RejectReason::QueueFull | RejectReason::QueueTokens | RejectReason::PredictedLate)
    }
}

/// A refused request.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("request rejected ({reason:?}); retry after {retry_after_s:.3} s")]
pub struct Rejection {
    /// Why.
    pub reason: RejectReason,
    /// Seconds after which the same request is predicted to be admitted; 0 when retrying cannot
    /// help (`TooLong`, `Invalid`).
    pub retry_after_s: f64,
}

/// What the scheduler tells the engine after a step (or an abort).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A new output token.
    Token {
        /// The request.
        id: RequestId,
        /// The token as sampled.
        sampled: SampledToken,
        /// Engine time of the step end that produced it.
        time: f64,
    },
    /// The request ended; no more events follow for it.
    Finished {
        /// The request.
        id: RequestId,
        /// Why.
        reason: FinishReason,
        /// Engine time.
        time: f64,
        /// Output tokens generated.
        num_output: usize,
    },
}

impl Event {
    /// The request the event is about.
    pub fn id(&self) -> RequestId {
        match self {
            Event::Token { id, .. } | Event::Finished { id, .. } => *id,
        }
    }
}
