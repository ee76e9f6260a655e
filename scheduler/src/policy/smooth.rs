//! `smooth`: schedule for the user's reading buffer, run only what can be fed, admit only what
//! can be served.
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
//! 1. Slack of every decode-ready stream, `d_{n+1} + L - now` with `L` its idle latency so far
//!    (idle latency is the largest lateness, so lateness up to `L` costs nothing more; under a
//!    capped penalty a stream past the cap has unbounded slack). With `T_full`, the predicted time of a
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
//!    order of the modified due date `max(now + slack, now + p / w)`, `p` the predicted prefill
//!    time and `w` the request's weight (`2^-priority`): it is earliest-deadline-first while
//!    requests can still be on time, weighted-shortest-first once they are late (which minimises
//!    weighted total lateness), and a request waiting longer than `starvation_s` goes ahead in
//!    deadline order, so long prompts are not starved.
//! 5. When blocks run out, the stream that loses least per block it frees is preempted first:
//!    it is recomputed later, and loses the part of that time its buffer does not cover, weighed
//!    by its class and the penalty's shape (a deep buffer loses nothing; fcfs takes the newest).
//!
//! # The feed limit: the batch holds what it can keep at its readers' rates
//!
//! A stream kept at its reading rate `q` uses `q * cost` of the machine's time, where `cost` is
//! its machine seconds per output token: its decode slot, its KV reads, and the prefill its
//! replacement will need, per output token (prefill seconds over expected output tokens of the
//! requests in the system; lengths from [`crate::lengths`]). Each step also
//! pays the base cost, and the fastest reader needs a step every `1 / q_max` seconds, so a
//! running set uses `U = q_max * base + sum_i q_i * cost_i`, each running stream priced at its
//! context now and a starting one at its mean context over its expected answer. A waiting request
//! starts only while `U` with it stays under the feed cap, `1 / r90` with `r90` the 90th
//! percentile of measured over predicted step times (a cost model that runs slow shrinks the
//! batch with it). Admitting
//! past that point adds no throughput the readers can use: it slows every stream below its
//! reader (the first generation's TPOT p50 sat at twice the reading interval under overload).
//! The others wait, in deadline order.
//!
//! The cap is a prediction. Experimentally (`feed_target`, off by default) it is checked
//! against what the streams get: over the last few seconds, the tokens delivered to the
//! decoding streams against the tokens their readers read. The cap is scaled down while they
//! get less than `feed_target` times what they read and someone waits, and up while they get
//! more and the cap is what keeps requests out ([`FeedControl`]).
//!
//! # Admission: the door
//!
//! At the door the policy predicts the new request's first-token time: the prefill tokens ahead
//! of it at full steps, and the time until the feed limit lets it start (running streams free
//! their share as they finish, at their readers' pace, for their expected remaining output, in
//! an exponential race: the first of forty streams ends well before the one expected first; the
//! requests queued ahead start first, each counted with the probability that its client is
//! still there when its turn comes, from the patience the server has seen clients show,
//! [`crate::patience`]). That wait is scaled by how long the latest admitted requests really
//! waited against their predictions ([`WaitCalibration`]). It gives the predicted idle latency
//! `l` and predicted benefit `n - alpha * f(l)`, with `n` its *expected* output (learned, not
//! `max_tokens`), times the chance that its own client is still there at its first token. A
//! request whose predicted benefit is negative is rejected. When
//! the feed limit binds (it cannot start before running streams finish), so is one whose loss
//! *caused by queueing* (its loss at the predicted wait minus its loss if it were served alone,
//! which no policy could avoid) exceeds `admit_max_loss * n` (default 2%): under sustained
//! overload every admitted request displaces a later one, so the queue is held where waiting
//! costs little. A backlog of prompts with room to run them (a burst) is not overload and is only
//! refused when waiting it out is worth nothing. (Experimentally, key `sustained`, the margin
//! applies only while the work offered over the latest 400 arrivals exceeds what the feed limit
//! serves, [`Offered`].) A rejection carries a Retry-After of the
//! predicted excess wait. Below saturation nobody is rejected.
//!
//! A closed loop of clients (each sends its next request as soon as its last one ends or is
//! refused; [`Loop`] sees that most ends are answered by an arrival within moments) is never
//! refused: a refused client comes straight back, so refusing frees nothing and only turns
//! requests into zeros (refusing the requests predicted to be worth less than nothing set off
//! storms of instant retries, each a zero), and the queue cannot outgrow the population. The feed
//! limit still holds the batch to what the readers can use; the others wait, and those who run
//! out of patience leave without having cost any work. It never drops a started stream.

use std::cmp::Ordering;

use super::feed_control::FeedControl;
use super::offered::Offered;
use super::population::Loop;
use super::wait_calibration::WaitCalibration;
use super::{Borrowing, Decisions, Grant, Policy, PolicyContext, SeqView};
use crate::cost::{pairs, CostCoeffs, StepShape};
use crate::request::RejectReason;
use crate::slo::Penalty;

