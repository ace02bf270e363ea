//! The `flowControl` section of an `EndpointPickerConfig`, as llm-d-router reads it: global
//! and per-band limits, TTLs, band templates and policy references.

use crate::duration::serde_go;
use crate::scheduling::flow_policy::{Fairness, FlowPolicy, Ordering, ReserveConfig, UsageLimit};
use crate::scheduling::plugins::flow_control::{
    fcfs_ordering_policy, global_strict_fairness_policy, priority_reserve_policy,
    static_usage_limit_policy,
};
use serde::Deserialize;
use serde_yaml::Value;
use std::time::Duration;

/// Per band, when `maxRequests` / `maxBytes` are 0 or absent (llm-d's defaults).
pub const DEFAULT_BAND_MAX_REQUESTS: u64 = 5_000;
pub const DEFAULT_BAND_MAX_BYTES: u64 = 1_000_000_000;
pub const DEFAULT_REQUEST_TTL: Duration = Duration::from_secs(60);

/// The section as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawFlowControl {
    pub max_bytes: Option<Value>,
    pub max_requests: Option<Value>,
    #[serde(default, with = "serde_go::option", rename = "defaultRequestTTL")]
    pub default_request_ttl: Option<Duration>,
    #[serde(default, with = "serde_go::option", rename = "noEndpointRequestTTL")]
    pub no_endpoint_request_ttl: Option<Duration>,
    pub default_priority_band: Option<RawBand>,
    pub default_negative_priority_band: Option<RawBand>,
    #[serde(default)]
    pub priority_bands: Vec<RawBand>,
    pub usage_limit_policy_plugin_ref: Option<String>,
    pub saturation_detector: Option<RawDetectorRef>,
    #[serde(default)]
    pub enable_eviction: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawBand {
    #[serde(default)]
    pub priority: i32,
    pub max_bytes: Option<Value>,
    pub max_requests: Option<Value>,
    pub fairness_policy_ref: Option<String>,
    pub ordering_policy_ref: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawDetectorRef {
    pub plugin_ref: String,
}

/// One priority band, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct BandConfig {
    pub priority: i32,
    pub max_requests: u64,
    pub max_bytes: u64,
    pub fairness: Fairness,
    pub ordering: Ordering,
    /// The band dispatches while the pool's saturation is below this (the usage limit).
    pub ceiling: f64,
}

/// The section, resolved and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowControlConfig {
    /// Global limits; `None` = unlimited.
    pub max_requests: Option<u64>,
    pub max_bytes: Option<u64>,
    /// How long a request may wait; `None` ("0s") = no expiry.
    pub request_ttl: Option<Duration>,
    /// How long it may wait while the pool has no endpoint.
    pub no_endpoint_ttl: Option<Duration>,
    /// Every band, highest priority first; band 0 always exists.
    pub bands: Vec<BandConfig>,
    /// With `priority-reserve-policy`: the room each band keeps for the bands above it.
    pub reserve: Option<ReserveConfig>,
}

impl FlowControlConfig {
    /// A band orders its requests by their TTFT SLO's deadline (`slo-deadline-ordering-policy`).
    pub fn orders_by_slo(&self) -> bool {
        self.bands
            .iter()
            .any(|band| band.ordering == crate::scheduling::flow_policy::Ordering::SloDeadline)
    }

    /// The band a priority is queued in: its own, else band 0 (as llm-d falls back).
    pub fn band(&self, priority: i32) -> Option<&BandConfig> {
        self.bands
            .iter()
            .find(|b| b.priority == priority)
            .or_else(|| self.bands.iter().find(|b| b.priority == 0))
    }
}

/// Resolves a policy reference: a declared plugin by name, else one of llm-d's defaults
/// by type (llm-d adds those even when undeclared).
pub type PolicyLookup<'a> = &'a dyn Fn(&str) -> Option<FlowPolicy>;

