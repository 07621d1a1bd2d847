//! The test vectors of `docs/rendezvous-protocol.md`
//! (`docs/rendezvous-protocol-vectors.json`, computed from the document
//! alone), recomputed with the code that speaks the protocol: every frame
//! of the handshake, the rejects, the derived keys, the liveness frames
//! and the rendezvous file must come out byte for byte, and each must be
//! read back by the side that receives it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nccl_sys::ncclUniqueId as UniqueId;
use serde_json::Value;

use crate::culprit::{Call, Divergence, Field};
use crate::frame::{Kind, PROTOCOL_VERSION, RendezvousError, encode_frame};
use crate::handshake::auth::{
    challenge, claims, hello, id_key, open_id, open_reject, proof, read_hello, reject,
    reject_reason, seal_id,
};
use crate::liveness::{LossCause, PeerLoss};
use crate::rendezvous::file::{decode_file, seal};
use crate::secret::Secret;
use crate::wire::{Dir, Msg, Opener, Sealer, session_key};

const VECTORS: &str = include_str!("../../../../docs/rendezvous-protocol-vectors.json");

fn vectors() -> Value {
    serde_json::from_str(VECTORS).expect("the vectors file is JSON")
}

fn hex(v: &Value) -> Vec<u8> {
    let text = v.as_str().expect("a hex string");
    assert!(text.len().is_multiple_of(2), "{text}");
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

fn array<const N: usize>(v: &Value) -> [u8; N] {
    hex(v).try_into().expect("the documented length")
}

fn num(v: &Value) -> usize {
    v.as_u64().expect("a number") as usize
}

/// The inputs every vector shares.
struct Inputs {
    secret: Secret,
    rank: usize,
    world: usize,
    nonce_c: [u8; 32],
    nonce_s: [u8; 32],
    id: UniqueId,
}

fn inputs(v: &Value) -> Inputs {
    let i = &v["inputs"];
    let secret = hex(&i["secret"]);
    assert_eq!(secret, i["secret_text"].as_str().unwrap().as_bytes());
    Inputs {
        secret: Secret::from_bytes(secret, "the test vectors").unwrap(),
        rank: num(&i["rank"]),
        world: num(&i["world"]),
        nonce_c: array(&i["nonce_c"]),
        nonce_s: array(&i["nonce_s"]),
        id: UniqueId::from_bytes(hex(&i["unique_id"]).try_into().unwrap()),
    }
}

#[test]
fn the_handshake_vectors_are_what_the_code_sends_and_reads() {
    let v = vectors();
    assert_eq!(num(&v["protocol_version"]), usize::from(PROTOCOL_VERSION));
    let x = inputs(&v);
    let (s, nc, ns) = (&x.secret, &x.nonce_c, &x.nonce_s);
    let claims = claims(x.rank, x.world);
    assert_eq!(claims.to_vec(), hex(&v["derived"]["claims"]));
    let key = id_key(s, ns, nc, &claims).unwrap();
    assert_eq!(key.to_vec(), hex(&v["derived"]["id_key"]));

    let h = &v["handshake"];
    let hello_payload = hello(&claims, nc);
    assert_eq!(
        encode_frame(Kind::Hello as u8, &hello_payload),
        hex(&h["hello"])
    );
    let (rank, world, got_claims, got_nonce) = read_hello(&hello_payload).unwrap();
    assert_eq!((rank, world), (x.rank, x.world));
    assert_eq!((got_claims, got_nonce), (&claims[..], &nc[..]));
    assert_eq!(
        encode_frame(
            Kind::Challenge as u8,
            &challenge(s, nc, ns, &claims).unwrap()
        ),
        hex(&h["challenge"])
    );
    assert_eq!(
        encode_frame(Kind::Proof as u8, &proof(s, ns, nc, &claims).unwrap()),
        hex(&h["proof"])
    );
    let sealed = seal_id(s, ns, nc, &claims, &x.id).unwrap();
    assert_eq!(encode_frame(Kind::Id as u8, &sealed), hex(&h["id"]));
    assert_eq!(open_id(s, ns, nc, &claims, &sealed).unwrap(), x.id);
    // Under another secret, or for other claims, the id does not open.
    let other = Secret::from_bytes(b"nccl-rs another secret 00".to_vec(), "t").unwrap();
    assert!(open_id(&other, ns, nc, &claims, &sealed).is_err());
    let other_claims = crate::handshake::auth::claims(2, x.world);
    assert!(open_id(s, ns, nc, &other_claims, &sealed).is_err());
}

#[test]
fn the_reject_vectors_are_what_the_code_sends_and_reads() {
    let v = vectors();
    let x = inputs(&v);
    let (s, nc, ns) = (&x.secret, &x.nonce_c, &x.nonce_s);
    let rejects = v["rejects"].as_array().unwrap();
    assert!(!rejects.is_empty());
    for r in rejects {
        let (code, a, b) = (num(&r["code"]) as u8, num(&r["a"]), num(&r["b"]));
        let why = reject_reason(code, a as u32, b as u32);
        let payload = reject(s, nc, ns, &why).unwrap();
        let frame = encode_frame(Kind::Reject as u8, &payload);
        assert_eq!(frame, hex(&r["frame"]), "{}", r["reason"]);
        match open_reject(s, nc, ns, &payload) {
            RendezvousError::Rejected(got) => {
                assert_eq!(got.to_string(), why.to_string());
                assert!(format!("{got:?}").starts_with(r["reason"].as_str().unwrap()));
            }
            other => panic!("{other:?}"),
        }
        // The joining rank believes no reject whose tag fails.
        let mut forged = payload.clone();
        forged[1] ^= 1;
        assert!(matches!(
            open_reject(s, nc, ns, &forged),
            RendezvousError::Malformed(_)
        ));
    }
}

/// An `ncclAllReduce` of `count` elements of `dtype` with the reduction
/// `reduction`, as the vectors' calls.
fn culprit_call(count: u64, dtype: usize, reduction: usize) -> Call {
    Call {
        op: "ncclAllReduce",
        count: count as usize,
        dtype: nccl_sys::ncclDataType_t(dtype as u32),
        peer: None,
        reduction: Some(nccl_sys::ncclRedOp_t(reduction as u32)),
    }
}

#[test]
fn the_liveness_vectors_are_what_the_code_seals_and_opens() {
    let v = vectors();
    let x = inputs(&v);
    let key = session_key(&x.secret, &x.nonce_s, &x.nonce_c, x.rank, x.world).unwrap();
    assert_eq!(
        key.as_bytes().to_vec(),
        hex(&v["derived"]["liveness_session_key"])
    );
    let mut up = (
        Sealer::new(key.clone(), Dir::Up),
        Opener::new(key.clone(), Dir::Up, x.world),
    );
    let mut down = (
        Sealer::new(key.clone(), Dir::Down),
        Opener::new(key, Dir::Down, x.world),
    );
    for f in v["liveness"].as_array().unwrap() {
        let msg = match f["message"].as_str().unwrap() {
            "Attach" => Msg::Attach {
                listen: Some(f["listen"].as_str().unwrap().parse().unwrap()),
            },
            "Attached" => Msg::Attached,
            "Heartbeat" => Msg::Heartbeat,
            "Goodbye" => Msg::Goodbye,
            "Lost" => {
                assert_eq!(num(&f["cause"]), 0);
                Msg::Lost(PeerLoss {
                    rank: num(&f["rank"]),
                    cause: LossCause::ConnectionClosed,
                    seen_by: num(&f["seen_by"]),
                })
            }
            "Ask" => Msg::Ask {
                key: f["key"].as_str().unwrap().to_string(),
            },
            "Tail" => Msg::Tail {
                key: f["key"].as_str().unwrap().to_string(),
                calls: vec![(
                    f["seq"].as_u64().unwrap(),
                    culprit_call(
                        f["count"].as_u64().unwrap(),
                        num(&f["dtype"]),
                        num(&f["reduction"]),
                    ),
                )],
            },
            "Verdict" => {
                let call = |count: &str| {
                    Some(culprit_call(
                        f[count].as_u64().unwrap(),
                        num(&f["dtype"]),
                        num(&f["reduction"]),
                    ))
                };
                assert_eq!(f["field"], "count");
                Msg::Verdict {
                    key: f["key"].as_str().unwrap().to_string(),
                    divergence: Some(Box::new(Divergence {
                        seq: f["seq"].as_u64().unwrap(),
                        field: Field::Count,
                        culprit: Some(num(&f["culprit"])),
                        majority: Some((call("expected_count"), num(&f["majority"]))),
                        others: vec![(num(&f["culprit"]), call("found_count"))],
                        unlisted: 0,
                    })),
                }
            }
            other => panic!("no vector message {other}"),
        };
        let (sealer, opener) = match f["direction"].as_str().unwrap() {
            "up" => &mut up,
            _ => &mut down,
        };
        let frame = sealer.seal(&msg).unwrap();
        assert_eq!(frame, hex(&f["frame"]), "{msg:?}");
        assert_eq!(
            u64::from_be_bytes(frame[11..19].try_into().unwrap()),
            f["counter"].as_u64().unwrap()
        );
        assert_eq!(opener.open(frame[6], &frame[11..]).unwrap(), msg);
    }
}

#[test]
fn the_file_vector_is_what_rank_0_writes_and_the_others_read() {
    let v = vectors();
    let x = inputs(&v);
    let f = &v["file"];
    let written = f["written_unix_secs"].as_u64().unwrap();
    let bytes = seal(&x.id, &x.secret, written, &array(&f["nonce"]));
    assert_eq!(bytes, hex(&f["bytes"]));
    let now = UNIX_EPOCH + Duration::from_secs(written + 1);
    assert_eq!(decode_file(&bytes, &x.secret, now).unwrap(), x.id);
    assert!(
        decode_file(&bytes, &x.secret, SystemTime::now()).is_err(),
        "stale"
    );
}
