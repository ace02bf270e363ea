//! How the last decision is shown: one log line, one row per candidate, or the first
//! profile's totals as JSON.

use super::Scheduler;
use crate::endpoint::{Health, Pool};
use std::fmt::Write;

impl Scheduler {
    /// The first profile's weighted totals in the last decision, as a JSON object
    /// `{"ip:port": total, ...}` over every endpoint it scored.
    pub fn scores_json(&self, pool: &Pool) -> String {
        let mut json = String::from("{");
        if let Some(trace) = self.traces.iter().take(self.traces_used).next() {
            for (i, &endpoint) in trace.candidates.iter().enumerate() {
                let (Some(address), Some(total)) = (pool.get(endpoint), trace.totals.get(i)) else {
                    continue;
                };
                if json.len() > 1 {
                    json.push(',');
                }
                let total = if total.is_finite() { *total } else { 0.0 };
                let _ = write!(json, "\"{}\":{total:.4}", address.address);
            }
        }
        json.push('}');
        json
    }

    /// One line describing the last decision: per profile, every candidate's total and every
    /// scorer's score. Only built when someone will read it.
    pub fn explain(&self, pool: &Pool) -> String {
        let mut line = String::new();
        let mut profile = "";
        for row in self.explain_rows(pool) {
            if row.profile != profile {
                if !profile.is_empty() {
                    line.push_str("] ");
                }
                profile = row.profile;
                let _ = write!(line, "profile={profile} candidates=[");
            } else {
                line.push_str(", ");
            }
            let _ = write!(line, "{} total={:.3} (", row.address, row.total);
            for (k, (name, score, weight)) in row.scores.iter().enumerate() {
                let _ = write!(
                    line,
                    "{}{name}={score:.3}x{weight}",
                    if k > 0 { " " } else { "" }
                );
            }
            line.push(')');
            // The load the scores read: the pod's last report plus what was placed there
            // since (by this Envoy and, with `pool.peers`, by the other replicas).
            if let Some(running) = row.running {
                let _ = write!(line, " running={running:.1}");
            }
            if let Some(waiting) = row.waiting {
                let _ = write!(line, " waiting={waiting:.1}");
            }
            if let Some(age) = row.stale_metrics_age_ms {
                let _ = write!(line, " stale_metrics_age_ms={age}");
            }
            if let Some(ttft) = row.predicted_ttft_ms {
                let _ = write!(line, " predicted_ttft_ms={ttft:.0}");
            }
        }
        if !profile.is_empty() {
            line.push(']');
        }
        line
    }

    /// The last decision, one row per profile and candidate, in the order they ran.
    pub fn explain_rows<'a>(&'a self, pool: &'a Pool) -> Vec<ExplainRow<'a>> {
        let mut rows = Vec::new();
        for trace in self.traces.iter().take(self.traces_used) {
            let Some(profile) = self.profiles.get(trace.profile) else {
                continue;
            };
            let n = trace.candidates.len();
            for (i, &endpoint) in trace.candidates.iter().enumerate() {
                let scores = profile
                    .scorers
                    .iter()
                    .enumerate()
                    .map(|(k, scorer)| {
                        let name = self
                            .plugins
                            .get(scorer.plugin)
                            .map_or("?", |p| p.name.as_str());
                        let score = trace.scores.get(k * n + i).copied().unwrap_or(0.0);
                        (name, score, scorer.weight)
                    })
                    .collect();
                let predicted = self.cycle.latency.as_ref().and_then(|l| l.get(endpoint));
                let state = pool.get(endpoint);
                let stale_metrics_age_ms = state
                    .filter(|e| e.health == Health::Stale)
                    .and_then(|e| e.last_scrape_ok_ms)
                    .map(|at| pool.now_ms().saturating_sub(at));
                rows.push(ExplainRow {
                    profile: profile.name.as_str(),
                    address: state.map_or("?", |e| e.address.as_str()),
                    total: trace.totals.get(i).copied().unwrap_or(0.0),
                    scores,
                    running: trace.loads.get(i).and_then(|load| load.0),
                    waiting: trace.loads.get(i).and_then(|load| load.1),
                    predicted_ttft_ms: predicted.map(|p| p.ttft_ms),
                    stale_metrics_age_ms,
                });
            }
        }
        rows
    }
}

/// One candidate of one profile in the last decision.
#[derive(Debug, Clone, PartialEq)]
pub struct ExplainRow<'a> {
    pub profile: &'a str,
    pub address: &'a str,
    pub total: f64,
    /// `(scorer name, clamped score, weight)`.
    pub scores: Vec<(&'a str, f64, f64)>,
    /// Requests running and waiting there as the scorers read them (see `Pool::running`).
    pub running: Option<f64>,
    pub waiting: Option<f64>,
    /// `predicted-latency-producer`'s TTFT for the request there, ms.
    pub predicted_ttft_ms: Option<f64>,
    /// How old its metrics are, when they are past the staleness threshold (its `/metrics`
    /// answers late): the load above is that reading plus what was placed since.
    pub stale_metrics_age_ms: Option<u64>,
}
