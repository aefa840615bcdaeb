//! Conversions between the gRPC messages and the engine's types, with the request checks
//! that need no model (the engine checks the rest — context, ranges, stops — in `submit`
//! before anything is queued).

use crate::engine::{self, FinishReason, GenerationSummary, PromptInput, SubmitError};
use crate::kernel_registry::KernelSnapshot;
use crate::proto;
use std::time::Duration;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// Proto defaults that mean "unset" (proto3 scalars cannot be absent).
const DEFAULT_TOP_P: f32 = 1.0;
const DEFAULT_REPETITION_PENALTY: f32 = 1.0;
const DEFAULT_REPETITION_WINDOW: usize = 64;

/// Maps a `GenerateRequest` to an engine request. `served_model` is the name this server
/// answers to; an empty `model` field means "the served model".
pub fn generation_request(r: proto::GenerateRequest, served_model: &str) -> Result<engine::GenerationRequest, Status> {
    check_model(&r.model, served_model)?;
    let prompt = match (r.prompt.is_empty(), r.messages.is_empty()) {
        (false, true) => PromptInput::Text { text: r.prompt, add_bos: r.add_bos },
        (true, false) => {
            if let Some(i) = r.messages.iter().position(|m| m.role.trim().is_empty()) {
                return Err(bad_request(
                    &format!("messages[{i}].role"),
                    format!("messages[{i}].role is empty (use \"system\", \"user\" or \"assistant\")"),
                ));
            }
            PromptInput::Chat(r.messages.into_iter().map(|m| engine::ChatMessage { role: m.role, content: m.content }).collect())
        }
        (true, true) => return Err(bad_request("prompt", "prompt is empty: set `prompt` or `messages`".into())),
        (false, false) => return Err(bad_request("messages", "set only one of `prompt` and `messages`, not both".into())),
    };
    let s = r.sampling.unwrap_or_default();
    Ok(engine::GenerationRequest {
        prompt,
        max_tokens: r.max_tokens as usize,
        sampling: engine::SamplingParams {
            temperature: s.temperature,
            top_k: s.top_k as usize,
            top_p: if s.top_p == 0.0 { DEFAULT_TOP_P } else { s.top_p },
            min_p: s.min_p,
            repetition_penalty: if s.repetition_penalty == 0.0 { DEFAULT_REPETITION_PENALTY } else { s.repetition_penalty },
            repetition_window: if s.repetition_window == 0 { DEFAULT_REPETITION_WINDOW } else { s.repetition_window as usize },
            seed: s.seed.unwrap_or_else(rand::random),
        },
        stop: r.stop,
        ignore_eos: r.ignore_eos,
        top_logprobs: 0,
    })
}

/// An empty name means the served model; anything else must match it.
pub fn check_model(requested: &str, served_model: &str) -> Result<(), Status> {
    if !requested.is_empty() && requested != served_model {
        // NOT_FOUND: the request is well formed, the entity it names does not exist here.
        return Err(Status::not_found(format!("unknown model \"{requested}\" (this server serves \"{served_model}\")")));
    }
    Ok(())
}

/// Metadata key carrying the queue-full retry hint in milliseconds.
pub const RETRY_AFTER_MS: &str = "retry-after-ms";

/// The gRPC status for a refused submission.
pub fn submit_status(e: SubmitError) -> Status {
    match e {
        SubmitError::Invalid(e) => bad_request(e.field(), e.to_string()),
        SubmitError::QueueFull { queued, retry_after_ms } => {
            busy_status(&format!("server overloaded: {queued} requests queued; retry after {retry_after_ms} ms"), retry_after_ms)
        }
        SubmitError::ShuttingDown => Status::unavailable("server is shutting down"),
    }
}

/// RESOURCE_EXHAUSTED with the retry hint as `google.rpc.RetryInfo` in the status details
/// and in the `retry-after-ms` trailer.
pub fn busy_status(message: &str, retry_after_ms: u64) -> Status {
    let details = ErrorDetails::with_retry_info(Some(Duration::from_millis(retry_after_ms)));
    let mut s = Status::with_error_details(Code::ResourceExhausted, message, details);
    s.metadata_mut().insert(RETRY_AFTER_MS, retry_after_ms.into());
    s
}

