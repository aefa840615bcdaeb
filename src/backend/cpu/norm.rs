//! RMS norm as ggml computes it (squares summed in f64), one row per work item.

use super::{weights::weight_f32, CpuBackend, CpuBuffer, CpuWeight, PARALLEL_ELEMS};

impl CpuBackend {
    pub(super) fn rmsnorm_cpu(&self, x: &CpuBuffer, w: &CpuWeight, rows: usize, dim: usize, eps: f32, out: &mut CpuBuffer) {
        let x = x.as_slice();
        let o = out.as_mut_slice();
        let wv = weight_f32(w);
        self.timed("rmsnorm", rows, || {
            let (x, o) = (&x[..rows * dim], &mut o[..rows * dim]);
            if rows * dim >= PARALLEL_ELEMS {
                self.pool.for_each_chunk_mut(o, dim, |r, or| rmsnorm_row(&x[r * dim..(r + 1) * dim], &wv, eps, or));
            } else {
                x.chunks(dim).zip(o.chunks_mut(dim)).for_each(|(xr, or)| rmsnorm_row(xr, &wv, eps, or));
            }
        })
    }

    pub(super) fn rmsnorm_inplace_cpu(&self, x: &mut CpuBuffer, w: &CpuWeight, rows: usize, dim: usize, eps: f32) {
        let x = x.as_mut_slice();
        let wv = weight_f32(w);
        self.timed("rmsnorm", rows, || {
            let norm = |row: &mut [f32]| {
                let scale = rms_scale(row, eps);
                for (v, g) in row.iter_mut().zip(wv.iter()) {
                    *v = *v * scale * g;
                }
            };
            let x = &mut x[..rows * dim];
            if rows * dim >= PARALLEL_ELEMS {
                self.pool.for_each_chunk_mut(x, dim, |_, row| norm(row));
            } else {
                x.chunks_mut(dim).for_each(norm);
            }
        })
    }
}

/// 1/rms as ggml's rms_norm: squares in f32, summed in f64 in order, mean rounded to f32.
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let ss: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (ss / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

fn rmsnorm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}
