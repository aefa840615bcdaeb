//! `civetta repro`: the interleaving driver with fake layers (skipped, failed, interleaved,
//! pooled, overhead rows), the report's JSON round trip and `repro check`, and `repro merge`
//! naming every confounded factor. Fingerprints come from the fixture trees of
//! tests/fixtures/env; bench results from tests/fixtures/bench/base.json.

use civetta::bench::BenchReport;
use civetta::envinfo::{collect, CollectOptions, Field, Fingerprint};
use civetta::repro::cli::problems;
use civetta::repro::driver;
use civetta::repro::layer::{BenchInvocation, LayerRunner};
use civetta::repro::merge::{columns_of, merge};
use civetta::repro::report::{field_value, CellStatus, ReproReport};
use std::cell::RefCell;
use std::path::PathBuf;

fn fixture_fp(name: &str) -> Fingerprint {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/env").join(name);
    collect(&CollectOptions::fixture(dir, "cpu"))
}

/// `fp` as seen inside a podman container of localhost/civetta:cpu.
fn in_podman(fp: &Fingerprint) -> Fingerprint {
    let mut fields: Vec<Field> = fp.fields.clone();
    for f in &mut fields {
        match f.key.as_str() {
            "container.type" => f.value = "podman".into(),
            "container.image" => f.value = "civetta:cpu".into(),
            _ => {}
        }
    }
    Fingerprint::from_fields(fields)
}

fn base_report() -> BenchReport {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bench/base.json");
    civetta::bench::cli::load_report(&p).unwrap()
}

/// A layer that returns base.json with its own fingerprint and t/s scaled by `speed`.
struct FakeLayer<'a> {
    name: &'static str,
    fp: Fingerprint,
    speed: f64,
    unavailable: Option<&'static str>,
    fail_on_call: Option<usize>,
    log: &'a RefCell<Vec<String>>,
}

impl LayerRunner for FakeLayer<'_> {
    fn name(&self) -> &str {
        self.name
    }
    fn check(&self, _: &BenchInvocation) -> Result<(), String> {
        self.unavailable.map_or(Ok(()), |r| Err(r.to_string()))
    }
    fn command(&self, b: &BenchInvocation) -> Vec<String> {
        let mut c = vec![format!("fake-{}", self.name)];
        c.extend(b.bench_args("m.gguf"));
        c
    }
    fn run(&self, _: &BenchInvocation) -> anyhow::Result<BenchReport> {
        let call = self.log.borrow().iter().filter(|n| n.as_str() == self.name).count();
        self.log.borrow_mut().push(self.name.to_string());
        if self.fail_on_call == Some(call) {
            anyhow::bail!("container exited with 125");
        }
        let mut r = base_report();
        // As `civetta bench` writes it: the fingerprint plus the backend's own description.
        r.fingerprint = self.fp.to_json();
        r.fingerprint["backend"] = serde_json::json!({"name": "cpu", "variant": "avx2"});
        for t in &mut r.tests {
            // Each round a little different, so pooling is visible.
            t.samples_tps = t.samples_tps.iter().map(|x| x * self.speed + call as f64).collect();
            (t.mean_tps, t.stddev_tps) = civetta::bench::mean_stddev(&t.samples_tps);
        }
        Ok(r)
    }
}

fn fake<'a>(name: &'static str, fp: Fingerprint, speed: f64, log: &'a RefCell<Vec<String>>) -> FakeLayer<'a> {
    FakeLayer { name, fp, speed, unavailable: None, fail_on_call: None, log }
}

fn bench_args() -> Vec<String> {
    ["-m", "models/default.gguf", "-p", "64", "-n", "16", "-r", "2"].map(String::from).to_vec()
}

fn run_fakes(layers: &[&dyn LayerRunner], rounds: usize) -> ReproReport {
    let args = bench_args();
    let inv = BenchInvocation::parse(&args).unwrap();
    driver::run(layers, &inv, &args, rounds, &mut |_| {})
}

