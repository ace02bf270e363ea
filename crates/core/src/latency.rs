//! What TTFT and TPOT a request would see at a pod, learned online with no sidecar: vLLM
//! measures both for every request it serves and reports them as histograms
//! (`vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds`), which the
//! filter's scrapes already read. Over each window of scrapes the mean of each is set against
//! what the picker saw of the pod meanwhile (its queue and its running batch):
//! - TTFT is the prefill of the request's uncached prompt at the pod's pace (see
//!   [`crate::pace`]) plus the rest of it as a line in the pod's load (running plus waiting):
//!   how much a queued or batched request delays a first token is learned, not assumed, since
//!   a batching engine's queue drains by steps and a slot engine's by finishes. The slope is
//!   shared over the pool's pods where a pod's own load varied too little to tell. Before the
//!   pace is known, TTFT itself is the line;
//! - TPOT is a line in the running batch, fitted by weighted least squares with older
//!   windows counting less.
//!
//! At pick time a prediction is arithmetic on the pod's live load: no call, no allocation.

use crate::pace::Pace;

/// Cumulative latency counters of a vLLM pod, as one scrape shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LatencyTotals {
    pub ttft_seconds: f64,
    pub first_tokens: f64,
    pub inter_token_seconds: f64,
    pub inter_tokens: f64,
}

/// Windows are at least this long and hold a first token: a 50 ms scrape interval sees one
/// or none.
const WINDOW_MS: u64 = 1_000;
/// Scrapes further apart than this say nothing about the time between.
const MAX_GAP_MS: u64 = 10_000;
/// Each window's weight in the TPOT fit, relative to the one after it.
const FIT_DECAY: f64 = 0.9;
/// Inter-token gaps a window must hold to say anything about TPOT.
const MIN_INTER_TOKENS: f64 = 8.0;

/// What a window saw of the pod, time-weighted between its scrapes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Seen {
    waiting_s: f64,
    running_s: f64,
    span_s: f64,
}

/// A weighted least-squares line `y = a + b x` whose older points fade.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FadingLine {
    weight: f64,
    x: f64,
    xx: f64,
    y: f64,
    xy: f64,
}

impl FadingLine {
    fn add(&mut self, x: f64, y: f64) {
        let keep = FIT_DECAY;
        self.weight = self.weight * keep + 1.0;
        self.x = self.x * keep + x;
        self.xx = self.xx * keep + x * x;
        self.y = self.y * keep + y;
        self.xy = self.xy * keep + x * y;
    }

    /// Both lines' points in one: a pool's pods seen together.
    pub fn with(self, other: &FadingLine) -> FadingLine {
        FadingLine {
            weight: self.weight + other.weight,
            x: self.x + other.x,
            xx: self.xx + other.xx,
            y: self.y + other.y,
            xy: self.xy + other.xy,
        }
    }

    /// The slope, when the points spread in `x` enough to tell one; never below zero (a
    /// larger batch never makes a pod faster).
    pub fn slope(&self) -> Option<f64> {
        if self.weight <= 0.0 {
            return None;
        }
        let (mean_x, mean_y) = (self.x / self.weight, self.y / self.weight);
        let spread = self.xx / self.weight - mean_x * mean_x;
        let slope = (self.xy / self.weight - mean_x * mean_y) / spread;
        (spread > 0.25 && slope.is_finite()).then_some(slope.max(0.0))
    }

    /// The line at `x` with `slope` (its own, else `shared`, else flat); never below zero.
    fn at_with(&self, x: f64, shared: Option<f64>) -> Option<f64> {
        if self.weight <= 0.0 {
            return None;
        }
        let (mean_x, mean_y) = (self.x / self.weight, self.y / self.weight);
        let slope = self.slope().or(shared).unwrap_or(0.0);
        let value = mean_y + slope * (x - mean_x);
        value.is_finite().then_some(value.max(0.0))
    }

