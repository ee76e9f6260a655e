//! `pace bench hostile`: what hostile clients cost everybody else. Polite users stream answers
//! in a closed loop while a `/health` prober asks on a fresh connection every
//! `--health-interval`; the same load runs three times on one server: alone, with the
//! attackers, alone again (the two calm phases bracket the attacked one, so drift shows). The
//! report compares the polite users' TTFT and TPOT percentiles and `/health`'s latency across
//! the phases.
//!
//! The attackers, all at once, for the whole attacked phase:
//! - **idle flood**: `--idle-connections` sockets that send nothing (every third sends only the
//!   HTTP/2 preface and a SETTINGS frame), each reopened as soon as the server closes it;
//! - **slowloris**: `--slow-connections` sockets that send a request head one byte per
//!   `--slow-byte-interval` seconds, reopened when cut;
//! - **amplification**: `--heavy-per-s` bodies per second just under the 4 MiB body limit that
//!   are costly to refuse: 40,000 tools, 250,000 `logit_bias` entries, 450,000 stop token ids,
//!   a 3,000-deep JSON schema, 100,000 chat messages (each must get a 4xx, quickly);
//! - **leavers**: `--leavers-per-s` streamed requests that hang up after their first token.
//!
//! Targets (issue 43): the polite users' TPOT p99 within 1.2x of the calm phases' and `/health`
//! p99 under 1 s; no polite request fails. Every run is bounded in time (`--duration` per
//! phase, each request by `--request-timeout`) and in sockets.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::launch::ServerArgs;
use crate::soak::{slow_connection, socket_addr, SlowStats};
use crate::sse::SseParser;

/// `pace bench hostile`.
#[derive(Debug, Clone, Args)]
pub struct HostileArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Model name sent with each request (default: the first one on /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    /// Seconds of each of the three phases.
    #[arg(long, default_value_t = 120.0)]
    pub duration: f64,
    /// Polite users, each streaming one request after another.
    #[arg(long, default_value_t = 4)]
    pub users: usize,
    /// Words in a polite user's prompt.
    #[arg(long, default_value_t = 100)]
    pub prompt_words: usize,
    /// Tokens a polite user asks for (ignore_eos).
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Seconds between two /health probes.
    #[arg(long, default_value_t = 0.25)]
    pub health_interval: f64,
    /// Idle sockets of the flood.
    #[arg(long, default_value_t = 1100)]
    pub idle_connections: usize,
    /// Slow-header sockets.
    #[arg(long, default_value_t = 200)]
    pub slow_connections: usize,
    /// Seconds between two bytes of a slow socket.
    #[arg(long, default_value_t = 1.0)]
    pub slow_byte_interval: f64,
    /// Costly-to-refuse bodies sent per second.
    #[arg(long, default_value_t = 1.0)]
    pub heavy_per_s: f64,
    /// Streamed requests per second that hang up after their first token.
    #[arg(long, default_value_t = 1.0)]
    pub leavers_per_s: f64,
    /// A request still unanswered after this many seconds has failed.
    #[arg(long, default_value_t = 120.0)]
    pub request_timeout: f64,
    /// Directory for report.md and hostile.json (default: pace-hostile).
    #[arg(long)]
    pub result_dir: Option<PathBuf>,
}

/// The polite users' and the prober's view of one phase.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Phase {
    pub name: String,
    /// Polite requests that streamed to their end.
    pub completed: usize,
    /// Polite requests that failed: a non-200, a stream error, a cut, a timeout.
    pub failed: usize,
    /// The first few failures.
    pub failures: Vec<String>,
    pub ttft_s: Vec<f64>,
    /// Per request: (last token - first token) / (tokens - 1).
    pub tpot_s: Vec<f64>,
    /// Per probe: seconds to a 200 (`request_timeout` when it failed).
    pub health_s: Vec<f64>,
    pub health_failed: usize,
}

/// What the attackers did and what they got.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Attack {
    pub idle_opened: usize,
    /// Idle sockets the server closed.
    pub idle_closed: usize,
    pub slow: SlowStats,
    /// Per heavy body: (kind, status or 0, seconds).
    pub heavy: Vec<(String, u16, f64)>,
    /// Leavers by outcome (`left`, or what went wrong).
    pub leavers: std::collections::BTreeMap<String, usize>,
}

