//! Workloads: arrival processes and prompt/output lengths, generated from a seed.

use std::path::Path;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, Gamma};
use serde::{Deserialize, Serialize};

use crate::slo::{MaxTokensRule, Patience};

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Arrivals {
    /// Exponential gaps (a Poisson process).
    Poisson,
    /// Gamma gaps with this coefficient of variation (1 is Poisson; above 1 is burstier).
    Gamma {
        /// Standard deviation over mean of the gaps.
        cv: f64,
    },
}

/// A length distribution, tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Lengths {
    /// Always this many.
    Fixed(usize),
    /// Uniform over `lo..=hi`.
    Uniform(usize, usize),
    /// Drawn with replacement from measured lengths (e.g. a model's natural output lengths on a
    /// prompt set).
    Empirical(Vec<usize>),
}

impl Lengths {
    fn sample(&self, rng: &mut StdRng) -> usize {
        match self {
            Lengths::Fixed(n) => (*n).max(1),
            Lengths::Uniform(lo, hi) => rng.random_range((*lo).max(1)..=(*hi).max((*lo).max(1))),
            Lengths::Empirical(v) if v.is_empty() => 1,
            Lengths::Empirical(v) => v[rng.random_range(0..v.len())].max(1),
        }
    }

    /// Mean length.
    pub fn mean(&self) -> f64 {
        match self {
            Lengths::Fixed(n) => (*n).max(1) as f64,
            Lengths::Uniform(lo, hi) => ((*lo).max(1) + (*hi).max((*lo).max(1))) as f64 / 2.0,
            Lengths::Empirical(v) => v.iter().map(|n| (*n).max(1) as f64).sum::<f64>() / v.len().max(1) as f64,
        }
    }
}

/// Prompt and output lengths.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum LengthSource {
    /// Independent prompt and output distributions.
    Synthetic {
        /// Prompt tokens.
        input: Lengths,
        /// Output tokens.
        output: Lengths,
    },
    /// (prompt, output) pairs drawn with replacement, e.g. from a ShareGPT file.
    Pairs(Vec<(usize, usize)>),
}

/// One simulated request.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SimRequest {
    /// Arrival, seconds (closed loops assign it when a client sends the request).
    pub arrival: f64,
    /// Prompt tokens.
    pub prompt_len: usize,
    /// True output length: the model samples end-of-sequence as this token, unless `max_tokens`
    /// ends the request first. The scheduler never sees it.
    pub output_len: usize,
    /// What the client sends as `max_tokens` (see [`ClientModel`]).
    pub max_tokens: usize,
    /// Seconds of idle latency after which the client leaves (infinite: never).
    pub patience: f64,
    /// vLLM's `priority` (lower is more important; weight `2^-priority`, see
    /// [`crate::slo::SloClass::priority_weight`]).
    #[serde(default)]
    pub priority: i64,
}

impl SimRequest {
    /// Output tokens it produces if served to the end: `min(output_len, max_tokens)`.
    pub fn served_len(&self) -> usize {
        self.output_len.min(self.max_tokens)
    }
}

/// How simulated clients behave: what they send as `max_tokens` and how long they wait.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClientModel {
    /// `max_tokens` from the true length.
    pub max_tokens: MaxTokensRule,
    /// Patience distribution.
    pub patience: Patience,
    /// Which requests carry a priority other than 0.
    #[serde(default)]
    pub priority_mix: PriorityMix,
}

/// A share of the requests sent at one `priority` (the rest at 0), drawn per request from the
/// seed: `FRACTION:PRIORITY`, e.g. `0.2:-2` (a fifth of the requests weigh 4).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct PriorityMix {
    /// Fraction of the requests, in `[0, 1]`.
    pub fraction: f64,
    /// Their priority.
    pub priority: i64,
}

impl std::str::FromStr for PriorityMix {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("priority mix `{s}`: expected FRACTION:PRIORITY, e.g. 0.2:-2 (fraction in [0, 1], priority in -10..=10)");
        let (f, p) = s.split_once(':').ok_or_else(bad)?;
        let fraction = f.trim().parse::<f64>().ok().filter(|f| (0.0..=1.0).contains(f)).ok_or_else(bad)?;
        let priority = p.trim().parse::<i64>().ok().filter(|p| (-10..=10).contains(p)).ok_or_else(bad)?;
        Ok(Self { fraction, priority })
    }
}

