//! Tensor block formats, bit-compatible with ggml's block layouts (ggml-common.h):
//! dequantisation, quantisation (to write test models) and the dot products of the CPU
//! backend.
//!
//! Dot products follow ggml: an activation row is quantised once (Q8_0 for the 32-element
//! blocks, Q8_1 for Q4_1, Q8_K for the K-quants, f32 for float weights), and each block's integer products
//! are exact; only the per-block float scaling and the final sum depend on evaluation order.
//! `vec_dot` runs hand-written AVX-512 VNNI or AVX2 kernels chosen once at run time
//! (`simd_level`), with the scalar reference code (also used by the tests) as fallback.
//! AMX is never used.
//!
//! Supported weight types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, MXFP4.

mod float;
mod k_quants;
mod legacy;
mod mxfp4;
mod q4_1_eights;
pub mod q4_k_x8;
mod q8_0_prefill;
pub mod q8_0_x8;
pub(crate) mod simd;

pub use crate::gguf::GgmlType;
pub use float::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
/// MXFP4's block size in bytes and its E2M1 levels doubled (ggml's `kvalues_mxfp4`), for the
/// GPU backend's int8 planes.
pub(crate) use mxfp4::{KVALUES as MXFP4_KVALUES, MXFP4_BYTES};
pub use q4_1_eights::{has_q4_1_eights_tile, vec_dot_rows_q4_1_eights, Q8_1Eights};
pub use q8_0_prefill::{has_q8_0_offset_tile, vec_dot_rows_q8_0_offset, Q8_0Offset};
pub use simd::SimdLevel;

use anyhow::bail;

/// Formats of quantised activation rows.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActFormat {
    F32,
    Q8_0,
    /// Q8_0 plus s = d * sum(q) as f16 per block (for Q4_1 weights, as ggml).
    Q8_1,
    Q8_K,
}

impl ActFormat {
    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            ActFormat::F32 => 1,
            ActFormat::Q8_0 | ActFormat::Q8_1 => legacy::QK,
            ActFormat::Q8_K => k_quants::QK_K,
        }
    }
}

/// Whether dequantize/quantize/vec_dot support this weight type.
pub fn supports(t: GgmlType) -> bool {
    use GgmlType::*;
    matches!(t, F32 | F16 | BF16 | Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q4_K | Q5_K | Q6_K | MXFP4)
}

/// The activation format a weight type's dot product consumes (ggml's vec_dot_type, except
/// that F16/BF16 weights keep f32 activations for accuracy).
/// Unsupported types map to the format ggml would use for their block size.
pub fn act_format(weight: GgmlType) -> ActFormat {
    use GgmlType::*;
    match weight {
        Q8_0 | Q4_0 | Q5_0 | MXFP4 => ActFormat::Q8_0,
        Q4_1 | Q5_1 | Q8_1 => ActFormat::Q8_1,
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K => ActFormat::Q8_K,
        F32 | F16 | BF16 => ActFormat::F32,
    }
}

/// Bytes of one activation row of n elements in `fmt` (n a multiple of the block size).
pub fn act_row_bytes(fmt: ActFormat, n: usize) -> usize {
    match fmt {
        ActFormat::F32 => 4 * n,
        ActFormat::Q8_0 => n / legacy::QK * legacy::Q8_0_BYTES,
        ActFormat::Q8_1 => n / legacy::QK * legacy::Q8_1_BYTES,
        ActFormat::Q8_K => n / k_quants::QK_K * k_quants::Q8_K_BYTES,
    }
}

