#!/usr/bin/env python3
"""bench/perf/text_pages.py DIR: bytes and client CPU of the wide table's text columns rewritten
by pyarrow at text page sizes of 200 KB, 512 KB, 1 MB and 2 MB and zstd levels 1, 2 and 3 —
the experiment behind sluice's text pages (docs/perf/encodings.md). DIR holds Parquet files of
the lab's wide_300k (a `sluice export` of it); the first 150 k rows of `body`, `notes`, `title`,
`attrs`, `email`, `sku`, `status` are written with pages closed every 64 rows (as sluice's small
batches close them), 7,500-row row groups, no dictionary; best of two runs each."""
import glob
import os
import sys
import time

import pyarrow.parquet as pq

COLUMNS = ["body", "notes", "title", "attrs", "email", "sku", "status"]
files = sorted(glob.glob(os.path.join(sys.argv[1], "**", "*.parquet"), recursive=True))
table = pq.read_table(files, columns=COLUMNS).slice(0, 150_000)
out = os.path.join(os.environ.get("TMPDIR", "/tmp"), "sluice-text-pages.parquet")
for page in (200 << 10, 512 << 10, 1 << 20, 2 << 20):
    for level in (1, 2, 3):
        best = float("inf")
        for _ in range(2):
            started = time.process_time()
            pq.write_table(table, out, compression="zstd", compression_level=level,
                           data_page_size=page, write_batch_size=64, use_dictionary=False,
                           row_group_size=7500)
            best = min(best, time.process_time() - started)
        print(f"page {page >> 10} KB level {level}: {os.path.getsize(out) / 1e6:.1f} MB, "
              f"{best:.2f} CPU-s", flush=True)
os.remove(out)
