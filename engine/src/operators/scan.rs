//! The scan of one task: a table over exactly the task's planned files, so
//! DataFusion never lists the source.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
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

use crate::pipeline::derived_count;

/// A table over a fixed list of files: one task's inputs. The last
/// columns named in [`DERIVED`] (`_corrupt_record`, `_rescued`) are not
/// read from the files: they are null in every row a scan gives (only rows
/// read row by row or apart have values there).
#[derive(Debug)]
pub(crate) struct BatchTable {
    pub(crate) schema: SchemaRef,
    pub(crate) format: Arc<dyn FileFormat>,
    pub(crate) url: ObjectStoreUrl,
    pub(crate) files: Vec<PartitionedFile>,
    pub(crate) partitions: usize,
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
        // Derived columns are constants of each file (partition columns),
        // null.
        let fields = self.schema.fields();
        let read = fields.len() - derived_count(&self.schema);
        let derived = fields[read..].to_vec();
        let table = if derived.is_empty() {
            TableSchema::from(self.schema.clone())
        } else {
            TableSchema::builder(Arc::new(datafusion::arrow::datatypes::Schema::new(
                fields[..read].to_vec(),
            )))
            .with_table_partition_cols(derived.clone())
            .build()
        };
        let nulls = derived
            .iter()
            .map(|d| ScalarValue::try_from(d.data_type()))
            .collect::<datafusion::error::Result<Vec<_>>>()?;
        for (i, f) in self.files.iter().enumerate() {
            let mut f = f.clone();
            f.partition_values = nulls.clone();
            groups[i % n].push(f);
        }
        let source = self.format.file_source(table);
        let config = FileScanConfigBuilder::new(self.url.clone(), source)
            .with_file_groups(groups.into_iter().map(FileGroup::new).collect())
            .with_projection_indices(projection.cloned())?
            .with_limit(limit)
            .build();
        self.format.create_physical_plan(state, config).await
    }
}
