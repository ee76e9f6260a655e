//! Latency, SLO and goodput math: `../shared/docs/metrics.md`, implemented once.
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

/// How a user consumes a stream: reading rate and first-token grace (metrics.md `q`, `g`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SloClass {
    /// Information consumption rate `q`, tokens per second.
    pub reading_rate: f64,
    /// First-token grace `g`, seconds.
    pub grace: f64,
}

impl Default for SloClass {
    fn default() -> Self {
        Self { reading_rate: 5.0, grace: 0.0 }
    }
}

impl SloClass {
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
pub struct ParseError(String);

impl FromStr for Penalty {
    type Err = ParseError;

    /// Accepts `linear`, `quadratic` and `capped:L` with `L` in seconds (`capped:2`, `capped:2s`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        match s {
            "linear" => Ok(Penalty::Linear),
            "quadratic" => Ok(Penalty::Quadratic),
            _ => {
                let cap = s
                    .strip_prefix("capped:")
                    .map(|v| v.trim_end_matches('s'))
                    .and_then(|v| v.parse::<f64>().ok())
                    .filter(|v| v.is_finite() && *v > 0.0);
                cap.map(Penalty::Capped).ok_or_else(|| {
                    ParseError(format!(
                        "penalty `{s}`: expected `linear`, `quadratic` or `capped:SECONDS` (> 0)"
                    ))
                })
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
            let (key, ms) = item
                .split_once(':')
                .ok_or_else(|| ParseError(format!("goodput item `{item}`: expected KEY:MS")))?;
            let ms: f64 = ms
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| ParseError(format!("goodput item `{item}`: MS must be >= 0")))?;
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
        Self {
            alpha: 2.5,
            penalty: Penalty::Linear,
            binary: BinarySlo::default(),
            default_class: SloClass::default(),
        }
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
    /// The client went away.
    Aborted,
    /// An engine error ended it.
    Failed,
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
            Outcome::Dropped | Outcome::Aborted | Outcome::Failed => Some(self.end),
        };
        idle_latency(self.arrival, &self.token_times, self.class, pending_until)
    }

    /// Benefit `n - alpha * f(l)`; 0 for a rejected request.
    pub fn benefit(&self, params: &SloParams) -> f64 {
        if self.outcome == Outcome::Rejected {
            return 0.0;
        }
        params.benefit(self.num_tokens(), self.idle_latency())
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

/// Every aggregate of metrics.md over one window of requests.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowStats {
    /// Window length, seconds.
    pub window_s: f64,
    /// Requests that ended in the window, any outcome.
    pub offered: usize,
    /// Completed (stop or length).
    pub completed: usize,
    /// Completed and within the binary SLO.
    pub passed: usize,
    /// Rejected at admission.
    pub rejected: usize,
    /// Dropped after admission.
    pub dropped: usize,
    /// Aborted by the client.
    pub aborted: usize,
    /// Failed with an engine error.
    pub failed: usize,
    /// Output tokens delivered, to any request.
    pub output_tokens: usize,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Delivered output tokens per second (every request's, including dropped partial output).
    pub output_throughput: f64,
    /// passed / completed (0 when none completed).
    pub attainment: f64,
    /// passed / offered: rejected, dropped and failed count as not passed.
    pub attainment_offered: f64,
    /// Passed requests per second (vLLM, AIPerf).
    pub request_goodput: f64,
    /// Output tokens of passed requests per second (smooth-goodput paper, Eq. 7).
    pub token_goodput: f64,
    /// Sum of benefits per second.
    pub smooth_goodput: f64,
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
}

impl WindowStats {
    /// Aggregate the requests whose `end` lies in `[start, end]`, over a window of `end - start`
    /// seconds. The server's gauges pass a sliding window over finished requests; a benchmark
    /// passes its whole run (first arrival to last end).
    pub fn compute(records: &[RequestRecord], start: f64, end: f64, params: &SloParams) -> WindowStats {
        let window = (end - start).max(f64::MIN_POSITIVE);
        let mut s = WindowStats { window_s: end - start, ..Default::default() };
        let (mut ttft, mut itl, mut tpot, mut e2e, mut idle) = (vec![], vec![], vec![], vec![], vec![]);
        let (mut passed_tokens, mut benefit) = (0usize, 0.0f64);
        for r in records.iter().filter(|r| r.end >= start && r.end <= end) {
            s.offered += 1;
            match r.outcome {
                Outcome::Completed => s.completed += 1,
                Outcome::Rejected => {
                    s.rejected += 1;
                    continue;
                }
                Outcome::Dropped => s.dropped += 1,
                Outcome::Aborted => s.aborted += 1,
                Outcome::Failed => s.failed += 1,
            }
            s.output_tokens += r.num_tokens();
            if r.passes(&params.binary) {
                s.passed += 1;
                passed_tokens += r.num_tokens();
            }
            benefit += r.benefit(params);
            idle.push(r.idle_latency());
            ttft.extend(r.ttft());
            itl.extend(r.itls());
            if r.num_tokens() >= 2 {
                tpot.push(r.tpot());
            }
            if r.outcome == Outcome::Completed {
                e2e.extend(r.e2e());
            }
        }
        s.request_throughput = s.completed as f64 / window;
        s.output_throughput = s.output_tokens as f64 / window;
        s.attainment = if s.completed > 0 { s.passed as f64 / s.completed as f64 } else { 0.0 };
        s.attainment_offered = if s.offered > 0 { s.passed as f64 / s.offered as f64 } else { 0.0 };
        s.request_goodput = s.passed as f64 / window;
        s.token_goodput = passed_tokens as f64 / window;
        s.smooth_goodput = benefit / window;
        s.ttft = Dist::of(&mut ttft);
        s.itl = Dist::of(&mut itl);
        s.tpot = Dist::of(&mut tpot);
        s.e2e = Dist::of(&mut e2e);
        s.idle = Dist::of(&mut idle);
        s
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
        let class = SloClass { reading_rate: 20.0, grace: 0.0 };
        let a = record(0.0, stream(class, 100, 0.0), class);
        let b = record(0.0, stream(class, 100, 0.2), class);
        let c = record(0.0, stream(class, 100, 2.0), class);
        assert!(a.idle_latency().abs() < 1e-9);
        assert!((b.idle_latency() - 0.2).abs() < 1e-9);
        assert!((c.idle_latency() - 2.0).abs() < 1e-9);
        let params = SloParams {
            alpha: 100.0,
            penalty: "capped:2".parse().unwrap(),
            binary: "ttft:100".parse().unwrap(),
            default_class: class,
        };
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
        let class = SloClass { reading_rate: 4.0, grace: 0.0 };
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
            let class = SloClass { reading_rate: rng.random_range(1.0..20.0), grace: rng.random_range(0.0..1.0) };
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
        let class = SloClass { reading_rate: 10.0, grace: 0.0 };
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
}
