//! End to end on emulated AWS, with the real pieces: a moto server (S3 and
//! Step Functions executions) running the real `statemachines/
//! microbatch.asl.json`, `cargo lambda watch --only-lambda-apis` serving the
//! Lambda runtime API to the four function binaries of this very build
//! (`CARGO_BIN_EXE_*`, nothing is compiled here), and the project's proxy
//! between them (`tests/aws/lambda_proxy.py`, see TESTING-STACK.md). All on
//! 127.0.0.1; everything started here is stopped when the test ends.
//!
//! Needs the venv tests/run.sh makes (moto, cargo-lambda), found next to
//! `SLUICE_PYTHON`.

#[allow(dead_code)]
#[path = "../e2e/support.rs"]
mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};
use sluice_engine::admin;
use sluice_engine::checkpoint::RunStatus;
use sluice_engine::handlers::Context;
use sluice_engine::pipeline::Pipeline;
use sluice_engine::storage::{PutMode, S3Config, S3Store, Store};
use sluice_engine::triggers::{StepFunctions, execution_input, execution_name};

use support::*;

const ACCOUNT: &str = "123456789012";
const FUNCTIONS: [&str; 4] = [
    "sluice-trigger",
    "sluice-planner",
    "sluice-operator",
    "sluice-committer",
];

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn venv_bin(tool: &str) -> PathBuf {
    let python = std::env::var("SLUICE_PYTHON").expect(
        "SLUICE_PYTHON is not set: run the suite with tests/run.sh, which installs moto and \
         cargo-lambda into a venv",
    );
    let bin = Path::new(&python).parent().unwrap().join(tool);
    assert!(
        bin.exists(),
        "{} is missing: run tests/run.sh, which installs it",
        bin.display()
    );
    bin
}

fn bin(name: &str) -> &'static str {
    match name {
        "sluice-trigger" => env!("CARGO_BIN_EXE_sluice-trigger"),
        "sluice-planner" => env!("CARGO_BIN_EXE_sluice-planner"),
        "sluice-operator" => env!("CARGO_BIN_EXE_sluice-operator"),
        "sluice-committer" => env!("CARGO_BIN_EXE_sluice-committer"),
        other => panic!("no function {other}"),
    }
}

/// Processes started by the test, each in its own process group, stopped
/// (with their children) when dropped.
struct Stack {
    children: Vec<(String, Child)>,
    logs: tempfile::TempDir,
    moto: u16,
    proxy: u16,
    lambda: u16,
}

