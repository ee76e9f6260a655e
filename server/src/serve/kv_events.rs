//! KV events: the prefix cache's changes published over ZeroMQ in vLLM's wire format, so that a
//! router (the llm-d endpoint picker's precise prefix scorer, or any subscriber written for
//! vLLM) can tell which replica already holds a prompt's prefix.
//!
//! `--kv-events-config` takes vLLM's JSON object. Each engine step that changed the cache sends
//! one message of three frames on a PUB socket: the topic, an 8-byte big-endian sequence number
//! (0, 1, 2, ...), and a msgpack batch `[unix_seconds, [event, ...], data_parallel_rank]` with
//! events as arrays tagged by their first element:
//! `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
//! lora_name]`, `["BlockRemoved", block_hashes, medium]`, `["AllBlocksCleared"]`. The hashes are
//! pace's own 64-bit chain hashes; `token_ids` lets a subscriber compute its own keys. With a
//! `replay_endpoint`, a ROUTER socket answers a request frame holding a start sequence number
//! (8 bytes, big-endian) with every kept batch from there on (`[seq, payload]` each) and an end
//! marker (`[-1, ""]`), so a subscriber that saw a gap can catch up.
//!
//! As in vLLM, an endpoint with a wildcard host (`tcp://*:5557`) is bound and any other is
//! connected to (a subscriber that binds, for example); the connection is made in the
//! background, retried until the subscriber listens, so it never holds up the server's start. The engine thread never waits for the
//! publisher: a batch that does not fit the queue (`max_queue_size`) is dropped and counted in
//! `pace_kv_events_dropped_total`, and a subscriber that reads too slowly loses messages
//! (ZeroMQ's PUB behaviour; its queue holds 100,000 messages), which the sequence numbers reveal.

use std::collections::VecDeque;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use pace_scheduler::block_pool::KvEvent;
use serde::Deserialize;
use tokio::sync::mpsc;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// vLLM's `--kv-events-config` object (its keys and defaults).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvEventsConfig {
    /// Publish the prefix cache's changes.
    pub enable_kv_cache_events: bool,
    /// `zmq`, or `null` (publish nothing); unset: `zmq` when enabled.
    pub publisher: Option<String>,
    /// The PUB socket's address.
    pub endpoint: String,
    /// The ROUTER socket answering replay requests; none: no replay.
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    /// ZeroMQ's high-water mark per subscriber; this implementation's is fixed at the default.
    pub hwm: usize,
    /// Batches waiting for the publisher before new ones are dropped.
    pub max_queue_size: usize,
    /// The first frame of every message (subscribers filter on its prefix).
    pub topic: String,
}

/// The high-water mark vLLM uses by default and the `zeromq` crate's PUB queue holds.
const HWM: usize = 100_000;

impl Default for KvEventsConfig {
    fn default() -> Self {
        Self {
            enable_kv_cache_events: false,
            publisher: None,
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: None,
            buffer_steps: 10_000,
            hwm: HWM,
            max_queue_size: 100_000,
            topic: String::new(),
        }
    }
}

impl KvEventsConfig {
    /// Parses the flag's JSON; `None` when it asks for no publishing.
    pub fn parse(json: &str) -> Result<Option<Self>> {
        let v: serde_json::Value = serde_json::from_str(json).context("--kv-events-config: not JSON")?;
        if !v.is_object() {
            bail!("--kv-events-config: not a JSON object");
        }
        let c: Self = serde_json::from_value(v).context("--kv-events-config: not a KV events configuration")?;
        match (c.enable_kv_cache_events, c.publisher.as_deref()) {
            (false, _) | (true, Some("null")) => return Ok(None),
            (true, None | Some("zmq")) => {}
            (true, Some(p)) => bail!("--kv-events-config: publisher {p:?} is not one of \"zmq\", \"null\""),
        }
        if c.hwm != HWM {
            bail!("--kv-events-config: hwm is fixed at {HWM} here");
        }
        if c.max_queue_size == 0 || c.buffer_steps == 0 {
            bail!("--kv-events-config: max_queue_size and buffer_steps must be positive");
        }
        Ok(Some(c))
    }
}

