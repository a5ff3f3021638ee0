//! Files read apart under `on_schema_change = "add-columns" | "rescue"`:
//! each file whose columns differ from the batch's schema is read by its
//! own column names (a CSV file by its header, not by position) and adapted
//! to that schema, as one partition of a streaming table the query runs
//! over. A column the file lacks reads as null; a column of a type that
//! holds every value casts. Under `rescue`, the file's columns the schema
//! lacks, and the values a column's type cannot hold (left null in it), go
//! into `_rescued` as one JSON object per row, with the file's key under
//! `_file`: nothing the file holds is dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, StringArray, new_null_array};
use datafusion::arrow::compute::kernels::boolean::{and, not};
use datafusion::arrow::compute::kernels::cmp::distinct;
use datafusion::arrow::compute::{CastOptions, cast_with_options, is_not_null, nullif};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use futures::{StreamExt, TryStreamExt};

use super::SqlOperator;
use super::scan::BatchTable;
use crate::checkpoint::InputFile;
use crate::pipeline::schema::casts_losslessly;
use crate::pipeline::{RESCUED, SourceFormat};
use crate::storage::ScanAccess;

/// Rows and rescued fields the adapted files gave, counted as they pass.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub rows: AtomicU64,
    pub rescued: AtomicU64,
}

impl SqlOperator {
    /// A table over `files` (each with the schema found in it), one
    /// partition per file, each adapted to the batch's schema.
    pub(super) fn adapted_table(
        &self,
        access: &ScanAccess,
        files: &[(InputFile, SchemaRef)],
        tally: &Arc<Tally>,
    ) -> datafusion::error::Result<StreamingTable> {
        let partitions = files
            .iter()
            .map(|(f, found)| {
                Arc::new(FilePartition {
                    op: self.clone(),
                    access: access.clone(),
                    file: f.clone(),
                    read: self.read_schema(found),
                    tally: tally.clone(),
                }) as Arc<dyn PartitionStream>
            })
            .collect();
        StreamingTable::try_new(self.schema.clone(), partitions)
    }

    /// The schema to read a file with: its own columns in its own order.
    /// CSV values are text that the reader parses: a column the batch's
    /// schema has is read as its type there, any other as text. JSON keeps
    /// the file's types, but a column the batch's schema holds as text is
    /// read as text (numbers and booleans as they are written).
    fn read_schema(&self, found: &SchemaRef) -> SchemaRef {
        if self.pipeline.source.format == SourceFormat::Jsonl {
            let fields: Vec<Field> = found
                .fields()
                .iter()
                .map(|f| match self.schema.field_with_name(f.name()) {
                    Ok(t) if t.name() != RESCUED && is_text(t.data_type()) => {
                        Field::new(f.name(), DataType::Utf8, true)
                    }
                    _ => f.as_ref().clone(),
                })
                .collect();
            return Arc::new(Schema::new(fields));
        }
        if self.pipeline.source.format != SourceFormat::Csv {
            return found.clone();
        }
        // Under `rescue`, a column this file holds text in (its values
        // inferred as text) where the schema holds another type is read as
        // text and cast: a value the type cannot hold goes into `_rescued`
        // instead of failing the read.
        let rescue = self
            .schema
            .fields()
            .last()
            .is_some_and(|f| f.name() == RESCUED);
        let fields: Vec<Field> = found
            .fields()
            .iter()
            .map(|f| match self.schema.field_with_name(f.name()) {
                Ok(t)
                    if t.name() != RESCUED
                        && !(rescue && is_text(f.data_type()) && !is_text(t.data_type())) =>
                {
                    Field::new(f.name(), t.data_type().clone(), true)
                }
                _ => Field::new(f.name(), DataType::Utf8, true),
            })
            .collect();
        Arc::new(Schema::new(fields))
    }
}

/// One file read apart, as a partition of [`SqlOperator::adapted_table`].
#[derive(Debug)]
struct FilePartition {
    op: SqlOperator,
    access: ScanAccess,
    file: InputFile,
    /// What the file is read with (its own columns).
    read: SchemaRef,
    tally: Arc<Tally>,
}

