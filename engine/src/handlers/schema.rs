//! The source schema a run reads with: declared, pinned in `pipeline.json`,
//! or inferred from the first new files; and the changes to a registered
//! spec (format, discovery mode, declared schema) that would make the
//! checkpoint read the source differently, refused.

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::execution::context::SessionContext;

use super::context::Context;
use crate::checkpoint::{Control, Index, InputFile, PipelineRecord, SchemaVersion};
use crate::discovery;
use crate::error::{Error, Result};
use crate::operators::SqlOperator;
use crate::pipeline::schema::{casts_losslessly, columns_of, schema_change, schema_of};
use crate::pipeline::types::type_name;
use crate::pipeline::{CORRUPT_RECORD, ColumnSpec, DERIVED, Pipeline, RESCUED, SchemaChangePolicy};
use crate::storage::ObjectMeta;

/// The schema a new batch reads with: the version `control` holds (once
/// `add-columns` evolved it), else `pinned` as version 1; then the text
/// columns Sluice fills, when asked for: `_corrupt_record`
/// (`corrupt_record = true`) and `_rescued` (`on_schema_change =
/// "rescue"`).
pub(crate) fn in_force(p: &Pipeline, control: Option<&Control>, pinned: &Schema) -> SchemaVersion {
    let mut v = match control.and_then(|c| c.schema.clone()) {
        Some(v) => v,
        None => SchemaVersion {
            version: 1,
            columns: columns_of(pinned),
        },
    };
    v.columns.retain(|c| !DERIVED.contains(&c.name.as_str()));
    let text = |name: &str| ColumnSpec {
        name: name.into(),
        data_type: DataType::Utf8.to_string(),
        nullable: true,
    };
    if p.source.corrupt_record {
        v.columns.push(text(CORRUPT_RECORD));
    }
    if p.source.on_schema_change == SchemaChangePolicy::Rescue {
        v.columns.push(text(RESCUED));
    }
    v
}

/// The Arrow schema of a stored schema version; a type that does not parse
/// is a broken record, named.
pub(crate) fn arrow_of(ctx: &Context, v: &SchemaVersion, key: String) -> Result<SchemaRef> {
    schema_of(&v.columns).map_err(|e| ctx.broken(key, format!("schema version {}{e}", v.version)))
}

/// Under `on_schema_change = "add-columns"`: the schema batch `inputs`
/// reads with, after `current`: the columns of its files that `current`
/// lacks join it, nullable, in the order the files bring them, with the
/// type of the first file that gives one a type (widened where a later
/// file's type does not fit it but it fits the later one); a column null
/// throughout waits for a file with values. Returns the new version and
/// the names added (none: `current` unchanged). One schema read per file;
/// a file whose schema cannot be read adds nothing (its task reports it).
pub(crate) async fn evolve(
    ctx: &Context,
    current: &SchemaVersion,
    inputs: &[InputFile],
) -> Result<(SchemaVersion, Vec<String>)> {
    let p = &ctx.pipeline;
    let hints = p.source.hints();
    check_version_hints_kept(p, current, &hints)?;
    if p.source.on_schema_change != SchemaChangePolicy::AddColumns || inputs.is_empty() {
        return Ok((current.clone(), Vec::new()));
    }
    let access = ctx.source.scan_access()?;
    let op = SqlOperator::new(p.clone(), std::sync::Arc::new(Schema::empty()));
    let found = op.file_schemas(&access, inputs).await?;
    let mut added: Vec<Field> = Vec::new();
    for (key, schema) in found {
        let Ok(schema) = schema else {
            tracing::warn!(pipeline = %p.name, %key, "schema not read at planning; the task decides");
            continue;
        };
        for f in schema.fields() {
            if f.data_type() == &DataType::Null
                || DERIVED.contains(&f.name().as_str())
                || current.columns.iter().any(|c| &c.name == f.name())
            {
                continue;
            }
            let hint = hinted(&hints, f.name()).cloned();
            let typed = if let Some(t) = hint {
                t
            } else if p.source.format == crate::pipeline::SourceFormat::Parquet {
                f.data_type().clone()
            } else {
                crate::pipeline::schema::text_pin(f.data_type())
            };
            match added.iter_mut().find(|a| a.name() == f.name()) {
                None => added.push(Field::new(f.name(), typed, true)),
                Some(_) if hinted(&hints, f.name()).is_some() => {}
                Some(a) => {
                    if !casts_losslessly(f.data_type(), a.data_type())
                        && casts_losslessly(a.data_type(), f.data_type())
                    {
                        *a = a.clone().with_data_type(f.data_type().clone());
                    }
                }
            }
        }
    }
    if added.is_empty() {
        return Ok((current.clone(), Vec::new()));
    }
    let names: Vec<String> = added.iter().map(|f| f.name().clone()).collect();
    tracing::info!(pipeline = %p.name, columns = %names.join(", "), version = current.version + 1, "new columns join the schema");
    let mut columns = current.columns.clone();
    columns.extend(columns_of(&Schema::new(added)));
    Ok((
        SchemaVersion {
            version: current.version + 1,
            columns,
        },
        names,
    ))
}

