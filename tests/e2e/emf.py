"""Check CloudWatch Embedded Metric Format lines (one JSON document per
line in the file named by argv[1]) against the specification's structure:
the metadata object and its metric directives (a JSON schema written from
the spec's rules), then the target members every directive names: each
dimension a string member of the root, each metric a number (or an array
of up to 100 numbers) member of the root. Prints how many lines passed."""
import json
import sys

import jsonschema

UNITS = [
    "Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes",
    "Gigabytes", "Terabytes", "Bits", "Kilobits", "Megabits", "Gigabits", "Terabits",
    "Percent", "Count", "Bytes/Second", "Kilobytes/Second", "Megabytes/Second",
    "Gigabytes/Second", "Terabytes/Second", "Bits/Second", "Kilobits/Second",
    "Megabits/Second", "Gigabits/Second", "Terabits/Second", "Count/Second", "None",
]
SCHEMA = {
    "type": "object",
    "required": ["_aws"],
    "properties": {
        "_aws": {
            "type": "object",
            "required": ["Timestamp", "CloudWatchMetrics"],
            "properties": {
                "Timestamp": {"type": "integer", "minimum": 0},
                "CloudWatchMetrics": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["Namespace", "Dimensions", "Metrics"],
                        "properties": {
                            "Namespace": {"type": "string", "minLength": 1, "maxLength": 1024},
                            "Dimensions": {
                                "type": "array",
                                "items": {
                                    "type": "array",
                                    "maxItems": 30,
                                    "items": {"type": "string", "minLength": 1, "maxLength": 250},
                                },
                            },
                            "Metrics": {
                                "type": "array",
                                "maxItems": 100,
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["Name"],
                                    "properties": {
                                        "Name": {"type": "string", "minLength": 1, "maxLength": 1024},
                                        "Unit": {"enum": UNITS},
                                        "StorageResolution": {"enum": [1, 60]},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        }
    },
}

def number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)

passed = 0
for n, text in enumerate(open(sys.argv[1]), 1):
    doc = json.loads(text)
    jsonschema.validate(doc, SCHEMA)
    for d in doc["_aws"]["CloudWatchMetrics"]:
        for dims in d["Dimensions"]:
            for name in dims:
                assert isinstance(doc.get(name), str), f"line {n}: dimension {name} is not a string member"
        for m in d["Metrics"]:
            v = doc.get(m["Name"])
            ok = number(v) or (isinstance(v, list) and 0 < len(v) <= 100 and all(map(number, v)))
            assert ok, f"line {n}: metric {m['Name']} has no numeric value: {v!r}"
    passed += 1
print(passed)
