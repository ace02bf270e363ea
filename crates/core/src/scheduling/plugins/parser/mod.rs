//! llm-d-router's request parsers (`requestHandler.parsers`). The filter reads the bodies of
//! the APIs it knows itself, on every route, so a parser only has to load; one for an API it
//! does not read says so in its warning: those requests are routed on load alone.

pub mod anthropic_parser;
pub mod openai_parser;
pub mod passthrough_parser;
pub mod sglanghttp_parser;
pub mod vllmhttp_parser;

use crate::scheduling::plugins::spec::no_parameters;
use crate::scheduling::{BuiltIn, Plugin};
use serde_yaml::Value;

/// Builds a parser after checking it was given no parameters (none takes any).
pub fn build_parser(parameters: &Value) -> Result<Plugin, String> {
    no_parameters(parameters)?;
    Ok(Plugin::BuiltIn(BuiltIn))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn parsers_take_no_parameters() {
        assert!(matches!(build_parser(&Value::Null), Ok(Plugin::BuiltIn(_))));
        let given: Value = serde_yaml::from_str("{paths: [/v1/x]}").unwrap();
        assert!(build_parser(&given).unwrap_err().contains("paths"));
    }
}
