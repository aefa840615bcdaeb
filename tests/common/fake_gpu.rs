//! A `GpuApi` with no device behind it: allocations are numbered addresses (with an optional
//! byte budget, so out-of-memory can be provoked), launches and copies do nothing, downloads
//! return zeros (except what a clock stamp wrote, below), and graph capture works as the
//! drivers' does from the backend's side (begin, queued work, end, launch). The shared GPU backend runs on it unchanged, so its host-side
//! logic (tapes, graphs, pooled buffers, KV reuse, kernel timing) is tested without a GPU.
//! Nothing it computes is a number: never compare its outputs.
//!
//! Timing: every event pair reads 1 us. With `with_steady_clock`, the fake also has a device
//! clock that every launch (run eagerly or replayed from a graph) advances by 3,000 ticks, and it runs
//! the one kernel whose effect the backend reads back, `civetta_time_stamp`: it writes the
//! clock to its slot, and downloads of those bytes return it.

use civetta::backend::gpu::api::{DevicePtr, EventHandle, FunctionHandle, GpuApi, GraphHandle};
use civetta::backend::gpu::{kernel_image_names, GpuOptions};
use civetta::backend::{Error, Result};
use civetta::kernel_registry::KernelResources;
use std::collections::HashMap;
use std::ffi::c_void;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Clones share one device, so a test keeps a clone to look at what the backend did.
#[derive(Clone, Default)]
pub struct FakeGpu {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    /// Bytes the device holds; 0 = unlimited.
    budget: usize,
    /// `GpuApi::steady_clock_hz`.
    clock_hz: Option<u64>,
    /// `GpuApi::compute_units`.
    compute_units: Option<usize>,
    state: Mutex<State>,
}

/// Ticks every launch but a stamp's advances the fake clock.
pub const FAKE_LAUNCH_TICKS: u64 = 3_000;
/// What every fake event pair reads.
pub const FAKE_EVENT_NANOS: u64 = 1_000;

/// A launch as the fake runs it: a clock stamp into an address, or any other kernel.
#[derive(Clone, Copy)]
enum FakeLaunch {
    Stamp(DevicePtr),
    Other,
}

#[derive(Default)]
struct State {
    next_addr: u64,
    live: HashMap<DevicePtr, usize>,
    next_handle: u64,
    capturing: bool,
    failed_allocs: u64,
    /// Launches queued while capturing, and those of every captured graph.
    captured: Vec<FakeLaunch>,
    graphs: HashMap<u64, Vec<FakeLaunch>>,
    /// The device clock, in ticks.
    clock: u64,
    /// What stamps wrote, by address.
    stamps: HashMap<DevicePtr, u64>,
    stamp_launches: u64,
    /// Kernel names by function handle, and the block size of every launch by kernel name.
    names: HashMap<FunctionHandle, String>,
    blocks: HashMap<String, Vec<u32>>,
}

impl State {
    fn used(&self) -> usize {
        self.live.values().sum()
    }

    fn run(&mut self, l: FakeLaunch) {
        match l {
            FakeLaunch::Stamp(at) => {
                self.stamps.insert(at, self.clock);
                self.stamp_launches += 1;
            }
            FakeLaunch::Other => self.clock += FAKE_LAUNCH_TICKS,
        }
    }
}

impl FakeGpu {
    pub fn with_budget(bytes: usize) -> FakeGpu {
        FakeGpu { shared: Arc::new(Shared { budget: bytes, ..Shared::default() }) }
    }

    /// A device whose stamp kernel reads a clock that says it runs at `hz` ticks per second.
    pub fn with_steady_clock(hz: u64) -> FakeGpu {
        FakeGpu { shared: Arc::new(Shared { clock_hz: Some(hz), ..Shared::default() }) }
    }

    /// A device with `units` compute units (`GpuApi::compute_units`).
    pub fn with_compute_units(units: usize) -> FakeGpu {
        FakeGpu { shared: Arc::new(Shared { compute_units: Some(units), ..Shared::default() }) }
    }

    /// The block size (threads) of every launch of the kernel `name` queued so far, captured
    /// launches included (each once, when queued).
    pub fn launch_blocks(&self, name: &str) -> Vec<u32> {
        self.state().blocks.get(name).cloned().unwrap_or_default()
    }

    /// Stamp kernels run so far (eagerly or in graph replays).
    pub fn stamp_launches(&self) -> u64 {
        self.state().stamp_launches
    }

    /// Device bytes allocated and not freed.
    pub fn used_bytes(&self) -> usize {
        self.state().used()
    }

    /// Allocations refused for lack of memory so far.
    pub fn failed_allocs(&self) -> u64 {
        self.state().failed_allocs
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap()
    }

    fn handle(&self) -> u64 {
        let mut s = self.state();
        s.next_handle += 1;
        s.next_handle
    }
}

/// Options for a backend on the fake device: an empty image per kernel file in `dir` (the
/// fake loads anything), everything else the defaults.
pub fn fake_options(dir: &Path) -> GpuOptions {
    for name in kernel_image_names() {
        std::fs::write(dir.join(format!("{name}.ptx")), b"").unwrap();
    }
    GpuOptions { kernel_dir: dir.to_path_buf(), ..GpuOptions::default() }
}

