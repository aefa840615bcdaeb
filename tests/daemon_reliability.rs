//! The daemon under pressure: backpressure, cancellation, deadlines, auth, graceful
//! shutdown — against the real `civetta serve` over loopback.

mod common;
#[path = "common/daemon.rs"]
mod daemon;

use civetta::proto::{generate_response::Event, FinishReason, GenerateRequest};
use common::*;
use daemon::*;
use std::time::{Duration, Instant};
use tonic::Code;

/// A generation long enough (thousands of decode steps) to still be running while the
/// test does something else.
fn long(prompt: &str) -> GenerateRequest {
    greedy(prompt, 1900)
}

/// Opens a Generate stream and waits for its first token (the sequence is then active).
async fn started(
    client: &mut civetta::proto::inference_client::InferenceClient<tonic::transport::Channel>,
    req: GenerateRequest,
) -> tonic::Streaming<civetta::proto::GenerateResponse> {
    let mut s = client.generate(req).await.unwrap().into_inner();
    let first = s.message().await.unwrap().expect("a first message");
    assert!(matches!(first.event, Some(Event::Token(_))), "{first:?}");
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_is_resource_exhausted_with_a_retry_hint() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let d = Daemon::start(&model, &["--max-active", "1", "--max-queue", "1", "--context", "2048"]);
    let mut client = d.client().await;
    let active = started(&mut client, long("one")).await;
    // The second waits in the queue (its response headers come back at once), the third is refused.
    let queued = client.generate(long("two")).await.unwrap().into_inner();
    d.wait_metrics("one queued", |m| m.sum("civetta_queue_depth", &[]) == 1.0 && m.sum("civetta_active_sequences", &[]) == 1.0);
    let err = client.generate(long("three")).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("retry after"), "{err:?}");
    let hint: u64 = err.metadata().get("retry-after-ms").expect("retry-after-ms metadata").to_str().unwrap().parse().unwrap();
    assert!(hint > 0);
    use tonic_types::StatusExt;
    let retry = err.get_details_retry_info().expect("google.rpc.RetryInfo in the status details");
    assert_eq!(retry.retry_delay, Some(Duration::from_millis(hint)));
    let m = d.samples();
    assert_eq!(m.sum("civetta_requests_rejected_total", &[("reason", "queue_full")]), 1.0);
    assert_eq!(m.sum("civetta_requests_total", &[("rpc", "Generate"), ("code", "RESOURCE_EXHAUSTED")]), 1.0);
    // Cancelling frees the slot and the queue; new work is accepted again.
    drop(active);
    drop(queued);
    d.wait_metrics("all released", |m| m.sum("civetta_active_sequences", &[]) == 0.0 && m.sum("civetta_queue_depth", &[]) == 0.0);
    assert_eq!(generate(&mut client, greedy("four", 3)).await.unwrap().ids.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_streams_free_their_sequences() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let d = Daemon::start(&model, &["--max-active", "3", "--max-queue", "16", "--context", "2048"]);
    let mut client = d.client().await;
    let mut streams = Vec::new();
    for i in 0..3 {
        streams.push(started(&mut client, long(&format!("prompt {i}"))).await);
    }
    for i in 3..8 {
        streams.push(client.generate(long(&format!("prompt {i}"))).await.unwrap().into_inner());
    }
    let busy =
        d.wait_metrics("3 active, 5 queued", |m| m.sum("civetta_active_sequences", &[]) == 3.0 && m.sum("civetta_queue_depth", &[]) == 5.0);
    assert!(busy.sum("civetta_kv_cache_bytes", &[]) > 0.0);
    assert_eq!(busy.sum("civetta_requests_in_flight", &[]), 8.0);
    let t0 = Instant::now();
    drop(streams);
    let m = d.wait_metrics("everything released", |m| {
        m.sum("civetta_active_sequences", &[]) == 0.0
            && m.sum("civetta_queue_depth", &[]) == 0.0
            && m.sum("civetta_requests_in_flight", &[]) == 0.0
            && m.sum("civetta_kv_cache_bytes", &[]) == 0.0
    });
    assert!(t0.elapsed() < Duration::from_secs(5), "cancellation took {:?}", t0.elapsed());
    assert_eq!(m.sum("civetta_requests_total", &[("rpc", "Generate"), ("code", "CANCELLED")]), 8.0);
    assert!(m.sum("civetta_generated_tokens_total", &[]) < 8.0 * 1900.0, "cancelled streams stopped early");
    assert_eq!(generate(&mut client, greedy("after", 3)).await.unwrap().ids.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_stops_the_generation() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let d = Daemon::start(&model, &["--context", "2048"]);
    let mut client = d.client().await;
    let mut req = tonic::Request::new(long("slow"));
    req.set_timeout(Duration::from_millis(300));
    let t0 = Instant::now();
    let err = generate(&mut client, req).await.unwrap_err();
    assert!(matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled), "{err:?}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let m = d.wait_metrics("deadline counted and sequence released", |m| {
        m.sum("civetta_requests_total", &[("rpc", "Generate"), ("code", "DEADLINE_EXCEEDED")])
            + m.sum("civetta_requests_total", &[("rpc", "Generate"), ("code", "CANCELLED")])
            == 1.0
            && m.sum("civetta_active_sequences", &[]) == 0.0
    });
    assert!(m.sum("civetta_generated_tokens_total", &[]) < 1900.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_token_is_required_except_for_health() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    let d = Daemon::start(&model, &["--auth-token-file", token_file.to_str().unwrap()]);
    let mut client = d.client().await;
    let with = |auth: Option<&str>| {
        let mut r = tonic::Request::new(greedy("hi", 2));
        if let Some(a) = auth {
            r.metadata_mut().insert("authorization", a.parse().unwrap());
        }
        r
    };
    for bad in [None, Some("Bearer wrong"), Some("s3cret-token"), Some("Bearer s3cret-toke")] {
        let err = generate(&mut client, with(bad)).await.unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{bad:?}");
    }
    let err = client.get_model_info(civetta::proto::GetModelInfoRequest {}).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert_eq!(generate(&mut client, with(Some("Bearer s3cret-token"))).await.unwrap().ids.len(), 2);
    let mut health = tonic_health::pb::health_client::HealthClient::new(d.channel().await);
    let r = health.check(tonic_health::pb::HealthCheckRequest { service: "civetta.v1.Inference".into() }).await.unwrap().into_inner();
    assert_eq!(r.status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_streams_finish_then_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let mut d = Daemon::start(&model, &["--shutdown-grace", "60"]);
    let mut client = d.client().await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(d.channel().await);
    use tonic_health::pb::{health_check_response::ServingStatus, HealthCheckRequest};
    let mut watch = health.watch(HealthCheckRequest { service: "civetta.v1.Inference".into() }).await.unwrap().into_inner();
    assert_eq!(watch.message().await.unwrap().unwrap().status, ServingStatus::Serving as i32);

    let mut stream = started(&mut client, greedy("finish me", 300)).await;
    d.sigterm();
    // Health turns NOT_SERVING first...
    assert_eq!(watch.message().await.unwrap().unwrap().status, ServingStatus::NotServing as i32);
    drop(watch);
    // ...the running stream still completes normally...
    let (mut tokens, mut done) = (1, None);
    while let Some(m) = stream.message().await.unwrap() {
        match m.event.unwrap() {
            Event::Token(_) => tokens += 1,
            Event::Done(x) => done = Some(x),
        }
    }
    assert_eq!(tokens, 300);
    assert_eq!(done.unwrap().finish_reason, FinishReason::Length as i32);
    // ...and the daemon exits 0 well before the grace period is over.
    let status =
        d.wait_exit(Duration::from_secs(20)).unwrap_or_else(|| panic!("daemon still running after SIGTERM; stderr:\n{}", d.stderr()));
    assert!(status.success(), "{status:?}\n{}", d.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_cancels_streams_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let mut d = Daemon::start(&model, &["--shutdown-grace", "0.5", "--context", "2048"]);
    let mut client = d.client().await;
    let mut stream = started(&mut client, long("never finishes in time")).await;
    let t0 = Instant::now();
    d.sigterm();
    let err = loop {
        match stream.message().await {
            Ok(Some(m)) => assert!(matches!(m.event, Some(Event::Token(_))), "no done expected: {m:?}"),
            Ok(None) => panic!("stream ended without an error"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    let status = d.wait_exit(Duration::from_secs(20)).unwrap_or_else(|| panic!("daemon still running; stderr:\n{}", d.stderr()));
    assert!(status.success(), "{status:?}\n{}", d.stderr());
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
}

/// `engine.max_queue = 0`: no waiting room. A request is admitted while an active slot is
/// free (also right after the previous stream's `done`), refused otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_queue_0_admits_only_while_a_slot_is_free() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let d = Daemon::start(&model, &["--max-active", "2", "--max-queue", "0", "--context", "2048"]);
    let mut client = d.client().await;
    // Back to back: each request starts as soon as the previous one said done.
    for i in 0..8 {
        let r = generate(&mut client, greedy(&format!("sequential {i}"), 2)).await.unwrap_or_else(|e| panic!("request {i}: {e:?}"));
        assert_eq!(r.ids.len(), 2);
    }
    let first = started(&mut client, long("slot one")).await;
    let _second = started(&mut client, long("slot two")).await;
    let err = client.generate(long("no room")).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.metadata().get("retry-after-ms").is_some());
    let m = d.samples();
    assert_eq!(m.sum("civetta_queue_depth", &[]), 0.0);
    assert_eq!(m.sum("civetta_active_sequences", &[]), 2.0);
    assert_eq!(m.sum("civetta_requests_rejected_total", &[("reason", "queue_full")]), 1.0);
    // One slot frees: exactly one new request fits again.
    drop(first);
    d.wait_metrics("one slot free", |m| m.sum("civetta_active_sequences", &[]) == 1.0);
    let _third = started(&mut client, long("slot one again")).await;
    assert_eq!(client.generate(long("still no room")).await.unwrap_err().code(), Code::ResourceExhausted);
    assert_eq!(d.samples().sum("civetta_requests_rejected_total", &[("reason", "queue_full")]), 2.0);
}

/// Asking for more KV cache than the machine has is refused at start: one clear line, exit 2,
/// before anything listens.
#[test]
fn kv_cache_larger_than_memory_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    // 2048 tokens x 4 layers x 2 x 64 floats = 8 MiB of KV cache per sequence; 10^8 sequences
    // are far more than MemAvailable anywhere.
    let out = common::civetta()
        .args(["serve", "--model"])
        .arg(&model)
        .args(["--grpc-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0", "--context", "2048", "--max-active", "100000000"])
        .env_remove("CIVETTA_LOG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one clear line, got: {err}");
    assert!(err.starts_with("civetta: error: not enough memory for the KV cache"), "{err}");
    // The pool defaults to max_active x context (engine.kv_cache_bytes = 0): 10^8 x 2048 / 16.
    assert!(err.contains("12800000000 blocks of 16 tokens") && err.contains("GiB available"), "{err}");
    assert!(!err.contains("panicked") && !err.contains("listening"), "{err}");
}

/// /metrics never exposes request text: a distinctive marker sent through every path
/// (completed, cancelled, rejected as invalid, as a model name, in chat, in stop sequences,
/// through Tokenize) appears nowhere in a scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_never_expose_request_text() {
    use civetta::proto::{ChatMessage, TokenizeRequest};
    const MARK: &str = "okapi-4471-marker";
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "qwen2", "q8_0");
    let d = Daemon::start(&model, &["--context", "2048"]);
    let mut client = d.client().await;
    let text = format!("secret {MARK} prompt");
    let tk = client.tokenize(TokenizeRequest { text: text.clone(), ..Default::default() }).await.unwrap().into_inner();
    assert!(tk.token_ids.len() > 3, "the marker reached the tokenizer");
    assert_eq!(
        generate(&mut client, GenerateRequest { stop: vec![format!("{MARK}-stop")], ..greedy(&text, 4) }).await.unwrap().ids.len(),
        4
    );
    let chat = GenerateRequest {
        prompt: String::new(),
        messages: vec![ChatMessage { role: "user".into(), content: text.clone() }],
        ..greedy("", 3)
    };
    assert_eq!(generate(&mut client, chat).await.unwrap().ids.len(), 3);
    drop(started(&mut client, long(&text)).await);
    for bad in [
        GenerateRequest { max_tokens: 0, ..greedy(&text, 1) },
        GenerateRequest { model: MARK.into(), ..greedy(&text, 1) },
        GenerateRequest { stop: vec![String::new(), MARK.into()], ..greedy(&text, 1) },
    ] {
        let code = generate(&mut client, bad).await.unwrap_err().code();
        assert!(matches!(code, Code::InvalidArgument | Code::NotFound), "{code:?}");
    }
    let m = d.wait_metrics("every request counted", |m| {
        m.sum("civetta_requests_total", &[("rpc", "Generate")]) == 6.0 && m.sum("civetta_active_sequences", &[]) == 0.0
    });
    assert_eq!(m.sum("civetta_requests_total", &[("rpc", "Generate"), ("code", "OK")]), 2.0);
    assert!(m.sum("civetta_prompt_tokens_total", &[]) > 0.0);
    for needle in [MARK, "okapi", "secret"] {
        assert!(!m.text.contains(needle), "/metrics contains {needle:?}:\n{}", m.text);
    }
    let (_, _, health) = http_get(&d.metrics, "/healthz");
    assert!(!health.contains(MARK));
}