/// One target-against-measure judgement.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub passed: bool,
    pub detail: String,
}

/// `hostile.json`.
#[derive(Debug, Clone, Serialize)]
pub struct HostileReport {
    pub provenance: crate::provenance::Provenance,
    pub target: String,
    pub phases: Vec<Phase>,
    pub attack: Attack,
    pub checks: Vec<Check>,
    pub passed: bool,
}

/// Quantile `q` (0 to 1) of `v`, interpolated between ranks as every other report of pace's
/// does (`slo::percentile_sorted`); 0 for none.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    pace_scheduler::slo::percentile_sorted(&v, 100.0 * q)
}

#[derive(Clone)]
struct Target {
    base: String,
    addr: SocketAddr,
    model: String,
}

/// One polite streamed request: Ok((ttft, tpot)) or what went wrong.
async fn polite(client: &reqwest::Client, t: &Target, i: usize, a: &HostileArgs) -> Result<(f64, Option<f64>), String> {
    let words: Vec<String> = (0..a.prompt_words).map(|w| format!("w{}", (i * 7919 + w * 104_729) % 5000)).collect();
    let body = json!({"model": t.model, "prompt": format!("Request {i}: {}", words.join(" ")), "max_tokens": a.max_tokens,
        "ignore_eos": true, "temperature": 0, "stream": true});
    let start = Instant::now();
    let go = async {
        let mut r = client
            .post(format!("{}/v1/completions", t.base))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| format!("send: {e}"))?;
        if r.status() != 200 {
            return Err(format!("status {}", r.status().as_u16()));
        }
        let (mut parser, mut times, mut done) = (SseParser::default(), Vec::new(), false);
        while let Some(chunk) = r.chunk().await.map_err(|e| format!("stream: {e}"))? {
            let now = start.elapsed().as_secs_f64();
            for data in parser.push(&chunk) {
                if data.trim() == "[DONE]" {
                    done = true;
                    continue;
                }
                let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
                if v.get("error").is_some() {
                    return Err(format!("stream error: {}", crate::sse::truncate(&data, 200)));
                }
                if v["choices"][0]["text"].as_str().is_some_and(|s| !s.is_empty()) {
                    times.push(now);
                }
            }
        }
        match (done, times.first(), times.last()) {
            (true, Some(&first), Some(&last)) => Ok((first, (times.len() > 1).then(|| (last - first) / (times.len() - 1) as f64))),
            _ => Err(format!("stream ended without [DONE] or tokens ({} tokens)", times.len())),
        }
    };
    tokio::time::timeout(Duration::from_secs_f64(a.request_timeout), go).await.unwrap_or_else(|_| Err("timeout".into()))
}

/// Runs the polite users and the prober for `--duration`.
async fn phase(name: &str, client: &reqwest::Client, t: &Target, a: &HostileArgs, first_index: usize) -> Phase {
    let out = Arc::new(Mutex::new(Phase { name: name.into(), ..Phase::default() }));
    let deadline = Instant::now() + Duration::from_secs_f64(a.duration);
    let next = Arc::new(AtomicUsize::new(first_index));
    let mut set = JoinSet::new();
    for _ in 0..a.users.max(1) {
        let (client, t, a, out, next) = (client.clone(), t.clone(), a.clone(), out.clone(), next.clone());
        set.spawn(async move {
            while Instant::now() < deadline {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let r = polite(&client, &t, i, &a).await;
                let mut o = out.lock().unwrap();
                match r {
                    Ok((ttft, tpot)) => {
                        o.completed += 1;
                        o.ttft_s.push(ttft);
                        o.tpot_s.extend(tpot);
                    }
                    Err(e) => {
                        o.failed += 1;
                        if o.failures.len() < 5 {
                            o.failures.push(e);
                        }
                    }
                }
            }
        });
    }
    let (base, out2, interval, timeout) = (t.base.clone(), out.clone(), a.health_interval, a.request_timeout.min(10.0));
    set.spawn(async move {
        let fresh = reqwest::Client::builder().pool_max_idle_per_host(0).build().expect("http client");
        let mut tick = tokio::time::interval(Duration::from_secs_f64(interval));
        while Instant::now() < deadline {
            tick.tick().await;
            let start = Instant::now();
            let ok = fresh.get(format!("{base}/health")).timeout(Duration::from_secs_f64(timeout)).send().await.is_ok_and(|r| r.status() == 200);
            let mut o = out2.lock().unwrap();
            o.health_s.push(if ok { start.elapsed().as_secs_f64() } else { timeout });
            o.health_failed += usize::from(!ok);
        }
    });
    while set.join_next().await.is_some() {}
    let p = out.lock().unwrap().clone();
    p
}

