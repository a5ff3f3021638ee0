//! Which planned files a task reads now: each checked against how its
//! source planned it (its listing, its notification, or not at all: a
//! source sink's parts never change), the ones changed since left for the
//! next run and the ones gone named.

use super::*;

impl SqlOperator {
    /// Notify mode: the inputs with the sizes they have now (one HEAD each).
    /// A notification's size is that of the upload it reports, and the
    /// reader must not trust it: a key written again since would be read
    /// short. A key deleted since its notification is skipped with a warning
    /// (there is nothing left to process; its claim is committed with the
    /// batch).
    pub(super) async fn current_sizes(
        &self,
        access: &ScanAccess,
        batch: u64,
        planned: &[&InputFile],
    ) -> Result<Vec<InputFile>> {
        // At most `CONCURRENT_REQUESTS` in flight, however many small files
        // a task holds.
        let owned: Vec<InputFile> = planned.iter().map(|f| (*f).clone()).collect();
        let found = crate::storage::fanout::concurrently(owned, |f| {
            let (store, path) = (access.store.clone(), access.path(&f.key));
            let pipeline = self.pipeline.name.clone();
            async move {
                match object_store::ObjectStoreExt::head(&store, &path).await {
                    Ok(meta) => Ok(Some(InputFile {
                        key: f.key,
                        size: meta.size,
                        etag: meta.e_tag,
                        modified_ms: None,
                        partition: f.partition,
                    })),
                    Err(object_store::Error::NotFound { .. }) => {
                        tracing::warn!(%pipeline, batch, key = %f.key, "notified file gone; skipped");
                        Ok(None)
                    }
                    Err(e) => Err(Error::Store(crate::storage::object_store_error(
                        "head", &f.key, &e,
                    ))),
                }
            }
        })
        .await?;
        Ok(found.into_iter().flatten().collect())
    }

    /// Local files of the task whose size or modification time is not what
    /// the listing saw: still being written (a local folder is not atomic,
    /// unlike an S3 upload). In `list` mode they are deferred to the next
    /// run; in `ordered` mode, whose cursor must not pass a key, the batch
    /// is refused (its plan is dropped and the next run plans afresh).
    pub(super) async fn changed_since_listed(
        &self,
        access: &ScanAccess,
        batch: u64,
        task: &TaskPlan,
        planned: &[&InputFile],
    ) -> Result<(Vec<InputFile>, Vec<String>)> {
        let mut changed = Vec::new();
        let mut gone = Vec::new();
        for f in planned {
            let meta = match object_store::ObjectStoreExt::head(&access.store, &access.path(&f.key))
                .await
            {
                Ok(meta) => meta,
                Err(object_store::Error::NotFound { .. }) => {
                    self.warn_gone(batch, &f.key);
                    gone.push(f.key.clone());
                    continue;
                }
                Err(e) => {
                    return Err(Error::Store(crate::storage::object_store_error(
                        "head", &f.key, &e,
                    )));
                }
            };
            let moved = f
                .modified_ms
                .is_some_and(|m| m != meta.last_modified.timestamp_millis());
            if meta.size != f.size || moved {
                tracing::warn!(pipeline = %self.pipeline.name, batch, key = %f.key, listed = f.size, now = meta.size, "input changed since it was listed (still being written?); left for the next run");
                changed.push(InputFile {
                    key: f.key.clone(),
                    size: meta.size,
                    etag: meta.e_tag,
                    modified_ms: Some(meta.last_modified.timestamp_millis()),
                    partition: f.partition.clone(),
                });
            }
        }
        if let Some(InputFile { key, .. }) = changed.first()
            && Source::of(&self.pipeline).freshness() == (Freshness::Listed { strict: true })
        {
            return Err(Error::Input {
                pipeline: self.pipeline.name.clone(),
                batch: Some(batch),
                key: key.clone(),
                message: format!(
                    "changed since it was listed (task {}): it is still being written. Write \
                     files elsewhere and rename them into the source folder; the batch's plan is \
                     dropped and the next run plans afresh",
                    task.task
                ),
            });
        }
        Ok((changed, gone))
    }

    pub(super) fn warn_gone(&self, batch: u64, key: &str) {
        tracing::warn!(pipeline = %self.pipeline.name, batch, %key, "input deleted since the batch was planned; nothing to read, left out of the batch");
    }

