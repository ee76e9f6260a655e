//! Part `model`: `dummy:smollm2-135m` (weights from seed 0) on the GPU against the CPU.
//!
//! The same six steps run on every configuration: two prompts prefilled together (one of them
//! in two chunks), then a third prompt's prefill riding along with decodes, then decodes of all
//! three, with fixed input tokens so every configuration sees identical inputs. The logits of
//! every sampled position are compared with the CPU's (f32 weights, f32 KV cache) by relative L2
//! error and top-1 agreement:
//! - f32 weights, f32 KV cache: every query goes through the query-at-a-time kernel; must match
//!   to 1e-3 relative L2 (f32 arithmetic in a different order);
//! - f32 weights, f16 KV cache: f32 queries, tensor cores for the prefill chunks; 2e-2;
//! - bf16 weights, bf16 KV cache (the default on a GPU): 1e-1, bf16 rounding through 30 layers
//!   of random weights (a wrong kernel gives errors of order 1).
//!
//! Then the engine's own step path against the plain one: four sequences decode greedily for
//! 300 steps through `ModelRunner::execute` (forward pass, argmax on the device, only token ids
//! copied back, steps issued back to back as the engine issues them) while a second runner with
//! the same weights computes each step's logits through `step_logits` and takes the host argmax.
//! The two must choose the same token at every step: work that ran out of order (a step's
//! attention reading KV slots the step before had not written yet, an argmax reading logits
//! still being written) gives different tokens, not a small error.
//!
//! And batch variance, which the GPU does not rule out the way the CPU kernels do (cuBLAS picks
//! its kernel and split by the number of rows, and attention splits long contexts into a number
//! of partitions that depends on the batch): one sequence's logits computed alone and inside a
//! batch of 16 must stay within the configuration's tolerance against the CPU.

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use pace_kernels::sample::argmax as host_argmax;
use pace_models::kv_cache::KvCache;
use pace_models::loader::{load, LoadOptions, ModelSource};
use pace_models::runner::ModelRunner;
use pace_models::sampler::{Sampler, SamplingParams};
use pace_scheduler::{BatchPlan, SeqSlice};

use super::{PartReport, Status};

const BLOCK: usize = 16;

fn runner(dev: &Device, weights: &str, kv: DType) -> Result<ModelRunner> {
    runner_with_blocks(dev, weights, kv, 64)
}

fn runner_with_blocks(dev: &Device, weights: &str, kv: DType, blocks: usize) -> Result<ModelRunner> {
    let source = ModelSource::parse(Some(&format!("dummy:smollm2-135m:{weights}")))?;
    let m = load(&source, &LoadOptions { max_model_len: Some(512), ..LoadOptions::on(dev.clone()) })
        .with_context(|| format!("loading dummy:smollm2-135m:{weights} on {dev:?}"))?;
    let cache = KvCache::new(m.model.config(), blocks, BLOCK, kv, dev)?;
    Ok(ModelRunner::new(m.model, cache))
}

/// Token `i` of prompt `p` (fixed, spread over the vocabulary).
fn token(p: usize, i: usize) -> u32 {
    ((p * 7919 + i * 104_729) % 49_000) as u32 + 100
}

fn slice(id: u64, p: usize, from: usize, to: usize, first_block: u32, sample: bool) -> SeqSlice {
    SeqSlice {
        id,
        tokens: (from..to).map(|i| token(p, i)).collect(),
        start_pos: from,
        block_table: (0..to.div_ceil(BLOCK) as u32).map(|b| first_block + b).collect(),
        sample,
    }
}

/// The six steps: prompts A (40 tokens), B (30, in chunks of 16 and 14) and C (9).
fn plans() -> Vec<BatchPlan> {
    let (a, b, c) = (40usize, 30usize, 9usize);
    let (ba, bb, bc) = (1u32, 10u32, 20u32);
    let plan = |seqs| BatchPlan { step: 0, seqs, released: vec![] };
    let mut steps = vec![
        plan(vec![slice(1, 0, 0, a, ba, true), slice(2, 1, 0, 16, bb, false)]),
        plan(vec![slice(1, 0, a, a + 1, ba, true), slice(2, 1, 16, b, bb, true), slice(3, 2, 0, c, bc, true)]),
    ];
    for k in 1..5 {
        steps.push(plan(vec![slice(1, 0, a + k, a + k + 1, ba, true), slice(2, 1, b + k - 1, b + k, bb, true), slice(3, 2, c + k - 1, c + k, bc, true)]));
    }
    steps
}

