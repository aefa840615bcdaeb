//! The GPU backend shared by HIP and CUDA: weight formats, kernel choice, launches, timing.
//!
//! Written once against [`api::GpuApi`]; `cuda.rs` and `hip.rs` only wrap their runtime.
//! The kernels are the sources in `kernels/`, built per compiler into a kernel folder
//! (`make kernels` for AMD code objects, `make kernels-ptx` for NVIDIA PTX).
//!
//! GpuWeight formats on the device (chosen at load, see `prepare_weight`):
//! - Q8_0: the raw blocks (decode mat-vec) and the same data split into an int8 plane and an
//!   f16 scale plane (the W8A8 GEMM of prefill).
//! - Q5_0: the raw blocks (decode mat-vec) and, like Q8_0, an int8 plane (q - 16, exact) and
//!   an f16 scale plane for the W8A8 GEMM (`repack.rs`): no f16 copy.
//! - MXFP4 (gpt-oss experts): only the int8 and f16 scale planes (the doubled E2M1 levels and
//!   2^(e - 128), exact: `repack.rs`), so the Q8_0 planes' mat-vec and GEMM run it.
//! - Q4_K, Q6_K, Q5_1: the raw blocks (decode mat-vec) and an f16 copy (the f16 GEMM of prefill).
//! - every other 2-D type: an f16 copy (f16 GEMM for both).
//! - 1-D tensors (norms, biases): f32.
//!
//! Activations are f32; the KV cache is f16 like llama.cpp's. Per-launch timing uses event
//! pairs on sampled launches, resolved when the host next waits for the stream (reading the
//! logits), so the hot path gains no synchronisation.

pub mod api;
#[cfg(feature = "cuda")]
pub mod cuda;
mod decode_batch;
mod device_tables;
pub mod graph;
#[cfg(feature = "hip")]
pub mod hip;
pub mod image_choice;
mod moe;
mod overlap;
mod prefill_batch;
mod repack;

use super::{AttentionShape, Backend, Error, HostBuffer, KvBlocks, Result, ResultExt, RopeScaling, RopeStyle, Unpin, Weight, WeightOf};
use crate::gguf::{GgmlType, GgufFile};
use crate::kernel_registry::{self, shape_class};
use crate::model::HParams;
use crate::quant;
use anyhow::{bail, Context};
use api::{DevicePtr, EventHandle, FunctionHandle, GpuApi, GraphHandle};
use graph::{Decision, GraphCache, GraphEntry, LaunchOp, Op, TimedClock, TimedGraph};
use parking_lot::Mutex;
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Options of the GPU backends (config section `[engine.gpu]`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct GpuOptions {
    /// Device index.
    pub device: usize,
    /// Folder with the compiled kernels for the device's arch (one image per kernels/*.hip).
    /// Empty: the newest `build/kernels/<compiler>/<arch>` that exists.
    pub kernel_dir: PathBuf,
    /// Load the `.sb` (sched_barrier) build of the GEMM kernels where the folder has one.
    pub sched_barrier: bool,
    /// Decode batches (one row per sequence) run the KV store and the attention of all
    /// sequences in one launch each per layer (`decode_batch.rs`) instead of two launches per
    /// sequence. On by default since its H200 run (2026-12-05, docs/GPU.md "Batched decode":
    /// batch vs alone within the parity tolerance on 5 models, 16 streams 2.7x faster).
    pub batched_attention: bool,
    /// Steps of several sequences that prefill (prompts, chunks, with or without decode rows
    /// beside them) store and attend for all of them in up to three launches per layer
    /// (`prefill_batch.rs`) instead of two per sequence, with the same bits. Needs
    /// `batched_attention`. For comparisons and as a way out.
    pub batched_prefill_attention: bool,
    /// Decode batches of up to this many rows use the dp4a mat-vecs (the 8- and 16-row builds
    /// above 4 rows), larger ones the GEMM tiles; 0 means `DEFAULT_MATVEC_MAX_ROWS` (16, since
    /// the H100 run of 2026-12-05), at most `DP4A_MAX_ROWS` (32).
    pub matvec_max_rows: usize,
    /// GEMM tile of prefill matmuls: "" (auto: 64x64, `GemmTile::Auto`), "64x64" or "128x128"
    /// for every GEMM. For measuring the tile choice.
    pub gemm_tile: String,
    /// Prefill attention kernel: "" / "auto" (the flash-attention kernel on the matrix step,
    /// `attn_prefill_mma_d*`, for head sizes 64 and 128; the scalar kernel for 256) or
    /// "scalar" (`attn_prefill_d*` for every head size). For comparisons and as a way out.
    pub prefill_attention: String,
    /// Where weights live: "device" (copied to GPU memory) or "host" (the HIP backend maps
    /// the host copy; unified memory on Strix Halo). CUDA supports "device" only.
    pub weights: String,
    /// Queue every launch on its own instead of capturing repeated steps (decode) into
    /// device graphs and replaying them (`graph.rs`). For comparisons and as a way out.
    pub eager: bool,
    /// Decode mat-vec kernels: "dp4a" (the default, also ""): int8 activations and 4-way
    /// int8 dot products (kernels/matvec_dp4a.hip), lanes per row chosen per shape;
    /// "dp4a-g16" / "dp4a-g32" / "dp4a-g64" / "dp4a-g128": the same with that many lanes per row;
    /// "wave": f32 activations, a wave per row (kernels/matvec.hip). For comparisons.
    pub matvec: String,
    /// Run mixture-of-experts models (qwen3moe, qwen2moe) on the GPU (`moe.rs`). On by default
    /// since gpu_check passed them on an H100 (2026-12-05, docs/GPU.md "Mixture of experts":
    /// forced-routing errors within the dense tolerance, every primary routing flip a near tie);
    /// false refuses such models at load (the CPU backend runs them).
    pub moe: bool,
    /// Batched decode (`MMA_MIN_ROWS` rows and more, on the dp4a path) runs the Q8_0 / Q5_0 and
    /// Q4_K mat-vecs on the matrix units (kernels/matvec_mma.hip: 16 weight rows x 16 activation
    /// rows per matrix step) instead of the 4-, 8- and 16-row dp4a builds. On by default since
    /// the H100 run of 2026-12-06 (docs/GPU.md, "Batched decode on the matrix units"): gpu_check
    /// within tolerance on 12 models, a 16-sequence decode step 7.58 -> 3.90 ms (Q8_0).
    pub matvec_mma: bool,
    /// Matrix-unit mat-vecs of matrices with fewer 16-row tiles than the device has compute
    /// units (`GpuApi::compute_units`; the 1.4B model's q/k/v, o and down projections on an
    /// H100) run the 16-wave builds (`matvec_mma_*_w16`): one workgroup per unit is all those
    /// launches have, and twice the waves keep twice the weight loads in flight. False: always
    /// the 8-wave builds. For comparisons.
    pub matvec_mma_wide: bool,
    /// MoE decode (passes of up to 16 rows) routes on the device: the top-k, the expert
    /// mat-vecs over device-side expert ids and the weighted sum, with no host round trip
    /// (`moe.rs`, `Backend::routed_experts`). False keeps the host routing of every pass (the
    /// router logits downloaded, launches per chosen expert). For comparisons and as a way out.
    pub moe_device_routing: bool,
    /// Q4_K matrices keep an f16 copy for the prefill GEMM (`gemm_f16_*`), as before session 13.
    /// Off by default: the prefill GEMM reads the raw blocks (`gemm_q4k_*`, kernels/gemm_f16.hip),
    /// dequantising each K stage to the same f16 values on its way to shared memory, so the
    /// result is the same bit for bit (gpu_check compares the two) and a Q4_K matrix takes 0.56
    /// bytes per weight on the device instead of 2.56: what lets a 48-layer Qwen3-30B-A3B-shaped
    /// Q4_K model (17 GB of blocks, ~60 GB of expert copies) onto an 80 GB card.
    pub q4k_f16_copies: bool,
    /// Kernels that wait for their predecessor themselves (`cv_wait_prior_kernels`: the decode
    /// path's RMSNorm, mat-vecs, RoPE, attention and quantiser) start while it finishes, their
    /// first weight loads hiding behind its tail (CUDA's programmatic dependent launch, sm_90+;
    /// `overlap.rs`). The same arithmetic either way. False launches every kernel after the
    /// previous one has finished. For comparisons and as a way out; no effect on HIP.
    pub overlap_launches: bool,
    /// Timed graph replays read the device's steady clock with a one-thread stamp kernel
    /// between launches (kernels/timestamp.hip) instead of recording an event node there
    /// (`graph::TimedClock`). Where the runtime gives no clock rate fine enough
    /// (`GpuApi::steady_clock_hz`), events are used. On an H100 a replay timed by stamps cost
    /// +12% over a plain one, by events +74% (docs/GPU.md, session 19). False: always events.
    pub timing_stamps: bool,
    /// Most bytes of freed buffers (KV caches of finished sequences, scratch) the backend keeps
    /// for reuse between steps; beyond it the largest go back to the driver. Kept buffers let
    /// the next request of a similar size reuse the last one's addresses and graphs; on Strix
    /// Halo's unified memory what they hold is the host's memory too. Default 2 GiB.
    pub pool_free_bytes: u64,
}

impl Default for GpuOptions {
    fn default() -> GpuOptions {
        GpuOptions {
            device: 0,
            kernel_dir: PathBuf::new(),
            sched_barrier: false,
            batched_attention: true,
            batched_prefill_attention: true,
            matvec_max_rows: 0,
            gemm_tile: String::new(),
            prefill_attention: String::new(),
            weights: String::new(),
            eager: false,
            matvec: String::new(),
            moe: true,
            matvec_mma: true,
            matvec_mma_wide: true,
            moe_device_routing: true,
            q4k_f16_copies: false,
            overlap_launches: true,
            timing_stamps: true,
            pool_free_bytes: DEFAULT_POOL_FREE_BYTES,
        }
    }
}

/// `GpuOptions::pool_free_bytes` by default.
pub const DEFAULT_POOL_FREE_BYTES: u64 = 2 << 30;

/// The gated activation `quantize_q8_1` applies to (x, up) (its `act` argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GatedAct {
    /// silu(x) * up (SwiGLU).
    Silu = 0,
    /// gpt-oss's swiglu_oai(x, up).
    SwiGluOai = 1,
}

/// The GEMM tile of prefill matmuls (`GpuOptions::gemm_tile`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GemmTile {
    /// 64x64 for every shape: with the staged GEMM kernels (K stages of 128 bytes, register
    /// prefetch) 64x64 measured faster than or equal to 128x128 at 512 and 2048 rows on an
    /// H100 (docs/GPU.md, "Issue #17, session 8"); its 4x more workgroups fill the SMs at pp512.
    Auto,
    T64,
    T128,
}

impl GemmTile {
    fn parse(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "" | "auto" => Self::Auto,
            "64x64" => Self::T64,
            "128x128" => Self::T128,
            other => bail!("engine.gpu.gemm_tile = \"{other}\": expected auto, 64x64 or 128x128"),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::T64 => "64x64",
            Self::T128 => "128x128",
        }
    }
}

/// Which decode mat-vec kernels run (`GpuOptions::matvec`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MatvecFamily {
    /// kernels/matvec.hip: f32 activations, one wave per row.
    Wave,
    /// kernels/matvec_dp4a.hip: int8 activations; `lanes` per row, or chosen per shape.
    Dp4a { lanes: Option<usize> },
}

impl MatvecFamily {
    fn parse(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "" | "dp4a" => Self::Dp4a { lanes: None },
            "dp4a-g16" => Self::Dp4a { lanes: Some(16) },
            "dp4a-g32" => Self::Dp4a { lanes: Some(32) },
            "dp4a-g64" => Self::Dp4a { lanes: Some(64) },
            "dp4a-g128" => Self::Dp4a { lanes: Some(128) },
            "wave" => Self::Wave,
            other => bail!("engine.gpu.matvec = \"{other}\": expected dp4a, dp4a-g16, dp4a-g32, dp4a-g64, dp4a-g128 or wave"),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Wave => "wave",
            Self::Dp4a { lanes: None } => "dp4a",
            Self::Dp4a { lanes: Some(16) } => "dp4a-g16",
            Self::Dp4a { lanes: Some(32) } => "dp4a-g32",
            Self::Dp4a { lanes: Some(64) } => "dp4a-g64",
            Self::Dp4a { lanes: Some(_) } => "dp4a-g128",
        }
    }
}

/// The q8_1 copy of a buffer that the launch just queued wrote beside it (`rmsnorm_q8_1`, a
/// decode attention with `out_q`), for the dp4a mat-vec that reads the buffer next. Any other
/// launch or copy drops it first, so it is never used once the buffer could have changed.
struct FreshQ8 {
    /// The f32 buffer and its length in values.
    x: DevicePtr,
    len: usize,
    q: DevBuf,
    ds: GpuBuffer,
}

/// How a weight runs in a decode mat-vec: the kernel layout and its device pointers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MatvecKind {
    /// kernels/matvec.hip on raw blocks (f32 activations).
    Q8_0Blocks,
    Q4KBlocks,
    Q6KBlocks,
    /// kernels/matvec_dp4a.hip on the int8 + f16 scale planes (Q8_0, Q5_0).
    Q8Planes,
    /// kernels/matvec_dp4a.hip on raw Q4_K blocks.
    Q4KDp4a,
}

#[derive(Clone, Copy)]
struct MatvecWeight {
    kind: MatvecKind,
    /// Raw blocks, or the int8 plane.
    w: DevicePtr,
    /// The f16 scale plane (Q8Planes), else 0.
    s: DevicePtr,
}

/// Lanes per row of a dp4a mat-vec with `units` 16-byte weight loads per row: the fewest that
/// give each lane at most `DP4A_UNROLL` loads (all in flight at once), else a whole workgroup.
fn matvec_lanes(units: usize) -> usize {
    [32, 64].into_iter().find(|g| units.div_ceil(*g) <= DP4A_UNROLL).unwrap_or(128)
}

/// kernels/matvec_dp4a.hip's units per lane and round (U) of the 32- and 64-lane builds, which
/// `matvec_lanes` fills in one round; the 128-lane Q8_0 builds take 6.
const DP4A_UNROLL: usize = 4;

/// Activation rows per launch of a dp4a build (`_x4`, `_x8`, `_x16`) for a mat-vec over
/// `rows` rows; more than 16 rows take ceil(rows / 16) grid rows of the `_x16` build.
fn dp4a_rows_per_launch(rows: usize) -> usize {
    match rows {
        0 | 1 => 1,
        2..=4 => 4,
        5..=8 => 8,
        _ => 16,
    }
}

