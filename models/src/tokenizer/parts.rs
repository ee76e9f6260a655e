//! Builds tokenizer [`Parts`] from GGUF metadata or from Hugging Face tokenizer files.
//!
//! Byte-level BPE vocabularies become a Hugging Face `tokenizers` pipeline written as
//! `tokenizer.json`-shaped JSON (BPE model from vocab and merges, the pre-tokenizer named by
//! `tokenizer.ggml.pre`), so encoding is Hugging Face's own. Added tokens and post-processors
//! are taken out of that pipeline: the parent module splits special tokens and adds BOS/EOS
//! itself, the same way for both sources.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{json, Map, Value};

use super::{spm::SpmEncoder, DecodeStyle, Parts, TokenKind, EOG_TEXTS};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;

/// GPT-2's split regex (what Hugging Face's `ByteLevel` pre-tokenizer applies with `use_regex`).
const GPT2_RE: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's split regex (numbers in groups of up to three digits).
const LLAMA3_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2's split regex (digits one by one).
const QWEN2_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

// ---------------------------------------------------------------------------------------------
// GGUF

/// Reads `tokenizer.ggml.*` metadata.
pub(super) fn from_gguf(g: &GgufFile) -> Result<Parts> {
    let model = g.get_str("tokenizer.ggml.model").ok_or_else(|| Error::Format("GGUF has no tokenizer.ggml.model".into()))?;
    let pieces = string_array(g, "tokenizer.ggml.tokens")?.ok_or_else(|| Error::Format("GGUF has no tokenizer.ggml.tokens".into()))?;
    let n = pieces.len();
    if n == 0 || n > u32::MAX as usize {
        return Err(Error::Format(format!("tokenizer.ggml.tokens has {n} entries")));
    }
    let kinds = gguf_kinds(g, &pieces)?;
    let id = |key: &str| -> Option<u32> {
        let v = g.get(key)?.as_u64()?;
        if v < n as u64 {
            Some(v as u32)
        } else {
            tracing::warn!("{key} = {v} is outside the vocabulary ({n} tokens); ignored");
            None
        }
    };
    let flag = |key: &str| g.get(key).and_then(|v| v.as_bool());
    let bos = id("tokenizer.ggml.bos_token_id");
    let eos = id("tokenizer.ggml.eos_token_id");
    let extra_eog: Vec<u32> = ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"].iter().filter_map(|k| id(k)).collect();
    let chat_template = g.get_str("tokenizer.chat_template").map(str::to_owned);

    let (encoder_hf, encoder_spm, style, add_bos_default, add_space_prefix) = match model {
        "gpt2" => {
            let pre = g.get_str("tokenizer.ggml.pre").unwrap_or("");
            let (pre_tokenizer, ignore_merges, add_bos_default) = pre_tokenizer_for(pre);
            let merges = string_array(g, "tokenizer.ggml.merges")?.ok_or_else(|| Error::Format("gpt2 tokenizer without tokenizer.ggml.merges".into()))?;
            let hf = byte_level_bpe(&pieces, &merges, pre_tokenizer, ignore_merges)?;
            let space = flag("tokenizer.ggml.add_space_prefix").unwrap_or(false);
            if space {
                tracing::warn!("tokenizer.ggml.add_space_prefix is set on a gpt2 tokenizer; ignored");
            }
            (Some(hf), None, DecodeStyle::ByteLevel, add_bos_default, false)
        }
        "llama" => {
            let scores = float_array(g, "tokenizer.ggml.scores")?.unwrap_or_else(|| vec![0.0; n]);
            if scores.len() != n {
                return Err(Error::Format(format!("tokenizer.ggml.scores has {} entries for {n} tokens", scores.len())));
            }
            if flag("tokenizer.ggml.remove_extra_whitespaces") == Some(true) {
                return Err(Error::Unsupported("tokenizer.ggml.remove_extra_whitespaces".into()));
            }
            let unk = id("tokenizer.ggml.unknown_token_id");
            let space = flag("tokenizer.ggml.add_space_prefix").unwrap_or(true);
            let spm = SpmEncoder::new(&pieces, &kinds, scores, unk);
            (None, Some(spm), DecodeStyle::SentencePiece { strip_leading_space: space }, true, space)
        }
        other => return Err(Error::Unsupported(format!("GGUF tokenizer model '{other}' (supported: gpt2, llama)"))),
    };

    let add_bos = flag("tokenizer.ggml.add_bos_token").unwrap_or(add_bos_default);
    let add_eos = flag("tokenizer.ggml.add_eos_token").unwrap_or(false);
    let prefix = if add_bos { bos.into_iter().collect() } else { Vec::new() };
    let suffix = if add_eos { eos.into_iter().collect() } else { Vec::new() };

    Ok(Parts {
        encoder_hf,
        encoder_spm,
        pieces,
        kinds,
        strip_flags: HashMap::new(),
        style,
        bos,
        eos,
        extra_eog,
        prefix,
        suffix,
        add_space_prefix,
        chat_template,
    })
}

