//! The model's side of device-side MoE routing (src/model/moe.rs: `Backend::expert_table`,
//! `Backend::routed_experts`, the ids logged on the device and counted after the pass), run on
//! the CPU: a backend that routes "on the device" by doing what the GPU kernels do with CPU ops
//! (each (token, slot) row through its expert alone, the weighted sum) must give the CPU
//! backend's host-routed logits bit for bit, decode and batched decode, and count the same expert
//! selections, so the pass-level bookkeeping (which passes route on the device, where each layer's
//! ids go, the buffer swaps, qwen2moe's shared expert after it) is checked without a GPU.
//! gpt-oss adds the router bias, per-expert bias rows (`Backend::expert_biases`), softmax over
//! the selected logits and `swiglu_oai`, which the emulation applies as the GPU kernels do.

mod common;

use civetta::backend::{Backend, RoutedExperts, WeightOf};
use civetta::gguf::{GgmlType, GgufFile};
use civetta::model::{moe, ExpertAct, HParams, Logits, Model, SeqRows};
use civetta::synth::{synth_model, SynthSpec};
use common::delegate::{Delegate, ExpertTableOf, Hooks};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Hooks that route "on the device" with CPU ops (`routed_experts`), on tables of their own.
#[derive(Default)]
struct Emulated {
    routed_calls: AtomicUsize,
}

/// One layer's experts: gate, up, down views per expert, and their bias rows (gpt-oss).
struct HostTable<B: Backend> {
    experts: Vec<[WeightOf<B>; 3]>,
    biases: Option<Vec<[WeightOf<B>; 3]>>,
}

/// `Emulated` makes its tables itself (`expert_table`) and never hands one to the CPU backend.
impl<B: Backend> ExpertTableOf<B> for HostTable<B> {
    fn from_inner(_: B::ExpertTable) -> Self {
        unreachable!("Emulated makes its own expert tables")
    }
    fn inner(&self) -> &B::ExpertTable {
        unreachable!("Emulated routes with its own expert tables")
    }
    fn inner_mut(&mut self) -> &mut B::ExpertTable {
        unreachable!("Emulated routes with its own expert tables")
    }
}

fn expert_views<B: Backend>(
    inner: &B,
    gate: &[&WeightOf<B>],
    up: &[&WeightOf<B>],
    down: &[&WeightOf<B>],
) -> civetta::backend::Result<Vec<[WeightOf<B>; 3]>> {
    let view = |w: &WeightOf<B>| inner.weight_rows(w, 0, w.rows, &w.name);
    (0..gate.len()).map(|e| Ok([view(gate[e])?, view(up[e])?, view(down[e])?])).collect()
}

impl<B: Backend> Hooks<B> for Emulated {
    type Table = HostTable<B>;

    fn expert_table(
        &self,
        inner: &B,
        gate: &[&WeightOf<B>],
        up: &[&WeightOf<B>],
        down: &[&WeightOf<B>],
    ) -> civetta::backend::Result<Option<HostTable<B>>> {
        Ok(Some(HostTable { experts: expert_views(inner, gate, up, down)?, biases: None }))
    }
    fn expert_biases(
        &self,
        inner: &B,
        table: &mut HostTable<B>,
        gate: &[&WeightOf<B>],
        up: &[&WeightOf<B>],
        down: &[&WeightOf<B>],
    ) -> civetta::backend::Result<bool> {
        table.biases = Some(expert_views(inner, gate, up, down)?);
        Ok(true)
    }
    /// No grouped prefill kernels: the model runs prefill expert by expert.
    fn grouped_experts(
        &self,
        _: &B,
        _: &HostTable<B>,
        _: &[u32],
        _: &[f32],
        _: usize,
        _: &B::Buffer,
        _: usize,
        _: usize,
        _: &mut B::Buffer,
    ) -> civetta::backend::Result<bool> {
        Ok(false)
    }
    fn routed_experts(&self, inner: &B, r: RoutedExperts<'_, Delegate<B, Self>>) -> civetta::backend::Result<()> {
        self.routed_calls.fetch_add(1, Ordering::SeqCst);
        let (p, n, d) = (r.params, r.n, r.dim);
        let k = p.n_expert_used;
        let mut logits = vec![0f32; n * p.n_expert];
        inner.read(r.logits, 0, &mut logits)?;
        if let Some(b) = r.router_bias {
            logits.chunks_exact_mut(p.n_expert).for_each(|row| row.iter_mut().zip(b).for_each(|(x, b)| *x += b));
        }
        let routing = moe::route(&logits, p);
        // As the GPU kernels leave them: ids (as i32 bits) then weights, and the ids logged.
        let ids: Vec<f32> = routing.experts.iter().map(|&e| f32::from_bits(e)).collect();
        inner.write(r.choice, 0, &ids)?;
        inner.write(r.choice, n * k, &routing.weights)?;
        inner.write(r.ids_log.0, r.ids_log.1, &ids)?;
        // Each (token, slot) row alone through its expert, as the per-slot mat-vecs do.
        let ff = r.table.experts[0][0].rows;
        let (mut xe, mut g, mut u, mut y) = (inner.alloc(d)?, inner.alloc(ff)?, inner.alloc(ff)?, inner.alloc(d)?);
        let mut slots = inner.alloc(n * k * d)?;
        let mut row = vec![0f32; d];
        for (i, &e) in routing.experts.iter().enumerate() {
            let [wg, wu, wd] = &r.table.experts[e as usize];
            inner.copy_row(r.x, i / k, d, &mut xe)?;
            let bias = r.table.biases.as_ref().map(|b| &b[e as usize]);
            inner.matmul(wg, &xe, 1, &mut g)?;
            inner.matmul(wu, &xe, 1, &mut u)?;
            if let Some([bg, bu, _]) = bias {
                inner.add_bias(&mut g, bg, 1)?;
                inner.add_bias(&mut u, bu, 1)?;
            }
            match p.act {
                ExpertAct::SwiGlu => inner.silu_mul(&mut g, &u, ff)?,
                ExpertAct::SwiGluOai => inner.swiglu_oai(&mut g, &u, ff)?,
            }
            inner.matmul(wd, &g, 1, &mut y)?;
            if let Some([_, _, bd]) = bias {
                inner.add_bias(&mut y, bd, 1)?;
            }
            inner.read(&y, 0, &mut row)?;
            inner.write(&mut slots, i * d, &row)?;
        }
        inner.weighted_sum_rows(&slots, &routing.weights, n, k, d, r.out)
    }
}