/// The dp4a kernel for a layout, lanes per row and activation rows per launch (1, 4, 8, 16;
/// `dp4a_rows_per_launch`). The 8- and 16-row builds exist for 32, 64 and 128 lanes only.
fn dp4a_kernel(kind: MatvecKind, lanes: usize, per_launch: usize) -> &'static str {
    const Q8P: [[&str; 4]; 4] = [
        ["matvec_q8p_g16", "matvec_q8p_g16_x4", "matvec_q8p_g32_x8", "matvec_q8p_g32_x16"],
        ["matvec_q8p_g32", "matvec_q8p_g32_x4", "matvec_q8p_g32_x8", "matvec_q8p_g32_x16"],
        ["matvec_q8p_g64", "matvec_q8p_g64_x4", "matvec_q8p_g64_x8", "matvec_q8p_g64_x16"],
        ["matvec_q8p_g128", "matvec_q8p_g128_x4", "matvec_q8p_g128_x8", "matvec_q8p_g128_x16"],
    ];
    const Q4K: [[&str; 4]; 4] = [
        ["matvec_q4k_g16", "matvec_q4k_g16_x4", "matvec_q4k_g32_x8", "matvec_q4k_g32_x16"],
        ["matvec_q4k_g32", "matvec_q4k_g32_x4", "matvec_q4k_g32_x8", "matvec_q4k_g32_x16"],
        ["matvec_q4k_g64", "matvec_q4k_g64_x4", "matvec_q4k_g64_x8", "matvec_q4k_g64_x16"],
        ["matvec_q4k_g128", "matvec_q4k_g128_x4", "matvec_q4k_g128_x8", "matvec_q4k_g128_x16"],
    ];
    let g = match lanes {
        16 => 0,
        32 => 1,
        64 => 2,
        _ => 3,
    };
    let r = match per_launch {
        1 => 0,
        4 => 1,
        8 => 2,
        _ => 3,
    };
    if kind == MatvecKind::Q8Planes {
        Q8P[g][r]
    } else {
        Q4K[g][r]
    }
}

/// Fewest activation rows of a mat-vec that `GpuOptions::matvec_mma` moves to the matrix
/// units. A launch of the matrix-step kernel costs the same for 2 and for 16 rows (one 16x16
/// tile), while the dp4a `_x4` build's cost grows with its rows: on the H100 (matvec_bench,
/// 2026-12-06) dp4a was faster at 2 rows on every 1.4B Q8_0 matrix, even at 3, and the matrix
/// units faster or equal from 4 rows (Q4_K: faster at 4 on every matrix).
const MMA_MIN_ROWS: usize = 4;

/// kernels/matvec_mma.hip: output rows and activation rows per workgroup.
const MMA_TILE: usize = 16;

/// The matrix-unit mat-vec of a dp4a layout (kernels/matvec_mma.hip), if it has one: the
/// 16-wave build (`wide`) or the 8-wave one.
fn mma_kernel_name(kind: MatvecKind, wide: bool) -> Option<&'static str> {
    match (kind, wide) {
        (MatvecKind::Q8Planes, false) => Some("matvec_mma_q8p"),
        (MatvecKind::Q8Planes, true) => Some("matvec_mma_q8p_w16"),
        (MatvecKind::Q4KDp4a, false) => Some("matvec_mma_q4k"),
        (MatvecKind::Q4KDp4a, true) => Some("matvec_mma_q4k_w16"),
        _ => None,
    }
}

/// Whether a matrix-unit mat-vec of `tiles` workgroups (per 16 activation rows) takes the
/// 16-wave build: when the launch leaves compute units without a workgroup (`GpuOptions::matvec_mma_wide`).
fn mma_wide(tiles: usize, compute_units: Option<usize>) -> bool {
    compute_units.is_some_and(|cu| tiles < cu)
}

/// Decode batches up to this many rows use the `wave` mat-vec kernels (kernels/matvec.hip,
/// `matvec_*` for one row, `matvec_*_x4` for 2-4); larger ones the GEMMs.
const MATVEC_MAX_ROWS: usize = 4;

/// Batched decode (one row per sequence) can use the dp4a mat-vecs up to this many rows
/// (`dp4a_rows_per_launch`, `GpuOptions::matvec_max_rows`); larger batches are prefill-like
/// and take the GEMMs.
const DP4A_MAX_ROWS: usize = 32;

/// `GpuOptions::matvec_max_rows` when not set: the dp4a builds up to 16 rows, the staged 64x64
/// GEMM above. H100, 1.4B Q8_0 (2026-12-05, docs/GPU.md "Issue #17, session 8"): 8 rows 4.55 ms per step
/// on the mat-vecs vs 7.41 on the GEMM, 16 rows 8.05 vs 8.41, 32 rows 14.11 vs 10.69.
const DEFAULT_MATVEC_MAX_ROWS: usize = 16;

/// The kernel images (one per kernels/*.hip) and the functions each exports, with the
/// block size each is launched with.
const KERNEL_FILES: &[(&str, &[(&str, u32)])] = &[
    (
        "attention",
        &[
            ("attn_prefill_d64", 128),
            ("attn_prefill_d128", 128),
            ("attn_prefill_d256", 256),
            ("attn_prefill_mma_d64", 128),
            ("attn_prefill_mma_d128", 128),
            ("attn_decode_d64", 128),
            ("attn_decode_d128", 128),
            ("attn_decode_d256", 128),
            ("attn_decode_pos_d64", 128),
            ("attn_decode_pos_d128", 128),
            ("attn_decode_pos_d256", 128),
            ("attn_decode_batch_d64", 128),
            ("attn_decode_batch_d128", 128),
            ("attn_decode_batch_d256", 128),
            ("attn_prefill_batch_d64", 128),
            ("attn_prefill_batch_d128", 128),
            ("attn_prefill_batch_d256", 256),
            ("attn_prefill_batch_mma_d64", 128),
            ("attn_prefill_batch_mma_d128", 128),
            ("attn_decode_rows_d64", 128),
            ("attn_decode_rows_d128", 128),
            ("attn_decode_rows_d256", 128),
        ],
    ),
    ("gemma", &[("gelu_tanh_mul", 256), ("scale", 256)]),
    ("gpt_oss", &[("swiglu_oai", 256)]),
    ("matvec_q5", &[("matvec_q5_0", 128), ("matvec_q5_1", 128)]),
    ("elementwise", &[("silu_mul", 256), ("add", 256), ("add_bias", 256), ("f32_to_f16", 256)]),
    (
        "gemm_f16",
        &[
            ("gemm_f16_64x64", 128),
            ("gemm_f16_128x128", 256),
            ("moe_gemm_f16_64x64", 128),
            ("gemm_q4k_64x64", 128),
            ("gemm_q4k_128x128", 256),
            ("moe_gemm_q4k_64x64", 128),
        ],
    ),
    ("gemm_w8a8", &[("gemm_w8a8_64x64", 128), ("gemm_w8a8_128x128", 256)]),
    ("kv_cache", &[("kv_store_f16", 256), ("kv_store_prefill_batch_f16", 256)]),
    (
        "matvec",
        &[
            ("matvec_q8_0", 128),
            ("matvec_q4_k", 128),
            ("matvec_q6_k", 128),
            ("matvec_q8_0_x4", 128),
            ("matvec_q4_k_x4", 128),
            ("matvec_q6_k_x4", 128),
        ],
    ),
    (
        "matvec_dp4a",
        &[
            ("matvec_q8p_g16", 128),
            ("matvec_q8p_g16_x4", 128),
            ("matvec_q8p_g32", 128),
            ("matvec_q8p_g64", 128),
            ("matvec_q8p_g128", 128),
            ("matvec_q8p_g32_x4", 128),
            ("matvec_q8p_g64_x4", 128),
            ("matvec_q8p_g128_x4", 128),
            ("matvec_q4k_g16", 128),
            ("matvec_q4k_g16_x4", 128),
            ("matvec_q4k_g32", 128),
            ("matvec_q4k_g64", 128),
            ("matvec_q4k_g128", 128),
            ("matvec_q4k_g32_x4", 128),
            ("matvec_q4k_g64_x4", 128),
            ("matvec_q4k_g128_x4", 128),
            ("matvec_q8p_g32_x8", 128),
            ("matvec_q8p_g64_x8", 128),
            ("matvec_q8p_g128_x8", 128),
            ("matvec_q8p_g32_x16", 128),
            ("matvec_q8p_g64_x16", 128),
            ("matvec_q8p_g128_x16", 128),
            ("matvec_q4k_g32_x8", 128),
            ("matvec_q4k_g64_x8", 128),
            ("matvec_q4k_g128_x8", 128),
            ("matvec_q4k_g32_x16", 128),
            ("matvec_q4k_g64_x16", 128),
            ("matvec_q4k_g128_x16", 128),
        ],
    ),
    ("matvec_mma", &[("matvec_mma_q8p", 256), ("matvec_mma_q4k", 256), ("matvec_mma_q8p_w16", 512), ("matvec_mma_q4k_w16", 512)]),
    (
        "moe",
        &[
            ("moe_router_f32", 256),
            ("moe_gather_rows", 256),
            ("moe_scatter_rows", 256),
            ("moe_weighted_sum", 256),
            ("moe_scale_rows", 256),
            ("moe_topk", 32),
        ],
    ),
    (
        "moe_matvec",
        &[
            ("moe_matvec_q8p_g32", 128),
            ("moe_matvec_q8p_g64", 128),
            ("moe_matvec_q8p_g128", 128),
            ("moe_matvec_q4k_g32", 128),
            ("moe_matvec_q4k_g64", 128),
            ("moe_matvec_q4k_g128", 128),
        ],
    ),
    ("norm", &[("rmsnorm", 256), ("rmsnorm_q8_1", 1024)]),
    ("quantize", &[("quantize_act_q8", 256), ("quantize_q8_1", 256)]),
    ("rope", &[("rope_norm", 256), ("rope_neox", 256), ("rope_qk_norm", 256), ("rope_qk_neox", 256)]),
    ("timestamp", &[("time_stamp", 32)]),
];

#[derive(Clone, Copy)]
struct Kernel {
    f: FunctionHandle,
    threads: u32,
    /// Launched to overlap the previous kernel's tail (`overlap.rs`; `engine.gpu.overlap_launches`).
    overlap: bool,
}

/// Device buffers that went out of use, by size class, reused by later allocations.
/// Reuse is safe without waiting: all work is ordered on the one stream.
struct Pool {
    free: Mutex<HashMap<usize, Vec<DevicePtr>>>,
    /// Most bytes kept free in the pool between steps (`GpuOptions::pool_free_bytes`).
    max_free_bytes: usize,
    release: Box<dyn Fn(DevicePtr) + Send + Sync>,
    unmap: Box<dyn Fn(u64) + Send + Sync>,
}

impl Pool {
    /// A free buffer of `class` bytes: the lowest free address. Taking the lowest instead of
    /// the last one freed makes the addresses a step gets depend only on which buffers are
    /// free, not on the order earlier steps freed them in: where a request's prefill, or two
    /// buffers of one class freed in allocation order, left them in another order, the last
    /// freed first would hand the next steps a permutation of the same buffers, and each
    /// permutation is a new tape (a new graph).
    fn take(&self, class: usize) -> Option<DevicePtr> {
        let mut free = self.free.lock();
        let v = free.get_mut(&class)?;
        let lowest = (0..v.len()).min_by_key(|&i| v[i])?;
        Some(v.swap_remove(lowest))
    }

    /// Takes free buffers out of the pool until it holds at most `max_free_bytes`, the largest
    /// first (the KV caches of long requests; the small scratch buffers every step reuses stay)
    /// and, within a class, the highest address first (`take` hands out the lowest). The caller
    /// gives them back to the driver once no queued work can use them.
    fn over_limit(&self) -> Vec<DevicePtr> {
        let mut free = self.free.lock();
        let mut held: usize = free.iter().map(|(class, v)| class * v.len()).sum();
        let mut out = Vec::new();
        if held <= self.max_free_bytes {
            return out; // every step: no sorting unless something goes
        }
        let mut classes: Vec<usize> = free.keys().copied().collect();
        classes.sort_unstable_by(|a, b| b.cmp(a));
        for class in classes {
            if held <= self.max_free_bytes {
                break;
            }
            let v = free.get_mut(&class).expect("a class just listed");
            v.sort_unstable();
            while held > self.max_free_bytes {
                let Some(p) = v.pop() else { break };
                held -= class;
                out.push(p);
            }
        }
        out
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for (_, ptrs) in self.free.get_mut().drain() {
            for p in ptrs {
                (self.release)(p);
            }
        }
    }
}

/// An owned range of device memory; pooled buffers return to the pool on drop. `host` is
/// the host address of a mapped tensor (0 for device memory).
struct DevBuf {
    ptr: DevicePtr,
    class: usize,
    pooled: bool,
    host: u64,
    pool: Arc<Pool>,
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if self.host != 0 {
            (self.pool.unmap)(self.host);
        } else if self.pooled {
            self.pool.free.lock().entry(self.class).or_default().push(self.ptr);
        } else {
            (self.pool.release)(self.ptr);
        }
    }
}

/// Element type of a `GpuBuffer` on the GPU.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Elem {
    F32,
    F16,
}

/// A buffer of the GPU backends: f32 activations, or an f16 K or V cache.
pub struct GpuBuffer {
    mem: DevBuf,
    elem: Elem,
}

enum WeightData {
    /// 1-D tensors: f32.
    Vector(DevBuf),
    /// Q8_0 and Q5_0: raw blocks + int8 and f16 scale planes (W8A8 GEMM).
    Q8_0 {
        blocks: DevBuf,
        qs: DevBuf,
        scales: DevBuf,
    },
    /// MXFP4: int8 and f16 scale planes only (the layout of `Q8_0`'s planes).
    Int8Planes {
        qs: DevBuf,
        scales: DevBuf,
    },
    /// Q4_K, Q6_K, Q5_1: raw blocks + an f16 copy (none for Q4_K unless
    /// `GpuOptions::q4k_f16_copies`: the `gemm_q4k_*` kernels read the blocks).
    KQuant {
        blocks: DevBuf,
        f16: Option<DevBuf>,
    },
    F16(DevBuf),
    /// A 3-D expert tensor: nothing on the device; `weight_rows` prepares each expert (moe.rs).
    Unsliced,
}

/// A weight tensor on the device, in the layout `prepare_weight` chose (and where in the
/// mapped file it came from: embedding rows and expert slices are read there).
pub struct DeviceWeight {
    file: Arc<GgufFile>,
    index: usize,
    layout: WeightData,
}

/// A weight of the GPU backends.
pub type GpuWeight = Weight<DeviceWeight>;

