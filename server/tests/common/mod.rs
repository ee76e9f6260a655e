//! Test harness: a real `pace serve` on 127.0.0.1 (the real default model), real HTTP clients.
#![allow(dead_code)]

pub mod schema;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::Value;

/// The child dies with the test process even when a test panics.
pub fn die_with_test(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// A running server; killed on drop.
pub struct Server {
    child: Mutex<Option<Child>>,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its log file.
    pub log: PathBuf,
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Server {
    /// Starts `pace serve` with small defaults plus `args`, and waits for `/health` = 200.
    pub fn start(args: &[&str]) -> Server {
        Self::start_at(free_port(), args)
    }

    /// As [`Server::start`], on `port` (a replica restarted where a router knows it).
    pub fn start_at(port: u16, args: &[&str]) -> Server {
        let log = std::env::temp_dir().join(format!("pace-test-{}-{port}.log", std::process::id()));
        let logf = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pace"));
        cmd.args(["serve", "--host", "127.0.0.1", "--port", &port.to_string()]);
        for (flag, default) in [("--kv-cache-memory", "128MiB"), ("--max-model-len", "2048")] {
            let sized_otherwise = flag == "--kv-cache-memory" && args.contains(&"--kv-cache-blocks");
            if !args.contains(&flag) && !sized_otherwise {
                cmd.args([flag, default]);
            }
        }
        cmd.args(args).env("RUST_LOG", "info").stdin(Stdio::null()).stdout(logf.try_clone().unwrap()).stderr(logf);
        die_with_test(&mut cmd);
        let child = cmd.spawn().expect("spawning pace serve");
        let server = Server { child: Mutex::new(Some(child)), base: format!("http://127.0.0.1:{port}"), log };
        server.wait_healthy(Duration::from_secs(240));
        server
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.base.rsplit(':').next().and_then(|p| p.parse().ok()).expect("a port")
    }

    /// Kills the process at once (SIGKILL) and reaps it.
    pub fn kill(&self) {
        if let Some(mut c) = self.child.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits until `/health` answers 200.
    pub fn wait_healthy(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(r) = ureq_get(&format!("{}/health", self.base)) {
                if r.0 == 200 {
                    return;
                }
            }
            if let Some(c) = self.child.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!("pace serve exited early ({status}):\n{}", self.log_text());
                }
            }
            if Instant::now() > deadline {
                panic!("pace serve did not become healthy:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// Sends a signal to the server process.
    pub fn signal(&self, sig: i32) {
        if let Some(c) = self.child.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    /// Waits for the process to exit; returns its exit code.
    pub fn wait_exit(&self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(c) = self.child.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    return status.code();
                }
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Current value of a metric line (exact series name with labels as rendered, e.g.
    /// `pace_requests_total` with `finished_reason="abort"`), summed over matching lines.
    pub async fn metric(&self, name: &str, label_filter: &[&str]) -> f64 {
        let text = reqwest::get(self.url("/metrics")).await.unwrap().text().await.unwrap();
        metric_value(&text, name, label_filter)
    }
}

/// Sum of the samples of `name` whose labels contain every `filter` string.
pub fn metric_value(text: &str, name: &str, filter: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && (l[name.len()..].starts_with('{') || l[name.len()..].starts_with(' ')))
        .filter(|l| filter.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Minimal blocking GET (for health polling without a runtime): (status, body).
pub fn ureq_get(url: &str) -> std::io::Result<(u16, String)> {
    use std::io::Write;
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').map(|(h, p)| (h, format!("/{p}"))).unwrap_or((rest, "/".into()));
    let mut s = std::net::TcpStream::connect(host)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    let code = buf.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((code, body))
}

/// A POST with a JSON body; returns status, headers and parsed JSON (or Null).
pub async fn post(url: &str, body: &Value) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = reqwest::Client::new().post(url).json(body).send().await.unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap();
    (status, headers, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// A POST with a raw body and content type.
pub async fn post_raw(url: &str, content_type: &str, body: Vec<u8>) -> (u16, String, Value) {
    let r = reqwest::Client::new().post(url).header("content-type", content_type).body(body).send().await.unwrap();
    let status = r.status().as_u16();
    let ct = r.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let text = r.text().await.unwrap();
    (status, ct, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// One SSE data frame as received, with the time it was read.
#[derive(Debug, Clone)]
pub struct Frame {
    /// The `data:` payload (`[DONE]` or JSON text).
    pub data: String,
    /// When the client read it (seconds since the request was sent).
    pub at: f64,
}

/// Sends a streaming request and reads every frame. Returns (status, frames); the raw text of
/// the body is checked to be well-formed SSE (`data: ...\n\n` frames only).
pub async fn stream(url: &str, body: &Value) -> (u16, Vec<Frame>) {
    let t0 = Instant::now();
    let r = reqwest::Client::new().post(url).json(body).send().await.unwrap();
    let status = r.status().as_u16();
    if status != 200 {
        return (status, vec![Frame { data: r.text().await.unwrap(), at: t0.elapsed().as_secs_f64() }]);
    }
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let mut frames = Vec::new();
    let mut buf = String::new();
    let mut body = r.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.unwrap();
        let at = t0.elapsed().as_secs_f64();
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = buf.find("\n\n") {
            let raw: String = buf.drain(..end + 2).collect();
            let data = raw.trim_end().strip_prefix("data: ").unwrap_or_else(|| panic!("not an SSE data frame: {raw:?}"));
            assert!(!data.contains('\n'), "multi-line frame {raw:?}");
            frames.push(Frame { data: data.to_string(), at });
        }
    }
    assert!(buf.is_empty(), "trailing bytes after the last frame: {buf:?}");
    (status, frames)
}

/// Concatenated text of a stream's choice `index` (completions `text` or chat `delta.content`).
pub fn stream_text(frames: &[Frame], index: u64) -> String {
    let mut s = String::new();
    for f in frames {
        if f.data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(&f.data).unwrap();
        for c in v["choices"].as_array().into_iter().flatten() {
            if c["index"].as_u64() == Some(index) {
                if let Some(t) = c["text"].as_str() {
                    s.push_str(t);
                }
                if let Some(t) = c["delta"]["content"].as_str() {
                    s.push_str(t);
                }
            }
        }
    }
    s
}
