//! What the other modules share, importing none of them: the lock, the count of calls into
//! Envoy, a failed call's error, a chunked body's first bytes, the wall clock and this
//! process's shared data.

use inference_picker_core::host::{HostCall, HostError, SharedMemory};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};

/// Every picker of this Envoy shares one store: the scrape lease and snapshot, the in-flight
/// counts and flow control's ledger keep the core's semantics, so exactly one picker scrapes a
/// pool however many filter configs name it.
static SHARED: LazyLock<SharedMemory> = LazyLock::new(SharedMemory::default);

pub fn shared() -> &'static SharedMemory {
    &SHARED
}

/// Calls into Envoy by kind, as the wasm filter counts its host calls.
static CALLS: [AtomicU64; HostCall::ALL.len()] = [const { AtomicU64::new(0) }; HostCall::ALL.len()];

pub fn count(call: HostCall) {
    if let Some(counter) = CALLS.get(call as usize) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The calls counted since the last take, by kind in [`HostCall::ALL`] order.
pub fn take_counts() -> [u64; HostCall::ALL.len()] {
    let mut counts = [0; HostCall::ALL.len()];
    for (count, counter) in counts.iter_mut().zip(&CALLS) {
        *count = counter.swap(0, Ordering::Relaxed);
    }
    counts
}

/// The ABI answers most calls with a bare false: such a failed call is reported with status 1.
pub fn failed(call: &'static str) -> HostError {
    HostError { call, status: 1 }
}

/// The first `size` bytes of a body Envoy hands over in chunks.
pub fn first_bytes<'a>(chunks: impl IntoIterator<Item = &'a [u8]>, size: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(size);
    for chunk in chunks {
        let room = size.saturating_sub(bytes.len());
        bytes.extend_from_slice(chunk.get(..room).unwrap_or(chunk));
    }
    bytes
}

/// Locks a mutex whose holder may have panicked: every value behind these locks stays whole.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The wall clock in nanoseconds, as proxy-wasm's clock call reads it: the one clock of both
/// the VM's host and its streams.
pub fn wall_clock_ns() -> Result<u64, HostError> {
    count(HostCall::Clock);
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| failed("clock"))?;
    u64::try_from(since_epoch.as_nanos()).map_err(|_| failed("clock"))
}
