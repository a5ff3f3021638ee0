//! Deterministic NYC-yellow-taxi-like input files for samples, tests and
//! benchmarks: file `i` always has the same rows, and later files hold later
//! pickup times.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::parquet::arrow::ArrowWriter;

use sluice_engine::pipeline::{Compression, SourceFormat};

/// The taxi schema (the columns of the NYC TLC yellow trip records).
pub fn taxi_schema() -> SchemaRef {
    let ts = DataType::Timestamp(TimeUnit::Microsecond, None);
    Arc::new(Schema::new(vec![
        Field::new("VendorID", DataType::Int32, true),
        Field::new("tpep_pickup_datetime", ts.clone(), true),
        Field::new("tpep_dropoff_datetime", ts, true),
        Field::new("passenger_count", DataType::Int64, true),
        Field::new("trip_distance", DataType::Float64, true),
        Field::new("RatecodeID", DataType::Int64, true),
        Field::new("store_and_fwd_flag", DataType::Utf8, true),
        Field::new("PULocationID", DataType::Int32, true),
        Field::new("DOLocationID", DataType::Int32, true),
        Field::new("payment_type", DataType::Int64, true),
        Field::new("fare_amount", DataType::Float64, true),
        Field::new("extra", DataType::Float64, true),
        Field::new("mta_tax", DataType::Float64, true),
        Field::new("tip_amount", DataType::Float64, true),
        Field::new("tolls_amount", DataType::Float64, true),
        Field::new("improvement_surcharge", DataType::Float64, true),
        Field::new("total_amount", DataType::Float64, true),
        Field::new("congestion_surcharge", DataType::Float64, true),
    ]))
}

/// SplitMix64: small, fast and deterministic across platforms.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn cents(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Micros of 2024-01-01T00:00:00Z.
const EPOCH_2024_US: i64 = 1_704_067_200_000_000;

/// Rows of file `file`: pickups spread over hour `file` after 2024-01-01.
// Long because it fills one vector per column of the taxi schema, in one
// loop whose order of random draws fixes every file's rows: split, that
// order (which tests and benchmarks depend on) would be harder to see.
pub fn taxi_batch(file: u64, rows: usize) -> RecordBatch {
    let mut rng = Rng(file.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x5eed);
    let hour_us = 3_600_000_000i64;
    let base = EPOCH_2024_US + file as i64 * hour_us;
    let mut vendor = Vec::with_capacity(rows);
    let mut pickup = Vec::with_capacity(rows);
    let mut dropoff = Vec::with_capacity(rows);
    let mut passengers = Vec::with_capacity(rows);
    let mut distance = Vec::with_capacity(rows);
    let mut ratecode = Vec::with_capacity(rows);
    let mut flag = Vec::with_capacity(rows);
    let mut pu = Vec::with_capacity(rows);
    let mut dol = Vec::with_capacity(rows);
    let mut payment = Vec::with_capacity(rows);
    let mut fare = Vec::with_capacity(rows);
    let mut extra = Vec::with_capacity(rows);
    let mut mta = Vec::with_capacity(rows);
    let mut tip = Vec::with_capacity(rows);
    let mut tolls = Vec::with_capacity(rows);
    let mut improvement = Vec::with_capacity(rows);
    let mut total = Vec::with_capacity(rows);
    let mut congestion = Vec::with_capacity(rows);
    for i in 0..rows {
        let start = base + (i as i64 * hour_us) / rows.max(1) as i64;
        let miles = cents(0.3 + rng.unit().powi(2) * 20.0);
        let minutes = 3 + (miles * 3.0) as i64 + rng.below(10) as i64;
        let f = cents(3.0 + miles * 2.5 + minutes as f64 * 0.5);
        let pay = 1 + rng.below(4) as i64;
        let t = if pay == 1 {
            cents(f * rng.unit() * 0.3)
        } else {
            0.0
        };
        let toll = if rng.below(20) == 0 { 6.94 } else { 0.0 };
        let e = if rng.below(3) == 0 { 1.0 } else { 0.0 };
        let cong = if rng.below(5) == 0 { 0.0 } else { 2.5 };
        vendor.push(Some(1 + rng.below(2) as i32));
        pickup.push(Some(start));
        dropoff.push(Some(start + minutes * 60_000_000));
        passengers.push(if rng.below(50) == 0 {
            None
        } else {
            Some(1 + rng.below(4) as i64)
        });
        distance.push(Some(miles));
        ratecode.push(Some(if rng.below(30) == 0 { 2 } else { 1 }));
        flag.push(Some(if rng.below(100) == 0 { "Y" } else { "N" }));
        pu.push(Some(1 + rng.below(263) as i32));
        dol.push(Some(1 + rng.below(263) as i32));
        payment.push(Some(pay));
        fare.push(Some(f));
        extra.push(Some(e));
        mta.push(Some(0.5));
        tip.push(Some(t));
        tolls.push(Some(toll));
        improvement.push(Some(1.0));
        total.push(Some(cents(f + e + 0.5 + t + toll + 1.0 + cong)));
        congestion.push(Some(cong));
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int32Array::from(vendor)),
        Arc::new(TimestampMicrosecondArray::from(pickup)),
        Arc::new(TimestampMicrosecondArray::from(dropoff)),
        Arc::new(Int64Array::from(passengers)),
        Arc::new(Float64Array::from(distance)),
        Arc::new(Int64Array::from(ratecode)),
        Arc::new(StringArray::from(flag)),
        Arc::new(Int32Array::from(pu)),
        Arc::new(Int32Array::from(dol)),
        Arc::new(Int64Array::from(payment)),
        Arc::new(Float64Array::from(fare)),
        Arc::new(Float64Array::from(extra)),
        Arc::new(Float64Array::from(mta)),
        Arc::new(Float64Array::from(tip)),
        Arc::new(Float64Array::from(tolls)),
        Arc::new(Float64Array::from(improvement)),
        Arc::new(Float64Array::from(total)),
        Arc::new(Float64Array::from(congestion)),
    ];
    RecordBatch::try_new(taxi_schema(), columns).expect("columns match the schema")
}

