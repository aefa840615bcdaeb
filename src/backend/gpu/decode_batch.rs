//! Batched decode attention (issue #17): one launch for all the sequences of a decode step (one
//! row each) that stores their new k and v rows and attends, instead of two launches per
//! sequence and layer. At 16 sequences that is 1 launch per layer instead of 32, which is most
//! of a batched step's launches once the mat-vecs read their weights once for all rows
//! (kernels/matvec_dp4a.hip's `_x8` / `_x16` builds).
//!
//! The kernel (`attn_decode_batch_d*` in kernels/attention.hip) finds each sequence's caches in
//! a device table of pointers (k0, v0, k1, v1, ...; device_tables.rs) and its position in the
//! positions buffer RoPE reads. A table is made once per distinct list of caches (a layer of a
//! set of sequences) and kept, so the launches of a step are the same from token to token and its
//! decode graph replays.

use super::api::DevicePtr;
use super::Args;
use super::{AttentionShape, FreshQ8, GpuApi, GpuBackend, GpuBuffer};
use crate::backend::Result;

impl<A: GpuApi> GpuBackend<A> {
    /// `Backend::decode_attention_batch`: Ok(false) where it does not apply (`batched_attention`
    /// off, a head size without a kernel, positions not as RoPE uploaded them).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn try_decode_attention_batch(
        &self,
        q: &GpuBuffer,
        k: &GpuBuffer,
        v: &GpuBuffer,
        caches: &[(&mut GpuBuffer, &mut GpuBuffer)],
        start_pos: &[usize],
        s: AttentionShape,
        out: &GpuBuffer,
    ) -> Result<bool> {
        // The attention kernel also stores each row's k and v into its sequence's caches.
        let attend = match s.head_dim {
            64 => "attn_decode_batch_d64",
            128 => "attn_decode_batch_d128",
            256 => "attn_decode_batch_d256",
            _ => return Ok(false),
        };
        if !self.batched_attention || caches.is_empty() || caches.len() != start_pos.len() {
            return Ok(false);
        }
        // Row i's position is read on the device (graphs replay unchanged): it must be there.
        let pos = {
            let cached = self.positions.lock();
            match cached.as_ref() {
                Some(p) if p.values.len() >= start_pos.len() && p.values.iter().zip(start_pos).all(|(&a, &b)| a as usize == b) => p.buf.ptr,
                _ => return Ok(false),
            }
        };
        let ptrs: Vec<DevicePtr> = caches.iter().flat_map(|(kc, vc)| [kc.mem.ptr, vc.mem.ptr]).collect();
        let table = self.kv_table(&ptrs)?;
        let n = caches.len();
        let scale = 1.0 / (s.head_dim as f32).sqrt();
        // The output also as the o projection's q8_1 input, where its mat-vec takes that.
        let width = s.n_head * s.head_dim;
        let out_q8 = self.decode_out_q8(n, width)?;
        let (qp, dsp) = out_q8.as_ref().map_or((0, 0), |(xq, xds)| (xq.ptr, xds.mem.ptr));
        self.launch(
            attend,
            n,
            [s.n_head, n, 1],
            Args::default()
                .ptr(q.mem.ptr)
                .ptr(table)
                .ptr(out.mem.ptr)
                .ptr(pos)
                .i32(s.n_head)
                .i32(s.n_head_kv)
                .f32(scale)
                .ptr(qp)
                .ptr(dsp)
                .ptr(k.mem.ptr)
                .ptr(v.mem.ptr),
        )?;
        if let Some((xq, xds)) = out_q8 {
            *self.fresh_q8.lock() = Some(FreshQ8 { x: out.mem.ptr, len: n * width, q: xq, ds: xds });
        }
        Ok(true)
    }
}
