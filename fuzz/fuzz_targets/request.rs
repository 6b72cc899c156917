//! The socket's decoder: bytes in any amount become frames, and each frame
//! a request or an error; nothing panics.
#![no_main]

use apollo_agent::server::{parse_request, Frame, FrameCodec};
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::Decoder;

fuzz_target!(|data: &[u8]| {
    let mut codec = FrameCodec::default();
    let mut buf = BytesMut::from(data);
    while let Ok(Some(frame)) = codec.decode_eof(&mut buf) {
        if let Frame::Line(line) = frame {
            if let Err((_, e)) = parse_request(&line) {
                assert!(!e.bounded().message.is_empty());
            }
        }
    }
});
