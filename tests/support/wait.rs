//! Waiting in tests: for a condition the test can observe, with a deadline that fails the test
//! naming what never happened, never for a guessed time.

use std::time::{Duration, Instant};

/// How often a condition is checked.
const POLL: Duration = Duration::from_millis(20);

/// Waits until `condition` holds; fails the test naming `what` after `timeout`.
pub fn eventually(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(POLL);
    }
}
