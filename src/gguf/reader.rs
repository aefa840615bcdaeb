//! GGUF v2/v3 parser (little-endian only).
//!
//! Never panics, never reads out of bounds and never allocates from an unchecked length on
//! malformed input: every count is bounded by the bytes left in the file before anything is
//! reserved for it. Errors name the file, the byte offset and what was expected there.

use super::GgmlType;
use indexmap::IndexMap;
use std::collections::HashMap;
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
    /// Tensor name -> index into `tensors`.
    index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("file_bytes", &self.file_bytes())
            .finish()
    }
}

/// Owned bytes or a read-only mmap.
enum Storage {
    /// A read-only map of the file itself (`weights_memory = "mmap"`).
    FileMap(memmap2::Mmap),
    /// Anonymous memory holding a copy (`"huge_pages"`): the only copy of its bytes.
    Anon(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::FileMap(m) | Storage::Anon(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

const MAX_ARRAY_DEPTH: usize = 4;
const MAX_DIMS: u32 = 4;
const DEFAULT_ALIGNMENT: u64 = 32;
/// Most elements reserved up front for a count read from the file; bigger collections grow
/// as their elements are actually parsed, so a lying count cannot trigger a huge allocation.
const MAX_PREALLOC: usize = 4096;
/// Smallest encodings, used to bound counts by the bytes left before parsing them.
const MIN_KV_BYTES: u64 = 8 + 4 + 1; // key length, value type, a one-byte value
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8; // name length, n_dims, one dim, type, offset

/// Smallest encoded size of one value of GGUF value type `ty`, or None for an unknown type.
fn min_value_bytes(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1, // u8, i8, bool
        2 | 3 => 2,     // u16, i16
        4..=6 => 4,     // u32, i32, f32
        8 => 8,         // string: its u64 length
        9 => 4 + 8,     // array: element type and count
        10..=12 => 8,   // u64, i64, f64
        _ => return None,
    })
}

/// Describes what is being read, built only when an error message needs it.
type What<'w> = &'w dyn Fn() -> String;

/// A bounds-checked little-endian cursor that turns every short read into an error.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn left(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn err(&self, offset: usize, message: impl Into<String>) -> GgufError {
        GgufError::Malformed { path: self.path.to_path_buf(), offset: offset as u64, message: message.into() }
    }

    fn take(&mut self, n: u64, what: What) -> Result<&'a [u8], GgufError> {
        let left = self.left();
        if n > left {
            return Err(self.err(self.pos, format!("truncated while reading {}: need {n} bytes, {left} left", what())));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: What) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: What) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: What) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: What) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: What) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A u64 length followed by that many UTF-8 bytes.
    fn string(&mut self, what: What) -> Result<String, GgufError> {
        let at = self.pos;
        let len = self.u64(&|| format!("the length of {}", what()))?;
        let left = self.left();
        if len > left {
            return Err(self.err(at, format!("string length {len} of {} exceeds the {left} bytes left in the file", what())));
        }
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(self.err(at, format!("{} is not valid UTF-8 (invalid byte at string position {})", what(), e.valid_up_to()))),
        }
    }

    /// One value of GGUF value type `ty`; `depth` counts the arrays around it.
    fn value(&mut self, ty: u32, depth: usize, what: What) -> Result<MetadataValue, GgufError> {
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
                    return Err(self.err(at, format!("{}: arrays nested deeper than {MAX_ARRAY_DEPTH} levels", what())));
                }
                let elem = self.u32(&|| format!("the element type of {}", what()))?;
                let count = self.u64(&|| format!("the element count of {}", what()))?;
                let Some(min_size) = min_value_bytes(elem) else {
                    return Err(self.err(at, format!("{}: unknown array element type {elem}", what())));
                };
                let left = self.left();
                if count.saturating_mul(min_size) > left {
                    return Err(
                        self.err(at, format!("{}: array of {count} elements cannot fit in the {left} bytes left in the file", what()))
                    );
                }
                let mut items = Vec::with_capacity((count as usize).min(MAX_PREALLOC));
                for i in 0..count {
                    items.push(self.value(elem, depth + 1, &|| format!("{}[{i}]", what()))?);
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

/// Opens `path` for reading, refusing what is not a regular file.
fn open_regular_file(path: &Path) -> Result<std::fs::File, GgufError> {
    let io_err = |source| GgufError::Io { path: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(io_err)?;
    if !file.metadata().map_err(io_err)?.is_file() {
        return Err(GgufError::Invalid { path: path.to_path_buf(), message: "not a regular file".into() });
    }
    Ok(file)
}

/// Where a model file's bytes live while it is served (`engine.weights_memory`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum WeightsMemory {
    /// The file memory-mapped (page-cache pages, shared with other readers, loaded lazily).
    #[default]
    Mmap,
    /// The file read into anonymous memory that asks for transparent huge pages
    /// (`GgufFile::open_in_huge_pages`): a copy at load, 2 MB pages for the weights' stream.
    HugePages,
}

impl GgufFile {
    /// Memory-maps the file and parses it.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        Self::open_with(path, WeightsMemory::Mmap)
    }

    /// Opens the file with its bytes in `memory`.
    pub fn open_with(path: impl AsRef<Path>, memory: WeightsMemory) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        if memory == WeightsMemory::HugePages {
            return Self::open_in_huge_pages(path);
        }
        let io_err = |source| GgufError::Io { path: path.to_path_buf(), source };
        let file = open_regular_file(path)?;
        // SAFETY: the map is read-only. A file truncated or rewritten underneath a running
        // process is outside what any mmap-based loader can defend against (llama.cpp too).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
        Self::parse(Storage::FileMap(map), path)
    }

    /// Reads the file into anonymous memory that asks for transparent huge pages
    /// (`MADV_HUGEPAGE`; THP is commonly in `madvise` mode) and parses it, then tells the kernel
    /// the file's page-cache pages are no longer needed (`POSIX_FADV_DONTNEED`), so the model is
    /// not held twice. Decode streams every weight once per token, so 2 MB pages can save TLB
    /// misses: on a 2-vCPU KVM guest the 1B Q4_K decoded 13-20% faster from them while the VM was
    /// busy (session 6), within -4%..+3% of the mmap on a quiet one (session 8; docs/PERF.md).
    pub fn open_in_huge_pages(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        use std::io::Read;
        let path = path.as_ref();
        let io_err = |source| GgufError::Io { path: path.to_path_buf(), source };
        let file = open_regular_file(path)?;
        let len = file.metadata().map_err(io_err)?.len() as usize;
        if len == 0 {
            return Self::parse(Storage::Owned(Vec::new()), path);
        }
        let mut anon = memmap2::MmapMut::map_anon(len).map_err(io_err)?;
        #[cfg(target_os = "linux")]
        let _ = anon.advise(memmap2::Advice::HugePage); // a hint: without THP, plain pages
        (&file).read_exact(&mut anon[..]).map_err(io_err)?;
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: a plain syscall on an open descriptor; its result is only advice.
            let _ = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
        Self::parse(Storage::Anon(anon.make_read_only().map_err(io_err)?), path)
    }

    /// Parses owned bytes (tests, fuzzing); `path` is used in messages only.
    pub fn parse_bytes(bytes: Vec<u8>, path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        Self::parse(Storage::Owned(bytes), path.as_ref())
    }

    fn parse(storage: Storage, path: &Path) -> Result<GgufFile, GgufError> {
        let buf = storage.bytes();
        let mut c = Cursor { buf, pos: 0, path };
        let version = read_header(&mut c)?;
        let n_tensors = c.u64(&|| "the tensor count".into())?;
        let n_kv = c.u64(&|| "the metadata key/value count".into())?;
        check_count(&c, 16, n_kv, MIN_KV_BYTES, "metadata key/value count", "key/value pair")?;
        check_count(&c, 8, n_tensors, MIN_TENSOR_INFO_BYTES, "tensor count", "tensor info")?;

        let metadata = read_metadata(&mut c, n_kv)?;
        let alignment = alignment_of(&metadata, path)?;
        check_count(&c, 8, n_tensors, MIN_TENSOR_INFO_BYTES, "tensor count", "tensor info")?;
        let (tensors, index) = read_tensor_infos(&mut c, n_tensors, alignment)?;

        // The data section starts at the next multiple of the alignment.
        let data_offset = (c.pos as u64).checked_next_multiple_of(alignment).ok_or_else(|| GgufError::Invalid {
            path: path.to_path_buf(),
            message: format!("alignment {alignment} puts the tensor data section beyond any possible file size"),
        })?;
        check_data_ranges(&tensors, data_offset, buf.len() as u64, path)?;
        Ok(GgufFile { path: path.to_path_buf(), version, metadata, tensors, alignment, data_offset, storage, index })
    }

    /// Tells the kernel that a tensor's bytes will not be read soon (the CPU backend keeps its
    /// own repacked copy): where the file is mapped, the whole pages inside the tensor leave this
    /// process (`MADV_DONTNEED`: a later read faults them back in from the file) and the page
    /// cache (`POSIX_FADV_DONTNEED`), so a large model is not resident twice. Anonymous and
    /// owned storage hold the only copy and are left alone. Only advice: errors are ignored.
    pub fn release_tensor_pages(&self, t: &TensorInfo) {
        #[cfg(target_os = "linux")]
        if let Storage::FileMap(map) = &self.storage {
            let data = self.tensor_data(t);
            let start = data.as_ptr() as usize - map.as_ptr() as usize;
            // madvise needs page-aligned ranges and pages are not 4 KiB everywhere (16/64 KiB on
            // some arm64 kernels), so ask the kernel; 4096 if it cannot say.
            static PAGE_SIZE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
            let page = *PAGE_SIZE.get_or_init(|| {
                // SAFETY: sysconf only reads a system constant.
                let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
                if n > 0 {
                    n as usize
                } else {
                    4096
                }
            });
            let (first, last) = (start.next_multiple_of(page), (start + data.len()) / page * page);
            if last > first {
                // SAFETY: a read-only shared map of a file: dropping its pages loses nothing,
                // the next read of them faults the file's bytes back in.
                let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, last - first) };
                if let Ok(file) = std::fs::File::open(&self.path) {
                    use std::os::fd::AsRawFd;
                    // SAFETY: a plain syscall on an open descriptor; its result is only advice.
                    let _ =
                        unsafe { libc::posix_fadvise(file.as_raw_fd(), first as i64, (last - first) as i64, libc::POSIX_FADV_DONTNEED) };
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = t;
    }

    /// The tensor's data bytes (exactly `size_bytes`; bounds were checked at parse time).
    ///
    /// # Panics
    /// If `t` does not come from this file and lies outside it (a caller bug).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let bytes = self.storage.bytes();
        let range = self
            .data_offset
            .checked_add(t.offset)
            .and_then(|start| Some(usize::try_from(start).ok()?..usize::try_from(start.checked_add(t.size_bytes)?).ok()?));
        match range.and_then(|r| bytes.get(r)) {
            Some(data) => data,
            None => panic!(
                "tensor_data: tensor \"{}\" ({} bytes at data offset {}) lies outside {} ({} bytes); was its TensorInfo taken from another file?",
                t.name,
                t.size_bytes,
                t.offset,
                self.path.display(),
                bytes.len()
            ),
        }
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// Position of the tensor in `tensors` (file order).
    pub fn tensor_index(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
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

    /// Any integer type whose value is non-negative.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// Any integer type whose value fits in a u32.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get_u64(key).and_then(|v| u32::try_from(v).ok())
    }

    /// An F32 or F64 value (integers are accepted too, as some converters write whole numbers that way).
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f64().map(|v| v as f32)
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    /// An array whose elements are all strings.
    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        self.get(key)?.as_array()?.iter().map(|v| v.as_str()).collect()
    }

    /// An array whose elements are all numbers.
    pub fn get_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        self.get(key)?.as_array()?.iter().map(|v| v.as_f64().map(|x| x as f32)).collect()
    }

    /// An array whose elements are all integers that fit in an i32 (token types, ids).
    pub fn get_i32_array(&self, key: &str) -> Option<Vec<i32>> {
        self.get(key)?.as_array()?.iter().map(|v| v.as_i64().and_then(|x| i32::try_from(x).ok())).collect()
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// sha256 of the whole file, hex: a mapped file is read from disk, other storage is
    /// streamed from memory in 1 MiB chunks.
    pub fn sha256_hex(&self) -> String {
        use sha2::{Digest, Sha256};
        // A mapped file is hashed through read(), not the map: reading every page of the map
        // would make the whole file resident in this process again, repacked tensors included
        // (`release_tensor_pages`). Falls back to the map if the file cannot be read whole.
        if let Storage::FileMap(map) = &self.storage {
            if let Ok(file) = std::fs::File::open(&self.path) {
                // Sha256 is an io::Write, so io::copy streams the file through it (retrying
                // EINTR); a read error or a file that changed length since it was mapped
                // discards this hash and falls back to the map below. The BufReader keeps the
                // reads at 1 MiB (io::copy reads through a BufReader's own buffer; on a bare
                // File it would use 8 KiB reads, 128x the syscalls on a 20 GB model).
                let mut hashed = Sha256::new();
                let mut file = std::io::BufReader::with_capacity(1 << 20, file);
                if matches!(std::io::copy(&mut file, &mut hashed), Ok(n) if n == map.len() as u64) {
                    return hex::encode(hashed.finalize());
                }
            }
        }
        let mut h = Sha256::new();
        for chunk in self.storage.bytes().chunks(1 << 20) {
            h.update(chunk);
        }
        hex::encode(h.finalize())
    }
}

