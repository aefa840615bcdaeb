//! civetta: an inference daemon for AMD Strix Halo (gfx1151) hosts.
//!
//! Module map (docs/ARCHITECTURE.md has the data path):
//! - `gguf`: GGUF reader/writer; `quant`: tensor block formats, dequantisation and dot products
//! - `tokenizer`: BPE/SentencePiece tokenizers and chat templates from GGUF metadata
//! - `kernel_registry`: the per-kernel timing hook every op goes through
//! - `backend`: the Backend trait and the CPU backend; `model`: the transformer forward pass
//! - `engine`: sequences, KV caches, sampling, the scheduler
//! - `server`: gRPC service, Prometheus endpoint, config; `synth`: deterministic test models
//! - `kernels`: static resource report of compiled GPU code objects
//! - `envinfo`: the environment fingerprint; `bench`: benchmarks and comparisons

pub mod backend;
pub mod bench;
pub mod client;
pub mod config;
pub mod engine;
pub mod envinfo;
pub mod gguf;
pub mod kernel_registry;
pub mod kernels;
pub mod model;
pub mod quant;
pub mod repro;
pub mod server;
pub mod synth;
pub mod tokenizer;

/// Generated gRPC types and services for `civetta.v1`.
pub mod proto {
    #![allow(clippy::all)]
    tonic::include_proto!("civetta.v1");
    /// Encoded file descriptor set, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("civetta_descriptor");
}

/// Version and provenance of this build.
pub mod build_info {
    pub const VERSION: &str = env!("CARGO_PKG_VERSION");
    pub const GIT_SHA: &str = env!("CIVETTA_GIT_SHA");
    pub const RUSTC: &str = env!("CIVETTA_RUSTC_VERSION");
}
