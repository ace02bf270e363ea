//! The scheduling core: filters -> weighted scorers -> picker, per profile, with GIE semantics.
//! Plugins are plain Rust objects over plain data; nothing here knows about the proxy.

pub mod plugins;
pub mod prefix_index;
pub mod rng;

use crate::endpoint::{Health, Pool};
use crate::request::InferenceRequest;
use rng::Rng;
use std::fmt::Write;

/// Everything a plugin may read about one scheduling cycle.
pub struct SchedulingContext<'a> {
    pub request: &'a InferenceRequest,
    pub pool: &'a Pool,
}

/// Removes candidates (endpoint indices into the pool). Order of the survivors is kept.
pub trait Filter {
    fn filter(&mut self, ctx: &SchedulingContext<'_>, candidates: &mut Vec<usize>);
}

/// Scores each candidate in [0, 1]; `scores[i]` belongs to `candidates[i]` and starts at 0.
pub trait Scorer {
    fn score(&mut self, ctx: &SchedulingContext<'_>, candidates: &[usize], scores: &mut [f64]);

    /// Called with the profile's primary pick, so stateful scorers (the prefix index) learn.
    fn on_picked(&mut self, _ctx: &SchedulingContext<'_>, _endpoint: usize) {}
}

/// Orders the chosen endpoints, primary first, into `picked`.
pub trait Picker {
    fn pick(&self, candidates: &[usize], totals: &[f64], rng: &mut Rng, picked: &mut Vec<usize>);
}

/// Decides which profiles run, in which order, and whose result routes the request.
pub trait ProfileHandler {
    fn next_profile(&self, profiles: &[Profile], results: &[ProfileResult]) -> Option<usize>;
    /// Index into `results` of the result that routes the request.
    fn primary_result(&self, profiles: &[Profile], results: &[ProfileResult]) -> usize;
}

pub enum Plugin {
    Filter(Box<dyn Filter>),
    Scorer(Box<dyn Scorer>),
    Picker(Box<dyn Picker>),
    ProfileHandler(Box<dyn ProfileHandler>),
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind())
    }
}

impl Plugin {
    pub fn kind(&self) -> &'static str {
        match self {
            Plugin::Filter(_) => "filter",
            Plugin::Scorer(_) => "scorer",
            Plugin::Picker(_) => "picker",
            Plugin::ProfileHandler(_) => "profile handler",
        }
    }
}

pub struct PluginInstance {
    pub name: String,
    pub type_name: &'static str,
    pub plugin: Plugin,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WeightedScorer {
    pub plugin: usize,
    pub weight: f64,
}

/// A scheduling profile, its plugins given as indices into the scheduler's plugin list.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: String,
    pub filters: Vec<usize>,
    pub scorers: Vec<WeightedScorer>,
    pub picker: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileResult {
    pub profile: usize,
    /// Primary first, then fallbacks.
    pub targets: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub results: Vec<ProfileResult>,
    /// Index into `results` of the result that routes the request.
    pub primary: usize,
    /// True when no endpoint had fresh metrics and the least-loaded reachable one was taken.
    pub degraded: bool,
}

impl Decision {
    pub fn targets(&self) -> &[usize] {
        self.results
            .get(self.primary)
            .map_or(&[], |result| result.targets.as_slice())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleError {
    /// Every endpoint failed its last scrape (503).
    NoReachableEndpoint,
    /// A profile's filters removed every candidate (429).
    FilteredOut { profile: String },
}

impl std::fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScheduleError::NoReachableEndpoint => {
                write!(f, "no model server endpoint is reachable")
            }
            ScheduleError::FilteredOut { profile } => {
                write!(
                    f,
                    "no endpoint passed the filters of scheduling profile {profile:?}"
                )
            }
        }
    }
}

/// What one profile saw and scored, kept for the decision log.
#[derive(Debug, Clone, Default)]
struct ProfileTrace {
    profile: usize,
    candidates: Vec<usize>,
    /// Scorer-major: `scores[k * n + i]` is scorer k's score for candidate i.
    scores: Vec<f64>,
    totals: Vec<f64>,
}

pub struct Scheduler {
    plugins: Vec<PluginInstance>,
    profiles: Vec<Profile>,
    handler: usize,
    rng: Rng,
    base: Vec<usize>,
    traces: Vec<ProfileTrace>,
    traces_used: usize,
}

impl Scheduler {
    /// Built by the config loader, which has already checked every index.
    pub fn new(
        plugins: Vec<PluginInstance>,
        profiles: Vec<Profile>,
        handler: usize,
        seed: u64,
    ) -> Self {
        Scheduler {
            plugins,
            profiles,
            handler,
            rng: Rng::new(seed),
            base: Vec::new(),
            traces: Vec::new(),
            traces_used: 0,
        }
    }

    pub fn profiles(&self) -> &[Profile] {
        &self.profiles
    }

