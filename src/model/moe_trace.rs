//! Routing diagnostics of the MoE block (issue #15, GPU vs CPU parity): a per-model tap that
//! either records each MoE layer call's routing (expert ids, weights, top-k margins) or makes
//! the calls replay a given routing's expert ids instead of choosing their own.
//!
//! gpu_check records the GPU's routing of a prompt and replays it on the CPU reference, so the
//! logits compare arithmetic alone; the recorded margins say whether each routing flip between
//! the backends was a near tie. Off unless asked: the served path pays one relaxed atomic load
//! per MoE layer call.

use super::moe::Routing;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};

/// One MoE layer call's routing: the rows of that call (all tokens of the forward pass), in
/// layer order within a pass.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerRouting {
    pub routing: Routing,
    /// Per token: logit of the k-th chosen expert minus the best one left out (`moe::top_k_margins`).
    pub margins: Vec<f32>,
    /// Per token: the largest |router logit| (the scale the margin is judged against).
    pub scales: Vec<f32>,
}

enum Mode {
    Off,
    Record(Vec<LayerRouting>),
    /// Expert ids to use, one entry per MoE layer call, consumed in order.
    Replay(VecDeque<Vec<u32>>),
}

/// Shared by a model's MoE layers (`Model::routing_tap`).
pub struct RoutingTap {
    on: AtomicBool,
    mode: Mutex<Mode>,
}

impl Default for RoutingTap {
    fn default() -> Self {
        RoutingTap { on: AtomicBool::new(false), mode: Mutex::new(Mode::Off) }
    }
}

impl RoutingTap {
    /// Whether any call needs the tap (checked once per MoE layer call).
    pub fn active(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// From now on, each MoE layer call appends its routing (until `take_record`).
    pub fn start_record(&self) {
        *self.mode.lock() = Mode::Record(Vec::new());
        self.on.store(true, Ordering::Relaxed);
    }

    /// The calls recorded since `start_record`; switches the tap off.
    pub fn take_record(&self) -> Vec<LayerRouting> {
        self.on.store(false, Ordering::Relaxed);
        match std::mem::replace(&mut *self.mode.lock(), Mode::Off) {
            Mode::Record(v) => v,
            _ => Vec::new(),
        }
    }

    /// The next MoE layer calls use these routings' expert ids, in order (their weights are
    /// recomputed from the replaying model's own router logits). Off again once consumed.
    pub fn start_replay(&self, calls: &[LayerRouting]) {
        *self.mode.lock() = Mode::Replay(calls.iter().map(|c| c.routing.experts.clone()).collect());
        self.on.store(true, Ordering::Relaxed);
    }

    /// Switches the tap off; returns how many replayed calls were left unused.
    pub fn stop(&self) -> usize {
        self.on.store(false, Ordering::Relaxed);
        match std::mem::replace(&mut *self.mode.lock(), Mode::Off) {
            Mode::Replay(q) => q.len(),
            _ => 0,
        }
    }

    /// The expert ids this call must use, when replaying.
    pub(super) fn next_forced(&self) -> anyhow::Result<Option<Vec<u32>>> {
        match &mut *self.mode.lock() {
            Mode::Replay(q) => match q.pop_front() {
                Some(e) => Ok(Some(e)),
                None => anyhow::bail!("routing replay: more MoE layer calls than recorded"),
            },
            _ => Ok(None),
        }
    }

    /// Records this call's routing, when recording.
    pub(super) fn record(&self, routing: &Routing, margins: Vec<f32>, scales: Vec<f32>) {
        if let Mode::Record(v) = &mut *self.mode.lock() {
            v.push(LayerRouting { routing: routing.clone(), margins, scales });
        }
    }
}

/// Routing differences between two recordings of the same pass (`a` the reference, whose
/// margins judge each flip). A flip is a (layer call, token) whose expert *set* differs (an
/// order change among the same experts is not one). A flip is *primary* when no earlier layer
/// flipped at this token or an earlier one (attention carries a flip to later positions):
/// only a primary flip's inputs were not already changed by another flip, so only its margin
/// says whether the backends' arithmetic alone moved the choice.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RoutingDiff {
    pub flips: usize,
    pub primary: usize,
    /// Largest primary flip margin relative to its row's largest |router logit|, and absolute.
    pub primary_rel_margin: f32,
    pub primary_margin: f32,
    /// Largest margin among all flips, relative (secondary flips included).
    pub any_rel_margin: f32,
}

pub fn compare(a: &[LayerRouting], b: &[LayerRouting]) -> RoutingDiff {
    let mut d = RoutingDiff::default();
    // The first token flipped in any earlier layer call.
    let mut first_flipped = usize::MAX;
    for (x, y) in a.iter().zip(b) {
        let k = x.routing.k;
        let mut first_here = usize::MAX;
        for (t, (ex, ey)) in x.routing.experts.chunks(k).zip(y.routing.experts.chunks(k)).enumerate() {
            let (mut sx, mut sy) = (ex.to_vec(), ey.to_vec());
            sx.sort_unstable();
            sy.sort_unstable();
            if sx == sy {
                continue;
            }
            let rel = x.margins[t] / x.scales[t].max(1e-30);
            d.flips += 1;
            d.any_rel_margin = d.any_rel_margin.max(rel);
            first_here = first_here.min(t);
            if t < first_flipped {
                d.primary += 1;
                d.primary_rel_margin = d.primary_rel_margin.max(rel);
                d.primary_margin = d.primary_margin.max(x.margins[t]);
            }
        }
        first_flipped = first_flipped.min(first_here);
    }
    d
}
