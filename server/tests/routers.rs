//! pace behind the routers its users already run, installed from pip as they would install them:
//! SGLang's model gateway (`smg`, package `sglang-router`) and vLLM's router (`vllm-router`).
//! Two replicas of the real default model on 127.0.0.1 behind each: requests through the router,
//! streaming and not; what the routers poll (`/get_load`, `/server_info`, `/model_info`, the
//! render endpoints); a replica killed mid-run and restarted; a replica refusing with 429 while
//! the other serves. Two replicas on two cores prove the contract, not speed (docs/fleet.md).

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, metric_value, post, stream, stream_text, Server};
use serde_json::{json, Value};

/// A router binary from the pip wheels: `PACE_ROUTER_VENV/bin/NAME` if set, else a venv under
/// target/ that this installs both routers into.
fn router_bin(name: &str) -> PathBuf {
    let venv = match std::env::var("PACE_ROUTER_VENV") {
        Ok(v) => PathBuf::from(v),
        Err(_) => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/router-venv"),
    };
    let bin = venv.join("bin").join(name);
    if !bin.exists() {
        let py = venv.join("bin/python");
        let ok = (py.exists() || Command::new("python3").args(["-m", "venv"]).arg(&venv).status().is_ok_and(|s| s.success()))
            && Command::new(&py)
                .args(["-m", "pip", "install", "-q", "--disable-pip-version-check", "sglang-router>=0.3.2,<0.4", "vllm-router>=0.1.17,<0.2"])
                .status()
                .is_ok_and(|s| s.success());
        assert!(ok && bin.exists(), "could not install the routers into {}", venv.display());
    }
    bin
}

/// A router process, killed on drop; its output goes to a log file.
struct Router {
    child: Child,
    base: String,
    log: PathBuf,
}

