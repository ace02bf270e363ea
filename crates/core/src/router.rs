//! Every pool of one filter and the choice between them: a request's model (after the
//! `x-gateway-model-name-rewrite`) names its pool, then that pool's director picks the endpoint.
//! One body parse serves both.

use crate::config::FilterConfig;
use crate::datalayer::DataLayer;
use crate::director::{Director, HeaderUse, Prepared, Routed};
use crate::error_response::RequestError;
use crate::flow_control::queue::{Admission, Queue};
use crate::flow_control::{Arrival, FlowControl};
use crate::host::SharedData;
use crate::learned::{InFlight, Learned};
use crate::request::{ApiKind, RequestHeaders};
use crate::scheduling::LearnedPrefix;
use hashbrown::HashMap;

/// Every stat's name starts with it.
pub const STATS_PREFIX: &str = "inference_picker";

/// The prefix of a pool's stats: the plain one for the single `pool` section, with
/// `.pool.<name>` for each of many.
pub fn stats_prefix(pool_name: Option<&str>) -> String {
    match pool_name {
        None => STATS_PREFIX.to_owned(),
        Some(name) => format!("{STATS_PREFIX}.pool.{name}"),
    }
}

impl Learned for PoolSlot {
    fn own_in_flight(&self, out: &mut Vec<InFlight>) {
        let endpoints = &self.data.pool().endpoints;
        out.extend(endpoints.iter().map(|e| (e.in_flight, e.in_flight_tokens)));
    }

    fn merge_in_flight(&mut self, others: &[InFlight]) {
        self.data.set_remote_in_flight(others);
    }

    fn take_placements(&mut self, out: &mut Vec<LearnedPrefix>) {
        self.director.take_learned(out);
    }

    fn merge_placement(&mut self, placement: &LearnedPrefix) {
        // Another VM or a peer placed a request here: the pool is in use.
        self.data.note_use();
        self.director.learn_remote(&self.data, placement);
    }

    fn endpoints(&self) -> usize {
        self.data.pool().len()
    }

    fn placed(&self) -> u64 {
        self.data.placed()
    }

    fn note_use(&mut self) {
        self.data.note_use();
    }
}

/// What became of a prepared request.
// Decided once per request and moved straight into the request's state: boxing would cost an
// allocation per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Decided {
    Routed(Routed),
    /// Flow control holds it: its stream waits for a release.
    Held,
    Refused(RequestError),
}

/// One pool, in three rooms that each own their state: the data layer (members, scraped
/// state, in-flight counts), the director (the scheduler), and flow control's queue when the
/// `flowControl` gate is on.
pub struct PoolSlot {
    pub name: String,
    pub data: DataLayer,
    pub director: Director,
    pub queue: Option<Queue>,
    /// Where this replica's state for its peers is stored (`pool.peers`; set by the VM).
    pub peer_keys: Option<crate::shared_keys::SharedKeys>,
}

impl PoolSlot {
    pub fn new(name: String, mut config: FilterConfig) -> Self {
        let data = DataLayer::new(&mut config);
        let queue = config
            .flow_control
            .clone()
            .map(|flow| Queue::new(FlowControl::new(flow, 0)));
        PoolSlot {
            name,
            data,
            director: Director::new(config),
            queue,
            peer_keys: None,
        }
    }

    /// The one way a prepared request is decided: flow control admits it (with `arrival`,
    /// when the pool has a queue and the request is an inference one), then the director
    /// schedules it; a held request is scheduled when the queue releases it.
    pub fn decide(
        &mut self,
        prepared: Prepared,
        arrival: Option<Arrival>,
        now_ms: u64,
        store: &dyn SharedData,
    ) -> Decided {
        let prepared = match (&mut self.queue, arrival) {
            (Some(queue), Some(arrival)) => {
                let rooms = (&self.director, &self.data);
                match queue.admit(rooms, prepared, arrival, now_ms, store) {
                    Admission::Now(prepared) => *prepared,
                    Admission::Held => return Decided::Held,
                    Admission::Refused(error) => return Decided::Refused(error),
                }
            }
            _ => prepared,
        };
        match self.director.route_prepared(&mut self.data, prepared) {
            Ok(routed) => Decided::Routed(routed),
            Err(error) => Decided::Refused(error),
        }
    }

    /// Requests wait in this pool's queue (here or, as last seen, in another VM), or refusals
    /// wait to be sent.
    pub fn flow_waiting(&self, now_ms: u64) -> bool {
        self.queue
            .as_ref()
            .is_some_and(|queue| queue.waiting(now_ms))
    }
}

/// Which pool serves a model: exact names a pool lists first (one lookup however many pools),
/// then names a pool's pods report (`models-data-source`), then globs in configuration order,
/// then the pool that lists no models and learns none. A name two pools list or report goes
/// to the first.
#[derive(Debug, Default)]
pub struct ModelRouter {
    exact: HashMap<String, usize>,
    /// What the pools' pods report (`models-data-source`), after the configured names.
    learned: HashMap<String, usize>,
    globs: Vec<(String, usize)>,
    catch_all: Option<usize>,
}

