//! `header-profile-handler` (llm-d-router): runs the one profile the request's `epp-profile`
//! header names (or `defaultProfile` without one), for a coordinator that sends a request's
//! encode, prefill and decode stages to the gateway one at a time. With a single profile, that
//! one always runs. A value naming no profile runs none, and the request is answered 503.

use crate::protocol::PROFILE_HEADER;
use crate::scheduling::plugins::spec::{effective, Data, Kind, PluginSpec};
use crate::scheduling::{
    Plugin, PluginInstance, PluginSummary, Profile, ProfileHandler, ProfileResult,
    SchedulingContext,
};
use serde_yaml::Value;

pub const TYPE: &str = "header-profile-handler";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec =
    PluginSpec::new(TYPE, Kind::ProfileHandler, build, effective::<Parameters>)
        .consuming(&[Data::RequestHeader(PROFILE_HEADER)]);

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    /// llm-d's default, `EPP-Profile`; header names are case-insensitive.
    pub header_name: String,
    pub default_profile: String,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            header_name: "EPP-Profile".into(),
            default_profile: "decode".into(),
        }
    }
}

pub struct HeaderProfileHandler {
    default_profile: String,
    /// The configured profiles' names, by index.
    names: Vec<String>,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    if !parameters
        .header_name
        .trim()
        .eq_ignore_ascii_case(PROFILE_HEADER)
    {
        return Err(format!(
            "headerName {:?}: the filter reads the profile from {PROFILE_HEADER:?} only (llm-d's default)",
            parameters.header_name
        ));
    }
    Ok(Plugin::ProfileHandler(Box::new(HeaderProfileHandler {
        default_profile: parameters.default_profile.trim().to_owned(),
        names: Vec::new(),
    })))
}

impl ProfileHandler for HeaderProfileHandler {
    fn resolve(&mut self, profiles: &[Profile], _plugins: &[PluginSummary]) -> Result<(), String> {
        self.names = profiles.iter().map(|p| p.name.clone()).collect();
        Ok(())
    }

    fn next_profile(
        &self,
        ctx: &SchedulingContext<'_>,
        _plugins: &[PluginInstance],
        results: &[ProfileResult],
    ) -> Option<usize> {
        if !results.is_empty() {
            return None;
        }
        if self.names.len() == 1 {
            return Some(0);
        }
        let named = ctx
            .request
            .headers
            .profile
            .as_deref()
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .unwrap_or(&self.default_profile);
        self.names.iter().position(|name| name == named)
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

    fn handler() -> HeaderProfileHandler {
        let Ok(Plugin::ProfileHandler(_)) = build(&Value::Null) else {
            panic!("not a profile handler");
        };
        HeaderProfileHandler {
            default_profile: "decode".into(),
            names: vec!["encode".into(), "prefill".into(), "decode".into()],
        }
    }

    fn next(handler: &HeaderProfileHandler, header: Option<&str>) -> Option<usize> {
        let mut request = InferenceRequest::empty();
        request.headers.profile = header.map(str::to_owned);
        let pool = Pool::default();
        handler.next_profile(&SchedulingContext::new(&request, &pool), &[], &[])
    }

    #[test]
    fn the_header_names_the_one_profile_that_runs() {
        let handler = handler();
        assert_eq!(next(&handler, Some(" prefill ")), Some(1));
        assert_eq!(next(&handler, None), Some(2), "the default profile");
        assert_eq!(next(&handler, Some("")), Some(2));
        assert_eq!(next(&handler, Some("Prefill")), None, "names are exact");
        let single = HeaderProfileHandler {
            default_profile: "decode".into(),
            names: vec!["only".into()],
        };
        assert_eq!(next(&single, Some("anything")), Some(0));
    }

    #[test]
    fn only_llm_d_s_header_is_read() {
        assert!(build(&serde_yaml::from_str("{headerName: epp-profile}").unwrap()).is_ok());
        let other = build(&serde_yaml::from_str("{headerName: x-stage}").unwrap());
        assert!(other.err().unwrap().contains("headerName"));
    }
}
