//! The forward pass's activation buffers, allocated once and reused by every pass (as
//! llama2.c's `RunState`): the engine makes one [`Workspace`] for its largest step when it
//! loads and hands it to every `Model::forward_batch_with`; a pass of fewer rows uses the
//! leading rows of each buffer (every op takes its row count, none reads past it).
//!
//! Why: a step used to allocate (and zero, on the CPU) about ten buffers per pass, and a
//! mixture-of-experts layer a few more per active expert. On a GPU the buffers also keep
//! the same device addresses in every step, so a captured decode graph (gpu/graph.rs), whose
//! launches name them, is replayed rather than re-captured whatever the rows of the steps in
//! between.
//!
//! No op reads what an earlier pass left in a buffer: each one is written (embedding, norm,
//! matmul, attention, gather, scatter over every slot) before it is read, so a reused
//! workspace gives the same bits as a fresh one (tests/workspace.rs).

use super::HParams;
use crate::backend::{Backend, HostBuffer};
use anyhow::bail;

/// The largest pass a workspace serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceShape {
    /// Rows (tokens of all sequences) of one pass.
    pub rows: usize,
    /// Rows whose logits one pass returns (a sequence asking for `Logits::Last` needs one).
    pub logit_rows: usize,
}

/// Activation buffers for passes of up to `shape.rows` rows. Fields are named after the
/// forward pass's variables (src/model/mod.rs).
pub struct Workspace<B: Backend> {
    shape: WorkspaceShape,
    bytes: usize,
    /// The residual stream, rows x n_embd.
    pub(super) x: B::Buffer,
    /// A norm's output / an op's scratch, rows x n_embd.
    pub(super) h: B::Buffer,
    pub(super) q: B::Buffer,
    pub(super) k: B::Buffer,
    pub(super) v: B::Buffer,
    /// Attention output, rows x q_dim.
    pub(super) att: B::Buffer,
    pub(super) gate: B::Buffer,
    pub(super) up: B::Buffer,
    /// The residual rows whose logits are returned, logit_rows x n_embd.
    pub(super) picked: B::Buffer,
    /// logit_rows x n_vocab.
    pub(super) logits: B::Buffer,
    /// The logits read back to the host, logit_rows x n_vocab (page-locked on GPU backends);
    /// `Model::forward_batch_into` lends each sequence its rows of it.
    pub(super) host_logits: HostBuffer,
    /// The mixture-of-experts block's buffers (MoE models only).
    pub(super) moe: Option<MoeWorkspace<B>>,
}

/// The buffers of `moe::ffn` for up to `rows` tokens. An expert serves at most every token
/// (top-k picks distinct experts), so its buffers hold `rows` rows too.
pub struct MoeWorkspace<B: Backend> {
    /// Router logits, rows x n_expert.
    pub(crate) router_logits: B::Buffer,
    /// Each (token, slot)'s expert output, rows x k x n_embd.
    pub(crate) slots: B::Buffer,
    /// One expert's gathered input and then its output, rows x n_embd (also the shared
    /// expert's output).
    pub(crate) xe: B::Buffer,
    /// rows x max(n_ff_exp, n_ff_shexp) (the routed experts', then the shared expert's).
    pub(crate) gate: B::Buffer,
    pub(crate) up: B::Buffer,
    /// The block's output, rows x n_embd (swapped with the pass's `h`).
    pub(crate) out: B::Buffer,
    /// The shared expert's gate logit per token, rows.
    pub(crate) shared_gate: B::Buffer,
    /// Device-side routing (`moe::DEVICE_ROUTING_MAX_ROWS` rows at most): the chosen expert
    /// ids and weights, 2 x rows x k.
    pub(crate) choice: B::Buffer,
    /// The ids each device-routed layer of the pass chose, layer after layer (n_layer x rows x
    /// k), read after the pass for the expert-load metric.
    pub(crate) routed_ids: B::Buffer,
    /// Layers of the current pass routed on the device so far (their ids in `routed_ids`).
    pub(crate) routed_on_device: usize,
}

