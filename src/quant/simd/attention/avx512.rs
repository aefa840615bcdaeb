//! The AVX-512 form of the CPU attention's fused GQA-group kernel (`attend_group`), bit for
//! bit the AVX2 one and so `attend_row_sink`: every 16-lane register holds what the
//! AVX2 kernel keeps in two 8-lane ones (dot_f16's four 16-lane accumulators are exactly
//! ggml's AVX-512 layout), and every per-element operation is the same (F16C rounding of q
//! and of the accumulator, FMA, the same lane reduction). Why: half the instructions per
//! score and per accumulator update, and 32 registers, so Gemma 3's head size 256 keeps its
//! whole accumulator (16 registers) in registers across a block of rows.
#![allow(clippy::incompatible_msrv)] // AVX-512 intrinsics are stable since Rust 1.89.

use super::{fold_sink, group_block_rows, raise_pass, softmax_steps, GroupScratch, KvRows, SoftmaxSteps, GROUP_BLOCK};
use crate::quant::simd::expf;
use std::arch::x86_64::*;

/// `attend_group` for head size 16 * HD16 (4, 8, 16: head sizes 64, 128, 256).
///
/// # Safety
/// avx512f/bw/vl, avx2, fma, f16c; q and out hold whole heads; k and v hold every attended
/// row's `16 * HD16` elements at `kv_rows.offset(j)`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn attend_group<const HD16: usize>(
    q: &[f32],
    k: &[u16],
    v: &[u16],
    kv_rows: KvRows<'_>,
    scale: f32,
    sinks: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut GroupScratch,
) {
    // One row: the multi-row kernel's every step for its only row (it is written once).
    attend_group_rows::<HD16>(q, q.len(), 1, k, v, kv_rows, kv_rows.count, scale, sinks, out, scratch)
}

/// `attend_group` for `n_rows` consecutive query rows of one sequence that all attend from
/// `kv_rows.first` (no sliding window, unless one row): row r's group heads are
/// `q[r * q_stride..][..out.len() / n_rows]`, and it attends to the first `count0 + r` of
/// `kv_rows` (so `kv_rows.count == count0 + n_rows - 1`). Each block of K/V rows is widened
/// from f16 once for all the rows; per row every operation and its order are those of the row
/// alone (the same blocks from the first attended position, the last one cut at the row's
/// count), so each row's output has its bits (`attend_group` is this kernel with one row).
/// `out` holds the rows one after another; `sinks` (one per head) apply to every row.
///
/// # Safety
/// As `attend_group`; `q` holds `n_rows` rows `q_stride` apart.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn attend_group_rows<const HD16: usize>(
    q: &[f32],
    q_stride: usize,
    n_rows: usize,
    k: &[u16],
    v: &[u16],
    kv_rows: KvRows<'_>,
    count0: usize,
    scale: f32,
    sinks: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut GroupScratch,
) {
    let hd = 16 * HD16;
    let len = out.len() / n_rows;
    let heads = len / hd;
    let GroupScratch { q: qr, k: kf, v: vf, acc, m, sum } = scratch;
    for buf in [&mut *qr, &mut *acc] {
        buf.clear();
        buf.resize(n_rows * len, 0.0);
    }
    for buf in [&mut *kf, &mut *vf] {
        buf.resize(GROUP_BLOCK * hd, 0.0);
    }
    m.clear();
    m.resize(n_rows * heads, f32::NEG_INFINITY);
    sum.clear();
    sum.resize(n_rows * heads, 0.0);
    for r in 0..n_rows {
        for i in (0..len).step_by(16) {
            _mm512_storeu_ps(qr.as_mut_ptr().add(r * len + i), round(_mm512_loadu_ps(q.as_ptr().add(r * q_stride + i))));
        }
    }
    let block = group_block_rows(hd);
    for j0 in (0..kv_rows.count).step_by(block) {
        let n = block.min(kv_rows.count - j0);
        for j in 0..n {
            let at = kv_rows.offset(j0 + j);
            let (kp, vp) = (k.as_ptr().add(at), v.as_ptr().add(at));
            for c in 0..HD16 {
                _mm512_storeu_ps(kf.as_mut_ptr().add(j * hd + 16 * c), load_h(kp.add(16 * c)));
                _mm512_storeu_ps(vf.as_mut_ptr().add(j * hd + 16 * c), load_h(vp.add(16 * c)));
            }
        }
        for r in 0..n_rows {
            let count = count0 + r;
            if count <= j0 {
                continue;
            }
            let row = r * len..(r + 1) * len;
            let state = r * heads..(r + 1) * heads;
            let nr = n.min(count - j0);
            attend_heads::<HD16>(&qr[row.clone()], kf, vf, nr, scale, &mut m[state.clone()], &mut sum[state], &mut acc[row]);
        }
    }
    for r in 0..n_rows {
        let (acc_r, m_r, sum_r) = (&mut acc[r * len..(r + 1) * len], &m[r * heads..(r + 1) * heads], &mut sum[r * heads..(r + 1) * heads]);
        if let Some(sinks) = sinks {
            for (h, &sink) in sinks.iter().enumerate() {
                fold_sink(sink, m_r[h], &mut sum_r[h], &mut acc_r[h * hd..(h + 1) * hd]);
            }
        }
        for (h, &total) in sum_r.iter().enumerate() {
            let inv = _mm512_set1_ps(if total == 0.0 { 0.0 } else { 1.0 / total });
            for c in 0..HD16 {
                let i = h * hd + 16 * c;
                _mm512_storeu_ps(out.as_mut_ptr().add(r * len + i), _mm512_mul_ps(_mm512_loadu_ps(acc_r.as_ptr().add(i)), inv));
            }
        }
    }
}

