//! The [`Scheduler`]: runs the profiles a profile handler chooses over the pool and returns
//! the [`Decision`]. What flow control asks it and how it explains a decision live in its
//! child modules.

pub(super) mod explain;
mod saturation;

use super::cycle::{CycleState, LearnedPrefix, SchedulingContext};
use super::profile::{Profile, ProfileResult};
use super::rng::Rng;
use super::score::clamp_score;
use super::traits::{Admission, Plugin, PluginInstance};
use crate::endpoint::{Health, Pool};
use crate::request::InferenceRequest;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub results: Vec<ProfileResult>,
    /// Index into `results` of the result that routes the request.
    pub primary: usize,
    /// Index into `results` of the prefill pick when the request is disaggregated.
    pub prefill: Option<usize>,
    /// True when no endpoint had fresh metrics and the least-loaded reachable one was taken.
    pub degraded: bool,
}

impl Decision {
    pub fn targets(&self) -> &[usize] {
        self.results
            .get(self.primary)
            .map_or(&[], |result| result.targets.as_slice())
    }

    pub fn prefill_endpoint(&self) -> Option<usize> {
        self.results
            .get(self.prefill?)
            .and_then(|result| result.targets.first().copied())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleError {
    /// Every endpoint failed its last scrape (503).
    NoReachableEndpoint,
    /// A profile's filters removed every candidate (429).
    FilteredOut { profile: String },
    /// `latency-slo-admitter`: a sheddable request no endpoint can serve within its SLOs
    /// (429).
    NotAdmitted,
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
            ScheduleError::NotAdmitted => write!(
                f,
                "the request is sheddable and no endpoint is predicted to meet its latency SLOs"
            ),
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
    /// Each candidate's `(running, waiting)` as the scorers read them, for the decision line.
    loads: Vec<(Option<f64>, Option<f64>)>,
}

pub struct Scheduler {
    plugins: Vec<PluginInstance>,
    profiles: Vec<Profile>,
    handler: usize,
    saturation_detector: Option<usize>,
    /// Whether a request is scheduled at all, once the cycle state is filled
    /// (`latency-slo-admitter`).
    admission: Option<Admission>,
    rng: Rng,
    base: Vec<usize>,
    cycle: CycleState,
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
            saturation_detector: None,
            admission: None,
            rng: Rng::new(seed),
            base: Vec::new(),
            cycle: CycleState::default(),
            traces: Vec::new(),
            traces_used: 0,
        }
    }

    /// Set by the loader: requests `admits` refuses are not scheduled (429).
    pub fn set_admission(&mut self, admits: Admission) {
        self.admission = Some(admits);
    }

    /// Set by the loader: the plugin `saturationDetector.pluginRef` names.
    pub fn set_saturation_detector(&mut self, index: usize) {
        self.saturation_detector = Some(index);
    }

    pub fn profiles(&self) -> &[Profile] {
        &self.profiles
    }

    pub fn plugins(&self) -> &[PluginInstance] {
        &self.plugins
    }

