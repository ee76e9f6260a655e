//! `pace engine-bench`: end-to-end engine throughput without HTTP, in the shapes llama.cpp's
//! `llama-bench` and `llama-server` report, so the two can be compared side by side
//! (`benches/scripts/vs-llama-cpp.sh` runs both).
//!
//! - prefill: one prompt of `--prompt-len` tokens, time to its first sampled token (median);
//! - decode: one stream generating `--gen` tokens after a short prompt (median tok/s);
//! - aggregate decode at each `--concurrency`: N streams with `--context` prompt tokens each,
//!   generating `--agg-gen` tokens; throughput over the window where all N are decoding
//!   (from the last stream's first token to the first stream's last token).
//!
//! Prompts are random token ids (never repeated across runs of one invocation).
//!
//! With `--roofline` it first measures the machine's limits
//! ([`pace_kernels::roofline`]: memory bandwidth with 1 and `--threads` threads, the f32 FMA and
//! int8 dot peaks) and prints each figure as a fraction of its limit: batch-1 decode against
//! the matmul weights' bytes (read once a token) over the bandwidth, prefill against the matmul
//! weights' multiply-adds per token over the int8 dot peak (the kernels' inner loop; attention
//! and the per-block scaling are not counted, so the limit is a little high).

use std::time::Instant;

use anyhow::{bail, Result};
use pace_models::sampler::{Sampler, SamplingParams};
use pace_scheduler::{Event, NewRequest};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cli::EngineArgs;
use crate::engine::EngineCore;

/// Arguments of `pace engine-bench`.
#[derive(Debug, clap::Args)]
pub struct EngineBenchArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Prompt length of the prefill test.
    #[arg(long, default_value_t = 512)]
    pub prompt_len: usize,
    /// Tokens generated in the single-stream decode test.
    #[arg(long, default_value_t = 128)]
    pub gen: usize,
    /// Concurrent streams for the aggregate decode test, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "4,16,64")]
    pub concurrency: Vec<usize>,
    /// Prompt tokens per stream in the aggregate decode test.
    #[arg(long, default_value_t = 512)]
    pub context: usize,
    /// Tokens generated per stream in the aggregate decode test (at least 4 x the streams).
    #[arg(long, default_value_t = 64)]
    pub agg_gen: usize,
    /// Repetitions of the prefill and decode tests (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Measure the machine's limits first (memory bandwidth by a STREAM triad, f32 FMA and
    /// int8 dot peaks) and print decode and prefill as fractions of them.
    #[arg(long)]
    pub roofline: bool,
}

/// The machine's limits and the model's matmul footprint.
struct Roofline {
    /// Bytes a second with one thread and with `--threads`.
    bandwidth_1: f64,
    bandwidth: f64,
    /// FLOP/s and int8 multiply-adds a second with `--threads` (None without AVX2).
    fma: Option<f64>,
    int8: Option<f64>,
    /// Matmul weights (elements) and their bytes.
    params: u64,
    bytes: u64,
}

impl Roofline {
    fn measure(threads: usize, params: u64, bytes: u64) -> Self {
        use pace_kernels::roofline::{fma_peak, int8_dot_peak, triad_bandwidth};
        // 256 MiB an array: 768 MiB touched a pass, far beyond any last-level cache.
        Roofline {
            bandwidth_1: triad_bandwidth(1, 256, 5),
            bandwidth: triad_bandwidth(threads, 256, 5),
            fma: fma_peak(threads),
            int8: int8_dot_peak(threads),
            params,
            bytes,
        }
    }

    /// Batch-1 decode tokens a second if every token only read the matmul weights once.
    fn decode_limit(&self) -> f64 {
        self.bandwidth / self.bytes.max(1) as f64
    }

    /// Prefill tokens a second at the int8 dot peak (one multiply-add per weight and token).
    fn prefill_limit(&self) -> Option<f64> {
        self.int8.map(|p| p / self.params.max(1) as f64)
    }
}

struct Bench {
    engine: EngineCore,
    rng: StdRng,
    next_id: u64,
    vocab: u32,
}

