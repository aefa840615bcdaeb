//! Small device tables that batched kernels read to find each sequence's data: cache pointers
//! (k0, v0, k1, v1, ...) for batched decode and prefill attention, and a batched prefill's
//! sequence, tile and row descriptors (prefill_batch.rs).
//!
//! A table is uploaded once per distinct contents and kept (never rewritten), so work queued or
//! captured in a graph with it stays valid while it exists, and the launches of a repeated step
//! keep their arguments (its decode graph replays).

use super::api::DevicePtr;
use super::{DevBuf, GpuApi, GpuBackend};
use crate::backend::{Result, ResultExt};
use std::collections::HashMap;

/// Tables kept before all are dropped (after waiting for the stream): a few MB at most (a cache
/// table is 16 bytes per sequence, a prefill step's descriptors 8 bytes per row).
const MAX_TABLES: usize = 4096;

/// Device tables by their contents.
#[derive(Default)]
pub(super) struct DeviceTables {
    tables: HashMap<Vec<u8>, DevBuf>,
}

impl<A: GpuApi> GpuBackend<A> {
    /// The device table holding `ptrs` (cache pointers), made on first use.
    pub(super) fn kv_table(&self, ptrs: &[DevicePtr]) -> Result<DevicePtr> {
        self.device_table(ptrs.iter().flat_map(|p| p.to_le_bytes()).collect(), "a KV cache table")
    }

    /// The device table holding `values` (i32), made on first use.
    pub(super) fn i32_table(&self, values: &[i32]) -> Result<DevicePtr> {
        self.device_table(values.iter().flat_map(|v| v.to_le_bytes()).collect(), "a batch descriptor table")
    }

    /// The device table holding `bytes`, uploaded to a buffer no queued work has seen on first use.
    fn device_table(&self, bytes: Vec<u8>, what: &'static str) -> Result<DevicePtr> {
        let mut t = self.device_tables.lock();
        if let Some(b) = t.tables.get(&bytes) {
            return Ok(b.ptr);
        }
        if t.tables.len() >= MAX_TABLES {
            // Queued and captured work may still read the old tables: drop them only once the
            // stream is idle. Graphs that named them are never replayed with a new table at
            // the same address unless their tape (and so the table's contents) is the same.
            self.flush()?;
            self.api.synchronize()?;
            t.tables.clear();
        }
        // A fresh allocation, not a pooled buffer that recorded launches may still use.
        let buf = self.raw_alloc(bytes.len())?;
        self.api.upload(buf.ptr, &bytes).while_doing(|| format!("uploading {what}"))?;
        let ptr = buf.ptr;
        t.tables.insert(bytes, buf);
        Ok(ptr)
    }
}
