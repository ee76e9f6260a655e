//! Building the engine at start-up from the engine flags: the KV cache sized for the device
//! (on a GPU, what `--gpu-memory-utilization` leaves after the weights and the largest step's
//! activations), the scheduler with its policy, and its step-cost model seeded by a short
//! profile of the real model.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use pace_models::config::LlamaConfig;
use pace_models::kv_cache::KvCache;
use pace_models::llama::Llama;
use pace_models::runner::ModelRunner;
use pace_models::sampler::{Sampler, SamplingParams};
use pace_scheduler::cost::{StepCostModel, StepShape};
use pace_scheduler::{BatchPlan, Scheduler, SchedulerConfig, SeqSlice};

use crate::cli::EngineArgs;
use crate::engine::EngineCore;

const GIB: f64 = (1u64 << 30) as f64;

/// KV-cache bytes on a GPU with `free` of `total` bytes free after loading the model: the share
/// pace may use, less what is already used (weights, CUDA context, other processes), less the
/// activation reserve.
pub fn gpu_kv_cache_bytes(free: u64, total: u64, utilization: f64, reserve: u64) -> u64 {
    let allowed = (total as f64 * utilization) as u64;
    allowed.saturating_sub(total.saturating_sub(free)).saturating_sub(reserve)
}

/// Device memory the largest step's activations may take: every intermediate of a layer (the
/// residual, norms, q/k/v, attention output, gate/up and the MLP product) for `tokens` tokens,
/// twice over for the allocator's slack, the f32 logits of `seqs` sampled positions twice, and
/// 512 MiB for cuBLAS workspaces and the kernels' scratch.
pub fn activation_reserve(cfg: &LlamaConfig, tokens: usize, seqs: usize, act_bytes: usize) -> u64 {
    let qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim;
    let per_token = 4 * cfg.hidden_size + 3 * cfg.intermediate_size + 2 * qkv;
    let acts = 2 * tokens * per_token * act_bytes;
    let logits = 2 * seqs.min(tokens) * cfg.vocab_size * 4;
    (acts + logits) as u64 + (512 << 20)
}

/// Builds the engine: allocates the KV cache, the scheduler with `policy`, and seeds the
/// scheduler's step-cost model with a short profile of the real model.
pub fn build_engine(args: &EngineArgs, model: Llama, max_model_len: usize, policy: &str) -> Result<EngineCore> {
    build_engine_with(args, model, max_model_len, policy, |_| {})
}

/// As [`build_engine`], letting the caller adjust the scheduler configuration.
pub fn build_engine_with(args: &EngineArgs, model: Llama, max_model_len: usize, policy: &str, adjust: impl FnOnce(&mut SchedulerConfig)) -> Result<EngineCore> {
    let cfg = model.config().clone();
    let bs = args.block_size as usize;
    let dtype = args.kv_dtype(&model);
    let per_block = KvCache::bytes_per_block(&cfg, bs, dtype);
    let on_cpu = model.device().is_cpu();
    let max_batch_tokens = args.max_batch_tokens.unwrap_or(if on_cpu { 512 } else { 8192 }).max(1);
    let bytes = match (args.kv_cache_memory, pace_kernels::device::memory_info(model.device())) {
        (Some(b), _) => b,
        (None, Some((free, total))) => {
            let reserve = activation_reserve(&cfg, max_batch_tokens, args.max_num_seqs, model.dtype().size_in_bytes());
            let kv = gpu_kv_cache_bytes(free as u64, total as u64, args.gpu_memory_utilization, reserve);
            tracing::info!(
                "GPU memory: {:.1} of {:.1} GiB free after loading; {:.0}% usable, {:.1} GiB kept for activations: {:.1} GiB of KV cache",
                free as f64 / GIB,
                total as f64 / GIB,
                args.gpu_memory_utilization * 100.0,
                reserve as f64 / GIB,
                kv as f64 / GIB
            );
            kv
        }
        (None, None) => 2 << 30,
    };
    let blocks = match args.kv_cache_blocks {
        Some(b) => b,
        None => (bytes / per_block as u64) as usize,
    };
    if blocks < 2 {
        bail!(
            "the KV cache holds {blocks} blocks of {per_block} bytes; give it more memory (--kv-cache-memory, \
             --gpu-memory-utilization) or take less for a step (--max-batch-tokens)"
        );
    }
    let cache = KvCache::new(&cfg, blocks, bs, dtype, model.device()).context("allocating the KV cache")?;
    tracing::info!(
        "KV cache: {blocks} blocks x {bs} tokens ({} tokens, {:.0} MiB, {dtype:?})",
        (blocks - 1) * bs,
        (blocks * per_block) as f64 / (1 << 20) as f64
    );
    let mut runner = ModelRunner::new(model, cache);
    let mut sc = SchedulerConfig {
        block_size: bs,
        num_kv_blocks: blocks,
        max_num_seqs: args.max_num_seqs.max(1),
        max_batch_tokens,
        max_model_len,
        enable_prefix_caching: args.prefix_caching(),
        ..SchedulerConfig::default()
    };
    adjust(&mut sc);
    let samples = profile(&mut runner, &sc).context("profiling the model at start-up")?;
    let model = StepCostModel::from_profile(sc.cost_prior, &samples);
    tracing::info!("step-cost model from the start-up profile: {:?}", model.coeffs());
    let Some(mut scheduler) = Scheduler::with_policy_name(sc, policy) else {
        bail!("unknown scheduler policy '{policy}'");
    };
    scheduler.set_cost_model(model);
    // The engine runs on another thread; its launches share the device's one stream, and
    // waiting here also surfaces any failure of the profile's work before serving starts.
    pace_kernels::device::synchronize(runner.model().device())?;
    Ok(EngineCore::new(scheduler, runner))
}

