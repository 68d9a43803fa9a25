//! The test kinds: `noop` and `crash` (spec §5.1).

use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use crate::runner::{ExecMode, JobContext, JobRunner, Registry, RunError, RunOutput};

/// Registers `noop` and `crash` (both child-process kinds).
pub fn register(registry: &mut Registry) {
    registry.register("noop", NoopRunner::new(ExecMode::Child));
    registry.register("crash", CrashRunner);
}

/// Emits `warmup` (0.25, "starting up") and `work` (0.75), then returns.
/// Config: `delay_ms` (≤ 60000) sleeps after each stage, checking for cancellation; a stop
/// request ([`crate::JobHost::request_stop`]) ends the sleep and the job finishes early with
/// `stopped: true`, as a training job saves and finishes.
#[derive(Debug, Clone, Copy)]
pub struct NoopRunner {
    mode: ExecMode,
}

impl NoopRunner {
    /// A noop that runs in `mode`.
    pub fn new(mode: ExecMode) -> Self {
        NoopRunner { mode }
    }
}

impl JobRunner for NoopRunner {
    fn mode(&self) -> ExecMode {
        self.mode
    }

    fn run(&self, ctx: &JobContext, config: &Map<String, Value>) -> Result<RunOutput, RunError> {
        let delay = config
            .get("delay_ms")
            .and_then(Value::as_u64)
            .unwrap_or(0)
            .min(60_000);
        let delay = Duration::from_millis(delay);
        ctx.stage("warmup", Some(0.25), Some("starting up"))?;
        nap(ctx, delay)?;
        if !ctx.stop_requested() {
            ctx.stage("work", Some(0.75), None)?;
            nap(ctx, delay)?;
        }
        Ok(RunOutput {
            output_path: None,
            summary: Some(json!({"stages": 2, "stopped": ctx.stop_requested()})),
        })
    }
}

/// Sleeps in short steps so a cancellation is seen within ~20 ms.
fn nap(ctx: &JobContext, total: Duration) -> Result<(), RunError> {
    let end = Instant::now() + total;
    loop {
        ctx.check()?;
        let now = Instant::now();
        if now >= end || ctx.stop_requested() {
            return Ok(());
        }
        std::thread::sleep((end - now).min(Duration::from_millis(20)));
    }
}

/// Emits one stage, then exits the process with status 1. Child-only.
#[derive(Debug, Clone, Copy)]
pub struct CrashRunner;

impl JobRunner for CrashRunner {
    fn mode(&self) -> ExecMode {
        ExecMode::Child
    }

    fn run(&self, ctx: &JobContext, _config: &Map<String, Value>) -> Result<RunOutput, RunError> {
        ctx.stage("crashing", Some(0.5), Some("about to exit(1)"))?;
        eprintln!("crash: exiting with status 1");
        std::process::exit(1);
    }
}
