//! Part `bench`: pace's speed on this GPU against ceilings measured on the same GPU.
//!
//! - Ceilings: a device-to-device copy of 4 GiB (bytes read + written per second) and a bf16
//!   8192 x 8192 x 8192 matmul through candle (cuBLAS).
//! - Paged attention alone at 4k context (Llama-3-8B geometry, bf16 cache, 64 decode queries):
//!   K/V bytes read per second against the copy bandwidth (target >= 70%); plus 8 queries at 4k
//!   (split-K) and a 2048-token prefill chunk (tensor cores) for information.
//! - `dummy:llama-3-8b` in bf16 with a bf16 KV cache: a decode step at batch 1, 8, 32, 64, 128
//!   with 1024-token contexts, against the floor (weights + the batch's K/V) / copy bandwidth
//!   (targets: within 1.3x at batch 1, 1.5x at batch 64); the full engine step (forward, logits
//!   to the host, greedy sampling) is judged, the forward pass alone is shown beside it. Prefill:
//!   8 prompts of 1024 tokens in one step, model FLOPs per second against the matmul rate
//!   (target >= 50%).
//! - Diagnostics, so one run explains a gap: GEMV alone over the 8B weights (cuBLAS through
//!   candle, every projection once at batch 1, against the same floor), paged attention at
//!   batch 1 x 1k context, and for a decode forward pass at batch 1 and 64: the kernel launches
//!   it makes (captured as a CUDA graph), the graph's replay time beside the eager forward, and
//!   the host's enqueue time against that replay (host-bound or GPU-bound).
//!
//! Times are wall-clock between whole-device synchronisations (every stream of the context), and
//! GPU time between events recorded on the device's stream; both are means over several
//! repetitions after warm-up runs.

use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use pace_kernels::device::{capture, synchronize, time_on_device};
use pace_kernels::{paged_attention, CacheGeometry, PagedAttentionMeta};
use pace_models::config::LlamaConfig;
use pace_models::kv_cache::KvCache;
use pace_models::loader::{load, LoadOptions, ModelSource};
use pace_models::runner::ModelRunner;
use pace_models::sampler::{Sampler, SamplingParams};
use pace_scheduler::{BatchPlan, SeqSlice};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::{PartReport, Status};

/// Seconds per call: wall-clock and (on a GPU) GPU time.
#[derive(Debug, Clone, Copy)]
struct Timed {
    wall: f64,
    gpu: Option<f64>,
}

impl Timed {
    /// The GPU time where there is one, else the wall-clock time.
    fn device(self) -> f64 {
        self.gpu.unwrap_or(self.wall)
    }
}

