//! GGUF parser. Never panics and never reads out of bounds on malformed input.

use super::GgmlType;
use indexmap::IndexMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// A structural problem at a byte offset of the file.
    #[error("{path}: at byte offset {offset}: {message}")]
    Malformed { path: PathBuf, offset: u64, message: String },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// One metadata value. Arrays keep their element type.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<MetadataValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: dims[0] is the contiguous (row) dimension.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset relative to the start of the tensor data section.
    pub offset: u64,
    /// Size in bytes of the tensor data.
    pub size_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: IndexMap<String, MetadataValue>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute file offset of the tensor data section.
    pub data_offset: u64,
    storage: Storage,
}

/// Owned bytes or a read-only mmap.
enum Storage {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

const MAX_ARRAY_DEPTH: usize = 4;
const MAX_DIMS: u32 = 4;

/// A bounds-checked little-endian cursor that turns every short read into an error.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn err(&self, offset: usize, message: impl Into<String>) -> GgufError {
        GgufError::Malformed { path: self.path.to_path_buf(), offset: offset as u64, message: message.into() }
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        let left = self.buf.len() - self.pos;
        if n > left {
            return Err(self.err(self.pos, format!("truncated while reading {}: need {n} bytes, {left} left", what())));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self, what: &dyn Fn() -> String) -> Result<u8, GgufError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &dyn Fn() -> String) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let at = self.pos;
        let len = self.u64(what)?;
        let left = (self.buf.len() - self.pos) as u64;
        if len > left {
            return Err(self.err(at, format!("string length {len} of {} exceeds the {left} bytes left", what())));
        }
        let bytes = self.take(len as usize, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.err(at, format!("{} is not valid UTF-8", what())))
    }

    fn value(&mut self, ty: u32, depth: usize, what: &dyn Fn() -> String) -> Result<MetadataValue, GgufError> {
        use MetadataValue as V;
        let at = self.pos;
        Ok(match ty {
            0 => V::U8(self.u8(what)?),
            1 => V::I8(self.u8(what)? as i8),
            2 => V::U16(self.u16(what)?),
            3 => V::I16(self.u16(what)? as i16),
            4 => V::U32(self.u32(what)?),
            5 => V::I32(self.u32(what)? as i32),
            6 => V::F32(f32::from_bits(self.u32(what)?)),
            7 => match self.u8(what)? {
                0 => V::Bool(false),
                1 => V::Bool(true),
                b => return Err(self.err(at, format!("{}: bool byte {b} is neither 0 nor 1", what()))),
            },
            8 => V::String(self.string(what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err(at, format!("{}: arrays nested deeper than {MAX_ARRAY_DEPTH}", what())));
                }
                let elem = self.u32(what)?;
                let count = self.u64(what)?;
                // Every element takes at least one byte: bound the count before allocating.
                let left = (self.buf.len() - self.pos) as u64;
                let min_size = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4 | 5 | 6 => 4,
                    8 | 10 | 11 | 12 => 8,
                    9 => 12,
                    other => return Err(self.err(at, format!("{}: unknown array element type {other}", what()))),
                };
                if count.saturating_mul(min_size) > left {
                    return Err(self.err(at, format!("{}: array of {count} elements does not fit in the {left} bytes left", what())));
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem, depth + 1, what)?);
                }
                V::Array(items)
            }
            10 => V::U64(self.u64(what)?),
            11 => V::I64(self.u64(what)? as i64),
            12 => V::F64(f64::from_bits(self.u64(what)?)),
            other => return Err(self.err(at, format!("{}: unknown value type {other}", what()))),
        })
    }
}

