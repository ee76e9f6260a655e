//! A defensive reader for GGUF files (llama.cpp's model format, versions 2 and 3).
//!
//! The file is memory-mapped; the header (metadata and tensor directory) is parsed with every
//! length checked against the bytes that remain before anything is allocated, so a truncated or
//! hostile file gives an error, never a panic or a huge allocation. Tensor data is not copied:
//! [`GgufFile::tensor_data`] returns a slice of the map.
//!
//! Format: <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use crate::error::{Error, Result};

/// Tensor element types that can appear in a GGUF file, with their block geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
}

impl GgmlType {
    /// Maps the on-disk type id; unknown ids (IQ formats and others) are an error naming them.
    pub fn from_id(id: u32) -> Result<Self> {
        Ok(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            10 => Self::Q2_K,
            11 => Self::Q3_K,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            15 => Self::Q8_K,
            30 => Self::BF16,
            other => return Err(Error::Unsupported(format!("GGML tensor type id {other}"))),
        })
    }

    /// Elements per block.
    pub fn block_elems(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 | Self::Q8_1 => 32,
            Self::Q2_K | Self::Q3_K | Self::Q4_K | Self::Q5_K | Self::Q6_K | Self::Q8_K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q8_1 => 36,
            Self::Q2_K => 84,
            Self::Q3_K => 110,
            Self::Q4_K => 144,
            Self::Q5_K => 176,
            Self::Q6_K => 210,
            Self::Q8_K => 292,
        }
    }

    /// Bytes for `elems` elements, or None if `elems` is not a whole number of blocks or overflows.
    pub fn bytes_for(self, elems: u64) -> Option<u64> {
        let be = self.block_elems() as u64;
        if !elems.is_multiple_of(be) {
            return None;
        }
        (elems / be).checked_mul(self.block_bytes() as u64)
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v as u64),
            Self::U16(v) => Some(v as u64),
            Self::U32(v) => Some(v as u64),
            Self::U64(v) => Some(v),
            Self::I8(v) if v >= 0 => Some(v as u64),
            Self::I16(v) if v >= 0 => Some(v as u64),
            Self::I32(v) if v >= 0 => Some(v as u64),
            Self::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }

    /// The value as a signed integer, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Self::I8(v) => Some(v as i64),
            Self::I16(v) => Some(v as i64),
            Self::I32(v) => Some(v as i64),
            Self::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float, if it is numeric.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v as f64),
            Self::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The value as a boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Directory entry of one tensor.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions as GGUF stores them: innermost (contiguous) first.
    pub dims: Vec<u64>,
    /// Element type.
    pub dtype: GgmlType,
    /// Absolute byte range of the data in the file.
    pub start: usize,
    /// Length in bytes.
    pub len: usize,
}

impl TensorInfo {
    /// Number of elements.
    pub fn elems(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Shape in row-major order (outermost first), as candle and PyTorch write it.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// An opened GGUF file: parsed metadata, tensor directory, and the mapped bytes.
pub struct GgufFile {
    mmap: Mmap,
    /// GGUF format version (2 or 3).
    pub version: u32,
    /// Metadata key-value pairs.
    pub metadata: HashMap<String, MetaValue>,
    /// Tensor directory in file order.
    pub tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
}

const MAX_DIMS: u32 = 4;
const DEFAULT_ALIGNMENT: u64 = 32;

impl GgufFile {
    /// Opens and parses a GGUF file. The file must not be modified while it is open.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the map is read-only; the model file is not expected to change while pace runs,
        // and every access goes through bounds-checked slices.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        Self::parse(mmap).map_err(|e| e.context(format!("reading GGUF file {}", path.display())))
    }

    fn parse(mmap: Mmap) -> Result<Self> {
        let mut r = Reader::new(&mmap);
        let magic = r.bytes(4)?;
        if magic != b"GGUF" {
            return Err(Error::Format("not a GGUF file (bad magic)".into()));
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(Error::Unsupported(format!("GGUF version {version}")));
        }
        let n_tensors = r.u64()?;
        let n_kv = r.u64()?;
        // Each key-value takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor entry at
        // least 8 + 4 + 4 + 8 bytes. Counts larger than the file allows are rejected up front.
        r.check_count(n_kv, 13, "metadata entries")?;
        r.check_count(n_tensors, 24, "tensors")?;
        let mut metadata = HashMap::new();
        for _ in 0..n_kv {
            let key = r.string()?;
            let ty = r.u32()?;
            let value = r.value(ty, 0)?;
            metadata.insert(key, value);
        }
        let mut raw = Vec::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let name = r.string()?;
            let n_dims = r.u32()?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(Error::Format(format!("tensor {name}: {n_dims} dimensions")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64()?);
            }
            let dtype = GgmlType::from_id(r.u32()?).map_err(|e| e.context(format!("tensor {name}")))?;
            let offset = r.u64()?;
            raw.push((name, dims, dtype, offset));
        }
        let alignment = match metadata.get("general.alignment") {
            Some(v) => v.as_u64().filter(|a| *a > 0 && a.is_power_of_two()).ok_or_else(|| Error::Format("general.alignment is not a power of two".into()))?,
            None => DEFAULT_ALIGNMENT,
        };
        let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
        let file_len = mmap.len() as u64;
        let mut tensors = Vec::with_capacity(raw.len());
        let mut by_name = HashMap::with_capacity(raw.len());
        for (name, dims, dtype, offset) in raw {
            let elems =
                dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).ok_or_else(|| Error::Format(format!("tensor {name}: element count overflows")))?;
            let len = dtype.bytes_for(elems).ok_or_else(|| Error::Format(format!("tensor {name}: {elems} elements is not whole {dtype:?} blocks")))?;
            let start = data_start
                .checked_add(offset)
                .filter(|s| s.checked_add(len).is_some_and(|end| end <= file_len))
                .ok_or_else(|| Error::Format(format!("tensor {name}: data lies outside the file (truncated?)")))?;
            if by_name.insert(name.clone(), tensors.len()).is_some() {
                return Err(Error::Format(format!("tensor {name} appears twice")));
            }
            tensors.push(TensorInfo { name, dims, dtype, start: start as usize, len: len as usize });
        }
        Ok(Self { mmap, version, metadata, tensors, by_name })
    }

    /// The directory entry of a tensor.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor (bounds were checked when the file was opened).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        &self.mmap[info.start..info.start + info.len]
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// A required unsigned integer metadata value.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.get(key).and_then(MetaValue::as_u64).ok_or_else(|| Error::Format(format!("GGUF metadata {key} is missing or not an integer")))
    }

    /// A required float metadata value.
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        self.get(key).and_then(MetaValue::as_f64).ok_or_else(|| Error::Format(format!("GGUF metadata {key} is missing or not a number")))
    }

    /// A string metadata value, if present.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(MetaValue::as_str)
    }
}

