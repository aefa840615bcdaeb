//! The live Prometheus check: scripts/prometheus-check.sh starts `civetta serve` and a real
//! Prometheus (Debian package) and evaluates every dashboard and rule query.
//! Ignored by default (needs the prometheus package and a release build); CI runs it
//! through `make test-prometheus`, or: cargo test --test deploy_prometheus -- --ignored

use std::process::Command;

#[test]
#[ignore = "needs /usr/bin/prometheus and a release build; run make test-prometheus"]
fn every_dashboard_and_rule_query_returns_data_from_a_live_daemon() {
    let root = env!("CARGO_MANIFEST_DIR");
    let status = Command::new("bash")
        .arg(format!("{root}/scripts/prometheus-check.sh"))
        .current_dir(root)
        .status()
        .expect("run scripts/prometheus-check.sh");
    assert!(status.success(), "scripts/prometheus-check.sh failed: {status}");
}
