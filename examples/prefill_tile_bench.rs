//! Single-threaded cost of the prefill GEMM's inner step (`quant::vec_dot_rows_tile`) per weight
//! type: a ROWS x COLS weight matrix against TOKENS activation rows, walked as the CPU matmul
//! walks one work item (16-row weight blocks, T activation rows per tile). Meant to run under
//! `perf stat -e task-clock` (the shared VM has no cycle counters): the work is fixed, so
//! task-clock per run compares kernels.
//!
//! cargo run --release --example prefill_tile_bench -- TYPE [T] [PASSES] [ROWS] [COLS] [TOKENS]
//! TYPE: q4_k, q5_k, q6_k, q8_0, q4_0, q5_0, q4_1 (T = 8: `quant::vec_dot_q4_1_rows`), q4_1e
//! (the eights form, `quant::vec_dot_rows_q4_1_eights`, eight rows a call whatever T), or q8_0o (Q8_0 through the offset-form activations,
//! `quant::Q8_0Offset`, as the AVX-512 matmul runs it), or q4_kx8 (Q4_K repacked eight rows per
//! group, `quant::q4_k_x8`, as the AVX-512 matmul runs it; T = 1 is its decode step), or q8_0x8
//! (Q8_0 likewise, `quant::q8_0_x8`, its activation rows prepared once outside the timing); T: 4 (default), 8 or 16, or 1 for the
//! one-row dots (`quant::vec_dot_rows`, the decode matvec's step) against each activation row.

use civetta::quant::{self, GgmlType};
use rand::{Rng, SeedableRng};
use std::time::Instant;

fn parse_type(s: &str) -> GgmlType {
    match s {
        "q4_k" | "q4_kx8" => GgmlType::Q4_K,
        "q5_k" => GgmlType::Q5_K,
        "q6_k" => GgmlType::Q6_K,
        "q8_0" | "q8_0o" | "q8_0x8" => GgmlType::Q8_0,
        "q4_0" => GgmlType::Q4_0,
        "q4_1" | "q4_1e" => GgmlType::Q4_1,
        "q5_0" => GgmlType::Q5_0,
        other => panic!("unknown type {other}"),
    }
}

fn run<const T: usize>(
    t: GgmlType,
    w: &[u8],
    acts: &[u8],
    off: Option<&quant::Q8_0Offset>,
    rows: usize,
    cols: usize,
    tokens: usize,
) -> f32 {
    let row_bytes = t.row_bytes(cols).unwrap();
    let act_bytes = acts.len() / tokens;
    let mut sink = 0f32;
    let mut out = [[0f32; T]; 16];
    for r0 in (0..rows).step_by(16) {
        let r1 = (r0 + 16).min(rows);
        let block = &w[r0 * row_bytes..r1 * row_bytes];
        for tok in (0..tokens - tokens % T).step_by(T) {
            let a: [&[u8]; T] = std::array::from_fn(|j| &acts[(tok + j) * act_bytes..(tok + j + 1) * act_bytes]);
            match off {
                Some(off) => quant::vec_dot_rows_q8_0_offset(block, acts, off, tok, &mut out[..r1 - r0]),
                None if T == 1 => {
                    let mut one = [0f32; 16];
                    quant::vec_dot_rows(t, block, a[0], cols, &mut one[..r1 - r0]);
                    out[0][0] = one[0];
                }
                None => quant::vec_dot_rows_tile(t, block, a, cols, &mut out[..r1 - r0]),
            }
            sink += out[0][0];
        }
    }
    sink
}

/// Q4_1 as the batched decode runs it: 16-row weight blocks x 8 activation rows per call of
/// `quant::vec_dot_q4_1_rows` (the activation scales block-major, `quant::Q8_1Scales`).
fn run_q4_1_rows(w: &[u8], acts: &[u8], scales: &quant::Q8_1Scales, rows: usize, cols: usize, tokens: usize) -> f32 {
    let row_bytes = GgmlType::Q4_1.row_bytes(cols).unwrap();
    let act_bytes = acts.len() / tokens;
    let mut sink = 0f32;
    let mut out = [[0f32; 8]; 16];
    for r0 in (0..rows).step_by(16) {
        let r1 = (r0 + 16).min(rows);
        let block = &w[r0 * row_bytes..r1 * row_bytes];
        for tok in (0..tokens - tokens % 8).step_by(8) {
            let a: [&[u8]; 8] = std::array::from_fn(|j| &acts[(tok + j) * act_bytes..(tok + j + 1) * act_bytes]);
            quant::vec_dot_q4_1_rows::<2, 8>(block, a, scales, tok, cols, &mut out[..r1 - r0]);
            sink += out[0][0];
        }
    }
    sink
}

/// Q4_1 against the activations in the eights form (`quant::Q8_1Eights`), as the AVX-512
/// matmul runs batches of eight rows.
fn run_q4_1_eights(w: &[u8], e: &quant::Q8_1Eights, rows: usize, cols: usize) -> f32 {
    let row_bytes = GgmlType::Q4_1.row_bytes(cols).unwrap();
    let mut sink = 0f32;
    let mut out = [[0f32; 8]; 16];
    for r0 in (0..rows).step_by(16) {
        let r1 = (r0 + 16).min(rows);
        let block = &w[r0 * row_bytes..r1 * row_bytes];
        for tok in (0..e.rows()).step_by(8) {
            quant::vec_dot_rows_q4_1_eights(block, e, tok, &mut out[..r1 - r0]);
            sink += out[0][0];
        }
    }
    sink
}

