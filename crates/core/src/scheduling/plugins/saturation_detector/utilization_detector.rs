//! `utilization-detector` (GIE's default saturation detector): an endpoint is saturated when
//! its waiting queue reaches `queueDepthThreshold`, its KV-cache usage reaches
//! `kvCacheUtilThreshold`, or its metrics are older than `metricsStalenessThreshold` (or
//! missing); each threshold is raised by `headroom` (0.2 = 20 % more). The pool is saturated
//! when every endpoint is; sheddable requests (priority < 0) then get 429.

use crate::duration::serde_go;
use crate::endpoint::{EndpointState, Health, LoadView};
use crate::scheduling::plugins::spec::{effective, Data, Kind, PluginSpec, Signal};
use crate::scheduling::{Plugin, SaturationDetector};
use serde_yaml::Value;
use std::time::Duration;

pub const TYPE: &str = "utilization-detector";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(
    TYPE,
    Kind::SaturationDetector,
    build,
    effective::<Parameters>,
)
.consuming(&[
    Data::Metric(Signal::WaitingQueue),
    Data::Metric(Signal::KvCacheUsage),
]);

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub queue_depth_threshold: f64,
    pub kv_cache_util_threshold: f64,
    #[serde(with = "serde_go")]
    pub metrics_staleness_threshold: Duration,
    pub headroom: f64,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            queue_depth_threshold: 5.0,
            kv_cache_util_threshold: 0.8,
            metrics_staleness_threshold: Duration::from_millis(200),
            headroom: 0.0,
        }
    }
}

pub struct UtilizationDetector {
    parameters: Parameters,
    staleness_ms: u64,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    Ok(Plugin::SaturationDetector(Box::new(
        UtilizationDetector::new(super::parameters(parameters)?)?,
    )))
}

impl UtilizationDetector {
    pub fn new(parameters: Parameters) -> Result<Self, String> {
        let p = &parameters;
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !(positive(p.queue_depth_threshold) && positive(p.kv_cache_util_threshold)) {
            return Err(
                "queueDepthThreshold and kvCacheUtilThreshold must be finite numbers above 0"
                    .into(),
            );
        }
        crate::limits::DETECTOR_STALENESS_THRESHOLD
            .check(p.metrics_staleness_threshold)
            .map_err(|reason| format!("metricsStalenessThreshold: {reason}"))?;
        if !(p.headroom >= 0.0 && p.headroom.is_finite()) {
            return Err(format!("headroom {} must be >= 0", p.headroom));
        }
        let staleness_ms = crate::duration::duration_ms(p.metrics_staleness_threshold);
        Ok(UtilizationDetector {
            parameters,
            staleness_ms,
        })
    }
}

impl SaturationDetector for UtilizationDetector {
    /// The larger of queue / `queueDepthThreshold` and KV / `kvCacheUtilThreshold`; an
    /// unknown queue or KV usage counts as saturated (1), and so do stale metrics read alone
    /// (GIE's rule). A live `view` adds what was placed since the scrape to the last reading,
    /// so a pod whose `/metrics` answers late is judged on that, not taken for full.
    fn saturation(&self, endpoint: &EndpointState, view: LoadView, now_ms: u64) -> f64 {
        let p = &self.parameters;
        let aged = endpoint
            .last_scrape_ok_ms
            .is_none_or(|at| now_ms.saturating_sub(at) > self.staleness_ms);
        let stale = match endpoint.health {
            Health::Fresh => aged && !view.live,
            Health::Stale => !view.live,
            Health::Unknown | Health::Unreachable => true,
        };
        let scale = 1.0 + p.headroom;
        let ratio = |value: Option<f64>, threshold: f64| {
            value
                .filter(|v| v.is_finite())
                .map_or(1.0, |v| v / (threshold * scale))
        };
        let queue = ratio(endpoint.waiting(view), p.queue_depth_threshold);
        let kv = ratio(endpoint.kv_usage(view), p.kv_cache_util_threshold);
        if stale {
            return queue.max(kv).max(1.0);
        }
        queue.max(kv)
    }

