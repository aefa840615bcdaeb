//! Which CPUs the CPU backend may run on and how many physical cores they are: the default
//! thread count (one thread per physical core, as llama.cpp: a second hyperthread on the
//! same core shares its vector units and adds little to integer dot products) and the
//! placement line `civetta bench` prints. Linux reads /proc and /sys; elsewhere, or when those
//! are unreadable, every logical CPU counts as a core.

use std::collections::BTreeSet;

/// The CPUs this process may run on and their physical cores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuPlacement {
    /// Logical CPU ids in the affinity mask (sorted).
    pub allowed: Vec<usize>,
    /// Distinct (package, core) pairs among `allowed`.
    pub physical_cores: usize,
}

impl CpuPlacement {
    /// This process's affinity mask and core count.
    pub fn detect() -> CpuPlacement {
        let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
        let allowed = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:").map(|v| parse_cpu_list(v.trim()))))
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| (0..logical).collect());
        let cores: BTreeSet<(String, String)> = allowed
            .iter()
            .filter_map(|c| {
                let topo = format!("/sys/devices/system/cpu/cpu{c}/topology");
                let read = |f: &str| std::fs::read_to_string(format!("{topo}/{f}")).ok().map(|s| s.trim().to_string());
                Some((read("physical_package_id")?, read("core_id")?))
            })
            .collect();
        let physical_cores = if cores.is_empty() { allowed.len() } else { cores.len() };
        CpuPlacement { allowed, physical_cores: physical_cores.max(1) }
    }

    /// The thread count for `requested` (0 = one per physical core).
    pub fn threads(&self, requested: usize) -> usize {
        if requested == 0 {
            self.physical_cores
        } else {
            requested
        }
    }

    /// "16 threads; affinity CPUs 0-15 (16 logical, 16 physical cores)".
    pub fn describe(&self, threads: usize) -> String {
        format!(
            "{threads} threads; affinity CPUs {} ({} logical, {} physical cores){}",
            format_cpu_list(&self.allowed),
            self.allowed.len(),
            self.physical_cores,
            if threads > self.allowed.len() { " — more threads than CPUs: they share" } else { "" }
        )
    }
}

/// "0-3,8,10-11" -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpu list format); bad parts are skipped.
pub fn parse_cpu_list(s: &str) -> Vec<usize> {
    let mut out = BTreeSet::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    out.extend(a..=b);
                }
            }
            None => {
                if let Ok(a) = part.parse() {
                    out.insert(a);
                }
            }
        }
    }
    out.into_iter().collect()
}

/// The inverse of `parse_cpu_list` for a sorted list.
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if j > i { format!("{}-{}", cpus[i], cpus[j]) } else { cpus[i].to_string() });
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_and_format_like_the_kernel() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpu_list("5"), vec![5]);
        assert_eq!(parse_cpu_list("x,2"), vec![2]);
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format_cpu_list(&[]), "");
    }

    #[test]
    fn detect_sees_at_least_one_core_and_defaults_to_it() {
        let p = CpuPlacement::detect();
        assert!(!p.allowed.is_empty() && p.physical_cores >= 1 && p.physical_cores <= p.allowed.len());
        assert_eq!(p.threads(0), p.physical_cores);
        assert_eq!(p.threads(3), 3);
        assert!(p.describe(2).starts_with("2 threads; affinity CPUs "), "{}", p.describe(2));
    }
}
