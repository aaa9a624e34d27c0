"""What the stream lab's scripts (`measure.py`, `delta.py`) share: psql, a command timed under
GNU time, and the steady insert load whose commit → visible delay both measure. Standard
library only; imported from the scripts' own directory."""

import re
import subprocess
import time


def psql(sql, url):
    """Run `sql` on `url`; its output, stripped. Fails the pass loudly on an error."""
    p = subprocess.run(
        ["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", url, "-c", sql],
        capture_output=True, text=True,
    )
    if p.returncode != 0:
        raise SystemExit(f"psql failed: {p.stderr.strip()}\n{sql[:300]}")
    return p.stdout.strip()


def timed(argv):
    """Run argv under GNU time: (wall s, cpu s, peak RSS bytes, stdout+stderr, user-space cpu s).
    CPU is user + system time; the user-space part alone is kept too, because draining a
    socket on loopback costs both clients kernel time that no decoding work changes."""
    start = time.monotonic()
    p = subprocess.run(
        ["/usr/bin/time", "-f", "TIME %e %U %S %M"] + argv,
        capture_output=True, text=True,
    )
    wall = time.monotonic() - start
    out = p.stdout + p.stderr
    if p.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({p.returncode}):\n{out[-3000:]}")
    m = re.search(r"TIME (\S+) (\S+) (\S+) (\d+)", out)
    return (wall, float(m.group(2)) + float(m.group(3)), int(m.group(4)) * 1024, out,
            float(m.group(2)))


def steady_load(url, table, rate, seconds, each_commit=""):
    """Insert `rate` rows a second into `table` (id, v, pad) for `seconds`, in 10 transactions
    a second on a fixed schedule; `each_commit`: SQL run in each transaction before its
    commit (a record of when it committed)."""
    per_tx = max(1, rate // 10)
    psql(f"""
        DO $$
        DECLARE t0 timestamptz := clock_timestamp(); n bigint := 0;
        BEGIN
          FOR s IN 1..{seconds * 10} LOOP
            INSERT INTO {table} SELECT n + g, g, md5(g::text) FROM generate_series(1, {per_tx}) g;
            {each_commit}
            n := n + {per_tx};
            COMMIT;
            PERFORM pg_sleep(greatest(0, extract(epoch FROM
                (t0 + s * interval '100 milliseconds') - clock_timestamp())));
          END LOOP;
        END $$;""", url)
