"""Memory recall at scale: ``Memory.objects.for_subject(...).nearest(v, k=10)`` on PostgreSQL.

    python bench/memory.py [--database-url URL] [--sizes 10000,100000,1000000]
                           [--dimensions 1536] [--queries 300] [--exact-queries 30]
                           [--ef-search 40,100] [--vectors clustered|latent|random]
                           [--max-build-minutes 25] [--insert-rows 2000] [--json out.json]

Fills a database of its own (its memory table emptied first) with synthetic vectors by binary
COPY, one subject holding every row (the hardest case for a filtered index scan: the
subject's filter removes nothing, so the index does all the work), then for each size,
smallest first (the table grows from one size to the next):

* builds the migration's HNSW index (cosine, ``m`` 16, ``ef_construction`` 64, on
  ``embedding::halfvec(1536)``) from scratch and times it: the build rate (rows/s) at one size
  projects the next size's build, and a size projected over ``--max-build-minutes`` is left
  out (said so in the output);
* times ``nearest()`` (the library's own call, its iterative index scan included) for
  ``--queries`` query vectors not in the table, at each ``hnsw.ef_search`` of
  ``--ef-search``: p50 and p99;
* times the exact search (the same call with index scans off: a parallel sequential scan)
  for ``--exact-queries`` of them, and counts recall@10 of each HNSW setting against it;
* times inserts: ``--insert-rows`` texts embedded in batches of the embedding API's limit
  (``offline:hash-embedding`` at the benchmark's dimensions, computed in this process) and
  written with ``bulk_create`` into the indexed table (rows/s, embedding and writing apart),
  then deleted again.

Vectors: ``clustered`` (default) draws each vector around one of 1,000 random centres and
normalises it, as real embeddings of related texts bunch together (its noise spreads over
every dimension); ``latent`` draws the same mixture in 64 dimensions and maps it to
``--dimensions`` by a fixed random matrix, with a little noise in every dimension (an
assumption that text embeddings vary in far fewer directions than they have, not a
measurement of a real model's vectors); ``random`` draws unit
vectors uniformly (almost equidistant in 1,536 dimensions: the hardest case for HNSW). numpy
makes them fast; without it, ``random.gauss`` does (fine for the small sizes of the smoke
test). Targets (issue 42): p50 <= 20 ms, p99 <= 50 ms, recall@10 >= 0.95. See
bench/README.md for a recorded run.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import struct
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout that is not pip-installed
    sys.path.insert(0, str(ROOT))

from bench.step_overhead import ensure_database, load_average, setup_django  # noqa: E402

try:
    import numpy
except ImportError:  # the slow path: random.gauss, for small sizes
    numpy = None

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/agentloop_bench_memory"
SUBJECT = "bench:all"
MODEL = "offline:hash-embedding"
INDEX = "agentloop_memory_hnsw_1536"
CENTRES = 1000
#: the dimensions ``--vectors latent`` varies in before its fixed map to ``--dimensions``
LATENT = 64
TARGETS = {"p50_ms": 20.0, "p99_ms": 50.0, "recall_at_10": 0.95}
K = 10


class Vectors:
    """Seeded synthetic unit vectors: the rows' (by position) and the queries'."""

    def __init__(self, dimensions: int, kind: str, seed: int = 42) -> None:
        self.dimensions = dimensions
        self.kind = kind
        self.seed = seed
        self.centres: Any = None
        if kind == "latent":
            if numpy is None:
                raise SystemExit("--vectors latent needs numpy")
            rng = numpy.random.default_rng([seed, 7])
            # A fixed map from the small space the texts' meanings vary in to the model's
            # dimensions, and the mixture's centres in that small space.
            self.basis = rng.standard_normal((LATENT, dimensions), dtype=numpy.float32)
            self.centres = rng.standard_normal((CENTRES, LATENT), dtype=numpy.float32)
        if kind == "clustered":
            self.centres = [self._gaussian(random.Random(seed + 1 + c)) for c in range(CENTRES)]
            if numpy is not None:
                self.centres = numpy.array(self.centres, dtype=numpy.float32)

    def _gaussian(self, rng: random.Random) -> list[float]:
        return [rng.gauss(0.0, 1.0) for _ in range(self.dimensions)]

    def block(self, start: int, count: int, *, stream: int = 0) -> Any:
        """``count`` unit vectors from position ``start`` of a stream (0: the rows; 1: the
        queries), the same on every run: a numpy array (rows) or a list of lists."""
        if numpy is not None:
            rng = numpy.random.default_rng([self.seed, stream, start])
            if self.kind == "latent":
                which = rng.integers(0, CENTRES, count)
                points = self.centres[which] + 0.6 * rng.standard_normal(
                    (count, LATENT), dtype=numpy.float32
                )
                noise = points @ self.basis + 0.05 * rng.standard_normal(
                    (count, self.dimensions), dtype=numpy.float32
                ) * numpy.sqrt(LATENT, dtype=numpy.float32)
                return noise / numpy.linalg.norm(noise, axis=1, keepdims=True)
            noise = rng.standard_normal((count, self.dimensions), dtype=numpy.float32)
            if self.centres is not None:
                which = rng.integers(0, CENTRES, count)
                noise = self.centres[which] + 0.6 * noise
            norms = numpy.linalg.norm(noise, axis=1, keepdims=True)
            return noise / norms
        rows = []
        rng_py = random.Random(f"{self.seed}:{stream}:{start}")
        for _ in range(count):
            vector = self._gaussian(rng_py)
            if self.centres is not None:
                centre = self.centres[rng_py.randrange(CENTRES)]
                vector = [c + 0.6 * v for c, v in zip(centre, vector, strict=True)]
            norm = math.sqrt(sum(v * v for v in vector))
            rows.append([v / norm for v in vector])
        return rows


def _field(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def _vector_bytes(vector: Any) -> bytes:
    """pgvector's binary form: dimensions, a reserved word, big-endian float4s."""
    if numpy is not None:
        body = numpy.asarray(vector, dtype=">f4").tobytes()
    else:
        body = struct.pack(f">{len(vector)}f", *vector)
    return struct.pack(">HH", len(vector), 0) + body