/// One idle socket of the flood, reopened whenever the server closes it.
async fn idle_socket(addr: SocketAddr, h2: bool, stop: Arc<AtomicBool>, opened: Arc<AtomicUsize>, closed: Arc<AtomicUsize>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(Ok(mut c)) = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr)).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        opened.fetch_add(1, Ordering::Relaxed);
        if h2 {
            let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
            hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
            let _ = c.write_all(&hello).await;
        }
        let mut buf = [0u8; 1024];
        loop {
            tokio::select! {
                r = c.read(&mut buf) => if matches!(r, Ok(0) | Err(_)) { closed.fetch_add(1, Ordering::Relaxed); break },
                _ = tokio::time::sleep(Duration::from_millis(200)) => if stop.load(Ordering::Relaxed) { return },
            }
        }
    }
}

/// The costly-to-refuse bodies: (kind, path, bytes).
fn heavy_bodies(model: &str) -> Vec<(&'static str, &'static str, Arc<Vec<u8>>)> {
    let tools: Vec<Value> = (0..40_000).map(|i| json!({"type": "function", "function": {"name": format!("f{i}"), "parameters": {"type": "object"}}})).collect();
    let bias: serde_json::Map<String, Value> = (0..250_000).map(|i| (i.to_string(), json!(1))).collect();
    // Written as text: a 3,000-deep `Value` would overflow a worker's stack when built or dropped.
    let depth = 3000;
    let schema = format!("{}{{\"type\":\"string\"}}{}", "{\"type\":\"object\",\"properties\":{\"a\":".repeat(depth), "}}".repeat(depth));
    let messages: Vec<Value> = (0..100_000).map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": "hi"})).collect();
    let chat = |extra: Value| {
        let mut b = json!({"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8});
        for (k, v) in extra.as_object().into_iter().flatten() {
            b[k] = v.clone();
        }
        b
    };
    let bodies = [
        ("tools_40k", chat(json!({ "tools": tools }))),
        ("logit_bias_250k", chat(json!({ "logit_bias": bias }))),
        ("stop_token_ids_450k", chat(json!({ "stop_token_ids": (0..450_000).collect::<Vec<u32>>() }))),
        ("messages_100k", json!({"model": model, "messages": messages, "max_tokens": 8})),
    ];
    let mut out: Vec<_> = bodies.into_iter().map(|(k, b)| (k, "/v1/chat/completions", Arc::new(serde_json::to_vec(&b).expect("json")))).collect();
    let mut deep =
        serde_json::to_string(&chat(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "deep", "schema": "SCHEMA"}}}))).expect("json");
    deep = deep.replace("\"SCHEMA\"", &schema);
    out.insert(3, ("schema_depth_3000", "/v1/chat/completions", Arc::new(deep.into_bytes())));
    out
}

/// Sends a request every `1 / rate` seconds until `stop`, each on its own task.
async fn every<F, Fut>(rate: f64, stop: Arc<AtomicBool>, mut f: F)
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    if rate <= 0.0 {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let mut set = JoinSet::new();
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        set.spawn(f(i));
        i += 1;
    }
    while set.join_next().await.is_some() {}
}