    pub fn plugins(&self) -> &[PluginInstance] {
        &self.plugins
    }

    pub fn reseed(&mut self, seed: u64) {
        self.rng = Rng::new(seed);
    }

    /// Picks the endpoints for one request.
    pub fn schedule(&mut self, ctx: &SchedulingContext<'_>) -> Result<Decision, ScheduleError> {
        self.traces_used = 0;
        self.base.clear();
        self.base.extend(
            ctx.pool
                .endpoints
                .iter()
                .enumerate()
                .filter(|(_, endpoint)| endpoint.health == Health::Fresh)
                .map(|(index, _)| index),
        );
        if self.base.is_empty() {
            return least_in_flight_reachable(ctx.pool);
        }
        let mut results: Vec<ProfileResult> = Vec::with_capacity(self.profiles.len());
        while results.len() < self.profiles.len() {
            let Some(profile) = self.next_profile(&results) else {
                break;
            };
            let targets = self.run_profile(ctx, profile)?;
            results.push(ProfileResult { profile, targets });
        }
        let primary = match self.plugins.get(self.handler).map(|p| &p.plugin) {
            Some(Plugin::ProfileHandler(handler)) => {
                handler.primary_result(&self.profiles, &results)
            }
            _ => 0,
        };
        self.learn(ctx, &results);
        Ok(Decision {
            results,
            primary,
            degraded: false,
        })
    }

    fn next_profile(&self, results: &[ProfileResult]) -> Option<usize> {
        match self.plugins.get(self.handler).map(|p| &p.plugin) {
            Some(Plugin::ProfileHandler(handler)) => handler
                .next_profile(&self.profiles, results)
                .filter(|&profile| profile < self.profiles.len()),
            _ => None,
        }
    }

    fn run_profile(
        &mut self,
        ctx: &SchedulingContext<'_>,
        profile_index: usize,
    ) -> Result<Vec<usize>, ScheduleError> {
        let Scheduler {
            plugins,
            profiles,
            rng,
            base,
            traces,
            traces_used,
            ..
        } = self;
        let Some(profile) = profiles.get(profile_index) else {
            return Ok(Vec::new());
        };
        if *traces_used == traces.len() {
            traces.push(ProfileTrace::default());
        }
        let Some(trace) = traces.get_mut(*traces_used) else {
            return Ok(Vec::new());
        };
        *traces_used += 1;
        trace.profile = profile_index;
        trace.candidates.clear();
        trace.candidates.extend_from_slice(base);
        for &filter in &profile.filters {
            if let Some(PluginInstance {
                plugin: Plugin::Filter(filter),
                ..
            }) = plugins.get_mut(filter)
            {
                filter.filter(ctx, &mut trace.candidates);
            }
        }
        if trace.candidates.is_empty() {
            return Err(ScheduleError::FilteredOut {
                profile: profile.name.clone(),
            });
        }
        let n = trace.candidates.len();
        trace.scores.clear();
        trace.scores.resize(n * profile.scorers.len(), 0.0);
        trace.totals.clear();
        trace.totals.resize(n, 0.0);
        for (scorer, scores) in profile.scorers.iter().zip(trace.scores.chunks_mut(n)) {
            if let Some(PluginInstance {
                plugin: Plugin::Scorer(plugin),
                ..
            }) = plugins.get_mut(scorer.plugin)
            {
                plugin.score(ctx, &trace.candidates, scores);
            }
            for (total, score) in trace.totals.iter_mut().zip(scores.iter_mut()) {
                *score = clamp_score(*score);
                *total += scorer.weight * *score;
            }
        }
        let mut picked = Vec::with_capacity(1);
        if let Some(PluginInstance {
            plugin: Plugin::Picker(picker),
            ..
        }) = plugins.get(profile.picker)
        {
            picker.pick(&trace.candidates, &trace.totals, rng, &mut picked);
        }
        if picked.is_empty() {
            return Err(ScheduleError::FilteredOut {
                profile: profile.name.clone(),
            });
        }
        Ok(picked)
    }

    fn learn(&mut self, ctx: &SchedulingContext<'_>, results: &[ProfileResult]) {
        for result in results {
            let (Some(profile), Some(&endpoint)) =
                (self.profiles.get(result.profile), result.targets.first())
            else {
                continue;
            };
            for scorer in &profile.scorers {
                if let Some(PluginInstance {
                    plugin: Plugin::Scorer(plugin),
                    ..
                }) = self.plugins.get_mut(scorer.plugin)
                {
                    plugin.on_picked(ctx, endpoint);
                }
            }
        }
    }

