//! KV events end to end: `pace serve --kv-events-config` publishes its prefix cache's changes
//! over ZeroMQ in vLLM's wire format, and a real subscriber (pyzmq + msgpack from pip, the
//! libraries a router written for vLLM uses; server/tests/kv_subscriber.py) rebuilds the block
//! index from them during a workload with evictions (the server starts first and connects once
//! the subscriber listens). After every request, the subscriber's
//! prediction of the next prompt's cached tokens (its own walk of the index, keyed by the token
//! ids from the render endpoint) equals what pace reports it found cached, and the render
//! endpoint's token ids are what pace prefilled. A replay request returns the batches sent live.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use common::{free_port, post, Server};
use serde_json::{json, Value};

const BLOCK: usize = 16;

/// Python with pyzmq and msgpack: `PACE_KV_EVENTS_VENV` if set, else a venv under target/.
fn python() -> PathBuf {
    let venv = match std::env::var("PACE_KV_EVENTS_VENV") {
        Ok(v) => PathBuf::from(v),
        Err(_) => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/kv-events-venv"),
    };
    let py = venv.join("bin/python");
    let has = |py: &PathBuf| Command::new(py).args(["-c", "import zmq, msgpack"]).status().is_ok_and(|s| s.success());
    if !has(&py) {
        let ok = (py.exists() || Command::new("python3").args(["-m", "venv"]).arg(&venv).status().is_ok_and(|s| s.success()))
            && Command::new(&py)
                .args(["-m", "pip", "install", "-q", "--disable-pip-version-check", "pyzmq>=26", "msgpack>=1"])
                .status()
                .is_ok_and(|s| s.success());
        assert!(ok && has(&py), "could not install pyzmq and msgpack into {}", venv.display());
    }
    py
}

struct Subscriber {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Subscriber {
    fn start(sub: &str, replay: &str, topic: &str) -> Subscriber {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kv_subscriber.py");
        let mut cmd = Command::new(python());
        cmd.arg(script).args([sub, replay, topic]).stdin(Stdio::piped()).stdout(Stdio::piped());
        common::die_with_test(&mut cmd);
        let mut child = cmd.spawn().expect("starting the subscriber");
        let (stdin, stdout) = (child.stdin.take().unwrap(), BufReader::new(child.stdout.take().unwrap()));
        let mut s = Subscriber { child, stdin, stdout };
        assert_eq!(s.read()["ready"], true);
        s
    }

    fn read(&mut self) -> Value {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("the subscriber answers");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("subscriber said {line:?}: {e}"))
    }

    fn ask(&mut self, cmd: Value) -> Value {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        self.read()
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_rebuilds_the_prefix_cache_from_the_events() {
    let (sub_port, replay_port) = (free_port(), free_port());
    let (sub_ep, replay_ep) = (format!("tcp://127.0.0.1:{sub_port}"), format!("tcp://127.0.0.1:{replay_port}"));
    let topic = "kv@127.0.0.1@test";
    let cfg = json!({"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": sub_ep, "replay_endpoint": replay_ep, "topic": topic}).to_string();
    // pace connects to the subscriber's address (vLLM's rule for an endpoint without a wildcard
    // host), so nothing here listens beyond 127.0.0.1. The server starts first and serves
    // without its subscriber; it connects once the subscriber listens. 48 blocks of 16 tokens:
    // a handful of prompts fill it, so later ones evict earlier ones.
    let server = Server::start(&[
        "--model",
        "dummy:smollm2-135m",
        "--threads",
        "2",
        "--block-size",
        "16",
        "--kv-cache-blocks",
        "48",
        "--max-model-len",
        "512",
        "--kv-events-config",
        &cfg,
    ]);
    let mut subscriber = Subscriber::start(&sub_ep, &replay_ep, topic);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !server.log_text().contains("KV events: connected") {
        assert!(std::time::Instant::now() < deadline, "pace never connected to the subscriber:\n{}", server.log_text());
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // The subscription reaches the publisher moments after the connection.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;

    // Three long system prompts, each shared by several questions, visited in an order that
    // brings evicted ones back.
    let systems: Vec<String> =
        (0..3).map(|k| format!("You are assistant number {k}. ") + &format!("Rule {k}: answer briefly and politely. ").repeat(4)).collect();
    let mut checked_hits = 0;
    for (i, k) in [0, 0, 1, 1, 2, 0, 2, 1, 0, 2, 2, 1].into_iter().enumerate() {
        let body = json!({
            "messages": [{"role": "system", "content": systems[k]}, {"role": "user", "content": format!("Question {i}?")}],
            "max_tokens": 2,
            "temperature": 0,
        });
        let (status, _, rendered) = post(&server.url("/v1/chat/completions/render"), &body).await;
        assert_eq!(status, 200, "{rendered}");
        let tokens = rendered["token_ids"].as_array().expect("token ids").clone();
        let predicted = subscriber.ask(json!({"cmd": "predict", "tokens": tokens, "block_size": BLOCK}))["cached_tokens"].as_u64().unwrap();
        let (status, _, out) = post(&server.url("/v1/chat/completions"), &body).await;
        assert_eq!(status, 200, "{out}");
        assert_eq!(out["usage"]["prompt_tokens"].as_u64().unwrap() as usize, tokens.len(), "the render endpoint's tokens are the ones prefilled");
        let cached = out["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        assert_eq!(predicted, cached, "request {i}: the subscriber's index predicts what pace finds cached");
        checked_hits += usize::from(cached > 0);
    }
    let stats = subscriber.ask(json!({"cmd": "stats"}));
    eprintln!("{checked_hits} of 12 requests found a cached prefix; subscriber: {stats}");
    assert!(checked_hits >= 4, "the workload reuses prefixes: {checked_hits} hits, {stats}");
    assert!(stats["removed"].as_u64().unwrap() > 0, "the workload evicts: {stats}");
    assert_eq!(stats["gaps"], 0, "no sequence gap: {stats}");
    assert_eq!(stats["bad_topic"], 0, "{stats}");
    assert_eq!(stats["media"], json!(["CPU"]), "{stats}");
    assert!(stats["blocks"].as_u64().unwrap() <= 47, "the index holds no more than the pool: {stats}");

    // A subscriber that missed the start asks the replay socket for it.
    let last = stats["last_seq"].as_u64().unwrap();
    let replay = subscriber.ask(json!({"cmd": "replay", "from": 0}));
    assert_eq!(replay["replayed"].as_u64().unwrap(), last + 1, "{replay}");
    assert_eq!((replay["first"].as_u64(), replay["last"].as_u64(), &replay["same"]), (Some(0), Some(last), &json!(true)), "{replay}");
    let tail = subscriber.ask(json!({"cmd": "replay", "from": last}));
    assert_eq!(tail["replayed"], 1, "{tail}");
}

/// A configuration pace cannot honour stops it at start-up with the reason.
#[test]
fn a_bad_configuration_stops_the_server() {
    let out = Command::new(env!("CARGO_BIN_EXE_pace"))
        .args(["serve", "--model", "dummy:smollm2-135m", "--host", "127.0.0.1", "--port", &free_port().to_string()])
        .args(["--kv-events-config", r#"{"enable_kv_cache_events": true, "publisher": "kafka"}"#])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("publisher \"kafka\""), "{err}");
}
