//! One KV buffer as its own anonymous mapping, on small pages. The kernel commits pages only as
//! positions are written, and dropping the buffer (a layer converting, a sequence ending)
//! returns them to the system at once — the heap allocator could keep a freed multi-megabyte
//! block, which would make the resident size drift from what `kiln fit` bills.

use crate::ModelError;

/// A zero-filled byte buffer backed by an anonymous mapping.
pub(crate) struct KvBuf {
    map: Option<memmap2::MmapMut>,
}

impl KvBuf {
    /// `len` zero bytes; no memory is committed until written.
    pub(crate) fn zeroed(len: usize) -> Result<Self, ModelError> {
        if len == 0 {
            return Ok(Self { map: None });
        }
        let map = memmap2::MmapMut::map_anon(len)
            .map_err(|e| ModelError::Forward(format!("allocating {len} bytes of KV cache: {e}")))?;
        // Each KV head's rows start at their own offset, so under `transparent_hugepage=always`
        // a one-token sequence could fault in a 2 MiB page per head and buffer, far above what
        // `kiln fit` bills per position. Only advice: failure changes nothing but RSS.
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::NoHugePage);
        Ok(Self { map: Some(map) })
    }

    /// Bytes reserved.
    pub(crate) fn len(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.len())
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        self.map.as_deref_mut().unwrap_or(&mut [])
    }

    pub(crate) fn f32s(&self) -> &[f32] {
        // SAFETY: the mapping is page-aligned and every bit pattern is a valid f32; `align_to`
        // puts nothing in the prefix for an aligned start.
        let (head, body, _) = unsafe { self.bytes().align_to::<f32>() };
        debug_assert!(head.is_empty());
        body
    }

    pub(crate) fn f32s_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `f32s`.
        let (head, body, _) = unsafe { self.bytes_mut().align_to_mut::<f32>() };
        debug_assert!(head.is_empty());
        body
    }

    pub(crate) fn u16s(&self) -> &[u16] {
        // SAFETY: page-aligned; every bit pattern is a valid u16.
        let (head, body, _) = unsafe { self.bytes().align_to::<u16>() };
        debug_assert!(head.is_empty());
        body
    }

    pub(crate) fn u16s_mut(&mut self) -> &mut [u16] {
        // SAFETY: as in `u16s`.
        let (head, body, _) = unsafe { self.bytes_mut().align_to_mut::<u16>() };
        debug_assert!(head.is_empty());
        body
    }
}
