//! Backend selection through the real binary: GPU backends refuse clearly when they cannot
//! run (not compiled in, no driver, no device) and never fall back to the CPU silently;
//! "auto" does fall back, and says so. The GPU paths themselves are checked on a GPU by
//! scripts/gpu-check.sh (docs/GPU.md).

mod common;
use common::*;
use std::path::Path;

fn generate(model: &Path, backend: &str) -> (i32, String, String) {
    let out = civetta()
        .args(["generate", "-m"])
        .arg(model)
        .args(["--prompt", "hello", "-n", "4", "--backend", backend])
        .env("CIVETTA_LOG", "info")
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// One `civetta: error:` line and no panic or backtrace.
fn assert_one_clear_line(stderr: &str, needle: &str) {
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("civetta: error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains(needle), "expected {needle:?} in {stderr}");
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"), "{stderr}");
}

#[test]
fn unknown_and_missing_backends_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let (code, _, err) = generate(&model, "tpu");
    assert_eq!(code, 2);
    assert_one_clear_line(&err, "unknown backend \"tpu\"");
    for gpu in ["cuda", "hip"] {
        if cfg!(feature = "cuda") && gpu == "cuda" || cfg!(feature = "hip") && gpu == "hip" {
            continue; // compiled in: see the no-device tests below
        }
        let (code, out, err) = generate(&model, gpu);
        assert_eq!(code, 2, "{err}");
        assert!(out.is_empty(), "nothing may be generated on another backend: {out}");
        assert_one_clear_line(&err, &format!("backend \"{gpu}\" is not available in this build"));
        assert!(err.contains("--features"), "{err}");
    }
}

#[test]
fn auto_falls_back_to_the_cpu_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    if Path::new("/dev/kfd").exists() || Path::new("/dev/nvidiactl").exists() {
        eprintln!("skipping: this host has a GPU device node");
        return;
    }
    let (code, out, err) = generate(&model, "auto");
    assert_eq!(code, 0, "{err}");
    assert!(!out.trim().is_empty(), "the CPU backend generated nothing");
    assert!(err.contains("using the CPU backend"), "{err}");
    let (_, cpu_out, _) = generate(&model, "cpu");
    assert_eq!(out, cpu_out, "auto without a GPU must be the CPU backend");
}

#[cfg(feature = "hip")]
#[test]
fn hip_without_a_device_is_one_clear_error() {
    if Path::new("/dev/kfd").exists() {
        eprintln!("skipping: /dev/kfd exists, this host may have an AMD GPU");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let (code, out, err) = generate(&model, "hip");
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty());
    assert_one_clear_line(&err, "hip backend: no usable AMD GPU");
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_without_a_driver_is_one_clear_error() {
    if Path::new("/dev/nvidiactl").exists() {
        eprintln!("skipping: /dev/nvidiactl exists, this host may have an NVIDIA GPU");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let (code, out, err) = generate(&model, "cuda");
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty());
    assert_one_clear_line(&err, "cuda backend:");
}
