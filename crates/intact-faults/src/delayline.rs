//! A wide-area link in user space: two TUN devices in two network
//! namespaces, joined by a program that holds every packet for a one-way
//! delay, sends at most a given rate through a bounded drop-tail queue,
//! and can lose packets at random. This kernel has no `netem`; Mahimahi
//! works the same way but is not packaged here.
//!
//! Each direction is two threads: one timestamps a packet when it reads
//! it from one device and gives it a departure time from the rate (the
//! bottleneck's serialisation; a packet that would find more than the
//! queue's bytes ahead of it is dropped, as a router's buffer drops); the
//! other writes it to the other device at departure + delay. The devices vanish
//! with their descriptors, so a stopped, dropped or killed line leaves
//! nothing behind.
//!
//! The line must never be the bottleneck unnoticed: [`DirStats`] counts
//! how late the thread wrote packets behind their due time, and the
//! kernel's own drops at each device (a TUN device drops when its reader
//! falls behind) are read back by [`DelayLine::kernel_drops`].

use std::collections::VecDeque;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};

/// How one direction of the link behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Added one-way delay.
    pub delay: Duration,
    /// The bottleneck's rate in bits per second of IP packets; `None`
    /// sends as fast as packets come.
    pub rate: Option<u64>,
    /// Bytes the bottleneck's queue holds before it drops (drop-tail).
    pub queue: usize,
    /// Probability in [0, 1] that a packet is lost.
    pub loss: f64,
    /// Seed of the losses (the same seed loses the same packets of the
    /// same sequence).
    pub seed: u64,
}

impl Shape {
    /// A link of `rate` bits/s with one-way `delay`, no loss, and a queue
    /// of one bandwidth-delay product of the round trip (at least 256 KiB).
    pub fn wan(rate: u64, delay: Duration) -> Shape {
        let bdp = (rate as f64 / 8.0 * 2.0 * delay.as_secs_f64()) as usize;
        Shape {
            delay,
            rate: Some(rate),
            queue: bdp.max(256 << 10),
            loss: 0.0,
            seed: 1,
        }
    }
}

/// One end of the line: a TUN device to be made in a namespace.
#[derive(Debug, Clone)]
pub struct TunEnd {
    /// The namespace (`/run/netns/NAME`).
    pub netns: String,
    /// The device's name there.
    pub ifname: String,
}

/// What one direction did, counted as it happened.
#[derive(Debug, Default)]
pub struct DirStats {
    /// Packets read from the input device.
    pub packets: AtomicU64,
    /// Their bytes.
    pub bytes: AtomicU64,
    /// Packets dropped by the configured loss.
    pub lost: AtomicU64,
    /// Packets dropped because the queue was full.
    pub queue_drops: AtomicU64,
    /// Packets written to the output device.
    pub delivered: AtomicU64,
    /// Packets the output device refused (it was down or gone).
    pub write_errors: AtomicU64,
    /// The most any packet was written after its due time, in µs.
    pub max_late_us: AtomicU64,
    /// Packets written more than 1 ms after their due time.
    pub late_1ms: AtomicU64,
    /// Whether both threads run real-time (SCHED_FIFO), so that the
    /// hosts' own work cannot starve the link.
    pub realtime: AtomicBool,
    /// A thread of this direction ended on an error before it was told to
    /// stop (a device gone or failing): the link is cut that way.
    pub died: AtomicBool,
}

/// A running delay line; stopped (and its devices gone) on drop.
#[derive(Debug)]
pub struct DelayLine {
    ends: [TunEnd; 2],
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// Direction `a` → `b`, then `b` → `a`.
    pub stats: [Arc<DirStats>; 2],
}

/// A TUN device (layer 3, no packet information header) made in `end`'s
/// namespace; it exists while the descriptor is open.
fn open_tun(end: &TunEnd) -> io::Result<OwnedFd> {
    let ns = File::open(format!("/run/netns/{}", end.netns))?;
    let name = CString::new(end.ifname.as_str()).map_err(io::Error::other)?;
    if name.as_bytes().len() >= libc::IFNAMSIZ {
        return Err(io::Error::other(format!("{}: name too long", end.ifname)));
    }
    // setns moves only the calling thread, so a thread of its own makes
    // the device and ends; the descriptor keeps the device in that
    // namespace.
    std::thread::spawn(move || -> io::Result<OwnedFd> {
        // SAFETY: setns on a descriptor this thread owns.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let path = c"/dev/net/tun";
        // SAFETY: a valid C string; the result is checked.
        // Close-on-exec: a child started meanwhile (`ip`, a test's
        // server) must not keep the device, and so its namespace, alive.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just opened and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero ifreq is valid.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
            *d = *s as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: TUNSETIFF reads an ifreq, which lives across the call.
        if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut req) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    })
    .join()
    .map_err(|_| io::Error::other("the thread making a TUN device panicked"))?
}

