//! Scheduler tests with synthetic requests, a mock runner and a virtual clock (no model).

use std::collections::{HashMap, HashSet};

use pace_scheduler::policy::{by_name, Smooth, SmoothConfig};
use pace_scheduler::{BatchPlan, Event, FinishReason, NewRequest, RejectReason, SampledToken, Scheduler, SchedulerConfig, StepOutput, StepShape};
use rand::{Rng, SeedableRng};

/// A runner that checks every plan against the true sequences and samples a deterministic token.
#[derive(Default)]
struct MockRunner {
    /// The true sequence of each live request: prompt, then every token sampled for it.
    seqs: HashMap<u64, Vec<u32>>,
    /// Tokens the runner holds in its KV cache for each request.
    cached: HashMap<u64, usize>,
}

impl MockRunner {
    fn token(id: u64, pos: usize) -> u32 {
        2 + ((id as usize * 31 + pos * 7) % 1000) as u32
    }

    fn execute(&mut self, plan: &BatchPlan, cfg: &SchedulerConfig) -> StepOutput {
        for id in &plan.released {
            self.seqs.remove(id);
            self.cached.remove(id);
        }
        let mut out = StepOutput::default();
        let mut blocks_seen = HashSet::new();
        for s in &plan.seqs {
            let seq = self.seqs.get_mut(&s.id).expect("plan names a known request");
            assert!(!s.tokens.is_empty());
            let cached = self.cached.entry(s.id).or_insert(0);
            assert!(s.start_pos <= *cached, "slice starts past the cached tokens");
            assert_eq!(&seq[s.start_pos..s.start_pos + s.len()], &s.tokens[..], "fed tokens differ from the sequence");
            assert_eq!(s.block_table.len(), s.context_len().div_ceil(cfg.block_size), "block table covers the context");
            for &b in &s.block_table {
                assert_ne!(b, 0, "null block in a block table");
                assert!((b as usize) < cfg.num_kv_blocks);
                assert!(blocks_seen.insert(b), "block {b} in two slices");
            }
            *cached = s.context_len();
            assert_eq!(s.sample, s.context_len() == seq.len(), "sample exactly on the last known token");
            if s.sample {
                let tok = Self::token(s.id, seq.len());
                seq.push(tok);
                out.sampled.push(SampledToken { id: s.id, token: tok, logprob: None, top_logprobs: vec![] });
            }
        }
        out
    }
}

fn request(id: u64, prompt: usize, max_tokens: usize, arrival: f64) -> NewRequest {
    NewRequest {
        id,
        prompt: (0..prompt).map(|i| 2 + (i as u32 * 13 + id as u32) % 500).collect(),
        max_tokens,
        min_tokens: 0,
        stop_token_ids: vec![],
        arrival,
        class: None,
        cache_salt: None,
    }
}

struct Harness {
    sched: Scheduler,
    runner: MockRunner,
    now: f64,
    events: Vec<Event>,
    plans: Vec<BatchPlan>,
}

impl Harness {
    fn new(cfg: SchedulerConfig, policy: &str) -> Self {
        Self { sched: Scheduler::with_policy_name(cfg, policy).expect("policy"), runner: MockRunner::default(), now: 0.0, events: vec![], plans: vec![] }
    }

    fn add(&mut self, req: NewRequest) -> Result<(), pace_scheduler::Rejection> {
        let (id, prompt) = (req.id, req.prompt.clone());
        let arrival = req.arrival;
        self.sched.add(req, arrival).inspect(|_| {
            self.runner.seqs.insert(id, prompt);
        })
    }

    /// One step of `dt` seconds; returns the plan.
    fn step(&mut self, dt: f64) -> BatchPlan {
        let cfg = self.sched.config().clone();
        let plan = self.sched.schedule(self.now);
        assert!(plan.num_tokens() <= cfg.max_batch_tokens, "token budget");
        assert!(self.sched.stats().running <= cfg.max_num_seqs, "sequence budget");
        let ids: HashSet<u64> = plan.seqs.iter().map(|s| s.id).collect();
        assert_eq!(ids.len(), plan.seqs.len(), "a request twice in one plan");
        let out = self.runner.execute(&plan, &cfg);
        self.now += dt;
        let ev = self.sched.update(&plan, &out, self.now);
        self.events.extend(ev);
        self.plans.push(plan.clone());
        plan
    }

