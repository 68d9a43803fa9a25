//! The loaded models, by name: loading on first request inside the memory budget, evicting the
//! least recently used idle model for room or for `--models-max`, unloading idle models whose
//! keep-alive ran out, and replacing a model whose engine broke.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::keep_alive::KeepAlive;

/// What the pool needs of a loaded model.
pub trait PoolModel: Send + Sync + 'static {
    /// The id requests and listings use.
    fn id(&self) -> &str;
    /// Bytes of the memory budget it holds (weights, runtime, its KV reservation).
    fn bill_bytes(&self) -> u64;
    /// No request runs or waits on it.
    fn is_idle(&self) -> bool;
    /// Its engine failed for good (a panic): it must be replaced.
    fn is_broken(&self) -> bool;
    /// Whether a request's `model` naming `name` runs on it (its mounted adapters' ids).
    fn answers_to(&self, name: &str) -> bool;
    /// Stops it; blocks until its engine thread has ended.
    fn shut_down(&self);
}

/// A model a name resolved to, not necessarily loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The id it will be served under.
    pub id: String,
    /// Its file or folder.
    pub path: PathBuf,
}

/// One model that could be loaded (what `GET /v1/models` lists as `unloaded`).
#[derive(Debug, Clone)]
pub struct Listed {
    /// The name a request uses.
    pub name: String,
    /// Its file or folder.
    pub path: PathBuf,
    /// Bytes on disk.
    pub size_bytes: u64,
}

/// Why a load did not happen.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum LoadError {
    /// The room left is too small; `needed` is the least the model can serve in.
    #[error("needs {needed} bytes, {room} are free")]
    DoesNotFit {
        /// Least bytes it serves in.
        needed: u64,
        /// Bytes it was offered.
        room: u64,
    },
    /// Reading or checking the model failed.
    #[error("{0}")]
    Failed(String),
}

/// Finds, lists and loads models (the binary's engine loading, or a stand-in in tests).
pub trait Loader<M>: Send + Sync + 'static {
    /// The model `name` means, if any; `name` is never path-shaped here.
    fn find(&self, name: &str) -> Option<Candidate>;
    /// Every model a request could name.
    fn available(&self) -> Vec<Listed>;
    /// Loads `c` within `room` bytes (`None`: no budget).
    fn load(&self, c: &Candidate, room: Option<u64>) -> Result<M, LoadError>;
}

/// Why a request got no model.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PoolError {
    /// `model` looks like a path: requests name models, never files.
    #[error(
        "model {0:?} is a path; a request names a model (GET /v1/models lists them), never a file"
    )]
    PathName(String),
    /// Nothing answers to the name.
    #[error("model {name:?} does not exist; available: {}", known.join(", "))]
    NotFound {
        /// The name asked for.
        name: String,
        /// What exists.
        known: Vec<String>,
    },
    /// The model needs more than the whole budget.
    #[error(
        "model {name} needs {:.3} GB to serve but the memory budget is {:.3} GB",
        gb(*needed),
        gb(*budget)
    )]
    TooLarge {
        /// The model.
        name: String,
        /// Least bytes it serves in.
        needed: u64,
        /// The server's budget.
        budget: u64,
    },
    /// Busy models hold the room it needs and did not free it in time.
    #[error(
        "model {name} needs {:.3} GB; {:.3} GB of the budget are free and the busy models ({}) hold the rest — retry later",
        gb(*needed),
        gb(*free),
        busy.join(", ")
    )]
    NoRoom {
        /// The model.
        name: String,
        /// Least bytes it serves in.
        needed: u64,
        /// Free bytes.
        free: u64,
        /// The models that hold the rest.
        busy: Vec<String>,
    },
    /// More models than `--models-max` are busy.
    #[error("{max} models are loaded (--models-max) and all are busy: {} — retry later", busy.join(", "))]
    AllBusy {
        /// `--models-max`.
        max: usize,
        /// The busy models.
        busy: Vec<String>,
    },
    /// The load itself failed.
    #[error("loading model {name} failed: {reason}")]
    LoadFailed {
        /// The model.
        name: String,
        /// Why.
        reason: String,
    },
    /// The server is shutting down.
    #[error("the server is shutting down")]
    Closed,
}

