//! Server-sent events as OpenAI-compatible servers stream them, and how a stream's frames turn
//! into per-token delivery times.
//!
//! [`SseParser`] cuts the bytes read from the connection into frames (an event ends at a blank
//! line; `data:` lines are joined with newlines; comments and other fields are ignored). The
//! client stamps every frame completed by one read with that read's time, so several frames or
//! tokens that arrive together share a time, as metrics.md defines client-side delivery.
//!
//! [`token_times`] turns the times of the frames that carried output text into one time per
//! output token:
//! - with `stream_options.include_usage`, the server's `usage.completion_tokens` is the count.
//!   A frame carries at least one token, so token `i` arrived no later than the `i`-th content
//!   frame; tokens beyond the number of frames (a frame that carried several) are put at the last
//!   frame. Both choices can only make a token later than it was, never earlier: idle latency and
//!   TPOT are never flattered. If the server counts fewer tokens than content frames, the last
//!   token is put at the last frame;
//! - without a usage count, each content frame is one token.

/// Incremental SSE frame parser.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    data: Option<String>,
}

impl SseParser {
    /// Feeds bytes from the connection; returns the `data` of every event they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut start = 0;
        while let Some(nl) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let mut line = &self.buf[start..start + nl];
            start += nl + 1;
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            if line.is_empty() {
                if let Some(d) = self.data.take() {
                    events.push(d);
                }
                continue;
            }
            let line = String::from_utf8_lossy(line);
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line.as_ref(), ""),
            };
            if field == "data" {
                match &mut self.data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(value);
                    }
                    None => self.data = Some(value.to_string()),
                }
            }
        }
        self.buf.drain(..start);
        events
    }

    /// The `data` of an event the stream ended without terminating (a blank line), if any.
    pub fn finish(&mut self) -> Option<String> {
        if !self.buf.is_empty() {
            return self.push(b"\n\n").pop();
        }
        self.data.take()
    }
}

/// What one `data:` payload of an OpenAI stream says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Chunk {
    /// Output text it carries (completions `choices[0].text`, chat `choices[0].delta.content`).
    pub text: String,
    /// `choices[0].finish_reason`, when set.
    pub finish_reason: Option<String>,
    /// `usage.completion_tokens`, when present.
    pub completion_tokens: Option<usize>,
    /// `usage.prompt_tokens`, when present.
    pub prompt_tokens: Option<usize>,
    /// An error event: (message, type or code).
    pub error: Option<(String, String)>,
    /// The `[DONE]` sentinel.
    pub done: bool,
}

/// Interprets one event's data; malformed JSON is reported as an error chunk.
pub fn parse_chunk(data: &str) -> Chunk {
    let data = data.trim();
    if data == "[DONE]" {
        return Chunk { done: true, ..Default::default() };
    }
    let v: serde_json::Value = match serde_json::from_str(data) {
        Ok(v) => v,
        Err(e) => return Chunk { error: Some((format!("malformed stream chunk ({e}): {}", truncate(data, 200)), "malformed".into())), ..Default::default() },
    };
    let mut c = Chunk::default();
    if let Some(err) = v.get("error") {
        let s = |k: &str| err.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
        let message = if err.is_string() { err.as_str().unwrap_or("").to_string() } else { s("message") };
        let kind = [s("code"), s("type")].into_iter().filter(|x| !x.is_empty()).collect::<Vec<_>>().join("/");
        c.error = Some((message, kind));
    }
    if let Some(choice) = v.get("choices").and_then(|x| x.get(0)) {
        let text = choice.get("text").or_else(|| choice.get("delta").and_then(|d| d.get("content")));
        if let Some(t) = text.and_then(|t| t.as_str()) {
            c.text = t.to_string();
        }
        c.finish_reason = choice.get("finish_reason").and_then(|f| f.as_str()).map(str::to_owned);
    }
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        let n = |k: &str| u.get(k).and_then(|x| x.as_u64()).map(|x| x as usize);
        c.completion_tokens = n("completion_tokens");
        c.prompt_tokens = n("prompt_tokens");
    }
    c
}

/// At most `n` characters of `s`.
pub fn truncate(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

/// Delivery time of each output token from the times of the frames that carried text and the
/// server's token count, if known (see the module doc).
pub fn token_times(frame_times: &[f64], usage: Option<usize>) -> Vec<f64> {
    let Some(n) = usage else { return frame_times.to_vec() };
    let Some(&last) = frame_times.last() else {
        // Tokens counted but no text seen (all whitespace-free empty deltas): nothing to stamp.
        return Vec::new();
    };
    if n == 0 {
        return Vec::new();
    }
    let mut times: Vec<f64> = frame_times.iter().copied().take(n).collect();
    times.resize(n, last);
    times[n - 1] = last;
    times
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_across_reads_and_joined_in_one() {
        let mut p = SseParser::default();
        assert!(p.push(b"data: {\"a\"").is_empty());
        assert_eq!(p.push(b":1}\n\n"), vec!["{\"a\":1}"]);
        assert_eq!(p.push(b": keep-alive\n\ndata: x\r\n\r\ndata: y\n\nevent: e\ndata: [DONE]\n\n"), vec!["x", "y", "[DONE]"]);
        assert_eq!(p.push(b"data: one\ndata: two\n\n"), vec!["one\ntwo"]);
        assert!(p.push(b"data: tail").is_empty());
        assert_eq!(p.finish().as_deref(), Some("tail"));
        assert_eq!(p.finish(), None);
    }

    #[test]
    fn chunks_of_both_endpoints_usage_errors_and_done() {
        let c = parse_chunk(r#"{"choices":[{"index":0,"text":"Hi","finish_reason":null}]}"#);
        assert_eq!((c.text.as_str(), c.finish_reason.clone()), ("Hi", None));
        let c = parse_chunk(r#"{"choices":[{"delta":{"content":" there"},"finish_reason":"length"}]}"#);
        assert_eq!((c.text.as_str(), c.finish_reason.as_deref()), (" there", Some("length")));
        let c = parse_chunk(r#"{"choices":[{"delta":{"role":"assistant"}}]}"#);
        assert!(c.text.is_empty());
        let c = parse_chunk(r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}"#);
        assert_eq!((c.prompt_tokens, c.completion_tokens), (Some(7), Some(3)));
        let c = parse_chunk(r#"{"error":{"message":"dropped: SLO missed","type":"server_error","code":"request_dropped"}}"#);
        assert_eq!(c.error, Some(("dropped: SLO missed".into(), "request_dropped/server_error".into())));
        assert!(parse_chunk("[DONE]").done);
        assert!(parse_chunk("{oops").error.is_some());
    }

    #[test]
    fn token_times_follow_usage_conservatively() {
        let f = [1.0, 2.0, 3.0];
        assert_eq!(token_times(&f, None), vec![1.0, 2.0, 3.0]);
        assert_eq!(token_times(&f, Some(3)), vec![1.0, 2.0, 3.0]);
        assert_eq!(token_times(&f, Some(5)), vec![1.0, 2.0, 3.0, 3.0, 3.0]);
        assert_eq!(token_times(&f, Some(2)), vec![1.0, 3.0]);
        assert_eq!(token_times(&f, Some(0)), Vec::<f64>::new());
        assert_eq!(token_times(&[], Some(4)), Vec::<f64>::new());
    }
}
