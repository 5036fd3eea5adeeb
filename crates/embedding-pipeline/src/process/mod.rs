//! What belongs to the process rather than to a campaign: the request to stop that ctrl-C or SIGTERM makes
//! ([`interrupt::StopToken`], handed to the session that runs the work), and the process's memory as Linux reports
//! it ([`memory`]).

pub mod interrupt;
pub mod memory;