/// `server.max_message_bytes` bounds every request message of the service: past it the
/// transport answers RESOURCE_EXHAUSTED (gRPC's convention for size limits) before any
/// handler runs; under it the request is decoded
/// (and here refused by validation, being longer than the context).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_size_limit_is_configurable_and_enforced() {
    use civetta::proto::TokenizeRequest;
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let d = Daemon::start_env(&model, &["--context", "1024"], &[("CIVETTA_SERVER__MAX_MESSAGE_BYTES", "65536")]);
    let mut client = d.client().await;
    let over = "word ".repeat(14_000); // 70,000 bytes
    let under = "word ".repeat(12_000); // 60,000 bytes
    let err = generate(&mut client, greedy(&over, 4)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("too large"), "{err:?}");
    let err = client.tokenize(TokenizeRequest { text: over.clone(), ..Default::default() }).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    let err = generate(&mut client, greedy(&under, 4)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("context"), "{err:?}");
    let ok = client.tokenize(TokenizeRequest { text: under, ..Default::default() }).await.unwrap().into_inner();
    assert!(ok.token_ids.len() >= 12_000);
    assert_eq!(generate(&mut client, greedy("still serving", 3)).await.unwrap().ids.len(), 3);
    let m = d.wait_metrics("oversized requests never reached the handler", |m| {
        m.sum("civetta_requests_total", &[("rpc", "Generate"), ("code", "OK")]) == 1.0
    });
    assert_eq!(m.sum("civetta_requests_total", &[("rpc", "Generate"), ("code", "INVALID_ARGUMENT")]), 1.0);
    assert_eq!(m.sum("civetta_requests_total", &[("rpc", "Tokenize"), ("code", "OK")]), 1.0);
    assert_eq!(m.sum("civetta_requests_total", &[("code", "OUT_OF_RANGE")]), 0.0);
    // The refusals by size are counted too (they never reach a handler).
    assert_eq!(m.sum("civetta_requests_total", &[("rpc", "Generate"), ("code", "RESOURCE_EXHAUSTED")]), 1.0);
    assert_eq!(m.sum("civetta_requests_total", &[("rpc", "Tokenize"), ("code", "RESOURCE_EXHAUSTED")]), 1.0);
}

