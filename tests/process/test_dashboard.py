"""The dashboard, end to end: a tiny sweep, `mlflow server` on its store, headless Chromium.

Flags and timings from ../shared/FACTS.md: the UI needs a virtual-time budget or Chromium
dumps the loading skeleton; one uvicorn worker on 2 cores; /health answers only after the server's slow start.
"""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import HANG

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=15000",
    "--window-size=1400,900",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tiny_sweep, tmp_path_factory):
    """One server for the module's tests: they only read the sweep (a start is slow)."""
    tmp_path = tmp_path_factory.mktemp("mlflow_server")
    port = free_port()
    # its own process group: mlflow server runs uvicorn (and by default a job runner) as child processes
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            tiny_sweep.uri,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=(tmp_path / "server.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # no job runner: its two huey consumers (each a process importing mlflow) run GenAI jobs, not these pages
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + HANG
        while True:
            try:
                if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not become healthy: {(tmp_path / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the group we created above, nothing else
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
        try:  # job consumers that outlived the server
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def chromium(tmp_path: Path, url: str, *action: str) -> str:
    profile = tmp_path / f"profile-{time.monotonic_ns()}"  # a fresh profile per load
    proc = subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *action, url],
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK),
    reason=f"{CHROMIUM} not installed: run tools/ensure-chromium (as root) or apt-get install chromium",
)
def test_dashboard_lists_children_and_parent_artifacts(tiny_sweep, mlflow_server, tmp_path):
    assert tiny_sweep.proc.returncode == 0, tiny_sweep.proc.stderr[-3000:]
    exp = tiny_sweep.parent.info.experiment_id
    sweep_id = tiny_sweep.parent.data.tags["sweep_id"]
    # The runs page nests children under their parent, collapsed; a filter plus a sort by
    # name shows them flat — the same view docs/dashboard.md tells a reader to open.
    query = urllib.parse.urlencode(
        {"searchFilter": f"tags.sweep_id = '{sweep_id}'", "orderByKey": "attributes.run_name", "orderByAsc": "true"},
        quote_via=urllib.parse.quote,
    )
    runs_url = f"{mlflow_server}/#/experiments/{exp}/runs?{query}"
    dom = chromium(tmp_path, runs_url, "--dump-dom")
    for child in tiny_sweep.children:
        assert child.info.run_name in dom
    assert tiny_sweep.parent.info.run_name in dom

    artifacts_url = f"{mlflow_server}/#/experiments/{exp}/runs/{tiny_sweep.parent.info.run_id}/artifacts"
    shot = Path(os.environ.get("POSBENCH_SCREENSHOT_DIR", tmp_path)) / "dashboard_parent_artifacts.png"
    dom = chromium(tmp_path, artifacts_url, "--dump-dom", f"--screenshot={shot}")  # one load: its DOM and a picture
    for name in ("report.md", "report.csv", "val_loss_curves.png", "final_val_loss_heatmap.png"):
        assert name in dom
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one or the loading skeleton


def printed_urls(stdout: str, server: str) -> dict[str, str]:
    """The sweep summary's `cells:` and `report:` URLs, pointed at this test's server."""
    urls = {}
    for line in stdout.splitlines():
        key, _, url = line.strip().partition(":")
        if key in ("cells", "report") and url.strip().startswith("http://127.0.0.1:5000/"):
            urls[key] = url.strip().replace("http://127.0.0.1:5000", server)
    return urls


@pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK),
    reason=f"{CHROMIUM} not installed: run tools/ensure-chromium (as root) or apt-get install chromium",
)
def test_printed_urls_open_the_model_training_view_of_this_sweep(tiny_sweep, mlflow_server, tmp_path):
    urls = printed_urls(tiny_sweep.proc.stdout, mlflow_server)
    assert set(urls) == {"cells", "report"}, tiny_sweep.proc.stdout[-2000:]
    dom = chromium(tmp_path, urls["cells"], "--dump-dom")
    for run in (tiny_sweep.parent, *tiny_sweep.children):
        assert run.info.run_name in dom
    # the Model training view's navigation, not the GenAI view's (Sessions, Judges), which the same page
    # shows without workflowType=machine_learning (checked with MLflow 3.17.2)
    assert "Model registry" in dom and "Judges" not in dom
    dom = chromium(tmp_path, urls["report"], "--dump-dom")
    assert tiny_sweep.parent.info.run_name in dom and "sweep/best_val_loss" in dom
    assert "Model registry" in dom and "Judges" not in dom