impl DelayLine {
    /// Makes the two devices (down, without addresses: the caller
    /// configures them with `ip`) and starts forwarding, `ab` shaping
    /// what goes from `a` to `b`, `ba` the way back.
    pub fn start(a: TunEnd, b: TunEnd, ab: Shape, ba: Shape) -> io::Result<DelayLine> {
        for s in [ab, ba] {
            if !(0.0..=1.0).contains(&s.loss) || s.rate == Some(0) {
                return Err(io::Error::other(format!("bad link shape {s:?}")));
            }
        }
        let fa = Arc::new(open_tun(&a)?);
        let fb = Arc::new(open_tun(&b)?);
        let stop = Arc::new(AtomicBool::new(false));
        let stats: [Arc<DirStats>; 2] = Default::default();
        let mut line = DelayLine {
            ends: [a, b],
            stop,
            threads: Vec::new(),
            stats,
        };
        for (input, output, shape, st, dir) in [
            (fa.clone(), fb.clone(), ab, Arc::clone(&line.stats[0]), "ab"),
            (fb, fa, ba, Arc::clone(&line.stats[1]), "ba"),
        ] {
            st.realtime.store(true, Ordering::Relaxed);
            let (tx, rx) = mpsc::channel();
            let (stop, st2) = (line.stop.clone(), st.clone());
            // Pushed as soon as started: a failure to start the next one
            // stops (Drop) those that run.
            line.threads.push(
                std::thread::Builder::new()
                    .name(format!("delayline-{dir}-in"))
                    .spawn(move || {
                        admit(&input, &tx, shape, &st, &stop);
                        died_unless_stopped(&st, &stop);
                    })?,
            );
            let stop = line.stop.clone();
            line.threads.push(
                std::thread::Builder::new()
                    .name(format!("delayline-{dir}-out"))
                    .spawn(move || {
                        deliver(&output, &rx, &st2, &stop);
                        died_unless_stopped(&st2, &stop);
                    })?,
            );
        }
        Ok(line)
    }

    /// The packets each device's kernel side dropped (its transmit queue
    /// full because this line read too slowly), `a` then `b`, from the
    /// devices' own counters.
    pub fn kernel_drops(&self) -> io::Result<[u64; 2]> {
        let mut out = [0; 2];
        for (o, end) in out.iter_mut().zip(&self.ends) {
            let text = std::process::Command::new("ip")
                .args(["-n", &end.netns, "-s", "-j", "link", "show", &end.ifname])
                .output()?;
            *o = tx_dropped(&String::from_utf8_lossy(&text.stdout)).ok_or_else(|| {
                io::Error::other(format!("{}: no tx dropped counter", end.ifname))
            })?;
        }
        Ok(out)
    }

    /// A one-line account of both directions.
    pub fn summary(&self) -> String {
        let one = |s: &DirStats| {
            format!(
                "{}{} packets, {} lost, {} queue drops, {} late > 1 ms (max {} µs){}",
                if s.died.load(Ordering::Relaxed) {
                    "CUT (a thread of the line ended on an error): "
                } else {
                    ""
                },
                s.packets.load(Ordering::Relaxed),
                s.lost.load(Ordering::Relaxed),
                s.queue_drops.load(Ordering::Relaxed),
                s.late_1ms.load(Ordering::Relaxed),
                s.max_late_us.load(Ordering::Relaxed),
                if s.realtime.load(Ordering::Relaxed) {
                    ""
                } else {
                    ", not real-time"
                }
            )
        };
        format!(
            "{}→{}: {}; back: {}",
            self.ends[0].ifname,
            self.ends[1].ifname,
            one(&self.stats[0]),
            one(&self.stats[1])
        )
    }
}