/// One engine step's changes, as the engine thread hands them over.
#[derive(Debug)]
pub struct Batch {
    /// Unix seconds when the step ended.
    pub ts: f64,
    /// The changes, in order.
    pub events: Vec<KvEvent>,
    /// Tokens per block.
    pub block_size: usize,
    /// Where the blocks live: "GPU" on an accelerator, "CPU" in host memory.
    pub medium: &'static str,
}

impl Batch {
    /// A batch stamped with the current time.
    pub fn now(events: Vec<KvEvent>, block_size: usize, medium: &'static str) -> Self {
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        Self { ts, events, block_size, medium }
    }
}

/// The engine thread's end of the publisher: never blocks.
#[derive(Debug, Clone)]
pub struct Sink(mpsc::Sender<Batch>);

impl Sink {
    /// Hands `batch` to the publisher, or drops it (and counts it) when the queue is full.
    pub fn send(&self, batch: Batch) {
        if self.0.try_send(batch).is_err() {
            metrics::counter!("pace_kv_events_dropped_total").increment(1);
        }
    }
}

/// Binds or connects the sockets (failing at start-up on a bad address) and starts publishing
/// on the current tokio runtime.
pub async fn start(cfg: &KvEventsConfig) -> Result<Sink> {
    let mut publisher = PubSocket::new();
    let endpoint = cfg.endpoint.as_str();
    let connect_to = if wildcard(endpoint) {
        publisher.bind(&bindable(endpoint)).await.with_context(|| format!("--kv-events-config: binding {endpoint}"))?;
        None
    } else {
        // Checked now; connected in the background (the subscriber may start later).
        zeromq::Endpoint::from_str(endpoint).with_context(|| format!("--kv-events-config: endpoint {endpoint}"))?;
        Some(endpoint.to_string())
    };
    let replay = match &cfg.replay_endpoint {
        Some(e) => {
            let mut r = RouterSocket::new();
            r.bind(&bindable(e)).await.with_context(|| format!("--kv-events-config: binding the replay socket {e}"))?;
            Some(r)
        }
        None => None,
    };
    let (tx, rx) = mpsc::channel(cfg.max_queue_size);
    let kept = Kept::default();
    if let Some(r) = replay {
        tokio::spawn(serve_replays(r, kept.clone()));
    }
    let state = Publisher { publisher, topic: Bytes::from(cfg.topic.clone().into_bytes()), next_seq: 0, kept, keep: cfg.buffer_steps };
    tokio::spawn(state.run(rx, connect_to));
    tracing::info!(endpoint, replay = cfg.replay_endpoint.as_deref().unwrap_or("none"), topic = cfg.topic, "publishing KV events");
    Ok(Sink(tx))
}

/// vLLM binds an endpoint with a wildcard host and connects to any other.
fn wildcard(endpoint: &str) -> bool {
    endpoint.contains('*') || endpoint.contains("::") || endpoint.starts_with("ipc://")
}

/// `tcp://*:P` as the socket library binds it (every IPv4 address).
fn bindable(endpoint: &str) -> String {
    endpoint.replacen("tcp://*:", "tcp://0.0.0.0:", 1)
}

/// The last batches sent: (sequence number, payload), oldest first.
type Kept = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

struct Publisher {
    publisher: PubSocket,
    topic: Bytes,
    next_seq: u64,
    kept: Kept,
    /// How many batches `kept` holds at most.
    keep: usize,
}

