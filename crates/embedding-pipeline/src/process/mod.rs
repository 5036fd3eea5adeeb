//! What belongs to the process rather than to a campaign: the request to stop that ctrl-C or SIGTERM makes
//! ([`interrupt`]), and the process's memory as Linux reports it ([`memory`]).

pub mod interrupt;
pub mod memory;
