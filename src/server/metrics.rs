//! Prometheus metrics: request metrics kept in the prometheus crate's own `Registry`, plus
//! collectors that read the engine's gauges and the per-kernel registry at scrape time.
//! Nothing here ever sees prompt or completion text.

use crate::engine::{EngineStats, StepHistogram, STEP_BUCKETS};
use crate::kernel_registry::{self, KernelSnapshot, BUCKETS_SECONDS};
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Bucket, Counter, Gauge, Histogram as HistogramProto, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::collections::HashMap;
use std::time::Duration;
use tonic::Code;

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

const LATENCY_BUCKETS: [f64; 16] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];
const INTER_TOKEN_BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56];

/// Identity of this process for `civetta_build_info`.
#[derive(Debug, Clone)]
pub struct BuildLabels {
    pub backend: String,
    /// The GPU kernel compiler, or "none" on the CPU backend.
    pub compiler: String,
}

impl BuildLabels {
    pub fn new(backend: &str, env: &crate::envinfo::Fingerprint) -> BuildLabels {
        BuildLabels { backend: backend.to_string(), compiler: env.get("toolchain.kernel_compiler").unwrap_or("unknown").to_string() }
    }
}

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    request_duration: HistogramVec,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub prompt_tokens: IntCounter,
    pub generated_tokens: IntCounter,
    pub in_flight: IntGauge,
    pub rejected: IntCounterVec,
}

impl Metrics {
    /// Request metrics, `civetta_build_info` and `civetta_environment_info`; add the
    /// scrape-time collectors with [`Metrics::register`].
    pub fn new(build: &BuildLabels, env: &crate::envinfo::Fingerprint) -> prometheus::Result<Metrics> {
        let registry = Registry::new();
        let requests =
            IntCounterVec::new(Opts::new("civetta_requests_total", "RPCs handled, by method and gRPC status code"), &["rpc", "code"])?;
        let request_duration = HistogramVec::new(
            HistogramOpts::new("civetta_request_duration_seconds", "RPC duration from arrival to the last message")
                .buckets(LATENCY_BUCKETS.to_vec()),
            &["rpc", "code"],
        )?;
        let ttft = Histogram::with_opts(
            HistogramOpts::new("civetta_time_to_first_token_seconds", "Time from request arrival to the first generated token")
                .buckets(LATENCY_BUCKETS.to_vec()),
        )?;
        let itl = Histogram::with_opts(
            HistogramOpts::new("civetta_inter_token_latency_seconds", "Time between consecutive generated tokens of a stream")
                .buckets(INTER_TOKEN_BUCKETS.to_vec()),
        )?;
        let prompt_tokens = IntCounter::new("civetta_prompt_tokens_total", "Prompt tokens of accepted Generate requests")?;
        let generated_tokens = IntCounter::new("civetta_generated_tokens_total", "Tokens generated and streamed")?;
        let in_flight = IntGauge::new("civetta_requests_in_flight", "Generate streams open now")?;
        let rejected = IntCounterVec::new(
            Opts::new("civetta_requests_rejected_total", "Generate requests refused before reaching the model, by reason"),
            &["reason"],
        )?;
        let build_info = IntGaugeVec::new(
            Opts::new("civetta_build_info", "Build and runtime identity (value is always 1)"),
            &["version", "git_sha", "backend", "compiler", "rustc"],
        )?;
        build_info
            .with_label_values(&[
                crate::build_info::VERSION,
                crate::build_info::GIT_SHA,
                &build.backend,
                &build.compiler,
                crate::build_info::RUSTC,
            ])
            .set(1);
        #[allow(unused_mut)] // pushed to on Linux only
        let mut collectors: Vec<Box<dyn Collector>> = vec![
            Box::new(requests.clone()),
            Box::new(request_duration.clone()),
            Box::new(ttft.clone()),
            Box::new(itl.clone()),
            Box::new(prompt_tokens.clone()),
            Box::new(generated_tokens.clone()),
            Box::new(in_flight.clone()),
            Box::new(rejected.clone()),
            Box::new(build_info),
            Box::new(env.info_gauge()?),
        ];
        // process_resident_memory_bytes, process_cpu_seconds_total, process_open_fds,
        // process_start_time_seconds, ... (read from /proc at scrape time).
        #[cfg(target_os = "linux")]
        collectors.push(Box::new(prometheus::process_collector::ProcessCollector::for_self()));
        for c in collectors {
            registry.register(c)?;
        }
        // The usual rejection reasons exist from the start, so rate() works before the first one.
        for reason in ["invalid", "queue_full", "shutting_down"] {
            rejected.with_label_values(&[reason]);
        }
        Ok(Metrics { registry, requests, request_duration, ttft, itl, prompt_tokens, generated_tokens, in_flight, rejected })
    }