/// A 2-layer llama in `dir` with the decode path of scripts/gpu-check.sh's 1.4B bench model
/// (Q8_0, head size 64: the GPU attention kernels' smallest), small enough for the fake.
pub fn decode_test_model(dir: &Path) -> std::path::PathBuf {
    let model = dir.join("llama-d64.gguf");
    let out = super::civetta()
        .args(["model", "synth", "--arch", "llama", "--quant", "q8_0", "--size", "1b", "--layers", "2", "--dim", "256"])
        .args(["--ffn", "512", "--heads", "4", "--kv-heads", "2", "--context", "512", "--seed", "1", "-o"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(out.status.success(), "synth: {}", String::from_utf8_lossy(&out.stderr));
    model
}

impl GpuApi for FakeGpu {
    fn backend_name(&self) -> &'static str {
        "fake"
    }
    fn device_name(&self) -> String {
        "fake device".into()
    }
    fn arch(&self) -> String {
        "sm_90".into()
    }
    fn kernel_extension(&self) -> &'static str {
        "ptx"
    }
    fn occupancy_unit(&self) -> &'static str {
        "blocks_per_sm"
    }
    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        let mut s = self.state();
        if self.shared.budget > 0 && s.used() + bytes > self.shared.budget {
            s.failed_allocs += 1;
            return Err(Error::OutOfMemory { backend: "fake", bytes });
        }
        // Addresses are never reused (a real driver may reuse them; the backend must not
        // depend on either).
        let ptr = 0x1_0000_0000 + s.next_addr;
        s.next_addr += (bytes as u64).next_multiple_of(256);
        s.live.insert(ptr, bytes);
        Ok(ptr)
    }
    fn free(&self, ptr: DevicePtr) {
        self.state().live.remove(&ptr).expect("free of an address that is not allocated");
    }
    fn upload(&self, _dst: DevicePtr, _src: &[u8]) -> Result<()> {
        Ok(())
    }
    fn download(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        let s = self.state();
        for (i, chunk) in dst.chunks_mut(8).enumerate() {
            let v = s.stamps.get(&(src + 8 * i as u64)).copied().unwrap_or(0);
            chunk.copy_from_slice(&v.to_le_bytes()[..chunk.len()]);
        }
        Ok(())
    }
    fn copy(&self, _dst: DevicePtr, _src: DevicePtr, _bytes: usize) -> Result<()> {
        Ok(())
    }
    fn load_module(&self, _image: &[u8]) -> Result<u64> {
        Ok(self.handle())
    }
    fn function(&self, _module: u64, name: &str) -> Result<FunctionHandle> {
        let f = FunctionHandle(self.handle());
        self.state().names.insert(f, name.to_string());
        Ok(f)
    }
    unsafe fn launch(
        &self,
        f: FunctionHandle,
        _grid: [u32; 3],
        block: [u32; 3],
        _shared_bytes: u32,
        params: &mut [*mut c_void],
        _overlap_previous: bool,
    ) -> Result<()> {
        let mut s = self.state();
        let name = s.names.get(&f).cloned().unwrap_or_default();
        let launch = if name == "civetta_time_stamp" {
            // SAFETY: the backend passes civetta_time_stamp(u64* stamps, int slot), each
            // argument in an 8-byte slot.
            let (buf, slot) = unsafe { (*(params[0] as *const u64), *(params[1] as *const u64) as u32 as u64) };
            FakeLaunch::Stamp(buf + 8 * slot)
        } else {
            FakeLaunch::Other
        };
        s.blocks.entry(name).or_default().push(block[0]);
        if s.capturing {
            s.captured.push(launch);
        } else {
            s.run(launch);
        }
        Ok(())
    }
    fn event_create(&self) -> Result<EventHandle> {
        Ok(EventHandle(self.handle()))
    }
    fn event_record(&self, _e: EventHandle) -> Result<()> {
        Ok(())
    }
    fn event_elapsed(&self, _start: EventHandle, _end: EventHandle) -> Result<Duration> {
        Ok(Duration::from_nanos(FAKE_EVENT_NANOS))
    }
    fn event_destroy(&self, _e: EventHandle) {}
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn capture_begin(&self) -> Result<()> {
        let mut s = self.state();
        assert!(!s.capturing, "capture begun twice");
        s.capturing = true;
        Ok(())
    }
    fn capture_end(&self) -> Result<GraphHandle> {
        let g = self.handle();
        let mut s = self.state();
        s.capturing = false;
        let launches = std::mem::take(&mut s.captured);
        s.graphs.insert(g, launches);
        Ok(GraphHandle(g))
    }
    fn graph_launch(&self, g: GraphHandle) -> Result<()> {
        let mut s = self.state();
        let launches = s.graphs.get(&g.0).expect("launch of a graph that was not captured").clone();
        launches.into_iter().for_each(|l| s.run(l));
        Ok(())
    }
    fn graph_destroy(&self, g: GraphHandle) {
        self.state().graphs.remove(&g.0).expect("destroy of a graph that was not captured");
    }
    fn steady_clock_hz(&self) -> Option<u64> {
        self.shared.clock_hz
    }
    fn compute_units(&self) -> Option<usize> {
        self.shared.compute_units
    }
    fn resources(&self, _image: &[u8], _name: &str, _f: FunctionHandle, _block_threads: u32) -> Option<KernelResources> {
        None
    }
}