    fn at(&self, x: f64) -> Option<f64> {
        self.at_with(x, None)
    }
}

/// How TTFT grows with the batch across a pool, for pods whose own windows saw too little
/// spread in their batch to tell (see [`LatencyModel::ttft_s`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SharedSlopes {
    pub unexplained: Option<f64>,
    pub direct: Option<f64>,
}

impl SharedSlopes {
    /// The slopes of every model's points together.
    pub fn of<'a>(models: impl Iterator<Item = &'a LatencyModel>) -> SharedSlopes {
        let (unexplained, direct) = models.fold(
            (FadingLine::default(), FadingLine::default()),
            |(u, d), m| (u.with(&m.ttft_unexplained), d.with(&m.ttft)),
        );
        SharedSlopes {
            unexplained: unexplained.slope(),
            direct: direct.slope(),
        }
    }
}

/// A pod's learned latency.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencyModel {
    /// The counters, the prompt tokens it had computed, and their time at the window's start.
    window: Option<(u64, LatencyTotals, f64)>,
    /// The last scrape's time, queue and running batch.
    last: Option<(u64, f64, f64)>,
    seen: Seen,
    /// TTFT less the prefill of the window's mean prompt, against the load.
    ttft_unexplained: FadingLine,
    /// TTFT against the load, for a pod whose prefill pace is not known yet.
    ttft: FadingLine,
    tpot: FadingLine,
}

/// One window's means, as [`LatencyModel::observe`] learns from them.
struct Window {
    ttft_s: f64,
    waiting: f64,
    running: f64,
    computed_tokens_per_request: Option<f64>,
    tpot_s: Option<f64>,
}

impl LatencyModel {
    /// The counters scraped at `at_ms` with the pod's queue and running batch then, and the
    /// prompt tokens it has computed in all (`None` when the page lacks the counter).
    pub fn observe(
        &mut self,
        at_ms: u64,
        totals: LatencyTotals,
        load: (f64, f64),
        computed_tokens: Option<f64>,
        pace: &Pace,
    ) {
        let finite = |v: f64| if v.is_finite() { v.max(0.0) } else { 0.0 };
        let (waiting, running) = (finite(load.0), finite(load.1));
        let gap_ms = match self.last {
            Some((last_ms, _, _)) if at_ms <= last_ms => return,
            Some((last_ms, last_waiting, last_running)) => {
                let gap_s = (at_ms - last_ms) as f64 / 1000.0;
                self.seen.waiting_s += last_waiting * gap_s;
                self.seen.running_s += last_running * gap_s;
                self.seen.span_s += gap_s;
                at_ms - last_ms
            }
            None => 0,
        };
        self.last = Some((at_ms, waiting, running));
        let tokens = computed_tokens.unwrap_or(f64::NAN);
        let Some((start_ms, start, start_tokens)) = self.window.filter(|_| gap_ms <= MAX_GAP_MS)
        else {
            self.restart(at_ms, totals, tokens);
            return;
        };
        let first_tokens = totals.first_tokens - start.first_tokens;
        let ttft_seconds = totals.ttft_seconds - start.ttft_seconds;
        if first_tokens < 0.0 || ttft_seconds < 0.0 {
            self.restart(at_ms, totals, tokens);
            return;
        }
        if at_ms.saturating_sub(start_ms) < WINDOW_MS || first_tokens < 1.0 {
            return;
        }
        let span = self.seen.span_s.max(f64::MIN_POSITIVE);
        let inter_tokens = totals.inter_tokens - start.inter_tokens;
        let window = Window {
            ttft_s: ttft_seconds / first_tokens,
            waiting: self.seen.waiting_s / span,
            running: self.seen.running_s / span,
            computed_tokens_per_request: Some((tokens - start_tokens) / first_tokens)
                .filter(|t| t.is_finite() && *t >= 0.0),
            tpot_s: (inter_tokens >= MIN_INTER_TOKENS)
                .then(|| (totals.inter_token_seconds - start.inter_token_seconds) / inter_tokens),
        };
        self.learn(&window, pace);
        self.restart(at_ms, totals, tokens);
    }