/// A byte-level vocabulary of `vocab_size` tokens for models without a tokenizer of their own
/// (dummy weights): ids 0-255 are the bytes, 256 is `<|endoftext|>` (BOS and EOS), the rest are
/// unused fillers. Text encodes to one token per byte; every output decodes.
pub(super) fn byte_vocab(vocab_size: usize) -> Result<Parts> {
    if vocab_size < 257 {
        return Err(Error::Invalid(format!("a byte-level vocabulary needs at least 257 tokens, not {vocab_size}")));
    }
    let chars = super::byte_level_chars();
    let mut pieces: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
    let mut kinds = vec![TokenKind::Normal; 256];
    pieces.push("<|endoftext|>".into());
    kinds.push(TokenKind::Control);
    for i in 257..vocab_size {
        pieces.push(format!("<|unused_{i}|>"));
        kinds.push(TokenKind::Unused);
    }
    let hf = byte_level_bpe(&pieces[..256], &[], default_pre_tokenizer(), false)?;
    Ok(Parts {
        encoder_hf: Some(hf),
        encoder_spm: None,
        pieces,
        kinds,
        strip_flags: HashMap::new(),
        style: DecodeStyle::ByteLevel,
        bos: Some(256),
        eos: Some(256),
        extra_eog: Vec::new(),
        prefix: Vec::new(),
        suffix: Vec::new(),
        add_space_prefix: false,
        chat_template: None,
    })
}

/// Token kinds from `tokenizer.ggml.token_type` (llama.cpp's token types: 1 normal, 2 unknown,
/// 3 control, 4 user-defined, 5 unused, 6 byte). Missing array: all normal, except the
/// end-of-generation markers.
fn gguf_kinds(g: &GgufFile, pieces: &[String]) -> Result<Vec<TokenKind>> {
    let normal = vec![crate::gguf::MetaValue::I32(1); pieces.len()];
    let arr = match g.get("tokenizer.ggml.token_type") {
        None => &normal[..],
        Some(v) => v.as_array().ok_or_else(|| Error::Format("tokenizer.ggml.token_type is not an array".into()))?,
    };
    if arr.len() != pieces.len() {
        return Err(Error::Format(format!("tokenizer.ggml.token_type has {} entries for {} tokens", arr.len(), pieces.len())));
    }
    Ok(arr
        .iter()
        .zip(pieces)
        .map(|(t, piece)| match t.as_i64() {
            // End-of-generation markers are control tokens whatever the file says, as in
            // llama.cpp (some conversions mark `</s>` or `<|im_end|>` normal).
            _ if EOG_TEXTS.contains(&piece.as_str()) => TokenKind::Control,
            Some(2) => TokenKind::Unknown,
            Some(3) => TokenKind::Control,
            Some(4) => TokenKind::UserDefined,
            Some(5) => TokenKind::Unused,
            Some(6) => parse_byte_piece(piece).map_or(TokenKind::Normal, TokenKind::Byte),
            _ => TokenKind::Normal,
        })
        .collect())
}

