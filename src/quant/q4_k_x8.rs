//! Q4_K weights repacked eight rows at a time ("Q4_K x8"), for the AVX-512 VNNI matmul of the
//! CPU backend (llama.cpp's CPU_REPACK does the same for its Q4_K GEMM, in its own layout).
//!
//! Why: the row-by-row Q4_K dot keeps 16 f32 lanes per output and super-block, so a quarter
//! of its time is float work per output (docs/PERF.md, issue #18). With eight weight rows
//! interleaved, one i32 lane holds one row's products, the sub-block scales apply to eight
//! rows at once, and the float step per super-block is one 8-lane FMA for eight outputs.
//!
//! Layout of one super-block of eight rows (`X8_BLOCK_BYTES` = 1184 bytes; a group of eight
//! rows is its `n / 256` super-blocks in order, a tensor its groups in row order):
//! - `[0, 16)`: d of rows 0..7 (f16); `[16, 32)`: dmin of rows 0..7 (f16);
//! - `[32, 96)`: the 6-bit scales unpacked to bytes, `scale[j][row]` at 32 + 8j + row;
//! - `[96, 160)`: the mins likewise, `min[j][row]` at 96 + 8j + row;
//! - `[160, 1184)`: the nibbles. The row-major Q4_K block keeps them as four 32-byte chunks
//!   (chunk p: sub-block 2p in the low nibbles, 2p+1 in the high). Here, for chunk p and
//!   quarter c (8 bytes), each row's bytes `qs[32p + 8c .. +8]` sit side by side:
//!   row r's four bytes `qs[32p + 8c + 4h .. +4]` (h = 0, 1) at 160 + 256p + 64c + 8r + 4h,
//!   so one 64-byte load is 16 i32 lanes, lane 2r + h.
//!
//! The float order (each output on its own; `dot_model` writes it out): per super-block
//! an exact integer isum = sum_j scale_j * sum(q * a) and imin = sum_j min_j * (bsum_2j +
//! bsum_2j+1), then acc = fma(f32(isum), d * d_a, acc) and acc = fma(-f32(imin), dmin * d_a,
//! acc), from acc = 0. No horizontal sum: a tile's outputs do not depend on the tile's shape,
//! so batched and single-row matmuls agree bit for bit. This is not the row-by-row dot's
//! order (`k_quants::dot_q4_k`, the AVX-512 one-row kernel): results differ in the last bits.

use super::float::{f16_at, f32_at};
use super::k_quants::{scale_min_k4, Q4_K_BYTES, Q8_K_BYTES, QK_K};

/// Weight rows per repacked group.
pub const GROUP_ROWS: usize = 8;
/// Bytes of one super-block of eight rows.
pub const X8_BLOCK_BYTES: usize = 1184;
const QS_AT: usize = 160;

/// Bytes of the repacked form of a tensor of `rows` x `cols` (rows a multiple of 8, cols of 256).
pub fn repacked_bytes(rows: usize, cols: usize) -> usize {
    rows / GROUP_ROWS * (cols / QK_K) * X8_BLOCK_BYTES
}

/// Repacks eight consecutive row-major Q4_K rows of `cols` elements (`src`, 8 * cols/256 * 144
/// bytes) into one group (`dst`, cols/256 * 1184 bytes).
pub fn repack_group(src: &[u8], cols: usize, dst: &mut [u8]) {
    let nb = cols / QK_K;
    let row_bytes = nb * Q4_K_BYTES;
    assert!(src.len() == GROUP_ROWS * row_bytes && dst.len() == nb * X8_BLOCK_BYTES, "repack_group: {} -> {} bytes", src.len(), dst.len());
    for b in 0..nb {
        let out = &mut dst[b * X8_BLOCK_BYTES..(b + 1) * X8_BLOCK_BYTES];
        for r in 0..GROUP_ROWS {
            let blk = &src[r * row_bytes + b * Q4_K_BYTES..][..Q4_K_BYTES];
            out[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
            out[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&blk[2..4]);
            for j in 0..8 {
                let (sc, m) = scale_min_k4(j, &blk[4..16]);
                out[32 + 8 * j + r] = sc;
                out[96 + 8 * j + r] = m;
            }
            let qs = &blk[16..16 + 128];
            for p in 0..4 {
                for c in 0..4 {
                    for h in 0..2 {
                        let at = QS_AT + 256 * p + 64 * c + 8 * r + 4 * h;
                        out[at..at + 4].copy_from_slice(&qs[32 * p + 8 * c + 4 * h..][..4]);
                    }
                }
            }
        }
    }
}

/// Repacks a whole tensor (`rows` a multiple of 8) into `dst` (`repacked_bytes` long).
pub fn repack(src: &[u8], rows: usize, cols: usize, dst: &mut [u8]) {
    let (src_group, dst_group) = (GROUP_ROWS * (cols / QK_K) * Q4_K_BYTES, (cols / QK_K) * X8_BLOCK_BYTES);
    assert!(rows.is_multiple_of(GROUP_ROWS) && src.len() == rows / GROUP_ROWS * src_group && dst.len() == rows / GROUP_ROWS * dst_group);
    for (s, d) in src.chunks_exact(src_group).zip(dst.chunks_exact_mut(dst_group)) {
        repack_group(s, cols, d);
    }
}

/// Whether this CPU runs the x8 kernel (AVX-512 VNNI with VBMI's byte permute; the CPU
/// backend repacks Q4_K weights only then, and `CIVETTA_SIMD` below avx512vnni turns it off).
pub fn available() -> bool {
    super::simd::has_q4_k_x8()
}

/// out[r][t] = row r of a repacked group (`n / 256` super-blocks) against Q8_K activation row
/// t, in this file's float order: the AVX-512 kernel where `available()`, else the scalar code.
pub fn dot_group<const T: usize>(group: &[u8], act_rows: [&[u8]; T], n: usize, out: &mut [[f32; T]; GROUP_ROWS]) {
    let nb = n / QK_K;
    assert!(
        n.is_multiple_of(QK_K) && group.len() == nb * X8_BLOCK_BYTES && act_rows.iter().all(|a| a.len() == nb * Q8_K_BYTES),
        "q4_k_x8::dot_group(n={n}): group {} bytes",
        group.len()
    );
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: the features were detected at run time and the lengths checked above.
        return unsafe { super::simd::dot_q4_k_x8(group, act_rows, n, out) };
    }
    dot_group_scalar(group, act_rows, n, out)
}