    fn learn(&mut self, window: &Window, pace: &Pace) {
        if !(window.ttft_s.is_finite() && window.ttft_s >= 0.0) {
            return;
        }
        let load = window.waiting + window.running;
        self.ttft.add(load, window.ttft_s);
        let prefill = window
            .computed_tokens_per_request
            .and_then(|tokens| pace.prefill_s(tokens));
        if let Some(prefill) = prefill.filter(|p| p.is_finite()) {
            self.ttft_unexplained.add(load, window.ttft_s - prefill);
        }
        if let Some(tpot) = window.tpot_s.filter(|t| t.is_finite() && *t >= 0.0) {
            self.tpot.add(window.running, tpot);
        }
    }

    fn restart(&mut self, at_ms: u64, totals: LatencyTotals, tokens: f64) {
        self.window = Some((at_ms, totals, tokens));
        self.seen = Seen::default();
    }

    /// Expected TTFT in seconds for a request placed now behind `waiting` requests with
    /// `running` in the batch, `uncached_tokens` of its prompt to prefill; `None` while
    /// nothing was learned.
    pub fn ttft_s(
        &self,
        pace: &Pace,
        (waiting, running): (f64, f64),
        uncached_tokens: f64,
        shared: SharedSlopes,
    ) -> Option<f64> {
        let load = waiting.max(0.0) + running.max(0.0);
        // With no load spread seen anywhere yet, a request of load costs what the pace says
        // one more in the queue does: its service time over the batch.
        let prior = pace.wait_s(1.0, running.max(1.0)).filter(|s| s.is_finite());
        let modelled = self
            .ttft_unexplained
            .at_with(load, shared.unexplained.or(prior))
            .and_then(|rest| Some(rest + pace.prefill_s(uncached_tokens)?));
        modelled
            .or_else(|| self.ttft.at_with(load, shared.direct.or(prior)))
            .filter(|t| t.is_finite())
    }