/// Parses a SentencePiece byte token `<0xNN>`.
fn parse_byte_piece(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

fn string_array(g: &GgufFile, key: &str) -> Result<Option<Vec<String>>> {
    let Some(v) = g.get(key) else { return Ok(None) };
    let arr = v.as_array().ok_or_else(|| Error::Format(format!("{key} is not an array")))?;
    arr.iter().map(|x| x.as_str().map(str::to_owned).ok_or_else(|| Error::Format(format!("{key} holds a non-string")))).collect::<Result<Vec<_>>>().map(Some)
}

fn float_array(g: &GgufFile, key: &str) -> Result<Option<Vec<f32>>> {
    let Some(v) = g.get(key) else { return Ok(None) };
    let arr = v.as_array().ok_or_else(|| Error::Format(format!("{key} is not an array")))?;
    arr.iter().map(|x| x.as_f64().map(|f| f as f32).ok_or_else(|| Error::Format(format!("{key} holds a non-number")))).collect::<Result<Vec<_>>>().map(Some)
}

/// The Hugging Face pre-tokenizer for a llama.cpp pre-tokenizer name, whether BPE should take
/// whole words found in the vocabulary without merging (`ignore_merges`), and whether BOS is
/// added by default.
fn pre_tokenizer_for(pre: &str) -> (Value, bool, bool) {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |re: &str| json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false});
    let seq = |v: Vec<Value>| json!({"type": "Sequence", "pretokenizers": v});
    match pre {
        // Digits one by one, then GPT-2's regex.
        "smollm" | "starcoder" | "refact" | "codeshell" => (seq(vec![json!({"type": "Digits", "individual_digits": true}), byte_level(true)]), false, false),
        "gpt-2" | "gpt2" | "phi-2" | "mpt" | "olmo" => (byte_level(true), false, false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" => (seq(vec![split(LLAMA3_RE), byte_level(false)]), true, true),
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" => (seq(vec![split(QWEN2_RE), byte_level(false)]), false, false),
        "default" | "" => (default_pre_tokenizer(), false, false),
        other => {
            tracing::warn!(
                "unknown tokenizer.ggml.pre '{other}': using llama.cpp's default BPE pre-tokenizer; \
                 tokenization may differ from the model's own"
            );
            (default_pre_tokenizer(), false, false)
        }
    }
}

/// llama.cpp's pre-tokenizer for BPE vocabularies that name none: punctuation runs, GPT-2's
/// regex, digit runs, then groups of three ASCII digits, each split applied to the pieces of
/// the previous one.
fn default_pre_tokenizer() -> Value {
    let split = |re: &str| json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false});
    json!({"type": "Sequence", "pretokenizers": [
        split(r"[\p{P}\$\+<=>\^~\|]+"),
        split(GPT2_RE),
        split(r"\p{N}+"),
        split("[0-9][0-9][0-9]"),
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
    ]})
}

/// A byte-level BPE pipeline over `pieces` (ids in order) and `merges` ("left right" strings).
fn byte_level_bpe(pieces: &[String], merges: &[String], pre: Value, ignore_merges: bool) -> Result<tokenizers::Tokenizer> {
    let mut vocab = Map::with_capacity(pieces.len());
    for (i, p) in pieces.iter().enumerate() {
        // Duplicate entries: the last id wins, as in llama.cpp.
        vocab.insert(p.clone(), json!(i));
    }
    // A merge whose parts or result are not in the vocabulary can never apply; Hugging Face
    // rejects the whole model for one, llama.cpp ignores it: skip it (and say so).
    let mut skipped = 0usize;
    let mut pairs = Vec::with_capacity(merges.len());
    for m in merges {
        // Split at the first space after the first character (a piece may be a lone space).
        let cut = m.char_indices().skip(1).find(|&(_, c)| c == ' ').map(|(i, _)| i).ok_or_else(|| Error::Format(format!("malformed BPE merge {m:?}")))?;
        let (a, b) = (&m[..cut], &m[cut + 1..]);
        if vocab.contains_key(a) && vocab.contains_key(b) && vocab.contains_key(&format!("{a}{b}")) {
            pairs.push(json!([a, b]));
        } else {
            skipped += 1;
        }
    }
    if skipped > 0 {
        tracing::warn!("{skipped} BPE merges use tokens outside the vocabulary; ignored");
    }
    let merges = pairs;
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": pre,
        "post_processor": null,
        "decoder": null,
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": ignore_merges,
            "vocab": vocab,
            "merges": merges,
        },
    });
    serde_json::from_value(doc).map_err(|e| Error::Tokenizer(format!("building the BPE tokenizer: {e}")))
}

