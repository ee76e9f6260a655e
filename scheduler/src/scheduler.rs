//! The shared mechanism: request state, block allocation, budgets, preemption and bookkeeping.
//!
//! The engine loop is three calls (vLLM v1's contract):
//!
//! ```text
//! plan   = scheduler.schedule(now)            // which requests, how many tokens each
//! output = runner.execute(&plan)              // one forward over the ragged batch
//! events = scheduler.update(&plan, &output, now)
//! ```
//!
//! `update` must follow every `schedule` (with an empty output for an empty plan): besides the
//! tokens of the step it returns the `Finished { Dropped }` events of requests the policy
//! dropped while scheduling. If the step failed, call [`Scheduler::fail_step`] instead.
//!
//! A request has tokens computed (in the KV cache) and tokens known (prompt plus output). A step
//! gives it some of the difference: the rest of a prompt in chunks, one decode token, or a
//! recompute prefill over prompt and output after a preemption. `num_computed` advances when a
//! slice is scheduled; the sampled token is appended in `update`.
//!
//! Every request is in exactly one state: waiting (never started, or preempted and waiting to
//! recompute), running, or finished (then it is gone from here and listed once in the next plan's
//! `released`). A finished request holds no block.
//!
//! Prefix caching (`enable_prefix_caching`): after each step, every block that step filled is
//! registered in the pool under the hash of its tokens chained with its parent's (`update`); a
//! request starting (or restarting after a preemption) takes the longest registered chain of
//! its tokens, up to the last full block before its last token, and computes only the rest.
//! Admission and planning see that: a waiting request's view counts its cached prefix as
//! computed. A request's `cache_salt` keeps it from sharing with requests of another salt.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use serde::{Deserialize, Serialize};

use crate::block_pool::{chain_hash, BlockPool, KvEvent, ROOT_HASH};
use crate::cost::{CostCoeffs, StepCostModel, StepShape};
use crate::lengths::{LengthModel, LengthPrior};
use crate::patience::PatienceModel;
use crate::plan::{BatchPlan, RequestId, SeqSlice, StepOutput};
use crate::policy::{self, Decisions, Policy, PolicyContext, SeqView};
use crate::request::{Event, FinishReason, NewRequest, RejectReason, Rejection};
use crate::slo::{SloClass, SloParams};

/// Sizes, budgets and metric parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedulerConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks including the null block 0 (from what the runner reports).
    pub num_kv_blocks: usize,
    /// Most requests in the running batch.
    pub max_num_seqs: usize,
    /// Most tokens fed in one step.
    pub max_batch_tokens: usize,
    /// Longest sequence, prompt plus output.
    pub max_model_len: usize,
    /// Most requests waiting; beyond it `add` rejects with `QueueFull`.
    pub max_queue_requests: usize,
    /// Most uncomputed tokens waiting; beyond it `add` rejects with `QueueTokens`.
    pub max_queue_tokens: usize,
    /// SLO and smooth-goodput parameters (deadlines, penalty, binary SLO for drop-late).
    pub slo: SloParams,
    /// The step-cost model's starting coefficients (a preset, or a start-up profile).
    pub cost_prior: CostCoeffs,
    /// Where the output-length model starts, and how much it remembers.
    #[serde(default)]
    pub lengths: LengthPrior,
    /// Reuse the KV blocks of prefixes other requests computed (vLLM's `--enable-prefix-caching`).
    #[serde(default)]
    pub enable_prefix_caching: bool,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            num_kv_blocks: 1024,
            max_num_seqs: 256,
            max_batch_tokens: 2048,
            max_model_len: 4096,
            max_queue_requests: 4096,
            max_queue_tokens: 4 << 20,
            slo: SloParams::default(),
            cost_prior: CostCoeffs { base_s: 0.006, per_prefill_token_s: 0.0016, per_decode_seq_s: 0.0009, per_kv_token_s: 2e-6, per_attn_pair_s: 0.0 },
            lengths: LengthPrior::default(),
            enable_prefix_caching: false,
        }
    }
}

/// Rejections by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectCounts {
    /// Queue full.
    pub queue_full: u64,
    /// Queue tokens full.
    pub queue_tokens: u64,
    /// Predicted negative benefit.
    pub predicted_late: u64,
    /// Too long.
    pub too_long: u64,
    /// Malformed.
    pub invalid: u64,
}

impl RejectCounts {
    fn absorb(&mut self, o: &Self) {
        self.queue_full += o.queue_full;
        self.queue_tokens += o.queue_tokens;
        self.predicted_late += o.predicted_late;
        self.too_long += o.too_long;
        self.invalid += o.invalid;
    }

    fn bump(&mut self, r: RejectReason) {
        *match r {
            RejectReason::QueueFull => &mut self.queue_full,
            RejectReason::QueueTokens => &mut self.queue_tokens,
            RejectReason::PredictedLate => &mut self.predicted_late,
            RejectReason::TooLong => &mut self.too_long,
            RejectReason::Invalid => &mut self.invalid,
        } += 1;
    }