fn gb(b: u64) -> f64 {
    b as f64 / 1e9
}

/// How the pool holds models.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// The memory budget all loaded models share (`None`: unbounded).
    pub budget_bytes: Option<u64>,
    /// Most models loaded at once (`--models-max`).
    pub models_max: usize,
    /// How long a model loaded on demand stays loaded once idle (`--keep-alive`).
    pub keep_alive: KeepAlive,
    /// How long a load waits for busy models to free room or a seat.
    pub room_wait: Duration,
}

/// Where a model is in its life, as listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelStatus {
    /// Serving.
    Loaded,
    /// Being read.
    Loading,
    /// On disk only.
    Unloaded,
}

/// A loaded model as listed.
pub struct LoadedEntry<M> {
    /// The model.
    pub model: Arc<M>,
    /// Other names requests reached it by.
    pub aliases: Vec<String>,
    /// Its file or folder.
    pub path: PathBuf,
    /// Its keep-alive.
    pub keep_alive: KeepAlive,
}

struct Entry<M> {
    model: Arc<M>,
    path: PathBuf,
    aliases: Vec<String>,
    last_used: Instant,
    idle_since: Option<Instant>,
    keep_alive: KeepAlive,
    leases: usize,
}

impl<M: PoolModel> Entry<M> {
    fn named(&self, name: &str) -> bool {
        self.model.id() == name || self.aliases.iter().any(|a| a == name)
    }

    fn evictable(&self) -> bool {
        self.leases == 0 && self.model.is_idle()
    }
}

struct Inner<M> {
    entries: Vec<Entry<M>>,
    loading: Option<String>,
    open: bool,
}

/// The loaded models and how to load more.
pub struct ModelPool<M> {
    loader: Arc<dyn Loader<M>>,
    settings: PoolSettings,
    default_id: String,
    inner: Mutex<Inner<M>>,
    load_lock: tokio::sync::Mutex<()>,
    changed: tokio::sync::Notify,
}

/// A request's hold on a model: while it lives the model is not evicted. Streams keep their
/// model alive through the engine's in-flight count once the request is submitted.
pub struct Lease<M: PoolModel> {
    model: Arc<M>,
    pool: Arc<ModelPool<M>>,
}

impl<M: PoolModel> Lease<M> {
    /// The model, to keep past the lease (a stream's renderer).
    pub fn model(&self) -> &Arc<M> {
        &self.model
    }
}

impl<M: PoolModel> std::ops::Deref for Lease<M> {
    type Target = M;
    fn deref(&self) -> &M {
        &self.model
    }
}

impl<M: PoolModel> Drop for Lease<M> {
    fn drop(&mut self) {
        {
            let mut g = self.pool.lock();
            if let Some(e) = g
                .entries
                .iter_mut()
                .find(|e| Arc::ptr_eq(&e.model, &self.model))
            {
                e.leases = e.leases.saturating_sub(1);
                e.last_used = Instant::now();
            }
        }
        self.pool.changed.notify_waiters();
    }
}

/// Whether a request's `model` names a file rather than a model.
pub fn is_path_shaped(name: &str) -> bool {
    name.starts_with(['/', '.', '~', '\\'])
        || name.contains('\\')
        || name.contains('\0')
        || name.split('/').any(|part| part == ".." || part == ".")
        || name.contains("//")
        || (name.len() >= 2 && name.as_bytes()[1] == b':')
}

/// How often the pool looks again for room while busy models hold it.
const ROOM_POLL: Duration = Duration::from_millis(100);

