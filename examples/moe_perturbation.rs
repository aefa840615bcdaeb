//! Issue #15 CPU experiment: does an MoE model amplify a small arithmetic perturbation into a
//! 1e-1 logits error only through routing flips?
//!
//! For each synthetic model (gpu_check's presets) the CPU backend runs the 160-token prefill
//! of gpu_check twice: on the model as synthesised, and on a copy whose f32 norm weights
//! (`*_norm.weight`, every layer's attention / FFN input scale and the output norm) are
//! multiplied by (1 + eps * u), u uniform in [-1, 1] from a fixed seed: a relative error of
//! about eps on every layer's matmul inputs, standing in for the GPU's f16 / 8-bit activation
//! rounding. Prints per model and eps: the max-over-positions relative L2 of the logits, the
//! routing flips (layer x token choices whose expert set changed) and the largest unperturbed
//! margin among them, and the error with the perturbed model forced to the unperturbed
//! routing (src/model/moe_trace.rs). CPU only; the served path is untouched.
//!
//! usage: moe_perturbation [--archs llama,qwen3,qwen3moe,qwen2moe] [--quants q8_0,q4_k]
//!                         [--eps 1e-3,1e-2,3e-2] [--size small] [--tokens 160]

use civetta::gguf::{GgmlType, GgufFile};
use civetta::model::moe_trace::{compare, LayerRouting};
use civetta::model::{all_logits, Model};
use civetta::synth::{synth_model, SynthSpec};
use std::sync::Arc;

fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned().unwrap_or_else(|| default.to_string())
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

fn max_rel_l2(a: &[f32], b: &[f32], v: usize) -> f64 {
    a.chunks(v).zip(b.chunks(v)).fold(0f64, |w, (x, y)| w.max(rel_l2(x, y)))
}

/// A copy of `src` with its f32 norm weights scaled by (1 + eps * u), fixed seed.
fn perturbed_copy(src: &std::path::Path, dst: &std::path::Path, eps: f32) -> anyhow::Result<()> {
    let f = GgufFile::open(src)?;
    let mut bytes = std::fs::read(src)?;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    for t in f.tensors.iter().filter(|t| t.name.ends_with("_norm.weight") && t.ggml_type == GgmlType::F32) {
        let start = (f.data_offset + t.offset) as usize;
        for c in bytes[start..start + t.size_bytes as usize].chunks_exact_mut(4) {
            let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * (1.0 + eps * uniform());
            c.copy_from_slice(&x.to_le_bytes());
        }
    }
    Ok(std::fs::write(dst, bytes)?)
}

/// All logits of `prompt`, with the routing recorded (MoE models) or replayed (`replay`).
fn run(
    m: &Model<civetta::backend::cpu::CpuBackend>,
    prompt: &[u32],
    replay: Option<&[LayerRouting]>,
) -> anyhow::Result<(Vec<f32>, Vec<LayerRouting>)> {
    let Some(tap) = m.routing_tap() else { return Ok((all_logits(m, prompt)?, Vec::new())) };
    match replay {
        Some(r) => tap.start_replay(r),
        None => tap.start_record(),
    }
    let logits = all_logits(m, prompt);
    let trace = if replay.is_some() {
        anyhow::ensure!(tap.stop() == 0, "replay left calls unused");
        Vec::new()
    } else {
        tap.take_record()
    };
    Ok((logits?, trace))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let archs = arg(&args, "--archs", "llama,qwen3,qwen3moe,qwen2moe");
    let quants = arg(&args, "--quants", "q8_0,q4_k");
    let eps: Vec<f32> = arg(&args, "--eps", "1e-3,1e-2,3e-2").split(',').map(|e| e.parse()).collect::<Result<_, _>>()?;
    let size = arg(&args, "--size", "small");
    let n_tokens: u32 = arg(&args, "--tokens", "160").parse()?;
    let cpu = civetta::backend::create_cpu(0)?;
    let dir = tempfile::tempdir()?;
    println!("| model | eps | max rel. L2 (free routing) | flips / choices | primary flips | largest primary margin (abs, rel) | largest margin of any flip (rel) | max rel. L2 (forced to unperturbed routing) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for arch in archs.split(',') {
        for q in quants.split(',') {
            let t = GgmlType::parse(q).ok_or_else(|| anyhow::anyhow!("unknown type {q}"))?;
            let spec = SynthSpec::preset(arch, t, &size)?;
            let base_path = dir.path().join(format!("{arch}-{q}.gguf"));
            synth_model(&spec, &base_path)?;
            let prompt: Vec<u32> = (0..n_tokens).map(|i| (i * 7919 + 13) % spec.vocab as u32).collect();
            let base = Model::load(Arc::new(GgufFile::open(&base_path)?), cpu.clone())?;
            let (a, ra) = run(&base, &prompt, None)?;
            for &e in &eps {
                let p = dir.path().join(format!("{arch}-{q}-{e}.gguf"));
                perturbed_copy(&base_path, &p, e)?;
                let pert = Model::load(Arc::new(GgufFile::open(&p)?), cpu.clone())?;
                let (b, rb) = run(&pert, &prompt, None)?;
                let free = max_rel_l2(&b, &a, spec.vocab);
                if ra.is_empty() {
                    println!("| {arch} {q} | {e:.0e} | {free:.2e} | (dense) | | | | |");
                    continue;
                }
                let d = compare(&ra, &rb);
                let choices: usize = ra.iter().map(|c| c.margins.len()).sum();
                let (forced, _) = run(&pert, &prompt, Some(&ra))?;
                let forced = max_rel_l2(&forced, &a, spec.vocab);
                println!(
                    "| {arch} {q} | {e:.0e} | {free:.2e} | {} / {choices} | {} | {:.2e}, {:.2e} | {:.2e} | {forced:.2e} |",
                    d.flips, d.primary, d.primary_margin, d.primary_rel_margin, d.any_rel_margin
                );
            }
        }
    }
    Ok(())
}
