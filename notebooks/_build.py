"""Write the demo notebooks (notebooks/NN-*.ipynb) from the stories below.

    python notebooks/_build.py           # (re)write every notebook
    python notebooks/_build.py --check   # exit 1 if a committed notebook differs from this script

The notebooks are generated so they stay consistent: same first cells, same way of
profiling, outputs cleared, stable cell ids (a re-run rewrites identical bytes).  Edit
the stories here, run the script, commit the .ipynb files it writes.

Each profiled cell is written with ``prof(...)``; its ``expect`` names the functions the
explorer's text summary (its top table) must name; tests/integration/test_notebooks.py
reads them from the cell metadata (``metadata["ddprof_nb"]["expect"]``).  The notebook's
``metadata["ddprof_nb"]["needs"]`` lists the event types its cells sample: the test
skips a notebook whose events the installed engines cannot sample yet.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
META_KEY = "ddprof_nb"


# --------------------------------------------------------------------------------------
# the cell vocabulary


def md(text: str) -> dict:
    return {"kind": "markdown", "source": textwrap.dedent(text).strip("\n")}


def code(text: str, expect: tuple[str, ...] = ()) -> dict:
    """A code cell; ``expect``: strings its text output must contain (checked by the test)."""
    return {"kind": "code", "source": textwrap.dedent(text).strip("\n"), "expect": tuple(expect)}


def prof(body: str, *, events: str = "cpu,wall", interval: str | None = None, labels: dict | None = None,
         name: str | None = None, expect: tuple[str, ...] = (), live: bool = False) -> dict:
    """A cell profiled with ``%%ddprof``; the explorer it shows must name ``expect``.
    ``live``: ``--live``, the live view that becomes the explorer at the end."""
    opts = [f"-e {events}"]
    if live:
        opts.append("--live")
    if interval:
        opts.append(f"-i {interval}")
    for k, v in (labels or {}).items():
        opts.append(f"-l {k}={v}")
    if name:
        opts.append(f"-o {name}")
    source = "%%ddprof " + " ".join(opts) + "\n" + textwrap.dedent(body).strip("\n")
    return {"kind": "code", "source": source, "expect": tuple(expect), "profiled": True, "events": events,
            "live": live}


# --------------------------------------------------------------------------------------
# the stories

SETUP = code("""
    %load_ext ddprof_nb
    import ddprof_nb
