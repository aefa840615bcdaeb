//! The daemon: the gRPC service (tonic) with health and reflection, the OpenAI-compatible
//! HTTP API (axum, [`http`]), the Prometheus
//! endpoint (axum, its own port), bearer-token auth, graceful shutdown.
//!
//! `civetta serve` = [`serve`]: load config -> load the engine (errors here are user
//! errors: one line, exit 2) -> bind both ports -> print
//! `civetta: listening grpc=ADDR metrics=ADDR http=ADDR|off` on stderr -> serve until SIGTERM/SIGINT.

// tonic::Status is large, and it is the error type of every RPC.
#![allow(clippy::result_large_err)]

pub mod auth;
pub mod convert;
pub mod grpc;
pub mod health;
pub mod http;
pub mod lifecycle;
pub mod metrics;
pub mod tokenize_pool;
pub mod transport_status;

use crate::config;
use crate::engine::Engine;
use anyhow::Context;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How long after the grace period open connections are closed regardless.
const FORCE_CLOSE_AFTER_GRACE: Duration = Duration::from_secs(2);

/// The gRPC service name clients and health checks use.
pub const SERVICE_NAME: &str = "civetta.v1.Inference";

#[derive(clap::Args, Debug, Default)]
pub struct ServeArgs {
    /// Config file (default: /etc/civetta/civetta.toml and ./civetta.toml when present).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// GGUF model to serve (config: model.path).
    #[arg(short, long, value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// gRPC listen address; port 0 picks a free port (the bound address is printed).
    #[arg(long, value_name = "ADDR")]
    pub grpc_addr: Option<String>,
    /// Prometheus /metrics listen address; port 0 picks a free port.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,
    /// OpenAI-compatible HTTP API listen address; port 0 picks a free port, "" disables it.
    #[arg(long, value_name = "ADDR")]
    pub http_addr: Option<String>,
    /// CPU threads (0 = one per physical core).
    #[arg(short, long)]
    pub threads: Option<usize>,
    /// Sequences decoded concurrently.
    #[arg(long)]
    pub max_active: Option<usize>,
    /// Requests that may wait for a slot; beyond that RESOURCE_EXHAUSTED.
    #[arg(long)]
    pub max_queue: Option<usize>,
    /// Cap on the context length in tokens.
    #[arg(long)]
    pub context: Option<usize>,
    /// Log format: human or json.
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// File with a bearer token that clients must send (`authorization: Bearer ...`).
    #[arg(long, value_name = "FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Seconds in-flight streams may finish after SIGTERM before they are cancelled.
    #[arg(long, value_name = "SECONDS")]
    pub shutdown_grace: Option<f64>,
    /// Longest an HTTP API generation may run (0 = no limit); past it: 504.
    #[arg(long, value_name = "SECONDS")]
    pub http_request_timeout: Option<f64>,
}

impl ServeArgs {
    /// The flags that were given, as dotted config keys (the last config layer).
    pub fn overrides(&self) -> Vec<(&'static str, serde_json::Value)> {
        use serde_json::json;
        let mut o = Vec::new();
        let mut put = |key, v: Option<serde_json::Value>| {
            if let Some(v) = v {
                o.push((key, v));
            }
        };
        put("model.path", self.model.as_ref().map(|v| json!(v)));
        put("server.grpc_addr", self.grpc_addr.as_ref().map(|v| json!(v)));
        put("server.metrics_addr", self.metrics_addr.as_ref().map(|v| json!(v)));
        put("server.http_addr", self.http_addr.as_ref().map(|v| json!(v)));
        put("engine.threads", self.threads.map(|v| json!(v)));
        put("engine.max_active_sequences", self.max_active.map(|v| json!(v)));
        put("engine.max_queue", self.max_queue.map(|v| json!(v)));
        put("engine.context_length", self.context.map(|v| json!(v)));
        put("log.format", self.log_format.as_ref().map(|v| json!(v)));
        put("server.auth_token_file", self.auth_token_file.as_ref().map(|v| json!(v)));
        put("server.shutdown_grace_seconds", self.shutdown_grace.map(|v| json!(v)));
        put("server.http_request_timeout_seconds", self.http_request_timeout.map(|v| json!(v)));
        o
    }
}