impl<M: PoolModel> ModelPool<M> {
    /// An empty pool whose unnamed requests go to `default_id`.
    pub fn new(
        loader: Arc<dyn Loader<M>>,
        settings: PoolSettings,
        default_id: impl Into<String>,
    ) -> Self {
        Self {
            loader,
            settings,
            default_id: default_id.into(),
            inner: Mutex::new(Inner {
                entries: Vec::new(),
                loading: None,
                open: true,
            }),
            load_lock: tokio::sync::Mutex::new(()),
            changed: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<M>> {
        // A panic while holding this lock leaves plain data; the next holder can go on.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The id of the model requests without `model` run on.
    pub fn default_id(&self) -> &str {
        &self.default_id
    }

    /// The settings.
    pub fn settings(&self) -> &PoolSettings {
        &self.settings
    }

    /// Adds a model loaded outside the pool (the one named on the command line).
    pub fn insert(&self, model: M, path: PathBuf, aliases: Vec<String>, keep_alive: KeepAlive) {
        let mut g = self.lock();
        g.entries.push(Entry {
            model: Arc::new(model),
            path,
            aliases,
            last_used: Instant::now(),
            idle_since: None,
            keep_alive,
            leases: 0,
        });
    }

    /// Whether requests are still taken.
    pub fn is_open(&self) -> bool {
        self.lock().open
    }

    /// The loaded models, least recently used first, and the one being loaded.
    pub fn loaded(&self) -> (Vec<LoadedEntry<M>>, Option<String>) {
        let g = self.lock();
        let mut entries: Vec<&Entry<M>> = g.entries.iter().collect();
        entries.sort_by_key(|e| e.last_used);
        let list = entries
            .into_iter()
            .map(|e| LoadedEntry {
                model: e.model.clone(),
                aliases: e.aliases.clone(),
                path: e.path.clone(),
                keep_alive: e.keep_alive,
            })
            .collect();
        (list, g.loading.clone())
    }

    /// A loaded model by name, without loading or leasing (listings, adapters' endpoints).
    pub fn get(&self, name: &str) -> Option<Arc<M>> {
        let g = self.lock();
        g.entries
            .iter()
            .find(|e| e.named(name))
            .map(|e| e.model.clone())
    }

    /// What requests could name but is not loaded.
    pub fn available(&self) -> Vec<Listed> {
        self.loader.available()
    }

    /// Bytes of the budget the loaded models hold.
    pub fn billed_bytes(&self) -> u64 {
        self.lock()
            .entries
            .iter()
            .map(|e| e.model.bill_bytes())
            .sum()
    }

    /// The model `name` names (`None` or empty: the default), loading it if needed; with
    /// `keep_alive`, the model's keep-alive becomes it.
    pub async fn acquire(
        self: &Arc<Self>,
        name: Option<&str>,
        keep_alive: Option<KeepAlive>,
    ) -> Result<Lease<M>, PoolError> {
        let name = match name.map(str::trim) {
            None | Some("") => self.default_id.clone(),
            Some(n) => n.to_string(),
        };
        if is_path_shaped(&name) {
            return Err(PoolError::PathName(name));
        }
        let deadline = Instant::now() + self.settings.room_wait;
        loop {
            if let Some(lease) = self.lease_loaded(&name, keep_alive)? {
                return Ok(lease);
            }
            let _loading = self.load_lock.lock().await;
            // Loaded while this request waited for the lock.
            if let Some(lease) = self.lease_loaded(&name, keep_alive)? {
                return Ok(lease);
            }
            let loader = self.loader.clone();
            let lookup = name.clone();
            let candidate = tokio::task::spawn_blocking(move || loader.find(&lookup))
                .await
                .ok()
                .flatten();
            let Some(candidate) = candidate else {
                return Err(PoolError::NotFound {
                    name,
                    known: self.known_names().await,
                });
            };
            if self.alias_loaded(&name, &candidate) {
                continue;
            }
            let model = self.make_room_and_load(&candidate, deadline).await?;
            let keep = keep_alive.unwrap_or(self.settings.keep_alive);
            let aliases = (candidate.id != name).then(|| name.clone());
            self.insert(model, candidate.path, aliases.into_iter().collect(), keep);
            self.changed.notify_waiters();
        }
    }

    /// A lease on a loaded model answering to `name`; a broken one is removed first.
    fn lease_loaded(
        self: &Arc<Self>,
        name: &str,
        keep_alive: Option<KeepAlive>,
    ) -> Result<Option<Lease<M>>, PoolError> {
        let broken = {
            let mut g = self.lock();
            if !g.open {
                return Err(PoolError::Closed);
            }
            let found = g.entries.iter().position(|e| e.named(name)).or_else(|| {
                g.entries
                    .iter()
                    .position(|e| !e.model.is_broken() && e.model.answers_to(name))
            });
            let Some(i) = found else {
                return Ok(None);
            };
            if !g.entries[i].model.is_broken() {
                let e = &mut g.entries[i];
                e.leases += 1;
                e.last_used = Instant::now();
                e.idle_since = None;
                if let Some(k) = keep_alive {
                    e.keep_alive = k;
                }
                return Ok(Some(Lease {
                    model: e.model.clone(),
                    pool: self.clone(),
                }));
            }
            g.entries.remove(i).model
        };
        tracing::warn!(
            "model {} broke; it is unloaded and loads again",
            broken.id()
        );
        std::thread::spawn(move || broken.shut_down());
        Ok(None)
    }

    /// When `candidate`'s file is loaded under another id, records `name` as its alias.
    fn alias_loaded(&self, name: &str, candidate: &Candidate) -> bool {
        let mut g = self.lock();
        match g.entries.iter_mut().find(|e| e.path == candidate.path) {
            Some(e) => {
                if !e.named(name) {
                    e.aliases.push(name.to_string());
                }
                true
            }
            None => false,
        }
    }

    /// Every name a request may use: loaded models with their aliases, then the available ones.
    /// The caches are listed off the async workers (it walks folders).
    async fn known_names(&self) -> Vec<String> {
        let mut names: Vec<String> = {
            let g = self.lock();
            g.entries
                .iter()
                .flat_map(|e| std::iter::once(e.model.id().to_string()).chain(e.aliases.clone()))
                .collect()
        };
        let loader = self.loader.clone();
        let available = tokio::task::spawn_blocking(move || loader.available())
            .await
            .unwrap_or_default();
        for l in available {
            if !names.contains(&l.name) {
                names.push(l.name);
            }
        }
        names
    }

    /// Loads `c`, evicting idle models (least recently used first) for a seat and for room,
    /// and waiting for busy ones until `deadline`.
    async fn make_room_and_load(&self, c: &Candidate, deadline: Instant) -> Result<M, PoolError> {
        loop {
            let (count, billed, busy) = {
                let g = self.lock();
                let busy: Vec<String> = g
                    .entries
                    .iter()
                    .filter(|e| !e.evictable())
                    .map(|e| e.model.id().to_string())
                    .collect();
                let billed: u64 = g.entries.iter().map(|e| e.model.bill_bytes()).sum();
                (g.entries.len(), billed, busy)
            };
            if count >= self.settings.models_max.max(1) {
                if !self.evict_one().await {
                    self.wait_for_change(deadline)
                        .await
                        .map_err(|_| PoolError::AllBusy {
                            max: self.settings.models_max,
                            busy,
                        })?;
                }
                continue;
            }
            let room = self.settings.budget_bytes.map(|b| b.saturating_sub(billed));
            match self.load_blocking(c, room).await {
                Ok(model) => return Ok(model),
                Err(LoadError::Failed(reason)) => {
                    return Err(PoolError::LoadFailed {
                        name: c.id.clone(),
                        reason,
                    });
                }
                Err(LoadError::DoesNotFit { needed, room }) => {
                    let budget = self.settings.budget_bytes.unwrap_or(room);
                    if needed > budget || count == 0 {
                        return Err(PoolError::TooLarge {
                            name: c.id.clone(),
                            needed,
                            budget,
                        });
                    }
                    if self.evict_one().await {
                        continue;
                    }
                    self.wait_for_change(deadline)
                        .await
                        .map_err(|_| PoolError::NoRoom {
                            name: c.id.clone(),
                            needed,
                            free: room,
                            busy,
                        })?;
                }
            }
        }
    }

    async fn load_blocking(&self, c: &Candidate, room: Option<u64>) -> Result<M, LoadError> {
        self.lock().loading = Some(c.id.clone());
        let loader = self.loader.clone();
        let cand = c.clone();
        let result = tokio::task::spawn_blocking(move || loader.load(&cand, room))
            .await
            .unwrap_or_else(|e| Err(LoadError::Failed(format!("the loader panicked: {e}"))));
        self.lock().loading = None;
        if let Ok(m) = &result {
            tracing::info!(
                "model {} loaded ({:.3} GB billed)",
                m.id(),
                gb(m.bill_bytes())
            );
        }
        result
    }

    /// Waits for a lease to end or a model to change, at most until `deadline`.
    async fn wait_for_change(&self, deadline: Instant) -> Result<(), ()> {
        let now = Instant::now();
        if now >= deadline {
            return Err(());
        }
        // Engines report idleness through counters, not this notify: poll as well.
        let wait = (deadline - now).min(ROOM_POLL);
        let _ = tokio::time::timeout(wait, self.changed.notified()).await;
        Ok(())
    }

    /// Unloads the least recently used idle model; false when every model is busy.
    async fn evict_one(&self) -> bool {
        let victim = {
            let mut g = self.lock();
            let pick = g
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.evictable())
                .min_by_key(|(_, e)| e.last_used)
                .map(|(i, _)| i);
            match pick {
                Some(i) => g.entries.remove(i).model,
                None => return false,
            }
        };
        tracing::info!("model {} unloaded to make room", victim.id());
        let _ = tokio::task::spawn_blocking(move || victim.shut_down()).await;
        true
    }

    /// Unloads `name` now when idle (`Ok(true)`), else once its requests end (`Ok(false)`).
    pub async fn unload(&self, name: &str) -> Result<bool, PoolError> {
        let found = self.lock().entries.iter().any(|e| e.named(name));
        if !found {
            return Err(PoolError::NotFound {
                name: name.to_string(),
                known: self.known_names().await,
            });
        }
        let victim = {
            let mut g = self.lock();
            let Some(i) = g.entries.iter().position(|e| e.named(name)) else {
                // Unloaded by another request meanwhile: nothing left to do.
                return Ok(true);
            };
            if !g.entries[i].evictable() {
                g.entries[i].keep_alive = KeepAlive::For(Duration::ZERO);
                return Ok(false);
            }
            g.entries.remove(i).model
        };
        tracing::info!("model {} unloaded by request", victim.id());
        let _ = tokio::task::spawn_blocking(move || victim.shut_down()).await;
        self.changed.notify_waiters();
        Ok(true)
    }

    /// Unloads idle models whose keep-alive ran out and broken idle ones; returns their ids.
    pub fn reap(&self) -> Vec<String> {
        let now = Instant::now();
        let gone: Vec<Arc<M>> = {
            let mut g = self.lock();
            for e in &mut g.entries {
                if e.evictable() {
                    e.idle_since.get_or_insert(now);
                } else {
                    e.idle_since = None;
                }
            }
            let (keep, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut g.entries)
                .into_iter()
                .partition(|e| match e.idle_since {
                    Some(t) => !(e.model.is_broken() || e.keep_alive.expired(now - t)),
                    None => true,
                });
            g.entries = keep;
            gone.into_iter().map(|e| e.model).collect()
        };
        let ids: Vec<String> = gone.iter().map(|m| m.id().to_string()).collect();
        for m in gone {
            tracing::info!("model {} unloaded (keep-alive over)", m.id());
            m.shut_down();
        }
        if !ids.is_empty() {
            self.changed.notify_waiters();
        }
        ids
    }

    /// Runs [`ModelPool::reap`] every `every` until the pool closes.
    pub async fn reap_loop(self: Arc<Self>, every: Duration) {
        while self.is_open() {
            tokio::time::sleep(every).await;
            let pool = self.clone();
            let _ = tokio::task::spawn_blocking(move || pool.reap()).await;
        }
    }

    /// Takes no more requests and stops every model (after their accepted requests end).
    pub fn close(&self) {
        let all: Vec<Arc<M>> = {
            let mut g = self.lock();
            g.open = false;
            g.entries.drain(..).map(|e| e.model).collect()
        };
        for m in all {
            m.shut_down();
        }
    }
}
