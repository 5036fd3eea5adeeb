//! DataFusion plan pieces of the write path: the length-ordering stage that sits ahead of `embed()`, the node that
//! calls `embed()` a model call's rows at a time, and the optimizer rule that puts them there ([`rule`]); resume's
//! analyzer rule ([`resume`]) and the done ids it joins against ([`existing_ids`]); and the checks every write
//! passes when planned ([`guard`]).

pub mod embed_exec;
pub mod existing_ids;
pub mod guard;
pub mod length_order;
pub mod resume;
pub mod rule;
pub mod work_list;

pub use embed_exec::EmbedExec;
pub use length_order::{LengthOrderExec, TokenCountExec};
pub use rule::EmbedWriteRule;
pub use work_list::WorkListExec;
