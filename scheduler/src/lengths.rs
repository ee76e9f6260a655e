//! Output lengths learned online, so that no policy takes `max_tokens` for the output length.
//!
//! Real clients send a `max_tokens` far above what the model says (or none, and the server's
//! default is the model's whole room), so the only honest length estimate is the one the server
//! learns from the requests it finished. [`LengthModel`] keeps, per `max_tokens` bucket, the
//! output lengths of the last [`LengthPrior::window`] finished requests and fits a Kaplan-Meier
//! survival curve `S(j) = P(N > j)` of the natural length `N` (the output length at which the
//! model would stop by itself):
//!
//! - a request that sampled a stop token (or matched a stop string) after `n` tokens is an
//!   observed length `N = n`;
//! - a request cut at `n` tokens (by `max_tokens`, by the client leaving, by a drop) is
//!   *censored*: all that is known is `N > n`. Counting it as `N = n` would pull the estimate
//!   down by exactly the requests that run longest.
//!
//! From the curve:
//! - a newcomer with `M` output tokens of room is expected to produce
//!   `E[min(N, M)] = sum_{j<M} S(j)` tokens;
//! - a stream that has produced `k` tokens is expected to produce
//!   `E[min(N, M) - k | N > k] = sum_{k<=j<M} S(j) / S(k)` more.
//!
//! Beyond the longest length seen, the curve goes on with a constant hazard (the censored
//! exponential's rate, events over exposure), so a long `max_tokens` adds what the observed tail
//! says it should and no more.
//!
//! Before anything finished, a prior stands in: [`LengthPrior::weight`] pseudo-observations at
//! the quantiles of a geometric distribution with mean [`LengthPrior::mean`]. They stay in the
//! fit, so a few real samples move the estimate but do not swing it; once the window is full they
//! weigh `weight / (window + weight)` (8 in 1032 by default).
//!
//! A bucket is `max_tokens` rounded up to a power of two: a client that asks for 16 tokens is
//! doing another task than one that asks for 2048. A bucket with fewer than
//! [`MIN_BUCKET_SAMPLES`] real samples uses the curve of all requests (censoring keeps the pooled
//! fit unbiased as long as `max_tokens` does not depend on the answer's length).

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// A bucket answers alone once it holds this many real samples.
pub const MIN_BUCKET_SAMPLES: usize = 32;
/// Buckets: `max_tokens` up to 2^0, 2^1, ..., 2^(BUCKETS-1) and above.
const BUCKETS: usize = 24;

/// Where the length model starts and how much it remembers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LengthPrior {
    /// Mean output length assumed before anything finished, tokens.
    pub mean: f64,
    /// Pseudo-observations the prior counts as.
    pub weight: usize,
    /// Finished requests remembered per bucket (older ones are forgotten, so the estimate
    /// follows a workload that changes).
    pub window: usize,
}

impl Default for LengthPrior {
    fn default() -> Self {
        Self { mean: 256.0, weight: 8, window: 1024 }
    }
}

/// The fitted survival curve of one sample set.
#[derive(Debug, Clone, Default)]
struct Curve {
    /// Distinct event lengths, ascending, with `surv[i] = S(t)` for `t` in
    /// `[times[i], times[i + 1])`; `S(t) = 1` below `times[0]`.
    times: Vec<u32>,
    surv: Vec<f64>,
    /// `area[i] = sum_{j < times[i]} S(j)`.
    area: Vec<f64>,
    /// Longest length seen (event or censored): the curve is exact up to here.
    last: u32,
    /// Per-token stop probability beyond `last`.
    tail_hazard: f64,
    /// Real (not prior) samples in the fit.
    real: usize,
}

