//! The model's side of device-side MoE routing (src/model/moe.rs: `Backend::expert_table`,
//! `Backend::routed_experts`, the ids logged on the device and counted after the pass), run on
//! the CPU: a backend that routes "on the device" by doing what the GPU kernels do with CPU ops
//! (each (token, slot) row through its expert alone, the weighted sum) must give the CPU
//! backend's host-routed logits bit for bit, decode and batched decode, and count the same expert
//! selections, so the pass-level bookkeeping (which passes route on the device, where each layer's
//! ids go, the buffer swaps, qwen2moe's shared expert after it) is checked without a GPU.
//! gpt-oss adds the router bias, per-expert bias rows (`Backend::expert_biases`), softmax over
//! the selected logits and `swiglu_oai`, which the emulation applies as the GPU kernels do.

use civetta::backend::{AttentionShape, Backend, KvBlocks, RopeScaling, RopeStyle, RoutedExperts, WeightOf};
use civetta::gguf::{GgmlType, GgufFile};
use civetta::model::{moe, ExpertAct, HParams, Logits, Model, SeqRows};
use civetta::synth::{synth_model, SynthSpec};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The CPU backend with device-style MoE routing emulated (`routed_experts`).
struct Emulated<B: Backend> {
    inner: Arc<B>,
    routed_calls: AtomicUsize,
}

/// One layer's experts: gate, up, down views per expert, and their bias rows (gpt-oss).
struct HostTable<B: Backend> {
    experts: Vec<[WeightOf<B>; 3]>,
    biases: Option<Vec<[WeightOf<B>; 3]>>,
}

