//! Static checks of deploy/: the files parse, agree with each other (ports, data source
//! uid, recorded series, image tags of containers/matrix.toml) and name only metrics
//! civetta documents. The live check against a real Prometheus is
//! scripts/prometheus-check.sh (make test-prometheus; tests/deploy_prometheus.rs).

use serde_json::Value as Json;
use serde_yaml::Value as Yaml;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

fn yaml(rel: &str) -> Yaml {
    serde_yaml::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} is not valid YAML: {e}"))
}

fn yaml_docs(rel: &str) -> Vec<Yaml> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(&read(rel)).map(|d| Yaml::deserialize(d).unwrap_or_else(|e| panic!("{rel}: {e}"))).collect()
}

fn s<'a>(v: &'a Yaml, path: &[&str]) -> &'a Yaml {
    let mut node = v;
    for key in path {
        node = node.get(*key).unwrap_or_else(|| panic!("missing key {key} in path {path:?}"));
    }
    node
}

/// The metric families civetta exports (docs/DEPLOY.md, "Metrics"); histograms expand
/// to _bucket/_sum/_count.
const EXPORTED: &[(&str, bool)] = &[
    ("civetta_request_duration_seconds", true),
    ("civetta_requests_total", false),
    ("civetta_time_to_first_token_seconds", true),
    ("civetta_inter_token_latency_seconds", true),
    ("civetta_prompt_tokens_total", false),
    ("civetta_generated_tokens_total", false),
    ("civetta_requests_in_flight", false),
    ("civetta_queue_depth", false),
    ("civetta_active_sequences", false),
    ("civetta_requests_rejected_total", false),
    ("civetta_build_info", false),
    ("civetta_environment_info", false),
    ("civetta_kernel_duration_seconds", true),
    ("civetta_kernel_calls_total", false),
    ("civetta_kernel_vgprs", false),
    ("civetta_kernel_sgprs", false),
    ("civetta_kernel_scratch_bytes", false),
    ("civetta_kernel_lds_bytes", false),
    ("civetta_kernel_occupancy_waves", false),
    ("civetta_kv_cache_bytes", false),
    ("civetta_batch_rows", true),
    ("civetta_batch_sequences", true),
    ("civetta_kv_cache_usage_ratio", false),
    ("civetta_kv_cache_blocks", false),
    ("civetta_prefix_cache_tokens_total", false),
    ("civetta_preemptions_total", false),
];

fn exported_names() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (name, histogram) in EXPORTED {
        if *histogram {
            for suffix in ["_bucket", "_sum", "_count"] {
                out.insert(format!("{name}{suffix}"));
            }
        } else {
            out.insert(name.to_string());
        }
    }
    out
}

/// civetta_* identifiers and level:civetta_*:op recorded names in a PromQL text
/// (quoted label values are skipped).
fn referenced_names(expr: &str) -> BTreeSet<String> {
    let mut unquoted = String::new();
    let mut in_quote = false;
    for c in expr.chars() {
        if c == '"' {
            in_quote = !in_quote;
        } else if !in_quote {
            unquoted.push(c);
        }
    }
    unquoted
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("civetta_") || w.contains(":civetta_"))
        .map(str::to_string)
        .collect()
}

fn dashboard() -> Json {
    serde_json::from_str(&read("deploy/grafana/dashboards/civetta.json")).expect("dashboard JSON")
}

fn panels(dash: &Json) -> Vec<Json> {
    let mut out = Vec::new();
    let mut stack: Vec<Json> = dash["panels"].as_array().expect("panels").clone();
    while let Some(p) = stack.pop() {
        if let Some(inner) = p["panels"].as_array() {
            stack.extend(inner.iter().cloned());
        }
        out.push(p);
    }
    out
}

fn dashboard_exprs() -> Vec<(String, String)> {
    panels(&dashboard())
        .iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or("?").to_string();
            p["targets"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |t| (title.clone(), t["expr"].as_str().unwrap_or("").to_string()))
        })
        .collect()
}

