//! The fingerprint's API: diff ordering, JSON round trip, metric labels, the real system
//! and the `civetta env` arguments.

use civetta::envinfo::{self, cli::EnvArgs, collect, CollectOptions, Field, Fingerprint, ABSENT};
use clap::Parser;
use std::path::PathBuf;

fn fixture(name: &str) -> Fingerprint {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/env").join(name);
    collect(&CollectOptions::fixture(dir, "cpu"))
}

fn set(fp: &mut Fingerprint, key: &str, value: &str) {
    let f = fp.fields.iter_mut().find(|f| f.key == key).unwrap_or_else(|| panic!("no field {key}"));
    f.value = value.to_string();
}

#[test]
fn diff_lists_the_most_relevant_differences_first() {
    let base = fixture("strix-halo");
    let mut new = base.clone();
    // Changed in an order unrelated to relevance.
    set(&mut new, "host.governor", "powersave");
    set(&mut new, "host.kernel_release", "6.18.1");
    // cpu.simd is detected live even for fixtures: pick a value that differs on any CPU.
    let simd = if base.get("cpu.simd") == Some("scalar") { "avx2" } else { "scalar" };
    set(&mut new, "cpu.simd", simd);
    set(&mut new, "container.type", "toolbox");
    set(&mut new, "toolchain.backend", "hip");
    set(&mut new, "iommu.mode", "translated");
    set(&mut new, "gpu.0.arch", "gfx1100");
    set(&mut new, "toolchain.kernel_compiler", "clang version 23.0.0");
    set(&mut new, "toolchain.rocm_installed", "7.2.2");
    new.fields.retain(|f| f.key != "gpu.0.perf_level");
    new.fields.push(Field::new("zz.extra", "1", "test"));
    let new = Fingerprint::from_fields(new.fields);

    let d = base.diff(&new);
    let keys: Vec<&str> = d.iter().map(|(k, _, _)| *k).collect();
    assert_eq!(
        keys,
        [
            "toolchain.kernel_compiler",
            "gpu.0.arch",
            "toolchain.rocm_installed",
            "iommu.mode",
            "container.type",
            "toolchain.backend",
            "cpu.simd",
            "host.kernel_release",
            "host.governor",
            "gpu.0.perf_level",
            "zz.extra",
        ]
    );
    assert_eq!(
        d[0],
        ("toolchain.kernel_compiler", "clang version 22.1.8 (https://github.com/llvm/llvm-project 0123abc)", "clang version 23.0.0")
    );
    assert_eq!(d[3], ("iommu.mode", "passthrough", "translated"));
    assert_eq!(d[9], ("gpu.0.perf_level", "auto", ABSENT));
    assert_eq!(d[10], ("zz.extra", ABSENT, "1"));
    // The summary follows the fields.
    assert_eq!(new.kernel_compiler, "clang 23.0.0");
    assert_eq!(new.container, "toolbox");
    assert!(base.diff(&base.clone()).is_empty());
}

#[test]
fn diff_between_two_fixture_machines_names_their_differences() {
    let a = fixture("strix-halo");
    let b = fixture("container-toolbox");
    let d = a.diff(&b);
    let find = |k: &str| d.iter().find(|(key, _, _)| *key == k).copied();
    assert_eq!(find("container.type"), Some(("container.type", "none", "toolbox")));
    assert_eq!(find("toolchain.kernel_compiler"), Some(("toolchain.kernel_compiler", d[0].1, "none")));
    assert_eq!(d[0].0, "toolchain.kernel_compiler");
    // Fields that agree (the build provenance) are not listed.
    assert!(find("civetta.version").is_none());
}

#[test]
fn json_round_trip_and_schema() {
    let fp = fixture("strix-halo");
    let json = fp.to_json();
    assert_eq!(json["schema"], envinfo::SCHEMA);
    assert_eq!(json["iommu_mode"], "passthrough");
    assert_eq!(json["gpu_arch"], "gfx1151");
    assert!(json["fields"].as_array().unwrap().iter().any(|f| f["key"] == "iommu.mode" && f["source"].is_string()));
    let back = Fingerprint::from_json(&json).unwrap();
    assert_eq!(back, fp);

    // A writer that only kept the fields gets its summary rebuilt.
    let only_fields = serde_json::json!({"schema": envinfo::SCHEMA, "fields": json["fields"].clone()});
    assert_eq!(Fingerprint::from_json(&only_fields).unwrap(), fp);

    let err = Fingerprint::from_json(&serde_json::json!({"schema": 999, "fields": []})).unwrap_err();
    assert!(err.to_string().contains("schema 999"), "{err}");
    let err = Fingerprint::from_json(&serde_json::json!([1, 2])).unwrap_err();
    assert!(err.to_string().contains("not an environment fingerprint"), "{err}");
}

