//! The CPU backend's two thread pools (src/backend/cpu/pool.rs: rayon below 8 threads, the
//! spinning pool from 8) give the same logits bit for bit: a region's work items do not depend
//! on which thread runs them, nor on the thread count. Whole models, prefill (every position's
//! logits, so matmuls of many rows, the parallel norms, adds and SwiGLU) and decode.
//! Decode attention also changes its split with the thread count: one item per GQA group on
//! 2 threads, one per query head where the groups are fewer than the threads (the tiny
//! models have 2 KV heads, so 3 and 4 threads split by head; the tiny qwen3's head size of
//! 64 runs the SIMD group kernel, which then takes one head at a time).

mod common;

use civetta::backend::cpu::pool::PoolKind;
use civetta::backend::cpu::CpuBackend;
use civetta::model::{self, Logits};
use std::path::Path;
use std::sync::Arc;

use common::{argmax, bits, prompt};

/// Every prompt position's logits, then those of 4 greedy decode steps.
fn run(path: &Path, threads: usize, kind: PoolKind) -> Vec<Vec<f32>> {
    let be = Arc::new(CpuBackend::with_pool(threads, true, kind).unwrap());
    assert_eq!(be.pool_kind(), kind);
    let model = model::load_file(path, be).unwrap();
    // 140 rows x dim 256 passes PARALLEL_ELEMS, so the norms and adds run as regions too.
    let p = prompt(140, 3, model.hp.n_vocab);
    let mut cache = model.new_cache(p.len() + 8).unwrap();
    let all = model.forward(&mut cache, &p, Logits::All).unwrap();
    let n_vocab = model.hp.n_vocab;
    let mut out: Vec<Vec<f32>> = all.chunks(n_vocab).map(<[f32]>::to_vec).collect();
    for _ in 0..4 {
        let next = argmax(out.last().unwrap());
        out.push(model.forward(&mut cache, &[next], Logits::Last).unwrap());
    }
    out
}

#[test]
fn rayon_and_spinning_pools_give_the_same_logits_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    // Q4_K is repacked eight rows per group where the CPU runs that kernel (whole groups per
    // work item); gemma3 adds sliding-window attention, qwen3moe the expert matmuls.
    for (arch, quant) in [("llama", "q4_1"), ("llama", "q4_k"), ("qwen3", "q8_0"), ("gemma3", "q5_0"), ("qwen3moe", "q4_k")] {
        let path = common::synth(dir.path(), arch, quant);
        let reference = run(&path, 2, PoolKind::Rayon);
        for (threads, kind) in [(4, PoolKind::Spin), (3, PoolKind::Spin), (4, PoolKind::Rayon)] {
            let got = run(&path, threads, kind);
            assert_eq!(got.len(), reference.len());
            for (pos, (a, b)) in reference.iter().zip(&got).enumerate() {
                assert!(bits(a) == bits(b), "{arch} {quant}: logits {pos} differ between rayon on 2 threads and {kind:?} on {threads}");
            }
        }
    }
}
