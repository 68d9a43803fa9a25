//! Weight storage on huge pages. Decode reads every weight once per token, so it is bound by
//! memory bandwidth, and on 4 KiB pages a sequential stream pays a TLB miss every 4 KiB: on
//! the 2-core EPYC VM one thread reads 22–23 GB/s from 4 KiB pages and 30–31 GB/s from 2 MiB
//! ones (`bench/membw.c`, `HUGE=1`). Linux gives anonymous memory huge pages only where asked
//! (`transparent_hugepage=madvise`, the common default) and only for whole aligned 2 MiB
//! ranges, while most matrices of a small model are a few hundred KiB; so the matrices are
//! packed one after another into shared 2 MiB-aligned chunks advised `MADV_HUGEPAGE`.
//!
//! A chunk is freed when the last buffer cut from it is dropped. Elsewhere than Linux, or if
//! the mapping fails, a buffer is an ordinary heap allocation.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Huge-page size the chunks are aligned to.
const HUGE_PAGE: usize = 2 << 20;
/// Size of a shared chunk; larger buffers get a chunk of their own.
const CHUNK: usize = 32 << 20;
/// Alignment of every buffer inside a chunk (a cache line).
const ALIGN: usize = 64;

/// One anonymous mapping.
struct Chunk {
    ptr: *mut u8,
    size: usize,
}

// SAFETY: the mapping is plain memory; buffers cut from it cover disjoint ranges, and each is
// accessed only through its owner (`&`/`&mut WeightBuf`).
unsafe impl Send for Chunk {}
// SAFETY: as for `Send`.
unsafe impl Sync for Chunk {}

impl Chunk {
    /// A zeroed mapping of `size` bytes (a multiple of [`HUGE_PAGE`]) starting on a huge-page
    /// boundary, advised for huge pages; `None` where that is not available.
    #[cfg(target_os = "linux")]
    fn map(size: usize) -> Option<Self> {
        let span = size.checked_add(HUGE_PAGE)?;
        // SAFETY: an anonymous private mapping with no address hint; the result is checked.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(HUGE_PAGE);
        // SAFETY: trims the unaligned head and the tail beyond `size` off the mapping just made
        // (page-aligned ranges inside it); the advice is only a hint, its failure harmless.
        unsafe {
            if aligned > start {
                libc::munmap(raw, aligned - start);
            }
            let end = aligned + size;
            let tail = start + span - end;
            if tail > 0 {
                libc::munmap(end as *mut libc::c_void, tail);
            }
            libc::madvise(aligned as *mut libc::c_void, size, libc::MADV_HUGEPAGE);
        }
        Some(Self {
            ptr: aligned as *mut u8,
            size,
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn map(_size: usize) -> Option<Self> {
        None
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        // SAFETY: the range was mapped by `map` and nothing refers to it any more (every
        // buffer holds an `Arc` of its chunk).
        unsafe {
            libc::munmap(self.ptr.cast(), self.size);
        }
    }
}

/// The chunk being filled and the first free byte in it. Held weakly: once every buffer cut
/// from it is gone (a model unloaded), the chunk goes too, rather than keeping its pages.
static CURRENT: Mutex<Option<(Weak<Chunk>, usize)>> = Mutex::new(None);

/// Bytes of all live [`WeightBuf`]s.
static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Bytes held by every [`WeightBuf`] alive now: the weights a decoded token reads
/// ([`crate::stream`]).
pub fn live_weight_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// An owned, zero-initialised byte buffer for weights, on huge pages where the OS allows.
pub struct WeightBuf {
    storage: Storage,
}

enum Storage {
    Chunk {
        chunk: Arc<Chunk>,
        offset: usize,
        len: usize,
    },
    Heap(Vec<u8>),
}

impl WeightBuf {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        let storage = cut(len).unwrap_or_else(|| Storage::Heap(vec![0u8; len]));
        Self::counted(storage)
    }

    /// `len` zero bytes in a mapping of their own (huge pages where the OS allows), given back
    /// to the OS when the buffer is dropped: for weights that come and go while the process
    /// runs (a LoRA adapter mounted and unmounted), which in a shared chunk would keep their
    /// pages until every other buffer of the chunk is gone.
    pub fn zeroed_dedicated(len: usize) -> Self {
        let own = (len > 0)
            .then(|| len.checked_next_multiple_of(HUGE_PAGE))
            .flatten()
            .and_then(Chunk::map)
            .map(|chunk| Storage::Chunk {
                chunk: Arc::new(chunk),
                offset: 0,
                len,
            });
        Self::counted(own.unwrap_or_else(|| Storage::Heap(vec![0u8; len])))
    }

    fn counted(storage: Storage) -> Self {
        let buf = Self { storage };
        LIVE_BYTES.fetch_add(buf.len(), Ordering::Relaxed);
        buf
    }

    /// A copy of `bytes` followed by `extra` zero bytes.
    pub fn copy_of(bytes: &[u8], extra: usize) -> Self {
        let mut buf = Self::zeroed(bytes.len().saturating_add(extra));
        buf[..bytes.len()].copy_from_slice(bytes);
        buf
    }

    /// Whether the buffer lies in a huge-page chunk (for tests and diagnostics).
    pub fn in_chunk(&self) -> bool {
        matches!(self.storage, Storage::Chunk { .. })
    }
}

/// Cuts `len` bytes from the current chunk, or from a new one when it is full (or a chunk of
/// their own when they are large).
fn cut(len: usize) -> Option<Storage> {
    if len == 0 {
        return None;
    }
    if len > CHUNK / 2 {
        let chunk = Arc::new(Chunk::map(len.checked_next_multiple_of(HUGE_PAGE)?)?);
        return Some(Storage::Chunk {
            chunk,
            offset: 0,
            len,
        });
    }
    let mut current = CURRENT.lock().unwrap_or_else(|p| p.into_inner());
    let live = current
        .as_ref()
        .and_then(|(chunk, free)| Some((chunk.upgrade()?, free.next_multiple_of(ALIGN))))
        .filter(|(chunk, offset)| offset + len <= chunk.size);
    let (chunk, offset) = match live {
        Some(found) => found,
        None => (Arc::new(Chunk::map(CHUNK)?), 0),
    };
    *current = Some((Arc::downgrade(&chunk), offset + len));
    Some(Storage::Chunk { chunk, offset, len })
}

impl Deref for WeightBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.storage {
            // SAFETY: offset + len ≤ the chunk's size (checked when cut), and this buffer is
            // the only one covering that range.
            Storage::Chunk { chunk, offset, len } => unsafe {
                std::slice::from_raw_parts(chunk.ptr.add(*offset), *len)
            },
            Storage::Heap(v) => v,
        }
    }
}

