//! The step-cost model: a step's duration predicted from its shape, refit online.
//!
//! Form: `t = c0 + c_p * prefill_tokens + c_d * decode_seqs + c_kv * kv_tokens + c_a * attn_pairs`,
//! linear in the coefficients, all of which are non-negative:
//! - `c0`: per-step cost independent of the batch (reading the weights once on a GPU, launch and
//!   framework overhead);
//! - `c_p`: per prefill token (the matmul FLOPs of one token);
//! - `c_d`: per decode sequence (one token's matmuls, sampling, per-sequence bookkeeping);
//! - `c_kv`: per KV token attended (reading the cache: every slice reads its whole context);
//! - `c_a`: per (query, key) pair of prefill attention (the quadratic term of long prompts).
//!
//! A slice of one token counts as a decode sequence, longer slices as prefill tokens: a one-token
//! prefill tail costs what a decode costs, so the split does not need to know which it is.
//!
//! Refit: the last [`WINDOW`] measured steps are kept in a ring; every [`REFIT_EVERY`]
//! observations the coefficients are re-solved by ridge regression pulled towards the prior (the
//! preset or start-up profile), in feature units scaled to the data, so a feature the recent steps
//! do not vary (say no prefill for a minute) keeps its prior value instead of drifting. Solving a
//! 5x5 system every 16 steps costs well under a microsecond per step.

use serde::{Deserialize, Serialize};

use crate::plan::BatchPlan;

/// Number of features.
const NF: usize = 5;
/// Steps kept for refitting.
pub const WINDOW: usize = 512;
/// Refit after this many new observations.
pub const REFIT_EVERY: usize = 16;
/// Weight of the newest step in the model's running estimate of the machine's speed
/// ([`StepCostModel::effective`]). Measured on the CPU server (docs/bench/prediction-error-cpu-smollm2):
/// the log error of the fitted model has a lag-1 autocorrelation of 0.77 and steps of one shape
/// vary by a CV of 11-13%, so most of the error is a speed that drifts over a few steps (the
/// machine's other load, cache and frequency state) rather than shape; 0.3 follows it within
/// about three steps. Under independent noise (the simulator's) it adds a sixth of that noise's
/// variance to the predictions.
pub const SPEED_ALPHA: f64 = 0.3;

/// What a step costs depends on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StepShape {
    /// Tokens in slices longer than one token.
    pub prefill_tokens: usize,
    /// Slices of exactly one token.
    pub decode_seqs: usize,
    /// Sum over slices of the context attended (`start_pos + len`).
    pub kv_tokens: usize,
    /// Sum over multi-token slices of query-key pairs, `sum_j (start_pos + j + 1)`.
    pub attn_pairs: f64,
}

impl StepShape {
    /// The shape of a plan.
    pub fn of(plan: &BatchPlan) -> StepShape {
        let mut s = StepShape::default();
        for slice in &plan.seqs {
            s.add_slice(slice.start_pos, slice.len());
        }
        s
    }

    /// Add one slice of `len` tokens starting at `start_pos`.
    pub fn add_slice(&mut self, start_pos: usize, len: usize) {
        if len == 1 {
            self.decode_seqs += 1;
        } else {
            self.prefill_tokens += len;
            self.attn_pairs += pairs(start_pos, len);
        }
        self.kv_tokens += start_pos + len;
    }

    /// Tokens fed.
    pub fn num_tokens(&self) -> usize {
        self.prefill_tokens + self.decode_seqs
    }

    fn features(&self) -> [f64; NF] {
        [1.0, self.prefill_tokens as f64, self.decode_seqs as f64, self.kv_tokens as f64, self.attn_pairs]
    }
}

/// Query-key pairs of a causal chunk of `len` tokens after `start` cached ones.
pub fn pairs(start: usize, len: usize) -> f64 {
    let (s, l) = (start as f64, len as f64);
    l * s + l * (l + 1.0) / 2.0
}

/// Coefficients of the model, seconds per unit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CostCoeffs {
    /// Per step.
    pub base_s: f64,
    /// Per prefill token.
    pub per_prefill_token_s: f64,
    /// Per decode sequence.
    pub per_decode_seq_s: f64,
    /// Per KV token attended.
    pub per_kv_token_s: f64,
    /// Per prefill query-key pair.
    pub per_attn_pair_s: f64,
}

impl CostCoeffs {
    fn to_array(self) -> [f64; NF] {
        [self.base_s, self.per_prefill_token_s, self.per_decode_seq_s, self.per_kv_token_s, self.per_attn_pair_s]
    }