fn recorded_series() -> Vec<(String, String)> {
    let rules = yaml("deploy/prometheus/rules/civetta.rules.yml");
    s(&rules, &["groups"])
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| s(g, &["rules"]).as_sequence().expect("rules").clone())
        .map(|r| {
            (
                r.get("record").and_then(Yaml::as_str).expect("every rule records a series").to_string(),
                r.get("expr").and_then(Yaml::as_str).expect("expr").to_string(),
            )
        })
        .collect()
}

#[test]
fn dashboard_panels_cover_the_issue_and_name_known_metrics() {
    let dash = dashboard();
    assert_eq!(dash["uid"], "civetta-overview");
    let exprs = dashboard_exprs();
    assert!(exprs.iter().all(|(_, e)| !e.trim().is_empty()), "a panel target without expr");
    let recorded: BTreeSet<String> = recorded_series().into_iter().map(|(r, _)| r).collect();
    let exported = exported_names();
    for (title, expr) in &exprs {
        for name in referenced_names(expr) {
            let known = if name.contains(':') { recorded.contains(&name) } else { exported.contains(&name) };
            assert!(known, "panel {title:?} names {name}, which civetta does not export: {expr}");
        }
    }
    let titles: Vec<String> = panels(&dash).iter().filter_map(|p| p["title"].as_str().map(str::to_lowercase)).collect();
    for needle in [
        "request rate",
        "time to first token",
        "inter-token",
        "tokens per second",
        "kernel time share",
        "time per call",
        "kernel resources",
        "build and environment",
    ] {
        assert!(titles.iter().any(|t| t.contains(needle)), "no panel about {needle:?}: {titles:?}");
    }
    // The resource table shows every GPU gauge; the info table shows the environment labels.
    let all = exprs.iter().map(|(_, e)| e.as_str()).collect::<Vec<_>>().join("\n");
    for metric in [
        "civetta_kernel_vgprs",
        "civetta_kernel_scratch_bytes",
        "civetta_kernel_occupancy_waves",
        "civetta_environment_info",
        "civetta_build_info",
        "civetta_time_to_first_token_seconds_bucket",
        "civetta_inter_token_latency_seconds_bucket",
        "civetta_batch_rows_bucket",
        "civetta_kv_cache_usage_ratio",
        "civetta_kv_cache_blocks",
        "civetta_prefix_cache_tokens_total",
        "civetta_preemptions_total",
    ] {
        assert!(all.contains(metric), "dashboard never queries {metric}");
    }
}