    fn finished(&self) -> HashMap<u64, (FinishReason, usize)> {
        self.events
            .iter()
            .filter_map(|e| match *e {
                Event::Finished { id, reason, num_output, .. } => Some((id, (reason, num_output))),
                _ => None,
            })
            .collect()
    }

    fn tokens_of(&self, id: u64) -> Vec<u32> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Token { id: i, sampled, .. } if *i == id => Some(sampled.token),
                _ => None,
            })
            .collect()
    }
}

fn small_cfg() -> SchedulerConfig {
    SchedulerConfig { block_size: 4, num_kv_blocks: 41, max_num_seqs: 6, max_batch_tokens: 32, max_model_len: 128, ..SchedulerConfig::default() }
}

#[test]
fn budgets_respected_and_every_request_finishes_for_every_policy() {
    for policy in ["fcfs", "smooth", "drop-late"] {
        for seed in 0..5u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut h = Harness::new(small_cfg(), policy);
            let mut next_id = 0;
            for _ in 0..400 {
                if rng.random_bool(0.3) {
                    let p = rng.random_range(1..40);
                    let _ = h.add(request(next_id, p, rng.random_range(1..30), h.now));
                    next_id += 1;
                }
                h.step(0.01);
            }
            let mut guard = 0;
            while h.sched.has_unfinished() {
                h.step(0.01);
                guard += 1;
                assert!(guard < 20_000, "{policy}: requests never finish");
            }
            let s = h.sched.stats();
            assert_eq!(s.kv_blocks_used, 0, "{policy}: blocks leaked");
            assert_eq!((s.running, s.waiting), (0, 0));
        }
    }
}

/// fcfs under KV pressure: everyone finishes, with exactly `max_tokens` tokens, and first tokens
/// come in arrival order when prompts are equal (nobody is overtaken forever).
#[test]
fn fcfs_never_starves_and_preempted_requests_resume_with_correct_tokens() {
    let cfg = SchedulerConfig { num_kv_blocks: 25, ..small_cfg() }; // 96 tokens of KV
    let mut h = Harness::new(cfg, "fcfs");
    for id in 0..12 {
        h.add(request(id, 12, 20, 0.0)).unwrap();
    }
    let mut guard = 0;
    while h.sched.has_unfinished() {
        h.step(0.01);
        guard += 1;
        assert!(guard < 5_000, "starved");
    }
    let stats = h.sched.stats();
    assert!(stats.preemptions > 0, "the test must exercise preemption");
    let fin = h.finished();
    for id in 0..12 {
        assert_eq!(fin[&id], (FinishReason::Length, 20), "request {id}");
        let expected: Vec<u32> = (12..32).map(|pos| MockRunner::token(id, pos)).collect();
        assert_eq!(h.tokens_of(id), expected, "request {id}: tokens after recompute");
    }
    let first_token_order: Vec<u64> =
        h.events.iter().filter_map(|e| if let Event::Token { id, .. } = e { Some(*id) } else { None }).fold(vec![], |mut seen, id| {
            if !seen.contains(&id) {
                seen.push(id);
            }
            seen
        });
    assert_eq!(first_token_order, (0..12).collect::<Vec<_>>());
}

#[test]
fn a_preempted_request_recomputes_prompt_and_output_then_samples_a_new_token() {
    // Two requests that cannot both hold their full length: the newer one is preempted.
    let cfg = SchedulerConfig { block_size: 4, num_kv_blocks: 7, max_batch_tokens: 64, ..small_cfg() };
    let mut h = Harness::new(cfg, "fcfs");
    h.add(request(1, 8, 8, 0.0)).unwrap();
    h.add(request(2, 8, 8, 0.0)).unwrap();
    while h.sched.has_unfinished() {
        h.step(0.01);
    }
    assert!(h.sched.stats().preemptions >= 1);
    // Find the recompute: a slice of request 2 starting at 0 after it had produced output.
    let mut produced = 0;
    let (mut recomputing, mut recomputes) = (false, 0);
    for plan in &h.plans {
        for s in plan.seqs.iter().filter(|s| s.id == 2) {
            if s.start_pos == 0 && produced > 0 {
                recomputing = true;
                recomputes += 1;
            }
            if s.sample {
                if recomputing {
                    // The recompute covers prompt and every output so far, and only then samples.
                    assert_eq!(s.context_len(), 8 + produced);
                    recomputing = false;
                }
                produced += 1;
            }
        }
    }
    assert!(recomputes >= 1);
    assert_eq!(h.finished()[&2], (FinishReason::Length, 8));
}

