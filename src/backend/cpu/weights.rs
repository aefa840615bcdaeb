//! Weights borrowed from the memory-mapped GGUF file: loading, row views (one expert of a 3-D
//! tensor), and dequantisation where an op needs f32 (embedding rows, norm and bias vectors).
//! Q4_K and Q8_0 matrices are also repacked at load, eight rows per group (`quant::q4_k_x8`,
//! `quant::q8_0_x8`), where the CPU runs that kernel and the backend was not told otherwise
//! (`engine.cpu_repack`); the file's copy stays for embedding rows. An untied token embedding is not repacked: only
//! embedding rows are read of it (`Backend::load_embedding`).

use super::{CpuBackend, CpuBuffer, CpuWeight};
use crate::backend::{Error, Result, Weight};
use crate::gguf::{GgmlType, GgufFile};
use crate::quant;
use crate::quant::{q4_k_x8, q8_0_x8};
use std::sync::Arc;

/// A weight borrowed from the mmap of its file: the whole tensor, or a byte range of it (a
/// row view such as one expert of a 3-D expert tensor, see `weight_rows`); for Q4_K and Q8_0
/// also its repacked copy where the backend made one.
pub struct MappedWeight {
    file: Arc<GgufFile>,
    index: usize,
    range: Option<std::ops::Range<usize>>,
    x8: Option<RepackedRows>,
}

/// The same rows in a repacked layout: a byte range (whole groups) of the tensor's copy.
#[derive(Clone)]
struct RepackedRows {
    layout: X8Layout,
    all: Arc<memmap2::Mmap>,
    range: std::ops::Range<usize>,
}

/// The repacked layouts of eight rows per group, one per weight type that has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum X8Layout {
    /// `quant::q4_k_x8`.
    Q4K,
    /// `quant::q8_0_x8`.
    Q8_0,
}

impl X8Layout {
    /// The layout a matrix of type `t` is repacked into on this CPU, if any.
    fn for_type(t: GgmlType) -> Option<X8Layout> {
        match t {
            GgmlType::Q4_K if q4_k_x8::available() => Some(X8Layout::Q4K),
            GgmlType::Q8_0 if q8_0_x8::available() => Some(X8Layout::Q8_0),
            _ => None,
        }
    }

    /// Whether a matrix of `cols` columns can be repacked (its rows whole groups is checked apart).
    fn takes_cols(self, cols: usize) -> bool {
        match self {
            X8Layout::Q4K => cols.is_multiple_of(256),
            X8Layout::Q8_0 => cols.is_multiple_of(32),
        }
    }

    /// Bytes of `rows` (whole groups) of `cols` columns in this layout.
    pub(super) fn bytes(self, rows: usize, cols: usize) -> usize {
        match self {
            X8Layout::Q4K => q4_k_x8::repacked_bytes(rows, cols),
            X8Layout::Q8_0 => q8_0_x8::repacked_bytes(rows, cols),
        }
    }

    fn repack_group(self, src: &[u8], cols: usize, dst: &mut [u8]) {
        match self {
            X8Layout::Q4K => q4_k_x8::repack_group(src, cols, dst),
            X8Layout::Q8_0 => q8_0_x8::repack_group(src, cols, dst),
        }
    }

    /// The matmul's name in profiles and metrics: runs with and without `engine.cpu_repack`
    /// differ in it, not only in speed.
    pub(super) fn kernel_name(self) -> &'static str {
        match self {
            X8Layout::Q4K => "matmul_q4_k_x8",
            X8Layout::Q8_0 => "matmul_q8_0_x8",
        }
    }
}

/// Rows of a weight in a repacked layout (`MappedWeight::x8`).
#[derive(Clone, Copy)]
pub(super) struct X8Rows<'a> {
    pub(super) layout: X8Layout,
    pub(super) bytes: &'a [u8],
}

impl MappedWeight {
    /// The rows in a repacked layout (`quant::q4_k_x8`, `quant::q8_0_x8`), where the backend
    /// repacked them.
    pub(super) fn x8(&self) -> Option<X8Rows<'_>> {
        self.x8.as_ref().map(|x| X8Rows { layout: x.layout, bytes: &x.all[x.range.clone()] })
    }

    pub(super) fn bytes(&self) -> &[u8] {
        let all = self.file.tensor_data(&self.file.tensors[self.index]);
        match &self.range {
            Some(r) => &all[r.clone()],
            None => all,
        }
    }
}

impl CpuBackend {
    /// `repack`: whether a matmul reads this weight, so that a repacked copy pays (false for
    /// an untied token embedding, `Backend::load_embedding`: only `embed_cpu` reads it, from
    /// the file's rows).
    pub(super) fn load_weight_cpu(&self, file: &Arc<GgufFile>, name: &str, repack: bool) -> Result<CpuWeight> {
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
        let layout = X8Layout::for_type(info.ggml_type)
            .filter(|l| self.repack && repack && rows.is_multiple_of(q4_k_x8::GROUP_ROWS) && l.takes_cols(cols));
        let x8 = if let Some(layout) = layout {
            let copy = self.repack_x8(layout, file.tensor_data(info), rows, cols, name)?;
            // The file's pages of this tensor are read again only for embedding rows.
            file.release_tensor_pages(info);
            Some(copy)
        } else {
            None
        };
        Ok(Weight {
            name: name.to_string(),
            ggml_type: info.ggml_type,
            rows,
            cols,
            data: MappedWeight { file: file.clone(), index, range: None, x8 },
        })
    }

