//! A tensor's storage bytes as a loader hands them to a backend: a range of the model file's
//! read-only map (no copy made) or an owned buffer (bytes a loader had to reorder or convert).

use std::ops::Deref;
use std::sync::Arc;

/// Storage bytes of one tensor.
#[derive(Clone)]
pub enum TensorBytes {
    /// Bytes the loader produced.
    Owned(Vec<u8>),
    /// `len` bytes at `start` of a file's map, which lives as long as any range of it.
    Mapped {
        /// The whole file's map.
        map: Arc<memmap2::Mmap>,
        /// First byte of the tensor.
        start: usize,
        /// Bytes of the tensor.
        len: usize,
    },
}

impl TensorBytes {
    /// `map[start..start + len]`, or `None` if that range is not inside the map.
    pub fn mapped(map: Arc<memmap2::Mmap>, start: usize, len: usize) -> Option<Self> {
        let end = start.checked_add(len)?;
        (end <= map.len()).then_some(Self::Mapped { map, start, len })
    }

    /// Whether the bytes are a range of a file's map.
    pub fn is_mapped(&self) -> bool {
        matches!(self, Self::Mapped { .. })
    }

    /// Bytes `range` of these (a range of the same map, or a copy of owned bytes); `None` if
    /// the range is out of bounds.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Option<Self> {
        if range.start > range.end || range.end > self.len() {
            return None;
        }
        match self {
            Self::Owned(v) => Some(Self::Owned(v[range].to_vec())),
            Self::Mapped { map, start, .. } => {
                Self::mapped(map.clone(), start + range.start, range.len())
            }
        }
    }
}

impl Drop for TensorBytes {
    /// A mapped range let go (once the backend has copied or repacked it, or the lab has
    /// converted it) leaves no pages resident behind it, so loading holds the weights once, in
    /// the backend's storage; a clone or sub-range still alive faults them back in if read.
    fn drop(&mut self) {
        if let Self::Mapped { map, start, len } = self {
            crate::weights::release_pages(map, *start, *len);
        }
    }
}

impl Deref for TensorBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Owned(v) => v,
            Self::Mapped { map, start, len } => &map[*start..*start + *len],
        }
    }
}

impl From<Vec<u8>> for TensorBytes {
    fn from(v: Vec<u8>) -> Self {
        Self::Owned(v)
    }
}

impl std::fmt::Debug for TensorBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_mapped() { "mapped" } else { "owned" };
        write!(f, "TensorBytes({kind}, {} bytes)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn map_of(bytes: &[u8]) -> Arc<memmap2::Mmap> {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        // SAFETY: a private temporary file nothing else writes.
        Arc::new(unsafe { memmap2::Mmap::map(&f) }.unwrap())
    }

    #[test]
    fn a_mapped_range_reads_the_file_and_survives_a_released_clone() {
        let map = map_of(&(0u8..100).collect::<Vec<_>>());
        let t = TensorBytes::mapped(map.clone(), 10, 5).unwrap();
        assert!(t.is_mapped());
        assert_eq!(&t[..], &[10, 11, 12, 13, 14]);
        drop(t.clone());
        assert_eq!(
            &t[..],
            &[10, 11, 12, 13, 14],
            "a clone let go releases, loses nothing"
        );
        let s = t.slice(1..3).unwrap();
        assert!(s.is_mapped());
        assert_eq!(&s[..], &[11, 12]);
        assert!(t.slice(3..6).is_none());
        assert!(TensorBytes::mapped(map.clone(), 96, 5).is_none());
        assert!(TensorBytes::mapped(map, usize::MAX, 2).is_none());
    }

    #[test]
    fn owned_bytes_slice_into_copies() {
        let t = TensorBytes::from(vec![1, 2, 3]);
        assert!(!t.is_mapped());
        let s = t.slice(1..3).unwrap();
        assert!(!s.is_mapped());
        assert_eq!(&s[..], &[2, 3]);
        assert!(t.slice(2..4).is_none());
    }
}
