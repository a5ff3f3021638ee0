//! The operator Lambda function: runs one task of a batch (the pipeline's SQL over the task's files) and writes its Parquet parts.
//! All logic is the engine's `handlers::handle_task`; see `statemachines/microbatch.asl.json`.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    sluice_engine::functions::serve(sluice_engine::handlers::handle_task).await
}
