//! The thin driver interface the shared GPU backend is written against.
//!
//! One implementation per vendor runtime (`cuda.rs` over the CUDA driver API through cudarc,
//! `hip.rs` over the HIP runtime through hip-runtime-sys). Everything above it (weight
//! formats, kernel choice, launch geometry, timing, buffer pooling) lives once in `mod.rs`,
//! so the HIP and CUDA paths differ only in these calls and in the compiled kernels.
//!
//! All work goes to one stream per device, in order; host copies into the device are
//! stream-ordered and the host memory may be reused as soon as the call returns.

use crate::backend::{Error, Result};
use crate::kernel_registry::KernelResources;
use std::ffi::c_void;
use std::time::Duration;

/// A device address.
pub type DevicePtr = u64;

/// A loaded kernel function (a `CUfunction` / `hipFunction_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FunctionHandle(pub u64);

/// A timing event (`CUevent` / `hipEvent_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventHandle(pub u64);

/// An instantiated graph of captured stream work (`CUgraphExec` / `hipGraphExec_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphHandle(pub u64);

pub trait GpuApi: Send + Sync + 'static {
    /// "cuda" or "hip".
    fn backend_name(&self) -> &'static str;
    /// Marketing name of the device, e.g. "NVIDIA H200".
    fn device_name(&self) -> String;
    /// Compile target of the device: "sm_90", "gfx1151".
    fn arch(&self) -> String;
    /// Extension of the kernel images this runtime loads ("ptx", "hsaco").
    fn kernel_extension(&self) -> &'static str;
    /// Unit of `KernelResources::occupancy` ("blocks_per_sm", "waves_per_simd").
    fn occupancy_unit(&self) -> &'static str;

    fn alloc(&self, bytes: usize) -> Result<DevicePtr>;
    fn free(&self, ptr: DevicePtr);
    /// Host to device, ordered on the stream; `src` may be reused when this returns.
    fn upload(&self, dst: DevicePtr, src: &[u8]) -> Result<()>;
    /// Device to host after all queued work; blocks until the bytes are in `dst`.
    fn download(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()>;
    /// Makes host memory (a tensor in the mapped GGUF file) readable by kernels in place and
    /// returns its device address: unified memory on Strix Halo. Not every runtime can.
    fn map_host(&self, _bytes: &[u8]) -> Result<DevicePtr> {
        Err(Error::unsupported(self.backend_name(), "weights in host memory (use engine.gpu.weights = \"device\")"))
    }
    /// Undoes `map_host` for the host address it was given.
    fn unmap_host(&self, _host: *const u8) {}
    /// Page-locks host memory that `download` will fill (faster copies than from pageable
    /// memory); `false` if the runtime would not.
    fn pin_host(&self, _host: *mut u8, _bytes: usize) -> bool {
        false
    }
    /// Undoes `pin_host` for the host address it was given.
    fn unpin_host(&self, _host: *mut u8) {}
    /// Device to device, ordered on the stream.
    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()>;

    /// Loads one kernel image (PTX text or an AMDGPU code object).
    fn load_module(&self, image: &[u8]) -> Result<u64>;
    fn function(&self, module: u64, name: &str) -> Result<FunctionHandle>;
    /// Queues a launch. `params` point at the kernel arguments, in order. `overlap_previous`:
    /// the kernel waits for the stream's previous kernel itself (`cv_wait_prior_kernels` in
    /// kernels/civetta_gpu.h), so it may start while that one finishes (CUDA's programmatic
    /// dependent launch, sm_90+). A runtime without such launches queues a plain one.
    ///
    /// # Safety
    /// The parameters must match the kernel's signature and every pointer argument must
    /// address live device memory large enough for the launch geometry.
    unsafe fn launch(
        &self,
        f: FunctionHandle,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        params: &mut [*mut c_void],
        overlap_previous: bool,
    ) -> Result<()>;

    fn event_create(&self) -> Result<EventHandle>;
    fn event_record(&self, e: EventHandle) -> Result<()>;
    /// Records `e` while the stream is being captured, as a node of the graph (so that each
    /// replay records it and it can time the launches around it).
    fn event_record_captured(&self, e: EventHandle) -> Result<()> {
        self.event_record(e)
    }
    /// Time between two recorded events that have completed.
    fn event_elapsed(&self, start: EventHandle, end: EventHandle) -> Result<Duration>;
    fn event_destroy(&self, e: EventHandle);
    /// Ticks per second of the steady clock kernels read with `__builtin_readsteadycounter`
    /// (kernels/timestamp.hip), when it is fine enough to time single launches; None: kernel
    /// timing inside graphs uses events.
    fn steady_clock_hz(&self) -> Option<u64> {
        None
    }
    /// The device's compute units (NVIDIA SMs, AMD CUs), where the runtime says; None: unknown.
    fn compute_units(&self) -> Option<usize> {
        None
    }
    /// Waits for everything queued on the stream.
    fn synchronize(&self) -> Result<()>;

    /// Starts capturing the work queued on the stream (from this thread) into a graph
    /// instead of running it. Runtimes without graphs refuse, and the caller launches eagerly.
    fn capture_begin(&self) -> Result<()> {
        Err(Error::unsupported(self.backend_name(), "graph capture"))
    }
    /// Ends the capture begun by `capture_begin` and instantiates the graph. Must be called
    /// after every successful `capture_begin`, also when queuing failed in between.
    fn capture_end(&self) -> Result<GraphHandle> {
        Err(Error::unsupported(self.backend_name(), "graph capture"))
    }
    /// Queues one run of an instantiated graph on the stream.
    fn graph_launch(&self, _g: GraphHandle) -> Result<()> {
        Err(Error::unsupported(self.backend_name(), "graph capture"))
    }
    fn graph_destroy(&self, _g: GraphHandle) {}

    /// Static resources of a loaded kernel at a block size: registers, local/scratch and
    /// shared/LDS bytes from the driver or the code object, and the occupancy they allow.
    /// `image` is the module the function came from (HIP reads its metadata note).
    fn resources(&self, image: &[u8], name: &str, f: FunctionHandle, block_threads: u32) -> Option<KernelResources>;
}
