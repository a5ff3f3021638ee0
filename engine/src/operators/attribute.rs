//! When a task's read fails: which input is at fault (each read alone,
//! whole, then through the query), its first bad line as a person finds
//! it, and reading a text file again row by row under `on_bad_row`.

use super::*;

impl SqlOperator {
    /// How a query error of task `task` is reported: an input problem, which
    /// [`Self::culprit`] then pins on a file or the query.
    pub(super) fn exec_err(&self, id: TaskId) -> impl Fn(DataFusionError) -> Error + Copy + '_ {
        let TaskId { batch, task, .. } = id;
        move |e: DataFusionError| Error::Execution {
            pipeline: self.pipeline.name.clone(),
            batch,
            task: Some(task),
            message: e.to_string(),
            class: ErrorClass::InvalidInput,
        }
    }

    /// The whole of text file `f`, decompressed: `None` if it is gone,
    /// `Some(Err)` if it does not decompress.
    pub(crate) async fn read_text(
        &self,
        access: &ScanAccess,
        f: &InputFile,
    ) -> Result<Option<std::result::Result<Vec<u8>, String>>> {
        let path = access.path(&f.key);
        let got = match object_store::ObjectStoreExt::get(&access.store, &path).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => {
                return Err(Error::Store(crate::storage::object_store_error(
                    "get", &f.key, &e,
                )));
            }
        };
        let bytes = got
            .bytes()
            .await
            .map_err(|e| Error::Store(crate::storage::object_store_error("get", &f.key, &e)))?;
        let compression = match self.pipeline.source.compression {
            None => FileCompressionType::UNCOMPRESSED,
            Some(Compression::Gzip) => FileCompressionType::GZIP,
            Some(Compression::Zstd) => FileCompressionType::ZSTD,
        };
        let mut text = Vec::new();
        let decoded = compression
            .convert_read(std::io::Cursor::new(bytes))
            .map_err(|e| e.to_string())
            .and_then(|mut r| {
                std::io::Read::read_to_end(&mut r, &mut text).map_err(|e| e.to_string())
            });
        Ok(Some(decoded.map(|_| text)))
    }

    /// The first row of CSV or JSON Lines file `f` that does not read, as
    /// a person finds it: `line 4: column id: "zz" is not bigint (raw:
    /// zz,3)`, the line counted in the file as an editor counts it (the
    /// reader's own error counts from the first row after the header and
    /// names the column by position and Arrow type). `None` for Parquet,
    /// or when reading row by row finds nothing wrong.
    pub(super) async fn first_bad_row(&self, access: &ScanAccess, f: &InputFile) -> Option<String> {
        let s = &self.pipeline.source;
        let Ok(Some(Ok(text))) = self.read_text(access, f).await else {
            return None;
        };
        let schema = Arc::new(self.file_schema());
        let read = match s.format {
            SourceFormat::Parquet => return None,
            SourceFormat::Csv => salvage::csv(
                &f.key,
                &text,
                &schema,
                s.header,
                s.delimiter,
                BadRowPolicy::Quarantine,
            ),
            SourceFormat::Jsonl => salvage::jsonl(&f.key, &text, &schema, BadRowPolicy::Quarantine),
        };
        let bad = read.ok()?.bad.into_iter().next()?;
        let short = |text: String| {
            if text.chars().count() > 200 {
                text.chars().take(200).collect::<String>() + "..."
            } else {
                text
            }
        };
        // A Kinesis record: by its shard and sequence number, not by the
        // line it was read into.
        if self.reads_kinesis()
            && let Some(r) = crate::discovery::bad_shard_record(&bad.raw, &bad.reason)
        {
            let shown = if r.data { "its data" } else { "the record" };
            return Some(format!(
                "the record at {}: {} ({shown}: {})",
                r.at,
                r.reason,
                short(r.text)
            ));
        }
        let raw = short(bad.raw);
        Some(format!(
            "line {}: {} (the line: {raw})",
            bad.line, bad.reason
        ))
    }

    /// What to do about an input that cannot be read: a file is fixed or
    /// replaced; a topic's (a stream's) records cannot be changed, so the
    /// row policy must set them aside.
    pub(super) fn fix_advice(&self) -> &'static str {
        if self.reads_kinesis() {
            "a stream's records cannot be changed: set source.on_bad_row = \"quarantine\" (kept \
             under the sink's _quarantine/, named by shard and sequence number) or \"null\", then \
             run again"
        } else if self.pipeline.source.location.is_stream() {
            "a topic's records cannot be changed: set source.on_bad_row = \"quarantine\" (kept \
             under the sink's _quarantine/, named by partition and offset) or \"null\", then run \
             again"
        } else {
            "fix or replace the file (same key), then run again"
        }
    }

    /// Whether the source is a Kinesis stream: its records are named by
    /// shard and sequence number.
    pub(super) fn reads_kinesis(&self) -> bool {
        self.pipeline.source.discovery == crate::pipeline::DiscoveryMode::Kinesis
    }

    /// Why file `f` cannot be read, as a quarantine record and `sluice
    /// show` say it: its first bad line (CSV, JSON Lines), else the
    /// reader's error `reason`.
    pub(super) async fn why_unreadable(
        &self,
        access: &ScanAccess,
        f: &InputFile,
        reason: &str,
    ) -> String {
        match self.first_bad_row(access, f).await {
            Some(line) => line,
            None => reason.trim().to_string(),
        }
    }

    /// Under `on_bad_row = "quarantine" | "null"`, read a CSV or JSON Lines
    /// file that failed the scan row by row; `None` when the policy is
    /// `fail`, the source is Parquet, or the file is not text at all (bad
    /// compression), which the file policy then decides.
    pub(super) async fn salvage(
        &self,
        access: &ScanAccess,
        f: &InputFile,
    ) -> Result<Option<salvage::Salvaged>> {
        let s = &self.pipeline.source;
        if s.on_bad_row == BadRowPolicy::Fail || s.format == SourceFormat::Parquet {
            return Ok(None);
        }
        let text = match self.read_text(access, f).await? {
            Some(Ok(text)) => text,
            None => return Ok(None),
            Some(Err(e)) => {
                tracing::warn!(pipeline = %self.pipeline.name, key = %f.key, error = %e, "cannot decompress; the file policy decides");
                return Ok(None);
            }
        };
        // Derived columns are not in the file: filled after.
        let schema = Arc::new(self.file_schema());
        let read = match s.format {
            SourceFormat::Csv => {
                salvage::csv(&f.key, &text, &schema, s.header, s.delimiter, s.on_bad_row)
            }
            _ => salvage::jsonl(&f.key, &text, &schema, s.on_bad_row),
        };
        let read = read.and_then(|mut r| {
            let mut columns = r.batch.columns().to_vec();
            for f in &self.schema.fields()[schema.fields().len()..] {
                columns.push(if f.name() == CORRUPT_RECORD {
                    Arc::new(datafusion::arrow::array::StringArray::from(
                        r.corrupt.clone(),
                    ))
                } else {
                    datafusion::arrow::array::new_null_array(f.data_type(), r.batch.num_rows())
                });
            }
            r.batch =
                RecordBatch::try_new(self.schema.clone(), columns).map_err(|e| e.to_string())?;
            Ok(r)
        });
        match read {
            Ok(mut r) => {
                // A Kinesis record's reason names it by shard and sequence
                // number, and says what is wrong with its data.
                if self.reads_kinesis() {
                    for b in &mut r.bad {
                        if let Some(rec) = crate::discovery::bad_shard_record(&b.raw, &b.reason) {
                            b.reason = format!("{}: {}", rec.at, rec.reason);
                        }
                    }
                }
                tracing::warn!(pipeline = %self.pipeline.name, key = %f.key, bad_rows = r.bad.len(), nulled_fields = r.nulled, "file read row by row");
                Ok(Some(r))
            }
            Err(e) => {
                tracing::warn!(pipeline = %self.pipeline.name, key = %f.key, error = %e, "cannot read row by row; the file policy decides");
                Ok(None)
            }
        }
    }

    /// Which input makes a task fail, found by reading each alone: first
    /// whole with the pinned schema (a broken, missing or mismatched file),
    /// then through the query (a value the query cannot handle).
    pub(super) async fn culprit(
        &self,
        access: &ScanAccess,
        files: &[&InputFile],
    ) -> Option<Culprit> {
        let read_all = format!("SELECT * FROM \"{}\"", self.pipeline.source.table);
        let probes = [read_all.as_str(), self.pipeline.sql.as_str()];
        for sql in probes {
            for f in files {
                let probe = async {
                    let (ctx, plan) = self.plan_query(access, &[f], sql).await?;
                    datafusion::physical_plan::collect(plan, ctx.task_ctx()).await
                };
                let Err(e) = probe.await else {
                    continue;
                };
                let unreadable = sql == read_all;
                let replaced = e.to_string().to_lowercase().contains("precondition");
                let gone = is_not_found(&e);
                let message = match &e {
                    _ if replaced => "replaced since the batch was planned (it no longer has the \
                                      planned ETag), so it is not read: the batch's plan is \
                                      dropped and the next run plans afresh with the new version"
                        .to_string(),
                    DataFusionError::ObjectStore(os)
                        if matches!(**os, object_store::Error::NotFound { .. }) =>
                    {
                        "missing: it was listed when the batch was planned and has since been \
                         deleted; restore it, or delete the batch plan to skip it"
                            .to_string()
                    }
                    // The file reads whole with the pinned schema; the query
                    // fails on its values: the query's fault, not the file's.
                    _ if !unreadable => format!(
                        "{} fine, but query.sql fails on {} values{}: {}. Fix the query (for \
                         example TRY_CAST instead of CAST, or a WHERE that keeps such rows \
                         out), then run again",
                        if self.reads_kinesis() {
                            "the records read"
                        } else {
                            "the file reads"
                        },
                        if self.reads_kinesis() { "their" } else { "its" },
                        if self.pipeline.statics.is_empty() {
                            String::new()
                        } else {
                            format!(
                                " (or on those of a static table it joins: {})",
                                self.pipeline
                                    .statics
                                    .iter()
                                    .map(|t| t.table.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        },
                        e.to_string().trim()
                    ),
                    _ => String::new(),
                };
                let reason = e.to_string().trim().to_string();
                // Read once: the error's message and a quarantine record
                // both say it.
                let (why, message) = if message.is_empty() {
                    let why = self.why_unreadable(access, f, &reason).await;
                    let message = format!("{why}; {}", self.fix_advice());
                    (why, message)
                } else {
                    (reason.clone(), message)
                };
                return Some(Culprit {
                    key: f.key.clone(),
                    message,
                    reason,
                    why,
                    unreadable,
                    gone,
                });
            }
        }
        None
    }

    /// The error of a task that failed with `original`, naming the input
    /// at fault if one was found.
    pub(super) fn attribute(&self, id: TaskId, culprit: Option<Culprit>, original: Error) -> Error {
        let batch = id.batch;
        if let Some(c) = culprit {
            return Error::Input {
                pipeline: self.pipeline.name.clone(),
                batch: Some(batch),
                key: c.key,
                message: c.message,
            };
        }
        match original {
            Error::Execution { message, .. } => Error::Execution {
                pipeline: self.pipeline.name.clone(),
                batch,
                task: Some(id.task),
                message,
                class: ErrorClass::Fatal,
            },
            other => other,
        }
    }
}

/// The input a failed task was found to fail on.
pub(super) struct Culprit {
    pub(super) key: String,
    /// The error to report, with what to do.
    pub(super) message: String,
    /// The reader's error alone.
    pub(super) reason: String,
    /// Why, as a quarantine record says it: the first bad line where one
    /// is found, else the reader's error.
    pub(super) why: String,
    /// The file cannot be read (rather than the query failing on its values).
    pub(super) unreadable: bool,
    /// The file was deleted since it was planned.
    pub(super) gone: bool,
}

/// Whether a read failed because the object is not there.
pub(super) fn is_not_found(e: &DataFusionError) -> bool {
    match e.find_root() {
        DataFusionError::ObjectStore(os) => matches!(**os, object_store::Error::NotFound { .. }),
        _ => false,
    }
}