#[test]
fn abort_frees_blocks_and_releases_the_request() {
    let mut h = Harness::new(small_cfg(), "fcfs");
    h.add(request(7, 20, 50, 0.0)).unwrap();
    h.add(request(8, 5, 50, 0.0)).unwrap();
    for _ in 0..3 {
        h.step(0.01);
    }
    assert!(h.sched.stats().kv_blocks_used > 0);
    let ev = h.sched.abort(7, h.now).expect("live");
    assert!(matches!(ev, Event::Finished { id: 7, reason: FinishReason::Abort, .. }));
    assert!(h.sched.abort(7, h.now).is_none(), "second abort is a no-op");
    let plan = h.step(0.01);
    assert_eq!(plan.released, vec![7]);
    assert!(plan.seqs.iter().all(|s| s.id != 7));
    h.sched.abort(8, h.now).unwrap();
    assert_eq!(h.sched.stats().kv_blocks_used, 0);
    assert_eq!(h.sched.stats().finished.abort, 2);
    assert!(!h.sched.has_unfinished());
}

#[test]
fn a_token_for_a_request_aborted_during_the_step_is_ignored() {
    let mut h = Harness::new(small_cfg(), "fcfs");
    h.add(request(1, 3, 5, 0.0)).unwrap();
    let plan = h.sched.schedule(0.0);
    let out = h.runner.execute(&plan, &small_cfg());
    h.sched.abort(1, 0.01).unwrap();
    assert!(h.sched.update(&plan, &out, 0.02).is_empty());
}

#[test]
fn fail_step_finishes_the_plan_with_error_and_frees_blocks() {
    let mut h = Harness::new(small_cfg(), "smooth");
    for id in 0..3 {
        h.add(request(id, 6, 10, 0.0)).unwrap();
    }
    let plan = h.sched.schedule(0.0);
    let events = h.sched.fail_step(&plan, 0.1);
    assert_eq!(events.len(), plan.seqs.len());
    assert!(events.iter().all(|e| matches!(e, Event::Finished { reason: FinishReason::Error, .. })));
    assert_eq!(h.sched.stats().kv_blocks_used, 0);
    assert_eq!(h.sched.stats().finished.error as usize, plan.seqs.len());
}

/// A request whose row of logits the runner found broken gets no token and ends with `Error`;
/// the others in the step go on as if nothing happened.
#[test]
fn a_broken_logit_row_fails_only_its_request() {
    let mut h = Harness::new(small_cfg(), "fcfs");
    for id in 0..3 {
        h.add(request(id, 4, 6, 0.0)).unwrap();
    }
    let plan = h.sched.schedule(0.0);
    assert_eq!(plan.seqs.len(), 3);
    let mut out = h.runner.execute(&plan, &small_cfg());
    out.sampled.retain(|s| s.id != 1);
    out.failed.push(1);
    let events = h.sched.update(&plan, &out, 0.1);
    assert!(events.iter().any(|e| matches!(e, Event::Finished { id: 1, reason: FinishReason::Error, num_output: 0, .. })), "{events:?}");
    assert!(!events.iter().any(|e| matches!(e, Event::Token { id: 1, .. })), "no token for the broken row");
    assert_eq!(events.iter().filter(|e| matches!(e, Event::Token { .. })).count(), 2);
    assert_eq!(h.sched.stats().finished.error, 1);
    h.now = 0.1;
    while h.sched.has_unfinished() {
        h.step(0.01);
    }
    let done = h.finished();
    assert_eq!(done[&0], (FinishReason::Length, 6));
    assert_eq!(done[&2], (FinishReason::Length, 6));
    assert_eq!(h.sched.stats().kv_blocks_used, 0);
}

