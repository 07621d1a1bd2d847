//! The unique id as bytes of any source and as hex text, for the layers
//! that hand it between ranks (nccl-safe's `UniqueId`, the control
//! plane, the Python wheel). No library is loaded here.

use core::fmt;

use crate::types::{NCCL_UNIQUE_ID_BYTES, ncclUniqueId};

/// Why hex text is not a unique id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdTextError {
    /// A character that is not a hex digit (whitespace inside included).
    NotHex {
        /// Its position in the text given, in characters from 0.
        position: usize,
        /// The character.
        found: char,
    },
    /// Not `2 * NCCL_UNIQUE_ID_BYTES` digits (whitespace around them not
    /// counted).
    Length {
        /// Twice [`NCCL_UNIQUE_ID_BYTES`].
        expected: usize,
        /// The digits given.
        found: usize,
    },
}

impl fmt::Display for IdTextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdTextError::NotHex { position, found } => write!(
                f,
                "a unique id in hex: {found:?} at position {position} is not a hex digit"
            ),
            IdTextError::Length { expected, found } => {
                write!(f, "a unique id in hex is {expected} digits, found {found}")
            }
        }
    }
}

impl std::error::Error for IdTextError {}

impl ncclUniqueId {
    /// The id from exactly [`NCCL_UNIQUE_ID_BYTES`] bytes of any source (a
    /// Python peer, a message); `None` for any other length.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self::from_bytes)
    }

    /// The id as 256 lowercase hex digits. It is as secret as the id.
    pub fn to_hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut text = String::with_capacity(2 * NCCL_UNIQUE_ID_BYTES);
        for b in self.as_bytes() {
            text.push(char::from(DIGITS[usize::from(b >> 4)]));
            text.push(char::from(DIGITS[usize::from(b & 0xf)]));
        }
        text
    }

    /// The id from its hex text ([`ncclUniqueId::to_hex`], Python's
    /// `bytes.hex()`): 256 hex digits of either case, whitespace around
    /// them allowed.
    pub fn from_hex(text: &str) -> Result<Self, IdTextError> {
        let lead = text.chars().take_while(|c| c.is_whitespace()).count();
        let digits = text.trim();
        if let Some((i, c)) = digits
            .chars()
            .enumerate()
            .find(|(_, c)| !c.is_ascii_hexdigit())
        {
            return Err(IdTextError::NotHex {
                position: lead + i,
                found: c,
            });
        }
        // Only ASCII digits are left: one byte each.
        let digits = digits.as_bytes();
        if digits.len() != 2 * NCCL_UNIQUE_ID_BYTES {
            return Err(IdTextError::Length {
                expected: 2 * NCCL_UNIQUE_ID_BYTES,
                found: digits.len(),
            });
        }
        let mut bytes = [0u8; NCCL_UNIQUE_ID_BYTES];
        for (b, pair) in bytes.iter_mut().zip(digits.chunks_exact(2)) {
            *b = (hex_value(pair[0]) << 4) | hex_value(pair[1]);
        }
        Ok(Self::from_bytes(bytes))
    }
}

/// The value of one ASCII hex digit (checked by the caller).
fn hex_value(digit: u8) -> u8 {
    match digit {
        b'0'..=b'9' => digit - b'0',
        b'a'..=b'f' => digit - b'a' + 10,
        b'A'..=b'F' => digit - b'A' + 10,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_names_what_is_wrong() {
        let mut bytes = [0u8; NCCL_UNIQUE_ID_BYTES];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 37) as u8;
        }
        let id = ncclUniqueId::from_bytes(bytes);
        let text = id.to_hex();
        assert_eq!(text.len(), 256);
        assert!(ncclUniqueId::from_hex(&format!("  {}\n", text.to_uppercase())) == Ok(id));
        assert_eq!(
            ncclUniqueId::from_hex(" 0g").err(),
            Some(IdTextError::NotHex {
                position: 2,
                found: 'g'
            })
        );
        assert_eq!(
            ncclUniqueId::from_hex("00").err(),
            Some(IdTextError::Length {
                expected: 256,
                found: 2
            })
        );
        assert!(ncclUniqueId::from_slice(&bytes) == Some(id));
        assert!(ncclUniqueId::from_slice(&bytes[1..]).is_none());
    }
}