/// Quantises one activation row into `dst` as ggml's x86 CPU backend does: Q8_0/Q8_1 like its
/// AVX `quantize_row_q8_0/q8_1` (scale 127/amax, round half to even; Q8_1's sum as f16),
/// Q8_K like `quantize_row_q8_K_ref`; F32 is a little-endian copy.
///
/// Panics if `x.len()` is not a multiple of the format's block or `dst` has the wrong
/// length (both are fixed by the model shape, so this is a caller bug).
pub fn quantize_act_row(fmt: ActFormat, x: &[f32], dst: &mut [u8]) {
    assert!(
        x.len().is_multiple_of(fmt.block_size()) && dst.len() == act_row_bytes(fmt, x.len()),
        "quantize_act_row({fmt:?}): {} elements into {} bytes",
        x.len(),
        dst.len()
    );
    match fmt {
        ActFormat::F32 => float::quantize_f32(x, dst),
        ActFormat::Q8_0 => legacy::quantize_q8_0_act(x, dst),
        ActFormat::Q8_1 => legacy::quantize_q8_1_act(x, dst),
        ActFormat::Q8_K => k_quants::quantize_q8_k(x, dst),
    }
}

/// Dequantises one activation row (the inverse of `quantize_act_row`, for tests and tools).
pub fn dequantize_act_row(fmt: ActFormat, src: &[u8], dst: &mut [f32]) -> anyhow::Result<()> {
    if !dst.len().is_multiple_of(fmt.block_size()) || src.len() != act_row_bytes(fmt, dst.len()) {
        bail!("{fmt:?} activation row: {} elements need {} bytes, got {}", dst.len(), act_row_bytes(fmt, dst.len()), src.len());
    }
    match fmt {
        ActFormat::F32 => float::dequantize_f32(src, dst),
        ActFormat::Q8_0 => legacy::dequantize_q8_0(src, dst),
        ActFormat::Q8_1 => legacy::dequantize_q8_1(src, dst),
        ActFormat::Q8_K => k_quants::dequantize_q8_k(src, dst),
    }
    Ok(())
}

fn check_row(t: GgmlType, n: usize, bytes: usize) -> anyhow::Result<()> {
    if !supports(t) {
        bail!("unsupported tensor type {t}");
    }
    match t.row_bytes(n) {
        Some(b) if b == bytes => Ok(()),
        Some(b) => bail!("{t} row of {n} elements needs {b} bytes, got {bytes}"),
        None => bail!("{t} row of {n} elements: not a multiple of the block size {}", t.block_size()),
    }
}

fn check_dot_args(weight: GgmlType, w_row: &[u8], act_row: &[u8], n: usize) {
    assert!(supports(weight), "vec_dot: unsupported tensor type {weight} (check quant::supports first)");
    assert!(
        weight.row_bytes(n) == Some(w_row.len()) && act_row.len() == act_row_bytes(act_format(weight), n),
        "vec_dot({weight}, n={n}): weight row {} bytes, activation row {} bytes",
        w_row.len(),
        act_row.len()
    );
}

/// dot(weight row, activation row) over n elements: `w_row` is `weight.row_bytes(n)` bytes,
/// `act_row` is `act_row_bytes(act_format(weight), n)` bytes. Either may be unaligned.
///
/// Panics on an unsupported type or wrong row lengths (caller bugs: check `supports` at
/// model load).
#[inline]
pub fn vec_dot(weight: GgmlType, w_row: &[u8], act_row: &[u8], n: usize) -> f32 {
    check_dot_args(weight, w_row, act_row, n);
    simd::dot_at(simd::level(), weight, w_row, act_row, n)
}

/// `vec_dot` with an explicit kernel level (for tests and benchmarks); None when this CPU
/// lacks the level.
pub fn vec_dot_at(level: SimdLevel, weight: GgmlType, w_row: &[u8], act_row: &[u8], n: usize) -> Option<f32> {
    if !level.available() {
        return None;
    }
    check_dot_args(weight, w_row, act_row, n);
    Some(simd::dot_at(level, weight, w_row, act_row, n))
}

/// `vec_dot` of R weight rows against T activation rows at once, the tile kernels behind
/// `vec_dot_rows` (4 x 1) and `vec_dot_q4_1_x4` (1 x 4): out[r][t] is bit for bit
/// `vec_dot(weight, w_rows[r], act_rows[t], n)`. At an explicit level, for tests; None when
/// this CPU lacks the level or the level has no tile kernel for the type.
pub fn vec_dot_tile_at<const R: usize, const T: usize>(
    level: SimdLevel,
    weight: GgmlType,
    w_rows: [&[u8]; R],
    act_rows: [&[u8]; T],
    n: usize,
) -> Option<[[f32; T]; R]> {
    if !level.available() || !simd::has_tile(level, weight) {
        return None;
    }
    for w in w_rows {
        for a in act_rows {
            check_dot_args(weight, w, a, n);
        }
    }
    Some(simd::dot_tile_at(level, weight, w_rows, act_rows, n))
}

