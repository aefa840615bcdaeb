//! Shared by tests/kernels_*.rs: finding Debian's clang-19/clang-22 and compiling HIP
//! sources from kernels/ into code objects the way kernels/kernels.mk does.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The compilers CI installs (apt: clang-19 lld-19 llvm-19 clang-22 lld-22 llvm-22).
pub const CLANGS: [&str; 2] = ["clang-19", "clang-22"];

/// `clang --version` output, or `None` when the binary does not run.
pub fn clang_version(clang: &str) -> Option<String> {
    let out = Command::new(clang).arg("--version").output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The compilers to test with. A missing compiler fails the test with instructions,
/// unless CIVETTA_SKIP_CLANG=1 (then it is skipped with a note on stderr).
pub fn available_clangs() -> Vec<&'static str> {
    let skip = std::env::var("CIVETTA_SKIP_CLANG").is_ok_and(|v| v == "1");
    CLANGS
        .into_iter()
        .filter(|c| match clang_version(c) {
            Some(_) => true,
            None if skip => {
                eprintln!("skipping {c}: not installed and CIVETTA_SKIP_CLANG=1");
                false
            }
            None => panic!(
                "{c} not found. Install it (apt-get install -y --no-install-recommends {c} lld-{v} llvm-{v}) \
                 or set CIVETTA_SKIP_CLANG=1 to skip the GPU kernel tests",
                v = &c[6..]
            ),
        })
        .collect()
}

/// "clang-22.1.8" from "Debian clang version 22.1.8 (1~deb12u1)".
pub fn compiler_tag(clang: &str) -> String {
    let version = clang_version(clang).unwrap_or_default();
    let number = version.split("clang version ").nth(1).and_then(|rest| rest.split_whitespace().next()).unwrap_or("unknown");
    format!("clang-{number}")
}

pub fn kernels_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels")
}

/// What one compile produced.
pub struct Compiled {
    pub hsaco: PathBuf,
    /// clang's `-Rpass-analysis=kernel-resource-usage` remarks (stderr).
    pub remarks: String,
}

/// Compiles `source` for `arch` into `out_dir/<stem>.hsaco` and `<stem>.s`, with the
/// flags of kernels/kernels.mk.
pub fn compile(clang: &str, arch: &str, source: &Path, out_dir: &Path, stem: &str, defines: &[&str]) -> Compiled {
    std::fs::create_dir_all(out_dir).unwrap();
    let hsaco = out_dir.join(format!("{stem}.hsaco"));
    let asm = out_dir.join(format!("{stem}.s"));
    let run = |mode: &str, output: &Path, remarks: bool| {
        let mut cmd = Command::new(clang);
        cmd.args(["-x", "hip", "--offload-device-only", "--no-gpu-bundle-output", "-nogpuinc", "-nogpulib"])
            .args(["-O3", "-std=c++17", "-mcode-object-version=5"])
            .arg(format!("--offload-arch={arch}"))
            .arg("-I")
            .arg(kernels_dir())
            .args(defines.iter().map(|d| format!("-D{d}")))
            .arg(mode)
            .arg(source)
            .arg("-o")
            .arg(output);
        if remarks {
            cmd.arg("-Rpass-analysis=kernel-resource-usage");
        }
        let out = cmd.output().unwrap_or_else(|e| panic!("running {clang}: {e}"));
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{clang} {mode} {} for {arch} failed:\n{stderr}", source.display());
        stderr
    };
    let remarks = run("-c", &hsaco, true);
    run("-S", &asm, false);
    Compiled { hsaco, remarks }
}

/// Per kernel, the remark values clang printed: name -> (key -> value).
/// Keys are the remark labels, e.g. "VGPRs", "Occupancy [waves/SIMD]", "LDS Size [bytes/block]".
pub fn parse_remarks(remarks: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut kernels: Vec<(String, Vec<(String, String)>)> = Vec::new();
    for line in remarks.lines() {
        let Some((_, rest)) = line.split_once("remark: ") else { continue };
        let rest = rest.split(" [-Rpass-analysis").next().unwrap_or(rest).trim();
        let Some((key, value)) = rest.split_once(": ") else { continue };
        if key == "Function Name" {
            kernels.push((value.trim().to_string(), Vec::new()));
        } else if let Some((_, fields)) = kernels.last_mut() {
            fields.push((key.trim().to_string(), value.trim().to_string()));
        }
    }
    kernels
}

/// A remark value as a number; `None` if absent or symbolic (clang-22 may print expressions).
pub fn remark_u32(fields: &[(String, String)], key: &str) -> Option<u32> {
    fields.iter().find(|(k, _)| k == key).and_then(|(_, v)| v.parse().ok())
}