/// Refuses a schema hint that schema version `current` contradicts: a hint
/// changed since its column joined a later schema version.
fn check_version_hints_kept(
    p: &Pipeline,
    current: &SchemaVersion,
    hints: &[(String, DataType)],
) -> Result<()> {
    for c in &current.columns {
        if let Some(t) = hinted(hints, &c.name)
            && schema_of(std::slice::from_ref(c))
                .ok()
                .is_some_and(|s| s.field(0).data_type() != t)
        {
            return Err(Error::Incompatible {
                pipeline: p.name.clone(),
                message: format!(
                    "source.schema_hints types {} as {}, but schema version {} holds it as {}: \
                     hints type columns when they are first seen. Remove the hint, register a \
                     new pipeline (new name), or run `sluice reset` on the pipeline file to \
                     start over",
                    c.name,
                    type_name(t),
                    current.version,
                    crate::pipeline::types::parse_type(&c.data_type)
                        .map(|t| type_name(&t))
                        .unwrap_or_else(|_| c.data_type.clone())
                ),
            });
        }
    }
    Ok(())
}

/// The source schema: declared, else pinned, else (a Delta table) the
/// table's in its log, else inferred from the first listed input. `None`
/// when there is nothing to infer from.
pub(crate) async fn resolve_schema(
    ctx: &Context,
    record: Option<&PipelineRecord>,
    listed: &[ObjectMeta],
) -> Result<Option<SchemaRef>> {
    let p = &ctx.pipeline;
    let pinned = record
        .map(|r| super::context::pinned_schema(&p.name, r))
        .transpose()?;
    if let Some(r) = record {
        check_source_kept(&r.pipeline, p)?;
    }
    let declared = p.source.declared_schema().map_err(|e| Error::Spec {
        file: p.name.clone(),
        message: format!("source.schema{e}"),
    })?;
    if let Some(declared) = declared {
        if p.source.discovery == crate::pipeline::DiscoveryMode::Delta
            && let Some(table) = discovery::delta_table_schema(&ctx.source, &p.name).await?
        {
            check_declared_against_table(p, &declared, &table)?;
        }
        if let Some(pinned) = &pinned
            && let Some(change) = schema_change(pinned, &declared)
        {
            return Err(Error::Incompatible {
                pipeline: p.name.clone(),
                message: format!(
                    "source schema changed ({change}); register a new pipeline (new name) or \
                     run `sluice reset` on the pipeline file to start over"
                ),
            });
        }
        return Ok(Some(declared));
    }
    if let Some(pinned) = pinned {
        check_hints_kept(p, &pinned)?;
        return Ok(Some(pinned));
    }
    if p.source.discovery == crate::pipeline::DiscoveryMode::Delta {
        return discovery::delta_table_schema(&ctx.source, &p.name).await;
    }
    let candidates = discovery::new_inputs(listed, &Index::default(), p.source.discovery);
    infer_schema(ctx, &candidates).await
}

