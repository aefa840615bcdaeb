//! The third kernel compiler, ROCm's LLVM 23 from PyPI (scripts/llvm23/clang-llvm23, installed
//! by scripts/llvm23-setup.sh): a kernel built through it really ran that library. The library
//! names itself in `--version` (compiler.txt) and in each code object's .comment section
//! (the `llvm.ident` the driver adds from the library's own version text), and its code object
//! has the NT_AMDGPU_METADATA note `civetta kernels report` reads.

mod kernels_support;

use civetta::kernels::read_code_object;
use civetta::kernels::report::scan_build_dir;
use kernels_support::*;
use object::{Object, ObjectSection};
use std::path::{Path, PathBuf};
use std::process::Command;

fn driver() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let driver = root.join("scripts/llvm23/clang-llvm23");
    if root.join("build/llvm23/lib/libLLVM.so").exists() {
        return Some(driver);
    }
    if std::env::var("CIVETTA_SKIP_CLANG").is_ok_and(|v| v == "1") {
        eprintln!("skipping: build/llvm23 missing and CIVETTA_SKIP_CLANG=1");
        return None;
    }
    panic!("build/llvm23/lib/libLLVM.so missing: run scripts/llvm23-setup.sh (scripts/test-deps.sh does)");
}

/// The strings of the ELF .comment section (producers: compiler idents and the linker).
fn comment_strings(hsaco: &Path) -> Vec<String> {
    let bytes = std::fs::read(hsaco).unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    let section = file.section_by_name(".comment").expect("code object has a .comment section");
    section.data().unwrap().split(|&b| b == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect()
}

/// The 40-hex commit in "... (commit <hex>) ...".
fn commit_in(text: &str) -> Option<String> {
    let rest = text.split("(commit ").nth(1)?;
    let hex: String = rest.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
    (hex.len() == 40).then_some(hex)
}

#[test]
fn llvm23_build_names_the_rocm_library_in_compiler_txt_and_the_code_object() {
    let Some(driver) = driver() else { return };
    let version = Command::new(&driver).arg("--version").output().unwrap();
    assert!(version.status.success(), "{}", String::from_utf8_lossy(&version.stderr));
    let version = String::from_utf8(version.stdout).unwrap();
    let first = version.lines().next().unwrap();
    assert!(first.contains("AMD LLVM version 23."), "{first}");
    assert!(first.contains("clang version 22."), "front end: {first}");
    assert!(version.contains("LLVMGetVersion: 23."), "{version}");
    assert!(version.contains("rocm-bindings-compiler==10.0.0.0.1.2"), "{version}");
    let commit = commit_in(first).expect("compiler.txt names the LLVM commit");
    assert!(commit.starts_with("8f497e0992fb"), "{commit}");

    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("llvm-23.0.0git");
    let source = kernels_dir().join("gemm_w8a8.hip");
    let compiled = compile(driver.to_str().unwrap(), "gfx1151", &source, &out.join("gfx1151"), "gemm_w8a8", &[]);
    std::fs::write(out.join("compiler.txt"), &version).unwrap();

    let comments = comment_strings(&compiled.hsaco);
    let ident = comments.iter().find(|c| c.contains("AMD LLVM version 23.")).unwrap_or_else(|| panic!("no LLVM 23 ident in {comments:?}"));
    assert_eq!(commit_in(ident).as_deref(), Some(commit.as_str()), "{ident}");
    assert!(comments.iter().any(|c| c.contains("clang version 22.")), "front end ident: {comments:?}");

    let kernels = read_code_object(&std::fs::read(&compiled.hsaco).unwrap()).unwrap();
    assert!(kernels.iter().any(|k| k.name == "civetta_gemm_w8a8_128x128" && k.arch == "gfx1151" && k.vgprs > 0), "{kernels:?}");
    let report = scan_build_dir(&out).unwrap();
    assert_eq!(report.compiler, "llvm-23.0.0git");
    assert_eq!(report.compiler_version.as_deref(), Some(first));
    assert!(report.kernels.iter().all(|r| r.kernel.scratch_instructions.is_some()), "assembly beside the code object");

    // Control: clang-22 alone leaves no LLVM 23 ident, so the check above can fail.
    if clang_version("clang-22").is_some() {
        let plain = compile("clang-22", "gfx1151", &source, &root.path().join("clang-22"), "gemm_w8a8", &[]);
        assert!(!comment_strings(&plain.hsaco).iter().any(|c| c.contains("LLVM version 23")));
    }
}
