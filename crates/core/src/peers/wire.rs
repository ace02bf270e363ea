//! What one replica serves its peers, and how an answer is read: as hostile input, bounded and
//! validated before anything of it reaches the pool.
//!
//! A state is `MAGIC`, a little-endian `u32` length, a JSON [`ReplicaState`], then this
//! replica's placement batches in the binary form VMs share (`placement_batches`), each
//! endpoint an index into the state's `pods`; the hub's batches of placements it relays are
//! marked [`RELAYED_BATCH`]. Every value is per origin and state-based: in-flight counts
//! replace the origin's last ones (an older `seq` never replaces a newer one, however many hops
//! it came by), batches carry their sequence number and are replayed once, scrapes and relayed
//! states carry their age rather than a wall-clock stamp (no correctness depends on the
//! replicas' clocks agreeing).

use crate::metrics::EndpointMetrics;
use crate::placement_batches::decode_tagged;
pub use crate::placement_batches::RELAYED_BATCH;
use crate::scheduling::LearnedPrefix;
use serde::{Deserialize, Serialize};

pub const MAGIC: &[u8; 4] = b"IPR1";
/// A peer's counts above this per pod are not believed: no pod runs that many requests.
pub const MAX_IN_FLIGHT_PER_POD: u32 = 100_000;
/// Pods one state may name.
pub const MAX_PODS: usize = 65_536;
/// Block hashes one answer may carry; the rest of the batches is not read.
pub const MAX_HASHES: usize = 1 << 20;
/// A scrape older than this is not worth passing on.
pub const MAX_SCRAPE_AGE_MS: u64 = 60_000;

/// One pod's latest scrape, as the replica that scrapes it saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SharedScrape {
    /// Index into [`ReplicaState::pods`].
    pub pod: u32,
    /// How long before the state was served the metrics were taken.
    pub age_ms: u64,
    pub failed: bool,
    pub metrics: EndpointMetrics,
    /// `(requests, tokens)` the scraping replica counted in flight there, the whole fleet's
    /// as it knew them, when it sent the scrape.
    #[serde(default)]
    pub in_flight_at_scrape: (u32, u64),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReplicaState {
    /// The replica's id, random per Envoy process: a restarted replica is a new origin.
    pub origin: u64,
    /// Grows with every state the origin publishes; an older or repeated one is ignored.
    pub seq: u64,
    /// The newest placement batch the origin keeps.
    #[serde(default)]
    pub newest_batch: u64,
    /// The pods the state names, by address.
    pub pods: Vec<String>,
    /// `(requests, tokens)` the replica has in flight per pod (every worker of it).
    pub in_flight: Vec<(u32, u64)>,
    /// The pods this replica scrapes.
    pub scrapes: Vec<SharedScrape>,
    /// The hub's view of the other replicas: their latest states as they told it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relayed: Vec<RelayedState>,
}

/// Another replica's state as the hub passes it on. Its pods are the enclosing state's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RelayedState {
    pub origin: u64,
    pub seq: u64,
    /// Its peer address, as the hub calls it.
    pub address: String,
    /// How long before this answer the origin published it, as far as the hub can tell.
    pub age_ms: u64,
    pub in_flight: Vec<(u32, u64)>,
    pub scrapes: Vec<SharedScrape>,
}

/// Why an answer was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

/// A peer's answer, validated: its state and the placements newer than what was asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerAnswer {
    pub state: ReplicaState,
    /// The peer's own placements; endpoints are indices into `state.pods`.
    pub placements: Vec<LearnedPrefix>,
    /// Placements the peer relays from other replicas (it is their hub).
    pub relayed_placements: Vec<LearnedPrefix>,
    /// The newest batch sequence in the answer (what to ask after next time).
    pub newest_batch: u64,
}

/// The value a replica keeps in shared data: the framed state and every batch it keeps.
pub fn frame(state: &ReplicaState, batches: &[u8]) -> Vec<u8> {
    let json = serde_json::to_vec(state).unwrap_or_default();
    let mut bytes = Vec::with_capacity(8 + json.len() + batches.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&u32::try_from(json.len()).unwrap_or(u32::MAX).to_le_bytes());
    bytes.extend_from_slice(&json);
    bytes.extend_from_slice(batches);
    bytes
}

