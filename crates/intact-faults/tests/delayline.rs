//! The wide-area testbed's delay line, measured from outside: datagrams
//! echoed between source and destination namespaces across it take at
//! least the round trip it adds; a stream across it takes at least its
//! bytes over its rate and arrives intact, in packets of the MTU the bed
//! was given; the losses it is told to make
//! are losses the echo sees; a testbed dropped, even by a panic, leaves no
//! namespace and no thread of its line (which holds the devices). Root only (namespaces, TUN).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use intact_faults::{DirStats, Netbed, Wan};

fn usable(name: &str) -> bool {
    if let Err(why) = intact_faults::netbed_usable() {
        intact_testkit::skip(name, &why);
        return false;
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        intact_testkit::skip(name, "no /dev/net/tun");
        return false;
    }
    true
}

/// Starts a UDP echo on the destination; returns its port.
fn echo(bed: &Netbed) -> u16 {
    let (tx, rx) = std::sync::mpsc::channel();
    bed.destination
        .spawn(move || {
            let s = UdpSocket::bind("10.91.2.1:0").unwrap();
            tx.send(s.local_addr().unwrap().port()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut buf = [0; 2048];
            while let Ok((n, from)) = s.recv_from(&mut buf) {
                if &buf[..n] == b"stop" {
                    break;
                }
                let _ = s.send_to(&buf[..n], from);
            }
        })
        .unwrap();
    rx.recv().unwrap()
}

/// Sends `count` numbered datagrams from the source to the echo, one every
/// `gap`, and returns the round trip of each one that came back.
fn pings(bed: &Netbed, port: u16, count: u32, gap: Duration) -> Vec<Duration> {
    bed.source
        .spawn(move || {
            let s = UdpSocket::bind("10.91.1.1:0").unwrap();
            s.connect(("10.91.2.1", port)).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
            let mut sent = Vec::new();
            let mut rtts = Vec::new();
            let mut buf = [0; 64];
            let mut collect = |rtts: &mut Vec<Duration>, sent: &[Instant]| {
                while let Ok(n) = s.recv(&mut buf) {
                    let i = u32::from_le_bytes(buf[..4].try_into().unwrap()) as usize;
                    assert_eq!(n, 4);
                    rtts.push(sent[i].elapsed());
                }
            };
            for i in 0..count {
                sent.push(Instant::now());
                s.send(&i.to_le_bytes()).unwrap();
                let until = Instant::now() + gap;
                while Instant::now() < until {
                    collect(&mut rtts, &sent);
                }
            }
            // The stragglers, well past any round trip here.
            let until = Instant::now() + Duration::from_secs(2);
            while Instant::now() < until {
                collect(&mut rtts, &sent);
            }
            // Several times: the line may lose one.
            for _ in 0..8 {
                s.send(b"stop").unwrap();
            }
            rtts
        })
        .unwrap()
        .join()
        .unwrap()
}

#[test]
fn echoes_take_the_added_round_trip_and_no_packet_is_lost_unasked() {
    if !usable("echoes_take_the_added_round_trip_and_no_packet_is_lost_unasked") {
        return;
    }
    let rtt = Duration::from_millis(30);
    let bed = Netbed::with_wan(Wan {
        rtt,
        rate: 1_000_000_000,
        loss: 0.0,
        mtu: 1500,
    })
    .unwrap();
    let port = echo(&bed);
    let rtts = pings(&bed, port, 40, Duration::from_millis(5));
    assert_eq!(rtts.len(), 40, "every echo came back");
    let min = *rtts.iter().min().unwrap();
    assert!(min >= rtt, "an echo came back in {min:?} < {rtt:?}");
    // The fastest of 40: above any scheduling delay, below what a delay
    // applied twice would give.
    assert!(min < rtt * 3 / 2, "the fastest echo took {min:?}");
    let line = bed.wan.as_ref().unwrap();
    for st in &line.stats {
        assert!(!st.died.load(Ordering::SeqCst), "{}", line.summary());
        assert_eq!(st.lost.load(Ordering::Relaxed), 0);
        assert_eq!(st.queue_drops.load(Ordering::Relaxed), 0);
    }
    eprintln!("{}", line.summary());
}

#[test]
fn losses_asked_for_are_losses_the_echo_sees() {
    if !usable("losses_asked_for_are_losses_the_echo_sees") {
        return;
    }
    let bed = Netbed::with_wan(Wan {
        rtt: Duration::from_millis(2),
        rate: 1_000_000_000,
        loss: 0.2,
        mtu: 1500,
    })
    .unwrap();
    let port = echo(&bed);
    let sent = 1000;
    let back = pings(&bed, port, sent, Duration::from_micros(200)).len() as f64;
    // 0.8 × 0.8 of them expected; 1,000 draws put the count within ±60 of
    // 640 with overwhelming odds.
    let expected = sent as f64 * 0.64;
    assert!(
        (back - expected).abs() < 100.0,
        "{back} of {sent} echoes came back, {expected} expected"
    );
    let line = bed.wan.as_ref().unwrap();
    let lost: u64 = line
        .stats
        .iter()
        .map(|s| s.lost.load(Ordering::Relaxed))
        .sum();
    // Every missing echo is a loss the line made (the "stop" datagram
    // and any stray packet of the hosts may add to its count).
    assert!(lost >= sent as u64 - back as u64, "{}", line.summary());
}

#[test]
fn a_stream_takes_at_least_its_bytes_over_the_rate_and_arrives_intact() {
    if !usable("a_stream_takes_at_least_its_bytes_over_the_rate_and_arrives_intact") {
        return;
    }
    let rate = 100_000_000u64;
    let bed = Netbed::with_wan(Wan {
        rtt: Duration::from_millis(20),
        rate,
        loss: 0.0,
        mtu: 9000,
    })
    .unwrap();
    let len = 20usize << 20;
    let data: Vec<u8> = (0..len)
        .map(|i| ((i as u64 * 2_654_435_761) >> 13) as u8)
        .collect();
    let (tx, rx) = std::sync::mpsc::channel();
    let sink = bed
        .destination
        .spawn(move || {
            let l = TcpListener::bind("10.91.2.1:0").unwrap();
            tx.send(l.local_addr().unwrap().port()).unwrap();
            let (mut c, _) = l.accept().unwrap();
            let mut got = Vec::new();
            c.read_to_end(&mut got).unwrap();
            got
        })
        .unwrap();
    let port = rx.recv().unwrap();
    let to_send = data.clone();
    let elapsed = bed
        .source
        .spawn(move || {
            let mut c = TcpStream::connect(("10.91.2.1", port)).unwrap();
            let t = Instant::now();
            c.write_all(&to_send).unwrap();
            c.shutdown(std::net::Shutdown::Write).unwrap();
            let mut rest = Vec::new();
            c.read_to_end(&mut rest).unwrap();
            t.elapsed()
        })
        .unwrap()
        .join()
        .unwrap();
    let got = sink.join().unwrap();
    assert!(
        got == data,
        "the stream arrived changed ({} bytes)",
        got.len()
    );
    // IP packets carry the bytes plus headers: the bytes alone over the
    // rate are a lower bound.
    let floor = Duration::from_secs_f64(len as f64 * 8.0 / rate as f64);
    assert!(elapsed >= floor, "{len} bytes in {elapsed:?} < {floor:?}");
    let line = bed.wan.as_ref().unwrap();
    eprintln!("{} in {elapsed:?}; {}", len, line.summary());
    let (packets, bytes) = (
        line.stats[0].packets.load(Ordering::Relaxed),
        line.stats[0].bytes.load(Ordering::Relaxed),
    );
    assert!(bytes >= len as u64);
    // Jumbo frames all the way: the stream's packets were larger than the
    // Internet's 1,500 bytes.
    assert!(bytes / packets > 1500, "{packets} packets, {bytes} bytes");
}

/// This process's namespaces whose names start with `tag`.
fn namespaces(tag: &str) -> Vec<String> {
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&ns.stdout)
        .lines()
        .filter(|l| l.starts_with(tag))
        .map(str::to_string)
        .collect()
}

