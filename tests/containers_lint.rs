//! Lint of containers/: every Containerfile is checked against containers/matrix.toml
//! (tag, ROCm and clang versions, labels, pinned revisions and bases, non-root user,
//! health probe, image.json), and the docs must show the GPU device flags.
//!
//! The lint is a function over the file text so the tests below can also feed it broken
//! Containerfiles and check that it catches each kind of mistake.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

// ---------------------------------------------------------------- matrix

#[derive(Debug, Clone)]
struct Defaults {
    grpc_port: u16,
    metrics_port: u16,
    http_port: u16,
    image_json: String,
}

#[derive(Debug, Clone)]
struct MatrixImage {
    tag: String,
    kind: String,
    rocm: String,
    clang: String,
    base: String,
    toolbox_base: String,
    clang_path: String,
    gfx: Vec<String>,
}

fn str_field(table: &toml::Table, key: &str) -> String {
    match table.get(key) {
        Some(toml::Value::String(s)) => s.clone(),
        other => panic!("matrix: field {key:?} must be a string, got {other:?}"),
    }
}

fn load_matrix() -> (Defaults, Vec<MatrixImage>) {
    let text = read(&root().join("containers/matrix.toml"));
    let doc: toml::Table = text.parse().expect("containers/matrix.toml is valid TOML");
    let d = doc["defaults"].as_table().expect("[defaults]");
    let defaults = Defaults {
        grpc_port: d["grpc_port"].as_integer().expect("grpc_port") as u16,
        metrics_port: d["metrics_port"].as_integer().expect("metrics_port") as u16,
        http_port: d["http_port"].as_integer().expect("http_port") as u16,
        image_json: d["image_json"].as_str().expect("image_json").to_string(),
    };
    let images = doc["image"]
        .as_array()
        .expect("[[image]] entries")
        .iter()
        .map(|v| {
            let t = v.as_table().expect("[[image]] is a table");
            MatrixImage {
                tag: str_field(t, "tag"),
                kind: str_field(t, "kind"),
                rocm: str_field(t, "rocm"),
                clang: str_field(t, "clang"),
                base: str_field(t, "base"),
                toolbox_base: str_field(t, "toolbox_base"),
                clang_path: str_field(t, "clang_path"),
                gfx: t["gfx"]
                    .as_array()
                    .expect("gfx is an array")
                    .iter()
                    .map(|g| g.as_str().expect("gfx entries are strings").to_string())
                    .collect(),
            }
        })
        .collect();
    (defaults, images)
}

// ---------------------------------------------------------------- Containerfile parser

#[derive(Debug, Clone)]
struct Instruction {
    keyword: String,
    args: String,
}

#[derive(Debug, Default)]
struct Stage {
    from: String,
    name: Option<String>,
    instructions: Vec<Instruction>,
}

#[derive(Debug, Default)]
struct Containerfile {
    /// ARGs before the first FROM (name -> default).
    global_args: BTreeMap<String, Option<String>>,
    stages: Vec<Stage>,
}

/// Joins continuation lines, drops comments and blank lines, splits into stages.
fn parse_containerfile(text: &str) -> Result<Containerfile, String> {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(body) = trimmed.strip_suffix('\\') {
            current.push_str(body);
            current.push(' ');
        } else {
            current.push_str(trimmed);
            logical.push(std::mem::take(&mut current));
        }
    }
    if !current.trim().is_empty() {
        return Err("the file ends inside a continued line".into());
    }
    let mut file = Containerfile::default();
    for line in logical {
        let (keyword, args) = line.split_once(char::is_whitespace).unwrap_or((line.as_str(), ""));
        let keyword = keyword.to_ascii_uppercase();
        let args = args.trim().to_string();
        if keyword == "FROM" {
            let parts: Vec<&str> = args.split_whitespace().collect();
            let name = match parts.as_slice() {
                [_, as_kw, name] if as_kw.eq_ignore_ascii_case("as") => Some(name.to_string()),
                [_] => None,
                _ => return Err(format!("cannot parse FROM {args:?}")),
            };
            file.stages.push(Stage { from: parts[0].to_string(), name, instructions: vec![] });
        } else if let Some(stage) = file.stages.last_mut() {
            stage.instructions.push(Instruction { keyword, args });
        } else if keyword == "ARG" {
            let (name, default) = split_arg(&args);
            file.global_args.insert(name, default);
        } else {
            return Err(format!("{keyword} before the first FROM"));
        }
    }
    if file.stages.is_empty() {
        return Err("no FROM".into());
    }
    Ok(file)
}

