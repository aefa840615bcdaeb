//! The OpenAI-compatible HTTP API (axum), beside gRPC on the same [`Engine`], with the same
//! bearer token, limits and metrics:
//!
//! - `POST /v1/chat/completions` ([`chat`]), `POST /v1/completions` ([`completions`]),
//!   JSON or Server-Sent Events ([`generate`]); wire types in [`openai`];
//! - `GET /v1/models`, `GET /v1/models/{id}`;
//! - `GET /health`: 200, or 503 once shutdown has begun (open, like gRPC health).
//!
//! Errors have OpenAI's shape ([`error`]). `civetta_requests_total{rpc}` gets the route
//! (`/v1/chat/completions`, ...) and `code` the gRPC code of the HTTP status, so one set of
//! alert rules covers both APIs.
//!
//! Shutdown: once a stop is requested `/health` answers 503 and new generations are
//! refused with 503, while running streams go on for the grace period; the listener closes
//! when they are done (or the grace period is over).

pub mod chat;
pub mod completions;
pub mod error;
pub mod generate;
pub mod openai;

use super::auth::Token;
use super::lifecycle::Lifecycle;
use super::metrics::Metrics;
use crate::engine::Engine;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use error::ApiError;
use serde_json::json;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct HttpState {
    pub engine: Engine,
    pub metrics: Arc<Metrics>,
    pub token: Token,
    /// The name clients put in `model` (and what /v1/models lists).
    pub model_name: String,
    /// The request body limit (server.max_message_bytes, as for gRPC messages).
    pub max_body_bytes: usize,
    /// Shutdown phase: from the request on /health 503 and new generations 503; the
    /// daemon closes when no generation (HTTP or gRPC) runs.
    pub lifecycle: Arc<Lifecycle>,
    /// Set when the grace period is over and the engine cancels what is left.
    pub draining: Arc<AtomicBool>,
    /// server.http_request_timeout_seconds (None: no limit).
    pub request_timeout: Option<Duration>,
}

/// Identity fields of one response's objects.
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub fingerprint: String,
}

impl HttpState {
    pub fn is_stopping(&self) -> bool {
        self.lifecycle.is_stopping()
    }

    fn meta(&self, prefix: &str) -> ResponseMeta {
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        ResponseMeta {
            id: format!("{prefix}-{:016x}", rand::random::<u64>()),
            created,
            model: self.model_name.clone(),
            fingerprint: format!("civetta-{}-{}", crate::build_info::VERSION, crate::build_info::GIT_SHA),
        }
    }
}

/// Reads a JSON body; a body over the limit is 413, anything unparsable 400.
fn parse_body<T: serde::de::DeserializeOwned>(state: &HttpState, body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let bytes = body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(state.max_body_bytes)
        } else {
            ApiError::invalid(format!("cannot read the request body: {r}"))
        }
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))
}

/// The metrics label of a path: the known routes, or "other" (bounded cardinality).
fn route_label(path: &str) -> &'static str {
    match path {
        chat::ROUTE => chat::ROUTE,
        completions::ROUTE => completions::ROUTE,
        "/v1/models" => "/v1/models",
        p if p.starts_with("/v1/models/") => "/v1/models/{id}",
        "/health" => "/health",
        _ => "other",
    }
}

/// The bearer-token check, before the body is read. /health stays open (probes need no secret).
async fn authorize(State(state): State<Arc<HttpState>>, req: Request, next: Next) -> Response {
    if req.uri().path() != "/health" {
        let header = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        if !state.token.accepts(header) {
            let e = ApiError::unauthorized();
            state.metrics.observe_request(route_label(req.uri().path()), e.grpc_code(), Duration::ZERO);
            return e.into_response();
        }
    }
    next.run(req).await
}

async fn health(State(state): State<Arc<HttpState>>) -> Response {
    if state.is_stopping() {
        return generate::json_response(StatusCode::SERVICE_UNAVAILABLE, &json!({"status": "shutting down"}));
    }
    generate::json_response(StatusCode::OK, &json!({"status": "ok"}))
}

fn model_object(state: &HttpState) -> serde_json::Value {
    json!(openai::ModelObject { id: &state.model_name, object: "model", created: 0, owned_by: "civetta" })
}

async fn list_models(State(state): State<Arc<HttpState>>) -> Response {
    let started = Instant::now();
    let r = generate::json_response(StatusCode::OK, &json!({"object": "list", "data": [model_object(&state)]}));
    state.metrics.observe_request("/v1/models", tonic::Code::Ok, started.elapsed());
    r
}

async fn get_model(State(state): State<Arc<HttpState>>, Path(id): Path<String>) -> Response {
    let started = Instant::now();
    let r = match openai::check_model(Some(&id), &state.model_name) {
        Ok(()) => generate::json_response(StatusCode::OK, &model_object(&state)),
        Err(e) => e.into_response(),
    };
    state.metrics.observe_request("/v1/models/{id}", error::status_code_label(r.status()), started.elapsed());
    r
}

async fn fallback(req: Request) -> Response {
    ApiError::not_found(req.uri().path()).into_response()
}

pub fn router(state: Arc<HttpState>) -> axum::Router {
    axum::Router::new()
        .route(chat::ROUTE, post(chat::handle))
        .route(completions::ROUTE, post(completions::handle))
        .route("/v1/models", get(list_models))
        .route("/v1/models/:id", get(get_model))
        .route("/health", get(health))
        .fallback(fallback)
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(state.clone(), authorize))
        .with_state(state)
}

/// Serves the API until shutdown: after a stop request it keeps answering (503 for new
/// generations) until the daemon closes (no generation running, or `grace` has passed),
/// then closes the listener and lets open connections finish; what is still open
/// `force_after` after the grace period is dropped.
pub async fn serve(listener: tokio::net::TcpListener, state: Arc<HttpState>, grace: Duration, force_after: Duration) {
    let lifecycle = state.lifecycle.clone();
    let drained = async move { lifecycle.closing().await };
    let lifecycle = state.lifecycle.clone();
    let forced = async move {
        lifecycle.stopping().await;
        tokio::time::sleep(grace + force_after).await;
    };
    // TCP_NODELAY: SSE events are small and must not wait for delayed ACKs (Nagle).
    let server = axum::serve(listener, router(state)).tcp_nodelay(true).with_graceful_shutdown(drained);
    tokio::select! {
        r = server => if let Err(e) = r {
            tracing::error!(error = %e, "HTTP API failed");
        },
        _ = forced => tracing::warn!("HTTP connections still open after the grace period; closing them"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_labels_are_bounded() {
        assert_eq!(route_label("/v1/chat/completions"), "/v1/chat/completions");
        assert_eq!(route_label("/v1/models/x"), "/v1/models/{id}");
        assert_eq!(route_label("/etc/passwd"), "other");
    }
}
