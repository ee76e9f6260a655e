//! Latency, SLO and goodput math: `docs/metrics.md`, implemented once.
//!
//! The server's live gauges, the benchmark client and the simulator all call this module, so a
//! gauge on Grafana and a line in a benchmark report are the same formula applied to different
//! timestamps (server delivery times, client read times, or virtual times).
//!
//! The unit of input is a [`RequestRecord`]: arrival time, one delivery time per output token
//! (several tokens may share a time), how the request ended and when, and its reading-rate
//! class. Per-request quantities are methods on it; [`WindowStats::compute`] aggregates a window.
//!
//! Definitions (metrics.md): deadline of token `i` (1-based) is `d_i = a + g + i / q`;
//! lateness `t_i - d_i`; user idle latency `l = max(0, max_i (t_i - d_i))`; benefit
//! `b = n - alpha * f(l)`; smooth goodput `= sum b / window`.
//!
//! One reading of metrics.md is ours: a request that ended without completing (dropped,
//! aborted, failed) "contributes its idle latency so far". We count, besides its delivered
//! tokens, the wait for the token it never received: `end - d_{n+1}` when positive. Without that
//! term a request dropped before its first token would score exactly as well as one rejected at
//! the door, and dropping a stalled stream would erase its current stall.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How a user consumes a stream: reading rate and first-token grace (metrics.md `q`, `g`), and
/// how much the request counts against others (its weight `w`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SloClass {
    /// Information consumption rate `q`, tokens per second.
    pub reading_rate: f64,
    /// First-token grace `g`, seconds.
    pub grace: f64,
    /// Weight `w` of the request's benefit, `w * (n - alpha * f(l))` (metrics.md): 1 unless
    /// the client asked for a priority (the API's `priority` `p`, vLLM's meaning, lower first,
    /// is `w = 2^-p`).
    #[serde(default = "unit_weight")]
    pub weight: f64,
}

fn unit_weight() -> f64 {
    1.0
}

impl Default for SloClass {
    fn default() -> Self {
        Self::new(5.0, 0.0)
    }
}

impl SloClass {
    /// A class of weight 1.
    pub fn new(reading_rate: f64, grace: f64) -> Self {
        Self { reading_rate, grace, weight: 1.0 }
    }

    /// The weight of vLLM's `priority` `p` (lower is served first): `2^-p`.
    pub fn priority_weight(priority: i64) -> f64 {
        2f64.powi(-(priority.clamp(-1000, 1000) as i32))
    }

    /// Deadline of output token `i` (1-based) for a request that arrived at `arrival`.
    pub fn deadline(&self, arrival: f64, i: usize) -> f64 {
        arrival + self.grace + i as f64 / self.reading_rate
    }
}

/// Penalty function `f` of idle seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Penalty {
    /// `f(l) = l`.
    Linear,
    /// `f(l) = min(l / L, 1)`: the benefit lost saturates after `L` seconds.
    Capped(f64),
    /// `f(l) = l^2`.
    Quadratic,
}

impl Penalty {
    /// `f(l)` for idle seconds `l >= 0`.
    pub fn apply(&self, l: f64) -> f64 {
        match *self {
            Penalty::Linear => l,
            Penalty::Capped(cap) => (l / cap).min(1.0),
            Penalty::Quadratic => l * l,
        }
    }
}

impl fmt::Display for Penalty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Penalty::Linear => write!(f, "linear"),
            Penalty::Capped(cap) => write!(f, "capped:{cap}"),
            Penalty::Quadratic => write!(f, "quadratic"),
        }
    }
}

/// A string that is not one of the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub(crate) String);

impl FromStr for Penalty {
    type Err = ParseError;

    /// Accepts `linear`, `quadratic` and `capped:L` with `L` in seconds (`capped:2`, `capped:2s`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        match s {
            "linear" => Ok(Penalty::Linear),
            "quadratic" => Ok(Penalty::Quadratic),
            _ => {
                let cap = s.strip_prefix("capped:").map(|v| v.trim_end_matches('s')).and_then(|v| v.parse::<f64>().ok()).filter(|v| v.is_finite() && *v > 0.0);
                cap.map(Penalty::Capped).ok_or_else(|| ParseError(format!("penalty `{s}`: expected `linear`, `quadratic` or `capped:SECONDS` (> 0)")))
            }
        }
    }
}

/// A binary SLO: per-request thresholds, any subset, in seconds. Written as vLLM's `--goodput`:
/// `ttft:MS tpot:MS e2el:MS` (milliseconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct BinarySlo {
    /// Time to first token limit, seconds.
    pub ttft: Option<f64>,
    /// Time per output token limit, seconds.
    pub tpot: Option<f64>,
    /// End-to-end latency limit, seconds.
    pub e2el: Option<f64>,
}

impl FromStr for BinarySlo {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut slo = BinarySlo::default();
        for item in s.split_whitespace() {
            let (key, ms) = item.split_once(':').ok_or_else(|| ParseError(format!("goodput item `{item}`: expected KEY:MS")))?;
            let ms: f64 =
                ms.parse().ok().filter(|v: &f64| v.is_finite() && *v >= 0.0).ok_or_else(|| ParseError(format!("goodput item `{item}`: MS must be >= 0")))?;
            let slot = match key {
                "ttft" => &mut slo.ttft,
                "tpot" => &mut slo.tpot,
                "e2el" => &mut slo.e2el,
                _ => return Err(ParseError(format!("goodput key `{key}`: expected ttft, tpot or e2el"))),
            };
            *slot = Some(ms / 1000.0);
        }
        Ok(slo)
    }
}

impl fmt::Display for BinarySlo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for (k, v) in [("ttft", self.ttft), ("tpot", self.tpot), ("e2el", self.e2el)] {
            if let Some(v) = v {
                parts.push(format!("{k}:{}", v * 1000.0));
            }
        }
        write!(f, "{}", parts.join(" "))
    }
}

/// Everything the metrics need besides timestamps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SloParams {
    /// Weight of waiting against output, `alpha`.
    pub alpha: f64,
    /// Penalty function `f`.
    pub penalty: Penalty,
    /// The binary SLO for attainment and goodput.
    pub binary: BinarySlo,
    /// Reading class of requests that do not name one.
    pub default_class: SloClass,
}