/// The f16 scales of a matrix of Q8_1 activation rows as f32, block-major (`d[block * rows +
/// row]`, `s` likewise), for `vec_dot_q4_1_x4`: four rows' scales of a block in one load.
pub struct Q8_1Scales {
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    pub rows: usize,
}

impl Q8_1Scales {
    /// From `rows` Q8_1 rows of n elements each, back to back in `acts`.
    pub fn new(acts: &[u8], rows: usize, n: usize) -> Q8_1Scales {
        let (nb, row_bytes) = (n / legacy::QK, act_row_bytes(ActFormat::Q8_1, n));
        assert_eq!(acts.len(), rows * row_bytes, "Q8_1Scales: {rows} rows of {n} elements");
        let (mut d, mut s) = (vec![0f32; nb * rows], vec![0f32; nb * rows]);
        for r in 0..rows {
            for b in 0..nb {
                let blk = &acts[r * row_bytes + b * legacy::Q8_1_BYTES..];
                d[b * rows + r] = float::f16_at(blk, 0);
                s[b * rows + r] = float::f16_at(blk, 2);
            }
        }
        Q8_1Scales { d, s, rows }
    }
}

/// The 1 x 4 tile (`vec_dot_tile_at`) for Q4_1 weights against activation rows `first..first
/// + 4` of a Q8_1 matrix whose scales are `scales` (the prefill GEMM's inner step), bit for
/// bit; call only where `has_dot_tile(Q4_1)`.
pub fn vec_dot_q4_1_x4(w_row: &[u8], act_rows: [&[u8]; 4], scales: &Q8_1Scales, first: usize, n: usize) -> [f32; 4] {
    assert!(has_dot_tile(GgmlType::Q4_1), "no Q4_1 tile kernel on this CPU");
    for a in act_rows {
        check_dot_args(GgmlType::Q4_1, w_row, a, n);
    }
    let nb = n / legacy::QK;
    assert!(first + 4 <= scales.rows && scales.d.len() == nb * scales.rows && scales.s.len() == nb * scales.rows);
    simd::dot_q4_1_x4_scaled(w_row, act_rows, &scales.d[first..], &scales.s[first..], scales.rows, nb)
}

/// `vec_dot_q4_1_x4` for the `out.len()` consecutive Q4_1 weight rows of `w_rows` against
/// activation rows `first..first + O` (O = 4G = 4 or 8) of a Q8_1 matrix with scales
/// `scales`: out[r][t] is bit for bit `vec_dot(Q4_1, row r, act_rows[t], n)`. Batched decode
/// runs this (tiles of several weight rows share each activation block's loads); call only
/// where `has_dot_tile(Q4_1)`.
pub fn vec_dot_q4_1_rows<const G: usize, const O: usize>(
    w_rows: &[u8],
    act_rows: [&[u8]; O],
    scales: &Q8_1Scales,
    first: usize,
    n: usize,
    out: &mut [[f32; O]],
) {
    assert!(has_dot_tile(GgmlType::Q4_1), "no Q4_1 tile kernel on this CPU");
    assert_eq!(O, 4 * G, "vec_dot_q4_1_rows: O must be 4G");
    let row_bytes = GgmlType::Q4_1.row_bytes(n).expect("n is a multiple of 32");
    assert!(w_rows.len() >= out.len() * row_bytes, "vec_dot_q4_1_rows: {} weight rows of {n}", out.len());
    for a in act_rows {
        check_dot_args(GgmlType::Q4_1, &w_rows[..row_bytes], a, n);
    }
    let nb = n / legacy::QK;
    assert!(first + O <= scales.rows && scales.d.len() == nb * scales.rows && scales.s.len() == nb * scales.rows);
    simd::dot_q4_1_rows_scaled::<G, O>(w_rows, row_bytes, act_rows, &scales.d[first..], &scales.s[first..], scales.rows, nb, out);
}