/// Kernel arguments: each value in its own 8-byte slot, passed by address.
#[derive(Default)]
struct Args {
    slots: Vec<u64>,
}

impl Args {
    fn ptr(mut self, p: DevicePtr) -> Self {
        self.slots.push(p);
        self
    }
    fn i32(mut self, v: usize) -> Self {
        self.slots.push(i32::try_from(v).expect("kernel argument exceeds i32") as u32 as u64);
        self
    }
    fn f32(mut self, v: f32) -> Self {
        self.slots.push(v.to_bits() as u64);
        self
    }
}

/// Timings queued on the stream, read once it is idle (`resolve_timings`).
enum PendingTiming {
    /// One launch between two events.
    Events {
        kernel: &'static str,
        shape: &'static str,
        start: EventHandle,
        end: EventHandle,
        /// The events belong to a timed graph (not returned to the spare list).
        graph_owned: bool,
    },
    /// A timed graph replay's clock stamps (`graph::TimedClock::Stamps`).
    Stamps { buf: DevicePtr, hz: u64, slots: usize, launches: Arc<[(usize, &'static str, &'static str)]> },
}

impl PendingTiming {
    /// Its clock readings belong to a timed graph: the graph must not run timed again before
    /// they are read.
    fn graph_owned(&self) -> bool {
        match self {
            PendingTiming::Events { graph_owned, .. } => *graph_owned,
            PendingTiming::Stamps { .. } => true,
        }
    }
}

/// Work of the current step not yet queued (graph.rs).
#[derive(Default)]
struct Tape {
    ops: Vec<Op>,
    /// A recorded launch reads the positions buffer (its contents must not change under it).
    reads_positions: bool,
}

/// The rows' positions on the device, at an address that stays the same from step to step
/// (RoPE, the KV store and decode attention read them there, so decode graphs repeat).
struct Positions {
    values: Vec<u32>,
    buf: DevBuf,
    capacity: usize,
}

/// Kernels that read the positions buffer.
fn reads_positions(kernel: &str) -> bool {
    kernel.starts_with("rope_")
        || kernel == "kv_store_f16"
        || kernel.starts_with("attn_decode_pos")
        || kernel.starts_with("attn_decode_batch")
}

/// A head size's prefill attention kernels (`GpuBackend::prefill_kernels`): one sequence's
/// (`attention_dev`) and the batched build of the same body (`prefill_batch.rs`), and the queries
/// each workgroup takes.
struct PrefillKernels {
    solo: &'static str,
    batch: &'static str,
    queries_per_group: usize,
}

pub struct GpuBackend<A: GpuApi> {
    api: Arc<A>,
    kernels: HashMap<&'static str, Kernel>,
    /// Kernel images by file stem, kept for resource queries.
    images: HashMap<&'static str, Vec<u8>>,
    kernel_dir: PathBuf,
    compiler: String,
    variant: &'static str,
    weights_placement: String,
    /// Raw weight blocks stay in the mapped file (`map_host`) instead of being copied.
    host_weights: bool,
    pool: Arc<Pool>,
    pending: Mutex<Vec<PendingTiming>>,
    spare_events: Mutex<Vec<EventHandle>>,
    registered: Mutex<HashSet<(&'static str, &'static str)>>,
    /// Positions last uploaded (the same for every layer of a step).
    positions: Mutex<Option<Positions>>,
    /// Attention sinks and router biases on the device, by their f32 bits (`host_vector_on_device`).
    host_vectors: Mutex<HashMap<Vec<u32>, DevBuf>>,
    /// Capture repeated steps into graphs (`GpuOptions::eager` off).
    use_graphs: bool,
    /// Decode mat-vec kernels (`GpuOptions::matvec`).
    matvec_family: MatvecFamily,
    /// Mixture-of-experts models are accepted (`GpuOptions::moe`).
    moe: bool,
    /// Set by `rmsnorm` (decode, dp4a), taken by the next mat-vec, dropped by any other launch.
    fresh_q8: Mutex<Option<FreshQ8>>,
    /// `GpuOptions::batched_attention`.
    batched_attention: bool,
    /// `GpuOptions::batched_prefill_attention` (and `batched_attention`).
    batched_prefill_attention: bool,
    /// Most rows of a dp4a mat-vec (`GpuOptions::matvec_max_rows`, 1..=DP4A_MAX_ROWS).
    dp4a_max_rows: usize,
    /// `GpuOptions::matvec_mma`.
    matvec_mma: bool,
    /// The device's compute units where `GpuOptions::matvec_mma_wide` is on (`mma_wide`).
    mma_wide_below: Option<usize>,
    /// `GpuOptions::moe_device_routing`.
    moe_device_routing: bool,
    /// `GpuOptions::q4k_f16_copies`.
    q4k_f16_copies: bool,
    /// `GpuOptions::gemm_tile`.
    gemm_tile: GemmTile,
    /// `GpuOptions::prefill_attention`: the matrix-step kernel where the head size has one.
    prefill_attention_mma: bool,
    /// Device tables of cache pointers and batch descriptors for batched attention (`device_tables.rs`).
    device_tables: Mutex<device_tables::DeviceTables>,
    tape: Mutex<Tape>,
    graphs: Mutex<GraphCache>,
    /// Set when events recorded inside a graph could not be read: replays are then untimed.
    graph_timing_broken: std::sync::atomic::AtomicBool,
    /// Ticks per second of the clock the stamp kernel reads, when timed graphs use stamps.
    stamp_clock_hz: Option<u64>,
}

/// The folder `build/kernels/<compiler>/<arch>` with the newest compiler tag, if any.
pub fn default_kernel_dir(root: &Path, arch: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> =
        std::fs::read_dir(root.join("build/kernels")).ok()?.flatten().map(|e| e.path().join(arch)).filter(|p| p.is_dir()).collect();
    found.sort_by_key(|p| version_key(p));
    found.pop()
}

/// Sort key of ".../clang-22.1.8/<arch>": the numeric version parts.
fn version_key(p: &Path) -> Vec<u32> {
    let tag = p.parent().and_then(|d| d.file_name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    tag.split(|c: char| !c.is_ascii_digit()).filter_map(|s| s.parse().ok()).collect()
}

/// The bytes a KV cache of `bytes` is given: rounded up to one of eight sizes per octave
/// (at most 12.5% more; multiples of 256 below 4 KiB). A sequence's caches are sized for
/// its prompt + max_tokens, so with exact sizes nearly every request would get buffers no
/// earlier request had, and with them a decode tape of its own: an eager first step, a
/// graph capture (~1 ms on an H100) and, with kernel timing on, its timed twin (~2 ms).
fn kv_size_class(bytes: usize) -> usize {
    if bytes <= 4096 {
        return bytes.max(1).next_multiple_of(256);
    }
    let octave = usize::BITS - 1 - bytes.leading_zeros(); // 2^octave <= bytes
    bytes.next_multiple_of(1 << (octave - 3))
}

/// The kernel images (`<name>.<ext>` in the kernel folder) the backend loads, one per
/// kernels/*.hip file it launches from.
pub fn kernel_image_names() -> impl Iterator<Item = &'static str> {
    KERNEL_FILES.iter().map(|(file, _)| *file)
}

impl<A: GpuApi> GpuBackend<A> {
    pub fn new(api: A, opts: &GpuOptions) -> anyhow::Result<Self> {
        let api = Arc::new(api);
        let arch = api.arch();
        let kernel_dir = if opts.kernel_dir.as_os_str().is_empty() {
            default_kernel_dir(Path::new("."), &arch).with_context(|| {
                format!(
                    "{} backend: no kernels for {arch} under build/kernels (build them with `{}`, or set engine.gpu.kernel_dir)",
                    api.backend_name(),
                    if api.kernel_extension() == "ptx" {
                        format!("make kernels-ptx CUDA_ARCH={arch}")
                    } else {
                        format!("make kernels GFX={arch}")
                    }
                )
            })?
        } else {
            opts.kernel_dir.clone()
        };
        let compiler = std::fs::read_to_string(kernel_dir.join("compiler.txt"))
            .or_else(|_| std::fs::read_to_string(kernel_dir.parent().unwrap_or(&kernel_dir).join("compiler.txt")))
            .map(|s| s.lines().next().unwrap_or("").trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        let (release_api, unmap_api) = (api.clone(), api.clone());
        let pool = Arc::new(Pool {
            free: Mutex::new(HashMap::new()),
            max_free_bytes: usize::try_from(opts.pool_free_bytes).unwrap_or(usize::MAX),
            release: Box::new(move |p| release_api.free(p)),
            unmap: Box::new(move |h| unmap_api.unmap_host(h as *const u8)),
        });
        let host_weights = match opts.weights.as_str() {
            "" | "device" => false,
            "host" => true,
            other => bail!("engine.gpu.weights = \"{other}\": expected \"device\" or \"host\""),
        };
        let matvec_family = MatvecFamily::parse(&opts.matvec)?;
        let gemm_tile = GemmTile::parse(&opts.gemm_tile)?;
        let prefill_attention_mma = match opts.prefill_attention.as_str() {
            "" | "auto" => true,
            "scalar" => false,
            other => bail!("engine.gpu.prefill_attention = \"{other}\": expected auto or scalar"),
        };
        let mut kernels = HashMap::new();
        let mut images = HashMap::new();
        let mut variant = "default";
        for &(file, functions) in KERNEL_FILES {
            let ext = api.kernel_extension();
            let mut path = kernel_dir.join(format!("{file}.{ext}"));
            if file.starts_with("gemm_") {
                let names: Vec<String> = functions.iter().map(|(name, _)| format!("civetta_{name}")).collect();
                let choice = image_choice::choose_image(&kernel_dir, file, ext, &names, opts.sched_barrier);
                tracing::debug!(file, sched_barrier = choice.sched_barrier, reason = %choice.reason, "GEMM kernel build");
                if choice.sched_barrier {
                    variant = "sb";
                }
                path = choice.path;
            }
            let mut image =
                std::fs::read(&path).with_context(|| format!("{} backend: reading kernel image {}", api.backend_name(), path.display()))?;
            if ext == "ptx" {
                image.push(0); // the driver takes PTX as a C string
            }
            let module = api.load_module(&image).with_context(|| format!("loading {}", path.display()))?;
            let ptx = if ext == "ptx" { std::str::from_utf8(&image).ok() } else { None };
            for &(name, threads) in functions {
                let symbol = format!("civetta_{name}");
                let f = api.function(module, &symbol).with_context(|| format!("{}: kernel {symbol}", path.display()))?;
                let overlap = opts.overlap_launches && ptx.is_some_and(|p| overlap::ptx_entry_waits_for_prior_kernels(p, &symbol));
                kernels.insert(name, Kernel { f, threads, overlap });
            }
            images.insert(file, image);
        }
        // (The stamp kernel is loaded: a kernel folder without timestamp's image fails above.)
        let stamp_clock_hz = if opts.timing_stamps { api.steady_clock_hz() } else { None };
        let mma_wide_below = if opts.matvec_mma_wide { api.compute_units() } else { None };
        tracing::info!(
            backend = api.backend_name(),
            device = %api.device_name(),
            arch = %arch,
            kernels = %kernel_dir.display(),
            compiler = %compiler,
            "GPU backend ready"
        );
        Ok(GpuBackend {
            api,
            kernels,
            images,
            kernel_dir,
            compiler,
            variant,
            weights_placement: if host_weights { "host".into() } else { "device".into() },
            host_weights,
            pool,
            pending: Mutex::new(Vec::new()),
            spare_events: Mutex::new(Vec::new()),
            registered: Mutex::new(HashSet::new()),
            positions: Mutex::new(None),
            host_vectors: Mutex::new(HashMap::new()),
            use_graphs: !opts.eager,
            matvec_family,
            moe: opts.moe,
            fresh_q8: Mutex::new(None),
            batched_attention: opts.batched_attention,
            batched_prefill_attention: opts.batched_attention && opts.batched_prefill_attention,
            gemm_tile,
            prefill_attention_mma,
            dp4a_max_rows: if opts.matvec_max_rows == 0 { DEFAULT_MATVEC_MAX_ROWS } else { opts.matvec_max_rows.min(DP4A_MAX_ROWS) },
            matvec_mma: opts.matvec_mma,
            mma_wide_below,
            moe_device_routing: opts.moe_device_routing,
            q4k_f16_copies: opts.q4k_f16_copies,
            device_tables: Mutex::new(device_tables::DeviceTables::default()),
            tape: Mutex::new(Tape::default()),
            graphs: Mutex::new(GraphCache::default()),
            graph_timing_broken: std::sync::atomic::AtomicBool::new(false),
            stamp_clock_hz,
        })
    }

    pub fn device_name(&self) -> String {
        self.api.device_name()
    }

    pub fn kernel_dir(&self) -> &Path {
        &self.kernel_dir
    }

    /// "cuda" or "hip", for errors.
    fn be(&self) -> &'static str {
        self.api.backend_name()
    }

    fn raw_alloc(&self, bytes: usize) -> Result<DevBuf> {
        let ptr = self.device_alloc(bytes.max(1))?;
        Ok(DevBuf { ptr, class: bytes, pooled: false, host: 0, pool: self.pool.clone() })
    }

    /// The raw blocks of a tensor: mapped in place with `weights = "host"`, else copied.
    fn raw_weight(&self, bytes: &[u8]) -> Result<DevBuf> {
        if !self.host_weights {
            return self.upload_new(bytes);
        }
        let ptr = self.api.map_host(bytes)?;
        Ok(DevBuf { ptr, class: bytes.len(), pooled: false, host: bytes.as_ptr() as u64, pool: self.pool.clone() })
    }

    /// A KV cache of at least `bytes`, pooled under its size class (`kv_size_class`): the
    /// next sequence of a similar size (prompt + max_tokens within about 12%) gets the same
    /// addresses, so the decode graphs captured for the last one replay for it instead of
    /// being captured again (a step's tape holds its caches' addresses). Where the device is
    /// out of memory, the pool's free buffers are given back to the driver first.
    fn kv_alloc(&self, bytes: usize) -> Result<DevBuf> {
        // The lowest free address (`Pool::take`) matters here too: a sequence's caches are
        // dropped in another order than they are allocated in (all K layers, then all V).
        self.pooled_of_class(kv_size_class(bytes))
    }

    /// Device memory from the driver; where it is out of memory, once more after the pool's
    /// free buffers went back to it (the KV caches kept for reuse may hold much).
    fn device_alloc(&self, bytes: usize) -> Result<DevicePtr> {
        match self.api.alloc(bytes) {
            Ok(p) => Ok(p),
            Err(first) => {
                if !self.release_free_buffers()? {
                    return Err(first);
                }
                self.api.alloc(bytes)
            }
        }
    }

