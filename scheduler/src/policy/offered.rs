//! The work offered to the machine, for smooth's door (`smooth:sustained=1`, experimental): is an
//! overload sustained, or a burst the machine will clear? Its one user is [`super::smooth`];
//! docs/sim/cpu-smollm2/sustained and docs/bench/ab-cpu-smollm2 report what it does.
//!
//! The door refuses a request whose wait would cost more than a small margin only because, under
//! *sustained* overload, every admitted request displaces a later one: the machine stays full
//! for as long as the overload lasts. Under Poisson arrivals near saturation a queue also forms
//! in bursts that the machine then clears; a request refused there displaced nobody, and its
//! zero is simply lost (smooth trailed fcfs by about 4 points at 1x on the CPU server, refusing
//! 7-9%). So this asks whether the offered work exceeds what the machine can serve at its
//! readers' pace: over the latest [`Offered::SAMPLES`] arrivals (refused ones too: they are
//! demand), the machine seconds per second their expected outputs need, priced with the
//! step-cost model as it is now. It stays experimental: at exactly 1x the answer is a coin toss,
//! and without clients who leave a queue that forms at 1x does not drain by itself, so the
//! refusals it spares were worth making there (docs/sim/cpu-smollm2/sustained).

use std::collections::VecDeque;

use super::SeqView;
use crate::cost::{pairs, CostCoeffs};

/// One arrival's work, in the step-cost model's features (so that it is priced with the
/// coefficients learned by the time it is asked about).
#[derive(Debug, Clone, Copy)]
struct Arrival {
    at: f64,
    /// Expected output tokens.
    tokens: f64,
    /// Expected output tokens times their mean context.
    token_context: f64,
    /// Prompt tokens to prefill, and their query-key pairs.
    prefill: f64,
    prefill_pairs: f64,
    /// The delay it was predicted to pass on to a request arriving after it (seconds).
    delay: f64,
}

impl Arrival {
    fn of(v: &SeqView, tokens: f64, delay: f64) -> Self {
        let cached = v.prompt_len - v.uncached_prompt();
        Arrival {
            at: v.arrival,
            tokens,
            token_context: tokens * (v.prompt_len as f64 + tokens / 2.0),
            prefill: v.uncached_prompt() as f64,
            prefill_pairs: pairs(cached, v.uncached_prompt()),
            delay,
        }
    }

    /// Its machine seconds apart from the base.
    fn work(&self, c: &CostCoeffs) -> f64 {
        c.per_decode_seq_s * self.tokens
            + c.per_kv_token_s * self.token_context
            + c.per_prefill_token_s * self.prefill
            + c.per_attn_pair_s * self.prefill_pairs
    }
}

/// The offered work over the latest arrivals.
#[derive(Debug, Clone, Default)]
pub(super) struct Offered {
    recent: VecDeque<Arrival>,
}

impl Offered {
    /// Arrivals the estimate spans. The rate of `n` Poisson arrivals is known to about
    /// `1 / sqrt(n)`: 400 puts the estimate within 5% (one standard deviation), so a load 10%
    /// under saturation is not taken for sustained overload by chance, while a step up to 1.5x
    /// crosses 1 within a few dozen arrivals.
    pub(super) const SAMPLES: usize = 400;

    /// Records `v`'s arrival, expected to produce `tokens` output tokens and predicted to delay
    /// a request arriving after it by `delay` seconds.
    pub(super) fn record(&mut self, v: &SeqView, tokens: f64, delay: f64) {
        if self.recent.len() >= Self::SAMPLES {
            self.recent.pop_front();
        }
        self.recent.push_back(Arrival::of(v, tokens, delay));
    }

    /// The time the window spans (from its oldest arrival to its latest), when it spans any.
    fn span(&self) -> Option<f64> {
        let span = self.recent.back()?.at - self.recent.front()?.at;
        (span > 0.0).then_some(span)
    }

    /// Machine seconds per second of the work that arrived over the window, apart from the
    /// per-step base cost (the arrivals after the oldest, over the time since it); `None` until
    /// two arrivals span some time.
    pub(super) fn rate(&self, c: &CostCoeffs) -> Option<f64> {
        let span = self.span()?;
        Some(self.recent.iter().skip(1).map(|a| a.work(c)).sum::<f64>() / span)
    }

    /// Is the offered work more than the feed limit can serve? Streams kept at their readers'
    /// pace `q` pay a step's base cost `q` times a second; the feed limit lets the streams take
    /// `cap` of the machine at that pace, and the machine steps as fast as it can, so a running
    /// set that uses `u <= cap` at the readers' pace runs `1 / u` times faster than they read and
    /// finishes sooner. In a steady state the running set needs `q * base / (1 - w)` of the
    /// machine at the readers' pace, `w` the offered work apart from the base: the load is
    /// sustainable while that fits `cap`, that is while `w <= 1 - q * base / cap`.
    pub(super) fn sustained_overload(&self, c: &CostCoeffs, q: f64, cap: f64) -> bool {
        let Some(w) = self.rate(c) else { return false };
        w > 1.0 - q * c.base_s / cap
    }