    fn from_array(a: [f64; NF]) -> Self {
        Self { base_s: a[0], per_prefill_token_s: a[1], per_decode_seq_s: a[2], per_kv_token_s: a[3], per_attn_pair_s: a[4] }
    }

    /// Predicted seconds for `shape`.
    pub fn predict(&self, shape: &StepShape) -> f64 {
        let (c, x) = (self.to_array(), shape.features());
        c.iter().zip(x).map(|(c, x)| c * x).sum::<f64>().max(0.0)
    }
}

/// Predicts step durations and learns from measured ones.
#[derive(Debug, Clone)]
pub struct StepCostModel {
    prior: CostCoeffs,
    current: CostCoeffs,
    ring: Vec<([f64; NF], f64)>,
    ring_pos: usize,
    since_refit: usize,
    /// `measured / predicted` of the last [`WINDOW`] steps, predicted before the step was seen.
    ratios: Vec<f64>,
    ratio_pos: usize,
    /// The same ratios, sorted (kept in step with the ring, so a quantile is a lookup: the
    /// scheduler asks for one every step and at every admission).
    sorted_ratios: Vec<f64>,
    /// Exponentially weighted mean ([`SPEED_ALPHA`]) of `ln(measured / fitted prediction)`:
    /// how much slower than its fitted shape the machine runs now.
    log_speed: f64,
}

impl StepCostModel {
    /// A model that predicts with `prior` until measurements arrive.
    pub fn new(prior: CostCoeffs) -> Self {
        Self {
            prior,
            current: prior,
            ring: Vec::with_capacity(WINDOW),
            ring_pos: 0,
            since_refit: 0,
            ratios: Vec::new(),
            ratio_pos: 0,
            sorted_ratios: Vec::new(),
            log_speed: 0.0,
        }
    }

    /// A model seeded by a profile run: the prior is refit on `samples` at once.
    pub fn from_profile(prior: CostCoeffs, samples: &[(StepShape, f64)]) -> Self {
        let mut m = Self::new(prior);
        for (shape, secs) in samples {
            m.push(shape, *secs);
        }
        m.refit();
        m.prior = m.current;
        m.log_speed = 0.0;
        m
    }

    /// The fitted coefficients: what a step of each shape costs on average over the window.
    pub fn coeffs(&self) -> CostCoeffs {
        self.current
    }

    /// What steps cost now: the fitted coefficients scaled by the machine's recent speed (the
    /// running mean of measured over fitted step times). The scheduler plans with these.
    pub fn effective(&self) -> CostCoeffs {
        let f = self.log_speed.exp();
        let c = self.current.to_array();
        CostCoeffs::from_array(std::array::from_fn(|j| c[j] * f))
    }

    /// Predicted seconds for `shape`, at the machine's recent speed.
    pub fn predict(&self, shape: &StepShape) -> f64 {
        self.current.predict(shape) * self.log_speed.exp()
    }

    /// The `p` quantile of `measured / predicted` over the last [`WINDOW`] steps (each predicted
    /// before it was measured); 1 before any step was measured.
    pub fn ratio_quantile(&self, p: f64) -> f64 {
        if self.ratios.is_empty() {
            return 1.0;
        }
        let v = &self.sorted_ratios;
        v[((p.clamp(0.0, 1.0) * (v.len() - 1) as f64).round() as usize).min(v.len() - 1)]
    }

    /// Record a measured step; refits every [`REFIT_EVERY`] observations.
    pub fn observe(&mut self, shape: &StepShape, measured_secs: f64) {
        if !measured_secs.is_finite() || measured_secs < 0.0 {
            return;
        }
        let fitted = self.current.predict(shape);
        let predicted = fitted * self.log_speed.exp();
        if fitted > 0.0 && measured_secs > 0.0 {
            self.log_speed = ((1.0 - SPEED_ALPHA) * self.log_speed + SPEED_ALPHA * (measured_secs / fitted).ln()).clamp(-1.0, 1.0);
        }
        if predicted > 0.0 && measured_secs > 0.0 {
            let r = measured_secs / predicted;
            if self.ratios.len() < WINDOW {
                self.ratios.push(r);
            } else {
                let old = std::mem::replace(&mut self.ratios[self.ratio_pos], r);
                let at = self.sorted_ratios.partition_point(|x| x.total_cmp(&old).is_lt());
                self.sorted_ratios.remove(at);
                self.ratio_pos = (self.ratio_pos + 1) % WINDOW;
            }
            let at = self.sorted_ratios.partition_point(|x| x.total_cmp(&r).is_lt());
            self.sorted_ratios.insert(at, r);
        }
        self.push(shape, measured_secs);
        self.since_refit += 1;
        if self.since_refit >= REFIT_EVERY {
            self.refit();
        }
    }

