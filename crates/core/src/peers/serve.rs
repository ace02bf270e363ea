//! Answering a peer: any VM of the replica serves the state its lease holder stored, on the
//! peer port only and only to a caller with the secret. The clients' listener never serves it:
//! a client that asks there gets a 404 as for any unknown path.

use super::wire;
use crate::config::peers::PeersConfig;
use crate::host::SharedData;

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

/// The reply to a request for the peer path that arrived on `port` with `secret`.
pub fn reply(
    config: &PeersConfig,
    store: &dyn SharedData,
    state_key: &str,
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
    let stored = store.get(state_key).ok().flatten();
    match stored.and_then(|(bytes, _)| wire::serve(&bytes, origin, since)) {
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
        let state = wire::ReplicaState {
            origin: 5,
            seq: 1,
            ..wire::ReplicaState::default()
        };
        store.set("k", &wire::frame(&state, &[]), None).unwrap();
        let secret = Some("a-long-enough-secret");
        let path = "/inference-picker/peers?origin=5&since=0";
        assert!(asks_for(&config(), path));
        assert!(!asks_for(&config(), "/inference-picker/peers/x"));
        let client_port = reply(&config(), &store, "k", path, Some(8080), secret);
        assert_eq!((client_port.status, client_port.refused), (404, true));
        let wrong = reply(
            &config(),
            &store,
            "k",
            path,
            Some(9100),
            Some("a-long-enough-secreT"),
        );
        assert_eq!((wrong.status, wrong.refused), (403, true));
        let none = reply(&config(), &store, "k", path, Some(9100), None);
        assert_eq!(none.status, 403);
        let ok = reply(&config(), &store, "k", path, Some(9100), secret);
        assert_eq!(ok.status, 200);
        assert_eq!(wire::read(&ok.body, 0).unwrap().state, state);
        let empty = reply(&config(), &store, "absent", path, Some(9100), secret);
        assert_eq!((empty.status, empty.refused), (503, false));
    }
}
