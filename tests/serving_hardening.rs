//! Hostile-client defects (issue #13) against the real `civetta serve`: huge prompts must
//! not stall the runtime, long words must not grow memory, logs carry no colour codes
//! off a terminal.

mod common;
#[path = "common/daemon.rs"]
mod daemon;

use civetta::proto::{generate_response::Event, TokenizeRequest};
use common::*;
use daemon::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::Code;

/// A prompt of 4,000,000 characters: under the default 4 MiB message limit, far past any
/// context.
fn huge_prompt() -> String {
    "word ".repeat(800_000)
}

/// The 4M-character requests of issue #13 while a stream runs and health is polled every
/// 50 ms. Before the fix each was tokenized whole on one of the two async workers: health
/// checks took 25 s and the stream stalled as long.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn huge_prompts_stall_neither_health_nor_other_streams() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let d = Daemon::start(&model, &["--context", "2048"]);
    let mut client = d.client().await;
    let mut stream = client.generate(greedy("a stream that keeps going", 1900)).await.unwrap().into_inner();

    // The stream's gaps while the daemon has nothing else to do.
    let mut arrivals = Vec::new();
    while arrivals.len() < 40 {
        let m = stream.message().await.unwrap().expect("the stream runs");
        assert!(matches!(m.event, Some(Event::Token(_))));
        arrivals.push(Instant::now());
    }
    let idle_max = arrivals.windows(2).map(|w| w[1] - w[0]).max().unwrap();

    // From here on: every token's arrival, and health latencies every 50 ms.
    let seen = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let reader = {
        let seen = seen.clone();
        tokio::spawn(async move {
            while let Ok(Some(_)) = stream.message().await {
                seen.lock().unwrap().push(Instant::now());
            }
        })
    };
    let latencies = Arc::new(Mutex::new(Vec::<Duration>::new()));
    let poller = {
        let latencies = latencies.clone();
        let mut health = tonic_health::pb::health_client::HealthClient::new(d.channel().await);
        tokio::spawn(async move {
            loop {
                let t = Instant::now();
                let mut req = tonic::Request::new(tonic_health::pb::HealthCheckRequest { service: String::new() });
                // A stalled check counts as 2 s (the test must not wait 25 s on a regression).
                req.set_timeout(Duration::from_secs(2));
                let ok = health.check(req).await.is_ok();
                latencies.lock().unwrap().push(if ok { t.elapsed() } else { Duration::from_secs(2) });
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let window_start = Instant::now();
    let prompt = huge_prompt();
    assert_eq!(prompt.len(), 4_000_000);
    let mut huge = Vec::new();
    for _ in 0..2 {
        let mut c = d.client().await;
        let p = prompt.clone();
        huge.push(tokio::spawn(async move { generate(&mut c, greedy(&p, 4)).await.map(|_| ()) }));
    }
    for h in huge {
        let err = h.await.unwrap().unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains("context"), "{err:?}");
    }
    let refused_after = window_start.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    poller.abort();
    let latencies = latencies.lock().unwrap().clone();
    let arrivals: Vec<Instant> = seen.lock().unwrap().iter().copied().filter(|&t| t >= window_start).collect();
    reader.abort();

    let health_max = latencies.iter().copied().max().unwrap();
    let mut gap_max = arrivals.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default();
    if let Some(&first) = arrivals.first() {
        gap_max = gap_max.max(first - window_start);
    }
    eprintln!(
        "huge prompts refused after {refused_after:?}; health p100 {health_max:?} over {} checks; stream gap max {gap_max:?} (idle max {idle_max:?}) over {} tokens",
        latencies.len(),
        arrivals.len()
    );
    assert!(health_max < Duration::from_millis(250), "health p100 {health_max:?}: {latencies:?}");
    // 3x the idle gap, as the issue asks, but at least 250 ms: the synthetic model's idle
    // gap is under 1 ms, and receiving and decoding two 4 MB messages alone takes a few ms
    // of the connection tasks (measured: 8 ms largest gap against 0.7 ms idle). A stall by
    // tokenizing on the async workers lasts seconds, so the bound still catches it.
    let gap_bound = (idle_max * 3).max(Duration::from_millis(250));
    assert!(gap_max < gap_bound, "largest stream gap {gap_max:?} against an idle gap of {idle_max:?}");
    assert!(arrivals.len() >= 10, "the stream kept going: {} tokens", arrivals.len());
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().trim().trim_end_matches(" kB").trim().parse().unwrap();
    kb * 1024
}

/// 32 Tokenize requests, each a different 1 MB run of one letter (one pre-tokenized word
/// each), and Generate requests of the same: resident memory stays within 32 MB of where
/// it was after two warm-up requests. Before the fix the BPE word cache kept every word
/// with its ids (the issue measured about +8 MB per 2 MB request; 1 MB runs keep the
/// test short on a debug build and still grow memory by more than 32 MB without the bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_words_do_not_grow_memory() {
    const RUN: usize = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let d = Daemon::start(&model, &["--context", "2048"]);
    let mut client = d.client().await.max_decoding_message_size(256 << 20);
    let tokenize = |text: String| TokenizeRequest { text, ..Default::default() };
    // Warm-up: the allocator's high-water mark for one such request.
    for w in ["xy", "yx"] {
        client.tokenize(tokenize(w.repeat(RUN / 2))).await.unwrap();
    }
    let before = rss_bytes(d.pid());
    let t = Instant::now();
    let letters: Vec<char> = ('a'..='z').chain('A'..='F').collect();
    for (i, &c) in letters.iter().enumerate() {
        let r = client.tokenize(tokenize(c.to_string().repeat(RUN))).await.unwrap_or_else(|e| panic!("request {i}: {e:?}")).into_inner();
        assert!(!r.token_ids.is_empty(), "request {i}");
    }
    for &c in &letters[..8] {
        let err = generate(&mut client, greedy(&c.to_string().repeat(RUN), 4)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
    }
    let after = rss_bytes(d.pid());
    let grown = after as i64 - before as i64;
    eprintln!("RSS {} MB -> {} MB ({:+} MB) over 40 requests in {:?}", before >> 20, after >> 20, grown >> 20, t.elapsed());
    assert!(grown < 32 << 20, "RSS grew by {} MB", grown >> 20);
}

/// Log lines carry no ANSI colour codes when stderr is not a terminal (here a pipe).
#[test]
fn logs_off_a_terminal_have_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let d = Daemon::start_env(&model, &[], &[("CIVETTA_LOG", "info")]);
    let end = Instant::now() + Duration::from_secs(10);
    while !d.stderr().contains("serving") && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = d.stderr();
    assert!(log.contains("serving"), "{log}");
    assert!(!log.contains('\u{1b}'), "escape codes in {log:?}");
}

/// GenerateRequest with `prompt` as raw bytes, to send what a string field must not hold.
#[derive(Clone, PartialEq, prost::Message)]
struct RawGenerateRequest {
    #[prost(bytes = "vec", tag = "2")]
    prompt: Vec<u8>,
    #[prost(uint32, tag = "4")]
    max_tokens: u32,
}

/// Runs a Generate with a raw prompt (authorization "bearer tok") to its end; the final status.
async fn raw_generate(channel: tonic::transport::Channel, prompt: Vec<u8>) -> tonic::Status {
    let mut req = tonic::Request::new(RawGenerateRequest { prompt, max_tokens: 2 });
    req.metadata_mut().insert("authorization", "bearer tok".parse().unwrap());
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/civetta.v1.Inference/Generate");
    let codec = tonic::codec::ProstCodec::<RawGenerateRequest, civetta::proto::GenerateResponse>::default();
    match grpc.server_streaming(req, path, codec).await {
        Err(s) => s,
        Ok(r) => {
            let mut s = r.into_inner();
            loop {
                match s.message().await {
                    Ok(Some(_)) => {}
                    Ok(None) => break tonic::Status::ok(""),
                    Err(e) => break e,
                }
            }
        }
    }
}

/// Invalid UTF-8 in a string field is INVALID_ARGUMENT (not INTERNAL), a message over the
/// size limit RESOURCE_EXHAUSTED (not OUT_OF_RANGE), and every such answer, like the auth
/// interceptor's UNAUTHENTICATED, is counted in `civetta_requests_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transport_refusals_have_conventional_codes_and_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "tok\n").unwrap();
    let d =
        Daemon::start_env(&model, &["--auth-token-file", token_file.to_str().unwrap()], &[("CIVETTA_SERVER__MAX_MESSAGE_BYTES", "65536")]);
    let channel = d.channel().await;
    let call = |prompt: Vec<u8>| raw_generate(channel.clone(), prompt);
    // The lower-case scheme is accepted (item 7); the prompt itself is fine.
    assert_eq!(call(b"hello".to_vec()).await.code(), Code::Ok);
    let err = call(vec![b'h', 0xff, 0xfe, b'i']).await;
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let err = call(vec![b'w'; 70_000]).await;
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    let mut client = d.client().await;
    for _ in 0..3 {
        let err = client.get_model_info(civetta::proto::GetModelInfoRequest {}).await.unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated);
    }
    let m = d.wait_metrics("every refusal counted", |m| m.sum("civetta_requests_total", &[("code", "UNAUTHENTICATED")]) == 3.0);
    assert_eq!(m.sum("civetta_requests_total", &[("rpc", "GetModelInfo"), ("code", "UNAUTHENTICATED")]), 3.0);
    assert_eq!(m.sum("civetta_requests_total", &[("rpc", "Generate"), ("code", "INVALID_ARGUMENT")]), 1.0);
    assert_eq!(m.sum("civetta_requests_total", &[("rpc", "Generate"), ("code", "RESOURCE_EXHAUSTED")]), 1.0);
    assert_eq!(m.sum("civetta_requests_total", &[("rpc", "Generate"), ("code", "OK")]), 1.0);
    assert_eq!(
        m.sum("civetta_requests_total", &[("code", "INTERNAL")]) + m.sum("civetta_requests_total", &[("code", "OUT_OF_RANGE")]),
        0.0
    );
}