impl Publisher {
    /// Publishes every batch `rx` yields; with `connect_to`, first connects there, retrying
    /// until the subscriber listens (as libzmq's connect does, without holding up the server:
    /// batches wait in the queue meanwhile).
    async fn run(mut self, mut rx: mpsc::Receiver<Batch>, connect_to: Option<String>) {
        if let Some(ep) = connect_to {
            let mut warned = false;
            while let Err(e) = self.publisher.connect(&ep).await {
                if !warned {
                    tracing::warn!(endpoint = ep, error = %e, "KV events: the subscriber is not reachable yet; retrying");
                    warned = true;
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            tracing::info!(endpoint = ep, "KV events: connected");
        }
        while let Some(batch) = rx.recv().await {
            let seq = self.next_seq;
            self.next_seq += 1;
            let payload = Bytes::from(encode(&batch));
            let frames = vec![self.topic.clone(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload.clone()];
            let msg = ZmqMessage::try_from(frames).expect("three frames");
            if let Err(e) = self.publisher.send(msg).await {
                tracing::warn!(error = %e, seq, "publishing a KV events batch failed");
            }
            let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            if kept.len() == self.keep {
                kept.pop_front();
            }
            kept.push_back((seq, payload));
        }
    }
}

/// Answers replay requests: `[identity, "", start]` from a REQ socket (or `[identity, start]`
/// from a DEALER) gets every kept batch from `start` on, then the end marker.
async fn serve_replays(mut r: RouterSocket, kept: Kept) {
    while let Ok(req) = r.recv().await {
        let frames = req.into_vec();
        let (Some(id), Some(last)) = (frames.first(), frames.last()) else { continue };
        let Ok(start) = <[u8; 8]>::try_from(last.as_ref()).map(u64::from_be_bytes) else {
            tracing::debug!(frames = frames.len(), "ignoring a malformed KV events replay request");
            continue;
        };
        let delimited = frames.len() == 3;
        let reply = |seq: Bytes, payload: Bytes| {
            let mut f = vec![id.clone()];
            if delimited {
                f.push(Bytes::new());
            }
            f.extend([seq, payload]);
            ZmqMessage::try_from(f).expect("frames")
        };
        let tail: Vec<(u64, Bytes)> = {
            let kept = kept.lock().unwrap_or_else(|e| e.into_inner());
            let from = kept.partition_point(|&(s, _)| s < start);
            kept.range(from..).cloned().collect()
        };
        for (seq, payload) in tail {
            if r.send(reply(Bytes::copy_from_slice(&seq.to_be_bytes()), payload)).await.is_err() {
                break;
            }
        }
        let _ = r.send(reply(Bytes::copy_from_slice(&(-1i64).to_be_bytes()), Bytes::new())).await;
    }
}

/// The msgpack payload of one batch (vLLM's array-like encoding, data-parallel rank 0).
pub fn encode(batch: &Batch) -> Vec<u8> {
    use rmp::encode::{write_array_len, write_f64, write_nil, write_str, write_uint};
    // Writing to a Vec cannot fail.
    fn ok<T, E: std::fmt::Debug>(r: std::result::Result<T, E>) {
        r.expect("writing msgpack to memory");
    }
    let mut b = Vec::with_capacity(64 + batch.events.len() * 32);
    ok(write_array_len(&mut b, 3));
    ok(write_f64(&mut b, batch.ts));
    ok(write_array_len(&mut b, batch.events.len() as u32));
    let hashes = |b: &mut Vec<u8>, hs: &[u64]| {
        ok(write_array_len(b, hs.len() as u32));
        for &h in hs {
            ok(write_uint(b, h));
        }
    };
    for e in &batch.events {
        match e {
            KvEvent::Stored { hashes: hs, parent, tokens } => {
                ok(write_array_len(&mut b, 8));
                ok(write_str(&mut b, "BlockStored"));
                hashes(&mut b, hs);
                match parent {
                    Some(p) => ok(write_uint(&mut b, *p)),
                    None => ok(write_nil(&mut b)),
                }
                ok(write_array_len(&mut b, tokens.len() as u32));
                for &t in tokens {
                    ok(write_uint(&mut b, u64::from(t)));
                }
                ok(write_uint(&mut b, batch.block_size as u64));
                ok(write_nil(&mut b)); // lora_id
                ok(write_str(&mut b, batch.medium));
                ok(write_nil(&mut b)); // lora_name
            }
            KvEvent::Removed { hashes: hs } => {
                ok(write_array_len(&mut b, 3));
                ok(write_str(&mut b, "BlockRemoved"));
                hashes(&mut b, hs);
                ok(write_str(&mut b, batch.medium));
            }
            KvEvent::Cleared => {
                ok(write_array_len(&mut b, 1));
                ok(write_str(&mut b, "AllBlocksCleared"));
            }
        }
    }
    ok(write_uint(&mut b, 0)); // data_parallel_rank
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_reads_vllms_object() {
        assert_eq!(KvEventsConfig::parse(r#"{"enable_kv_cache_events": false}"#).unwrap(), None);
        assert_eq!(KvEventsConfig::parse(r#"{"enable_kv_cache_events": true, "publisher": "null"}"#).unwrap(), None);
        let c = KvEventsConfig::parse(r#"{"enable_kv_cache_events": true, "publisher": "zmq", "topic": "kv@10.0.0.1:8000@m"}"#).unwrap().unwrap();
        assert_eq!((c.endpoint.as_str(), c.topic.as_str(), c.buffer_steps), ("tcp://*:5557", "kv@10.0.0.1:8000@m", 10_000));
        for bad in [
            r#"{"enable_kv_cache_events": true, "publisher": "nats"}"#,
            r#"{"enable_kv_cache_events": true, "endpont": "x"}"#,
            r#"{"enable_kv_cache_events": true, "hwm": 5}"#,
            "[]",
        ] {
            assert!(KvEventsConfig::parse(bad).is_err(), "{bad}");
        }
        assert!(wildcard("tcp://*:5557") && !wildcard("tcp://127.0.0.1:5557"));
        assert_eq!(bindable("tcp://*:5557"), "tcp://0.0.0.0:5557");
    }

    /// The payload decodes, field by field, as vLLM's array-like structs.
    #[test]
    fn a_batch_encodes_as_vllms_arrays() {
        let events =
            vec![KvEvent::Stored { hashes: vec![7, u64::MAX], parent: None, tokens: vec![1, 2, 3, 4] }, KvEvent::Removed { hashes: vec![9] }, KvEvent::Cleared];
        let b = encode(&Batch { ts: 1.5, events, block_size: 2, medium: "CPU" });
        let mut r = b.as_slice();
        use rmp::decode::*;
        assert_eq!(read_array_len(&mut r).unwrap(), 3);
        assert_eq!(read_f64(&mut r).unwrap(), 1.5);
        assert_eq!(read_array_len(&mut r).unwrap(), 3);
        let mut s = [0u8; 32];
        assert_eq!(read_array_len(&mut r).unwrap(), 8);
        assert_eq!(read_str(&mut r, &mut s).unwrap(), "BlockStored");
        assert_eq!(read_array_len(&mut r).unwrap(), 2);
        assert_eq!((read_int::<u64, _>(&mut r).unwrap(), read_int::<u64, _>(&mut r).unwrap()), (7, u64::MAX));
        read_nil(&mut r).unwrap();
        assert_eq!(read_array_len(&mut r).unwrap(), 4);
        let toks: Vec<u32> = (0..4).map(|_| read_int(&mut r).unwrap()).collect();
        assert_eq!(toks, [1, 2, 3, 4]);
        assert_eq!(read_int::<u64, _>(&mut r).unwrap(), 2);
        read_nil(&mut r).unwrap();
        assert_eq!(read_str(&mut r, &mut s).unwrap(), "CPU");
        read_nil(&mut r).unwrap();
        assert_eq!(read_array_len(&mut r).unwrap(), 3);
        assert_eq!(read_str(&mut r, &mut s).unwrap(), "BlockRemoved");
        assert_eq!(read_array_len(&mut r).unwrap(), 1);
        assert_eq!(read_int::<u64, _>(&mut r).unwrap(), 9);
        assert_eq!(read_str(&mut r, &mut s).unwrap(), "CPU");
        assert_eq!(read_array_len(&mut r).unwrap(), 1);
        assert_eq!(read_str(&mut r, &mut s).unwrap(), "AllBlocksCleared");
        assert_eq!(read_int::<u64, _>(&mut r).unwrap(), 0);
        assert!(r.is_empty());
    }
}
