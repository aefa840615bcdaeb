//! The f16 KV cache's kernels: rows converted into the cache (`f32_to_f16_row`) and the
//! attention over it, llama.cpp's CPU flash attention reproduced for greedy parity (see
//! `backend::cpu::attention`, which runs these per token and GQA group on the pool).
//!
//! The same numbers on every path: the x86 forms use F16C and FMA, the portable one `half`
//! and `mul_add`; both round to nearest even and fuse the same multiply-adds. The fused GQA
//! kernel (`attend_group`) has an AVX2 form (attention/avx2.rs) and an AVX-512 one
//! (attention/avx512.rs), bit for bit the step-by-step reference `attend_row_sink`.

use super::{level, SimdLevel};
use crate::backend::KvBlocks;

/// Whether the 8-lane forms run: at the dot products' level (`level()`, so CIVETTA_SIMD caps
/// this too) from AVX2 up, which includes FMA and F16C. Both forms give the same bits.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn avx2_forms() -> bool {
    level() >= SimdLevel::Avx2
}

fn to_f32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

fn round(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

pub fn f32_to_f16_row(src: &[f32], dst: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if avx2_forms() {
        // SAFETY: the level (Avx2 or above) has avx2/fma/f16c.
        return unsafe { avx2::f32_to_f16_row(src, dst) };
    }
    f32_to_f16_row_portable(src, dst)
}

fn f32_to_f16_row_portable(src: &[f32], dst: &mut [u16]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = half::f16::from_f32(*s).to_bits();
    }
}

/// ggml_vec_dot_f16 as ggml's AVX-512 build computes it: per 64 elements four 16-lane FMA
/// accumulators; then acc0+acc2, acc1+acc3, their sum, and a halving tree over the 16
/// lanes; a tail past the last multiple of 64 is added in f64.
pub fn dot_f16(x: &[u16], y: &[u16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx2_forms() {
        // SAFETY: the level (Avx2 or above) has avx2/fma/f16c; x and y have the same length.
        return unsafe { avx2::dot_f16(x, y) };
    }
    dot_f16_portable(x, y)
}

fn dot_f16_portable(x: &[u16], y: &[u16]) -> f32 {
    let n = x.len();
    let np = n & !63;
    let mut acc = [[0f32; 16]; 4];
    for c in (0..np).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, v) in a.iter_mut().enumerate() {
                let i = c + 16 * j + l;
                *v = to_f32(x[i]).mul_add(to_f32(y[i]), *v);
            }
        }
    }
    let mut r = [0f32; 16];
    for l in 0..16 {
        r[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let mut w = 16;
    while w > 1 {
        w /= 2;
        for l in 0..w {
            r[l] += r[l + w];
        }
    }
    let mut sum = r[0] as f64;
    for i in np..n {
        sum += (to_f32(x[i]) * to_f32(y[i])) as f64;
    }
    sum as f32
}

/// acc = f16(acc * s) (ggml_vec_scale_f16 on an f16 accumulator).
pub fn scale_rounded(acc: &mut [f32], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if avx2_forms() && acc.len().is_multiple_of(8) {
        // SAFETY: the level (Avx2 or above) has avx2/fma/f16c.
        return unsafe { avx2::scale_rounded(acc, s) };
    }
    scale_rounded_portable(acc, s)
}

fn scale_rounded_portable(acc: &mut [f32], s: f32) {
    for a in acc.iter_mut() {
        *a = round(*a * s);
    }
}

/// acc = f16(fma(v, s, acc)) (ggml_vec_mad_f16 on an f16 accumulator).
pub fn mad_rounded(acc: &mut [f32], v: &[u16], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if avx2_forms() && acc.len().is_multiple_of(8) {
        // SAFETY: the level (Avx2 or above) has avx2/fma/f16c; v is as long as acc.
        return unsafe { avx2::mad_rounded(acc, v, s) };
    }
    mad_rounded_portable(acc, v, s)
}

fn mad_rounded_portable(acc: &mut [f32], v: &[u16], s: f32) {
    for (a, h) in acc.iter_mut().zip(v) {
        *a = round(to_f32(*h).mul_add(s, *a));
    }
}

/// The cache rows one query attends over: positions first..first + count, each at pool
/// row `blocks.slot(p)`, rows `stride` elements apart (offsets relative to the K/V slice
/// the kernel gets, which starts at the head's column).
#[derive(Clone, Copy)]
pub struct KvRows<'a> {
    pub blocks: KvBlocks<'a>,
    pub first: usize,
    pub count: usize,
    pub stride: usize,
}

