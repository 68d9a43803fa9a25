//! kiln's HTTP server: OpenAI- and Anthropic-compatible endpoints in front of the engine.
//!
//! The HTTP side turns JSON into typed requests (`kiln_engine::GenerateRequest`, planned per API) and hands them to the
//! [`gateway::Gateway`], which owns the engine on its own thread; nothing here touches the
//! engine directly, so batching can later replace the gateway's loop without touching a route.

pub mod adapters;
pub mod anthropic;
pub mod auth;
pub mod body;
pub mod body_guard;
pub mod chat_plan;
pub mod embeddings;
pub mod errors;
pub mod gateway;
pub mod generation;
pub mod listen;
pub mod metrics;
pub mod models;
pub mod openai;
pub mod openapi;
pub mod page;
pub mod prompt;
pub mod routes;
pub mod sampling;
pub mod state;
pub mod stats;
pub mod structured;
pub mod tools;
pub mod turn;

use std::future::Future;
use std::sync::Arc;

pub use gateway::{Gateway, Generator, OneAtATime, Serial};
pub use kiln_engine::StartGate;
pub use listen::ConnectionLimits;
pub use models::{Models, ServedModel};
pub use state::{AppState, MemoryAdmission, ModelInfo, ServerConfig, SharedState, StatsHook};

/// What other subsystems add to the server: routes (the jobs API and page), `/stats`
/// sections, and a note for generation responses (why a generation may wait).
#[derive(Default)]
pub struct Extensions {
    /// Routes merged into the app (they get the same auth and Host checks).
    pub router: Option<axum::Router>,
    /// What `router` answers, `(method, path, summary)`, for `/openapi.json` and `/v1`.
    pub routes: Vec<routes::RouteDoc>,
    /// `/stats` sections by key.
    pub stats: Vec<(String, StatsHook)>,
    /// When it returns `Some`, generation responses carry it as `x-kiln-job-gate`.
    pub gate_note: Option<Arc<dyn Fn() -> Option<String> + Send + Sync>>,
    /// Paths of `router` that need no API key (pages that ask for it themselves); one ending
    /// in `/` opens every path under it.
    pub open_paths: Vec<&'static str>,
}

/// Default largest request body: 4 MiB (a 10 MB body is a 413).
pub const DEFAULT_BODY_LIMIT: usize = 4 << 20;

/// Serves on `listener` (with the connection limits of `config`) until `shutdown` resolves,
/// then lets in-flight requests finish and stops every model's engine thread.
pub async fn serve(
    listener: tokio::net::TcpListener,
    models: Arc<Models>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, models, config, Extensions::default(), shutdown).await
}

/// How often idle models are checked against their keep-alive.
const REAP_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// [`serve`] with [`Extensions`].
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    models: Arc<Models>,
    config: ServerConfig,
    extensions: Extensions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let local_addr = listener.local_addr()?;
    let limits = config.limits;
    let mut state = AppState::new(models.clone(), config, local_addr);
    state.extra_stats = extensions.stats;
    state.open_paths = extensions.open_paths;
    state.routes.extend(extensions.routes);
    let state = Arc::new(state);
    let app = routes::router_with(state, extensions.router, extensions.gate_note);
    let reaper = tokio::spawn(models.clone().reap_loop(REAP_EVERY));
    listen::serve_connections(listener, app, limits, shutdown).await;
    // Every connection has closed, so nothing waits on an engine any more.
    reaper.abort();
    tokio::task::spawn_blocking(move || models.close())
        .await
        .map_err(std::io::Error::other)?;
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down: draining in-flight requests");
}
