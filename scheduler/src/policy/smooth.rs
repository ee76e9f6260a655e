//! `smooth`: schedule for the user's reading buffer, admit only what can be served.
//!
//! # What it optimises
//!
//! Smooth goodput (metrics.md) is `sum_r (n_r - alpha * f(l_r)) / window`, where a user's idle
//! latency `l_r` is the largest lateness of a token against its reading deadline
//! `d_i = a + g + i / q`. Two facts shape the policy:
//!
//! 1. A stream that is ahead of its reader has *slack*: `d_{n+1} - now`, the time before its
//!    reader runs dry. A token delivered before its deadline earns nothing extra; one delivered
//!    after it costs `alpha * f` of the lateness. So each step only has to serve the streams
//!    whose buffers are shallow, and every other token can wait.
//! 2. Under overload the served rate is fixed by capacity, so every admitted request that waits
//!    long for its first token costs benefit without adding throughput: the queue, not the
//!    batch, is where smooth goodput is lost. A rejected request scores zero; a request admitted
//!    into a long queue scores `n - alpha * f(wait)` and delays everyone behind it.
//!
//! # One step
//!
//! 1. Slack of every decode-ready stream, `d_{n+1} - now`. With `T_full`, the predicted time of a
//!    full step, a stream is *due* when its slack is under `horizon_steps * T_full`: if it sat
//!    out this step it could run dry before the next one ends. Others have deep buffers.
//! 2. The step's time cap is the shallowest due buffer (but never below the time of the due
//!    decodes plus a minimum prefill chunk, so prefill always progresses): the step ends before
//!    the first reader runs dry. Nothing due means no cap but the token budget.
//! 3. Grants, in order, each within the token budget and the time cap (checked with the step-cost
//!    model): due decodes, shallowest first; a minimum prefill chunk; deep-buffer decodes,
//!    shallowest first; then the rest of the prefill. So the prefill chunk is as large as the
//!    shallowest buffer allows (large when everyone is well ahead, small when a stream is about
//!    to run dry) and deep buffers skip a step when the cap or the budget binds.
//! 4. Prefill candidates (running prompts, preempted recomputes, waiting requests) go in the
//!    order of the modified due date `max(d_{n+1}, now + p)`, `p` the predicted prefill time: it
//!    is earliest-deadline-first while requests can still be on time, shortest-first once they
//!    are late (which minimises total lateness), and a request waiting longer than
//!    `starvation_s` goes ahead in deadline order, so long prompts are not starved.
//! 5. When blocks run out, the deepest buffer is preempted first (it is recomputed later, when
//!    its reader has caught up), instead of fcfs's newest request.
//!
//! # Admission
//!
//! At the door the policy predicts the new request's first-token time: the prefill tokens ahead
//! of it in the queue at the rate of full steps with the current decodes, or, when the running
//! batch is full, the time until enough running streams finish. That gives its predicted idle
//! latency `l` and its predicted benefit `n - alpha * f(l)`, with `n` the most tokens it can
//! produce. A request whose predicted benefit is negative is rejected. So is one whose benefit,
//! net of what it displaces, is negative: admitting a request that will wait behind others means
//! that, for as long as the overload lasts, some later request is served later too, so the loss
//! *caused by queueing* (its loss at the predicted wait minus its loss if it were served alone,
//! which no policy could avoid) may be at most `admit_max_loss * n` (default 2%), or the loss of
//! waiting `admit_queue_slots` (default 4) times its own prefill, whichever is larger. A rejection
//! carries a Retry-After of the predicted excess wait. Below
//! saturation the predicted wait is a step or two and nobody is rejected; above it the queue is
//! held at the wait where the loss reaches that margin, which keeps the batch full (throughput)
//! while admitted users wait seconds, not minutes. It never drops a started stream.

use std::cmp::Ordering;

use super::{Decisions, Grant, Policy, PolicyContext, SeqView};
use crate::cost::{pairs, CostCoeffs, StepShape};
use crate::request::RejectReason;
use crate::slo::Penalty;