    /// Notify mode over a local folder: the inputs whose size now is not
    /// the size their inbox entry recorded (a local folder's files are found
    /// by reconciling, which records the listed size): still being written,
    /// so left for the next run. The commit refreshes their entries with the
    /// size found here.
    pub(super) fn changed_since_notified(
        &self,
        batch: u64,
        planned: &[&InputFile],
        current: &[InputFile],
    ) -> Vec<InputFile> {
        let noticed: std::collections::HashMap<&str, u64> =
            planned.iter().map(|f| (f.key.as_str(), f.size)).collect();
        current
            .iter()
            .filter(|f| noticed.get(f.key.as_str()).is_some_and(|s| *s != f.size))
            .inspect(|f| {
                tracing::warn!(pipeline = %self.pipeline.name, batch, key = %f.key, notified = noticed[f.key.as_str()], now = f.size, "input changed since it was notified (still being written?); left for the next run");
            })
            .cloned()
            .collect()
    }

    /// The task's files to read now, and how: the planned inputs less those
    /// left for the next run or gone, read through an access that, on S3,
    /// pins every read to the version planned (its ETag): a file replaced
    /// since fails its read rather than being read as input the plan did
    /// not name. (Local files were checked against the listing.)
    pub(super) async fn readable(&self, source: &dyn Store, task: Task<'_>) -> Result<Readable> {
        let access = source.scan_access()?;
        let batch = task.id.batch;
        let planned = self.planned_inputs(batch, task.inputs, task.plan)?;
        let (mut files, deferred, gone) = self
            .readable_now(&access, batch, task.plan, &planned)
            .await?;
        // A 0-byte CSV or JSON Lines file holds no rows (not even a
        // header): read as such, not as a file missing every column. (A
        // 0-byte Parquet file is not a Parquet file: a bad file.)
        if self.pipeline.source.format != crate::pipeline::SourceFormat::Parquet {
            files.retain(|f| f.size > 0);
        }
        let access = if access.url.as_str() == "file:///" {
            access
        } else {
            access.pinned(files.iter().map(|f| (f.key.as_str(), f.etag.as_deref())))
        };
        Ok(Readable {
            access,
            files,
            deferred,
            gone,
        })
    }

    /// The planned files to read now, the ones left for the next run
    /// (changed since listed or notified), and the ones gone.
    pub(super) async fn readable_now(
        &self,
        access: &ScanAccess,
        batch: u64,
        task: &TaskPlan,
        planned: &[&InputFile],
    ) -> Result<(Vec<InputFile>, Vec<InputFile>, Vec<String>)> {
        let local = access.url.as_str() == "file:///";
        let keep = |files: Vec<InputFile>, deferred: &[InputFile]| -> Vec<InputFile> {
            files
                .into_iter()
                .filter(|f| !deferred.iter().any(|d| d.key == f.key))
                .collect()
        };
        let owned = || planned.iter().map(|f| (*f).clone()).collect::<Vec<_>>();
        match Source::of(&self.pipeline).freshness() {
            Freshness::Notified => {
                let current = self.current_sizes(access, batch, planned).await?;
                let deferred = if local {
                    self.changed_since_notified(batch, planned, &current)
                } else {
                    Vec::new()
                };
                Ok((keep(current, &deferred), deferred, Vec::new()))
            }
            Freshness::Immutable => Ok((owned(), Vec::new(), Vec::new())),
            Freshness::Listed { .. } if local => {
                let (deferred, gone) = self
                    .changed_since_listed(access, batch, task, planned)
                    .await?;
                let files = keep(owned(), &deferred)
                    .into_iter()
                    .filter(|f| !gone.contains(&f.key))
                    .collect();
                Ok((files, deferred, gone))
            }
            Freshness::Listed { .. } => Ok((owned(), Vec::new(), Vec::new())),
        }
    }
}

/// What a task reads ([`SqlOperator::readable`]).
pub(super) struct Readable {
    pub(super) access: ScanAccess,
    pub(super) files: Vec<InputFile>,
    pub(super) deferred: Vec<InputFile>,
    pub(super) gone: Vec<String>,
}
