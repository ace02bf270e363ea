//! GIE's defaults for what a document leaves out: the plugins and profile of a document that
//! declares none, the profile of one that declares plugins only, the picker of a profile
//! without one.

use super::raw::{RawConfig, RawPlugin, RawProfile, RawProfilePlugin};
use crate::scheduling::plugins::{
    self, picker::max_score_picker, profile_handler::single_profile_handler,
};
use crate::scheduling::{Plugin, PluginInstance};
use serde_yaml::Value;

/// GIE's defaults: no plugins at all means queue (2), KV cache (2) and prefix (3) scorers; no
/// profiles means one `default` profile using every declared filter, scorer and picker.
pub(super) fn with_defaults(raw: &RawConfig) -> (Vec<RawPlugin>, Vec<RawProfile>) {
    if raw.plugins.is_empty() && raw.scheduling_profiles.is_empty() {
        let plugin = |type_name: &str| RawPlugin {
            name: None,
            type_name: type_name.into(),
            parameters: Value::Null,
        };
        let reference = |name: &str, weight| RawProfilePlugin {
            plugin_ref: name.into(),
            weight,
        };
        let plugins = vec![
            plugin("queue-scorer"),
            plugin("kv-cache-utilization-scorer"),
            plugin("prefix-cache-scorer"),
            plugin(max_score_picker::TYPE),
            plugin(single_profile_handler::TYPE),
        ];
        let profile = RawProfile {
            name: "default".into(),
            plugins: vec![
                reference("queue-scorer", Some(2.0)),
                reference("kv-cache-utilization-scorer", Some(2.0)),
                reference("prefix-cache-scorer", Some(3.0)),
                reference(max_score_picker::TYPE, None),
            ],
        };
        return (plugins, vec![profile]);
    }
    (raw.plugins.clone(), raw.scheduling_profiles.clone())
}

pub(super) fn implicit_profile(instances: &[PluginInstance]) -> RawProfile {
    RawProfile {
        name: "default".into(),
        plugins: instances
            .iter()
            .filter(|p| {
                matches!(
                    p.plugin,
                    Plugin::Filter(_) | Plugin::Scorer(_) | Plugin::Picker(_)
                ) && !super::validate::is_producer(p)
            })
            .map(|p| RawProfilePlugin {
                plugin_ref: p.name.clone(),
                weight: None,
            })
            .collect(),
    }
}

/// The shared implicit `max-score-picker` for profiles that name none.
pub(super) fn default_picker(instances: &mut Vec<PluginInstance>) -> usize {
    const NAME: &str = "max-score-picker (default)";
    if let Some(index) = instances.iter().position(|p| p.name == NAME) {
        return index;
    }
    instances.push(PluginInstance {
        name: NAME.into(),
        type_name: max_score_picker::TYPE,
        plugin: Plugin::Picker(Box::new(max_score_picker::MaxScorePicker::new(
            plugins::PickerParameters::default(),
        ))),
    });
    instances.len() - 1
}