    fn push(&mut self, shape: &StepShape, secs: f64) {
        let sample = (shape.features(), secs);
        if self.ring.len() < WINDOW {
            self.ring.push(sample);
        } else {
            self.ring[self.ring_pos] = sample;
            self.ring_pos = (self.ring_pos + 1) % WINDOW;
        }
    }

    /// Ridge regression towards the prior, in scaled units; coefficients clamped at zero.
    fn refit(&mut self) {
        self.since_refit = 0;
        if self.ring.is_empty() {
            return;
        }
        // Scale each feature by its RMS over the ring so one unit of ridge weight means "one
        // typical observation" for every feature.
        let mut scale = [0.0f64; NF];
        for (x, _) in &self.ring {
            for j in 0..NF {
                scale[j] += x[j] * x[j];
            }
        }
        for s in &mut scale {
            *s = (*s / self.ring.len() as f64).sqrt();
            if *s == 0.0 {
                *s = 1.0;
            }
        }
        let prior = self.prior.to_array();
        let mut a = [[0.0f64; NF]; NF];
        let mut b = [0.0f64; NF];
        for (x, y) in &self.ring {
            let z: [f64; NF] = std::array::from_fn(|j| x[j] / scale[j]);
            for i in 0..NF {
                b[i] += z[i] * y;
                for j in 0..NF {
                    a[i][j] += z[i] * z[j];
                }
            }
        }
        const RIDGE: f64 = 1.0;
        for i in 0..NF {
            a[i][i] += RIDGE;
            b[i] += RIDGE * prior[i] * scale[i];
        }
        if let Some(w) = solve(a, b) {
            let c: [f64; NF] = std::array::from_fn(|j| (w[j] / scale[j]).max(0.0));
            if c.iter().all(|v| v.is_finite()) {
                self.current = CostCoeffs::from_array(c);
            }
        }
    }
}

