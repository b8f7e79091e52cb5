"""The fault suite's short form, run again and again on a loaded machine (``make soak``).

    COZYSTACK_GPU_BIN_DIR=$(cat .cache/bin-dir) .venv/bin/python \
        controller/benchmarks/soak.py [--runs 10] [--burners 4] [--tests test_faults.py,...]

A fault test that passes once and fails the next run is a coin toss in CI, and a toss shows
up more often when the machine is busy: each run here is ``pytest`` on the named test
modules (default: ``tests/integration/test_faults.py``, every scenario) while ``--burners``
processes spin on the CPU beside it (4 on 2 cores gives a load of at least 4). Every run
prints its outcome, its wall time, the load average at its end and each scenario's figures
(the ``[faults]`` lines the tests print); the last lines are the tally, and the exit status
is 1 when any run failed. A failed run's pytest output is kept in ``--keep`` for reading.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.synchronize import Event as StopFlag
from pathlib import Path

CONTROLLER = Path(__file__).resolve().parents[1]
DEFAULT_TESTS = ("tests/integration/test_faults.py",)


def _burn(stop: StopFlag) -> None:
    """One CPU kept busy until ``stop``: arithmetic, checking the flag now and then."""
    x = 0
    while not stop.is_set():
        for i in range(200_000):
            x ^= i * i


@contextmanager
def burning(burners: int) -> Iterator[None]:
    """``burners`` processes spinning on the CPU for the body of the ``with``."""
    stop = multiprocessing.Event()
    procs = [
        multiprocessing.Process(target=_burn, args=(stop,), daemon=True)
        for _burner in range(burners)
    ]
    for proc in procs:
        proc.start()
    try:
        yield
    finally:
        stop.set()
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()


def run_once(index: int, tests: list[str], keep: Path) -> tuple[bool, float, list[str]]:
    """One pytest run of ``tests``: whether it passed, its wall time and its figure lines."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-q", *tests],
        cwd=CONTROLLER,
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.monotonic() - started
    output = result.stdout + result.stderr
    figures = [line.strip() for line in output.splitlines() if line.strip().startswith("[faults]")]
    failed = [line.strip() for line in output.splitlines() if line.startswith("FAILED")]
    ok = result.returncode == 0
    if not ok:
        keep.mkdir(parents=True, exist_ok=True)
        log = keep / f"run-{index:02d}.log"
        log.write_text(output)
        figures += [*failed, f"(pytest output: {log})"]
    return ok, took, figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--burners", type=int, default=4, help="CPU-spinning processes beside")
    parser.add_argument(
        "--tests", default=",".join(DEFAULT_TESTS), help="test paths, comma-separated"
    )
    parser.add_argument("--keep", type=Path, default=CONTROLLER.parent / ".cache" / "soak")
    args = parser.parse_args(argv)
    if not os.environ.get("COZYSTACK_GPU_BIN_DIR"):
        parser.error("set COZYSTACK_GPU_BIN_DIR (make soak does: the built binaries' folder)")
    tests = [t for t in args.tests.split(",") if t]
    print(f"soak: {args.runs} runs of {' '.join(tests)} beside {args.burners} CPU burners")
    passed = 0
    with burning(args.burners):
        for index in range(1, args.runs + 1):
            ok, took, figures = run_once(index, tests, args.keep)
            passed += ok
            load = os.getloadavg()[0]
            print(
                f"run {index:2d}: {'passed' if ok else 'FAILED'} in {took:.0f} s (load {load:.1f})",
                flush=True,
            )
            for line in figures:
                print(f"    {line}", flush=True)
    print(f"soak: {passed} of {args.runs} runs green")
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
