//! One contract for every storage backend a run location can be on: local
//! files (a path and a `file://` URL), `memory://` and S3 (the moto server
//! of `.ci/s3-server`; without it the S3 case fails unless
//! `MOE_CENSUS_SKIP_S3=1`). Each backend must round-trip bytes, refuse a
//! create-only overwrite, write an object from pieces, move an object
//! create-only whole or not at all, refuse an object over a reader's limit
//! before reading it, read into a kept buffer without a new one, read a
//! byte range (replay reads trace parts in a bucket this way), say whether
//! it is remote, report a missing object by its URL, list names sorted
//! and below their prefix only, and treat a child location as the same
//! store.

use bytes::Bytes;
use runfiles::store::{RunStore, StoreError};

/// The contract, on an empty run location.
async fn contract(s: RunStore) {
    let url = s.url().to_string();
    // Round trip and replace.
    s.put("a/b.json", b"1".to_vec()).await.unwrap();
    assert_eq!(s.get("a/b.json").await.unwrap(), Bytes::from_static(b"1"));
    s.put("a/b.json", b"11".to_vec()).await.unwrap();
    assert_eq!(s.get("a/b.json").await.unwrap(), Bytes::from_static(b"11"));
    // Create-only writes never replace.
    s.put_new("a/c.json", b"2".to_vec()).await.unwrap();
    let refused = s.put_new("a/c.json", b"3".to_vec()).await;
    assert!(
        matches!(&refused, Err(StoreError::AlreadyExists { url: u }) if *u == format!("{url}/a/c.json")),
        "{url}: {refused:?}"
    );
    assert_eq!(s.get("a/c.json").await.unwrap(), Bytes::from_static(b"2"));
    // An object written in pieces is their concatenation.
    let parts = ["ab", "", "c"].map(|p| Bytes::from_static(p.as_bytes()));
    s.put_parts("parts.bin", parts.to_vec()).await.unwrap();
    assert_eq!(
        s.get("parts.bin").await.unwrap(),
        Bytes::from_static(b"abc")
    );
    // A create-only move either happens whole or leaves both objects be.
    s.put("staged.bin", b"4".to_vec()).await.unwrap();
    assert!(matches!(
        s.rename_new("staged.bin", "a/c.json").await,
        Ok(false) | Err(StoreError::AlreadyExists { .. })
    ));
    assert_eq!(s.get("a/c.json").await.unwrap(), Bytes::from_static(b"2"));
    assert_eq!(s.get("staged.bin").await.unwrap(), Bytes::from_static(b"4"));
    if s.rename_new("staged.bin", "moved.bin").await.unwrap() {
        assert!(!s.exists("staged.bin").await.unwrap());
    } else {
        assert!(!s.exists("moved.bin").await.unwrap());
        s.put_new("moved.bin", b"4".to_vec()).await.unwrap();
        s.delete("staged.bin").await.unwrap();
    }
    assert_eq!(s.get("moved.bin").await.unwrap(), Bytes::from_static(b"4"));
    assert!(!s.rename_new("gone.bin", "a/f.json").await.unwrap());
    // Limits are checked before the body is read.
    assert_eq!(
        s.get_limited("a/b.json", 2).await.unwrap(),
        Bytes::from_static(b"11")
    );
    let big = s.get_limited("a/b.json", 1).await.unwrap_err().to_string();
    assert_eq!(
        big,
        format!("{url}/a/b.json is 2 bytes, more than the 1 bytes accepted for it")
    );
    assert!(s.get_opt_limited("none", 1).await.unwrap().is_none());
    // A read into a kept buffer replaces its contents and keeps its memory.
    let body: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    s.put("big.bin", body.clone()).await.unwrap();
    let mut kept = Vec::with_capacity(200_000);
    kept.extend_from_slice(b"left over");
    let at = kept.as_ptr();
    let read = s.get_limited_into("big.bin", 100_000, kept).await.unwrap();
    assert_eq!((read.as_ptr(), read.capacity()), (at, 200_000), "{url}");
    assert!(read == body, "{url}: bytes read into a kept buffer differ");
    let refused = s.get_limited_into("big.bin", 99_999, read).await;
    assert!(
        matches!(&refused, Err(StoreError::TooLarge { size: 100_000, .. })),
        "{url}: {refused:?}"
    );
    // A byte range is those bytes; a range of a missing object names it.
    assert!(s.get_range("big.bin", 99_990..100_000).await.unwrap() == body[99_990..]);
    assert!(s.get_range("big.bin", 7..8).await.unwrap() == body[7..8]);
    assert!(matches!(
        s.get_range("missing", 0..1).await,
        Err(StoreError::NotFound { url: u }) if u == format!("{url}/missing")
    ));
    assert_eq!(s.is_remote(), url.starts_with("s3:"), "{url}");
    // A missing object is named by its URL.
    assert_eq!(
        s.get("missing").await.unwrap_err().to_string(),
        format!("{url}/missing does not exist")
    );
    assert!(s.get_opt("missing").await.unwrap().is_none());
    assert!(s.exists("a/c.json").await.unwrap() && !s.exists("a/d.json").await.unwrap());
    // Listing: sorted, relative to the run, below the prefix only.
    s.put("a/z/deep.bin", vec![0u8; 3]).await.unwrap();
    s.put("ab/other.json", b"x".to_vec()).await.unwrap();
    assert_eq!(
        s.list("a").await.unwrap(),
        vec!["a/b.json", "a/c.json", "a/z/deep.bin"]
    );
    assert!(s.list("nothing").await.unwrap().is_empty());
    // A child is the same store under a prefix.
    let child = s.child("a");
    assert_eq!(child.url(), format!("{url}/a"));
    assert_eq!(child.get("c.json").await.unwrap(), Bytes::from_static(b"2"));
    child.put("e.json", b"5".to_vec()).await.unwrap();
    assert_eq!(s.get("a/e.json").await.unwrap(), Bytes::from_static(b"5"));
    assert_eq!(child.list("z").await.unwrap(), vec!["z/deep.bin"]);
    // Deleting is idempotent.
    s.delete("a/b.json").await.unwrap();
    s.delete("a/b.json").await.unwrap();
    assert!(!s.exists("a/b.json").await.unwrap());
    assert_eq!(
        s.list("a").await.unwrap(),
        vec!["a/c.json", "a/e.json", "a/z/deep.bin"]
    );
}

#[tokio::test]
async fn a_local_directory_keeps_the_contract() {
    let d = tempfile::tempdir().unwrap();
    contract(RunStore::open(d.path().join("run").to_str().unwrap()).unwrap()).await;
    let url = format!("file://{}", d.path().join("by-url").display());
    contract(RunStore::open(&url).unwrap()).await;
}

#[tokio::test]
async fn memory_keeps_the_contract() {
    contract(RunStore::open("memory:///contract").unwrap()).await;
}

#[tokio::test]
async fn s3_keeps_the_contract() {
    let Some(bucket) = fixtures::s3_bucket() else {
        return;
    };
    let run = gguf::hash::sha256_hex(&protocol::wire::random_bytes(8));
    contract(RunStore::open(&format!("s3://{bucket}/contract-{run}")).unwrap()).await;
}
