//! How fast a pod works, learned from the counters it reports: seconds a request holds a
//! running slot, and seconds of prefill per prompt token it computes. These are the terms of
//! a spill's cost: the wait behind a busy pod (its queue, times a request's service time, over
//! its slots) against the cold prefill a prefix would cost elsewhere (its tokens times the
//! seconds per token).

/// Cumulative counters of a vLLM pod (`vllm:request_success_total`,
/// `vllm:request_prefill_time_seconds_sum`, `vllm:prompt_tokens_by_source_total{source=
/// "local_compute"}`), as one scrape shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WorkTotals {
    pub finished: f64,
    pub prefill_seconds: f64,
    pub computed_prompt_tokens: f64,
}

/// Counters are read over windows at least this long and holding a finished request, so that
/// a 50 ms scrape interval, which sees a finish or none, still gives a rate.
const WINDOW_MS: u64 = 1_000;
/// Scrapes further apart than this (failed ones between, or pages without the counters) say
/// nothing about the time between: the window starts again.
const MAX_GAP_MS: u64 = 10_000;
/// Weight of the newest window in the smoothed values: a late tick or one odd window moves
/// them by a fraction, a lasting change within a few seconds.
const NEWEST_WEIGHT: f64 = 0.3;
/// Prompt tokens a window must have computed to say anything about prefill speed.
const MIN_TOKENS: f64 = 64.0;

/// A pod's learned pace.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pace {
    /// The counters and their time at the start of the current window.
    window: Option<(u64, WorkTotals)>,
    /// The last scrape's time and running count.
    last: Option<(u64, f64)>,
    /// Running slot-seconds since the window began (Little's law: slot-seconds over finishes
    /// is a request's service time, whatever share of the window the pod sat idle).
    busy_slot_s: f64,
    /// Seconds a request holds a running slot, start to finish.
    pub service_s: Option<f64>,
    /// Seconds of prefill per prompt token the pod computed (not served from its cache).
    pub prefill_s_per_token: Option<f64>,
}

impl Pace {
    /// Counters and the running count scraped at `at_ms`: closes the window when it is long
    /// enough and saw a request finish. Counters that went down (the pod restarted) start a
    /// new window and keep what was learned.
    pub fn observe(&mut self, at_ms: u64, totals: WorkTotals, running: f64) {
        let running = if running.is_finite() {
            running.max(0.0)
        } else {
            0.0
        };
        let gap_ms = match self.last {
            // An older scrape (another worker's, after a failure) is not a later one.
            Some((last_ms, _)) if at_ms <= last_ms => return,
            Some((last_ms, last_running)) => {
                let gap_ms = at_ms - last_ms;
                self.busy_slot_s += last_running * gap_ms as f64 / 1000.0;
                gap_ms
            }
            None => 0,
        };
        self.last = Some((at_ms, running));
        let Some((start_ms, start)) = self.window.filter(|_| gap_ms <= MAX_GAP_MS) else {
            self.restart(at_ms, totals);
            return;
        };
        let finished = totals.finished - start.finished;
        let seconds = totals.prefill_seconds - start.prefill_seconds;
        let tokens = totals.computed_prompt_tokens - start.computed_prompt_tokens;
        if finished < 0.0 || seconds < 0.0 || tokens < 0.0 {
            self.restart(at_ms, totals);
            return;
        }
        if at_ms.saturating_sub(start_ms) < WINDOW_MS || finished < 1.0 {
            return;
        }
        self.service_s = smooth(self.service_s, self.busy_slot_s / finished);
        if tokens >= MIN_TOKENS {
            self.prefill_s_per_token = smooth(self.prefill_s_per_token, seconds / tokens);
        }
        self.restart(at_ms, totals);
    }

    fn restart(&mut self, at_ms: u64, totals: WorkTotals) {
        self.window = Some((at_ms, totals));
        self.busy_slot_s = 0.0;
    }

    /// Seconds a request placed now waits behind `waiting` requests for one of `slots`;
    /// `None` while the service time is unknown.
    pub fn wait_s(&self, waiting: f64, slots: f64) -> Option<f64> {
        let service_s = self.service_s?;
        Some(waiting.max(0.0) * service_s / slots.max(1.0))
    }

    /// Seconds this pod takes to prefill `tokens` it does not hold.
    pub fn prefill_s(&self, tokens: f64) -> Option<f64> {
        self.prefill_s_per_token.map(|s| s * tokens)
    }
}

