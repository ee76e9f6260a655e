//! Ablations of `smooth` (experimental; evaluation.md, point 9). Each keeps one of smooth's parts
//! and replaces the rest with the baseline's, so a report can say where a gain comes from:
//!
//! - `smooth-no-admission` is [`super::Smooth`] with its door open (`SmoothConfig::admission`);
//! - [`FcfsAdmission`]: fcfs's steps behind smooth's admission;
//! - [`Sarathi`]: fcfs with a stall-free token budget per step.

use super::fcfs::fcfs_plan;
use super::smooth::{fit_len, slice_cost};
use super::{Decisions, Grant, Policy, PolicyContext, SeqView, Smooth, SmoothConfig};
use crate::request::RejectReason;

/// fcfs's plan with smooth's admission at the door.
#[derive(Debug, Clone, Default)]
pub struct FcfsAdmission {
    door: Smooth,
}

impl FcfsAdmission {
    /// The policy.
    pub fn new() -> Self {
        Self { door: Smooth::new(SmoothConfig::default()) }
    }
}

impl Policy for FcfsAdmission {
    fn name(&self) -> &'static str {
        "fcfs-admission"
    }

    fn admit(&mut self, req: &SeqView, ctx: &PolicyContext<'_>) -> Result<(), (RejectReason, f64)> {
        self.door.admit(req, ctx)
    }

    fn wait_scale(&self) -> Option<f64> {
        self.door.wait_scale()
    }

    fn drain_wait_errors(&mut self, out: &mut Vec<f64>) {
        self.door.drain_wait_errors(out);
    }

    fn plan(&mut self, ctx: &PolicyContext<'_>, out: &mut Decisions) {
        // The door learns from the starts that follow its predictions, as in smooth.
        self.door.observe_starts(ctx);
        fcfs_plan(ctx, out, |_| true);
    }
}

/// fcfs in arrival order, with each step's prefill budget cut to what keeps every decoding
/// stream at its reading rate: the step's predicted time (decodes plus prefill chunks) stays
/// within the shortest reading interval `1 / q` among the running streams. With no stream
/// decoding the budget is the configured token budget. Sarathi-Serve fixes one token budget from
/// a TBT target; this derives it per step from the cost model and the readers. No admission.
#[derive(Debug, Clone, Default)]
pub struct Sarathi;

impl Sarathi {
    /// The policy.
    pub fn new() -> Self {
        Sarathi
    }
}

impl Policy for Sarathi {
    fn name(&self) -> &'static str {
        "sarathi"
    }

    fn admit(&mut self, _req: &SeqView, _ctx: &PolicyContext<'_>) -> Result<(), (RejectReason, f64)> {
        Ok(())
    }

    fn plan(&mut self, ctx: &PolicyContext<'_>, out: &mut Decisions) {
        let c = ctx.cost.effective();
        let mut time = c.base_s;
        let mut tokens_left = ctx.max_batch_tokens;
        let mut interval = f64::INFINITY;
        for v in ctx.running.iter().filter(|v| v.uncomputed() == 1) {
            out.grants.push(Grant { id: v.id, tokens: 1, may_preempt: true });
            time += slice_cost(&c, v.num_computed, 1);
            tokens_left = tokens_left.saturating_sub(1);
            interval = interval.min(1.0 / v.class.reading_rate);
        }
        let mut slots = ctx.max_num_seqs.saturating_sub(ctx.running.len());
        let prefills = ctx.running.iter().filter(|v| v.uncomputed() > 1).map(|v| (v, true));
        for (v, running) in prefills.chain(ctx.waiting.iter().map(|v| (v, false))) {
            if tokens_left == 0 || (!running && slots == 0) {
                break;
            }
            let want = v.uncomputed().min(tokens_left);
            let len = fit_len(&c, v.num_computed, want, interval - time);
            if len == 0 || (len < 2 && want > 1) {
                break;
            }
            if !running {
                slots -= 1;
            }
            time += slice_cost(&c, v.num_computed, len);
            tokens_left -= len;
            out.grants.push(Grant { id: v.id, tokens: len, may_preempt: running });
            if len < v.uncomputed() {
                break;
            }
        }
        out.victims.extend(ctx.running.iter().rev().map(|v| v.id));
    }
}
