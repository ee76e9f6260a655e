//! Part `kernels`: the CUDA ops against the CPU ops on random inputs.
//!
//! Each case writes the same random K/V through `reshape_and_cache` into caches full of NaN on
//! both devices (the caches must then agree bit for bit), and runs `paged_attention` on the same
//! queries on both, through every CUDA path: the default (tensor cores for prefill chunks), the
//! query-at-a-time kernel alone, and that kernel forced into split-K partitions. Tolerances are
//! docs/reliability.md's: f32 within 1e-4 relative, f16/bf16 within 1.5e-2 absolute.
//!
//! Then greedy sampling: `argmax_rows` on the GPU must pick exactly the CPU's token from the same
//! logits (a 128k vocabulary, in f32, bf16 and f16, with planted ties, NaN and infinities). And
//! the build's ptxas record (registers, spills, shared memory per kernel) is printed in full and
//! summarised in one row.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use pace_kernels::attention::paged_attention_with;
use pace_kernels::{reshape_and_cache, AttnOptions, CacheGeometry, PagedAttentionMeta};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::{max_errors, PartReport, Status};

#[derive(Debug, Clone, Copy)]
enum Mix {
    /// Decodes and prefill chunks of up to 200 tokens over contexts up to 700.
    Mixed,
    /// Decodes (and one 64-token chunk) over contexts of 2k to 9k tokens: the split-K path.
    Long,
}

#[derive(Debug, Clone, Copy)]
struct Spec {
    cache: DType,
    /// Queries in the cache's dtype (as the bf16 model sends them) rather than f32.
    q_cache_dtype: bool,
    kv_heads: usize,
    group: usize,
    head_dim: usize,
    block_size: usize,
    mix: Mix,
}

struct Seq {
    ctx: usize,
    qlen: usize,
    blocks: Vec<u32>,
}

struct Case {
    spec: Spec,
    geo: CacheGeometry,
    seqs: Vec<Seq>,
    /// Per sequence: ctx x kv_heads x head_dim, f32.
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    /// tokens x heads x head_dim, f32 (already rounded to the cache dtype when q travels in it).
    q: Vec<f32>,
}

fn make_case(rng: &mut StdRng, spec: Spec) -> Case {
    use Mix::*;
    let nseq = match spec.mix {
        Mixed => rng.random_range(1..7),
        Long => rng.random_range(1..5),
    };
    let mut seqs = Vec::new();
    for i in 0..nseq {
        let (ctx, qlen) = match spec.mix {
            Mixed => {
                let ctx = rng.random_range(1..700usize);
                (ctx, if i % 2 == 0 { 1 } else { rng.random_range(1..=ctx.min(200)) })
            }
            Long => {
                let ctx = rng.random_range(2000..9000usize);
                (ctx, if i == 1 { 64 } else { 1 })
            }
        };
        seqs.push(Seq { ctx, qlen, blocks: Vec::new() });
    }
    let needed: usize = seqs.iter().map(|s| s.ctx.div_ceil(spec.block_size)).sum();
    let num_blocks = needed + 1 + rng.random_range(0..50);
    let mut free: Vec<u32> = (1..num_blocks as u32).collect();
    free.shuffle(rng);
    for s in &mut seqs {
        s.blocks = free.drain(..s.ctx.div_ceil(spec.block_size)).collect();
    }
    let geo = CacheGeometry { num_blocks, kv_heads: spec.kv_heads, block_size: spec.block_size, head_dim: spec.head_dim };
    let row = spec.kv_heads * spec.head_dim;
    let mut rand_vec = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect() };
    let k = seqs.iter().map(|s| rand_vec(s.ctx * row)).collect();
    let v = seqs.iter().map(|s| rand_vec(s.ctx * row)).collect();
    let tokens: usize = seqs.iter().map(|s| s.qlen).sum();
    let q = rand_vec(tokens * spec.group * row);
    Case { spec, geo, seqs, k, v, q }
}

/// Caches full of NaN with every sequence's K/V written through reshape_and_cache on `dev`.
fn caches(case: &Case, dev: &Device) -> Result<(Tensor, Tensor)> {
    let g = case.geo;
    let nan = Tensor::full(f32::NAN, g.shape(), dev)?.to_dtype(case.spec.cache)?;
    let (kc, vc) = (nan.clone(), nan.copy()?);
    for (i, s) in case.seqs.iter().enumerate() {
        let slots: Vec<u32> = (0..s.ctx).map(|p| s.blocks[p / g.block_size] * g.block_size as u32 + (p % g.block_size) as u32).collect();
        let slots = Tensor::from_slice(&slots, s.ctx, dev)?;
        let k = Tensor::from_slice(&case.k[i], (s.ctx, g.kv_heads, g.head_dim), dev)?;
        let v = Tensor::from_slice(&case.v[i], (s.ctx, g.kv_heads, g.head_dim), dev)?;
        reshape_and_cache(&k, &kc, &slots)?;
        reshape_and_cache(&v, &vc, &slots)?;
    }
    Ok((kc, vc))
}