    /// Gives the pool's free buffers beyond `GpuOptions::pool_free_bytes` back to the driver.
    /// Call only while the stream is idle (after a download or a synchronisation): a buffer
    /// goes back to the pool while kernels queued before may still use it.
    fn trim_pool(&self) {
        let excess = self.pool.over_limit();
        if !excess.is_empty() {
            tracing::debug!(buffers = excess.len(), "GPU pool over engine.gpu.pool_free_bytes: buffers given back");
        }
        for p in excess {
            (self.pool.release)(p);
        }
    }

    /// Gives the pool's free buffers back to the driver (after the stream is idle: a buffer
    /// goes back to the pool while kernels queued before may still use it). False when there
    /// were none.
    fn release_free_buffers(&self) -> Result<bool> {
        let free: Vec<DevicePtr> = self.pool.free.lock().drain().flat_map(|(_, v)| v).collect();
        if free.is_empty() {
            return Ok(false);
        }
        self.flush()?;
        self.api.synchronize()?;
        for p in free {
            (self.pool.release)(p);
        }
        Ok(true)
    }

    /// A pooled buffer of at least `bytes` (power-of-two size classes from 256 bytes).
    fn pooled_alloc(&self, bytes: usize) -> Result<DevBuf> {
        self.pooled_of_class(bytes.max(256).next_power_of_two())
    }

    /// A buffer of exactly `class` bytes from the pool (`Pool::take`), else from the driver;
    /// it goes back to the pool under `class` when dropped.
    fn pooled_of_class(&self, class: usize) -> Result<DevBuf> {
        let ptr = match self.pool.take(class) {
            Some(ptr) => ptr,
            None => self.device_alloc(class)?,
        };
        Ok(DevBuf { ptr, class, pooled: true, host: 0, pool: self.pool.clone() })
    }

    fn upload_new(&self, bytes: &[u8]) -> Result<DevBuf> {
        let b = self.raw_alloc(bytes.len())?;
        self.api.upload(b.ptr, bytes)?;
        Ok(b)
    }

    fn scratch(&self, len: usize, elem: Elem) -> Result<GpuBuffer> {
        let bytes = len * if elem == Elem::F32 { 4 } else { 2 };
        Ok(GpuBuffer { mem: self.pooled_alloc(bytes)?, elem })
    }

    /// Records one kernel launch on the step's tape, or queues it at once without graphs
    /// (timing it with an event pair when the registry samples this call).
    fn launch(&self, name: &'static str, rows: usize, grid: [usize; 3], args: Args) -> Result<()> {
        // This launch may write the normalised buffer: its q8_1 copy would be stale.
        drop(self.fresh_q8.lock().take());
        let k = *self.kernels.get(name).ok_or_else(|| Error::unsupported(self.be(), format!("kernel {name} (not loaded)")))?;
        let shape = shape_class(rows);
        let backend = self.api.backend_name();
        if self.registered.lock().insert((name, shape)) {
            let file = KERNEL_FILES.iter().find(|(_, fs)| fs.iter().any(|(n, _)| *n == name)).map(|(f, _)| *f).unwrap_or("");
            let image = self.images.get(file).map(Vec::as_slice).unwrap_or(&[]);
            if let Some(mut res) = self.api.resources(image, &format!("civetta_{name}"), k.f, k.threads) {
                res.compiler = self.compiler.clone();
                kernel_registry::set_resources(name, shape, backend, self.variant, res);
            }
        }
        let mut dims = [1u32; 3];
        for (d, g) in dims.iter_mut().zip(grid) {
            *d =
                u32::try_from(g.max(1)).map_err(|_| Error::invalid(self.be(), format!("kernel {name}: grid dimension {g} exceeds u32")))?;
        }
        let grid = dims;
        let op = LaunchOp { kernel: name, shape, f: k.f, grid, block: [k.threads, 1, 1], slots: args.slots, overlap: k.overlap };
        if self.use_graphs {
            let mut tape = self.tape.lock();
            tape.reads_positions |= reads_positions(name);
            tape.ops.push(Op::Launch(op));
            Ok(())
        } else {
            self.queue_sampled(&op, false)
        }
    }

    /// Queues one launch, timing it with an event pair when the registry samples this call.
    /// `overlap`: launch it to overlap the previous kernel (`overlap_allowed`), unless timed.
    fn queue_sampled(&self, op: &LaunchOp, overlap: bool) -> Result<()> {
        let timed = kernel_registry::should_sample(op.kernel, op.shape, self.api.backend_name(), self.variant);
        let events = if timed { Some((self.event()?, self.event()?)) } else { None };
        if let Some((start, _)) = events {
            self.api.event_record(start)?;
        }
        // A timed launch runs on its own: an event pair cannot split two overlapping kernels.
        self.queue(op, overlap && !timed)?;
        if let Some((start, end)) = events {
            self.api.event_record(end)?;
            self.pending.lock().push(PendingTiming::Events { kernel: op.kernel, shape: op.shape, start, end, graph_owned: false });
        }
        Ok(())
    }

    /// Queues one launch; `overlap` launches it to overlap the previous kernel's tail.
    fn queue(&self, op: &LaunchOp, overlap: bool) -> Result<()> {
        let mut slots = op.slots.clone();
        let mut params: Vec<*mut c_void> = slots.iter_mut().map(|s| s as *mut u64 as *mut c_void).collect();
        // SAFETY: every call site passes the arguments of the kernel's signature in order,
        // with device pointers of buffers sized for the grid it computes.
        unsafe { self.api.launch(op.f, op.grid, op.block, 0, &mut params, overlap) }
    }

    /// A device-to-device copy: on the tape, or queued at once without graphs.
    fn copy_op(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        drop(self.fresh_q8.lock().take());
        if self.use_graphs {
            self.tape.lock().ops.push(Op::Copy { dst, src, bytes });
            Ok(())
        } else {
            self.api.copy(dst, src, bytes)
        }
    }

    /// Queues the recorded work of the step: replaying its graph, capturing one, or eagerly.
    /// Called before anything else touches the stream (uploads, downloads, waits).
    fn flush(&self) -> Result<()> {
        let ops = {
            let mut tape = self.tape.lock();
            tape.reads_positions = false;
            std::mem::take(&mut tape.ops)
        };
        if ops.is_empty() {
            return Ok(());
        }
        self.run_tape(ops)
    }

    fn run_tape(&self, ops: Vec<Op>) -> Result<()> {
        let hash = graph::tape_hash(&ops);
        let mut graphs = self.graphs.lock();
        match graphs.decide(&ops, hash) {
            Decision::Eager => {
                if ops.len() >= graph::MIN_GRAPH_OPS {
                    tracing::debug!(ops = ops.len(), "GPU tape run eagerly (first sighting)");
                }
                drop(graphs);
                self.queue_eager(&ops)
            }
            Decision::Capture => {
                let t0 = Instant::now();
                match self.capture(&ops, None) {
                    Ok(plain) => {
                        graphs.captures += 1;
                        tracing::debug!(
                            ops = ops.len(),
                            captures = graphs.captures,
                            micros = t0.elapsed().as_micros() as u64,
                            "GPU graph captured"
                        );
                        let calls = graph::launch_counts(&ops);
                        if let Some(old) = graphs.insert(GraphEntry { hash, ops, plain, timed: None, replays: 0, calls }) {
                            self.api.synchronize()?;
                            // Its timed twin's events or stamps may still be waiting to be read.
                            self.resolve_timings();
                            self.destroy_graph(old);
                        }
                        let i = graphs.entries.len() - 1;
                        self.replay(&mut graphs, i)
                    }
                    Err(e) => {
                        tracing::warn!(error = %format!("{e:#}"), "GPU graph capture failed: launching eagerly from now on");
                        graphs.disabled = true;
                        drop(graphs);
                        self.queue_eager(&ops)
                    }
                }
            }
            Decision::Replay(i) => self.replay(&mut graphs, i),
        }
    }

    fn queue_eager(&self, ops: &[Op]) -> Result<()> {
        for (j, op) in ops.iter().enumerate() {
            match op {
                Op::Launch(l) => self.queue_sampled(l, graph::overlap_allowed(ops, j))?,
                Op::Copy { dst, src, bytes } => self.api.copy(*dst, *src, *bytes)?,
            }
        }
        Ok(())
    }

    /// Captures `ops` into a graph; with `clock`, a reading before the first op and one after
    /// every op (`graph::TimedClock`): event nodes, or stamp launches into `buf[j]`.
    fn capture(&self, ops: &[Op], clock: Option<&TimedClock>) -> Result<GraphHandle> {
        self.api.capture_begin()?;
        let queued = (|| -> Result<()> {
            let read_clock = |j: usize| -> Result<()> {
                match clock {
                    None => Ok(()),
                    Some(TimedClock::Events(e)) => self.api.event_record_captured(e[j]),
                    // The stamp overlaps the launch before it like any waiting kernel.
                    Some(TimedClock::Stamps { buf, .. }) => self.queue_stamp(*buf, j, j > 0 && matches!(ops[j - 1], Op::Launch(_))),
                }
            };
            read_clock(0)?;
            for (j, op) in ops.iter().enumerate() {
                let overlap = match clock {
                    None => graph::overlap_allowed(ops, j),
                    // No overlap across an event node: it could not split two overlapping kernels.
                    Some(TimedClock::Events(_)) => false,
                    // After a stamp (a launch): as far as the kernel itself allows.
                    Some(TimedClock::Stamps { .. }) => matches!(op, Op::Launch(l) if l.overlap),
                };
                match op {
                    Op::Launch(l) => self.queue(l, overlap)?,
                    Op::Copy { dst, src, bytes } => self.api.copy(*dst, *src, *bytes)?,
                }
                read_clock(j + 1)?;
            }
            Ok(())
        })();
        let graph = self.api.capture_end();
        match (queued, graph) {
            (Ok(()), graph) => graph,
            (Err(e), Ok(g)) => {
                self.api.graph_destroy(g);
                Err(e)
            }
            (Err(e), Err(_)) => Err(e),
        }
    }

    /// Queues `civetta_time_stamp(buf, slot)` (kernels/timestamp.hip).
    fn queue_stamp(&self, buf: DevicePtr, slot: usize, after_launch: bool) -> Result<()> {
        let k = self.kernels.get("time_stamp").ok_or_else(|| Error::unsupported(self.be(), "kernel time_stamp (not loaded)"))?;
        let op = LaunchOp {
            kernel: "time_stamp",
            shape: "m1",
            f: k.f,
            grid: [1, 1, 1],
            block: [k.threads, 1, 1],
            slots: Args::default().ptr(buf).i32(slot).slots,
            overlap: k.overlap,
        };
        self.queue(&op, after_launch && k.overlap)
    }

    /// The clock of a new timed graph for `ops`: stamps where the device has a steady clock and
    /// `engine.gpu.timing_stamps` is on, else events.
    fn timed_clock(&self, ops: &[Op]) -> Result<TimedClock> {
        if let Some(hz) = self.stamp_clock_hz {
            let launches: Vec<(usize, &'static str, &'static str)> = ops
                .iter()
                .enumerate()
                .filter_map(|(j, op)| if let Op::Launch(l) = op { Some((j, l.kernel, l.shape)) } else { None })
                .collect();
            let buf = self.device_alloc((ops.len() + 1) * 8)?;
            return Ok(TimedClock::Stamps { buf, hz, launches: launches.into() });
        }
        Ok(TimedClock::Events((0..=ops.len()).map(|_| self.api.event_create()).collect::<Result<Vec<_>>>()?))
    }

    /// Queues one run of a captured step. With kernel timing on, every `sample_every`-th
    /// replay runs the entry's timed graph (an event after every op, `graph::TimedGraph`), so
    /// the fraction of launches timed stays the configured rate; every launch is counted.
    fn replay(&self, graphs: &mut GraphCache, i: usize) -> Result<()> {
        let backend = self.api.backend_name();
        let every = kernel_registry::sample_every();
        let timing_ok = !self.graph_timing_broken.load(std::sync::atomic::Ordering::Relaxed);
        let e = &mut graphs.entries[i];
        let timed = timing_ok && graph::replay_is_timed(e.replays, every) && !self.pending.lock().iter().any(PendingTiming::graph_owned);
        e.replays += 1;
        graphs.replays += 1;
        if timed && e.timed.is_none() {
            let t0 = Instant::now();
            let clock = self.timed_clock(&e.ops)?;
            let graph = match self.capture(&e.ops, Some(&clock)) {
                Ok(g) => g,
                Err(err) => {
                    self.destroy_clock(clock);
                    return Err(err);
                }
            };
            let stamps = matches!(clock, TimedClock::Stamps { .. });
            e.timed = Some(TimedGraph { graph, clock });
            tracing::debug!(
                ops = e.ops.len(),
                replays = e.replays,
                stamps,
                micros = t0.elapsed().as_micros() as u64,
                "GPU timed graph captured"
            );
        }
        match (&e.timed, timed) {
            (Some(t), true) => {
                self.api.graph_launch(t.graph)?;
                let mut pending = self.pending.lock();
                match &t.clock {
                    TimedClock::Events(events) => {
                        for (j, op) in e.ops.iter().enumerate() {
                            if let Op::Launch(l) = op {
                                let (start, end) = (events[j], events[j + 1]);
                                pending.push(PendingTiming::Events { kernel: l.kernel, shape: l.shape, start, end, graph_owned: true });
                            }
                        }
                    }
                    TimedClock::Stamps { buf, hz, launches } => {
                        pending.push(PendingTiming::Stamps { buf: *buf, hz: *hz, slots: e.ops.len() + 1, launches: launches.clone() })
                    }
                }
            }
            _ => self.api.graph_launch(e.plain)?,
        }
        if every.is_some() {
            for &(kernel, shape, n) in &e.calls {
                kernel_registry::record_calls(kernel, shape, backend, self.variant, n);
            }
        }
        Ok(())
    }

    fn destroy_graph(&self, e: GraphEntry) {
        self.api.graph_destroy(e.plain);
        if let Some(t) = e.timed {
            self.api.graph_destroy(t.graph);
            self.destroy_clock(t.clock);
        }
    }

    fn destroy_clock(&self, clock: TimedClock) {
        match clock {
            TimedClock::Events(events) => events.into_iter().for_each(|ev| self.api.event_destroy(ev)),
            TimedClock::Stamps { buf, .. } => self.api.free(buf),
        }
    }

    /// Graphs captured and replays so far (diagnostics and tests).
    pub fn graph_counts(&self) -> (u64, u64) {
        let g = self.graphs.lock();
        (g.captures, g.replays)
    }

