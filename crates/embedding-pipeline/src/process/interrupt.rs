//! A process-wide request to stop: set by ctrl-C or SIGTERM, honoured by the Lance sink at the next
//! batch boundary, after it has committed the rows it holds.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

/// Ask running writes to commit what they have and stop.
pub fn request_stop() {
    STOP.store(true, Ordering::SeqCst);
}

/// Whether a stop was asked for.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Forget a stop that was honoured: `pipeline sql` goes on to its next statement.
pub fn clear_stop() {
    STOP.store(false, Ordering::SeqCst);
}

/// Resolves once a stop was asked for (polled every 200 ms): for waits that have nothing of their own to check.
pub async fn stopped() {
    while !stop_requested() {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
