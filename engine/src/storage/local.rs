//! A local folder as a [`Store`]: the embedded default.
//!
//! Atomicity across processes comes from the file system: every write goes to
//! a hidden temporary file first; an overwrite renames it into place, a
//! create-only put hard-links it (which fails if the key exists), and a
//! compare-and-swap holds an exclusive lock on a hidden per-key lock file while
//! it compares and renames. Hidden names (starting with `.`) are never listed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use datafusion::execution::object_store::ObjectStoreUrl;

use super::{
    Object, ObjectMeta, PutMode, PutOutcome, RequestCounter, RequestCounts, RequestKind,
    ScanAccess, Store,
};
use crate::error::StoreError;

/// A [`Store`] over a local folder.
#[derive(Debug)]
pub struct LocalStore {
    root: PathBuf,
    counter: Arc<RequestCounter>,
}

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// How long a compare-and-swap waits for a key's lock before giving up.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl LocalStore {
    /// A store rooted at `root` (created on first write).
    pub fn new(root: PathBuf) -> LocalStore {
        LocalStore {
            root,
            counter: Arc::default(),
        }
    }

    fn path_of(&self, key: &str) -> Result<PathBuf, StoreError> {
        if key.is_empty()
            || key.starts_with('/')
            || key
                .split('/')
                .any(|s| s.is_empty() || s == "." || s == "..")
        {
            return Err(StoreError::Permanent {
                op: "resolve",
                location: self.root.display().to_string(),
                message: format!("key \"{key}\" is not a plain relative key"),
            });
        }
        Ok(self.root.join(key))
    }

    fn err(&self, op: &'static str, path: &Path, e: std::io::Error) -> StoreError {
        use std::io::ErrorKind::*;
        let message = e.to_string();
        let location = path.display().to_string();
        match e.kind() {
            Interrupted | TimedOut | WouldBlock | ResourceBusy => StoreError::Transient {
                op,
                location,
                message,
            },
            _ => StoreError::Permanent {
                op,
                location,
                message,
            },
        }
    }

    /// A fresh hidden temporary path beside `path` (its folder created),
    /// named after this process so a sweep can tell whether its writer
    /// still runs: `.NAME.PID-NAMESPACE.N.tmp`.
    fn temp_beside(&self, path: &Path, op: &'static str) -> Result<PathBuf, StoreError> {
        let dir = path.parent().expect("a key has a parent folder");
        std::fs::create_dir_all(dir).map_err(|e| self.err(op, dir, e))?;
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        Ok(dir.join(format!(
            ".{name}.{}-{}.{}.tmp",
            std::process::id(),
            crate::process::namespace(),
            TEMP_SEQ.fetch_add(1, Ordering::Relaxed)
        )))
    }

    /// Write `bytes` to a fresh hidden file beside `path` and return its path.
    fn write_temp(&self, path: &Path, bytes: &[u8]) -> Result<PathBuf, StoreError> {
        let tmp = self.temp_beside(path, "put")?;
        let mut f = std::fs::File::create(&tmp).map_err(|e| self.err("put", &tmp, e))?;
        f.write_all(bytes).map_err(|e| self.err("put", &tmp, e))?;
        f.sync_data().map_err(|e| self.err("put", &tmp, e))?;
        Ok(tmp)
    }

    fn put_sync(&self, key: &str, bytes: &[u8], mode: &PutMode) -> Result<PutOutcome, StoreError> {
        let path = self.path_of(key)?;
        let etag = etag_of(bytes);
        match mode {
            PutMode::Overwrite => {
                let tmp = self.write_temp(&path, bytes)?;
                std::fs::rename(&tmp, &path).map_err(|e| self.err("put", &path, e))?;
                Ok(PutOutcome::Written(etag))
            }
            PutMode::Create => {
                let tmp = self.write_temp(&path, bytes)?;
                let linked = std::fs::hard_link(&tmp, &path);
                let _ = std::fs::remove_file(&tmp);
                match linked {
                    Ok(()) => Ok(PutOutcome::Written(etag)),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        Ok(PutOutcome::Conflict)
                    }
                    Err(e) => Err(self.err("put-create", &path, e)),
                }
            }
            PutMode::Update(expected) => {
                let _lock = self.lock_key(&path, "put-update")?;
                let current = match std::fs::read(&path) {
                    Ok(b) => Some(etag_of(&b)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    Err(e) => return Err(self.err("put-update", &path, e)),
                };
                if current.as_deref() != Some(expected.as_str()) {
                    return Ok(PutOutcome::Conflict);
                }
                let tmp = self.write_temp(&path, bytes)?;
                std::fs::rename(&tmp, &path).map_err(|e| self.err("put-update", &path, e))?;
                // The lock is released when `lock` is dropped.
                Ok(PutOutcome::Written(etag))
            }
        }
    }

    /// Take the exclusive lock on `path`'s hidden lock file, under which
    /// compare-and-swap and compare-and-delete compare and write. A holder
    /// stopped while holding it (SIGSTOP, a frozen container) must not hang
    /// every other writer: after a few seconds of trying this gives a
    /// transient error, and the caller's step is retried.
    fn lock_key(&self, path: &Path, op: &'static str) -> Result<std::fs::File, StoreError> {
        let dir = path.parent().expect("a key has a parent folder");
        std::fs::create_dir_all(dir).map_err(|e| self.err(op, dir, e))?;
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let lock_path = dir.join(format!(".{name}.lock"));
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| self.err(op, &lock_path, e))?;
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        loop {
            match lock.try_lock() {
                Ok(()) => return Ok(lock),
                Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(StoreError::Transient {
                        op,
                        location: path.display().to_string(),
                        message: format!(
                            "another writer has held {} for {} s (a stopped process?)",
                            lock_path.display(),
                            LOCK_WAIT.as_secs()
                        ),
                    });
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(self.err(op, &lock_path, e)),
            }
        }
        // The lock is released when the returned file is dropped.
    }

    fn delete_if_sync(&self, key: &str, etag: &str) -> Result<bool, StoreError> {
        let path = self.path_of(key)?;
        let _lock = self.lock_key(&path, "delete-if")?;
        match std::fs::read(&path) {
            Ok(b) if etag_of(&b) == etag => {}
            Ok(_) => return Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(self.err("delete-if", &path, e)),
        }
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(self.err("delete-if", &path, e)),
        }
    }

    fn list_sync(
        &self,
        prefix: &str,
        start_after: Option<&str>,
    ) -> Result<Vec<ObjectMeta>, StoreError> {
        // Start the walk at the deepest folder the prefix names.
        let (dir_part, _) = prefix.rsplit_once('/').unwrap_or(("", prefix));
        let start = if dir_part.is_empty() {
            self.root.clone()
        } else {
            self.root.join(dir_part)
        };
        let mut out = Vec::new();
        let base = if dir_part.is_empty() {
            String::new()
        } else {
            format!("{dir_part}/")
        };
        self.walk(&start, &base, prefix, start_after, &mut out)?;
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Remove, under `dir`, the temporary files of writes that cannot be
    /// running any more: their process is gone (no `/proc/PID`, on Linux)
    /// and they are over a minute old, or they are over an hour old.
    fn sweep_dir(&self, dir: &Path, removed: &mut u64) -> Result<(), StoreError> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(self.err("sweep", dir, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| self.err("sweep", dir, e))?;
            let path = entry.path();
            let meta = match entry.metadata() {
                Ok(m) => m,
                // Renamed into place (or removed) since the folder was
                // read: a writer finished with it.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(self.err("sweep", &path, e)),
            };
            if meta.is_dir() {
                self.sweep_dir(&path, removed)?;
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some((pid, ns)) = temp_owner(&name) else {
                continue;
            };
            let age = meta
                .modified()
                .ok()
                .and_then(|m| m.elapsed().ok())
                .unwrap_or_default();
            // Only a writer of this boot and pid namespace can be seen to
            // have exited. One that recorded no namespace, with a pid absent
            // here, may be a live writer in another container sharing the
            // folder: its file must also be a minute old (no write of a part
            // takes that long between create and rename).
            let absent = pid != std::process::id()
                && Path::new("/proc/self").exists()
                && !Path::new(&format!("/proc/{pid}")).exists();
            let gone = match ns {
                Some(ns) => absent && ns == crate::process::namespace(),
                None => absent && age > std::time::Duration::from_secs(60),
            };
            if gone || age > std::time::Duration::from_secs(3600) {
                match std::fs::remove_file(&path) {
                    Ok(()) => *removed += 1,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(self.err("sweep", &path, e)),
                }
            }
        }
        Ok(())
    }

    /// Every file under `dir` (key prefix `base`) whose key starts with
    /// `prefix` and sorts after `start_after`. Iterative, not recursive:
    /// folders may nest hundreds deep (S3 keys of 1,024 bytes).
    fn walk(
        &self,
        dir: &Path,
        base: &str,
        prefix: &str,
        start_after: Option<&str>,
        out: &mut Vec<ObjectMeta>,
    ) -> Result<(), StoreError> {
        // Folders already entered, so a link back up does not loop.
        let mut visited = std::collections::HashSet::new();
        if let Ok(real) = std::fs::canonicalize(dir) {
            visited.insert(real);
        }
        let mut todo: Vec<(PathBuf, String)> = vec![(dir.to_path_buf(), base.to_string())];
        while let Some((dir, base)) = todo.pop() {
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(self.err("list", &dir, e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| self.err("list", &dir, e))?;
                let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                    // Keys are UTF-8; a name that is not cannot be one.
                    tracing::warn!(
                        file = %entry.path().display(),
                        "not listed: the file name is not UTF-8; rename it to read it"
                    );
                    continue;
                };
                if name.starts_with('.') {
                    continue;
                }
                let key = format!("{base}{name}");
                // A link is followed, as a reader follows it: listed with
                // what it leads to (its size and time), the same file the
                // read and the check before it find. One that leads
                // nowhere, or in a loop, is not listed (`sluice show` names
                // it).
                let meta = match std::fs::metadata(entry.path()) {
                    Ok(m) => m,
                    // Removed since the folder was read (another writer's
                    // temporary file, renamed away): it is not there, as
                    // an S3 listing made a moment later would say.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && !is_link(&entry) => {
                        continue;
                    }
                    Err(e) if is_link(&entry) => {
                        tracing::warn!(file = %entry.path().display(), error = %e, "not listed: a link that leads nowhere (or in a loop)");
                        continue;
                    }
                    Err(e) => return Err(self.err("list", &entry.path(), e)),
                };
                if meta.is_dir() {
                    let sub = format!("{key}/");
                    // Skip folders that cannot hold a matching key.
                    let shares_prefix = sub.starts_with(prefix) || prefix.starts_with(&sub);
                    let after = match start_after {
                        Some(s) => sub.as_str() >= s || s.starts_with(&sub),
                        None => true,
                    };
                    if !(shares_prefix && after) {
                        continue;
                    }
                    let real = std::fs::canonicalize(entry.path()).unwrap_or(entry.path());
                    if !visited.insert(real) {
                        tracing::warn!(folder = %entry.path().display(), "not listed: a link to a folder already listed (a loop)");
                        continue;
                    }
                    todo.push((entry.path(), sub));
                    continue;
                }
                if !key.starts_with(prefix) || start_after.is_some_and(|s| key.as_str() <= s) {
                    continue;
                }
                out.push(ObjectMeta {
                    key,
                    size: meta.len(),
                    etag: None,
                    last_modified: meta.modified().ok().map(DateTime::<Utc>::from),
                });
            }
        }
        Ok(())
    }
}

