//! The module's heap use. A native module allocates from Envoy's heap, so there is no linear
//! memory to measure as a wasm VM has; this allocator counts what the module itself holds, for
//! the `vm_memory_bytes` gauge (one atomic add per allocation).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

static LIVE_BYTES: AtomicU64 = AtomicU64::new(0);

struct CountingAllocator;

fn size_of(layout: Layout) -> u64 {
    u64::try_from(layout.size()).unwrap_or(u64::MAX)
}

// SAFETY: every call goes to the system allocator unchanged; only the byte count is added.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let pointer = System.alloc(layout);
        if !pointer.is_null() {
            LIVE_BYTES.fetch_add(size_of(layout), Ordering::Relaxed);
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let pointer = System.alloc_zeroed(layout);
        if !pointer.is_null() {
            LIVE_BYTES.fetch_add(size_of(layout), Ordering::Relaxed);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        System.dealloc(pointer, layout);
        LIVE_BYTES.fetch_sub(size_of(layout), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let moved = System.realloc(pointer, layout, new_size);
        if !moved.is_null() {
            LIVE_BYTES.fetch_sub(size_of(layout), Ordering::Relaxed);
            LIVE_BYTES.fetch_add(
                u64::try_from(new_size).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Bytes the module holds on the heap now.
pub fn live_bytes() -> u64 {
    LIVE_BYTES.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_held_is_counted_and_what_is_freed_is_not() {
        let before = live_bytes();
        let held = std::hint::black_box(vec![1u8; 1 << 20]);
        let during = live_bytes();
        assert!(during >= before + (1 << 20), "{before} -> {during}");
        drop(held);
        // Other tests allocate concurrently: the megabyte is gone, give or take theirs.
        assert!(live_bytes() < before + (1 << 19));
    }
}