    /// The device address of `positions[first_row..first_row + n]` when the uploaded
    /// positions there are `start..start + n` (a sequence's rows), else None.
    fn positions_at(&self, first_row: usize, start: usize, n: usize) -> Option<DevicePtr> {
        let cached = self.positions.lock();
        let p = cached.as_ref()?;
        let rows = p.values.get(first_row..first_row + n)?;
        rows.iter().enumerate().all(|(i, &v)| v as usize == start + i).then(|| p.buf.ptr + first_row as u64 * 4)
    }

    fn event(&self) -> Result<EventHandle> {
        match self.spare_events.lock().pop() {
            Some(e) => Ok(e),
            None => self.api.event_create(),
        }
    }

    /// Turns completed event pairs into registry samples. Call after the stream is idle.
    fn resolve_timings(&self) {
        let pending = std::mem::take(&mut *self.pending.lock());
        if pending.is_empty() {
            return;
        }
        let (t0, n) = (Instant::now(), pending.len());
        let backend = self.api.backend_name();
        let mut spare = self.spare_events.lock();
        for p in pending {
            match p {
                PendingTiming::Events { kernel, shape, start, end, graph_owned } => {
                    match self.api.event_elapsed(start, end) {
                        Ok(d) => kernel_registry::observe_sampled(kernel, shape, backend, self.variant, d),
                        Err(e) if graph_owned => self.stop_timing_graphs("kernel timing inside GPU graphs", &e),
                        Err(e) => tracing::warn!(kernel, error = %e, "kernel timing event unreadable"),
                    }
                    if !graph_owned {
                        spare.push(start);
                        spare.push(end);
                    }
                }
                PendingTiming::Stamps { buf, hz, slots, launches } => {
                    let mut bytes = vec![0u8; slots * 8];
                    if let Err(e) = self.api.download(buf, &mut bytes) {
                        self.stop_timing_graphs("kernel clock stamps", &e);
                        continue;
                    }
                    let ticks: Vec<u64> = bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
                    for &(j, kernel, shape) in launches.iter() {
                        // A reading before the one preceding it would be a clock that is not steady.
                        if let Some(t) = ticks[j + 1].checked_sub(ticks[j]) {
                            let nanos = (t as u128 * 1_000_000_000 / hz as u128) as u64;
                            kernel_registry::observe_sampled(kernel, shape, backend, self.variant, std::time::Duration::from_nanos(nanos));
                        }
                    }
                }
            }
        }
        tracing::debug!(timings = n, micros = t0.elapsed().as_micros() as u64, "GPU kernel timings resolved");
    }

