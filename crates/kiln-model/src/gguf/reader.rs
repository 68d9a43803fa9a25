//! A bounds-checked little-endian cursor: every read is checked against the buffer, so a hostile
//! file can only produce an error, never a panic or an over-long allocation.

use super::GgufError;

/// Cursor over the bytes of a GGUF header.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    pub(crate) fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                field: field.to_string(),
                offset: self.pos as u64,
                needed: n as u64,
            });
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N], GgufError> {
        let slice = self.take(N, field)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, field: &str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(field)?[0])
    }
    pub(crate) fn i8(&mut self, field: &str) -> Result<i8, GgufError> {
        Ok(self.array::<1>(field)?[0] as i8)
    }
    pub(crate) fn u16(&mut self, field: &str) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }
    pub(crate) fn i16(&mut self, field: &str) -> Result<i16, GgufError> {
        Ok(i16::from_le_bytes(self.array(field)?))
    }
    pub(crate) fn u32(&mut self, field: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }
    pub(crate) fn i32(&mut self, field: &str) -> Result<i32, GgufError> {
        Ok(i32::from_le_bytes(self.array(field)?))
    }
    pub(crate) fn u64(&mut self, field: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }
    pub(crate) fn i64(&mut self, field: &str) -> Result<i64, GgufError> {
        Ok(i64::from_le_bytes(self.array(field)?))
    }
    pub(crate) fn f32(&mut self, field: &str) -> Result<f32, GgufError> {
        Ok(f32::from_le_bytes(self.array(field)?))
    }
    pub(crate) fn f64(&mut self, field: &str) -> Result<f64, GgufError> {
        Ok(f64::from_le_bytes(self.array(field)?))
    }

    /// A count that will size an allocation: it must be payable from the bytes left, given the
    /// smallest possible encoding of one element.
    pub(crate) fn count(&mut self, min_elem_bytes: u64, field: &str) -> Result<usize, GgufError> {
        let n = self.u64(field)?;
        let needed = n.checked_mul(min_elem_bytes.max(1));
        match needed {
            Some(needed) if needed <= self.remaining() as u64 => Ok(n as usize),
            _ => Err(GgufError::Invalid {
                field: field.to_string(),
                reason: format!(
                    "count {n} cannot fit in the {} bytes left in the file",
                    self.remaining()
                ),
            }),
        }
    }

    pub(crate) fn string(&mut self, field: &str) -> Result<String, GgufError> {
        let len = self.count(1, field)?;
        let bytes = self.take(len, field)?;
        // Some converters wrote non-UTF-8 token pieces; keep them readable rather than refuse.
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }
}
