//! Configuration of the daemon, layered with figment. Later layers win:
//!
//! 1. built-in defaults ([`Config::default`]),
//! 2. `/etc/civetta/civetta.toml` (if present),
//! 3. `./civetta.toml` (if present), or the file given with `--config` (must exist),
//! 4. `CIVETTA_<SECTION>__<KEY>` environment variables, e.g. `CIVETTA_SERVER__GRPC_ADDR`,
//!    `CIVETTA_ENGINE__KERNEL_TIMING__SAMPLE_RATE` (only the sections below; other
//!    `CIVETTA_*` variables such as `CIVETTA_LOG` or `CIVETTA_KERNEL_DIR` are not config),
//! 5. command-line flags.
//!
//! Unknown keys and bad values are errors that name the key and where it came from.

use crate::engine::EngineConfig;
use anyhow::{bail, Context};
use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The system-wide config file.
pub const SYSTEM_CONFIG: &str = "/etc/civetta/civetta.toml";
/// The config file picked up from the working directory.
pub const LOCAL_CONFIG: &str = "civetta.toml";
/// The config sections; `CIVETTA_<SECTION>__...` variables are read for these only.
pub const SECTIONS: [&str; 4] = ["server", "model", "engine", "log"];

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// gRPC listen address; port 0 picks a free port (the bound address is printed).
    pub grpc_addr: String,
    /// Prometheus `/metrics` listen address.
    pub metrics_addr: String,
    /// OpenAI-compatible HTTP API listen address; empty disables it.
    pub http_addr: String,
    /// Largest accepted gRPC request message in bytes.
    pub max_message_bytes: usize,
    /// File holding a bearer token; when set, every RPC except health checks needs it.
    pub auth_token_file: Option<PathBuf>,
    /// Name of an environment variable holding the bearer token (alternative to the file).
    pub auth_token_env: Option<String>,
    /// Seconds in-flight streams may run on after SIGTERM/SIGINT before they are cancelled.
    pub shutdown_grace_seconds: f64,
    /// Longest an HTTP API generation may run, in seconds, from the request's arrival
    /// (0 = no limit); past it the generation is cancelled and the client gets 504 (an SSE
    /// error event when streaming). A request's own `timeout` may only shorten it.
    #[serde(default)]
    pub http_request_timeout_seconds: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The GGUF file to serve.
    pub path: PathBuf,
    /// Name clients may put in `GenerateRequest.model`; empty: the model's own name.
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// "human" or "json".
    pub format: String,
    /// tracing EnvFilter directive, e.g. "info" or "civetta=debug,warn". The `CIVETTA_LOG`
    /// environment variable, when set, replaces it (a shorthand for quick debugging).
    pub filter: String,
}

/// The whole configuration. `engine.model_path` is not a setting of its own: the model
/// comes from `model.path` (see [`Config::engine_config`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub model: ModelConfig,
    pub engine: EngineConfig,
    pub log: LogConfig,
}

/// Upper bound on `server.max_message_bytes` (a request is a prompt, not a file upload).
const MAX_MESSAGE_BYTES_LIMIT: usize = 256 << 20;

impl Default for Config {
    fn default() -> Self {
        let engine = EngineConfig::default();
        Config {
            server: ServerConfig {
                grpc_addr: "127.0.0.1:50051".into(),
                metrics_addr: "127.0.0.1:9464".into(),
                http_addr: "127.0.0.1:8080".into(),
                max_message_bytes: 4 << 20,
                auth_token_file: None,
                auth_token_env: None,
                shutdown_grace_seconds: 10.0,
                http_request_timeout_seconds: 0.0,
            },
            model: ModelConfig { path: engine.model_path.clone(), name: String::new() },
            engine,
            log: LogConfig { format: "human".into(), filter: "info".into() },
        }
    }
}

