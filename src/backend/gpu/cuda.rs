//! CUDA driver API through cudarc's raw bindings, loaded at run time (`dynamic-loading`):
//! the binary builds and starts without CUDA installed, and `civetta serve --backend cuda`
//! on a host without the NVIDIA driver fails with one clear line instead of a link error.

use super::api::{DevicePtr, EventHandle, FunctionHandle, GpuApi, GraphHandle};
use crate::backend::{Error, Result};
use crate::kernel_registry::KernelResources;
use anyhow::{bail, Context};
use cudarc::driver::sys;
use std::ffi::{c_void, CStr, CString};
use std::time::Duration;

pub struct CudaApi {
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    name: String,
    arch: String,
    /// Streaming multiprocessors (`GpuApi::compute_units`), if the driver gave a count.
    sms: Option<usize>,
}

// SAFETY: CUDA contexts and streams may be used from any thread once made current there;
// every entry point below makes the context current first.
unsafe impl Send for CudaApi {}
unsafe impl Sync for CudaApi {}

fn check(r: sys::CUresult, call: &str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut msg: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a pointer to a static string or leaves it null.
    let text = unsafe {
        sys::cuGetErrorString(r, &mut msg);
        if msg.is_null() {
            String::new()
        } else {
            CStr::from_ptr(msg).to_string_lossy().into_owned()
        }
    };
    Err(Error::Device { backend: "cuda", call: call.to_string(), code: r as i64, message: format!("{r:?}: {text}") })
}

impl CudaApi {
    /// Opens device `index`: primary context and one non-blocking stream.
    pub fn new(index: usize) -> anyhow::Result<CudaApi> {
        // SAFETY: probing for the library has no preconditions.
        if !unsafe { sys::is_culib_present() } {
            bail!("cuda backend: the NVIDIA driver library (libcuda.so) was not found; this host has no usable NVIDIA GPU");
        }
        // SAFETY: plain driver API calls with out-pointers to locals.
        unsafe {
            check(sys::cuInit(0), "cuInit").context("no NVIDIA GPU or driver not loaded")?;
            let mut count = 0;
            check(sys::cuDeviceGetCount(&mut count), "cuDeviceGetCount")?;
            if count <= 0 {
                bail!("cuda backend: no NVIDIA GPU found");
            }
            if index >= count as usize {
                bail!("cuda backend: device {index} asked for, {count} present");
            }
            let mut dev = 0;
            check(sys::cuDeviceGet(&mut dev, index as i32), "cuDeviceGet")?;
            let mut name = [0 as std::ffi::c_char; 256];
            check(sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev), "cuDeviceGetName")?;
            let name = CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
            let attr = |a: sys::CUdevice_attribute| -> anyhow::Result<i32> {
                let mut v = 0;
                check(sys::cuDeviceGetAttribute(&mut v, a, dev), "cuDeviceGetAttribute")?;
                Ok(v)
            };
            let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
            let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
            let sms = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
            let mut ctx = std::ptr::null_mut();
            check(sys::cuDevicePrimaryCtxRetain(&mut ctx, dev), "cuDevicePrimaryCtxRetain")?;
            check(sys::cuCtxSetCurrent(ctx), "cuCtxSetCurrent")?;
            let mut stream = std::ptr::null_mut();
            check(sys::cuStreamCreate(&mut stream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32), "cuStreamCreate")?;
            Ok(CudaApi { ctx, stream, name, arch: format!("sm_{major}{minor}"), sms: usize::try_from(sms).ok().filter(|&n| n > 0) })
        }
    }

    fn current(&self) -> Result<()> {
        // SAFETY: the context lives as long as self.
        check(unsafe { sys::cuCtxSetCurrent(self.ctx) }, "cuCtxSetCurrent")
    }
}

