//! Flow-control policies (feature gate `flowControl`): how a priority band picks the next flow
//! to serve (fairness), how a flow orders its own requests (ordering), and when a band may
//! dispatch at all (usage limit). They are plain data; `crate::flow_control` applies them.

pub mod edf_ordering_policy;
pub mod fcfs_ordering_policy;
pub mod global_strict_fairness_policy;
pub mod round_robin_fairness_policy;
pub mod slo_deadline_ordering_policy;
pub mod static_usage_limit_policy;

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
    /// Arrival sequence (monotonic per VM) and time.
    pub arrived_ms: u64,
    /// When the queue gives up on it (arrival + TTL); `u64::MAX` without a TTL.
    pub expires_ms: u64,
    /// Arrival + the request's TTFT objective, when it stated one.
    pub slo_deadline_ms: Option<u64>,
}

impl Ordering {
    /// Smaller goes first; ties fall back to arrival.
    pub fn key(self, facts: &OrderFacts) -> (u64, u64) {
        let first = match self {
            Ordering::Fcfs => fcfs_ordering_policy::key(facts),
            Ordering::Edf => edf_ordering_policy::key(facts),
            Ordering::SloDeadline => slo_deadline_ordering_policy::key(facts),
        };
        (first, facts.arrived_ms)
    }
}

/// Flow-control policies take no parameters except the usage limit's `threshold`.
pub(super) fn no_parameters_policy(
    parameters: &serde_yaml::Value,
    policy: FlowPolicy,
) -> Result<crate::scheduling::Plugin, String> {
    super::spec::no_parameters(parameters)?;
    Ok(crate::scheduling::Plugin::FlowPolicy(policy))
}
