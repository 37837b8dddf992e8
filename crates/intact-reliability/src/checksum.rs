//! Checksum models: a Hamming distance and the fraction of errors at (and
//! beyond) that distance which go undetected.

use intact_digest::Algorithm;

use crate::device::{Disk, Memory};
use crate::prob::Prob;

/// How well a checksum detects random bit flips in a block.
///
/// `hd` is the Hamming distance: every error of fewer than `hd` flipped bits
/// is detected. Of errors with `hd` or more flips, a fraction `undetected`
/// escapes. Following the Z²FS paper (after Koopman), the probability of an
/// undetected corruption is P(≥ hd flips) × `undetected`; the paper uses
/// P(= hd flips), which differs by a relative bE/hd, far below the digits
/// it prints.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ChecksumModel {
    /// Name for reports.
    pub name: String,
    /// Hamming distance at the modelled block length.
    pub hd: u64,
    /// Fraction of errors of weight ≥ hd that the checksum misses.
    pub undetected: f64,
}

/// The Z²FS paper's approximation for its 256-bit Fletcher (HD 3).
pub const FLETCHER_UNDETECTED: f64 = 4.16e-20;

/// CRC-32C's Hamming distance for `data_bits` of data.
///
/// Source: P. Koopman, "32-Bit Cyclic Redundancy Codes for Internet
/// Applications", DSN 2002, Table 1 (iSCSI polynomial 0x1EDC6F41, Koopman
/// notation 0x8F6E37A0), as also quoted in RFC 3385 §5: HD = 6 up to 5,243
/// data bits, HD = 4 up to 2,147,483,615 bits. Shorter words have a higher
/// HD still; using 6 there is conservative. Beyond 2^31 bits the table
/// says nothing, so only what every CRC guarantees is assumed: HD 2
/// (all single-bit errors are detected).
pub fn crc32c_hd(data_bits: u64) -> u64 {
    match data_bits {
        0..=5_243 => 6,
        5_244..=2_147_483_615 => 4,
        _ => 2,
    }
}

impl ChecksumModel {
    /// No checksum: every corruption goes undetected.
    pub fn none() -> ChecksumModel {
        ChecksumModel {
            name: "none".into(),
            hd: 1,
            undetected: 1.0,
        }
    }

    /// k-bit xor over a block of `block_bits`: HD 2, undetected fraction
    /// (b − k) / (k (b − 1)) (the paper's closed form, after Koopman).
    pub fn xor(k: u64, block_bits: u64) -> ChecksumModel {
        let (b, k) = (block_bits as f64, k as f64);
        ChecksumModel {
            name: format!("xor-{k}"),
            hd: 2,
            undetected: (b - k) / (k * (b - 1.0)),
        }
    }

    /// The paper's 256-bit Fletcher: HD 3, undetected fraction 4.16e-20.
    pub fn fletcher() -> ChecksumModel {
        ChecksumModel {
            name: "fletcher".into(),
            hd: 3,
            undetected: FLETCHER_UNDETECTED,
        }
    }

    /// CRC-32C over a block of `block_bits`: its HD at that length, and
    /// 2^-32 of heavier errors undetected (the usual random-code estimate).
    pub fn crc32c(block_bits: u64) -> ChecksumModel {
        ChecksumModel {
            name: "crc32c".into(),
            hd: crc32c_hd(block_bits),
            undetected: 2f64.powi(-32),
        }
    }

    /// A hash modelled as a random function of `bits` output bits: no
    /// guaranteed distance (HD 1), 2^-bits of corruptions undetected.
    /// This models random faults, not an adversary.
    pub fn random(name: &str, bits: i32) -> ChecksumModel {
        ChecksumModel {
            name: name.into(),
            hd: 1,
            undetected: 2f64.powi(-bits),
        }
    }

    /// The model for one of intact's algorithms over `block_bits`, or
    /// `None` for Adler-32, whose detection of random flips is not modelled.
    pub fn for_algorithm(algorithm: Algorithm, block_bits: u64) -> Option<ChecksumModel> {
        Some(match algorithm {
            Algorithm::Crc32c => ChecksumModel::crc32c(block_bits),
            Algorithm::Xxh3_64 => ChecksumModel::random("xxh3", 64),
            Algorithm::Xxh3_128 => ChecksumModel::random("xxh128", 128),
            Algorithm::Blake3 => ChecksumModel::random("blake3", 256),
            Algorithm::Sha256 => ChecksumModel::random("sha256", 256),
            Algorithm::Sha512 => ChecksumModel::random("sha512", 512),
            Algorithm::Sha1 => ChecksumModel::random("sha1", 160),
            Algorithm::Md5 => ChecksumModel::random("md5", 128),
            Algorithm::Adler32 => return None,
        })
    }

    /// Corruption must escape both checksums (Z²FS keeps xor and Fletcher
    /// together on disk): the larger HD, and both fractions, assuming the
    /// two miss independently.
    pub fn both(a: &ChecksumModel, b: &ChecksumModel) -> ChecksumModel {
        ChecksumModel {
            name: format!("{}&{}", a.name, b.name),
            hd: a.hd.max(b.hd),
            undetected: a.undetected * b.undetected,
        }
    }

    /// P_udc(disk, C): a block of `bits` on `disk` is corrupted undetectably.
    pub fn p_udc_disk(&self, disk: &Disk, bits: f64) -> Prob {
        disk.p_at_least(bits, self.hd)
            .times(Prob::new(self.undetected))
    }

    /// P_udc(mem, C, t): a block of `bits` held `seconds` in `memory` is
    /// corrupted undetectably.
    pub fn p_udc_memory(&self, memory: &Memory, bits: f64, seconds: f64) -> Prob {
        memory
            .p_at_least(bits, seconds, self.hd)
            .times(Prob::new(self.undetected))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xor_fraction_matches_the_closed_form() {
        let x = ChecksumModel::xor(64, 32768);
        assert!((x.undetected - 32704.0 / (64.0 * 32767.0)).abs() < 1e-15);
        assert_eq!(x.hd, 2);
    }

    #[test]
    fn crc32c_distance_follows_the_published_table() {
        assert_eq!(crc32c_hd(512), 6);
        assert_eq!(crc32c_hd(5_243), 6);
        assert_eq!(crc32c_hd(5_244), 4);
        assert_eq!(crc32c_hd(4096 * 8), 4);
        assert_eq!(crc32c_hd(2_147_483_615), 4);
        assert_eq!(crc32c_hd(1 << 32), 2);
    }

    #[test]
    fn no_checksum_misses_every_corruption() {
        let d = Disk::from_uber(1e-12);
        let p = ChecksumModel::none().p_udc_disk(&d, 32768.0);
        assert_eq!(p, d.p_at_least(32768.0, 1));
    }

    #[test]
    fn adler_is_not_modelled() {
        assert!(ChecksumModel::for_algorithm(Algorithm::Adler32, 32768).is_none());
        assert_eq!(
            ChecksumModel::for_algorithm(Algorithm::Crc32c, 32768)
                .unwrap()
                .hd,
            4
        );
    }
}
