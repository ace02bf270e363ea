//! Prefix placements as VMs and replicas share them: batches, each numbered, in a binary form
//! rather than JSON (a busy tick carries hundreds of thousands of block hashes, and readers
//! copy and decode the whole value every tick). Whatever is read may be cut short or forged:
//! decoding stops where a value breaks, and never panics.

use crate::scheduling::LearnedPrefix;

/// One tick's prefix picks, little-endian: `seq: u64, entries: u32`, then per entry
/// `endpoint: u32, hashes: u32, hash: u64...`. Binary rather than JSON: a busy tick carries
/// hundreds of thousands of hashes, and readers copy and decode the whole value every tick.
pub fn encode_batch(seq: u64, learned: &[LearnedPrefix]) -> Vec<u8> {
    let mut bytes = Vec::new();
    encode_batch_into(&mut bytes, seq, learned);
    bytes
}

/// As [`encode_batch`], into `bytes` (cleared first), which keeps its capacity: a busy tick's
/// batch is megabytes, and a buffer allocated afresh every tick at a size that follows the
/// load leaves gaps that a VM's linear memory never gives back.
pub fn encode_batch_into(bytes: &mut Vec<u8>, seq: u64, learned: &[LearnedPrefix]) {
    let hashes: usize = learned.iter().map(|l| l.hashes.len()).sum();
    bytes.clear();
    bytes.reserve(12 + learned.len() * 8 + hashes * 8);
    bytes.extend_from_slice(&seq.to_le_bytes());
    bytes.extend_from_slice(&saturating_u32(learned.len()).to_le_bytes());
    for prefix in learned {
        bytes.extend_from_slice(&saturating_u32(prefix.endpoint).to_le_bytes());
        bytes.extend_from_slice(&saturating_u32(prefix.hashes.len()).to_le_bytes());
        for hash in &prefix.hashes {
            bytes.extend_from_slice(&hash.to_le_bytes());
        }
    }
}

fn saturating_u32(value: usize) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// Set in the sequence of a batch a replica relays for others (see `peers`): its entries are
/// passed on once, never again. Sequences never come near it.
pub const RELAYED_BATCH: u64 = 1 << 63;

/// A batch's sequence, its [`RELAYED_BATCH`] mark cleared; `None` when it is too short.
pub fn batch_seq(batch: &[u8]) -> Option<u64> {
    let head = batch.first_chunk::<8>()?;
    Some(u64::from_le_bytes(*head) & !RELAYED_BATCH)
}

/// Appends the entries of batches newer than `seen` to `out`; returns the newest seq read.
/// A truncated or malformed value ends the reading where it breaks.
pub fn decode_batches(bytes: &[u8], seen: u64, out: &mut Vec<LearnedPrefix>) -> u64 {
    decode_with(bytes, seen, |_, prefix| out.push(prefix))
}

/// As [`decode_batches`], the entries of [`RELAYED_BATCH`]es apart.
pub fn decode_tagged(
    bytes: &[u8],
    seen: u64,
    own: &mut Vec<LearnedPrefix>,
    relayed: &mut Vec<LearnedPrefix>,
) -> u64 {
    decode_with(bytes, seen, |was_relayed, prefix| {
        if was_relayed {
            relayed.push(prefix);
        } else {
            own.push(prefix);
        }
    })
}

fn decode_with(mut bytes: &[u8], seen: u64, mut out: impl FnMut(bool, LearnedPrefix)) -> u64 {
    let mut newest = seen;
    while let Some((marked, entries)) = take_u64(&mut bytes).zip(take_u32(&mut bytes)) {
        let (seq, relayed) = (marked & !RELAYED_BATCH, marked & RELAYED_BATCH != 0);
        for _ in 0..entries {
            let Some((endpoint, count)) = take_u32(&mut bytes).zip(take_u32(&mut bytes)) else {
                return newest;
            };
            let Some(hashes) = take_bytes(&mut bytes, count as usize * 8) else {
                return newest;
            };
            if seq > seen {
                out(
                    relayed,
                    LearnedPrefix {
                        endpoint: endpoint as usize,
                        hashes: hashes
                            .chunks_exact(8)
                            .filter_map(|c| c.try_into().ok().map(u64::from_le_bytes))
                            .collect(),
                    },
                );
            }
        }
        newest = newest.max(seq);
    }
    newest
}

fn take_bytes<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if bytes.len() < n {
        return None;
    }
    let (head, tail) = bytes.split_at(n);
    *bytes = tail;
    Some(head)
}

fn take_u64(bytes: &mut &[u8]) -> Option<u64> {
    take_bytes(bytes, 8)?
        .try_into()
        .ok()
        .map(u64::from_le_bytes)
}

fn take_u32(bytes: &mut &[u8]) -> Option<u32> {
    take_bytes(bytes, 4)?
        .try_into()
        .ok()
        .map(u32::from_le_bytes)
}