    /// The wait that admitting a request (to start `wait` seconds from now) adds to the
    /// requests that arrive after it, summed over them: seconds of added wait
    /// (`smooth:externality=1`, experimental; [`super::smooth::SmoothConfig::externality`]).
    ///
    /// A fluid queue: each request holds the head of the queue for the mean delay the latest
    /// arrivals were predicted to pass on (one finish's worth; a single request's own delay is
    /// lumpy: zero where one finish frees room for two), so the requests arriving meanwhile
    /// each start that much later. The load `rho` is the arrival rate times that delay; under 1
    /// the backlog up to the place the request takes (`wait + delay`) drains at `1 - rho`, so
    /// `lambda * (wait + delay) / (1 - rho)` requests arrive before it clears: the M/G/1
    /// externality, which grows without bound as `rho` nears 1. At or over 1 nothing drains,
    /// and the count is taken over the time the window spans (as far ahead as the rate is known
    /// back). Zero until the window spans some time.
    pub(super) fn added_wait(&self, wait: f64) -> f64 {
        let Some(span) = self.span() else { return 0.0 };
        let arrivals = (self.recent.len() - 1) as f64;
        let lambda = arrivals / span;
        let delay = self.recent.iter().skip(1).map(|a| a.delay.max(0.0)).sum::<f64>() / arrivals;
        let rho = lambda * delay;
        let clear = if rho < 1.0 { ((wait.max(0.0) + delay) / (1.0 - rho)).min(span) } else { span };
        lambda * clear * delay
    }

}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(at: f64) -> SeqView {
        SeqView::waiting(0, at, 100, 200)
    }

    /// A full window of arrivals at `rate` a second, each of 100 tokens passing on `delay`.
    fn arrivals(rate: f64, delay: f64) -> Offered {
        let mut o = Offered::default();
        for i in 0..Offered::SAMPLES {
            o.record(&req(i as f64 / rate), 100.0, delay);
        }
        o
    }

    #[test]
    fn sustained_overload_follows_the_offered_rate_against_the_machine() {
        // 10 ms per output token, no base: a request of 100 tokens is 1 s of machine time.
        let c = CostCoeffs { base_s: 0.0, per_prefill_token_s: 0.0, per_decode_seq_s: 0.01, per_kv_token_s: 0.0, per_attn_pair_s: 0.0 };
        let at = |rate: f64| arrivals(rate, 0.0);
        assert!(Offered::default().rate(&c).is_none());
        let half = at(0.5);
        assert!((half.rate(&c).unwrap() - 0.5).abs() < 1e-9);
        assert!(!half.sustained_overload(&c, 5.0, 1.0));
        assert!(at(1.2).sustained_overload(&c, 5.0, 1.0));
        // The base cost of stepping at the readers' pace takes its share: 0.9 of the machine is
        // offered, 5 steps a second at 30 ms take 0.15 of it.
        let with_base = CostCoeffs { base_s: 0.03, ..c };
        assert!(!at(0.9).sustained_overload(&c, 5.0, 1.0));
        assert!(at(0.9).sustained_overload(&with_base, 5.0, 1.0));
        // Only the latest arrivals count: a burst long over is forgotten.
        let mut o = at(2.0);
        let t0 = (Offered::SAMPLES as f64 - 1.0) / 2.0;
        for i in 1..=Offered::SAMPLES {
            o.record(&req(t0 + i as f64 / 0.5), 100.0, 0.0);
        }
        assert!(!o.sustained_overload(&c, 5.0, 1.0));
    }

    /// The wait a newcomer adds to later arrivals: nothing before the window spans any time,
    /// then more the nearer the load (arrivals times the mean delay each passes on) is to 1,
    /// and over it the arrivals over the whole window each wait that delay longer.
    #[test]
    fn the_added_wait_grows_without_bound_as_the_load_nears_one() {
        let added = |o: &Offered| o.added_wait(2.0);
        assert_eq!(added(&Offered::default()), 0.0);
        // Arrivals at `rate` a second, each passing on a second.
        let at = |rate: f64| arrivals(rate, 1.0);
        // At half load: 0.5 arrivals a second over (2 + 1) / 0.5 s, each a second later.
        assert!((added(&at(0.5)) - 3.0).abs() < 1e-6, "{}", added(&at(0.5)));
        let loads = [0.5, 0.8, 0.9, 0.95];
        assert!(loads.windows(2).all(|w| added(&at(w[0])) < added(&at(w[1]))));
        // Over 1: every arrival over the window's 399 / 1.5 s, each a second later.
        assert!((added(&at(1.5)) - 399.0).abs() < 1e-6, "{}", added(&at(1.5)));
        // Where the latest arrivals took nobody's place, nor does this one.
        assert_eq!(arrivals(1.0, 0.0).added_wait(2.0), 0.0);
    }
}