impl Default for SloParams {
    fn default() -> Self {
        Self { alpha: 2.5, penalty: Penalty::Linear, binary: BinarySlo::default(), default_class: SloClass::default() }
    }
}

impl SloParams {
    /// Benefit `n - alpha * f(l)` of `n` tokens with idle latency `l`.
    pub fn benefit(&self, n: usize, idle: f64) -> f64 {
        n as f64 - self.alpha * self.penalty.apply(idle.max(0.0))
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Finished normally (stop or length).
    Completed,
    /// Dropped by the server after it was admitted (drop-late).
    Dropped,
    /// Rejected at admission, before any output: contributes nothing but a count.
    Rejected,
    /// The client went away (a disconnect the measurer did not decide, or a run's time limit).
    Aborted,
    /// An engine error ended it.
    Failed,
    /// The client's patience ran out: its idle latency reached its patience and it disconnected
    /// (evaluation.md point 3). Scored as a drop: delivered tokens and the idle latency at
    /// departure.
    Abandoned,
}

/// One request as seen by whoever measures: the input of every metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Arrival `a_r`, seconds (server accept or client send; say which).
    pub arrival: f64,
    /// Delivery time of each output token, non-decreasing; tokens sharing a frame share a time.
    pub token_times: Vec<f64>,
    /// How it ended.
    pub outcome: Outcome,
    /// When it ended: last token for a completed request, the drop/abort/failure/rejection time
    /// otherwise. Windows select requests by this time.
    pub end: f64,
    /// Its reading class.
    pub class: SloClass,
}

impl RequestRecord {
    /// Output tokens delivered, `n_r`.
    pub fn num_tokens(&self) -> usize {
        self.token_times.len()
    }

    /// `t_1 - a`, if a token was delivered.
    pub fn ttft(&self) -> Option<f64> {
        self.token_times.first().map(|t| t - self.arrival)
    }

    /// Every gap `t_i - t_{i-1}`, i >= 2.
    pub fn itls(&self) -> impl Iterator<Item = f64> + '_ {
        self.token_times.windows(2).map(|w| w[1] - w[0])
    }

    /// `(t_n - t_1) / (n - 1)`; 0 when n <= 1.
    pub fn tpot(&self) -> f64 {
        let n = self.token_times.len();
        if n <= 1 {
            0.0
        } else {
            (self.token_times[n - 1] - self.token_times[0]) / (n - 1) as f64
        }
    }

    /// `t_n - a`, if a token was delivered.
    pub fn e2e(&self) -> Option<f64> {
        self.token_times.last().map(|t| t - self.arrival)
    }

    /// User idle latency `l_r` (see the module doc for requests that did not complete).
    pub fn idle_latency(&self) -> f64 {
        let pending_until = match self.outcome {
            Outcome::Completed | Outcome::Rejected => None,
            Outcome::Dropped | Outcome::Aborted | Outcome::Failed | Outcome::Abandoned => Some(self.end),
        };
        idle_latency(self.arrival, &self.token_times, self.class, pending_until)
    }

    /// Benefit `w * (n - alpha * f(l))`; 0 for a rejected request.
    pub fn benefit(&self, params: &SloParams) -> f64 {
        if self.outcome == Outcome::Rejected {
            return 0.0;
        }
        self.class.weight * params.benefit(self.num_tokens(), self.idle_latency())
    }

    /// Completed and within every threshold of `slo`.
    pub fn passes(&self, slo: &BinarySlo) -> bool {
        if self.outcome != Outcome::Completed {
            return false;
        }
        let within = |limit: Option<f64>, v: Option<f64>| match (limit, v) {
            (None, _) => true,
            (Some(lim), Some(v)) => v <= lim,
            (Some(_), None) => false,
        };
        within(slo.ttft, self.ttft()) && within(slo.tpot, Some(self.tpot())) && within(slo.e2el, self.e2e())
    }
}

/// Idle latency of a stream with the given delivery times.
///
/// With `pending_until = Some(t)`, the stream is still waiting for token `n + 1` at `t` (in
/// flight, or it ended there without it), and that wait counts: this is the live gauge's
/// "largest idle latency among requests still streaming".
pub fn idle_latency(arrival: f64, token_times: &[f64], class: SloClass, pending_until: Option<f64>) -> f64 {
    let mut worst = 0.0f64;
    for (i, t) in token_times.iter().enumerate() {
        worst = worst.max(t - class.deadline(arrival, i + 1));
    }
    if let Some(t) = pending_until {
        worst = worst.max(t - class.deadline(arrival, token_times.len() + 1));
    }
    worst
}

/// Mean and percentiles of a sample (linear interpolation between order statistics, as numpy's
/// default and `vllm bench serve`). All zero for an empty sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Dist {
    /// Number of values.
    pub count: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest value.
    pub max: f64,
}

impl Dist {
    /// Summarise `values` (sorted in place).
    pub fn of(values: &mut [f64]) -> Dist {
        if values.is_empty() {
            return Dist::default();
        }
        values.sort_unstable_by(f64::total_cmp);
        let n = values.len();
        Dist {
            count: n,
            mean: values.iter().sum::<f64>() / n as f64,
            p50: percentile_sorted(values, 50.0),
            p90: percentile_sorted(values, 90.0),
            p95: percentile_sorted(values, 95.0),
            p99: percentile_sorted(values, 99.0),
            max: values[n - 1],
        }
    }
}

/// Percentile `p` (0..=100) of sorted, non-empty `values`, interpolating linearly.
pub fn percentile_sorted(values: &[f64], p: f64) -> f64 {
    let rank = p / 100.0 * (values.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    values[lo] + (values[hi] - values[lo]) * (rank - lo as f64)
}

/// Which requests a window holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// Requests that *ended* in the window: the server's sliding-window gauges.
    ByEnd,
    /// Requests that *arrived* in the window (evaluation.md, point 1): the measurement window of
    /// a steady-state run, the same set of requests for every policy given the same arrivals.
    ByArrival,
}

