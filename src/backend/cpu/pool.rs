//! The CPU backend's threads: which pool runs its parallel regions, behind one interface.
//!
//! Two pools, chosen by thread count (issue #18):
//! - **rayon** below `SPIN_MIN_THREADS`: at 2 and 4 threads (CI, small VMs, the embedded
//!   default on small machines) the spinning pool measured 0.63x / 0.82x decode on the Xeon
//!   host, where the engine thread and the client shared the cores with the spinners
//!   (docs/PERF.md, "Session 10").
//! - **spinning** (`spin_pool::SpinPool`) from `SPIN_MIN_THREADS` up: at 16 threads rayon's
//!   worker wake-up costs 14-43 µs per region, about the arithmetic of a decode matmul, and the
//!   spinning pool measured 1.44x decode on a SmolLM2-shaped model there (1.19x at 8).
//!
//! Both run the same work items (a region's items are fixed by the caller, whichever thread
//! runs them), so the outputs are the same bits with either pool; `tests/cpu_pool.rs` checks
//! that on whole models. `CIVETTA_CPU_POOL=rayon|spin` overrides the choice (for A/B runs).

use super::spin_pool::SpinPool;
use anyhow::Context;
use rayon::prelude::*;

/// The thread count from which the spinning pool runs the regions (below it, rayon).
pub const SPIN_MIN_THREADS: usize = 8;

/// Which pool runs the CPU backend's parallel regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    Rayon,
    Spin,
}

impl PoolKind {
    /// The pool for `threads` threads: `CIVETTA_CPU_POOL` (rayon|spin) where set, otherwise
    /// spinning from `SPIN_MIN_THREADS` threads up.
    pub fn for_threads(threads: usize) -> PoolKind {
        match std::env::var("CIVETTA_CPU_POOL").ok().as_deref().and_then(PoolKind::parse) {
            Some(kind) => kind,
            None if threads >= SPIN_MIN_THREADS => PoolKind::Spin,
            None => PoolKind::Rayon,
        }
    }

    pub fn parse(s: &str) -> Option<PoolKind> {
        match s {
            "rayon" => Some(PoolKind::Rayon),
            "spin" => Some(PoolKind::Spin),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Rayon => "rayon",
            PoolKind::Spin => "spin",
        }
    }
}

/// The pool of one CPU backend.
pub(super) enum CpuPool {
    Rayon(rayon::ThreadPool),
    Spin(SpinPool),
}

impl CpuPool {
    pub fn new(kind: PoolKind, threads: usize) -> anyhow::Result<CpuPool> {
        Ok(match kind {
            PoolKind::Rayon => CpuPool::Rayon(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("civetta-cpu-{i}"))
                    .build()
                    .context("creating the CPU thread pool")?,
            ),
            PoolKind::Spin => CpuPool::Spin(SpinPool::new(threads).context("creating the CPU thread pool")?),
        })
    }

    pub fn kind(&self) -> PoolKind {
        match self {
            CpuPool::Rayon(_) => PoolKind::Rayon,
            CpuPool::Spin(_) => PoolKind::Spin,
        }
    }

    /// Runs a whole forward pass with the pool at hand: on a rayon worker (its regions then
    /// start without a hop from an outside thread), or on the calling thread for the spinning
    /// pool, whose regions the caller takes part in.
    pub fn install<R: Send>(&self, pass: impl FnOnce() -> R + Send) -> R {
        match self {
            CpuPool::Rayon(pool) => pool.install(pass),
            CpuPool::Spin(_) => pass(),
        }
    }

    /// Runs `f(0) .. f(items - 1)`, each once, over the pool's threads.
    pub fn for_each(&self, items: usize, f: impl Fn(usize) + Sync + Send) {
        match self {
            CpuPool::Rayon(pool) => pool.install(|| (0..items).into_par_iter().for_each(f)),
            CpuPool::Spin(pool) => pool.for_each(items, f),
        }
    }

    /// Cuts `data` into chunks of `chunk` elements (the last may be shorter) and runs
    /// `f(index, chunk)` for each over the pool, as rayon's `par_chunks_mut().enumerate()`.
    pub fn for_each_chunk_mut<T: Send>(&self, data: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync + Send) {
        match self {
            CpuPool::Rayon(pool) => pool.install(|| data.par_chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c))),
            CpuPool::Spin(pool) => pool.for_each_chunk_mut(data, chunk, f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    #[test]
    fn both_pools_run_every_item_and_chunk_once() {
        for kind in [PoolKind::Rayon, PoolKind::Spin] {
            let pool = CpuPool::new(kind, 3).unwrap();
            assert_eq!(pool.kind(), kind);
            let hits: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
            pool.install(|| pool.for_each(100, |i| _ = hits[i].fetch_add(1, Relaxed)));
            assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "{kind:?}");
            let mut v = vec![0usize; 1000];
            pool.for_each_chunk_mut(&mut v, 7, |i, part| part.iter_mut().enumerate().for_each(|(j, x)| *x = i * 7 + j));
            assert!(v.iter().enumerate().all(|(i, &x)| x == i), "{kind:?}");
        }
    }

    #[test]
    fn the_spinning_pool_starts_at_spin_min_threads_unless_overridden() {
        if std::env::var_os("CIVETTA_CPU_POOL").is_some() {
            return; // the override is what this run asked for
        }
        assert_eq!(PoolKind::for_threads(SPIN_MIN_THREADS - 1), PoolKind::Rayon);
        assert_eq!(PoolKind::for_threads(SPIN_MIN_THREADS), PoolKind::Spin);
        assert_eq!(PoolKind::parse("spin"), Some(PoolKind::Spin));
        assert_eq!(PoolKind::parse("fast"), None);
    }
}