fn split_arg(args: &str) -> (String, Option<String>) {
    match args.split_once('=') {
        Some((name, default)) => (name.trim().to_string(), Some(default.trim().to_string())),
        None => (args.trim().to_string(), None),
    }
}

/// LABEL k="v" k2="v2" (values may hold spaces inside the quotes).
fn parse_labels(args: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut rest = args.trim();
    while !rest.is_empty() {
        let eq = rest.find('=').ok_or_else(|| format!("LABEL without '=' near {rest:?}"))?;
        let key = rest[..eq].trim().to_string();
        let after = &rest[eq + 1..];
        let (value, remaining) = if let Some(quoted) = after.strip_prefix('"') {
            let end = quoted.find('"').ok_or_else(|| format!("unterminated label value for {key}"))?;
            (quoted[..end].to_string(), &quoted[end + 1..])
        } else {
            let end = after.find(char::is_whitespace).unwrap_or(after.len());
            (after[..end].to_string(), &after[end..])
        };
        out.push((key, value));
        rest = remaining.trim_start();
    }
    Ok(out)
}

impl Stage {
    fn all(&self, keyword: &str) -> impl Iterator<Item = &Instruction> + '_ {
        let keyword = keyword.to_string();
        self.instructions.iter().filter(move |i| i.keyword == keyword)
    }
    fn args(&self) -> BTreeMap<String, Option<String>> {
        self.all("ARG").map(|i| split_arg(&i.args)).collect()
    }
    fn labels(&self) -> Result<BTreeMap<String, String>, String> {
        let mut out = BTreeMap::new();
        for i in self.all("LABEL") {
            out.extend(parse_labels(&i.args)?);
        }
        Ok(out)
    }
}

// ---------------------------------------------------------------- the lint

struct Expected<'a> {
    image: &'a MatrixImage,
    defaults: &'a Defaults,
    toolbox: bool,
}

impl Expected<'_> {
    fn tag(&self) -> String {
        format!("{}{}", self.image.tag, if self.toolbox { "-toolbox" } else { "" })
    }
}

/// An image reference is pinned when it has an explicit tag other than `latest`, or a digest.
fn image_ref_pinned(reference: &str) -> bool {
    if reference.contains("@sha256:") {
        return true;
    }
    let last = reference.rsplit('/').next().unwrap_or(reference);
    match last.split_once(':') {
        Some((_, tag)) => !tag.is_empty() && tag != "latest" && !tag.contains('$'),
        None => false,
    }
}

/// Source references that name a moving branch instead of a pinned version.
fn unpinned_refs(text: &str) -> Vec<String> {
    let patterns = [
        "--branch main",
        "--branch master",
        "-b main",
        "-b master",
        "@main",
        "@master",
        "/tree/main",
        "/tree/master",
        "/archive/main",
        "/archive/master",
        "refs/heads/",
        "/raw/main/",
        "/raw/master/",
        ":latest",
        "nightly-latest",
        "/latest/",
    ];
    let mut found: Vec<String> = patterns.iter().filter(|p| text.contains(*p)).map(|p| p.to_string()).collect();
    for line in text.lines().filter(|l| l.contains("git clone")) {
        if !text.contains("git checkout") && !text.contains("git -C") {
            found.push(format!("git clone without a pinned checkout: {}", line.trim()));
        }
    }
    found
}