    /// All rejections.
    pub fn total(&self) -> u64 {
        self.queue_full + self.queue_tokens + self.predicted_late + self.too_long + self.invalid
    }
}

/// Finishes by reason (rejections are in [`RejectCounts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishCounts {
    /// Stop token or stop string.
    pub stop: u64,
    /// Length.
    pub length: u64,
    /// Client gone.
    pub abort: u64,
    /// Dropped by the policy.
    pub dropped: u64,
    /// Engine error.
    pub error: u64,
}

impl FinishCounts {
    fn absorb(&mut self, o: &Self) {
        self.stop += o.stop;
        self.length += o.length;
        self.abort += o.abort;
        self.dropped += o.dropped;
        self.error += o.error;
    }

    fn bump(&mut self, r: FinishReason) {
        match r {
            FinishReason::Stop => self.stop += 1,
            FinishReason::Length => self.length += 1,
            FinishReason::Abort => self.abort += 1,
            FinishReason::Dropped => self.dropped += 1,
            FinishReason::Error => self.error += 1,
            FinishReason::Rejected => {}
        }
    }
}

/// A snapshot for gauges.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedulerStats {
    /// Policy name.
    pub policy: String,
    /// Requests in the running batch.
    pub running: usize,
    /// Requests waiting (preempted included).
    pub waiting: usize,
    /// Of those, preempted ones.
    pub preempted_waiting: usize,
    /// KV blocks handed out.
    pub kv_blocks_used: usize,
    /// KV blocks that can be handed out.
    pub kv_blocks_total: usize,
    /// Preemptions so far.
    pub preemptions: u64,
    /// Rejections so far.
    pub rejected: RejectCounts,
    /// Finishes so far.
    pub finished: FinishCounts,
    /// Largest idle latency so far among live requests, at the last time the scheduler was
    /// called with (engine clock): the live gauge that shows a stall before requests end.
    pub max_idle_in_flight: f64,
    /// Steps planned.
    pub steps: u64,
    /// Prompt tokens of requests added, looked up in the prefix cache (0 with it off).
    #[serde(default)]
    pub prefix_cache_queries: u64,
    /// Of those, tokens found cached when the requests started.
    #[serde(default)]
    pub prefix_cache_hits: u64,
    /// What smooth's door has seen and done (`None` for a policy without a door of its own).
    #[serde(default)]
    pub door: Option<policy::DoorStats>,
    /// Prompt tokens still to prefill, waiting requests' and running ones' together.
    #[serde(default)]
    pub queued_tokens: usize,
    /// Tokens the running requests hold (prompt and output so far).
    #[serde(default)]
    pub running_tokens: usize,
    /// Seconds until a request arriving now would start: the queued prompt tokens at full
    /// prefill steps (the routers' load signal, `/get_load`).
    #[serde(default)]
    pub predicted_wait_s: f64,
}