/// The framed value's header and its batches, or `None` when it is not one of ours.
pub fn split(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let rest = bytes.strip_prefix(MAGIC.as_slice())?;
    let (len, rest) = rest.split_first_chunk::<4>()?;
    let len = usize::try_from(u32::from_le_bytes(*len)).ok()?;
    if rest.len() < len {
        return None;
    }
    let (json, batches) = rest.split_at(len);
    Some((json, batches))
}

/// The sequences a stored state carries, read without the rest of it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sequences {
    pub origin: u64,
    pub seq: u64,
    #[serde(default)]
    pub newest_batch: u64,
}

/// Reads a peer's answer; anything malformed, oversized or implausible refuses it whole.
pub fn read(bytes: &[u8], since: u64) -> Result<PeerAnswer, Refused> {
    let refuse = |why: &str| Err(Refused(why.to_owned()));
    let Some((json, batches)) = split(bytes) else {
        return refuse("not a replica state (bad frame)");
    };
    let value: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| Refused(format!("state is not JSON: {e}")))?;
    if !numbers_plausible(&value) {
        return refuse("a negative number in the state");
    }
    let state: ReplicaState =
        serde_json::from_value(value).map_err(|e| Refused(format!("state: {e}")))?;
    if state.origin == 0 {
        return refuse("origin 0");
    }
    if state.pods.len() > MAX_PODS {
        return refuse("too many pods");
    }
    if state.in_flight.len() != state.pods.len() {
        return refuse("in-flight counts do not match the pods");
    }
    let implausible = |&(n, _): &(u32, u64)| n > MAX_IN_FLIGHT_PER_POD;
    if state.in_flight.iter().any(implausible)
        || state
            .scrapes
            .iter()
            .any(|s| implausible(&s.in_flight_at_scrape))
    {
        return refuse("an implausible in-flight count");
    }
    let pods = state.pods.len();
    if !scrapes_in_bounds(&state.scrapes, pods) {
        return refuse("a scrape of a pod the state does not name");
    }
    if state.relayed.len() > crate::limits::PEERS.max as usize {
        return refuse("too many relayed states");
    }
    for relayed in &state.relayed {
        if relayed.origin == 0
            || relayed.in_flight.len() != pods
            || relayed.in_flight.iter().any(implausible)
            || !scrapes_in_bounds(&relayed.scrapes, pods)
        {
            return refuse("a relayed state that does not fit the pods");
        }
    }
    let (mut placements, mut relayed_placements) = (Vec::new(), Vec::new());
    let newest_batch = decode_tagged(batches, since, &mut placements, &mut relayed_placements);
    let all = || placements.iter().chain(&relayed_placements);
    let hashes: usize = all().map(|p| p.hashes.len()).sum();
    if hashes > MAX_HASHES || all().any(|p| p.endpoint >= pods) {
        return refuse("placements beyond the bounds");
    }
    Ok(PeerAnswer {
        state,
        placements,
        relayed_placements,
        newest_batch,
    })
}

/// No more scrapes than pods, each of a pod the state names and counted plausibly.
fn scrapes_in_bounds(scrapes: &[SharedScrape], pods: usize) -> bool {
    scrapes.len() <= pods
        && scrapes
            .iter()
            .all(|s| (s.pod as usize) < pods && s.in_flight_at_scrape.0 <= MAX_IN_FLIGHT_PER_POD)
}

