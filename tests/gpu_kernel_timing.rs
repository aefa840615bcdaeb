//! How the GPU backend times kernels inside replayed decode graphs, on the fake device
//! (tests/common/fake_gpu.rs): with clock stamps between the launches (kernels/timestamp.hip)
//! where the device has a steady clock, with event nodes where not. Its own test binary: the
//! kernel registry is one per process, and this test reads exact sums from it.

mod common;
use civetta::backend::gpu::{GpuBackend, GpuOptions};
use civetta::engine::{Engine, EngineConfig, KernelTimingConfig};
use civetta::kernel_registry::registry;
use common::fake_gpu::{decode_test_model, fake_options, FakeGpu, FAKE_EVENT_NANOS, FAKE_LAUNCH_TICKS};
use common::*;
use std::sync::Arc;

/// The fake's clock says it runs at 100 MHz (as AMD's REALTIME counter): a launch between two
/// stamps is 3,000 ticks, 30 us, which only a conversion with the stated rate gives.
const CLOCK_HZ: u64 = 100_000_000;
const STAMPED_NANOS: u64 = FAKE_LAUNCH_TICKS * 1_000_000_000 / CLOCK_HZ;

/// Timed samples per source, summed over the kernels: (from event pairs, from clock stamps).
/// Every event sample reads 1 us and every stamp sample 30 us on the fake, so each kernel's
/// count and sum must split into whole numbers of both; a stamp read at the wrong slot (a copy's
/// interval, two launches, a missing reading) would not.
fn samples_by_source() -> (u64, u64) {
    let (mut events, mut stamps) = (0, 0);
    for k in registry().snapshot().into_iter().filter(|k| k.key.backend == "fake" && k.timed_calls > 0) {
        let nanos = (k.timed_seconds * 1e9).round() as u64;
        let extra = nanos.checked_sub(k.timed_calls * FAKE_EVENT_NANOS).expect("no sample is shorter than an event pair's");
        let step = STAMPED_NANOS - FAKE_EVENT_NANOS;
        assert_eq!(extra % step, 0, "{}: {} samples summing to {nanos} ns are not 1 us and 30 us ones", k.key.kernel, k.timed_calls);
        stamps += extra / step;
        events += k.timed_calls - extra / step;
    }
    (events, stamps)
}

/// One request of 60 decode steps at a sample rate of 1/4: the first steps run eagerly (their
/// sampled launches timed by event pairs), the rest replay a graph, every fourth replay timed.
/// With stamps on, those timed replays read the device clock between launches and create no
/// events; with stamps off, or without a steady clock, they use event nodes as before.
#[test]
fn timed_graph_replays_read_the_device_clock_between_launches_where_there_is_one() {
    let dir = tempfile::tempdir().unwrap();
    let model = decode_test_model(dir.path());
    let kernels = tempfile::tempdir().unwrap();
    let run = |api: FakeGpu, stamps: bool| {
        registry().reset();
        let opts = GpuOptions { timing_stamps: stamps, ..fake_options(kernels.path()) };
        let be = Arc::new(GpuBackend::new(api, &opts).unwrap());
        let cfg = EngineConfig {
            model_path: model.clone(),
            max_active_sequences: 1,
            context_length: 512,
            kernel_timing: KernelTimingConfig { enabled: true, sample_rate: Some(0.25) },
            ..EngineConfig::default()
        };
        let engine = Engine::load_on(cfg, be.clone()).unwrap();
        generate_to_end(&engine, vec![1, 2, 3], 60);
        let (captures, replays) = be.graph_counts();
        assert!(captures >= 1 && replays >= 40, "the decode steps replay a graph ({captures} captures, {replays} replays)");
        samples_by_source()
    };

    let api = FakeGpu::with_steady_clock(CLOCK_HZ);
    let (events, stamps) = run(api.clone(), true);
    assert!(stamps >= 100, "timed replays were sampled from the stamps ({stamps} samples)");
    assert!(events > 0, "eager steps are still timed by events");
    // One stamp before every op of a timed replay and one after the last: more stamps than
    // launch samples, and at most one extra per timed replay plus the tape's copies.
    assert!(api.stamp_launches() > stamps, "{} stamp launches for {stamps} samples", api.stamp_launches());

    let off = FakeGpu::with_steady_clock(CLOCK_HZ);
    let (events_off, stamps_off) = run(off.clone(), false);
    assert_eq!((stamps_off, off.stamp_launches()), (0, 0), "engine.gpu.timing_stamps = false times replays with events");
    assert!(events_off >= events + stamps, "the replays' launches are timed by events instead ({events_off} samples)");

    let no_clock = FakeGpu::default();
    let (_, stamps_no_clock) = run(no_clock.clone(), true);
    assert_eq!((stamps_no_clock, no_clock.stamp_launches()), (0, 0), "a device without a steady clock times with events");
}
