//! Cost-model presets: the "true" step durations of a machine and model, with the scheduler
//! configuration and default workload that go with them.
//!
//! Every number a preset uses is in this file, next to where it came from.

use super::replay::StepTable;
use super::workload::{Arrivals, LengthSource, Lengths, Sharing, WorkloadSpec};
use crate::cost::CostCoeffs;
use crate::lengths::LengthPrior;
use crate::scheduler::SchedulerConfig;
use crate::slo::SloParams;

/// A machine and model to simulate.
#[derive(Debug, Clone, PartialEq)]
pub struct Preset {
    /// Name for `--preset`.
    pub name: &'static str,
    /// One line for `--help`.
    pub description: &'static str,
    /// The true step cost (the scheduler's cost model starts from the same values and refits on
    /// the noisy measured steps).
    pub true_cost: CostCoeffs,
    /// Budgets and KV capacity.
    pub config: SchedulerConfig,
    /// Default workload lengths and arrivals.
    pub workload: WorkloadSpec,
    /// Default binary SLO, `--goodput` syntax.
    pub goodput: &'static str,
    /// Measured engine steps to replay instead of `true_cost` ([`super::replay`]), where the
    /// machine has a committed trace.
    pub step_trace: Option<&'static str>,
}

impl Preset {
    /// The replayed step times of the preset's trace, scaled within a bin by `true_cost`.
    pub fn step_table(&self) -> Option<StepTable> {
        self.step_trace.map(|t| StepTable::from_json(t, self.true_cost).expect("the committed step trace parses"))
    }
}

/// Names of the presets.
pub const PRESET_NAMES: [&str; 2] = ["cpu-smollm2", "h200-llama3-8b"];

/// The preset called `name`.
pub fn preset(name: &str) -> Option<Preset> {
    match name {
        "cpu-smollm2" => Some(cpu_smollm2()),
        "h200-llama3-8b" => Some(h200_llama3_8b()),
        _ => None,
    }
}

/// All presets.
pub fn presets() -> Vec<Preset> {
    PRESET_NAMES.iter().filter_map(|n| preset(n)).collect()
}

// ---------------------------------------------------------------------------------------------
// cpu-smollm2: SmolLM2-135M-Instruct (Q4_1 GGUF) on this project's 2-core CPU machines (AMD EPYC,
// AVX2), as `pace serve` runs it by default.
//
// Fitted from measured engine steps: each `pace serve` start-up times a grid of real steps
// (prefill chunks, decode batches, context lengths) and fits the cost model by least squares.
// Three start-ups of the release build on a quiet machine (2026-11-30, commit 903e363, the
// servers of docs/bench/ab-cpu-smollm2) gave, median of each coefficient:
//   base 6.70 ms (6.41, 6.70, 9.14), prefill token 1.742 ms (1.733, 1.742, 1.758),
//   decode sequence 1.798 ms (1.672, 1.798, 1.820), KV token attended 4.98 us (4.88, 4.98, 4.98),
//   prefill attention pair 0.98 us (0.83, 0.98, 1.17).
// Budgets and KV capacity are pace serve's CPU defaults: 512 tokens and 256 sequences per step,
// a 2 GiB f16 KV cache = 2 GiB / (16 tokens * 23,040 B) = 5,825 blocks of 16 (one is the null
// block). The default workload is the serving benchmark's (docs/bench/ab-cpu-smollm2): the chat
// prompts of benches/data/chat-prompts.jsonl, each with its prompt length as pace counts it
// (chat template included, 36-50 tokens) and the length of the default model's own greedy answer
// (frequency_penalty 0.5; mean 172, median 108, 11 of 600 reach 1024), drawn in pairs. The SLO
// is the benchmark's, ttft:5000 tpot:100.
// ---------------------------------------------------------------------------------------------
/// Per-step overhead, seconds.
pub const CPU_BASE_S: f64 = 0.00670;
/// Per decode sequence, seconds.
pub const CPU_PER_DECODE_S: f64 = 0.001798;
/// Per prefill token, seconds.
pub const CPU_PER_PREFILL_TOKEN_S: f64 = 0.001742;
/// Per KV token attended, seconds.
pub const CPU_PER_KV_TOKEN_S: f64 = 4.98e-6;
/// Per (query, key) pair of prefill attention, seconds.
pub const CPU_PER_ATTN_PAIR_S: f64 = 0.98e-6;
/// KV cache blocks of 16 tokens, the null block included.
pub const CPU_KV_BLOCKS: usize = 5_825;

