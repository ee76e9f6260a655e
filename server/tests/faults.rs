//! Faults and limits on a real socket, in-process: `pace_server::serve::in_process` on
//! `dummy:smollm2-135m` (random weights) behind `serve::listen::serve` on 127.0.0.1, driven by
//! real clients (reqwest, raw TCP). Each test has its own server and engine thread.
//!
//! - the engine thread's supervision: a panic outside the model step ends every open request
//!   with an error and turns `/health` red (the process exit is tested on the binary in
//!   `lifecycle.rs`);
//! - clients that leave: after one of a non-streaming request's choices, or while admission is
//!   being decided, leave nothing live behind;
//! - per-request bounds: output tokens over all choices, stop strings, prompt counts; the
//!   bounded preparation queue, which forgets clients who left;
//! - connection limits: silent and slow connections, slow bodies, the connection cap, SSE
//!   keep-alive comments while a stream waits in the queue;
//! - the request lifecycle under each policy, with smooth's 429 `predicted_late` and
//!   drop-late's error event.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::StreamExt;
use pace_server::serve::listen::{self, ConnLimits};
use pace_server::serve::state::AppState;
use pace_server::serve::{api, in_process, ServeArgs};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    serve: ServeArgs,
}

struct Srv {
    state: Arc<AppState>,
    addr: SocketAddr,
}

impl Srv {
    /// An in-process server on dummy weights with `extra` flags, listening on a free port of
    /// 127.0.0.1 with `limits`.
    async fn start(extra: &[&str], limits: ConnLimits) -> Srv {
        let mut argv = vec!["serve", "--model", "dummy:smollm2-135m:q4", "--threads", "2", "--max-model-len", "512", "--kv-cache-memory", "64MiB"];
        argv.extend_from_slice(extra);
        let args = Args::parse_from(argv);
        let state = tokio::task::spawn_blocking(move || in_process(&args.serve).expect("in-process server")).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(listen::serve(listener, api::app(state.clone()), limits, std::future::pending(), Duration::from_secs(1)));
        Srv { state, addr }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, reqwest::header::HeaderMap, Value) {
        let r = reqwest::Client::new().post(self.url(path)).json(body).send().await.unwrap();
        let (st, h) = (r.status().as_u16(), r.headers().clone());
        (st, h, r.json().await.unwrap_or(Value::Null))
    }

