//! The `Policy` seam: what a policy sees and what it may decide.
//!
//! A policy reads a [`PolicyContext`] (the running and waiting requests as plain [`SeqView`]s,
//! free KV blocks, budgets, the step-cost model, the SLO parameters and `now`) and fills
//! [`Decisions`]: drops, grants of tokens in priority order, and the order in which running
//! requests may be preempted. The shared mechanism in [`crate::Scheduler`] carries them out
//! (allocation, budget limits, preemption, bookkeeping) and never asks which policy runs.

mod ablations;
mod drop_late;
mod fcfs;
mod feed_control;
mod offered;
mod population;
mod smooth;
mod wait_calibration;

pub use ablations::{FcfsAdmission, Sarathi};
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

    /// A request that arrived at `arrival` with a `prompt`-token prompt and has not started
    /// (default class, room for `max_output` tokens): the policies' unit tests build on it.
    #[cfg(test)]
    pub(crate) fn waiting(id: RequestId, arrival: f64, prompt: usize, max_output: usize) -> Self {
        SeqView {
            id,
            arrival,
            class: SloClass::default(),
            prompt_len: prompt,
            cached_prompt: 0,
            num_tokens: prompt,
            num_computed: 0,
            num_output: 0,
            max_output,
            blocks_held: 0,
            first_token_time: None,
            last_token_time: None,
            max_lateness: 0.0,
            num_preemptions: 0,
        }
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
    /// Engine time of the latest end of a request: finished for any reason, or refused at the
    /// door (`-inf` before the first). A closed loop of clients sends its next request right
    /// after one ends.
    pub last_end: f64,
    /// Requests ended so far (the count behind [`Self::last_end`]).
    pub ends: u64,
    /// Metric parameters.
    pub slo: &'a SloParams,
}

impl PolicyContext<'_> {
    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Output tokens `v` is expected to produce still (learned lengths, at most its room).
    pub fn expected_remaining(&self, v: &SeqView) -> f64 {
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
}

impl Decisions {
    /// Empty the decisions, keeping capacity.
    pub fn clear(&mut self) {
        self.drop.clear();
        self.grants.clear();
        self.victims.clear();
    }
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

    /// The scale its feed limit has learned from what its running streams got (smooth's
    /// [`SmoothConfig::feed_target`]); `None` for a policy without one.
    fn feed_scale(&self) -> Option<f64> {
        None
    }

    /// What its door multiplies its predicted waits by, learned from the starts that followed
    /// (smooth's [`SmoothConfig::calibrate`]); `None` for a policy without one.
    fn wait_scale(&self) -> Option<f64> {
        None
    }

    /// What its borrowing from the readers' buffers did (smooth's [`SmoothConfig::borrow`]);
    /// `None` for a policy that does not borrow.
    fn borrowing(&self) -> Option<Borrowing> {
        None
    }

    /// Moves into `out` the door's predicted over actual waits of the requests that started
    /// since the last call (smooth's [`SmoothConfig::calibrate`]; the raw prediction, before the
    /// scale).
    fn drain_wait_errors(&mut self, _out: &mut Vec<f64>) {}
}

/// What smooth's borrowing from the readers' buffers did ([`SmoothConfig::borrow`]): it starts
/// a waiting request past the feed limit on the running streams' buffers, only outside
/// sustained overload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Borrowing {
    /// Whether the door judged the latest arrival's offered load a sustained overload.
    pub overloaded: bool,
    /// Arrivals the door has judged, so far.
    pub arrivals: u64,
    /// Of those, the ones it judged under sustained overload.
    pub overloaded_arrivals: u64,
    /// Waiting requests started past the feed limit on the buffers, so far.
    pub starts: u64,
}

/// Every name [`by_name`] accepts, the one list of them: the policies (`smooth`, `fcfs`, the
/// baseline, and `drop-late`), then the ablations, experimental, each isolating one part of
/// smooth's gain (evaluation.md, point 9):
/// - `smooth-no-admission`: smooth's step planning, admitting everything;
/// - `smooth-no-feed-limit`: smooth starting whatever fits the batch, not only what it can keep
///   at its readers' rates (its door still predicts with the limit);
/// - `fcfs-admission`: fcfs's steps behind smooth's admission;
/// - `sarathi`: fcfs with a per-step token budget, the largest whose predicted step time keeps
///   every running stream at its reading rate (Sarathi-Serve's stall-free budget, derived from
///   the readers instead of a fixed TBT target).
pub const ALL_POLICY_NAMES: [&str; 7] =
    ["smooth", "fcfs", "drop-late", "smooth-no-admission", "smooth-no-feed-limit", "fcfs-admission", "sarathi"];