impl Curve {
    fn fit(samples: &mut [(u32, bool)], prior_hazard: f64) -> Self {
        // Events before censorings at the same length (a censored `n` means `N > n`).
        samples.sort_unstable_by_key(|&(n, censored)| (n, censored));
        let mut c = Curve { last: samples.last().map_or(0, |s| s.0), ..Default::default() };
        let total = samples.len();
        let (mut s, mut area, mut prev) = (1.0_f64, 0.0_f64, 0_u32);
        let (mut events, mut exposure) = (0_usize, 0.0_f64);
        let mut i = 0;
        while i < total {
            let t = samples[i].0;
            let at_risk = total - i;
            let mut d = 0;
            let mut j = i;
            while j < total && samples[j].0 == t {
                d += usize::from(!samples[j].1);
                exposure += f64::from(samples[j].0);
                j += 1;
            }
            if d > 0 {
                area += s * f64::from(t - prev);
                prev = t;
                s *= 1.0 - d as f64 / at_risk as f64;
                c.times.push(t);
                c.surv.push(s);
                c.area.push(area);
                events += d;
            }
            i = j;
        }
        c.tail_hazard = if events > 0 && exposure > 0.0 { (events as f64 / exposure).min(1.0) } else { prior_hazard };
        c
    }

    /// `S(j)`.
    fn survival(&self, j: u32) -> f64 {
        let i = self.times.partition_point(|&t| t <= j);
        let s = if i == 0 { 1.0 } else { self.surv[i - 1] };
        if j > self.last {
            s * (1.0 - self.tail_hazard).powf(f64::from(j - self.last))
        } else {
            s
        }
    }

    /// `sum_{j < x} S(j)`.
    fn area_below(&self, x: u32) -> f64 {
        let exact = |x: u32| {
            let i = self.times.partition_point(|&t| t <= x);
            if i == 0 {
                f64::from(x)
            } else {
                self.area[i - 1] + self.surv[i - 1] * f64::from(x - self.times[i - 1])
            }
        };
        if x <= self.last.saturating_add(1) {
            return exact(x);
        }
        // Beyond the data: S(last) * r^(j - last) for j > last, a geometric sum.
        let base = exact(self.last.saturating_add(1));
        let s_last = self.survival(self.last);
        let r = 1.0 - self.tail_hazard;
        let k = f64::from(x - self.last - 1);
        let tail = if self.tail_hazard <= 0.0 { k } else { r * (1.0 - r.powf(k)) / self.tail_hazard };
        base + s_last * tail
    }
}

#[derive(Debug, Clone, Default)]
struct Bucket {
    samples: VecDeque<(u32, bool)>,
    curve: Curve,
    /// Samples changed since `curve` was fitted.
    dirty: bool,
}

impl Bucket {
    fn push(&mut self, n: u32, censored: bool, window: usize) {
        if self.samples.len() >= window.max(1) {
            self.samples.pop_front();
        }
        self.samples.push_back((n, censored));
        self.dirty = true;
    }

    fn refit(&mut self, prior: &[(u32, bool)], prior_hazard: f64) {
        let mut all: Vec<(u32, bool)> = self.samples.iter().copied().chain(prior.iter().copied()).collect();
        self.curve = Curve::fit(&mut all, prior_hazard);
        self.curve.real = self.samples.len();
        self.dirty = false;
    }
}

/// Output lengths of finished requests, per `max_tokens` bucket (see the module docs).
///
/// [`Self::observe`] records; [`Self::refresh`] refits what changed (the scheduler calls it once
/// per step, so a step's queries see every request finished before it); the queries read the
/// last fit.
#[derive(Debug, Clone)]
pub struct LengthModel {
    cfg: LengthPrior,
    prior: Vec<(u32, bool)>,
    buckets: Vec<Bucket>,
    pooled: Bucket,
    observed: u64,
}

fn bucket_of(max_output: usize) -> usize {
    (usize::BITS - max_output.saturating_sub(1).leading_zeros()).min(BUCKETS as u32 - 1) as usize
}

