//! A Delta table as a source (`source.format = "delta"`): Spark's
//! AvailableNow over a table. A pipeline's first run reads the table as it
//! stands (its snapshot at the latest version: every live file); later
//! runs read the files each version after the cursor adds. The cursor is
//! a position in the log, kept as the index's last key:
//!
//! - `_delta_log/<v>.json@s<n>`: the first `n` files of the snapshot of
//!   version `v` (ordered by modification time, then path) are read;
//! - `_delta_log/<v>.json@<n>`: the first `n` files version `v` adds are;
//! - `_delta_log/<v>.json@~`: all of version `v` and before are.
//!
//! (`n` has ten digits: the keys sort in log order, and the index keeps
//! the greatest.)
//!
//! A version's files may so span batches (each batch takes whole pieces of
//! at most `max_files_per_batch` files). Pieces are read as the
//! `manifests` mode reads manifests (`Upstream`), with the table's id as
//! the history: a table deleted and created again, or retired by
//! `sluice reset` of its Sluice pipeline, has a new id and is refused.
//!
//! A version that removes files with `dataChange` (a DELETE, UPDATE,
//! MERGE, overwrite, or a complete-mode Sluice sink) fails the batch,
//! unless `source.ignore_changes = true`, which skips such versions whole
//! (Spark's `skipChangeCommits`). Files added or removed without
//! `dataChange` (OPTIMIZE's compaction) are skipped. A partitioned
//! table's partition values come from the log (`partitionValues`, carried
//! with each input file), as Delta readers take them. What Sluice cannot
//! read right is refused by name: deletion vectors, column mapping and
//! other reader features.

use std::sync::Arc;

use serde_json::Value;

use super::manifests::{ManifestFiles, Upstream};
use crate::checkpoint::InputFile;
use crate::error::{Error, Result};
use crate::pipeline::Limits;
use crate::sinks::delta::{self as log, DeltaLog};
use crate::storage::Store;
use crate::storage::fanout::concurrently;

/// A position in the table's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cursor {
    /// `taken` files of the snapshot of `version` are read.
    Snapshot { version: u64, taken: usize },
    /// `taken` of the files `version` adds are read (`None`: all of them).
    Version { version: u64, taken: Option<usize> },
}

impl Cursor {
    /// The cursor as the index keeps it: keys that sort in log order (the
    /// index keeps the greatest).
    fn key(self) -> String {
        match self {
            Cursor::Snapshot { version, taken } => {
                format!("{}@s{taken:010}", log::commit_key(version))
            }
            Cursor::Version {
                version,
                taken: Some(n),
            } => format!("{}@{n:010}", log::commit_key(version)),
            Cursor::Version {
                version,
                taken: None,
            } => format!("{}@~", log::commit_key(version)),
        }
    }

    fn parse(key: &str) -> Option<Cursor> {
        let (commit, at) = key.split_once('@')?;
        let digits = commit
            .strip_prefix(log::LOG_PREFIX)?
            .strip_suffix(".json")?;
        if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let version = digits.parse().ok()?;
        match at.strip_prefix('s') {
            _ if at == "~" => Some(Cursor::Version {
                version,
                taken: None,
            }),
            Some(n) => Some(Cursor::Snapshot {
                version,
                taken: n.parse().ok()?,
            }),
            None => Some(Cursor::Version {
                version,
                taken: Some(at.parse().ok()?),
            }),
        }
    }
}

/// Whether the source key `key` is a commit of a Delta table's log: what
/// wakes a Delta-source pipeline.
pub(crate) fn is_commit(key: &str) -> bool {
    log::version_of(key).is_some()
}

/// The schema of the Delta table in `store` as its log holds it (the
/// newest `metaData`), pinned as a Parquet source's would be: what its
/// files hold is read as that (a column a file lacks, one a later version
/// added, reads as null; a file's finer timestamps are cut to the table's
/// microseconds, as Delta readers cut them). `None` while there is no
/// table yet.
pub(crate) async fn table_schema(
    store: &Arc<dyn Store>,
    pipeline: &str,
) -> Result<Option<datafusion::arrow::datatypes::SchemaRef>> {
    let dl = DeltaLog {
        store,
        pipeline,
        settings: Default::default(),
    };
    let segment = dl.segment().await?;
    let Some(latest) = segment.latest() else {
        return Ok(None);
    };
    let meta = dl.newest_meta(&segment).await?;
    pinned_schema(store, pipeline, latest, meta.as_ref()).map(Some)
}