impl ModelRouter {
    /// `pools[i]` is pool i's model list (`None`: every model no other pool lists; an empty
    /// list: only what its pods report). A name two pools list goes to the first.
    pub fn new(pools: &[Option<Vec<String>>]) -> Self {
        let mut router = ModelRouter::default();
        for (index, models) in pools.iter().enumerate() {
            let Some(models) = models else {
                router.catch_all.get_or_insert(index);
                continue;
            };
            router.add(index, models);
        }
        router
    }

    fn add(&mut self, index: usize, models: &[String]) {
        for model in models {
            if model.contains(['*', '?']) {
                self.globs.push((model.clone(), index));
            } else {
                self.exact.entry(model.clone()).or_insert(index);
            }
        }
    }

    /// Replaces the learned names: `pools[i]` is what pool i's pods report.
    pub fn set_learned<'a>(&mut self, pools: impl Iterator<Item = &'a [String]>) {
        self.learned.clear();
        for (index, models) in pools.enumerate() {
            for model in models {
                self.learned.entry(model.clone()).or_insert(index);
            }
        }
    }

    pub fn route(&self, model: &str) -> Option<usize> {
        if let Some(&index) = self.exact.get(model).or_else(|| self.learned.get(model)) {
            return Some(index);
        }
        self.globs
            .iter()
            .find(|(glob, _)| glob_matches(glob.as_bytes(), model.as_bytes()))
            .map(|&(_, index)| index)
            .or(self.catch_all)
    }

    /// The pool for requests without a model (`GET /v1/models`, health checks).
    pub fn without_model(&self) -> usize {
        self.catch_all.unwrap_or(0)
    }
}

/// `*` matches any run of bytes, `?` any one byte; everything else itself. Backtracks only
/// to the last `*` (at most glob x text steps, no recursion), so a hostile model name cannot
/// make it slow.
pub fn glob_matches(glob: &[u8], text: &[u8]) -> bool {
    let (mut g, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match glob.get(g) {
            Some(b'*') => {
                star = Some((g, t));
                g += 1;
            }
            Some(&c) if c == b'?' || Some(&c) == text.get(t) => {
                g += 1;
                t += 1;
            }
            _ => match star {
                Some((star_g, star_t)) => {
                    g = star_g + 1;
                    t = star_t + 1;
                    star = Some((star_g, star_t + 1));
                }
                None => return false,
            },
        }
    }
    glob.get(g..)
        .is_some_and(|rest| rest.iter().all(|&c| c == b'*'))
}

pub struct PoolRouter {
    pools: Vec<PoolSlot>,
    router: ModelRouter,
    /// `poolHeader`: the request header the chosen pool's name is written to.
    pool_header: Option<String>,
    /// The optional headers any pool reads (the pool is known only after the body).
    header_use: HeaderUse,
    /// The largest body any pool accepts; each pool checks its own limit once chosen.
    max_request_body_bytes: usize,
    /// The most prompt text any pool's plugins read (the parse keeps no more).
    prompt_chars_needed: usize,
}

impl PoolRouter {
    /// `pools` in configuration order with each one's models (see [`ModelRouter::new`]).
    pub fn new(pools: Vec<(PoolSlot, Option<Vec<String>>)>, pool_header: Option<String>) -> Self {
        let models: Vec<Option<Vec<String>>> = pools.iter().map(|(_, m)| m.clone()).collect();
        let pools: Vec<PoolSlot> = pools.into_iter().map(|(slot, _)| slot).collect();
        let header_use = pools.iter().fold(HeaderUse::default(), |all, slot| {
            all.union(slot.director.header_use())
        });
        let max_request_body_bytes = pools
            .iter()
            .map(|slot| slot.data.settings().max_request_body_bytes)
            .max()
            .unwrap_or(0);
        let prompt_chars_needed = pools
            .iter()
            .map(|slot| slot.director.prompt_chars_needed())
            .max()
            .unwrap_or(0);
        PoolRouter {
            prompt_chars_needed,
            pools,
            router: ModelRouter::new(&models),
            pool_header,
            header_use,
            max_request_body_bytes,
        }
    }

    /// One pool serving every model (the single `pool` section; tests).
    pub fn single(config: FilterConfig) -> Self {
        let slot = PoolSlot::new(crate::config::DEFAULT_POOL_NAME.into(), config);
        PoolRouter::new(vec![(slot, None)], None)
    }

    pub fn len(&self) -> usize {
        self.pools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }

    pub fn slots(&self) -> &[PoolSlot] {
        &self.pools
    }

    pub fn slots_mut(&mut self) -> &mut [PoolSlot] {
        &mut self.pools
    }

    pub fn slot(&self, pool: usize) -> Option<&PoolSlot> {
        self.pools.get(pool)
    }

