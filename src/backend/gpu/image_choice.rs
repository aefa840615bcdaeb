//! Which build of a GEMM kernel file to load: the plain one or its sched_barrier (`.sb`) build.
//!
//! Whether a compiler needs the sched_barrier is read from what it produced, not from its
//! version: the AMDGPU code object's metadata note has each kernel's spill counts. The `.sb`
//! build is loaded when the plain build of a kernel we launch spills and the `.sb` build of
//! that kernel does not (or when the configuration asks for `.sb`). PTX carries no such
//! metadata, so on NVIDIA only the configuration decides.

use crate::kernels::read_code_object;
use std::path::{Path, PathBuf};

/// The image to load for one kernel file, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageChoice {
    pub path: PathBuf,
    pub sched_barrier: bool,
    pub reason: String,
}

/// Spilled registers (VGPR + SGPR) of the named kernels in an AMDGPU code object; `None` if
/// the file is missing, is not a code object, or lacks one of the kernels.
pub fn spills_of(path: &Path, kernels: &[String]) -> Option<u32> {
    let objects = read_code_object(&std::fs::read(path).ok()?).ok()?;
    let mut total = 0;
    for name in kernels {
        let k = objects.iter().find(|k| &k.name == name)?;
        total += k.vgpr_spills + k.sgpr_spills;
    }
    Some(total)
}

/// Chooses between `<dir>/<file>.<ext>` and `<dir>/<file>.sb.<ext>` for the kernels (symbol
/// names) the backend launches from that file.
pub fn choose_image(dir: &Path, file: &str, ext: &str, kernels: &[String], want_sched_barrier: bool) -> ImageChoice {
    let plain = dir.join(format!("{file}.{ext}"));
    let sb = dir.join(format!("{file}.sb.{ext}"));
    let keep = |reason: String| ImageChoice { path: plain.clone(), sched_barrier: false, reason };
    if !sb.exists() {
        return keep("no .sb build".into());
    }
    let use_sb = |reason: String| ImageChoice { path: sb.clone(), sched_barrier: true, reason };
    if want_sched_barrier {
        return use_sb("engine.gpu.sched_barrier = true".into());
    }
    if ext != "hsaco" {
        return keep("no spill metadata in this image format".into());
    }
    match (spills_of(&plain, kernels), spills_of(&sb, kernels)) {
        (Some(p), Some(0)) if p > 0 => use_sb(format!("plain build spills {p} registers, .sb build none (code object metadata)")),
        (Some(p), Some(s)) => keep(format!("plain build spills {p} registers, .sb build {s}")),
        _ => keep("metadata unreadable; plain build".into()),
    }
}
