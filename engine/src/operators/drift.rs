//! Schema drift: before a task reads its files with the pinned schema, each
//! file's own columns are compared with it. A column missing, renamed, added,
//! or of a type that does not cast to the pinned one without loss would be
//! read silently as nulls or truncated values; instead the batch fails,
//! naming the file, the columns and both types.

use datafusion::prelude::SessionContext;

use super::SqlOperator;
use crate::checkpoint::InputFile;
use crate::error::{Error, Result};
use crate::pipeline::SourceFormat;
use crate::pipeline::schema::{DriftCheck, drift};
use crate::storage::ScanAccess;
use crate::storage::fanout::concurrently;

impl SqlOperator {
    /// What of a file's inferred schema is compared for this source: names
    /// and types for Parquet and JSON (where a missing key is a null), names
    /// for CSV with a header (its types belong to each value); nothing for
    /// CSV without one (columns are by position).
    fn drift_check(&self) -> Option<DriftCheck> {
        let s = &self.pipeline.source;
        match s.format {
            SourceFormat::Parquet => Some(DriftCheck {
                types: true,
                absent_is_null: false,
            }),
            SourceFormat::Jsonl => Some(DriftCheck {
                types: true,
                absent_is_null: true,
            }),
            SourceFormat::Csv if s.header => Some(DriftCheck {
                types: false,
                absent_is_null: false,
            }),
            SourceFormat::Csv => None,
        }
    }

    /// Compare each of `files` (concurrently) with the pinned schema; the
    /// first that differs fails the task, named. Returns the files whose
    /// schema cannot be read at all, with the reader's error.
    pub(super) async fn check_drift<'a>(
        &self,
        session: &SessionContext,
        access: &ScanAccess,
        batch: u64,
        files: &[&'a InputFile],
    ) -> Result<Vec<(&'a InputFile, String)>> {
        let Some(check) = self.drift_check() else {
            return Ok(Vec::new());
        };
        let format = Self::format(&self.pipeline);
        let state = std::sync::Arc::new(session.state());
        let owned: Vec<InputFile> = files.iter().map(|f| (*f).clone()).collect();
        let found = concurrently(owned, |f| {
            let (format, state) = (format.clone(), state.clone());
            let (store, meta) = (access.store.clone(), Self::object_meta(access, &f));
            async move {
                let schema = format.infer_schema(state.as_ref(), &store, &[meta]).await;
                Ok((f, schema))
            }
        })
        .await?;
        let mut unreadable = Vec::new();
        let mut drifted = None;
        for (i, (_, schema)) in found.into_iter().enumerate() {
            match schema {
                Err(e) => unreadable.push((files[i], e.to_string().trim().to_string())),
                Ok(schema) => {
                    if drifted.is_none()
                        && let Some(d) = drift(&self.schema, &schema, check)
                    {
                        drifted = Some((files[i], d));
                    }
                }
            }
        }
        if let Some((f, d)) = drifted {
            return Err(Error::Input {
                pipeline: self.pipeline.name.clone(),
                batch,
                key: f.key.clone(),
                message: format!(
                    "its columns do not match the pinned source schema: {d}. Fix or replace the \
                     file (same key); if the source changed for good, declare source.schema \
                     with the new columns and run `sluice reset` on the pipeline file"
                ),
            });
        }
        Ok(unreadable)
    }

    /// A file whose schema cannot be read at all.
    pub(super) fn unreadable(&self, batch: u64, f: &InputFile, e: impl std::fmt::Display) -> Error {
        let e = e.to_string();
        let message = if e.to_lowercase().contains("precondition") {
            "replaced since the batch was planned (it no longer has the planned ETag), so it is \
             not read: the batch's plan is dropped and the next run plans afresh with the new \
             version"
                .to_string()
        } else {
            format!(
                "{}; fix or replace the file (same key), then run again",
                e.trim()
            )
        };
        Error::Input {
            pipeline: self.pipeline.name.clone(),
            batch,
            key: f.key.clone(),
            message,
        }
    }
}
