//! `disagg-profile-handler`: prefill/decode disaggregation. The decode profile runs first and
//! its pick routes the request; then the prefill decider (`deciders.prefill`, a P/D decider
//! plugin) looks at the decode pick and says whether a prefill endpoint is also picked, by the
//! prefill profile. That endpoint goes to the decode pod in `x-prefiller-host-port`.
//! Without a decider, every request with a prefill profile is disaggregated.
//! The older `pd-profile-handler` is the same handler with a built-in prefix decider.

use crate::scheduling::plugins::spec::{effective, Ignored, Kind, PluginSpec};
use crate::scheduling::{
    PdDecider, Plugin, PluginInstance, PluginSummary, Profile, ProfileHandler, ProfileResult,
    SchedulingContext,
};
use serde_yaml::Value;
use std::collections::BTreeMap;

pub const TYPE: &str = "disagg-profile-handler";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec =
    PluginSpec::new(TYPE, Kind::ProfileHandler, build, effective::<Parameters>).ignoring(&[
        Ignored::parameter(
            "encodeProfile",
            "encode disaggregation is not implemented: decode and prefill run",
        ),
        Ignored::parameter("stageOrder", "the stages run decode, then prefill"),
    ]);

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    /// Stage -> decider plugin name; only `prefill` is a stage here.
    pub deciders: BTreeMap<String, String>,
    pub decode_profile: String,
    pub prefill_profile: String,
    /// llm-d-router's profile names by stage; a name here wins over the flat keys above.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub profiles: BTreeMap<String, String>,
    /// llm-d-router's older flat decider keys, read as `deciders.prefill`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub prefill_decider_plugin_name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub decider_plugin_name: String,
    /// llm-d-router's encode stage: its profile name loads (it is unused until a decider
    /// enables the stage); an encode decider is refused.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub encode_profile: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub encode_decider_plugin_name: String,
    /// The order of the encode and prefill stages: with no encode stage there is one order.
    #[serde(skip_serializing_if = "Value::is_null")]
    pub stage_order: Value,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            deciders: BTreeMap::new(),
            decode_profile: "decode".into(),
            prefill_profile: "prefill".into(),
            profiles: BTreeMap::new(),
            prefill_decider_plugin_name: String::new(),
            decider_plugin_name: String::new(),
            encode_profile: String::new(),
            encode_decider_plugin_name: String::new(),
            stage_order: Value::Null,
        }
    }
}

const ENCODE_REFUSED: &str =
    "encode disaggregation is not implemented: this handler runs decode and prefill only";

/// How the handler decides whether to disaggregate.
pub enum Decision {
    /// A decider plugin, by name until the loader resolves it to an index.
    Plugin {
        name: String,
        index: usize,
    },
    /// `pd-profile-handler`'s own rule.
    BuiltIn(Box<dyn PdDecider>),
    Always,
}

pub struct DisaggProfileHandler {
    decode_profile: String,
    prefill_profile: String,
    decode: usize,
    prefill: Option<usize>,
    decision: Decision,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let mut parameters: Parameters = super::parameters(parameters)?;
    if parameters.deciders.contains_key("encode")
        || !parameters.encode_decider_plugin_name.is_empty()
    {
        return Err(format!("deciders.encode: {ENCODE_REFUSED}"));
    }
    if let Some(stage) = parameters.deciders.keys().find(|stage| *stage != "prefill") {
        return Err(format!(
            "deciders: stage {stage:?} is not supported (only \"prefill\")"
        ));
    }
    if let Some(stage) = parameters
        .profiles
        .keys()
        .find(|stage| !matches!(stage.as_str(), "decode" | "prefill" | "encode"))
    {
        return Err(format!(
            "profiles: stage {stage:?} is not one of decode, prefill, encode"
        ));
    }
    if let Some(decode) = parameters.profiles.remove("decode") {
        parameters.decode_profile = decode;
    }
    if let Some(prefill) = parameters.profiles.remove("prefill") {
        parameters.prefill_profile = prefill;
    }
    let decider = parameters.deciders.remove("prefill").or_else(|| {
        [
            parameters.prefill_decider_plugin_name,
            parameters.decider_plugin_name,
        ]
        .into_iter()
        .find(|name| !name.is_empty())
    });
    let decision = match decider {
        Some(name) => Decision::Plugin {
            name,
            index: usize::MAX,
        },
        None => Decision::Always,
    };
    Ok(Plugin::ProfileHandler(Box::new(DisaggProfileHandler::new(
        parameters.decode_profile,
        parameters.prefill_profile,
        decision,
    ))))
}

