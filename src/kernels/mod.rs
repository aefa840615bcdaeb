//! Static resource report of compiled GPU kernels (`kernels/*.hip` built by `make kernels`).
//!
//! - [`codeobj`]: reads AMDGPU code objects (ELF `NT_AMDGPU_METADATA`, msgpack) into
//!   [`KernelResources`], plus `scratch_` instruction counts from the ISA beside them.
//! - [`occupancy`]: waves per SIMD with LLVM's gfx11 rules (VGPRs, LDS, workgroups).
//! - [`report`]: tables per build and side-by-side comparisons of two compilers.
//! - [`gate`]: the CI check that no kernel spills or uses scratch unless allow-listed.
//! - [`cli`]: `civetta kernels report|gate`.
//!
//! docs/KERNELS.md describes the kernels and the measured tables.

pub mod cli;
pub mod codeobj;
pub mod gate;
pub mod occupancy;
pub mod report;

pub use codeobj::{read_code_object, read_code_object_file, KernelResources};
pub use occupancy::{waves_per_simd, OccupancyLimit, OccupancyReport};
