"""Run the frameworks' own test suites against abridge's adapters (see suites.py).

    python python/upstream/run.py --fetch          # download the pinned sources and test needs (PyPI)
    python python/upstream/run.py [SUITE ...]      # run them (all by default) and print the counts

The sources are kept in ``$ABRIDGE_UPSTREAM_DIR`` (default ``~/.cache/abridge/upstream``), one
folder per suite. Running needs the ``abridge`` and ``abridge-test-llm`` binaries (from
``target/debug``, or ``ABRIDGE_BIN`` / ``ABRIDGE_TEST_LLM_BIN``). Exits 1 when an applicable
test fails, 2 when the sources are not fetched.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from suites import COMMON_NEEDS, SUITES, Suite  # noqa: E402

DIR = Path(os.environ.get("ABRIDGE_UPSTREAM_DIR") or Path.home() / ".cache/abridge/upstream")

# The suite that replaces a database-starting conftest: the names its test module imports.
OWN_CONFTEST = '''"""abridge's stand-in for the suite's conftest (which starts PostgreSQL): the names the
test module imports, and no database."""
import pytest

from tests.embed_test_utils import CharacterEmbeddings

DEFAULT_URI = "postgres://unused-by-abridge/"
VECTOR_TYPES = ["vector"]


@pytest.fixture
def fake_embeddings() -> CharacterEmbeddings:
    return CharacterEmbeddings(dims=500)
'''


def folder(s: Suite) -> Path:
    return DIR / s.name / s.sdist.replace("==", "-")


def installed(need: str) -> bool:
    """Whether a pinned need (``name[extra]==version``) is installed at that version."""
    import importlib.metadata as md

    name, _, version = need.partition("==")
    try:
        return md.version(name.split("[")[0]) == version
    except md.PackageNotFoundError:
        return False


def fetch(s: Suite) -> None:
    needs = [n for n in (*COMMON_NEEDS, *s.needs) if not installed(n)]
    if needs:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *needs], check=True)
    dest = folder(s)
    if (dest / ".done").exists():
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                        ":all:", "-d", tmp, s.sdist], check=True)
        (archive,) = Path(tmp).glob("*.tar.gz")
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        with tarfile.open(archive) as tar:
            top = tar.getnames()[0].split("/")[0]
            for m in tar.getmembers():
                rel = m.name[len(top) + 1:]
                if any(rel == t or rel.startswith(t + "/") for t in s.take) and (m.isfile() or m.isdir()):
                    m.name = rel
                    tar.extract(m, dest, filter="data")
    if s.own_conftest:
        (dest / "tests" / "conftest.py").write_text(OWN_CONFTEST)
    (dest / ".done").write_text(s.sdist)


def run(s: Suite) -> dict:
    dest = folder(s)
    if not (dest / ".done").exists():
        print(f"{s.name}: not fetched; run `python {Path(__file__)} --fetch` first", file=sys.stderr)
        sys.exit(2)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        env = dict(os.environ, ABRIDGE_UPSTREAM_SUITE=s.name, ABRIDGE_UPSTREAM_REPORT=str(report),
                   PYTHONPATH=os.pathsep.join([str(HERE), str(dest)]))
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "plugin", "-p", "no:cacheprovider",
               "-o", "asyncio_mode=auto", "-o", "asyncio_default_fixture_loop_scope=function",
               "--rootdir", str(dest), "--basetemp", str(Path(tmp) / "t"), *s.run]
        subprocess.run(cmd, cwd=dest, env=env)
        if not report.exists():
            return {"suite": s.name, "sdist": s.sdist, "passed": 0, "failed": -1, "not_applicable": {}}
        return json.loads(report.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fetch", action="store_true", help="download the pinned sources and test needs")
    ap.add_argument("--check", action="store_true", help="exit 2 unless every suite is fetched")
    ap.add_argument("suites", nargs="*", help="suite names (default: all)")
    a = ap.parse_args()
    chosen = [s for s in SUITES if not a.suites or s.name in a.suites]
    if a.check:
        missing = [s.name for s in chosen if not (folder(s) / ".done").exists()]
        missing += [n for s in chosen for n in (*COMMON_NEEDS, *s.needs) if not installed(n)]
        if missing:
            print(f"not fetched: {', '.join(missing)}", file=sys.stderr)
            sys.exit(2)
        return
    if a.fetch:
        for s in chosen:
            fetch(s)
            print(f"{s.name}: {s.sdist} in {folder(s)}")
        return
    results = [run(s) for s in chosen]
    print("\nThe frameworks' own suites against abridge's adapters:")
    bad = False
    for r in results:
        crashed = r["failed"] < 0
        bad |= crashed or r["failed"] > 0
        status = "did not run" if crashed else f"{r['passed']} passed, {r['failed']} failed"
        known = len(r.get("known_failures", {}))
        print(f"  {r['suite']} ({r['sdist']}): {status}, {len(r['not_applicable'])} not applicable"
              + (f", {known} known failures" if known else ""))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
