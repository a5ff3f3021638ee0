//! Static tables (`[[static]]`): relations the query joins the input
//! with, read whole. Each batch reads a static table as it stood when the
//! batch was planned: the plan lists its files (keys, sizes, entity tags)
//! and infers its columns ([`pin`]), tasks read exactly those files,
//! pinned to their tags, and the commit record names the version, so a
//! replayed batch joins the same rows. A static table replaced after the
//! plan fails the batch (its files are read `If-Match` where the store
//! gives tags, and each task lists the table again after reading it, which
//! also catches a local file replaced in place); the next run plans the
//! batch afresh.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::datasource::MemTable;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::file_format::csv::CsvFormat;
use datafusion::datasource::file_format::json::JsonFormat;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::prelude::SessionContext;

use super::scan::BatchTable;
use crate::checkpoint::{InputFile, StaticPin};
use crate::error::{Error, Result};
use crate::pipeline::schema::{columns_of, schema_of};
use crate::pipeline::{Pipeline, SourceFormat, StaticTable};
use crate::storage::{ScanAccess, Store};

/// The scheme of the object store URLs static tables are read through
/// (one per table, apart from the source's).
pub(crate) const URL_SCHEME: &str = "sluice-static-";

/// How a static table's files are read.
fn format_of(t: &StaticTable) -> Arc<dyn FileFormat> {
    match t.format {
        SourceFormat::Parquet => Arc::new(ParquetFormat::default()),
        SourceFormat::Csv => Arc::new(CsvFormat::default().with_has_header(t.header)),
        SourceFormat::Jsonl => {
            Arc::new(JsonFormat::default().with_schema_infer_max_rec(usize::MAX))
        }
    }
}

/// Whether a key is a file of the table (not a hidden or underscore file
/// or folder, as Spark and Hive skip them).
fn is_data(key: &str) -> bool {
    !key.split('/')
        .any(|s| s.is_empty() || s.starts_with('_') || s.starts_with('.'))
}

/// A static table as it stands now: its files (one listing), refused
/// above its `max_bytes` or without files, and its columns inferred from
/// them.
pub(crate) async fn pin(
    pipeline: &Pipeline,
    t: &StaticTable,
    store: &Arc<dyn Store>,
) -> Result<StaticPin> {
    let refuse = |message: String| Error::Spec {
        file: pipeline.name.clone(),
        message: format!(
            "[[static]] table {} ({}): {message}",
            t.table,
            t.location.display()
        ),
    };
    if t.delta {
        let Some((version, files, schema)) =
            crate::discovery::delta_static_snapshot(store, &pipeline.name).await?
        else {
            return Err(refuse(
                "it holds no Delta table (no _delta_log/ commit): create the table, or name \
                 its format"
                    .into(),
            ));
        };
        let bytes: u64 = files.iter().map(|f| f.size).sum();
        if bytes > t.max_bytes {
            return Err(refuse(format!(
                "its live files hold {bytes} bytes, above its max_bytes ({}): every task reads \
                 a static table whole; raise max_bytes if the functions' memory holds it",
                t.max_bytes
            )));
        }
        return Ok(StaticPin {
            table: t.table.clone(),
            files,
            columns: columns_of(&schema),
            version,
        });
    }
    let mut files: Vec<InputFile> = store
        .list("", None)
        .await?
        .into_iter()
        .filter(|m| is_data(&m.key))
        .map(|m| InputFile {
            key: m.key,
            size: m.size,
            etag: m.etag,
            modified_ms: m.last_modified.map(|t| t.timestamp_millis()),
            partition: None,
        })
        .collect();
    files.sort_by(|a, b| a.key.cmp(&b.key));
    if files.is_empty() {
        return Err(refuse(
            "it holds no file: put the table's files there (every batch reads it whole)".into(),
        ));
    }
    let bytes: u64 = files.iter().map(|f| f.size).sum();
    if bytes > t.max_bytes {
        return Err(refuse(format!(
            "its files hold {bytes} bytes, above its max_bytes ({}): every task reads a static \
             table whole; raise max_bytes if the functions' memory holds it",
            t.max_bytes
        )));
    }
    let access = store.scan_access()?;
    let metas: Vec<object_store::ObjectMeta> = files.iter().map(|f| meta(&access, f)).collect();
    let session = SessionContext::new();
    // CSV is read by position: every file must name the same columns in
    // the same order (a file ordering them otherwise would be read into
    // the wrong columns, one with other columns would fail every batch).
    if t.format == SourceFormat::Csv && t.header && files.len() > 1 {
        let mut first: Option<(String, Vec<String>)> = None;
        for (f, m) in files.iter().zip(&metas) {
            let names: Vec<String> = format_of(t)
                .infer_schema(&session.state(), &access.store, std::slice::from_ref(m))
                .await
                .map_err(|e| refuse(format!("{}: its columns cannot be inferred: {e}", f.key)))?
                .fields()
                .iter()
                .map(|c| c.name().clone())
                .collect();
            match &first {
                None => first = Some((f.key.clone(), names)),
                Some((k, want)) if *want != names => {
                    return Err(refuse(format!(
                        "{} has the columns ({}), and {k} ({}): a CSV static table's files are \
                         read by position, so each must have the same header; rewrite or \
                         remove the file",
                        f.key,
                        names.join(", "),
                        want.join(", ")
                    )));
                }
                Some(_) => {}
            }
        }
    }
    let schema = format_of(t)
        .infer_schema(&session.state(), &access.store, &metas)
        .await
        .map_err(|e| {
            refuse(format!(
                "its columns cannot be inferred: {e} (a file being written or replaced \
                 meanwhile? the next run lists the table again)"
            ))
        })?;
    if schema.fields().is_empty() {
        return Err(refuse(
            "its files give no column (empty files?): put the table's rows there".into(),
        ));
    }
    let columns = columns_of(&schema);
    schema_of(&columns).map_err(|e| refuse(format!("column{e}")))?;
    let mut text = String::new();
    for f in &files {
        text.push_str(&format!(
            "{}\u{0}{}\u{0}{}\u{0}{}\n",
            f.key,
            f.size,
            f.etag.as_deref().unwrap_or(""),
            f.modified_ms.unwrap_or(0)
        ));
    }
    Ok(StaticPin {
        table: t.table.clone(),
        version: format!("{:016x}", crate::hash::fnv1a(text.as_bytes())),
        files,
        columns,
    })
}