/// A Delta source's declared `source.schema` against the table's schema
/// in its log: every column of the table declared, none it lacks, each in
/// a type its values read as without loss, nullable where the table's is.
fn check_declared_against_table(p: &Pipeline, declared: &Schema, table: &Schema) -> Result<()> {
    let mut wrong = Vec::new();
    let left_out = crate::pipeline::schema::lacking(table, declared);
    if !left_out.is_empty() {
        wrong.push(format!("it leaves out {}", left_out.join(", ")));
    }
    for d in declared.fields() {
        match table.field_with_name(d.name()) {
            Err(_) => wrong.push(format!("the table has no column {}", d.name())),
            Ok(t) if !casts_losslessly(t.data_type(), d.data_type()) => wrong.push(format!(
                "{} is {} in the table, declared {} (the cast would lose data)",
                d.name(),
                crate::pipeline::types::type_name(t.data_type()),
                crate::pipeline::types::type_name(d.data_type())
            )),
            Ok(t) if t.is_nullable() && !d.is_nullable() => wrong.push(format!(
                "{} may be null in the table (its older files may lack it), declared never null",
                d.name()
            )),
            Ok(_) => {}
        }
    }
    if wrong.is_empty() {
        return Ok(());
    }
    Err(Error::Spec {
        file: p.name.clone(),
        message: format!(
            "source.schema does not fit the Delta table's schema in its log: {}. Declare \
             every column of the table (types may widen), or remove source.schema to read the \
             table with its own",
            wrong.join("; ")
        ),
    })
}

/// The type `schema_hints` gives `column`: a hint of that exact name, else
/// one that differs only in case (as Spark matches them).
fn hinted<'a>(hints: &'a [(String, DataType)], column: &str) -> Option<&'a DataType> {
    hints
        .iter()
        .find(|(n, _)| n == column)
        .or_else(|| hints.iter().find(|(n, _)| n.eq_ignore_ascii_case(column)))
        .map(|(_, t)| t)
}

/// Refuses a schema hint that the pinned schema contradicts: hints type
/// columns when they are first seen (the first run, or a column joining
/// under `on_schema_change = "add-columns"`), they do not retype data
/// already committed.
fn check_hints_kept(p: &Pipeline, pinned: &Schema) -> Result<()> {
    for (name, t) in p.source.hints() {
        let column = pinned
            .fields()
            .iter()
            .find(|f| f.name() == &name)
            .or_else(|| {
                pinned
                    .fields()
                    .iter()
                    .find(|f| f.name().eq_ignore_ascii_case(&name))
            })
            .map(|f| Ok(f.as_ref()))
            .unwrap_or(Err(()));
        let found = match column {
            Ok(f) if f.data_type() == &t => continue,
            Ok(f) => format!("holds {name} as {}", type_name(f.data_type())),
            // Not seen yet: typed when a file brings it (a CSV column
            // joins under `add-columns`; otherwise the file is refused
            // as a schema change, naming the column).
            Err(()) => continue,
        };
        return Err(Error::Incompatible {
            pipeline: p.name.clone(),
            message: format!(
                "source.schema_hints.{name} = \"{}\", but the schema pinned at the first run \
                 {found}: hints type columns when they are first seen. Remove the hint, \
                 register a new pipeline (new name), or run `sluice reset` on the pipeline file \
                 to start over",
                p.source.schema_hints[&name]
            ),
        });
    }
    Ok(())
}

