//! One model step (`ModelRunner::execute`) of SmolLM2-135M with random Q4 weights
//! (`dummy:smollm2-135m:q4`, the default model's shape and storage) at several batch shapes:
//! decode batches at a fixed context and prefill chunks. Short by default (10 samples).

use std::hint::black_box;
use std::time::Duration;

use candle_core::{DType, Device};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pace_models::kv_cache::KvCache;
use pace_models::loader::{load, LoadOptions, ModelSource};
use pace_models::runner::ModelRunner;
use pace_models::sampler::{Sampler, SamplingParams};
use pace_scheduler::{BatchPlan, SeqSlice};

const BLOCK: usize = 16;

fn runner(blocks: usize) -> ModelRunner {
    let source = ModelSource::parse(Some("dummy:smollm2-135m:q4")).expect("dummy model");
    let m = load(&source, &LoadOptions { max_model_len: Some(2048), ..LoadOptions::on(Device::Cpu) }).expect("load");
    let cache = KvCache::new(m.model.config(), blocks, BLOCK, DType::F16, &Device::Cpu).expect("KV cache");
    ModelRunner::new(m.model, cache)
}

/// `n` decoding sequences at context `ctx` each, on disjoint blocks.
fn decode(n: usize, ctx: usize) -> Vec<SeqSlice> {
    let per = ctx.div_ceil(BLOCK);
    (0..n)
        .map(|i| SeqSlice {
            id: i as u64,
            tokens: vec![1],
            start_pos: ctx - 1,
            block_table: (0..per).map(|b| (1 + i * per + b) as u32).collect(),
            sample: true,
        })
        .collect()
}

/// One prompt chunk of `len` tokens from position 0.
fn prefill(len: usize) -> Vec<SeqSlice> {
    vec![SeqSlice {
        id: 1000,
        tokens: (0..len as u32).map(|t| 1 + t % 1000).collect(),
        start_pos: 0,
        block_table: (0..len.div_ceil(BLOCK)).map(|b| 1 + b as u32).collect(),
        sample: true,
    }]
}

fn bench(c: &mut Criterion) {
    let mut r = runner(1 + 32 * 256 / BLOCK);
    let mut g = c.benchmark_group("model_step/smollm2-135m-q4");
    let shapes: Vec<(String, Vec<SeqSlice>)> = vec![
        ("decode/1x256".into(), decode(1, 256)),
        ("decode/8x256".into(), decode(8, 256)),
        ("decode/32x256".into(), decode(32, 256)),
        ("prefill/128".into(), prefill(128)),
        ("prefill/512".into(), prefill(512)),
        ("mixed/16x256+prefill128".into(), {
            let mut s = decode(16, 256);
            let mut p = prefill(128);
            for b in &mut p[0].block_table {
                *b += (16 * 256 / BLOCK) as u32;
            }
            s.append(&mut p);
            s
        }),
    ];
    for (name, seqs) in shapes {
        for s in &seqs {
            r.add_request(s.id, Sampler::new(SamplingParams::greedy(), &[]).expect("greedy"));
        }
        let plan = BatchPlan { step: 0, seqs, released: vec![] };
        g.throughput(Throughput::Elements(plan.seqs.iter().map(|s| s.tokens.len() as u64).sum()));
        g.bench_function(name, |b| b.iter(|| black_box(r.execute(&plan).expect("step"))));
        let released = plan.seqs.iter().map(|s| s.id).collect();
        r.execute(&BatchPlan { step: 0, seqs: vec![], released }).expect("release");
    }
    g.finish();
}

fn short() -> Criterion {
    Criterion::default().sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3))
}

criterion_group! { name = benches; config = short(); targets = bench }
criterion_main!(benches);
