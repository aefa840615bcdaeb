//! Mixture-of-experts feed-forward block (qwen3moe, qwen2moe), written against the Backend trait.
//!
//! As llama.cpp's `build_moe_ffn` with softmax gating: router logits -> softmax over all
//! experts -> top-k -> the selected probabilities as weights (renormalised to sum 1 where the
//! architecture says so) -> per selected expert SwiGLU(gate, up) and down -> each token's
//! expert outputs multiplied by their weights and added in slot order. qwen2moe adds a shared
//! expert scaled by sigmoid(ffn_gate_inp_shexp · x).
//!
//! gpt-oss's variant (llama.cpp's openai-moe graph, `Gating::SoftmaxWeight` and
//! `ExpertAct::SwiGluOai`): router logits + `ffn_gate_inp.bias` -> top-k of the logits ->
//! softmax over the k selected -> per expert gate/up + their `ffn_{gate,up}_exps.bias` rows
//! (ggml_add_id) -> `swiglu_oai` -> down + `ffn_down_exps.bias` row -> weighted sum. Biases
//! are loaded wherever the file has them.
//!
//! Routing runs on the host (the router logits are n_tokens x n_expert floats). The expert
//! matmuls follow ggml's `mul_mat_id`: each active expert's tokens are gathered into one
//! contiguous batch and multiplied by that expert's matrices, which are row views into the
//! 3-D expert-major tensors (no copies; decode touches only the selected experts' bytes).
//!
//! Device routing (GPU backends, passes of up to `DEVICE_ROUTING_MAX_ROWS` rows): where the
//! backend made an expert table for the layer (`Backend::expert_table`), the top-k, the expert
//! mat-vecs and the weighted sum run on the device (`Backend::routed_experts`): no expert id
//! goes to the host during the step, so a decode step is one replayable sequence of launches
//! instead of a device sync per layer and launches per chosen expert. The ids are logged on
//! the device and counted into `ExpertLoad` after the pass (`record_device_routing`). The host
//! path stays for prefill, for gpt-oss's biases and activation, and while the routing tap is on.

use super::hparams::{ExpertAct, Gating, MoeParams};
use super::moe_trace::RoutingTap;
use super::{HParams, MoeWorkspace};
use crate::backend::{Backend, RoutedExperts, WeightOf};
use crate::gguf::GgufFile;
use anyhow::{bail, Context};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Passes of up to this many rows (decode, batched decode) route on the device where the
/// backend can; longer ones (prefill) on the host, where each expert's tokens form one batch.
pub const DEVICE_ROUTING_MAX_ROWS: usize = 16;

/// How often each expert was selected, summed over the model's MoE layers: a token adds one
/// to each of its top-k experts in every layer, so the counts sum to tokens x experts_used x
/// MoE layers. One per model, shared by its layers; `civetta_moe_expert_tokens_total{expert}`
/// exports it. Per-layer counts would be n_layer x n_expert series (6144 for a
/// Qwen3-30B-A3B); the sum over layers keeps n_expert and still shows an unbalanced router.
pub struct ExpertLoad {
    counts: Vec<AtomicU64>,
}

impl ExpertLoad {
    pub fn new(n_expert: usize) -> ExpertLoad {
        ExpertLoad { counts: (0..n_expert).map(|_| AtomicU64::new(0)).collect() }
    }

