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
    /// The prompt starts with this many tokens of the system prompt every request of the
    /// workload shares ([`Sharing::system`]).
    #[serde(default)]
    pub system: usize,
    /// The conversation this request is a turn of (its prompt re-sends the turns before it).
    #[serde(default)]
    pub turn: Option<Turn>,
    /// The reading rate its client declares (tokens per second; `None`: the SLO's default),
    /// scored and scheduled at that rate ([`ClientModel::reading_rates`]).
    #[serde(default)]
    pub reading_rate: Option<f64>,
    /// The reader stops (aborts the stream) once it has read this many tokens, on time or not: a
    /// "stop" button, not impatience ([`ClientModel::stop_fraction`]).
    #[serde(default)]
    pub stop_after: Option<usize>,
    /// How often the client sends the request again after a refusal, and when
    /// ([`ClientModel::retries`]).
    #[serde(default)]
    pub retry: Retry,
}

/// What a refused client does: send the same request again, up to `max` times, after the
/// server's `Retry-After` or at once.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Retry {
    /// Retries after the first refusal (0: a refusal is final).
    pub max: u32,
    /// Whether it waits the announced `Retry-After` (capped at [`MAX_RETRY_AFTER_S`], as the
    /// official OpenAI client caps it) or comes back at once ([`IMMEDIATE_RETRY_S`]).
    pub honours_retry_after: bool,
}

/// A client that ignores `Retry-After` comes back this long after its refusal (seconds).
pub const IMMEDIATE_RETRY_S: f64 = 0.02;
/// The longest `Retry-After` a client honours (seconds), as the OpenAI client's.
pub const MAX_RETRY_AFTER_S: f64 = 60.0;

/// One turn of a simulated conversation. Its prompt is the system prompt, then the
/// conversation's token stream up to the end of its question: earlier questions and the answers
/// as they were served, then this question. Its answer continues the same stream, so the next
/// turn's prompt holds this one's prompt and answer token for token, as a chat client re-sends
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    /// The conversation.
    pub conversation: u64,
    /// Its place in the conversation, from 0.
    pub index: usize,
    /// Tokens of this turn's question (the rest of the prompt after the system prompt is
    /// history).
    pub question: usize,
    /// Which token stream the turn's history and answer come from: the conversation's, renewed
    /// when its history no longer fits the model and the client starts over.
    pub stream: u64,
}

/// The token stream of the system prompt.
const SYSTEM_STREAM: u64 = u64::MAX;
/// Conversation streams are marked by the top bit; a request of no conversation has a stream of
/// its own, its index.
const CONVERSATION_STREAMS: u64 = 1 << 63;

/// Token `pos` of token stream `stream`: a seeded hash, in `3..32003` (never the simulator's
/// end-of-sequence token), so different streams share no block and a stream is the same
/// wherever it is re-sent.
pub fn stream_token(stream: u64, pos: usize) -> u32 {
    let mut z = stream ^ (pos as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    3 + (z % 32_000) as u32
}

impl SimRequest {
    /// Output tokens it produces if served to the end: `min(output_len, max_tokens)`.
    pub fn served_len(&self) -> usize {
        self.output_len.min(self.max_tokens)
    }

    /// The token stream after the system prompt: its conversation's, or (`index`: its place in
    /// the run) its own.
    fn stream(&self, index: usize) -> u64 {
        self.turn.map_or(index as u64 & !CONVERSATION_STREAMS, |t| t.stream)
    }

    /// The prompt's tokens (`index`: the request's place in the run).
    pub fn prompt_tokens(&self, index: usize) -> Vec<u32> {
        let system = self.system.min(self.prompt_len);
        let stream = self.stream(index);
        (0..system).map(|p| stream_token(SYSTEM_STREAM, p)).chain((0..self.prompt_len - system).map(|p| stream_token(stream, p))).collect()
    }

    /// Output token `n` (from 0): the stream's continuation.
    pub fn output_token(&self, index: usize, n: usize) -> u32 {
        stream_token(self.stream(index), self.prompt_len - self.system.min(self.prompt_len) + n)
    }
}

/// Prompts that share prefixes, as chat traffic does: one system prompt every request starts
/// with, and conversations whose every turn re-sends the history before its new question.
///
/// A conversation's first turn arrives by the workload's arrival process (at the rate over the
/// turns, so requests arrive at the rate); each later turn comes after the user has read the
/// answer at the reading rate (plus a second for the first token) and thought for an exponential
/// time. The schedule is fixed in advance (an open loop): a server that falls behind does not
/// slow its users down, and a turn that arrives before its predecessor was answered still
/// carries the answer in its prompt (but finds less of it cached).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sharing {
    /// Tokens of the shared system prompt.
    pub system: usize,
    /// Turns per conversation (1: every request is on its own).
    pub turns: usize,
    /// Mean think time between reading an answer and sending the next question, seconds.
    pub think_s: f64,
    /// Reading rate of the users, tokens per second.
    pub read_tps: f64,
}