/// `/metrics` keeps answering during the shutdown grace period (it used to stop at SIGTERM,
/// blinding dashboards during the drain).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_answer_during_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let mut d = Daemon::start(&model, &["--shutdown-grace", "3", "--context", "2048"]);
    let mut client = d.client().await;
    let mut stream = client.generate(greedy("keep going", 1900)).await.unwrap().into_inner();
    assert!(stream.message().await.unwrap().is_some());
    d.sigterm();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Still draining: the stream is open and /metrics shows it.
    let m = d.samples();
    assert_eq!(m.sum("civetta_requests_in_flight", &[]), 1.0, "{}", m.text);
    drop(stream);
    let status = d.wait_exit(Duration::from_secs(20)).expect("the daemon exits after the grace period");
    assert!(status.success(), "{status:?}");
}

use tonic_health::pb::{health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest};

fn health_request(service: &str, timeout: Duration) -> tonic::Request<HealthCheckRequest> {
    let mut r = tonic::Request::new(HealthCheckRequest { service: service.into() });
    r.set_timeout(timeout);
    r
}

/// The gRPC health spec: Watch for a service the server does not know streams
/// SERVICE_UNKNOWN (it may be registered later); only Check answers NOT_FOUND. tonic-health's
/// reporter answered Watch with a NOT_FOUND error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_watch_of_an_unknown_service_streams_service_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let d = Daemon::start(&model, &[]);
    let mut health = HealthClient::new(d.channel().await);
    let mut watch = health.watch(HealthCheckRequest { service: "no.such.Service".into() }).await.expect("Watch is a stream").into_inner();
    let first = tokio::time::timeout(Duration::from_secs(5), watch.message()).await.expect("a first status at once");
    assert_eq!(first.unwrap().unwrap().status, ServingStatus::ServiceUnknown as i32);
    let err = health.check(HealthCheckRequest { service: "no.such.Service".into() }).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    for known in ["", "civetta.v1.Inference"] {
        let r = health.check(HealthCheckRequest { service: known.into() }).await.unwrap().into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{known:?}");
    }
}

