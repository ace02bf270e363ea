//! Bounds on every duration, size and count the configuration sets. A value outside them is
//! refused at load, with the limit and the reason named, instead of being accepted and then
//! failing (or exhausting the VM) at run time.

use crate::duration::format_duration;
use std::time::Duration;

/// Envoy takes a callout's timeout as a signed 32-bit count of milliseconds and refuses the
/// call (`BadArgument`, status 2) when it is negative, so anything above `i32::MAX` ms
/// (~24.8 days) makes every `dispatch_http_call` fail.
pub const HOST_CALLOUT_TIMEOUT_MS: u64 = i32::MAX as u64;

/// An inclusive range of durations, and why it ends where it does.
#[derive(Debug, Clone, Copy)]
pub struct DurationBounds {
    pub min: Duration,
    pub max: Duration,
    pub why: &'static str,
}

impl DurationBounds {
    pub fn check(&self, value: Duration) -> Result<(), String> {
        if value < self.min {
            return Err(format!(
                "{} is below the minimum of {} ({})",
                format_duration(value),
                format_duration(self.min),
                self.why
            ));
        }
        if value > self.max {
            return Err(format!(
                "{} is above the maximum of {} ({})",
                format_duration(value),
                format_duration(self.max),
                self.why
            ));
        }
        Ok(())
    }
}

/// An inclusive range of counts or byte sizes, and why it ends where it does.
#[derive(Debug, Clone, Copy)]
pub struct CountBounds {
    pub min: u64,
    pub max: u64,
    /// What is counted, as the message says it ("bytes", "endpoints").
    pub unit: &'static str,
    pub why: &'static str,
}

impl CountBounds {
    pub fn check(&self, value: u64) -> Result<(), String> {
        if value < self.min {
            return Err(format!(
                "{value} {unit} is below the minimum of {} {unit} ({})",
                self.min,
                self.why,
                unit = self.unit
            ));
        }
        if value > self.max {
            return Err(format!(
                "{value} {unit} is above the maximum of {} {unit} ({})",
                self.max,
                self.why,
                unit = self.unit
            ));
        }
        Ok(())
    }

    pub fn check_usize(&self, value: usize) -> Result<(), String> {
        self.check(u64::try_from(value).unwrap_or(u64::MAX))
    }
}

const fn ms(value: u64) -> Duration {
    Duration::from_millis(value)
}

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);
const MIB: u64 = 1 << 20;

/// `pool.refreshMetricsInterval`: the tick period of every VM.
pub const REFRESH_METRICS_INTERVAL: DurationBounds = DurationBounds {
    min: ms(10),
    max: MINUTE,
    why:
        "every VM ticks at this period; faster burns CPU, slower leaves metrics too old to route on",
};

/// `pool.metricsStalenessThreshold`; also at least `refreshMetricsInterval`.
pub const METRICS_STALENESS_THRESHOLD: DurationBounds = DurationBounds {
    min: ms(1),
    max: HOUR,
    why: "older metrics describe a pod that no longer exists",
};

/// `pool.metricsTimeout`, sent as each scrape's callout timeout.
pub const METRICS_TIMEOUT: DurationBounds = DurationBounds {
    min: ms(1),
    max: MINUTE,
    why: "a pod slower than that is failed anyway; Envoy itself refuses callout timeouts above 2147483647ms (~24.8 days) and every scrape would fail",
};

/// `pool.passiveHealthBackoff`.
pub const PASSIVE_HEALTH_BACKOFF: DurationBounds = DurationBounds {
    min: Duration::ZERO,
    max: HOUR,
    why: "a pod avoided longer is lost to the pool; its scrapes already say when it is down",
};

/// `pool.discovery.interval`, also the list call's timeout.
pub const DISCOVERY_INTERVAL: DurationBounds = DurationBounds {
    min: ms(100),
    max: HOUR,
    why: "the API server is asked at this period; a slower one misses pods for too long",
};

/// `metricsStalenessThreshold` of `utilization-detector`.
pub const DETECTOR_STALENESS_THRESHOLD: DurationBounds = DurationBounds {
    min: ms(1),
    max: HOUR,
    why: "0 makes every endpoint saturated; older metrics describe a pod that no longer exists",
};

/// `pool.maxRequestBodyBytes`.
pub const MAX_REQUEST_BODY_BYTES: CountBounds = CountBounds {
    min: 1,
    max: 256 * MIB,
    unit: "bytes",
    why: "the body is copied into the VM's linear memory, at most 4 GiB and never returned",
};

/// `pool.maxMetricsBytes`: a real vLLM page is ~56 KB.
pub const MAX_METRICS_BYTES: CountBounds = CountBounds {
    min: 4096,
    max: 64 * MIB,
    unit: "bytes",
    why: "a real vLLM /metrics page is ~56 KB; each accepted page is copied into the VM, whose memory never shrinks",
};

/// Endpoints in `pool.endpoints`, and in one discovery answer.
pub const ENDPOINTS: CountBounds = CountBounds {
    min: 1,
    max: 65_536,
    unit: "endpoints",
    why: "every VM scrapes, scores and keeps stats for each endpoint",
};

/// `pool.maxScrapesInFlight`.
pub const SCRAPES_IN_FLIGHT: CountBounds = CountBounds {
    min: 1,
    max: 4096,
    unit: "scrapes",
    why: "each is a callout Envoy holds open; the scrapes' cluster breakers are sized for 4,096",
};

/// `pool.replicas`.
pub const REPLICAS: CountBounds = CountBounds {
    min: 1,
    max: 1000,
    unit: "replicas",
    why: "each replica scrapes once per replicas x refreshMetricsInterval, which must stay within the staleness threshold",
};