/// Builds the section. `priorities` are the objectives' priorities: each gets a band from
/// the templates when not listed. Errors name the key.
pub fn build(
    raw: &RawFlowControl,
    priorities: &[i32],
    lookup: PolicyLookup<'_>,
) -> Result<FlowControlConfig, (String, String)> {
    if raw.enable_eviction {
        return Err((
            "flowControl.enableEviction".into(),
            "revoking requests already sent to a pod is not supported: a proxy filter cannot recall a request it let go; held requests are refused by TTL and capacity instead".into(),
        ));
    }
    let usage_limit = match &raw.usage_limit_policy_plugin_ref {
        None => None,
        Some(name) => match lookup(name) {
            Some(FlowPolicy::UsageLimit(limit)) => Some(limit),
            _ => {
                return Err(not_a(
                    "flowControl.usageLimitPolicyPluginRef",
                    name,
                    "usage-limit policy",
                ))
            }
        },
    };
    let template = |raw_band: Option<&RawBand>, key: &str| match raw_band {
        Some(band) => resolve_band(band, key, lookup),
        None => resolve_band(&RawBand::default(), key, lookup),
    };
    let default_band = template(
        raw.default_priority_band.as_ref(),
        "flowControl.defaultPriorityBand",
    )?;
    let negative_band = match &raw.default_negative_priority_band {
        Some(band) => resolve_band(band, "flowControl.defaultNegativePriorityBand", lookup)?,
        None => default_band.clone(),
    };
    let mut bands = Vec::new();
    for (i, band) in raw.priority_bands.iter().enumerate() {
        let key = format!("flowControl.priorityBands[{i}]");
        if bands
            .iter()
            .any(|b: &BandConfig| b.priority == band.priority)
        {
            return Err((key, format!("priority {} is listed twice", band.priority)));
        }
        bands.push(resolve_band(band, &key, lookup)?);
    }
    for &priority in priorities.iter().chain(std::iter::once(&0)) {
        if !bands.iter().any(|b| b.priority == priority) {
            let template = if priority < 0 {
                &negative_band
            } else {
                &default_band
            };
            bands.push(BandConfig {
                priority,
                ..template.clone()
            });
        }
    }
    bands.sort_by_key(|band| std::cmp::Reverse(band.priority));
    let priorities: Vec<i32> = bands.iter().map(|b| b.priority).collect();
    // Without a usage limit configured, several bands keep room for the higher ones.
    let usage_limit = usage_limit.unwrap_or(if bands.len() > 1 {
        priority_reserve_policy::default_limit()
    } else {
        UsageLimit::Static { threshold: 1.0 }
    });
    let reserve = match usage_limit {
        UsageLimit::Reserve(reserve) => Some(reserve),
        _ => None,
    };
    for (band, ceiling) in bands.iter_mut().zip(usage_limit.ceilings(&priorities)) {
        band.ceiling = ceiling;
    }
    let request_ttl = ttl(raw.default_request_ttl.unwrap_or(DEFAULT_REQUEST_TTL));
    Ok(FlowControlConfig {
        max_requests: limit(raw.max_requests.as_ref(), "flowControl.maxRequests")?,
        max_bytes: limit(raw.max_bytes.as_ref(), "flowControl.maxBytes")?,
        request_ttl,
        no_endpoint_ttl: raw.no_endpoint_request_ttl.map_or(request_ttl, ttl),
        bands,
        reserve,
    })
}

fn ttl(duration: Duration) -> Option<Duration> {
    (!duration.is_zero()).then_some(duration)
}

fn not_a(key: &str, name: &str, what: &str) -> (String, String) {
    (
        key.to_owned(),
        format!("{name:?} is not a declared {what} (nor one of llm-d's defaults)"),
    )
}

fn resolve_band(
    raw: &RawBand,
    key: &str,
    lookup: PolicyLookup<'_>,
) -> Result<BandConfig, (String, String)> {
    let fairness_ref = raw
        .fairness_policy_ref
        .as_deref()
        .unwrap_or(global_strict_fairness_policy::TYPE);
    let Some(FlowPolicy::Fairness(fairness)) = lookup(fairness_ref) else {
        return Err(not_a(
            &format!("{key}.fairnessPolicyRef"),
            fairness_ref,
            "fairness policy",
        ));
    };
    let ordering_ref = raw
        .ordering_policy_ref
        .as_deref()
        .unwrap_or(fcfs_ordering_policy::TYPE);
    let Some(FlowPolicy::Ordering(ordering)) = lookup(ordering_ref) else {
        return Err(not_a(
            &format!("{key}.orderingPolicyRef"),
            ordering_ref,
            "ordering policy",
        ));
    };
    let or_default = |value: Option<u64>, default: u64| value.filter(|&v| v > 0).unwrap_or(default);
    Ok(BandConfig {
        priority: raw.priority,
        max_requests: or_default(
            limit(raw.max_requests.as_ref(), &format!("{key}.maxRequests"))?,
            DEFAULT_BAND_MAX_REQUESTS,
        ),
        max_bytes: or_default(
            limit(raw.max_bytes.as_ref(), &format!("{key}.maxBytes"))?,
            DEFAULT_BAND_MAX_BYTES,
        ),
        fairness,
        ordering,
        ceiling: 1.0,
    })
}

/// A limit written as a Kubernetes quantity (`1k`, `500M`, `10Gi`, `"1024"` or a number);
/// absent or 0 is `None` (no limit).
fn limit(value: Option<&Value>, key: &str) -> Result<Option<u64>, (String, String)> {
    let Some(value) = value else {
        return Ok(None);
    };
    let parsed = match value {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| format!("{n} is not a whole number >= 0")),
        Value::String(text) => parse_quantity(text),
        other => Err(format!("{other:?} is not a quantity")),
    };
    parsed
        .map(|n| (n > 0).then_some(n))
        .map_err(|reason| (key.to_owned(), reason))
}