/// One query row's heads (`q`, `acc`, `m`, `sum` hold them one after another) over a block of
/// `n` widened K/V rows. Several heads per pass where their accumulators fit in registers next
/// to a V row: one head's accumulator update is a chain (FMA, then the f16 round trip) from row
/// to row; the heads' chains are independent, so interleaving them fills the pipeline, and each
/// V row is loaded once for all of them. Per head the operations and their order are unchanged
/// (same bits).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn attend_heads<const HD16: usize>(
    q: &[f32],
    kf: &[f32],
    vf: &[f32],
    n: usize,
    scale: f32,
    m: &mut [f32],
    sum: &mut [f32],
    acc: &mut [f32],
) {
    let hd = 16 * HD16;
    let heads = m.len();
    let mut h = 0;
    while h < heads {
        let (qh, acc_h) = (q.as_ptr().add(h * hd), acc.as_mut_ptr().add(h * hd));
        let (mh, sh) = (&mut m[h..], &mut sum[h..]);
        let (kb, vb) = (kf.as_ptr(), vf.as_ptr());
        h += match (HD16, heads - h) {
            (4, 4..) => attend_block::<HD16, 4>(qh, kb, vb, n, scale, mh, sh, acc_h),
            (4, 3) => attend_block::<HD16, 3>(qh, kb, vb, n, scale, mh, sh, acc_h),
            (4 | 8, 2..) => attend_block::<HD16, 2>(qh, kb, vb, n, scale, mh, sh, acc_h),
            _ => attend_block::<HD16, 1>(qh, kb, vb, n, scale, mh, sh, acc_h),
        };
    }
}

/// The AVX2 `attend_block` with 16-lane registers, for NH consecutive heads (`q`, `acc`
/// and the running `m`, `sum` start at the first of them): per head all scores of the
/// block and the scalar softmax steps, then the accumulator updates of the NH heads
/// interleaved row by row, with the accumulators in registers. Returns NH.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn attend_block<const HD16: usize, const NH: usize>(
    q: *const f32,
    k: *const f32,
    v: *const f32,
    n: usize,
    scale: f32,
    m: &mut [f32],
    sum: &mut [f32],
    acc: *mut f32,
) -> usize {
    debug_assert!(n <= GROUP_BLOCK && m.len() >= NH && sum.len() >= NH);
    let hd = 16 * HD16;
    // Plain loops, no `std::array::from_fn`: its closures carry no target features, so the
    // intrinsics in them run as calls unless LLVM inlines the closure, which it stopped doing
    // once `attend_group_rows` called this too (5x slower).
    let mut scores = [[0f32; GROUP_BLOCK]; NH];
    for (h, scores) in scores.iter_mut().enumerate() {
        let mut qv = [_mm512_setzero_ps(); HD16];
        for (c, qv) in qv.iter_mut().enumerate() {
            *qv = _mm512_loadu_ps(q.add(h * hd + 16 * c));
        }
        // Whole groups of 16 (the scratch holds GROUP_BLOCK rows; scores past n are unused).
        for j in (0..n).step_by(16) {
            scores_x16::<HD16>(&qv, k.add(j * hd), scale, scores.as_mut_ptr().add(j));
        }
    }
    let st = if expf::matches_libm() {
        softmax_steps_x16::<NH>(&scores, n, m, sum)
    } else {
        let mut st = [SoftmaxSteps::NONE; NH];
        for (h, st) in st.iter_mut().enumerate() {
            *st = softmax_steps(&scores[h][..n], &mut m[h], &mut sum[h]);
        }
        st
    };
    let mut av = [[_mm512_setzero_ps(); HD16]; NH];
    for (h, av) in av.iter_mut().enumerate() {
        for (c, a) in av.iter_mut().enumerate() {
            *a = _mm512_loadu_ps(acc.add(h * hd + 16 * c));
        }
    }
    for j in 0..n {
        for (st, av) in st.iter().zip(av.iter_mut()) {
            if st.rescale[j] {
                let msv = _mm512_set1_ps(st.ms[j]);
                for a in av.iter_mut() {
                    *a = round(_mm512_mul_ps(*a, msv));
                }
            }
        }
        let mut vsv = [_mm512_setzero_ps(); NH];
        for (vsv, st) in vsv.iter_mut().zip(&st) {
            *vsv = _mm512_set1_ps(st.vs[j]);
        }
        let vp = v.add(j * hd);
        for c in 0..HD16 {
            let vc = _mm512_loadu_ps(vp.add(16 * c));
            for (av, vsv) in av.iter_mut().zip(&vsv) {
                av[c] = round(_mm512_fmadd_ps(vc, *vsv, av[c]));
            }
        }
    }
    for (h, av) in av.iter().enumerate() {
        for (c, a) in av.iter().enumerate() {
            _mm512_storeu_ps(acc.add(h * hd + 16 * c), *a);
        }
    }
    NH
}

