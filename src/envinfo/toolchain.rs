//! Toolchain: civetta's version and git sha, the clang that built the GPU kernels, the
//! ROCm/HIP runtime, the backend in use.

use super::{list_dir, read_trimmed, CollectOptions, Field, Probe};
use parking_lot::RwLock;
use std::path::{Path, PathBuf};

/// (version, source) recorded by a GPU backend at start-up.
static RUNTIME_VERSION: RwLock<Option<(String, String)>> = RwLock::new(None);

/// Hook for the HIP backend: record the runtime version it got from the runtime (e.g.
/// `hipRuntimeGetVersion`) so later fingerprints report it. `source` names the call.
pub fn set_runtime_version(version: impl Into<String>, source: impl Into<String>) {
    *RUNTIME_VERSION.write() = Some((version.into(), source.into()));
}

/// `clang version 22.1.8 (...)` -> `clang 22.1.8`; `AMD clang version 19.0.0git (...)` ->
/// `AMD clang 19.0.0git`; several compilers joined by `; ` are shortened each. Anything
/// else (`none`, `unknown`, an unfamiliar line) is returned as it is.
pub fn short_compiler_name(full: &str) -> String {
    full.split("; ")
        .map(|one| match one.split_once(" version ") {
            Some((name, rest)) => format!("{} {}", name.trim(), rest.split_whitespace().next().unwrap_or("")),
            None => one.to_string(),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

pub(crate) fn collect(p: &Probe, opts: &CollectOptions) -> Vec<Field> {
    use crate::build_info;
    let mut out = vec![
        Field::new("civetta.version", build_info::VERSION, "build: CARGO_PKG_VERSION"),
        Field::new("civetta.git_sha", build_info::GIT_SHA, "build: git rev-parse (build.rs)"),
        Field::new("civetta.rustc", build_info::RUSTC, "build: rustc --version"),
        kernel_compiler(p, opts),
    ];
    out.push(match (&opts.hip_runtime_version, RUNTIME_VERSION.read().clone()) {
        (Some(v), _) => Field::new("toolchain.hip_runtime", v.clone(), "collect options (from the HIP backend)"),
        (None, Some((v, src))) => Field::new("toolchain.hip_runtime", v, src),
        (None, None) => Field::unknown("toolchain.hip_runtime", "HIP backend not present"),
    });
    out.push(match read_trimmed(&p.root("opt/rocm/.info/version")) {
        Some(v) if !v.is_empty() => Field::new("toolchain.rocm_installed", v, "/opt/rocm/.info/version"),
        _ => Field::new("toolchain.rocm_installed", "none", "/opt/rocm/.info/version (absent)"),
    });
    out.push(Field::new("toolchain.backend", opts.backend.clone(), "caller (backend in use)"));
    out
}

/// The `clang --version` captured when the kernels were built: `<dir>/compiler.txt` and
/// `<dir>/*/compiler.txt`, where dir is the option, else `$CIVETTA_KERNEL_DIR`, else
/// `./build/kernels`; `$CIVETTA_KERNEL_COMPILER` (set by packaging) overrides the search
/// only when no directory was given explicitly.
fn kernel_compiler(p: &Probe, opts: &CollectOptions) -> Field {
    const KEY: &str = "toolchain.kernel_compiler";
    let dir: PathBuf = match &opts.kernel_build_dir {
        Some(d) => d.clone(),
        None => {
            if let Some(c) = p.env("CIVETTA_KERNEL_COMPILER") {
                return Field::new(KEY, c.lines().next().unwrap_or(c).trim(), "env CIVETTA_KERNEL_COMPILER");
            }
            p.env("CIVETTA_KERNEL_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("build/kernels"))
        }
    };
    let found = compiler_files(&dir);
    if found.is_empty() {
        return Field::new(KEY, "none", format!("no kernel build found ({}/*/compiler.txt)", dir.display()));
    }
    let mut versions: Vec<String> = Vec::new();
    for (_, line) in &found {
        if !versions.contains(line) {
            versions.push(line.clone());
        }
    }
    let source = if found.len() == 1 {
        format!("build: clang --version ({})", found[0].0.display())
    } else {
        format!("build: clang --version ({}/*/compiler.txt, {} builds)", dir.display(), found.len())
    };
    if versions.iter().all(|v| v.is_empty()) {
        return Field::unknown(KEY, format!("{source}: empty"));
    }
    Field::new(KEY, versions.join("; "), source)
}

/// (path, first non-empty line) of each compiler.txt in `dir` and its subdirectories.
fn compiler_files(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut candidates = vec![dir.join("compiler.txt")];
    for sub in list_dir(dir).unwrap_or_default() {
        candidates.push(dir.join(sub).join("compiler.txt"));
    }
    candidates
        .into_iter()
        .filter_map(|path| {
            let text = read_trimmed(&path)?;
            let first = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("").to_string();
            Some((path, first))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names() {
        assert_eq!(short_compiler_name("clang version 22.1.8 (Debian 22.1.8-1)"), "clang 22.1.8");
        assert_eq!(
            short_compiler_name("AMD clang version 19.0.0git (https://github.com/RadeonOpenCompute/llvm-project roc-6.4.4 25224 abc)"),
            "AMD clang 19.0.0git"
        );
        assert_eq!(short_compiler_name("Debian clang version 19.1.7 (3)"), "Debian clang 19.1.7");
        assert_eq!(short_compiler_name("clang version 22.1.8; clang version 23.0.0"), "clang 22.1.8; clang 23.0.0");
        assert_eq!(short_compiler_name("none"), "none");
    }
}