/// INVALID_ARGUMENT with a `google.rpc.BadRequest` naming the field.
pub fn bad_request(field: &str, description: String) -> Status {
    let details = ErrorDetails::with_bad_request_violation(field, description.clone());
    Status::with_error_details(Code::InvalidArgument, description, details)
}

/// The `reason` label of `civetta_requests_rejected_total`.
pub fn reject_reason(e: &SubmitError) -> &'static str {
    match e {
        SubmitError::Invalid(_) => "invalid",
        SubmitError::QueueFull { .. } => "queue_full",
        SubmitError::ShuttingDown => "shutting_down",
    }
}

pub fn finish_reason(r: FinishReason) -> proto::FinishReason {
    match r {
        FinishReason::Length => proto::FinishReason::Length,
        FinishReason::Stop => proto::FinishReason::Stop,
        FinishReason::Eos => proto::FinishReason::Eos,
        FinishReason::Context => proto::FinishReason::Context,
        // A cancelled stream has no reader left; the value is never seen by a client.
        FinishReason::Cancelled => proto::FinishReason::Unspecified,
    }
}

pub fn done_message(s: GenerationSummary) -> proto::GenerateDone {
    proto::GenerateDone {
        usage: Some(proto::Usage {
            prompt_tokens: s.prompt_tokens as u32,
            completion_tokens: s.completion_tokens as u32,
            cached_prompt_tokens: s.cached_prompt_tokens as u32,
        }),
        timings: Some(proto::Timings {
            queue_seconds: s.timings.queue.as_secs_f64(),
            prefill_seconds: s.timings.prefill.as_secs_f64(),
            decode_seconds: s.timings.decode.as_secs_f64(),
            time_to_first_token_seconds: s.timings.time_to_first_token.as_secs_f64(),
            total_seconds: s.timings.total.as_secs_f64(),
        }),
        finish_reason: finish_reason(s.finish_reason) as i32,
        token_ids: s.token_ids,
        text_tail: s.text_tail,
    }
}

pub fn model_info(name: &str, i: &engine::ModelInfo) -> proto::ModelInfo {
    proto::ModelInfo {
        name: name.to_string(),
        architecture: i.architecture.clone(),
        path: i.path.display().to_string(),
        file_bytes: i.file_bytes,
        context_length: i.context_length as u32,
        embedding_length: i.embedding_length as u32,
        block_count: i.block_count as u32,
        head_count: i.head_count as u32,
        head_count_kv: i.head_count_kv as u32,
        vocab_size: i.vocab_size as u32,
        parameter_count: i.parameter_count,
        tensor_types: i.tensor_types.iter().map(|(t, c)| proto::TensorTypeCount { ggml_type: t.clone(), count: *c as u32 }).collect(),
        tokenizer_model: i.tokenizer_model.clone(),
        has_chat_template: i.has_chat_template,
        backend: i.backend.clone(),
        file_sha256: i.file_sha256.clone(),
        expert_count: i.expert_count as u32,
        expert_used_count: i.expert_used_count as u32,
    }
}

pub fn kernel_stat(k: KernelSnapshot) -> proto::KernelStat {
    let r = k.resources.unwrap_or_default();
    proto::KernelStat {
        kernel: k.key.kernel,
        shape_class: k.key.shape_class,
        backend: k.key.backend,
        variant: k.key.variant,
        calls: k.calls,
        timed_calls: k.timed_calls,
        total_seconds: k.total_seconds,
        mean_seconds: k.mean_seconds,
        p50_seconds: k.p50_seconds,
        p99_seconds: k.p99_seconds,
        vgprs: r.vgprs,
        sgprs: r.sgprs,
        scratch_bytes: r.scratch_bytes,
        lds_bytes: r.lds_bytes,
        waves_per_simd: r.occupancy,
        spills: r.spills,
        arch: r.arch,
        compiler: r.compiler,
    }
}

