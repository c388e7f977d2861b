//! Ed25519 signatures over what the cache stores (provenance, not only
//! integrity).
//!
//! The primitive is Ed25519 (RFC 8032, `ed25519-dalek`); verification is
//! strict (`verify_strict`: canonical `S`, no small-order `R` or key) and a
//! weak (small-order) public key is refused outright.
//!
//! A payload is never signed itself: the signed message is
//!
//! ```text
//! b"fxpiece-sig-v1\0" || kind || b"\0" || digest
//! ```
//!
//! where `kind` is what the payload is (`artifact`, `kernel-bundle`,
//! `aot-entry`, `index-entry`, ...: 1 to 64 bytes of `[a-z0-9._-]`, starting
//! with a letter or digit, so no NUL and the message parses one way only)
//! and `digest` the 32 raw bytes of the payload's fxpiece checksum (the
//! BLAKE3 of the payload as a bytes factor of [`crate::hash::hash_factors`]):
//!
//! ```text
//! digest = BLAKE3(b"fxpiece.hash_factors.v1\0" || b"B" || le64(len) || payload)
//! ```
//!
//! That is exactly the `blake3=<hex>` an artifact header and an index handle
//! already record (and `hash_factors(payload)` on the Python side), so a
//! reader that has checked an artifact's checksum verifies its signature
//! without reading the payload again ([`verify_digest`]), and a signature
//! over a payload of any size costs one streamed hash and no copy. The kind
//! keeps a signature over one sort of object from being replayed as another
//! with the same bytes.

use std::io;
use std::path::Path;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use zeroize::Zeroize;

use crate::error::{Error, Result};

/// Prefix of every signed message (domain separation, format version 1).
pub const DOMAIN: &[u8] = b"fxpiece-sig-v1\0";
/// Bytes in a secret seed, a public key, a payload digest, a signature.
pub const SEED_LEN: usize = 32;
pub const PUBLIC_KEY_LEN: usize = 32;
pub const DIGEST_LEN: usize = 32;
pub const SIGNATURE_LEN: usize = 64;
/// Longest `kind`.
pub const MAX_KIND_LEN: usize = 64;

/// Checks that `kind` is 1-64 bytes of `[a-z0-9._-]` starting with a
/// letter or digit.
pub fn check_kind(kind: &str) -> Result<()> {
    let b = kind.as_bytes();
    let ok_char = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-');
    let ok = !b.is_empty()
        && b.len() <= MAX_KIND_LEN
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(ok_char);
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "a signature kind is 1-{MAX_KIND_LEN} characters of [a-z0-9._-] starting with a letter or digit, not {kind:?}"
        )))
    }
}

/// The digest a payload is signed by: the raw 32 bytes of its fxpiece
/// checksum (`hash_factors(payload)`, an artifact header's `blake3=`),
/// computed by [`crate::hash::checksum_raw`] (streamed, no copy).
pub fn payload_digest(payload: &[u8]) -> [u8; DIGEST_LEN] {
    crate::hash::checksum_raw(payload)
}

/// The exact bytes signed for a payload of `kind` whose digest is `digest`.
pub fn signed_message(kind: &str, digest: &[u8]) -> Result<Vec<u8>> {
    check_kind(kind)?;
    let digest = fixed::<DIGEST_LEN>(digest, "a payload digest")?;
    let mut m = Vec::with_capacity(DOMAIN.len() + kind.len() + 1 + DIGEST_LEN);
    m.extend_from_slice(DOMAIN);
    m.extend_from_slice(kind.as_bytes());
    m.push(0);
    m.extend_from_slice(&digest);
    Ok(m)
}

fn fixed<const N: usize>(b: &[u8], what: &str) -> Result<[u8; N]> {
    b.try_into()
        .map_err(|_| Error::invalid(format!("{what} is {N} bytes, not {}", b.len())))
}

/// A secret signing key (zeroed when dropped).
pub struct SecretKey(SigningKey);

impl SecretKey {
    /// A new key from the operating system's random source.
    pub fn generate() -> Result<Self> {
        let mut seed = [0u8; SEED_LEN];
        getrandom::fill(&mut seed).map_err(|e| {
            let source = match e.raw_os_error() {
                Some(errno) => io::Error::from_raw_os_error(errno),
                None => io::Error::other(e.to_string()),
            };
            Error::io(
                "read random bytes for a new signing key from",
                Path::new("getrandom(2)"),
                source,
            )
        })?;
        let key = SecretKey(SigningKey::from_bytes(&seed));
        seed.zeroize();
        Ok(key)
    }

    /// The key whose 32-byte seed (RFC 8032's "secret key") is `seed`.
    pub fn from_seed(seed: &[u8]) -> Result<Self> {
        let mut s = fixed::<SEED_LEN>(seed, "an Ed25519 secret key seed")?;
        let key = SecretKey(SigningKey::from_bytes(&s));
        s.zeroize();
        Ok(key)
    }

