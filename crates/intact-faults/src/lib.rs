//! Real faults for intact's tests and fault lab (`intact-lab`).
//!
//! - [`LoopFs`]: an ext4 image made, loop-attached and mounted by the
//!   caller's process (root only), unmounted and detached by `Drop` on
//!   every path. [`LoopFs::flip_bit_under`] and
//!   [`LoopFs::flip_every_page_under`] change bytes on the device under a
//!   file (FIEMAP gives the sectors; writes go through the loop device with
//!   `O_DIRECT`) while the page cache keeps whatever it holds: an
//!   undetected write error, or, done before a read and undone after, an
//!   undetected read error.
//! - [`EmulatedSsd`]: an ext4 on an emulated SSD (FUSE, under a loop
//!   device), whose write buffer answers re-reads until new writes push a
//!   page out, with faults in the buffered copy or in the copy programmed
//!   to flash (Kim et al.'s Table 2).
//! - [`FlipProxy`]: a TCP proxy on loopback that flips bits in the stream
//!   at chosen offsets, or cuts the connection after N bytes.
//!   [`LoopFs::remount`] empties the file system's page cache (ground truth
//!   for the lab); [`LoopFs::device_byte_under`] reads the device under a
//!   file with `O_DIRECT`.
//! - [`loop_devices_of`] and [`mounts_under`] list loop devices still
//!   attached to files under a directory and file systems still mounted
//!   there, so that a run can prove it left none behind.
//! - [`Netbed`]: the recovery-cache paper's testbed in network namespaces
//!   (source, switch shaping the source's link and mirroring its traffic
//!   with the destination onto the cache's link, destination, cache), its
//!   source link optionally a wide-area one through a [`DelayLine`]: two
//!   TUN devices joined in user space with a one-way delay, rate, queue
//!   and loss (this kernel has no `netem`).

mod delayline;
mod loopfs;
mod netbed;
mod proxy;
mod ssd;

pub use delayline::{DelayLine, DirStats, Shape, TunEnd};
pub use loopfs::{loop_devices_of, mounts_under, usable, LoopFs};
pub use netbed::{netbed_usable, Host, Netbed, Wan};
pub use proxy::{FlipProxy, ProxyFault, Victim};
pub use ssd::{ssd_usable, EmulatedSsd, SsdEvent, SsdLayer, SsdModel, SsdStats, SSD_PAGE};
