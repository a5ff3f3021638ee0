//! Schema drift: before a task reads its files with the batch's schema,
//! each file's own columns are compared with it. A column missing, renamed,
//! added, of a type that does not cast to the pinned one without loss, or
//! (CSV, read by position) in another order would be read silently as
//! nulls, truncated or shifted values. Under `on_schema_change = "fail"`
//! the batch fails instead, naming the file, the columns and both types;
//! under `add-columns` and `rescue` such a file is read apart, by its own
//! column names (`adapt`).

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::prelude::SessionContext;

use super::SqlOperator;
use crate::checkpoint::InputFile;
use crate::error::{Error, Result};
use crate::pipeline::schema::{Drift, DriftCheck, drift};
use crate::pipeline::{RESCUED, SchemaChangePolicy, SourceFormat};
use crate::storage::ScanAccess;
use crate::storage::fanout::concurrently;

/// What the drift check made of a task's files.
#[derive(Default)]
pub(super) struct Checked<'a> {
    /// Files whose schema cannot be read at all, with the reader's error.
    pub unreadable: Vec<(&'a InputFile, String)>,
    /// Files deleted since they were planned.
    pub gone: Vec<&'a InputFile>,
    /// Files whose columns differ in a way the schema policy takes: read
    /// apart, by their own column names, and adapted (`adapt`), each with
    /// its own schema.
    pub adapted: Vec<(&'a InputFile, SchemaRef)>,
}

/// A text type.
fn is_text(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// A column name `names` holds more than once.
fn duplicate_column(names: &[String]) -> Option<String> {
    let mut seen = std::collections::HashSet::new();
    names.iter().find(|n| !seen.insert(n.as_str())).cloned()
}

/// A Parquet file's own top-level column names and its row count, from
/// its footer (in the session's metadata cache once its schema was
/// inferred); `None` if it cannot be read (inference then said why).
async fn parquet_facts(
    state: &datafusion::execution::SessionState,
    store: &Arc<dyn object_store::ObjectStore>,
    meta: &object_store::ObjectMeta,
) -> Option<(Vec<String>, i64)> {
    use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
    let cache = state.runtime_env().cache_manager.get_file_metadata_cache();
    let md = DFParquetMetadata::new(store.as_ref(), meta)
        .with_file_metadata_cache(Some(cache))
        .fetch_metadata()
        .await
        .ok()?;
    let file = md.file_metadata();
    let names = file
        .schema_descr()
        .root_schema()
        .get_fields()
        .iter()
        .map(|f| f.name().to_string())
        .collect();
    Some((names, file.num_rows()))
}

/// A file's schema as inference gave it, with (Parquet) its own top-level
/// column names and row count from its footer.
struct Inferred {
    schema: datafusion::error::Result<SchemaRef>,
    facts: Option<(Vec<String>, i64)>,
}

/// Whether a column the schema holds as text is of another type in `file`
/// (numbers in a column pinned from nulls): the value reads as its text,
/// but only by the file's own type, read apart.
fn retyped_to_text(pinned: &Schema, file: &Schema) -> bool {
    pinned.fields().iter().any(|p| {
        is_text(p.data_type())
            && file
                .field_with_name(p.name())
                .is_ok_and(|f| !is_text(f.data_type()) && f.data_type() != &DataType::Null)
    })
}

/// The columns `d` found added that have a type in `file`: columns null
/// throughout the file hold nothing to add or rescue.
fn typed_new<'d>(d: &'d Drift, file: &Schema) -> Vec<&'d String> {
    d.added
        .iter()
        .filter(|n| {
            file.field_with_name(n)
                .is_ok_and(|f| f.data_type() != &DataType::Null)
        })
        .collect()
}

