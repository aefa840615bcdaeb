//! Prometheus metrics: request metrics in a prometheus Registry, plus the per-kernel
//! registry rendered at scrape time. /metrics never contains prompt or completion text.

use crate::engine::Engine;
use crate::kernel_registry::{self, BUCKETS_SECONDS};
use prometheus::{Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder};
use std::fmt::Write;

pub struct Metrics {
    pub registry: Registry,
    pub requests: IntCounterVec,
    pub request_duration: HistogramVec,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub prompt_tokens: IntCounter,
    pub generated_tokens: IntCounter,
    pub in_flight: IntGauge,
    pub rejected: IntCounterVec,
    queue_depth: IntGauge,
    active_sequences: IntGauge,
    kv_cache_bytes: IntGauge,
}

const LATENCY_BUCKETS: [f64; 16] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

impl Metrics {
    pub fn new(engine: &Engine, env: &crate::envinfo::Fingerprint) -> prometheus::Result<Metrics> {
        let registry = Registry::new();
        let requests = IntCounterVec::new(Opts::new("civetta_requests_total", "RPCs handled, by method and status code"), &["rpc", "code"])?;
        let request_duration = HistogramVec::new(
            HistogramOpts::new("civetta_request_duration_seconds", "RPC duration from arrival to the last message").buckets(LATENCY_BUCKETS.to_vec()),
            &["rpc", "code"],
        )?;
        let ttft = Histogram::with_opts(HistogramOpts::new("civetta_time_to_first_token_seconds", "Time from request arrival to the first generated token").buckets(LATENCY_BUCKETS.to_vec()))?;
        let itl = Histogram::with_opts(
            HistogramOpts::new("civetta_inter_token_latency_seconds", "Time between consecutive generated tokens of a stream")
                .buckets(vec![0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56]),
        )?;
        let prompt_tokens = IntCounter::new("civetta_prompt_tokens_total", "Prompt tokens of accepted Generate requests")?;
        let generated_tokens = IntCounter::new("civetta_generated_tokens_total", "Tokens generated and streamed")?;
        let in_flight = IntGauge::new("civetta_requests_in_flight", "Generate streams open now")?;
        let rejected = IntCounterVec::new(Opts::new("civetta_requests_rejected_total", "Requests refused before reaching the model, by reason"), &["reason"])?;
        let queue_depth = IntGauge::new("civetta_queue_depth", "Requests waiting for an active sequence slot")?;
        let active_sequences = IntGauge::new("civetta_active_sequences", "Sequences holding a KV cache now")?;
        let kv_cache_bytes = IntGauge::new("civetta_kv_cache_bytes", "Bytes of KV cache allocated to active sequences")?;
        let info = engine.model_info();
        let build = IntGaugeVec::new(
            Opts::new("civetta_build_info", "Build and runtime identity (value is always 1)"),
            &["version", "git_sha", "backend", "compiler", "rustc", "model", "arch"],
        )?;
        build
            .with_label_values(&[
                crate::build_info::VERSION,
                crate::build_info::GIT_SHA,
                &info.backend,
                env.get("toolchain.kernel_compiler").unwrap_or("unknown"),
                crate::build_info::RUSTC,
                &info.name,
                &info.architecture,
            ])
            .set(1);
        registry.register(Box::new(build))?;
        registry.register(Box::new(env.info_gauge()?))?;
        for c in [Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>, Box::new(request_duration.clone()), Box::new(ttft.clone()), Box::new(itl.clone())] {
            registry.register(c)?;
        }
        for c in [
            Box::new(prompt_tokens.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(generated_tokens.clone()),
            Box::new(in_flight.clone()),
            Box::new(rejected.clone()),
            Box::new(queue_depth.clone()),
            Box::new(active_sequences.clone()),
            Box::new(kv_cache_bytes.clone()),
        ] {
            registry.register(c)?;
        }
        Ok(Metrics { registry, requests, request_duration, ttft, itl, prompt_tokens, generated_tokens, in_flight, rejected, queue_depth, active_sequences, kv_cache_bytes })
    }

    /// The full exposition text: registry metrics, engine gauges and per-kernel metrics.
    pub fn render(&self, engine: &Engine) -> String {
        let s = engine.stats();
        self.queue_depth.set(s.queued as i64);
        self.active_sequences.set(s.active as i64);
        self.kv_cache_bytes.set(s.kv_bytes as i64);
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf).expect("text encoding");
        let mut out = String::from_utf8(buf).expect("prometheus text is UTF-8");
        out.push_str(&render_kernels(&kernel_registry::registry().snapshot()));
        out
    }
}

fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn fmt_f64(v: f64) -> String {
    if v.is_infinite() {
        "+Inf".into()
    } else {
        format!("{v}")
    }
}

/// Renders the kernel registry as Prometheus text: a histogram of sampled call durations,
/// a counter of all calls, and static resource gauges where a GPU backend provided them.
pub fn render_kernels(snap: &[kernel_registry::KernelSnapshot]) -> String {
    let mut s = String::new();
    if snap.is_empty() {
        return s;
    }
    let labels = |k: &kernel_registry::KernelKey| {
        format!("kernel=\"{}\",shape_class=\"{}\",backend=\"{}\",variant=\"{}\"", esc(&k.kernel), esc(&k.shape_class), esc(&k.backend), esc(&k.variant))
    };
    s += "# HELP civetta_kernel_duration_seconds Duration of sampled kernel (op) calls.\n# TYPE civetta_kernel_duration_seconds histogram\n";
    for k in snap {
        let l = labels(&k.key);
        let mut cum = 0u64;
        for (i, le) in BUCKETS_SECONDS.iter().enumerate() {
            cum += k.bucket_counts.get(i).copied().unwrap_or(0);
            let _ = writeln!(s, "civetta_kernel_duration_seconds_bucket{{{l},le=\"{}\"}} {cum}", fmt_f64(*le));
        }
        let _ = writeln!(s, "civetta_kernel_duration_seconds_bucket{{{l},le=\"+Inf\"}} {}", k.timed_calls);
        let _ = writeln!(s, "civetta_kernel_duration_seconds_sum{{{l}}} {}", fmt_f64(k.timed_seconds));
        let _ = writeln!(s, "civetta_kernel_duration_seconds_count{{{l}}} {}", k.timed_calls);
    }
    s += "# HELP civetta_kernel_calls_total Kernel (op) calls, sampled for timing or not.\n# TYPE civetta_kernel_calls_total counter\n";
    for k in snap {
        let _ = writeln!(s, "civetta_kernel_calls_total{{{}}} {}", labels(&k.key), k.calls);
    }
    let with_res: Vec<_> = snap.iter().filter_map(|k| k.resources.as_ref().map(|r| (k, r))).collect();
    if !with_res.is_empty() {
        type Getter = fn(&kernel_registry::KernelResources) -> f64;
        let gauges: [(&str, &str, Getter); 5] = [
            ("civetta_kernel_vgprs", "Vector registers per lane of the compiled kernel.", |r| r.vgprs as f64),
            ("civetta_kernel_sgprs", "Scalar registers of the compiled kernel.", |r| r.sgprs as f64),
            ("civetta_kernel_scratch_bytes", "Private (scratch/local) memory per lane in bytes.", |r| r.scratch_bytes as f64),
            ("civetta_kernel_lds_bytes", "Static LDS/shared memory per workgroup in bytes.", |r| r.lds_bytes as f64),
            ("civetta_kernel_occupancy_waves", "Occupancy at the launch configuration, in the unit label.", |r| r.occupancy as f64),
        ];
        for (name, help, get) in gauges {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (k, r) in &with_res {
                let _ = writeln!(s, "{name}{{{},arch=\"{}\",compiler=\"{}\",unit=\"{}\"}} {}", labels(&k.key), esc(&r.arch), esc(&r.compiler), esc(&r.occupancy_unit), get(r));
            }
        }
    }
    s
}
