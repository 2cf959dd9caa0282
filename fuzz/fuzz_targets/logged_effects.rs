#![no_main]
use libfuzzer_sys::fuzz_target;

// A record of the metadata server's operation log, as read back at start.
fuzz_target!(|data: &[u8]| {
    let _ = nodekernel_meta::codec::decode_effects(data);
});
