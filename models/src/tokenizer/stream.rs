//! Streaming text out of generated tokens: [`IncrementalDecoder`] turns token ids into text
//! that is always valid UTF-8, and [`StopMatcher`] cuts that text at the first stop string.

use std::sync::Arc;

use super::Tokenizer;
use crate::error::{Error, Result};

/// Decodes a token stream into text pieces, one [`push`](Self::push) per token.
///
/// Each token maps to fixed bytes (see the [module docs](super)), so the decoder only keeps
/// the bytes of an incomplete UTF-8 character (byte-level BPE often splits an emoji over
/// several tokens) and emits everything before it. Work per token is O(token length); earlier
/// tokens are never decoded again. The concatenation of every `push` and the final
/// [`finish`](Self::finish) equals [`Tokenizer::decode`] of all the ids (for a decoder made with
/// [`new`](Self::new)), invalid sequences included (each becomes U+FFFD the same way).
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    tokenizer: Arc<Tokenizer>,
    skip_special_tokens: bool,
    /// Bytes of an incomplete UTF-8 sequence at the end of the stream (at most 3).
    pending: Vec<u8>,
    /// No token has contributed text yet, and this decoder starts a text (SentencePiece drops
    /// the first token's leading space).
    at_start: bool,
}

impl IncrementalDecoder {
    /// A decoder for a text that starts with the first pushed token: equal to
    /// `tokenizer.decode(ids, skip_special_tokens)`.
    pub fn new(tokenizer: Arc<Tokenizer>, skip_special_tokens: bool) -> Self {
        Self { tokenizer, skip_special_tokens, pending: Vec::new(), at_start: true }
    }

    /// A decoder for tokens that continue a text decoded elsewhere, such as generated tokens
    /// after a prompt: a SentencePiece leading space (`▁Hello` → ` Hello`) is kept, because it
    /// separates the continuation from what came before.
    pub fn continuation(tokenizer: Arc<Tokenizer>, skip_special_tokens: bool) -> Self {
        Self { tokenizer, skip_special_tokens, pending: Vec::new(), at_start: false }
    }

    /// Adds one token; returns the text it completes (often empty while a character is split).
    /// An id outside the vocabulary is [`Error::Invalid`] and leaves the decoder unchanged.
    pub fn push(&mut self, id: u32) -> Result<String> {
        let Some(bytes) = self.tokenizer.piece_bytes(id, self.skip_special_tokens, self.at_start)? else {
            return Ok(String::new());
        };
        self.at_start = false;
        if self.pending.is_empty() {
            // Fast path: the token's bytes alone.
            return Ok(take_valid(bytes, &mut self.pending));
        }
        let mut buf = std::mem::take(&mut self.pending);
        buf.extend_from_slice(bytes);
        Ok(take_valid(&buf, &mut self.pending))
    }

    /// Adds several tokens; returns the text they complete.
    pub fn push_all(&mut self, ids: &[u32]) -> Result<String> {
        let mut out = String::new();
        for &id in ids {
            out.push_str(&self.push(id)?);
        }
        Ok(out)
    }

    /// Flushes held bytes at the end of the stream: an incomplete character becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.pending);
        String::from_utf8_lossy(&rest).into_owned()
    }

    /// True while bytes of an incomplete character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}

/// Returns the text of `bytes` up to an incomplete UTF-8 sequence at its end, which goes to
/// `rest`. Invalid sequences inside become U+FFFD, exactly as `String::from_utf8_lossy` does.
fn take_valid(mut bytes: &[u8], rest: &mut Vec<u8>) -> String {
    let mut out = String::with_capacity(bytes.len());
    loop {
        match std::str::from_utf8(bytes) {
            Ok(s) => {
                out.push_str(s);
                return out;
            }
            Err(e) => {
                let (valid, after) = bytes.split_at(e.valid_up_to());
                // SAFETY-free: `valid` was just checked.
                out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                match e.error_len() {
                    None => {
                        // Incomplete sequence at the end: wait for more bytes.
                        rest.extend_from_slice(after);
                        return out;
                    }
                    Some(n) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        bytes = &after[n..];
                    }
                }
            }
        }
    }
}