#[test]
fn name_check_rejects_unknown_metrics() {
    // Guards the check above: an unexported name must be found.
    let names = referenced_names(r#"sum(rate(civetta_bogus_total{rpc="civetta_label_value"}[1m])) / civetta_requests_total"#);
    assert_eq!(names, BTreeSet::from(["civetta_bogus_total".to_string(), "civetta_requests_total".to_string()]));
    assert!(!exported_names().contains("civetta_bogus_total"));
}

#[test]
fn dashboard_variables_and_datasource_match_provisioning() {
    let dash = dashboard();
    let vars: Vec<String> =
        dash["templating"]["list"].as_array().expect("templating").iter().map(|v| v["name"].as_str().unwrap().to_string()).collect();
    let grafana_builtins = ["__rate_interval", "__interval", "__range"];
    for (title, expr) in dashboard_exprs() {
        for part in expr.split('$').skip(1) {
            let name: String = part.trim_start_matches('{').chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            assert!(vars.contains(&name) || grafana_builtins.contains(&name.as_str()), "panel {title:?} uses undefined ${name}");
        }
    }
    let ds = yaml("deploy/grafana/provisioning/datasources/civetta.yml");
    let uid = s(&ds, &["datasources"])[0]["uid"].as_str().expect("datasource uid").to_string();
    let default = dash["templating"]["list"].as_array().unwrap().iter().find(|v| v["type"] == "datasource").expect("datasource variable");
    assert_eq!(default["current"]["value"].as_str(), Some(uid.as_str()), "dashboard default data source is not the provisioned uid");
    let prov = yaml("deploy/grafana/provisioning/dashboards/civetta.yml");
    let path = s(&prov, &["providers"])[0]["options"]["path"].as_str().expect("provider path").to_string();
    let compose = read("deploy/compose.yaml");
    assert!(compose.contains(&format!("./grafana/dashboards:{path}")), "compose does not mount the dashboards at {path}");
}

#[test]
fn prometheus_config_and_rules_agree() {
    let config = yaml("deploy/prometheus/prometheus.yml");
    let rule_files = s(&config, &["rule_files"]).as_sequence().expect("rule_files");
    for f in rule_files {
        let rel = format!("deploy/prometheus/{}", f.as_str().unwrap());
        assert!(root().join(&rel).is_file(), "rule file {rel} missing");
    }
    let jobs = s(&config, &["scrape_configs"]).as_sequence().expect("scrape_configs");
    let civetta = jobs.iter().find(|j| j["job_name"] == "civetta").expect("job civetta");
    let targets = &civetta["static_configs"][0]["targets"];
    assert_eq!(targets[0].as_str(), Some("127.0.0.1:9464"));
    let exported = exported_names();
    let records = recorded_series();
    let names: Vec<&str> = records.iter().map(|(r, _)| r.as_str()).collect();
    for (record, expr) in &records {
        assert_eq!(record.split(':').count(), 3, "{record} is not level:metric:operations");
        for name in referenced_names(expr) {
            assert!(exported.contains(&name) || names.contains(&name.as_str()), "rule {record} uses unknown {name}");
        }
    }
    assert!(
        records.iter().any(|(_, e)| e.contains("group_left") && e.contains("civetta_kernel_duration_seconds_sum")),
        "no kernel time share rule"
    );
    assert!(records.iter().any(|(_, e)| e.contains("civetta_generated_tokens_total")), "no tokens/s rule");
}

fn matrix_tags() -> Vec<String> {
    let doc: toml::Table = read("containers/matrix.toml").parse().unwrap();
    doc["image"].as_array().unwrap().iter().map(|i| i["tag"].as_str().unwrap().to_string()).collect()
}

fn assert_matrix_image(image: &str, where_: &str) {
    let tag = image.strip_prefix("localhost/civetta:").unwrap_or_else(|| panic!("{where_}: image {image} is not localhost/civetta:<tag>"));
    assert!(matrix_tags().iter().any(|t| t == tag), "{where_}: tag {tag} is not in containers/matrix.toml");
}

#[test]
fn kubernetes_manifests_are_scrapable_and_request_the_gpu() {
    for (file, gpu) in [("deploy/kubernetes/civetta-cpu.yaml", false), ("deploy/kubernetes/civetta-rocm.yaml", true)] {
        let docs = yaml_docs(file);
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap_or("")).collect();
        assert_eq!(kinds, ["Deployment", "Service"], "{file}");
        let deploy = &docs[0];
        let template = s(deploy, &["spec", "template"]);
        let ann = s(template, &["metadata", "annotations"]);
        assert_eq!(ann["prometheus.io/scrape"].as_str(), Some("true"), "{file}");
        let port = ann["prometheus.io/port"].as_str().expect("port annotation");
        let container = &s(template, &["spec", "containers"])[0];
        let ports: Vec<String> =
            container["ports"].as_sequence().unwrap().iter().map(|p| p["containerPort"].as_u64().unwrap().to_string()).collect();
        assert!(ports.contains(&port.to_string()) && ports.contains(&"50051".to_string()), "{file}: ports {ports:?}");
        // The OpenAI-compatible HTTP API is published too, and readiness follows its /health.
        assert!(ports.contains(&"8080".to_string()), "{file}: ports {ports:?}");
        let args: Vec<&str> = container["args"].as_sequence().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        assert!(args.windows(2).any(|w| w == ["--http-addr", "0.0.0.0:8080"]), "{file}: args {args:?}");
        assert_eq!(container["readinessProbe"]["httpGet"]["path"].as_str(), Some("/health"), "{file}");
        assert_eq!(s(template, &["spec", "securityContext", "runAsNonRoot"]).as_bool(), Some(true), "{file}");
        assert_matrix_image(container["image"].as_str().unwrap(), file);
        let limits = &container["resources"]["limits"];
        assert_eq!(limits.get("amd.com/gpu").is_some(), gpu, "{file}: amd.com/gpu limit");
        let selector = s(&docs[1], &["spec", "selector"]);
        for (k, v) in selector.as_mapping().unwrap() {
            assert_eq!(s(template, &["metadata", "labels"]).get(k), Some(v), "{file}: Service selector does not match the pods");
        }
    }
}

