//! Host memory that a backend reads results into (the logits of every pass), allocated once
//! per workspace like its device buffers.
//!
//! A GPU backend page-locks it: a device-to-host copy into pageable memory goes through the
//! driver's staging buffer at a fraction of the link's speed, which on a 150k-token
//! vocabulary is milliseconds per batched decode step (16 rows x 151,936 logits = 9.7 MB).
//! On the CPU backend it is a plain vector.

use std::ops::{Deref, DerefMut};

/// Undoes a backend's pinning of the buffer's bytes; runs once, before they are freed.
pub type Unpin = Box<dyn FnOnce(*mut u8) + Send + Sync>;

/// `len` f32s of host memory; the length is fixed (the storage never moves, which pinning
/// needs).
pub struct HostBuffer {
    data: Vec<f32>,
    unpin: Option<Unpin>,
}

impl HostBuffer {
    /// Plain (pageable) memory, zeroed.
    pub fn heap(len: usize) -> HostBuffer {
        HostBuffer { data: vec![0.0; len], unpin: None }
    }

    /// Memory that `pin` page-locks; `pin` returns what undoes it. If pinning fails the
    /// buffer stays pageable: slower copies, the same bytes.
    pub fn pinned(len: usize, pin: impl FnOnce(*mut u8, usize) -> Option<Unpin>) -> HostBuffer {
        let mut b = HostBuffer::heap(len);
        if len > 0 {
            b.unpin = pin(b.data.as_mut_ptr() as *mut u8, len * 4);
        }
        b
    }

    /// Whether a backend page-locked the bytes.
    pub fn is_pinned(&self) -> bool {
        self.unpin.is_some()
    }
}

impl Deref for HostBuffer {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.data
    }
}

impl DerefMut for HostBuffer {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if let Some(unpin) = self.unpin.take() {
            unpin(self.data.as_mut_ptr() as *mut u8);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_pinned_buffer_is_unpinned_once_at_its_own_address() {
        let unpinned = Arc::new(AtomicUsize::new(0));
        let seen = unpinned.clone();
        let b = HostBuffer::pinned(1000, |p, bytes| {
            assert_eq!(bytes, 4000);
            let at = p as usize;
            Some(Box::new(move |q: *mut u8| {
                assert_eq!(q as usize, at);
                seen.fetch_add(1, Ordering::SeqCst);
            }))
        });
        assert!(b.is_pinned());
        assert_eq!(b.len(), 1000);
        drop(b);
        assert_eq!(unpinned.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_failed_pin_leaves_a_working_pageable_buffer() {
        let mut b = HostBuffer::pinned(8, |_, _| None);
        assert!(!b.is_pinned());
        b[7] = 1.5;
        assert_eq!(b.iter().sum::<f32>(), 1.5);
    }
}
