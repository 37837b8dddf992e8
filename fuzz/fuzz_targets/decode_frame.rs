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
            // What decodes must encode back to the same bytes.
            let mut again = Vec::new();
            msg.encode(&mut again);
            assert_eq!(&again[..], &rest[..n], "{msg:?}");
        }
        rest = &rest[n..];
    }
});
