//! Mixture-of-experts feed-forward block (qwen3moe, qwen2moe), written against the Backend trait.
//!
//! As llama.cpp's `build_moe_ffn` with softmax gating: router logits -> softmax over all
//! experts -> top-k -> the selected probabilities as weights (renormalised to sum 1 where the
//! architecture says so) -> per selected expert SwiGLU(gate, up) and down -> each token's
//! expert outputs multiplied by their weights and added in slot order. qwen2moe adds a shared
//! expert scaled by sigmoid(ffn_gate_inp_shexp · x).
//!
//! Routing runs on the host (the router logits are n_tokens x n_expert floats). The expert
//! matmuls follow ggml's `mul_mat_id`: each active expert's tokens are gathered into one
//! contiguous batch and multiplied by that expert's matrices, which are row views into the
//! 3-D expert-major tensors (no copies; decode touches only the selected experts' bytes).

use super::hparams::MoeParams;
use super::HParams;
use crate::backend::{Backend, Buffer, Weight};
use crate::gguf::GgufFile;
use anyhow::{bail, Context};
use std::sync::Arc;

/// One expert's SwiGLU matrices (views into the layer's expert tensors, or whole 2-D tensors
/// for the shared expert).
pub struct ExpertWeights {
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
}

/// qwen2moe's shared expert: run on every token, scaled by sigmoid(gate_inp · x).
pub struct SharedExpert {
    /// `ffn_gate_inp_shexp`: one row of n_embd.
    pub gate_inp: Weight,
    pub ffn: ExpertWeights,
}

pub struct MoeWeights {
    /// `ffn_gate_inp`: n_expert rows of n_embd (router logits).
    pub router: Weight,
    pub experts: Vec<ExpertWeights>,
    pub shared: Option<SharedExpert>,
    pub params: MoeParams,
}

/// Loads layer `layer`'s MoE tensors and cuts the 3-D expert tensors into per-expert views.
pub fn load(be: &dyn Backend, file: &Arc<GgufFile>, layer: usize, hp: &HParams) -> anyhow::Result<MoeWeights> {
    let m = hp.moe.clone().context("MoE layer in a model without expert metadata")?;
    let p = |s: &str| format!("blk.{layer}.{s}");
    let w = |name: &str| be.load_weight(file, name);
    let shape = |w: &Weight, cols: usize, rows: usize| -> anyhow::Result<()> {
        if w.cols != cols || w.rows != rows {
            bail!("tensor \"{}\" has shape [{}, {}], expected [{cols}, {rows}]", w.name, w.cols, w.rows);
        }
        Ok(())
    };
    let (d, ff, ne) = (hp.n_embd, m.n_ff_exp, m.n_expert);
    let router = w(&p("ffn_gate_inp.weight"))?;
    shape(&router, d, ne)?;
    let gate = w(&p("ffn_gate_exps.weight"))?;
    let up = w(&p("ffn_up_exps.weight"))?;
    let down = w(&p("ffn_down_exps.weight"))?;
    // 3-D [cols, rows, n_expert] tensors load as n_expert * rows rows of cols.
    shape(&gate, d, ff * ne)?;
    shape(&up, d, ff * ne)?;
    shape(&down, ff, d * ne)?;
    let mut experts = Vec::with_capacity(ne);
    for e in 0..ne {
        experts.push(ExpertWeights {
            gate: be.weight_rows(&gate, e * ff, ff, &format!("{}[{e}]", gate.name))?,
            up: be.weight_rows(&up, e * ff, ff, &format!("{}[{e}]", up.name))?,
            down: be.weight_rows(&down, e * d, d, &format!("{}[{e}]", down.name))?,
        });
    }
    let shared = if m.n_ff_shexp > 0 {
        let s = ExpertWeights {
            gate: w(&p("ffn_gate_shexp.weight"))?,
            up: w(&p("ffn_up_shexp.weight"))?,
            down: w(&p("ffn_down_shexp.weight"))?,
        };
        shape(&s.gate, d, m.n_ff_shexp)?;
        shape(&s.up, d, m.n_ff_shexp)?;
        shape(&s.down, m.n_ff_shexp, d)?;
        let gate_inp = w(&p("ffn_gate_inp_shexp.weight"))?;
        shape(&gate_inp, d, 1)?;
        Some(SharedExpert { gate_inp, ffn: s })
    } else {
        None
    };
    Ok(MoeWeights { router, experts, shared, params: m })
}

