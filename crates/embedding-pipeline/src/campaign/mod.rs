//! What makes a campaign's vectors comparable, and what each run did.
//!
//! - [`fingerprint`]: the settings that decide a vector (model and tokenizer hashes, truncation,
//!   pooling, normalisation, prefix, dtype, dimension). Kept with the dataset; an append under another
//!   fingerprint is refused.
//! - [`lineage`]: what made a model directory (its `lineage.json`), and the chain down to the vectors.
//! - [`metrics`]: what a session has done so far: embedding counters and one report per Lance write.
//! - [`work_plan`]: what `pipeline plan` prepares before renting: totals, work units, the source as it was.
//! - [`record`]: one run's counters, timings and device, kept with the Lance version it committed.
//! - [`trial`]: a trial's strata, sample and extrapolation to the whole corpus.

pub mod digest;
pub mod fingerprint;
pub mod ids;
pub mod lineage;
pub mod metrics;
pub mod record;
pub mod trial;
pub mod work_plan;

pub use fingerprint::{FINGERPRINT_KEY, Fingerprint};
pub use record::{DeviceInfo, EmbedStats, ExecutorShare, RUN_RECORD_KEY, RunRecord};
