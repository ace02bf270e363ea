//! Our `pool` section: the endpoints and how their metrics are scraped.

use super::error::ConfigError;
use crate::discovery::DiscoveryConfig;
use crate::duration::serde_go;
use crate::endpoint::canonical_address;
use crate::limits;
use hashbrown::HashSet;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EndpointConfig {
    /// `ip:port`, IPv6 as `[addr]:port`; canonicalised by `validate`.
    pub address: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// An InferenceObjective: requests naming it in `x-gateway-inference-objective` get its
/// priority (negative = sheddable when the pool is saturated).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ObjectiveConfig {
    pub name: String,
    #[serde(default)]
    pub priority: i32,
}

/// The cluster the shipped Envoy configs define for the `/metrics` callouts.
pub const DEFAULT_METRICS_CLUSTER: &str = "inference_picker_metrics";
/// Far below the shipped metrics cluster's circuit breakers (4,096 requests), even with two VMs
/// scraping during a lease handover; enough to keep one thread busy parsing answers while
/// others travel, few enough that a burst of answers or a stalled thread does not push the
/// ones waiting behind it past `metricsTimeout`.
pub const DEFAULT_MAX_SCRAPES_IN_FLIGHT: usize = 128;
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct PoolConfig {
    pub endpoints: Vec<EndpointConfig>,
    /// Envoy cluster the `/metrics` callouts go through (ORIGINAL_DST keyed on the header): one
    /// of their own, so scrapes never take the client requests' connections or circuit
    /// breakers, with breakers sized for the pool.
    pub metrics_cluster: String,
    /// Scrapes in flight at once; a round sends the next as each answers, so it is spread over
    /// the interval instead of sent as one burst (and never beyond the cluster's breakers).
    pub max_scrapes_in_flight: usize,
    pub metrics_path: String,
    #[serde(with = "serde_go")]
    pub refresh_metrics_interval: Duration,
    #[serde(with = "serde_go")]
    pub metrics_staleness_threshold: Duration,
    /// How often each pod is scraped while the pool is idle (no request placed or in flight
    /// for [`crate::datalayer::IDLE_AFTER_MS`]), at most half the staleness threshold; the
    /// first request puts the scrapes back on `refreshMetricsInterval`. Set it to
    /// `refreshMetricsInterval` to scrape at one pace always.
    #[serde(with = "serde_go")]
    pub idle_refresh_metrics_interval: Duration,
    /// A `/metrics` callout that takes longer counts as a failed scrape.
    #[serde(with = "serde_go")]
    pub metrics_timeout: Duration,
    /// Request bodies above this get a 413 before any parsing.
    pub max_request_body_bytes: usize,
    /// A `/metrics` answer larger than this is a failed scrape, never copied into the VM.
    pub max_metrics_bytes: usize,
    pub objectives: Vec<ObjectiveConfig>,
    /// Write the fallbacks into the destination header too (`primary,fallback,...`), for
    /// Envoy's override_host load-balancing policy, which retries on the next address.
    /// Off for the ORIGINAL_DST cluster, which needs one address there.
    pub destination_list: bool,
    /// Find endpoints through the Kubernetes API (in addition to `endpoints`).
    pub discovery: Option<DiscoveryConfig>,
    /// How long an endpoint is avoided after a request there got a 5xx or no connection.
    #[serde(with = "serde_go")]
    pub passive_health_backoff: Duration,
    /// What load-reading plugins see between two scrapes.
    pub load_signals: LoadSignals,
    /// Write every scored endpoint's total into `x-gateway-destination-endpoint-scores`.
    pub emit_endpoint_scores: bool,
    /// Envoy replicas that run this configuration in front of the same pods. Each scrapes
    /// every pod once per `replicas x refreshMetricsInterval`, so the fleet together refreshes
    /// each pod once per interval and a pod pays for its metrics page no more often with ten
    /// gateways than with one; between its own scrapes each replica carries the picture with
    /// the live load signals of what it placed.
    pub replicas: u32,
    /// The other Envoy replicas and how this one shares what it learns with them.
    pub peers: Option<super::peers::PeersConfig>,
}

