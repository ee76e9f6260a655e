//! Experimental feedback on smooth's feed limit (`smooth:feed_target=T`, off by default): the
//! limit's share of the machine scaled by what the running streams measurably got against what
//! their readers read. Its one user is [`super::smooth`]; docs/sim/cpu-smollm2/feed-target and
//! docs/bench/ab-cpu-smollm2/feed-target-2x report what it does.

use super::PolicyContext;

/// Feedback for the feed limit (experimental, [`super::SmoothConfig::feed_target`]): did the
/// running streams get their tokens at their readers' pace? The limit prices each stream's share of the
/// machine with the step-cost model and keeps a margin for steps that run slower than predicted
/// (`feed_quantile`); both are predictions, and on a machine whose step times scatter widely
/// (this project's 2-core CPU: measured over predicted p90 about 1.15) served TPOT p50 sat at
/// 0.85-0.9 of the reading interval while the door refused a third of the requests. So the limit
/// can also be scaled by what the streams measurably got: over the last few seconds, the tokens
/// delivered to the streams that were decoding against the tokens their readers read in that
/// time (`q * dt` each). Below `feed_target` the scale shrinks; above it, and only while the
/// limit is what keeps requests out, in the queue or at the door (otherwise a light load, whose
/// streams run fast by themselves, would wind it up), it grows. Its time constant
/// ([`Self::SETTLE_S`]) is several measurement windows, so a change has shown in the streams'
/// pace before the next one builds on it.
#[derive(Debug, Clone)]
pub(super) struct FeedControl {
    /// The decode-ready streams at the last plan: (id, output tokens, reading rate), by id.
    prev: Vec<(u64, usize, f64)>,
    /// Engine time of the last plan.
    prev_now: f64,
    /// Exponentially fading sums ([`Self::MEASURE_S`]): tokens their readers read, tokens the
    /// streams got.
    read: f64,
    got: f64,
    /// The scale's logarithm.
    log_scale: f64,
    /// At the last plan: a request was waiting; the feed limit's share of the machine is what
    /// kept one out.
    pub(super) queued: bool,
    pub(super) held: bool,
    /// Since the last plan, the door refused a request because the feed limit would have kept
    /// it waiting: under overload the door holds the queue near empty, and the limit then keeps
    /// requests out at the door rather than in the queue.
    pub(super) refused: bool,
}

impl Default for FeedControl {
    fn default() -> Self {
        Self { prev: Vec::new(), prev_now: f64::NEG_INFINITY, read: 0.0, got: 0.0, log_scale: 0.0, queued: false, held: false, refused: false }
    }
}

impl FeedControl {
    /// Memory of the measurement, seconds.
    const MEASURE_S: f64 = 3.0;
    /// Time constant of the scale, seconds.
    const SETTLE_S: f64 = 10.0;
    /// Fewest tokens read in the measurement before it is trusted.
    const MIN_READ: f64 = 50.0;
    /// Bounds of the scale.
    const MAX_LOG: f64 = std::f64::consts::LN_2;

    pub(super) fn scale(&self) -> f64 {
        self.log_scale.exp()
    }

    /// Measures what the streams decoding since the last plan got, then moves the scale
    /// towards `target` (delivered over read) for the `dt` since that plan: down while anyone
    /// waited or was refused for the wait, up only while the limit's time share was what kept
    /// a request waiting (in the queue or at the door). With nobody waiting the limit decides
    /// nothing, and the scale is left where it is.
    pub(super) fn observe(&mut self, ctx: &PolicyContext<'_>, target: f64) {
        let dt = ctx.now - self.prev_now;
        if dt.is_finite() && dt > 0.0 {
            let (mut read, mut got) = (0.0, 0.0);
            for v in ctx.running {
                if let Ok(i) = self.prev.binary_search_by_key(&v.id, |p| p.0) {
                    let (_, out, q) = self.prev[i];
                    read += q * dt;
                    got += v.num_output.saturating_sub(out) as f64;
                }
            }
            let fade = (-dt / Self::MEASURE_S).exp();
            self.read = self.read * fade + read;
            self.got = self.got * fade + got;
            if self.read >= Self::MIN_READ && target > 0.0 {
                let err = (self.got / self.read / target).ln().clamp(-0.5, 0.2);
                if self.held || self.refused || (err < 0.0 && self.queued) {
                    let step = (dt / Self::SETTLE_S).min(1.0) * err;
                    self.log_scale = (self.log_scale + step).clamp(-Self::MAX_LOG, Self::MAX_LOG);
                }
            }
        }
        self.prev_now = ctx.now;
        self.refused = false;
        self.prev.clear();
        self.prev.extend(ctx.running.iter().filter(|v| v.uncomputed() == 1 && v.num_output > 0).map(|v| (v.id, v.num_output, v.class.reading_rate)));
        self.prev.sort_unstable_by_key(|p| p.0);
    }
}