impl Stack {
    fn spawn(&mut self, name: &str, cmd: &mut Command) {
        use std::os::unix::process::CommandExt;
        let log = std::fs::File::create(self.logs.path().join(format!("{name}.log"))).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        self.children.push((name.to_string(), child));
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.logs.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Every log, for a failure message.
    fn logs(&self) -> String {
        let mut out = String::new();
        for (name, _) in &self.children {
            let log = self.log(name);
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            out.push_str(&format!("\n--- {name} (last lines)\n"));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = Command::new("kill")
                .args(["-TERM", "--", &format!("-{}", c.id())])
                .status();
        }
        for (_, c) in &mut self.children {
            let deadline = Instant::now() + Duration::from_secs(5);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One HTTP/1.1 request on loopback; returns status and body.
fn http(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, rest.to_string())
}

fn wait_until(what: &str, stack: &Stack, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "{what} did not come up{}",
            stack.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn listening(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}

fn start_stack(bucket: &str) -> Stack {
    let mut stack = Stack {
        children: Vec::new(),
        logs: tempfile::tempdir().unwrap(),
        moto: free_port(),
        proxy: free_port(),
        lambda: free_port(),
    };
    let (moto, proxy, lambda) = (stack.moto, stack.proxy, stack.lambda);
    // moto's Step Functions interpreter calls Lambda at localhost:$MOTO_PORT:
    // the proxy.
    stack.spawn(
        "moto",
        Command::new(venv_bin("moto_server"))
            .args(["-H", "127.0.0.1", "-p", &moto.to_string()])
            .env("MOTO_PORT", proxy.to_string()),
    );
    stack.spawn(
        "proxy",
        Command::new(venv_bin("python")).args([
            workspace()
                .join("tests/aws/lambda_proxy.py")
                .to_str()
                .unwrap(),
            &proxy.to_string(),
            &moto.to_string(),
            &lambda.to_string(),
        ]),
    );
    stack.spawn(
        "cargo-lambda",
        Command::new(venv_bin("cargo-lambda"))
            .args([
                "lambda",
                "watch",
                "--only-lambda-apis",
                "--invoke-address",
                "127.0.0.1",
                "--invoke-port",
                &lambda.to_string(),
            ])
            .current_dir(workspace()),
    );
    wait_until("moto", &stack, || {
        listening(moto) && http(moto, "GET", "/moto-api/", "").0 == 200
    });
    wait_until("the proxy", &stack, || listening(proxy));
    wait_until("cargo lambda watch", &stack, || listening(lambda));
    let (status, body) = http(
        moto,
        "POST",
        "/moto-api/config",
        r#"{"stepfunctions": {"execute_state_machine": true}}"#,
    );
    assert!((200..300).contains(&status), "moto config: {status} {body}");

    let endpoint = format!("http://127.0.0.1:{moto}");
    for f in FUNCTIONS {
        let mut cmd = Command::new(bin(f));
        cmd.env(
            "AWS_LAMBDA_RUNTIME_API",
            format!("http://127.0.0.1:{lambda}/.rt/{f}"),
        )
        .env("AWS_LAMBDA_FUNCTION_NAME", f)
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "2048")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env(
            "SLUICE_CHECKPOINT_URI",
            format!("s3://{bucket}/checkpoints/"),
        )
        .env("SLUICE_STATE_MACHINE_ARN", state_machine_arn())
        .env("RUST_LOG", "info");
        emulated_aws(&mut cmd, &endpoint);
        // Their S3 requests pass the proxy, which counts them.
        cmd.env("AWS_ENDPOINT_URL_S3", format!("http://127.0.0.1:{proxy}"));
        stack.spawn(f, &mut cmd);
    }
    stack
}

fn express_arn() -> String {
    format!("arn:aws:states:us-east-1:{ACCOUNT}:stateMachine:sluice-express")
}

/// Point a child process's AWS SDK at the emulated stack.
fn emulated_aws(cmd: &mut Command, endpoint: &str) {
    cmd.env("AWS_ENDPOINT_URL", endpoint)
        .env("SLUICE_S3_ENDPOINT", endpoint)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true");
}

fn function_arn(name: &str) -> String {
    format!("arn:aws:lambda:us-east-1:{ACCOUNT}:function:{name}")
}

fn state_machine_arn() -> String {
    format!("arn:aws:states:us-east-1:{ACCOUNT}:stateMachine:sluice")
}

/// The definition as deployed: the template's substitutions applied.
fn definition() -> String {
    deployed("statemachines/microbatch.asl.json")
}

/// `file` as deployed: the template's substitutions applied.
fn deployed(file: &str) -> String {
    std::fs::read_to_string(workspace().join(file))
        .unwrap()
        .replace("${PlannerFunctionArn}", &function_arn("sluice-planner"))
        .replace("${OperatorFunctionArn}", &function_arn("sluice-operator"))
        .replace("${CommitterFunctionArn}", &function_arn("sluice-committer"))
        .replace("${TriggerFunctionArn}", &function_arn("sluice-trigger"))
}

/// An S3 bucket notification for `keys`, URL-encoded as S3 sends them.
fn s3_event(bucket: &str, keys: &[String]) -> String {
    let records: Vec<Value> = keys
        .iter()
        .map(|k| {
            let encoded: String = k
                .split('/')
                .map(percent_encode)
                .collect::<Vec<_>>()
                .join("%2F");
            json!({
                "eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-east-1",
                "eventTime": "2026-11-30T12:00:00.000Z", "eventName": "ObjectCreated:Put",
                "userIdentity": {"principalId": "test"},
                "requestParameters": {"sourceIPAddress": "127.0.0.1"},
                "responseElements": {},
                "s3": {"s3SchemaVersion": "1.0", "configurationId": "sluice",
                       "bucket": {"name": bucket, "ownerIdentity": {"principalId": "test"},
                                  "arn": format!("arn:aws:s3:::{bucket}")},
                       "object": {"key": encoded, "size": 1, "sequencer": "00"}}
            })
        })
        .collect();
    json!({ "Records": records }).to_string()
}

/// Form encoding as S3 notifications use it: space as `+`, others `%XX`.
fn percent_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'*' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Invoke the trigger function through the Lambda API, as S3 (via SNS) or
/// EventBridge would.
fn invoke_trigger(stack: &Stack, event: &str) -> Value {
    let (status, body) = http(
        stack.lambda,
        "POST",
        "/2015-03-31/functions/sluice-trigger/invocations",
        event,
    );
    assert_eq!(status, 200, "trigger: {body}{}", stack.logs());
    serde_json::from_str(&body).unwrap()
}

fn inject(stack: &Stack, function: &str, error: &str) {
    fault(
        stack,
        json!({"function": function, "error": error, "count": 1}),
    );
}

fn fault(stack: &Stack, spec: Value) {
    let (status, body) = http(stack.proxy, "POST", "/_proxy/faults", &spec.to_string());
    assert_eq!(status, 200, "{body}");
}

fn stats(stack: &Stack) -> Value {
    serde_json::from_str(&http(stack.proxy, "GET", "/_proxy/stats", "").1).unwrap()
}

/// The epoch a trigger report started for `pipeline`.
fn started_epoch(report: &Value, pipeline: &str) -> u64 {
    let w = &report["woken"][pipeline];
    assert_eq!(w["action"], "started", "{report}");
    w["epoch"].as_u64().unwrap()
}

async fn wait_execution(
    sfn: &StepFunctions,
    stack: &Stack,
    pipeline: &str,
    epoch: u64,
) -> sluice_engine::triggers::ExecutionEnd {
    let name = execution_name(pipeline, epoch);
    tokio::time::timeout(
        Duration::from_secs(300),
        sfn.wait(&name, Duration::from_millis(200)),
    )
    .await
    .unwrap_or_else(|_| panic!("execution {name} still running after 300 s{}", stack.logs()))
    .unwrap()
}

/// `sluice refresh PIPELINE --wait` against the emulated stack: its output.
fn refresh(stack: &Stack, pipeline: &Path) -> String {
    sluice(stack, "refresh", pipeline, &["--wait"])
}

/// `sluice COMMAND PIPELINE ARGS --state-machine-arn ARN` (where the command
/// takes it) against the emulated stack; must succeed; its output.
fn sluice(stack: &Stack, command: &str, pipeline: &Path, args: &[&str]) -> String {
    // The `sluice` binary of this build (built for the e2e tests of the cli
    // package, in the same target folder as this test).
    let exe = std::env::current_exe().unwrap();
    let sluice = exe.parent().unwrap().parent().unwrap().join("sluice");
    assert!(
        sluice.exists(),
        "{} is missing: run the whole suite (cargo test --workspace)",
        sluice.display()
    );
    let endpoint = format!("http://127.0.0.1:{}", stack.moto);
    let mut cmd = Command::new(sluice);
    cmd.args([command, pipeline.to_str().unwrap()]).args(args);
    if ["refresh", "cancel", "resume"].contains(&command) {
        cmd.args(["--state-machine-arn", &state_machine_arn()]);
    }
    emulated_aws(&mut cmd, &endpoint);
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "sluice {command}: {text}{}",
        stack.logs()
    );
    text
}

/// The rows committed on S3, and those DuckDB's one-shot query gives over
/// `files`.
async fn committed(cfg: &S3Config, bucket: &str, files: &[PathBuf]) -> (Vec<String>, Vec<String>) {
    let out = tempfile::tempdir().unwrap();
    download(cfg, bucket, "curated", out.path()).await;
    let rows = committed_rows(out.path(), "taxi").await;
    (rows, duckdb_rows(files, SQL).await)
}

/// Download every object under `prefix` into `into`, keeping relative keys.
async fn download(cfg: &S3Config, bucket: &str, prefix: &str, into: &Path) {
    let store = S3Store::new(cfg, bucket, prefix);
    for m in store.list("", None).await.unwrap() {
        let obj = store.get(&m.key).await.unwrap().unwrap();
        let path = into.join(&m.key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, &obj.bytes).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn step_functions_runs_the_real_functions_exactly_once() {
    let bucket = "sluice-aws-e2e";
    let stack = start_stack(bucket);
    let endpoint = format!("http://127.0.0.1:{}", stack.moto);
    let cfg = S3Config::for_endpoint(&endpoint).await;
    cfg.client()
        .create_bucket()
        .bucket(bucket)
        .send()
        .await
        .unwrap();
    let conf = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(&endpoint)
        .load()
        .await;
    let sfn_client = aws_sdk_sfn::Client::new(&conf);
    sfn_client
        .create_state_machine()
        .name("sluice")
        .definition(definition())
        .role_arn(format!("arn:aws:iam::{ACCOUNT}:role/sluice"))
        .send()
        .await
        .expect("moto accepts the real definition");
    let sfn = StepFunctions::new(sfn_client, state_machine_arn());

    // Input: files landing under s3://bucket/landing/, one key with a space
    // and non-ASCII characters.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input");
    let files = gen_files(&input, 10, 400);
    let source = S3Store::new(&cfg, bucket, "landing");
    let upload = |from: Vec<PathBuf>| {
        let source = &source;
        let input = &input;
        async move {
            let mut keys = Vec::new();
            for f in from {
                let mut rel = f.strip_prefix(input).unwrap().to_str().unwrap().to_string();
                if rel.ends_with("trips-000001.parquet") {
                    rel = rel.replace("trips-000001", "trips-000001 été copy");
                }
                source
                    .put(
                        &rel,
                        Bytes::from(std::fs::read(&f).unwrap()),
                        PutMode::Overwrite,
                    )
                    .await
                    .unwrap();
                keys.push(format!("landing/{rel}"));
            }
            keys
        }
    };
    let keys = upload(files[..4].to_vec()).await;

    // Register the pipeline where the functions look (SLUICE_CHECKPOINT_URI).
    let toml = format!(
        r#"name = "taxi"
[source]
uri = "s3://{bucket}/landing/"
format = "parquet"
table = "trips"
[query]
sql = '''{SQL}'''
[sink]
uri = "s3://{bucket}/curated/"
[checkpoint]
uri = "s3://{bucket}/checkpoints/"
[limits]
max_files_per_batch = 2
"#
    );
    std::fs::write(dir.path().join("taxi.toml"), &toml).unwrap();
    let p = Pipeline::parse(&toml, "taxi.toml", dir.path()).unwrap();
    let ctx = Context::open(p, Some(&cfg)).unwrap();
    admin::register(&ctx).await.unwrap();

    // 1. An S3 notification for the first files starts a run; it commits
    //    what `sluice run` commits locally for the same files.
    let t0 = Instant::now();
    let report = invoke_trigger(&stack, &s3_event(bucket, &keys));
    assert_eq!(report["objects"], 4, "{report}");
    let e1 = started_epoch(&report, "taxi");
    let end = wait_execution(&sfn, &stack, "taxi", e1).await;
    assert_eq!(end.status, "SUCCEEDED", "{end:?}{}", stack.logs());
    eprintln!(
        "aws e2e: first execution (2 batches) took {:?}",
        t0.elapsed()
    );
    let (rows, local) = committed(&cfg, bucket, &files[..4]).await;
    assert!(!rows.is_empty());
    assert_eq!(
        rows, local,
        "S3 output differs from DuckDB's one-shot query"
    );
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert_eq!((c.last_committed, c.totals.files), (Some(1), 4));
    let idle_before = c.totals.clone();

    // 2. A scheduled event with no new data: a run that commits nothing,
    //    recorded in the totals (its trigger and its ending cost money).
    let sched =
        std::fs::read_to_string(workspace().join("events/eventbridge-schedule.json")).unwrap();
    let report = invoke_trigger(&stack, &sched);
    let e2 = started_epoch(&report, "taxi");
    let end = wait_execution(&sfn, &stack, "taxi", e2).await;
    assert_eq!(end.status, "SUCCEEDED", "{end:?}{}", stack.logs());
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert_eq!(
        (c.last_committed, c.totals.files),
        (Some(1), 4),
        "nothing new"
    );
    let invocations = |u: &sluice_engine::checkpoint::Usage| -> u64 {
        u.functions.iter().map(|f| f.invocations).sum()
    };
    assert_eq!(c.totals.runs, idle_before.runs + 1, "the idle run ended");
    assert_eq!(
        invocations(&c.totals.wakes),
        invocations(&idle_before.wakes) + 1,
        "its trigger invocation"
    );
    assert_eq!(
        c.totals.run_ends.transitions,
        idle_before.run_ends.transitions + 3,
        "Plan, HasBatch, Finished"
    );
    assert!(c.totals.run_end_requests.total() > idle_before.run_end_requests.total());
    // The same through `sluice refresh --wait`.
    let out = refresh(&stack, &dir.path().join("taxi.toml"));
    assert!(
        out.contains("taxi: started arn:aws:states:us-east-1:123456789012:execution:sluice:taxi-3")
            && out.contains("execution SUCCEEDED (0 batches committed)"),
        "{out}"
    );

    // 3. A retryable failure of one operator task is retried by the state
    //    machine's Retry and the run succeeds.
    let keys = upload(files[4..6].to_vec()).await;
    let before_retry = stats(&stack);
    inject(&stack, "sluice-operator", "Sluice.Retryable");
    let e3 = started_epoch(&invoke_trigger(&stack, &s3_event(bucket, &keys)), "taxi");
    let end = wait_execution(&sfn, &stack, "taxi", e3).await;
    assert_eq!(end.status, "SUCCEEDED", "{end:?}{}", stack.logs());
    assert_eq!(stats(&stack)["sluice-operator"]["injected"], 1);
    // The failed attempt is in the batch's record ($$.State.RetryCount
    // from moto's interpreter): operator invocations recorded == what the
    // proxy took, the injected failure included.
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    let mut operator = 0;
    for b in 0..=c.last_committed.unwrap() {
        let commit = ctx.checkpoint.commit(b).await.unwrap().unwrap();
        if commit.epoch == e3 {
            operator += commit
                .usage
                .functions
                .iter()
                .filter(|f| f.function == "operator")
                .map(|f| f.invocations)
                .sum::<u64>();
        }
    }
    let took = stats(&stack)["sluice-operator"]["invocations"]
        .as_u64()
        .unwrap()
        - before_retry["sluice-operator"]["invocations"]
            .as_u64()
            .unwrap_or(0);
    assert_eq!(operator, took, "operator invocations of the retried run");
    let (rows, local) = committed(&cfg, bucket, &files[..6]).await;
    assert_eq!(rows, local, "after a retried task");

    // 4. A fatal failure ends the execution; the checkpoint stays
    //    recoverable (planned, not committed, lease kept); the next event
    //    takes over the ended execution's lease and completes the batch with
    //    no duplicate output.
    let keys = upload(files[6..8].to_vec()).await;
    inject(&stack, "sluice-operator", "Sluice.Fatal");
    let e4 = started_epoch(&invoke_trigger(&stack, &s3_event(bucket, &keys)), "taxi");
    let end = wait_execution(&sfn, &stack, "taxi", e4).await;
    assert_eq!(end.status, "FAILED", "{end:?}");
    assert_eq!(end.error.as_deref(), Some("Sluice.Fatal"), "{end:?}");
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert_eq!(
        c.last_committed,
        Some(2),
        "nothing committed by the failed run"
    );
    assert!(
        ctx.checkpoint.offsets(3).await.unwrap().is_some(),
        "batch 3 stays planned"
    );
    // A manual refresh takes over the ended execution's lease: a new epoch,
    // which resumes batch 3.
    let out = refresh(&stack, &dir.path().join("taxi.toml"));
    assert!(
        out.contains(&format!("execution:sluice:taxi-{}", e4 + 1))
            && out.contains("batch 3: 2 files")
            && out.contains("execution SUCCEEDED (1 batches committed)"),
        "{out}"
    );
    let (rows, local) = committed(&cfg, bucket, &files[..8]).await;
    assert_eq!(rows, local, "after recovering from a fatal failure");
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert_eq!(c.totals.files, 8);

    // 5. `sluice cancel` stops a running execution (its operator task held
    //    in the proxy) and releases the lease; the stopped run commits
    //    nothing; `sluice refresh` resumes the batch, output exact.
    let keys = upload(files[8..].to_vec()).await;
    fault(
        &stack,
        json!({"function": "sluice-operator", "delay_s": 3, "count": 1}),
    );
    let e6 = started_epoch(&invoke_trigger(&stack, &s3_event(bucket, &keys)), "taxi");
    let held = Instant::now();
    while stats(&stack)["sluice-operator"]["delayed"] != 1 {
        assert!(
            held.elapsed() < Duration::from_secs(60),
            "the task never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = sluice(&stack, "cancel", &dir.path().join("taxi.toml"), &[]);
    assert!(
        out.contains(&format!("execution:sluice:taxi-{e6}")),
        "{out}"
    );
    let end = wait_execution(&sfn, &stack, "taxi", e6).await;
    // AWS reports ABORTED. moto 5.2.5 marks the execution ABORTED, but its
    // interpreter thread goes on when the held task returns and ends it
    // FAILED instead: with Sluice.Conflict (the task, fenced, refuses to
    // write for a lease its run no longer holds) or States.Runtime
    // (moto's AttributeError). Either way it must not succeed, and below
    // it must have committed nothing.
    assert!(
        end.status == "ABORTED"
            || (end.status == "FAILED"
                && matches!(
                    end.error.as_deref(),
                    Some("States.Runtime" | "Sluice.Conflict")
                )),
        "{end:?}"
    );
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert_eq!((c.status, c.last_committed), (RunStatus::Idle, Some(3)));
    // Let the held task finish late (its output is of a fenced epoch).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let out = refresh(&stack, &dir.path().join("taxi.toml"));
    assert!(out.contains("batch 4: 2 files"), "{out}");
    let (rows, local) = committed(&cfg, bucket, &files).await;
    assert_eq!(rows, local, "after a cancelled run");
    let out_dir = tempfile::tempdir().unwrap();
    download(&cfg, bucket, "curated", out_dir.path()).await;
    assert_eq!(
        orphan_files(out_dir.path(), "taxi").await,
        Vec::<String>::new(),
        "the cancelled run's late files are removed"
    );
    let out = sluice(&stack, "history", &dir.path().join("taxi.toml"), &[]);
    for label in ["s3", "manual: sluice refresh"] {
        assert!(out.contains(label), "history names {label}: {out}");
    }

    // 6. A batch with more tasks than max_inline_tasks runs through the
    //    Distributed Map, its task list read from S3 by the ItemReader.
    distributed_map(&stack, &cfg, &sfn, bucket).await;

    // 7. A pipeline in notify mode: the trigger Lambda records the
    //    notifications in the pipeline's inbox on S3, runs plan from it.
    notify_mode(&stack, &cfg, &sfn, bucket).await;

    // 8. A poison upload under `on_bad_file = "quarantine"`: the run
    //    through the functions commits the good files and records it.
    quarantine(&stack, &cfg, &sfn, bucket).await;

    // 9. A stateful query (tumbling windows, append mode): the operator
    //    Lambdas write partial states, the Merge map runs the operator
    //    function once per state partition, the committer records state.
    windowed(&stack, &cfg, &sfn, bucket).await;

    // 10. Express: a trigger deployed with the Express state machine
    //     starts short runs there; a duplicated execution of a run
    //     changes nothing; a batch that needs the Distributed Map is
    //     handed to a Standard execution.
    express(&stack, &cfg, &sfn, bucket).await;
    eprintln!("aws e2e: proxy saw {}", stats(&stack));
}

/// Short runs on moto's Express state machine (moto refuses
/// DescribeExecution and GetExecutionHistory for Express, as AWS does: the
/// checkpoint tells when a run ended). A run of two batches in one
/// Express execution, recorded as Express usage; a duplicate of that
/// execution (Express is at-least-once) started once the run ended, which
/// fails on the lease and changes nothing; then a batch of more tasks than
/// `max_inline_tasks`, which the Express execution hands over to a Standard
/// one through its Continue step.
async fn express(stack: &Stack, cfg: &S3Config, sfn: &StepFunctions, bucket: &str) {
    sfn.client()
        .create_state_machine()
        .name("sluice-express")
        .r#type(aws_sdk_sfn::types::StateMachineType::Express)
        .definition(deployed("statemachines/microbatch-express.asl.json"))
        .role_arn(format!("arn:aws:iam::{ACCOUNT}:role/sluice"))
        .send()
        .await
        .expect("moto accepts the Express definition as an Express state machine");
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input");
    let files = gen_files(&input, 4, 200);
    let source = S3Store::new(cfg, bucket, "quick");
    let keys = upload_all(&source, &input, &files[..3], "quick").await;
    let toml = |name: &str, limits: &str| {
        format!(
            r#"name = "{name}"
[source]
uri = "s3://{bucket}/{name}/"
format = "parquet"
table = "trips"
[query]
sql = '''{SQL}'''
[sink]
uri = "s3://{bucket}/{name}-out/"
[checkpoint]
uri = "s3://{bucket}/checkpoints/"
[limits]
{limits}
"#
        )
    };
    let open = |name: &str, limits: &str| {
        let p = Pipeline::parse(&toml(name, limits), "quick.toml", dir.path()).unwrap();
        Context::open(p, Some(cfg)).unwrap()
    };
    let ctx = open("quick", "max_files_per_batch = 2");
    admin::register(&ctx).await.unwrap();
    let out_rows = |name: &'static str| async move {
        let out = tempfile::tempdir().unwrap();
        download(cfg, bucket, &format!("{name}-out"), out.path()).await;
        committed_rows(out.path(), name).await
    };
    // The run ended when control is idle at the last batch.
    let ended = |ctx: &Context, last: u64| {
        let ctx = ctx.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(120), async {
                loop {
                    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
                    if c.status == RunStatus::Idle && c.last_committed == Some(last) {
                        return c;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            })
            .await
            .unwrap_or_else(|_| panic!("the Express run never ended{}", stack.logs()))
        }
    };

    // The trigger as deployed with SLUICE_EXPRESS_STATE_MACHINE_ARN, run
    // here (the Lambda emulator serves only the workspace's binaries by
    // their names, and this stack's trigger function has no Express
    // machine): it claims the lease and starts the execution on moto's
    // Express machine, which drives the real planner, operator and
    // committer functions.
    let express_trigger = |event: String, ctx: Context| async move {
        let starts = StepFunctions::new(sfn.client().clone(), state_machine_arn())
            .with_express(Some(express_arn()));
        let event = sluice_engine::triggers::parse_event(event.as_bytes()).unwrap();
        let report = sluice_engine::triggers::trigger(&event, std::slice::from_ref(&ctx), &starts)
            .await
            .unwrap();
        serde_json::to_value(report).unwrap()
    };
    let report = express_trigger(s3_event(bucket, &keys), ctx.clone()).await;
    let e = started_epoch(&report, "quick");
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert!(
        c.owner
            .as_deref()
            .unwrap_or_default()
            .starts_with("sfn-express:quick-"),
        "the lease names an Express execution: {:?}",
        c.owner
    );
    let c = ended(&ctx, 1).await;
    assert_eq!(out_rows("quick").await, duckdb_rows(&files[..3], SQL).await);
    // One Express execution: a request and its duration; the batches'
    // transitions counted, not billed.
    assert_eq!(c.totals.run_ends.express.executions, 1, "{:?}", c.totals);
    assert!(c.totals.run_ends.express.billed_ms >= 100, "{:?}", c.totals);
    for b in [0, 1] {
        let commit = ctx.checkpoint.commit(b).await.unwrap().unwrap();
        assert_eq!(commit.epoch, e);
        assert_eq!(commit.usage.transitions, 0, "{:?}", commit.usage);
        assert!(commit.usage.express.transitions >= 6, "{:?}", commit.usage);
    }

    // The same execution again, as Express may run it twice: its Plan
    // finds the lease no longer held by its epoch and stops; nothing
    // changes.
    let planner_before = stats(stack)["sluice-planner"]["invocations"]
        .as_u64()
        .unwrap();
    sfn.client()
        .start_execution()
        .state_machine_arn(express_arn())
        .name(format!("quick-{e}-again"))
        .input(execution_input("quick", e, "s3").to_string())
        .send()
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), async {
        while stats(stack)["sluice-planner"]["invocations"]
            .as_u64()
            .unwrap()
            == planner_before
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the duplicate execution's Plan ran");
    // (Its Plan has answered once the next control read sees no change;
    // give its failure a moment to end the execution.)
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (after, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert_eq!(
        (after.status, after.epoch, after.last_committed),
        (RunStatus::Idle, e, Some(1)),
        "{after:?}"
    );
    assert!(ctx.checkpoint.commit(2).await.unwrap().is_none());
    assert_eq!(out_rows("quick").await, duckdb_rows(&files[..3], SQL).await);

    // Express is at-least-once: the same run executed twice at once (the
    // trigger's execution, and a duplicate with the same input started
    // right after it). The first Plan to claim the run for its execution
    // runs it; the other stops before writing anything (or, arriving
    // after the run ended, on the lease). The output is DuckDB's, once.
    let twice = open("twice", "max_files_per_batch = 2");
    let twice_keys = upload_all(
        &S3Store::new(cfg, bucket, "twice"),
        &input,
        &files[..3],
        "twice",
    )
    .await;
    admin::register(&twice).await.unwrap();
    let report = express_trigger(s3_event(bucket, &twice_keys), twice.clone()).await;
    let e3 = started_epoch(&report, "twice");
    let dup = sfn
        .client()
        .start_execution()
        .state_machine_arn(express_arn())
        .name(format!("twice-{e3}-dup"))
        .input(execution_input("twice", e3, "s3").to_string())
        .send()
        .await
        .unwrap();
    let c = ended(&twice, 1).await;
    let claimed = c
        .execution
        .clone()
        .expect("the run was claimed for one execution");
    assert_eq!(claimed.epoch, e3);
    let trigger_name = format!("twice-{e3}");
    assert!(
        claimed.id == dup.execution_arn() || claimed.id.split(':').any(|part| part == trigger_name),
        "claimed for {} (the duplicate is {})",
        claimed.id,
        dup.execution_arn()
    );
    // (Give the other execution's Plan time to answer.)
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (after, _) = twice.checkpoint.control().await.unwrap().unwrap();
    assert_eq!(
        (
            after.status,
            after.epoch,
            after.last_committed,
            after.execution.clone()
        ),
        (RunStatus::Idle, e3, Some(1), Some(claimed)),
        "{after:?}"
    );
    assert!(twice.checkpoint.commit(2).await.unwrap().is_none());
    assert_eq!(out_rows("twice").await, duckdb_rows(&files[..3], SQL).await);

    // A batch that needs the Distributed Map (another pipeline over the
    // same files, one task a file, one inline task at most): the Express
    // execution hands the run over through Continue, whose trigger starts
    // a Standard one.
    let wide = open(
        "wide",
        "max_files_per_batch = 4\nmax_bytes_per_task = 1\nmax_inline_tasks = 1",
    );
    let wide_keys = upload_all(&S3Store::new(cfg, bucket, "wide"), &input, &files, "wide").await;
    admin::register(&wide).await.unwrap();
    let report = express_trigger(s3_event(bucket, &wide_keys), wide.clone()).await;
    let e2 = started_epoch(&report, "wide");
    // The Standard execution exists once the Continue step's trigger
    // claimed the lease for it.
    tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let (c, _) = wide.checkpoint.control().await.unwrap().unwrap();
            if c.epoch == e2 + 1 {
                assert_eq!(
                    c.owner.as_deref(),
                    Some(format!("sfn:wide-{}", e2 + 1).as_str())
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the Express execution handed over to no Standard one{}",
            stack.logs()
        )
    });
    let end = wait_execution(sfn, stack, "wide", e2 + 1).await;
    assert_eq!(end.status, "SUCCEEDED", "{end:?}{}", stack.logs());
    let c = ended(&wide, 0).await;
    let commit = wide.checkpoint.commit(0).await.unwrap().unwrap();
    assert_eq!(commit.epoch, e2 + 1, "committed by the Standard execution");
    assert!(commit.usage.transitions > 0, "{:?}", commit.usage);
    assert_eq!(c.totals.run_ends.express.executions, 1, "{:?}", c.totals);
    assert_eq!(out_rows("wide").await, duckdb_rows(&files, SQL).await);
}

/// A fifth pipeline with a windowed GROUP BY in append mode over three
/// hourly files landing with one notification: the execution succeeds
/// through the Merge map, and the committed windows are DuckDB's
/// `time_bucket` GROUP BY over the files, restricted to the windows the
/// final watermark (largest pickup minus the delay) closed: the run's batch
/// with no input emitted them.
async fn windowed(stack: &Stack, cfg: &S3Config, sfn: &StepFunctions, bucket: &str) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input");
    let files: Vec<PathBuf> = (0..3u64)
        .map(|h| {
            let path = input.join(format!("trips-{h:03}.parquet"));
            let bytes = sluice_cli::generator::encode(
                &sluice_cli::generator::taxi_batch(h, 150),
                sluice_engine::pipeline::SourceFormat::Parquet,
                None,
            )
            .unwrap();
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, bytes).unwrap();
            path
        })
        .collect();
    let source = S3Store::new(cfg, bucket, "windowed");
    let keys = upload_all(&source, &input, &files, "windowed").await;
    let toml = format!(
        r#"name = "windows"
[source]
uri = "s3://{bucket}/windowed/"
format = "parquet"
table = "trips"
[query]
sql = '''SELECT window.start AS window_start, window.end AS window_end, "PULocationID", count(*) AS trips, sum(passenger_count) AS passengers, max(trip_distance) AS longest FROM trips GROUP BY window(tpep_pickup_datetime, '15 minutes'), "PULocationID"'''
[sink]
uri = "s3://{bucket}/windows-out/"
[checkpoint]
uri = "s3://{bucket}/checkpoints/"
[watermark]
column = "tpep_pickup_datetime"
delay = "10 minutes"
[limits]
state_partitions = 2
"#
    );
    let p = Pipeline::parse(&toml, "windows.toml", dir.path()).unwrap();
    let ctx = Context::open(p, Some(cfg)).unwrap();
    admin::register(&ctx).await.unwrap();
    let before = stats(stack);
    let e = started_epoch(&invoke_trigger(stack, &s3_event(bucket, &keys)), "windows");
    let end = wait_execution(sfn, stack, "windows", e).await;
    assert_eq!(end.status, "SUCCEEDED", "{end:?}{}", stack.logs());
    usage_matches(stack, sfn, &ctx, &execution_name("windows", e), &before).await;
    emf_matches(stack, &ctx).await;
    let out = tempfile::tempdir().unwrap();
    download(cfg, bucket, "windows-out", out.path()).await;
    let wm = duckdb_sql(&format!(
        "SELECT epoch_us(max(tpep_pickup_datetime)) - 600000000 FROM read_parquet([{}])",
        quoted(&files)
    ))
    .await;
    let want = duckdb_sql(&format!(
        "SELECT * FROM (SELECT time_bucket(INTERVAL 15 MINUTES, tpep_pickup_datetime) AS \
         window_start, time_bucket(INTERVAL 15 MINUTES, tpep_pickup_datetime) + INTERVAL 15 \
         MINUTES AS window_end, \"PULocationID\", count(*) AS trips, \
         sum(passenger_count)::BIGINT AS passengers, max(trip_distance) AS longest FROM \
         read_parquet([{}]) GROUP BY ALL) WHERE epoch_us(window_end) <= {}",
        quoted(&files),
        wm[0]
    ))
    .await;
    assert!(want.len() > 20, "{} windows", want.len());
    assert_eq!(committed_rows(out.path(), "windows").await, want);
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    let s = c.stateful.expect("state recorded by the committer");
    assert_eq!(s.state.len(), 2);
    assert_eq!(c.status, RunStatus::Idle);
}

/// What the commits of `ctx`'s pipeline and its runs' endings recorded
/// (all of them from the one execution `name`) against what served it: the
/// state transitions against the states entered in moto's execution
/// history (inside Map iterations too), and the Lambda invocations per
/// function against what the proxy forwarded since `before`.
async fn usage_matches(
    stack: &Stack,
    sfn: &StepFunctions,
    ctx: &Context,
    name: &str,
    before: &Value,
) {
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    let mut transitions = c.totals.run_ends.transitions;
    let mut recorded: std::collections::BTreeMap<String, u64> = Default::default();
    let mut add = |u: &sluice_engine::checkpoint::Usage| {
        for f in &u.functions {
            *recorded
                .entry(format!("sluice-{}", f.function))
                .or_default() += f.invocations;
        }
    };
    add(&c.totals.run_ends);
    // The trigger recorded its one invocation (this test's) when it claimed
    // the lease.
    let woken: u64 = c.totals.wakes.functions.iter().map(|f| f.invocations).sum();
    assert_eq!(woken, 1, "{:?}", c.totals.wakes);
    assert!(c.totals.wake_requests.put_update + c.totals.wake_requests.put_create == 1);
    let mut batches = 0;
    for b in 0..=c.last_committed.unwrap() {
        let commit = ctx.checkpoint.commit(b).await.unwrap().unwrap();
        transitions += commit.usage.transitions;
        add(&commit.usage);
        batches += 1;
    }
    assert!(batches >= 2, "{batches} batches");
    let mut entered = 0;
    let mut kinds: std::collections::BTreeMap<String, u64> = Default::default();
    let mut token = None;
    loop {
        let page = sfn
            .client()
            .get_execution_history()
            .execution_arn(sfn.execution_arn(name))
            .max_results(1000)
            .set_next_token(token)
            .send()
            .await
            .unwrap();
        for ev in page.events() {
            let kind = ev.r#type().as_str().to_string();
            if kind.ends_with("StateEntered") {
                entered += 1;
            }
            *kinds.entry(kind).or_default() += 1;
        }
        token = page.next_token().map(str::to_string);
        if token.is_none() {
            break;
        }
    }
    assert_eq!(
        transitions, entered,
        "transitions recorded vs states entered in moto's history: {kinds:?}"
    );
    let after = stats(stack);
    // Every S3 request the functions made, as the server side saw them
    // (the proxy in front of moto), against what the records and totals
    // hold.
    let mut requests = c
        .totals
        .after_commits
        .plus(&c.totals.run_end_requests)
        .plus(&c.totals.wake_requests);
    for b in 0..=c.last_committed.unwrap() {
        requests = requests.plus(&ctx.checkpoint.commit(b).await.unwrap().unwrap().requests);
    }
    let s3 = |kind: &str| {
        after["s3"][kind].as_u64().unwrap_or(0) - before["s3"][kind].as_u64().unwrap_or(0)
    };
    let served = (
        s3("get") + s3("head"),
        s3("put"),
        s3("list"),
        s3("delete"),
        s3("post"),
    );
    assert_eq!(
        served,
        (
            requests.get,
            requests.writes(),
            requests.list,
            requests.delete,
            0
        ),
        "S3 requests served (get+head, put, list, delete, post) vs recorded {requests:?}"
    );
    for f in ["sluice-planner", "sluice-operator", "sluice-committer"] {
        let served = after[f]["invocations"].as_u64().unwrap_or(0)
            - before[f]["invocations"].as_u64().unwrap_or(0);
        assert_eq!(
            recorded.get(f).copied().unwrap_or(0),
            served,
            "{f}: invocations recorded vs served by the proxy"
        );
    }
}

/// The CloudWatch EMF lines the function binaries printed for `ctx`'s
/// pipeline (read back from their stdout, where Lambda's log agent reads
/// them): one batch line per committed batch from the committer, with the
/// record's rows, files, bytes and late rows; lag lines from the planner.
async fn emf_matches(stack: &Stack, ctx: &Context) {
    let lines = |function: &str| -> Vec<Value> {
        stack
            .log(function)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v.get("_aws").is_some() && v["Pipeline"] == ctx.pipeline.name.as_str())
            .collect()
    };
    let batch_lines = lines("sluice-committer");
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    let last = c.last_committed.unwrap();
    assert_eq!(
        batch_lines.len() as u64,
        last + 1,
        "one batch line per commit: {batch_lines:?}"
    );
    for b in 0..=last {
        let commit = ctx.checkpoint.commit(b).await.unwrap().unwrap();
        let line = batch_lines
            .iter()
            .find(|l| l["batch"] == b)
            .unwrap_or_else(|| panic!("no EMF line for batch {b}: {batch_lines:?}"));
        let namespace = &line["_aws"]["CloudWatchMetrics"][0]["Namespace"];
        assert_eq!(namespace, "Sluice", "{line}");
        for (metric, want) in [
            ("RowsIn", commit.rows_in),
            ("RowsOut", commit.rows_out),
            ("Files", commit.files),
            ("BytesRead", commit.bytes_read),
            (
                "LateRows",
                commit.stateful.as_ref().map_or(0, |s| s.late_rows),
            ),
            (
                "DuplicateRows",
                commit.stateful.as_ref().map_or(0, |s| s.duplicates),
            ),
        ] {
            assert_eq!(line[metric].as_f64(), Some(want as f64), "{metric}: {line}");
        }
    }
    let lag = lines("sluice-planner");
    assert!(
        lag.iter().any(|l| l.get("OldestWaitingAge").is_some()),
        "a lag line from the planner: {lag:?}"
    );
}

/// Upload `files` (under `input`) to `source` (at `prefix` in the bucket)
/// under their relative paths; returns their bucket keys.
async fn upload_all(
    source: &S3Store,
    input: &Path,
    files: &[PathBuf],
    prefix: &str,
) -> Vec<String> {
    let mut keys = Vec::new();
    for f in files {
        let rel = f.strip_prefix(input).unwrap().to_str().unwrap().to_string();
        let bytes = Bytes::from(std::fs::read(f).unwrap());
        source.put(&rel, bytes, PutMode::Overwrite).await.unwrap();
        keys.push(format!("{prefix}/{rel}"));
    }
    keys
}

/// A fourth pipeline with `on_bad_file = "quarantine"`: two good files and
/// one that is not Parquet land with one notification; the execution
/// succeeds, the good files' rows are committed (DuckDB's rows), and the
/// poison file is named in the commit record and in the sink's
/// `_quarantine/batch=0000000000/files.json` on S3.
async fn quarantine(stack: &Stack, cfg: &S3Config, sfn: &StepFunctions, bucket: &str) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input");
    let files = gen_files(&input, 3, 200);
    std::fs::write(&files[2], b"not parquet: a poison upload").unwrap();
    let source = S3Store::new(cfg, bucket, "poisoned");
    let keys = upload_all(&source, &input, &files, "poisoned").await;
    let toml = format!(
        r#"name = "poison"
[source]
uri = "s3://{bucket}/poisoned/"
format = "parquet"
table = "trips"
on_bad_file = "quarantine"
[query]
sql = '''{SQL}'''
[sink]
uri = "s3://{bucket}/poison-out/"
[checkpoint]
uri = "s3://{bucket}/checkpoints/"
"#
    );
    let p = Pipeline::parse(&toml, "poison.toml", dir.path()).unwrap();
    let ctx = Context::open(p, Some(cfg)).unwrap();
    // Registered from the good files: the first listed file pins the schema.
    source.delete(&keys[2]["poisoned/".len()..]).await.unwrap();
    admin::register(&ctx).await.unwrap();
    let bytes = Bytes::from(std::fs::read(&files[2]).unwrap());
    let poison_key = &keys[2]["poisoned/".len()..];
    source
        .put(poison_key, bytes, PutMode::Overwrite)
        .await
        .unwrap();

    let e = started_epoch(&invoke_trigger(stack, &s3_event(bucket, &keys)), "poison");
    let end = wait_execution(sfn, stack, "poison", e).await;
    assert_eq!(end.status, "SUCCEEDED", "{end:?}{}", stack.logs());
    let out = tempfile::tempdir().unwrap();
    download(cfg, bucket, "poison-out", out.path()).await;
    assert_eq!(
        committed_rows(out.path(), "poison").await,
        duckdb_rows(&files[..2], SQL).await
    );
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    let commit = ctx
        .checkpoint
        .commit(c.last_committed.unwrap())
        .await
        .unwrap()
        .unwrap();
    let named: Vec<&str> = commit.quarantined.iter().map(|q| q.key.as_str()).collect();
    assert_eq!(named, [poison_key], "{commit:?}");
    assert_eq!(c.quarantined.len(), 1, "{c:?}");
    let record = out
        .path()
        .join(sluice_engine::paths::sink::quarantined_files(commit.batch));
    let text = std::fs::read_to_string(&record).unwrap();
    assert!(text.contains(poison_key), "{text}");
}

/// A third pipeline with `discovery = "notify"`. Three files land and only
/// two notifications arrive: the first run reconciles (lists the source
/// once) and commits all three. Then a new file's notification arrives with
/// a duplicate of an old one: the run commits only the new file. The
/// notifications carry a wrong size (1 byte), which the operator must not
/// trust.
async fn notify_mode(stack: &Stack, cfg: &S3Config, sfn: &StepFunctions, bucket: &str) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input");
    let files = gen_files(&input, 4, 200);
    let source = S3Store::new(cfg, bucket, "notified");
    let keys = upload_all(&source, &input, &files, "notified").await;
    let toml = format!(
        r#"name = "inbox"
[source]
uri = "s3://{bucket}/notified/"
format = "parquet"
table = "trips"
discovery = "notify"
reconcile_every = 100
[query]
sql = '''{SQL}'''
[sink]
uri = "s3://{bucket}/inbox-out/"
[checkpoint]
uri = "s3://{bucket}/checkpoints/"
"#
    );
    let p = Pipeline::parse(&toml, "inbox.toml", dir.path()).unwrap();
    let ctx = Context::open(p, Some(cfg)).unwrap();
    // The fourth file lands later (deleted now, uploaded again below).
    source.delete(&keys[3]["notified/".len()..]).await.unwrap();
    admin::register(&ctx).await.unwrap();
    let out_rows = || async {
        let out = tempfile::tempdir().unwrap();
        download(cfg, bucket, "inbox-out", out.path()).await;
        committed_rows(out.path(), "inbox").await
    };
    let inbox = || async { ctx.checkpoint.store().list("inbox/", None).await.unwrap() };

