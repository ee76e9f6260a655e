//! A bounded run: send a prepared workload on its schedule (open loop) or through a concurrency
//! cap (closed loop), with a measurement window, and stop by itself.
//!
//! What is counted (evaluation.md, point 1): in an open loop, the requests *scheduled* inside
//! `[T_warmup, T_end]`, fractions of the schedule's span, so every target counts the same
//! requests; requests scheduled later keep the load on. In a closed loop (a concurrency cap with
//! everything scheduled at once), requests by their place in the sequence, the same fractions of
//! the workload, over the first counted send to the last counted end. Once every counted request
//! has ended, the run stops: nothing more is sent, and
//! uncounted requests still in flight are cut (`Aborted`). A burst (everything at once without a
//! cap) counts every request.
//!
//! Every run is bounded three ways besides: the workload has a fixed number of requests,
//! `duration` stops sending new ones, and `time_limit` cuts whatever is still running (those
//! requests end `Aborted` at the limit, with what they had received). Requests that were never
//! sent are counted as not sent and enter no metric.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use pace_scheduler::slo::{measurement_window, MaxTokensRule, SloClass};
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::client::{request_body, Clock, Exchange, Leave, RequestOptions, RequestResult, Target, CUT_AFTER_COUNTED, CUT_BY_TIME_LIMIT};
use crate::dataset::Prompt;

/// The requests of a run and when to send them. Built once, so A/B targets get the same one.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Prompts in send order.
    pub prompts: Vec<Prompt>,
    /// Send offsets in seconds from the start, one per prompt, non-decreasing.
    pub schedule: Vec<f64>,
    /// `max_tokens` sent with each prompt (the client's rule applied to its true length).
    pub max_tokens: Vec<usize>,
    /// Each client's patience, seconds (infinite: it never leaves).
    pub patience: Vec<f64>,
    /// vLLM's `priority` sent with each request (lower is served first), which also weighs the
    /// request's benefit by `2^-priority` (docs/metrics.md). Empty: no `priority` is sent.
    pub priority: Vec<i64>,
}

impl Workload {
    /// `prompts` on `schedule`, each asking for its `output_len`, clients who never leave.
    pub fn new(prompts: Vec<Prompt>, schedule: Vec<f64>) -> Self {
        let max_tokens = prompts.iter().map(|p| p.output_len).collect();
        let patience = vec![f64::INFINITY; prompts.len()];
        Self { prompts, schedule, max_tokens, patience, priority: Vec::new() }
    }
}

/// How a run is driven and bounded.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadOptions {
    /// Most requests in flight; `None`: unbounded (open loop).
    pub max_concurrency: Option<usize>,
    /// Send nothing planned at or after this many seconds.
    pub duration: Option<f64>,
    /// Hard limit on the whole run, seconds: in-flight requests are cut here.
    pub time_limit: f64,
    /// Body options.
    pub request: RequestOptions,
    /// Reading class recorded with each request (smooth goodput) and used by patient clients.
    pub class: SloClass,
    /// Start of the measurement window, fraction of the schedule's span (closed loop: of the
    /// requests).
    pub warmup_fraction: f64,
    /// End of the measurement window, same unit.
    pub window_end_fraction: f64,
    /// Draw a progress bar on stderr (only where stderr is a terminal).
    pub progress: bool,
}

/// What a run produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadRun {
    /// Every request that was sent, in workload order.
    pub results: Vec<RequestResult>,
    /// Workload requests never sent (the run ended first, duration, time limit, or waiting for
    /// a slot at the limit).
    pub not_sent: usize,
    /// The hard time limit cut the run.
    pub time_limit_hit: bool,
    /// Wall time of the whole run, seconds.
    pub wall_s: f64,
    /// Counted requests: workload indices `counted.0..counted.1`.
    pub counted: (usize, usize),
    /// The measurement window, seconds from the start of the run: scheduled times (open loop),
    /// or the first counted send and the last counted end (closed loop), or the first send and
    /// the last end (a burst).
    pub window: (f64, f64),
    /// Requests were held back by a concurrency cap with everything scheduled at once.
    pub closed_loop: bool,
}

impl LoadRun {
    /// The results of the counted requests that were sent.
    pub fn counted_results(&self) -> impl Iterator<Item = &RequestResult> {
        let (lo, hi) = self.counted;
        self.results.iter().filter(move |r| (lo..hi).contains(&r.index))
    }
}

