//! Batched attention for steps that prefill (issue #14): a step that brings several sequences,
//! some with prompt rows (prompts or prompt chunks) and some with one decode row, stores the
//! prompt rows' k and v in one launch and attends for them in one launch per layer, and attends
//! for the decode rows (storing their k and v) in one more, instead of two launches per sequence
//! and layer. A serving step that starts 16 streams made 16 x 2 x 28 = 896 such launches, each a
//! few microseconds of host and device time (docs/GPU.md, "Issues #14 / #17, session 20"); a
//! step where a request arrives while 15 others decode made 32 per layer.
//!
//! The kernels (`kv_store_prefill_batch_f16` in kernels/kv_cache.hip, `attn_prefill_batch*` and
//! `attn_decode_rows_d*` in kernels/attention.hip) find each sequence's caches in a table of
//! pointers and their rows in a descriptor table (device_tables.rs), laid out as i32s:
//! - per sequence s, 4 values: its first row in q, k, v and out; its rows; its first position; 0;
//! - per prefill attention workgroup (query tile), 2 values: its sequence, its tile in it;
//! - per stored prompt row, 2 values: its sequence, its row in that sequence;
//! - per one-row sequence, 1 value: the sequence.
//!
//! Every workgroup computes what the per-sequence launch's workgroup for the same tile or head
//! does (the prefill kernels' for prompt rows, `attn_decode_pos_d*` for decode rows), and the
//! store converts each value the same way, so the results are the per-sequence path's bits.

use super::api::DevicePtr;
use super::Args;
use super::{AttentionShape, GpuApi, GpuBackend, GpuBuffer};
use crate::backend::Result;

/// A batch's descriptor table and where its parts start (in i32s).
struct Descriptors {
    values: Vec<i32>,
    tiles_at: usize,
    tiles: usize,
    rows_at: usize,
    rows: usize,
    decode_at: usize,
    decode: usize,
}

/// The descriptor table of `shapes` for a prefill attention kernel taking `per_group` queries
/// per workgroup. None where a value does not fit an i32.
fn descriptors(shapes: &[AttentionShape], per_group: usize) -> Option<Descriptors> {
    let i = |x: usize| i32::try_from(x).ok();
    let mut values = Vec::new();
    for s in shapes {
        values.extend([i(s.first_row)?, i(s.n_tokens)?, i(s.start_pos)?, 0]);
    }
    let prompts = || shapes.iter().enumerate().filter(|(_, s)| s.n_tokens > 1);
    let tiles_at = values.len();
    for (seq, s) in prompts() {
        for tile in 0..s.n_tokens.div_ceil(per_group) {
            values.extend([i(seq)?, i(tile)?]);
        }
    }
    let rows_at = values.len();
    for (seq, s) in prompts() {
        for t in 0..s.n_tokens {
            values.extend([i(seq)?, i(t)?]);
        }
    }
    let decode_at = values.len();
    for (seq, _) in shapes.iter().enumerate().filter(|(_, s)| s.n_tokens == 1) {
        values.push(i(seq)?);
    }
    let (tiles, rows, decode) = ((rows_at - tiles_at) / 2, (decode_at - rows_at) / 2, values.len() - decode_at);
    Some(Descriptors { values, tiles_at, tiles, rows_at, rows, decode_at, decode })
}

