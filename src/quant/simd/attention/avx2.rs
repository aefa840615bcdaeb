//! The AVX2 + FMA + F16C forms of the f16 attention kernels (`super`): the f16 row
//! primitives and `attend_group` for head sizes 64, 128 and 256, 8 lanes per register.

use super::{fold_sink, raise_pass, GroupScratch, KvRows, SoftmaxSteps, GROUP_BLOCK};
use crate::quant::simd::expf;
use std::arch::x86_64::*;

/// `attend_group` for head size 8 * HD8.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn attend_group<const HD8: usize>(
    q: &[f32],
    k: &[u16],
    v: &[u16],
    kv_rows: KvRows<'_>,
    scale: f32,
    sinks: Option<&[f32]>,
    out: &mut [f32],
    scratch: &mut GroupScratch,
) {
    let hd = 8 * HD8;
    let rows = kv_rows.count;
    let heads = q.len() / hd;
    let GroupScratch { q: qr, k: kf, v: vf, acc, m, sum } = scratch;
    for buf in [&mut *qr, &mut *acc] {
        buf.clear();
        buf.resize(q.len(), 0.0);
    }
    for buf in [&mut *kf, &mut *vf] {
        buf.resize(GROUP_BLOCK * hd, 0.0);
    }
    m.clear();
    m.resize(heads, f32::NEG_INFINITY);
    sum.clear();
    sum.resize(heads, 0.0);
    for i in (0..q.len()).step_by(8) {
        _mm256_storeu_ps(qr.as_mut_ptr().add(i), round(_mm256_loadu_ps(q.as_ptr().add(i))));
    }
    let block = super::group_block_rows(hd);
    for j0 in (0..rows).step_by(block) {
        let n = block.min(rows - j0);
        for j in 0..n {
            let at = kv_rows.offset(j0 + j);
            let (kp, vp) = (k.as_ptr().add(at), v.as_ptr().add(at));
            for c in 0..HD8 {
                _mm256_storeu_ps(kf.as_mut_ptr().add(j * hd + 8 * c), load_h(kp.add(8 * c)));
                _mm256_storeu_ps(vf.as_mut_ptr().add(j * hd + 8 * c), load_h(vp.add(8 * c)));
            }
        }
        for h in 0..heads {
            let (qh, acc_h) = (qr.as_ptr().add(h * hd), acc.as_mut_ptr().add(h * hd));
            attend_block::<HD8>(qh, kf.as_ptr(), vf.as_ptr(), n, scale, &mut m[h], &mut sum[h], acc_h);
        }
    }
    if let Some(sinks) = sinks {
        for (h, &sink) in sinks.iter().enumerate() {
            fold_sink(sink, m[h], &mut sum[h], &mut acc[h * hd..(h + 1) * hd]);
        }
    }
    for (h, &total) in sum.iter().enumerate() {
        let inv = _mm256_set1_ps(if total == 0.0 { 0.0 } else { 1.0 / total });
        for c in 0..HD8 {
            let i = h * hd + 8 * c;
            _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(_mm256_loadu_ps(acc.as_ptr().add(i)), inv));
        }
    }
}

/// `attend_row_sink`' loop over n <= GROUP_BLOCK rows of f32 K and V (contiguous, 8 *
/// HD8 apart) for one head whose rounded q is at `q`, continuing the online softmax in
/// m, sum and acc. The same operations in three passes: all scores (independent dots),
/// then the scalar softmax steps (the exps only wait on the running max), then the
/// accumulator updates (a pure vector chain). Interleaved in one loop per row, the exp
/// latency and the rounded accumulator chain serialise each row (measured on a noisy
/// VM: the one-loop kernel took 1.1-1.6x as long per prefill attention call).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn attend_block<const HD8: usize>(
    q: *const f32,
    k: *const f32,
    v: *const f32,
    n: usize,
    scale: f32,
    m: &mut f32,
    sum: &mut f32,
    acc: *mut f32,
) {
    debug_assert!(n <= GROUP_BLOCK);
    let qv: [__m256; HD8] = std::array::from_fn(|c| _mm256_loadu_ps(q.add(8 * c)));
    let mut scores = [0f32; GROUP_BLOCK];
    for (j, sc) in scores.iter_mut().enumerate().take(n) {
        let kp = k.add(j * 8 * HD8);
        // dot_f16's order: per 64 elements, lo[i]/hi[i] hold lanes 0..7/8..15 of
        // the i-th 16-lane accumulator.
        let mut lo = [_mm256_setzero_ps(); 4];
        let mut hi = [_mm256_setzero_ps(); 4];
        for c in 0..HD8 / 8 {
            for i in 0..4 {
                let e = 64 * c + 16 * i;
                lo[i] = _mm256_fmadd_ps(_mm256_loadu_ps(kp.add(e)), qv[e / 8], lo[i]);
                hi[i] = _mm256_fmadd_ps(_mm256_loadu_ps(kp.add(e + 8)), qv[e / 8 + 1], hi[i]);
            }
        }
        *sc = reduce_lanes(lo, hi) * scale;
    }
    let st = if expf::matches_libm_avx2() { softmax_steps_x8(&scores, n, m, sum) } else { super::softmax_steps(&scores[..n], m, sum) };
    // The accumulator stays in registers across the rows: all of it up to head size
    // 128, 128 columns at a time above (head size 256 would need 32 of the 16 ymm
    // registers); each column's operations and their row order are the same.
    let steps = (&st.rescale[..n], &st.ms[..n], &st.vs[..n]);
    if HD8 <= 16 {
        accumulate::<HD8>(acc, v, 8 * HD8, steps);
    } else {
        for g in 0..HD8 / 16 {
            accumulate::<16>(acc.add(128 * g), v.add(128 * g), 8 * HD8, steps);
        }
    }
}

