//! The spill gate and the report on a build laid out like `make kernels`: one clean kernel
//! and one forced to spill, per compiler.

mod kernels_support;

use civetta::kernels::cli::{run, GateArgs, KernelsArgs, KernelsCmd};
use civetta::kernels::gate::{check, Allowlist};
use civetta::kernels::report::{compare, render_compare_markdown, render_markdown, scan_build_dir};
use kernels_support::*;
use std::path::{Path, PathBuf};

const SOURCE: &str = r#"
#include "civetta_gpu.h"
CV_KERNEL CV_LAUNCH_BOUNDS(64) void clean_copy(float* out, const float* in) {
  out[cv_tid_x()] = in[cv_tid_x()] * 2.0f;
}
CV_KERNEL CV_LAUNCH_BOUNDS(64) __attribute__((amdgpu_num_vgpr(24))) void forced_spill(float* out, const float* in, int n) {
  float acc[48];
  CV_UNROLL for (int i = 0; i < 48; ++i) acc[i] = in[i * 64 + cv_tid_x()];
  for (int r = 0; r < n; ++r) {
    CV_UNROLL for (int i = 0; i < 48; ++i) acc[i] = acc[i] * acc[(i + 7) % 48] + in[r * 48 + i];
  }
  CV_UNROLL for (int i = 0; i < 48; ++i) out[i * 64 + cv_tid_x()] = acc[i];
}
"#;

/// build/kernels/<tag>/gfx1151/demo.hsaco (+ .s) and compiler.txt, as kernels.mk writes them.
fn build(root: &Path, clang: &str) -> PathBuf {
    let source = root.join("demo.hip");
    std::fs::write(&source, SOURCE).unwrap();
    let out = root.join(compiler_tag(clang));
    compile(clang, "gfx1151", &source, &out.join("gfx1151"), "demo", &[]);
    std::fs::write(out.join("compiler.txt"), clang_version(clang).unwrap()).unwrap();
    out
}

fn gate(dir: &Path, allowlist: &Path) -> i32 {
    run(KernelsArgs { cmd: KernelsCmd::Gate(GateArgs { dir: dir.to_path_buf(), allowlist: allowlist.to_path_buf() }) }).unwrap()
}

#[test]
fn gate_fails_on_the_spilling_kernel_unless_allow_listed() {
    let root = tempfile::tempdir().unwrap();
    let empty = root.path().join("empty.toml");
    std::fs::write(&empty, "").unwrap();
    let allowed = root.path().join("allowed.toml");
    std::fs::write(
        &allowed,
        "[[allow]]\nkernel = \"forced_spill\"\nobject = \"demo\"\narch = \"gfx1151\"\nreason = \"test kernel capped at 24 VGPRs\"\n",
    )
    .unwrap();
    let other_arch = root.path().join("other_arch.toml");
    std::fs::write(&other_arch, "[[allow]]\nkernel = \"forced_spill\"\narch = \"gfx1100\"\nreason = \"wrong arch\"\n").unwrap();

    for clang in available_clangs() {
        let dir = build(root.path(), clang);
        let report = scan_build_dir(&dir).unwrap();
        assert_eq!(report.compiler, compiler_tag(clang));
        let no_exceptions = Allowlist::load(&empty).unwrap();
        let findings = check(&report, &no_exceptions);
        let names: Vec<&str> = findings.iter().map(|f| f.row.kernel.name.as_str()).collect();
        assert_eq!(names, ["forced_spill"], "{clang}");
        assert!(findings[0].describe(&report.compiler).contains("forced_spill"));

        assert_eq!(gate(&dir, &empty), 1, "{clang}: spill not caught");
        assert_eq!(gate(&dir, &other_arch), 1, "{clang}: entry for another arch must not match");
        assert_eq!(gate(&dir, &allowed), 0, "{clang}: allow-listed spill still fails");
        // The arch subdirectory alone is a valid build directory too.
        assert_eq!(gate(&dir.join("gfx1151"), &empty), 1);
    }
}

#[test]
fn gate_refuses_an_empty_build_and_a_reasonless_allowlist() {
    let root = tempfile::tempdir().unwrap();
    let allowlist = root.path().join("a.toml");
    std::fs::write(&allowlist, "").unwrap();
    let args =
        |dir: &Path, list: &Path| KernelsArgs { cmd: KernelsCmd::Gate(GateArgs { dir: dir.to_path_buf(), allowlist: list.to_path_buf() }) };
    let err = run(args(root.path(), &allowlist)).unwrap_err();
    assert!(err.to_string().contains("no .hsaco"), "{err}");
    std::fs::write(&allowlist, "[[allow]]\nkernel = \"k\"\n").unwrap();
    assert!(run(args(root.path(), &allowlist)).is_err());
}

