//! The scan of one task: a table over exactly the task's planned files, so
//! DataFusion never lists the source.

use std::sync::Arc;

use datafusion::arrow::datatypes::{FieldRef, Schema, SchemaRef};
use datafusion::catalog::Session;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder};
use datafusion::datasource::table_schema::TableSchema;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::scalar::ScalarValue;

use crate::checkpoint::InputFile;
use crate::pipeline::derived_count;

/// A table over a fixed list of files: one task's inputs. The last
/// columns named in [`DERIVED`] (`_corrupt_record`, `_rescued`) are not
/// read from the files: they are null in every row a scan gives (only rows
/// read row by row or apart have values there).
///
/// The columns named in `logged` are a Delta table's partition columns:
/// their values come from each file's `partitionValues` (set on its
/// `PartitionedFile`, in `logged`'s order), not from the file.
#[derive(Debug)]
pub(crate) struct BatchTable {
    pub(crate) schema: SchemaRef,
    pub(crate) format: Arc<dyn FileFormat>,
    pub(crate) url: ObjectStoreUrl,
    pub(crate) files: Vec<PartitionedFile>,
    pub(crate) partitions: usize,
    pub(crate) logged: Vec<String>,
}

impl BatchTable {
    /// A table of `schema` over `files` (each with its object's location
    /// and size): a Delta table's partition columns (those `schema` has
    /// among the files' logged partition values) read from the log.
    pub(crate) fn over(
        schema: SchemaRef,
        format: Arc<dyn FileFormat>,
        url: ObjectStoreUrl,
        files: Vec<(object_store::ObjectMeta, &InputFile)>,
        partitions: usize,
    ) -> datafusion::error::Result<BatchTable> {
        let read = schema.fields().len() - derived_count(&schema);
        let logged: Vec<String> = schema.fields()[..read]
            .iter()
            .filter(|f| {
                files.iter().any(|(_, i)| {
                    i.partition
                        .as_ref()
                        .is_some_and(|m| m.contains_key(f.name()))
                })
            })
            .map(|f| f.name().clone())
            .collect();
        let files = files
            .into_iter()
            .map(|(meta, input)| {
                let mut f = PartitionedFile::new_from_meta(meta);
                f.partition_values = logged
                    .iter()
                    .map(|c| logged_value(&schema, input, c))
                    .collect::<datafusion::error::Result<_>>()?;
                Ok(f)
            })
            .collect::<datafusion::error::Result<_>>()?;
        Ok(BatchTable {
            schema,
            format,
            url,
            files,
            partitions,
            logged,
        })
    }
}

/// The value of partition column `column` for `file`, as its log holds
/// it (text; null, or an empty string, is null) read as the column's type.
fn logged_value(
    schema: &Schema,
    file: &InputFile,
    column: &str,
) -> datafusion::error::Result<ScalarValue> {
    let t = schema.field_with_name(column)?.data_type();
    match file
        .partition
        .as_ref()
        .and_then(|m| m.get(column))
        .and_then(Option::as_deref)
    {
        None | Some("") => ScalarValue::try_from(t),
        Some(v) => ScalarValue::Utf8(Some(v.to_string()))
            .cast_to(t)
            .map_err(|e| {
                datafusion::error::DataFusionError::Execution(format!(
                    "{}: the Delta table's log gives partition column {column} the value \
                     {v:?}, which does not read as {} ({e}); fix the table's log or declare \
                     source.schema with a type that holds it",
                    file.key,
                    crate::pipeline::types::type_name(t)
                ))
            }),
    }
}

#[async_trait::async_trait]
impl TableProvider for BatchTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        // Spread files round-robin over the partitions, keeping each group in
        // planned order.
        let n = self.partitions.clamp(1, self.files.len().max(1));
        let mut groups: Vec<Vec<PartitionedFile>> = vec![Vec::new(); n];
        // Logged columns (a Delta table's partition values) and derived
        // ones (null) are constants of each file: DataFusion's partition
        // columns, after the file's own. `inner[i]`: where column `i` of
        // the table's schema is among them.
        let fields = self.schema.fields();
        let read = fields.len() - derived_count(&self.schema);
        let is_logged = |f: &FieldRef| self.logged.iter().any(|n| n == f.name());
        let own: Vec<FieldRef> = fields[..read]
            .iter()
            .filter(|f| !is_logged(f))
            .cloned()
            .collect();
        let mut constants: Vec<FieldRef> = fields[..read]
            .iter()
            .filter(|f| is_logged(f))
            .cloned()
            .collect();
        let derived = fields[read..].to_vec();
        constants.extend(derived.iter().cloned());
        let inner: Vec<usize> = fields
            .iter()
            .map(|f| {
                own.iter()
                    .chain(constants.iter())
                    .position(|g| g.name() == f.name())
                    .expect("every column is the file's or a constant")
            })
            .collect();
        let table = if constants.is_empty() {
            TableSchema::from(self.schema.clone())
        } else {
            TableSchema::builder(Arc::new(Schema::new(own)))
                .with_table_partition_cols(constants)
                .build()
        };
        let nulls = derived
            .iter()
            .map(|d| ScalarValue::try_from(d.data_type()))
            .collect::<datafusion::error::Result<Vec<_>>>()?;
        for (i, f) in self.files.iter().enumerate() {
            let mut f = f.clone();
            f.partition_values.extend(nulls.iter().cloned());
            groups[i % n].push(f);
        }
        let projection = if self.logged.is_empty() {
            projection.cloned()
        } else {
            Some(match projection {
                Some(p) => p.iter().map(|i| inner[*i]).collect(),
                None => inner,
            })
        };
        let source = self.format.file_source(table);
        let config = FileScanConfigBuilder::new(self.url.clone(), source)
            .with_file_groups(groups.into_iter().map(FileGroup::new).collect())
            .with_projection_indices(projection)?
            .with_limit(limit)
            .build();
        self.format.create_physical_plan(state, config).await
    }
}
