//! Token sampling with the OpenAI parameter set (plus vLLM's `top_k`, `min_p` and
//! `repetition_penalty`), one [`Sampler`] per request.
//!
//! Each call to [`Sampler::sample`] processes one row of logits in this order, as vLLM does:
//!
//! 1. penalties on the raw logits: the repetition penalty (HF/vLLM: over prompt and output
//!    tokens, a positive logit is divided by it, a negative one multiplied), then OpenAI's
//!    frequency and presence penalties over output tokens only
//!    (`logit -= count * frequency_penalty + (count > 0) * presence_penalty`);
//! 2. temperature 0 (or `top_k == 1`): greedy, the highest logit, ties to the lowest id, one
//!    pass over the vocabulary;
//! 3. otherwise logits are divided by the temperature, then truncated: `top_k` highest, then the
//!    smallest most-likely set whose probability reaches `top_p`, then tokens with probability
//!    below `min_p` times the highest; one token is drawn from what is left, renormalised.
//!
//! Log-probabilities ([`SamplingParams::logprobs`]) are the log-softmax of the logits after
//! penalties and temperature (temperature 0 counts as 1), before top-k/top-p/min-p truncation:
//! what [`SampledToken::logprob`] documents. The truncated distribution would give greedy
//! requests a log-probability of 0 and every alternative -inf, which tells a client nothing.
//!
//! Randomness is per request: a [`Sampler`] owns a ChaCha-based `StdRng` seeded from
//! [`SamplingParams::seed`] (or a random seed), so a seeded request draws the same tokens from
//! the same logits whatever else runs in the batch.
//!
//! Cost for a 49k vocabulary: penalties touch only the tokens seen; greedy is one vectorised
//! pass; untruncated sampling is a few linear passes with a vectorised `exp`; `top_k` and
//! `top_p` use selection (quickselect on rank, and on probability mass for `top_p`), never a
//! full sort.

use std::collections::{HashMap, HashSet};

use pace_kernels::sample::argmax;
use pace_scheduler::SampledToken;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::constraint::Constraint;
use crate::error::{Error, Result};

/// Most top log-probabilities a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A request's sampling parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature in [0, 2]; 0 is greedy.
    pub temperature: f32,
    /// Nucleus sampling mass in (0, 1]; 1 disables it.
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables it (vLLM's -1 maps to 0).
    pub top_k: u32,
    /// Drop tokens less likely than `min_p` times the most likely one, in [0, 1]; 0 disables it.
    pub min_p: f32,
    /// Seed of the request's random generator; None draws one at random.
    pub seed: Option<u64>,
    /// OpenAI presence penalty in [-2, 2], over output tokens.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty in [-2, 2], over output tokens.
    pub frequency_penalty: f32,
    /// HF/vLLM repetition penalty, > 0 (1 disables it), over prompt and output tokens.
    pub repetition_penalty: f32,
    /// Return log-probabilities: None for none, Some(n) for the sampled token's and the `n`
    /// most likely tokens' (0 = only the sampled token's), n <= [`MAX_TOP_LOGPROBS`].
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    /// OpenAI's defaults: temperature 1, no truncation, no penalties, no logprobs.
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logprobs: None,
        }
    }
}

/// An invalid sampling parameter: which one (the [`SamplingParams`] field name, for an
/// OpenAI-style 400 with `param`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{param}: {message}")]
pub struct ParamError {
    /// The field name, e.g. `"top_p"`.
    pub param: &'static str,
    /// What is wrong with it.
    pub message: String,
}

impl From<ParamError> for Error {
    fn from(e: ParamError) -> Self {
        Error::Invalid(e.to_string())
    }
}

impl SamplingParams {
    /// Greedy decoding, no penalties.
    pub fn greedy() -> Self {
        Self { temperature: 0.0, ..Self::default() }
    }

    /// True if sampling is deterministic argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// True if the token is the argmax of the raw logits: greedy, with no penalty and no
    /// logprobs (which need the whole row).
    pub fn is_plain_greedy(&self) -> bool {
        self.is_greedy() && self.logprobs.is_none() && self.repetition_penalty == 1.0 && self.frequency_penalty == 0.0 && self.presence_penalty == 0.0
    }

