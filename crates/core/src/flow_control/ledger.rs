//! Envoy-wide counts of what waits, per band and in all, kept in one shared-data value that
//! every VM updates by compare-and-swap: the global and per-band limits then hold exactly
//! across worker VMs, however their requests race.

use crate::config::flow_control::FlowControlConfig;
use crate::host::{HostError, SharedData};
use serde::{Deserialize, Serialize};

/// Attempts at a contended compare-and-swap before the update is given up (fail open).
const CAS_ATTEMPTS: usize = 16;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    pub requests: u64,
    pub bytes: u64,
    /// `(band, requests, bytes)`.
    pub bands: Vec<(i32, u64, u64)>,
}

impl Ledger {
    fn band(&self, band: i32) -> (u64, u64) {
        self.bands
            .iter()
            .find(|b| b.0 == band)
            .map_or((0, 0), |b| (b.1, b.2))
    }

    /// Whether one more request of `bytes` fits the global and the band's limits.
    pub fn fits(&self, config: &FlowControlConfig, band: i32, bytes: u64) -> bool {
        let over = |count: u64, total: u64, max_count: Option<u64>, max_bytes: Option<u64>| {
            max_count.is_some_and(|max| count + 1 > max)
                || max_bytes.is_some_and(|max| total.saturating_add(bytes) > max)
        };
        let (in_band, band_bytes) = self.band(band);
        let band_limits = config.bands.iter().find(|b| b.priority == band);
        !over(
            self.requests,
            self.bytes,
            config.max_requests,
            config.max_bytes,
        ) && !over(
            in_band,
            band_bytes,
            band_limits.map(|b| b.max_requests),
            band_limits.map(|b| b.max_bytes),
        )
    }

    /// Adds (`sign` 1) or takes away (-1) one request of `bytes` in `band`.
    fn apply(&mut self, band: i32, bytes: u64, add: bool) {
        let step = |value: &mut u64, by: u64| {
            *value = if add {
                value.saturating_add(by)
            } else {
                value.saturating_sub(by)
            };
        };
        step(&mut self.requests, 1);
        step(&mut self.bytes, bytes);
        match self.bands.iter_mut().find(|b| b.0 == band) {
            Some(entry) => {
                step(&mut entry.1, 1);
                step(&mut entry.2, bytes);
            }
            None if add => self.bands.push((band, 1, bytes)),
            None => {}
        }
    }
}

/// Writes an empty ledger when there is none yet, so later updates have a CAS to check.
pub fn init(store: &dyn SharedData, key: &str) -> Result<(), HostError> {
    if store.get(key)?.is_none() {
        let empty = serde_json::to_vec(&Ledger::default()).unwrap_or_default();
        store.set(key, &empty, None)?;
    }
    Ok(())
}

/// Counts one more waiting request if it fits; `Ok(false)` when the queue is full.
pub fn reserve(
    store: &dyn SharedData,
    key: &str,
    config: &FlowControlConfig,
    band: i32,
    bytes: u64,
) -> Result<bool, HostError> {
    update(store, key, |ledger| {
        if !ledger.fits(config, band, bytes) {
            return false;
        }
        ledger.apply(band, bytes, true);
        true
    })
}

/// Counts one waiting request less.
pub fn unreserve(
    store: &dyn SharedData,
    key: &str,
    band: i32,
    bytes: u64,
) -> Result<(), HostError> {
    update(store, key, |ledger| {
        ledger.apply(band, bytes, false);
        true
    })
    .map(|_| ())
}

/// Reads the ledger, lets `change` edit it (false: leave it as it is) and writes it back by
/// compare-and-swap, retrying when another VM wrote in between. Returns what `change` said.
fn update(
    store: &dyn SharedData,
    key: &str,
    mut change: impl FnMut(&mut Ledger) -> bool,
) -> Result<bool, HostError> {
    for _ in 0..CAS_ATTEMPTS {
        let current = store.get(key)?;
        let mut ledger: Ledger = current
            .as_ref()
            .and_then(|(bytes, _)| serde_json::from_slice(bytes).ok())
            .unwrap_or_default();
        if !change(&mut ledger) {
            return Ok(false);
        }
        let bytes = serde_json::to_vec(&ledger).unwrap_or_default();
        // A key never written has no CAS to check (Envoy's 0 means "unconditional"): see
        // [`init`], which makes sure it exists before the first request waits.
        if store.set(key, &bytes, current.map(|(_, cas)| cas))? {
            return Ok(true);
        }
    }
    Err(HostError {
        call: "flow-control ledger (compare-and-swap kept losing)",
        status: 0,
    })
}
