//! Host facts: kernel, command line, OS, CPU, memory, and the power and memory settings that
//! move benchmark results without changing anything else (frequency governor and
//! energy-performance preference, platform power profile, transparent huge pages).

use super::{read_trimmed, Field, Probe};
use std::collections::BTreeSet;

pub(crate) fn collect(p: &Probe) -> Vec<Field> {
    let mut out = vec![
        file_field(p.proc("sys/kernel/osrelease"), "host.kernel_release", "/proc/sys/kernel/osrelease"),
        // The build stamp (`#1 SMP PREEMPT_DYNAMIC <date>`): two builds of one release differ here.
        file_field(p.proc("sys/kernel/version"), "host.kernel_version", "/proc/sys/kernel/version"),
        match &p.cmdline {
            Some(c) => Field::new("host.cmdline", c.clone(), "/proc/cmdline"),
            None => Field::unknown("host.cmdline", "/proc/cmdline (not readable)"),
        },
        os_field(p, "etc/os-release", "host.os", "/etc/os-release PRETTY_NAME"),
    ];
    // Inside toolbox/distrobox the host's root is mounted at /run/host: the OS outside.
    if p.run("host/etc/os-release").exists() {
        out.push(os_field(p, "run/host/etc/os-release", "host.outer_os", "/run/host/etc/os-release PRETTY_NAME"));
    }
    out.extend(cpu_fields(p));
    out.push(memory_field(p));
    out.push(file_field(
        p.sys("devices/system/cpu/cpu0/cpufreq/scaling_governor"),
        "host.governor",
        "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor",
    ));
    // amd-pstate-epp / intel_pstate in active mode ignore most of the governor and follow
    // the energy-performance preference instead, so both are recorded, with the driver.
    out.push(file_field(
        p.sys("devices/system/cpu/cpu0/cpufreq/energy_performance_preference"),
        "host.energy_perf_preference",
        "/sys/devices/system/cpu/cpu0/cpufreq/energy_performance_preference",
    ));
    out.push(file_field(
        p.sys("devices/system/cpu/cpu0/cpufreq/scaling_driver"),
        "host.cpufreq_driver",
        "/sys/devices/system/cpu/cpu0/cpufreq/scaling_driver",
    ));
    out.push(file_field(p.sys("firmware/acpi/platform_profile"), "host.power_profile", "/sys/firmware/acpi/platform_profile"));
    for (file, key) in [("enabled", "host.thp"), ("defrag", "host.thp_defrag")] {
        out.push(bracketed_field(
            p.sys(&format!("kernel/mm/transparent_hugepage/{file}")),
            key,
            &format!("/sys/kernel/mm/transparent_hugepage/{file}"),
        ));
    }
    out
}

/// A sysfs choice file such as `always [madvise] never`: the bracketed (active) choice.
fn bracketed_field(path: std::path::PathBuf, key: &str, source: &str) -> Field {
    match read_trimmed(&path) {
        Some(text) => match bracketed_choice(&text) {
            Some(v) => Field::new(key, v, format!("{source} [selected]")),
            None => Field::unknown(key, format!("{source} (no [selected] choice in {text:?})")),
        },
        None => Field::unknown(key, format!("{source} (not readable)")),
    }
}

/// `always [madvise] never` -> `madvise`.
pub(crate) fn bracketed_choice(text: &str) -> Option<String> {
    let start = text.find('[')? + 1;
    let len = text[start..].find(']')?;
    Some(text[start..start + len].trim().to_string()).filter(|v| !v.is_empty())
}

fn file_field(path: std::path::PathBuf, key: &str, source: &str) -> Field {
    match read_trimmed(&path) {
        Some(v) if !v.is_empty() => Field::new(key, v, source),
        Some(_) => Field::unknown(key, format!("{source} (empty)")),
        None => Field::unknown(key, format!("{source} (not readable)")),
    }
}

fn os_field(p: &Probe, rel: &str, key: &str, source: &str) -> Field {
    let text = read_trimmed(&p.root(rel));
    let pretty = text.as_deref().and_then(|t| os_release_value(t, "PRETTY_NAME"));
    match pretty {
        Some(v) => Field::new(key, v, source),
        None => Field::unknown(key, format!("{source} (not readable or no PRETTY_NAME)")),
    }
}

