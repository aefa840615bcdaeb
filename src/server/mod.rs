//! The daemon: gRPC service (tonic) with health and reflection, the Prometheus endpoint
//! (axum, own port), bearer-token auth, graceful shutdown.

pub mod grpc;
pub mod metrics;

use crate::config;
use crate::engine::Engine;
use anyhow::Context;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args, Debug, Default)]
pub struct ServeArgs {
    /// Config file (default: ./civetta.toml if present).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// GGUF model to serve.
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// gRPC listen address (port 0 picks a free port; the bound address is printed).
    #[arg(long)]
    pub grpc_addr: Option<String>,
    /// Prometheus /metrics listen address.
    #[arg(long)]
    pub metrics_addr: Option<String>,
    #[arg(short, long)]
    pub threads: Option<usize>,
    #[arg(long)]
    pub max_active: Option<usize>,
    #[arg(long)]
    pub max_queue: Option<usize>,
    #[arg(long)]
    pub context: Option<usize>,
    /// "human" or "json".
    #[arg(long)]
    pub log_format: Option<String>,
    #[arg(long)]
    pub auth_token_file: Option<PathBuf>,
}

pub fn init_logging(format: &str, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CIVETTA_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = if format == "json" { b.json().try_init() } else { b.try_init() };
}

fn overrides(a: &ServeArgs) -> Vec<(&'static str, serde_json::Value)> {
    use serde_json::json;
    let mut o = Vec::new();
    if let Some(v) = &a.model {
        o.push(("engine.model_path", json!(v)));
    }
    if let Some(v) = &a.grpc_addr {
        o.push(("server.grpc_addr", json!(v)));
    }
    if let Some(v) = &a.metrics_addr {
        o.push(("server.metrics_addr", json!(v)));
    }
    if let Some(v) = a.threads {
        o.push(("engine.threads", json!(v)));
    }
    if let Some(v) = a.max_active {
        o.push(("engine.max_active_sequences", json!(v)));
    }
    if let Some(v) = a.max_queue {
        o.push(("engine.max_queue", json!(v)));
    }
    if let Some(v) = a.context {
        o.push(("engine.context_length", json!(v)));
    }
    if let Some(v) = &a.log_format {
        o.push(("log.format", json!(v)));
    }
    if let Some(v) = &a.auth_token_file {
        o.push(("server.auth_token_file", json!(v)));
    }
    o
}

fn read_token(cfg: &config::ServerConfig) -> anyhow::Result<Option<Arc<Vec<u8>>>> {
    if let Some(p) = &cfg.auth_token_file {
        let t = std::fs::read_to_string(p).with_context(|| format!("reading the auth token file {}", p.display()))?;
        let t = t.trim().to_string();
        anyhow::ensure!(!t.is_empty(), "the auth token file {} is empty", p.display());
        return Ok(Some(Arc::new(t.into_bytes())));
    }
    if let Some(var) = &cfg.auth_token_env {
        let t = std::env::var(var).with_context(|| format!("server.auth_token_env names {var}, which is not set"))?;
        anyhow::ensure!(!t.trim().is_empty(), "the auth token in {var} is empty");
        return Ok(Some(Arc::new(t.trim().as_bytes().to_vec())));
    }
    Ok(None)
}

/// Runs the daemon until SIGINT/SIGTERM.
pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let cfg = config::load(args.config.as_deref(), &overrides(&args))?;
    init_logging(&cfg.log.format, &cfg.log.filter);
    let token = read_token(&cfg.server)?;
    let engine = Engine::load(cfg.engine.clone())?;
    let fingerprint = Arc::new(crate::envinfo::collect(&crate::envinfo::CollectOptions::system(engine.model_info().backend.clone())));
    let metrics = Arc::new(metrics::Metrics::new(&engine, &fingerprint).context("registering metrics")?);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(run(cfg, engine, metrics, fingerprint, token))
}

async fn run(
    cfg: config::Config,
    engine: Engine,
    metrics: Arc<metrics::Metrics>,
    fingerprint: Arc<crate::envinfo::Fingerprint>,
    token: Option<Arc<Vec<u8>>>,
) -> anyhow::Result<()> {
    use crate::proto::inference_server::InferenceServer;
    let grpc_listener = tokio::net::TcpListener::bind(&cfg.server.grpc_addr).await.with_context(|| format!("binding gRPC to {}", cfg.server.grpc_addr))?;
    let metrics_listener =
        tokio::net::TcpListener::bind(&cfg.server.metrics_addr).await.with_context(|| format!("binding metrics to {}", cfg.server.metrics_addr))?;
    let grpc_addr = grpc_listener.local_addr()?;
    let metrics_addr = metrics_listener.local_addr()?;

    let model_name = if cfg.server.model_name.is_empty() { engine.model_info().name.clone() } else { cfg.server.model_name.clone() };
    let svc = grpc::InferenceService { engine: engine.clone(), metrics: metrics.clone(), model_name, fingerprint };
    let (mut health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<InferenceServer<grpc::InferenceService>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building gRPC reflection")?;
    let inference = InferenceServer::new(svc).max_decoding_message_size(cfg.server.max_message_bytes);
    let inference = tonic::service::interceptor::InterceptedService::new(inference, grpc::auth_interceptor(token));

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let metrics_app = {
        let (engine, metrics) = (engine.clone(), metrics.clone());
        axum::Router::new()
            .route(
                "/metrics",
                axum::routing::get(move || {
                    let (engine, metrics) = (engine.clone(), metrics.clone());
                    async move { ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], metrics.render(&engine)) }
                }),
            )
            .route("/healthz", axum::routing::get(|| async { "ok\n" }))
    };
    let mut metrics_stop = stop_rx.clone();
    let metrics_task = tokio::spawn(async move {
        axum::serve(metrics_listener, metrics_app)
            .with_graceful_shutdown(async move {
                let _ = metrics_stop.wait_for(|s| *s).await;
            })
            .await
    });

    eprintln!("civetta: listening grpc={grpc_addr} metrics={metrics_addr}");
    tracing::info!(%grpc_addr, %metrics_addr, model = %engine.model_info().path.display(), backend = %engine.model_info().backend, "serving");

    let grace = std::time::Duration::from_secs_f64(cfg.server.shutdown_grace_seconds);
    let signal_engine = engine.clone();
    let shutdown = async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested: health NOT_SERVING, no new connections, {:.1} s grace for in-flight streams", grace.as_secs_f64());
        health_reporter.set_not_serving::<InferenceServer<grpc::InferenceService>>().await;
        health_reporter.set_service_status("", tonic_health::ServingStatus::NotServing).await;
        let _ = stop_tx.send(true);
        // After the grace period, cancel what is still running so the server can finish.
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            tokio::task::spawn_blocking(move || signal_engine.shutdown()).await.ok();
        });
    };
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(inference)
        .serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(grpc_listener), shutdown)
        .await
        .context("gRPC server")?;
    let _ = metrics_task.await;
    tokio::task::spawn_blocking(move || engine.shutdown()).await.ok();
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
