//! Factors: the settings that can move a benchmark result, each a group of fingerprint keys.
//!
//! A comparison of two runs says something only when they differ in one factor: published
//! "IOMMU off is 5-12% faster" runs also switched the power profile, so their difference
//! belongs to neither. `civetta compare` and `civetta repro merge` map the fingerprint
//! difference of two runs to factors with [`differing_factors`] and print
//! [`confounding_warning`] when more than one differs.
//!
//! A key whose value is `unknown` on one side is not counted as a difference (nothing is
//! known to have changed); [`differing_factors`] reports it as `unknown_on_one_side` so the
//! report can say the factor could not be checked.

use super::{key_matches, UNKNOWN};

/// One factor: its name (as printed) and the fingerprint keys that measure it. Patterns
/// match dotted segments, `*` one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Factor {
    pub name: &'static str,
    pub keys: &'static [&'static str],
}

/// Every factor, in the order they are listed.
pub const FACTORS: &[Factor] = &[
    Factor { name: "compiler", keys: &["toolchain.kernel_compiler"] },
    Factor { name: "ROCm", keys: &["toolchain.hip_runtime", "toolchain.rocm_installed"] },
    Factor { name: "backend", keys: &["toolchain.backend"] },
    Factor { name: "IOMMU mode", keys: &["iommu.mode"] },
    Factor { name: "container layer", keys: &["container.type", "container.image"] },
    Factor { name: "power profile", keys: &["host.power_profile", "gpu.*.perf_level", "gpu.*.power_profile_mode"] },
    Factor { name: "CPU governor", keys: &["host.governor", "host.energy_perf_preference", "host.cpufreq_driver"] },
    Factor {
        name: "GTT size",
        keys: &["gpu.*.gtt_total_bytes", "kparam.amdgpu.gttsize", "kparam.ttm.pages_limit", "kparam.ttm.page_pool_size"],
    },
    Factor { name: "kernel version", keys: &["host.kernel_release", "host.kernel_version"] },
    Factor { name: "firmware", keys: &["gpu.*.firmware", "gpu.*.vbios"] },
    Factor { name: "transparent huge pages", keys: &["host.thp", "host.thp_defrag"] },
    Factor { name: "civetta build", keys: &["civetta.git_sha", "civetta.version"] },
    Factor { name: "hardware", keys: &["cpu.model", "cpu.cores", "gpu.arch", "gpu.*.name", "host.memory_total_bytes"] },
];

/// The factor a fingerprint key belongs to, if any.
pub fn factor_of(key: &str) -> Option<&'static Factor> {
    FACTORS.iter().find(|f| f.keys.iter().any(|p| key_matches(p, key)))
}

/// One factor in which two runs differ, with the differing keys as (key, a, b).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FactorDiff {
    pub factor: &'static str,
    pub keys: Vec<(String, String, String)>,
    /// True when every differing key is `unknown` on one side: not counted as a change.
    pub unknown_on_one_side: bool,
}

impl FactorDiff {
    /// `IOMMU mode (iommu.mode: passthrough vs off)`.
    pub fn describe(&self) -> String {
        let keys: Vec<String> = self.keys.iter().map(|(k, a, b)| format!("{k}: {a} vs {b}")).collect();
        format!("{} ({})", self.factor, keys.join("; "))
    }
}

/// Groups a fingerprint difference (key, a, b) by factor, in [`FACTORS`] order; keys of no
/// factor (the command line, IOMMU group counts, ...) are left out.
pub fn differing_factors<K: AsRef<str>>(diff: &[(K, K, K)]) -> Vec<FactorDiff> {
    let mut out: Vec<FactorDiff> = Vec::new();
    for factor in FACTORS {
        let keys: Vec<(String, String, String)> = diff
            .iter()
            .filter(|(k, _, _)| factor_of(k.as_ref()) == Some(factor))
            .map(|(k, a, b)| (k.as_ref().to_string(), a.as_ref().to_string(), b.as_ref().to_string()))
            .collect();
        if keys.is_empty() {
            continue;
        }
        let unknown_on_one_side = keys.iter().all(|(_, a, b)| a == UNKNOWN || b == UNKNOWN);
        out.push(FactorDiff { factor: factor.name, keys, unknown_on_one_side });
    }
    out
}