    pub fn register(&self, c: Box<dyn Collector>) -> prometheus::Result<()> {
        self.registry.register(c)
    }

    /// Counts a finished RPC with its status code.
    pub fn observe_request(&self, rpc: &str, code: Code, elapsed: Duration) {
        let code = code_label(code);
        self.requests.with_label_values(&[rpc, code]).inc();
        self.request_duration.with_label_values(&[rpc, code]).observe(elapsed.as_secs_f64());
    }

    /// The text exposition of everything registered.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec fails only on invalid metric families, which we never build.
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "encoding metrics");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

/// The canonical gRPC name of a status code ("OK", "INVALID_ARGUMENT", ...).
pub fn code_label(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

fn label(name: &str, value: &str) -> LabelPair {
    let mut l = LabelPair::default();
    l.set_name(name.to_string());
    l.set_value(value.to_string());
    l
}

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_string());
    f.set_help(help.to_string());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

fn gauge_metric(labels: Vec<LabelPair>, value: f64) -> Metric {
    let mut g = Gauge::default();
    g.set_value(value);
    let mut m = Metric::default();
    m.set_label(labels);
    m.set_gauge(g);
    m
}

fn descs(specs: &[(&str, &str, &[&str])]) -> Vec<Desc> {
    specs
        .iter()
        .map(|(name, help, labels)| {
            Desc::new(name.to_string(), help.to_string(), labels.iter().map(|l| l.to_string()).collect(), HashMap::new())
                .expect("valid metric descriptor")
        })
        .collect()
}

/// The engine's queue and sequence gauges, read at scrape time.
pub struct EngineCollector {
    stats: Box<dyn Fn() -> EngineStats + Send + Sync>,
    descs: Vec<Desc>,
}

const ENGINE_GAUGES: [(&str, &str, &[&str]); 3] = [
    ("civetta_queue_depth", "Requests waiting for an active sequence slot", &[]),
    ("civetta_active_sequences", "Sequences holding a KV cache now", &[]),
    ("civetta_kv_cache_bytes", "Bytes of KV cache allocated to active sequences", &[]),
];

/// Per-step histograms of the continuous-batching scheduler.
const ENGINE_HISTOGRAMS: [(&str, &str, &[&str]); 2] = [
    ("civetta_batch_rows", "Rows (tokens) in one engine step's forward pass: decode rows plus prefill chunks", &[]),
    ("civetta_batch_sequences", "Sequences in one engine step's forward pass", &[]),
];

/// The paged KV cache and prefix cache (zero on backends without a paged cache).
const KV_METRICS: [(&str, &str, &[&str]); 4] = [
    ("civetta_kv_cache_usage_ratio", "Fraction of the paged KV cache's blocks referenced by sequences", &[]),
    ("civetta_kv_cache_blocks", "Paged KV cache blocks by state: used (by sequences), cached (prefix cache, evictable), free", &["state"]),
    ("civetta_prefix_cache_tokens_total", "Prompt tokens whose KV was found in the prefix cache (hit) or computed (miss)", &["result"]),
    ("civetta_preemptions_total", "Sequences preempted when KV blocks ran out (blocks freed, recomputed later)", &[]),
];

fn counter_metric(labels: Vec<LabelPair>, value: f64) -> Metric {
    let mut c = Counter::default();
    c.set_value(value);
    let mut m = Metric::default();
    m.set_label(labels);
    m.set_counter(c);
    m
}