/// Lengths (f32 elements) of every buffer, in the order `Workspace::new` allocates them.
fn lengths(hp: &HParams, s: WorkspaceShape) -> (Vec<usize>, Vec<usize>) {
    let (n, d) = (s.rows, hp.n_embd);
    let main = vec![
        n * d,
        n * d,
        n * hp.q_dim(),
        n * hp.kv_dim(),
        n * hp.kv_dim(),
        n * hp.q_dim(),
        n * hp.n_ff,
        n * hp.n_ff,
        s.logit_rows * d,
        s.logit_rows * hp.n_vocab,
    ];
    let moe = match &hp.moe {
        None => Vec::new(),
        Some(m) => {
            let ff = m.n_ff_exp.max(m.n_ff_shexp);
            // Device routing runs SwiGLU on every (token, slot) row at once.
            let dev = n.min(super::moe::DEVICE_ROUTING_MAX_ROWS) * m.n_expert_used;
            let ff_rows = n.max(dev);
            vec![n * m.n_expert, n * m.n_expert_used * d, n * d, ff_rows * ff, ff_rows * ff, n * d, n, 2 * dev, hp.n_layer * dev]
        }
    };
    (main, moe)
}

impl<B: Backend> Workspace<B> {
    /// Allocates the buffers for passes of up to `shape` on `be`.
    pub fn new(be: &B, hp: &HParams, shape: WorkspaceShape) -> anyhow::Result<Workspace<B>> {
        if shape.rows == 0 || shape.logit_rows > shape.rows {
            bail!("a workspace of {} rows cannot return {} rows of logits", shape.rows, shape.logit_rows);
        }
        let (main, moe) = lengths(hp, shape);
        let alloc_all = |lens: &[usize]| lens.iter().map(|&len| be.alloc(len)).collect::<crate::backend::Result<Vec<_>>>();
        let Ok([x, h, q, k, v, att, gate, up, picked, logits]) = <[B::Buffer; 10]>::try_from(alloc_all(&main)?) else {
            unreachable!("ten lengths, ten buffers")
        };
        let moe = if moe.is_empty() {
            None
        } else {
            let Ok([router_logits, slots, xe, gate, up, out, shared_gate, choice, routed_ids]) =
                <[B::Buffer; 9]>::try_from(alloc_all(&moe)?)
            else {
                unreachable!("nine lengths, nine buffers")
            };
            Some(MoeWorkspace { router_logits, slots, xe, gate, up, out, shared_gate, choice, routed_ids, routed_on_device: 0 })
        };
        let host_logits = be.alloc_host(shape.logit_rows * hp.n_vocab)?;
        let bytes = Workspace::<B>::bytes_for(hp, shape);
        Ok(Workspace { shape, bytes, x, h, q, k, v, att, gate, up, picked, logits, host_logits, moe })
    }

    /// Bytes a workspace of `shape` takes (f32 activations and the host copy of the logits;
    /// a backend may round each buffer up, as the GPU pool does to powers of two).
    pub fn bytes_for(hp: &HParams, shape: WorkspaceShape) -> usize {
        let (main, moe) = lengths(hp, shape);
        4 * (main.iter().chain(&moe).sum::<usize>() + shape.logit_rows * hp.n_vocab)
    }

    pub fn shape(&self) -> WorkspaceShape {
        self.shape
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Refuses a pass larger than the workspace.
    pub(super) fn check_fits(&self, rows: usize, logit_rows: usize) -> anyhow::Result<()> {
        if rows > self.shape.rows || logit_rows > self.shape.logit_rows {
            bail!(
                "a forward pass of {rows} rows ({logit_rows} with logits) exceeds the workspace of {} rows ({} with logits)",
                self.shape.rows,
                self.shape.logit_rows
            );
        }
        Ok(())
    }
}