    /// A timed graph's readings could not be read: graph replays are untimed from now on
    /// (warned once).
    fn stop_timing_graphs(&self, what: &str, e: &Error) {
        if !self.graph_timing_broken.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(error = %e, "{what} unreadable: graph replays are not timed from now on");
        }
    }

    fn elementwise(&self, name: &'static str, n: usize, args: Args) -> Result<()> {
        self.launch(name, 1, [n.div_ceil(256), 1, 1], args)
    }

    /// f32 activations -> a pooled f16 copy (GEMM input).
    fn to_f16(&self, x: &GpuBuffer, n: usize) -> Result<GpuBuffer> {
        let h = self.scratch(n, Elem::F16)?;
        self.elementwise("f32_to_f16", n, Args::default().ptr(x.mem.ptr).ptr(h.mem.ptr).i32(n))?;
        Ok(h)
    }

    fn try_matmul(&self, w: &GpuWeight, x: &GpuBuffer, rows: usize, out: &GpuBuffer) -> Result<()> {
        let (n, k) = (w.rows, w.cols);
        let gw = &w.data;
        if let Some(mw) = self.matvec_weight(w, rows) {
            return self.matvec(&[(mw, out.mem.ptr, n)], x.mem.ptr, 0, k, rows, false);
        }
        if let Some((name, blocks)) = matvec_q5_kernel(w).filter(|_| rows <= MATVEC_MAX_ROWS) {
            self.launch(name, rows, [n.div_ceil(4), rows, 1], Args::default().ptr(blocks).ptr(x.mem.ptr).ptr(out.mem.ptr).i32(n).i32(k))?;
            return Ok(());
        }
        let big = match self.gemm_tile {
            GemmTile::Auto | GemmTile::T64 => false,
            GemmTile::T128 => true,
        };
        match &gw.layout {
            WeightData::Q8_0 { qs, scales, .. } | WeightData::Int8Planes { qs, scales } => {
                let xq = self.pooled_alloc(rows * k)?;
                let xs = self.scratch(rows * k / 32, Elem::F32)?;
                let nblocks = rows * k / 32;
                self.launch(
                    "quantize_act_q8",
                    rows,
                    [nblocks.div_ceil(8), 1, 1],
                    Args::default().ptr(x.mem.ptr).ptr(xq.ptr).ptr(xs.mem.ptr).i32(rows * k),
                )?;
                let (name, bm, bn) = if big { ("gemm_w8a8_128x128", 128, 128) } else { ("gemm_w8a8_64x64", 64, 64) };
                self.launch(
                    name,
                    rows,
                    [n.div_ceil(bn), rows.div_ceil(bm), 1],
                    Args::default().ptr(xq.ptr).ptr(xs.mem.ptr).ptr(qs.ptr).ptr(scales.ptr).ptr(out.mem.ptr).i32(rows).i32(n).i32(k),
                )?;
            }
            WeightData::KQuant { blocks, f16: None } => {
                // Raw Q4_K blocks: the f16-copy GEMM's result, dequantising while staging.
                let xh = self.to_f16(x, rows * k)?;
                let (name, bm, bn) = if big { ("gemm_q4k_128x128", 128, 128) } else { ("gemm_q4k_64x64", 64, 64) };
                self.launch(
                    name,
                    rows,
                    [n.div_ceil(bn), rows.div_ceil(bm), 1],
                    Args::default().ptr(xh.mem.ptr).ptr(blocks.ptr).ptr(out.mem.ptr).i32(rows).i32(n).i32(k),
                )?;
            }
            WeightData::KQuant { f16: Some(f16), .. } | WeightData::F16(f16) => {
                let xh = self.to_f16(x, rows * k)?;
                let (name, bm, bn) = if big { ("gemm_f16_128x128", 128, 128) } else { ("gemm_f16_64x64", 64, 64) };
                self.launch(
                    name,
                    rows,
                    [n.div_ceil(bn), rows.div_ceil(bm), 1],
                    Args::default().ptr(xh.mem.ptr).ptr(f16.ptr).ptr(out.mem.ptr).i32(rows).i32(n).i32(k),
                )?;
            }
            WeightData::Vector(wv) if moe::is_router(&w.name) => self.router_matmul(w, wv, x, rows, out)?,
            WeightData::Vector(_) => {
                return Err(Error::invalid(self.be(), format!("tensor \"{}\" is 1-D and cannot be a matmul weight", w.name)))
            }
            WeightData::Unsliced => {
                return Err(Error::invalid(
                    self.be(),
                    format!("tensor \"{}\" is a 3-D expert tensor, multiplied one expert at a time", w.name),
                ))
            }
        }
        Ok(())
    }

    /// One mat-vec launch over up to three matrices of `k` columns that share the input:
    /// `parts` are (weight, output, rows of the matrix), all of one `MatvecKind`. `up` != 0
    /// makes the input silu(x) * up; `accumulate` adds to the outputs. The dp4a kernels get
    /// their input quantised by one `quantize_q8_1` launch first (SwiGLU included).
    #[allow(clippy::too_many_arguments)]
    fn matvec(
        &self,
        parts: &[(MatvecWeight, DevicePtr, usize)],
        x: DevicePtr,
        up: DevicePtr,
        k: usize,
        rows: usize,
        accumulate: bool,
    ) -> Result<()> {
        debug_assert!((1..=3).contains(&parts.len()) && rows <= DP4A_MAX_ROWS);
        let kind = parts[0].0.kind;
        debug_assert!(parts.iter().all(|p| p.0.kind == kind));
        let total: usize = parts.iter().map(|p| p.2).sum();
        let lanes = match (kind, self.matvec_family) {
            (MatvecKind::Q8Planes | MatvecKind::Q4KDp4a, MatvecFamily::Dp4a { lanes }) => {
                lanes.unwrap_or_else(|| matvec_lanes(k / if kind == MatvecKind::Q8Planes { 16 } else { 32 }))
            }
            _ => 0,
        };
        if lanes == 0 {
            // kernels/matvec.hip: one wave per matrix row, 4 rows per workgroup; one row: the
            // plain build, more: the _x4 build (4 activation rows per weight read).
            let name = match kind {
                MatvecKind::Q8_0Blocks => "matvec_q8_0",
                MatvecKind::Q4KBlocks => "matvec_q4_k",
                _ => "matvec_q6_k",
            };
            let (name, per_group) = if rows == 1 { (name, 1) } else { (x4_name(name), 4) };
            let mut args = Args::default();
            for i in 0..3 {
                let (wp, yp, n) = parts.get(i).map(|p| (p.0.w, p.1, p.2)).unwrap_or((0, 0, 0));
                args = args.ptr(wp).ptr(yp).i32(n);
            }
            let args = args.ptr(x).ptr(up).i32(k).i32(rows).i32(usize::from(accumulate));
            self.launch(name, rows, [total.div_ceil(4), rows.div_ceil(per_group), 1], args)?;
            return Ok(());
        }
        // The input as q8_1: from the RMSNorm that just wrote it, else one quantiser launch.
        let fresh = self.fresh_q8.lock().take().filter(|f| f.x == x && f.len == rows * k && up == 0);
        let (xq, xds) = match fresh {
            Some(f) => (f.q, f.ds),
            None => self.quantize_q8_1(x, up, rows, rows * k)?,
        };
        let mut args = Args::default();
        for i in 0..3 {
            let (wp, sp, yp, n) = parts.get(i).map(|p| (p.0.w, p.0.s, p.1, p.2)).unwrap_or((0, 0, 0, 0));
            args = args.ptr(wp).ptr(sp).ptr(yp).i32(n);
        }
        let args = args.ptr(xq.ptr).ptr(xds.mem.ptr).i32(k).i32(rows).i32(usize::from(accumulate));
        // One workgroup per 16-row tile of each matrix (tiles do not straddle matrices).
        let tiles: usize = parts.iter().map(|p| p.2.div_ceil(MMA_TILE)).sum();
        if let Some(name) = self.mma_kernel(kind, rows, tiles) {
            self.launch(name, rows, [tiles, rows.div_ceil(MMA_TILE), 1], args)?;
            return Ok(());
        }
        let per_group = dp4a_rows_per_launch(rows);
        // No 16-lane builds for more than 4 rows: those take 32 lanes.
        let lanes = if per_group > 4 { lanes.max(32) } else { lanes };
        let name = dp4a_kernel(kind, lanes, per_group);
        self.launch(name, rows, [total.div_ceil(128 / lanes), rows.div_ceil(per_group), 1], args)?;
        Ok(())
    }

    /// The prefill attention kernels for `head_dim` (kernels/attention.hip): on the matrix step
    /// (64 queries per workgroup) for head sizes 64 and 128 unless `prefill_attention` is
    /// "scalar", else the scalar kernel (32); None for a head size without kernels.
    fn prefill_kernels(&self, head_dim: usize) -> Option<PrefillKernels> {
        let (solo, batch, queries_per_group) = match (head_dim, self.prefill_attention_mma) {
            (64, true) => ("attn_prefill_mma_d64", "attn_prefill_batch_mma_d64", 64),
            (128, true) => ("attn_prefill_mma_d128", "attn_prefill_batch_mma_d128", 64),
            (64, false) => ("attn_prefill_d64", "attn_prefill_batch_d64", 32),
            (128, false) => ("attn_prefill_d128", "attn_prefill_batch_d128", 32),
            (256, _) => ("attn_prefill_d256", "attn_prefill_batch_d256", 32),
            _ => return None,
        };
        Some(PrefillKernels { solo, batch, queries_per_group })
    }

    /// Attention of `s` over one sequence's contiguous caches (kernels/attention.hip), with
    /// per-head sinks at `sinks` (0: none). With `new_rows` = (k, v), the sequence's new rows are
    /// stored into the caches first (`Backend::kv_store_attention`): by the decode kernel itself
    /// where it runs, else by `kv_store`.
    #[allow(clippy::too_many_arguments)]
    fn attention_dev(
        &self,
        q: &GpuBuffer,
        k_cache: &GpuBuffer,
        v_cache: &GpuBuffer,
        s: AttentionShape,
        sinks: DevicePtr,
        new_rows: Option<(&GpuBuffer, &GpuBuffer)>,
        out: &mut GpuBuffer,
    ) -> Result<()> {
        let scale = 1.0 / (s.head_dim as f32).sqrt();
        let keys = s.start_pos + s.n_tokens;
        // This sequence's rows of q and out (f32, n_head * head_dim wide).
        let row_off = (s.first_row * s.n_head * s.head_dim * 4) as u64;
        let (q, kc, vc, o) = (q.mem.ptr + row_off, k_cache.mem.ptr, v_cache.mem.ptr, out.mem.ptr + row_off);
        let (decode, decode_pos) = match s.head_dim {
            64 => ("attn_decode_d64", Some("attn_decode_pos_d64")),
            128 => ("attn_decode_d128", Some("attn_decode_pos_d128")),
            256 => ("attn_decode_d256", Some("attn_decode_pos_d256")),
            d => return Err(Error::unsupported(self.be(), format!("attention of head_dim {d}"))),
        };
        // Decode without a window reads keys = pos + 1 on the device, so the launch (and a
        // captured decode graph) is the same at every step. A windowed layer's key range
        // moves with the position: it is passed from the host (a new graph per step there).
        let pos = match (decode_pos, s.window) {
            (Some(_), None) if s.n_tokens == 1 => self.positions_at(s.first_row, s.start_pos, 1),
            _ => None,
        };
        let kv_dim = s.n_head_kv * s.head_dim;
        if let (Some(pos), Some(decode_pos)) = (pos, decode_pos) {
            // The new row's k and v, stored by the kernel.
            let row = (s.first_row * kv_dim * 4) as u64;
            let (k_new, v_new) = new_rows.map_or((0, 0), |(k, v)| (k.mem.ptr + row, v.mem.ptr + row));
            // The batch's first row: the output may be all of the o projection's input.
            let width = s.n_head * s.head_dim;
            let out_q8 = if s.first_row == 0 { self.decode_out_q8(1, width)? } else { None };
            let (qp, dsp) = out_q8.as_ref().map_or((0, 0), |(xq, xds)| (xq.ptr, xds.mem.ptr));
            self.launch(
                decode_pos,
                1,
                [s.n_head, 1, 1],
                Args::default()
                    .ptr(q)
                    .ptr(kc)
                    .ptr(vc)
                    .ptr(o)
                    .ptr(pos)
                    .i32(s.n_head)
                    .i32(s.n_head_kv)
                    .f32(scale)
                    .ptr(sinks)
                    .ptr(qp)
                    .ptr(dsp)
                    .ptr(k_new)
                    .ptr(v_new),
            )?;
            if let Some((xq, xds)) = out_q8 {
                *self.fresh_q8.lock() = Some(FreshQ8 { x: o, len: width, q: xq, ds: xds });
            }
            return Ok(());
        }
        if let Some((k, v)) = new_rows {
            self.kv_store_dev(k, v, k_cache, v_cache, s.first_row, s.start_pos, s.n_tokens, kv_dim)?;
        }
        if s.n_tokens == 1 {
            // A sliding window on decode: the query sees the last `window` keys, so the kernel
            // gets the caches from the window's first key on (f16, n_head_kv * head_dim wide).
            let first_key = s.window.map_or(0, |w| keys.saturating_sub(w));
            let key_off = (first_key * s.n_head_kv * s.head_dim * 2) as u64;
            self.launch(
                decode,
                1,
                [s.n_head, 1, 1],
                Args::default()
                    .ptr(q)
                    .ptr(kc + key_off)
                    .ptr(vc + key_off)
                    .ptr(o)
                    .i32(keys - first_key)
                    .i32(s.n_head)
                    .i32(s.n_head_kv)
                    .f32(scale)
                    .ptr(sinks),
            )
        } else {
            let p = self
                .prefill_kernels(s.head_dim)
                .ok_or_else(|| Error::unsupported(self.be(), format!("prefill attention of head_dim {}", s.head_dim)))?;
            let (prefill, queries_per_group) = (p.solo, p.queries_per_group);
            self.launch(
                prefill,
                s.n_tokens,
                [s.n_tokens.div_ceil(queries_per_group), s.n_head, 1],
                Args::default()
                    .ptr(q)
                    .ptr(kc)
                    .ptr(vc)
                    .ptr(o)
                    .i32(s.n_tokens)
                    .i32(keys)
                    .i32(s.n_head)
                    .i32(s.n_head_kv)
                    .i32(s.start_pos)
                    .f32(scale)
                    .i32(s.window.unwrap_or(0))
                    .ptr(sinks),
            )
        }
    }

    /// `Backend::kv_store` on the device buffers (also `attention_dev`'s store).
    #[allow(clippy::too_many_arguments)]
    fn kv_store_dev(
        &self,
        k: &GpuBuffer,
        v: &GpuBuffer,
        k_cache: &GpuBuffer,
        v_cache: &GpuBuffer,
        src_row: usize,
        start_pos: usize,
        n_tokens: usize,
        kv_dim: usize,
    ) -> Result<()> {
        let n = n_tokens * kv_dim;
        let off = (start_pos * kv_dim * 2) as u64;
        let src_off = (src_row * kv_dim * 4) as u64;
        if let Some(pos) = self.positions_at(src_row, start_pos, n_tokens) {
            // The cache rows come from the positions on the device: one launch for k and v,
            // the same arguments at every decode step.
            return self.launch(
                "kv_store_f16",
                n_tokens,
                [kv_dim.div_ceil(256), n_tokens, 2],
                Args::default()
                    .ptr(k.mem.ptr + src_off)
                    .ptr(v.mem.ptr + src_off)
                    .ptr(k_cache.mem.ptr)
                    .ptr(v_cache.mem.ptr)
                    .ptr(pos)
                    .i32(kv_dim),
            );
        }
        for (src, dst) in [(k, k_cache), (v, v_cache)] {
            debug_assert_eq!(dst.elem, Elem::F16);
            self.launch(
                "f32_to_f16",
                n_tokens,
                [n.div_ceil(256), 1, 1],
                Args::default().ptr(src.mem.ptr + src_off).ptr(dst.mem.ptr + off).i32(n),
            )?;
        }
        Ok(())
    }

    /// gpt-oss's per-head sinks on the device, checked against the heads.
    fn sinks_on_device(&self, sinks: &[f32], shape: AttentionShape) -> Result<DevicePtr> {
        if sinks.len() != shape.n_head {
            return Err(Error::invalid(self.be(), format!("{} attention sinks for {} heads", sinks.len(), shape.n_head)));
        }
        self.host_vector_on_device(sinks)
    }

    /// q8_1 buffers for `rows` rows of `width` that a decode kernel writes beside its f32 output
    /// (RMSNorm, attention) for the dp4a mat-vec that reads that output next (the caller marks
    /// them fresh), or None where that mat-vec would not take them.
    fn decode_out_q8(&self, rows: usize, width: usize) -> Result<Option<(DevBuf, GpuBuffer)>> {
        if !matches!(self.matvec_family, MatvecFamily::Dp4a { .. }) || rows > self.dp4a_max_rows || !width.is_multiple_of(32) {
            return Ok(None);
        }
        Ok(Some((self.pooled_alloc(rows * width)?, self.scratch(rows * width / 16, Elem::F32)?)))
    }

    /// A device copy of a small per-layer host vector (attention sinks, a router bias), uploaded
    /// on first use and kept by its contents: a model's layers pass the same vectors at every step.
    pub(super) fn host_vector_on_device(&self, v: &[f32]) -> Result<DevicePtr> {
        let key: Vec<u32> = v.iter().map(|x| x.to_bits()).collect();
        if let Some(buf) = self.host_vectors.lock().get(&key) {
            return Ok(buf.ptr);
        }
        let buf = self.upload_new(bytemuck_f32(v))?;
        let ptr = buf.ptr;
        self.host_vectors.lock().insert(key, buf);
        Ok(ptr)
    }

    /// RoPE (plain, linear or YaRN scaling: kernels/rope.hip) of `n_heads` heads in each row,
    /// and with `k` = (buffer, its heads) of k's heads in the same launch (`rope_qk_*`); the
    /// positions uploaded once per distinct list (decode graphs read them at a fixed address).
    #[allow(clippy::too_many_arguments)]
    fn rope_dev(
        &self,
        x: &mut GpuBuffer,
        k: Option<(&mut GpuBuffer, usize)>,
        positions: &[u32],
        n_heads: usize,
        head_dim: usize,
        freq_base: f32,
        style: RopeStyle,
        scaling: RopeScaling,
    ) -> Result<()> {
        let mut cached = self.positions.lock();
        if cached.as_ref().is_none_or(|p| p.values.as_slice() != positions) {
            // Recorded launches that read the old positions (or the old buffer) go first.
            let grow = cached.as_ref().is_none_or(|p| p.capacity < positions.len());
            if grow || self.tape.lock().reads_positions {
                self.flush()?;
            }
            let upload = |cached: &mut Option<Positions>| -> Result<()> {
                if grow {
                    let capacity = positions.len().max(64).next_power_of_two();
                    *cached = None; // the old buffer is freed before the new one is made
                    *cached = Some(Positions { values: Vec::new(), buf: self.raw_alloc(capacity * 4)?, capacity });
                }
                let p = cached.as_mut().expect("positions buffer");
                let bytes: Vec<u8> = positions.iter().flat_map(|p| (*p as i32).to_le_bytes()).collect();
                self.api.upload(p.buf.ptr, &bytes)?;
                p.values = positions.to_vec();
                Ok(())
            };
            if let Err(e) = upload(&mut cached) {
                *cached = None;
                return Err(e);
            }
        }
        let pos = cached.as_ref().map(|p| p.buf.ptr).unwrap_or(0);
        drop(cached);
        // cos and sin times attn_factor, and with YaRN 1 + 0.1 ln(1 / freq_scale) (the CPU's order).
        let mut magnitude = scaling.attn_factor;
        if scaling.ext_factor != 0.0 {
            magnitude *= 1.0 + 0.1 * (1.0 / scaling.freq_scale).ln();
        }
        let neox = style == RopeStyle::Neox;
        let (name, args, heads) = match k {
            None => (if neox { "rope_neox" } else { "rope_norm" }, Args::default().ptr(x.mem.ptr).ptr(pos).i32(n_heads), n_heads),
            Some((k, k_heads)) => (
                if neox { "rope_qk_neox" } else { "rope_qk_norm" },
                Args::default().ptr(x.mem.ptr).ptr(k.mem.ptr).ptr(pos).i32(n_heads).i32(k_heads),
                n_heads + k_heads,
            ),
        };
        let pairs = heads * head_dim / 2;
        self.launch(
            name,
            positions.len(),
            [pairs.div_ceil(256), positions.len(), 1],
            args.i32(head_dim)
                .i32(head_dim)
                .f32(freq_base)
                .f32(scaling.freq_scale)
                .f32(scaling.ext_factor)
                .f32(magnitude)
                .f32(scaling.corr_dims[0])
                .f32(scaling.corr_dims[1]),
        )
    }

    /// `len` values at `x` (or silu(x) * up when `up` != 0) as q8_1 blocks for the dp4a
    /// kernels: the int8 values and (d, s) per block of 32, by one `quantize_q8_1` launch
    /// (`rows` labels its metrics).
    fn quantize_q8_1(&self, x: DevicePtr, up: DevicePtr, rows: usize, len: usize) -> Result<(DevBuf, GpuBuffer)> {
        self.quantize_q8_1_act(x, up, GatedAct::Silu, rows, len)
    }

    /// `quantize_q8_1` with the gated activation of (x, up) chosen.
    fn quantize_q8_1_act(&self, x: DevicePtr, up: DevicePtr, act: GatedAct, rows: usize, len: usize) -> Result<(DevBuf, GpuBuffer)> {
        let xq = self.pooled_alloc(len)?;
        let xds = self.scratch(len / 16, Elem::F32)?;
        let blocks = len / 32;
        self.launch(
            "quantize_q8_1",
            rows,
            [blocks.div_ceil(8), 1, 1],
            Args::default().ptr(x).ptr(up).ptr(xq.ptr).ptr(xds.mem.ptr).i32(len).i32(act as usize),
        )?;
        Ok((xq, xds))
    }

    /// The matrix-unit mat-vec for `rows` activation rows of a dp4a layout, when
    /// `GpuOptions::matvec_mma` is on and the layout has one (Q8_0 / Q5_0 planes, Q4_K blocks).
    /// `tiles`: the launch's workgroups per 16 activation rows.
    fn mma_kernel(&self, kind: MatvecKind, rows: usize, tiles: usize) -> Option<&'static str> {
        (self.matvec_mma && rows >= MMA_MIN_ROWS).then(|| mma_kernel_name(kind, mma_wide(tiles, self.mma_wide_below))).flatten()
    }

    /// The decode mat-vec layout of a weight and its device pointers, if its type has one and
    /// `rows` activation rows are few enough for it (`MATVEC_MAX_ROWS`, `DP4A_MAX_ROWS`).
    fn matvec_weight(&self, w: &GpuWeight, rows: usize) -> Option<MatvecWeight> {
        let dp4a = matches!(self.matvec_family, MatvecFamily::Dp4a { .. });
        let (kind, wp, sp) = match (&w.data.layout, w.ggml_type) {
            (WeightData::Q8_0 { qs, scales, .. }, GgmlType::Q8_0 | GgmlType::Q5_0) if dp4a => (MatvecKind::Q8Planes, qs.ptr, scales.ptr),
            (WeightData::Int8Planes { qs, scales }, GgmlType::MXFP4) if dp4a => (MatvecKind::Q8Planes, qs.ptr, scales.ptr),
            (WeightData::Q8_0 { blocks, .. }, GgmlType::Q8_0) => (MatvecKind::Q8_0Blocks, blocks.ptr, 0),
            (WeightData::KQuant { blocks, .. }, GgmlType::Q4_K) if dp4a => (MatvecKind::Q4KDp4a, blocks.ptr, 0),
            (WeightData::KQuant { blocks, .. }, GgmlType::Q4_K) => (MatvecKind::Q4KBlocks, blocks.ptr, 0),
            (WeightData::KQuant { blocks, .. }, GgmlType::Q6_K) => (MatvecKind::Q6KBlocks, blocks.ptr, 0),
            _ => return None,
        };
        let max_rows = if matches!(kind, MatvecKind::Q8Planes | MatvecKind::Q4KDp4a) { self.dp4a_max_rows } else { MATVEC_MAX_ROWS };
        (rows <= max_rows).then_some(MatvecWeight { kind, w: wp, s: sp })
    }

    fn prepare_weight(&self, file: &GgufFile, index: usize, rows: usize, cols: usize) -> Result<WeightData> {
        let info = &file.tensors[index];
        if info.dims.len() == 3 {
            return Ok(WeightData::Unsliced);
        }
        // Biases stay f32 whole, 2-D ones too (gpt-oss's [n_out, n_expert] expert biases).
        let f32_whole = info.dims.len() == 1 || moe::is_router(&info.name) || info.name.ends_with(".bias");
        self.prepare_rows(&info.name, info.ggml_type, file.tensor_data(info), rows, cols, f32_whole)
    }

    /// `rows` x `cols` of type `t` in the device layouts above; `f32_whole`: dequantised to f32
    /// (1-D tensors, routers), as is any single row.
    fn prepare_rows(&self, name: &str, t: GgmlType, bytes: &[u8], rows: usize, cols: usize, f32_whole: bool) -> Result<WeightData> {
        let dequant_error = |e: anyhow::Error| Error::Tensor { name: name.to_string(), message: format!("{e:#}") };
        if f32_whole || rows == 1 {
            let mut v = vec![0f32; rows * cols];
            quant::dequantize_row(t, bytes, &mut v).map_err(dequant_error)?;
            return self.upload_new(bytemuck_f32(&v)).map(WeightData::Vector);
        }
        let row_bytes = bytes.len() / rows;
        let dequant_f16 = || -> Result<Vec<u16>> {
            let mut out = vec![0u16; rows * cols];
            out.par_chunks_mut(cols)
                .zip(bytes.par_chunks(row_bytes))
                .try_for_each(|(dst, src)| -> anyhow::Result<()> {
                    let mut tmp = vec![0f32; cols];
                    quant::dequantize_row(t, src, &mut tmp)?;
                    for (d, s) in dst.iter_mut().zip(&tmp) {
                        *d = half::f16::from_f32(*s).to_bits();
                    }
                    Ok(())
                })
                .map_err(dequant_error)?;
            Ok(out)
        };
        if !cols.is_multiple_of(32) {
            return Err(Error::unsupported(
                self.be(),
                format!("tensor \"{name}\" of {cols} columns (the GPU kernels need a multiple of 32)"),
            ));
        }
        Ok(match t {
            GgmlType::Q8_0 => {
                // block_q8_0 = f16 d + 32 int8: split into an int8 plane and an f16 scale plane.
                let nb = rows * cols / 32;
                let mut qs = vec![0u8; rows * cols];
                let mut scales = vec![0u8; nb * 2];
                for b in 0..nb {
                    let blk = &bytes[b * 34..b * 34 + 34];
                    scales[b * 2..b * 2 + 2].copy_from_slice(&blk[..2]);
                    qs[b * 32..b * 32 + 32].copy_from_slice(&blk[2..]);
                }
                WeightData::Q8_0 { blocks: self.raw_weight(bytes)?, qs: self.upload_new(&qs)?, scales: self.upload_new(&scales)? }
            }
            GgmlType::Q5_0 => {
                let (qs, scales) = repack::q5_0_int8_planes(bytes).map_err(dequant_error)?;
                WeightData::Q8_0 { blocks: self.raw_weight(bytes)?, qs: self.upload_new(&qs)?, scales: self.upload_new(&scales)? }
            }
            GgmlType::MXFP4 => {
                let (qs, scales) = repack::mxfp4_int8_planes(bytes).map_err(dequant_error)?;
                WeightData::Int8Planes { qs: self.upload_new(&qs)?, scales: self.upload_new(&scales)? }
            }
            GgmlType::Q5_1 => {
                WeightData::KQuant { blocks: self.raw_weight(bytes)?, f16: Some(self.upload_new(bytemuck_u16(&dequant_f16()?))?) }
            }
            GgmlType::Q4_K | GgmlType::Q6_K => {
                if !cols.is_multiple_of(256) {
                    return Err(Error::unsupported(self.be(), format!("tensor \"{name}\" of {cols} columns (not a multiple of 256)")));
                }
                // Blocks read from host memory (`map_host`) keep the copy: the GEMM would read
                // them over the bus once per row tile.
                let f16 = if t == GgmlType::Q4_K && !self.q4k_f16_copies && !self.host_weights {
                    None
                } else {
                    Some(self.upload_new(bytemuck_u16(&dequant_f16()?))?)
                };
                WeightData::KQuant { blocks: self.raw_weight(bytes)?, f16 }
            }
            _ => WeightData::F16(self.upload_new(bytemuck_u16(&dequant_f16()?))?),
        })
    }
}