/// Magic and version; returns the version.
fn read_header(c: &mut Cursor) -> Result<u32, GgufError> {
    let magic = c.take(4, &|| "the magic".into())?;
    if magic != b"GGUF" {
        return Err(c.err(0, format!("not a GGUF file: magic is {:?}, expected \"GGUF\"", String::from_utf8_lossy(magic))));
    }
    let version = c.u32(&|| "the version".into())?;
    match version {
        2 | 3 => Ok(version),
        1 => Err(c.err(4, "GGUF version 1 is not supported (only versions 2 and 3); re-convert the model with a current llama.cpp")),
        v if matches!(v.swap_bytes(), 2 | 3) => {
            Err(c.err(4, format!("big-endian GGUF (version {}) is not supported; only little-endian files are", v.swap_bytes())))
        }
        v => Err(c.err(4, format!("unsupported GGUF version {v} (supported: 2, 3)"))),
    }
}

/// Rejects a count whose smallest encoding already exceeds the bytes left.
fn check_count(c: &Cursor, field_offset: usize, count: u64, min_bytes: u64, field: &str, item: &str) -> Result<(), GgufError> {
    let left = c.left();
    if count.saturating_mul(min_bytes) > left {
        return Err(c.err(
            field_offset,
            format!("{field} {count} cannot fit in the {left} bytes left in the file (a {item} takes at least {min_bytes} bytes)"),
        ));
    }
    Ok(())
}

