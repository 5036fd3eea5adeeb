//! DataFusion physical plan pieces of the pipeline: the length-ordering stage that sits ahead of
//! `embed()`, and the optimizer rule that puts it there.

pub mod length_order;
pub mod rule;

pub use length_order::LengthOrderExec;
pub use rule::LengthOrderRule;