/// Whether a folder entry is a symbolic link.
fn is_link(entry: &std::fs::DirEntry) -> bool {
    entry.file_type().is_ok_and(|t| t.is_symlink())
}

/// The process that wrote temporary file `name`
/// (`.NAME.PID-NAMESPACE.N.tmp`; `.NAME.PID.N.tmp` before namespaces were
/// recorded), if it is one: its pid and namespace.
fn temp_owner(name: &str) -> Option<(u32, Option<String>)> {
    let rest = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let mut parts = rest.rsplitn(3, '.');
    let _seq: u64 = parts.next()?.parse().ok()?;
    let process = parts.next()?;
    parts.next().filter(|n| !n.is_empty())?;
    match process.split_once('-') {
        Some((pid, ns)) => Some((pid.parse().ok()?, Some(ns.to_string()))),
        None => Some((process.parse().ok()?, None)),
    }
}

/// The etag of local content: a 64-bit FNV-1a hash and the length. Content
/// equality is enough for compare-and-swap: a writer whose read matches the
/// bytes there now decided on exactly the record that is there now, even
/// if it was replaced and written back in between (a trigger giving a
/// claim back restores the record it replaced).
pub(crate) fn etag_of(bytes: &[u8]) -> String {
    format!("{:016x}-{}", crate::hash::fnv1a(bytes), bytes.len())
}