    /// A streaming POST: (status, the raw body).
    async fn stream_raw(&self, body: &Value) -> (u16, String) {
        let r = reqwest::Client::new().post(self.url("/v1/completions")).json(body).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    fn load(&self) -> (usize, usize) {
        let g = &self.state.loaded.get().unwrap().engine.gauges;
        (g.running.load(Ordering::Relaxed), g.waiting.load(Ordering::Relaxed))
    }

    /// Waits until `cond(running, waiting)` holds (or panics after `secs`).
    async fn until(&self, secs: u64, what: &str, cond: impl Fn(usize, usize) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let (r, w) = self.load();
            if cond(r, w) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: still {r} running, {w} waiting");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The value of an unlabelled-by-us metric line (labels of the recorder ignored).
    fn metric(&self, name: &str) -> f64 {
        let l = self.state.loaded.get().unwrap();
        self.state.window.update_gauges(l.engine.now());
        let text = self.state.metrics.render();
        text.lines()
            .find(|line| line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} ")))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    /// The value of the series of `name` whose labels include every `labels` pair (0 if none).
    fn series(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let text = self.state.metrics.render();
        text.lines()
            .filter(|line| line.starts_with(&format!("{name}{{")))
            .find(|line| labels.iter().all(|(k, v)| line.contains(&format!("{k}=\"{v}\""))))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }
}

const LOOSE: ConnLimits = ConnLimits { header_timeout: Duration::from_secs(30), keep_alive: Duration::from_secs(120), max_connections: 256 };

/// SSE `data:` payloads of a raw body.
fn data_frames(raw: &str) -> Vec<&str> {
    raw.split("\n\n").filter_map(|f| f.trim().strip_prefix("data: ")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_the_engine_loop_fails_every_open_request_and_turns_health_red() {
    // Token 77 makes a step panic after the model step, outside its guard (a scheduler bug).
    let s = Srv::start(&["--scheduler", "fcfs", "--debug-panic-on-token", "77"], LOOSE).await;
    let long = json!({"prompt": [10, 11, 12], "max_tokens": 400, "ignore_eos": true});
    let streaming = {
        let (url, mut body) = (s.url("/v1/completions"), long.clone());
        body["stream"] = json!(true);
        tokio::spawn(async move { reqwest::Client::new().post(url).json(&body).send().await.unwrap().text().await.unwrap() })
    };
    let collected = {
        let (url, body) = (s.url("/v1/completions"), long.clone());
        tokio::spawn(async move {
            let r = reqwest::Client::new().post(url).json(&body).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        })
    };
    s.until(60, "both long requests running", |r, _| r == 2).await;
    let (st, _, v) = s.post("/v1/completions", &json!({"prompt": [5, 77], "max_tokens": 3})).await;
    assert_eq!(st, 500, "the request whose step panicked: {v}");
    assert_eq!(v["error"]["type"], "server_error");
    // The stream in flight ends with an error event (not a bare [DONE] without finish_reason).
    let raw = streaming.await.unwrap();
    let frames = data_frames(&raw);
    let errors: Vec<&&str> = frames.iter().filter(|f| f.contains("\"error\"")).collect();
    assert_eq!(errors.len(), 1, "one error event: {raw}");
    assert!(!frames.iter().any(|f| f.contains("\"finish_reason\":\"length\"")), "the stream did not finish normally: {raw}");
    // The non-streaming one gets a 500, not 200 with truncated text.
    let (st, v) = collected.await.unwrap();
    assert_eq!(st, 500, "{v}");
    // Health is red and new requests are refused.
    let h = reqwest::get(s.url("/health")).await.unwrap();
    assert_eq!(h.status().as_u16(), 503);
    assert_eq!(h.json::<Value>().await.unwrap()["status"], "engine stopped");
    let (st, headers, v) = s.post("/v1/completions", &json!({"prompt": "hi", "max_tokens": 2})).await;
    assert_eq!(st, 503, "{v}");
    assert!(headers.contains_key("retry-after"));
    let g = &s.state.loaded.get().unwrap().engine.gauges;
    assert!(g.panicked.load(Ordering::Acquire) && g.stopped.load(Ordering::Acquire));
    assert_eq!(s.state.window.live_count(), 0, "no live request is left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_after_one_of_its_choices_leaves_nothing_live() {
    let s = Srv::start(&["--scheduler", "fcfs"], LOOSE).await;
    let gone_before = s.series("pace_http_requests_total", &[("handler", "/v1/completions"), ("status", "499")]);
    // Two prompts: the first fills the context but 2 tokens, so its choice ends after 2; the
    // second has room for ~500 and is still running when the client leaves.
    let full: Vec<u32> = (0..510).map(|i| 10 + (i % 200)).collect();
    let body = json!({"prompt": [full, [10, 11, 12]], "ignore_eos": true});
    let url = s.url("/v1/completions");
    let client = tokio::spawn(async move { reqwest::Client::new().post(url).json(&body).send().await.map(|r| r.status()) });
    let finished = || s.state.loaded.get().unwrap().engine.gauges.finished.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(60);
    while finished() == 0 {
        assert!(Instant::now() < deadline, "the short choice never finished");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    s.until(1, "the long choice still running", |r, _| r == 1).await;
    client.abort();
    s.until(60, "the engine idle after the disconnect", |r, w| r + w == 0).await;
    // The handler's drop runs as the connection closes; allow it a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.state.window.live_count() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.state.window.live_count(), 0, "a live metrics entry was left behind");
    assert_eq!(s.metric("pace_inflight_max_idle_latency_seconds"), 0.0);
    assert_eq!(s.state.inflight.load(Ordering::Acquire), 0);
    // The request is accounted for: the client closed before the response head, status 499.
    let gone = s.series("pace_http_requests_total", &[("handler", "/v1/completions"), ("status", "499")]);
    assert!(gone >= gone_before + 1.0, "499 count {gone_before} -> {gone}");
    let ok_before = s.series("pace_http_requests_total", &[("handler", "/v1/completions"), ("status", "200")]);
    let (st, _, _) = s.post("/v1/completions", &json!({"prompt": [10, 11], "max_tokens": 2})).await;
    assert_eq!(st, 200);
    assert!(s.series("pace_http_requests_total", &[("handler", "/v1/completions"), ("status", "200")]) >= ok_before + 1.0);
    let (st, _, _) = s.post("/no/such/route", &json!({})).await;
    assert_eq!(st, 404);
    assert!(s.series("pace_http_requests_total", &[("handler", "other"), ("status", "404")]) >= 1.0, "unmatched paths count as `other`");
    // The standard process series are exported.
    let text = reqwest::get(s.url("/metrics")).await.unwrap().text().await.unwrap();
    assert!(text.lines().any(|l| l.starts_with("process_resident_memory_bytes") && !l.ends_with(" 0")), "no RSS series in /metrics");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_while_admission_is_decided_leaves_no_request_behind() {
    use pace_models::sampler::{Sampler, SamplingParams};
    use pace_scheduler::NewRequest;
    // Token 99 fails any step that feeds it: the orphan must never reach a step. Token 77, in
    // every 64-token chunk of the busy prompt, makes each of its prefill steps last 0.3 s, so
    // the submission below waits in the command queue (the engine reads it between steps only).
    let s =
        Srv::start(&["--scheduler", "fcfs", "--debug-fail-on-token", "99", "--debug-stall-on-token", "77:0.3", "--max-num-batched-tokens", "64"], LOOSE).await;
    let engine = s.state.loaded.get().unwrap().engine.clone();
    let busy: Vec<u32> = (0..400).map(|i| if i % 16 == 0 { 77 } else { 10 + (i % 50) }).collect();
    let (url, body) = (s.url("/v1/completions"), json!({"prompt": busy, "max_tokens": 40, "ignore_eos": true}));
    let busy = tokio::spawn(async move { reqwest::Client::new().post(url).json(&body).send().await.unwrap().status().as_u16() });
    s.until(60, "the busy request running", |r, _| r == 1).await;
    let prompt = vec![5, 99, 7];
    let req = NewRequest {
        id: engine.next_id(),
        prompt: prompt.clone(),
        max_tokens: 4,
        min_tokens: 0,
        stop_token_ids: vec![],
        arrival: engine.now(),
        class: None,
        cache_salt: None,
    };
    let sampler = Sampler::new(SamplingParams::default(), &prompt).unwrap();
    // Polled once (the command is sent), then dropped: the client is gone.
    let gone = tokio::time::timeout(Duration::ZERO, engine.submit(req, sampler)).await;
    assert!(gone.is_err(), "admission answered within zero time: {:?}", gone.as_ref().map(|r| r.as_ref().map(|_| ()).map_err(|e| format!("{e:?}"))));
    assert_eq!(busy.await.unwrap(), 200, "the busy request was not failed by the orphan's step");
    s.until(60, "idle", |r, w| r + w == 0).await;
    assert_eq!(engine.gauges.consecutive_failures.load(Ordering::Relaxed), 0, "the orphan ran a step");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_cannot_ask_for_unbounded_work() {
    let s = Srv::start(&["--scheduler", "fcfs", "--max-request-output-tokens", "40", "--max-n", "8"], LOOSE).await;
    let cases = [
        ("/v1/completions", json!({"prompt": "hi", "n": 4, "max_tokens": 11}), "max_tokens"),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 41}), "max_completion_tokens"),
        ("/v1/completions", json!({"prompt": "hi", "max_tokens": 2, "stop": ["x".repeat(2000)]}), "stop"),
        ("/v1/completions", json!({"prompt": vec!["a"; 200_000], "max_tokens": 1}), "prompt"),
        // Every generated token is checked against the stop ids: 450,000 of them (under the
        // body limit) were accepted and checked one by one.
        ("/v1/completions", json!({"prompt": "hi", "max_tokens": 2, "stop_token_ids": vec![7; 65]}), "stop_token_ids"),
        // 40,000 tools (3 MiB, under the body limit) took 18 s of a core to refuse when their
        // names were checked against each other; now the count is capped first.
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "tools": (0..40_000).map(|i| json!({"type": "function", "function": {"name": format!("f{i}"), "parameters": {"type": "object"}}})).collect::<Vec<_>>()}),
            "tools",
        ),
    ];
    for (path, body, param) in &cases {
        let (st, _, v) = s.post(path, body).await;
        assert_eq!(st, 400, "{param}: {v}");
        assert_eq!(v["error"]["param"], *param, "{v}");
    }
    // 100,000 short messages (2 MiB) were rendered by the template and tokenized before the
    // length check; a count over the context is refused first, saying so.
    let many: Vec<_> = (0..100_000).map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": "hi"})).collect();
    let (st, _, v) = s.post("/v1/chat/completions", &json!({"messages": many, "max_tokens": 2})).await;
    assert_eq!((st, &v["error"]["param"], &v["error"]["code"]), (400, &json!("messages"), &json!("context_length_exceeded")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("the messages are 100000"), "{v}");
    // Without max_tokens, each of the 4 choices gets its share of the 40.
    let (st, _, v) = s.post("/v1/completions", &json!({"prompt": "hi", "n": 4, "ignore_eos": true})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 40, "{v}");
    assert!(v["choices"].as_array().unwrap().iter().all(|c| c["finish_reason"] == "length"), "{v}");
}

/// Reads until the peer closes (Ok(bytes)) or `secs` pass (Err).
async fn read_to_close(c: &mut TcpStream, secs: u64) -> Result<Vec<u8>, ()> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        match tokio::time::timeout_at(deadline, c.read(&mut buf)).await {
            Err(_) => return Err(()),
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(out),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_slow_and_surplus_connections_are_cut() {
    let limits = ConnLimits { header_timeout: Duration::from_millis(600), keep_alive: Duration::from_secs(60), max_connections: 3 };
    let s = Srv::start(&["--scheduler", "fcfs", "--body-timeout", "0.6"], limits).await;
    // A connection that sends nothing, and one that sends its headers a byte at a time.
    let mut silent = TcpStream::connect(s.addr).await.unwrap();
    let mut slow = TcpStream::connect(s.addr).await.unwrap();
    let dribble = async {
        for b in b"GET /health HTTP/1.1\r\nHost: x\r\n" {
            if slow.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    dribble.await;
    assert!(read_to_close(&mut silent, 10).await.is_ok(), "a silent connection is closed");
    let answer = read_to_close(&mut slow, 10).await.expect("a slow-header connection is closed");
    assert!(!String::from_utf8_lossy(&answer).contains("200 OK"), "{}", String::from_utf8_lossy(&answer));
    // A body that never arrives in full: 408 with an OpenAI error body.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":").await.unwrap();
    let answer = String::from_utf8_lossy(&read_to_close(&mut c, 10).await.expect("answered and closed")).to_string();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"request_timeout\""), "{answer}");
    // The cap: with 3 idle connections open, a 4th is served and the one idle longest closed.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(s.addr).await.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut fourth = TcpStream::connect(s.addr).await.unwrap();
    fourth.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    let answer = read_to_close(&mut fourth, 5).await.expect("the fourth connection is answered");
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer));
    assert!(read_to_close(&mut held[0], 5).await.is_ok(), "the connection idle longest was closed for room");
    assert!(s.series("pace_http_connections_closed_total", &[("reason", "slots_full")]) >= 1.0);
}

/// Reads one HTTP/1 response with a Content-Length body (empty if the peer closes first).
async fn read_response(c: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&out).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end]
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap()))
                .unwrap_or(0);
            if out.len() >= end + 4 + len {
                return text;
            }
        }
        match tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => out.extend_from_slice(&buf[..n]),
            _ => return String::from_utf8_lossy(&out).to_string(),
        }
    }
}

