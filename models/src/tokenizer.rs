//! Text ↔ token ids for Llama-family models, matching llama.cpp's tokenizer token for token.
//!
//! A [`Tokenizer`] is built from GGUF metadata ([`Tokenizer::from_gguf`]) or from a Hugging Face
//! `tokenizer.json` ([`Tokenizer::from_file`]). Encoding runs in two stages:
//!
//! 1. Special tokens written in the text (`<|im_start|>`, `<s>`, ...) are split out first, as
//!    llama.cpp and vLLM do for chat prompts. Control tokens are recognised only when the caller
//!    asks for it ([`EncodeOptions::parse_special`], on in [`Tokenizer::encode`]); user-defined
//!    tokens always are. Matching is leftmost, longest first.
//! 2. Each plain-text segment is encoded on its own: byte-level BPE through Hugging Face's
//!    `tokenizers` (BPE model, pre-tokenizer and normalizer configured from the file), or the
//!    SentencePiece BPE algorithm of `llama`-type GGUF vocabularies ([`spm`]).
//!
//! BOS/EOS are added by this module, not by a post-processor, so both sources behave the same.
//!
//! Decoding does not go through a decoder pipeline: every token id maps to a fixed byte string
//! (byte-level BPE: the inverse GPT-2 byte map; SentencePiece: `▁` → space and `<0xNN>` byte
//! tokens; special tokens: their text), and a text is the concatenation of its tokens' bytes,
//! read as UTF-8 with invalid sequences replaced by U+FFFD. SentencePiece-style vocabularies also
//! drop one leading space from the first token of a text. That makes decoding incremental by
//! construction: [`IncrementalDecoder`] only has to hold back an incomplete UTF-8 tail, and never
//! re-decodes earlier tokens.

mod parts;
mod spm;
mod stream;

use std::collections::HashMap;
use std::path::Path;

use crate::error::{Error, Result};
use crate::gguf::GgufFile;

pub use stream::{IncrementalDecoder, StopMatcher, StopOutput};

/// Token texts that end generation when the vocabulary has them (besides the EOS id itself):
/// end-of-turn markers of the chat formats in use, as llama.cpp lists them.
const EOG_TEXTS: &[&str] = &["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "<|end_of_text|>", "</s>"];

/// What a vocabulary entry is; decides how it is matched in text and how it decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenKind {
    /// An ordinary token produced by the BPE model.
    Normal,
    /// A control token (BOS, EOS, chat markers): matched in text only when parsing specials,
    /// dropped from decoded text when skipping special tokens.
    Control,
    /// A user-defined added token: always matched in text, always decoded as its text.
    UserDefined,
    /// The unknown token; treated like a control token.
    Unknown,
    /// A SentencePiece byte-fallback token `<0xNN>`.
    Byte(u8),
    /// An id with no entry, or a token marked unused.
    Unused,
}

impl TokenKind {
    /// Control-like tokens: parsed only on request, skipped when skipping special tokens.
    fn is_special(self) -> bool {
        matches!(self, Self::Control | Self::Unknown)
    }
}

/// How normal tokens map to bytes when decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DecodeStyle {
    /// GPT-2 byte-level BPE: each character of a token stands for one byte.
    ByteLevel,
    /// SentencePiece: `▁` stands for a space; `strip_leading_space` drops one space from the
    /// start of a decoded text (the space the encoder prepends).
    SentencePiece {
        /// Drop one leading space from the first token of a text.
        strip_leading_space: bool,
    },
}

/// The plain-text encoder behind the special-token splitting.
enum Encoder {
    /// Hugging Face `tokenizers` pipeline (normalizer, pre-tokenizer, BPE model), without added
    /// tokens or post-processor.
    Hf(Box<tokenizers::Tokenizer>),
    /// SentencePiece BPE over scores (`llama`-type GGUF vocabularies).
    Spm(Box<spm::SpmEncoder>),
}

/// A special (added) token as matched in text.
#[derive(Debug, Clone)]
struct SpecialToken {
    id: u32,
    /// Matched only when parsing special tokens.
    control: bool,
    /// Whitespace before the token is swallowed (Hugging Face `lstrip`).
    lstrip: bool,
    /// Whitespace after the token is swallowed (Hugging Face `rstrip`).
    rstrip: bool,
}