/// Parses the `grpc-timeout` header value ("100m", "5S", ...; gRPC over HTTP/2 spec).
pub fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    if v.len() < 2 || v.len() > 9 {
        return None; // at most 8 digits plus the unit
    }
    let (num, unit) = v.split_at(v.len() - 1);
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::InvalidRequest;

    fn req() -> proto::GenerateRequest {
        proto::GenerateRequest { prompt: "hi".into(), max_tokens: 4, ..Default::default() }
    }

    #[test]
    fn proto_zero_values_mean_defaults() {
        let r = generation_request(req(), "m").unwrap();
        assert_eq!(r.prompt, PromptInput::Text { text: "hi".into(), add_bos: false });
        assert_eq!((r.sampling.top_p, r.sampling.repetition_penalty, r.sampling.repetition_window), (1.0, 1.0, 64));
        let s = proto::SamplingParams {
            top_p: 0.5,
            repetition_penalty: 1.3,
            repetition_window: 8,
            seed: Some(42),
            top_k: 5,
            ..Default::default()
        };
        let r = generation_request(proto::GenerateRequest { sampling: Some(s), ..req() }, "m").unwrap();
        assert_eq!(
            (r.sampling.top_p, r.sampling.repetition_penalty, r.sampling.repetition_window, r.sampling.seed, r.sampling.top_k),
            (0.5, 1.3, 8, 42, 5)
        );
    }

    #[test]
    fn unset_seed_is_random() {
        let seeds: std::collections::HashSet<u64> = (0..8).map(|_| generation_request(req(), "m").unwrap().sampling.seed).collect();
        assert!(seeds.len() > 1, "unset seeds should differ: {seeds:?}");
    }

    #[test]
    fn prompt_or_messages_exactly_one() {
        let msgs = vec![proto::ChatMessage { role: "user".into(), content: "hello".into() }];
        let r = generation_request(proto::GenerateRequest { prompt: String::new(), messages: msgs.clone(), ..req() }, "m").unwrap();
        assert!(matches!(r.prompt, PromptInput::Chat(ref m) if m.len() == 1 && m[0].content == "hello"));
        for (r, phrase) in [
            (proto::GenerateRequest { prompt: String::new(), ..req() }, "prompt is empty"),
            (proto::GenerateRequest { messages: msgs, ..req() }, "only one"),
            (
                proto::GenerateRequest {
                    prompt: String::new(),
                    messages: vec![proto::ChatMessage { role: " ".into(), content: "x".into() }],
                    ..req()
                },
                "role",
            ),
        ] {
            let e = generation_request(r, "m").unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument);
            assert!(e.message().contains(phrase), "{phrase:?} not in {:?}", e.message());
        }
        assert!(generation_request(proto::GenerateRequest { model: "m".into(), ..req() }, "m").is_ok());
        let e = generation_request(proto::GenerateRequest { model: "other".into(), ..req() }, "m").unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        assert!(e.message().contains("unknown model \"other\""), "{e:?}");
    }

    #[test]
    fn errors_carry_rich_details() {
        let s = submit_status(SubmitError::QueueFull { queued: 3, retry_after_ms: 650 });
        assert_eq!(s.get_details_retry_info().and_then(|r| r.retry_delay), Some(Duration::from_millis(650)));
        for (e, message, field) in [
            (InvalidRequest::TopP(1.5), "top_p must be in (0, 1], got 1.5", "sampling.top_p"),
            (InvalidRequest::ZeroMaxTokens, "max_tokens must be at least 1", "max_tokens"),
            (InvalidRequest::TooManyStops { max: 16, got: 17 }, "at most 16 stop sequences, got 17", "stop"),
            (InvalidRequest::PromptFillsContext { context: 2048 }, "prompt has at least 2048 tokens; the context holds 2048", "prompt"),
        ] {
            let s = submit_status(SubmitError::Invalid(e));
            let v = s.get_details_bad_request().expect("BadRequest").field_violations;
            assert_eq!((v[0].field.as_str(), v[0].description.as_str()), (field, message));
        }
        let e = generation_request(proto::GenerateRequest { prompt: String::new(), ..req() }, "m").unwrap_err();
        assert_eq!(e.get_details_bad_request().unwrap().field_violations[0].field, "prompt");
    }

    #[test]
    fn submit_errors_map_to_status_codes() {
        let s = submit_status(SubmitError::QueueFull { queued: 3, retry_after_ms: 650 });
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert!(s.message().contains("650 ms"));
        assert_eq!(s.metadata().get(RETRY_AFTER_MS).unwrap().to_str().unwrap(), "650");
        assert_eq!(submit_status(SubmitError::Invalid(InvalidRequest::EmptyPrompt)).code(), Code::InvalidArgument);
        assert_eq!(submit_status(SubmitError::ShuttingDown).code(), Code::Unavailable);
    }

    #[test]
    fn grpc_timeout_header() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        for bad in ["", "m", "10x", "-5m", "123456789S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad}");
        }
    }
}
