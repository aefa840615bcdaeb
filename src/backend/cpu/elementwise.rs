//! Element-wise ops: bias and residual adds, scaling, and the FFN activations (SwiGLU,
//! GeGLU; their kernels are `quant::simd::{silu, geglu}`), on one thread for decode-sized
//! vectors and in chunks over the pool above `PARALLEL_ELEMS`.

use super::{buf, buf_mut, weights::weight_f32, CpuBackend, PARALLEL_CHUNK, PARALLEL_ELEMS};
use crate::backend::{Buffer, Weight};
use crate::quant;
use rayon::prelude::*;

impl CpuBackend {
    pub(super) fn add_bias_cpu(&self, x: &mut Buffer, b: &Weight, rows: usize) {
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

    /// silu(gate) * up with ggml's AVX-512 vector expf (ggml_v_expf / ggml_v_silu), which
    /// differs from libm's expf by up to ~1.5 ulp; the same numbers with or without AVX-512.
    pub(super) fn silu_mul_cpu(&self, gate: &mut Buffer, up: &Buffer, n: usize) {
        let g = buf_mut(gate);
        let u = buf(up);
        self.timed("silu_mul", 1, || {
            let (g, u) = (&mut g[..n], &u[..n]);
            if n >= PARALLEL_ELEMS {
                // Chunks of a multiple of 16 elements: the same vector lanes as one call.
                self.pool.install(|| {
                    g.par_chunks_mut(PARALLEL_CHUNK).zip(u.par_chunks(PARALLEL_CHUNK)).for_each(|(g, u)| quant::simd::silu::swiglu(g, u))
                });
            } else {
                quant::simd::silu::swiglu(g, u);
            }
        })
    }

    pub(super) fn gelu_tanh_mul_cpu(&self, gate: &mut Buffer, up: &Buffer, n: usize) {
        let g = buf_mut(gate);
        let u = buf(up);
        self.timed("gelu_tanh_mul", 1, || quant::simd::geglu::geglu_ggml(&mut g[..n], &u[..n]))
    }

    pub(super) fn scale_cpu(&self, x: &mut Buffer, n: usize, s: f32) {
        let xs = buf_mut(x);
        self.timed("scale", 1, || xs[..n].iter_mut().for_each(|v| *v *= s))
    }

    pub(super) fn add_cpu(&self, x: &mut Buffer, y: &Buffer, n: usize) {
        let xs = buf_mut(x);
        let ys = buf(y);
        self.timed("add", 1, || {
            let add = |(xs, ys): (&mut [f32], &[f32])| xs.iter_mut().zip(ys).for_each(|(a, b)| *a += b);
            if n >= PARALLEL_ELEMS {
                self.pool.install(|| xs[..n].par_chunks_mut(PARALLEL_CHUNK).zip(ys[..n].par_chunks(PARALLEL_CHUNK)).for_each(add));
            } else {
                add((&mut xs[..n], &ys[..n]));
            }
        })
    }
}
