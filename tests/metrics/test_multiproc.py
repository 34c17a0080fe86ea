"""The multiprocess directory: unique per instance, wiped at boot, refused when set up too late."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from podium.metrics import multiproc
from tests.support.subproc import run_python

RECORD_AND_RENDER = """
    import json, os, shutil
    from pathlib import Path
    base = Path({base!r})
    {before}
    from podium.metrics.multiproc import prepare_multiproc_dir
    path = prepare_multiproc_dir(base)
    from podium.metrics import server, exposition
    for _ in range({num_requests}):
        server.observe_request("openai", "/v1/completions", "smol", "1", 200, 0.2)
    body, _ = exposition.render(None)
    line = next(l for l in body.decode().splitlines()
                if l.startswith("podium:requests_total{{"))
    print(json.dumps({{"dir": str(path), "pid": os.getpid(), "line": line,
                      "files": sorted(os.listdir(path))}}))
    {after}
"""


def record(base: Path, num_requests: int, before: str = "", after: str = "") -> dict:
    return run_python(
        RECORD_AND_RENDER.format(
            base=str(base), num_requests=num_requests, before=before, after=after
        )
    )


def test_stale_db_in_the_claimed_dir_does_not_leak(tmp_path: Path) -> None:
    # A previous run counted 5 requests and died without cleaning up.
    first = record(tmp_path, 5, after="os._exit(0)")
    assert first["line"].endswith(" 5.0")
    stale = next(Path(first["dir"]).glob("counter_*.db"))
    # The new process lands in a directory holding that file (a reused pid, a reused name).
    second = record(
        tmp_path,
        1,
        before=(
            f"d = base / f'instance-{{os.getpid()}}'; d.mkdir(parents=True, exist_ok=True); "
            f"shutil.copy({str(stale)!r}, d / 'counter_1.db')"
        ),
    )
    assert second["dir"] == str(tmp_path / f"instance-{second['pid']}")
    assert "counter_1.db" not in second["files"]
    assert second["line"].endswith(" 1.0"), second["line"]


def test_directory_of_a_dead_instance_is_removed(tmp_path: Path) -> None:
    first = record(tmp_path, 3, after="os._exit(0)")
    assert Path(first["dir"]).exists()
    second = record(tmp_path, 1)
    assert not Path(first["dir"]).exists()
    assert second["line"].endswith(" 1.0")


def test_two_live_instances_never_share_a_directory(tmp_path: Path) -> None:
    held = os.open(tmp_path / "ignored", os.O_CREAT | os.O_RDWR)
    try:
        first, fd_first = multiproc._claim(tmp_path)
        # Same pid, so same preferred name: the lock on the first forces a second directory.
        second, fd_second = multiproc._claim(tmp_path)
        assert first != second
        multiproc._remove_dead_siblings(tmp_path)
        assert first.exists() and second.exists(), "a live instance's directory was removed"
        os.close(fd_first)
        multiproc._remove_dead_siblings(tmp_path)
        assert not first.exists() and second.exists()
        os.close(fd_second)
    finally:
        os.close(held)


def test_concurrent_instances_do_not_see_each_others_metrics(tmp_path: Path) -> None:
    # Instance A counts 4 requests and stays alive, waiting on stdin, then renders again.
    code = RECORD_AND_RENDER.format(
        base=str(tmp_path),
        num_requests=4,
        before="",
        after=(
            "import sys; sys.stdout.flush(); sys.stdin.readline(); "
            "body, _ = exposition.render(None); "
            "print(json.dumps([l for l in body.decode().splitlines() "
            "if l.startswith('podium:requests_total{')][0]))"
        ),
    )
    a = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent,
        env={k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"},
    )
    try:
        first = json.loads(a.stdout.readline())
        second = record(tmp_path, 2)  # instance B starts while A is live
        assert second["dir"] != first["dir"]
        assert Path(first["dir"]).exists(), "B removed a live instance's directory"
        assert second["line"].endswith(" 2.0"), second["line"]
        out, _ = a.communicate("go\n", timeout=30)
        assert json.loads(out.strip().splitlines()[-1]).endswith(" 4.0")
    finally:
        a.kill()


def test_refuses_when_prometheus_client_was_imported_first(tmp_path: Path) -> None:
    result = run_python(
        f"""
        import json, prometheus_client
        from podium.metrics.multiproc import prepare_multiproc_dir, MultiprocDirError
        try:
            prepare_multiproc_dir({str(tmp_path)!r})
        except MultiprocDirError as exc:
            print(json.dumps({{"error": str(exc)}}))
        """
    )
    assert "prepare_multiproc_dir() before importing" in result["error"]


def test_wipe_keeps_only_the_lock(tmp_path: Path) -> None:
    (tmp_path / multiproc.LOCK_NAME).touch()
    (tmp_path / "counter_7.db").write_bytes(b"x")
    (tmp_path / "gauge_livesum_7.db").write_bytes(b"x")
    (tmp_path / "junk").mkdir()
    assert multiproc.wipe(tmp_path) == 3
    assert [p.name for p in tmp_path.iterdir()] == [multiproc.LOCK_NAME]


def test_exports_the_directory_for_child_processes(tmp_path: Path) -> None:
    result = run_python(
        f"""
        import json, os
        from pathlib import Path
        from podium.metrics.multiproc import prepare_multiproc_dir
        path = prepare_multiproc_dir(Path({str(tmp_path)!r}))
        again = prepare_multiproc_dir(Path({str(tmp_path)!r}))
        print(json.dumps({{"env": os.environ["PROMETHEUS_MULTIPROC_DIR"], "dir": str(path),
                          "again": str(again)}}))
        """
    )
    assert result["env"] == result["dir"] == result["again"]
    assert Path(result["dir"]).parent == tmp_path.resolve()
