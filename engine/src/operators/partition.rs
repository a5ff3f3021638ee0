//! Hash partitioning of aggregate states by their group key, with a hash
//! of Sluice's own: the partition a key lands in is persisted (state files
//! per partition), so it must be the same in every process, release and CPU.
//! DataFusion's hasher (foldhash) is not stable across versions or between
//! x86 and arm64 Lambdas, and Arrow's row format is not stable across
//! releases; this encodes each value itself and hashes it with FNV-1a.

use datafusion::arrow::array::{Array, ArrayRef, AsArray, UInt32Array};
use datafusion::arrow::compute::{cast, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type, UInt64Type};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::RecordBatch;

use crate::hash::Fnv;

/// The partition (of `n`) of each row of `batch`, by the values of the
/// columns `keys`.
pub(crate) fn partitions_of(
    batch: &RecordBatch,
    keys: &[usize],
    n: u32,
) -> Result<Vec<u32>, ArrowError> {
    let mut hashers = vec![Fnv::new(); batch.num_rows()];
    for &k in keys {
        let field = batch.schema().field(k).clone();
        feed(&mut hashers, batch.column(k), field.name())?;
    }
    Ok(hashers
        .iter()
        .map(|h| {
            let h = h.finish();
            ((h ^ (h >> 32)) % u64::from(n.max(1))) as u32
        })
        .collect())
}

/// `batch` split into `n` batches by [`partitions_of`] (empty ones
/// included), rows in their order.
pub(crate) fn split(
    batch: &RecordBatch,
    keys: &[usize],
    n: u32,
) -> Result<Vec<RecordBatch>, ArrowError> {
    let parts = partitions_of(batch, keys, n)?;
    (0..n.max(1))
        .map(|p| {
            let rows: UInt32Array = parts
                .iter()
                .enumerate()
                .filter(|(_, q)| **q == p)
                .map(|(i, _)| i as u32)
                .collect();
            take_record_batch(batch, &rows)
        })
        .collect()
}

/// Add each row's value of `col` to its hasher: a tag byte (null or not),
/// then the value in a fixed encoding (integers as 64-bit little-endian,
/// floats as the bits of an f64 with -0.0 and NaN made one, text and bytes
/// with their length first).
fn feed(hashers: &mut [Fnv], col: &ArrayRef, name: &str) -> Result<(), ArrowError> {
    use DataType::*;
    let widened = widened(col, name)?;
    match widened.data_type() {
        Int64 => {
            let a = widened.as_primitive::<Int64Type>();
            each_row(hashers, &widened, |h, i| h.write(&a.value(i).to_le_bytes()));
        }
        UInt64 => {
            let a = widened.as_primitive::<UInt64Type>();
            each_row(hashers, &widened, |h, i| h.write(&a.value(i).to_le_bytes()));
        }
        Float64 => {
            let a = widened.as_primitive::<Float64Type>();
            each_row(hashers, &widened, |h, i| {
                let v = a.value(i);
                let v = if v == 0.0 {
                    0.0
                } else if v.is_nan() {
                    f64::NAN
                } else {
                    v
                };
                h.write(&v.to_bits().to_le_bytes());
            });
        }
        Utf8 => {
            let a = widened.as_string::<i32>();
            each_row(hashers, &widened, |h, i| {
                let v = a.value(i).as_bytes();
                h.write(&(v.len() as u64).to_le_bytes());
                h.write(v);
            });
        }
        Binary => {
            let a = widened.as_binary::<i32>();
            each_row(hashers, &widened, |h, i| {
                let v = a.value(i);
                h.write(&(v.len() as u64).to_le_bytes());
                h.write(v);
            });
        }
        Boolean => {
            let a = widened.as_boolean();
            each_row(hashers, &widened, |h, i| h.write(&[u8::from(a.value(i))]));
        }
        Decimal128(_, _) => {
            let a = widened.as_primitive::<datafusion::arrow::datatypes::Decimal128Type>();
            each_row(hashers, &widened, |h, i| h.write(&a.value(i).to_le_bytes()));
        }
        _ => unreachable!("widened above"),
    }
    Ok(())
}