def fill(url: str, vectors: Vectors, start: int, stop: int) -> float:
    """COPY the rows ``start`` to ``stop`` in PostgreSQL's binary format, over a connection
    of its own; returns the seconds it took."""
    import psycopg

    from agentloop.models import Memory

    table = Memory._meta.db_table
    epoch = datetime(2000, 1, 1, tzinfo=UTC)
    now = struct.pack(">q", int((datetime.now(UTC) - epoch).total_seconds() * 1_000_000))
    fixed_head = struct.pack(">h", 9) + _field(SUBJECT.encode()) + _field(b"")
    fixed_tail = (
        _field(MODEL.encode())
        + _field(struct.pack(">i", vectors.dimensions))
        + _field(now)
        + _field(now)
    )
    jsonb_empty = _field(b"\x01{}")
    started = time.perf_counter()
    chunk = 5000
    columns = (
        "subject, agent, text, metadata, embedding, embedding_model, dimensions, "
        "created_at, updated_at"
    )
    with psycopg.connect(url) as conn, conn.cursor() as cursor:
        with cursor.copy(f'COPY "{table}" ({columns}) FROM STDIN (FORMAT BINARY)') as copy:
            copy.write(b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0))
            for offset in range(start, stop, chunk):
                block = vectors.block(offset, min(chunk, stop - offset))
                copy.write(
                    b"".join(
                        fixed_head
                        + _field(f"memory {position}".encode())
                        + jsonb_empty
                        + _field(_vector_bytes(vector))
                        + fixed_tail
                        for position, vector in enumerate(block, start=offset)
                    )
                )
            copy.write(struct.pack(">h", -1))
    return time.perf_counter() - started