""")

NOTEBOOKS: dict[str, dict] = {}


def notebook(name: str, cells: list[dict]) -> None:
    NOTEBOOKS[name] = {"cells": cells}


EVENT_ORDER = ("cpu", "wall", "alloc", "lock", "park")


def needs(cells: list[dict]) -> list[str]:
    """The event types the notebook's %%ddprof cells sample (the test skips it when an
    engine here cannot sample them)."""
    wanted = {e for c in cells if c.get("profiled") for e in c["events"].split(",")}
    return [e for e in EVENT_ORDER if e in wanted]


# -- 01 -------------------------------------------------------------------------------
notebook("01-quickstart", [
    md("""
        # Quick start: why is this cell slow?

        Put `%%ddprof` on the first line of a slow cell. The cell runs as usual while a
        sampler records, 100 times a second, what every thread is doing; when it ends you get
        an **explorer** of the cell: a flame graph, a timeline and a table of the top functions.

        * **cpu** samples where CPU time is burnt, thread by thread;
        * **wall** samples every thread at a fixed rate, on CPU or not: what the cell *waited* for.

        Our slow cell counts the words of 30,000 product reviews, grouped by star rating.
    """),
    SETUP,
    code('''
        import gzip
        import random
        import re
        import time
        from collections import Counter


        def make_reviews(n=30_000, seed=7):
            """A gzipped day of reviews: `id<TAB>stars<TAB>text`, with links, e-mails and prices."""
            rng = random.Random(seed)
            words = ("the battery life is great but screen feels dim and the price was fair shipping took "
                     "forever support never answered would buy again not worth it camera sound keyboard "
                     "charger works perfectly broke after two weeks").split()
            lines = []
            for i in range(n):
                text = [rng.choice(words) for _ in range(rng.randint(15, 45))]
                if rng.random() < 0.3:
                    text.insert(rng.randrange(len(text)), f"https://shop.example/p/{rng.randint(1, 99999)}?ref=review")
                if rng.random() < 0.2:
                    text.insert(rng.randrange(len(text)), f"user{rng.randint(1, 999)}@mail.example")
                if rng.random() < 0.4:
                    text.append(f"#{rng.choice(words)}")
                if rng.random() < 0.5:
                    text.insert(rng.randrange(len(text)), f"{rng.randint(1, 500)}.{rng.randint(0, 99)}")
                lines.append(f"{i}\\t{rng.randint(1, 5)}\\t{' '.join(text)}{rng.choice('.!?')}")
            return gzip.compress("\\n".join(lines).encode())


        def load_reviews(blob):
            for line in gzip.decompress(blob).decode().splitlines():
                review_id, stars, text = line.split("\\t", 2)
                yield int(review_id), int(stars), text


        def tokenize_slow(text):
            """Split a review into lowercase tokens; links and e-mails stay whole, numbers become <num>."""
            tokens = []
            for raw in text.lower().split():
                if re.match(r"https?://", raw):
                    tokens.append(re.sub(r"[.!?]+$", "", raw))
                elif re.fullmatch(r"[\\w.+-]+@[\\w-]+(\\.[\\w-]+)+[.!?]*", raw):
                    tokens.append(re.sub(r"[.!?]+$", "", raw))
                else:
                    word = re.sub(r"^[^\\w#]+|[^\\w]+$", "", raw)
                    if re.fullmatch(r"\\d+([.,]\\d+)*", word):
                        word = "<num>"
                    if word:
                        tokens.append(word)
            return tokens


        STOPWORDS = {"the", "is", "and", "but", "was", "it", "a", "not", "of", "to", "after"}


        def count_terms(reviews, tokenize):
            by_stars = {stars: Counter() for stars in range(1, 6)}
            for _, stars, text in reviews:
                by_stars[stars].update(t for t in tokenize(text) if t not in STOPWORDS)
            return by_stars


        def publish_report(by_stars):
            time.sleep(0.4)  # stands for the upload to the team's dashboard (a network round trip)
            return {stars: counts.most_common(3) for stars, counts in by_stars.items()}


        def run_pipeline(blob, tokenize):
            return publish_report(count_terms(load_reviews(blob), tokenize))


        blob = make_reviews()
        print(f"{len(blob) / 1e6:.1f} MB of gzipped reviews")
    '''),
    md("""
        ## Profile the slow cell

        `-e cpu,wall` picks the event types (these two are the default), `-i 10ms` the sampling
        interval, and `-o slow` names the profile `slow` in `ddprof_nb.history`, where every
        profile the magic takes is kept (the last 20 by default).
    """),
    prof("""
        report = run_pipeline(blob, tokenize_slow)
    """, events="cpu,wall", interval="10ms", name="slow", expect=("tokenize_slow",)),
    md("""
        ## Reading it

        * In the **CPU** view nearly everything sits under `tokenize_slow`, and inside it under
          `re.match`, `re.sub` and `re.fullmatch`: every call looks its pattern up in the `re`
          module's cache (`_compile`) and then scans one short token. Thousands of tiny regex calls
          per review cost more than the matching itself.
        * Switch the explorer to **wall**: `publish_report` appears with ~0.4 s that the CPU view
          cannot show, because the cell was *waiting* then, not computing.

        The same numbers as a text table (`%ddprof top [N] [NAME] [-e EVENT]`):
    """),
    code("""
        %ddprof top 6 slow -e cpu
    """, expect=("tokenize_slow",)),
    md("""
        ## The fix: one compiled pattern, one pass over the text

        `findall` with a single compiled pattern scans the whole review in C. Same tokens:
    """),
    code('''
        TOKEN = re.compile(r"https?://\\S+?(?=[.!?]*(?:\\s|$))"
                           r"|[\\w.+-]+@[\\w-]+(?:\\.[\\w-]+)+?(?=[.!?]*(?:\\s|$))"
                           r"|#?\\w+(?:[.,]\\d+)*")
        NUMBER = re.compile(r"\\d+(?:[.,]\\d+)*")


        def tokenize_fast(text):
            return ["<num>" if NUMBER.fullmatch(t) else t for t in TOKEN.findall(text.lower())]


        sample = [text for _, _, text in load_reviews(blob)][:2000]
        assert all(tokenize_fast(t) == tokenize_slow(t) for t in sample)
        print("same tokens on", len(sample), "reviews")
    ''', expect=("same tokens",)),
    prof("""
        report_fast = run_pipeline(blob, tokenize_fast)
    """, events="cpu,wall", interval="10ms", name="fast", expect=("tokenize_fast",)),
    code("""
        assert report_fast == report
        slow, fast = ddprof_nb.history["slow"], ddprof_nb.history["fast"]  # profiles are kept by name
        print(f"CPU {slow.total('cpu') / 1e9:.2f} s -> {fast.total('cpu') / 1e9:.2f} s, "
              f"elapsed {slow.metadata.duration_ns / 1e9:.2f} s -> {fast.metadata.duration_ns / 1e9:.2f} s")
    """, expect=("CPU",)),
    md("""
        The tokenizer is no longer the bottleneck; the upload wait now is a large share of the
        wall time. `%ddprof diff slow fast` shows both profiles in one differential flame graph
        (see *06-compare-two-versions*).

        **Next:** *02-threads-and-the-gil*: CPU vs wall when threads are involved.
    """),
])

# -- 02 -------------------------------------------------------------------------------
notebook("02-threads-and-the-gil", [
    md("""
        # Threads and the GIL: CPU vs wall

        A nightly job downloads 48 JSON documents from object storage, summarizes them and
        archives them compressed. We give each stage a thread pool. Does it help?

        | stage | what the threads do | with the GIL |
        |---|---|---|
        | download | wait for the network | released while waiting: threads overlap |
        | summarize | run Python code | held: one thread at a time |
        | archive | `zlib` + `hashlib` in C | released by the C code: threads run on every core |

        The profiler tells the stages apart without reading their code: it compares each
        thread's **CPU** time with the **wall** time it was sampled for.

        The storage is a fake: a local HTTP server in this kernel with ~80 ms of latency per
        request (no network is used).
    """),
    SETUP,
    code('''
        import hashlib
        import json
        import random
        import threading
        import time
        import zlib
        from concurrent.futures import ThreadPoolExecutor
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.request import urlopen


        def make_document(doc_id, n_events=2500):
            rng = random.Random(doc_id)
            return {"id": doc_id, "events": [
                {"ts": 1_700_000_000 + i * 7, "user": f"u{rng.randint(1, 500)}",
                 "action": rng.choice(["view", "click", "buy", "search"]),
                 "latency_ms": round(rng.expovariate(1 / 80), 2), "tags": rng.sample("abcde", 2)}
                for i in range(n_events)]}


        class FakeStorage(BaseHTTPRequestHandler):
            """GET /docs/<id> -> a JSON document, after ~80 ms (network + storage backend)."""
            documents = {i: json.dumps(make_document(i)).encode() for i in range(48)}

            def do_GET(self):
                body = self.documents[int(self.path.rsplit("/", 1)[-1])]
                time.sleep(0.08)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass


        server = ThreadingHTTPServer(("127.0.0.1", 0), FakeStorage)
        threading.Thread(target=server.serve_forever, name="fake-storage", daemon=True).start()
        BASE_URL = f"http://127.0.0.1:{server.server_port}/docs"
        print(f"serving {sum(map(len, FakeStorage.documents.values())) / 1e6:.1f} MB at {BASE_URL}")
    ''', expect=("serving",)),
    md("""
        Wall samples carry the thread's state in a label, `state`: `cpu` (running), `gil`
        (runnable, but waiting for the GIL) or `off-cpu` (blocked: sleeping, waiting for I/O or
        a lock). This helper splits the wall time spent under one function by state:
    """),
    code('''
        def where_threads_were(profile, function):
            """Shares of the wall time under `function` by thread state."""
            view = profile.filter(events="wall", focus=f"^{function}$")
            total = view.total("wall") or 1
            return "  ".join(f"{state} {view.filter(labels={'state': state}).total('wall') / total:4.0%}"
                             for state in ("cpu", "gil", "off-cpu"))
    '''),
    md("## Stage 1: download, 8 threads"),
    code('''
        def download(doc_id):
            with urlopen(f"{BASE_URL}/{doc_id}") as response:
                return response.read()
    '''),
    prof("""
        with ThreadPoolExecutor(8, thread_name_prefix="download") as pool:
            raw = list(pool.map(download, range(48)))
    """, name="fetch"),
    md("""
        The CPU view is almost empty: the threads did nearly nothing. Switch the explorer to
        **wall**: the `download` threads sat in `SocketIO.readinto`, waiting for the server.
        Waiting overlaps nicely: 48 requests of 80 ms take about half a second with 8 threads.
    """),
    code("""
        fetch = ddprof_nb.history["fetch"]
        print("download:", where_threads_were(fetch, "download"))
    """, expect=("off-cpu",)),
    md("## Stage 2: summarize, 4 threads"),
    code('''
        def summarize(body):
            doc = json.loads(body)
            per_action = {}
            for event in doc["events"]:
                stats = per_action.setdefault(event["action"], [0, 0.0, set()])
                stats[0] += 1
                stats[1] += event["latency_ms"]
                stats[2].add(event["user"])
            return {action: (n, total / n, len(users)) for action, (n, total, users) in per_action.items()}
    '''),
    prof("""
        with ThreadPoolExecutor(4, thread_name_prefix="summarize") as pool:
            summaries = list(pool.map(summarize, raw * 3))
    """, name="decode", expect=("summarize",)),
    code("""
        decode = ddprof_nb.history["decode"]
        print("summarize:", where_threads_were(decode, "summarize"))
    """, expect=("gil",)),
    md("""
        Four threads, yet the CPU total is no more than the elapsed time: only the thread
        holding the GIL runs Python code, and the other `summarize` threads spend most of their
        wall time in state `gil`: they have work to do but wait for the lock.

        `[GC]` in the CPU view is the cyclic garbage collector: `json.loads` creates millions
        of dicts and lists, and each full collection walks every object of the kernel.

        ## Stage 3: archive, 2 threads (one per core)
    """),
    code('''
        cpu_seconds = {}  # thread id -> CPU time that thread measured itself


        def archive(body):
            start = time.thread_time()
            packed = zlib.compress(body * 2, 9)
            digest = hashlib.sha256(packed).hexdigest()
            tid = threading.get_native_id()
            cpu_seconds[tid] = cpu_seconds.get(tid, 0.0) + time.thread_time() - start
            return digest, len(packed)
    '''),
    prof("""
        with ThreadPoolExecutor(2, thread_name_prefix="archive") as pool:
            archived = list(pool.map(archive, raw))
    """, name="pack", expect=("archive",)),
    md("""
        `zlib.compress` and `hashlib` release the GIL while they work on a large buffer, so
        both threads compute at once: the CPU total approaches twice the elapsed time on two
        idle cores, and the archive threads are in state `cpu` although they do not hold the
        GIL. The three stages side by side (CPU ÷ elapsed = cores kept busy):
    """),
    code("""
        pack = ddprof_nb.history["pack"]
        for stage, p in [("download", fetch), ("summarize", decode), ("archive", pack)]:
            elapsed = p.metadata.duration_ns / 1e9
            cpu = p.total("cpu") / 1e9
            print(f"{stage:10s} elapsed {elapsed:5.2f} s  CPU {cpu:5.2f} s  cores busy {cpu / elapsed:4.2f}  "
                  f"| {where_threads_were(p, stage)}")
    """, expect=("archive",)),
    md("""
        ## Why per-thread CPU timers matter

        A classic profiler asks the kernel for one CPU-time timer for the whole process
        (`setitimer(ITIMER_PROF)`). The total is right, but the signal lands on whichever thread
        happens to run when it fires, so the split *between* threads is skewed; and a thread
        inside C code that released the GIL may never be seen at all.

        ddprof_nb gives each thread a timer on **its own CPU clock** (as Go's runtime and
        async-profiler's `ctimer` do): a thread gets a sample for every 10 ms of CPU it burns,
        whether it runs Python or C. Compare what the profile says about each archive thread
        with what the thread measured itself (`time.thread_time()`):
    """),
    code("""
        for tid, measured in sorted(cpu_seconds.items()):
            sampled = pack.filter(threads=[tid]).total("cpu") / 1e9
            print(f"thread {tid}: measured {measured:5.2f} s CPU, profile says {sampled:5.2f} s")
    """, expect=("profile says",)),
    md("""
        The two columns agree to within a few samples. **Next:** *03-memory*: what a cell
        allocates and what it keeps.
    """),
])

# -- 03 -------------------------------------------------------------------------------
notebook("03-memory", [
    md("""
        # Memory: what a cell allocates, and what it keeps

        `%%ddprof -e alloc` samples allocations (by default one sample per 512 KiB allocated,
        each weighted by the bytes it stands for) and gives two views:

        * **alloc**: every byte the cell allocated, freed or not: where the allocator churns;
        * **live**: what was still allocated when the cell ended: what the cell *keeps*.

        Our cell imports a day of orders from CSV (no pandas) and prices them. The kernel's
        memory grows with every batch. Who is holding on?
    """),
    SETUP,
    code('''
        import csv
        import io
        import random


        def make_orders_csv(day, n=40_000):
            rng = random.Random(day)
            out = io.StringIO()
            w = csv.writer(out)
            w.writerow(["order_id", "customer", "sku", "qty", "unit_price", "created"])
            for i in range(n):
                w.writerow([f"{day}-{i}", f"c{rng.randint(1, 3000)}", f"SKU-{rng.randint(1, 800):04d}",
                            rng.randint(1, 9), f"{rng.uniform(1, 300):.2f}",
                            f"2026-03-{day:02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00"])
            return out.getvalue()


        def parse_orders(text):
            return list(csv.DictReader(io.StringIO(text)))


        _priced = {}  # order id -> priced order, so re-imports of an order are cheap


        def price(order):
            key = order["order_id"]
            if key not in _priced:
                qty, unit = int(order["qty"]), float(order["unit_price"])
                _priced[key] = {**order, "qty": qty, "unit_price": unit, "total": round(qty * unit, 2),
                                "invoice_line": f"{order['sku']} x{qty} @ {unit:.2f} for {order['customer']}"}
            return _priced[key]


        def import_day(day):
            orders = parse_orders(make_orders_csv(day))
            return sum(price(o)["total"] for o in orders)
    '''),
    prof("""
        revenue = [import_day(day) for day in (1, 2, 3)]
    """, events="alloc", name="batch", expect=("parse_orders",)),
    md("""
        The **alloc** view is dominated by parsing: `csv.DictReader` builds a dict per row, and
        the CSV text itself is generated and thrown away. That is churn: it costs time, but it
        is freed when the batch ends.

        Switch the explorer to **live**: what is left after the cell is the `price` cache,
        which keeps a copy of every order ever seen (and nobody re-imports old orders).
    """),
    code("""
        %ddprof top 4 batch -e live
        print(len(_priced), "orders cached")
    """, expect=("price",)),
    md("""
        ## The fix: a bounded cache

        Only recent orders are ever re-imported; `functools.lru_cache` keeps the last 2,048.
    """),
    code('''
        import functools

        _priced.clear()


        @functools.lru_cache(maxsize=2048)
        def price_cached(order_id, sku, customer, qty, unit_price):
            qty, unit = int(qty), float(unit_price)
            return {"order_id": order_id, "total": round(qty * unit, 2),
                    "invoice_line": f"{sku} x{qty} @ {unit:.2f} for {customer}"}


        def import_day_fixed(day):
            orders = parse_orders(make_orders_csv(day))
            return sum(price_cached(o["order_id"], o["sku"], o["customer"], o["qty"], o["unit_price"])["total"]
                       for o in orders)
    '''),
    prof("""
        revenue_fixed = [import_day_fixed(day) for day in (1, 2, 3)]
    """, events="alloc", name="fixed", expect=("parse_orders",)),
    code("""
        assert [round(r, 2) for r in revenue_fixed] == [round(r, 2) for r in revenue]
        batch, fixed = ddprof_nb.history["batch"], ddprof_nb.history["fixed"]
        print(f"live after the cell: {batch.total('live') / 2**20:.1f} MiB -> {fixed.total('live') / 2**20:.1f} MiB")
    """, expect=("live after the cell",)),
    md("""
        Allocation churn is about the same (parsing did not change); what the cell keeps
        dropped to the cache's bounded size.

        ## Arrays: memory allocated in C

        numpy keeps array data outside Python's object allocator, in memory it allocates in C.
        The profile still shows it, as a `[numpy]` leaf under the line that made the array
        (C extensions' own `malloc` calls show as `[malloc]`); `--no-native-alloc` leaves them out.
    """),
    code('''
        import numpy as np


        def load_features(n_rows=100_000):
            raw = np.random.default_rng(0).random((n_rows, 64))  # 51 MB
            return (raw - raw.mean(axis=0)) / raw.std(axis=0)   # a normalised copy: 51 MB more, raw is dropped


        def embed(features):
            return features @ np.random.default_rng(1).random((64, 16))
    '''),
    prof("""
        features = load_features()
        vectors = embed(features)
    """, events="alloc", name="arrays", expect=("load_features",)),
    code("""
        %ddprof top 10 arrays -e live
        arrays = ddprof_nb.history["arrays"]
        held = features.nbytes + vectors.nbytes
        print(f"live: {arrays.total('live') / 2**20:.0f} MiB for {held / 2**20:.0f} MiB of arrays held")
    """, expect=("load_features", "arrays held")),
    md("""
        ## A DataFrame: memory by the line that built it

        pandas stores a frame's columns in numpy blocks, so the same `[numpy]` leaves show
        where a frame's memory went: **live** puts it on the line that built the frame, and
        the sandwich view splits it between the pandas and numpy calls below that line.
        The frame here is ~250 MB (peak ~2x while pandas copies the columns into one block):
        enough to see, small enough for a 2 GB Binder or CI machine. The same cell at 1 GB
        (`load_sales(8_000_000)`) shows ~1 GB on the same line, if the machine has the memory.
    """),
    code('''
        import pandas as pd


        def load_sales(n_rows=2_000_000):
            rng = np.random.default_rng(2)
            return pd.DataFrame({
                "store": rng.integers(0, 500, n_rows),
                "units": rng.integers(1, 20, n_rows, dtype=np.int32),
                **{f"price_week{w}": rng.random(n_rows) for w in range(13)},
                "region": pd.Categorical(rng.choice(["north", "south", "east", "west"], n_rows)),
            })
    '''),
    prof("""
        sales = load_sales()
    """, events="alloc", name="frame", expect=("load_sales",)),
    code("""
        %ddprof top 3 frame -e live --by line
        %ddprof sandwich load_sales frame -e live -n 6
        frame = ddprof_nb.history["frame"]
        truth = sales.memory_usage(deep=True).sum()
        print(f"live: {frame.total('live') / 2**20:.0f} MiB for a DataFrame of {truth / 2**20:.0f} MiB "
              "(memory_usage(deep=True))")
    """, expect=("load_sales", "DataFrame.__init__", "for a DataFrame of")),
    md("""
        **Next:** *04-locks-and-waiting*.
    """),
])

# -- 04 -------------------------------------------------------------------------------
notebook("04-locks-and-waiting", [
    md("""
        # Locks and waiting: `lock` vs `park`

        When threads are slow but not busy, they wait. Two event types say on what:

        * **lock**: time spent acquiring a `threading.Lock`/`RLock` that another thread held:
          *contention*. The stack ends in a `[lock]` frame naming the lock's creation site.
        * **park**: time a thread was blocked waiting *for something to happen*: `Queue.get`,
          `Event.wait`, `Condition.wait`, `Thread.join`, a future's `result()`. The stack ends
          in a frame naming what it waited on.

        Contention is a bug you can fix; parking is often just a worker with nothing to do.
        Our cell ingests request logs with four workers that compress each batch into an
        audit log shared by all of them.
    """),
    SETUP,
    code('''
        import bz2
        import json
        import os
        import queue
        import random
        import tempfile
        import threading
        import time


        def make_event(i):
            rng = random.Random(i)
            return {"seq": i, "user": f"u{rng.randint(1, 5000)}", "path": f"/api/v1/items/{rng.randint(1, 10**6)}",
                    "status": rng.choice([200, 200, 200, 201, 404, 500]), "ms": round(rng.expovariate(1 / 40), 3),
                    "agent": "Mozilla/5.0 (X11; Linux x86_64)"}


        BATCHES = [[make_event(b * 300 + i) for i in range(300)] for b in range(200)]


        class AuditLog:
            """Append-only file of bz2-compressed batches, shared by the workers."""

            def __init__(self, path):
                self._lock = threading.Lock()
                self._file = open(path, "wb")

            def append(self, batch):
                with self._lock:
                    blob = bz2.compress(json.dumps(batch).encode(), 9)
                    self._file.write(len(blob).to_bytes(4, "little") + blob)

            def close(self):
                self._file.close()


        def produce(jobs, n_workers):
            for batch in BATCHES:
                time.sleep(0.001)  # stands for reading the next batch from upstream
                jobs.put(batch)
            for _ in range(n_workers):
                jobs.put(None)


        def worker(jobs, log):
            while (batch := jobs.get()) is not None:
                for event in batch:
                    event["slow"] = event["ms"] > 100
                log.append(batch)


        def ingest(log_class, n_workers=4):
            jobs = queue.Queue(maxsize=8)
            log = log_class(os.path.join(tempfile.mkdtemp(), "audit.log"))
            workers = [threading.Thread(target=worker, args=(jobs, log), name=f"ingest-{i}") for i in range(n_workers)]
            for t in workers:
                t.start()
            produce(jobs, n_workers)
            for t in workers:
                t.join()
            log.close()
    '''),
    prof("""
        ingest(AuditLog)
    """, events="lock,park", name="locked", expect=("append",)),
    md("""
        * **lock**: the workers spend most of their time in `AuditLog.append`, waiting for
          `self._lock`. The lock is held while `bz2.compress` runs, so only one worker
          compresses at a time, although `bz2` releases the GIL and could use both cores.
        * **park**: the rest of the waiting is threads waiting for each other's work: the
          producer in `Queue.put` while the queue is full, workers in `Queue.get` while it is
          empty, the main thread in `Thread.join` until the workers finish.

        ## The fix: compress outside the lock

        Only the write to the shared file needs the lock.
    """),
    code('''
        class AuditLogFixed(AuditLog):
            def append(self, batch):
                blob = bz2.compress(json.dumps(batch).encode(), 9)
                with self._lock:
                    self._file.write(len(blob).to_bytes(4, "little") + blob)
    '''),
    prof("""
        ingest(AuditLogFixed)
    """, events="lock,park", name="unlocked", expect=("worker",)),
    code("""
        locked, unlocked = ddprof_nb.history["locked"], ddprof_nb.history["unlocked"]
        for name, p in [("lock held while compressing", locked), ("lock held only to write", unlocked)]:
            print(f"{name:28s} elapsed {p.metadata.duration_ns / 1e9:5.2f} s   "
                  f"lock wait {p.total('lock') / 1e9:5.2f} s   parked {p.total('park') / 1e9:5.2f} s")
    """, expect=("lock wait",)),
    md("""
        The lock wait all but disappears and the cell gets faster (on two idle cores, close to
        twice). What remains is parking, the normal state of a pipeline whose stages wait for
        each other. **Next:** *05-labels-and-asyncio*.
    """),
])

# -- 05 -------------------------------------------------------------------------------
notebook("05-labels-and-asyncio", [
    md("""
        # Labels and asyncio: which request was slow?

        A flame graph merges every call of a function. When the same code serves different
        requests, customers or experiments, **labels** split it again:

        ```python
        with ddprof_nb.labels(endpoint="/search"):
            ...   # every sample taken in here carries endpoint=/search
        ```

        Labels live in a `contextvars` context, so asyncio tasks inherit them like Go's pprof
        labels: each request handled by its own task keeps its own labels while many tasks
        interleave on one thread. `%%ddprof -l key=value` adds labels to a whole cell.

        Our cell runs a small asyncio web service (no sockets: requests are function calls)
        for 1,500 requests to three endpoints, arriving in bursts of 200.
    """),
    SETUP,
    code('''
        import asyncio
        import hashlib
        import itertools
        import json
        import random
        from concurrent.futures import ThreadPoolExecutor

        PRODUCTS = [{"id": i, "name": f"product {i}", "price": round(random.Random(i).uniform(1, 500), 2),
                     "tags": [f"t{j}" for j in range(i % 7)]} for i in range(5000)]


        async def query_db(ms):
            await asyncio.sleep(ms / 1000)  # the database round trip


        def render_search(term):
            hits = [p for p in PRODUCTS if term in p["name"]]
            hits.sort(key=lambda p: (-p["price"], p["id"]))
            return json.dumps(hits[:200])


        def render_product(product_id):
            return json.dumps(PRODUCTS[product_id])


        def sign_receipt(order):
            digest = order.encode()
            for _ in range(3000):
                digest = hashlib.sha256(digest).digest()
            return digest.hex()


        async def handle(endpoint, arg):
            with ddprof_nb.labels(endpoint=endpoint):
                if endpoint == "/search":
                    await query_db(5)
                    return render_search(arg)
                if endpoint == "/product":
                    await query_db(2)
                    return render_product(arg)
                await query_db(20)
                return sign_receipt(arg)


        def traffic(n, seed=1):
            rng = random.Random(seed)
            for i in range(n):
                r = rng.random()
                if r < 0.3:
                    yield "/search", str(rng.randint(1, 99))
                elif r < 0.9:
                    yield "/product", rng.randrange(len(PRODUCTS))
                else:
                    yield "/checkout", f"order-{i}"


        async def serve(n, concurrency=32, burst=200):
            """Requests arrive ``burst`` at a time; at most ``concurrency`` are handled at once."""
            slots = asyncio.Semaphore(concurrency)

            async def one(endpoint, arg):
                async with slots:
                    return await handle(endpoint, arg)

            requests, responses = traffic(n), []
            while wave := list(itertools.islice(requests, burst)):
                responses += await asyncio.gather(*(one(e, a) for e, a in wave))
            return responses


        def run_service(n):
            """The kernel already runs an event loop on this thread: the service gets its own thread."""
            with ThreadPoolExecutor(1, thread_name_prefix="event-loop") as loop_thread:
                return loop_thread.submit(asyncio.run, serve(n)).result()
    '''),
    prof("""
        responses = run_service(1500)
    """, events="cpu,wall,park", labels={"run": "baseline"}, name="service", expect=("render_search",)),
    md("""
        In the explorer, type `endpoint=/search` in the label filter: the flame graph keeps only
        the samples taken while serving `/search`. The same from code:
    """),
    code("""
        service = ddprof_nb.history["service"]
        for endpoint in ("/search", "/product", "/checkout"):
            view = service.filter(labels={"endpoint": endpoint})
            top = view.top("cpu", n=1)
            print(f"{endpoint:10s} CPU {view.total('cpu') / 1e6:7.0f} ms   top function: {top[0].name if top else '-'}")
    """, expect=("/search",)),
    md("""
        `/search` is only 30% of the requests but most of the CPU: it scans all products and
        sorts the hits for every request. `/checkout` is few requests, each one CPU-heavy
        (`sign_receipt`). `/product` is cheap.

        Every sample carries the cell's `run=baseline` label too, so profiles of different
        runs can be merged and still told apart. Check that the labels followed each request
        across its `await`s: the samples inside a renderer should carry that renderer's
        endpoint.
    """),
    code("""
        for function, endpoint in [("render_search", "/search"), ("sign_receipt", "/checkout")]:
            calls = service.filter(events="cpu", focus=f"^{function}$")
            share = calls.filter(labels={"endpoint": endpoint}).total("cpu") / max(calls.total("cpu"), 1)
            print(f"{function:14s} {share:6.1%} of its CPU samples are labelled endpoint={endpoint}")
    """, expect=("labelled endpoint",)),
    md("""
        While a request awaits, its task is *suspended*: no thread runs it, so a thread
        sampler cannot see it. ddprof_nb samples suspended tasks too, as **park** samples on
        the loop thread's `(asyncio tasks)` twin, each stack ending in what the task awaits
        (`[asyncio.sleep]`, a lock, a semaphore, a queue, a future). Where do the requests wait?
    """),
    code("""
        twins = [t.name for t in service.threads if t.name.endswith("(asyncio tasks)")]
        parked = service.filter(events="park", threads=twins)
        for row in parked.top("park", n=3):
            print(f"{row.name:30s} {row.self / parked.total('park'):6.1%} of the tasks' suspended time")
    """, expect=("[asyncio.Semaphore.acquire]", "[asyncio.sleep]")),
    md("""
        Most of it is requests queueing for one of the 32 slots of the semaphore in `serve`;
        the database round trips (`asyncio.sleep` in `query_db`) are the rest. Waiting
        requests are cheap here, so the fix is a higher `concurrency`, not a faster
        database. (With many pending tasks the sampler draws a random subset of them at each
        tick and scales their weights: the shares are estimates, which move by several
        points from one run to the next.)
    """),
    md("""
        **Next:** *06-compare-two-versions*: did a change make things faster, and where?
    """),
])

# -- 06 -------------------------------------------------------------------------------
notebook("06-compare-two-versions", [
    md("""
        # Compare two versions of the same cell

        "Is the new version faster?" is half a question; the other half is *where* the time
        went. Profile each version with `-o NAME`, then `%ddprof diff A B` shows B against A
        in one **differential flame graph**: red where B spends more, blue where it spends less.

        Our cell loads a day of orders from JSON lines, sorts them by creation time and totals
        them per customer. The two versions differ in how they parse the timestamps.
    """),
    SETUP,
    code('''
        import json
        import random
        from datetime import datetime, timedelta, timezone


        def make_order_lines(n=80_000, seed=3):
            rng = random.Random(seed)
            start = datetime(2026, 3, 1, tzinfo=timezone.utc)
            for i in range(n):
                created = start + timedelta(seconds=rng.randint(0, 86_400))
                yield json.dumps({"id": i, "customer": f"c{rng.randint(1, 2000)}",
                                  "created": created.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                  "amount": round(rng.uniform(1, 300), 2)})


        LINES = list(make_order_lines())


        def daily_totals(lines, parse_created):
            orders = [json.loads(line) for line in lines]
            orders.sort(key=lambda order: parse_created(order["created"]))
            totals = {}
            for order in orders:
                totals[order["customer"]] = totals.get(order["customer"], 0) + order["amount"]
            return orders[0]["id"], orders[-1]["id"], len(totals)


        def parse_created_v1(text):
            return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S%z")


        parse_created_v2 = datetime.fromisoformat  # C code; reads the same ISO 8601 form
    '''),
    prof("""
        before = daily_totals(LINES, parse_created_v1)
    """, name="v1", expect=("parse_created_v1",)),
    prof("""
        after = daily_totals(LINES, parse_created_v2)
    """, name="v2", expect=("daily_totals",)),
    md("""
        `v1` parses each timestamp with `datetime.strptime`, which is Python code
        (`_strptime.py`: a regex match and a dozen field conversions per call); `v2` with
        `datetime.fromisoformat`, written in C. Same result:
    """),
    code("""
        assert before == after
        v1, v2 = ddprof_nb.history["v1"], ddprof_nb.history["v2"]
        print(f"CPU {v1.total('cpu') / 1e9:.2f} s -> {v2.total('cpu') / 1e9:.2f} s "
              f"({v1.total('cpu') / max(v2.total('cpu'), 1):.1f}x less)")
    """, expect=("less",)),
    md("""
        ## The differential flame graph

        Frames are matched by function (name, file, first line), so both runs line up under
        `daily_totals`: `json.loads` and the totals loop stay pale (about the same),
        `parse_created_v1` and `_strptime` below it turn blue (gone in v2). `fromisoformat`
        is C code, so its time is counted in the `<lambda>` that calls it: a thin sliver.
        Red would mark what grew.
    """),
    code("""
        %ddprof diff v1 v2
    """, expect=("daily_totals",)),
    md("""
        Sampling is statistical: at 100 Hz, a function seen in *n* samples is known to about
        ±√n samples. Differences of a few samples are noise; profile longer (or run the cell
        twice and merge) before trusting small ones.

        **Next:** *07-export-and-share*.
    """),
])

# -- 07 -------------------------------------------------------------------------------
notebook("07-export-and-share", [
    md("""
        # Export and share a profile

        A profile is a file you can send: `ddprof_nb.save(profile, path)` picks the format from the
        name (or `format="pprof"`, `"speedscope"`, `"folded"`, `"html"`).

        | name | format | open with |
        |---|---|---|
        | `x.pprof` | gzipped pprof protobuf | `go tool pprof`, Grafana Pyroscope, Datadog, … |
        | `x.speedscope.json` | speedscope | https://www.speedscope.app (drag the file in: it stays in your browser) |
        | `dir/` (existing) | one folded-stacks file per event | `flamegraph.pl`, inferno, speedscope |
        | `x.html` | self-contained report (plotly inlined) | any browser, offline |

        We profile a pandas-free CSV aggregation: a year of hourly readings from 40 weather
        stations, averaged per station and month.
    """),
    SETUP,
    code('''
        import csv
        import io
        import random
        import statistics
        from pathlib import Path


        def make_readings(stations=40, hours=24 * 180, seed=11):
            rng = random.Random(seed)
            out = io.StringIO()
            out.write("station,month,day,hour,temp_c,humidity\\n")
            for s in range(stations):
                for h in range(hours):
                    out.write(f"ST{s:03d},{h // 720 + 1},{h // 24 % 30 + 1},{h % 24},"
                              f"{rng.gauss(12, 8):.1f},{rng.uniform(20, 100):.0f}\\n")
            return out.getvalue()


        def monthly_means(text):
            groups = {}
            for row in csv.DictReader(io.StringIO(text)):
                key = (row["station"], int(row["month"]))
                groups.setdefault(key, []).append(float(row["temp_c"]))
            return {key: statistics.fmean(values) for key, values in groups.items()}


        readings = make_readings()
        exports = Path("exports")
        exports.mkdir(exist_ok=True)
        print(f"{len(readings) / 1e6:.1f} MB of CSV")
    ''', expect=("MB of CSV",)),
    prof("""
        means = monthly_means(readings)
    """, name="weather", expect=("monthly_means",)),
    md("""
        ## pprof, for `go tool pprof` and profiling services
    """),
    code('''
        import shutil
        import subprocess

        weather = ddprof_nb.history["weather"]
        ddprof_nb.save(weather, exports / "weather.pprof")
        print("wrote", exports / "weather.pprof", (exports / "weather.pprof").stat().st_size, "bytes")
        if shutil.which("go"):
            top = subprocess.run(["go", "tool", "pprof", "-top", "-nodecount=8", "-sample_index=cpu",
                                  str(exports / "weather.pprof")], capture_output=True, text=True)
            report = top.stdout
            print(report[report.find("Type:"):] if "Type:" in report else report or top.stderr)
        else:
            print("Go is not installed here; elsewhere run:  go tool pprof -top exports/weather.pprof")
    ''', expect=("weather.pprof",)),
    md("""
        ## speedscope and folded stacks
    """),
    code('''
        ddprof_nb.save(weather, exports / "weather.speedscope.json")
        (exports / "folded").mkdir(exist_ok=True)
        ddprof_nb.save(weather, exports / "folded")
        for path in sorted(exports.rglob("*")):
            if path.is_file():
                print(f"{path.stat().st_size:>10,} bytes  {path}")
        print((exports / "folded" / "cpu.folded").read_text().splitlines()[0][:120], "...")
    ''', expect=("cpu.folded",)),
    md("""
        ## A self-contained HTML report

        One file with the flame graph, the timeline and the top table; plotly.js is inlined
        (≈5 MB), so it opens offline, in a mail attachment or a CI artifact.
    """),
    code('''
        ddprof_nb.save(weather, exports / "weather.html")
        print("wrote", exports / "weather.html", f"{(exports / 'weather.html').stat().st_size / 1e6:.1f} MB")
    ''', expect=("weather.html",)),
    md("""
        ## Reading profiles back

        `ddprof_nb.load` reads pprof, speedscope and folded files (ours or other tools') into a
        `Profile`, so a colleague's file can be explored, filtered and diffed like your own:
    """),
    code('''
        again = ddprof_nb.load(exports / "weather.pprof")
        print(again)
        print("top CPU function:", again.top("cpu", n=1)[0].name, "| before saving:", weather.top("cpu", n=1)[0].name)
        ddprof_nb.Explorer(again)
    ''', expect=("top CPU function",)),
    md("""
        That's the tour. The README lists the command line (`python -m ddprof_nb record …`)
        for profiling scripts outside notebooks.
    """),
])


# -- 08 -------------------------------------------------------------------------------
notebook("08-watching-a-long-cell", [
    md("""
        # Watching a long cell

        "Where is my 20-minute cell now?"  `%%ddprof --live` answers while the cell runs: the
        view appears at the start of the cell and refreshes about once a second with

        - the flame graph of what was sampled so far (CPU, rooted at the cell),
        - the samples per second of each of your threads over the last ten seconds,
        - the elapsed time and the samples taken.

        When the cell ends, the same place becomes the usual explorer of the whole profile.
        The refresh runs in a background thread from what the sampler has already drained
        (nothing is recomputed from the start each second) and costs under 1 % of the
        cell's time (`benchmarks/bench_live.py`).

        Our long cell: a small job in three phases, parsing, a pool of threads scoring the
        records, and a summary.
    """),
    SETUP,
    code('''
        import threading
        import time


        def parse_records(seconds):
            end = time.perf_counter() + seconds
            records = []
            while time.perf_counter() < end:
                records.append(",".join(str(i * i) for i in range(40)).split(","))
            return records


        def score_chunk(records, seconds, out):
            end = time.perf_counter() + seconds
            total = 0
            while time.perf_counter() < end:
                for rec in records[:200]:
                    total += sum(int(x) % 7 for x in rec)
            out.append(total)


        def summarize(scores, seconds):
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                sorted(scores * 1000)
            return max(scores)


        def run_job():
            records = parse_records(1.5)
            scores = []
            workers = [threading.Thread(target=score_chunk, args=(records, 2.0, scores), name=f"scorer-{i}")
                       for i in range(3)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            return summarize(scores, 1.0)
    '''),
    md("""
        Run it under `--live` and watch the flame move from `parse_records` to the
        `scorer-N` threads' `score_chunk` and then to `summarize`:
    """),
    prof("""
        best = run_job()
    """, name="job", live=True, expect=("parse_records", "score_chunk")),
    md("""
        The view above is now the explorer of the whole job.  The profile is in the history
        like any other:
    """),
    code("""
        %ddprof top 5 job -e cpu
    """, expect=("score_chunk", "parse_records")),
    md("""
        ## Across cells, and in plain code

        - `%ddprof start --live` watches every cell until `%ddprof stop`: the view sits under
          the `start` cell and becomes the explorer when you stop.
        - `with ddprof_nb.profile(live=True) as p:` does the same in code run by a notebook.
          Outside a notebook it writes one progress line to stderr when stderr is a terminal
          (elapsed time, samples, the hottest function so far), erased at the end, and
          nothing when stderr is a file or a pipe.
    """),
    code("""
        with ddprof_nb.profile(live=True) as p:
            parse_records(2.0)
        print("hottest:", p.profile.top("cpu", n=1)[0].name)
    """, expect=("hottest: parse_records",)),
])


# --------------------------------------------------------------------------------------
# writing

def build(name: str, spec: dict):
    cells = []
    for i, cell in enumerate(spec["cells"]):
        cid = f"c{i:02d}"
        if cell["kind"] == "markdown":
            nb_cell = new_markdown_cell(cell["source"], id=cid)
        else:
            nb_cell = new_code_cell(cell["source"], id=cid)
            meta = {}
            if cell.get("expect"):
                meta["expect"] = list(cell["expect"])
            if cell.get("profiled"):
                meta["profiled"] = True
            if cell.get("live"):
                meta["live"] = True
            if meta:
                nb_cell.metadata[META_KEY] = meta
        cells.append(nb_cell)
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python", "pygments_lexer": "ipython3"}
    nb.metadata[META_KEY] = {"needs": needs(spec["cells"])}
    nbformat.validate(nb)
    return nb


def render(nb) -> str:
    return nbformat.writes(nb)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a committed notebook differs")
    args = ap.parse_args(argv)
    stale = []
    for name, spec in NOTEBOOKS.items():
        path = HERE / f"{name}.ipynb"
        text = render(build(name, spec))
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(path.name)
        else:
            path.write_text(text, encoding="utf-8")
            print("wrote", path.relative_to(HERE.parent))
    if stale:
        print("out of date (run python notebooks/_build.py):", ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
