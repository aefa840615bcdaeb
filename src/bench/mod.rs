//! Reproducible benchmarks: `civetta bench` (pp/tg like llama-bench, a per-kernel profile,
//! bit-exact completion hashes, the environment fingerprint) and `civetta compare`.
//!
//! The JSON report (`BenchReport`, schema in docs/BENCH.md) is the unit of exchange: two
//! reports from two builds or machines are compared with `civetta compare base.json new.json`.

pub mod cli;
pub mod compare;
mod local;
mod remote;
pub mod report;

pub use report::*;

pub(crate) fn local_now() -> String {
    local::now_rfc3339()
}
