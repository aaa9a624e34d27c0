"""The datasets, generated inside PostgreSQL from deterministic expressions of the row id.

`narrow` has five fixed-width columns; `wide` has 21 columns of every common kind and about
4 KB per row, whose text is built from a Zipf-distributed vocabulary of pseudo-words, so it
compresses like prose rather than like one repeated character. Every value is a function of
the id through `hashint8extended` (stable across platforms: hash partitioning relies on it),
so two machines load identical tables. A loaded table carries a comment naming the generator
version and row count; a table whose comment matches is reused instead of reloaded.
MariaDB gets the same rows copied from PostgreSQL (see mariadb.py).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the stand-alone lab runs without psycopg
    import psycopg

from sluicebench.settings import size_label

GENERATOR_VERSION = 2

# h(x, seed, m): a deterministic pseudo-random integer in [0, m) for row x and column seed.
HELPERS = """
CREATE OR REPLACE FUNCTION bench_h(x bigint, seed bigint, m bigint) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT (hashint8extended(x, seed) & 9223372036854775807) % m $$;

CREATE TABLE IF NOT EXISTS bench_words (rank int PRIMARY KEY, word text NOT NULL);
CREATE TABLE IF NOT EXISTS bench_sentences (i int PRIMARY KEY, txt text NOT NULL);
CREATE TABLE IF NOT EXISTS bench_paragraphs (i int PRIMARY KEY, txt text NOT NULL);
"""

# 20 000 words: the 59 most frequent are real, the rest are made of 1–3 syllables.
VOCABULARY = """
INSERT INTO bench_words
SELECT r, CASE WHEN r <= cardinality(v.real) THEN v.real[r]
  ELSE v.syl[1 + bench_h(r, 11, 48)] || v.syl[1 + bench_h(r, 12, 48)]
       || CASE WHEN bench_h(r, 13, 3) = 0 THEN '' ELSE v.syl[1 + bench_h(r, 14, 48)] END
  END
FROM generate_series(1, 20000) r,
     (SELECT string_to_array(
        'the of and to a in is it that for on was with as be at by this from or have an not are '
        'but which we all can has more one will their order customer shipment payment account '
        'product delivery invoice status return service price update request warehouse item '
        'refund address billing carrier tracking discount stock supplier quantity', ' ') AS real,
        string_to_array('ka lo mi ne ru sa ti vo an el or um be di fa go hu ja ke li ma no '
        'pe re si to va we yo ze ar en is on us tra pro con ent ion ing er al ic ous ant ist ly',
        ' ') AS syl) v
ON CONFLICT DO NOTHING;

-- 8 192 sentences of 6–19 words; word ranks are log-uniform (Zipf-like, as in prose).
INSERT INTO bench_sentences
SELECT i, upper(left(t, 1)) || substr(t, 2) || '.'
FROM (SELECT s.i, string_agg(w.word, ' ' ORDER BY j) AS t
      FROM generate_series(0, 8191) s(i)
      CROSS JOIN LATERAL generate_series(1, 6 + bench_h(s.i, 21, 14)::int) j
      JOIN bench_words w
        ON w.rank = greatest(1, floor(exp(bench_h(s.i * 32 + j, 22, 1000000) / 1e6 * ln(20000)))::int)
      GROUP BY s.i) x
ON CONFLICT DO NOTHING;

-- 16 384 paragraphs of 3–7 sentences.
INSERT INTO bench_paragraphs
SELECT p.i, string_agg(s.txt, ' ' ORDER BY k)
FROM generate_series(0, 16383) p(i)
CROSS JOIN LATERAL generate_series(1, 3 + bench_h(p.i, 31, 5)::int) k
JOIN bench_sentences s ON s.i = bench_h(p.i * 8 + k, 32, 8192)
GROUP BY p.i
ON CONFLICT DO NOTHING;
"""

NARROW_DDL = """
CREATE TABLE {t} (
    id         bigint NOT NULL,
    quantity   int NOT NULL,
    account    bigint NOT NULL,
    price      double precision NOT NULL,
    created_at timestamptz NOT NULL
)"""

NARROW_FILL = """
INSERT INTO {t}
SELECT g,
       bench_h(g, 1, 1000)::int,
       bench_h(g, 2, 9000000000000000),
       bench_h(g, 3, 100000000) / 100.0,
       timestamptz '2020-01-01 00:00:00+00' + bench_h(g, 4, 157680000000000) * interval '1 microsecond'
