"""Render an `rkcompile graph --format html` page to a PNG in headless Chromium, offline.

    python tools/screenshot_html.py PAGE.html OUT.png [--width 1400] [--height 1800]

Needs Debian's chromium (`apt-get update && apt-get install -y chromium`). Chromium runs with a
fresh profile in a temporary folder and with every background download switched off, so the
screenshot shows only what the self-contained page carries. Exits 2 with one line when
Chromium is missing or fails.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
OFFLINE_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars")


def find_chromium() -> str | None:
    return next((path for path in map(shutil.which, CHROMIUM_NAMES) if path), None)


def screenshot(page: Path, png: Path, width: int = 1400, height: int = 1800, timeout: float = 120) -> None:
    chromium = find_chromium()
    if chromium is None:
        raise RuntimeError("no Chromium on PATH (Debian: apt-get install -y chromium)")
    with tempfile.TemporaryDirectory(prefix="rkcompile-chromium-") as profile:
        command = [chromium, *OFFLINE_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                   f"--screenshot={png.resolve()}", page.resolve().as_uri()]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0 or not png.is_file():
        lines = result.stderr.strip().splitlines() or ["no message"]
        raise RuntimeError(f"chromium exited {result.returncode}: {lines[-1]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1800)
    args = parser.parse_args(argv)
    if not args.page.is_file():
        print(f"error: {args.page}: no such file", file=sys.stderr)
        return 2
    try:
        screenshot(args.page, args.png, args.width, args.height)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