/// Q5_0 / Q5_1 decode (kernels/matvec_q5.hip): one weight, rows on the grid's y axis, none of
/// the fused multi-matrix / accumulate arguments of `GpuBackend::matvec`.
fn matvec_q5_kernel(w: &GpuWeight) -> Option<(&'static str, DevicePtr)> {
    let blocks = match &w.data.layout {
        WeightData::Q8_0 { blocks, .. } | WeightData::KQuant { blocks, .. } => blocks.ptr,
        _ => return None,
    };
    match w.ggml_type {
        GgmlType::Q5_0 => Some(("matvec_q5_0", blocks)),
        GgmlType::Q5_1 => Some(("matvec_q5_1", blocks)),
        _ => None,
    }
}

/// The 4-row build of a mat-vec kernel.
fn x4_name(name: &'static str) -> &'static str {
    match name {
        "matvec_q8_0" => "matvec_q8_0_x4",
        "matvec_q4_k" => "matvec_q4_k_x4",
        "matvec_q6_k" => "matvec_q6_k_x4",
        other => other,
    }
}

impl<A: GpuApi> Drop for GpuBackend<A> {
    fn drop(&mut self) {
        // Recorded work refers to buffers that may be gone: drop it; graphs go after the
        // stream has finished with them.
        self.tape.get_mut().ops.clear();
        let _ = self.api.synchronize();
        for e in std::mem::take(&mut self.graphs.get_mut().entries) {
            self.destroy_graph(e);
        }
    }
}

fn bytemuck_f32(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

fn bytemuck_f32_mut(v: &mut [f32]) -> &mut [u8] {
    // SAFETY: as above, and every byte pattern is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

fn bytemuck_u16(v: &[u16]) -> &[u8] {
    // SAFETY: u16 has no padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

impl<A: GpuApi> Backend for GpuBackend<A> {
    type Buffer = GpuBuffer;
    type KvBuffer = GpuBuffer;
    type WeightData = DeviceWeight;
    type ExpertTable = moe::ExpertTable;

    fn name(&self) -> &'static str {
        self.api.backend_name()
    }

    fn variant(&self) -> &'static str {
        self.variant
    }

    fn supports(&self, t: GgmlType) -> bool {
        quant::supports(t)
    }

    fn check_model(&self, hp: &HParams) -> Result<()> {
        if let Some(why) = moe::refusal(hp, self.moe) {
            return Err(Error::unsupported(self.be(), why));
        }
        if !matches!(hp.head_dim, 64 | 128 | 256) {
            return Err(Error::unsupported(
                self.be(),
                format!("head_dim {} (attention kernels are built for 64, 128 and 256)", hp.head_dim),
            ));
        }
        if !hp.n_head.is_multiple_of(hp.n_head_kv) {
            return Err(Error::unsupported(
                self.be(),
                format!("{} query heads over {} KV heads (not a multiple)", hp.n_head, hp.n_head_kv),
            ));
        }
        Ok(())
    }

    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<WeightOf<Self>> {
        let index = file
            .tensors
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| Error::Tensor { name: name.to_string(), message: format!("missing from {}", file.path.display()) })?;
        let info = &file.tensors[index];
        if !quant::supports(info.ggml_type) {
            return Err(Error::unsupported(self.be(), format!("tensor \"{name}\" of {}: type {}", file.path.display(), info.ggml_type)));
        }
        let cols = *info.dims.first().unwrap_or(&1) as usize;
        let rows = info.dims.iter().skip(1).product::<u64>() as usize;
        let layout = self.prepare_weight(file, index, rows, cols).while_doing(|| format!("uploading tensor \"{name}\""))?;
        Ok(Weight {
            name: name.to_string(),
            ggml_type: info.ggml_type,
            rows,
            cols,
            data: DeviceWeight { file: file.clone(), index, layout },
        })
    }

    fn alloc(&self, len: usize) -> Result<Self::Buffer> {
        self.scratch(len, Elem::F32)
    }

    fn alloc_host(&self, len: usize) -> Result<HostBuffer> {
        let api = self.api.clone();
        Ok(HostBuffer::pinned(len, |p, bytes| {
            let undo: Unpin = Box::new(move |p| api.unpin_host(p));
            self.api.pin_host(p, bytes).then_some(undo)
        }))
    }

    fn alloc_kv_cache(&self, len: usize) -> Result<Self::KvBuffer> {
        Ok(GpuBuffer { mem: self.kv_alloc(len * 2)?, elem: Elem::F16 })
    }

    fn kv_cache_elem_bytes(&self) -> usize {
        2
    }

    fn write(&self, dst: &mut Self::Buffer, offset: usize, src: &[f32]) -> Result<()> {
        drop(self.fresh_q8.lock().take());
        self.flush()?;
        self.api.upload(dst.mem.ptr + offset as u64 * 4, bytemuck_f32(src))
    }

    fn read(&self, src: &Self::Buffer, offset: usize, dst: &mut [f32]) -> Result<()> {
        self.flush()?;
        self.api.download(src.mem.ptr + offset as u64 * 4, bytemuck_f32_mut(dst))?;
        self.resolve_timings();
        self.trim_pool();
        Ok(())
    }

    fn embed(&self, table: &WeightOf<Self>, tokens: &[u32], out: &mut Self::Buffer) -> Result<()> {
        // The lookup runs on the host from the mapped file: a few rows, no kernel needed.
        let w = &table.data;
        let info = &w.file.tensors[w.index];
        let bytes = w.file.tensor_data(info);
        let row_bytes = bytes.len() / table.rows;
        let mut host = vec![0f32; tokens.len() * table.cols];
        for (t, dst) in tokens.iter().zip(host.chunks_mut(table.cols)) {
            let t = *t as usize;
            if t >= table.rows {
                return Err(Error::invalid(self.be(), format!("token id {t} is outside the vocabulary of {}", table.rows)));
            }
            quant::dequantize_row(table.ggml_type, &bytes[t * row_bytes..(t + 1) * row_bytes], dst)
                .map_err(|e| Error::Tensor { name: table.name.clone(), message: format!("{e:#}") })?;
        }
        drop(self.fresh_q8.lock().take());
        self.flush()?;
        self.api.upload(out.mem.ptr, bytemuck_f32(&host))
    }

    fn rmsnorm(&self, x: &Self::Buffer, w: &WeightOf<Self>, rows: usize, dim: usize, eps: f32, out: &mut Self::Buffer) -> Result<()> {
        let WeightData::Vector(wv) = &w.data.layout else {
            return Err(Error::invalid(self.be(), format!("norm weight \"{}\" is not 1-D", w.name)));
        };
        let args = Args::default().ptr(x.mem.ptr).ptr(wv.ptr).ptr(out.mem.ptr).i32(dim).f32(eps);
        // Decode input of a dp4a mat-vec (q/k/v, gate/up, output): write its q8_1 copy too.
        if let Some((q, ds)) = self.decode_out_q8(rows, dim)? {
            self.launch("rmsnorm_q8_1", rows, [rows, 1, 1], args.ptr(q.ptr).ptr(ds.mem.ptr))?;
            *self.fresh_q8.lock() = Some(FreshQ8 { x: out.mem.ptr, len: rows * dim, q, ds });
            return Ok(());
        }
        self.launch("rmsnorm", rows, [rows, 1, 1], args)
    }

    fn rmsnorm_inplace(&self, x: &mut Self::Buffer, w: &WeightOf<Self>, rows: usize, dim: usize, eps: f32) -> Result<()> {
        let WeightData::Vector(wv) = &w.data.layout else {
            return Err(Error::invalid(self.be(), format!("norm weight \"{}\" is not 1-D", w.name)));
        };
        let p = x.mem.ptr;
        self.launch("rmsnorm", rows, [rows, 1, 1], Args::default().ptr(p).ptr(wv.ptr).ptr(p).i32(dim).f32(eps))
    }

    fn matmul(&self, w: &WeightOf<Self>, x: &Self::Buffer, rows: usize, out: &mut Self::Buffer) -> Result<()> {
        self.try_matmul(w, x, rows, out)
    }

    fn matmul_many(&self, ws: &[&WeightOf<Self>], x: &Self::Buffer, rows: usize, outs: &mut [&mut Self::Buffer]) -> Result<()> {
        // q, k, v (or gate, up) of the same layout in one mat-vec launch.
        let mws: Vec<_> = ws.iter().map(|w| self.matvec_weight(w, rows)).collect();
        let kind = mws.first().copied().flatten().map(|m| m.kind);
        let same = kind.is_some()
            && (1..=3).contains(&ws.len())
            && mws.iter().all(|m| m.map(|m| m.kind) == kind)
            && ws.iter().all(|w| w.cols == ws[0].cols);
        if !same {
            for (w, out) in ws.iter().zip(outs.iter_mut()) {
                self.matmul(w, x, rows, out)?;
            }
            return Ok(());
        }
        let parts: Vec<_> = ws.iter().zip(outs.iter()).zip(&mws).map(|((w, out), m)| (m.expect("checked"), out.mem.ptr, w.rows)).collect();
        self.matvec(&parts, x.mem.ptr, 0, ws[0].cols, rows, false)
    }

    fn matmul_add(
        &self,
        w: &WeightOf<Self>,
        x: &mut Self::Buffer,
        up: Option<&Self::Buffer>,
        rows: usize,
        out: &mut Self::Buffer,
        scratch: &mut Self::Buffer,
    ) -> Result<()> {
        match self.matvec_weight(w, rows) {
            // out += W (silu(x) * up): SwiGLU and the residual add in the mat-vec launch(es).
            Some(mw) => {
                let up = up.map(|u| u.mem.ptr).unwrap_or(0);
                self.matvec(&[(mw, out.mem.ptr, w.rows)], x.mem.ptr, up, w.cols, rows, true)
            }
            None => {
                if let Some(up) = up {
                    self.silu_mul(x, up, rows * w.cols)?;
                }
                self.matmul(w, x, rows, scratch)?;
                self.add(out, scratch, rows * w.rows)
            }
        }
    }

    fn add_bias(&self, x: &mut Self::Buffer, b: &WeightOf<Self>, rows: usize) -> Result<()> {
        let WeightData::Vector(bv) = &b.data.layout else {
            return Err(Error::invalid(self.be(), format!("bias \"{}\" is not 1-D", b.name)));
        };
        let width = b.rows * b.cols;
        self.elementwise("add_bias", rows * width, Args::default().ptr(x.mem.ptr).ptr(bv.ptr).i32(rows * width).i32(width))
    }

    fn rope(
        &self,
        x: &mut Self::Buffer,
        positions: &[u32],
        n_heads: usize,
        head_dim: usize,
        freq_base: f32,
        style: RopeStyle,
    ) -> Result<()> {
        // No scaling is the kernel's identity scaling: the same bits as an unscaled rotation.
        self.rope_dev(x, None, positions, n_heads, head_dim, freq_base, style, RopeScaling::IDENTITY)
    }

    fn rope_scaled(
        &self,
        x: &mut Self::Buffer,
        positions: &[u32],
        n_heads: usize,
        head_dim: usize,
        freq_base: f32,
        style: RopeStyle,
        scaling: RopeScaling,
    ) -> Result<()> {
        self.rope_dev(x, None, positions, n_heads, head_dim, freq_base, style, scaling)
    }

    fn rope_qk(
        &self,
        q: &mut Self::Buffer,
        k: &mut Self::Buffer,
        positions: &[u32],
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        freq_base: f32,
        style: RopeStyle,
        scaling: Option<RopeScaling>,
    ) -> Result<()> {
        let scaling = scaling.unwrap_or(RopeScaling::IDENTITY);
        self.rope_dev(q, Some((k, n_head_kv)), positions, n_head, head_dim, freq_base, style, scaling)
    }

    fn kv_store(
        &self,
        k: &Self::Buffer,
        v: &Self::Buffer,
        k_cache: &mut Self::KvBuffer,
        v_cache: &mut Self::KvBuffer,
        src_row: usize,
        start_pos: usize,
        n_tokens: usize,
        kv_dim: usize,
    ) -> Result<()> {
        self.kv_store_dev(k, v, k_cache, v_cache, src_row, start_pos, n_tokens, kv_dim)
    }

    fn kv_store_attention(
        &self,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        k_cache: &mut Self::KvBuffer,
        v_cache: &mut Self::KvBuffer,
        shape: AttentionShape,
        sinks: Option<&[f32]>,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        let sinks = match sinks {
            Some(s) => self.sinks_on_device(s, shape)?,
            None => 0,
        };
        self.attention_dev(q, k_cache, v_cache, shape, sinks, Some((k, v)), out)
    }

    fn decode_attention_batch(
        &self,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        caches: &mut [(&mut Self::KvBuffer, &mut Self::KvBuffer)],
        start_pos: &[usize],
        shape: AttentionShape,
        out: &mut Self::Buffer,
    ) -> Result<bool> {
        self.try_decode_attention_batch(q, k, v, caches, start_pos, shape, out)
    }

    fn attention_batch(
        &self,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        caches: &mut [(&mut Self::KvBuffer, &mut Self::KvBuffer)],
        shapes: &[AttentionShape],
        sinks: Option<&[f32]>,
        out: &mut Self::Buffer,
    ) -> Result<bool> {
        self.try_attention_batch(q, k, v, caches, shapes, sinks, out)
    }

    fn attention(
        &self,
        q: &Self::Buffer,
        k_cache: &Self::KvBuffer,
        v_cache: &Self::KvBuffer,
        s: AttentionShape,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        self.attention_dev(q, k_cache, v_cache, s, 0, None, out)
    }

    fn attention_with_sinks(
        &self,
        q: &Self::Buffer,
        k_cache: &Self::KvBuffer,
        v_cache: &Self::KvBuffer,
        blocks: KvBlocks<'_>,
        shape: AttentionShape,
        sinks: &[f32],
        out: &mut Self::Buffer,
    ) -> Result<()> {
        if !blocks.is_contiguous() {
            return Err(Error::unsupported(self.be(), "a paged KV cache"));
        }
        let sinks = self.sinks_on_device(sinks, shape)?;
        self.attention_dev(q, k_cache, v_cache, shape, sinks, None, out)
    }

    fn silu_mul(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> Result<()> {
        let g = gate.mem.ptr;
        self.elementwise("silu_mul", n, Args::default().ptr(g).ptr(up.mem.ptr).ptr(g).i32(n))
    }

    fn swiglu_oai(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> Result<()> {
        let g = gate.mem.ptr;
        self.elementwise("swiglu_oai", n, Args::default().ptr(g).ptr(up.mem.ptr).ptr(g).i32(n))
    }

    fn gelu_tanh_mul(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> Result<()> {
        let g = gate.mem.ptr;
        self.elementwise("gelu_tanh_mul", n, Args::default().ptr(g).ptr(up.mem.ptr).ptr(g).i32(n))
    }

    fn scale(&self, x: &mut Self::Buffer, n: usize, s: f32) -> Result<()> {
        self.elementwise("scale", n, Args::default().ptr(x.mem.ptr).i32(n).f32(s))
    }

    fn add(&self, x: &mut Self::Buffer, y: &Self::Buffer, n: usize) -> Result<()> {
        self.elementwise("add", n, Args::default().ptr(x.mem.ptr).ptr(y.mem.ptr).i32(n))
    }

    fn copy_row(&self, src: &Self::Buffer, src_row: usize, dim: usize, dst: &mut Self::Buffer) -> Result<()> {
        self.copy_op(dst.mem.ptr, src.mem.ptr + (src_row * dim * 4) as u64, dim * 4)
    }

    fn gather_rows(&self, src: &Self::Buffer, rows: &[usize], dim: usize, dst: &mut Self::Buffer) -> Result<()> {
        self.gather_rows_dev(src, rows, dim, dst)
    }

    // Mixture of experts (moe.rs).
    fn weight_rows(&self, w: &WeightOf<Self>, first_row: usize, n_rows: usize, name: &str) -> Result<WeightOf<Self>> {
        self.weight_rows_prepared(w, first_row, n_rows, name)
    }

    fn expert_biases(
        &self,
        table: &mut Self::ExpertTable,
        gate: &[&WeightOf<Self>],
        up: &[&WeightOf<Self>],
        down: &[&WeightOf<Self>],
    ) -> Result<bool> {
        self.expert_biases_dev(table, gate, up, down)
    }

    fn scatter_rows(&self, src: &Self::Buffer, rows: &[u32], dim: usize, dst: &mut Self::Buffer) -> Result<()> {
        self.scatter_rows_dev(src, rows, dim, dst)
    }

    fn expert_table(
        &self,
        gate: &[&WeightOf<Self>],
        up: &[&WeightOf<Self>],
        down: &[&WeightOf<Self>],
    ) -> Result<Option<Self::ExpertTable>> {
        self.expert_table_dev(gate, up, down)
    }

    fn routed_experts(&self, r: super::RoutedExperts<'_, Self>) -> Result<()> {
        self.routed_experts_dev(r)
    }

    fn grouped_experts(
        &self,
        table: &Self::ExpertTable,
        experts: &[u32],
        weights: &[f32],
        k: usize,
        x: &Self::Buffer,
        n: usize,
        dim: usize,
        out: &mut Self::Buffer,
    ) -> Result<bool> {
        self.grouped_experts_dev(table, experts, weights, k, x, n, dim, out)
    }

    fn weighted_sum_rows(&self, src: &Self::Buffer, weights: &[f32], n: usize, k: usize, dim: usize, out: &mut Self::Buffer) -> Result<()> {
        self.weighted_sum_rows_dev(src, weights, n, k, dim, out)
    }

    fn scale_rows(&self, x: &mut Self::Buffer, scales: &[f32], dim: usize) -> Result<()> {
        self.scale_rows_dev(x, scales, dim)
    }

    fn synchronize(&self) -> Result<()> {
        self.flush()?;
        self.api.synchronize()?;
        self.resolve_timings();
        self.trim_pool();
        Ok(())
    }

    fn fingerprint(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.api.backend_name(),
            "variant": self.variant,
            "device": self.api.device_name(),
            "arch": self.api.arch(),
            "kernel_dir": self.kernel_dir.display().to_string(),
            "kernel_compiler": self.compiler,
            "weights": self.weights_placement,
            "matvec": self.matvec_family.name(),
            "decode_attention": if self.batched_attention { "batched" } else { "per-sequence" },
            "prefill_attention_batches": if self.batched_prefill_attention { "batched" } else { "per-sequence" },
            "matvec_max_rows": self.dp4a_max_rows,
            "matvec_mma": self.matvec_mma,
            // The compute units below which the 16-wave mat-vecs run (null: never).
            "matvec_mma_wide_below": self.mma_wide_below,
            "moe_device_routing": self.moe_device_routing,
            "q4k_f16_copies": self.q4k_f16_copies,
            "gemm_tile": self.gemm_tile.name(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matvec_option_names_round_trip() {
        for name in ["dp4a", "dp4a-g16", "dp4a-g32", "dp4a-g64", "dp4a-g128", "wave"] {
            assert_eq!(MatvecFamily::parse(name).unwrap().name(), name);
        }
        assert_eq!(MatvecFamily::parse("").unwrap(), MatvecFamily::Dp4a { lanes: None });
        assert!(MatvecFamily::parse("dp4a-g8").is_err());
        for name in ["auto", "64x64", "128x128"] {
            assert_eq!(GemmTile::parse(name).unwrap().name(), name);
        }
        assert_eq!(GemmTile::parse("").unwrap(), GemmTile::Auto);
        assert!(GemmTile::parse("32x32").is_err());
    }

    #[test]
    fn dp4a_lanes_per_row_grow_with_the_row() {
        // Q8_0 planes: 16 values per load; Q4_K: 32.
        assert_eq!(matvec_lanes(1536 / 16), 32); // q, k, v, o, gate, up: 3 loads per lane
        assert_eq!(matvec_lanes(4096 / 16), 64);
        assert_eq!(matvec_lanes(8960 / 16), 128); // down: the whole workgroup
        assert_eq!(matvec_lanes(8960 / 32), 128);
        assert_eq!(dp4a_kernel(MatvecKind::Q4KDp4a, 64, 4), "matvec_q4k_g64_x4");
        assert_eq!(dp4a_kernel(MatvecKind::Q8Planes, 32, 1), "matvec_q8p_g32");
    }

    #[test]
    fn batched_decode_rows_pick_a_build_that_exists() {
        assert_eq!([1, 2, 4, 5, 8, 9, 16, 17, 32].map(dp4a_rows_per_launch), [1, 4, 4, 8, 8, 16, 16, 16, 16]);
        assert_eq!(dp4a_kernel(MatvecKind::Q8Planes, 128, 16), "matvec_q8p_g128_x16");
        assert_eq!(dp4a_kernel(MatvecKind::Q4KDp4a, 32, 8), "matvec_q4k_g32_x8");
        // Every name the dispatch can produce is one the backend loads.
        let loaded: Vec<&str> = KERNEL_FILES.iter().flat_map(|(_, ks)| ks.iter().map(|k| k.0)).collect();
        for kind in [MatvecKind::Q8Planes, MatvecKind::Q4KDp4a] {
            for lanes in [16, 32, 64, 128] {
                for per_launch in [1, 4, 8, 16] {
                    let lanes = if per_launch > 4 { lanes.max(32) } else { lanes };
                    let name = dp4a_kernel(kind, lanes, per_launch);
                    assert!(loaded.contains(&name), "{name} is not in KERNEL_FILES");
                }
            }
            for wide in [false, true] {
                if let Some(name) = mma_kernel_name(kind, wide) {
                    assert!(loaded.contains(&name), "{name} is not in KERNEL_FILES");
                }
            }
        }
        assert_eq!(mma_kernel_name(MatvecKind::Q8Planes, false), Some("matvec_mma_q8p"));
        assert_eq!(mma_kernel_name(MatvecKind::Q4KDp4a, true), Some("matvec_mma_q4k_w16"));
        assert_eq!(mma_kernel_name(MatvecKind::Q8_0Blocks, true), None);
    }

    #[test]
    fn only_launches_that_leave_compute_units_idle_take_the_wide_mma_build() {
        // The 1.4B model on an H100 (132 SMs): o / down 96 tiles, q/k/v 128, gate/up 1120.
        assert!(mma_wide(96, Some(132)));
        assert!(mma_wide(128, Some(132)));
        assert!(!mma_wide(132, Some(132)));
        assert!(!mma_wide(1120, Some(132)));
        // Unknown unit count (or the option off): the 8-wave build.
        assert!(!mma_wide(96, None));
    }

    #[test]
    fn newest_compiler_folder_is_the_default() {
        let dir = tempfile::tempdir().unwrap();
        for tag in ["clang-19.1.7", "clang-22.1.8", "clang-9.0.0"] {
            std::fs::create_dir_all(dir.path().join("build/kernels").join(tag).join("sm_90")).unwrap();
        }
        std::fs::create_dir_all(dir.path().join("build/kernels/clang-23.0.0/gfx1151")).unwrap();
        let d = default_kernel_dir(dir.path(), "sm_90").unwrap();
        assert!(d.ends_with("clang-22.1.8/sm_90"), "{}", d.display());
        assert!(default_kernel_dir(dir.path(), "sm_80").is_none());
    }

    fn pool() -> Arc<Pool> {
        pool_keeping(usize::MAX)
    }

    fn pool_keeping(max_free_bytes: usize) -> Arc<Pool> {
        Arc::new(Pool { free: Mutex::new(HashMap::new()), max_free_bytes, release: Box::new(|_| {}), unmap: Box::new(|_| {}) })
    }

    #[test]
    fn a_pool_over_its_limit_gives_back_the_largest_buffers_first() {
        let p = pool_keeping(1000);
        for (class, ptr) in [(512, 0x2000), (256, 0x9000), (512, 0x3000), (256, 0x8000), (512, 0x1000)] {
            drop(pooled(&p, class, ptr));
        }
        // 2,048 bytes held: three 512-byte buffers go, the highest addresses first, and the
        // small ones every step reuses stay.
        assert_eq!(p.over_limit(), [0x3000, 0x2000, 0x1000]);
        assert!(p.over_limit().is_empty(), "512 bytes held, under the limit");
        assert_eq!(p.take(256), Some(0x8000));
        assert_eq!(p.take(512), None);
        // At the limit exactly, nothing goes.
        let p = pool_keeping(1024);
        for ptr in [0x1000, 0x2000] {
            drop(pooled(&p, 512, ptr));
        }
        assert!(p.over_limit().is_empty());
    }

    fn pooled(pool: &Arc<Pool>, class: usize, ptr: DevicePtr) -> DevBuf {
        DevBuf { ptr, class, pooled: true, host: 0, pool: pool.clone() }
    }

    #[test]
    fn a_pool_hands_out_the_lowest_free_address_whatever_order_buffers_came_back_in() {
        // Three buffers of one class, freed in two different orders (a prefill's order, a
        // decode step's): the next steps get the same addresses either way.
        for order in [[0x3000, 0x1000, 0x2000], [0x1000, 0x2000, 0x3000]] {
            let p = pool();
            for ptr in order {
                drop(pooled(&p, 512, ptr));
            }
            for _step in 0..3 {
                // Two live at once, freed in allocation order (which a last-freed-first pool
                // would swap at every step).
                let a = pooled(&p, 512, p.take(512).unwrap());
                let b = pooled(&p, 512, p.take(512).unwrap());
                assert_eq!((a.ptr, b.ptr), (0x1000, 0x2000), "order {order:x?}");
                drop(a);
                drop(b);
            }
            assert_eq!(p.take(1024), None, "another class has nothing free");
        }
    }

    #[test]
    fn kv_caches_of_similar_size_share_a_size_class() {
        for bytes in (1..200_000).step_by(97).chain([4096, 4097, 1 << 20, (1 << 20) + 1, 3 << 30]) {
            let c = kv_size_class(bytes);
            assert!(c >= bytes, "{bytes} -> {c}");
            assert!(c <= (bytes + 255).max(bytes + bytes / 8), "{bytes} -> {c}: more than 12.5% over");
            assert_eq!(kv_size_class(c), c, "a class is its own class");
        }
        // 1.4B bench model (2 KV heads x 128, f16: 512 bytes a position): 130 and 141
        // positions (a 1-token prompt + 129, a 12-token prompt + 129) share one class.
        assert_eq!(kv_size_class(130 * 512), kv_size_class(141 * 512));
        assert_ne!(kv_size_class(130 * 512), kv_size_class(150 * 512));
    }

    #[test]
    fn kernel_arguments_are_slots_of_their_values() {
        let a = Args::default().ptr(0xdead_beef_0000).i32(7).f32(1.5);
        assert_eq!(a.slots, vec![0xdead_beef_0000, 7, 1.5f32.to_bits() as u64]);
    }
}
