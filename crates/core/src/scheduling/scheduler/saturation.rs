//! What flow control asks the scheduler: which endpoints have room, and how saturated the
//! pool is, both per the configured saturation detector.

use super::Scheduler;
use crate::endpoint::{LoadView, Pool};
use crate::scheduling::traits::{Plugin, SaturationDetector};

impl Scheduler {
    fn detector(&self) -> Option<&dyn SaturationDetector> {
        match self
            .saturation_detector
            .and_then(|i| self.plugins.get(i))
            .map(|p| &p.plugin)
        {
            Some(Plugin::SaturationDetector(detector)) => Some(detector.as_ref()),
            _ => None,
        }
    }

    /// True when no endpoint can take more work (per the configured detector).
    pub fn pool_saturated(&self, pool: &Pool, now_ms: u64) -> bool {
        let Some(detector) = self.detector() else {
            return false;
        };
        pool.endpoints
            .iter()
            .filter(|endpoint| !endpoint.removed)
            .all(|endpoint| detector.saturation(endpoint, pool.load_view(), now_ms) >= 1.0)
    }

    /// Marks in `room` the endpoints below saturation (per the configured detector), and says
    /// whether any is; without a detector nothing is marked and it says false.
    pub fn endpoints_with_room(&self, pool: &Pool, now_ms: u64, room: &mut Vec<bool>) -> bool {
        room.clear();
        let Some(detector) = self.detector() else {
            return false;
        };
        let view = LoadView {
            live: true,
            ..pool.load_view()
        };
        room.extend(pool.endpoints.iter().map(|endpoint| {
            endpoint.routable(now_ms) && detector.saturation(endpoint, view, now_ms) < 1.0
        }));
        room.contains(&true)
    }

    /// The pool's saturation as flow control gates on it (llm-d's): the mean of every
    /// routable endpoint's, always with what was placed since the scrapes (a gate that only moved on
    /// scrapes would let a whole queue out at once); `None` when no endpoint is routable
    /// (none has fresh metrics, or all are backed off). Each endpoint counts at most 1 (full),
    /// so the mean is below 1 exactly when some endpoint can take a request: a pod queued past
    /// its limit never holds back a request another pod has room for.
    pub fn pool_saturation(&self, pool: &Pool, now_ms: u64) -> Option<f64> {
        if !pool
            .endpoints
            .iter()
            .any(|endpoint| endpoint.routable(now_ms))
        {
            return None;
        }
        // A dead or backed-off pod takes nothing: it must not dilute the others' load.
        let members = pool
            .endpoints
            .iter()
            .filter(|endpoint| endpoint.routable(now_ms));
        let Some(detector) = self.detector() else {
            return members.count().gt(&0).then_some(0.0);
        };
        let view = LoadView {
            live: true,
            ..pool.load_view()
        };
        let (sum, count) = members.fold((0.0, 0u32), |(sum, count), endpoint| {
            let saturation = detector.saturation(endpoint, view, now_ms);
            (sum + saturation.clamp(0.0, 1.0), count + 1)
        });
        (count > 0).then(|| sum / f64::from(count))
    }
}
