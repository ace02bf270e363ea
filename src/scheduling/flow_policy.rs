//! Flow control's policies as plain data: what `flowControl` configures per band. The
//! plugins that configure them, and their behaviour, are in `plugins::flow_control`.

/// A configured flow-control policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FlowPolicy {
    Fairness(Fairness),
    Ordering(Ordering),
    /// Dispatch only while the pool's saturation is below `threshold` (0..=1].
    UsageLimit {
        threshold: f64,
    },
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
