//! Decode mat-vec kernels alone, at a model's shapes: for each weight matrix of layer 0 and
//! the output matrix, the kernel time (GPU events around each launch) and the bytes of raw
//! weight blocks it reads, as GB/s and as a fraction of the device's copy bandwidth (a
//! device-to-device copy, counted as read + write like torch's figure in docs/GPU.md).
//!
//! usage: matvec_bench -m MODEL.gguf [--backend cuda|hip] [--kernel-dir DIR] [--iters 200]
//!                     [--rows 1,4,8,16] [--variants dp4a,wave,...] [--matvec-max-rows 32]
//! Prints a markdown table (docs/GPU.md, "Mat-vec bandwidth"). Rows > 1 are batched decode
//! (one activation row per sequence); the table's GB/s counts the weights once per launch.
//! Each `--variants` entry is a `GpuOptions::matvec` value (one backend each), or "mma": the
//! default dp4a family with `GpuOptions::matvec_mma` (Q8_0 / Q5_0 / Q4_K batches of 2+ rows on the
//! matrix units, kernels/matvec_mma.hip; other types and one row as dp4a); every result is
//! also compared with the CPU backend's matmul on the same input (relative L2 error), so a
//! kernel that is fast but wrong shows up here before the model-level parity check.
//! "µs / call" is the kernel alone (an event pair around each launch); "µs, queued" is the wall
//! time per launch of `iters` launches queued back to back (launch gaps included).

use civetta::backend::cpu::CpuBackend;
use civetta::backend::gpu::GpuOptions;
use civetta::backend::{Backend, LoadedBackend};
use civetta::gguf::GgufFile;
use civetta::kernel_registry;
use std::sync::Arc;
use std::time::Instant;

fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned().unwrap_or_else(|| default.to_string())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let model = arg(&args, "-m", "");
    anyhow::ensure!(!model.is_empty(), "usage: matvec_bench -m MODEL.gguf [--backend cuda] [--kernel-dir DIR] [--iters N] [--rows 1,4]");
    let backend = arg(&args, "--backend", "cuda");
    let iters: usize = arg(&args, "--iters", "200").parse()?;
    let rows_list: Vec<usize> = arg(&args, "--rows", "1").split(',').map(|r| r.parse()).collect::<Result<_, _>>()?;
    let variants: Vec<String> = arg(&args, "--variants", "dp4a").split(',').map(String::from).collect();
    // Eager launches: each one gets its own event pair.
    // --matvec-max-rows 32: batches of 5..32 rows on the 8- and 16-row dp4a builds instead of
    // the GEMM tiles (`engine.gpu.matvec_max_rows`; the default keeps 4).
    let opts = GpuOptions {
        kernel_dir: arg(&args, "--kernel-dir", "").into(),
        eager: true,
        matvec_max_rows: arg(&args, "--matvec-max-rows", "0").parse()?,
        ..Default::default()
    };
    let file = Arc::new(GgufFile::open(std::path::Path::new(&model))?);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let cpu = civetta::backend::create_cpu(threads)?;
    // One backend per variant, all of the type `--backend` names: matched once, then the
    // benchmark runs monomorphised for it.
    let mut loaded = Vec::new();
    for v in &variants {
        let o = if v == "mma" { GpuOptions { matvec_mma: true, ..opts.clone() } } else { GpuOptions { matvec: v.clone(), ..opts.clone() } };
        loaded.push(civetta::backend::create_with(&backend, 0, true, &o)?);
    }
    macro_rules! all_of {
        ($variant:path) => {{
            #[allow(unreachable_patterns)]
            let v: Vec<_> = loaded
                .into_iter()
                .map(|l| match l {
                    $variant(b) => b,
                    _ => unreachable!("one backend name made backends of different types"),
                })
                .collect();
            v
        }};
    }
    let first = loaded[0].clone();
    match first {
        LoadedBackend::Cpu(_) => bench(all_of!(LoadedBackend::Cpu), &cpu, &file, &variants, &rows_list, iters),
        #[cfg(feature = "cuda")]
        LoadedBackend::Cuda(_) => bench(all_of!(LoadedBackend::Cuda), &cpu, &file, &variants, &rows_list, iters),
        #[cfg(feature = "hip")]
        LoadedBackend::Hip(_) => bench(all_of!(LoadedBackend::Hip), &cpu, &file, &variants, &rows_list, iters),
    }
}

