//! `decode-filter`: keeps endpoints that can decode, by their `llm-d.ai/role` label: `decode`,
//! `prefill-decode`, `both`, `encode-prefill-decode`, or no role at all (a plain aggregated
//! server).
//! `prefill-filter` and `encode-filter` are the same filter with other accepted roles.

use crate::endpoint::ROLE_LABEL;
use crate::scheduling::plugins::spec::{effective, Data, Kind, NoParameters, PluginSpec};
use crate::scheduling::{Filter, Plugin, SchedulingContext};
use serde_yaml::Value;

pub const TYPE: &str = "decode-filter";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Filter, build, effective::<NoParameters>)
    .consuming(&[Data::EndpointLabels]);

/// Keeps endpoints whose role is one of `roles` (or unlabelled, when `unlabelled` is set).
pub struct RoleFilter {
    pub roles: &'static [&'static str],
    pub unlabelled: bool,
}

impl RoleFilter {
    pub fn accepts(&self, role: Option<&str>) -> bool {
        match role {
            Some(role) => self.roles.contains(&role),
            None => self.unlabelled,
        }
    }
}

impl Filter for RoleFilter {
    fn filter(&mut self, ctx: &SchedulingContext<'_>, candidates: &mut Vec<usize>) {
        candidates.retain(|&i| {
            ctx.pool
                .get(i)
                .is_some_and(|e| self.accepts(e.label(ROLE_LABEL)))
        });
    }
}

/// Builds a role filter after checking it was given no parameters.
pub fn build_role_filter(parameters: &Value, filter: RoleFilter) -> Result<Plugin, String> {
    super::no_parameters(parameters)?;
    Ok(Plugin::Filter(Box::new(filter)))
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    build_role_filter(
        parameters,
        RoleFilter {
            roles: &["decode", "prefill-decode", "both", "encode-prefill-decode"],
            unlabelled: true,
        },
    )
}

/// Candidates left by `filter` over pods with roles: decode, prefill, both, none, encode,
/// encode-prefill, encode-prefill-decode.
#[cfg(test)]
pub(super) fn survivors(filter: &mut dyn Filter) -> Vec<usize> {
    use crate::request::InferenceRequest;
    use crate::scheduling::test_support::queues;
    let mut pool = queues(&[0.0; 7]);
    let roles = [
        Some("decode"),
        Some("prefill"),
        Some("both"),
        None,
        Some("encode"),
        Some("encode-prefill"),
        Some("encode-prefill-decode"),
    ];
    for (endpoint, role) in pool.endpoints.iter_mut().zip(roles) {
        if let Some(role) = role {
            endpoint.labels.insert(ROLE_LABEL.into(), role.into());
        }
    }
    let request = InferenceRequest::empty();
    let mut candidates = vec![0, 1, 2, 3, 4, 5, 6];
    filter.filter(&SchedulingContext::new(&request, &pool), &mut candidates);
    candidates
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn decode_keeps_decoders_and_unlabelled() {
        let Ok(Plugin::Filter(mut filter)) = build(&Value::Null) else {
            panic!("not a filter");
        };
        assert_eq!(survivors(filter.as_mut()), [0, 2, 3, 6]);
    }
}