/// Every number finite (JSON has no others) and not negative.
fn numbers_plausible(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Number(n) => n.as_f64().is_some_and(|v| v >= 0.0),
        serde_json::Value::Array(items) => items.iter().all(numbers_plausible),
        serde_json::Value::Object(map) => map.values().all(numbers_plausible),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::placement_batches::encode_batch;

    fn state() -> ReplicaState {
        ReplicaState {
            origin: 7,
            seq: 3,
            newest_batch: 2,
            pods: vec!["10.0.0.1:8000".into(), "10.0.0.2:8000".into()],
            in_flight: vec![(2, 200), (0, 0)],
            scrapes: vec![SharedScrape {
                pod: 1,
                age_ms: 20,
                failed: false,
                metrics: EndpointMetrics::idle(),
                in_flight_at_scrape: (1, 100),
            }],
            relayed: vec![],
        }
    }

    fn batches() -> Vec<u8> {
        let one = LearnedPrefix {
            endpoint: 0,
            hashes: vec![1, 2, 3],
        };
        let two = LearnedPrefix {
            endpoint: 1,
            hashes: vec![4],
        };
        let mut bytes = encode_batch(1, std::slice::from_ref(&one));
        bytes.extend(encode_batch(2, std::slice::from_ref(&two)));
        bytes
    }

    #[test]
    fn a_state_round_trips_with_only_the_batches_after_since() {
        let bytes = frame(&state(), &batches());
        let answer = read(&bytes, 0).unwrap();
        assert_eq!(answer.state, state());
        assert_eq!(answer.placements.len(), 2);
        assert_eq!(answer.newest_batch, 2);
        let answer = read(&bytes, 1).unwrap();
        assert_eq!(
            answer.placements,
            vec![LearnedPrefix {
                endpoint: 1,
                hashes: vec![4]
            }]
        );
    }

    #[test]
    fn hostile_answers_are_refused_whole() {
        let good = state();
        let cases: Vec<(ReplicaState, &str)> = vec![
            (
                ReplicaState {
                    origin: 0,
                    ..good.clone()
                },
                "origin 0",
            ),
            (
                ReplicaState {
                    in_flight: vec![(1, 1)],
                    ..good.clone()
                },
                "do not match",
            ),
            (
                ReplicaState {
                    in_flight: vec![(MAX_IN_FLIGHT_PER_POD + 1, 0), (0, 0)],
                    ..good.clone()
                },
                "implausible",
            ),
            (
                ReplicaState {
                    scrapes: vec![SharedScrape {
                        pod: 9,
                        ..good.scrapes[0].clone()
                    }],
                    ..good.clone()
                },
                "does not name",
            ),
            (
                ReplicaState {
                    relayed: vec![RelayedState {
                        origin: 8,
                        in_flight: vec![(1, 1)],
                        ..RelayedState::default()
                    }],
                    ..good.clone()
                },
                "relayed state",
            ),
            (
                ReplicaState {
                    relayed: vec![RelayedState {
                        origin: 8,
                        in_flight: vec![(0, 0), (MAX_IN_FLIGHT_PER_POD + 1, 0)],
                        ..RelayedState::default()
                    }],
                    ..good.clone()
                },
                "relayed state",
            ),
            (
                ReplicaState {
                    relayed: vec![
                        RelayedState {
                            origin: 8,
                            in_flight: vec![(0, 0), (0, 0)],
                            ..RelayedState::default()
                        };
                        crate::limits::PEERS.max as usize + 1
                    ],
                    ..good.clone()
                },
                "too many relayed",
            ),
        ];
        for (state, why) in cases {
            let error = read(&frame(&state, &[]), 0).unwrap_err();
            assert!(error.0.contains(why), "{error:?} for {why}");
        }
        assert!(read(b"garbage", 0).unwrap_err().0.contains("bad frame"));
        let mut negative = frame(&good, &[]);
        let text = String::from_utf8_lossy(&negative).replace("\"ageMs\":20", "\"ageMs\":-20");
        negative = text.into_bytes();
        assert!(read(&negative, 0).is_err());
        // A length past the end, a batch naming a pod the state does not.
        let mut short = frame(&good, &[]);
        short.truncate(short.len() - 1);
        assert!(read(&short, 0).unwrap_err().0.contains("bad frame"));
        let stray = encode_batch(
            1,
            &[LearnedPrefix {
                endpoint: 5,
                hashes: vec![1],
            }],
        );
        assert!(read(&frame(&good, &stray), 0)
            .unwrap_err()
            .0
            .contains("bounds"));
    }
}