    let e = started_epoch(
        &invoke_trigger(stack, &s3_event(bucket, &keys[..2])),
        "inbox",
    );
    let end = wait_execution(sfn, stack, "inbox", e).await;
    assert_eq!(end.status, "SUCCEEDED", "{end:?}{}", stack.logs());
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert_eq!((c.totals.files, c.reconciled_epoch), (3, Some(e)), "{c:?}");
    assert_eq!(out_rows().await, duckdb_rows(&files[..3], SQL).await);
    assert!(inbox().await.is_empty(), "{:?}", inbox().await);

    let rel = &keys[3]["notified/".len()..];
    let bytes = Bytes::from(std::fs::read(&files[3]).unwrap());
    source.put(rel, bytes, PutMode::Overwrite).await.unwrap();
    let event = s3_event(bucket, &[keys[3].clone(), keys[0].clone()]);
    let e = started_epoch(&invoke_trigger(stack, &event), "inbox");
    let end = wait_execution(sfn, stack, "inbox", e).await;
    assert_eq!(end.status, "SUCCEEDED", "{end:?}{}", stack.logs());
    let (c, _) = ctx.checkpoint.control().await.unwrap().unwrap();
    assert_eq!((c.totals.files, c.last_committed), (4, Some(1)), "{c:?}");
    assert_eq!(out_rows().await, duckdb_rows(&files, SQL).await);
    assert!(inbox().await.is_empty(), "{:?}", inbox().await);
    let claims = ctx
        .checkpoint
        .store()
        .list("index/keys/", None)
        .await
        .unwrap();
    assert_eq!(claims.len(), 4);
}