/// out[r] = `vec_dot(weight, row r of w_rows, act_row, n)` for the `out.len()` consecutive
/// weight rows in `w_rows` (a matrix-vector product over a row range, as decode runs it), bit
/// for bit; one length check for the whole range. Prefetches `simd::PREFETCH_BYTES` (whole rows)
/// ahead, past the range's end too (the rest of the matrix, read next).
pub fn vec_dot_rows(weight: GgmlType, w_rows: &[u8], act_row: &[u8], n: usize, out: &mut [f32]) {
    let row_bytes = weight.row_bytes(n).unwrap_or(0);
    assert!(w_rows.len() == out.len() * row_bytes, "vec_dot_rows({weight}, n={n}): {} bytes for {} rows", w_rows.len(), out.len());
    if out.is_empty() {
        return;
    }
    check_dot_args(weight, &w_rows[..row_bytes], act_row, n);
    if has_dot_tile(weight) && weight == GgmlType::Q4_1 {
        return simd::dot_q4_1_rows(w_rows, row_bytes, act_row, n / legacy::QK, out);
    }
    let level = simd::level();
    let ahead = simd::prefetch_ahead(row_bytes);
    for (o, w) in out.iter_mut().zip(w_rows.chunks_exact(row_bytes)) {
        simd::prefetch(w.as_ptr().wrapping_add(ahead), row_bytes);
        *o = simd::dot_at(level, weight, w, act_row, n);
    }
}

/// out[r][t] = `vec_dot(weight, row r of w_rows, act_rows[t], n)` for the `out.len()`
/// consecutive weight rows in `w_rows` against T activation rows, bit for bit, through the
/// 1 x T (2 x T where `simd::pairs_weight_rows`) tile kernels (the prefill GEMM's and batched
/// decode's inner step: each weight block unpacked once per T dots); one length check for the whole range, weight rows prefetched
/// `PREFETCH_ROWS` ahead (not re-measured when `vec_dot_rows` moved to a distance in bytes).
/// Call only where `has_dot_tile(weight)`.
pub fn vec_dot_rows_tile<const T: usize>(weight: GgmlType, w_rows: &[u8], act_rows: [&[u8]; T], n: usize, out: &mut [[f32; T]]) {
    assert!(has_dot_tile(weight), "no {weight} tile kernel on this CPU");
    let row_bytes = weight.row_bytes(n).unwrap_or(0);
    assert!(w_rows.len() == out.len() * row_bytes, "vec_dot_rows_tile({weight}, n={n}): {} bytes for {} rows", w_rows.len(), out.len());
    if out.is_empty() {
        return;
    }
    for a in act_rows {
        check_dot_args(weight, &w_rows[..row_bytes], a, n);
    }
    let level = simd::level();
    let ahead = simd::PREFETCH_ROWS * row_bytes;
    let row = |r: usize| &w_rows[r * row_bytes..(r + 1) * row_bytes];
    let mut r = 0;
    // Two weight rows per tile where the level's tile shares the activation side (loads,
    // offsets, scales) between rows and has the registers for it.
    if simd::pairs_weight_rows(level, weight) {
        while r + 2 <= out.len() {
            let w = [row(r), row(r + 1)];
            simd::prefetch(w[0].as_ptr().wrapping_add(ahead), 2 * row_bytes);
            let [v0, v1] = simd::dot_tile_at::<2, T>(level, weight, w, act_rows, n);
            (out[r], out[r + 1]) = (v0, v1);
            r += 2;
        }
    }
    for (o, r) in out[r..].iter_mut().zip(r..) {
        let w = row(r);
        simd::prefetch(w.as_ptr().wrapping_add(ahead), row_bytes);
        let [v] = simd::dot_tile_at::<1, T>(level, weight, [w], act_rows, n);
        *o = v;
    }
}

