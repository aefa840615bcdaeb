//! The daemon's shutdown phases, shared by the gRPC service, its health service and the
//! HTTP API.
//!
//! `Serving` -> (SIGTERM) `Draining` -> (no generation left, or the grace period is over)
//! `Closing`. While draining, both transports stay up: health answers NOT_SERVING at once
//! on open and new connections, `/metrics` answers, new generations are refused
//! (UNAVAILABLE / 503) and running ones go on. Only at `Closing` do the transports close
//! their listeners and connections (health Watch streams end then, so an idle daemon does
//! not wait for them).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often a draining daemon checks whether the last generation has finished.
const DRAIN_POLL: Duration = Duration::from_millis(20);

/// How long a daemon stays `Draining` at least, even with nothing running (never beyond the
/// grace period): health Watch streams then put NOT_SERVING on the wire before the transports
/// close. Closing in the same instant left the Watch's last messages racing the connection's
/// close, and a client could see the connection reset instead of NOT_SERVING.
const MIN_DRAIN: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Accepting work; health SERVING.
    Serving,
    /// Shutdown requested: health NOT_SERVING, new generations refused, running ones go on.
    Draining,
    /// Nothing left to wait for: the transports close.
    Closing,
}

/// The current phase and the generations running over either API.
#[derive(Debug)]
pub struct Lifecycle {
    phase: watch::Sender<Phase>,
    generating: AtomicUsize,
}

/// A running generation; dropping it lets a draining daemon close.
#[derive(Debug)]
pub struct GenerationGuard(Arc<Lifecycle>);

impl Drop for GenerationGuard {
    fn drop(&mut self) {
        self.0.generating.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Lifecycle {
    pub fn new() -> Arc<Lifecycle> {
        Arc::new(Lifecycle { phase: watch::Sender::new(Phase::Serving), generating: AtomicUsize::new(0) })
    }

    pub fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    /// True from the shutdown request on.
    pub fn is_stopping(&self) -> bool {
        self.phase() != Phase::Serving
    }

    pub fn subscribe(&self) -> watch::Receiver<Phase> {
        self.phase.subscribe()
    }

    /// Registers a new generation, or None once shutdown has begun. Counting first and
    /// reading the phase second means the drain cannot miss a generation that got in.
    pub fn begin_generation(self: &Arc<Self>) -> Option<GenerationGuard> {
        self.generating.fetch_add(1, Ordering::SeqCst);
        let guard = GenerationGuard(self.clone());
        (!self.is_stopping()).then_some(guard)
    }

    pub fn generating(&self) -> usize {
        self.generating.load(Ordering::SeqCst)
    }

    /// Moves forward only (a later phase is never undone).
    fn advance(&self, to: Phase) {
        self.phase.send_if_modified(|p| {
            let forward = to > *p;
            if forward {
                *p = to;
            }
            forward
        });
    }

    /// Completes once the phase is `Closing` (the transports' shutdown signal).
    pub async fn closing(&self) {
        let mut rx = self.subscribe();
        let _ = rx.wait_for(|p| *p == Phase::Closing).await;
    }

    /// Completes once shutdown has begun.
    pub async fn stopping(&self) {
        let mut rx = self.subscribe();
        let _ = rx.wait_for(|p| *p != Phase::Serving).await;
    }

    /// The shutdown sequence: `Draining` now; `Closing` as soon as no generation runs (and
    /// `MIN_DRAIN` has passed), or when `grace` is over, after `at_grace_end` has run (it
    /// cancels what is left).
    pub async fn drain(&self, grace: Duration, at_grace_end: impl std::future::Future<Output = ()>) {
        self.advance(Phase::Draining);
        let start = tokio::time::Instant::now();
        let end = start + grace;
        while self.generating() > 0 {
            if tokio::time::Instant::now() >= end {
                at_grace_end.await;
                break;
            }
            tokio::time::sleep(DRAIN_POLL).await;
        }
        tokio::time::sleep_until(start + MIN_DRAIN.min(grace)).await;
        self.advance(Phase::Closing);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn closes_at_once_when_idle_and_refuses_new_generations() {
        let l = Lifecycle::new();
        let t0 = tokio::time::Instant::now();
        l.drain(Duration::from_secs(30), async { panic!("no grace end when idle") }).await;
        assert_eq!(l.phase(), Phase::Closing);
        assert!(t0.elapsed() < Duration::from_secs(1));
        assert!(l.begin_generation().is_none());
        assert_eq!(l.generating(), 0);
    }

    /// A watcher of an idle daemon's phase sees `Draining` before `Closing` (the health Watch
    /// sends NOT_SERVING then, before the transports close).
    #[tokio::test]
    async fn an_idle_drain_lets_watchers_see_draining_before_closing() {
        let l = Lifecycle::new();
        let mut rx = l.subscribe();
        let draining = {
            let l = l.clone();
            tokio::spawn(async move { l.drain(Duration::from_secs(30), async {}).await })
        };
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow_and_update(), Phase::Draining);
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow_and_update(), Phase::Closing);
        draining.await.unwrap();
        // No longer than the grace period, however short.
        let l = Lifecycle::new();
        let t0 = tokio::time::Instant::now();
        l.drain(Duration::ZERO, async {}).await;
        assert_eq!(l.phase(), Phase::Closing);
        assert!(t0.elapsed() < MIN_DRAIN, "{:?}", t0.elapsed());
    }

    #[tokio::test]
    async fn waits_for_running_generations_then_for_the_grace_period() {
        let l = Lifecycle::new();
        let g = l.begin_generation().unwrap();
        let draining = {
            let l = l.clone();
            tokio::spawn(async move { l.drain(Duration::from_secs(30), async {}).await })
        };
        l.stopping().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(l.phase(), Phase::Draining);
        drop(g);
        draining.await.unwrap();
        assert_eq!(l.phase(), Phase::Closing);

        // A generation that never ends: the grace period closes anyway, after the callback.
        let l = Lifecycle::new();
        let _g = l.begin_generation().unwrap();
        let called = std::sync::atomic::AtomicBool::new(false);
        l.drain(Duration::from_millis(50), async { called.store(true, Ordering::SeqCst) }).await;
        assert!(called.load(Ordering::SeqCst));
        assert_eq!(l.phase(), Phase::Closing);
    }
}