/// A kept-alive HTTP/1 connection may stay silent past the header timeout, up to the keep-alive
/// timeout (which is longer than clients' pools keep a connection, so the client closes first
/// and never writes a request into a connection the server is closing); a request begun on it
/// must still bring its headers within the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_outwaits_the_header_timeout_but_slow_headers_do_not() {
    let limits = ConnLimits { header_timeout: Duration::from_millis(600), keep_alive: Duration::from_secs(3), max_connections: 8 };
    let s = Srv::start(&["--scheduler", "fcfs"], limits).await;
    let get = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(get).await.unwrap();
    let first = read_response(&mut c).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    // Silent for 2.5 header timeouts: still served.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let _ = c.write_all(get).await;
    let second = read_response(&mut c).await;
    assert!(second.starts_with("HTTP/1.1 200"), "the kept-alive connection was closed after {:?} of silence: {second:?}", Duration::from_millis(1500));
    // A request begun whose headers stall: cut at the header timeout, not the keep-alive.
    c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let t = Instant::now();
    let rest = read_to_close(&mut c, 10).await.expect("a stalled request is cut");
    assert!(t.elapsed() < Duration::from_secs(2), "cut after {:?}", t.elapsed());
    assert!(!String::from_utf8_lossy(&rest).contains("200 OK"), "{}", String::from_utf8_lossy(&rest));
    // Silence past the keep-alive timeout closes the connection.
    let mut d = TcpStream::connect(s.addr).await.unwrap();
    d.write_all(get).await.unwrap();
    assert!(read_response(&mut d).await.starts_with("HTTP/1.1 200"));
    let t = Instant::now();
    read_to_close(&mut d, 10).await.expect("an idle connection is closed after the keep-alive timeout");
    assert!((2.5..5.0).contains(&t.elapsed().as_secs_f64()), "closed after {:?} of silence (keep-alive 3 s)", t.elapsed());
}

