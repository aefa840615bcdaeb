//! A `GpuApi` with no device behind it: allocations are numbered addresses (with an optional
//! byte budget, so out-of-memory can be provoked), launches and copies do nothing, downloads return zeros, and graph capture works as the drivers' does from the
//! backend's side (begin, queued work, end, launch). The shared GPU backend runs on it
//! unchanged, so its host-side logic (tapes, graphs, pooled buffers, KV reuse) is tested
//! without a GPU. Nothing it computes is a number: never compare its outputs.

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
    state: Mutex<State>,
}

impl State {
    fn used(&self) -> usize {
        self.live.values().sum()
    }
}

#[derive(Default)]
struct State {
    next_addr: u64,
    live: HashMap<DevicePtr, usize>,
    next_handle: u64,
    capturing: bool,
    failed_allocs: u64,
}

impl FakeGpu {
    pub fn with_budget(bytes: usize) -> FakeGpu {
        FakeGpu { shared: Arc::new(Shared { budget: bytes, ..Shared::default() }) }
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
    fn download(&self, _src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        dst.fill(0);
        Ok(())
    }
    fn copy(&self, _dst: DevicePtr, _src: DevicePtr, _bytes: usize) -> Result<()> {
        Ok(())
    }
    fn load_module(&self, _image: &[u8]) -> Result<u64> {
        Ok(self.handle())
    }
    fn function(&self, _module: u64, _name: &str) -> Result<FunctionHandle> {
        Ok(FunctionHandle(self.handle()))
    }
    unsafe fn launch(
        &self,
        _f: FunctionHandle,
        _grid: [u32; 3],
        _block: [u32; 3],
        _shared_bytes: u32,
        _params: &mut [*mut c_void],
        _overlap_previous: bool,
    ) -> Result<()> {
        Ok(())
    }
    fn event_create(&self) -> Result<EventHandle> {
        Ok(EventHandle(self.handle()))
    }
    fn event_record(&self, _e: EventHandle) -> Result<()> {
        Ok(())
    }
    fn event_elapsed(&self, _start: EventHandle, _end: EventHandle) -> Result<Duration> {
        Ok(Duration::from_micros(1))
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
        self.state().capturing = false;
        Ok(GraphHandle(self.handle()))
    }
    fn graph_launch(&self, _g: GraphHandle) -> Result<()> {
        Ok(())
    }
    fn resources(&self, _image: &[u8], _name: &str, _f: FunctionHandle, _block_threads: u32) -> Option<KernelResources> {
        None
    }
}
