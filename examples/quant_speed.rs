//! Throughput of `quant::vec_dot` per weight type: a 4096 x 4096 matrix times one activation
//! row (the decode-time matvec), single-threaded and on all cores, at every kernel level
//! this CPU has. Reports weight bytes streamed per second (best pass).
//!
//! cargo run --release --example quant_speed [-- ROWS COLS]

use civetta::quant::{self, GgmlType, SimdLevel};
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use std::time::Instant;

const TYPES: [GgmlType; 9] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (rows, cols) = (args.first().copied().unwrap_or(4096), args.get(1).copied().unwrap_or(4096));
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let x: Vec<f32> = (0..cols).map(|_| r.gen::<f32>() * 2.0 - 1.0).collect();
    println!("matrix {rows} x {cols}, vec_dot level in use: {}, threads: {}", quant::simd_level(), rayon::current_num_threads());
    println!("{:<6} {:<11} {:>10} {:>12} {:>12}", "type", "level", "MiB", "1 thread", "all threads");
    for t in TYPES {
        let row_bytes = t.row_bytes(cols).expect("cols must be a multiple of 256");
        // 64 distinct quantised rows repeated: realistic memory traffic, quick to build.
        let distinct: Vec<Vec<u8>> = (0..64)
            .map(|_| {
                let w: Vec<f32> = (0..cols).map(|_| r.gen::<f32>() * 2.0 - 1.0).collect();
                let mut q = vec![0u8; row_bytes];
                quant::quantize_row(t, &w, &mut q).unwrap();
                q
            })
            .collect();
        let matrix: Vec<u8> = (0..rows).flat_map(|i| distinct[i % 64].iter().copied()).collect();
        let fmt = quant::act_format(t);
        let mut act = vec![0u8; quant::act_row_bytes(fmt, cols)];
        quant::quantize_act_row(fmt, &x, &mut act);
        // Each level's vec_dot row by row, then `vec_dot_rows` (the backend's decode path: tile
        // kernels over 16-row blocks where the type has them).
        let levels = SimdLevel::ALL.into_iter().rev().filter(|l| l.available()).map(Some).chain([None]);
        for level in levels {
            let pass = |parallel: bool| {
                let dot = |w: &[u8]| quant::vec_dot_at(level.unwrap(), t, w, &act, cols).unwrap();
                let rows16 = |w: &[u8]| {
                    let mut out = [0f32; 16];
                    let out = &mut out[..w.len() / row_bytes];
                    quant::vec_dot_rows(t, w, &act, cols, out);
                    out.iter().sum::<f32>()
                };
                match (level.is_some(), parallel) {
                    (true, true) => matrix.par_chunks(row_bytes).map(dot).sum::<f32>(),
                    (true, false) => matrix.chunks(row_bytes).map(dot).sum::<f32>(),
                    (false, true) => matrix.par_chunks(16 * row_bytes).map(rows16).sum::<f32>(),
                    (false, false) => matrix.chunks(16 * row_bytes).map(rows16).sum::<f32>(),
                }
            };
            // Fastest of the passes in ~0.4 s: robust against other load on the machine.
            let gbps = |parallel: bool| {
                let _ = std::hint::black_box(pass(parallel)); // warm up
                let start = Instant::now();
                let mut best = f64::MAX;
                while start.elapsed().as_secs_f64() < 0.4 {
                    let t0 = Instant::now();
                    std::hint::black_box(pass(parallel));
                    best = best.min(t0.elapsed().as_secs_f64());
                }
                matrix.len() as f64 / best / 1e9
            };
            println!(
                "{:<6} {:<11} {:>10.1} {:>9.2} GB/s {:>7.2} GB/s",
                t.name(),
                level.map_or("rows16", |l| l.name()),
                matrix.len() as f64 / (1 << 20) as f64,
                gbps(false),
                gbps(true)
            );
        }
    }
}
