//! Batched decode step time on a GPU backend, without the server: B sequences prefilled in
//! one pass, then `--steps` decode steps of one row per sequence in one forward pass each
//! (`Model::forward_batch_with` in one workspace, what the scheduler runs at concurrency B).
//! Prints per batch size the time per step, aggregate tokens/s and its ratio to B = 1
//! (issue #14's serving target is a ratio of 8 at B = 16), and checks the batched path against the same sequences run
//! alone: the first and last sequence are re-run one by one with the tokens the batch fed
//! them, and their final logits compared (relative L2; docs/GPU.md's tolerance).
//! `--profile` runs the steps once more with every launch timed and prints the kernels that
//! take the most device time per step. `--no-check` skips the comparison (profiling the
//! batched steps alone). `--paged 16` keeps the KV cache as the engine does on
//! the CPU (one pool of 16-position blocks; `Backend::paged_kv` backends only).
//!
//! usage: batch_decode_bench -m MODEL.gguf [--backend cuda] [--kernel-dir DIR]
//!                           [--batches 1,2,4,8,16,32] [--steps 64] [--prompt 32]
//!                           [--gpu-matvec dp4a] [--batched-attention] [--matvec-max-rows N]
//!                           [--matvec-mma] [--no-mma-wide] [--no-overlap-launches] [--profile]
//!                           [--paged BLOCK] [--no-check]
//! The defaults are the backend's: GEMM tiles above 4 rows, two attention launches per
//! sequence and layer. `--matvec-max-rows 32 --batched-attention` is issue #17's batched
//! decode (`engine.gpu.matvec_max_rows`, `engine.gpu.batched_attention`); `--matvec-mma` runs
//! its Q8_0 / Q5_0 / Q4_K mat-vecs on the matrix units (`engine.gpu.matvec_mma`, kernels/matvec_mma.hip).

use civetta::backend::gpu::GpuOptions;
use civetta::backend::Backend;
use civetta::gguf::GgufFile;
use civetta::kernel_registry;
use civetta::model::{KvCache, Logits, Model, SeqRows, WorkspaceShape};
use std::sync::Arc;
use std::time::Instant;

fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned().unwrap_or_else(|| default.to_string())
}

/// The engine's greedy choice.
fn argmax(v: &[f32]) -> u32 {
    civetta::engine::sampler::argmax(v) as u32
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let (mut d, mut n) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        d += ((x - y) as f64).powi(2);
        n += (*y as f64).powi(2);
    }
    (d / n.max(1e-30)).sqrt()
}

/// One batch: B prompts prefilled together, then `warm + steps` decode steps. Returns the
/// seconds of the last `steps` steps, the tokens each sequence was fed after its prompt and
/// the final logits of each sequence.
struct BatchRun {
    seconds: f64,
    fed: Vec<Vec<u32>>,
    last: Vec<Vec<f32>>,
}

fn prompt(s: usize, len: usize, vocab: usize) -> Vec<u32> {
    (0..len).map(|i| ((i * 7919 + s * 104_729 + 13) % vocab) as u32).collect()
}

fn run_batch<B: Backend>(
    model: &Model<B>,
    b: usize,
    prompt_len: usize,
    warm: usize,
    steps: usize,
    vocab: usize,
    paged: usize,
) -> anyhow::Result<BatchRun> {
    let prompts: Vec<Vec<u32>> = (0..b).map(|s| prompt(s, prompt_len, vocab)).collect();
    let capacity = prompt_len + warm + steps + 1;
    // `--paged BLOCK`: the engine's KV layout, one pool of BLOCK-position blocks shared by all
    // sequences (each sequence gets its own run of blocks); else one contiguous cache each.
    let mut pool = if paged > 0 { Some(model.new_kv_pool(b * capacity.div_ceil(paged), paged)?) } else { None };
    let mut caches: Vec<KvCache<B>> = if paged > 0 {
        let per = capacity.div_ceil(paged);
        (0..b).map(|s| KvCache::paged((s * per..(s + 1) * per).map(|x| x as u32).collect(), paged, 0)).collect()
    } else {
        (0..b).map(|_| model.new_cache(capacity)).collect::<anyhow::Result<_>>()?
    };
    // The engine's activation buffers: allocated once, the same device addresses every step.
    let mut ws = model.new_workspace(WorkspaceShape { rows: b * prompt_len.max(1), logit_rows: b })?;
    let mut rows: Vec<SeqRows<B>> =
        caches.iter_mut().zip(&prompts).map(|(cache, p)| SeqRows { cache, tokens: &p[..], logits: Logits::Last }).collect();
    // As the engine's step: the logits stay in the workspace's host buffer (page-locked on a
    // GPU) and each sequence's next token is read from its rows there.
    let logits = model.forward_batch_into(pool.as_mut(), &mut ws, &mut rows)?;
    let mut last: Vec<Vec<f32>> = logits.iter().map(|l| l.to_vec()).collect();
    let mut next: Vec<[u32; 1]> = logits.iter().map(|l| [argmax(l)]).collect();
    drop(rows);
    let mut fed: Vec<Vec<u32>> = vec![Vec::new(); b];
    let mut t0 = Instant::now();
    for step in 0..warm + steps {
        if step == warm {
            t0 = Instant::now();
        }
        for (f, t) in fed.iter_mut().zip(&next) {
            f.push(t[0]);
        }
        let mut rows: Vec<SeqRows<B>> =
            caches.iter_mut().zip(&next).map(|(cache, t)| SeqRows { cache, tokens: &t[..], logits: Logits::Last }).collect();
        let logits = model.forward_batch_into(pool.as_mut(), &mut ws, &mut rows)?;
        let new_next = logits.iter().map(|l| [argmax(l)]).collect();
        if step + 1 == warm + steps {
            last = logits.iter().map(|l| l.to_vec()).collect();
        }
        drop(rows);
        next = new_next;
    }
    Ok(BatchRun { seconds: t0.elapsed().as_secs_f64(), fed, last })
}

