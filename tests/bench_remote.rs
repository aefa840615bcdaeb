//! `civetta bench --remote` (gRPC) and `--remote-http` (the OpenAI API) against a real daemon
//! serving a synthetic model: both protocols in one report, the token counts the server
//! reported, the bearer token used on both, and the mixed scenario.

mod common;
#[path = "common/daemon.rs"]
mod daemon;

use civetta::bench::BenchReport;
use daemon::Daemon;

const TOKENS: usize = 8;
const REQUESTS: usize = 3;

fn bench(args: &[&str]) -> std::process::Output {
    common::civetta().args(["bench", "-q", "-o", "json", "-n", &TOKENS.to_string()]).args(args).output().unwrap()
}

#[test]
fn grpc_and_http_report_the_same_token_counts_and_the_mixed_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::synth(dir.path(), "llama", "q8_0");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "bench-secret\n").unwrap();
    let token = token_file.to_str().unwrap();
    // A small step budget: the mixed scenario's long prompt prefills over several steps, as a
    // 3,000-token prompt does under the default budget.
    let d = Daemon::start_env(
        &model,
        &["--auth-token-file", token, "--max-active", "8", "--context", "1024"],
        &[("CIVETTA_ENGINE__MAX_BATCH_TOKENS", "32")],
    );
    let out = bench(&[
        "--remote",
        &d.grpc,
        "--remote-http",
        &d.http,
        "--auth-token-file",
        token,
        "--concurrency",
        "1,2",
        "--requests",
        &REQUESTS.to_string(),
        "--mixed",
        "128",
        "--mixed-stream-tokens",
        "400",
        "--mixed-idle-tokens",
        "4",
        "--mixed-control",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: BenchReport = serde_json::from_slice(&out.stdout).unwrap();
    let rows: Vec<(&str, usize)> = report.remote.iter().map(|r| (r.protocol.as_str(), r.concurrency)).collect();
    assert_eq!(rows, [("grpc", 1), ("http", 1), ("grpc", 2), ("http", 2)]);
    for r in &report.remote {
        assert_eq!(r.errors, 0, "{r:?}");
        // ignore_eos: every request generates exactly max_tokens, as the server's usage says.
        assert_eq!(r.generated_tokens, REQUESTS * TOKENS, "{r:?}");
        // Tokens reached the client in at most one delivery each.
        assert!(r.deliveries >= 1 && r.deliveries <= r.generated_tokens, "{r:?}");
        assert!(r.prompt_tokens >= REQUESTS, "{r:?}");
        assert!(r.tokens_per_second > 0.0 && r.ttft_p50_s > 0.0 && r.ttft_p99_s >= r.ttft_p50_s, "{r:?}");
        assert!(r.itl_p50_s > 0.0 && r.itl_p99_s >= r.itl_p95_s && r.itl_p95_s >= r.itl_p50_s, "{r:?}");
    }
    // The same greedy request through both APIs: the same prompt and completion token counts.
    for pair in report.remote.chunks(2) {
        assert_eq!(pair[0].prompt_tokens, pair[1].prompt_tokens, "{pair:?}");
        assert_eq!(pair[0].generated_tokens, pair[1].generated_tokens, "{pair:?}");
    }
    // gRPC describes the model; the report is one run of one daemon.
    assert_eq!(report.model.architecture, "llama");
    assert_eq!(report.mixed.iter().map(|m| m.protocol.as_str()).collect::<Vec<_>>(), ["grpc", "http"]);
    for m in &report.mixed {
        assert_eq!((m.streams, m.errors), (4, 0), "{m:?}");
        // Calibrated from one sample request: close to the asked length, exact from usage.
        assert!((96..=160).contains(&m.long_prompt_tokens), "{m:?}");
        assert!(m.streams_outlasted_prefill, "{m:?}");
        // 4 streams x 4 idle tokens give at least 4 x 3 gaps after all have started (minus the
        // first of the slowest); the prefill of 128 tokens at 28 rows a step spans several steps.
        assert!(m.idle.samples >= 4, "{m:?}");
        assert!(m.during.samples >= 4, "{m:?}");
        assert!(m.long_ttft_s > 0.0 && m.p99_ratio.is_some_and(|r| r > 0.0), "{m:?}");
        // The control ran the streams alone through every position that fell inside the
        // prefill: at least as many samples as `during` (which has only some positions of each).
        let control = m.control.as_ref().expect("--mixed-control ran the control");
        assert!(control.samples >= m.during.samples && control.p99_s > 0.0, "{m:?}");
        assert!(m.p99_ratio_control.is_some_and(|r| r > 0.0), "{m:?}");
    }
    let md = common::civetta()
        .args(["bench", "-q", "-n", "4", "--remote-http", &d.http, "--auth-token-file", token, "--concurrency", "1", "--requests", "1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&md.stdout);
    assert!(md.status.success() && text.contains("| http | 1 | 1 | 0 | 4 |"), "{text}");

    // Without the token both APIs refuse, and the bench says so instead of reporting errors.
    for flag in ["--remote", "--remote-http"] {
        let addr = if flag == "--remote" { &d.grpc } else { &d.http };
        let out = bench(&[flag, addr, "--concurrency", "1", "--requests", "1"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag}: {err}");
        assert!(err.to_lowercase().contains("bearer") || err.contains("401") || err.contains("nauthenticated"), "{flag}: {err}");
    }
}
