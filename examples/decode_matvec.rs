//! Decode-time matrix-vector products at a real model's shapes, streamed from memory: every
//! weight matrix of a 30-layer SmolLM2-135M-like stack (q/k/v fused, o, gate/up fused, down;
//! Q4_1, about 66 MB, more than the L3) times one activation row, one "token" after another,
//! on one thread. Separates the kernel from what surrounds it in the backend: the same bytes
//! through `quant::vec_dot_rows` (16-row blocks, the backend's path), through one row at a
//! time (llama.cpp's order), with and without quantising the activation per matrix.
//!
//! cargo run --release --example decode_matvec [-- LAYERS PASSES]

use civetta::quant::{self, GgmlType};
use rand::{Rng, SeedableRng};
use std::time::Instant;

/// (input width k, output rows n) per layer: fused q/k/v, o, fused gate/up, down.
const LAYER_SHAPES: [(usize, usize); 4] = [(576, 960), (576, 576), (576, 3072), (1536, 576)];

/// One matrix-vector product: (input width k, weight bytes, output rows).
type Matvec<'a> = dyn FnMut(usize, &[u8], &mut [f32]) + 'a;

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (layers, passes) = (args.first().copied().unwrap_or(30), args.get(1).copied().unwrap_or(20));
    let t = GgmlType::Q4_1;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    // 32 distinct quantised rows per width, copied into distinct matrices: real memory
    // traffic without quantising 150k rows.
    let distinct = |k: usize, rng: &mut rand_chacha::ChaCha8Rng| -> Vec<Vec<u8>> {
        (0..32)
            .map(|_| {
                let w: Vec<f32> = (0..k).map(|_| rng.gen::<f32>() * 2.0 - 1.0).collect();
                let mut q = vec![0u8; t.row_bytes(k).unwrap()];
                quant::quantize_row(t, &w, &mut q).unwrap();
                q
            })
            .collect()
    };
    let rows576 = distinct(576, &mut rng);
    let rows1536 = distinct(1536, &mut rng);
    let mats: Vec<(usize, usize, Vec<u8>)> = (0..layers)
        .flat_map(|_| LAYER_SHAPES)
        .map(|(k, n)| {
            let src = if k == 576 { &rows576 } else { &rows1536 };
            (k, n, (0..n).flat_map(|r| src[r % 32].iter().copied()).collect())
        })
        .collect();
    let total_bytes: usize = mats.iter().map(|m| m.2.len()).sum();
    let fmt = quant::act_format(t);
    let xs: Vec<Vec<f32>> = [576, 1536].iter().map(|&k| (0..k).map(|_| rng.gen::<f32>() * 2.0 - 1.0).collect()).collect();
    let acts: Vec<Vec<u8>> = xs
        .iter()
        .map(|x| {
            let mut a = vec![0u8; quant::act_row_bytes(fmt, x.len())];
            quant::quantize_act_row(fmt, x, &mut a);
            a
        })
        .collect();
    let act_for = |k: usize| if k == 576 { &acts[0] } else { &acts[1] };
    let x_for = |k: usize| if k == 576 { &xs[0] } else { &xs[1] };
    let mut out = vec![0f32; 3072];

    println!(
        "{layers} layers, {:.1} MiB of Q4_1 per token, 1 thread, level {}",
        total_bytes as f64 / (1 << 20) as f64,
        quant::simd_level()
    );
    let mut run = |name: &str, f: &mut Matvec| {
        let mut times = Vec::new();
        for _ in 0..passes {
            let t0 = Instant::now();
            for (k, n, w) in &mats {
                f(*k, w, &mut out[..*n]);
            }
            times.push(t0.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let med = times[times.len() / 2];
        println!("{name:<40} {:>8.3} ms/token {:>7.2} GB/s (median of {passes})", med * 1e3, total_bytes as f64 / med / 1e9);
    };
    let level = quant::SimdLevel::ALL.into_iter().rev().find(|l| l.available()).expect("scalar is always available");
    run("rows16 (vec_dot_rows, 16-row blocks)", &mut |k, w, out| {
        let rb = t.row_bytes(k).unwrap();
        for (o, wb) in out.chunks_mut(16).zip(w.chunks(16 * rb)) {
            quant::vec_dot_rows(t, wb, act_for(k), k, o);
        }
    });
    run("one row at a time (llama.cpp order)", &mut |k, w, out| {
        let rb = t.row_bytes(k).unwrap();
        for (o, wr) in out.iter_mut().zip(w.chunks(rb)) {
            *o = quant::vec_dot_at(level, t, wr, act_for(k), k).unwrap();
        }
    });
    let mut act = vec![0u8; quant::act_row_bytes(fmt, 1536)];
    run("rows16 + activation quantised per matrix", &mut |k, w, out| {
        let rb = t.row_bytes(k).unwrap();
        let a = &mut act[..quant::act_row_bytes(fmt, k)];
        quant::quantize_act_row(fmt, x_for(k), a);
        for (o, wb) in out.chunks_mut(16).zip(w.chunks(16 * rb)) {
            quant::vec_dot_rows(t, wb, a, k, o);
        }
    });
}
