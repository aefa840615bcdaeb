//! The GPU backend's host side on a fake device (tests/common/fake_gpu.rs): which tapes
//! become graphs, how buffers are reused, what happens when the device is full. The kernels
//! themselves run only on a GPU (scripts/gpu-check.sh); nothing here computes a number.

mod common;
use civetta::backend::gpu::api::GpuApi;
use civetta::backend::gpu::{GpuBackend, GpuOptions};
use civetta::backend::Backend;
use civetta::engine::{Engine, EngineConfig};
use common::fake_gpu::{decode_test_model, fake_options, FakeGpu};
use common::*;
use std::sync::Arc;

/// `civetta bench`'s runs on one engine: prefills of 400 tokens, then tg runs, each a new
/// request of one prompt token and the same number of decode steps. After the first, a request
/// like the last one replays the decode graphs captured before and captures none (its KV
/// caches are the last one's, from the backend's pool): on the device, a new tape costs an
/// eager step, a capture (0.8-1.3 ms on an H100) and, with kernel timing on, a timed twin
/// (1.6-2.1 ms; session 17's logs, docs/GPU.md).
#[test]
fn a_request_like_the_last_one_replays_the_graphs_captured_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = decode_test_model(dir.path());
    let kernels = tempfile::tempdir().unwrap();
    let api = FakeGpu::default();
    let be = Arc::new(GpuBackend::new(api.clone(), &fake_options(kernels.path())).unwrap());
    let cfg = EngineConfig {
        model_path: model,
        max_active_sequences: 1,
        context_length: 512,
        prefill_batch: 2048,
        max_batch_tokens: 2048,
        kernel_timing: civetta::engine::KernelTimingConfig { enabled: true, sample_rate: Some(0.05) },
        ..EngineConfig::default()
    };
    let engine = Engine::load_on(cfg, be.clone()).unwrap();
    for r in 0..4u32 {
        // Prompts that differ (no prefix-cache hit), as bench's pp runs.
        generate_to_end(&engine, (0..400).map(|i| 1 + (i + r) % 200).collect(), 1);
    }
    let mut captures = Vec::new();
    for _ in 0..4 {
        generate_to_end(&engine, vec![1], 41);
        captures.push(be.graph_counts().0);
    }
    let (total, replays) = be.graph_counts();
    assert!(replays > 100, "the decode steps replay graphs ({replays} replays, {total} captures)");
    assert!(captures[0] >= 1, "the first request captures its decode step: {captures:?}");
    assert_eq!(captures[1..], [captures[1]; 3], "captures after each request: {captures:?}");
    assert_eq!(captures[1], captures[0], "the second request captured new graphs: {captures:?}");
    // A request of another length whose caches fall in the same size class (2 prompt
    // tokens instead of 1: 44 positions instead of 43, 256 bytes each, both in the 11 KiB
    // class of `kv_size_class`) decodes on the same graphs too.
    generate_to_end(&engine, vec![1, 2], 41);
    assert_eq!(be.graph_counts().0, captures[0], "a request one token longer captured new graphs");
}

/// Step limits left unset resolve to the GPU defaults when the engine loads: 512-row prompt
/// chunks in a 2048-row step, and no cut of a long prompt's chunks while others decode (a GPU
/// step's cost is mostly fixed, so cutting only multiplies steps: engine/types.rs).
#[test]
fn unset_step_limits_take_the_gpu_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let model = decode_test_model(dir.path());
    let kernels = tempfile::tempdir().unwrap();
    let be = Arc::new(GpuBackend::new(FakeGpu::default(), &fake_options(kernels.path())).unwrap());
    let cfg = EngineConfig { model_path: model, max_active_sequences: 1, context_length: 512, ..EngineConfig::default() };
    let engine = Engine::load_on(cfg, be).unwrap();
    let c = engine.config();
    assert_eq!((c.prefill_batch, c.max_batch_tokens, c.max_decode_slowdown), (512, 2048, Some(0.0)));
    engine.shutdown();
}