/// smooth's constants that a name can set (`smooth:KEY=VALUE:...`, see [`by_name`]).
pub const SMOOTH_KEYS: [&str; 17] = [
    "horizon_steps",
    "admit_max_loss",
    "starvation_s",
    "min_chunk_fraction",
    "feed_quantile",
    "race",
    "capped_slack",
    "end_by_benefit",
    "displace",
    "feed_target",
    "sustained",
    "race_all",
    "door_patience",
    "externality",
    "calibrate",
    "queue_places",
    "borrow",
];

/// smooth with some of its constants set: `KEY=VALUE` pairs separated by `:` (keys in
/// [`SMOOTH_KEYS`]; fractions in `[0, 1]`, the others finite and non-negative). `None` if any
/// pair is not one of those.
pub fn smooth_variant(spec: &str) -> Option<SmoothConfig> {
    let mut c = SmoothConfig::default();
    for kv in spec.split(':') {
        let (k, v) = kv.split_once('=')?;
        let v = v.trim().parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)?;
        match k.trim() {
            "horizon_steps" => c.horizon_steps = v,
            "admit_max_loss" => c.admit_max_loss = v,
            "starvation_s" => c.starvation_s = v,
            "min_chunk_fraction" if v <= 1.0 => c.min_chunk_fraction = v,
            "feed_quantile" if v <= 1.0 => c.feed_quantile = v,
            "race" => c.race = v > 0.0,
            "capped_slack" if v >= 1.0 => c.capped_slack = v,
            "end_by_benefit" => c.end_by_benefit = v > 0.0,
            "displace" => c.displace = v > 0.0,
            "feed_target" => c.feed_target = v,
            "sustained" => c.sustained = v > 0.0,
            "race_all" => c.race_all = v > 0.0,
            "door_patience" => c.door_patience = v > 0.0,
            "externality" => c.externality = v > 0.0,
            "calibrate" => c.calibrate = v > 0.0,
            "queue_places" => c.queue_places = v,
            "borrow" => c.borrow = v > 0.0,
            _ => return None,
        }
    }
    Some(c)
}

/// A policy by name: one of [`ALL_POLICY_NAMES`], or smooth with some of its constants set, for
/// ablating them: `smooth:admit_max_loss=0.05:feed_quantile=0.75` ([`smooth_variant`]).
pub fn by_name(name: &str) -> Option<Box<dyn Policy>> {
    if let Some(spec) = name.strip_prefix("smooth:") {
        return smooth_variant(spec).map(|c| Box::new(Smooth::new(c)) as Box<dyn Policy>);
    }
    match name {
        "smooth" => Some(Box::new(Smooth::new(SmoothConfig::default()))),
        "fcfs" => Some(Box::new(Fcfs::new())),
        "drop-late" => Some(Box::new(DropLate::new())),
        "smooth-no-admission" => Some(Box::new(Smooth::new(SmoothConfig { admission: false, ..SmoothConfig::default() }))),
        "smooth-no-feed-limit" => Some(Box::new(Smooth::new(SmoothConfig { feed_limit: false, ..SmoothConfig::default() }))),
        "fcfs-admission" => Some(Box::new(FcfsAdmission::new())),
        "sarathi" => Some(Box::new(Sarathi::new())),
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
        let c = smooth_variant("admit_max_loss=0.05:feed_quantile=0.75").unwrap();
        assert_eq!((c.admit_max_loss, c.feed_quantile), (0.05, 0.75));
        assert_eq!(c.horizon_steps, SmoothConfig::default().horizon_steps);
        assert!(by_name("smooth:starvation_s=5").is_some());
        for bad in ["smooth:", "smooth:feed_quantile=1.5", "smooth:admit_max_loss=-1", "smooth:nope=1", "smooth:admit_max_loss=nan", "fcfs:x=1"] {
            assert!(by_name(bad).is_none(), "{bad}");
            assert!(parse_name(bad).is_err());
        }
        for name in ALL_POLICY_NAMES {
            assert_eq!(parse_name(name).as_deref(), Ok(name));
        }
    }
}