    /// Checks every parameter's range; the first bad one is named in the error.
    pub fn validate(&self) -> std::result::Result<(), ParamError> {
        fn check(ok: bool, param: &'static str, v: f32, range: &str) -> std::result::Result<(), ParamError> {
            if ok {
                Ok(())
            } else {
                Err(ParamError { param, message: format!("{v} is not in {range}") })
            }
        }
        let t = self.temperature;
        check(t.is_finite() && (0.0..=2.0).contains(&t), "temperature", t, "[0, 2]")?;
        let p = self.top_p;
        check(p.is_finite() && p > 0.0 && p <= 1.0, "top_p", p, "(0, 1]")?;
        let m = self.min_p;
        check(m.is_finite() && (0.0..=1.0).contains(&m), "min_p", m, "[0, 1]")?;
        let pp = self.presence_penalty;
        check(pp.is_finite() && (-2.0..=2.0).contains(&pp), "presence_penalty", pp, "[-2, 2]")?;
        let fp = self.frequency_penalty;
        check(fp.is_finite() && (-2.0..=2.0).contains(&fp), "frequency_penalty", fp, "[-2, 2]")?;
        let rp = self.repetition_penalty;
        check(rp.is_finite() && rp > 0.0, "repetition_penalty", rp, "(0, inf)")?;
        if let Some(n) = self.logprobs {
            if n > MAX_TOP_LOGPROBS {
                return Err(ParamError { param: "logprobs", message: format!("{n} is more than the maximum of {MAX_TOP_LOGPROBS}") });
            }
        }
        Ok(())
    }
}

/// Per-request sampler: parameters, random generator and the token counts penalties need.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: StdRng,
    /// Distinct prompt tokens (kept only for a repetition penalty).
    prompt_tokens: HashSet<u32>,
    /// How often each token has been output.
    output_counts: HashMap<u32, u32>,
    /// Scratch: candidates as rank keys (see `rank_key`).
    keys: Vec<u64>,
    /// Scratch: unnormalised probabilities.
    weights: Vec<f32>,
    /// The request's grammar (structured outputs): it masks the logits before anything else.
    constraint: Option<Constraint>,
}