impl Default for ClientModel {
    /// The oracle of old runs: `max_tokens` is the true length and nobody leaves.
    fn default() -> Self {
        Self { max_tokens: MaxTokensRule::Exact, patience: Patience::None, priority_mix: PriorityMix::default() }
    }
}

impl ClientModel {
    /// Sets `max_tokens` (within `max_model_len`), a seeded patience and a seeded priority on
    /// every request.
    pub fn apply(&self, reqs: &mut [SimRequest], seed: u64, max_model_len: usize) {
        let patience = self.patience.draw(reqs.len(), seed);
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_0000_0000_0007);
        for (r, p) in reqs.iter_mut().zip(patience) {
            r.max_tokens = self.max_tokens.max_tokens(r.output_len, max_model_len.saturating_sub(r.prompt_len));
            r.patience = p;
            // Drawn for every request, so the same seed marks the same requests at any fraction.
            let u: f64 = rng.random();
            r.priority = if u < self.priority_mix.fraction { self.priority_mix.priority } else { 0 };
        }
    }
}

/// A workload to generate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadSpec {
    /// Arrival process.
    pub arrivals: Arrivals,
    /// Lengths.
    pub lengths: LengthSource,
}

impl WorkloadSpec {
    /// `num` requests at `rate` per second from `seed`. Lengths depend only on the seed, so the
    /// same seed gives the same requests at every rate, only spaced differently. `max_tokens` is
    /// the true length and patience infinite until a [`ClientModel`] is applied.
    pub fn generate(&self, rate: f64, num: usize, seed: u64) -> Vec<SimRequest> {
        let mut len_rng = StdRng::seed_from_u64(seed);
        let mut gap_rng = StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
        let mut t = 0.0;
        (0..num)
            .map(|_| {
                let (prompt_len, output_len) = match &self.lengths {
                    LengthSource::Synthetic { input, output } => (input.sample(&mut len_rng), output.sample(&mut len_rng)),
                    LengthSource::Pairs(p) => p[len_rng.random_range(0..p.len())],
                };
                let r = SimRequest { arrival: t, prompt_len, output_len, max_tokens: output_len, patience: f64::INFINITY, priority: 0 };
                t += self.gap(rate, &mut gap_rng);
                r
            })
            .collect()
    }

    fn gap(&self, rate: f64, rng: &mut StdRng) -> f64 {
        if rate <= 0.0 || !rate.is_finite() {
            return 0.0;
        }
        match self.arrivals {
            Arrivals::Poisson => Exp::new(rate).expect("positive rate").sample(rng),
            Arrivals::Gamma { cv } => {
                let shape = 1.0 / (cv * cv).max(1e-6);
                Gamma::new(shape, 1.0 / (rate * shape)).expect("positive gamma parameters").sample(rng)
            }
        }
    }

    /// Mean (prompt, output) tokens.
    pub fn mean_lengths(&self) -> (f64, f64) {
        match &self.lengths {
            LengthSource::Synthetic { input, output } => (input.mean(), output.mean()),
            LengthSource::Pairs(p) => {
                let n = p.len().max(1) as f64;
                (p.iter().map(|x| x.0 as f64).sum::<f64>() / n, p.iter().map(|x| x.1 as f64).sum::<f64>() / n)
            }
        }
    }
}

#[derive(Deserialize)]
struct ShareGptEntry {
    #[serde(default)]
    conversations: Vec<ShareGptTurn>,
}

#[derive(Deserialize)]
struct ShareGptTurn {
    #[serde(default)]
    from: String,
    #[serde(default)]
    value: String,
}

/// Errors reading a ShareGPT file.
#[derive(Debug, thiserror::Error)]
pub enum ShareGptError {
    /// The file could not be read.
    #[error("reading {0}: {1}")]
    Io(String, std::io::Error),
    /// The file is not ShareGPT JSON.
    #[error("parsing {0}: {1}")]
    Json(String, serde_json::Error),
    /// No conversation survived the filters.
    #[error("{0}: no usable conversation (need a human turn followed by a gpt turn)")]
    Empty(String),
}