/// `softmax_steps` with `raise_pass` and the other rows' exps 8 at a time (`expf_x8_avx2`,
/// glibc's bits), as the AVX-512 kernel's `softmax_steps_x16` for one head.
#[inline(always)]
unsafe fn softmax_steps_x8(scores: &[f32; GROUP_BLOCK], n: usize, m: &mut f32, sum: &mut f32) -> SoftmaxSteps {
    let mut st = SoftmaxSteps::NONE;
    let arg = raise_pass(&scores[..n], m, &mut st);
    for j in (0..n).step_by(8) {
        _mm256_storeu_ps(st.vs.as_mut_ptr().add(j), expf::expf_x8_avx2(_mm256_loadu_ps(arg.as_ptr().add(j))));
    }
    let mut s = *sum;
    for j in 0..n {
        s = s.mul_add(st.ms[j], st.vs[j]);
    }
    *sum = s;
    st
}

/// The accumulator updates of `attend_block` for 8 * W columns: per row j, rescale by
/// ms[j] where the row set a new maximum, then acc = f16(fma(v_j, vs[j], acc)); V rows
/// `stride` floats apart.
#[inline(always)]
unsafe fn accumulate<const W: usize>(acc: *mut f32, v: *const f32, stride: usize, (rescale, ms, vs): (&[bool], &[f32], &[f32])) {
    let mut av: [__m256; W] = std::array::from_fn(|c| _mm256_loadu_ps(acc.add(8 * c)));
    for j in 0..vs.len() {
        if rescale[j] {
            let msv = _mm256_set1_ps(ms[j]);
            for a in av.iter_mut() {
                *a = round(_mm256_mul_ps(*a, msv));
            }
        }
        let vp = v.add(j * stride);
        let vsv = _mm256_set1_ps(vs[j]);
        for (c, a) in av.iter_mut().enumerate() {
            *a = round(_mm256_fmadd_ps(_mm256_loadu_ps(vp.add(8 * c)), vsv, *a));
        }
    }
    for (c, a) in av.iter().enumerate() {
        _mm256_storeu_ps(acc.add(8 * c), *a);
    }
}

#[inline(always)]
unsafe fn load_h(p: *const u16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

#[inline(always)]
unsafe fn round(v: __m256) -> __m256 {
    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
}

/// The sum of dot_f16's four 16-lane accumulators (lanes 0..7 in lo[i], 8..15 in
/// hi[i]) in ggml's order: acc0 + acc2, acc1 + acc3, their sum, then the lanes.
#[inline(always)]
unsafe fn reduce_lanes(lo: [__m256; 4], hi: [__m256; 4]) -> f32 {
    let l = _mm256_add_ps(_mm256_add_ps(lo[0], lo[2]), _mm256_add_ps(lo[1], lo[3]));
    let h = _mm256_add_ps(_mm256_add_ps(hi[0], hi[2]), _mm256_add_ps(hi[1], hi[3]));
    hsum(_mm256_add_ps(l, h))
}

/// Lane l + lane l+4, then +2, then +1 (as _mm512_reduce_add_ps after its first fold).
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f32_to_f16_row(src: &[f32], dst: &mut [u16]) {
    let n = src.len().min(dst.len());
    let n8 = n & !7;
    for i in (0..n8).step_by(8) {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
        _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
    }
    for i in n8..n {
        dst[i] = half::f16::from_f32(src[i]).to_bits();
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f16(x: &[u16], y: &[u16]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    // acc[j] lanes 0..7 in lo[j], 8..15 in hi[j].
    let mut lo = [_mm256_setzero_ps(); 4];
    let mut hi = [_mm256_setzero_ps(); 4];
    for c in (0..np).step_by(64) {
        for j in 0..4 {
            let i = c + 16 * j;
            lo[j] = _mm256_fmadd_ps(load_h(xp.add(i)), load_h(yp.add(i)), lo[j]);
            hi[j] = _mm256_fmadd_ps(load_h(xp.add(i + 8)), load_h(yp.add(i + 8)), hi[j]);
        }
    }
    let mut sum = reduce_lanes(lo, hi) as f64;
    for i in np..n {
        sum += (half::f16::from_bits(x[i]).to_f32() * half::f16::from_bits(y[i]).to_f32()) as f64;
    }
    sum as f32
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scale_rounded(acc: &mut [f32], s: f32) {
    let sv = _mm256_set1_ps(s);
    for i in (0..acc.len()).step_by(8) {
        let p = acc.as_mut_ptr().add(i);
        _mm256_storeu_ps(p, round(_mm256_mul_ps(_mm256_loadu_ps(p), sv)));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn mad_rounded(acc: &mut [f32], v: &[u16], s: f32) {
    let sv = _mm256_set1_ps(s);
    for i in (0..acc.len().min(v.len())).step_by(8) {
        let p = acc.as_mut_ptr().add(i);
        _mm256_storeu_ps(p, round(_mm256_fmadd_ps(load_h(v.as_ptr().add(i)), sv, _mm256_loadu_ps(p))));
    }
}