/// A streamed request that hangs up after its first token.
async fn leaver(client: reqwest::Client, t: Target, i: usize, timeout: f64) -> String {
    let body =
        json!({"model": t.model, "messages": [{"role": "user", "content": format!("Tell me a long story, number {i}.")}], "max_tokens": 512, "stream": true});
    let go = async {
        let mut r = client
            .post(format!("{}/v1/chat/completions", t.base))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|_| "transport_error".to_string())?;
        if r.status() != 200 {
            return Err(format!("status_{}", r.status().as_u16()));
        }
        let mut parser = SseParser::default();
        while let Some(c) = r.chunk().await.map_err(|_| "stream_error".to_string())? {
            if parser.push(&c).iter().any(|d| d.contains("\"content\"")) {
                return Ok("left".to_string());
            }
        }
        Err("ended_before_a_token".into())
    };
    tokio::time::timeout(Duration::from_secs_f64(timeout), go).await.unwrap_or_else(|_| Err("timeout".into())).unwrap_or_else(|e| e)
}

/// Runs every attacker until `stop`.
async fn attack(client: reqwest::Client, t: Target, a: HostileArgs, stop: Arc<AtomicBool>) -> Attack {
    let (opened, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let slow = Arc::new(Mutex::new(SlowStats::default()));
    let heavy = Arc::new(Mutex::new(Vec::new()));
    let leavers = Arc::new(Mutex::new(std::collections::BTreeMap::new()));
    let mut set = JoinSet::new();
    for k in 0..a.idle_connections {
        set.spawn(idle_socket(t.addr, k % 3 == 0, stop.clone(), opened.clone(), closed.clone()));
    }
    for _ in 0..a.slow_connections {
        set.spawn(slow_connection(t.addr, Duration::from_secs_f64(a.slow_byte_interval), stop.clone(), slow.clone()));
    }
    let bodies = Arc::new(heavy_bodies(&t.model));
    let (c, base, h, timeout) = (client.clone(), t.base.clone(), heavy.clone(), a.request_timeout);
    set.spawn(every(a.heavy_per_s, stop.clone(), move |i| {
        let (c, base, h, bodies) = (c.clone(), base.clone(), h.clone(), bodies.clone());
        async move {
            let (kind, path, bytes) = bodies[i % bodies.len()].clone();
            let start = Instant::now();
            let sent = c
                .post(format!("{base}{path}"))
                .header("content-type", "application/json")
                .body(bytes.to_vec())
                .timeout(Duration::from_secs_f64(timeout))
                .send();
            let status = match sent.await {
                Ok(r) => {
                    let s = r.status().as_u16();
                    let _ = r.bytes().await;
                    s
                }
                Err(_) => 0,
            };
            h.lock().unwrap().push((kind.to_string(), status, start.elapsed().as_secs_f64()));
        }
    }));
    let (c, tt, l) = (client.clone(), t.clone(), leavers.clone());
    set.spawn(every(a.leavers_per_s, stop.clone(), move |i| {
        let (c, tt, l) = (c.clone(), tt.clone(), l.clone());
        async move {
            let outcome = leaver(c, tt, i, timeout).await;
            *l.lock().unwrap().entry(outcome).or_insert(0usize) += 1;
        }
    }));
    while set.join_next().await.is_some() {}
    let out = Attack {
        idle_opened: opened.load(Ordering::Relaxed),
        idle_closed: closed.load(Ordering::Relaxed),
        slow: slow.lock().unwrap().clone(),
        heavy: heavy.lock().unwrap().clone(),
        leavers: leavers.lock().unwrap().clone(),
    };
    out
}

/// The checks of the targets.
fn judge(phases: &[Phase], attack: &Attack) -> Vec<Check> {
    let calm: Vec<&Phase> = phases.iter().filter(|p| p.name != "attacked").collect();
    let Some(hit) = phases.iter().find(|p| p.name == "attacked") else { return Vec::new() };
    let pooled = |f: fn(&Phase) -> &Vec<f64>| calm.iter().flat_map(|p| f(p).iter().copied()).collect::<Vec<f64>>();
    let calm_tpot = quantile(&pooled(|p| &p.tpot_s), 0.99);
    let hit_tpot = quantile(&hit.tpot_s, 0.99);
    let health = quantile(&hit.health_s, 0.99);
    let failed: usize = phases.iter().map(|p| p.failed).sum();
    let heavy_bad: Vec<String> = attack.heavy.iter().filter(|(_, s, _)| !(400..500).contains(s)).map(|(k, s, t)| format!("{k}: {s} after {t:.1} s")).collect();
    vec![
        Check {
            name: "others' TPOT p99 within 1.2x".into(),
            passed: calm_tpot > 0.0 && hit_tpot <= 1.2 * calm_tpot,
            detail: format!("{:.1} ms attacked vs {:.1} ms calm ({:.2}x)", hit_tpot * 1e3, calm_tpot * 1e3, hit_tpot / calm_tpot.max(1e-9)),
        },
        Check {
            name: "/health p99 under 1 s".into(),
            passed: health < 1.0 && hit.health_failed == 0,
            detail: format!("{:.3} s, {} failed", health, hit.health_failed),
        },
        Check { name: "no polite request failed".into(), passed: failed == 0, detail: format!("{failed} failed") },
        Check {
            name: "every costly body refused with a 4xx".into(),
            passed: heavy_bad.is_empty() && !attack.heavy.is_empty(),
            detail: if heavy_bad.is_empty() { format!("{} of {}", attack.heavy.len(), attack.heavy.len()) } else { heavy_bad.join("; ") },
        },
    ]
}

/// Runs the three phases and writes report.md and hostile.json.
pub async fn hostile(a: &HostileArgs) -> Result<HostileReport> {
    if !(a.duration > 0.0 && a.health_interval > 0.0 && a.slow_byte_interval > 0.0 && a.request_timeout > 0.0) {
        bail!("--duration, --health-interval, --slow-byte-interval and --request-timeout must be positive");
    }
    // The attackers' sockets and the users' need more descriptors than the usual 1,024.
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let prov = crate::provenance::collect();
    let dir = a.result_dir.clone().unwrap_or_else(|| PathBuf::from("pace-hostile"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let client = reqwest::Client::builder().pool_max_idle_per_host(64).build()?;
    let (base, desc, mut server) = a.server.start(&client, &dir.join("logs")).await?;
    let model = match &a.model {
        Some(m) => m.clone(),
        None => crate::client::first_model(&client, &base, None).await?.0,
    };
    let t = Target { addr: socket_addr(&base)?, base, model };
    let mut phases = Vec::new();
    eprintln!("phase 1 of 3: calm, {} s", a.duration);
    phases.push(phase("calm", &client, &t, a, 0).await);
    eprintln!("phase 2 of 3: attacked, {} s", a.duration);
    let stop = Arc::new(AtomicBool::new(false));
    let attackers = tokio::spawn(attack(client.clone(), t.clone(), a.clone(), stop.clone()));
    phases.push(phase("attacked", &client, &t, a, 1_000_000).await);
    stop.store(true, Ordering::Relaxed);
    let attack = attackers.await.context("the attackers' task")?;
    eprintln!("phase 3 of 3: calm again, {} s", a.duration);
    phases.push(phase("calm again", &client, &t, a, 2_000_000).await);
    if let Some(s) = server.take() {
        let status = s.stop().await?;
        if !status.success() {
            eprintln!("warning: the server exited with {status}");
        }
    }
    let checks = judge(&phases, &attack);
    let report = HostileReport { provenance: prov, target: desc, passed: checks.iter().all(|c| c.passed), phases, attack, checks };
    std::fs::write(dir.join("hostile.json"), serde_json::to_string_pretty(&report)?)?;
    let md = markdown(&report, a);
    std::fs::write(dir.join("report.md"), &md)?;
    println!("{md}");
    Ok(report)
}

fn markdown(r: &HostileReport, a: &HostileArgs) -> String {
    let mut md = format!("# pace bench hostile: {}\n\n{}", if r.passed { "passed" } else { "FAILED" }, r.provenance.markdown());
    md.push_str(&format!(
        "- Target: `{}`\n- Polite load: {} users streaming `/v1/completions` one request after another ({} prompt words, {} tokens, ignore_eos); `/health` every {} s on a fresh connection; {} s per phase\n- Attackers (phase 2): {} idle sockets (a third HTTP/2 preface only), {} slow-header sockets ({} s a byte), {}/s costly bodies, {}/s streams that hang up after one token\n\n",
        r.target, a.users, a.prompt_words, a.max_tokens, a.health_interval, a.duration, a.idle_connections, a.slow_connections, a.slow_byte_interval, a.heavy_per_s, a.leavers_per_s
    ));
    md.push_str("| phase | polite done / failed | TTFT p50 / p99 s | TPOT p50 / p99 ms | /health p50 / p99 / max s (failed) |\n|---|---|---|---|---|\n");
    for p in &r.phases {
        md.push_str(&format!(
            "| {} | {} / {} | {:.3} / {:.3} | {:.1} / {:.1} | {:.4} / {:.4} / {:.4} ({}) |\n",
            p.name,
            p.completed,
            p.failed,
            quantile(&p.ttft_s, 0.5),
            quantile(&p.ttft_s, 0.99),
            quantile(&p.tpot_s, 0.5) * 1e3,
            quantile(&p.tpot_s, 0.99) * 1e3,
            quantile(&p.health_s, 0.5),
            quantile(&p.health_s, 0.99),
            quantile(&p.health_s, 1.0),
            p.health_failed
        ));
    }
    md.push_str("\n| check | verdict | detail |\n|---|---|---|\n");
    for c in &r.checks {
        md.push_str(&format!("| {} | {} | {} |\n", c.name, if c.passed { "pass" } else { "FAIL" }, c.detail));
    }
    let at = &r.attack;
    let mut kinds: std::collections::BTreeMap<&str, (usize, Vec<u16>, f64)> = Default::default();
    for (k, s, t) in &at.heavy {
        let e = kinds.entry(k).or_default();
        e.0 += 1;
        if !e.1.contains(s) {
            e.1.push(*s);
        }
        e.2 = e.2.max(*t);
    }
    md.push_str(&format!(
        "\nAttackers: idle sockets opened {} (closed by the server {}); slow sockets opened {}, cut {} (longest {:.1} s); leavers {:?}\n\n| costly body | sent | statuses | slowest answer s |\n|---|---|---|---|\n",
        at.idle_opened,
        at.idle_closed,
        at.slow.opened,
        at.slow.cut,
        at.slow.lifetimes_s.iter().copied().fold(0.0, f64::max),
        at.leavers
    ));
    for (k, (n, s, t)) in kinds {
        md.push_str(&format!("| {k} | {n} | {s:?} | {t:.2} |\n"));
    }
    for p in r.phases.iter().filter(|p| !p.failures.is_empty()) {
        md.push_str(&format!("\nFailures in {}: {:?}\n", p.name, p.failures));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_between_ranks() {
        let v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!((quantile(&v, 0.5), quantile(&v, 1.0), quantile(&[7.0], 0.99)), (50.5, 100.0, 7.0));
        assert!((quantile(&v, 0.99) - 99.01).abs() < 1e-9);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn the_checks_compare_the_attacked_phase_with_the_calm_ones() {
        let p = |name: &str, tpot: f64, health: f64| Phase {
            name: name.into(),
            completed: 3,
            tpot_s: vec![tpot; 3],
            health_s: vec![health; 4],
            ..Phase::default()
        };
        let attack = Attack { heavy: vec![("tools_40k".into(), 400, 0.2)], ..Attack::default() };
        let ok = judge(&[p("calm", 0.020, 0.01), p("attacked", 0.023, 0.3), p("calm again", 0.021, 0.01)], &attack);
        assert!(ok.iter().all(|c| c.passed), "{ok:?}");
        let slow = judge(&[p("calm", 0.020, 0.01), p("attacked", 0.030, 1.5), p("calm again", 0.020, 0.01)], &attack);
        assert_eq!(slow.iter().filter(|c| !c.passed).count(), 2, "{slow:?}");
        let bad = Attack { heavy: vec![("tools_40k".into(), 500, 18.0)], ..Attack::default() };
        assert!(!judge(&[p("calm", 0.02, 0.01), p("attacked", 0.02, 0.01)], &bad)[3].passed);
    }
}