impl KvRows<'_> {
    /// Element offset of the j-th attended row.
    #[inline(always)]
    pub fn offset(&self, j: usize) -> usize {
        self.blocks.slot(self.first + j) * self.stride
    }

    /// The largest `offset` of any attended row (count > 0).
    pub fn max_offset(&self) -> usize {
        self.blocks.max_slot(self.first, self.count) * self.stride
    }
}

/// One query row's attention over `rows` cache positions (K and V rows `stride` apart,
/// starting at k[0] and v[0]), step by step: q rounded to f16, `dot_f16`, online softmax
/// with libm expf, the f16-rounded accumulator; then, with a `sink` (gpt-oss), `fold_sink`.
/// Any head size; q16 and acc are scratch of the head size. The reference of `attend_group`
/// (tests) and its fallback.
#[allow(clippy::too_many_arguments)]
pub fn attend_row_sink(
    q: &[f32],
    k: &[u16],
    v: &[u16],
    rows: KvRows<'_>,
    scale: f32,
    sink: Option<f32>,
    q16: &mut [u16],
    acc: &mut [f32],
    out: &mut [f32],
) {
    let hd = q.len();
    f32_to_f16_row(q, q16);
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    acc.fill(0.0);
    for j in 0..rows.count {
        let at = rows.offset(j);
        let sc = dot_f16(&k[at..at + hd], q16) * scale;
        let (mut ms, mut vs) = (1f32, 1f32);
        if sc > m {
            let old = m;
            m = sc;
            ms = (old - m).exp();
            scale_rounded(acc, ms);
        } else {
            vs = (sc - m).exp();
        }
        mad_rounded(acc, &v[at..at + hd], vs);
        sum = sum.mul_add(ms, vs);
    }
    if let Some(s) = sink {
        fold_sink(s, m, &mut sum, acc);
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for (d, a) in out.iter_mut().zip(acc.iter()) {
        *d = a * inv;
    }
}

/// An attention sink after the last key (gpt-oss; ggml's correction for its single KV chunk):
/// one more key that scored `sink` with a zero value. If it beats the running max `m` the
/// f16-rounded accumulator is rescaled by exp(m - sink) and the sum becomes sum * that + 1,
/// else the sum gains exp(sink - m); the max itself is not updated (nothing follows).
fn fold_sink(sink: f32, m: f32, sum: &mut f32, acc: &mut [f32]) {
    let (mut ms, mut vs) = (1f32, 1f32);
    if sink > m {
        ms = (m - sink).exp();
        scale_rounded(acc, ms);
    } else {
        vs = (sink - m).exp();
    }
    *sum = *sum * ms + vs;
}

/// K/V rows converted to f32 per block in `attend_group` (16 KiB of scratch at head size 64).
const GROUP_BLOCK: usize = 32;

/// The online-softmax steps of `attend_row_sink` for a block of scores, continuing the
/// running max m and sum: per row, whether it is a new maximum (the accumulator is then
/// rescaled by ms first), and the factors on the old accumulator (ms) and on V (vs).
#[derive(Clone, Copy)]
struct SoftmaxSteps {
    rescale: [bool; GROUP_BLOCK],
    ms: [f32; GROUP_BLOCK],
    vs: [f32; GROUP_BLOCK],
}

impl SoftmaxSteps {
    /// No rescale, both factors 1 (what every step starts as).
    const NONE: SoftmaxSteps = SoftmaxSteps { rescale: [false; GROUP_BLOCK], ms: [1.0; GROUP_BLOCK], vs: [1.0; GROUP_BLOCK] };
}

#[inline(always)]
fn softmax_steps(scores: &[f32], m: &mut f32, sum: &mut f32) -> SoftmaxSteps {
    let mut st = SoftmaxSteps::NONE;
    let (mut mx, mut s) = (*m, *sum);
    for (j, &sc) in scores.iter().enumerate() {
        if sc > mx {
            let old = mx;
            mx = sc;
            st.ms[j] = (old - mx).exp();
            st.rescale[j] = true;
        } else {
            st.vs[j] = (sc - mx).exp();
        }
        s = s.mul_add(st.ms[j], st.vs[j]);
    }
    (*m, *sum) = (mx, s);
    st
}

/// The first pass of the vectorised `softmax_steps` (the AVX2 and AVX-512 kernels): continues
/// the running max m over a block's scores, marks the rows that raise it and gives them their
/// ms (libm: rare past a sequence's first rows); returns every other row's exp argument
/// (score - max) and 0 for the raising rows, whose exp is exactly their vs of 1.
#[inline(always)]
fn raise_pass(scores: &[f32], m: &mut f32, st: &mut SoftmaxSteps) -> [f32; GROUP_BLOCK] {
    let mut arg = [0f32; GROUP_BLOCK];
    let mut mx = *m;
    for (j, &sc) in scores.iter().enumerate() {
        if sc > mx {
            let old = mx;
            mx = sc;
            st.ms[j] = (old - mx).exp();
            st.rescale[j] = true;
        } else {
            arg[j] = sc - mx;
        }
    }
    *m = mx;
    arg
}

/// Rows per block of `attend_group`: the f32 K and V of a block stay within 32 KiB (L1)
/// up to head size 128; 16 rows at 256.
fn group_block_rows(hd: usize) -> usize {
    (GROUP_BLOCK * 128 / hd).min(GROUP_BLOCK)
}

/// Per-thread scratch of `attend_group`.
#[derive(Default)]
pub struct GroupScratch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    acc: Vec<f32>,
    m: Vec<f32>,
    sum: Vec<f32>,
}

