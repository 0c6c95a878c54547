"""Regenerate docs/SUPPORTED_OPS_<target>.md for every target (tests/test_ops_cli.py fails when one is stale).

Run from anywhere: python tools/update_supported_ops.py
"""
from pathlib import Path

from rkcompile.views.ops_doc import render_supported_ops
from rkcompile.plan.schema import write_atomically
from rkcompile.targets import all_targets

DOCS = Path(__file__).resolve().parents[1] / "docs"


def main() -> None:
    for target in all_targets():
        path = DOCS / f"SUPPORTED_OPS_{target.name}.md"
        write_atomically(path, render_supported_ops(target, "md"))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
