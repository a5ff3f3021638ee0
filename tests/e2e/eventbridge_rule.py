"""The template's rule for your own bucket (CreateBucket = false), on moto's
EventBridge: reads OwnBucketObjectCreated's EventPattern from template.yaml
(its !Ref parameters given as argv), puts it as a rule whose target is an SQS
queue, sends EventBridge S3 "Object Created" events for the keys on stdin
(one per line; the sample event's shape, events/eventbridge-s3-object-created.json),
and prints the keys whose events the rule delivered, one per line.

Usage: eventbridge_rule.py ENDPOINT TEMPLATE SAMPLE BUCKET SOURCE_PREFIX SINK_PREFIX < keys
"""
import json
import sys
import uuid

import boto3
import yaml

endpoint, template, sample, bucket, source_prefix, sink_prefix = sys.argv[1:7]
params = {"DataBucketName": bucket, "SourcePrefix": source_prefix, "SinkPrefix": sink_prefix}


class Loader(yaml.SafeLoader):
    pass


def tag(loader, suffix, node):
    # CloudFormation's short forms: !Ref X, !Sub "...", !If [...], ...
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    return {suffix: value}


Loader.add_multi_constructor("!", tag)


def resolve(v):
    if isinstance(v, dict) and list(v) == ["Ref"]:
        return params[v["Ref"]]
    if isinstance(v, dict):
        return {k: resolve(x) for k, x in v.items()}
    if isinstance(v, list):
        return [resolve(x) for x in v]
    return v


doc = yaml.load(open(template), Loader=Loader)
rule = doc["Resources"]["OwnBucketObjectCreated"]
assert rule["Condition"] == "OwnBucket", rule
assert doc["Resources"]["DataBucket"]["Condition"] == "CreatesBucket"
pattern = resolve(rule["Properties"]["EventPattern"])

kw = dict(endpoint_url=endpoint, region_name="us-east-1")
events = boto3.client("events", **kw)
sqs = boto3.client("sqs", **kw)
name = "sluice-own-bucket-" + uuid.uuid4().hex[:8]
queue = sqs.create_queue(QueueName=name)["QueueUrl"]
arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
events.put_rule(Name=name, EventPattern=json.dumps(pattern))
events.put_targets(Rule=name, Targets=[{"Id": "trigger", "Arn": arn}])

shape = json.load(open(sample))
for key in sys.stdin.read().split("\n"):
    if not key:
        continue
    detail = json.loads(json.dumps(shape["detail"]))
    detail["bucket"]["name"] = bucket
    detail["object"]["key"] = key
    out = events.put_events(
        Entries=[{"Source": shape["source"], "DetailType": shape["detail-type"], "Detail": json.dumps(detail)}]
    )
    assert out["FailedEntryCount"] == 0, out
delivered = []
while True:
    got = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
    if not got:
        break
    for m in got:
        delivered.append(json.loads(m["Body"])["detail"]["object"]["key"])
        sqs.delete_message(QueueUrl=queue, ReceiptHandle=m["ReceiptHandle"])
events.remove_targets(Rule=name, Ids=["trigger"])
events.delete_rule(Name=name)
sqs.delete_queue(QueueUrl=queue)
print("\n".join(sorted(delivered)))
