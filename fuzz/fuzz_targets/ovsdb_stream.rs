//! The OVSDB stream decoder: any bytes, split anywhere, decode to the same results as in one piece, and every
//! decoded message survives an encode/decode round trip; the envelope-only parse the client uses
//! (`RawMessage`, payload left as text) classifies every frame as the full parse does. Never panics.
#![no_main]

use kubeovn_ovn::framing::{DecodeError, FrameDecoder, Message, RawMessage};
use libfuzzer_sys::fuzz_target;

const LIMIT: usize = 4096;

fn drain(d: &mut FrameDecoder, out: &mut Vec<Result<Message, DecodeError>>) -> bool {
    loop {
        match d.next_message() {
            Ok(Some(m)) => out.push(Ok(m)),
            Ok(None) => return true,
            Err(e) => {
                let fatal = e.is_fatal();
                out.push(Err(e));
                if fatal {
                    return false;
                }
            }
        }
    }
}

fuzz_target!(|input: &[u8]| {
    // The first byte says how many split points follow (as u16 offsets); the rest is the stream.
    let n = input.first().copied().unwrap_or(0) as usize % 16;
    let header = 1 + 2 * n;
    if input.len() < header {
        return;
    }
    let data = &input[header..];
    let mut cuts: Vec<usize> = input[1..header]
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]) as usize % (data.len() + 1))
        .collect();
    cuts.sort_unstable();

    // Frame by frame: a message the full parse accepts is the same through the raw envelope.
    let mut frames = FrameDecoder::with_max_message(LIMIT);
    frames.feed(data);
    while let Ok(Some(f)) = frames.next_frame() {
        if let Ok(m) = Message::parse(f) {
            let raw = RawMessage::parse(f).and_then(|r| r.to_message());
            assert_eq!(raw, Ok(m));
        }
    }

    let mut whole = FrameDecoder::with_max_message(LIMIT);
    whole.feed(data);
    let mut expected = Vec::new();
    drain(&mut whole, &mut expected);

    let mut split = FrameDecoder::with_max_message(LIMIT);
    let mut got = Vec::new();
    let mut last = 0;
    for c in cuts.into_iter().chain(std::iter::once(data.len())) {
        split.feed(&data[last..c]);
        last = c;
        if !drain(&mut split, &mut got) {
            break;
        }
    }
    assert_eq!(got, expected);

    for m in expected.into_iter().flatten() {
        let mut bytes = Vec::new();
        m.encode(&mut bytes);
        let mut d = FrameDecoder::new();
        d.feed(&bytes);
        assert_eq!(d.next_message(), Ok(Some(m)));
        assert_eq!(d.next_message(), Ok(None));
    }
});
