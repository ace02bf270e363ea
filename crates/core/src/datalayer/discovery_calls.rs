//! `pool.discovery`'s calls: the scraping VM lists pods or EndpointSlices when due; a failed or
//! unreadable answer keeps the last known pool.

use crate::discovery::{Discovered, DiscoveryConfig};
use crate::duration::duration_ms;
use crate::host::{CalloutAnswer, HttpCallouts};

#[derive(Debug, Default)]
pub struct DiscoveryCalls {
    call: Option<u32>,
    next_ms: u64,
}

impl DiscoveryCalls {
    pub fn owns(&self, token: u32) -> bool {
        self.call == Some(token)
    }

    /// Asks the Kubernetes API for the pool's members, when due.
    pub fn send_when_due(
        &mut self,
        host: &impl HttpCallouts,
        discovery: &DiscoveryConfig,
        now: u64,
    ) {
        if self.call.is_some() || now < self.next_ms {
            return;
        }
        let interval_ms = duration_ms(discovery.interval);
        self.next_ms = now.saturating_add(interval_ms);
        let path = discovery.list_path();
        let authority = discovery.authority.as_deref().unwrap_or(&discovery.cluster);
        let bearer = discovery
            .bearer_token
            .as_ref()
            .map(|token| format!("Bearer {token}"));
        let mut headers = vec![
            (":method", "GET"),
            (":path", path.as_str()),
            (":authority", authority),
            ("accept", "application/json"),
        ];
        if let Some(bearer) = &bearer {
            headers.push(("authorization", bearer.as_str()));
        }
        let timeout = u32::try_from(interval_ms).unwrap_or(u32::MAX);
        match host.dispatch(&discovery.cluster, &headers, timeout) {
            Ok(token) => self.call = Some(token),
            Err(error) => log::warn!("inference-picker: discovery call not sent: {error}"),
        }
    }

    /// The pod list the answer holds; `None` (logged) when the call failed or the list is
    /// unreadable, so the last known pool stays.
    pub fn on_answer(
        &mut self,
        answer: &CalloutAnswer,
        discovery: &DiscoveryConfig,
    ) -> Option<Vec<Discovered>> {
        self.call = None;
        let status = answer.status.as_deref();
        if status != Some(b"200".as_slice()) {
            log::warn!(
                "inference-picker: discovery failed ({}); keeping the last known pool",
                super::scrapes::describe_status(status)
            );
            return None;
        }
        let found = answer
            .body
            .as_ref()
            .map_err(|error| error.to_string())
            .and_then(|body| discovery.endpoints(body));
        match found {
            Ok(found) => Some(found),
            Err(error) => {
                log::warn!("inference-picker: discovery: {error}; keeping the last known pool");
                None
            }
        }
    }
}