/// Refuses a change of source format or of discovery mode against the
/// registered spec `was`: either would read the source differently from
/// what the checkpoint recorded.
fn check_source_kept(was: &Pipeline, p: &Pipeline) -> Result<()> {
    if was.source.format != p.source.format {
        return Err(Error::Incompatible {
            pipeline: p.name.clone(),
            message: format!(
                "source format changed ({} -> {}); register a new pipeline (new name) or \
                 run `sluice reset` on the pipeline file to start over",
                was.source.format.name(),
                p.source.format.name()
            ),
        });
    }
    if let Some(message) = crate::discovery::Source::of(p).change_from(was.source.discovery) {
        return Err(Error::Incompatible {
            pipeline: p.name.clone(),
            message,
        });
    }
    // A Delta table made from here on (or left behind) would miss batches.
    if was.sink_format != p.sink_format {
        let name = |f: crate::pipeline::SinkFormat| match f {
            crate::pipeline::SinkFormat::Parquet => "parquet",
            crate::pipeline::SinkFormat::Delta => "delta",
        };
        return Err(Error::Incompatible {
            pipeline: p.name.clone(),
            message: format!(
                "sink.format changed ({} -> {}) after this pipeline wrote batches: a Delta \
                 table would hold only some of them, and its readers would miss rows. Keep \
                 sink.format, or run `sluice reset` on the pipeline file to start over in that \
                 format",
                name(was.sink_format),
                name(p.sink_format)
            ),
        });
    }
    // A Delta table's partition columns do not change.
    if p.sink_format == crate::pipeline::SinkFormat::Delta && was.partition_by != p.partition_by {
        return Err(Error::Incompatible {
            pipeline: p.name.clone(),
            message: format!(
                "sink.partition_by changed ({:?} -> {:?}) after this pipeline wrote batches: a \
                 Delta table's partition columns do not change. Keep sink.partition_by, or run \
                 `sluice reset` on the pipeline file to start the table over",
                was.partition_by, p.partition_by
            ),
        });
    }
    // The output so far is in the old sink: a new one would hold only the
    // batches from here on, and readers of either would miss rows.
    if was.sink != p.sink {
        return Err(Error::Incompatible {
            pipeline: p.name.clone(),
            message: format!(
                "sink.uri changed ({} -> {}) after this pipeline wrote to the old one: the new \
                 sink would hold only later batches. Keep sink.uri, register a new pipeline \
                 (new name) for the new sink, or run `sluice reset` on the pipeline file to \
                 start over there (the old sink is left as it is)",
                was.sink.display(),
                p.sink.display()
            ),
        });
    }
    Ok(())
}

/// At most this many files are read to give every column a type.
const MAX_INFER_FILES: usize = 32;

/// The schema inferred from the new files, in processing order, names and
/// types only; `None` while no file gives a column. A file with no columns
/// (zero bytes, or JSON with no keys) gives nothing; a column that is null
/// in every row of the first file (an empty CSV column, a header-only CSV, a
/// pandas all-`None` column) takes its type from the next file that has
/// values, up to [`MAX_INFER_FILES`] files: a `Null` type pinned would drop
/// every later value. A column with no value in any of them is text in
/// CSV and JSON (as Spark and DuckDB infer it) and refused in Parquet,
/// whose writer declared it null (declare `source.schema`).
async fn infer_schema(ctx: &Context, candidates: &[InputFile]) -> Result<Option<SchemaRef>> {
    let p = &ctx.pipeline;
    let FirstColumns {
        mut fields,
        read,
        first_key,
    } = first_columns(ctx, candidates).await?;
    let Some(first_key) = first_key else {
        if read > 0 {
            tracing::info!(pipeline = %p.name, files = read, "no input file has columns yet; the schema waits for one");
        }
        return Ok(None);
    };
    let hints = p.source.hints();
    apply_hints(p, &mut fields, &hints);
    type_untyped(p, &mut fields, read, &first_key)?;
    // A text source's timestamps are pinned fine enough for later values.
    if p.source.format != crate::pipeline::SourceFormat::Parquet {
        for f in fields
            .iter_mut()
            .filter(|f| hinted(&hints, f.name()).is_none())
        {
            let t = crate::pipeline::schema::text_pin(f.data_type());
            *f = f.clone().with_data_type(t);
        }
    }
    // Keep only names and types: file metadata does not belong in the pin.
    let schema = Schema::new(fields);
    let pinned = schema_of(&columns_of(&schema)).map_err(|e| Error::Input {
        pipeline: p.name.clone(),
        batch: None,
        key: first_key,
        message: format!(
            "the inferred schema cannot be pinned: column{e}; declare source.schema instead"
        ),
    })?;
    Ok(Some(pinned))
}

