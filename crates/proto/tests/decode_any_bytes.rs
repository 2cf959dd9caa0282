//! Every decoder accepts arbitrary bytes without panicking (the stable-Rust
//! companion of the cargo-fuzz targets in /fuzz, run in CI).

use nodekernel_proto::meta::{MetaReply, MetaRequest};
use nodekernel_proto::store::{decode_write_prefix, StoreRequest, WRITE_PREFIX_LEN};
use nodekernel_proto::{FrameHeader, HEADER_LEN};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn decoders_never_panic(op in 0u16..24, bytes in prop_oneof![proptest::collection::vec(any::<u8>(), 0..512), proptest::collection::vec(any::<u8>(), WRITE_PREFIX_LEN)]) {
        let _ = MetaRequest::decode(op, &bytes);
        let _ = MetaReply::decode(op, &bytes);
        let _ = StoreRequest::decode(op, &bytes);
        // The prefix a storage server decodes before a write's data arrives
        // agrees with the whole request wherever both decode.
        if let Ok(p) = decode_write_prefix(&bytes) {
            prop_assert_eq!(bytes.len(), WRITE_PREFIX_LEN);
            let whole = StoreRequest::decode(nodekernel_proto::store::op::WRITE, &bytes);
            let Ok(StoreRequest::Write { block, gen, offset, cap, .. }) = whole else {
                return Err(TestCaseError::fail("the whole write does not decode"));
            };
            prop_assert_eq!(p, (block, gen, offset, cap));
        }
        if bytes.len() >= HEADER_LEN {
            let h: [u8; HEADER_LEN] = bytes[..HEADER_LEN].try_into().unwrap();
            if let Ok(f) = FrameHeader::parse(&h) {
                prop_assert!(f.payload_len <= nodekernel_proto::MAX_PAYLOAD_LEN);
            }
        }
    }

    #[test]
    fn decoded_requests_re_encode_to_the_same_bytes(op in 1u16..21, bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(req) = MetaRequest::decode(op, &bytes) {
            let mut out = bytes::BytesMut::new();
            req.encode(&mut out);
            prop_assert_eq!(&out[..], &bytes[..]);
        }
    }
}
