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

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use pace_models::kv_cache::KvCache;
use pace_models::loader::{load, LoadOptions, ModelSource};
use pace_models::runner::ModelRunner;
use pace_scheduler::{BatchPlan, SeqSlice};

use super::{PartReport, Status};

const BLOCK: usize = 16;

fn runner(dev: &Device, weights: &str, kv: DType) -> Result<ModelRunner> {
    let source = ModelSource::parse(Some(&format!("dummy:smollm2-135m:{weights}")))?;
    let m = load(&source, &LoadOptions { max_model_len: Some(512), ..LoadOptions::on(dev.clone()) })
        .with_context(|| format!("loading dummy:smollm2-135m:{weights} on {dev:?}"))?;
    let cache = KvCache::new(m.model.config(), 64, BLOCK, kv, dev)?;
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
        steps.push(plan(vec![
            slice(1, 0, a + k, a + k + 1, ba, true),
            slice(2, 1, b + k - 1, b + k, bb, true),
            slice(3, 2, c + k - 1, c + k, bc, true),
        ]));
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
    v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i)
}

/// Runs the part.
pub fn run(dev: &Device, _quick: bool) -> Result<PartReport> {
    let mut report = PartReport::new("model");
    let want = logits(&mut runner(&Device::Cpu, "f32", DType::F32)?)?;
    for (weights, kv, tol) in [("f32", DType::F32, 1e-3), ("f32", DType::F16, 2e-2), ("bf16", DType::BF16, 1e-1)] {
        let got = logits(&mut runner(dev, weights, kv)?)?;
        let (mut num, mut den, mut agree) = (0f64, 0f64, 0usize);
        for (g, w) in got.iter().zip(&want) {
            for (&x, &y) in g.iter().zip(w) {
                let d = x as f64 - y as f64;
                num += if d.is_nan() { f64::INFINITY } else { d * d };
                den += (y as f64) * (y as f64);
            }
            agree += usize::from(argmax(g) == argmax(w));
        }
        let rel = (num / den.max(1e-30)).sqrt();
        let ok = got.len() == want.len() && rel <= tol;
        report.row(
            format!("dummy:smollm2-135m logits, {weights} weights + {kv:?} KV vs CPU f32 ({} positions)", want.len()),
            format!("rel L2 err {rel:.2e}, top-1 agree {agree}/{}", want.len()),
            format!("rel L2 <= {tol:e}"),
            Status::of(ok),
        );
    }
    Ok(report)
}
