//! The per-kernel registry: every op call of every backend goes through this one hook.
//!
//! Cheap when disabled (one relaxed atomic load and a counter bump), sampled when enabled
//! (only every N-th call of a kernel is timed). GPU backends report durations resolved
//! later from events with [`record`]; the CPU backend times synchronously with [`time`].
//! Prometheus (`civetta_kernel_*`), `GetKernelStats` and `civetta bench` read [`snapshot`].

use once_cell::sync::Lazy;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Histogram bucket upper bounds in seconds (1 µs .. ~8.4 s, factor 2), shared by
/// the registry and the Prometheus histogram so both agree.
pub const BUCKETS_SECONDS: [f64; 24] = {
    let mut b = [0.0; 24];
    let mut i = 0;
    let mut v = 1e-6;
    while i < 24 {
        b[i] = v;
        v *= 2.0;
        i += 1;
    }
    b
};

/// Static resources of a compiled GPU kernel (filled by GPU backends; absent on CPU).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelResources {
    pub arch: String,
    pub compiler: String,
    pub vgprs: u32,
    pub sgprs: u32,
    pub scratch_bytes: u32,
    pub lds_bytes: u32,
    pub spills: u32,
    /// Occupancy in `occupancy_unit` (waves per SIMD on AMD, blocks/warps per SM on NVIDIA).
    pub occupancy: f32,
    pub occupancy_unit: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KernelKey {
    /// e.g. "matmul_q8_0", "rmsnorm", "rope", "attention".
    pub kernel: String,
    /// Coarse shape class, e.g. "m1" (decode, one row) or "m17-64" (a prefill batch).
    pub shape_class: String,
    pub backend: String,
    /// Implementation variant, e.g. "avx512vnni", "scalar", "sb" (sched_barrier build).
    pub variant: String,
}

struct Entry {
    calls: AtomicU64,
    timed_calls: AtomicU64,
    sum_nanos: AtomicU64,
    /// Sum of the durations that fell into the first bucket (<= 1 µs): there the bucket's
    /// width is larger than the durations themselves, and the quantile estimate needs it.
    first_bucket_nanos: AtomicU64,
    buckets: [AtomicU64; BUCKETS_SECONDS.len() + 1],
    resources: Mutex<Option<KernelResources>>,
}

impl Entry {
    fn new() -> Self {
        Entry {
            calls: AtomicU64::new(0),
            timed_calls: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
            first_bucket_nanos: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            resources: Mutex::new(None),
        }
    }

    fn observe(&self, d: Duration) {
        self.timed_calls.fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
        let s = d.as_secs_f64();
        let idx = BUCKETS_SECONDS.iter().position(|&b| s <= b).unwrap_or(BUCKETS_SECONDS.len());
        self.buckets[idx].fetch_add(1, Ordering::Relaxed);
        if idx == 0 {
            self.first_bucket_nanos.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
        }
    }
}

/// A point-in-time copy of one kernel's statistics.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KernelSnapshot {
    pub key: KernelKey,
    pub calls: u64,
    pub timed_calls: u64,
    /// Sum of the timed calls' durations.
    pub timed_seconds: f64,
    /// Estimated time over all calls: mean of timed calls * calls.
    pub total_seconds: f64,
    pub mean_seconds: f64,
    pub p50_seconds: f64,
    pub p99_seconds: f64,
    /// Per-bucket counts (not cumulative), aligned with BUCKETS_SECONDS plus a final +Inf bucket.
    pub bucket_counts: Vec<u64>,
    pub resources: Option<KernelResources>,
}

pub struct KernelRegistry {
    enabled: AtomicBool,
    /// Time one call in `sample_every` per kernel (1 = every call).
    sample_every: AtomicU64,
    entries: RwLock<HashMap<KernelKey, Arc<Entry>>>,
}

static REGISTRY: Lazy<KernelRegistry> =
    Lazy::new(|| KernelRegistry { enabled: AtomicBool::new(true), sample_every: AtomicU64::new(1), entries: RwLock::new(HashMap::new()) });

pub fn registry() -> &'static KernelRegistry {
    &REGISTRY
}

/// Enables or disables timing; `sample_rate` in (0, 1] is the fraction of calls timed.
pub fn configure(enabled: bool, sample_rate: f64) {
    let r = registry();
    r.enabled.store(enabled, Ordering::Relaxed);
    let every = if sample_rate > 0.0 { (1.0 / sample_rate.min(1.0)).round().max(1.0) as u64 } else { u64::MAX };
    r.sample_every.store(every, Ordering::Relaxed);
}

