//! Key files: what `intact keygen` writes (0600, O_EXCL, never through a
//! planted symlink), generated keys and passphrases, and keyrings with
//! their rules.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use intact_proto::{write_new_key_file, Key, Keyring, ProtoError};

fn private(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap();
}

fn reason(e: ProtoError) -> String {
    e.to_string()
}

#[test]
fn keygen_writes_a_private_new_file_and_never_overwrites_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k");
    let key = write_new_key_file(&path, false).unwrap();
    let meta = fs::metadata(&path).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o600);
    let text = fs::read_to_string(&path).unwrap();
    let line = text.strip_suffix('\n').unwrap();
    let hex = line.strip_prefix("intact-key-v1 ").unwrap();
    assert_eq!(hex.len(), 64);
    assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(Key::from_file(&path).unwrap(), key);

    // Exists: refused, and the file is the same.
    let e = reason(write_new_key_file(&path, false).unwrap_err());
    assert!(e.contains("already exists"), "{e}");
    assert_eq!(fs::read_to_string(&path).unwrap(), text);

    // --force: a different key, still 0600 even over a file that was not.
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    let again = write_new_key_file(&path, true).unwrap();
    assert_ne!(again, key);
    assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
    assert_eq!(Key::from_file(&path).unwrap(), again);
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        1,
        "a temporary file was left"
    );

    // Two runs never give the same key.
    let other = dir.path().join("k2");
    assert_ne!(write_new_key_file(&other, false).unwrap(), again);
}

#[test]
fn keygen_does_not_follow_a_symlink_planted_at_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("elsewhere");
    let path = dir.path().join("k");
    std::os::unix::fs::symlink(&target, &path).unwrap();
    assert!(write_new_key_file(&path, false).is_err());
    assert!(!target.exists(), "keygen wrote through the symlink");
    // An existing target is not touched either.
    fs::write(&target, b"precious").unwrap();
    assert!(write_new_key_file(&path, false).is_err());
    assert_eq!(fs::read(&target).unwrap(), b"precious");
}

#[test]
fn passphrases_are_stretched_the_same_way_on_both_ends_and_short_ones_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("c"),
    );
    private(&a, "  correct horse battery staple\n");
    private(&b, "correct horse battery staple");
    private(&c, "correct horse battery stapler");
    let ka = Key::from_file(&a).unwrap();
    assert_eq!(
        ka,
        Key::from_file(&b).unwrap(),
        "whitespace around it counts"
    );
    assert_ne!(ka, Key::from_file(&c).unwrap());
    assert_eq!(
        ka,
        Key::from_passphrase(b"correct horse battery staple").unwrap()
    );
    // Pinned: Argon2id, 19 MiB, 2 passes, 1 lane, the fixed salt. The
    // value was computed independently with the reference C implementation
    // (argon2-cffi: hash_secret_raw(secret, b"intact 2026 passphrase-to-key
    // v1", time_cost=2, memory_cost=19456, parallelism=1, hash_len=32,
    // type=ID, version=19)). A change of any parameter would make old and
    // new builds disagree on every passphrase, so it must show up here.
    assert_eq!(
        Key::from_passphrase(b"correct horse battery staple")
            .unwrap()
            .to_line()
            .as_str(),
        PINNED
    );
    private(&a, "fifteen bytes!!");
    let e = reason(Key::from_file(&a).unwrap_err());
    assert!(e.contains("at least 16 bytes"), "{e}");
    // Not private: refused whatever it holds.
    private(&a, "a secret of sufficient length");
    fs::set_permissions(&a, fs::Permissions::from_mode(0o640)).unwrap();
    assert!(reason(Key::from_file(&a).unwrap_err()).contains("chmod 600"));
}

const PINNED: &str =
    "intact-key-v1 fc02aed3c0a345b95db2b71827227f091a8463a85f01c91d29aa41d23a1dfef1";

