//! The committer Lambda function: commits a batch exactly once (or abandons it after refused input) and advances the checkpoint.
//! All logic is the engine's `handlers::handle_commit`; see `statemachines/microbatch.asl.json`.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    sluice_engine::functions::serve(sluice_engine::handlers::handle_commit).await
}