/// A KV cache freed by a finished sequence stays in the backend's pool for the next one of
/// its size class; a sequence of another size that finds the device full gets the pool's buffers
/// given back to the driver and its allocation tried again, instead of failing.
#[test]
fn a_full_device_gets_the_pooled_kv_caches_back_before_an_allocation_fails() {
    let kernels = tempfile::tempdir().unwrap();
    let api = FakeGpu::with_budget(1 << 20);
    let be = GpuBackend::new(api.clone(), &fake_options(kernels.path())).unwrap();
    let elem = be.kv_cache_elem_bytes();
    let base = api.used_bytes(); // what loading took (the positions buffer and such)
    let kv = be.alloc_kv_cache((512 << 10) / elem).unwrap();
    drop(kv); // to the pool, still allocated on the device (sizes of whole size classes)
    assert_eq!(api.used_bytes() - base, 512 << 10);
    let again = be.alloc_kv_cache((512 << 10) / elem).unwrap();
    assert_eq!(api.used_bytes() - base, 512 << 10, "the same size reuses the pooled cache");
    drop(again);
    let similar = be.alloc_kv_cache((500 << 10) / elem).unwrap();
    assert_eq!(api.used_bytes() - base, 512 << 10, "a size of the same class reuses it too");
    drop(similar);
    // 768 KiB does not fit beside the pooled 512 KiB on a 1 MiB device.
    let other = be.alloc_kv_cache((768 << 10) / elem).unwrap();
    assert_eq!(api.failed_allocs(), 1, "the first try failed");
    assert_eq!(api.used_bytes() - base, 768 << 10, "the pooled cache went back to the driver");
    drop(other);
    let err = be.alloc_kv_cache((2 << 20) / elem).err().expect("2 MiB on a 1 MiB device");
    assert!(format!("{err}").contains("out of device memory"), "{err}");
    assert_eq!(api.failed_allocs(), 3, "tried again once after giving the pool back");
}

/// Freed buffers beyond `engine.gpu.pool_free_bytes` go back to the driver at the next point
/// the stream is idle; those within it stay pooled for the next request of their size class.
#[test]
fn freed_kv_caches_beyond_the_pool_limit_go_back_to_the_driver() {
    let kernels = tempfile::tempdir().unwrap();
    let api = FakeGpu::default();
    let opts = GpuOptions { pool_free_bytes: 768 << 10, ..fake_options(kernels.path()) };
    let be = GpuBackend::new(api.clone(), &opts).unwrap();
    let elem = be.kv_cache_elem_bytes();
    let base = api.used_bytes();
    let caches: Vec<_> = (0..3).map(|_| be.alloc_kv_cache((512 << 10) / elem).unwrap()).collect();
    let small = be.alloc_kv_cache((64 << 10) / elem).unwrap();
    drop(caches);
    drop(small);
    assert_eq!(api.used_bytes() - base, (3 * 512 + 64) << 10, "freed caches stay pooled until the stream is idle");
    be.synchronize().unwrap();
    // 1,600 KiB free against a limit of 768 KiB: two 512 KiB caches go, one stays with the small one.
    assert_eq!(api.used_bytes() - base, (512 + 64) << 10);
    let again = be.alloc_kv_cache((512 << 10) / elem).unwrap();
    assert_eq!(api.used_bytes() - base, (512 + 64) << 10, "the kept cache is reused");
    drop(again);
    be.synchronize().unwrap();
    assert_eq!(api.used_bytes() - base, (512 + 64) << 10, "within the limit nothing goes");
}

