//! The AVX-512 VNNI kernel of the repacked Q4_K weights (`quant::q4_k_x8`: eight rows per
//! group, its float order). Per chunk p of a super-block, four 64-byte loads hold eight rows x
//! 32 nibble bytes (lane 2r + h: row r, half h); low and high nibbles are sub-blocks 2p and
//! 2p+1. For each activation row, `vpdpbusd` against the activation's eight bytes broadcast
//! sums 16 products per lane (|sum| <= 16 * 15 * 128, an i16), `vpackssdw` puts both halves of
//! a row side by side as i16 and one `vpdpwssd` against (scale, scale) adds
//! scale * (half 0 + half 1) to the row's lane: 10 multiply-pipe instructions per 512 products
//! (the row-by-row kernel needs 16). The mins take two `vpdpwssd` per super-block.

use std::arch::x86_64::*;

use super::super::super::k_quants::{Q8_K_BYTES, QK_K};
use super::super::super::q4_k_x8::{GROUP_ROWS, X8_BLOCK_BYTES};

/// `vpermb` index of the (scale, scale) i16 pairs of chunk p: i32 lane m = 4k + 2s + r' (the
/// lane order `vpackssdw` leaves: per 128-bit lane k, sub-block 2p+s of row 2k + r') takes the
/// scale byte 8(2p+s) + 2k + r' into its bytes 0 and 2 (bytes 1 and 3 are zeroed by the mask).
const fn scale_index(p: usize) -> [u8; 64] {
    let mut idx = [0u8; 64];
    let mut m = 0;
    while m < 16 {
        let (k, s, r) = (m / 4, (m / 2) % 2, m % 2);
        let src = (8 * (2 * p + s) + 2 * k + r) as u8;
        idx[4 * m] = src;
        idx[4 * m + 2] = src;
        m += 1;
    }
    idx
}

/// `vpermb` index of the min pairs for chunks 2q2, 2q2+1: i32 lane L = 8h + r holds
/// (min[2q][r], min[2q+1][r]) with q = 2 q2 + h.
const fn min_index(q2: usize) -> [u8; 64] {
    let mut idx = [0u8; 64];
    let mut l = 0;
    while l < 16 {
        let (h, r) = (l / 8, l % 8);
        let q = 2 * q2 + h;
        idx[4 * l] = (8 * (2 * q) + r) as u8;
        idx[4 * l + 2] = (8 * (2 * q + 1) + r) as u8;
        l += 1;
    }
    idx
}

static SCALE_INDEX: [[u8; 64]; 4] = [scale_index(0), scale_index(1), scale_index(2), scale_index(3)];
static MIN_INDEX: [[u8; 64]; 2] = [min_index(0), min_index(1)];
/// Even bytes of every i16 pair: the byte, odd bytes zero.
const EVEN_BYTES: u64 = 0x5555_5555_5555_5555;

