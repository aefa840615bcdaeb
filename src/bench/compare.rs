//! `civetta compare base.json new.json`: what differs between two benchmark runs, and by how much.

use super::report::*;
use std::fmt::Write;

/// Fingerprint keys in order of how likely they explain a performance difference.
const RELEVANCE: [&str; 16] = [
    "toolchain.kernel_compiler",
    "gpu.arch",
    "toolchain.rocm_installed",
    "toolchain.hip_runtime",
    "iommu.mode",
    "container.type",
    "container.image",
    "toolchain.backend",
    "cpu.simd",
    "cpu.model",
    "cpu.cores",
    "host.kernel_release",
    "host.governor",
    "host.power_profile",
    "civetta.git_sha",
    "civetta.version",
];

pub struct Comparison {
    pub text: String,
    /// False when the runs measured different things (model file, prompt set, tests).
    pub comparable: bool,
}

fn fields(fp: &serde_json::Value) -> Vec<(String, String)> {
    fp.get("fields")
        .and_then(|f| f.as_array())
        .map(|a| a.iter().filter_map(|f| Some((f.get("key")?.as_str()?.to_string(), f.get("value")?.as_str()?.to_string()))).collect())
        .unwrap_or_default()
}

/// Fingerprint fields whose values differ, most relevant first: (key, base, new).
pub fn fingerprint_diff(a: &serde_json::Value, b: &serde_json::Value) -> Vec<(String, String, String)> {
    let fa = fields(a);
    let fb = fields(b);
    let get = |v: &[(String, String)], k: &str| v.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.clone());
    let mut keys: Vec<String> = fa.iter().chain(fb.iter()).map(|(k, _)| k.clone()).collect();
    keys.sort();
    keys.dedup();
    let mut out: Vec<(String, String, String)> = keys
        .into_iter()
        .filter_map(|k| {
            let va = get(&fa, &k).unwrap_or_else(|| "absent".into());
            let vb = get(&fb, &k).unwrap_or_else(|| "absent".into());
            (va != vb).then_some((k, va, vb))
        })
        .collect();
    let rank = |k: &str| RELEVANCE.iter().position(|r| *r == k).unwrap_or(RELEVANCE.len());
    out.sort_by(|x, y| rank(&x.0).cmp(&rank(&y.0)).then(x.0.cmp(&y.0)));
    out
}

/// The factors two fingerprints differ in, less those the runs' backends do not use
/// ([`crate::envinfo::factors::for_backends`]).
pub fn factor_diff(a: &serde_json::Value, b: &serde_json::Value) -> Vec<crate::envinfo::factors::FactorDiff> {
    use crate::envinfo::factors::{differing_factors, for_backends};
    let backend = |fp| fields(fp).into_iter().find(|(k, _)| k == "toolchain.backend").map(|(_, v)| v);
    for_backends(differing_factors(&fingerprint_diff(a, b)), backend(a).as_deref(), backend(b).as_deref())
}

/// `within noise` when the mean ± stddev ranges overlap, else the change in percent.
pub fn verdict(base: &TestResult, new: &TestResult) -> String {
    let (lo_a, hi_a) = (base.mean_tps - base.stddev_tps, base.mean_tps + base.stddev_tps);
    let (lo_b, hi_b) = (new.mean_tps - new.stddev_tps, new.mean_tps + new.stddev_tps);
    if lo_a <= hi_b && lo_b <= hi_a {
        return "within noise".into();
    }
    let pct = (new.mean_tps / base.mean_tps - 1.0) * 100.0;
    if pct > 0.0 {
        format!("{pct:+.1}% faster")
    } else {
        format!("{:.1}% slower", -pct)
    }
}