fn read_metadata(c: &mut Cursor, n_kv: u64) -> Result<IndexMap<String, MetadataValue>, GgufError> {
    let mut metadata = IndexMap::with_capacity((n_kv as usize).min(MAX_PREALLOC));
    for i in 0..n_kv {
        let at = c.pos;
        let key = c.string(&|| format!("metadata key {i}"))?;
        let ty = c.u32(&|| format!("the value type of metadata \"{key}\""))?;
        let value = c.value(ty, 0, &|| format!("metadata \"{key}\""))?;
        if metadata.contains_key(&key) {
            return Err(c.err(at, format!("duplicate metadata key \"{key}\"")));
        }
        metadata.insert(key, value);
    }
    Ok(metadata)
}

/// `general.alignment` (default 32): any integer type holding a power of two.
fn alignment_of(metadata: &IndexMap<String, MetadataValue>, path: &Path) -> Result<u64, GgufError> {
    let invalid = |message: String| GgufError::Invalid { path: path.to_path_buf(), message };
    let Some(v) = metadata.get("general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    let Some(alignment) = v.as_u64() else {
        return Err(invalid(format!("general.alignment is {v:?} of type {}, expected a u32 power of two", v.type_name())));
    };
    if !alignment.is_power_of_two() {
        return Err(invalid(format!("general.alignment {alignment} is not a power of two")));
    }
    Ok(alignment)
}