/// One decode row of each of two sequences in one batched pass.
fn decode_two<B: Backend>(m: &Model<B>, [c1, c2]: [&mut civetta::model::KvCache<B>; 2], next: &[[u32; 1]; 2]) -> Vec<Vec<f32>> {
    let mut rows = vec![
        SeqRows { cache: c1, tokens: &next[0][..], logits: Logits::Last },
        SeqRows { cache: c2, tokens: &next[1][..], logits: Logits::Last },
    ];
    m.forward_batch(&mut rows).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn check(arch: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let quant = if arch == "gpt-oss" { GgmlType::MXFP4 } else { GgmlType::Q8_0 };
    let spec = SynthSpec::preset(arch, quant, "tiny").unwrap();
    synth_model(&spec, &path).unwrap();
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let cpu = civetta::backend::create_cpu(2).unwrap();
    let emulated = Delegate::new(cpu.clone(), Emulated::default());
    let host = Model::load(file.clone(), cpu).unwrap();
    let device = Model::load(file, emulated.clone()).unwrap();
    let hp: &HParams = &host.hp;
    let layers = hp.n_layer;
    let k = hp.moe.as_ref().unwrap().n_expert_used;
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 7919 + 13) % spec.vocab as u32).collect();

    // A short prompt (device-routed: at most DEVICE_ROUTING_MAX_ROWS rows), then decode steps.
    let (mut ch, mut cd) = (host.new_cache(64).unwrap(), device.new_cache(64).unwrap());
    let mut tokens = 0;
    for (i, chunk) in [&prompt[..6], &prompt[6..7], &prompt[7..8], &prompt[8..9], &prompt[9..10]].iter().enumerate() {
        let a = host.forward(&mut ch, chunk, Logits::Last).unwrap();
        let b = device.forward(&mut cd, chunk, Logits::Last).unwrap();
        assert_eq!(bits(&a), bits(&b), "{arch}: pass {i} logits differ");
        tokens += chunk.len();
    }
    let device_passes = emulated.hooks.routed_calls.load(Ordering::SeqCst);
    assert_eq!(device_passes, 5 * layers, "{arch}: every MoE layer of every pass routed on the device");
    // A prefill longer than DEVICE_ROUTING_MAX_ROWS routes on the host in both.
    let (mut ch2, mut cd2) = (host.new_cache(64).unwrap(), device.new_cache(64).unwrap());
    let a = host.forward(&mut ch2, &prompt, Logits::Last).unwrap();
    let b = device.forward(&mut cd2, &prompt, Logits::Last).unwrap();
    assert_eq!(bits(&a), bits(&b), "{arch}: host-routed prefill");
    assert_eq!(emulated.hooks.routed_calls.load(Ordering::SeqCst), device_passes, "{arch}: a 40-row pass routed on the host");
    tokens += prompt.len();
    // Batched decode: one row from each of two sequences in one pass (2 rows, device-routed).
    let next = [[prompt[1]], [prompt[2]]];
    let a = decode_two(&host, [&mut ch, &mut ch2], &next);
    let b = decode_two(&device, [&mut cd, &mut cd2], &next);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(bits(x), bits(y), "{arch}: batched decode logits differ");
    }
    tokens += 2;
    // The ids logged on the device were counted: the same selections as the host routing.
    let (lh, ld) = (host.expert_load().unwrap().snapshot(), device.expert_load().unwrap().snapshot());
    assert_eq!(lh.iter().sum::<u64>(), (tokens * k * layers) as u64);
    assert_eq!(lh, ld, "{arch}: expert selections counted");
}

#[test]
fn qwen3moe_device_routing_matches_host_routing_bit_for_bit_and_counts_the_same_experts() {
    check("qwen3moe");
}

#[test]
fn qwen2moe_device_routing_with_the_shared_expert_matches_host_routing() {
    check("qwen2moe");
}

#[test]
fn gpt_oss_device_routing_with_router_and_expert_biases_matches_host_routing() {
    check("gpt-oss");
}
