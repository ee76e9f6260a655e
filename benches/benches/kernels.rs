//! CPU kernels at SmolLM2-135M's shapes: paged attention (decode batches and a prefill chunk at a
//! few context lengths) and the quantized matmul (each projection, 1, 16 and 128 tokens).
//!
//! Short by default (10 samples, 1.5 s each); `cargo bench -p pace-bench --bench kernels -- NAME`
//! runs one. Threads come from rayon's global pool (all cores unless RAYON_NUM_THREADS).

use std::hint::black_box;
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pace_kernels::quant::{matmul, QFormat, QuantMatrix};
use pace_kernels::{paged_attention, reshape_and_cache, CacheGeometry, PagedAttentionMeta};

/// SmolLM2-135M: 9 query heads, 3 KV heads, head dim 64; KV blocks of 16 tokens.
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const BLOCK: usize = 16;

fn rand_vec(n: usize, seed: u32) -> Vec<f32> {
    // A cheap deterministic pattern in [-1, 1): the kernels' speed does not depend on values.
    (0..n).map(|i| (((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / (1u32 << 24) as f32) * 2.0 - 1.0).collect()
}

/// `seqs` sequences of `ctx` tokens each, `q_per_seq` query tokens each (1: decode).
struct AttnCase {
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    meta: PagedAttentionMeta,
}

fn attention_case(seqs: usize, ctx: usize, q_per_seq: usize) -> AttnCase {
    let per_seq = ctx.div_ceil(BLOCK);
    let geo = CacheGeometry { num_blocks: 1 + seqs * per_seq, kv_heads: KV_HEADS, block_size: BLOCK, head_dim: HEAD_DIM };
    let dev = Device::Cpu;
    let k_cache = Tensor::zeros(geo.shape(), DType::F16, &dev).expect("cache");
    let v_cache = Tensor::zeros(geo.shape(), DType::F16, &dev).expect("cache");
    let slots: Vec<u32> = (0..seqs * per_seq * BLOCK).map(|s| (BLOCK + s) as u32).collect();
    let n = slots.len();
    let kv = Tensor::from_vec(rand_vec(n * KV_HEADS * HEAD_DIM, 1), (n, KV_HEADS, HEAD_DIM), &dev).expect("kv");
    let slots = Tensor::from_vec(slots, n, &dev).expect("slots");
    reshape_and_cache(&kv, &k_cache, &slots).expect("write k");
    reshape_and_cache(&kv, &v_cache, &slots).expect("write v");
    let cu: Vec<u32> = (0..=seqs).map(|i| (i * q_per_seq) as u32).collect();
    let tables: Vec<u32> = (0..seqs * per_seq).map(|b| 1 + b as u32).collect();
    let meta = PagedAttentionMeta::new(cu, vec![ctx as u32; seqs], tables, per_seq, geo, &dev).expect("meta");
    let t = seqs * q_per_seq;
    let q = Tensor::from_vec(rand_vec(t * HEADS * HEAD_DIM, 2), (t, HEADS, HEAD_DIM), &dev).expect("q");
    AttnCase { q, k_cache, v_cache, meta }
}

fn bench_attention(c: &mut Criterion) {
    let mut g = c.benchmark_group("paged_attention");
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();
    for (seqs, ctx, q) in [(1, 256, 1), (16, 256, 1), (16, 1024, 1), (64, 512, 1), (1, 256, 256), (1, 1024, 256)] {
        let case = attention_case(seqs, ctx, q);
        let name = if q == 1 { format!("decode/{seqs}x{ctx}") } else { format!("prefill/{q}q@{ctx}") };
        g.throughput(Throughput::Elements((seqs * q) as u64));
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| black_box(paged_attention(&case.q, &case.k_cache, &case.v_cache, &case.meta, scale).expect("attention")))
        });
    }
    g.finish();
}

fn bench_matmul(c: &mut Criterion) {
    let mut g = c.benchmark_group("quant_matmul");
    // (name, input features, output features): fused q/k/v, fused gate/up, down, LM head.
    let shapes = [("qkv", 576, 960), ("gate_up", 576, 3072), ("down", 1536, 576), ("lm_head", 576, 49152)];
    for format in [QFormat::Q4, QFormat::Q8] {
        for (name, k, n) in shapes {
            let w = QuantMatrix::quantize(format, &rand_vec(n * k, 3), n, k).expect("quantize");
            for t in [1usize, 16, 128] {
                let x = rand_vec(t * k, 4);
                let mut y = vec![0f32; t * n];
                g.throughput(Throughput::Elements((2 * t * k * n) as u64));
                g.bench_function(BenchmarkId::new(format!("{format:?}/{name}/{k}x{n}"), format!("t={t}")), |b| b.iter(|| matmul(&w, black_box(&x), t, &mut y)));
            }
        }
    }
    g.finish();
}

fn short() -> Criterion {
    Criterion::default().sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_millis(1500))
}

criterion_group! { name = benches; config = short(); targets = bench_attention, bench_matmul }
criterion_main!(benches);
