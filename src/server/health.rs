//! `grpc.health.v1.Health` (the gRPC health checking protocol) driven by the daemon's
//! [`Lifecycle`], in place of tonic-health's reporter, which answers Watch for an unknown
//! service with a NOT_FOUND error and keeps Watch streams open through shutdown.
//!
//! - Check: SERVING while serving, NOT_SERVING from the shutdown request on, for `""` (the
//!   whole server) and [`super::SERVICE_NAME`]; NOT_FOUND for any other name (the spec).
//! - Watch: the current status, then each change; an unknown name streams SERVICE_UNKNOWN
//!   (the spec: the service may be added later; here it never is). The stream ends with
//!   UNAVAILABLE when the daemon closes, so an open Watch never holds the shutdown.

use super::lifecycle::{Lifecycle, Phase};
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

pub struct HealthService {
    lifecycle: Arc<Lifecycle>,
}

pub fn server(lifecycle: Arc<Lifecycle>) -> HealthServer<HealthService> {
    HealthServer::new(HealthService { lifecycle })
}

fn is_known(service: &str) -> bool {
    service.is_empty() || service == super::SERVICE_NAME
}

fn status_of(phase: Phase) -> ServingStatus {
    match phase {
        Phase::Serving => ServingStatus::Serving,
        Phase::Draining | Phase::Closing => ServingStatus::NotServing,
    }
}

fn response(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse { status: status as i32 }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(&self, request: Request<HealthCheckRequest>) -> Result<Response<HealthCheckResponse>, Status> {
        let service = &request.get_ref().service;
        if !is_known(service) {
            return Err(Status::not_found(format!("unknown service {service:?}")));
        }
        Ok(Response::new(response(status_of(self.lifecycle.phase()))))
    }

    type WatchStream = WatchStream;

    async fn watch(&self, request: Request<HealthCheckRequest>) -> Result<Response<WatchStream>, Status> {
        let known = is_known(&request.get_ref().service);
        let mut phases = self.lifecycle.subscribe();
        let stream = async_stream(move |tx| async move {
            let mut sent = None;
            loop {
                let phase = *phases.borrow_and_update();
                let status = if known { status_of(phase) } else { ServingStatus::ServiceUnknown };
                if sent != Some(status) {
                    if tx.send(Ok(response(status))).await.is_err() {
                        return;
                    }
                    sent = Some(status);
                }
                if phase == Phase::Closing {
                    let _ = tx.send(Err(Status::unavailable("server is shutting down"))).await;
                    return;
                }
                tokio::select! {
                    changed = phases.changed() => if changed.is_err() { return },
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(stream))
    }
}

/// A stream fed by a spawned task through a small channel (the task ends when the client
/// goes away: `tx.closed()`).
fn async_stream<F, Fut>(body: F) -> WatchStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<HealthCheckResponse, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(body(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    fn req(service: &str) -> Request<HealthCheckRequest> {
        Request::new(HealthCheckRequest { service: service.into() })
    }

    #[tokio::test]
    async fn check_and_watch_follow_the_lifecycle() {
        let l = Lifecycle::new();
        let h = HealthService { lifecycle: l.clone() };
        for name in ["", super::super::SERVICE_NAME] {
            assert_eq!(h.check(req(name)).await.unwrap().into_inner().status, ServingStatus::Serving as i32);
        }
        assert_eq!(h.check(req("nope")).await.unwrap_err().code(), tonic::Code::NotFound);
        let mut known = h.watch(req("")).await.unwrap().into_inner();
        let mut unknown = h.watch(req("nope")).await.unwrap().into_inner();
        assert_eq!(known.next().await.unwrap().unwrap().status, ServingStatus::Serving as i32);
        assert_eq!(unknown.next().await.unwrap().unwrap().status, ServingStatus::ServiceUnknown as i32);

        l.drain(std::time::Duration::from_secs(5), async {}).await;
        assert_eq!(h.check(req("")).await.unwrap().into_inner().status, ServingStatus::NotServing as i32);
        // Draining and Closing came at once: the watcher still sees NOT_SERVING, then the end.
        assert_eq!(known.next().await.unwrap().unwrap().status, ServingStatus::NotServing as i32);
        assert_eq!(known.next().await.unwrap().unwrap_err().code(), tonic::Code::Unavailable);
        assert!(known.next().await.is_none());
        assert_eq!(unknown.next().await.unwrap().unwrap_err().code(), tonic::Code::Unavailable);
    }
}