/// Every aggregate of metrics.md over one window of requests.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowStats {
    /// Window length, seconds.
    pub window_s: f64,
    /// Requests in the window, any outcome (by end time for live gauges, by arrival for a
    /// measurement window: then these are the *counted* requests).
    pub offered: usize,
    /// Completed (stop or length).
    pub completed: usize,
    /// Completed and within the binary SLO.
    pub passed: usize,
    /// Rejected at admission.
    pub rejected: usize,
    /// Dropped after admission.
    pub dropped: usize,
    /// Aborted by the client or cut by a run's time limit.
    pub aborted: usize,
    /// Failed with an engine error.
    pub failed: usize,
    /// The client's patience ran out and it left.
    #[serde(default)]
    pub abandoned: usize,
    /// Output tokens delivered, to any request.
    pub output_tokens: usize,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Delivered output tokens per second (every request's, including dropped partial output).
    pub output_throughput: f64,
    /// passed / completed (0 when none completed).
    pub attainment: f64,
    /// passed / offered: rejected, dropped, abandoned and failed count as not passed.
    pub attainment_offered: f64,
    /// Passed requests per second (vLLM, AIPerf).
    pub request_goodput: f64,
    /// Output tokens of passed requests per second (smooth-goodput paper, Eq. 7).
    pub token_goodput: f64,
    /// Sum of benefits per second of the window.
    pub smooth_goodput: f64,
    /// Sum of benefits (a rejected request's is 0).
    #[serde(default)]
    pub benefit: f64,
    /// Sum of benefits over the requests in the window (0 when there are none).
    #[serde(default)]
    pub benefit_per_request: f64,
    /// rejected / offered.
    #[serde(default)]
    pub rejected_frac: f64,
    /// dropped / offered.
    #[serde(default)]
    pub dropped_frac: f64,
    /// abandoned / offered.
    #[serde(default)]
    pub abandoned_frac: f64,
    /// TTFT over requests with at least one token, seconds.
    pub ttft: Dist,
    /// Every inter-token gap, seconds.
    pub itl: Dist,
    /// TPOT over requests with at least two tokens, seconds.
    pub tpot: Dist,
    /// E2E over completed requests, seconds.
    pub e2e: Dist,
    /// Idle latency over every request that was served (not rejected), seconds.
    pub idle: Dist,
    /// TTFT over completed requests, seconds.
    #[serde(default)]
    pub ttft_served: Dist,
    /// TPOT over completed requests with at least two tokens, seconds.
    #[serde(default)]
    pub tpot_served: Dist,
    /// Idle latency over completed requests, seconds.
    #[serde(default)]
    pub idle_served: Dist,
    /// TTFT over every request in the window; one that never got a token counts its whole wait
    /// (end - arrival), seconds.
    #[serde(default)]
    pub ttft_all: Dist,
    /// Idle latency over every request in the window: served ones as `idle`; a rejected one its
    /// whole wait (end - arrival), seconds.
    #[serde(default)]
    pub idle_all: Dist,
}

impl WindowStats {
    /// Aggregate the requests whose `end` lies in `[start, end]`, over a window of `end - start`
    /// seconds: the server's sliding-window gauges.
    pub fn compute(records: &[RequestRecord], start: f64, end: f64, params: &SloParams) -> WindowStats {
        Self::select(records, Selection::ByEnd, start, end, params)
    }

    /// Aggregate the requests that *arrived* in `[start, end]` (the counted requests of a
    /// measurement window), over a window of `end - start` seconds. Every counted request must
    /// have ended; evaluation.md, points 1 and 2.
    pub fn counted(records: &[RequestRecord], start: f64, end: f64, params: &SloParams) -> WindowStats {
        Self::select(records, Selection::ByArrival, start, end, params)
    }

    /// Aggregate the requests `selection` picks from `[start, end]`.
    pub fn select(records: &[RequestRecord], selection: Selection, start: f64, end: f64, params: &SloParams) -> WindowStats {
        let key = |r: &RequestRecord| match selection {
            Selection::ByEnd => r.end,
            Selection::ByArrival => r.arrival,
        };
        Self::aggregate(records.iter().filter(|r| key(r) >= start && key(r) <= end), end - start, params)
    }

    /// Aggregate `records` over a window of `window_s` seconds. Rates over an empty window are 0.
    pub fn aggregate<'a>(records: impl IntoIterator<Item = &'a RequestRecord>, window_s: f64, params: &SloParams) -> WindowStats {
        // Rates are per second of the window; an empty window has none (0, not infinity).
        let window = if window_s > 0.0 { window_s } else { f64::INFINITY };
        let mut s = WindowStats { window_s, ..Default::default() };
        let (mut ttft, mut itl, mut tpot, mut e2e, mut idle) = (vec![], vec![], vec![], vec![], vec![]);
        let (mut ttft_served, mut tpot_served, mut idle_served, mut ttft_all, mut idle_all) = (vec![], vec![], vec![], vec![], vec![]);
        let mut passed_tokens = 0usize;
        for r in records {
            s.offered += 1;
            ttft_all.push(r.ttft().unwrap_or(r.end - r.arrival));
            match r.outcome {
                Outcome::Completed => s.completed += 1,
                Outcome::Rejected => {
                    s.rejected += 1;
                    idle_all.push((r.end - r.arrival).max(0.0));
                    continue;
                }
                Outcome::Dropped => s.dropped += 1,
                Outcome::Aborted => s.aborted += 1,
                Outcome::Failed => s.failed += 1,
                Outcome::Abandoned => s.abandoned += 1,
            }
            s.output_tokens += r.num_tokens();
            if r.passes(&params.binary) {
                s.passed += 1;
                passed_tokens += r.num_tokens();
            }
            s.benefit += r.benefit(params);
            let l = r.idle_latency();
            idle.push(l);
            idle_all.push(l);
            ttft.extend(r.ttft());
            itl.extend(r.itls());
            if r.num_tokens() >= 2 {
                tpot.push(r.tpot());
            }
            if r.outcome == Outcome::Completed {
                e2e.extend(r.e2e());
                ttft_served.extend(r.ttft());
                idle_served.push(l);
                if r.num_tokens() >= 2 {
                    tpot_served.push(r.tpot());
                }
            }
        }
        let of_offered = |n: usize| if s.offered > 0 { n as f64 / s.offered as f64 } else { 0.0 };
        s.request_throughput = s.completed as f64 / window;
        s.output_throughput = s.output_tokens as f64 / window;
        s.attainment = if s.completed > 0 { s.passed as f64 / s.completed as f64 } else { 0.0 };
        s.attainment_offered = of_offered(s.passed);
        s.rejected_frac = of_offered(s.rejected);
        s.dropped_frac = of_offered(s.dropped);
        s.abandoned_frac = of_offered(s.abandoned);
        s.request_goodput = s.passed as f64 / window;
        s.token_goodput = passed_tokens as f64 / window;
        s.smooth_goodput = s.benefit / window;
        s.benefit_per_request = if s.offered > 0 { s.benefit / s.offered as f64 } else { 0.0 };
        s.ttft = Dist::of(&mut ttft);
        s.itl = Dist::of(&mut itl);
        s.tpot = Dist::of(&mut tpot);
        s.e2e = Dist::of(&mut e2e);
        s.idle = Dist::of(&mut idle);
        s.ttft_served = Dist::of(&mut ttft_served);
        s.tpot_served = Dist::of(&mut tpot_served);
        s.idle_served = Dist::of(&mut idle_served);
        s.ttft_all = Dist::of(&mut ttft_all);
        s.idle_all = Dist::of(&mut idle_all);
        s
    }
}

