//! The per-kernel resource table of one compiler's build, and the side-by-side
//! comparison of two builds, as markdown or JSON.

use super::codeobj::{read_code_object_file, KernelResources};
use super::occupancy::{waves_per_simd, OccupancyReport};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One kernel instantiation of one code object.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReportRow {
    /// Code object stem, e.g. `gemm_w8a8.sb` for `gemm_w8a8.sb.hsaco`.
    pub object: String,
    #[serde(flatten)]
    pub kernel: KernelResources,
    /// Waves per SIMD at the kernel's `max_flat_workgroup_size` (our kernels launch
    /// exactly that many work-items); `None` for processors without a model.
    pub occupancy: Option<OccupancyReport>,
}

/// Every kernel of one compiler's build directory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildReport {
    /// Compiler tag, e.g. `clang-22.1.8` (the build directory's name).
    pub compiler: String,
    /// First line of `compiler.txt` (`clang --version`), when present.
    pub compiler_version: Option<String>,
    pub kernels: Vec<ReportRow>,
}

impl BuildReport {
    pub fn find(&self, arch: &str, object: &str, kernel: &str) -> Option<&ReportRow> {
        self.kernels.iter().find(|r| r.kernel.arch == arch && r.object == object && r.kernel.name == kernel)
    }
}

/// Reads every `*.hsaco` under `dir` (the directory itself and one level of arch
/// subdirectories, as `make kernels` lays them out).
pub fn scan_build_dir(dir: &Path) -> Result<BuildReport> {
    if !dir.is_dir() {
        bail!("{} is not a directory (run `make kernels` first)", dir.display());
    }
    let mut files = code_objects_in(dir)?;
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            files.extend(code_objects_in(&path)?);
        }
    }
    if files.is_empty() {
        bail!("no .hsaco code objects in {}", dir.display());
    }
    let mut kernels = Vec::new();
    for file in files {
        let object = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        for kernel in read_code_object_file(&file)? {
            let occupancy = waves_per_simd(&kernel.arch, &kernel, kernel.max_flat_workgroup_size);
            kernels.push(ReportRow { object: object.clone(), kernel, occupancy });
        }
    }
    kernels.sort_by(|a, b| (&a.kernel.arch, &a.object, &a.kernel.name).cmp(&(&b.kernel.arch, &b.object, &b.kernel.name)));
    let (compiler, compiler_version) = compiler_of(dir);
    Ok(BuildReport { compiler, compiler_version, kernels })
}

fn code_objects_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_file() && path.extension().is_some_and(|e| e == "hsaco") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// The compiler tag and version: from `compiler.txt` in `dir` or its parent (when `dir`
/// is an arch subdirectory), else the directory name alone.
fn compiler_of(dir: &Path) -> (String, Option<String>) {
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    for candidate in [Some(canonical.as_path()), canonical.parent()].into_iter().flatten() {
        if let Ok(text) = std::fs::read_to_string(candidate.join("compiler.txt")) {
            let tag = candidate.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            return (tag, text.lines().next().map(str::to_string));
        }
    }
    (canonical.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), None)
}

fn waves(row: &ReportRow) -> String {
    match &row.occupancy {
        Some(o) => format!("{} ({})", o.waves_per_simd, o.limited_by),
        None => "-".into(),
    }
}

fn scratch_instructions(row: &ReportRow) -> String {
    row.kernel.scratch_instructions.map_or_else(|| "?".into(), |n| n.to_string())
}

/// Markdown table of one build.
pub fn render_markdown(report: &BuildReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "### {}", report.compiler);
    if let Some(v) = &report.compiler_version {
        let _ = writeln!(out, "\n`{v}`");
    }
    out.push_str(
        "\n| arch | object | kernel | VGPRs | SGPRs | scratch B/lane | VGPR spills | SGPR spills | LDS B | waves/SIMD | scratch instr |\n",
    );
    out.push_str("|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    for r in &report.kernels {
        let k = &r.kernel;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            k.arch,
            r.object,
            k.name,
            k.vgprs,
            k.sgprs,
            k.scratch_bytes,
            k.vgpr_spills,
            k.sgpr_spills,
            k.lds_bytes,
            waves(r),
            scratch_instructions(r)
        );
    }
    out
}