impl Router {
    fn start(bin: &str, args: &[&str]) -> Router {
        let port = free_port();
        let log = std::env::temp_dir().join(format!("pace-router-{}-{port}.log", std::process::id()));
        let f = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(router_bin(bin));
        if bin == "smg" {
            cmd.arg("launch");
        }
        // Each router also serves its own Prometheus port (29000 by default): one each.
        cmd.args(["--host", "127.0.0.1", "--port", &port.to_string(), "--prometheus-port", &free_port().to_string()]).args(args);
        cmd.stdin(Stdio::null()).stdout(f.try_clone().unwrap()).stderr(f);
        common::die_with_test(&mut cmd);
        let child = cmd.spawn().expect("starting the router");
        Router { child, base: format!("http://127.0.0.1:{port}"), log }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until chat requests through the router succeed four times in a row (it has found
    /// its workers, or seen one gone).
    async fn wait_routing(&self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut in_a_row = 0;
        while in_a_row < 4 {
            let r = reqwest::Client::new().post(format!("{}/v1/chat/completions", self.base)).json(&chat(1)).send().await;
            if r.is_ok_and(|r| r.status() == 200) {
                in_a_row += 1;
                continue;
            }
            in_a_row = 0;
            assert!(Instant::now() < deadline, "the router never routed a request:\n{}", self.log_text());
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chat(max_tokens: u32) -> Value {
    json!({"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": max_tokens, "temperature": 0})
}

async fn get(url: &str) -> (u16, String) {
    let r = reqwest::get(url).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// Chat requests a replica answered with `status`.
async fn served(s: &Server, status: u16) -> f64 {
    s.metric("pace_http_requests_total", &["handler=\"/v1/chat/completions\"", &format!("status=\"{status}\"")]).await
}

/// `n` chat requests through `base`, one after another: each must succeed with text.
async fn all_succeed(base: &str, n: usize, what: &str) {
    for i in 0..n {
        let (st, _, v) = post(&format!("{base}/v1/chat/completions"), &chat(3)).await;
        assert_eq!(st, 200, "{what}: request {i}: {v}");
        assert!(v["choices"][0]["message"]["content"].as_str().is_some_and(|c| !c.is_empty()), "{what}: {v}");
    }
}

/// Streaming chat and a completion through the router.
async fn stream_and_complete(base: &str) {
    let mut body = chat(4);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (st, frames) = stream(&format!("{base}/v1/chat/completions"), &body).await;
    assert_eq!(st, 200, "{frames:?}");
    assert_eq!(frames.last().map(|f| f.data.as_str()), Some("[DONE]"));
    assert!(!stream_text(&frames, 0).is_empty(), "{frames:?}");
    let usage = frames.iter().rev().filter_map(|f| serde_json::from_str::<Value>(&f.data).ok()).find(|v| v["usage"].is_object());
    assert_eq!(usage.map(|u| u["usage"]["completion_tokens"].clone()), Some(json!(4)));
    let body = json!({"model": "SmolLM2-135M-Instruct", "prompt": "The sky is", "max_tokens": 3, "temperature": 0});
    let (st, _, v) = post(&format!("{base}/v1/completions"), &body).await;
    assert_eq!((st, v["usage"]["completion_tokens"].as_u64()), (200, Some(3)), "{v}");
}

/// Two replicas behind SGLang's gateway: its fields are accepted, requests of every kind reach
/// both replicas, its merged `/engine_metrics` carries both, it polls `/get_load` for
/// `power_of_two`, survives a replica killed and takes it back after a restart, and sends around
/// a replica that refuses with 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_gateway_routes_to_pace_replicas() {
    let a = Server::start(&["--threads", "1"]);
    let b = Server::start(&["--threads", "1", "--scheduler", "fcfs", "--max-num-seqs", "1", "--max-queue-requests", "1"]);
    let gw = Router::start(
        "smg",
        &[
            "--worker-urls",
            &a.base,
            &b.base,
            "--policy",
            "round_robin",
            "--health-check-interval-secs",
            "1",
            "--health-failure-threshold",
            "1",
            "--health-success-threshold",
            "1",
            "--disable-circuit-breaker",
        ],
    );
    gw.wait_routing().await;

    // Round robin: both replicas serve, whatever the request's kind.
    all_succeed(&gw.base, 6, "smg").await;
    stream_and_complete(&gw.base).await;
    assert!(served(&a, 200).await >= 2.0 && served(&b, 200).await >= 2.0, "round robin reached both:\n{}", gw.log_text());
    // The gateway's /v1/models comes from the replicas' /model_info.
    let (st, models) = get(&format!("{}/v1/models", gw.base)).await;
    assert!(st == 200 && models.contains("SmolLM2-135M-Instruct"), "{st} {models}");
    // Its /engine_metrics merges both replicas' /metrics.
    let (st, merged) = get(&format!("{}/engine_metrics", gw.base)).await;
    assert_eq!(st, 200, "{merged}");
    for s in [&a, &b] {
        let port = s.port().to_string();
        assert!(merged.lines().any(|l| l.starts_with("pace_num_requests_running") && l.contains(&port)), "replica {port} in /engine_metrics:\n{merged}");
    }

    // A replica that refuses: b runs one long answer and holds one more in its queue, so a third
    // request there gets 429; the gateway retries those on a, and every request succeeds.
    // One at a time: a second sent before the first has started would find the queue full.
    let long = json!({"prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": true, "temperature": 0});
    let mut busy = Vec::new();
    for (gauge, what) in [("pace_num_requests_running", "run the first"), ("pace_num_requests_waiting", "queue the second")] {
        busy.push(tokio::spawn(post_owned(b.url("/v1/completions"), long.clone())));
        let deadline = Instant::now() + Duration::from_secs(60);
        while b.metric(gauge, &[]).await < 1.0 {
            assert!(Instant::now() < deadline, "b did not {what} long request");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let (st, _, v) = post(&b.url("/v1/chat/completions"), &chat(2)).await;
    assert_eq!(st, 429, "b is full: {v}");
    let refused = served(&b, 429).await;
    all_succeed(&gw.base, 6, "smg around a full replica").await;
    assert!(served(&b, 429).await > refused, "the gateway tried b and was refused");
    for t in busy {
        t.abort();
    }

    // b killed mid-run: requests still succeed on a; restarted on its port, it serves again.
    let port = b.port();
    b.kill();
    gw.wait_routing().await;
    all_succeed(&gw.base, 6, "smg with b killed").await;
    let b = Server::start_at(port, &["--threads", "1"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while served(&b, 200).await < 1.0 {
        assert!(Instant::now() < deadline, "b never got a request after its restart:\n{}", gw.log_text());
        all_succeed(&gw.base, 2, "smg after b's restart").await;
    }
    drop(gw);

    // power_of_two picks by /get_load's num_tokens (polled each second here).
    let p2 = Router::start("smg", &["--worker-urls", &a.base, &b.base, "--policy", "power_of_two", "--worker-startup-check-interval", "1"]);
    p2.wait_routing().await;
    all_succeed(&p2.base, 4, "smg power_of_two").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    for s in [&a, &b] {
        while s.metric("pace_http_requests_total", &["handler=\"/get_load\"", "status=\"200\""]).await < 1.0 {
            assert!(Instant::now() < deadline, "power_of_two never read {}/get_load:\n{}", s.base, p2.log_text());
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// A POST whose answer does not matter (the replica may be killed before it comes).
async fn post_owned(url: String, body: Value) -> Option<u16> {
    Some(reqwest::Client::new().post(url).json(&body).send().await.ok()?.status().as_u16())
}

/// Two replicas behind vLLM's router: its default `cache_aware` policy renders each request on
/// the replicas first (`/v1/chat/completions/render`, `/v1/completions/render`), and it routes
/// streaming and plain requests of both kinds; a killed replica's share goes to the other; its
/// `power_of_two` reads the replicas' load (`--load-format vllm`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_router_routes_to_pace_replicas() {
    let a = Server::start(&["--threads", "1", "--load-format", "vllm"]);
    let b = Server::start(&["--threads", "1", "--load-format", "vllm"]);
    let health = ["--health-check-interval-secs", "1", "--health-failure-threshold", "1", "--health-success-threshold", "1"];
    let vr = Router::start("vllm-router", &[&["--worker-urls", &a.base, &b.base][..], &health].concat());
    vr.wait_routing().await;
    all_succeed(&vr.base, 6, "vllm-router").await;
    stream_and_complete(&vr.base).await;
    let rendered = |s: &Server| {
        let s = s.base.clone();
        async move {
            let text = reqwest::get(format!("{s}/metrics")).await.unwrap().text().await.unwrap();
            metric_value(&text, "pace_http_requests_total", &["handler=\"/v1/chat/completions/render\"", "status=\"200\""])
        }
    };
    assert!(rendered(&a).await >= 1.0 && rendered(&b).await >= 1.0, "cache_aware rendered on both replicas:\n{}", vr.log_text());
    assert!(served(&a, 200).await + served(&b, 200).await >= 7.0);
    // Killed: once the router's health check has seen it gone, every request goes to a.
    b.kill();
    vr.wait_routing().await;
    all_succeed(&vr.base, 4, "vllm-router with b killed").await;
    drop(vr);

    // power_of_two reads `{"load": N}` from /get_load (`--load-format vllm`).
    let b = Server::start(&["--threads", "1", "--load-format", "vllm"]);
    let p2 = Router::start("vllm-router", &["--worker-urls", &a.base, &b.base, "--policy", "power_of_two", "--worker-startup-check-interval", "1"]);
    p2.wait_routing().await;
    stream_and_complete(&p2.base).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, loads) = get(&format!("{}/get_loads", p2.base)).await;
        let loads: Value = serde_json::from_str(&loads).unwrap_or(Value::Null);
        let workers = loads["workers"].as_array().cloned().unwrap_or_default();
        if workers.len() == 2 && workers.iter().all(|w| w["load"].as_i64().is_some_and(|l| l >= 0)) {
            break;
        }
        assert!(Instant::now() < deadline, "the router never read the replicas' load: {loads}\n{}", p2.log_text());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What routers read, straight from a replica: the render endpoints give exactly the token ids
/// pace prefills (the count `usage.prompt_tokens` reports), `/get_load` both routers' shapes,
/// `/server_info` and `/model_info` the served name and the engine's shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_contract_answers_from_one_replica() {
    let s = Server::start(&["--threads", "1"]);
    let sglang_fields = json!({"no_stop_trim": false, "ignore_eos": false, "continue_final_message": false, "skip_special_tokens": true,
        "separate_reasoning": true, "stream_reasoning": true, "return_hidden_states": false, "include_reasoning": true});
    let mut body = chat(2);
    for (k, v) in sglang_fields.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (st, _, rendered) = post(&s.url("/v1/chat/completions/render"), &body).await;
    assert_eq!(st, 200, "{rendered}");
    let ids = rendered["token_ids"].as_array().expect("token_ids").len();
    let (st, _, done) = post(&s.url("/v1/chat/completions"), &body).await;
    assert_eq!(st, 200, "the gateway's fields are accepted: {done}");
    assert_eq!(done["usage"]["prompt_tokens"].as_u64(), Some(ids as u64), "render gives what is prefilled");
    let (_, _, tok) = post(&s.url("/tokenize"), &json!({"messages": body["messages"]})).await;
    assert_eq!(tok["count"].as_u64(), Some(ids as u64));
    // vLLM's shape for completions, a list with one `{"token_ids"}` per prompt (llm-d's token
    // producer reads it), each the ids the completion prefills.
    let (st, _, c) = post(&s.url("/v1/completions/render"), &json!({"prompt": ["a b", "c"], "max_tokens": 1})).await;
    let lens: Vec<_> = c.as_array().map(|a| a.iter().filter_map(|p| p["token_ids"].as_array().map(Vec::len)).collect()).unwrap_or_default();
    assert!(st == 200 && lens.len() == 2, "{c}");
    let (st, _, done) = post(&s.url("/v1/completions"), &json!({"prompt": "a b", "max_tokens": 1})).await;
    assert_eq!(st, 200, "{done}");
    assert_eq!(done["usage"]["prompt_tokens"].as_u64(), Some(lens[0] as u64), "render gives what is prefilled");
    // A render is validated as the request would be.
    let (st, _, e) = post(&s.url("/v1/chat/completions/render"), &json!({"messages": [], "max_tokens": 1})).await;
    assert_eq!(st, 400, "{e}");
    let (st, _, e) = post(&s.url("/v1/chat/completions"), &json!({"messages": [{"role": "user", "content": "x"}], "return_hidden_states": true})).await;
    assert_eq!((st, e["error"]["param"].as_str()), (400, Some("return_hidden_states")), "{e}");
    // no_stop_trim keeps the stop string, as include_stop_str_in_output does.
    let stop = |extra: Value| {
        let mut b = json!({"prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": 8, "temperature": 0, "stop": [","]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let url = s.url("/v1/completions");
        async move { post(&url, &b).await.2["choices"][0]["text"].as_str().unwrap_or_default().to_string() }
    };
    let (trimmed, kept) = (stop(json!({})).await, stop(json!({"no_stop_trim": true})).await);
    assert!(kept.ends_with(',') && !trimmed.ends_with(',') && kept.starts_with(&trimmed), "{trimmed:?} {kept:?}");

    // The llm-d router's objectives become the request's reading class: an hour of TTFT grace
    // leaves nothing late; a header that is not milliseconds is a 400.
    let with_headers = |id: &'static str, ttft: &'static str| {
        let url = s.url("/v1/completions");
        async move {
            let r = reqwest::Client::new()
                .post(url)
                .header("x-request-id", id)
                .header("x-llm-d-slo-ttft-ms", ttft)
                .header("x-llm-d-slo-tpot-ms", "200")
                .json(&json!({"prompt": "Hello", "max_tokens": 4}))
                .send()
                .await
                .unwrap();
            r.status().as_u16()
        }
    };
    assert_eq!(with_headers("slo-hour", "3600000").await, 200);
    assert_eq!(with_headers("slo-bad", "soon").await, 400);
    let (st, _, _) = post(&s.url("/v1/completions"), &json!({"prompt": "Hello", "max_tokens": 4})).await;
    assert_eq!(st, 200);
    let idle = |log: &str| -> Option<String> {
        let line = log.lines().find(|l| l.contains("request finished") && l.contains("cmpl-slo-hour"))?;
        line.split("idle_s=").nth(1).map(|v| v.split_whitespace().next().unwrap_or("").to_string())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while idle(&s.log_text()).is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(idle(&s.log_text()).as_deref(), Some("0.0"), "{}", s.log_text());

    let (st, load) = get(&s.url("/get_load")).await;
    let load: Value = serde_json::from_str(&load).unwrap();
    assert_eq!(st, 200);
    let l = &load[0];
    assert!(l["dp_rank"] == 0 && l["num_reqs"].is_u64() && l["num_waiting_reqs"].is_u64() && l["num_tokens"].is_u64(), "{load}");
    let (_, v) = get(&s.url("/get_load?format=vllm")).await;
    assert!(serde_json::from_str::<Value>(&v).unwrap()["load"].is_u64(), "{v}");
    assert_eq!(get(&s.url("/get_load?format=nope")).await.0, 400);
    for path in ["/server_info", "/get_server_info", "/model_info", "/get_model_info"] {
        let (st, v) = get(&s.url(path)).await;
        let v: Value = serde_json::from_str(&v).unwrap();
        assert_eq!((st, v["served_model_name"].as_str()), (200, Some("SmolLM2-135M-Instruct")), "{path}: {v}");
    }
    let (_, info) = get(&s.url("/server_info")).await;
    let info: Value = serde_json::from_str(&info).unwrap();
    assert!(info["max_total_num_tokens"].as_u64().unwrap() >= info["context_length"].as_u64().unwrap(), "{info}");
}
