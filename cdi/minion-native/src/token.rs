//! Resume tokens: how a container proves it is the one that registered before a restart when
//! the minion cannot see its process (pid 0: another pid namespace).
//!
//! `register` with a state folder hands the container a random secret once, in its reply; the
//! journal keeps only its SHA-256. A container that registers again after a restart presents
//! the secret (`resume`). Neither the secret nor its hash is ever logged or put in an error.

/// A new secret: 32 bytes from the kernel's generator, as 64 hex digits; None if the kernel
/// gives none (the container then gets no token and comes back by its process alone).
pub fn new_token() -> Option<String> {
    let mut bytes = [0u8; 32];
    let mut filled = 0;
    while filled < bytes.len() {
        let rest = &mut bytes[filled..];
        // SAFETY: rest is valid for its length.
        let got = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if got <= 0 {
            if got < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return None;
        }
        filled += got as usize;
    }
    Some(hex(&bytes))
}

/// A token on its way to its container: printed as `<secret>`, whatever prints it.
#[derive(Default)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<secret>")
    }
}

/// Whether `text` has a token's shape (what `new_token` makes).
pub fn well_formed(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// What the journal keeps of a secret.
pub fn digest(token: &str) -> String {
    hex(&sha256(token.as_bytes()))
}

/// Whether `token` is the secret whose digest is `digest` (never true for an empty digest);
/// the digests are compared in constant time.
pub fn matches(token: &str, digest_hex: &str) -> bool {
    if digest_hex.is_empty() {
        return false;
    }
    let ours = digest(token);
    if ours.len() != digest_hex.len() {
        return false;
    }
    let diff = ours
        .bytes()
        .zip(digest_hex.bytes())
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    diff == 0
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

fn sha256(data: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(data).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_matches_the_standard_vectors() {
        assert_eq!(
            hex(&sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex(&sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex(&sha256(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
    }

    #[test]
    fn a_token_matches_its_digest_only() {
        let token = new_token().unwrap();
        assert!(well_formed(&token) && !well_formed("loose") && !well_formed(&token[1..]));
        assert_ne!(token, new_token().unwrap());
        let kept = digest(&token);
        assert!(!kept.contains(&token));
        assert!(matches(&token, &kept));
        assert!(!matches(&new_token().unwrap(), &kept));
        assert!(!matches(&token, ""));
        assert!(!matches("", &kept));
    }
}