/// One kernel instantiation in two builds; `None` where a build lacks it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompareRow {
    pub arch: String,
    pub object: String,
    pub kernel: String,
    pub a: Option<ReportRow>,
    pub b: Option<ReportRow>,
}

impl CompareRow {
    /// True when any reported quantity differs (or one side is missing).
    pub fn differs(&self) -> bool {
        match (&self.a, &self.b) {
            (Some(a), Some(b)) => {
                let (ka, kb) = (&a.kernel, &b.kernel);
                (ka.vgprs, ka.sgprs, ka.scratch_bytes, ka.vgpr_spills, ka.sgpr_spills, ka.lds_bytes, ka.scratch_instructions)
                    != (kb.vgprs, kb.sgprs, kb.scratch_bytes, kb.vgpr_spills, kb.sgpr_spills, kb.lds_bytes, kb.scratch_instructions)
                    || a.occupancy.map(|o| o.waves_per_simd) != b.occupancy.map(|o| o.waves_per_simd)
            }
            _ => true,
        }
    }
}

/// Pairs up the kernels of two builds by (arch, code object, kernel name).
pub fn compare(a: &BuildReport, b: &BuildReport) -> Vec<CompareRow> {
    let mut keys: Vec<(String, String, String)> =
        a.kernels.iter().chain(&b.kernels).map(|r| (r.kernel.arch.clone(), r.object.clone(), r.kernel.name.clone())).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|(arch, object, kernel)| CompareRow {
            a: a.find(&arch, &object, &kernel).cloned(),
            b: b.find(&arch, &object, &kernel).cloned(),
            arch,
            object,
            kernel,
        })
        .collect()
}

fn side_by_side(a: Option<u32>, b: Option<u32>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if a == b => a.to_string(),
        (Some(a), Some(b)) => format!("**{a} → {b}** ({:+})", i64::from(b) - i64::from(a)),
        (a, b) => format!("{} → {}", a.map_or("-".into(), |v| v.to_string()), b.map_or("-".into(), |v| v.to_string())),
    }
}

/// Markdown comparison of two builds: one column per quantity, `A → B (delta)` where they differ.
/// `changed_only` lists only the rows that differ; the closing count is over all of `rows`.
pub fn render_compare_markdown(a: &BuildReport, b: &BuildReport, rows: &[CompareRow], changed_only: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "### {} → {}\n", a.compiler, b.compiler);
    out.push_str("| arch | object | kernel | VGPRs | SGPRs | scratch B/lane | VGPR spills | LDS B | waves/SIMD | scratch instr |\n");
    out.push_str("|---|---|---|--:|--:|--:|--:|--:|--:|--:|\n");
    for row in rows.iter().filter(|r| !changed_only || r.differs()) {
        let get = |side: &Option<ReportRow>, f: &dyn Fn(&ReportRow) -> Option<u32>| side.as_ref().and_then(f);
        let col = |f: &dyn Fn(&ReportRow) -> Option<u32>| side_by_side(get(&row.a, f), get(&row.b, f));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.arch,
            row.object,
            row.kernel,
            col(&|r| Some(r.kernel.vgprs)),
            col(&|r| Some(r.kernel.sgprs)),
            col(&|r| Some(r.kernel.scratch_bytes)),
            col(&|r| Some(r.kernel.vgpr_spills)),
            col(&|r| Some(r.kernel.lds_bytes)),
            col(&|r| r.occupancy.map(|o| o.waves_per_simd)),
            col(&|r| r.kernel.scratch_instructions),
        );
    }
    let changed = rows.iter().filter(|r| r.differs()).count();
    let _ = writeln!(out, "\n{changed} of {} kernel instantiations differ.", rows.len());
    out
}

/// JSON form of a comparison.
pub fn compare_json(a: &BuildReport, b: &BuildReport, rows: &[CompareRow]) -> serde_json::Value {
    serde_json::json!({ "a": a.compiler, "b": b.compiler, "kernels": rows })
}