/// `attend_row_sink` for all query heads of one GQA group at once (`q` and `out` hold
/// the group's heads one after another), bit for bit, with q and the accumulator in
/// registers within each block of rows: the heads of a group read the same K/V rows, so
/// each block of rows is converted from f16 once for all of them. Returns false (and does
/// nothing) where no fused kernel exists: head sizes other than 64, 128 and 256 (Gemma 3),
/// or a kernel level below AVX2 (`level()`, the dot products' level).
#[allow(clippy::too_many_arguments)]
pub fn attend_group(
    q: &[f32],
    hd: usize,
    k: &[u16],
    v: &[u16],
    rows: KvRows<'_>,
    scale: f32,
    sinks: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut GroupScratch,
) -> bool {
    attend_group_at(level(), q, hd, k, v, rows, scale, sinks, out, scratch)
}

/// `attend_group` with the kernels of an explicit level (for the tests): AVX-512 (the
/// 16-lane form, same bits) at `Avx512Vnni`, AVX2 at `Avx2`, none at `Scalar` or where
/// the CPU lacks the level.
#[allow(clippy::too_many_arguments)]
pub fn attend_group_at(
    level: SimdLevel,
    q: &[f32],
    hd: usize,
    k: &[u16],
    v: &[u16],
    rows: KvRows<'_>,
    scale: f32,
    sinks: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut GroupScratch,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if level >= SimdLevel::Avx2
        && level.available()
        && (hd == 64 || hd == 128 || hd == 256)
        && rows.count > 0
        && q.len().is_multiple_of(hd)
        && out.len() == q.len()
        && k.len() >= rows.max_offset() + hd
        && v.len() >= rows.max_offset() + hd
        && sinks.is_none_or(|s| s.len() * hd == q.len())
    {
        // SAFETY: the level's features are available (Avx2: avx2/fma/f16c; Avx512Vnni:
        // those and avx512f/bw/vl); the slice lengths cover every row read.
        unsafe {
            match (level, hd) {
                (SimdLevel::Avx512Vnni, 64) => avx512::attend_group::<4>(q, k, v, rows, scale, sinks, out, scratch),
                (SimdLevel::Avx512Vnni, 128) => avx512::attend_group::<8>(q, k, v, rows, scale, sinks, out, scratch),
                (SimdLevel::Avx512Vnni, _) => avx512::attend_group::<16>(q, k, v, rows, scale, sinks, out, scratch),
                (_, 64) => avx2::attend_group::<8>(q, k, v, rows, scale, sinks, out, scratch),
                (_, 128) => avx2::attend_group::<16>(q, k, v, rows, scale, sinks, out, scratch),
                _ => avx2::attend_group::<32>(q, k, v, rows, scale, sinks, out, scratch),
            }
        }
        return true;
    }
    let _ = (level, q, hd, k, v, rows, scale, sinks, out, scratch);
    false
}