#[test]
fn layers_interleave_and_each_cell_keeps_its_fingerprint() {
    let log = RefCell::new(Vec::new());
    let host_fp = fixture_fp("strix-halo");
    let host = fake("host", host_fp.clone(), 1.0, &log);
    let podman = fake("podman", in_podman(&host_fp), 0.9, &log);
    let toolbox = FakeLayer { unavailable: Some("toolbox is not installed (not on PATH)"), ..fake("toolbox", host_fp.clone(), 1.0, &log) };
    let r = run_fakes(&[&host, &podman, &toolbox], 3);

    // Rotated order each round; the skipped layer never runs.
    assert_eq!(r.order, [vec!["host", "podman"], vec!["podman", "host"], vec!["host", "podman"]]);
    assert_eq!(*log.borrow(), ["host", "podman", "podman", "host", "host", "podman"]);
    let tb = &r.cells["toolbox"];
    assert_eq!(tb.status, CellStatus::Skipped);
    assert_eq!(tb.reason.as_deref(), Some("toolbox is not installed (not on PATH)"));
    assert!(tb.report.is_none());

    // Each cell pools its rounds (3 rounds x 2 repetitions) and carries its own fingerprint.
    let host_cell = r.cells["host"].report.as_ref().unwrap();
    assert_eq!(host_cell.tests[0].samples_tps.len(), 6);
    assert_eq!(r.cells["host"].round_means["pp64"].len(), 3);
    assert_eq!(field_value(&host_cell.fingerprint, "container.type"), Some("none"));
    let podman_fp = r.cells["podman"].fingerprint().unwrap();
    assert_eq!(field_value(podman_fp, "container.type"), Some("podman"));
    assert_eq!(field_value(podman_fp, "container.image"), Some("civetta:cpu"));

    // The overhead row: podman against host, the container layer its only factor.
    let rows: Vec<_> = r.overhead.iter().filter(|o| o.layer == "podman").collect();
    assert_eq!(rows.len(), 2, "one row per test");
    let pp = rows.iter().find(|o| o.test == "pp64").unwrap();
    assert_eq!(pp.baseline, "host");
    assert_eq!(pp.factors, ["container layer"]);
    assert!((pp.change_pct - (pp.layer_tps / pp.baseline_tps - 1.0) * 100.0).abs() < 1e-9);
    assert!(pp.change_pct < -5.0 && pp.change_pct > -15.0, "{}", pp.change_pct);
    assert_eq!(pp.bit_exact, Some(true));
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);

    // The JSON round trip keeps everything, and `repro check` accepts it.
    let json = serde_json::to_string(&r).unwrap();
    let back: ReproReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back, r);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(v["cells"]["podman"]["report"]["fingerprint"]["fields"].is_array(), "cells are keyed by layer name");
    assert!(problems(&r, &["host".into(), "podman".into()]).is_empty());
    let p = problems(&r, &["host".into(), "toolbox".into()]);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].contains("toolbox did not run"), "{p:?}");
    // A podman cell whose fingerprint says it ran on the host is caught.
    let mut wrong = r.clone();
    let fields = wrong.cells.get_mut("podman").unwrap().report.as_mut().unwrap().fingerprint["fields"].as_array_mut().unwrap();
    fields.iter_mut().filter(|f| f["key"] == "container.type").for_each(|f| f["value"] = "none".into());
    let p = problems(&wrong, &["host".into(), "podman".into()]);
    assert_eq!(p, ["layer podman: its fingerprint says container \"none\", not \"podman\""]);

    let md = r.render_md();
    assert!(md.contains("| test | host t/s | podman t/s |"), "{md}");
    assert!(md.contains("| overhead podman vs host pp64 |"), "{md}");
    assert!(md.contains("toolbox: skipped: toolbox is not installed"), "{md}");
}

#[test]
fn a_failing_layer_is_a_failed_cell_and_the_rest_still_run() {
    let log = RefCell::new(Vec::new());
    let fp = fixture_fp("strix-halo");
    let host = fake("host", fp.clone(), 1.0, &log);
    let podman = FakeLayer { fail_on_call: Some(1), ..fake("podman", in_podman(&fp), 1.0, &log) };
    let r = run_fakes(&[&host, &podman], 3);
    // podman failed in round 2 and was not run again; host ran all three rounds.
    assert_eq!(*log.borrow(), ["host", "podman", "podman", "host", "host"]);
    assert_eq!(r.cells["podman"].status, CellStatus::Failed);
    assert!(r.cells["podman"].reason.as_deref().unwrap().contains("round 2: container exited with 125"));
    assert_eq!(r.cells["host"].status, CellStatus::Ran);
    assert!(r.overhead.is_empty());
    assert!(!problems(&r, &["host".into(), "podman".into()]).is_empty());
}

