//! Whole systems (Z²FS paper, Section II-C and III): the probability that a
//! block read from the system is silently corrupt, its reliability score,
//! the Zettabyte goal and the checksum switching time.

use crate::checksum::ChecksumModel;
use crate::device::{Disk, Memory};
use crate::prob::Prob;

/// Bytes in a zettabyte, as the paper's goal uses it: 2^70. With 4 KiB
/// reads this gives its P_goal = 2^-58 = 3.47e-18 (printed as 3.46e-18),
/// score 17.46 (printed 17.5); with 10^21 bytes it would be 4.10e-18.
pub const ZETTABYTE: f64 = 1_180_591_620_717_411_303_424.0;

/// P_goal: one undetected corruption per zettabyte read in reads of `io_bytes`.
pub fn zettabyte_goal(io_bytes: f64) -> Prob {
    Prob::new(io_bytes / ZETTABYTE)
}

/// Where a block lives and for how long.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Environment {
    /// Memory of the writer and the reader.
    pub memory: Memory,
    /// The disk.
    pub disk: Disk,
    /// Block size b, in bits (the paper: 32,768, i.e. 4 KiB).
    pub block_bits: u64,
    /// Seconds the block stays in the reader's memory (t3 − t2).
    pub t_resident: f64,
    /// Seconds the block stays dirty in the writer's memory (t1 − t0; 30 s).
    pub t_flush: f64,
}

impl Environment {
    /// The paper's Table I configurations (1 to 4) with its defaults:
    /// 4 KiB blocks, t_resident = 1 s, t_flush = 30 s.
    pub fn paper_config(n: u8) -> Option<Environment> {
        use crate::device::lambda;
        let (lambda, disk_index) = match n {
            1 => (lambda::MAX, 10.0),
            2 => (lambda::MID, 12.0),
            3 => (lambda::MIN, 12.0),
            4 => (lambda::MIN, 20.0),
            _ => return None,
        };
        Some(Environment {
            memory: Memory::from_lambda(lambda),
            disk: Disk::from_index(disk_index),
            block_bits: 32_768,
            t_resident: 1.0,
            t_flush: 30.0,
        })
    }

    fn bits(&self) -> f64 {
        self.block_bits as f64
    }

    /// The block's read size in bytes.
    pub fn block_bytes(&self) -> f64 {
        self.block_bits as f64 / 8.0
    }
}

/// The systems the paper evaluates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum System {
    /// A file system with no checksums.
    Ncfs,
    /// ZFS: Fletcher on disk, nothing in memory.
    Zfs,
    /// E²ZFS with a 64-bit xor everywhere.
    E2zfsXor,
    /// E²ZFS with Fletcher everywhere.
    E2zfsFletcher,
    /// Z²FS static: xor in memory, xor and Fletcher on disk (chained).
    Z2fsStatic,
    /// Z²FS dynamic: as static until t_switch, then Fletcher in memory.
    Z2fsDynamic,
}

impl System {
    /// All systems, in the paper's order.
    pub const ALL: [System; 6] = [
        System::Ncfs,
        System::Zfs,
        System::E2zfsXor,
        System::E2zfsFletcher,
        System::Z2fsStatic,
        System::Z2fsDynamic,
    ];

    /// Name as printed and accepted on the command line.
    pub fn name(self) -> &'static str {
        match self {
            System::Ncfs => "ncfs",
            System::Zfs => "zfs",
            System::E2zfsXor => "e2zfs-xor",
            System::E2zfsFletcher => "e2zfs-fletcher",
            System::Z2fsStatic => "z2fs-static",
            System::Z2fsDynamic => "z2fs-dynamic",
        }
    }
}

/// The checksums guarding a block in each place of its life: the reader's
/// memory (t2..t3), the disk (t1..t2) and the writer's memory (t0..t1).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Protection {
    /// Checksum verified by the reader over its memory copy.
    pub reader_memory: ChecksumModel,
    /// Checksum(s) a disk corruption must escape.
    pub disk: ChecksumModel,
    /// Checksum guarding the dirty block in the writer's memory.
    pub writer_memory: ChecksumModel,
}