/// The columns the first new files give, as [`infer_schema`] gathers them.
struct FirstColumns {
    /// The first file's columns, each null one typed by the next file
    /// that has values in it.
    fields: Vec<Field>,
    /// Files read.
    read: usize,
    /// The key of the first file that has columns; `None` while none has.
    first_key: Option<String>,
}

/// Read the schemas of `candidates` in order, up to [`MAX_INFER_FILES`],
/// until every column of the first file with columns has a type. Under
/// `on_bad_file = "quarantine"` an unreadable file is passed over.
async fn first_columns(ctx: &Context, candidates: &[InputFile]) -> Result<FirstColumns> {
    let p = &ctx.pipeline;
    let mut fields: Vec<Field> = Vec::new();
    let mut read: usize = 0;
    let mut first_key = None;
    let quarantine = p.source.on_bad_file == crate::pipeline::BadFilePolicy::Quarantine;
    for file in candidates.iter().take(MAX_INFER_FILES) {
        let found = match infer_file(ctx, file).await {
            Ok(found) => found,
            // A poison first upload must not stop a pipeline that sets
            // unreadable files aside: its task will.
            Err(e) if quarantine => {
                tracing::warn!(pipeline = %p.name, key = %file.key, error = %e, "schema not inferred from an unreadable file");
                continue;
            }
            Err(e) => return Err(e),
        };
        read += 1;
        if found.fields().is_empty() {
            continue;
        }
        if fields.is_empty() {
            first_key = Some(file.key.clone());
            fields = found.fields().iter().map(|f| f.as_ref().clone()).collect();
        } else {
            for f in fields
                .iter_mut()
                .filter(|f| f.data_type() == &DataType::Null)
            {
                if let Ok(typed) = found.field_with_name(f.name())
                    && typed.data_type() != &DataType::Null
                {
                    *f = f.clone().with_data_type(typed.data_type().clone());
                }
            }
        }
        if !fields.iter().any(|f| f.data_type() == &DataType::Null) {
            break;
        }
    }
    Ok(FirstColumns {
        fields,
        read,
        first_key,
    })
}

/// Type the columns of `fields` that `hints` name, and add the hinted
/// columns no file has yet where the format reads a missing column as null.
fn apply_hints(p: &Pipeline, fields: &mut Vec<Field>, hints: &[(String, DataType)]) {
    // Schema hints type the named columns (matched as written, else in
    // any case); a hinted column no file has yet joins the schema where a
    // missing column reads as null (JSON; Parquet unless the policy is
    // `fail`), as Auto Loader adds it. In CSV, read by position, it waits
    // for a file that has it (under `add-columns`).
    let absent_is_null = match p.source.format {
        crate::pipeline::SourceFormat::Jsonl => true,
        crate::pipeline::SourceFormat::Parquet => {
            p.source.on_schema_change != SchemaChangePolicy::Fail
        }
        crate::pipeline::SourceFormat::Csv => false,
    };
    for f in fields.iter_mut() {
        if let Some(t) = hinted(hints, f.name()) {
            *f = f.clone().with_data_type(t.clone());
        }
    }
    for (name, t) in hints {
        if absent_is_null && !fields.iter().any(|f| f.name().eq_ignore_ascii_case(name)) {
            fields.push(Field::new(name, t.clone(), true));
        }
    }
}