impl Sampler {
    /// A sampler for one request. Invalid parameters are an error naming the parameter.
    pub fn new(params: SamplingParams, prompt_tokens: &[u32]) -> std::result::Result<Self, ParamError> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(rand::random);
        let prompt_tokens = if params.repetition_penalty != 1.0 { prompt_tokens.iter().copied().collect() } else { HashSet::new() };
        Ok(Self {
            params,
            seed,
            rng: StdRng::seed_from_u64(seed),
            prompt_tokens,
            output_counts: HashMap::new(),
            keys: Vec::new(),
            weights: Vec::new(),
            constraint: None,
        })
    }

    /// Constrains every token this sampler draws to `constraint`'s grammar.
    pub fn with_constraint(mut self, constraint: Constraint) -> Self {
        self.constraint = Some(constraint);
        self
    }

    /// The grammar, if the request has one (the runner computes its next mask ahead).
    pub fn constraint_mut(&mut self) -> Option<&mut Constraint> {
        self.constraint.as_mut()
    }

    /// True if the output is constrained by a grammar.
    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// True once the grammar allows nothing but end-of-generation (complete, or stopped on an
    /// error): the output is over without sampling that token.
    pub fn is_complete(&self) -> bool {
        self.constraint.as_ref().is_some_and(Constraint::is_finished)
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The seed in use (drawn at random when the request gave none).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// True if the token this sampler picks is the argmax of the raw logits (see
    /// [`SamplingParams::is_plain_greedy`]); the caller may then take the argmax itself and
    /// [`record`](Self::record) it.
    pub fn is_plain_greedy(&self) -> bool {
        self.params.is_plain_greedy() && self.constraint.is_none()
    }

    /// Counts `token` as output for the penalties without sampling it. [`sample`](Self::sample)
    /// does this itself.
    pub fn record(&mut self, token: u32) {
        *self.output_counts.entry(token).or_insert(0) += 1;
    }

    /// Samples the next token from one row of logits (modified in place: the grammar's mask,
    /// penalties and temperature are applied to it) and records it. The returned `id` is 0: the
    /// caller sets it. Empty logits are [`Error::Invalid`]. A NaN logit never wins; when
    /// sampling, NaN counts as -inf and +inf as the largest finite value.
    ///
    /// With a grammar, disallowed ids are set to -inf first, so truncation, the draw and the
    /// log-probabilities are over the allowed ids only (vLLM does the same).
    pub fn sample(&mut self, logits: &mut [f32]) -> Result<SampledToken> {
        if logits.is_empty() {
            return Err(Error::Invalid("sampling from empty logits".into()));
        }
        if let Some(c) = &mut self.constraint {
            c.apply(logits);
        }
        self.apply_penalties(logits);
        let greedy = self.params.is_greedy();
        if !greedy || self.params.logprobs.is_some() {
            // Temperature 0 counts as 1 for logprobs.
            let t = self.params.temperature;
            let inv_t = if t > 0.0 { 1.0 / t } else { 1.0 };
            for l in logits.iter_mut() {
                // Branch-free so it vectorises: NaN -> -inf, +inf -> MAX, then scale.
                let x = if l.is_nan() { f32::NEG_INFINITY } else { l.min(f32::MAX) };
                *l = x * inv_t;
            }
        }
        let mut token = if greedy { argmax(logits) } else { self.draw(logits) };
        if let Some(c) = &mut self.constraint {
            // Every allowed logit is -inf or NaN (a broken model row): take the lowest allowed id
            // rather than one the grammar forbids.
            if !c.allows(token) {
                token = (0..logits.len() as u32).find(|&t| c.allows(t)).unwrap_or(token);
            }
            c.commit(token);
        }
        let (logprob, top_logprobs) = match self.params.logprobs {
            None => (None, Vec::new()),
            Some(n) => {
                let lse = log_sum_exp(logits, &mut self.weights);
                let top = top_n(logits, n).into_iter().map(|(i, l)| (i, l - lse)).collect();
                (Some(logits[token as usize] - lse), top)
            }
        };
        self.record(token);
        Ok(SampledToken { id: 0, token, logprob, top_logprobs })
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            let r = p.repetition_penalty;
            let seen = self.prompt_tokens.iter().chain(self.output_counts.keys().filter(|t| !self.prompt_tokens.contains(t)));
            for &t in seen {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / r } else { *l * r };
                }
            }
        }
        if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
            for (&t, &count) in &self.output_counts {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= count as f32 * p.frequency_penalty + p.presence_penalty;
                }
            }
        }
    }

    /// Truncates (top-k, top-p, min-p) and draws from temperature-scaled logits.
    fn draw(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        let v = logits.len();
        let max = logits[argmax(logits) as usize];
        if max == f32::NEG_INFINITY {
            return 0; // nothing is possible; any answer is as good
        }
        // weights[i] = exp(l_i - max): unnormalised probabilities.
        exp_shifted(logits, max, &mut self.weights);
        // p_i >= min_p * p_max  <=>  l_i >= max + ln(min_p); the most likely token always stays.
        let floor = if p.min_p > 0.0 { max + p.min_p.ln() } else { f32::NEG_INFINITY };
        let top_k = (p.top_k as usize).min(v);

        if top_k == 0 && p.top_p >= 1.0 {
            // No truncation by rank: scan the weights in id order.
            if p.min_p > 0.0 {
                for (w, &l) in self.weights.iter_mut().zip(logits) {
                    if l < floor {
                        *w = 0.0;
                    }
                }
            }
            let total = sum(&self.weights);
            let u = self.rng.random::<f64>() * total;
            return pick(self.weights.iter().copied().zip(0..v as u32), u).unwrap_or(argmax(logits));
        }

        // Candidates as sort keys: ascending key = higher logit first, then lower id.
        self.keys.clear();
        self.keys.extend(logits.iter().enumerate().map(|(i, &l)| rank_key(l, i as u32)));
        if top_k > 0 && top_k < v {
            self.keys.select_nth_unstable(top_k);
            self.keys.truncate(top_k);
        }
        if p.top_p < 1.0 {
            let w = &self.weights;
            let total = if self.keys.len() == v { sum(w) } else { self.keys.iter().map(|&k| w[key_id(k)] as f64).sum() };
            let cut = nucleus_len(&mut self.keys, w, p.top_p as f64 * total);
            self.keys.truncate(cut);
        }
        if p.min_p > 0.0 {
            self.keys.retain(|&k| logits[key_id(k)] >= floor);
        }
        let w = &self.weights;
        let total: f64 = self.keys.iter().map(|&k| w[key_id(k)] as f64).sum();
        let u = self.rng.random::<f64>() * total;
        pick(self.keys.iter().map(|&k| (w[key_id(k)], key_id(k) as u32)), u).unwrap_or(argmax(logits))
    }
}