    /// Counts one layer's routing (`Routing::experts`: k expert ids per token).
    pub fn record(&self, experts: &[u32]) {
        // Tally first: one atomic add per expert, not per (token, slot).
        let mut tally = vec![0u64; self.counts.len()];
        for &e in experts {
            tally[e as usize] += 1;
        }
        for (c, n) in self.counts.iter().zip(tally).filter(|(_, n)| *n > 0) {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The counts per expert id.
    pub fn snapshot(&self) -> Vec<u64> {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }
}

/// One expert's SwiGLU matrices (views into the layer's expert tensors, or whole 2-D tensors
/// for the shared expert).
pub struct ExpertWeights<B: Backend> {
    pub gate: WeightOf<B>,
    pub up: WeightOf<B>,
    pub down: WeightOf<B>,
    /// This expert's rows of `ffn_{gate,up,down}_exps.bias` (gpt-oss), when the file has them.
    pub biases: Option<ExpertBiases<B>>,
}

pub struct ExpertBiases<B: Backend> {
    pub gate: WeightOf<B>,
    pub up: WeightOf<B>,
    pub down: WeightOf<B>,
}

/// qwen2moe's shared expert: run on every token, scaled by sigmoid(gate_inp · x).
pub struct SharedExpert<B: Backend> {
    /// `ffn_gate_inp_shexp`: one row of n_embd.
    pub gate_inp: WeightOf<B>,
    pub ffn: ExpertWeights<B>,
}

pub struct MoeWeights<B: Backend> {
    /// `ffn_gate_inp`: n_expert rows of n_embd (router logits).
    pub router: WeightOf<B>,
    /// `ffn_gate_inp.bias` (gpt-oss), added to the router logits.
    pub router_bias: Option<Vec<f32>>,
    pub experts: Vec<ExpertWeights<B>>,
    pub shared: Option<SharedExpert<B>>,
    pub params: MoeParams,
    /// The model's expert selection counts (shared by all its MoE layers).
    pub load: Arc<ExpertLoad>,
    /// The model's routing diagnostics (off unless gpu_check asks; `moe_trace`).
    pub tap: Arc<RoutingTap>,
    /// The experts as the backend's device routing reaches them (`Backend::expert_table`),
    /// None where routing stays on the host.
    pub device_table: Option<B::ExpertTable>,
}

/// Loads layer `layer`'s MoE tensors and cuts the 3-D expert tensors into per-expert views.
pub fn load<B: Backend>(
    be: &B,
    file: &Arc<GgufFile>,
    layer: usize,
    hp: &HParams,
    load: Arc<ExpertLoad>,
    tap: Arc<RoutingTap>,
) -> anyhow::Result<MoeWeights<B>> {
    let m = hp.moe.clone().context("MoE layer in a model without expert metadata")?;
    let p = |s: &str| format!("blk.{layer}.{s}");
    let w = |name: &str| be.load_weight(file, name);
    let shape = |w: &WeightOf<B>, cols: usize, rows: usize| -> anyhow::Result<()> {
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
    let has = |name: &str| file.tensor(name).is_some();
    // [n_out, n_expert] bias tensors load as n_expert rows of n_out; all three or none.
    let bias_names = [p("ffn_gate_exps.bias"), p("ffn_up_exps.bias"), p("ffn_down_exps.bias")];
    let exp_biases = match bias_names.iter().filter(|n| has(n)).count() {
        0 => None,
        3 => {
            let [g, u, dn] = [w(&bias_names[0])?, w(&bias_names[1])?, w(&bias_names[2])?];
            shape(&g, ff, ne)?;
            shape(&u, ff, ne)?;
            shape(&dn, d, ne)?;
            Some((g, u, dn))
        }
        _ => bail!("layer {layer}: some of ffn_{{gate,up,down}}_exps.bias are missing (all three or none)"),
    };
    let mut experts = Vec::with_capacity(ne);
    for e in 0..ne {
        let biases = match &exp_biases {
            Some((g, u, dn)) => Some(ExpertBiases {
                gate: be.weight_rows(g, e, 1, &format!("{}[{e}]", g.name))?,
                up: be.weight_rows(u, e, 1, &format!("{}[{e}]", u.name))?,
                down: be.weight_rows(dn, e, 1, &format!("{}[{e}]", dn.name))?,
            }),
            None => None,
        };
        experts.push(ExpertWeights {
            gate: be.weight_rows(&gate, e * ff, ff, &format!("{}[{e}]", gate.name))?,
            up: be.weight_rows(&up, e * ff, ff, &format!("{}[{e}]", up.name))?,
            down: be.weight_rows(&down, e * d, d, &format!("{}[{e}]", down.name))?,
            biases,
        });
    }
    let router_bias = if has(&p("ffn_gate_inp.bias")) { Some(host_f32(file, &p("ffn_gate_inp.bias"), ne)?) } else { None };
    let shared = if m.n_ff_shexp > 0 {
        let s = ExpertWeights {
            gate: w(&p("ffn_gate_shexp.weight"))?,
            up: w(&p("ffn_up_shexp.weight"))?,
            down: w(&p("ffn_down_shexp.weight"))?,
            biases: None,
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
    // Device routing: where the backend has routed kernels for these experts, and for their
    // biases if any (gpt-oss).
    let views = |f: fn(&ExpertWeights<B>) -> &WeightOf<B>| experts.iter().map(f).collect::<Vec<_>>();
    let mut device_table = be.expert_table(&views(|e| &e.gate), &views(|e| &e.up), &views(|e| &e.down))?;
    if let (Some(table), true) = (device_table.as_mut(), exp_biases.is_some()) {
        let bias = |f: fn(&ExpertBiases<B>) -> &WeightOf<B>| experts.iter().map(|e| e.biases.as_ref().map(f)).collect::<Option<Vec<_>>>();
        let (Some(g), Some(u), Some(d)) = (bias(|b| &b.gate), bias(|b| &b.up), bias(|b| &b.down)) else {
            bail!("layer {layer}: expert biases missing for some experts");
        };
        if !be.expert_biases(table, &g, &u, &d)? {
            device_table = None;
        }
    }
    Ok(MoeWeights { router, router_bias, experts, shared, params: m, load, tap, device_table })
}

/// An F32 tensor of `n` elements read into host memory (small per-layer vectors).
pub(crate) fn host_f32(file: &GgufFile, name: &str, n: usize) -> anyhow::Result<Vec<f32>> {
    let t = file.tensor(name).with_context(|| format!("tensor {name} is missing"))?;
    if t.ggml_type != crate::gguf::GgmlType::F32 {
        bail!("tensor {name}: type {}, expected f32", t.ggml_type);
    }
    let bytes = file.tensor_data(t);
    if bytes.len() != 4 * n {
        bail!("tensor {name}: {} bytes, expected {n} f32", bytes.len());
    }
    Ok(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

/// gpt-oss's activation (on the host: `Backend::swiglu_oai` runs it on the backend).
pub use crate::backend::swiglu_oai_host as swiglu_oai;

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
    route_with(logits, p, None)
}

/// `route`, or with `forced` (k expert ids per token, as `Routing::experts`) those experts in
/// that slot order, weighted by this row's own probabilities (the routing replay of
/// `moe_trace`). With `forced` = `route`'s own choice the weights are bit-identical.
pub fn route_with(logits: &[f32], p: &MoeParams, forced: Option<&[u32]>) -> Routing {
    let (ne, k) = (p.n_expert, p.n_expert_used);
    let n = logits.len() / ne;
    let mut experts = Vec::with_capacity(n * k);
    let mut weights = Vec::with_capacity(n * k);
    let mut probs = vec![0f32; ne];
    let mut order: Vec<u32> = Vec::with_capacity(ne);
    for (t, row) in logits.chunks_exact(ne).enumerate() {
        match p.gating {
            Gating::Softmax => softmax_ggml(row, &mut probs),
            Gating::SoftmaxWeight => probs.copy_from_slice(row),
        }
        let chosen = match forced {
            Some(f) => &f[t * k..(t + 1) * k],
            None => {
                order.clear();
                order.extend(0..ne as u32);
                order.sort_by(|&a, &b| probs[b as usize].total_cmp(&probs[a as usize]).then(a.cmp(&b)));
                &order[..k]
            }
        };
        let mut w: Vec<f32> = chosen.iter().map(|&e| probs[e as usize]).collect();
        if p.gating == Gating::SoftmaxWeight {
            let selected = w.clone();
            softmax_ggml(&selected, &mut w);
        }
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

/// Per token, how far the k-th chosen expert's router logit is above the best expert left out
/// (logit_k - logit_{k+1}, after any router bias; 0 = a tie). Softmax is monotone, so this is
/// the margin the top-k choice had under both gatings: a perturbation of the logits smaller
/// than it cannot change that token's experts. For the routing diagnostics (issue #15: GPU vs
/// CPU routing flips), not the served path.
pub fn top_k_margins(logits: &[f32], p: &MoeParams) -> Vec<f32> {
    let (ne, k) = (p.n_expert, p.n_expert_used);
    let mut sorted = vec![0f32; ne];
    logits
        .chunks_exact(ne)
        .map(|row| {
            if k >= ne {
                return f32::INFINITY;
            }
            sorted.copy_from_slice(row);
            sorted.sort_by(|a, b| b.total_cmp(a));
            sorted[k - 1] - sorted[k]
        })
        .collect()
}

/// ggml's f32 soft_max of one row: exp(x - max) in f32, the sum in f64, scaled by the f32
/// reciprocal of the sum.
fn softmax_ggml(x: &[f32], out: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v - max).exp();
        sum += *o as f64;
    }
    let inv = (1.0 / sum) as f32;
    out.iter_mut().for_each(|o| *o *= inv);
}

/// Replaces `h` (n rows of n_embd, the normed FFN input) with the MoE block's output, using
/// the buffers of `ws` (sized for at least n rows; `h` and `ws.out` are swapped).
pub fn ffn<B: Backend>(be: &B, m: &MoeWeights<B>, ws: &mut MoeWorkspace<B>, h: &mut B::Buffer, n: usize, d: usize) -> anyhow::Result<()> {
    let (ne, ff) = (m.params.n_expert, m.params.n_ff_exp);
    be.matmul(&m.router, h, n, &mut ws.router_logits)?;
    if let Some(table) = m.device_table.as_ref().filter(|_| n <= DEVICE_ROUTING_MAX_ROWS && !m.tap.active()) {
        let k = m.params.n_expert_used;
        let MoeWorkspace { router_logits, slots, xe, gate, up, out, shared_gate, choice, routed_ids, routed_on_device } = ws;
        be.routed_experts(RoutedExperts {
            table,
            params: &m.params,
            logits: router_logits,
            router_bias: m.router_bias.as_deref(),
            x: h,
            n,
            dim: d,
            choice,
            ids_log: (routed_ids, *routed_on_device * n * k),
            gate,
            up,
            slots,
            out,
        })?;
        *routed_on_device += 1;
        if let Some(sh) = &m.shared {
            shared_expert(be, sh, h, n, d, SharedScratch { g: shared_gate, gate, up, y: xe }, out)?;
        }
        std::mem::swap(h, out);
        return Ok(());
    }
    let mut host = vec![0f32; n * ne];
    be.read(&ws.router_logits, 0, &mut host)?;
    if let Some(b) = &m.router_bias {
        for row in host.chunks_exact_mut(ne) {
            row.iter_mut().zip(b).for_each(|(x, b)| *x += b);
        }
    }
    let routing = if m.tap.active() { tapped_route(&m.tap, &host, &m.params, n)? } else { route(&host, &m.params) };
    m.load.record(&routing.experts);
    expert_outputs_and_sum(be, m, ws, h, n, d, ff, &routing)
}

/// Counts the experts that the pass's device-routed layers chose (`ws.routed_ids`, written by
/// `Backend::routed_experts`) into `load`; call after the pass has been waited for (its logits
/// read), with the pass's row count.
pub fn record_device_routing<B: Backend>(
    be: &B,
    load: &ExpertLoad,
    p: &MoeParams,
    ws: &mut MoeWorkspace<B>,
    n: usize,
) -> anyhow::Result<()> {
    let layers = std::mem::take(&mut ws.routed_on_device);
    if layers == 0 {
        return Ok(());
    }
    let mut ids = vec![0f32; layers * n * p.n_expert_used];
    be.read(&ws.routed_ids, 0, &mut ids)?;
    let ids: Vec<u32> = ids.iter().map(|v| v.to_bits()).collect();
    if let Some(bad) = ids.iter().find(|&&e| e as usize >= p.n_expert) {
        bail!("device routing chose expert {bad} of {}", p.n_expert);
    }
    load.record(&ids);
    Ok(())
}

/// `route` through the routing tap: replaying a recorded call's experts, or recording this one.
fn tapped_route(tap: &RoutingTap, logits: &[f32], p: &MoeParams, n: usize) -> anyhow::Result<Routing> {
    if let Some(forced) = tap.next_forced()? {
        if forced.len() != n * p.n_expert_used || forced.iter().any(|&e| e as usize >= p.n_expert) {
            bail!("routing replay: {} expert ids for {n} tokens x {} slots of {} experts", forced.len(), p.n_expert_used, p.n_expert);
        }
        return Ok(route_with(logits, p, Some(&forced)));
    }
    let routing = route(logits, p);
    let scales = logits.chunks_exact(p.n_expert).map(|r| r.iter().fold(0f32, |m, v| m.max(v.abs()))).collect();
    tap.record(&routing, top_k_margins(logits, p), scales);
    Ok(routing)
}

/// The routed part: per active expert, gather its tokens, SwiGLU, down, scatter its outputs
/// to their (token, slot) rows; then the weighted sum over slots replaces `h` (and the shared
/// expert, if any, is added).
#[allow(clippy::too_many_arguments)]
fn expert_outputs_and_sum<B: Backend>(
    be: &B,
    m: &MoeWeights<B>,
    ws: &mut MoeWorkspace<B>,
    h: &mut B::Buffer,
    n: usize,
    d: usize,
    ff: usize,
    r: &Routing,
) -> anyhow::Result<()> {
    let k = r.k;
    let MoeWorkspace { slots, xe, gate, up, out, shared_gate, .. } = ws;
    // One grouped launch per matrix over every expert's rows, where the backend has one (plain
    // SwiGLU experts without biases: the grouped kernels have neither gpt-oss's activation nor
    // its biases).
    let plain = m.params.act == ExpertAct::SwiGlu && m.experts.iter().all(|e| e.biases.is_none());
    if let Some(table) = m.device_table.as_ref().filter(|_| plain) {
        if be.grouped_experts(table, &r.experts, &r.weights, k, h, n, d, out)? {
            if let Some(sh) = &m.shared {
                shared_expert(be, sh, h, n, d, SharedScratch { g: shared_gate, gate, up, y: xe }, out)?;
            }
            std::mem::swap(h, out);
            return Ok(());
        }
    }
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
        be.gather_rows(h, &tokens, d, xe)?;
        be.matmul_many(&[&ew.gate, &ew.up], xe, rows, &mut [&mut *gate, &mut *up])?;
        if let Some(b) = &ew.biases {
            be.add_bias(gate, &b.gate, rows)?;
            be.add_bias(up, &b.up, rows)?;
        }
        match m.params.act {
            ExpertAct::SwiGlu => be.silu_mul(gate, up, rows * ff)?,
            ExpertAct::SwiGluOai => be.swiglu_oai(gate, up, rows * ff)?,
        }
        be.matmul(&ew.down, gate, rows, xe)?;
        if let Some(b) = &ew.biases {
            be.add_bias(xe, &b.down, rows)?;
        }
        be.scatter_rows(xe, &slot_rows, d, slots)?;
    }
    be.weighted_sum_rows(slots, &r.weights, n, k, d, out)?;
    if let Some(sh) = &m.shared {
        shared_expert(be, sh, h, n, d, SharedScratch { g: shared_gate, gate, up, y: xe }, out)?;
    }
    std::mem::swap(h, out);
    Ok(())
}

/// The shared expert's buffers: the routed experts' ones, free again by then.
struct SharedScratch<'a, B: Backend> {
    g: &'a mut B::Buffer,
    gate: &'a mut B::Buffer,
    up: &'a mut B::Buffer,
    y: &'a mut B::Buffer,
}

/// out += sigmoid(gate_inp · x) * SwiGLU_shared(x) per row (llama.cpp's qwen2moe graph; its
/// sigmoid is silu(x) / x).
fn shared_expert<B: Backend>(
    be: &B,
    sh: &SharedExpert<B>,
    x: &B::Buffer,
    n: usize,
    d: usize,
    s: SharedScratch<'_, B>,
    out: &mut B::Buffer,
) -> crate::backend::Result<()> {
    let ff = sh.ffn.gate.rows;
    be.matmul(&sh.gate_inp, x, n, s.g)?;
    let mut scales = vec![0f32; n];
    be.read(s.g, 0, &mut scales)?;
    scales.iter_mut().for_each(|v| *v = (*v / (1.0 + (-*v).exp())) / *v);
    be.matmul_many(&[&sh.ffn.gate, &sh.ffn.up], x, n, &mut [&mut *s.gate, &mut *s.up])?;
    be.silu_mul(s.gate, s.up, n * ff)?;
    be.matmul(&sh.ffn.down, s.gate, n, s.y)?;
    be.scale_rows(s.y, &scales, d)?;
    be.add(out, s.y, n * d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(n_expert: usize, k: usize, norm: bool) -> MoeParams {
        MoeParams {
            n_expert,
            n_expert_used: k,
            n_ff_exp: 1,
            n_ff_shexp: 0,
            norm_topk: norm,
            weights_scale: 0.0,
            gating: Gating::Softmax,
            act: ExpertAct::SwiGlu,
        }
    }

    #[test]
    fn softmax_weight_gating_picks_top_logits_then_softmaxes_the_selected() {
        let logits = [0.5, 3.0, -1.0, 2.0, /* token 1 */ -4.0, -3.0, 10.0, -2.5];
        let p = MoeParams { gating: Gating::SoftmaxWeight, ..params(4, 2, false) };
        let r = route(&logits, &p);
        assert_eq!(r.experts, vec![1, 3, 2, 3]);
        let e = (-1.0f32).exp();
        assert!((r.weights[0] - 1.0 / (1.0 + e)).abs() < 1e-6 && (r.weights[1] - e / (1.0 + e)).abs() < 1e-6);
        let e = (-12.5f32).exp();
        assert!((r.weights[2] - 1.0 / (1.0 + e)).abs() < 1e-6 && (r.weights[3] - e / (1.0 + e)).abs() < 1e-9);
        // Unlike softmax gating, the weights do not depend on the experts left out.
        let mut other = logits;
        other[0] = 1.5;
        assert_eq!(route(&other, &p).weights[..2], r.weights[..2]);
        assert_ne!(route(&other, &params(4, 2, false)).weights[..2], route(&logits, &params(4, 2, false)).weights[..2]);
    }

    #[test]
    fn swiglu_oai_clamps_gate_above_and_up_both_ways_and_adds_one_to_up() {
        let mut g = [1.0f32, 9.0, -9.0, 0.0, 2.0];
        let u = [0.5f32, 1.0, 1.0, 3.0, -8.0];
        swiglu_oai(&mut g, &u);
        let f = |x: f32, y: f32| x / (1.0 + (-1.702 * x).exp()) * (y + 1.0);
        let want = [f(1.0, 0.5), f(7.0, 1.0), f(-9.0, 1.0), 0.0, f(2.0, -7.0)];
        for (a, b) in g.iter().zip(want) {
            assert_eq!(a.to_bits(), b.to_bits(), "{g:?} vs {want:?}");
        }
        // The gate is clamped only from above (a large negative gate still passes through).
        assert!(g[2] < 0.0 && g[2] > -1e-3);
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
    fn top_k_margins_are_the_gap_between_the_kth_and_the_next_logit() {
        let logits = [0.1, 2.0, -1.0, 1.0, /* token 1 */ 3.0, 0.0, 0.0, 3.5, /* token 2: tie */ 1.0, 1.0, 1.0, 0.0];
        let m = top_k_margins(&logits, &params(4, 2, false));
        assert_eq!(m, vec![1.0 - 0.1, 3.0, 0.0]);
        // A perturbation below the margin keeps the experts; the tie's choice is the index rule.
        let mut moved = logits;
        moved[0] += 0.8;
        assert_eq!(route(&moved, &params(4, 2, false)).experts[..2], route(&logits, &params(4, 2, false)).experts[..2]);
        moved[0] += 0.2;
        assert_ne!(route(&moved, &params(4, 2, false)).experts[..2], route(&logits, &params(4, 2, false)).experts[..2]);
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