    pub fn slot_mut(&mut self, pool: usize) -> Option<&mut PoolSlot> {
        self.pools.get_mut(pool)
    }

    /// `(header, pool name)` to write into the request, when `poolHeader` is set.
    pub fn pool_label(&self, pool: usize) -> Option<(&str, &str)> {
        let header = self.pool_header.as_deref()?;
        Some((header, self.pools.get(pool)?.name.as_str()))
    }

    pub fn header_use(&self) -> HeaderUse {
        self.header_use
    }

    pub fn max_request_body_bytes(&self) -> usize {
        self.max_request_body_bytes
    }

    /// Re-reads what each pool's pods report serving (after a tick or an answer said it
    /// changed).
    pub fn refresh_learned_models(&mut self) {
        let pools = self.pools.iter().map(|slot| slot.data.models().served());
        self.router.set_learned(pools);
    }

    /// The pool a request for `model` goes to (`None`: a request without one, such as
    /// `GET /v1/models`); `None` when no pool serves the model.
    pub fn pool_for(&self, model: Option<&str>) -> Option<usize> {
        match model {
            Some(model) => self.router.route(model),
            None => Some(self.router.without_model()),
        }
    }

    pub fn new_request_id(&mut self) -> String {
        match self.pools.first_mut() {
            Some(slot) => slot.director.new_request_id(),
            None => String::new(),
        }
    }

    /// Parses the body once, picks the pool its model names, and prepares the request for
    /// that pool. An unknown model is a 404 naming it.
    pub fn prepare(
        &mut self,
        api: ApiKind,
        body: Option<&[u8]>,
        headers: RequestHeaders,
    ) -> Result<(usize, Prepared), RequestError> {
        let keep = self.prompt_chars_needed;
        let mut prepared = crate::director::parse_prepared(api, body, headers, keep)?;
        let pool = if api.is_inference() {
            self.router
                .route(&prepared.request.model)
                .ok_or_else(|| RequestError::ModelNotFound(prepared.request.model.clone()))?
        } else {
            self.router.without_model()
        };
        let slot = self
            .slot(pool)
            .ok_or_else(|| RequestError::NoEndpoint("no pool serves this request".into()))?;
        Director::complete_prepared(&slot.data, &mut prepared)?;
        if api.is_inference() {
            slot.director.keep_body_for_priority(&mut prepared, body)?;
        }
        Ok((pool, prepared))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn globs_match_runs_and_single_bytes() {
        assert!(glob_matches(b"llama-*", b"llama-3-8b"));
        assert!(glob_matches(b"*", b""));
        assert!(glob_matches(b"*-lora-?", b"base-lora-7"));
        assert!(glob_matches(b"a*b*c", b"a-xx-b-yy-c"));
        assert!(!glob_matches(b"a*b*c", b"a-xx-b-yy"));
        assert!(!glob_matches(b"llama-*", b"mistral"));
        assert!(!glob_matches(b"?", b""));
        assert!(!glob_matches(b"exact", b"exact-not"));
    }

    #[test]
    fn a_hostile_name_against_many_stars_stays_fast() {
        let glob = b"*a*a*a*a*a*a*a*a*b";
        let text = vec![b'a'; 20_000];
        assert!(!glob_matches(glob, &text));
    }

    #[test]
    fn exact_names_win_over_globs_then_the_catch_all() {
        let router = ModelRouter::new(&[
            Some(vec!["llama-*".into()]),
            Some(vec!["llama-guard".into(), "mistral".into()]),
            None,
        ]);
        assert_eq!(router.route("llama-guard"), Some(1));
        assert_eq!(router.route("llama-3"), Some(0));
        assert_eq!(router.route("mistral"), Some(1));
        assert_eq!(router.route("qwen"), Some(2));
        assert_eq!(router.without_model(), 2);
    }

    #[test]
    fn learned_names_come_after_listed_ones_and_before_globs() {
        let mut router =
            ModelRouter::new(&[Some(vec!["a".into()]), Some(vec![]), Some(vec!["*".into()])]);
        assert_eq!(router.route("b"), Some(2));
        let reported = [vec!["a".to_owned()], vec!["a".into(), "b".into()], vec![]];
        router.set_learned(reported.iter().map(Vec::as_slice));
        assert_eq!(
            router.route("a"),
            Some(0),
            "a listed name wins over a reported one"
        );
        assert_eq!(router.route("b"), Some(1));
        router.set_learned(std::iter::empty());
        assert_eq!(
            router.route("b"),
            Some(2),
            "a pod that stops serving it, stops routing it"
        );
    }

    #[test]
    fn without_a_catch_all_an_unknown_model_has_no_pool() {
        let router =
            ModelRouter::new(&[Some(vec!["a".into()]), Some(vec!["a".into(), "b".into()])]);
        assert_eq!(
            router.route("a"),
            Some(0),
            "a name two pools list goes to the first"
        );
        assert_eq!(router.route("c"), None);
        assert_eq!(router.without_model(), 0);
    }
}
