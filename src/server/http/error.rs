//! Errors of the HTTP API in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`,
//! with the HTTP status clients branch on (the `openai` package maps 400/401/404/413/429/503
//! to its exception classes and honours `Retry-After` on 429).

use crate::engine::SubmitError;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tonic::Code;

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: "invalid_request_error", "rate_limit_error", "server_error".
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
    /// Queue-full retry hint.
    pub retry_after_ms: Option<u64>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Detail<'a>,
}

#[derive(Serialize)]
pub(super) struct Detail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), kind, param: None, code: None, retry_after_ms: None }
    }

    /// 400: the request is malformed or asks for something unsupported.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the offending field.
    pub fn invalid_param(param: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param), ..ApiError::invalid(message) }
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "missing or wrong bearer token (send `Authorization: Bearer <token>`)",
            )
        }
    }

    pub fn model_not_found(requested: &str, served: &str) -> ApiError {
        ApiError {
            param: Some("model"),
            code: Some("model_not_found"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("the model \"{requested}\" does not exist (this server serves \"{served}\")"),
            )
        }
    }

    pub fn not_found(path: &str) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", format!("no such endpoint: {path}"))
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            code: Some("request_too_large"),
            ..ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("request body is larger than {limit} bytes (server.max_message_bytes)"),
            )
        }
    }

    pub fn draining() -> ApiError {
        ApiError {
            code: Some("shutting_down"),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "server is shutting down; retry on another instance")
        }
    }

    /// 504: the generation ran past its time limit and was cancelled (gRPC's
    /// DEADLINE_EXCEEDED; google.rpc maps it to 504).
    pub fn timeout(limit: std::time::Duration) -> ApiError {
        ApiError {
            code: Some("deadline_exceeded"),
            ..ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "timeout_error",
                format!("the generation ran past its time limit of {:.3} s and was cancelled", limit.as_secs_f64()),
            )
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The equivalent gRPC code, for `civetta_requests_total{code}` (one label vocabulary
    /// for both APIs, so the alert rules cover HTTP too).
    pub fn grpc_code(&self) -> Code {
        status_code_label(self.status)
    }

    /// The JSON body, also sent as an SSE `data:` event when a stream fails midway.
    pub fn body_json(&self) -> String {
        let body = Body { error: Detail { message: &self.message, kind: self.kind, param: self.param, code: self.code } };
        serde_json::to_string(&body).expect("error body serializes")
    }
}

/// Maps an HTTP status to the gRPC code of the same meaning (google.rpc's mapping).
pub fn status_code_label(status: StatusCode) -> Code {
    match status.as_u16() {
        200..=299 => Code::Ok,
        400 | 413 | 422 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        429 => Code::ResourceExhausted,
        499 => Code::Cancelled,
        503 => Code::Unavailable,
        504 => Code::DeadlineExceeded,
        _ => Code::Internal,
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> ApiError {
        match e {
            // OpenAI's parameter names have no "sampling." prefix.
            SubmitError::Invalid(e) => ApiError::invalid_param(e.field().trim_start_matches("sampling."), e.to_string()),
            SubmitError::QueueFull { queued, retry_after_ms } => ApiError {
                code: Some("queue_full"),
                retry_after_ms: Some(retry_after_ms),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    format!("server overloaded: {queued} requests queued; retry after {retry_after_ms} ms"),
                )
            },
            SubmitError::ShuttingDown => ApiError::draining(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], self.body_json()).into_response();
        if let Some(ms) = self.retry_after_ms {
            // Retry-After is whole seconds (RFC 9110); the `openai` clients also read the
            // finer `retry-after-ms`.
            let h = r.headers_mut();
            h.insert(header::RETRY_AFTER, HeaderValue::from(ms.div_ceil(1000).max(1)));
            h.insert("retry-after-ms", HeaderValue::from(ms));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn submit_errors_map_to_openai_statuses() {
        let e = ApiError::from(SubmitError::QueueFull { queued: 2, retry_after_ms: 1200 });
        assert_eq!((e.status, e.grpc_code()), (StatusCode::TOO_MANY_REQUESTS, Code::ResourceExhausted));
        let r = e.into_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
        assert_eq!(r.headers()["retry-after-ms"], "1200");
        assert_eq!(ApiError::from(SubmitError::Invalid(crate::engine::InvalidRequest::EmptyPrompt)).status, StatusCode::BAD_REQUEST);
        assert_eq!(ApiError::from(SubmitError::ShuttingDown).status, StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn body_has_openai_shape() {
        let v: serde_json::Value = serde_json::from_str(&ApiError::model_not_found("gpt-4", "m").body_json()).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(v["error"]["code"], "model_not_found");
        assert!(v["error"]["message"].as_str().unwrap().contains("gpt-4"));
        let v: serde_json::Value = serde_json::from_str(&ApiError::invalid("bad").body_json()).unwrap();
        assert!(v["error"]["param"].is_null() && v["error"]["code"].is_null());
    }
}
