//! Property tests of the frame and request decoder: arbitrary bytes in any
//! chunking come out as the same lines (or a too-long marker, after which
//! decoding goes on), and every line is a request or an error whose message
//! is bounded — never a panic. (`fuzz/` runs the same entry points.)

use apollo_agent::server::{parse_request, Frame, FrameCodec};
use apollo_shared::protocol::{MAX_ERROR_MESSAGE, MAX_FRAME_BYTES};
use bytes::BytesMut;
use proptest::prelude::*;
use tokio_util::codec::Decoder;

fn decode_all(chunks: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
    let mut codec = FrameCodec::default();
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for c in chunks {
        buf.extend_from_slice(c);
        while let Some(f) = codec.decode(&mut buf).unwrap() {
            out.push(match f {
                Frame::Line(b) => Some(b.to_vec()),
                Frame::TooLong => None,
            });
        }
    }
    while let Some(f) = codec.decode_eof(&mut buf).unwrap() {
        out.push(match f {
            Frame::Line(b) => Some(b.to_vec()),
            Frame::TooLong => None,
        });
    }
    out
}

fn request_like() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        any::<Vec<u8>>(),
        "\\PC{0,200}".prop_map(String::into_bytes),
        (
            prop_oneof![Just("\"2.0\""), Just("2"), Just("null")],
            prop_oneof![Just("1"), Just("\"a\""), Just("[]"), Just("{}"), Just("null")],
            prop_oneof![Just("\"tasks.list\""), Just("7"), Just("\"\"")],
            prop_oneof![Just("{}"), Just("[]"), Just("\"x\""), Just("{\"limit\": -1}")],
        )
            .prop_map(
                |(v, id, m, p)| format!("{{\"jsonrpc\":{v},\"id\":{id},\"method\":{m},\"params\":{p}}}").into_bytes()
            ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn lines_survive_any_chunking(lines in prop::collection::vec("[ -~]{0,64}", 0..20), cuts in prop::collection::vec(1usize..50, 0..20)) {
        let text: Vec<u8> = lines.iter().flat_map(|l| format!("{l}\n").into_bytes()).collect();
        let mut chunks = Vec::new();
        let mut rest = &text[..];
        for c in cuts {
            let n = c.min(rest.len());
            chunks.push(rest[..n].to_vec());
            rest = &rest[n..];
        }
        chunks.push(rest.to_vec());
        let got = decode_all(&chunks);
        let want: Vec<Option<Vec<u8>>> = lines.iter().map(|l| Some(l.as_bytes().to_vec())).collect();
        prop_assert_eq!(got, want);
    }

    #[test]
    fn any_frame_is_a_request_or_a_bounded_error(bytes in request_like()) {
        if let Err((_, e)) = parse_request(&bytes) {
            let e = e.bounded();
            prop_assert!(!e.message.is_empty());
            prop_assert!(e.message.len() <= MAX_ERROR_MESSAGE + 64);
        }
    }
}

#[test]
fn an_oversized_line_is_reported_and_the_next_one_decodes() {
    let mut big = vec![b'x'; MAX_FRAME_BYTES + 10];
    big.push(b'\n');
    big.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"agent.status\"}\n");
    let got = decode_all(&[big]);
    assert_eq!(got.len(), 2);
    assert!(got[0].is_none());
    assert!(parse_request(got[1].as_ref().unwrap()).is_ok());
}