/// Installs the tracing subscriber on stderr. `CIVETTA_LOG`, when set, replaces `filter`.
pub fn init_logging(format: &str, filter: &str) {
    let filter = std::env::var("CIVETTA_LOG")
        .ok()
        .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(filter));
    // Colour codes only on a terminal: in files, journald and log collectors they are noise.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = if format == "json" { b.json().try_init() } else { b.try_init() };
}

/// Runs the daemon until SIGINT/SIGTERM. Configuration and model errors come back before
/// anything listens.
pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let cfg = config::load(args.config.as_deref(), &args.overrides())?;
    init_logging(&cfg.log.format, &cfg.log.filter);
    let token = auth::Token::from_config(&cfg.server)?;
    let engine = Engine::load(cfg.engine_config())?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("civetta-rpc").enable_all().build()?;
    let result = rt.block_on(run(cfg, engine.clone(), token, wait_for_signal()));
    // Joins the engine thread (a no-op when the shutdown path already did).
    engine.shutdown();
    result
}

/// Bound addresses of a running daemon.
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    pub grpc: SocketAddr,
    pub metrics: SocketAddr,
    /// None when the HTTP API is disabled (`server.http_addr = ""`).
    pub http: Option<SocketAddr>,
}

/// Serves `engine` until `stop` completes, then shuts down gracefully
/// ([`lifecycle`]): health goes NOT_SERVING at once (both transports keep answering, and
/// /metrics too), new generations are refused, in-flight streams get
/// `server.shutdown_grace_seconds` to finish, then the engine cancels what is left; the
/// listeners close as soon as no generation runs.
pub async fn run(
    cfg: config::Config,
    engine: Engine,
    token: auth::Token,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    use crate::proto::inference_server::InferenceServer;
    let grpc_listener = tokio::net::TcpListener::bind(&cfg.server.grpc_addr)
        .await
        .with_context(|| format!("cannot listen for gRPC on {}", cfg.server.grpc_addr))?;
    let metrics_listener = tokio::net::TcpListener::bind(&cfg.server.metrics_addr)
        .await
        .with_context(|| format!("cannot listen for metrics on {}", cfg.server.metrics_addr))?;
    let http_listener = match cfg.server.http_addr.as_str() {
        "" => None,
        addr => Some(tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen for HTTP on {addr}"))?),
    };
    let bound = Bound {
        grpc: grpc_listener.local_addr()?,
        metrics: metrics_listener.local_addr()?,
        http: http_listener.as_ref().map(|l| l.local_addr()).transpose()?,
    };

    let info = engine.model_info().clone();
    let fingerprint = Arc::new(crate::envinfo::collect(&crate::envinfo::CollectOptions::system(info.backend.clone())));
    let metrics = Arc::new(
        metrics::Metrics::new(&metrics::BuildLabels::new(&info.backend, &fingerprint), &fingerprint).context("registering metrics")?,
    );
    let stats_engine = engine.clone();
    metrics.register(Box::new(metrics::EngineCollector::new(move || stats_engine.stats()))).context("registering metrics")?;
    metrics.register(Box::new(metrics::KernelCollector::global())).context("registering metrics")?;
    if let Some(load) = engine.expert_load() {
        metrics.register(Box::new(metrics::ExpertLoadCollector::new(load.clone()))).context("registering metrics")?;
    }

    let model_name = if cfg.model.name.is_empty() { info.name.clone() } else { cfg.model.name.clone() };
    let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let lifecycle = lifecycle::Lifecycle::new();
    let svc = grpc::InferenceService {
        engine: engine.clone(),
        metrics: metrics.clone(),
        model_name: model_name.clone(),
        fingerprint,
        draining: draining.clone(),
        lifecycle: lifecycle.clone(),
        tokenize_pool: tokenize_pool::TokenizePool::new(tokenize_pool::TokenizePool::default_jobs(), tokenize_pool::DEFAULT_WAIT),
    };
    let health_service = health::server(lifecycle.clone());
    // Both reflection versions: grpcurl and older clients still ask v1alpha.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1().context("building gRPC reflection")?;
    let reflection_v1alpha = reflection().build_v1alpha().context("building gRPC reflection")?;
    let max = cfg.server.max_message_bytes;
    let inference = InferenceServer::new(svc).max_decoding_message_size(max);
    let inference = tonic::service::interceptor::InterceptedService::new(inference, auth::interceptor(token.clone()));
    let inference = transport_status::TransportStatus::new(inference, metrics.clone());

    // /metrics keeps answering through the grace period (dashboards watch the drain); it
    // stops when the gRPC server has finished.
    let (metrics_stop_tx, metrics_stop_rx) = tokio::sync::watch::channel(false);
    let metrics_task = tokio::spawn(serve_metrics(metrics_listener, metrics.clone(), metrics_stop_rx));
    let grace = Duration::from_secs_f64(cfg.server.shutdown_grace_seconds);
    let http_task = http_listener.map(|listener| {
        let state = Arc::new(http::HttpState {
            engine: engine.clone(),
            metrics: metrics.clone(),
            token: token.clone(),
            model_name: model_name.clone(),
            max_body_bytes: max,
            lifecycle: lifecycle.clone(),
            draining: draining.clone(),
            request_timeout: Some(Duration::from_secs_f64(cfg.server.http_request_timeout_seconds)).filter(|d| !d.is_zero()),
        });
        tokio::spawn(http::serve(listener, state, grace, FORCE_CLOSE_AFTER_GRACE))
    });

    let http_shown = bound.http.map(|a| a.to_string()).unwrap_or_else(|| "off".into());
    eprintln!("civetta: listening grpc={} metrics={} http={http_shown}", bound.grpc, bound.metrics);
    tracing::info!(grpc = %bound.grpc, metrics = %bound.metrics, http = %http_shown, model = %info.path.display(), name = %model_name, backend = %info.backend, auth = token.is_enabled(), "serving");

    let shutdown_engine = engine.clone();
    let drain_lifecycle = lifecycle.clone();
    let shutdown = async move {
        stop.await;
        tracing::info!(
            grace_seconds = grace.as_secs_f64(),
            "shutdown requested: health NOT_SERVING, no new requests, in-flight streams may finish"
        );
        // After the grace period the engine cancels what is still running; the streams
        // then end with UNAVAILABLE and the servers can finish.
        let cancel_rest = async move {
            tracing::info!("grace period over: cancelling remaining sequences");
            draining.store(true, std::sync::atomic::Ordering::SeqCst);
            let _ = tokio::task::spawn_blocking(move || shutdown_engine.shutdown()).await;
        };
        drain_lifecycle.drain(grace, cancel_rest).await;
        // The servers finish on their own now; this future has nothing left to do.
        std::future::pending::<()>().await
    };
    let closing_lifecycle = lifecycle.clone();
    let server = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(inference)
        .serve_with_incoming_shutdown(
            // TCP_NODELAY: token messages are small and must not wait for delayed ACKs (Nagle).
            tonic::transport::server::TcpIncoming::from_listener(grpc_listener, true, None)
                .map_err(|e| anyhow::anyhow!("gRPC listener: {e}"))?,
            async move { closing_lifecycle.closing().await },
        );
    // A stream nobody ends (a slow client's) would hold a graceful shutdown open forever;
    // connections are dropped a little after the grace period.
    let forced = async {
        lifecycle.stopping().await;
        tokio::time::sleep(grace + FORCE_CLOSE_AFTER_GRACE).await;
    };
    let served = tokio::select! {
        r = server => r.context("gRPC server"),
        _ = forced => {
            tracing::warn!("connections still open after the grace period; closing them");
            Ok(())
        }
        _ = shutdown => unreachable!("the shutdown sequence never completes"),
    };
    if let Some(t) = http_task {
        let _ = t.await;
    }
    let _ = metrics_stop_tx.send(true);
    let _ = metrics_task.await;
    served?;
    tracing::info!("stopped");
    Ok(())
}

/// GET /metrics (Prometheus text format) and GET /healthz on their own port.
async fn serve_metrics(listener: tokio::net::TcpListener, metrics: Arc<metrics::Metrics>, mut stop: tokio::sync::watch::Receiver<bool>) {
    use axum::http::header::CONTENT_TYPE;
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let metrics = metrics.clone();
                async move {
                    // Collection walks the kernel registry; keep it off the async workers.
                    let text = tokio::task::spawn_blocking(move || metrics.render()).await.unwrap_or_default();
                    ([(CONTENT_TYPE, metrics::CONTENT_TYPE)], text)
                }
            }),
        )
        .route("/healthz", axum::routing::get(|| async { "ok\n" }));
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "metrics endpoint failed");
    }
}

/// Completes on SIGINT or SIGTERM.
pub async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "no SIGTERM handler; stopping on SIGINT only");
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
