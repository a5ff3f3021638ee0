#!/usr/bin/env python3
"""Read a Delta table with two independent readers, for the tests.

    delta_read.py read TABLE OUT_DIR [--app APP_ID]
        writes OUT_DIR/deltalake.parquet (deltalake's to_pyarrow_table of
        the latest version) and OUT_DIR/duckdb.parquet (DuckDB's
        delta_scan), then prints one JSON object: the table's version,
        APP_ID's transaction version (deltalake's transaction_version),
        the live files' add actions (path, size, stats) and every path any
        version's log entry adds (read from the log as JSON, to count
        files added twice).
    delta_read.py append TABLE ROWS_JSON
        an outside writer: deltalake's write_deltalake(mode="append") of
        the JSON list of objects ROWS_JSON, with the table's own schema.
    delta_read.py create TABLE ROWS_JSON [PARTITION_COLUMN]
        a table another writer makes: write_deltalake of ROWS_JSON (types
        as pyarrow infers them) into a new table, partitioned by
        PARTITION_COLUMN if given.
    delta_read.py prune TABLE COLUMN VALUE
        partition pruning: how many files deltalake lists for
        COLUMN = VALUE (file_uris with a partition filter), and DuckDB's
        "Scanning Files: a/b" for a count with that filter.
    delta_read.py merge TABLE ROWS_JSON
        another writer's append whose new columns join the table's schema
        (write_deltalake mode="append", schema_mode="merge").
    delta_read.py empty TABLE TYPES_JSON
        a table created with a schema and no file (DeltaTable.create);
        TYPES_JSON maps column -> type ("int64", "map<string, int64>",
        "timestamp[ns, UTC]"); append then writes map values given as
        lists of [key, value] pairs.
    delta_read.py rawlog TABLE ROWS_JSON TYPES_JSON
        a table written by hand as simple writers do: one Parquet file of
        the typed rows (nanosecond timestamps kept) and a log entry whose
        schema gives Delta's types.
    delta_read.py snapshot TABLE VERSION OUT
        deltalake's rows of the table at VERSION, written to the Parquet
        file OUT.
    delta_read.py sql OUT QUERY
        DuckDB with its delta extension: QUERY (over delta_scan(...))
        written to the Parquet file OUT.
    delta_read.py overwrite TABLE ROWS_JSON
        another writer's overwrite with a new schema (write_deltalake
        mode="overwrite", schema_mode="overwrite").
    delta_read.py delete TABLE PREDICATE
        another writer's DELETE (deltalake's DeltaTable.delete): a version
        that removes files and adds rewritten ones.
    delta_read.py alter TABLE constraint NAME EXPR | property KEY VALUE
        another writer's change of a table: deltalake's
        alter.add_constraint (raises the writer protocol to CHECK
        constraints) or alter.set_table_properties.

TABLE is a folder, or s3://bucket/prefix with AWS_ENDPOINT_URL set (moto).
The environment is the venv tests/run.sh makes with deltalake==1.6.6,
duckdb==1.5.5, duckdb-extension-delta==1.5.5 and
duckdb-extension-httpfs==1.5.5 (DuckDB's delta extension does not install
online here: it is loaded from that wheel's file).
"""

import glob
import json
import os
import sys


def storage_options(table):
    if not table.startswith("s3://"):
        return None
    return {
        "AWS_ENDPOINT_URL": os.environ["AWS_ENDPOINT_URL"],
        "AWS_REGION": os.environ.get("AWS_REGION", "us-east-1"),
        "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "test"),
        "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "test"),
        "AWS_ALLOW_HTTP": "true",
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
        "conditional_put": "etag",
    }


def extension(name):
    import duckdb_extension_delta
    base = os.path.dirname(duckdb_extension_delta.__file__)
    if name != "delta":
        import importlib
        mod = importlib.import_module(f"duckdb_extension_{name}")
        base = os.path.dirname(mod.__file__)
    found = glob.glob(os.path.join(base, "**", f"{name}.duckdb_extension"),
                      recursive=True)
    if not found:
        sys.exit(f"delta_read: no {name}.duckdb_extension under {base}")
    return found[0]


def log_adds(table):
    """Every path an add action of any log entry names (local tables)."""
    if table.startswith("s3://"):
        return None
    out = []
    for f in sorted(glob.glob(os.path.join(table, "_delta_log", "*.json"))):
        with open(f) as fh:
            for line in fh:
                if line.strip():
                    a = json.loads(line)
                    if "add" in a:
                        out.append(a["add"]["path"])
    return out


