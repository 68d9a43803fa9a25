//! How every lab run reports as it goes: one trait for the quantizer, the trainer and the
//! dataset templates, and one adapter that turns it into a job's events.

use kiln_jobs::JobContext;
use serde_json::Value;

use crate::LabError;

/// Where a run reports: stages, measurements and warnings. A method returning an error stops
/// the run there (cancellation).
pub trait Report {
    /// A stage with the run's overall progress in 0..=1.
    fn stage(&mut self, name: &str, progress: f64, message: &str) -> Result<(), LabError>;
    /// Something the user should know that does not stop the run.
    fn warn(&mut self, message: &str);
    /// A measurement as it is made (`{"type": "metric", "kind": …}`); ignored by default.
    fn metric(&mut self, metric: Value) -> Result<(), LabError> {
        let _ = metric;
        Ok(())
    }
    /// Whether a stop-and-save was asked for (runs that can stop early poll it).
    fn stop_requested(&self) -> bool {
        false
    }
    /// `done` of `total` units of a dataset's `generating` stage, spread over 0.05..0.95 of
    /// the run (the rest is reading inputs and writing the files).
    fn step(&mut self, done: usize, total: usize, what: &str) -> Result<(), LabError> {
        let progress = 0.05 + 0.9 * done as f64 / total.max(1) as f64;
        self.stage("generating", progress, &format!("{done}/{total} {what}"))
    }
}

/// Reports nothing (checks that run a template without a job).
pub struct Silent;

impl Report for Silent {
    fn stage(&mut self, _: &str, _: f64, _: &str) -> Result<(), LabError> {
        Ok(())
    }

    fn warn(&mut self, _: &str) {}
}

/// A job's reporter: stages and metrics become its events, warnings its log lines, and a
/// cancelled job's next event ends the run.
pub struct JobReport<'a>(pub &'a JobContext);

impl Report for JobReport<'_> {
    fn stage(&mut self, name: &str, progress: f64, message: &str) -> Result<(), LabError> {
        self.0
            .stage(name, Some(progress), Some(message))
            .map_err(|_| LabError::Cancelled)
    }

    fn warn(&mut self, message: &str) {
        let _ = self
            .0
            .emit(kiln_jobs::event::log(&format!("warning: {message}")));
    }

    fn metric(&mut self, mut metric: Value) -> Result<(), LabError> {
        if let Some(fields) = metric.as_object_mut() {
            fields
                .entry("ts")
                .or_insert_with(|| kiln_jobs::event::now_ms().into());
        }
        self.0.emit(metric).map_err(|_| LabError::Cancelled)
    }

    fn stop_requested(&self) -> bool {
        self.0.stop_requested()
    }
}
