//! DataFusion physical plan pieces of the write path: the length-ordering stage that sits ahead of
//! `embed()`, the node that calls `embed()` a model call's rows at a time, and the optimizer rule that
//! puts them there.

pub mod embed_exec;
pub mod length_order;
pub mod rule;
pub mod work_list;

pub use embed_exec::EmbedExec;
pub use length_order::{LengthOrderExec, TokenCountExec};
pub use rule::EmbedWriteRule;
pub use work_list::WorkListExec;