impl Protection {
    /// P_sys-udc = P_udc(mem, reader, t_resident) + P_udc(disk, disk)
    ///           + P_udc(mem, writer, t_flush)   (one corruption per block).
    pub fn p_sys_udc(&self, env: &Environment) -> Prob {
        let b = env.bits();
        Prob::sum([
            self.reader_memory
                .p_udc_memory(&env.memory, b, env.t_resident),
            self.disk.p_udc_disk(&env.disk, b),
            self.writer_memory.p_udc_memory(&env.memory, b, env.t_flush),
        ])
    }

    /// The same checksum everywhere (E²ZFS's scheme, and intact's at-rest one).
    pub fn uniform(c: ChecksumModel) -> Protection {
        Protection {
            reader_memory: c.clone(),
            disk: c.clone(),
            writer_memory: c,
        }
    }
}

/// The protection `system` gives a block read `t_resident` seconds after
/// it left the disk (`t_switch` matters only for Z²FS dynamic; 0 means
/// Fletcher throughout).
pub fn protection(system: System, block_bits: u64, t_resident: f64, t_switch: f64) -> Protection {
    let xor = ChecksumModel::xor(64, block_bits);
    let fletcher = ChecksumModel::fletcher();
    let none = ChecksumModel::none();
    match system {
        System::Ncfs => Protection::uniform(none),
        System::Zfs => Protection {
            reader_memory: none.clone(),
            disk: fletcher,
            writer_memory: none,
        },
        System::E2zfsXor => Protection::uniform(xor),
        System::E2zfsFletcher => Protection::uniform(fletcher),
        // Where xor cannot meet the goal even briefly, Z²FS "skips checksum
        // chaining and uses Fletcher all the way through" (Section III-C2).
        System::Z2fsDynamic if t_switch <= 0.0 => Protection::uniform(fletcher),
        System::Z2fsDynamic if t_resident > t_switch => Protection {
            reader_memory: fletcher.clone(),
            disk: fletcher,
            writer_memory: xor,
        },
        System::Z2fsStatic | System::Z2fsDynamic => Protection {
            reader_memory: xor.clone(),
            disk: ChecksumModel::both(&xor, &fletcher),
            writer_memory: xor,
        },
    }
}

/// P_sys-udc of `system` in `env` (Z²FS dynamic switches at `t_switch` s).
pub fn p_sys_udc(system: System, env: &Environment, t_switch: f64) -> Prob {
    protection(system, env.block_bits, env.t_resident, t_switch).p_sys_udc(env)
}

/// When Z²FS must switch its memory checksum from xor to Fletcher.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind", content = "seconds")]
pub enum SwitchTime {
    /// Even a block read at once misses the goal with xor: use Fletcher throughout.
    Immediately,
    /// Switch after this many seconds of residency.
    After(f64),
    /// xor meets the goal for longer than 10^12 s (~31,700 years).
    Never,
}

/// Solves P_Z²FS-static(t_resident = t) = P_goal for t (the paper's
/// t_switch), by bisection on log t; P grows with t, so the root is unique.
pub fn solve_switch_time(env: &Environment) -> SwitchTime {
    let goal = zettabyte_goal(env.block_bytes());
    let p = |t: f64| {
        let e = Environment {
            t_resident: t,
            ..*env
        };
        p_sys_udc(System::Z2fsStatic, &e, f64::INFINITY)
    };
    let (mut lo, mut hi) = (1e-9f64.ln(), 1e12f64.ln());
    if p(lo.exp()) >= goal {
        return SwitchTime::Immediately;
    }
    if p(hi.exp()) < goal {
        return SwitchTime::Never;
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if p(mid.exp()) < goal {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    SwitchTime::After(lo.exp())
}