/// `attend_group` for `n_rows` consecutive query rows of one sequence whose layer has no
/// window (a prompt chunk): row r's group heads are `q[r * q_stride..][..out.len() / n_rows]`
/// and it attends to the first `count0 + r` of `rows` (`rows.count == count0 + n_rows - 1`);
/// `out` holds the rows one after another; `sinks` (one per head of the group) apply to each.
/// Every row gets `attend_group`'s bits; each block of K/V rows is widened from f16 once for
/// all of them instead of once per row. Returns false (and does nothing) where there is no
/// such kernel (below AVX-512, other head sizes): then call `attend_group` per row.
#[allow(clippy::too_many_arguments)]
pub fn attend_group_rows(
    q: &[f32],
    q_stride: usize,
    n_rows: usize,
    hd: usize,
    k: &[u16],
    v: &[u16],
    rows: KvRows<'_>,
    count0: usize,
    scale: f32,
    sinks: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut GroupScratch,
) -> bool {
    let level = level();
    #[cfg(target_arch = "x86_64")]
    if level == SimdLevel::Avx512Vnni
        && level.available()
        && (hd == 64 || hd == 128 || hd == 256)
        && n_rows > 0
        && count0 > 0
        && rows.count == count0 + n_rows - 1
        && out.len().is_multiple_of(n_rows)
        && (out.len() / n_rows).is_multiple_of(hd)
        && q.len() >= (n_rows - 1) * q_stride + out.len() / n_rows
        && k.len() >= rows.max_offset() + hd
        && v.len() >= rows.max_offset() + hd
        && sinks.is_none_or(|s| s.len() * hd == out.len() / n_rows)
    {
        // SAFETY: avx512f/bw/vl, avx2, fma and f16c are available (Avx512Vnni); the slice
        // lengths cover every q row and K/V row read and every output written.
        unsafe {
            match hd {
                64 => avx512::attend_group_rows::<4>(q, q_stride, n_rows, k, v, rows, count0, scale, sinks, out, scratch),
                128 => avx512::attend_group_rows::<8>(q, q_stride, n_rows, k, v, rows, count0, scale, sinks, out, scratch),
                _ => avx512::attend_group_rows::<16>(q, q_stride, n_rows, k, v, rows, count0, scale, sinks, out, scratch),
            }
        }
        return true;
    }
    let _ = (level, q, q_stride, n_rows, hd, k, v, rows, count0, scale, sinks, out, scratch);
    false
}