impl EngineCollector {
    pub fn new(stats: impl Fn() -> EngineStats + Send + Sync + 'static) -> EngineCollector {
        let specs: Vec<_> = ENGINE_GAUGES.iter().chain(&ENGINE_HISTOGRAMS).chain(&KV_METRICS).copied().collect();
        EngineCollector { stats: Box::new(stats), descs: descs(&specs) }
    }
}

/// The engine keeps per-bucket counts of one value per step; Prometheus wants cumulative
/// ones (the last, +Inf, bucket is implied by the count).
fn step_histogram(h: &StepHistogram) -> Metric {
    let mut cumulative = 0u64;
    let buckets = STEP_BUCKETS
        .iter()
        .enumerate()
        .map(|(i, &le)| {
            cumulative += h.counts.get(i).copied().unwrap_or(0);
            let mut b = Bucket::default();
            b.set_upper_bound(le);
            b.set_cumulative_count(cumulative);
            b
        })
        .collect();
    let mut p = HistogramProto::default();
    p.set_bucket(buckets);
    p.set_sample_count(h.count);
    p.set_sample_sum(h.sum as f64);
    let mut m = Metric::default();
    m.set_histogram(p);
    m
}

impl Collector for EngineCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let s = (self.stats)();
        let values = [s.queued as f64, s.active as f64, s.kv_bytes as f64];
        let mut families: Vec<MetricFamily> = ENGINE_GAUGES
            .iter()
            .zip(values)
            .map(|((name, help, _), v)| family(name, help, MetricType::GAUGE, vec![gauge_metric(vec![], v)]))
            .collect();
        for ((name, help, _), h) in ENGINE_HISTOGRAMS.iter().zip([&s.batch_rows, &s.batch_sequences]) {
            families.push(family(name, help, MetricType::HISTOGRAM, vec![step_histogram(h)]));
        }
        let [usage, blocks, prefix, preempt] = KV_METRICS;
        let ratio = if s.kv_blocks_total == 0 { 0.0 } else { s.kv_blocks_used as f64 / s.kv_blocks_total as f64 };
        families.push(family(usage.0, usage.1, MetricType::GAUGE, vec![gauge_metric(vec![], ratio)]));
        let free = s.kv_blocks_total.saturating_sub(s.kv_blocks_used + s.kv_blocks_cached);
        let by_state = [("used", s.kv_blocks_used), ("cached", s.kv_blocks_cached), ("free", free)];
        let block_metrics = by_state.iter().map(|(st, n)| gauge_metric(vec![label("state", st)], *n as f64)).collect();
        families.push(family(blocks.0, blocks.1, MetricType::GAUGE, block_metrics));
        let tokens = [("hit", s.prefix_cache_hit_tokens), ("miss", s.prefix_cache_miss_tokens)];
        let token_metrics = tokens.iter().map(|(r, n)| counter_metric(vec![label("result", r)], *n as f64)).collect();
        families.push(family(prefix.0, prefix.1, MetricType::COUNTER, token_metrics));
        families.push(family(preempt.0, preempt.1, MetricType::COUNTER, vec![counter_metric(vec![], s.preemptions as f64)]));
        families
    }
}

const KERNEL_LABELS: [&str; 4] = ["kernel", "shape_class", "backend", "variant"];
const RESOURCE_LABELS: [&str; 7] = ["kernel", "shape_class", "backend", "variant", "arch", "compiler", "unit"];

type ResourceGetter = fn(&kernel_registry::KernelResources) -> f64;
/// Static resources of compiled GPU kernels, exported only for kernels that have them.
const RESOURCE_GAUGES: [(&str, &str, ResourceGetter); 5] = [
    ("civetta_kernel_vgprs", "Vector registers per lane of the compiled kernel", |r| r.vgprs as f64),
    ("civetta_kernel_sgprs", "Scalar registers of the compiled kernel", |r| r.sgprs as f64),
    ("civetta_kernel_scratch_bytes", "Private (scratch) memory per lane in bytes", |r| r.scratch_bytes as f64),
    ("civetta_kernel_lds_bytes", "Static LDS (shared memory) per workgroup in bytes", |r| r.lds_bytes as f64),
    ("civetta_kernel_occupancy_waves", "Occupancy at the launch configuration, in the unit label", |r| r.occupancy as f64),
];

