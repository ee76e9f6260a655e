//! Prefix caching against a mock runner that keeps a real KV cache of fingerprints: every slot
//! holds a hash of the whole sequence up to its position (what attention makes of it), every
//! slice must find exactly its own sequence's fingerprints in the slots before its start, and
//! the sampled token is a function of the whole sequence. So a reused block that holds another
//! prompt's prefix, or a block written while another slice reads it, fails the test, and greedy
//! outputs with and without caching must be identical.

use std::collections::HashMap;

use pace_scheduler::{BatchPlan, Event, NewRequest, SampledToken, Scheduler, SchedulerConfig, StepOutput};
use rand::{Rng, SeedableRng};

fn fingerprint(seq: &[u32]) -> u64 {
    seq.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| (h ^ u64::from(t)).wrapping_mul(0x100_0000_01b3))
}

#[derive(Default)]
struct KvMock {
    seqs: HashMap<u64, Vec<u32>>,
    slots: HashMap<(u32, usize), u64>,
    /// Tokens fed, prompt and recompute included: the prefill work done.
    fed: usize,
}

impl KvMock {
    fn execute(&mut self, plan: &BatchPlan, bs: usize) -> StepOutput {
        for id in &plan.released {
            self.seqs.remove(id);
        }
        let mut reads: HashMap<(u32, usize), u64> = HashMap::new();
        let mut writes: HashMap<(u32, usize), u64> = HashMap::new();
        for s in &plan.seqs {
            let seq = &self.seqs[&s.id];
            assert_eq!(&seq[s.start_pos..s.start_pos + s.tokens.len()], &s.tokens[..]);
            assert_eq!(s.block_table.len(), (s.start_pos + s.tokens.len()).div_ceil(bs));
            for q in 0..s.start_pos {
                let slot = (s.block_table[q / bs], q % bs);
                assert_eq!(self.slots.get(&slot), Some(&fingerprint(&seq[..=q])), "request {} reads another sequence's KV at {q}", s.id);
                reads.insert(slot, s.id);
            }
            for p in s.start_pos..s.start_pos + s.tokens.len() {
                let slot = (s.block_table[p / bs], p % bs);
                assert!(writes.insert(slot, s.id).is_none(), "two slices write block {} in one step", slot.0);
            }
        }
        for (slot, id) in &writes {
            assert!(reads.get(slot).is_none_or(|r| r == id), "block {} written while another request reads it", slot.0);
        }
        let mut out = StepOutput::default();
        for s in &plan.seqs {
            let seq = self.seqs.get_mut(&s.id).unwrap();
            for p in s.start_pos..s.start_pos + s.tokens.len() {
                self.slots.insert((s.block_table[p / bs], p % bs), fingerprint(&seq[..=p]));
            }
            self.fed += s.tokens.len();
            if s.sample {
                let token = 2 + (fingerprint(seq) % 997) as u32;
                seq.push(token);
                out.sampled.push(SampledToken { id: s.id, token, logprob: None, top_logprobs: vec![] });
            }
        }
        out
    }
}

fn cfg(caching: bool, blocks: usize) -> SchedulerConfig {
    SchedulerConfig {
        block_size: 4,
        num_kv_blocks: blocks,
        max_num_seqs: 8,
        max_batch_tokens: 32,
        max_model_len: 256,
        enable_prefix_caching: caching,
        ..SchedulerConfig::default()
    }
}

fn req(id: u64, prompt: Vec<u32>, max_tokens: usize, arrival: f64, salt: Option<u64>) -> NewRequest {
    NewRequest { id, prompt, max_tokens, min_tokens: 0, stop_token_ids: vec![], arrival, class: None, cache_salt: salt }
}

struct Run {
    sched: Scheduler,
    mock: KvMock,
    now: f64,
    tokens: HashMap<u64, Vec<u32>>,
    first_start: HashMap<u64, usize>,
}

impl Run {
    fn new(cfg: SchedulerConfig, policy: &str) -> Self {
        let sched = Scheduler::with_policy_name(cfg, policy).unwrap();
        Self { sched, mock: KvMock::default(), now: 0.0, tokens: HashMap::new(), first_start: HashMap::new() }
    }

    fn add(&mut self, r: NewRequest) {
        assert!(self.try_add(r), "refused");
    }

    fn try_add(&mut self, r: NewRequest) -> bool {
        let (id, prompt) = (r.id, r.prompt.clone());
        let now = self.now;
        let ok = self.sched.add(r, now).is_ok();
        if ok {
            self.mock.seqs.insert(id, prompt);
        }
        ok
    }

    fn step(&mut self) {
        let plan = self.sched.schedule(self.now);
        for s in &plan.seqs {
            self.first_start.entry(s.id).or_insert(s.start_pos);
        }
        let out = self.mock.execute(&plan, self.sched.config().block_size);
        self.now += 0.05;
        for e in self.sched.update(&plan, &out, self.now) {
            if let Event::Token { id, sampled, .. } = e {
                self.tokens.entry(id).or_default().push(sampled.token);
            }
        }
    }

    fn drain(&mut self) {
        for _ in 0..10_000 {
            if !self.sched.has_unfinished() {
                break;
            }
            self.step();
        }
        assert!(!self.sched.has_unfinished());
        // One more plan releases the last finished requests; every block is free again.
        self.step();
        assert_eq!(self.sched.stats().kv_blocks_used, 0, "blocks leaked");
    }
}