/// `pool.peers.addresses`.
pub const PEERS: CountBounds = CountBounds {
    min: 0,
    max: 256,
    unit: "peers",
    why: "the hub calls every other replica each sync interval",
};

/// `pool.peers.syncInterval`.
pub const PEER_SYNC_INTERVAL: DurationBounds = DurationBounds {
    min: ms(10),
    max: MINUTE,
    why: "faster burns every replica's CPU on calls; slower leaves the replicas apart for longer",
};

/// `pool.discovery.targetPorts`.
pub const TARGET_PORTS: CountBounds = CountBounds {
    min: 1,
    max: 64,
    unit: "ports",
    why: "each port of each pod is an endpoint",
};

/// `pools`.
pub const POOLS: CountBounds = CountBounds {
    min: 1,
    max: 1024,
    unit: "pools",
    why: "each pool has its own scheduler, scrapes and stats in every VM",
};

/// `pool.objectives`.
pub const OBJECTIVES: CountBounds = CountBounds {
    min: 0,
    max: 1024,
    unit: "objectives",
    why: "each request looks its objective up among them",
};

/// Bytes of `pool.metricsPath` and of header values the filter sends.
pub const HEADER_VALUE_BYTES: CountBounds = CountBounds {
    min: 1,
    max: 8192,
    unit: "bytes",
    why: "it is sent as a request header",
};

/// `maxNumOfEndpoints` of every picker.
pub const PICKED_ENDPOINTS: CountBounds = CountBounds {
    min: 1,
    max: 256,
    unit: "endpoints",
    why: "the picks travel in one header, primary and fallbacks",
};

/// A scorer's `weight` in a profile.
pub const MAX_WEIGHT: f64 = 1e6;

/// `blockSizeTokens` of `prefix-cache-scorer`.
pub const BLOCK_SIZE_TOKENS: CountBounds = CountBounds {
    min: 1,
    max: 4096,
    unit: "tokens",
    why: "engines use blocks of 8 to 256 tokens",
};

/// `hashBlockSize` (characters) of `prefix-cache-scorer`.
pub const HASH_BLOCK_CHARS: CountBounds = CountBounds {
    min: 1,
    max: 4096 * 4,
    unit: "characters",
    why: "engines use blocks of 8 to 256 tokens, ~4 characters each",
};

/// `maxPrefixBlocksToMatch` of `prefix-cache-scorer`.
pub const PREFIX_BLOCKS_TO_MATCH: CountBounds = CountBounds {
    min: 1,
    max: 65_536,
    unit: "blocks",
    why: "each block of the prompt is hashed and looked up on every request",
};

/// `lruCapacityPerServer` of `prefix-cache-scorer`, and the most `autoTune` sets from a pod's
/// `vllm:cache_config_info`.
pub const LRU_CAPACITY_PER_SERVER: CountBounds = CountBounds {
    min: 1,
    max: 1 << 21,
    unit: "blocks",
    why: "2,097,152 blocks exceed any GPU's KV cache; the prefix index's budget caps the pods' sum anyway",
};

/// (block, pod) entries one prefix index holds at most, whatever the pods' capacities add up
/// to: 32 bytes each, so about 64 MiB per VM.
pub const PREFIX_INDEX_ENTRIES: usize = 1 << 21;

/// `affinityQueueLimit` of `prefix-cache-scorer` (0 disables).
pub const AFFINITY_QUEUE_LIMIT: CountBounds = CountBounds {
    min: 0,
    max: 100_000,
    unit: "requests",
    why: "a queue that long ahead of a cached prefix is never worth joining",
};

/// True when `text` can be sent as a header value: visible ASCII, no spaces or controls.
pub fn is_token(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn bounds_name_the_limit_and_why() {
        let error = METRICS_TIMEOUT
            .check(Duration::from_secs(3600 * 1000))
            .unwrap_err();
        assert!(error.contains("above the maximum of 60s"), "{error}");
        assert!(error.contains("2147483647ms"), "{error}");
        assert!(METRICS_TIMEOUT.check(MINUTE).is_ok());
        assert!(METRICS_TIMEOUT.check(ms(1)).is_ok());
        assert!(METRICS_TIMEOUT
            .check(Duration::ZERO)
            .unwrap_err()
            .contains("below the minimum of 1ms"));
        let error = MAX_METRICS_BYTES.check(1).unwrap_err();
        assert!(
            error.contains("1 bytes is below the minimum of 4096 bytes"),
            "{error}"
        );
        assert!(MAX_METRICS_BYTES.check_usize(usize::MAX).is_err());
    }

    #[test]
    fn every_duration_bound_fits_the_host() {
        for bounds in [
            REFRESH_METRICS_INTERVAL,
            METRICS_STALENESS_THRESHOLD,
            METRICS_TIMEOUT,
            PASSIVE_HEALTH_BACKOFF,
            DISCOVERY_INTERVAL,
            DETECTOR_STALENESS_THRESHOLD,
        ] {
            assert!(bounds.min <= bounds.max);
            // Tick periods and callout timeouts are u32 / i32 milliseconds at the host.
            assert!(crate::duration::duration_ms(bounds.max) < HOST_CALLOUT_TIMEOUT_MS);
        }
    }

    #[test]
    fn tokens() {
        assert!(is_token("/metrics?x=1"));
        assert!(!is_token(""));
        assert!(!is_token("/a b"));
        assert!(!is_token("/a\r\nx: y"));
        assert!(!is_token("/é"));
    }
}
