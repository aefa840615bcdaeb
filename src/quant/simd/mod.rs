//! The CPU kernels and the run-time choice of their instruction set: AVX-512 (F, BW, VL, VNNI),
//! AVX2 + FMA + F16C, or the scalar reference code. The level is detected once and cached
//! (`level`), and `SimdLevel` is the only place that asks the CPU for its features: the dot
//! products here and the other kernels (`attention`, `silu`, `geglu`) all dispatch on it.

use super::{float, k_quants, legacy, mxfp4, GgmlType};
use once_cell::sync::Lazy;

#[cfg(target_arch = "x86_64")]
mod avx2;
/// The horizontal f32 sum of one AVX register, for kernels outside this module (MXFP4).
#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::hsum256;
#[cfg(target_arch = "x86_64")]
mod avx512;

// The CPU kernels other than the dot products, next to them so that every CPU kernel picks
// its instruction set from `level()`.
pub(crate) mod attention;
#[cfg(target_arch = "x86_64")]
pub(crate) mod expf;
pub(crate) mod geglu;
pub(crate) mod silu;

/// An instruction-set level of the dot-product kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimdLevel {
    Scalar,
    Avx2,
    Avx512Vnni,
}

impl SimdLevel {
    pub const ALL: [SimdLevel; 3] = [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512Vnni];

    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512Vnni => "avx512vnni",
        }
    }

    /// Whether this CPU can run the level's kernels.
    pub fn available(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c"),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512Vnni => {
                SimdLevel::Avx2.available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// The best available level, capped by env CIVETTA_SIMD=scalar|avx2 (for comparisons).
static LEVEL: Lazy<SimdLevel> = Lazy::new(|| {
    let cap = match std::env::var("CIVETTA_SIMD").as_deref() {
        Ok("scalar") => SimdLevel::Scalar,
        Ok("avx2") => SimdLevel::Avx2,
        _ => SimdLevel::Avx512Vnni,
    };
    SimdLevel::ALL.into_iter().filter(|l| *l <= cap && l.available()).max().unwrap_or(SimdLevel::Scalar)
});

pub fn level() -> SimdLevel {
    *LEVEL
}

/// The AVX-512 level plus VBMI's byte permute (Zen 4/5, Ice Lake and later; not Skylake-SP or
/// Cascade Lake): what the repacked Q4_K kernel (`q4_k_x8`) needs.
static Q4_K_X8: Lazy<bool> = Lazy::new(|| {
    #[cfg(target_arch = "x86_64")]
    {
        level() == SimdLevel::Avx512Vnni && is_x86_feature_detected!("avx512vbmi")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
});

/// Whether this CPU runs the repacked Q4_K kernel (`quant::q4_k_x8`).
pub fn has_q4_k_x8() -> bool {
    *Q4_K_X8
}

/// The repacked Q4_K kernel (`quant::q4_k_x8::dot_group`).
///
/// # Safety
/// AVX-512 VNNI and VBMI must be available (`q4_k_x8::available`); lengths checked by the caller.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn dot_q4_k_x8<const T: usize>(
    group: &[u8],
    act_rows: [&[u8]; T],
    n: usize,
    out: &mut [[f32; T]; super::q4_k_x8::GROUP_ROWS],
) {
    avx512::q4_k_x8::dot_group(group, act_rows, n, out)
}

/// Whether this CPU runs the repacked Q8_0 kernel (`quant::q8_0_x8`): the AVX-512 VNNI level.
pub fn has_q8_0_x8() -> bool {
    level() == SimdLevel::Avx512Vnni
}

/// The repacked Q8_0 kernel (`quant::q8_0_x8::dot_group`).
///
/// # Safety
/// AVX-512 VNNI must be available (`q8_0_x8::available`); lengths checked by the caller.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn dot_q8_0_x8<const T: usize>(
    group: &[u8],
    act_rows: [&[u8]; T],
    n: usize,
    out: &mut [[f32; T]; super::q8_0_x8::GROUP_ROWS],
) {
    avx512::q8_0_x8::dot_group(group, act_rows, n, out)
}