/// Tuning knobs of [`Smooth`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SmoothConfig {
    /// A stream is due when its slack is below this many predicted full steps.
    pub horizon_steps: f64,
    /// Most predicted loss caused by queueing (`alpha * f(l)` beyond what the request would lose
    /// alone), as a fraction of its expected tokens, accepted at the door. Under sustained
    /// overload every admitted request displaces a later one, so the queue is held where the
    /// loss it causes is this small; below saturation nobody waits that long.
    pub admit_max_loss: f64,
    /// A request waiting longer than this (seconds) is prefilled in deadline order ahead of
    /// the others.
    pub starvation_s: f64,
    /// Smallest prefill chunk while a stream is about to run dry, as a fraction of the token
    /// budget.
    pub min_chunk_fraction: f64,
    /// Refuse requests at the door by predicted benefit; `false` admits everything (the
    /// `smooth-no-admission` ablation).
    pub admission: bool,
    /// Start a waiting request only while the running streams and it can all be kept at their
    /// readers' rates (the feed limit); `false` starts whatever fits the batch.
    pub feed_limit: bool,
    /// The feed limit keeps this quantile of steps within the machine's time: the predicted
    /// utilisation may reach `1 / q`, where `q` is this quantile of measured over predicted
    /// step times (so a model that runs 5% slow shrinks the batch by 5%).
    pub feed_quantile: f64,
    /// A newcomer heavier than some running stream predicts the places the running streams free
    /// as an exponential race (the k-th of n streams to finish comes at the sum of the races'
    /// expected durations, sooner than the k-th expected finish: the first of forty streams
    /// ends well before the one expected to end first). Everyone else keeps the later,
    /// sorted-expectation estimate, whose margin keeps the queue short; a heavy request waits
    /// only behind requests as heavy, so the optimism cannot build a queue of light ones. The
    /// key `race` (0 or 1) turns it off for the ablation (docs/sim).
    pub race: bool,
    /// Every newcomer predicts its start by the race, not only a heavy one (key `race_all`, on;
    /// 0 for the ablation). Alone it builds the queue the sorted estimate's margin avoids
    /// (docs/sim/cpu-smollm2/sustained); `door_patience` prices that queue and `calibrate`
    /// corrects the race's optimism by the starts that followed.
    pub race_all: bool,
    /// The door counts the newcomer's own risk of leaving before its first token (learned
    /// patience; key `door_patience`, on): its benefit at a wait is the probability that its
    /// client is still there then times `n - alpha * f(l)`.
    pub door_patience: bool,
    /// Under a capped penalty, how far the running streams may fall behind their readers: the
    /// feed limit's share of the machine is multiplied by this (infinite: no step-time limit,
    /// [`Smooth::feed_cap`]). The key `capped_slack` sets it for the ablation (docs/sim).
    pub capped_slack: f64,
    /// Experimental (key `end_by_benefit`, off by default; docs/sim): under a capped penalty,
    /// end a running stream that is past the cap when a waiting request would turn the machine
    /// time of its next tokens into more benefit: its expected tokens per second of step time
    /// (the chance its client stays to its end, from the learned patience, over its decode
    /// cost with its whole context) below a fresh stream's.
    pub end_by_benefit: bool,
    /// Under priorities (key `displace`, 0 turns it off for the ablation): the door weighs what
    /// a refusal makes room for. Under overload an admitted request displaces a later one, and the one displaced is
    /// the lightest still competing (running or queued), not one of its own weight: a request
    /// is refused when its weighted benefit at the predicted wait falls below that lightest
    /// request's benefit served with the queueing margin. And while the feed limit holds some of
    /// the queue back, the places it frees go to the heaviest waiting first (queue order within
    /// a weight), the order the door's prediction assumes. With one weight both are the plain
    /// door and the plain order.
    pub displace: bool,
    /// Experimental (key `feed_target`, off by default: 0; docs/sim): the pace the feed limit
    /// holds the running streams to, as tokens delivered over tokens read. The feed limit's
    /// share of the machine is then scaled by what the running streams actually got: when they
    /// get their tokens slower than this, the share shrinks; when they get them faster and the
    /// limit is what holds requests out (in the queue or at the door), it grows
    /// ([`FeedControl`]). 1.05 leaves a 5% margin for a step that runs slow, which a reader's
    /// buffer then absorbs. In the simulator it corrects a limit the cost model sets too
    /// generously; on the CPU server it gained nothing measurable, so it stays off.
    pub feed_target: f64,
    /// Experimental (key `sustained`, off): refuse for the queueing margin only under sustained
    /// overload, while the work offered over the latest arrivals exceeds what the feed limit
    /// can serve (`policy/offered.rs`), so that a queue built by a burst is served. It cut the
    /// simulator's refusals at 1x from 2.0% to 0.1% at the same goodput and changed nothing
    /// measurable on the CPU server, but without patience (where a queue at 1x never drains by
    /// itself) it lost 5.7 points at 1x (docs/sim/cpu-smollm2/sustained), so it stays off.
    pub sustained: bool,
    /// Experimental (key `externality`, off): the door weighs a waiting newcomer's benefit
    /// against the lateness it adds to the requests arriving after it, instead of the
    /// `admit_max_loss` margin. The start prediction runs on for a request like it arriving
    /// next: the delay it passes on is how much later that one starts than in its place (the
    /// feed limit's every bound counts: step time, KV memory, sequences). Each request holds
    /// the queue's head for the mean of that delay over the latest arrivals, the load is the
    /// arrival rate times it, and every request arriving before the backlog clears starts that
    /// much later (an M/G/1-style externality that grows without bound as the load nears 1,
    /// [`Offered::added_wait`]).
    pub externality: bool,
    /// The door scales its predicted wait for the feed limit (key `calibrate`, on) by how long
    /// the latest admitted requests really waited against what it predicted for them
    /// ([`WaitCalibration`]), so that neither the sorted expected ends (pessimistic with a full
    /// batch) nor the race (optimistic when answers are less spread than exponential) decides
    /// refusals by its bias.
    pub calibrate: bool,
    /// Experimental (key `queue_places`, off: 0): under sustained overload a queue only needs
    /// to hold what fills the places the running streams free while a newcomer's prompt is
    /// prefilled, so the door's queueing margin is also capped at the loss of waiting for this
    /// many places to free (the running streams finish at about `sum q / E[remaining]` a
    /// second). Where streams finish fast (a big batch of short answers) that is far below
    /// `admit_max_loss`; where they finish slowly the 2% binds first.
    pub queue_places: f64,
    /// On by default since the simulator's 1x gap (key `borrow=0` turns it off; docs/sim, "Borrowing
    /// from the readers' buffers"): a waiting request may start past the feed limit's
    /// share of the machine (never past KV memory or `max_num_seqs`) while the running streams'
    /// buffers cover the excess, unless the overload is sustained. The plan feeds the shallow
    /// buffers first, so the excess is paid by streams that sit out steps: one whose reader is
    /// `s` seconds behind it can skip for `s` less the plan's horizon, giving back its share of
    /// the machine meanwhile. The overload lasts until enough running streams end to free the
    /// excess (about one mean share each, one ending every `1 / sum q / E[remaining]` seconds).
    /// The request starts when what the deep buffers can give back over that time covers it, and
    /// the door predicts it so (no wait for it, nor for the queue ahead while each is covered).
    /// A burst at saturation is then absorbed by buffers the readers built up, which would
    /// otherwise end unused, instead of by a queue and refusals. Under sustained overload (the
    /// work offered by the latest arrivals exceeds what the feed limit serves, [`Offered`]) the
    /// buffers are what absorbs the steps' noise and there is no idle capacity to gain, so it
    /// borrows nothing: without that guard it cost about a point at 2x (docs/sim).
    pub borrow: bool,
}