impl PartitionStream for FilePartition {
    fn schema(&self) -> &SchemaRef {
        &self.op.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let target = self.op.schema.clone();
        let rescue = target.fields().last().is_some_and(|f| f.name() == RESCUED);
        let (op, access, file, read) = (
            self.op.clone(),
            self.access.clone(),
            self.file.clone(),
            self.read.clone(),
        );
        let tally = self.tally.clone();
        let key = file.key.clone();
        let to = target.clone();
        let opened = async move {
            let stream = if op.pipeline.source.format == SourceFormat::Jsonl {
                // Read here rather than by DataFusion's JSON scan, whose
                // reader cannot take a number or boolean into a text column.
                read_jsonl(&op, &access, &file, read).await?
            } else {
                // A Delta table's partition columns the file lacks are
                // read from the log, after the file's own.
                let mut fields = read.fields().to_vec();
                for (name, _) in file.partition.iter().flatten() {
                    if read.field_with_name(name).is_err()
                        && let Ok(f) = op.schema.field_with_name(name)
                    {
                        fields.push(Arc::new(f.clone()));
                    }
                }
                let table = BatchTable::over(
                    Arc::new(Schema::new(fields)),
                    SqlOperator::format(&op.pipeline),
                    access.url.clone(),
                    vec![(SqlOperator::object_meta(&access, &file), &file)],
                    1,
                )?;
                let session = op.scan_session(&access);
                session
                    .read_table(Arc::new(table))?
                    .execute_stream()
                    .await?
                    .boxed()
            };
            Ok::<_, datafusion::error::DataFusionError>(
                stream
                    .map(move |b| {
                        let b = b?;
                        let (out, rescued) = adapt(&b, &to, rescue, &key)?;
                        tally.rows.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
                        tally.rescued.fetch_add(rescued, Ordering::Relaxed);
                        Ok(out)
                    })
                    .boxed(),
            )
        };
        Box::pin(RecordBatchStreamAdapter::new(
            target,
            futures::stream::once(opened).try_flatten(),
        ))
    }
}

