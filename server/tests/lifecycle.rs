//! Load, overload and faults against real servers (docs/reliability.md): API keys, client
//! disconnects, mass timeouts, queue overload, KV exhaustion, a failing step, a panicking engine
//! loop, a stuck step, non-finite logits, SIGTERM drain and a second SIGTERM, and metrics that match what the client measured. (Faults that need no
//! real model or process run in-process, in `faults.rs`.)

mod common;

use std::time::{Duration, Instant};

use common::{post, stream, Server};
use futures_util::StreamExt;
use serde_json::{json, Value};

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// Polls `cond` on the server's metrics until it holds (or panics after `secs`).
async fn eventually(s: &Server, secs: u64, what: &str, cond: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let text = reqwest::get(s.url("/metrics")).await.unwrap().text().await.unwrap();
        if cond(&text) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not happen; metrics:\n{}",
            text.lines().filter(|l| l.starts_with("pace_num") || l.starts_with("pace_kv") || l.starts_with("pace_requests")).collect::<Vec<_>>().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn idle(text: &str) -> bool {
    common::metric_value(text, "pace_num_requests_running", &[]) == 0.0
        && common::metric_value(text, "pace_num_requests_waiting", &[]) == 0.0
        && common::metric_value(text, "pace_kv_cache_usage_perc", &[]) == 0.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_guard_inference_routes_only() {
    let s = Server::start(&["--scheduler", "fcfs", "--api-key", "k-one", "--api-key", "k-two"]);
    let body = json!({"prompt": "Hi", "max_tokens": 2});
    let c = reqwest::Client::new();
    for (key, want) in [(None, 401), (Some("wrong"), 401), (Some("k-on"), 401), (Some("k-one"), 200), (Some("k-two"), 200)] {
        let mut r = c.post(s.url("/v1/completions")).json(&body);
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status().as_u16(), want, "key {key:?}");
        if want == 401 {
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["type"], "authentication_error");
        }
    }
    for path in ["/v1/models", "/tokenize"] {
        let r = c.post(s.url(path)).json(&json!({"prompt": "x"})).send().await.unwrap();
        assert!(matches!(r.status().as_u16(), 401 | 405), "{path} without a key");
    }
    // Streaming requests get the 401 too, as JSON.
    let r = c.post(s.url("/v1/chat/completions")).json(&json!({"messages": user("x"), "stream": true})).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    for path in ["/health", "/metrics", "/version"] {
        assert_eq!(c.get(s.url(path)).send().await.unwrap().status().as_u16(), 200, "{path} stays open");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnects_abort_and_free_blocks_then_mass_timeouts_recover() {
    let s = Server::start(&["--scheduler", "fcfs"]);
    let aborts = |t: &str| common::metric_value(t, "pace_requests_total", &["finished_reason=\"abort\""]);
    // Streaming: read a few chunks, then hang up.
    let r = reqwest::Client::new()
        .post(s.url("/v1/completions"))
        .json(&json!({"prompt": "Tell me everything.", "max_tokens": 1500, "ignore_eos": true, "stream": true}))
        .send()
        .await
        .unwrap();
    let mut body = r.bytes_stream();
    for _ in 0..3 {
        body.next().await.unwrap().unwrap();
    }
    drop(body);
    eventually(&s, 30, "abort after a streaming disconnect", |t| aborts(t) >= 1.0 && idle(t)).await;
    // Non-streaming: the client gives up after 0.5 s.
    let c = reqwest::Client::builder().timeout(Duration::from_millis(500)).build().unwrap();
    let r = c.post(s.url("/v1/completions")).json(&json!({"prompt": "Again.", "max_tokens": 1500, "ignore_eos": true})).send().await;
    assert!(r.is_err(), "the request should time out on the client");
    eventually(&s, 30, "abort after a non-streaming disconnect", |t| aborts(t) >= 2.0 && idle(t)).await;
    // 200 clients with huge max_tokens, all timing out after 0.5 s.
    let futs = (0..200).map(|i| {
        let c = c.clone();
        let url = s.url(if i % 2 == 0 { "/v1/completions" } else { "/v1/chat/completions" });
        let body = if i % 2 == 0 {
            json!({"prompt": format!("Story {i}:"), "max_tokens": 1800, "ignore_eos": true})
        } else {
            json!({"messages": user(&format!("Story {i}")), "max_tokens": 1800, "ignore_eos": true, "stream": true})
        };
        async move {
            if let Ok(r) = c.post(url).json(&body).send().await {
                let _ = r.bytes().await;
            }
        }
    });
    futures_util::future::join_all(futs).await;
    eventually(&s, 60, "every timed-out request aborted and its blocks freed", |t| aborts(t) >= 2.0 && idle(t)).await;
    // Nothing is left behind: a new request is served in full and the engine is idle after it.
    // (No latency bound here: CI runs the other lifecycle servers on the same two cores; the
    // timeout only turns a hang into a failure.)
    let served =
        tokio::time::timeout(Duration::from_secs(180), post(&s.url("/v1/completions"), &json!({"prompt": "Quick:", "max_tokens": 4, "ignore_eos": true})))
            .await;
    let (st, _, v) = served.expect("a new request is served after the mass timeouts");
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 4, "{v}");
    eventually(&s, 30, "idle after the new request", idle).await;
}

/// smooth exports its door's verdict on sustained overload and the arrivals it took for clients
/// answering an end (0 and 0 after one request on an idle server), also with a rule off;
/// fcfs has neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smooth_exports_its_doors_view() {
    for (scheduler, door) in [("smooth", true), ("smooth:chunk=0", true), ("smooth:door=0", false), ("fcfs", false)] {
        let s = Server::start(&["--scheduler", scheduler]);
        let (st, _, v) = post(&s.url("/v1/completions"), &json!({"prompt": "Count:", "max_tokens": 4, "ignore_eos": true})).await;
        assert_eq!(st, 200, "{scheduler}: {v}");
        let text = reqwest::get(s.url("/metrics")).await.unwrap().text().await.unwrap();
        let gauge = |name: &str| text.lines().find(|l| l.starts_with(&format!("{name}{{"))).and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
        assert_eq!(gauge("pace_sustained_overload"), door.then_some(0.0), "{scheduler}");
        assert_eq!(gauge("pace_door_returns_total"), door.then_some(0.0), "{scheduler}");
        for gone in ["pace_feed_limit_scale", "pace_queue_wait_scale", "pace_borrowed_starts_total"] {
            assert_eq!(gauge(gone), None, "{scheduler}: {gone}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_answers_429_with_retry_after_counts_it_and_recovers() {
    let s = Server::start(&["--scheduler", "fcfs", "--max-num-seqs", "1", "--max-queue-requests", "2"]);
    let body = json!({"prompt": "Write a long essay.", "max_tokens": 40, "ignore_eos": true});
    let results = futures_util::future::join_all((0..10).map(|_| post_delayed(&s, &body))).await;
    let ok = results.iter().filter(|r| r.0 == 200).count();
    let rejected: Vec<_> = results.iter().filter(|r| r.0 == 429).collect();
    assert!(ok >= 1, "some requests are served");
    assert!(!rejected.is_empty(), "some are refused: {:?}", results.iter().map(|r| r.0).collect::<Vec<_>>());
    assert_eq!(ok + rejected.len(), 10, "every request is either served or refused");
    for (_, retry, v) in &rejected {
        assert!(retry.as_deref().and_then(|r| r.parse::<u64>().ok()).is_some_and(|r| r >= 1), "Retry-After: {retry:?}");
        assert_eq!(v["error"]["type"], "rate_limit_error");
    }
    let text = reqwest::get(s.url("/metrics")).await.unwrap().text().await.unwrap();
    let counted = common::metric_value(&text, "pace_requests_rejected_total", &["reason=\"queue_full\""]);
    assert_eq!(counted as usize, rejected.len(), "rejections counted by reason");
    eventually(&s, 60, "the queue drains", idle).await;
    let (st, _, _) = post(&s.url("/v1/completions"), &body).await;
    assert_eq!(st, 200, "serves again after the overload");
}

/// POST that returns (status, Retry-After, body).
async fn post_delayed(s: &Server, body: &Value) -> (u16, Option<String>, Value) {
    let (st, headers, v) = post(&s.url("/v1/completions"), body).await;
    (st, headers.get("retry-after").and_then(|h| h.to_str().ok()).map(str::to_string), v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_exhaustion_preempts_without_changing_greedy_output() {
    // 24 blocks of 16 tokens = 368 usable tokens; 6 sequences of ~100 tokens each cannot all fit.
    let s = Server::start(&["--scheduler", "fcfs", "--kv-cache-blocks", "24", "--max-num-seqs", "6", "--max-model-len", "400"]);
    let prompts: Vec<String> = (0..6).map(|i| format!("Write a short story about robot number {i}.")).collect();
    let body = |p: &str| json!({"messages": user(p), "max_tokens": 60, "ignore_eos": true, "temperature": 0});
    let mut alone = Vec::new();
    for p in &prompts {
        let (st, _, v) = post(&s.url("/v1/chat/completions"), &body(p)).await;
        assert_eq!(st, 200, "{v}");
        alone.push(v["choices"][0]["message"]["content"].as_str().unwrap().to_string());
    }
    let before = s.metric("pace_num_preemptions_total", &[]).await;
    let url = s.url("/v1/chat/completions");
    let bodies: Vec<Value> = prompts.iter().map(|p| body(p)).collect();
    let together = futures_util::future::join_all(bodies.iter().map(|b| post(&url, b))).await;
    for (i, (st, _, v)) in together.iter().enumerate() {
        assert_eq!(*st, 200, "{v}");
        assert_eq!(v["choices"][0]["message"]["content"].as_str().unwrap(), alone[i], "request {i} changed by preemption");
    }
    let after = s.metric("pace_num_preemptions_total", &[]).await;
    assert!(after > before, "the cache was exhausted and requests were preempted ({before} -> {after})");
    // A prompt that fits max_model_len but can never fit the cache is refused, not stuck.
    let huge = " word".repeat(380);
    let (st, _, v) = post(&s.url("/v1/completions"), &json!({"prompt": huge, "max_tokens": 10})).await;
    assert_eq!(st, 400, "a request larger than the whole cache is refused: {v}");
    let (st, _, _) = post(&s.url("/v1/completions"), &json!({"prompt": "ok", "max_tokens": 2})).await;
    assert_eq!(st, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_step_fails_only_its_requests_and_health_reflects_repeated_failures() {
    // Token 47000 makes any step that feeds it panic inside the model step.
    let s = Server::start(&["--scheduler", "fcfs", "--debug-fail-on-token", "47000"]);
    let bad = json!({"prompt": [504, 47000, 314], "max_tokens": 4});
    let good = json!({"prompt": "Fine:", "max_tokens": 4});
    let (st, _, v) = post(&s.url("/v1/completions"), &bad).await;
    assert_eq!(st, 500, "{v}");
    assert_eq!(v["error"]["type"], "server_error");
    let (st, _, _) = post(&s.url("/v1/completions"), &good).await;
    assert_eq!(st, 200, "the next request is served");
    assert_eq!(common::ureq_get(&s.url("/health")).unwrap().0, 200, "one failure is not unhealthy");
    // Streaming: the error arrives as an error event, then [DONE].
    let (st, frames) = stream(&s.url("/v1/completions"), &json!({"prompt": [47000], "max_tokens": 4, "stream": true})).await;
    assert_eq!(st, 200);
    assert!(frames.iter().any(|f| f.data.contains("\"error\"")), "{frames:?}");
    assert_eq!(frames.last().unwrap().data, "[DONE]");
    // Failures in a row turn /health to 503; a good step brings it back.
    for _ in 0..3 {
        post(&s.url("/v1/completions"), &bad).await;
    }
    assert_eq!(common::ureq_get(&s.url("/health")).unwrap().0, 503);
    assert_eq!(common::ureq_get(&s.url("/live")).unwrap().0, 503, "failing steps are worth a restart");
    let (st, _, _) = post(&s.url("/v1/completions"), &good).await;
    assert_eq!(st, 200);
    assert_eq!(common::ureq_get(&s.url("/health")).unwrap().0, 200);
    let errors = s.metric("pace_requests_total", &["finished_reason=\"error\""]).await;
    assert_eq!(errors, 5.0, "each failed request counted once");
}

/// A panic in the engine loop outside the model step (`--debug-panic-on-token`): the request is
/// answered with a 500, then the process exits 1 for its orchestrator to restart it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_the_engine_loop_answers_then_exits_non_zero() {
    let s = Server::start(&["--scheduler", "fcfs", "--debug-panic-on-token", "47000"]);
    let (st, _, v) = post(&s.url("/v1/completions"), &json!({"prompt": [504, 47000, 314], "max_tokens": 4})).await;
    assert_eq!(st, 500, "{v}");
    assert_eq!(s.wait_exit(Duration::from_secs(30)), Some(1), "exit code 1");
    assert!(s.log_text().contains("the engine thread panicked"), "{}", s.log_text());
}

/// An engine step that never returns (`--debug-stall-on-token` far beyond
/// `--engine-step-timeout`): the watchdog ends the open request with an error, `/health` is
/// never green again, and the process exits 1 for its orchestrator to restart it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_engine_step_fails_its_request_and_exits_non_zero() {
    let s = Server::start(&["--scheduler", "fcfs", "--engine-step-timeout", "1", "--debug-stall-on-token", "47000:600"]);
    let t0 = Instant::now();
    let (st, _, v) = post(&s.url("/v1/completions"), &json!({"prompt": [504, 47000, 314], "max_tokens": 4})).await;
    assert_eq!(st, 500, "{v}");
    assert!(v["error"]["message"].as_str().unwrap_or("").contains("stuck"), "{v}");
    assert!(t0.elapsed() < Duration::from_secs(20), "answered after {:?}", t0.elapsed());
    if let Ok((code, body)) = common::ureq_get(&s.url("/health")) {
        assert_eq!(code, 503, "{body}");
    }
    assert_eq!(s.wait_exit(Duration::from_secs(30)), Some(1), "exit code 1");
    assert!(s.log_text().contains("made no progress"), "{}", s.log_text());
}

/// A second SIGTERM while the drain waits on a request that will not finish exits at once (1),
/// where the first alone would wait for `--drain-timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_ends_the_drain_at_once() {
    let s = Server::start(&["--scheduler", "fcfs", "--drain-timeout", "300", "--engine-step-timeout", "0", "--debug-stall-on-token", "47000:300"]);
    let url = s.url("/v1/completions");
    let stuck = tokio::spawn(async move { post(&url, &json!({"prompt": [504, 47000, 314], "max_tokens": 4})).await });
    eventually(&s, 30, "the request is admitted", |t| common::metric_value(t, "pace_prompt_tokens_total", &[]) >= 3.0).await;
    s.signal(libc::SIGTERM);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(common::ureq_get(&s.url("/health")).unwrap().0, 503, "draining");
    assert_eq!(common::ureq_get(&s.url("/ready")).unwrap().0, 503, "not ready while draining");
    assert_eq!(common::ureq_get(&s.url("/live")).unwrap().0, 200, "but alive: no restart for a drain");
    assert_eq!(s.wait_exit(Duration::from_secs(2)), None, "the first signal waits for the drain");
    s.signal(libc::SIGTERM);
    assert_eq!(s.wait_exit(Duration::from_secs(10)), Some(1), "the second exits at once, with 1");
    assert!(s.log_text().contains("second shutdown signal"), "{}", s.log_text());
    stuck.abort();
}

/// A request whose logits come out NaN (`--debug-nan-on-token`) fails with a 500 that says so
/// and is counted; a request in the same batch is served in full, and health stays green (the
/// model step itself did not fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_finite_logits_fail_only_their_request_and_are_counted() {
    let s = Server::start(&["--scheduler", "fcfs", "--debug-nan-on-token", "47000"]);
    let url = s.url("/v1/completions");
    let (poisoned, healthy) =
        (json!({"prompt": [504, 47000, 314], "max_tokens": 4}), json!({"prompt": [504, 2000, 314], "max_tokens": 16, "ignore_eos": true}));
    let (bad, good) = tokio::join!(post(&url, &poisoned), post(&url, &healthy));
    assert_eq!(bad.0, 500, "{}", bad.2);
    assert!(bad.2["error"]["message"].as_str().unwrap_or("").contains("not finite"), "{}", bad.2);
    assert_eq!(good.0, 200, "{}", good.2);
    assert_eq!(good.2["usage"]["completion_tokens"], 16, "{}", good.2);
    assert_eq!(s.metric("pace_nonfinite_logits_total", &[]).await, 1.0);
    assert_eq!(s.metric("pace_requests_total", &["finished_reason=\"error\""]).await, 1.0);
    assert_eq!(common::ureq_get(&s.url("/health")).unwrap().0, 200);
    assert!(s.log_text().contains("not finite"), "{}", s.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_accepting_drains_in_flight_and_exits_zero() {
    let s = Server::start(&["--scheduler", "fcfs", "--drain-timeout", "60"]);
    let url = s.url("/v1/chat/completions");
    let inflight = tokio::spawn(async move {
        stream(&url, &json!({"messages": [{"role": "user", "content": "Tell a story."}], "max_tokens": 400, "ignore_eos": true, "stream": true})).await
    });
    // Wait until it is running, then SIGTERM. (400 tokens take about 3 s here: the drain must
    // still be under way when the late request comes; 40 took 0.3 s and raced it.)
    eventually(&s, 30, "the request starts", |t| common::metric_value(t, "pace_num_requests_running", &[]) >= 1.0).await;
    s.signal(libc::SIGTERM);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (st, h, v) = post(&s.url("/v1/completions"), &json!({"prompt": "late", "max_tokens": 2})).await;
    assert_eq!(st, 503, "new requests are refused while draining: {v}");
    assert!(h.get("retry-after").is_some());
    assert_eq!(common::ureq_get(&s.url("/health")).unwrap().0, 503);
    let (st, frames) = inflight.await.unwrap();
    assert_eq!(st, 200);
    assert_eq!(frames.last().unwrap().data, "[DONE]", "the in-flight stream completed");
    assert!(!common::stream_text(&frames, 0).is_empty());
    assert_eq!(s.wait_exit(Duration::from_secs(30)), Some(0), "exit code 0");
}

/// After a known workload, histogram counts equal the requests and tokens sent, and the goodput
/// gauges equal the `slo` module computed on the client's own timestamps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_match_the_workload_and_the_clients_measurements() {
    use pace_scheduler::slo::{BinarySlo, Outcome, Penalty, RequestRecord, SloClass, SloParams, WindowStats};
    let s = Server::start(&["--scheduler", "fcfs", "--slo", "ttft:30000 tpot:2000", "--metrics-window", "600"]);
    let n_req = 6;
    let tokens = 10;
    let t_start = Instant::now();
    let futs = (0..n_req).map(|i| {
        let url = s.url("/v1/completions");
        async move {
            let sent = t_start.elapsed().as_secs_f64();
            let (st, frames) =
                stream(&url, &json!({"prompt": format!("Item {i}:"), "max_tokens": tokens, "ignore_eos": true, "stream": true, "logprobs": 0})).await;
            assert_eq!(st, 200);
            // Each frame lists the tokens it carries (logprobs.tokens); they share its time.
            let mut times = Vec::new();
            for f in frames.iter().filter(|f| f.data != "[DONE]") {
                let v: Value = serde_json::from_str(&f.data).unwrap();
                let n = v["choices"][0]["logprobs"]["tokens"].as_array().map_or(0, |a| a.len());
                times.extend(std::iter::repeat_n(sent + f.at, n));
            }
            (sent, times)
        }
    });
    let results = futures_util::future::join_all(futs).await;
    let text = reqwest::get(s.url("/metrics")).await.unwrap().text().await.unwrap();
    let m = |name: &str| common::metric_value(&text, name, &[]);
    assert_eq!(m("pace_time_to_first_token_seconds_count"), n_req as f64);
    assert_eq!(m("pace_e2e_request_latency_seconds_count"), n_req as f64);
    assert_eq!(m("pace_request_generation_tokens_sum"), (n_req * tokens) as f64);
    assert_eq!(m("pace_generation_tokens_total"), (n_req * tokens) as f64);
    assert_eq!(m("pace_inter_token_latency_seconds_count"), (n_req * (tokens - 1)) as f64);
    assert_eq!(m("pace_token_lateness_seconds_count"), (n_req * tokens) as f64);
    for per_request in [
        "pace_request_prefill_time_seconds",
        "pace_request_decode_time_seconds",
        "pace_request_inference_time_seconds",
        "pace_request_time_per_output_token_seconds",
    ] {
        assert_eq!(m(&format!("{per_request}_count")), n_req as f64, "{per_request}");
    }
    // Inference time is prefill plus decode, request by request, so their sums add up too.
    let (prefill, decode, inference) =
        (m("pace_request_prefill_time_seconds_sum"), m("pace_request_decode_time_seconds_sum"), m("pace_request_inference_time_seconds_sum"));
    assert!((prefill + decode - inference).abs() < 1e-6, "{prefill} + {decode} != {inference}");
    let (queue, ttft) = (m("pace_request_queue_time_seconds_sum"), m("pace_time_to_first_token_seconds_sum"));
    assert!((queue + prefill - ttft).abs() < 1e-6, "queue {queue} + prefill {prefill} != TTFT {ttft}");
    assert_eq!(common::metric_value(&text, "pace_request_success_total", &["finished_reason=\"length\""]), n_req as f64);
    assert_eq!(m("pace_request_success_total"), n_req as f64, "vLLM's success counter: stop, length and abort only");
    assert_eq!(common::metric_value(&text, "pace_cache_config_info", &["block_size=\"16\"", "enable_prefix_caching=\"True\""]), 1.0);
    // Every admitted prompt token is looked up in the prefix cache.
    assert_eq!(m("pace_prefix_cache_queries_total"), m("pace_prompt_tokens_total"));
    assert_eq!(common::metric_value(&text, "pace_requests_total", &["finished_reason=\"length\""]), n_req as f64);
    assert!(text.contains("le=\"30\"") && text.contains("le=\"2\""), "SLO thresholds are bucket boundaries");
    // The cost model's own quality: one predicted-over-measured ratio per step that ran.
    let steps = m("pace_step_duration_seconds_count");
    assert!(steps > 0.0);
    assert_eq!(m("pace_step_time_prediction_error_ratio_count"), steps);
    assert_eq!(m("pace_iteration_tokens_total_count"), steps, "one observation of its tokens per step");
    for line in text.lines().filter(|l| l.starts_with("pace_")) {
        assert!(line.contains("model_name=\"SmolLM2-135M-Instruct\"") && line.contains("scheduler=\"fcfs\""), "labels on {line}");
    }
    // The client's view through the same slo module: its attainment equals the server's gauge
    // (both see every request pass with these loose thresholds) and its smooth goodput per
    // request is close (server and client stamp the same frames, microseconds apart).
    let params =
        SloParams { alpha: 2.5, penalty: Penalty::Linear, binary: "ttft:30000 tpot:2000".parse::<BinarySlo>().unwrap(), default_class: SloClass::default() };
    let records: Vec<RequestRecord> = results
        .iter()
        .map(|(sent, times)| RequestRecord {
            arrival: *sent,
            token_times: times.clone(),
            outcome: Outcome::Completed,
            end: *times.last().unwrap(),
            class: SloClass::default(),
        })
        .collect();
    let client = WindowStats::compute(&records, 0.0, 1e9, &params);
    assert_eq!(m("pace_slo_attainment_ratio"), client.attainment);
    let server_benefit = m("pace_smooth_goodput_per_second") * 600.0;
    let client_benefit = client.smooth_goodput * (1e9 - 0.0);
    let per_request = (server_benefit - client_benefit).abs() / n_req as f64;
    assert!(per_request < 0.5, "smooth goodput: server {server_benefit:.3} vs client {client_benefit:.3} benefit units");
    let server_tokens = m("pace_goodput_tokens_per_second") * 600.0;
    assert!((server_tokens - (n_req * tokens) as f64).abs() < 1e-6, "token goodput counts every passed token: {server_tokens}");
}

/// Reads SSE chunks until `want` more `data:` frames have come; the stream must not end.
async fn read_frames<S, B>(a: &mut S, want: usize, frames: &mut usize)
where
    S: futures_util::Stream<Item = reqwest::Result<B>> + Unpin,
    B: AsRef<[u8]>,
{
    let target = *frames + want;
    while *frames < target {
        let chunk = a.next().await.expect("the stream ended early").unwrap();
        let text = String::from_utf8_lossy(chunk.as_ref());
        assert!(!text.contains("[DONE]"), "the stream must still be running");
        *frames += text.matches("data: ").count();
    }
}

/// The per-token series are observed as each token is delivered: a stream that stalls for 1.5 s
/// shows in the inter-token-latency histogram while it is still streaming, long before it ends.
/// (The stall: `--debug-stall-on-token` makes the step that prefills a second request, whose
/// prompt is that token, sleep first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_is_on_the_metrics_while_its_stream_runs() {
    let stall_token = 12345;
    let s = Server::start(&["--scheduler", "fcfs", "--debug-stall-on-token", &format!("{stall_token}:1.5")]);
    let c = reqwest::Client::new();
    let body = json!({"prompt": "Count to a thousand:", "max_tokens": 1500, "ignore_eos": true, "stream": true});
    let mut a = c.post(s.url("/v1/completions")).json(&body).send().await.unwrap().bytes_stream();
    let mut frames = 0usize;
    read_frames(&mut a, 3, &mut frames).await;
    let slow = |text: &str| {
        let count = common::metric_value(text, "pace_inter_token_latency_seconds_count", &[]);
        count - common::metric_value(text, "pace_inter_token_latency_seconds_bucket", &["le=\"1\""])
    };
    let before = reqwest::get(s.url("/metrics")).await.unwrap().text().await.unwrap();
    assert_eq!(slow(&before), 0.0, "no gap over a second before the stall");
    // The stalling request: one prompt token, one output token.
    let (st, _, v) = post(&s.url("/v1/completions"), &json!({"prompt": [stall_token], "max_tokens": 1})).await;
    assert_eq!(st, 200, "{v}");
    read_frames(&mut a, 2, &mut frames).await;
    let after = reqwest::get(s.url("/metrics")).await.unwrap().text().await.unwrap();
    assert!(slow(&after) >= 1.0, "the stalled gap is in the histogram while its stream runs");
    let m = |name: &str| common::metric_value(&after, name, &[]);
    // The long stream has not ended: only the stalling request is in the per-request series.
    assert_eq!(m("pace_e2e_request_latency_seconds_count"), 1.0);
    assert_eq!(m("pace_request_time_per_output_token_seconds_count"), 0.0, "the stalling request had one token");
    // Tokens are counted as they are delivered, and each delivered token has a lateness.
    let delivered = m("pace_generation_tokens_total");
    assert!(delivered >= 6.0, "{delivered} tokens counted so far");
    assert_eq!(m("pace_token_lateness_seconds_count"), delivered);
    assert_eq!(m("pace_time_to_first_token_seconds_count"), 2.0, "both requests have their first token");
    drop(a); // the client leaves; the long stream is aborted
    eventually(&s, 30, "the engine is idle", idle).await;
}

/// `--log-format json`: every line is one JSON object; the request's line carries the id the
/// client was given (from its `X-Request-Id`) and its numbers as fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_parse_back_and_name_the_request() {
    let s = Server::start(&["--scheduler", "fcfs", "--log-format", "json"]);
    let r = reqwest::Client::new()
        .post(s.url("/v1/completions"))
        .header("x-request-id", "json-log-1")
        .json(&json!({"prompt": "Hi", "max_tokens": 3, "ignore_eos": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    let line = loop {
        let log = s.log_text();
        if let Some(l) = log.lines().find(|l| l.contains("cmpl-json-log-1")) {
            break l.to_string();
        }
        assert!(Instant::now() < deadline, "no log line names the request:\n{log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(v["request_id"], "cmpl-json-log-1", "{v}");
    assert_eq!(v["target"], "pace::request");
    assert_eq!(v["level"], "INFO");
    assert_eq!(v["message"], "request finished");
    assert_eq!(v["reason"], "length");
    assert_eq!(v["output_tokens"], 3);
    assert!(v["ttft_s"].as_f64().is_some_and(|t| t > 0.0) && v["timestamp"].is_string(), "{v}");
    for l in s.log_text().lines().filter(|l| !l.trim().is_empty()) {
        serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
    }
}
