//! How long admitted requests really waited for the feed limit against what smooth's door
//! predicted (on by default, `smooth:calibrate=0` turns it off; [`super::smooth::SmoothConfig::calibrate`]).
//! Its one user is [`super::smooth`].
//!
//! The door's start prediction is a model of the future (the running streams finish at their
//! expected ends, or by an exponential race of them; the queue ahead starts in order, thinned by
//! the patience clients have shown) and every such model is biased one way or the other by the
//! workload: the sorted expected ends are pessimistic with a full batch (the first of forty
//! streams ends well before the one expected first), the race is optimistic when answers are
//! less spread than an exponential. So the door learns its own bias, as the feed limit learns
//! the step-cost model's (`feed_quantile`): every admitted request predicted to wait is followed
//! until it starts, and the prediction is scaled by the latest starts' actual over predicted
//! waits (a ratio of sums, so the long waits, the ones that decide refusals, weigh most).
//!
//! A request that leaves the queue before it starts (its client gave up) counts the wait it had
//! so far: a lower bound, so the scale errs short when many leave, which is when the door should
//! be refusing anyway.

use std::collections::{HashMap, HashSet, VecDeque};

use super::SeqView;
use crate::plan::RequestId;

/// The door's start predictions against the starts that followed.
#[derive(Debug, Clone, Default)]
pub(super) struct WaitCalibration {
    /// Admitted requests predicted to wait: id -> (admitted at, predicted wait for the start).
    pending: HashMap<RequestId, (f64, f64)>,
    /// (predicted, actual) waits of the latest starts, oldest first.
    recent: VecDeque<(f64, f64)>,
    /// Sums over `recent`.
    predicted: f64,
    actual: f64,
    /// Engine time of the latest plan, when the requests missing from the queue now started.
    last_plan: Option<f64>,
    /// Scratch: the queue's ids.
    queued: HashSet<RequestId>,
    /// Predicted over actual waits of the starts since [`Self::drain_errors`] (at most
    /// [`Self::MAX_ERRORS`]; a start with no wait at all has no ratio and is left out).
    errors: Vec<f64>,
}

impl WaitCalibration {
    /// Starts the scale follows.
    pub(super) const SAMPLES: usize = 200;
    /// Starts seen before the scale moves from 1.
    pub(super) const MIN_SAMPLES: usize = 20;
    /// The most the scale corrects a prediction by, either way.
    const MAX_SCALE: f64 = 8.0;
    /// The most errors kept between two drains.
    const MAX_ERRORS: usize = 4096;

    /// `id` was admitted at `now`, predicted to start `wait` seconds later.
    pub(super) fn admitted(&mut self, id: RequestId, now: f64, wait: f64) {
        if wait > 0.0 {
            self.pending.insert(id, (now, wait));
        }
    }

    /// A plan at `now` with `waiting` queued: every followed request no longer there started
    /// (or left) at the previous plan.
    pub(super) fn observe(&mut self, now: f64, waiting: &[SeqView]) {
        let at = self.last_plan.replace(now).unwrap_or(now);
        if self.pending.is_empty() {
            return;
        }
        self.queued.clear();
        self.queued.extend(waiting.iter().map(|v| v.id));
        let queued = &self.queued;
        let mut done = Vec::new();
        self.pending.retain(|&id, &mut (since, wait)| {
            let gone = !queued.contains(&id);
            if gone {
                done.push((since, id, wait, (at - since).max(0.0)));
            }
            !gone
        });
        // In admission order, not the map's (which differs from one process to the next): the
        // window keeps the latest starts, and a run must be the same every time.
        done.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for (_, _, predicted, actual) in done {
            if actual > 0.0 && self.errors.len() < Self::MAX_ERRORS {
                self.errors.push(predicted / actual);
            }
            if self.recent.len() >= Self::SAMPLES {
                if let Some((p, a)) = self.recent.pop_front() {
                    self.predicted -= p;
                    self.actual -= a;
                }
            }
            self.recent.push_back((predicted, actual));
            self.predicted += predicted;
            self.actual += actual;
        }
    }

    /// Moves the errors gathered since the last call into `out`.
    pub(super) fn drain_errors(&mut self, out: &mut Vec<f64>) {
        out.append(&mut self.errors);
    }

    /// What the door's predicted waits are multiplied by: the latest starts' actual over
    /// predicted waits, 1 until [`Self::MIN_SAMPLES`] have started.
    pub(super) fn scale(&self) -> f64 {
        if self.recent.len() < Self::MIN_SAMPLES || self.predicted <= 0.0 {
            return 1.0;
        }
        (self.actual / self.predicted).clamp(1.0 / Self::MAX_SCALE, Self::MAX_SCALE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(ids: &[u64]) -> Vec<SeqView> {
        ids.iter().map(|&id| SeqView::waiting(id, 0.0, 8, 64)).collect()
    }

    /// A door that predicts waits half as long as they turn out learns to double them, and only
    /// once enough starts were seen; requests predicted to start at once are not followed.
    #[test]
    fn the_scale_is_actual_over_predicted_waits_of_the_latest_starts() {
        let mut cal = WaitCalibration::default();
        let mut t = 0.0;
        let mut seen = vec![];
        for id in 0..(WaitCalibration::MIN_SAMPLES as u64 + 5) {
            cal.admitted(id, t, 1.0);
            cal.admitted(1000 + id, t, 0.0);
            cal.observe(t, &queued(&[id]));
            // The plan 2 s later starts it; the next one no longer sees it queued.
            cal.observe(t + 2.0, &queued(&[id]));
            cal.observe(t + 2.1, &queued(&[]));
            seen.push(cal.scale());
            t += 3.0;
        }
        assert_eq!(seen[WaitCalibration::MIN_SAMPLES - 2], 1.0, "{seen:?}");
        assert!((seen.last().unwrap() - 2.0).abs() < 1e-9, "{seen:?}");
        // Predictions that become exact take over as the old starts leave the window.
        for id in 0..WaitCalibration::SAMPLES as u64 {
            cal.admitted(5000 + id, t, 1.0);
            cal.observe(t, &queued(&[5000 + id]));
            cal.observe(t + 1.0, &queued(&[5000 + id]));
            cal.observe(t + 1.05, &queued(&[]));
            t += 1.5;
        }
        assert!((cal.scale() - 1.0).abs() < 1e-9, "{}", cal.scale());
        assert!(cal.pending.is_empty());
    }

    /// Starts seen in one plan enter the window in admission order, not the map's (which
    /// differs from one map to the next), so the same run gives the same scale in every process:
    /// 300 requests that start together leave the same latest 200 behind however they were
    /// inserted.
    #[test]
    fn the_window_keeps_the_latest_admitted_whatever_the_map_order() {
        let scale = |ids: &mut dyn Iterator<Item = u64>| {
            let mut cal = WaitCalibration::default();
            for id in ids {
                // Admitted at 10 s + `id` ms, predicted to wait 1 + id % 7 s; all start at 12 s.
                cal.admitted(id, 10.0 + id as f64 * 1e-3, 1.0 + (id % 7) as f64);
            }
            let all: Vec<u64> = (0..300).collect();
            cal.observe(12.0, &queued(&all));
            cal.observe(12.5, &queued(&[]));
            let scale = cal.scale();
            assert!(scale > 1.0 / 8.0 && scale < 1.0, "{scale}");
            scale
        };
        let forward = scale(&mut (0..300));
        assert_eq!(scale(&mut (0..300).rev()), forward);
        assert_eq!(scale(&mut (0..300).map(|i| (i * 7) % 300)), forward);
    }
}