/// Drops the factors that cannot move results on the backends both runs used: the GPU
/// kernel compiler when both ran on the CPU backend (a host run sees build/kernels and a
/// container run does not, but neither uses them: "confounded: compiler" was noise).
pub fn for_backends(mut factors: Vec<FactorDiff>, backend_a: Option<&str>, backend_b: Option<&str>) -> Vec<FactorDiff> {
    if backend_a == Some("cpu") && backend_b == Some("cpu") {
        factors.retain(|f| f.factor != "compiler");
    }
    factors
}

/// The factors that are known to differ (both sides read).
pub fn changed(factors: &[FactorDiff]) -> Vec<&FactorDiff> {
    factors.iter().filter(|f| !f.unknown_on_one_side).collect()
}

/// The warning for runs that differ in more than one factor, naming all of them; `None`
/// when at most one factor changed.
pub fn confounding_warning(factors: &[FactorDiff]) -> Option<String> {
    let changed = changed(factors);
    if changed.len() < 2 {
        return None;
    }
    let names: Vec<&str> = changed.iter().map(|f| f.factor).collect();
    let mut s = format!(
        "WARNING: confounded: the runs differ in {} factors that can move the result ({}); \
         the difference cannot be attributed to any one of them. Change one factor at a time.",
        changed.len(),
        names.join(", ")
    );
    for f in changed {
        s += &format!("\n  - {}", f.describe());
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(k: &str, a: &str, b: &str) -> (String, String, String) {
        (k.into(), a.into(), b.into())
    }

    #[test]
    fn keys_map_to_factors() {
        assert_eq!(factor_of("iommu.mode").unwrap().name, "IOMMU mode");
        assert_eq!(factor_of("gpu.0.perf_level").unwrap().name, "power profile");
        assert_eq!(factor_of("gpu.1.gtt_total_bytes").unwrap().name, "GTT size");
        assert_eq!(factor_of("kparam.ttm.pages_limit").unwrap().name, "GTT size");
        // Evidence and volatile keys are no factor of their own.
        assert!(factor_of("iommu.group_count").is_none());
        assert!(factor_of("host.cmdline").is_none());
        assert!(factor_of("kparam.ttm.pages_limit.cmdline").is_none());
        assert!(factor_of("gpu.0.gtt_used_bytes").is_none());
        assert!(factor_of("gpu.0.sclk_mhz").is_none());
    }

    #[test]
    fn one_factor_is_no_warning_two_are() {
        let one = differing_factors(&[d("container.type", "none", "podman"), d("container.image", "none", "civetta:cpu")]);
        assert_eq!(one.len(), 1);
        assert!(confounding_warning(&one).is_none());
        let two = differing_factors(&[d("iommu.mode", "passthrough", "off"), d("host.governor", "performance", "powersave")]);
        let w = confounding_warning(&two).unwrap();
        assert!(w.contains("2 factors") && w.contains("IOMMU mode") && w.contains("CPU governor"), "{w}");
    }

    #[test]
    fn the_kernel_compiler_is_no_factor_between_two_cpu_runs() {
        // Host vs podman, both on the CPU backend: the host sees build/kernels.
        let diff = [
            d("toolchain.kernel_compiler", "clang 23.0.0 (build/llvm23)", "none"),
            d("container.type", "none", "podman"),
            d("container.image", "none", "civetta:cpu"),
        ];
        let cpu = for_backends(differing_factors(&diff), Some("cpu"), Some("cpu"));
        assert_eq!(cpu.iter().map(|f| f.factor).collect::<Vec<_>>(), ["container layer"]);
        assert!(confounding_warning(&cpu).is_none());
        // A GPU run on either side: the compiler matters.
        for (a, b) in [(Some("hip"), Some("hip")), (Some("cpu"), Some("cuda")), (None, Some("cpu"))] {
            let fd = for_backends(differing_factors(&diff), a, b);
            assert!(confounding_warning(&fd).unwrap().contains("compiler"), "{a:?} {b:?}");
        }
    }

    #[test]
    fn unknown_on_one_side_is_not_a_change() {
        let f = differing_factors(&[d("iommu.mode", "passthrough", "off"), d("host.power_profile", "performance", "unknown")]);
        assert_eq!(f.len(), 2);
        assert!(f[1].unknown_on_one_side);
        assert!(confounding_warning(&f).is_none());
    }
}