pub fn timing_enabled() -> bool {
    registry().enabled.load(Ordering::Relaxed)
}

pub fn sample_rate() -> f64 {
    1.0 / registry().sample_every.load(Ordering::Relaxed) as f64
}

/// Shape class of an op over `rows` activation rows (tokens): decode vs prefill batches.
pub fn shape_class(rows: usize) -> &'static str {
    match rows {
        0 | 1 => "m1",
        2..=8 => "m2-8",
        9..=64 => "m9-64",
        65..=512 => "m65-512",
        _ => "m513+",
    }
}

impl KernelRegistry {
    fn entry(&self, kernel: &str, shape: &str, backend: &str, variant: &str) -> Arc<Entry> {
        // Fast path: the key exists. Allocation of the owned key only on the first call.
        {
            let map = self.entries.read();
            if let Some(e) = map.iter().find_map(|(k, e)| {
                (k.kernel == kernel && k.shape_class == shape && k.backend == backend && k.variant == variant).then_some(e)
            }) {
                return e.clone();
            }
        }
        let key = KernelKey {
            kernel: kernel.to_string(),
            shape_class: shape.to_string(),
            backend: backend.to_string(),
            variant: variant.to_string(),
        };
        self.entries.write().entry(key).or_insert_with(|| Arc::new(Entry::new())).clone()
    }