/// The experts chosen for each token: `experts[t * k + s]` with weight `weights[t * k + s]`,
/// slots in descending probability order.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    pub k: usize,
    pub experts: Vec<u32>,
    pub weights: Vec<f32>,
}

/// Softmax gating of `logits` (n_tokens rows of n_expert), as ggml: f32 exp of (x - max),
/// the sum in f64, probabilities scaled by its f32 reciprocal; top-k by descending
/// probability (ties: lower expert index first); weights renormalised by their (f64-summed)
/// total clamped to f16's smallest normal when `norm_topk`; then scaled by `weights_scale`
/// unless that is 0 or 1.
pub fn route(logits: &[f32], p: &MoeParams) -> Routing {
    let (ne, k) = (p.n_expert, p.n_expert_used);
    let n = logits.len() / ne;
    let mut experts = Vec::with_capacity(n * k);
    let mut weights = Vec::with_capacity(n * k);
    let mut probs = vec![0f32; ne];
    let mut order: Vec<u32> = Vec::with_capacity(ne);
    for row in logits.chunks_exact(ne) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f64;
        for (pr, &x) in probs.iter_mut().zip(row) {
            *pr = (x - max).exp();
            sum += *pr as f64;
        }
        let inv = (1.0 / sum) as f32;
        probs.iter_mut().for_each(|pr| *pr *= inv);
        order.clear();
        order.extend(0..ne as u32);
        order.sort_by(|&a, &b| probs[b as usize].total_cmp(&probs[a as usize]).then(a.cmp(&b)));
        let chosen = &order[..k];
        let mut w: Vec<f32> = chosen.iter().map(|&e| probs[e as usize]).collect();
        if p.norm_topk {
            let total = (w.iter().map(|&x| x as f64).sum::<f64>() as f32).max(6.103_515_6e-5);
            w.iter_mut().for_each(|x| *x /= total);
        }
        if p.weights_scale != 0.0 && p.weights_scale != 1.0 {
            w.iter_mut().for_each(|x| *x *= p.weights_scale);
        }
        experts.extend_from_slice(chosen);
        weights.extend(w);
    }
    Routing { k, experts, weights }
}

/// Replaces `h` (n rows of n_embd, the normed FFN input) with the MoE block's output.
pub fn ffn(be: &dyn Backend, m: &MoeWeights, h: &mut Buffer, n: usize, d: usize) -> anyhow::Result<()> {
    let (ne, ff) = (m.params.n_expert, m.params.n_ff_exp);
    let mut logits = be.alloc(n * ne)?;
    be.matmul(&m.router, h, n, &mut logits);
    let mut host = vec![0f32; n * ne];
    be.read(&logits, 0, &mut host);
    let routing = route(&host, &m.params);
    expert_outputs_and_sum(be, m, h, n, d, ff, &routing)
}

