"""The real-control-plane benches: ``csi_real.py --scrape``'s histogram arithmetic, always, and
a smoke run of ``csi_real.py`` and ``library_floor.py`` on the control plane of
``$PYPROVLIB_KUBE_ASSETS`` when it names one holding the Go peers (the CI's real-control-plane
step)."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
from bench_support import BENCH, run_bench
from module_support import load_file


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        return load_file(f"bench_{name}", BENCH / f"{name}.py")
    finally:
        sys.path.remove(str(BENCH))


csi_real = _load("csi_real")


def _series(
    verb: str, resource: str, code: str, buckets: tuple[int, int, int], total: float
) -> str:
    """One label set of apiserver_request_duration_seconds, in the text format: cumulative
    counts for le 0.1, 1 and +Inf, the sum and the count."""
    name = "apiserver_request_duration_seconds"
    labels = f'code="{code}",resource="{resource}",verb="{verb}"'
    lines = [
        f'{name}_bucket{{{labels},le="{le}"}} {count}'
        for le, count in zip(("0.1", "1", "+Inf"), buckets, strict=True)
    ]
    lines += [f"{name}_sum{{{labels}}} {total}", f"{name}_count{{{labels}}} {buckets[-1]}"]
    return "\n".join(lines)


HEADER = (
    "# HELP apiserver_request_duration_seconds Response latency.\n"
    "# TYPE apiserver_request_duration_seconds histogram"
)
METRICS_BEFORE = "\n".join(
    [
        HEADER,
        _series("POST", "persistentvolumes", "201", (10, 10, 10), 0.5),
        _series("POST", "events", "201", (4, 4, 4), 0.2),
        "",
    ]
)
# Ten more PV POSTs answered 201 (between 0.1 and 1 s), ten answered 409 (under 0.1 s), and an
# unrelated series that must not count.
METRICS_AFTER = "\n".join(
    [
        HEADER,
        _series("POST", "persistentvolumes", "201", (10, 20, 20), 6.5),
        _series("POST", "persistentvolumes", "409", (10, 10, 10), 0.5),
        _series("POST", "events", "201", (4, 4, 4), 0.2),
        _series("GET", "persistentvolumes", "200", (99, 99, 99), 1.0),
        "",
    ]
)


def test_a_run_is_the_difference_of_two_reads_summed_over_codes() -> None:
    before = csi_real._buckets(METRICS_BEFORE, csi_real.APISERVER_SERIES)
    after = csi_real._buckets(METRICS_AFTER, csi_real.APISERVER_SERIES)
    run = csi_real._histograms_diff(before, after)
    # The events did not move: no row for them; the GETs are not a series asked for.
    assert set(run) == {"apiserver_post_persistentvolumes"}
    pvs = run["apiserver_post_persistentvolumes"]
    assert pvs["n"] == 20
    assert pvs["mean_s"] == pytest.approx((6.5 + 0.5 - 0.5) / 20)
    # Ten of twenty under 0.1 s, ten in (0.1, 1]: the median is the first bucket's bound, the
    # 99th percentile interpolated in the second bucket, as histogram_quantile does.
    assert pvs["p50_s"] == pytest.approx(0.1)
    assert pvs["p99_s"] == pytest.approx(0.1 + 0.9 * (19.8 - 10) / 10, abs=1e-4)


def test_a_quantile_in_the_open_bucket_is_its_lower_bound() -> None:
    buckets = [(0.1, 1.0), (1.0, 1.0), (math.inf, 5.0)]
    assert csi_real._quantile(buckets, 0.99) == 1.0
    assert csi_real._quantile(buckets, 0.1) == pytest.approx(0.05)


def test_sidecar_series_match_upstream_names_and_labels() -> None:
    text = """\