impl LengthModel {
    /// A model that starts from `prior`.
    pub fn new(prior: LengthPrior) -> Self {
        let mean = prior.mean.max(1.0);
        // Geometric on 1, 2, ... with mean `mean`: P(N > j) = (1 - 1/mean)^j; its quantiles.
        let p = 1.0 / mean;
        let pts = (0..prior.weight)
            .map(|i| {
                let u = (i as f64 + 0.5) / prior.weight as f64;
                let n = if p >= 1.0 { 1.0 } else { ((1.0 - u).ln() / (1.0 - p).ln()).ceil() };
                (n.clamp(1.0, f64::from(u32::MAX)) as u32, false)
            })
            .collect();
        let mut m = Self { cfg: prior, prior: pts, buckets: vec![Bucket::default(); BUCKETS], pooled: Bucket::default(), observed: 0 };
        m.pooled.refit(&m.prior, 1.0 / mean);
        m
    }

    /// The prior it started from.
    pub fn prior(&self) -> LengthPrior {
        self.cfg
    }

    /// Requests observed so far.
    pub fn observed(&self) -> u64 {
        self.observed
    }

    /// A request with room for `max_output` tokens ended after `n` tokens; `censored` when it
    /// did not stop by itself (cut by its length limit, the client, or a drop). A request with no
    /// output says nothing and is ignored.
    pub fn observe(&mut self, max_output: usize, n: usize, censored: bool) {
        if n == 0 {
            return;
        }
        let n = n.min(u32::MAX as usize) as u32;
        let w = self.cfg.window;
        self.buckets[bucket_of(max_output)].push(n, censored, w);
        self.pooled.push(n, censored, w);
        self.observed += 1;
    }

    /// Refit every curve whose samples changed: `O(window log window)` each.
    pub fn refresh(&mut self) {
        let hazard = 1.0 / self.cfg.mean.max(1.0);
        for b in self.buckets.iter_mut().chain(std::iter::once(&mut self.pooled)) {
            if b.dirty {
                b.refit(&self.prior, hazard);
            }
        }
    }

    fn curve(&self, max_output: usize) -> &Curve {
        let b = &self.buckets[bucket_of(max_output)];
        if b.curve.real >= MIN_BUCKET_SAMPLES {
            &b.curve
        } else {
            &self.pooled.curve
        }
    }

    /// `E[min(N, max_output)]`: the output a new request is expected to produce.
    pub fn expected_total(&self, max_output: usize) -> f64 {
        let m = max_output.min(u32::MAX as usize) as u32;
        self.curve(max_output).area_below(m)
    }

    /// `E[min(N, max_output) - k | N > k]`: what a stream that produced `k` tokens is expected
    /// to produce still (at least 1 while `k < max_output`, 0 after).
    pub fn expected_remaining(&self, k: usize, max_output: usize) -> f64 {
        if k >= max_output {
            return 0.0;
        }
        let (k32, m) = (k.min(u32::MAX as usize) as u32, max_output.min(u32::MAX as usize) as u32);
        let c = self.curve(max_output);
        let s = c.survival(k32);
        if s <= 1e-12 {
            // Longer than anything that finished: the tail's expectation.
            return (1.0 / c.tail_hazard.max(1e-9)).clamp(1.0, f64::from(m - k32));
        }
        let rest = c.area_below(m) - c.area_below(k32);
        (rest / s).clamp(1.0, f64::from(m - k32))
    }
}