/// During the shutdown grace period the daemon keeps answering: a health Check on a
/// connection opened before SIGTERM gets NOT_SERVING at once (it used to hang until its
/// deadline: the transport had stopped taking new streams), so does one on a new connection;
/// /metrics and the HTTP /health answer; new work is refused with UNAVAILABLE; the running
/// stream goes on, and once it ends the daemon exits without waiting out the grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_metrics_answer_at_once_during_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let mut d = Daemon::start(&model, &["--shutdown-grace", "60", "--context", "2048"]);
    let mut client = d.client().await;
    let mut health = HealthClient::new(d.channel().await);
    let r = health.check(health_request("", Duration::from_secs(5))).await.unwrap().into_inner();
    assert_eq!(r.status, ServingStatus::Serving as i32);
    let mut stream = client.generate(greedy("keep going", 1900)).await.unwrap().into_inner();
    assert!(stream.message().await.unwrap().is_some());

    d.sigterm();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    let r = health.check(health_request("civetta.v1.Inference", Duration::from_secs(3))).await;
    let took = t.elapsed();
    let r = r.unwrap_or_else(|e| panic!("Check on the open connection after SIGTERM failed after {took:?}: {e:?}"));
    assert_eq!(r.into_inner().status, ServingStatus::NotServing as i32);
    assert!(took < Duration::from_secs(1), "Check took {took:?}");
    let mut fresh = HealthClient::new(d.channel().await);
    let r = fresh.check(health_request("", Duration::from_secs(3))).await.expect("Check on a new connection");
    assert_eq!(r.into_inner().status, ServingStatus::NotServing as i32);

    let refused = client.generate(greedy("new work", 4)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    let refused = client.tokenize(TokenizeRequest { text: "new work".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    let (status, _, _) = http_get(d.http.trim_start_matches("http://"), "/health");
    assert_eq!(status, 503);
    let m = d.samples();
    assert_eq!(m.sum("civetta_requests_in_flight", &[]), 1.0, "{}", m.text);
    assert_eq!(m.sum("civetta_requests_rejected_total", &[("reason", "shutting_down")]), 1.0, "{}", m.text);

    // The running stream was not disturbed.
    for _ in 0..5 {
        let msg = stream.message().await.unwrap().expect("the stream goes on");
        assert!(matches!(msg.event, Some(Event::Token(_))));
    }
    drop(stream);
    let t = Instant::now();
    let status = d.wait_exit(Duration::from_secs(20)).unwrap_or_else(|| panic!("daemon still running; stderr:\n{}", d.stderr()));
    assert!(status.success(), "{status:?}\n{}", d.stderr());
    assert!(t.elapsed() < Duration::from_secs(10), "exit took {:?} after the last stream ended", t.elapsed());
}

/// An idle daemon with a health Watch open exits within the grace period it promises (the
/// default 10 s): the Watch sees NOT_SERVING, then ends. It used to hold the graceful
/// shutdown open until the forced close, 2 s after the grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_daemon_with_a_health_watch_exits_within_its_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let mut d = Daemon::start(&model, &[]);
    let mut health = HealthClient::new(d.channel().await);
    let mut watch = health.watch(HealthCheckRequest { service: String::new() }).await.unwrap().into_inner();
    assert_eq!(watch.message().await.unwrap().unwrap().status, ServingStatus::Serving as i32);
    let t = Instant::now();
    d.sigterm();
    let next = tokio::time::timeout(Duration::from_secs(5), watch.message()).await.expect("NOT_SERVING at once");
    assert_eq!(next.unwrap().unwrap().status, ServingStatus::NotServing as i32);
    let status = d.wait_exit(Duration::from_secs(20)).unwrap_or_else(|| panic!("daemon still running; stderr:\n{}", d.stderr()));
    let took = t.elapsed();
    assert!(status.success(), "{status:?}\n{}", d.stderr());
    eprintln!("idle daemon with a Watch open exited {took:?} after SIGTERM");
    assert!(took < Duration::from_secs(10), "exit took {took:?}; the default grace period is 10 s");
    // The Watch ended (with an error status or a closed connection), it did not hang.
    let end = tokio::time::timeout(Duration::from_secs(5), watch.message()).await.expect("the Watch ends");
    assert!(!matches!(end, Ok(Some(_))), "{end:?}");
}

/// A copy of `model` whose `tokenizer.ggml.eos_token_id` is `eos` (a u32 patched in place).
fn with_eos(model: &std::path::Path, eos: u32, out: &std::path::Path) {
    let mut bytes = std::fs::read(model).unwrap();
    let key = b"tokenizer.ggml.eos_token_id";
    let at = bytes.windows(key.len()).position(|w| w == key).expect("eos key in the synth file") + key.len();
    assert_eq!(u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()), 4, "the value is a u32 (GGUF type 4)");
    bytes[at + 4..at + 8].copy_from_slice(&eos.to_le_bytes());
    std::fs::write(out, bytes).unwrap();
}