# TYPE workqueue_queue_duration_seconds histogram
workqueue_queue_duration_seconds_bucket{name="claims",le="1"} 3
workqueue_queue_duration_seconds_bucket{name="claims",le="+Inf"} 4
workqueue_queue_duration_seconds_sum{name="claims"} 6
workqueue_queue_duration_seconds_count{name="claims"} 4
workqueue_queue_duration_seconds_bucket{name="volumes",le="1"} 7
workqueue_queue_duration_seconds_bucket{name="volumes",le="+Inf"} 7
workqueue_queue_duration_seconds_sum{name="volumes"} 1
workqueue_queue_duration_seconds_count{name="volumes"} 7
"""
    figures = csi_real._histograms(text, csi_real.SIDECAR_SERIES)
    assert figures == {"queue_wait": {"n": 4, "mean_s": 1.5, "p50_s": 0.6667, "p99_s": 1.0}}


def _real_plane_with_go_peers() -> Path:
    assets = os.environ.get("PYPROVLIB_KUBE_ASSETS")
    if not assets:
        pytest.skip("PYPROVLIB_KUBE_ASSETS names no real control plane's binaries")
    path = Path(assets)
    missing = [b for b in ("csi-provisioner", "hostpathplugin") if not (path / b).exists()]
    if missing:
        pytest.skip(f"{path} lacks {', '.join(missing)}")
    return path


@pytest.mark.e2e
def test_csi_real_compares_both_peers_stage_by_stage(tmp_path: Path) -> None:
    assets = _real_plane_with_go_peers()
    result = run_bench(
        "csi_real.py",
        f"--assets={assets}",
        "--volumes=5",
        "--runs=1",
        "--peers=go,py",
        "--scrape",
        "--quiet=0.5",
        "--settle=2",
        f"--workdir={tmp_path}",
    )
    runs = {run["peer"]: run for run in result["runs"]}
    assert set(runs) == {"go", "py"}
    for peer, run in runs.items():
        scraped = run["scraped"]
        # Every claim's PV was POSTed once, by this peer, during the run.
        assert scraped["apiserver_post_persistentvolumes"]["n"] == 5, (peer, scraped)
        # Both sidecars serve upstream's histograms: the warm-up claim's call counts too.
        assert scraped["create_volume"]["n"] >= 5, (peer, scraped)
        assert scraped["work"]["n"] >= 5, (peer, scraped)
        assert run["p99_s"] > 0


@pytest.mark.e2e
def test_library_floor_measures_every_call(tmp_path: Path) -> None:
    assets = _real_plane_with_go_peers()
    result = run_bench(
        "library_floor.py",
        f"--assets={assets}",
        "--calls=20",
        "--repeat=1",
        "--concurrency=4",
        f"--workdir={tmp_path}",
    )
    figures = result["results"]
    for call in ("create_volume", "pv_post", "event_post", "watch_line_decode"):
        assert figures[call]["cpu_us"] > 0, (call, figures)
    assert result["per_volume_floor_cpu_ms"] > 0


@pytest.mark.e2e
@pytest.mark.heavy
def test_library_real_measures_every_peer_and_both_phases(tmp_path: Path) -> None:
    assets = _real_plane_with_go_peers()
    if not (assets / "go-hostpath-provisioner").exists():
        pytest.skip(f"{assets} lacks go-hostpath-provisioner")
    result = run_bench(
        "library_real.py",
        f"--assets={assets}",
        "--volumes=5",
        "--runs=1",
        "--quiet=0.5",
        "--settle=2",
        "--floor-calls=20",
        "--peers=go,bare,py",
        f"--workdir={tmp_path}",
    )
    runs = {run["peer"]: run for run in result["runs"]}
    assert set(runs) == {"go", "bare", "py"}
    # The bare peer does the NFS example's work: both events per claim, as pyprovlib writes.
    assert runs["bare"]["events_per_volume"] == runs["py"]["events_per_volume"] == 2.0
    for peer, run in runs.items():
        # Every claim got its PV, POSTed once by the provisioner (the audit log counts its
        # requests alone), and each PV was DELETEd once by it after the claim went.
        assert run["provision_requests_per_volume"]["create persistentvolumes"] == 1.0, peer
        assert run["delete_requests_per_volume"]["delete persistentvolumes"] == 1.0, peer
        assert run["cpu_provision_s_per_1000"] > 0, peer
        assert run["peak_rss_mb"] > 0, peer
        assert run["p99_s"] > 0, peer
    assert result["floor"]["provision_s_per_1000"] > 0
    assert result["floor"]["delete_s_per_1000"] > 0
