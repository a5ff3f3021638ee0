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

/// A table over a fixed list of files: one task's inputs.
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
        for (i, f) in self.files.iter().enumerate() {
            groups[i % n].push(f.clone());
        }
        let source = self
            .format
            .file_source(TableSchema::from(self.schema.clone()));
        let config = FileScanConfigBuilder::new(self.url.clone(), source)
            .with_file_groups(groups.into_iter().map(FileGroup::new).collect())
            .with_projection_indices(projection.cloned())?
            .with_limit(limit)
            .build();
        self.format.create_physical_plan(state, config).await
    }
}
