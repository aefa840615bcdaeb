//! One generation over HTTP, shared by the chat and completions endpoints: submission off
//! the async workers, the request's metrics, the engine events turned into [`Step`]s, and
//! the two ways of answering (one JSON body, or Server-Sent Events).

use super::error::ApiError;
use super::openai::{finish_reason, Options, Usage};
use super::HttpState;
use crate::engine::{Engine, GenerationEvent, GenerationRequest, GenerationSummary, PromptInput};
use crate::server::convert;
use crate::server::lifecycle::GenerationGuard;
use crate::server::metrics::Metrics;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tonic::Code;

/// SSE events buffered per stream before the engine's events wait for the client.
const STREAM_BUFFER: usize = 64;

/// Records one request in `civetta_requests_total` / `_duration_seconds` when dropped, with
/// the code set last (CANCELLED when the client went away first), and keeps the in-flight
/// gauges while a generation runs.
pub struct Tracker {
    metrics: Arc<Metrics>,
    state: Arc<HttpState>,
    route: &'static str,
    started: Instant,
    code: Code,
    /// Held while a generation runs (the daemon's drain waits for it).
    generation: Option<GenerationGuard>,
}

impl Tracker {
    pub fn new(state: &Arc<HttpState>, route: &'static str) -> Tracker {
        Tracker {
            metrics: state.metrics.clone(),
            state: state.clone(),
            route,
            started: Instant::now(),
            code: Code::Cancelled,
            generation: None,
        }
    }

    pub fn set(&mut self, code: Code) {
        self.code = code;
    }

    /// Counts a refusal before the model (`civetta_requests_rejected_total{reason}`).
    pub fn reject(&mut self, reason: &str, e: ApiError) -> ApiError {
        self.metrics.rejected.with_label_values(&[reason]).inc();
        self.code = e.grpc_code();
        e
    }

    fn start_generation(&mut self, guard: GenerationGuard) {
        self.generation = Some(guard);
        self.metrics.in_flight.inc();
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        if self.generation.take().is_some() {
            self.metrics.in_flight.dec();
        }
        self.metrics.observe_request(self.route, self.code, self.started.elapsed());
    }
}

/// A generated token as the response formats need it.
#[derive(Debug, Clone)]
pub struct TokenOut {
    pub id: u32,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    /// The most likely alternatives of this step (as many as the request asked for).
    pub top: Vec<Alternative>,
}

/// One alternative of a generated token, for the logprobs objects.
#[derive(Debug, Clone)]
pub struct Alternative {
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

pub enum Step {
    /// `text` may be empty (an incomplete UTF-8 character, or a possible stop sequence).
    Token {
        text: String,
        token: TokenOut,
    },
    Done(GenerationSummary),
    Failed(ApiError),
}

/// An admitted generation: dropping it cancels the sequence (the slot frees within a step).
pub struct Generation {
    /// The engine's stream (its type is not exported; boxed as a plain `Stream`).
    stream: std::pin::Pin<Box<dyn tokio_stream::Stream<Item = GenerationEvent> + Send>>,
    engine: Engine,
    pub tracker: Tracker,
    last_token: Option<Instant>,
    /// The time limit (server.http_request_timeout_seconds or the request's `timeout`,
    /// whichever is shorter) and when it runs out.
    deadline: Option<(std::time::Duration, tokio::time::Instant)>,
}

/// Tokenizes and submits under `spawn_blocking` (a large prompt is CPU work that must not
/// hold an async worker). With `fill_context`, max_tokens becomes what the context leaves.
pub async fn submit(
    state: &Arc<HttpState>,
    mut req: GenerationRequest,
    opts: &Options,
    mut tracker: Tracker,
) -> Result<Generation, (Tracker, ApiError)> {
    let fill_context = opts.fill_context;
    let limit = match (state.request_timeout, opts.timeout) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let deadline = limit.map(|l| (l, tokio::time::Instant::from_std(tracker.started) + l));
    let Some(guard) = state.lifecycle.begin_generation() else {
        let e = tracker.reject("shutting_down", ApiError::draining());
        return Err((tracker, e));
    };
    let engine = state.engine.clone();
    let submitted = tokio::task::spawn_blocking(move || {
        if fill_context {
            let ids = engine.prompt_tokens(&req.prompt)?;
            // A prompt that fills the context is refused by validation with its own message.
            req.max_tokens = engine.context_length().saturating_sub(ids.len()).max(1);
            req.prompt = PromptInput::Tokens(ids);
        }
        engine.submit(req)
    })
    .await;
    match submitted {
        Ok(Ok(stream)) => {
            state.metrics.prompt_tokens.inc_by(stream.prompt_tokens as u64);
            tracker.start_generation(guard);
            let stream = futures::stream::unfold(stream, |mut s| async move { s.next().await.map(|e| (e, s)) });
            Ok(Generation { stream: Box::pin(stream), engine: state.engine.clone(), tracker, last_token: None, deadline })
        }
        Ok(Err(e)) => {
            let reason = convert::reject_reason(&e);
            let e = tracker.reject(reason, e.into());
            Err((tracker, e))
        }
        Err(join) => {
            let e = ApiError::internal(format!("submitting failed: {join}"));
            tracker.set(Code::Internal);
            Err((tracker, e))
        }
    }
}

impl Generation {
    pub async fn next(&mut self) -> Step {
        let event = match self.deadline {
            None => self.stream.next().await,
            Some((limit, at)) => tokio::select! {
                ev = self.stream.next() => ev,
                // The caller drops the generation after a failure: the sequence is cancelled.
                _ = tokio::time::sleep_until(at) => return Step::Failed(ApiError::timeout(limit)),
            },
        };
        match event {
            Some(GenerationEvent::Token { id, text, logprob, top_logprobs }) => {
                let metrics = &self.tracker.metrics;
                let now = Instant::now();
                match self.last_token {
                    None => metrics.ttft.observe((now - self.tracker.started).as_secs_f64()),
                    Some(prev) => metrics.itl.observe((now - prev).as_secs_f64()),
                }
                self.last_token = Some(now);
                metrics.generated_tokens.inc();
                let tk = self.engine.tokenizer();
                let bytes = tk.token_bytes(id).to_vec();
                let top = top_logprobs.iter().map(|a| Alternative { logprob: a.logprob, bytes: tk.token_bytes(a.id).to_vec() }).collect();
                Step::Token { text, token: TokenOut { id, logprob, bytes, top } }
            }
            Some(GenerationEvent::Done(s)) => {
                // A generation whose first token was EOS yields no token event, but the model
                // did produce its first token: TTFT is observed then (as on gRPC).
                if self.last_token.is_none() {
                    self.tracker.metrics.ttft.observe(self.tracker.started.elapsed().as_secs_f64());
                    self.last_token = Some(Instant::now());
                }
                Step::Done(s)
            }
            Some(GenerationEvent::Error(_)) | None if self.tracker.state.draining.load(Ordering::SeqCst) => {
                Step::Failed(ApiError { message: "server shut down before the generation finished".into(), ..ApiError::draining() })
            }
            Some(GenerationEvent::Error(e)) => {
                tracing::error!(error = %e, "generation failed");
                Step::Failed(ApiError::internal(format!("generation failed: {e}")))
            }
            // The engine ended the stream without Done: it is shutting down.
            None => Step::Failed(ApiError { message: "server is shutting down; generation cancelled".into(), ..ApiError::draining() }),
        }
    }
}

/// How an endpoint renders its objects (chat.completion vs text_completion).
pub trait Format: Send + 'static {
    /// A chunk sent before any token (chat: the assistant role).
    fn start_chunk(&self) -> Option<serde_json::Value>;
    /// A chunk with new text and the tokens that produced it.
    fn delta_chunk(&self, text: &str, tokens: &[TokenOut], offset: usize) -> serde_json::Value;
    /// The chunk carrying `finish_reason`.
    fn finish_chunk(&self, finish_reason: &str) -> serde_json::Value;
    /// The `stream_options.include_usage` chunk (no choices).
    fn usage_chunk(&self, usage: Usage) -> serde_json::Value;
    /// The whole non-streamed response.
    fn response(&self, text: &str, tokens: &[TokenOut], finish_reason: &str, usage: Usage) -> serde_json::Value;
}

