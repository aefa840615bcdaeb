//! Tokenization and chat-template rendering off the async workers.
//!
//! The gRPC runtime has two worker threads; a Generate with a 4 MB prompt tokenized inside
//! its handler once blocked health checks and every other stream for 25 s. Jobs run on
//! tokio's blocking pool instead, at most `jobs` at a time so that a burst of large
//! prompts cannot take every core or the memory of hundreds of blocking threads.
//!
//! When all slots are busy a request waits for one up to `wait` (jobs are short: a prompt
//! longer than the context is refused after at most a context's worth of tokens), then is
//! refused with RESOURCE_EXHAUSTED and a retry hint, like a full engine queue.

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tonic::Status;

/// How long a request may wait for a tokenization slot.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(2);

/// Why a job did not run to completion.
#[derive(Debug)]
pub enum PoolError {
    /// Every slot stayed busy for the whole wait.
    Busy { retry_after_ms: u64 },
    /// The job panicked.
    Failed(String),
}

#[derive(Clone)]
pub struct TokenizePool {
    slots: Arc<Semaphore>,
    jobs: usize,
    wait: Duration,
}

impl TokenizePool {
    pub fn new(jobs: usize, wait: Duration) -> TokenizePool {
        let jobs = jobs.max(1);
        TokenizePool { slots: Arc::new(Semaphore::new(jobs)), jobs, wait }
    }

    /// One job per core, at most four (the engine thread needs the cores too).
    pub fn default_jobs() -> usize {
        std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 4)
    }

    pub fn jobs(&self) -> usize {
        self.jobs
    }

    /// Runs `job` on the blocking pool once a slot is free.
    pub async fn run<T: Send + 'static>(&self, job: impl FnOnce() -> T + Send + 'static) -> Result<T, PoolError> {
        let permit = match tokio::time::timeout(self.wait, self.slots.clone().acquire_owned()).await {
            Ok(Ok(p)) => p,
            // The semaphore is never closed; a timeout means every slot stayed busy.
            _ => return Err(PoolError::Busy { retry_after_ms: self.wait.as_millis() as u64 }),
        };
        tokio::task::spawn_blocking(move || {
            // Held until the job ends, even when the caller has gone away.
            let _permit = permit;
            job()
        })
        .await
        .map_err(|e| PoolError::Failed(e.to_string()))
    }
}

impl PoolError {
    pub fn status(self) -> Status {
        match self {
            PoolError::Busy { retry_after_ms } => {
                super::convert::busy_status(&format!("all tokenizer slots are busy; retry after {retry_after_ms} ms"), retry_after_ms)
            }
            PoolError::Failed(e) => Status::internal(format!("tokenizer failed: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(flavor = "current_thread")]
    async fn jobs_run_off_the_runtime_and_at_most_n_at_once() {
        let pool = TokenizePool::new(2, Duration::from_secs(10));
        let running = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let mut handles = Vec::new();
        for _ in 0..6 {
            let (pool, running, peak) = (pool.clone(), running.clone(), peak.clone());
            handles.push(tokio::spawn(async move {
                pool.run(move || {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(50));
                    running.fetch_sub(1, Ordering::SeqCst);
                })
                .await
            }));
        }
        // A current-thread runtime stays responsive: the jobs block other threads.
        let t = std::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(t.elapsed() < Duration::from_millis(40), "the runtime was blocked for {:?}", t.elapsed());
        for h in handles {
            h.await.unwrap().unwrap();
        }
        assert_eq!(peak.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_full_pool_answers_resource_exhausted_after_the_wait() {
        let pool = TokenizePool::new(1, Duration::from_millis(50));
        let busy = pool.clone();
        let long = tokio::spawn(async move { busy.run(|| std::thread::sleep(Duration::from_millis(400))).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let err = pool.run(|| ()).await.unwrap_err();
        let status = err.status();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(status.metadata().get(super::super::convert::RETRY_AFTER_MS).unwrap(), "50");
        long.await.unwrap().unwrap();
        assert!(pool.run(|| 7).await.is_ok_and(|v| v == 7));
    }
}
