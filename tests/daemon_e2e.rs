//! End to end: the real daemon (`civetta serve`) on ephemeral loopback ports, a real tonic
//! client, real HTTP scrapes of /metrics.

mod common;
#[path = "common/daemon.rs"]
mod daemon;

use civetta::proto::{
    ChatMessage, FinishReason, GenerateRequest, GetEnvironmentRequest, GetKernelStatsRequest, GetModelInfoRequest, SamplingParams,
    TokenizeRequest,
};
use common::*;
use daemon::*;
use std::collections::BTreeSet;
use tonic::Code;

const PROMPT: &str = "The capital of France is";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_streams_what_the_cli_generates_and_exports_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let d = Daemon::start(&model, &[]);
    let mut client = d.client().await;

    // Greedy output over gRPC equals `civetta generate` for the same prompt and seed.
    let streamed = generate(&mut client, GenerateRequest { add_bos: true, ..greedy(PROMPT, 24) }).await.unwrap();
    assert_eq!(streamed.ids.len(), 24);
    assert_eq!(streamed.ids, streamed.done.token_ids, "streamed ids and the final summary agree");
    assert_eq!(streamed.done.finish_reason, FinishReason::Length as i32);
    let usage = streamed.done.usage.unwrap();
    // Totals over every stream of this test, from the streams' own summaries.
    let (mut streams, mut prompt_total, mut generated_total) = (1u32, usage.prompt_tokens, usage.completion_tokens);
    assert_eq!(usage.completion_tokens, 24);
    let timings = streamed.done.timings.unwrap();
    assert!(timings.total_seconds >= timings.time_to_first_token_seconds && timings.time_to_first_token_seconds > 0.0, "{timings:?}");
    let cli = run_json(civetta().args(["generate", "-m"]).arg(&model).args([
        "--prompt",
        PROMPT,
        "-n",
        "24",
        "--seed",
        "7",
        "--ignore-eos",
        "--add-bos",
        "true",
        "--json",
    ]));
    let cli_ids: Vec<u32> = cli["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    assert_eq!(streamed.ids, cli_ids, "daemon and CLI disagree");
    assert_eq!(streamed.text, cli["text"].as_str().unwrap());
    assert_eq!(cli["prompt_tokens"].as_u64().unwrap(), usage.prompt_tokens as u64);

    // Tokenize agrees with the prompt length the engine counted.
    let tk = client.tokenize(TokenizeRequest { text: PROMPT.into(), add_bos: true, ..Default::default() }).await.unwrap().into_inner();
    assert_eq!(tk.token_ids.len(), usage.prompt_tokens as usize);
    assert_eq!(tk.pieces.len(), tk.token_ids.len());

    // Several concurrent streams: all complete, and batching does not change greedy output.
    let reference = generate(&mut client, greedy("Once upon a time", 12)).await.unwrap();
    let mut count = |s: &Streamed| {
        let u = s.done.usage.unwrap();
        streams += 1;
        prompt_total += u.prompt_tokens;
        generated_total += u.completion_tokens;
    };
    count(&reference);
    let reference = reference.ids;
    let chat = GenerateRequest {
        messages: vec![ChatMessage { role: "user".into(), content: "zebra-marker-q7 says hello".into() }],
        max_tokens: 8,
        ignore_eos: true,
        ..Default::default()
    };
    let handles: Vec<_> = (0..6)
        .map(|i| {
            let mut c = client.clone();
            let req = if i % 2 == 0 { chat.clone() } else { greedy("Once upon a time", 12) };
            tokio::spawn(async move { (i, generate(&mut c, req).await) })
        })
        .collect();
    for h in handles {
        let (i, r) = h.await.unwrap();
        let s = r.unwrap_or_else(|e| panic!("concurrent stream {i} failed: {e:?}"));
        count(&s);
        assert_eq!(s.ids, s.done.token_ids);
        if i % 2 == 0 {
            assert_eq!(s.ids.len(), 8, "chat stream {i}");
        } else {
            assert_eq!(s.ids, reference, "greedy stream {i} differs when run concurrently");
        }
    }

    // The model can be named explicitly; GetModelInfo says what is served.
    let info = client.get_model_info(GetModelInfoRequest {}).await.unwrap().into_inner();
    assert_eq!((info.architecture.as_str(), info.backend.as_str()), ("llama", "cpu"));
    assert!(!info.name.is_empty() && info.vocab_size > 0 && info.context_length > 0);
    assert!(info.tensor_types.iter().any(|t| t.ggml_type.eq_ignore_ascii_case("q8_0")), "{:?}", info.tensor_types);
    let named = generate(&mut client, GenerateRequest { model: info.name.clone(), ..greedy("Once upon a time", 12) }).await.unwrap();
    assert_eq!(named.ids, reference);
    count(&named);
    assert_eq!((streams, generated_total), (9, 24 + 12 + 3 * 12 + 3 * 8 + 12));
    let (streams, prompt_total, generated_total) = (streams as f64, prompt_total as f64, generated_total as f64);

    let env = client.get_environment(GetEnvironmentRequest {}).await.unwrap().into_inner();
    assert!(!env.fields.is_empty());
    assert!(serde_json::from_str::<serde_json::Value>(&env.json).unwrap().is_object());

    // Metrics: counters moved by exactly what was sent.
    let m =
        d.wait_metrics("every Generate counted", |m| m.sum("civetta_requests_total", &[("rpc", "Generate"), ("code", "OK")]) == streams);
    assert_eq!(m.sum("civetta_generated_tokens_total", &[]), generated_total);
    assert_eq!(m.sum("civetta_prompt_tokens_total", &[]), prompt_total);
    assert_eq!(m.sum("civetta_time_to_first_token_seconds_count", &[]), streams);
    assert_eq!(m.sum("civetta_inter_token_latency_seconds_count", &[]), generated_total - streams);
    assert_eq!(m.sum("civetta_request_duration_seconds_count", &[("rpc", "Generate"), ("code", "OK")]), streams);
    assert_eq!(m.sum("civetta_requests_total", &[("rpc", "Tokenize"), ("code", "OK")]), 1.0);
    assert_eq!(m.sum("civetta_requests_total", &[("rpc", "GetModelInfo"), ("code", "OK")]), 1.0);
    assert_eq!(m.sum("civetta_requests_in_flight", &[]), 0.0);
    d.wait_metrics("sequences released", |m| m.sum("civetta_active_sequences", &[]) == 0.0 && m.sum("civetta_queue_depth", &[]) == 0.0);
    let build: Vec<_> = m.find("civetta_build_info", &[("backend", "cpu")]).collect();
    assert_eq!(build.len(), 1, "{}", m.text);
    assert_eq!(build[0].labels["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(m.find("civetta_environment_info", &[]).count(), 1);
    for secret in [PROMPT, "zebra-marker-q7", "Once upon"] {
        assert!(!m.text.contains(secret), "/metrics must not contain prompt text ({secret})");
    }

    // Per-kernel metrics: the same kernels as GetKernelStats, one histogram and one counter each.
    let stats = client.get_kernel_stats(GetKernelStatsRequest {}).await.unwrap().into_inner();
    assert!(stats.timing_enabled && stats.sample_rate > 0.0);
    let from_rpc: BTreeSet<String> = stats.kernels.iter().map(|k| k.kernel.clone()).collect();
    // The model is Q8_0: matmul_q8_0_x8 where the CPU runs the repacked kernel (engine.cpu_repack).
    let matmul = if civetta::quant::q8_0_x8::available() { "matmul_q8_0_x8" } else { "matmul_q8_0" };
    for op in [matmul, "rmsnorm", "rope", "attention"] {
        assert!(from_rpc.contains(op), "op {op} missing from kernel stats {from_rpc:?}");
    }
    let m = d.samples(); // no generation runs now: the kernel registry is quiet
    assert_eq!(m.label_values("civetta_kernel_duration_seconds_count", "kernel"), from_rpc);
    assert_eq!(m.label_values("civetta_kernel_calls_total", "kernel"), from_rpc);
    for k in &stats.kernels {
        let key = [
            ("kernel", k.kernel.as_str()),
            ("shape_class", k.shape_class.as_str()),
            ("backend", k.backend.as_str()),
            ("variant", k.variant.as_str()),
        ];
        assert!(k.calls > 0 && k.timed_calls > 0 && k.mean_seconds > 0.0, "{k:?}");
        assert_eq!(m.sum("civetta_kernel_calls_total", &key), k.calls as f64, "{key:?}");
        assert_eq!(m.sum("civetta_kernel_duration_seconds_count", &key), k.timed_calls as f64, "{key:?}");
        let inf: Vec<_> = m.find("civetta_kernel_duration_seconds_bucket", &key).filter(|s| s.labels["le"] == "+Inf").collect();
        assert_eq!(inf.len(), 1);
        assert_eq!(inf[0].value, k.timed_calls as f64);
    }
    assert_eq!(m.find("civetta_kernel_vgprs", &[]).count(), 0, "the CPU backend has no GPU resources");
    let (status, _, body) = http_get(&d.metrics, "/healthz");
    assert_eq!((status, body.trim()), (200, "ok"));
}

/// `civetta_moe_expert_tokens_total{expert}` of a MoE model: one series per expert, and every
/// token the model ran adds experts_used to the total in each MoE layer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moe_expert_load_counts_every_routed_token() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "qwen3moe", "q8_0"); // tiny preset: 4 layers, 8 experts, top-2
    let (layers, experts, used) = (4.0, 8, 2.0);
    let d = Daemon::start(&model, &[]);
    let mut client = d.client().await;
    let total = |s: &Samples| s.sum("civetta_moe_expert_tokens_total", &[]);
    let before = d.samples();
    assert_eq!(before.label_values("civetta_moe_expert_tokens_total", "expert").len(), experts, "one series per expert");
    assert_eq!(total(&before), 0.0);

    let mut forwarded = 0.0;
    for (prompt, n) in [(PROMPT, 12), ("Once upon a time", 5)] {
        let out = generate(&mut client, greedy(prompt, n)).await.unwrap();
        let usage = out.done.usage.unwrap();
        // The prompt (less any prefix-cache hit) and every generated token but the last ran
        // through the model.
        forwarded += (usage.prompt_tokens - usage.cached_prompt_tokens + usage.completion_tokens - 1) as f64;
        let s = d.samples();
        assert_eq!(total(&s), forwarded * used * layers, "tokens x experts_used x layers");
    }
    let s = d.samples();
    let busy = s
        .label_values("civetta_moe_expert_tokens_total", "expert")
        .iter()
        .filter(|e| s.sum("civetta_moe_expert_tokens_total", &[("expert", e)]) > 0.0)
        .count();
    assert!(busy >= 2, "only {busy} experts were ever selected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_invalid_argument_and_reach_no_model() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "qwen2", "q8_0");
    let d = Daemon::start(&model, &["--context", "256"]);
    let mut client = d.client().await;
    let base = greedy("hello", 4);
    let sampling = |s: SamplingParams| GenerateRequest { sampling: Some(s), ..base.clone() };
    let cases: Vec<(GenerateRequest, &str)> = vec![
        (GenerateRequest { prompt: String::new(), ..base.clone() }, "prompt is empty"),
        (GenerateRequest { messages: vec![ChatMessage { role: "user".into(), content: "x".into() }], ..base.clone() }, "only one"),
        (GenerateRequest { max_tokens: 0, ..base.clone() }, "max_tokens"),
        (GenerateRequest { max_tokens: 100_000, ..base.clone() }, "beyond the context"),
        (GenerateRequest { prompt: "x ".repeat(400), ..base.clone() }, "context"),
        (sampling(SamplingParams { temperature: -1.0, ..Default::default() }), "temperature"),
        (sampling(SamplingParams { temperature: f32::NAN, ..Default::default() }), "temperature"),
        (sampling(SamplingParams { top_p: 1.5, ..Default::default() }), "top_p"),
        (sampling(SamplingParams { top_p: -0.1, ..Default::default() }), "top_p"),
        (sampling(SamplingParams { min_p: 1.0, ..Default::default() }), "min_p"),
        (sampling(SamplingParams { repetition_penalty: -2.0, ..Default::default() }), "repetition_penalty"),
        (GenerateRequest { stop: vec![String::new()], ..base.clone() }, "stop"),
        (GenerateRequest { stop: vec!["s".repeat(10_000)], ..base.clone() }, "stop"),
    ];
    let n = cases.len() as f64;
    for (req, phrase) in cases {
        let err = generate(&mut client, req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{phrase}: {err:?}");
        assert!(err.message().contains(phrase), "expected {phrase:?} in {:?}", err.message());
        let violations = tonic_types::StatusExt::get_details_bad_request(&err).expect("google.rpc.BadRequest").field_violations;
        assert!(!violations[0].field.is_empty() && violations[0].description == err.message(), "{violations:?}");
    }
    // An unknown model name is NOT_FOUND (well-formed request, no such entity here).
    let err = generate(&mut client, GenerateRequest { model: "no-such-model".into(), ..base.clone() }).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains("unknown model"), "{err:?}");
    let err = client.tokenize(TokenizeRequest { model: "no-such-model".into(), text: "x".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    // A request larger than server.max_message_bytes (4 MiB) is refused by the transport.
    let err = generate(&mut client, GenerateRequest { prompt: "y".repeat(5 << 20), ..base.clone() }).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("too large"), "{err:?}");

    // Still serving; nothing of the above reached the model.
    let ok = generate(&mut client, base).await.unwrap();
    assert_eq!(ok.ids.len(), 4);
    let m = d.wait_metrics("the good request counted", |m| m.sum("civetta_requests_total", &[("rpc", "Generate"), ("code", "OK")]) == 1.0);
    assert_eq!(m.sum("civetta_requests_rejected_total", &[("reason", "invalid")]), n + 1.0, "the unknown model counts as invalid");
    assert_eq!(m.sum("civetta_requests_total", &[("rpc", "Generate"), ("code", "INVALID_ARGUMENT")]), n);
    assert_eq!(m.sum("civetta_prompt_tokens_total", &[]), ok.done.usage.unwrap().prompt_tokens as f64, "rejected prompts are not counted");
    assert_eq!(m.sum("civetta_time_to_first_token_seconds_count", &[]), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_work() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let d = Daemon::start(&model, &[]);
    let channel = d.channel().await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    use tonic_health::pb::{health_check_response::ServingStatus, HealthCheckRequest};
    for service in ["", "civetta.v1.Inference"] {
        let r = health.check(HealthCheckRequest { service: service.into() }).await.unwrap().into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{service:?}");
    }
    let err = health.check(HealthCheckRequest { service: "no.such.Service".into() }).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    {
        use tonic_reflection::pb::v1::{
            server_reflection_client::ServerReflectionClient, server_reflection_request::MessageRequest,
            server_reflection_response::MessageResponse, ServerReflectionRequest,
        };
        let mut refl = ServerReflectionClient::new(channel.clone());
        let reqs = vec![
            ServerReflectionRequest { host: String::new(), message_request: Some(MessageRequest::ListServices(String::new())) },
            ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::FileContainingSymbol("civetta.v1.Inference".into())),
            },
        ];
        let mut resp = refl.server_reflection_info(tokio_stream::iter(reqs)).await.unwrap().into_inner();
        let Some(MessageResponse::ListServicesResponse(list)) = resp.message().await.unwrap().unwrap().message_response else {
            panic!("expected a service list")
        };
        let names: BTreeSet<String> = list.service.into_iter().map(|s| s.name).collect();
        for s in ["civetta.v1.Inference", "grpc.health.v1.Health"] {
            assert!(names.contains(s), "{s} not in {names:?}");
        }
        let Some(MessageResponse::FileDescriptorResponse(fd)) = resp.message().await.unwrap().unwrap().message_response else {
            panic!("expected a descriptor")
        };
        assert!(!fd.file_descriptor_proto.is_empty());
    }
    {
        use tonic_reflection::pb::v1alpha::{
            server_reflection_client::ServerReflectionClient, server_reflection_request::MessageRequest,
            server_reflection_response::MessageResponse, ServerReflectionRequest,
        };
        let mut refl = ServerReflectionClient::new(channel);
        let req = ServerReflectionRequest { host: String::new(), message_request: Some(MessageRequest::ListServices(String::new())) };
        let mut resp = refl.server_reflection_info(tokio_stream::iter(vec![req])).await.unwrap().into_inner();
        let Some(MessageResponse::ListServicesResponse(list)) = resp.message().await.unwrap().unwrap().message_response else {
            panic!("expected a service list")
        };
        assert!(list.service.iter().any(|s| s.name == "civetta.v1.Inference"));
    }
}

/// `serve` refuses to start on user errors with one clear line and exit code 2.
#[test]
fn startup_errors_are_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let good = synth(dir.path(), "llama", "q8_0");
    let bytes = std::fs::read(&good).unwrap();
    let truncated = dir.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"this is not a gguf file at all, just some text").unwrap();
    let bad_config = dir.path().join("bad.toml");
    std::fs::write(&bad_config, "[engine]\nthreadz = 2\n").unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_addr = busy.local_addr().unwrap().to_string();
    let model = good.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--model", truncated.to_str().unwrap()], "past the end of the file"),
        (vec!["--model", garbage.to_str().unwrap()], "garbage.gguf"),
        (vec!["--model", "/nonexistent/model.gguf"], "No such file"),
        (vec!["--model", model, "--config", bad_config.to_str().unwrap()], "engine.threadz"),
        (vec!["--model", model, "--log-format", "xml"], "log.format"),
        (vec!["--model", model, "--grpc-addr", "localhost"], "server.grpc_addr"),
        (vec!["--model", model, "--grpc-addr", &busy_addr], &busy_addr),
        (vec!["--model", model, "--auth-token-file", "/nonexistent/token"], "/nonexistent/token"),
    ];
    for (args, phrase) in cases {
        let mut cmd = civetta();
        cmd.arg("serve").args(&args).env_remove("CIVETTA_LOG").current_dir(dir.path());
        if !args.contains(&"--grpc-addr") {
            cmd.args(["--grpc-addr", "127.0.0.1:0"]);
        }
        let out = cmd.args(["--metrics-addr", "127.0.0.1:0"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(phrase), "{args:?}: expected {phrase:?} in {err}");
        assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: one clear line, got: {err}");
        assert!(err.starts_with("civetta: error: "), "{err}");
    }
    drop(busy);
}
