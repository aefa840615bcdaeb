//! Waves per SIMD a kernel can keep resident, with the rules LLVM's AMDGPU backend uses
//! for its `Occupancy [waves/SIMD]` remark (AMDGPUBaseInfo.cpp `getNumWavesPerEUWithNumVGPRs`,
//! `getVGPRAllocGranule`, `getTotalNumVGPRs`, `getMaxWorkGroupsPerCU`; AMDGPUSubtarget.cpp
//! `getOccupancyWithLocalMemSize`). tests/kernels_occupancy.rs checks every kernel we build
//! against clang-19's and clang-22's remarks.
//!
//! gfx11 in its default WGP mode, per SIMD (LLVM calls a SIMD an "EU"):
//! - VGPRs: gfx1100/1101/1151 have 1.5x register files (`Feature1_5xVGPRs`): 1536 VGPRs in
//!   wave32, allocated in granules of 24; the other gfx11 parts 1024 and 16 (measured with
//!   clang-22: gfx1102/1103/1150/1152/1153 all report the smaller file). Wave64 halves both.
//! - at most 16 waves per SIMD (gfx10.3 and gfx11).
//! - LDS: 64 KiB addressable per workgroup, 128 KiB per WGP shared by its 4 SIMDs; at most
//!   32 multi-wave workgroups (barriers) per WGP.
//! - SGPRs do not limit occupancy on gfx10+ (every wave gets a fixed SGPR allocation).

use super::KernelResources;
use serde::{Deserialize, Serialize};

/// Per-SIMD and per-WGP limits of one processor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchLimits {
    pub vgprs_per_simd_wave32: u32,
    pub vgpr_granule_wave32: u32,
    pub max_waves_per_simd: u32,
    pub simds_per_wgp: u32,
    pub lds_bytes_per_wgp: u32,
    pub max_workgroups_per_wgp: u32,
}

/// Limits for the processors we model, or `None` for any other.
pub fn arch_limits(arch: &str) -> Option<ArchLimits> {
    let (vgprs, granule) = match arch {
        "gfx1100" | "gfx1101" | "gfx1151" => (1536, 24),
        "gfx1102" | "gfx1103" | "gfx1150" | "gfx1152" | "gfx1153" => (1024, 16),
        _ => return None,
    };
    Some(ArchLimits {
        vgprs_per_simd_wave32: vgprs,
        vgpr_granule_wave32: granule,
        max_waves_per_simd: 16,
        simds_per_wgp: 4,
        lds_bytes_per_wgp: 128 * 1024,
        max_workgroups_per_wgp: 32,
    })
}

/// What bounds the occupancy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OccupancyLimit {
    /// The hardware maximum of waves per SIMD.
    WaveSlots,
    Vgprs,
    Lds,
    /// Workgroups per WGP (barrier resources) for this workgroup size.
    Workgroups,
}

impl std::fmt::Display for OccupancyLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OccupancyLimit::WaveSlots => "max",
            OccupancyLimit::Vgprs => "VGPRs",
            OccupancyLimit::Lds => "LDS",
            OccupancyLimit::Workgroups => "workgroups",
        })
    }
}

/// Occupancy of one kernel: the result and each bound separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OccupancyReport {
    pub waves_per_simd: u32,
    pub limited_by: OccupancyLimit,
    pub by_vgprs: u32,
    /// Bound from LDS and workgroups per WGP together; 0 when the LDS cannot fit at all.
    pub by_lds: u32,
    pub by_workgroups: u32,
}