pub fn compare(base: &BenchReport, new: &BenchReport) -> Comparison {
    let mut s = String::new();
    let mut problems = Vec::new();
    if base.model.file_sha256 != new.model.file_sha256 {
        problems.push(format!(
            "different model files ({} {} vs {} {})",
            base.model.name,
            short(&base.model.file_sha256),
            new.model.name,
            short(&new.model.file_sha256)
        ));
    }
    match (&base.hashes, &new.hashes) {
        (Some(a), Some(b)) if a.prompts_sha256 != b.prompts_sha256 => {
            problems.push("different hash prompt sets or token counts".into());
        }
        _ => {}
    }
    let names = |r: &BenchReport| r.tests.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
    if names(base) != names(new) {
        problems.push(format!("different tests ({} vs {})", names(base).join(","), names(new).join(",")));
    }
    if base.settings.threads != new.settings.threads {
        problems.push(format!("different thread counts ({} vs {})", base.settings.threads, new.settings.threads));
    }
    // Each repacked CPU layout has its own float order (quant::q4_k_x8, quant::q8_0_x8).
    let (b, n) = (&base.settings, &new.settings);
    for (name, layouts) in [("Q4_K", (b.cpu_q4_k_repacked, n.cpu_q4_k_repacked)), ("Q8_0", (b.cpu_q8_0_repacked, n.cpu_q8_0_repacked))] {
        if layouts.0 != layouts.1 {
            let says = |repacked: Option<bool>| match repacked {
                Some(true) => "repacked",
                Some(false) => "row-by-row",
                None => "not recorded",
            };
            problems.push(format!(
                "different CPU {name} layouts ({} vs {}): their float orders differ, so may their hashes",
                says(layouts.0),
                says(layouts.1)
            ));
        }
    }
    if base.settings.cpu_pool != new.settings.cpu_pool {
        let says = |r: &BenchReport| r.settings.cpu_pool.clone().unwrap_or_else(|| "not recorded".into());
        problems.push(format!("different CPU thread pools ({} vs {}): same bits, different per-region cost", says(base), says(new)));
    }
    let comparable = problems.iter().all(|p| {
        p.starts_with("different thread")
            || p.starts_with("different CPU Q4_K")
            || p.starts_with("different CPU Q8_0")
            || p.starts_with("different CPU thread pools")
    });
    if !problems.is_empty() {
        let head = if comparable { "NOTE" } else { "NOT COMPARABLE" };
        for p in &problems {
            let _ = writeln!(s, "**{head}:** {p}");
        }
        s.push('\n');
    }
    let diff = fingerprint_diff(&base.fingerprint, &new.fingerprint);
    // One variable at a time: a difference between runs that changed two factors belongs to neither.
    if let Some(w) = crate::envinfo::factors::confounding_warning(&factor_diff(&base.fingerprint, &new.fingerprint)) {
        let _ = writeln!(s, "{w}\n");
    }
    if diff.is_empty() {
        s += "environment: identical fingerprints\n\n";
    } else {
        s += "environment differences (most relevant first):\n";
        for (k, a, b) in &diff {
            let _ = writeln!(s, "- {}: {a} vs {b}", k.replace(['.', '_'], " "));
        }
        s.push('\n');
    }

    s += "| metric | baseline | change | delta | verdict |\n|---|---:|---:|---:|---|\n";
    for t in &base.tests {
        let Some(n) = new.tests.iter().find(|x| x.name == t.name) else {
            let _ = writeln!(s, "| {} t/s | {:.2} ± {:.2} | missing | | |", t.name, t.mean_tps, t.stddev_tps);
            continue;
        };
        let _ = writeln!(
            s,
            "| {} t/s | {:.2} ± {:.2} | {:.2} ± {:.2} | {:+.1}% | {} |",
            t.name,
            t.mean_tps,
            t.stddev_tps,
            n.mean_tps,
            n.stddev_tps,
            (n.mean_tps / t.mean_tps - 1.0) * 100.0,
            verdict(t, n)
        );
    }
    for st in &base.profile.stages {
        let nv = new.profile.stages.iter().find(|x| x.stage == st.stage);
        let _ = writeln!(
            s,
            "| stage {} s | {:.4} ({:.0}%) | {} | {} | |",
            st.stage,
            st.seconds,
            st.share * 100.0,
            nv.map(|x| format!("{:.4} ({:.0}%)", x.seconds, x.share * 100.0)).unwrap_or_else(|| "missing".into()),
            nv.map(|x| pct(st.seconds, x.seconds)).unwrap_or_default()
        );
    }
    for k in &base.profile.kernels {
        let nv = new.profile.kernels.iter().find(|x| x.kernel == k.kernel && x.shape_class == k.shape_class);
        let _ = writeln!(
            s,
            "| kernel {} [{}] µs/call | {:.2} | {} | {} | |",
            k.kernel,
            k.shape_class,
            k.per_call_seconds * 1e6,
            nv.map(|x| format!("{:.2}", x.per_call_seconds * 1e6)).unwrap_or_else(|| "missing".into()),
            nv.map(|x| pct(k.per_call_seconds, x.per_call_seconds)).unwrap_or_default()
        );
        if let (Some(ra), Some(rb)) = (&k.resources, nv.and_then(|x| x.resources.as_ref())) {
            for (name, a, b) in [
                ("VGPRs", ra.vgprs as f64, rb.vgprs as f64),
                ("scratch bytes", ra.scratch_bytes as f64, rb.scratch_bytes as f64),
                ("spills", ra.spills as f64, rb.spills as f64),
                (ra.occupancy_unit.as_str(), ra.occupancy as f64, rb.occupancy as f64),
            ] {
                let mark = if a != b { "changed" } else { "" };
                let _ = writeln!(s, "| kernel {} {name} | {a} | {b} | {:+} | {mark} |", k.kernel, b - a);
            }
        }
    }
    match (&base.hashes, &new.hashes) {
        (Some(a), Some(b)) => {
            let differing: Vec<&str> =
                a.completions.iter().zip(&b.completions).filter(|(x, y)| x.sha256 != y.sha256).map(|(x, _)| x.prompt.as_str()).collect();
            if differing.is_empty() && a.completions.len() == b.completions.len() {
                let _ = writeln!(
                    s,
                    "| completion hashes | {} | {} | identical | bit-exact: yes |",
                    short(&a.overall_sha256),
                    short(&b.overall_sha256)
                );
            } else {
                let _ = writeln!(
                    s,
                    "| completion hashes | {} | {} | {} of {} differ | bit-exact: no |",
                    short(&a.overall_sha256),
                    short(&b.overall_sha256),
                    differing.len(),
                    a.completions.len()
                );
                for p in differing {
                    let _ = writeln!(s, "| differs: {p:?} | | | | |");
                }
            }
        }
        _ => s += "| completion hashes | | | not recorded in both runs | |\n",
    }
    Comparison { text: s, comparable }
}

fn pct(a: f64, b: f64) -> String {
    if a > 0.0 {
        format!("{:+.1}%", (b / a - 1.0) * 100.0)
    } else {
        String::new()
    }
}

fn short(h: &str) -> &str {
    h.get(..12).unwrap_or(h)
}
