//! Per-op cost of a parallel region on the CPU backend's thread pool (rayon), as a decode step
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

fn main() {
    let threads: Vec<usize> =
        std::env::args().nth(1).map(|s| s.split(',').filter_map(|t| t.parse().ok()).collect()).unwrap_or_else(|| vec![1, 2, 4, 8, 16]);
    println!("| threads | serial gap µs | overhead per op µs (median of 5 x 2000 ops) |");
    println!("|---:|---:|---:|");
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
            per_op.remove(0); // warm-up
            per_op.sort_by(f64::total_cmp);
            println!("| {n} | {gap_us} | {:.2} |", per_op[per_op.len() / 2]);
        }
    }
}
