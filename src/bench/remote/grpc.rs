//! Benchmark streams over civetta's gRPC `Generate`.

use super::stream::{Delivery, StreamControl, StreamRecord, StreamRequest};
use crate::proto::inference_client::InferenceClient;
use crate::proto::{generate_response::Event, GenerateRequest, SamplingParams};
use std::time::Instant;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Channel;

#[derive(Clone)]
pub struct GrpcTarget {
    pub client: InferenceClient<Channel>,
    authorization: Option<MetadataValue<Ascii>>,
}

impl GrpcTarget {
    pub async fn connect(addr: &str, token: Option<&str>) -> anyhow::Result<GrpcTarget> {
        let client = crate::client::connect(addr).await?;
        let authorization = token
            .map(|t| format!("Bearer {t}").parse::<MetadataValue<Ascii>>())
            .transpose()
            .map_err(|_| anyhow::anyhow!("the auth token must be printable ASCII"))?;
        Ok(GrpcTarget { client, authorization })
    }

    /// `msg` with the bearer token attached (the daemon's `server.auth_token_*`).
    pub fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Some(a) = &self.authorization {
            r.metadata_mut().insert("authorization", a.clone());
        }
        r
    }

    pub async fn stream(&self, req: &StreamRequest, mut ctl: StreamControl) -> StreamRecord {
        let msg = GenerateRequest {
            prompt: req.prompt.clone(),
            max_tokens: req.max_tokens as u32,
            sampling: Some(SamplingParams { temperature: 0.0, seed: Some(1), ..Default::default() }),
            ignore_eos: true,
            // As /v1/completions does for a model whose tokenizer adds BOS (most: llama, SmolLM2),
            // so both protocols prefill the same tokens; on the others the gRPC prompt is one
            // token longer (the report's prompt_tokens shows it).
            add_bos: true,
            ..Default::default()
        };
        let mut client = self.client.clone();
        let sent = Instant::now();
        let mut s = match client.generate(self.request(msg)).await {
            Ok(r) => r.into_inner(),
            Err(e) => return StreamRecord::failed(sent, format!("{}: {}", e.code(), e.message())),
        };
        let mut record = StreamRecord::new(sent);
        loop {
            let msg = tokio::select! {
                m = s.message() => m,
                _ = ctl.stopped() => {
                    record.cancelled = true;
                    return record;
                }
            };
            match msg {
                Ok(Some(m)) => match m.event {
                    Some(Event::Token(_)) => ctl.record(&mut record, Delivery { at: Instant::now(), tokens: 1 }),
                    Some(Event::Done(d)) => {
                        if let Some(u) = d.usage {
                            record.prompt_tokens = Some(u.prompt_tokens as usize);
                            record.completion_tokens = Some(u.completion_tokens as usize);
                        }
                    }
                    None => {}
                },
                Ok(None) => return record,
                Err(e) => {
                    record.error = Some(format!("{}: {}", e.code(), e.message()));
                    return record;
                }
            }
        }
    }
}
