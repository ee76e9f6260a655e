//! SentencePiece BPE encoding for `llama`-type GGUF vocabularies (Llama 2, TinyLlama, Mistral
//! v0.1): pieces with scores, `▁` for spaces, `<0xNN>` byte fallback.
//!
//! The text (spaces replaced by `▁`, optionally with one prepended) starts as one symbol per
//! character. Repeatedly, of all adjacent symbol pairs whose concatenation is a vocabulary piece,
//! the one whose piece has the highest score is merged (ties: leftmost first). A final symbol is
//! its piece's id; a character that is not in the vocabulary becomes its UTF-8 bytes as byte
//! tokens (or the unknown token if a byte token is missing). This is SentencePiece's BPE
//! algorithm and what llama.cpp implements.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::TokenKind;
use crate::error::{Error, Result};

/// Encoder state built once from the vocabulary.
pub(crate) struct SpmEncoder {
    /// Piece text to id (duplicates: the last id wins).
    ids: HashMap<String, u32>,
    scores: Vec<f32>,
    /// Byte-fallback token for each byte value.
    byte_ids: [Option<u32>; 256],
    unk: Option<u32>,
}

/// A candidate merge of the symbols starting at `left` and `right`.
#[derive(Debug)]
struct Candidate {
    score: f32,
    left: usize,
    right: usize,
    /// Byte length of the merged text when the candidate was made: stale if the symbols changed.
    len: usize,
}

impl PartialEq for Candidate {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Candidate {}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Candidate {
    /// Max-heap order: higher score first, then the leftmost.
    fn cmp(&self, o: &Self) -> Ordering {
        self.score.total_cmp(&o.score).then_with(|| o.left.cmp(&self.left))
    }
}

/// A symbol: a byte range of the normalised text, linked to its live neighbours.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl SpmEncoder {
    /// Indexes the vocabulary. `scores[i]` is piece `i`'s score.
    pub(crate) fn new(pieces: &[String], kinds: &[TokenKind], scores: Vec<f32>, unk: Option<u32>) -> Self {
        let mut ids = HashMap::with_capacity(pieces.len());
        let mut byte_ids = [None; 256];
        for (i, p) in pieces.iter().enumerate() {
            ids.insert(p.clone(), i as u32);
            if let Some(TokenKind::Byte(b)) = kinds.get(i) {
                byte_ids[*b as usize] = Some(i as u32);
            }
        }
        Self { ids, scores, byte_ids, unk }
    }

    /// Encodes one plain-text segment, appending ids to `out`. `prefix_space` prepends a space
    /// (SentencePiece's "dummy prefix").
    pub(crate) fn encode(&self, text: &str, prefix_space: bool, out: &mut Vec<u32>) -> Result<()> {
        let mut norm = String::with_capacity(text.len() + 3);
        if prefix_space {
            norm.push('▁');
        }
        for c in text.chars() {
            norm.push(if c == ' ' { '▁' } else { c });
        }
        if norm.is_empty() {
            return Ok(());
        }

        let mut syms: Vec<Symbol> = Vec::with_capacity(norm.len());
        for (start, c) in norm.char_indices() {
            let i = syms.len();
            syms.push(Symbol { start, len: c.len_utf8(), prev: i.checked_sub(1), next: Some(i + 1) });
        }
        if let Some(last) = syms.last_mut() {
            last.next = None;
        }

        let mut heap = BinaryHeap::new();
        for i in 1..syms.len() {
            self.push_candidate(&norm, &syms, i - 1, i, &mut heap);
        }
        while let Some(c) = heap.pop() {
            let (l, r) = (syms[c.left], syms[c.right]);
            // Stale: one side was merged away or grew since this candidate was made.
            if l.len == 0 || r.len == 0 || l.len + r.len != c.len || l.next != Some(c.right) {
                continue;
            }
            syms[c.left].len += r.len;
            syms[c.left].next = r.next;
            syms[c.right].len = 0;
            if let Some(n) = r.next {
                syms[n].prev = Some(c.left);
            }
            if let Some(p) = syms[c.left].prev {
                self.push_candidate(&norm, &syms, p, c.left, &mut heap);
            }
            if let Some(n) = syms[c.left].next {
                self.push_candidate(&norm, &syms, c.left, n, &mut heap);
            }
        }

        let mut i = Some(0);
        while let Some(k) = i {
            let s = syms[k];
            let piece = &norm[s.start..s.start + s.len];
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for b in piece.bytes() {
                        let id = self.byte_ids[b as usize]
                            .or(self.unk)
                            .ok_or_else(|| Error::Tokenizer(format!("no byte token for 0x{b:02X} and no unknown token")))?;
                        out.push(id);
                    }
                }
            }
            i = s.next;
        }
        Ok(())
    }

    fn push_candidate(&self, norm: &str, syms: &[Symbol], left: usize, right: usize, heap: &mut BinaryHeap<Candidate>) {
        let (l, r) = (syms[left], syms[right]);
        let len = l.len + r.len;
        let Some(&id) = self.ids.get(&norm[l.start..l.start + len]) else {
            return;
        };
        let score = self.scores.get(id as usize).copied().unwrap_or(0.0);
        heap.push(Candidate { score, left, right, len });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> SpmEncoder {
        let pieces: Vec<String> = ["<unk>", "▁", "a", "b", "ab", "▁ab", "<0x63>", "<0xC3>", "<0xA9>"].iter().map(|s| s.to_string()).collect();
        let kinds: Vec<TokenKind> = pieces
            .iter()
            .map(|p| match p.as_str() {
                "<0x63>" => TokenKind::Byte(0x63),
                "<0xC3>" => TokenKind::Byte(0xC3),
                "<0xA9>" => TokenKind::Byte(0xA9),
                _ => TokenKind::Normal,
            })
            .collect();
        let scores = vec![0.0, -1.0, -2.0, -2.0, -0.5, -0.1, 0.0, 0.0, 0.0];
        SpmEncoder::new(&pieces, &kinds, scores, Some(0))
    }

    #[test]
    fn merges_by_score_and_falls_back_to_bytes() {
        let enc = toy();
        let mut out = Vec::new();
        enc.encode("ab", true, &mut out).ok();
        assert_eq!(out, vec![5]); // ▁ab
        out.clear();
        enc.encode("abc", false, &mut out).ok();
        assert_eq!(out, vec![4, 6]); // ab, <0x63>
        out.clear();
        enc.encode("é", false, &mut out).ok();
        assert_eq!(out, vec![7, 8]);
        out.clear();
        enc.encode("d", false, &mut out).ok();
        assert_eq!(out, vec![0]); // no byte token for 'd': <unk>
    }
}
