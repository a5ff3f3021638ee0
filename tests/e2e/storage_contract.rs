//! The storage seam's contract, run against the local folder, the in-memory
//! store and S3 on a moto server on loopback.

use std::sync::Arc;

use bytes::Bytes;
use sluice_engine::storage::{
    LocalStore, MemoryStore, PutMode, PutOutcome, S3Config, S3Store, Store,
};

use crate::support::*;

type PutTask = tokio::task::JoinHandle<Result<PutOutcome, sluice_engine::error::StoreError>>;

/// How many racing puts wrote.
async fn wins(puts: impl Iterator<Item = PutTask>) -> usize {
    futures::future::join_all(puts)
        .await
        .into_iter()
        .filter(|r| {
            matches!(
                r.as_ref().unwrap().as_ref().unwrap(),
                PutOutcome::Written(_)
            )
        })
        .count()
}

async fn contract(store: Arc<dyn Store>) {
    let what = store.describe();
    let before = store.counts();
    assert!(
        store.get("a/missing.json").await.unwrap().is_none(),
        "{what}"
    );

    // Create-only.
    let w = store
        .put("a/k.json", Bytes::from("1"), PutMode::Create)
        .await
        .unwrap();
    assert!(matches!(w, PutOutcome::Written(_)), "{what}");
    assert_eq!(
        store
            .put("a/k.json", Bytes::from("2"), PutMode::Create)
            .await
            .unwrap(),
        PutOutcome::Conflict,
        "{what}: a second create must lose"
    );
    let obj = store.get("a/k.json").await.unwrap().unwrap();
    assert_eq!(obj.bytes, Bytes::from("1"), "{what}");

    // Compare-and-swap.
    let PutOutcome::Written(e2) = store
        .put(
            "a/k.json",
            Bytes::from("3"),
            PutMode::Update(obj.etag.clone()),
        )
        .await
        .unwrap()
    else {
        panic!("{what}: update with the current etag must win");
    };
    assert_eq!(
        store
            .put(
                "a/k.json",
                Bytes::from("4"),
                PutMode::Update(obj.etag.clone())
            )
            .await
            .unwrap(),
        PutOutcome::Conflict,
        "{what}: a stale etag must lose"
    );
    assert_eq!(
        store
            .put("a/none.json", Bytes::from("4"), PutMode::Update(e2.clone()))
            .await
            .unwrap(),
        PutOutcome::Conflict,
        "{what}: updating a missing key must lose"
    );
    assert_eq!(
        store.get("a/k.json").await.unwrap().unwrap().bytes,
        Bytes::from("3")
    );

    // Overwrite, odd keys, listing order and start-after.
    for k in [
        "b/2.txt",
        "b/1 space.txt",
        "b/ü/3.txt",
        "b/10.txt",
        "c/x.txt",
    ] {
        store
            .put(k, Bytes::from(k.to_string()), PutMode::Overwrite)
            .await
            .unwrap();
    }
    store
        .put("b/2.txt", Bytes::from("again"), PutMode::Overwrite)
        .await
        .unwrap();
    assert_eq!(
        store.get("b/2.txt").await.unwrap().unwrap().bytes,
        Bytes::from("again")
    );
    let keys: Vec<String> = store
        .list("b/", None)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.key)
        .collect();
    assert_eq!(
        keys,
        ["b/1 space.txt", "b/10.txt", "b/2.txt", "b/ü/3.txt"],
        "{what}"
    );
    let after: Vec<String> = store
        .list("b/", Some("b/10.txt"))
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.key)
        .collect();
    assert_eq!(after, ["b/2.txt", "b/ü/3.txt"], "{what}");
    let sizes: Vec<u64> = store
        .list("c/", None)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.size)
        .collect();
    assert_eq!(sizes, [7], "{what}");

    // Delete, including a missing key.
    store.delete("b/2.txt").await.unwrap();
    store.delete("b/2.txt").await.unwrap();
    assert!(store.get("b/2.txt").await.unwrap().is_none());

    // Racing writers: exactly one create and one swap win.
    let creates = (0..16).map(|i| {
        let s = store.clone();
        tokio::spawn(async move {
            s.put("race/c.json", Bytes::from(format!("{i}")), PutMode::Create)
                .await
        })
    });
    let won = wins(creates).await;
    assert_eq!(won, 1, "{what}: racing creates");
    let base = store.get("race/c.json").await.unwrap().unwrap().etag;
    let swaps = (0..16).map(|i| {
        let s = store.clone();
        let etag = base.clone();
        tokio::spawn(async move {
            s.put(
                "race/c.json",
                Bytes::from(format!("swap {i}")),
                PutMode::Update(etag),
            )
            .await
        })
    });
    let won = wins(swaps).await;
    assert_eq!(won, 1, "{what}: racing compare-and-swaps");

    // Server-side copy: the whole object under the new key, replacing what
    // was there; the source stays; a missing source copies nothing.
    let puts_before = store.counts().put;
    store
        .put(
            "copy/from x+y.bin",
            Bytes::from("staged"),
            PutMode::Overwrite,
        )
        .await
        .unwrap();
    store
        .put("copy/to.bin", Bytes::from("old"), PutMode::Overwrite)
        .await
        .unwrap();
    assert!(
        store
            .copy("copy/from x+y.bin", "copy/to.bin")
            .await
            .unwrap(),
        "{what}"
    );
    let to = store.get("copy/to.bin").await.unwrap().unwrap();
    assert_eq!(to.bytes, Bytes::from("staged"), "{what}: copied bytes");
    assert!(
        store.get("copy/from x+y.bin").await.unwrap().is_some(),
        "{what}"
    );
    assert!(
        !store.copy("copy/missing", "copy/other.bin").await.unwrap(),
        "{what}: copy of a missing key"
    );
    assert!(
        store.get("copy/other.bin").await.unwrap().is_none(),
        "{what}"
    );
    let listed = store.list("copy/", None).await.unwrap();
    let keys: Vec<_> = listed.iter().map(|m| (m.key.as_str(), m.size)).collect();
    assert_eq!(
        keys,
        [("copy/from x+y.bin", 6), ("copy/to.bin", 6)],
        "{what}"
    );
    assert_eq!(
        store.counts().put - puts_before,
        4,
        "{what}: a copy counts as a PUT"
    );

    // Compare-and-delete: only while the etag read is the current one.
    let PutOutcome::Written(first) = store
        .put("del/k.json", Bytes::from("one"), PutMode::Overwrite)
        .await
        .unwrap()
    else {
        panic!("{what}: overwrite");
    };
    let read = store.get("del/k.json").await.unwrap().unwrap().etag;
    store
        .put("del/k.json", Bytes::from("two"), PutMode::Overwrite)
        .await
        .unwrap();
    assert!(
        !store.delete_if("del/k.json", &read).await.unwrap(),
        "{what}: a delete with a stale etag must not delete (written {first})"
    );
    assert_eq!(
        store.get("del/k.json").await.unwrap().unwrap().bytes,
        Bytes::from("two"),
        "{what}"
    );
    assert!(
        !store.delete_if("del/none.json", &read).await.unwrap(),
        "{what}: a missing key"
    );
    let now = store.get("del/k.json").await.unwrap().unwrap().etag;
    let deletes = (0..16).map(|_| {
        let (s, etag) = (store.clone(), now.clone());
        tokio::spawn(async move { s.delete_if("del/k.json", &etag).await })
    });
    let deleted = futures::future::join_all(deletes)
        .await
        .into_iter()
        .filter(|r| *r.as_ref().unwrap().as_ref().unwrap())
        .count();
    assert_eq!(deleted, 1, "{what}: racing compare-and-deletes");
    assert!(store.get("del/k.json").await.unwrap().is_none(), "{what}");

    let used = store.counts().since(&before);
    assert!(
        used.get >= 6
            && used.put_create >= 18
            && used.put_update >= 19
            && used.list >= 3
            && used.delete == 2 + 18,
        "{what}: {used}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn local_store_contract() {
    let dir = tempfile::tempdir().unwrap();
    contract(Arc::new(LocalStore::new(dir.path().join("root")))).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_store_contract() {
    contract(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn s3_store_contract_on_moto() {
    let cfg = S3Config::from_env().await;
    let bucket = fresh_bucket(&cfg, "contract").await;
    contract(Arc::new(S3Store::new(&cfg, &bucket, "some/prefix"))).await;
}
