//! NCCL release numbers and the two ways `ncclGetVersion` has encoded them.

use core::fmt;

/// A NCCL release, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major version (2 for every release so far).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch level.
    pub patch: u32,
}

impl Version {
    /// The oldest release these bindings support: 2.18.0 (the first with
    /// `ncclCommSplit`).
    pub const MIN_SUPPORTED: Version = Version::new(2, 18, 0);

    /// The release whose header these bindings follow.
    pub const BINDINGS: Version = Version::new(
        crate::types::NCCL_MAJOR,
        crate::types::NCCL_MINOR,
        crate::types::NCCL_PATCH,
    );

    /// Builds a version from its parts.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// Decodes what `ncclGetVersion` wrote. Releases up to 2.8 encode
    /// `major*1000 + minor*100 + patch` (2.8.4 is 2804); from 2.9 on it is
    /// `major*10000 + minor*100 + patch` (2.28.9 is 22809). Every code of
    /// the old form is below 10000 and every code of the new form above, so
    /// the two cannot be confused. `None` for zero or negative codes.
    pub const fn from_code(code: i32) -> Option<Version> {
        if code <= 0 {
            return None;
        }
        let code = code as u32;
        if code >= 10_000 {
            Some(Version::new(code / 10_000, (code / 100) % 100, code % 100))
        } else {
            Some(Version::new(code / 1_000, (code / 100) % 10, code % 100))
        }
    }

    /// The `NCCL_VERSION_CODE` of this release, in the encoding that
    /// release's header uses (the header's `NCCL_VERSION` macro).
    pub const fn code(self) -> u32 {
        crate::types::NCCL_VERSION(self.major, self.minor, self.patch)
    }

    /// `true` when this release is at least `major.minor.patch`.
    pub const fn at_least(self, major: u32, minor: u32, patch: u32) -> bool {
        let other = Version::new(major, minor, patch);
        self.major > other.major
            || (self.major == other.major
                && (self.minor > other.minor
                    || (self.minor == other.minor && self.patch >= other.patch)))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_new_encoding() {
        assert_eq!(Version::from_code(22809), Some(Version::new(2, 28, 9)));
        assert_eq!(Version::from_code(23203), Some(Version::new(2, 32, 3)));
        assert_eq!(Version::from_code(21803), Some(Version::new(2, 18, 3)));
        assert_eq!(Version::from_code(20906), Some(Version::new(2, 9, 6)));
    }

    #[test]
    fn decodes_the_old_encoding() {
        assert_eq!(Version::from_code(2804), Some(Version::new(2, 8, 4)));
        assert_eq!(Version::from_code(2403), Some(Version::new(2, 4, 3)));
        assert_eq!(Version::from_code(2000), Some(Version::new(2, 0, 0)));
    }

    #[test]
    fn rejects_non_positive_codes() {
        assert_eq!(Version::from_code(0), None);
        assert_eq!(Version::from_code(-1), None);
    }

    #[test]
    fn code_round_trips_in_both_encodings() {
        for v in [
            Version::new(2, 8, 4),
            Version::new(2, 18, 3),
            Version::new(2, 32, 3),
        ] {
            assert_eq!(Version::from_code(v.code() as i32), Some(v));
        }
        assert_eq!(Version::new(2, 8, 4).code(), 2804);
        assert_eq!(Version::BINDINGS.code(), 23203);
    }

    #[test]
    fn orders_and_compares() {
        let v = Version::new(2, 28, 3);
        assert!(v.at_least(2, 28, 3));
        assert!(v.at_least(2, 27, 9));
        assert!(!v.at_least(2, 28, 7));
        assert!(Version::new(2, 18, 3) > Version::MIN_SUPPORTED);
        assert!(Version::new(2, 17, 1) < Version::MIN_SUPPORTED);
    }
}
