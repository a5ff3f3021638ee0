//! Step Functions as the place executions start, run and stop.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::wake::{ExecutionState, Executions, Started};
use crate::deploy::Workflow;
use crate::error::{Error, ErrorClass, Result};

/// Step Functions as the place executions start.
pub struct StepFunctions {
    client: aws_sdk_sfn::Client,
    state_machine_arn: String,
    express_arn: Option<String>,
}

impl StepFunctions {
    /// Executions of `state_machine_arn` (Standard), through `client`.
    pub fn new(client: aws_sdk_sfn::Client, state_machine_arn: impl Into<String>) -> StepFunctions {
        StepFunctions {
            client,
            state_machine_arn: state_machine_arn.into(),
            express_arn: None,
        }
    }

    /// The same, starting short runs on the Express state machine
    /// `express_arn` (`statemachines/microbatch-express.asl.json`).
    pub fn with_express(self, express_arn: Option<String>) -> StepFunctions {
        StepFunctions {
            express_arn: express_arn.filter(|a| !a.is_empty()),
            ..self
        }
    }

    /// A client from the environment's AWS configuration (respects
    /// `AWS_ENDPOINT_URL`).
    pub async fn from_env(state_machine_arn: impl Into<String>) -> StepFunctions {
        let conf = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        StepFunctions::new(aws_sdk_sfn::Client::new(&conf), state_machine_arn)
    }

    /// The client.
    pub fn client(&self) -> &aws_sdk_sfn::Client {
        &self.client
    }

    /// The ARN an execution named `name` of this state machine has.
    pub fn execution_arn(&self, name: &str) -> String {
        format!(
            "{}:{name}",
            self.state_machine_arn
                .replacen(":stateMachine:", ":execution:", 1)
        )
    }
}

/// How an execution ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionEnd {
    /// SUCCEEDED, FAILED, TIMED_OUT or ABORTED.
    pub status: String,
    /// The error name of a failed execution.
    pub error: Option<String>,
    /// Its cause.
    pub cause: Option<String>,
}

impl StepFunctions {
    /// Poll the execution named `name` every `every` until it ends.
    pub async fn wait(&self, name: &str, every: std::time::Duration) -> Result<ExecutionEnd> {
        let arn = self.execution_arn(name);
        loop {
            let o = self
                .client
                .describe_execution()
                .execution_arn(&arn)
                .send()
                .await
                .map_err(|e| sfn_error("DescribeExecution", &arn, &e, ErrorClass::Retryable))?;
            if !matches!(
                o.status,
                aws_sdk_sfn::types::ExecutionStatus::Running
                    | aws_sdk_sfn::types::ExecutionStatus::PendingRedrive
            ) {
                return Ok(ExecutionEnd {
                    status: o.status.as_str().to_string(),
                    error: o.error,
                    cause: o.cause,
                });
            }
            tokio::time::sleep(every).await;
        }
    }
}

fn sfn_error<E>(
    op: &str,
    target: &str,
    e: &aws_sdk_sfn::error::SdkError<E>,
    class: ErrorClass,
) -> Error
where
    E: std::error::Error + 'static,
{
    Error::Service {
        service: "Step Functions",
        message: format!("{op} {target}: {}", crate::storage::root_cause(e)),
        class,
    }
}

#[async_trait::async_trait]
impl Executions for StepFunctions {
    async fn stop(&self, name: &str, cause: &str) -> Result<()> {
        use aws_sdk_sfn::operation::stop_execution::StopExecutionError as E;
        let arn = self.execution_arn(name);
        match self
            .client
            .stop_execution()
            .execution_arn(&arn)
            .cause(cause)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => match e.as_service_error() {
                Some(E::ExecutionDoesNotExist(_)) => Ok(()),
                Some(E::InvalidArn(_) | E::ValidationException(_)) => {
                    Err(sfn_error("StopExecution", &arn, &e, ErrorClass::Fatal))
                }
                _ => Err(sfn_error("StopExecution", &arn, &e, ErrorClass::Retryable)),
            },
        }
    }

    async fn state(&self, name: &str) -> Result<ExecutionState> {
        use aws_sdk_sfn::operation::describe_execution::DescribeExecutionError as E;
        use aws_sdk_sfn::types::ExecutionStatus as S;
        let arn = self.execution_arn(name);
        match self
            .client
            .describe_execution()
            .execution_arn(&arn)
            .send()
            .await
        {
            Ok(o) => Ok(match o.status {
                S::Running | S::PendingRedrive => ExecutionState::Running,
                _ => ExecutionState::Ended,
            }),
            Err(e) => match e.as_service_error() {
                Some(E::ExecutionDoesNotExist(_)) => Ok(ExecutionState::Missing),
                Some(E::InvalidArn(_)) => {
                    Err(sfn_error("DescribeExecution", &arn, &e, ErrorClass::Fatal))
                }
                _ => Err(sfn_error(
                    "DescribeExecution",
                    &arn,
                    &e,
                    ErrorClass::Retryable,
                )),
            },
        }
    }

    fn express(&self) -> bool {
        self.express_arn.is_some()
    }

    async fn start(&self, name: &str, input: &Value, workflow: Workflow) -> Result<Started> {
        use aws_sdk_sfn::operation::start_execution::StartExecutionError as E;
        let state_machine = match (workflow, &self.express_arn) {
            (Workflow::Express, Some(arn)) => arn,
            _ => &self.state_machine_arn,
        };
        let out = self
            .client
            .start_execution()
            .state_machine_arn(state_machine)
            .name(name)
            .input(input.to_string())
            .send()
            .await;
        match out {
            Ok(o) => Ok(Started {
                execution: o.execution_arn,
                new: true,
            }),
            Err(e) => {
                let class = match e.as_service_error() {
                    Some(E::ExecutionAlreadyExists(_)) => {
                        return Ok(Started {
                            execution: self.execution_arn(name),
                            new: false,
                        });
                    }
                    Some(
                        E::InvalidArn(_)
                        | E::InvalidName(_)
                        | E::InvalidExecutionInput(_)
                        | E::StateMachineDoesNotExist(_)
                        | E::StateMachineDeleting(_)
                        | E::ValidationException(_),
                    ) => ErrorClass::Fatal,
                    _ => ErrorClass::Retryable,
                };
                Err(sfn_error(
                    "StartExecution",
                    &format!("{name} on {state_machine}"),
                    &e,
                    class,
                ))
            }
        }
    }
}
