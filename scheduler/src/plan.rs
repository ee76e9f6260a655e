//! The step plan: plain data passed from the scheduler to the model runner, and the step output
//! passed back. Nothing here knows about tensors, devices or HTTP.
//!
//! A step is one forward pass over a ragged batch. Each scheduled sequence contributes a
//! contiguous slice of its tokens: a prefill chunk (several tokens at any offset) or a single
//! decode token. There is no separate prefill or decode phase: a sequence has tokens computed and
//! tokens wanted, and a step gives it some tokens.

/// Identifies a request (one sequence) for its whole life, in the scheduler, the runner and the
/// server.
pub type RequestId = u64;

/// One sequence's share of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqSlice {
    /// The request this slice belongs to.
    pub id: RequestId,
    /// Token ids fed this step: a prefill chunk, or the one token sampled last step (decode).
    pub tokens: Vec<u32>,
    /// Position of `tokens[0]` in the sequence; equals the number of tokens already in the KV
    /// cache for this sequence.
    pub start_pos: usize,
    /// Physical KV block ids covering positions `0 .. start_pos + tokens.len()`, in order.
    /// Block 0 is the null block and never appears here.
    pub block_table: Vec<u32>,
    /// Sample a token from the logits of this slice's last position. False for a prefill chunk
    /// that does not reach the end of the known tokens.
    pub sample: bool,
}

impl SeqSlice {
    /// Number of tokens this slice feeds.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True if this slice feeds no token (never produced by the scheduler).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Tokens in the KV cache after this step: the context the last token attends to.
    pub fn context_len(&self) -> usize {
        self.start_pos + self.tokens.len()
    }
}

/// The plan for one step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchPlan {
    /// Monotonic step number.
    pub step: u64,
    /// Scheduled slices; every request appears at most once.
    pub seqs: Vec<SeqSlice>,
    /// Requests that finished for good since the last plan (any finish reason): the runner frees
    /// the per-request state it keeps for them (sampler, penalties, RNG). A preempted request is
    /// not released: it keeps its sampler state and comes back with a recompute prefill.
    pub released: Vec<RequestId>,
}

impl BatchPlan {
    /// Total tokens fed to the model this step.
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }

    /// True if nothing runs this step.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }
}

/// One sampled token with its log-probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledToken {
    /// The request it was sampled for.
    pub id: RequestId,
    /// The sampled token id.
    pub token: u32,
    /// Log-probability of the sampled token under the (penalised, temperature-scaled) model
    /// distribution; present when the request asked for logprobs.
    pub logprob: Option<f32>,
    /// The `top_logprobs` most likely tokens and their log-probabilities, most likely first.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// What the runner returns for a plan.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOutput {
    /// One entry per slice with `sample == true`, in plan order.
    pub sampled: Vec<SampledToken>,
    /// Requests whose output is complete with this step's token although it is no stop token
    /// (a structured output whose grammar nothing can extend): they finish with `Stop` now
    /// instead of spending a step on the end-of-sequence token.
    pub complete: Vec<RequestId>,
    /// Requests whose row of logits was broken (a NaN or +inf, or no finite value): they get no
    /// token and finish with `Error`, never with a token sampled from garbage.
    pub failed: Vec<RequestId>,
}
