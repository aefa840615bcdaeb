//! Statuses the transport gives before any handler runs, made conventional and counted.
//!
//! tonic answers an undecodable message (invalid UTF-8 in a string field included) with
//! INTERNAL and a message over `server.max_message_bytes` with OUT_OF_RANGE; the gRPC
//! conventions are INVALID_ARGUMENT (the client sent bad data) and RESOURCE_EXHAUSTED (a
//! size limit). Those answers, and the interceptor's UNAUTHENTICATED, also never reached
//! the handlers that count `civetta_requests_total`. This service wraps the Inference
//! service (outside the auth interceptor), rewrites those codes and counts every response
//! whose request did not reach a handler.

use super::metrics::Metrics;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tonic::codegen::{http, BoxFuture, Service};
use tonic::server::NamedService;
use tonic::{Code, Status};

/// Put into each request's extensions; a handler sets it (`mark_reached`) when it runs and
/// counts the request itself.
#[derive(Clone, Default)]
pub struct HandlerReached(Arc<AtomicBool>);

/// Called at the top of each handler.
pub fn mark_reached<T>(req: &tonic::Request<T>) {
    if let Some(r) = req.extensions().get::<HandlerReached>() {
        r.0.store(true, Ordering::SeqCst);
    }
}

#[derive(Clone)]
pub struct TransportStatus<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S> TransportStatus<S> {
    pub fn new(inner: S, metrics: Arc<Metrics>) -> Self {
        TransportStatus { inner, metrics }
    }
}

impl<S: NamedService> NamedService for TransportStatus<S> {
    const NAME: &'static str = S::NAME;
}

/// The conventional code for a status the transport gave before the handler.
pub fn conventional(code: Code, message: &str) -> Code {
    match code {
        Code::Internal if message.starts_with("failed to decode Protobuf message") => Code::InvalidArgument,
        Code::OutOfRange if message.contains("message length too large") => Code::ResourceExhausted,
        c => c,
    }
}

impl<S, B> Service<http::Request<B>> for TransportStatus<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::BoxBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let started = Instant::now();
        let rpc = req.uri().path().rsplit('/').next().unwrap_or("").to_string();
        let reached = HandlerReached::default();
        req.extensions_mut().insert(reached.clone());
        // The usual tower dance: the clone that was made ready serves this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let mut resp = inner.call(req).await?;
            if reached.0.load(Ordering::SeqCst) {
                return Ok(resp);
            }
            // Trailers-only answers carry the status in the headers.
            if let Some(status) = Status::from_header_map(resp.headers()) {
                let code = conventional(status.code(), status.message());
                if code != status.code() {
                    let fixed = Status::new(code, status.message().to_string());
                    let _ = fixed.add_header(resp.headers_mut());
                }
                metrics.observe_request(&rpc, code, started.elapsed());
            }
            Ok(resp)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_codes_become_conventional() {
        assert_eq!(
            conventional(Code::Internal, "failed to decode Protobuf message: invalid string value: data is not UTF-8 encoded"),
            Code::InvalidArgument
        );
        assert_eq!(
            conventional(Code::OutOfRange, "Error, decoded message length too large: found 70005 bytes, the limit is: 65536 bytes"),
            Code::ResourceExhausted
        );
        assert_eq!(conventional(Code::Unauthenticated, "missing token"), Code::Unauthenticated);
        assert_eq!(conventional(Code::Internal, "generation failed"), Code::Internal);
    }
}
