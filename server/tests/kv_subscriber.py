"""A KV events subscriber as a router would write one for vLLM (pyzmq + msgpack), driven over
stdin by server/tests/kv_events.rs.

    python kv_subscriber.py SUB_ENDPOINT REPLAY_ENDPOINT TOPIC

It binds SUB_ENDPOINT (pace connects to it), keeps a block index from the events, and answers
one JSON line per command line on stdin:

    {"cmd": "predict", "tokens": [...]}  -> {"cached_tokens": N}: the prompt tokens a new request
        would find cached, by walking the index from the prompt's first block (keys from the
        token ids, as a router that computes its own keys does)
    {"cmd": "stats"}                     -> counts of events seen, sequence gaps, blocks held
    {"cmd": "replay", "from": S}         -> the batches the replay socket returns from S on,
        compared with the ones received live
"""

import json
import sys

import msgpack
import zmq

sub_endpoint, replay_endpoint, topic = sys.argv[1], sys.argv[2], sys.argv[3]
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.bind(sub_endpoint)
sub.setsockopt_string(zmq.SUBSCRIBE, topic)

blocks = {}  # hash -> (parent hash or None, tuple of tokens)
by_content = {}  # (parent hash or None, tokens) -> hash
live = {}  # seq -> payload bytes
stats = {"batches": 0, "stored": 0, "removed": 0, "cleared": 0, "gaps": 0, "bad_topic": 0, "media": []}
last_seq = -1


def apply(batch):
    ts, events, rank = batch
    assert isinstance(ts, float) and rank == 0, batch
    for e in events:
        tag = e[0]
        if tag == "BlockStored":
            hashes, parent, tokens, bs, lora_id, medium = e[1:7]
            assert lora_id is None and len(tokens) == bs * len(hashes), e
            if medium not in stats["media"]:
                stats["media"].append(medium)
            for i, h in enumerate(hashes):
                chunk = tuple(tokens[i * bs:(i + 1) * bs])
                blocks[h] = (parent, chunk)
                by_content[(parent, chunk)] = h
                parent = h
                stats["stored"] += 1
        elif tag == "BlockRemoved":
            for h in e[1]:
                parent, chunk = blocks.pop(h)
                if by_content.get((parent, chunk)) == h:
                    del by_content[(parent, chunk)]
                stats["removed"] += 1
        elif tag == "AllBlocksCleared":
            blocks.clear()
            by_content.clear()
            stats["cleared"] += 1
        else:
            raise ValueError(f"unknown event {e!r}")


def drain(quiet_ms):
    """Apply every message that arrives until none has for quiet_ms."""
    global last_seq
    while sub.poll(quiet_ms):
        frames = sub.recv_multipart()
        t, seq_bytes, payload = frames
        if t.decode() != topic:
            stats["bad_topic"] += 1
        seq = int.from_bytes(seq_bytes, "big")
        if seq != last_seq + 1:
            stats["gaps"] += 1
        last_seq = seq
        live[seq] = payload
        stats["batches"] += 1
        apply(msgpack.unpackb(payload, raw=False, strict_map_key=False))


def predict(tokens, bs):
    parent, n = None, 0
    for i in range((len(tokens) - 1) // bs):
        h = by_content.get((parent, tuple(tokens[i * bs:(i + 1) * bs])))
        if h is None:
            break
        parent, n = h, n + bs
    return n


def replay(start):
    # A DEALER with REQ's envelope (an empty frame first): one request, many replies.
    req = ctx.socket(zmq.DEALER)
    req.connect(replay_endpoint)
    req.send_multipart([b"", start.to_bytes(8, "big")])
    got = {}
    while req.poll(5000):
        _, seq_bytes, payload = req.recv_multipart()
        seq = int.from_bytes(seq_bytes, "big", signed=True)
        if seq == -1:
            break
        got[seq] = payload
    req.close(linger=0)
    same = all(live.get(s) == p for s, p in got.items())
    return {"replayed": len(got), "first": min(got) if got else None, "last": max(got) if got else None, "same": same}


print(json.dumps({"ready": True}), flush=True)
poller = zmq.Poller()
poller.register(sys.stdin, zmq.POLLIN)
poller.register(sub, zmq.POLLIN)
while True:
    ready = dict(poller.poll())
    if sub in ready:
        drain(0)
    if sys.stdin.fileno() in ready or sys.stdin in ready:
        line = sys.stdin.readline()
        if not line:
            break
        cmd = json.loads(line)
        drain(300)
        if cmd["cmd"] == "predict":
            out = {"cached_tokens": predict(cmd["tokens"], cmd["block_size"])}
        elif cmd["cmd"] == "stats":
            out = dict(stats, blocks=len(blocks), last_seq=last_seq)
        elif cmd["cmd"] == "replay":
            out = replay(cmd["from"])
        else:
            out = {"error": "unknown command"}
        print(json.dumps(out), flush=True)