/// Gaussian elimination with partial pivoting; `None` if singular.
fn solve(mut a: [[f64; NF]; NF], mut b: [f64; NF]) -> Option<[f64; NF]> {
    for col in 0..NF {
        let piv = (col..NF).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[piv][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, piv);
        b.swap(col, piv);
        for row in col + 1..NF {
            let f = a[row][col] / a[col][col];
            let pivot_row = a[col];
            for (x, p) in a[row][col..].iter_mut().zip(&pivot_row[col..]) {
                *x -= f * p;
            }
            b[row] -= f * b[col];
        }
    }
    let mut x = [0.0; NF];
    for row in (0..NF).rev() {
        let s: f64 = (row + 1..NF).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - s) / a[row][row];
    }
    Some(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::SeqSlice;
    use rand::{Rng, SeedableRng};

    fn truth() -> CostCoeffs {
        CostCoeffs { base_s: 0.006, per_prefill_token_s: 0.0016, per_decode_seq_s: 0.0009, per_kv_token_s: 2e-6, per_attn_pair_s: 1e-9 }
    }

    #[test]
    fn shape_of_plan_splits_decodes_and_prefill() {
        let slice = |start_pos, len| SeqSlice { id: 0, tokens: vec![1; len], start_pos, block_table: vec![], sample: true };
        let plan = BatchPlan { step: 0, seqs: vec![slice(10, 1), slice(0, 4), slice(20, 1)], released: vec![] };
        let s = StepShape::of(&plan);
        assert_eq!((s.prefill_tokens, s.decode_seqs, s.kv_tokens), (4, 2, 11 + 4 + 21));
        assert_eq!(s.attn_pairs, 10.0);
    }

    #[test]
    fn refit_recovers_true_coefficients_from_a_wrong_prior() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let wrong = CostCoeffs { base_s: 0.02, per_prefill_token_s: 0.0005, ..truth() };
        let mut m = StepCostModel::new(wrong);
        for _ in 0..600 {
            let mut s = StepShape::default();
            for _ in 0..rng.random_range(0..16) {
                s.add_slice(rng.random_range(0..800), 1);
            }
            if rng.random_bool(0.5) {
                s.add_slice(rng.random_range(0..400), rng.random_range(2..256));
            }
            let noise = 1.0 + rng.random_range(-0.02..0.02);
            m.observe(&s, truth().predict(&s) * noise);
        }
        let got = m.coeffs();
        let probe = {
            let mut s = StepShape::default();
            s.add_slice(100, 128);
            for _ in 0..8 {
                s.add_slice(300, 1);
            }
            s
        };
        let rel = (m.predict(&probe) - truth().predict(&probe)).abs() / truth().predict(&probe);
        assert!(rel < 0.03, "relative error {rel}, coeffs {got:?}");
        assert!((got.per_prefill_token_s - 0.0016).abs() < 0.0002, "{got:?}");
    }

    /// A machine that turns 30% slower for a while (other load, a lower clock) is followed
    /// within a few steps, without refitting the shape; when it recovers, so does the model.
    #[test]
    fn predictions_follow_a_drift_in_the_machines_speed() {
        let mut m = StepCostModel::new(truth());
        let mut s = StepShape::default();
        s.add_slice(50, 1);
        s.add_slice(0, 64);
        let t = truth().predict(&s);
        for _ in 0..8 {
            m.observe(&s, t * 1.3);
        }
        let slow = m.predict(&s) / t;
        assert!((slow - 1.3).abs() < 0.03, "{slow}");
        assert!((m.effective().per_prefill_token_s / m.coeffs().per_prefill_token_s - slow).abs() < 1e-9);
        // Seven more: fifteen in all, before the first refit.
        for _ in 0..7 {
            m.observe(&s, t);
        }
        let back = m.predict(&s) / t;
        assert!((back - 1.0).abs() < 0.03, "{back}");
    }

    /// A step cost that drifts (the machine slowing by half over 400 steps of mixed shapes,
    /// then holding) is followed during the drift and settles once it holds, with refits along
    /// the way and no oscillation: after the drift every prediction stays within 4% and the error does not grow
    /// (the speed factor, shared by all shapes, leaves each shape a few percent of its own).
    #[test]
    fn calibration_converges_on_a_drifting_cost_without_oscillating() {
        let mut m = StepCostModel::new(truth());
        let shapes: Vec<StepShape> = (0..8)
            .map(|k| {
                let mut s = StepShape::default();
                for i in 0..(4 + 8 * k) {
                    s.add_slice(100 + 50 * i, 1);
                }
                if k % 2 == 0 {
                    s.add_slice(0, 32 * (k + 1));
                }
                s
            })
            .collect();
        let mut worst_drift: f64 = 0.0;
        // Largest error per 100 steps after the drift stopped.
        let mut after = [0.0f64; 4];
        for step in 0..800usize {
            let drift = 1.0 + 0.5 * (step.min(400) as f64 / 400.0);
            let s = &shapes[step % shapes.len()];
            let actual = truth().predict(s) * drift;
            let err = m.predict(s) / actual - 1.0;
            if (20..400).contains(&step) {
                worst_drift = worst_drift.max(err.abs());
            }
            if step >= 400 {
                after[(step - 400) / 100] = after[(step - 400) / 100].max(err.abs());
            }
            m.observe(s, actual);
        }
        assert!(after.iter().all(|e| *e < 0.04), "after the drift: largest errors per 100 steps {after:?}");
        assert!(after[3] <= after[1] + 0.005, "the error grows after the drift stopped: {after:?}");
        assert!(worst_drift < 0.05, "during the drift predictions were off by up to {worst_drift:.4}");
    }

    #[test]
    fn unexcited_features_keep_their_prior() {
        let mut m = StepCostModel::new(truth());
        let mut s = StepShape::default();
        s.add_slice(50, 1);
        for _ in 0..64 {
            m.observe(&s, truth().predict(&s));
        }
        assert!((m.coeffs().per_prefill_token_s - truth().per_prefill_token_s).abs() < 1e-9);
        m.observe(&s, f64::NAN);
        assert!(m.predict(&s).is_finite());
    }

    #[test]
    fn ratio_quantile_tracks_how_far_steps_run_over_their_prediction() {
        let mut m = StepCostModel::new(truth());
        assert_eq!(m.ratio_quantile(0.75), 1.0, "no step measured yet");
        let mut s = StepShape::default();
        s.add_slice(50, 1);
        // Steps take 1.00, 1.01, ..., 1.99 times the prediction, in a scrambled order.
        for i in 0..100u32 {
            let k = (i * 37) % 100;
            m.observe(&s, truth().predict(&s) * (1.0 + f64::from(k) / 100.0));
            // Keep the coefficients at the truth and the speed at 1, so every ratio is the one fed.
            m.current = truth();
            m.log_speed = 0.0;
        }
        let q = m.ratio_quantile(0.75);
        assert!((q - 1.74).abs() < 0.011, "{q}");
        assert!((m.ratio_quantile(0.0) - 1.0).abs() < 1e-9);
    }
}