/// The float order of the x8 kernels, on one row-major Q4_K row against one Q8_K row.
pub fn dot_model(w_row: &[u8], a_row: &[u8], n: usize) -> f32 {
    let mut acc = 0f32;
    for (bw, ba) in w_row.chunks_exact(Q4_K_BYTES).zip(a_row.chunks_exact(Q8_K_BYTES)).take(n / QK_K) {
        let qs = &bw[16..16 + 128];
        let (mut isum, mut imin) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &bw[4..16]);
            let (p, high) = (j / 2, j % 2 == 1);
            let s: i32 = (0..32)
                .map(|l| {
                    let q = qs[32 * p + l];
                    let level = if high { q >> 4 } else { q & 0xF };
                    level as i32 * ba[4 + 32 * j + l] as i8 as i32
                })
                .sum();
            isum += sc as i32 * s;
            let bsum = |g: usize| i16::from_le_bytes([ba[260 + 2 * g], ba[261 + 2 * g]]) as i32;
            imin += m as i32 * (bsum(2 * j) + bsum(2 * j + 1));
        }
        let da = f32_at(ba, 0);
        acc = (isum as f32).mul_add(f16_at(bw, 0) * da, acc);
        acc = (-(imin as f32)).mul_add(f16_at(bw, 2) * da, acc);
    }
    acc
}

/// The same order on a repacked group: out[r][t] = row r of the group against act_rows[t].
pub fn dot_group_scalar<const T: usize>(group: &[u8], act_rows: [&[u8]; T], n: usize, out: &mut [[f32; T]; GROUP_ROWS]) {
    let nb = n / QK_K;
    assert!(group.len() == nb * X8_BLOCK_BYTES && act_rows.iter().all(|a| a.len() == nb * Q8_K_BYTES));
    for (t, a) in act_rows.iter().enumerate() {
        let mut acc = [0f32; GROUP_ROWS];
        for b in 0..nb {
            let blk = &group[b * X8_BLOCK_BYTES..][..X8_BLOCK_BYTES];
            let ba = &a[b * Q8_K_BYTES..][..Q8_K_BYTES];
            let da = f32_at(ba, 0);
            let bsum = |g: usize| i16::from_le_bytes([ba[260 + 2 * g], ba[261 + 2 * g]]) as i32;
            for (r, acc) in acc.iter_mut().enumerate() {
                let (mut isum, mut imin) = (0i32, 0i32);
                for j in 0..8 {
                    let (p, high) = (j / 2, j % 2 == 1);
                    let mut s = 0i32;
                    for l in 0..32 {
                        let (c, h, k) = (l / 8, (l / 4) % 2, l % 4);
                        let q = blk[QS_AT + 256 * p + 64 * c + 8 * r + 4 * h + k];
                        let level = if high { q >> 4 } else { q & 0xF };
                        s += level as i32 * ba[4 + 32 * j + l] as i8 as i32;
                    }
                    isum += blk[32 + 8 * j + r] as i32 * s;
                    imin += blk[96 + 8 * j + r] as i32 * (bsum(2 * j) + bsum(2 * j + 1));
                }
                *acc = (isum as f32).mul_add(f16_at(blk, 2 * r) * da, *acc);
                *acc = (-(imin as f32)).mul_add(f16_at(blk, 16 + 2 * r) * da, *acc);
            }
        }
        for r in 0..GROUP_ROWS {
            out[r][t] = acc[r];
        }
    }
}
