//! `civetta bench --remote ADDR` / `--remote-http URL`: TTFT, inter-token latency and tokens/s
//! of a running daemon through its gRPC API, its OpenAI-compatible HTTP API, or both in one run
//! (levels interleaved, so both protocols see the same machine state), at several concurrency
//! levels; optionally #14's mixed scenario (mixed.rs). What is measured and how tokens are
//! counted: stream.rs.

mod grpc;
mod http;
mod mixed;
mod stream;

pub use mixed::MixedPlan;

use super::report::*;
use crate::proto::{GetEnvironmentRequest, GetModelInfoRequest};
use grpc::GrpcTarget;
use http::HttpTarget;
use std::time::Instant;
use stream::{StreamControl, StreamRecord, StreamRequest};

pub struct RemotePlan {
    /// gRPC address (`--remote`).
    pub grpc: Option<String>,
    /// OpenAI-compatible API base URL (`--remote-http`).
    pub http: Option<String>,
    /// Bearer token for both APIs.
    pub token: Option<String>,
    pub concurrency: Vec<usize>,
    pub requests_per_level: usize,
    pub max_tokens: usize,
    pub prompt: String,
    pub mixed: Option<MixedPlan>,
}

/// One API of the daemon under test.
#[derive(Clone)]
pub enum Target {
    Grpc(GrpcTarget),
    Http(HttpTarget),
}

impl Target {
    pub fn protocol(&self) -> &'static str {
        match self {
            Target::Grpc(_) => "grpc",
            Target::Http(_) => "http",
        }
    }

    pub async fn stream(&self, req: &StreamRequest, ctl: StreamControl) -> StreamRecord {
        match self {
            Target::Grpc(t) => t.stream(req, ctl).await,
            Target::Http(t) => t.stream(req, ctl).await,
        }
    }
}

pub async fn run(plan: &RemotePlan, progress: &indicatif::ProgressBar) -> anyhow::Result<BenchReport> {
    let started_at = super::local_now();
    let token = plan.token.as_deref();
    let mut targets = Vec::new();
    let grpc = match &plan.grpc {
        Some(addr) => Some(GrpcTarget::connect(addr, token).await?),
        None => None,
    };
    if let Some(g) = &grpc {
        targets.push(Target::Grpc(g.clone()));
    }
    let mut http_model = None;
    if let Some(url) = &plan.http {
        let h = HttpTarget::connect(url, token).await?;
        http_model = Some(h.model.clone());
        targets.push(Target::Http(h));
    }
    anyhow::ensure!(!targets.is_empty(), "give --remote (gRPC) and/or --remote-http (the OpenAI API)");
    let (fingerprint, model, backend) = match &grpc {
        Some(g) => describe_over_grpc(g).await?,
        // The HTTP API names the model only.
        None => (
            serde_json::json!({ "fields": [] }),
            ModelIdentity {
                path: String::new(),
                file_sha256: String::new(),
                file_bytes: 0,
                name: http_model.unwrap_or_default(),
                architecture: String::new(),
                parameter_count: 0,
                quant_mix: String::new(),
            },
            String::new(),
        ),
    };
    progress.set_length((plan.concurrency.len() * plan.requests_per_level * targets.len()) as u64);
    let mut results = Vec::new();
    for &c in &plan.concurrency {
        for t in &targets {
            progress.set_message(format!("{} concurrency {c}", t.protocol()));
            results.push(run_level(t, c, plan, progress).await?);
        }
    }
    let mut mixed_results = Vec::new();
    if let Some(m) = &plan.mixed {
        for t in &targets {
            progress.set_message(format!("{} mixed", t.protocol()));
            let mut r = mixed::run(t, m, &plan.prompt).await?;
            r.protocol = t.protocol().into();
            mixed_results.push(r);
        }
    }
    Ok(BenchReport {
        schema_version: SCHEMA_VERSION,
        civetta_version: crate::build_info::VERSION.into(),
        git_sha: crate::build_info::GIT_SHA.into(),
        started_at,
        fingerprint,
        model,
        settings: BenchSettings {
            backend,
            threads: 0,
            repetitions: 1,
            warmup: 0,
            kernel_timing: true,
            sample_rate: 1.0,
            prefill_batch: 0,
            cpu_q4_k_repacked: None,
            cpu_q8_0_repacked: None,
            cpu_pool: None,
        },
        tests: Vec::new(),
        profile: Profile::default(),
        hashes: None,
        remote: results,
        mixed: mixed_results,
    })
}