impl Default for SmoothConfig {
    fn default() -> Self {
        Self {
            horizon_steps: 3.0,
            admit_max_loss: 0.02,
            starvation_s: 2.0,
            min_chunk_fraction: 0.25,
            admission: true,
            feed_limit: true,
            feed_quantile: 0.9,
            race: true,
            race_all: true,
            door_patience: true,
            capped_slack: f64::INFINITY,
            end_by_benefit: false,
            displace: true,
            feed_target: 0.0,
            sustained: false,
            externality: false,
            calibrate: true,
            queue_places: 0.0,
            borrow: true,
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
    /// The waiting candidates, reordered by weight (see [`SmoothConfig::displace`]).
    queued: Vec<(f64, bool, usize)>,
    /// Preemption order scratch: (loss per block freed, slack, id).
    victims: Vec<(f64, f64, u64)>,
    /// Borrowing scratch: (seconds of buffer beyond the horizon, utilisation share) of each
    /// decode-ready stream (see [`SmoothConfig::borrow`]).
    buffers: Vec<(f64, f64)>,
    /// What borrowing did so far, and whether the door last saw a sustained overload (see
    /// [`SmoothConfig::borrow`]).
    borrowed: Borrowing,
    /// Admission scratch: (finish time, utilisation share, streams, KV blocks) of running and
    /// started streams.
    finishes: Vec<(f64, f64, f64, f64)>,
    /// Whether the clients are a closed loop (see [`Loop`]).
    population: Loop,
    /// What the running streams got against what their readers read (see [`FeedControl`]).
    control: FeedControl,
    /// The work offered over the latest arrivals (see [`SmoothConfig::sustained`]).
    offered: Offered,
    /// The door's predicted waits against the starts that followed (see
    /// [`SmoothConfig::calibrate`]).
    calibration: WaitCalibration,
}

impl Smooth {
    /// The policy with `cfg`.
    pub fn new(cfg: SmoothConfig) -> Self {
        Self { cfg, ..Default::default() }
    }

    /// Follows the requests the door admitted into the queue until they start
    /// ([`SmoothConfig::calibrate`]); every plan calls it, smooth's own and that of a policy
    /// using smooth's door.
    pub(super) fn observe_starts(&mut self, ctx: &PolicyContext<'_>) {
        if self.cfg.calibrate {
            self.calibration.observe(ctx.now, ctx.waiting);
        }
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

/// The penalty's growth per second of idle latency at `l`.
fn penalty_slope(penalty: Penalty, l: f64) -> f64 {
    match penalty {
        Penalty::Linear => 1.0,
        Penalty::Quadratic => 2.0 * l,
        Penalty::Capped(cap) if l < cap => 1.0 / cap,
        Penalty::Capped(_) => 0.0,
    }
}

/// Seconds before `v`'s idle latency grows, the slack the plan works with. Idle latency is the
/// largest lateness of any token so far, so a stream that was once late by `L` can be late by
/// `L` again at no cost: its slack is `d_{n+1} + L - now`. Under a capped penalty a stream
/// already idle past the cap loses nothing more: it has all the slack there is.
fn slack(v: &SeqView, now: f64, penalty: Penalty) -> f64 {
    match penalty {
        Penalty::Capped(cap) if v.max_lateness >= cap => f64::INFINITY,
        _ => v.next_deadline() + v.max_lateness - now,
    }
}

/// Machine seconds per output token of a stream at `context` tokens while it runs at its reader's
/// pace: its decode slot, its KV reads, and `kappa`, the prefill the streams' replacements will
/// need per output token ([`prefill_per_token`]).
fn token_cost(c: &CostCoeffs, context: f64, kappa: f64) -> f64 {
    c.per_decode_seq_s + c.per_kv_token_s * context + kappa
}

/// For [`SmoothConfig::borrow`]: fills `out` with (seconds of buffer beyond `horizon`, share of
/// the machine) of each decode-ready stream, and returns the expected seconds between two
/// running streams' ends (each ends after its expected remaining output at its reader's pace).
fn borrowable(ctx: &PolicyContext<'_>, c: &CostCoeffs, kappa: f64, horizon: f64, out: &mut Vec<(f64, f64)>) -> f64 {
    out.clear();
    let mut ends = 0.0;
    for v in ctx.running {
        ends += v.class.reading_rate / ctx.expected_remaining(v).max(1.0);
        if v.uncomputed() == 1 {
            out.push(((slack(v, ctx.now, ctx.slo.penalty) - horizon).max(0.0), Feed::running_share(c, v, kappa)));
        }
    }
    1.0 / ends.max(1e-9)
}

/// Whether the streams' buffers (from [`borrowable`]) cover the feed `with` past the limit
/// `cap`: it is over until enough streams end to free the excess (about one mean share each,
/// one ending every `next_end` seconds), and meanwhile each stream with a buffer beyond the
/// plan's horizon can sit out steps for up to that long, giving back its share. Never past KV
/// memory.
fn covers(buffers: &[(f64, f64)], next_end: f64, with: &Feed, base: f64, cap: f64, kv_cap: f64) -> bool {
    let excess = with.utilisation(base) - cap;
    if with.kv > kv_cap || excess <= 0.0 {
        return with.kv <= kv_cap;
    }
    let ends = (excess / (with.load / with.count.max(1.0)).max(1e-12)).ceil().max(1.0);
    let lasts = ends * next_end;
    let given: f64 = buffers.iter().map(|&(room, share)| share * room.min(lasts)).sum();
    given >= excess * lasts
}

/// Prefill seconds per expected output token over the requests in the system (and `extra`):
/// in a steady state every finished stream is replaced by a newcomer whose prompt must be
/// prefilled, so this is the prefill load each output token carries. A ratio of sums, so one
/// long prompt with a short answer raises everyone's share a little instead of looking, alone,
/// like more than the whole machine (its prefill is a burst the step planner interleaves).
fn prefill_per_token(c: &CostCoeffs, ctx: &PolicyContext<'_>, extra: Option<(&SeqView, f64)>) -> f64 {
    let (mut secs, mut tokens) = (0.0, 0.0);
    let known = ctx.running.iter().chain(ctx.waiting).map(|v| (v, ctx.expected_remaining(v)));
    for (v, rem) in known.chain(extra) {
        // Only the uncached part is computed; its queries still attend over the cached part.
        secs += c.per_prefill_token_s * v.uncached_prompt() as f64 + c.per_attn_pair_s * pairs(v.prompt_len - v.uncached_prompt(), v.uncached_prompt());
        tokens += v.num_output as f64 + rem;
    }
    if tokens > 0.0 {
        secs / tokens
    } else {
        0.0
    }
}

/// The feed limit's arithmetic: a set of streams, each kept at its reading rate `q_i`, uses the
/// fraction `q_max * base + sum_i q_i * token_cost_i` of the machine's time (each step pays the
/// base cost, and the fastest reader needs a step every `1 / q_max` seconds).
#[derive(Debug, Clone, Copy, Default)]
struct Feed {
    q_max: f64,
    load: f64,
    /// Streams (a predicted stream whose client may leave first counts as the probability that
    /// it is still there).
    count: f64,
    /// KV blocks the streams are expected to hold at their ends.
    kv: f64,
}

impl Feed {
    /// The share of a stream about to start, expected to produce `rem` tokens: at its mean
    /// context over its answer.
    fn share(c: &CostCoeffs, v: &SeqView, rem: f64, kappa: f64) -> f64 {
        v.class.reading_rate * token_cost(c, v.num_tokens as f64 + rem / 2.0, kappa)
    }

    /// The share of a running stream: at its context now. A running set is mostly the long
    /// answers (a short one is soon replaced), so pricing each stream at its mean context over
    /// what it has left prices the set at contexts it will not reach together: in a steady state
    /// the streams that finish are replaced by new ones at their prompts, and the machine's load
    /// is the streams' contexts as they are.
    fn running_share(c: &CostCoeffs, v: &SeqView, kappa: f64) -> f64 {
        v.class.reading_rate * token_cost(c, v.num_tokens as f64, kappa)
    }

    /// The KV blocks `v` is expected to hold at its end, `rem` tokens from now.
    fn blocks(ctx: &PolicyContext<'_>, v: &SeqView, rem: f64) -> f64 {
        ((v.num_tokens as f64 + rem) / ctx.block_size.max(1) as f64).ceil()
    }

    fn utilisation(&self, base: f64) -> f64 {
        self.q_max * base + self.load
    }

    /// Past the machine's time (`cap`) or its KV memory (`kv_cap` blocks).
    fn over(&self, base: f64, cap: f64, kv_cap: f64) -> bool {
        self.utilisation(base) > cap || self.kv > kv_cap
    }

    fn with(&self, q: f64, share: f64, kv: f64) -> Feed {
        self.with_weight(q, share, kv, 1.0)
    }

    /// With waiting request `v` started, for its expected remaining output.
    fn with_waiting(&self, ctx: &PolicyContext<'_>, c: &CostCoeffs, v: &SeqView, kappa: f64) -> Feed {
        let rem = ctx.expected_remaining(v);
        self.with(v.class.reading_rate, Feed::share(c, v, rem, kappa), Feed::blocks(ctx, v, rem))
    }

    fn with_weight(&self, q: f64, share: f64, kv: f64, p: f64) -> Feed {
        Feed { q_max: self.q_max.max(q), load: self.load + p * share, count: self.count + p, kv: self.kv + p * kv }
    }

    fn is_empty(&self) -> bool {
        self.count < 1e-9
    }
}

impl Smooth {
    /// The most of the machine's time the feed limit lets the running streams take (see
    /// [`SmoothConfig::feed_quantile`]); unlimited without the feed limit.
    ///
    /// Under a capped penalty there is no step-time limit (memory still binds, [`Self::kv_cap`]):
    /// a reader's lateness then costs at most `alpha` tokens however long it lasts, less than
    /// the throughput a fuller batch delivers, so keeping every reader at its pace is not worth
    /// the streams it keeps waiting.
    fn feed_cap(&self, ctx: &PolicyContext<'_>) -> f64 {
        if !self.cfg.feed_limit {
            return f64::INFINITY;
        }
        let mut share = 1.0 / ctx.cost.ratio_quantile(self.cfg.feed_quantile).max(1.0);
        if self.cfg.feed_target > 0.0 {
            share *= self.control.scale();
        }
        match ctx.slo.penalty {
            Penalty::Capped(_) => share * self.cfg.capped_slack,
            _ => share,
        }
    }

    /// The KV blocks the feed limit lets the streams hold at their expected ends: the whole
    /// pool (less the null block), so that a stream started is one the memory can keep to its
    /// end without preempting another; unlimited without the feed limit.
    fn kv_cap(&self, ctx: &PolicyContext<'_>) -> f64 {
        if self.cfg.feed_limit {
            ctx.total_blocks.saturating_sub(1) as f64
        } else {
            f64::INFINITY
        }
    }

    /// The running streams' feed.
    fn running_feed(ctx: &PolicyContext<'_>, kappa: f64) -> Feed {
        let c = ctx.cost.effective();
        ctx.running.iter().fold(Feed::default(), |f, v| {
            f.with(v.class.reading_rate, Feed::running_share(&c, v, kappa), Feed::blocks(ctx, v, ctx.expected_remaining(v)))
        })
    }

    /// When `req`, queued behind every waiting request, is predicted to start under the feed
    /// limit (and `max_num_seqs`): streams free their share of the machine when they are
    /// predicted to finish, at their readers' pace; each waiting request starts, in queue order,
    /// as soon as its share fits. A waiting request counts with the probability that its client
    /// is still there when its turn comes (learned patience, [`crate::patience`]): a long queue
    /// of clients who give up after seconds is mostly gone before it starts. Engine time; `now`
    /// when it fits at once. With [`SmoothConfig::externality`], also how much later a request
    /// like it arriving next would start behind it than in its place (zero without).
    fn predicted_start(&mut self, req: &SeqView, ctx: &PolicyContext<'_>, c: &CostCoeffs) -> (f64, f64) {
        let cap = self.feed_cap(ctx);
        let kv_cap = self.kv_cap(ctx);
        let now = ctx.now;
        // A queue this long is refused anyway; stop predicting past it.
        const MAX_QUEUE_SIMULATED: usize = 4096;
        if ctx.waiting.len() > MAX_QUEUE_SIMULATED {
            return (f64::INFINITY, 0.0);
        }
        let req_rem = ctx.lengths.expected_total(req.max_output);
        let kappa = prefill_per_token(c, ctx, Some((req, req_rem)));
        self.finishes.clear();
        let mut feed = Feed::default();
        for v in ctx.running {
            let rem = ctx.expected_remaining(v);
            let share = Feed::running_share(c, v, kappa);
            let kv = Feed::blocks(ctx, v, rem);
            feed = feed.with(v.class.reading_rate, share, kv);
            self.finishes.push((now + rem / v.class.reading_rate, share, 1.0, kv));
        }
        // Soonest finish last, so the next to finish pops off the end.
        self.finishes.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
        if self.cfg.race && (self.cfg.race_all || ctx.running.iter().any(|v| v.class.weight < req.class.weight)) {
            // The k-th stream to finish, of streams finishing at rates 1 / (T_i - now), comes at
            // the sum of the races' expected durations, sooner than the k-th expected finish
            // (`SmoothConfig::race`).
            let mut lam: f64 = self.finishes.iter().map(|f| 1.0 / (f.0 - now).max(1e-3)).sum();
            let mut clock = now;
            for i in (0..self.finishes.len()).rev() {
                let l = 1.0 / (self.finishes[i].0 - now).max(1e-3);
                clock += 1.0 / lam.max(1e-12);
                lam -= l;
                self.finishes[i].0 = clock.min(self.finishes[i].0);
            }
        }
        let mut t = now;
        // Starts `v` (expected to produce `rem` more tokens, there with probability `p`) at the
        // first finish that makes room for it. Returns its start time.
        let max_seqs = ctx.max_num_seqs as f64;
        let start = |v: &SeqView, share: f64, kv: f64, p: f64, t: &mut f64, feed: &mut Feed, finishes: &mut Vec<(f64, f64, f64, f64)>| -> f64 {
            let q = v.class.reading_rate;
            while !feed.is_empty() && (feed.with_weight(q, share, kv, p).over(c.base_s, cap, kv_cap) || feed.count + p > max_seqs + 1e-9) {
                let Some((at, freed, n, blocks)) = finishes.pop() else { break };
                *t = t.max(at);
                feed.load -= freed;
                feed.count -= n;
                feed.kv -= blocks;
                if feed.is_empty() {
                    *feed = Feed::default();
                }
            }
            *t
        };
        let idle = |v: &SeqView, at: f64| v.max_lateness.max(at - v.next_deadline()).max(0.0);
        // Lighter requests start after it (the prefill order is by weight once late).
        for v in ctx.waiting.iter().filter(|v| v.class.weight >= req.class.weight) {
            let rem = ctx.expected_remaining(v);
            let share = Feed::share(c, v, rem, kappa);
            let kv = Feed::blocks(ctx, v, rem);
            let idle_now = idle(v, now);
            // Room is made for it as it would be there if it started as soon as it could; then
            // it counts as what is left of it at the predicted start.
            let p0 = ctx.patience.stays(idle_now, idle(v, t));
            let at = start(v, share, kv, p0, &mut t, &mut feed, &mut self.finishes);
            let p = ctx.patience.stays(idle_now, idle(v, at));
            feed = feed.with_weight(v.class.reading_rate, share, kv, p);
            let end = at + rem / v.class.reading_rate;
            let pos = self.finishes.partition_point(|f| f.0 > end);
            self.finishes.insert(pos, (end, p * share, p, p * kv));
        }
        let kv = Feed::blocks(ctx, req, req_rem);
        let share = Feed::share(c, req, req_rem, kappa);
        let at = start(req, share, kv, 1.0, &mut t, &mut feed, &mut self.finishes);
        if !self.cfg.externality {
            return (at, 0.0);
        }
        // A request like it arriving next starts where it would have, or later if it takes that
        // place: the delay it passes on.
        feed = feed.with(req.class.reading_rate, share, kv);
        let end = at + req_rem / req.class.reading_rate;
        let pos = self.finishes.partition_point(|f| f.0 > end);
        self.finishes.insert(pos, (end, share, 1.0, kv));
        (at, start(req, share, kv, 1.0, &mut t, &mut feed, &mut self.finishes) - at)
    }

    /// Shape and time of a full step with the current decodes: (prefill tokens, seconds).
    fn full_step(ctx: &PolicyContext<'_>, decodes: usize, decode_kv: usize) -> (usize, f64) {
        let mut shape = StepShape { decode_seqs: decodes, kv_tokens: decode_kv, ..Default::default() };
        let chunk = ctx.max_batch_tokens.saturating_sub(decodes).max(ctx.max_batch_tokens / 4).max(2);
        shape.add_slice(0, chunk);
        (chunk, ctx.cost.predict(&shape).max(1e-6))
    }
}

impl Smooth {
    /// See [`SmoothConfig::end_by_benefit`].
    fn end_by_benefit(ctx: &PolicyContext<'_>, c: &CostCoeffs, out: &mut Decisions) {
        let Penalty::Capped(cap) = ctx.slo.penalty else { return };
        let Some(w) = ctx.waiting.first() else { return };
        let now = ctx.now;
        // The decode step as it runs now; every stream gets one token a step.
        let step = c.base_s + ctx.running.iter().filter(|v| v.uncomputed() == 1).map(|v| slice_cost(c, v.num_computed, 1)).sum::<f64>();
        // A fresh stream's machine time per token: its decodes near its prompt, and its prefill
        // spread over its expected output.
        let n_w = ctx.expected_remaining(w).max(1.0);
        let fresh = slice_cost(c, w.prompt_len, 1) + slice_cost(c, 0, w.uncomputed().max(2)) / n_w;
        let mut ended = 0;
        for v in ctx.running.iter().filter(|v| v.uncomputed() == 1 && v.max_lateness >= cap) {
            if ended >= ctx.waiting.len() {
                break;
            }
            let late_now = v.max_lateness.max(now - v.next_deadline());
            let growth = (step - 1.0 / v.class.reading_rate).max(0.0);
            let late_end = late_now + ctx.expected_remaining(v) * growth;
            let stays = ctx.patience.stays(late_now, late_end);
            if stays * fresh < slice_cost(c, v.num_computed, 1) {
                out.drop.push(v.id);
                ended += 1;
            }
        }
    }
}

impl Policy for Smooth {
    fn name(&self) -> &'static str {
        match (self.cfg.admission, self.cfg.feed_limit) {
            (true, true) => "smooth",
            (false, _) => "smooth-no-admission",
            (true, false) => "smooth-no-feed-limit",
        }
    }

    fn feed_scale(&self) -> Option<f64> {
        (self.cfg.feed_limit && self.cfg.feed_target > 0.0).then(|| self.control.scale())
    }

    fn wait_scale(&self) -> Option<f64> {
        (self.cfg.admission && self.cfg.calibrate).then(|| self.calibration.scale())
    }

    fn borrowing(&self) -> Option<Borrowing> {
        // Without the door (`smooth-no-admission`) nothing judges the overload: it borrows always.
        (self.cfg.feed_limit && self.cfg.borrow).then_some(self.borrowed)
    }

    fn drain_wait_errors(&mut self, out: &mut Vec<f64>) {
        self.calibration.drain_errors(out);
    }

    fn admit(&mut self, req: &SeqView, ctx: &PolicyContext<'_>) -> Result<(), (RejectReason, f64)> {
        if !self.cfg.admission {
            return Ok(());
        }
        let closed_loop = self.population.arrival(req.arrival, ctx.last_end, ctx.ends);
        let c = ctx.cost.effective();
        let decodes = ctx.running.iter().filter(|v| v.uncomputed() == 1);
        let (n_dec, kv_dec) = decodes.fold((0, 0), |(n, kv), v| (n + 1, kv + v.num_tokens));
        let (chunk, t_full) = Self::full_step(ctx, n_dec, kv_dec);
        let rate = chunk as f64 / t_full;
        let heavier = ctx.waiting.iter().filter(|v| v.class.weight >= req.class.weight);
        let ahead: usize = ctx.running.iter().chain(heavier).filter(|v| v.uncomputed() > 1).map(|v| v.uncomputed()).sum();
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
        // Prefill throughput: every prompt token ahead of it, at full steps.
        let mut wait = ahead as f64 / rate + own;
        // The feed limit: a waiting request starts when the streams running (at their readers'
        // pace, for their expected remaining output) have freed enough of the machine, in queue
        // order, each started request then running for its own expected output.
        let (mut start, passed_on) = self.predicted_start(req, ctx, &c);
        // Its expected output (learned lengths), not max_tokens.
        let rem = ctx.lengths.expected_total(req.max_output);
        let n = rem.max(1.0);
        // (Experimental: the margin only under sustained overload, the lateness it adds to later
        // arrivals instead of the margin, or borrowing outside sustained overload; with none of
        // them, the door keeps no history.)
        let q = ctx.running.iter().map(|v| v.class.reading_rate).fold(req.class.reading_rate, f64::max);
        if self.cfg.sustained || self.cfg.externality || self.cfg.borrow {
            self.offered.record(req, n, passed_on);
        }
        if self.cfg.borrow {
            let overloaded = self.offered.sustained_overload(&c, q, self.feed_cap(ctx));
            self.borrowed.overloaded = overloaded;
            self.borrowed.arrivals += 1;
            self.borrowed.overloaded_arrivals += u64::from(overloaded);
        }
        let door_borrows = self.cfg.borrow && !self.borrowed.overloaded;
        if door_borrows && start > ctx.now {
            // The plan starts the queue ahead of it and then it, one by one, while the buffers
            // cover each (see `SmoothConfig::borrow`): then it starts now.
            let kappa = prefill_per_token(&c, ctx, Some((req, rem)));
            let next_end = borrowable(ctx, &c, kappa, self.cfg.horizon_steps * t_full, &mut self.buffers);
            let (cap, kv_cap) = (self.feed_cap(ctx), self.kv_cap(ctx));
            let mut feed = Self::running_feed(ctx, kappa);
            let mut seqs = ctx.running.len();
            let ahead = ctx.waiting.iter().filter(|v| v.class.weight >= req.class.weight);
            let all = ahead.map(|v| (v, ctx.expected_remaining(v))).chain([(req, rem)]).all(|(v, rem)| {
                feed = feed.with(v.class.reading_rate, Feed::share(&c, v, rem, kappa), Feed::blocks(ctx, v, rem));
                seqs += 1;
                seqs <= ctx.max_num_seqs && covers(&self.buffers, next_end, &feed, c.base_s, cap, kv_cap)
            });
            if all {
                start = ctx.now;
            }
        }
        let predicted_wait = start - ctx.now;
        if self.cfg.calibrate {
            start = ctx.now + predicted_wait * self.calibration.scale();
        }
        // Capacity-bound: it cannot start before running streams finish. Only then does
        // admitting it displace a later request (the machine is full for as long as the overload
        // lasts); a backlog of prompts with room to run them is a burst that clears by itself.
        let bound = start > ctx.now;
        wait = wait.max(start - ctx.now + own);
        let deadline = req.next_deadline();
        let idle = (ctx.now + wait - deadline).max(0.0);
        // What it would lose alone on the machine is no reason to refuse it: no policy can do
        // better. The margin applies to the loss caused by waiting behind others.
        let alone = own_time(false);
        let idle_alone = (ctx.now + alone - deadline).max(0.0);
        let slo = ctx.slo;
        let sustained = !self.cfg.sustained || self.offered.sustained_overload(&c, q, self.feed_cap(ctx));
        let own_risk = self.cfg.door_patience;
        let benefit = |idle: f64| {
            let b = n - slo.alpha * slo.penalty.apply(idle);
            if own_risk && b > 0.0 {
                b * ctx.patience.stays(0.0, idle)
            } else {
                b
            }
        };
        let mut max_loss = self.cfg.admit_max_loss * n;
        if self.cfg.queue_places > 0.0 {
            // Places freed a second: every running stream ends after its expected remaining
            // output at its reader's pace.
            let freed: f64 = ctx.running.iter().map(|v| v.class.reading_rate / ctx.expected_remaining(v).max(1.0)).sum();
            let w = self.cfg.queue_places / freed.max(1e-9);
            max_loss = max_loss.min(slo.alpha * (slo.penalty.apply(idle_alone + w) - slo.penalty.apply(idle_alone)));
        }
        let queue_loss = benefit(idle_alone) - benefit(idle);
        // A refusal is for the loss that waiting causes: a request that would lose as much
        // alone on an idle machine (nothing ahead of it) is served, as no policy can do better
        // for it and turning it away only makes its client come back to the same answer.
        let waits = queue_loss > 0.0;
        // The lightest request competing is the one a refusal makes room for.
        let w_ref = if self.cfg.displace {
            ctx.running.iter().chain(ctx.waiting).map(|v| v.class.weight).fold(req.class.weight, f64::min)
        } else {
            req.class.weight
        };
        let displaced = if self.cfg.externality {
            let later = self.offered.added_wait(start - ctx.now);
            req.class.weight * benefit(idle) < w_ref * slo.alpha * penalty_slope(slo.penalty, idle) * later
        } else {
            req.class.weight * benefit(idle) < w_ref * (benefit(idle_alone) - max_loss)
        };
        if !closed_loop && waits && (benefit(idle) < 0.0 || (bound && displaced && sustained)) {
            self.control.refused |= bound;
            let base = slo.alpha * slo.penalty.apply(idle_alone);
            let ok_idle = idle_for_loss(slo.penalty, slo.alpha, base + max_loss).min(idle_for_loss(slo.penalty, slo.alpha, n));
            // Refused for those after it: until it would start now, when nobody waits on it.
            let retry = if self.cfg.externality && benefit(idle) >= 0.0 { start - ctx.now } else { idle - ok_idle };
            // (An hour at most: a prediction that far out is no promise.)
            return Err((RejectReason::PredictedLate, retry.max(t_full).min(3600.0)));
        }
        if self.cfg.calibrate {
            self.calibration.admitted(req.id, ctx.now, predicted_wait);
        }
        Ok(())
    }

    fn plan(&mut self, ctx: &PolicyContext<'_>, out: &mut Decisions) {
        let now = ctx.now;
        let c = ctx.cost.effective();
        if self.cfg.feed_limit {
            self.control.observe(ctx, self.cfg.feed_target);
        }
        self.observe_starts(ctx);
        if self.cfg.end_by_benefit {
            Self::end_by_benefit(ctx, &c, out);
        }
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
        for cand in &mut self.cands {
            let v = if cand.1 { &ctx.running[cand.2] } else { &ctx.waiting[cand.2] };
            let due = now + slack(v, now, ctx.slo.penalty);
            // Weighted: once late, the order that loses least is by prefill time over weight.
            cand.0 = if now - v.arrival > self.cfg.starvation_s {
                v.next_deadline() - 1e9
            } else {
                due.max(now + v.uncomputed() as f64 / rate / v.class.weight)
            };
        }
        self.cands.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
        // The feed limit: a waiting request starts only while every running stream and it can
        // be kept at their readers' rates (an idle server always starts one).
        let feed_cap = self.feed_cap(ctx);
        let kv_cap = self.kv_cap(ctx);
        let kappa = prefill_per_token(&c, ctx, None);
        let mut feed = Self::running_feed(ctx, kappa);
        let bound = || {
            let all = ctx.waiting.iter().fold(feed, |f, v| f.with_waiting(ctx, &c, v, kappa));
            all.over(c.base_s, feed_cap, kv_cap) || ctx.running.len() + ctx.waiting.len() > ctx.max_num_seqs
        };
        let mixed = ctx.waiting.windows(2).any(|w| w[0].class.weight != w[1].class.weight);
        if self.cfg.displace && mixed && bound() {
            // When the feed limit holds some of the queue back, the places it frees go to the
            // heaviest waiting first (queue order within a weight): the door predicted their
            // starts so. Running prompts keep their places.
            self.queued.clear();
            self.queued.extend(self.cands.iter().filter(|c| !c.1).copied());
            self.queued.sort_by(|a, b| ctx.waiting[b.2].class.weight.total_cmp(&ctx.waiting[a.2].class.weight));
            for (c, q) in self.cands.iter_mut().filter(|c| !c.1).zip(&self.queued) {
                *c = *q;
            }
        }
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

        // Borrowing from the buffers (see `SmoothConfig::borrow`): how much each stream has,
        // and how soon the next running stream is predicted to end.
        let next_end = if self.cfg.borrow && !self.borrowed.overloaded && !ctx.waiting.is_empty() { borrowable(ctx, &c, kappa, horizon, &mut self.buffers) } else { f64::INFINITY };
        let buffers = &self.buffers;
        let mut slots = ctx.max_num_seqs.saturating_sub(ctx.running.len());
        let mut feed_full = false;
        // Whether the feed limit's share of the machine (not memory, not `max_num_seqs`) is
        // what kept a waiting request out.
        let mut time_held = false;
        let mut next_cand = 0;
        let mut partial: Option<(usize, usize)> = None; // (grant index, tokens granted) of a cut chunk
        let mut borrowed = 0;
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
                // A waiting request needs a free place in the batch and room under the feed
                // limit; once one does not fit, no later one starts this step (queue order is
                // kept), but running prompts still progress.
                let mut started = None;
                if !running {
                    let with = feed.with_waiting(ctx, &c, v, kappa);
                    if !feed_full && slots > 0 && !feed.is_empty() && with.utilisation(c.base_s) > feed_cap {
                        time_held = true;
                    }
                    let borrows = || self.cfg.borrow && !self.borrowed.overloaded && covers(buffers, next_end, &with, c.base_s, feed_cap, kv_cap);
                    // Past the limit with streams running: it starts only on their buffers.
                    let lent = !feed.is_empty() && with.over(c.base_s, feed_cap, kv_cap);
                    if feed_full || slots == 0 || (lent && !borrows()) {
                        feed_full = true;
                        next_cand += 1;
                        continue;
                    }
                    started = Some((with, lent));
                }
                let want = v.uncomputed().min(*tokens_left).min(limit_tokens - given);
                let len = fit_len(&c, v.num_computed, want, cap - *time);
                if len < 2 && v.uncomputed() > 1 {
                    break;
                }
                next_cand += 1;
                if let Some((with, lent)) = started {
                    slots -= 1;
                    feed = with;
                    borrowed += u64::from(lent);
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
        self.borrowed.starts += borrowed;
        self.control.queued = !ctx.waiting.is_empty();
        self.control.held = time_held;

        // When blocks run out: the stream that loses least per block it frees goes first. A
        // preempted stream is recomputed later (its tokens prefilled again at full steps); it
        // loses only the part of that time its buffer (slack) does not cover, weighed by its
        // class and the penalty's shape at its idle latency so far. A stream already late
        // (negative slack) owes that lateness whether it is preempted or not: only the
        // difference counts. Ties (deep buffers, which lose nothing) go deepest first.
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
