//! Framing: newline-delimited frames with a length cap. A frame over the cap
//! is reported as [`Frame::TooLong`] and skipped up to its newline, so the
//! connection survives it.

use apollo_shared::protocol::MAX_FRAME_BYTES;
use bytes::{Bytes, BytesMut};
use tokio_util::codec::{AnyDelimiterCodec, AnyDelimiterCodecError, Decoder};

pub enum Frame {
    Line(Bytes),
    TooLong,
}

pub struct FrameCodec(AnyDelimiterCodec);

impl Default for FrameCodec {
    fn default() -> Self {
        FrameCodec(AnyDelimiterCodec::new_with_max_length(b"\n".to_vec(), b"\n".to_vec(), MAX_FRAME_BYTES))
    }
}

fn map(r: Result<Option<Bytes>, AnyDelimiterCodecError>) -> std::io::Result<Option<Frame>> {
    match r {
        Ok(b) => Ok(b.map(Frame::Line)),
        Err(AnyDelimiterCodecError::MaxChunkLengthExceeded) => Ok(Some(Frame::TooLong)),
        Err(AnyDelimiterCodecError::Io(e)) => Err(e),
    }
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<Frame>> {
        map(self.0.decode(buf))
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<Frame>> {
        map(self.0.decode_eof(buf))
    }
}