#[test]
fn info_labels_and_the_prometheus_gauge() {
    let fp = fixture("container-podman");
    let labels = fp.info_labels();
    let names: Vec<&str> = labels.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "version",
            "git_sha",
            "backend",
            "compiler",
            "rocm",
            "iommu",
            "container",
            "gpu_arch",
            "image",
            "kernel",
            "power_profile",
            "governor",
            "epp",
            "gpu_perf_level",
            "gtt_total_bytes",
            "thp"
        ]
    );
    let label = |k: &str| labels.iter().find(|(n, _)| n == k).unwrap().1.as_str();
    assert_eq!(label("container"), "podman");
    assert_eq!(label("image"), "civetta:rocm-7.1.1-clang20");
    assert_eq!(label("compiler"), "none");
    assert_eq!(label("version"), env!("CARGO_PKG_VERSION"));

    let registry = prometheus::Registry::new();
    registry.register(Box::new(fp.info_gauge().unwrap())).unwrap();
    let mut out = Vec::new();
    prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &registry.gather(), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let line = text.lines().find(|l| l.starts_with("civetta_environment_info{")).expect(&text);
    assert!(line.ends_with(" 1"), "{line}");
    assert!(line.contains("container=\"podman\"") && line.contains("image=\"civetta:rocm-7.1.1-clang20\""), "{line}");
}

#[test]
fn proto_reply_carries_every_field_and_the_json() {
    let fp = fixture("strix-halo");
    let reply = fp.to_proto();
    assert_eq!(reply.fields.len(), fp.fields.len());
    let iommu = reply.fields.iter().find(|f| f.key == "iommu.mode").unwrap();
    assert_eq!(iommu.value, "passthrough");
    assert!(!iommu.source.is_empty());
    let parsed: serde_json::Value = serde_json::from_str(&reply.json).unwrap();
    assert_eq!(Fingerprint::from_json(&parsed).unwrap(), fp);
}

#[test]
fn render_text_aligns_key_value_and_source() {
    let fp = fixture("strix-halo");
    let text = fp.render_text();
    assert_eq!(text.lines().count(), fp.fields.len());
    let line = text.lines().find(|l| l.starts_with("gpu.arch ")).unwrap();
    assert!(line.contains(" gfx1151 ") && line.ends_with("(/sys/class/kfd/kfd/topology/nodes/*/properties gfx_target_version)"), "{line}");
    // Values start in the same column on every line.
    let col = |l: &str| l.find("  ").map(|i| i + l[i..].len() - l[i..].trim_start().len());
    let c = col(text.lines().next().unwrap());
    assert!(text.lines().all(|l| col(l) == c), "{text}");
}

/// The real machine: must not panic, and the container verdict must agree with the markers.
#[test]
fn the_real_system() {
    let fp = collect(&CollectOptions::system("cpu"));
    for f in &fp.fields {
        assert!(!f.key.is_empty() && !f.source.is_empty(), "{f:?}");
    }
    assert_eq!(fp.get("container.type"), Some(fp.container.as_str()));
    assert_eq!(fp.get("iommu.mode"), Some(fp.iommu_mode.as_str()));
    assert!(["off", "passthrough", "translated", "unknown"].contains(&fp.iommu_mode.as_str()));
    assert!(["none", "podman", "docker", "toolbox", "distrobox", "unknown"].contains(&fp.container.as_str()));
    assert_ne!(fp.get("cpu.simd"), Some("amx"));
    assert_eq!(fp.version, env!("CARGO_PKG_VERSION"));

    let markers = ["/run/.containerenv", "/run/.toolboxenv", "/run/.toolbxenv", "/etc/profile.d/distrobox_profile.sh"];
    let env_says_container = std::env::var_os("container").is_some();
    if !markers.iter().any(|m| std::path::Path::new(m).exists()) && !env_says_container {
        let cgroup = std::fs::read_to_string("/proc/1/cgroup").unwrap_or_default();
        if !cgroup.contains("libpod") && !cgroup.contains("docker") {
            // A stray /.dockerenv (as on these CI hosts) must not make this a container.
            assert!(["none", "unknown"].contains(&fp.container.as_str()), "{}", fp.render_text());
        }
    }
    if std::path::Path::new("/run/.containerenv").exists() && !std::path::Path::new("/run/.toolboxenv").exists() {
        assert_eq!(fp.container, "podman", "{}", fp.render_text());
    }
    println!("{}", fp.render_text());
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    env: EnvArgs,
}

#[test]
fn env_arguments() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/env/strix-halo");
    let d = dir.display().to_string();
    let cli = Cli::try_parse_from([
        "env",
        "--json",
        "--sys-root",
        &format!("{d}/sys"),
        "--proc-root",
        &format!("{d}/proc"),
        "--run-root",
        &format!("{d}/run"),
        "--root",
        &d,
        "--backend",
        "hip",
    ])
    .unwrap();
    assert!(cli.env.json);
    assert_eq!(cli.env.sys_root, dir.join("sys"));
    assert_eq!(cli.env.backend, "hip");
    envinfo::cli::run(&cli.env).unwrap();
    let defaults = Cli::try_parse_from(["env"]).unwrap();
    assert_eq!(defaults.env.proc_root, PathBuf::from("/proc"));
    assert!(!defaults.env.json);
}
