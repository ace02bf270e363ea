//! Flow control's policies applied: each configured policy's behaviour (an ordering key) and
//! name come from its plugin file in `plugins::flow_control`.

use crate::scheduling::flow_policy::{Fairness, OrderFacts, Ordering};
use crate::scheduling::plugins::flow_control::{
    edf_ordering_policy, fcfs_ordering_policy, global_strict_fairness_policy,
    round_robin_fairness_policy, slo_deadline_ordering_policy,
};

/// The ordering policy's key for a waiting request: smaller goes first; ties fall back to
/// arrival.
pub fn ordering_key(ordering: Ordering, facts: &OrderFacts) -> (u64, u64) {
    let first = match ordering {
        Ordering::Fcfs => fcfs_ordering_policy::key(facts),
        Ordering::Edf => edf_ordering_policy::key(facts),
        Ordering::SloDeadline => slo_deadline_ordering_policy::key(facts),
    };
    (first, facts.arrived_ms)
}

/// The plugin type that configures a fairness policy.
pub fn fairness_type(fairness: Fairness) -> &'static str {
    match fairness {
        Fairness::GlobalStrict => global_strict_fairness_policy::TYPE,
        Fairness::RoundRobin => round_robin_fairness_policy::TYPE,
    }
}

/// The plugin type that configures an ordering policy.
pub fn ordering_type(ordering: Ordering) -> &'static str {
    match ordering {
        Ordering::Fcfs => fcfs_ordering_policy::TYPE,
        Ordering::Edf => edf_ordering_policy::TYPE,
        Ordering::SloDeadline => slo_deadline_ordering_policy::TYPE,
    }
}
