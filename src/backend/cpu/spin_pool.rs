//! A spinning thread pool in the style of llama.cpp's ggml threadpool, which the CPU backend
//! uses from `pool::SPIN_MIN_THREADS` threads up (`pool.rs` says when and why).
//!
//! Why not rayon there: a decode step runs ~150 parallel regions (matmuls, attention), each of
//! a few to a few tens of µs. rayon's workers go to sleep within microseconds of running out of
//! work, and waking them costs 14-15 µs per region at 16 threads (43 µs after a short serial
//! gap; `examples/pool_overhead.rs`, docs/PERF.md) — as much as the region's arithmetic.
//!
//! How this pool works:
//! - `threads - 1` worker threads; the calling thread is the last participant (it runs items
//!   too), so `threads` cores compute.
//! - A region (`for_each(n, f)`) publishes a pointer to `f` and starts a new *epoch* in one
//!   atomic word, `state = epoch << 48 | n << 24`. The items are cut into one contiguous
//!   *lane* per participant, each with its own claim counter on its own cache line
//!   (`epoch << 48 | end << 24 | next`). A participant claims runs of its own lane first, by
//!   compare-and-swap on a line nobody else touches in the common case, then steals runs from
//!   the other lanes (a late or descheduled worker's share is taken by the others). One
//!   shared counter claimed by all 16 threads cost more than a decode matmul's items: ~100
//!   contended read-modify-writes per region, each a cache-line transfer (docs/PERF.md,
//!   session 11). Which thread runs which item varies, the items themselves do not, so
//!   results are the same bits as a serial loop.
//! - Idle workers spin on the epoch for `spin` (default `DEFAULT_SPIN`, 500 µs: longer than the
//!   serial gaps inside a forward pass and the sampling between decode steps), then park on a
//!   condition variable. An idle pool therefore burns CPU for at most `spin` after its last
//!   region and then sleeps.
//! - The caller returns once every item has finished (a counter of finished items), not once
//!   every worker has looked in: a worker that wakes late finds the epoch's items exhausted or
//!   a newer epoch, and claims nothing of a region that has returned.
//! - No allocation per region: the job is a pointer to the caller's closure on its stack.
//! - A region entered while the pool is busy (a nested region inside an item, or a second
//!   thread using the same backend) runs its items serially on the calling thread.
//! - A panicking item is caught, the region still waits for every other item, then the panic
//!   is resumed on the caller (never unwinding while workers may touch the caller's closure).

use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins on the epoch before it parks.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(500);

/// The type of a region's job as workers see it. The `'static` is a lie told only inside this
/// module: the reference lives on the caller's stack for the duration of `for_each`, and no
/// worker calls it after `for_each` has returned (see `Shared::work`).
type Job = &'static (dyn Fn(usize) + Sync);

struct Shared {
    /// `epoch << 48 | items << 24` of the current region: what idle workers watch.
    state: AtomicU64,
    /// One claim counter per participant (workers 0.., the caller last): `epoch << 48 |
    /// end << 24 | next unclaimed item` of its lane of the current region. The lane's end and
    /// epoch live in the same word as its counter so that a claim (one compare-and-swap) can
    /// never take an item beyond the lane and region it was read from.
    lanes: Box<[Lane]>,
    /// Points at the caller's `Job` (a fat reference on its stack) for the current region.
    job: AtomicPtr<Job>,
    /// Items of the current epoch that have finished (run to completion or panicked); each
    /// participant adds its count once per lane it ran items of.
    finished: AtomicUsize,
    /// The first panic payload of the current epoch.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Workers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    park: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
    spin: Duration,
}

/// A participant's claim counter, alone on its cache line (128 bytes: adjacent-line
/// prefetchers pair lines), so that claiming from one's own lane moves no line between cores.
#[repr(align(128))]
struct Lane(AtomicU64);

/// Claims a lane is cut into (see `Shared::work`): runs small enough that the other
/// participants can take over the rest of a late one's lane.
const CLAIMS_PER_LANE: usize = 4;

/// Busy-wait iterations with a pause hint before a waiting thread yields its core at each
/// further check (a few µs: a region follows the last one within a serial op's time).
const PAUSES_BEFORE_YIELD: u32 = 256;