/// A generation whose first generated token is EOS streams no token, yet the model produced
/// a first token: `civetta_time_to_first_token_seconds` observes it, over gRPC and HTTP.
/// The model: the synthetic one with its EOS id set to the token greedy decoding emits
/// first for the prompt (found by asking the unpatched model with EOS ignored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eos_as_the_first_token_still_observes_time_to_first_token() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "llama", "q8_0");
    let prompt = "the first token ends it";
    let first = {
        let d = Daemon::start(&model, &[]);
        generate(&mut d.client().await, greedy(prompt, 1)).await.unwrap().ids[0]
    };
    let patched = dir.path().join("eos-first.gguf");
    with_eos(&model, first, &patched);
    let d = Daemon::start(&patched, &[]);

    let mut req = greedy(prompt, 8);
    req.ignore_eos = false;
    let r = generate(&mut d.client().await, req).await.unwrap();
    assert!(r.ids.is_empty(), "EOS comes first, nothing is streamed: {r:?}");
    assert_eq!(r.done.finish_reason, civetta::proto::FinishReason::Eos as i32, "{r:?}");
    d.wait_metrics("TTFT observed for the gRPC request", |m| {
        m.sum("civetta_requests_total", &[("rpc", "Generate"), ("code", "OK")]) == 1.0
            && m.sum("civetta_time_to_first_token_seconds_count", &[]) == 1.0
    });

    let body = serde_json::json!({"prompt": prompt, "max_tokens": 8, "temperature": 0});
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/completions", d.http))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_eq!(v["choices"][0]["text"], "", "{v}");
    let m = d.wait_metrics("TTFT observed for the HTTP request", |m| {
        m.sum("civetta_requests_total", &[("rpc", "/v1/completions"), ("code", "OK")]) == 1.0
    });
    assert_eq!(m.sum("civetta_time_to_first_token_seconds_count", &[]), 2.0, "{}", m.text);
    assert_eq!(m.sum("civetta_generated_tokens_total", &[]), 0.0);
}