/// Builds the layered figment. `overrides` are dotted keys from command-line flags,
/// e.g. `("server.grpc_addr", json!("127.0.0.1:0"))`.
pub fn figment(config_file: Option<&Path>, overrides: &[(&str, serde_json::Value)]) -> Figment {
    let mut f = Figment::from(Serialized::defaults(Config::default())).merge(Toml::file(SYSTEM_CONFIG));
    f = match config_file {
        Some(p) => f.merge(Toml::file_exact(p)),
        None => f.merge(Toml::file(LOCAL_CONFIG)),
    };
    let env = Env::prefixed("CIVETTA_")
        .filter(|k| {
            SECTIONS.iter().any(|s| k.as_str().len() > s.len() + 2 && k.as_str()[..s.len() + 2].eq_ignore_ascii_case(&format!("{s}__")))
        })
        .split("__");
    f = f.merge(env);
    for (k, v) in overrides {
        f = f.merge(Serialized::global(k, v.clone()));
    }
    f
}

/// Loads and validates the configuration.
pub fn load(config_file: Option<&Path>, overrides: &[(&str, serde_json::Value)]) -> anyhow::Result<Config> {
    if let Some(p) = config_file {
        anyhow::ensure!(p.is_file(), "config file {} does not exist", p.display());
    }
    let f = figment(config_file, overrides);
    // serde's deny_unknown_fields does not reach into EngineConfig (another module's type),
    // so unknown keys are found by comparing against the defaults' shape.
    let raw: serde_json::Value = f.extract().context("invalid configuration")?;
    let known = serde_json::to_value(Config::default()).expect("defaults serialize");
    let mut unknown = Vec::new();
    unknown_keys(&raw, &known, "", &mut unknown);
    if let Some(key) = unknown.first() {
        let origin = match f.find_metadata(key) {
            Some(m) => match &m.source {
                Some(src) => format!(" (from {} {src})", m.name),
                None => format!(" (from {})", m.name),
            },
            None => String::new(),
        };
        bail!("invalid configuration: unknown setting `{key}`{origin}");
    }
    let cfg: Config = f.extract().context("invalid configuration")?;
    if cfg.engine.model_path != EngineConfig::default().model_path {
        bail!("invalid configuration: `engine.model_path` is not a setting; use `model.path` (or --model)");
    }
    cfg.validate()?;
    Ok(cfg)
}

/// Dotted keys present in `actual` but not in `known` (recursing into tables).
fn unknown_keys(actual: &serde_json::Value, known: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
    let (Some(a), Some(k)) = (actual.as_object(), known.as_object()) else { return };
    for (key, value) in a {
        let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
        match k.get(key) {
            None => out.push(path),
            Some(kv) => unknown_keys(value, kv, &path, out),
        }
    }
}

impl Config {
    /// The engine configuration with the model path filled in from `model.path`.
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig { model_path: self.model.path.clone(), ..self.engine.clone() }
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        let s = &self.server;
        let grpc = parse_addr("server.grpc_addr", &s.grpc_addr)?;
        let metrics = parse_addr("server.metrics_addr", &s.metrics_addr)?;
        if grpc == metrics && grpc.port() != 0 {
            bail!("server.grpc_addr and server.metrics_addr are both {grpc}; they need different ports");
        }
        if !s.http_addr.is_empty() {
            let http = parse_addr("server.http_addr", &s.http_addr)?;
            for (name, other) in [("server.grpc_addr", grpc), ("server.metrics_addr", metrics)] {
                if http == other && http.port() != 0 {
                    bail!("server.http_addr and {name} are both {http}; they need different ports");
                }
            }
        }
        if !(1024..=MAX_MESSAGE_BYTES_LIMIT).contains(&s.max_message_bytes) {
            bail!("server.max_message_bytes must be between 1024 and {MAX_MESSAGE_BYTES_LIMIT}, got {}", s.max_message_bytes);
        }
        if s.auth_token_file.is_some() && s.auth_token_env.is_some() {
            bail!("set only one of server.auth_token_file and server.auth_token_env");
        }
        if !(s.shutdown_grace_seconds.is_finite() && s.shutdown_grace_seconds >= 0.0) {
            bail!("server.shutdown_grace_seconds must be a number >= 0, got {}", s.shutdown_grace_seconds);
        }
        if !(s.http_request_timeout_seconds.is_finite() && s.http_request_timeout_seconds >= 0.0) {
            bail!("server.http_request_timeout_seconds must be a number >= 0 (0 = no limit), got {}", s.http_request_timeout_seconds);
        }
        if self.model.path.as_os_str().is_empty() {
            bail!("model.path is empty; give the GGUF file to serve (--model FILE)");
        }
        if !["human", "json"].contains(&self.log.format.as_str()) {
            bail!("log.format must be \"human\" or \"json\", got {:?}", self.log.format);
        }
        tracing_subscriber::EnvFilter::try_new(&self.log.filter)
            .map_err(|e| anyhow::anyhow!("log.filter {:?} is not a valid filter: {e}", self.log.filter))?;
        let e = &self.engine;
        if e.max_active_sequences == 0 {
            bail!("engine.max_active_sequences must be at least 1");
        }
        if let Some(s) = e.max_decode_slowdown.filter(|&s| !(s == 0.0 || (s.is_finite() && s >= 1.0))) {
            bail!("engine.max_decode_slowdown must be 0 (off) or a factor >= 1, got {s}");
        }
        if e.min_prefill_chunk == 0 {
            bail!("engine.min_prefill_chunk must be at least 1");
        }
        if let Some(rate) = e.kernel_timing.sample_rate.filter(|r| !(*r > 0.0 && *r <= 1.0)) {
            bail!("engine.kernel_timing.sample_rate must be in (0, 1], got {rate}");
        }
        Ok(())
    }
}

