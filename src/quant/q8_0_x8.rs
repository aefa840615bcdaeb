//! Q8_0 weights repacked eight rows at a time ("Q8_0 x8"), for the AVX-512 VNNI matmul of the
//! CPU backend (issue #18; the Q4_K counterpart is `q4_k_x8`).
//!
//! Why: the row-by-row Q8_0 dot works per 32-element block and output (a sign trick or an
//! offset correction per block, a float FMA per block, a horizontal sum per output). With eight
//! weight rows interleaved, one `vpdpbusd` multiplies 64 bytes of eight rows (two blocks each)
//! against the activation, one i32 lane per (row, block), and the float step per two blocks is
//! one 16-lane FMA for eight outputs.
//!
//! Signs: `vpdpbusd` multiplies unsigned by signed bytes. The weights are stored plus 128, as
//! unsigned bytes (w ^ 0x80), against the signed activation: sum((w + 128) * a) = sum(w * a) +
//! 128 * sum(a), and the correction -128 * sum(a) depends on the activation block only. It is
//! computed once per activation row (`prepare_act_row`) and starts each lane's integer sum.
//!
//! Weight layout: blocks are taken in pairs (b, b + 1), b even; a group of eight rows is its
//! `ceil(nb / 2)` pairs in order (`X8_PAIR_BYTES` = 576 bytes each; where nb is odd the last
//! pair's second block is padding: quants 0x80, i.e. w = 0, and scale 0), a tensor its groups
//! in row order. In one pair:
//! - `[0, 512)`: the quants, eight 64-byte loads; load j (0..8), i32 lane 2r + s holds
//!   w[row r, block b + s][4j .. 4j + 4] + 128, i.e. byte 64j + 8r + 4s + k is element 4j + k;
//! - `[512, 576)`: the scales d as f32 (the file's f16 converted once), lane 2r + s at
//!   512 + 4(2r + s).
//!
//! Activation layout (`prepare_act_row`, from the Q8_0 activation row: 32 int8 + f16 scale per
//! block): per pair (`ACT_PAIR_BYTES` = 80 bytes), `[0, 64)` the quants with block b's four
//! bytes 4j.. at 8j and block b+1's at 8j + 4 (one 8-byte broadcast feeds load j's lanes),
//! `[64, 72)` the two scales as f32, `[72, 80)` the two corrections -128 * sum(a) as i32
//! (padding: zeros).
//!
//! The float order (each output on its own; `dot_model` writes it out): two accumulators,
//! even and odd blocks, from 0; per block b an exact integer isum_b = sum(w * a) (|isum| <=
//! 2^19, exact as f32), then acc[b % 2] = fma(f32(isum_b), d_w * d_a, acc[b % 2]) with the
//! product d_w * d_a rounded to f32; the output is acc[0] + acc[1]. A tile's outputs do not
//! depend on the tile's width, so batched and single-row matmuls agree bit for bit. This is not
//! the row-by-row dot's order (`legacy::dot_q8_0`): results differ in the last bits.

use super::float::{f16_at, f32_at};
use super::legacy::{Q8_0_BYTES, QK};

/// Weight rows per repacked group.
pub const GROUP_ROWS: usize = 8;
/// Bytes of one pair of blocks of eight rows.
pub const X8_PAIR_BYTES: usize = 576;
/// Bytes of one pair of blocks of a prepared activation row.
pub const ACT_PAIR_BYTES: usize = 80;
const SCALES_AT: usize = 512;

fn pairs(cols: usize) -> usize {
    (cols / QK).div_ceil(2)
}

/// Bytes of the repacked form of a tensor of `rows` x `cols` (rows a multiple of 8, cols of 32).
pub fn repacked_bytes(rows: usize, cols: usize) -> usize {
    rows / GROUP_ROWS * pairs(cols) * X8_PAIR_BYTES
}

/// Bytes of one prepared activation row of `n` elements.
pub fn act_bytes(n: usize) -> usize {
    pairs(n) * ACT_PAIR_BYTES
}

/// Repacks eight consecutive row-major Q8_0 rows of `cols` elements (`src`, 8 * cols/32 * 34
/// bytes) into one group (`dst`, ceil(cols/64) * 576 bytes).
pub fn repack_group(src: &[u8], cols: usize, dst: &mut [u8]) {
    let nb = cols / QK;
    let row_bytes = nb * Q8_0_BYTES;
    assert!(
        cols.is_multiple_of(QK) && src.len() == GROUP_ROWS * row_bytes && dst.len() == pairs(cols) * X8_PAIR_BYTES,
        "q8_0_x8::repack_group: {} -> {} bytes",
        src.len(),
        dst.len()
    );
    for (p, out) in dst.chunks_exact_mut(X8_PAIR_BYTES).enumerate() {
        for r in 0..GROUP_ROWS {
            for s in 0..2 {
                let b = 2 * p + s;
                let lane = 2 * r + s;
                if b >= nb {
                    for j in 0..8 {
                        out[64 * j + 4 * lane..][..4].fill(0x80);
                    }
                    out[SCALES_AT + 4 * lane..][..4].copy_from_slice(&0f32.to_le_bytes());
                    continue;
                }
                let blk = &src[r * row_bytes + b * Q8_0_BYTES..][..Q8_0_BYTES];
                for j in 0..8 {
                    for k in 0..4 {
                        out[64 * j + 4 * lane + k] = blk[2 + 4 * j + k] ^ 0x80;
                    }
                }
                out[SCALES_AT + 4 * lane..][..4].copy_from_slice(&f16_at(blk, 0).to_le_bytes());
            }
        }
    }
}

