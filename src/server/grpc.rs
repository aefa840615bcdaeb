//! The `civetta.v1.Inference` gRPC service over the engine.

use super::convert;
use super::lifecycle::Lifecycle;
use super::metrics::Metrics;
use super::tokenize_pool::{PoolError, TokenizePool};
use super::transport_status::mark_reached;
use crate::engine::{Engine, GenerationEvent};
use crate::proto::{self, generate_response::Event, inference_server::Inference};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Code, Request, Response, Status};

/// Messages buffered per Generate stream before the engine's events wait for the client.
const STREAM_BUFFER: usize = 64;

pub struct InferenceService {
    pub engine: Engine,
    pub metrics: Arc<Metrics>,
    /// The name clients may put in `model` fields.
    pub model_name: String,
    pub fingerprint: Arc<crate::envinfo::Fingerprint>,
    /// Set when the shutdown grace period is over and the engine cancels what is left.
    pub draining: Arc<AtomicBool>,
    /// Shutdown phase: new generations are refused from the shutdown request on.
    pub lifecycle: Arc<Lifecycle>,
    /// Where prompts are tokenized and templated (never on the async workers).
    pub tokenize_pool: TokenizePool,
}

type GenStream = Pin<Box<dyn Stream<Item = Result<proto::GenerateResponse, Status>> + Send>>;

impl InferenceService {
    /// Counts a unary call's outcome and passes it through.
    fn finish<T>(&self, rpc: &str, started: Instant, r: Result<T, Status>) -> Result<Response<T>, Status> {
        let code = r.as_ref().map(|_| Code::Ok).unwrap_or_else(|s| s.code());
        self.metrics.observe_request(rpc, code, started.elapsed());
        r.map(Response::new)
    }

    fn reject(&self, reason: &str, s: Status, started: Instant) -> Status {
        self.metrics.rejected.with_label_values(&[reason]).inc();
        self.metrics.observe_request("Generate", s.code(), started.elapsed());
        s
    }
}

#[tonic::async_trait]
impl Inference for InferenceService {
    type GenerateStream = GenStream;