/// Engine steps measured by `pace serve --step-trace` on this machine under the AIPerf open-loop
/// A/B (docs/bench/ab-aiperf-open-smooth3-cpu-smollm2; `benches/scripts/step_table.py` picked
/// up to 16 steps per shape bin).
const CPU_STEP_TRACE: &str = include_str!("../../data/steps-cpu-smollm2.json");

/// The serving benchmark's prompt set, one JSON object per line.
const CHAT_PROMPTS: &str = include_str!("../../../benches/data/chat-prompts.jsonl");

/// (prompt tokens with the chat template, natural output length) of every prompt of
/// `benches/data/chat-prompts.jsonl`.
pub fn chat_prompt_lengths() -> Vec<(usize, usize)> {
    CHAT_PROMPTS
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| Some((v.get("prompt_tokens")?.as_u64()? as usize, v.get("output_len")?.as_u64()? as usize)))
        .collect()
}

fn cpu_smollm2() -> Preset {
    let cost = CostCoeffs {
        base_s: CPU_BASE_S,
        per_prefill_token_s: CPU_PER_PREFILL_TOKEN_S,
        per_decode_seq_s: CPU_PER_DECODE_S,
        per_kv_token_s: CPU_PER_KV_TOKEN_S,
        per_attn_pair_s: CPU_PER_ATTN_PAIR_S,
    };
    Preset {
        name: "cpu-smollm2",
        description: "SmolLM2-135M Q4_1 on 2 CPU cores (costs fitted from measured steps)",
        true_cost: cost,
        config: SchedulerConfig {
            block_size: 16,
            num_kv_blocks: CPU_KV_BLOCKS,
            max_num_seqs: 256,
            max_batch_tokens: 512,
            max_model_len: 8192,
            max_queue_requests: 100_000,
            max_queue_tokens: usize::MAX / 2,
            slo: SloParams { binary: "ttft:5000 tpot:100".parse().expect("valid"), ..SloParams::default() },
            cost_prior: cost,
            lengths: LengthPrior::default(),
            enable_prefix_caching: false,
        },
        workload: WorkloadSpec { arrivals: Arrivals::Poisson, lengths: LengthSource::Pairs(chat_prompt_lengths()), sharing: Sharing::default() },
        goodput: "ttft:5000 tpot:100",
        step_trace: Some(CPU_STEP_TRACE),
    }
}

// ---------------------------------------------------------------------------------------------
// h200-llama3-8b: Llama-3-8B in bf16 on one H200, from a roofline.
//
// Hardware: 4.3 TB/s HBM bandwidth, about 790 TFLOP/s dense bf16; we assume 60% of peak FLOP/s
// for prefill matmuls (large GEMMs) and attention.
// Model: 8.03 B parameters, 32 layers, hidden 4096, 8 KV heads of 128 (GQA).
// - Weights: 8.03e9 * 2 B = 16.06 GB, streamed once per step: 16.06e9 / 4.3e12 = 3.73 ms; plus
//   about 0.3 ms of launch and framework overhead: base 4.0 ms.
// - Prefill token: 2 FLOP per parameter = 16.06 GFLOP; / (0.6 * 790e12) = 33.9 us.
// - Decode sequence: the same 16.06 GFLOP, but a decode batch is bandwidth bound and its matmuls
//   overlap the weight stream; charging them at peak FLOP/s (20.3 us) is an additive stand-in for
//   the roofline's max(compute, memory).
// - KV token attended: 2 (K and V) * 32 layers * 8 heads * 128 dims * 2 B = 128 KiB per token;
//   131072 / 4.3e12 = 30.5 ns.
// - Prefill attention pair (query, key): QK^T and PV, 2 * 2 * 4096 FLOP per layer * 32 layers =
//   524,288 FLOP; / (0.6 * 790e12) = 1.11 ns.
// - KV capacity: 141 GB HBM - 16 GB weights - activations and workspace leaves about 120 GB:
//   120e9 / 131072 = 915,527 tokens = 57,220 blocks of 16.
// - Budgets: vLLM's API-server defaults on an 80+ GB GPU: 8192 batched tokens, 1024 sequences.
// ---------------------------------------------------------------------------------------------
const H200_BW: f64 = 4.3e12;
const H200_FLOPS: f64 = 790e12;
const H200_MFU: f64 = 0.6;
const LLAMA3_8B_PARAMS: f64 = 8.03e9;
const LLAMA3_8B_KV_BYTES_PER_TOKEN: f64 = (2 * 32 * 8 * 128 * 2) as f64;
const LLAMA3_8B_ATTN_FLOP_PER_PAIR: f64 = (2 * 2 * 4096 * 32) as f64;
const H200_KV_BYTES: f64 = 120e9;

