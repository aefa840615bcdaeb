//! `civetta bench --remote ADDR`: TTFT, inter-token latency and tokens/s of a running daemon
//! through its gRPC API, at several concurrency levels.

use super::report::*;
use crate::proto::{generate_response::Event, GenerateRequest, GetEnvironmentRequest, GetModelInfoRequest, SamplingParams};
use std::time::Instant;

pub struct RemotePlan {
    pub addr: String,
    pub concurrency: Vec<usize>,
    pub requests_per_level: usize,
    pub max_tokens: usize,
    pub prompt: String,
}

pub async fn run(plan: &RemotePlan, progress: &indicatif::ProgressBar) -> anyhow::Result<BenchReport> {
    let started_at = super::local_now();
    let mut client = crate::client::connect(&plan.addr).await?;
    let env = client.get_environment(GetEnvironmentRequest {}).await?.into_inner();
    let fingerprint: serde_json::Value = serde_json::from_str(&env.json).unwrap_or_else(|_| {
        serde_json::json!({ "fields": env.fields.iter().map(|f| serde_json::json!({"key": f.key, "value": f.value, "source": f.source})).collect::<Vec<_>>() })
    });
    let info = client.get_model_info(GetModelInfoRequest {}).await?.into_inner();
    progress.set_length((plan.concurrency.len() * plan.requests_per_level) as u64);
    let mut results = Vec::new();
    for &c in &plan.concurrency {
        progress.set_message(format!("concurrency {c}"));
        let wall = Instant::now();
        let mut handles = Vec::new();
        for worker in 0..c {
            let mut client = client.clone();
            let n = plan.requests_per_level / c + usize::from(worker < plan.requests_per_level % c);
            let req = GenerateRequest {
                prompt: plan.prompt.clone(),
                max_tokens: plan.max_tokens as u32,
                sampling: Some(SamplingParams { temperature: 0.0, seed: Some(1), ..Default::default() }),
                ignore_eos: true,
                ..Default::default()
            };
            let progress = progress.clone();
            handles.push(tokio::spawn(async move {
                let mut ttft = Vec::new();
                let mut itl = Vec::new();
                let (mut tokens, mut errors) = (0usize, 0usize);
                for _ in 0..n {
                    let t0 = Instant::now();
                    let mut last = None::<Instant>;
                    match client.generate(req.clone()).await {
                        Ok(resp) => {
                            let mut s = resp.into_inner();
                            loop {
                                match s.message().await {
                                    Ok(Some(m)) => {
                                        if let Some(Event::Token(_)) = m.event {
                                            let now = Instant::now();
                                            match last {
                                                None => ttft.push((now - t0).as_secs_f64()),
                                                Some(prev) => itl.push((now - prev).as_secs_f64()),
                                            }
                                            last = Some(now);
                                            tokens += 1;
                                        }
                                    }
                                    Ok(None) => break,
                                    Err(_) => {
                                        errors += 1;
                                        break;
                                    }
                                }
                            }
                        }
                        Err(_) => errors += 1,
                    }
                    progress.inc(1);
                }
                (ttft, itl, tokens, errors)
            }));
        }
        let (mut ttft, mut itl, mut tokens, mut errors) = (Vec::new(), Vec::new(), 0, 0);
        for h in handles {
            let (a, b, t, e) = h.await?;
            ttft.extend(a);
            itl.extend(b);
            tokens += t;
            errors += e;
        }
        let secs = wall.elapsed().as_secs_f64();
        ttft.sort_by(f64::total_cmp);
        itl.sort_by(f64::total_cmp);
        results.push(RemoteResult {
            concurrency: c,
            requests: plan.requests_per_level,
            errors,
            ttft_mean_s: mean_stddev(&ttft).0,
            ttft_p50_s: percentile(&ttft, 0.5),
            ttft_p95_s: percentile(&ttft, 0.95),
            ttft_p99_s: percentile(&ttft, 0.99),
            itl_mean_s: mean_stddev(&itl).0,
            itl_p50_s: percentile(&itl, 0.5),
            itl_p95_s: percentile(&itl, 0.95),
            itl_p99_s: percentile(&itl, 0.99),
            tokens_per_second: tokens as f64 / secs,
        });
    }
    let quant_mix = info.tensor_types.iter().map(|t| format!("{}:{}", t.ggml_type, t.count)).collect::<Vec<_>>().join(", ");
    Ok(BenchReport {
        schema_version: SCHEMA_VERSION,
        civetta_version: crate::build_info::VERSION.into(),
        git_sha: crate::build_info::GIT_SHA.into(),
        started_at,
        fingerprint,
        model: ModelIdentity {
            path: info.path.clone(),
            file_sha256: info.file_sha256.clone(),
            file_bytes: info.file_bytes,
            name: info.name.clone(),
            architecture: info.architecture.clone(),
            parameter_count: info.parameter_count,
            quant_mix,
        },
        settings: BenchSettings {
            backend: info.backend.clone(),
            threads: 0,
            repetitions: 1,
            warmup: 0,
            kernel_timing: true,
            sample_rate: 1.0,
            prefill_batch: 0,
        },
        tests: Vec::new(),
        profile: Profile::default(),
        hashes: None,
        remote: results,
    })
}
