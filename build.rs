//! Build script: compiles the gRPC protos and records build provenance
//! (git sha, rustc) so `civetta_build_info` and the environment fingerprint can report it.
use std::process::Command;

fn main() {
    let protoc = protoc_bin_vendored::protoc_bin_path().expect("vendored protoc");
    std::env::set_var("PROTOC", protoc);
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
    tonic_build::configure()
        .file_descriptor_set_path(out_dir.join("civetta_descriptor.bin"))
        .compile_protos(&["proto/civetta/v1/civetta.proto"], &["proto"])
        .expect("compile protos");
    println!("cargo:rerun-if-changed=proto");

    let git_sha = std::env::var("CIVETTA_GIT_SHA").ok().or_else(|| {
        Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    });
    println!("cargo:rustc-env=CIVETTA_GIT_SHA={}", git_sha.unwrap_or_else(|| "unknown".into()));
    println!("cargo:rerun-if-env-changed=CIVETTA_GIT_SHA");
    // In a git worktree `.git` is a file; ask git where HEAD really lives.
    let head = Command::new("git")
        .args(["rev-parse", "--git-path", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| ".git/HEAD".into());
    println!("cargo:rerun-if-changed={head}");
    // HEAD names a branch ("ref: refs/heads/main"), whose file is what changes on each commit or
    // merge: watch it too (and packed-refs), or the sha stays that of the first build.
    let git_path = |p: &str| {
        Command::new("git")
            .args(["rev-parse", "--git-path", p])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let branch = Command::new("git")
        .args(["symbolic-ref", "-q", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    for p in branch.iter().filter_map(|b| git_path(b)).chain(git_path("packed-refs")) {
        if std::path::Path::new(&p).exists() {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc_version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=CIVETTA_RUSTC_VERSION={rustc_version}");
}
