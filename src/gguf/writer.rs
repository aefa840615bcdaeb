//! GGUF v3 writer (synthetic test models, tests).

use super::reader::MetadataValue;
use super::GgmlType;
use anyhow::{bail, Context};
use std::io::Write;
use std::path::Path;

pub struct GgufWriter {
    alignment: u64,
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter { alignment: 32, metadata: Vec::new(), tensors: Vec::new() }
    }

    /// Sets general.alignment (a power of two).
    pub fn set_alignment(&mut self, alignment: u64) {
        self.alignment = alignment;
        self.add_metadata("general.alignment", MetadataValue::U32(alignment as u32));
    }

    pub fn add_metadata(&mut self, key: &str, value: MetadataValue) {
        self.metadata.retain(|(k, _)| k != key);
        self.metadata.push((key.to_string(), value));
    }

    /// `dims` in ggml order; `data` must be exactly the tensor's size.
    pub fn add_tensor(&mut self, name: &str, dims: &[u64], ggml_type: GgmlType, data: Vec<u8>) -> anyhow::Result<()> {
        let row = ggml_type
            .row_bytes(dims[0] as usize)
            .with_context(|| format!("tensor {name}: row length {} is not a multiple of the {ggml_type} block", dims[0]))?;
        let expect = row as u64 * dims[1..].iter().product::<u64>();
        if data.len() as u64 != expect {
            bail!("tensor {name}: {} data bytes, expected {expect} for {ggml_type} {dims:?}", data.len());
        }
        self.tensors.push((name.to_string(), dims.to_vec(), ggml_type, data));
        Ok(())
    }

    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        let mut pos = 0u64;
        let put = |w: &mut dyn Write, b: &[u8], pos: &mut u64| -> std::io::Result<()> {
            *pos += b.len() as u64;
            w.write_all(b)
        };
        put(w, b"GGUF", &mut pos)?;
        put(w, &3u32.to_le_bytes(), &mut pos)?;
        put(w, &(self.tensors.len() as u64).to_le_bytes(), &mut pos)?;
        put(w, &(self.metadata.len() as u64).to_le_bytes(), &mut pos)?;
        for (k, v) in &self.metadata {
            let mut b = Vec::new();
            write_str(&mut b, k);
            b.extend(v.type_id().to_le_bytes());
            write_value(&mut b, v);
            put(w, &b, &mut pos)?;
        }
        let mut offset = 0u64;
        for (name, dims, t, data) in &self.tensors {
            let mut b = Vec::new();
            write_str(&mut b, name);
            b.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend(d.to_le_bytes());
            }
            b.extend(t.id().to_le_bytes());
            b.extend(offset.to_le_bytes());
            put(w, &b, &mut pos)?;
            offset = (offset + data.len() as u64).div_ceil(self.alignment) * self.alignment;
        }
        let pad = |pos: u64| (pos.div_ceil(self.alignment) * self.alignment - pos) as usize;
        let p = pad(pos);
        put(w, &vec![0u8; p], &mut pos)?;
        for (_, _, _, data) in &self.tensors {
            put(w, data, &mut pos)?;
            let p = pad(pos);
            put(w, &vec![0u8; p], &mut pos)?;
        }
        Ok(())
    }

    /// Writes to a temporary file beside `path`, then renames it into place.
    pub fn write_file(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        let path = path.as_ref();
        let tmp = path.with_extension("gguf.tmp");
        {
            let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
            self.write_to(&mut f)?;
            f.flush()?;
        }
        std::fs::rename(&tmp, path)
    }
}

fn write_str(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

fn write_value(b: &mut Vec<u8>, v: &MetadataValue) {
    use MetadataValue as V;
    match v {
        V::U8(x) => b.push(*x),
        V::I8(x) => b.push(*x as u8),
        V::U16(x) => b.extend(x.to_le_bytes()),
        V::I16(x) => b.extend(x.to_le_bytes()),
        V::U32(x) => b.extend(x.to_le_bytes()),
        V::I32(x) => b.extend(x.to_le_bytes()),
        V::F32(x) => b.extend(x.to_le_bytes()),
        V::Bool(x) => b.push(*x as u8),
        V::String(s) => write_str(b, s),
        V::Array(items) => {
            let elem = items.first().map(|i| i.type_id()).unwrap_or(4);
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
