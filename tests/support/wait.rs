//! Waiting in tests: for a condition the test can observe, with a deadline that fails the test
//! naming what never happened, never for a guessed time.

use std::time::{Duration, Instant};

/// How often a condition is checked.
const POLL: Duration = Duration::from_millis(20);

/// Waits until `condition` holds; fails the test naming `what` after `timeout`.
pub fn eventually(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    eventually_some(what, timeout, || condition().then_some(()));
}

/// Waits until `probe` returns a value and returns it; fails the test naming `what` after
/// `timeout`.
pub fn eventually_some<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(POLL);
    }
}
