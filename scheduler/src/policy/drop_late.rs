//! `drop-late`: what binary goodput rewards.
//!
//! Exactly `fcfs`, plus: any request that has already missed its binary SLO is dropped to free
//! its slot and blocks. Missed means: no first token and `now - arrival` past the TTFT limit;
//! a TPOT that is over the limit for certain (see [`missed`]); or `now - arrival` past the E2E
//! limit. With no binary SLO configured it behaves as `fcfs`.

use super::fcfs::fcfs_plan;
use super::{Decisions, Policy, PolicyContext, SeqView};
use crate::request::RejectReason;
use crate::slo::BinarySlo;

/// fcfs that gives up on requests that can no longer pass.
#[derive(Debug, Clone, Default)]
pub struct DropLate;

impl DropLate {
    /// The policy.
    pub fn new() -> Self {
        DropLate
    }
}

/// True when `v` can no longer pass `slo` at `now`, whatever happens next.
///
/// TPOT is an average, so a slow start can still be made up; it is missed for certain once even
/// instant delivery of every remaining token would leave it over the limit: the final TPOT is at
/// least `(t_n - t_1) / (N - 1)` and, while tokens are still to come, at least
/// `(now - t_1) / (N - 1)`, with `N` the most tokens the request can produce.
pub fn missed(v: &SeqView, slo: &BinarySlo, now: f64) -> bool {
    let waited = now - v.arrival;
    let ttft_missed = slo.ttft.is_some_and(|lim| v.first_token_time.is_none() && waited > lim);
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
        let late = |v: &SeqView| missed(v, &ctx.slo.binary, ctx.now);
        out.drop.extend(ctx.running.iter().chain(ctx.waiting).filter(|v| late(v)).map(|v| v.id));
        fcfs_plan(ctx, out, |v| !late(v));
    }
}