fn progress_bar(n: usize, on: bool) -> ProgressBar {
    if !on {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(n as u64);
    if let Ok(style) = ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} requests {msg}") {
        pb.set_style(style.progress_chars("=> "));
    }
    pb
}

/// The counted index range and the open-loop window of `workload` under `opts`.
fn counted_range(workload: &Workload, opts: &LoadOptions, send_until: f64) -> ((usize, usize), (f64, f64), bool) {
    let planned = workload.schedule.partition_point(|&t| t < send_until);
    let m = planned;
    let span = match (workload.schedule.first(), workload.schedule[..m].last()) {
        (Some(&a), Some(&b)) => (a, b),
        _ => (0.0, 0.0),
    };
    let burst = span.1 <= span.0;
    let closed = burst && opts.max_concurrency.is_some();
    // A window that holds no request (a handful of requests, or --duration cut the schedule)
    // counts them all, as a burst does.
    let everything = ((0, m), (0.0, 0.0), false);
    if closed {
        let at = |f: f64| ((f * m as f64).floor() as usize).min(m);
        let lo = at(opts.warmup_fraction);
        let hi = at(opts.window_end_fraction);
        if hi > lo {
            ((lo, hi), (0.0, 0.0), true)
        } else {
            everything
        }
    } else if burst {
        everything
    } else {
        let (w0, w1) = measurement_window(span.0, span.1, opts.warmup_fraction, opts.window_end_fraction);
        let lo = workload.schedule[..m].partition_point(|&t| t < w0);
        let hi = workload.schedule[..m].partition_point(|&t| t <= w1);
        if hi > lo {
            ((lo, hi), (w0, w1), false)
        } else {
            everything
        }
    }
}