fn lint_containerfile(text: &str, want: &Expected) -> Vec<String> {
    let mut errors = Vec::new();
    let file = match parse_containerfile(text) {
        Ok(f) => f,
        Err(e) => return vec![format!("parse: {e}")],
    };
    let tag = want.tag();
    let image = want.image;

    if file.stages.len() < 2 {
        errors.push(format!("not multi-stage: {} FROM", file.stages.len()));
    }
    // Bases: the build-arg default is the matrix base; every FROM resolves to a pinned ref.
    let base = file.global_args.get("BASE_IMAGE").cloned().flatten();
    if base.as_deref() != Some(image.base.as_str()) {
        errors.push(format!("ARG BASE_IMAGE default is {base:?}, matrix says {:?}", image.base));
    }
    let stage_names: Vec<String> = file.stages.iter().filter_map(|s| s.name.clone()).collect();
    for stage in &file.stages {
        let resolved = if stage.from == "${BASE_IMAGE}" { base.clone().unwrap_or_default() } else { stage.from.clone() };
        if stage_names.contains(&resolved) {
            continue; // FROM an earlier stage
        }
        if !resolved.starts_with("localhost/") && !image_ref_pinned(&resolved) {
            errors.push(format!("FROM {resolved:?} is not pinned to a tag or digest"));
        }
    }
    for bad in unpinned_refs(text) {
        errors.push(format!("unpinned reference: {bad}"));
    }

    let last = file.stages.last().expect("at least one stage");
    if want.toolbox && last.from != image.toolbox_base {
        errors.push(format!("toolbox stage FROM {:?}, matrix toolbox_base {:?}", last.from, image.toolbox_base));
    }

    // Versions: ROCm pinned by ARG in every stage that installs it; kernels built by the matrix clang.
    if image.kind == "rocm" {
        let mut saw_rocm_arg = false;
        for stage in &file.stages {
            if let Some(v) = stage.args().get("ROCM_VERSION") {
                saw_rocm_arg = true;
                if v.as_deref() != Some(image.rocm.as_str()) {
                    errors.push(format!("ARG ROCM_VERSION={v:?} in a stage, matrix rocm {:?}", image.rocm));
                }
            }
        }
        if !saw_rocm_arg {
            errors.push("no ARG ROCM_VERSION".into());
        }
        let gfx = image.gfx.join(" ");
        let make = format!("make kernels CLANG={} GFX=\"{gfx}\"", image.clang_path);
        if !file.stages.iter().flat_map(|s| s.all("RUN")).any(|r| r.args.contains(&make)) {
            errors.push(format!("no RUN compiling the kernels with `{make}`"));
        }
        // The build fails unless `make kernels` named its folder after the matrix's clang.
        let check = format!("test -f build/kernels/{}/compiler.txt", kernels_compiler_tag(image));
        if !file.stages.iter().flat_map(|s| s.all("RUN")).any(|r| r.args.contains(&make) && r.args.contains(&check)) {
            errors.push(format!("the kernels RUN does not check the compiler's build folder (`{check}`)"));
        }
    }

    // Labels of the final image.
    let labels = match last.labels() {
        Ok(l) => l,
        Err(e) => {
            errors.push(format!("LABEL: {e}"));
            BTreeMap::new()
        }
    };
    let none_if_empty = |s: &str| if s.is_empty() { "none".to_string() } else { s.to_string() };
    let want_labels = [
        ("civetta.image.tag", format!("civetta:{tag}")),
        ("org.opencontainers.image.ref.name", format!("civetta:{tag}")),
        ("civetta.rocm.version", none_if_empty(&image.rocm)),
        ("civetta.clang.version", none_if_empty(&image.clang)),
        ("civetta.kernels.compiler", kernels_compiler_tag(image)),
        ("civetta.backend", image.kind.clone()),
        ("org.opencontainers.image.revision", "${CIVETTA_REVISION}".to_string()),
        ("org.opencontainers.image.title", "civetta".to_string()),
    ];
    for (key, value) in want_labels {
        match labels.get(key) {
            Some(v) if *v == value => {}
            Some(v) => errors.push(format!("label {key}={v:?}, expected {value:?}")),
            None => errors.push(format!("label {key} missing")),
        }
    }
    for key in ["description", "source", "licenses", "version", "created", "base.name"] {
        let key = format!("org.opencontainers.image.{key}");
        if labels.get(&key).is_none_or(|v| v.is_empty()) {
            errors.push(format!("label {key} missing or empty"));
        }
    }
    let toolbox_label = labels.get("com.github.containers.toolbox").map(String::as_str);
    match (want.toolbox, toolbox_label) {
        (true, Some("true")) | (false, None) => {}
        (true, other) => errors.push(format!("toolbox variant needs com.github.containers.toolbox=\"true\", got {other:?}")),
        (false, Some(_)) => errors.push("com.github.containers.toolbox on a non-toolbox image".into()),
    }

    // The revision is a build arg with no default, validated as a full commit id.
    match last.args().get("CIVETTA_REVISION") {
        Some(None) => {}
        Some(Some(d)) => errors.push(format!("ARG CIVETTA_REVISION has a default {d:?}; it must be required")),
        None => errors.push("final stage lacks ARG CIVETTA_REVISION".into()),
    }
    if !last.all("RUN").any(|r| r.args.contains("CIVETTA_REVISION") && r.args.contains("-eq 40")) {
        errors.push("no RUN rejecting a CIVETTA_REVISION that is not a 40-hex commit id".into());
    }

    // image.json with the tag, read by `civetta env`.
    let json_written = last
        .all("RUN")
        .any(|r| r.args.contains(&format!("> {}", want.defaults.image_json)) && r.args.contains(&format!("\"tag\": \"civetta:{tag}\"")));
    if !json_written {
        errors.push(format!("final stage does not write {} with the tag", want.defaults.image_json));
    }

    // User: non-root for runtime images; toolbox images must leave USER alone (toolbox
    // enters as the host user).
    let final_user = last.all("USER").last().map(|i| i.args.clone());
    if want.toolbox {
        if final_user.is_some() {
            errors.push("toolbox variant sets USER; toolbox needs to start as root".into());
        }
    } else {
        match final_user.as_deref() {
            None => errors.push("no USER: the runtime image would run as root".into()),
            Some(u) if u == "root" || u == "0" || u.starts_with("0:") || u.starts_with("root:") => errors.push(format!("USER {u} is root")),
            Some(_) => {}
        }
        match last.all("HEALTHCHECK").last() {
            None => errors.push("no HEALTHCHECK in the runtime image".into()),
            Some(hc) => {
                // A probe script named by the HEALTHCHECK must be installed by this stage.
                let probe = hc.args.split('"').find(|w| w.starts_with("/usr/local/bin/"));
                if let Some(probe) = probe {
                    if !last.all("RUN").any(|r| r.args.contains(&format!("> {probe}"))) {
                        errors.push(format!("HEALTHCHECK runs {probe}, which no RUN of the final stage writes"));
                    }
                }
            }
        }
        let exposed: Vec<String> =
            last.all("EXPOSE").flat_map(|i| i.args.split_whitespace().map(str::to_string).collect::<Vec<_>>()).collect();
        for port in [want.defaults.grpc_port, want.defaults.metrics_port, want.defaults.http_port] {
            if !exposed.contains(&port.to_string()) {
                errors.push(format!("port {port} not in EXPOSE"));
            }
        }
        let cmd = last.all("CMD").last().map(|i| i.args.clone()).unwrap_or_default();
        for addr in [want.defaults.grpc_port, want.defaults.metrics_port, want.defaults.http_port].map(|p| format!("0.0.0.0:{p}")) {
            if !cmd.contains(&addr) {
                errors.push(format!("CMD does not listen on {addr}: {cmd}"));
            }
        }
    }
    errors
}

