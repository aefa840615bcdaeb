//! The environment fingerprint: everything needed to explain why two benchmark runs differ.
//!
//! Every value is read from the system (or from build-time provenance) and carries its
//! source; a value that cannot be read is `"unknown"`, never a guess. The readers take an
//! [`EnvRoots`] so tests point them at fixture trees instead of `/sys`, `/proc`, `/run` and `/`.
//!
//! Consumers: `civetta env` ([`cli`]), the `GetEnvironment` RPC ([`Fingerprint::to_proto`]),
//! the `civetta_environment_info` gauge ([`Fingerprint::info_labels`]) and `civetta bench` /
//! `civetta compare`, which embed [`Fingerprint::to_json`] and print [`Fingerprint::diff`].
//!
//! Which fields are factors that can move a benchmark result (and so must not change two at a
//! time in a comparison) is [`factors`]' business.
//!
//! Field keys are dotted; the order of `fields` is stable (host, cpu, iommu, container,
//! toolchain, gpu, kernel parameters, extra):
//!
//! | keys | from |
//! |---|---|
//! | `host.kernel_release`, `host.kernel_version`, `host.cmdline`, `host.os`, `host.outer_os` (toolbox/distrobox only), `host.memory_total_bytes` | /proc/sys/kernel/{osrelease,version}, /proc/cmdline, /etc/os-release, /run/host/etc/os-release, /proc/meminfo |
//! | `host.governor`, `host.energy_perf_preference`, `host.cpufreq_driver` | /sys/devices/system/cpu/cpu0/cpufreq/{scaling_governor,energy_performance_preference,scaling_driver} |
//! | `host.power_profile` | /sys/firmware/acpi/platform_profile |
//! | `host.thp`, `host.thp_defrag` | /sys/kernel/mm/transparent_hugepage/{enabled,defrag} (the `[selected]` choice) |
//! | `cpu.model`, `cpu.logical_cpus`, `cpu.cores`, `cpu.simd` | /proc/cpuinfo; the SIMD level the CPU kernels run (`quant::simd::level`, capped by CIVETTA_SIMD) |
//! | `iommu.hardware`, `iommu.group_count`, `iommu.domain_types`, `iommu.cmdline`, `iommu.mode`, `iommu.evidence` | see `iommu.rs` for the precedence |
//! | `container.type`, `container.evidence`, `container.{engine,name,id,rootless}`, `container.image`, `container.image_{revision,version,created}`, `container.label.<name>` | see `container.rs` |
//! | `civetta.{version,git_sha,rustc}`, `toolchain.kernel_compiler`, `toolchain.hip_runtime`, `toolchain.rocm_installed`, `toolchain.backend` | build provenance, compiler.txt, the HIP backend, /opt/rocm/.info/version |
//! | `gpu.count`, `gpu.arch`, `gpu.N.{card,vendor,device_id,name,driver,sclk_mhz,sclk_range_mhz,vram_total_bytes,gtt_total_bytes,gtt_used_bytes,perf_level,power_profile_mode,firmware,vbios,arch,kfd_node,simd_count,array_count,compute_units}`, `gpu.dev_kfd`, `gpu.dev_dri_render` | /sys/class/drm (`perf_level`: power_dpm_force_performance_level, `power_profile_mode`: the `*` line of pp_power_profile_mode, `firmware`: fw_version/*_fw_version, `vbios`: vbios_version), /sys/class/kfd, /dev |
//! | `kparam.{amdgpu.gttsize,ttm.pages_limit,ttm.page_pool_size}` and each `.cmdline` | /sys/module/*/parameters, /proc/cmdline |

pub mod cli;
mod container;
pub mod factors;
pub(crate) mod gpu;
mod host;
mod iommu;
mod toolchain;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use toolchain::{set_runtime_version, short_compiler_name};

/// Version of the fingerprint JSON layout; bump when keys change meaning.
pub const SCHEMA: u32 = 1;
/// The value of a field that could not be read.
pub const UNKNOWN: &str = "unknown";
/// What [`Fingerprint::diff`] reports for a key that one side does not have.
pub const ABSENT: &str = "absent";

/// One fact about the environment and where it came from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub key: String,
    /// The value, or `"unknown"` when it could not be read.
    pub value: String,
    /// The file, command or call the value came from, e.g. `/proc/cmdline`.
    pub source: String,
}