/// The measurement window of a run whose arrivals span `[first, last]` (evaluation.md, point 1):
/// `[first + warmup * span, first + end * span]`, fractions of the span.
pub fn measurement_window(first: f64, last: f64, warmup_fraction: f64, end_fraction: f64) -> (f64, f64) {
    let span = (last - first).max(0.0);
    (first + warmup_fraction * span, first + end_fraction * span)
}

/// Checks the window fractions: `0 <= warmup < end <= 1`.
pub fn check_window_fractions(warmup_fraction: f64, end_fraction: f64) -> Result<(), ParseError> {
    if (0.0..1.0).contains(&warmup_fraction) && end_fraction > warmup_fraction && end_fraction <= 1.0 {
        Ok(())
    } else {
        Err(ParseError(format!("window fractions: need 0 <= --warmup-fraction ({warmup_fraction}) < --window-end-fraction ({end_fraction}) <= 1")))
    }
}

/// Output tokens delivered to *any* request between `t0` and `t1`, per second: what the engine
/// produced during a window. It differs from [`WindowStats::output_throughput`] (the counted
/// requests' tokens over the window's length) when a queue outlives the window: then counted
/// requests get their tokens after it ends, and only this rate is bounded by the engine.
pub fn delivered_rate(records: &[RequestRecord], t0: f64, t1: f64) -> f64 {
    let n: usize = records.iter().map(|r| r.token_times.iter().filter(|&&t| t >= t0 && t <= t1).count()).sum();
    if t1 > t0 {
        n as f64 / (t1 - t0)
    } else {
        0.0
    }
}

/// The best smooth goodput any scheduler could reach at a load (evaluation.md, point 7): every
/// offered output token served with nobody idle, up to the engine's saturated output rate
/// `theta`. Both in output tokens per second.
pub fn ceiling(offered_output_tps: f64, theta: f64) -> f64 {
    offered_output_tps.min(theta).max(0.0)
}

/// The ceiling of a weighted workload: the most weighted output rate an engine of `theta` output
/// tokens per second can deliver when the offered rate comes in classes `(weight, tok/s)`: the
/// heaviest served first. With one class of weight 1 it is [`ceiling`].
pub fn weighted_ceiling(offered_by_weight: &[(f64, f64)], theta: f64) -> f64 {
    let mut by_weight = offered_by_weight.to_vec();
    by_weight.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut left = theta.max(0.0);
    let mut total = 0.0;
    for (w, tps) in by_weight {
        let take = tps.max(0.0).min(left);
        total += w * take;
        left -= take;
    }
    total
}

/// `value / ceiling`, 0 when the ceiling is 0.
pub fn ceiling_fraction(value: f64, ceiling: f64) -> f64 {
    if ceiling > 0.0 {
        value / ceiling
    } else {
        0.0
    }
}

/// Mean and the half-width of its 95% confidence interval (Student's t, `n - 1` degrees of
/// freedom) of a small sample, such as one value per seed; the half-width is 0 for fewer than
/// two values.
pub fn mean_ci95(values: &[f64]) -> (f64, f64) {
    let n = values.len();
    if n == 0 {
        return (0.0, 0.0);
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, 0.0);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (mean, t975(n - 1) * (var / n as f64).sqrt())
}

/// The 97.5% quantile of Student's t with `df` degrees of freedom (a table to 30, then the
/// normal approximation with a first-order correction).
fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080,
        2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => T[df - 1],
        _ => 1.959_964 + 2.4 / df as f64,
    }
}

/// How long a client waits before it gives up (evaluation.md, point 3): it abandons when its
/// idle latency reaches its patience, drawn per request from this distribution.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Patience {
    /// Clients never leave.
    None,
    /// Exponential with this mean, seconds.
    Exp(f64),
    /// Log-normal with this median (seconds) and sigma of the log.
    LogNormal(f64, f64),
    /// Always this many seconds.
    Fixed(f64),
}

impl Patience {
    /// One client's patience, seconds (infinite for `None`).
    pub fn sample<R: rand::Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        use rand_distr::{Distribution, Exp, LogNormal};
        match *self {
            Patience::None => f64::INFINITY,
            Patience::Exp(mean) => Exp::new(1.0 / mean).map_or(mean, |d| d.sample(rng)),
            Patience::LogNormal(median, sigma) => LogNormal::new(median.ln(), sigma).map_or(median, |d| d.sample(rng)),
            Patience::Fixed(s) => s,
        }
    }

    /// Seeded patiences of `n` requests (the same for every policy and target given the seed).
    pub fn draw(&self, n: usize, seed: u64) -> Vec<f64> {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x7a71_e4ce_0000_0001);
        (0..n).map(|_| self.sample(&mut rng)).collect()
    }
}