/// Columns still without a type after the files read (`read` of them; the
/// first with columns is `first_key`): text in CSV and JSON, refused in
/// Parquet, whose writer declared them null.
fn type_untyped(p: &Pipeline, fields: &mut [Field], read: usize, first_key: &str) -> Result<()> {
    let untyped: Vec<String> = fields
        .iter()
        .filter(|f| f.data_type() == &DataType::Null)
        .map(|f| f.name().clone())
        .collect();
    if !untyped.is_empty() {
        if p.source.format == crate::pipeline::SourceFormat::Parquet {
            return Err(Error::Input {
                pipeline: p.name.clone(),
                batch: None,
                key: first_key.to_string(),
                message: format!(
                    "column(s) {} hold only nulls and have no type in the first {read} file(s) \
                     (the writer declared them null): declare source.schema with their types",
                    untyped.join(", ")
                ),
            });
        }
        tracing::info!(pipeline = %p.name, columns = %untyped.join(", "), files = read, "columns with no value in the files read are pinned as text (string)");
        for f in fields
            .iter_mut()
            .filter(|f| f.data_type() == &DataType::Null)
        {
            *f = f.clone().with_data_type(DataType::Utf8);
        }
    }
    Ok(())
}

/// Rows of a CSV file [`csv_timestamps`] looks at: what DataFusion's
/// inference reads.
const INFER_ROWS: usize = 1000;

/// The text columns of a CSV file (`found`, as inferred) whose every
/// non-empty value among the first [`INFER_ROWS`] rows is a timestamp the
/// CSV reader parses. The reader's inference types a column only when its
/// values share one precision (`2024-01-01T02:00:00` beside
/// `2024-01-01T02:00:01.800` is text), where DuckDB and Spark see a
/// timestamp; so does Sluice.
fn csv_timestamps(text: &[u8], header: bool, delimiter: u8, found: &Schema) -> Vec<String> {
    use datafusion::arrow::compute::kernels::cast_utils::string_to_timestamp_nanos;
    let text_cols: Vec<usize> = found
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| f.data_type() == &DataType::Utf8)
        .map(|(i, _)| i)
        .collect();
    if text_cols.is_empty() {
        return Vec::new();
    }
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(header)
        .delimiter(delimiter)
        .flexible(true)
        .from_reader(text);
    // Per text column: seen a value, and every value seen parsed.
    let mut seen = vec![(false, true); text_cols.len()];
    for record in rdr.records().take(INFER_ROWS) {
        let Ok(record) = record else {
            break;
        };
        for (j, &i) in text_cols.iter().enumerate() {
            let value = record.get(i).unwrap_or("").trim();
            if value.is_empty() || !seen[j].1 {
                continue;
            }
            seen[j].0 = true;
            seen[j].1 = string_to_timestamp_nanos(value).is_ok();
        }
    }
    text_cols
        .iter()
        .zip(seen)
        .filter(|(_, (any, all))| *any && *all)
        .map(|(&i, _)| found.field(i).name().clone())
        .collect()
}

/// The schema DataFusion infers from one file (a CSV file's text columns
/// of timestamps of mixed precision typed as timestamps).
async fn infer_file(ctx: &Context, file: &InputFile) -> Result<SchemaRef> {
    let found = infer_file_as_read(ctx, file).await?;
    let p = &ctx.pipeline;
    if p.source.format != crate::pipeline::SourceFormat::Csv
        || !found
            .fields()
            .iter()
            .any(|f| f.data_type() == &DataType::Utf8)
    {
        return Ok(found);
    }
    let access = ctx.source.scan_access()?;
    let op = SqlOperator::new(p.clone(), found.clone());
    let Some(Ok(text)) = op.read_text(&access, file).await? else {
        return Ok(found);
    };
    let timestamps = csv_timestamps(&text, p.source.header, p.source.delimiter, &found);
    if timestamps.is_empty() {
        return Ok(found);
    }
    let fields: Vec<Field> = found
        .fields()
        .iter()
        .map(|f| {
            if timestamps.contains(f.name()) {
                f.as_ref().clone().with_data_type(DataType::Timestamp(
                    datafusion::arrow::datatypes::TimeUnit::Microsecond,
                    None,
                ))
            } else {
                f.as_ref().clone()
            }
        })
        .collect();
    Ok(std::sync::Arc::new(Schema::new(fields)))
}

