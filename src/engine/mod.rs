//! The engine: owns the model and runs sequences (queue, bounded active set, KV caches, sampling).
//!
//! Public API used by the gRPC server, `civetta generate` and `civetta bench`:
//! [`Engine::load`], [`Engine::submit`] -> [`GenerationStream`] of [`GenerationEvent`]s.
//! Dropping a stream cancels its sequence within one decode step.

mod api;
mod prompt_limit;
pub mod sampler;
mod scheduler;

pub use api::*;
pub use scheduler::Engine;
