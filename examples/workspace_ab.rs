//! What reusing the activation buffers saves (model::Workspace, issue #14): C sequences decode
//! S steps, one forward pass of C rows per step, either with a workspace allocated for each
//! pass (`forward_batch_in`: the allocations every step made before the engine kept one) or
//! in one workspace reused by every pass (`forward_batch_with`: what the engine does). Prints
//! a checksum of the logits (the same in both modes). Run each mode under
//! `perf stat -e task-clock,page-faults` (docs/PERF.md).
//!
//! usage: workspace_ab MODEL.gguf fresh|reused SEQUENCES STEPS THREADS

use civetta::model::{Logits, SeqRows, WorkspaceShape};

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    anyhow::ensure!(a.len() == 6, "usage: workspace_ab MODEL.gguf fresh|reused SEQUENCES STEPS THREADS");
    let (path, mode) = (&a[1], a[2].as_str());
    let (c, steps, threads): (usize, usize, usize) = (a[3].parse()?, a[4].parse()?, a[5].parse()?);
    anyhow::ensure!(mode == "fresh" || mode == "reused", "mode is fresh or reused, not {mode}");
    let model = civetta::model::load_file(std::path::Path::new(path), civetta::backend::create_cpu(threads)?)?;
    let vocab = model.hp.n_vocab as u32;
    let prompt_len = 16;
    let mut caches: Vec<_> = (0..c).map(|_| model.new_cache(prompt_len + steps + 1)).collect::<anyhow::Result<_>>()?;
    let mut ws = model.new_workspace(WorkspaceShape { rows: c, logit_rows: c })?;
    for (i, cache) in caches.iter_mut().enumerate() {
        let p: Vec<u32> = (0..prompt_len as u32).map(|j| (j * 7919 + i as u32 * 104_729 + 13) % vocab).collect();
        model.forward(cache, &p, Logits::Last)?;
    }
    let mut checksum = 0f64;
    for step in 0..steps {
        let tokens: Vec<[u32; 1]> = (0..c).map(|i| [((step * 31 + i * 17) as u32) % vocab]).collect();
        let mut rows: Vec<SeqRows<_>> =
            caches.iter_mut().zip(&tokens).map(|(cache, t)| SeqRows { cache, tokens: &t[..], logits: Logits::Last }).collect();
        let logits = match mode {
            "fresh" => model.forward_batch_in(None, &mut rows)?,
            _ => model.forward_batch_with(None, &mut ws, &mut rows)?,
        };
        checksum += logits.iter().map(|l| l[0] as f64).sum::<f64>();
    }
    println!("{mode} sequences={c} steps={steps} checksum={checksum}");
    Ok(())
}
