//! The benchmark client against a scripted SSE server on 127.0.0.1: every metric checked against
//! the script's ground truth (timer tolerance 30 ms, scripted delays 50-400 ms), outcomes
//! counted apart, and every run bounded in requests and seconds.

mod common;

use std::time::Instant;

use pace_bench::client::{RequestOptions, Target};
use pace_bench::dataset::Prompt;
use pace_bench::load::{run_load, LoadOptions, Workload};
use pace_bench::report::{summarize, table, RunInfo};
use pace_scheduler::slo::{Outcome, Patience, SloClass, SloParams};

/// Timer tolerance, seconds: holds on a loaded 2-core machine.
const TOL: f64 = 0.030;

fn close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= TOL, "{what}: got {got:.4}, want {want:.4} ± {TOL}");
}

fn prompt(name: &str, max_tokens: usize) -> Prompt {
    Prompt { text: name.to_string(), prompt_len: 4, output_len: max_tokens }
}

fn target(base_url: &str, endpoint: &str) -> Target {
    Target {
        label: "scripted".into(),
        base_url: base_url.into(),
        endpoint: endpoint.into(),
        model: "scripted-model".into(),
        api_key: None,
        max_model_len: None,
    }
}

fn options(class: SloClass, usage: bool) -> LoadOptions {
    LoadOptions {
        max_concurrency: None,
        duration: None,
        time_limit: 10.0,
        request: RequestOptions { ignore_eos: true, include_usage: usage, temperature: 0.0, extra_body: Default::default() },
        class,
        warmup_fraction: 0.1,
        window_end_fraction: 0.8,
        progress: false,
    }
}

fn info(params: SloParams) -> RunInfo {
    RunInfo {
        label: "scripted".into(),
        backend: "openai".into(),
        url: String::new(),
        model_id: "scripted-model".into(),
        tokenizer_id: "none".into(),
        num_prompts: 0,
        request_rate: f64::INFINITY,
        burstiness: 1.0,
        max_concurrency: None,
        seed: 0,
        params,
        has_slo: true,
        priority_mix: None,
    }
}