fn meta(case: &Case, dev: &Device) -> Result<PagedAttentionMeta> {
    let max_blocks = case.seqs.iter().map(|s| s.blocks.len()).max().unwrap_or(1);
    let mut cu = vec![0u32];
    let mut tables = Vec::new();
    for s in &case.seqs {
        cu.push(cu.last().copied().unwrap_or(0) + s.qlen as u32);
        let mut row = s.blocks.clone();
        row.resize(max_blocks, 0);
        tables.extend(row);
    }
    let ctx = case.seqs.iter().map(|s| s.ctx as u32).collect();
    Ok(PagedAttentionMeta::new(cu, ctx, tables, max_blocks, case.geo, dev)?)
}

/// The caches' elements as f32 on the host (NaN where unused).
fn host_values(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_device(&Device::Cpu)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?)
}

fn queries(case: &Case, dev: &Device) -> Result<Tensor> {
    let t: usize = case.seqs.iter().map(|s| s.qlen).sum();
    let heads = case.spec.kv_heads * case.spec.group;
    let q = Tensor::from_slice(&case.q, (t, heads, case.spec.head_dim), dev)?;
    Ok(if case.spec.q_cache_dtype { q.to_dtype(case.spec.cache)? } else { q })
}

fn specs(quick: bool) -> Vec<Spec> {
    use Mix::*;
    let s = |cache, q_cache_dtype, kv_heads, group, head_dim, block_size, mix| Spec { cache, q_cache_dtype, kv_heads, group, head_dim, block_size, mix };
    let mut v = vec![
        s(DType::BF16, true, 3, 3, 64, 16, Mixed),   // SmolLM2-135M, bf16 model
        s(DType::BF16, true, 8, 4, 128, 16, Mixed),  // Llama-3-8B, bf16 model
        s(DType::BF16, false, 8, 4, 128, 32, Mixed), // quantized model: f32 activations
        s(DType::F16, true, 4, 8, 64, 32, Mixed),    // TinyLlama-style group of 8
        s(DType::F32, false, 2, 2, 128, 16, Mixed),
        s(DType::BF16, true, 8, 4, 128, 16, Long),
        s(DType::F16, false, 2, 9, 64, 32, Long), // a group of 9: two head chunks
    ];
    if !quick {
        v.extend([
            s(DType::F16, true, 1, 1, 128, 16, Mixed),
            s(DType::F16, false, 2, 5, 64, 16, Mixed),
            s(DType::F32, false, 1, 12, 64, 32, Mixed),
            s(DType::BF16, false, 3, 3, 64, 32, Long),
            s(DType::F32, false, 8, 4, 128, 16, Long),
        ]);
    }
    v
}

/// Runs the part.
pub fn run(dev: &Device, quick: bool) -> Result<PartReport> {
    let mut report = PartReport::new("kernels");
    let mut rng = StdRng::seed_from_u64(20_251_130);
    let paths = [
        ("default", AttnOptions { tensor_cores: true, partition: None }),
        ("query-at-a-time", AttnOptions { tensor_cores: false, partition: None }),
        ("split-K 256", AttnOptions { tensor_cores: false, partition: Some(256) }),
    ];
    for spec in specs(quick) {
        let case = make_case(&mut rng, spec);
        let name = format!(
            "{:?} cache, q {}, {} kv heads x {}, d {}, block {}, {:?} ({} seqs, {} queries, ctx <= {})",
            spec.cache,
            if spec.q_cache_dtype { "in cache dtype" } else { "f32" },
            spec.kv_heads,
            spec.group,
            spec.head_dim,
            spec.block_size,
            spec.mix,
            case.seqs.len(),
            case.seqs.iter().map(|s| s.qlen).sum::<usize>(),
            case.seqs.iter().map(|s| s.ctx).max().unwrap_or(0)
        );
        let (kc, vc) = caches(&case, &Device::Cpu)?;
        let (gk, gv) = caches(&case, dev)?;
        let (want_k, got_k) = (host_values(&kc)?, host_values(&gk)?);
        let (want_v, got_v) = (host_values(&vc)?, host_values(&gv)?);
        let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()));
        let cache_ok = same(&want_k, &got_k) && same(&want_v, &got_v);
        report.row(format!("reshape_and_cache, {name}"), if cache_ok { "bit-exact" } else { "differs" }, "bit-exact", Status::of(cache_ok));

        let scale = 1.0 / (spec.head_dim as f32).sqrt();
        // The CPU sees exactly the queries the GPU sees (rounded when they travel in 16 bits).
        let q_cpu = queries(&case, &Device::Cpu)?.to_dtype(DType::F32)?;
        let want: Vec<f32> = pace_kernels::paged_attention(&q_cpu, &kc, &vc, &meta(&case, &Device::Cpu)?, scale)?.flatten_all()?.to_vec1()?;
        let q_gpu = queries(&case, dev)?;
        let gmeta = meta(&case, dev)?;
        for (path, opts) in paths {
            let got: Vec<f32> =
                paged_attention_with(&q_gpu, &gk, &gv, &gmeta, scale, opts)?.to_dtype(DType::F32)?.to_device(&Device::Cpu)?.flatten_all()?.to_vec1()?;
            let (rel, abs) = max_errors(&got, &want);
            let (ok, value, target) = if spec.cache == DType::F32 && !spec.q_cache_dtype {
                (rel <= 1e-4, format!("max rel err {rel:.2e}"), "1e-4 rel")
            } else {
                (abs <= 1.5e-2, format!("max abs err {abs:.2e}"), "1.5e-2 abs")
            };
            report.row(format!("paged_attention [{path}], {name}"), value, target, Status::of(ok));
        }
    }
    argmax_rows(&mut report, dev, &mut rng)?;
    ptxas_rows(&mut report);
    Ok(report)
}