impl Default for Sharing {
    /// No sharing: no system prompt, one turn.
    fn default() -> Self {
        Self { system: 0, turns: 1, think_s: 10.0, read_tps: 20.0 }
    }
}

impl Sharing {
    /// Whether prompts share anything.
    pub fn is_none(&self) -> bool {
        self.system == 0 && self.turns <= 1
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
    /// Each request's declared reading rate, uniform over `(min, max)` tokens per second
    /// (`None`: every request at the SLO's default rate).
    #[serde(default)]
    pub reading_rates: Option<(f64, f64)>,
    /// The share of readers who stop partway through an answer (on time, not out of patience):
    /// each stops after a uniform share of the tokens it would be served.
    #[serde(default)]
    pub stop_fraction: f64,
    /// Retries after a refusal: up to `max` each, and the share of clients that honour
    /// `Retry-After` (the others come back at once).
    #[serde(default)]
    pub retries: Retries,
}

/// How refused clients retry: every client up to `max` times; a share `honour` of them waits
/// the announced `Retry-After`, the rest comes back at once.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Retries {
    /// Retries per request after its first refusal.
    pub max: u32,
    /// Share of clients that honour `Retry-After`, in `[0, 1]`.
    pub honour: f64,
}

impl std::str::FromStr for Retries {
    type Err = String;

    /// `none`, or `MAX:HONOUR` (retries per request, share of clients that honour Retry-After).
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "none" {
            return Ok(Self::default());
        }
        let bad =
            || format!("retries `{s}`: expected none or MAX:HONOUR, e.g. 2:0.5 (MAX retries per request, HONOUR in [0, 1] the share that waits Retry-After)");
        let (m, h) = s.split_once(':').ok_or_else(bad)?;
        let max = m.trim().parse::<u32>().ok().filter(|m| *m <= 100).ok_or_else(bad)?;
        let honour = h.trim().parse::<f64>().ok().filter(|h| (0.0..=1.0).contains(h)).ok_or_else(bad)?;
        Ok(Self { max, honour })
    }
}

impl std::fmt::Display for Retries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.max == 0 {
            write!(f, "none")
        } else {
            write!(f, "{}:{}", self.max, self.honour)
        }
    }
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

impl PriorityMix {
    /// Each of `n` requests' priority, drawn from `seed`: the simulator's clients and
    /// `pace bench --priority-mix` mark the same requests for the same seed (one draw per
    /// request, so the same seed marks the same requests at any fraction).
    pub fn draw(&self, n: usize, seed: u64) -> Vec<i64> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_0000_0000_0007);
        (0..n)
            .map(|_| {
                let u: f64 = rng.random();
                if u < self.fraction {
                    self.priority
                } else {
                    0
                }
            })
            .collect()
    }

    /// Whether no request gets a priority other than 0.
    pub fn is_none(&self) -> bool {
        self.fraction == 0.0 || self.priority == 0
    }
}

impl std::fmt::Display for PriorityMix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.fraction, self.priority)
    }
}

impl Default for ClientModel {
    /// The oracle of old runs: `max_tokens` is the true length and nobody leaves.
    fn default() -> Self {
        Self {
            max_tokens: MaxTokensRule::Exact,
            patience: Patience::None,
            priority_mix: PriorityMix::default(),
            reading_rates: None,
            stop_fraction: 0.0,
            retries: Retries::default(),
        }
    }
}

impl ClientModel {
    /// The realistic clients of published runs (issue 42): readers from 3 to 15 tokens a
    /// second, one in ten stopping partway, up to two retries after a refusal (as the OpenAI
    /// client's default), half of the clients waiting `Retry-After`.
    pub fn realistic(max_tokens: MaxTokensRule, patience: Patience) -> Self {
        Self { max_tokens, patience, reading_rates: Some((3.0, 15.0)), stop_fraction: 0.1, retries: Retries { max: 2, honour: 0.5 }, ..Self::default() }
    }