/// How many activation rows the prefill GEMM passes to one `vec_dot_rows_tile` call for this
/// type on this CPU (8 or 4; `simd::prefill_tile_rows`).
pub fn prefill_tile_rows(weight: GgmlType) -> usize {
    simd::prefill_tile_rows(simd::level(), weight)
}

/// Whether this type has tile kernels on this CPU (`vec_dot_rows_tile`, `vec_dot_q4_1_x4`,
/// and for Q4_1 `vec_dot_rows`).
pub fn has_dot_tile(weight: GgmlType) -> bool {
    simd::has_tile(simd::level(), weight)
}

/// Dequantises a row of `dst.len()` elements.
pub fn dequantize_row(t: GgmlType, src: &[u8], dst: &mut [f32]) -> anyhow::Result<()> {
    check_row(t, dst.len(), src.len())?;
    match t {
        GgmlType::F32 => float::dequantize_f32(src, dst),
        GgmlType::F16 => float::dequantize_f16(src, dst),
        GgmlType::BF16 => float::dequantize_bf16(src, dst),
        GgmlType::Q8_0 => legacy::dequantize_q8_0(src, dst),
        GgmlType::Q4_0 => legacy::dequantize_q4_0(src, dst),
        GgmlType::Q4_1 => legacy::dequantize_q4_1(src, dst),
        GgmlType::Q5_0 => legacy::dequantize_q5_0(src, dst),
        GgmlType::Q5_1 => legacy::dequantize_q5_1(src, dst),
        GgmlType::Q4_K => k_quants::dequantize_q4_k(src, dst),
        GgmlType::Q5_K => k_quants::dequantize_q5_k(src, dst),
        GgmlType::Q6_K => k_quants::dequantize_q6_k(src, dst),
        GgmlType::MXFP4 => mxfp4::dequantize_mxfp4(src, dst),
        _ => unreachable!("rejected by check_row"),
    }
    Ok(())
}

/// Quantises a row of f32 into weight type t (deterministic; used to write test models).
/// Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K/MXFP4 use ggml's reference quantisers; F16/BF16 round to
/// nearest even.
pub fn quantize_row(t: GgmlType, src: &[f32], dst: &mut [u8]) -> anyhow::Result<()> {
    check_row(t, src.len(), dst.len())?;
    match t {
        GgmlType::F32 => float::quantize_f32(src, dst),
        GgmlType::F16 => float::quantize_f16(src, dst),
        GgmlType::BF16 => float::quantize_bf16(src, dst),
        GgmlType::Q8_0 => legacy::quantize_q8_0(src, dst),
        GgmlType::Q4_0 => legacy::quantize_q4_0(src, dst),
        GgmlType::Q4_1 => legacy::quantize_q4_1(src, dst),
        GgmlType::Q5_0 => legacy::quantize_q5_0(src, dst),
        GgmlType::Q5_1 => legacy::quantize_q5_1(src, dst),
        GgmlType::Q4_K => k_quants::quantize_q4_k(src, dst),
        GgmlType::Q5_K => k_quants::quantize_q5_k(src, dst),
        GgmlType::Q6_K => k_quants::quantize_q6_k(src, dst),
        GgmlType::MXFP4 => mxfp4::quantize_mxfp4(src, dst),
        _ => unreachable!("rejected by check_row"),
    }
    Ok(())
}

/// The kernel level in use (as `simd_level`): every CPU kernel (quant::simd) dispatches on
/// it, so CIVETTA_SIMD caps them all.
pub fn kernel_level() -> SimdLevel {
    simd::level()
}

/// Which kernel level vec_dot uses on this machine: "avx512vnni", "avx2" or "scalar"
/// (env CIVETTA_SIMD=avx2|scalar caps it, for comparisons).
pub fn simd_level() -> &'static str {
    simd::level().name()
}

#[cfg(test)]
mod k_quant_order_tests;
#[cfg(test)]
mod q4_k_x8_tests;
#[cfg(test)]
mod q8_0_x8_tests;
#[cfg(test)]
mod tests;
