//! The model runner: executes a scheduler's [`BatchPlan`] as one forward pass and samples.
//!
//! It owns the model, the KV cache and each request's sampler; it makes no decisions. The
//! scheduler owns the block tables and says which tokens run; the runner turns the plan into
//! tensors (token ids, positions, KV slots, attention metadata), runs the model, and samples the
//! positions the plan marks.

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use pace_kernels::attention::check_slots;
use pace_kernels::PagedAttentionMeta;
use pace_scheduler::{BatchPlan, RequestId, SampledToken, StepOutput};

use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::llama::{Llama, StepInput};
use crate::sampler::Sampler;

/// Executes plans on one model and one KV cache.
pub struct ModelRunner {
    model: Llama,
    cache: KvCache,
    samplers: HashMap<RequestId, Sampler>,
    /// Test hook: the logits of any slice that feeds this token are NaN.
    nan_on_token: Option<u32>,
}

/// A row of logits worth sampling from: no NaN, no +inf, and at least one finite value. (One
/// pass without early exit, so that it vectorises: a 49k row costs a few microseconds.)
pub fn row_is_sound(row: &[f32]) -> bool {
    let (mut broken, mut finite) = (false, false);
    for &x in row {
        broken |= x.is_nan() | (x == f32::INFINITY);
        finite |= x.is_finite();
    }
    finite && !broken
}

impl ModelRunner {
    /// A runner over a loaded model and its allocated cache.
    pub fn new(model: Llama, cache: KvCache) -> Self {
        Self { model, cache, samplers: HashMap::new(), nan_on_token: None }
    }

    /// Test hook: any slice that feeds `token` gets a row of NaN logits, to exercise the broken-row
    /// path end to end (`pace serve --debug-nan-on-token`).
    pub fn set_nan_on_token(&mut self, token: Option<u32>) {
        self.nan_on_token = token;
    }

    /// The model.
    pub fn model(&self) -> &Llama {
        &self.model
    }

    /// Blocks in the KV cache, the null block included.
    pub fn num_blocks(&self) -> usize {
        self.cache.geometry.num_blocks
    }

    /// Positions per KV block.
    pub fn block_size(&self) -> usize {
        self.cache.geometry.block_size
    }

    /// Registers a request's sampler before its first step.
    pub fn add_request(&mut self, id: RequestId, sampler: Sampler) {
        self.samplers.insert(id, sampler);
    }

    /// Requests with live sampler state.
    pub fn num_requests(&self) -> usize {
        self.samplers.len()
    }

    /// Runs one step. On error no token is sampled; the caller fails the step's requests.
    pub fn execute(&mut self, plan: &BatchPlan) -> Result<StepOutput> {
        for id in &plan.released {
            self.samplers.remove(id);
        }
        if plan.seqs.is_empty() {
            return Ok(StepOutput::default());
        }
        let input = self.prepare(plan, None)?;
        // On the CPU the whole forward pass runs on a kernel-pool thread: the kernels' parallel
        // loops then start from inside the pool instead of handing each one over from this
        // thread. On a GPU it stays on this thread, which uploaded the inputs and will read the
        // tokens back: the forward only enqueues launches (the device's one stream orders them
        // whatever thread issues them; this keeps a step on one thread as well).
        let on_pool = pace_kernels::device::forward_on_kernel_pool(self.model.device().location());
        let (model, cache) = (&self.model, &self.cache);
        // Grammar masks of the constrained rows are computed on this thread meanwhile (they
        // depend only on the tokens already committed); sampling then only applies them.
        let mut constrained: Vec<&mut Sampler> = if self.samplers.values().any(Sampler::is_constrained) {
            let sampled: std::collections::HashSet<RequestId> = plan.seqs.iter().filter(|s| s.sample).map(|s| s.id).collect();
            self.samplers.iter_mut().filter(|(id, s)| s.is_constrained() && sampled.contains(id)).map(|(_, s)| s).collect()
        } else {
            Vec::new()
        };
        let logits = if !on_pool {
            // Enqueue the forward pass first: the masks are then computed while the GPU runs it.
            let logits = model.forward(&input, cache)?;
            for s in constrained.iter_mut() {
                if let Some(c) = s.constraint_mut() {
                    c.compute_mask();
                }
            }
            logits
        } else if constrained.is_empty() {
            rayon::scope(|_| model.forward(&input, cache))?
        } else {
            let mut out = None;
            rayon::in_place_scope(|scope| {
                scope.spawn(|_| out = Some(model.forward(&input, cache)));
                for s in constrained.iter_mut() {
                    if let Some(c) = s.constraint_mut() {
                        c.compute_mask();
                    }
                }
            });
            out.expect("the scope ran the forward pass")?
        };
        if self.nan_on_token.is_none() {
            if let Some(out) = self.sample_greedy_on_device(plan, &logits)? {
                return Ok(out);
            }
        }
        let mut rows = logits.to_vec2::<f32>()?;
        let mut sampled = Vec::with_capacity(rows.len());
        let (mut complete, mut failed) = (Vec::new(), Vec::new());
        for (s, row) in plan.seqs.iter().filter(|s| s.sample).zip(rows.iter_mut()) {
            if self.nan_on_token.is_some_and(|t| s.tokens.contains(&t)) {
                row.fill(f32::NAN);
            }
            // A broken row (a numerical fault in the model or the kernels) fails its request:
            // a token drawn from it would be garbage presented as an answer.
            if !row_is_sound(row) {
                failed.push(s.id);
                continue;
            }
            let sampler = self.samplers.get_mut(&s.id).ok_or_else(|| Error::Invalid(format!("request {} has no sampler", s.id)))?;
            let mut tok = sampler.sample(row)?;
            tok.id = s.id;
            sampled.push(tok);
            if sampler.is_complete() {
                complete.push(s.id);
            }
        }
        Ok(StepOutput { sampled, complete, failed })
    }