#[test]
fn stop_tokens_respect_min_tokens_and_length_caps_at_max_model_len() {
    let cfg = small_cfg();
    let mut h = Harness::new(cfg.clone(), "fcfs");
    // Request 1 stops on the token its 3rd output would be, but min_tokens=5 ignores it there.
    let stop_at = MockRunner::token(1, 4 + 2);
    let stop_later = MockRunner::token(1, 4 + 6);
    let mut r = request(1, 4, 100, 0.0);
    r.stop_token_ids = vec![stop_at, stop_later];
    r.min_tokens = 5;
    h.add(r).unwrap();
    // Request 2 would generate 500 tokens but max_model_len is 128.
    h.add(request(2, 100, 500, 0.0)).unwrap();
    while h.sched.has_unfinished() {
        h.step(0.01);
    }
    let fin = h.finished();
    assert_eq!(fin[&1], (FinishReason::Stop, 7));
    assert_eq!(fin[&2], (FinishReason::Length, 28));
    // The server can also finish a request itself (a stop string).
    let mut h = Harness::new(cfg, "fcfs");
    h.add(request(3, 4, 100, 0.0)).unwrap();
    h.step(0.01);
    let ev = h.sched.finish(3, FinishReason::Stop, h.now).unwrap();
    assert!(matches!(ev, Event::Finished { reason: FinishReason::Stop, num_output: 1, .. }));
}

#[test]
fn rejections_are_counted_by_reason() {
    let cfg = SchedulerConfig { max_queue_requests: 2, max_queue_tokens: 50, ..small_cfg() };
    let mut sched = Scheduler::with_policy_name(cfg, "fcfs").unwrap();
    let reason = |r: Result<(), pace_scheduler::Rejection>| r.unwrap_err().reason;
    assert_eq!(reason(sched.add(request(1, 0, 5, 0.0), 0.0)), RejectReason::Invalid);
    assert_eq!(reason(sched.add(request(1, 3, 0, 0.0), 0.0)), RejectReason::Invalid);
    assert_eq!(reason(sched.add(request(1, 128, 5, 0.0), 0.0)), RejectReason::TooLong);
    sched.add(request(1, 30, 5, 0.0), 0.0).unwrap();
    assert_eq!(reason(sched.add(request(1, 3, 5, 0.0), 0.0)), RejectReason::Invalid, "duplicate id");
    let rej = sched.add(request(2, 30, 5, 0.0), 0.0).unwrap_err();
    assert_eq!(rej.reason, RejectReason::QueueTokens);
    assert!(rej.retry_after_s > 0.0 && rej.reason.is_overload());
    sched.add(request(3, 3, 5, 0.0), 0.0).unwrap();
    assert_eq!(reason(sched.add(request(4, 3, 5, 0.0), 0.0)), RejectReason::QueueFull);
    let s = sched.stats();
    assert_eq!((s.rejected.invalid, s.rejected.too_long, s.rejected.queue_tokens, s.rejected.queue_full), (3, 1, 1, 1));
    assert_eq!(s.rejected.total(), 6);
    assert_eq!(s.waiting, 2);
}

#[test]
fn drop_late_drops_requests_past_their_ttft_and_accounts_them() {
    let mut cfg = small_cfg();
    cfg.max_num_seqs = 1;
    cfg.slo.binary = "ttft:100".parse().unwrap();
    let mut h = Harness::new(cfg, "drop-late");
    h.add(request(1, 4, 30, 0.0)).unwrap();
    h.add(request(2, 4, 30, 0.0)).unwrap();
    for _ in 0..20 {
        h.step(0.01);
    }
    // Request 2 waited behind request 1 for more than 100 ms without a token.
    let fin = h.finished();
    assert_eq!(fin[&2], (FinishReason::Dropped, 0));
    assert!(!fin.contains_key(&1), "request 1 passed its TTFT and runs on");
    let s = h.sched.stats();
    assert_eq!(s.finished.dropped, 1);
    assert_eq!(s.waiting, 0);
}

#[test]
fn drop_late_drops_a_request_whose_first_token_came_late() {
    let mut cfg = small_cfg();
    cfg.slo.binary = "ttft:100".parse().unwrap();
    let mut h = Harness::new(cfg, "drop-late");
    h.add(request(1, 4, 30, 0.0)).unwrap();
    h.step(0.15); // its first token comes at 0.15 s: past the limit, it can no longer pass
    h.step(0.01);
    assert_eq!(h.finished()[&1], (FinishReason::Dropped, 1));
}