/// Bounds-checked little-endian cursor over the header bytes.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Bytes the metadata may still take in memory. A value in memory is larger than in the
    /// file (an element of a `u8` array takes one byte there and a whole [`MetaValue`] here), so
    /// checking counts against the bytes left is not enough: a header of one huge `u8` array
    /// would allocate 32 times the file's size.
    budget: u64,
}

/// The metadata may take this many times the file's bytes in memory, plus [`META_SLACK`]:
/// real files need far less (their tensors, not their metadata, make up the file), and a vocabulary-only
/// file (strings, `f32` scores, `i32` types) about 4x.
const META_PER_FILE_BYTE: u64 = 4;
const META_SLACK: u64 = 16 << 20;

/// Arrays nest at most this deep (GGUF writers use one level).
const MAX_NESTING: u32 = 2;

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        let budget = (buf.len() as u64).saturating_mul(META_PER_FILE_BYTE).saturating_add(META_SLACK);
        Self { buf, pos: 0, budget }
    }

    /// Takes `bytes` of the metadata's memory budget, or fails.
    fn charge(&mut self, bytes: u64) -> Result<()> {
        match self.budget.checked_sub(bytes) {
            Some(left) => {
                self.budget = left;
                Ok(())
            }
            None => Err(Error::Format("the metadata would take more memory than a file of this size can justify".into())),
        }
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(Error::Format(format!("header truncated: need {n} bytes at offset {}, {} left", self.pos, self.remaining())));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Rejects a count of items that cannot fit in the remaining bytes at `min_size` each.
    fn check_count(&self, count: u64, min_size: u64, what: &str) -> Result<()> {
        if count.saturating_mul(min_size) > self.remaining() as u64 {
            return Err(Error::Format(format!("header claims {count} {what}, more than the file can hold")));
        }
        Ok(())
    }

    fn string(&mut self) -> Result<String> {
        let len = self.u64()?;
        self.check_count(len, 1, "string bytes")?;
        self.charge(len)?;
        let bytes = self.bytes(len as usize)?;
        // Vocabularies carry invalid UTF-8 in rare tokens; keep them readable rather than failing.
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn value(&mut self, ty: u32, depth: u32) -> Result<MetaValue> {
        Ok(match ty {
            0 => MetaValue::U8(self.array::<1>()?[0]),
            1 => MetaValue::I8(self.array::<1>()?[0] as i8),
            2 => MetaValue::U16(u16::from_le_bytes(self.array()?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array()?)),
            4 => MetaValue::U32(self.u32()?),
            5 => MetaValue::I32(i32::from_le_bytes(self.array()?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => return Err(Error::Format(format!("invalid boolean byte {b}"))),
            },
            8 => MetaValue::String(self.string()?),
            9 => {
                if depth >= MAX_NESTING {
                    return Err(Error::Format("metadata arrays nest too deeply".into()));
                }
                let elem_ty = self.u32()?;
                let len = self.u64()?;
                let min_size = match elem_ty {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    other => return Err(Error::Format(format!("unknown metadata type {other}"))),
                };
                self.check_count(len, min_size, "array elements")?;
                self.charge(len.saturating_mul(std::mem::size_of::<MetaValue>() as u64))?;
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(self.value(elem_ty, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(self.u64()?),
            11 => MetaValue::I64(i64::from_le_bytes(self.array()?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(Error::Format(format!("unknown metadata type {other}"))),
        })
    }
}