    /// On a GPU, when every sampled request is plain greedy (no logprobs, no penalties), takes
    /// the argmax of each row on the device and copies only the token ids to the host, instead
    /// of every row of logits (64 rows of a 128k vocabulary are 33 MB). The device's argmax
    /// follows the host sampler's rule (ties to the lowest id, NaN never chosen:
    /// `pace_kernels::sample`), so the token does not depend on where it was chosen. `None`:
    /// sample on the host.
    fn sample_greedy_on_device(&mut self, plan: &BatchPlan, logits: &Tensor) -> Result<Option<StepOutput>> {
        let sampled_seqs = || plan.seqs.iter().filter(|s| s.sample);
        let plain = sampled_seqs().all(|s| self.samplers.get(&s.id).is_some_and(Sampler::is_plain_greedy));
        if logits.device().is_cpu() || logits.dim(0)? == 0 || !plain {
            return Ok(None);
        }
        let ids: Vec<u32> = pace_kernels::sample::argmax_rows(logits)?.to_vec1()?;
        // With no grammar and no penalty every logit must be finite, so a row whose sum (in f32,
        // which a 128k row of f16 logits could overflow) is not finite is broken.
        let sums: Vec<f32> = logits.to_dtype(candle_core::DType::F32)?.sum(1)?.to_vec1()?;
        let mut out = StepOutput { sampled: Vec::with_capacity(ids.len()), ..Default::default() };
        for ((s, token), sum) in sampled_seqs().zip(ids).zip(sums) {
            if !sum.is_finite() {
                out.failed.push(s.id);
                continue;
            }
            if let Some(sampler) = self.samplers.get_mut(&s.id) {
                sampler.record(token);
            }
            out.sampled.push(SampledToken { id: s.id, token, logprob: None, top_logprobs: Vec::new() });
        }
        Ok(Some(out))
    }

    /// Runs one step without sampling and returns the logits of the positions the plan marks
    /// `sample` (in plan order). For checking one device against another (`pace gpu-check`).
    pub fn step_logits(&mut self, plan: &BatchPlan) -> Result<Vec<Vec<f32>>> {
        if plan.seqs.is_empty() {
            return Ok(Vec::new());
        }
        let input = self.prepare(plan, None)?;
        Ok(self.model.forward(&input, &self.cache)?.to_vec2::<f32>()?)
    }

    /// The tensors of one step, prepared as [`ModelRunner::execute`] prepares them. With
    /// [`ModelRunner::forward`], for benchmarks that time the model's forward pass alone.
    pub fn prepare_step(&self, plan: &BatchPlan) -> Result<StepInput> {
        self.prepare(plan, None)
    }

    /// The model's forward pass over a prepared step (K/V written into the cache); returns the
    /// logits of the sampled positions on the device, without sampling.
    pub fn forward(&self, input: &StepInput) -> Result<Tensor> {
        self.model.forward(input, &self.cache)
    }

