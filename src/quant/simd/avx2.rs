//! AVX2 + FMA + F16C dot kernels (ggml's x86 approach): one 32-element block per 256-bit
//! register, `vpmaddubsw` for u8 x i8 products (Q8_0 weights via the sign trick), `vpmaddwd`
//! to widen (with the sub-block scales for the K-quants), one f32 FMA per block.
//!
//! Every load is unaligned, so rows may start anywhere.

use super::super::k_quants::{unpack_scales_mins_k4, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, Q8_K_BYTES};
use super::super::legacy::{Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q5_1_BYTES, Q8_0_BYTES, Q8_1_BYTES};
use super::GgmlType;
use std::arch::x86_64::*;

pub(super) mod tiles;

/// # Safety
/// The CPU must support avx2, fma and f16c; the rows must hold n elements.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot(t: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    match t {
        GgmlType::F32 => dot_f32(w, a, n),
        GgmlType::F16 => dot_f16(w, a, n),
        GgmlType::BF16 => dot_bf16(w, a, n),
        GgmlType::Q8_0 => dot_q8_0(w, a, n),
        GgmlType::Q4_0 => dot_q4_0(w, a, n),
        GgmlType::Q4_1 => dot_q4_1(w, a, n),
        GgmlType::Q5_0 => dot_q5_0(w, a, n),
        GgmlType::Q5_1 => dot_q5_1(w, a, n),
        GgmlType::Q4_K => dot_q4_k(w, a, n),
        GgmlType::Q5_K => dot_q5_k(w, a, n),
        GgmlType::Q6_K => dot_q6_k(w, a, n),
        _ => super::dot_scalar(t, w, a, n),
    }
}

/// f16 to f32 with F16C, inline (half's conversion goes through a run-time dispatch call).
#[inline(always)]
unsafe fn f16c(h: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

#[inline(always)]
unsafe fn rd16(p: *const u8) -> u32 {
    (p as *const u16).read_unaligned() as u32
}

#[inline(always)]
unsafe fn loadu256(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// The 32 levels (0..=15) of a 4-bit block whose 16 nibble bytes start at p.
#[inline(always)]
unsafe fn nibbles_16(p: *const u8) -> __m256i {
    let t = _mm_loadu_si128(p as _);
    let both = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4));
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Broadcast of the f32 product of the f16 values at p and q.
#[inline(always)]
unsafe fn scale_product(p: *const u8, q: *const u8) -> __m256 {
    let f = _mm_cvtph_ps(_mm_cvtsi32_si128((rd16(p) | rd16(q) << 16) as i32));
    _mm256_broadcastss_ps(_mm_mul_ss(f, _mm_movehdup_ps(f)))
}

/// Sum of adjacent pairs of i16 lanes into i32 lanes.
#[inline(always)]
unsafe fn widen(v: __m256i) -> __m256i {
    _mm256_madd_epi16(v, _mm256_set1_epi16(1))
}

#[inline(always)]
pub(crate) unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = _mm256_setzero_ps();
    for i in 0..n / 32 {
        let (bw, ba) = (wp.add(i * Q8_0_BYTES), ap.add(i * Q8_0_BYTES));
        let (wq, aq) = (loadu256(bw.add(2)), loadu256(ba.add(2)));
        // |w| (u8) times a with w's sign; |w| <= 128 and |a| <= 127 keep pairs within i16.
        let p = _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(aq, wq));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(widen(p)), scale_product(bw, ba), acc);
    }
    hsum256(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let eight = _mm256_set1_epi8(8);
    let mut acc = _mm256_setzero_ps();
    for i in 0..n / 32 {
        let (bw, ba) = (wp.add(i * Q4_0_BYTES), ap.add(i * Q8_0_BYTES));
        let aq = loadu256(ba.add(2));
        // sum((q - 8) * a) = sum(q * a) - sum(8 * a), both exact in i16 pairs.
        let p = _mm256_sub_epi16(_mm256_maddubs_epi16(nibbles_16(bw.add(2)), aq), _mm256_maddubs_epi16(eight, aq));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(widen(p)), scale_product(bw, ba), acc);
    }
    hsum256(acc)
}

