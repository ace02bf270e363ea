//! Answering a peer: any VM of the replica serves the state its lease holder stored, on the
//! peer port only and only to a caller with the secret. The clients' listener never serves it:
//! a client that asks there gets a 404 as for any unknown path.

use super::wire;
use super::KEPT_BATCHES;
use crate::config::peers::PeersConfig;
use crate::host::SharedData;
use crate::shared_keys::SharedKeys;

/// What to answer a request for the peer path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerReply {
    pub status: u16,
    pub body: Vec<u8>,
    /// The caller was refused (wrong port or secret), for the stats.
    pub refused: bool,
}

impl PeerReply {
    fn refuse(status: u16, why: &str) -> Self {
        PeerReply {
            status,
            body: format!("{{\"error\":\"{why}\"}}").into_bytes(),
            refused: true,
        }
    }
}

/// Whether `path` (with its query) asks for `config`'s peer path.
pub fn asks_for(config: &PeersConfig, path: &str) -> bool {
    let bare = path.split_once('?').map_or(path, |(bare, _)| bare);
    bare == config.path
}

/// The reply to a request for the peer path that arrived on `port` with `secret`: the state
/// the lease holder stored under `keys`, with the placement batches the caller has not seen.
pub fn reply(
    config: &PeersConfig,
    store: &dyn SharedData,
    keys: &SharedKeys,
    path: &str,
    port: Option<u16>,
    secret: Option<&str>,
) -> PeerReply {
    if port != Some(config.port) {
        return PeerReply::refuse(404, "not found");
    }
    if !secret.is_some_and(|secret| same(secret.as_bytes(), config.secret.as_bytes())) {
        return PeerReply::refuse(403, "peer secret missing or wrong");
    }
    let (origin, since) = query(path);
    match stored_reply(store, keys, origin, since) {
        Some(body) => PeerReply {
            status: 200,
            body,
            refused: false,
        },
        None => PeerReply {
            status: 503,
            body: b"{\"error\":\"no replica state yet\"}".to_vec(),
            refused: false,
        },
    }
}

/// The stored state followed by the kept batches after `since` (all kept ones for a caller
/// that asks about another origin, e.g. after this replica restarted).
fn stored_reply(
    store: &dyn SharedData,
    keys: &SharedKeys,
    origin: Option<u64>,
    since: u64,
) -> Option<Vec<u8>> {
    let (mut body, _) = store.get(&keys.replica_state()).ok().flatten()?;
    let (json, _) = wire::split(&body)?;
    let stored: wire::Sequences = serde_json::from_slice(json).ok()?;
    let since = if origin == Some(stored.origin) {
        since
    } else {
        0
    };
    let oldest = stored.newest_batch.saturating_sub(KEPT_BATCHES - 1).max(1);
    for seq in since.saturating_add(1).max(oldest)..=stored.newest_batch {
        let Ok(Some((batch, _))) = store.get(&keys.replica_batch(seq % KEPT_BATCHES)) else {
            continue;
        };
        // A slot already overwritten by a newer batch, or not written yet: skipped.
        if crate::placement_batches::batch_seq(&batch) == Some(seq) {
            body.extend_from_slice(&batch);
        }
    }
    Some(body)
}

/// `origin` (hex) and `since` from the query; anything unreadable asks for everything.
fn query(path: &str) -> (Option<u64>, u64) {
    let Some((_, query)) = path.split_once('?') else {
        return (None, 0);
    };
    let (mut origin, mut since) = (None, 0);
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("origin", value)) => origin = u64::from_str_radix(value, 16).ok(),
            Some(("since", value)) => since = value.parse().unwrap_or(0),
            _ => {}
        }
    }
    (origin, since)
}

/// Compares two secrets in time that depends on their lengths only, not on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::host::fake::FakeShared;

    fn config() -> PeersConfig {
        PeersConfig {
            port: 9100,
            secret: "a-long-enough-secret".into(),
            addresses: vec!["127.0.0.1:9100".into()],
            ..PeersConfig::default()
        }
    }

    #[test]
    fn only_the_peer_port_with_the_secret_is_served() {
        let store = FakeShared::default();
        let keys = SharedKeys::under("k");
        let state = wire::ReplicaState {
            origin: 5,
            seq: 1,
            newest_batch: 2,
            pods: vec!["10.0.0.1:8000".into()],
            in_flight: vec![(0, 0)],
            ..wire::ReplicaState::default()
        };
        store
            .set(&keys.replica_state(), &wire::frame(&state, &[]), None)
            .unwrap();
        let placement = |hash| crate::scheduling::LearnedPrefix {
            endpoint: 0,
            hashes: vec![hash],
        };
        for seq in 1..=2 {
            let batch = crate::placement_batches::encode_batch(seq, &[placement(seq)]);
            store
                .set(&keys.replica_batch(seq % KEPT_BATCHES), &batch, None)
                .unwrap();
        }
        let secret = Some("a-long-enough-secret");
        let path = "/inference-picker/peers?origin=5&since=1";
        assert!(asks_for(&config(), path));
        assert!(!asks_for(&config(), "/inference-picker/peers/x"));
        let client_port = reply(&config(), &store, &keys, path, Some(8080), secret);
        assert_eq!((client_port.status, client_port.refused), (404, true));
        let wrong = reply(
            &config(),
            &store,
            &keys,
            path,
            Some(9100),
            Some("a-long-enough-secreT"),
        );
        assert_eq!((wrong.status, wrong.refused), (403, true));
        let none = reply(&config(), &store, &keys, path, Some(9100), None);
        assert_eq!(none.status, 403);
        let ok = reply(&config(), &store, &keys, path, Some(9100), secret);
        assert_eq!(ok.status, 200);
        let answer = wire::read(&ok.body, 1).unwrap();
        assert_eq!(answer.state, state);
        assert_eq!(
            answer.placements,
            vec![placement(2)],
            "only what follows since"
        );
        // Another origin (this replica restarted since the caller last asked): every batch.
        let fresh = reply(
            &config(),
            &store,
            &keys,
            "/inference-picker/peers?origin=9&since=1",
            Some(9100),
            secret,
        );
        assert_eq!(wire::read(&fresh.body, 0).unwrap().placements.len(), 2);
        let empty = reply(
            &config(),
            &store,
            &SharedKeys::under("other"),
            path,
            Some(9100),
            secret,
        );
        assert_eq!((empty.status, empty.refused), (503, false));
    }
}