    /// The seed (to store the key).
    pub fn seed(&self) -> [u8; SEED_LEN] {
        self.0.to_bytes()
    }

    pub fn public_key(&self) -> [u8; PUBLIC_KEY_LEN] {
        self.0.verifying_key().to_bytes()
    }

    /// Plain Ed25519 over `message` (the primitive; fxpiece signs only
    /// [`signed_message`]s).
    pub fn sign_raw(&self, message: &[u8]) -> [u8; SIGNATURE_LEN] {
        self.0.sign(message).to_bytes()
    }

    /// Signature over the payload of `kind` whose digest is `digest`.
    pub fn sign_digest(&self, kind: &str, digest: &[u8]) -> Result<[u8; SIGNATURE_LEN]> {
        Ok(self.sign_raw(&signed_message(kind, digest)?))
    }

    /// Signature over `payload` of `kind` (hashed here, see the module doc).
    pub fn sign(&self, kind: &str, payload: &[u8]) -> Result<[u8; SIGNATURE_LEN]> {
        check_kind(kind)?;
        self.sign_digest(kind, &payload_digest(payload))
    }
}

/// A public key as signatures are checked against it: 32 bytes, a valid
/// curve point, not of small order.
pub fn parse_public_key(public_key: &[u8]) -> Result<VerifyingKey> {
    let b = fixed::<PUBLIC_KEY_LEN>(public_key, "an Ed25519 public key")?;
    let vk = VerifyingKey::from_bytes(&b)
        .map_err(|_| Error::invalid("not an Ed25519 public key (no curve point)"))?;
    if vk.is_weak() {
        return Err(Error::invalid("a weak (small-order) Ed25519 public key"));
    }
    Ok(vk)
}

/// Whether `signature` is `public_key`'s strict Ed25519 signature of
/// `message`. A malformed key (length, point, small order) or signature
/// length is an error; a well-formed signature that does not verify is
/// `Ok(false)`.
pub fn verify_raw(public_key: &[u8], message: &[u8], signature: &[u8]) -> Result<bool> {
    let vk = parse_public_key(public_key)?;
    let sig = Signature::from_bytes(&fixed::<SIGNATURE_LEN>(signature, "an Ed25519 signature")?);
    Ok(vk.verify_strict(message, &sig).is_ok())
}

/// [`verify_raw`] of the [`signed_message`] for `kind` and `digest`.
pub fn verify_digest(public_key: &[u8], kind: &str, digest: &[u8], signature: &[u8]) -> Result<bool> {
    verify_raw(public_key, &signed_message(kind, digest)?, signature)
}

