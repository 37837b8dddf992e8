//! Memory follows bytes that arrived, not lengths announced: a peer that
//! announces a 16 MiB frame and sends 64 KiB of it costs the reader about
//! 64 KiB. Measured with a counting global allocator (this test binary's
//! own), around the one read.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};

use intact_proto::{Connection, ProtoError};

struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = NOW.fetch_add(l.size(), Ordering::SeqCst) + l.size();
            PEAK.fetch_max(now, Ordering::SeqCst);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        NOW.fetch_sub(l.size(), Ordering::SeqCst);
    }
}

#[global_allocator]
static A: Counting = Counting;

#[test]
fn an_announced_16_mib_frame_costs_what_arrived() {
    let (mut a, b) = UnixStream::pair().unwrap();
    // 16 MiB announced (within the post-handshake limit), 64 KiB sent.
    let sent = 64 * 1024;
    let mut bytes = (16u32 << 20).to_be_bytes().to_vec();
    bytes.push(5);
    bytes.resize(4 + sent, 0xAB);
    a.write_all(&bytes).unwrap();
    drop(a);
    let mut conn = Connection::new(b);
    let base = NOW.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let r = conn.read_message();
    let peak = PEAK.load(Ordering::SeqCst) - base;
    assert!(matches!(r, Err(ProtoError::Closed)), "{r:?}");
    // Doubling from what arrived: a 128 KiB buffer at most, plus the
    // 64 KiB one it was copied from while growing (+ slack for the
    // error); far from the 16 MiB a zero-filled buffer would take.
    assert!(
        peak <= 3 * sent + 16 * 1024,
        "peak {peak} bytes for {sent} received"
    );
    assert!(
        peak >= sent,
        "the measurement saw no buffer at all ({peak})"
    );
}
