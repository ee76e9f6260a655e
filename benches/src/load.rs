//! Open-loop load: send a prepared workload on its schedule, with an optional concurrency cap,
//! and stop by itself.
//!
//! Every run is bounded three ways: the workload has a fixed number of requests, `duration`
//! stops sending new ones, and `time_limit` cuts whatever is still running (those requests end
//! `Aborted` at the limit, with what they had received). Requests that a concurrency cap or the
//! limits kept from being sent are counted as not sent and enter no metric.

use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use pace_scheduler::slo::SloClass;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::client::{request_body, Clock, Exchange, RequestOptions, RequestResult, Target, CUT_BY_TIME_LIMIT};
use crate::dataset::Prompt;

/// The requests of a run and when to send them. Built once, so A/B targets get the same one.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Prompts in send order.
    pub prompts: Vec<Prompt>,
    /// Send offsets in seconds from the start, one per prompt, non-decreasing.
    pub schedule: Vec<f64>,
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
    /// Reading class recorded with each request (smooth goodput).
    pub class: SloClass,
    /// Draw a progress bar on stderr (only where stderr is a terminal).
    pub progress: bool,
}

/// What a run produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadRun {
    /// Every request that was sent, in workload order.
    pub results: Vec<RequestResult>,
    /// Workload requests never sent (duration, time limit, or waiting for a slot at the limit).
    pub not_sent: usize,
    /// The hard time limit cut the run.
    pub time_limit_hit: bool,
    /// Wall time of the whole run, seconds.
    pub wall_s: f64,
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

/// Runs `workload` against `target`.
pub async fn run_load(client: &reqwest::Client, target: &Target, workload: &Workload, opts: &LoadOptions) -> LoadRun {
    let clock = Clock::start();
    let hard = clock.at(opts.time_limit);
    let send_until = opts.duration.unwrap_or(f64::INFINITY).min(opts.time_limit);
    let slots = opts.max_concurrency.map(|n| Arc::new(Semaphore::new(n.max(1))));
    let pb = progress_bar(workload.prompts.len(), opts.progress);
    let target = Arc::new(target.clone());
    let mut tasks = JoinSet::new();
    let mut planned = 0;
    for (index, (prompt, &at)) in workload.prompts.iter().zip(&workload.schedule).enumerate() {
        if at >= send_until {
            break;
        }
        tokio::time::sleep_until(clock.at(at)).await;
        planned += 1;
        let (client, target, slots, pb) = (client.clone(), Arc::clone(&target), slots.clone(), pb.clone());
        let body = request_body(&target, prompt, &opts.request);
        let (prompt, class) = (prompt.clone(), opts.class);
        tasks.spawn(async move {
            let _slot = match slots {
                Some(s) => match tokio::time::timeout_at(hard, s.acquire_owned()).await {
                    Ok(Ok(permit)) => Some(permit),
                    _ => return None,
                },
                None => None,
            };
            if clock.now() >= send_until {
                return None;
            }
            let mut ex = Exchange::default();
            let cut = tokio::time::timeout_at(hard, ex.run(&client, &target, &body, &clock)).await.is_err();
            let result = ex.finish(index, at, &prompt, class, cut.then(|| clock.now()));
            pb.inc(1);
            Some(result)
        });
    }
    let mut results = Vec::with_capacity(planned);
    while let Some(joined) = tasks.join_next().await {
        if let Ok(Some(r)) = joined {
            results.push(r);
        }
    }
    pb.finish_and_clear();
    results.sort_by_key(|r| r.index);
    let time_limit_hit = results.iter().any(|r| r.error.as_deref() == Some(CUT_BY_TIME_LIMIT)) || clock.now() >= opts.time_limit;
    LoadRun { not_sent: workload.prompts.len() - results.len(), results, time_limit_hit, wall_s: clock.now() }
}