FROM generate_series({lo}, {hi}) g"""

WIDE_DDL = """
CREATE TABLE {t} (
    id           bigint NOT NULL,
    tenant_id    int NOT NULL,
    user_id      bigint NOT NULL,
    quantity     int NOT NULL,
    score        int,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz,
    shipped_at   timestamp,
    is_active    boolean NOT NULL,
    is_gift      boolean,
    amount       numeric(12,2) NOT NULL,
    tax_rate     numeric(5,4) NOT NULL,
    balance      numeric(18,4),
    status       text NOT NULL,
    country      char(2) NOT NULL,
    email        varchar(80) NOT NULL,
    sku          text NOT NULL,
    title        text NOT NULL,
    body         text NOT NULL,
    notes        text,
    attrs        jsonb NOT NULL
)"""

WIDE_FILL = """
INSERT INTO {t}
SELECT g,
       1 + bench_h(g, 101, 500)::int,
       bench_h(g, 102, 50000000),
       1 + bench_h(g, 103, 20)::int,
       CASE WHEN bench_h(g, 104, 10) = 0 THEN NULL ELSE bench_h(g, 105, 1000)::int END,
       ts,
       CASE WHEN bench_h(g, 106, 10) = 0 THEN NULL ELSE ts + bench_h(g, 107, 8640000) * interval '1 second' END,
       CASE WHEN bench_h(g, 108, 4) = 0 THEN NULL
            ELSE (ts + bench_h(g, 109, 604800) * interval '1 second')::timestamp END,
       bench_h(g, 110, 10) <> 0,
       CASE WHEN bench_h(g, 111, 20) = 0 THEN NULL ELSE bench_h(g, 112, 2) = 0 END,
       bench_h(g, 113, 10000000) / 100.0,
       bench_h(g, 114, 3000) / 10000.0,
       CASE WHEN bench_h(g, 115, 8) = 0 THEN NULL ELSE (bench_h(g, 116, 2000000000) - 1000000000) / 10000.0 END,
       (ARRAY['new','paid','packed','shipped','delivered','returned','cancelled'])[1 + bench_h(g, 117, 7)],
       (ARRAY['US','DE','FR','GB','JP','BR','IN','CA','NL','SE','PL','ES'])[1 + bench_h(g, 118, 12)],
       w1.word || '.' || w2.word || bench_h(g, 119, 1000) || '@'
         || (ARRAY['example.com','mail.test','shop.invalid','corp.example'])[1 + bench_h(g, 120, 4)],
       'SKU-' || lpad(bench_h(g, 121, 100000000)::text, 8, '0'),
       (SELECT s.txt FROM bench_sentences s WHERE s.i = bench_h(g, 122, 8192)),
       'Order ' || g || E'\n' || (SELECT string_agg(p.txt, E'\n\n' ORDER BY k)
          FROM generate_series(1, 4 + bench_h(g, 123, 3)::int) k
          JOIN bench_paragraphs p ON p.i = bench_h(g * 8 + k, 124, 16384)),
       CASE WHEN bench_h(g, 125, 30) = 0 THEN NULL ELSE (SELECT string_agg(p.txt, E'\n\n' ORDER BY k)
          FROM generate_series(1, 3 + bench_h(g, 126, 3)::int) k
          JOIN bench_paragraphs p ON p.i = bench_h(g * 8 + k, 127, 16384)) END,
       jsonb_build_object(
         'channel', (ARRAY['web','app','api','store'])[1 + bench_h(g, 128, 4)],
         'tags', jsonb_build_array(w1.word, w2.word, w3.word),
         'rating', round(bench_h(g, 129, 50) / 10.0, 1),
         'flags', jsonb_build_object('express', bench_h(g, 130, 3) = 0, 'fragile', bench_h(g, 131, 5) = 0),
         'items', jsonb_build_array(
             jsonb_build_object('sku', 'SKU-' || bench_h(g, 132, 100000), 'qty', 1 + bench_h(g, 133, 5)),
             jsonb_build_object('sku', 'SKU-' || bench_h(g, 134, 100000), 'qty', 1 + bench_h(g, 135, 5))),
         'ref', md5(g::text))
