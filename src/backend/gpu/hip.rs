//! HIP runtime for AMD GPUs (gfx1151 Strix Halo first). hip-runtime-sys links libamdhip64
//! and gives the handle types; the calls are declared here again returning a plain `i32`,
//! because its `hipError_t` is a Rust enum made from HIP 5.4 headers and a newer runtime's
//! unknown code in an enum would be undefined behaviour (shared/notes/amdgpu-clang-here.md).
//! `hipGetDeviceProperties` is avoided (its struct layout changed in ROCm 6): the arch comes
//! from the KFD topology in sysfs, the name from `hipDeviceGetName`.

use super::api::{DevicePtr, EventHandle, FunctionHandle, GpuApi, GraphHandle};
use crate::backend::{Error, Result};
use crate::kernel_registry::KernelResources;
use anyhow::{bail, Context};
use hip_runtime_sys::{hipEvent_t, hipFunction_t, hipGraphExec_t, hipGraphNode_t, hipGraph_t, hipModule_t, hipStream_t};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::time::Duration;

type HipStatus = i32;
const HIP_SUCCESS: HipStatus = 0;
const HIP_ERROR_NO_DEVICE: HipStatus = 100;
const HIP_ERROR_OUT_OF_MEMORY: HipStatus = 2;
const HIP_STREAM_NON_BLOCKING: c_uint = 1;
const HIP_HOST_REGISTER_MAPPED: c_uint = 2;
/// hipStreamCaptureModeThreadLocal.
const HIP_CAPTURE_THREAD_LOCAL: c_int = 1;