/// A second pipeline, one task per file and at most one inline task: every
/// batch goes through the Distributed Map; one batch per execution, so a run
/// of two batches continues in a second execution. A clean run; then a
/// corrupt file,
/// refused by its task: the Map fails, Settle finds the refusal and drops the
/// batch's plan (Sluice.InvalidInput), committed output unchanged; the fixed
/// file is then committed with no duplicates.
async fn distributed_map(stack: &Stack, cfg: &S3Config, sfn: &StepFunctions, bucket: &str) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input");
    let files = gen_files(&input, 4, 200);
    let source = S3Store::new(cfg, bucket, "many");
    let put = |rel: String, bytes: Vec<u8>| {
        let source = &source;
        async move {
            source
                .put(&rel, Bytes::from(bytes), PutMode::Overwrite)
                .await
                .unwrap();
            format!("many/{rel}")
        }
    };
    let rel = |f: &PathBuf| {
        f.strip_prefix(&input)
            .unwrap()
            .to_str()
            .unwrap()
            .to_string()
    };
    let mut keys = Vec::new();
    for f in &files[..3] {
        keys.push(put(rel(f), std::fs::read(f).unwrap()).await);
    }
    let toml = format!(
        r#"name = "many"
[source]
uri = "s3://{bucket}/many/"
format = "parquet"
table = "trips"
[query]
sql = '''{SQL}'''
[sink]
uri = "s3://{bucket}/many-out/"
[checkpoint]
uri = "s3://{bucket}/checkpoints/"
[limits]
max_files_per_batch = 2
max_bytes_per_task = 1
max_inline_tasks = 1
max_batches_per_execution = 1
"#
    );
    let p = Pipeline::parse(&toml, "many.toml", dir.path()).unwrap();
    let ctx = Context::open(p, Some(cfg)).unwrap();
    admin::register(&ctx).await.unwrap();

    // Two batches, one per execution: the first execution's Continue step
    // wakes the pipeline through the trigger, which starts the next.
    let report = invoke_trigger(stack, &s3_event(bucket, &keys));
    let e = started_epoch(&report, "many");
    for epoch in [e, e + 1] {
        let end = wait_execution(sfn, stack, "many", epoch).await;
        assert_eq!(end.status, "SUCCEEDED", "{end:?}{}", stack.logs());
    }
    let (first, second) = (
        ctx.checkpoint.commit(0).await.unwrap().unwrap(),
        ctx.checkpoint.commit(1).await.unwrap().unwrap(),
    );
    assert_eq!((first.files, first.epoch), (2, e));
    assert_eq!((second.files, second.epoch), (1, e + 1));
    let out_rows = || async {
        let out = tempfile::tempdir().unwrap();
        download(cfg, bucket, "many-out", out.path()).await;
        committed_rows(out.path(), "many").await
    };
    let rows = out_rows().await;
    assert_eq!(
        rows,
        duckdb_rows(&files[..3], SQL).await,
        "Distributed Map output differs from DuckDB's one-shot query"
    );

    // A corrupt file: its task refuses it.
    let bad = rel(&files[3]);
    let key = put(bad.clone(), b"not parquet".to_vec()).await;
    let e = started_epoch(&invoke_trigger(stack, &s3_event(bucket, &[key])), "many");
    let end = wait_execution(sfn, stack, "many", e).await;
    assert_eq!(end.status, "FAILED", "{end:?}");
    assert_eq!(end.error.as_deref(), Some("Sluice.InvalidInput"), "{end:?}");
    assert!(
        end.cause.as_deref().unwrap_or_default().contains(&bad),
        "the cause names the file: {end:?}"
    );
    assert!(
        ctx.checkpoint.offsets(2).await.unwrap().is_none(),
        "plan dropped"
    );
    assert_eq!(out_rows().await, rows, "committed output unchanged");

    // Fixed (same key): the next event commits it, once.
    let key = put(bad, std::fs::read(&files[3]).unwrap()).await;
    let e = started_epoch(&invoke_trigger(stack, &s3_event(bucket, &[key])), "many");
    let end = wait_execution(sfn, stack, "many", e).await;
    assert_eq!(end.status, "SUCCEEDED", "{end:?}{}", stack.logs());
    assert_eq!(
        out_rows().await,
        duckdb_rows(&files, SQL).await,
        "after the fix"
    );
}
