//! Deduplication within the watermark (`[deduplicate]`), for one state
//! partition of one batch: Spark's `dropDuplicatesWithinWatermark`.
//!
//! - The batch's rows (late ones already dropped by the tasks) are taken
//!   in arrival order: the order the batch planned its files, then row
//!   order within a file (the tasks tag each row with both).
//! - A row whose key is in the state, or was kept earlier in the batch, is
//!   dropped (counted); otherwise it is kept and its key enters the state
//!   with its expiry: its event time plus the watermark delay.
//! - After the batch, keys whose expiry is at or below the watermark in
//!   force for the batch leave the state (Spark evicts after processing,
//!   with the same watermark). Under `keep = "forever"` keys never leave.
//!
//! Keys compare by value with nulls equal to nulls, as Spark's do.

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, Int64Array, UInt32Array};
use datafusion::arrow::compute::{
    SortColumn, cast, concat_batches, filter_record_batch, lexsort_to_indices, take_record_batch,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::RecordBatch;

use crate::operators::dedup::{FILE, ROW, comparable, tagged_schema};
use datafusion::arrow::row::{RowConverter, SortField};

/// The state's column: when a key leaves it, microseconds (null: never).
pub(crate) const EXPIRES: &str = "__sluice_expires_us";

/// What deduplicating one partition of a batch gives.
#[derive(Debug)]
pub(crate) struct Deduped {
    /// The kept rows, in arrival order, with the source's columns.
    pub kept: RecordBatch,
    /// The partition's next state (keys and expiries); no row: no state.
    pub state: RecordBatch,
    /// Rows dropped as duplicates.
    pub dropped: u64,
    /// The earliest expiry in that state, microseconds: once the watermark
    /// reaches it a batch with no input has keys to forget.
    pub next_expiry_us: Option<i64>,
}

/// How keys expire.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expiry<'a> {
    /// The event-time column and the watermark delay, microseconds
    /// (`None`: keys never expire).
    pub event: Option<(&'a str, i64)>,
    /// The watermark in force for the batch, microseconds.
    pub watermark_us: Option<i64>,
}

/// The schema of the state: the key columns (typed as the source's), then
/// [`EXPIRES`].
pub(crate) fn state_schema(source: &Schema, key: &[String]) -> Result<SchemaRef, ArrowError> {
    let mut fields = Vec::with_capacity(key.len() + 1);
    for k in key {
        let f = source.field_with_name(k)?;
        fields.push(Field::new(k, f.data_type().clone(), true));
    }
    fields.push(Field::new(EXPIRES, DataType::Int64, true));
    Ok(Arc::new(Schema::new(fields)))
}

/// Deduplicate `partials` (tagged rows of one partition, from every task of
/// the batch) against `state` (the partition's state in force).
pub(crate) fn dedup(
    source: &Schema,
    key: &[String],
    state: Vec<RecordBatch>,
    partials: Vec<RecordBatch>,
    expiry: Expiry<'_>,
) -> Result<Deduped, ArrowError> {
    let tagged = tagged_schema(source);
    let state_schema = state_schema(source, key)?;
    let rows = concat_batches(&tagged, &partials)?;
    let old = concat_batches(&state_schema, &state)?;
    // Arrival order.
    let order = lexsort_to_indices(
        &[
            SortColumn {
                values: rows.column(tagged.index_of(FILE)?).clone(),
                options: None,
            },
            SortColumn {
                values: rows.column(tagged.index_of(ROW)?).clone(),
                options: None,
            },
        ],
        None,
    )?;
    let rows = take_record_batch(&rows, &order)?;
    let key_of = |b: &RecordBatch, schema: &Schema| -> Result<Vec<ArrayRef>, ArrowError> {
        key.iter()
            .map(|k| Ok(b.column(schema.index_of(k)?).clone()))
            .collect()
    };
    let compared = |b: &RecordBatch, schema: &Schema| -> Result<Vec<ArrayRef>, ArrowError> {
        key_of(b, schema)?.iter().map(comparable).collect()
    };
    let converter = RowConverter::new(
        key.iter()
            .map(|k| {
                Ok(SortField::new(
                    source.field_with_name(k)?.data_type().clone(),
                ))
            })
            .collect::<Result<Vec<_>, ArrowError>>()?,
    )?;
    let held = converter.convert_columns(&compared(&old, &state_schema)?)?;
    let mut seen: HashSet<&[u8]> = held.iter().map(|r| r.data()).collect();
    let incoming = converter.convert_columns(&compared(&rows, &tagged)?)?;
    let mut kept_rows: Vec<u32> = Vec::new();
    for (i, r) in incoming.iter().enumerate() {
        if seen.insert(r.data()) {
            kept_rows.push(i as u32);
        }
    }
    let dropped = (rows.num_rows() - kept_rows.len()) as u64;
    let kept = take_record_batch(&rows, &UInt32Array::from(kept_rows))?;
    // The kept rows' keys enter the state with their expiry.
    let expires: ArrayRef = match expiry.event {
        None => Arc::new(Int64Array::new_null(kept.num_rows())),
        Some((column, delay_us)) => {
            let ts = cast(
                kept.column(tagged.index_of(column)?),
                &DataType::Timestamp(TimeUnit::Microsecond, None),
            )?;
            let ts = cast(&ts, &DataType::Int64)?;
            let ts = ts.as_any().downcast_ref::<Int64Array>().expect("Int64");
            Arc::new(
                ts.iter()
                    .map(|t| t.map(|t| t.saturating_add(delay_us)))
                    .collect::<Int64Array>(),
            )
        }
    };
    let mut columns = key_of(&kept, &tagged)?;
    columns.push(expires);
    let added = RecordBatch::try_new(state_schema.clone(), columns)?;
    let all = concat_batches(&state_schema, [&old, &added])?;
    // Evicted with the watermark the batch ran under.
    let state = match expiry.watermark_us {
        Some(wm) => {
            let e = all.column(state_schema.index_of(EXPIRES)?);
            let e = e.as_any().downcast_ref::<Int64Array>().expect("Int64");
            // A null expiry (keep forever) stays.
            let stays: BooleanArray = e.iter().map(|x| Some(x.is_none_or(|x| x > wm))).collect();
            filter_record_batch(&all, &stays)?
        }
        None => all,
    };
    let source_columns: Vec<usize> = (0..source.fields().len()).collect();
    let expiries = state.column(state_schema.index_of(EXPIRES)?);
    let next_expiry_us = datafusion::arrow::compute::min(
        expiries
            .as_any()
            .downcast_ref::<Int64Array>()
            .expect("Int64"),
    );
    Ok(Deduped {
        kept: kept.project(&source_columns)?,
        state,
        dropped,
        next_expiry_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::dedup::tag;
    use datafusion::arrow::array::{StringArray, TimestampMicrosecondArray};

    const MIN: i64 = 60_000_000;

    fn source() -> Schema {
        Schema::new(vec![
            Field::new("id", DataType::Utf8, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        ])
    }

    /// Rows `(id, minute)` of file `file`.
    fn rows(file: u32, rows: &[(Option<&str>, i64)]) -> RecordBatch {
        let b = RecordBatch::try_new(
            Arc::new(source()),
            vec![
                Arc::new(StringArray::from(
                    rows.iter().map(|r| r.0).collect::<Vec<_>>(),
                )),
                Arc::new(TimestampMicrosecondArray::from(
                    rows.iter().map(|r| r.1 * MIN).collect::<Vec<_>>(),
                )),
            ],
        )
        .unwrap();
        tag(&b, file, 0).unwrap()
    }

    fn ids(b: &RecordBatch) -> Vec<String> {
        let a = b.column(0).as_any().downcast_ref::<StringArray>().unwrap();
        (0..b.num_rows())
            .map(|i| {
                let t = b
                    .column(1)
                    .as_any()
                    .downcast_ref::<TimestampMicrosecondArray>()
                    .unwrap()
                    .value(i)
                    / MIN;
                format!("{}@{t}", if a.is_null(i) { "null" } else { a.value(i) })
            })
            .collect()
    }

    fn run(
        state: Vec<RecordBatch>,
        partials: Vec<RecordBatch>,
        delay_min: i64,
        wm_min: Option<i64>,
    ) -> Deduped {
        dedup(
            &source(),
            &["id".to_string()],
            state,
            partials,
            Expiry {
                event: Some(("ts", delay_min * MIN)),
                watermark_us: wm_min.map(|m| m * MIN),
            },
        )
        .unwrap()
    }

    /// The first row of a key by arrival is kept (file order first, then
    /// row order, whatever order the partials come in); nulls are one key.
    #[test]
    fn the_first_arrival_of_a_key_is_kept() {
        let a = rows(1, &[(Some("x"), 5), (None, 6), (Some("y"), 7), (None, 8)]);
        let b = rows(0, &[(Some("x"), 9), (Some("z"), 1)]);
        let d = run(Vec::new(), vec![a, b], 10, None);
        assert_eq!(ids(&d.kept), ["x@9", "z@1", "null@6", "y@7"]);
        assert_eq!(d.dropped, 2);
        assert_eq!(d.state.num_rows(), 4);
    }

    /// A key in the state drops its rows until the watermark passes its
    /// first event time plus the delay; eviction uses the batch's own
    /// watermark, after the batch's rows (Spark's order).
    #[test]
    fn keys_leave_the_state_once_the_watermark_passes_their_expiry() {
        let first = run(Vec::new(), vec![rows(0, &[(Some("x"), 0)])], 10, None);
        assert_eq!(first.state.num_rows(), 1);
        // Watermark 10 = expiry: the duplicate in this batch is still
        // dropped, then the key leaves.
        let second = run(
            vec![first.state],
            vec![rows(0, &[(Some("x"), 12)])],
            10,
            Some(10),
        );
        assert_eq!((second.kept.num_rows(), second.dropped), (0, 1));
        assert_eq!(second.state.num_rows(), 0);
        let third = run(
            vec![second.state],
            vec![rows(0, &[(Some("x"), 13)])],
            10,
            Some(11),
        );
        assert_eq!(ids(&third.kept), ["x@13"]);
        // Its new expiry is 23: kept at watermark 22.
        assert_eq!(third.state.num_rows(), 1);
    }

    /// Without an event time (keep = "forever") keys never leave.
    #[test]
    fn forever_keeps_every_key() {
        let d = dedup(
            &source(),
            &["id".to_string()],
            Vec::new(),
            vec![rows(0, &[(Some("x"), 0), (Some("x"), 1)])],
            Expiry {
                event: None,
                watermark_us: Some(i64::MAX),
            },
        )
        .unwrap();
        assert_eq!(
            (d.kept.num_rows(), d.dropped, d.state.num_rows()),
            (1, 1, 1)
        );
    }
}
