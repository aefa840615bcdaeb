//! Per-op cost of a parallel region: rayon (the CPU backend's pool below 8 threads) against the
//! spinning pool it uses from 8 threads (`civetta::backend::cpu::spin_pool::SpinPool`), as a decode step
//! sees it: one `into_par_iter` over `4 x threads` work items per op, with a stretch of serial
//! work between ops (the small ops a forward pass runs on one thread: norms, adds, RoPE).
//! Prints, per thread count and serial gap, the time per op beyond the gap itself: the
//! wake-up/join overhead a matmul pays on top of its arithmetic.
//!
//! usage: cargo run --release --example pool_overhead [THREADS,...] (default 1,2,4,8,16)
use rayon::prelude::*;
use std::hint::black_box;
use std::time::{Duration, Instant};

fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Median after dropping the first (warm-up) sample.
fn median(mut v: Vec<f64>) -> f64 {
    v.remove(0);
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let threads: Vec<usize> =
        std::env::args().nth(1).map(|s| s.split(',').filter_map(|t| t.parse().ok()).collect()).unwrap_or_else(|| vec![1, 2, 4, 8, 16]);
    println!("| threads | serial gap µs | rayon µs per op | spinning pool µs per op | (medians of 5 x 2000 ops) |");
    println!("|---:|---:|---:|---:|---|");
    for &n in &threads {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(n).build().expect("pool");
        for gap_us in [0u64, 5, 50] {
            let gap = Duration::from_micros(gap_us);
            let mut per_op = Vec::new();
            pool.install(|| {
                for _ in 0..6 {
                    let ops = 2000;
                    let t = Instant::now();
                    for _ in 0..ops {
                        (0..4 * n).into_par_iter().for_each(|j| {
                            black_box(j);
                        });
                        spin(gap);
                    }
                    per_op.push(t.elapsed().as_secs_f64() * 1e6 / ops as f64 - gap_us as f64);
                }
            });
            let spin_pool = civetta::backend::cpu::spin_pool::SpinPool::new(n).expect("spinning pool");
            let mut per_op_spin = Vec::new();
            for _ in 0..6 {
                let ops = 2000;
                let t = Instant::now();
                for _ in 0..ops {
                    spin_pool.for_each(4 * n, |j| {
                        black_box(j);
                    });
                    spin(gap);
                }
                per_op_spin.push(t.elapsed().as_secs_f64() * 1e6 / ops as f64 - gap_us as f64);
            }
            println!("| {n} | {gap_us} | {:.2} | {:.2} | |", median(per_op), median(per_op_spin));
        }
    }
}