fn h200_cost() -> CostCoeffs {
    let flop_per_token = 2.0 * LLAMA3_8B_PARAMS;
    CostCoeffs {
        base_s: LLAMA3_8B_PARAMS * 2.0 / H200_BW + 0.3e-3,
        per_prefill_token_s: flop_per_token / (H200_MFU * H200_FLOPS),
        per_decode_seq_s: flop_per_token / H200_FLOPS,
        per_kv_token_s: LLAMA3_8B_KV_BYTES_PER_TOKEN / H200_BW,
        per_attn_pair_s: LLAMA3_8B_ATTN_FLOP_PER_PAIR / (H200_MFU * H200_FLOPS),
    }
}

fn h200_llama3_8b() -> Preset {
    let block_size = 16;
    let kv_tokens = (H200_KV_BYTES / LLAMA3_8B_KV_BYTES_PER_TOKEN) as usize;
    Preset {
        name: "h200-llama3-8b",
        description: "Llama-3-8B bf16 on one H200 (roofline: 4.3 TB/s, 790 TFLOP/s, 120 GB of KV)",
        true_cost: h200_cost(),
        config: SchedulerConfig {
            block_size,
            num_kv_blocks: kv_tokens / block_size + 1,
            max_num_seqs: 1024,
            max_batch_tokens: 8192,
            max_model_len: 8192,
            max_queue_requests: 100_000,
            max_queue_tokens: usize::MAX / 2,
            slo: SloParams { binary: "ttft:500 tpot:50".parse().expect("valid"), ..SloParams::default() },
            cost_prior: h200_cost(),
            lengths: LengthPrior::default(),
            enable_prefix_caching: false,
        },
        workload: WorkloadSpec {
            arrivals: Arrivals::Poisson,
            lengths: LengthSource::Synthetic { input: Lengths::Uniform(128, 1024), output: Lengths::Uniform(32, 512) },
            sharing: Sharing::default(),
        },
        goodput: "ttft:500 tpot:50",
        step_trace: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h200_derivation() {
        let c = h200_cost();
        assert!((c.base_s - 4.03e-3).abs() < 1e-4, "{c:?}");
        assert!((c.per_prefill_token_s - 33.9e-6).abs() < 0.2e-6);
        assert!((c.per_kv_token_s - 30.5e-9).abs() < 0.2e-9);
        assert_eq!(h200_llama3_8b().config.num_kv_blocks, 57_221);
        assert_eq!(cpu_smollm2().config.num_kv_blocks, ((2u64 << 30) / (16 * 23_040)) as usize);
        assert!(PRESET_NAMES.iter().all(|n| preset(n).is_some_and(|p| p.name == *n)));
        let chat = chat_prompt_lengths();
        assert_eq!(chat.len(), 600);
        assert!(chat.iter().all(|&(p, o)| (30..=60).contains(&p) && (1..=1024).contains(&o)));
    }
}