impl<B: Backend> Backend for Emulated<B> {
    type Buffer = B::Buffer;
    type KvBuffer = B::KvBuffer;
    type WeightData = B::WeightData;
    type ExpertTable = HostTable<B>;

    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn variant(&self) -> &'static str {
        self.inner.variant()
    }
    fn supports(&self, t: GgmlType) -> bool {
        self.inner.supports(t)
    }
    fn check_model(&self, hp: &HParams) -> civetta::backend::Result<()> {
        self.inner.check_model(hp)
    }
    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> civetta::backend::Result<WeightOf<Self>> {
        self.inner.load_weight(file, name)
    }
    fn alloc(&self, len: usize) -> civetta::backend::Result<Self::Buffer> {
        self.inner.alloc(len)
    }
    fn alloc_kv_cache(&self, len: usize) -> civetta::backend::Result<Self::KvBuffer> {
        self.inner.alloc_kv_cache(len)
    }
    fn kv_cache_elem_bytes(&self) -> usize {
        self.inner.kv_cache_elem_bytes()
    }
    fn write(&self, dst: &mut Self::Buffer, offset: usize, src: &[f32]) -> civetta::backend::Result<()> {
        self.inner.write(dst, offset, src)
    }
    fn read(&self, src: &Self::Buffer, offset: usize, dst: &mut [f32]) -> civetta::backend::Result<()> {
        self.inner.read(src, offset, dst)
    }
    fn embed(&self, table: &WeightOf<Self>, tokens: &[u32], out: &mut Self::Buffer) -> civetta::backend::Result<()> {
        self.inner.embed(table, tokens, out)
    }
    fn rmsnorm(
        &self,
        x: &Self::Buffer,
        w: &WeightOf<Self>,
        rows: usize,
        dim: usize,
        eps: f32,
        out: &mut Self::Buffer,
    ) -> civetta::backend::Result<()> {
        self.inner.rmsnorm(x, w, rows, dim, eps, out)
    }
    fn rmsnorm_inplace(&self, x: &mut Self::Buffer, w: &WeightOf<Self>, rows: usize, dim: usize, eps: f32) -> civetta::backend::Result<()> {
        self.inner.rmsnorm_inplace(x, w, rows, dim, eps)
    }
    fn matmul(&self, w: &WeightOf<Self>, x: &Self::Buffer, rows: usize, out: &mut Self::Buffer) -> civetta::backend::Result<()> {
        self.inner.matmul(w, x, rows, out)
    }
    fn matmul_many(
        &self,
        ws: &[&WeightOf<Self>],
        x: &Self::Buffer,
        rows: usize,
        outs: &mut [&mut Self::Buffer],
    ) -> civetta::backend::Result<()> {
        self.inner.matmul_many(ws, x, rows, outs)
    }
    fn matmul_add(
        &self,
        w: &WeightOf<Self>,
        x: &mut Self::Buffer,
        up: Option<&Self::Buffer>,
        rows: usize,
        out: &mut Self::Buffer,
        scratch: &mut Self::Buffer,
    ) -> civetta::backend::Result<()> {
        self.inner.matmul_add(w, x, up, rows, out, scratch)
    }
    fn add_bias(&self, x: &mut Self::Buffer, b: &WeightOf<Self>, rows: usize) -> civetta::backend::Result<()> {
        self.inner.add_bias(x, b, rows)
    }
    fn rope(
        &self,
        x: &mut Self::Buffer,
        positions: &[u32],
        n_heads: usize,
        head_dim: usize,
        freq_base: f32,
        style: RopeStyle,
    ) -> civetta::backend::Result<()> {
        self.inner.rope(x, positions, n_heads, head_dim, freq_base, style)
    }
    #[allow(clippy::too_many_arguments)]
    fn rope_scaled(
        &self,
        x: &mut Self::Buffer,
        positions: &[u32],
        n_heads: usize,
        head_dim: usize,
        freq_base: f32,
        style: RopeStyle,
        scaling: RopeScaling,
    ) -> civetta::backend::Result<()> {
        self.inner.rope_scaled(x, positions, n_heads, head_dim, freq_base, style, scaling)
    }
    #[allow(clippy::too_many_arguments)]
    fn kv_store(
        &self,
        k: &Self::Buffer,
        v: &Self::Buffer,
        kc: &mut Self::KvBuffer,
        vc: &mut Self::KvBuffer,
        src_row: usize,
        start: usize,
        n: usize,
        kvd: usize,
    ) -> civetta::backend::Result<()> {
        self.inner.kv_store(k, v, kc, vc, src_row, start, n, kvd)
    }
    fn attention(
        &self,
        q: &Self::Buffer,
        k_cache: &Self::KvBuffer,
        v_cache: &Self::KvBuffer,
        s: AttentionShape,
        out: &mut Self::Buffer,
    ) -> civetta::backend::Result<()> {
        self.inner.attention(q, k_cache, v_cache, s, out)
    }
    fn paged_kv(&self) -> bool {
        self.inner.paged_kv()
    }
    #[allow(clippy::too_many_arguments)]
    fn kv_store_paged(
        &self,
        k: &Self::Buffer,
        v: &Self::Buffer,
        k_pool: &mut Self::KvBuffer,
        v_pool: &mut Self::KvBuffer,
        src_row: usize,
        blocks: KvBlocks<'_>,
        start_pos: usize,
        n_tokens: usize,
        kv_dim: usize,
    ) -> civetta::backend::Result<()> {
        self.inner.kv_store_paged(k, v, k_pool, v_pool, src_row, blocks, start_pos, n_tokens, kv_dim)
    }
    fn attention_paged(
        &self,
        q: &Self::Buffer,
        k_pool: &Self::KvBuffer,
        v_pool: &Self::KvBuffer,
        blocks: KvBlocks<'_>,
        s: AttentionShape,
        out: &mut Self::Buffer,
    ) -> civetta::backend::Result<()> {
        self.inner.attention_paged(q, k_pool, v_pool, blocks, s, out)
    }
    #[allow(clippy::too_many_arguments)]
    fn attention_with_sinks(
        &self,
        q: &Self::Buffer,
        k_cache: &Self::KvBuffer,
        v_cache: &Self::KvBuffer,
        blocks: KvBlocks<'_>,
        s: AttentionShape,
        sinks: &[f32],
        out: &mut Self::Buffer,
    ) -> civetta::backend::Result<()> {
        self.inner.attention_with_sinks(q, k_cache, v_cache, blocks, s, sinks, out)
    }
    fn swiglu_oai(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> civetta::backend::Result<()> {
        self.inner.swiglu_oai(gate, up, n)
    }
    fn silu_mul(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> civetta::backend::Result<()> {
        self.inner.silu_mul(gate, up, n)
    }
    fn gelu_tanh_mul(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> civetta::backend::Result<()> {
        self.inner.gelu_tanh_mul(gate, up, n)
    }
    fn scale(&self, x: &mut Self::Buffer, n: usize, s: f32) -> civetta::backend::Result<()> {
        self.inner.scale(x, n, s)
    }
    fn add(&self, x: &mut Self::Buffer, y: &Self::Buffer, n: usize) -> civetta::backend::Result<()> {
        self.inner.add(x, y, n)
    }
    fn copy_row(&self, src: &Self::Buffer, src_row: usize, dim: usize, dst: &mut Self::Buffer) -> civetta::backend::Result<()> {
        self.inner.copy_row(src, src_row, dim, dst)
    }
    fn gather_rows(&self, src: &Self::Buffer, rows: &[usize], dim: usize, dst: &mut Self::Buffer) -> civetta::backend::Result<()> {
        self.inner.gather_rows(src, rows, dim, dst)
    }
    fn weight_rows(&self, w: &WeightOf<Self>, first_row: usize, n_rows: usize, name: &str) -> civetta::backend::Result<WeightOf<Self>> {
        self.inner.weight_rows(w, first_row, n_rows, name)
    }
    fn scatter_rows(&self, src: &Self::Buffer, rows: &[u32], dim: usize, dst: &mut Self::Buffer) -> civetta::backend::Result<()> {
        self.inner.scatter_rows(src, rows, dim, dst)
    }
    fn weighted_sum_rows(
        &self,
        src: &Self::Buffer,
        weights: &[f32],
        n: usize,
        k: usize,
        dim: usize,
        out: &mut Self::Buffer,
    ) -> civetta::backend::Result<()> {
        self.inner.weighted_sum_rows(src, weights, n, k, dim, out)
    }
    fn scale_rows(&self, x: &mut Self::Buffer, scales: &[f32], dim: usize) -> civetta::backend::Result<()> {
        self.inner.scale_rows(x, scales, dim)
    }
    fn synchronize(&self) -> civetta::backend::Result<()> {
        self.inner.synchronize()
    }
    fn run(&self, pass: &mut (dyn FnMut() + Send)) {
        self.inner.run(pass)
    }

    fn expert_table(
        &self,
        gate: &[&WeightOf<Self>],
        up: &[&WeightOf<Self>],
        down: &[&WeightOf<Self>],
    ) -> civetta::backend::Result<Option<Self::ExpertTable>> {
        let view = |w: &WeightOf<Self>| self.inner.weight_rows(w, 0, w.rows, &w.name);
        let experts =
            (0..gate.len()).map(|e| Ok([view(gate[e])?, view(up[e])?, view(down[e])?])).collect::<civetta::backend::Result<_>>()?;
        Ok(Some(HostTable { experts, biases: None }))
    }
    fn expert_biases(
        &self,
        table: &mut Self::ExpertTable,
        gate: &[&WeightOf<Self>],
        up: &[&WeightOf<Self>],
        down: &[&WeightOf<Self>],
    ) -> civetta::backend::Result<bool> {
        let view = |w: &WeightOf<Self>| self.inner.weight_rows(w, 0, w.rows, &w.name);
        let rows = (0..gate.len()).map(|e| Ok([view(gate[e])?, view(up[e])?, view(down[e])?])).collect::<civetta::backend::Result<_>>()?;
        table.biases = Some(rows);
        Ok(true)
    }
    fn routed_experts(&self, r: RoutedExperts<'_, Self>) -> civetta::backend::Result<()> {
        self.routed_calls.fetch_add(1, Ordering::SeqCst);
        let (p, n, d) = (r.params, r.n, r.dim);
        let k = p.n_expert_used;
        let mut logits = vec![0f32; n * p.n_expert];
        self.inner.read(r.logits, 0, &mut logits)?;
        if let Some(b) = r.router_bias {
            logits.chunks_exact_mut(p.n_expert).for_each(|row| row.iter_mut().zip(b).for_each(|(x, b)| *x += b));
        }
        let routing = moe::route(&logits, p);
        // As the GPU kernels leave them: ids (as i32 bits) then weights, and the ids logged.
        let ids: Vec<f32> = routing.experts.iter().map(|&e| f32::from_bits(e)).collect();
        self.inner.write(r.choice, 0, &ids)?;
        self.inner.write(r.choice, n * k, &routing.weights)?;
        self.inner.write(r.ids_log.0, r.ids_log.1, &ids)?;
        // Each (token, slot) row alone through its expert, as the per-slot mat-vecs do.
        let ff = r.table.experts[0][0].rows;
        let (mut xe, mut g, mut u, mut y) = (self.inner.alloc(d)?, self.inner.alloc(ff)?, self.inner.alloc(ff)?, self.inner.alloc(d)?);
        let mut slots = self.inner.alloc(n * k * d)?;
        let mut row = vec![0f32; d];
        for (i, &e) in routing.experts.iter().enumerate() {
            let [wg, wu, wd] = &r.table.experts[e as usize];
            self.inner.copy_row(r.x, i / k, d, &mut xe)?;
            let bias = r.table.biases.as_ref().map(|b| &b[e as usize]);
            self.inner.matmul(wg, &xe, 1, &mut g)?;
            self.inner.matmul(wu, &xe, 1, &mut u)?;
            if let Some([bg, bu, _]) = bias {
                self.inner.add_bias(&mut g, bg, 1)?;
                self.inner.add_bias(&mut u, bu, 1)?;
            }
            match p.act {
                ExpertAct::SwiGlu => self.inner.silu_mul(&mut g, &u, ff)?,
                ExpertAct::SwiGluOai => self.inner.swiglu_oai(&mut g, &u, ff)?,
            }
            self.inner.matmul(wd, &g, 1, &mut y)?;
            if let Some([_, _, bd]) = bias {
                self.inner.add_bias(&mut y, bd, 1)?;
            }
            self.inner.read(&y, 0, &mut row)?;
            self.inner.write(&mut slots, i * d, &row)?;
        }
        self.inner.weighted_sum_rows(&slots, &routing.weights, n, k, d, r.out)
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
    let emulated = Arc::new(Emulated { inner: cpu.clone(), routed_calls: AtomicUsize::new(0) });
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
    let device_passes = emulated.routed_calls.load(Ordering::SeqCst);
    assert_eq!(device_passes, 5 * layers, "{arch}: every MoE layer of every pass routed on the device");
    // A prefill longer than DEVICE_ROUTING_MAX_ROWS routes on the host in both.
    let (mut ch2, mut cd2) = (host.new_cache(64).unwrap(), device.new_cache(64).unwrap());
    let a = host.forward(&mut ch2, &prompt, Logits::Last).unwrap();
    let b = device.forward(&mut cd2, &prompt, Logits::Last).unwrap();
    assert_eq!(bits(&a), bits(&b), "{arch}: host-routed prefill");
    assert_eq!(emulated.routed_calls.load(Ordering::SeqCst), device_passes, "{arch}: a 40-row pass routed on the host");
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