impl<A: GpuApi> GpuBackend<A> {
    /// `Backend::attention_batch`: Ok(false) where it does not apply (`batched_prefill_attention` off,
    /// fewer than two sequences, only decode rows, shapes that differ in their heads or window,
    /// a windowed layer with a one-row sequence, a head size without a kernel).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn try_attention_batch(
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
        let decode_rows = shapes.iter().any(|s| s.n_tokens == 1);
        if !self.batched_prefill_attention
            || shapes.len() < 2
            // All decode rows: decode_batch.rs's kernel, or the per-sequence one, whose launches
            // read the positions on the device, so that the step's graph replays.
            || shapes.iter().all(|s| s.n_tokens == 1)
            || caches.len() != shapes.len()
            || shapes.iter().any(|s| s.n_tokens == 0 || !same_layer(s))
            // A windowed decode row reads its window from the host (attention_dev): not batched.
            || (decode_rows && first.window.is_some())
        {
            return Ok(false);
        }
        // The batched builds of the kernels the per-sequence path would take (attention_dev).
        let Some(prefill) = self.prefill_kernels(first.head_dim) else { return Ok(false) };
        let decode = match first.head_dim {
            64 => "attn_decode_rows_d64",
            128 => "attn_decode_rows_d128",
            256 => "attn_decode_rows_d256",
            _ => return Ok(false),
        };
        let Some(d) = descriptors(shapes, prefill.queries_per_group) else { return Ok(false) };
        let sinks = match sinks {
            Some(s) => self.sinks_on_device(s, first)?,
            None => 0,
        };
        let ptrs: Vec<DevicePtr> = caches.iter().flat_map(|(kc, vc)| [kc.mem.ptr, vc.mem.ptr]).collect();
        let kv = self.kv_table(&ptrs)?;
        let table = self.i32_table(&d.values)?;
        let at = |i: usize| table + i as u64 * 4;
        let kv_dim = first.n_head_kv * first.head_dim;
        let scale = 1.0 / (first.head_dim as f32).sqrt();
        if d.rows > 0 {
            self.launch(
                "kv_store_prefill_batch_f16",
                d.rows,
                [kv_dim.div_ceil(256), d.rows, 2],
                Args::default().ptr(k.mem.ptr).ptr(v.mem.ptr).ptr(kv).ptr(table).ptr(at(d.rows_at)).i32(kv_dim),
            )?;
            self.launch(
                prefill.batch,
                d.rows,
                [d.tiles, first.n_head, 1],
                Args::default()
                    .ptr(q.mem.ptr)
                    .ptr(kv)
                    .ptr(out.mem.ptr)
                    .ptr(table)
                    .ptr(at(d.tiles_at))
                    .i32(first.n_head)
                    .i32(first.n_head_kv)
                    .f32(scale)
                    .i32(first.window.unwrap_or(0))
                    .ptr(sinks),
            )?;
        }
        if d.decode > 0 {
            self.launch(
                decode,
                d.decode,
                [first.n_head, d.decode, 1],
                Args::default()
                    .ptr(q.mem.ptr)
                    .ptr(kv)
                    .ptr(out.mem.ptr)
                    .ptr(table)
                    .ptr(at(d.decode_at))
                    .i32(first.n_head)
                    .i32(first.n_head_kv)
                    .f32(scale)
                    .ptr(sinks)
                    .ptr(k.mem.ptr)
                    .ptr(v.mem.ptr),
            )?;
        }
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
    fn descriptors_list_each_sequence_its_tiles_rows_and_decode_rows() {
        // Rows 0..70 are sequence 0 (a 70-row prompt from position 0), row 70 sequence 1 (a
        // decode row at position 40), 71..74 sequence 2 (a 3-row chunk from position 100).
        let d = descriptors(&[shape(0, 70, 0), shape(70, 1, 40), shape(71, 3, 100)], 64).unwrap();
        assert_eq!(&d.values[..12], &[0, 70, 0, 0, 70, 1, 40, 0, 71, 3, 100, 0]);
        assert_eq!((d.tiles_at, d.tiles), (12, 3));
        assert_eq!(&d.values[12..18], &[0, 0, 0, 1, 2, 0]);
        assert_eq!((d.rows_at, d.rows), (18, 73));
        assert_eq!(&d.values[18..20], &[0, 0]);
        assert_eq!(&d.values[18 + 2 * 69..18 + 2 * 71], &[0, 69, 2, 0]);
        assert_eq!((d.decode_at, d.decode), (18 + 2 * 73, 1));
        assert_eq!(&d.values[d.decode_at..], &[1]);
    }

    #[test]
    fn descriptors_refuse_values_past_i32() {
        assert!(descriptors(&[shape(0, 2, usize::MAX / 2)], 64).is_none());
    }
}