/// One step of a busy wait: a pause hint at first, then `sched_yield`, so that a thread
/// waiting for work hands its core to any other runnable thread (the engine thread between
/// regions, the client that reads the tokens). Spinning without yielding measured 0.63x
/// decode at 2 threads and 0.82x at 4 on the Xeon host, where those threads shared the cores
/// with the spinners; rayon's idle loop yields the same way.
fn pause_or_yield(spins: u32) {
    if spins < PAUSES_BEFORE_YIELD {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// Items per region that fit the 24-bit fields of `state`.
const MAX_ITEMS: usize = (1 << 24) - 1;

fn pack(epoch: u16, items: usize, next: usize) -> u64 {
    (epoch as u64) << 48 | (items as u64) << 24 | next as u64
}

fn epoch_of(state: u64) -> u16 {
    (state >> 48) as u16
}

fn items_of(state: u64) -> usize {
    (state >> 24 & 0xff_ffff) as usize
}

fn next_of(state: u64) -> usize {
    (state & 0xff_ffff) as usize
}

impl Shared {
    /// Runs items of `epoch` until none are left (or a newer epoch has started): participant
    /// `me`'s own lane first, then the others' in turn.
    fn work(&self, epoch: u16, me: usize) {
        let lanes = self.lanes.len();
        // A claim takes a run of 1/CLAIMS_PER_LANE of a lane's share of the region (its item
        // count is in `state`): small enough that others can take over a late thread's lane.
        let run = (items_of(self.state.load(Relaxed)) / (lanes * CLAIMS_PER_LANE)).max(1);
        for k in 0..lanes {
            let done = self.drain(&self.lanes[(me + k) % lanes], epoch, run);
            if done > 0 {
                self.finished.fetch_add(done, Release);
            }
        }
    }

    /// Claims and runs runs of up to `run` items from `lane` while it belongs to `epoch` and
    /// has any left; returns how many items this thread ran.
    fn drain(&self, lane: &Lane, epoch: u16, run: usize) -> usize {
        let mut done = 0;
        let mut s = lane.0.load(Acquire);
        loop {
            let (first, end) = (next_of(s), items_of(s));
            if epoch_of(s) != epoch || first >= end {
                return done;
            }
            let take = run.min(end - first);
            match lane.0.compare_exchange_weak(s, s + take as u64, AcqRel, Acquire) {
                Ok(_) => {
                    // SAFETY: the claim succeeded, so the region whose lane this was is live
                    // now: its items `first..first + take` were unclaimed, and its caller waits
                    // in `for_each` until they have finished. The caller stored `job` before
                    // publishing the region's lanes and state (this Acquire claim reads from a
                    // store sequenced after that) and changes it only after the region has
                    // returned, so the load below (after the claim, not before it: an epoch
                    // number can repeat after 2^16 regions, a live region cannot) gives the
                    // live `Job`.
                    let f: Job = unsafe { *self.job.load(Relaxed) };
                    for item in first..first + take {
                        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(item))) {
                            self.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(payload);
                        }
                    }
                    done += take;
                    s = lane.0.load(Acquire);
                }
                Err(now) => s = now,
            }
        }
    }

    /// Waits (spin, then park) until an epoch other than `seen` starts; None on shutdown.
    fn next_epoch(&self, seen: u16) -> Option<u16> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let e = epoch_of(self.state.load(Acquire));
            if e != seen {
                return Some(e);
            }
            if self.shutdown.load(Relaxed) {
                return None;
            }
            pause_or_yield(spins);
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) && start.elapsed() >= self.spin {
                break;
            }
        }
        // Park. `sleepers` is raised under the lock and the epoch re-checked after it, with
        // SeqCst on both sides (the caller stores the epoch, then reads `sleepers`): either
        // this check sees the new epoch, or the caller sees a sleeper and notifies under the
        // lock, which it can only take once this thread waits.
        let mut guard = self.park.lock().unwrap_or_else(|e| e.into_inner());
        self.sleepers.fetch_add(1, SeqCst);
        let result = loop {
            let e = epoch_of(self.state.load(SeqCst));
            if e != seen {
                break Some(e);
            }
            if self.shutdown.load(SeqCst) {
                break None;
            }
            guard = self.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        };
        self.sleepers.fetch_sub(1, SeqCst);
        result
    }

    fn notify_sleepers(&self) {
        if self.sleepers.load(SeqCst) > 0 {
            drop(self.park.lock().unwrap_or_else(|e| e.into_inner()));
            self.wake.notify_all();
        }
    }
}

/// A fixed set of worker threads that run parallel regions with the calling thread.
pub struct SpinPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Held by the caller of the region in flight (one region at a time).
    busy: AtomicBool,
    /// The last epoch published (written only by the holder of `busy`).
    epoch: UnsafeCell<u16>,
}

// SAFETY: `epoch` is only read and written by the thread that holds `busy` (acquired with
// Acquire, released with Release), so accesses to it never race. Everything else is Sync.
unsafe impl Sync for SpinPool {}

impl SpinPool {
    /// A pool in which `threads` threads (the caller and `threads - 1` workers) run regions.
    pub fn new(threads: usize) -> std::io::Result<SpinPool> {
        SpinPool::with_spin(threads, DEFAULT_SPIN)
    }

