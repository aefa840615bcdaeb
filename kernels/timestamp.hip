// Device clock stamps between the launches of a timed graph replay (src/backend/gpu/mod.rs,
// `TimedGraph::Stamps`): the time between two stamps is the launch between them, measured
// without the event nodes that cost a timed replay ~4 us per launch on an H100.
#include "civetta_gpu.h"

// stamps[slot] = the device's steady clock once every kernel queued before this one has
// finished. One thread. __builtin_readsteadycounter reads %globaltimer on NVIDIA (nanoseconds)
// and the 100 MHz REALTIME counter on AMD (s_sendmsg_rtn GET_REALTIME on gfx11; the host
// converts with hipDeviceAttributeWallClockRate).
//
// It lets the next kernel start first (cv_start_next_kernel before the wait, unlike the rule in
// civetta_gpu.h): the next kernel's launch then still hides behind the previous kernel's tail,
// as in an untimed replay, and its own cv_wait_prior_kernels waits for this stamp, which waits
// for the previous kernel, so the order of their memory is the plain one. At most three kernels
// are resident at once, this one a single wave.
CV_KERNEL CV_LAUNCH_BOUNDS(32) void civetta_time_stamp(unsigned long long* stamps, int slot) {
  cv_start_next_kernel();
  cv_wait_prior_kernels();
  if (cv_tid_x() == 0) stamps[slot] = __builtin_readsteadycounter();
}
