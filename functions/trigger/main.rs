//! The trigger Lambda function: an S3 notification (direct or through SNS), an EventBridge schedule or S3 event, or a manual refresh starts or coalesces one run per pipeline.
//! All logic is the engine's `triggers` module; see `statemachines/microbatch.asl.json` for what the run does.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    sluice_engine::functions::serve_trigger().await
}
