"""Screenshot of the extender's page (`GET /`) on the demo cluster with the demo queue pending, in Debian's
headless Chromium: `python scripts/view_screenshot.py [--out docs/view.png]`."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from test_view import chromium_args, demo_store  # noqa: E402

from benchmarks.local_server import LocalServer  # noqa: E402
from extender.app import create_app  # noqa: E402
from extender.binder import MemoryBinder  # noqa: E402
from extender.config import Settings  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(ROOT / "docs" / "view.png"))
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    with LocalServer(create_app(Settings(), demo_store(), MemoryBinder())) as server, \
            tempfile.TemporaryDirectory() as profile:
        subprocess.run([*chromium_args(chromium, profile), "--hide-scrollbars", "--window-size=1400,1300",
                        f"--screenshot={args.out}", f"{server.url}/"], check=True, capture_output=True, timeout=120)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