/// out[r][t] = row r of the group against activation row t (Q8_K), in `q4_k_x8`'s order.
///
/// # Safety
/// avx512f/bw/vl/vnni/vbmi, fma and f16c must be available; `group` holds `nb` super-blocks of
/// 1184 bytes and every activation row `nb` Q8_K blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // indices into several register arrays at once
pub(crate) unsafe fn dot_group<const T: usize>(group: &[u8], act_rows: [&[u8]; T], n: usize, out: &mut [[f32; T]; GROUP_ROWS]) {
    let nb = n / QK_K;
    debug_assert!(group.len() == nb * X8_BLOCK_BYTES && act_rows.iter().all(|a| a.len() == nb * Q8_K_BYTES));
    let low4 = _mm512_set1_epi8(0x0F);
    let scale_idx: [__m512i; 4] = std::array::from_fn(|p| _mm512_loadu_si512(SCALE_INDEX[p].as_ptr() as *const _));
    let min_idx: [__m512i; 2] = std::array::from_fn(|q| _mm512_loadu_si512(MIN_INDEX[q].as_ptr() as *const _));
    let rows_of_packed = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    let pairs_01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let pairs_23 = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    let mut acc = [_mm256_setzero_ps(); T];
    let g = group.as_ptr();
    for b in 0..nb {
        let blk = g.add(b * X8_BLOCK_BYTES);
        let scales = _mm512_loadu_si512(blk.add(32) as *const _);
        let mins = _mm512_loadu_si512(blk.add(96) as *const _);
        let mins01 = _mm512_maskz_permutexvar_epi8(EVEN_BYTES, min_idx[0], mins);
        let mins23 = _mm512_maskz_permutexvar_epi8(EVEN_BYTES, min_idx[1], mins);
        let mut isum = [_mm512_setzero_si512(); T];
        for p in 0..4 {
            let sc = _mm512_maskz_permutexvar_epi8(EVEN_BYTES, scale_idx[p], scales);
            let qs = blk.add(160 + 256 * p);
            let raw: [__m512i; 4] = std::array::from_fn(|c| _mm512_loadu_si512(qs.add(64 * c) as *const _));
            let lo: [__m512i; 4] = std::array::from_fn(|c| _mm512_and_si512(raw[c], low4));
            let hi: [__m512i; 4] = std::array::from_fn(|c| _mm512_and_si512(_mm512_srli_epi16::<4>(raw[c]), low4));
            for t in 0..T {
                let a = act_rows[t].as_ptr().add(b * Q8_K_BYTES + 4 + 64 * p);
                let mut sum_lo = _mm512_setzero_si512();
                let mut sum_hi = _mm512_setzero_si512();
                for c in 0..4 {
                    let a_lo = _mm512_set1_epi64((a.add(8 * c) as *const i64).read_unaligned());
                    let a_hi = _mm512_set1_epi64((a.add(32 + 8 * c) as *const i64).read_unaligned());
                    sum_lo = _mm512_dpbusd_epi32(sum_lo, lo[c], a_lo);
                    sum_hi = _mm512_dpbusd_epi32(sum_hi, hi[c], a_hi);
                }
                isum[t] = _mm512_dpwssd_epi32(isum[t], _mm512_packs_epi32(sum_lo, sum_hi), sc);
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(blk as *const _));
        let dminw = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16) as *const _));
        for t in 0..T {
            let ba = act_rows[t].as_ptr().add(b * Q8_K_BYTES);
            // Per 128-bit lane k: [sub-block 2p of rows 2k, 2k+1; 2p+1 of rows 2k, 2k+1]:
            // add the two halves, then gather rows 0..7 into the low eight lanes.
            let s = _mm512_add_epi32(isum[t], _mm512_shuffle_epi32::<0x4E>(isum[t]));
            let rows = _mm512_castsi512_si256(_mm512_permutexvar_epi32(rows_of_packed, s));
            let bsums = _mm256_loadu_si256(ba.add(260) as *const _);
            let bs8 = _mm512_castsi128_si512(_mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256::<1>(bsums)));
            let m = _mm512_dpwssd_epi32(
                _mm512_madd_epi16(mins01, _mm512_permutexvar_epi32(pairs_01, bs8)),
                mins23,
                _mm512_permutexvar_epi32(pairs_23, bs8),
            );
            let m8 = _mm256_add_epi32(_mm512_castsi512_si256(m), _mm512_extracti64x4_epi64::<1>(m));
            let da = _mm256_set1_ps((ba as *const f32).read_unaligned());
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(rows), _mm256_mul_ps(dw, da), acc[t]);
            acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m8), _mm256_mul_ps(dminw, da), acc[t]);
        }
    }
    for t in 0..T {
        let mut v = [0f32; 8];
        _mm256_storeu_ps(v.as_mut_ptr(), acc[t]);
        for r in 0..GROUP_ROWS {
            out[r][t] = v[r];
        }
    }
}