/// 0x10 in byte j where bit j of the little-endian u32 at p is set (the fifth bit of the
/// Q5_0/Q5_1 levels; ggml's bytes_from_bits_32, masked to the bit's value).
#[inline(always)]
unsafe fn fifth_bits_32(p: *const u8) -> __m256i {
    let bits = (p as *const u32).read_unaligned() as i32;
    // Byte j of the result looks at byte j / 8 of the u32 (shuffles stay in 128-bit lanes,
    // so the broadcast gives each lane all four bytes) and at bit j % 8 of it.
    let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits), shuf);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)), _mm256_set1_epi64x(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// Q5_0 x Q8_0: like `dot_q4_0`, with the fifth bit or-ed into the nibbles and the offset 16.
/// Also run by the AVX-512 level.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_q5_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let sixteen = _mm256_set1_epi8(16);
    let mut acc = _mm256_setzero_ps();
    for i in 0..n / 32 {
        let (bw, ba) = (wp.add(i * Q5_0_BYTES), ap.add(i * Q8_0_BYTES));
        let aq = loadu256(ba.add(2));
        let q = _mm256_or_si256(nibbles_16(bw.add(6)), fifth_bits_32(bw.add(2)));
        // sum((q - 16) * a) = sum(q * a) - sum(16 * a); q <= 31 keeps the i16 pairs exact.
        let p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, aq), _mm256_maddubs_epi16(sixteen, aq));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(widen(p)), scale_product(bw, ba), acc);
    }
    hsum256(acc)
}

/// Q5_1 x Q8_1 in `dot_q4_1`'s order (m*s terms apart, added after the horizontal sum).
/// Also run by the AVX-512 level.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_q5_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    for i in 0..n / 32 {
        let (bw, ba) = (wp.add(i * Q5_1_BYTES), ap.add(i * Q8_1_BYTES));
        let q = _mm256_or_si256(nibbles_16(bw.add(8)), fifth_bits_32(bw.add(4)));
        let dot = widen(_mm256_maddubs_epi16(q, loadu256(ba.add(4))));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale_product(bw, ba), acc);
        summs += f16c(rd16(bw.add(2)) as u16) * f16c(rd16(ba.add(2)) as u16);
    }
    hsum256(acc) + summs
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    // ggml_vec_dot_q4_1_q8_1's order: one FMA per block into 8 lanes, the m*s terms summed
    // apart in scalar, added after the horizontal sum.
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    for i in 0..n / 32 {
        let (bw, ba) = (wp.add(i * Q4_1_BYTES), ap.add(i * Q8_1_BYTES));
        let dot = widen(_mm256_maddubs_epi16(nibbles_16(bw.add(4)), loadu256(ba.add(4))));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale_product(bw, ba), acc);
        summs += f16c(rd16(bw.add(2)) as u16) * f16c(rd16(ba.add(2)) as u16);
    }
    hsum256(acc) + summs
}

/// A tile of Q4_1 dots: R weight rows against T Q8_1 activation rows (prefill uses 1 x 4,
/// decode 4 x 1), every result bit for bit `dot_q4_1`'s — each output keeps its own
/// accumulator, block order and scale products — with each weight block unpacked once per
/// tile and each activation block loaded once per tile. R * T independent FMA chains also
/// hide the FMA latency that bounds a single dot. Each weight row's block is prefetched
/// `prefetch` bytes ahead (a hint, any value is safe; 0 touches the block being read).
///
/// # Safety
/// avx2/fma/f16c; every row holds `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_q4_1_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nb: usize,
    prefetch: usize,
) -> [[f32; T]; R] {
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let mut summs = [[0f32; T]; R];
    for i in 0..nb {
        // The activation blocks first, then one weight row at a time (unpacked, used for
        // every activation row, dropped): few registers live, no spills at 4 x 1.
        let mut qa = [_mm256_setzero_si256(); T];
        let mut ds_a = [_mm_setzero_ps(); T]; // [d, s] per activation row
        for t in 0..T {
            let ba = a[t].add(i * Q8_1_BYTES);
            qa[t] = loadu256(ba.add(4));
            ds_a[t] = _mm_cvtph_ps(_mm_cvtsi32_si128((rd16(ba) | rd16(ba.add(2)) << 16) as i32));
        }
        for r in 0..R {
            let bw = w[r].add(i * Q4_1_BYTES);
            // Never faults; past the matrix it only wastes a fetch.
            _mm_prefetch::<_MM_HINT_T0>(bw.wrapping_add(prefetch) as *const i8);
            let q = nibbles_16(bw.add(4));
            let dm_w = _mm_cvtph_ps(_mm_cvtsi32_si128((rd16(bw) | rd16(bw.add(2)) << 16) as i32)); // [d, m]
            for t in 0..T {
                let dot = widen(_mm256_maddubs_epi16(q, qa[t]));
                let p = _mm_mul_ps(dm_w, ds_a[t]); // [d_w * d_a, m_w * s_a]
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcastss_ps(p), acc[r][t]);
                summs[r][t] += _mm_cvtss_f32(_mm_movehdup_ps(p));
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            out[r][t] = hsum256(acc[r][t]) + summs[r][t];
        }
    }
    out
}