/// The scalar reference dot products.
pub(crate) fn dot_scalar(t: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    match t {
        GgmlType::F32 => float::dot_f32(w, a, n),
        GgmlType::F16 => float::dot_f16(w, a, n),
        GgmlType::BF16 => float::dot_bf16(w, a, n),
        GgmlType::Q8_0 => legacy::dot_q8_0(w, a, n),
        GgmlType::Q4_0 => legacy::dot_q4_0(w, a, n),
        GgmlType::Q4_1 => legacy::dot_q4_1(w, a, n),
        GgmlType::Q5_0 => legacy::dot_q5_0(w, a, n),
        GgmlType::Q5_1 => legacy::dot_q5_1(w, a, n),
        GgmlType::Q4_K => k_quants::dot_q4_k(w, a, n),
        GgmlType::Q5_K => k_quants::dot_q5_k(w, a, n),
        GgmlType::Q6_K => k_quants::dot_q6_k(w, a, n),
        GgmlType::MXFP4 => mxfp4::dot_mxfp4(w, a, n),
        other => panic!("vec_dot: unsupported tensor type {other} (check quant::supports first)"),
    }
}

/// Dot product at a given level. The caller guarantees the level is available and the slice
/// lengths are right (checked in `quant::vec_dot` / `quant::vec_dot_at`).
#[inline]
pub(crate) fn dot_at(level: SimdLevel, t: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `level` is available on this CPU (detected at run time), and the kernels
        // read only within the row lengths the caller checked.
        unsafe {
            match level {
                // MXFP4's kernels live with its format (quant/mxfp4.rs).
                SimdLevel::Avx512Vnni if t == GgmlType::MXFP4 => return mxfp4::x86::dot_avx512(w, a, n),
                SimdLevel::Avx2 if t == GgmlType::MXFP4 => return mxfp4::x86::dot_avx2(w, a, n),
                SimdLevel::Avx512Vnni => return avx512::dot(t, w, a, n),
                SimdLevel::Avx2 => return avx2::dot(t, w, a, n),
                SimdLevel::Scalar => {}
            }
        }
    }
    let _ = level;
    dot_scalar(t, w, a, n)
}

/// Whether `dot_tile_at` has a fused kernel for this type at this level: from AVX2 up for
/// Q4_1, Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K. Each level's tile
/// reproduces that level's single dot (the AVX-512 tiles of Q5_0, Q4_1 and Q5_1 reproduce
/// the 256-bit single dots that level runs for them, two dots per 512-bit register).
pub(crate) fn has_tile(level: SimdLevel, t: GgmlType) -> bool {
    use GgmlType::*;
    cfg!(target_arch = "x86_64") && level >= SimdLevel::Avx2 && matches!(t, Q4_1 | Q8_0 | Q4_0 | Q5_0 | Q5_1 | Q4_K | Q5_K | Q6_K)
}

/// Whether `vec_dot_rows_tile` runs this type's tile two weight rows at a time: the AVX-512
/// tiles of Q5_0, Q4_1 and Q5_1, whose per-block activation work (two loads, Q5_0's offset
/// sums, the scale conversion) is then shared by both rows (2 x 4 fits the 32 registers).
pub(crate) fn pairs_weight_rows(level: SimdLevel, t: GgmlType) -> bool {
    level == SimdLevel::Avx512Vnni && matches!(t, GgmlType::Q5_0 | GgmlType::Q4_1 | GgmlType::Q5_1)
}

/// How many activation rows the prefill GEMM hands one tile call (`vec_dot_rows_tile`): 8 for
/// the AVX-512 Q4_K/Q5_K tiles, whose per-row work (scale/min unpacking, nibble levels, scale
/// permutes) is then shared by 8 dots (single-thread tile bench, 2048 x 2048 x 64 on the 2-vCPU
/// EPYC: Q4_K 1x8 1.12x, Q5_K 1.08x the 1x4); 4 elsewhere (Q6_K's 1x8 measured slower, 0.95x).
pub(crate) fn prefill_tile_rows(level: SimdLevel, t: GgmlType) -> usize {
    if level == SimdLevel::Avx512Vnni && matches!(t, GgmlType::Q4_K | GgmlType::Q5_K) {
        8
    } else {
        4
    }
}

