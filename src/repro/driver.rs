//! The interleaving driver: every layer that can run, once per round, the order rotated
//! each round (as scripts/perf-ab.py alternates configurations), so that a machine's drift
//! over the minutes of a run (thermals, other load) spreads over all layers instead of
//! landing on whichever ran last.

use super::layer::{BenchInvocation, LayerRunner};
use super::report::{drift_between_rounds, overhead_rows, pool_rounds, Cell, CellStatus, ReproReport, KIND, SCHEMA_VERSION};
use crate::bench::BenchReport;
use std::collections::BTreeMap;

/// The layer every other is measured against, when it ran.
pub const BASELINE: &str = "host";

/// Runs the bench in each layer for `rounds` rounds. A layer that cannot run is a skipped
/// cell with the reason; a layer whose run fails is a failed cell with the error and is not
/// run again. `progress` gets one line per run.
pub fn run(
    layers: &[&dyn LayerRunner],
    bench: &BenchInvocation,
    bench_args: &[String],
    rounds: usize,
    progress: &mut dyn FnMut(&str),
) -> ReproReport {
    let started_at = crate::bench::local_now();
    let mut cells: BTreeMap<String, Cell> = BTreeMap::new();
    let mut ready: Vec<&dyn LayerRunner> = Vec::new();
    for layer in layers {
        match layer.check(bench) {
            Ok(()) => ready.push(*layer),
            Err(reason) => {
                progress(&format!("{}: skipped: {reason}", layer.name()));
                cells.insert(layer.name().into(), Cell::skipped(layer.name(), reason, layer.command(bench)));
            }
        }
    }

    let mut results: Vec<Vec<BenchReport>> = vec![Vec::new(); ready.len()];
    let mut failed: Vec<Option<String>> = vec![None; ready.len()];
    let mut order = Vec::new();
    for round in 0..rounds {
        let mut this_round = Vec::new();
        for k in 0..ready.len() {
            let i = (k + round) % ready.len();
            if failed[i].is_some() {
                continue;
            }
            let layer = ready[i];
            this_round.push(layer.name().to_string());
            progress(&format!("round {}/{rounds}: {}", round + 1, layer.name()));
            match layer.run(bench) {
                Ok(r) => results[i].push(r),
                Err(e) => {
                    progress(&format!("{}: failed: {e:#}", layer.name()));
                    failed[i] = Some(format!("round {}: {e:#}", round + 1));
                }
            }
        }
        order.push(this_round);
    }

    let mut warnings = Vec::new();
    for (i, layer) in ready.iter().enumerate() {
        let name = layer.name().to_string();
        let cell = match (&failed[i], pool_rounds(&results[i])) {
            (None, Some((report, round_means))) => {
                warnings.extend(drift_between_rounds(&name, &results[i]));
                Cell {
                    layer: name.clone(),
                    status: CellStatus::Ran,
                    reason: None,
                    command: layer.command(bench),
                    report: Some(report),
                    round_means,
                }
            }
            (failure, _) => Cell {
                layer: name.clone(),
                status: CellStatus::Failed,
                reason: Some(failure.clone().unwrap_or_else(|| "no rounds ran (--rounds 0)".into())),
                command: layer.command(bench),
                report: None,
                round_means: BTreeMap::new(),
            },
        };
        cells.insert(name, cell);
    }

    let names: Vec<String> = layers.iter().map(|l| l.name().to_string()).collect();
    let (overhead, confounded) = overhead_rows(&cells, &names, BASELINE);
    warnings.extend(confounded);
    if !cells.get(BASELINE).is_some_and(|c| c.status == CellStatus::Ran) && names.len() > 1 {
        warnings.push(format!("no overhead rows: the baseline layer {BASELINE:?} did not run"));
    }
    ReproReport {
        kind: KIND.into(),
        schema_version: SCHEMA_VERSION,
        civetta_version: env!("CARGO_PKG_VERSION").into(),
        git_sha: env!("CIVETTA_GIT_SHA").into(),
        started_at,
        bench_args: bench_args.to_vec(),
        rounds,
        layers: names,
        order,
        cells,
        overhead,
        warnings,
    }
}
