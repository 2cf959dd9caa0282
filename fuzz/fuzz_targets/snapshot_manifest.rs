#![no_main]
use libfuzzer_sys::fuzz_target;

// A snapshot manifest read back by `nk restore`. The input gets a valid
// checksum appended, so the fuzzer reaches the decoder behind it.
fuzz_target!(|data: &[u8]| {
    let mut bytes = data.to_vec();
    bytes.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    let _ = nodekernel_client::snapshot::Manifest::decode(&bytes, std::path::Path::new("fuzz"));
});