#[async_trait::async_trait]
impl Store for LocalStore {
    async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
        self.counter.add(RequestKind::Get);
        let path = self.path_of(key)?;
        match tokio::fs::read(&path).await {
            Ok(b) => Ok(Some(Object {
                etag: etag_of(&b),
                bytes: Bytes::from(b),
            })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.err("get", &path, e)),
        }
    }

    async fn put(&self, key: &str, bytes: Bytes, mode: PutMode) -> Result<PutOutcome, StoreError> {
        self.counter.add(mode.kind());
        let this = LocalStore {
            root: self.root.clone(),
            counter: Arc::default(),
        };
        let key = key.to_string();
        tokio::task::spawn_blocking(move || this.put_sync(&key, &bytes, &mode))
            .await
            .map_err(|e| StoreError::Transient {
                op: "put",
                location: self.root.display().to_string(),
                message: e.to_string(),
            })?
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
    ) -> Result<Vec<ObjectMeta>, StoreError> {
        let this = LocalStore {
            root: self.root.clone(),
            counter: Arc::default(),
        };
        let prefix = prefix.to_string();
        let start_after = start_after.map(str::to_string);
        let listed =
            tokio::task::spawn_blocking(move || this.list_sync(&prefix, start_after.as_deref()))
                .await
                .map_err(|e| StoreError::Transient {
                    op: "list",
                    location: self.root.display().to_string(),
                    message: e.to_string(),
                })?;
        self.counter
            .add_listing(listed.as_ref().map_or(0, |l: &Vec<ObjectMeta>| l.len()));
        listed
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.counter.add(RequestKind::Delete);
        let path = self.path_of(key)?;
        match tokio::fs::remove_file(&path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.err("delete", &path, e)),
        }
    }

    async fn delete_if(&self, key: &str, etag: &str) -> Result<bool, StoreError> {
        self.counter.add(RequestKind::Delete);
        let this = LocalStore {
            root: self.root.clone(),
            counter: Arc::default(),
        };
        let (key, etag) = (key.to_string(), etag.to_string());
        tokio::task::spawn_blocking(move || this.delete_if_sync(&key, &etag))
            .await
            .map_err(|e| StoreError::Transient {
                op: "delete-if",
                location: self.root.display().to_string(),
                message: e.to_string(),
            })?
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, StoreError> {
        self.counter.add(RequestKind::Get);
        let path = self.path_of(key)?;
        match tokio::fs::metadata(&path).await {
            // The etag of local content is its hash: a HEAD reads the file
            // (only the commit's check of a few outputs asks for one).
            Ok(m) if m.is_file() => Ok(Some(ObjectMeta {
                key: key.to_string(),
                size: m.len(),
                etag: match tokio::fs::read(&path).await {
                    Ok(b) => Some(etag_of(&b)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(self.err("head", &path, e)),
                },
                last_modified: m.modified().ok().map(chrono::DateTime::<chrono::Utc>::from),
            })),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.err("head", &path, e)),
        }
    }

    async fn copy(&self, from: &str, to: &str) -> Result<bool, StoreError> {
        self.counter.add(RequestKind::Put);
        let (src, dst) = (self.path_of(from)?, self.path_of(to)?);
        if let Some(dir) = dst.parent() {
            std::fs::create_dir_all(dir).map_err(|e| self.err("copy", dir, e))?;
        }
        // A hard link from the source straight to the destination is one
        // atomic step that fails once the source is gone: a writer stopped
        // in the middle of publishing cannot publish after a reset or a
        // newer run removed what it publishes (a link to a temporary file
        // renamed into place later could).
        match std::fs::hard_link(&src, &dst) {
            Ok(()) => return Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            // Another file system: copy the bytes below.
            Err(_) => {}
        }
        // The destination exists (replaced atomically), or linking is not
        // possible: a linked or copied temporary file renamed into place.
        let tmp = self.temp_beside(&dst, "copy")?;
        let linked = match std::fs::hard_link(&src, &tmp) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(_) => std::fs::copy(&src, &tmp).map(|_| ()),
            Ok(()) => Ok(()),
        };
        match linked {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(self.err("copy", &tmp, e)),
            Ok(()) => {}
        }
        std::fs::rename(&tmp, &dst).map_err(|e| self.err("copy", &dst, e))?;
        Ok(true)
    }

    async fn sweep_temp(&self, prefix: &str) -> Result<u64, StoreError> {
        let dir = match prefix.trim_end_matches('/') {
            "" => self.root.clone(),
            p => self.path_of(p)?,
        };
        let mut removed = 0;
        self.sweep_dir(&dir, &mut removed)?;
        Ok(removed)
    }

    async fn unnamed(&self) -> Result<Vec<String>, StoreError> {
        // Iterative: folders may nest hundreds deep.
        fn walk(root: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
            let mut todo = vec![root.to_path_buf()];
            while let Some(dir) = todo.pop() {
                let entries = match std::fs::read_dir(&dir) {
                    Ok(e) => e,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                };
                for entry in entries {
                    let entry = entry?;
                    let name = entry.file_name();
                    if name.as_encoded_bytes().starts_with(b".") {
                        continue;
                    }
                    let path = entry.path();
                    // A link that leads nowhere (or in a loop) cannot be
                    // read either.
                    let dangling = is_link(&entry) && std::fs::metadata(&path).is_err();
                    if name.to_str().is_none() || dangling {
                        let relative = path.strip_prefix(root).unwrap_or(&path);
                        out.push(relative.to_string_lossy().into_owned());
                    } else if entry.file_type()?.is_dir() {
                        todo.push(path);
                    }
                }
            }
            Ok(())
        }
        let mut out = Vec::new();
        walk(&self.root, &mut out).map_err(|e| self.err("list", &self.root, e))?;
        out.sort();
        Ok(out)
    }

    fn counts(&self) -> RequestCounts {
        self.counter.snapshot()
    }

    fn describe(&self) -> String {
        self.root.display().to_string()
    }

    fn scan_access(&self) -> Result<ScanAccess, StoreError> {
        Ok(ScanAccess {
            url: ObjectStoreUrl::local_filesystem(),
            store: Arc::new(object_store::local::LocalFileSystem::new()),
            root: self
                .root
                .to_string_lossy()
                .trim_start_matches('/')
                .to_string(),
        }
        .counted(self.counter.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Temporary files of an exited process of this namespace go at once;
    /// another namespace's (a container sharing the folder) stay until an
    /// hour old; a live process's stay.
    #[tokio::test]
    async fn sweep_removes_only_what_no_running_writer_can_own() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path().to_path_buf());
        let ns = crate::process::namespace();
        let absent = 4_999_999;
        let dead = dir.path().join(format!(".a.parquet.{absent}-{ns}.0.tmp"));
        let elsewhere = dir
            .path()
            .join(format!(".b.parquet.{absent}-ffffffffffffffff.0.tmp"));
        let live = dir.path().join(format!(".c.parquet.1-{ns}.0.tmp"));
        let lock = dir.path().join(".control.json.lock");
        for f in [&dead, &elsewhere, &live, &lock] {
            std::fs::write(f, b"x").unwrap();
        }
        assert_eq!(store.sweep_temp("").await.unwrap(), 1);
        assert!(!dead.exists());
        assert!(elsewhere.exists() && live.exists() && lock.exists());
        assert_eq!(temp_owner(".a.b.7.3.tmp"), Some((7, None)));
        assert_eq!(temp_owner(".a.7-abc.3.tmp"), Some((7, Some("abc".into()))));
        assert_eq!(temp_owner(".a.lock"), None);
    }
}