impl GgufFile {
    /// Memory-maps the file and parses it.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|source| GgufError::Io { path: path.to_path_buf(), source })?;
        // SAFETY: the map is read-only; a file truncated underneath us is the user's problem
        // as with any mmap-based loader (llama.cpp does the same).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| GgufError::Io { path: path.to_path_buf(), source })?;
        Self::parse(Storage::Mmap(map), path)
    }

    /// Parses owned bytes (tests, fuzzing); `path` is used in messages only.
    pub fn parse_bytes(bytes: Vec<u8>, path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        Self::parse(Storage::Owned(bytes), path.as_ref())
    }

    fn parse(storage: Storage, path: &Path) -> Result<GgufFile, GgufError> {
        let buf = storage.bytes();
        let mut c = Cursor { buf, pos: 0, path };
        let magic = c.take(4, &|| "the magic".into())?;
        if magic != b"GGUF" {
            return Err(c.err(0, format!("not a GGUF file: magic is {:?}, expected \"GGUF\"", String::from_utf8_lossy(magic))));
        }
        let version = c.u32(&|| "the version".into())?;
        if version != 2 && version != 3 {
            return Err(c.err(4, format!("unsupported GGUF version {version} (supported: 2, 3)")));
        }
        let n_tensors = c.u64(&|| "the tensor count".into())?;
        let n_kv = c.u64(&|| "the metadata count".into())?;
        let left = (buf.len() - c.pos) as u64;
        // A KV takes at least 12 bytes, a tensor info at least 24.
        if n_kv.saturating_mul(12) > left || n_tensors.saturating_mul(24) > left {
            return Err(c.err(16, format!("counts ({n_kv} metadata, {n_tensors} tensors) cannot fit in a file of {} bytes", buf.len())));
        }
        let mut metadata = IndexMap::with_capacity(n_kv as usize);
        for i in 0..n_kv {
            let at = c.pos;
            let key = c.string(&|| format!("metadata key {i}"))?;
            let ty = c.u32(&|| format!("the type of metadata \"{key}\""))?;
            let v = c.value(ty, 0, &|| format!("metadata \"{key}\""))?;
            if metadata.insert(key.clone(), v).is_some() {
                return Err(c.err(at, format!("duplicate metadata key \"{key}\"")));
            }
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(MetadataValue::U32(a)) => *a as u64,
            Some(MetadataValue::U64(a)) => *a,
            Some(other) => return Err(GgufError::Invalid { path: path.to_path_buf(), message: format!("general.alignment has type {}, expected u32", other.type_name()) }),
        };
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(GgufError::Invalid { path: path.to_path_buf(), message: format!("general.alignment {alignment} is not a power of two") });
        }
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut names = std::collections::HashSet::new();
        for i in 0..n_tensors {
            let at = c.pos;
            let name = c.string(&|| format!("the name of tensor info {i}"))?;
            let what = |field: &str| format!("tensor info {i} (\"{name}\") {field}");
            let n_dims = c.u32(&|| what("n_dims"))?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(c.err(at, format!("{}: {n_dims} dimensions (1..={MAX_DIMS} allowed)", what(""))));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64(&|| what("dims"))?);
            }
            let type_id = c.u32(&|| what("type"))?;
            let ggml_type = GgmlType::from_id(type_id)
                .ok_or_else(|| c.err(at, format!("tensor \"{name}\" has unknown ggml type id {type_id}")))?;
            let offset = c.u64(&|| what("offset"))?;
            let n_elements = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let size_bytes = n_elements.and_then(|_| {
                let row = usize::try_from(dims[0]).ok()?;
                let rows = dims[1..].iter().product::<u64>();
                (ggml_type.row_bytes(row)? as u64).checked_mul(rows)
            });
            let Some(size_bytes) = size_bytes else {
                return Err(c.err(at, format!(
                    "tensor \"{name}\": dims {dims:?} overflow or the row length is not a multiple of the {} block size {}",
                    ggml_type, ggml_type.block_size()
                )));
            };
            if offset % alignment != 0 {
                return Err(c.err(at, format!("tensor \"{name}\": data offset {offset} is not aligned to {alignment}")));
            }
            if !names.insert(name.clone()) {
                return Err(c.err(at, format!("duplicate tensor name \"{name}\"")));
            }
            tensors.push(TensorInfo { name, dims, ggml_type, offset, size_bytes });
        }
        let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
        for t in &tensors {
            let end = data_offset.checked_add(t.offset).and_then(|s| s.checked_add(t.size_bytes));
            if end.map_or(true, |e| e > buf.len() as u64) {
                return Err(GgufError::Invalid {
                    path: path.to_path_buf(),
                    message: format!(
                        "tensor \"{}\" data ({} bytes at offset {}) extends past the end of the file ({} bytes): truncated file?",
                        t.name,
                        t.size_bytes,
                        data_offset.saturating_add(t.offset),
                        buf.len()
                    ),
                });
            }
        }
        Ok(GgufFile { path: path.to_path_buf(), version, metadata, tensors, alignment, data_offset, storage })
    }

    /// The tensor's data bytes (exactly `size_bytes`; bounds were checked at parse time).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.data_offset + t.offset) as usize;
        &self.storage.bytes()[start..start + t.size_bytes as usize]
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    pub fn file_bytes(&self) -> u64 {
        self.storage.bytes().len() as u64
    }

    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.metadata.get(key)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get_u64(key).and_then(|v| u32::try_from(v).ok())
    }

    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f64().map(|v| v as f32)
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        match self.get(key)? {
            MetadataValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        match self.get(key)? {
            MetadataValue::Array(a) => a.iter().map(|v| v.as_str()).collect(),
            _ => None,
        }
    }

    pub fn get_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        match self.get(key)? {
            MetadataValue::Array(a) => a.iter().map(|v| v.as_f64().map(|x| x as f32)).collect(),
            _ => None,
        }
    }

    pub fn get_i32_array(&self, key: &str) -> Option<Vec<i32>> {
        match self.get(key)? {
            MetadataValue::Array(a) => a.iter().map(|v| v.as_i64().and_then(|x| i32::try_from(x).ok())).collect(),
            _ => None,
        }
    }

    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// sha256 of the whole file, hex.
    pub fn sha256_hex(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for chunk in self.storage.bytes().chunks(1 << 20) {
            h.update(chunk);
        }
        hex::encode(h.finalize())
    }
}