impl GpuApi for CudaApi {
    fn backend_name(&self) -> &'static str {
        "cuda"
    }

    fn device_name(&self) -> String {
        self.name.clone()
    }

    fn arch(&self) -> String {
        self.arch.clone()
    }

    fn kernel_extension(&self) -> &'static str {
        "ptx"
    }

    fn occupancy_unit(&self) -> &'static str {
        "blocks_per_sm"
    }

    fn compute_units(&self) -> Option<usize> {
        self.sms
    }

    /// %globaltimer counts nanoseconds; it advances every 32 ns from sm_90 on and only about
    /// every microsecond before (too coarse for launches of a few microseconds).
    fn steady_clock_hz(&self) -> Option<u64> {
        let cc: u32 = self.arch.trim_start_matches("sm_").parse().ok()?; // major * 10 + minor
        (cc >= 90).then_some(1_000_000_000)
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.current()?;
        let mut p = 0;
        // SAFETY: out-pointer to a local.
        let r = unsafe { sys::cuMemAlloc_v2(&mut p, bytes) };
        if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Err(Error::OutOfMemory { backend: "cuda", bytes });
        }
        check(r, "cuMemAlloc_v2")?;
        Ok(p)
    }

    fn free(&self, ptr: DevicePtr) {
        if self.current().is_ok() {
            // SAFETY: ptr came from cuMemAlloc and is freed once (DevBuf owns it).
            unsafe { sys::cuMemFree_v2(ptr) };
        }
    }

    fn upload(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.current()?;
        // SAFETY: from pageable memory the driver stages the bytes before returning, so
        // `src` may be dropped afterwards; the copy is ordered on our stream.
        check(unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr() as *const c_void, src.len(), self.stream) }, "cuMemcpyHtoDAsync")
    }

    fn download(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        self.current()?;
        // SAFETY: dst is valid for its length; we wait for the stream before returning.
        unsafe {
            check(sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr() as *mut c_void, src, dst.len(), self.stream), "cuMemcpyDtoHAsync")?;
            check(sys::cuStreamSynchronize(self.stream), "cuStreamSynchronize")
        }
    }

    fn pin_host(&self, host: *mut u8, bytes: usize) -> bool {
        // SAFETY: the caller keeps the bytes allocated, and unpins them before freeing.
        self.current().is_ok() && unsafe { sys::cuMemHostRegister_v2(host as *mut c_void, bytes, 0) } == sys::CUresult::CUDA_SUCCESS
    }

    fn unpin_host(&self, host: *mut u8) {
        if self.current().is_ok() {
            // SAFETY: host was registered by pin_host.
            unsafe { sys::cuMemHostUnregister(host as *mut c_void) };
        }
    }

    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.current()?;
        // SAFETY: both ranges are device allocations of at least `bytes` (callers' contract).
        check(unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream) }, "cuMemcpyDtoDAsync")
    }

    fn load_module(&self, image: &[u8]) -> Result<u64> {
        self.current()?;
        if image.last() != Some(&0) {
            return Err(Error::invalid("cuda", "a PTX image must be NUL-terminated"));
        }
        let mut m = std::ptr::null_mut();
        // SAFETY: image is a NUL-terminated PTX string that outlives the call.
        check(unsafe { sys::cuModuleLoadData(&mut m, image.as_ptr() as *const c_void) }, "cuModuleLoadData (PTX JIT)")?;
        Ok(m as u64)
    }

    fn function(&self, module: u64, name: &str) -> Result<FunctionHandle> {
        self.current()?;
        let cname = CString::new(name).map_err(|_| Error::invalid("cuda", format!("kernel name {name:?} holds a NUL byte")))?;
        let mut f = std::ptr::null_mut();
        // SAFETY: module came from load_module.
        check(unsafe { sys::cuModuleGetFunction(&mut f, module as sys::CUmodule, cname.as_ptr()) }, "cuModuleGetFunction")?;
        Ok(FunctionHandle(f as u64))
    }

    unsafe fn launch(
        &self,
        f: FunctionHandle,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        params: &mut [*mut c_void],
        overlap_previous: bool,
    ) -> Result<()> {
        self.current()?;
        if overlap_previous {
            // Programmatic stream serialization: the kernel's workgroups may start once every
            // workgroup of the previous kernel has triggered (griddepcontrol.launch_dependents) or
            // exited; the kernel's griddepcontrol.wait then waits for that kernel's completion and
            // memory. Stream capture records it as a programmatic edge of the graph.
            let mut attr: sys::CUlaunchAttribute = std::mem::zeroed();
            attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let config = sys::CUlaunchConfig {
                gridDimX: grid[0],
                gridDimY: grid[1],
                gridDimZ: grid[2],
                blockDimX: block[0],
                blockDimY: block[1],
                blockDimZ: block[2],
                sharedMemBytes: shared,
                hStream: self.stream,
                attrs: &mut attr,
                numAttrs: 1,
            };
            return check(
                sys::cuLaunchKernelEx(&config, f.0 as sys::CUfunction, params.as_mut_ptr(), std::ptr::null_mut()),
                "cuLaunchKernelEx",
            );
        }
        check(
            sys::cuLaunchKernel(
                f.0 as sys::CUfunction,
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
            "cuLaunchKernel",
        )
    }

    fn event_create(&self) -> Result<EventHandle> {
        self.current()?;
        let mut e = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(unsafe { sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DEFAULT as u32) }, "cuEventCreate")?;
        Ok(EventHandle(e as u64))
    }

    fn event_record(&self, e: EventHandle) -> Result<()> {
        // SAFETY: e came from event_create.
        check(unsafe { sys::cuEventRecord(e.0 as sys::CUevent, self.stream) }, "cuEventRecord")
    }

    fn event_record_captured(&self, e: EventHandle) -> Result<()> {
        // SAFETY: e came from event_create. A plain record inside a capture only orders
        // streams; the EXTERNAL flag makes it an event-record node of the graph.
        check(
            unsafe {
                sys::cuEventRecordWithFlags(
                    e.0 as sys::CUevent,
                    self.stream,
                    sys::CUevent_record_flags_enum::CU_EVENT_RECORD_EXTERNAL as u32,
                )
            },
            "cuEventRecordWithFlags",
        )
    }

    fn event_elapsed(&self, start: EventHandle, end: EventHandle) -> Result<Duration> {
        self.current()?;
        let mut ms = 0f32;
        // SAFETY: both events were recorded on our stream, which the caller has drained.
        check(unsafe { sys::cuEventElapsedTime_v2(&mut ms, start.0 as sys::CUevent, end.0 as sys::CUevent) }, "cuEventElapsedTime")?;
        Ok(Duration::from_secs_f64(ms.max(0.0) as f64 / 1e3))
    }

    fn event_destroy(&self, e: EventHandle) {
        // SAFETY: e came from event_create and is destroyed once.
        unsafe { sys::cuEventDestroy_v2(e.0 as sys::CUevent) };
    }

    fn synchronize(&self) -> Result<()> {
        self.current()?;
        // SAFETY: our stream.
        check(unsafe { sys::cuStreamSynchronize(self.stream) }, "cuStreamSynchronize")
    }

    fn capture_begin(&self) -> Result<()> {
        self.current()?;
        // SAFETY: our stream; thread-local mode: other threads' CUDA calls are not affected.
        check(
            unsafe { sys::cuStreamBeginCapture_v2(self.stream, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) },
            "cuStreamBeginCapture",
        )
    }

    fn capture_end(&self) -> Result<GraphHandle> {
        self.current()?;
        let mut graph = std::ptr::null_mut();
        // SAFETY: ends the capture begun on our stream; the graph is destroyed once its
        // executable exists (the executable does not refer to it).
        unsafe {
            check(sys::cuStreamEndCapture(self.stream, &mut graph), "cuStreamEndCapture")?;
            let mut exec = std::ptr::null_mut();
            let r = sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0);
            sys::cuGraphDestroy(graph);
            check(r, "cuGraphInstantiateWithFlags")?;
            Ok(GraphHandle(exec as u64))
        }
    }

    fn graph_launch(&self, g: GraphHandle) -> Result<()> {
        self.current()?;
        // SAFETY: g came from capture_end and is alive.
        check(unsafe { sys::cuGraphLaunch(g.0 as sys::CUgraphExec, self.stream) }, "cuGraphLaunch")
    }

    fn graph_destroy(&self, g: GraphHandle) {
        if self.current().is_ok() {
            // SAFETY: destroyed once, after the stream finished with it (callers synchronize).
            unsafe { sys::cuGraphExecDestroy(g.0 as sys::CUgraphExec) };
        }
    }

    fn resources(&self, _image: &[u8], _name: &str, f: FunctionHandle, block_threads: u32) -> Option<KernelResources> {
        self.current().ok()?;
        let func = f.0 as sys::CUfunction;
        let attr = |a: sys::CUfunction_attribute| -> Option<u32> {
            let mut v = 0;
            // SAFETY: func is a loaded function.
            (unsafe { sys::cuFuncGetAttribute(&mut v, a, func) } == sys::CUresult::CUDA_SUCCESS).then_some(v.max(0) as u32)
        };
        use sys::CUfunction_attribute as FA;
        let mut blocks = 0;
        // SAFETY: as above.
        let occ = unsafe { sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut blocks, func, block_threads as i32, 0) };
        Some(KernelResources {
            arch: self.arch.clone(),
            compiler: String::new(),
            vgprs: attr(FA::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            sgprs: 0,
            scratch_bytes: attr(FA::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            lds_bytes: attr(FA::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            spills: 0,
            occupancy: if occ == sys::CUresult::CUDA_SUCCESS { blocks as f32 } else { 0.0 },
            occupancy_unit: self.occupancy_unit().into(),
        })
    }
}

impl Drop for CudaApi {
    fn drop(&mut self) {
        // SAFETY: the stream is ours; the primary context is released by the driver at exit.
        unsafe {
            sys::cuStreamDestroy_v2(self.stream);
        }
    }
}