/// A value of an os-release style file (`KEY="value"`).
pub(crate) fn os_release_value(text: &str, key: &str) -> Option<String> {
    text.lines()
        .filter_map(|l| l.trim().split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().trim_matches('"').trim_matches('\'').to_string())
        .filter(|v| !v.is_empty())
}

fn cpu_fields(p: &Probe) -> Vec<Field> {
    const SRC: &str = "/proc/cpuinfo";
    let mut out = Vec::new();
    let Some(info) = read_trimmed(&p.proc("cpuinfo")) else {
        out.push(Field::unknown("cpu.model", "/proc/cpuinfo (not readable)"));
        out.push(Field::unknown("cpu.logical_cpus", "/proc/cpuinfo (not readable)"));
        out.push(Field::unknown("cpu.cores", "/proc/cpuinfo (not readable)"));
        out.push(simd_field());
        return out;
    };
    let value = |line: &str| line.split_once(':').map(|(_, v)| v.trim().to_string());
    let key_of = |line: &str| line.split(':').next().unwrap_or("").trim().to_string();
    let mut model = None;
    let mut logical = 0usize;
    let (mut phys_id, mut core_id) = (None::<String>, None::<String>);
    let mut cores = BTreeSet::new();
    for line in info.lines().chain(std::iter::once("")) {
        match key_of(line).as_str() {
            "processor" => logical += 1,
            // x86 says "model name"; some arm64 kernels say "Model" or nothing.
            "model name" | "Model" if model.is_none() => model = value(line),
            "physical id" => phys_id = value(line),
            "core id" => core_id = value(line),
            "" => {
                // End of one processor's block.
                if let Some(c) = core_id.take() {
                    cores.insert((phys_id.take().unwrap_or_default(), c));
                }
            }
            _ => {}
        }
    }
    out.push(match model {
        Some(m) if !m.is_empty() => Field::new("cpu.model", m, format!("{SRC} model name")),
        _ => Field::unknown("cpu.model", format!("{SRC} (no model name)")),
    });
    out.push(if logical > 0 {
        Field::new("cpu.logical_cpus", logical.to_string(), format!("{SRC} processor entries"))
    } else {
        Field::unknown("cpu.logical_cpus", format!("{SRC} (no processor entries)"))
    });
    out.push(if cores.is_empty() {
        Field::unknown("cpu.cores", format!("{SRC} (no core id entries)"))
    } else {
        Field::new("cpu.cores", cores.len().to_string(), format!("{SRC} distinct (physical id, core id)"))
    });
    out.push(simd_field());
    out
}

/// The SIMD level the CPU kernels dispatch to (`quant::simd::level`: detected at run time on
/// this CPU, capped by CIVETTA_SIMD), so the fingerprint names the kernels that ran; not read
/// from the fixture tree: it describes the running process. AMX is never used or reported.
fn simd_field() -> Field {
    Field::new("cpu.simd", crate::quant::simd_level(), "runtime: quant::simd::level (CIVETTA_SIMD caps it)")
}

fn memory_field(p: &Probe) -> Field {
    const KEY: &str = "host.memory_total_bytes";
    let Some(text) = read_trimmed(&p.proc("meminfo")) else {
        return Field::unknown(KEY, "/proc/meminfo (not readable)");
    };
    let kib =
        text.lines().find_map(|l| l.strip_prefix("MemTotal:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    match kib {
        Some(k) => Field::new(KEY, (k * 1024).to_string(), "/proc/meminfo MemTotal"),
        None => Field::unknown(KEY, "/proc/meminfo (no MemTotal)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release_quoting() {
        let t = "NAME=\"Fedora Linux\"\nPRETTY_NAME='Fedora Linux 43 (Workstation Edition)'\nID=fedora";
        assert_eq!(os_release_value(t, "PRETTY_NAME").as_deref(), Some("Fedora Linux 43 (Workstation Edition)"));
        assert_eq!(os_release_value(t, "ID").as_deref(), Some("fedora"));
        assert_eq!(os_release_value(t, "VERSION_ID"), None);
    }

    #[test]
    fn bracketed_choices() {
        assert_eq!(bracketed_choice("always [madvise] never").as_deref(), Some("madvise"));
        assert_eq!(bracketed_choice("[always] defer defer+madvise madvise never").as_deref(), Some("always"));
        assert_eq!(bracketed_choice("always madvise never"), None);
        assert_eq!(bracketed_choice("[]"), None);
    }
}
