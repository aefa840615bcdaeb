//! The CPU backend: rayon threads over the quantised dot products of `crate::quant`.
//!
//! Weights stay in the memory-mapped GGUF file (no copy); activations are f32 `Vec`s.
//! Matmuls quantise the activation rows once (Q8_0 / Q8_K, like ggml) and then run
//! integer block dot products in parallel over weight rows.

use super::{AttentionShape, Backend, Buffer, RopeStyle, Weight};
use crate::gguf::{GgmlType, GgufFile};
use crate::kernel_registry::{self, shape_class};
use crate::quant;
use anyhow::{bail, Context};
use rayon::prelude::*;
use std::sync::Arc;

pub struct CpuBackend {
    pool: rayon::ThreadPool,
    threads: usize,
}

/// A weight borrowed from the mmap of its file.
struct CpuWeight {
    file: Arc<GgufFile>,
    index: usize,
}

impl CpuWeight {
    fn bytes(&self) -> &[u8] {
        self.file.tensor_data(&self.file.tensors[self.index])
    }
}

/// Raw pointer for disjoint parallel writes into one output slice.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// A method (not field access) so closures capture the whole Send wrapper.
    fn at(self, i: usize) -> *mut f32 {
        // SAFETY: callers stay inside the slice the pointer came from.
        unsafe { self.0.add(i) }
    }
}

fn buf(b: &Buffer) -> &[f32] {
    b.inner.downcast_ref::<Vec<f32>>().expect("CPU backend got a foreign buffer")
}

fn buf_mut(b: &mut Buffer) -> &mut [f32] {
    b.inner.downcast_mut::<Vec<f32>>().expect("CPU backend got a foreign buffer")
}

fn weight(w: &Weight) -> &CpuWeight {
    w.inner.downcast_ref::<CpuWeight>().expect("CPU backend got a foreign weight")
}

impl CpuBackend {
    pub fn new(threads: usize) -> anyhow::Result<Self> {
        let threads = if threads == 0 { std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) } else { threads };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("civetta-cpu-{i}"))
            .build()
            .context("creating the CPU thread pool")?;
        Ok(CpuBackend { pool, threads })
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    fn timed<R>(&self, kernel: &str, rows: usize, f: impl FnOnce() -> R) -> R {
        kernel_registry::time(kernel, shape_class(rows), "cpu", quant::simd_level(), f)
    }
}