#[test]
fn a_shared_system_prompt_is_computed_once_and_changes_no_output() {
    let system: Vec<u32> = (100..141).collect(); // 41 tokens: 10 full blocks of 4
    let mut runs = vec![];
    for caching in [false, true] {
        let mut run = Run::new(cfg(caching, 200), "fcfs");
        for id in 0..6u64 {
            let mut prompt = system.clone();
            prompt.extend([500 + id as u32, 600, 700 + id as u32]);
            run.add(req(id, prompt, 6, run.now, None));
            run.drain(); // one after another: each finds the last one's blocks cached
        }
        runs.push(run);
    }
    let (off, on) = (&runs[0], &runs[1]);
    assert_eq!(off.tokens, on.tokens, "greedy outputs are identical with and without caching");
    assert_eq!(on.first_start[&0], 0);
    for id in 1..6 {
        assert_eq!(on.first_start[&id], 40, "request {id} starts after the 10 cached blocks");
    }
    let stats = on.sched.stats();
    assert_eq!((stats.prefix_cache_queries, stats.prefix_cache_hits), (6 * 44, 5 * 40));
    assert_eq!(off.sched.stats().prefix_cache_hits, 0);
    assert_eq!(off.mock.fed - on.mock.fed, 5 * 40, "the cached tokens are not fed again");
}

#[test]
fn concurrent_requests_share_blocks_and_a_salt_keeps_them_apart() {
    let prompt: Vec<u32> = (1..=33).collect();
    let mut run = Run::new(cfg(true, 200), "fcfs");
    run.add(req(0, prompt.clone(), 8, 0.0, None));
    run.step();
    run.step(); // 33 tokens in two steps of 32: request 0's blocks are registered
    run.add(req(1, prompt.clone(), 8, run.now, None));
    run.add(req(2, prompt.clone(), 8, run.now, Some(7)));
    run.add(req(3, prompt.clone(), 8, run.now, Some(7)));
    run.step();
    assert_eq!(run.first_start[&1], 32, "same salt (none): shares");
    assert_eq!(run.first_start[&2], 0, "another salt: computes its own");
    run.drain();
    assert!(run.first_start[&3] >= 28, "the same salt shares with its own kind: {}", run.first_start[&3]);
    assert_eq!(run.tokens[&0], run.tokens[&1]);
    assert_eq!(run.tokens[&0], run.tokens[&2]);
}

#[test]
fn a_conversation_reuses_its_previous_turns_answer() {
    let mut run = Run::new(cfg(true, 200), "fcfs");
    let turn1: Vec<u32> = (10..30).collect();
    run.add(req(0, turn1.clone(), 12, 0.0, None));
    run.drain();
    // The client sends the whole history back: prompt, answer, a new question.
    let mut turn2 = turn1.clone();
    turn2.extend(&run.tokens[&0]);
    turn2.extend([900, 901, 902]);
    run.add(req(1, turn2.clone(), 4, run.now, None));
    run.drain();
    // 20 + 12 = 32 tokens of history; the answer's last token was sampled, never computed, so
    // the last full computed block ends at 28.
    assert_eq!(run.first_start[&1], 28);
}

/// Many requests over a few shared prefixes, in a pool small enough to preempt and evict, under
/// every policy: every read is of the right KV (the mock checks), outputs equal a run without
/// caching, and no block is lost.
#[test]
fn random_workloads_under_memory_pressure_stay_exact() {
    for policy in ["fcfs", "smooth", "drop-late"] {
        for seed in 0..6u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let prefixes: Vec<Vec<u32>> = (0..3).map(|p| (0..rng.random_range(4..40)).map(|i| 1000 * (p + 1) + i).collect()).collect();
            let reqs: Vec<(f64, Vec<u32>, usize, Option<u64>)> = (0..40)
                .map(|i| {
                    let mut prompt = prefixes[rng.random_range(0..3)].clone();
                    prompt.extend((0..rng.random_range(1..12)).map(|_| rng.random_range(2..900)));
                    let salt = if rng.random_bool(0.2) { Some(rng.random_range(1..3)) } else { None };
                    (i as f64 * 0.07, prompt, rng.random_range(1..16), salt)
                })
                .collect();
            let mut outs = vec![];
            for caching in [false, true] {
                let mut run = Run::new(cfg(caching, 40), policy);
                let mut next = 0;
                while next < reqs.len() || run.sched.has_unfinished() {
                    while next < reqs.len() && reqs[next].0 <= run.now {
                        let (_, p, m, salt) = reqs[next].clone();
                        run.try_add(req(next as u64, p, m, run.now, salt));
                        next += 1;
                    }
                    run.step();
                    assert!(run.now < 1000.0, "{policy} seed {seed} caching {caching}: no progress; {:?}", run.sched.stats());
                }
                run.drain();
                assert_eq!(run.sched.stats().prefix_cache_hits > 0, caching, "{policy} seed {seed}: the shared prefixes were reused");
                outs.push(run.tokens);
            }
            // A request served in both runs got the same tokens (one run may have cut it short:
            // smooth may refuse and drop-late may drop on timing that caching changes).
            for (id, a) in &outs[0] {
                if let Some(b) = outs[1].get(id) {
                    let n = a.len().min(b.len());
                    assert_eq!(a[..n], b[..n], "{policy} seed {seed}: request {id} differs with caching");
                }
            }
            if policy == "fcfs" {
                assert_eq!(outs[0], outs[1], "fcfs seed {seed}: the same requests, the same outputs");
            }
        }
    }
}