/// The repacked Q4_K or Q8_0: eight-row groups x T activation rows per call.
fn run_x8<const T: usize>(q8_0: bool, packed: &[u8], acts: &[u8], rows: usize, cols: usize, tokens: usize) -> f32 {
    let group_bytes = if q8_0 { quant::q8_0_x8::repacked_bytes(8, cols) } else { quant::q4_k_x8::repacked_bytes(8, cols) };
    let act_bytes = acts.len() / tokens;
    let mut sink = 0f32;
    let mut out = [[0f32; T]; 8];
    for r0 in (0..rows).step_by(16) {
        for tok in (0..tokens - tokens % T).step_by(T) {
            let a: [&[u8]; T] = std::array::from_fn(|j| &acts[(tok + j) * act_bytes..(tok + j + 1) * act_bytes]);
            for g in (r0..(r0 + 16).min(rows)).step_by(8) {
                let group = &packed[g / 8 * group_bytes..][..group_bytes];
                if q8_0 {
                    quant::q8_0_x8::dot_group(group, a, cols, &mut out);
                } else {
                    quant::q4_k_x8::dot_group(group, a, cols, &mut out);
                }
                sink += out[0][0];
            }
        }
    }
    sink
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let name = args.first().map(String::as_str).unwrap_or("q4_k");
    let t = parse_type(name);
    let num = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (tile, passes, rows, cols, tokens) = (num(1, 4), num(2, 4), num(3, 2048), num(4, 2048), num(5, 64));
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let row_bytes = t.row_bytes(cols).expect("cols must be a multiple of 256");
    let mut w = vec![0u8; rows * row_bytes];
    for row in w.chunks_mut(row_bytes) {
        let x: Vec<f32> = (0..cols).map(|_| r.gen::<f32>() * 2.0 - 1.0).collect();
        quant::quantize_row(t, &x, row).unwrap();
    }
    let fmt = quant::act_format(t);
    let act_bytes = quant::act_row_bytes(fmt, cols);
    let mut acts = vec![0u8; tokens * act_bytes];
    for row in acts.chunks_mut(act_bytes) {
        let x: Vec<f32> = (0..cols).map(|_| r.gen::<f32>() * 2.0 - 1.0).collect();
        quant::quantize_act_row(fmt, &x, row);
    }
    let packed = (name == "q4_kx8").then(|| {
        let mut p = vec![0u8; quant::q4_k_x8::repacked_bytes(rows, cols)];
        quant::q4_k_x8::repack(&w, rows, cols, &mut p);
        p
    });
    let q8_0 = name == "q8_0x8";
    let (packed, acts) = if q8_0 {
        let mut p = vec![0u8; quant::q8_0_x8::repacked_bytes(rows, cols)];
        quant::q8_0_x8::repack(&w, rows, cols, &mut p);
        let pb = quant::q8_0_x8::act_bytes(cols);
        let mut prepared = vec![0u8; tokens * pb];
        for (a, d) in acts.chunks(act_bytes).zip(prepared.chunks_mut(pb)) {
            quant::q8_0_x8::prepare_act_row(a, cols, d);
        }
        (Some(p), prepared)
    } else {
        (packed, acts)
    };
    let eights = (name == "q4_1e").then(|| quant::Q8_1Eights::new(&acts, tokens, cols));
    let q4_1_scales = (name == "q4_1" && tile == 8).then(|| quant::Q8_1Scales::new(&acts, tokens, cols));
    let off = (name == "q8_0o").then(|| quant::Q8_0Offset::new(&acts, tokens, cols));
    let start = Instant::now();
    let mut sink = 0f32;
    // The fastest pass too: on a shared machine the others are slowed by time slicing.
    let mut best = f64::INFINITY;
    for _ in 0..passes {
        let pass = Instant::now();
        sink += match (tile, &packed) {
            _ if eights.is_some() => run_q4_1_eights(&w, eights.as_ref().unwrap(), rows, cols),
            (8, None) if q4_1_scales.is_some() => run_q4_1_rows(&w, &acts, q4_1_scales.as_ref().unwrap(), rows, cols, tokens),
            (8, Some(p)) => run_x8::<8>(q8_0, p, &acts, rows, cols, tokens),
            (1, Some(p)) => run_x8::<1>(q8_0, p, &acts, rows, cols, tokens),
            (_, Some(p)) => run_x8::<4>(q8_0, p, &acts, rows, cols, tokens),
            _ => match tile {
                16 => run::<16>(t, &w, &acts, off.as_ref(), rows, cols, tokens),
                8 => run::<8>(t, &w, &acts, off.as_ref(), rows, cols, tokens),
                1 => run::<1>(t, &w, &acts, off.as_ref(), rows, cols, tokens),
                _ => run::<4>(t, &w, &acts, off.as_ref(), rows, cols, tokens),
            },
        };
        best = best.min(pass.elapsed().as_secs_f64());
    }
    let s = start.elapsed().as_secs_f64();
    let macs = (rows * cols * tokens) as f64;
    println!(
        "{name} 1x{tile} tile, {rows} x {cols} x {tokens} tokens, {passes} passes: {:.3} s wall, {:.2} GMAC/s, best pass {:.2} GMAC/s (sink {sink})",
        s,
        macs * passes as f64 / s / 1e9,
        macs / best / 1e9
    );
}