/// Sequence `s` of a batch run alone (its prompt, then its fed tokens one step at a time):
/// the final logits.
fn run_alone<B: Backend>(model: &Model<B>, s: usize, prompt_len: usize, fed: &[u32], vocab: usize) -> anyhow::Result<Vec<f32>> {
    let mut cache = model.new_cache(prompt_len + fed.len() + 1)?;
    let mut last = model.forward(&mut cache, &prompt(s, prompt_len, vocab), Logits::Last)?;
    for &t in fed {
        last = model.forward(&mut cache, &[t], Logits::Last)?;
    }
    Ok(last)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let model_path = arg(&args, "-m", "");
    anyhow::ensure!(!model_path.is_empty(), "usage: batch_decode_bench -m MODEL.gguf [--backend cuda] [--kernel-dir DIR] [--batches 1,16]");
    let backend = arg(&args, "--backend", "cuda");
    let batches: Vec<usize> = arg(&args, "--batches", "1,2,4,8,16,32").split(',').map(|r| r.parse()).collect::<Result<_, _>>()?;
    let run = RunOptions {
        steps: arg(&args, "--steps", "64").parse()?,
        prompt_len: arg(&args, "--prompt", "32").parse()?,
        profile: args.iter().any(|a| a == "--profile"),
        paged: arg(&args, "--paged", "0").parse()?,
        check: !args.iter().any(|a| a == "--no-check"),
    };
    let opts = GpuOptions {
        kernel_dir: arg(&args, "--kernel-dir", "").into(),
        matvec: arg(&args, "--gpu-matvec", ""),
        batched_attention: args.iter().any(|a| a == "--batched-attention"),
        matvec_max_rows: arg(&args, "--matvec-max-rows", "0").parse()?,
        gemm_tile: arg(&args, "--gpu-gemm-tile", ""),
        matvec_mma: args.iter().any(|a| a == "--matvec-mma"),
        matvec_mma_wide: !args.iter().any(|a| a == "--no-mma-wide"),
        overlap_launches: !args.iter().any(|a| a == "--no-overlap-launches"),
        ..Default::default()
    };
    let be = civetta::backend::create_with(&backend, 0, true, &opts)?;
    civetta::with_backend!(be, be => bench(be, &model_path, &batches, &run))
}

/// What every batch size runs: `steps` timed decode steps after `prompt_len`-token prompts,
/// a `paged` KV pool (block size; 0 = one cache per sequence), a per-kernel `profile` run,
/// and the `check` against solo runs.
struct RunOptions {
    steps: usize,
    prompt_len: usize,
    profile: bool,
    paged: usize,
    check: bool,
}

/// The batch sizes' runs on `be`, printed as a table (and per-kernel profiles with --profile).
fn bench<B: Backend>(be: Arc<B>, model_path: &str, batches: &[usize], run: &RunOptions) -> anyhow::Result<()> {
    let &RunOptions { steps, prompt_len, profile, paged, check } = run;
    let file = Arc::new(GgufFile::open(std::path::Path::new(model_path))?);
    let model = Model::load(file, be.clone())?;
    let vocab = model.hp.n_vocab;
    println!("backend {} ({}), {steps} decode steps after a {prompt_len}-token prompt per sequence", be.name(), be.fingerprint());
    println!("\n| sequences | ms / step | aggregate tokens/s | vs 1 sequence | batch vs alone (rel. L2, first / last seq.) |");
    println!("|---:|---:|---:|---:|---:|");
    let warm = 3;
    let mut base = None;
    for &b in batches {
        kernel_registry::configure(false, 1.0);
        let r = run_batch(&model, b, prompt_len, warm, steps, vocab, paged)?;
        let tps = (b * steps) as f64 / r.seconds;
        let base_tps = *base.get_or_insert(tps / b as f64);
        let (first, lastd) = if check {
            let alone = |s: usize| run_alone(&model, s, prompt_len, &r.fed[s], vocab);
            (rel_l2(&r.last[0], &alone(0)?), rel_l2(&r.last[b - 1], &alone(b - 1)?))
        } else {
            (f64::NAN, f64::NAN)
        };
        println!("| {b} | {:.3} | {tps:.1} | {:.2}x | {first:.1e} / {lastd:.1e} |", r.seconds * 1e3 / steps as f64, tps / base_tps);
        if profile {
            kernel_registry::registry().reset();
            kernel_registry::configure(true, 1.0);
            let r = run_batch(&model, b, prompt_len, 0, steps, vocab, paged)?;
            kernel_registry::configure(false, 1.0);
            let mut snap = kernel_registry::registry().snapshot();
            snap.sort_by(|a, b| b.total_seconds.total_cmp(&a.total_seconds));
            let total: f64 = snap.iter().map(|k| k.total_seconds).sum();
            // Prefill is in the totals too; the decode steps dominate at --steps 64.
            let per_step = |s: f64| s * 1e3 / steps as f64;
            println!(
                "\n  profile, {b} sequences (every launch timed; prefill included): device {:.3} ms / step of {:.3} ms wall",
                per_step(total),
                per_step(r.seconds)
            );
            for k in snap.iter().take(12) {
                println!(
                    "  - {} [{}] {:.1} calls / step, {:.3} ms / step",
                    k.key.kernel,
                    k.key.shape_class,
                    k.calls as f64 / steps as f64,
                    per_step(k.total_seconds)
                );
            }
            println!();
        }
    }
    Ok(())
}
