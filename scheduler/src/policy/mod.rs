//! The `Policy` seam: what a policy sees and what it may decide.
//!
//! A policy reads a [`PolicyContext`] (the running and waiting requests as plain [`SeqView`]s,
//! free KV blocks, budgets, the step-cost model, the SLO parameters and `now`) and fills
//! [`Decisions`]: drops, grants of tokens in priority order, and the order in which running
//! requests may be preempted. The shared mechanism in [`crate::Scheduler`] carries them out
//! (allocation, budget limits, preemption, bookkeeping) and never asks which policy runs.

mod drop_late;
mod fcfs;
mod smooth;

pub use drop_late::DropLate;
pub use fcfs::Fcfs;
pub use smooth::{Smooth, SmoothConfig};

use crate::cost::StepCostModel;
use crate::lengths::LengthModel;
use crate::patience::PatienceModel;
use crate::plan::RequestId;
use crate::request::RejectReason;
use crate::slo::{SloClass, SloParams};

/// A read-only snapshot of one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SeqView {
    /// The request.
    pub id: RequestId,
    /// Arrival time.
    pub arrival: f64,
    /// Its reading class.
    pub class: SloClass,
    /// Prompt tokens.
    pub prompt_len: usize,
    /// Of those, tokens the prefix cache held when it started (a waiting request that never
    /// ran: what it would find now). Its prefill costs only `prompt_len - cached_prompt`.
    pub cached_prompt: usize,
    /// Known tokens: prompt plus generated output.
    pub num_tokens: usize,
    /// Tokens in the KV cache.
    pub num_computed: usize,
    /// Output tokens generated (and delivered) so far.
    pub num_output: usize,
    /// Most output tokens it can still reach in total: `min(max_tokens, max_model_len - prompt)`.
    pub max_output: usize,
    /// KV blocks held.
    pub blocks_held: usize,
    /// Engine time of its first output token, if any.
    pub first_token_time: Option<f64>,
    /// Engine time of its latest output token, if any.
    pub last_token_time: Option<f64>,
    /// Largest lateness of its tokens so far (0 if never late).
    pub max_lateness: f64,
    /// Times it was preempted.
    pub num_preemptions: u32,
    /// No stop token can end it (the client set `ignore_eos` and no `stop_token_ids`, as
    /// benchmark clients do): it produces `max_output` tokens unless its client leaves.
    pub runs_to_max: bool,
}

impl SeqView {
    /// Tokens still to compute before it can sample its next token.
    pub fn uncomputed(&self) -> usize {
        self.num_tokens - self.num_computed
    }

    /// Deadline of its next output token.
    pub fn next_deadline(&self) -> f64 {
        self.class.deadline(self.arrival, self.num_output + 1)
    }

    /// Prompt tokens it computes (or computed) itself: those the prefix cache did not hold.
    pub fn uncached_prompt(&self) -> usize {
        self.prompt_len - self.cached_prompt.min(self.prompt_len)
    }

    /// Output tokens still to generate, at most.
    pub fn remaining_output(&self) -> usize {
        self.max_output.saturating_sub(self.num_output)
    }
}

/// What a policy sees.
#[derive(Debug, Clone, Copy)]
pub struct PolicyContext<'a> {
    /// Engine time.
    pub now: f64,
    /// Requests holding a place in the running batch, oldest admission first.
    pub running: &'a [SeqView],
    /// Requests waiting to (re)start, in queue order: preempted first, then by arrival.
    pub waiting: &'a [SeqView],
    /// KV blocks free.
    pub free_blocks: usize,
    /// KV blocks that can ever be handed out.
    pub total_blocks: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Most requests in the running batch.
    pub max_num_seqs: usize,
    /// Most tokens fed in one step.
    pub max_batch_tokens: usize,
    /// Predicted step durations.
    pub cost: &'a StepCostModel,
    /// Output lengths learned from finished requests.
    pub lengths: &'a LengthModel,
    /// Client patience learned from the clients that left.
    pub patience: &'a PatienceModel,
    /// Engine times of the latest ends of requests, in the order they were registered: finished
    /// for any reason, or refused at the door. A closed loop of clients sends its next request
    /// right after one ends.
    pub recent_ends: &'a [f64],
    /// Requests ended so far (the last of them timed in [`Self::recent_ends`]).
    pub ends: u64,
    /// Requests that ran to their end (stop or length) so far.
    pub completed: u64,
    /// Metric parameters.
    pub slo: &'a SloParams,
}

impl PolicyContext<'_> {
    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Output tokens `v` is expected to produce still (learned lengths, at most its room; all
    /// of its room when no stop token can end it).
    pub fn expected_remaining(&self, v: &SeqView) -> f64 {
        if v.runs_to_max {
            return v.max_output.saturating_sub(v.num_output) as f64;
        }
        self.lengths.expected_remaining(v.num_output, v.max_output)
    }
}

/// A grant of up to `tokens` tokens to one request this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The request (running or waiting).
    pub id: RequestId,
    /// Tokens wanted; the mechanism clamps to the uncomputed tokens, the step's token budget
    /// and the blocks it can find.
    pub tokens: usize,
    /// When blocks run short, the mechanism may preempt requests from
    /// [`Decisions::victims`] to serve this grant.
    pub may_preempt: bool,
}