impl MetadataValue {
    pub fn type_name(&self) -> &'static str {
        use MetadataValue as V;
        match self {
            V::U8(_) => "u8",
            V::I8(_) => "i8",
            V::U16(_) => "u16",
            V::I16(_) => "i16",
            V::U32(_) => "u32",
            V::I32(_) => "i32",
            V::F32(_) => "f32",
            V::Bool(_) => "bool",
            V::String(_) => "string",
            V::Array(_) => "array",
            V::U64(_) => "u64",
            V::I64(_) => "i64",
            V::F64(_) => "f64",
        }
    }

    /// GGUF value type id.
    pub fn type_id(&self) -> u32 {
        use MetadataValue as V;
        match self {
            V::U8(_) => 0,
            V::I8(_) => 1,
            V::U16(_) => 2,
            V::I16(_) => 3,
            V::U32(_) => 4,
            V::I32(_) => 5,
            V::F32(_) => 6,
            V::Bool(_) => 7,
            V::String(_) => 8,
            V::Array(_) => 9,
            V::U64(_) => 10,
            V::I64(_) => 11,
            V::F64(_) => 12,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetadataValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// Any non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i64().and_then(|v| u64::try_from(v).ok()).or(match self {
            MetadataValue::U64(v) => Some(*v),
            _ => None,
        })
    }

    pub fn as_i64(&self) -> Option<i64> {
        use MetadataValue as V;
        match *self {
            V::U8(v) => Some(v as i64),
            V::I8(v) => Some(v as i64),
            V::U16(v) => Some(v as i64),
            V::I16(v) => Some(v as i64),
            V::U32(v) => Some(v as i64),
            V::I32(v) => Some(v as i64),
            V::U64(v) => i64::try_from(v).ok(),
            V::I64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetadataValue::F32(v) => Some(v as f64),
            MetadataValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }
}
