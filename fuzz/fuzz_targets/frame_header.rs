#![no_main]
use libfuzzer_sys::fuzz_target;
use nodekernel_proto::{FrameHeader, HEADER_LEN, MAX_PAYLOAD_LEN};

fuzz_target!(|data: &[u8]| {
    if let Some(h) = data.get(..HEADER_LEN) {
        let h: [u8; HEADER_LEN] = h.try_into().unwrap();
        if let Ok(f) = FrameHeader::parse(&h) {
            assert!(f.payload_len <= MAX_PAYLOAD_LEN);
        }
    }
});
