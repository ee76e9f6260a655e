//! `smooth`: schedule for the user's reading buffer. The design, its formulas and what each
//! part measurably buys are in docs/scheduler.md; this is the code of its four rules.
//!
//! Smooth goodput (docs/metrics.md) charges `alpha * f(l)` for a user's idle latency `l`, the
//! largest lateness of a token against its reading deadline `d_i = a + g + i / q`. A token
//! delivered before its deadline earns nothing extra, so a stream ahead of its reader has
//! *slack* `d_{n+1} + L - now` (`L` its idle latency so far: lateness up to it costs nothing
//! more) and can sit out steps. The rules:
//!
//! 1. **Door** ([`Smooth::admit`]): it predicts a newcomer's idle latency: its first token (its
//!    start by rule 2 and the prefill ahead of it) plus the lateness of a batch that cannot
//!    feed its readers, `(n / q) * (u - 1)^+` for `n` expected tokens read at `q` tok/s, where
//!    `u = r50 * (q_max * base + sum_i q_i * c_i)` is the share of the machine's time the
//!    batch needs to feed every reader at its rate (`c_i` a stream's machine seconds per output
//!    token: its decode, its KV reads, and the prefill its replacement will need per token;
//!    `r50` the median of measured over predicted step times). It refuses only under
//!    sustained open-loop overload ([`Demand`]: the requests of new demand, ones that do not
//!    answer the end of another request, that fell due (their users would have read them) but
//!    did not run to their end grew over the last `window_s`, and new demand still outpaces
//!    completions), a request whose predicted idle beyond what it would lose alone costs more
//!    than `max_loss` of its expected value. Without that evidence a refusal frees nothing, even
//!    for a request worth less than nothing queued: a closed loop's client sends its next
//!    request into the same queue, and a burst is served anyway. A client that comes straight
//!    back after a refusal frees nothing either: its return is not refused.
//! 2. **Start** ([`Limits::admits`], the one start rule: the batch, the door's predicted start
//!    and its reports use it): a waiting request joins the batch while the running streams and
//!    it hold no more KV blocks at their expected ends than the pool has, and fit its places.
//!    An idle batch always takes one. It does not hold a request back to keep the batch
//!    fed: under the linear penalty a queued request loses a second for each second it waits,
//!    which is what its start spreads over the readers it slows, and the bigger batch delivers
//!    more tokens; keeping the batch feedable is the door's job.
//! 3. **Chunk**: a stream is due when its slack is under three full steps; due decodes go
//!    first and the step's time is capped at the shallowest due slack (never below a quarter
//!    of the token budget's prefill), so the prefill chunk is as large as that buffer allows.
//! 4. **Order**: prefill candidates by `max(now + slack, now + p / w)` (`p` the predicted
//!    prefill time, `w = 2^-priority`): earliest reading deadline while they can be on time,
//!    most weighted value per machine second (shortest weighted prefill) once late; a request
//!    waiting over two seconds goes ahead in deadline order, so nothing starves. When blocks
//!    run out, the stream that loses least per block freed is preempted first.

use std::collections::VecDeque;

use super::{Decisions, DoorStats, Grant, Policy, PolicyContext, SeqView};
use crate::cost::{pairs, CostCoeffs, StepShape};
use crate::request::RejectReason;
use crate::slo::Penalty;

