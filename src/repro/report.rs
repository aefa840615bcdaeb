//! The `civetta repro run` report: one cell per layer (keyed by layer name), each holding
//! the bench report pooled over the rounds with that layer's own fingerprint, and a
//! layer-overhead row per test for each layer against the host.

use crate::bench::{mean_stddev, BenchReport, TestResult};
use crate::envinfo::factors;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Bumped when a field changes meaning or disappears.
pub const SCHEMA_VERSION: u32 = 1;
/// The `kind` of a repro report, so `repro merge` can tell it from a bench report.
pub const KIND: &str = "civetta-repro";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ReproReport {
    pub kind: String,
    pub schema_version: u32,
    pub civetta_version: String,
    pub git_sha: String,
    /// RFC 3339 UTC time the first round started.
    pub started_at: String,
    /// The bench arguments given after `--` (the model included).
    pub bench_args: Vec<String>,
    pub rounds: usize,
    /// The layers asked for, in the order given.
    pub layers: Vec<String>,
    /// The order the layers ran in, per round (rotated each round).
    pub order: Vec<Vec<String>>,
    /// One cell per layer asked for, keyed by layer name.
    pub cells: BTreeMap<String, Cell>,
    /// Each layer that ran against the baseline layer (`host`), per test.
    pub overhead: Vec<OverheadRow>,
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CellStatus {
    Ran,
    Skipped,
    Failed,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Cell {
    pub layer: String,
    pub status: CellStatus,
    /// Why the layer was skipped or failed.
    pub reason: Option<String>,
    /// The command line of one run in this layer.
    pub command: Vec<String>,
    /// The bench report of all rounds pooled: each test's samples are those of every round
    /// (mean and stddev recomputed); profile and hashes are the first round's. Its
    /// `fingerprint` is this layer's environment, read inside the layer.
    pub report: Option<BenchReport>,
    /// Each test's mean t/s per round, to see drift across rounds.
    pub round_means: BTreeMap<String, Vec<f64>>,
}

impl Cell {
    pub fn skipped(layer: &str, reason: String, command: Vec<String>) -> Self {
        Cell { layer: layer.into(), status: CellStatus::Skipped, reason: Some(reason), command, report: None, round_means: BTreeMap::new() }
    }

    /// The fingerprint of this layer (inside its report), if it ran.
    pub fn fingerprint(&self) -> Option<&serde_json::Value> {
        self.report.as_ref().map(|r| &r.fingerprint)
    }
}

/// One test in one layer against the same test in the baseline layer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OverheadRow {
    pub layer: String,
    pub baseline: String,
    pub test: String,
    pub baseline_tps: f64,
    pub baseline_stddev: f64,
    pub layer_tps: f64,
    pub layer_stddev: f64,
    /// (layer / baseline - 1) * 100: negative when the layer is slower.
    pub change_pct: f64,
    /// `within noise`, `x% faster`, `x% slower` (as `civetta compare`).
    pub verdict: String,
    /// The factors in which the layer's fingerprint differs from the baseline's: only
    /// `container layer` when the row measures the layer alone.
    pub factors: Vec<String>,
    /// Whether the completion hashes matched the baseline's (None: not recorded in both).
    pub bit_exact: Option<bool>,
}

/// A field's value in a bench report's fingerprint (`{fields: [{key, value, source}], ...}`;
/// the bench adds a `backend` object, so this reads the fields, not the typed summary).
pub fn field_value<'a>(fingerprint: &'a serde_json::Value, key: &str) -> Option<&'a str> {
    fingerprint.get("fields")?.as_array()?.iter().find(|f| f.get("key").and_then(|k| k.as_str()) == Some(key))?.get("value")?.as_str()
}

/// Pools the rounds of one layer into one report (see [`Cell::report`]) and the per-round means.
pub fn pool_rounds(rounds: &[BenchReport]) -> Option<(BenchReport, BTreeMap<String, Vec<f64>>)> {
    let first = rounds.first()?;
    let mut pooled = first.clone();
    let mut round_means: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for t in &mut pooled.tests {
        let same: Vec<&TestResult> = rounds.iter().filter_map(|r| r.tests.iter().find(|x| x.name == t.name)).collect();
        t.samples_tps = same.iter().flat_map(|x| x.samples_tps.iter().copied()).collect();
        (t.mean_tps, t.stddev_tps) = mean_stddev(&t.samples_tps);
        round_means.insert(t.name.clone(), same.iter().map(|x| x.mean_tps).collect());
    }
    pooled.settings.repetitions = pooled.tests.first().map_or(0, |t| t.samples_tps.len());
    Some((pooled, round_means))
}