// ---------------------------------------------------------------------------------------------
// Hugging Face tokenizer.json

/// One entry of `added_tokens`.
struct Added {
    id: u32,
    content: String,
    special: bool,
    lstrip: bool,
    rstrip: bool,
}

/// Reads `tokenizer.json` (and its sibling config files).
pub(super) fn from_hf_file(path: &Path) -> Result<Parts> {
    let (json_path, dir) = if path.is_dir() {
        (path.join("tokenizer.json"), path.to_path_buf())
    } else {
        (path.to_path_buf(), path.parent().map(Path::to_path_buf).unwrap_or_default())
    };
    let text = std::fs::read_to_string(&json_path).map_err(|e| Error::io(&json_path, e))?;
    let mut root: Value = serde_json::from_str(&text).map_err(|e| Error::Format(format!("{}: {e}", json_path.display())))?;
    let config = read_json_if_exists(&dir.join("tokenizer_config.json"))?;
    let gen_config = read_json_if_exists(&dir.join("generation_config.json"))?;

    let added = parse_added(&root)?;
    let post = root.get("post_processor").cloned().unwrap_or(Value::Null);
    let decoder = root.get("decoder").cloned().unwrap_or(Value::Null);
    let model = root.get("model").cloned().unwrap_or(Value::Null);
    let model_type = model.get("type").and_then(Value::as_str).unwrap_or("BPE");
    if model_type != "BPE" {
        return Err(Error::Unsupported(format!("tokenizer.json model type {model_type} (only BPE)")));
    }
    let byte_fallback = model.get("byte_fallback").and_then(Value::as_bool).unwrap_or(false);
    let vocab = model.get("vocab").and_then(Value::as_object).ok_or_else(|| Error::Format("tokenizer.json model has no vocab".into()))?;

    // Vocabulary by id: model vocab, then added tokens (which may extend it).
    let max_id =
        vocab.values().filter_map(Value::as_u64).chain(added.iter().map(|a| a.id as u64)).max().ok_or_else(|| Error::Format("empty vocabulary".into()))?;
    if max_id >= u32::MAX as u64 || max_id > 16 * 1024 * 1024 {
        return Err(Error::Format(format!("token id {max_id} is implausibly large")));
    }
    let n = max_id as usize + 1;
    let mut pieces = vec![String::new(); n];
    let mut kinds = vec![TokenKind::Unused; n];
    for (piece, id) in vocab {
        let id = id.as_u64().ok_or_else(|| Error::Format(format!("vocab entry {piece:?} has no id")))? as usize;
        pieces[id] = piece.clone();
        kinds[id] = match byte_fallback.then(|| parse_byte_piece(piece)).flatten() {
            Some(b) => TokenKind::Byte(b),
            None => TokenKind::Normal,
        };
    }
    let mut strip_flags = HashMap::new();
    for a in &added {
        pieces[a.id as usize] = a.content.clone();
        kinds[a.id as usize] = if a.special { TokenKind::Control } else { TokenKind::UserDefined };
        if a.lstrip || a.rstrip {
            strip_flags.insert(a.id, (a.lstrip, a.rstrip));
        }
    }
    let style = decode_style(&decoder)?;

    // The encoding pipeline without added tokens, post-processor and decoder: this module
    // handles those.
    if let Some(obj) = root.as_object_mut() {
        obj.insert("added_tokens".into(), json!([]));
        for key in ["post_processor", "decoder", "truncation", "padding"] {
            obj.insert(key.into(), Value::Null);
        }
    }
    let hf: tokenizers::Tokenizer = serde_json::from_value(root).map_err(|e| Error::Tokenizer(format!("{}: {e}", json_path.display())))?;

    let lookup =
        |s: &str| -> Option<u32> { added.iter().find(|a| a.content == s).map(|a| a.id).or_else(|| vocab.get(s).and_then(Value::as_u64).map(|v| v as u32)) };
    let (mut prefix, mut suffix) = template_specials(&post);
    let cfg_token = |key: &str| config.as_ref().and_then(|c| token_field(c.get(key)?));
    let gen_ids = |key: &str| -> Vec<u32> {
        match gen_config.as_ref().and_then(|c| c.get(key)) {
            Some(Value::Number(x)) => x.as_u64().map(|v| v as u32).into_iter().collect(),
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|v| v as u32).collect(),
            _ => Vec::new(),
        }
    };
    let bos = cfg_token("bos_token").and_then(|s| lookup(&s)).or_else(|| gen_ids("bos_token_id").first().copied()).or_else(|| prefix.first().copied());
    let gen_eos = gen_ids("eos_token_id");
    let eos = cfg_token("eos_token").and_then(|s| lookup(&s)).or_else(|| gen_eos.first().copied());
    let cfg_flag = |key: &str| config.as_ref().and_then(|c| c.get(key)).and_then(Value::as_bool);
    if let Some(b) = bos {
        match cfg_flag("add_bos_token") {
            Some(true) if !prefix.contains(&b) => prefix.insert(0, b),
            Some(false) => prefix.retain(|&x| x != b),
            _ => {}
        }
    }
    if let Some(e) = eos {
        match cfg_flag("add_eos_token") {
            Some(true) if !suffix.contains(&e) => suffix.push(e),
            Some(false) => suffix.retain(|&x| x != e),
            _ => {}
        }
    }
    let chat_template = match config.as_ref().and_then(|c| c.get("chat_template")) {
        Some(v) => template_field(v),
        None => {
            let p = dir.join("chat_template.jinja");
            if p.is_file() {
                Some(std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))?)
            } else {
                None
            }
        }
    };
    let add_space_prefix = false; // a tokenizer.json normalizer / pre-tokenizer does this itself

    Ok(Parts {
        encoder_hf: Some(hf),
        encoder_spm: None,
        pieces,
        kinds,
        strip_flags,
        style,
        bos,
        eos,
        extra_eog: gen_eos,
        prefix,
        suffix,
        add_space_prefix,
        chat_template,
    })
}