/// `dot_q4_1_tile::<1, 4>` with the activation scales given as f32, block-major (d[i *
/// stride + t], s likewise, t = 0..3): the same products and sums, bit for bit, with fewer
/// instructions per block (no per-token f16 conversion or broadcast, the four m * s terms
/// in one vector).
///
/// # Safety
/// avx2/fma/f16c; w and the four rows hold `nb` blocks; d and s hold `(nb - 1) * stride + 4`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_q4_1_x4_scaled(
    w: *const u8,
    a: [*const u8; 4],
    d: *const f32,
    s: *const f32,
    stride: usize,
    nb: usize,
) -> [f32; 4] {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut summs = _mm_setzero_ps();
    for i in 0..nb {
        let bw = w.add(i * Q4_1_BYTES);
        let q = nibbles_16(bw.add(4));
        let dm_w = _mm_cvtph_ps(_mm_cvtsi32_si128((rd16(bw) | rd16(bw.add(2)) << 16) as i32)); // [d, m]
        let d_w = _mm256_broadcastss_ps(dm_w);
        let m_w = _mm_permute_ps::<0b01_01_01_01>(dm_w);
        summs = _mm_add_ps(summs, _mm_mul_ps(m_w, _mm_loadu_ps(s.add(i * stride))));
        let da = d.add(i * stride);
        for t in 0..4 {
            let dot = widen(_mm256_maddubs_epi16(q, loadu256(a[t].add(i * Q8_1_BYTES + 4))));
            let scale = _mm256_mul_ps(d_w, _mm256_broadcast_ss(&*da.add(t)));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[t]);
        }
    }
    let mut m = [0f32; 4];
    _mm_storeu_ps(m.as_mut_ptr(), summs);
    [hsum256(acc[0]) + m[0], hsum256(acc[1]) + m[1], hsum256(acc[2]) + m[2], hsum256(acc[3]) + m[3]]
}

/// Decode's matrix-vector product over consecutive Q4_1 weight rows (`out.len()` rows of
/// `nb` blocks, `row_bytes` apart): four rows at a time through the 4 x 1 tile, the rest one
/// by one; one call per row range, so no per-row dispatch or checks. Results bit for bit
/// `dot_q4_1`'s.
///
/// # Safety
/// avx2/fma/f16c; w holds out.len() rows, a holds nb blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_q4_1_rows(w: *const u8, row_bytes: usize, a: *const u8, nb: usize, out: &mut [f32]) {
    let rows = out.len();
    let prefetch = super::PREFETCH_ROWS * row_bytes;
    let mut r = 0;
    while r + 4 <= rows {
        let v = dot_q4_1_tile::<4, 1>(std::array::from_fn(|i| w.add((r + i) * row_bytes)), [a], nb, prefetch);
        for i in 0..4 {
            out[r + i] = v[i][0];
        }
        r += 4;
    }
    for (r, o) in out.iter_mut().enumerate().skip(r) {
        let [[v]] = dot_q4_1_tile::<1, 1>([w.add(r * row_bytes)], [a], nb, prefetch);
        *o = v;
    }
}

/// Q8_K parts of one activation super-block: (d, pointer to the 256 quants, group sums).
#[inline(always)]
unsafe fn q8k(ba: *const u8) -> (f32, *const u8, __m256i) {
    ((ba as *const f32).read_unaligned(), ba.add(4), loadu256(ba.add(260)))
}

