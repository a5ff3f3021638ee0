//! The planner Lambda function: claims the run lease, finishes what a dead run left, and plans what is available now into batches.
//! All logic is the engine's `handlers::handle_plan`; see `statemachines/microbatch.asl.json`.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    sluice_engine::functions::serve(sluice_engine::handlers::handle_plan).await
}