/// Per-kernel metrics generated from the kernel registry at scrape time: a histogram of
/// the sampled call durations (the registry's buckets), a counter of all calls, and the
/// resource gauges where a GPU backend provided them.
pub struct KernelCollector {
    snapshot: Box<dyn Fn() -> Vec<KernelSnapshot> + Send + Sync>,
    descs: Vec<Desc>,
}

impl KernelCollector {
    /// Reads the process-wide kernel registry.
    pub fn global() -> KernelCollector {
        KernelCollector::new(|| kernel_registry::registry().snapshot())
    }

    pub fn new(snapshot: impl Fn() -> Vec<KernelSnapshot> + Send + Sync + 'static) -> KernelCollector {
        let mut specs: Vec<(&str, &str, &[&str])> = vec![
            ("civetta_kernel_duration_seconds", "Duration of sampled kernel (op) calls", &KERNEL_LABELS),
            ("civetta_kernel_calls_total", "Kernel (op) calls, sampled for timing or not", &KERNEL_LABELS),
        ];
        specs.extend(RESOURCE_GAUGES.iter().map(|(name, help, _)| (*name, *help, &RESOURCE_LABELS[..])));
        KernelCollector { snapshot: Box::new(snapshot), descs: descs(&specs) }
    }
}

fn kernel_labels(k: &kernel_registry::KernelKey) -> Vec<LabelPair> {
    vec![label("kernel", &k.kernel), label("shape_class", &k.shape_class), label("backend", &k.backend), label("variant", &k.variant)]
}

/// The registry keeps per-bucket counts; Prometheus wants cumulative ones. The registry's
/// last bucket (+Inf) is implied by the sample count.
fn histogram(k: &KernelSnapshot) -> HistogramProto {
    let mut cumulative = 0u64;
    let buckets = BUCKETS_SECONDS
        .iter()
        .enumerate()
        .map(|(i, &le)| {
            cumulative += k.bucket_counts.get(i).copied().unwrap_or(0);
            let mut b = Bucket::default();
            b.set_upper_bound(le);
            b.set_cumulative_count(cumulative);
            b
        })
        .collect();
    let mut h = HistogramProto::default();
    h.set_bucket(buckets);
    h.set_sample_count(k.timed_calls);
    h.set_sample_sum(k.timed_seconds);
    h
}

impl Collector for KernelCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let snap = (self.snapshot)();
        if snap.is_empty() {
            return Vec::new();
        }
        let durations = snap
            .iter()
            .map(|k| {
                let mut m = Metric::default();
                m.set_label(kernel_labels(&k.key));
                m.set_histogram(histogram(k));
                m
            })
            .collect();
        let calls = snap
            .iter()
            .map(|k| {
                let mut c = Counter::default();
                c.set_value(k.calls as f64);
                let mut m = Metric::default();
                m.set_label(kernel_labels(&k.key));
                m.set_counter(c);
                m
            })
            .collect();
        let mut out = vec![
            family("civetta_kernel_duration_seconds", "Duration of sampled kernel (op) calls", MetricType::HISTOGRAM, durations),
            family("civetta_kernel_calls_total", "Kernel (op) calls, sampled for timing or not", MetricType::COUNTER, calls),
        ];
        let with_resources: Vec<_> = snap.iter().filter_map(|k| k.resources.as_ref().map(|r| (k, r))).collect();
        if !with_resources.is_empty() {
            for (name, help, get) in RESOURCE_GAUGES {
                let metrics = with_resources
                    .iter()
                    .map(|(k, r)| {
                        let mut labels = kernel_labels(&k.key);
                        labels.extend([label("arch", &r.arch), label("compiler", &r.compiler), label("unit", &r.occupancy_unit)]);
                        gauge_metric(labels, get(r))
                    })
                    .collect();
                out.push(family(name, help, MetricType::GAUGE, metrics));
            }
        }
        out
    }
}

const EXPERT_TOKENS: (&str, &str) = (
    "civetta_moe_expert_tokens_total",
    "Tokens routed to each expert of a mixture-of-experts model, summed over its MoE layers (a token counts once in every layer that selects the expert)",
);