impl SchedulerStats {
    /// Adds another replica's counters and gauges to these (a fleet's total; the largest idle
    /// latency is the larger of the two, the predicted wait the shorter: where a router would
    /// send the next request).
    pub fn absorb(&mut self, o: &Self) {
        self.running += o.running;
        self.waiting += o.waiting;
        self.preempted_waiting += o.preempted_waiting;
        self.kv_blocks_used += o.kv_blocks_used;
        self.kv_blocks_total += o.kv_blocks_total;
        self.preemptions += o.preemptions;
        self.rejected.absorb(&o.rejected);
        self.finished.absorb(&o.finished);
        self.max_idle_in_flight = self.max_idle_in_flight.max(o.max_idle_in_flight);
        self.steps += o.steps;
        self.prefix_cache_queries += o.prefix_cache_queries;
        self.prefix_cache_hits += o.prefix_cache_hits;
        self.door = match (self.door, o.door) {
            (Some(a), Some(b)) => Some(policy::DoorStats {
                overloaded: a.overloaded || b.overloaded,
                arrivals: a.arrivals + b.arrivals,
                overloaded_arrivals: a.overloaded_arrivals + b.overloaded_arrivals,
                returns: a.returns + b.returns,
                refused: a.refused + b.refused,
            }),
            (a, b) => a.or(b),
        };
        self.queued_tokens += o.queued_tokens;
        self.running_tokens += o.running_tokens;
        self.predicted_wait_s = self.predicted_wait_s.min(o.predicted_wait_s);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Waiting,
    Running,
}

#[derive(Debug, Clone)]
struct Req {
    id: RequestId,
    tokens: Vec<u32>,
    prompt_len: usize,
    max_output: usize,
    min_tokens: usize,
    stop_token_ids: Vec<u32>,
    arrival: f64,
    class: SloClass,
    num_computed: usize,
    blocks: Vec<u32>,
    state: State,
    first_token: Option<f64>,
    last_token: Option<f64>,
    max_lateness: f64,
    num_preemptions: u32,
    /// Step number this request was last given tokens in.
    granted_in: u64,
    /// Output the length model expected of it at admission.
    expected_output: f64,
    /// Prefix-cache salt (0: the shared default).
    salt: u64,
    /// Per full block registered so far (a prefix of `blocks`): its chain hash and the block the
    /// cache holds for it (this request's, or an identical one).
    chain: Vec<(u64, u32)>,
    /// A different prefix holds one of this request's hashes: register nothing further.
    chain_broken: bool,
    /// Prompt tokens found in the prefix cache when it started (first start only).
    cached_tokens: Option<usize>,
    /// Cached prefix tokens seen at admission, counted as computed in a waiting request's view.
    cached_hint: usize,
}

impl Req {
    fn num_output(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    fn view(&self) -> SeqView {
        SeqView {
            id: self.id,
            arrival: self.arrival,
            class: self.class,
            prompt_len: self.prompt_len,
            cached_prompt: self.cached_tokens.unwrap_or(self.cached_hint),
            num_tokens: self.tokens.len(),
            num_computed: if self.blocks.is_empty() { self.num_computed.max(self.cached_hint) } else { self.num_computed },
            num_output: self.num_output(),
            max_output: self.max_output,
            blocks_held: self.blocks.len(),
            first_token_time: self.first_token,
            last_token_time: self.last_token,
            max_lateness: self.max_lateness,
            num_preemptions: self.num_preemptions,
            runs_to_max: self.runs_to_max(),
        }
    }

    /// No stop token can end it: it produces `max_output` unless its client leaves.
    fn runs_to_max(&self) -> bool {
        self.stop_token_ids.is_empty()
    }

    fn idle_at(&self, now: f64) -> f64 {
        self.max_lateness.max(now - self.class.deadline(self.arrival, self.num_output() + 1)).max(0.0)
    }
}

/// Hashes request ids with one multiply (Fx style): ids are server-chosen integers, not
/// attacker-controlled keys, and SipHash showed up in profiles at a thousand lookups a step.
#[derive(Debug, Default, Clone, Copy)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// The scheduler: owns request state and the block pool; a [`Policy`] makes the decisions.
pub struct Scheduler {
    cfg: SchedulerConfig,
    policy: Box<dyn Policy>,
    pool: BlockPool,
    cost: StepCostModel,
    lengths: LengthModel,
    patience: PatienceModel,
    /// Engine times of the latest ends of requests (finished for any reason, or refused), in
    /// the order they were registered; between `RECENT_ENDS` and twice that many.
    end_times: Vec<f64>,
    /// Requests ended so far (finished for any reason, or refused).
    ends: u64,
    /// Requests that ran to their end (stop or length) so far.
    completed: u64,
    /// Longest sequence the pool and `max_model_len` both allow.
    max_len: usize,
    slots: Vec<Option<Req>>,
    free_slots: Vec<usize>,
    index: HashMap<RequestId, usize, BuildHasherDefault<IdHasher>>,
    running: Vec<usize>,
    waiting: VecDeque<usize>,
    /// Uncomputed tokens of waiting requests.
    queued_tokens: usize,
    released: Vec<RequestId>,
    pending: Vec<Event>,
    step: u64,
    last_now: f64,
    preemptions: u64,
    rejected: RejectCounts,
    finished: FinishCounts,
    view_running: Vec<SeqView>,
    view_waiting: Vec<SeqView>,
    /// The waiting queue changed since `view_waiting` was built (a waiting request's view does
    /// not change while it waits, so an unchanged queue keeps its views).
    waiting_dirty: bool,
    /// A running request ended since the views were built (it must not count at admission).
    running_dirty: bool,
    decisions: Decisions,
    /// `expected / actual` output of requests that stopped by themselves, until drained.
    length_errors: Vec<f64>,
    prefix_queries: u64,
    prefix_hits: u64,
}

/// Undrained length errors kept at most (a caller that never drains loses the rest).
const MAX_LENGTH_ERRORS: usize = 4096;
/// Recent end times kept for the policy at least (more ends than this between two arrivals
/// are counted, not timed).
const RECENT_ENDS: usize = 1024;

impl Scheduler {
    /// A scheduler with `policy`.
    ///
    /// # Panics
    /// If `block_size`, `max_num_seqs`, `max_batch_tokens` or `max_model_len` is zero.
    pub fn new(cfg: SchedulerConfig, policy: Box<dyn Policy>) -> Self {
        assert!(cfg.block_size > 0 && cfg.max_num_seqs > 0 && cfg.max_batch_tokens > 0 && cfg.max_model_len > 0);
        let pool = BlockPool::new(cfg.num_kv_blocks.max(1), cfg.block_size.max(1));
        let max_len = cfg.max_model_len.min(pool.capacity() * cfg.block_size);
        Self {
            cost: StepCostModel::new(cfg.cost_prior),
            patience: PatienceModel::default(),
            end_times: Vec::new(),
            ends: 0,
            completed: 0,
            lengths: LengthModel::new(cfg.lengths),
            policy,
            pool,
            max_len,
            slots: Vec::new(),
            free_slots: Vec::new(),
            index: HashMap::default(),
            running: Vec::new(),
            waiting: VecDeque::new(),
            queued_tokens: 0,
            released: Vec::new(),
            pending: Vec::new(),
            step: 0,
            last_now: 0.0,
            preemptions: 0,
            rejected: RejectCounts::default(),
            finished: FinishCounts::default(),
            view_running: Vec::new(),
            view_waiting: Vec::new(),
            waiting_dirty: false,
            running_dirty: false,
            decisions: Decisions::default(),
            length_errors: Vec::new(),
            prefix_queries: 0,
            prefix_hits: 0,
            cfg,
        }
    }