/// Times a few representative steps (a prefill chunk, decode batches of several sizes) on
/// scratch blocks, so the scheduler's cost model starts from this machine's numbers.
fn profile(runner: &mut ModelRunner, sc: &SchedulerConfig) -> Result<Vec<(StepShape, f64)>> {
    let bs = sc.block_size;
    let usable = sc.num_kv_blocks - 1;
    let chunk = sc.max_batch_tokens.min(256).min(usable * bs).max(2);
    let mut samples = Vec::new();
    let mut run = |runner: &mut ModelRunner, seqs: Vec<SeqSlice>| -> Result<()> {
        let ids: Vec<u64> = seqs.iter().map(|s| s.id).collect();
        for s in &seqs {
            runner.add_request(s.id, Sampler::new(SamplingParams::greedy(), &[]).map_err(|e| anyhow::anyhow!(e.message))?);
        }
        let plan = BatchPlan { step: 0, seqs, released: vec![] };
        // The faster of two runs: a neighbour process or a page fault only ever adds time. On a
        // GPU each run is timed between whole-device synchronisations, so it measures the
        // device's work and not only the host's enqueueing (nothing on the CPU).
        let dev = runner.model().device().clone();
        let mut best = f64::INFINITY;
        for _ in 0..2 {
            pace_kernels::device::synchronize(&dev)?;
            let t0 = Instant::now();
            runner.execute(&plan)?;
            pace_kernels::device::synchronize(&dev)?;
            best = best.min(t0.elapsed().as_secs_f64());
        }
        samples.push((StepShape::of(&plan), best));
        runner.execute(&BatchPlan { step: 0, seqs: vec![], released: ids })?;
        Ok(())
    };
    let table = |first: usize, n: usize| -> Vec<u32> { (first..first + n).map(|b| b as u32).collect() };
    let prefill = |chunk: usize| -> Option<SeqSlice> {
        let blocks = chunk.div_ceil(bs);
        (chunk >= 2 && blocks <= usable).then(|| SeqSlice {
            id: u64::MAX - 1,
            tokens: vec![1; chunk],
            start_pos: 0,
            block_table: table(1, blocks),
            sample: true,
        })
    };
    let decode = |n: usize, ctx: usize| -> Vec<SeqSlice> {
        let per_seq = ctx.div_ceil(bs);
        let n = n.min(sc.max_num_seqs).min(usable / per_seq.max(1));
        (0..n)
            .map(|i| SeqSlice {
                id: u64::MAX - 100 - i as u64,
                tokens: vec![1],
                start_pos: ctx - 1,
                block_table: table(1 + i * per_seq, per_seq),
                sample: true,
            })
            .collect()
    };
    // Warm-up: first calls allocate buffers and fault in the weights.
    if let Some(s) = prefill(chunk.min(64)) {
        run(runner, vec![s])?;
    }
    let warmups = 1;
    for c in [chunk / 16, chunk / 8, chunk / 4, chunk / 2, chunk] {
        if let Some(s) = prefill(c) {
            run(runner, vec![s])?;
        }
    }
    for (n, ctx) in [(1, 32), (1, 256), (4, 64), (8, 256), (16, 64), (32, 128)] {
        let ctx = ctx.min(sc.max_model_len).max(1);
        let seqs = decode(n, ctx);
        if !seqs.is_empty() {
            run(runner, seqs)?;
        }
    }
    // A mixed step: decodes riding along with a prefill chunk.
    let mut mixed = decode(8, 64.min(sc.max_model_len).max(1));
    if let Some(mut p) = prefill(chunk / 2) {
        let offset = 1 + mixed.len() * 64usize.div_ceil(bs);
        let blocks = p.tokens.len().div_ceil(bs);
        if offset + blocks <= usable + 1 {
            p.block_table = table(offset, blocks);
            mixed.push(p);
            run(runner, mixed)?;
        }
    }
    samples.drain(..warmups.min(samples.len()));
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_kv_cache_takes_the_allowed_share_less_what_is_used_and_the_reserve() {
        let gib = 1u64 << 30;
        // 141 GiB card, 16 GiB used by weights and the context: 0.9 * 141 - 16 - 2 = 108.9 GiB.
        let kv = gpu_kv_cache_bytes(125 * gib, 141 * gib, 0.9, 2 * gib);
        assert_eq!(kv, (141.0 * 0.9 * gib as f64) as u64 - 18 * gib);
        // Another process already holds more than the allowed share: nothing, not an underflow.
        assert_eq!(gpu_kv_cache_bytes(10 * gib, 141 * gib, 0.5, gib), 0);
    }

    #[test]
    fn activation_reserve_grows_with_the_step_and_keeps_the_workspace_floor() {
        let cfg = LlamaConfig::preset("llama-3-8b").unwrap();
        let small = activation_reserve(&cfg, 1, 1, 2);
        let big = activation_reserve(&cfg, 8192, 256, 2);
        assert!((512 << 20..520 << 20).contains(&small), "{small}");
        // 8192 tokens of an 8B model in bf16: a couple of GiB of activations, plus 256 rows of a
        // 128k vocabulary in f32.
        assert!(big > 2 << 30 && big < 6 << 30, "{big}");
    }
}