fn read_tensor_infos(c: &mut Cursor, n_tensors: u64, alignment: u64) -> Result<(Vec<TensorInfo>, HashMap<String, usize>), GgufError> {
    let cap = (n_tensors as usize).min(MAX_PREALLOC);
    let mut tensors = Vec::with_capacity(cap);
    let mut index = HashMap::with_capacity(cap);
    for i in 0..n_tensors {
        let at = c.pos;
        let name = c.string(&|| format!("the name of tensor info {i}"))?;
        let what = |field: &str| format!("tensor info {i} (\"{name}\") {field}");
        let n_dims = c.u32(&|| what("n_dims"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(c.err(at, format!("{}: {n_dims} dimensions, expected 1 to {MAX_DIMS}", what("n_dims"))));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64(&|| what("dims"))?);
        }
        let type_id = c.u32(&|| what("type"))?;
        let ggml_type = GgmlType::from_id(type_id)
            .ok_or_else(|| c.err(at, format!("tensor \"{name}\" (tensor info {i}) has unknown or unsupported ggml type id {type_id}")))?;
        let offset = c.u64(&|| what("offset"))?;

        // ggml keeps element counts in int64_t; anything larger is corrupt.
        let n_elements = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).filter(|&n| n <= i64::MAX as u64);
        let rows = dims[1..].iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        let (Some(_), Some(rows)) = (n_elements, rows) else {
            return Err(c.err(at, format!("tensor \"{name}\": dims {dims:?} overflow the element count")));
        };
        let block = ggml_type.block_size() as u64;
        if dims[0] % block != 0 {
            return Err(
                c.err(at, format!("tensor \"{name}\": row length {} is not a multiple of the {ggml_type} block size {block}", dims[0]))
            );
        }
        let row_bytes = usize::try_from(dims[0]).ok().and_then(|n| ggml_type.row_bytes(n));
        let Some(size_bytes) = row_bytes.and_then(|r| (r as u64).checked_mul(rows)) else {
            return Err(c.err(at, format!("tensor \"{name}\": {ggml_type} dims {dims:?} overflow the byte size")));
        };
        if offset % alignment != 0 {
            return Err(c.err(at, format!("tensor \"{name}\": data offset {offset} is not aligned to {alignment}")));
        }
        if index.contains_key(&name) {
            return Err(c.err(at, format!("duplicate tensor name \"{name}\"")));
        }
        index.insert(name.clone(), tensors.len());
        tensors.push(TensorInfo { name, dims, ggml_type, offset, size_bytes });
    }
    Ok((tensors, index))
}