/// Why the schema `policy` refuses a file whose columns drifted as `d`
/// (`typed_new`: its added columns that have a type); `None` if it takes it.
/// `stream`: the input is a record stream's range, not a file (what the
/// records come from: a "topic" or a "stream").
fn refusal(
    policy: SchemaChangePolicy,
    d: &Drift,
    typed_new: &[&String],
    stream: Option<&str>,
    table: bool,
) -> Option<String> {
    match policy {
        // A Delta table's files are its versions': the table's schema
        // changed since the pipeline pinned it.
        SchemaChangePolicy::Fail if table => Some(format!(
            "its columns do not match the Delta table's schema as this pipeline pinned it: \
             {d}. A later version of the table changed its schema (ALTER TABLE ADD COLUMNS, \
             or an append that merged a new schema). To take new columns, set \
             source.on_schema_change = \"add-columns\" (they join the output) or \"rescue\" \
             (what does not fit goes into {RESCUED}); to read the table with its new schema \
             from the start, run `sluice reset` on the pipeline file"
        )),
        // A topic's records cannot be replaced, and add-columns is not
        // taken for a topic yet.
        SchemaChangePolicy::Fail if stream.is_some() => Some(format!(
            "its records' columns do not match the pinned source schema: {d}. To take such \
             records as they come, set source.on_schema_change = \"rescue\" (what does not \
             fit goes into {RESCUED}); if the {} changed for good, declare source.schema \
             with the new columns and run `sluice reset` on the pipeline file",
            stream.unwrap_or_default()
        )),
        SchemaChangePolicy::Fail => Some(format!(
            "its columns do not match the pinned source schema: {d}. Fix or replace the \
             file (same key); to take such files as they come, set \
             source.on_schema_change = \"add-columns\" (new columns join the output) or \
             \"rescue\" (what does not fit goes into {RESCUED}); if the source changed \
             for good, declare source.schema with the new columns and run `sluice reset` \
             on the pipeline file"
        )),
        SchemaChangePolicy::AddColumns if table && !d.retyped.is_empty() => Some(format!(
            "a column of the Delta table changed type, which add-columns does not take: {d}. \
             Set source.on_schema_change = \"rescue\" to keep such values in {RESCUED}, or run \
             `sluice reset` on the pipeline file to read the table anew with its new schema"
        )),
        SchemaChangePolicy::AddColumns if !d.retyped.is_empty() => Some(format!(
            "a column changed type, which add-columns does not take: {d}. Fix or replace \
             the file (same key), or set source.on_schema_change = \"rescue\" to keep \
             such values in {RESCUED}"
        )),
        SchemaChangePolicy::AddColumns if !typed_new.is_empty() => Some(format!(
            "it has column(s) the batch's plan did not see ({}): it was replaced since \
             the batch was planned; the batch's plan is dropped and the next run plans \
             afresh",
            typed_new
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        _ => None,
    }
}

impl SqlOperator {
    /// What of a file's inferred schema is compared for this source: names
    /// and types for Parquet and JSON (where a missing key is a null), names
    /// and their order for CSV with a header (read by position; the types
    /// belong to each value); nothing for CSV without one (columns are by
    /// position). Once the policy takes schema changes, a column a Parquet
    /// file lacks reads as null; in a Delta table's files it always does
    /// (an older file lacks the columns a later version added), and finer
    /// timestamps read cut to the table's microseconds.
    fn drift_check(&self) -> Option<DriftCheck> {
        let s = &self.pipeline.source;
        let delta = self.reads_table();
        match s.format {
            SourceFormat::Parquet => Some(DriftCheck {
                types: true,
                absent_is_null: s.on_schema_change != SchemaChangePolicy::Fail || delta,
                order: false,
                reads_text: false,
                table_units: delta,
            }),
            SourceFormat::Jsonl => Some(DriftCheck {
                types: true,
                absent_is_null: true,
                order: false,
                reads_text: true,
                table_units: delta,
            }),
            SourceFormat::Csv if s.header => Some(DriftCheck {
                types: false,
                absent_is_null: false,
                order: true,
                reads_text: false,
                table_units: delta,
            }),
            SourceFormat::Csv => None,
        }
    }

    /// The schema DataFusion infers from each of `files` (concurrently), by
    /// key; the reader's error for a file it cannot read.
    pub(crate) async fn file_schemas(
        &self,
        access: &ScanAccess,
        files: &[InputFile],
    ) -> Result<Vec<(String, std::result::Result<SchemaRef, String>)>> {
        let format = Self::inference_format(&self.pipeline);
        let state = Arc::new(self.scan_session(access).state());
        let parquet = self.pipeline.source.format == SourceFormat::Parquet;
        concurrently(files.to_vec(), |f| {
            let (format, state) = (format.clone(), state.clone());
            let (store, meta) = (access.store.clone(), Self::object_meta(access, &f));
            async move {
                let mut schema = format
                    .infer_schema(state.as_ref(), &store, std::slice::from_ref(&meta))
                    .await;
                // A Parquet file with no rows gives no column a type.
                if parquet
                    && schema.is_ok()
                    && parquet_facts(&state, &store, &meta)
                        .await
                        .is_some_and(|(_, rows)| rows == 0)
                {
                    schema = Ok(Arc::new(datafusion::arrow::datatypes::Schema::empty()));
                }
                Ok((f.key, schema.map_err(|e| e.to_string().trim().to_string())))
            }
        })
        .await
    }

    /// Whether the source is a Delta table (whose log types its columns).
    fn reads_table(&self) -> bool {
        self.pipeline.source.discovery == crate::pipeline::DiscoveryMode::Delta
    }

    /// What the source's records come from, if it is a record stream
    /// (whose records cannot be fixed): a "topic" or a "stream".
    fn reads_topic(&self) -> Option<&'static str> {
        if self.reads_kinesis() {
            Some("stream")
        } else {
            self.pipeline.source.location.is_stream().then_some("topic")
        }
    }

    /// The schema of a JSON Lines file's good lines (those that are JSON
    /// objects), when its bad lines are set aside row by row; `None` for
    /// other formats or policies, or when no line is good.
    async fn good_lines_schema(
        &self,
        access: &ScanAccess,
        f: &InputFile,
    ) -> Result<Option<SchemaRef>> {
        let s = &self.pipeline.source;
        if s.format != SourceFormat::Jsonl || s.on_bad_row == crate::pipeline::BadRowPolicy::Fail {
            return Ok(None);
        }
        let Some(Ok(bytes)) = self.read_text(access, f).await? else {
            return Ok(None);
        };
        let text = String::from_utf8_lossy(&bytes);
        let good: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(serde_json::Value::is_object)
            .collect();
        if good.is_empty() {
            return Ok(None);
        }
        Ok(
            datafusion::arrow::json::reader::infer_json_schema_from_iterator(
                good.into_iter().map(Ok),
            )
            .ok()
            .map(Arc::new),
        )
    }

    /// Compare each of `files` (concurrently) with the batch's schema. A
    /// file that differs in a way the schema policy does not take fails the
    /// task, named; one it takes is to be read apart. Returns those, and the
    /// files whose schema cannot be read at all.
    pub(super) async fn check_drift<'a>(
        &self,
        session: &SessionContext,
        access: &ScanAccess,
        batch: u64,
        files: &[&'a InputFile],
    ) -> Result<Checked<'a>> {
        let Some(check) = self.drift_check() else {
            return Ok(Checked::default());
        };
        let found = self.infer_each(session, access, files).await?;
        // `_rescued` and `_corrupt_record` are filled, never read from a file.
        let pinned = self.file_schema();
        let policy = self.pipeline.source.on_schema_change;
        let user_typed = self.user_typed(&pinned);
        let mut checked = Checked::default();
        for (i, Inferred { schema, facts }) in found.into_iter().enumerate() {
            let schema = match schema {
                Err(e) if super::is_not_found(&e) => {
                    checked.gone.push(files[i]);
                    continue;
                }
                Err(e) => {
                    // Malformed lines fail inference, and the file is then
                    // read row by row with the pinned schema: under `fail`,
                    // keys its good lines hold beyond that schema are
                    // still a change the policy refuses, not dropped. (A
                    // value of another type is the row policy's: cast, or
                    // a bad row.)
                    if policy == SchemaChangePolicy::Fail
                        && let Some(good) = self.good_lines_schema(access, files[i]).await?
                        && let Some(mut d) = drift(&pinned, &good, check, &user_typed)
                        && !d.added.is_empty()
                        && let Some(message) = {
                            d.missing.clear();
                            d.retyped.clear();
                            d.reordered = None;
                            refusal(
                                policy,
                                &d,
                                &typed_new(&d, &good),
                                self.reads_topic(),
                                self.reads_table(),
                            )
                        }
                    {
                        return Err(Error::Input {
                            pipeline: self.pipeline.name.clone(),
                            batch: Some(batch),
                            key: files[i].key.clone(),
                            message,
                        });
                    }
                    checked
                        .unreadable
                        .push((files[i], e.to_string().trim().to_string()));
                    continue;
                }
                Ok(schema) => schema,
            };
            // A name twice: a reader keeps one of the columns and drops the
            // other without a word.
            let names: Vec<String> = match &facts {
                Some((names, _)) => names.clone(),
                None => schema.fields().iter().map(|f| f.name().clone()).collect(),
            };
            if let Some(dup) = duplicate_column(&names) {
                checked.unreadable.push((
                    files[i],
                    format!(
                        "column {dup} appears more than once in the file, so one of them would \
                         be dropped; rename the columns in the file"
                    ),
                ));
                continue;
            }
            // A Parquet file with no rows has nothing to read wrongly.
            if facts.as_ref().is_some_and(|(_, rows)| *rows == 0) {
                continue;
            }
            let to_text = retyped_to_text(&pinned, &schema);
            let Some(d) = drift(&pinned, &schema, check, &user_typed) else {
                if to_text && self.pipeline.source.format != SourceFormat::Csv {
                    checked.adapted.push((files[i], schema));
                }
                continue;
            };
            let typed_new = typed_new(&d, &schema);
            if let Some(message) = refusal(
                policy,
                &d,
                &typed_new,
                self.reads_topic(),
                self.reads_table(),
            ) {
                return Err(Error::Input {
                    pipeline: self.pipeline.name.clone(),
                    batch: Some(batch),
                    key: files[i].key.clone(),
                    message,
                });
            }
            // CSV is read by position: any change of its header is read
            // apart, by name. Parquet and JSON read missing columns as null
            // in the scan; what they hold beyond the schema, or in another
            // type, is read apart (rescue).
            let apart = self.pipeline.source.format == SourceFormat::Csv
                || !d.retyped.is_empty()
                || !typed_new.is_empty()
                || to_text;
            if apart {
                checked.adapted.push((files[i], schema));
            }
        }
        Ok(checked)
    }

    /// The schema DataFusion infers from each of `files` (concurrently), in
    /// order, with a Parquet file's own column list and row count.
    async fn infer_each(
        &self,
        session: &SessionContext,
        access: &ScanAccess,
        files: &[&InputFile],
    ) -> Result<Vec<Inferred>> {
        let format = Self::inference_format(&self.pipeline);
        let state = std::sync::Arc::new(session.state());
        let owned: Vec<InputFile> = files.iter().map(|f| (*f).clone()).collect();
        let parquet = self.pipeline.source.format == SourceFormat::Parquet;
        concurrently(owned, |f| {
            let (format, state) = (format.clone(), state.clone());
            let (store, meta) = (access.store.clone(), Self::object_meta(access, &f));
            let shapes = self
                .shapes
                .get(&f.key)
                .map(|s| Self::object_meta(access, s));
            async move {
                // From the shapes when they read; from every line when not,
                // so an error names the file's own line.
                let from_shapes = match &shapes {
                    Some(s) => format
                        .infer_schema(state.as_ref(), &store, std::slice::from_ref(s))
                        .await
                        .ok(),
                    None => None,
                };
                let schema = match from_shapes {
                    Some(schema) => Ok(schema),
                    None => {
                        format
                            .infer_schema(state.as_ref(), &store, std::slice::from_ref(&meta))
                            .await
                    }
                };
                // Schema inference merges a Parquet file's columns by name:
                // its own list (and row count) come from its footer, which
                // inference left in the session's cache.
                let facts = match (&schema, parquet) {
                    (Ok(_), true) => parquet_facts(&state, &store, &meta).await,
                    _ => None,
                };
                Ok(Inferred { schema, facts })
            }
        })
        .await
    }

    /// The columns of `pinned` the pipeline file types (declared, or hinted
    /// in any case): JSON values are read into their types.
    fn user_typed(&self, pinned: &Schema) -> Vec<String> {
        let source = &self.pipeline.source;
        let hints = source.hints();
        pinned
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .filter(|n| {
                source.schema.is_some() || hints.iter().any(|(h, _)| h.eq_ignore_ascii_case(n))
            })
            .collect()
    }

    /// A file whose schema cannot be read at all.
    /// (A CSV or JSON Lines file names its first bad line, counted as an
    /// editor counts it.)
    pub(super) async fn unreadable(
        &self,
        access: &ScanAccess,
        batch: u64,
        f: &InputFile,
        e: impl std::fmt::Display,
    ) -> Error {
        let e = e.to_string();
        let message = if e.to_lowercase().contains("precondition") {
            "replaced since the batch was planned (it no longer has the planned ETag), so it is \
             not read: the batch's plan is dropped and the next run plans afresh with the new \
             version"
                .to_string()
        } else {
            let why = self.why_unreadable(access, f, &e).await;
            format!("{why}; {}", self.fix_advice())
        };
        Error::Input {
            pipeline: self.pipeline.name.clone(),
            batch: Some(batch),
            key: f.key.clone(),
            message,
        }
    }
}