/// `col` cast to the one type of its kind that [`feed`] encodes (64-bit
/// integers, f64, text, bytes), so equal values of different widths hash
/// alike; a type that cannot be a group key is refused, naming column
/// `name`.
fn widened(col: &ArrayRef, name: &str) -> Result<ArrayRef, ArrowError> {
    use DataType::*;
    Ok(match col.data_type() {
        Int8
        | Int16
        | Int32
        | Int64
        | Date32
        | Date64
        | Timestamp(_, _)
        | Time32(_)
        | Time64(_)
        | Duration(_) => cast(col, &Int64)?,
        UInt8 | UInt16 | UInt32 | UInt64 => cast(col, &UInt64)?,
        Float16 | Float32 | Float64 => cast(col, &Float64)?,
        Utf8 | LargeUtf8 | Utf8View => cast(col, &Utf8)?,
        Binary | LargeBinary | BinaryView => cast(col, &Binary)?,
        Boolean | Decimal128(_, _) => col.clone(),
        other => {
            return Err(ArrowError::InvalidArgumentError(format!(
                "column {name} of type {other} cannot be a group key of a stateful query \
                 (use a text, number, boolean, date or timestamp key)"
            )));
        }
    })
}

/// For each row of `col`, write its tag byte (null or not) to its hasher
/// and, if the value is there, `value`'s encoding of it.
fn each_row(hashers: &mut [Fnv], col: &ArrayRef, mut value: impl FnMut(&mut Fnv, usize)) {
    for (i, h) in hashers.iter_mut().enumerate() {
        let valid = col.is_valid(i);
        h.write(&[u8::from(valid)]);
        if valid {
            value(h, i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int32Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{Field, Schema};
    use std::sync::Arc;

    fn batch(cols: Vec<(&str, ArrayRef)>) -> RecordBatch {
        let fields: Vec<Field> = cols
            .iter()
            .map(|(n, c)| Field::new(*n, c.data_type().clone(), true))
            .collect();
        RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            cols.into_iter().map(|(_, c)| c).collect(),
        )
        .unwrap()
    }

    /// The partitions are persisted: these values must never change. They
    /// were computed by an independent FNV-1a (Python) over the documented
    /// encoding: text "a" is 01 | 01 00 00 00 00 00 00 00 | 61; the
    /// integer 7 is 01 | 07 00 00 00 00 00 00 00; null is 00.
    #[test]
    fn partitions_are_stable() {
        let b = batch(vec![(
            "k",
            Arc::new(StringArray::from(vec![Some("a"), Some("zone-132"), None])),
        )]);
        let hashes: Vec<u64> = {
            let mut hs = vec![Fnv::new(); 3];
            feed(&mut hs, b.column(0), "k").unwrap();
            hs.iter().map(Fnv::finish).collect()
        };
        assert_eq!(hashes, GOLDEN_TEXT);
        let n = batch(vec![("n", Arc::new(Int64Array::from(vec![7, -1])))]);
        let mut hs = vec![Fnv::new(); 2];
        feed(&mut hs, n.column(0), "n").unwrap();
        assert_eq!(hs.iter().map(Fnv::finish).collect::<Vec<_>>(), GOLDEN_INT);
    }

    const GOLDEN_TEXT: [u64; 3] = [0xe4981b2632418b44, 0xc6c90fb77572dec5, 0xaf63bd4c8601b7df];
    const GOLDEN_INT: [u64; 2] = [0x339f65d38505e98b, 0x685cd83ad34b3424];

    #[test]
    fn the_same_key_lands_in_the_same_partition_whatever_its_width_or_sign_of_zero() {
        let wide = batch(vec![
            ("k", Arc::new(Int64Array::from(vec![1, 2, 3, 40]))),
            ("f", Arc::new(Float64Array::from(vec![0.0, -0.0, 1.5, 2.0]))),
        ]);
        let narrow = batch(vec![
            ("k", Arc::new(Int32Array::from(vec![1, 2, 3, 40]))),
            ("f", Arc::new(Float64Array::from(vec![-0.0, 0.0, 1.5, 2.0]))),
        ]);
        for n in 1..9 {
            assert_eq!(
                partitions_of(&wide, &[0, 1], n).unwrap(),
                partitions_of(&narrow, &[0, 1], n).unwrap()
            );
        }
        let parts = split(&wide, &[0], 3).unwrap();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts.iter().map(|p| p.num_rows()).sum::<usize>(), 4);
    }

    #[test]
    fn an_unsupported_key_type_is_named() {
        let b = batch(vec![(
            "tags",
            Arc::new(datafusion::arrow::array::ListArray::new_null(
                Arc::new(Field::new("item", DataType::Int32, true)),
                1,
            )),
        )]);
        let e = partitions_of(&b, &[0], 4).unwrap_err().to_string();
        assert!(e.contains("column tags of type List"), "{e}");
    }
}
