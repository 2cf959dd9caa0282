#![no_main]
use libfuzzer_sys::fuzz_target;

// The first two bytes choose the op code, the rest is the payload.
fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let op = u16::from_le_bytes([data[0], data[1]]);
    let _ = nodekernel_proto::store::StoreRequest::decode(op, &data[2..]);
    let _ = nodekernel_proto::store::decode_write_prefix(&data[2..]);
});