/// Per super-block of Q4_K/Q5_K: d*da*sum_sb(scale*sum(q*a)) - dmin*da*sum_g(min*bsum).
/// `levels(c)` gives chunk c's sub-blocks 2c and 2c+1 as two registers of 32 levels.
#[inline(always)]
unsafe fn kx_superblock(
    bw: *const u8,
    ba: *const u8,
    mut levels: impl FnMut(usize) -> (__m256i, __m256i),
    acc: &mut __m256,
    acc_min: &mut __m256,
) {
    let (da, qa, bsums) = q8k(ba);
    let (sc, mn) = unpack_scales_mins_k4(&*(bw.add(4) as *const [u8; 12]));
    let mut isum = _mm256_setzero_si256();
    for c in 0..4 {
        let (lo, hi) = levels(c);
        let p_lo = _mm256_maddubs_epi16(lo, loadu256(qa.add(64 * c)));
        let p_hi = _mm256_maddubs_epi16(hi, loadu256(qa.add(64 * c + 32)));
        let s_lo = _mm256_set1_epi16((sc >> (16 * c)) as u8 as i16);
        let s_hi = _mm256_set1_epi16((sc >> (16 * c + 8)) as u8 as i16);
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p_lo, s_lo));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p_hi, s_hi));
    }
    let mv = _mm_cvtsi64_si128(mn as i64);
    let mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv));
    let msum = _mm256_madd_epi16(bsums, mins16);
    let d = f16c(rd16(bw) as u16) * da;
    let dmin = f16c(rd16(bw.add(2)) as u16) * da;
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d), *acc);
    *acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(dmin), *acc_min);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let m0f = _mm256_set1_epi8(0x0F);
    let (mut acc, mut acc_min) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for i in 0..n / 256 {
        let bw = wp.add(i * Q4_K_BYTES);
        let levels = |c: usize| {
            let raw = loadu256(bw.add(16 + 32 * c));
            (_mm256_and_si256(raw, m0f), _mm256_and_si256(_mm256_srli_epi16(raw, 4), m0f))
        };
        kx_superblock(bw, ap.add(i * Q8_K_BYTES), levels, &mut acc, &mut acc_min);
    }
    hsum256(acc) - hsum256(acc_min)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let m0f = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let (mut acc, mut acc_min) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for i in 0..n / 256 {
        let bw = wp.add(i * Q5_K_BYTES);
        let qh = loadu256(bw.add(16));
        let levels = |c: usize| {
            let raw = loadu256(bw.add(48 + 32 * c));
            // Fifth bits: bit 2c (low sub-block) and 2c+1 (high), moved to bit 4.
            let h_lo = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32)), one);
            let h_hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32 + 1)), one);
            (
                _mm256_or_si256(_mm256_and_si256(raw, m0f), _mm256_slli_epi16(h_lo, 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m0f), _mm256_slli_epi16(h_hi, 4)),
            )
        };
        kx_superblock(bw, ap.add(i * Q8_K_BYTES), levels, &mut acc, &mut acc_min);
    }
    hsum256(acc) - hsum256(acc_min)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q6_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let m0f = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    let mut acc = _mm256_setzero_ps();
    for i in 0..n / 256 {
        let bw = wp.add(i * Q6_K_BYTES);
        let (da, qa, bsums) = q8k(ap.add(i * Q8_K_BYTES));
        let sc8 = _mm_loadu_si128(bw.add(192) as _);
        let mut isum = _mm256_setzero_si256();
        for h in 0..2 {
            let ql0 = loadu256(bw.add(64 * h));
            let ql1 = loadu256(bw.add(64 * h + 32));
            let qh = loadu256(bw.add(128 + 32 * h));
            // Elements 32k..32k+31 of this half; the 0x30 mask drops bits shifted across bytes.
            let q = [
                _mm256_or_si256(_mm256_and_si256(ql0, m0f), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
                _mm256_or_si256(_mm256_and_si256(ql1, m0f), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m0f), _mm256_and_si256(qh, m30)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m0f), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30)),
            ];
            for (k, q) in q.into_iter().enumerate() {
                let p = _mm256_maddubs_epi16(q, loadu256(qa.add(128 * h + 32 * k)));
                // Scales of groups g and g+1 (16 elements = 8 i16 lanes each).
                let g = (8 * h + 2 * k) as i8;
                let pick = _mm_setr_epi8(g, g, g, g, g, g, g, g, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1);
                let s = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pick));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, s));
            }
        }
        // The levels are stored +32: subtract 32 * sum_g(scale_g * bsum_g).
        let offset = _mm256_slli_epi32(_mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), bsums), 5);
        isum = _mm256_sub_epi32(isum, offset);
        let d = f16c(rd16(bw.add(208)) as u16) * da;
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d), acc);
    }
    hsum256(acc)
}

#[inline(always)]
unsafe fn dot_floats(t: GgmlType, w: &[u8], a: &[u8], n: usize, load: impl Fn(*const u8) -> __m256) -> f32 {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let elem = t.type_size();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, acc) in acc.iter_mut().enumerate() {
            let j = i + 8 * k;
            *acc = _mm256_fmadd_ps(load(wp.add(j * elem)), _mm256_loadu_ps(ap.add(4 * j) as _), *acc);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(load(wp.add(i * elem)), _mm256_loadu_ps(ap.add(4 * i) as _), acc[0]);
        i += 8;
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    hsum256(s) + super::dot_float_tail(t, w, a, n, i)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    dot_floats(GgmlType::F32, w, a, n, |p| _mm256_loadu_ps(p as _))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16(w: &[u8], a: &[u8], n: usize) -> f32 {
    dot_floats(GgmlType::F16, w, a, n, |p| _mm256_cvtph_ps(_mm_loadu_si128(p as _)))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_bf16(w: &[u8], a: &[u8], n: usize) -> f32 {
    dot_floats(GgmlType::BF16, w, a, n, |p| _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p as _)), 16)))
}
