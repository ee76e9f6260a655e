//! One `schedule` + `update` with 256 running and 1,000 waiting requests, per policy, and one
//! admission decision (`add`: smooth's door predicts the newcomer's start by walking the queue)
//! with 256 running and 250, 1,000 and 4,000 waiting, to show how it grows.
//!
//! The target is under 200 us for each (issue 42), well under 1% of a GPU step. The running
//! batch is full (`max_num_seqs` = 256), so each measured step decodes 256 sequences while the
//! policy also weighs the waiting ones (and cannot start them); the timed region is exactly one
//! `schedule` and one `update`, or one `add`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use pace_scheduler::sim::preset;
use pace_scheduler::{NewRequest, SampledToken, Scheduler, SchedulerConfig, SloClass, StepOutput};

fn loaded(policy: &str) -> Scheduler {
    loaded_with(policy, 1000)
}

fn loaded_with(policy: &str, waiting: u64) -> Scheduler {
    // A GPU's budgets and step costs (the H200 preset), with vLLM's classic 256 sequences.
    let base = preset("h200-llama3-8b").expect("preset").config;
    let cfg = SchedulerConfig { max_num_seqs: 256, max_queue_requests: 10_000, ..base };
    let mut s = Scheduler::with_policy_name(cfg, policy).expect("policy");
    let mut now = 0.0;
    for id in 0..256u64 {
        let req = NewRequest {
            id,
            prompt: vec![7; 200 + (id as usize * 37) % 600],
            max_tokens: 100_000,
            min_tokens: 0,
            stop_token_ids: vec![],
            arrival: 0.0,
            class: None,
            cache_salt: None,
        };
        s.add(req, 0.0).expect("admitted");
    }
    // Prefill all 256 and give each a few tokens.
    let mut out = StepOutput::default();
    while s.stats().running < 256 || s.stats().waiting > 0 {
        let plan = s.schedule(now);
        now += 0.01;
        out.sampled = plan.seqs.iter().filter(|x| x.sample).map(|x| token(x.id)).collect();
        s.update(&plan, &out, now);
    }
    for id in 256..256 + waiting {
        let req = queued(id, now);
        s.add(req, now).expect("admitted");
    }
    s
}

/// A request that joins the queue: the queued requests tolerate a long wait (a batch class), so
/// smooth's door admits them too and every policy sees the same queue.
fn queued(id: u64, now: f64) -> NewRequest {
    NewRequest {
        id,
        prompt: vec![7; 100 + (id as usize * 53) % 900],
        max_tokens: 256,
        min_tokens: 0,
        stop_token_ids: vec![],
        arrival: now,
        class: Some(SloClass::new(5.0, 1e6)),
        cache_salt: None,
    }
}

fn token(id: u64) -> SampledToken {
    SampledToken { id, token: 1, logprob: None, top_logprobs: vec![] }
}

/// Steps measured on one state before it is rebuilt (untimed): running requests grow by a token
/// a step, and the mix should stay "256 decoding, 1,000 waiting".
const STEPS_PER_STATE: u64 = 200;

fn bench(c: &mut Criterion) {
    for policy in ["fcfs", "smooth", "drop-late"] {
        let waiting = loaded(policy).stats().waiting;
        c.bench_function(&format!("schedule+update/{policy}/256 running/{waiting} waiting"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut out = StepOutput::default();
                let mut done = 0;
                while done < iters {
                    let mut s = loaded(policy);
                    let mut now = 100.0;
                    for _ in 0..STEPS_PER_STATE.min(iters - done) {
                        let t0 = Instant::now();
                        let plan = s.schedule(now);
                        out.sampled.clear();
                        out.sampled.extend(plan.seqs.iter().filter(|x| x.sample).map(|x| token(x.id)));
                        now += 0.01;
                        black_box(s.update(&plan, &out, now));
                        total += t0.elapsed();
                        done += 1;
                    }
                }
                total
            })
        });
    }
}

fn bench_admission(c: &mut Criterion) {
    for waiting in [250u64, 1000, 4000] {
        let mut s = loaded_with("smooth", waiting);
        let mut id = 1_000_000u64;
        c.bench_function(&format!("add/smooth/256 running/{waiting} waiting"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    id += 1;
                    let req = queued(id, 100.0);
                    let t0 = Instant::now();
                    let admitted = black_box(s.add(req, 100.0)).is_ok();
                    total += t0.elapsed();
                    if admitted {
                        s.abort(id, 100.0);
                    }
                }
                total
            })
        });
    }
}

criterion_group!(benches, bench, bench_admission);
criterion_main!(benches);