#[test]
fn a_layer_that_differs_in_more_than_the_layer_is_flagged() {
    // The toolbox image ships its own kernel compiler: for a GPU backend the overhead row is
    // confounded (for the CPU backend the compiler is no factor: envinfo::factors::for_backends).
    let log = RefCell::new(Vec::new());
    let fp = collect(&CollectOptions::fixture(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/env/strix-halo"), "hip"));
    let mut fields = fp.fields.clone();
    for f in &mut fields {
        match f.key.as_str() {
            "container.type" => f.value = "toolbox".into(),
            "toolchain.kernel_compiler" => f.value = "AMD clang version 19.0.0git (roc-6.4.4)".into(),
            _ => {}
        }
    }
    let host = fake("host", fp.clone(), 1.0, &log);
    let toolbox = fake("toolbox", Fingerprint::from_fields(fields), 1.0, &log);
    let r = run_fakes(&[&host, &toolbox], 1);
    assert_eq!(r.overhead[0].factors, ["compiler", "container layer"]);
    assert_eq!(r.warnings.len(), 1);
    assert!(r.warnings[0].contains("compiler, container layer"), "{:?}", r.warnings);
}

#[test]
fn the_environment_changing_between_rounds_is_a_warning() {
    struct Drifting<'a>(FakeLayer<'a>, Fingerprint);
    impl LayerRunner for Drifting<'_> {
        fn name(&self) -> &str {
            self.0.name()
        }
        fn check(&self, b: &BenchInvocation) -> Result<(), String> {
            self.0.check(b)
        }
        fn command(&self, b: &BenchInvocation) -> Vec<String> {
            self.0.command(b)
        }
        fn run(&self, b: &BenchInvocation) -> anyhow::Result<BenchReport> {
            let first = self.0.log.borrow().is_empty();
            let mut r = self.0.run(b)?;
            if !first {
                r.fingerprint = self.1.to_json();
            }
            Ok(r)
        }
    }
    let log = RefCell::new(Vec::new());
    let host = Drifting(fake("host", fixture_fp("strix-halo"), 1.0, &log), fixture_fp("strix-halo-iommu-off-balanced"));
    let r = run_fakes(&[&host], 2);
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    assert!(
        r.warnings[0].contains("changed between round 1 and round 2") && r.warnings[0].contains("host.power_profile"),
        "{:?}",
        r.warnings
    );
}

/// Two boots of one Strix Halo: passthrough + performance, then off + balanced.
fn two_boots() -> (String, String) {
    let boot = |fp: Fingerprint| {
        let log = RefCell::new(Vec::new());
        let host = fake("host", fp.clone(), 1.0, &log);
        let podman = fake("podman", in_podman(&fp), 0.95, &log);
        serde_json::to_string(&run_fakes(&[&host, &podman], 1)).unwrap()
    };
    (boot(fixture_fp("strix-halo")), boot(fixture_fp("strix-halo-iommu-off-balanced")))
}

#[test]
fn merge_names_both_factors_when_iommu_and_power_profile_changed_together() {
    let (a, b) = two_boots();
    let mut cols = columns_of("pt.json", &a).unwrap();
    cols.extend(columns_of("off.json", &b).unwrap());
    assert_eq!(
        cols.iter().map(|c| c.source.as_str()).collect::<Vec<_>>(),
        ["pt.json:host", "pt.json:podman", "off.json:host", "off.json:podman"]
    );
    let m = merge(&cols);
    assert!(m.confounded && m.comparable);
    assert!(m.text.contains("factors that differ: IOMMU mode, container layer, power profile"), "{}", m.text);
    // Columns are labelled by the differing factors' values.
    assert!(m.text.contains("| IOMMU mode: off; container layer: podman/civetta:cpu; power profile: balanced |"), "{}", m.text);
    // The container layer changes alone (host vs podman in one boot): attributable. The
    // IOMMU mode never does: the warning names it and the power profile.
    let warnings: Vec<&str> = m.text.lines().filter(|l| l.starts_with("WARNING")).collect();
    assert_eq!(warnings.len(), 1, "{}", m.text);
    assert!(warnings[0].contains("2 factors (IOMMU mode, power profile)"), "{}", warnings[0]);
    assert!(warnings[0].contains("iommu.mode: passthrough vs off") && warnings[0].contains("host.power_profile: performance vs balanced"));
    assert!(m.text.contains("| pp64 t/s |"), "{}", m.text);
}

#[test]
fn merge_of_one_factor_is_clean_and_bench_reports_are_columns_too() {
    let (a, _) = two_boots();
    let cols = columns_of("pt.json", &a).unwrap();
    let m = merge(&cols);
    assert!(!m.confounded, "{}", m.text);
    assert!(m.text.contains("factors that differ: container layer"), "{}", m.text);
    // A plain bench report is one column.
    let bench = serde_json::to_string(&base_report()).unwrap();
    let mut cols = columns_of("base.json", &bench).unwrap();
    assert_eq!(cols.len(), 1);
    assert!(!merge(&cols).text.contains("different tests"));
    cols.extend(columns_of("pt.json", &a).unwrap());
    cols[1].tests.truncate(1);
    assert!(merge(&cols).text.contains("NOTE: the columns ran different tests"));
    assert!(columns_of("x.json", "{\"kind\": \"civetta-repro\"}").is_err());
    assert!(columns_of("x.json", "[1, 2]").unwrap_err().to_string().contains("neither"));
}
