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
        println!(
            "{}",
            serde_json::json!({ "prefill_tok_s": pp, "prompt_len": args.prompt_len, "decode_tok_s": tg, "gen": args.gen,
                "aggregate_decode_tok_s": agg_json, "context": args.context, "peak_rss_bytes": rss })
        );
    } else {
        println!("| test | pace tok/s |\n|---|---|");
        println!("| prefill, {}-token prompt | {pp:.1} |", args.prompt_len);
        println!("| decode, one stream ({} tokens) | {tg:.1} |", args.gen);
        for (n, v) in &agg {
            println!("| aggregate decode, {n} streams x {}-token context | {v:.1} |", args.context);
        }
        println!("| peak RSS | {:.0} MiB |", rss as f64 / (1 << 20) as f64);
    }
    Ok(())
}
