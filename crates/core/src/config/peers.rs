//! `pool.peers`: the other Envoy replicas in front of the same pods, and how this one shares
//! what it learns with them (see [`crate::peers`]).

use super::error::ConfigError;
use crate::duration::serde_go;
use crate::endpoint::canonical_address;
use crate::limits;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The cluster the shipped Envoy configs define for the calls between replicas.
pub const DEFAULT_PEERS_CLUSTER: &str = "inference_picker_peers";
/// Where a replica serves its state, on its peer port only.
pub const DEFAULT_PEERS_PATH: &str = "/inference-picker/peers";
/// The header a peer sends its secret in.
pub const PEER_SECRET_HEADER: &str = "x-inference-picker-peer-secret";
/// Shorter secrets are refused: the peer port is the one door to this replica's state.
const MIN_SECRET_CHARS: usize = 16;

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct PeersConfig {
    /// Every replica's peer address (`ip:port`), this one's included or not: a replica
    /// recognises its own address by the answer.
    pub addresses: Vec<String>,
    /// The replicas found through the Kubernetes API: the gateway's own pods (a selector on
    /// their labels) at the peer port.
    pub discovery: Option<crate::discovery::DiscoveryConfig>,
    /// The port this Envoy serves its state on (a listener address of its own, never the
    /// clients' port): the peer path on any other port is refused.
    pub port: u16,
    /// Envoy cluster the calls go through (ORIGINAL_DST keyed on the destination header).
    pub cluster: String,
    pub path: String,
    /// Sent by every call and checked by every answer (compared in constant time).
    pub secret: String,
    /// How often the replicas exchange what they learned, through the hub (see [`crate::peers`]).
    #[serde(with = "serde_go")]
    pub sync_interval: Duration,
    /// A call that takes longer failed; a peer that fails is not counted live.
    #[serde(with = "serde_go")]
    pub timeout: Duration,
    /// A peer's answer larger than this is refused unread.
    pub max_state_bytes: usize,
}

impl Default for PeersConfig {
    fn default() -> Self {
        PeersConfig {
            addresses: Vec::new(),
            discovery: None,
            port: 0,
            cluster: DEFAULT_PEERS_CLUSTER.into(),
            path: DEFAULT_PEERS_PATH.into(),
            secret: String::new(),
            sync_interval: Duration::from_millis(100),
            timeout: Duration::from_millis(500),
            max_state_bytes: 4 << 20,
        }
    }
}

impl PeersConfig {
    /// Checks every field and canonicalises the addresses in place.
    pub(super) fn validate(&mut self) -> Result<(), ConfigError> {
        let invalid =
            |key: &str, reason: String| ConfigError::invalid(format!("pool.peers.{key}"), reason);
        if self.port == 0 {
            return Err(invalid(
                "port",
                "must name this Envoy's peer listener port".into(),
            ));
        }
        if self.secret.chars().count() < MIN_SECRET_CHARS {
            return Err(invalid(
                "secret",
                format!("must be at least {MIN_SECRET_CHARS} characters: it is the only thing that keeps other callers from this replica's state"),
            ));
        }
        if !self.path.starts_with('/') || self.path.contains('?') {
            return Err(invalid("path", format!("{:?} is not a path", self.path)));
        }
        if self.addresses.is_empty() && self.discovery.is_none() {
            return Err(invalid(
                "addresses",
                "list the replicas' peer addresses or set pool.peers.discovery".into(),
            ));
        }
        limits::PEERS
            .check_usize(self.addresses.len())
            .map_err(|reason| invalid("addresses", reason))?;
        for address in &mut self.addresses {
            *address = canonical_address(address).map_err(|reason| invalid("addresses", reason))?;
        }
        if let Some(discovery) = &self.discovery {
            discovery
                .validate()
                .map_err(|reason| invalid("discovery", reason))?;
        }
        for (key, value, bounds) in [
            (
                "syncInterval",
                self.sync_interval,
                limits::PEER_SYNC_INTERVAL,
            ),
            ("timeout", self.timeout, limits::METRICS_TIMEOUT),
        ] {
            bounds.check(value).map_err(|reason| invalid(key, reason))?;
        }
        limits::MAX_METRICS_BYTES
            .check_usize(self.max_state_bytes)
            .map_err(|reason| invalid("maxStateBytes", reason))
    }
}
