//! Flow control's policies as plain data: what `flowControl` configures per band. The
//! plugins that configure them, and their behaviour, are in `plugins::flow_control`.

/// A configured flow-control policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FlowPolicy {
    Fairness(Fairness),
    Ordering(Ordering),
    UsageLimit(UsageLimit),
}

/// When a band may dispatch: while the pool's saturation is below its ceiling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UsageLimit {
    /// `static-usage-limit-policy`: every band's ceiling is `threshold`.
    Static { threshold: f64 },
    /// `priority-holdback-policy`: ceilings fall linearly from `max` (the highest band) to
    /// `min` (the lowest), by the bands' rank or (`by_value`) their priority values, so
    /// lower bands leave room that only higher ones may take.
    Holdback { min: f64, max: f64, by_value: bool },
    /// `priority-reserve-policy`: no fixed ceiling; each band leaves free the slots the
    /// bands above it need at the rate they arrive (`crate::flow_control::reserve`).
    Reserve(ReserveConfig),
}

impl UsageLimit {
    /// The ceilings of bands with these priorities (highest first).
    pub fn ceilings(self, priorities: &[i32]) -> Vec<f64> {
        let (min, max, by_value) = match self {
            UsageLimit::Static { threshold } => return vec![threshold; priorities.len()],
            UsageLimit::Reserve(_) => return vec![1.0; priorities.len()],
            UsageLimit::Holdback { min, max, by_value } => (min, max, by_value),
        };
        let (Some(&top), Some(&bottom)) = (priorities.first(), priorities.last()) else {
            return Vec::new();
        };
        let last = priorities.len().saturating_sub(1).max(1) as f64;
        priorities
            .iter()
            .enumerate()
            .map(|(rank, &priority)| {
                let from_top = if by_value {
                    let below_top = i64::from(top) - i64::from(priority);
                    let span = (i64::from(top) - i64::from(bottom)).max(1);
                    below_top as f64 / span as f64
                } else {
                    rank as f64 / last
                };
                max - (max - min) * from_top
            })
            .collect()
    }
}

/// `priority-reserve-policy`'s settings (applied by `crate::flow_control::reserve`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReserveConfig {
    /// The share of higher-band arrivals that may find every slot taken.
    pub wait_share: f64,
    /// At most this share of the pool's slots is kept.
    pub max_share: f64,
    /// Arrivals and dispatches older than about this weigh little.
    pub window_ms: u64,
}

/// Which flow of a band goes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fairness {
    /// `global-strict-fairness-policy`: the band is one queue in ordering-policy order.
    #[default]
    GlobalStrict,
    /// `round-robin-fairness-policy`: flows take turns, in fairness-id order.
    RoundRobin,
}

/// Which request of a flow goes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ordering {
    /// `fcfs-ordering-policy`: arrival order.
    #[default]
    Fcfs,
    /// `edf-ordering-policy`: earliest queue deadline (arrival + TTL) first.
    Edf,
    /// `slo-deadline-ordering-policy`: earliest arrival + `x-llm-d-slo-ttft-ms` first.
    SloDeadline,
}

/// What an ordering policy needs to know about a waiting request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderFacts {
    /// Arrival time.
    pub arrived_ms: u64,
    /// When the queue gives up on it (arrival + TTL); `u64::MAX` without a TTL.
    pub expires_ms: u64,
    /// Arrival + the request's TTFT objective, when it stated one.
    pub slo_deadline_ms: Option<u64>,
}