fn logits(r: &mut ModelRunner) -> Result<Vec<Vec<f32>>> {
    let mut all = Vec::new();
    for p in plans() {
        all.extend(r.step_logits(&p)?);
    }
    Ok(all)
}

fn argmax(v: &[f32]) -> usize {
    host_argmax(v) as usize
}

/// Greedy decoding through `execute` against the host argmax of `step_logits`, `steps` decode
/// steps after one prefill of four prompts. Returns (tokens compared, tokens that differ beyond a
/// numerical tie, the first difference).
fn execute_against_step_logits(dev: &Device, weights: &str, kv: DType, steps: usize) -> Result<(usize, usize, String)> {
    let prompts = [37usize, 20, 64, 9];
    let per_seq = (prompts.iter().max().unwrap() + steps + 1).div_ceil(BLOCK);
    let blocks = prompts.len() * per_seq + 1;
    let mut engine = runner_with_blocks(dev, weights, kv, blocks)?;
    let mut plain = runner_with_blocks(dev, weights, kv, blocks)?;
    for id in 0..prompts.len() as u64 {
        engine.add_request(id, Sampler::new(SamplingParams::greedy(), &[]).map_err(|e| anyhow::anyhow!(e.message))?);
    }
    let table = |i: usize| -> Vec<u32> { (0..per_seq as u32).map(|b| 1 + (i * per_seq) as u32 + b).collect() };
    let mut plan = BatchPlan {
        step: 0,
        seqs: prompts
            .iter()
            .enumerate()
            .map(|(i, &n)| SeqSlice { id: i as u64, tokens: (0..n).map(|k| token(i, k)).collect(), start_pos: 0, block_table: table(i), sample: true })
            .collect(),
        released: vec![],
    };
    let (mut compared, mut differ, mut first) = (0usize, 0usize, String::new());
    for step in 0..=steps {
        let sampled = engine.execute(&plan)?.sampled;
        let rows = plain.step_logits(&plan)?;
        anyhow::ensure!(sampled.len() == rows.len() && rows.len() == prompts.len(), "step {step}: {} tokens, {} rows", sampled.len(), rows.len());
        for (i, (tok, row)) in sampled.iter().zip(&rows).enumerate() {
            compared += 1;
            let want = host_argmax(row);
            if tok.token != want {
                // A true tie (the same logit to the last bits) may go either way only if the two
                // runs computed different logits; anything wider is work done out of order.
                let top = row[want as usize];
                let got = row.get(tok.token as usize).copied().unwrap_or(f32::NAN);
                let gap = (top - got) as f64;
                if gap.is_nan() || gap > 1e-3 * (top.abs() as f64).max(1.0) {
                    differ += 1;
                    if first.is_empty() {
                        first = format!("step {step}, sequence {i}: execute chose {} (logit {got}), step_logits {want} (logit {top})", tok.token);
                    }
                }
            }
        }
        // Every sequence goes on with the token execute chose.
        let next: Vec<SeqSlice> = plan
            .seqs
            .iter()
            .zip(&sampled)
            .map(|(s, t)| SeqSlice {
                id: s.id,
                tokens: vec![t.token],
                start_pos: s.start_pos + s.tokens.len(),
                block_table: s.block_table.clone(),
                sample: true,
            })
            .collect();
        plan = BatchPlan { step: step as u64 + 1, seqs: next, released: vec![] };
    }
    Ok((compared, differ, first))
}