/// An HTTP/2 connection that answers the server's pings but opens no stream is closed after the
/// keep-alive timeout, as an idle HTTP/1 connection is (before, pings kept it open for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_is_closed() {
    let limits = ConnLimits { header_timeout: Duration::from_millis(600), keep_alive: Duration::from_secs(1), max_connections: 8 };
    let s = Srv::start(&["--scheduler", "fcfs"], limits).await;
    let c = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
    let r = c.get(s.url("/health")).send().await.unwrap();
    assert_eq!((r.version(), r.status().as_u16()), (reqwest::Version::HTTP_2, 200));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(s.series("pace_http_connections_closed_total", &[("reason", "idle")]) >= 1.0);
    // The client reconnects on its next request.
    assert_eq!(c.get(s.url("/health")).send().await.unwrap().status().as_u16(), 200);
}

/// With every connection slot holding a request in flight, a new connection still answers the
/// probes (from a small reserve) and refuses anything else with a 503 that closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_get_through_when_every_slot_is_busy() {
    let limits = ConnLimits { header_timeout: Duration::from_secs(10), keep_alive: Duration::from_secs(120), max_connections: 2 };
    let s = Srv::start(&["--scheduler", "fcfs", "--max-num-seqs", "1"], limits).await;
    let busy: Vec<_> = (0..2)
        .map(|i| {
            let (url, body) = (s.url("/v1/completions"), json!({"prompt": format!("busy {i}"), "max_tokens": 300, "ignore_eos": true}));
            tokio::spawn(async move { reqwest::Client::new().post(url).json(&body).send().await.map(|r| r.status().as_u16()) })
        })
        .collect();
    s.until(60, "both requests in", |r, w| r + w == 2).await;
    let probe = reqwest::Client::builder().pool_max_idle_per_host(0).timeout(Duration::from_secs(1)).build().unwrap();
    for path in ["/health", "/metrics", "/version"] {
        let r = probe.get(s.url(path)).send().await.unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(r.status().as_u16(), 200, "{path}");
    }
    let r = probe.post(s.url("/v1/completions")).json(&json!({"prompt": "x", "max_tokens": 1})).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "unavailable", "{v}");
    for b in busy {
        b.abort();
    }
}

