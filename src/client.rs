//! Connecting to a running daemon as a gRPC client (`civetta bench --remote`, the examples).
//!
//! A refused connection is the common case for a newcomer (the daemon is not started yet), so it
//! becomes one line that says what to do instead of tonic's nested "transport error: tcp
//! connect error: ..." chain.

use crate::proto::inference_client::InferenceClient;
use tonic::transport::{Channel, Endpoint};

/// The daemon could not be reached at `addr`.
#[derive(Debug, thiserror::Error)]
#[error("no daemon at {addr}: start it with `make run` (or `civetta serve`)")]
pub struct NoDaemon {
    pub addr: String,
}

/// `http://` is added when `addr` has no scheme ("127.0.0.1:50051").
pub fn endpoint_uri(addr: &str) -> String {
    if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    }
}

/// Opens a channel to the daemon; an unreachable daemon is [`NoDaemon`], an unparsable address
/// a one-line error naming it.
pub async fn connect(addr: &str) -> anyhow::Result<InferenceClient<Channel>> {
    let uri = endpoint_uri(addr);
    let endpoint = Endpoint::from_shared(uri.clone()).map_err(|e| anyhow::anyhow!("invalid daemon address {addr:?}: {e}"))?;
    let channel = endpoint.connect().await.map_err(|_| NoDaemon { addr: uri })?;
    Ok(InferenceClient::new(channel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheme_is_added_once() {
        assert_eq!(endpoint_uri("127.0.0.1:50051"), "http://127.0.0.1:50051");
        assert_eq!(endpoint_uri("http://[::1]:1"), "http://[::1]:1");
    }

    #[tokio::test]
    async fn refused_connection_is_one_line() {
        // A port that was just bound and released: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let err = connect(&format!("127.0.0.1:{port}")).await.unwrap_err();
        let text = format!("{err:#}");
        assert_eq!(text, format!("no daemon at http://127.0.0.1:{port}: start it with `make run` (or `civetta serve`)"));
        assert!(err.downcast_ref::<NoDaemon>().is_some());
    }
}
