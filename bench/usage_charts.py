"""The admin's usage charts at scale: their grouped queries over 1,000,000 usage rows.

    python bench/usage_charts.py [--database-url URL] [--rows 1000000] [--days 365]
                                 [--owners 1000] [--repeats 7] [--json out.json]

Fills a database of its own (the usage table emptied first) with ``--rows`` usage rows by one
``INSERT ... SELECT generate_series``: spread over the last ``--days`` days, 12 models, and
``--owners`` owners, then ``VACUUM ANALYZE`` (as autovacuum would, so the visibility map
lets the covering index answer alone). For a 30-day and a 365-day range it times, medians
over ``--repeats`` runs, each chart's one query as the page runs it
(``agentloop.admin.usage_charts.daily_by_model`` and ``top_owners_query``), and drawing the
three SVG charts from the rows; then prints ``EXPLAIN (ANALYZE, BUFFERS)`` of each query.
docs/usage-charts.md shows a recorded run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout that is not pip-installed
    sys.path.insert(0, str(ROOT))

from bench.step_overhead import ensure_database, load_average, setup_django  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/agentloop_bench_usage"
MODELS = (
    ("openai", "gpt-4.1"), ("openai", "gpt-4.1-mini"), ("openai", "gpt-4.1-nano"),
    ("openai", "o4-mini"), ("openai", "gpt-5"), ("anthropic", "claude-sonnet-4-5"),
    ("anthropic", "claude-haiku-4-5"), ("anthropic", "claude-opus-4-1"),
    ("gemini", "gemini-2.5-pro"), ("gemini", "gemini-2.5-flash"),
    ("bedrock", "amazon.nova-pro-v1:0"), ("azure", "gpt-4o"),
)  # fmt: skip


def fill(rows: int, days: int, owners: int) -> float:
    """Empty the usage table and insert ``rows`` rows; seconds it took (insert + vacuum)."""
    from django.db import connection

    started = time.perf_counter()
    providers = "ARRAY[" + ", ".join(f"'{p}'" for p, _ in MODELS) + "]"
    models = "ARRAY[" + ", ".join(f"'{m}'" for _, m in MODELS) + "]"
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE agentloop_usage")
        cursor.execute(
            "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, "
            "email, is_staff, is_active, date_joined) "
            "SELECT '', false, 'bench-owner-' || g, '', '', '', false, true, now() "
            "FROM generate_series(1, %s) AS g ON CONFLICT (username) DO NOTHING",
            [owners],
        )
        cursor.execute(
            "SELECT array_agg(id ORDER BY id) FROM auth_user WHERE username LIKE 'bench-owner-%%'"
        )
        (owner_ids,) = cursor.fetchone()
        # One statement: a skewed mix of models (the first ones busiest) and owners. The
        # numbers are ints of ours; "%%" is SQL's modulo next to the one parameter.
        cursor.execute(
            f"""
            INSERT INTO agentloop_usage (
                provider, model, status, input_tokens, output_tokens, cache_read_tokens,
                cache_write_tokens, reasoning_tokens, cost, error, duration_ms, created_at,
                owner_id, chat_id, message_id)
            SELECT ({providers})[m], ({models})[m],
                   CASE WHEN g %% 50 = 0 THEN 'failed' ELSE 'succeeded' END,
                   1000 + (g * 37) %% 20000, 50 + (g * 11) %% 2000, 0, 0, 0,
                   round(((1000 + (g * 37) %% 20000) * 0.000002 * m)::numeric, 8),
                   '', 300 + g %% 5000,
                   now() - (random() * {int(days)}) * interval '1 day',
                   (%s::bigint[])[1 + (g::bigint * 7919) %% {len(owner_ids)}], NULL, NULL
            FROM (SELECT g, 1 + floor(power(random(), 2) * {len(MODELS)})::int AS m
                  FROM generate_series(1, {int(rows)}) AS g) AS numbered
            """,  # noqa: S608 - only our own integers and constants are formatted in
            [owner_ids],
        )
    connection.close()
    import psycopg

    url = connection.settings_dict
    with psycopg.connect(
        dbname=url["NAME"], user=url["USER"], host=url["HOST"], port=url["PORT"] or 5432,
        autocommit=True,
    ) as raw:  # fmt: skip
        raw.execute("VACUUM ANALYZE agentloop_usage")
    return time.perf_counter() - started


def median_ms(run: Callable[[], Any], repeats: int) -> float:
    run()  # warm: the plan and the pages in shared buffers
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def timings(days: int, repeats: int) -> dict[str, Any]:
    from django.utils import timezone

    from agentloop.admin import usage_charts
    from agentloop.admin.svg_charts import horizontal_bars, stacked_bars
    from agentloop.models import Usage

    end = timezone.localdate()
    start = end - timedelta(days=days - 1)
    usage = Usage.objects.order_by()
    daily_rows = usage_charts.daily_by_model(usage, start, end)
    owner_rows = list(usage_charts.top_owners_query(usage, start, end))
    in_range = usage_charts.in_range(usage, start, end).count()

    def draw() -> None:
        daily = usage_charts._daily(daily_rows, start, end)
        stacked_bars(daily.days, daily.cost, title="cost", formatter=usage_charts.money)
        stacked_bars(daily.days, daily.tokens, title="tokens", formatter=usage_charts.count)
        horizontal_bars(
            [(str(r["owner_id"]), r["cost"], "") for r in owner_rows],
            title="owners",
            formatter=usage_charts.money,
        )

    return {
        "days": days,
        "rows_in_range": in_range,
        "groups": len(daily_rows),
        "daily_by_model_ms": round(
            median_ms(lambda: usage_charts.daily_by_model(usage, start, end), repeats), 1
        ),
        "top_owners_ms": round(
            median_ms(lambda: list(usage_charts.top_owners_query(usage, start, end)), repeats), 1
        ),
        "drawing_ms": round(median_ms(draw, repeats), 1),
        "explain_daily": usage_charts.daily_by_model_query(usage, start, end).explain(
            analyze=True, buffers=True
        ),
        "explain_owners": usage_charts.top_owners_query(usage, start, end).explain(
            analyze=True, buffers=True
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--owners", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path)
    options = parser.parse_args(argv)

    ensure_database(options.database_url)
    os.environ["BENCH_ADMIN"] = "1"  # the charts' module lives in agentloop.admin
    setup_django(options.database_url)
    filled = fill(options.rows, options.days, options.owners)
    print(f"{options.rows:,} usage rows over {options.days} days in {filled:.1f} s "
          f"(load average {load_average()})")  # fmt: skip
    results = [timings(days, options.repeats) for days in (30, 365)]
    for result in results:
        print(
            f"\n{result['days']}-day range: {result['rows_in_range']:,} rows, "
            f"{result['groups']} day x model groups\n"
            f"  cost/tokens per day by model: {result['daily_by_model_ms']} ms\n"
            f"  top owners:                   {result['top_owners_ms']} ms\n"
            f"  drawing the three SVG charts: {result['drawing_ms']} ms"
        )
    for result in results:
        print(f"\nEXPLAIN (ANALYZE, BUFFERS), {result['days']} days, per day by model:")
        print(result["explain_daily"])
        print(f"\nEXPLAIN (ANALYZE, BUFFERS), {result['days']} days, top owners:")
        print(result["explain_owners"])
    if options.json:
        options.json.write_text(json.dumps({"rows": options.rows, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