/// `softmax_steps` for NH heads' blocks of `n` scores, same bits: per head `raise_pass`,
/// then every other row's vs = expf(score - max) 16 rows at a time (`expf_x16`, glibc's
/// bits), then the heads' sums run their FMA chains side by side (each chain in its order).
/// Only where `expf::matches_libm()`.
#[inline(always)]
unsafe fn softmax_steps_x16<const NH: usize>(
    scores: &[[f32; GROUP_BLOCK]; NH],
    n: usize,
    m: &mut [f32],
    sum: &mut [f32],
) -> [SoftmaxSteps; NH] {
    let mut st = [SoftmaxSteps::NONE; NH];
    for (h, st) in st.iter_mut().enumerate() {
        let arg = raise_pass(&scores[h][..n], &mut m[h], st);
        for j in (0..n).step_by(16) {
            _mm512_storeu_ps(st.vs.as_mut_ptr().add(j), expf::expf_x16(_mm512_loadu_ps(arg.as_ptr().add(j))));
        }
    }
    let mut s = [0f32; NH];
    s.copy_from_slice(&sum[..NH]);
    for j in 0..n {
        for (s, st) in s.iter_mut().zip(&st) {
            *s = s.mul_add(st.ms[j], st.vs[j]);
        }
    }
    sum[..NH].copy_from_slice(&s);
    st
}

#[inline(always)]
unsafe fn load_h(p: *const u16) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

/// To f16 and back, round to nearest even (the f16 accumulator and q of ggml).
#[inline(always)]
unsafe fn round(v: __m512) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
}

/// The scores of 16 consecutive widened K rows (`k`, hd apart) for one head's q, each bit for
/// bit the AVX2 kernel's `reduce_lanes(dot_f16's accumulators) * scale`: the rows' lane trees run side by side,
/// two rows per register at the first level and 16 in one at the last (each level the same
/// pairs of lanes added as `reduce_lanes` adds them; adding is commutative, so which operand
/// is which does not matter), 15 adds and 32 shuffles instead of 16 x 8 mostly serial steps.
#[inline(always)]
unsafe fn scores_x16<const HD16: usize>(qv: &[__m512; HD16], k: *const f32, scale: f32, out: *mut f32) {
    let hd = 16 * HD16;
    let mut s = [_mm512_setzero_ps(); 16];
    for (j, s) in s.iter_mut().enumerate() {
        let kp = k.add(j * hd);
        // dot_f16's order: per 64 elements, acc[i] is the i-th 16-lane accumulator.
        let mut a = [_mm512_setzero_ps(); 4];
        for c in 0..HD16 / 4 {
            for (i, a) in a.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(_mm512_loadu_ps(kp.add(64 * c + 16 * i)), qv[4 * c + i], *a);
            }
        }
        *s = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
    }
    // Lanes i + (i + 8): rows 2p and 2p + 1 in one register, 8 lanes each.
    let mut t1 = [_mm512_setzero_ps(); 8];
    for (p, t) in t1.iter_mut().enumerate() {
        let (x, y) = (s[2 * p], s[2 * p + 1]);
        *t = _mm512_add_ps(_mm512_shuffle_f32x4::<0b01_00_01_00>(x, y), _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y));
    }
    // Lanes i + (i + 4): rows 4q..4q + 4, one per 128-bit lane.
    let mut t2 = [_mm512_setzero_ps(); 4];
    for (q, t) in t2.iter_mut().enumerate() {
        let (x, y) = (t1[2 * q], t1[2 * q + 1]);
        *t = _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(x, y), _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y));
    }
    // Lanes 0 + 2 and 1 + 3: 128-bit lane l of t3[u] holds rows 8u + l and 8u + 4 + l.
    let mut t3 = [_mm512_setzero_ps(); 2];
    for (u, t) in t3.iter_mut().enumerate() {
        let (x, y) = (t2[2 * u], t2[2 * u + 1]);
        *t = _mm512_add_ps(_mm512_shuffle_ps::<0b01_00_01_00>(x, y), _mm512_shuffle_ps::<0b11_10_11_10>(x, y));
    }
    // Lane 0 + 1: element 4l + m holds row l + 4m; put row j in element j.
    let r = _mm512_add_ps(_mm512_shuffle_ps::<0b10_00_10_00>(t3[0], t3[1]), _mm512_shuffle_ps::<0b11_01_11_01>(t3[0], t3[1]));
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_permutexvar_ps(order, r), _mm512_set1_ps(scale)));
}