#[test]
fn drop_late_keeps_steps_with_decodes_within_the_tpot_limit() {
    // One stream decoding and a long prompt waiting: drop-late gives the prompt the chunk that
    // keeps the step within 0.9 of the TPOT limit (Sarathi-Serve's budget); fcfs fills the
    // step's token budget; alone, the prompt gets the whole budget.
    let run = |policy: &str, decoding: bool| -> (usize, f64) {
        let mut cfg = SchedulerConfig { max_batch_tokens: 512, max_model_len: 2048, num_kv_blocks: 600, ..small_cfg() };
        cfg.slo.binary = "tpot:200".parse().unwrap();
        let mut h = Harness::new(cfg, policy);
        if decoding {
            h.add(request(1, 4, 100, 0.0)).unwrap();
            h.step(0.05);
        }
        h.add(request(2, 1500, 10, h.now)).unwrap();
        let model = h.sched.cost_model().clone(); // what the plan was made with
        let plan = h.step(0.01);
        let chunk = plan.seqs.iter().filter(|s| s.id == 2).map(|s| s.len()).sum();
        (chunk, model.predict(&StepShape::of(&plan)))
    };
    let (fcfs, _) = run("fcfs", true);
    let (drop, predicted) = run("drop-late", true);
    assert_eq!(fcfs, 511);
    assert!(drop > 0 && drop < fcfs && predicted <= 0.18 + 1e-9, "drop-late chunk {drop}, predicted step {predicted}");
    assert!(predicted > 0.15, "the chunk fills the room: predicted step {predicted}");
    assert_eq!(run("drop-late", false).0, 512);
}

#[test]
fn smooth_rejects_at_the_door_when_the_queue_would_make_a_request_late() {
    let cfg = SchedulerConfig { max_num_seqs: 2, max_batch_tokens: 16, ..small_cfg() };
    let mut sched = Scheduler::new(cfg, Box::new(Smooth::new(SmoothConfig::default())));
    // Each prompt needs many slow steps (1.6 ms a token at the default prior) and none runs: new
    // requests arriving twice a second fall due without completing (a sustained overload), and
    // the queue ahead of a newcomer predicts a first token far past its reading deadline.
    let mut rejected = None;
    for id in 0..200 {
        let t = id as f64 * 0.5;
        if let Err(r) = sched.add(request(id, 100, 5, t), t) {
            rejected = Some(r);
            break;
        }
    }
    let r = rejected.expect("smooth refuses once the queue is long");
    assert_eq!(r.reason, RejectReason::PredictedLate);
    assert!(r.retry_after_s > 0.0);
    assert_eq!(sched.stats().rejected.predicted_late, 1);
    // It admits the first requests: an empty system is never late.
    assert!(sched.stats().waiting >= 1);
    assert!(by_name("nope").is_none());
}

#[test]
fn smooth_caps_the_prefill_chunk_by_the_shallowest_buffer() {
    // One stream just past its first token (shallow buffer) and a long prompt waiting: smooth
    // gives the prompt a chunk that keeps the step short; fcfs fills the budget.
    let run = |policy: &str| -> usize {
        let cfg = SchedulerConfig { max_batch_tokens: 512, max_model_len: 2048, num_kv_blocks: 600, ..small_cfg() };
        let mut h = Harness::new(cfg, policy);
        h.add(request(1, 4, 100, 0.0)).unwrap();
        h.step(0.05); // request 1 gets its first token at 0.05 s; its 2nd is due at 0.4 s
        h.add(request(2, 1500, 10, 0.05)).unwrap();
        let plan = h.step(0.01);
        assert!(plan.seqs.iter().any(|s| s.id == 1), "{policy}: the stream decodes");
        plan.seqs.iter().filter(|s| s.id == 2).map(|s| s.len()).sum()
    };
    let (fcfs, smooth) = (run("fcfs"), run("smooth"));
    assert_eq!(fcfs, 511);
    // 0.35 s of slack at 1.6 ms a token leaves room for about 200 prompt tokens.
    assert!(smooth < fcfs && smooth >= 128, "smooth chunk {smooth}");
}

#[test]
fn requests_no_stop_token_can_end_teach_the_length_model_nothing() {
    // Forty requests cut by max_tokens at 3: with stop ids each says its answer runs past 3
    // tokens (a censored sample); without any (`ignore_eos`) it says nothing about answers.
    let learned = |stop_token_ids: Vec<u32>| {
        let mut h = Harness::new(small_cfg(), "fcfs");
        for id in 0..40 {
            h.add(NewRequest { stop_token_ids: stop_token_ids.clone(), ..request(id, 4, 3, h.now) }).unwrap();
            while h.sched.stats().running + h.sched.stats().waiting > 0 {
                h.step(0.01);
            }
        }
        h.sched.length_model().observed()
    };
    assert_eq!(learned(vec![]), 0);
    assert_eq!(learned(vec![1]), 40);
}