impl Bench {
    /// Runs requests to completion; returns per-request token times (engine clock).
    fn run(&mut self, prompts: &[usize], gen: usize) -> Result<Vec<Vec<f64>>> {
        let base = self.next_id;
        for &len in prompts {
            let prompt: Vec<u32> = (0..len).map(|_| self.rng.random_range(0..self.vocab)).collect();
            let sampler = Sampler::new(SamplingParams::greedy(), &prompt).map_err(|e| anyhow::anyhow!(e.message))?;
            let req = NewRequest {
                id: self.next_id,
                prompt,
                max_tokens: gen,
                min_tokens: 0,
                stop_token_ids: vec![],
                arrival: self.engine.now(),
                class: None,
                cache_salt: None,
            };
            self.engine.add(req, sampler).map_err(|r| anyhow::anyhow!("rejected: {r}"))?;
            self.next_id += 1;
        }
        let mut times = vec![Vec::new(); prompts.len()];
        while self.engine.has_work() {
            let r = self.engine.step();
            if let Some(e) = r.error {
                bail!("step failed: {e}");
            }
            for ev in r.events {
                if let Event::Token { id, time, .. } = ev {
                    times[(id - base) as usize].push(time);
                }
            }
        }
        Ok(times)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// Peak resident set size of this process, bytes (Linux; 0 elsewhere).
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()))
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// Runs `pace engine-bench`.
pub fn run(args: &EngineBenchArgs) -> Result<()> {
    let loaded = args.engine.load()?;
    let vocab = loaded.tokenizer.vocab_size() as u32;
    let roofline = args.roofline.then(|| {
        let (params, bytes) = loaded.model.matmul_footprint();
        Roofline::measure(rayon::current_num_threads(), params, bytes)
    });
    let max_conc = args.concurrency.iter().copied().max().unwrap_or(1);
    let mut engine_args = args.engine.clone();
    engine_args.max_num_seqs = engine_args.max_num_seqs.max(max_conc);
    // One prefill per step of the whole prompt, as llama-bench's pp test does.
    let budget = args.engine.max_batch_tokens.unwrap_or(args.prompt_len.max(512));
    let engine = crate::engine_setup::build_engine_with(&engine_args, loaded.model, loaded.max_model_len, "fcfs", |c| {
        c.max_batch_tokens = budget;
    })?;
    let mut b = Bench { engine, rng: StdRng::seed_from_u64(Instant::now().elapsed().subsec_nanos() as u64 ^ 0x5eed), next_id: 0, vocab };

    let mut prefill = Vec::new();
    for _ in 0..args.reps {
        let t0 = b.engine.now();
        let times = b.run(&[args.prompt_len], 1)?;
        prefill.push(args.prompt_len as f64 / (times[0][0] - t0));
    }
    let mut decode = Vec::new();
    for _ in 0..args.reps.clamp(1, 3) {
        let times = b.run(&[8], args.gen)?;
        let t = &times[0];
        decode.push((t.len() - 1) as f64 / (t[t.len() - 1] - t[0]));
    }
    let mut agg = Vec::new();
    for &n in &args.concurrency {
        // Long enough that the first streams are still decoding when the last one starts.
        let gen = args.agg_gen.max(4 * n);
        let times = b.run(&vec![args.context; n], gen)?;
        let start = times.iter().map(|t| t[0]).fold(f64::MIN, f64::max);
        let end = times.iter().map(|t| t[t.len() - 1]).fold(f64::MAX, f64::min);
        let in_window: usize = times.iter().map(|t| t.iter().filter(|&&x| x > start && x <= end).count()).sum();
        agg.push((n, if end > start { in_window as f64 / (end - start) } else { f64::NAN }));
    }
    let (pp, tg) = (median(prefill), median(decode));
    let rss = peak_rss_bytes();
    if args.json {
        let agg_json: serde_json::Map<String, serde_json::Value> = agg.iter().map(|(n, v)| (n.to_string(), serde_json::json!(v))).collect();
        let mut out = serde_json::json!({ "prefill_tok_s": pp, "prompt_len": args.prompt_len, "decode_tok_s": tg, "gen": args.gen,
            "aggregate_decode_tok_s": agg_json, "context": args.context, "peak_rss_bytes": rss });
        if let Some(r) = &roofline {
            out["roofline"] = serde_json::json!({
                "bandwidth_1_thread_bytes_s": r.bandwidth_1, "bandwidth_bytes_s": r.bandwidth, "fma_flop_s": r.fma, "int8_mac_s": r.int8,
                "matmul_params": r.params, "matmul_bytes": r.bytes, "decode_limit_tok_s": r.decode_limit(), "prefill_limit_tok_s": r.prefill_limit(),
                "decode_fraction": tg / r.decode_limit(), "prefill_fraction": r.prefill_limit().map(|l| pp / l),
            });
        }
        println!("{out}");
    } else {
        println!("| test | pace tok/s |\n|---|---|");
        println!("| prefill, {}-token prompt | {pp:.1} |", args.prompt_len);
        println!("| decode, one stream ({} tokens) | {tg:.1} |", args.gen);
        for (n, v) in &agg {
            println!("| aggregate decode, {n} streams x {}-token context | {v:.1} |", args.context);
        }
        println!("| peak RSS | {:.0} MiB |", rss as f64 / (1 << 20) as f64);
        if let Some(r) = &roofline {
            let g = |v: Option<f64>| v.map_or("n/a (no AVX2)".to_string(), |v| format!("{:.1}", v / 1e9));
            println!("\n| limit | measured |\n|---|---|");
            println!(
                "| memory bandwidth, 1 thread / {} threads (GB/s) | {:.1} / {:.1} |",
                rayon::current_num_threads(),
                r.bandwidth_1 / 1e9,
                r.bandwidth / 1e9
            );
            println!("| f32 FMA peak (GFLOP/s) | {} |", g(r.fma));
            println!("| int8 dot peak (G multiply-adds/s) | {} |", g(r.int8));
            println!("| matmul weights | {:.1} M, {:.1} MiB |", r.params as f64 / 1e6, r.bytes as f64 / (1 << 20) as f64);
            println!("\n| figure | pace | limit | fraction |\n|---|---|---|---|");
            println!("| decode, one stream (tok/s) | {tg:.1} | {:.1} (bandwidth / weight bytes) | {:.2} |", r.decode_limit(), tg / r.decode_limit());
            if let Some(l) = r.prefill_limit() {
                println!("| prefill, {}-token prompt (tok/s) | {pp:.1} | {l:.1} (int8 dot peak / weights) | {:.2} |", args.prompt_len, pp / l);
            }
        }
    }
    Ok(())
}