/// Tuning knobs of [`Smooth`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SmoothConfig {
    /// A stream is due when its slack is below this many predicted full steps.
    pub horizon_steps: f64,
    /// Most predicted loss `alpha * f(l)`, as a fraction of the request's tokens, accepted at the
    /// door.
    pub admit_max_loss: f64,
    /// Queueing always tolerated at the door, in units of the request's own prefill time: a
    /// queue a few requests deep keeps the server busy through bursts and costs little. On a
    /// fast GPU the fraction above dominates; on a CPU, where one prefill takes as long as a
    /// reader's whole buffer, this does.
    pub admit_queue_slots: f64,
    /// A request waiting longer than this (seconds) is prefilled in deadline order ahead of
    /// the others.
    pub starvation_s: f64,
    /// Smallest prefill chunk while a stream is about to run dry, as a fraction of the token
    /// budget.
    pub min_chunk_fraction: f64,
    /// Refuse requests at the door by predicted benefit; `false` admits everything (the
    /// `smooth-no-admission` ablation).
    pub admission: bool,
}

impl Default for SmoothConfig {
    fn default() -> Self {
        Self {
            horizon_steps: 3.0,
            admit_max_loss: 0.02,
            admit_queue_slots: 4.0,
            starvation_s: 2.0,
            min_chunk_fraction: 0.25,
            admission: true,
        }
    }
}

/// The smooth policy.
#[derive(Debug, Clone, Default)]
pub struct Smooth {
    cfg: SmoothConfig,
    /// Decode-ready running requests: (slack, index into `running`).
    ready: Vec<(f64, usize)>,
    /// Prefill candidates: (priority key, is running, index).
    cands: Vec<(f64, bool, usize)>,
    /// Remaining output of running requests (admission scratch).
    remaining: Vec<usize>,
}

impl Smooth {
    /// The policy with `cfg`.
    pub fn new(cfg: SmoothConfig) -> Self {
        Self { cfg, ..Default::default() }
    }
}

/// Cost of adding a slice of `len` tokens at `start` to a step.
pub(super) fn slice_cost(c: &CostCoeffs, start: usize, len: usize) -> f64 {
    if len == 1 {
        c.per_decode_seq_s + c.per_kv_token_s * (start + 1) as f64
    } else {
        c.per_prefill_token_s * len as f64 + c.per_kv_token_s * (start + len) as f64 + c.per_attn_pair_s * pairs(start, len)
    }
}