fn read_json_if_exists(path: &Path) -> Result<Option<Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map(Some).map_err(|e| Error::Format(format!("{}: {e}", path.display())))
}

fn parse_added(root: &Value) -> Result<Vec<Added>> {
    let Some(list) = root.get("added_tokens").and_then(Value::as_array) else {
        return Ok(Vec::new());
    };
    list.iter()
        .map(|t| {
            let id =
                t.get("id").and_then(Value::as_u64).filter(|&v| v < u32::MAX as u64).ok_or_else(|| Error::Format("added token without a valid id".into()))?;
            let content = t.get("content").and_then(Value::as_str).ok_or_else(|| Error::Format(format!("added token {id} without content")))?;
            let flag = |k: &str| t.get(k).and_then(Value::as_bool).unwrap_or(false);
            Ok(Added { id: id as u32, content: content.to_owned(), special: flag("special"), lstrip: flag("lstrip"), rstrip: flag("rstrip") })
        })
        .collect()
}

/// A `bos_token`-style config field: a string or an added-token object with `content`.
fn token_field(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

/// `chat_template`: a string, or a list of named templates (the one named "default" wins).
fn template_field(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => {
            let named =
                |name: &str| list.iter().find(|t| t.get("name").and_then(Value::as_str) == Some(name)).and_then(|t| t.get("template")).and_then(Value::as_str);
            named("default").or_else(|| list.first().and_then(|t| t.get("template")).and_then(Value::as_str)).map(str::to_owned)
        }
        _ => None,
    }
}