    /// A scheduler with the policy called `name` (`smooth`, `fcfs`, `drop-late`).
    pub fn with_policy_name(cfg: SchedulerConfig, name: &str) -> Option<Self> {
        policy::by_name(name).map(|p| Self::new(cfg, p))
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// The step-cost model (to replace it with a profiled one, see [`Self::set_cost_model`]).
    pub fn cost_model(&self) -> &StepCostModel {
        &self.cost
    }

    /// The output-length model.
    pub fn length_model(&self) -> &LengthModel {
        &self.lengths
    }

    /// `expected / actual` output length of every request that stopped by itself since the last
    /// call (expected: the length model's prediction when it was admitted).
    pub fn drain_length_errors(&mut self) -> std::vec::Drain<'_, f64> {
        self.length_errors.drain(..)
    }

    /// Use `model`, for example one seeded by a start-up profile.
    pub fn set_cost_model(&mut self, model: StepCostModel) {
        self.cost = model;
    }

    /// Feed a measured step to the cost model.
    pub fn observe_step(&mut self, shape: &StepShape, measured_secs: f64) {
        self.cost.observe(shape, measured_secs);
    }

    /// True while any request is waiting or running, or events are pending.
    pub fn has_unfinished(&self) -> bool {
        !self.index.is_empty() || !self.pending.is_empty()
    }

    /// A request ended (finished for any reason, or refused) at `now`.
    fn note_end(&mut self, now: f64) {
        if self.end_times.len() >= 2 * RECENT_ENDS {
            self.end_times.drain(..RECENT_ENDS);
        }
        self.end_times.push(now);
        self.ends += 1;
    }

    /// Admit `req` into the waiting queue, or refuse it.
    pub fn add(&mut self, req: NewRequest, now: f64) -> Result<(), Rejection> {
        self.last_now = self.last_now.max(now);
        let result = self.check(&req, now);
        if let Err(rej) = result {
            self.rejected.bump(rej.reason);
            self.note_end(now);
            return Err(rej);
        }
        let max_output = req.max_tokens.min(self.max_len - req.prompt.len());
        let salt = req.cache_salt.unwrap_or(0);
        let cached_hint = self.cached_prefix(&req.prompt, salt).len() * self.cfg.block_size;
        if self.cfg.enable_prefix_caching {
            self.prefix_queries += req.prompt.len() as u64;
        }
        let r = Req {
            id: req.id,
            prompt_len: req.prompt.len(),
            tokens: req.prompt,
            max_output,
            min_tokens: req.min_tokens,
            stop_token_ids: req.stop_token_ids,
            arrival: req.arrival,
            class: req.class.unwrap_or(self.cfg.slo.default_class),
            num_computed: 0,
            blocks: Vec::new(),
            state: State::Waiting,
            first_token: None,
            last_token: None,
            max_lateness: 0.0,
            num_preemptions: 0,
            granted_in: u64::MAX,
            expected_output: self.lengths.expected_total(max_output),
            salt,
            chain: Vec::new(),
            chain_broken: false,
            cached_tokens: None,
            cached_hint,
        };
        self.queued_tokens += r.tokens.len();
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.slots[s] = Some(r);
                s
            }
            None => {
                self.slots.push(Some(r));
                self.slots.len() - 1
            }
        };
        self.index.insert(req.id, slot);
        self.waiting.push_back(slot);
        Ok(())
    }