/// `civetta_moe_expert_tokens_total{expert}` of a MoE model, read at scrape time. One series
/// per expert id (the sum over layers; per-layer series would be layers x experts, 6144 for a
/// Qwen3-30B-A3B): a balanced router gives every expert about the same rate.
pub struct ExpertLoadCollector {
    load: std::sync::Arc<crate::model::moe::ExpertLoad>,
    descs: Vec<Desc>,
}

impl ExpertLoadCollector {
    pub fn new(load: std::sync::Arc<crate::model::moe::ExpertLoad>) -> ExpertLoadCollector {
        ExpertLoadCollector { load, descs: descs(&[(EXPERT_TOKENS.0, EXPERT_TOKENS.1, &["expert"])]) }
    }
}

impl Collector for ExpertLoadCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let metrics = self
            .load
            .snapshot()
            .iter()
            .enumerate()
            .map(|(e, &n)| counter_metric(vec![label("expert", &e.to_string())], n as f64))
            .collect();
        vec![family(EXPERT_TOKENS.0, EXPERT_TOKENS.1, MetricType::COUNTER, metrics)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel_registry::{KernelKey, KernelResources};

    fn key(kernel: &str, shape: &str) -> KernelKey {
        KernelKey { kernel: kernel.into(), shape_class: shape.into(), backend: "cpu".into(), variant: "avx2".into() }
    }

    fn snap(kernel: &str, shape: &str, counts: &[(usize, u64)], calls: u64, resources: Option<KernelResources>) -> KernelSnapshot {
        let mut bucket_counts = vec![0u64; BUCKETS_SECONDS.len() + 1];
        let mut timed_seconds = 0.0;
        for &(i, c) in counts {
            bucket_counts[i] = c;
            timed_seconds += c as f64 * BUCKETS_SECONDS.get(i).copied().unwrap_or(10.0);
        }
        let timed_calls = bucket_counts.iter().sum();
        KernelSnapshot {
            key: key(kernel, shape),
            calls,
            timed_calls,
            timed_seconds,
            total_seconds: 0.0,
            mean_seconds: 0.0,
            p50_seconds: 0.0,
            p99_seconds: 0.0,
            bucket_counts,
            resources,
        }
    }

    fn render(c: KernelCollector) -> String {
        let r = Registry::new();
        r.register(Box::new(c)).unwrap();
        let mut buf = Vec::new();
        TextEncoder::new().encode(&r.gather(), &mut buf).unwrap();
        String::from_utf8(buf).unwrap()
    }

    /// The value of the one sample line that starts with `series` followed by a space.
    fn sample(text: &str, series: &str) -> f64 {
        let lines: Vec<&str> = text.lines().filter(|l| l.strip_prefix(series).is_some_and(|rest| rest.starts_with(' '))).collect();
        assert_eq!(lines.len(), 1, "expected one sample {series} in:\n{text}");
        lines[0].rsplit(' ').next().unwrap().parse().unwrap()
    }

    #[test]
    fn kernel_histograms_are_cumulative_and_complete() {
        let s = vec![snap("matmul_q8_0", "m1", &[(2, 3), (5, 4), (24, 1)], 20, None), snap("rmsnorm", "m1", &[(0, 2)], 2, None)];
        let text = render(KernelCollector::new(move || s.clone()));
        let l = r#"kernel="matmul_q8_0",shape_class="m1",backend="cpu",variant="avx2""#;
        assert!(text.contains("# TYPE civetta_kernel_duration_seconds histogram"));
        assert!(text.contains("# TYPE civetta_kernel_calls_total counter"));
        let bucket = |le: &str| sample(&text, &format!("civetta_kernel_duration_seconds_bucket{{{l},le=\"{le}\"}}"));
        assert_eq!(bucket("0.000001"), 0.0);
        assert_eq!(bucket("0.000004"), 3.0, "bucket 2 is (2us, 4us]");
        assert_eq!(bucket("0.000032"), 7.0, "cumulative through bucket 5");
        assert_eq!(bucket(&BUCKETS_SECONDS[23].to_string()), 7.0, "the +Inf-only sample stays out of finite buckets");
        assert_eq!(bucket("+Inf"), 8.0);
        assert_eq!(sample(&text, &format!("civetta_kernel_duration_seconds_count{{{l}}}")), 8.0);
        let sum = sample(&text, &format!("civetta_kernel_duration_seconds_sum{{{l}}}"));
        assert!((sum - (3.0 * 4e-6 + 4.0 * 32e-6 + 10.0)).abs() < 1e-9, "{sum}");
        assert_eq!(sample(&text, &format!("civetta_kernel_calls_total{{{l}}}")), 20.0);
        assert_eq!(sample(&text, r#"civetta_kernel_calls_total{kernel="rmsnorm",shape_class="m1",backend="cpu",variant="avx2"}"#), 2.0);
        let buckets_per_series =
            text.lines().filter(|l| l.starts_with("civetta_kernel_duration_seconds_bucket{kernel=\"rmsnorm\"")).count();
        assert_eq!(buckets_per_series, BUCKETS_SECONDS.len() + 1);
        assert!(!text.contains("civetta_kernel_vgprs"), "no resource gauges without resources");
    }

    #[test]
    fn resource_gauges_only_for_kernels_with_resources() {
        let res = KernelResources {
            arch: "gfx1151".into(),
            compiler: "clang-22".into(),
            vgprs: 96,
            sgprs: 40,
            scratch_bytes: 0,
            lds_bytes: 8192,
            spills: 0,
            occupancy: 10.0,
            occupancy_unit: "waves_per_simd".into(),
        };
        let s = vec![snap("matmul_q4_k", "m1", &[(3, 1)], 1, Some(res)), snap("rope", "m1", &[(3, 1)], 1, None)];
        let text = render(KernelCollector::new(move || s.clone()));
        let l = r#"kernel="matmul_q4_k",shape_class="m1",backend="cpu",variant="avx2",arch="gfx1151",compiler="clang-22",unit="waves_per_simd""#;
        assert_eq!(sample(&text, &format!("civetta_kernel_vgprs{{{l}}}")), 96.0);
        assert_eq!(sample(&text, &format!("civetta_kernel_sgprs{{{l}}}")), 40.0);
        assert_eq!(sample(&text, &format!("civetta_kernel_lds_bytes{{{l}}}")), 8192.0);
        assert_eq!(sample(&text, &format!("civetta_kernel_scratch_bytes{{{l}}}")), 0.0);
        assert_eq!(sample(&text, &format!("civetta_kernel_occupancy_waves{{{l}}}")), 10.0);
        assert!(!text.lines().any(|x| x.starts_with("civetta_kernel_vgprs{kernel=\"rope\"")));
    }

    #[test]
    fn label_values_are_escaped_and_empty_registry_renders_nothing() {
        let s = vec![snap("we\"ird\\name\n", "m1", &[(1, 1)], 1, None)];
        let text = render(KernelCollector::new(move || s.clone()));
        assert!(text.contains(r#"civetta_kernel_calls_total{kernel="we\"ird\\name\n",shape_class="m1""#), "{text}");
        assert_eq!(render(KernelCollector::new(Vec::new)), "");
    }

    #[test]
    fn request_metrics_and_engine_gauges() {
        let env = crate::envinfo::Fingerprint::from_fields(vec![crate::envinfo::Field::new("toolchain.kernel_compiler", "none", "test")]);
        let m = Metrics::new(&BuildLabels::new("cpu", &env), &env).unwrap();
        m.register(Box::new(EngineCollector::new(|| {
            let mut batch_rows = crate::engine::StepHistogram::default();
            for rows in [1, 3, 3, 40] {
                batch_rows.observe(rows);
            }
            EngineStats {
                queued: 3,
                active: 2,
                kv_bytes: 4096,
                batch_rows,
                kv_blocks_total: 8,
                kv_blocks_used: 2,
                kv_blocks_cached: 1,
                prefix_cache_hit_tokens: 32,
                prefix_cache_miss_tokens: 5,
                preemptions: 1,
                ..Default::default()
            }
        })))
        .unwrap();
        m.register(Box::new(KernelCollector::new(|| vec![snap("rope", "m1", &[(0, 1)], 1, None)]))).unwrap();
        m.observe_request("Generate", Code::Ok, Duration::from_millis(30));
        m.observe_request("Generate", Code::Ok, Duration::from_millis(30));
        m.observe_request("Generate", Code::InvalidArgument, Duration::from_millis(1));
        m.generated_tokens.inc_by(5);
        let text = m.render();
        assert_eq!(sample(&text, r#"civetta_requests_total{code="OK",rpc="Generate"}"#), 2.0);
        assert_eq!(sample(&text, r#"civetta_requests_total{code="INVALID_ARGUMENT",rpc="Generate"}"#), 1.0);
        assert_eq!(sample(&text, r#"civetta_request_duration_seconds_bucket{code="OK",rpc="Generate",le="0.025"}"#), 0.0);
        assert_eq!(sample(&text, r#"civetta_request_duration_seconds_bucket{code="OK",rpc="Generate",le="0.05"}"#), 2.0);
        assert_eq!(sample(&text, "civetta_generated_tokens_total"), 5.0);
        assert_eq!(sample(&text, "civetta_queue_depth"), 3.0);
        assert_eq!(sample(&text, "civetta_active_sequences"), 2.0);
        assert_eq!(sample(&text, "civetta_kv_cache_bytes"), 4096.0);
        assert_eq!(sample(&text, "civetta_kv_cache_usage_ratio"), 0.25);
        assert_eq!(sample(&text, r#"civetta_kv_cache_blocks{state="free"}"#), 5.0);
        assert_eq!(sample(&text, r#"civetta_kv_cache_blocks{state="cached"}"#), 1.0);
        assert_eq!(sample(&text, r#"civetta_prefix_cache_tokens_total{result="hit"}"#), 32.0);
        assert_eq!(sample(&text, r#"civetta_prefix_cache_tokens_total{result="miss"}"#), 5.0);
        assert_eq!(sample(&text, "civetta_preemptions_total"), 1.0);
        assert_eq!(sample(&text, r#"civetta_batch_rows_bucket{le="2"}"#), 1.0);
        assert_eq!(sample(&text, r#"civetta_batch_rows_bucket{le="4"}"#), 3.0);
        assert_eq!(sample(&text, r#"civetta_batch_rows_bucket{le="+Inf"}"#), 4.0);
        assert_eq!(sample(&text, "civetta_batch_rows_sum"), 47.0);
        assert_eq!(sample(&text, "civetta_batch_sequences_count"), 0.0);
        assert_eq!(sample(&text, r#"civetta_requests_rejected_total{reason="queue_full"}"#), 0.0);
        let build = text.lines().find(|l| l.starts_with("civetta_build_info{")).unwrap();
        for part in ["backend=\"cpu\"", "compiler=\"none\"", &format!("version=\"{}\"", crate::build_info::VERSION)] {
            assert!(build.contains(part), "{build}");
        }
        assert!(build.ends_with(" 1"));
        assert!(text.lines().any(|l| l.starts_with("civetta_environment_info{") && l.ends_with(" 1")), "{text}");
        assert!(text.contains("civetta_kernel_calls_total{kernel=\"rope\""));
        #[cfg(target_os = "linux")]
        {
            assert!(sample(&text, "process_resident_memory_bytes") > 1e6, "{text}");
            assert!(sample(&text, "process_open_fds") >= 3.0);
            assert!(sample(&text, "process_start_time_seconds") > 1.6e9);
            assert!(text.contains("process_cpu_seconds_total "));
        }
    }

    #[test]
    fn expert_load_is_one_counter_per_expert() {
        let load = std::sync::Arc::new(crate::model::moe::ExpertLoad::new(4));
        load.record(&[0, 2, 2, 3]);
        load.record(&[2, 0]);
        let r = Registry::new();
        r.register(Box::new(ExpertLoadCollector::new(load))).unwrap();
        let mut buf = Vec::new();
        TextEncoder::new().encode(&r.gather(), &mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert!(text.contains("# TYPE civetta_moe_expert_tokens_total counter"), "{text}");
        for (e, n) in [(0, 2), (1, 0), (2, 3), (3, 1)] {
            assert!(text.contains(&format!("civetta_moe_expert_tokens_total{{expert=\"{e}\"}} {n}\n")), "expert {e}: {text}");
        }
    }
}
