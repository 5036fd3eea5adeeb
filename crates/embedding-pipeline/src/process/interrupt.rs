//! A request to stop ([`StopToken`]): made by ctrl-C or SIGTERM (the command's signal handler, the Python package's
//! KeyboardInterrupt), honoured by the Lance sink at the next batch boundary, after it has committed the rows it
//! holds, and by model calls not yet started. It travels with the session that runs the work (its
//! [`crate::campaign::metrics::RunMetrics`], which the sink, the `embed()` function and the write path's nodes
//! share): whoever may ask holds a clone, and nothing is process-wide.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// One session's request to stop; clones share it. A new token has not been asked.
#[derive(Debug, Clone, Default)]
pub struct StopToken(Arc<AtomicBool>);

impl StopToken {
    pub fn new() -> Self {
        Self::default()
    }

    /// Ask the work this token travels with to commit what it has and stop.
    pub fn request(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether a stop was asked for.
    pub fn requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Forget a stop that was honoured: `pipeline sql` goes on to its next statement.
    pub fn clear(&self) {
        self.0.store(false, Ordering::SeqCst);
    }

    /// Resolves once a stop was asked for (polled every 200 ms): for waits that have nothing of their own to check.
    pub async fn stopped(&self) {
        while !self.requested() {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::StopToken;

    #[test]
    fn a_request_reaches_every_clone_and_no_other_token() {
        let (session, handler, other) = (StopToken::new(), StopToken::new(), StopToken::new());
        let handler_of_session = session.clone();
        assert!(!session.requested());
        handler_of_session.request();
        assert!(session.requested() && handler_of_session.requested());
        assert!(!handler.requested() && !other.requested(), "a token is not process-wide");
        session.clear();
        assert!(!handler_of_session.requested());
    }
}
