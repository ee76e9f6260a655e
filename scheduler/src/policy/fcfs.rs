//! `fcfs`: the baseline a vLLM user knows.
//!
//! Admission in arrival order (preempted requests first), decodes first, then prefill chunks of
//! running and then waiting requests up to the step's token budget; when blocks run out, the
//! newest running request is preempted (recompute). It never drops and never rejects beyond the
//! mechanism's queue limits.

use super::{Decisions, Grant, Policy, PolicyContext, SeqView};
use crate::request::RejectReason;

/// First come, first served.
#[derive(Debug, Clone, Default)]
pub struct Fcfs;

impl Fcfs {
    /// The policy.
    pub fn new() -> Self {
        Fcfs
    }
}

impl Policy for Fcfs {
    fn name(&self) -> &'static str {
        "fcfs"
    }

    fn admit(&mut self, _req: &SeqView, _ctx: &PolicyContext<'_>) -> Result<(), (RejectReason, f64)> {
        Ok(())
    }

    fn plan(&mut self, ctx: &PolicyContext<'_>, out: &mut Decisions) {
        fcfs_plan(ctx, out, |_| true, |_| true, |v| v.uncomputed());
    }
}

/// The fcfs plan over the requests `keep` accepts, starting waiting ones in queue order while
/// `start` agrees, each prefill getting the tokens `chunk` grants it, in order (0 ends the
/// step's prefill). drop-late reuses it without its drops, within its TPOT room and step cap.
pub(super) fn fcfs_plan(
    ctx: &PolicyContext<'_>,
    out: &mut Decisions,
    keep: impl Fn(&SeqView) -> bool,
    mut start: impl FnMut(&SeqView) -> bool,
    mut chunk: impl FnMut(&SeqView) -> usize,
) {
    let grant = |v: &SeqView, tokens, may_preempt| Grant { id: v.id, tokens, may_preempt };
    let live = |v: &&SeqView| v.uncomputed() > 0 && keep(v);
    out.grants.extend(ctx.running.iter().filter(live).filter(|v| v.uncomputed() == 1).map(|v| grant(v, 1, true)));
    let mut open = true;
    for v in ctx.running.iter().filter(live).filter(|v| v.uncomputed() > 1) {
        let n = chunk(v);
        if n == 0 {
            open = false;
            break;
        }
        out.grants.push(grant(v, n, true));
    }
    // Waiting requests beyond what one step can start are left out: the mechanism would skip
    // them anyway, and the queue can be long.
    let mut tokens = 0;
    let mut slots = ctx.max_num_seqs.saturating_sub(ctx.running.len());
    for v in ctx.waiting.iter().filter(live) {
        if !open || tokens >= ctx.max_batch_tokens || slots == 0 || !start(v) {
            break;
        }
        let n = chunk(v);
        if n == 0 {
            break;
        }
        tokens += n;
        slots -= 1;
        out.grants.push(grant(v, n, false));
    }
    out.victims.extend(ctx.running.iter().rev().map(|v| v.id));
}
