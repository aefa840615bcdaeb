//! `civetta bench` and `civetta compare` through the real binary.

mod common;
use common::*;

const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/bench");

fn compare(a: &std::path::Path, b: &std::path::Path) -> (i32, String) {
    let out = civetta().arg("compare").arg(a).arg(b).output().unwrap();
    (out.status.code().unwrap(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn recorded_reports_compare_names_every_injected_difference() {
    let (code, text) = compare(&std::path::Path::new(FIX).join("base.json"), &std::path::Path::new(FIX).join("change.json"));
    assert_eq!(code, 0, "{text}");
    // Fingerprint differences, most relevant first.
    let compiler = text.find("- toolchain kernel compiler:").expect("compiler difference named");
    let iommu = text.find("- iommu mode: off vs translated").expect("iommu difference named");
    let container = text.find("- container type: none vs toolbox").expect("container difference named");
    assert!(compiler < iommu && iommu < container, "{text}");
    assert!(text.contains("clang version 23.0.0"));
    // Two factors changed at once: the comparison says it is confounded and names them. The
    // kernel compiler differs too, but both runs used the CPU backend, which runs no GPU
    // kernels: it is listed as a difference, not counted as a factor.
    assert!(
        text.contains("WARNING: confounded: the runs differ in 2 factors that can move the result (IOMMU mode, container layer)"),
        "{text}"
    );
    // The tg change is outside the noise, the pp change inside.
    assert!(text.lines().any(|l| l.starts_with("| tg16 t/s") && l.contains("30.0% slower")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("| pp64 t/s") && l.contains("within noise")), "{text}");
    // Kernel resource rows and the hash verdict.
    assert!(text.contains("| kernel matmul_q8_0 VGPRs | 128 | 256 | +128 | changed |"), "{text}");
    assert!(text.contains("| kernel matmul_q8_0 spills | 0 | 12 | +12 | changed |"), "{text}");
    assert!(text.contains("bit-exact: no"));
    assert!(text.contains("differs: \"Write a short poem about the sea.\""));
}

#[test]
fn real_bench_json_round_trips_and_compares_bit_exact() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "qwen3", "q4_k");
    let run = |name: &str| {
        let p = dir.path().join(name);
        let out = civetta()
            .args(["bench", "-m"])
            .arg(&model)
            // pp48 twice: without a fresh prompt per run the second would come from the prefix
            // cache (2 full blocks), which `bench` refuses.
            .args(["-p", "48", "-n", "8", "-r", "2", "--warmup", "0", "--hash-tokens", "8", "-t", "2", "--quiet", "-o", "json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        std::fs::write(&p, &out.stdout).unwrap();
        p
    };
    let a = run("a.json");
    let b = run("b.json");
    let report: civetta::bench::BenchReport = serde_json::from_slice(&std::fs::read(&a).unwrap()).unwrap();
    assert_eq!(report.schema_version, civetta::bench::SCHEMA_VERSION);
    assert_eq!(report.tests.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["pp48", "tg8"]);
    assert!(report.tests.iter().all(|t| t.samples_tps.len() == 2 && t.mean_tps > 0.0));
    // matmul_q4_k_x8 where the CPU runs the repacked kernel (engine.cpu_repack).
    let q4_k = if civetta::quant::q4_k_x8::available() { "matmul_q4_k_x8" } else { "matmul_q4_k" };
    assert!(report.profile.kernels.iter().any(|k| k.kernel == q4_k && k.calls > 0), "no {q4_k} in the profile");
    let h = report.hashes.as_ref().unwrap();
    assert_eq!(h.completions.len(), 4);
    assert!(h.completions.iter().all(|c| c.tokens == 8 && c.sha256.len() == 64));
    assert_eq!(report.model.architecture, "qwen3");
    assert!(civetta::bench::fingerprint_value(&report.fingerprint, "iommu.mode").is_some());
    // JSON round trip is lossless.
    let again: civetta::bench::BenchReport = serde_json::from_str(&serde_json::to_string(&report).unwrap()).unwrap();
    assert_eq!(again, report);
    // Two runs of one build: bit-exact, same environment.
    let (code, text) = compare(&a, &b);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("bit-exact: yes"), "{text}");
    assert!(text.contains("identical fingerprints"), "{text}");
    // Another model file: not comparable, exit code 3.
    let other = synth(dir.path(), "llama", "q4_k");
    let mut r2 = report.clone();
    r2.model.file_sha256 = civetta::gguf::GgufFile::open(&other).unwrap().sha256_hex();
    let c = dir.path().join("c.json");
    std::fs::write(&c, serde_json::to_string(&r2).unwrap()).unwrap();
    let (code, text) = compare(&a, &c);
    assert_eq!(code, 3, "{text}");
    assert!(text.contains("NOT COMPARABLE") && text.contains("different model files"), "{text}");
    for fmt in ["md", "csv", "jsonl"] {
        let out = civetta()
            .args(["bench", "-m"])
            .arg(&model)
            .args(["-p", "8", "-n", "4", "-r", "1", "--warmup", "0", "--hash-tokens", "0", "--quiet", "-o", fmt])
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && s.contains("pp8") && s.contains("tg4"), "{fmt}: {s}");
    }
}