/// `tx_dropped` from `ip -s -j link show DEV`.
fn tx_dropped(json: &str) -> Option<u64> {
    let tx = json.find("\"tx\":")?;
    let rest = &json[tx..];
    let d = rest.find("\"dropped\":")? + "\"dropped\":".len();
    let digits: String = rest[d..]
        .chars()
        .skip_while(|c| c.is_whitespace())
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

impl Drop for DelayLine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Largest packet a TUN device hands over (its MTU can be at most 64 KiB).
const MAX_PACKET: usize = 65536;
/// How long a thread waits at most before it looks at the stop flag.
const TICK: Duration = Duration::from_millis(50);

/// Puts the calling thread under SCHED_FIFO at a low real-time priority
/// (root only); the kernel's real-time throttling still leaves the rest of
/// the machine 5 % of each second even if the line spun.
fn make_realtime() -> bool {
    let p = libc::sched_param { sched_priority: 10 };
    // SAFETY: pid 0 is the calling thread; p lives across the call.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) == 0 }
}

fn died_unless_stopped(st: &DirStats, stop: &AtomicBool) {
    if !stop.load(Ordering::SeqCst) {
        st.died.store(true, Ordering::SeqCst);
    }
}

/// Reads packets from `input` as they come, timestamps them and gives
/// each its due time (or drops it), handing them to [`deliver`]. Reading
/// is kept apart from writing: a write into a TUN device runs the
/// receiving namespace's stack in the writer's time, and a reader that
/// waited for it would timestamp late and see a burst a queue drops.
fn admit(
    input: &OwnedFd,
    to: &mpsc::Sender<(Instant, Vec<u8>)>,
    shape: Shape,
    st: &DirStats,
    stop: &AtomicBool,
) {
    let rt = make_realtime();
    st.realtime.fetch_and(rt, Ordering::Relaxed);
    let mut rng = fastrand::Rng::with_seed(shape.seed);
    let mut scratch = vec![0; MAX_PACKET];
    // When the bottleneck is next free.
    let mut busy_until = Instant::now();
    let tick = Timespec {
        tv_sec: 0,
        tv_nsec: TICK.as_nanos() as _,
    };
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [PollFd::new(input, PollFlags::IN)];
        match poll(&mut fds, Some(&tick)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return,
        }
        loop {
            let n = match rustix::io::read(input.as_fd(), &mut scratch[..]) {
                Ok(n) => n,
                Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => break,
                Err(_) => return,
            };
            let now = Instant::now();
            st.packets.fetch_add(1, Ordering::Relaxed);
            st.bytes.fetch_add(n as u64, Ordering::Relaxed);
            if shape.loss > 0.0 && rng.f64() < shape.loss {
                st.lost.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let depart = match shape.rate {
                Some(rate) => {
                    let start = busy_until.max(now);
                    // Bytes still ahead of this packet in the queue.
                    let ahead = start.duration_since(now).as_secs_f64() * rate as f64 / 8.0;
                    if ahead as usize + n > shape.queue {
                        st.queue_drops.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    busy_until = start + Duration::from_secs_f64(n as f64 * 8.0 / rate as f64);
                    busy_until
                }
                None => now,
            };
            // Due times only grow (departures do, the delay is one), so
            // the writer keeps them in order.
            if to
                .send((depart + shape.delay, scratch[..n].to_vec()))
                .is_err()
            {
                return;
            }
        }
    }
}

/// Writes each packet to `output` at its due time.
fn deliver(
    output: &OwnedFd,
    from: &mpsc::Receiver<(Instant, Vec<u8>)>,
    st: &DirStats,
    stop: &AtomicBool,
) {
    let rt = make_realtime();
    st.realtime.fetch_and(rt, Ordering::Relaxed);
    let mut line: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        let wait = match line.front() {
            Some((due, _)) => due.saturating_duration_since(Instant::now()).min(TICK),
            None => TICK,
        };
        if !wait.is_zero() {
            match from.recv_timeout(wait) {
                Ok(p) => line.push_back(p),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
        while let Ok(p) = from.try_recv() {
            line.push_back(p);
        }
        loop {
            let now = Instant::now();
            let Some((due, _)) = line.front() else { break };
            if *due > now {
                break;
            }
            let (due, buf) = line.pop_front().expect("front exists");
            let late = now.duration_since(due).as_micros() as u64;
            st.max_late_us.fetch_max(late, Ordering::Relaxed);
            if late > 1000 {
                st.late_1ms.fetch_add(1, Ordering::Relaxed);
            }
            match rustix::io::write(output.as_fd(), &buf) {
                Ok(_) => st.delivered.fetch_add(1, Ordering::Relaxed),
                Err(_) => st.write_errors.fetch_add(1, Ordering::Relaxed),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tx_dropped_is_read_from_the_tx_side() {
        let j = r#"[{"ifname":"x","stats64":{"rx":{"bytes":1,"dropped":7},"tx":{"bytes":2,"packets":3,"dropped": 42,"errors":0}}}]"#;
        assert_eq!(tx_dropped(j), Some(42));
        assert_eq!(tx_dropped("[]"), None);
    }

    #[test]
    fn a_wan_queue_is_one_round_trips_worth_of_bytes() {
        let s = Shape::wan(1_000_000_000, Duration::from_millis(15));
        assert_eq!(s.queue, 3_750_000);
        assert_eq!(Shape::wan(1_000_000, Duration::ZERO).queue, 256 << 10);
    }
}