fn matmul_kernel_name(t: GgmlType) -> &'static str {
    match t {
        GgmlType::F32 => "matmul_f32",
        GgmlType::F16 => "matmul_f16",
        GgmlType::BF16 => "matmul_bf16",
        GgmlType::Q8_0 => "matmul_q8_0",
        GgmlType::Q4_0 => "matmul_q4_0",
        GgmlType::Q4_1 => "matmul_q4_1",
        GgmlType::Q4_K => "matmul_q4_k",
        GgmlType::Q5_K => "matmul_q5_k",
        GgmlType::Q6_K => "matmul_q6_k",
        _ => "matmul_other",
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn variant(&self) -> &'static str {
        quant::simd_level()
    }

    fn supports(&self, t: GgmlType) -> bool {
        quant::supports(t)
    }

    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> anyhow::Result<Weight> {
        let index = file
            .tensors
            .iter()
            .position(|t| t.name == name)
            .with_context(|| format!("{}: tensor \"{name}\" is missing", file.path.display()))?;
        let info = &file.tensors[index];
        if !quant::supports(info.ggml_type) {
            bail!("{}: tensor \"{name}\" has type {} which the CPU backend does not support", file.path.display(), info.ggml_type);
        }
        let cols = *info.dims.first().unwrap_or(&1) as usize;
        let rows = info.dims.iter().skip(1).product::<u64>() as usize;
        Ok(Weight {
            name: name.to_string(),
            ggml_type: info.ggml_type,
            rows,
            cols,
            inner: Box::new(CpuWeight { file: file.clone(), index }),
        })
    }

    fn alloc(&self, len: usize) -> anyhow::Result<Buffer> {
        Ok(Buffer { len, inner: Box::new(vec![0f32; len]) })
    }

    fn write(&self, dst: &mut Buffer, offset: usize, src: &[f32]) {
        buf_mut(dst)[offset..offset + src.len()].copy_from_slice(src);
    }

    fn read(&self, src: &Buffer, offset: usize, dst: &mut [f32]) {
        dst.copy_from_slice(&buf(src)[offset..offset + dst.len()]);
    }

    fn embed(&self, table: &Weight, tokens: &[u32], out: &mut Buffer) -> anyhow::Result<()> {
        let w = weight(table);
        let dim = table.cols;
        let row_bytes = table.ggml_type.row_bytes(dim).context("embedding row size")?;
        let bytes = w.bytes();
        let o = buf_mut(out);
        self.timed("embed", tokens.len(), || {
            for (t, &id) in tokens.iter().enumerate() {
                let id = id as usize;
                if id >= table.rows {
                    bail!("token id {id} is outside the vocabulary ({} tokens)", table.rows);
                }
                quant::dequantize_row(table.ggml_type, &bytes[id * row_bytes..(id + 1) * row_bytes], &mut o[t * dim..(t + 1) * dim])?;
            }
            Ok(())
        })
    }

    fn rmsnorm(&self, x: &Buffer, w: &Weight, rows: usize, dim: usize, eps: f32, out: &mut Buffer) {
        let x = buf(x);
        let o = buf_mut(out);
        let wv = weight_f32(w);
        self.timed("rmsnorm", rows, || {
            for r in 0..rows {
                rmsnorm_row(&x[r * dim..(r + 1) * dim], &wv, eps, &mut o[r * dim..(r + 1) * dim]);
            }
        })
    }

    fn rmsnorm_inplace(&self, x: &mut Buffer, w: &Weight, rows: usize, dim: usize, eps: f32) {
        let x = buf_mut(x);
        let wv = weight_f32(w);
        self.timed("rmsnorm", rows, || {
            for r in 0..rows {
                let row = &mut x[r * dim..(r + 1) * dim];
                let scale = rms_scale(row, eps);
                for (v, g) in row.iter_mut().zip(wv.iter()) {
                    *v = *v * scale * g;
                }
            }
        })
    }

    fn matmul(&self, w: &Weight, x: &Buffer, rows: usize, out: &mut Buffer) {
        let cw = weight(w);
        let k = w.cols;
        let n = w.rows;
        let t = w.ggml_type;
        let fmt = quant::act_format(t);
        let act_bytes = quant::act_row_bytes(fmt, k);
        let w_bytes = t.row_bytes(k).expect("weight row size checked at load");
        let x = buf(x);
        let o = buf_mut(out);
        assert!(x.len() >= rows * k && o.len() >= rows * n, "matmul {}: buffers too small", w.name);
        let bytes = cw.bytes();
        self.timed(matmul_kernel_name(t), rows, || {
            self.pool.install(|| {
                let mut acts = vec![0u8; act_bytes * rows];
                acts.par_chunks_mut(act_bytes).enumerate().for_each(|(r, dst)| {
                    quant::quantize_act_row(fmt, &x[r * k..(r + 1) * k], dst);
                });
                let optr = SendPtr(o.as_mut_ptr());
                // Work items are blocks of weight rows; each block is reused across all
                // activation rows while it sits in cache.
                let block = 8usize;
                (0..n.div_ceil(block)).into_par_iter().for_each(|b| {
                    let r0 = b * block;
                    let r1 = (r0 + block).min(n);
                    for r in r0..r1 {
                        let wr = &bytes[r * w_bytes..(r + 1) * w_bytes];
                        for tok in 0..rows {
                            let v = quant::vec_dot(t, wr, &acts[tok * act_bytes..(tok + 1) * act_bytes], k);
                            // SAFETY: (tok, r) pairs are disjoint across work items.
                            unsafe { *optr.at(tok * n + r) = v };
                        }
                    }
                });
            })
        })
    }

    fn add_bias(&self, x: &mut Buffer, b: &Weight, rows: usize) {
        let bv = weight_f32(b);
        let dim = bv.len();
        let x = buf_mut(x);
        self.timed("add_bias", rows, || {
            for r in 0..rows {
                for (v, bb) in x[r * dim..(r + 1) * dim].iter_mut().zip(bv.iter()) {
                    *v += bb;
                }
            }
        })
    }

    fn rope(&self, x: &mut Buffer, positions: &[u32], n_heads: usize, head_dim: usize, freq_base: f32, style: RopeStyle) {
        let x = buf_mut(x);
        let half = head_dim / 2;
        self.timed("rope", positions.len(), || {
            let mut cos = vec![0f32; half];
            let mut sin = vec![0f32; half];
            // Same recurrence as ggml's rope: theta_i = p * base^(-2i/d), in f32.
            let theta_scale = freq_base.powf(-2.0 / head_dim as f32);
            for (t, &p) in positions.iter().enumerate() {
                let mut theta = p as f32;
                for i in 0..half {
                    cos[i] = theta.cos();
                    sin[i] = theta.sin();
                    theta *= theta_scale;
                }
                let row = &mut x[t * n_heads * head_dim..(t + 1) * n_heads * head_dim];
                for h in 0..n_heads {
                    let v = &mut row[h * head_dim..(h + 1) * head_dim];
                    for i in 0..half {
                        let (a, b) = match style {
                            RopeStyle::Norm => (2 * i, 2 * i + 1),
                            RopeStyle::Neox => (i, i + half),
                        };
                        let (x0, x1) = (v[a], v[b]);
                        v[a] = x0 * cos[i] - x1 * sin[i];
                        v[b] = x0 * sin[i] + x1 * cos[i];
                    }
                }
            }
        })
    }

    fn kv_store(
        &self,
        k: &Buffer,
        v: &Buffer,
        k_cache: &mut Buffer,
        v_cache: &mut Buffer,
        start_pos: usize,
        n_tokens: usize,
        kv_dim: usize,
    ) {
        self.timed("kv_store", n_tokens, || {
            let n = n_tokens * kv_dim;
            buf_mut(k_cache)[start_pos * kv_dim..start_pos * kv_dim + n].copy_from_slice(&buf(k)[..n]);
            buf_mut(v_cache)[start_pos * kv_dim..start_pos * kv_dim + n].copy_from_slice(&buf(v)[..n]);
        })
    }

    fn attention(&self, q: &Buffer, k_cache: &Buffer, v_cache: &Buffer, s: AttentionShape, out: &mut Buffer) {
        let q = buf(q);
        let kc = buf(k_cache);
        let vc = buf(v_cache);
        let o = buf_mut(out);
        let hd = s.head_dim;
        let kv_dim = s.n_head_kv * hd;
        let group = s.n_head / s.n_head_kv;
        let scale = 1.0 / (hd as f32).sqrt();
        let q_dim = s.n_head * hd;
        self.timed("attention", s.n_tokens, || {
            self.pool.install(|| {
                o[..s.n_tokens * q_dim].par_chunks_mut(hd).enumerate().for_each(|(idx, out_h)| {
                    let t = idx / s.n_head;
                    let h = idx % s.n_head;
                    let g = h / group;
                    let pos = s.start_pos + t;
                    let qh = &q[t * q_dim + h * hd..t * q_dim + (h + 1) * hd];
                    let mut scores = Vec::with_capacity(pos + 1);
                    let mut max = f32::NEG_INFINITY;
                    for j in 0..=pos {
                        let kh = &kc[j * kv_dim + g * hd..j * kv_dim + (g + 1) * hd];
                        let sc = dot_f32(qh, kh) * scale;
                        max = max.max(sc);
                        scores.push(sc);
                    }
                    let mut sum = 0f32;
                    for sc in scores.iter_mut() {
                        *sc = (*sc - max).exp();
                        sum += *sc;
                    }
                    let inv = 1.0 / sum;
                    out_h.fill(0.0);
                    for (j, &p) in scores.iter().enumerate() {
                        let vh = &vc[j * kv_dim + g * hd..j * kv_dim + (g + 1) * hd];
                        let w = p * inv;
                        for (acc, vv) in out_h.iter_mut().zip(vh) {
                            *acc += w * vv;
                        }
                    }
                });
            })
        })
    }

    fn silu_mul(&self, gate: &mut Buffer, up: &Buffer, n: usize) {
        let g = buf_mut(gate);
        let u = buf(up);
        self.timed("silu_mul", 1, || {
            for (a, b) in g[..n].iter_mut().zip(&u[..n]) {
                *a = *a / (1.0 + (-*a).exp()) * b;
            }
        })
    }

    fn add(&self, x: &mut Buffer, y: &Buffer, n: usize) {
        let xs = buf_mut(x);
        let ys = buf(y);
        self.timed("add", 1, || {
            for (a, b) in xs[..n].iter_mut().zip(&ys[..n]) {
                *a += b;
            }
        })
    }

    fn copy_row(&self, src: &Buffer, src_row: usize, dim: usize, dst: &mut Buffer) {
        buf_mut(dst)[..dim].copy_from_slice(&buf(src)[src_row * dim..(src_row + 1) * dim]);
    }
}

/// Norm and bias vectors are small F32 (sometimes F16) tensors: dequantise on use.
fn weight_f32(w: &Weight) -> std::borrow::Cow<'_, [f32]> {
    let cw = weight(w);
    let bytes = cw.bytes();
    let n = w.rows * w.cols;
    if w.ggml_type == GgmlType::F32 && (bytes.as_ptr() as usize).is_multiple_of(4) {
        // SAFETY: F32 tensor data is 4-byte aligned (checked) and exactly n*4 bytes long.
        return std::borrow::Cow::Borrowed(unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const f32, n) });
    }
    let mut v = vec![0f32; n];
    quant::dequantize_row(w.ggml_type, bytes, &mut v).expect("norm weight dequantisation");
    std::borrow::Cow::Owned(v)
}

/// 1/rms with the sum of squares in f64, as ggml does.
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let mean = (ss / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

fn rmsnorm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

#[inline]
fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent accumulators so the compiler vectorises without fast-math.
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks * 8..a.len() {
        s += a[i] * b[i];
    }
    s
}