/// `pool.loadSignals`: scraped metrics alone go stale the moment the picker routes a request,
/// so by default they are corrected with what this Envoy placed and saw end since.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadSignals {
    /// Scraped queue, running count and KV usage plus the requests (and their tokens) every
    /// worker of this Envoy placed there since the scrape, less those that ended.
    #[default]
    Live,
    /// The last scrape as it was, as GIE's endpoint picker reads it.
    Scraped,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            endpoints: Vec::new(),
            metrics_cluster: DEFAULT_METRICS_CLUSTER.into(),
            max_scrapes_in_flight: DEFAULT_MAX_SCRAPES_IN_FLIGHT,
            metrics_path: "/metrics".into(),
            refresh_metrics_interval: Duration::from_millis(50),
            metrics_staleness_threshold: Duration::from_secs(2),
            idle_refresh_metrics_interval: Duration::from_secs(1),
            metrics_timeout: Duration::from_secs(1),
            max_request_body_bytes: 4 << 20,
            max_metrics_bytes: 4 << 20,
            objectives: Vec::new(),
            destination_list: false,
            discovery: None,
            passive_health_backoff: Duration::from_secs(5),
            load_signals: LoadSignals::Live,
            emit_endpoint_scores: false,
            replicas: 1,
            peers: None,
        }
    }
}

impl PoolConfig {
    /// Checks every field and canonicalises endpoint addresses in place.
    pub(super) fn validate(&mut self) -> Result<(), ConfigError> {
        if let Some(peers) = &mut self.peers {
            peers.validate()?;
            if self.replicas > 1 {
                return Err(ConfigError::invalid(
                    "pool.replicas",
                    "leave it at 1 with pool.peers: replicas that share what they learn count each other live",
                ));
            }
        }
        if let Some(discovery) = &self.discovery {
            discovery
                .validate()
                .map_err(|reason| ConfigError::invalid("pool.discovery", reason))?;
        } else if self.endpoints.is_empty() {
            return Err(ConfigError::invalid(
                "pool.endpoints",
                "the endpoint list is empty (and no pool.discovery is set)",
            ));
        }
        if !self.endpoints.is_empty() {
            limits::ENDPOINTS
                .check_usize(self.endpoints.len())
                .map_err(|reason| ConfigError::invalid("pool.endpoints", reason))?;
        }
        let mut seen = HashSet::with_capacity(self.endpoints.len());
        for (i, endpoint) in self.endpoints.iter().enumerate() {
            let address = canonical_address(&endpoint.address).map_err(|reason| {
                ConfigError::invalid(format!("pool.endpoints[{i}].address"), reason)
            })?;
            if !seen.insert(address.clone()) {
                return Err(ConfigError::invalid(
                    format!("pool.endpoints[{i}].address"),
                    format!("{address} is listed twice"),
                ));
            }
        }
        limits::SCRAPES_IN_FLIGHT
            .check_usize(self.max_scrapes_in_flight)
            .map_err(|reason| ConfigError::invalid("pool.maxScrapesInFlight", reason))?;
        if self.metrics_cluster.trim().is_empty() {
            return Err(ConfigError::invalid(
                "pool.metricsCluster",
                "must name an Envoy cluster",
            ));
        }
        if !self.metrics_path.starts_with('/') {
            return Err(ConfigError::invalid(
                "pool.metricsPath",
                "must start with '/'",
            ));
        }
        check_header_value("pool.metricsPath", &self.metrics_path)?;
        for (key, value, bounds) in [
            (
                "pool.refreshMetricsInterval",
                self.refresh_metrics_interval,
                limits::REFRESH_METRICS_INTERVAL,
            ),
            (
                "pool.metricsStalenessThreshold",
                self.metrics_staleness_threshold,
                limits::METRICS_STALENESS_THRESHOLD,
            ),
            (
                "pool.idleRefreshMetricsInterval",
                self.idle_refresh_metrics_interval,
                limits::REFRESH_METRICS_INTERVAL,
            ),
            (
                "pool.metricsTimeout",
                self.metrics_timeout,
                limits::METRICS_TIMEOUT,
            ),
            (
                "pool.passiveHealthBackoff",
                self.passive_health_backoff,
                limits::PASSIVE_HEALTH_BACKOFF,
            ),
        ] {
            bounds
                .check(value)
                .map_err(|reason| ConfigError::invalid(key, reason))?;
        }
        limits::REPLICAS
            .check_usize(self.replicas as usize)
            .map_err(|reason| ConfigError::invalid("pool.replicas", reason))?;
        if self.metrics_staleness_threshold < self.scrape_interval() {
            return Err(ConfigError::invalid(
                "pool.metricsStalenessThreshold",
                "must be at least pool.refreshMetricsInterval times pool.replicas: each replica only scrapes that often, so its metrics would always be stale",
            ));
        }
        for (key, value, bounds) in [
            (
                "pool.maxRequestBodyBytes",
                self.max_request_body_bytes,
                limits::MAX_REQUEST_BODY_BYTES,
            ),
            (
                "pool.maxMetricsBytes",
                self.max_metrics_bytes,
                limits::MAX_METRICS_BYTES,
            ),
        ] {
            bounds
                .check_usize(value)
                .map_err(|reason| ConfigError::invalid(key, reason))?;
        }
        limits::OBJECTIVES
            .check_usize(self.objectives.len())
            .map_err(|reason| ConfigError::invalid("pool.objectives", reason))?;
        for (i, objective) in self.objectives.iter().enumerate() {
            let duplicate = self
                .objectives
                .iter()
                .take(i)
                .any(|o| o.name == objective.name);
            if objective.name.is_empty() || duplicate {
                return Err(ConfigError::invalid(
                    format!("pool.objectives[{i}].name"),
                    format!("{:?} is empty or declared twice", objective.name),
                ));
            }
        }
        Ok(())
    }