/// [`verify_digest`] of `payload`'s digest.
pub fn verify(public_key: &[u8], kind: &str, payload: &[u8], signature: &[u8]) -> Result<bool> {
    check_kind(kind)?;
    verify_digest(public_key, kind, &payload_digest(payload), signature)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash;

    fn unhex(s: &str) -> Vec<u8> {
        assert_eq!(s.len() % 2, 0);
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// RFC 8032 section 7.1, TEST 1, 2 and 3: (secret key, public key,
    /// message, signature).
    const RFC8032: [(&str, &str, &str, &str); 3] = [
        (
            "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
            "",
            "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
        ),
        (
            "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
            "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
            "72",
            "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
        ),
        (
            "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
            "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
            "af82",
            "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a",
        ),
    ];

    #[test]
    fn rfc8032_known_answers() {
        for (sk, pk, msg, sig) in RFC8032 {
            let key = SecretKey::from_seed(&unhex(sk)).unwrap();
            assert_eq!(key.public_key().to_vec(), unhex(pk));
            assert_eq!(key.seed().to_vec(), unhex(sk));
            let got = key.sign_raw(&unhex(msg));
            assert_eq!(got.to_vec(), unhex(sig), "signature of {msg:?}");
            assert!(verify_raw(&unhex(pk), &unhex(msg), &unhex(sig)).unwrap());
        }
    }

    #[test]
    fn rfc8032_vectors_refuse_any_flipped_bit() {
        for (_, pk, msg, sig) in RFC8032 {
            let (pk, msg, sig) = (unhex(pk), unhex(msg), unhex(sig));
            for i in 0..sig.len() * 8 {
                let mut bad = sig.clone();
                bad[i / 8] ^= 1 << (i % 8);
                assert!(!verify_raw(&pk, &msg, &bad).unwrap(), "signature bit {i}");
            }
            let mut longer = msg.clone();
            longer.push(0);
            assert!(!verify_raw(&pk, &longer, &sig).unwrap());
            if !msg.is_empty() {
                let mut other = msg.clone();
                other[0] ^= 1;
                assert!(!verify_raw(&pk, &other, &sig).unwrap());
            }
            // Another (valid) key: the first byte of the public key flipped
            // may not be a point; either way the signature must not pass.
            let mut other_pk = pk.clone();
            other_pk[0] ^= 1;
            assert!(!verify_raw(&other_pk, &msg, &sig).unwrap_or(false));
        }
    }

    #[test]
    fn signed_message_is_the_documented_bytes() {
        for n in [0usize, 5, (128 << 10) + 3] {
            let b: Vec<u8> = (0..n).map(|i| (i * 7 % 253) as u8).collect();
            assert_eq!(
                hash::to_hex(&payload_digest(&b)),
                hash::hash_factors(&hash::Factor::Bytes(b.clone())),
                "the digest is the artifact checksum (n={n})"
            );
        }
        let d = payload_digest(b"hello");
        let m = signed_message("artifact", &d).unwrap();
        let mut want = b"fxpiece-sig-v1\0artifact\0".to_vec();
        want.extend_from_slice(&d);
        assert_eq!(m, want);
    }

    #[test]
    fn round_trip_and_tampering() {
        let key = SecretKey::generate().unwrap();
        let pk = key.public_key();
        let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let sig = key.sign("artifact", &payload).unwrap();
        assert!(verify(&pk, "artifact", &payload, &sig).unwrap());
        assert_eq!(
            sig,
            key.sign_digest("artifact", &payload_digest(&payload)).unwrap()
        );
        assert!(verify_digest(&pk, "artifact", &payload_digest(&payload), &sig).unwrap());

        // Payload: a flipped bit anywhere, one byte more or less.
        for at in [0, 1, 150_000, payload.len() - 1] {
            let mut bad = payload.clone();
            bad[at] ^= 0x80;
            assert!(!verify(&pk, "artifact", &bad, &sig).unwrap(), "byte {at}");
        }
        assert!(!verify(&pk, "artifact", &payload[1..], &sig).unwrap());
        let mut longer = payload.clone();
        longer.push(0);
        assert!(!verify(&pk, "artifact", &longer, &sig).unwrap());
        // Kind: the same bytes as another sort of object.
        assert!(!verify(&pk, "kernel-bundle", &payload, &sig).unwrap());
        assert!(!verify(&pk, "artifact.", &payload, &sig).unwrap());
        // Signature.
        let mut bad = sig;
        bad[10] ^= 1;
        assert!(!verify(&pk, "artifact", &payload, &bad).unwrap());
        // Signer.
        let other = SecretKey::generate().unwrap();
        assert_ne!(other.public_key(), pk);
        assert!(!verify(&other.public_key(), "artifact", &payload, &sig).unwrap());
    }

    #[test]
    fn fresh_keys_differ_and_seed_round_trips() {
        let a = SecretKey::generate().unwrap();
        let b = SecretKey::generate().unwrap();
        assert_ne!(a.seed(), b.seed());
        let again = SecretKey::from_seed(&a.seed()).unwrap();
        assert_eq!(again.public_key(), a.public_key());
        assert_eq!(again.sign("x", b"p").unwrap(), a.sign("x", b"p").unwrap());
    }

    #[test]
    fn malformed_inputs_are_errors() {
        let key = SecretKey::generate().unwrap();
        let pk = key.public_key();
        let sig = key.sign("artifact", b"p").unwrap();
        for kind in ["", "Artifact", "-x", "a b", "a\0b", "é", &"a".repeat(65)] {
            assert!(key.sign(kind, b"p").is_err(), "{kind:?}");
            assert!(verify(&pk, kind, b"p", &sig).is_err(), "{kind:?}");
        }
        assert!(key.sign(&"a".repeat(64), b"p").is_ok());
        assert!(SecretKey::from_seed(&[0u8; 31]).is_err());
        assert!(verify(&pk[..31], "artifact", b"p", &sig).is_err());
        assert!(verify(&pk, "artifact", b"p", &sig[..63]).is_err());
        assert!(key.sign_digest("artifact", &[0u8; 33]).is_err());
        // Small-order points (the identity, and order 2) are refused as keys.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert!(parse_public_key(&identity).is_err());
        let mut order2 = [0u8; 32];
        order2[0] = 0xec;
        order2[1..31].fill(0xff);
        order2[31] = 0x7f;
        assert!(parse_public_key(&order2).is_err());
        // A non-canonical S (S + L) does not verify (strict verification).
        let l: [u8; 32] = [
            0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde, 0x14,
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
        ];
        let mut s_plus_l = sig;
        let mut carry = 0u16;
        for i in 0..32 {
            let v = u16::from(s_plus_l[32 + i]) + u16::from(l[i]) + carry;
            s_plus_l[32 + i] = v as u8;
            carry = v >> 8;
        }
        assert!(!verify(&pk, "artifact", b"p", &s_plus_l).unwrap());
    }
}