#[test]
fn repository_allowlist_parses() {
    Allowlist::load(&kernels_dir().join("spill-allowlist.toml")).unwrap();
}

#[test]
fn report_and_compare_cover_both_compilers() {
    let clangs = available_clangs();
    let root = tempfile::tempdir().unwrap();
    let dirs: Vec<PathBuf> = clangs.iter().map(|c| build(root.path(), c)).collect();
    for dir in &dirs {
        let report = scan_build_dir(dir).unwrap();
        let table = render_markdown(&report);
        assert!(table.contains("| gfx1151 | demo | forced_spill |"), "{table}");
        assert!(table.contains("| gfx1151 | demo | clean_copy |"), "{table}");
    }
    if let [a, b] = dirs.as_slice() {
        let (a, b) = (scan_build_dir(a).unwrap(), scan_build_dir(b).unwrap());
        let rows = compare(&a, &b);
        assert_eq!(rows.len(), 2);
        assert!(rows.iter().all(|r| r.a.is_some() && r.b.is_some()));
        let text = render_compare_markdown(&a, &b, &rows, false);
        assert!(text.starts_with(&format!("### {} → {}", a.compiler, b.compiler)), "{text}");
        // A row shows "A → B" exactly where the two compilers disagree.
        for row in &rows {
            let line = text.lines().find(|l| l.contains(&format!("| {} |", row.kernel))).unwrap();
            assert_eq!(line.contains('→'), row.differs(), "{line}");
        }
        // --changed-only lists the differing rows and still counts them among all rows.
        let changed = rows.iter().filter(|r| r.differs()).count();
        let only = render_compare_markdown(&a, &b, &rows, true);
        assert_eq!(only.lines().filter(|l| l.starts_with("| gfx1151 |")).count(), changed, "{only}");
        assert!(only.contains(&format!("{changed} of 2 kernel instantiations differ.")), "{only}");
    }
}

/// The GPU backend loads a GEMM file's `.sb` build when the plain build of a kernel it
/// launches spills and the `.sb` build does not, read from the code objects' metadata.
#[test]
fn backend_picks_the_sched_barrier_build_from_spill_metadata() {
    use civetta::backend::gpu::image_choice::{choose_image, spills_of};
    // Stand-in for a compiler that needs the sched_barrier: the plain build is capped at 24 VGPRs.
    const PAIR: &str = r#"
#include "civetta_gpu.h"
#if CIVETTA_SCHED_BARRIER
#define CAP
#else
#define CAP __attribute__((amdgpu_num_vgpr(24)))
#endif
CV_KERNEL CV_LAUNCH_BOUNDS(64) CAP void civetta_k(float* out, const float* in, int n) {
  float acc[48];
  CV_UNROLL for (int i = 0; i < 48; ++i) acc[i] = in[i * 64 + cv_tid_x()];
  for (int r = 0; r < n; ++r) {
    CV_UNROLL for (int i = 0; i < 48; ++i) acc[i] = acc[i] * acc[(i + 7) % 48] + in[r * 48 + i];
  }
  CV_UNROLL for (int i = 0; i < 48; ++i) out[i * 64 + cv_tid_x()] = acc[i];
}
"#;
    let names = vec!["civetta_k".to_string()];
    for clang in available_clangs() {
        let root = tempfile::tempdir().unwrap();
        let source = root.path().join("gemm_demo.hip");
        std::fs::write(&source, PAIR).unwrap();
        let dir = root.path().join("gfx1151");
        compile(clang, "gfx1151", &source, &dir, "gemm_demo", &[]);
        let plain = choose_image(&dir, "gemm_demo", "hsaco", &names, false);
        assert!(!plain.sched_barrier, "{clang}: no .sb build yet: {}", plain.reason);
        compile(clang, "gfx1151", &source, &dir, "gemm_demo.sb", &["CIVETTA_SCHED_BARRIER=1"]);
        assert!(spills_of(&dir.join("gemm_demo.hsaco"), &names).unwrap() > 0, "{clang}: plain build must spill");
        assert_eq!(spills_of(&dir.join("gemm_demo.sb.hsaco"), &names), Some(0));
        let choice = choose_image(&dir, "gemm_demo", "hsaco", &names, false);
        assert!(choice.sched_barrier, "{clang}: {}", choice.reason);
        assert_eq!(choice.path, dir.join("gemm_demo.sb.hsaco"));
        // Neither spills: the plain build stays.
        compile(clang, "gfx1151", &source, &dir, "gemm_demo", &["CIVETTA_SCHED_BARRIER=1"]);
        let choice = choose_image(&dir, "gemm_demo", "hsaco", &names, false);
        assert!(!choice.sched_barrier, "{clang}: {}", choice.reason);
        assert!(choose_image(&dir, "gemm_demo", "hsaco", &names, true).sched_barrier, "configuration forces .sb");
    }
}