    /// The repacked copy of a Q4_K or Q8_0 tensor, in anonymous memory that asks for transparent
    /// huge pages (decode streams it once per token: fewer TLB misses, as `weights_memory =
    /// "huge_pages"` measured), filled by the pool's threads.
    fn repack_x8(&self, layout: X8Layout, src: &[u8], rows: usize, cols: usize, name: &str) -> Result<RepackedRows> {
        let len = layout.bytes(rows, cols);
        let mut all = memmap2::MmapMut::map_anon(len)
            .map_err(|e| Error::Tensor { name: name.to_string(), message: format!("{len} bytes for the repacked copy: {e}") })?;
        #[cfg(target_os = "linux")]
        let _ = all.advise(memmap2::Advice::HugePage); // a hint: without THP, plain pages
        let groups = rows / q4_k_x8::GROUP_ROWS;
        let (src_group, dst_group) = (src.len() / groups, len / groups);
        self.pool
            .for_each_chunk_mut(&mut all[..], dst_group, |g, d| layout.repack_group(&src[g * src_group..(g + 1) * src_group], cols, d));
        let all = all.make_read_only().map_err(|e| Error::Tensor { name: name.to_string(), message: format!("repacked copy: {e}") })?;
        Ok(RepackedRows { layout, all: Arc::new(all), range: 0..len })
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
        // Whole groups of the repacked copy (one expert of a 3-D tensor is).
        let x8 =
            cw.x8.as_ref().filter(|_| first_row.is_multiple_of(q4_k_x8::GROUP_ROWS) && n_rows.is_multiple_of(q4_k_x8::GROUP_ROWS)).map(
                |x| {
                    let group = x.layout.bytes(q4_k_x8::GROUP_ROWS, w.cols);
                    let at = x.range.start + first_row / q4_k_x8::GROUP_ROWS * group;
                    RepackedRows { layout: x.layout, all: x.all.clone(), range: at..at + n_rows / q4_k_x8::GROUP_ROWS * group }
                },
            );
        Ok(Weight {
            name: name.to_string(),
            ggml_type: w.ggml_type,
            rows: n_rows,
            cols: w.cols,
            data: MappedWeight { file: cw.file.clone(), index: cw.index, range: Some(start..start + n_rows * row_bytes), x8 },
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

#[cfg(test)]
mod tests {
    use crate::backend::cpu::CpuBackend;
    use crate::backend::Backend;
    use crate::gguf::{GgmlType, GgufFile, GgufWriter};
    use crate::quant::{self, q4_k_x8, q8_0_x8};
    use rand::{Rng, SeedableRng};
    use std::sync::Arc;

    const COLS: usize = 256;
    const VOCAB: usize = 16;

    /// A file whose token embedding of type t (whole groups of rows, so repackable) is either
    /// tied (no output.weight) or untied (an output.weight of the same shape).
    fn file(t: GgmlType, embd: &[u8], untied: bool) -> Arc<GgufFile> {
        let mut w = GgufWriter::new();
        w.add_tensor("token_embd.weight", &[COLS as u64, VOCAB as u64], t, embd.to_vec()).unwrap();
        if untied {
            w.add_tensor("output.weight", &[COLS as u64, VOCAB as u64], t, embd.to_vec()).unwrap();
        }
        Arc::new(GgufFile::parse_bytes(w.to_bytes().unwrap(), "embd.gguf").unwrap())
    }

    #[test]
    fn an_untied_token_embedding_is_not_repacked_and_embeds_the_same_rows() {
        untied_embedding_case(GgmlType::Q4_K, q4_k_x8::available());
        untied_embedding_case(GgmlType::Q8_0, q8_0_x8::available());
    }

    fn untied_embedding_case(t: GgmlType, available: bool) {
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let row_bytes = t.row_bytes(COLS).unwrap();
        let mut embd = vec![0u8; VOCAB * row_bytes];
        for row in embd.chunks_mut(row_bytes) {
            let x: Vec<f32> = (0..COLS).map(|_| r.gen::<f32>() * 2.0 - 1.0).collect();
            quant::quantize_row(t, &x, row).unwrap();
        }
        let be = CpuBackend::with_options(1, true).unwrap();
        let (tied, untied) = (file(t, &embd, false), file(t, &embd, true));
        let tied_embd = be.load_weight(&tied, "token_embd.weight").unwrap();
        let untied_embd = be.load_embedding(&untied, "token_embd.weight").unwrap();
        // Tied, the embedding is the logits matmul's weight: repacked where the CPU runs the
        // kernel, as the untied output matrix of the same bytes is.
        assert_eq!(tied_embd.data.x8().is_some(), available, "{t}");
        assert_eq!(be.load_weight(&untied, "output.weight").unwrap().data.x8().is_some(), available, "{t}");
        // Untied, only embedding rows are read of it: no repacked copy.
        assert!(untied_embd.data.x8().is_none(), "{t}");
        // Both embed the file's rows, bit for bit.
        let tokens: Vec<u32> = vec![0, 5, 15, 7, 5];
        let (mut a, mut b) = (vec![0f32; tokens.len() * COLS], vec![0f32; tokens.len() * COLS]);
        be.embed(&tied_embd, &tokens, &mut a).unwrap();
        be.embed(&untied_embd, &tokens, &mut b).unwrap();
        for (i, &id) in tokens.iter().enumerate() {
            let mut want = vec![0f32; COLS];
            let id = id as usize;
            quant::dequantize_row(t, &embd[id * row_bytes..(id + 1) * row_bytes], &mut want).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a[i * COLS..(i + 1) * COLS]), bits(&want), "{t} tied, token {i}");
            assert_eq!(bits(&b[i * COLS..(i + 1) * COLS]), bits(&want), "{t} untied, token {i}");
        }
    }
}