/// `argmax_rows` on `dev` against the CPU on rows with planted ties (the maximum at several
/// places), NaN, +inf and rows of nothing but -inf and NaN.
fn argmax_rows(report: &mut PartReport, dev: &Device, rng: &mut StdRng) -> Result<()> {
    let (rows, vocab) = (16usize, 128_256usize);
    let mut v: Vec<f32> = (0..rows * vocab).map(|_| rng.random_range(-8.0f32..8.0)).collect();
    for r in 0..rows {
        let row = &mut v[r * vocab..(r + 1) * vocab];
        match r % 4 {
            1 => {
                for _ in 0..6 {
                    let i = rng.random_range(0..vocab);
                    row[i] = 20.0;
                }
            }
            2 => {
                row[rng.random_range(0..vocab)] = f32::NAN;
                row[vocab - 1] = f32::INFINITY;
                row[vocab / 3] = f32::INFINITY;
            }
            3 if r == 3 => row.iter_mut().enumerate().for_each(|(i, x)| *x = if i % 2 == 0 { f32::NEG_INFINITY } else { f32::NAN }),
            _ => {}
        }
    }
    let host = Tensor::from_vec(v, (rows, vocab), &Device::Cpu)?;
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let x = host.to_dtype(dtype)?;
        let want: Vec<u32> = pace_kernels::sample::argmax_rows(&x)?.to_vec1()?;
        let got: Vec<u32> = pace_kernels::sample::argmax_rows(&x.to_device(dev)?)?.to_device(&Device::Cpu)?.to_vec1()?;
        let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
        report.row(
            format!("argmax_rows (greedy), {dtype:?}, {rows} rows x {vocab} with ties, NaN and inf"),
            format!("{} of {rows} rows choose the CPU's token", rows - differ),
            "all",
            Status::of(differ == 0 && got.len() == rows),
        );
    }
    Ok(())
}

/// The build's ptxas record: printed whole, summarised as one row (registers and spills).
fn ptxas_rows(report: &mut PartReport) {
    let Some(tsv) = pace_kernels::device::ptxas_report() else {
        report.row("ptxas record of the kernels", "none: not the CUDA build", "info", Status::Info);
        return;
    };
    println!("ptxas record (registers, spill bytes, shared memory) of this build's kernels:\n{tsv}");
    let (mut n, mut max_regs, mut max_at) = (0usize, 0u32, String::new());
    let mut spills = Vec::new();
    for line in tsv.lines().skip(1) {
        let f: Vec<&str> = line.split('\t').collect();
        let num = |i: usize| f.get(i).and_then(|x| x.parse::<u32>().ok()).unwrap_or(0);
        if f.len() < 6 {
            continue;
        }
        n += 1;
        if num(2) > max_regs {
            max_regs = num(2);
            max_at = format!("{} {}", f[0], f[1]);
        }
        if num(3) + num(4) > 0 {
            spills.push(format!("{} {} ({}/{} B)", f[0], f[1], num(3), num(4)));
        }
    }
    report.row(
        "ptxas record of the kernels (registers, spills)",
        format!("{n} kernel builds; most registers {max_regs} ({max_at}); spills: {}", if spills.is_empty() { "none".to_string() } else { spills.join(", ") }),
        "info",
        Status::Info,
    );
}
