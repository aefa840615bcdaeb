//! GGUF v3 writer (synthetic test models, tests).
//!
//! Metadata is written in insertion order, tensors in the order they were added, each tensor's
//! data padded to the alignment (`general.alignment` when set, else 32), as gguf-py does.

use super::reader::MetadataValue;
use super::GgmlType;
use anyhow::{bail, ensure};
use std::io::{self, Write};
use std::path::Path;

const DEFAULT_ALIGNMENT: u64 = 32;
/// What the reader accepts; the writer refuses to produce anything it would reject.
const MAX_DIMS: usize = 4;
const MAX_ARRAY_DEPTH: usize = 4;

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    data: Vec<u8>,
}

pub struct GgufWriter {
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty file with the default alignment of 32.
    pub fn new() -> Self {
        GgufWriter { metadata: Vec::new(), tensors: Vec::new() }
    }

    /// Sets `general.alignment`, which must be a power of two.
    pub fn set_alignment(&mut self, alignment: u32) -> anyhow::Result<()> {
        ensure!(alignment.is_power_of_two(), "alignment {alignment} is not a power of two");
        self.add_metadata("general.alignment", MetadataValue::U32(alignment));
        Ok(())
    }

    /// Adds a key, or replaces its value (the key then moves to the end).
    pub fn add_metadata(&mut self, key: &str, value: MetadataValue) {
        self.metadata.retain(|(k, _)| k != key);
        self.metadata.push((key.to_string(), value));
    }

    /// `dims` in ggml order (dims[0] is the row length); `data` must be exactly
    /// `ggml_type.row_bytes(dims[0]) * dims[1..].product()` bytes.
    pub fn add_tensor(&mut self, name: &str, dims: &[u64], ggml_type: GgmlType, data: Vec<u8>) -> anyhow::Result<()> {
        ensure!((1..=MAX_DIMS).contains(&dims.len()), "tensor {name}: {} dimensions, expected 1 to {MAX_DIMS}", dims.len());
        ensure!(!self.tensors.iter().any(|t| t.name == name), "tensor {name} was already added");
        let block = ggml_type.block_size() as u64;
        ensure!(
            dims[0].is_multiple_of(block),
            "tensor {name}: row length {} is not a multiple of the {ggml_type} block size {block}",
            dims[0]
        );
        let rows = dims[1..].iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        let row_bytes = usize::try_from(dims[0]).ok().and_then(|n| ggml_type.row_bytes(n));
        let Some(expect) = rows.zip(row_bytes).and_then(|(rows, row)| rows.checked_mul(row as u64)) else {
            bail!("tensor {name}: {ggml_type} dims {dims:?} overflow the byte size");
        };
        ensure!(data.len() as u64 == expect, "tensor {name}: {} data bytes, expected {expect} for {ggml_type} {dims:?}", data.len());
        self.tensors.push(PendingTensor { name: name.to_string(), dims: dims.to_vec(), ggml_type, data });
        Ok(())
    }

    /// The alignment the file will use, validated.
    fn alignment(&self) -> io::Result<u64> {
        let Some((_, v)) = self.metadata.iter().find(|(k, _)| k == "general.alignment") else {
            return Ok(DEFAULT_ALIGNMENT);
        };
        match v.as_u64() {
            Some(a) if a.is_power_of_two() && matches!(v, MetadataValue::U32(_)) => Ok(a),
            _ => Err(invalid_input(format!("general.alignment must be a u32 power of two, got {v:?}"))),
        }
    }

    /// Serialises the whole file. Fails with `InvalidInput` (before writing anything) on
    /// metadata the format cannot represent: mixed-type or too deeply nested arrays.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let alignment = self.alignment()?;
        for (key, value) in &self.metadata {
            check_value(value, 0).map_err(|e| invalid_input(format!("metadata \"{key}\": {e}")))?;
        }
        let mut header = Vec::new();
        header.extend(b"GGUF");
        header.extend(3u32.to_le_bytes());
        header.extend((self.tensors.len() as u64).to_le_bytes());
        header.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            write_str(&mut header, key);
            header.extend(value.type_id().to_le_bytes());
            write_value(&mut header, value);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            write_str(&mut header, &t.name);
            header.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                header.extend(d.to_le_bytes());
            }
            header.extend(t.ggml_type.id().to_le_bytes());
            header.extend(offset.to_le_bytes());
            offset += padded(t.data.len() as u64, alignment);
        }
        let header_len = header.len() as u64;
        header.resize(padded(header_len, alignment) as usize, 0);
        w.write_all(&header)?;
        for t in &self.tensors {
            w.write_all(&t.data)?;
            let len = t.data.len() as u64;
            w.write_all(&vec![0u8; (padded(len, alignment) - len) as usize])?;
        }
        Ok(())
    }

    /// The whole file in memory.
    pub fn to_bytes(&self) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write_to(&mut out)?;
        Ok(out)
    }

    /// Writes to a temporary file beside `path`, then renames it into place, so readers
    /// never see a half-written model.
    pub fn write_file(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let path = path.as_ref();
        let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
        tmp_name.push(format!(".tmp.{}", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let result = (|| {
            let mut f = io::BufWriter::new(std::fs::File::create(&tmp)?);
            self.write_to(&mut f)?;
            f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

fn padded(n: u64, alignment: u64) -> u64 {
    n.div_ceil(alignment) * alignment
}

fn invalid_input(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// Arrays must be homogeneous (GGUF stores one element type per array) and nest at most
/// MAX_ARRAY_DEPTH deep.
fn check_value(v: &MetadataValue, depth: usize) -> Result<(), String> {
    let MetadataValue::Array(items) = v else { return Ok(()) };
    if depth >= MAX_ARRAY_DEPTH {
        return Err(format!("arrays nested deeper than {MAX_ARRAY_DEPTH} levels"));
    }
    if let Some(first) = items.first() {
        if let Some(other) = items.iter().find(|i| i.type_id() != first.type_id()) {
            return Err(format!("array mixes {} and {} elements", first.type_name(), other.type_name()));
        }
    }
    items.iter().try_for_each(|i| check_value(i, depth + 1))
}

fn write_str(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

fn write_value(b: &mut Vec<u8>, v: &MetadataValue) {
    use MetadataValue as V;
    match v {
        V::U8(x) => b.push(*x),
        V::I8(x) => b.extend(x.to_le_bytes()),
        V::U16(x) => b.extend(x.to_le_bytes()),
        V::I16(x) => b.extend(x.to_le_bytes()),
        V::U32(x) => b.extend(x.to_le_bytes()),
        V::I32(x) => b.extend(x.to_le_bytes()),
        V::F32(x) => b.extend(x.to_le_bytes()),
        V::Bool(x) => b.push(u8::from(*x)),
        V::String(s) => write_str(b, s),
        V::Array(items) => {
            // An empty array has no element to take the type from; u32 is as good as any.
            let elem = items.first().map_or(V::U32(0).type_id(), |i| i.type_id());
            b.extend(elem.to_le_bytes());
            b.extend((items.len() as u64).to_le_bytes());
            for i in items {
                write_value(b, i);
            }
        }
        V::U64(x) => b.extend(x.to_le_bytes()),
        V::I64(x) => b.extend(x.to_le_bytes()),
        V::F64(x) => b.extend(x.to_le_bytes()),
    }
}
