//! Integration tests, in one binary so the heavy stack links once. Every test runs the real model
//! through the real ONNX Runtime and writes real Lance datasets; `scripts/setup` installs both.

mod adapt;
mod campaign;
mod cli;
mod cli_habits;
mod cluster;
mod common;
mod errors;
mod evaluate;
mod integrity;
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