#[test]
fn a_malformed_generated_key_is_refused_not_taken_for_a_passphrase() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("k");
    for bad in [
        "intact-key-v1 00112233",
        "intact-key-v1 zz112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
        "intact-key-v1",
    ] {
        private(&p, bad);
        let e = reason(Key::from_file(&p).unwrap_err());
        assert!(e.contains("64 hex digits"), "{bad}: {e}");
    }
    let hex = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";
    private(&p, &format!("intact-key-v1 {hex}\n"));
    assert_eq!(
        Key::from_file(&p).unwrap().to_line().as_str(),
        format!("intact-key-v1 {}", hex.to_lowercase())
    );
}

fn ring(text: &str) -> Result<Keyring, String> {
    Keyring::parse(text.as_bytes(), "ring").map_err(reason)
}

const K1: &str = "intact-key-v1 1111111111111111111111111111111111111111111111111111111111111111";
const K2: &str = "intact-key-v1 2222222222222222222222222222222222222222222222222222222222222222";

#[test]
fn keyrings_name_clients_with_their_own_keys_and_disjoint_subtrees() {
    let r = ring(&format!(
        "# comment\n\nintact-client-v1 alice groups/alice {K1}\n\
         intact-client-v1 bob groups/bob a passphrase with spaces in it\n"
    ))
    .unwrap();
    let c = r.clients();
    assert_eq!(c.len(), 2);
    assert_eq!(
        (
            c[0].name.as_str(),
            c[0].subtree.as_ref().unwrap().to_string().as_str()
        ),
        ("alice", "groups/alice")
    );
    assert_eq!(
        c[1].key,
        Key::from_passphrase(b"a passphrase with spaces in it").unwrap()
    );
    // Shared subtree on purpose: allowed.
    ring(&format!(
        "intact-client-v1 a d {K1}\nintact-client-v1 b d {K2}\n"
    ))
    .unwrap();
    // The whole root, alone.
    assert!(ring(&format!("intact-client-v1 admin / {K1}\n"))
        .unwrap()
        .clients()[0]
        .subtree
        .is_none());

    for (text, why) in [
        (
            format!("intact-client-v1 a x {K1}\nintact-client-v1 b x/y {K2}\n"),
            "contain one another",
        ),
        (
            format!("intact-client-v1 a x/y {K1}\nintact-client-v1 b x {K2}\n"),
            "contain one another",
        ),
        (
            format!("intact-client-v1 a / {K1}\nintact-client-v1 b x {K2}\n"),
            "contain one another",
        ),
        (
            format!("intact-client-v1 a x {K1}\nintact-client-v1 b y {K1}\n"),
            "same key",
        ),
        (
            format!("intact-client-v1 a x {K1}\nintact-client-v1 a y {K2}\n"),
            "used twice",
        ),
        (format!("intact-client-v1 a ../up {K1}\n"), "SUBTREE"),
        (format!("intact-client-v1 a /abs {K1}\n"), "SUBTREE"),
        (format!("intact-client-v1 a .intact/x {K1}\n"), ".intact"),
        (format!("intact-client-v1 a/b x {K1}\n"), "NAME"),
        ("intact-client-v1 a x\n".to_string(), "no SECRET"),
        (
            "intact-client-v1 a x short\n".to_string(),
            "at least 16 bytes",
        ),
        (
            format!("intact-client-v1 a x {K1}\nsomething else\n"),
            "line 2",
        ),
        ("# nothing\n".to_string(), "names no client"),
    ] {
        let e = ring(&text).unwrap_err();
        assert!(e.contains(why), "{text:?}: {e}");
    }
}

#[test]
fn a_server_key_file_may_be_a_keyring_and_a_client_key_file_may_not() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ring");
    private(&p, &format!("intact-client-v1 alice a {K1}\n"));
    assert_eq!(Keyring::from_file(&p).unwrap().clients().len(), 1);
    let e = reason(Key::from_file(&p).unwrap_err());
    assert!(e.contains("keyring"), "{e}");
    // A single key file is a keyring of one client with the whole root.
    private(&p, K2);
    let r = Keyring::from_file(&p).unwrap();
    assert_eq!(r.clients().len(), 1);
    assert!(r.clients()[0].subtree.is_none());
    assert_eq!(r.clients()[0].key, Key::from_file(&p).unwrap());
}
