//! The AVX-512 VNNI kernel of the repacked Q8_0 weights (`quant::q8_0_x8`: eight rows per
//! group, two blocks per pair, its float order). Per pair of blocks, eight 64-byte loads hold
//! eight rows x two blocks x 32 quants (plus 128, unsigned; lane 2r + s: row r, block b + s).
//! For each activation row, `vpdpbusd` against 8 bytes of the prepared activation broadcast
//! (block b's four bytes in the even lanes, b+1's in the odd) adds 4 products per lane; the
//! lane's sum starts at the activation block's correction -128 * sum(a), so after the eight
//! steps it is the exact isum of (row r, block b + s). Then one convert, one multiply of the
//! weight scales by the activation scales and one FMA per pair for eight outputs: 8 multiply
//! instructions per 512 products and no horizontal sums but one per output at the end.

use std::arch::x86_64::*;

use super::super::super::q8_0_x8::{act_bytes, ACT_PAIR_BYTES, GROUP_ROWS, X8_PAIR_BYTES};

/// out[r][t] = row r of the group against prepared activation row t, in `q8_0_x8`'s order.
///
/// # Safety
/// avx512f/bw/vl/vnni must be available; `group` holds ceil(n / 64) pairs of 576 bytes and
/// every activation row `act_bytes(n)` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[allow(clippy::needless_range_loop)] // indices into several register arrays at once
pub(crate) unsafe fn dot_group<const T: usize>(group: &[u8], act_rows: [&[u8]; T], n: usize, out: &mut [[f32; T]; GROUP_ROWS]) {
    let np = group.len() / X8_PAIR_BYTES;
    debug_assert!(np * X8_PAIR_BYTES == group.len() && act_rows.iter().all(|a| a.len() == act_bytes(n) && a.len() == np * ACT_PAIR_BYTES));
    let mut acc = [_mm512_setzero_ps(); T];
    let g = group.as_ptr();
    let a0: [*const u8; T] = std::array::from_fn(|t| act_rows[t].as_ptr());
    for p in 0..np {
        let blk = g.add(p * X8_PAIR_BYTES);
        let wq: [__m512i; 8] = std::array::from_fn(|j| _mm512_loadu_si512(blk.add(64 * j) as *const _));
        let dw = _mm512_loadu_ps(blk.add(512) as *const f32);
        for t in 0..T {
            let a = a0[t].add(p * ACT_PAIR_BYTES);
            let bc = |at: usize| _mm512_set1_epi64((a.add(at) as *const i64).read_unaligned());
            let isum = if T <= 2 {
                // Two dependency chains where few activation rows give little other work.
                let mut s0 = bc(72);
                let mut s1 = _mm512_setzero_si512();
                for j in 0..4 {
                    s0 = _mm512_dpbusd_epi32(s0, wq[2 * j], bc(16 * j));
                    s1 = _mm512_dpbusd_epi32(s1, wq[2 * j + 1], bc(16 * j + 8));
                }
                _mm512_add_epi32(s0, s1)
            } else {
                let mut s = bc(72);
                for j in 0..8 {
                    s = _mm512_dpbusd_epi32(s, wq[j], bc(8 * j));
                }
                s
            };
            let scale = _mm512_mul_ps(dw, _mm512_castsi512_ps(bc(64)));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[t]);
        }
    }
    for t in 0..T {
        // Lanes 2r (even blocks) + 2r + 1 (odd blocks).
        let sum = _mm512_add_ps(acc[t], _mm512_permute_ps::<0xB1>(acc[t]));
        let mut v = [0f32; 16];
        _mm512_storeu_ps(v.as_mut_ptr(), sum);
        for r in 0..GROUP_ROWS {
            out[r][t] = v[2 * r];
        }
    }
}