/// Tokens of a text without a tokenizer: about four characters per token, the usual rule of
/// thumb for English BPE vocabularies. The simulator only needs lengths.
pub fn approx_tokens(text: &str) -> usize {
    text.chars().count().div_ceil(4).max(1)
}

/// (prompt, output) token pairs from ShareGPT-format JSON text: the first human turn and the
/// reply after it, filtered as `vllm bench serve` does (both at least 4 tokens, prompt at most
/// 1024, sum at most 2048).
pub fn sharegpt_pairs_from_str(json: &str, name: &str) -> Result<Vec<(usize, usize)>, ShareGptError> {
    let entries: Vec<ShareGptEntry> = serde_json::from_str(json).map_err(|e| ShareGptError::Json(name.into(), e))?;
    let pairs: Vec<(usize, usize)> = entries
        .iter()
        .filter_map(|e| {
            let i = e.conversations.iter().position(|t| t.from == "human")?;
            let reply = e.conversations.get(i + 1).filter(|t| t.from == "gpt")?;
            Some((approx_tokens(&e.conversations[i].value), approx_tokens(&reply.value)))
        })
        .filter(|&(p, o)| p >= 4 && o >= 4 && p <= 1024 && p + o <= 2048)
        .collect();
    if pairs.is_empty() {
        return Err(ShareGptError::Empty(name.into()));
    }
    Ok(pairs)
}

/// [`sharegpt_pairs_from_str`] on a file.
pub fn sharegpt_pairs(path: &Path) -> Result<Vec<(usize, usize)>, ShareGptError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ShareGptError::Io(name.clone(), e))?;
    sharegpt_pairs_from_str(&text, &name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_rate_and_reproducibility() {
        let spec = WorkloadSpec {
            arrivals: Arrivals::Poisson,
            lengths: LengthSource::Synthetic { input: Lengths::Uniform(10, 20), output: Lengths::Fixed(5) },
        };
        let a = spec.generate(50.0, 5000, 7);
        let b = spec.generate(50.0, 5000, 7);
        assert_eq!(a, b);
        let rate = 4999.0 / a.last().unwrap().arrival;
        assert!((rate - 50.0).abs() < 2.5, "rate {rate}");
        assert!(a.iter().all(|r| (10..=20).contains(&r.prompt_len) && r.output_len == 5));
        let slow = spec.generate(5.0, 5000, 7);
        assert!(a.iter().zip(&slow).all(|(x, y)| x.prompt_len == y.prompt_len));
    }

    #[test]
    fn gamma_arrivals_are_burstier() {
        let cv_of = |arrivals| {
            let spec = WorkloadSpec { arrivals, lengths: LengthSource::Pairs(vec![(1, 1)]) };
            let r = spec.generate(10.0, 4000, 1);
            let gaps: Vec<f64> = r.windows(2).map(|w| w[1].arrival - w[0].arrival).collect();
            let m = gaps.iter().sum::<f64>() / gaps.len() as f64;
            let v = gaps.iter().map(|g| (g - m).powi(2)).sum::<f64>() / gaps.len() as f64;
            (m, v.sqrt() / m)
        };
        let (m, cv) = cv_of(Arrivals::Gamma { cv: 3.0 });
        assert!((m - 0.1).abs() < 0.02 && cv > 2.0, "mean {m} cv {cv}");
        let (_, cv) = cv_of(Arrivals::Poisson);
        assert!((cv - 1.0).abs() < 0.15);
    }

    #[test]
    fn parses_sharegpt() {
        let json = r#"[
            {"id": "a", "conversations": [{"from": "human", "value": "Tell me a story about a cat."},
                                           {"from": "gpt", "value": "Once upon a time there was a cat who liked fish."}]},
            {"id": "b", "conversations": [{"from": "gpt", "value": "orphan"}]},
            {"id": "c", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello there, friend"}]}
        ]"#;
        let pairs = sharegpt_pairs_from_str(json, "test").unwrap();
        assert_eq!(pairs, vec![(7, 12)]);
        assert!(sharegpt_pairs_from_str("[]", "empty").is_err());
        assert!(sharegpt_pairs_from_str("{", "bad").is_err());
    }
}
