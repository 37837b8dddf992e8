//! Feeds arbitrary bytes to the frame decoder, as a peer could: step 1
//! (frame_len) then step 2 (decode), over the whole input as a stream of
//! frames. Must never panic, hang or allocate without bound.
#![no_main]

use intact_proto::{frame_len, Message, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while let Ok(Some(n)) = frame_len(rest) {
        if let Ok(msg) = Message::decode(&rest[HEADER_LEN..n]) {
            // What decodes encodes to bytes that decode to the same message,
            // and to the very same bytes, except a Hello of an older version
            // (read without its suite byte or key share, written with them).
            let mut again = Vec::new();
            msg.encode(&mut again);
            let back = Message::decode(&again[HEADER_LEN..]).expect("what we encode decodes");
            assert_eq!(back, msg);
            if !matches!(msg, Message::Hello { .. }) {
                assert_eq!(&again[..], &rest[..n], "{msg:?}");
            }
        }
        rest = &rest[n..];
    }
});
