//! paged_attention and reshape_and_cache against a naive reference that gathers K/V through the
//! block table (cases from docs/reliability.md: random block tables, decode and prefill chunks in
//! one batch, GQA ratios, block sizes 16 and 32, many blocks, NaN in unused slots).

use candle_core::{DType, Device, Tensor};
use pace_kernels::{paged_attention, reshape_and_cache, CacheGeometry, PagedAttentionMeta};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

struct Seq {
    ctx: usize,
    qlen: usize,
    blocks: Vec<u32>,
    /// ctx x kv_heads x head_dim
    k: Vec<f32>,
    v: Vec<f32>,
}

struct Case {
    geo: CacheGeometry,
    heads: usize,
    seqs: Vec<Seq>,
    /// total_q x heads x head_dim
    q: Vec<f32>,
}

fn make_case(rng: &mut StdRng, kv_heads: usize, group: usize, head_dim: usize, block_size: usize) -> Case {
    let num_blocks = 400;
    let geo = CacheGeometry { num_blocks, kv_heads, block_size, head_dim };
    let mut free: Vec<u32> = (1..num_blocks as u32).collect();
    free.shuffle(rng);
    let nseq = rng.random_range(1..7);
    let mut seqs = Vec::new();
    for i in 0..nseq {
        let ctx: usize = rng.random_range(1..300);
        let qlen = if i % 2 == 0 { 1 } else { rng.random_range(1..=ctx.min(40)) };
        let nb = ctx.div_ceil(block_size);
        let blocks: Vec<u32> = free.drain(..nb).collect();
        let n = ctx * kv_heads * head_dim;
        let k = (0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
        let v = (0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
        seqs.push(Seq { ctx, qlen, blocks, k, v });
    }
    let total_q: usize = seqs.iter().map(|s| s.qlen).sum();
    let heads = kv_heads * group;
    let q = (0..total_q * heads * head_dim).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
    Case { geo, heads, seqs, q }
}

fn meta(case: &Case) -> PagedAttentionMeta {
    let max_blocks = case.seqs.iter().map(|s| s.blocks.len()).max().unwrap();
    let mut cu = vec![0u32];
    let mut tables = Vec::new();
    for s in &case.seqs {
        cu.push(cu.last().unwrap() + s.qlen as u32);
        let mut row = s.blocks.clone();
        row.resize(max_blocks, 0);
        tables.extend(row);
    }
    let ctx = case.seqs.iter().map(|s| s.ctx as u32).collect();
    PagedAttentionMeta::new(cu, ctx, tables, max_blocks, case.geo, &Device::Cpu).unwrap()
}

/// Caches full of NaN, then every sequence's K/V written through reshape_and_cache.
fn fill_caches(case: &Case, dtype: DType) -> (Tensor, Tensor) {
    let g = case.geo;
    let nan = Tensor::full(f32::NAN, g.shape(), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
    let (kc, vc) = (nan.clone(), nan.copy().unwrap());
    for s in &case.seqs {
        let slots: Vec<u32> = (0..s.ctx).map(|p| s.blocks[p / g.block_size] * g.block_size as u32 + (p % g.block_size) as u32).collect();
        let slots = Tensor::from_slice(&slots, s.ctx, &Device::Cpu).unwrap();
        let k = Tensor::from_slice(&s.k, (s.ctx, g.kv_heads, g.head_dim), &Device::Cpu).unwrap();
        let v = Tensor::from_slice(&s.v, (s.ctx, g.kv_heads, g.head_dim), &Device::Cpu).unwrap();
        reshape_and_cache(&k, &kc, &slots).unwrap();
        reshape_and_cache(&v, &vc, &slots).unwrap();
    }
    (kc, vc)
}

/// Naive causal attention per sequence in f64, reading the dense K/V directly.
fn reference(case: &Case, round: impl Fn(f32) -> f32) -> Vec<f32> {
    let g = case.geo;
    let (h, d, kvh) = (case.heads, g.head_dim, g.kv_heads);
    let group = h / kvh;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0f32; case.q.len()];
    let mut tok = 0;
    for s in &case.seqs {
        for i in 0..s.qlen {
            let pos = s.ctx - s.qlen + i;
            for hh in 0..h {
                let g_ = hh / group;
                let q = &case.q[(tok * h + hh) * d..(tok * h + hh + 1) * d];
                let scores: Vec<f64> = (0..=pos)
                    .map(|j| {
                        let k = &s.k[(j * kvh + g_) * d..(j * kvh + g_ + 1) * d];
                        q.iter().zip(k).map(|(&a, &b)| a as f64 * round(b) as f64).sum::<f64>() * scale
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for dd in 0..d {
                    let v: f64 = (0..=pos).map(|j| e[j] * round(s.v[(j * kvh + g_) * d + dd]) as f64).sum();
                    out[(tok * h + hh) * d + dd] = (v / z) as f32;
                }
            }
            tok += 1;
        }
    }
    out
}

fn run(case: &Case, kc: &Tensor, vc: &Tensor) -> Vec<f32> {
    let t: usize = case.seqs.iter().map(|s| s.qlen).sum();
    let q = Tensor::from_slice(&case.q, (t, case.heads, case.geo.head_dim), &Device::Cpu).unwrap();
    let scale = 1.0 / (case.geo.head_dim as f32).sqrt();
    paged_attention(&q, kc, vc, &meta(case), scale).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

#[test]
fn f32_cache_matches_naive_reference() {
    let mut rng = StdRng::seed_from_u64(11);
    for (kvh, group, d, bs) in [(1, 1, 64, 16), (3, 3, 64, 16), (2, 4, 128, 32), (4, 1, 72, 16), (1, 8, 64, 32), (2, 2, 8, 16)] {
        for _ in 0..3 {
            let case = make_case(&mut rng, kvh, group, d, bs);
            let (kc, vc) = fill_caches(&case, DType::F32);
            let got = run(&case, &kc, &vc);
            let want = reference(&case, |x| x);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(a.is_finite(), "output {i} is {a}: a NaN slot was read");
                assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "kvh={kvh} group={group} d={d} bs={bs}: out[{i}] {a} vs {b}");
            }
        }
    }
}

#[test]
fn half_precision_caches_are_within_tolerance() {
    let mut rng = StdRng::seed_from_u64(12);
    for dtype in [DType::F16, DType::BF16] {
        let case = make_case(&mut rng, 3, 3, 64, 16);
        let (kc, vc) = fill_caches(&case, dtype);
        let got = run(&case, &kc, &vc);
        let want = reference(&case, |x| x);
        for (a, b) in got.iter().zip(&want) {
            assert!(a.is_finite());
            assert!((a - b).abs() <= 1.5e-2, "{dtype:?}: {a} vs {b}");
        }
    }
}

/// A prefill chunk's queries equal the same tokens run one by one as decodes, bit for bit.
#[test]
fn chunked_and_decode_queries_agree_bitwise() {
    let mut rng = StdRng::seed_from_u64(13);
    let mut case = make_case(&mut rng, 3, 3, 64, 16);
    case.seqs.truncate(1);
    let s = &mut case.seqs[0];
    s.ctx = s.ctx.max(20);
    s.blocks.truncate(s.ctx.div_ceil(16));
    while s.blocks.len() < s.ctx.div_ceil(16) {
        s.blocks.push(399 - s.blocks.len() as u32);
    }
    let n = s.ctx * 3 * 64;
    s.k = (0..n).map(|_| rng.random::<f32>() - 0.5).collect();
    s.v = (0..n).map(|_| rng.random::<f32>() - 0.5).collect();
    s.qlen = 20;
    case.q = (0..20 * 9 * 64).map(|_| rng.random::<f32>() - 0.5).collect();
    let (kc, vc) = fill_caches(&case, DType::F32);
    let chunked = run(&case, &kc, &vc);
    let full_ctx = case.seqs[0].ctx;
    let all_q = case.q.clone();
    for i in 0..20 {
        let mut one = Case { geo: case.geo, heads: case.heads, seqs: vec![], q: all_q[i * 576..(i + 1) * 576].to_vec() };
        let s0 = &case.seqs[0];
        one.seqs.push(Seq { ctx: full_ctx - 20 + i + 1, qlen: 1, blocks: s0.blocks.clone(), k: vec![], v: vec![] });
        let got = run(&one, &kc, &vc);
        assert_eq!(&got[..], &chunked[i * 576..(i + 1) * 576], "query {i}");
    }
}

#[test]
fn bad_metadata_is_an_error() {
    let geo = CacheGeometry { num_blocks: 4, kv_heads: 1, block_size: 16, head_dim: 64 };
    // block id out of range
    assert!(PagedAttentionMeta::new(vec![0, 1], vec![5], vec![9], 1, geo, &Device::Cpu).is_err());
    // more queries than context
    assert!(PagedAttentionMeta::new(vec![0, 6], vec![5], vec![1], 1, geo, &Device::Cpu).is_err());
    // table too short for the context
    assert!(PagedAttentionMeta::new(vec![0, 1], vec![40], vec![1, 2], 2, geo, &Device::Cpu).is_err());
    assert!(PagedAttentionMeta::new(vec![0, 1], vec![20], vec![1, 2], 2, geo, &Device::Cpu).is_ok());
}