/// Ids a `TemplateProcessing` post-processor puts before and after a single sequence.
fn template_specials(post: &Value) -> (Vec<u32>, Vec<u32>) {
    let tp = match post.get("type").and_then(Value::as_str) {
        Some("TemplateProcessing") => post,
        Some("Sequence") => match post
            .get("processors")
            .and_then(Value::as_array)
            .and_then(|ps| ps.iter().find(|p| p.get("type").and_then(Value::as_str) == Some("TemplateProcessing")))
        {
            Some(p) => p,
            None => return (Vec::new(), Vec::new()),
        },
        _ => return (Vec::new(), Vec::new()),
    };
    let ids_of = |name: &str| -> Vec<u32> {
        tp.get("special_tokens")
            .and_then(|s| s.get(name))
            .and_then(|s| s.get("ids"))
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_u64).map(|v| v as u32).collect())
            .unwrap_or_default()
    };
    let (mut prefix, mut suffix) = (Vec::new(), Vec::new());
    let mut seen_seq = false;
    for item in tp.get("single").and_then(Value::as_array).into_iter().flatten() {
        if item.get("Sequence").is_some() {
            seen_seq = true;
        } else if let Some(name) = item.get("SpecialToken").and_then(|s| s.get("id")).and_then(Value::as_str) {
            let ids = ids_of(name);
            if seen_seq {
                suffix.extend(ids)
            } else {
                prefix.extend(ids)
            }
        }
    }
    (prefix, suffix)
}

/// How the tokenizer.json decoder maps tokens to bytes.
fn decode_style(decoder: &Value) -> Result<DecodeStyle> {
    fn walk<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
        if v.get("type").is_some() {
            out.push(v);
        }
        if let Some(list) = v.get("decoders").and_then(Value::as_array) {
            for d in list {
                walk(d, out);
            }
        }
    }
    let mut parts = Vec::new();
    walk(decoder, &mut parts);
    let ty = |v: &Value| v.get("type").and_then(Value::as_str).unwrap_or("").to_owned();
    if parts.iter().any(|d| ty(d) == "ByteLevel") {
        return Ok(DecodeStyle::ByteLevel);
    }
    let spm_like = parts.iter().any(|d| {
        let t = ty(d);
        t == "Metaspace" || t == "ByteFallback" || (t == "Replace" && d.get("pattern").and_then(|p| p.get("String")).and_then(Value::as_str) == Some("▁"))
    });
    if !spm_like {
        return Err(Error::Unsupported(format!(
            "tokenizer.json decoder {} (supported: ByteLevel, SentencePiece-style)",
            if decoder.is_null() { "null".to_owned() } else { decoder.to_string().chars().take(120).collect() }
        )));
    }
    let strip_leading_space = parts.iter().any(|d| match ty(d).as_str() {
        "Strip" => d.get("start").and_then(Value::as_u64).unwrap_or(0) > 0,
        "Metaspace" => {
            d.get("add_prefix_space").and_then(Value::as_bool).unwrap_or(false)
                || matches!(d.get("prepend_scheme").and_then(Value::as_str), Some("first" | "always"))
        }
        _ => false,
    });
    Ok(DecodeStyle::SentencePiece { strip_leading_space })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_pieces_parse() {
        assert_eq!(parse_byte_piece("<0x0A>"), Some(10));
        assert_eq!(parse_byte_piece("<0xff>"), Some(255));
        assert_eq!(parse_byte_piece("<0x0A"), None);
        assert_eq!(parse_byte_piece("<0x123>"), None);
    }

    #[test]
    fn template_processing_prefix_and_suffix() {
        let post = json!({"type": "Sequence", "processors": [
            {"type": "ByteLevel"},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                        {"SpecialToken": {"id": "</s>", "type_id": 0}}],
             "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                                "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}}
        ]});
        assert_eq!(template_specials(&post), (vec![1], vec![2]));
        assert_eq!(template_specials(&Value::Null), (vec![], vec![]));
    }

    #[test]
    fn decoder_styles() {
        let bl = json!({"type": "ByteLevel", "add_prefix_space": true});
        assert_eq!(decode_style(&bl).ok(), Some(DecodeStyle::ByteLevel));
        let llama2 = json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]});
        assert_eq!(decode_style(&llama2).ok(), Some(DecodeStyle::SentencePiece { strip_leading_space: true }));
        assert!(matches!(decode_style(&json!({"type": "WordPiece"})), Err(Error::Unsupported(_))));
    }
}