    pub fn snapshot(&self) -> Vec<KernelSnapshot> {
        let map = self.entries.read();
        let mut out: Vec<KernelSnapshot> = map
            .iter()
            .map(|(k, e)| {
                let calls = e.calls.load(Ordering::Relaxed);
                let timed = e.timed_calls.load(Ordering::Relaxed);
                let timed_seconds = e.sum_nanos.load(Ordering::Relaxed) as f64 * 1e-9;
                let bucket_counts: Vec<u64> = e.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
                let mean = if timed > 0 { timed_seconds / timed as f64 } else { 0.0 };
                let first_top = first_bucket_top(bucket_counts[0], e.first_bucket_nanos.load(Ordering::Relaxed));
                KernelSnapshot {
                    key: k.clone(),
                    calls,
                    timed_calls: timed,
                    timed_seconds,
                    total_seconds: mean * calls as f64,
                    mean_seconds: mean,
                    p50_seconds: quantile(&bucket_counts, 0.50, first_top),
                    p99_seconds: quantile(&bucket_counts, 0.99, first_top),
                    bucket_counts,
                    resources: e.resources.lock().clone(),
                }
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// Drops all statistics (benchmarks reset between phases).
    pub fn reset(&self) {
        self.entries.write().clear();
    }
}

/// The upper edge to interpolate the first bucket over: twice the mean of its durations
/// (a uniform spread with that mean), at most the bucket's own bound. With the bucket's
/// bound, sub-microsecond kernels got a p50 of about 0.5 µs against a mean of 0.24 µs.
fn first_bucket_top(count: u64, nanos: u64) -> f64 {
    if count == 0 {
        return BUCKETS_SECONDS[0];
    }
    (2.0 * nanos as f64 * 1e-9 / count as f64).min(BUCKETS_SECONDS[0])
}

/// Quantile estimate from bucket counts: linear interpolation inside the bucket; the first
/// bucket spans [0, first_top].
fn quantile(counts: &[u64], q: f64, first_top: f64) -> f64 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let rank = q * total as f64;
    let mut seen = 0u64;
    for (i, &c) in counts.iter().enumerate() {
        if c == 0 {
            continue;
        }
        if (seen + c) as f64 >= rank {
            let lo = if i == 0 { 0.0 } else { BUCKETS_SECONDS[i - 1] };
            let hi = if i == 0 { first_top } else { BUCKETS_SECONDS.get(i).copied().unwrap_or(lo * 2.0) };
            let frac = ((rank - seen as f64) / c as f64).clamp(0.0, 1.0);
            return lo + (hi - lo) * frac;
        }
        seen += c;
    }
    *BUCKETS_SECONDS.last().unwrap()
}

/// Runs `f` as one call of `kernel`, timing it when timing is enabled and this call is sampled.
#[inline]
pub fn time<R>(kernel: &str, shape: &str, backend: &str, variant: &str, f: impl FnOnce() -> R) -> R {
    let r = registry();
    if !r.enabled.load(Ordering::Relaxed) {
        return f();
    }
    let e = r.entry(kernel, shape, backend, variant);
    let n = e.calls.fetch_add(1, Ordering::Relaxed);
    let every = r.sample_every.load(Ordering::Relaxed);
    if every == u64::MAX || !n.is_multiple_of(every) {
        return f();
    }
    let t0 = Instant::now();
    let out = f();
    e.observe(t0.elapsed());
    out
}

/// Counts one call and, when the backend timed it (e.g. GPU events), its duration.
pub fn record(kernel: &str, shape: &str, backend: &str, variant: &str, duration: Option<Duration>) {
    let r = registry();
    if !r.enabled.load(Ordering::Relaxed) {
        return;
    }
    let e = r.entry(kernel, shape, backend, variant);
    e.calls.fetch_add(1, Ordering::Relaxed);
    if let Some(d) = duration {
        e.observe(d);
    }
}

/// Counts `n` untimed calls (GPU graph replays count each kernel's launches at once).
pub fn record_calls(kernel: &str, shape: &str, backend: &str, variant: &str, n: u64) {
    let r = registry();
    if r.enabled.load(Ordering::Relaxed) {
        r.entry(kernel, shape, backend, variant).calls.fetch_add(n, Ordering::Relaxed);
    }
}

/// Whether the next call of a kernel should be timed (GPU backends decide before launching
/// whether to record events); counts the call.
pub fn should_sample(kernel: &str, shape: &str, backend: &str, variant: &str) -> bool {
    let r = registry();
    if !r.enabled.load(Ordering::Relaxed) {
        return false;
    }
    let e = r.entry(kernel, shape, backend, variant);
    let n = e.calls.fetch_add(1, Ordering::Relaxed);
    let every = r.sample_every.load(Ordering::Relaxed);
    every != u64::MAX && n.is_multiple_of(every)
}

/// With timing on, one call in how many is timed (GPU graph replays time whole steps at
/// this rate); None when timing is off or nothing is sampled.
pub fn sample_every() -> Option<u64> {
    let r = registry();
    let every = r.sample_every.load(Ordering::Relaxed);
    (r.enabled.load(Ordering::Relaxed) && every != u64::MAX).then_some(every)
}

/// Adds a timed duration for a call already counted by [`should_sample`].
pub fn observe_sampled(kernel: &str, shape: &str, backend: &str, variant: &str, d: Duration) {
    registry().entry(kernel, shape, backend, variant).observe(d);
}

/// Attaches static resources (from code object metadata or driver queries) to a kernel.
pub fn set_resources(kernel: &str, shape: &str, backend: &str, variant: &str, res: KernelResources) {
    *registry().entry(kernel, shape, backend, variant).resources.lock() = Some(res);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_interpolates_within_bucket() {
        let mut counts = vec![0u64; BUCKETS_SECONDS.len() + 1];
        counts[3] = 100; // all in (4us, 8us]
        let p50 = quantile(&counts, 0.5, BUCKETS_SECONDS[0]);
        assert!(p50 > BUCKETS_SECONDS[2] && p50 <= BUCKETS_SECONDS[3], "{p50}");
        assert_eq!(quantile(&[0; 25], 0.5, BUCKETS_SECONDS[0]), 0.0);
    }

    /// Issue #13: `add` at 0.24 µs a call reported p50 0.52 µs, above its mean.
    #[test]
    fn sub_microsecond_kernels_have_p50_near_their_mean() {
        let r = KernelRegistry { enabled: AtomicBool::new(true), sample_every: AtomicU64::new(1), entries: RwLock::new(HashMap::new()) };
        let e = r.entry("add", "m1", "test", "v");
        for ns in [200, 220, 240, 260, 280] {
            for _ in 0..20 {
                e.observe(Duration::from_nanos(ns));
            }
        }
        let s = &r.snapshot()[0];
        assert!((s.mean_seconds - 240e-9).abs() < 1e-12, "{}", s.mean_seconds);
        assert!(s.p50_seconds <= s.mean_seconds * 1.05, "p50 {} above mean {}", s.p50_seconds, s.mean_seconds);
        assert!(s.p99_seconds <= BUCKETS_SECONDS[0] && s.p99_seconds > s.p50_seconds);
    }

    #[test]
    fn sampling_times_every_nth_call_but_counts_all() {
        let r = KernelRegistry { enabled: AtomicBool::new(true), sample_every: AtomicU64::new(4), entries: RwLock::new(HashMap::new()) };
        for _ in 0..10 {
            let e = r.entry("k", "m1", "test", "v");
            let n = e.calls.fetch_add(1, Ordering::Relaxed);
            if n.is_multiple_of(4) {
                e.observe(Duration::from_micros(5));
            }
        }
        let s = r.snapshot();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].calls, 10);
        assert_eq!(s[0].timed_calls, 3);
        assert!((s[0].total_seconds - 10.0 * 5e-6).abs() < 1e-9);
    }
}