    /// Expected seconds per output token with `running` requests in the batch (this one
    /// included).
    pub fn tpot_s(&self, running: f64) -> Option<f64> {
        self.tpot.at(running)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::pace::WorkTotals;

    /// `sums` as they stood before its last `served` first tokens of `ttft` each.
    fn sums_before(sums: &LatencyTotals, served: f64, ttft: f64) -> LatencyTotals {
        LatencyTotals {
            first_tokens: sums.first_tokens - served,
            ttft_seconds: sums.ttft_seconds - served * ttft,
            ..*sums
        }
    }

    fn totals(first: f64, ttft: f64, inter: f64, itl: f64) -> LatencyTotals {
        LatencyTotals {
            ttft_seconds: ttft,
            first_tokens: first,
            inter_token_seconds: itl,
            inter_tokens: inter,
        }
    }

    #[test]
    fn learns_ttft_against_the_load_and_the_prompt() {
        let mut model = LatencyModel::default();
        let pace = Pace::default();
        model.observe(0, totals(0.0, 0.0, 0.0, 0.0), (0.0, 1.0), Some(0.0), &pace);
        let none = SharedSlopes::default();
        assert_eq!(
            model.ttft_s(&pace, (0.0, 1.0), 100.0, none),
            None,
            "nothing learned"
        );
        model.observe(
            1000,
            totals(4.0, 0.2, 40.0, 0.4),
            (0.0, 1.0),
            Some(400.0),
            &pace,
        );
        let ttft = model.ttft_s(&pace, (0.0, 1.0), 100.0, none).unwrap();
        assert!((ttft - 0.05).abs() < 1e-9, "the mean: {ttft}");
        // With a prefill pace of 0.1 ms a token, windows at a load of 2 (60 ms) and of 6
        // (400 ms): the load's cost is learned, and the prompt's is the pace's.
        let mut paced = Pace::default();
        paced.observe(0, WorkTotals::default(), 2.0);
        paced.observe(
            1000,
            WorkTotals {
                finished: 2.0,
                prefill_seconds: 0.01,
                computed_prompt_tokens: 100.0,
            },
            2.0,
        );
        let mut model = LatencyModel::default();
        let mut sums = totals(0.0, 0.0, 0.0, 0.0);
        let mut tokens = 0.0;
        model.observe(0, sums, (0.0, 2.0), Some(tokens), &paced);
        for (second, (waiting, ttft)) in [(0.0, 0.06), (4.0, 0.4), (0.0, 0.06), (4.0, 0.4)]
            .into_iter()
            .enumerate()
        {
            sums.first_tokens += 2.0;
            sums.ttft_seconds += 2.0 * ttft;
            tokens += 200.0;
            let at = (second as u64 + 1) * 1000;
            // The load holds through the window: one scrape at its start, one at its end.
            model.observe(
                at - 500,
                sums_before(&sums, 2.0, ttft),
                (waiting, 2.0),
                Some(tokens - 200.0),
                &paced,
            );
            model.observe(at, sums, (waiting, 2.0), Some(tokens), &paced);
        }
        let idle = model.ttft_s(&paced, (0.0, 2.0), 100.0, none).unwrap();
        let loaded = model.ttft_s(&paced, (4.0, 2.0), 100.0, none).unwrap();
        let longer = model.ttft_s(&paced, (0.0, 2.0), 1000.0, none).unwrap();
        assert!(loaded > idle + 0.2, "idle {idle}, loaded {loaded}");
        assert!(
            (longer - idle - 0.09).abs() < 1e-6,
            "900 more tokens at 0.1 ms"
        );
    }

    #[test]
    fn tpot_grows_with_the_batch_it_was_seen_at() {
        let mut model = LatencyModel::default();
        let pace = Pace::default();
        let mut at = 0;
        let mut sums = totals(0.0, 0.0, 0.0, 0.0);
        model.observe(at, sums, (0.0, 1.0), None, &pace);
        for running in [1.0, 4.0, 1.0, 4.0, 8.0, 8.0] {
            // 10 ms a token alone, plus 2 ms for each other request in the batch.
            let itl = 0.010 + 0.002 * (running - 1.0);
            for _ in 0..2 {
                at += 600;
                sums.first_tokens += 1.0;
                sums.ttft_seconds += 0.05;
                sums.inter_tokens += 50.0;
                sums.inter_token_seconds += 50.0 * itl;
                model.observe(at, sums, (0.0, running), None, &pace);
            }
        }
        let alone = model.tpot_s(1.0).unwrap();
        let busy = model.tpot_s(8.0).unwrap();
        assert!(busy > alone, "{alone} {busy}");
        assert!((busy - 0.024).abs() < 0.004, "{busy}");
    }

    #[test]
    fn hostile_counters_leave_what_was_learned() {
        let mut model = LatencyModel::default();
        let pace = Pace::default();
        model.observe(0, totals(0.0, 0.0, 0.0, 0.0), (0.0, 1.0), None, &pace);
        model.observe(1000, totals(2.0, 0.1, 0.0, 0.0), (0.0, 1.0), None, &pace);
        let learned = model;
        model.observe(
            2000,
            totals(4.0, f64::INFINITY, 0.0, 0.0),
            (f64::NAN, 1.0),
            None,
            &pace,
        );
        model.observe(3000, totals(1.0, 0.0, 0.0, 0.0), (0.0, 1.0), None, &pace);
        assert_eq!(
            model.ttft_s(&pace, (0.0, 1.0), 0.0, SharedSlopes::default()),
            learned.ttft_s(&pace, (0.0, 1.0), 0.0, SharedSlopes::default())
        );
    }
}
