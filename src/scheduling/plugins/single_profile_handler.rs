//! `single-profile-handler`: runs the one scheduling profile and routes by its result.

use crate::scheduling::{Plugin, Profile, ProfileHandler, ProfileResult};
use serde_yaml::Value;

pub const TYPE: &str = "single-profile-handler";
/// The name older llm-d configs use.
pub const LEGACY_TYPE: &str = "single-profile";

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Parameters {}

pub struct SingleProfileHandler;

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let _: Parameters = super::parameters(parameters)?;
    Ok(Plugin::ProfileHandler(Box::new(SingleProfileHandler)))
}

impl ProfileHandler for SingleProfileHandler {
    fn next_profile(&self, _profiles: &[Profile], results: &[ProfileResult]) -> Option<usize> {
        results.is_empty().then_some(0)
    }

    fn primary_result(&self, _profiles: &[Profile], _results: &[ProfileResult]) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_the_first_profile_once() {
        assert_eq!(SingleProfileHandler.next_profile(&[], &[]), Some(0));
        let done = [ProfileResult {
            profile: 0,
            targets: vec![1],
        }];
        assert_eq!(SingleProfileHandler.next_profile(&[], &done), None);
    }
}