/// Waves per SIMD for `r` launched with `workgroup_size` work-items on `arch`.
/// `None` for processors we do not model or a zero workgroup size.
pub fn waves_per_simd(arch: &str, r: &KernelResources, workgroup_size: u32) -> Option<OccupancyReport> {
    let limits = arch_limits(arch)?;
    if workgroup_size == 0 || !matches!(r.wavefront_size, 32 | 64) {
        return None;
    }
    let max_waves = limits.max_waves_per_simd;
    let by_vgprs = waves_by_vgprs(&limits, r.vgprs, r.wavefront_size);

    let waves_per_group = workgroup_size.div_ceil(r.wavefront_size);
    let wave_slots = max_waves * limits.simds_per_wgp;
    // Single-wave workgroups need no barrier, so only the wave slots bound them.
    let max_groups = if waves_per_group == 1 { wave_slots } else { (wave_slots / waves_per_group).min(limits.max_workgroups_per_wgp) };
    let waves_for_groups = |groups: u32| (groups * waves_per_group).div_ceil(limits.simds_per_wgp).min(max_waves);
    let by_workgroups = waves_for_groups(max_groups);
    let groups_by_lds = limits.lds_bytes_per_wgp / r.lds_bytes.max(1);
    let by_lds = if groups_by_lds == 0 { 0 } else { waves_for_groups(groups_by_lds.min(max_groups)) };

    let waves = max_waves.min(by_vgprs).min(by_lds);
    let limited_by = if waves == max_waves {
        OccupancyLimit::WaveSlots
    } else if waves == by_vgprs {
        OccupancyLimit::Vgprs
    } else if by_workgroups <= by_lds {
        OccupancyLimit::Workgroups
    } else {
        OccupancyLimit::Lds
    };
    Some(OccupancyReport { waves_per_simd: waves, limited_by, by_vgprs, by_lds, by_workgroups })
}

fn waves_by_vgprs(limits: &ArchLimits, vgprs: u32, wavefront_size: u32) -> u32 {
    let (total, granule) = if wavefront_size == 64 {
        (limits.vgprs_per_simd_wave32 / 2, limits.vgpr_granule_wave32 / 2)
    } else {
        (limits.vgprs_per_simd_wave32, limits.vgpr_granule_wave32)
    };
    if vgprs < granule {
        return limits.max_waves_per_simd;
    }
    (total / vgprs.next_multiple_of(granule)).clamp(1, limits.max_waves_per_simd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(vgprs: u32, lds_bytes: u32) -> KernelResources {
        KernelResources {
            name: "k".into(),
            arch: "gfx1151".into(),
            vgprs,
            sgprs: 20,
            vgpr_spills: 0,
            sgpr_spills: 0,
            scratch_bytes: 0,
            lds_bytes,
            wavefront_size: 32,
            max_flat_workgroup_size: 256,
            scratch_instructions: None,
        }
    }

    #[test]
    fn vgpr_granules_differ_between_register_file_sizes() {
        // 100 VGPRs allocate 120 (granule 24) of 1536 -> 12 waves; 112 (granule 16) of 1024 -> 9.
        assert_eq!(waves_per_simd("gfx1151", &kernel(100, 0), 256).unwrap().waves_per_simd, 12);
        assert_eq!(waves_per_simd("gfx1150", &kernel(100, 0), 256).unwrap().waves_per_simd, 9);
        // 256 VGPRs round up to 264: five waves, not six.
        let full = waves_per_simd("gfx1151", &kernel(256, 0), 256).unwrap();
        assert_eq!((full.waves_per_simd, full.limited_by), (5, OccupancyLimit::Vgprs));
        assert_eq!(waves_per_simd("gfx1151", &kernel(8, 0), 256).unwrap().limited_by, OccupancyLimit::WaveSlots);
    }

    #[test]
    fn lds_bounds_workgroups_per_wgp() {
        // 32 KiB per 4-wave group: 4 groups per WGP = 16 waves over 4 SIMDs = 4 per SIMD.
        let r = waves_per_simd("gfx1100", &kernel(24, 32 * 1024), 128).unwrap();
        assert_eq!((r.waves_per_simd, r.limited_by), (4, OccupancyLimit::Lds));
        assert_eq!(waves_per_simd("gfx1100", &kernel(24, 200 * 1024), 128).unwrap().waves_per_simd, 0);
    }

    #[test]
    fn unknown_arch_has_no_occupancy() {
        assert!(waves_per_simd("gfx90a", &kernel(24, 0), 64).is_none());
        assert!(waves_per_simd("gfx1151", &kernel(24, 0), 0).is_none());
    }
}