/// What a policy decided for one step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decisions {
    /// Requests to end now with reason `Dropped`.
    pub drop: Vec<RequestId>,
    /// Grants in priority order; earlier grants get budget and blocks first.
    pub grants: Vec<Grant>,
    /// Running requests that may be preempted, first choice first.
    pub victims: Vec<RequestId>,
    /// What the policy's door has seen and done so far (smooth's; `None` for a policy that
    /// refuses nothing of its own), reported with the scheduler's stats.
    pub door: Option<DoorStats>,
}

impl Decisions {
    /// Empty the decisions, keeping capacity.
    pub fn clear(&mut self) {
        self.drop.clear();
        self.grants.clear();
        self.victims.clear();
        self.door = None;
    }
}

/// What smooth's door has seen and done (docs/scheduler.md, rule 1), counted since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DoorStats {
    /// Whether the latest arrival found the demand over what the batch serves (sustained
    /// overload).
    pub overloaded: bool,
    /// Arrivals judged.
    pub arrivals: u64,
    /// Of those, the ones that found the demand over capacity.
    pub overloaded_arrivals: u64,
    /// Arrivals within moments of the end of another request (finished, left or refused):
    /// closed-loop clients answering it, not counted as new demand.
    pub returns: u64,
    /// Refused for the wait they would add under sustained overload.
    pub refused: u64,
}

/// A scheduling policy. Implementations decide; they never allocate blocks or touch requests.
pub trait Policy: Send {
    /// The name it is chosen by.
    fn name(&self) -> &'static str;

    /// Admission at the door, after the mechanism's own checks (length, queue limits).
    /// `Err((reason, retry_after_s))` refuses the request before it produces anything.
    fn admit(&mut self, req: &SeqView, ctx: &PolicyContext<'_>) -> Result<(), (RejectReason, f64)>;

    /// Decide one step.
    fn plan(&mut self, ctx: &PolicyContext<'_>, out: &mut Decisions);
}

/// Every policy [`by_name`] accepts by a plain name: `smooth`, `fcfs` (the vLLM-style baseline)
/// and `drop-late` (what binary goodput rewards).
pub const ALL_POLICY_NAMES: [&str; 3] = ["smooth", "fcfs", "drop-late"];

/// smooth's configuration keys (`smooth:KEY=VALUE:...`, see [`by_name`]): its four rules, each
/// switched off by 0 for an ablation, and the door's two quantities.
pub const SMOOTH_KEYS: [&str; 6] = ["door", "start", "chunk", "order", "max_loss", "window_s"];

/// smooth with some of its configuration set: `KEY=VALUE` pairs separated by `:` (keys in
/// [`SMOOTH_KEYS`]; the rules 0 or 1, `max_loss` in `[0, 1]`, `window_s` positive). `None` if
/// any pair is not one of those.
pub fn smooth_variant(spec: &str) -> Option<SmoothConfig> {
    let mut c = SmoothConfig::default();
    for kv in spec.split(':') {
        let (k, v) = kv.split_once('=')?;
        let v = v.trim().parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)?;
        let flag = || (v == 0.0 || v == 1.0).then_some(v == 1.0);
        match k.trim() {
            "door" => c.door = flag()?,
            "start" => c.start = flag()?,
            "chunk" => c.chunk = flag()?,
            "order" => c.order = flag()?,
            "max_loss" if v <= 1.0 => c.max_loss = v,
            "window_s" if v > 0.0 => c.window_s = v,
            _ => return None,
        }
    }
    Some(c)
}

/// A policy by name: one of [`ALL_POLICY_NAMES`], or smooth with some of its configuration set
/// (`smooth:door=0`, `smooth:max_loss=0.05:window_s=30`; [`smooth_variant`]).
pub fn by_name(name: &str) -> Option<Box<dyn Policy>> {
    if let Some(spec) = name.strip_prefix("smooth:") {
        return smooth_variant(spec).map(|c| Box::new(Smooth::new(c)) as Box<dyn Policy>);
    }
    match name {
        "smooth" => Some(Box::new(Smooth::new(SmoothConfig::default()))),
        "fcfs" => Some(Box::new(Fcfs::new())),
        "drop-late" => Some(Box::new(DropLate::new())),
        _ => None,
    }
}

/// A policy name from a command line, checked with [`by_name`].
pub fn parse_name(s: &str) -> Result<String, String> {
    if by_name(s).is_some() {
        Ok(s.to_string())
    } else {
        Err(format!(
            "unknown policy `{s}`: expected one of {}, or smooth:KEY=VALUE[:KEY=VALUE...] with KEY one of {}",
            ALL_POLICY_NAMES.join(", "),
            SMOOTH_KEYS.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smooth_variants_set_constants_and_nothing_else_parses() {
        let c = smooth_variant("max_loss=0.05:door=0").unwrap();
        assert_eq!((c.max_loss, c.door), (0.05, false));
        assert_eq!((c.start, c.chunk, c.order, c.window_s), (true, true, true, SmoothConfig::default().window_s));
        assert!(by_name("smooth:window_s=5").is_some());
        for bad in ["smooth:", "smooth:max_loss=1.5", "smooth:door=0.5", "smooth:window_s=0", "smooth:nope=1", "smooth:max_loss=nan", "fcfs:x=1"] {
            assert!(by_name(bad).is_none(), "{bad}");
            assert!(parse_name(bad).is_err());
        }
        for name in ALL_POLICY_NAMES {
            assert_eq!(parse_name(name).as_deref(), Ok(name));
        }
    }
}
