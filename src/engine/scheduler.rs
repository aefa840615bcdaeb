//! TEMPORARY stub (the real scheduler lands when gguf/quant/tokenizer compile).
use super::api::*;
use tokio::sync::mpsc;

#[derive(Clone)]
pub struct Engine {
    info: std::sync::Arc<ModelInfo>,
}

pub struct GenerationStream {
    rx: mpsc::UnboundedReceiver<GenerationEvent>,
    pub prompt_tokens: usize,
}

impl GenerationStream {
    pub async fn next(&mut self) -> Option<GenerationEvent> {
        self.rx.recv().await
    }
    pub fn blocking_next(&mut self) -> Option<GenerationEvent> {
        self.rx.blocking_recv()
    }
}

impl Engine {
    pub fn load(_cfg: EngineConfig) -> anyhow::Result<Engine> {
        anyhow::bail!("engine: being written")
    }
    pub fn model_info(&self) -> &ModelInfo {
        &self.info
    }
    pub fn context_length(&self) -> usize {
        0
    }
    pub fn validate(&self, _req: &GenerationRequest) -> Result<Vec<u32>, SubmitError> {
        Err(SubmitError::ShuttingDown)
    }
    pub fn submit(&self, _req: GenerationRequest) -> Result<GenerationStream, SubmitError> {
        Err(SubmitError::ShuttingDown)
    }
    pub fn stats(&self) -> EngineStats {
        EngineStats::default()
    }
    pub fn shutdown(&self) {}
}
