//! Integration tests, in one binary so the heavy stack links once. Every test runs the real ONNX Runtime and
//! writes real Lance datasets; the real model where the figures matter, the tiny model (`common::tiny_model_dir`)
//! where only the mechanics do. `scripts/setup` installs the runtime and the model; `scripts/test` runs them all.

// Tests print what they measured, and a test reads best in one piece.
#![allow(clippy::print_stdout, clippy::print_stderr, clippy::too_many_lines)]

mod adapt;
mod campaign;
mod cli;
mod cli_habits;
mod cluster;
mod common;
mod errors;
mod evaluate;
mod images;
mod integrity;
mod json_schemas;
mod layout;
mod lineage;
mod maintain;
mod messages;
mod model;
mod model_shapes;
mod ops;
mod order;
mod plan;
mod plan_run;
mod probe;
mod resume;
mod search;
mod shapes;
mod slt;
mod sql;
mod st_features;
mod stores;
mod trial;
mod verify;