FROM generate_series({lo}, {hi}) g
CROSS JOIN LATERAL (SELECT timestamptz '2020-01-01 00:00:00+00'
                           + bench_h(g, 100, 157680000) * interval '1 second' AS ts) t
JOIN bench_words w1 ON w1.rank = 61 + bench_h(g, 136, 19940)
JOIN bench_words w2 ON w2.rank = 61 + bench_h(g, 137, 19940)
JOIN bench_words w3 ON w3.rank = 1 + bench_h(g, 138, 20000)"""

KINDS = {"narrow": (NARROW_DDL, NARROW_FILL), "wide": (WIDE_DDL, WIDE_FILL)}
LOAD_STEP = 1_000_000  # rows per INSERT, so progress shows and no statement runs for minutes


@dataclass(frozen=True)
class Dataset:
    """One loaded table and what a correct export of it must contain."""

    kind: str  # narrow | wide
    rows: int
    table: str  # unqualified name, e.g. narrow_1m (schema public)
    table_bytes: int  # pg_table_size: heap + TOAST, what a reader scans
    text_bytes: int  # size of its COPY text form: the data's logical size

    @property
    def label(self) -> str:
        """`narrow 1m`."""
        return f"{self.kind} {size_label(self.rows)}"

    @property
    def id_sum(self) -> int:
        """Sum of ids 1..rows: a cheap check that no row is missing or doubled."""
        return self.rows * (self.rows + 1) // 2


def table_name(kind: str, rows: int) -> str:
    """`narrow_1m`."""
    return f"{kind}_{size_label(rows)}"


def _comment(kind: str, rows: int) -> str:
    return f"sluicebench {kind} v{GENERATOR_VERSION} rows={rows}"


def ensure(
    conn: psycopg.Connection, kind: str, rows: int, log: Callable[[str], None] = print
) -> Dataset:
    """Load `kind` at `rows` rows unless an identical table is already there."""
    t = table_name(kind, rows)
    conn.autocommit = True
    existing = conn.execute(
        "SELECT obj_description(to_regclass(%s), 'pg_class')", (f"public.{t}",)
    ).fetchone()
    if not existing or not (existing[0] or "").startswith(_comment(kind, rows) + " "):
        _load(conn, kind, rows, t, log)
    table_bytes, comment = conn.execute(
        "SELECT pg_table_size(%s::regclass), obj_description(%s::regclass, 'pg_class')",
        (f"public.{t}", f"public.{t}"),
    ).fetchone()
    m = re.search(r"text_bytes=(\d+)", comment or "")
    return Dataset(kind, rows, t, int(table_bytes), int(m.group(1)) if m else 0)


def _load(
    conn: psycopg.Connection, kind: str, rows: int, t: str, log: Callable[[str], None]
) -> None:
    ddl, fill = KINDS[kind]
    started = time.monotonic()
    log(f"loading {kind} {size_label(rows)} into public.{t}")
    conn.execute(HELPERS)
    if (
        kind == "wide"
        and not conn.execute("SELECT EXISTS (SELECT FROM bench_paragraphs)").fetchone()[0]
    ):
        conn.execute(VOCABULARY)
    conn.execute(f"DROP TABLE IF EXISTS public.{t}")
    conn.execute(ddl.format(t=f"public.{t}"))
    for lo in range(1, rows + 1, LOAD_STEP):
        hi = min(rows, lo + LOAD_STEP - 1)
        conn.execute(fill.format(t=f"public.{t}", lo=lo, hi=hi))
    conn.execute(f"ALTER TABLE public.{t} ADD PRIMARY KEY (id)")
    # Frozen and analysed: no reader pays for hint bits, and planners see real statistics.
    conn.execute(f"VACUUM (FREEZE, ANALYZE) public.{t}")
    conn.execute("CHECKPOINT")
    (text_bytes,) = conn.execute(
        f"SELECT sum(octet_length(x::text) + 1) FROM public.{t} x"
    ).fetchone()
    comment = f"{_comment(kind, rows)} text_bytes={int(text_bytes)}"
    conn.execute(f"COMMENT ON TABLE public.{t} IS '{comment}'")
    log(f"loaded public.{t} in {time.monotonic() - started:.1f} s")