const SCENARIOS: [&str; 9] = ["steady", "multi", "slow", "reject429", "reject503", "http500", "midstream", "drop", "broken"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_match_the_script() {
    let base = common::start(common::Cfg::new(50, 20)).await;
    let client = pace_bench::client::http_client(64).unwrap();
    let class = SloClass::new(20.0, 0.0);
    let params = SloParams { binary: "ttft:300 tpot:150".parse().unwrap(), default_class: class, ..Default::default() };
    let workload = Workload::new(SCENARIOS.iter().map(|s| prompt(s, 8)).collect(), vec![0.0; SCENARIOS.len()]);
    let t0 = Instant::now();
    let run = run_load(&client, &target(&base, "/v1/completions"), &workload, &options(class, true)).await;
    assert!(t0.elapsed().as_secs_f64() < 30.0, "the run ends when its last script does, not at a timeout");
    assert_eq!((run.results.len(), run.not_sent, run.time_limit_hit), (9, 0, false));
    let by = |name: &str| &run.results[SCENARIOS.iter().position(|s| *s == name).unwrap()];

    // steady: tokens at 150, 250, ..., 550 ms; deadlines i / 20 s, so lateness peaks at the last
    // token: 0.55 - 0.25 = 0.30 s; benefit 5 - 2.5 * 0.30 = 4.25.
    let s = &by("steady").record;
    assert_eq!((s.outcome, s.num_tokens()), (Outcome::Completed, 5));
    close(s.ttft().unwrap(), 0.150, "steady TTFT");
    for itl in s.itls() {
        close(itl, 0.100, "steady ITL");
    }
    close(s.tpot(), 0.100, "steady TPOT");
    close(s.e2e().unwrap(), 0.550, "steady E2E");
    close(s.idle_latency(), 0.300, "steady idle latency");
    assert!((s.benefit(&params) - 4.25).abs() <= 2.5 * TOL, "steady benefit {}", s.benefit(&params));
    assert_eq!(by("steady").usage_completion_tokens, Some(5));

    // multi: usage says 3 tokens over 2 frames; the extra token is put at the last frame.
    let m = &by("multi").record;
    assert_eq!((m.outcome, m.num_tokens(), by("multi").content_frames), (Outcome::Completed, 3, 2));
    close(m.token_times[0] - m.arrival, 0.100, "multi t1");
    close(m.token_times[1] - m.arrival, 0.300, "multi t2");
    close(m.token_times[2] - m.arrival, 0.300, "multi t3");
    close(m.idle_latency(), 0.200, "multi idle");

    let slow = &by("slow").record;
    assert_eq!(slow.outcome, Outcome::Completed);
    close(slow.ttft().unwrap(), 0.400, "slow TTFT");
    close(slow.tpot(), 0.050, "slow TPOT");
    close(slow.idle_latency(), 0.350, "slow idle");

    // Refusals: rejected (429/503, Retry-After kept) and failed (500) are told apart.
    for (name, status, retry) in [("reject429", 429, Some(2.0)), ("reject503", 503, Some(1.0))] {
        let r = by(name);
        assert_eq!((r.record.outcome, r.status, r.retry_after), (Outcome::Rejected, Some(status), retry));
        assert!(r.record.token_times.is_empty() && r.error.as_deref().unwrap().contains("scripted refusal"));
    }
    assert_eq!((by("http500").record.outcome, by("http500").status), (Outcome::Failed, Some(500)));

    // Mid-stream ends keep what was delivered and the wait for the token that never came:
    // pending since d_3 = 0.15 s until the error at 0.3 s.
    for name in ["midstream", "broken"] {
        let r = &by(name).record;
        assert_eq!((r.outcome, r.num_tokens()), (Outcome::Failed, 2), "{name}");
        close(r.end - r.arrival, 0.300, name);
        close(r.idle_latency(), 0.150, name);
    }
    assert!(by("midstream").error.as_deref().unwrap().contains("internal_error"));
    assert!(by("broken").error.as_deref().unwrap().contains("stream broke"));
    let d = &by("drop").record;
    assert_eq!((d.outcome, d.num_tokens()), (Outcome::Dropped, 1));
    close(d.idle_latency(), 0.200, "drop idle (pending since d_2 = 0.1 s)");

    // Aggregates: a burst counts every request, over first send .. last end (steady's last
    // token at ~0.55 s).
    let r = summarize(&run, &info(params));
    assert_eq!((r.counted, run.closed_loop), (9, false));
    assert_eq!((r.completed, r.failed, r.rejected, r.dropped, r.aborted), (3, 3, 2, 1, 0));
    close(r.duration, 0.550, "window");
    let w = r.duration;
    assert!((r.request_goodput.unwrap() - 2.0 / w).abs() < 1e-9, "steady and multi pass ttft:300 tpot:150");
    assert!((r.token_goodput.unwrap() - 8.0 / w).abs() < 1e-9);
    assert!((r.attainment.unwrap() - 2.0 / 3.0).abs() < 1e-9);
    assert!((r.attainment_offered.unwrap() - 2.0 / 9.0).abs() < 1e-9);
    assert!((r.request_throughput - 3.0 / w).abs() < 1e-9);
    assert_eq!(r.total_output_tokens, 5 + 3 + 3 + 2 + 1 + 2);
    // Benefits: steady 4.25, multi 3 - 2.5 * 0.2 = 2.5, slow 3 - 2.5 * 0.35 = 2.125,
    // midstream and broken 2 - 2.5 * 0.15 = 1.625 each, drop 1 - 2.5 * 0.2 = 0.5, refusals 0.
    let want_benefit = 4.25 + 2.5 + 2.125 + 1.625 + 1.625 + 0.5;
    let got_benefit = r.smooth_goodput * w;
    assert!((got_benefit - want_benefit).abs() <= 6.0 * 2.5 * TOL, "benefit sum {got_benefit} want {want_benefit}");
    let sum: f64 = run.results.iter().map(|x| x.record.benefit(&params)).sum();
    assert!((got_benefit - sum).abs() < 1e-9);
    close(r.latency_ms["median_ttft_ms"] / 1e3, 0.100, "median TTFT over 6 streams with a token");
    close(r.latency_ms["max_idle_ms"] / 1e3, 0.350, "max idle");
    let t = table(&r);
    for row in ["Successful requests:", "Rejected requests (429/503):", "Smooth goodput", "P99 Idle (ms):", "Mean TPOT (ms):"] {
        assert!(t.contains(row), "{row} missing from\n{t}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_usage_each_content_frame_is_one_token_and_chat_works() {
    let base = common::start(common::Cfg::new(50, 20)).await;
    let client = pace_bench::client::http_client(8).unwrap();
    let class = SloClass::default();
    let workload = Workload::new(vec![prompt("multi", 3), prompt("steady", 5)], vec![0.0, 0.0]);
    let run = run_load(&client, &target(&base, "/v1/completions"), &workload, &options(class, false)).await;
    let m = &run.results[0];
    assert_eq!((m.record.num_tokens(), m.usage_completion_tokens), (2, None));
    close(m.record.token_times[1] - m.record.token_times[0], 0.200, "frame gap");
    let chat = run_load(&client, &target(&base, "/v1/chat/completions"), &workload, &options(class, true)).await;
    assert_eq!(chat.results[1].record.outcome, Outcome::Completed);
    assert_eq!(chat.results[1].record.num_tokens(), 5);
    close(chat.results[1].record.ttft().unwrap(), 0.150, "chat TTFT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_limit_cuts_streams_and_duration_stops_sending() {
    let base = common::start(common::Cfg::new(50, 20)).await;
    let client = pace_bench::client::http_client(8).unwrap();
    let class = SloClass::default();
    // A stalled stream and a schedule that would go on for 3 s.
    let mut prompts = vec![prompt("stall", 2)];
    prompts.extend((0..10).map(|_| prompt("default", 2)));
    let schedule: Vec<f64> = (0..11).map(|i| i as f64 * 0.3).collect();
    let workload = Workload::new(prompts, schedule);
    let opts = LoadOptions { time_limit: 1.0, duration: Some(0.5), ..options(class, true) };
    let t0 = Instant::now();
    let run = run_load(&client, &target(&base, "/v1/completions"), &workload, &opts).await;
    let wall = t0.elapsed().as_secs_f64();
    assert!(wall < 1.5, "the run stops at its time limit (took {wall:.2} s)");
    // Sent at 0 and 0.3 s; 0.6 s and later are past --duration.
    assert_eq!((run.results.len(), run.not_sent), (2, 9));
    let stall = &run.results[0].record;
    assert_eq!((stall.outcome, stall.num_tokens()), (Outcome::Aborted, 1));
    close(stall.end, 1.0, "cut at the time limit");
    assert_eq!(run.results[1].record.outcome, Outcome::Completed);
    assert!(run.time_limit_hit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_cap_holds_requests_back() {
    let cfg = common::Cfg::new(100, 60);
    let base = common::start(cfg.clone()).await;
    let client = pace_bench::client::http_client(8).unwrap();
    let workload = Workload::new((0..3).map(|_| prompt("default", 3)).collect(), vec![0.0; 3]);
    // Every request counted, so the closed loop runs to the last one.
    let opts = LoadOptions { max_concurrency: Some(1), window_end_fraction: 1.0, ..options(SloClass::default(), true) };
    let run = run_load(&client, &target(&base, "/v1/completions"), &workload, &opts).await;
    assert_eq!(run.results.len(), 3);
    let mut spans: Vec<(f64, f64)> = run.results.iter().map(|r| (r.record.arrival, r.record.end)).collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    for w in spans.windows(2) {
        assert!(w[1].0 >= w[0].1 - 0.005, "one in flight at a time: {spans:?}");
    }
    for r in &run.results {
        // Arrival is the send time, so TTFT does not include the wait for a slot.
        close(r.record.ttft().unwrap(), 0.100, "TTFT from the send");
        close(r.record.tpot(), 0.060, "TPOT");
    }
    assert_eq!(cfg.hits.load(std::sync::atomic::Ordering::SeqCst), 3);
}

/// A client with `fixed:1` patience closes the connection when its idle latency reaches 1 s,
/// judged from its own frame times, and the server sees the disconnect; a client whose stream
/// keeps up stays to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impatient_client_disconnects_and_the_server_sees_it() {
    let cfg = common::Cfg::new(50, 20);
    let base = common::start(cfg.clone()).await;
    let client = pace_bench::client::http_client(8).unwrap();
    let class = SloClass::new(20.0, 0.0);
    let mut workload = Workload::new(vec![prompt("stall", 2), prompt("steady", 5)], vec![0.0, 0.0]);
    workload.patience = Patience::Fixed(1.0).draw(2, 0);
    let t0 = Instant::now();
    let run = run_load(&client, &target(&base, "/v1/completions"), &workload, &options(class, true)).await;
    assert!(t0.elapsed().as_secs_f64() < 5.0, "the client did not wait out the 10 s stall");
    // stall: one token at 100 ms; token 2 was due at 2 / 20 = 0.1 s, so it leaves at 1.1 s.
    let s = &run.results[0];
    assert_eq!((s.record.outcome, s.record.num_tokens()), (Outcome::Abandoned, 1));
    close(s.record.end - s.record.arrival, 1.1, "left at d_2 + 1 s");
    close(s.record.idle_latency(), 1.0, "idle latency at departure is the patience");
    assert_eq!(s.error.as_deref(), Some(pace_bench::client::PATIENCE_RAN_OUT));
    // steady's idle latency peaks at 0.3 s: it stays.
    assert_eq!(run.results[1].record.outcome, Outcome::Completed);
    let seen = Instant::now();
    while cfg.disconnects.load(std::sync::atomic::Ordering::SeqCst) == 0 && seen.elapsed().as_secs_f64() < 3.0 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(cfg.disconnects.load(std::sync::atomic::Ordering::SeqCst), 1, "the server saw exactly one client leave");
    let r = summarize(&run, &info(SloParams { default_class: class, ..Default::default() }));
    assert_eq!((r.abandoned, r.completed), (1, 1));
    assert!((r.abandoned_frac - 0.5).abs() < 1e-12);
    assert!(r.wasted_tokens_frac > 0.0 && r.wasted_tokens_frac < 1.0, "its prompt and token were work for nobody");
}

/// Open loop: only requests scheduled in the window are counted; once they have all ended the
/// run stops sending, so the tail of the schedule is never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_counts_the_window_and_stops_when_the_counted_requests_end() {
    let base = common::start(common::Cfg::new(30, 10)).await;
    let client = pace_bench::client::http_client(64).unwrap();
    let class = SloClass::default();
    let schedule: Vec<f64> = (0..30).map(|i| i as f64 * 0.05).collect();
    let workload = Workload::new((0..30).map(|_| prompt("default", 2)).collect(), schedule);
    // Span 1.45 s: the window is [0.145, 0.435] s, requests 3..=8.
    let opts = LoadOptions { window_end_fraction: 0.3, ..options(class, true) };
    let run = run_load(&client, &target(&base, "/v1/completions"), &workload, &opts).await;
    assert_eq!(run.counted, (3, 9));
    assert!((run.window.0 - 0.145).abs() < 1e-9 && (run.window.1 - 0.435).abs() < 1e-9);
    assert!(run.not_sent >= 10, "requests scheduled a second after the counted ones ended were not sent ({})", run.not_sent);
    let r = summarize(&run, &info(SloParams::default()));
    assert_eq!((r.counted, r.completed), (6, 6));
    close(r.duration, 0.29, "the window, not the run");
    assert!(r.wall_s < 1.2);
    assert!((r.benefit_per_request - r.smooth_goodput * r.duration / 6.0).abs() < 1e-9);
}

/// Closed loop: a concurrency cap with everything scheduled at once counts a share of the
/// sequence, and scores benefit per request sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_counts_by_place_in_the_sequence() {
    let base = common::start(common::Cfg::new(30, 10)).await;
    let client = pace_bench::client::http_client(8).unwrap();
    let workload = Workload::new((0..10).map(|_| prompt("default", 2)).collect(), vec![0.0; 10]);
    let opts = LoadOptions { max_concurrency: Some(2), ..options(SloClass::default(), true) };
    let run = run_load(&client, &target(&base, "/v1/completions"), &workload, &opts).await;
    assert!(run.closed_loop);
    assert_eq!(run.counted, (1, 8));
    // Slots are taken in workload order; two requests that got theirs at once may stamp their
    // sends a moment apart in either order, but a later one never waits for a slot an earlier
    // one is still waiting for.
    let sent: Vec<f64> = run.results.iter().map(|r| r.record.arrival).collect();
    assert!(sent.windows(2).all(|w| w[0] <= w[1] + 0.005), "requests go out in workload order: {sent:?}");
    let r2 = summarize(&run, &info(SloParams::default()));
    assert!((r2.window_s - (run.window.1 - run.window.0)).abs() < 1e-12 && run.window.0 < 0.01);
    let r = summarize(&run, &info(SloParams::default()));
    assert_eq!((r.counted, r.completed), (7, 7));
    assert!(r.duration > 0.05 && r.closed_loop);
}

/// A closed loop with more slots than requests: the counted ones all go out at once, and the
/// window still spans them (first counted send to last counted end), so rates stay finite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_with_more_slots_than_requests_keeps_a_real_window() {
    let base = common::start(common::Cfg::new(30, 10)).await;
    let client = pace_bench::client::http_client(32).unwrap();
    let workload = Workload::new((0..10).map(|_| prompt("default", 3)).collect(), vec![0.0; 10]);
    let opts = LoadOptions { max_concurrency: Some(64), ..options(SloClass::default(), true) };
    let run = run_load(&client, &target(&base, "/v1/completions"), &workload, &opts).await;
    assert!(run.closed_loop && run.counted == (1, 8));
    let r = summarize(&run, &info(SloParams::default()));
    assert!(r.duration > 0.04, "the window spans the counted streams ({} s)", r.duration);
    assert!(r.output_throughput < 10_000.0 && r.smooth_goodput.is_finite());
}
