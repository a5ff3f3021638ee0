#!/usr/bin/env python3
"""The test suite's AWS stand: moto 5.2.5's server (S3, Step Functions,
Kinesis, ...) with its Kinesis patched in-process to behave as Kinesis
documents where moto does not, plus a control port for tests (throttle,
trim). tests/run.sh starts it in place of `moto_server`.

What it emulates, beyond moto:
- sequence numbers of 56 digits (more than 128 bits) with gaps, increasing
  across the stream's shards;
- writes go only to open shards (moto writes to a split parent);
- split and merge close the parents without moving records; a closed
  shard's EndingSequenceNumber is past its last record;
- a drained closed shard answers a null NextShardIterator and its
  ChildShards;
- MillisBehindLatest is 0 exactly when nothing follows the page (moto
  measures from the page's last record and says 0 for records put within
  a millisecond of the newest);
- GetRecords' Limit between 1 and 10000;
- POST /throttle {"stream", "get_records": n, "get_shard_iterator": n}
  refuses the stream's next n calls with
  ProvisionedThroughputExceededException (and answers how many it refused
  so far); POST /trim
  {"stream", "before_epoch_s"} drops records as retention would.

Not emulated: arrival-timestamp disorder, iterator expiry, the per-shard
rate limits and 10 MiB cap, expired-shard deletion, KMS, DynamoDB's
streaming destination.

Usage: python kinesis_stand.py PORT CONTROL_PORT
"""
import itertools
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import moto.kinesis.models as km
import moto.kinesis.responses as kr
from moto.kinesis.exceptions import InvalidArgumentError
from moto.core.exceptions import JsonRESTError
from moto.utilities.utils import md5_hash

# AWS-shaped sequence numbers: 56 digits (more than 128 bits), with gaps, and
# increasing across the stream's shards (a child's exceed its parents').
SEQ_BASE = 49_590_338_271_490_256_608_559_692_538_361_571_095_921_575_989_136_588_898
_counter = itertools.count(1)


def _next_seq():
    return SEQ_BASE + next(_counter) * 7919


_orig_shard_init = km.Shard.__init__


def shard_init(self, *a, **kw):
    _orig_shard_init(self, *a, **kw)
    self.starting_seq = _next_seq()
    self.ending_seq = None


def put_record(self, partition_key, data, explicit_hash_key):
    if not self.is_open:
        raise InvalidArgumentError(f"{self.shard_id} is closed")
    seq = _next_seq()
    self.records[seq] = km.Record(partition_key, data, seq, explicit_hash_key)
    return str(seq)


def shard_to_json(self):
    out = {
        "HashKeyRange": {"StartingHashKey": str(self.starting_hash), "EndingHashKey": str(self.ending_hash)},
        "SequenceNumberRange": {"StartingSequenceNumber": str(self.starting_seq)},
        "ShardId": self.shard_id,
    }
    if self.parent:
        out["ParentShardId"] = self.parent
    if self.adjacent_parent:
        out["AdjacentParentShardId"] = self.adjacent_parent
    if not self.is_open:
        # Past the last record's number, as on Kinesis: never a record's.
        out["SequenceNumberRange"]["EndingSequenceNumber"] = str(self.ending_seq)
    return out


def get_shard_for_key(self, partition_key, explicit_hash_key):
    if explicit_hash_key:
        key = int(explicit_hash_key)
        if key >= 2**128:
            raise InvalidArgumentError("explicit_hash_key")
    else:
        key = int(md5_hash(partition_key.encode("utf-8")).hexdigest(), 16)
    for shard in self.shards.values():
        if shard.is_open and shard.starting_hash <= key <= shard.ending_hash:
            return shard
    raise InvalidArgumentError(f"no open shard holds hash key {key}")


def _close(shard):
    shard.is_open = False
    shard.ending_seq = _next_seq()


def split_shard(self, shard_to_split, new_starting_hash_key):
    new = int(new_starting_hash_key)
    shard = self.shards[shard_to_split]
    if not shard.is_open or not (shard.starting_hash < new <= shard.ending_hash):
        raise InvalidArgumentError(f"cannot split {shard_to_split} at {new}")
    last = max(s._shard_id for s in self.shards.values())
    _close(shard)
    for i, (lo, hi) in enumerate([(shard.starting_hash, new - 1), (new, shard.ending_hash)]):
        child = km.Shard(last + 1 + i, lo, hi, parent=shard.shard_id)
        self.shards[child.shard_id] = child
    # The parent keeps its records; nothing moves.