/// The copy bandwidth of `backends[0]`'s device, then every weight x rows x variant.
fn bench<G: Backend>(
    backends: Vec<Arc<G>>,
    cpu: &Arc<CpuBackend>,
    file: &Arc<GgufFile>,
    variants: &[String],
    rows_list: &[usize],
    iters: usize,
) -> anyhow::Result<()> {
    let be = &backends[0];

    // Copy bandwidth: 1 GiB device to device, median of 10.
    let n = 256 << 20;
    let src = be.alloc(n)?;
    let mut dst = be.alloc(n)?;
    let mut times = Vec::new();
    for i in 0..12 {
        be.synchronize()?;
        let t0 = Instant::now();
        be.copy_row(&src, 0, n, &mut dst)?;
        be.synchronize()?;
        if i >= 2 {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    drop((src, dst));
    let copy_gbs = 2.0 * (n * 4) as f64 / median(times) / 1e9;
    println!("device {} | copy bandwidth {copy_gbs:.0} GB/s (read + write, 1 GiB, median of 10)\n", be.fingerprint()["device"]);
    println!("| tensor | type | N x K | rows | variant | kernel | µs / call | weight GB/s | of copy bw | µs, queued | rel. L2 vs CPU |");
    println!("|---|---|---|---:|---|---|---:|---:|---:|---:|---:|");

    let mut names: Vec<String> = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
        .iter()
        .map(|t| format!("blk.0.{t}.weight"))
        .collect();
    names.push(if file.tensors.iter().any(|t| t.name == "output.weight") { "output.weight" } else { "token_embd.weight" }.into());
    for name in names {
        let Some(info) = file.tensors.iter().find(|t| t.name == name) else { continue };
        let bytes = file.tensor_data(info).len();
        let cw = cpu.load_weight(file, &name)?;
        for &rows in rows_list {
            let host: Vec<f32> = (0..rows * cw.cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 500.0).collect();
            let mut want = vec![0f32; rows * cw.rows];
            {
                let mut x = cpu.alloc(rows * cw.cols)?;
                cpu.write(&mut x, 0, &host)?;
                let mut y = cpu.alloc(rows * cw.rows)?;
                cpu.matmul(&cw, &x, rows, &mut y)?;
                cpu.read(&y, 0, &mut want)?;
            }
            for (variant, be) in variants.iter().zip(&backends) {
                let w = be.load_weight(file, &name)?;
                let mut x = be.alloc(rows * w.cols)?;
                be.write(&mut x, 0, &host)?;
                let mut y = be.alloc(rows * w.rows)?;
                for _ in 0..10 {
                    be.matmul(&w, &x, rows, &mut y)?;
                }
                be.synchronize()?;
                let mut got = vec![0f32; rows * w.rows];
                be.read(&y, 0, &mut got)?;
                let (mut num, mut den) = (0f64, 0f64);
                for (g, r) in got.iter().zip(&want) {
                    num += f64::from(g - r).powi(2);
                    den += f64::from(*r).powi(2);
                }
                let rel = (num / den.max(1e-30)).sqrt();
                // Queued back to back, untimed: launch gaps included.
                let t0 = Instant::now();
                for _ in 0..iters {
                    be.matmul(&w, &x, rows, &mut y)?;
                }
                be.synchronize()?;
                let queued = t0.elapsed().as_secs_f64() / iters as f64;
                kernel_registry::configure(true, 1.0);
                kernel_registry::registry().reset();
                for _ in 0..iters {
                    be.matmul(&w, &x, rows, &mut y)?;
                }
                be.synchronize()?;
                let snap = kernel_registry::registry().snapshot();
                kernel_registry::configure(false, 1.0);
                // The mat-vec kernel of this call (the one with the most time of those launched
                // `iters` times); a quantiser launch before it is added to its time.
                let launched: Vec<_> = snap.iter().filter(|s| s.calls as usize >= iters && s.timed_calls > 0).collect();
                let Some(k) = launched.iter().max_by(|a, b| a.total_seconds.total_cmp(&b.total_seconds)) else {
                    continue;
                };
                let per_call: f64 = launched.iter().map(|s| s.timed_seconds / s.timed_calls as f64).sum();
                let gbs = bytes as f64 / per_call / 1e9;
                let kernel = launched.iter().map(|s| s.key.kernel.to_string()).collect::<Vec<_>>().join(" + ");
                let _ = k;
                println!(
                    "| {name} | {} | {} x {} | {rows} | {variant} | {kernel} | {:.2} | {gbs:.0} | {:.0}% | {:.2} | {rel:.2e} |",
                    w.ggml_type,
                    w.rows,
                    w.cols,
                    per_call * 1e6,
                    100.0 * gbs / copy_gbs,
                    queued * 1e6,
                );
            }
        }
    }
    Ok(())
}