/// The pinned schema of a table whose newest `metaData` at version
/// `latest` is `meta` (see [`table_schema`]).
fn pinned_schema(
    store: &Arc<dyn Store>,
    pipeline: &str,
    latest: u64,
    meta: Option<&Value>,
) -> Result<datafusion::arrow::datatypes::SchemaRef> {
    use crate::pipeline::schema::{columns_of, schema_of};
    let input = |message: String| Error::Input {
        pipeline: pipeline.to_string(),
        batch: None,
        key: format!("{}/{}", store.describe(), log::commit_key(latest)),
        message,
    };
    let Some(meta) = meta else {
        return Err(input(
            "the Delta table's log holds no metaData (its schema): it is not a table a \
             reader can open"
                .into(),
        ));
    };
    let text = meta["schemaString"].as_str().unwrap_or_default();
    let schema = log::arrow_schema(text).map_err(|why| {
        input(format!(
            "the Delta table's schema has a {why}, which a Delta source does not read; \
             declare source.schema without it, or read a table without it"
        ))
    })?;
    schema_of(&columns_of(&schema))
        .map_err(|e| input(format!("the table's schema cannot be pinned: column{e}")))
}

/// A Delta table read whole (a static table): its live files at its
/// latest version (with their partition values), its schema from the
/// log, and its version as `<version>-<table id>`. Refused as a Delta
/// source refuses what it cannot read right; `None` without a table.
pub(crate) async fn static_snapshot(
    store: &Arc<dyn Store>,
    pipeline: &str,
) -> Result<
    Option<(
        String,
        Vec<InputFile>,
        datafusion::arrow::datatypes::SchemaRef,
    )>,
> {
    let limits = Limits::default();
    let t = TableSource {
        store,
        pipeline,
        ignore_changes: false,
        limits: &limits,
    };
    let dl = t.log();
    let segment = dl.segment().await?;
    let Some(latest) = segment.latest() else {
        return Ok(None);
    };
    let snap = dl.snapshot(&segment, None).await?;
    let key = log::commit_key(latest);
    t.check_readable(&key, snap.meta.as_ref(), snap.protocol.as_ref())?;
    let files = t.snapshot_files(&key, &snap)?;
    let schema = pinned_schema(store, pipeline, latest, snap.meta.as_ref())?;
    let id = snap
        .meta
        .as_ref()
        .and_then(|m| m["id"].as_str())
        .unwrap_or_default()
        .to_string();
    Ok(Some((format!("{latest}-{id}"), files, schema)))
}

/// What one read of the table needs.
pub(crate) struct TableSource<'a> {
    pub store: &'a Arc<dyn Store>,
    pub pipeline: &'a str,
    /// `source.ignore_changes`.
    pub ignore_changes: bool,
    pub limits: &'a Limits,
}