impl Default for LengthModel {
    fn default() -> Self {
        Self::new(LengthPrior::default())
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    fn model(weight: usize) -> LengthModel {
        LengthModel::new(LengthPrior { mean: 100.0, weight, window: 100_000 })
    }

    fn observe_all(m: &mut LengthModel, samples: impl IntoIterator<Item = (usize, usize, bool)>) {
        for (max, n, censored) in samples {
            m.observe(max, n, censored);
        }
        m.refresh();
    }

    #[test]
    fn the_prior_alone_gives_its_mean() {
        let m = model(64);
        // A geometric with mean 100, capped at 10_000 tokens: E = 100 within the quantiles' error.
        let e = m.expected_total(10_000);
        assert!((e - 100.0).abs() < 8.0, "{e}");
        // A cap far below the mean binds.
        assert!((m.expected_total(5) - 5.0).abs() < 0.5, "{}", m.expected_total(5));
    }

    #[test]
    fn observed_lengths_without_censoring_give_their_mean() {
        let mut m = model(0);
        // Fitted only on refresh: until then the prior answers (with no pseudo-observations,
        // its geometric tail alone: mean 100).
        m.observe(1000, 10, false);
        assert!((m.expected_total(1000) - 100.0).abs() < 1.0, "{}", m.expected_total(1000));
        observe_all(&mut m, [20, 30, 40].map(|n| (1000, n, false)));
        // KM without censoring is the empirical distribution: E[min(N, M)] is the mean.
        assert!((m.expected_total(1000) - 25.0).abs() < 1e-9, "{}", m.expected_total(1000));
        // Capped at 15: min(N, 15) = 10, 15, 15, 15.
        assert!((m.expected_total(15) - 13.75).abs() < 1e-9);
        // Having produced 25 tokens: N is 30 or 40, 10 more on average.
        assert!((m.expected_remaining(25, 1000) - 10.0).abs() < 1e-9, "{}", m.expected_remaining(25, 1000));
        assert_eq!(m.expected_remaining(1000, 1000), 0.0);
    }

    /// The censored fit recovers the natural lengths where counting cut requests as finished
    /// would not: exponential lengths with mean 200, every request capped at 150 tokens.
    #[test]
    fn censoring_is_not_mistaken_for_stopping() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut m = model(0);
        let (mut naive, mut count) = (0.0, 0.0);
        for _ in 0..5000 {
            let n = (-200.0 * (1.0 - rng.random::<f64>()).ln()).ceil().max(1.0) as usize;
            let (seen, censored) = if n > 150 { (150, true) } else { (n, false) };
            m.observe(150, seen, censored);
            naive += seen as f64;
            count += 1.0;
        }
        m.refresh();
        // The truth: E[min(N, 150)] = sum_{j<150} (1 - 1/200)^j ~ 105.9; the tail beyond the cap
        // must follow the fitted hazard: E[min(N, 400)] = 200 (1 - e^-2) ~ 172.9.
        let capped = m.expected_total(150);
        assert!((capped - 105.9).abs() < 3.0, "{capped}");
        let long = m.expected_total(400);
        assert!((long - 172.9).abs() < 8.0, "{long} vs the naive mean {}", naive / count);
        assert!(naive / count < 110.0, "the naive mean cannot see past the cap");
        // Memoryless: a stream at 100 tokens with room for 1000 has about 200 to go.
        let rest = m.expected_remaining(100, 1000);
        assert!((rest - 199.0).abs() < 15.0, "{rest}");
    }

    #[test]
    fn buckets_answer_alone_once_they_have_enough_samples() {
        let mut m = model(0);
        observe_all(&mut m, (0..MIN_BUCKET_SAMPLES).flat_map(|_| [(16, 4, false), (2048, 300, false)]));
        assert!((m.expected_total(16) - 4.0).abs() < 1e-9, "{}", m.expected_total(16));
        assert!((m.expected_total(2048) - 300.0).abs() < 1e-9, "{}", m.expected_total(2048));
        // A bucket with no samples of its own uses every request: half 4, half 300, capped at 100.
        assert!((m.expected_total(100) - 52.0).abs() < 1e-9, "{}", m.expected_total(100));
    }

    #[test]
    fn the_window_forgets_an_old_workload() {
        let mut m = LengthModel::new(LengthPrior { mean: 100.0, weight: 0, window: 50 });
        observe_all(&mut m, (0..50).map(|_| (1000, 500, false)));
        assert!((m.expected_total(1000) - 500.0).abs() < 1e-9);
        observe_all(&mut m, (0..50).map(|_| (1000, 20, false)));
        assert!((m.expected_total(1000) - 20.0).abs() < 1e-9);
    }

    #[test]
    fn uninformative_observations_are_ignored() {
        let mut m = model(4);
        let before = m.expected_total(1000);
        observe_all(&mut m, [(1000, 0, true)]);
        assert_eq!(m.observed(), 0);
        assert_eq!(m.expected_total(1000), before);
    }
}