/// A piece of input text after splitting out special tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Segment<'a> {
    Text(&'a str),
    Token(u32),
}

/// Options for [`Tokenizer::encode_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Add the BOS (and EOS) tokens the model wants around the text.
    pub add_special_tokens: bool,
    /// Recognise control tokens such as `<|im_start|>` written in the text. When false they are
    /// encoded as ordinary text; user-defined added tokens are recognised either way.
    pub parse_special: bool,
}

/// Everything the builders collect; turned into a [`Tokenizer`] by [`Tokenizer::assemble`].
pub(crate) struct Parts {
    encoder_hf: Option<tokenizers::Tokenizer>,
    encoder_spm: Option<spm::SpmEncoder>,
    pieces: Vec<String>,
    kinds: Vec<TokenKind>,
    /// Per-token matching flags for added tokens (lstrip, rstrip); absent = neither.
    strip_flags: HashMap<u32, (bool, bool)>,
    style: DecodeStyle,
    bos: Option<u32>,
    eos: Option<u32>,
    /// Extra end-of-generation ids besides `eos` and the [`EOG_TEXTS`] tokens.
    extra_eog: Vec<u32>,
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    add_space_prefix: bool,
    chat_template: Option<String>,
}

/// A tokenizer: encode text to ids, decode ids to text, and the special tokens and chat
/// template the model was shipped with.
pub struct Tokenizer {
    encoder: Encoder,
    /// Raw vocabulary entry of each id (GPT-2 byte-level characters, `▁`, `<0x0A>`, ...).
    pieces: Vec<String>,
    kinds: Vec<TokenKind>,
    /// Decoded bytes of every token, concatenated; token `i` is `bytes[offsets[i]..offsets[i+1]]`.
    bytes: Vec<u8>,
    offsets: Vec<usize>,
    style: DecodeStyle,
    /// Special tokens by first byte of their text, longest first.
    specials_by_byte: Vec<Vec<SpecialToken>>,
    bos: Option<u32>,
    eos: Option<u32>,
    /// All end-of-generation ids, sorted.
    eog: Vec<u32>,
    /// Ids put before / after the text when adding special tokens.
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    /// SentencePiece: prepend a space to each text segment that follows a special token or
    /// starts the input.
    add_space_prefix: bool,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("style", &self.style)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eog", &self.eog)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata:
    /// `gpt2` (byte-level BPE with merges and a named pre-tokenizer) or `llama` (SentencePiece
    /// BPE with scores). Other tokenizer models are [`Error::Unsupported`].
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        Self::assemble(parts::from_gguf(gguf)?)
    }

    /// Loads a Hugging Face tokenizer: `path` is a model directory or a `tokenizer.json`.
    /// `tokenizer_config.json` next to it supplies the BOS/EOS tokens, `add_bos_token` /
    /// `add_eos_token` and the chat template (or `chat_template.jinja`);
    /// `generation_config.json` adds end-of-generation ids.
    pub fn from_file(path: &Path) -> Result<Self> {
        Self::assemble(parts::from_hf_file(path)?)
    }

    /// Loads a tokenizer from a `.gguf` file (its metadata), a Hugging Face model directory or
    /// a `tokenizer.json`.
    pub fn from_path(path: &Path) -> Result<Self> {
        if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
            Self::from_gguf(&crate::gguf::GgufFile::open(path)?)
        } else {
            Self::from_file(path)
        }
    }

    /// The plain-text encoder as a Hugging Face `tokenizer.json` (normalizer, pre-tokenizer and
    /// BPE model, without the added tokens), so that tools which load tokenizers through
    /// `transformers` (AIPerf, GuideLLM) count and draw prompts with this model's vocabulary
    /// when only its GGUF file is at hand. `None` for SentencePiece vocabularies, which pace
    /// encodes with its own code.
    pub fn hf_encoder_json(&self) -> Option<String> {
        let Encoder::Hf(t) = &self.encoder else { return None };
        let mut v: serde_json::Value = serde_json::from_str(&t.to_string(false).ok()?).ok()?;
        // pace decodes by itself, so its pipeline has no decoder; the tools decode with it (to
        // write prompts of a given length), and byte-level pieces need theirs.
        if v.get("decoder").is_none_or(|d| d.is_null()) && self.style == DecodeStyle::ByteLevel {
            v["decoder"] = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        }
        serde_json::to_string(&v).ok()
    }

    /// A byte-level tokenizer of `vocab_size` tokens for models that ship none (dummy weights):
    /// one token per byte, `<|endoftext|>` as BOS/EOS, ChatML as chat template.
    pub fn byte_level(vocab_size: usize) -> Result<Self> {
        Self::assemble(parts::byte_vocab(vocab_size)?)
    }

    fn assemble(p: Parts) -> Result<Self> {
        let encoder = match (p.encoder_hf, p.encoder_spm) {
            (Some(hf), _) => Encoder::Hf(Box::new(hf)),
            (None, Some(spm)) => Encoder::Spm(Box::new(spm)),
            (None, None) => return Err(Error::Tokenizer("no encoder built".into())),
        };
        let n = p.pieces.len();
        if p.kinds.len() != n {
            return Err(Error::Tokenizer("token kinds do not match the vocabulary".into()));
        }
        let in_vocab = |id: &u32| (*id as usize) < n;
        if let Some(bad) = p.prefix.iter().chain(&p.suffix).find(|id| !in_vocab(id)) {
            return Err(Error::Format(format!("special token id {bad} outside the vocabulary")));
        }

        let mut bytes = Vec::with_capacity(n * 6);
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        for (piece, kind) in p.pieces.iter().zip(&p.kinds) {
            token_bytes_into(piece, *kind, p.style, &mut bytes);
            offsets.push(bytes.len());
        }

        let mut specials_by_byte: Vec<Vec<SpecialToken>> = vec![Vec::new(); 256];
        for (id, (piece, kind)) in p.pieces.iter().zip(&p.kinds).enumerate() {
            let control = match kind {
                TokenKind::Control | TokenKind::Unknown => true,
                TokenKind::UserDefined => false,
                _ => continue,
            };
            let Some(&first) = piece.as_bytes().first() else {
                continue;
            };
            let id = id as u32;
            let (lstrip, rstrip) = p.strip_flags.get(&id).copied().unwrap_or((false, false));
            specials_by_byte[first as usize].push(SpecialToken { id, control, lstrip, rstrip });
        }
        for list in &mut specials_by_byte {
            list.sort_by_key(|s| std::cmp::Reverse(p.pieces[s.id as usize].len()));
        }

        let mut eog: Vec<u32> = p.eos.into_iter().chain(p.extra_eog.iter().copied()).filter(in_vocab).collect();
        for (id, piece) in p.pieces.iter().enumerate() {
            if EOG_TEXTS.contains(&piece.as_str()) && p.kinds[id] != TokenKind::Normal {
                eog.push(id as u32);
            }
        }
        eog.sort_unstable();
        eog.dedup();

        Ok(Self {
            encoder,
            pieces: p.pieces,
            kinds: p.kinds,
            bytes,
            offsets,
            style: p.style,
            specials_by_byte,
            bos: p.bos.filter(in_vocab),
            eos: p.eos.filter(in_vocab),
            eog,
            prefix: p.prefix,
            suffix: p.suffix,
            add_space_prefix: p.add_space_prefix,
            chat_template: p.chat_template,
        })
    }

    /// Encodes `text`, recognising special tokens written in it (`<|im_start|>` in a rendered
    /// chat prompt becomes one token). `add_special_tokens` adds the BOS/EOS the model wants
    /// (most chat templates write BOS themselves: encode their output with `false`).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        self.encode_with(text, EncodeOptions { add_special_tokens, parse_special: true })
    }

    /// Encodes `text` with explicit options.
    pub fn encode_with(&self, text: &str, opts: EncodeOptions) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 4);
        if opts.add_special_tokens {
            out.extend_from_slice(&self.prefix);
        }
        // SentencePiece prefixes a space to text at the start and after each special token.
        let mut after_special = true;
        for seg in self.split_specials(text, opts.parse_special) {
            match seg {
                Segment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Segment::Text(t) => {
                    self.encode_plain(t, after_special, &mut out)?;
                    after_special = false;
                }
            }
        }
        if opts.add_special_tokens {
            out.extend_from_slice(&self.suffix);
        }
        Ok(out)
    }

    fn encode_plain(&self, text: &str, after_special: bool, out: &mut Vec<u32>) -> Result<()> {
        match &self.encoder {
            Encoder::Hf(hf) => {
                let enc = hf.encode(text, false).map_err(|e| Error::Tokenizer(e.to_string()))?;
                out.extend_from_slice(enc.get_ids());
                Ok(())
            }
            Encoder::Spm(spm) => spm.encode(text, self.add_space_prefix && after_special, out),
        }
    }

    /// Splits special tokens out of `text`: leftmost match first, longest token at a position.
    fn split_specials<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Segment<'a>> {
        let b = text.as_bytes();
        let mut segs = Vec::new();
        let mut start = 0; // start of the pending text segment
        let mut i = 0;
        while i < b.len() {
            let hit = self.specials_by_byte[b[i] as usize]
                .iter()
                .filter(|s| parse_special || !s.control)
                .find(|s| b[i..].starts_with(self.pieces[s.id as usize].as_bytes()));
            let Some(sp) = hit else {
                i += 1;
                continue;
            };
            let mut before = &text[start..i];
            if sp.lstrip {
                before = before.trim_end();
            }
            if !before.is_empty() {
                segs.push(Segment::Text(before));
            }
            segs.push(Segment::Token(sp.id));
            i += self.pieces[sp.id as usize].len();
            if sp.rstrip {
                while i < b.len() && b[i].is_ascii_whitespace() {
                    i += 1;
                }
            }
            start = i;
        }
        if start < b.len() {
            segs.push(Segment::Text(&text[start..]));
        }
        segs
    }

    /// Decodes `ids` to text. Invalid UTF-8 (a character cut by the end of the ids) becomes
    /// U+FFFD. `skip_special_tokens` drops control tokens such as `<|im_end|>`. An id outside
    /// the vocabulary is [`Error::Invalid`].
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        let mut buf = Vec::with_capacity(ids.len() * 4);
        let mut first = true;
        for &id in ids {
            if let Some(b) = self.piece_bytes(id, skip_special_tokens, first)? {
                buf.extend_from_slice(b);
                first = false;
            }
        }
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// The bytes token `id` contributes to a decoded text, None if it is skipped. `first`: no
    /// earlier token contributed to this text (SentencePiece drops its leading space).
    pub(crate) fn piece_bytes(&self, id: u32, skip_special: bool, first: bool) -> Result<Option<&[u8]>> {
        let i = id as usize;
        let Some(kind) = self.kinds.get(i) else {
            return Err(Error::Invalid(format!("token id {id} is outside the vocabulary (size {})", self.vocab_size())));
        };
        if skip_special && kind.is_special() {
            return Ok(None);
        }
        let mut b = &self.bytes[self.offsets[i]..self.offsets[i + 1]];
        if first && matches!(self.style, DecodeStyle::SentencePiece { strip_leading_space: true }) {
            b = b.strip_prefix(b" ").unwrap_or(b);
        }
        Ok(Some(b))
    }

    /// Number of token ids (the highest id plus one).
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The BOS id, if the model has one.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos
    }

    /// The EOS id, if the model has one.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos
    }

    /// Every id that ends generation, sorted: EOS and the end-of-turn tokens the vocabulary has
    /// (`<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, ...; and `generation_config.json`'s ids).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eog
    }

    /// True if `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The text of the BOS token (for chat templates).
    pub fn bos_token(&self) -> Option<&str> {
        self.bos.and_then(|id| self.token_str(id))
    }

    /// The text of the EOS token (for chat templates).
    pub fn eos_token(&self) -> Option<&str> {
        self.eos.and_then(|id| self.token_str(id))
    }

    /// Whether [`encode`](Self::encode) with `add_special_tokens` puts BOS in front.
    pub fn adds_bos(&self) -> bool {
        self.bos.is_some_and(|b| self.prefix.contains(&b))
    }

    /// The raw vocabulary entry of `id` (`Ġthe`, `▁the`, `<|im_end|>`), None if out of range or
    /// empty.
    pub fn token_str(&self, id: u32) -> Option<&str> {
        self.pieces.get(id as usize).map(String::as_str).filter(|s| !s.is_empty())
    }

    /// The bytes `id` decodes to on its own, e.g. for OpenAI's logprob `bytes` field (may be an
    /// incomplete UTF-8 sequence).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        (i < self.pieces.len()).then(|| &self.bytes[self.offsets[i]..self.offsets[i + 1]])
    }

    /// One byte string per id for a grammar engine's token trie (see `constraint`): the exact
    /// bytes a normal or byte token adds to the output; control and unknown tokens as byte
    /// 0xFF followed by their text (llguidance's marker for special tokens, which text never
    /// matches); user-defined added tokens as their text (the tokenizer matches them in text
    /// too); unused ids empty (never allowed).
    pub fn grammar_words(&self) -> Vec<Vec<u8>> {
        (0..self.pieces.len())
            .map(|i| match self.kinds[i] {
                TokenKind::Control | TokenKind::Unknown => {
                    let mut w = vec![0xFF];
                    w.extend_from_slice(self.pieces[i].as_bytes());
                    w
                }
                TokenKind::Unused => Vec::new(),
                _ => self.bytes[self.offsets[i]..self.offsets[i + 1]].to_vec(),
            })
            .collect()
    }

    /// The id of a vocabulary entry by its raw text, e.g. `token_id("<|im_end|>")` (a linear
    /// scan: for set-up, not per token).
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        self.pieces.iter().position(|p| p == piece).map(|i| i as u32)
    }

    /// True for control tokens (those [`decode`](Self::decode) skips on request).
    pub fn is_special(&self, id: u32) -> bool {
        self.kinds.get(id as usize).is_some_and(|k| k.is_special())
    }

    /// The chat template shipped with the model (Jinja source), if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
}