    /// How often this replica scrapes each pod: see [`PoolConfig::replicas`].
    pub fn scrape_interval(&self) -> Duration {
        self.refresh_metrics_interval
            .saturating_mul(self.replicas.max(1))
    }

    /// How often this replica scrapes each pod while the pool is idle: never faster than
    /// [`PoolConfig::scrape_interval`], and never so slowly that its metrics go stale.
    pub fn idle_scrape_interval(&self) -> Duration {
        self.idle_refresh_metrics_interval
            .saturating_mul(self.replicas.max(1))
            .min(self.metrics_staleness_threshold / 2)
            .max(self.scrape_interval())
    }

    /// The priority of a named objective; requests naming none, or an unknown one, get 0.
    pub fn priority_of(&self, objective: Option<&str>) -> i32 {
        objective
            .and_then(|name| self.objectives.iter().find(|o| o.name == name))
            .map_or(0, |o| o.priority)
    }

    /// Endpoint addresses in canonical form, in configuration order.
    pub fn canonical_endpoints(&self) -> Vec<(String, BTreeMap<String, String>)> {
        self.endpoints
            .iter()
            .map(|e| {
                let address = canonical_address(&e.address).unwrap_or_else(|_| e.address.clone());
                (address, e.labels.clone())
            })
            .collect()
    }
}

/// A value the filter sends as a header: visible ASCII, within the header size bound.
pub(super) fn check_header_value(key: &str, value: &str) -> Result<(), ConfigError> {
    limits::HEADER_VALUE_BYTES
        .check_usize(value.len())
        .map_err(|reason| ConfigError::invalid(key, reason))?;
    if !limits::is_token(value) {
        return Err(ConfigError::invalid(
            key,
            "must be visible ASCII without spaces (it is sent as a header value)",
        ));
    }
    Ok(())
}