async fn describe_over_grpc(g: &GrpcTarget) -> anyhow::Result<(serde_json::Value, ModelIdentity, String)> {
    let mut client = g.client.clone();
    let env = client.get_environment(g.request(GetEnvironmentRequest {})).await?.into_inner();
    let fingerprint: serde_json::Value = serde_json::from_str(&env.json).unwrap_or_else(|_| {
        serde_json::json!({ "fields": env.fields.iter().map(|f| serde_json::json!({"key": f.key, "value": f.value, "source": f.source})).collect::<Vec<_>>() })
    });
    let info = client.get_model_info(g.request(GetModelInfoRequest {})).await?.into_inner();
    let quant_mix = info.tensor_types.iter().map(|t| format!("{}:{}", t.ggml_type, t.count)).collect::<Vec<_>>().join(", ");
    let model = ModelIdentity {
        path: info.path.clone(),
        file_sha256: info.file_sha256.clone(),
        file_bytes: info.file_bytes,
        name: info.name.clone(),
        architecture: info.architecture.clone(),
        parameter_count: info.parameter_count,
        quant_mix,
    };
    Ok((fingerprint, model, info.backend))
}

/// `c` workers, each running its share of the level's requests one after another.
async fn run_level(target: &Target, c: usize, plan: &RemotePlan, progress: &indicatif::ProgressBar) -> anyhow::Result<RemoteResult> {
    let wall = Instant::now();
    let mut handles = Vec::new();
    for worker in 0..c {
        let n = plan.requests_per_level / c + usize::from(worker < plan.requests_per_level % c);
        let (target, progress) = (target.clone(), progress.clone());
        let req = StreamRequest { prompt: plan.prompt.clone(), max_tokens: plan.max_tokens };
        handles.push(tokio::spawn(async move {
            let mut records = Vec::new();
            for _ in 0..n {
                records.push(target.stream(&req, StreamControl::default()).await);
                progress.inc(1);
            }
            records
        }));
    }
    let mut records = Vec::new();
    for h in handles {
        records.extend(h.await?);
    }
    let secs = wall.elapsed().as_secs_f64();
    if let Some(e) = records.iter().find_map(|r| r.error.as_deref()) {
        let n = records.iter().filter(|r| r.error.is_some()).count();
        eprintln!("civetta bench: {} concurrency {c}: {n} of {} requests failed; the first: {e}", target.protocol(), records.len());
    }
    Ok(level_result(target.protocol(), c, plan.requests_per_level, &records, secs))
}

fn level_result(protocol: &str, c: usize, requests: usize, records: &[StreamRecord], secs: f64) -> RemoteResult {
    let mut ttft: Vec<f64> = records.iter().filter_map(StreamRecord::ttft).collect();
    let mut itl: Vec<f64> = records.iter().flat_map(|r| r.itl_samples().into_iter().map(|s| s.1)).collect();
    ttft.sort_by(f64::total_cmp);
    itl.sort_by(f64::total_cmp);
    let generated: usize = records.iter().map(StreamRecord::generated_tokens).sum();
    RemoteResult {
        concurrency: c,
        requests,
        errors: records.iter().filter(|r| r.error.is_some()).count(),
        ttft_mean_s: mean_stddev(&ttft).0,
        ttft_p50_s: percentile(&ttft, 0.5),
        ttft_p95_s: percentile(&ttft, 0.95),
        ttft_p99_s: percentile(&ttft, 0.99),
        itl_mean_s: mean_stddev(&itl).0,
        itl_p50_s: percentile(&itl, 0.5),
        itl_p95_s: percentile(&itl, 0.95),
        itl_p99_s: percentile(&itl, 0.99),
        tokens_per_second: generated as f64 / secs,
        protocol: protocol.into(),
        generated_tokens: generated,
        prompt_tokens: records.iter().filter_map(|r| r.prompt_tokens).sum(),
        deliveries: records.iter().map(|r| r.deliveries.len()).sum(),
    }
}