/// The routed part: per active expert, gather its tokens, SwiGLU, down, scatter its outputs
/// to their (token, slot) rows; then the weighted sum over slots replaces `h` (and the shared
/// expert, if any, is added).
fn expert_outputs_and_sum(
    be: &dyn Backend,
    m: &MoeWeights,
    h: &mut Buffer,
    n: usize,
    d: usize,
    ff: usize,
    r: &Routing,
) -> anyhow::Result<()> {
    let k = r.k;
    let mut slots = be.alloc(n * k * d)?;
    for (e, ew) in m.experts.iter().enumerate() {
        // The tokens this expert serves and the (token, slot) rows its outputs go to.
        let mut tokens = Vec::new();
        let mut slot_rows = Vec::new();
        for (i, &x) in r.experts.iter().enumerate() {
            if x as usize == e {
                tokens.push(i / k);
                slot_rows.push(i as u32);
            }
        }
        let rows = tokens.len();
        if rows == 0 {
            continue;
        }
        let mut xe = be.alloc(rows * d)?;
        be.gather_rows(h, &tokens, d, &mut xe);
        let mut gate = be.alloc(rows * ff)?;
        let mut up = be.alloc(rows * ff)?;
        be.matmul_many(&[&ew.gate, &ew.up], &xe, rows, &mut [&mut gate, &mut up]);
        be.silu_mul(&mut gate, &up, rows * ff);
        be.matmul(&ew.down, &gate, rows, &mut xe);
        be.scatter_rows(&xe, &slot_rows, d, &mut slots);
    }
    let mut out = be.alloc(n * d)?;
    be.weighted_sum_rows(&slots, &r.weights, n, k, d, &mut out);
    if let Some(sh) = &m.shared {
        shared_expert(be, sh, h, n, d, &mut out)?;
    }
    std::mem::swap(h, &mut out);
    Ok(())
}

/// out += sigmoid(gate_inp · x) * SwiGLU_shared(x) per row (llama.cpp's qwen2moe graph; its
/// sigmoid is silu(x) / x).
fn shared_expert(be: &dyn Backend, sh: &SharedExpert, x: &Buffer, n: usize, d: usize, out: &mut Buffer) -> anyhow::Result<()> {
    let ff = sh.ffn.gate.rows;
    let mut g = be.alloc(n)?;
    be.matmul(&sh.gate_inp, x, n, &mut g);
    let mut scales = vec![0f32; n];
    be.read(&g, 0, &mut scales);
    scales.iter_mut().for_each(|v| *v = (*v / (1.0 + (-*v).exp())) / *v);
    let mut gate = be.alloc(n * ff)?;
    let mut up = be.alloc(n * ff)?;
    be.matmul_many(&[&sh.ffn.gate, &sh.ffn.up], x, n, &mut [&mut gate, &mut up]);
    be.silu_mul(&mut gate, &up, n * ff);
    let mut y = be.alloc(n * d)?;
    be.matmul(&sh.ffn.down, &gate, n, &mut y);
    be.scale_rows(&mut y, &scales, d);
    be.add(out, &y, n * d);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(n_expert: usize, k: usize, norm: bool) -> MoeParams {
        MoeParams { n_expert, n_expert_used: k, n_ff_exp: 1, n_ff_shexp: 0, norm_topk: norm, weights_scale: 0.0 }
    }

    #[test]
    fn route_picks_the_top_k_in_descending_order() {
        let logits = [0.1, 2.0, -1.0, 1.0, /* token 1 */ 3.0, 0.0, 0.0, 3.5];
        let r = route(&logits, &params(4, 2, false));
        assert_eq!(r.experts, vec![1, 3, 7 - 4, 0]);
        // Unnormalised: the softmax probabilities themselves.
        let z: f32 = [0.1f32, 2.0, -1.0, 1.0].iter().map(|x| (x - 2.0).exp()).sum();
        assert!((r.weights[0] - 1.0 / z).abs() < 1e-6);
        assert!((r.weights[1] - (-1.0f32).exp() / z).abs() < 1e-6);
    }

    #[test]
    fn renormalised_weights_sum_to_one() {
        let logits = [0.5, -0.25, 1.5, 0.0, 0.75, -2.0];
        let r = route(&logits, &params(6, 3, true));
        assert_eq!(r.experts, vec![2, 4, 0]);
        assert!((r.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(r.weights.windows(2).all(|w| w[0] >= w[1]));
    }
}