impl Field {
    pub fn new(key: impl Into<String>, value: impl Into<String>, source: impl Into<String>) -> Self {
        Field { key: key.into(), value: value.into(), source: source.into() }
    }

    pub fn unknown(key: impl Into<String>, source: impl Into<String>) -> Self {
        Field::new(key, UNKNOWN, source)
    }
}

/// Where the system trees are mounted; tests use fixture directories.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvRoots {
    pub sys: PathBuf,
    pub proc: PathBuf,
    pub run: PathBuf,
    /// For `/.dockerenv`, `/etc/os-release`, `/etc/civetta/image.json`, `/dev/kfd`, ...
    pub root: PathBuf,
}

impl EnvRoots {
    /// The real system: `/sys`, `/proc`, `/run`, `/`.
    pub fn system() -> Self {
        EnvRoots { sys: "/sys".into(), proc: "/proc".into(), run: "/run".into(), root: "/".into() }
    }

    /// A fixture tree laid out like a root file system: `dir/sys`, `dir/proc`, `dir/run`, `dir`.
    pub fn under(dir: impl AsRef<Path>) -> Self {
        let dir = dir.as_ref();
        EnvRoots { sys: dir.join("sys"), proc: dir.join("proc"), run: dir.join("run"), root: dir.to_path_buf() }
    }

    /// True when these are the real system trees (then sources name real paths).
    pub fn is_system(&self) -> bool {
        *self == EnvRoots::system()
    }
}

impl Default for EnvRoots {
    fn default() -> Self {
        EnvRoots::system()
    }
}

/// What [`collect`] needs besides the file system.
#[derive(Clone, Debug)]
pub struct CollectOptions {
    pub roots: EnvRoots,
    /// The backend in use (`cpu`, `hip`, ...), reported as `toolchain.backend`.
    pub backend: String,
    /// The directory of the built GPU kernels (each holding a `compiler.txt` with the
    /// `clang --version` captured at build time). `None`: `$CIVETTA_KERNEL_DIR`, then `./build/kernels`.
    pub kernel_build_dir: Option<PathBuf>,
    /// The HIP runtime version as reported by the runtime; `None`: whatever
    /// [`set_runtime_version`] recorded, else unknown.
    pub hip_runtime_version: Option<String>,
    /// Environment variables to consult (`container`, `CONTAINER_ID`, `TOOLBOX_PATH`,
    /// `CIVETTA_KERNEL_COMPILER`, `CIVETTA_KERNEL_DIR`); `None` reads the process environment.
    /// Fixture tests pass `Some(empty)` so the real environment does not leak in.
    pub env_vars: Option<BTreeMap<String, String>>,
    /// Extra fields appended as they are (e.g. from a backend).
    pub extra: Vec<Field>,
}

impl CollectOptions {
    /// The real system, with the given backend name.
    pub fn system(backend: impl Into<String>) -> Self {
        CollectOptions {
            roots: EnvRoots::system(),
            backend: backend.into(),
            kernel_build_dir: None,
            hip_runtime_version: None,
            env_vars: None,
            extra: Vec::new(),
        }
    }

    /// A fixture tree (see [`EnvRoots::under`]) with an empty environment and the kernel
    /// build at `dir/build/kernels`, so nothing of the real machine leaks in except the
    /// build provenance and the running CPU's SIMD level.
    pub fn fixture(dir: impl AsRef<Path>, backend: impl Into<String>) -> Self {
        let dir = dir.as_ref();
        CollectOptions {
            roots: EnvRoots::under(dir),
            env_vars: Some(BTreeMap::new()),
            kernel_build_dir: Some(dir.join("build/kernels")),
            ..CollectOptions::system(backend)
        }
    }
}

/// Everything the readers share: the roots, the environment and the kernel command line
/// (read once, used by host, IOMMU and kernel-parameter readers).
pub(crate) struct Probe<'a> {
    pub roots: &'a EnvRoots,
    pub env: BTreeMap<String, String>,
    /// `None` when /proc/cmdline could not be read.
    pub cmdline: Option<String>,
}

