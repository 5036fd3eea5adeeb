//! Campaign operations as a library: each takes typed settings, tells a [`Reporter`] what it is doing, and
//! returns a typed report or a [`crate::Error`]. The command (the `pipeline` crate) parses arguments, calls these and
//! renders what they return; a Rust program calls the same functions.
//!
//! - [`run`]: a job's statements in order, each write into Lance checked, resumed and followed
//!   ([`run::run_job`] → [`run::RunReport`]);
//! - [`plan`]: a job's writes planned on any machine ([`plan::plan_job`] → [`crate::campaign::work_plan::WorkPlan`]s),
//!   and the walk over a job's writes the other preparations share ([`plan::JobWrites`]);
//!   an image write's headers counted instead ([`image_plan::plan_images`] → [`image_plan::ImagePlan`]);
//! - [`probe`]: the batch setting this machine's device affords ([`probe::probe_job`] → [`probe::ProbeReport`]);
//!   for an image write, on its largest images ([`image_probe::probe_image_job`] → [`image_probe::ImageProbeReport`]);
//! - [`trial`]: what a job will cost on this device, measured on a sample ([`trial::run_trial`] →
//!   [`trial::Trial`], saved as `trial.json`): of a text write ([`trial::TrialReport`]) or of an image write
//!   ([`image_trial::ImageTrialReport`]), with what both share in [`trial_sample`];
//! - [`cost`]: the trials of one campaign priced side by side ([`cost::cost_trials`] → [`cost::CostReport`]);
//! - [`devices`]: what this machine can run on, and the versions it is built with ([`devices::devices`]);
//! - [`lineage`]: how a version's vectors were made, each link re-checked on request ([`lineage::report`] →
//!   [`lineage::LineageReport`]);
//! - [`evaluate`]: how well representations retrieve judged documents, and how much a new one moves the
//!   neighbourhoods ([`evaluate::evaluate`] → [`evaluate::EvaluateReport`]);
//! - [`report`]: a campaign on one self-contained HTML page ([`report::report`]);
//! - [`restart`]: a restart run again after it stopped resumes the same write ([`restart::prepare_restart`]);
//! - [`checks`]: the model checked on a sample of a job's corpus: batch invariance and order invariance
//!   ([`checks::check_invariance`], [`checks::compare_order`]);
//! - [`embed`]: texts embedded directly with a model directory's own settings ([`embed::embed_texts`] →
//!   [`embed::Embeddings`]);
//! - [`verify`]: is a dataset the whole corpus, every vector sound, and can it be reproduced
//!   ([`verify::verify`] → [`verify::VerifyReport`], kept beside the dataset by [`verify::save`]);
//! - [`histogram`] and [`json_lines`]: a plan's picture, and the bad line of a JSON source named;
//! - [`sample`]: seeded samples of ids, held in bounded memory;
//! - [`search`]: a dataset's nearest rows to a query embedded under its fingerprint ([`search::nearest`]), and the
//!   hits joined to their source rows by id ([`search::join_source`]);
//! - [`compare`]: two datasets' vectors compared by id ([`compare::compare`] → [`compare::CompareReport`]);
//! - [`inspect`]: what a dataset holds and records ([`inspect::inspect`] → [`inspect::DatasetReport`]);
//! - [`maintain`]: `pipeline index` and `pipeline optimize`, each leaving a record in the dataset's history
//!   ([`maintain::index`], [`maintain::optimize`]);
//! - [`script`]: a job's text split into statements with their lines, all parsed before any runs.

pub mod checks;
pub mod compare;
pub mod cost;
pub mod devices;
pub mod embed;
pub mod evaluate;
pub mod histogram;
pub mod image_plan;
pub mod image_probe;
pub mod image_trial;
pub mod inspect;
pub mod json_lines;
pub mod lineage;
pub mod maintain;
pub mod plan;
pub mod probe;
pub mod report;
pub mod restart;
pub mod run;
pub mod sample;
pub mod script;
pub mod search;
pub mod trial;
pub mod trial_sample;
pub mod verify;

use std::ops::ControlFlow;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;

pub use run::{RunOptions, RunReport, WorkPlanChoice, WriteProgress, run_job};

/// What an operation tells its caller while it runs: `pipeline run` prints notes on its output and warnings
/// on stderr, draws a progress bar on a terminal and prints query results; a program may show them its own
/// way, or not at all. Every method has a default: say nothing, read query results to their end.
///
/// An operation's result never depends on its reporter: what it did is in the report it returns.
pub trait Reporter: Send + Sync {
    /// A line about what the operation is doing or found ("resuming: 100 of 1000 already done in …").
    fn note(&self, _line: &str) {}

    /// Something the user should act on ("this run's memory peaked at …"), without the `warning: ` prefix.
    fn warning(&self, _line: &str) {}

    /// A write into Lance started; `progress` says where it is whenever asked, until
    /// [`Reporter::write_finished`].
    fn write_started(&self, _progress: WriteProgress) {}

    /// The write [`Reporter::write_started`] announced ended, however it ended.
    fn write_finished(&self) {}

    /// The next batch of a query's result (a statement that writes nothing). `Break` stops reading it: the
    /// rest of the result is not computed.
    fn query_rows(&self, _batch: &RecordBatch) -> crate::Result<ControlFlow<()>> {
        Ok(ControlFlow::Continue(()))
    }

    /// A query's result ended (or was stopped by `Break`); `schema` names its columns, even with no rows.
    fn query_finished(&self, _schema: &SchemaRef) -> crate::Result<()> {
        Ok(())
    }
}

/// A reporter that says nothing and reads each query's result to its end (so that a failing row still fails).
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl Reporter for Silent {}
