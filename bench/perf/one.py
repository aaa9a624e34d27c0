#!/usr/bin/env python3
"""bench/perf/one.py LABEL BIN TABLE WORKERS FORMAT [extra...]: one export of public.TABLE by the
sluice binary BIN; prints a JSON line: client user+sys (getrusage of the child), peak RSS
(ru_maxrss), the report's predicted peak, output bytes. The source is $SLUICE_PERF_URL (a
PostgreSQL loaded with the lab's tables, bench/sluicebench/datasets.py); output and report go
under $SLUICE_PERF_DIR (default /tmp/sluice-perf)."""
import json, os, resource, shutil, subprocess, sys, time
label, binary, table, workers, fmt, *extra = sys.argv[1:]
url = os.environ["SLUICE_PERF_URL"]
work = os.environ.get("SLUICE_PERF_DIR", "/tmp/sluice-perf")
os.makedirs(work, exist_ok=True)
out = os.path.join(work, "out"); rep = os.path.join(work, "report.json")
shutil.rmtree(out, ignore_errors=True)
if os.path.exists(rep): os.remove(rep)
argv = [binary, "export", "-q", "--source", url, "--table", f"public.{table}", "--to", out,
        "--parallel", workers, "--format", fmt, "--report-json", rep, *extra]
t0 = time.time()
before = resource.getrusage(resource.RUSAGE_CHILDREN)
p = subprocess.run(argv, capture_output=True, text=True)
wall = time.time() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
r = json.load(open(rep)) if os.path.exists(rep) else {}
size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(out) for f in fs
           if f.endswith((".parquet", ".csv")))
rows = r.get("rows") or 0
cpu = (ru.ru_utime - before.ru_utime) + (ru.ru_stime - before.ru_stime)
print(json.dumps({"label": label, "table": table, "workers": int(workers), "format": fmt,
    "extra": extra, "rc": p.returncode, "rows": rows, "cpu_s": round(cpu, 2),
    "us_per_row": round(cpu * 1e6 / rows, 3) if rows else None,
    "user": round(ru.ru_utime - before.ru_utime, 2), "sys": round(ru.ru_stime - before.ru_stime, 2),
    "maxrss_mib": round(ru.ru_maxrss / 1024, 1),
    "predicted_mib": round((r.get("predicted_peak_rss_bytes") or 0) / 2**20, 1),
    "batch_kib": (r.get("batch_bytes") or 0) >> 10, "bytes": size, "wall": round(wall, 2),
    "notes": r.get("notes"), "err": p.stderr[-500:] if p.returncode else ""}), flush=True)