/// A flood of idle connections (HTTP/1 that send nothing, HTTP/2 that send only the preface and
/// a SETTINGS frame), opened without pause at 2.5 times the connection limit and reopened as the
/// server closes them, while a client streams an answer and a prober asks /health on a fresh
/// connection every 100 ms: the stream is served to the end and every probe answers within 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_flood_locks_nobody_out() {
    const LIMIT: usize = 64;
    let limits = ConnLimits { header_timeout: Duration::from_secs(15), keep_alive: Duration::from_secs(120), max_connections: LIMIT };
    let s = Srv::start(&["--scheduler", "fcfs"], limits).await;
    let addr = s.addr;
    let flooding = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flood = {
        let flooding = flooding.clone();
        tokio::spawn(async move {
            let mut held = std::collections::VecDeque::new();
            let mut opened = 0usize;
            while flooding.load(Ordering::Relaxed) {
                let Ok(mut c) = TcpStream::connect(addr).await else { continue };
                if opened.is_multiple_of(3) {
                    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
                    hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
                    let _ = c.write_all(&hello).await;
                }
                held.push_back(c);
                opened += 1;
                // Keep 2.5x the limit open from this side; pause only once that many are out.
                if held.len() > LIMIT * 5 / 2 {
                    held.pop_front();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            opened
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (url, body) = (s.url("/v1/completions"), json!({"prompt": "stream", "max_tokens": 100, "ignore_eos": true, "stream": true}));
    let stream = tokio::spawn(async move {
        let r = reqwest::Client::new().post(url).json(&body).send().await.expect("the streaming request gets in");
        (r.status().as_u16(), r.text().await.expect("the stream is read to its end"))
    });
    let probe = reqwest::Client::builder().pool_max_idle_per_host(0).timeout(Duration::from_secs(1)).build().unwrap();
    let mut slow = Vec::new();
    for i in 0..40 {
        let t = Instant::now();
        match probe.get(s.url("/health")).send().await {
            Ok(r) if r.status().as_u16() == 200 => {}
            other => slow.push(format!("probe {i}: {:?} after {:?}", other.map(|r| r.status()), t.elapsed())),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, raw) = stream.await.unwrap();
    flooding.store(false, Ordering::Relaxed);
    let opened = flood.await.unwrap();
    assert!(slow.is_empty(), "{} of 40 probes failed or took over 1 s: {slow:?}", slow.len());
    assert_eq!(status, 200);
    assert_eq!(data_frames(&raw).last(), Some(&"[DONE]"), "the stream ended properly");
    assert!(opened > LIMIT * 5 / 2, "the flood opened {opened} connections");
    assert!(s.series("pace_http_connections_closed_total", &[("reason", "slots_full")]) >= (opened - LIMIT * 5 / 2) as f64 / 2.0);
}

/// The status code of a raw HTTP/1.1 request naming `host`.
async fn status_for_host(addr: SocketAddr, method: &str, path: &str, host: &str) -> u16 {
    let mut c = TcpStream::connect(addr).await.unwrap();
    let body = if method == "POST" { r#"{"prompt": "hi", "max_tokens": 1}"# } else { "" };
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    c.write_all(head.as_bytes()).await.unwrap();
    let raw = read_to_close(&mut c, 30).await.expect("the server answers and closes");
    let text = String::from_utf8_lossy(&raw);
    text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status line: {text}"))
}

/// `--allowed-hosts`: inference routes answer only requests that name a listed host (a port,
/// letter case and a `*.` wildcard allowed for); a rebound DNS name gets a 400; the probes
/// answer whatever the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inference_routes_answer_only_the_allowed_hosts() {
    let s = Srv::start(&["--scheduler", "fcfs", "--allowed-hosts", "localhost,127.0.0.1,*.pace.internal"], LOOSE).await;
    let port = s.addr.port();
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}"), "LocalHost".into(), "a.pace.internal".into(), format!("x.y.pace.internal:{port}")] {
        assert_eq!(status_for_host(s.addr, "GET", "/v1/models", &host).await, 200, "{host}");
        assert_eq!(status_for_host(s.addr, "POST", "/v1/completions", &host).await, 200, "{host}");
    }
    for host in ["attacker.example", "attacker.example:8000", "pace.internal", "evilpace.internal", "[::1]:8000"] {
        assert_eq!(status_for_host(s.addr, "GET", "/v1/models", host).await, 400, "{host}");
        assert_eq!(status_for_host(s.addr, "POST", "/v1/completions", host).await, 400, "{host}");
    }
    for path in ["/health", "/metrics", "/version"] {
        assert_eq!(status_for_host(s.addr, "GET", path, "10.1.2.3:8000").await, 200, "{path}");
    }
    // Without the flag every host is served.
    let open = Srv::start(&["--scheduler", "fcfs"], LOOSE).await;
    assert_eq!(status_for_host(open.addr, "GET", "/v1/models", "attacker.example").await, 200);
}

/// Request preparation (tokenizing, templates, grammars) is a bounded queue in front of eight
/// threads. 16 clients at once, each preparation taking a second (`--debug-prepare-stall`), 12
/// places (`--max-preparing`): 8 are prepared, 4 wait, 4 are answered 429 + Retry-After at
/// once; when the clients give up after 400 ms the 4 waiting drop out of the queue and are never
/// prepared; `/health` answers throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_preparation_is_bounded_and_forgets_clients_who_left() {
    let s = Srv::start(&["--scheduler", "fcfs", "--max-preparing", "12", "--debug-prepare-stall", "1.0"], LOOSE).await;
    let client = reqwest::Client::builder().timeout(Duration::from_millis(400)).build().unwrap();
    let sends: Vec<_> = (0..16)
        .map(|i| {
            let (c, url) = (client.clone(), s.url("/v1/completions"));
            tokio::spawn(async move {
                let r = c.post(url).json(&json!({"prompt": format!("hello {i}"), "max_tokens": 1})).send().await;
                r.map(|r| (r.status().as_u16(), r.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string))).ok()
            })
        })
        .collect();
    let probe = reqwest::Client::builder().timeout(Duration::from_secs(1)).build().unwrap();
    let t = Instant::now();
    assert_eq!(probe.get(s.url("/health")).send().await.unwrap().status().as_u16(), 200);
    assert!(t.elapsed() < Duration::from_secs(1));
    let mut answered = Vec::new();
    for h in sends {
        answered.extend(h.await.unwrap());
    }
    assert_eq!(answered.len(), 4, "only the refusals came before the clients gave up: {answered:?}");
    assert!(answered.iter().all(|(st, ra)| *st == 429 && ra.as_deref() == Some("1")), "{answered:?}");
    // Once the eight running preparations end, every place is free, and nothing else ran.
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.state.preparing.available_permits() < 12 {
        assert!(Instant::now() < deadline, "places still held: {}", 12 - s.state.preparing.available_permits());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(s.state.prepared.load(Ordering::Relaxed), 8, "the four who left while waiting were prepared");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_waiting_in_the_queue_gets_keep_alive_comments() {
    let s = Srv::start(&["--scheduler", "fcfs", "--max-num-seqs", "1", "--sse-keepalive", "0.05"], LOOSE).await;
    let (url, body) = (s.url("/v1/completions"), json!({"prompt": "busy", "max_tokens": 60, "ignore_eos": true}));
    let busy = tokio::spawn(async move { reqwest::Client::new().post(url).json(&body).send().await.unwrap().status().as_u16() });
    s.until(60, "the busy request running", |r, _| r == 1).await;
    let (st, raw) = s.stream_raw(&json!({"prompt": "queued", "max_tokens": 3, "ignore_eos": true, "stream": true})).await;
    assert_eq!(st, 200);
    let first_data = raw.find("data: ").expect("data frames");
    assert!(raw[..first_data].contains(": keep-alive"), "no keep-alive comment before the first token: {raw:?}");
    assert_eq!(data_frames(&raw).last(), Some(&"[DONE]"));
    assert_eq!(busy.await.unwrap(), 200);
}

/// The lifecycle every policy must keep: streaming and non-streaming answers, a disconnect that
/// frees everything, a full queue answered 429 with Retry-After; plus each policy's own refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lifecycle_holds_under_every_policy() {
    for policy in ["fcfs", "smooth", "drop-late"] {
        let s = Srv::start(&["--scheduler", policy, "--max-num-seqs", "1", "--max-queue-requests", "3", "--slo", "ttft:1000 tpot:1000"], LOOSE).await;
        // Served: non-streaming and streaming.
        let (st, _, v) = s.post("/v1/completions", &json!({"prompt": "one", "max_tokens": 5, "ignore_eos": true})).await;
        assert_eq!(st, 200, "{policy}: {v}");
        assert_eq!(v["usage"]["completion_tokens"], 5, "{policy}");
        let (st, raw) = s.stream_raw(&json!({"prompt": "two", "max_tokens": 5, "ignore_eos": true, "stream": true})).await;
        assert_eq!(st, 200, "{policy}");
        assert!(data_frames(&raw).iter().any(|f| f.contains("\"finish_reason\":\"length\"")), "{policy}: {raw}");
        // A streaming client that leaves mid-answer: aborted, the engine idle again.
        let r = reqwest::Client::new()
            .post(s.url("/v1/completions"))
            .json(&json!({"prompt": "three", "max_tokens": 400, "ignore_eos": true, "stream": true}))
            .send()
            .await
            .unwrap();
        let mut body = r.bytes_stream();
        body.next().await.unwrap().unwrap();
        drop(body);
        s.until(60, &format!("{policy}: idle after a disconnect"), |r, w| r + w == 0).await;
        // A burst over a queue of 3: each request is served or refused with Retry-After (429 for
        // the full queue; smooth may refuse at the door and drop-late drop a queued request that
        // waited past its TTFT, both 503), none is lost.
        let url = s.url("/v1/completions");
        let sends = (0..8).map(|i| {
            let url = url.clone();
            async move {
                let r = reqwest::Client::new().post(url).json(&json!({"prompt": format!("q{i}"), "max_tokens": 30, "ignore_eos": true})).send().await.unwrap();
                let (st, retry) = (r.status().as_u16(), r.headers().contains_key("retry-after"));
                let v: Value = r.json().await.unwrap_or(Value::Null);
                (st, retry, v["error"]["code"].as_str().unwrap_or("").to_string(), v["error"]["message"].as_str().unwrap_or("").to_string())
            }
        });
        let results = futures_util::future::join_all(sends).await;
        let own_refusal = match policy {
            "smooth" => "unavailable",
            "drop-late" => "dropped",
            _ => "none",
        };
        for (st, retry, code, _) in &results {
            match st {
                200 => {}
                429 => assert!(*retry && code == "overloaded", "{policy}: {results:?}"),
                503 => assert!(*retry && code == own_refusal, "{policy}: {results:?}"),
                _ => panic!("{policy}: {results:?}"),
            }
        }
        assert!(results.iter().any(|r| r.0 == 200), "{policy}: {results:?}");
        if policy == "fcfs" {
            // 8 at once against 1 seat and 3 places in the queue (how many exactly depends on
            // whether the first has started when the last arrive).
            assert!(results.iter().filter(|r| r.0 == 429).count() >= 1, "fcfs: nothing refused: {results:?}");
        }
        s.until(120, &format!("{policy}: idle after the burst"), |r, w| r + w == 0).await;
        match policy {
            // Smooth refuses at the door, before any SSE byte, under a sustained overload: the
            // one seat (--max-num-seqs 1) is held by a long stream, and new requests (1 token each, for readers with no grace) keep arriving and fall
            // due while none completes; the third waits long past its reading deadline. (A
            // fresh server: the burst above completed within the door's window.)
            "smooth" => {
                let s = Srv::start(&["--scheduler", "smooth", "--max-num-seqs", "1", "--max-queue-requests", "3"], LOOSE).await;
                let send = |prompt: &str, max_tokens: u32| {
                    let (url, body) = (s.url("/v1/completions"), json!({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": true, "ttft_grace": 0}));
                    tokio::spawn(async move { reqwest::Client::new().post(url).json(&body).send().await.unwrap().status().as_u16() })
                };
                let busy = send("busy", 480);
                s.until(60, "smooth: the busy request running", |r, _| r == 1).await;
                let mut queued = Vec::new();
                for prompt in ["first", "second"] {
                    queued.push(send(prompt, 1));
                    tokio::time::sleep(Duration::from_millis(400)).await;
                }
                s.until(1, "smooth: both queued behind the busy request", |r, w| r == 1 && w == 2).await;
                let r = reqwest::Client::new()
                    .post(s.url("/v1/completions"))
                    .json(&json!({"prompt": "late", "max_tokens": 1, "ttft_grace": 0, "stream": true}))
                    .send()
                    .await
                    .unwrap();
                let (st, retry) = (r.status().as_u16(), r.headers().get("retry-after").and_then(|h| h.to_str().ok()).and_then(|h| h.parse::<u64>().ok()));
                let ct = r.headers().get("content-type").and_then(|h| h.to_str().ok()).unwrap_or("").to_string();
                let v: Value = r.json().await.unwrap();
                assert_eq!(st, 429, "smooth: {v}");
                assert!(ct.starts_with("application/json"), "smooth: refused before any SSE byte ({ct})");
                assert!(retry.is_some_and(|r| r >= 1), "smooth: Retry-After {retry:?}");
                assert!(v["error"]["message"].as_str().unwrap().contains("predicted_late"), "{v}");
                assert_eq!(busy.await.unwrap(), 200);
                for q in queued {
                    assert_eq!(q.await.unwrap(), 200, "smooth: the queued requests are served");
                }
            }
            // Drop-late ends a queued request that has missed its TTFT with an error event.
            "drop-late" => {
                let (url, body) = (s.url("/v1/completions"), json!({"prompt": "busy", "max_tokens": 480, "ignore_eos": true}));
                let busy = tokio::spawn(async move { reqwest::Client::new().post(url).json(&body).send().await.unwrap().status().as_u16() });
                s.until(60, "drop-late: the busy request running", |r, _| r == 1).await;
                let (st, raw) = s.stream_raw(&json!({"prompt": "queued", "max_tokens": 3, "stream": true})).await;
                assert_eq!(st, 200);
                assert!(data_frames(&raw).iter().any(|f| f.contains("\"code\":\"dropped\"")), "drop-late: {raw}");
                assert_eq!(data_frames(&raw).last(), Some(&"[DONE]"));
                let _ = busy.await.unwrap();
            }
            _ => {}
        }
        s.until(120, &format!("{policy}: idle at the end"), |r, w| r + w == 0).await;
        assert_eq!(s.state.window.live_count(), 0, "{policy}: live entries left");
    }
}