/// The candidate whose cumulative weight first exceeds `u` (the last with weight if rounding
/// leaves `u` at the total).
fn pick(items: impl Iterator<Item = (f32, u32)>, mut u: f64) -> Option<u32> {
    let mut last = None;
    for (w, id) in items {
        if w > 0.0 {
            u -= w as f64;
            last = Some(id);
            if u < 0.0 {
                return last;
            }
        }
    }
    last
}

/// A key ordering candidates by logit descending, then id ascending, as one integer.
fn rank_key(logit: f32, id: u32) -> u64 {
    let b = logit.to_bits();
    // Monotonic map of floats to unsigned integers, then inverted for descending order.
    let asc = if b & 0x8000_0000 != 0 { !b } else { b | 0x8000_0000 };
    ((!asc as u64) << 32) | id as u64
}

fn key_id(key: u64) -> usize {
    (key & 0xFFFF_FFFF) as usize
}

/// Reorders `keys` so that a prefix holds the most likely candidates whose weight reaches
/// `need` (the fewest, in rank order at the boundary) and returns its length, at least 1.
/// Quickselect on weight mass: expected linear time, no full sort.
fn nucleus_len(keys: &mut [u64], w: &[f32], need: f64) -> usize {
    let (mut lo, mut hi) = (0, keys.len());
    let mut acc = 0.0; // weight of keys[..lo], all of which are kept
    while hi - lo > 32 {
        let mid = lo + (hi - lo) / 2;
        keys[lo..hi].select_nth_unstable(mid - lo);
        let left: f64 = keys[lo..mid].iter().map(|&k| w[key_id(k)] as f64).sum();
        if acc + left >= need {
            hi = mid;
        } else {
            acc += left;
            lo = mid;
        }
    }
    keys[lo..hi].sort_unstable();
    for (i, &k) in keys[lo..hi].iter().enumerate() {
        acc += w[key_id(k)] as f64;
        if acc >= need {
            return lo + i + 1;
        }
    }
    hi.max(1)
}

/// `exp(x)` for `x <= 0` in f32, branch-free so loops over it vectorise: range reduction to
/// `2^n * exp(r)`, |r| <= ln2/2, and a degree-6 Taylor polynomial (relative error < 2e-7).
/// Below -87 (and -inf) it is 0.
#[inline(always)]
fn exp_nonpos(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding and subtracting rounds to an integer
    let xc = if x > -87.0 { x } else { -87.0 };
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // t's low mantissa bits hold the integer n (its ulp is 1): 2^n built from them with integer
    // operations only, which vectorise where a float-to-int cast does not.
    let n_bits = t.to_bits().wrapping_sub(ROUND.to_bits());
    let scale = f32::from_bits(n_bits.wrapping_add(127) << 23);
    if x < -87.0 {
        0.0
    } else {
        p * scale
    }
}

