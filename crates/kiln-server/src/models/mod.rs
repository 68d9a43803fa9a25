//! Several models in one server: the pool that loads them by the request's `model`
//! ([`pool`]), Ollama's `keep_alive` ([`keep_alive`]), the served model behind its gateway
//! ([`ServedModel`]) and the management endpoints ([`http`]).

pub mod http;
pub mod keep_alive;
pub mod pool;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use kiln_engine::AdapterRegistry;

use crate::errors::ApiError;
use crate::gateway::Gateway;
use crate::state::ModelInfo;
pub use keep_alive::KeepAlive;
pub use pool::{
    Candidate, Listed, LoadError, Loader, ModelPool, ModelStatus, PoolError, PoolModel,
    PoolSettings,
};

/// A model serving: its facts, its engine behind the gateway, its adapters, its bill.
pub struct ServedModel {
    /// Facts the HTTP side needs.
    pub info: ModelInfo,
    /// The engine's thread.
    pub gateway: Arc<Gateway>,
    /// Its mounted LoRA adapters (`None`: none can be mounted).
    pub adapters: Option<Arc<AdapterRegistry>>,
    /// Bytes of the memory budget it holds.
    pub bill_bytes: u64,
}

impl ServedModel {
    /// `info`'s model behind `gateway`, without adapters or a bill.
    pub fn new(info: ModelInfo, gateway: Arc<Gateway>) -> Self {
        Self {
            info,
            gateway,
            adapters: None,
            bill_bytes: 0,
        }
    }

    /// With these adapters.
    pub fn with_adapters(mut self, adapters: Arc<AdapterRegistry>) -> Self {
        self.adapters = Some(adapters);
        self
    }
}

/// A loader of one model only: it makes the model again (`make`) when the pool asks for it by
/// its id, and knows no other (one-model servers and tests).
pub struct OneModel {
    id: String,
    path: std::path::PathBuf,
    make: Box<dyn Fn() -> Result<ServedModel, String> + Send + Sync>,
}

impl OneModel {
    /// A loader of the model `id` that `make` builds.
    pub fn new(
        id: impl Into<String>,
        path: impl Into<std::path::PathBuf>,
        make: impl Fn() -> Result<ServedModel, String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            id: id.into(),
            path: path.into(),
            make: Box::new(make),
        }
    }
}

impl Loader<ServedModel> for OneModel {
    fn find(&self, name: &str) -> Option<Candidate> {
        (name == self.id).then(|| Candidate {
            id: self.id.clone(),
            path: self.path.clone(),
        })
    }

    fn available(&self) -> Vec<Listed> {
        Vec::new()
    }

    fn load(&self, _: &Candidate, _: Option<u64>) -> Result<ServedModel, LoadError> {
        (self.make)().map_err(LoadError::Failed)
    }
}

impl Models {
    /// A pool serving `model` alone; `remake` builds it again after a panic broke it (`None`:
    /// it cannot be rebuilt, and requests then fail).
    pub fn single(
        model: ServedModel,
        remake: Option<Box<dyn Fn() -> Result<ServedModel, String> + Send + Sync>>,
    ) -> Self {
        let id = model.info.id.clone();
        let path = std::path::PathBuf::from(format!("<{id}>"));
        let make = remake.unwrap_or_else(|| {
            Box::new(|| Err("the model broke and cannot be loaded again".to_string()))
        });
        let loader = OneModel {
            id: id.clone(),
            path: path.clone(),
            make,
        };
        let settings = PoolSettings {
            budget_bytes: None,
            models_max: 1,
            keep_alive: KeepAlive::Forever,
            room_wait: std::time::Duration::from_secs(30),
        };
        let pool = Self::new(Arc::new(loader), settings, id);
        pool.insert(model, path, Vec::new(), KeepAlive::Forever);
        pool
    }
}

impl PoolModel for ServedModel {
    fn id(&self) -> &str {
        &self.info.id
    }

    fn bill_bytes(&self) -> u64 {
        self.bill_bytes
    }

    fn is_idle(&self) -> bool {
        self.gateway.metrics.in_flight.load(Ordering::SeqCst) == 0
    }

    fn is_broken(&self) -> bool {
        self.gateway.is_broken()
    }

    fn answers_to(&self, name: &str) -> bool {
        self.adapters
            .as_ref()
            .is_some_and(|r| r.get(name).is_some())
    }

    fn shut_down(&self) {
        self.gateway.shutdown();
    }
}

/// The server's models.
pub type Models = ModelPool<ServedModel>;

/// A request's hold on its model.
pub type ModelLease = pool::Lease<ServedModel>;

impl From<PoolError> for ApiError {
    fn from(e: PoolError) -> Self {
        let msg = e.to_string();
        match e {
            PoolError::PathName(_) => ApiError::bad_request(msg).with_code("invalid_model"),
            PoolError::NotFound { .. } => ApiError::not_found(msg).with_code("model_not_found"),
            PoolError::TooLarge { .. } => ApiError::bad_request(msg)
                .with_kind("memory_admission")
                .with_code("model_over_budget"),
            PoolError::NoRoom { .. } | PoolError::AllBusy { .. } | PoolError::Closed => {
                ApiError::busy(msg)
            }
            PoolError::LoadFailed { .. } => ApiError::internal(msg).with_code("model_load_failed"),
        }
    }
}

/// A request's `model` field: a string, or absent/null for the default model.
pub fn model_name(field: Option<&serde_json::Value>) -> Result<Option<&str>, ApiError> {
    match field {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.as_str())),
        Some(_) => Err(ApiError::bad_request("model must be a string")),
    }
}

/// [`acquire`] for a generation endpoint: an embedding model is a 400 naming it.
pub async fn acquire_generative(
    models: &Arc<Models>,
    model: Option<&serde_json::Value>,
    keep_alive: Option<&serde_json::Value>,
) -> Result<ModelLease, ApiError> {
    let lease = acquire(models, model, keep_alive).await?;
    if lease.info.embedding.is_some() {
        return Err(not_generative(&lease.info.id));
    }
    Ok(lease)
}

/// The refusal of a generation request for embedding model `id`.
pub fn not_generative(id: &str) -> ApiError {
    ApiError::bad_request(format!(
        "model {id} is an embedding model: it answers /v1/embeddings, not generation"
    ))
    .with_code("model_not_generative")
}

/// The request's model, loaded if needed, with the request's `keep_alive` applied.
pub async fn acquire(
    models: &Arc<Models>,
    model: Option<&serde_json::Value>,
    keep_alive: Option<&serde_json::Value>,
) -> Result<ModelLease, ApiError> {
    let name = model_name(model)?;
    let keep =
        KeepAlive::from_field(keep_alive).map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(models.acquire(name, keep).await?)
}