/// Runs `workload` against `target`.
pub async fn run_load(client: &reqwest::Client, target: &Target, workload: &Workload, opts: &LoadOptions) -> LoadRun {
    let clock = Clock::start();
    let hard = clock.at(opts.time_limit);
    let send_until = opts.duration.unwrap_or(f64::INFINITY).min(opts.time_limit);
    let (counted, mut window, closed_loop) = counted_range(workload, opts, send_until);
    let burst = !closed_loop && window == (0.0, 0.0);
    let slots = opts.max_concurrency.map(|n| Arc::new(Semaphore::new(n.max(1))));
    let pb = progress_bar(workload.prompts.len(), opts.progress);
    let target = Arc::new(target.clone());
    // Counted requests still to end; when none are left, `stop` tells everyone.
    let left = Arc::new(AtomicUsize::new(counted.1 - counted.0));
    let (stop_tx, stop_rx) = watch::channel(counted.1 == counted.0);
    let stop_tx = Arc::new(stop_tx);
    // A counted request is done (ended, or will never be sent): the last one stops the run.
    let counted_done = |left: &AtomicUsize, stop_tx: &watch::Sender<bool>, n: usize| {
        if n > 0 && left.fetch_sub(n, Ordering::AcqRel) == n {
            let _ = stop_tx.send(true);
        }
    };
    let mut tasks = JoinSet::new();
    let mut stop = stop_rx.clone();
    let mut spawned_counted = 0;
    for (index, (prompt, &at)) in workload.prompts.iter().zip(&workload.schedule).enumerate() {
        if at >= send_until || *stop.borrow() {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(clock.at(at)) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        // A slot is taken here, in workload order, so requests go out in that order (a closed
        // loop counts by place in the sequence).
        let slot = match &slots {
            Some(s) => {
                let acquired = tokio::select! {
                    p = tokio::time::timeout_at(hard, Arc::clone(s).acquire_owned()) => p.ok().and_then(Result::ok),
                    _ = stop.wait_for(|s| *s) => None,
                };
                match acquired {
                    Some(p) => Some(p),
                    None => break,
                }
            }
            None => None,
        };
        let (client, target, pb) = (client.clone(), Arc::clone(&target), pb.clone());
        let max_tokens = workload.max_tokens.get(index).copied().unwrap_or(prompt.output_len);
        let mut body = request_body(&target, prompt, max_tokens, &opts.request);
        let mut class = opts.class;
        // With a mix, every request says its priority, 0 included: a server's default for
        // requests without one (`pace serve --default-priority`) is not the benchmark's.
        if let Some(&priority) = workload.priority.get(index) {
            if let Some(obj) = body.as_object_mut() {
                obj.insert("priority".into(), serde_json::json!(priority));
            }
            class.weight = SloClass::priority_weight(priority);
        }
        let prompt = prompt.clone();
        let leave = workload.patience.get(index).filter(|p| p.is_finite()).map(|&patience| Leave { class, patience });
        let is_counted = (counted.0..counted.1).contains(&index);
        spawned_counted += usize::from(is_counted);
        let ignore_eos = opts.request.ignore_eos;
        let (left, stop_tx, mut stop) = (Arc::clone(&left), Arc::clone(&stop_tx), stop_rx.clone());
        tasks.spawn(async move {
            let _slot = slot;
            if clock.now() >= send_until || *stop.borrow() {
                counted_done(&left, &stop_tx, usize::from(is_counted));
                return None;
            }
            let mut ex = Exchange::default();
            let cut = tokio::select! {
                // The request goes out before a stop that came meanwhile can cut it, so a sent
                // request always has its send time.
                biased;
                r = tokio::time::timeout_at(hard, ex.run(&client, &target, &body, &clock, leave)) => r.is_err().then_some(CUT_BY_TIME_LIMIT),
                // Only uncounted requests are cut when the counted ones are done.
                _ = stop.wait_for(|s| *s), if !is_counted => Some(CUT_AFTER_COUNTED),
            };
            counted_done(&left, &stop_tx, usize::from(is_counted));
            if !ex.started() {
                return None;
            }
            let mut result = ex.finish(index, at, &prompt, max_tokens, class, cut.map(|why| (clock.now(), why)));
            if ignore_eos {
                // The output runs to max_tokens: that is its true length.
                result.true_len = max_tokens;
            }
            pb.inc(1);
            Some(result)
        });
    }
    // Counted requests the loop never sent (a time limit, --duration) will not end by themselves.
    counted_done(&left, &stop_tx, (counted.1 - counted.0) - spawned_counted);
    let mut results = Vec::with_capacity(workload.prompts.len());
    while let Some(joined) = tasks.join_next().await {
        if let Ok(Some(r)) = joined {
            results.push(r);
        }
    }
    pb.finish_and_clear();
    results.sort_by_key(|r| r.index);
    let time_limit_hit = results.iter().any(|r| r.error.as_deref() == Some(CUT_BY_TIME_LIMIT)) || clock.now() >= opts.time_limit;
    if closed_loop {
        // From the first counted send to the last counted end: with more slots than counted
        // requests, the first counted request and the first one after them both go out at once.
        let mine = results.iter().filter(|r| (counted.0..counted.1).contains(&r.index));
        let (first, last) = mine.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), r| (a.min(r.record.arrival), b.max(r.record.end)));
        window = if first.is_finite() { (first, last.max(first)) } else { (0.0, 0.0) };
    } else if burst {
        let first = results.iter().map(|r| r.record.arrival).fold(f64::INFINITY, f64::min);
        let end = results.iter().map(|r| r.record.end).fold(f64::NEG_INFINITY, f64::max);
        window = if results.is_empty() { (0.0, 0.0) } else { (first, end.max(first)) };
    }
    LoadRun { not_sent: workload.prompts.len() - results.len(), results, time_limit_hit, wall_s: clock.now(), counted, window, closed_loop }
}

/// Template tokens a chat endpoint may add around a prompt, kept free when `max_tokens` is cut
/// to the server's room.
const TEMPLATE_MARGIN: usize = 64;

/// The workload of one run: `prompts` on `schedule`, `max_tokens` by `rule` within the target's
/// room, and the clients' patience.
pub fn workload_for(target: &Target, prompts: &[Prompt], schedule: Vec<f64>, rule: MaxTokensRule, patience: &[f64], priority: &[i64]) -> Workload {
    let max_tokens = prompts
        .iter()
        .map(|p| {
            let room = target.max_model_len.map_or(usize::MAX, |len| len.saturating_sub(p.prompt_len + TEMPLATE_MARGIN).max(1));
            rule.max_tokens(p.output_len, room)
        })
        .collect();
    Workload { prompts: prompts.to_vec(), schedule, max_tokens, patience: patience.to_vec(), priority: priority.to_vec() }
}