impl fmt::Display for Patience {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Patience::None => write!(f, "none"),
            Patience::Exp(m) => write!(f, "exp:{m}"),
            Patience::LogNormal(m, s) => write!(f, "lognormal:{m},{s}"),
            Patience::Fixed(s) => write!(f, "fixed:{s}"),
        }
    }
}

impl FromStr for Patience {
    type Err = ParseError;

    /// `none`, `exp:MEAN_S`, `lognormal:MEDIAN_S,SIGMA` or `fixed:S`, every number positive
    /// (sigma may be 0).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseError(format!("patience `{s}`: expected none, exp:MEAN_S, lognormal:MEDIAN_S,SIGMA or fixed:S (seconds > 0)"));
        let num = |v: &str| v.trim().trim_end_matches('s').parse::<f64>().ok().filter(|x| x.is_finite() && *x > 0.0);
        let s = s.trim();
        if s == "none" {
            return Ok(Patience::None);
        }
        let (kind, rest) = s.split_once(':').ok_or_else(bad)?;
        match kind {
            "exp" => num(rest).map(Patience::Exp).ok_or_else(bad),
            "fixed" => num(rest).map(Patience::Fixed).ok_or_else(bad),
            "lognormal" => {
                let (m, sig) = rest.split_once(',').ok_or_else(bad)?;
                let sigma = sig.trim().parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0).ok_or_else(bad)?;
                Ok(Patience::LogNormal(num(m).ok_or_else(bad)?, sigma))
            }
            _ => Err(bad()),
        }
    }
}

impl SloClass {
    /// When a client with `patience` leaves if token `delivered + 1` has not come: its idle
    /// latency reaches the patience at `d_{n+1} + patience` (it was below the patience at every
    /// earlier token, or it would have left then).
    pub fn departure(&self, arrival: f64, delivered: usize, patience: f64) -> f64 {
        self.deadline(arrival, delivered + 1) + patience
    }
}

/// What a client sends as `max_tokens` (evaluation.md, point 4): no scheduler may learn the
/// true output length from it unless the rule is `exact`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum MaxTokensRule {
    /// The true length (an oracle, for ablations).
    Exact,
    /// This many tokens, or the model's room if smaller.
    Cap(usize),
    /// This many times the true length.
    Scale(f64),
}

impl MaxTokensRule {
    /// `max_tokens` of a request whose output would end at `true_len` tokens, with `room`
    /// tokens left in the model's context after its prompt; at least 1.
    pub fn max_tokens(&self, true_len: usize, room: usize) -> usize {
        let want = match *self {
            MaxTokensRule::Exact => true_len,
            MaxTokensRule::Cap(n) => n,
            MaxTokensRule::Scale(k) => (k * true_len as f64).ceil() as usize,
        };
        want.min(room).max(1)
    }
}

impl fmt::Display for MaxTokensRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaxTokensRule::Exact => write!(f, "exact"),
            MaxTokensRule::Cap(n) => write!(f, "cap:{n}"),
            MaxTokensRule::Scale(k) => write!(f, "scale:{k}"),
        }
    }
}

impl FromStr for MaxTokensRule {
    type Err = ParseError;

    /// `exact`, `cap:N` (N >= 1) or `scale:K` (K > 0).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseError(format!("max-tokens rule `{s}`: expected exact, cap:N (N >= 1) or scale:K (K > 0)"));
        let s = s.trim();
        if s == "exact" {
            return Ok(MaxTokensRule::Exact);
        }
        match s.split_once(':') {
            Some(("cap", n)) => n.trim().parse::<usize>().ok().filter(|n| *n >= 1).map(MaxTokensRule::Cap).ok_or_else(bad),
            Some(("scale", k)) => k.trim().parse::<f64>().ok().filter(|k| k.is_finite() && *k > 0.0).map(MaxTokensRule::Scale).ok_or_else(bad),
            _ => Err(bad()),
        }
    }
}