extern "C" {
    fn hipInit(flags: c_uint) -> HipStatus;
    fn hipGetDeviceCount(count: *mut c_int) -> HipStatus;
    fn hipSetDevice(device: c_int) -> HipStatus;
    fn hipDeviceGetName(name: *mut c_char, len: c_int, device: c_int) -> HipStatus;
    fn hipDeviceGetAttribute(value: *mut c_int, attr: c_int, device: c_int) -> HipStatus;
    fn hipGetErrorString(e: HipStatus) -> *const c_char;
    fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> HipStatus;
    fn hipFree(ptr: *mut c_void) -> HipStatus;
    fn hipHostRegister(host: *mut c_void, size: usize, flags: c_uint) -> HipStatus;
    fn hipHostUnregister(host: *mut c_void) -> HipStatus;
    fn hipHostGetDevicePointer(dev: *mut *mut c_void, host: *mut c_void, flags: c_uint) -> HipStatus;
    fn hipMemcpyHtoDAsync(dst: *mut c_void, src: *mut c_void, size: usize, stream: hipStream_t) -> HipStatus;
    fn hipMemcpyDtoHAsync(dst: *mut c_void, src: *mut c_void, size: usize, stream: hipStream_t) -> HipStatus;
    fn hipMemcpyDtoDAsync(dst: *mut c_void, src: *mut c_void, size: usize, stream: hipStream_t) -> HipStatus;
    fn hipStreamCreateWithFlags(stream: *mut hipStream_t, flags: c_uint) -> HipStatus;
    fn hipStreamSynchronize(stream: hipStream_t) -> HipStatus;
    fn hipStreamDestroy(stream: hipStream_t) -> HipStatus;
    fn hipModuleLoadData(module: *mut hipModule_t, image: *const c_void) -> HipStatus;
    fn hipModuleGetFunction(f: *mut hipFunction_t, module: hipModule_t, name: *const c_char) -> HipStatus;
    #[allow(clippy::too_many_arguments)]
    fn hipModuleLaunchKernel(
        f: hipFunction_t,
        gx: c_uint,
        gy: c_uint,
        gz: c_uint,
        bx: c_uint,
        by: c_uint,
        bz: c_uint,
        shared: c_uint,
        stream: hipStream_t,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> HipStatus;
    fn hipEventCreate(e: *mut hipEvent_t) -> HipStatus;
    fn hipEventRecord(e: hipEvent_t, stream: hipStream_t) -> HipStatus;
    fn hipEventElapsedTime(ms: *mut f32, start: hipEvent_t, end: hipEvent_t) -> HipStatus;
    fn hipEventDestroy(e: hipEvent_t) -> HipStatus;
    fn hipStreamBeginCapture(stream: hipStream_t, mode: c_int) -> HipStatus;
    fn hipStreamEndCapture(stream: hipStream_t, graph: *mut hipGraph_t) -> HipStatus;
    fn hipGraphInstantiate(
        exec: *mut hipGraphExec_t,
        graph: hipGraph_t,
        error_node: *mut hipGraphNode_t,
        log: *mut c_char,
        log_size: usize,
    ) -> HipStatus;
    fn hipGraphDestroy(graph: hipGraph_t) -> HipStatus;
    fn hipGraphLaunch(exec: hipGraphExec_t, stream: hipStream_t) -> HipStatus;
    fn hipGraphExecDestroy(exec: hipGraphExec_t) -> HipStatus;
}

fn check(r: HipStatus, call: &str) -> Result<()> {
    if r == HIP_SUCCESS {
        return Ok(());
    }
    // SAFETY: hipGetErrorString returns a static string for any code (or "unknown").
    let text = unsafe {
        let p = hipGetErrorString(r);
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Err(Error::Device { backend: "hip", call: call.to_string(), code: r as i64, message: text })
}

pub struct HipApi {
    device: c_int,
    stream: hipStream_t,
    name: String,
    arch: String,
}

// SAFETY: HIP streams may be used from any thread; every entry point selects the device.
unsafe impl Send for HipApi {}
unsafe impl Sync for HipApi {}

/// gfx names of the GPU nodes in the KFD topology, in node order.
fn kfd_archs() -> Vec<String> {
    let Ok(nodes) = std::fs::read_dir("/sys/class/kfd/kfd/topology/nodes") else { return Vec::new() };
    let mut nodes: Vec<(u32, String)> = nodes
        .flatten()
        .filter_map(|e| {
            let idx = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let props = std::fs::read_to_string(e.path().join("properties")).ok()?;
            let target = props.lines().find_map(|l| l.strip_prefix("gfx_target_version "))?.trim().parse().ok()?;
            Some((idx, crate::envinfo::gpu::gfx_arch(target)?))
        })
        .collect();
    nodes.sort();
    nodes.into_iter().map(|(_, a)| a).collect()
}

impl HipApi {
    pub fn new(index: usize, _weights: &str) -> anyhow::Result<HipApi> {
        // SAFETY: plain runtime calls with out-pointers to locals.
        unsafe {
            // Without a GPU (or without /dev/kfd in a container) hipInit fails, with
            // hipErrorNoDevice or hipErrorInvalidDevice depending on the runtime version.
            check(hipInit(0), "hipInit").context("hip backend: no usable AMD GPU (is /dev/kfd passed into the container?)")?;
            let mut count = 0;
            let r = hipGetDeviceCount(&mut count);
            if r == HIP_ERROR_NO_DEVICE || (r == HIP_SUCCESS && count <= 0) {
                bail!("hip backend: no AMD GPU found (hipGetDeviceCount: no device; is /dev/kfd passed into the container?)");
            }
            check(r, "hipGetDeviceCount")?;
            if index >= count as usize {
                bail!("hip backend: device {index} asked for, {count} present");
            }
            let device = index as c_int;
            check(hipSetDevice(device), "hipSetDevice")?;
            let mut name = [0 as c_char; 256];
            check(hipDeviceGetName(name.as_mut_ptr(), name.len() as c_int, device), "hipDeviceGetName")?;
            let name = CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
            let arch = kfd_archs()
                .into_iter()
                .nth(index)
                .context("hip backend: no gfx_target_version for this device in /sys/class/kfd/kfd/topology")?;
            let mut stream = std::ptr::null_mut();
            check(hipStreamCreateWithFlags(&mut stream, HIP_STREAM_NON_BLOCKING), "hipStreamCreateWithFlags")?;
            Ok(HipApi { device, stream, name, arch })
        }
    }

    fn current(&self) -> Result<()> {
        // SAFETY: selecting a device that exists.
        check(unsafe { hipSetDevice(self.device) }, "hipSetDevice")
    }
}

impl GpuApi for HipApi {
    fn backend_name(&self) -> &'static str {
        "hip"
    }

    fn device_name(&self) -> String {
        self.name.clone()
    }

    fn arch(&self) -> String {
        self.arch.clone()
    }

    fn kernel_extension(&self) -> &'static str {
        "hsaco"
    }

    fn occupancy_unit(&self) -> &'static str {
        "waves_per_simd"
    }

    fn compute_units(&self) -> Option<usize> {
        // hipDeviceAttributeMultiprocessorCount: 63 in ROCm 5 and 6's hip_runtime_api.h.
        const MULTIPROCESSOR_COUNT: c_int = 63;
        let mut cus: c_int = 0;
        // SAFETY: an out-pointer to a local.
        check(unsafe { hipDeviceGetAttribute(&mut cus, MULTIPROCESSOR_COUNT, self.device) }, "hipDeviceGetAttribute").ok()?;
        usize::try_from(cus).ok().filter(|&c| c > 0)
    }

    /// The REALTIME counter (100 MHz on gfx11), at hipDeviceAttributeWallClockRate's kHz.
    fn steady_clock_hz(&self) -> Option<u64> {
        // hipDeviceAttributeWallClockRate: 10017 in ROCm 6's hip_runtime_api.h (an enum entry
        // after hipDeviceAttributeAmdSpecificBegin = 10000; the value, not the header, is ABI).
        const WALL_CLOCK_RATE: c_int = 10017;
        let mut khz: c_int = 0;
        // SAFETY: an out-pointer to a local.
        check(unsafe { hipDeviceGetAttribute(&mut khz, WALL_CLOCK_RATE, self.device) }, "hipDeviceGetAttribute").ok()?;
        // Coarser than 10 MHz (0.1 us) would blur launches of a few microseconds.
        (khz >= 10_000).then(|| khz as u64 * 1000)
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.current()?;
        let mut p = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        let r = unsafe { hipMalloc(&mut p, bytes) };
        if r == HIP_ERROR_OUT_OF_MEMORY {
            return Err(Error::OutOfMemory { backend: "hip", bytes });
        }
        check(r, "hipMalloc")?;
        Ok(p as u64)
    }

    fn free(&self, ptr: DevicePtr) {
        if self.current().is_ok() {
            // SAFETY: ptr came from hipMalloc and is freed once.
            unsafe { hipFree(ptr as *mut c_void) };
        }
    }

    fn map_host(&self, bytes: &[u8]) -> Result<DevicePtr> {
        self.current()?;
        let host = bytes.as_ptr() as *mut c_void;
        let mut dev = std::ptr::null_mut();
        // SAFETY: the bytes live in the model's mmap, which outlives every weight (weights
        // hold an Arc of the file); kernels only read them.
        unsafe {
            check(hipHostRegister(host, bytes.len(), HIP_HOST_REGISTER_MAPPED), "hipHostRegister of a mapped tensor")?;
            check(hipHostGetDevicePointer(&mut dev, host, 0), "hipHostGetDevicePointer")?;
        }
        Ok(dev as u64)
    }

    fn unmap_host(&self, host: *const u8) {
        // SAFETY: host was registered by map_host.
        unsafe { hipHostUnregister(host as *mut c_void) };
    }

    fn pin_host(&self, host: *mut u8, bytes: usize) -> bool {
        // SAFETY: the caller keeps the bytes allocated, and unpins them before freeing.
        self.current().is_ok() && unsafe { hipHostRegister(host as *mut c_void, bytes, 0) } == HIP_SUCCESS
    }

    fn unpin_host(&self, host: *mut u8) {
        // SAFETY: host was registered by pin_host.
        unsafe { hipHostUnregister(host as *mut c_void) };
    }

    fn upload(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.current()?;
        // SAFETY: copies from pageable memory are staged before the call returns.
        check(unsafe { hipMemcpyHtoDAsync(dst as *mut c_void, src.as_ptr() as *mut c_void, src.len(), self.stream) }, "hipMemcpyHtoDAsync")
    }

    fn download(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        self.current()?;
        // SAFETY: dst is valid for its length and we wait for the stream.
        unsafe {
            check(hipMemcpyDtoHAsync(dst.as_mut_ptr() as *mut c_void, src as *mut c_void, dst.len(), self.stream), "hipMemcpyDtoHAsync")?;
            check(hipStreamSynchronize(self.stream), "hipStreamSynchronize")
        }
    }

    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.current()?;
        // SAFETY: both are device ranges of at least `bytes`.
        check(unsafe { hipMemcpyDtoDAsync(dst as *mut c_void, src as *mut c_void, bytes, self.stream) }, "hipMemcpyDtoDAsync")
    }

    fn load_module(&self, image: &[u8]) -> Result<u64> {
        self.current()?;
        let mut m = std::ptr::null_mut();
        // SAFETY: image is a whole code object that outlives the call.
        check(unsafe { hipModuleLoadData(&mut m, image.as_ptr() as *const c_void) }, "hipModuleLoadData")?;
        Ok(m as u64)
    }

    fn function(&self, module: u64, name: &str) -> Result<FunctionHandle> {
        self.current()?;
        let cname = CString::new(name).map_err(|_| Error::invalid("hip", format!("kernel name {name:?} holds a NUL byte")))?;
        let mut f = std::ptr::null_mut();
        // SAFETY: module came from load_module.
        check(unsafe { hipModuleGetFunction(&mut f, module as hipModule_t, cname.as_ptr()) }, "hipModuleGetFunction")?;
        Ok(FunctionHandle(f as u64))
    }

    // HIP has no programmatic dependent launch: `_overlap_previous` kernels run in plain stream
    // order (their wait is a no-op in the AMD build).
    unsafe fn launch(
        &self,
        f: FunctionHandle,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        params: &mut [*mut c_void],
        _overlap_previous: bool,
    ) -> Result<()> {
        self.current()?;
        check(
            hipModuleLaunchKernel(
                f.0 as hipFunction_t,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared,
                self.stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
            "hipModuleLaunchKernel",
        )
    }

    fn event_create(&self) -> Result<EventHandle> {
        self.current()?;
        let mut e = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(unsafe { hipEventCreate(&mut e) }, "hipEventCreate")?;
        Ok(EventHandle(e as u64))
    }

    fn event_record(&self, e: EventHandle) -> Result<()> {
        // SAFETY: e came from event_create.
        check(unsafe { hipEventRecord(e.0 as hipEvent_t, self.stream) }, "hipEventRecord")
    }

    fn event_elapsed(&self, start: EventHandle, end: EventHandle) -> Result<Duration> {
        let mut ms = 0f32;
        // SAFETY: both events were recorded on our drained stream.
        check(unsafe { hipEventElapsedTime(&mut ms, start.0 as hipEvent_t, end.0 as hipEvent_t) }, "hipEventElapsedTime")?;
        Ok(Duration::from_secs_f64(ms.max(0.0) as f64 / 1e3))
    }

    fn event_destroy(&self, e: EventHandle) {
        // SAFETY: destroyed once.
        unsafe { hipEventDestroy(e.0 as hipEvent_t) };
    }

    fn synchronize(&self) -> Result<()> {
        self.current()?;
        // SAFETY: our stream.
        check(unsafe { hipStreamSynchronize(self.stream) }, "hipStreamSynchronize")
    }

    fn capture_begin(&self) -> Result<()> {
        self.current()?;
        // SAFETY: our stream; thread-local capture mode.
        check(unsafe { hipStreamBeginCapture(self.stream, HIP_CAPTURE_THREAD_LOCAL) }, "hipStreamBeginCapture")
    }

    fn capture_end(&self) -> Result<GraphHandle> {
        self.current()?;
        let mut graph = std::ptr::null_mut();
        // SAFETY: ends our stream's capture; the graph is destroyed once instantiated.
        unsafe {
            check(hipStreamEndCapture(self.stream, &mut graph), "hipStreamEndCapture")?;
            let mut exec = std::ptr::null_mut();
            let r = hipGraphInstantiate(&mut exec, graph, std::ptr::null_mut(), std::ptr::null_mut(), 0);
            hipGraphDestroy(graph);
            check(r, "hipGraphInstantiate")?;
            Ok(GraphHandle(exec as u64))
        }
    }

    fn graph_launch(&self, g: GraphHandle) -> Result<()> {
        self.current()?;
        // SAFETY: g came from capture_end and is alive.
        check(unsafe { hipGraphLaunch(g.0 as hipGraphExec_t, self.stream) }, "hipGraphLaunch")
    }

    fn graph_destroy(&self, g: GraphHandle) {
        if self.current().is_ok() {
            // SAFETY: destroyed once.
            unsafe { hipGraphExecDestroy(g.0 as hipGraphExec_t) };
        }
    }

    /// From the code object's metadata note (the same reader as `civetta kernels report`)
    /// and the occupancy model at the launch block size.
    fn resources(&self, image: &[u8], name: &str, _f: FunctionHandle, block_threads: u32) -> Option<KernelResources> {
        let all = crate::kernels::codeobj::read_code_object(image).ok()?;
        let r = all.into_iter().find(|r| r.name == name)?;
        let occ = crate::kernels::occupancy::waves_per_simd(&self.arch, &r, block_threads);
        Some(KernelResources {
            arch: r.arch.clone(),
            compiler: String::new(),
            vgprs: r.vgprs,
            sgprs: r.sgprs,
            scratch_bytes: r.scratch_bytes,
            lds_bytes: r.lds_bytes,
            spills: r.vgpr_spills + r.sgpr_spills,
            occupancy: occ.map(|o| o.waves_per_simd as f32).unwrap_or(0.0),
            occupancy_unit: self.occupancy_unit().into(),
        })
    }
}

impl Drop for HipApi {
    fn drop(&mut self) {
        // SAFETY: our stream, destroyed once.
        unsafe { hipStreamDestroy(self.stream) };
    }
}