impl DisaggProfileHandler {
    pub fn new(decode_profile: String, prefill_profile: String, decision: Decision) -> Self {
        DisaggProfileHandler {
            decode_profile,
            prefill_profile,
            decode: 0,
            prefill: None,
            decision,
        }
    }

    fn disaggregate(
        &self,
        ctx: &SchedulingContext<'_>,
        plugins: &[PluginInstance],
        decode_endpoint: usize,
    ) -> bool {
        match &self.decision {
            Decision::Always => true,
            Decision::BuiltIn(decider) => decider.disaggregate(ctx, decode_endpoint),
            Decision::Plugin { index, .. } => match plugins.get(*index).map(|p| &p.plugin) {
                Some(Plugin::PdDecider(decider)) => decider.disaggregate(ctx, decode_endpoint),
                _ => false,
            },
        }
    }
}

impl ProfileHandler for DisaggProfileHandler {
    fn resolve(&mut self, profiles: &[Profile], plugins: &[PluginSummary]) -> Result<(), String> {
        let find = |name: &str| profiles.iter().position(|p| p.name == name);
        self.decode = find(&self.decode_profile).ok_or_else(|| {
            format!(
                "no scheduling profile named {:?} (the decode profile)",
                self.decode_profile
            )
        })?;
        self.prefill = find(&self.prefill_profile);
        if let Decision::Plugin { name, index } = &mut self.decision {
            *index = plugins
                .iter()
                .position(|p| p.name == *name && p.is_pd_decider)
                .ok_or_else(|| format!("deciders.prefill: no P/D decider plugin named {name:?}"))?;
        }
        Ok(())
    }

    fn next_profile(
        &self,
        ctx: &SchedulingContext<'_>,
        plugins: &[PluginInstance],
        results: &[ProfileResult],
    ) -> Option<usize> {
        match results {
            [] => Some(self.decode),
            [decode] => {
                let prefill = self.prefill?;
                let endpoint = *decode.targets.first()?;
                self.disaggregate(ctx, plugins, endpoint).then_some(prefill)
            }
            _ => None,
        }
    }

    fn primary_result(&self, results: &[ProfileResult]) -> usize {
        results
            .iter()
            .position(|r| r.profile == self.decode)
            .unwrap_or(0)
    }

    fn prefill_result(&self, results: &[ProfileResult]) -> Option<usize> {
        let prefill = self.prefill?;
        results.iter().position(|r| r.profile == prefill)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::Pool;
    use crate::harness::test;
    use crate::request::InferenceRequest;

    fn profile(name: &str) -> Profile {
        Profile {
            name: name.into(),
            filters: vec![],
            scorers: vec![],
            picker: 0,
        }
    }

    #[test]
    fn decode_first_then_prefill_when_decided() {
        let mut handler =
            DisaggProfileHandler::new("decode".into(), "prefill".into(), Decision::Always);
        let profiles = [profile("prefill"), profile("decode")];
        handler.resolve(&profiles, &[]).unwrap();
        let (request, pool) = (InferenceRequest::empty(), Pool::default());
        let ctx = SchedulingContext::new(&request, &pool);
        assert_eq!(handler.next_profile(&ctx, &[], &[]), Some(1));
        let decode = ProfileResult {
            profile: 1,
            targets: vec![4],
        };
        assert_eq!(
            handler.next_profile(&ctx, &[], std::slice::from_ref(&decode)),
            Some(0)
        );
        let prefill = ProfileResult {
            profile: 0,
            targets: vec![2],
        };
        let results = [decode, prefill];
        assert_eq!(handler.next_profile(&ctx, &[], &results), None);
        assert_eq!(handler.primary_result(&results), 0);
        assert_eq!(handler.prefill_result(&results), Some(1));
    }

    #[test]
    fn resolution_errors_name_what_is_missing() {
        let mut handler =
            DisaggProfileHandler::new("decode".into(), "prefill".into(), Decision::Always);
        assert!(handler
            .resolve(&[profile("default")], &[])
            .unwrap_err()
            .contains("decode"));
        let value: Value = serde_yaml::from_str("{deciders: {prefill: missing}}").unwrap();
        let Ok(Plugin::ProfileHandler(mut handler)) = build(&value) else {
            panic!("not a handler");
        };
        assert!(handler
            .resolve(&[profile("decode")], &[])
            .unwrap_err()
            .contains("missing"));
        let value: Value = serde_yaml::from_str("{deciders: {encode: x}}").unwrap();
        assert!(build(&value).is_err());
    }
}