/// A batched mat-vec on the matrix units takes the 16-wave build (512 threads) where its
/// launch has fewer 16-row tiles than the device has compute units, the 8-wave build (256)
/// otherwise, and always the 8-wave one where the unit count is unknown or
/// `engine.gpu.matvec_mma_wide` is off.
#[test]
fn batched_mat_vecs_with_fewer_tiles_than_compute_units_take_the_16_wave_build() {
    let dir = tempfile::tempdir().unwrap();
    let model = decode_test_model(dir.path());
    let file = Arc::new(civetta::gguf::GgufFile::open(&model).unwrap());
    // The model's o projection: 256 x 256, Q8_0, so 16 tiles of 16 rows.
    let name = "blk.0.attn_output.weight";
    for (api, wide_option, wide) in [
        (FakeGpu::with_compute_units(17), true, true),
        (FakeGpu::with_compute_units(16), true, false),
        (FakeGpu::with_compute_units(17), false, false),
        (FakeGpu::default(), true, false),
    ] {
        let kernels = tempfile::tempdir().unwrap();
        let opts = GpuOptions { matvec_mma_wide: wide_option, ..fake_options(kernels.path()) };
        let be = GpuBackend::new(api.clone(), &opts).unwrap();
        let w = be.load_weight(&file, name).unwrap();
        let rows = 16;
        let x = be.alloc(rows * w.cols).unwrap();
        let mut y = be.alloc(rows * w.rows).unwrap();
        be.matmul(&w, &x, rows, &mut y).unwrap();
        be.synchronize().unwrap();
        let (w16, w8) = (api.launch_blocks("civetta_matvec_mma_q8p_w16"), api.launch_blocks("civetta_matvec_mma_q8p"));
        let case = format!("compute units {:?}, matvec_mma_wide {wide_option}", api.compute_units());
        if wide {
            assert_eq!((w16, w8), (vec![512], vec![]), "{case}");
        } else {
            assert_eq!((w16, w8), (vec![], vec![256]), "{case}");
        }
    }
}

/// A pass that prefills several prompts beside a decode row stores the prompts' k and v rows in
/// one launch, attends for them in one and for the decode row in one per layer
/// (`engine.gpu.batched_prefill_attention`), instead of two launches per sequence and layer.
/// With that option or `engine.gpu.batched_attention` off, every sequence gets its own launches.
#[test]
fn a_pass_of_several_prompts_attends_in_one_launch_per_layer() {
    let dir = tempfile::tempdir().unwrap();
    let model = decode_test_model(dir.path());
    let file = Arc::new(civetta::gguf::GgufFile::open(&model).unwrap());
    for (decode_batches, prefill_batches) in [(true, true), (true, false), (false, true)] {
        let batched = decode_batches && prefill_batches;
        let api = FakeGpu::default();
        let kernels = tempfile::tempdir().unwrap();
        let opts = GpuOptions {
            batched_attention: decode_batches,
            batched_prefill_attention: prefill_batches,
            eager: true,
            ..fake_options(kernels.path())
        };
        let be = Arc::new(GpuBackend::new(api.clone(), &opts).unwrap());
        let m = civetta::model::Model::load(file.clone(), be.clone()).unwrap();
        let layers = m.hp.n_layer;
        let mut caches: Vec<_> = (0..4).map(|_| m.new_cache(80).unwrap()).collect();
        let (a, b, c) = (vec![3u32; 20], vec![5u32; 70], vec![7u32; 9]);
        let [c0, c1, c2, c3] = &mut caches[..] else { unreachable!() };
        m.forward(c3, &[1, 2], civetta::model::Logits::Last).unwrap();
        let lens = |api: &FakeGpu| {
            [
                "civetta_attn_prefill_batch_mma_d64",
                "civetta_kv_store_prefill_batch_f16",
                "civetta_attn_decode_rows_d64",
                "civetta_attn_prefill_mma_d64",
                "civetta_attn_decode_pos_d64",
            ]
            .map(|k| api.launch_blocks(k).len())
        };
        let before = lens(&api);
        use civetta::model::{Logits, SeqRows};
        m.forward_batch(&mut [
            SeqRows { cache: &mut *c0, tokens: &a, logits: Logits::Last },
            SeqRows { cache: &mut *c3, tokens: &[4], logits: Logits::Last },
            SeqRows { cache: &mut *c1, tokens: &b, logits: Logits::Last },
            SeqRows { cache: &mut *c2, tokens: &c, logits: Logits::Last },
        ])
        .unwrap();
        be.synchronize().unwrap();
        let after = lens(&api);
        let launched: Vec<usize> = after.iter().zip(before).map(|(a, b)| a - b).collect();
        if batched {
            assert_eq!(launched, [layers, layers, layers, 0, 0], "batched prefill and decode rows");
        } else {
            assert_eq!(launched, [0, 0, 0, 3 * layers, layers], "per-sequence prefill and decode");
        }
    }
}