    fn check(&mut self, req: &NewRequest, now: f64) -> Result<(), Rejection> {
        let refuse = |reason, retry_after_s| Err(Rejection { reason, retry_after_s });
        let class_ok = req.class.is_none_or(|c| c.reading_rate > 0.0 && c.reading_rate.is_finite() && c.grace >= 0.0 && c.weight > 0.0 && c.weight.is_finite());
        if req.prompt.is_empty() || req.max_tokens == 0 || !req.arrival.is_finite() || !class_ok || self.index.contains_key(&req.id) {
            return refuse(RejectReason::Invalid, 0.0);
        }
        if req.prompt.len() >= self.max_len {
            return refuse(RejectReason::TooLong, 0.0);
        }
        if self.waiting.len() >= self.cfg.max_queue_requests {
            return refuse(RejectReason::QueueFull, self.predicted_wait(0));
        }
        if self.queued_tokens + req.prompt.len() > self.cfg.max_queue_tokens {
            return refuse(RejectReason::QueueTokens, self.predicted_wait(0));
        }
        let cached = self.cached_prefix(&req.prompt, req.cache_salt.unwrap_or(0)).len() * self.cfg.block_size;
        let view = SeqView {
            id: req.id,
            arrival: req.arrival,
            class: req.class.unwrap_or(self.cfg.slo.default_class),
            prompt_len: req.prompt.len(),
            cached_prompt: cached,
            num_tokens: req.prompt.len(),
            num_computed: cached,
            num_output: 0,
            max_output: req.max_tokens.min(self.max_len - req.prompt.len()),
            blocks_held: 0,
            first_token_time: None,
            last_token_time: None,
            max_lateness: 0.0,
            num_preemptions: 0,
            runs_to_max: req.stop_token_ids.is_empty(),
        };
        // The views are those of the last `schedule` plus the requests added since (a step
        // stale at most in their token counts, which keeps a burst of `add`s O(1) each), rebuilt
        // once a request has ended or left the queue since: a stream that finished or whose
        // client left must not hold a place in the prediction, and on an idle engine no
        // `schedule` comes to rebuild them.
        if self.running_dirty || self.waiting_dirty {
            self.refresh_views();
        }
        let (policy, ctx) = self.split_for_policy(now);
        policy.admit(&view, &ctx).or_else(|(reason, retry)| refuse(reason, retry))?;
        self.view_waiting.push(view);
        Ok(())
    }

    /// The registered blocks holding a prefix of `tokens` (salted `salt`) that a request could
    /// start from: full blocks only, and never its last token (whose logits it must compute).
    fn cached_prefix(&self, tokens: &[u32], salt: u64) -> Vec<u32> {
        if !self.cfg.enable_prefix_caching || tokens.is_empty() {
            return Vec::new();
        }
        self.pool.lookup(tokens, salt, (tokens.len() - 1) / self.cfg.block_size)
    }

    /// A waiting request holding no block starts from the cached prefix of its tokens: it takes
    /// references to those blocks and counts their tokens as computed.
    fn attach_prefix(&mut self, slot: usize) {
        if !self.cfg.enable_prefix_caching {
            return;
        }
        let bs = self.cfg.block_size;
        let r = self.slots[slot].as_ref().expect("live slot");
        if !r.blocks.is_empty() || r.num_computed != 0 {
            return;
        }
        let hit = self.cached_prefix(&r.tokens, r.salt);
        self.pool.acquire(&hit);
        let r = self.slots[slot].as_mut().expect("live slot");
        let mut h = ROOT_HASH;
        r.chain.clear();
        r.chain_broken = false;
        for (i, &b) in hit.iter().enumerate() {
            h = chain_hash(h, r.salt, &r.tokens[i * bs..(i + 1) * bs]);
            r.chain.push((h, b));
        }
        let n = hit.len() * bs;
        r.blocks = hit;
        r.num_computed = n;
        self.queued_tokens -= n;
    }

    /// Gives back the cached prefix a waiting request took ([`Self::attach_prefix`]).
    fn detach_prefix(&mut self, slot: usize) {
        let r = self.slots[slot].as_mut().expect("live slot");
        debug_assert!(r.state == State::Waiting);
        self.queued_tokens += r.num_computed;
        r.num_computed = 0;
        r.chain.clear();
        self.pool.free_all(&mut r.blocks);
    }

    /// Registers the full blocks of `slot`'s request that the last step computed.
    fn register_blocks(&mut self, slot: usize) {
        let bs = self.cfg.block_size;
        let r = self.slots[slot].as_mut().expect("live slot");
        let full = (r.num_computed / bs).min(r.blocks.len());
        while !r.chain_broken && r.chain.len() < full {
            let i = r.chain.len();
            let (parent_hash, parent) = r.chain.last().map_or((ROOT_HASH, None), |&(h, b)| (h, Some(b)));
            let tokens = &r.tokens[i * bs..(i + 1) * bs];
            let h = chain_hash(parent_hash, r.salt, tokens);
            match self.pool.register(r.blocks[i], parent, r.salt, tokens, h) {
                Some(b) => r.chain.push((h, b)),
                None => r.chain_broken = true,
            }
        }
    }