pub fn json_response(status: StatusCode, v: &serde_json::Value) -> Response {
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], v.to_string()).into_response()
}

/// Runs the generation to the end and answers with one JSON object.
pub async fn collect(mut g: Generation, fmt: impl Format) -> Response {
    let (mut text, mut tokens) = (String::new(), Vec::new());
    loop {
        match g.next().await {
            Step::Token { text: t, token } => {
                text += &t;
                tokens.push(token);
            }
            Step::Done(s) => {
                text += &s.text_tail;
                g.tracker.set(Code::Ok);
                return json_response(StatusCode::OK, &fmt.response(&text, &tokens, finish_reason(s.finish_reason), Usage::of(&s)));
            }
            Step::Failed(e) => {
                g.tracker.set(e.grpc_code());
                return e.into_response();
            }
        }
    }
}

fn event(v: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// Streams the generation as Server-Sent Events: `data: {chunk}` events, then
/// `data: [DONE]`. A failure midway is one `data: {"error": ...}` event and the end of the
/// stream. When the client goes away the forwarding task ends and drops the generation,
/// which cancels the sequence (as on gRPC).
pub fn stream(mut g: Generation, fmt: impl Format, opts: Options) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(STREAM_BUFFER);
    tokio::spawn(async move {
        if let Some(c) = fmt.start_chunk() {
            if tx.send(event(&c)).await.is_err() {
                return;
            }
        }
        // Tokens whose text is still pending ride along with the next chunk that has text.
        let mut pending: Vec<TokenOut> = Vec::new();
        let mut offset = 0;
        loop {
            let step = tokio::select! {
                s = g.next() => s,
                _ = tx.closed() => return,
            };
            let (events, last) = match step {
                Step::Token { text, token } => {
                    pending.push(token);
                    if text.is_empty() {
                        continue;
                    }
                    let e = vec![event(&fmt.delta_chunk(&text, &pending, offset))];
                    offset += text.len();
                    pending.clear();
                    (e, false)
                }
                Step::Done(s) => {
                    let mut e = Vec::new();
                    if !s.text_tail.is_empty() || !pending.is_empty() {
                        e.push(event(&fmt.delta_chunk(&s.text_tail, &pending, offset)));
                    }
                    e.push(event(&fmt.finish_chunk(finish_reason(s.finish_reason))));
                    if opts.include_usage {
                        e.push(event(&fmt.usage_chunk(Usage::of(&s))));
                    }
                    e.push(Bytes::from_static(b"data: [DONE]\n\n"));
                    g.tracker.set(Code::Ok);
                    (e, true)
                }
                Step::Failed(err) => {
                    g.tracker.set(err.grpc_code());
                    (vec![Bytes::from(format!("data: {}\n\n", err.body_json()))], true)
                }
            };
            for e in events {
                if tx.send(e).await.is_err() {
                    g.tracker.set(Code::Cancelled);
                    return;
                }
            }
            if last {
                return;
            }
        }
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<Bytes, std::convert::Infallible>));
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}
