"""`pddflow deploy` as a subprocess for `bench serve` and the end-to-end tests, with a check that
nothing was left behind (worker processes, KV blocks of finished requests)."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from email.message import Message
from pathlib import Path

from pddflow.core.child_python import python_module
from pddflow.core.ports import free_port


def get_json(url: str, timeout: float = 5.0) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def metric_samples(base: str, timeout: float = 10.0) -> list:
    """Every sample a deployment's /metrics shows now (prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{base}/metrics", timeout=timeout) as r:
        text = r.read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def post_json(
    url: str, body: dict, timeout: float = 5.0, key: str | None = None
) -> tuple[int, dict]:
    """key: sent as the Bearer token (pddflow deploy --api-key / --admin-key)."""
    code, out, _ = post(url, body, timeout, key)
    return code, out


def post(
    url: str, body: dict, timeout: float = 5.0, key: str | None = None
) -> tuple[int, dict, Message]:
    """As post_json, with the response's headers (a 503's Retry-After)."""
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), e.headers


def _children_of(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(p.name))
    return out


class LaunchError(RuntimeError):
    pass


class DeployProcess:
    """run_dir None: the deployer makes its own (under tmpdir, when given: its TMPDIR). The
    deployment always gets a fresh admin key (`cut_link`, `degrade_link` send it); api_key, when
    given, guards its /v1 API (default: open, whatever PDDFLOW_API_KEY says here)."""

    def __init__(
        self,
        graph: str | Path,
        run_dir: Path | None,
        *extra: str,
        startup_s: float = 180.0,
        tmpdir: Path | None = None,
        api_key: str | None = None,
    ):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.run_dir = run_dir
        self.api_key = api_key
        self.admin_key = secrets.token_urlsafe(24)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PDDFLOW_ADMIN_KEY": self.admin_key}
        env.pop("PDDFLOW_API_KEY", None)
        if api_key is not None:
            env["PDDFLOW_API_KEY"] = api_key
        if tmpdir is not None:
            env["TMPDIR"] = str(tmpdir)
        self.proc = subprocess.Popen(
            [
                *python_module("pddflow.cli"),
                "deploy",
                str(graph),
                "--port",
                str(self.port),
                *(("--run-dir", str(run_dir)) if run_dir is not None else ()),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out = self.proc.stdout.read().decode()
                raise LaunchError(f"deploy exited with {self.proc.returncode}:\n{out}")
            try:
                code, _ = get_json(f"{self.base}/health", timeout=1)
                if code == 200:
                    self.children = _children_of(self.proc.pid)
                    if self.run_dir is None:
                        self.run_dir = self._own_run_dir(tmpdir)
                    return
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise LaunchError(f"deployment of {graph} did not become ready within {startup_s:g} s")

    def _own_run_dir(self, tmpdir: Path | None) -> Path | None:
        from pddflow.runtime.deploy.run_dir import OWNER_FILE, RUN_DIR_PREFIX

        parent = Path(tmpdir) if tmpdir is not None else Path(tempfile.gettempdir())
        for d in parent.glob(f"{RUN_DIR_PREFIX}*"):
            try:
                if int((d / OWNER_FILE).read_text().split()[0]) == self.proc.pid:
                    return d
            except (OSError, ValueError, IndexError):
                continue
        return None

    def cut_link(self, link: str, seconds: float, after_bytes: int = 0) -> tuple[int, dict]:
        """POST /admin/links/LINK/cut with the deployment's admin key."""
        return post_json(
            f"{self.base}/admin/links/{link}/cut",
            {"seconds": seconds, "after_bytes": after_bytes},
            key=self.admin_key,
        )

    def partition_link(
        self, link: str, seconds: float, loss: float = 1.0, from_cluster: str | None = None
    ) -> tuple[int, dict]:
        """POST /admin/links/LINK/partition with the deployment's admin key."""
        body = {"seconds": seconds, "loss": loss, "from_cluster": from_cluster}
        return post_json(f"{self.base}/admin/links/{link}/partition", body, key=self.admin_key)

    def degrade_link(
        self, link: str, gbps: float, jitter_p99_ms: float | None = None
    ) -> tuple[int, dict]:
        """POST /admin/links/LINK/degrade: the emulated link at `gbps` (and that jitter P99)."""
        body: dict = {"gbps": gbps}
        if jitter_p99_ms is not None:
            body["jitter_p99_ms"] = jitter_p99_ms
        # the frontend waits up to 5 s for each worker that shapes the link
        return post_json(
            f"{self.base}/admin/links/{link}/degrade", body, timeout=30, key=self.admin_key
        )

    def restore_link(self, link: str) -> tuple[int, dict]:
        """POST /admin/links/LINK/restore: the link emulated as declared again."""
        return post_json(
            f"{self.base}/admin/links/{link}/restore", {}, timeout=30, key=self.admin_key
        )

    def worker_pid(self, instance: str) -> int:
        log = self.run_dir / f"{instance.replace('/', '-')}.log"
        pids = re.findall(r"ready \(pid (\d+)\)", log.read_text())
        assert pids, log.read_text()
        return int(pids[-1])  # a restarted worker's log follows its predecessor's

    def health(self) -> dict:
        return get_json(f"{self.base}/health")[1]

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` (with these labels) that /metrics shows now."""
        return sum(
            s.value
            for s in metric_samples(self.base, timeout=5)
            if s.name == name and labels.items() <= s.labels.items()
        )

    def wait_idle(self, timeout_s: float = 20.0) -> dict:
        """Health once no request is live and no worker holds a leg or a block outside its cache
        (or when `timeout_s` has passed)."""
        deadline = time.monotonic() + timeout_s
        while True:
            h = self.health()
            if h.get("live_requests") == 0 and all(
                w["kv_blocks_used"] == w["cached_blocks"] and w["legs"] == 0
                for w in h["workers"].values()
                if w["ready"]
            ):
                return h
            if time.monotonic() > deadline:
                return h
            time.sleep(0.3)

    def wait_ready(self, timeout_s: float = 60.0) -> dict:
        """Health once every running worker is up (none lost, unreachable or starting), or
        AssertionError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            h = self.health()
            if h["status"] == "ready":
                return h
            if time.monotonic() > deadline:
                raise AssertionError(f"not ready within {timeout_s:g} s: {h['workers']}")
            time.sleep(0.2)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out.decode(errors="replace")

    def leftover_children(self) -> list[int]:
        return [
            p
            for p in getattr(self, "children", [])
            if Path(f"/proc/{p}").exists()
            and any(
                m in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
                for m in ("pddflow.runtime.workers", "pddflow.runtime.api.api_process")
            )
        ]
