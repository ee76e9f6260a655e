//! Client patience learned online: how long a client waits, idle, before it goes away.
//!
//! A client that leaves (the connection closes before its answer ends) does so at some idle
//! latency `l` (metrics.md: its largest lateness so far): an observed patience `P = l`. A request
//! that ended any other way only says that its client's patience was longer than the idle latency
//! it reached: a censored `P > l`. [`PatienceModel`] keeps the last [`PatienceModel::WINDOW`] of
//! both and fits a Kaplan-Meier survival curve `S(x) = P(P > x)` from them.
//!
//! Why the scheduler needs it: a request queued behind others only waits for those of them that
//! are still there when their turn comes. With clients who give up after tens of seconds, a long
//! queue is mostly clients who will leave before they start, and a prediction that counts every
//! one of them in full predicts a wait several times the real one (smooth's door refused closed
//! loops it could have served for that reason). With [`PatienceModel::stays`], a queued request
//! that would start at idle latency `x` counts with the probability `S(x) / S(x_now)` that its
//! client is still there then.
//!
//! Nothing is assumed before a client has left: `S = 1` (everyone waits), which is the prediction
//! the scheduler made before it learned patience. Beyond the longest idle latency observed the
//! curve stays at its last value (no extrapolation of a tail that was never seen).

use std::collections::VecDeque;

/// Idle latencies at which clients left or stayed, and the survival curve fitted from them.
#[derive(Debug, Clone, Default)]
pub struct PatienceModel {
    /// (idle latency seconds, censored), oldest first.
    samples: VecDeque<(f64, bool)>,
    /// Distinct idle latencies at which someone left, ascending, with `surv[i] = S(x)` for `x` in
    /// `[times[i], times[i + 1])`; `S(x) = 1` below `times[0]`.
    times: Vec<f64>,
    surv: Vec<f64>,
    dirty: bool,
    left: u64,
}

impl PatienceModel {
    /// Requests remembered: older ones are forgotten, so the curve follows clients that change.
    pub const WINDOW: usize = 1024;

    /// A client left at idle latency `idle` (seconds).
    pub fn left(&mut self, idle: f64) {
        self.push(idle, false);
        self.left += 1;
    }

    /// A request ended without its client leaving, at idle latency `idle`.
    pub fn stayed(&mut self, idle: f64) {
        self.push(idle, true);
    }

    fn push(&mut self, idle: f64, censored: bool) {
        if !idle.is_finite() {
            return;
        }
        if self.samples.len() >= Self::WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back((idle.max(0.0), censored));
        self.dirty = true;
    }

    /// Clients seen leaving so far.
    pub fn observed_leaving(&self) -> u64 {
        self.left
    }

    /// Refit if anything was observed since the last fit: `O(window log window)`.
    pub fn refresh(&mut self) {
        if !self.dirty {
            return;
        }
        self.dirty = false;
        self.times.clear();
        self.surv.clear();
        let mut all: Vec<(f64, bool)> = self.samples.iter().copied().collect();
        // Departures before censorings at the same idle latency (a censored `x` means `P > x`).
        all.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let total = all.len();
        let mut s = 1.0_f64;
        let mut i = 0;
        while i < total {
            let x = all[i].0;
            let mut d = 0;
            let mut j = i;
            while j < total && all[j].0 == x {
                d += usize::from(!all[j].1);
                j += 1;
            }
            if d > 0 {
                s *= 1.0 - d as f64 / (total - i) as f64;
                self.times.push(x);
                self.surv.push(s);
            }
            i = j;
        }
    }

    /// `S(x)`: the share of clients still waiting at idle latency `x`.
    pub fn survival(&self, x: f64) -> f64 {
        let i = self.times.partition_point(|&t| t <= x);
        if i == 0 {
            1.0
        } else {
            self.surv[i - 1]
        }
    }

    /// The probability that a client idle for `now_idle` seconds is still there at `then_idle`.
    pub fn stays(&self, now_idle: f64, then_idle: f64) -> f64 {
        if then_idle <= now_idle {
            return 1.0;
        }
        let s_now = self.survival(now_idle);
        if s_now <= 0.0 {
            // Past everyone observed: nothing says when it leaves, so assume it stays.
            return 1.0;
        }
        (self.survival(then_idle) / s_now).clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn nothing_observed_means_everyone_waits() {
        let mut m = PatienceModel::default();
        m.refresh();
        assert_eq!(m.survival(100.0), 1.0);
        // Requests served without anyone leaving say patience is long, not short.
        for _ in 0..50 {
            m.stayed(3.0);
        }
        m.refresh();
        assert_eq!(m.stays(0.0, 1000.0), 1.0);
        assert_eq!(m.observed_leaving(), 0);
    }

    /// Exponential patience with mean 20 s, observed the way a server sees it: most requests are
    /// served at a small idle latency (censored), the others leave while they wait.
    #[test]
    fn censored_departures_recover_exponential_patience() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut m = PatienceModel::default();
        for _ in 0..PatienceModel::WINDOW {
            let patience = -20.0 * (1.0 - rng.random::<f64>()).ln();
            let wait = rng.random_range(0.0..40.0);
            if patience < wait {
                m.left(patience);
            } else {
                m.stayed(wait);
            }
        }
        m.refresh();
        for x in [5.0, 10.0, 20.0] {
            let truth = (-x / 20.0_f64).exp();
            assert!((m.survival(x) - truth).abs() < 0.06, "S({x}) = {} against {truth}", m.survival(x));
        }
        // Memoryless: a client who waited 10 s stays another 10 s with probability e^-0.5.
        let p = m.stays(10.0, 20.0);
        assert!((p - (-0.5_f64).exp()).abs() < 0.08, "{p}");
        // Counting the censored requests as departures would put S(10) near 0.4, not 0.61.
        let naive = 1.0 - m.samples.iter().filter(|s| s.0 <= 10.0).count() as f64 / m.samples.len() as f64;
        assert!(naive < 0.8 && (m.survival(10.0) - naive).abs() > 0.1, "naive {naive}");
    }

    #[test]
    fn the_window_forgets_old_clients() {
        let mut m = PatienceModel::default();
        for _ in 0..PatienceModel::WINDOW {
            m.left(1.0);
        }
        m.refresh();
        assert_eq!(m.survival(2.0), 0.0);
        for _ in 0..PatienceModel::WINDOW {
            m.stayed(60.0);
        }
        m.refresh();
        assert_eq!(m.survival(2.0), 1.0);
        m.left(f64::NAN);
        m.refresh();
        assert_eq!(m.survival(2.0), 1.0, "a non-finite idle latency is ignored");
    }
}
