//! Configuration: defaults < /etc/civetta/civetta.toml < ./civetta.toml (or --config FILE)
//! < CIVETTA_* environment (nested with `__`, e.g. CIVETTA_SERVER__GRPC_ADDR) < CLI flags.

use crate::engine::EngineConfig;
use anyhow::Context;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    pub grpc_addr: String,
    pub metrics_addr: String,
    /// Name clients may put in `GenerateRequest.model` (empty: the file stem).
    pub model_name: String,
    /// Largest accepted gRPC message.
    pub max_message_bytes: usize,
    /// Bearer token file; when set (or auth_token_env is), every RPC but health needs it.
    pub auth_token_file: Option<PathBuf>,
    /// Name of an environment variable holding the bearer token.
    pub auth_token_env: Option<String>,
    /// Seconds in-flight streams may finish after SIGTERM before they are cancelled.
    pub shutdown_grace_seconds: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// "human" or "json".
    pub format: String,
    /// tracing EnvFilter directive, e.g. "info" or "civetta=debug".
    pub filter: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub engine: EngineConfig,
    pub log: LogConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            server: ServerConfig {
                grpc_addr: "127.0.0.1:50051".into(),
                metrics_addr: "127.0.0.1:9464".into(),
                model_name: String::new(),
                max_message_bytes: 4 << 20,
                auth_token_file: None,
                auth_token_env: None,
                shutdown_grace_seconds: 10.0,
            },
            engine: EngineConfig::default(),
            log: LogConfig { format: "human".into(), filter: "info".into() },
        }
    }
}

/// Builds the layered figment. `overrides` are dotted keys from CLI flags.
pub fn figment(config_file: Option<&Path>, overrides: &[(&str, serde_json::Value)]) -> Figment {
    let mut f = Figment::from(Serialized::defaults(Config::default())).merge(Toml::file("/etc/civetta/civetta.toml"));
    f = match config_file {
        Some(p) => f.merge(Toml::file_exact(p)),
        None => f.merge(Toml::file("civetta.toml")),
    };
    f = f.merge(Env::prefixed("CIVETTA_").split("__"));
    for (k, v) in overrides {
        f = f.merge(Serialized::global(k, v.clone()));
    }
    f
}

pub fn load(config_file: Option<&Path>, overrides: &[(&str, serde_json::Value)]) -> anyhow::Result<Config> {
    let cfg: Config = figment(config_file, overrides).extract().context("invalid configuration")?;
    cfg.validate()?;
    Ok(cfg)
}

impl Config {
    pub fn validate(&self) -> anyhow::Result<()> {
        for (name, addr) in [("server.grpc_addr", &self.server.grpc_addr), ("server.metrics_addr", &self.server.metrics_addr)] {
            addr.parse::<std::net::SocketAddr>().with_context(|| format!("{name} = {addr:?} is not an address like 127.0.0.1:50051"))?;
        }
        if !["human", "json"].contains(&self.log.format.as_str()) {
            anyhow::bail!("log.format must be \"human\" or \"json\", got {:?}", self.log.format);
        }
        let e = &self.engine;
        if e.max_active_sequences == 0 || e.prefill_batch == 0 {
            anyhow::bail!("engine.max_active_sequences and engine.prefill_batch must be at least 1");
        }
        if !(e.kernel_timing.sample_rate > 0.0 && e.kernel_timing.sample_rate <= 1.0) {
            anyhow::bail!("engine.kernel_timing.sample_rate must be in (0, 1]");
        }
        if self.server.shutdown_grace_seconds < 0.0 {
            anyhow::bail!("server.shutdown_grace_seconds must be >= 0");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_defaults_file_env_flags() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("civetta.toml", "[server]\ngrpc_addr = \"127.0.0.1:1111\"\nmetrics_addr = \"127.0.0.1:2222\"\n[engine]\nthreads = 3\n")?;
            let c = load(None, &[]).unwrap();
            assert_eq!(c.server.grpc_addr, "127.0.0.1:1111");
            assert_eq!(c.engine.threads, 3);
            assert_eq!(c.engine.max_queue, EngineConfig::default().max_queue);
            jail.set_env("CIVETTA_SERVER__METRICS_ADDR", "127.0.0.1:3333");
            jail.set_env("CIVETTA_ENGINE__THREADS", "5");
            let c = load(None, &[]).unwrap();
            assert_eq!(c.server.metrics_addr, "127.0.0.1:3333");
            assert_eq!(c.engine.threads, 5);
            let c = load(None, &[("engine.threads", serde_json::json!(7))]).unwrap();
            assert_eq!(c.engine.threads, 7);
            Ok(())
        });
    }

    #[test]
    fn bad_values_are_clear_errors() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("civetta.toml", "[server]\ngrpc_addr = \"not-an-address\"\n")?;
            let e = format!("{:#}", load(None, &[]).unwrap_err());
            assert!(e.contains("server.grpc_addr"), "{e}");
            jail.create_file("civetta.toml", "[server]\ngrpc_adr = \"127.0.0.1:1\"\n")?;
            let e = format!("{:#}", load(None, &[]).unwrap_err());
            assert!(e.contains("grpc_adr"), "{e}");
            Ok(())
        });
    }

    #[test]
    fn default_binds_loopback() {
        let c = Config::default();
        assert!(c.server.grpc_addr.starts_with("127.0.0.1:") && c.server.metrics_addr.starts_with("127.0.0.1:"));
    }
}
