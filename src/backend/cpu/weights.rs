//! Weights borrowed from the memory-mapped GGUF file (no copy): loading, row views (one
//! expert of a 3-D tensor), and dequantisation where an op needs f32 (embedding rows, norm
//! and bias vectors).

use super::{CpuBackend, CpuBuffer, CpuWeight};
use crate::backend::{Error, Result, Weight};
use crate::gguf::{GgmlType, GgufFile};
use crate::quant;
use std::sync::Arc;

/// A weight borrowed from the mmap of its file: the whole tensor, or a byte range of it (a
/// row view such as one expert of a 3-D expert tensor, see `weight_rows`).
pub struct MappedWeight {
    file: Arc<GgufFile>,
    index: usize,
    range: Option<std::ops::Range<usize>>,
}

impl MappedWeight {
    pub(super) fn bytes(&self) -> &[u8] {
        let all = self.file.tensor_data(&self.file.tensors[self.index]);
        match &self.range {
            Some(r) => &all[r.clone()],
            None => all,
        }
    }
}

impl CpuBackend {
    pub(super) fn load_weight_cpu(&self, file: &Arc<GgufFile>, name: &str) -> Result<CpuWeight> {
        let index = file
            .tensors
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| Error::Tensor { name: name.to_string(), message: format!("missing from {}", file.path.display()) })?;
        let info = &file.tensors[index];
        if !quant::supports(info.ggml_type) {
            return Err(Error::unsupported("cpu", format!("tensor \"{name}\" of {}: type {}", file.path.display(), info.ggml_type)));
        }
        let cols = *info.dims.first().unwrap_or(&1) as usize;
        let rows = info.dims.iter().skip(1).product::<u64>() as usize;
        Ok(Weight {
            name: name.to_string(),
            ggml_type: info.ggml_type,
            rows,
            cols,
            data: MappedWeight { file: file.clone(), index, range: None },
        })
    }

    pub(super) fn weight_rows_cpu(&self, w: &CpuWeight, first_row: usize, n_rows: usize, name: &str) -> Result<CpuWeight> {
        let cw = &w.data;
        if first_row + n_rows > w.rows {
            return Err(Error::invalid(
                "cpu",
                format!("rows {first_row}..{} are outside \"{}\" ({} rows)", first_row + n_rows, w.name, w.rows),
            ));
        }
        let row_bytes = row_bytes(w)?;
        let base = cw.range.as_ref().map_or(0, |r| r.start);
        let start = base + first_row * row_bytes;
        Ok(Weight {
            name: name.to_string(),
            ggml_type: w.ggml_type,
            rows: n_rows,
            cols: w.cols,
            data: MappedWeight { file: cw.file.clone(), index: cw.index, range: Some(start..start + n_rows * row_bytes) },
        })
    }

    pub(super) fn embed_cpu(&self, table: &CpuWeight, tokens: &[u32], out: &mut CpuBuffer) -> Result<()> {
        let w = &table.data;
        let dim = table.cols;
        let row_bytes = row_bytes(table)?;
        let bytes = w.bytes();
        let o = out.as_mut_slice();
        self.timed("embed", tokens.len(), || {
            for (t, &id) in tokens.iter().enumerate() {
                let id = id as usize;
                if id >= table.rows {
                    return Err(Error::invalid("cpu", format!("token id {id} is outside the vocabulary ({} tokens)", table.rows)));
                }
                quant::dequantize_row(table.ggml_type, &bytes[id * row_bytes..(id + 1) * row_bytes], &mut o[t * dim..(t + 1) * dim])
                    .map_err(|e| Error::Tensor { name: table.name.clone(), message: format!("{e:#}") })?;
            }
            Ok(())
        })
    }
}

/// Bytes of one row of `w` (an error where its columns are not whole blocks).
fn row_bytes(w: &CpuWeight) -> Result<usize> {
    w.ggml_type.row_bytes(w.cols).ok_or_else(|| Error::Tensor {
        name: w.name.clone(),
        message: format!("{} columns are not whole blocks of {}", w.cols, w.ggml_type),
    })
}

/// Norm and bias vectors are small F32 (sometimes F16) tensors: dequantise on use.
pub(super) fn weight_f32(w: &CpuWeight) -> std::borrow::Cow<'_, [f32]> {
    let cw = &w.data;
    let bytes = cw.bytes();
    let n = w.rows * w.cols;
    if w.ggml_type == GgmlType::F32 && (bytes.as_ptr() as usize).is_multiple_of(4) {
        // SAFETY: F32 tensor data is 4-byte aligned (checked) and exactly n*4 bytes long.
        return std::borrow::Cow::Borrowed(unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const f32, n) });
    }
    let mut v = vec![0f32; n];
    quant::dequantize_row(w.ggml_type, bytes, &mut v).expect("norm weight dequantisation");
    std::borrow::Cow::Owned(v)
}
