//! One pool driven natively, without Envoy: the tests that check configs route as they say
//! (`example_configs`, `llm_d_router`) include it.
#![allow(dead_code)]

use inference_picker_core::config::FilterConfig;
use inference_picker_core::director::Routed;
use inference_picker_core::endpoint::Pool;
use inference_picker_core::error_response::RequestError;
use inference_picker_core::host::fake::NoSharedData;
use inference_picker_core::request::{ApiKind, RequestHeaders};
use inference_picker_core::router::{Decided, PoolRouter, PoolSlot};

/// One pool, fed scrapes as the data layer takes them and requests as the request path
/// prepares and decides them (the stream's part aside).
pub struct OnePool(PoolRouter);

impl OnePool {
    pub fn new(config: FilterConfig) -> Self {
        OnePool(PoolRouter::single(config))
    }

    pub fn slot(&mut self) -> &mut PoolSlot {
        self.0.slot_mut(0).expect("one pool")
    }

    pub fn pool(&self) -> &Pool {
        self.0.slot(0).expect("one pool").data.pool()
    }

    pub fn on_tick(&mut self, now: u64) {
        self.slot().data.refresh_health(now);
    }

    pub fn route(
        &mut self,
        api: ApiKind,
        body: Option<&[u8]>,
        headers: RequestHeaders,
    ) -> Result<Routed, RequestError> {
        let (pool, prepared) = self.0.prepare(api, body, headers)?;
        let slot = self.0.slot_mut(pool).expect("the pool");
        match slot.decide(prepared, None, 1000, &NoSharedData) {
            Decided::Routed(routed) => Ok(routed),
            Decided::Refused(error) => Err(error),
            Decided::Held => panic!("held without flow control"),
        }
    }

    pub fn release(&mut self, routed: &Routed) {
        let slot = self.slot();
        slot.director.request_ended(&mut slot.data, routed);
    }

    pub fn explain_last(&self) -> String {
        let slot = self.0.slot(0).expect("one pool");
        slot.director.explain_last(&slot.data)
    }

    /// Feeds a `/metrics` body for endpoint `index`, as a scrape answered at `now`.
    pub fn scrape(&mut self, index: usize, now: u64, body: &str) {
        self.slot()
            .data
            .scrape_answered(index, now, body)
            .expect("scrape parses");
    }
}