/// A deleted namespace stays alive while anything holds it, and the
/// line's threads hold its devices (the only owners of their
/// descriptors): that they all ended is seen from the counters they
/// shared, one reference each.
fn line_gone(stats: [Arc<DirStats>; 2]) {
    for st in &stats {
        assert_eq!(Arc::strong_count(st), 1, "a thread of the line still runs");
        assert!(!st.died.load(Ordering::SeqCst));
    }
}

#[test]
fn a_testbed_dropped_or_panicked_out_of_leaves_nothing() {
    if !usable("a_testbed_dropped_or_panicked_out_of_leaves_nothing") {
        return;
    }
    let wan = Wan {
        rtt: Duration::from_millis(10),
        rate: 1_000_000_000,
        loss: 0.0,
        mtu: 1500,
    };
    let bed = Netbed::with_wan(wan).unwrap();
    // "intact-bed-PID-N-": the names of this bed's hosts start so.
    let tag = bed.source.name.trim_end_matches("src").to_string();
    assert_eq!(namespaces(&tag).len(), 4, "the four hosts exist");
    let tun = Command::new("ip")
        .args(["-n", &bed.source.name, "-d", "link", "show", "src0"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&tun.stdout).contains("tun"),
        "the source's link is a TUN device"
    );
    let stats = bed.wan.as_ref().unwrap().stats.clone();
    drop(bed);
    assert_eq!(namespaces(&tag), Vec::<String>::new());
    line_gone(stats);
    let (tag, stats) = std::thread::spawn(move || {
        let bed = Netbed::with_wan(wan).unwrap();
        let tag = bed.source.name.trim_end_matches("src").to_string();
        let stats = bed.wan.as_ref().unwrap().stats.clone();
        std::panic::panic_any((tag, stats));
    })
    .join()
    .unwrap_err()
    .downcast::<(String, [Arc<DirStats>; 2])>()
    .map(|b| *b)
    .unwrap();
    assert_eq!(namespaces(&tag), Vec::<String>::new());
    line_gone(stats);
}

#[test]
fn a_bed_left_by_a_killed_process_is_swept_by_the_next() {
    if !usable("a_bed_left_by_a_killed_process_is_swept_by_the_next") {
        return;
    }
    // A process that is gone (reaped), and a host named as its bed's.
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = format!("intact-bed-{dead}-0-src");
    /// Removes the planted host on every path (the sweep should have).
    struct Planted(String);
    impl Drop for Planted {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
        }
    }
    let made = Command::new("ip")
        .args(["netns", "add", &stale])
        .status()
        .unwrap();
    let _planted = Planted(stale.clone());
    assert!(made.success());
    // A live process's bed (this one's) stays.
    let bed = Netbed::unshaped(1500).unwrap();
    let mine = bed.source.name.clone();
    let names: Vec<String> = namespaces("intact-bed-")
        .iter()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    assert!(!names.contains(&stale), "left: {names:?}");
    assert!(names.contains(&mine), "{names:?}");
    drop(bed);
}