def build_index(dimensions: int, maintenance_work_mem: str) -> float:
    """Drop and build the migration's HNSW index; returns the seconds the build took."""
    from django.db import connection

    from agentloop.models import Memory

    table = Memory._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f'DROP INDEX IF EXISTS "{INDEX}"')
        cursor.execute(f"SET maintenance_work_mem = '{maintenance_work_mem}'")
        started = time.perf_counter()
        # The same statement as migration 0021's (AddHnswIndexOnPostgres).
        cursor.execute(
            f'CREATE INDEX "{INDEX}" ON "{table}" USING hnsw '
            f'(("embedding"::halfvec({dimensions})) halfvec_cosine_ops) '
            f'WHERE "dimensions" = {dimensions}'
        )
        seconds = time.perf_counter() - started
        cursor.execute(f'VACUUM ANALYZE "{table}"')
        cursor.execute("RESET maintenance_work_mem")
    return seconds


def percentile(ordered: list[float], share: float) -> float:
    """The nearest-rank percentile of sorted values."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def latency(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": percentile(ordered, 0.99) * 1000,
        "samples": len(ordered),
    }


def search(queries: list[list[float]], *, exact: bool, ef_search: int) -> tuple[list[Any], list]:
    """Each query's ``nearest()`` primary keys, and the seconds each took."""
    from django.db import connection, transaction

    from agentloop.models import Memory

    found: list[list[int]] = []
    seconds: list[float] = []
    memories = Memory.objects.for_subject(SUBJECT)
    for query in queries:
        with transaction.atomic():
            if exact:
                with connection.cursor() as cursor:
                    # Index scans off: the same statement, answered by a (parallel) scan.
                    cursor.execute("SET LOCAL enable_indexscan = off")
            started = time.perf_counter()
            # nearest() sets hnsw.ef_search for its own statement.
            rows = memories.nearest(query, k=K, ef_search=ef_search)
            seconds.append(time.perf_counter() - started)
        found.append([row.pk for row in rows])
    return found, seconds