    fn fit_scrape_interval(&mut self, interval_ms: u64) -> Option<String> {
        // Two intervals: one scrape late or slow must not read as saturation.
        let needed = interval_ms.saturating_mul(2);
        if self.staleness_ms >= needed {
            return None;
        }
        let configured = self.staleness_ms;
        self.staleness_ms = needed;
        Some(format!(
            "utilization-detector: metricsStalenessThreshold {configured}ms is shorter than two of this replica's scrape intervals ({interval_ms}ms with pool.replicas); using {needed}ms"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::metrics::EndpointMetrics;
    use std::collections::BTreeMap;

    fn endpoint(queue: f64, kv: f64, scraped_ms: u64) -> EndpointState {
        let mut endpoint = EndpointState::new("10.0.0.1:8000".into(), BTreeMap::new());
        endpoint.metrics = EndpointMetrics {
            waiting_queue: Some(queue),
            kv_cache_usage: Some(kv),
            ..EndpointMetrics::default()
        };
        endpoint.health = Health::Fresh;
        endpoint.last_scrape_ok_ms = Some(scraped_ms);
        endpoint
    }

    #[test]
    fn thresholds_staleness_and_headroom() {
        let detector = UtilizationDetector::new(Parameters::default()).unwrap();
        assert!(!detector.saturated(&endpoint(4.0, 0.79, 1000), 1100));
        assert!(detector.saturated(&endpoint(5.0, 0.0, 1000), 1100));
        assert!(detector.saturated(&endpoint(0.0, 0.8, 1000), 1100));
        assert!(
            detector.saturated(&endpoint(0.0, 0.0, 1000), 1201),
            "older than 200ms"
        );
        let mut unscraped = endpoint(0.0, 0.0, 0);
        unscraped.last_scrape_ok_ms = None;
        assert!(detector.saturated(&unscraped, 0));
        let roomy = UtilizationDetector::new(Parameters {
            headroom: 0.5,
            ..Parameters::default()
        })
        .unwrap();
        assert!(
            !roomy.saturated(&endpoint(7.0, 0.0, 1000), 1100),
            "5 x 1.5 = 7.5"
        );
        assert!(roomy.saturated(&endpoint(7.5, 0.0, 1000), 1100));
    }

    #[test]
    fn late_metrics_read_live_are_judged_on_the_last_reading_and_what_was_placed_since() {
        let detector = UtilizationDetector::new(Parameters::default()).unwrap();
        let live = LoadView {
            live: true,
            replicas: 1.0,
        };
        let mut late = endpoint(1.0, 0.1, 1000);
        late.health = Health::Stale;
        assert!(detector.saturated(&late, 5000), "read alone: GIE's rule");
        assert!(detector.saturation(&late, live, 5000) < 1.0);
        late.metrics.running_requests = Some(2.0);
        late.running_capacity = Some(2.0);
        late.in_flight = 4;
        assert!(
            detector.saturation(&late, live, 5000) >= 1.0,
            "four placed since at a full pod, on a queue of one"
        );
        let mut fresh = endpoint(1.0, 0.1, 1000);
        assert!(detector.saturation(&fresh, live, 1300) < 1.0);
        fresh.health = Health::Unreachable;
        assert!(detector.saturation(&fresh, live, 1100) >= 1.0);
    }

    #[test]
    fn unknown_queue_or_usage_is_saturated() {
        let detector = UtilizationDetector::new(Parameters::default()).unwrap();
        assert!(detector.saturated(&endpoint(f64::NAN, 0.0, 1000), 1100));
        assert!(detector.saturated(&endpoint(0.0, f64::INFINITY, 1000), 1100));
        let mut unknown = endpoint(0.0, 0.0, 1000);
        unknown.metrics.waiting_queue = None;
        assert!(detector.saturated(&unknown, 1100));
    }

    #[test]
    fn parameters() {
        let value: Value = serde_yaml::from_str(
            "{queueDepthThreshold: 10, kvCacheUtilThreshold: 0.9, metricsStalenessThreshold: 1s, headroom: 0.1}",
        )
        .unwrap();
        assert!(build(&value).is_ok());
        for bad in [
            "{headroom: -1}",
            "{queueDepthThreshold: .inf}",
            "{kvCacheUtilThreshold: .nan}",
            "{metricsStalenessThreshold: 0s}",
            "{metricsStalenessThreshold: 1000h}",
        ] {
            let value: Value = serde_yaml::from_str(bad).unwrap();
            assert!(build(&value).is_err(), "{bad}");
        }
    }
}
