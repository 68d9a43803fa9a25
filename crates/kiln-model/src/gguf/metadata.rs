//! GGUF metadata values and typed accessors.

use super::GgufError;
use super::reader::Reader;

/// One metadata value as stored in a GGUF file.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// Unsigned 8-bit integer.
    U8(u8),
    /// Signed 8-bit integer.
    I8(i8),
    /// Unsigned 16-bit integer.
    U16(u16),
    /// Signed 16-bit integer.
    I16(i16),
    /// Unsigned 32-bit integer.
    U32(u32),
    /// Signed 32-bit integer.
    I32(i32),
    /// Unsigned 64-bit integer.
    U64(u64),
    /// Signed 64-bit integer.
    I64(i64),
    /// 32-bit float.
    F32(f32),
    /// 64-bit float.
    F64(f64),
    /// Boolean.
    Bool(bool),
    /// UTF-8 string (invalid bytes replaced).
    String(String),
    /// Array of values of one type.
    Array(Vec<MetaValue>),
}

const TYPE_U8: u32 = 0;
const TYPE_I8: u32 = 1;
const TYPE_U16: u32 = 2;
const TYPE_I16: u32 = 3;
const TYPE_U32: u32 = 4;
const TYPE_I32: u32 = 5;
const TYPE_F32: u32 = 6;
const TYPE_BOOL: u32 = 7;
const TYPE_STRING: u32 = 8;
const TYPE_ARRAY: u32 = 9;
const TYPE_U64: u32 = 10;
const TYPE_I64: u32 = 11;
const TYPE_F64: u32 = 12;

/// The smallest encoded size of one value of `ty`, used to bound array counts before allocating.
fn min_encoded_size(ty: u32) -> u64 {
    match ty {
        TYPE_U8 | TYPE_I8 | TYPE_BOOL => 1,
        TYPE_U16 | TYPE_I16 => 2,
        TYPE_U32 | TYPE_I32 | TYPE_F32 => 4,
        TYPE_U64 | TYPE_I64 | TYPE_F64 | TYPE_STRING => 8,
        TYPE_ARRAY => 12,
        _ => 1,
    }
}

pub(crate) fn read_value(
    r: &mut Reader<'_>,
    ty: u32,
    key: &str,
    depth: u32,
) -> Result<MetaValue, GgufError> {
    Ok(match ty {
        TYPE_U8 => MetaValue::U8(r.u8(key)?),
        TYPE_I8 => MetaValue::I8(r.i8(key)?),
        TYPE_U16 => MetaValue::U16(r.u16(key)?),
        TYPE_I16 => MetaValue::I16(r.i16(key)?),
        TYPE_U32 => MetaValue::U32(r.u32(key)?),
        TYPE_I32 => MetaValue::I32(r.i32(key)?),
        TYPE_U64 => MetaValue::U64(r.u64(key)?),
        TYPE_I64 => MetaValue::I64(r.i64(key)?),
        TYPE_F32 => MetaValue::F32(r.f32(key)?),
        TYPE_F64 => MetaValue::F64(r.f64(key)?),
        TYPE_BOOL => match r.u8(key)? {
            0 => MetaValue::Bool(false),
            1 => MetaValue::Bool(true),
            other => {
                return Err(GgufError::Invalid {
                    field: key.to_string(),
                    reason: format!("bool byte {other} is neither 0 nor 1"),
                });
            }
        },
        TYPE_STRING => MetaValue::String(r.string(key)?),
        TYPE_ARRAY => {
            if depth > 2 {
                return Err(GgufError::Invalid {
                    field: key.to_string(),
                    reason: "arrays nested deeper than 2 levels".into(),
                });
            }
            let elem_ty = r.u32(key)?;
            let n = r.count(min_encoded_size(elem_ty), key)?;
            let mut values = Vec::with_capacity(n);
            for _ in 0..n {
                values.push(read_value(r, elem_ty, key, depth + 1)?);
            }
            MetaValue::Array(values)
        }
        other => {
            return Err(GgufError::Invalid {
                field: key.to_string(),
                reason: format!("unknown metadata value type {other}"),
            });
        }
    })
}

impl MetaValue {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v as u64),
            MetaValue::U16(v) => Some(v as u64),
            MetaValue::U32(v) => Some(v as u64),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v as i64),
            MetaValue::I16(v) => Some(v as i64),
            MetaValue::I32(v) => Some(v as i64),
            MetaValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float, for any numeric type.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The value as a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a string slice.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array slice.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(v) => Some(v),
            _ => None,
        }
    }
}