def merge_shards(self, shard_to_merge, adjacent_shard_to_merge):
    a, b = self.shards[shard_to_merge], self.shards[adjacent_shard_to_merge]
    if not (a.is_open and b.is_open) or a.ending_hash + 1 != b.starting_hash:
        raise InvalidArgumentError(f"{shard_to_merge} and {adjacent_shard_to_merge} are not adjacent open shards")
    last = max(s._shard_id for s in self.shards.values())
    _close(a)
    _close(b)
    child = km.Shard(last + 1, a.starting_hash, b.ending_hash, parent=a.shard_id, adjacent_parent=b.shard_id)
    self.shards[child.shard_id] = child


# Test controls, per stream: the next GetRecords and GetShardIterator calls
# to refuse, and how many were refused.
THROTTLE = {}
THROTTLED = {}


class Throttled(JsonRESTError):
    def __init__(self):
        super().__init__("ProvisionedThroughputExceededException", "Rate exceeded for shard (stand)")


def _throttle(stream, call):
    left = THROTTLE.get((stream, call), 0)
    if left > 0:
        THROTTLE[(stream, call)] = left - 1
        THROTTLED[(stream, call)] = THROTTLED.get((stream, call), 0) + 1
        raise Throttled()


_orig_get_iter = kr.KinesisResponse.get_shard_iterator


def get_records(self):
    limit = self._get_param("Limit")
    if limit is not None and not (1 <= int(limit) <= 10000):
        raise InvalidArgumentError("Limit must be between 1 and 10000")
    stream_arn = self._get_param("StreamARN")
    it = self._get_param("ShardIterator")
    name, shard_id, last = km.decompose_shard_iterator(it)
    stream = self.kinesis_backend.describe_stream(stream_arn=stream_arn, stream_name=None if name == "None" else name)
    _throttle(stream.stream_name, "get_records")
    shard = stream.get_shard(shard_id)
    records, last, _ = shard.get_records(last, limit or 10000)
    # Behind the tip only while records follow the page.
    newer = [r for q, r in shard.records.items() if q > int(last)]
    behind = 0
    if newer:
        behind = max(1, int((newer[-1].created_at - newer[0].created_at) * 1000))
    out = {"Records": [r.to_json() for r in records], "MillisBehindLatest": behind}
    drained = not shard.is_open and (not shard.records or int(last) >= max(shard.records))
    if drained:
        # The end of a closed shard: no next iterator, and its children.
        out["NextShardIterator"] = None
        out["ChildShards"] = [
            {
                "ShardId": c.shard_id,
                "ParentShards": [p for p in (c.parent, c.adjacent_parent) if p],
                "HashKeyRange": shard_to_json(c)["HashKeyRange"],
            }
            for c in stream.shards.values()
            if shard.shard_id in (c.parent, c.adjacent_parent)
        ]
    else:
        out["NextShardIterator"] = km.compose_shard_iterator(stream.stream_name, shard, last)
    return kr.ActionResult(out)


def get_shard_iterator(self):
    name = self._get_param("StreamName")
    if name is None and self._get_param("StreamARN"):
        name = self._get_param("StreamARN").split("/", 1)[-1]
    _throttle(name, "get_shard_iterator")
    return _orig_get_iter(self)


km.Shard.__init__ = shard_init
km.Shard.put_record = put_record
km.Shard.to_json = shard_to_json
km.Stream.get_shard_for_key = get_shard_for_key
km.Stream.split_shard = split_shard
km.Stream.merge_shards = merge_shards
kr.KinesisResponse.get_records = get_records
kr.KinesisResponse.get_shard_iterator = get_shard_iterator


def trim(stream_name, before_epoch_s):
    """Retention, by hand: drop every record that arrived before the time."""
    n = 0
    for backend in km.kinesis_backends.values():
        for region in backend.values():
            s = region.streams.get(stream_name)
            if s:
                for shard in s.shards.values():
                    for seq in [q for q, r in shard.records.items() if r.created_at < before_epoch_s]:
                        del shard.records[seq]
                        n += 1
    return n


class Control(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        if self.path == "/throttle":
            stream = body["stream"]
            for call in ("get_records", "get_shard_iterator"):
                if call in body:
                    THROTTLE[(stream, call)] = int(body[call])
            out = {call: THROTTLED.get((stream, call), 0) for call in ("get_records", "get_shard_iterator")}
        elif self.path == "/trim":
            out = {"trimmed": trim(body["stream"], float(body["before_epoch_s"]))}
        else:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


if __name__ == "__main__":
    port, control = int(sys.argv[1]), int(sys.argv[2])
    threading.Thread(target=HTTPServer(("127.0.0.1", control), Control).serve_forever, daemon=True).start()
    from moto.server import main

    main(["-H", "127.0.0.1", "-p", str(port)])
