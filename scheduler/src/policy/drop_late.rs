//! `drop-late`: what binary goodput rewards.
//!
//! `fcfs`, plus two things binary goodput asks for under sustained overload:
//! - any request that has missed its binary SLO, or that can no longer make its TTFT (waiting,
//!   with less time left than its own prefill takes at a full step), is dropped to free its
//!   slot and blocks. Missed means: no first token and `now - arrival` past the TTFT limit; a
//!   TPOT that is over the limit for certain (see [`missed`]); or `now - arrival` past the E2E
//!   limit;
//! - with a TPOT limit, a waiting request starts only while the batch's predicted time per
//!   output token with it (its decode step, plus the prefill its streams' replacements need per
//!   step) stays within that limit: a batch past it makes every stream miss together (in long
//!   overloaded runs fcfs's, and without this drop-late's, binary goodput fell to 0);
//! - and, as Sarathi-Serve sizes its token budget from the TBT limit, a step that decodes for
//!   someone takes only the prefill that keeps its predicted time within [`STEP_SHARE`] of the
//!   TPOT limit, so no stream's TPOT is pushed over by the prefill of others.
//!
//! With no binary SLO configured it behaves as `fcfs`.

use super::fcfs::fcfs_plan;
use super::smooth::prefill_per_token;
use super::{Decisions, Policy, PolicyContext, SeqView};
use crate::cost::StepShape;
use crate::request::RejectReason;
use crate::slo::BinarySlo;

/// The share of the TPOT limit a step with decodes in it may take (the rest absorbs the step
/// model's error).
pub const STEP_SHARE: f64 = 0.9;

/// fcfs that gives up on requests that can no longer pass.
#[derive(Debug, Clone, Default)]
pub struct DropLate;

impl DropLate {
    /// The policy.
    pub fn new() -> Self {
        DropLate
    }
}

/// True when `v` can no longer pass `slo` at `now`, whatever happens next: its first token
/// came (or can come) after the TTFT limit, its TPOT is over the limit for certain, or its E2E
/// latency is.
///
/// TPOT is an average, so a slow start can still be made up; it is missed for certain once even
/// instant delivery of every remaining token would leave it over the limit: the final TPOT is at
/// least `(t_n - t_1) / (N - 1)` and, while tokens are still to come, at least
/// `(now - t_1) / (N - 1)`, with `N` the most tokens the request can produce.
pub fn missed(v: &SeqView, slo: &BinarySlo, now: f64) -> bool {
    let waited = now - v.arrival;
    let ttft_missed = slo.ttft.is_some_and(|lim| v.first_token_time.unwrap_or(now) - v.arrival > lim);
    let tpot_missed = match (slo.tpot, v.first_token_time) {
        (Some(lim), Some(first)) if v.max_output >= 2 => {
            let last = if v.num_output < v.max_output { now } else { v.last_token_time.unwrap_or(now) };
            (last - first) / (v.max_output - 1) as f64 > lim
        }
        _ => false,
    };
    let e2e_missed = slo.e2el.is_some_and(|lim| waited > lim);
    ttft_missed || tpot_missed || e2e_missed
}

impl Policy for DropLate {
    fn name(&self) -> &'static str {
        "drop-late"
    }

    fn admit(&mut self, _req: &SeqView, _ctx: &PolicyContext<'_>) -> Result<(), (RejectReason, f64)> {
        Ok(())
    }

    fn plan(&mut self, ctx: &PolicyContext<'_>, out: &mut Decisions) {
        let slo = &ctx.slo.binary;
        // Its own prefill, in chunks of the token budget: a waiting request with less time than
        // that left before its TTFT limit cannot make it.
        let full = ctx.max_batch_tokens.max(1);
        let prefill = |n: usize| ctx.cost.predict(&StepShape { prefill_tokens: n, kv_tokens: n, ..Default::default() });
        let hopeless = |v: &SeqView| {
            let n = v.uncomputed();
            let own = (n / full) as f64 * prefill(full) + prefill(n % full);
            v.first_token_time.is_none() && slo.ttft.is_some_and(|lim| ctx.now + own > v.arrival + lim)
        };
        let late = |v: &SeqView| missed(v, slo, ctx.now) || hopeless(v);
        out.drop.extend(ctx.running.iter().chain(ctx.waiting).filter(|v| late(v)).map(|v| v.id));
        // Starts only while the batch's time per output token stays within the TPOT limit: its
        // decode step, plus the prefill its streams' replacements need per step (`kappa`
        // seconds per output token, as smooth prices it).
        let kappa = prefill_per_token(&ctx.cost.effective(), ctx, None);
        let mut shape = StepShape::default();
        for v in ctx.running {
            shape.add_slice(v.num_tokens, 1);
        }
        let room = |v: &SeqView| {
            let Some(lim) = slo.tpot else { return true };
            let mut with = shape;
            with.add_slice(v.num_tokens, 1);
            let fits = shape.decode_seqs == 0 || ctx.cost.predict(&with) + with.decode_seqs as f64 * kappa <= lim;
            if fits {
                shape = with;
            }
            fits
        };
        // This step's prefill: what keeps its predicted time within the step cap, granted in
        // order, when anyone decodes in it (a step without decodes delays no one's next token).
        let mut step = StepShape::default();
        for v in ctx.running.iter().filter(|v| v.uncomputed() == 1 && !late(v)) {
            step.add_slice(v.num_computed, 1);
        }
        let cap = slo.tpot.map(|lim| STEP_SHARE * lim).filter(|_| step.decode_seqs > 0);
        let chunk = |v: &SeqView| {
            let Some(cap) = cap else { return v.uncomputed() };
            let with = |n: usize| {
                let mut s = step;
                s.add_slice(v.num_computed, n);
                s
            };
            // The largest chunk within the cap (the predicted time grows with the chunk).
            let (mut lo, mut hi) = (0, v.uncomputed());
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                if ctx.cost.predict(&with(mid)) <= cap {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            if lo > 0 {
                step = with(lo);
            }
            lo
        };
        fcfs_plan(ctx, out, |v| !late(v), room, chunk);
    }
}
