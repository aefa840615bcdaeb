//! The HIP backend's hook: a process-wide setting, so it lives in its own test binary.

use civetta::envinfo::{self, collect, CollectOptions};
use std::path::PathBuf;

#[test]
fn runtime_version_hook_fills_the_hip_runtime() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/env/container-podman");
    let before = collect(&CollectOptions::fixture(&dir, "hip"));
    assert_eq!(before.get("toolchain.hip_runtime"), Some("unknown"));
    envinfo::set_runtime_version("7.1.25424", "runtime: hipRuntimeGetVersion");
    let fp = collect(&CollectOptions::fixture(&dir, "hip"));
    assert_eq!(fp.get("toolchain.hip_runtime"), Some("7.1.25424"));
    assert_eq!(fp.field("toolchain.hip_runtime").unwrap().source, "runtime: hipRuntimeGetVersion");
    assert_eq!(fp.rocm, "7.1.25424");
    // An explicit option wins over the hook.
    let mut opts = CollectOptions::fixture(&dir, "hip");
    opts.hip_runtime_version = Some("6.4.43484".into());
    assert_eq!(collect(&opts).rocm, "6.4.43484");
}