    async fn generate(&self, request: Request<proto::GenerateRequest>) -> Result<Response<GenStream>, Status> {
        mark_reached(&request);
        let started = Instant::now();
        let generation = self.lifecycle.begin_generation().ok_or_else(|| self.reject("shutting_down", shutting_down(), started))?;
        let deadline = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(convert::parse_grpc_timeout)
            .map(|d| tokio::time::Instant::from_std(started + d));
        let req = convert::generation_request(request.into_inner(), &self.model_name).map_err(|s| self.reject("invalid", s, started))?;
        // submit() tokenizes and renders the chat template: CPU work proportional to the prompt.
        let engine = self.engine.clone();
        let submitted = self.tokenize_pool.run(move || engine.submit(req)).await.map_err(|e| {
            let reason = match e {
                PoolError::Busy { .. } => "tokenizer_busy",
                PoolError::Failed(_) => "internal",
            };
            self.reject(reason, e.status(), started)
        })?;
        let mut stream = submitted.map_err(|e| {
            let reason = convert::reject_reason(&e);
            self.reject(reason, convert::submit_status(e), started)
        })?;
        self.metrics.prompt_tokens.inc_by(stream.prompt_tokens as u64);
        self.metrics.in_flight.inc();

        let (tx, rx) = mpsc::channel::<Result<proto::GenerateResponse, Status>>(STREAM_BUFFER);
        let metrics = self.metrics.clone();
        let draining = self.draining.clone();
        // Forwards engine events to the client. Leaving this task drops `stream`, which
        // cancels the sequence: on client disconnect, deadline, or the end of generation.
        tokio::spawn(async move {
            let mut timer = TokenTimer { started, last: None };
            let code = loop {
                let event = tokio::select! {
                    ev = stream.next() => ev,
                    _ = tx.closed() => break Code::Cancelled,
                    _ = sleep_until(deadline) => {
                        let _ = tx.send(Err(Status::deadline_exceeded("deadline exceeded during generation"))).await;
                        break Code::DeadlineExceeded;
                    }
                };
                let (msg, last) = match event {
                    Some(GenerationEvent::Token { id, text, logprob, .. }) => {
                        timer.token(&metrics);
                        metrics.generated_tokens.inc();
                        (
                            Ok(proto::GenerateResponse { event: Some(Event::Token(proto::TokenDelta { token_id: id, text, logprob })) }),
                            false,
                        )
                    }
                    Some(GenerationEvent::Done(s)) => {
                        timer.done(&metrics);
                        (Ok(proto::GenerateResponse { event: Some(Event::Done(convert::done_message(s))) }), true)
                    }
                    Some(GenerationEvent::Error(_)) | None if draining.load(Ordering::SeqCst) => {
                        let _ = tx.send(Err(Status::unavailable("server shut down before the generation finished"))).await;
                        break Code::Unavailable;
                    }
                    Some(GenerationEvent::Error(e)) => {
                        tracing::error!(error = %e, "generation failed");
                        (Err(Status::internal(format!("generation failed: {e}"))), true)
                    }
                    None => {
                        // The engine ended the stream without Done: it is shutting down.
                        let _ = tx.send(Err(Status::unavailable("server is shutting down; generation cancelled"))).await;
                        break Code::Unavailable;
                    }
                };
                let code = match &msg {
                    Err(s) => s.code(),
                    Ok(_) => Code::Ok,
                };
                if tx.send(msg).await.is_err() {
                    break Code::Cancelled;
                }
                if last {
                    break code;
                }
            };
            drop(stream);
            drop(generation);
            metrics.in_flight.dec();
            metrics.observe_request("Generate", code, started.elapsed());
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn tokenize(&self, request: Request<proto::TokenizeRequest>) -> Result<Response<proto::TokenizeResponse>, Status> {
        mark_reached(&request);
        let started = Instant::now();
        let r = request.into_inner();
        let result = match convert::check_model(&r.model, &self.model_name) {
            Err(s) => Err(s),
            Ok(()) if self.lifecycle.is_stopping() => Err(shutting_down()),
            Ok(()) => {
                // Tokenizing a large text is CPU work: keep it off the async workers.
                let engine = self.engine.clone();
                self.tokenize_pool
                    .run(move || {
                        let tk = engine.tokenizer();
                        let ids = tk.encode(&r.text, r.add_bos, r.parse_special);
                        let pieces = ids.iter().map(|&i| tk.piece(i).to_string()).collect();
                        proto::TokenizeResponse { token_ids: ids, pieces }
                    })
                    .await
                    .map_err(PoolError::status)
            }
        };
        self.finish("Tokenize", started, result)
    }

    async fn get_model_info(&self, request: Request<proto::GetModelInfoRequest>) -> Result<Response<proto::ModelInfo>, Status> {
        mark_reached(&request);
        let started = Instant::now();
        self.finish("GetModelInfo", started, Ok(convert::model_info(&self.model_name, self.engine.model_info())))
    }

    async fn get_kernel_stats(&self, request: Request<proto::GetKernelStatsRequest>) -> Result<Response<proto::KernelStats>, Status> {
        mark_reached(&request);
        let started = Instant::now();
        let kernels = crate::kernel_registry::registry().snapshot().into_iter().map(convert::kernel_stat).collect();
        let stats = proto::KernelStats {
            kernels,
            timing_enabled: crate::kernel_registry::timing_enabled(),
            sample_rate: crate::kernel_registry::sample_rate(),
        };
        self.finish("GetKernelStats", started, Ok(stats))
    }

    async fn get_environment(&self, request: Request<proto::GetEnvironmentRequest>) -> Result<Response<proto::Environment>, Status> {
        mark_reached(&request);
        let started = Instant::now();
        self.finish("GetEnvironment", started, Ok(self.fingerprint.to_proto()))
    }
}

/// The answer to new work once shutdown has begun (clients retry on another replica).
fn shutting_down() -> Status {
    Status::unavailable("server is shutting down; not accepting new requests")
}

/// Time to first token and inter-token latency of one stream.
struct TokenTimer {
    started: Instant,
    last: Option<Instant>,
}

impl TokenTimer {
    /// A streamed token: the first observes TTFT, the others the gap since the previous one.
    fn token(&mut self, metrics: &Metrics) {
        let now = Instant::now();
        match self.last {
            None => metrics.ttft.observe((now - self.started).as_secs_f64()),
            Some(prev) => metrics.itl.observe((now - prev).as_secs_f64()),
        }
        self.last = Some(now);
    }

    /// A successful end. A generation whose first token was EOS streams no token, but the
    /// model did produce its first token: TTFT is observed then.
    fn done(&mut self, metrics: &Metrics) {
        if self.last.is_none() {
            metrics.ttft.observe(self.started.elapsed().as_secs_f64());
            self.last = Some(Instant::now());
        }
    }
}

/// Sleeps until the deadline, or forever without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics() -> Metrics {
        let env = crate::envinfo::Fingerprint::from_fields(vec![crate::envinfo::Field::new("toolchain.kernel_compiler", "none", "test")]);
        Metrics::new(&super::super::metrics::BuildLabels::new("cpu", &env), &env).unwrap()
    }

    #[test]
    fn eos_first_still_observes_time_to_first_token() {
        let m = metrics();
        TokenTimer { started: Instant::now(), last: None }.done(&m);
        assert_eq!((m.ttft.get_sample_count(), m.itl.get_sample_count()), (1, 0));
        // A stream with tokens observes TTFT once, at its first token.
        let mut t = TokenTimer { started: Instant::now(), last: None };
        t.token(&m);
        t.token(&m);
        t.done(&m);
        assert_eq!((m.ttft.get_sample_count(), m.itl.get_sample_count()), (2, 1));
    }
}