/// Fingerprint changes between rounds of one layer, leaving out the volatile keys: a
/// setting that changed mid-run (someone switched the power profile) spoils the cell.
pub fn drift_between_rounds(layer: &str, rounds: &[BenchReport]) -> Option<String> {
    let first = rounds.first()?;
    for (i, r) in rounds.iter().enumerate().skip(1) {
        let diff: Vec<_> = crate::bench::compare::fingerprint_diff(&first.fingerprint, &r.fingerprint)
            .into_iter()
            .filter(|(k, _, _)| !crate::envinfo::is_volatile(k))
            .collect();
        if !diff.is_empty() {
            let keys: Vec<String> = diff.iter().map(|(k, a, b)| format!("{k}: {a} -> {b}")).collect();
            return Some(format!("{layer}: the environment changed between round 1 and round {}: {}", i + 1, keys.join("; ")));
        }
    }
    None
}

/// The overhead rows of every layer that ran against `baseline`, and a warning for each
/// layer whose difference from the baseline is more than the layer itself.
pub fn overhead_rows(cells: &BTreeMap<String, Cell>, layers: &[String], baseline: &str) -> (Vec<OverheadRow>, Vec<String>) {
    let mut rows = Vec::new();
    let mut warnings = Vec::new();
    let Some(base) = cells.get(baseline).and_then(|c| c.report.as_ref()) else {
        return (rows, warnings);
    };
    for layer in layers.iter().filter(|l| l.as_str() != baseline) {
        let Some(r) = cells.get(layer).and_then(|c| c.report.as_ref()) else {
            continue;
        };
        let fd = crate::bench::compare::factor_diff(&base.fingerprint, &r.fingerprint);
        let changed: Vec<String> = factors::changed(&fd).iter().map(|f| f.factor.to_string()).collect();
        if let Some(w) = factors::confounding_warning(&fd) {
            warnings.push(format!("{layer} vs {baseline}: {w}"));
        }
        let bit_exact = match (&base.hashes, &r.hashes) {
            (Some(a), Some(b)) if a.prompts_sha256 == b.prompts_sha256 => Some(a.overall_sha256 == b.overall_sha256),
            _ => None,
        };
        for t in &base.tests {
            let Some(n) = r.tests.iter().find(|x| x.name == t.name) else {
                continue;
            };
            rows.push(OverheadRow {
                layer: layer.clone(),
                baseline: baseline.into(),
                test: t.name.clone(),
                baseline_tps: t.mean_tps,
                baseline_stddev: t.stddev_tps,
                layer_tps: n.mean_tps,
                layer_stddev: n.stddev_tps,
                change_pct: if t.mean_tps > 0.0 { (n.mean_tps / t.mean_tps - 1.0) * 100.0 } else { 0.0 },
                verdict: crate::bench::compare::verdict(t, n),
                factors: changed.clone(),
                bit_exact,
            });
        }
    }
    (rows, warnings)
}

impl ReproReport {
    /// The table: one row per test with a column per layer (mean ± stddev t/s), then the
    /// layer-overhead rows, the skipped layers and the warnings.
    pub fn render_md(&self) -> String {
        let mut s = String::new();
        let ran: Vec<&Cell> = self.layers.iter().filter_map(|l| self.cells.get(l)).filter(|c| c.status == CellStatus::Ran).collect();
        let _ = writeln!(s, "civetta repro: {} rounds, layers interleaved; bench {}\n", self.rounds, self.bench_args.join(" "));
        let mut tests: Vec<String> = Vec::new();
        for c in &ran {
            for t in c.report.iter().flat_map(|r| &r.tests) {
                if !tests.contains(&t.name) {
                    tests.push(t.name.clone());
                }
            }
        }
        if !ran.is_empty() {
            s += "| test |";
            for c in &ran {
                let _ = write!(s, " {} t/s |", c.layer);
            }
            s += "\n|---|";
            s += &"---:|".repeat(ran.len());
            s.push('\n');
            for name in &tests {
                let _ = write!(s, "| {name} |");
                for c in &ran {
                    match c.report.as_ref().and_then(|r| r.tests.iter().find(|t| &t.name == name)) {
                        Some(t) => {
                            let _ = write!(s, " {:.2} ± {:.2} |", t.mean_tps, t.stddev_tps);
                        }
                        None => s += " - |",
                    }
                }
                s.push('\n');
            }
            for row in &self.overhead {
                let exact = match row.bit_exact {
                    Some(true) => ", bit-exact",
                    Some(false) => ", completions DIFFER",
                    None => "",
                };
                let _ = writeln!(
                    s,
                    "| overhead {} vs {} {} | {:+.1}% ({}{exact}; factors: {}) |",
                    row.layer,
                    row.baseline,
                    row.test,
                    row.change_pct,
                    row.verdict,
                    if row.factors.is_empty() { "none".into() } else { row.factors.join(", ") }
                );
            }
        }
        for l in &self.layers {
            if let Some(c) = self.cells.get(l).filter(|c| c.status != CellStatus::Ran) {
                let what = if c.status == CellStatus::Skipped { "skipped" } else { "FAILED" };
                let _ = writeln!(s, "\n{l}: {what}: {}", c.reason.as_deref().unwrap_or(""));
            }
        }
        for w in &self.warnings {
            let _ = writeln!(s, "\n{w}");
        }
        s
    }
}