fn parse_addr(name: &str, addr: &str) -> anyhow::Result<SocketAddr> {
    addr.parse::<SocketAddr>().with_context(|| format!("{name} = {addr:?} is not an address like 127.0.0.1:50051"))
}

#[cfg(test)]
#[allow(clippy::result_large_err)] // figment::Jail's closures return figment::Error
mod tests {
    use super::*;
    use serde_json::json;

    fn err(r: anyhow::Result<Config>) -> String {
        format!("{:#}", r.expect_err("expected a configuration error"))
    }

    #[test]
    fn each_layer_overrides_the_one_before() {
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            // Defaults.
            let c = load(None, &[]).unwrap();
            assert_eq!(c.server.grpc_addr, "127.0.0.1:50051");
            assert_eq!(c.model.path, PathBuf::from("models/default.gguf"));
            // ./civetta.toml over defaults; untouched keys keep their defaults.
            jail.create_file("civetta.toml", "[server]\ngrpc_addr = \"127.0.0.1:1111\"\nmetrics_addr = \"127.0.0.1:2222\"\n[model]\npath = \"a.gguf\"\n[engine]\nthreads = 3\n")?;
            let c = load(None, &[]).unwrap();
            assert_eq!((c.server.grpc_addr.as_str(), c.server.metrics_addr.as_str()), ("127.0.0.1:1111", "127.0.0.1:2222"));
            assert_eq!(c.engine.threads, 3);
            assert_eq!(c.engine.max_queue, EngineConfig::default().max_queue);
            assert_eq!(c.engine_config().model_path, PathBuf::from("a.gguf"));
            // Environment over the file, nested keys with `__`.
            jail.set_env("CIVETTA_SERVER__METRICS_ADDR", "127.0.0.1:3333");
            jail.set_env("CIVETTA_ENGINE__THREADS", "5");
            jail.set_env("CIVETTA_ENGINE__KERNEL_TIMING__SAMPLE_RATE", "0.25");
            let c = load(None, &[]).unwrap();
            assert_eq!(c.server.metrics_addr, "127.0.0.1:3333");
            assert_eq!(c.server.grpc_addr, "127.0.0.1:1111");
            assert_eq!(c.engine.threads, 5);
            assert_eq!(c.engine.kernel_timing.sample_rate, Some(0.25));
            // Flags over everything.
            let c = load(None, &[("engine.threads", json!(7)), ("model.path", json!("b.gguf"))]).unwrap();
            assert_eq!(c.engine.threads, 7);
            assert_eq!(c.engine_config().model_path, PathBuf::from("b.gguf"));
            Ok(())
        });
    }

    #[test]
    fn explicit_config_file_replaces_the_local_one() {
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("civetta.toml", "[engine]\nthreads = 3\n")?;
            jail.create_file("other.toml", "[engine]\nmax_queue = 9\n")?;
            let c = load(Some(Path::new("other.toml")), &[]).unwrap();
            assert_eq!(c.engine.max_queue, 9);
            assert_eq!(c.engine.threads, EngineConfig::default().threads, "./civetta.toml must not be read with --config");
            let e = err(load(Some(Path::new("missing.toml")), &[]));
            assert!(e.contains("missing.toml") && e.contains("does not exist"), "{e}");
            Ok(())
        });
    }

    #[test]
    fn unrelated_civetta_variables_are_not_config() {
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("CIVETTA_LOG", "debug");
            jail.set_env("CIVETTA_KERNEL_DIR", "/usr/share/civetta/kernels");
            jail.set_env("CIVETTA_TOKEN", "secret");
            let c = load(None, &[]).unwrap();
            assert_eq!(c.log.filter, "info");
            jail.set_env("CIVETTA_LOG__FILTER", "warn");
            assert_eq!(load(None, &[]).unwrap().log.filter, "warn");
            Ok(())
        });
    }

    #[test]
    fn bad_values_are_clear_errors() {
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            let cases: &[(&str, &[&str])] = &[
                ("[server]\ngrpc_addr = \"not-an-address\"\n", &["server.grpc_addr", "not-an-address"]),
                ("[server]\ngrpc_adr = \"127.0.0.1:1\"\n", &["grpc_adr"]),
                ("[engine]\nthread = 3\n", &["engine.thread", "civetta.toml"]),
                ("[engine]\nthreads = \"many\"\n", &["engine.threads", "many"]),
                ("[engine]\nmodel_path = \"x.gguf\"\n", &["model.path"]),
                ("[engine.kernel_timing]\nsample_rate = 1.5\n", &["sample_rate", "1.5"]),
                ("[engine]\nmax_active_sequences = 0\n", &["max_active_sequences"]),
                ("[engine]\nmax_decode_slowdown = 0.5\n", &["engine.max_decode_slowdown", "0.5"]),
                ("[engine]\nmin_prefill_chunk = 0\n", &["engine.min_prefill_chunk"]),
                ("[server]\ngrpc_addr = \"127.0.0.1:7000\"\nmetrics_addr = \"127.0.0.1:7000\"\n", &["different ports"]),
                ("[server]\ngrpc_addr = \"127.0.0.1:7000\"\nhttp_addr = \"127.0.0.1:7000\"\n", &["server.http_addr", "different ports"]),
                ("[server]\nhttp_addr = \"8080\"\n", &["server.http_addr"]),
                ("[server]\nmax_message_bytes = 10\n", &["max_message_bytes"]),
                ("[server]\nauth_token_file = \"t\"\nauth_token_env = \"T\"\n", &["only one"]),
                ("[server]\nshutdown_grace_seconds = -1.0\n", &["shutdown_grace_seconds"]),
                ("[server]\nhttp_request_timeout_seconds = -1.0\n", &["http_request_timeout_seconds"]),
                ("[model]\npath = \"\"\n", &["model.path"]),
                ("[log]\nformat = \"xml\"\n", &["log.format", "xml"]),
                ("[log]\nfilter = \"civetta=loud\"\n", &["log.filter"]),
                ("[server\n", &["civetta.toml"]),
            ];
            for (toml, phrases) in cases {
                jail.create_file("civetta.toml", toml)?;
                let e = err(load(None, &[]));
                for p in *phrases {
                    assert!(e.contains(p), "config {toml:?}: expected {p:?} in error {e:?}");
                }
            }
            jail.create_file("civetta.toml", "")?;
            jail.set_env("CIVETTA_ENGINE__MAX_QUEUE", "-3");
            let e = err(load(None, &[]));
            assert!(e.to_lowercase().contains("engine.max_queue") && e.contains("CIVETTA_"), "{e}");
            Ok(())
        });
    }

    #[test]
    fn default_binds_loopback_and_is_valid() {
        let c = Config::default();
        c.validate().unwrap();
        for a in [&c.server.grpc_addr, &c.server.metrics_addr, &c.server.http_addr] {
            assert!(a.parse::<SocketAddr>().unwrap().ip().is_loopback(), "{a}");
        }
    }
}