    /// Seconds until a request arriving now would start, with `extra` prompt tokens more
    /// queued: the queued prompt tokens at full prefill steps (the Retry-After of a full queue,
    /// and the routers' load signal, `/get_load`'s `predicted_wait_s`).
    pub fn predicted_wait(&self, extra: usize) -> f64 {
        let mut full = StepShape::default();
        full.add_slice(0, self.cfg.max_batch_tokens.max(2));
        let rate = full.prefill_tokens as f64 / self.cost.predict(&full).max(1e-9);
        (self.queued_tokens + extra) as f64 / rate
    }

    /// Tokens of work: the prompt tokens still to prefill plus the tokens the running requests
    /// hold (`/get_load`'s `num_tokens`).
    pub fn num_tokens(&self) -> usize {
        self.queued_tokens + self.running.iter().filter_map(|&s| self.slots[s].as_ref()).map(|r| r.tokens.len()).sum::<usize>()
    }

    /// Requests in the running batch.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Requests waiting (preempted included).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    fn refresh_views(&mut self) {
        self.running_dirty = false;
        self.view_running.clear();
        for &s in &self.running {
            self.view_running.push(self.slots[s].as_ref().expect("live slot").view());
        }
        if self.waiting_dirty {
            self.view_waiting.clear();
            for &s in &self.waiting {
                self.view_waiting.push(self.slots[s].as_ref().expect("live slot").view());
            }
            self.waiting_dirty = false;
        }
    }

    fn split_for_policy(&mut self, now: f64) -> (&mut Box<dyn Policy>, PolicyContext<'_>) {
        let ctx = PolicyContext {
            now,
            running: &self.view_running,
            waiting: &self.view_waiting,
            free_blocks: self.pool.num_free(),
            total_blocks: self.pool.capacity(),
            block_size: self.cfg.block_size,
            max_num_seqs: self.cfg.max_num_seqs,
            max_batch_tokens: self.cfg.max_batch_tokens,
            cost: &self.cost,
            lengths: &self.lengths,
            patience: &self.patience,
            recent_ends: &self.end_times,
            ends: self.ends,
            completed: self.completed,
            slo: &self.cfg.slo,
        };
        (&mut self.policy, ctx)
    }

    /// Plan the next step.
    pub fn schedule(&mut self, now: f64) -> BatchPlan {
        let mut plan = BatchPlan::default();
        self.schedule_into(now, &mut plan);
        plan
    }

    /// [`Self::schedule`] into a plan whose buffers are reused: the slices' token and block
    /// vectors of the previous plan are refilled instead of reallocated (with a thousand
    /// sequences a step, allocation would otherwise dominate the scheduler's time).
    pub fn schedule_into(&mut self, now: f64, plan: &mut BatchPlan) {
        self.last_now = self.last_now.max(now);
        self.step += 1;
        let step = self.step;
        self.refresh_views();
        self.lengths.refresh();
        self.patience.refresh();
        let mut d = std::mem::take(&mut self.decisions);
        d.clear();
        {
            let (policy, ctx) = self.split_for_policy(now);
            policy.plan(&ctx, &mut d);
        }
        for &id in &d.drop {
            if let Some(ev) = self.finish(id, FinishReason::Dropped, now) {
                self.pending.push(ev);
            }
        }
        let mut spare = std::mem::take(&mut plan.seqs);
        let mut seqs = Vec::with_capacity(spare.len());
        let mut budget = self.cfg.max_batch_tokens;
        let mut victim_pos = 0;
        let mut admitted = false;
        for g in &d.grants {
            if budget == 0 {
                break;
            }
            let Some(&slot) = self.index.get(&g.id) else { continue };
            let r = self.slots[slot].as_ref().expect("live slot");
            if r.granted_in == step || (r.state == State::Waiting && self.running.len() >= self.cfg.max_num_seqs) {
                continue;
            }
            if r.state == State::Waiting && r.blocks.is_empty() {
                self.attach_prefix(slot);
            }
            let r = self.slots[slot].as_ref().expect("live slot");
            let mut want = g.tokens.min(r.tokens.len() - r.num_computed).min(budget);
            if want == 0 {
                continue;
            }
            let bs = self.cfg.block_size;
            let need = |r: &Req, want: usize| (r.num_computed + want).div_ceil(bs).saturating_sub(r.blocks.len());
            if need(r, want) > self.pool.num_free() && g.may_preempt {
                while need(self.slots[slot].as_ref().expect("live slot"), want) > self.pool.num_free() && victim_pos < d.victims.len() {
                    let v = d.victims[victim_pos];
                    victim_pos += 1;
                    if v != g.id {
                        self.preempt(v, step);
                    }
                }
            }
            let r = self.slots[slot].as_mut().expect("live slot");
            let room = (r.blocks.len() + self.pool.num_free()) * bs;
            want = want.min(room.saturating_sub(r.num_computed));
            if want == 0 {
                if r.state == State::Waiting && !r.blocks.is_empty() {
                    // It took a cached prefix but cannot start: a waiting request holds no
                    // block (nothing could preempt it to get them back).
                    self.detach_prefix(slot);
                }
                continue;
            }
            let n = (r.num_computed + want).div_ceil(bs) - r.blocks.len();
            let ok = self.pool.allocate_n(n, &mut r.blocks);
            debug_assert!(ok, "room was checked");
            if r.state == State::Waiting {
                r.state = State::Running;
                if r.cached_tokens.is_none() {
                    // Its first start: what it found cached is what it did not compute.
                    r.cached_tokens = Some(r.num_computed);
                    self.prefix_hits += r.num_computed as u64;
                }
                self.queued_tokens -= r.tokens.len() - r.num_computed;
                self.running.push(slot);
                admitted = true;
            }
            let start = r.num_computed;
            r.num_computed += want;
            r.granted_in = step;
            budget -= want;
            let mut slice = spare.pop().unwrap_or_else(|| SeqSlice { id: 0, tokens: Vec::new(), start_pos: 0, block_table: Vec::new(), sample: false });
            slice.id = r.id;
            slice.tokens.clear();
            slice.tokens.extend_from_slice(&r.tokens[start..start + want]);
            slice.start_pos = start;
            slice.block_table.clear();
            slice.block_table.extend_from_slice(&r.blocks);
            slice.sample = r.num_computed == r.tokens.len();
            seqs.push(slice);
        }
        if admitted {
            self.waiting_dirty = true;
            let slots = &self.slots;
            self.waiting.retain(|&s| slots[s].as_ref().is_some_and(|r| r.state == State::Waiting));
        }
        self.decisions = d;
        plan.step = step;
        plan.seqs = seqs;
        plan.released.clear();
        plan.released.append(&mut self.released);
    }

    /// Preempt a running request that was not given tokens this step: free its blocks and queue
    /// it (first) for a recompute prefill over prompt and output.
    fn preempt(&mut self, id: RequestId, step: u64) {
        let Some(&slot) = self.index.get(&id) else { return };
        let r = self.slots[slot].as_mut().expect("live slot");
        if r.state != State::Running || r.granted_in == step {
            return;
        }
        self.pool.free_all(&mut r.blocks);
        r.num_computed = 0;
        r.chain.clear();
        r.state = State::Waiting;
        r.num_preemptions += 1;
        self.queued_tokens += r.tokens.len();
        self.preemptions += 1;
        self.running.retain(|&s| s != slot);
        self.waiting.push_front(slot);
        self.waiting_dirty = true;
    }

    /// Apply a finished step: append sampled tokens, finish requests that stop or reach their
    /// length. Returns those events after any pending from `schedule`.
    ///
    /// `out.sampled` holds one token per `sample` slice of `plan`, in plan order. Tokens for
    /// requests that ended meanwhile (aborted between schedule and update) are ignored; a sample
    /// slice without a token is computed again next step.
    pub fn update(&mut self, plan: &BatchPlan, out: &StepOutput, now: f64) -> Vec<Event> {
        self.last_now = self.last_now.max(now);
        let mut events = std::mem::take(&mut self.pending);
        if self.cfg.enable_prefix_caching {
            // The step wrote these slices' KV: their full blocks can be shared from now on.
            for slice in &plan.seqs {
                if let Some(&slot) = self.index.get(&slice.id) {
                    if self.slots[slot].as_ref().is_some_and(|r| r.state == State::Running) {
                        self.register_blocks(slot);
                    }
                }
            }
        }
        let mut sampled = out.sampled.iter().peekable();
        for slice in plan.seqs.iter().filter(|s| s.sample) {
            let s = match sampled.peek() {
                Some(s) if s.id == slice.id => sampled.next().expect("peeked"),
                // The runner returned no token for this slice: forget the last position so that
                // the next step computes it again instead of waiting forever for a sample.
                _ => {
                    if let Some(r) = self.index.get(&slice.id).and_then(|&slot| self.slots[slot].as_mut()) {
                        if r.state == State::Running && r.num_computed == r.tokens.len() {
                            r.num_computed -= 1;
                        }
                    }
                    continue;
                }
            };
            let Some(&slot) = self.index.get(&s.id) else { continue };
            let r = self.slots[slot].as_mut().expect("live slot");
            if r.state != State::Running || r.num_computed != r.tokens.len() {
                continue;
            }
            r.tokens.push(s.token);
            let n = r.num_output();
            r.max_lateness = r.max_lateness.max(now - r.class.deadline(r.arrival, n));
            r.first_token.get_or_insert(now);
            r.last_token = Some(now);
            let stop = (n >= r.min_tokens && r.stop_token_ids.contains(&s.token)) || out.complete.contains(&s.id);
            let length = n >= r.max_output;
            events.push(Event::Token { id: s.id, sampled: s.clone(), time: now });
            let reason = if stop {
                Some(FinishReason::Stop)
            } else if length {
                Some(FinishReason::Length)
            } else {
                None
            };
            if let Some(reason) = reason {
                events.extend(self.finish(s.id, reason, now));
            }
        }
        for &id in &out.failed {
            events.extend(self.finish(id, FinishReason::Error, now));
        }
        events
    }

    /// The step carrying `plan` failed: every request in it finishes with `Error` and frees its
    /// blocks. Returns those events after any pending from `schedule`.
    pub fn fail_step(&mut self, plan: &BatchPlan, now: f64) -> Vec<Event> {
        let mut events = std::mem::take(&mut self.pending);
        for s in &plan.seqs {
            events.extend(self.finish(s.id, FinishReason::Error, now));
        }
        events
    }

    /// The client went away: finish with `Abort` and free its blocks. `None` if the request is
    /// unknown or already finished.
    pub fn abort(&mut self, id: RequestId, now: f64) -> Option<Event> {
        self.finish(id, FinishReason::Abort, now)
    }

    /// Finish a live request from outside a step: `Abort`, `Stop` (the server matched a stop
    /// string while detokenizing) or `Error`. `None` if the request is unknown or finished.
    pub fn finish(&mut self, id: RequestId, reason: FinishReason, now: f64) -> Option<Event> {
        let slot = self.index.remove(&id)?;
        let mut r = self.slots[slot].take().expect("live slot");
        self.free_slots.push(slot);
        self.pool.free_all(&mut r.blocks);
        match r.state {
            State::Running => {
                self.running.retain(|&s| s != slot);
                self.running_dirty = true;
            }
            State::Waiting => {
                self.queued_tokens -= r.tokens.len() - r.num_computed;
                self.waiting.retain(|&s| s != slot);
                self.waiting_dirty = true;
            }
        }
        self.finished.bump(reason);
        self.note_end(now);
        self.completed += u64::from(matches!(reason, FinishReason::Stop | FinishReason::Length));
        // What the request says about output lengths: a stop is an observed length; a cut
        // (length limit, client gone, drop) only bounds it from below; one that no stop token
        // could end says nothing about where answers end.
        match reason {
            _ if r.runs_to_max() => {}
            FinishReason::Stop => {
                self.lengths.observe(r.max_output, r.num_output(), false);
                if self.length_errors.len() < MAX_LENGTH_ERRORS && r.num_output() > 0 {
                    self.length_errors.push(r.expected_output / r.num_output() as f64);
                }
            }
            FinishReason::Length | FinishReason::Abort | FinishReason::Dropped => {
                self.lengths.observe(r.max_output, r.num_output(), true);
            }
            FinishReason::Error | FinishReason::Rejected => {}
        }
        // What it says about patience: a client that went away while its reader was idle left at
        // that idle latency; one that went away on time (a reader who stopped after enough text)
        // and every other end only bound its patience from below.
        match reason {
            FinishReason::Abort if now > r.class.deadline(r.arrival, r.num_output() + 1) => self.patience.left(r.idle_at(now)),
            FinishReason::Abort | FinishReason::Stop | FinishReason::Length => self.patience.stayed(r.max_lateness),
            FinishReason::Dropped => self.patience.stayed(r.idle_at(now)),
            FinishReason::Error | FinishReason::Rejected => {}
        }
        self.released.push(id);
        Some(Event::Finished { id, reason, time: now, num_output: r.num_output() })
    }

    fn live(&self) -> impl Iterator<Item = &Req> {
        self.running.iter().chain(self.waiting.iter()).map(|&s| self.slots[s].as_ref().expect("live slot"))
    }

    /// Log the prefix cache's changes from now on ([`Self::take_kv_events`]).
    pub fn record_kv_events(&mut self) {
        self.pool.record_events();
    }

    /// Move the prefix cache's changes since the last call to the end of `out` (nothing unless
    /// [`Self::record_kv_events`] was called).
    pub fn take_kv_events(&mut self, out: &mut Vec<KvEvent>) {
        self.pool.take_events(out);
    }

    /// Counters and gauges at the last time the scheduler was called with.
    pub fn stats(&self) -> SchedulerStats {
        let now = self.last_now;
        SchedulerStats {
            policy: self.policy.name().to_string(),
            running: self.running.len(),
            waiting: self.waiting.len(),
            preempted_waiting: self.live().filter(|r| r.state == State::Waiting && r.num_preemptions > 0).count(),
            kv_blocks_used: self.pool.num_used(),
            kv_blocks_total: self.pool.capacity(),
            preemptions: self.preemptions,
            rejected: self.rejected,
            finished: self.finished,
            max_idle_in_flight: self.live().map(|r| r.idle_at(now)).fold(0.0, f64::max),
            steps: self.step,
            prefix_cache_queries: self.prefix_queries,
            prefix_cache_hits: self.prefix_hits,
            door: self.decisions.door,
            queued_tokens: self.queued_tokens,
            running_tokens: self.live().filter(|r| r.state == State::Running).map(|r| r.tokens.len()).sum(),
            predicted_wait_s: self.predicted_wait(0),
        }
    }
}
