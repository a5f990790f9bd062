"""dask=client: every worker of a dask.distributed cluster is profiled and merged.

GIVEN a two-worker LocalCluster (processes=True)
WHEN the client profiles with dask=client while each worker runs a hot function
THEN the hot function appears under each worker's ``worker``/``pid`` labels, each
worker's CPU total matches its process CPU time (within 10%), and a worker killed
mid-profile gives a partial profile whose notes name it.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

import ddprof_nb

distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed (pip install 'dask[distributed]')")

HOT_S = 0.6


def dask_hot(seconds: float):
    """Burn ``seconds`` of this thread's CPU; return (pid, thread CPU seconds spent)."""
    t0 = time.thread_time()
    x = 0
    while time.thread_time() - t0 < seconds:
        for i in range(5000):
            x += i
    return os.getpid(), time.thread_time() - t0


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=50)
    c = distributed.Client(cluster)
    c.wait_for_workers(2, timeout=60)
    try:
        yield c
    finally:
        c.close()
        cluster.close()


def test_two_workers_hot_function_and_cpu_totals(client):
    workers = sorted(client.scheduler_info()["workers"])
    with ddprof_nb.profile(events=("cpu", "wall"), dask=client) as p:
        before = client.run(time.process_time)
        futures = [client.submit(dask_hot, HOT_S, pure=False, workers=[w]) for w in workers]
        results = dict(client.gather(futures))
        after = client.run(time.process_time)
    prof = p.profile
    pid_of = client.run(os.getpid)
    assert prof.metadata.extra.get("dask_workers") == "2", prof.metadata.notes
    for addr in workers:
        pid = pid_of[addr]
        assert pid in results
        mine = prof.filter(labels={"worker": addr}, events="cpu")
        assert {ls.get("pid") for ls in mine.labelsets if ls.get("worker") == addr} == {str(pid)}
        hot = mine.filter(focus="^dask_hot$")
        # the hot function's own thread CPU, and the whole worker process's CPU
        assert hot.total("cpu") / 1e9 == pytest.approx(results[pid], rel=0.10), (addr, hot.total("cpu"))
        measured = after[addr] - before[addr]
        got = mine.total("cpu") / 1e9
        assert got == pytest.approx(measured, rel=0.10), (addr, got, measured)
    # the client's own samples are labelled too, so the explorer can filter by worker
    assert any(ls.get("worker") == "client" for ls in prof.labelsets)


def test_killed_worker_gives_partial_profile_and_names_it(client):
    workers = sorted(client.scheduler_info()["workers"])
    pid_of = client.run(os.getpid)
    victim, survivor = workers
    with ddprof_nb.profile(events="cpu", dask=client) as p:
        client.gather(client.submit(dask_hot, 0.3, pure=False, workers=[survivor]))
        os.kill(pid_of[victim], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while victim in client.scheduler_info()["workers"] and time.monotonic() < deadline:
            time.sleep(0.1)
    prof = p.profile
    assert any(victim in n and "missing" in n for n in prof.metadata.notes), prof.metadata.notes
    assert prof.filter(labels={"worker": survivor}, focus="^dask_hot$").total("cpu") > 0.2e9
    client.wait_for_workers(2, timeout=60)  # the nanny restarts it


def dask_nap(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


@pytest.mark.alone  # (beside other tests at load 10 a worker's machinery thread was wall-sampled once)
def test_idle_machinery_threads_are_not_sampled_but_task_threads_are(client):
    # per-second sampling costs grow with each sampled thread: the workers' forever-blocked
    # machinery threads are left out, the threads running tasks are still wall-sampled
    workers = sorted(client.scheduler_info()["workers"])
    names = client.run(lambda: sorted(t.name for t in __import__("threading").enumerate()))
    assert all(any(n == "Nanny stop queue watch" for n in ns) for ns in names.values()), names
    with ddprof_nb.profile(events="wall", dask=client) as p:
        client.gather([client.submit(dask_nap, 0.3, pure=False, workers=[w]) for w in workers])
    prof = p.profile
    assert any("not sampled" in n and "Nanny stop queue watch" in n for n in prof.metadata.notes), prof.metadata.notes
    for addr in workers:
        mine = prof.filter(labels={"worker": addr})
        threads = {t.name for t in mine.threads if mine.filter(threads=[t.tid]).total("wall") > 0}
        assert not any("Nanny stop queue" in n or "monitor_parent" in n for n in threads), threads
        assert mine.filter(focus="^dask_nap$").total("wall") / 1e9 == pytest.approx(0.3, rel=0.25), threads


def test_a_sampler_orphaned_by_an_earlier_profile_of_this_client_is_replaced(client):
    # GIVEN a worker still sampling for an earlier profile of this client process, which
    # skipped it at finish (the scheduler had briefly lost it)
    from ddprof_nb import dask_support
    from ddprof_nb.config import SamplerConfig

    victim = sorted(client.scheduler_info()["workers"])[0]
    spec = {"client_pid": os.getpid(), **SamplerConfig.make(events="cpu").to_spec()}
    orphan = f"{__import__('socket').gethostname()}:{os.getpid()}/dead"
    r = client.run(dask_support._worker_start, spec, orphan, workers=[victim])
    assert r[victim].get("engine"), r
    # WHEN this client profiles again / THEN both workers are profiled and merged
    with ddprof_nb.profile(events="cpu", dask=client) as p:
        client.gather([client.submit(dask_hot, 0.2, pure=False, workers=[w])
                       for w in client.scheduler_info()["workers"]])
    assert p.profile.metadata.extra.get("dask_workers") == "2", p.profile.metadata.notes
    assert client.run(lambda: sorted(__import__("ddprof_nb.dask_support").dask_support._worker_samplers),
                      workers=[victim]) == {victim: []}
