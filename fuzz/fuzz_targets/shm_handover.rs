#![no_main]
use libfuzzer_sys::fuzz_target;
use nodekernel_shm::handover::{decode_message, Challenge, CHALLENGE_LEN};
use nodekernel_shm::{ClientRegion, Layout, HEADER_LEN, MESSAGE_LEN};
use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};

/// Largest region the target maps: a header declaring more gets a memfd
/// of only the bytes given, which the client must refuse as too short.
const MAX_REGION: u64 = 1 << 20;

// What a client checks of the bytes a storage server sends when it hands
// its memory over (crates/shm/src/handover.rs), then maps: the input is
// the challenge (48 bytes), the message (the region's 128-byte header and
// the 8-byte slot grant), and the bytes of the memfd after its header.
// The memfd holds the message's header, then those bytes, zero-extended to
// the length the header declares (as a fresh region is) up to MAX_REGION.
// A header the client accepts maps, and its first blocks read, without a
// panic or a fault, whatever the shared words hold.
fuzz_target!(|data: &[u8]| {
    let Some((challenge, rest)) = data.split_first_chunk::<CHALLENGE_LEN>() else {
        return;
    };
    let _ = Challenge::decode(challenge);
    let Some((message, region_bytes)) = rest.split_first_chunk::<MESSAGE_LEN>() else {
        return;
    };
    let _ = Layout::check_version(message);
    let Ok((header, slot)) = decode_message(message) else {
        return;
    };
    let declared = Layout::decode(&header).map_or(0, |l| l.total_len);
    let fd = memfd();
    let mut file = std::fs::File::from(fd.try_clone().expect("dup"));
    file.write_all(&header).expect("write the memfd");
    file.write_all(region_bytes).expect("write the memfd");
    if declared <= MAX_REGION && declared > (HEADER_LEN + region_bytes.len()) as u64 {
        file.set_len(declared).expect("extend the memfd");
    }
    let Ok(region) = ClientRegion::open(fd, &header, slot) else {
        return;
    };
    let mut buf = [0u8; 64];
    for block in 0..region.num_blocks().min(4) {
        let gen = region.generation(block).expect("a block of the region");
        let _ = region.is_settling(block);
        let _ = region.writers_in_flight(block);
        let len = buf.len().min(region.block_size() as usize);
        let _ = region.read(block, gen, 0, &mut buf[..len]);
    }
    let _ = region.prefault(0);
});

fn memfd() -> OwnedFd {
    // SAFETY: a plain system call with a NUL-terminated name; the result
    // is checked before it is owned.
    let fd = unsafe { libc::memfd_create(c"fuzz-region".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh descriptor that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}