impl Probe<'_> {
    pub fn sys(&self, rel: &str) -> PathBuf {
        self.roots.sys.join(rel)
    }
    pub fn proc(&self, rel: &str) -> PathBuf {
        self.roots.proc.join(rel)
    }
    pub fn run(&self, rel: &str) -> PathBuf {
        self.roots.run.join(rel)
    }
    /// `rel` without a leading slash, e.g. `etc/os-release`.
    pub fn root(&self, rel: &str) -> PathBuf {
        self.roots.root.join(rel)
    }
    pub fn env(&self, name: &str) -> Option<&str> {
        self.env.get(name).map(String::as_str).filter(|v| !v.is_empty())
    }
}

/// Reads a small text file, trimmed; `None` when missing or unreadable.
pub(crate) fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read(path).ok().map(|b| String::from_utf8_lossy(&b).trim().to_string())
}

/// Names of the entries of a directory, sorted naturally; `None` when it cannot be listed.
/// Hidden entries are skipped: sysfs has none, and fixture trees keep otherwise empty
/// directories in git with a `.keep` file.
pub(crate) fn list_dir(path: &Path) -> Option<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(path)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort_by(|a, b| natural_cmp(a, b));
    Some(names)
}

/// Orders `card2` before `card10` and `2` before `10`.
pub(crate) fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let split = |s: &str| {
        let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (head, tail) = s.split_at(s.len() - digits);
        (head.to_string(), tail.parse::<u64>().ok())
    };
    split(a).cmp(&split(b)).then_with(|| a.cmp(b))
}

/// Values of `name=value` parameters on a kernel command line (arguments after `--` go to
/// init, not to the kernel, and are ignored). Later occurrences come later in the list.
pub(crate) fn cmdline_params(cmdline: &str) -> Vec<(&str, &str)> {
    cmdline
        .split_whitespace()
        .take_while(|t| *t != "--")
        .map(|t| t.split_once('=').unwrap_or((t, "")))
        .map(|(k, v)| (k, v.trim_matches('"')))
        .collect()
}

/// The environment fingerprint.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    pub schema: u32,
    pub fields: Vec<Field>,
    // Typed summary: copies of the most used field values (the fields stay authoritative).
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub git_sha: String,
    #[serde(default)]
    pub backend: String,
    /// Short form of the kernel compiler, e.g. `clang 22.1.8`, `none`.
    #[serde(default)]
    pub kernel_compiler: String,
    /// HIP runtime version, else the installed ROCm version, else unknown.
    #[serde(default)]
    pub rocm: String,
    /// `off`, `passthrough`, `translated` or `unknown`.
    #[serde(default)]
    pub iommu_mode: String,
    /// `none`, `podman`, `docker`, `toolbox`, `distrobox` or `unknown`.
    #[serde(default)]
    pub container: String,
    #[serde(default)]
    pub image: String,
    /// The GPUs' gfx targets (`gfx1151`; several joined by `,`), `none` or `unknown`.
    #[serde(default)]
    pub gpu_arch: String,
    #[serde(default)]
    pub cpu_model: String,
    #[serde(default)]
    pub cpu_simd: String,
    #[serde(default)]
    pub kernel_release: String,
}

/// Reads the whole fingerprint. Never fails: what cannot be read is `unknown`.
pub fn collect(opts: &CollectOptions) -> Fingerprint {
    let env = opts.env_vars.clone().unwrap_or_else(|| std::env::vars().collect());
    let mut probe = Probe { roots: &opts.roots, env, cmdline: None };
    probe.cmdline = read_trimmed(&probe.proc("cmdline"));

    let mut fields = Vec::new();
    fields.extend(host::collect(&probe));
    fields.extend(iommu::collect(&probe));
    fields.extend(container::collect(&probe));
    fields.extend(toolchain::collect(&probe, opts));
    fields.extend(gpu::collect(&probe));
    fields.extend(opts.extra.iter().cloned());
    Fingerprint::from_fields(fields)
}

impl Fingerprint {
    /// Builds the typed summary from the fields.
    pub fn from_fields(fields: Vec<Field>) -> Self {
        let get = |k: &str| fields.iter().find(|f| f.key == k).map_or(UNKNOWN, |f| f.value.as_str()).to_string();
        let hip = get("toolchain.hip_runtime");
        Fingerprint {
            schema: SCHEMA,
            version: get("civetta.version"),
            git_sha: get("civetta.git_sha"),
            backend: get("toolchain.backend"),
            kernel_compiler: short_compiler_name(&get("toolchain.kernel_compiler")),
            rocm: if hip != UNKNOWN { hip } else { get("toolchain.rocm_installed") },
            iommu_mode: get("iommu.mode"),
            container: get("container.type"),
            image: get("container.image"),
            gpu_arch: get("gpu.arch"),
            cpu_model: get("cpu.model"),
            cpu_simd: get("cpu.simd"),
            kernel_release: get("host.kernel_release"),
            fields,
        }
    }