/// R weight rows against T activation rows, out[r][t] bit-identical to `dot_at` of row r and
/// activation t. The caller checked `has_tile`, `available` and every row length.
#[inline]
pub(crate) fn dot_tile_at<const R: usize, const T: usize>(
    level: SimdLevel,
    t: GgmlType,
    w: [&[u8]; R],
    a: [&[u8]; T],
    n: usize,
) -> [[f32; T]; R] {
    assert!(has_tile(level, t), "no {t} tile kernel at {level:?}");
    #[cfg(target_arch = "x86_64")]
    {
        let (w, a) = (w.map(|r| r.as_ptr()), a.map(|r| r.as_ptr()));
        let (nb, nsb) = (n / legacy::QK, n / k_quants::QK_K);
        // SAFETY: the level is available on this CPU (AVX2/FMA/F16C are part of every level
        // from Avx2 up) and the rows hold n elements (both checked by the caller).
        unsafe {
            match (level, t) {
                (SimdLevel::Avx512Vnni, GgmlType::Q4_1) => avx512::tiles::dot_q4_1_tile::<R, T>(w, a, nb),
                (SimdLevel::Avx512Vnni, GgmlType::Q5_0) => avx512::tiles::dot_q5_0_tile::<R, T>(w, a, nb),
                (SimdLevel::Avx512Vnni, GgmlType::Q5_1) => avx512::tiles::dot_q5_1_tile::<R, T>(w, a, nb),
                (_, GgmlType::Q4_1) => avx2::dot_q4_1_tile::<R, T>(w, a, nb, 0),
                (_, GgmlType::Q5_0) => avx2::tiles::dot_q5_0_tile::<R, T>(w, a, nb),
                (_, GgmlType::Q5_1) => avx2::tiles::dot_q5_1_tile::<R, T>(w, a, nb),
                (SimdLevel::Avx512Vnni, GgmlType::Q8_0) => avx512::tiles::dot_q8_0_tile::<R, T>(w, a, nb),
                (SimdLevel::Avx512Vnni, GgmlType::Q4_0) => avx512::tiles::dot_q4_0_tile::<R, T>(w, a, nb),
                (SimdLevel::Avx512Vnni, GgmlType::Q4_K) => avx512::tiles::dot_q4_k_tile::<R, T>(w, a, nsb),
                (SimdLevel::Avx512Vnni, GgmlType::Q5_K) => avx512::tiles::dot_q5_k_tile::<R, T>(w, a, nsb),
                (SimdLevel::Avx512Vnni, GgmlType::Q6_K) => avx512::tiles::dot_q6_k_tile::<R, T>(w, a, nsb),
                (_, GgmlType::Q8_0) => avx2::tiles::dot_q8_0_tile::<R, T>(w, a, nb),
                (_, GgmlType::Q4_0) => avx2::tiles::dot_q4_0_tile::<R, T>(w, a, nb),
                (_, GgmlType::Q4_K) => avx2::tiles::dot_q4_k_tile::<R, T>(w, a, nsb),
                (_, GgmlType::Q5_K) => avx2::tiles::dot_q5_k_tile::<R, T>(w, a, nsb),
                (_, GgmlType::Q6_K) => avx2::tiles::dot_q6_k_tile::<R, T>(w, a, nsb),
                _ => unreachable!("has_tile lists the tiled types"),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("has_tile is false off x86-64")
}

/// `dot_q4_1_x4_scaled` of the level in use (AVX-512 or AVX2); the caller checked the level
/// (Avx2 or above) and the lengths.
#[inline]
pub(crate) fn dot_q4_1_x4_scaled(w: &[u8], a: [&[u8]; 4], d: &[f32], s: &[f32], stride: usize, nb: usize) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    {
        let (w, a, d, s) = (w.as_ptr(), a.map(|r| r.as_ptr()), d.as_ptr(), s.as_ptr());
        // SAFETY: see the caller (quant::vec_dot_q4_1_x4); the level is available.
        unsafe {
            if level() == SimdLevel::Avx512Vnni {
                avx512::tiles::dot_q4_1_x4_scaled(w, a, d, s, stride, nb)
            } else {
                avx2::dot_q4_1_x4_scaled(w, a, d, s, stride, nb)
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("has_tile is false off x86-64")
}

/// `avx512::tiles::dot_q8_0_offset_tile`; the caller (quant::vec_dot_rows_q8_0_offset) checked
/// the level (Avx512Vnni) and the lengths.
#[inline]
pub(crate) fn dot_q8_0_offset_tile<const T: usize>(
    w: &[u8],
    a_u8: [&[u8]; T],
    a_d: [&[f32]; T],
    a_rows: [&[u8]; T],
    nb: usize,
) -> [f32; T] {
    #[cfg(target_arch = "x86_64")]
    {
        assert!(a_u8.iter().all(|r| r.len() >= 32 * nb) && a_d.iter().all(|r| r.len() >= nb) && w.len() >= nb * legacy::Q8_0_BYTES);
        // SAFETY: the level is available (checked by the caller) and the lengths just above.
        unsafe {
            avx512::tiles::dot_q8_0_offset_tile::<T>(
                w.as_ptr(),
                a_u8.map(|r| r.as_ptr()),
                a_d.map(|r| r.as_ptr()),
                a_rows.map(|r| r.as_ptr()),
                nb,
            )
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("has_q8_0_offset_tile is false off x86-64")
}

/// `dot_q4_1_x4_scaled` for every weight row of `w_block` (rows of `row_bytes`, one per
/// `out` entry) against 4G activation rows (O = 4G): out[r][4g + j] is bit for bit
/// `dot_q4_1_x4_scaled(row r, a[4g..4g + 4], d[4g..], s[4g..], stride, nb)[j]`. AVX-512 runs
/// tiles of several weight rows (`avx512::tiles_multi`) that share the activation loads;
/// AVX2 the one-row kernel per row and group. The caller checked the level and the lengths.
#[allow(clippy::too_many_arguments)] // the x4 kernel's arguments plus the row size and output
pub(crate) fn dot_q4_1_rows_scaled<const G: usize, const O: usize>(
    w_block: &[u8],
    row_bytes: usize,
    a: [&[u8]; O],
    d: &[f32],
    s: &[f32],
    stride: usize,
    nb: usize,
    out: &mut [[f32; O]],
) {
    assert!(O == 4 * G && w_block.len() >= out.len() * row_bytes);
    #[cfg(target_arch = "x86_64")]
    {
        let row = |r: usize| w_block[r * row_bytes..].as_ptr();
        // Decode streams the weights from memory: ask for them PREFETCH_BYTES ahead, as the
        // matvec does (a hint past the block's end is harmless).
        let ahead = prefetch_ahead(row_bytes);
        let fetch = |r: usize, rows: usize| prefetch(row(r).wrapping_add(ahead), rows * row_bytes);
        let (a, d, s) = (a.map(|r| r.as_ptr()), d.as_ptr(), s.as_ptr());
        // SAFETY: see the caller (quant::vec_dot_q4_1_rows); the level is available.
        unsafe {
            if level() == SimdLevel::Avx512Vnni {
                // Tiles of 8 f32 accumulators (4 weight rows at G = 1, 2 at G = 2: with 16 the
                // compiler spills them), then one row at a time.
                let mut r = 0;
                if G == 1 {
                    while r + 4 <= out.len() {
                        fetch(r, 4);
                        let t = avx512::tiles_multi::dot_q4_1_rows_scaled::<4, G, O>(
                            [row(r), row(r + 1), row(r + 2), row(r + 3)],
                            a,
                            d,
                            s,
                            stride,
                            nb,
                        );
                        out[r..r + 4].copy_from_slice(&t);
                        r += 4;
                    }
                }
                while r + 2 <= out.len() {
                    fetch(r, 2);
                    let t = avx512::tiles_multi::dot_q4_1_rows_scaled::<2, G, O>([row(r), row(r + 1)], a, d, s, stride, nb);
                    out[r..r + 2].copy_from_slice(&t);
                    r += 2;
                }
                let first_left = r;
                for (r, o) in out.iter_mut().enumerate().skip(first_left) {
                    *o = avx512::tiles_multi::dot_q4_1_rows_scaled::<1, G, O>([row(r)], a, d, s, stride, nb)[0];
                }
            } else {
                for (r, o) in out.iter_mut().enumerate() {
                    for g in 0..G {
                        let a4 = [a[4 * g], a[4 * g + 1], a[4 * g + 2], a[4 * g + 3]];
                        o[4 * g..4 * g + 4].copy_from_slice(&avx2::dot_q4_1_x4_scaled(row(r), a4, d.add(4 * g), s.add(4 * g), stride, nb));
                    }
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("has_tile is false off x86-64")
}

/// Bytes of one block of a group of eight activation rows in the eights form
/// (`quant::Q8_1Eights`): the 256 quant bytes, then the eight rows' d and s as f32.
pub(crate) const Q8_1_EIGHTS_BLOCK_BYTES: usize = 256 + 64;

/// `avx512::tiles_multi::dot_q4_1_rows_eights` for every weight row of `w_block` (rows of
/// `row_bytes`, one per `out` entry): two weight rows a call, then the last one alone. The
/// caller (quant::vec_dot_rows_q4_1_eights) checked the level and the lengths.
pub(crate) fn dot_q4_1_eights(w_block: &[u8], row_bytes: usize, group: &[u8], nb: usize, out: &mut [[f32; 8]]) {
    assert!(w_block.len() >= out.len() * row_bytes && group.len() >= nb * Q8_1_EIGHTS_BLOCK_BYTES);
    #[cfg(target_arch = "x86_64")]
    {
        let row = |r: usize| w_block[r * row_bytes..].as_ptr();
        // As dot_q4_1_rows_scaled: the weights stream from memory, asked for ahead.
        let ahead = prefetch_ahead(row_bytes);
        let fetch = |r: usize, rows: usize| prefetch(row(r).wrapping_add(ahead), rows * row_bytes);
        let q = group.as_ptr();
        let mut r = 0;
        // SAFETY: the lengths are checked above; the caller checked the level.
        unsafe {
            while r + 2 <= out.len() {
                fetch(r, 2);
                let t = avx512::tiles_multi::dot_q4_1_rows_eights::<2>([row(r), row(r + 1)], q, nb);
                out[r..r + 2].copy_from_slice(&t);
                r += 2;
            }
            if r < out.len() {
                out[r] = avx512::tiles_multi::dot_q4_1_rows_eights::<1>([row(r)], q, nb)[0];
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("has_q4_1_eights_tile is false off x86-64")
}

/// How far ahead of the row being read a matrix-vector product prefetches the weights, in
/// rows. The hardware prefetchers alone leave a decode matvec waiting on DRAM (several row
/// streams at once, each matrix a fresh start): with 8-16 rows ahead the Q4_1 matvec of a
/// SmolLM2-sized stack went from 8.2 to 5.9-6.2 ms per token on one thread, with 32 rows it
/// fell back (examples/decode_matvec.rs, docs/PERF.md).
pub(crate) const PREFETCH_ROWS: usize = 8;

/// How far ahead `quant::vec_dot_rows` (the one-row matvec of every type but Q4_1, which has
/// its own 4 x 1 kernel) prefetches, in bytes, rounded up to whole rows. A distance in bytes
/// rather than rows: 8 rows are 2.9 KB of SmolLM2's Q4_1 but 9 KB of a 2048-wide Q4_K matrix,
/// and there 4 KB ahead decoded faster (2-vCPU AMD EPYC, 2 threads: Qwen3-MoE-shaped Q4_K tg
/// 59.7 vs 56.1 t/s, Gemma 3 270M 97.4 vs 92.3; one thread 34.4 vs 31.2; 16 and 32 KB slower;
/// SmolLM2 unchanged; docs/PERF.md).
pub(crate) const PREFETCH_BYTES: usize = 4096;

/// `PREFETCH_BYTES` as whole rows of `row_bytes`.
pub(crate) fn prefetch_ahead(row_bytes: usize) -> usize {
    PREFETCH_BYTES.div_ceil(row_bytes.max(1)) * row_bytes
}

/// Asks for the cache lines of `len` bytes at `p` (a hint: never faults, any address).
#[inline(always)]
pub(crate) fn prefetch(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..len).step_by(64) {
        // SAFETY: a prefetch has no architectural effect and never faults.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.wrapping_add(off) as *const i8) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// `avx2::dot_q4_1_rows`; the caller checked the level (has_tile) and the lengths.
#[inline]
pub(crate) fn dot_q4_1_rows(w: &[u8], row_bytes: usize, a: &[u8], nb: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: see the caller (quant::vec_dot_rows).
        unsafe { avx2::dot_q4_1_rows(w.as_ptr(), row_bytes, a.as_ptr(), nb, out) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("has_tile is false off x86-64")
}

/// The scalar remainder `start..n` of an F32/F16/BF16 dot product.
#[allow(dead_code)]
pub(crate) fn dot_float_tail(t: GgmlType, w: &[u8], a: &[u8], n: usize, start: usize) -> f32 {
    if start >= n {
        return 0.0;
    }
    let elem = t.type_size();
    dot_scalar(t, &w[start * elem..], &a[start * 4..], n - start)
}