    /// As `new`, with idle workers spinning for `spin` before they park (0: park at once).
    pub fn with_spin(threads: usize, spin: Duration) -> std::io::Result<SpinPool> {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            lanes: (0..threads.max(1)).map(|_| Lane(AtomicU64::new(0))).collect(),
            job: AtomicPtr::new(std::ptr::null_mut()),
            finished: AtomicUsize::new(0),
            panic: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            park: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            spin,
        });
        let mut pool = SpinPool { shared, workers: Vec::new(), busy: AtomicBool::new(false), epoch: UnsafeCell::new(0) };
        for i in 0..threads.saturating_sub(1) {
            let shared = pool.shared.clone();
            let handle = std::thread::Builder::new().name(format!("civetta-cpu-spin-{i}")).spawn(move || {
                let mut seen = 0;
                while let Some(epoch) = shared.next_epoch(seen) {
                    shared.work(epoch, i);
                    seen = epoch;
                }
            })?;
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// Threads that run a region: the workers and the caller.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(0) .. f(items - 1)`, each exactly once, spread over the pool's threads (the
    /// caller included); returns when all have finished. A panic in any item is resumed here.
    pub fn for_each<F: Fn(usize) + Sync>(&self, items: usize, f: F) {
        if items <= 1 || self.workers.is_empty() || self.busy.swap(true, Acquire) {
            (0..items).for_each(f);
            return;
        }
        // More items than one region's counter holds: consecutive regions of MAX_ITEMS.
        let mut first = 0;
        while items - first > MAX_ITEMS {
            self.region(MAX_ITEMS, &|i| f(first + i));
            first += MAX_ITEMS;
        }
        self.region(items - first, &|i| f(first + i));
        self.busy.store(false, Release);
    }

    /// Cuts `data` into chunks of `chunk` elements (the last one may be shorter) and runs
    /// `f(index, chunk)` for each over the pool, as rayon's `par_chunks_mut().enumerate()`.
    pub fn for_each_chunk_mut<T: Send, F: Fn(usize, &mut [T]) + Sync>(&self, data: &mut [T], chunk: usize, f: F) {
        assert!(chunk > 0, "chunks of 0 elements");
        let len = data.len();
        let base = ChunkBase(data.as_mut_ptr());
        self.for_each(len.div_ceil(chunk), |i| {
            let start = i * chunk;
            let end = (start + chunk).min(len);
            // SAFETY: `for_each` runs every index exactly once, so the ranges start..end handed
            // out are disjoint sub-ranges of `data`, which stays mutably borrowed (by this
            // call) until every item has finished.
            let part = unsafe { std::slice::from_raw_parts_mut(base.at(start), end - start) };
            f(i, part)
        })
    }

    /// One region of at most MAX_ITEMS items; the caller holds `busy`.
    fn region(&self, items: usize, f: &(dyn Fn(usize) + Sync)) {
        let job: &(dyn Fn(usize) + Sync) = f;
        // SAFETY: only extends the lifetime for the type `Job`; see `Job` and `Shared::work`
        // for why no worker calls it once this function returns.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(job) };
        let sh = &*self.shared;
        // SAFETY: this thread holds `busy`.
        let epoch = unsafe {
            let e = &mut *self.epoch.get();
            *e = e.wrapping_add(1).max(1); // 0 is the "no region yet" epoch workers start at
            *e
        };
        sh.job.store(&job as *const Job as *mut Job, Relaxed);
        sh.finished.store(0, Relaxed);
        let lanes = sh.lanes.len();
        for (i, lane) in sh.lanes.iter().enumerate() {
            lane.0.store(pack(epoch, items * (i + 1) / lanes, items * i / lanes), Relaxed);
        }
        // Publishes the stores above to every worker that loads the new state (Acquire).
        sh.state.store(pack(epoch, items, 0), SeqCst);
        sh.notify_sleepers();
        sh.work(epoch, lanes - 1);
        // Items claimed by workers may still run: wait for them (they touch `job` and `f`).
        let mut spins = 0u32;
        while sh.finished.load(Acquire) < items {
            pause_or_yield(spins);
            spins = spins.wrapping_add(1);
        }
        let panic = sh.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(payload) = panic {
            self.busy.store(false, Release);
            resume_unwind(payload);
        }
    }
}

/// The start of a slice cut into chunks that different threads write.
struct ChunkBase<T>(*mut T);

// SAFETY: only used by `for_each_chunk_mut`, whose items write disjoint ranges of a slice of
// `T: Send` that outlives the region.
unsafe impl<T: Send> Sync for ChunkBase<T> {}

