//! `header-based-testing-filter`: for conformance tests, keeps the candidates named in the
//! `test-epp-endpoint-selection` header (comma-separated `ip` or `ip:port`). It only narrows
//! the pool: an address that is not a pool member selects nothing. Without the header, or
//! without this filter in the config, the header has no effect.

use crate::protocol::TEST_SELECTION_HEADER;
use crate::scheduling::plugins::spec::{effective, Data, Kind, NoParameters, PluginSpec};
use crate::scheduling::{Filter, Plugin, SchedulingContext};
use serde_yaml::Value;

pub const TYPE: &str = "header-based-testing-filter";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Filter, build, effective::<NoParameters>)
    .consuming(&[Data::RequestHeader(TEST_SELECTION_HEADER)]);

pub struct HeaderBasedTestingFilter;

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    super::no_parameters(parameters)?;
    Ok(Plugin::Filter(Box::new(HeaderBasedTestingFilter)))
}

/// Whether `address` (`ip:port`, IPv6 bracketed) is named by `wanted` (`ip` or `ip:port`).
fn names(wanted: &str, address: &str) -> bool {
    let wanted = wanted.trim();
    if wanted == address {
        return true;
    }
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    wanted == host || wanted == host.trim_start_matches('[').trim_end_matches(']')
}

impl Filter for HeaderBasedTestingFilter {
    fn filter(&mut self, ctx: &SchedulingContext<'_>, candidates: &mut Vec<usize>) {
        let Some(selection) = ctx.request.headers.test_endpoint_selection.as_deref() else {
            return;
        };
        candidates.retain(|&i| {
            ctx.pool
                .get(i)
                .is_some_and(|e| selection.split(',').any(|w| names(w, &e.address)))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::request::{InferenceRequest, RequestHeaders};
    use crate::scheduling::test_support::queues;

    #[test]
    fn narrows_to_the_named_pool_members() {
        let pool = queues(&[0.0; 3]);
        let mut request = InferenceRequest::empty();
        let run = |request: &InferenceRequest| {
            let mut candidates = vec![0, 1, 2];
            HeaderBasedTestingFilter
                .filter(&SchedulingContext::new(request, &pool), &mut candidates);
            candidates
        };
        assert_eq!(run(&request), [0, 1, 2]);
        request.headers = RequestHeaders {
            test_endpoint_selection: Some("10.0.0.2, 10.0.0.0:8000".into()),
            ..RequestHeaders::default()
        };
        assert_eq!(run(&request), [0, 2]);
        request.headers.test_endpoint_selection = Some("6.6.6.6:8000".into());
        assert!(run(&request).is_empty());
        assert!(names("::1", "[::1]:8000"));
    }
}