/// Mean seconds of `f` over `reps` runs after `warmup` runs: wall-clock between whole-device
/// synchronisations and GPU time between events around the runs.
fn time_both(dev: &Device, warmup: usize, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<Timed> {
    for _ in 0..warmup {
        f()?;
    }
    synchronize(dev)?;
    let t0 = Instant::now();
    let ((), t) = time_on_device(dev, || -> Result<()> {
        for _ in 0..reps {
            f()?;
        }
        Ok(())
    })?;
    synchronize(dev)?;
    let n = reps.max(1) as f64;
    Ok(Timed { wall: t0.elapsed().as_secs_f64() / n, gpu: t.gpu_s.map(|g| g / n) })
}

/// GPU seconds per call of `f` (wall-clock on the CPU).
fn time(dev: &Device, warmup: usize, reps: usize, f: impl FnMut() -> Result<()>) -> Result<f64> {
    Ok(time_both(dev, warmup, reps, f)?.device())
}

/// Bytes read + written per second by a device-to-device copy of `bytes`.
fn copy_bandwidth(dev: &Device, bytes: usize) -> Result<f64> {
    let x = Tensor::zeros(bytes / 2, DType::BF16, dev)?;
    let t = time(dev, 2, 10, || {
        x.copy()?;
        Ok(())
    })?;
    Ok(2.0 * bytes as f64 / t)
}

/// FLOP/s of an n x n x n bf16 matmul.
fn matmul_rate(dev: &Device, n: usize) -> Result<f64> {
    let a = Tensor::rand(-1f32, 1f32, (n, n), dev)?.to_dtype(DType::BF16)?;
    let b = Tensor::rand(-1f32, 1f32, (n, n), dev)?.to_dtype(DType::BF16)?;
    let t = time(dev, 3, 10, || {
        a.matmul(&b)?;
        Ok(())
    })?;
    Ok(2.0 * (n as f64).powi(3) / t)
}

/// Decode queries (one per sequence, at the end of `ctx` tokens) or one prefill chunk over a
/// Llama-3-8B-shaped bf16 cache; returns (seconds per call, K/V bytes read, FLOPs).
fn attention_case(dev: &Device, seqs: usize, ctx: usize, chunk: usize) -> Result<(f64, f64, f64)> {
    let (kvh, heads, d, bs) = (8usize, 32usize, 128usize, 16usize);
    let per_seq = ctx.div_ceil(bs);
    let geo = CacheGeometry { num_blocks: seqs * per_seq + 1, kv_heads: kvh, block_size: bs, head_dim: d };
    let k = Tensor::rand(-1f32, 1f32, geo.shape(), dev)?.to_dtype(DType::BF16)?;
    let v = Tensor::rand(-1f32, 1f32, geo.shape(), dev)?.to_dtype(DType::BF16)?;
    let mut blocks: Vec<u32> = (1..geo.num_blocks as u32).collect();
    blocks.shuffle(&mut StdRng::seed_from_u64(4));
    let qlen = chunk.max(1);
    let cu: Vec<u32> = (0..=seqs).map(|i| (i * qlen) as u32).collect();
    let meta = PagedAttentionMeta::new(cu, vec![ctx as u32; seqs], blocks, per_seq, geo, dev)?;
    let q = Tensor::rand(-1f32, 1f32, (seqs * qlen, heads, d), dev)?.to_dtype(DType::BF16)?;
    let scale = 1.0 / (d as f32).sqrt();
    let t = time(dev, 3, 20, || {
        paged_attention(&q, &k, &v, &meta, scale)?;
        Ok(())
    })?;
    let bytes = (seqs * ctx * kvh * d * 2 * 2) as f64;
    // QK and PV: 2 FLOPs per multiply-add, 2 products per (query, key, head, dim).
    let pairs: f64 = (0..qlen).map(|i| (ctx - qlen + i + 1) as f64).sum::<f64>() * seqs as f64;
    Ok((t, bytes, 4.0 * pairs * (heads * d) as f64))
}

/// Bytes of the weights one decode step reads: every projection and the output head (the
/// embedding table is only gathered).
fn weight_bytes(cfg: &LlamaConfig, elem: usize) -> f64 {
    let (h, d) = (cfg.hidden_size, cfg.head_dim);
    let qkv = h * (cfg.num_heads + 2 * cfg.num_kv_heads) * d;
    let per_layer = qkv + cfg.num_heads * d * h + 3 * h * cfg.intermediate_size;
    ((per_layer * cfg.num_layers + cfg.vocab_size * h) * elem) as f64
}

fn kv_bytes(cfg: &LlamaConfig, tokens: usize, elem: usize) -> f64 {
    (tokens * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * elem) as f64
}

fn seq(id: u64, tokens: usize, start: usize, first_block: u32, blocks: usize) -> SeqSlice {
    SeqSlice {
        id,
        tokens: (0..tokens).map(|i| ((id as usize * 131 + i * 17) % 120_000) as u32 + 100).collect(),
        start_pos: start,
        block_table: (0..blocks as u32).map(|b| first_block + b).collect(),
        sample: true,
    }
}

/// Runs the part.
pub fn run(dev: &Device, quick: bool) -> Result<PartReport> {
    let mut report = PartReport::new("bench");
    let copy_bw = copy_bandwidth(dev, if quick { 1 << 30 } else { 4 << 30 })?;
    report.row("device-to-device copy", format!("{:.2} TB/s (read + write)", copy_bw / 1e12), "ceiling", Status::Info);
    let mm = matmul_rate(dev, 8192)?;
    report.row("bf16 matmul 8192^3 (candle, cuBLAS)", format!("{:.0} TFLOP/s", mm / 1e12), "ceiling", Status::Info);

    let (t, bytes, _) = attention_case(dev, 64, 4096, 0)?;
    let ratio = bytes / t / copy_bw;
    report.row(
        "paged attention, 64 decodes x 4k ctx (Llama-3-8B heads, bf16)",
        format!("{:.1} us, {:.2} TB/s = {:.0}% of copy", t * 1e6, bytes / t / 1e12, ratio * 100.0),
        ">= 70% of copy",
        Status::of(ratio >= 0.7),
    );
    for (seqs, ctx, what) in [(8, 4096, "8 decodes x 4k ctx (split-K)"), (1, 1024, "1 decode x 1k ctx (diagnostic: the batch-1 step's attention)")] {
        let (t, bytes, _) = attention_case(dev, seqs, ctx, 0)?;
        report.row(format!("paged attention, {what}"), format!("{:.1} us, {:.0}% of copy", t * 1e6, bytes / t / copy_bw * 100.0), "info", Status::Info);
    }
    let (t, _, flops) = attention_case(dev, 1, 4096, 2048)?;
    report.row(
        "paged attention, 2048-token prefill chunk at 4k ctx (tensor cores)",
        format!("{:.0} us, {:.0} TFLOP/s", t * 1e6, flops / t / 1e12),
        "info",
        Status::Info,
    );

    // The model: 1024-token contexts, up to 128 sequences of 64 blocks each.
    let ctx = 1024usize;
    let bs = 16usize;
    let per_seq = ctx.div_ceil(bs);
    let batches: &[usize] = if quick { &[1, 64] } else { &[1, 8, 32, 64, 128] };
    let max_b = batches.iter().copied().max().unwrap_or(1).max(8);
    let t0 = Instant::now();
    let source = ModelSource::parse(Some("dummy:llama-3-8b:bf16"))?;
    let m = load(&source, &LoadOptions { max_model_len: Some(4096), ..LoadOptions::on(dev.clone()) }).context("loading dummy:llama-3-8b:bf16")?;
    let cfg = m.model.config().clone();
    let cache = KvCache::new(&cfg, max_b * per_seq + 1, bs, DType::BF16, dev)?;
    let mut runner = ModelRunner::new(m.model, cache);
    report.row("load dummy:llama-3-8b (bf16) + KV cache", format!("{:.1} s", t0.elapsed().as_secs_f64()), "info", Status::Info);
    for id in 0..max_b as u64 {
        runner.add_request(id, Sampler::new(SamplingParams::greedy(), &[]).map_err(|e| anyhow::anyhow!(e.message))?);
    }
    let weights = weight_bytes(&cfg, 2);
    let (warm, reps) = if quick { (1, 3) } else { (2, 8) };
    gemv_row(&mut report, dev, &cfg, weights / copy_bw, quick)?;
    let mut captures = Vec::new();
    for &b in batches {
        let plan = BatchPlan { step: 0, seqs: (0..b).map(|i| seq(i as u64, 1, ctx - 1, 1 + (i * per_seq) as u32, per_seq)).collect(), released: vec![] };
        // The engine's whole step, judged by wall-clock: it ends when the tokens are on the host.
        let step = time_both(dev, warm, reps, || {
            runner.execute(&plan)?;
            Ok(())
        })?
        .wall;
        let input = runner.prepare_step(&plan)?;
        let fwd = time(dev, warm, reps, || {
            runner.forward(&input)?;
            Ok(())
        })?;
        let floor = (weights + kv_bytes(&cfg, b * ctx, 2)) / copy_bw;
        let target = match b {
            1 => Some(1.3),
            64 => Some(1.5),
            _ => None,
        };
        report.row(
            format!("decode step, batch {b} x 1k ctx"),
            format!(
                "{:.2} ms = {:.2}x floor {:.2} ms (forward alone {:.2} ms = {:.2}x); {:.0} tok/s",
                step * 1e3,
                step / floor,
                floor * 1e3,
                fwd * 1e3,
                fwd / floor,
                b as f64 / step
            ),
            target.map_or("info".into(), |x| format!("<= {x}x floor")),
            target.map_or(Status::Info, |x| Status::of(step / floor <= x)),
        );
        if b == 1 || b == 64 {
            let enqueue = enqueue_time(dev, &runner, &input, reps)?;
            captures.push((b, input, fwd, enqueue));
        }
    }
    // Prefill: 8 prompts of 1024 tokens in one step.
    let n = 8usize;
    let plan = BatchPlan { step: 0, seqs: (0..n).map(|i| seq(i as u64, ctx, 0, 1 + (i * per_seq) as u32, per_seq)).collect(), released: vec![] };
    let t = time(dev, 1, if quick { 2 } else { 4 }, || {
        runner.execute(&plan)?;
        Ok(())
    })?;
    let tokens = (n * ctx) as f64;
    let linear = weights / 2.0 - (cfg.vocab_size * cfg.hidden_size) as f64;
    let attn = 4.0 * (cfg.num_layers * cfg.num_heads * cfg.head_dim) as f64 * (n * ctx * (ctx + 1) / 2) as f64;
    let flops = 2.0 * linear * tokens + 2.0 * (cfg.vocab_size * cfg.hidden_size * n) as f64 + attn;
    let ratio = flops / t / mm;
    report.row(
        format!("prefill, {n} x {ctx} tokens in one step"),
        format!("{:.0} tok/s, {:.0} TFLOP/s = {:.0}% of matmul", tokens / t, flops / t / 1e12, ratio * 100.0),
        ">= 50% of matmul",
        Status::of(ratio >= 0.5),
    );
    // Last: a capture that goes wrong must not disturb the judged rows above.
    for (b, input, fwd, enqueue) in &captures {
        launches_rows(&mut report, dev, &runner, input, *b, *fwd, *enqueue, reps);
    }
    Ok(report)
}

/// GEMV alone: a batch-1 activation through a bf16 matrix of every projection shape of the
/// model (each layer its own matrices, so nothing is served from cache), against the floor of
/// reading them once. The decode step's gap above this is what the rest of the step costs.
fn gemv_row(report: &mut PartReport, dev: &Device, cfg: &LlamaConfig, floor: f64, quick: bool) -> Result<()> {
    let (h, d) = (cfg.hidden_size, cfg.head_dim);
    let layers = if quick { 4 } else { cfg.num_layers };
    let mut shapes = Vec::new();
    for _ in 0..layers {
        shapes.push(((cfg.num_heads + 2 * cfg.num_kv_heads) * d, h));
        shapes.push((h, cfg.num_heads * d));
        shapes.push((2 * cfg.intermediate_size, h));
        shapes.push((h, cfg.intermediate_size));
    }
    shapes.push((cfg.vocab_size, h));
    let mats: Vec<Tensor> = shapes.iter().map(|&s| Tensor::zeros(s, DType::BF16, dev)).collect::<candle_core::Result<_>>()?;
    let xs: Vec<Tensor> = shapes.iter().map(|&(_, k)| Tensor::ones((1, k), DType::BF16, dev)).collect::<candle_core::Result<_>>()?;
    let bytes: f64 = shapes.iter().map(|&(n, k)| (n * k * 2) as f64).sum();
    let t = time(dev, 1, if quick { 2 } else { 5 }, || {
        for (x, w) in xs.iter().zip(&mats) {
            x.matmul(&w.t()?)?;
        }
        Ok(())
    })?;
    // Scale a quick run's few layers up to the whole model's bytes.
    let floor = floor * bytes / weight_bytes(cfg, 2);
    report.row(
        format!("GEMV alone, batch 1, {} bf16 matrices ({:.1} GB; diagnostic)", shapes.len(), bytes / 1e9),
        format!("{:.2} ms = {:.2}x floor {:.2} ms", t * 1e3, t / floor, floor * 1e3),
        "info",
        Status::Info,
    );
    Ok(())
}

/// Host seconds to enqueue one decode forward pass (the median of several, each after a whole-
/// device synchronisation, so nothing waits on earlier work). Against the GPU's own time for
/// the same work (the captured graph's replay, which has no host gaps) it says whether the step
/// is host-bound: CUDA graphs are then the lever.
fn enqueue_time(dev: &Device, runner: &ModelRunner, input: &pace_models::llama::StepInput, reps: usize) -> Result<f64> {
    let mut host = Vec::new();
    for _ in 0..reps.max(3) {
        synchronize(dev)?;
        let t0 = Instant::now();
        let logits = runner.forward(input)?;
        host.push(t0.elapsed().as_secs_f64());
        drop(logits);
    }
    synchronize(dev)?;
    host.sort_by(f64::total_cmp);
    Ok(host[host.len() / 2])
}

/// Kernel launches in one decode forward pass, counted by capturing it as a CUDA graph; the
/// graph's replay time beside the eager forward's `eager` seconds, and the host's `enqueue`
/// seconds against the replay (the GPU's time for the work with no host gaps). Informational: a
/// capture that fails is reported, not failed.
#[allow(clippy::too_many_arguments)]
// Without the `cuda` feature the graph is a stand-in with no Drop; with it, the graph must go
// before the synchronize.
#[allow(clippy::drop_non_drop)]
fn launches_rows(
    report: &mut PartReport,
    dev: &Device,
    runner: &ModelRunner,
    input: &pace_models::llama::StepInput,
    b: usize,
    eager: f64,
    enqueue: f64,
    reps: usize,
) {
    let name = format!("decode forward, batch {b} (diagnostic)");
    let captured = capture(dev, || runner.forward(input)).map(|(logits, g)| {
        drop(logits);
        g
    });
    let graph = match captured {
        Ok(g) => g,
        Err(e) => {
            let _ = synchronize(dev);
            report.row(
                format!("{name}: kernel launches"),
                format!("graph capture failed: {e}; host enqueue {:.2} ms vs eager {:.2} ms", enqueue * 1e3, eager * 1e3),
                "info",
                Status::Info,
            );
            return;
        }
    };
    let c = graph.counts();
    report.row(
        format!("{name}: kernel launches"),
        format!(
            "{} kernels; graph nodes also: {} allocs, {} frees, {} copies, {} memsets, {} other",
            c.kernels, c.allocs, c.frees, c.copies, c.memsets, c.other
        ),
        "info",
        Status::Info,
    );
    let replay = time(dev, 1, reps, || {
        graph.replay()?;
        Ok(())
    });
    report.row(
        format!("{name}: replayed as one CUDA graph; host enqueue vs GPU time"),
        match replay {
            Ok(t) => format!(
                "replay {:.2} ms vs eager {:.2} ms ({:.2}x); host enqueue {:.2} ms ({})",
                t * 1e3,
                eager * 1e3,
                eager / t,
                enqueue * 1e3,
                if enqueue > t { "host-bound: the GPU waits on launches" } else { "GPU-bound" }
            ),
            Err(e) => format!("replay failed: {e}; host enqueue {:.2} ms vs eager {:.2} ms", enqueue * 1e3, eager * 1e3),
        },
        "info",
        Status::Info,
    );
    drop(graph);
    let _ = synchronize(dev);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_3_8b_reads_about_15_gb_per_decode_step() {
        let cfg = LlamaConfig::preset("llama-3-8b").unwrap();
        let w = weight_bytes(&cfg, 2);
        assert!((14.9e9..15.1e9).contains(&w), "{w}");
        // 1024 tokens of K/V: 32 layers x 2 x 8 heads x 128 x 2 bytes = 128 KiB per token.
        assert_eq!(kv_bytes(&cfg, 1024, 2), (1024 * 128 * 1024) as f64);
    }
}