/// The schema DataFusion infers from one file, as its reader infers it.
async fn infer_file_as_read(ctx: &Context, file: &InputFile) -> Result<SchemaRef> {
    let p = &ctx.pipeline;
    let access = ctx.source.scan_access()?;
    let format = SqlOperator::format(p);
    let session = SessionContext::new();
    let meta = object_store::ObjectMeta {
        location: access.path(&file.key),
        last_modified: chrono::Utc::now(),
        size: file.size,
        e_tag: None,
        version: None,
    };
    format
        .infer_schema(&session.state(), &access.store, &[meta])
        .await
        .map_err(|e| Error::Input {
            pipeline: p.name.clone(),
            batch: None,
            key: file.key.clone(),
            message: if p.source.discovery == crate::pipeline::DiscoveryMode::Kinesis {
                format!(
                    "cannot infer the source schema from the stream's first records: {e}; \
                     declare source.schema"
                )
            } else {
                format!(
                    "cannot infer the source schema from it: {e}; fix the file or declare \
                     source.schema"
                )
            },
        })
}

/// What planning the query against the hinted columns alone found, before
/// any file gave the schema.
pub(crate) enum HintCheck {
    /// It plans: the hints cover every column it names (this many hints).
    Planned(usize),
    /// It names a column no hint covers (the planner's first line): the
    /// rest waits for the first file.
    Waits(String),
}

/// With no file yet and no declared schema, plan the query against the
/// hinted columns alone (none without hints): what does not depend on the
/// columns still to come (its syntax, its tables and joins, the hinted
/// columns' types) is refused now, as a run with files would refuse it.
pub(crate) async fn check_against_hints(
    ctx: &Context,
    control: Option<&Control>,
) -> Result<HintCheck> {
    let p = &ctx.pipeline;
    let hinted = Schema::new(
        p.source
            .hints()
            .into_iter()
            .map(|(name, t)| Field::new(name, t, true))
            .collect::<Vec<_>>(),
    );
    let n = hinted.fields().len();
    let reading = in_force(p, control, &hinted);
    let reading = arrow_of(ctx, &reading, crate::paths::checkpoint::CONTROL.into())?;
    match ctx.checking_operator(reading).await?.check().await {
        Ok(_) => Ok(HintCheck::Planned(n)),
        // DataFusion's "No field named", or Sluice's own "has no column"
        // (a window's time column): only a column the schema lacks yet.
        Err(e)
            if ["No field named", "has no column"]
                .iter()
                .any(|m| e.to_string().contains(m)) =>
        {
            Ok(HintCheck::Waits(
                e.to_string().lines().next().unwrap_or_default().to_string(),
            ))
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first hour's case: `sluice gen taxi --format csv` writes pickup
    /// times with and without fractions; the reader's inference made the
    /// column text. Hand-checked columns: `a` mixes whole and fractional
    /// seconds (a timestamp); `b` mixes a word in (text); `c` is a number;
    /// `d` is empty (left to the empty-column rule).
    #[test]
    fn csv_timestamps_of_mixed_precision_are_timestamps() {
        let found = Schema::new(vec![
            Field::new("a", DataType::Utf8, true),
            Field::new("b", DataType::Utf8, true),
            Field::new("c", DataType::Int64, true),
            Field::new("d", DataType::Utf8, true),
        ]);
        let text = b"a,b,c,d\n2024-01-01T02:00:00,x,1,\n2024-01-01T02:00:01.800,2024-01-01T00:00:00,2,\n,2024-01-01 00:00:00.5+02:00,3,\n";
        assert_eq!(csv_timestamps(text, true, b',', &found), ["a"]);
        // Offsets and a space for the T are timestamps too.
        let text = b"a,b,c,d\n2024-01-01T02:00:00,2024-01-01 00:00:00,1,\n2024-01-01T02:00:01.800,2024-01-01T00:00:00.25+01:00,2,\n";
        assert_eq!(csv_timestamps(text, true, b',', &found), ["a", "b"]);
        // Without a header, by position.
        let text = b"2024-01-01T02:00:00,x,1,\n";
        assert_eq!(csv_timestamps(text, false, b',', &found), ["a"]);
    }
}
