//! Element-wise ops: bias and residual adds, scaling, and the FFN activations (SwiGLU,
//! GeGLU; their kernels are `quant::simd::{silu, geglu}`), on one thread for decode-sized
//! vectors and in chunks over the pool above `PARALLEL_ELEMS`.

use super::{weights::weight_f32, CpuBackend, CpuBuffer, CpuWeight, PARALLEL_CHUNK, PARALLEL_ELEMS};
use crate::quant;

impl CpuBackend {
    pub(super) fn add_bias_cpu(&self, x: &mut CpuBuffer, b: &CpuWeight, rows: usize) {
        let bv = weight_f32(b);
        let dim = bv.len();
        let x = x.as_mut_slice();
        self.timed("add_bias", rows, || {
            for r in 0..rows {
                for (v, bb) in x[r * dim..(r + 1) * dim].iter_mut().zip(bv.iter()) {
                    *v += bb;
                }
            }
        })
    }

    /// silu(gate) * up with ggml's AVX-512 vector expf (ggml_v_expf / ggml_v_silu), which
    /// differs from libm's expf by up to ~1.5 ulp; the same numbers with or without AVX-512.
    pub(super) fn silu_mul_cpu(&self, gate: &mut CpuBuffer, up: &CpuBuffer, n: usize) {
        let g = gate.as_mut_slice();
        let u = up.as_slice();
        self.timed("silu_mul", 1, || {
            let (g, u) = (&mut g[..n], &u[..n]);
            if n >= PARALLEL_ELEMS {
                // Chunks of a multiple of 16 elements: the same vector lanes as one call.
                self.pool.for_each_chunk_mut(g, PARALLEL_CHUNK, |i, g| {
                    quant::simd::silu::swiglu(g, &u[i * PARALLEL_CHUNK..i * PARALLEL_CHUNK + g.len()])
                });
            } else {
                quant::simd::silu::swiglu(g, u);
            }
        })
    }

    pub(super) fn gelu_tanh_mul_cpu(&self, gate: &mut CpuBuffer, up: &CpuBuffer, n: usize) {
        let g = gate.as_mut_slice();
        let u = up.as_slice();
        self.timed("gelu_tanh_mul", 1, || quant::simd::geglu::geglu_ggml(&mut g[..n], &u[..n]))
    }

    pub(super) fn scale_cpu(&self, x: &mut CpuBuffer, n: usize, s: f32) {
        let xs = x.as_mut_slice();
        self.timed("scale", 1, || xs[..n].iter_mut().for_each(|v| *v *= s))
    }

    pub(super) fn add_cpu(&self, x: &mut CpuBuffer, y: &CpuBuffer, n: usize) {
        let xs = x.as_mut_slice();
        let ys = y.as_slice();
        self.timed("add", 1, || {
            let add = |(xs, ys): (&mut [f32], &[f32])| xs.iter_mut().zip(ys).for_each(|(a, b)| *a += b);
            if n >= PARALLEL_ELEMS {
                let ys = &ys[..n];
                self.pool.for_each_chunk_mut(&mut xs[..n], PARALLEL_CHUNK, |i, xs| {
                    let len = xs.len();
                    add((xs, &ys[i * PARALLEL_CHUNK..i * PARALLEL_CHUNK + len]))
                });
            } else {
                add((&mut xs[..n], &ys[..n]));
            }
        })
    }
}