/// The build folder kernels/kernels.mk names after a clang: `clang-<version>` ("none" for cpu).
fn kernels_compiler_tag(image: &MatrixImage) -> String {
    if image.clang.is_empty() {
        "none".into()
    } else {
        format!("clang-{}", image.clang)
    }
}

fn containerfile_path(tag: &str) -> PathBuf {
    root().join(format!("containers/Containerfile.{tag}"))
}

fn expected_files(images: &[MatrixImage]) -> Vec<(MatrixImage, bool)> {
    let mut out = Vec::new();
    for image in images {
        out.push((image.clone(), false));
        if image.kind == "rocm" && !image.toolbox_base.is_empty() {
            out.push((image.clone(), true));
        }
    }
    out
}

// ---------------------------------------------------------------- tests over the real files

#[test]
fn matrix_has_the_required_images() {
    let (_, images) = load_matrix();
    let clang_majors: Vec<(String, String)> =
        images.iter().filter(|i| i.kind == "rocm").map(|i| (i.rocm.clone(), i.clang.split('.').next().unwrap_or("").to_string())).collect();
    let has =
        |rocm_prefix: &str, majors: &[&str]| clang_majors.iter().any(|(r, m)| r.starts_with(rocm_prefix) && majors.contains(&m.as_str()));
    assert!(has("6.4.", &["19"]), "need ROCm 6.4.x with clang 19: {clang_majors:?}");
    assert!(has("7.", &["20", "22"]), "need ROCm 7.x with clang 20 or 22: {clang_majors:?}");
    assert!(clang_majors.iter().any(|(_, m)| m == "23"), "need a nightly image with clang 23: {clang_majors:?}");
    assert!(images.iter().any(|i| i.tag == "cpu" && i.kind == "cpu"), "need the cpu image");
    for image in images.iter().filter(|i| i.kind == "rocm") {
        let major = image.clang.split('.').next().unwrap();
        assert_eq!(image.tag, format!("rocm-{}-clang{major}", image.rocm), "tag must name ROCm and clang");
        assert!(!image.gfx.is_empty() && image.gfx.contains(&"gfx1151".to_string()), "{}: gfx1151 missing", image.tag);
        assert!(!image.toolbox_base.is_empty(), "{}: every ROCm image needs a toolbox variant", image.tag);
    }
}