    /// Every scorer's [`Scorer::counters`](super::Scorer::counters), with the plugin's name.
    pub fn plugin_counters(&self, out: &mut dyn FnMut(&str, &'static str, u64)) {
        for instance in &self.plugins {
            if let Plugin::Scorer(scorer) = &instance.plugin {
                scorer.counters(&mut |name, total| out(&instance.name, name, total));
            }
        }
    }

    pub fn reseed(&mut self, seed: u64) {
        self.rng = Rng::new(seed);
    }

    /// Prefix-index entries learned here since the last call (for the other workers).
    pub fn take_learned(&mut self, out: &mut Vec<LearnedPrefix>) {
        for instance in &mut self.plugins {
            if let Plugin::Scorer(scorer) = &mut instance.plugin {
                scorer.take_learned(out);
            }
        }
    }

    /// Replays what another worker learned.
    pub fn learn_remote(&mut self, learned: &LearnedPrefix) {
        for instance in &mut self.plugins {
            if let Plugin::Scorer(scorer) = &mut instance.plugin {
                scorer.learn_remote(learned);
            }
        }
    }

    /// Characters of the prompt's text any scorer reads: the parser keeps no more.
    pub fn prompt_chars_needed(&self) -> usize {
        self.plugins
            .iter()
            .map(|instance| match &instance.plugin {
                Plugin::Scorer(scorer) => scorer.prompt_chars_needed(),
                _ => 0,
            })
            .max()
            .unwrap_or(0)
    }

    /// The prompt blocks the prefix index hashed for the last request, if any scorer did.
    pub fn last_prompt_blocks(&self) -> Option<&[u64]> {
        self.plugins
            .iter()
            .find_map(|instance| match &instance.plugin {
                Plugin::Scorer(scorer) => scorer.last_prompt_blocks(),
                _ => None,
            })
    }

    /// See [`Scorer::learn_served`](super::Scorer::learn_served).
    pub fn learn_served(&mut self, learned: &LearnedPrefix) {
        for instance in &mut self.plugins {
            if let Plugin::Scorer(scorer) = &mut instance.plugin {
                scorer.learn_served(learned);
            }
        }
    }

    /// Randomness for callers outside a scheduling cycle (request ids).
    pub fn random_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// Per-cycle data of the last decision (prefix matches), for callers that account it.
    pub fn last_cycle(&self) -> &CycleState {
        &self.cycle
    }

    /// Picks the endpoints for one request.
    pub fn schedule(
        &mut self,
        request: &InferenceRequest,
        pool: &Pool,
    ) -> Result<Decision, ScheduleError> {
        self.schedule_where(request, pool, |_| true)
    }

    /// [`Scheduler::schedule`] among the endpoints `eligible` accepts only (the protocol's
    /// subset hint, the pods that serve the model): none eligible is no endpoint.
    pub fn schedule_where(
        &mut self,
        request: &InferenceRequest,
        pool: &Pool,
        eligible: impl Fn(usize) -> bool,
    ) -> Result<Decision, ScheduleError> {
        self.traces_used = 0;
        self.base.clear();
        self.base.extend(
            pool.endpoints
                .iter()
                .enumerate()
                .filter(|(index, endpoint)| endpoint.routable(pool.now_ms()) && eligible(*index))
                .map(|(index, _)| index),
        );
        self.cycle.prefix = None;
        if self.base.is_empty() {
            return least_in_flight_reachable(pool, eligible);
        }
        let mut cycle = std::mem::take(&mut self.cycle);
        for instance in &mut self.plugins {
            if let Plugin::Scorer(scorer) = &mut instance.plugin {
                scorer.prepare(request, pool, &mut cycle);
            }
        }
        for instance in &mut self.plugins {
            if let Plugin::Scorer(scorer) = &mut instance.plugin {
                scorer.predict(request, pool, &mut cycle);
            }
        }
        if self
            .admission
            .is_some_and(|admits| !admits(request, pool, &cycle))
        {
            self.cycle = cycle;
            return Err(ScheduleError::NotAdmitted);
        }
        let ctx = SchedulingContext {
            request,
            pool,
            cycle: &cycle,
        };
        let outcome = self.run_profiles(&ctx);
        self.cycle = cycle;
        outcome
    }

    fn run_profiles(&mut self, ctx: &SchedulingContext<'_>) -> Result<Decision, ScheduleError> {
        let mut results: Vec<ProfileResult> = Vec::with_capacity(self.profiles.len());
        while results.len() < self.profiles.len() {
            let Some(profile) = self.next_profile(ctx, &results) else {
                break;
            };
            match self.run_profile(ctx, profile) {
                Ok(targets) => results.push(ProfileResult { profile, targets }),
                // Only the first profile decides whether the request can be served; a later
                // one (prefill) that finds nobody leaves the request to the first one alone.
                Err(error) if results.is_empty() => return Err(error),
                Err(_) => break,
            }
        }
        let handler = match self.plugins.get(self.handler).map(|p| &p.plugin) {
            Some(Plugin::ProfileHandler(handler)) => Some(handler),
            _ => None,
        };
        let primary = handler.map_or(0, |h| h.primary_result(&results));
        let prefill = handler.and_then(|h| h.prefill_result(&results));
        self.learn(ctx, &results);
        Ok(Decision {
            results,
            primary,
            prefill,
            degraded: false,
        })
    }

    fn next_profile(
        &self,
        ctx: &SchedulingContext<'_>,
        results: &[ProfileResult],
    ) -> Option<usize> {
        match self.plugins.get(self.handler).map(|p| &p.plugin) {
            Some(Plugin::ProfileHandler(handler)) => handler
                .next_profile(ctx, &self.plugins, results)
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
            match plugins.get_mut(filter).map(|p| &mut p.plugin) {
                Some(Plugin::Filter(filter)) => filter.filter(ctx, &mut trace.candidates),
                Some(Plugin::Scorer(scorer)) => scorer.filter(ctx, &mut trace.candidates),
                _ => {}
            }
        }
        let filtered_out = || ScheduleError::FilteredOut {
            profile: profile.name.clone(),
        };
        if trace.candidates.is_empty() {
            return Err(filtered_out());
        }
        score_candidates(plugins, profile, trace, ctx);
        let mut picked = Vec::with_capacity(1);
        if let Some(PluginInstance {
            plugin: Plugin::Picker(picker),
            ..
        }) = plugins.get(profile.picker)
        {
            picker.pick(&trace.candidates, &trace.totals, rng, &mut picked);
        }
        if picked.is_empty() {
            return Err(filtered_out());
        }
        Ok(picked)
    }

    /// Every stateful scorer learns every profile's pick, whether or not its own profile
    /// ran: the prefill and the decode pod both end up holding the prompt's KV blocks.
    fn learn(&mut self, ctx: &SchedulingContext<'_>, results: &[ProfileResult]) {
        for endpoint in results.iter().filter_map(|r| r.targets.first().copied()) {
            for instance in &mut self.plugins {
                if let Plugin::Scorer(scorer) = &mut instance.plugin {
                    scorer.on_picked(ctx, endpoint);
                }
            }
        }
    }
}

/// Runs a profile's scorers over the trace's candidates: clamped scores, weighted totals.
fn score_candidates(
    plugins: &mut [PluginInstance],
    profile: &Profile,
    trace: &mut ProfileTrace,
    ctx: &SchedulingContext<'_>,
) {
    let n = trace.candidates.len();
    trace.scores.clear();
    trace.scores.resize(n * profile.scorers.len(), 0.0);
    trace.totals.clear();
    trace.totals.resize(n, 0.0);
    trace.loads.clear();
    trace.loads.extend(
        trace
            .candidates
            .iter()
            .map(|&i| (ctx.pool.running(i), ctx.pool.waiting(i))),
    );
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
}

/// With no fresh metrics anywhere, route by the filter's own load so traffic keeps flowing.
fn least_in_flight_reachable(
    pool: &Pool,
    eligible: impl Fn(usize) -> bool,
) -> Result<Decision, ScheduleError> {
    let target = pool
        .endpoints
        .iter()
        .enumerate()
        .filter(|(index, endpoint)| {
            !endpoint.removed && endpoint.health != Health::Unreachable && eligible(*index)
        })
        .min_by_key(|(_, endpoint)| endpoint.total_in_flight())
        .map(|(index, _)| index)
        .ok_or(ScheduleError::NoReachableEndpoint)?;
    Ok(Decision {
        results: vec![ProfileResult {
            profile: 0,
            targets: vec![target],
        }],
        primary: 0,
        prefill: None,
        degraded: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::scheduling::test_support;

    #[test]
    fn all_stale_routes_to_least_in_flight_reachable() {
        let mut pool = test_support::queues(&[0.0, 0.0, 0.0]);
        pool.endpoints[0].health = Health::Stale;
        pool.endpoints[0].in_flight = 3;
        pool.endpoints[1].health = Health::Unreachable;
        pool.endpoints[2].health = Health::Unknown;
        pool.endpoints[2].in_flight = 5;
        let decision = least_in_flight_reachable(&pool, |_| true).unwrap();
        assert!(decision.degraded);
        assert_eq!(decision.targets(), [0]);
        for endpoint in &mut pool.endpoints {
            endpoint.health = Health::Unreachable;
        }
        assert_eq!(
            least_in_flight_reachable(&pool, |_| true),
            Err(ScheduleError::NoReachableEndpoint)
        );
    }
}