/// A text type.
fn is_text(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// JSON Lines file `file` read whole with `read`, numbers and booleans
/// taken into its text columns as written.
async fn read_jsonl(
    op: &SqlOperator,
    access: &ScanAccess,
    file: &InputFile,
    read: SchemaRef,
) -> datafusion::error::Result<
    futures::stream::BoxStream<'static, datafusion::error::Result<RecordBatch>>,
> {
    use datafusion::error::DataFusionError;
    let text = match op.read_text(access, file).await {
        Ok(Some(Ok(text))) => text,
        Ok(Some(Err(e))) => return Err(DataFusionError::Execution(e)),
        Ok(None) => {
            return Err(DataFusionError::Execution(format!(
                "{} not found",
                file.key
            )));
        }
        Err(e) => return Err(DataFusionError::External(Box::new(e))),
    };
    let reader = datafusion::arrow::json::ReaderBuilder::new(read)
        .with_coerce_primitive(true)
        .build(std::io::Cursor::new(text))?;
    Ok(futures::stream::iter(reader.map(|b| b.map_err(DataFusionError::from))).boxed())
}

/// `batch` (a file's own columns) as `target`'s columns, and how many
/// values went into `_rescued` (when `rescue`).
fn adapt(
    batch: &RecordBatch,
    target: &SchemaRef,
    rescue: bool,
    key: &str,
) -> Result<(RecordBatch, u64), ArrowError> {
    let n = batch.num_rows();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(target.fields().len());
    let mut rescued: Vec<(Field, ArrayRef)> = Vec::new();
    for f in target.fields() {
        if rescue && f.name() == RESCUED {
            continue;
        }
        let column = match batch.column_by_name(f.name()) {
            None => new_null_array(f.data_type(), n),
            Some(c) if c.data_type() == f.data_type() => c.clone(),
            // Not `safe`: a value the cast cannot hold is an error naming
            // it, never a silent NULL (text "1e2" into a decimal).
            Some(c) if !rescue || casts_losslessly(c.data_type(), f.data_type()) => {
                cast_with_options(
                    c,
                    f.data_type(),
                    &CastOptions {
                        safe: false,
                        ..Default::default()
                    },
                )
                .map_err(|e| {
                    ArrowError::CastError(format!(
                        "column {}: {e}; fix the value, or set source.on_schema_change = \
                         \"rescue\" to keep what does not fit in _rescued",
                        f.name()
                    ))
                })?
            }
            Some(c) => {
                let (kept, lost) = split_lossy(c, f.data_type())?;
                if lost.null_count() < n {
                    rescued.push((Field::new(f.name(), c.data_type().clone(), true), lost));
                }
                kept
            }
        };
        columns.push(column);
    }
    if rescue {
        for (f, c) in batch.schema().fields().iter().zip(batch.columns()) {
            if target.field_with_name(f.name()).is_err()
                && f.data_type() != &DataType::Null
                && c.null_count() < n
            {
                rescued.push((Field::new(f.name(), f.data_type().clone(), true), c.clone()));
            }
        }
        let count = rescued
            .iter()
            .map(|(_, c)| (c.len() - c.null_count()) as u64)
            .sum();
        columns.push(Arc::new(rescued_json(&rescued, n, key)?));
        return Ok((RecordBatch::try_new(target.clone(), columns)?, count));
    }
    Ok((RecordBatch::try_new(target.clone(), columns)?, 0))
}

/// `c` cast to `to`, with the values the cast cannot hold null; and `c`
/// with only those values. Text cannot be held when it does not parse;
/// anything else when it does not come back as it was (1.7 as an integer).
fn split_lossy(c: &ArrayRef, to: &DataType) -> Result<(ArrayRef, ArrayRef), ArrowError> {
    let safe = CastOptions {
        safe: true,
        ..Default::default()
    };
    let kept = cast_with_options(c, to, &safe)?;
    let present = is_not_null(c)?;
    let text = matches!(
        c.data_type(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    );
    let lossy: BooleanArray = if text {
        // Parsed text prints back in its own way ("2024-01-01 00:00" as
        // "2024-01-01T00:00:00"): only a failed parse loses it.
        and(&present, &datafusion::arrow::compute::is_null(&kept)?)?
    } else {
        match cast_with_options(&kept, c.data_type(), &safe).and_then(|back| distinct(&back, c)) {
            Ok(differs) => and(&present, &differs)?,
            // No way back to compare with: every value is rescued.
            Err(_) => present,
        }
    };
    let kept = nullif(&kept, &lossy)?;
    let lost = nullif(c, &not(&lossy)?)?;
    Ok((kept, lost))
}

/// One JSON object per row of the rescued columns' non-null values, with
/// the file's key under `_file`; null for a row with none.
fn rescued_json(
    rescued: &[(Field, ArrayRef)],
    rows: usize,
    key: &str,
) -> Result<StringArray, ArrowError> {
    if rescued.is_empty() {
        return Ok(StringArray::new_null(rows));
    }
    let (fields, columns): (Vec<Field>, Vec<ArrayRef>) = rescued.iter().cloned().unzip();
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?;
    let mut buf = Vec::new();
    {
        let mut w = datafusion::arrow::json::LineDelimitedWriter::new(&mut buf);
        w.write(&batch)?;
        w.finish()?;
    }
    let text = String::from_utf8(buf).map_err(|e| ArrowError::JsonError(e.to_string()))?;
    let file = serde_json::to_string(key).expect("a string serializes");
    let values: Vec<Option<String>> = text
        .lines()
        .map(|line| match line.strip_suffix('}') {
            Some("{") | None => None,
            Some(body) => Some(format!("{body},\"_file\":{file}}}")),
        })
        .collect();
    if values.len() != rows {
        return Err(ArrowError::JsonError(format!(
            "rescued {} rows as JSON, expected {rows}",
            values.len()
        )));
    }
    Ok(StringArray::from(values))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int64Array};
    use datafusion::arrow::datatypes::TimeUnit;

    #[test]
    fn rescue_keeps_what_fits_and_moves_the_rest_to_json() {
        let target = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Int64, true),
            Field::new(RESCUED, DataType::Utf8, true),
        ]));
        let file = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Float64, true),
            Field::new("c", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            file,
            vec![
                Arc::new(Float64Array::from(vec![Some(1.0), Some(1.7), None])),
                Arc::new(StringArray::from(vec![Some("x"), None, None])),
            ],
        )
        .unwrap();
        let (out, count) = adapt(&batch, &target, true, "k/1.parquet").unwrap();
        assert_eq!(count, 2);
        let a = out.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(a.iter().collect::<Vec<_>>(), [Some(1), None, None]);
        assert_eq!(out.column(1).null_count(), 3);
        let r = out
            .column(2)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert_eq!(
            r.iter().collect::<Vec<_>>(),
            [
                Some(r#"{"c":"x","_file":"k/1.parquet"}"#),
                Some(r#"{"a":1.7,"_file":"k/1.parquet"}"#),
                None
            ]
        );
    }

    #[test]
    fn text_is_lost_only_when_it_does_not_parse() {
        let c: ArrayRef = Arc::new(StringArray::from(vec![
            Some("2024-01-01 00:00:00"),
            Some("soon"),
            None,
        ]));
        let (kept, lost) =
            split_lossy(&c, &DataType::Timestamp(TimeUnit::Microsecond, None)).unwrap();
        assert_eq!((kept.null_count(), lost.null_count()), (2, 2));
        assert!(kept.is_valid(0) && lost.is_valid(1));
    }
}