/// Parses a Kubernetes quantity with a binary (`Ki`..`Ei`) or decimal (`k`..`E`) suffix.
pub fn parse_quantity(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(digits_end);
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a quantity (e.g. 500, 1k, 10Gi)"))?;
    let scale: u64 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return Err(format!("{text:?}: unknown quantity suffix {suffix:?}")),
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// llm-d's default policies, and ours, available without a `plugins` entry.
pub fn default_policy(name: &str) -> Option<FlowPolicy> {
    match name {
        global_strict_fairness_policy::TYPE => Some(FlowPolicy::Fairness(Fairness::GlobalStrict)),
        fcfs_ordering_policy::TYPE => Some(FlowPolicy::Ordering(Ordering::Fcfs)),
        static_usage_limit_policy::TYPE => Some(FlowPolicy::UsageLimit(UsageLimit::Static {
            threshold: 1.0,
        })),
        priority_reserve_policy::TYPE => Some(FlowPolicy::UsageLimit(
            priority_reserve_policy::default_limit(),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    fn parse(text: &str) -> Result<FlowControlConfig, (String, String)> {
        let raw: RawFlowControl = serde_yaml::from_str(text).unwrap();
        let lookup = |name: &str| match name {
            "rr" | "round-robin-fairness-policy" => {
                Some(FlowPolicy::Fairness(Fairness::RoundRobin))
            }
            "edf-ordering-policy" => Some(FlowPolicy::Ordering(Ordering::Edf)),
            other => default_policy(other),
        };
        build(&raw, &[7, -3], &lookup)
    }

    #[test]
    fn quantities_parse_as_kubernetes_writes_them() {
        assert_eq!(parse_quantity("1k"), Ok(1_000));
        assert_eq!(parse_quantity("10Gi"), Ok(10 << 30));
        assert_eq!(parse_quantity("500M"), Ok(500_000_000));
        assert_eq!(parse_quantity("1024"), Ok(1024));
        assert!(parse_quantity("1.5k").is_err());
        assert!(parse_quantity("-1").is_err());
        assert!(parse_quantity("9999999999Ti").is_err());
    }

    #[test]
    fn llm_d_sample_config_resolves_with_defaults_and_objective_bands() {
        let config = parse(
            "maxBytes: 10Gi\nmaxRequests: 1k\ndefaultRequestTTL: 60s\npriorityBands:\n- {priority: 100, maxRequests: '500', fairnessPolicyRef: rr}\n- {priority: -10, maxRequests: 50}\n",
        )
        .unwrap();
        assert_eq!(config.max_requests, Some(1_000));
        assert_eq!(config.max_bytes, Some(10 << 30));
        assert_eq!(config.request_ttl, Some(Duration::from_secs(60)));
        assert_eq!(
            config.no_endpoint_ttl, config.request_ttl,
            "defaults to the request TTL"
        );
        let priorities: Vec<i32> = config.bands.iter().map(|b| b.priority).collect();
        assert_eq!(
            priorities,
            vec![100, 7, 0, -3, -10],
            "highest first, 0 and objectives added"
        );
        let top = &config.bands[0];
        assert_eq!(
            (top.max_requests, top.fairness),
            (500, Fairness::RoundRobin)
        );
        assert_eq!(config.band(0).unwrap().max_bytes, DEFAULT_BAND_MAX_BYTES);
        assert_eq!(
            config.band(42).unwrap().priority,
            0,
            "unknown priority falls back to band 0"
        );
    }

    #[test]
    fn zero_ttl_means_no_expiry_and_unsupported_settings_are_refused() {
        let config = parse("defaultRequestTTL: 0s\nnoEndpointRequestTTL: 5s\n").unwrap();
        assert_eq!(
            (config.request_ttl, config.no_endpoint_ttl),
            (None, Some(Duration::from_secs(5)))
        );
        for (text, key) in [
            ("enableEviction: true", "flowControl.enableEviction"),
            (
                "priorityBands: [{priority: 1}, {priority: 1}]",
                "flowControl.priorityBands[1]",
            ),
            (
                "priorityBands: [{priority: 1, fairnessPolicyRef: nope}]",
                "flowControl.priorityBands[0].fairnessPolicyRef",
            ),
            (
                "defaultPriorityBand: {orderingPolicyRef: rr}",
                "flowControl.defaultPriorityBand.orderingPolicyRef",
            ),
            ("maxRequests: lots", "flowControl.maxRequests"),
            (
                "usageLimitPolicyPluginRef: rr",
                "flowControl.usageLimitPolicyPluginRef",
            ),
        ] {
            assert_eq!(parse(text).unwrap_err().0, key, "{text}");
        }
    }
}