#[test]
fn every_containerfile_matches_the_matrix() {
    let (defaults, images) = load_matrix();
    let mut failures = Vec::new();
    for (image, toolbox) in expected_files(&images) {
        let want = Expected { image: &image, defaults: &defaults, toolbox };
        let path = containerfile_path(&want.tag());
        let Ok(text) = std::fs::read_to_string(&path) else {
            failures.push(format!("{}: missing (run scripts/containers-gen.py)", path.display()));
            continue;
        };
        for e in lint_containerfile(&text, &want) {
            failures.push(format!("{}: {e}", path.display()));
        }
    }
    assert!(failures.is_empty(), "Containerfile lint:\n{}", failures.join("\n"));
}

#[test]
fn no_containerfile_outside_the_matrix() {
    let (_, images) = load_matrix();
    let known: Vec<String> = expected_files(&images)
        .iter()
        .map(|(i, toolbox)| format!("Containerfile.{}{}", i.tag, if *toolbox { "-toolbox" } else { "" }))
        .collect();
    for entry in std::fs::read_dir(root().join("containers")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        if name.starts_with("Containerfile") {
            assert!(known.contains(&name), "containers/{name} is not an image of containers/matrix.toml");
        }
    }
}

#[test]
fn docs_show_gpu_device_flags_and_toolbox_commands() {
    let (_, images) = load_matrix();
    for doc in ["docs/DEPLOY.md", "docs/IMAGES.md", "containers/README.md"] {
        let text = read(&root().join(doc));
        for flag in ["--device /dev/kfd", "--device /dev/dri", "--group-add keep-groups"] {
            assert!(text.contains(flag), "{doc} does not show `{flag}`");
        }
    }
    let images_doc = read(&root().join("docs/IMAGES.md"));
    for image in &images {
        assert!(images_doc.contains(&image.tag), "docs/IMAGES.md does not list {}", image.tag);
    }
    for cmd in ["toolbox create", "distrobox create", "make image IMAGE=", "make images", "make image-cpu"] {
        assert!(images_doc.contains(cmd), "docs/IMAGES.md lacks `{cmd}`");
    }
    let deploy = read(&root().join("docs/DEPLOY.md"));
    for needle in ["amd_iommu=off", "iommu=pt", "amdgpu.gttsize", "ttm.pages_limit", "ttm.page_pool_size", "podman run"] {
        assert!(deploy.contains(needle), "docs/DEPLOY.md lacks {needle}");
    }
}

// ---------------------------------------------------------------- the lint catches mistakes

fn rocm_fixture() -> (Defaults, MatrixImage, String) {
    let (defaults, images) = load_matrix();
    let image = images.into_iter().find(|i| i.kind == "rocm").expect("a rocm image");
    let text = read(&containerfile_path(&image.tag));
    (defaults, image, text)
}

fn lint_mutated(from: &str, to: &str) -> Vec<String> {
    let (defaults, image, text) = rocm_fixture();
    assert!(text.contains(from), "fixture lacks {from:?}");
    let mutated = text.replacen(from, to, 1);
    lint_containerfile(&mutated, &Expected { image: &image, defaults: &defaults, toolbox: false })
}

fn assert_caught(errors: &[String], needle: &str) {
    assert!(errors.iter().any(|e| e.contains(needle)), "expected an error containing {needle:?}, got {errors:?}");
}

#[test]
fn lint_catches_root_user() {
    assert_caught(&lint_mutated("USER civetta", "USER root"), "is root");
    assert_caught(&lint_mutated("USER civetta", ""), "no USER");
}

