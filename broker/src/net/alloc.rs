//! The process allocator, with one guard: a request must not be able to abort the broker by
//! claiming a huge array.
//!
//! `kafka-protocol` (0.18) decodes an array by reading its element count off the wire and calling
//! `Vec::with_capacity(count)` before it decodes a single element. A 40-byte Metadata request
//! claiming 2^31-1 topics asks for 150 GB; the allocation fails and Rust aborts the process. The
//! decoder then would fail on the second element anyway (there are only a few bytes), so the
//! memory is never touched: only the reservation is the problem.
//!
//! So allocations of `HUGE_ALLOCATION` bytes or more, the default frame limit
//! (`socket.request.max.bytes`, 100 MiB as in Kafka), are served by an anonymous `mmap` with
//! `MAP_NORESERVE`: address space only, no commit charge, no resident memory until a page is
//! written. No malloc is ever larger than a frame may be; the fuzzer holds decoding to that
//! (`-malloc_limit_mb=100`, fuzz/README.md). A legitimate block that large (a frame of exactly
//! the limit, or more with a raised `socket.request.max.bytes`) works the same from a mapping:
//! its pages become memory as they are written, as glibc's own large blocks do. The decode fails, the vector is dropped, the mapping goes away, and the
//! connection is closed with a log line; resident memory never grows with the claimed count.
//! Under `vm.overcommit_memory = 2` the kernel still refuses such a mapping (and the process
//! aborts as before); every other setting accepts it.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations this large or larger are address-space reservations (see the module docs).
/// A constant, not the configured limit: whether a block is mapped must not change between its
/// allocation and its release.
pub const HUGE_ALLOCATION: usize = 100 << 20;

/// `System`, except for allocations of `HUGE_ALLOCATION` bytes or more.
pub struct GuardedAllocator;

#[global_allocator]
static ALLOCATOR: GuardedAllocator = GuardedAllocator;

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as usize
    } else {
        4096
    }
}

fn is_huge(layout: &Layout) -> bool {
    layout.size() >= HUGE_ALLOCATION && layout.align() <= page_size()
}

unsafe fn map_huge(size: usize) -> *mut u8 {
    // SAFETY: a fresh anonymous private mapping; no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        p as *mut u8
    }
}

// SAFETY: every block comes from `System` or from its own `mmap` of at least the requested size
// and page alignment (which covers any alignment `is_huge` accepts); `is_huge` depends only on
// the layout, which the caller passes back unchanged, so each block returns to where it came from.
unsafe impl GlobalAlloc for GuardedAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_huge(&layout) {
            // SAFETY: see map_huge.
            unsafe { map_huge(layout.size()) }
        } else {
            // SAFETY: forwarded with the caller's layout.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_huge(&layout) {
            // Fresh anonymous pages are zero.
            // SAFETY: see map_huge.
            unsafe { map_huge(layout.size()) }
        } else {
            // SAFETY: forwarded with the caller's layout.
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if is_huge(&layout) {
            // SAFETY: `ptr` is a mapping of `layout.size()` bytes made by `map_huge`.
            unsafe {
                libc::munmap(ptr as *mut libc::c_void, layout.size());
            }
        } else {
            // SAFETY: `ptr` came from `System` with this layout.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size` and `layout.align()` form a valid layout.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if !is_huge(&layout) && !is_huge(&new_layout) {
            // SAFETY: forwarded with the caller's arguments.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: a new block from this allocator, the old contents copied, the old block freed
        // with its own layout.
        unsafe {
            let new = self.alloc(new_layout);
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}

#[cfg(test)]
mod tests {
    // The test binary runs with the guarded allocator too.

    #[test]
    fn a_huge_reservation_costs_no_memory_and_small_ones_work() {
        // 64 GiB of capacity: more than this machine's memory, untouched, then dropped.
        let mut v: Vec<u64> = Vec::with_capacity(8 << 30);
        v.push(1);
        assert_eq!(v[0], 1);
        drop(v);
        let mut grown: Vec<u8> = Vec::with_capacity(16);
        grown.extend_from_slice(b"still the system allocator");
        assert_eq!(&grown[..5], b"still");
    }
}