impl TableSource<'_> {
    fn input(&self, key: &str, message: String) -> Error {
        Error::Input {
            pipeline: self.pipeline.to_string(),
            batch: None,
            key: format!("{}/{key}", self.store.describe()),
            message,
        }
    }

    fn log(&self) -> DeltaLog<'_> {
        DeltaLog {
            store: self.store,
            pipeline: self.pipeline,
            settings: Default::default(),
        }
    }

    /// Whether the files of a table with this metaData and protocol can be
    /// read as Sluice reads Parquet files.
    fn check_readable(
        &self,
        key: &str,
        meta: Option<&Value>,
        protocol: Option<&Value>,
    ) -> Result<()> {
        if let Some(mode) = meta
            .and_then(|m| m["configuration"].get("delta.columnMapping.mode"))
            .and_then(Value::as_str)
            && mode != "none"
        {
            return Err(self.input(
                key,
                format!(
                    "the Delta table uses column mapping (delta.columnMapping.mode = \
                     \"{mode}\"), which a Delta source does not read"
                ),
            ));
        }
        if let Some(p) = protocol {
            let reader = p["minReaderVersion"].as_u64().unwrap_or(1);
            let unknown: Vec<String> = match reader {
                0..=1 => Vec::new(),
                2 => vec!["columnMapping".to_string()],
                3 => log::features(p, "readerFeatures")
                    .into_iter()
                    .filter(|f| !matches!(f.as_str(), "timestampNtz" | "vacuumProtocolCheck"))
                    .collect(),
                _ => vec!["a reader version above 3".to_string()],
            };
            if !unknown.is_empty() {
                return Err(self.input(
                    key,
                    format!(
                        "the Delta table needs reader features a Delta source does not \
                         implement ({}): its files alone do not hold its rows",
                        unknown.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// An `add` action as the input file it names.
    fn file(&self, key: &str, add: &Value) -> Result<InputFile> {
        let path = add["path"].as_str().unwrap_or_default();
        if path.is_empty() || path.contains("://") || path.starts_with('/') {
            return Err(self.input(
                key,
                format!(
                    "the Delta table names a file outside its folder ({path:?}); a Delta \
                     source reads files under the table only"
                ),
            ));
        }
        if add.get("deletionVector").is_some_and(|d| !d.is_null()) {
            return Err(self.input(
                key,
                format!(
                    "{path} has a deletion vector (rows deleted in place), which a Delta \
                     source does not apply"
                ),
            ));
        }
        // A partitioned table's values, as its log holds them (other
        // writers' files lack the columns; Sluice's keep them too, with
        // the same values).
        let partition = add["partitionValues"]
            .as_object()
            .filter(|m| !m.is_empty())
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().map(str::to_string)))
                    .collect()
            });
        Ok(InputFile {
            key: percent_encoding::percent_decode_str(path)
                .decode_utf8_lossy()
                .into_owned(),
            size: add["size"].as_u64().unwrap_or(0),
            etag: None,
            modified_ms: None,
            partition,
        })
    }

    /// `files` cut into pieces of at most the batch limits, each with the
    /// cursor after it (`at(n)`: after the first `n`); none when `files`
    /// is empty.
    fn pieces(
        &self,
        files: &[InputFile],
        skip: usize,
        at: impl Fn(usize) -> Cursor,
    ) -> Vec<ManifestFiles> {
        let mut out = Vec::new();
        let mut start = skip;
        while start < files.len() {
            let mut end = start;
            let mut bytes = 0u64;
            while end < files.len()
                && (end == start
                    || ((end - start) < self.limits.max_files_per_batch as usize
                        && bytes + files[end].size <= self.limits.max_bytes_per_batch))
            {
                bytes += files[end].size;
                end += 1;
            }
            out.push(ManifestFiles {
                key: at(end).key(),
                files: files[start..end].to_vec(),
            });
            start = end;
        }
        out
    }

    /// The live files of a snapshot, in a stable order: modification
    /// time, then path.
    fn snapshot_files(&self, key: &str, snap: &log::Snapshot) -> Result<Vec<InputFile>> {
        let mut adds: Vec<&Value> = snap.live.values().collect();
        adds.sort_by_key(|a| {
            (
                a["modificationTime"].as_i64().unwrap_or(0),
                a["path"].as_str().unwrap_or_default().to_string(),
            )
        });
        adds.into_iter().map(|a| self.file(key, a)).collect()
    }

    /// Refuse a cursor past the table's latest version.
    fn behind(&self, version: u64, latest: u64) -> Result<()> {
        if latest < version {
            return Err(self.input(
                log::LOG_PREFIX,
                format!(
                    "the Delta table's latest version is {latest}, and this pipeline read it \
                     up to version {version}: the table was deleted and created again. Run \
                     `sluice reset` on the pipeline file to read it from the start"
                ),
            ));
        }
        Ok(())
    }

    /// The table's new input after `start_after` (the index's last key),
    /// up to its latest version now; `recorded`: the id of the table the
    /// committed batches read.
    pub(crate) async fn read(
        &self,
        start_after: Option<&str>,
        recorded: Option<&str>,
    ) -> Result<Upstream> {
        let dl = self.log();
        let segment = dl.segment().await?;
        let Some(latest) = segment.latest() else {
            // No table yet (a Sluice Delta sink whose batches had no rows
            // yet has none, and one whose first commit a crash cut short
            // has published parts and no log yet): nothing to read. A
            // folder of Parquet files without a log that is no Sluice sink
            // is not a Delta table: said, not waited on.
            let listed = self.store.list("", None).await?;
            let sluice_sink = listed.iter().any(|m| m.key == crate::paths::sink::OWNER);
            // A Sluice Delta sink publishes each batch's Delta commit
            // before its next batch: one with two committed batches and
            // no log is a Parquet sink.
            let manifests = listed
                .iter()
                .filter(|m| m.key.starts_with(crate::paths::sink::MANIFEST_PREFIX))
                .count();
            if sluice_sink && manifests >= 2 {
                return Err(self.input(
                    crate::paths::sink::OWNER,
                    format!(
                        "source.format = \"delta\", but the folder is a Sluice pipeline's \
                         Parquet sink ({manifests} committed batches and no Delta log, {}; or a \
                         Delta sink whose log was deleted): read \
                         it with format = \"parquet\" and discovery = \"manifests\"",
                        log::LOG_PREFIX
                    ),
                ));
            }
            let parquet = listed.into_iter().filter(|_| !sluice_sink).find(|m| {
                m.key.ends_with(".parquet")
                    && !m
                        .key
                        .split('/')
                        .any(|s| s.starts_with('_') || s.starts_with('.'))
            });
            if let Some(m) = parquet {
                return Err(self.input(
                    &m.key,
                    format!(
                        "source.format = \"delta\", but the folder holds Parquet files and no \
                         Delta log ({}): it is not a Delta table. Read it with format = \
                         \"parquet\" (discovery = \"manifests\" for a Sluice pipeline's Parquet \
                         sink)",
                        log::LOG_PREFIX
                    ),
                ));
            }
            return Ok(Upstream {
                history: recorded.map(str::to_string),
                manifests: Vec::new(),
            });
        };
        let cursor = match start_after {
            None => None,
            Some(k) => Some(Cursor::parse(k).ok_or_else(|| {
                self.input(
                    k,
                    "the checkpoint's cursor is not a position in a Delta log; was \
                     source.format changed? Run `sluice reset` on the pipeline file"
                        .into(),
                )
            })?),
        };
        let mut pieces = Vec::new();
        let mut id: Option<String> = recorded.map(str::to_string);
        let (first, skip_first) = match cursor {
            // The first read: the table as it stands.
            None => {
                let snap = dl.snapshot(&segment, None).await?;
                let key = log::commit_key(latest);
                self.check_readable(&key, snap.meta.as_ref(), snap.protocol.as_ref())?;
                id = snap
                    .meta
                    .as_ref()
                    .and_then(|m| m["id"].as_str())
                    .map(str::to_string);
                let files = self.snapshot_files(&key, &snap)?;
                let n = files.len();
                pieces.extend(self.pieces(&files, 0, |taken| {
                    if taken == n {
                        Cursor::Version {
                            version: latest,
                            taken: None,
                        }
                    } else {
                        Cursor::Snapshot {
                            version: latest,
                            taken,
                        }
                    }
                }));
                if files.is_empty() {
                    pieces.push(ManifestFiles {
                        key: Cursor::Version {
                            version: latest,
                            taken: None,
                        }
                        .key(),
                        files: Vec::new(),
                    });
                }
                (latest + 1, 0)
            }
            Some(Cursor::Snapshot { version, taken }) => {
                self.behind(version, latest)?;
                let at = dl.segment_upto(version).await?;
                let snap = dl.snapshot(&at, Some(version)).await?;
                let files = self.snapshot_files(&log::commit_key(version), &snap)?;
                let n = files.len();
                pieces.extend(self.pieces(&files, taken, |t| {
                    if t == n {
                        Cursor::Version {
                            version,
                            taken: None,
                        }
                    } else {
                        Cursor::Snapshot { version, taken: t }
                    }
                }));
                (version + 1, 0)
            }
            Some(Cursor::Version {
                version,
                taken: Some(taken),
            }) => {
                self.behind(version, latest)?;
                (version, taken)
            }
            Some(Cursor::Version {
                version,
                taken: None,
            }) => {
                self.behind(version, latest)?;
                (version + 1, 0)
            }
        };
        let versions: Vec<u64> = (first..=latest).collect();
        let store = self.store;
        let entries = concurrently(versions, |v| async move {
            let key = log::commit_key(v);
            let obj = store.get(&key).await?;
            Ok((v, key, obj))
        })
        .await?;
        let mut saw_meta = false;
        for (v, key, obj) in entries {
            let Some(obj) = obj else {
                return Err(self.input(
                    &key,
                    format!(
                        "version {v} of the Delta table is gone from its log (cleaned up \
                         before this pipeline read it): what it changed cannot be read. Run \
                         `sluice reset` on the pipeline file to read the table anew from its \
                         latest snapshot"
                    ),
                ));
            };
            let actions = log::actions(&obj.bytes, &key, self.pipeline)?;
            let meta = actions.iter().find_map(|a| a.get("metaData"));
            let protocol = actions.iter().find_map(|a| a.get("protocol"));
            if meta.is_some() || protocol.is_some() {
                self.check_readable(&key, meta, protocol)?;
            }
            if let Some(m) = meta {
                saw_meta = true;
                let new = m["id"].as_str().map(str::to_string);
                if id.is_some() && new.is_some() && id != new {
                    return Err(self.replaced(&key, v));
                }
                id = new.or(id);
            }
            let data = |a: &Value| a["dataChange"].as_bool() != Some(false);
            let change = actions.iter().any(|a| a.get("remove").is_some_and(&data));
            let files: Vec<InputFile> = if change && self.ignore_changes {
                // Skipped whole (Spark's skipChangeCommits).
                Vec::new()
            } else if change {
                return Err(self.input(
                    &key,
                    format!(
                        "version {v} of the Delta table removes or rewrites files (a DELETE, \
                         UPDATE, MERGE, overwrite, or a complete-mode sink), and a Delta source \
                         reads only appended rows: set source.ignore_changes = true to skip such \
                         versions (their rows are then not read), or run `sluice reset` to read \
                         the table anew"
                    ),
                ));
            } else {
                actions
                    .iter()
                    .filter_map(|a| a.get("add"))
                    .filter(|a| data(a))
                    .map(|a| self.file(&key, a))
                    .collect::<Result<_>>()?
            };
            let skip = if v == first { skip_first } else { 0 };
            let n = files.len();
            if skip < n {
                pieces.extend(self.pieces(&files, skip, |t| Cursor::Version {
                    version: v,
                    taken: (t < n).then_some(t),
                }));
            } else {
                pieces.push(ManifestFiles {
                    key: Cursor::Version {
                        version: v,
                        taken: None,
                    }
                    .key(),
                    files: Vec::new(),
                });
            }
        }
        // New versions without metaData: whether the table is the one the
        // committed batches read (one deleted and created again under the
        // same folder numbers its versions afresh).
        if cursor.is_some() && first <= latest && !saw_meta {
            let now = dl
                .newest_meta(&segment)
                .await?
                .and_then(|m| m["id"].as_str().map(str::to_string));
            if recorded.is_some() && now.is_some() && now.as_deref() != recorded {
                return Err(self.replaced(&log::commit_key(latest), latest));
            }
            id = now.or(id);
        }
        Ok(Upstream {
            history: id,
            manifests: pieces,
        })
    }

    fn replaced(&self, key: &str, version: u64) -> Error {
        self.input(
            key,
            format!(
                "the Delta table was replaced (a new table id at version {version}: deleted and \
                 created again, or its Sluice pipeline was reset): this pipeline's position in \
                 it means nothing there. Run `sluice reset` on the pipeline file to read it \
                 from the start"
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_name_a_position_in_the_log() {
        for c in [
            Cursor::Snapshot {
                version: 7,
                taken: 3,
            },
            Cursor::Version {
                version: 12,
                taken: Some(5),
            },
            Cursor::Version {
                version: 12,
                taken: None,
            },
        ] {
            assert_eq!(Cursor::parse(&c.key()), Some(c), "{}", c.key());
        }
        assert_eq!(
            Cursor::Version {
                version: 4,
                taken: None
            }
            .key(),
            "_delta_log/00000000000000000004.json@~"
        );
        // Keys sort in log order.
        let order = [
            Cursor::Snapshot {
                version: 4,
                taken: 9,
            },
            Cursor::Snapshot {
                version: 4,
                taken: 10,
            },
            Cursor::Version {
                version: 4,
                taken: None,
            },
            Cursor::Version {
                version: 5,
                taken: Some(9),
            },
            Cursor::Version {
                version: 5,
                taken: Some(10),
            },
            Cursor::Version {
                version: 5,
                taken: None,
            },
            Cursor::Version {
                version: 10,
                taken: Some(0),
            },
        ];
        for w in order.windows(2) {
            assert!(w[0].key() < w[1].key(), "{} < {}", w[0].key(), w[1].key());
        }
        assert!(is_commit("_delta_log/00000000000000000004.json"));
        assert!(!is_commit(
            "_delta_log/00000000000000000004.checkpoint.parquet"
        ));
        assert!(!is_commit("_delta_log/_last_checkpoint"));
        assert_eq!(Cursor::parse("_sluice/manifest/0000000001.json"), None);
    }
}