/// A stream is due when its slack is under this many predicted full steps.
const HORIZON_STEPS: f64 = 3.0;
/// A request waiting longer than this (seconds) is prefilled in deadline order first.
const STARVATION_S: f64 = 2.0;
/// The smallest prefill chunk while a stream is due, as a fraction of the token budget.
const MIN_CHUNK_FRACTION: f64 = 0.25;
/// The door predicts a batch's time with this quantile of measured over predicted steps (the
/// readers' buffers absorb the scatter around it).
const STEP_QUANTILE: f64 = 0.5;
/// An arrival this soon (seconds) after a refusal is taken as its client answering it.
const RETURN_S: f64 = 0.1;
/// Growth of the requests due but not completed, as a multiple of the completions over the
/// door's window, beyond which it is taken for sustained overload (with the count's noise).
const OVER_MARGIN: f64 = 1.1;
/// Seconds over which the door judges whether more new demand still arrives than ends.
const ONGOING_S: f64 = 10.0;
/// How far before an arrival (seconds) the door looks for an end that fell there by chance.
const CONTROL_S: f64 = 0.5;
/// A queue this long is not simulated for the door's prediction (its wait is taken as endless).
const MAX_QUEUE_SIMULATED: usize = 4096;

/// smooth's configuration: its four rules can each be switched off for an ablation, and the
/// door has two quantities (`smooth:KEY=VALUE`, [`super::SMOOTH_KEYS`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SmoothConfig {
    /// Rule 1, the door (key `door`); off admits everything the mechanism's caps allow.
    pub door: bool,
    /// Rule 2, the start rule's memory bound (key `start`); off starts whatever fits the batch's
    /// places.
    pub start: bool,
    /// Rule 3, chunks sized by the shallowest buffer (key `chunk`); off fills the token budget.
    pub chunk: bool,
    /// Rule 4, the order (key `order`); off keeps queue order.
    pub order: bool,
    /// Under sustained overload, the most loss caused by waiting behind others, as a fraction of
    /// a request's expected output tokens, that the door accepts (key `max_loss`, 0.02).
    pub max_loss: f64,
    /// Seconds over which the door judges the demand (key `window_s`, 60): a burst of less work
    /// than the machine does in this time is not an overload.
    pub window_s: f64,
}

impl Default for SmoothConfig {
    fn default() -> Self {
        Self { door: true, start: true, chunk: true, order: true, max_loss: 0.02, window_s: 60.0 }
    }
}

/// The smooth policy.
#[derive(Debug, Clone, Default)]
pub struct Smooth {
    cfg: SmoothConfig,
    /// Decode-ready running requests: (slack, index into `running`).
    ready: Vec<(f64, usize)>,
    /// Prefill candidates: (order key, is running, index).
    cands: Vec<(f64, bool, usize)>,
    /// Preemption order: (loss per block freed, slack, id).
    victims: Vec<(f64, f64, u64)>,
    /// The door's prediction: (end, share of the machine, KV blocks, count) of the streams in
    /// the batch.
    finishes: Vec<(f64, f64, f64, f64)>,
    /// The door's prediction: the machine's share the batch needs when the newcomer starts, with
    /// it and alone.
    util: (f64, f64),
    demand: Demand,
    stats: DoorStats,
}

impl Smooth {
    /// The policy with `cfg`.
    pub fn new(cfg: SmoothConfig) -> Self {
        Self { cfg, ..Default::default() }
    }
}