/// Longest `len <= max` whose slice cost fits `time` (0 if none).
pub(super) fn fit_len(c: &CostCoeffs, start: usize, max: usize, time: f64) -> usize {
    if max == 0 || slice_cost(c, start, 1.min(max)) > time {
        return 0;
    }
    let (mut lo, mut hi) = (1, max);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if slice_cost(c, start, mid) <= time {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Seconds of idle latency at which `alpha * f(l)` reaches `loss` (infinite if never).
fn idle_for_loss(penalty: Penalty, alpha: f64, loss: f64) -> f64 {
    let f = loss / alpha.max(1e-12);
    match penalty {
        Penalty::Linear => f,
        Penalty::Quadratic => f.sqrt(),
        Penalty::Capped(cap) if f < 1.0 => f * cap,
        Penalty::Capped(_) => f64::INFINITY,
    }
}

impl Smooth {
    /// Shape and time of a full step with the current decodes: (prefill tokens, seconds).
    fn full_step(ctx: &PolicyContext<'_>, decodes: usize, decode_kv: usize) -> (usize, f64) {
        let mut shape = StepShape { decode_seqs: decodes, kv_tokens: decode_kv, ..Default::default() };
        let chunk = ctx.max_batch_tokens.saturating_sub(decodes).max(ctx.max_batch_tokens / 4).max(2);
        shape.add_slice(0, chunk);
        (chunk, ctx.cost.predict(&shape).max(1e-6))
    }
}

impl Policy for Smooth {
    fn name(&self) -> &'static str {
        if self.cfg.admission {
            "smooth"
        } else {
            "smooth-no-admission"
        }
    }

    fn admit(&mut self, req: &SeqView, ctx: &PolicyContext<'_>) -> Result<(), (RejectReason, f64)> {
        if !self.cfg.admission {
            return Ok(());
        }
        let decodes = ctx.running.iter().filter(|v| v.uncomputed() == 1);
        let (n_dec, kv_dec) = decodes.fold((0, 0), |(n, kv), v| (n + 1, kv + v.num_tokens));
        let (chunk, t_full) = Self::full_step(ctx, n_dec, kv_dec);
        let rate = chunk as f64 / t_full;
        let ahead: usize = ctx.running.iter().chain(ctx.waiting).filter(|v| v.uncomputed() > 1).map(|v| v.uncomputed()).sum();
        // The request's own prefill: full chunks, then a last step holding the remainder with
        // the current decodes (alone: without them). An idle server answers a short prompt in
        // one short step, not in a full-budget one.
        let own_time = |with_decodes: bool| -> f64 {
            let own = req.uncomputed();
            let full = own.saturating_sub(1) / chunk;
            let rest = own - full * chunk;
            let mut last = if with_decodes { StepShape { decode_seqs: n_dec, kv_tokens: kv_dec, ..Default::default() } } else { StepShape::default() };
            last.add_slice(full * chunk, rest);
            full as f64 * t_full + ctx.cost.predict(&last)
        };
        let own = own_time(true);
        let mut wait = ahead as f64 / rate + own;
        // A full batch: the request starts when enough running streams finish, one token a step.
        let over = (ctx.running.len() + ctx.waiting.len() + 1).saturating_sub(ctx.max_num_seqs);
        if over > 0 && !ctx.running.is_empty() {
            self.remaining.clear();
            self.remaining.extend(ctx.running.iter().map(|v| v.remaining_output().max(1)));
            let rounds = (over - 1) / self.remaining.len();
            let k = (over - 1) % self.remaining.len();
            let longest = *self.remaining.iter().max().unwrap_or(&1);
            let kth = *self.remaining.select_nth_unstable(k).1;
            let steps = rounds * longest + kth;
            wait = wait.max(steps as f64 * t_full + own);
        }
        let deadline = req.next_deadline();
        let idle = (ctx.now + wait - deadline).max(0.0);
        // What it would lose alone on the machine is no reason to refuse it: no policy can do
        // better. The margin applies to the loss caused by waiting behind others.
        let alone = own_time(false);
        let idle_alone = (ctx.now + alone - deadline).max(0.0);
        let slo = ctx.slo;
        let n = req.remaining_output();
        let max_loss = (self.cfg.admit_max_loss * n as f64).max(slo.alpha * slo.penalty.apply(self.cfg.admit_queue_slots * alone));
        let queue_loss = slo.benefit(n, idle_alone) - slo.benefit(n, idle);
        if slo.benefit(n, idle) < 0.0 || queue_loss > max_loss {
            let base = slo.alpha * slo.penalty.apply(idle_alone);
            let ok_idle = idle_for_loss(slo.penalty, slo.alpha, base + max_loss).min(idle_for_loss(slo.penalty, slo.alpha, n as f64));
            return Err((RejectReason::PredictedLate, (idle - ok_idle).max(t_full)));
        }
        Ok(())
    }

    fn plan(&mut self, ctx: &PolicyContext<'_>, out: &mut Decisions) {
        let now = ctx.now;
        let c = ctx.cost.coeffs();
        self.ready.clear();
        self.cands.clear();
        let mut kv_dec = 0;
        for (i, v) in ctx.running.iter().enumerate() {
            match v.uncomputed() {
                0 => {}
                1 => {
                    self.ready.push((v.next_deadline() - now, i));
                    kv_dec += v.num_tokens;
                }
                _ => self.cands.push((0.0, true, i)),
            }
        }
        self.cands.extend((0..ctx.waiting.len()).map(|i| (0.0, false, i)));
        let (chunk, t_full) = Self::full_step(ctx, self.ready.len(), kv_dec);
        let rate = chunk as f64 / t_full;
        for cand in &mut self.cands {
            let v = if cand.1 { &ctx.running[cand.2] } else { &ctx.waiting[cand.2] };
            let d = v.next_deadline();
            cand.0 = if now - v.arrival > self.cfg.starvation_s {
                d - 1e9
            } else {
                d.max(now + v.uncomputed() as f64 / rate)
            };
        }
        self.cands.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
        self.ready.sort_unstable_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(Ordering::Equal));

        let horizon = self.cfg.horizon_steps * t_full;
        let n_due = self.ready.partition_point(|&(slack, _)| slack < horizon);
        let min_chunk = ((ctx.max_batch_tokens as f64 * self.cfg.min_chunk_fraction) as usize).max(ctx.block_size);

        let mut tokens_left = ctx.max_batch_tokens;
        let mut time = c.base_s;
        for &(_, i) in &self.ready[..n_due] {
            let v = &ctx.running[i];
            out.grants.push(Grant { id: v.id, tokens: 1, may_preempt: true });
            time += slice_cost(&c, v.num_computed, 1);
            tokens_left = tokens_left.saturating_sub(1);
        }
        // The time cap: the shallowest due buffer, but room for a minimum chunk.
        let cap = if n_due > 0 {
            let floor = time + slice_cost(&c, 0, min_chunk.min(tokens_left).max(2));
            self.ready[0].0.max(floor)
        } else {
            f64::INFINITY
        };

        let mut slots = ctx.max_num_seqs.saturating_sub(ctx.running.len());
        let mut next_cand = 0;
        let mut partial: Option<(usize, usize)> = None; // (grant index, tokens granted) of a cut chunk
        let mut prefill = |limit_tokens: usize, time: &mut f64, tokens_left: &mut usize, out: &mut Decisions| {
            let mut given = 0;
            if let Some((gi, granted)) = partial.take() {
                let g = &mut out.grants[gi];
                let v = find(ctx, g.id);
                let room = (v.uncomputed() - granted).min(*tokens_left).min(limit_tokens);
                let cost_now = slice_cost(&c, v.num_computed, granted);
                let more = fit_len(&c, v.num_computed, granted + room, cap - *time + cost_now).saturating_sub(granted);
                if more > 0 {
                    *time += slice_cost(&c, v.num_computed, granted + more) - cost_now;
                    g.tokens += more;
                    *tokens_left -= more;
                    given += more;
                }
                if granted + more < v.uncomputed() {
                    partial = Some((gi, granted + more));
                    return;
                }
            }
            while next_cand < self.cands.len() && given < limit_tokens && *tokens_left > 0 {
                let (_, running, i) = self.cands[next_cand];
                let v = if running { &ctx.running[i] } else { &ctx.waiting[i] };
                if !running && slots == 0 {
                    next_cand = self.cands.len();
                    break;
                }
                let want = v.uncomputed().min(*tokens_left).min(limit_tokens - given);
                let len = fit_len(&c, v.num_computed, want, cap - *time);
                if len < 2 && v.uncomputed() > 1 {
                    break;
                }
                next_cand += 1;
                if !running {
                    slots -= 1;
                }
                *time += slice_cost(&c, v.num_computed, len);
                *tokens_left -= len;
                given += len;
                out.grants.push(Grant { id: v.id, tokens: len, may_preempt: running });
                if len < v.uncomputed() {
                    partial = Some((out.grants.len() - 1, len));
                    break;
                }
            }
        };
        if n_due > 0 {
            prefill(min_chunk, &mut time, &mut tokens_left, out);
        }
        for &(_, i) in &self.ready[n_due..] {
            let v = &ctx.running[i];
            let dt = slice_cost(&c, v.num_computed, 1);
            if tokens_left == 0 || time + dt > cap {
                break;
            }
            out.grants.push(Grant { id: v.id, tokens: 1, may_preempt: true });
            time += dt;
            tokens_left -= 1;
        }
        prefill(usize::MAX, &mut time, &mut tokens_left, out);

        // Deepest buffers are preempted first.
        out.victims.extend(self.ready.iter().rev().map(|&(_, i)| ctx.running[i].id));
        out.victims.extend(ctx.running.iter().filter(|v| v.uncomputed() != 1).rev().map(|v| v.id));
    }
}

fn find<'a>(ctx: &'a PolicyContext<'_>, id: u64) -> &'a SeqView {
    ctx.running.iter().chain(ctx.waiting).find(|v| v.id == id).expect("granted request is in view")
}