/// The 8-lane forms: the f16 primitives and `attend_group`.
#[cfg(target_arch = "x86_64")]
mod avx2;
/// The 16-lane form of `attend_group`.
#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX2 f16 primitives and the portable ones give the same bits (CIVETTA_SIMD=scalar
    /// runs the portable ones), for lengths with and without tails past multiples of 8 and
    /// 64, values that overflow or underflow f16 and rounding midpoints.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn f16_primitives_avx2_and_portable_agree_bit_for_bit() {
        if !SimdLevel::Avx2.available() {
            return;
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
        };
        let specials = [70000.0, -70000.0, 65504.0, 65520.0, 1e-6, -3e-8, 1e-9, 0.0, -0.0, 1.0 + 1.0 / 2048.0, 2049.0, f32::INFINITY];
        for n in [1usize, 7, 8, 9, 16, 63, 64, 65, 128, 200, 256] {
            let mut x: Vec<f32> = (0..n).map(|_| rnd()).collect();
            for (i, v) in specials.iter().enumerate().filter(|(i, _)| *i < n) {
                x[(i * 7) % n] = *v;
            }
            let y: Vec<f32> = (0..n).map(|_| rnd()).collect();
            let (mut a, mut b) = (vec![0u16; n], vec![0u16; n]);
            // SAFETY (every avx2:: call): avx2/fma/f16c available; the slices have length n.
            unsafe { avx2::f32_to_f16_row(&x, &mut a) };
            f32_to_f16_row_portable(&x, &mut b);
            assert_eq!(a, b, "f32_to_f16_row, n = {n}");
            let mut yh = vec![0u16; n];
            f32_to_f16_row_portable(&y, &mut yh);
            let xh: Vec<u16> = a.iter().map(|&h| if half::f16::from_bits(h).is_finite() { h } else { 0x3c00 }).collect();
            let (d1, d2) = (unsafe { avx2::dot_f16(&xh, &yh) }, dot_f16_portable(&xh, &yh));
            assert_eq!(d1.to_bits(), d2.to_bits(), "dot_f16, n = {n}: {d1} vs {d2}");
            if n.is_multiple_of(8) {
                for s in [0.37f32, 1.0, 3.5e-3] {
                    let (mut p, mut q) = (y.clone(), y.clone());
                    unsafe { avx2::scale_rounded(&mut p, s) };
                    scale_rounded_portable(&mut q, s);
                    assert_eq!(p.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), q.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                    unsafe { avx2::mad_rounded(&mut p, &xh, s) };
                    mad_rounded_portable(&mut q, &xh, s);
                    assert_eq!(p.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), q.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                }
            }
        }
    }

    /// Uniform values in [-3, 3) from an xorshift of `seed`.
    fn uniform(mut seed: u64) -> impl FnMut() -> f32 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 6.0
        }
    }

    fn contiguous(stride: usize, rows: usize) -> KvRows<'static> {
        KvRows { blocks: KvBlocks::CONTIGUOUS, first: 0, count: rows, stride }
    }

    /// The fused GQA-group kernel must give the per-step path's bits exactly, head by head
    /// (greedy parity with llama.cpp and bench hashes depend on it), for prefix lengths inside
    /// one block of rows and across blocks, with K/V rows interleaved in the cache as in a GQA
    /// layer.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fused_group_attention_equals_the_step_by_step_path() {
        let mut rnd = uniform(0x2545_f491_4f6c_dd1du64);
        let mut scratch = GroupScratch::default();
        for (level, hd) in [SimdLevel::Avx2, SimdLevel::Avx512Vnni].into_iter().flat_map(|l| [(l, 64usize), (l, 128), (l, 256)]) {
            let (kv_heads, rows_max) = (3usize, 70usize);
            let stride = kv_heads * hd;
            let kf: Vec<f32> = (0..rows_max * stride).map(|_| rnd()).collect();
            let vf: Vec<f32> = (0..rows_max * stride).map(|_| rnd()).collect();
            let (mut k, mut v) = (vec![0u16; kf.len()], vec![0u16; vf.len()]);
            f32_to_f16_row(&kf, &mut k);
            f32_to_f16_row(&vf, &mut v);
            // Scores of a few units, and scores 30x larger: their differences from the running
            // max pass 88 and 104, where expf leaves its main path (`expf::expf_x16`).
            for (scale, heads_per_group) in
                [1.0, 30.0].into_iter().flat_map(|b| [1usize, 2, 3, 4, 5, 8].map(|n| (b / (hd as f32).sqrt(), n)))
            {
                let q: Vec<f32> = (0..heads_per_group * hd).map(|_| rnd()).collect();
                // No sink, sinks below the scores' max, and sinks far above it (the accumulator
                // is rescaled after the last key).
                let sink_sets: [Option<Vec<f32>>; 3] = [
                    None,
                    Some((0..heads_per_group).map(|_| rnd() * 0.5).collect()),
                    Some((0..heads_per_group).map(|_| 40.0 + rnd()).collect()),
                ];
                for (g, sinks) in (0..kv_heads).flat_map(|g| sink_sets.iter().map(move |s| (g, s.as_deref()))) {
                    for rows in [1usize, 2, 7, 16, 17, 32, 33, 64, rows_max] {
                        let mut fused = vec![0f32; q.len()];
                        let ran = attend_group_at(
                            level,
                            &q,
                            hd,
                            &k[g * hd..],
                            &v[g * hd..],
                            contiguous(stride, rows),
                            scale,
                            sinks,
                            &mut fused,
                            &mut scratch,
                        );
                        if !ran {
                            assert!(!level.available(), "a CPU with {level:?} must take the fused path");
                            continue;
                        }
                        let (mut q16, mut acc) = (vec![0u16; hd], vec![0f32; hd]);
                        for h in 0..heads_per_group {
                            let mut steps = vec![0f32; hd];
                            let qh = &q[h * hd..(h + 1) * hd];
                            attend_row_sink(
                                qh,
                                &k[g * hd..],
                                &v[g * hd..],
                                contiguous(stride, rows),
                                scale,
                                sinks.map(|s| s[h]),
                                &mut q16,
                                &mut acc,
                                &mut steps,
                            );
                            for (i, (a, b)) in fused[h * hd..(h + 1) * hd].iter().zip(&steps).enumerate() {
                                assert_eq!(
                                    a.to_bits(),
                                    b.to_bits(),
                                    "hd {hd} scale {scale} group {g} head {h} rows {rows} element {i}: {a} vs {b}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// The multi-row kernel gives each row `attend_group`'s bits: rows of a prompt chunk from
    /// positions inside and across blocks of rows, over a paged cache (blocks out of order), with
    /// and without sinks, every head size.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_chunk_of_rows_in_one_item_gets_each_rows_bits() {
        let mut rnd = uniform(0x9e37_79b9_7f4a_7c15u64);
        let mut scratch = GroupScratch::default();
        // 96 positions in blocks of 16, the table out of order.
        let table: Vec<u32> = vec![3, 0, 5, 1, 4, 2];
        let blocks = KvBlocks::new(&table, 16);
        for hd in [64usize, 128, 256] {
            let (kv_heads, heads) = (2usize, 3usize);
            let stride = kv_heads * hd;
            let kf: Vec<f32> = (0..96 * stride).map(|_| rnd()).collect();
            let vf: Vec<f32> = (0..96 * stride).map(|_| rnd()).collect();
            let (mut k, mut v) = (vec![0u16; kf.len()], vec![0u16; vf.len()]);
            f32_to_f16_row(&kf, &mut k);
            f32_to_f16_row(&vf, &mut v);
            let scale = 1.0 / (hd as f32).sqrt();
            // q rows of the whole layer (both groups), q_dim apart.
            let q_dim = kv_heads * heads * hd;
            let q: Vec<f32> = (0..8 * q_dim).map(|_| rnd()).collect();
            let sinks: Vec<f32> = (0..heads).map(|_| rnd()).collect();
            for (count0, n_rows) in [(1usize, 2usize), (5, 8), (30, 5), (31, 3), (60, 8), (89, 8)] {
                for (g, sinks) in [(0, None), (1, None), (1, Some(&sinks[..]))] {
                    let len = heads * hd;
                    let rows = KvRows { blocks, first: 0, count: count0 + n_rows - 1, stride };
                    let mut out = vec![0f32; n_rows * len];
                    let (kg, vg) = (&k[g * hd..], &v[g * hd..]);
                    let q_rows = &q[g * len..];
                    if !attend_group_rows(q_rows, q_dim, n_rows, hd, kg, vg, rows, count0, scale, sinks, &mut out, &mut scratch) {
                        assert_ne!(level(), SimdLevel::Avx512Vnni, "an AVX-512 CPU must take the multi-row kernel");
                        return;
                    }
                    for r in 0..n_rows {
                        let mut one = vec![0f32; len];
                        let row = KvRows { blocks, first: 0, count: count0 + r, stride };
                        assert!(attend_group(&q_rows[r * q_dim..r * q_dim + len], hd, kg, vg, row, scale, sinks, &mut one, &mut scratch));
                        for (i, (a, b)) in out[r * len..(r + 1) * len].iter().zip(&one).enumerate() {
                            assert_eq!(a.to_bits(), b.to_bits(), "hd {hd} group {g} count0 {count0} row {r} element {i}: {a} vs {b}");
                        }
                    }
                }
            }
        }
    }

    /// Time per `attend_group` call for one decode row at depth 2,048 (HD=64: 3 heads a group, as
    /// SmolLM2; HD=128 / 256: 4), for comparing kernels on one machine, not asserted:
    /// `HD=64 cargo test --release --lib time_attend_group_at_depth -- --ignored --nocapture`.
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[ignore]
    fn time_attend_group_at_depth() {
        let mut rnd = uniform(7);
        let hd: usize = std::env::var("HD").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
        let (kv_heads, rows, heads_per_group) = (3usize, 2048usize, if hd == 64 { 3 } else { 4 });
        let stride = kv_heads * hd;
        let kf: Vec<f32> = (0..rows * stride).map(|_| rnd()).collect();
        let vf: Vec<f32> = (0..rows * stride).map(|_| rnd()).collect();
        let (mut k, mut v) = (vec![0u16; kf.len()], vec![0u16; vf.len()]);
        f32_to_f16_row(&kf, &mut k);
        f32_to_f16_row(&vf, &mut v);
        let q: Vec<f32> = (0..heads_per_group * hd).map(|_| rnd()).collect();
        let mut out = vec![0f32; q.len()];
        let mut scratch = GroupScratch::default();
        let scale = 0.4 / (hd as f32).sqrt();
        for _ in 0..5 {
            let t = std::time::Instant::now();
            for g in 0..200 {
                let g = g % kv_heads;
                assert!(attend_group(&q, hd, &k[g * hd..], &v[g * hd..], contiguous(stride, rows), scale, None, &mut out, &mut scratch));
            }
            eprintln!("hd {hd}: {:.1} us per call", t.elapsed().as_secs_f64() * 1e6 / 200.0);
        }
    }
}