/// Appends the bytes a vocabulary entry decodes to.
fn token_bytes_into(piece: &str, kind: TokenKind, style: DecodeStyle, out: &mut Vec<u8>) {
    match kind {
        TokenKind::Byte(b) => out.push(b),
        TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown => out.extend_from_slice(piece.as_bytes()),
        TokenKind::Normal | TokenKind::Unused => match style {
            DecodeStyle::ByteLevel => byte_level_decode_into(piece, out),
            DecodeStyle::SentencePiece { .. } => {
                for c in piece.chars() {
                    if c == '▁' {
                        out.push(b' ');
                    } else {
                        let mut tmp = [0u8; 4];
                        out.extend_from_slice(c.encode_utf8(&mut tmp).as_bytes());
                    }
                }
            }
        },
    }
}

/// GPT-2's byte ↔ character map: printable Latin-1 bytes stand for themselves, the other 68
/// bytes for U+0100 onwards in byte order. Returns the character of each byte.
fn byte_level_chars() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut map = ['\0'; 256];
    let mut next = 0x100u32;
    for b in 0..=255u8 {
        map[b as usize] = if printable(b) {
            b as char
        } else {
            let c = char::from_u32(next).unwrap_or('\0');
            next += 1;
            c
        };
    }
    map
}

/// Decodes a byte-level BPE piece; a piece with a character outside the map (an added token
/// stored verbatim) decodes to its own UTF-8.
fn byte_level_decode_into(piece: &str, out: &mut Vec<u8>) {
    use std::sync::OnceLock;
    static INVERSE: OnceLock<HashMap<char, u8>> = OnceLock::new();
    let inv = INVERSE.get_or_init(|| byte_level_chars().iter().enumerate().map(|(b, &c)| (c, b as u8)).collect());
    let start = out.len();
    for c in piece.chars() {
        match inv.get(&c) {
            Some(&b) => out.push(b),
            None => {
                out.truncate(start);
                out.extend_from_slice(piece.as_bytes());
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shareable_across_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Tokenizer>();
        send_sync::<IncrementalDecoder>();
        send_sync::<StopMatcher>();
    }

    #[test]
    fn byte_level_map_is_a_bijection() {
        let chars = byte_level_chars();
        let set: std::collections::HashSet<char> = chars.iter().copied().collect();
        assert_eq!(set.len(), 256);
        assert_eq!(chars[b' ' as usize], 'Ġ');
        assert_eq!(chars[b'\n' as usize], 'Ċ');
        assert_eq!(chars[b'a' as usize], 'a');
        let mut out = Vec::new();
        byte_level_decode_into("ĠhelloĊ", &mut out);
        assert_eq!(out, b" hello\n");
    }
}
