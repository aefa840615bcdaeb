//! `civetta repro merge a.json b.json ...`: reports made in different boots (one per IOMMU
//! mode, say) joined into one table whose columns are labelled by the factors that differ.
//!
//! Every cell that ran in a repro report is a column, and so is a plain `civetta bench`
//! JSON report. A column that differs from every other column in more than one factor is
//! confounded: the table says so and names the factors.

use super::report::{CellStatus, ReproReport, KIND};
use crate::bench::compare::factor_diff;
use crate::bench::{BenchReport, TestResult};
use crate::envinfo::factors::{changed, FACTORS};
use anyhow::Context;
use std::collections::BTreeMap;
use std::fmt::Write;

/// One column of the merged table.
#[derive(Debug, Clone)]
pub struct Column {
    /// Where it came from: `file` or `file:layer`.
    pub source: String,
    pub fingerprint: serde_json::Value,
    pub model_sha256: String,
    pub tests: Vec<TestResult>,
}

/// The columns of one report file: its ran cells (repro report) or itself (bench report).
pub fn columns_of(source: &str, text: &str) -> anyhow::Result<Vec<Column>> {
    let value: serde_json::Value = serde_json::from_str(text).with_context(|| format!("{source}: not JSON"))?;
    if value.get("kind").and_then(|k| k.as_str()) == Some(KIND) {
        let r: ReproReport = serde_json::from_value(value).with_context(|| format!("{source}: not a civetta repro report"))?;
        let cols: Vec<Column> = r
            .layers
            .iter()
            .filter_map(|l| r.cells.get(l))
            .filter(|c| c.status == CellStatus::Ran)
            .filter_map(|c| {
                let rep = c.report.as_ref()?;
                Some(Column {
                    source: format!("{source}:{}", c.layer),
                    fingerprint: rep.fingerprint.clone(),
                    model_sha256: rep.model.file_sha256.clone(),
                    tests: rep.tests.clone(),
                })
            })
            .collect();
        if cols.is_empty() {
            anyhow::bail!("{source}: no layer ran in this repro report");
        }
        return Ok(cols);
    }
    let r: BenchReport =
        serde_json::from_value(value).with_context(|| format!("{source}: neither a civetta repro nor a bench JSON report"))?;
    Ok(vec![Column { source: source.into(), fingerprint: r.fingerprint, model_sha256: r.model.file_sha256, tests: r.tests }])
}

pub struct Merged {
    pub text: String,
    /// Some differing factor never changes alone between two columns.
    pub confounded: bool,
    /// False when the columns measured different model files.
    pub comparable: bool,
}

/// The factors that change between any two columns, in [`FACTORS`] order, with the keys
/// that change for each.
fn table_factors(columns: &[Column]) -> Vec<(&'static str, Vec<String>)> {
    let mut keys: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for i in 0..columns.len() {
        for j in i + 1..columns.len() {
            let fd = factor_diff(&columns[i].fingerprint, &columns[j].fingerprint);
            for f in changed(&fd) {
                let entry = keys.entry(f.factor).or_default();
                for (k, _, _) in &f.keys {
                    if !entry.contains(k) {
                        entry.push(k.clone());
                    }
                }
            }
        }
    }
    FACTORS.iter().filter_map(|f| keys.remove(f.name).map(|k| (f.name, k))).collect()
}

fn field<'a>(fp: &'a serde_json::Value, key: &str) -> &'a str {
    super::report::field_value(fp, key).unwrap_or("absent")
}

/// Joins the columns into one table.
pub fn merge(columns: &[Column]) -> Merged {
    let mut s = String::new();
    let factors = table_factors(columns);
    let names: Vec<&str> = factors.iter().map(|(n, _)| *n).collect();
    let _ = writeln!(
        s,
        "civetta repro merge: {} columns; factors that differ: {}\n",
        columns.len(),
        if names.is_empty() { "none".into() } else { names.join(", ") }
    );
    let comparable = columns.windows(2).all(|w| w[0].model_sha256 == w[1].model_sha256);
    if !comparable {
        s += "NOT COMPARABLE: the columns measured different model files\n\n";
    }
    let test_names = |c: &Column| c.tests.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
    if columns.windows(2).any(|w| test_names(&w[0]) != test_names(&w[1])) {
        s += "NOTE: the columns ran different tests (bench arguments); only rows filled in several columns compare\n\n";
    }

    // Header: each column labelled by its values of the differing factors.
    let label = |c: &Column| -> String {
        if factors.is_empty() {
            return c.source.clone();
        }
        factors
            .iter()
            .map(|(name, keys)| format!("{name}: {}", keys.iter().map(|k| field(&c.fingerprint, k)).collect::<Vec<_>>().join("/")))
            .collect::<Vec<_>>()
            .join("; ")
    };
    s += "| test |";
    for c in columns {
        let _ = write!(s, " {} |", label(c));
    }
    s += "\n|---|";
    s += &"---:|".repeat(columns.len());
    s += "\n| source |";
    for c in columns {
        let _ = write!(s, " {} |", c.source);
    }
    s.push('\n');
    let mut tests: Vec<&str> = Vec::new();
    for t in columns.iter().flat_map(|c| &c.tests) {
        if !tests.contains(&t.name.as_str()) {
            tests.push(&t.name);
        }
    }
    for name in tests {
        let _ = write!(s, "| {name} t/s |");
        for c in columns {
            match c.tests.iter().find(|t| t.name == name) {
                Some(t) => {
                    let _ = write!(s, " {:.2} ± {:.2} |", t.mean_tps, t.stddev_tps);
                }
                None => s += " - |",
            }
        }
        s.push('\n');
    }

    // Confounding: a factor is attributable when some pair of columns differs in it alone.
    // For one that never changes alone, the closest pair still changes other factors too.
    let mut confounded = false;
    let mut reported: Vec<Vec<&'static str>> = Vec::new();
    let pairs: Vec<(usize, usize, Vec<crate::envinfo::factors::FactorDiff>)> = (0..columns.len())
        .flat_map(|i| (i + 1..columns.len()).map(move |j| (i, j)))
        .map(|(i, j)| (i, j, factor_diff(&columns[i].fingerprint, &columns[j].fingerprint)))
        .collect();
    for (name, _) in &factors {
        let closest =
            pairs.iter().filter(|(_, _, fd)| changed(fd).iter().any(|f| f.factor == *name)).min_by_key(|(_, _, fd)| changed(fd).len());
        let Some((i, j, fd)) = closest else {
            continue;
        };
        let set: Vec<&'static str> = changed(fd).iter().map(|f| f.factor).collect();
        if set.len() < 2 || reported.contains(&set) {
            continue;
        }
        confounded = true;
        let list: Vec<String> = changed(fd).iter().map(|f| f.describe()).collect();
        let _ = writeln!(
            s,
            "\nWARNING: confounded: no two columns differ in {name} alone; the closest, {} and {}, differ in {} factors ({}): {}",
            columns[*i].source,
            columns[*j].source,
            set.len(),
            set.join(", "),
            list.join("; ")
        );
        reported.push(set);
    }
    Merged { text: s, confounded, comparable }
}
