//! Flow-control policies (feature gate `flowControl`): how a priority band picks the next flow
//! to serve (fairness), how a flow orders its own requests (ordering), and when a band may
//! dispatch at all (usage limit). They are plain data; `crate::flow_control` applies them.

pub mod edf_ordering_policy;
pub mod fcfs_ordering_policy;
pub mod global_strict_fairness_policy;
pub mod priority_holdback_policy;
pub mod priority_reserve_policy;
pub mod round_robin_fairness_policy;
pub mod slo_deadline_ordering_policy;
pub mod static_usage_limit_policy;

/// Flow-control policies take no parameters except the usage limit's `threshold`.
pub(super) fn no_parameters_policy(
    parameters: &serde_yaml::Value,
    policy: crate::scheduling::flow_policy::FlowPolicy,
) -> Result<crate::scheduling::Plugin, String> {
    super::spec::no_parameters(parameters)?;
    Ok(crate::scheduling::Plugin::FlowPolicy(policy))
}