/// Capacity in DistServe's form: the highest offered load of a sweep at which attainment is at
/// least `target` (metrics.md: 90%). `points` are `(offered load, attainment)` in any order;
/// `None` when no point reaches the target. The answer is a swept load, never interpolated: the
/// sweep's spacing is its resolution.
pub fn capacity(points: &[(f64, f64)], target: f64) -> Option<f64> {
    points.iter().filter(|(_, att)| *att >= target).map(|(load, _)| *load).reduce(f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_weighted_ceiling_serves_the_heaviest_first() {
        // 20 tok/s at weight 4 and 80 at weight 1 on an engine of 50: 4 * 20 + 1 * 30.
        assert_eq!(weighted_ceiling(&[(1.0, 80.0), (4.0, 20.0)], 50.0), 110.0);
        // Room for everything: the weighted offered rate.
        assert_eq!(weighted_ceiling(&[(1.0, 80.0), (4.0, 20.0)], 500.0), 160.0);
        // One class of weight 1 is the plain ceiling.
        for theta in [0.0, 30.0, 100.0] {
            assert_eq!(weighted_ceiling(&[(1.0, 60.0)], theta), ceiling(60.0, theta));
        }
    }
    use rand::{Rng, SeedableRng};

    fn record(arrival: f64, token_times: Vec<f64>, class: SloClass) -> RequestRecord {
        let end = token_times.last().copied().unwrap_or(arrival);
        RequestRecord { arrival, token_times, outcome: Outcome::Completed, end, class }
    }

    /// Times at which each token meets its deadline plus `late` seconds.
    fn stream(class: SloClass, n: usize, late: f64) -> Vec<f64> {
        (1..=n).map(|i| class.deadline(0.0, i) + late).collect()
    }

    #[test]
    fn parses_penalties_and_goodput_strings() {
        assert_eq!("linear".parse::<Penalty>(), Ok(Penalty::Linear));
        assert_eq!("quadratic".parse::<Penalty>(), Ok(Penalty::Quadratic));
        assert_eq!("capped:2".parse::<Penalty>(), Ok(Penalty::Capped(2.0)));
        assert_eq!("capped:2s".parse::<Penalty>(), Ok(Penalty::Capped(2.0)));
        assert!("capped:0".parse::<Penalty>().is_err());
        assert!("cubic".parse::<Penalty>().is_err());
        let slo: BinarySlo = "ttft:500 tpot:50 e2el:10000".parse().unwrap();
        assert_eq!(slo, BinarySlo { ttft: Some(0.5), tpot: Some(0.05), e2el: Some(10.0) });
        assert_eq!("tpot:20".parse::<BinarySlo>().unwrap().ttft, None);
        assert!("ttft=5".parse::<BinarySlo>().is_err());
        assert!("itl:5".parse::<BinarySlo>().is_err());
        assert!("ttft:-1".parse::<BinarySlo>().is_err());
        assert_eq!(slo.to_string().parse::<BinarySlo>().unwrap(), slo);
    }

    #[test]
    fn per_request_latencies_satisfy_e2e_identity() {
        let r = record(1.0, vec![1.5, 1.6, 1.6, 2.0], SloClass::default());
        assert!((r.ttft().unwrap() - 0.5).abs() < 1e-12);
        let itl: Vec<f64> = r.itls().collect();
        assert_eq!(itl.len(), 3);
        assert!((r.tpot() - 0.5 / 3.0).abs() < 1e-12);
        let e2e = r.e2e().unwrap();
        assert!((e2e - (r.ttft().unwrap() + 3.0 * r.tpot())).abs() < 1e-12);
        assert_eq!(record(0.0, vec![0.3], SloClass::default()).tpot(), 0.0);
    }

    /// metrics.md example 1 (seed 000): token goodput 10 tok/s, smooth goodput 19 per s.
    #[test]
    fn example_1_smooth_goodput_arithmetic() {
        let class = SloClass::new(20.0, 0.0);
        let a = record(0.0, stream(class, 100, 0.0), class);
        let b = record(0.0, stream(class, 100, 0.2), class);
        let c = record(0.0, stream(class, 100, 2.0), class);
        assert!(a.idle_latency().abs() < 1e-9);
        assert!((b.idle_latency() - 0.2).abs() < 1e-9);
        assert!((c.idle_latency() - 2.0).abs() < 1e-9);
        let params = SloParams { alpha: 100.0, penalty: "capped:2".parse().unwrap(), binary: "ttft:100".parse().unwrap(), default_class: class };
        assert!((b.benefit(&params) - 90.0).abs() < 1e-6);
        assert!(c.benefit(&params).abs() < 1e-6);
        let w = WindowStats::compute(&[a, b, c], 0.0, 10.0, &params);
        assert_eq!(w.passed, 1);
        assert!((w.token_goodput - 10.0).abs() < 1e-9);
        assert!((w.smooth_goodput - 19.0).abs() < 1e-6);
    }

    /// metrics.md example 2: a reading buffer hides a stall that the same largest ITL does not.
    #[test]
    fn example_2_reading_buffer_hides_stall() {
        let class = SloClass::new(4.0, 0.0);
        // X: 10 tokens in its first second, a 1 s stall, then 10 more.
        let mut x: Vec<f64> = (1..=10).map(|i| i as f64 / 10.0).collect();
        x.extend((0..10).map(|i| 2.0 + i as f64 / 10.0));
        // Y: 2 tokens in its first second, the same stall, then 18 more.
        let mut y = vec![0.5, 1.0];
        y.extend((0..18).map(|i| 2.0 + i as f64 / 10.0));
        let (x, y) = (record(0.0, x, class), record(0.0, y, class));
        let max_itl = |r: &RequestRecord| r.itls().fold(0.0, f64::max);
        assert!((max_itl(&x) - max_itl(&y)).abs() < 1e-9);
        assert_eq!(x.idle_latency(), 0.0);
        assert!(y.idle_latency() > 0.0);
        assert!((y.idle_latency() - 1.25).abs() < 1e-9, "token 3 due at 0.75 s, delivered at 2 s");
    }

    /// metrics.md example 3: delaying a ready token never lowers idle latency, whatever a
    /// TBT-style chain of deadlines says.
    #[test]
    fn example_3_output_delay_never_lowers_idle_latency() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for _ in 0..200 {
            let class = SloClass::new(rng.random_range(1.0..20.0), rng.random_range(0.0..1.0));
            let n = rng.random_range(1..40);
            let mut t = rng.random_range(0.0..2.0);
            let times: Vec<f64> = (0..n)
                .map(|_| {
                    t += rng.random_range(0.0..0.5);
                    t
                })
                .collect();
            let base = record(0.0, times.clone(), class);
            let i = rng.random_range(0..n);
            let mut delayed = times.clone();
            delayed[i] += 0.05;
            for j in i + 1..n {
                delayed[j] = delayed[j].max(delayed[j - 1]);
            }
            let held = record(0.0, delayed, class);
            assert!(held.idle_latency() >= base.idle_latency());
        }
    }

    /// metrics.md example 4 (seed 001): same mean, very different P99.
    #[test]
    fn example_4_mean_vs_tail() {
        let mut flat = vec![0.2; 100];
        let mut tail = vec![0.1; 98];
        tail.extend([5.1, 5.1]);
        let (flat, tail) = (Dist::of(&mut flat), Dist::of(&mut tail));
        assert!((flat.mean - 0.2).abs() < 1e-9 && (tail.mean - 0.2).abs() < 1e-9);
        assert!((flat.p99 - 0.2).abs() < 1e-9);
        assert!((tail.p99 - 5.1).abs() < 1e-9);
        assert!((tail.p50 - 0.1).abs() < 1e-9);
    }

    /// metrics.md example 5 (seed 001): higher throughput, lower goodput.
    #[test]
    fn example_5_goodput_vs_throughput() {
        let class = SloClass::default();
        let params = SloParams { binary: "ttft:200".parse().unwrap(), ..Default::default() };
        let server = |completed: usize, passing: usize| -> WindowStats {
            let records: Vec<RequestRecord> = (0..completed)
                .map(|k| {
                    let ttft = if k < passing { 0.1 } else { 0.3 };
                    record(0.0, vec![ttft, 0.5], class)
                })
                .collect();
            WindowStats::compute(&records, 0.0, 1.0, &params)
        };
        let a = server(100, 60);
        let b = server(85, 80);
        assert!((a.request_throughput - 100.0).abs() < 1e-9);
        assert!((a.attainment - 0.60).abs() < 1e-9);
        assert!((a.request_goodput - 60.0).abs() < 1e-9);
        assert!((b.attainment - 80.0 / 85.0).abs() < 1e-9 && (b.attainment - 0.941).abs() < 1e-3);
        assert!((b.request_goodput - 80.0).abs() < 1e-9);
        assert!(b.request_goodput > a.request_goodput && b.request_throughput < a.request_throughput);
    }

    #[test]
    fn unfinished_requests_count_their_pending_wait() {
        let class = SloClass::new(10.0, 0.0);
        let mut r = record(0.0, vec![0.05, 0.1], class);
        assert_eq!(r.idle_latency(), 0.0);
        r.outcome = Outcome::Dropped;
        r.end = 1.3; // token 3 was due at 0.3 s
        assert!((r.idle_latency() - 1.0).abs() < 1e-9);
        assert!((r.benefit(&SloParams::default()) - (2.0 - 2.5)).abs() < 1e-9);
        let rejected = RequestRecord { arrival: 0.0, token_times: vec![], outcome: Outcome::Rejected, end: 5.0, class };
        assert_eq!(rejected.benefit(&SloParams::default()), 0.0);
        let w = WindowStats::compute(&[r, rejected], 0.0, 10.0, &SloParams::default());
        assert_eq!((w.offered, w.dropped, w.rejected, w.passed), (2, 1, 1, 0));
        assert_eq!(w.idle.count, 1);
    }

    #[test]
    fn capacity_is_the_highest_load_meeting_the_target() {
        let sweep = [(4.0, 0.85), (1.0, 1.0), (2.0, 0.95), (3.0, 0.9), (5.0, 0.2)];
        assert_eq!(capacity(&sweep, 0.9), Some(3.0));
        assert_eq!(capacity(&sweep, 0.99), Some(1.0));
        assert_eq!(capacity(&sweep, 1.01), None);
        assert_eq!(capacity(&[], 0.9), None);
        // Not monotone: a noisy point above a failing one still counts, as "highest load at which".
        assert_eq!(capacity(&[(1.0, 0.95), (2.0, 0.8), (3.0, 0.92)], 0.9), Some(3.0));
    }

    #[test]
    fn window_selects_by_end_time_and_attainment_over_offered() {
        let class = SloClass::default();
        let params = SloParams { binary: "ttft:500".parse().unwrap(), ..Default::default() };
        let inside = record(0.0, vec![0.1, 0.2], class);
        let outside = record(20.0, vec![20.1], class);
        let failed = RequestRecord { arrival: 1.0, token_times: vec![1.1], outcome: Outcome::Failed, end: 2.0, class };
        let w = WindowStats::compute(&[inside, outside, failed], 0.0, 10.0, &params);
        assert_eq!((w.offered, w.completed, w.failed, w.passed), (2, 1, 1, 1));
        assert!((w.attainment - 1.0).abs() < 1e-12);
        assert!((w.attainment_offered - 0.5).abs() < 1e-12);
        assert_eq!(w.output_tokens, 3);
    }

    /// metrics.md example 6: a measurement window, a client who leaves, a rejection and the
    /// ceiling, computed by hand in metrics.md.
    #[test]
    fn example_6_window_abandonment_and_ceiling() {
        let class = SloClass::new(5.0, 0.0);
        let params = SloParams { default_class: class, ..Default::default() };
        let on_time = |a: f64, n: usize, late: f64| -> Vec<f64> { (1..=n).map(|i| class.deadline(a, i) + late).collect() };
        let done = |a: f64, times: Vec<f64>| RequestRecord { arrival: a, end: *times.last().unwrap(), token_times: times, outcome: Outcome::Completed, class };
        let (w0, w1) = measurement_window(0.0, 100.0, 0.1, 0.8);
        assert_eq!((w0, w1), (10.0, 80.0));
        let patience = 4.0;
        let r3_leaves = class.departure(30.0, 0, patience);
        assert!((r3_leaves - 34.2).abs() < 1e-12);
        let records = vec![
            done(0.0, on_time(0.0, 10, 0.0)),
            done(20.0, on_time(20.0, 50, 0.0)),
            RequestRecord { arrival: 30.0, token_times: vec![], outcome: Outcome::Abandoned, end: r3_leaves, class },
            RequestRecord { arrival: 40.0, token_times: vec![], outcome: Outcome::Rejected, end: 40.0, class },
            done(60.0, on_time(60.0, 100, 2.0)),
            done(100.0, on_time(100.0, 10, 9.0)),
        ];
        let w = WindowStats::counted(&records, w0, w1, &params);
        assert_eq!((w.offered, w.completed, w.abandoned, w.rejected), (4, 2, 1, 1));
        assert!((w.benefit - 135.0).abs() < 1e-9, "50 - 10 + 0 + 95, got {}", w.benefit);
        assert!((w.smooth_goodput - 135.0 / 70.0).abs() < 1e-9);
        assert!((w.benefit_per_request - 33.75).abs() < 1e-9);
        assert_eq!((w.rejected_frac, w.abandoned_frac, w.dropped_frac), (0.25, 0.25, 0.0));
        assert!((w.output_throughput - 150.0 / 70.0).abs() < 1e-9);
        // Latency over everyone: R3 waited 4.2 s for nothing, R4 was refused at once.
        assert!((w.ttft_all.p50 - 1.2).abs() < 1e-9 && (w.ttft_all.max - 4.2).abs() < 1e-9);
        assert!((w.idle_all.p50 - 1.0).abs() < 1e-9 && (w.idle_all.max - 4.0).abs() < 1e-9);
        assert_eq!(w.idle_served.count, 2);
        assert!((w.idle_served.max - 2.0).abs() < 1e-9 && (w.ttft_served.max - 2.2).abs() < 1e-9);
        // Ceiling: 290 tokens offered over 70 s against an engine that saturates at 3.5 tok/s.
        let offered = 290.0 / 70.0;
        let c = ceiling(offered, 3.5);
        assert_eq!(c, 3.5);
        assert!((ceiling_fraction(w.smooth_goodput, c) - 0.551_020_4).abs() < 1e-6);
        assert!((ceiling(2.0, 3.5) - 2.0).abs() < 1e-12);
        // What the engine delivered inside [10, 80] s: R2's 50 tokens and R5's first 89 (its
        // token i comes at 62 + 0.2 i, the 90th at 80.0 s), whatever request they were for.
        assert!((delivered_rate(&records, w0, w1) - 140.0 / 70.0).abs() < 1e-9);
        // Selected by end time (the live gauges), R5 falls out (it ended at 82 s).
        assert_eq!(WindowStats::compute(&records, w0, w1, &params).offered, 3);
    }

    #[test]
    fn one_denominator_for_every_policy() {
        // Two policies see the same arrivals in [0, 10]; one serves everything slowly, the other
        // rejects half and finishes early. The window is the same for both.
        let class = SloClass::default();
        let params = SloParams::default();
        let served = |a: f64, late: f64| {
            let times: Vec<f64> = (1..=10).map(|i| class.deadline(a, i) + late).collect();
            RequestRecord { arrival: a, end: *times.last().unwrap(), token_times: times, outcome: Outcome::Completed, class }
        };
        let slow: Vec<RequestRecord> = (0..10).map(|k| served(k as f64, 1.0)).collect();
        let picky: Vec<RequestRecord> = (0..10)
            .map(|k| {
                if k % 2 == 0 {
                    served(k as f64, 0.0)
                } else {
                    RequestRecord { arrival: k as f64, token_times: vec![], outcome: Outcome::Rejected, end: k as f64, class }
                }
            })
            .collect();
        let (a, b) = (WindowStats::counted(&slow, 0.0, 10.0, &params), WindowStats::counted(&picky, 0.0, 10.0, &params));
        assert_eq!((a.window_s, b.window_s), (10.0, 10.0));
        assert!((a.smooth_goodput - 10.0 * (10.0 - 2.5) / 10.0).abs() < 1e-9);
        assert!((b.smooth_goodput - 5.0 * 10.0 / 10.0).abs() < 1e-9);
        assert!(a.smooth_goodput > b.smooth_goodput, "rejecting half does not pay when waiting costs 2.5 of 10");
    }

    #[test]
    fn parses_patience_and_max_tokens_rules() {
        assert_eq!("none".parse::<Patience>(), Ok(Patience::None));
        assert_eq!("exp:20".parse::<Patience>(), Ok(Patience::Exp(20.0)));
        assert_eq!("fixed:1s".parse::<Patience>(), Ok(Patience::Fixed(1.0)));
        assert_eq!("lognormal:10,0.5".parse::<Patience>(), Ok(Patience::LogNormal(10.0, 0.5)));
        for bad in ["exp:0", "exp:-1", "fixed", "lognormal:10", "weibull:3", "exp:inf"] {
            assert!(bad.parse::<Patience>().is_err(), "{bad}");
        }
        for p in [Patience::None, Patience::Exp(20.0), Patience::LogNormal(8.0, 0.7), Patience::Fixed(1.5)] {
            assert_eq!(p.to_string().parse::<Patience>(), Ok(p));
        }
        assert_eq!("cap:1024".parse::<MaxTokensRule>(), Ok(MaxTokensRule::Cap(1024)));
        assert_eq!("scale:1.5".parse::<MaxTokensRule>(), Ok(MaxTokensRule::Scale(1.5)));
        assert_eq!("exact".parse::<MaxTokensRule>(), Ok(MaxTokensRule::Exact));
        for bad in ["cap:0", "scale:0", "scale:-2", "cap", "max:3"] {
            assert!(bad.parse::<MaxTokensRule>().is_err(), "{bad}");
        }
        assert_eq!(MaxTokensRule::Exact.max_tokens(37, 1000), 37);
        assert_eq!(MaxTokensRule::Cap(1024).max_tokens(37, 1000), 1000, "the model's room when smaller");
        assert_eq!(MaxTokensRule::Cap(1024).max_tokens(37, 4000), 1024);
        assert_eq!(MaxTokensRule::Scale(1.5).max_tokens(37, 4000), 56);
        assert!(check_window_fractions(0.1, 0.8).is_ok());
        assert!(check_window_fractions(0.8, 0.1).is_err() && check_window_fractions(0.0, 1.5).is_err());
    }

    #[test]
    fn patience_draws_follow_their_distribution() {
        let exp = Patience::Exp(20.0).draw(20_000, 1);
        let mean = exp.iter().sum::<f64>() / exp.len() as f64;
        assert!((mean - 20.0).abs() < 0.6, "mean {mean}");
        assert_eq!(exp, Patience::Exp(20.0).draw(20_000, 1), "seeded");
        let mut ln = Patience::LogNormal(8.0, 0.5).draw(20_001, 2);
        ln.sort_by(f64::total_cmp);
        assert!((ln[10_000] - 8.0).abs() < 0.2, "median {}", ln[10_000]);
        assert!(Patience::None.draw(3, 0).iter().all(|p| p.is_infinite()));
        assert_eq!(Patience::Fixed(1.0).draw(2, 0), vec![1.0, 1.0]);
    }

    #[test]
    fn confidence_intervals() {
        let (m, h) = mean_ci95(&[1.0, 2.0, 3.0, 4.0, 5.0]);
        // s = sqrt(2.5), t(4) = 2.776: 2.776 * 1.5811 / sqrt(5) = 1.963.
        assert!((m - 3.0).abs() < 1e-12 && (h - 1.963).abs() < 1e-3, "{m} {h}");
        assert_eq!(mean_ci95(&[7.0]), (7.0, 0.0));
        assert_eq!(mean_ci95(&[]), (0.0, 0.0));
        assert_eq!(mean_ci95(&[2.0, 2.0, 2.0]).1, 0.0);
    }
}