fn meta(access: &ScanAccess, f: &InputFile) -> object_store::ObjectMeta {
    object_store::ObjectMeta {
        location: access.path(&f.key),
        last_modified: chrono::DateTime::UNIX_EPOCH,
        size: f.size,
        e_tag: f.etag.clone(),
        version: None,
    }
}

/// Register each pinned static table in `ctx` under its name: with no
/// rows (`stores` empty: checking the query), or over its pinned files,
/// read through `stores` (one per table, in the pipeline's order) with
/// their entity tags.
pub(crate) fn register(
    ctx: &SessionContext,
    pipeline: &Pipeline,
    pins: &[StaticPin],
    stores: Option<&[Arc<dyn Store>]>,
) -> Result<()> {
    let sql_err = |e: String| Error::Sql {
        pipeline: pipeline.name.clone(),
        message: e,
    };
    for (i, t) in pipeline.statics.iter().enumerate() {
        let Some(pin) = pins.iter().find(|p| p.table == t.table) else {
            return Err(Error::Run {
                pipeline: pipeline.name.clone(),
                message: format!(
                    "the batch's plan pins no version of static table {}",
                    t.table
                ),
                class: crate::error::ErrorClass::Fatal,
            });
        };
        let schema: SchemaRef = schema_of(&pin.columns).map_err(|e| sql_err(format!("{e}")))?;
        let table: Arc<dyn datafusion::datasource::TableProvider> = match stores {
            None => Arc::new(
                MemTable::try_new(schema, vec![vec![]]).map_err(|e| sql_err(e.to_string()))?,
            ),
            Some(stores) => {
                let access = stores[i].scan_access()?;
                let pinned = access.pinned(
                    pin.files
                        .iter()
                        .map(|f| (f.key.as_str(), f.etag.as_deref())),
                );
                // Its own URL: the source's store stays the source's.
                let url = ObjectStoreUrl::parse(format!("{URL_SCHEME}{i}://t"))
                    .map_err(|e| sql_err(e.to_string()))?;
                ctx.register_object_store(url.as_ref(), pinned.store.clone());
                let files = pin.files.iter().map(|f| (meta(&pinned, f), f)).collect();
                Arc::new(
                    BatchTable::over(schema, format_of(t), url, files, 1)
                        .map_err(|e| sql_err(e.to_string()))?,
                )
            }
        };
        ctx.register_table(t.table.as_str(), table)
            .map_err(|e| sql_err(e.to_string()))?;
    }
    Ok(())
}