/// What [`StopMatcher::push`] returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopOutput {
    /// Text that is safe to send: it cannot be part of a stop string.
    pub text: String,
    /// Index (into the stop strings given to [`StopMatcher::new`]) of the stop string that
    /// matched; generation should end. `text` is everything before the match.
    pub stopped: Option<usize>,
}

/// Finds stop strings in a text stream (OpenAI `stop`): text before the first stop string is
/// emitted, the stop string and anything after it are not.
///
/// Text that could be the beginning of a stop string is held back until it is decided, so a
/// stop string split over several tokens is still caught and never partly sent. At most the
/// longest stop string's length minus one byte is held.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet emitted.
    held: String,
    stopped: Option<usize>,
}

impl StopMatcher {
    /// A matcher for `stops`. An empty stop string is [`Error::Invalid`] (it would match
    /// everywhere).
    pub fn new(stops: Vec<String>) -> Result<Self> {
        if stops.iter().any(String::is_empty) {
            return Err(Error::Invalid("empty stop string".into()));
        }
        Ok(Self { stops, held: String::new(), stopped: None })
    }

    /// True if there are no stop strings (every push passes text straight through).
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// The stop string that matched, if one has.
    pub fn stopped(&self) -> Option<usize> {
        self.stopped
    }

    /// Adds newly decoded text; returns what can be emitted now. After a match, every push
    /// returns no text and the same `stopped`.
    pub fn push(&mut self, text: &str) -> StopOutput {
        if self.stopped.is_some() {
            return StopOutput { text: String::new(), stopped: self.stopped };
        }
        if self.stops.is_empty() {
            return StopOutput { text: text.to_owned(), stopped: None };
        }
        self.held.push_str(text);
        // The earliest match wins; at the same position the first listed stop string.
        let first = self.stops.iter().enumerate().filter_map(|(i, s)| self.held.find(s.as_str()).map(|pos| (pos, i))).min();
        if let Some((pos, i)) = first {
            self.held.truncate(pos);
            self.stopped = Some(i);
            return StopOutput { text: std::mem::take(&mut self.held), stopped: Some(i) };
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let keep = self.partial_suffix_len();
        let cut = self.held.len() - keep;
        let rest = self.held.split_off(cut);
        let out = std::mem::replace(&mut self.held, rest);
        StopOutput { text: out, stopped: None }
    }

    /// End of the stream without a match: returns the held text.
    pub fn finish(&mut self) -> String {
        if self.stopped.is_some() {
            return String::new();
        }
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of `held` that a stop string starts with.
    fn partial_suffix_len(&self) -> usize {
        let h = self.held.as_bytes();
        let mut best = 0;
        for s in &self.stops {
            let s = s.as_bytes();
            let max = (s.len() - 1).min(h.len());
            for k in (best + 1..=max).rev() {
                if h[h.len() - k..] == s[..k] && self.held.is_char_boundary(h.len() - k) {
                    best = k;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_valid_holds_incomplete_tail_and_replaces_invalid() {
        let mut rest = Vec::new();
        let emoji = "😀".as_bytes();
        assert_eq!(take_valid(&emoji[..2], &mut rest), "");
        assert_eq!(rest, &emoji[..2]);
        rest.clear();
        let bad = [b'a', 0xFF, b'b', 0xE2, 0x82];
        assert_eq!(take_valid(&bad, &mut rest), "a\u{FFFD}b");
        assert_eq!(rest, vec![0xE2, 0x82]);
    }

    #[test]
    fn stop_matcher_basics() {
        let mut m = StopMatcher::new(vec!["STOP".into()]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.push("hello ST").text, "hello ");
        let o = m.push("OP and more");
        assert_eq!(o, StopOutput { text: String::new(), stopped: Some(0) });
        assert_eq!(m.push("x").text, "");
        assert!(StopMatcher::new(vec![String::new()]).is_err());
    }
}