/// Is the overload sustained, and would a refusal free anything? The door's view of the
/// clients, from counts alone (no cost model: both sides count the same mix of requests).
///
/// An arrival within [`RETURN_S`] of the end of another request is a closed-loop client
/// answering it, not new demand: such clients follow the machine's pace, and one refused comes
/// straight back. Independent arrivals also fall that close to some end by chance, more often
/// the more ends there are; that chance is measured with a control window [`CONTROL_S`]
/// earlier (where no answer falls) and each arrival of new demand counts `1 / (1 - chance)`,
/// so an open loop's demand is not hidden among its ends.
///
/// Each arrival of new demand is *due* when its user would have read its expected answer had
/// it been served on time (its last token's reading deadline, or its prefill alone and the
/// reading after it, if later). The overload is sustained when (i) over the last `window_s`
/// (or since the first arrival) the requests due but not completed grew, beyond a margin and
/// the count's own noise, and (ii) over the last [`ONGOING_S`] more new demand arrived than
/// requests completed. (i) needs no full window (a request cannot be judged late before it is
/// due, and needs no more than that), so an overload is seen about one answer's reading time
/// after it starts; (ii) tells it from a backlog that no one adds to, such as a closed loop's
/// opening burst. Clients who leave a queue are a symptom, not service.
#[derive(Debug, Clone, Default)]
struct Demand {
    /// When the arrivals of new demand fall due (ascending, from the window's start on) and
    /// what each counts for.
    due: VecDeque<(f64, f64)>,
    /// How many of `due`, from its front, fell due by `clock`, and what they count for.
    passed: (usize, f64),
    /// The latest arrival seen.
    clock: Option<f64>,
    /// The count of new demand that fell due before the window.
    due_before: f64,
    /// The arrivals of new demand in the last [`ONGOING_S`], and what each counts for.
    asked: Tally,
    /// The arrivals in the window, each counting 1 if an end fell in its control window.
    control: Tally,
    /// Every end in the last `CONTROL_S + RETURN_S`.
    ended: VecDeque<f64>,
    /// (time, requests completed) at each arrival in the window and the last one before it.
    ends: VecDeque<(f64, u64)>,
    /// Requests ended so far that this has seen.
    seen: u64,
    /// Times of the ends no arrival has answered yet, the last `RETURN_S` or so.
    unanswered: VecDeque<f64>,
    /// Refusals not yet answered by an arrival.
    refusals: VecDeque<f64>,
}

/// Drops the entries of `q` older than `t`.
fn drop_before<T>(q: &mut VecDeque<T>, t: f64, time: impl Fn(&T) -> f64) {
    while q.front().is_some_and(|e| time(e) < t) {
        q.pop_front();
    }
}

/// Timed values and their running sum.
#[derive(Debug, Clone, Default)]
struct Tally {
    q: VecDeque<(f64, f64)>,
    sum: f64,
}

impl Tally {
    fn push(&mut self, at: f64, value: f64) {
        self.q.push_back((at, value));
        self.sum += value;
    }

    /// Drops the values older than `t`.
    fn drop_before(&mut self, t: f64) {
        while let Some(&(at, v)) = self.q.front() {
            if at >= t {
                break;
            }
            self.q.pop_front();
            self.sum -= v;
        }
        if self.q.is_empty() {
            self.sum = 0.0;
        }
    }
}