/// The key of taxi file `file` (relative to the source root): a date
/// folder and a sequence number, so key order is arrival order.
pub fn taxi_key(file: u64, format: SourceFormat, compression: Option<Compression>) -> String {
    let day = file / 24;
    let date = chrono::DateTime::from_timestamp(1_704_067_200 + day as i64 * 86_400, 0)
        .expect("in range")
        .format("%Y-%m-%d");
    let ext = match format {
        SourceFormat::Parquet => "parquet",
        SourceFormat::Csv => "csv",
        SourceFormat::Jsonl => "jsonl",
    };
    let comp = match compression {
        None => "",
        Some(Compression::Gzip) => ".gz",
        Some(Compression::Zstd) => ".zst",
    };
    format!("date={date}/trips-{file:06}.{ext}{comp}")
}

/// Encode a batch as a whole file of `format`.
pub fn encode(
    batch: &RecordBatch,
    format: SourceFormat,
    compression: Option<Compression>,
) -> std::io::Result<Vec<u8>> {
    let raw = match format {
        SourceFormat::Parquet => {
            let mut w = ArrowWriter::try_new(Vec::new(), batch.schema(), None)
                .map_err(std::io::Error::other)?;
            w.write(batch).map_err(std::io::Error::other)?;
            w.into_inner().map_err(std::io::Error::other)?
        }
        SourceFormat::Csv => {
            let mut buf = Vec::new();
            {
                let mut w = datafusion::arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(&mut buf);
                w.write(batch).map_err(std::io::Error::other)?;
            }
            buf
        }
        SourceFormat::Jsonl => {
            let mut buf = Vec::new();
            {
                let mut w = datafusion::arrow::json::LineDelimitedWriter::new(&mut buf);
                w.write(batch).map_err(std::io::Error::other)?;
                w.finish().map_err(std::io::Error::other)?;
            }
            buf
        }
    };
    Ok(match compression {
        None => raw,
        Some(Compression::Gzip) => {
            use std::io::Write;
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(&raw)?;
            e.finish()?
        }
        Some(Compression::Zstd) => zstd::encode_all(raw.as_slice(), 3)?,
    })
}

/// Write `files` taxi files of `rows` rows into `out`, numbered after the
/// highest-numbered taxi file already there (so they arrive later). Each
/// file is written to a hidden temporary name and renamed into place.
pub fn write_taxi_files(
    out: &Path,
    files: u64,
    rows: usize,
    format: SourceFormat,
    compression: Option<Compression>,
) -> std::io::Result<Vec<PathBuf>> {
    let first = next_taxi_file(out)?;
    let mut written = Vec::new();
    for i in first..first + files {
        let path = out.join(taxi_key(i, format, compression));
        let dir = path.parent().expect("keys have a folder");
        std::fs::create_dir_all(dir)?;
        let bytes = encode(&taxi_batch(i, rows), format, compression)?;
        let tmp = dir.join(format!(".{i}.tmp"));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &path)?;
        written.push(path);
    }
    Ok(written)
}

/// One past the highest taxi file number under `out` (0 if none).
pub fn next_taxi_file(out: &Path) -> std::io::Result<u64> {
    let mut next = 0;
    let Ok(days) = std::fs::read_dir(out) else {
        return Ok(0);
    };
    for day in days {
        let day = day?;
        if !day.file_type()?.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(day.path())? {
            let name = f?.file_name().to_string_lossy().into_owned();
            if let Some(n) = name
                .strip_prefix("trips-")
                .and_then(|r| r.split('.').next())
                .and_then(|n| n.parse::<u64>().ok())
            {
                next = next.max(n + 1);
            }
        }
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_later_in_time() {
        let a = taxi_batch(3, 100);
        assert_eq!(a, taxi_batch(3, 100));
        assert_ne!(a, taxi_batch(4, 100));
        let pick = |b: &RecordBatch| {
            b.column(1)
                .as_any()
                .downcast_ref::<TimestampMicrosecondArray>()
                .unwrap()
                .value(0)
        };
        assert!(pick(&taxi_batch(4, 10)) > pick(&a));
        assert!(
            taxi_key(9, SourceFormat::Parquet, None) < taxi_key(10, SourceFormat::Parquet, None)
        );
        assert!(taxi_key(23, SourceFormat::Csv, None) < taxi_key(24, SourceFormat::Csv, None));
    }

    #[test]
    fn numbering_continues() {
        let dir = tempfile::tempdir().unwrap();
        write_taxi_files(dir.path(), 2, 5, SourceFormat::Csv, Some(Compression::Gzip)).unwrap();
        let more =
            write_taxi_files(dir.path(), 1, 5, SourceFormat::Csv, Some(Compression::Gzip)).unwrap();
        assert!(more[0].to_string_lossy().ends_with("trips-000002.csv.gz"));
    }
}
