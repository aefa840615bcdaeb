//! Batched prefill attention (issue #14): a step that prefills several prompts (or prompt
//! chunks) stores their new k and v rows in one launch and attends in one launch per layer,
//! instead of two launches per sequence and layer. A serving step that starts 16 streams made
//! 16 x 2 x 28 = 896 such launches, each a few microseconds of host and device time (docs/GPU.md,
//! "Issues #14 / #17, session 20").
//!
//! The kernels (`kv_store_prefill_batch_f16` in kernels/kv_cache.hip, `attn_prefill_batch*` in
//! kernels/attention.hip) find each sequence's caches in a table of pointers and their rows in
//! a descriptor table (device_tables.rs), laid out as i32s:
//! - per sequence s, 4 values: its first row in q, k, v and out; its rows; its first position; 0;
//! - per attention workgroup (query tile), 2 values: its sequence, its tile in that sequence;
//! - per stored row, 2 values: its sequence, its row in that sequence.
//!
//! Every workgroup computes what the per-sequence launch's workgroup for the same tile does, and
//! the store converts each value the same way, so the results are the per-sequence path's bits.

use super::api::DevicePtr;
use super::Args;
use super::{AttentionShape, GpuApi, GpuBackend, GpuBuffer};
use crate::backend::Result;

/// A batched prefill's descriptor table and where its parts start (in i32s).
struct Descriptors {
    values: Vec<i32>,
    tiles_at: usize,
    tiles: usize,
    rows_at: usize,
    rows: usize,
}

/// The descriptor table of `shapes` for an attention kernel taking `per_group` queries per
/// workgroup. None where a value does not fit an i32.
fn descriptors(shapes: &[AttentionShape], per_group: usize) -> Option<Descriptors> {
    let i = |x: usize| i32::try_from(x).ok();
    let mut values = Vec::new();
    for s in shapes {
        values.extend([i(s.first_row)?, i(s.n_tokens)?, i(s.start_pos)?, 0]);
    }
    let tiles_at = values.len();
    for (seq, s) in shapes.iter().enumerate() {
        for tile in 0..s.n_tokens.div_ceil(per_group) {
            values.extend([i(seq)?, i(tile)?]);
        }
    }
    let rows_at = values.len();
    for (seq, s) in shapes.iter().enumerate() {
        for t in 0..s.n_tokens {
            values.extend([i(seq)?, i(t)?]);
        }
    }
    let (tiles, rows) = ((rows_at - tiles_at) / 2, (values.len() - rows_at) / 2);
    Some(Descriptors { values, tiles_at, tiles, rows_at, rows })
}

impl<A: GpuApi> GpuBackend<A> {
    /// `Backend::prefill_attention_batch`: Ok(false) where it does not apply (`batched_attention`
    /// off, fewer than two sequences, a sequence of one row, which the decode kernel serves,
    /// shapes that differ in their heads or window, a head size without a kernel).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn try_prefill_attention_batch(
        &self,
        q: &GpuBuffer,
        k: &GpuBuffer,
        v: &GpuBuffer,
        caches: &[(&mut GpuBuffer, &mut GpuBuffer)],
        shapes: &[AttentionShape],
        sinks: Option<&[f32]>,
        out: &GpuBuffer,
    ) -> Result<bool> {
        let Some(&first) = shapes.first() else { return Ok(false) };
        let same_layer = |s: &AttentionShape| {
            (s.n_head, s.n_head_kv, s.head_dim, s.window) == (first.n_head, first.n_head_kv, first.head_dim, first.window)
        };
        if !self.batched_attention
            || shapes.len() < 2
            || caches.len() != shapes.len()
            || shapes.iter().any(|s| s.n_tokens < 2 || !same_layer(s))
        {
            return Ok(false);
        }
        // The kernel the per-sequence path would take (attention_dev), and its queries per workgroup.
        let (attend, per_group) = match (first.head_dim, self.prefill_attention_mma) {
            (64, true) => ("attn_prefill_batch_mma_d64", 64),
            (128, true) => ("attn_prefill_batch_mma_d128", 64),
            (64, false) => ("attn_prefill_batch_d64", 32),
            (128, false) => ("attn_prefill_batch_d128", 32),
            (256, _) => ("attn_prefill_batch_d256", 32),
            _ => return Ok(false),
        };
        let Some(d) = descriptors(shapes, per_group) else { return Ok(false) };
        let sinks = match sinks {
            Some(s) => self.sinks_on_device(s, first)?,
            None => 0,
        };
        let ptrs: Vec<DevicePtr> = caches.iter().flat_map(|(kc, vc)| [kc.mem.ptr, vc.mem.ptr]).collect();
        let kv = self.kv_table(&ptrs)?;
        let table = self.i32_table(&d.values)?;
        let (tiles, rows) = (table + d.tiles_at as u64 * 4, table + d.rows_at as u64 * 4);
        let kv_dim = first.n_head_kv * first.head_dim;
        self.launch(
            "kv_store_prefill_batch_f16",
            d.rows,
            [kv_dim.div_ceil(256), d.rows, 2],
            Args::default().ptr(k.mem.ptr).ptr(v.mem.ptr).ptr(kv).ptr(table).ptr(rows).i32(kv_dim),
        )?;
        let scale = 1.0 / (first.head_dim as f32).sqrt();
        self.launch(
            attend,
            d.rows,
            [d.tiles, first.n_head, 1],
            Args::default()
                .ptr(q.mem.ptr)
                .ptr(kv)
                .ptr(out.mem.ptr)
                .ptr(table)
                .ptr(tiles)
                .i32(first.n_head)
                .i32(first.n_head_kv)
                .f32(scale)
                .i32(first.window.unwrap_or(0))
                .ptr(sinks),
        )?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(first_row: usize, n_tokens: usize, start_pos: usize) -> AttentionShape {
        AttentionShape { n_tokens, start_pos, first_row, n_head: 4, n_head_kv: 2, head_dim: 64, window: None }
    }

    #[test]
    fn descriptors_list_each_sequence_its_tiles_and_its_rows() {
        // Rows 0..70 are sequence 0 (a 70-row prompt from position 0), 70..73 sequence 1 (a
        // 3-row chunk from position 100).
        let d = descriptors(&[shape(0, 70, 0), shape(70, 3, 100)], 64).unwrap();
        assert_eq!(&d.values[..8], &[0, 70, 0, 0, 70, 3, 100, 0]);
        assert_eq!((d.tiles_at, d.tiles), (8, 3));
        assert_eq!(&d.values[8..14], &[0, 0, 0, 1, 1, 0]);
        assert_eq!((d.rows_at, d.rows), (14, 73));
        assert_eq!(&d.values[14..16], &[0, 0]);
        assert_eq!(&d.values[14 + 2 * 69..14 + 2 * 71], &[0, 69, 1, 0]);
        assert_eq!(&d.values[d.values.len() - 2..], &[1, 2]);
    }

    #[test]
    fn descriptors_refuse_values_past_i32() {
        assert!(descriptors(&[shape(0, 2, usize::MAX / 2)], 64).is_none());
    }
}