/// One sequence (a 40-token prompt, then 4 decodes) alone and inside a batch of 16 (the others'
/// prompts of 5 to 120 tokens): the relative L2 difference of its logits and its top-1 agreement.
fn batch_variance(dev: &Device, weights: &str, kv: DType) -> Result<(f64, usize, usize)> {
    let others: Vec<usize> = (1..16).map(|i| 5 + (i * 37) % 116).collect();
    let per_seq = 128usize.div_ceil(BLOCK);
    let mut runner = runner_with_blocks(dev, weights, kv, (others.len() + 2) * per_seq + 1)?;
    let table = |i: usize| -> Vec<u32> { (0..per_seq as u32).map(|b| 1 + (i * per_seq) as u32 + b).collect() };
    // Sequence 0 twice: alone in blocks of slot 0, then batched in blocks of the last slot.
    let run = |runner: &mut ModelRunner, slot: usize, with_others: bool| -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::new();
        let mut seqs = vec![slice(1000, 0, 0, 40, 0, true)];
        seqs[0].block_table = table(slot);
        if with_others {
            for (k, &n) in others.iter().enumerate() {
                let mut s = slice(k as u64, k + 1, 0, n, 0, true);
                s.block_table = table(k + 1);
                seqs.push(s);
            }
        }
        for step in 0..5 {
            let rows = runner.step_logits(&BatchPlan { step: step as u64, seqs: seqs.clone(), released: vec![] })?;
            out.push(rows[0].clone());
            for (k, s) in seqs.iter_mut().enumerate() {
                let p = if k == 0 { 0 } else { k };
                let end = s.start_pos + s.tokens.len();
                *s = SeqSlice { id: s.id, tokens: vec![token(p, end)], start_pos: end, block_table: s.block_table.clone(), sample: true };
            }
        }
        Ok(out)
    };
    let alone = run(&mut runner, 0, false)?;
    let batched = run(&mut runner, others.len() + 1, true)?;
    let (rel, agree) = compare_rows(&batched, &alone);
    Ok((rel, agree, alone.len()))
}

/// Relative L2 error of `got` against `want` over all their rows (NaN counting as infinitely
/// far), and the rows whose argmax agrees.
fn compare_rows(got: &[Vec<f32>], want: &[Vec<f32>]) -> (f64, usize) {
    let (mut num, mut den, mut agree) = (0f64, 0f64, 0usize);
    for (g, w) in got.iter().zip(want) {
        for (&x, &y) in g.iter().zip(w) {
            let d = x as f64 - y as f64;
            num += if d.is_nan() { f64::INFINITY } else { d * d };
            den += (y as f64) * (y as f64);
        }
        agree += usize::from(argmax(g) == argmax(w));
    }
    ((num / den.max(1e-30)).sqrt(), agree)
}

/// Runs the part.
pub fn run(dev: &Device, quick: bool) -> Result<PartReport> {
    let mut report = PartReport::new("model");
    let want = logits(&mut runner(&Device::Cpu, "f32", DType::F32)?)?;
    for (weights, kv, tol) in [("f32", DType::F32, 1e-3), ("f32", DType::F16, 2e-2), ("bf16", DType::BF16, 1e-1)] {
        let got = logits(&mut runner(dev, weights, kv)?)?;
        let (rel, agree) = compare_rows(&got, &want);
        let ok = got.len() == want.len() && rel <= tol;
        report.row(
            format!("dummy:smollm2-135m logits, {weights} weights + {kv:?} KV vs CPU f32 ({} positions)", want.len()),
            format!("rel L2 err {rel:.2e}, top-1 agree {agree}/{}", want.len()),
            format!("rel L2 <= {tol:e}"),
            Status::of(ok),
        );
    }
    for (weights, kv, tol) in [("f32", DType::F32, 1e-3), ("bf16", DType::BF16, 1e-1)] {
        let (rel, agree, n) = batch_variance(dev, weights, kv)?;
        report.row(
            format!("batch variance: one sequence alone vs in a batch of 16, {weights} weights + {kv:?} KV ({n} positions)"),
            format!("rel L2 diff {rel:.2e}, top-1 agree {agree}/{n}"),
            format!("rel L2 <= {tol:e} (the GPU-vs-CPU tolerance)"),
            Status::of(rel <= tol),
        );
    }
    let (weights, kv) = if dev.is_cpu() { ("f32", DType::F32) } else { ("bf16", DType::BF16) };
    let steps = if quick { 12 } else { 300 };
    let (compared, differ, first) = execute_against_step_logits(dev, weights, kv, steps)?;
    report.row(
        format!("greedy tokens of execute() vs argmax of step_logits, 4 sequences x {steps} steps ({weights} weights)"),
        if differ == 0 { format!("{compared}/{compared} agree") } else { format!("{differ} of {compared} differ; first: {first}") },
        "all agree",
        Status::of(differ == 0),
    );
    Ok(report)
}