#[test]
fn stats_report_in_flight_idle_latency() {
    let mut h = Harness::new(small_cfg(), "fcfs");
    h.add(request(1, 4, 3, 0.0)).unwrap();
    h.now = 2.0; // nothing ran for 2 s: token 1 was due at 0.2 s
    h.step(0.0);
    let s = h.sched.stats();
    assert!((s.max_idle_in_flight - 1.8).abs() < 1e-9, "{}", s.max_idle_in_flight);
    h.now = 3.0; // token 2 was due at 0.4 s and has not come: the stall shows before the end
    h.sched.abort(99, 3.0);
    h.add(request(2, 4, 3, 3.0)).unwrap();
    assert!((h.sched.stats().max_idle_in_flight - 2.6).abs() < 1e-9);
}

/// A request that stops after exactly `k` output tokens under [`MockRunner`]'s sampling.
fn stopping_request(id: u64, prompt: usize, max_tokens: usize, k: usize, arrival: f64) -> NewRequest {
    NewRequest { stop_token_ids: vec![MockRunner::token(id, prompt + k - 1)], ..request(id, prompt, max_tokens, arrival) }
}

#[test]
fn the_length_model_learns_from_stops_and_is_not_fooled_by_cuts() {
    let cfg = SchedulerConfig { max_num_seqs: 8, max_batch_tokens: 64, num_kv_blocks: 400, max_model_len: 1024, ..small_cfg() };
    // Requests cut by max_tokens say only that the answer is longer: 40 of them cut at 10 tokens
    // leave the expected answer of a 500-token budget far above 10.
    let mut h = Harness::new(cfg.clone(), "fcfs");
    let prior = h.sched.length_model().expected_total(500);
    for id in 0..40 {
        h.add(request(id, 4, 10, h.now)).unwrap();
        while h.sched.has_unfinished() {
            h.step(0.01);
        }
    }
    assert_eq!(h.finished().values().filter(|f| f.0 == FinishReason::Length).count(), 40);
    let cut = h.sched.length_model().expected_total(500);
    assert!(cut > 0.9 * prior, "censored at 10: {cut} (prior {prior})");
    assert_eq!(h.sched.drain_length_errors().count(), 0, "only requests that stopped by themselves are scored");

    // Requests that stop by themselves after 20 tokens pull it down towards 20, and the length
    // errors (expected at admission over actual) shrink as it learns.
    let mut h = Harness::new(cfg, "fcfs");
    for id in 0..60 {
        h.add(stopping_request(id, 4, 500, 20, h.now)).unwrap();
        while h.sched.has_unfinished() {
            h.step(0.01);
        }
    }
    assert!(h.finished().values().all(|f| *f == (FinishReason::Stop, 20)));
    let learned = h.sched.length_model().expected_total(500);
    assert!(learned < 0.3 * prior && learned >= 20.0, "learned {learned} (prior {prior})");
    let errors: Vec<f64> = h.sched.drain_length_errors().collect();
    assert_eq!(errors.len(), 60);
    assert!(errors[0] > 5.0 && errors[59] < errors[0] / 3.0, "first {} last {}", errors[0], errors[59]);
}

/// Admission sees the requests that are there now: a stream that ended between steps (its
/// client left, or it finished in the last step) holds no seat. With one seat, a stream whose
/// client left mid-answer used to stay in smooth's view of the running batch until the next
/// `schedule`, which on an idle engine never came: every later request was predicted to wait for
/// it to finish at its reader's pace and was refused.
#[test]
fn smooth_admits_on_an_engine_emptied_by_a_disconnect() {
    let cfg = SchedulerConfig { max_num_seqs: 1, max_batch_tokens: 64, max_model_len: 512, num_kv_blocks: 200, ..small_cfg() };
    let mut h = Harness::new(cfg, "smooth");
    h.add(request(1, 4, 400, 0.0)).unwrap();
    for _ in 0..5 {
        h.step(0.01);
    }
    assert_eq!(h.sched.stats().running, 1);
    h.sched.abort(1, h.now).expect("aborted");
    h.now += 1.0;
    assert_eq!(h.sched.stats().running, 0);
    let now = h.now;
    h.add(request(2, 4, 30, now)).expect("an idle engine admits a request it can serve on time");
    // The same for a stream that finished in the last step.
    for _ in 0..40 {
        h.step(0.01);
    }
    assert_eq!(h.sched.stats().running, 0, "request 2 finished");
    let now = h.now + 1.0;
    h.add(request(3, 4, 30, now)).expect("admitted after a finish");
}
