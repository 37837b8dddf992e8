//! intact's reliability model: the analytical framework of the Z²FS paper
//! (Zhang et al., "Zettabyte Reliability with Flexible End-to-end Data
//! Integrity", Sections II–III) and the RIVA paper's undetected-error
//! analysis (Section 5.2.3), as pure functions.
//!
//! [`Memory`] and [`Disk`] give the probability of i flipped bits in a
//! block; a [`ChecksumModel`] (Hamming distance + undetected fraction)
//! turns that into P_udc; [`Protection`] sums the three places a block
//! lives (writer's memory, disk, reader's memory) into P_sys-udc for a
//! [`System`] in an [`Environment`]. [`zettabyte_goal`] and
//! [`solve_switch_time`] are the paper's goal and t_switch;
//! [`block_risk`] is RIVA's bE vs bE². All probabilities are [`Prob`]s,
//! kept as logarithms so that 1e-40 and smaller stay exact.
//!
//! Contract: no I/O, no global state; every function is deterministic.

mod checksum;
mod defaults;
mod device;
mod prob;
mod riva;
mod system;

pub use checksum::{crc32c_hd, ChecksumModel, FLETCHER_UNDETECTED};
pub use defaults::{default_scores, DefaultScore, FILE_BYTES};
pub use device::{lambda, Disk, Memory};
pub use prob::Prob;
pub use riva::{block_risk, BlockRisk, Verification};
pub use system::{
    p_sys_udc, protection, solve_switch_time, zettabyte_goal, Environment, Protection, SwitchTime,
    System, ZETTABYTE,
};