    /// Logits at positions `from..tokens.len()` of one sequence, computed by a single prefill
    /// through `block_table` (which the caller owns for the duration), for checking the model
    /// against reference logits.
    pub fn prompt_logits(&mut self, tokens: &[u32], block_table: &[u32], from: usize) -> Result<Vec<Vec<f32>>> {
        if from >= tokens.len() {
            return Ok(Vec::new());
        }
        let plan = BatchPlan {
            step: 0,
            seqs: vec![pace_scheduler::SeqSlice {
                id: RequestId::MAX,
                tokens: tokens.to_vec(),
                start_pos: 0,
                block_table: block_table.to_vec(),
                sample: false,
            }],
            released: vec![],
        };
        let wanted: Vec<u32> = (from as u32..tokens.len() as u32).collect();
        let input = self.prepare(&plan, Some(wanted))?;
        Ok(self.model.forward(&input, &self.cache)?.to_vec2::<f32>()?)
    }

    fn prepare(&self, plan: &BatchPlan, sample_at: Option<Vec<u32>>) -> Result<StepInput> {
        let geo = self.cache.geometry;
        let bs = geo.block_size;
        let vocab = self.model.config().vocab_size as u32;
        let n_tok = plan.num_tokens();
        let max_blocks = plan.seqs.iter().map(|s| s.block_table.len()).max().unwrap_or(0).max(1);
        let mut ids = Vec::with_capacity(n_tok);
        let mut positions = Vec::with_capacity(n_tok);
        let mut slots = Vec::with_capacity(n_tok);
        let mut cu = Vec::with_capacity(plan.seqs.len() + 1);
        let mut ctx = Vec::with_capacity(plan.seqs.len());
        let mut tables = Vec::with_capacity(plan.seqs.len() * max_blocks);
        let mut sample_idx = Vec::new();
        cu.push(0u32);
        for s in &plan.seqs {
            if s.tokens.is_empty() {
                return Err(Error::Invalid(format!("request {} has an empty slice", s.id)));
            }
            if s.context_len() > self.model.max_positions() {
                return Err(Error::Invalid(format!(
                    "request {} reaches position {}, beyond the {} positions configured",
                    s.id,
                    s.context_len(),
                    self.model.max_positions()
                )));
            }
            if s.block_table.len() * bs < s.context_len() {
                return Err(Error::Invalid(format!("request {}: block table too short", s.id)));
            }
            for (j, &tok) in s.tokens.iter().enumerate() {
                if tok >= vocab {
                    return Err(Error::Invalid(format!("token id {tok} is outside the vocabulary")));
                }
                let pos = s.start_pos + j;
                ids.push(tok);
                positions.push(pos as u32);
                slots.push(s.block_table[pos / bs] * bs as u32 + (pos % bs) as u32);
            }
            if s.sample {
                sample_idx.push(ids.len() as u32 - 1);
            }
            cu.push(ids.len() as u32);
            ctx.push(s.context_len() as u32);
            tables.extend_from_slice(&s.block_table);
            tables.extend(std::iter::repeat_n(0, max_blocks - s.block_table.len()));
        }
        check_slots(&slots, &geo)?;
        let sample_idx = sample_at.unwrap_or(sample_idx);
        let dev = self.model.device();
        let attn = PagedAttentionMeta::new(cu, ctx, tables, max_blocks, geo, dev)?;
        Ok(StepInput {
            token_ids: Tensor::from_slice(&ids, n_tok, dev)?,
            positions: Tensor::from_slice(&positions, n_tok, dev)?,
            slots: Tensor::from_slice(&slots, n_tok, dev)?,
            // A GPU cannot allocate an empty buffer; the model never reads an empty index.
            sample_idx: Tensor::from_slice(&sample_idx, sample_idx.len(), if sample_idx.is_empty() { &Device::Cpu } else { dev })?,
            token_ids_host: ids,
            attn,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::row_is_sound;

    #[test]
    fn a_row_is_sound_only_with_a_finite_value_and_no_nan_or_plus_infinity() {
        assert!(row_is_sound(&[0.5, -3.0, 12.0]));
        // A grammar's mask is -inf: fine while something is left.
        assert!(row_is_sound(&[f32::NEG_INFINITY, 1.0, f32::NEG_INFINITY]));
        assert!(!row_is_sound(&[f32::NEG_INFINITY; 4]));
        assert!(!row_is_sound(&[]));
        let mut row = vec![0.25f32; 49_152];
        assert!(row_is_sound(&row));
        row[40_000] = f32::NAN;
        assert!(!row_is_sound(&row));
        row[40_000] = f32::INFINITY;
        assert!(!row_is_sound(&row));
    }
}