impl Demand {
    /// An arrival at `at`, due at `due`; `ends` requests have ended so far (for any reason,
    /// refusals too), the latest of them at `recent` (in the order they were registered), and
    /// `completed` ran to their end. Returns (whether it answers an end, whether it answers a
    /// refusal).
    fn arrival(&mut self, (at, due): (f64, f64), window_s: f64, (recent, ends): (&[f64], u64), completed: u64) -> (bool, bool) {
        // The ends registered since the last arrival, as far as they are timed.
        let new = (ends.saturating_sub(self.seen) as usize).min(recent.len());
        self.seen = ends;
        self.unanswered.extend(&recent[recent.len() - new..]);
        self.ended.extend(&recent[recent.len() - new..]);
        drop_before(&mut self.ended, at - CONTROL_S - RETURN_S, |&t| t);
        while self.ended.len() > MAX_QUEUE_SIMULATED {
            self.ended.pop_front();
        }
        // An end can answer an arrival up to `RETURN_S` before or after it (the simulator and
        // the engine may register a client's leaving after its next request is stamped).
        self.unanswered.retain(|&t| t >= at - RETURN_S);
        while self.unanswered.len() > MAX_QUEUE_SIMULATED {
            self.unanswered.pop_front();
        }
        let close = self.unanswered.iter().position(|&t| t <= at + RETURN_S);
        let follows = close.is_some();
        // The chance that an independent arrival falls that close to an end, over the window.
        let by_chance = self.ended.iter().any(|&t| (t - (at - CONTROL_S)).abs() <= RETURN_S);
        self.control.push(at, f64::from(u8::from(by_chance)));
        self.control.drop_before(at - window_s);
        let chance = self.control.sum / self.control.q.len() as f64;
        match close {
            Some(i) => {
                self.unanswered.remove(i);
            }
            None => {
                let count = 1.0 / (1.0 - chance.min(0.9));
                if self.due.len() < MAX_QUEUE_SIMULATED {
                    let pos = self.due.partition_point(|d| d.0 <= due);
                    self.due.insert(pos, (due, count));
                    // An arrival stamped before a later one's admission may fall due by then.
                    if pos < self.passed.0 {
                        self.passed = (self.passed.0 + 1, self.passed.1 + count);
                    }
                }
                self.asked.push(at, count);
            }
        }
        self.asked.drop_before(at - ONGOING_S);
        self.ends.push_back((at, completed));
        // Those due by the latest arrival lead the queue (it is sorted).
        let clock = self.clock.map_or(at, |c| c.max(at));
        self.clock = Some(clock);
        while let Some(&(_, count)) = self.due.get(self.passed.0).filter(|d| d.0 <= clock) {
            self.passed = (self.passed.0 + 1, self.passed.1 + count);
        }
        while let Some(&(_, count)) = self.due.front().filter(|d| d.0 < at - window_s) {
            self.due.pop_front();
            self.due_before += count;
            self.passed = (self.passed.0.saturating_sub(1), self.passed.1 - count);
        }
        while self.ends.get(1).is_some_and(|&(t, _)| t <= at - window_s) {
            self.ends.pop_front();
        }
        drop_before(&mut self.refusals, at - RETURN_S, |&r| r);
        let answers = self.refusals.front().is_some_and(|&r| r <= at);
        if answers {
            self.refusals.pop_front();
        }
        (follows, answers)
    }

    fn refused(&mut self, at: f64) {
        if self.refusals.len() >= MAX_QUEUE_SIMULATED {
            self.refusals.pop_front();
        }
        self.refusals.push_back(at);
    }