/// `out[i] = exp(logits[i] - max)`.
fn exp_shifted(logits: &[f32], max: f32, out: &mut Vec<f32>) {
    out.resize(logits.len(), 0.0);
    for (o, &l) in out.iter_mut().zip(logits) {
        *o = exp_nonpos(l - max);
    }
}

/// Sum in f32 lanes, blocks added in f64.
fn sum(w: &[f32]) -> f64 {
    let mut total = 0.0f64;
    for block in w.chunks(1024) {
        let mut lanes = [0.0f32; 8];
        let chunks = block.chunks_exact(8);
        let tail = chunks.remainder();
        for c in chunks {
            for j in 0..8 {
                lanes[j] += c[j];
            }
        }
        total += lanes.iter().chain(tail).map(|&x| x as f64).sum::<f64>();
    }
    total
}

/// `ln(sum(exp(l)))`, stable; `scratch` is reused for the exponentials.
fn log_sum_exp(logits: &[f32], scratch: &mut Vec<f32>) -> f32 {
    let max = logits[argmax(logits) as usize];
    if max == f32::NEG_INFINITY || max.is_nan() {
        return max;
    }
    exp_shifted(logits, max, scratch);
    max + sum(scratch).ln() as f32
}

/// The `n` best (id, logit) pairs, best first (ties: lower id), in one pass keeping a small
/// sorted list. NaN and -inf (masked) logits are never listed, so there may be fewer than `n`.
fn top_n(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return best;
    }
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() || l == f32::NEG_INFINITY || (best.len() == n && l <= best[n - 1].1) {
            continue;
        }
        let pos = best.partition_point(|&(_, bl)| bl >= l);
        best.insert(pos, (i as u32, l));
        best.truncate(n);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_helpers() {
        let l = [0.5, 2.0, -1.0, 2.0, 1.0, 0.0, 0.0, 0.0, 0.0, 2.0, f32::NAN];
        assert_eq!(top_n(&l, 3), vec![(1, 2.0), (3, 2.0), (9, 2.0)]);
        assert_eq!(top_n(&l, 0), vec![]);
        let mut keys: Vec<u64> = l[..5].iter().enumerate().map(|(i, &x)| rank_key(x, i as u32)).collect();
        keys.sort_unstable();
        assert_eq!(keys.iter().map(|&k| key_id(k)).collect::<Vec<_>>(), vec![1, 3, 4, 0, 2]);
        let mut scratch = Vec::new();
        assert!((log_sum_exp(&[0.0, 0.0], &mut scratch) - 2f32.ln()).abs() < 1e-6);
    }

    #[test]
    fn fast_exp_is_accurate() {
        let mut x = 0.0f32;
        while x > -87.0 {
            let (got, want) = (exp_nonpos(x) as f64, (x as f64).exp());
            assert!(((got - want) / want).abs() < 3e-7, "exp({x}) = {got}, want {want}");
            x -= 0.0137;
        }
        assert_eq!(exp_nonpos(0.0), 1.0);
        assert_eq!(exp_nonpos(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpos(-100.0), 0.0);
    }

    #[test]
    fn nucleus_len_takes_the_fewest_best() {
        let w: Vec<f32> = (0..1000).map(|i| 1.0 / (1.0 + i as f32)).collect();
        let mut keys: Vec<u64> = w.iter().enumerate().map(|(i, &x)| rank_key(x.ln(), i as u32)).collect();
        let total: f64 = w.iter().map(|&x| x as f64).sum();
        for p in [0.01, 0.3, 0.5, 0.9, 0.999, 1.0] {
            let n = nucleus_len(&mut keys, &w, p * total);
            let mut ids: Vec<usize> = keys[..n].iter().map(|&k| key_id(k)).collect();
            ids.sort_unstable();
            // The n best are ids 0..n, and n is the fewest reaching the mass.
            assert_eq!(ids, (0..n).collect::<Vec<_>>());
            let mass = |k: usize| w[..k].iter().map(|&x| x as f64).sum::<f64>();
            assert!(mass(n) >= p * total - 1e-9 && (n == 1 || mass(n - 1) < p * total), "p={p} n={n}");
        }
    }
}