def cmd_read(args):
    import duckdb
    import pyarrow.parquet as pq
    from deltalake import DeltaTable
    table, out_dir = args[0], args[1]
    app = args[args.index("--app") + 1] if "--app" in args else None
    dt = DeltaTable(table, storage_options=storage_options(table))
    pq.write_table(dt.to_pyarrow_table(), os.path.join(out_dir, "deltalake.parquet"))
    import pyarrow as pa
    adds = pa.table(dt.get_add_actions(flatten=False)).to_pylist()
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{extension('delta')}'")
    if table.startswith("s3://"):
        con.execute(f"LOAD '{extension('httpfs')}'")
        endpoint = os.environ["AWS_ENDPOINT_URL"].split("://", 1)[1]
        con.execute(
            "CREATE SECRET (TYPE s3, KEY_ID 'test', SECRET 'test', REGION 'us-east-1', "
            f"ENDPOINT '{endpoint}', URL_STYLE 'path', USE_SSL false)")
    target = os.path.join(out_dir, "duckdb.parquet").replace("'", "''")
    con.execute(f"COPY (SELECT * FROM delta_scan('{table}')) TO '{target}' (FORMAT parquet)")
    print(json.dumps({
        "version": dt.version(),
        "txn": dt.transaction_version(app) if app else None,
        "adds": [{"path": a["path"], "size": a["size_bytes"],
                  "num_records": a.get("num_records"),
                  "min": a.get("min"), "max": a.get("max"),
                  "null_count": a.get("null_count")} for a in adds],
        "log_adds": log_adds(table),
    }, default=str))


def pa_type(t):
    """A pyarrow type from its alias ("int64", "string"), "map<K, V>" or
    "timestamp[UNIT, TZ]"."""
    import pyarrow as pa
    t = t.strip()
    if t.startswith("map<") and t.endswith(">"):
        k, v = t[4:-1].split(",", 1)
        return pa.map_(pa_type(k), pa_type(v))
    if t.startswith("timestamp[") and t.endswith("]"):
        unit, _, tz = t[10:-1].partition(",")
        return pa.timestamp(unit.strip(), tz=tz.strip() or None)
    return pa.type_for_alias(t)


def typed_table(rows, types):
    """ROWS (a JSON list of objects) as a pyarrow table of TYPES (a JSON
    object of column -> type, see pa_type), in TYPES' column order; a map
    value is written as a list of [key, value] pairs."""
    import pyarrow as pa
    schema = pa.schema([(name, pa_type(t)) for name, t in types.items()])
    cols = {}
    for field in schema:
        values = [r.get(field.name) for r in rows]
        if pa.types.is_map(field.type):
            values = [None if v is None else [tuple(p) for p in v] for v in values]
        cols[field.name] = pa.array(values, type=field.type)
    return pa.table(cols, schema=schema)


def cmd_append(args):
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    table, rows = args[0], json.loads(args[1])
    opts = storage_options(table)
    schema = pa.schema(DeltaTable(table, storage_options=opts).schema().to_arrow())
    if any(pa.types.is_map(f.type) for f in schema):
        types = {f.name: str(f.type) for f in schema}
        types = {f.name: (f"map<{f.type.key_type}, {f.type.item_type}>"
                          if pa.types.is_map(f.type) else types[f.name]) for f in schema}
        data = typed_table(rows, types)
    else:
        data = pa.Table.from_pylist(rows, schema=schema)
    write_deltalake(table, data, mode="append", storage_options=opts)


def cmd_merge(args):
    import pyarrow as pa
    from deltalake import write_deltalake
    table, rows = args[0], json.loads(args[1])
    write_deltalake(table, pa.Table.from_pylist(rows), mode="append", schema_mode="merge",
                    storage_options=storage_options(table))


def cmd_empty(args):
    from deltalake import DeltaTable
    table, types = args[0], json.loads(args[1])
    DeltaTable.create(table, schema=typed_table([], types).schema,
                      storage_options=storage_options(table))