    /// The value of a field, if present.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields.iter().find(|f| f.key == key).map(|f| f.value.as_str())
    }

    /// The whole field, if present.
    pub fn field(&self, key: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.key == key)
    }

    /// An aligned table: `key  value  (source)`, one field a line.
    pub fn render_text(&self) -> String {
        let key_w = self.fields.iter().map(|f| f.key.chars().count()).max().unwrap_or(0);
        // Very long values (the command line) would push every source off screen.
        let val_w = self.fields.iter().map(|f| f.value.chars().count()).filter(|&n| n <= 48).max().unwrap_or(0);
        let mut out = String::new();
        for f in &self.fields {
            let value = if f.value.is_empty() { "\"\"" } else { f.value.as_str() };
            out.push_str(&format!("{:key_w$}  {:val_w$}  ({})\n", f.key, value, f.source));
        }
        out
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a fingerprint is plain strings")
    }

    /// Parses what [`Fingerprint::to_json`] wrote; the summary is rebuilt from the fields
    /// when a writer left it out.
    pub fn from_json(value: &serde_json::Value) -> anyhow::Result<Self> {
        let fp: Fingerprint = serde_json::from_value(value.clone()).map_err(|e| anyhow::anyhow!("not an environment fingerprint: {e}"))?;
        if fp.schema != SCHEMA {
            anyhow::bail!("environment fingerprint schema {} is not supported (this build reads {SCHEMA})", fp.schema);
        }
        Ok(if fp.version.is_empty() { Fingerprint::from_fields(fp.fields) } else { fp })
    }

    /// Fields that differ between two fingerprints, ordered most relevant first (kernel
    /// compiler, gpu arch, rocm, iommu, container, backend, cpu/simd, kernel release, ...
    /// then the rest in field order), as (key, self's value, other's value). A key only
    /// one side has is reported with [`ABSENT`] for the other.
    pub fn diff<'a>(&'a self, other: &'a Fingerprint) -> Vec<(&'a str, &'a str, &'a str)> {
        let mut out: Vec<(&str, &str, &str)> = Vec::new();
        for f in &self.fields {
            let b = other.get(&f.key).unwrap_or(ABSENT);
            if b != f.value {
                out.push((&f.key, &f.value, b));
            }
        }
        for f in &other.fields {
            if self.get(&f.key).is_none() {
                out.push((&f.key, ABSENT, &f.value));
            }
        }
        // Stable sort: equal relevance keeps field order.
        out.sort_by_key(|(key, _, _)| diff_rank(key));
        out
    }

    /// Low-cardinality labels for the `civetta_environment_info{...} 1` gauge: the build and
    /// the settings a dashboard needs to tell two machines' numbers apart (power profile,
    /// CPU governor, the first GPU's performance level and GTT size, kernel, huge pages).
    pub fn info_labels(&self) -> Vec<(String, String)> {
        let field = |k: &str| self.get(k).unwrap_or(UNKNOWN).to_string();
        let (power_profile, governor, epp) = (field("host.power_profile"), field("host.governor"), field("host.energy_perf_preference"));
        let (gpu_perf, gtt, thp) = (field("gpu.0.perf_level"), field("gpu.0.gtt_total_bytes"), field("host.thp"));
        [
            ("version", &self.version),
            ("git_sha", &self.git_sha),
            ("backend", &self.backend),
            ("compiler", &self.kernel_compiler),
            ("rocm", &self.rocm),
            ("iommu", &self.iommu_mode),
            ("container", &self.container),
            ("gpu_arch", &self.gpu_arch),
            ("image", &self.image),
            ("kernel", &self.kernel_release),
            ("power_profile", &power_profile),
            ("governor", &governor),
            ("epp", &epp),
            ("gpu_perf_level", &gpu_perf),
            ("gtt_total_bytes", &gtt),
            ("thp", &thp),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), if v.is_empty() { UNKNOWN.to_string() } else { v.clone() }))
        .collect()
    }

    /// The `civetta_environment_info` gauge with value 1 and [`Fingerprint::info_labels`],
    /// ready to register.
    pub fn info_gauge(&self) -> prometheus::Result<prometheus::IntGaugeVec> {
        let labels = self.info_labels();
        let names: Vec<&str> = labels.iter().map(|(k, _)| k.as_str()).collect();
        let gauge = prometheus::IntGaugeVec::new(
            prometheus::Opts::new("civetta_environment_info", "Environment fingerprint of this process (value is always 1)"),
            &names,
        )?;
        let values: Vec<&str> = labels.iter().map(|(_, v)| v.as_str()).collect();
        gauge.with_label_values(&values).set(1);
        Ok(gauge)
    }

    /// The `GetEnvironment` reply.
    pub fn to_proto(&self) -> crate::proto::Environment {
        crate::proto::Environment {
            fields: self
                .fields
                .iter()
                .map(|f| crate::proto::EnvField { key: f.key.clone(), value: f.value.clone(), source: f.source.clone() })
                .collect(),
            json: self.to_json().to_string(),
        }
    }
}

