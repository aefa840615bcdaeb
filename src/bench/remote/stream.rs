//! One benchmark stream as the client saw it, whatever the protocol: when the request went
//! out, when tokens arrived and how many each delivery carried, and the server's usage.
//!
//! Latencies are defined on deliveries (a gRPC message, an SSE chunk), because that is what a
//! client observes:
//! - TTFT: from sending the request to the first delivery that carries a generated token.
//! - Inter-token latency: the gap between one delivery and the previous one, shared evenly by
//!   the tokens the later delivery carries (k tokens arriving together after a gap g give k
//!   samples of g/k). The samples of a stream then sum to its decode time, so their mean is the
//!   time per output token. On gRPC every token is its own message (k = 1); over HTTP civetta
//!   holds back tokens whose text is incomplete (a UTF-8 character split over tokens) and sends
//!   them with the next chunk, so k can be more than 1 there.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

/// What every benchmark stream asks for: greedy, seeded, never stopping early on EOS.
#[derive(Debug, Clone)]
pub struct StreamRequest {
    pub prompt: String,
    pub max_tokens: usize,
}

/// Tokens that reached the client together.
#[derive(Debug, Clone, Copy)]
pub struct Delivery {
    pub at: Instant,
    pub tokens: usize,
}

#[derive(Debug, Clone)]
pub struct StreamRecord {
    pub sent: Instant,
    pub deliveries: Vec<Delivery>,
    /// The server's usage (gRPC `GenerateDone.usage`, HTTP `stream_options.include_usage`).
    pub prompt_tokens: Option<usize>,
    pub completion_tokens: Option<usize>,
    pub error: Option<String>,
    /// Stopped by the benchmark before its end (the mixed scenario's streams).
    pub cancelled: bool,
}

impl StreamRecord {
    pub fn new(sent: Instant) -> StreamRecord {
        StreamRecord { sent, deliveries: Vec::new(), prompt_tokens: None, completion_tokens: None, error: None, cancelled: false }
    }

    pub fn failed(sent: Instant, error: String) -> StreamRecord {
        StreamRecord { error: Some(error), ..StreamRecord::new(sent) }
    }

    /// Tokens counted on the deliveries.
    pub fn delivered_tokens(&self) -> usize {
        self.deliveries.iter().map(|d| d.tokens).sum()
    }

    /// The server's count when it reported one (a cancelled stream has none), else the tokens
    /// counted on the deliveries.
    pub fn generated_tokens(&self) -> usize {
        self.completion_tokens.unwrap_or_else(|| self.delivered_tokens())
    }

    pub fn ttft(&self) -> Option<f64> {
        self.deliveries.first().map(|d| (d.at - self.sent).as_secs_f64())
    }

    pub fn first_token_at(&self) -> Option<Instant> {
        self.deliveries.first().map(|d| d.at)
    }

    /// Inter-token latency samples with the time of the delivery they belong to (see the
    /// module comment for the definition).
    pub fn itl_samples(&self) -> Vec<(Instant, f64)> {
        let mut out = Vec::new();
        for w in self.deliveries.windows(2) {
            let gap = (w[1].at - w[0].at).as_secs_f64() / w[1].tokens.max(1) as f64;
            out.extend(std::iter::repeat_n((w[1].at, gap), w[1].tokens.max(1)));
        }
        out
    }
}

/// The benchmark's handle on a running stream: how many tokens it has delivered so far, and a
/// way to stop it early (dropping the stream cancels the sequence on the server).
#[derive(Clone, Default)]
pub struct StreamControl {
    pub delivered: Arc<AtomicUsize>,
    stop: Option<watch::Receiver<bool>>,
}

impl StreamControl {
    pub fn stoppable(stop: watch::Receiver<bool>) -> StreamControl {
        StreamControl { delivered: Arc::default(), stop: Some(stop) }
    }

    pub fn delivered(&self) -> usize {
        self.delivered.load(Ordering::Acquire)
    }

    pub(super) fn record(&self, record: &mut StreamRecord, d: Delivery) {
        record.deliveries.push(d);
        self.delivered.fetch_add(d.tokens, Ordering::AcqRel);
    }

    /// Resolves once the benchmark asks this stream to stop; never for a plain stream.
    pub(super) async fn stopped(&mut self) {
        match &mut self.stop {
            Some(rx) => {
                while !*rx.borrow_and_update() {
                    if rx.changed().await.is_err() {
                        // The sender is gone without asking: never stop.
                        std::future::pending::<()>().await;
                    }
                }
            }
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn samples_share_a_gap_among_the_tokens_delivered_together() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut r = StreamRecord::new(t0);
        for (at, tokens) in [(100, 1), (110, 1), (140, 3), (150, 1)] {
            r.deliveries.push(Delivery { at: ms(at), tokens });
        }
        assert_eq!(r.ttft(), Some(0.1));
        let s: Vec<f64> = r.itl_samples().iter().map(|x| (x.1 * 1e3 * 1e6).round() / 1e6).collect();
        assert_eq!(s, [10.0, 10.0, 10.0, 10.0, 10.0]);
        // The samples sum to the decode time; their count is tokens after the first delivery.
        assert_eq!(r.delivered_tokens(), 6);
        assert_eq!(r.generated_tokens(), 6);
        r.completion_tokens = Some(7);
        assert_eq!(r.generated_tokens(), 7);
    }
}