def cmd_rawlog(args):
    """A table written by hand, as simple writers write one: ROWS in one
    Parquet file as TYPES gives them (pyarrow), named by version 0 of a log
    whose schema types each column as Delta does (a nanosecond timestamp
    is a Delta `timestamp`, microseconds)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    table, rows, types = args[0], json.loads(args[1]), json.loads(args[2])
    data = typed_table(rows, types)
    os.makedirs(os.path.join(table, "_delta_log"), exist_ok=True)
    path = os.path.join(table, "part-00000.parquet")
    pq.write_table(data, path, coerce_timestamps=None, allow_truncated_timestamps=False,
                   version="2.6")

    def delta(t):
        if pa.types.is_timestamp(t):
            return "timestamp" if t.tz else "timestamp_ntz"
        return {"int64": "long", "string": "string", "double": "double"}[str(t)]
    schema = {"type": "struct", "fields": [
        {"name": f.name, "type": delta(f.type), "nullable": True, "metadata": {}}
        for f in data.schema]}
    actions = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {"metaData": {"id": "00000000-0000-0000-0000-00000000000a", "format": {
            "provider": "parquet", "options": {}}, "schemaString": json.dumps(schema),
            "partitionColumns": [], "configuration": {}, "createdTime": 0}},
        {"add": {"path": "part-00000.parquet", "partitionValues": {},
                 "size": os.path.getsize(path), "modificationTime": 0, "dataChange": True}},
    ]
    with open(os.path.join(table, "_delta_log", f"{0:020}.json"), "w") as fh:
        fh.write("".join(json.dumps(a) + "\n" for a in actions))


def cmd_overwrite(args):
    import pyarrow as pa
    from deltalake import write_deltalake
    table, rows = args[0], json.loads(args[1])
    write_deltalake(table, pa.Table.from_pylist(rows), mode="overwrite",
                    schema_mode="overwrite", storage_options=storage_options(table))


def cmd_create(args):
    import pyarrow as pa
    from deltalake import write_deltalake
    table, rows = args[0], json.loads(args[1])
    write_deltalake(table, pa.Table.from_pylist(rows), storage_options=storage_options(table),
                    partition_by=args[2:] or None)


def cmd_prune(args):
    import re
    import warnings
    warnings.simplefilter("ignore")
    import duckdb
    from deltalake import DeltaTable
    table, col, value = args[0], args[1], args[2]
    dt = DeltaTable(table, storage_options=storage_options(table))
    files = dt.file_uris(partition_filters=[(col, "=", value)])
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{extension('delta')}'")
    plan = con.execute(
        f"EXPLAIN ANALYZE SELECT count(*) FROM delta_scan('{table}') "
        f"WHERE \"{col}\" = '{value}'").fetchall()[0][1]
    m = re.search(r"Scanning Files: (\d+)/(\d+)", plan)
    print(json.dumps({"deltalake_files": len(files),
                      "duckdb_scanned": int(m.group(1)) if m else None,
                      "duckdb_total": int(m.group(2)) if m else None}))


def cmd_snapshot(args):
    import pyarrow.parquet as pq
    from deltalake import DeltaTable
    table, version, out = args[0], int(args[1]), args[2]
    dt = DeltaTable(table, version=version, storage_options=storage_options(table))
    pq.write_table(dt.to_pyarrow_table(), out)


def cmd_sql(args):
    import duckdb
    out, query = args[0], args[1]
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{extension('delta')}'")
    target = out.replace("'", "''")
    con.execute(f"COPY ({query}) TO '{target}' (FORMAT parquet)")


def cmd_delete(args):
    from deltalake import DeltaTable
    table = args[0]
    DeltaTable(table, storage_options=storage_options(table)).delete(args[1])


def cmd_alter(args):
    from deltalake import DeltaTable
    table, what = args[0], args[1]
    dt = DeltaTable(table, storage_options=storage_options(table))
    if what == "constraint":
        dt.alter.add_constraint({args[2]: args[3]})
    elif what == "property":
        dt.alter.set_table_properties({args[2]: args[3]})
    else:
        sys.exit(f"delta_read: alter {what}?")


def main():
    commands = {"read": cmd_read, "append": cmd_append, "create": cmd_create,
                "alter": cmd_alter, "delete": cmd_delete, "prune": cmd_prune,
                "overwrite": cmd_overwrite, "merge": cmd_merge, "empty": cmd_empty,
                "rawlog": cmd_rawlog, "sql": cmd_sql,
                "snapshot": cmd_snapshot}
    if len(sys.argv) < 3 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]](sys.argv[2:])
    # Done and written: leave without the interpreter's teardown, where the
    # native runtimes' threads (deltalake's, DuckDB's) were once seen to
    # abort the process under load ("terminate called without an active
    # exception") after the command had finished.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