    /// One line describing the last decision: per profile, every candidate's total and every
    /// scorer's score. Only built when someone will read it.
    pub fn explain(&self, pool: &Pool) -> String {
        let mut line = String::new();
        for trace in self.traces.iter().take(self.traces_used) {
            let Some(profile) = self.profiles.get(trace.profile) else {
                continue;
            };
            let _ = write!(line, "profile={} candidates=[", profile.name);
            let n = trace.candidates.len();
            for (i, &endpoint) in trace.candidates.iter().enumerate() {
                let address = pool.get(endpoint).map_or("?", |e| e.address.as_str());
                let total = trace.totals.get(i).copied().unwrap_or(0.0);
                let _ = write!(
                    line,
                    "{}{address} total={total:.3} (",
                    if i > 0 { ", " } else { "" }
                );
                for (k, scorer) in profile.scorers.iter().enumerate() {
                    let name = self
                        .plugins
                        .get(scorer.plugin)
                        .map_or("?", |p| p.name.as_str());
                    let score = trace.scores.get(k * n + i).copied().unwrap_or(0.0);
                    let _ = write!(
                        line,
                        "{}{name}={score:.3}x{}",
                        if k > 0 { " " } else { "" },
                        scorer.weight
                    );
                }
                line.push(')');
            }
            line.push_str("] ");
        }
        line.truncate(line.trim_end().len());
        line
    }
}

/// GIE clamps every score to [0, 1]; a NaN from a broken scorer counts as 0.
pub fn clamp_score(score: f64) -> f64 {
    if score.is_nan() {
        0.0
    } else {
        score.clamp(0.0, 1.0)
    }
}

/// With no fresh metrics anywhere, route by the filter's own load so traffic keeps flowing.
fn least_in_flight_reachable(pool: &Pool) -> Result<Decision, ScheduleError> {
    let target = pool
        .endpoints
        .iter()
        .enumerate()
        .filter(|(_, endpoint)| endpoint.health != Health::Unreachable)
        .min_by_key(|(_, endpoint)| endpoint.in_flight)
        .map(|(index, _)| index)
        .ok_or(ScheduleError::NoReachableEndpoint)?;
    Ok(Decision {
        results: vec![ProfileResult {
            profile: 0,
            targets: vec![target],
        }],
        primary: 0,
        degraded: true,
    })
}

/// Min-max normalisation shared by the queue and running-requests scorers:
/// `(max - v) / (max - min)`, 1.0 for everyone when all values are equal.
pub fn score_lower_is_better(values: impl Iterator<Item = f64> + Clone, scores: &mut [f64]) {
    let (min, max) = values
        .clone()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    for (score, value) in scores.iter_mut().zip(values) {
        *score = if max > min {
            (max - value) / (max - min)
        } else {
            1.0
        };
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use crate::endpoint::{EndpointState, Health, Pool};
    use crate::metrics::EndpointMetrics;
    use std::collections::BTreeMap;

    /// A pool of fresh endpoints `10.0.0.{i}:8000` with the given metrics.
    pub fn pool_with(metrics: Vec<EndpointMetrics>) -> Pool {
        Pool::new(
            metrics
                .into_iter()
                .enumerate()
                .map(|(i, metrics)| {
                    let mut endpoint =
                        EndpointState::new(format!("10.0.0.{i}:8000"), BTreeMap::new());
                    endpoint.metrics = metrics;
                    endpoint.health = Health::Fresh;
                    endpoint
                })
                .collect(),
        )
    }

    pub fn queues(values: &[f64]) -> Pool {
        pool_with(
            values
                .iter()
                .map(|&q| EndpointMetrics {
                    waiting_queue: q,
                    ..EndpointMetrics::default()
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamping() {
        assert_eq!(clamp_score(f64::NAN), 0.0);
        assert_eq!(clamp_score(1.5), 1.0);
        assert_eq!(clamp_score(-0.5), 0.0);
        assert_eq!(clamp_score(0.25), 0.25);
    }

    #[test]
    fn lower_is_better_normalisation() {
        let mut scores = [0.0; 3];
        score_lower_is_better([0.0, 5.0, 10.0].into_iter(), &mut scores);
        assert_eq!(scores, [1.0, 0.5, 0.0]);
        score_lower_is_better([3.0, 3.0, 3.0].into_iter(), &mut scores);
        assert_eq!(scores, [1.0, 1.0, 1.0]);
    }

    #[test]
    fn all_stale_routes_to_least_in_flight_reachable() {
        let mut pool = test_support::queues(&[0.0, 0.0, 0.0]);
        pool.endpoints[0].health = Health::Stale;
        pool.endpoints[0].in_flight = 3;
        pool.endpoints[1].health = Health::Unreachable;
        pool.endpoints[2].health = Health::Unknown;
        pool.endpoints[2].in_flight = 5;
        let decision = least_in_flight_reachable(&pool).unwrap();
        assert!(decision.degraded);
        assert_eq!(decision.targets(), [0]);
        for endpoint in &mut pool.endpoints {
            endpoint.health = Health::Unreachable;
        }
        assert_eq!(
            least_in_flight_reachable(&pool),
            Err(ScheduleError::NoReachableEndpoint)
        );
    }
}