/// Keys whose value changes between two runs on the same machine and setup (the current
/// GPU clock, the container's generated name and id): `compare` may leave them out.
pub fn is_volatile(key: &str) -> bool {
    key_matches("gpu.*.sclk_mhz", key) || key_matches("gpu.*.gtt_used_bytes", key) || key == "container.id" || key == "container.name"
}

/// Relevance of a key in a diff: lower comes first. Patterns match dotted segments, `*`
/// one segment, a trailing `**` the rest.
fn diff_rank(key: &str) -> usize {
    const ORDER: &[&str] = &[
        "toolchain.kernel_compiler",
        "gpu.arch",
        "gpu.*.arch",
        "toolchain.hip_runtime",
        "toolchain.rocm_installed",
        "iommu.mode",
        "container.type",
        "toolchain.backend",
        "cpu.model",
        "cpu.simd",
        "host.kernel_release",
        "civetta.version",
        "civetta.git_sha",
        "container.image",
        "gpu.*.name",
        "gpu.*.compute_units",
        "kparam.**",
        "cpu.**",
        "host.memory_total_bytes",
        "host.power_profile",
        "host.governor",
        "host.energy_perf_preference",
        "gpu.*.power_profile_mode",
        "gpu.*.perf_level",
        "gpu.*.gtt_total_bytes",
        "gpu.*.firmware",
        "host.kernel_version",
        "host.thp",
        "gpu.**",
        "host.**",
        "iommu.**",
        "container.**",
        "toolchain.**",
        "civetta.**",
    ];
    ORDER.iter().position(|p| key_matches(p, key)).unwrap_or(ORDER.len())
}

pub(crate) fn key_matches(pattern: &str, key: &str) -> bool {
    let mut k = key.split('.');
    for p in pattern.split('.') {
        if p == "**" {
            return true;
        }
        match k.next() {
            Some(seg) if p == "*" || p == seg => {}
            _ => return false,
        }
    }
    k.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_patterns() {
        assert!(key_matches("gpu.*.arch", "gpu.0.arch"));
        assert!(!key_matches("gpu.*.arch", "gpu.0.arch.x"));
        assert!(!key_matches("gpu.*.arch", "gpu.arch"));
        assert!(key_matches("kparam.**", "kparam.ttm.pages_limit.cmdline"));
        assert!(!key_matches("iommu.mode", "iommu.mode_x"));
    }

    #[test]
    fn volatile_keys() {
        assert!(is_volatile("gpu.0.sclk_mhz"));
        assert!(is_volatile("container.id"));
        assert!(!is_volatile("gpu.0.sclk_range_mhz"));
        assert!(!is_volatile("container.type"));
    }

    #[test]
    fn cmdline_params_stop_at_init_args() {
        let p = cmdline_params("ro iommu=pt quiet -- iommu=off");
        assert_eq!(p, vec![("ro", ""), ("iommu", "pt"), ("quiet", "")]);
    }

    #[test]
    fn natural_order() {
        let mut v = vec!["card10", "card2", "card1"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v, ["card1", "card2", "card10"]);
    }
}