#[test]
fn compose_and_quadlet_use_pinned_images_and_loopback() {
    let compose = yaml("deploy/compose.yaml");
    let services = s(&compose, &["services"]).as_mapping().unwrap();
    for name in ["civetta", "prometheus", "grafana"] {
        let svc = services.get(name).unwrap_or_else(|| panic!("compose lacks service {name}"));
        let image = svc["image"].as_str().unwrap();
        if name == "civetta" {
            assert!(image.contains("localhost/civetta:cpu"), "compose civetta image default: {image}");
        } else {
            let tag = image.rsplit(':').next().unwrap();
            assert!(tag.starts_with('v') || tag.chars().next().unwrap().is_ascii_digit(), "{name} image not pinned: {image}");
        }
        for v in svc.get("volumes").and_then(Yaml::as_sequence).into_iter().flatten() {
            let src = v.as_str().unwrap().split(':').next().unwrap();
            if src.starts_with("./") {
                assert!(root().join("deploy").join(src).exists(), "compose mounts missing {src}");
            }
        }
    }
    let command: Vec<&str> = services["civetta"]["command"].as_sequence().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    assert!(command.contains(&"127.0.0.1:9464"), "compose civetta must serve metrics where prometheus.yml scrapes");
    assert!(command.windows(2).any(|w| w == ["--http-addr", "127.0.0.1:8080"]), "compose civetta serves the HTTP API: {command:?}");

    let quadlet = read("deploy/podman/civetta.container");
    let image = quadlet.lines().find_map(|l| l.strip_prefix("Image=")).expect("Image=");
    assert_matrix_image(image, "civetta.container");
    for line in [
        "AddDevice=/dev/kfd",
        "AddDevice=/dev/dri",
        "PodmanArgs=--group-add keep-groups",
        "PublishPort=127.0.0.1:50051:50051",
        "PublishPort=127.0.0.1:9464:9464",
        "PublishPort=127.0.0.1:8080:8080",
    ] {
        assert!(quadlet.lines().any(|l| l == line), "quadlet lacks {line}");
    }
    for section in ["[Unit]", "[Container]", "[Service]", "[Install]"] {
        assert!(quadlet.contains(section), "quadlet lacks {section}");
    }
}

#[test]
fn deploy_docs_reference_existing_files() {
    let doc = read("docs/DEPLOY.md");
    for rel in [
        "deploy/prometheus/prometheus.yml",
        "deploy/grafana/dashboards/civetta.json",
        "deploy/podman/civetta.container",
        "deploy/compose.yaml",
        "deploy/kubernetes/civetta-rocm.yaml",
    ] {
        assert!(Path::new(&root().join(rel)).is_file(), "{rel} missing");
        assert!(doc.contains(rel), "docs/DEPLOY.md does not mention {rel}");
    }
}