    /// Sustained overload at `now` (just after an arrival): (i) over the window (or since the first arrival), the
    /// requests due but not completed grew by more than a margin ([`OVER_MARGIN`]) of the
    /// completions and one standard deviation of the count of due requests (so a handful in the
    /// first seconds is not a verdict); a machine ahead of its readers at the window's start
    /// (more completed than due) is not credited with it; and (ii) more new demand arrived over
    /// the last [`ONGOING_S`] than requests completed.
    fn overloaded(&self, now: f64) -> bool {
        let completed_at = |i: usize| self.ends.get(i).map_or(0.0, |e| e.1 as f64);
        let (c0, c1) = (completed_at(0), completed_at(self.ends.len().saturating_sub(1)));
        let d0 = self.due_before;
        let due = self.passed.1;
        let growth = (d0 + due - c1) - (d0 - c0).max(0.0);
        let behind = growth > (OVER_MARGIN - 1.0) * (c1 - c0) + due.sqrt();
        let since = self.ends.partition_point(|e| e.0 <= now - ONGOING_S).saturating_sub(1);
        let ongoing = self.asked.sum > c1 - completed_at(since);
        behind && ongoing
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
fn fit_len(c: &CostCoeffs, start: usize, max: usize, time: f64) -> usize {
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

/// Seconds before `v`'s idle latency grows: `d_{n+1} + L - now`. Under a capped penalty a
/// stream idle past the cap loses nothing more.
fn slack(v: &SeqView, now: f64, penalty: Penalty) -> f64 {
    match penalty {
        Penalty::Capped(cap) if v.max_lateness >= cap => f64::INFINITY,
        _ => v.next_deadline() + v.max_lateness - now,
    }
}

/// Prefill seconds of `v`'s uncached prompt (its queries attend over the cached part too).
fn prefill_secs(c: &CostCoeffs, v: &SeqView) -> f64 {
    let own = v.uncached_prompt();
    c.per_prefill_token_s * own as f64 + c.per_attn_pair_s * pairs(v.prompt_len - own, own)
}

/// Prefill seconds per expected output token over the requests in the system (and `extra`):
/// in a steady state every finished stream is replaced by a newcomer whose prompt must be
/// prefilled, so this is the prefill each output token carries. A ratio of sums, so one long
/// prompt with a short answer raises everyone's share a little.
pub(super) fn prefill_per_token(c: &CostCoeffs, ctx: &PolicyContext<'_>, extra: Option<(&SeqView, f64)>) -> f64 {
    let (mut secs, mut tokens) = (0.0, 0.0);
    let known = ctx.running.iter().chain(ctx.waiting).map(|v| (v, ctx.expected_remaining(v)));
    for (v, rem) in known.chain(extra) {
        secs += prefill_secs(c, v);
        tokens += v.num_output as f64 + rem;
    }
    if tokens > 0.0 {
        secs / tokens
    } else {
        0.0
    }
}

/// A set of streams fed at their readers' rates: they use `q_max * base + load` of the
/// machine's time, hold `kv` blocks at their expected ends, and are `count` many.
#[derive(Debug, Clone, Copy, Default)]
struct Feed {
    q_max: f64,
    load: f64,
    count: f64,
    kv: f64,
}

impl Feed {
    /// Stream `v`, expected to produce `rem` more tokens: its share of the machine (a running
    /// stream at its context now, a starting one at its mean context over its answer) and its
    /// KV blocks at its end, the prefix it found cached not counted (another holds it).
    fn of(ctx: &PolicyContext<'_>, c: &CostCoeffs, v: &SeqView, rem: f64, kappa: f64) -> Feed {
        let context = if v.num_computed > 0 { v.num_tokens as f64 } else { v.num_tokens as f64 + rem / 2.0 };
        let q = v.class.reading_rate;
        let tokens = v.num_tokens as f64 + rem;
        let kv = (tokens / ctx.block_size.max(1) as f64).ceil() - (v.cached_prompt / ctx.block_size.max(1)) as f64;
        Feed { q_max: q, load: q * (c.per_decode_seq_s + c.per_kv_token_s * context + kappa), count: 1.0, kv }
    }

    fn plus(&self, o: &Feed) -> Feed {
        Feed { q_max: self.q_max.max(o.q_max), load: self.load + o.load, count: self.count + o.count, kv: self.kv + o.kv }
    }

    /// Weighted by `p`, the chance that it is there.
    fn times(&self, p: f64) -> Feed {
        Feed { q_max: self.q_max, load: p * self.load, count: p * self.count, kv: p * self.kv }
    }

    fn minus(&self, o: &Feed) -> Feed {
        if self.count - o.count < 1e-9 {
            return Feed::default();
        }
        Feed { q_max: self.q_max, load: self.load - o.load, count: self.count - o.count, kv: self.kv - o.kv }
    }
}

/// The start rule's bounds: the KV memory and the batch's places.
#[derive(Debug, Clone, Copy)]
struct Limits {
    kv: f64,
    seqs: f64,
}

impl Limits {
    fn new(ctx: &PolicyContext<'_>, start: bool) -> Self {
        let kv = if start { ctx.total_blocks.saturating_sub(1) as f64 } else { f64::INFINITY };
        Limits { kv, seqs: ctx.max_num_seqs as f64 }
    }

    /// The start rule: may `add` join the batch `feed`?
    fn admits(&self, feed: &Feed, add: &Feed) -> bool {
        let with = feed.plus(add);
        with.count <= self.seqs + 1e-9 && (feed.count < 1e-9 || with.kv <= self.kv)
    }
}

/// The share of the machine's time `feed` needs to give every reader its rate (above 1 the
/// readers fall behind by `u - 1` seconds a second of reading).
fn utilization(ctx: &PolicyContext<'_>, c: &CostCoeffs, feed: &Feed) -> f64 {
    (feed.q_max * c.base_s + feed.load) * ctx.cost.ratio_quantile(STEP_QUANTILE)
}

impl Smooth {
    /// The batch's feed now.
    fn running_feed(ctx: &PolicyContext<'_>, c: &CostCoeffs, kappa: f64) -> Feed {
        ctx.running.iter().fold(Feed::default(), |f, v| f.plus(&Feed::of(ctx, c, v, ctx.expected_remaining(v), kappa)))
    }

    /// When `req`, queued behind every waiting request at least as heavy, starts by the start
    /// rule: running streams end after their expected remaining output at their readers' pace
    /// and free their share; each waiting request starts, in queue order, as soon as it fits,
    /// then runs for its own expected output, counted with the chance that its client is still
    /// there then. `now` when it fits at once. Sets `util` to the batch's utilization then,
    /// with it and alone.
    fn predicted_start(&mut self, req: &SeqView, rem: f64, ctx: &PolicyContext<'_>, c: &CostCoeffs, kappa: f64) -> f64 {
        if ctx.waiting.len() > MAX_QUEUE_SIMULATED {
            return f64::INFINITY;
        }
        let limits = Limits::new(ctx, self.cfg.start);
        let now = ctx.now;
        self.finishes.clear();
        let mut feed = Feed::default();
        for v in ctx.running {
            let rem = ctx.expected_remaining(v);
            let f = Feed::of(ctx, c, v, rem, kappa);
            feed = feed.plus(&f);
            self.finishes.push((now + rem / v.class.reading_rate, f.load, f.kv, 1.0));
        }
        // Soonest end last, so the next to end pops off the end.
        self.finishes.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
        let mut t = now;
        let ahead = ctx.waiting.iter().filter(|v| v.class.weight >= req.class.weight).map(|v| (v, ctx.expected_remaining(v), true));
        for (v, rem, queued) in ahead.chain([(req, rem, false)]) {
            let add = Feed::of(ctx, c, v, rem, kappa);
            while !limits.admits(&feed, &add) {
                let Some((end, load, kv, count)) = self.finishes.pop() else { break };
                t = t.max(end);
                feed = feed.minus(&Feed { q_max: 0.0, load, count, kv });
            }
            if !queued {
                self.util = (utilization(ctx, c, &feed.plus(&add)), utilization(ctx, c, &add));
            }
            if queued {
                // It holds its place only if its client is still there when it starts (the
                // patience clients have shown): a long queue of clients who give up is mostly
                // gone before its turn.
                let idle = |at: f64| v.max_lateness.max(at - v.next_deadline()).max(0.0);
                let add = add.times(ctx.patience.stays(idle(now), idle(t)));
                feed = feed.plus(&add);
                let end = t + rem / v.class.reading_rate;
                let pos = self.finishes.partition_point(|f| f.0 > end);
                self.finishes.insert(pos, (end, add.load, add.kv, add.count));
            }
        }
        t
    }

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
        "smooth"
    }

    fn admit(&mut self, req: &SeqView, ctx: &PolicyContext<'_>) -> Result<(), (RejectReason, f64)> {
        if !self.cfg.door {
            return Ok(());
        }
        let c = ctx.cost.effective();
        let now = ctx.now;
        // Its expected output (learned lengths, not max_tokens, unless nothing can stop it).
        let rem = ctx.expected_remaining(req);
        let n = rem.max(1.0);

        // Its first token: the prefill ahead of it at full steps, and its start by the start rule.
        let decodes = ctx.running.iter().filter(|v| v.uncomputed() == 1);
        let (n_dec, kv_dec) = decodes.fold((0, 0), |(n, kv), v| (n + 1, kv + v.num_tokens));
        let (chunk, t_full) = Self::full_step(ctx, n_dec, kv_dec);
        let heavier = ctx.waiting.iter().filter(|v| v.class.weight >= req.class.weight);
        let ahead: usize = ctx.running.iter().chain(heavier).filter(|v| v.uncomputed() > 1).map(|v| v.uncomputed()).sum();
        // Its own prefill: full chunks, then a last step with the rest (and the current decodes,
        // unless alone).
        let own_time = |with_decodes: bool| -> f64 {
            let own = req.uncomputed();
            let full = own.saturating_sub(1) / chunk;
            let mut last = if with_decodes { StepShape { decode_seqs: n_dec, kv_tokens: kv_dec, ..Default::default() } } else { StepShape::default() };
            last.add_slice(full * chunk, own - full * chunk);
            full as f64 * t_full + ctx.cost.predict(&last)
        };
        // The demand: is the overload sustained, with clients that go away when refused? It is
        // due when its user would have read it, served on time or alone.
        let alone = own_time(false);
        let due = (now + alone).max(req.arrival + req.class.grace) + n / req.class.reading_rate;
        let (follows, answers) = self.demand.arrival((req.arrival, due), self.cfg.window_s, (ctx.recent_ends, ctx.ends), ctx.completed);
        let overloaded = self.demand.overloaded(now);
        self.stats.overloaded = overloaded;
        self.stats.arrivals += 1;
        self.stats.overloaded_arrivals += u64::from(overloaded);
        self.stats.returns += u64::from(follows);
        // A client that came straight back frees nothing when refused: refusing it again only
        // turns a request that would be served into a zero.
        if answers {
            return Ok(());
        }
        let own = own_time(true);
        let kappa = prefill_per_token(&c, ctx, Some((req, rem)));
        let start = self.predicted_start(req, rem, ctx, &c, kappa);
        let wait = (ahead as f64 * t_full / chunk as f64 + own).max(start - now + own);
        let deadline = req.next_deadline();
        // Its reading: a batch that cannot feed its readers makes each fall behind.
        let behind = |u: f64| n / req.class.reading_rate * (u - 1.0).max(0.0);
        let idle = (now + wait - deadline).max(0.0) + behind(self.util.0);
        let idle_alone = (now + alone - deadline).max(0.0) + behind(self.util.1);
        let slo = ctx.slo;
        let loss = |l: f64| slo.alpha * slo.penalty.apply(l);
        // What the others cost it; what it would lose alone no policy can avoid. Refused only
        // under sustained open-loop overload: without it a refusal frees nothing (the client
        // comes back, or the burst is served anyway), even for a request worth less than nothing
        // queued (a closed loop's refused client sends its next request into the same queue).
        let queue_loss = loss(idle) - loss(idle_alone);
        if !(overloaded && queue_loss > self.cfg.max_loss * n) {
            return Ok(());
        }
        self.demand.refused(now);
        self.stats.refused += 1;
        tracing::debug!(
            id = req.id,
            expected_tokens = n,
            wait_s = wait,
            start_in_s = start - now,
            util = self.util.0,
            util_alone = self.util.1,
            idle_s = idle,
            idle_alone_s = idle_alone,
            running = ctx.running.len(),
            waiting = ctx.waiting.len(),
            "smooth door refuses"
        );
        // Retry when the wait it would add is what the rule accepts.
        let ok_loss = loss(idle_alone) + self.cfg.max_loss * n;
        let retry = idle - idle_for_loss(slo.penalty, slo.alpha, ok_loss).min(idle);
        Err((RejectReason::PredictedLate, retry.max(t_full).min(3600.0)))
    }

    fn plan(&mut self, ctx: &PolicyContext<'_>, out: &mut Decisions) {
        let now = ctx.now;
        let c = ctx.cost.effective();
        out.door = self.cfg.door.then_some(self.stats);
        self.ready.clear();
        self.cands.clear();
        let mut kv_dec = 0;
        for (i, v) in ctx.running.iter().enumerate() {
            match v.uncomputed() {
                0 => {}
                1 => {
                    self.ready.push((slack(v, now, ctx.slo.penalty), i));
                    kv_dec += v.num_tokens;
                }
                _ => self.cands.push((0.0, true, i)),
            }
        }
        self.cands.extend((0..ctx.waiting.len()).map(|i| (0.0, false, i)));
        let (chunk, t_full) = Self::full_step(ctx, self.ready.len(), kv_dec);
        let rate = chunk as f64 / t_full;
        if self.cfg.order {
            for cand in &mut self.cands {
                let v = if cand.1 { &ctx.running[cand.2] } else { &ctx.waiting[cand.2] };
                cand.0 = if now - v.arrival > STARVATION_S {
                    v.next_deadline() - 1e9
                } else {
                    (now + slack(v, now, ctx.slo.penalty)).max(now + v.uncomputed() as f64 / rate / v.class.weight)
                };
            }
            self.cands.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
        }
        self.ready.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));

        let horizon = HORIZON_STEPS * t_full;
        let n_due = self.ready.partition_point(|&(slack, _)| slack < horizon);
        let min_chunk = ((ctx.max_batch_tokens as f64 * MIN_CHUNK_FRACTION) as usize).max(ctx.block_size);
        let mut tokens_left = ctx.max_batch_tokens;
        let mut time = c.base_s;
        for &(_, i) in &self.ready[..n_due] {
            let v = &ctx.running[i];
            out.grants.push(Grant { id: v.id, tokens: 1, may_preempt: true });
            time += slice_cost(&c, v.num_computed, 1);
            tokens_left = tokens_left.saturating_sub(1);
        }
        // The time cap: the shallowest due buffer, but room for a minimum chunk.
        let cap = if n_due > 0 && self.cfg.chunk {
            let floor = time + slice_cost(&c, 0, min_chunk.min(tokens_left).max(2));
            self.ready[0].0.max(floor)
        } else {
            f64::INFINITY
        };

        let limits = Limits::new(ctx, self.cfg.start);
        let kappa = prefill_per_token(&c, ctx, None);
        let mut feed = Self::running_feed(ctx, &c, kappa);
        let mut full = false;
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
                // A waiting request starts by the start rule; once one does not, no later one
                // starts this step (the order is kept), but running prompts still progress.
                let mut started = None;
                if !running {
                    let add = Feed::of(ctx, &c, v, ctx.expected_remaining(v), kappa);
                    if full || !limits.admits(&feed, &add) {
                        full = true;
                        next_cand += 1;
                        continue;
                    }
                    started = Some(add);
                }
                let want = v.uncomputed().min(*tokens_left).min(limit_tokens - given);
                let len = fit_len(&c, v.num_computed, want, cap - *time);
                if len < 2 && v.uncomputed() > 1 {
                    break;
                }
                next_cand += 1;
                if let Some(add) = started {
                    feed = feed.plus(&add);
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

        // When blocks run out: the stream that loses least per block it frees goes first. It is
        // recomputed later and loses the part of that time its slack does not cover; lateness
        // it owes anyway does not count. Ties (deep buffers lose nothing) go deepest first.
        self.victims.clear();
        for v in ctx.running {
            let s = slack(v, now, ctx.slo.penalty);
            let late = (v.num_computed as f64 / rate - s).max(0.0);
            let owed = (-s).max(0.0);
            let f = |l: f64| ctx.slo.penalty.apply(l);
            let loss = v.class.weight * ctx.slo.alpha * (f(v.max_lateness + late) - f(v.max_lateness + owed));
            self.victims.push((loss / v.blocks_held.max(1) as f64, s, v.id));
        }
        self.victims.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        out.victims.extend(self.victims.iter().map(|v| v.2));
    }
}

fn find<'a>(ctx: &'a PolicyContext<'_>, id: u64) -> &'a SeqView {
    ctx.running.iter().chain(ctx.waiting).find(|v| v.id == id).expect("granted request is in view")
}

#[cfg(test)]
#[path = "smooth_tests.rs"]
mod tests;