/// Models the daemon cannot run (unsupported architecture, a tensor type the backend lacks)
/// are refused at start with one clear line and exit code 2, like missing or corrupt files
/// (daemon_e2e::startup_errors_are_one_line_and_exit_2).
#[test]
fn unsupported_models_are_refused_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(synth(dir.path(), "llama", "q8_0")).unwrap();
    let find = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).position(|w| w == needle).expect("pattern in the synth file");
    // general.architecture = "llama" (type 8 = string, length 5) -> "mamba": same length.
    let mut arch = good.clone();
    let at = find(&arch, b"general.architecture") + "general.architecture".len();
    assert_eq!(&arch[at..at + 17], b"\x08\0\0\0\x05\0\0\0\0\0\0\0llama");
    arch[at + 12..at + 17].copy_from_slice(b"mamba");
    // The tensor info of blk.0.attn_q.weight: name, n_dims = 2, two dims, then the type id.
    // Q8_0 (8) -> Q2_K (10, no CPU kernel): a smaller tensor, so the file still parses.
    let mut ttype = good.clone();
    let name = b"blk.0.attn_q.weight";
    let at = find(&ttype, &[&(name.len() as u64).to_le_bytes()[..], name].concat()) + 8 + name.len();
    assert_eq!(u32::from_le_bytes(ttype[at..at + 4].try_into().unwrap()), 2);
    let ty = at + 4 + 16;
    assert_eq!(u32::from_le_bytes(ttype[ty..ty + 4].try_into().unwrap()), 8, "q8_0");
    ttype[ty..ty + 4].copy_from_slice(&10u32.to_le_bytes());
    for (bytes, file, phrase) in [
        (arch, "arch.gguf", &format!("unsupported architecture \"mamba\" (supported: {})", civetta::model::SUPPORTED_ARCHS)),
        (
            ttype,
            "ttype.gguf",
            &format!("tensor \"blk.0.attn_q.weight\" of {}: type q2_K is not supported", dir.path().join("ttype.gguf").display()),
        ),
    ] {
        let path = dir.path().join(file);
        std::fs::write(&path, bytes).unwrap();
        let out = common::civetta()
            .args(["serve", "--model"])
            .arg(&path)
            .args(["--grpc-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"])
            .env_remove("CIVETTA_LOG")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{file}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{file}: one clear line, got: {err}");
        assert!(err.starts_with("civetta: error: ") && err.contains(phrase), "{file}: expected {phrase:?} in {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
