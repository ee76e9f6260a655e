//! `pace generate`: run prompts through the engine with continuous batching and print the text
//! and throughput. A command-line smoke test of the whole engine without HTTP.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use pace_models::chat::ChatMessage;
use pace_models::sampler::{Sampler, SamplingParams};
use pace_models::tokenizer::IncrementalDecoder;
use pace_scheduler::{Event, NewRequest};

use crate::cli::EngineArgs;

/// Arguments of `pace generate`.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// A prompt; repeat the flag to batch several prompts.
    #[arg(long = "prompt", required = true)]
    pub prompts: Vec<String>,
    /// Most tokens to generate per prompt.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Seed for sampling.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Feed prompts as raw text instead of rendering them with the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
}

/// Runs `pace generate`.
pub fn run(args: &GenerateArgs) -> Result<()> {
    let loaded = args.engine.load()?;
    let tokenizer = Arc::new(loaded.tokenizer);
    let template = loaded.chat_template;
    let mut engine = crate::engine_setup::build_engine(&args.engine, loaded.model, loaded.max_model_len, "fcfs")?;
    let mut decoders = HashMap::new();
    let mut texts: Vec<String> = vec![String::new(); args.prompts.len()];
    let mut counts = vec![0usize; args.prompts.len()];
    let mut prompt_tokens = 0;
    let start = Instant::now();
    for (i, p) in args.prompts.iter().enumerate() {
        let text = if args.raw { p.clone() } else { template.render(&[ChatMessage::new("user", p.as_str())], true)? };
        let ids = tokenizer.encode(&text, args.raw)?;
        prompt_tokens += ids.len();
        let params = SamplingParams { temperature: args.temperature, seed: args.seed, ..SamplingParams::default() };
        let sampler = Sampler::new(params, &ids).map_err(|e| anyhow::anyhow!("{}: {}", e.param, e.message))?;
        let req = NewRequest {
            id: i as u64,
            stop_token_ids: if args.ignore_eos { vec![] } else { tokenizer.eos_token_ids().to_vec() },
            prompt: ids,
            max_tokens: args.max_tokens,
            min_tokens: 0,
            arrival: engine.now(),
            class: None,
            cache_salt: None,
        };
        engine.add(req, sampler).map_err(|r| anyhow::anyhow!("prompt {i} rejected: {r}"))?;
        decoders.insert(i as u64, IncrementalDecoder::new(tokenizer.clone(), true));
    }
    let mut first_token = None;
    let mut steps = 0;
    while engine.has_work() {
        let report = engine.step();
        steps += 1;
        if let Some(e) = report.error {
            bail!("engine step failed: {e}");
        }
        for ev in report.events {
            match ev {
                Event::Token { id, sampled, .. } => {
                    first_token.get_or_insert_with(|| start.elapsed());
                    let d = decoders.get_mut(&id).context("unknown request")?;
                    texts[id as usize] += &d.push(sampled.token)?;
                    counts[id as usize] += 1;
                }
                Event::Finished { id, reason, .. } => {
                    if let Some(d) = decoders.get_mut(&id) {
                        texts[id as usize] += &d.finish();
                    }
                    tracing::debug!("request {id} finished: {reason:?}");
                }
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    for (i, t) in texts.iter().enumerate() {
        println!("--- prompt {i}: {}\n{t}", args.prompts[i]);
    }
    let generated: usize = counts.iter().sum();
    println!(
        "--- {} prompts, {prompt_tokens} prompt tokens, {generated} generated tokens in {elapsed:.2} s ({:.1} tok/s generated, {steps} steps, first token after {:.3} s)",
        args.prompts.len(),
        generated as f64 / elapsed,
        first_token.map(|d| d.as_secs_f64()).unwrap_or(0.0)
    );
    Ok(())
}