/// `held` moved towards `newest`; a sample that is not a finite, non-negative number (a
/// hostile page's counters) leaves it as it was.
fn smooth(held: Option<f64>, newest: f64) -> Option<f64> {
    if !newest.is_finite() || newest < 0.0 {
        return held;
    }
    match held {
        Some(held) => Some(held + NEWEST_WEIGHT * (newest - held)),
        None => Some(newest),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    fn totals(finished: f64, prefill_seconds: f64, tokens: f64) -> WorkTotals {
        WorkTotals {
            finished,
            prefill_seconds,
            computed_prompt_tokens: tokens,
        }
    }

    #[test]
    fn service_time_is_slot_seconds_over_finishes_whatever_the_idle_time() {
        let mut pace = Pace::default();
        pace.observe(0, totals(0.0, 0.0, 0.0), 2.0);
        pace.observe(500, totals(1.0, 0.1, 500.0), 2.0);
        assert_eq!(pace.service_s, None, "half a window says nothing");
        // 2 slots busy for 1 s, then idle for 3 s: 2 slot-seconds over 4 finishes.
        pace.observe(1_000, totals(4.0, 0.4, 2_000.0), 0.0);
        pace.observe(4_000, totals(4.0, 0.4, 2_000.0), 0.0);
        assert_eq!(pace.service_s, Some(0.5));
        assert_eq!(pace.prefill_s_per_token, Some(0.0002));
        assert_eq!(pace.wait_s(4.0, 2.0), Some(1.0));
        assert_eq!(pace.wait_s(0.0, 2.0), Some(0.0));
        assert_eq!(pace.prefill_s(1_000.0), Some(0.2));
    }

    #[test]
    fn one_odd_window_moves_the_values_by_a_fraction() {
        let mut pace = Pace::default();
        pace.observe(0, totals(0.0, 0.0, 0.0), 1.0);
        pace.observe(1_000, totals(10.0, 0.1, 1_000.0), 1.0);
        assert_eq!(pace.service_s, Some(0.1));
        pace.observe(2_000, totals(11.0, 0.1, 1_010.0), 1.0);
        let service = pace.service_s.unwrap();
        assert!((service - 0.37).abs() < 1e-9, "{service}");
        assert_eq!(
            pace.prefill_s_per_token,
            Some(0.0001),
            "too few tokens to learn from"
        );
    }

    #[test]
    fn a_restart_keeps_what_was_learned_and_unknown_service_gives_no_wait() {
        let mut pace = Pace::default();
        assert_eq!(pace.wait_s(3.0, 1.0), None);
        assert_eq!(pace.wait_s(0.0, 1.0), None);
        pace.observe(0, totals(100.0, 1.0, 10_000.0), 1.0);
        pace.observe(1_000, totals(110.0, 1.1, 11_000.0), 1.0);
        pace.observe(2_000, totals(2.0, 0.0, 100.0), 1.0);
        assert_eq!(pace.service_s, Some(0.1));
        pace.observe(3_000, totals(4.0, 0.1, 1_100.0), 1.0);
        let service = pace.service_s.unwrap();
        assert!((service - 0.22).abs() < 1e-9, "{service}");
    }

    #[test]
    fn hostile_counters_and_old_or_distant_scrapes_leave_the_pace_as_it_was() {
        let mut pace = Pace::default();
        pace.observe(0, totals(0.0, 0.0, 0.0), 1.0);
        pace.observe(1_000, totals(10.0, 1.0, 1_000.0), 1.0);
        let learned = (pace.service_s, pace.prefill_s_per_token);
        assert_eq!(learned, (Some(0.1), Some(0.001)));
        // A running count that overflows the slot-seconds, and counters at the float limit.
        pace.observe(2_000, totals(20.0, 2.0, 2_000.0), 1e308);
        pace.observe(3_000, totals(30.0, f64::MAX, 3_000.0), 1.0);
        pace.observe(4_000, totals(f64::MAX, f64::MAX, f64::MAX), f64::NAN);
        pace.observe(5_000, totals(f64::INFINITY, 0.0, f64::NAN), f64::INFINITY);
        for value in [pace.service_s, pace.prefill_s_per_token] {
            assert!(value.is_some_and(|v| v.is_finite() && v >= 0.0), "{pace:?}");
        }
        // An older scrape, then one after a long gap: neither is read as time the pod worked.
        let mut pace = Pace::default();
        pace.observe(10_000, totals(0.0, 0.0, 0.0), 2.0);
        pace.observe(5_000, totals(5.0, 0.0, 0.0), 2.0);
        pace.observe(60_000, totals(6.0, 0.6, 600.0), 2.0);
        assert_eq!(pace.service_s, None, "a new window began after the gap");
        pace.observe(61_000, totals(10.0, 1.0, 1_000.0), 2.0);
        assert_eq!(pace.service_s, Some(0.5));
    }
}
