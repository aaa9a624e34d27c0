# Runs inside `sluice-testkit run --pg`: SLUICE_TEST_PG_URL points at the throwaway server.
# $SLUICE is the binary, $ROWS the sample's row count; $DEMO_DB (default demo) the database
# created for it. Every psql call stops at its first error (a failed load must not be followed
# by an export of an empty table), and the export's row count is checked against $ROWS.
set -euo pipefail
source scripts/lib/common.sh
DEMO_DB="${DEMO_DB:-demo}"
DB="${SLUICE_TEST_PG_URL%/*}/$DEMO_DB"
psql -X -q -v ON_ERROR_STOP=1 "$SLUICE_TEST_PG_URL" -c "CREATE DATABASE \"$DEMO_DB\""
say "loading $ROWS sample orders"
# bigint arithmetic: g * 104729 passes int's range at about 20,000 rows.
psql -X -q -v ON_ERROR_STOP=1 "$DB" <<SQL
CREATE TABLE public.orders (
    id          bigint PRIMARY KEY,
    customer_id int NOT NULL,
    amount      numeric(12,2) NOT NULL,
    status      text NOT NULL,
    created_at  timestamptz NOT NULL
);
INSERT INTO public.orders
SELECT g, 1 + (g * 7919) % 250000, ((g * 104729) % 1000000) / 100.0,
       (ARRAY['new','paid','shipped','delivered','returned'])[1 + g % 5],
       timestamptz '2024-01-01' + g * interval '7 seconds'
FROM generate_series(1::bigint, $ROWS::bigint) g;
VACUUM ANALYZE public.orders;
SQL
OUT="${DEMO_OUT:-$(mktemp -d /tmp/sluice-demo.XXXXXX)}"
say "sluice plan"
"$SLUICE" plan --source "$DB" --table public.orders
say "sluice export → $OUT"
"$SLUICE" export --source "$DB" --table public.orders --to "$OUT" --report-json "$OUT/report.json"
say "files written"
ls -l "$OUT" "$OUT/public.orders"
echo "manifest: $OUT/manifest.json   report: $OUT/report.json"
# The report's top-level "rows" (pretty-printed: two spaces of indent) against the table.
exported="$(sed -n 's/^  "rows": \([0-9]*\),$/\1/p' "$OUT/report.json")"
held="$(psql -X -q -A -t -v ON_ERROR_STOP=1 "$DB" -c "SELECT count(*) FROM public.orders")"
[ "$exported" = "$held" ] && [ "$held" = "$ROWS" ] ||
    die "the export wrote ${exported:-no} rows where the sample table holds $held of $ROWS"
say "exported $exported rows, every row of the sample"
