"""One build serves both README commands.

Builds the CLI as the README's first command does (`cargo build -p sluice`,
the dev profile), then the whole test suite (`cargo test --workspace
--no-run`), and fails if any dependency (a crate from a registry, not one of
the workspace's own) is compiled twice: a second artifact of the same
package with another hash means the two builds resolved different features
or profiles, so a new user would compile DataFusion, Arrow or the AWS SDK
again.

The check compares the artifacts cargo reports (their file names carry the
hash of features and profile), so it holds on a warm target folder too, where
both builds are already fresh: a split shows as two hashes either way.

Usage: python3 tests/one_build.py   (CARGO_TARGET_DIR as for the suite)
"""

import json
import os
import subprocess
import sys


def artifacts(args):
    """package id -> set of artifact file names, for one cargo invocation."""
    cmd = ["cargo", *args, "--locked", "--message-format=json-render-diagnostics"]
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    out = {}
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact":
            continue
        names = {os.path.basename(f) for f in msg.get("filenames", [])}
        out.setdefault(msg["package_id"], set()).update(names)
    return out


def external(package_id):
    # Workspace crates are path+file://...; registries and git are not.
    return not package_id.startswith("path+")


def main():
    first = artifacts(["build", "-p", "sluice"])
    second = artifacts(["test", "--workspace", "--no-run"])
    if not any(external(p) for p in first):
        sys.exit("cargo reported no dependency artifacts: cannot check")
    twice = []
    for pkg, names in sorted(second.items()):
        if not external(pkg) or pkg not in first:
            continue  # the workspace's own crates, or a test-only dependency
        extra = names - first[pkg]
        if extra:
            twice.append(f"  {pkg}: {sorted(extra)} besides {sorted(first[pkg])}")
    shared = sum(1 for p in second if external(p) and p in first)
    only_tests = sorted(
        p.rsplit("#", 1)[-1] for p in second if external(p) and p not in first
    )
    if twice:
        print(
            "These dependencies compile twice: `cargo test --workspace` resolves "
            "other features (or another profile) for them than `cargo build -p "
            "sluice`. Turn the same features on in the workspace's "
            "[workspace.dependencies] (compare `cargo tree -e features -p sluice` "
            "with `--workspace`):"
        )
        print("\n".join(twice))
        sys.exit(1)
    print(
        f"one build: the test build reuses all {shared} dependencies of "
        f"`cargo build -p sluice`; test-only: {', '.join(only_tests) or 'none'}"
    )


if __name__ == "__main__":
    main()
