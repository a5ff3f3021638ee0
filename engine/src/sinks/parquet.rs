//! The Parquet sink: parts under keys that are a function of (batch, task,
//! part, epoch), so a retried task overwrites its own files, and a manifest
//! per committed batch, `_sluice/manifest/N.json`, which names exactly the
//! committed files.

use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;
use futures::StreamExt;

use crate::checkpoint::{Manifest, OutputFile};
use crate::error::{Error, ErrorClass, Result};
use crate::paths;
use crate::storage::{PutMode, Store};

/// Roll to a new part file past this many encoded bytes.
const TARGET_PART_BYTES: usize = 256 << 20;

/// Parts of one output partition are numbered from `partition * PARTS_PER_PARTITION`.
const PARTS_PER_PARTITION: u32 = 1000;

/// A sink of Parquet files with a manifest per committed batch.
#[derive(Debug, Clone)]
pub struct ParquetSink {
    store: Arc<dyn Store>,
    pipeline: String,
}

impl ParquetSink {
    /// A sink writing into `store`.
    pub fn new(store: Arc<dyn Store>, pipeline: &str) -> ParquetSink {
        ParquetSink {
            store,
            pipeline: pipeline.to_string(),
        }
    }

    /// The pipeline whose output this sink holds.
    pub fn pipeline(&self) -> &str {
        &self.pipeline
    }

    /// The underlying store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    fn exec_err(&self, batch: u64, task: u32, message: String, class: ErrorClass) -> Error {
        Error::Execution {
            pipeline: self.pipeline.clone(),
            batch,
            task: Some(task),
            message,
            class,
        }
    }

    /// Write one output partition of a task as one or more Parquet parts.
    /// Returns the files written (none for an empty partition).
    pub(crate) async fn write_partition(
        &self,
        epoch: u64,
        batch: u64,
        task: u32,
        partition: u32,
        schema: SchemaRef,
        mut stream: SendableRecordBatchStream,
    ) -> Result<Vec<OutputFile>> {
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(
                ZstdLevel::try_new(3).expect("valid level"),
            ))
            .build();
        let mut outputs = Vec::new();
        let mut roll = 0u32;
        let mut writer: Option<(ArrowWriter<Vec<u8>>, u64)> = None;
        let fail = |m: String| self.exec_err(batch, task, m, ErrorClass::Fatal);
        while let Some(rb) = stream.next().await {
            let rb = rb.map_err(|e| Error::Execution {
                pipeline: self.pipeline.clone(),
                batch,
                task: Some(task),
                message: e.to_string(),
                // Read errors are attributed to an input by the operator.
                class: ErrorClass::InvalidInput,
            })?;
            if rb.num_rows() == 0 {
                continue;
            }
            if writer.is_none() {
                let w = ArrowWriter::try_new(Vec::new(), schema.clone(), Some(props.clone()))
                    .map_err(|e| fail(format!("parquet writer: {e}")))?;
                writer = Some((w, 0));
            }
            let (w, rows) = writer.as_mut().expect("writer was just set");
            w.write(&rb)
                .map_err(|e| fail(format!("parquet write: {e}")))?;
            *rows += rb.num_rows() as u64;
            if w.bytes_written() + w.in_progress_size() >= TARGET_PART_BYTES {
                let (w, rows) = writer.take().expect("writer is open");
                outputs.push(
                    self.finish_part(epoch, batch, task, partition, roll, w, rows)
                        .await?,
                );
                roll += 1;
            }
        }
        if let Some((w, rows)) = writer.take() {
            outputs.push(
                self.finish_part(epoch, batch, task, partition, roll, w, rows)
                    .await?,
            );
        }
        Ok(outputs)
    }

    #[allow(clippy::too_many_arguments)]
    async fn finish_part(
        &self,
        epoch: u64,
        batch: u64,
        task: u32,
        partition: u32,
        roll: u32,
        w: ArrowWriter<Vec<u8>>,
        rows: u64,
    ) -> Result<OutputFile> {
        let bytes = w.into_inner().map_err(|e| {
            self.exec_err(
                batch,
                task,
                format!("parquet close: {e}"),
                ErrorClass::Fatal,
            )
        })?;
        let key = paths::sink::part(batch, task, partition * PARTS_PER_PARTITION + roll, epoch);
        let size = bytes.len() as u64;
        self.store
            .put(&key, Bytes::from(bytes), PutMode::Overwrite)
            .await?;
        Ok(OutputFile {
            key,
            rows,
            bytes: size,
        })
    }

    /// Delete part files of a task that an earlier attempt of this run
    /// wrote and this attempt did not. Files of other runs are left alone:
    /// they may be committed (this run may have lost its lease).
    pub(crate) async fn remove_stale_parts(
        &self,
        epoch: u64,
        batch: u64,
        task: u32,
        keep: &[OutputFile],
    ) -> Result<()> {
        let mine = paths::sink::epoch_suffix(epoch);
        for meta in self
            .store
            .list(&paths::sink::task_prefix(batch, task), None)
            .await?
        {
            if meta.key.ends_with(&mine) && !keep.iter().any(|o| o.key == meta.key) {
                self.store.delete(&meta.key).await?;
            }
        }
        Ok(())
    }

    /// After batch `batch` is committed with `outputs`: delete every other
    /// file under the batch's folder (attempts of runs that died or lost
    /// their lease), so the folder holds exactly the committed files.
    pub(crate) async fn remove_uncommitted(
        &self,
        batch: u64,
        outputs: &[OutputFile],
    ) -> Result<()> {
        for meta in self
            .store
            .list(&paths::sink::batch_prefix(batch), None)
            .await?
        {
            if !outputs.iter().any(|o| o.key == meta.key) {
                self.store.delete(&meta.key).await?;
            }
        }
        Ok(())
    }

    /// Check that every output of a batch is present with its size, before
    /// committing it.
    pub(crate) async fn verify(&self, batch: u64, outputs: &[OutputFile]) -> Result<()> {
        let listed = self
            .store
            .list(&paths::sink::batch_prefix(batch), None)
            .await?;
        for o in outputs {
            match listed.iter().find(|m| m.key == o.key) {
                Some(m) if m.size == o.bytes => {}
                found => {
                    return Err(Error::Execution {
                        pipeline: self.pipeline.clone(),
                        batch,
                        task: None,
                        message: format!(
                            "output {} is {} before commit; the batch will be run again",
                            o.key,
                            match found {
                                Some(m) => format!("{} bytes instead of {}", m.size, o.bytes),
                                None => "missing".to_string(),
                            }
                        ),
                        class: ErrorClass::Retryable,
                    });
                }
            }
        }
        Ok(())
    }

    /// Make a batch's output visible: write its manifest. Idempotent.
    pub async fn commit(&self, manifest: &Manifest) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(manifest).expect("a manifest serializes");
        self.store
            .put(
                &paths::sink::manifest(manifest.batch),
                Bytes::from(bytes),
                PutMode::Overwrite,
            )
            .await?;
        Ok(())
    }

    /// Read the manifests of all committed batches, in batch order.
    pub async fn manifests(&self) -> Result<Vec<Manifest>> {
        let mut out = Vec::new();
        for meta in self.store.list(paths::sink::MANIFEST_PREFIX, None).await? {
            if let Some(obj) = self.store.get(&meta.key).await? {
                let m: Manifest =
                    serde_json::from_slice(&obj.bytes).map_err(|e| Error::Checkpoint {
                        pipeline: self.pipeline.clone(),
                        key: meta.key.clone(),
                        message: format!("unreadable manifest: {e}"),
                    })?;
                out.push(m);
            }
        }
        Ok(out)
    }
}