    /// Sets `max_tokens` (within `max_model_len`), a seeded patience, priority, reading rate,
    /// stopping point and retry behaviour on every request (each from its own stream of the
    /// seed, so turning one on leaves the others' draws as they were).
    ///
    /// Conversation turns (in arrival order) get their histories here, from the answers as
    /// `max_tokens` lets them be served; a history that leaves no room in the model for the
    /// next answer is dropped and the conversation starts over on a new stream, as a chat
    /// client does when the context is full.
    pub fn apply(&self, reqs: &mut [SimRequest], seed: u64, max_model_len: usize) {
        let patience = self.patience.draw(reqs.len(), seed);
        let priorities = self.priority_mix.draw(reqs.len(), seed);
        let mut rate_rng = StdRng::seed_from_u64(seed ^ 0x4ead_0000_0000_0013);
        let mut stop_rng = StdRng::seed_from_u64(seed ^ 0x5709_0000_0000_0017);
        let mut retry_rng = StdRng::seed_from_u64(seed ^ 0x4e74_0000_0000_001d);
        // Per conversation: (stream length so far, restarts).
        let mut history: std::collections::HashMap<u64, (usize, u64)> = std::collections::HashMap::new();
        for ((r, p), priority) in reqs.iter_mut().zip(patience).zip(priorities) {
            if let Some(turn) = r.turn.as_mut() {
                let (len, restarts) = history.entry(turn.conversation).or_insert((0, 0));
                let room = |len: usize| max_model_len.saturating_sub(r.system + len + turn.question);
                if *len > 0 && room(*len) < r.output_len.min(max_model_len / 4).max(1) + 1 {
                    *len = 0;
                    *restarts += 1;
                }
                turn.stream = CONVERSATION_STREAMS | turn.conversation << 16 | (*restarts & 0xffff);
                r.prompt_len = r.system + *len + turn.question;
            }
            r.max_tokens = self.max_tokens.max_tokens(r.output_len, max_model_len.saturating_sub(r.prompt_len));
            if let Some(turn) = r.turn {
                history.get_mut(&turn.conversation).expect("inserted above").0 += turn.question + r.served_len();
            }
            r.patience = p;
            r.priority = priority;
            let (u_rate, u_stop, u_at, u_honour): (f64, f64, f64, f64) = (rate_rng.random(), stop_rng.random(), stop_rng.random(), retry_rng.random());
            r.reading_rate = self.reading_rates.map(|(lo, hi)| lo + (hi - lo).max(0.0) * u_rate);
            r.stop_after = (u_stop < self.stop_fraction).then(|| ((r.served_len() as f64 * u_at).floor() as usize).max(1));
            r.retry = Retry { max: self.retries.max, honours_retry_after: u_honour < self.retries.honour };
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
    /// Shared prefixes (a system prompt, conversations); the prompt lengths of `lengths` are
    /// then those of the questions.
    #[serde(default)]
    pub sharing: Sharing,
}

impl WorkloadSpec {
    /// `num` requests at `rate` per second from `seed`. Lengths depend only on the seed, so the
    /// same seed gives the same requests at every rate, only spaced differently. `max_tokens` is
    /// the true length and patience infinite until a [`ClientModel`] is applied.
    ///
    /// With conversations ([`Sharing::turns`] above 1) conversations start at `rate / turns` and
    /// their turns interleave; the first `num` requests to arrive are returned, their histories
    /// sized as if every answer were served in full until [`ClientModel::apply`] sizes them by
    /// `max_tokens`.
    pub fn generate(&self, rate: f64, num: usize, seed: u64) -> Vec<SimRequest> {
        let mut len_rng = StdRng::seed_from_u64(seed);
        let mut gap_rng = StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
        let sample = |rng: &mut StdRng| match &self.lengths {
            LengthSource::Synthetic { input, output } => (input.sample(rng), output.sample(rng)),
            LengthSource::Pairs(p) => p[rng.random_range(0..p.len())],
        };
        let system = self.sharing.system;
        let mut t = 0.0;
        let new = |arrival, question: usize, output_len, turn| SimRequest {
            arrival,
            prompt_len: system + question,
            output_len,
            max_tokens: output_len,
            patience: f64::INFINITY,
            priority: 0,
            system,
            turn,
            reading_rate: None,
            stop_after: None,
            retry: Retry::default(),
        };
        let turns = self.sharing.turns.max(1);
        if turns == 1 {
            return (0..num)
                .map(|_| {
                    let (question, output_len) = sample(&mut len_rng);
                    let r = new(t, question, output_len, None);
                    t += self.gap(rate, &mut gap_rng);
                    r
                })
                .collect();
        }
        let mut think_rng = StdRng::seed_from_u64(seed ^ 0x7417_0000_0000_0011);
        let think = Exp::new(1.0 / self.sharing.think_s.max(1e-9)).expect("positive think time");
        let conversations = num.div_ceil(turns) * 2 + 1;
        let mut reqs = Vec::with_capacity(conversations * turns);
        for c in 0..conversations as u64 {
            let mut at = t;
            let mut history = 0;
            for index in 0..turns {
                let (question, output_len) = sample(&mut len_rng);
                let stream = CONVERSATION_STREAMS | c << 16;
                let mut r = new(at, question, output_len, Some(Turn { conversation: c, index, question, stream }));
                r.prompt_len += history;
                reqs.push(r);
                history += question + output_len;
                if rate.is_finite() {
                    at += 1.0 + output_len as f64 / self.sharing.read_tps.max(1e-9) + think.sample(&mut think_rng);
                }
            }
            t += self.gap(rate / turns as f64, &mut gap_rng);
        }
        reqs.sort_by(|a, b| a.arrival.total_cmp(&b.arrival));
        reqs.truncate(num);
        reqs
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

    /// Mean (question, output) tokens: the prompt without the system prompt and history.
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
            sharing: Sharing::default(),
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
            let spec = WorkloadSpec { arrivals, lengths: LengthSource::Pairs(vec![(1, 1)]), sharing: Sharing::default() };
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

    /// Realistic clients: reading rates spread over their range, about the stop fraction
    /// stopping partway (never past their answer), every client allowed the retries and about the
    /// honouring share waiting Retry-After; turning them on changes no other draw.
    #[test]
    fn realistic_clients_draw_rates_stops_and_retries() {
        let spec = WorkloadSpec { arrivals: Arrivals::Poisson, lengths: LengthSource::Pairs(vec![(40, 100), (40, 10)]), sharing: Sharing::default() };
        let base = spec.generate(1.0, 4000, 3);
        let (mut plain, mut real) = (base.clone(), base);
        ClientModel { max_tokens: MaxTokensRule::Cap(1024), patience: Patience::Exp(20.0), ..ClientModel::default() }.apply(&mut plain, 3, 4096);
        ClientModel::realistic(MaxTokensRule::Cap(1024), Patience::Exp(20.0)).apply(&mut real, 3, 4096);
        assert!(plain.iter().zip(&real).all(|(a, b)| a.patience == b.patience && a.max_tokens == b.max_tokens && a.priority == b.priority));
        assert!(plain.iter().all(|r| r.reading_rate.is_none() && r.stop_after.is_none() && r.retry == Retry::default()));
        let rates: Vec<f64> = real.iter().map(|r| r.reading_rate.unwrap()).collect();
        assert!(rates.iter().all(|q| (3.0..=15.0).contains(q)));
        assert!(rates.iter().any(|&q| q < 4.0) && rates.iter().any(|&q| q > 14.0));
        let stops = real.iter().filter(|r| r.stop_after.is_some()).count();
        assert!((300..500).contains(&stops), "{stops} of 4000 stop");
        assert!(real.iter().all(|r| r.stop_after.is_none_or(|k| k >= 1 && k <= r.served_len())));
        assert!(real.iter().all(|r| r.retry.max == 2));
        let honour = real.iter().filter(|r| r.retry.honours_retry_after).count();
        assert!((1800..2200).contains(&honour), "{honour} of 4000 honour Retry-After");
        assert_eq!("2:0.5".parse::<Retries>(), Ok(Retries { max: 2, honour: 0.5 }));
        assert_eq!("none".parse::<Retries>(), Ok(Retries::default()));
        assert!("2".parse::<Retries>().is_err() && "1:1.5".parse::<Retries>().is_err());
    }

    /// Every turn re-sends the one before it, prompt and answer (as served, up to the
    /// end-of-sequence token, whose position the next question starts at) token for token;
    /// conversations share the system prompt and nothing else; requests still arrive at the rate.
    #[test]
    fn conversations_resend_their_history_token_for_token() {
        let spec = WorkloadSpec {
            arrivals: Arrivals::Poisson,
            lengths: LengthSource::Synthetic { input: Lengths::Uniform(10, 30), output: Lengths::Uniform(5, 60) },
            sharing: Sharing { system: 40, turns: 4, think_s: 2.0, read_tps: 20.0 },
        };
        let mut reqs = spec.generate(2.0, 2000, 5);
        assert_eq!(reqs.len(), 2000);
        assert!(reqs.windows(2).all(|w| w[0].arrival <= w[1].arrival));
        ClientModel { max_tokens: MaxTokensRule::Cap(40), ..ClientModel::default() }.apply(&mut reqs, 5, 4096);
        // Steady rate over the middle of the run (conversations start at rate / turns).
        let (a, b) = (reqs[500].arrival, reqs[1500].arrival);
        let rate = 1000.0 / (b - a);
        assert!((rate - 2.0).abs() < 0.3, "rate {rate}");
        let mut by_conv: std::collections::HashMap<u64, Vec<usize>> = std::collections::HashMap::new();
        for (i, r) in reqs.iter().enumerate() {
            by_conv.entry(r.turn.expect("a turn").conversation).or_default().push(i);
        }
        let mut checked = 0;
        for turns in by_conv.values() {
            for (k, w) in turns.windows(2).enumerate() {
                let (p, n) = (&reqs[w[0]], &reqs[w[1]]);
                assert_eq!((p.turn.unwrap().index, n.turn.unwrap().index), (k, k + 1));
                assert!(p.arrival < n.arrival);
                let (pt, nt) = (p.prompt_tokens(w[0]), n.prompt_tokens(w[1]));
                let answer: Vec<u32> = (0..p.served_len()).map(|j| p.output_token(w[0], j)).collect();
                assert_eq!(n.prompt_len, p.prompt_len + p.served_len() + n.turn.unwrap().question);
                assert_eq!(&nt[..pt.len()], &pt[..], "the history starts with the last prompt");
                assert_eq!(&nt[pt.len()..pt.len() + answer.len()], &answer[..], "then its answer");
                checked += 1;
            }
        }
        assert!(checked > 1000, "{checked}");
        // Two conversations: the system prompt in common, then different streams.
        let j = reqs.iter().position(|r| r.turn.unwrap().conversation != reqs[0].turn.unwrap().conversation).unwrap();
        let (x, y) = (reqs[0].prompt_tokens(0), reqs[j].prompt_tokens(j));
        assert_eq!(x[..40], y[..40]);
        assert!(x[40..].iter().zip(&y[40..]).filter(|(a, b)| a == b).count() < 2);
        assert!(x.iter().chain(&y).all(|&t| t >= 3));
    }

    /// A history that leaves no room for the next answer is dropped: the conversation starts
    /// over on a new stream, and no prompt plus its `max_tokens` exceeds the model.
    #[test]
    fn a_conversation_that_outgrows_the_model_starts_over() {
        let spec = WorkloadSpec {
            arrivals: Arrivals::Poisson,
            lengths: LengthSource::Synthetic { input: Lengths::Fixed(50), output: Lengths::Fixed(100) },
            sharing: Sharing { system: 100, turns: 10, think_s: 1.0, read_tps: 20.0 },
        };
        let mut reqs = spec.generate(1.0, 300, 2);
        ClientModel { max_tokens: MaxTokensRule::Cap(1024), ..ClientModel::default() }.apply(&mut reqs, 2, 600);
        for r in &reqs {
            assert!(r.prompt_len + r.served_len() <= 600 && r.served_len() == 100, "prompts fit with their answers: {r:?}");
        }
        let restarted: Vec<&SimRequest> = reqs.iter().filter(|r| r.turn.unwrap().index > 0 && r.prompt_len == 150).collect();
        assert!(!restarted.is_empty());
        let first = reqs.iter().find(|r| r.turn.unwrap().index == 0 && r.turn.unwrap().conversation == restarted[0].turn.unwrap().conversation).unwrap();
        assert_ne!(first.turn.unwrap().stream, restarted[0].turn.unwrap().stream, "a new stream");
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