/// Every tensor's bytes lie inside the file and no two tensors share bytes.
fn check_data_ranges(tensors: &[TensorInfo], data_offset: u64, file_len: u64, path: &Path) -> Result<(), GgufError> {
    let invalid = |message: String| GgufError::Invalid { path: path.to_path_buf(), message };
    let mut ranges = Vec::with_capacity(tensors.len());
    for t in tensors {
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.size_bytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => ranges.push((start, end, t)),
            _ => {
                return Err(invalid(format!(
                    "tensor \"{}\" data ({} bytes at file offset {}) extends past the end of the file ({file_len} bytes): truncated file?",
                    t.name,
                    t.size_bytes,
                    data_offset.saturating_add(t.offset),
                )))
            }
        }
    }
    ranges.retain(|&(start, end, _)| end > start);
    ranges.sort_unstable_by_key(|&(start, end, _)| (start, end));
    for pair in ranges.windows(2) {
        let ((s0, e0, a), (s1, e1, b)) = (pair[0], pair[1]);
        if s1 < e0 {
            return Err(invalid(format!(
                "tensor data overlap: \"{}\" (file bytes {s0}..{e0}) and \"{}\" (file bytes {s1}..{e1})",
                a.name, b.name
            )));
        }
    }
    Ok(())
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

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetadataValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetadataValue]> {
        match self {
            MetadataValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Any integer type holding a non-negative value.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetadataValue::U64(v) => Some(v),
            _ => self.as_i64().and_then(|v| u64::try_from(v).ok()),
        }
    }

    /// Any integer type holding a value that fits in an i64.
    pub fn as_i64(&self) -> Option<i64> {
        use MetadataValue as V;
        match *self {
            V::U8(v) => Some(v.into()),
            V::I8(v) => Some(v.into()),
            V::U16(v) => Some(v.into()),
            V::I16(v) => Some(v.into()),
            V::U32(v) => Some(v.into()),
            V::I32(v) => Some(v.into()),
            V::U64(v) => i64::try_from(v).ok(),
            V::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Floats, and integers converted to f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetadataValue::F32(v) => Some(v.into()),
            MetadataValue::F64(v) => Some(v),
            MetadataValue::U64(v) => Some(v as f64),
            _ => self.as_i64().map(|v| v as f64),
        }
    }
}