impl<T> ChunkBase<T> {
    /// A method (not field access), so that closures capture the whole Sync wrapper.
    fn at(&self, i: usize) -> *mut T {
        // SAFETY: callers stay inside the slice the pointer came from.
        unsafe { self.0.add(i) }
    }
}

impl Drop for SpinPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        drop(self.shared.park.lock().unwrap_or_else(|e| e.into_inner()));
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_item_runs_exactly_once_across_many_regions() {
        for threads in [1, 2, 4, 7] {
            let pool = SpinPool::new(threads).unwrap();
            for round in 0..300usize {
                let n = round % 37;
                let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                pool.for_each(n, |i| {
                    hits[i].fetch_add(1, Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "threads {threads} round {round}");
            }
        }
    }

    #[test]
    fn chunks_cover_the_slice_once() {
        let pool = SpinPool::new(3).unwrap();
        for (len, chunk) in [(0usize, 4usize), (1, 4), (10, 3), (64, 16), (1000, 7)] {
            let mut v = vec![0usize; len];
            pool.for_each_chunk_mut(&mut v, chunk, |i, part| {
                assert!(part.len() == chunk || (i + 1) * chunk >= len);
                for (j, x) in part.iter_mut().enumerate() {
                    *x += i * chunk + j + 1;
                }
            });
            assert!(v.iter().enumerate().all(|(i, &x)| x == i + 1), "len {len} chunk {chunk}");
        }
    }

    #[test]
    fn parked_workers_wake_up_for_the_next_region() {
        let pool = SpinPool::with_spin(4, Duration::ZERO).unwrap();
        for _ in 0..50 {
            std::thread::sleep(Duration::from_micros(200));
            let sum = AtomicUsize::new(0);
            pool.for_each(64, |i| {
                sum.fetch_add(i, Relaxed);
            });
            assert_eq!(sum.load(Relaxed), 64 * 63 / 2);
        }
    }

    #[test]
    fn workers_take_part() {
        // With items that wait for each other, the region only finishes if at least two
        // threads run items at once.
        let pool = SpinPool::new(2).unwrap();
        let started = AtomicUsize::new(0);
        pool.for_each(2, |_| {
            started.fetch_add(1, SeqCst);
            let t = Instant::now();
            while started.load(SeqCst) < 2 {
                assert!(t.elapsed() < Duration::from_secs(10), "only one thread ran items");
                std::hint::spin_loop();
            }
        });
    }

    #[test]
    fn the_rest_of_a_stalled_lane_is_run_by_the_other_threads() {
        // 64 items on 4 threads: lanes of 16, claimed in runs of 4. Item 0 blocks the thread
        // that claimed lane 0's first run until items 4..16 (the rest of lane 0) have run,
        // which only happens if other threads steal them.
        let pool = SpinPool::new(4).unwrap();
        for _ in 0..20 {
            let rest_of_lane = AtomicUsize::new(0);
            pool.for_each(64, |i| {
                if (4..16).contains(&i) {
                    rest_of_lane.fetch_add(1, SeqCst);
                }
                if i == 0 {
                    let t = Instant::now();
                    while rest_of_lane.load(SeqCst) < 12 {
                        assert!(t.elapsed() < Duration::from_secs(10), "lane 0 was not stolen");
                        std::hint::spin_loop();
                    }
                }
            });
            assert_eq!(rest_of_lane.load(SeqCst), 12);
        }
    }

    #[test]
    fn nested_and_concurrent_regions_run_serially_and_complete() {
        let pool = Arc::new(SpinPool::new(3).unwrap());
        let total = AtomicUsize::new(0);
        pool.for_each(8, |_| {
            pool.for_each(5, |_| {
                total.fetch_add(1, Relaxed);
            });
        });
        assert_eq!(total.load(Relaxed), 40);
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    let n = AtomicUsize::new(0);
                    for _ in 0..200 {
                        pool.for_each(16, |_| {
                            n.fetch_add(1, Relaxed);
                        });
                    }
                    n.load(Relaxed)
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), 3200);
        }
    }

    #[test]
    fn a_panicking_item_panics_the_caller_after_the_region_and_the_pool_stays_usable() {
        let pool = SpinPool::new(4).unwrap();
        let done = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.for_each(32, |i| {
                if i == 7 {
                    panic!("item 7");
                }
                done.fetch_add(1, Relaxed);
            })
        }));
        let msg = r.expect_err("the panic reaches the caller");
        assert_eq!(msg.downcast_ref::<&str>(), Some(&"item 7"));
        assert_eq!(done.load(Relaxed), 31, "every other item still ran before the caller unwound");
        let n = AtomicUsize::new(0);
        pool.for_each(10, |_| {
            n.fetch_add(1, Relaxed);
        });
        assert_eq!(n.load(Relaxed), 10);
    }
}
