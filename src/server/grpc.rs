//! The civetta.v1.Inference gRPC service over the engine.

use super::metrics::Metrics;
use crate::engine::{self, Engine, FinishReason, GenerationEvent, PromptInput, SubmitError};
use crate::proto::{self, generate_response::Event, inference_server::Inference};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

pub struct InferenceService {
    pub engine: Engine,
    pub metrics: Arc<Metrics>,
    pub model_name: String,
    pub fingerprint: Arc<crate::envinfo::Fingerprint>,
}

type GenStream = Pin<Box<dyn Stream<Item = Result<proto::GenerateResponse, Status>> + Send>>;

/// Parses the gRPC deadline header ("100m", "5S", ...).
fn grpc_timeout<T>(req: &Request<T>) -> Option<Duration> {
    let v = req.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (num, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

impl InferenceService {
    fn count(&self, rpc: &str, code: tonic::Code, started: Instant) {
        let c = format!("{code:?}");
        self.metrics.requests.with_label_values(&[rpc, &c]).inc();
        self.metrics.request_duration.with_label_values(&[rpc, &c]).observe(started.elapsed().as_secs_f64());
    }

    fn check_model(&self, name: &str) -> Result<(), Status> {
        if !name.is_empty() && name != self.model_name {
            return Err(Status::invalid_argument(format!("unknown model \"{name}\" (this server serves \"{}\")", self.model_name)));
        }
        Ok(())
    }

    /// Proto -> engine request; the engine then checks everything that needs the model.
    fn to_engine_request(&self, r: proto::GenerateRequest) -> Result<engine::GenerationRequest, Status> {
        self.check_model(&r.model)?;
        let prompt = match (r.prompt.is_empty(), r.messages.is_empty()) {
            (false, true) => PromptInput::Text { text: r.prompt, add_bos: r.add_bos },
            (true, false) => PromptInput::Chat(r.messages.into_iter().map(|m| engine::ChatMessage { role: m.role, content: m.content }).collect()),
            (true, true) => return Err(Status::invalid_argument("prompt is empty: set `prompt` or `messages`")),
            (false, false) => return Err(Status::invalid_argument("set only one of `prompt` and `messages`")),
        };
        let s = r.sampling.unwrap_or_default();
        Ok(engine::GenerationRequest {
            prompt,
            max_tokens: r.max_tokens as usize,
            sampling: engine::SamplingParams {
                temperature: s.temperature,
                top_k: s.top_k as usize,
                top_p: if s.top_p == 0.0 { 1.0 } else { s.top_p },
                min_p: s.min_p,
                repetition_penalty: if s.repetition_penalty == 0.0 { 1.0 } else { s.repetition_penalty },
                repetition_window: if s.repetition_window == 0 { 64 } else { s.repetition_window as usize },
                seed: s.seed.unwrap_or_else(rand::random),
            },
            stop: r.stop,
            ignore_eos: r.ignore_eos,
        })
    }
}

fn submit_status(e: SubmitError) -> Status {
    match e {
        SubmitError::Invalid(m) => Status::invalid_argument(m),
        SubmitError::QueueFull { queued, retry_after_ms } => {
            let mut s = Status::resource_exhausted(format!("server overloaded: {queued} requests queued; retry after {retry_after_ms} ms"));
            if let Ok(v) = retry_after_ms.to_string().parse() {
                s.metadata_mut().insert("retry-after-ms", v);
            }
            s
        }
        SubmitError::ShuttingDown => Status::unavailable("server is shutting down"),
    }
}

fn reject_reason(e: &SubmitError) -> &'static str {
    match e {
        SubmitError::Invalid(_) => "invalid",
        SubmitError::QueueFull { .. } => "queue_full",
        SubmitError::ShuttingDown => "shutting_down",
    }
}

fn finish_reason(r: FinishReason) -> i32 {
    (match r {
        FinishReason::Length => proto::FinishReason::Length,
        FinishReason::Stop => proto::FinishReason::Stop,
        FinishReason::Eos => proto::FinishReason::Eos,
        FinishReason::Context => proto::FinishReason::Context,
        FinishReason::Cancelled => proto::FinishReason::Unspecified,
    }) as i32
}

#[tonic::async_trait]
impl Inference for InferenceService {
    type GenerateStream = GenStream;

    async fn generate(&self, request: Request<proto::GenerateRequest>) -> Result<Response<GenStream>, Status> {
        let started = Instant::now();
        let deadline = grpc_timeout(&request).map(|d| started + d);
        let req = match self.to_engine_request(request.into_inner()) {
            Ok(r) => r,
            Err(s) => {
                self.metrics.rejected.with_label_values(&["invalid"]).inc();
                self.count("Generate", s.code(), started);
                return Err(s);
            }
        };
        let mut stream = match self.engine.submit(req) {
            Ok(s) => s,
            Err(e) => {
                self.metrics.rejected.with_label_values(&[reject_reason(&e)]).inc();
                let s = submit_status(e);
                self.count("Generate", s.code(), started);
                return Err(s);
            }
        };
        self.metrics.prompt_tokens.inc_by(stream.prompt_tokens as u64);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<proto::GenerateResponse, Status>>(64);
        let metrics = self.metrics.clone();
        metrics.in_flight.inc();
        tokio::spawn(async move {
            let mut last: Option<Instant> = None;
            let mut code = tonic::Code::Ok;
            loop {
                let next = match deadline {
                    Some(d) => match tokio::time::timeout_at(d.into(), stream.next()).await {
                        Ok(ev) => ev,
                        Err(_) => {
                            code = tonic::Code::DeadlineExceeded;
                            let _ = tx.send(Err(Status::deadline_exceeded("deadline exceeded during generation"))).await;
                            break;
                        }
                    },
                    None => stream.next().await,
                };
                let msg = match next {
                    Some(GenerationEvent::Token { id, text, logprob }) => {
                        let now = Instant::now();
                        match last {
                            None => metrics.ttft.observe((now - started).as_secs_f64()),
                            Some(p) => metrics.itl.observe((now - p).as_secs_f64()),
                        }
                        last = Some(now);
                        metrics.generated_tokens.inc();
                        Ok(proto::GenerateResponse { event: Some(Event::Token(proto::TokenDelta { token_id: id, text, logprob })) })
                    }
                    Some(GenerationEvent::Done(s)) => Ok(proto::GenerateResponse {
                        event: Some(Event::Done(proto::GenerateDone {
                            usage: Some(proto::Usage { prompt_tokens: s.prompt_tokens as u32, completion_tokens: s.completion_tokens as u32 }),
                            timings: Some(proto::Timings {
                                queue_seconds: s.timings.queue.as_secs_f64(),
                                prefill_seconds: s.timings.prefill.as_secs_f64(),
                                decode_seconds: s.timings.decode.as_secs_f64(),
                                time_to_first_token_seconds: s.timings.time_to_first_token.as_secs_f64(),
                                total_seconds: s.timings.total.as_secs_f64(),
                            }),
                            finish_reason: finish_reason(s.finish_reason),
                            token_ids: s.token_ids,
                            text_tail: s.text_tail,
                        })),
                    }),
                    Some(GenerationEvent::Error(e)) => {
                        code = tonic::Code::Internal;
                        Err(Status::internal(e))
                    }
                    None => break,
                };
                let end = !matches!(&msg, Ok(proto::GenerateResponse { event: Some(Event::Token(_)) }));
                if tx.send(msg).await.is_err() {
                    // The client went away: dropping `stream` cancels the sequence.
                    code = tonic::Code::Cancelled;
                    break;
                }
                if end {
                    break;
                }
            }
            drop(stream);
            metrics.in_flight.dec();
            let c = format!("{code:?}");
            metrics.requests.with_label_values(&["Generate", &c]).inc();
            metrics.request_duration.with_label_values(&["Generate", &c]).observe(started.elapsed().as_secs_f64());
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn tokenize(&self, request: Request<proto::TokenizeRequest>) -> Result<Response<proto::TokenizeResponse>, Status> {
        let started = Instant::now();
        let r = request.into_inner();
        if let Err(s) = self.check_model(&r.model) {
            self.count("Tokenize", s.code(), started);
            return Err(s);
        }
        let tk = self.engine.tokenizer();
        let ids = tk.encode(&r.text, r.add_bos, r.parse_special);
        let pieces = ids.iter().map(|&i| tk.piece(i).to_string()).collect();
        self.count("Tokenize", tonic::Code::Ok, started);
        Ok(Response::new(proto::TokenizeResponse { token_ids: ids, pieces }))
    }

    async fn get_model_info(&self, _: Request<proto::GetModelInfoRequest>) -> Result<Response<proto::ModelInfo>, Status> {
        let started = Instant::now();
        let i = self.engine.model_info();
        let info = proto::ModelInfo {
            name: self.model_name.clone(),
            architecture: i.architecture.clone(),
            path: i.path.display().to_string(),
            file_bytes: i.file_bytes,
            context_length: i.context_length as u32,
            embedding_length: i.embedding_length as u32,
            block_count: i.block_count as u32,
            head_count: i.head_count as u32,
            head_count_kv: i.head_count_kv as u32,
            vocab_size: i.vocab_size as u32,
            parameter_count: i.parameter_count,
            tensor_types: i.tensor_types.iter().map(|(t, c)| proto::TensorTypeCount { ggml_type: t.clone(), count: *c as u32 }).collect(),
            tokenizer_model: i.tokenizer_model.clone(),
            has_chat_template: i.has_chat_template,
            backend: i.backend.clone(),
            file_sha256: i.file_sha256.clone(),
        };
        self.count("GetModelInfo", tonic::Code::Ok, started);
        Ok(Response::new(info))
    }

    async fn get_kernel_stats(&self, _: Request<proto::GetKernelStatsRequest>) -> Result<Response<proto::KernelStats>, Status> {
        let started = Instant::now();
        let kernels = crate::kernel_registry::registry()
            .snapshot()
            .into_iter()
            .map(|k| {
                let r = k.resources.unwrap_or_default();
                proto::KernelStat {
                    kernel: k.key.kernel,
                    shape_class: k.key.shape_class,
                    backend: k.key.backend,
                    variant: k.key.variant,
                    calls: k.calls,
                    timed_calls: k.timed_calls,
                    total_seconds: k.total_seconds,
                    mean_seconds: k.mean_seconds,
                    p50_seconds: k.p50_seconds,
                    p99_seconds: k.p99_seconds,
                    vgprs: r.vgprs,
                    sgprs: r.sgprs,
                    scratch_bytes: r.scratch_bytes,
                    lds_bytes: r.lds_bytes,
                    waves_per_simd: r.occupancy,
                    spills: r.spills,
                    arch: r.arch,
                    compiler: r.compiler,
                }
            })
            .collect();
        self.count("GetKernelStats", tonic::Code::Ok, started);
        Ok(Response::new(proto::KernelStats {
            kernels,
            timing_enabled: crate::kernel_registry::timing_enabled(),
            sample_rate: crate::kernel_registry::sample_rate(),
        }))
    }

    async fn get_environment(&self, _: Request<proto::GetEnvironmentRequest>) -> Result<Response<proto::Environment>, Status> {
        let started = Instant::now();
        self.count("GetEnvironment", tonic::Code::Ok, started);
        Ok(Response::new(self.fingerprint.to_proto()))
    }
}

/// Bearer-token check with a constant-time comparison; health checks are exempt (separate service).
pub fn auth_interceptor(token: Option<Arc<Vec<u8>>>) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |req: Request<()>| {
        let Some(expected) = &token else { return Ok(req) };
        let given = req.metadata().get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).unwrap_or("");
        if constant_time_eq(given.as_bytes(), expected) {
            Ok(req)
        } else {
            Err(Status::unauthenticated("missing or wrong bearer token"))
        }
    }
}

pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    // Length is not secret; the content comparison does not stop at the first difference.
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