def uses_index(query: list[float], ef_search: int) -> bool:
    """Whether ``nearest()``'s plan reads the HNSW index."""
    from django.db import connection, transaction

    from agentloop.models import Memory

    captured: list[str] = []

    def explain(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "ORDER BY" in sql and not captured:
            execute(f"EXPLAIN {sql}", params, many, context)
            captured.extend(str(row[0]) for row in context["cursor"].fetchall())
        return execute(sql, params, many, context)

    with transaction.atomic(), connection.execute_wrapper(explain):
        Memory.objects.for_subject(SUBJECT).nearest(query, k=K, ef_search=ef_search)
    return any(INDEX in line for line in captured)


def inserts(rows: int, dimensions: int) -> dict[str, float]:
    """Embed ``rows`` texts in API-sized batches and bulk_create them into the indexed table."""
    import agentloop
    from agentloop.embeddings.calls import resolve
    from agentloop.models import Memory

    batch = resolve(MODEL)[3].max_batch
    texts = [f"the bench remembers fact number {n} about topic {n % 97}" for n in range(rows)]
    embedding = writing = 0.0
    made: list[int] = []
    for offset in range(0, rows, batch):
        chunk = texts[offset : offset + batch]
        started = time.perf_counter()
        vectors = agentloop.embed(chunk, model=MODEL, dimensions=dimensions, record=False)
        embedded = time.perf_counter()
        created = Memory.objects.bulk_create(
            [
                Memory(subject="bench:inserted", text=text, embedding=vector,
                       embedding_model=MODEL, dimensions=dimensions)
                for text, vector in zip(chunk, vectors, strict=True)
            ],
            batch_size=500,
        )  # fmt: skip
        writing += time.perf_counter() - embedded
        embedding += embedded - started
        made += [memory.pk for memory in created]
    Memory.objects.filter(pk__in=made).delete()
    total = embedding + writing
    return {
        "rows": rows,
        "batch": batch,
        "rows_per_second": rows / total,
        "embedding_seconds": embedding,
        "writing_seconds": writing,
    }


def projected_build(rate: float, built: int, size: int) -> float:
    """Seconds to build at ``size`` from the rate at ``built`` rows (HNSW inserts cost
    about log n each)."""
    return size / rate * (math.log(size) / math.log(max(built, 2)))


def as_lists(block: Any) -> list[list[float]]:
    return block.tolist() if numpy is not None else block


def measure_size(args: argparse.Namespace, vectors: Vectors, size: int) -> dict[str, Any]:
    queries = as_lists(vectors.block(0, args.queries, stream=1))
    row: dict[str, Any] = {"size": size}
    exact, exact_seconds = search(queries[: args.exact_queries], exact=True, ef_search=40)
    row["exact"] = latency(exact_seconds)
    row["hnsw"] = {}
    for ef in args.ef_search:
        indexed = uses_index(queries[0], ef)
        # A plan without the index is the exact scan again: timed on as few queries as it.
        timed = queries if indexed else queries[: args.exact_queries]
        search(timed[:10], exact=False, ef_search=ef)  # warm-up: the index into the cache
        found, seconds = search(timed, exact=False, ef_search=ef)
        hits = [
            len(set(got) & set(truth)) / max(1, len(truth))
            for got, truth in zip(found, exact, strict=False)
        ]
        row["hnsw"][str(ef)] = {
            **latency(seconds),
            "recall_at_10": statistics.mean(hits),
            "uses_index": indexed,
        }
    row["insert"] = inserts(args.insert_rows, args.dimensions)
    return row


def report(results: dict[str, Any]) -> None:
    print()
    print(
        f"memory recall, {results['dimensions']} dimensions, {results['vectors']} vectors, "
        f"k={K}; load average before {results['load_average_before']}, after "
        f"{results['load_average_after']}"
    )
    for row in results["sizes"]:
        made = (
            "rows and index reused (--reuse)"
            if row["build_seconds"] is None
            else f"COPY {row['fill_seconds']:.1f} s, HNSW build {row['build_seconds']:.1f} s "
            f"({row['build_rows_per_second']:.0f} rows/s)"
        )
        print(f"{row['size']:>9} rows: {made}, table+indexes {row['relation_mb']:.0f} MB")
        exact = row["exact"]
        print(
            f"    exact  p50 {exact['p50_ms']:8.2f} ms  p99 {exact['p99_ms']:8.2f} ms"
            f"  ({exact['samples']} queries)"
        )
        for ef, cell in row["hnsw"].items():
            met = (
                cell["p50_ms"] <= TARGETS["p50_ms"]
                and cell["p99_ms"] <= TARGETS["p99_ms"]
                and cell["recall_at_10"] >= TARGETS["recall_at_10"]
            )
            print(
                f"    hnsw ef_search={ef:<4} p50 {cell['p50_ms']:7.2f} ms  p99 "
                f"{cell['p99_ms']:7.2f} ms  recall@10 {cell['recall_at_10']:.3f}"
                f"{'' if cell['uses_index'] else '  (NO index in the plan)'}"
                f"  targets {'met' if met else 'MISSED'}"
            )
        insert = row["insert"]
        print(
            f"    insert {insert['rows_per_second']:.0f} rows/s ({insert['rows']} rows, "
            f"embedded in batches of {insert['batch']}: embedding "
            f"{insert['embedding_seconds']:.2f} s, writing {insert['writing_seconds']:.2f} s)"
        )
    for size, why in results["skipped"].items():
        print(f"{size:>9} rows: not run ({why})")


def sizes_of(text: str) -> list[int]:
    return sorted({int(part.replace("_", "")) for part in text.split(",") if part.strip()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default=DEFAULT_DATABASE_URL, help="a database of its own: emptied"
    )
    parser.add_argument("--sizes", type=sizes_of, default=sizes_of("10000,100000,1000000"))
    parser.add_argument("--dimensions", type=int, default=1536)
    parser.add_argument("--queries", type=int, default=300, help="HNSW queries per setting")
    parser.add_argument("--exact-queries", type=int, default=30, help="exact queries per size")
    parser.add_argument(
        "--ef-search", type=lambda text: [int(p) for p in text.split(",")], default=[40, 100]
    )
    parser.add_argument("--vectors", choices=["clustered", "latent", "random"], default="clustered")
    parser.add_argument("--max-build-minutes", type=float, default=25.0)
    parser.add_argument("--maintenance-work-mem", default="4GB")
    parser.add_argument("--insert-rows", type=int, default=2000)
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="search the rows and index a previous run of one size left (no fill, no build)",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    if args.dimensions != 1536:
        parser.error("the HNSW index of migration 0021 is on 1,536 dimensions")
    if not args.sizes or args.sizes[0] < 100 or args.queries < 1 or args.exact_queries < 1:
        parser.error("--sizes from 100 up, --queries and --exact-queries at least 1")
    args.exact_queries = min(args.exact_queries, args.queries)

    ensure_database(args.database_url)
    setup_django(args.database_url)
    from django.db import connection

    from agentloop.models import Memory

    reused = False
    with connection.cursor() as cursor:
        if args.reuse:
            cursor.execute(f'SELECT count(*) FROM "{Memory._meta.db_table}"')
            count = cursor.fetchone()[0]
            cursor.execute("SELECT 1 FROM pg_indexes WHERE indexname = %s", [INDEX])
            reused = len(args.sizes) == 1 and count == args.sizes[0] and cursor.fetchone()
            if not reused:
                parser.error(f"--reuse: the table holds {count} rows (and its index?), not --sizes")
        else:
            cursor.execute(f'TRUNCATE "{Memory._meta.db_table}" RESTART IDENTITY CASCADE')
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        pgvector_version = cursor.fetchone()[0]
        cursor.execute("SHOW server_version")
        server = cursor.fetchone()[0]
    vectors = Vectors(args.dimensions, args.vectors)
    results: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "dimensions": args.dimensions,
        "vectors": args.vectors,
        "generator": "numpy" if numpy is not None else "random.gauss",
        "postgresql": server,
        "pgvector": pgvector_version,
        "maintenance_work_mem": args.maintenance_work_mem,
        "load_average_before": load_average(),
        "sizes": [],
        "skipped": {},
    }
    started = time.perf_counter()
    filled = 0
    rate: float | None = None
    for size in args.sizes:
        if rate is not None:
            projected = projected_build(rate, filled, size)
            if projected > args.max_build_minutes * 60:
                results["skipped"][str(size)] = (
                    f"its HNSW build projects to {projected / 60:.0f} min at "
                    f"{rate:.0f} rows/s, over --max-build-minutes {args.max_build_minutes:g}"
                )
                print(f"skipping {size}: {results['skipped'][str(size)]}", flush=True)
                continue
        if reused:
            # --reuse: the rows and index a previous run left (its fill and build not timed).
            fill_seconds = build = None
            filled = size
            print(f"{size} rows and their index reused; searching", flush=True)
        else:
            with connection.cursor() as cursor:
                # Rows go in without the index (built after: far faster than row by row).
                cursor.execute(f'DROP INDEX IF EXISTS "{INDEX}"')
            fill_seconds = fill(args.database_url, vectors, filled, size)
            filled = size
            print(f"{size} rows written in {fill_seconds:.1f} s; building the index", flush=True)
            build = build_index(args.dimensions, args.maintenance_work_mem)
            rate = size / build
            print(f"  built in {build:.1f} s ({rate:.0f} rows/s); searching", flush=True)
        row = measure_size(args, vectors, size)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_total_relation_size(%s)", [Memory._meta.db_table])
            relation = cursor.fetchone()[0]
        row.update(
            fill_seconds=fill_seconds,
            build_seconds=build,
            build_rows_per_second=None if build is None else rate,
            relation_mb=relation / 2**20,
        )
        results["sizes"].append(row)
    results["seconds"] = time.perf_counter() - started
    results["load_average_after"] = load_average()
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