impl DerefMut for WeightBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.storage {
            // SAFETY: as `deref`; `&mut self` makes this the only access to the range.
            Storage::Chunk { chunk, offset, len } => unsafe {
                std::slice::from_raw_parts_mut(chunk.ptr.add(*offset), *len)
            },
            Storage::Heap(v) => v,
        }
    }
}

impl Drop for WeightBuf {
    fn drop(&mut self) {
        LIVE_BYTES.fetch_sub(self.len(), Ordering::Relaxed);
    }
}

impl Clone for WeightBuf {
    fn clone(&self) -> Self {
        Self::copy_of(self, 0)
    }
}

impl std::fmt::Debug for WeightBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightBuf")
            .field("len", &self.len())
            .field("in_chunk", &self.in_chunk())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dedicated_buffer_has_its_own_mapping_freed_with_it() {
        let mut b = WeightBuf::zeroed_dedicated(300_000);
        assert_eq!(b.len(), 300_000);
        assert!(b.iter().all(|&x| x == 0));
        b.fill(9);
        let weak = match &b.storage {
            Storage::Chunk { chunk, offset, .. } => {
                assert_eq!(*offset, 0);
                Some(Arc::downgrade(chunk))
            }
            Storage::Heap(_) => None,
        };
        assert_eq!(weak.is_some(), cfg!(target_os = "linux"));
        // Nothing else is cut from it.
        let other = WeightBuf::zeroed(100);
        assert!(other.iter().all(|&x| x == 0) && b.iter().all(|&x| x == 9));
        drop(b);
        assert!(weak.is_none_or(|w| w.upgrade().is_none()));
        assert_eq!(WeightBuf::zeroed_dedicated(0).len(), 0);
    }

    #[test]
    fn buffers_are_zeroed_disjoint_and_outlive_their_chunk_slot() {
        let sizes = [1usize, 100, 4096, 300_000, CHUNK / 2 + 1, 7];
        let mut bufs: Vec<WeightBuf> = sizes.iter().map(|&n| WeightBuf::zeroed(n)).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            assert!(b.iter().all(|&x| x == 0));
            b.fill(i as u8 + 1);
        }
        for (i, (b, &n)) in bufs.iter().zip(&sizes).enumerate() {
            assert_eq!(b.len(), n);
            assert!(
                b.iter().all(|&x| x == i as u8 + 1),
                "buffer {i} was overwritten"
            );
            if cfg!(target_os = "linux") {
                assert!(b.in_chunk());
            }
        }
        let copy = bufs[2].clone();
        drop(bufs);
        assert!(copy.iter().all(|&x| x == 3));
        // A chunk outlives the slot it was cut for only through its buffers.
        let weak = match &copy.storage {
            Storage::Chunk { chunk, .. } => Some(Arc::downgrade(chunk)),
            Storage::Heap(_) => None,
        };
        drop(copy);
        if let Some(weak) = weak {
            let sharing = CURRENT
                .lock()
                .unwrap()
                .as_ref()
                .is_some_and(|(c, _)| c.ptr_eq(&weak));
            // Other tests may cut from the same chunk meanwhile; alone, it is gone.
            assert!(weak.upgrade().is_none() || sharing);
        }
        assert!(WeightBuf::zeroed(0).is_empty());
        let c = WeightBuf::copy_of(&[1, 2, 3], 2);
        assert_eq!(&c[..], &[1, 2, 3, 0, 0]);
    }
}