/// Repacks a whole tensor (`rows` a multiple of 8) into `dst` (`repacked_bytes` long).
pub fn repack(src: &[u8], rows: usize, cols: usize, dst: &mut [u8]) {
    let (src_group, dst_group) = (GROUP_ROWS * (cols / QK) * Q8_0_BYTES, pairs(cols) * X8_PAIR_BYTES);
    assert!(rows.is_multiple_of(GROUP_ROWS) && src.len() == rows / GROUP_ROWS * src_group && dst.len() == rows / GROUP_ROWS * dst_group);
    for (s, d) in src.chunks_exact(src_group).zip(dst.chunks_exact_mut(dst_group)) {
        repack_group(s, cols, d);
    }
}

/// One Q8_0 activation row of `n` elements (`act`, n/32 blocks of f16 scale + 32 int8) in the
/// kernel's form (`dst`, `act_bytes(n)` long).
pub fn prepare_act_row(act: &[u8], n: usize, dst: &mut [u8]) {
    let nb = n / QK;
    assert!(n.is_multiple_of(QK) && act.len() == nb * Q8_0_BYTES && dst.len() == act_bytes(n), "q8_0_x8::prepare_act_row(n={n})");
    for (p, out) in dst.chunks_exact_mut(ACT_PAIR_BYTES).enumerate() {
        for s in 0..2 {
            let b = 2 * p + s;
            let (d, corr) = if b < nb {
                let blk = &act[b * Q8_0_BYTES..][..Q8_0_BYTES];
                for j in 0..8 {
                    out[8 * j + 4 * s..][..4].copy_from_slice(&blk[2 + 4 * j..][..4]);
                }
                let sum: i32 = blk[2..].iter().map(|&q| q as i8 as i32).sum();
                (f16_at(blk, 0), -128 * sum)
            } else {
                for j in 0..8 {
                    out[8 * j + 4 * s..][..4].fill(0);
                }
                (0f32, 0i32)
            };
            out[64 + 4 * s..][..4].copy_from_slice(&d.to_le_bytes());
            out[72 + 4 * s..][..4].copy_from_slice(&corr.to_le_bytes());
        }
    }
}

/// Whether this CPU runs the x8 kernel (AVX-512 VNNI; the CPU backend repacks Q8_0 weights only
/// then, and `CIVETTA_SIMD` below avx512vnni turns it off).
pub fn available() -> bool {
    super::simd::has_q8_0_x8()
}

/// out[r][t] = row r of a repacked group against prepared activation row t
/// (`prepare_act_row`), in this file's float order: the AVX-512 kernel where `available()`,
/// else the scalar code.
pub fn dot_group<const T: usize>(group: &[u8], act_rows: [&[u8]; T], n: usize, out: &mut [[f32; T]; GROUP_ROWS]) {
    assert!(
        n.is_multiple_of(QK) && group.len() == pairs(n) * X8_PAIR_BYTES && act_rows.iter().all(|a| a.len() == act_bytes(n)),
        "q8_0_x8::dot_group(n={n}): group {} bytes",
        group.len()
    );
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: the features were detected at run time and the lengths checked above.
        return unsafe { super::simd::dot_q8_0_x8(group, act_rows, n, out) };
    }
    dot_group_scalar(group, act_rows, n, out)
}

/// The float order of the x8 kernels, on one row-major Q8_0 row against one Q8_0 activation row.
pub fn dot_model(w_row: &[u8], a_row: &[u8], n: usize) -> f32 {
    let mut acc = [0f32; 2];
    for (b, (bw, ba)) in w_row.chunks_exact(Q8_0_BYTES).zip(a_row.chunks_exact(Q8_0_BYTES)).take(n / QK).enumerate() {
        let isum: i32 = bw[2..].iter().zip(&ba[2..]).map(|(&w, &a)| w as i8 as i32 * a as i8 as i32).sum();
        acc[b % 2] = (isum as f32).mul_add(f16_at(bw, 0) * f16_at(ba, 0), acc[b % 2]);
    }
    acc[0] + acc[1]
}

/// The same order on a repacked group: out[r][t] = row r of the group against act_rows[t]
/// (prepared).
pub fn dot_group_scalar<const T: usize>(group: &[u8], act_rows: [&[u8]; T], n: usize, out: &mut [[f32; T]; GROUP_ROWS]) {
    assert!(group.len() == pairs(n) * X8_PAIR_BYTES && act_rows.iter().all(|a| a.len() == act_bytes(n)));
    for (t, a) in act_rows.iter().enumerate() {
        let mut acc = [[0f32; 2]; GROUP_ROWS];
        for (blk, pa) in group.chunks_exact(X8_PAIR_BYTES).zip(a.chunks_exact(ACT_PAIR_BYTES)) {
            for (r, acc) in acc.iter_mut().enumerate() {
                for (s, acc) in acc.iter_mut().enumerate() {
                    let lane = 2 * r + s;
                    let mut isum = i32::from_le_bytes(pa[72 + 4 * s..][..4].try_into().unwrap());
                    for j in 0..8 {
                        for k in 0..4 {
                            isum += blk[64 * j + 4 * lane + k] as i32 * pa[8 * j + 4 * s + k] as i8 as i32;
                        }
                    }
                    let scale = f32_at(blk, SCALES_AT + 4 * lane) * f32_at(pa, 64 + 4 * s);
                    *acc = (isum as f32).mul_add(scale, *acc);
                }
            }
        }
        for r in 0..GROUP_ROWS {
            out[r][t] = acc[r][0] + acc[r][1];
        }
    }
}