#[test]
fn lint_catches_wrong_versions_and_tags() {
    let (_, image, _) = rocm_fixture();
    let bad_rocm = format!("ARG ROCM_VERSION={}", "9.9.9");
    assert_caught(&lint_mutated(&format!("ARG ROCM_VERSION={}", image.rocm), &bad_rocm), "ARG ROCM_VERSION");
    let clang_label = format!("civetta.clang.version=\"{}\"", image.clang);
    assert_caught(&lint_mutated(&clang_label, "civetta.clang.version=\"18.0.0\""), "civetta.clang.version");
    assert_caught(&lint_mutated(&format!("CLANG={}", image.clang_path), "CLANG=/usr/bin/clang"), "make kernels");
    let tag_label = format!("civetta.kernels.compiler=\"clang-{}\"", image.clang);
    assert_caught(&lint_mutated(&tag_label, "civetta.kernels.compiler=\"clang-22.1.8\""), "civetta.kernels.compiler");
    let check = format!("build/kernels/clang-{}/compiler.txt", image.clang);
    assert_caught(&lint_mutated(&check, "build/kernels/clang-22.1.8/compiler.txt"), "build folder");
}

#[test]
fn lint_catches_unpinned_sources() {
    let (_, image, _) = rocm_fixture();
    let base_arg = format!("ARG BASE_IMAGE={}", image.base);
    assert_caught(&lint_mutated(&base_arg, "ARG BASE_IMAGE=docker.io/library/ubuntu:latest"), "not pinned");
    assert_caught(&lint_mutated(&base_arg, "ARG BASE_IMAGE=docker.io/library/ubuntu"), "not pinned");
    assert_caught(&lint_mutated("WORKDIR /src", "RUN git clone --branch main https://example.invalid/x.git\nWORKDIR /src"), "unpinned");
    assert_caught(
        &lint_mutated("ARG CIVETTA_REVISION\nARG CIVETTA_VERSION", "ARG CIVETTA_REVISION=main\nARG CIVETTA_VERSION"),
        "must be required",
    );
}

#[test]
fn lint_catches_missing_labels_probe_and_image_json() {
    assert_caught(
        &lint_mutated("org.opencontainers.image.revision=\"${CIVETTA_REVISION}\"", "org.opencontainers.image.revision=\"HEAD\""),
        "org.opencontainers.image.revision",
    );
    assert_caught(&lint_mutated("HEALTHCHECK", "# HEALTHCHECK"), "HEALTHCHECK");
    assert_caught(&lint_mutated("> /usr/local/bin/civetta-healthcheck", "> /tmp/probe"), "no RUN of the final stage writes");
    assert_caught(&lint_mutated("> /etc/civetta/image.json", "> /tmp/x.json"), "image.json");
    assert_caught(&lint_mutated("EXPOSE 50051 9464 8080", "EXPOSE 50051 9464"), "port 8080");
}

#[test]
fn lint_checks_toolbox_variants() {
    let (defaults, images) = load_matrix();
    let image = images.iter().find(|i| i.kind == "rocm").unwrap();
    let text = read(&containerfile_path(&format!("{}-toolbox", image.tag)));
    let want = Expected { image, defaults: &defaults, toolbox: true };
    assert!(lint_containerfile(&text, &want).is_empty());
    let no_label = text.replace("com.github.containers.toolbox=\"true\"", "x.y=\"z\"");
    assert_caught(&lint_containerfile(&no_label, &want), "com.github.containers.toolbox");
    let with_user = format!("{text}USER civetta\n");
    assert_caught(&lint_containerfile(&with_user, &want), "sets USER");
}

#[test]
fn parser_handles_continuations_and_quoted_labels() {
    let file = parse_containerfile(
        "ARG B=x:1\nFROM ${B} AS a\n# comment\nRUN a \\\n  # inner comment\n  && b\nFROM a\nLABEL k=\"v w\" \\\n  j=plain\n",
    )
    .unwrap();
    assert_eq!(file.stages.len(), 2);
    let run = &file.stages[0].instructions[0].args;
    assert!(run.starts_with("a ") && run.ends_with("&& b") && !run.contains("comment"), "{run:?}");
    let labels = file.stages[1].labels().unwrap();
    assert_eq!(labels["k"], "v w");
    assert_eq!(labels["j"], "plain");
    assert!(parse_containerfile("RUN x\n").is_err());
    assert!(parse_containerfile("FROM a \\\n").is_err());
}
