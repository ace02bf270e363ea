//! `single-profile-handler`: runs the one scheduling profile and routes by its result.

use crate::scheduling::plugins::spec::{effective, Kind, NoParameters, PluginSpec};
use crate::scheduling::{
    Plugin, PluginInstance, PluginSummary, Profile, ProfileHandler, ProfileResult,
    SchedulingContext,
};
use serde_yaml::Value;

pub const TYPE: &str = "single-profile-handler";
/// The name older llm-d configs use.
pub const LEGACY_TYPE: &str = "single-profile";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec =
    PluginSpec::new(TYPE, Kind::ProfileHandler, build, effective::<NoParameters>)
        .with_aliases(&[LEGACY_TYPE]);

pub struct SingleProfileHandler;

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    super::no_parameters(parameters)?;
    Ok(Plugin::ProfileHandler(Box::new(SingleProfileHandler)))
}

impl ProfileHandler for SingleProfileHandler {
    fn resolve(&mut self, profiles: &[Profile], _plugins: &[PluginSummary]) -> Result<(), String> {
        match profiles.len() {
            1 => Ok(()),
            n => Err(format!(
                "single-profile-handler needs exactly one scheduling profile, found {n}"
            )),
        }
    }

    fn next_profile(
        &self,
        _ctx: &SchedulingContext<'_>,
        _plugins: &[PluginInstance],
        results: &[ProfileResult],
    ) -> Option<usize> {
        results.is_empty().then_some(0)
    }

    fn primary_result(&self, _results: &[ProfileResult]) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::Pool;
    use crate::harness::test;
    use crate::request::InferenceRequest;

    #[test]
    fn runs_the_first_profile_once() {
        let (request, pool) = (InferenceRequest::empty(), Pool::default());
        let ctx = SchedulingContext::new(&request, &pool);
        assert_eq!(SingleProfileHandler.next_profile(&ctx, &[], &[]), Some(0));
        let done = [ProfileResult {
            profile: 0,
            targets: vec![1],
        }];
        assert_eq!(SingleProfileHandler.next_profile(&ctx, &[], &done), None);
        assert!(SingleProfileHandler.resolve(&[], &[]).is_err());
    }
}
