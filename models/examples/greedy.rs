//! Greedy generation of one prompt on the default model, one token per step (a smoke check).
use candle_core::{DType, Device};
use pace_models::chat::ChatMessage;
use pace_models::kv_cache::KvCache;
use pace_models::loader::{load, LoadOptions, ModelSource};
use pace_models::runner::ModelRunner;
use pace_models::sampler::{Sampler, SamplingParams};
use pace_scheduler::{BatchPlan, SeqSlice};

fn main() -> anyhow::Result<()> {
    let prompt = std::env::args().nth(1).unwrap_or_else(|| "What is the capital of France?".into());
    let n: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(32);
    let lm = load(&ModelSource::Default, &LoadOptions { max_model_len: Some(4096), ..LoadOptions::on(Device::Cpu) })?;
    let text = lm.chat_template.render(&[ChatMessage::new("user", prompt)], true)?;
    let mut toks = lm.tokenizer.encode(&text, false)?;
    println!("prompt tokens: {}", toks.len());
    let cache = KvCache::new(lm.model.config(), 64, 16, DType::F16, &Device::Cpu)?;
    let mut runner = ModelRunner::new(lm.model, cache);
    runner.add_request(1, Sampler::new(SamplingParams::greedy(), &toks).map_err(|e| anyhow::anyhow!("{e:?}"))?);
    let table: Vec<u32> = (1..64).collect();
    let mut start = 0;
    let t0 = std::time::Instant::now();
    let mut out = Vec::new();
    for step in 0..n {
        let plan = BatchPlan {
            step: step as u64,
            seqs: vec![SeqSlice { id: 1, tokens: toks[start..].to_vec(), start_pos: start, block_table: table.clone(), sample: true }],
            released: vec![],
        };
        let o = runner.execute(&plan)?;
        start = toks.len();
        let t = o.sampled[0].token;
        toks.push(t);
        out.push(t);
        if step == 0 {
            println!("first token after {:?}", t0.elapsed());
        }
    }
    let el = t0.elapsed();
    println!("{:?}", out);
    println!("{}", lm.tokenizer.decode(&out, true)?);
    println!("{n} tokens in {el:?}");
    Ok(())
}
